//! AdamW on the Vulkan device present (lavapipe in CI) against the f64 CPU reference: many
//! tensors of odd sizes in one step (vec4 body and scalar tail), gradients in every dtype,
//! f16/bf16 copies, per-tensor weight decay, several steps, NaN propagation, no barriers
//! between the tensors of a step, and errors for bad arguments. Run with
//! `HELIOS_VALIDATION=1`; every test fails on any validation message.
//!
//! Tolerances: each step is compared with the reference applied to the device's previous
//! state. m and v: 4 f32 ulps (2^-21) of the magnitudes of their terms (β1·m and (1−β1)·g
//! may cancel). The parameter: 2^-21 of |p| + |update| plus 1e-5 of the update (its own
//! relative error: division, square root, a few roundings).
//! The copy must equal the device's new parameter rounded to the copy's dtype, bit for bit.

use helios::{
    adamw_step, adamw_step_scaled, cpu, AdamWConfig, AdamWParam, DType, Device, Error, Tensor,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{assert_clean, device};

/// Values in ±[lo, hi) (never zero), rounded to `dtype`.
fn random(rng: &mut StdRng, n: usize, lo: f32, hi: f32, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = rng.gen_range(lo..hi);
            dtype.round(if rng.gen_bool(0.5) { v } else { -v })
        })
        .collect()
}

/// One parameter tensor's host state and its device tensors.
struct Slot {
    p: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    param: Tensor,
    mt: Tensor,
    vt: Tensor,
    copy: Option<Tensor>,
    wd: f32,
}

impl Slot {
    fn new(d: &Device, rng: &mut StdRng, n: usize, copy: Option<DType>, wd: f32) -> Slot {
        let p = random(rng, n, 0.1, 1.0, DType::F32);
        let zeros = vec![0.0; n];
        Slot {
            param: Tensor::from_slice(d, &p, &[n]).unwrap(),
            mt: Tensor::from_slice(d, &zeros, &[n]).unwrap(),
            vt: Tensor::from_slice(d, &zeros, &[n]).unwrap(),
            copy: copy.map(|c| Tensor::from_slice_as(d, &zeros, &[n], c).unwrap()),
            p,
            m: zeros.clone(),
            v: zeros,
            wd,
        }
    }
}

