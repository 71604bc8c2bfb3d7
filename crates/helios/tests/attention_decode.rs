//! Decoding attention (`Tensor::attention_decode`, `Tensor::write_kv`) on the Vulkan device
//! present against the f64 CPU reference (`helios::cpu::attention::attention_decode`):
//! every dtype, head dims 16 to 256 (two no multiple of 4), cache lengths from 1 key to
//! many chunks of keys, queries read in place from a fused QKV, caches whose rows start off
//! a multiple of 4 elements; rows past `len` hold NaN, so a kernel reading them fails. Then
//! the in-place write, the kernels bound through descriptors, a token-by-token decode that
//! must compile nothing after its first tokens, and the errors. Every test fails on any validation message.
//!
//! Error measure: max |got − want| / max |want|. Bounds: f32 1e-4; f16 2e-3 and bf16 1e-2
//! (inputs are exact in the storage type and the math is f32, so beyond f32 rounding only
//! the output's rounding to the storage type counts: 2^-11 and 2^-8 relative).

mod common;

use common::{assert_clean, device};
use helios::cpu::attention::{self as reference, AttnDims};
use helios::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Uniform in [-1, 1), never zero, exact in `dtype`.
fn random(n: usize, rng: &mut StdRng, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| match dtype.round(rng.gen_range(-1.0f32..1.0)) {
            0.0 => 0.5,
            x => x,
        })
        .collect()
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
    }
}

/// One case: B, H, D, the cache's capacity and length, how q and the caches are laid out.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    h: usize,
    d: usize,
    cap: usize,
    len: usize,
    dtype: DType,
    /// q as the first slice of a fused [B, 1, 3, H, D] tensor (else dense [B, H, D]).
    fused_q: bool,
    /// The caches start this many elements into their buffers (1: no row is 4-aligned).
    cache_offset: usize,
    scale: Option<f32>,
}

/// The relative error of one case.
fn run(dev: &Device, c: &Case, seed: u64) -> f64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let (hd, n) = (c.h * c.d, c.b * c.cap * c.h * c.d);
    let q = random(c.b * hd, &mut rng, c.dtype);
    let mut k = random(n, &mut rng, c.dtype);
    let mut v = random(n, &mut rng, c.dtype);
    // Rows at and past len are never read: NaN there shows up in O if they are.
    for b in 0..c.b {
        for t in c.len..c.cap {
            let at = (b * c.cap + t) * hd;
            k[at..at + hd].fill(f32::NAN);
            v[at..at + hd].fill(f32::NAN);
        }
    }
    let scale = c.scale.unwrap_or(1.0 / (c.d as f32).sqrt());
    let dims = AttnDims {
        b: c.b,
        t: c.cap,
        h: c.h,
        d: c.d,
    };
    let want = reference::attention_decode(&q, &k, &v, dims, c.len, scale);
    let cache = |x: &[f32]| {
        let mut data = vec![7.0f32; c.cache_offset];
        data.extend_from_slice(x);
        Tensor::from_slice_as(dev, &data, &[c.cache_offset + n], c.dtype)
            .and_then(|t| t.narrow(0, c.cache_offset, n))
            .and_then(|t| t.reshape(&[c.b, c.cap, c.h, c.d]))
            .unwrap()
    };
    let (kc, vc) = (cache(&k), cache(&v));
    let qt = if c.fused_q {
        // [B, 1, 3, H, D]: q, then two slices of other values.
        let mut fused = random(c.b * 3 * hd, &mut rng, c.dtype);
        for b in 0..c.b {
            fused[b * 3 * hd..][..hd].copy_from_slice(&q[b * hd..][..hd]);
        }
        let f = Tensor::from_slice_as(dev, &fused, &[c.b, 1, 3, c.h, c.d], c.dtype).unwrap();
        f.narrow(2, 0, 1).unwrap()
    } else {
        Tensor::from_slice_as(dev, &q, &[c.b, c.h, c.d], c.dtype).unwrap()
    };
    let out = qt.attention_decode(&kc, &vc, c.len, c.scale).unwrap();
    let want_shape = match c.fused_q {
        true => vec![c.b, 1, c.h, c.d],
        false => vec![c.b, c.h, c.d],
    };
    assert_eq!(out.shape(), want_shape.as_slice(), "{c:?}");
    reference::relative_error(&out.to_vec().unwrap(), &want)
}

