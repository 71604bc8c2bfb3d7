//! helios-nn's error type: every failure a user can cause with a configuration, a tokenizer,
//! a data file or a checkpoint, with a message that says what to do about it.
//!
//! Paths are carried as `PathBuf` and printed with `display()`, so a message names the exact
//! file to fix, restore or delete.

use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Helios(#[from] helios::Error),
    /// Between the ranks of a data-parallel run.
    #[error(transparent)]
    Dist(#[from] helios_dist::Error),

    #[error("invalid setting: {0}")]
    Config(String),
    #[error("unknown model preset '{0}'; choose one of: tiny, distilgpt2, gpt2, gpt2-medium")]
    UnknownPreset(String),

    #[error("{path}: {source}; check that the path exists and is readable", path = .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} not found at {path}", path = .path.display())]
    MissingFile { path: PathBuf, what: &'static str },
    #[error("{path} is corrupt or truncated ({reason}); restore it from a backup or save it again", path = .path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("{path} has no tensor '{name}'; is this a GPT-2 checkpoint of the configured size?", path = .path.display())]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path} holds tensor '{name}', which is not a GPT-2 parameter; only GPT2Model / GPT2LMHeadModel checkpoints are supported", path = .path.display())]
    UnexpectedTensor { path: PathBuf, name: String },
    #[error("tensor '{name}' has shape {got:?}, but the configuration expects {expected:?}; the checkpoint and config.json disagree")]
    WrongShape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("vocabulary mismatch: {what} has {got} tokens but {expected} were expected; use the tokenizer the model was trained with (or set vocab_size to match)")]
    VocabMismatch {
        what: String,
        expected: usize,
        got: usize,
    },
    #[error("tensor '{name}' is stored as {dtype}; only F32, F16 and BF16 tensors can be loaded")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("{path}: lm_head.weight differs from wte.weight; Helios ties the output head to the token embedding, so untied GPT-2 checkpoints are not supported", path = .path.display())]
    UntiedHead { path: PathBuf },
    #[error("{path}: tensor '{name}' holds {count} non-finite value{s} (the first, {value}, at flat index {index}); the file is damaged or was written by a run that diverged: start from other weights or an earlier checkpoint", path = .path.display(), s = if *.count == 1 { "" } else { "s" })]
    NonFiniteTensor {
        path: PathBuf,
        name: String,
        /// Flat index of the first NaN or infinity, and its value.
        index: usize,
        value: f32,
        /// How many of the tensor's values are not finite.
        count: usize,
    },
    #[error("parameter store: {0}")]
    Params(String),

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("{path} holds no tokens; give a non-empty text or token file", path = .path.display())]
    EmptyData { path: PathBuf },
    #[error("the {split} split has {have} tokens, but a batch of {batch}x{seq} needs at least {need} (B*T+1); use more data, a smaller batch or sequence length, or a different validation fraction")]
    TooFewTokens {
        split: &'static str,
        have: usize,
        need: usize,
        batch: usize,
        seq: usize,
    },
    #[error("{path}: token {id} at position {position} is not below the vocabulary size {vocab}; the file was tokenized with a different tokenizer (vocabulary mismatch)", path = .path.display())]
    TokenOutOfRange {
        path: PathBuf,
        position: usize,
        id: u32,
        vocab: usize,
    },
    #[error("{0}")]
    Data(String),
    #[error("the sampler state was saved for {saved}, but this run has {now}; resume with the same batch size, sequence length and data, or start a new run")]
    SamplerMismatch { saved: String, now: String },

    #[error("the {what} became {value} at step {step}; training stopped without saving. {}", match checkpoint {
        Some((dir, s)) => format!("The last good checkpoint is {} (step {s}); resume from it with a lower learning rate or more warm-up", dir.display()),
        None => "No checkpoint had been saved yet; lower the learning rate or lengthen the warm-up".to_string(),
    })]
    NonFinite {
        step: u64,
        what: &'static str,
        value: f32,
        /// (directory, step) of the last checkpoint written.
        checkpoint: Option<(PathBuf, u64)>,
    },

    #[error("{path}: {source}; the file is not valid JSON of the expected form", path = .path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
}

impl Error {
    /// An I/O error about `path`.
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
        if source.kind() == std::io::ErrorKind::NotFound {
            return Error::MissingFile {
                path: path.to_path_buf(),
                what: "file",
            };
        }
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn corrupt(path: &Path, reason: impl ToString) -> Error {
        Error::Corrupt {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}
