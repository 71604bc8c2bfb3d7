//! Fused attention (forward and every gradient) on the Vulkan device present against the f64
//! CPU reference: every head dim (32, 64, 80, 96, 128) and dtype, random batch/heads, odd T
//! (not a multiple of any block), causal and not, key-padding lengths, Q/K/V read in place
//! from a fused [B, T, 3, H, D] tensor, every SIMT variant forced, determinism, and errors.
//! f32 without key lengths on a GPU runs the materialised form (scores stored, causal
//! products skipping the masked half) from 2 MiB of scores; forced, it is checked here too,
//! also across many matmul tiles. On a device with cooperative
//! matrices the f16/bf16 cases run the cooperative kernels
//! (the default choice there) and the relative errors are printed per dtype. Every test fails
//! on any validation message.
//!
//! Error measure: max |got − want| / max |want| per tensor. Bounds: f32 1e-4; f16 2e-3 and
//! bf16 1e-2 for the SIMT path (storage rounding only: f32 math); the cooperative path also
//! rounds P and dS to the input type before its matrix products: f16 6e-3, bf16 4e-2.

mod common;

use common::{assert_clean, device};
use helios::cpu::attention::{self as reference, AttnDims, AttnMask};
use helios::{AttentionOptions, AttnStage, AttnVariant, DType, Device, IndexTensor, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random(n: usize, rng: &mut StdRng, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| dtype.round(rng.gen_range(-1.0f32..1.0)))
        .collect()
}

fn tolerance(dtype: DType, coop: bool) -> f64 {
    match (dtype, coop) {
        (DType::F32, _) => 1e-4,
        (DType::F16, false) => 2e-3,
        (DType::BF16, false) => 1e-2,
        (DType::F16, true) => 6e-3,
        (DType::BF16, true) => 4e-2,
    }
}

/// One case.
#[derive(Clone, Debug)]
struct Case {
    dims: AttnDims,
    dtype: DType,
    causal: bool,
    lens: Option<Vec<u32>>,
    /// Q, K, V as views of one fused [B, T, 3, H, D] tensor that starts this many elements
    /// into its buffer (1: no row starts on a multiple of 4 elements).
    fused: Option<usize>,
    variant: Option<AttnVariant>,
    /// `AttentionOptions::stored_scores`: forces the f32 form.
    stored: Option<bool>,
}

/// The worst relative error of (out, lse, dq, dk, dv), and the forward's kernel
/// (`materialised` where the scores are stored).
fn run(d: &Device, c: &Case, seed: u64) -> Result<([f64; 5], String), String> {
    run_with(d, c, seed, None)
}

