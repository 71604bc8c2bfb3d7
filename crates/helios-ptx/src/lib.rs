//! helios-ptx: a typed PTX builder for NVIDIA's native kernel path.
//!
//! Beside `helios-spirv`, this crate emits PTX text that NVIDIA's Vulkan driver JIT-compiles
//! through `VK_NVX_binary_import` (helios-vk's `NativeKernel`): the instructions SPIR-V cannot
//! reach there — `wgmma`, `cp.async`, bulk copies with `mbarrier`, `ldmatrix`/`stmatrix`,
//! `cvt.rn.bf16x2.f32`. It knows nothing of Vulkan.
//!
//! - `types`: register types, registers, operands and the [`Target`] (`sm_90a` on Hopper;
//!   nothing assumes Hopper: an instruction the target lacks makes `finish` fail).
//! - `kernel`: the [`Kernel`] builder: parameters, registers, arithmetic, control flow.
//! - `divide`: integer division and remainder, by constants without a divide.
//! - `memory`: loads, stores, `cp.async`, `mbarrier`, bulk copies, matrix loads and stores.
//! - `mma`: `mma.sync` and `wgmma` with its shared-memory descriptors.
//! - `tensor`: tensor maps built on the device and `cp.async.bulk.tensor` copies of their
//!   boxes (Hopper's copy engine writing `wgmma`'s swizzled layouts).
//! - `validate`: runs `ptxas` on a module (the tests validate every generated kernel) and
//!   `nvdisasm` on what it assembled.

mod divide;
mod kernel;
mod memory;
mod mma;
mod tensor;
mod types;
mod validate;

pub use kernel::{BuildError, Cmp, Kernel, Label, Param, SharedArray, Special};
pub use memory::{Addr, Space};
pub use mma::{AccThread, MatrixDesc, MmaInput, Swizzle, WgmmaA};
pub use tensor::{TensorMap, TensorMap2d, TENSOR_MAP_BYTES};
pub use types::{Op, Reg, Target, Ty};
pub use validate::{assembler, disassembler, ptxas, sass, PtxasReport, ValidateError};

/// A finished module: PTX text with one entry point, and what a launch must know of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// The entry point's name.
    pub name: String,
    pub target: Target,
    /// The PTX source.
    pub text: String,
    /// Parameter types in declaration order.
    pub params: Vec<Ty>,
    /// Static shared memory the entry declares.
    pub shared_bytes: u32,
    /// Threads per block the entry requires (`.reqntid`), if declared.
    pub threads: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_declares_what_it_uses() {
        let mut k = Kernel::new("add_one", Target::SM80);
        let p = k.param("out", Ty::U64);
        let out = k.ld_param_global(p);
        let tid = k.special(Special::TidX);
        let off = k.mul_wide(tid, 4u32);
        let at = k.add(out, off);
        let v = k.ld(Space::Global, Ty::U32, Addr::new(at));
        let w = k.add(v, 1u32);
        k.st(Space::Global, Addr::new(at), w);
        let m = k.finish().unwrap();
        assert!(m.text.contains(".target sm_80"));
        assert!(m.text.contains(".reg .b32 %r<3>;"));
        assert!(m.text.contains(".reg .b64 %rd<4>;"));
        assert!(m.text.contains("ld.global.u32 %r1, [%rd3];"));
        assert_eq!(m.params, [Ty::U64]);
    }

    #[test]
    fn an_instruction_the_target_lacks_is_an_error() {
        let mut k = Kernel::new("needs_hopper", Target::SM90);
        k.wgmma_fence();
        let err = k.finish().unwrap_err();
        assert!(matches!(
            err,
            BuildError::Unsupported {
                instruction: "wgmma.fence",
                ..
            }
        ));
        assert!(err.to_string().contains("sm_90"));
    }

    #[test]
    fn descriptors_put_strides_where_the_hardware_reads_them() {
        let d = MatrixDesc {
            swizzle: Swizzle::None,
            lbo: 128,
            sbo: 256,
        };
        assert_eq!(d.encode(0x400), 0x40 | (8 << 16) | (16 << 32));
        let s = MatrixDesc {
            swizzle: Swizzle::B128,
            lbo: 16,
            sbo: 1024,
        };
        assert_eq!(s.constant_bits() >> 62, 1);
        // 128-byte swizzle: chunk c of row r lands at c ^ (r % 8); narrower rows XOR with
        // their 128-byte line: 64-byte row 5 is in line 2, 32-byte row 5 in line 1.
        assert_eq!(Swizzle::B128.chunk(3, 0), 3 * 8 + 3);
        assert_eq!(Swizzle::B64.chunk(5, 3), 5 * 4 + (3 ^ 2));
        assert_eq!(Swizzle::B32.chunk(5, 0), 5 * 2 + 1);
        assert_eq!(Swizzle::B32.chunk(3, 1), 3 * 2 + 1);
        assert_eq!(Swizzle::None.chunk(7, 0), 7);
    }

    #[test]
    fn bad_names_and_shapes_are_errors_not_text() {
        assert!(Kernel::new("9lives", Target::SM80).finish().is_err());
        let mut k = Kernel::new("odd", Target::SM90A);
        let acc = k.regs(Ty::F32, 3);
        let d = k.mov(Ty::U64, 0u32);
        let p = k.setp(Cmp::Eq, d, 0u32);
        k.wgmma(
            MmaInput::BF16,
            &acc,
            WgmmaA::Shared {
                desc: d,
                transpose: false,
            },
            d,
            false,
            p,
        );
        assert!(k.finish().is_err());
    }
}