#[track_caller]
fn check(dev: &Device, c: &Case, seed: u64) -> f64 {
    let err = run(dev, c, seed);
    let tol = tolerance(c.dtype);
    assert!(err <= tol, "{c:?}: relative error {err:.3e} > {tol:.0e}");
    assert_clean(dev);
    err
}

/// Every dtype × head dim (16, 36, 64, 80, 128, 250, 256) × length (1, 2, 17, 100, 300,
/// 1000: one chunk to 16 chunks at B·H = 6), q fused or dense, caches aligned or not, the
/// default scale and a sharper one; the worst error per dtype printed.
#[test]
fn decode_matches_the_reference_for_every_dtype_head_dim_and_length() {
    let dev = device();
    let mut seed = 0;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut worst = 0.0f64;
        for (i, d) in [16, 36, 64, 80, 128, 250, 256].into_iter().enumerate() {
            for (j, len) in [1, 2, 17, 100, 300, 1000].into_iter().enumerate() {
                let c = Case {
                    b: 2,
                    h: 3,
                    d,
                    cap: len + 3,
                    len,
                    dtype,
                    fused_q: (i + j) % 2 == 0,
                    cache_offset: (i + j) % 3 % 2,
                    scale: (j % 2 == 1).then_some(4.0 / (d as f32).sqrt()),
                };
                seed += 1;
                worst = worst.max(check(dev, &c, seed));
            }
        }
        println!("attention_decode {dtype}: worst relative error {worst:.2e}");
    }
}

/// Caches long enough that each workgroup takes several keys per invocation (20 000 keys:
/// chunks of 320 at B·H = 2) and the longest chunks (70 000: 512 keys, 137 chunks).
#[test]
fn long_caches_spread_over_many_chunks() {
    let dev = device();
    for (i, (len, dtype)) in [(20_000, DType::F32), (70_000, DType::BF16)]
        .into_iter()
        .enumerate()
    {
        let c = Case {
            b: 1,
            h: 2,
            d: 64,
            cap: len,
            len,
            dtype,
            fused_q: i == 0,
            cache_offset: i,
            scale: Some(0.5),
        };
        check(dev, &c, 100 + i as u64);
    }
}

/// The same kernels bound through descriptors instead of device addresses: one chunk and
/// several, aligned caches and not, D a multiple of 4 and not; then a write and a read.
#[test]
fn descriptor_binding_gives_the_same_results() {
    let ctx = helios_vk::Context::from_env().expect("a Vulkan device");
    if !ctx.enabled().push_descriptor {
        eprintln!("skipped: the device lacks VK_KHR_push_descriptor");
        return;
    }
    let dev = &Device::with_binding(ctx, helios_spirv::Binding::Descriptor);
    for (i, (d, len, dtype)) in [
        (64, 17, DType::F32),
        (36, 300, DType::F16),
        (128, 1000, DType::BF16),
    ]
    .into_iter()
    .enumerate()
    {
        let c = Case {
            b: 2,
            h: 3,
            d,
            cap: len + 1,
            len,
            dtype,
            fused_q: i != 1,
            cache_offset: i % 2,
            scale: None,
        };
        check(dev, &c, 200 + i as u64);
    }
    let f = |x: f32| Tensor::full(dev, &[1, 4, 2, 8], x, DType::F32).unwrap();
    let (kc, vc) = (f(0.5), f(0.5));
    let new = Tensor::full(dev, &[1, 1, 2, 8], 2.0, DType::F32).unwrap();
    Tensor::write_kv(&kc, &vc, 1, &new, &new).unwrap();
    let q = Tensor::full(dev, &[1, 2, 8], 1.0, DType::F32).unwrap();
    // Scores 4·scale·(0.5 or 2) over keys 0 and 1: O = weighted mean of 0.5 and 2.
    let o = q
        .attention_decode(&kc, &vc, 2, Some(0.25))
        .unwrap()
        .to_vec()
        .unwrap();
    let (w0, w1) = (1.0f64.exp(), 4.0f64.exp());
    let want = (0.5 * w0 + 2.0 * w1) / (w0 + w1);
    assert!(
        o.iter().all(|&x| (x as f64 - want).abs() < 1e-6),
        "{o:?} vs {want}"
    );
    assert_clean(dev);
}

