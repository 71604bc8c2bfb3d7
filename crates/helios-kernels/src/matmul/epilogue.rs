//! What happens to `alpha · A·B` between the k loop and memory (`Epilogue`, and the
//! `Triangle` a product may skip), and the SPIR-V every SPIR-V family stores its outputs
//! through, so that they all apply the same epilogue the same way.

use helios_spirv::{Buffer, KernelBuilder, Val};

use super::params::{Dims, Params};
use super::MatmulKernel;
use crate::math;
use crate::storage::{load_f32, store_f32, Storage};

/// Activation applied in the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    None,
    Relu,
    /// GELU, tanh approximation (GPT-2).
    GeluTanh,
}

/// A softmax step folded into the epilogue, with one f32 value per output row (`rows`,
/// indexed batch · M + row): what attention's materialised backward uses instead of a
/// separate softmax pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowOp {
    None,
    /// `exp(v − rows[row])`: probabilities from the scores and their log-sum-exp.
    Exp,
    /// `residual[row, col] · (v − rows[row])`, the residual multiplying instead of adding:
    /// the softmax gradient from the probabilities (residual) and Σ P∘dP (rows).
    SoftmaxGrad,
}

/// What happens to `alpha · A·B` before it is stored: one of the combinations the kernels
/// implement. In the order applied: `+ bias[col]`, the row op, the activation, `+
/// residual[row, col]` (unless the row op or the activation's gradient multiplies by it),
/// then rounding to the output storage. Bias and residual are stored like the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// `act(alpha·A·B + bias) + residual`, each part optional. `store_pre` (with an
    /// activation) also stores the value the activation takes into a second output, `pre`,
    /// laid out like C: what the activation's backward reads, written by the product
    /// instead of read back by an activation pass.
    Forward {
        bias: bool,
        act: Activation,
        residual: bool,
        store_pre: bool,
    },
    /// The product is the gradient reaching an activation's output, and what is stored is
    /// the gradient at its input: `act'(residual) · alpha·A·B`, the residual being the
    /// activation's input. A linear layer's backward computes the GELU's backward this way
    /// inside the next layer's input-gradient product, instead of a pass over both tensors.
    ActGrad(Activation),
    /// A softmax step with one f32 value per output row ([`RowOp`]): `exp(v − rows[row])`
    /// (`Exp`), or `residual · (v − rows[row])` (`SoftmaxGrad`, the residual multiplying).
    Row { op: RowOp, bias: bool },
    /// `alpha·A·B`, and the column sums of B, `sums[n] = Σ_k B[k, n]` (not scaled by alpha;
    /// rounded to C's storage), into a third output of N values: a linear layer's bias
    /// gradient from the product that computes its weight gradient (dW = Xᵀ·dY reads dY as
    /// B, and db is the sum of dY's rows), as cuBLASLt's BGRADB epilogue does, instead of a
    /// reduction pass re-reading dY. SIMT kernels only (they stage B's tiles in shared
    /// memory and every invocation reads its columns' values), a batch of one, the whole k
    /// range; the workgroups of the first tile row store it.
    ColSums,
}

impl Epilogue {
    pub const NONE: Epilogue = Epilogue::Forward {
        bias: false,
        act: Activation::None,
        residual: false,
        store_pre: false,
    };

    /// `act(alpha·A·B + bias) + residual`.
    pub const fn forward(bias: bool, act: Activation, residual: bool) -> Epilogue {
        Epilogue::Forward {
            bias,
            act,
            residual,
            store_pre: false,
        }
    }

    /// This epilogue also storing the activation's input (`Forward::store_pre`); `None`
    /// where there is no activation, or not a forward epilogue.
    pub const fn saving_pre(self) -> Option<Epilogue> {
        match self {
            Epilogue::Forward {
                bias,
                act,
                residual,
                ..
            } if !matches!(act, Activation::None) => Some(Epilogue::Forward {
                bias,
                act,
                residual,
                store_pre: true,
            }),
            _ => None,
        }
    }

    /// Whether a bias is added.
    pub const fn bias(&self) -> bool {
        match *self {
            Epilogue::Forward { bias, .. } | Epilogue::Row { bias, .. } => bias,
            Epilogue::ActGrad(_) | Epilogue::ColSums => false,
        }
    }

