//! helios: tensors on any Vulkan GPU.
//!
//! `Device` picks and holds a GPU; `Tensor` is an f32 array on it with element-wise
//! operations; `cpu` is the reference implementation every kernel is tested against.
//!
//! ```no_run
//! use helios::{Device, Tensor};
//! let dev = Device::from_env()?;
//! let x = Tensor::from_slice(&dev, &[1.0, -2.0, 3.0], &[3])?;
//! let y = x.exp()?.add_scalar(1.0)?;
//! println!("{:?}", y.to_vec()?);
//! # Ok::<(), helios::Error>(())
//! ```

mod autograd;
mod autograd_ops;
pub mod cpu;
mod device;
mod dtype;
pub mod env;
mod error;
mod grad_rules;
mod index;
mod layout;
mod lazy;
mod ops;
mod realize_lock;
pub mod selfcheck;
mod tensor;
mod view;

pub use autograd::{checkpoint, folded_gradient_sums, no_grad, NoGradGuard};
pub use device::{Device, KernelConfig, KernelStats, OperandLayout, Readback, WARM_UP_MS};
pub use dtype::DType;
pub use error::{Error, Result};
pub use helios_kernels::attention::{AttnStage, AttnVariant};
pub use helios_kernels::reduce::Reduction;
pub use helios_kernels::rows::{RowConfig, RowVariant};
pub use helios_kernels::Compare;
pub use helios_kernels::{Activation, MatmulVariant};
pub use helios_kernels::{BinaryOp, ElementwiseKernel, ElementwiseOp, UnaryOp};
pub use index::IndexTensor;
pub use layout::Layout;
pub use lazy::{graph_stats, GraphStats};
pub use ops::{adamw_step, adamw_step_scaled, sum_squares, AdamWConfig, AdamWParam, CrossEntropy};
pub use ops::{attention_tuning, AttentionGrads, AttentionOptions, AttentionOutput};
pub use ops::{
    coop_peak, matmul_caps, CandidateResult, Choice, CoopPeak, MatmulChoice, MatmulOptions,
    TuneReport,
};
pub use ops::{stored_winners, NormGrads, NormOutput, RowOp, SoftmaxOptions};
pub use tensor::Tensor;
