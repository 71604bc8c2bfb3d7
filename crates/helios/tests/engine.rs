//! The asynchronous engine seen from tensors: barriers only on real dependencies, buffer
//! reuse through the caching pool, zero driver allocations in a steady-state loop, and a
//! stress test of interleaved dependent and independent ops, random read-backs and reuse,
//! checked element by element against the CPU reference under validation.

mod common;

use common::LockExt;
use std::sync::{Mutex, MutexGuard, OnceLock};

use helios::{cpu, BinaryOp, Device, Tensor, UnaryOp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One device for the file; tests that count barriers or allocations take the lock so
/// other tests' work does not land in their counts.
fn device() -> (MutexGuard<'static, ()>, &'static Device) {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.locked();
    let d = DEVICE
        .get_or_init(|| Device::from_env().expect("a Vulkan device (install mesa-vulkan-drivers)"));
    d.set_batch_limit(helios_vk::DEFAULT_BATCH);
    // Counting tests want one batch: no early submits to a GPU that ran dry.
    d.set_early_submit(false);
    (guard, d)
}

#[track_caller]
fn assert_no_validation_messages(d: &Device) {
    let messages = d.validation_messages();
    assert!(
        messages.is_empty(),
        "validation messages:\n{}",
        messages.join("\n")
    );
}

fn input(d: &Device, n: usize, seed: u64) -> (Vec<f32>, Tensor) {
    let mut rng = StdRng::seed_from_u64(seed);
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(0.1f32..2.0)).collect();
    let t = Tensor::from_vec1(d, &v).unwrap();
    (v, t)
}

#[test]
fn dependent_chain_has_one_barrier_per_dependency() {
    let (_g, d) = device();
    let (v, x) = input(d, 1000, 1);
    d.synchronize().unwrap();
    let before = d.encoder_stats();
    let mut t = x;
    for _ in 0..20 {
        // Realised one by one: the engine's hazard tracking, not the graph's fusion.
        t = t.mul_scalar(1.01).unwrap();
        t.realize().unwrap();
    }
    d.synchronize().unwrap();
    let after = d.encoder_stats();
    assert_eq!(after.dispatches - before.dispatches, 20);
    assert_eq!(
        after.barriers - before.barriers,
        19,
        "each op depends on the one before"
    );
    let want: Vec<f32> = v
        .iter()
        .map(|&a| (0..20).fold(a, |acc, _| acc * 1.01))
        .collect();
    assert_eq!(t.to_vec().unwrap(), want);
    assert_no_validation_messages(d);
}

#[test]
fn a_lazy_chain_is_one_kernel() {
    let (_g, d) = device();
    let (v, x) = input(d, 1000, 4);
    d.synchronize().unwrap();
    let before = d.encoder_stats();
    let mut t = x;
    for _ in 0..20 {
        t = t.mul_scalar(1.01).unwrap().add_scalar(0.5).unwrap();
    }
    assert!(!t.is_realized(), "nothing runs before a value is needed");
    let got = t.to_vec().unwrap();
    let after = d.encoder_stats();
    assert_eq!(
        after.dispatches - before.dispatches,
        1,
        "40 element-wise ops fuse into one kernel"
    );
    let want: Vec<f32> = v
        .iter()
        .map(|&a| (0..20).fold(a, |acc, _| acc * 1.01 + 0.5))
        .collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs(), "{g} vs {w}");
    }
    assert_no_validation_messages(d);
}

#[test]
fn independent_ops_have_no_barriers() {
    let (_g, d) = device();
    let (v, x) = input(d, 1000, 2);
    d.synchronize().unwrap();
    let before = d.encoder_stats();
    // Outputs stay alive, so no op reuses another's memory.
    let outs: Vec<Tensor> = (0..20)
        .map(|i| {
            let t = x.add_scalar(i as f32).unwrap();
            t.realize().unwrap();
            t
        })
        .collect();
    d.synchronize().unwrap();
    let after = d.encoder_stats();
    assert_eq!(after.dispatches - before.dispatches, 20);
    assert_eq!(
        after.barriers - before.barriers,
        0,
        "reads of one input never conflict"
    );
    for (i, o) in outs.iter().enumerate() {
        let want: Vec<f32> = v.iter().map(|&a| a + i as f32).collect();
        assert_eq!(o.to_vec().unwrap(), want);
    }
    assert_no_validation_messages(d);
}

