//! `GptConfig`: the shape of a GPT-2 model, its presets, and the list of its parameters.
//!
//! The parameter list (`param_specs`) is the single source of truth for names, shapes and
//! weight decay: checkpoints, the host parameter store and the optimizer all walk it in the
//! same order (Hugging Face's `named_parameters()` order). Names are Hugging Face's without
//! the `transformer.` prefix, and shapes are Hugging Face's too: GPT-2's `Conv1D` stores its
//! weight as [in, out], and Helios keeps that layout in memory, so a linear layer is the plain
//! row-major matmul `y (N, out) = x (N, in) @ w (in, out) + b (out)` with no transpose. The
//! output head is tied: `logits (N, V) = x (N, C) @ wte^T`, with `wte` stored (V, C).

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// GPT-2's layer norm epsilon.
pub const GPT2_LAYER_NORM_EPS: f32 = 1e-5;
/// GPT-2's vocabulary: 50,000 BPE merges, 256 byte tokens and `<|endoftext|>`.
pub const GPT2_VOCAB_SIZE: usize = 50257;
/// The id of `<|endoftext|>` in GPT-2's vocabulary.
pub const GPT2_EOT: u32 = 50256;

/// The shape of a GPT-2 model. Activation is GELU (tanh approximation), the MLP is 4×C wide,
/// attention is causal with 1/sqrt(head_dim) scaling, the head is tied to `wte`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    /// Transformer blocks (L).
    pub n_layer: usize,
    /// Attention heads per block (NH); `n_embd` must be a multiple of it.
    pub n_head: usize,
    /// Channels of the residual stream (C).
    pub n_embd: usize,
    /// Tokens in the vocabulary (V); rows of `wte`.
    pub vocab_size: usize,
    /// Longest sequence (maxT); rows of `wpe`. Hugging Face calls it `n_positions`.
    pub block_size: usize,
    /// Layer norm epsilon (`layer_norm_epsilon` in Hugging Face).
    pub layer_norm_eps: f32,
}

/// The presets, by name: (name, description).
pub const PRESETS: [(&str, &str); 4] = [
    (
        "tiny",
        "4 layers, 4 heads, 128 channels, 128 positions, GPT-2 vocabulary (7.2M parameters)",
    ),
    ("distilgpt2", "6 layers, 12 heads, 768 channels (82M)"),
    ("gpt2", "12 layers, 12 heads, 768 channels (124M)"),
    ("gpt2-medium", "24 layers, 16 heads, 1024 channels (355M)"),
];

impl Default for GptConfig {
    fn default() -> Self {
        GptConfig::tiny()
    }
}

impl GptConfig {
    /// Small enough to train visibly on a CPU Vulkan driver (lavapipe) in minutes. It keeps
    /// GPT-2's vocabulary so that the bundled tokenizer and published checkpoints' tokens
    /// apply as they are; the embedding (6.4M of its 7.2M parameters) and the head's matmul
    /// dominate its cost, which is the price of a real vocabulary.
    pub fn tiny() -> Self {
        GptConfig::gpt2_shaped(4, 4, 128, 128)
    }

    /// distilgpt2: 6 layers of GPT-2 small.
    pub fn distilgpt2() -> Self {
        GptConfig::gpt2_shaped(6, 12, 768, 1024)
    }

    /// GPT-2 small, 124M parameters.
    pub fn gpt2() -> Self {
        GptConfig::gpt2_shaped(12, 12, 768, 1024)
    }

    /// GPT-2 medium, 355M parameters.
    pub fn gpt2_medium() -> Self {
        GptConfig::gpt2_shaped(24, 16, 1024, 1024)
    }

    fn gpt2_shaped(n_layer: usize, n_head: usize, n_embd: usize, block_size: usize) -> Self {
        GptConfig {
            n_layer,
            n_head,
            n_embd,
            vocab_size: GPT2_VOCAB_SIZE,
            block_size,
            layer_norm_eps: GPT2_LAYER_NORM_EPS,
        }
    }