/// `run` with one stage's kernel forced (`stage_variant`) instead of `c.variant`'s.
fn run_with(
    d: &Device,
    c: &Case,
    seed: u64,
    stage: Option<(AttnStage, AttnVariant)>,
) -> Result<([f64; 5], String), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let s = c.dims;
    let n = s.b * s.t * s.h * s.d;
    let shape = [s.b, s.t, s.h, s.d];
    let (q, k, v) = (
        random(n, &mut rng, c.dtype),
        random(n, &mut rng, c.dtype),
        random(n, &mut rng, c.dtype),
    );
    let dout = random(n, &mut rng, c.dtype);
    let e = |e: helios::Error| format!("{c:?}: {e}");
    let lens = match &c.lens {
        Some(l) => Some(IndexTensor::from_slice(d, l, &[s.b]).map_err(e)?),
        None => None,
    };
    let (variant, stage_variant) = match (stage, c.variant) {
        (Some(sv), _) => (None, Some(sv)),
        (None, v) => match v {
            // Row-tile pairs and native kernels are the forward's: the backward runs its usual
            // kernels.
            Some(v) if v.row_tiles() > 1 || v.is_native() => (None, Some((AttnStage::Forward, v))),
            v => (v, None),
        },
    };
    let opts = AttentionOptions {
        causal: c.causal,
        scale: None,
        key_lengths: lens,
        variant,
        stage_variant,
        stored_scores: c.stored,
    };
    let (qt, kt, vt) = if let Some(at) = c.fused {
        // [B, T, 3, H, D], `at` elements into the buffer.
        let mut fused = vec![0.5f32; at + 3 * n];
        for (x, src) in [&q, &k, &v].iter().enumerate() {
            for bt in 0..s.b * s.t {
                for hd in 0..s.h * s.d {
                    fused[at + (bt * 3 + x) * s.h * s.d + hd] = src[bt * s.h * s.d + hd];
                }
            }
        }
        let f = Tensor::from_slice_as(d, &fused, &[at + 3 * n], c.dtype).map_err(e)?;
        let f = f
            .narrow(0, at, 3 * n)
            .and_then(|f| f.reshape(&[s.b, s.t, 3, s.h, s.d]))
            .map_err(e)?;
        let [a, b, cc] = f.split_qkv().map_err(e)?;
        (a, b, cc)
    } else {
        let up = |x: &[f32]| Tensor::from_slice_as(d, x, &shape, c.dtype);
        (up(&q).map_err(e)?, up(&k).map_err(e)?, up(&v).map_err(e)?)
    };
    let kernel = qt.attention_kernel(AttnStage::Forward, &opts).map_err(e)?;
    let fwd = qt.attention(&kt, &vt, &opts).map_err(e)?;
    // With fused views, dO too is a view `at` elements into its buffer: at an odd offset,
    // Prep reads O and dO one element at a time.
    let dt = match c.fused {
        Some(at) => {
            let mut padded = vec![0.5f32; at];
            padded.extend_from_slice(&dout);
            Tensor::from_slice_as(d, &padded, &[at + n], c.dtype)
                .and_then(|t| t.narrow(0, at, n))
                .and_then(|t| t.reshape(&shape))
                .map_err(e)?
        }
        None => Tensor::from_slice_as(d, &dout, &shape, c.dtype).map_err(e)?,
    };
    let g = qt
        .attention_backward(&kt, &vt, &fwd, &dt, &opts)
        .map_err(e)?;
    let mask = AttnMask {
        causal: c.causal,
        lens: c.lens.as_deref(),
    };
    let scale = 1.0 / (s.d as f32).sqrt();
    let (want_o, want_l) = reference::attention(&q, &k, &v, s, mask, scale);
    let [wq, wk, wv] = reference::attention_backward(&q, &k, &v, &dout, s, mask, scale);
    let got = |t: &Tensor| t.to_vec().map_err(e);
    // L: compare where finite; −inf must match exactly.
    let gl = got(&fwd.lse)?;
    for (i, (&a, &b)) in gl.iter().zip(&want_l).enumerate() {
        if b.is_infinite() != a.is_infinite() {
            return Err(format!("{c:?}: lse[{i}] = {a}, want {b}"));
        }
    }
    let fin = |x: &[f32]| -> Vec<f32> {
        x.iter()
            .map(|&v| if v.is_infinite() { 0.0 } else { v })
            .collect()
    };
    let errs = [
        reference::relative_error(&got(&fwd.out)?, &want_o),
        reference::relative_error(&fin(&gl), &fin(&want_l)),
        reference::relative_error(&got(&g.dq)?, &wq),
        reference::relative_error(&got(&g.dk)?, &wk),
        reference::relative_error(&got(&g.dv)?, &wv),
    ];
    Ok((errs, kernel))
}

#[track_caller]
fn check(d: &Device, c: &Case, seed: u64) -> [f64; 5] {
    let (errs, kernel) = run(d, c, seed).unwrap_or_else(|e| panic!("{e}"));
    // Native kernels round P to the input type as the cooperative ones do.
    let coop = kernel.contains("coop") || kernel.contains("_nv");
    let tol = tolerance(c.dtype, coop);
    let names = ["out", "lse", "dq", "dk", "dv"];
    for (n, &err) in names.iter().zip(&errs) {
        assert!(
            err <= tol,
            "{c:?} (coop {coop}): {n} relative error {err:.3e} > {tol:.0e}"
        );
    }
    assert_clean(d);
    errs
}

fn dims(b: usize, t: usize, h: usize, d: usize) -> AttnDims {
    AttnDims { b, t, h, d }
}