/// `write_kv` writes rows pos..pos + n of both caches from slices of a fused
/// [B, n, 3, H, D] tensor and leaves every other row as it was (bit for bit, every dtype).
#[test]
fn write_kv_writes_only_its_rows() {
    let dev = device();
    let mut rng = StdRng::seed_from_u64(7);
    let (b, cap, h, d) = (2, 9, 3, 20);
    let hd = h * d;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (pos, n) in [(0, 1), (4, 3), (8, 1)] {
            let old_k = random(b * cap * hd, &mut rng, dtype);
            let old_v = random(b * cap * hd, &mut rng, dtype);
            let shape = [b, cap, h, d];
            let kc = Tensor::from_slice_as(dev, &old_k, &shape, dtype).unwrap();
            let vc = Tensor::from_slice_as(dev, &old_v, &shape, dtype).unwrap();
            let fused = random(b * n * 3 * hd, &mut rng, dtype);
            let qkv = Tensor::from_slice_as(dev, &fused, &[b, n, 3, h, d], dtype).unwrap();
            let [_, k, v] = qkv.split_qkv().unwrap();
            Tensor::write_kv(&kc, &vc, pos, &k, &v).unwrap();
            for (x, (cache, old)) in [(&kc, &old_k), (&vc, &old_v)].into_iter().enumerate() {
                let mut want = old.clone();
                for bi in 0..b {
                    for t in 0..n {
                        let from = ((bi * n + t) * 3 + 1 + x) * hd;
                        let to = (bi * cap + pos + t) * hd;
                        want[to..to + hd].copy_from_slice(&fused[from..from + hd]);
                    }
                }
                let got = cache.to_vec().unwrap();
                assert!(got == want, "{dtype} pos {pos} n {n} cache {x}");
            }
        }
    }
    assert_clean(dev);
}

/// Decoding token by token as a model does (the new position's k and v written in place,
/// then its query attends over the cache) matches the reference at every length, and after
/// the first two tokens compiles no kernel, although the cache crosses from one chunk of
/// keys to three. Its own device, so that no other test's kernels are counted.
#[test]
fn decoding_compiles_nothing_after_the_first_tokens() {
    let dev = Device::from_env().expect("a Vulkan device");
    let (h, d, cap) = (2, 64, 150);
    let hd = h * d;
    let mut rng = StdRng::seed_from_u64(11);
    let (mut ks, mut vs) = (vec![0.0f32; cap * hd], vec![0.0f32; cap * hd]);
    let shape = [1, cap, h, d];
    let kc = Tensor::zeros(&dev, &shape, DType::F32).unwrap();
    let vc = Tensor::zeros(&dev, &shape, DType::F32).unwrap();
    let before = dev.compiled_kernels();
    let mut after_two = 0;
    for pos in 0..cap {
        let fused = random(3 * hd, &mut rng, DType::F32);
        let qkv = Tensor::from_slice(&dev, &fused, &[1, 1, 3, h, d]).unwrap();
        let [q, k, v] = qkv.split_qkv().unwrap();
        Tensor::write_kv(&kc, &vc, pos, &k, &v).unwrap();
        let out = q.attention_decode(&kc, &vc, pos + 1, None).unwrap();
        ks[pos * hd..][..hd].copy_from_slice(&fused[hd..2 * hd]);
        vs[pos * hd..][..hd].copy_from_slice(&fused[2 * hd..]);
        let dims = AttnDims { b: 1, t: cap, h, d };
        let scale = 1.0 / (d as f32).sqrt();
        let want = reference::attention_decode(&fused[..hd], &ks, &vs, dims, pos + 1, scale);
        let err = reference::relative_error(&out.to_vec().unwrap(), &want);
        assert!(err <= 1e-4, "len {}: relative error {err:.3e}", pos + 1);
        if pos == 1 {
            after_two = dev.compiled_kernels();
            assert!(after_two > before, "the first tokens compiled nothing?");
        }
    }
    assert_eq!(
        dev.compiled_kernels(),
        after_two,
        "tokens 3 to {cap} compiled kernels"
    );
    assert_clean(&dev);
}

