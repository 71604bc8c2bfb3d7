//! `helios::interop` on the Vulkan device present (lavapipe in CI): tensors in an exported
//! arena written by `copy_into` from any dtype, layout and lazy state, read by later ops and
//! the optimizer, and the device's work ordered against an external timeline. Run with
//! `HELIOS_VALIDATION=1`; every test fails on any validation message.
//!
//! Where the device cannot export memory (not lavapipe 22.3, which can), the arena tests
//! check the error and say they are skipped; the timeline tests use a host-only timeline
//! where exported ones are missing (lavapipe), which orders work the same way.

use std::time::{Duration, Instant};

use helios::interop::{ExportedArena, ExternalTimeline};
use helios::{adamw_step, AdamWConfig, AdamWParam, DType, Device, Error, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{assert_clean, device};

/// `n` values in ±[0.01, 4), rounded to `dtype`.
fn random(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = rng.gen_range(0.01..4.0);
            dtype.round(if rng.gen_bool(0.5) { v } else { -v })
        })
        .collect()
}

/// An arena on `d`, or `None` (after checking the error names the extension) where `d`
/// cannot export memory.
fn arena(d: &Device, bytes: u64) -> Option<ExportedArena> {
    match ExportedArena::new(d, bytes) {
        Ok(a) => Some(a),
        Err(e) => {
            assert!(!d.context().enabled().export_memory);
            assert!(e.to_string().contains("VK_KHR_external_memory_fd"), "{e}");
            eprintln!("SKIPPED: {} cannot export memory: {e}", d.name());
            None
        }
    }
}

/// Timelines to order with: a host-only one, and an exported one where the device has them.
fn timelines(d: &Device) -> Vec<ExternalTimeline> {
    let mut out = vec![d.context().create_timeline().unwrap()];
    match d.export_timeline() {
        Ok(t) => out.push(t),
        Err(e) => {
            assert!(
                e.to_string().contains("VK_KHR_external_semaphore_fd"),
                "{e}"
            );
            eprintln!(
                "note: {}: {e}; ordering is tested with a host-only timeline",
                d.name()
            );
        }
    }
    out
}

/// Fails with the first differing element (vectors too long to print whole).
#[track_caller]
fn same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i} is {}, want {}", got[i], want[i]);
    }
}

