//! GPT-2 on the device: the parameters as autograd leaves (`GptParams`) and the forward pass
//! as plain functions (`forward`, `block`, `causal_self_attention`), as llm.c writes them;
//! backward comes from `helios`' autograd.
//!
//! The one decision a reader must know: on the device, `attn.c_attn` (weight (C, 3C), bias
//! (3C)) is held as three column pieces, q | k | v, each (C, C) and (C). `helios` cannot yet
//! differentiate `narrow`, so slicing q, k and v out of one (B, T, 3C) product is not
//! possible; three products against the pieces compute the same numbers, and AdamW and the
//! gradient norm are element-wise, so the optimizer sees the same update. Files, the host
//! `ParamStore` and the optimizer state keep Hugging Face's whole tensors: `Piece` says
//! which columns of which parameter each device tensor is, and `to_host` stitches them.
//!
//! Shapes: B batch, T sequence, C channels, H heads, D = C/H, V vocabulary, L layers.

use std::collections::BTreeMap;
use std::ops::Range;

use helios::{Activation, DType, Device, IndexTensor, MatmulOptions, SoftmaxOptions, Tensor};

use crate::config::GptConfig;
use crate::params::{HostTensor, ParamStore};
use crate::{Error, Result};

/// Device tensors per transformer block (c_attn's weight and bias are 3 pieces each).
const PIECES_PER_BLOCK: usize = 16;

/// One device tensor: columns `cols` of the last axis of the Hugging Face parameter `name`
/// (the whole parameter when `cols` is `None`).
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub name: String,
    pub cols: Option<Range<usize>>,
    /// The device tensor's shape.
    pub shape: Vec<usize>,
    /// AdamW decays it (the matrices).
    pub weight_decay: bool,
}

/// The device tensors of a configuration, in the order `GptParams` holds them.
pub fn pieces(config: &GptConfig) -> Vec<Piece> {
    let c = config.n_embd;
    let mut out = Vec::with_capacity(4 + PIECES_PER_BLOCK * config.n_layer);
    for spec in config.param_specs() {
        if spec.name.ends_with("attn.c_attn.weight") || spec.name.ends_with("attn.c_attn.bias") {
            for i in 0..3 {
                let mut shape = spec.shape.clone();
                *shape.last_mut().expect("c_attn has an axis") = c;
                out.push(Piece {
                    name: spec.name.clone(),
                    cols: Some(i * c..(i + 1) * c),
                    shape,
                    weight_decay: spec.weight_decay,
                });
            }
        } else {
            out.push(Piece {
                name: spec.name,
                cols: None,
                shape: spec.shape,
                weight_decay: spec.weight_decay,
            });
        }
    }
    out
}

/// Columns `cols` of the last axis of `t`.
fn take_cols(t: &HostTensor, cols: &Range<usize>, shape: &[usize]) -> HostTensor {
    let width = *t.shape.last().expect("a piece has an axis");
    let data = t
        .data
        .chunks_exact(width)
        .flat_map(|row| row[cols.clone()].iter().copied())
        .collect();
    HostTensor {
        shape: shape.to_vec(),
        data,
    }
}

/// The host tensors (Hugging Face names and shapes) that `tensors`, one per piece of
/// `config`, are pieces of.
pub fn to_host(config: &GptConfig, tensors: &[HostTensor]) -> Result<BTreeMap<String, HostTensor>> {
    let pieces = pieces(config);
    if pieces.len() != tensors.len() {
        return Err(Error::Params(format!(
            "{} device tensors given for {} pieces",
            tensors.len(),
            pieces.len()
        )));
    }
    let mut out: BTreeMap<String, HostTensor> = BTreeMap::new();
    let specs: BTreeMap<String, Vec<usize>> = config
        .param_specs()
        .into_iter()
        .map(|s| (s.name, s.shape))
        .collect();
    for (p, t) in pieces.iter().zip(tensors) {
        if t.shape != p.shape {
            return Err(Error::WrongShape {
                name: p.name.clone(),
                expected: p.shape.clone(),
                got: t.shape.clone(),
            });
        }
        match &p.cols {
            None => {
                out.insert(p.name.clone(), t.clone());
            }
            Some(cols) => {
                let full = out
                    .entry(p.name.clone())
                    .or_insert_with(|| HostTensor::zeros(&specs[&p.name]));
                let width = *full.shape.last().expect("c_attn has an axis");
                let piece_width = cols.len();
                for (dst, src) in full
                    .data
                    .chunks_exact_mut(width)
                    .zip(t.data.chunks_exact(piece_width))
                {
                    dst[cols.clone()].copy_from_slice(src);
                }
            }
        }
    }
    Ok(out)
}