#[test]
fn reused_memory_is_ordered_after_its_last_reader() {
    let (_g, d) = device();
    let (v, x) = input(d, 4096, 3);
    d.synchronize().unwrap();
    let a = x.exp().unwrap(); // writes region R
    a.realize().unwrap();
    let b = a.neg().unwrap(); // reads R
    b.realize().unwrap();
    drop(a); // R goes back to the pool while `b`'s read of it is still pending
    let c = x.add_scalar(1.0).unwrap(); // same size class: reuses R, must wait for `b`
    c.realize().unwrap();
    let before = d.encoder_stats();
    d.synchronize().unwrap();
    let after = d.encoder_stats();
    assert!(after.barriers - before.barriers >= 1 || after.batches - before.batches >= 1);
    let want_b: Vec<f32> = v
        .iter()
        .map(|&a| -cpu::unary_f32(UnaryOp::Exp, a))
        .collect();
    let want_c: Vec<f32> = v.iter().map(|&a| a + 1.0).collect();
    let tol = cpu::Tolerance::unary(UnaryOp::Exp);
    assert_eq!(tol.first_mismatch(&b.to_vec().unwrap(), &want_b), None);
    assert_eq!(c.to_vec().unwrap(), want_c);
    assert_no_validation_messages(d);
}

/// Large regions are reused best-fit: a freed 64 MiB region serves two 32 MiB tensors (split)
/// and, once both are freed and merged again, one 64 MiB tensor, with no new driver memory.
/// The merged region is written while a command of the same batch still reads its second
/// half under that half's hazard key: only the remapped-region fence orders the two (the
/// synchronization validation layer fails this test without it).
#[test]
fn large_regions_are_split_and_merged_in_order() {
    // Descriptors, not device addresses: the validation layer sees what each kernel touches.
    let ctx = helios_vk::Context::from_env().unwrap();
    if !ctx.enabled().push_descriptor {
        eprintln!("skipped: the device lacks VK_KHR_push_descriptor");
        return;
    }
    let d = &Device::with_binding(ctx, helios_spirv::Binding::Descriptor);
    d.set_early_submit(false);
    let n = 16 << 20; // f32: 64 MiB
    let (v, x) = input(d, n / 4, 5);
    let x = x.expand(&[4, n / 4]).unwrap().contiguous().unwrap();
    x.realize().unwrap();
    d.synchronize().unwrap();
    let a = x.add_scalar(1.0).unwrap(); // a 64 MiB region R
    a.realize().unwrap();
    let hi = a.narrow(0, 2, 2).unwrap().mul_scalar(3.0).unwrap(); // reads R's second half
    hi.realize().unwrap();
    drop(a); // R is free; `hi`'s read of it is still in the open batch
    let before = d.memory_stats();
    let half = |s: f32| x.narrow(0, 0, 2).unwrap().mul_scalar(s).unwrap();
    let e = half(5.0); // 32 MiB: R's first half (no overlap with the read: no barrier)
    e.realize().unwrap();
    let f = half(7.0); // R's second half: must wait for `hi`'s read
    f.realize().unwrap();
    let cut = d.memory_stats();
    d.synchronize().unwrap();
    let check = |t: &Tensor, f: &dyn Fn(f32) -> f32, what: &str| {
        let want: Vec<f32> = v.iter().map(|&x| f(x)).collect();
        let got = t.to_vec().unwrap();
        assert!(got.chunks(n / 4).all(|q| q == &want[..]), "{what}");
    };
    check(&hi, &|x| (x + 1.0) * 3.0, "hi");
    check(&e, &|x| x * 5.0, "e");
    check(&f, &|x| x * 7.0, "f");
    // The read-backs above may take host-visible staging (a discrete GPU): count from here.
    let checked = d.memory_stats();
    let f2 = f.mul_scalar(2.0).unwrap(); // reads the second half, under its own key
    f2.realize().unwrap();
    drop((e, f)); // the halves merge back into R
    let g = x.add_scalar(2.0).unwrap(); // 64 MiB: all of R, written while f2 still reads it
    g.realize().unwrap();
    let after = d.memory_stats();
    d.synchronize().unwrap();
    assert_eq!(
        cut.driver_allocations, before.driver_allocations,
        "e and f are cut from R: {before:?} -> {cut:?}"
    );
    assert!(
        after.driver_allocations <= checked.driver_allocations + 1,
        "only f2 may be new; g reuses the merged halves: {checked:?} -> {after:?}"
    );
    check(&f2, &|x| x * 14.0, "f2");
    check(&g, &|x| x + 2.0, "g");
    assert_no_validation_messages(d);
}

