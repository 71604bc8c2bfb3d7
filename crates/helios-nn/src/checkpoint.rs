//! Checkpoints: a directory Hugging Face `transformers` can load, plus what an exact resume
//! needs.
//!
//! ```text
//! DIR/config.json             GPT2Config for transformers (GptConfig; see config.rs)
//! DIR/model.safetensors       weights, as GPT2LMHeadModel.save_pretrained names them
//! DIR/optimizer.safetensors   AdamW moments: exp_avg.NAME, exp_avg_sq.NAME (f32); step in metadata
//! DIR/trainer_state.json      step, seed, sampler state, schedule, AdamW constants, model config
//! ```
//!
//! A save builds the whole directory under a staging name beside DIR, flushes every file and
//! the staging directory, and only then swaps it in (`atomic::replace_dir`); a crash at any
//! point leaves the previous checkpoint loadable (a crash in the middle of the swap leaves it
//! under a `.old-` name, which the next load or save renames back). Other regular files in
//! DIR (a tokenizer.json, a README) are carried into the new directory; a DIR holding a
//! subdirectory is refused rather than emptied. One process at a time may save to a DIR.
//! The model files alone (`save_pretrained`) are what to hand to
//! `GPT2LMHeadModel.from_pretrained(DIR)`; saving them over a full checkpoint drops its
//! optimizer and trainer state, which no longer match the weights.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use helios::DType;
use serde::{Deserialize, Serialize};

use crate::atomic::{self, fail_point};
use crate::config::{self, GptConfig};
use crate::params::{check_shape, HostTensor, ParamStore};
use crate::sampler::SamplerState;
use crate::schedule::{AdamWHyper, LrSchedule};
use crate::weights::{self, load_weights};
use crate::{Error, Result};

pub const CONFIG_FILE: &str = "config.json";
pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TRAINER_FILE: &str = "trainer_state.json";

/// The `format` metadata of optimizer files, and the trainer state's `format`.
const OPTIMIZER_FORMAT: &str = "helios-adamw-1";
pub const TRAINER_FORMAT: u32 = 1;

/// AdamW's running moments for every parameter (f32, shapes of the parameters).
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerState {
    /// Optimizer steps taken (bias correction uses it).
    pub step: u64,
    /// First moments by parameter name.
    pub m: BTreeMap<String, HostTensor>,
    /// Second moments by parameter name.
    pub v: BTreeMap<String, HostTensor>,
}

impl OptimizerState {
    /// Step 0, every moment zero.
    pub fn zeros(config: &GptConfig) -> OptimizerState {
        let zeros: BTreeMap<_, _> = config
            .param_specs()
            .into_iter()
            .map(|s| {
                let t = HostTensor::zeros(&s.shape);
                (s.name, t)
            })
            .collect();
        OptimizerState {
            step: 0,
            m: zeros.clone(),
            v: zeros,
        }
    }

    /// Checks that every parameter of `config` has both moments, of its shape.
    pub fn validate(&self, config: &GptConfig) -> Result<()> {
        for spec in config.param_specs() {
            for (kind, map) in [("exp_avg", &self.m), ("exp_avg_sq", &self.v)] {
                let t = map.get(&spec.name).ok_or_else(|| {
                    Error::Params(format!("optimizer state has no {kind} for '{}'", spec.name))
                })?;
                check_shape(&spec, &t.shape)?;
            }
        }
        let n = config.param_specs().len();
        if self.m.len() != n || self.v.len() != n {
            return Err(Error::Params(
                "optimizer state holds moments for tensors that are not parameters".into(),
            ));
        }
        Ok(())
    }
}

/// Everything besides tensors that a resumed run needs to continue exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// `TRAINER_FORMAT`.
    pub format: u32,
    /// Optimizer steps completed; the next step is `step`, at `schedule.lr_at(step)`.
    pub step: u64,
    /// The run's seed (initialisation; the sampler keeps its own copy).
    pub seed: u64,
    pub sampler: SamplerState,
    pub schedule: LrSchedule,
    pub adamw: AdamWHyper,
    pub model: GptConfig,
    /// Anything else the trainer wants back (data path, dtype, loss history ...).
    #[serde(default)]
    pub extra: serde_json::Value,
}

/// What `load_checkpoint` returns: the weights, and the optimizer and trainer state when the
/// directory has them (a `save_pretrained` export has neither).
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub params: ParamStore,
    pub optimizer: Option<OptimizerState>,
    pub trainer: Option<TrainerState>,
}