/// Every head dim × dtype, random B, H and odd T, causal/non-causal and key padding
/// alternating, the default kernel choice (f32 at D = 128 the stored-score form); relative
/// errors printed per dtype.
#[test]
fn every_head_dim_and_dtype_matches_reference() {
    let d = device();
    let mut rng = StdRng::seed_from_u64(14);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut worst = [0.0f64; 5];
        let mut paths = std::collections::BTreeSet::new();
        for (i, hd) in [32usize, 64, 80, 96, 128].into_iter().enumerate() {
            let b = rng.gen_range(1..3);
            let t = rng.gen_range(1..40) * 2 + 1;
            let h = rng.gen_range(1..3);
            let lens =
                (i % 2 == 1).then(|| (0..b).map(|_| rng.gen_range(1..=t as u32 + 3)).collect());
            let c = Case {
                dims: dims(b, t, h, hd),
                dtype,
                causal: i % 3 != 2,
                lens,
                fused: None,
                variant: None,
                // The stored-score form at one head dim (lavapipe picks the flash kernels).
                stored: (dtype == DType::F32 && i == 4).then_some(true),
            };
            let errs = check(d, &c, i as u64);
            let kernel = run(d, &c, i as u64).unwrap().1;
            paths.insert(match kernel.as_str() {
                "materialised" => "materialised",
                k if k.contains("coop") => "cooperative",
                k if k.contains("_nv") => "native",
                _ => "simt",
            });
            for (w, e) in worst.iter_mut().zip(errs) {
                *w = w.max(e);
            }
        }
        println!(
            "attention {dtype} ({}): worst relative error out {:.2e} lse {:.2e} dq {:.2e} dk {:.2e} dv {:.2e}",
            paths.into_iter().collect::<Vec<_>>().join(", "),
            worst[0], worst[1], worst[2], worst[3], worst[4]
        );
    }
}

/// The materialised f32 form (forced; a GPU's default for larger f32 problems) across many
/// matmul tiles:
/// T past a few tiles and a multiple of none, causal and not, dense views and fused ones
/// whose rows start off a 16-byte boundary. The memory pool first holds NaN everywhere, so
/// the parts of the scores this form leaves unwritten (above the diagonal) are NaN: the
/// products must not read them.
#[test]
fn materialised_form_spans_tiles() {
    let d = device();
    for n in [1 << 14, 1 << 16, 1 << 18, 1 << 20] {
        let nan = Tensor::from_slice(d, &vec![f32::NAN; n], &[n]).unwrap();
        nan.realize().unwrap();
    }
    d.synchronize().unwrap();
    let cases = [
        (203, true, None),
        (130, true, Some(1)),
        (203, false, Some(0)),
        (67, true, None),
    ];
    for (i, (t, causal, fused)) in cases.into_iter().enumerate() {
        let c = Case {
            dims: dims(2, t, 3, 32),
            dtype: DType::F32,
            causal,
            lens: None,
            fused,
            variant: None,
            stored: Some(true),
        };
        let seed = 40 + i as u64;
        let kernel = run(d, &c, seed).unwrap_or_else(|e| panic!("{e}")).1;
        assert_eq!(kernel, "materialised", "{c:?}");
        check(d, &c, seed);
    }
}

/// Q, K, V read in place from a fused [B, T, 3, H, D] tensor (and dO from a view), at an
/// aligned offset and an odd one; non-causal with padding.
#[test]
fn fused_qkv_views_are_read_in_place() {
    let d = device();
    for (i, (causal, lens)) in [(true, None), (false, Some(vec![5u32, 17]))]
        .into_iter()
        .enumerate()
    {
        for dtype in [DType::F32, DType::BF16] {
            let c = Case {
                dims: dims(2, 19, 3, 64),
                dtype,
                causal,
                lens: lens.clone(),
                fused: Some(i),
                variant: None,
                stored: None,
            };
            check(d, &c, 100 + i as u64);
        }
    }
}

