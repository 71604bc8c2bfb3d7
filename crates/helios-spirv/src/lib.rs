//! helios-spirv: the kernel IR and its SPIR-V emitter.
//!
//! A kernel is built in Rust through [`KernelBuilder`], a typed builder over `rspirv`: values
//! carry their types, the builder picks opcodes and capabilities, and structured control flow
//! comes from closures. Nothing here knows about Vulkan objects; the output is a
//! [`KernelModule`]: SPIR-V 1.5 words plus the push-constant layout the host must fill.
//!
//! Buffers are passed either as buffer device addresses in push constants
//! ([`Binding::DeviceAddress`], no descriptors at all) or as storage-buffer descriptors
//! ([`Binding::Descriptor`], for push descriptors). The workgroup size is a specialization
//! constant, so one module serves every size the tuner tries.
//!
//! Cooperative matrices (SPV_KHR_cooperative_matrix, bf16 through SPV_KHR_bfloat16) live in
//! `coop` beside `subgroup`, adding their capabilities and extensions where they emit.
//!
//! How the modules relate: `types` (the IR's scalars, vectors and values) is the base;
//! `builder` declares parameters and emits the module, and each instruction family adds its
//! methods to [`KernelBuilder`] from its own file (`ops`, `control`, `memory`, `subgroup`,
//! `coop`, `tensor`, `fma`, `wide`); `builder::patch` rewrites the assembled words for the
//! instructions `rspirv` predates (`tensor`'s and `fma`'s). `validate` runs `spirv-val` on
//! the result.

mod builder;
mod control;
mod coop;
mod fma;
mod memory;
mod ops;
mod subgroup;
mod tensor;
mod types;
mod validate;
mod wide;

pub use builder::{
    Access, Binding, Buffer, KernelBuilder, KernelModule, Param, ParamInfo, ParamSlot,
    WORKGROUP_SIZE_SPEC_IDS,
};
pub use control::Var;
pub use coop::{CoopLayout, CoopMat, CoopScope, CoopStride, CoopTy, CoopUse, CoopVar};
pub use memory::{Shared, SharedLen};
pub use ops::{BinOp, CmpOp};
pub use rspirv::spirv::GLOp;
pub use subgroup::{GroupMode, ReduceOp};
pub use tensor::{TensorLayout, TensorView};
pub use types::{Kind, Scalar, Ty, Val};
pub use validate::{validate, validator, TargetEnv, ValidateError};
