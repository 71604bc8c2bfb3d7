//! helios-kernels: kernel generators. Each family turns an op description (its *signature*:
//! op, dtype, binding model, variant) into a `KernelModule` built with the helios-spirv IR,
//! plus the launch geometry and push constants for a given problem size.
//!
//! Families live one per file, or per directory for the larger ones (`matmul/`, `attention/`,
//! `reduce/`, `fused/`, and `rows/`, the row machinery several families share; each with a
//! `mod.rs` saying how its files relate); numerically delicate expressions (tanh, pow,
//! NaN-aware min/max) live in `math` so every family shares one definition.
//!
//! How the modules relate: under every family lie `launch` (grids and push-constant packing),
//! `storage` (f32/f16/bf16 loads and stores through f32) and `math`; `rows` builds on them
//! and serves the row-shaped families (softmax, norm, loss, embedding, reduce, optim,
//! multi_tensor, transpose, attention's prep). Families do not import one another, except
//! `fused`, which reuses `elementwise`'s ops, and `reduce`, whose prologue is a fused group.

pub mod attention;
pub mod elementwise;
mod elementwise_strided;
pub mod embedding;
pub mod fused;
pub mod launch;
pub mod loss;
pub mod math;
pub mod matmul;
pub mod multi_tensor;
mod native_maps;
pub mod norm;
mod norm_bwd;
pub mod optim;
pub mod reduce;
pub mod rows;
pub mod softmax;
pub mod storage;
pub mod transpose;

pub use attention::decode::{DecodeKernel, DecodeStage};
pub use attention::layout as coop_layout;
pub use attention::layout::{CoopProbeKernel, FragMap};
pub use attention::{AttentionKernel, AttnShape, AttnStage, AttnVariant, ViewStrides};
pub use elementwise::{
    BinaryOp, ElementwiseAddresses, ElementwiseKernel, ElementwiseOp, Strides, UnaryOp, Variant,
    ELEMENTWISE_DTYPES, ELEMENTWISE_WORKGROUP, MAX_DIMS,
};
pub use embedding::{EmbeddingArgs, EmbeddingKernel, EmbeddingStage};
pub use fused::{Compare, Dims as FusedDims, FusedInput, FusedKernel, Instr, Window};
pub use launch::{grid, pack_push, Arg, Args, Geometry, Launch, PushBytes};
pub use loss::{
    CrossEntropyArgs, CrossEntropyKernel, CrossEntropySetup, CrossEntropyStage,
    CROSS_ENTROPY_WORKGROUP,
};
pub use matmul::{
    native_workspace_bytes, Activation, CoopPeakKernel, Epilogue, MatmulAddresses, MatmulCaps,
    MatmulKernel, MatmulShape, NativeLaunch, NativeTile, RowOp, Triangle, Variant as MatmulVariant,
    WgSupport, NATIVE_MAPS_BYTES,
};
pub use multi_tensor::{copy_many_table, sum_squares_table, CopyManyKernel, SumSquaresKernel};
pub use optim::{AdamWArgs, AdamWKernel, AdamWStep};
pub use storage::{buffer_scalar, load_f32, store_f32, Storage};
pub use transpose::{TransposeArgs, TransposeKernel};

/// Errors from preparing a kernel launch.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{what} of {size} is too large for one dispatch; split the work into smaller tensors")]
    TooLarge { what: &'static str, size: u64 },
    #[error("kernel `{kernel}`: {detail}")]
    Arguments { kernel: String, detail: String },
}