/// Polls `done` for up to 10 s.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn copy_into_fills_arena_tensors_at_several_offsets() {
    let d = device();
    let Some(arena) = arena(d, 1 << 20) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(7);
    // (shape, source dtype, arena dtype): same dtype is exact, a cast rounds once.
    let cases: [(&[usize], DType, DType); 6] = [
        (&[7, 33], DType::F32, DType::F32),
        (&[1000], DType::BF16, DType::BF16),
        (&[3, 4, 5], DType::F16, DType::F16),
        (&[129], DType::F32, DType::BF16),
        (&[2, 65], DType::BF16, DType::F32),
        (&[1], DType::F32, DType::F32),
    ];
    let mut at = 3 * arena.alignment(); // not at the start, with gaps between tensors
    let mut written: Vec<(Tensor, Vec<f32>)> = Vec::new();
    for (shape, src_dt, dst_dt) in cases {
        let n: usize = shape.iter().product();
        let values = random(&mut rng, n, src_dt);
        let src = Tensor::from_slice_as(d, &values, shape, src_dt).unwrap();
        let dst = arena.tensor(at, shape, dst_dt).unwrap();
        assert!(dst.is_realized() && dst.is_contiguous());
        src.copy_into(&dst).unwrap();
        let want: Vec<f32> = values.iter().map(|&v| dst_dt.round(v)).collect();
        same(
            &dst.to_vec().unwrap(),
            &want,
            &format!("{shape:?} {src_dt} -> {dst_dt}"),
        );
        at = arena.next_offset(at, &dst) + arena.alignment();
        written.push((dst, want));
    }

    // Strided views: a transpose (f32) and a narrowed slice (bf16 into f32).
    let host = random(&mut rng, 33 * 7, DType::F32);
    let t = Tensor::from_slice(d, &host, &[33, 7]).unwrap();
    let dst = arena.tensor(at, &[7, 33], DType::F32).unwrap();
    t.transpose(0, 1).unwrap().copy_into(&dst).unwrap();
    let want: Vec<f32> = (0..7 * 33).map(|k| host[(k % 33) * 7 + k / 33]).collect();
    same(&dst.to_vec().unwrap(), &want, "transposed source");
    at = arena.next_offset(at, &dst);
    written.push((dst, want));

    let host = random(&mut rng, 10 * 20, DType::BF16);
    let t = Tensor::from_slice_as(d, &host, &[10, 20], DType::BF16).unwrap();
    let dst = arena.tensor(at, &[10, 9], DType::F32).unwrap();
    t.narrow(1, 5, 9).unwrap().copy_into(&dst).unwrap();
    let want: Vec<f32> = (0..90).map(|k| host[(k / 9) * 20 + 5 + k % 9]).collect();
    same(&dst.to_vec().unwrap(), &want, "narrowed source");
    at = arena.next_offset(at, &dst);
    written.push((dst, want));

    // A pending source (a fused chain that has not run) is computed, then copied.
    let x = Tensor::from_slice(d, &random(&mut rng, 300, DType::F32), &[300]).unwrap();
    let y = x.mul_scalar(2.0).unwrap().add_scalar(1.0).unwrap();
    assert!(!y.is_realized());
    let dst = arena.tensor(at, &[300], DType::F32).unwrap();
    y.copy_into(&dst).unwrap();
    let want = y.to_vec().unwrap();
    same(&dst.to_vec().unwrap(), &want, "pending source");
    written.push((dst, want));

    // No write reached a neighbour.
    for (i, (t, want)) in written.iter().enumerate() {
        same(
            &t.to_vec().unwrap(),
            want,
            &format!("tensor {i} after later writes"),
        );
    }
    assert_clean(d);
}

/// `copy_many` into arena tensors: dense pairs of each dtype in one dispatch (sizes across
/// the kernel's 16384-element chunks and not whole vec4s, pending sources), the rest as
/// `copy_into` does (a strided source, a cast), bit for bit, no neighbour touched; and its
/// errors are `copy_into`'s.
#[test]
fn copy_many_fills_arena_tensors() {
    let d = device();
    let Some(arena) = arena(d, 4 << 20) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(11);
    let cases: [(&[usize], DType, DType); 7] = [
        (&[40_001], DType::F32, DType::F32),
        (&[3, 5], DType::BF16, DType::BF16),
        (&[16_384], DType::F16, DType::F16),
        (&[2, 16_387], DType::BF16, DType::BF16),
        (&[1], DType::F32, DType::F32),
        (&[129], DType::F32, DType::BF16),
        (&[7, 33], DType::F32, DType::F32),
    ];
    let mut at = arena.alignment();
    let (mut srcs, mut dsts, mut wants) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (shape, src_dt, dst_dt)) in cases.into_iter().enumerate() {
        let n: usize = shape.iter().product();
        let values = random(&mut rng, n, src_dt);
        let src = Tensor::from_slice_as(d, &values, shape, src_dt).unwrap();
        // A pending source, and a transposed one (not dense: the `copy_into` path).
        let src = match i {
            3 => src.mul_scalar(1.0).unwrap(),
            6 => Tensor::from_slice_as(d, &values, &[33, 7], src_dt)
                .unwrap()
                .transpose(0, 1)
                .unwrap(),
            _ => src,
        };
        let want = match i {
            6 => (0..7 * 33).map(|k| values[(k % 33) * 7 + k / 33]).collect(),
            _ => values
                .iter()
                .map(|&v| dst_dt.round(v))
                .collect::<Vec<f32>>(),
        };
        let dst = arena.tensor(at, shape, dst_dt).unwrap();
        at = arena.next_offset(at, &dst) + arena.alignment();
        srcs.push(src);
        dsts.push(dst);
        wants.push(want);
    }
    let pairs: Vec<(&Tensor, &Tensor)> = srcs.iter().zip(&dsts).collect();
    d.copy_many(&pairs).unwrap();
    for (i, (dst, want)) in dsts.iter().zip(&wants).enumerate() {
        same(&dst.to_vec().unwrap(), want, &format!("pair {i}"));
    }
    let bad = Tensor::from_slice(d, &[1.0, 2.0], &[2]).unwrap();
    let err = d.copy_many(&[(&bad, &dsts[0])]).unwrap_err().to_string();
    assert!(err.contains("shapes"), "{err}");
    assert_clean(d);
}

