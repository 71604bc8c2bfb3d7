//! GPT-2 weights in Hugging Face's safetensors files: reading, with every check a published
//! or hand-made file needs, and writing, so that `transformers` loads what Helios trained.
//!
//! Reading accepts names with or without the `transformer.` prefix, an `lm_head.weight` that
//! is present (and equal to `wte.weight`: the head is tied) or absent, skips the causal-mask
//! buffers `attn.bias` / `attn.masked_bias` older files carry, and widens F32/F16/BF16 (and
//! F64) to f32. Writing uses the names `GPT2LMHeadModel.save_pretrained` writes (with the
//! `transformer.` prefix, no `lm_head.weight`, metadata `format = pt`, which `from_pretrained`
//! requires), in F32, F16 or BF16. Shapes are Hugging Face's in both directions (Conv1D
//! weights [in, out]); see `config.rs`.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use helios::DType;
use safetensors::{Dtype, SafeTensorError, SafeTensors};

use crate::config::GptConfig;
use crate::params::{check_shape, HostTensor, ParamStore};
use crate::{atomic, Error, Result};

/// The prefix `GPT2LMHeadModel` puts before `GPT2Model`'s parameter names.
pub const HF_PREFIX: &str = "transformer.";

/// A safetensors file's tensors (widened to f32) and its `__metadata__`.
pub struct TensorFile {
    pub tensors: BTreeMap<String, HostTensor>,
    pub metadata: HashMap<String, String>,
}

/// Reads every tensor of a safetensors file as f32. Integer tensors are refused
/// (`UnsupportedDtype`); `with_file` gives raw access to those.
pub fn read_tensors(path: &Path) -> Result<TensorFile> {
    with_file(path, |st, metadata| {
        let mut tensors = BTreeMap::new();
        for (name, view) in st.iter() {
            let data = to_f32(name, view.dtype(), view.data())?;
            tensors.insert(
                name.to_string(),
                HostTensor {
                    shape: view.shape().to_vec(),
                    data,
                },
            );
        }
        Ok(TensorFile { tensors, metadata })
    })
}

/// Runs `f` on the parsed, memory-mapped safetensors file at `path`.
pub fn with_file<T>(
    path: &Path,
    f: impl FnOnce(&SafeTensors<'_>, HashMap<String, String>) -> Result<T>,
) -> Result<T> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only private mapping; Helios replaces checkpoint files by rename, never
    // in place, so the mapped bytes do not change under us.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let (_, meta) = SafeTensors::read_metadata(&map).map_err(|e| corrupt(path, e))?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    let st = SafeTensors::deserialize(&map).map_err(|e| corrupt(path, e))?;
    f(&st, metadata)
}

fn corrupt(path: &Path, e: SafeTensorError) -> Error {
    match e {
        SafeTensorError::IoError(io) => Error::io(path, io),
        e => Error::corrupt(path, format!("not a valid safetensors file: {e}")),
    }
}

/// Little-endian `bytes` of `dtype` as f32.
fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()) as f32)
            .collect(),
        other => {
            return Err(Error::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    })
}

/// Fails on the first NaN or infinity in `data`, tensor `name` of the file at `path`: a
/// non-finite weight or moment makes the first step's loss or norm non-finite, and the run
/// would stop there blaming the learning rate.
pub(crate) fn check_finite(path: &Path, name: &str, data: &[f32]) -> Result<()> {
    let Some(index) = data.iter().position(|v| !v.is_finite()) else {
        return Ok(());
    };
    Err(Error::NonFiniteTensor {
        path: path.to_path_buf(),
        name: name.to_string(),
        index,
        value: data[index],
        count: data[index..].iter().filter(|v| !v.is_finite()).count(),
    })
}

/// The name of a GPT-2 parameter in a file, without prefix; `None` for tensors to skip (the
/// causal-mask buffers).
fn canonical_name(name: &str) -> Option<&str> {
    let name = name.strip_prefix(HF_PREFIX).unwrap_or(name);
    if name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") {
        return None;
    }
    Some(name)
}