/// Saves a resumable checkpoint to `dir` (f32 weights, so a resume is bit-exact), replacing
/// any checkpoint there only once the new one is complete on disk.
pub fn save_checkpoint(
    dir: &Path,
    params: &ParamStore,
    optimizer: &OptimizerState,
    trainer: &TrainerState,
) -> Result<()> {
    optimizer.validate(params.config())?;
    trainer.schedule.validate()?;
    if &trainer.model != params.config() {
        return Err(Error::Config(
            "the trainer state's model config differs from the parameters' config".into(),
        ));
    }
    if trainer.step != optimizer.step {
        return Err(Error::Params(format!(
            "trainer step {} and optimizer step {} differ",
            trainer.step, optimizer.step
        )));
    }
    save_dir(dir, params, DType::F32, Some((optimizer, trainer)))
}

/// Saves the model alone to `dir` (`config.json` + `model.safetensors` as `dtype`), the way
/// `transformers`' `save_pretrained` lays it out, atomically like `save_checkpoint`.
pub fn save_pretrained(dir: &Path, params: &ParamStore, dtype: DType) -> Result<()> {
    save_dir(dir, params, dtype, None)
}

fn save_dir(
    dir: &Path,
    params: &ParamStore,
    dtype: DType,
    state: Option<(&OptimizerState, &TrainerState)>,
) -> Result<()> {
    let parent = atomic::parent_dir(dir);
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    atomic::recover_dir(dir, true)?;
    let keep = files_to_keep(dir)?;
    let stage = atomic::temp_sibling(dir, "stage");
    let result = (|| -> Result<()> {
        std::fs::create_dir(&stage).map_err(|e| Error::io(&stage, e))?;
        // Files a user put beside the model (a tokenizer.json, a README) move with it.
        for name in &keep {
            let (from, to) = (dir.join(name), stage.join(name));
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).map_err(|e| Error::io(&from, e))?;
            }
        }
        let cfg = serde_json::to_vec_pretty(&config::to_hf_json(params.config()))
            .map_err(|e| Error::Config(format!("config.json: {e}")))?;
        write_synced(&stage.join(CONFIG_FILE), &cfg)?;
        weights::write_tensors(
            &stage.join(MODEL_FILE),
            weights::hf_named(params),
            dtype,
            weights::hf_metadata(),
        )?;
        if let Some((opt, trainer)) = state {
            fail_point::before(OPTIMIZER_FILE)?;
            write_optimizer(&stage.join(OPTIMIZER_FILE), opt)?;
            let json = serde_json::to_vec_pretty(trainer)
                .map_err(|e| Error::Params(format!("trainer state: {e}")))?;
            write_synced(&stage.join(TRAINER_FILE), &json)?;
        }
        atomic::sync_dir(&stage)?;
        atomic::replace_dir(&stage, dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&stage);
    }
    result
}

/// The names of the regular files in an existing `dir` that a save must carry over (all
/// but the checkpoint's own). Refuses a `dir` that is a file, or that holds a directory or
/// anything else a save could not carry, rather than lose it.
fn files_to_keep(dir: &Path) -> Result<Vec<std::ffi::OsString>> {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return Ok(Vec::new()); // nothing there yet
    };
    if !meta.is_dir() {
        return Err(Error::Data(format!(
            "{} exists and is not a directory; choose another checkpoint path",
            dir.display()
        )));
    }
    let mut keep = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name();
        if [CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE]
            .iter()
            .any(|own| name == *own)
        {
            continue;
        }
        let kind = entry.file_type().map_err(|e| Error::io(&entry.path(), e))?;
        if !kind.is_file() {
            return Err(Error::Data(format!(
                "{} holds {}, which is not a regular file, and a save replaces the whole directory; move it out or save elsewhere",
                dir.display(),
                entry.path().display()
            )));
        }
        keep.push(name);
    }
    Ok(keep)
}

/// Writes `bytes` to a new file and flushes it to disk.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))?;
    f.sync_all().map_err(|e| Error::io(path, e))
}

fn write_optimizer(path: &Path, opt: &OptimizerState) -> Result<()> {
    let named = opt
        .m
        .iter()
        .map(|(n, t)| (format!("exp_avg.{n}"), t))
        .chain(opt.v.iter().map(|(n, t)| (format!("exp_avg_sq.{n}"), t)));
    let metadata = HashMap::from([
        ("format".to_string(), OPTIMIZER_FORMAT.to_string()),
        ("step".to_string(), opt.step.to_string()),
    ]);
    weights::write_tensors(path, named, DType::F32, metadata)
}

