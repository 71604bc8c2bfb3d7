//! AdamW (decoupled weight decay, bias correction) as one fused read-modify-write pass per
//! parameter tensor: reads param, grad, m, v; writes param, m, v and, optionally, a narrow
//! (f16/bf16) copy of the new parameter for the next forward pass.
//!
//! The one decision a reader must know: one dispatch per parameter tensor, all recorded in
//! one batch with no barriers between them (they touch disjoint buffers), rather than one
//! dispatch over a table of addresses as `multi_tensor`'s sum of squares does. Independent
//! dispatches overlap, so GPT-2 124M's 148 tensors add a few percent to an update (the
//! arithmetic is in bench/results/source-comment-history.md). The clipping norm's per-tensor
//! reductions were another matter: each a partial and a combine with a barrier between.
//! Parameters kept in one flat tensor take a single dispatch.
//!
//! The arithmetic is PyTorch's (`torch.optim.AdamW`, fused or not), in f32, with `g` the
//! gradient times an optional scale read from device memory (`AdamWKernel::scaled`: a
//! gradient-clipping coefficient, or a loss scale's inverse, computed on the GPU and never
//! read back): `p ← p·(1 − lr·wd)`, `m ← β1·m + (1−β1)·g`, `v ← β2·v + (1−β2)·g²`,
//! `p ← p − (lr / (1−β1^t)) · m / (√v / √(1−β2^t) + ε)`. The per-step scalars (bias
//! corrections from the step t, 1 − lr·wd) are computed on the host in f64 and passed as
//! push constants. NaN in a gradient propagates to m, v and the parameter (no silent skip);
//! a scaled kernel whose scale is NaN or infinite writes nothing (the skipped step of
//! dynamic loss scaling, decided on the device without a read-back).

use helios_spirv::{Access, Binding, Buffer, KernelBuilder, KernelModule, Scalar, Ty, Val};

use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::rows::linear_workgroup;
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};
use crate::KernelError;

/// Default workgroup size.
pub const ADAMW_WORKGROUP: u32 = 256;

/// The signature of an AdamW kernel. Parameters, m and v are f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdamWKernel {
    /// Storage of the gradient.
    pub grad: Storage,
    /// Storage of the optional copy of the updated parameter.
    pub copy: Option<Storage>,
    /// The gradient is multiplied by element 0 of an f32 buffer (`AdamWArgs::scale`).
    pub scaled: bool,
    pub binding: Binding,
}

/// The scalars of one step (push constants).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    /// 1 − lr·weight_decay.
    pub decay: f32,
    pub beta1: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub eps: f32,
    /// lr / (1 − β1^t).
    pub step_size: f32,
    /// 1 / √(1 − β2^t).
    pub inv_bc2_sqrt: f32,
}

impl AdamWStep {
    /// The scalars for step `t` (1-based) with learning rate `lr` and weight decay `wd`,
    /// computed in f64 and rounded once.
    pub fn new(lr: f64, beta1: f64, beta2: f64, eps: f64, wd: f64, t: u32) -> AdamWStep {
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        let bc1 = 1.0 - beta1.powi(t);
        let bc2 = 1.0 - beta2.powi(t);
        AdamWStep {
            decay: (1.0 - lr * wd) as f32,
            beta1: beta1 as f32,
            one_minus_beta1: (1.0 - beta1) as f32,
            beta2: beta2 as f32,
            one_minus_beta2: (1.0 - beta2) as f32,
            eps: eps as f32,
            step_size: (lr / bc1) as f32,
            inv_bc2_sqrt: (1.0 / bc2.sqrt()) as f32,
        }
    }
}

/// One tensor's update: its length and buffer addresses (ignored with descriptor binding).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWArgs {
    pub n: u32,
    pub param: u64,
    pub grad: u64,
    pub m: u64,
    pub v: u64,
    /// Only read when the kernel has a copy.
    pub copy: u64,
    /// Only read when the kernel is `scaled`: an f32 whose element 0 multiplies the gradient.
    pub scale: u64,
    pub step: AdamWStep,
}

impl AdamWKernel {
    /// Every AdamW kernel for `binding`, for validation and warm-up.
    pub fn all(binding: Binding) -> Vec<AdamWKernel> {
        let mut out = Vec::new();
        for grad in Storage::ALL {
            for copy in [None, Some(Storage::F16), Some(Storage::BF16)] {
                for scaled in [false, true] {
                    out.push(AdamWKernel {
                        grad,
                        copy,
                        scaled,
                        binding,
                    });
                }
            }
        }
        out
    }

    pub fn name(&self) -> String {
        let scaled = if self.scaled { "_scaled" } else { "" };
        match self.copy {
            None => format!("adamw_g{}{scaled}", self.grad.name()),
            Some(c) => format!("adamw_g{}_copy_{}{scaled}", self.grad.name(), c.name()),
        }
    }

