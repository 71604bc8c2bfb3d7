//! Batches: a pure function of (seed, step); resumes exactly; validation walks in order.

use helios_nn::{BatchSampler, Error, EvalBatches, SamplerState, Tokens};

fn data(n: u32) -> Tokens {
    Tokens::from_ids(&(0..n).map(|i| i % 50000).collect::<Vec<_>>(), "mem").unwrap()
}

#[test]
fn batches_are_windows_with_shifted_targets() {
    let mut s = BatchSampler::new(data(10_000), 4, 32, 7).unwrap();
    let b = s.next_batch();
    assert_eq!((b.batch, b.seq_len), (4, 32));
    assert_eq!((b.inputs.len(), b.targets.len()), (128, 128));
    for row in 0..4 {
        let x = &b.inputs[row * 32..(row + 1) * 32];
        let y = &b.targets[row * 32..(row + 1) * 32];
        // Consecutive tokens: the data is 0, 1, 2, ...
        for t in 0..32 {
            assert_eq!(y[t], x[t] + 1);
        }
        assert!(x[0] as usize + 33 <= 10_000);
    }
    assert_eq!(s.state().step, 1);
}

#[test]
fn same_seed_same_batches_and_different_seed_different() {
    let d = data(5_000);
    let mut a = BatchSampler::new(d.clone(), 2, 16, 42).unwrap();
    let mut b = BatchSampler::new(d.clone(), 2, 16, 42).unwrap();
    let mut c = BatchSampler::new(d, 2, 16, 43).unwrap();
    let mut differs = false;
    for _ in 0..20 {
        let (x, y, z) = (a.next_batch(), b.next_batch(), c.next_batch());
        assert_eq!(x, y);
        differs |= x != z;
    }
    assert!(differs);
}

#[test]
fn resume_draws_exactly_the_uninterrupted_batches() {
    let d = data(20_000);
    let mut straight = BatchSampler::new(d.clone(), 3, 8, 2024).unwrap();
    let run: Vec<_> = (0..50).map(|_| straight.next_batch()).collect();

    let mut first = BatchSampler::new(d.clone(), 3, 8, 2024).unwrap();
    for b in &run[..17] {
        assert_eq!(&first.next_batch(), b);
    }
    // Through JSON, as a checkpoint stores it.
    let json = serde_json::to_string(&first.state()).unwrap();
    let state: SamplerState = serde_json::from_str(&json).unwrap();
    assert_eq!(state.step, 17);
    let mut resumed = BatchSampler::resume_checked(d.clone(), state, 3, 8).unwrap();
    for b in &run[17..] {
        assert_eq!(&resumed.next_batch(), b);
    }
    assert_eq!(resumed.batch_at(3), run[3]);

    // Resuming with other data or another batch shape is refused.
    let e = BatchSampler::resume(data(19_999), state).unwrap_err();
    assert!(matches!(e, Error::SamplerMismatch { .. }), "{e}");
    let other = Tokens::from_ids(&(1..20_001).collect::<Vec<_>>(), "mem").unwrap();
    assert!(BatchSampler::resume(other, state).is_err());
    let e = BatchSampler::resume_checked(d, state, 4, 8).unwrap_err();
    assert!(e.to_string().contains("batches of 3x8"), "{e}");
}

#[test]
fn too_little_data_says_how_much_is_needed() {
    let e = BatchSampler::new(data(64), 4, 16, 0).unwrap_err();
    match &e {
        Error::TooFewTokens { have, need, .. } => assert_eq!((*have, *need), (64, 65)),
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("at least 65 (B*T+1)"), "{e}");
    // Exactly B*T+1 is enough.
    let mut s = BatchSampler::new(data(65), 4, 16, 0).unwrap();
    let b = s.next_batch();
    assert!(b.targets.iter().all(|&t| t <= 64));
    assert!(BatchSampler::new(data(100), 0, 16, 0).is_err());
    let e = EvalBatches::new(data(10), 1, 16).unwrap_err();
    assert!(e.to_string().contains("validation split"), "{e}");
}

#[test]
fn eval_batches_cover_the_split_in_order() {
    let d = data(1000);
    let ev = EvalBatches::new(d, 2, 10).unwrap();
    assert_eq!(ev.num_batches(), 49); // (1000 - 1) / 20
    let all: Vec<_> = ev.collect();
    assert_eq!(all.len(), 49);
    assert_eq!(all[0].inputs[..3], [0, 1, 2]);
    assert_eq!(all[0].inputs[10], 10);
    assert_eq!(all[48].targets.last(), Some(&980));
    let again: Vec<_> = EvalBatches::new(data(1000), 2, 10)
        .unwrap()
        .take_at_most(5)
        .collect();
    assert_eq!(again.len(), 5);
    assert_eq!(again[..], all[..5]);
}
