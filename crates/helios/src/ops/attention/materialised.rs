//! Attention with its scores stored: the f32 form, on the matmul and softmax kernels.
//!
//! Without cooperative matrices the flash kernels run on FMA units at a third of a GEMM's
//! rate, so in f32 it is faster to store the (B, H, T, T) scores and run the products as
//! batched GEMMs (the flash kernels' f32 figures are in
//! bench/results/2026-11-24-attention-f32-h100-session8.txt). The one decision a
//! reader must know: every product reads Q, K, V and dO in place through their strides (the
//! (B, H) heads are a two-level batch) and writes dense [B, T, H, D] outputs, and under a
//! causal mask each skips the half the mask makes zero (`Triangle`):
//!
//! | product | triangle |
//! |---|---|
//! | S = Q·Kᵀ, dP = dO·Vᵀ | only the lower triangle is computed (the softmax masks the rest) |
//! | O = P·V, dQ = dS·K | P and dS are read as zero above the diagonal: k stops at the tile's last row |
//! | dV = Pᵀ·dO, dK = dSᵀ·Q | Pᵀ and dSᵀ are read as zero below it: k starts at the tile's first row |
//!
//! The triangular products read P and dS as zero outside their triangle, so the softmax
//! touches only each row's causal prefix. The backward computes P again rather than keep it
//! per layer, FlashAttention-2's way but through memory: P = exp(scale·Q·Kᵀ − L) is the
//! epilogue of the product (L, the forward's log-sum-exp), and dS = scale·P∘(dP − Δ), with
//! Δ = Σ_j P∘dP = Σ_d dO∘O per row, the epilogue of dP = dO·Vᵀ (`RowOp`). No softmax pass
//! runs in the backward, and dP is never stored.

use helios_kernels::{Epilogue, MatmulShape, RowOp, Triangle};

use super::{AttentionGrads, AttentionOptions, AttentionOutput, Dims};
use crate::ops::matmul::tune as matmul_tune;
use crate::ops::matmul::Problem;
use crate::ops::softmax::SoftmaxOptions;
use crate::{DType, Result, Tensor};

/// Most bytes of f32 scores, B·H·T·T·4, the stored form takes; larger problems run the flash
/// kernels, whose memory is O(T). At 1 GiB the backward holds two such tensors (P and dS).
pub const MATERIALISED_BYTES: u64 = 1 << 30;

/// Fewest bytes of f32 scores the stored form takes on a GPU. Below it the flash kernels
/// are as fast (4 dispatches a layer's forward and backward instead of 10, and no T×T
/// buffers): on an H100 they were faster up to 1 MiB of scores, even at 1.5 MiB and slower
/// at 6 MiB (bench/results/2026-11-27-session27-h100.txt).
pub const MATERIALISED_MIN_BYTES: u64 = 2 << 20;

/// One [B, T, H, D] operand read (or written) in place: its tensor (whose view offset is
/// where head (0, 0) starts) and its batch, seq and head strides.
#[derive(Clone, Copy)]
pub(crate) struct HeadView<'a> {
    pub t: &'a Tensor,
    pub batch: usize,
    pub seq: usize,
    pub head: usize,
}

impl<'a> HeadView<'a> {
    /// A dense [B, T, H, D] tensor.
    fn dense(t: &'a Tensor, x: Dims) -> HeadView<'a> {
        HeadView {
            t,
            batch: x.t * x.h * x.d,
            seq: x.h * x.d,
            head: x.d,
        }
    }

    /// The view as the T×D matrix of each head (`trans`: read as D×T).
    fn matrix(self, trans: bool) -> Operand<'a> {
        Operand {
            t: self.t,
            trans,
            ld: self.seq,
            batch: self.batch,
            head: self.head,
        }
    }
}

/// Whether attention of this size and these options runs in this form: f32, no key
/// lengths, no forced flash variant (`opts.variant`, `stage_variant`, `HELIOS_ATTN_VARIANT`),
/// and, unless `opts.stored_scores` decides, a GPU (`cpu`: a CPU device, where the flash
/// kernels were faster at every size measured; bench/results/source-comment-history.md)
/// with scores from `MATERIALISED_MIN_BYTES` to `MATERIALISED_BYTES`.
pub(crate) fn wanted(
    dtype: DType,
    x: Dims,
    opts: &AttentionOptions,
    forced_env: bool,
    cpu: bool,
) -> bool {
    let scores = 4 * (x.b * x.h) as u64 * (x.t as u64) * (x.t as u64);
    let possible = dtype == DType::F32
        && opts.key_lengths.is_none()
        && opts.variant.is_none()
        && opts.stage_variant.is_none()
        && !forced_env
        && scores <= MATERIALISED_BYTES;
    possible
        && opts
            .stored_scores
            .unwrap_or(!cpu && scores >= MATERIALISED_MIN_BYTES)
}