    /// The activation applied (not its gradient).
    pub const fn act(&self) -> Activation {
        match *self {
            Epilogue::Forward { act, .. } => act,
            _ => Activation::None,
        }
    }

    /// Whether a residual is read: added, or multiplying (`ActGrad`, `RowOp::SoftmaxGrad`).
    pub const fn residual(&self) -> bool {
        match *self {
            Epilogue::Forward { residual, .. } => residual,
            Epilogue::ActGrad(_) => true,
            Epilogue::Row { op, .. } => matches!(op, RowOp::SoftmaxGrad),
            Epilogue::ColSums => false,
        }
    }

    pub const fn row(&self) -> RowOp {
        match *self {
            Epilogue::Row { op, .. } => op,
            _ => RowOp::None,
        }
    }

    /// The activation whose gradient multiplies the product (`ActGrad`).
    pub const fn act_grad(&self) -> Activation {
        match *self {
            Epilogue::ActGrad(a) => a,
            _ => Activation::None,
        }
    }

    pub const fn store_pre(&self) -> bool {
        matches!(
            self,
            Epilogue::Forward {
                store_pre: true,
                ..
            }
        )
    }

    pub const fn col_sums(&self) -> bool {
        matches!(self, Epilogue::ColSums)
    }

    /// Whether anything beyond scaling and rounding happens.
    pub const fn is_plain(&self) -> bool {
        matches!(
            self,
            Epilogue::Forward {
                bias: false,
                act: Activation::None,
                residual: false,
                store_pre: false,
            }
        )
    }

    /// Whether the parts fit together: the variants allow every combination but storing
    /// the input of no activation, and a row op of none.
    pub const fn is_valid(&self) -> bool {
        match *self {
            Epilogue::Forward { act, store_pre, .. } => {
                !store_pre || !matches!(act, Activation::None)
            }
            Epilogue::ActGrad(a) => !matches!(a, Activation::None),
            Epilogue::Row { op, .. } => !matches!(op, RowOp::None),
            Epilogue::ColSums => true,
        }
    }

    /// Whether the residual multiplies the value rather than being added to it.
    const fn residual_multiplies(&self) -> bool {
        matches!(self.row(), RowOp::SoftmaxGrad) || !matches!(self.act_grad(), Activation::None)
    }

    pub(super) fn tag(&self) -> String {
        let mut s = String::new();
        if self.bias() {
            s.push_str("_bias");
        }
        match self.row() {
            RowOp::None => {}
            RowOp::Exp => s.push_str("_rowexp"),
            RowOp::SoftmaxGrad => s.push_str("_rowsmgrad"),
        }
        if self.store_pre() {
            s.push_str("_pre");
        }
        match self.act() {
            Activation::None => {}
            Activation::Relu => s.push_str("_relu"),
            Activation::GeluTanh => s.push_str("_gelu"),
        }
        match self.act_grad() {
            Activation::None => {}
            Activation::Relu => s.push_str("_drelu"),
            Activation::GeluTanh => s.push_str("_dgelu"),
        }
        if self.residual() && !self.residual_multiplies() {
            s.push_str("_res");
        }
        if self.col_sums() {
            s.push_str("_colsum");
        }
        s
    }
}

/// What a product may take for granted about the triangles of a square operand or of its
/// result, so that causal attention's products skip the half that is zero or unwanted.
/// The diagonal is column = row of the batch's matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Triangle {
    /// Nothing: the whole product.
    Full,
    /// Only C on and below the diagonal is wanted: a workgroup whose tile lies wholly above
    /// it stores nothing (those outputs keep what they held).
    LowerC,
    /// A is read as zero above the diagonal, whatever is stored there: the k loop ends
    /// after the tile's last row, and the steps it runs mask A. SIMT kernels only.
    LowerA,
    /// A is read as zero below the diagonal: the k loop starts at the k step holding the
    /// tile's first row (masked as for `LowerA`). SIMT kernels only.
    UpperA,
}

impl Triangle {
    /// Whether A is masked to a triangle.
    pub const fn masks_a(self) -> bool {
        matches!(self, Triangle::LowerA | Triangle::UpperA)
    }