/// Bad calls are errors that say what to do, never panics.
#[test]
fn bad_calls_are_errors() {
    let dev = device();
    let f = |shape: &[usize]| Tensor::zeros(dev, shape, DType::F32).unwrap();
    let (kc, vc) = (f(&[1, 8, 2, 16]), f(&[1, 8, 2, 16]));
    let q = f(&[1, 2, 16]);
    let message = |r: helios::Result<Tensor>| match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    let m = message(q.attention_decode(&kc, &vc, 0, None));
    assert!(m.contains("len 0 is outside 1..=8"), "{m}");
    let m = message(q.attention_decode(&kc, &vc, 9, None));
    assert!(m.contains("write_kv"), "{m}");
    let m = message(f(&[1, 2, 2, 16]).attention_decode(&kc, &vc, 1, None));
    assert!(m.contains("one query per head"), "{m}");
    let m = message(f(&[1, 2, 32]).attention_decode(&kc, &vc, 1, None));
    assert!(m.contains("must agree"), "{m}");
    let m = message(q.attention_decode(&kc, &f(&[1, 9, 2, 16]), 1, None));
    assert!(m.contains("one shape and layout"), "{m}");
    let big = |t| f(&[1, t, 2, 300]);
    let m = message(f(&[1, 2, 300]).attention_decode(&big(4), &big(4), 1, None));
    assert!(m.contains("head dim 300"), "{m}");
    let m = message(q.requires_grad_().attention_decode(&kc, &vc, 1, None));
    assert!(m.contains("no_grad"), "{m}");
    let half = Tensor::zeros(dev, &[1, 2, 16], DType::F16).unwrap();
    assert!(half.attention_decode(&kc, &vc, 1, None).is_err());

    let new = f(&[1, 1, 2, 16]);
    let written = |r: helios::Result<()>| r.err().map(|e| e.to_string()).expect("accepted");
    let m = written(Tensor::write_kv(&kc, &vc, 8, &new, &new));
    assert!(m.contains("rows 8..9 do not fit"), "{m}");
    let m = written(Tensor::write_kv(&kc, &kc, 0, &new, &new));
    assert!(m.contains("two tensors"), "{m}");
    let row = kc.narrow(1, 3, 1).unwrap();
    let m = written(Tensor::write_kv(&kc, &vc, 0, &row, &new));
    assert!(m.contains("views a cache"), "{m}");
    let wide = f(&[1, 8, 1, 16]).expand(&[1, 8, 2, 16]).unwrap();
    let wide_v = f(&[1, 8, 1, 16]).expand(&[1, 8, 2, 16]).unwrap();
    let m = written(Tensor::write_kv(&wide, &wide_v, 0, &new, &new));
    assert!(m.contains("share storage"), "{m}");
    let m = written(Tensor::write_kv(
        &kc,
        &vc,
        0,
        &f(&[1, 1, 2, 8]),
        &f(&[1, 1, 2, 8]),
    ));
    assert!(m.contains("caches' B, H and D"), "{m}");
    assert_clean(dev);
}