#[track_caller]
fn close(what: &str, got: &[f32], want: &[f32], allowed: impl Fn(usize) -> f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= allowed(i);
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

#[test]
fn many_tensors_several_steps_match_reference() {
    let d = device();
    let mut rng = StdRng::seed_from_u64(31);
    let config = AdamWConfig {
        lr: 3e-3,
        ..AdamWConfig::default()
    };
    let sizes = [1usize, 3, 4, 5, 64, 1023, 4099, 70_001];
    let copies = [None, Some(DType::F16), Some(DType::BF16)];
    let mut slots: Vec<Slot> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let wd = if i % 2 == 0 { 0.1 } else { 0.0 };
            Slot::new(d, &mut rng, n, copies[i % 3], wd)
        })
        .collect();
    for step in 1..=3u32 {
        let gdt: Vec<DType> = (0..sizes.len())
            .map(|i| DType::ALL[(i + step as usize) % 3])
            .collect();
        let grads_host: Vec<Vec<f32>> = slots
            .iter()
            .zip(&gdt)
            .map(|(s, &dt)| random(&mut rng, s.p.len(), 1e-3, 1.0, dt))
            .collect();
        let grads: Vec<Tensor> = grads_host
            .iter()
            .zip(&gdt)
            .map(|(g, &dt)| Tensor::from_slice_as(d, g, &[g.len()], dt).unwrap())
            .collect();
        let params: Vec<AdamWParam> = slots
            .iter()
            .zip(&grads)
            .map(|(s, g)| AdamWParam {
                param: &s.param,
                grad: g,
                m: &s.mt,
                v: &s.vt,
                copy: s.copy.as_ref(),
                weight_decay: s.wd,
            })
            .collect();
        // Steps 2 and 3 scale the gradients inside the update by a device scalar (a pending
        // lazy value, as a clipping coefficient is).
        let scale = (step >= 2).then_some(0.37f32);
        match scale {
            None => adamw_step(&params, &config, step).unwrap(),
            Some(c) => {
                let c = Tensor::from_slice(d, &[2.0 * c], &[1])
                    .unwrap()
                    .mul_scalar(0.5)
                    .unwrap();
                adamw_step_scaled(&params, &config, step, Some(&c)).unwrap();
            }
        }
        for (s, g) in slots.iter_mut().zip(&grads_host) {
            let (p0, m0) = (s.p.clone(), s.m.clone());
            let g: Vec<f32> = g.iter().map(|&x| x * scale.unwrap_or(1.0)).collect();
            cpu::adamw(&mut s.p, &g, &mut s.m, &mut s.v, &config, s.wd, step);
            let what = format!("step {step}, {} elements", s.p.len());
            let (gp, gm, gv) = (
                s.param.to_vec().unwrap(),
                s.mt.to_vec().unwrap(),
                s.vt.to_vec().unwrap(),
            );
            // Bounds relative to the magnitudes of the terms (m and p may cancel).
            let ulp4 = 1.0 / (1 << 21) as f32;
            let b1 = config.beta1;
            close(&format!("{what} m"), &gm, &s.m, |i| {
                ulp4 * (b1 * m0[i].abs() + (1.0 - b1) * g[i].abs())
            });
            close(&format!("{what} v"), &gv, &s.v, |i| ulp4 * s.v[i].abs());
            close(&format!("{what} param"), &gp, &s.p, |i| {
                let update = (s.p[i] - p0[i] * (1.0 - config.lr * s.wd)).abs();
                ulp4 * (p0[i].abs() + update) + 1e-5 * update
            });
            if let Some(c) = &s.copy {
                let want: Vec<u32> = gp.iter().map(|&x| c.dtype().round(x).to_bits()).collect();
                let got: Vec<u32> = c.to_vec().unwrap().iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{what} copy {}", c.dtype());
            }
            // Continue from the device's state so errors do not compound.
            (s.p, s.m, s.v) = (gp, gm, gv);
        }
    }
    assert_clean(d);
}

#[test]
fn nan_gradient_propagates() {
    let d = device();
    let n = 11;
    let p = Tensor::from_slice(d, &vec![0.5; n], &[n]).unwrap();
    let m = Tensor::from_slice(d, &vec![0.0; n], &[n]).unwrap();
    let v = Tensor::from_slice(d, &vec![0.0; n], &[n]).unwrap();
    let mut g = vec![0.25f32; n];
    g[2] = f32::NAN; // in the vec4 body
    g[9] = f32::NAN; // in the scalar tail
    let g = Tensor::from_slice(d, &g, &[n]).unwrap();
    let param = AdamWParam {
        param: &p,
        grad: &g,
        m: &m,
        v: &v,
        copy: None,
        weight_decay: 0.01,
    };
    adamw_step(&[param], &AdamWConfig::default(), 1).unwrap();
    for t in [&p, &m, &v] {
        let x = t.to_vec().unwrap();
        for (i, e) in x.iter().enumerate() {
            assert_eq!(e.is_nan(), i == 2 || i == 9, "element {i}: {e}");
        }
    }
    assert_clean(d);
}

/// A scale that is NaN or infinite (a gradient overflowed under loss scaling) writes
/// nothing: parameter, moments and copy keep their bits, in the vec4 body and the tail.
#[test]
fn non_finite_scale_writes_nothing() {
    let d = device();
    let n = 11;
    let p0: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 * 0.01).collect();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let p = Tensor::from_slice(d, &p0, &[n]).unwrap();
        let m = Tensor::from_slice(d, &vec![0.125; n], &[n]).unwrap();
        let v = Tensor::from_slice(d, &vec![0.25; n], &[n]).unwrap();
        let copy = Tensor::from_slice_as(d, &vec![3.0; n], &[n], DType::BF16).unwrap();
        let g = Tensor::from_slice(d, &vec![0.25f32; n], &[n]).unwrap();
        let param = AdamWParam {
            param: &p,
            grad: &g,
            m: &m,
            v: &v,
            copy: Some(&copy),
            weight_decay: 0.01,
        };
        let scale = Tensor::from_slice(d, &[bad], &[1]).unwrap();
        adamw_step_scaled(&[param], &AdamWConfig::default(), 1, Some(&scale)).unwrap();
        assert_eq!(p.to_vec().unwrap(), p0, "scale {bad}");
        assert_eq!(m.to_vec().unwrap(), vec![0.125; n], "scale {bad}");
        assert_eq!(v.to_vec().unwrap(), vec![0.25; n], "scale {bad}");
        assert_eq!(copy.to_vec().unwrap(), vec![3.0; n], "scale {bad}");
    }
    assert_clean(d);
}