    pub(super) fn tag(self) -> &'static str {
        match self {
            Triangle::Full => "",
            Triangle::LowerC => "_trilc",
            Triangle::LowerA => "_trila",
            Triangle::UpperA => "_triua",
        }
    }
}

/// Applies the epilogue to `v` (f32, 1 or 4 lanes: columns `col..col+lanes` of `row`, all in
/// bounds) and stores it into C.
pub(crate) fn epilogue_store(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    p: &Params,
    d: &Dims,
    row: Val,
    col: Val,
    v: Val,
) {
    let lanes = v.ty.lanes;
    let alpha = k.splat(d.alpha, lanes);
    let mut v = k.mul(v, alpha);
    let vidx = |k: &mut KernelBuilder, base: Val| {
        if lanes == 1 {
            base
        } else {
            let l = k.u32(lanes as u32);
            k.div(base, l)
        }
    };
    if let Some(bias) = p.bias {
        let i = vidx(k, col);
        let b = load_f32(k, bias, i, lanes, kern.out);
        v = k.add(v, b);
    }
    // The residual at (row, col), for adding or for the softmax gradient's product.
    let residual = |k: &mut KernelBuilder, res: Buffer| {
        let at = k.mul(row, d.ldr);
        let at = k.add(at, col);
        let at = k.add(at, d.off_r);
        let i = vidx(k, at);
        load_f32(k, res, i, lanes, kern.out)
    };
    if let Some(rows) = p.rows {
        let at = k.mul(d.batch, d.m);
        let at = k.add(at, row);
        let r = load_f32(k, rows, at, 1, Storage::F32);
        let r = k.splat(r, lanes);
        v = k.sub(v, r);
        v = match kern.epilogue.row() {
            RowOp::Exp => k.exp(v),
            RowOp::SoftmaxGrad => {
                let res = p.residual.expect("a softmax gradient reads the residual");
                let y = residual(k, res);
                k.mul(y, v)
            }
            RowOp::None => unreachable!("no rows buffer without a row op"),
        };
    }
    // Where C's value goes (and the activation's input, which is laid out like C).
    let at = k.mul(row, d.ldc);
    let at = k.add(at, col);
    let at = k.add(at, d.off_c);
    let c_index = vidx(k, at);
    if let Some(pre) = p.pre {
        store_f32(k, pre, c_index, v, kern.out);
    }
    v = match kern.epilogue.act() {
        Activation::None => v,
        Activation::Relu => math::relu(k, v),
        Activation::GeluTanh => math::gelu_tanh(k, v),
    };
    let act_grad = kern.epilogue.act_grad();
    if act_grad != Activation::None {
        let res = p
            .residual
            .expect("an activation's gradient reads the residual");
        let x = residual(k, res);
        v = match act_grad {
            Activation::Relu => math::relu_backward(k, x, v),
            Activation::GeluTanh => math::gelu_tanh_backward(k, x, v),
            Activation::None => unreachable!("checked above"),
        };
    } else if let (Some(res), false) = (p.residual, kern.epilogue.row() == RowOp::SoftmaxGrad) {
        let r = residual(k, res);
        v = k.add(v, r);
    }
    store_f32(k, p.c, c_index, v, kern.out);
}

/// Stores a 4-column group `v` (vec4 f32) at (`row`, `col..col+4`): one vector store when
/// `vec_c` (N a multiple of 4: the group is all in or all out), else per-column checks.
pub(crate) fn store_quad(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    p: &Params,
    d: &Dims,
    row: Val,
    col: Val,
    v: Val,
) {
    let row_ok = k.lt(row, d.m);
    if kern.vec_c {
        let col_ok = k.lt(col, d.n);
        let ok = k.and(row_ok, col_ok);
        k.if_(ok, |k| epilogue_store(k, kern, p, d, row, col, v));
    } else {
        for lane in 0..4 {
            let off = k.u32(lane);
            let c = k.add(col, off);
            let col_ok = k.lt(c, d.n);
            let ok = k.and(row_ok, col_ok);
            let x = k.extract(v, lane);
            k.if_(ok, |k| epilogue_store(k, kern, p, d, row, c, x));
        }
    }
}