/// Loads the GPT-2 weights of `config` from the safetensors file at `path`, checking every
/// name, shape and dtype, and that every value is finite; the file may be f32, f16 or bf16.
pub fn load_weights(path: &Path, config: &GptConfig) -> Result<ParamStore> {
    config.validate()?;
    let specs = config.param_specs();
    with_file(path, |st, _| {
        // Index the file by canonical name, refusing strangers before converting anything.
        let mut by_name: HashMap<&str, &str> = HashMap::new(); // canonical -> stored name
        let mut head = None;
        for stored in st.names() {
            let Some(name) = canonical_name(stored) else {
                continue;
            };
            if name == "lm_head.weight" {
                head = Some(stored);
            } else if specs.iter().any(|s| s.name == name) {
                if let Some(first) = by_name.insert(name, stored) {
                    return Err(Error::corrupt(
                        path,
                        format!("it holds '{name}' twice, as '{first}' and '{stored}'"),
                    ));
                }
            } else {
                return Err(Error::UnexpectedTensor {
                    path: path.to_path_buf(),
                    name: stored.to_string(),
                });
            }
        }
        // A file with only the head (no wte) is the same tied tensor under the other name.
        if !by_name.contains_key("wte.weight") {
            if let Some(h) = head.take() {
                by_name.insert("wte.weight", h);
            }
        }
        let mut tensors = BTreeMap::new();
        for spec in &specs {
            let stored = by_name
                .get(spec.name.as_str())
                .ok_or_else(|| Error::MissingTensor {
                    path: path.to_path_buf(),
                    name: spec.name.clone(),
                })?;
            let view = st.tensor(stored).map_err(|e| corrupt(path, e))?;
            if spec.name == "wte.weight"
                && view.shape().len() == 2
                && view.shape()[1] == config.n_embd
                && view.shape()[0] != config.vocab_size
            {
                return Err(Error::VocabMismatch {
                    what: format!("the checkpoint's wte.weight ({})", path.display()),
                    expected: config.vocab_size,
                    got: view.shape()[0],
                });
            }
            check_shape(spec, view.shape())?;
            let data = to_f32(stored, view.dtype(), view.data())?;
            check_finite(path, stored, &data)?;
            tensors.insert(
                spec.name.clone(),
                HostTensor {
                    shape: spec.shape.clone(),
                    data,
                },
            );
        }
        if let Some(h) = head {
            let view = st.tensor(h).map_err(|e| corrupt(path, e))?;
            let wte = &tensors["wte.weight"];
            // Bitwise, so that a NaN in a tied pair still counts as equal.
            let same = view.shape() == wte.shape.as_slice()
                && to_f32(h, view.dtype(), view.data())?
                    .iter()
                    .zip(&wte.data)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            if !same {
                return Err(Error::UntiedHead {
                    path: path.to_path_buf(),
                });
            }
        }
        ParamStore::from_tensors(config, tensors)
    })
}

/// One tensor to write, encoded on demand (so a whole model is never encoded at once).
pub(crate) struct Encode<'a> {
    pub(crate) tensor: &'a HostTensor,
    pub(crate) dtype: DType,
}

/// The safetensors dtype of a Helios dtype.
fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
    }
}

impl safetensors::View for Encode<'_> {
    fn dtype(&self) -> Dtype {
        st_dtype(self.dtype)
    }
    fn shape(&self) -> &[usize] {
        &self.tensor.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        #[cfg(test)]
        crate::atomic::fail_point::tensor_written();
        let d = &self.tensor.data;
        Cow::Owned(match self.dtype {
            DType::F32 => d.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => d
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            DType::BF16 => d
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        })
    }
    fn data_len(&self) -> usize {
        self.tensor.data.len() * self.dtype.size()
    }
}

/// Writes `tensors` (name -> tensor, stored as `dtype`) with `metadata` to `path`, flushed to
/// disk, not atomically: callers write to a staging name (see `save_weights`).
pub(crate) fn write_tensors<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (String, &'a HostTensor)>,
    dtype: DType,
    metadata: HashMap<String, String>,
) -> Result<()> {
    let views = tensors
        .into_iter()
        .map(|(name, tensor)| (name, Encode { tensor, dtype }));
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| match e {
        SafeTensorError::IoError(io) => Error::io(path, io),
        e => Error::Params(format!("writing {}: {e}", path.display())),
    })?;
    // The safetensors crate writes through a private temporary file (mode 0600); give the
    // result the usual permissions of a saved model.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| Error::io(path, e))?;
    }
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    f.sync_all().map_err(|e| Error::io(path, e))
}

/// The metadata `from_pretrained` requires of a safetensors file.
pub(crate) fn hf_metadata() -> HashMap<String, String> {
    HashMap::from([("format".to_string(), "pt".to_string())])
}

/// `store`'s tensors under the names `GPT2LMHeadModel.save_pretrained` writes.
pub(crate) fn hf_named(store: &ParamStore) -> impl Iterator<Item = (String, &HostTensor)> {
    store
        .iter()
        .map(|(s, t)| (format!("{HF_PREFIX}{}", s.name), t))
}

/// Saves `store` to the safetensors file `path` as `dtype`, atomically (the old file stays
/// whole until the new one is on disk).
pub fn save_weights(path: &Path, store: &ParamStore, dtype: DType) -> Result<()> {
    let staged = atomic::temp_sibling(path, "tmp");
    let result = write_tensors(&staged, hf_named(store), dtype, hf_metadata()).and_then(|()| {
        std::fs::rename(&staged, path).map_err(|e| Error::io(path, e))?;
        atomic::sync_dir(atomic::parent_dir(path))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&staged);
    }
    result
}
