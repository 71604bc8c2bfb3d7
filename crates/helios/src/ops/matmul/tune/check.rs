//! A candidate's correctness check: a small problem of the same form on fresh random
//! inputs against the f64 CPU reference.

use helios_kernels::{MatmulKernel, MatmulVariant};
use rand::{Rng, SeedableRng};

use crate::cpu::matmul::{matmul as reference, relative_error, MatmulRef};
use crate::ops::matmul::{Plan, Problem};
use crate::{DType, Device, Result, Tensor};

/// Runs `kernel` on a small problem of the same form (dtypes, transposes, epilogue, batch
/// handling; sizes capped at 160×160×96 and 2 batches, which keeps every alignment the
/// kernel assumes; a kernel that needs whole tiles gets whole tiles, at least one) with fresh
/// random inputs and returns its relative error.
pub(super) fn check(p: &Problem, plan: &Plan) -> Result<f64> {
    // A row op (attention's softmax steps) reads buffers this check does not make: it checks
    // the tile's product alone, which is what candidates differ in.
    let epilogue = match p.epilogue.row() {
        helios_kernels::RowOp::None => p.epilogue,
        _ => helios_kernels::Epilogue::NONE,
    };
    let kernel = &MatmulKernel {
        epilogue,
        ..plan.kernel
    };
    let device = p.a.device();
    let s = &p.shape;
    let batch = s.batch.min(2) as usize;
    let tiles = match kernel.variant {
        MatmulVariant::Wg(t) => Some([u32::from(t.bm), u32::from(t.bn), u32::from(t.bk)]),
        _ => None,
    };
    let size = |i: usize, full: u32, cap: u32| -> usize {
        let v = match tiles {
            // `full` is a multiple of the tile (the kernel fits the problem).
            Some(t) => t[i] * (full / t[i]).clamp(1, (cap / t[i]).max(1)),
            None => full.min(cap),
        };
        v as usize
    };
    let (m, n, kk) = (size(0, s.m, 160), size(1, s.n, 160), size(2, s.k, 96));
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6d61_746d ^ (m * 7919 + n * 31 + kk) as u64);
    let mut rand_vec = |len: usize, dt: DType| -> Vec<f32> {
        (0..len)
            .map(|_| dt.round(rng.gen_range(-1.0f32..1.0)))
            .collect()
    };
    let a_host = rand_vec(batch * m * kk, p.input);
    let b_batches = if s.stride_b == 0 { 1 } else { batch };
    let b_host = rand_vec(b_batches * kk * n, p.input);
    let bias_host = epilogue.bias().then(|| rand_vec(n, p.out));
    let res_host = epilogue.residual().then(|| rand_vec(batch * m * n, p.out));

    // Upload in the stored orientation, then view as the logical operand.
    let a_t = upload_operand(device, &a_host, Some(batch), m, kk, p.trans.0, p.input)?;
    // A single B matrix is passed 2-D (broadcast over the batch), as the caller's was.
    let b_dims = (b_batches > 1 || batch == 1).then_some(b_batches);
    let b_t = upload_operand(device, &b_host, b_dims, kk, n, p.trans.1, p.input)?;
    let bias_t = match &bias_host {
        Some(h) => Some(Tensor::from_slice_as(device, h, &[n], p.out)?),
        None => None,
    };
    let res_t = match &res_host {
        Some(h) => Some(Tensor::from_slice_as(device, h, &[batch, m, n], p.out)?),
        None => None,
    };
    let opts = crate::ops::MatmulSpec {
        alpha: p.alpha,
        bias: bias_t.as_ref(),
        act: epilogue.act(),
        residual: res_t.as_ref(),
        act_grad: epilogue.act_grad(),
        out: Some(p.out),
        variant: Some(kernel.variant),
        splits: None,
    };
    let mut small = Problem::new(&a_t, &b_t, &opts)?;
    if kernel.epilogue.store_pre() {
        small.pre = Some(small.output()?);
    }
    let mut k = *kernel;
    // The check's operands are dense and full: it checks the tile's arithmetic, and a
    // triangle's skipped parts would not match the full reference.
    k.triangle = helios_kernels::Triangle::Full;
    // The small problem's views are dense: any vector access the kernel assumes is valid.
    k.vec_a &= small.kernel(k.variant, k.subgroup).vec_a;
    k.vec_b &= small.kernel(k.variant, k.subgroup).vec_b;
    k.vec_c &= small.kernel(k.variant, k.subgroup).vec_c;
    k.exact_k &= small.kernel(k.variant, k.subgroup).exact_k;
    let out = small.run(&Plan {
        kernel: k,
        splits: plan.splits,
    })?;
    let got = out.to_vec()?;
    let want = reference(
        &a_host,
        &b_host,
        &MatmulRef {
            batch,
            m,
            n,
            k: kk,
            alpha: p.alpha,
            bias: bias_host.as_deref(),
            act: epilogue.act(),
            residual: res_host.as_deref(),
            act_grad: epilogue.act_grad(),
        },
    );
    Ok(relative_error(&got, &want))
}

/// A `(batch, rows, cols)` operand (`(rows, cols)` when `batch` is `None`) from row-major
/// host values, stored transposed (and viewed back) when `trans`.
fn upload_operand(
    device: &Device,
    host: &[f32],
    batch: Option<usize>,
    rows: usize,
    cols: usize,
    trans: bool,
    dtype: DType,
) -> Result<Tensor> {
    let lead: Vec<usize> = batch.into_iter().collect();
    let nd = lead.len();
    let batch = batch.unwrap_or(1);
    if !trans {
        return Tensor::from_slice_as(device, host, &[&lead[..], &[rows, cols]].concat(), dtype);
    }
    let mut t = vec![0f32; host.len()];
    for b in 0..batch {
        for r in 0..rows {
            for c in 0..cols {
                t[(b * cols + c) * rows + r] = host[(b * rows + r) * cols + c];
            }
        }
    }
    Tensor::from_slice_as(device, &t, &[&lead[..], &[cols, rows]].concat(), dtype)?
        .transpose(nd, nd + 1)
}
