//! helios-nn: the model-independent parts of training GPT-2 with Helios.
//!
//! - `config`: `GptConfig` (presets tiny, distilgpt2, gpt2, gpt2-medium) and `ParamSpec`, the
//!   one list of parameter names, shapes and weight decay everything else follows.
//! - `tokenizer`: GPT-2's BPE offline (`tiktoken-rs`), or a `tokenizer.json`.
//! - `data` + `sampler`: token files (memory-mapped u16, or text tokenized once and cached),
//!   a train/validation split, and batches that are a pure function of (seed, step).
//! - `params`: `HostTensor` and `ParamStore`, the host copy of every parameter, with upload to
//!   and download from `helios::Tensor`.
//! - `weights` + `checkpoint`: Hugging Face safetensors in and out, and atomic checkpoints that
//!   resume exactly (optimizer moments, sampler, schedule).
//! - `model`: GPT-2's forward pass on the device (autograd gives the backward); `optim`:
//!   AdamW with clipping and bf16 master weights; `train`: the training loop; `parallel`: its
//!   side of data-parallel training (agreement between ranks, ZeRO-1's sharded optimizer).
//!
//! Layout decision: parameters keep Hugging Face's shapes in files and in memory (Conv1D
//! weights [in, out]), so files need no transposes and a linear layer is `x @ w`.
//!
//! ```no_run
//! use helios_nn::{save_pretrained, BatchSampler, GptConfig, ParamStore, Tokenizer, Tokens};
//!
//! let config = GptConfig::preset("tiny")?;
//! let tok = Tokenizer::gpt2()?;
//! let data = Tokens::open("data/shakespeare/shakespeare.txt".as_ref(), &tok, "out/cache".as_ref())?;
//! let (train, val) = data.split(0.1)?;
//! let mut batches = BatchSampler::new(train, 8, 128, 1337)?;
//! let batch = batches.next_batch(); // inputs and targets, (B, T) u32
//! let params = ParamStore::init_gpt2(&config, 1337)?;
//! save_pretrained("out/model".as_ref(), &params, helios::DType::BF16)?;
//! # let _ = (val, batch);
//! # Ok::<(), helios_nn::Error>(())
//! ```

mod atomic;
pub mod checkpoint;
pub mod config;
pub mod data;
mod env;
mod error;
pub mod generate;
mod hash;
pub mod kv_cache;
pub mod model;
pub mod optim;
pub mod parallel;
pub mod params;
mod phase;
pub mod sampler;
pub mod schedule;
pub mod tokenizer;
pub mod train;
pub mod weights;

#[cfg(test)]
mod crash_tests;

pub use checkpoint::{
    load_checkpoint, load_pretrained, save_checkpoint, save_pretrained, Checkpoint, OptimizerState,
    TrainerState,
};
pub use config::{GptConfig, ParamSpec};
pub use data::Tokens;
pub use error::{Error, Result};
pub use model::{causal_self_attention, forward, GptParams};
pub use optim::AdamW;
pub use params::{HostTensor, ParamStore};
pub use sampler::{Batch, BatchSampler, EvalBatches, SamplerState, Shard};
pub use schedule::{AdamWHyper, LrSchedule};
pub use tokenizer::Tokenizer;
pub use train::{
    Event, History, LossScaler, StepLog, TrainConfig, Trainer, GROWTH_INTERVAL, INITIAL_LOSS_SCALE,
};
pub use weights::{load_weights, save_weights};
