//! The lazy graph's fusion: random DAGs of 2–40 element-wise ops with broadcasts, transposed
//! views of inputs and of intermediate results, casts and several outputs give, fused, the
//! same values as node-by-node (each op realised as it is built) and as the f64 CPU
//! reference, for f32, f16 and bf16 storage.
//!
//! Values stay in [-1, 1] (averages, products, bounded activations), so errors cannot grow
//! without bound; tolerances, |got − want| ≤ tol: f32 1e-5, f16 2e-2, bf16 6e-2 against the
//! CPU (which rounds only at explicit casts, as the fused kernel does), the same between
//! fused and node by node (which rounds every intermediate to the storage type).

mod common;

use common::graph::{program, N};
use common::{assert_no_validation_messages, device, LockExt};
use helios::{graph_stats, DType, Device, GraphStats, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Serialises the tests: the scheduler's counters are process-wide.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn fused_matches_node_by_node_and_cpu() {
    let _l = LOCK.locked();
    for dtype in DType::ALL {
        let tol = match dtype {
            DType::F32 => 1e-5,
            DType::F16 => 2e-2,
            DType::BF16 => 6e-2,
        };
        for seed in 0..24u64 {
            let ops = 2 + (seed as usize * 7) % 39;
            let before = graph_stats();
            let fused = program(seed, dtype, ops, false);
            // Several outputs: the last value and two intermediates stay alive.
            let picks = [fused.len() - 1, fused.len() / 2, 4];
            let got: Vec<Vec<f32>> = picks
                .iter()
                .map(|&i| fused[i].t.to_vec().unwrap())
                .collect();
            let kernels = graph_stats().kernels - before.kernels;
            let eager = program(seed, dtype, ops, true);
            for (k, &i) in picks.iter().enumerate() {
                let e = eager[i].t.to_vec().unwrap();
                for j in 0..N * N {
                    let (g, want) = (got[k][j] as f64, fused[i].r[j]);
                    assert!(
                        (g - want).abs() <= tol,
                        "{dtype:?} seed {seed} ({ops} ops) value {i}[{j}]: fused {g}, CPU {want}"
                    );
                    assert!(
                        (g - e[j] as f64).abs() <= tol,
                        "{dtype:?} seed {seed} value {i}[{j}]: fused {g}, node by node {}",
                        e[j]
                    );
                }
            }
            assert!(
                kernels as usize <= ops,
                "fusion never adds kernels ({kernels} for {ops} ops)"
            );
        }
    }
    assert_no_validation_messages();
}

/// Asserts that one fused kernel ran since `before`, computing `nodes` nodes and storing
/// only its result; returns the counters now.
fn one_kernel_since(before: &GraphStats, nodes: u64) -> GraphStats {
    let after = graph_stats();
    assert_eq!(after.kernels - before.kernels, 1);
    assert_eq!(after.nodes - before.nodes, nodes);
    assert_eq!(
        after.outputs - before.outputs,
        1,
        "intermediates stay in registers"
    );
    after
}

#[test]
fn a_chain_with_a_broadcast_bias_is_one_kernel_and_reads_views_in_place() {
    let _l = LOCK.locked();
    let d = device();
    let x: Vec<f32> = (0..64 * 32).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let b: Vec<f32> = (0..32).map(|i| i as f32 * 0.01).collect();
    let xt = Tensor::from_slice(d, &x, &[64, 32]).unwrap();
    let bt = Tensor::from_slice(d, &b, &[32]).unwrap();
    let before = graph_stats();
    let y = xt
        .add(&bt)
        .unwrap()
        .gelu_tanh()
        .unwrap()
        .mul_scalar(2.0)
        .unwrap()
        .add(&xt)
        .unwrap();
    let got = y.to_vec().unwrap();
    one_kernel_since(&before, 4);
    for (i, g) in got.iter().enumerate() {
        let z = (x[i] + b[i % 32]) as f64;
        let gelu = 0.5 * z * (1.0 + (0.797_884_560_802_865_4 * (z + 0.044715 * z * z * z)).tanh());
        let want = 2.0 * gelu + x[i] as f64;
        assert!((*g as f64 - want).abs() < 1e-5, "{i}: {g} vs {want}");
    }
    assert_no_validation_messages();
}