/// A softmax step in a product's epilogue: the row op, its per-row values ([B, H, T] f32)
/// and, for the gradient, P (laid out as the output).
struct Step<'a> {
    op: RowOp,
    rows: &'a Tensor,
    p: Option<&'a Tensor>,
}

/// `alpha · a · b` for every head, written into `out`, with `step` folded into the
/// epilogue: each operand a matrix per head, read as its transpose where marked; sizes
/// `(m, n, k)`.
fn product(
    x: Dims,
    [a, b]: [Operand; 2],
    out: Operand,
    (m, n, k): (usize, usize, usize),
    triangle: Triangle,
    alpha: f32,
    step: Option<Step>,
) -> Result<()> {
    let u = |v: usize| v as u32;
    let shape = MatmulShape {
        batch: u(x.b * x.h),
        m: u(m),
        n: u(n),
        k: u(k),
        lda: u(a.ld),
        ldb: u(b.ld),
        ldc: u(out.ld),
        ldr: u(out.ld),
        stride_a: u(a.batch),
        stride_b: u(b.batch),
        stride_c: u(out.batch),
        stride_r: u(out.batch),
        inner: u(x.h),
        inner_a: u(a.head),
        inner_b: u(b.head),
        inner_c: u(out.head),
        inner_r: u(out.head),
        k_parts: 1,
    };
    let mut p = Problem::strided(
        a.t,
        b.t,
        shape,
        (a.trans, b.trans),
        triangle,
        alpha,
        out.t.shape(),
    );
    if let Some(s) = step {
        // (`Exp` reads no residual; `SoftmaxGrad` multiplies by P, the residual.)
        p.epilogue = Epilogue::Row {
            op: s.op,
            bias: false,
        };
        p.rows = Some(s.rows.clone());
        p.residual = s.p.cloned();
    }
    // A product into a whole tensor can be tuned on real work: a candidate's shadow writes a
    // scratch tensor of its shape with the same strides.
    let dense = out.t.is_contiguous()
        && out.t.layout().offset() == 0
        && match &p.residual {
            Some(r) => {
                let (rb, ob) = (r.buffer()?, out.t.buffer()?);
                (rb.raw(), rb.offset()) != (ob.raw(), ob.offset())
            }
            None => true,
        };
    if dense {
        return matmul_tune::run_into(&p, out.t);
    }
    let (plan, _) = matmul_tune::choose(&p)?;
    p.record(&plan.kernel, out.t)
}

/// One matrix operand of `product`: the tensor, transposed or not, its leading dimension
/// and its batch and head strides.
#[derive(Clone, Copy)]
struct Operand<'a> {
    t: &'a Tensor,
    trans: bool,
    ld: usize,
    batch: usize,
    head: usize,
}

/// A dense (B, H, T, T) tensor as each head's T×T matrix (`trans`: its transpose).
fn scores(t: &Tensor, x: Dims, trans: bool) -> Operand<'_> {
    Operand {
        t,
        trans,
        ld: x.t,
        batch: x.h * x.t * x.t,
        head: x.t * x.t,
    }
}

fn triangle(causal: bool, t: Triangle) -> Triangle {
    if causal {
        t
    } else {
        Triangle::Full
    }
}

/// `alpha · a · bᵀ` for every head (a and b [B, T, H, D] views) into the dense (B, H, T, T)
/// `out`, only its lower triangle under a causal mask, `step` in the epilogue.
fn scores_product(
    x: Dims,
    [a, b]: [HeadView; 2],
    out: &Tensor,
    causal: bool,
    alpha: f32,
    step: Option<Step>,
) -> Result<()> {
    product(
        x,
        [a.matrix(false), b.matrix(true)],
        scores(out, x, false),
        (x.t, x.t, x.d),
        triangle(causal, Triangle::LowerC),
        alpha,
        step,
    )
}

/// `s · v` for every head into the dense [B, T, H, D] `out`: s a dense (B, H, T, T) tensor
/// (read as its transpose when `trans`), v a [B, T, H, D] view. Under a causal mask s is
/// read as lower-triangular (its transpose as upper).
fn heads_product(
    x: Dims,
    (s, trans): (&Tensor, bool),
    v: HeadView,
    out: &Tensor,
    causal: bool,
) -> Result<()> {
    let half = if trans {
        Triangle::UpperA
    } else {
        Triangle::LowerA
    };
    product(
        x,
        [scores(s, x, trans), v.matrix(false)],
        HeadView::dense(out, x).matrix(false),
        (x.t, x.d, x.t),
        triangle(causal, half),
        1.0,
        None,
    )
}