#[test]
fn arena_tensors_feed_later_ops_and_the_optimizer() {
    let d = device();
    let Some(arena) = arena(d, 1 << 20) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(11);
    let n = 1027;
    let g_host = random(&mut rng, n, DType::F32);
    let g = Tensor::from_slice(d, &g_host, &[n]).unwrap();
    let slot = arena.tensor(0, &[n], DType::F32).unwrap();
    let slot16 = arena
        .tensor(arena.next_offset(0, &slot), &[n], DType::BF16)
        .unwrap();
    g.copy_into(&slot).unwrap();
    g.copy_into(&slot16).unwrap();

    // An element-wise op reads the arena tensor.
    let other = random(&mut rng, n, DType::F32);
    let y = slot
        .mul_scalar(3.0)
        .unwrap()
        .add(&Tensor::from_slice(d, &other, &[n]).unwrap())
        .unwrap();
    let want: Vec<f32> = g_host
        .iter()
        .zip(&other)
        .map(|(a, b)| a * 3.0 + b)
        .collect();
    let got = y.to_vec().unwrap();
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "element {i}: {a} vs {b}"
        );
    }

    // AdamW takes arena gradients as it takes any: the same step as from ordinary tensors.
    let p0 = random(&mut rng, n, DType::F32);
    let zeros = vec![0.0; n];
    let state = || [&p0, &zeros, &zeros].map(|v| Tensor::from_slice(d, v, &[n]).unwrap());
    let config = AdamWConfig::default();
    for (arena_grad, plain_grad) in [
        (&slot, g.clone()),
        (&slot16, g.to_dtype(DType::BF16).unwrap()),
    ] {
        let [pa, ma, va] = state();
        let [pb, mb, vb] = state();
        let param = |p, grad, m, v| AdamWParam {
            param: p,
            grad,
            m,
            v,
            copy: None,
            weight_decay: 0.1,
        };
        adamw_step(&[param(&pa, arena_grad, &ma, &va)], &config, 1).unwrap();
        adamw_step(&[param(&pb, &plain_grad, &mb, &vb)], &config, 1).unwrap();
        let what = format!("AdamW with an arena gradient of {}", arena_grad.dtype());
        same(&pa.to_vec().unwrap(), &pb.to_vec().unwrap(), &what);
        assert!(pa.to_vec().unwrap() != p0, "the step changed nothing");
    }

    // Work asked for before a write reads the old values, work after it the new ones.
    let old = slot.to_vec().unwrap();
    let before = slot.mul_scalar(1.0).unwrap(); // pending
    let new = random(&mut rng, n, DType::F32);
    Tensor::from_slice(d, &new, &[n])
        .unwrap()
        .copy_into(&slot)
        .unwrap();
    let after = slot.mul_scalar(1.0).unwrap();
    same(
        &before.to_vec().unwrap(),
        &old,
        "asked for before the write",
    );
    same(&after.to_vec().unwrap(), &new, "asked for after the write");
    same(&slot.to_vec().unwrap(), &new, "the arena tensor");
    assert_clean(d);
}

