//! Host-side parameters: `HostTensor` (a shape and f32 values) and `ParamStore`, every GPT-2
//! parameter by its Hugging Face name.
//!
//! The store is the meeting point of checkpoints, initialisation and the device: files load
//! into it and save from it; the trainer uploads it once (`upload`) and downloads it to save
//! (`download`). It always holds exactly the parameters `GptConfig::param_specs` lists, each
//! of its listed shape (checked on every way in), in f32: narrower file or device dtypes are
//! widened on the way in and rounded on the way out.

use std::collections::BTreeMap;

use helios::{DType, Device, Tensor};

use crate::config::{GptConfig, ParamSpec};
use crate::{Error, Result};

/// A dense row-major f32 array on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    /// Row-major values; `data.len()` is the product of `shape`.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// `data` as an array of `shape`; their sizes must agree.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<HostTensor> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(Error::Params(format!(
                "shape {shape:?} holds {n} values, but {} were given",
                data.len()
            )));
        }
        Ok(HostTensor { shape, data })
    }

    pub fn zeros(shape: &[usize]) -> HostTensor {
        let n = shape.iter().product();
        HostTensor {
            shape: shape.to_vec(),
            data: vec![0.0; n],
        }
    }

    pub fn filled(shape: &[usize], value: f32) -> HostTensor {
        let n = shape.iter().product();
        HostTensor {
            shape: shape.to_vec(),
            data: vec![value; n],
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// A device tensor of this shape, stored as `dtype` (values rounded to it).
    pub fn upload(&self, device: &Device, dtype: DType) -> Result<Tensor> {
        Ok(Tensor::from_slice_as(
            device,
            &self.data,
            &self.shape,
            dtype,
        )?)
    }

    /// A device tensor's values (widened to f32), waiting for the work that writes it.
    pub fn download(tensor: &Tensor) -> Result<HostTensor> {
        Ok(HostTensor {
            shape: tensor.shape().to_vec(),
            data: tensor.to_vec()?,
        })
    }

    /// Rounds every value to `dtype` (what a store to that dtype and a load back does).
    pub fn round_to(&mut self, dtype: DType) {
        if dtype != DType::F32 {
            for v in &mut self.data {
                *v = dtype.round(*v);
            }
        }
    }
}

/// Every parameter of a GPT-2 of one configuration, by Hugging Face name (no prefix).
#[derive(Clone, Debug, PartialEq)]
pub struct ParamStore {
    config: GptConfig,
    tensors: BTreeMap<String, HostTensor>,
}

impl ParamStore {
    /// All parameters zero (layer norm gains too).
    pub fn zeros(config: &GptConfig) -> Result<ParamStore> {
        config.validate()?;
        let tensors = config
            .param_specs()
            .into_iter()
            .map(|s| {
                let t = HostTensor::zeros(&s.shape);
                (s.name, t)
            })
            .collect();
        Ok(ParamStore {
            config: config.clone(),
            tensors,
        })
    }

    /// GPT-2's initialisation, reproducible from `seed`: matrices and embeddings N(0, 0.02),
    /// the two residual projections (`attn.c_proj`, `mlp.c_proj`) N(0, 0.02/sqrt(2·L)),
    /// biases 0, layer norm gains 1.
    pub fn init_gpt2(config: &GptConfig, seed: u64) -> Result<ParamStore> {
        let mut store = ParamStore::zeros(config)?;
        let residual_std = 0.02 / (2.0 * config.n_layer as f64).sqrt();
        let mut rng = Normal::new(seed);
        for spec in config.param_specs() {
            let t = store
                .tensors
                .get_mut(&spec.name)
                .expect("store has every spec");
            if spec.name.ends_with("ln_1.weight")
                || spec.name.ends_with("ln_2.weight")
                || spec.name == "ln_f.weight"
            {
                t.data.fill(1.0);
            } else if spec.shape.len() >= 2 {
                let std = if spec.name.ends_with("c_proj.weight") {
                    residual_std
                } else {
                    0.02
                };
                for v in &mut t.data {
                    *v = (rng.sample() * std) as f32;
                }
            }
        }
        Ok(store)
    }

    /// A store from named tensors; every parameter of `config` must be present with its
    /// shape, and nothing else.
    pub fn from_tensors(
        config: &GptConfig,
        tensors: BTreeMap<String, HostTensor>,
    ) -> Result<ParamStore> {
        config.validate()?;
        let specs = config.param_specs();
        for spec in &specs {
            match tensors.get(&spec.name) {
                None => {
                    return Err(Error::Params(format!(
                        "parameter '{}' is missing",
                        spec.name
                    )))
                }
                Some(t) => check_shape(spec, &t.shape)?,
            }
        }
        if tensors.len() != specs.len() {
            let extra = tensors
                .keys()
                .find(|k| !specs.iter().any(|s| &s.name == *k))
                .cloned()
                .unwrap_or_default();
            return Err(Error::Params(format!(
                "'{extra}' is not a parameter of this GPT-2 configuration"
            )));
        }
        Ok(ParamStore {
            config: config.clone(),
            tensors,
        })
    }

    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// The parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.get(name)
    }

    /// Replaces parameter `name` by `t`, which must have its shape.
    pub fn set(&mut self, name: &str, t: HostTensor) -> Result<()> {
        let spec = self
            .config
            .param_specs()
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| Error::Params(format!("'{name}' is not a parameter")))?;
        check_shape(&spec, &t.shape)?;
        self.tensors.insert(spec.name, t);
        Ok(())
    }

    /// (spec, tensor) for every parameter, in Hugging Face order.
    pub fn iter(&self) -> impl Iterator<Item = (ParamSpec, &HostTensor)> + '_ {
        self.config.param_specs().into_iter().map(move |s| {
            let t = &self.tensors[&s.name];
            (s, t)
        })
    }

    /// Every parameter on `device` as `dtype`, in Hugging Face order.
    pub fn upload(&self, device: &Device, dtype: DType) -> Result<Vec<(ParamSpec, Tensor)>> {
        self.iter()
            .map(|(s, t)| Ok((s, t.upload(device, dtype)?)))
            .collect()
    }

    /// Replaces every parameter by the device tensor of the same name (all must be given).
    pub fn download<'a>(
        &mut self,
        tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    ) -> Result<()> {
        let mut fresh = BTreeMap::new();
        for (name, t) in tensors {
            fresh.insert(name.to_string(), HostTensor::download(t)?);
        }
        *self = ParamStore::from_tensors(&self.config, fresh)?;
        Ok(())
    }

    /// Total elements (= `config().num_params()`).
    pub fn num_params(&self) -> usize {
        self.tensors.values().map(HostTensor::len).sum()
    }

    /// The named tensors, consuming the store.
    pub fn into_tensors(self) -> BTreeMap<String, HostTensor> {
        self.tensors
    }
}

pub(crate) fn check_shape(spec: &ParamSpec, got: &[usize]) -> Result<()> {
    if spec.shape != got {
        return Err(Error::WrongShape {
            name: spec.name.clone(),
            expected: spec.shape.clone(),
            got: got.to_vec(),
        });
    }
    Ok(())
}

/// Standard normal samples from SplitMix64 and Box–Muller: reproducible on every platform,
/// no dependency on a random crate's stream staying the same across versions.
struct Normal {
    state: u64,
    spare: Option<f64>,
}

impl Normal {
    fn new(seed: u64) -> Normal {
        Normal {
            state: seed,
            spare: None,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn sample(&mut self) -> f64 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        let (u1, u2) = (self.uniform(), self.uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * theta.sin());
        r * theta.cos()
    }
}
