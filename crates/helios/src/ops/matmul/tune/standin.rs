//! What real calls run in place of a class's first choice while its native kernel is
//! JIT-compiled (`stand_in`), and what a plan launches (`launched`).

use helios_kernels::MatmulKernel;

use super::caps::matmul_caps;
use crate::ops::matmul::{Plan, Problem};

/// The matmul kernel a plan launches for `p` (a split plan's sub-problem kernel) and, for a
/// split plan, the elements its partial products sum into.
pub(super) fn launched(p: &Problem, plan: &Plan) -> Option<(MatmulKernel, Option<u32>)> {
    if plan.splits <= 1 {
        return Some((plan.kernel, None));
    }
    p.split(plan.kernel.variant, plan.splits, plan.kernel.subgroup)
        .map(|(sub, k)| (k, Some(sub.m.saturating_mul(sub.n))))
}

/// The SPIR-V kernel real calls of `p` run while `incumbent`'s native kernel is being
/// JIT-compiled (asked for here, ahead of the candidates), or `None` where the incumbent can
/// run without waiting for one. Why: the driver JIT-compiles one PTX module at a time while
/// pipelines compile side by side, so a cold first step waited seconds for its native
/// kernels (bench/results/2026-11-30-session46-h200.md). The stand-in is the default SPIR-V
/// kernel, unsplit.
pub(super) fn stand_in(p: &Problem, incumbent: &Plan) -> Option<Plan> {
    let (k, _) = launched(p, incumbent)?;
    let device = p.a.device();
    let key = crate::device::KernelKey::Matmul(k);
    if !k.variant.is_native() || device.has_kernel(&key) {
        return None;
    }
    let target = device.native_target()?;
    // Failing here, the incumbent's own launch reports the error.
    device
        .native_kernel(key, || Ok(k.build_native(target)?), true)
        .ok()?;
    let caps = matmul_caps(device);
    let d = helios_kernels::matmul::default_variant(
        p.input.storage(),
        p.out.storage(),
        p.trans,
        &p.shape,
        p.epilogue,
        &caps,
    );
    Some(Plan {
        kernel: p.kernel(d.variant, caps.subgroup),
        splits: 1,
    })
}