#[test]
fn steady_state_loop_makes_no_driver_allocations() {
    let (_g, d) = device();
    let (_, x) = input(d, 10_000, 4);
    let step = |x: &Tensor| {
        let y = x.mul_scalar(0.5).unwrap().exp().unwrap();
        let z = y.add(x).unwrap().tanh().unwrap();
        z.sum_check()
    };
    for _ in 0..3 {
        step(&x);
    }
    d.synchronize().unwrap();
    let before = d.memory_stats();
    for _ in 0..50 {
        step(&x);
    }
    d.synchronize().unwrap();
    let after = d.memory_stats();
    assert_eq!(
        after.driver_allocations, before.driver_allocations,
        "{before:?} -> {after:?}"
    );
    assert!(after.pool_hits > before.pool_hits);
    assert_no_validation_messages(d);
}

/// Reads a tensor back (a host read in the middle of a loop) and returns a checksum.
trait SumCheck {
    fn sum_check(&self) -> f32;
}

impl SumCheck for Tensor {
    fn sum_check(&self) -> f32 {
        self.to_vec().unwrap().iter().sum()
    }
}

#[test]
fn stress_interleaved_ops_readbacks_and_reuse() {
    let (_g, d) = device();
    stress(d, 5);
}

/// The same stress test with push descriptors: the validation layer's synchronization
/// validation sees descriptor-bound accesses (not device-address ones), so this run checks
/// the encoder's barriers independently of the results.
#[test]
fn stress_with_push_descriptors_under_sync_validation() {
    let ctx = helios_vk::Context::from_env().unwrap();
    if !ctx.enabled().push_descriptor {
        eprintln!("skipped: the device lacks VK_KHR_push_descriptor");
        return;
    }
    let d = Device::with_binding(ctx, helios_spirv::Binding::Descriptor);
    stress(&d, 6);
}

/// The same stress test with batches recorded and submitted on the submit thread (the
/// default on GPUs; CPU devices such as lavapipe submit where batches close).
#[test]
fn stress_with_the_submit_thread_under_sync_validation() {
    let options = helios_vk::ContextOptions {
        submit_thread: Some(true),
        ..helios_vk::ContextOptions::from_env().unwrap()
    };
    let d = Device::new(helios_vk::Context::from_env_with(&options).unwrap());
    stress(&d, 7);
    assert_no_validation_messages(&d);
}

fn stress(d: &Device, seed: u64) {
    // Early submits on: batch boundaries at unpredictable points are part of the stress.
    d.set_early_submit(true);
    let mut rng = StdRng::seed_from_u64(seed);
    for &limit in &[1u32, 7, 256] {
        d.set_batch_limit(limit);
        // Live tensors with their expected contents.
        let mut live: Vec<(Tensor, Vec<f32>)> = Vec::new();
        for step in 0..300 {
            let choice = rng.gen_range(0..10);
            if live.is_empty() || choice == 0 {
                let n = [1usize, 3, 64, 1000, 4099][rng.gen_range(0..5)];
                let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                live.push((Tensor::from_vec1(d, &v).unwrap(), v));
                continue;
            }
            let i = rng.gen_range(0..live.len());
            match choice {
                1..=3 => {
                    let op = [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Sigmoid]
                        [rng.gen_range(0..4)];
                    let t = live[i].0.unary(op).unwrap();
                    let want = cpu::unary(op, &live[i].1);
                    live.push((t, want));
                }
                4..=6 => {
                    // A partner of the same length, or a fresh one.
                    let n = live[i].1.len();
                    let j = live.iter().position(|(_, v)| v.len() == n).unwrap();
                    let op = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max]
                        [rng.gen_range(0..4)];
                    let t = live[i].0.binary(op, &live[j].0).unwrap();
                    let want = cpu::binary(op, &live[i].1, &live[j].1);
                    live.push((t, want));
                }
                7 => {
                    let s = rng.gen_range(-1.0f32..1.0);
                    let t = live[i].0.mul_scalar(s).unwrap();
                    let want = cpu::scalar(BinaryOp::Mul, &live[i].1, s, false);
                    live.push((t, want));
                }
                8 => {
                    let (t, want) = &live[i];
                    let tol = cpu::Tolerance::unary(UnaryOp::Sigmoid);
                    let got = t.to_vec().unwrap();
                    assert_eq!(
                        tol.first_mismatch(&got, want),
                        None,
                        "step {step}, batch limit {limit}"
                    );
                }
                _ => {
                    // Dropping returns the memory to the pool for reuse by later ops.
                    live.swap_remove(i);
                }
            }
            if live.len() > 24 {
                live.remove(0);
            }
        }
        let tol = cpu::Tolerance::unary(UnaryOp::Sigmoid);
        for (t, want) in &live {
            assert_eq!(
                tol.first_mismatch(&t.to_vec().unwrap(), want),
                None,
                "batch limit {limit}"
            );
        }
    }
    assert_no_validation_messages(d);
}

