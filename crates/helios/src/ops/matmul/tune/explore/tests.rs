//! Tuning on real work, on the device present (lavapipe in CI): exploring never changes a
//! result, a class settles and persists, a wrong candidate is never chosen, and an unsettled
//! class goes on in the next process.

use super::*;
use crate::ops::matmul::tune::Tuning;
use crate::ops::online::TEST_TUNING;
use crate::Device;

/// Devices whose candidates compute a wrong product in their shadow runs.
pub(in crate::ops::matmul::tune) static SABOTAGED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn random(device: &Device, shape: &[usize], seed: u64) -> (Tensor, Vec<f32>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    (Tensor::from_slice(device, &v, shape).expect("upload"), v)
}

/// Calls `a · b` until its class settles (at most `limit` calls), checking every result
/// against the f64 reference; returns the calls and the final choice. `fresh`: the class's
/// winner and progress are forgotten first.
fn explore_until_settled(
    device: &Device,
    (m, n, k): (usize, usize, usize),
    limit: usize,
    fresh: bool,
) -> (usize, crate::MatmulChoice) {
    let (a, av) = random(device, &[m, k], 11);
    let (b, bv) = random(device, &[k, n], 12);
    let key = super::super::cache::class_key(
        &Problem::new(&a, &b, &Default::default()).expect("problem"),
    );
    if fresh {
        super::super::cache::forget(device, &key);
    }
    let want = crate::cpu::matmul::matmul(
        &av,
        &bv,
        &crate::cpu::matmul::MatmulRef {
            batch: 1,
            m,
            n,
            k,
            alpha: 1.0,
            bias: None,
            act: helios_kernels::Activation::None,
            residual: None,
            act_grad: helios_kernels::Activation::None,
        },
    );
    let opts = crate::MatmulOptions::default();
    for call in 1..=limit {
        let got = a.matmul(&b).expect("product").to_vec().expect("read");
        let err = crate::cpu::matmul::relative_error(&got, &want);
        assert!(err <= 1e-5, "call {call}: relative error {err:.2e}");
        // The candidates' compiles run on their own thread; a real program goes on
        // with the incumbent meanwhile, a test waits to keep its call count short.
        crate::ops::background::wait_idle();
        let choice = a.matmul_choice(&b, &opts).expect("choice");
        if choice.how == crate::Choice::Tuned {
            return (call, choice);
        }
    }
    panic!("the class did not settle in {limit} calls");
}

/// A class explores on real calls (every result right meanwhile), settles on one of its
/// candidates, stays there, and the winner is on disk for the next process.
#[test]
fn a_class_explores_settles_and_persists() {
    let device = Device::from_env().expect("a Vulkan device");
    TEST_TUNING.locked().push((device.id(), Tuning::Online));
    let (calls, choice) = explore_until_settled(&device, (72, 40, 56), 200, true);
    eprintln!("settled after {calls} calls on {}", choice.label());
    assert!(
        calls > 3,
        "settled after {calls} calls: nothing was explored"
    );
    let (a, _) = random(&device, &[72, 56], 1);
    let (b, _) = random(&device, &[56, 40], 2);
    let p = Problem::new(&a, &b, &Default::default()).expect("problem");
    let key = super::super::cache::class_key(&p);
    let stored = super::super::cache::cached(&device, &key).expect("a stored winner");
    assert_eq!((stored.0, stored.1), (choice.variant, choice.splits));
    let again = a.matmul_choice(&b, &Default::default()).expect("choice");
    assert_eq!(again.how, crate::Choice::Tuned, "it stays settled");
    assert_eq!(again.kernel, choice.kernel);
    super::super::cache::forget(&device, &key);
    let messages = device.validation_messages();
    assert!(messages.is_empty(), "validation: {messages:?}");
}