fn softmax_options(opts: &AttentionOptions, scale: f32) -> SoftmaxOptions {
    SoftmaxOptions {
        scale,
        causal: opts.causal,
    }
}

/// O ([B, T, H, D]) and the log-sum-exp ([B, H, T]).
pub(crate) fn forward(
    [q, k, v]: [HeadView; 3],
    x: Dims,
    opts: &AttentionOptions,
    scale: f32,
) -> Result<AttentionOutput> {
    let device = q.t.device();
    let s = Tensor::empty(device, &[x.b, x.h, x.t, x.t], DType::F32)?;
    scores_product(x, [q, k], &s, opts.causal, 1.0, None)?;
    let (p, lse) = s.softmax_lse(softmax_options(opts, scale))?;
    drop(s);
    let out = Tensor::empty(device, &[x.b, x.t, x.h, x.d], DType::F32)?;
    heads_product(x, (&p, false), v, &out, opts.causal)?;
    Ok(AttentionOutput { out, lse })
}

/// dQ, dK, dV (dense [B, T, H, D]) from dO and the forward's output and log-sum-exp.
pub(crate) fn backward(
    [q, k, v]: [HeadView; 3],
    dout: HeadView,
    fwd: &AttentionOutput,
    x: Dims,
    opts: &AttentionOptions,
    scale: f32,
) -> Result<AttentionGrads> {
    let device = q.t.device();
    let causal = opts.causal;
    let square = || Tensor::empty(device, &[x.b, x.h, x.t, x.t], DType::F32);
    // P = exp(scale·Q·Kᵀ − L).
    let p = square()?;
    let exp = Step {
        op: RowOp::Exp,
        rows: &fwd.lse,
        p: None,
    };
    scores_product(x, [q, k], &p, causal, scale, Some(exp))?;
    // scale·Δ = scale·Σ_d dO∘O per row, [B, H, T].
    let dims = [x.b, x.t, x.h, x.d];
    let delta = dout
        .t
        .reshape(&dims)?
        .mul(&fwd.out.reshape(&dims)?)?
        .sum(-1)? // [B, T, H]
        .permute(&[0, 2, 1])?
        .mul_scalar(scale)?
        .contiguous()?;
    // dS = scale·P∘(dP − Δ), dP = dO·Vᵀ never stored.
    let ds = square()?;
    let grad = Step {
        op: RowOp::SoftmaxGrad,
        rows: &delta,
        p: Some(&p),
    };
    scores_product(x, [dout, v], &ds, causal, scale, Some(grad))?;
    let dense = || Tensor::empty(device, &[x.b, x.t, x.h, x.d], DType::F32);
    let (dq, dk, dv) = (dense()?, dense()?, dense()?);
    heads_product(x, (&p, true), dout, &dv, causal)?; // Pᵀ·dO
    drop(p);
    heads_product(x, (&ds, false), k, &dq, causal)?; // dS·K
    heads_product(x, (&ds, true), q, &dk, causal)?; // dSᵀ·Q
    Ok(AttentionGrads { dq, dk, dv })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_form_is_for_larger_f32_problems_on_gpus() {
        let dims = |b, h, t| Dims { b, t, h, d: 64 };
        let auto = AttentionOptions::causal();
        let force = |stored| AttentionOptions {
            stored_scores: Some(stored),
            ..AttentionOptions::causal()
        };
        let gpu = |x: Dims, o: &AttentionOptions| wanted(DType::F32, x, o, false, false);
        // 1.5 MiB of scores: the flash kernels; 6 MiB: stored.
        assert!(!gpu(dims(8, 12, 64), &auto));
        assert!(gpu(dims(8, 12, 128), &auto));
        assert!(!gpu(dims(8, 12, 128), &force(false)));
        assert!(gpu(dims(1, 1, 8), &force(true)));
        // Past MATERIALISED_BYTES, f16, key lengths or a forced variant: never.
        assert!(!gpu(dims(8, 12, 4096), &force(true)));
        assert!(!wanted(DType::F16, dims(8, 12, 128), &auto, false, false));
        assert!(!wanted(DType::F32, dims(8, 12, 128), &auto, true, false));
        // CPU devices take the flash kernels unless forced.
        assert!(!wanted(DType::F32, dims(8, 12, 512), &auto, false, true));
        assert!(wanted(
            DType::F32,
            dims(8, 12, 512),
            &force(true),
            false,
            true
        ));
    }
}