/// The tensors of one step are independent: one dispatch each, no barrier between them.
#[test]
fn one_dispatch_per_tensor_without_barriers() {
    let d = Device::new(helios_vk::Context::from_env().unwrap());
    d.set_early_submit(false);
    let mut rng = StdRng::seed_from_u64(33);
    let slots: Vec<Slot> = (0..12)
        .map(|i| Slot::new(&d, &mut rng, 100 + i, None, 0.1))
        .collect();
    let grads: Vec<Tensor> = slots
        .iter()
        .map(|s| {
            let g = random(&mut rng, s.p.len(), 0.1, 1.0, DType::F32);
            Tensor::from_slice(&d, &g, &[g.len()]).unwrap()
        })
        .collect();
    let params: Vec<AdamWParam> = slots
        .iter()
        .zip(&grads)
        .map(|(s, g)| AdamWParam {
            param: &s.param,
            grad: g,
            m: &s.mt,
            v: &s.vt,
            copy: None,
            weight_decay: s.wd,
        })
        .collect();
    d.synchronize().unwrap();
    let before = d.encoder_stats();
    adamw_step(&params, &AdamWConfig::default(), 1).unwrap();
    d.synchronize().unwrap();
    let after = d.encoder_stats();
    assert_eq!(after.dispatches - before.dispatches, 12);
    assert_eq!(after.barriers - before.barriers, 0);
    assert_clean(&d);
}

#[test]
fn bad_arguments_are_errors() {
    let d = device();
    let t = |n: usize| Tensor::from_slice(d, &vec![0.0; n], &[n]).unwrap();
    let (p, g, m, v) = (t(8), t(8), t(8), t(8));
    let ok = AdamWParam {
        param: &p,
        grad: &g,
        m: &m,
        v: &v,
        copy: None,
        weight_decay: 0.0,
    };
    let c = AdamWConfig::default();
    let invalid = |r: helios::Result<()>, needle: &str| match r {
        Err(Error::Invalid { detail, .. }) if detail.contains(needle) => {}
        other => panic!("expected an error mentioning {needle:?}, got {other:?}"),
    };
    invalid(adamw_step(&[ok], &c, 0), "from 1");
    let short = t(7);
    invalid(
        adamw_step(&[AdamWParam { m: &short, ..ok }], &c, 1),
        "one shape",
    );
    let half = Tensor::from_slice_as(d, &[0.0; 8], &[8], DType::F16).unwrap();
    invalid(adamw_step(&[AdamWParam { v: &half, ..ok }], &c, 1), "f32");
    invalid(adamw_step(&[AdamWParam { m: &p, ..ok }], &c, 1), "twice");
    invalid(adamw_step(&[ok, ok], &c, 1), "twice");
    let wide = Tensor::from_slice(d, &[0.0; 16], &[2, 8]).unwrap();
    let view = wide.narrow(0, 1, 1).unwrap().reshape(&[8]).unwrap();
    invalid(
        adamw_step(&[AdamWParam { param: &view, ..ok }], &c, 1),
        "view",
    );
    // Nothing was recorded by the failed calls: the state is untouched.
    assert_eq!(p.to_vec().unwrap(), vec![0.0; 8]);
    adamw_step(&[], &c, 1).unwrap();
    assert_clean(d);
}

