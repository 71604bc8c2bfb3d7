//! Autograd for the library kernels (reductions, matmul, softmax, norms, cross-entropy): each
//! function runs the op and records its backward, built from the library's own backward
//! kernels where one exists.

use helios_kernels::{Activation, Compare};

use crate::autograd::{self, any_needs, record, reduce_to};
use crate::grad_rules::Saved;
use crate::ops::MatmulSpec;
use crate::{CrossEntropy, DType, Error, NormOutput, Reduction, Result, SoftmaxOptions, Tensor};

/// The gradient of `op` over `axis` (`None`: all) at `x`, given its output `y` and `g` (a
/// sum or mean reads only `x`'s shape).
pub(crate) fn reduce_backward(
    op: Reduction,
    axis: Option<usize>,
    x: &Saved,
    y: &Saved,
    g: &Tensor,
) -> Result<Tensor> {
    let shape = x.shape();
    // The reduced shape with the axis kept as 1, so `g` and `y` broadcast against `x`.
    let kept: Vec<usize> = match axis {
        Some(a) => {
            let mut s = shape.to_vec();
            s[a] = 1;
            s
        }
        None => vec![1; shape.len()],
    };
    let count = match axis {
        Some(a) => shape[a],
        None => shape.iter().product(),
    };
    let gb = g.reshape(&kept)?;
    match op {
        Reduction::Sum => gb.broadcast_to(shape)?.contiguous(),
        Reduction::Mean => gb.broadcast_to(shape)?.div_scalar(count as f32),
        Reduction::Max | Reduction::Min => {
            // Every element equal to the extreme gets the whole gradient (ties share none).
            let hit = x.get().compare(Compare::Eq, &y.get().reshape(&kept)?)?;
            hit.mul(&gb)
        }
        Reduction::ArgMax => unreachable!("argmax has no gradient"),
    }
}