/// `Device::synchronize` (and an optimizer step) realise every pending node, and a chain
/// realised there fuses as it does when read: one kernel, only the result stored. (They had
/// first taken a reference to every pending node, so each member looked held by someone and
/// was stored.)
#[test]
fn a_chain_realised_by_synchronize_stores_only_its_result() {
    let _l = LOCK.locked();
    let d = device();
    let x: Vec<f32> = (0..64 * 32).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let xt = Tensor::from_slice(d, &x, &[64, 32]).unwrap();
    let before = graph_stats();
    let y = xt
        .mul_scalar(3.0)
        .unwrap()
        .tanh()
        .unwrap()
        .add(&xt)
        .unwrap();
    d.synchronize().unwrap();
    let after = one_kernel_since(&before, 3);
    let got = y.to_vec().unwrap();
    assert_eq!(graph_stats().kernels, after.kernels, "y was realised");
    for (i, g) in got.iter().enumerate() {
        let want = (3.0 * x[i] as f64).tanh() + x[i] as f64;
        assert!((*g as f64 - want).abs() < 1e-5, "{i}: {g} vs {want}");
    }
    assert_no_validation_messages();
}

/// Max and min of scalars inside one fused kernel, over IEEE special values (vec4 and
/// one-element forms, both operand orders, every special value as the scalar) against the
/// CPU: NaN exactly where an operand is NaN, as in PyTorch. The kernel tests only the tensor
/// operand for NaN; a NaN scalar is lowered to `x + NaN`.
#[test]
fn fused_scalar_max_and_min_propagate_nan() {
    let _l = LOCK.locked();
    let d = device();
    let specials = helios::selfcheck::SPECIALS;
    for len in [specials.len() * 4, specials.len() * 4 + 3] {
        let x: Vec<f32> = (0..len).map(|i| specials[i % specials.len()]).collect();
        let t = Tensor::from_slice(d, &x, &[len]).unwrap();
        // Four steps a kernel (more outputs would pass lavapipe's push-constant budget).
        for (c, chunk) in specials.chunks(4).enumerate() {
            let before = graph_stats();
            // A computed operand (a member of the group, not a load).
            let x1 = t.mul_scalar(1.0).unwrap();
            let mut steps: Vec<(Tensor, Vec<f32>)> = Vec::new();
            for (j, &s) in chunk.iter().enumerate() {
                let i = 4 * c + j;
                let (max, scalar_first) = (i % 2 == 0, i % 3 == 0);
                let op = match max {
                    true => helios::BinaryOp::Max,
                    false => helios::BinaryOp::Min,
                };
                let z = match scalar_first {
                    true => x1.scalar_first_op(op, s).unwrap(),
                    false => x1.scalar_op(op, s).unwrap(),
                };
                // PyTorch: NaN if either operand is NaN, else the max or min.
                let want = x
                    .iter()
                    .map(|&v| match (v.is_nan() || s.is_nan(), max) {
                        (true, _) => f32::NAN,
                        (false, true) => v.max(s),
                        (false, false) => v.min(s),
                    })
                    .collect();
                steps.push((z, want));
            }
            // One kernel: every step is held, so the group rooted at their sum stores each.
            let mut all = steps[0].0.clone();
            for (z, _) in &steps[1..] {
                all = all.add(z).unwrap();
            }
            all.realize().unwrap();
            assert_eq!(
                graph_stats().kernels - before.kernels,
                1,
                "one fused kernel"
            );
            for (j, (z, want)) in steps.iter().enumerate() {
                let got = z.to_vec().unwrap();
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    // Zeros compare equal whatever their sign (`FMax` leaves it unspecified).
                    assert!(
                        (g.is_nan() && w.is_nan()) || g == w,
                        "n={len}, scalar {}, element {i} (x = {}): got {g}, want {w}",
                        chunk[j],
                        x[i]
                    );
                }
            }
        }
    }
    assert_no_validation_messages();
}