    /// The preset called `name` (see `PRESETS`).
    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "tiny" => Ok(GptConfig::tiny()),
            "distilgpt2" => Ok(GptConfig::distilgpt2()),
            "gpt2" => Ok(GptConfig::gpt2()),
            "gpt2-medium" => Ok(GptConfig::gpt2_medium()),
            _ => Err(Error::UnknownPreset(name.to_string())),
        }
    }

    /// Checks every field; the message names the field and the fix.
    pub fn validate(&self) -> Result<()> {
        let fields = [
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
        ];
        for (name, v) in fields {
            if v == 0 {
                return Err(Error::Config(format!("{name} is 0; it must be at least 1")));
            }
        }
        if self.n_embd % self.n_head != 0 {
            return Err(Error::Config(format!(
                "n_embd ({}) is not a multiple of n_head ({}); each head gets n_embd/n_head channels",
                self.n_embd, self.n_head
            )));
        }
        if self.vocab_size > u32::MAX as usize {
            return Err(Error::Config(format!(
                "vocab_size {} does not fit token ids of 32 bits",
                self.vocab_size
            )));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return Err(Error::Config(format!(
                "layer_norm_eps is {}; it must be a small positive number such as 1e-5",
                self.layer_norm_eps
            )));
        }
        // Every tensor's element count must fit a usize, so that no shape product overflows.
        let widest = 4usize
            .checked_mul(self.n_embd)
            .and_then(|w| w.checked_mul(self.n_embd.max(self.vocab_size)))
            .and_then(|w| w.checked_mul(self.n_layer.max(1)));
        if widest.is_none() {
            return Err(Error::Config("the model is too large to address".into()));
        }
        Ok(())
    }

    /// Channels per attention head (HS = C / NH).
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// Every parameter, in Hugging Face's order (see the module header for the layout).
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let (c, v, t) = (self.n_embd, self.vocab_size, self.block_size);
        let mut specs = Vec::with_capacity(4 + 12 * self.n_layer);
        specs.push(ParamSpec::new("wte.weight".into(), vec![v, c])); // (V, C), also the head
        specs.push(ParamSpec::new("wpe.weight".into(), vec![t, c])); // (maxT, C)
        for l in 0..self.n_layer {
            let p = |s: &str| format!("h.{l}.{s}");
            specs.push(ParamSpec::new(p("ln_1.weight"), vec![c])); // (C)
            specs.push(ParamSpec::new(p("ln_1.bias"), vec![c])); // (C)
            specs.push(ParamSpec::new(p("attn.c_attn.weight"), vec![c, 3 * c])); // (C, 3C): q|k|v
            specs.push(ParamSpec::new(p("attn.c_attn.bias"), vec![3 * c])); // (3C)
            specs.push(ParamSpec::new(p("attn.c_proj.weight"), vec![c, c])); // (C, C)
            specs.push(ParamSpec::new(p("attn.c_proj.bias"), vec![c])); // (C)
            specs.push(ParamSpec::new(p("ln_2.weight"), vec![c])); // (C)
            specs.push(ParamSpec::new(p("ln_2.bias"), vec![c])); // (C)
            specs.push(ParamSpec::new(p("mlp.c_fc.weight"), vec![c, 4 * c])); // (C, 4C)
            specs.push(ParamSpec::new(p("mlp.c_fc.bias"), vec![4 * c])); // (4C)
            specs.push(ParamSpec::new(p("mlp.c_proj.weight"), vec![4 * c, c])); // (4C, C)
            specs.push(ParamSpec::new(p("mlp.c_proj.bias"), vec![c])); // (C)
        }
        specs.push(ParamSpec::new("ln_f.weight".into(), vec![c])); // (C)
        specs.push(ParamSpec::new("ln_f.bias".into(), vec![c])); // (C)
        specs
    }

    /// Parameters, the tied head counted once (GPT-2 small: 124,439,808).
    pub fn num_params(&self) -> usize {
        self.param_specs().iter().map(ParamSpec::len).sum()
    }

    /// Parameters outside the two embeddings (the convention of scaling-law papers).
    pub fn num_params_non_embedding(&self) -> usize {
        self.num_params() - (self.vocab_size + self.block_size) * self.n_embd
    }
}

