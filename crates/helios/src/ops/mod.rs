//! Tensor operations beyond element-wise, one file per kernel family, each an `impl Tensor`
//! block over the helpers in `tensor.rs` (`Tensor::empty`, `buffer`, `address`) and the
//! device's kernel cache (`Device::kernel` with a `KernelKey` variant per family).

pub(crate) mod attention;
pub(crate) mod background;
mod embedding;
mod loss;
mod matmul;
mod native;
mod norm;
pub(crate) mod online;
mod optim;
mod reduce;
mod softmax;
mod tuning_progress;
mod tuning_store;

pub use attention::prepare_attention;
pub use attention::tune::attention_tuning;
pub use attention::{AttentionGrads, AttentionOptions, AttentionOutput};
pub use loss::CrossEntropy;
pub(crate) use matmul::tune::forget_device;
pub use matmul::tune::{
    coop_peak, matmul_caps, matmul_exploring, set_exhaustive_tuning, stop_background_tuning,
    tuning, tuning_in_progress, CandidateResult, Choice, CoopPeak, TuneReport, Tuning,
};
pub(crate) use matmul::MatmulSpec;
pub use matmul::{MatmulChoice, MatmulOptions, MatmulOverrides};
pub use norm::{NormGrads, NormOutput};
pub use online::exploration_spent;
pub use optim::{adamw_step, adamw_step_scaled, sum_squares, AdamWConfig, AdamWParam};
pub use reduce::RowOp;
pub use softmax::SoftmaxOptions;
pub use tuning_store::stored_winners;