    /// Emits the kernel: one vec4 of every array per invocation; invocation 0 of workgroup 0
    /// also does the last `n % 4` elements with scalar accesses (no padding needed).
    pub fn build(&self) -> KernelModule {
        let mut k = KernelBuilder::new(self.name(), self.binding, [ADAMW_WORKGROUP, 1, 1]);
        let f32s = Scalar::F32;
        // Read-only buffers first (the tensor layer lists reads before writes).
        let grad = k.buffer("grad", buffer_scalar(self.grad), Access::Read);
        let scale = self.scaled.then(|| k.buffer("scale", f32s, Access::Read));
        let io = Io {
            param: k.buffer("param", f32s, Access::ReadWrite),
            grad,
            m: k.buffer("m", f32s, Access::ReadWrite),
            v: k.buffer("v", f32s, Access::ReadWrite),
            copy: self
                .copy
                .map(|c| (k.buffer("copy", buffer_scalar(c), Access::Write), c)),
            grad_storage: self.grad,
        };
        let n = k.param("n", Ty::scalar(Scalar::U32));
        let names = [
            "decay",
            "beta1",
            "one_minus_beta1",
            "beta2",
            "one_minus_beta2",
            "eps",
            "step_size",
            "inv_bc2_sqrt",
        ];
        let params: Vec<_> = names
            .iter()
            .map(|name| k.param(name, Ty::scalar(f32s)))
            .collect();
        k.begin();
        let n = k.load_param(n);
        let h: Vec<Val> = params.iter().map(|&p| k.load_param(p)).collect();
        let zero = k.u32(0);
        let scale = scale.map(|b| k.load(b, zero, 1));
        let h = Hyper {
            scale,
            decay: h[0],
            beta1: h[1],
            omb1: h[2],
            beta2: h[3],
            omb2: h[4],
            eps: h[5],
            step_size: h[6],
            inv_bc2: h[7],
        };
        let group = linear_workgroup(&mut k);
        let wg = k.workgroup_size_x();
        let lid = k.local_index();
        let base = k.mul(group, wg);
        let i = k.add(base, lid);
        let two = k.u32(2);
        let full = k.shr(n, two);
        let mut inside = k.lt(i, full);
        let mut first = k.eq(i, zero);
        if let Some(c) = h.scale {
            let nan = k.is_nan(c);
            let inf = k.is_inf(c);
            let bad = k.or(nan, inf);
            let finite = k.not(bad);
            inside = k.and(inside, finite);
            first = k.and(first, finite);
        }
        k.if_(inside, |k| update(k, &io, &h, i, 4));
        k.if_(first, |k| {
            let tail = k.shl(full, two);
            for j in 0..3 {
                let off = k.u32(j);
                let e = k.add(tail, off);
                let inside = k.lt(e, n);
                k.if_(inside, |k| update(k, &io, &h, e, 1));
            }
        });
        k.finish()
    }

    /// Grid and push constants for one tensor.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        a: &AdamWArgs,
    ) -> Result<Launch, KernelError> {
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.push(Arg::Address(a.grad));
            if self.scaled {
                args.push(Arg::Address(a.scale));
            }
            args.extend([a.param, a.m, a.v].map(Arg::Address));
            if self.copy.is_some() {
                args.push(Arg::Address(a.copy));
            }
        }
        let s = a.step;
        args.push(Arg::U32(a.n));
        args.extend(
            [
                s.decay,
                s.beta1,
                s.one_minus_beta1,
                s.beta2,
                s.one_minus_beta2,
                s.eps,
                s.step_size,
                s.inv_bc2_sqrt,
            ]
            .map(Arg::F32),
        );
        // One invocation per whole vec4, at least one workgroup for a tail.
        let vec4s = u64::from(a.n / 4);
        let groups = vec4s
            .div_ceil(u64::from(geometry.workgroup))
            .max(u64::from(a.n > 0));
        let groups = grid(groups, geometry.max_groups_x)?;
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }
}

struct Io {
    param: Buffer,
    grad: Buffer,
    m: Buffer,
    v: Buffer,
    copy: Option<(Buffer, Storage)>,
    grad_storage: Storage,
}

struct Hyper {
    /// The gradient's multiplier, when the kernel is scaled.
    scale: Option<Val>,
    decay: Val,
    beta1: Val,
    omb1: Val,
    beta2: Val,
    omb2: Val,
    eps: Val,
    step_size: Val,
    inv_bc2: Val,
}

/// The update of element (or vec4) `i`.
fn update(k: &mut KernelBuilder, io: &Io, h: &Hyper, i: Val, lanes: u8) {
    let p = k.load(io.param, i, lanes);
    let g = load_f32(k, io.grad, i, lanes, io.grad_storage);
    let g = match h.scale {
        Some(c) => {
            let c = k.splat(c, lanes);
            k.mul(g, c)
        }
        None => g,
    };
    let m = k.load(io.m, i, lanes);
    let v = k.load(io.v, i, lanes);
    let s = |k: &mut KernelBuilder, x: Val| k.splat(x, lanes);
    let (decay, b1, omb1, b2, omb2) = (
        s(k, h.decay),
        s(k, h.beta1),
        s(k, h.omb1),
        s(k, h.beta2),
        s(k, h.omb2),
    );
    let (eps, step, inv_bc2) = (s(k, h.eps), s(k, h.step_size), s(k, h.inv_bc2));
    let p = k.mul(p, decay);
    let gm = k.mul(g, omb1);
    let m = k.fma(m, b1, gm);
    let gg = k.mul(g, g);
    let gv = k.mul(gg, omb2);
    let v = k.fma(v, b2, gv);
    let root = k.sqrt(v);
    let denom = k.fma(root, inv_bc2, eps);
    let ratio = k.div(m, denom);
    let delta = k.mul(ratio, step);
    let p = k.sub(p, delta);
    k.store(io.param, i, p);
    k.store(io.m, i, m);
    k.store(io.v, i, v);
    if let Some((c, cs)) = io.copy {
        store_f32(k, c, i, p, cs);
    }
}