impl std::str::FromStr for GptConfig {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        GptConfig::preset(s)
    }
}

/// One parameter: its Hugging Face name (no `transformer.` prefix), shape, and whether AdamW
/// decays it (matrices do; biases and layer norm gains do not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub weight_decay: bool,
}

impl ParamSpec {
    fn new(name: String, shape: Vec<usize>) -> Self {
        let weight_decay = shape.len() >= 2;
        ParamSpec {
            name,
            shape,
            weight_decay,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// ---------------------------------------------------------------------------------------------
// Hugging Face config.json

/// What `config.json` must say for Hugging Face `transformers` to build the same model.
/// Dropout is written as GPT-2's defaults (0.1), which matter only if training continues in
/// `transformers`: Helios itself trains without dropout.
pub fn to_hf_json(cfg: &GptConfig) -> serde_json::Value {
    // GPT-2's <|endoftext|> exists only in a vocabulary that reaches it.
    let eot = (cfg.vocab_size > GPT2_EOT as usize).then_some(GPT2_EOT);
    serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": null,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "scale_attn_by_inverse_layer_idx": false,
        "reorder_and_upcast_attn": false,
        "use_cache": true,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "tie_word_embeddings": true,
        "torch_dtype": "float32",
    })
}

/// Reads a Hugging Face GPT-2 `config.json` value, refusing variants Helios does not build
/// (another activation, an MLP not 4×C wide, per-layer attention scaling).
pub fn from_hf_json(v: &serde_json::Value) -> Result<GptConfig> {
    let get = |key: &str, default: Option<usize>| -> Result<usize> {
        match v.get(key) {
            Some(x) => x
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| Error::Config(format!("config.json: '{key}' is not an integer"))),
            None => default.ok_or_else(|| Error::Config(format!("config.json has no '{key}'"))),
        }
    };
    if let Some(t) = v.get("model_type").and_then(|t| t.as_str()) {
        if t != "gpt2" {
            return Err(Error::Config(format!(
                "config.json describes a '{t}' model; only model_type 'gpt2' is supported"
            )));
        }
    }
    let cfg = GptConfig {
        n_layer: get("n_layer", Some(12))?,
        n_head: get("n_head", Some(12))?,
        n_embd: get("n_embd", Some(768))?,
        vocab_size: get("vocab_size", Some(GPT2_VOCAB_SIZE))?,
        block_size: get("n_positions", Some(1024))?,
        layer_norm_eps: v
            .get("layer_norm_epsilon")
            .and_then(|e| e.as_f64())
            .unwrap_or(GPT2_LAYER_NORM_EPS as f64) as f32,
    };
    if let Some(act) = v.get("activation_function").and_then(|a| a.as_str()) {
        if !matches!(act, "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") {
            return Err(Error::Config(format!(
                "config.json: activation_function '{act}' is not supported; Helios' GPT-2 uses GELU with the tanh approximation (gelu_new)"
            )));
        }
    }
    if let Some(inner) = v.get("n_inner").and_then(|i| i.as_u64()) {
        if inner as usize != 4 * cfg.n_embd {
            return Err(Error::Config(format!(
                "config.json: n_inner {inner} is not 4*n_embd ({}); other MLP widths are not supported",
                4 * cfg.n_embd
            )));
        }
    }
    for (key, ok) in [
        ("scale_attn_by_inverse_layer_idx", false),
        ("reorder_and_upcast_attn", false),
        ("scale_attn_weights", true),
        ("tie_word_embeddings", true),
    ] {
        if let Some(b) = v.get(key).and_then(|b| b.as_bool()) {
            if b != ok {
                return Err(Error::Config(format!(
                    "config.json: {key} = {b} is not supported (Helios needs {ok})"
                )));
            }
        }
    }
    cfg.validate()?;
    Ok(cfg)
}