/// `a · b` with the options' epilogue, differentiable in a, b, bias and residual.
///
/// The scale, bias and residual stay in the kernel's epilogue under autograd too: their
/// backward reads nothing back (the product's gradient is `alpha · g`, the bias's a row sum of
/// `g`, the residual's `g`), so one kernel writes `alpha · a · b + bias + residual` and no
/// element-wise pass rereads the product. Only an activation needs its input for backward:
/// in f32 the kernel also stores that input, in f16/bf16 the activation runs as an
/// element-wise op on the kernel's output; a residual is then added after it.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, opts: &MatmulSpec) -> Result<Tensor> {
    let mut inputs = vec![a, b];
    inputs.extend(opts.bias);
    inputs.extend(opts.residual);
    if !any_needs(&inputs) {
        return a.matmul_raw(b, opts);
    }
    if opts.act_grad != Activation::None {
        return Err(Error::Invalid {
            op: "matmul",
            detail: "act_grad is for backward rules and has no gradient of its own; call it \
                     under no_grad or on tensors that need none"
                .into(),
        });
    }
    let act = opts.act;
    // The residual joins the epilogue only when no activation comes before it.
    let residual = opts.residual.filter(|_| act == Activation::None);
    let kernel_opts = MatmulSpec {
        alpha: opts.alpha,
        bias: opts.bias,
        act: Activation::None,
        residual,
        act_grad: Activation::None,
        out: None,
        variant: opts.variant,
        splits: None,
    };
    // In f32 the product also applies the activation, storing its input beside it, and the
    // activation is marked (below) so that the product reading its output computes the
    // gradient at its input in its epilogue, which costs the products less than the passes
    // it removes. In f16/bf16 the activation and its backward stay passes: the cooperative
    // kernels' epilogue runs while the matrix units idle, and cost more than the pass (GPT-2's
    // MLP block on an H100; figures in bench/results/source-comment-history.md). The native
    // kernels' did too (GPT-2 on an H200: bench/results/2026-11-29-session42-h200.md).
    let (z, activated) = if act != Activation::None && a.dtype() == DType::F32 {
        let (y, z) = a.matmul_saving_pre(b, &MatmulSpec { act, ..kernel_opts })?;
        (z, Some(y))
    } else {
        (a.matmul_raw(b, &kernel_opts)?, None)
    };
    let mut linked: smallvec::SmallVec<[&Tensor; 4]> = smallvec::smallvec![a, b];
    linked.extend(opts.bias);
    linked.extend(residual);
    let (ad, bd) = (a.detach(), b.detach());
    // Where `a` is a marked activation's output (a linear layer's, as an MLP's second
    // product reads the first's GELU), a's gradient is computed at the activation's input
    // in this product's epilogue (see `autograd::mark_activation`).
    let a_link = a.grad_link().cloned();
    let alpha = opts.alpha;
    // (shape, dtype) of the bias and the residual: their gradients are g reduced and cast.
    let bias_of = opts.bias.map(|t| (t.shape().to_vec(), t.dtype()));
    let residual_of = residual.map(|t| (t.shape().to_vec(), t.dtype()));
    let mut y = record("matmul", &linked, z, move |g, needs| {
        let g = g.to_dtype(ad.dtype())?;
        // The bias's and the residual's gradients: g reduced to their shapes and cast.
        let reduced = |(shape, dtype): &(Vec<usize>, DType)| reduce_to(&g, shape)?.to_dtype(*dtype);
        let bias_needed = bias_of.is_some() && needs[2];
        // Where g is still a pending element-wise result (an activation's backward in
        // f16/bf16, whose product does not compute it), the bias gradient's reduction comes
        // first: it computes g in its loads and stores it for the products
        // (`lazy::with_prologue`), where g would otherwise be stored by its own kernel and
        // read again by the reduction. (A pending product is recorded as it is either way.)
        let pending = !g.is_realized() && !g.is_pending_product();
        let early_db = match &bias_of {
            Some(bias) if bias_needed && pending => Some(reduced(bias)?),
            _ => None,
        };
        let gz = match alpha == 1.0 {
            true => g.clone(),
            false => g.mul_scalar(alpha)?,
        };
        let nd = bd.shape().len();
        let mut grads = autograd::Grads::new();
        let bt = bd.transpose(nd - 2, nd - 1)?;
        let through = a_link
            .as_ref()
            .and_then(autograd::activation_input)
            .filter(|(_, x)| x.shape() == ad.shape() && x.dtype() == gz.dtype());
        grads.push(match (needs[0], through) {
            // (Not where a was broadcast over g's batch: its gradient is then a sum.)
            (true, Some((act, x))) if same_rows(&gz, &ad) => {
                let dx = gz.matmul_raw(
                    &bt,
                    &MatmulSpec {
                        residual: Some(&x),
                        act_grad: act,
                        ..Default::default()
                    },
                )?;
                autograd::through_activation(&dx);
                Some(dx)
            }
            (true, _) => Some(reduce_to(&gz.matmul(&bt)?, ad.shape())?),
            (false, _) => None,
        });
        // Otherwise the bias gradient, g's column sums, comes out of the weight gradient's
        // product where its kernel can fold them in (gz is g there only when alpha is 1).
        let fold = bias_needed && alpha == 1.0 && early_db.is_none();
        let (dw, db) = match needs[1] {
            true => {
                let (dw, db) = weight_grad(&ad, &bd, &gz, fold)?;
                (Some(dw), db)
            }
            false => (None, None),
        };
        grads.push(dw);
        // The bias's gradient (computed early, folded above or summed here), then the
        // residual's.
        if let Some(bias) = &bias_of {
            grads.push(match (needs[2], early_db, db) {
                (true, Some(db), _) => Some(db),
                (true, None, Some(db)) => Some(db.to_dtype(bias.1)?),
                (true, None, None) => Some(reduced(bias)?),
                (false, ..) => None,
            });
        }
        if let Some(residual) = &residual_of {
            grads.push(match needs[grads.len()] {
                true => Some(reduced(residual)?),
                false => None,
            });
        }
        Ok(grads)
    });
    let z = y;
    y = match (act, activated) {
        (Activation::None, _) => z.clone(),
        (_, Some(out)) => {
            let zd = z.detach();
            let y = record("activation", &[&z], out, move |g, _| {
                Ok(smallvec::smallvec![Some(match act {
                    Activation::Relu => zd.relu_backward(g)?,
                    Activation::GeluTanh => zd.gelu_tanh_backward(g)?,
                    Activation::None => unreachable!("matched above"),
                })])
            });
            autograd::mark_activation(&y, act, &z);
            y
        }
        (Activation::Relu, None) => z.relu()?,
        (Activation::GeluTanh, None) => z.gelu_tanh()?,
    };
    drop(z);
    // After an activation the residual is an element-wise add (else it is in the epilogue).
    if let (Some(r), None) = (opts.residual, residual) {
        y = y.add(&r.to_dtype(y.dtype())?)?;
    }
    match opts.out {
        Some(dt) => y.to_dtype(dt),
        None => Ok(y),
    }
}

/// Whether `g` (…, M, N) has the batch dimensions and rows of `a` (…, M, K), so that the
/// product g·bᵀ has a's shape.
fn same_rows(g: &Tensor, a: &Tensor) -> bool {
    let (gs, as_) = (g.shape(), a.shape());
    gs.len() == as_.len() && gs[..gs.len() - 1] == as_[..as_.len() - 1]
}