/// Members that die in a realisation become spares that later nodes reuse (see `lazy.rs`):
/// chains built on reused nodes give the CPU's values, a spare is not a live node, and it
/// holds no device (dropping the device releases its context).
#[test]
fn spare_nodes_are_reused_and_hold_nothing() {
    let _l = LOCK.locked();
    let d = common::device_with(|c| c);
    let ctx = d.context().clone();
    let live = graph_stats().live_nodes;
    for round in 0..3 {
        // Another length each round: a reused node takes the new one.
        let n = 1027 + 8 * round;
        let data: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.25 - 1.5).collect();
        let x = Tensor::from_slice(&d, &data, &[n]).unwrap();
        let mut t = x.clone();
        let mut want = data.clone();
        // Three scalars a round: the chain is one group (each distinct scalar is a push
        // constant), so every member but the root becomes a spare.
        for i in 0..300 {
            let s = 1.0 + (round * 3 + i % 3) as f32 * 1e-3;
            (t, want) = match i % 3 {
                0 => (
                    t.mul_scalar(s).unwrap(),
                    want.iter().map(|v| v * s).collect(),
                ),
                1 => (
                    t.add_scalar(-s).unwrap(),
                    want.iter().map(|v| v - s).collect(),
                ),
                _ => (
                    t.maximum_scalar(-s).unwrap(),
                    want.iter().map(|v| v.max(-s)).collect(),
                ),
            };
        }
        let got = t.to_vec().unwrap();
        assert_eq!(got.len(), n);
        if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
            panic!("round {round}, element {i}: {} vs {}", got[i], want[i]);
        }
    }
    assert_eq!(graph_stats().live_nodes, live, "spares are not live nodes");
    common::assert_clean(&d);
    drop(d);
    assert_eq!(
        std::sync::Arc::strong_count(&ctx),
        1,
        "no spare keeps the device (and its context) alive"
    );
}

#[test]
fn a_pending_result_read_back_is_written_to_host_memory_by_its_kernel() {
    let _l = LOCK.locked();
    // Force the kernel read-back policy (what discrete GPUs use for small reads).
    let d = common::device_with(|c| helios::KernelConfig {
        readback: helios::Readback::Kernel,
        ..c
    });
    let x = Tensor::from_slice(&d, &[1.0, 2.0, 3.0, 4.0, 5.0], &[5]).unwrap();
    d.synchronize().unwrap();
    let before = d.encoder_stats();
    let got = x
        .mul_scalar(2.0)
        .unwrap()
        .add_scalar(1.0)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(got, vec![3.0, 5.0, 7.0, 9.0, 11.0]);
    assert_eq!(
        d.encoder_stats().dispatches - before.dispatches,
        1,
        "no separate copy kernel"
    );
    common::assert_clean(&d);
}

/// Threads building, reading and synchronizing at once: each realisation sees the reference
/// counts it needs (a group's value computed in registers is never asked for afterwards).
#[test]
fn threads_realise_at_once() {
    let _l = LOCK.locked();
    let d = device();
    let x = Tensor::from_slice(d, &[0.5; 256], &[256]).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let x = x.clone();
            s.spawn(move || {
                for i in 0..40 {
                    let a = x.mul_scalar(t as f32).unwrap();
                    let b = a.add_scalar(i as f32).unwrap().tanh().unwrap();
                    let c = b.mul(&a).unwrap();
                    if i % 3 == 0 {
                        d.synchronize().unwrap();
                    }
                    let got = c.to_vec().unwrap();
                    let want = ((0.5 * t as f32) + i as f32).tanh() * 0.5 * t as f32;
                    assert!(
                        (got[0] - want).abs() < 1e-5,
                        "thread {t} step {i}: {} vs {want}",
                        got[0]
                    );
                }
            });
        }
    });
    assert_no_validation_messages();
}