/// The piece tensors (host) of named Hugging Face tensors, in piece order.
pub fn from_host(
    config: &GptConfig,
    tensors: &BTreeMap<String, HostTensor>,
) -> Result<Vec<HostTensor>> {
    pieces(config)
        .iter()
        .map(|p| {
            let t = tensors
                .get(&p.name)
                .ok_or_else(|| Error::Params(format!("parameter '{}' is missing", p.name)))?;
            Ok(match &p.cols {
                None => t.clone(),
                Some(cols) => take_cols(t, cols, &p.shape),
            })
        })
        .collect()
}

/// GPT-2's parameters on a device, one leaf tensor per `Piece` (see the module header).
pub struct GptParams {
    config: GptConfig,
    /// One per `pieces(config)`, same order and shapes.
    tensors: Vec<Tensor>,
}

/// The parameters one block reads.
struct Block<'a> {
    ln_1_w: &'a Tensor,     // (C)
    ln_1_b: &'a Tensor,     // (C)
    qkv_w: [&'a Tensor; 3], // 3 x (C, C): columns of c_attn.weight
    qkv_b: [&'a Tensor; 3], // 3 x (C)
    proj_w: &'a Tensor,     // (C, C)
    proj_b: &'a Tensor,     // (C)
    ln_2_w: &'a Tensor,     // (C)
    ln_2_b: &'a Tensor,     // (C)
    fc_w: &'a Tensor,       // (C, 4C)
    fc_b: &'a Tensor,       // (4C)
    fc_proj_w: &'a Tensor,  // (4C, C)
    fc_proj_b: &'a Tensor,  // (C)
}

impl GptParams {
    /// `store` on `device` as `dtype`, every tensor a leaf that accumulates a gradient.
    pub fn upload(store: &ParamStore, device: &Device, dtype: DType) -> Result<GptParams> {
        let config = store.config().clone();
        let named: BTreeMap<String, HostTensor> =
            store.iter().map(|(s, t)| (s.name, t.clone())).collect();
        let host = from_host(&config, &named)?;
        let tensors = host
            .iter()
            .map(|t| Ok(t.upload(device, dtype)?.requires_grad_()))
            .collect::<Result<Vec<_>>>()?;
        Ok(GptParams { config, tensors })
    }

    /// Wraps tensors made elsewhere (one per piece, e.g. bf16 copies of f32 masters), each
    /// made a gradient leaf.
    pub fn from_tensors(config: &GptConfig, tensors: Vec<Tensor>) -> Result<GptParams> {
        let pieces = pieces(config);
        if pieces.len() != tensors.len() {
            return Err(Error::Params(format!(
                "{} tensors given for {} pieces",
                tensors.len(),
                pieces.len()
            )));
        }
        for (p, t) in pieces.iter().zip(&tensors) {
            if p.shape != t.shape() {
                return Err(Error::WrongShape {
                    name: p.name.clone(),
                    expected: p.shape.clone(),
                    got: t.shape().to_vec(),
                });
            }
        }
        let tensors = tensors.into_iter().map(|t| t.requires_grad_()).collect();
        Ok(GptParams {
            config: config.clone(),
            tensors,
        })
    }

    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// The device tensors, one per `pieces(config)`.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The parameters as a host store (f32, Hugging Face names and shapes).
    pub fn download(&self) -> Result<ParamStore> {
        let host = self
            .tensors
            .iter()
            .map(HostTensor::download)
            .collect::<Result<Vec<_>>>()?;
        ParamStore::from_tensors(&self.config, to_host(&self.config, &host)?)
    }

    /// The accumulated gradients as host tensors by Hugging Face name (zeros where no
    /// gradient reached a parameter).
    pub fn grads_to_host(&self) -> Result<BTreeMap<String, HostTensor>> {
        let host = self
            .tensors
            .iter()
            .map(|t| match t.grad() {
                Some(g) => HostTensor::download(&g),
                None => Ok(HostTensor::zeros(t.shape())),
            })
            .collect::<Result<Vec<_>>>()?;
        to_host(&self.config, &host)
    }

    /// Forgets every accumulated gradient.
    pub fn zero_grad(&self) {
        self.tensors.iter().for_each(Tensor::zero_grad);
    }

    fn wte(&self) -> &Tensor {
        &self.tensors[0] // (V, C)
    }

    fn wpe(&self) -> &Tensor {
        &self.tensors[1] // (maxT, C)
    }

    fn ln_f(&self) -> (&Tensor, &Tensor) {
        let n = self.tensors.len();
        (&self.tensors[n - 2], &self.tensors[n - 1]) // (C), (C)
    }

    fn block(&self, l: usize) -> Block<'_> {
        let start = 2 + PIECES_PER_BLOCK * l;
        let [ln_1_w, ln_1_b, q_w, k_w, v_w, q_b, k_b, v_b, proj_w, proj_b, ln_2_w, ln_2_b, fc_w, fc_b, fc_proj_w, fc_proj_b] =
            &self.tensors[start..start + PIECES_PER_BLOCK]
        else {
            unreachable!("a block has {PIECES_PER_BLOCK} pieces");
        };
        Block {
            ln_1_w,
            ln_1_b,
            qkv_w: [q_w, k_w, v_w],
            qkv_b: [q_b, k_b, v_b],
            proj_w,
            proj_b,
            ln_2_w,
            ln_2_b,
            fc_w,
            fc_b,
            fc_proj_w,
            fc_proj_b,
        }
    }
}