/// Uploads into memory a pending op still reads, and read-backs too large for the copy
/// kernel: on devices with a dedicated transfer queue these run on the copy engine, ordered
/// against compute by the two timelines (the copy after the kernel that last read the
/// region, the kernel that reads the new data after the copy); elsewhere through staging on
/// the compute queue. Each round keeps the compute queue busy behind that last read, so a
/// kernel reading the upload could run before the copy if it did not wait for it.
#[test]
fn staged_transfers_are_ordered_against_compute() {
    let (_g, d) = device();
    d.set_early_submit(true);
    let n = 1 << 19; // 2 MiB of f32: above the copy-kernel read-back limit
    let mut rng = StdRng::seed_from_u64(9);
    for round in 0..8 {
        let va: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let vc: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let a = Tensor::from_vec1(d, &va).unwrap();
        let b = a.mul_scalar(3.0).unwrap();
        b.realize().unwrap(); // recorded now: a kernel reading a is pending
        let mut busy = b.clone(); // dependent kernels after it keep the queue busy
        for _ in 0..64 {
            busy = busy.add_scalar(1.0).unwrap();
            busy.realize().unwrap();
        }
        drop(a); // a's memory goes back to the pool while b's read is pending
        let c = Tensor::from_vec1(d, &vc).unwrap(); // a's region: a staged upload
        let e = b.add(&c).unwrap();
        e.realize().unwrap(); // queued behind `busy`, as the copy is
        let want: Vec<f32> = va.iter().zip(&vc).map(|(x, y)| x * 3.0 + y).collect();
        assert_eq!(e.to_vec().unwrap(), want, "round {round}");
        assert_eq!(c.to_vec().unwrap(), vc, "round {round}");
        drop(busy);
    }
    d.set_early_submit(false);
    assert_no_validation_messages(d);
}

/// `Tensor::full` fills on the GPU, in order with the work around it: in every dtype, for
/// odd lengths (the last 32-bit word half used), into a region a pending kernel still reads,
/// and in a loop that asks the driver for nothing.
#[test]
fn full_fills_in_order_without_staging() {
    let (_g, d) = device();
    for dtype in [helios::DType::F32, helios::DType::F16, helios::DType::BF16] {
        for shape in [vec![1], vec![3], vec![7, 5], vec![1001]] {
            let t = Tensor::full(d, &shape, -1.375, dtype).unwrap();
            let n: usize = shape.iter().product();
            assert_eq!(t.to_vec().unwrap(), vec![-1.375; n], "{dtype:?} {shape:?}");
        }
    }
    // A region freed while a later kernel's read of it is pending is refilled after it.
    let (v, x) = input(d, 4096, 5);
    d.synchronize().unwrap();
    let a = x.exp().unwrap();
    a.realize().unwrap();
    let b = a.neg().unwrap();
    b.realize().unwrap();
    drop(a);
    let c = Tensor::full(d, &[4096], 2.5, helios::DType::F32).unwrap();
    let e = c.mul(&x).unwrap();
    let want_b: Vec<f32> = v
        .iter()
        .map(|&a| -cpu::unary_f32(UnaryOp::Exp, a))
        .collect();
    let tol = cpu::Tolerance::unary(UnaryOp::Exp);
    assert_eq!(tol.first_mismatch(&b.to_vec().unwrap(), &want_b), None);
    let want_e: Vec<f32> = v.iter().map(|&a| 2.5 * a).collect();
    assert_eq!(e.to_vec().unwrap(), want_e);
    // Steady state: no driver memory (a staging buffer per call would need host memory).
    let step = || {
        Tensor::full(d, &[300], 0.5, helios::DType::BF16)
            .unwrap()
            .sum_check()
    };
    for _ in 0..3 {
        step();
    }
    let before = d.memory_stats();
    for _ in 0..20 {
        assert_eq!(step(), 150.0);
    }
    let after = d.memory_stats();
    assert_eq!(after.driver_allocations, before.driver_allocations);
    assert_no_validation_messages(d);
}
