//! The fused multiply-add that Vulkan guarantees: `OpFmaKHR` (SPV_KHR_fma, enabled by the
//! device extension VK_KHR_shader_fma), for kernels whose exactness depends on one rounding.
//!
//! The one decision a reader must know: Vulkan does not require GLSL.std.450 `Fma` to be
//! fused (its precision is that of an OpFMul followed by an OpFAdd), and the `rspirv` in use
//! predates SPV_KHR_fma, so it has no opcode or capability for it. `fma_fused` therefore
//! emits a GLSL `Fma` and records its result id; `finish` rewrites exactly those
//! instructions into `OpFmaKHR` and declares the capability and the extension.

use rspirv::spirv::{GLOp, Op, Word};

use crate::builder::KernelBuilder;
use crate::types::Val;

/// `OpFmaKHR`'s opcode and the `FMAKHR` capability (SPV_KHR_fma).
const OP_FMA_KHR: u32 = 4427;
const CAPABILITY_FMA_KHR: u32 = 6030;
const EXTENSION: &str = "SPV_KHR_fma";

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

/// The module `words` with the GLSL `Fma` instructions whose results are `ids` turned into
/// `OpFmaKHR`, and the capability and extension declared. Instructions are a plain word
/// stream (no offsets), so shortening some is safe.
pub(crate) fn patch(words: &[u32], ids: &[Word]) -> Vec<u32> {
    let mut out = Vec::with_capacity(words.len() + 6);
    out.extend_from_slice(&words[..5]);
    let mut declared = false;
    let mut at = 5;
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        let inst = &words[at..at + count];
        if !declared && op != Op::Capability as u32 {
            out.extend([2 << 16 | Op::Capability as u32, CAPABILITY_FMA_KHR]);
            let mut name: Vec<u8> = EXTENSION.bytes().collect();
            name.resize((EXTENSION.len() / 4 + 1) * 4, 0); // NUL-terminated, padded
            out.push(((1 + name.len() / 4) as u32) << 16 | Op::Extension as u32);
            out.extend(
                name.chunks(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
            declared = true;
        }
        // OpExtInst: type, result, set, instruction, a, b, c.
        if op == Op::ExtInst as u32
            && count == 8
            && inst[4] == GLOp::Fma as u32
            && ids.contains(&inst[2])
        {
            out.extend([
                6 << 16 | OP_FMA_KHR,
                inst[1],
                inst[2],
                inst[5],
                inst[6],
                inst[7],
            ]);
        } else {
            out.extend_from_slice(inst);
        }
        at += count;
    }
    out
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
        assert_eq!(count(6 << 16 | super::OP_FMA_KHR), 1);
        assert_eq!(count(8 << 16 | rspirv::spirv::Op::ExtInst as u32), 1);
        assert_eq!(count(super::CAPABILITY_FMA_KHR), 1);
    }
}