/// Token ids (B, T) and positions 0..T as device index tensors, after checking them against
/// the model (every id below V, T at most the model's block size).
pub fn inputs(
    config: &GptConfig,
    device: &Device,
    ids: &[u32],
    batch: usize,
    seq: usize,
) -> Result<(IndexTensor, IndexTensor)> {
    if seq == 0 || seq > config.block_size {
        return Err(Error::Config(format!(
            "sequence length {seq} must be between 1 and the model's block size {}",
            config.block_size
        )));
    }
    if ids.len() != batch * seq {
        return Err(Error::Params(format!(
            "{} token ids given for a batch of {batch}x{seq}",
            ids.len()
        )));
    }
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= config.vocab_size) {
        return Err(Error::VocabMismatch {
            what: format!("the input (token id {bad})"),
            expected: config.vocab_size,
            got: bad as usize + 1,
        });
    }
    let positions: Vec<u32> = (0..seq as u32).collect();
    Ok((
        IndexTensor::from_slice(device, ids, &[batch, seq])?, // (B, T)
        IndexTensor::from_slice(device, &positions, &[seq])?, // (T)
    ))
}

/// GPT-2's forward pass: logits (B, T, V) for token ids `idx` (B, T) at positions `pos` (T).
pub fn forward(p: &GptParams, idx: &IndexTensor, pos: &IndexTensor) -> Result<Tensor> {
    head(p, &hidden(p, idx, pos)?)
}

/// The logits (B, V) of the last position only: what generation needs, without the
/// (B, T, V) product that dominates a forward pass at GPT-2's vocabulary.
pub fn forward_last(p: &GptParams, idx: &IndexTensor, pos: &IndexTensor) -> Result<Tensor> {
    let h = hidden(p, idx, pos)?; // (B, T, C)
    let &[b, t, c] = h.shape() else {
        unreachable!("hidden states are (B, T, C)")
    };
    let last = h.narrow(1, t - 1, 1)?.reshape(&[b, c])?; // (B, C)
    head(p, &last) // (B, V)
}

/// The tied head: logits (..., V) = h (..., C) @ wte^T, wte read in place through a
/// transposed view.
pub fn head(p: &GptParams, h: &Tensor) -> Result<Tensor> {
    Ok(h.matmul(&p.wte().transpose(0, 1)?)?)
}