/// `attention_qkv` on a fused [B, T, 3, H, D] tensor: the same output as `attention` on its
/// `split_qkv` views, and one gradient whose slices are dQ, dK and dV, written in place by
/// the backward kernels, exactly what the views' own gradients sum to (their pads add
/// zeros). f32 takes the materialised form on lavapipe, f16 and bf16 the kernels.
#[test]
fn packed_qkv_gradient_matches_the_views() {
    let d = device();
    for (i, dtype) in [DType::F32, DType::BF16, DType::F16]
        .into_iter()
        .enumerate()
    {
        for (j, (t, lens)) in [(19, None), (40, Some(vec![33u32, 40]))]
            .into_iter()
            .enumerate()
        {
            let (b, h, hd) = (2, 3, [64, 32][j]);
            let mut rng = StdRng::seed_from_u64(60 + (3 * i + j) as u64);
            let n = b * t * 3 * h * hd;
            let host = random(n, &mut rng, dtype);
            let r = random(n / 3, &mut rng, dtype);
            let opts = AttentionOptions {
                causal: j == 0,
                key_lengths: lens.map(|l| IndexTensor::from_slice(d, &l, &[b]).unwrap()),
                ..AttentionOptions::causal()
            };
            let shape = [b, t, 3, h, hd];
            let r = Tensor::from_slice_as(d, &r, &[b, t, h, hd], dtype).unwrap();
            let run = |packed| fused_qkv_grad(d, (&host, shape, dtype), &r, &opts, packed);
            let (packed, views) = (run(true), run(false));
            // Equal values (the views' pads add +0, which turns a -0 into +0).
            let differs = |a: &[f32], b: &[f32]| (0..a.len()).find(|&i| a[i] != b[i]);
            if let Some(i) = differs(&packed.0, &views.0) {
                panic!(
                    "{dtype} t={t}: output {i}: {:e} against {:e}",
                    packed.0[i], views.0[i]
                );
            }
            if let Some(i) = differs(&packed.1, &views.1) {
                panic!(
                    "{dtype} t={t}: gradient {i}: {:e} packed, {:e} through views",
                    packed.1[i], views.1[i]
                );
            }
            assert!(
                packed.1.iter().any(|&x| x != 0.0),
                "{dtype}: a zero gradient"
            );
        }
    }
    assert_clean(d);
}

/// Attention over a fused [B, T, 3, H, D] tensor `host` with `opts`, through
/// `attention_qkv` (`packed`: one packed gradient) or through the `split_qkv` views, then
/// backward from Σ out ∘ `r`: the output and the fused tensor's gradient.
fn fused_qkv_grad(
    d: &Device,
    (host, shape, dtype): (&[f32], [usize; 5], DType),
    r: &Tensor,
    opts: &AttentionOptions,
    packed: bool,
) -> (Vec<f32>, Vec<f32>) {
    let [b, t, _, h, hd] = shape;
    let qkv = Tensor::from_slice_as(d, host, &shape, dtype)
        .unwrap()
        .requires_grad_();
    let out = match packed {
        true => qkv.attention_qkv(opts).unwrap().out,
        false => {
            let [q, k, v] = qkv.split_qkv().unwrap();
            let v4 = |x: Tensor| x.reshape(&[b, t, h, hd]).unwrap();
            v4(q).attention(&v4(k), &v4(v), opts).unwrap().out
        }
    };
    out.mul(r).unwrap().sum_all().unwrap().backward().unwrap();
    let g = qkv.grad().expect("backward reached qkv");
    assert_eq!(g.shape(), shape);
    (out.to_vec().unwrap(), g.to_vec().unwrap())
}

/// Enough heads that the grid splits them into groups (its z dimension): 1536 heads of
/// 63 × 64 f16 stream 16 KiB each, so 768 heads run per group (`head_group` keeps a group
/// within 16 MiB) and every stage's workgroup finds its head from the group and x.
#[test]
fn heads_split_into_groups_match_reference() {
    let d = device();
    let c = Case {
        dims: dims(4, 63, 384, 64),
        dtype: DType::F16,
        causal: true,
        lens: None,
        fused: None,
        variant: None,
        stored: None,
    };
    check(d, &c, 15);
}

/// Every SIMT tile that fits the device gives the reference's answer (T = 37: a partial
/// last block for every tile).
#[test]
fn every_simt_variant_matches_reference() {
    let d = device();
    for (i, v) in helios_kernels::attention::SIMT_VARIANTS
        .into_iter()
        .enumerate()
    {
        for hd in [32usize, 96] {
            let c = Case {
                dims: dims(1, 37, 2, hd),
                dtype: DType::F32,
                causal: i % 2 == 0,
                lens: (i % 3 == 1).then(|| vec![30]),
                fused: None,
                variant: Some(v),
                stored: None,
            };
            match run(d, &c, 7) {
                Ok(_) => {
                    check(d, &c, 7);
                }
                Err(e) if e.contains("does not fit") => eprintln!("skipped {}: {e}", v.tag()),
                Err(e) => panic!("{e}"),
            }
        }
    }
}