/// Under descriptor binding (devices without buffer device addresses) a descriptor binds a
/// whole buffer: fused kernels and reduction prologues add each view's first element
/// themselves (offsets 1, 4 and 8 elements into the buffer; vector and element reads).
#[test]
fn descriptor_bound_kernels_read_views_at_their_offsets() {
    let _l = LOCK.locked();
    let ctx = helios_vk::Context::from_env().unwrap();
    if !ctx.enabled().push_descriptor {
        eprintln!("skipped: the device lacks VK_KHR_push_descriptor");
        return;
    }
    let d = Device::with_binding(ctx, helios_spirv::Binding::Descriptor);
    let (rows, cols) = (12, 16);
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| (i % 13) as f32 * 0.25 - 1.0)
        .collect();
    let x = Tensor::from_slice(&d, &v, &[rows, cols]).unwrap();
    for (start, len) in [(1, 5), (4, 8), (8, 4)] {
        // Rows start..start+len: an offset of start·cols elements; and columns
        // start..start+len of every row (offset start, row stride cols).
        let r = x.narrow(0, start, len).unwrap();
        let c = x.narrow(1, start, len).unwrap();
        let y = r.mul_scalar(2.0).unwrap().add_scalar(0.5).unwrap();
        let want_r: Vec<f32> = v[start * cols..(start + len) * cols]
            .iter()
            .map(|a| a * 2.0 + 0.5)
            .collect();
        assert_eq!(y.to_vec().unwrap(), want_r, "rows {start}..+{len}");
        let z = c.mul_scalar(2.0).unwrap().add_scalar(0.5).unwrap();
        let want_c: Vec<f32> = (0..rows)
            .flat_map(|i| (start..start + len).map(move |j| (i, j)))
            .map(|(i, j)| v[i * cols + j] * 2.0 + 0.5)
            .collect();
        assert_eq!(z.to_vec().unwrap(), want_c, "columns {start}..+{len}");
        // The same expression as a sum's prologue (built in a block: a temporary of the
        // same statement would still hold the intermediate, which then must be stored).
        let before = graph_stats().prologues;
        let e = {
            let twice = c.mul_scalar(2.0).unwrap();
            twice.add_scalar(0.5).unwrap()
        };
        let s = e.sum(1).unwrap();
        assert_eq!(graph_stats().prologues, before + 1);
        let want_s: Vec<f32> = want_c.chunks(len).map(|row| row.iter().sum()).collect();
        assert_eq!(
            s.to_vec().unwrap(),
            want_s,
            "sum of columns {start}..+{len}"
        );
        // In one statement the temporaries hold both values: the sum's first step stores
        // them where it computes them (descriptors for the stored outputs too).
        let before = graph_stats();
        let s0 = c
            .mul_scalar(2.0)
            .unwrap()
            .add_scalar(0.5)
            .unwrap()
            .sum(0)
            .unwrap();
        let after = graph_stats();
        assert_eq!(
            (
                after.prologues - before.prologues,
                after.kernels - before.kernels
            ),
            (1, 0),
            "columns {start}..+{len}: one stored prologue, no fused kernel"
        );
        let want_s0: Vec<f32> = (0..len)
            .map(|j| (0..rows).map(|i| want_c[i * len + j]).sum())
            .collect();
        assert_eq!(s0.to_vec().unwrap(), want_s0, "column sums {start}..+{len}");
    }
    assert!(
        d.validation_messages().is_empty(),
        "{:?}",
        d.validation_messages()
    );
}