/// A strided gradient (a transposed view) is read in its logical order.
#[test]
fn strided_gradient() {
    let d = device();
    let mut rng = StdRng::seed_from_u64(34);
    let (r, c) = (3, 5);
    let mut p = random(&mut rng, r * c, 0.1, 1.0, DType::F32);
    let gt = random(&mut rng, r * c, 0.1, 1.0, DType::F32); // (c, r) row-major
    let param = Tensor::from_slice(d, &p, &[r, c]).unwrap();
    let zeros = vec![0.0; r * c];
    let m = Tensor::from_slice(d, &zeros, &[r, c]).unwrap();
    let v = Tensor::from_slice(d, &zeros, &[r, c]).unwrap();
    let g = Tensor::from_slice(d, &gt, &[c, r])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let one = AdamWParam {
        param: &param,
        grad: &g,
        m: &m,
        v: &v,
        copy: None,
        weight_decay: 0.0,
    };
    let config = AdamWConfig::default();
    adamw_step(&[one], &config, 1).unwrap();
    let logical: Vec<f32> = (0..r * c).map(|e| gt[(e % c) * r + e / c]).collect();
    let (mut mh, mut vh) = (zeros.clone(), zeros);
    cpu::adamw(&mut p, &logical, &mut mh, &mut vh, &config, 0.0, 1);
    close("param", &param.to_vec().unwrap(), &p, |i| 1e-6 * p[i].abs());
    assert_clean(d);
}

/// `sum_squares` (global-norm clipping) against the f64 sum: tensors of every dtype, larger
/// than a table chunk, lengths that are not multiples of four, an offset view, a strided
/// view and an empty tensor, with device addresses (one dispatch per dtype through a table
/// of addresses) and with descriptors (one reduction per tensor). Tolerance: 1e-5 of the
/// sum (f32 accumulation of positive terms over ~10^5 elements).
#[test]
fn sum_squares_matches_the_f64_sum() {
    let d = device();
    let mut rng = StdRng::seed_from_u64(23);
    let mut want = 0.0f64;
    let mut tensors = Vec::new();
    for (i, &n) in [40_000usize, 3, 777, 16_384, 1].iter().enumerate() {
        let dtype = DType::ALL[i % 3];
        let x = random(&mut rng, n, 0.1, 2.0, dtype);
        want += x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
        tensors.push(Tensor::from_slice_as(d, &x, &[n], dtype).unwrap());
    }
    // Elements 3.. of a bf16 tensor (an offset that is not a multiple of four) and a
    // transposed f32 view.
    let base = random(&mut rng, 1003, 0.1, 2.0, DType::BF16);
    want += base[3..]
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>();
    let b = Tensor::from_slice_as(d, &base, &[1003], DType::BF16).unwrap();
    tensors.push(b.narrow(0, 3, 1000).unwrap());
    let m = random(&mut rng, 6 * 5, 0.1, 2.0, DType::F32);
    want += m.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
    let mt = Tensor::from_slice(d, &m, &[6, 5]).unwrap();
    tensors.push(mt.transpose(0, 1).unwrap());
    tensors.push(Tensor::from_slice(d, &[], &[0]).unwrap());
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let check = |d: &Device, got: Tensor| {
        assert_eq!(got.shape(), [1]);
        let got = f64::from(got.to_vec().unwrap()[0]);
        assert!(
            (got - want).abs() <= 1e-5 * want,
            "{}: {got} against {want}",
            d.name()
        );
    };
    check(d, helios::sum_squares(&refs).unwrap());
    assert_clean(d);

    let ctx = helios_vk::Context::from_env().unwrap();
    if !ctx.enabled().push_descriptor {
        eprintln!("descriptor half skipped: the device lacks VK_KHR_push_descriptor");
        return;
    }
    let dd = &Device::with_binding(ctx, helios_spirv::Binding::Descriptor);
    let moved: Vec<Tensor> = tensors
        .iter()
        .map(|t| {
            let host = t.to_vec().unwrap();
            Tensor::from_slice_as(dd, &host, t.shape(), t.dtype()).unwrap()
        })
        .collect();
    let refs: Vec<&Tensor> = moved.iter().collect();
    check(dd, helios::sum_squares(&refs).unwrap());
    assert_clean(dd);
    assert!(helios::sum_squares(&[]).is_err());
}