/// Every cooperative tile (where the device has cooperative matrices; a visible skip
/// elsewhere) on f16 and bf16, T = 77, causal with padding and not, head dims 64, 80, 128.
#[test]
fn every_coop_variant_matches_reference() {
    let d = device();
    // Asked of the device, not of the default kernel: where native kernels exist they come
    // first, and the cooperative ones must still be checked.
    if !helios::matmul_caps(d).coop_f16 {
        eprintln!("skipped: {} has no 16x16x16 cooperative matrices", d.name());
        return;
    }
    for (i, v) in helios_kernels::attention::COOP_VARIANTS
        .into_iter()
        .enumerate()
    {
        for dtype in [DType::F16, DType::BF16] {
            for hd in [64usize, 80, 128] {
                let c = Case {
                    dims: dims(2, 77, 2, hd),
                    dtype,
                    causal: i % 2 == 0,
                    lens: (i % 2 == 1).then(|| vec![77, 40]),
                    fused: None,
                    variant: Some(v),
                    stored: None,
                };
                match run(d, &c, 11) {
                    Ok((errs, kernel)) => {
                        assert!(
                            kernel.contains("coop"),
                            "{c:?} ran {kernel}, not the cooperative kernels"
                        );
                        // `_reg`: scores in registers (the device's fragment layout was
                        // recognised).
                        println!(
                            "{kernel} {dtype} d{hd}: out {:.2e} lse {:.2e} dq {:.2e} dk {:.2e} dv {:.2e}",
                            errs[0],
                            errs[1],
                            errs[2],
                            errs[3],
                            errs[4]
                        );
                        check(d, &c, 11);
                    }
                    Err(e) if e.contains("does not fit") => {
                        println!("skipped {} d{hd}: {e}", v.tag())
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }
}

/// The native forward (PTX with `wgmma`, on an NVIDIA Hopper GPU): each tile at the head
/// dims it takes, f16 and bf16, causal and not, key padding (0, short, past T), fused QKV
/// views, and more work items than an H200 has SMs (blocks walk several). Elsewhere it
/// checks that forcing it is a clear error.
#[test]
fn native_forward_matches_reference() {
    let d = device();
    let variants = helios_kernels::attention::NATIVE_VARIANTS;
    if helios::matmul_caps(d).native.is_none() {
        eprintln!(
            "SKIPPED native attention: {} has no native kernels",
            d.name()
        );
        let c = Case {
            dims: dims(1, 16, 1, 64),
            dtype: DType::BF16,
            causal: true,
            lens: None,
            fused: None,
            variant: Some(variants[0]),
            stored: None,
        };
        let err = run(d, &c, 1).unwrap_err();
        assert!(err.contains("does not fit"), "{err}");
        return;
    }
    let mut n = 0;
    for v in variants {
        for hd in [64usize, 128] {
            for (i, dtype) in [DType::BF16, DType::F16].into_iter().enumerate() {
                for causal in [true, false] {
                    // 2 × 36 × 2 = 144 items of the 192-row tile, more than 132 SMs.
                    let shapes = [dims(2, 77, 3, hd), dims(2, 300, 36, hd)];
                    for (j, &s) in shapes.iter().enumerate() {
                        let c = Case {
                            dims: s,
                            dtype,
                            causal,
                            lens: (i == j).then(|| {
                                let t = s.t as u32;
                                [vec![0, t + 7], vec![t - 13, 1]][j].clone()
                            }),
                            fused: (j == 1 && causal).then_some(0),
                            variant: Some(v),
                            stored: None,
                        };
                        match run(d, &c, 5 + n) {
                            Ok((errs, kernel)) => {
                                assert!(kernel.contains("_nv"), "{c:?} ran {kernel}");
                                println!(
                                    "native {} {dtype} d{hd} causal {causal} {:?}: out {:.2e} lse {:.2e}",
                                    v.tag(),
                                    (s.b, s.t, s.h),
                                    errs[0],
                                    errs[1]
                                );
                                check(d, &c, 5 + n);
                                n += 1;
                            }
                            Err(e) if e.contains("does not fit") => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            }
        }
    }
    assert!(n >= 40, "{n} native cases ran");
}

/// The native backward kernels, Dq and DkDv: each tile that has one, f16 and bf16, causal (read from the fused QKV) and not, key
/// padding, against the reference with every other kernel the default; and their packed
/// outputs equal to the dense ones. Skips where there are no native kernels.
#[test]
fn native_backward_matches_reference() {
    let d = device();
    if helios::matmul_caps(d).native.is_none() {
        eprintln!("SKIPPED native Dq: {} has no native kernels", d.name());
        return;
    }
    let variants = helios_kernels::attention::NATIVE_VARIANTS.into_iter();
    let mut n = 0;
    for (v, stage) in variants.flat_map(|v| [(v, AttnStage::Dq), (v, AttnStage::DkDv)]) {
        for hd in [64usize, 128] {
            for (i, dtype) in [DType::BF16, DType::F16].into_iter().enumerate() {
                for causal in [true, false] {
                    let s = [dims(2, 77, 3, hd), dims(2, 300, 24, hd)][i];
                    let c = Case {
                        dims: s,
                        dtype,
                        causal,
                        lens: (!causal).then(|| vec![0, s.t as u32 - 13]),
                        fused: causal.then_some(0),
                        variant: None,
                        stored: None,
                    };
                    if native_stage_case(d, &c, 7 + n, (stage, v)) {
                        n += 1;
                    }
                }
            }
        }
    }
    assert!(n >= 24, "{n} native backward cases ran");
    // The packed forms (into the slices of the fused gradient, as `attention_qkv` runs
    // them) equal the dense ones bit for bit.
    let v = helios_kernels::attention::NATIVE_VARIANTS[0];
    packed_native_matches_views(d, dims(2, 77, 3, 64), DType::BF16, v, 91);
    assert_clean(d);
}

/// Runs `c` with `stage`'s kernel forced to the native `variant`, prints the errors and holds
/// them to the cooperative kernels' tolerance; false where that tile has no kernel for `c`.
#[track_caller]
fn native_stage_case(
    d: &Device,
    c: &Case,
    seed: u64,
    (stage, variant): (AttnStage, AttnVariant),
) -> bool {
    let (errs, kernel) = match run_with(d, c, seed, Some((stage, variant))) {
        Ok(r) => r,
        Err(e) if e.contains("does not fit") => return false,
        Err(e) => panic!("{e}"),
    };
    let s = c.dims;
    println!(
        "native {stage:?} {} {} d{} causal {} {:?}: out {:.2e} lse {:.2e} dq {:.2e} dk {:.2e} dv {:.2e}",
        variant.tag(),
        c.dtype,
        s.d,
        c.causal,
        (s.b, s.t, s.h),
        errs[0],
        errs[1],
        errs[2],
        errs[3],
        errs[4]
    );
    if stage == AttnStage::Forward {
        assert!(kernel.contains("_nv"), "{c:?} ran {kernel}");
    }
    let tol = tolerance(c.dtype, true);
    assert!(
        errs.iter().all(|&e| e <= tol),
        "{c:?} with {stage:?} {}: {errs:?}",
        variant.tag()
    );
    true
}

/// With native Dq and DkDv (`variant`, forced), the causal gradient of a fused QKV tensor
/// packed into its slices (`attention_qkv`) equals the one through the `split_qkv` views
/// bit for bit.
#[track_caller]
fn packed_native_matches_views(
    d: &Device,
    s: AttnDims,
    dtype: DType,
    variant: AttnVariant,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let shape = [s.b, s.t, 3, s.h, s.d];
    let host = random(s.b * s.t * 3 * s.h * s.d, &mut rng, dtype);
    let r = random(s.b * s.t * s.h * s.d, &mut rng, dtype);
    let r = Tensor::from_slice_as(d, &r, &[s.b, s.t, s.h, s.d], dtype).unwrap();
    for stage in [AttnStage::Dq, AttnStage::DkDv] {
        let opts = AttentionOptions {
            stage_variant: Some((stage, variant)),
            ..AttentionOptions::causal()
        };
        let grad = |packed| fused_qkv_grad(d, (&host, shape, dtype), &r, &opts, packed).1;
        let (packed, views) = (grad(true), grad(false));
        let first = (0..packed.len()).find(|&i| packed[i] != views[i]);
        assert!(
            first.is_none(),
            "d{}: packed native {stage:?} differs at {first:?}",
            s.d
        );
    }
}

/// The native kernels at head dims between and past whole 64-channel panels (the copy
/// engine pads them with zeros; the stores skip the padding), each stage on each tile that
/// has one, f16 and bf16, causal from the fused QKV and not with key padding; the forward
/// also with more work items than SMs; the packed gradient. Skips where there are no native
/// kernels.
#[test]
fn native_head_dims_match_reference() {
    let d = device();
    if helios::matmul_caps(d).native.is_none() {
        eprintln!(
            "SKIPPED native head dims: {} has no native kernels",
            d.name()
        );
        return;
    }
    let stages = [AttnStage::Forward, AttnStage::Dq, AttnStage::DkDv];
    let mut n = 0;
    for (i, hd) in [32usize, 48, 80, 96, 144, 192, 256].into_iter().enumerate() {
        for stage in stages {
            for v in helios_kernels::attention::NATIVE_VARIANTS {
                for causal in [true, false] {
                    let dtype = [DType::BF16, DType::F16][(i + n) % 2];
                    let long = stage == AttnStage::Forward && causal && i % 2 == 0;
                    let s = if long {
                        dims(2, 300, 36, hd)
                    } else {
                        dims(2, 77, 3, hd)
                    };
                    let c = Case {
                        dims: s,
                        dtype,
                        causal,
                        lens: (!causal).then(|| vec![s.t as u32 - 13, s.t as u32 + 5]),
                        fused: causal.then_some(0),
                        variant: None,
                        stored: None,
                    };
                    if native_stage_case(d, &c, 13 + n as u64, (stage, v)) {
                        n += 1;
                    }
                }
            }
        }
    }
    // At least one tile of every stage at every head dim, causal and not.
    assert!(n >= 2 * 7 * 3, "{n} native cases ran");
    // The packed gradient (`attention_qkv`) equals the views' bit for bit where the stores
    // skip padded channels (80) and where Dq's items split D (256).
    let variants = helios_kernels::attention::NATIVE_VARIANTS;
    for (hd, v) in [(80, variants[2]), (256, variants[4])] {
        packed_native_matches_views(d, dims(2, 45, 2, hd), DType::F16, v, hd as u64);
    }
    assert_clean(d);
}

/// A key length of 0 gives O = 0, L = −inf and zero gradients; lengths past T are T. In
/// every dtype (16-bit ones run the cooperative kernels where the device has them: a
/// subgroup with no key block stores its rows after the loop), causal and not.
#[test]
fn empty_and_long_key_lengths() {
    let d = device();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for causal in [false, true] {
            let c = Case {
                dims: dims(3, 9, 1, 32),
                dtype,
                causal,
                lens: Some(vec![0, 4, 100]),
                fused: None,
                variant: None,
                stored: None,
            };
            check(d, &c, 3);
        }
    }
}

/// Two backward passes give bit-identical gradients.
#[test]
fn backward_is_deterministic() {
    let d = device();
    let s = [2, 45, 2, 64];
    let n: usize = s.iter().product();
    let mut rng = StdRng::seed_from_u64(9);
    let up = |x: Vec<f32>| Tensor::from_slice_as(d, &x, &s, DType::F16).unwrap();
    let q = up(random(n, &mut rng, DType::F16));
    let k = up(random(n, &mut rng, DType::F16));
    let v = up(random(n, &mut rng, DType::F16));
    let dout = up(random(n, &mut rng, DType::F16));
    let opts = AttentionOptions::causal();
    let fwd = q.attention(&k, &v, &opts).unwrap();
    let a = q.attention_backward(&k, &v, &fwd, &dout, &opts).unwrap();
    let b = q.attention_backward(&k, &v, &fwd, &dout, &opts).unwrap();
    for (x, y) in [(&a.dq, &b.dq), (&a.dk, &b.dk), (&a.dv, &b.dv)] {
        let (x, y) = (x.to_vec().unwrap(), y.to_vec().unwrap());
        assert!(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()));
    }
    assert_clean(d);
}

/// Bad shapes, dtypes and options are errors, not panics.
#[test]
fn bad_inputs_are_errors() {
    let d = device();
    let t = |shape: &[usize], dtype: DType| {
        let n: usize = shape.iter().product();
        Tensor::from_slice_as(d, &vec![0.5; n], shape, dtype).unwrap()
    };
    let opts = AttentionOptions::causal();
    let q = t(&[1, 8, 2, 32], DType::F32);
    let msg = |r: Result<helios::AttentionOutput, helios::Error>| match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    // Head dim not a multiple of 16.
    let q24 = t(&[1, 8, 2, 24], DType::F32);
    assert!(msg(q24.attention(&q24, &q24, &opts)).contains("head dim 24"));
    // Shapes differ.
    let k = t(&[1, 9, 2, 32], DType::F32);
    assert!(msg(q.attention(&k, &q, &opts)).contains("equal"));
    // Dtypes differ.
    let kh = t(&[1, 8, 2, 32], DType::F16);
    assert!(msg(q.attention(&kh, &q, &opts)).contains("dtypes"));
    // Three dimensions.
    let q3 = t(&[8, 2, 32], DType::F32);
    assert!(msg(q3.attention(&q3, &q3, &opts)).contains("[B, T, H, D]"));
    // Q, K, V of a head dimension that is not dense are copied first; dO must be dense there.
    let qt = t(&[1, 8, 32, 2], DType::F32).transpose(2, 3).unwrap();
    let f = qt.attention(&qt, &qt, &opts).unwrap();
    assert!(q.attention_backward(&q, &q, &f, &qt, &opts).is_err());
    // Key lengths of the wrong shape.
    let bad = AttentionOptions {
        key_lengths: Some(IndexTensor::from_slice(d, &[1, 2], &[2]).unwrap()),
        ..AttentionOptions::causal()
    };
    assert!(msg(q.attention(&q, &q, &bad)).contains("key_lengths"));
    // split_qkv of a non-fused tensor.
    assert!(q.split_qkv().is_err());
    // A forced variant that cannot run (cooperative on f32).
    let forced = AttentionOptions {
        variant: Some(AttnVariant::Coop { bq: 64, bk: 64 }),
        ..AttentionOptions::causal()
    };
    assert!(msg(q.attention(&q, &q, &forced)).contains("does not fit"));
    // Backward with an lse of the wrong shape.
    let fwd = q.attention(&q, &q, &opts).unwrap();
    let wrong = helios::AttentionOutput {
        out: fwd.out.clone(),
        lse: t(&[1, 8, 2], DType::F32),
    };
    assert!(q.attention_backward(&q, &q, &wrong, &q, &opts).is_err());
    assert_clean(d);
}

/// The tuner times the candidates of every stage, stores a winner per class, and later calls
/// run the winners (which still match the reference).
#[test]
fn tuning_stores_winners_that_are_used() {
    let d = device();
    let s = [1, 33, 2, 32];
    let n: usize = s.iter().product();
    let mut rng = StdRng::seed_from_u64(21);
    let up = |x: Vec<f32>| Tensor::from_slice_as(d, &x, &s, DType::F32).unwrap();
    let q = up(random(n, &mut rng, DType::F32));
    let k = up(random(n, &mut rng, DType::F32));
    let v = up(random(n, &mut rng, DType::F32));
    let dout = up(random(n, &mut rng, DType::F32));
    let opts = AttentionOptions {
        key_lengths: Some(IndexTensor::from_slice(d, &[29], &[1]).unwrap()),
        ..Default::default()
    };
    q.attention_tune(&k, &v, &dout, &opts).unwrap();
    let table = helios::attention_tuning(d);
    for stage in ["Forward", "DkDv", "Dq"] {
        // 1·33·2 = 66 query rows: the class of up to 2^7.
        let class = format!("f32 d32 {stage} causal0 pad1 rows2^7");
        let (_, variant, us) = table
            .iter()
            .find(|(c, _, _)| *c == class)
            .unwrap_or_else(|| panic!("no winner for {class}: {table:?}"));
        assert!(*us > 0.0);
        let st = match stage {
            "Forward" => AttnStage::Forward,
            "DkDv" => AttnStage::DkDv,
            _ => AttnStage::Dq,
        };
        assert!(q
            .attention_kernel(st, &opts)
            .unwrap()
            .ends_with(variant.as_str()));
    }
    let c = Case {
        dims: dims(1, 33, 2, 32),
        dtype: DType::F32,
        causal: false,
        lens: Some(vec![29]),
        fused: None,
        variant: None,
        stored: None,
    };
    check(d, &c, 21);
}