/// Concatenations (padded reads) in the vector form, where every vec4 lies on one side of
/// each window (along an outer dimension; along the last at multiples of 4), and in the
/// one-element form where it cannot (odd widths), in each dtype: exact copies.
#[test]
fn concatenations_in_both_forms_copy_exactly() {
    // Graph statistics are process-wide: other tests count kernels.
    let _l = LOCK.locked();
    let d = device();
    let mut rng = StdRng::seed_from_u64(0xca7);
    // (shape of each part except along `dim`, dim, the parts' sizes along it)
    let cases: [(&[usize], usize, &[usize]); 5] = [
        (&[3, 0, 2, 8], 1, &[5, 5, 5]), // a fused QKV's gradient: outer dim, vec4 rows
        (&[6, 0], 1, &[4, 8, 12]),      // the last dim at multiples of 4
        (&[6, 0], 1, &[3, 5, 4]),       // odd widths: one element at a time
        (&[0, 12], 0, &[7, 9]),         // the first dim
        (&[2, 0, 3], 1, &[2, 1]),       // nothing a multiple of 4
    ];
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (base, dim, sizes) in cases {
            let parts: Vec<(Vec<usize>, Vec<f32>)> = sizes
                .iter()
                .map(|&s| {
                    let mut shape = base.to_vec();
                    shape[dim] = s;
                    let n: usize = shape.iter().product();
                    let v = (0..n)
                        .map(|_| dtype.round(rng.gen_range(-2.0f32..2.0)))
                        .collect();
                    (shape, v)
                })
                .collect();
            let tensors: Vec<Tensor> = parts
                .iter()
                .map(|(s, v)| Tensor::from_slice_as(d, v, s, dtype).unwrap())
                .collect();
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let got = Tensor::cat(&refs, dim).unwrap().to_vec().unwrap();
            // The reference: rows of the leading dims, each the parts' slices in turn.
            let outer: usize = base[..dim].iter().product();
            let mut want = Vec::with_capacity(got.len());
            for o in 0..outer {
                for (shape, v) in &parts {
                    let block: usize = shape[dim..].iter().product();
                    want.extend_from_slice(&v[o * block..(o + 1) * block]);
                }
            }
            assert_eq!(
                got, want,
                "{dtype} cat of {sizes:?} along {dim} of {base:?}"
            );
        }
    }
    assert_no_validation_messages();
}

/// f16 rounding inside a fused group (a cast held in registers) and at its store are both
/// round-to-nearest-even, bit for bit as `half` rounds: ties either way, the largest f16
/// and the overflow past it, f16 subnormals and their ties, infinities, NaN, signed zero,
/// and random values.
#[test]
fn f16_rounding_is_exact_in_registers_and_in_stores() {
    let _l = LOCK.locked();
    let d = device();
    let ulp = |e: i32| 2f32.powi(e - 10);
    let mut v: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0 + ulp(0) / 2.0,       // tie to even: down to 1
        1.0 + 3.0 * ulp(0) / 2.0, // tie to even: up
        -(1.0 + 3.0 * ulp(0) / 2.0),
        65504.0,
        65519.99,
        65520.0, // ties to even past the largest: inf
        -70000.0,
        2f32.powi(-24) / 2.0, // tie between 0 and the smallest subnormal: 0
        3.0 * 2f32.powi(-24) / 2.0, // tie between subnormals 1 and 2: 2
        5.0 * 2f32.powi(-25),
        2f32.powi(-14) - 2f32.powi(-26),
        1e-30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    let mut rng = StdRng::seed_from_u64(5);
    while v.len() < 4096 {
        let e = rng.gen_range(-26i32..17);
        v.push(rng.gen_range(-1.0f32..1.0) * 2f32.powi(e));
    }
    let want: Vec<f32> = v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
    let same = |got: &[f32], what: &str| {
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let ok = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
            assert!(ok, "{what}: {:e} rounded to {g:e}, want {w:e} (#{i})", v[i]);
        }
    };
    let x = Tensor::from_slice(d, &v, &[v.len()]).unwrap();
    // Stored: a fused group whose output is f16 (the multiply keeps it a kernel of its own).
    let stored = x.mul_scalar(1.0).unwrap().to_dtype(DType::F16).unwrap();
    same(&stored.to_vec().unwrap(), "stored");
    // In registers: the f16 value feeds an f32 op of the same group.
    let held = x
        .mul_scalar(1.0)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .mul_scalar(1.0)
        .unwrap();
    same(&held.to_vec().unwrap(), "in registers");
    assert_no_validation_messages();
}