/// A class that has not settled when its process ends goes on where it stood in the next
/// one: what was saved at its last milestone (candidates out, candidates measured) is
/// what a fresh explorer of the class starts from, and it then settles as usual.
#[test]
fn an_unsettled_class_goes_on_in_the_next_process() {
    let device = Device::from_env().expect("a Vulkan device");
    TEST_TUNING.locked().push((device.id(), Tuning::Online));
    let (m, n, k) = (96, 40, 72);
    let (a, _) = random(&device, &[m, k], 7);
    let (b, _) = random(&device, &[k, n], 8);
    let p = Problem::new(&a, &b, &Default::default()).expect("problem");
    let key = super::super::cache::class_key(&p);
    super::super::cache::forget(&device, &key);
    let first = crate::ops::matmul::tune::choose::first_choice(&p);
    let incumbent = winner_tag(first.kernel.variant.name(), first.splits);
    let finished = |s: &Standing| match s {
        Standing::Out => true,
        Standing::Ratios(r) => r.len() >= SAMPLES,
        Standing::New => false,
    };
    // Explore until the first milestone is on disk (a candidate out or fully measured).
    let mut saved = None;
    for _ in 0..200 {
        a.matmul(&b).expect("product").to_vec().expect("read");
        crate::ops::background::wait_idle();
        saved = PROGRESS
            .load(&device, &key, &incumbent)
            .filter(|s| s.cands.iter().any(|c| finished(&c.1)));
        if saved.is_some() {
            break;
        }
    }
    let saved = saved.expect("a milestone within 200 calls");
    let choice = a.matmul_choice(&b, &Default::default()).expect("choice");
    assert_ne!(
        choice.how,
        crate::Choice::Tuned,
        "settled before a second process"
    );
    // A new process: no explorer and no remembered choice for the class.
    super::super::choose::forget_class(&device, &key);
    a.matmul(&b).expect("product").to_vec().expect("read");
    let resumed = super::super::choose::explorer(&device, &key)
        .expect("exploring again")
        .state
        .locked()
        .progress();
    for (cand, standing) in saved.cands.iter().filter(|c| finished(&c.1)) {
        let now = resumed.cands.iter().find(|c| c.0 == *cand).map(|c| &c.1);
        assert_eq!(now, Some(standing), "{cand:?} resumed as it was saved");
    }
    let (calls, choice) = explore_until_settled(&device, (m, n, k), 200, false);
    eprintln!(
        "settled {calls} calls after resuming, on {}",
        choice.label()
    );
    super::super::cache::forget(&device, &key);
    let messages = device.validation_messages();
    assert!(messages.is_empty(), "validation: {messages:?}");
}

/// Candidates whose shadow results differ from the incumbent's never compute a real
/// output, and the class settles on the incumbent.
#[test]
fn a_candidate_that_differs_is_never_chosen() {
    let device = Device::from_env().expect("a Vulkan device");
    TEST_TUNING.locked().push((device.id(), Tuning::Online));
    SABOTAGED.locked().push(device.id());
    let (a, _) = random(&device, &[88, 64], 3);
    let (b, _) = random(&device, &[64, 24], 4);
    let p = Problem::new(&a, &b, &Default::default()).expect("problem");
    let first = crate::ops::matmul::tune::choose::first_choice(&p);
    let (_, choice) = explore_until_settled(&device, (88, 24, 64), 200, true);
    assert_eq!(choice.variant, first.kernel.variant, "the incumbent stays");
    assert_eq!(choice.splits, first.splits);
    super::super::cache::forget(&device, &super::super::cache::class_key(&p));
    let messages = device.validation_messages();
    assert!(messages.is_empty(), "validation: {messages:?}");
}

/// While a class explores, every output is the incumbent's, bit for bit: candidates
/// only ever write scratch.
#[test]
fn exploring_never_changes_a_result() {
    let device = Device::from_env().expect("a Vulkan device");
    TEST_TUNING.locked().push((device.id(), Tuning::Online));
    let (a, _) = random(&device, &[80, 48], 5);
    let (b, _) = random(&device, &[48, 56], 6);
    let p = Problem::new(&a, &b, &Default::default()).expect("problem");
    let key = super::super::cache::class_key(&p);
    super::super::cache::forget(&device, &key);
    let first = crate::ops::matmul::tune::choose::first_choice(&p);
    let forced = crate::MatmulOverrides {
        variant: Some(first.kernel.variant),
        ..Default::default()
    };
    let opts = crate::MatmulOptions::default();
    let want = a
        .matmul_overridden(&b, &opts, &forced)
        .and_then(|c| c.to_vec())
        .expect("the incumbent's product");
    for call in 1..=6 {
        let got = a.matmul(&b).and_then(|c| c.to_vec()).expect("product");
        assert_eq!(got, want, "call {call}");
        crate::ops::background::wait_idle();
    }
    let choice = a.matmul_choice(&b, &opts).expect("choice");
    assert_eq!(
        choice.how,
        crate::Choice::Exploring,
        "still exploring after 6 calls"
    );
    let state = crate::ops::matmul_exploring(&device);
    let line = state
        .iter()
        .find(|l| l.starts_with(&key))
        .expect("exploring");
    // Live or dropped (lavapipe's timings are noisy): either way it ran beside.
    assert!(
        !(line.contains("live 0 ") && line.contains(" out 0,")),
        "no candidate ran beside it: {line}"
    );
    super::super::cache::forget(&device, &key);
}