fn read_optimizer(path: &Path, config: &GptConfig) -> Result<OptimizerState> {
    let file = weights::read_tensors(path)?;
    if file.metadata.get("format").map(String::as_str) != Some(OPTIMIZER_FORMAT) {
        return Err(Error::corrupt(
            path,
            format!("its metadata does not say format = {OPTIMIZER_FORMAT}"),
        ));
    }
    let step = file
        .metadata
        .get("step")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::corrupt(path, "its metadata has no valid 'step'"))?;
    let (mut m, mut v) = (BTreeMap::new(), BTreeMap::new());
    for (name, t) in file.tensors {
        let (map, param) = if let Some(p) = name.strip_prefix("exp_avg_sq.") {
            (&mut v, p)
        } else if let Some(p) = name.strip_prefix("exp_avg.") {
            (&mut m, p)
        } else {
            return Err(Error::UnexpectedTensor {
                path: path.to_path_buf(),
                name,
            });
        };
        // A non-finite moment would make the first resumed update non-finite.
        weights::check_finite(path, &name, &t.data)?;
        map.insert(param.to_string(), t);
    }
    for spec in config.param_specs() {
        for (kind, map) in [("exp_avg", &m), ("exp_avg_sq", &v)] {
            if !map.contains_key(&spec.name) {
                return Err(Error::MissingTensor {
                    path: path.to_path_buf(),
                    name: format!("{kind}.{}", spec.name),
                });
            }
        }
    }
    let opt = OptimizerState { step, m, v };
    opt.validate(config)?;
    Ok(opt)
}

/// Reads a `config.json` (Hugging Face's GPT-2 form).
pub fn read_config(path: &Path) -> Result<GptConfig> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile {
            path: path.to_path_buf(),
            what: "config.json",
        },
        _ => Error::io(path, e),
    })?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    config::from_hf_json(&v)
}

fn require(path: PathBuf, what: &'static str) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingFile { path, what })
    }
}

/// Loads the checkpoint in `dir`: weights always, optimizer and trainer state when present
/// (both or neither). Restores a checkpoint a crash left under its `.old-` name first.
pub fn load_checkpoint(dir: &Path) -> Result<Checkpoint> {
    atomic::recover_dir(dir, false)?;
    if !dir.is_dir() {
        return Err(Error::MissingFile {
            path: dir.to_path_buf(),
            what: "checkpoint directory",
        });
    }
    let config = read_config(&require(dir.join(CONFIG_FILE), "config.json")?)?;
    let params = load_weights(&require(dir.join(MODEL_FILE), "model weights")?, &config)?;
    let (opt_path, trainer_path) = (dir.join(OPTIMIZER_FILE), dir.join(TRAINER_FILE));
    let (optimizer, trainer) = match (opt_path.is_file(), trainer_path.is_file()) {
        (false, false) => (None, None),
        (true, true) => {
            let opt = read_optimizer(&opt_path, &config)?;
            let bytes = std::fs::read(&trainer_path).map_err(|e| Error::io(&trainer_path, e))?;
            let trainer: TrainerState =
                serde_json::from_slice(&bytes).map_err(|source| Error::Json {
                    path: trainer_path.clone(),
                    source,
                })?;
            if trainer.format != TRAINER_FORMAT {
                return Err(Error::corrupt(
                    &trainer_path,
                    format!(
                        "format {} is not the supported {TRAINER_FORMAT}",
                        trainer.format
                    ),
                ));
            }
            if trainer.model != config {
                return Err(Error::corrupt(
                    &trainer_path,
                    "its model config differs from config.json",
                ));
            }
            if trainer.step != opt.step {
                return Err(Error::corrupt(
                    &trainer_path,
                    format!(
                        "step {} but the optimizer is at step {}",
                        trainer.step, opt.step
                    ),
                ));
            }
            (Some(opt), Some(trainer))
        }
        (has_opt, _) => {
            let missing = if has_opt { trainer_path } else { opt_path };
            return Err(Error::MissingFile {
                path: missing,
                what: "half of the resume state (optimizer.safetensors and trainer_state.json go together)",
            });
        }
    };
    Ok(Checkpoint {
        params,
        optimizer,
        trainer,
    })
}

/// Loads published or exported GPT-2 weights: `path` is a directory with `config.json` and
/// `model.safetensors`, or a safetensors file (its config from `config`, else from the
/// `config.json` beside it).
pub fn load_pretrained(path: &Path, config: Option<&GptConfig>) -> Result<ParamStore> {
    if !path.exists() {
        atomic::recover_dir(path, false)?;
    }
    let (file, dir) = if path.is_dir() {
        (require(path.join(MODEL_FILE), "model weights")?, path)
    } else {
        (
            require(path.to_path_buf(), "model weights")?,
            atomic::parent_dir(path),
        )
    };
    let config = match config {
        Some(c) => c.clone(),
        None => read_config(&dir.join(CONFIG_FILE))?,
    };
    load_weights(&file, &config)
}
