//! The fused multiply-add that Vulkan guarantees: `OpFmaKHR` (SPV_KHR_fma, enabled by the
//! device extension VK_KHR_shader_fma), for kernels whose exactness depends on one rounding.
//!
//! The one decision a reader must know: Vulkan does not require GLSL.std.450 `Fma` to be
//! fused (its precision is that of an OpFMul followed by an OpFAdd), and the `rspirv` in use
//! predates SPV_KHR_fma, so it has no opcode or capability for it. `fma_fused` therefore
//! emits a GLSL `Fma` and records its result id; `finish` rewrites exactly those
//! instructions into `OpFmaKHR` and declares the capability and the extension
//! (`builder::patch::fused_fma`).

use rspirv::spirv::GLOp;

use crate::builder::KernelBuilder;
use crate::types::Val;

impl KernelBuilder {
    /// `a * b + c` with a single rounding, guaranteed by the specification (`OpFmaKHR`): the
    /// device must have VK_KHR_shader_fma enabled with the feature bit for the operands'
    /// width (`shaderFmaFloat16/32/64`).
    #[track_caller]
    pub fn fma_fused(&mut self, a: Val, b: Val, c: Val) -> Val {
        assert!(a.ty.scalar.is_float(), "fma_fused of {}", a.ty);
        let v = self.glsl_op(GLOp::Fma, &[a, b, c]);
        self.fused_fma.push(v.id);
        v
    }
}

#[cfg(test)]
mod tests {
    use crate::{validate, Access, Binding, KernelBuilder, Scalar, TargetEnv, Ty};

    #[test]
    fn fused_fma_becomes_op_fma_khr() {
        let mut k = KernelBuilder::new("fma_fused", Binding::DeviceAddress, [64, 1, 1]);
        let out = k.buffer("out", Scalar::U64, Access::Write);
        let x = k.param("x", Ty::scalar(Scalar::U64));
        k.begin();
        let x = k.load_param(x);
        let f = k.bitcast(x, Ty::scalar(Scalar::F64));
        let fused = k.fma_fused(f, f, f);
        let plain = k.fma(fused, f, f); // stays GLSL.std.450 Fma
        let r = k.bitcast(plain, Ty::scalar(Scalar::U64));
        let zero = k.u32(0);
        k.store(out, zero, r);
        let m = k.finish();
        // rspirv cannot read the new instruction back (no disassembly); spirv-val can.
        for env in [TargetEnv::Vulkan1_2, TargetEnv::Vulkan1_3] {
            validate(&m.name, &m.words, env).unwrap_or_else(|e| panic!("{e}"));
        }
        let count = |w: u32| m.words.iter().filter(|&&x| x == w).count();
        assert_eq!(count(6 << 16 | crate::builder::patch::OP_FMA_KHR), 1);
        assert_eq!(count(8 << 16 | rspirv::spirv::Op::ExtInst as u32), 1);
        assert_eq!(count(crate::builder::patch::CAPABILITY_FMA_KHR), 1);
    }
}