#[test]
fn copy_into_and_arena_tensor_check_their_arguments() {
    let d = device();
    let Some(arena) = arena(d, 64 << 10) else {
        return;
    };
    let src = Tensor::from_slice(d, &[1.0; 12], &[3, 4]).unwrap();
    let dst = arena.tensor(0, &[3, 4], DType::F32).unwrap();
    let invalid = |r: helios::Result<()>, says: &str| match r {
        Err(Error::Invalid {
            op: "copy_into",
            detail,
        }) => {
            assert!(detail.contains(says), "{detail}")
        }
        other => panic!("expected an invalid copy_into, got {other:?}"),
    };
    invalid(
        src.copy_into(&arena.tensor(0, &[12], DType::F32).unwrap()),
        "shapes",
    );
    invalid(
        src.transpose(0, 1)
            .unwrap()
            .copy_into(&dst.transpose(0, 1).unwrap()),
        "strided or offset view",
    );
    let square = arena.tensor(4096, &[4, 4], DType::F32).unwrap();
    invalid(
        square.transpose(0, 1).unwrap().copy_into(&square),
        "another view",
    );
    square.copy_into(&square).unwrap(); // its own values: nothing to do
    for (offset, shape) in [(1u64, vec![4usize]), (100, vec![4])] {
        let err = arena.tensor(offset, &shape, DType::F32).unwrap_err();
        assert!(
            matches!(err, Error::Vulkan(helios_vk::Error::Misaligned { .. })),
            "{err}"
        );
    }
    let err = arena.tensor(0, &[64 << 10], DType::F32).unwrap_err();
    assert!(
        matches!(err, Error::Vulkan(helios_vk::Error::OutOfRange { .. })),
        "{err}"
    );
    let err = arena.tensor(0, &[usize::MAX, 2], DType::F32).unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    assert_clean(d);
}

#[test]
fn signal_and_wait_external_order_lazy_work() {
    // A device of its own: the checks read its timeline, which other tests would advance.
    let d = common::device_with(|c| c);
    let ctx = d.context();
    let all_done = || ctx.completed().unwrap() >= ctx.last_submitted();
    let arena = arena(&d, 64 << 10);
    let mut rng = StdRng::seed_from_u64(5);
    let x_host = random(&mut rng, 500, DType::F32);
    let x = Tensor::from_slice(&d, &x_host, &[500]).unwrap();
    for t in timelines(&d) {
        // Pending work asked for before the signal is recorded before it, and done once the
        // signal arrives: a gradient copied into the arena among it.
        let z = x.mul_scalar(2.0).unwrap();
        let slot = arena
            .as_ref()
            .map(|a| a.tensor(0, &[500], DType::F32).unwrap());
        if let Some(slot) = &slot {
            z.add_scalar(1.0).unwrap().copy_into(slot).unwrap();
        }
        let pending = x.exp().unwrap();
        assert!(!pending.is_realized());
        d.signal_external(&t, 1).unwrap();
        assert!(
            pending.is_realized(),
            "signal_external left lazy work pending"
        );
        assert!(
            t.wait(1, Duration::from_secs(10)).unwrap(),
            "never signalled"
        );
        assert!(
            all_done(),
            "the signal came before the work asked for before it"
        );

        // Pending work asked for before the wait does not wait; work recorded after does.
        let before = x.add_scalar(1.0).unwrap();
        d.wait_external(&t, 2).unwrap();
        assert!(before.is_realized());
        assert!(
            eventually(all_done),
            "work asked for before wait_external waited"
        );
        // The optimizer-like reader of the arena, recorded after the wait.
        let after = match &slot {
            Some(slot) => slot.add_scalar(2.0).unwrap(),
            None => x.add_scalar(2.0).unwrap(),
        };
        after.realize().unwrap();
        d.flush().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let early = all_done();
        t.signal(2).unwrap(); // before asserting, so a failure cannot hang the teardown
        assert!(
            !early,
            "work recorded after wait_external ran before the value"
        );
        let want: Vec<f32> = match slot {
            Some(_) => x_host.iter().map(|v| v * 2.0 + 1.0 + 2.0).collect(),
            None => x_host.iter().map(|v| v + 2.0).collect(),
        };
        same(&after.to_vec().unwrap(), &want, "recorded after the wait");
        let want: Vec<f32> = x_host.iter().map(|v| v + 1.0).collect();
        same(
            &before.to_vec().unwrap(),
            &want,
            "asked for before the wait",
        );
        d.synchronize().unwrap();
    }
    assert_clean(&d);
}