/// Everything before the head: the final layer norm's output (B, T, C).
pub fn hidden(p: &GptParams, idx: &IndexTensor, pos: &IndexTensor) -> Result<Tensor> {
    let cfg = &p.config;
    let tok = p.wte().embedding(idx)?; // (B, T, C)
    let wpe = p.wpe().embedding(pos)?; // (T, C)
    let mut x = tok.add(&wpe)?; // (B, T, C), the residual stream
    for l in 0..cfg.n_layer {
        x = block(&p.block(l), &x, cfg)?; // (B, T, C)
    }
    let (ln_f_w, ln_f_b) = p.ln_f();
    Ok(x.layer_norm(ln_f_w, ln_f_b, cfg.layer_norm_eps)?.y) // (B, T, C)
}

/// The mean cross-entropy of `logits` (B, T, V) against `targets` (B, T): a (1,) tensor.
pub fn loss(logits: &Tensor, targets: &IndexTensor) -> Result<Tensor> {
    Ok(logits.cross_entropy(targets, None)?.loss)
}

/// One pre-LN transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)). x is (B, T, C).
fn block(w: &Block, x: &Tensor, cfg: &GptConfig) -> Result<Tensor> {
    let eps = cfg.layer_norm_eps;
    let h = x.layer_norm(w.ln_1_w, w.ln_1_b, eps)?.y; // (B, T, C)
    let linear = |x: &Tensor, w: &Tensor, b: &Tensor| {
        x.matmul_opts(
            w,
            &MatmulOptions {
                bias: Some(b),
                ..MatmulOptions::default()
            },
        )
    };
    let q = linear(&h, w.qkv_w[0], w.qkv_b[0])?; // (B, T, C)
    let k = linear(&h, w.qkv_w[1], w.qkv_b[1])?; // (B, T, C)
    let v = linear(&h, w.qkv_w[2], w.qkv_b[2])?; // (B, T, C)
    let a = causal_self_attention(&q, &k, &v, cfg.n_head)?; // (B, T, C)
    let x = a.matmul_opts(
        w.proj_w,
        &MatmulOptions {
            bias: Some(w.proj_b),
            residual: Some(x),
            ..MatmulOptions::default()
        },
    )?; // (B, T, C)
    let h = x.layer_norm(w.ln_2_w, w.ln_2_b, eps)?.y; // (B, T, C)
    let f = h.matmul_opts(
        w.fc_w,
        &MatmulOptions {
            bias: Some(w.fc_b),
            act: Activation::GeluTanh,
            ..MatmulOptions::default()
        },
    )?; // (B, T, 4C)
    Ok(f.matmul_opts(
        w.fc_proj_w,
        &MatmulOptions {
            bias: Some(w.fc_proj_b),
            residual: Some(&x),
            ..MatmulOptions::default()
        },
    )?) // (B, T, C)
}

/// Causal self-attention of `n_head` heads: q, k, v (B, T, C) → (B, T, C), each position
/// attending to itself and the positions before it, scores scaled by 1/√D.
pub fn causal_self_attention(q: &Tensor, k: &Tensor, v: &Tensor, n_head: usize) -> Result<Tensor> {
    materialised_attention(q, k, v, n_head)
}

/// Attention with the (B, H, T, T) scores stored: the reference form.
pub fn materialised_attention(q: &Tensor, k: &Tensor, v: &Tensor, n_head: usize) -> Result<Tensor> {
    let &[b, t, c] = q.shape() else {
        return Err(Error::Params(format!(
            "attention takes (B, T, C) inputs, got {:?}",
            q.shape()
        )));
    };
    let d = c / n_head;
    let heads = |x: &Tensor| x.reshape(&[b, t, n_head, d]); // (B, T, H, D)
    let q = heads(q)?.permute(&[0, 2, 1, 3])?; // (B, H, T, D)
    let kt = heads(k)?.permute(&[0, 2, 3, 1])?; // (B, H, D, T)
    let v = heads(v)?.permute(&[0, 2, 1, 3])?; // (B, H, T, D)
    let scores = q.matmul(&kt)?; // (B, H, T, T)
    let att = scores.softmax_with(SoftmaxOptions::causal(1.0 / (d as f32).sqrt()))?; // (B, H, T, T)
    let y = att.matmul(&v)?; // (B, H, T, D)
    Ok(y.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c])?) // (B, T, C)
}