/// d(a·b)/db = aᵀ·g, summed over a's batch: a (…, M, K), g (…, M, N) → b's shape. A 2-D b
/// (a linear layer) takes one product over the flattened rows, which with `col_sums` also
/// returns g's column sums, the bias gradient, from the same launch where its kernel can
/// fold them in (`Tensor::matmul_col_sums`; `None` for a batched b).
fn weight_grad(
    a: &Tensor,
    b: &Tensor,
    g: &Tensor,
    col_sums: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let nd = a.shape().len();
    if b.shape().len() == 2 {
        let k = a.shape()[nd - 1];
        let n = g.shape()[g.shape().len() - 1];
        let (a2, g2) = match nd {
            2 => (a.clone(), g.clone()),
            _ => (a.reshape(&[a.len() / k, k])?, g.reshape(&[g.len() / n, n])?),
        };
        // b read through a transposed view (a tied head's wᵀ): d(bᵀ) = gᵀ·a, row-major like
        // w, handed back as the view, so w's gradient needs no transposing copy.
        if !col_sums && !b.is_contiguous() && b.transpose(0, 1)?.is_contiguous() {
            return Ok((g2.transpose(0, 1)?.matmul(&a2)?.transpose(0, 1)?, None));
        }
        let a2t = a2.transpose(0, 1)?;
        return match col_sums {
            true => {
                let (dw, db) = a2t.matmul_col_sums(&g2, None)?;
                Ok((dw, Some(db)))
            }
            false => Ok((a2t.matmul(&g2)?, None)),
        };
    }
    let at = a.transpose(nd - 2, nd - 1)?;
    Ok((reduce_to(&at.matmul(g)?, b.shape())?, None))
}

/// Softmax or log-softmax over the last axis, differentiable.
pub(crate) fn softmax(x: &Tensor, log: bool, opts: SoftmaxOptions) -> Result<Tensor> {
    let y = x.contiguous()?.softmax_op(log, opts)?;
    if !any_needs(&[x]) {
        return Ok(y);
    }
    let yd = y.detach();
    Ok(record("softmax", &[x], y, move |g, _| {
        let dx = match log {
            true => yd.log_softmax_backward(g, opts)?,
            false => yd.softmax_backward(g, opts)?,
        };
        Ok(smallvec::smallvec![Some(dx)])
    }))
}

/// Links a layer norm's (beta given) or RMS norm's output to x, gamma and beta.
pub(crate) fn layer_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    out: NormOutput,
) -> NormOutput {
    let mut inputs = vec![x, gamma];
    inputs.extend(beta);
    if !any_needs(&inputs) {
        return out;
    }
    let (xd, gd) = (x.detach(), gamma.detach());
    let (mean, rstd) = (out.mean.as_ref().map(Tensor::detach), out.rstd.detach());
    let y = autograd::record_taking_pending("norm", &inputs, out.y.clone(), move |g, _| {
        // x's gradient from its other consumers (a residual stream's), added in the kernel.
        let add = autograd::take_pending(0, |t| t.shape() == xd.shape() && t.dtype() == xd.dtype());
        let grads = xd.norm_backward_adding(&gd, mean.as_ref(), &rstd, g, add.as_ref())?;
        let mut v: autograd::Grads = smallvec::smallvec![Some(grads.dx), Some(grads.dgamma)];
        if mean.is_some() {
            v.push(grads.dbeta);
        }
        Ok(v)
    });
    NormOutput { y, ..out }
}

/// Links the mean loss to the logits through the gradient computed in the forward pass.
pub(crate) fn cross_entropy(logits: &Tensor, ce: CrossEntropy) -> CrossEntropy {
    let dlogits = ce
        .dlogits
        .as_ref()
        .expect("computed with the gradient")
        .detach();
    let nd = logits.shape().len();
    let loss = record("cross_entropy", &[logits], ce.loss.clone(), move |g, _| {
        // g: (1,), the upstream gradient of the mean loss.
        if crate::autograd::is_unit_seed(g) {
            return Ok(smallvec::smallvec![Some(dlogits.clone())]);
        }
        let scale = g.reshape(&vec![1; nd])?.to_dtype(dlogits.dtype())?;
        let shape = dlogits.shape();
        let v = shape[nd - 1];
        if v > 1 && dlogits.layout().strides()[nd - 1] != 1 {
            // Column-major (`cross_entropy_with_grad_cols`): scaled as the dense (V, rows)
            // tensor it views, so that it stays column-major for the head's product.
            let cols = dlogits.reshape(&[dlogits.len() / v, v])?.transpose(0, 1)?;
            let scaled = cols.mul(&scale.reshape(&[1, 1])?)?.transpose(0, 1)?;
            return Ok(smallvec::smallvec![Some(scaled.reshape(shape)?)]);
        }
        Ok(smallvec::smallvec![Some(dlogits.mul(&scale)?)])
    });
    CrossEntropy {
        loss,
        dlogits: None,
        ..ce
    }
}
