//! GPT-2 on the device: the parameters as autograd leaves (`GptParams`) and the forward pass
//! as plain functions (`forward`, `block`, `causal_self_attention`), as llm.c writes them;
//! backward comes from `helios`' autograd.
//!
//! The one decision a reader must know: parameters keep Hugging Face's shapes on the device
//! too (Conv1D weights [in, out], so a linear layer is `x @ w + b`), one leaf tensor per
//! `GptConfig::param_specs` entry in that order; q, k and v come out of one (B, T, 3C)
//! product and the fused attention kernel reads them in place as views.
//!
//! The one exception is wte, which is (Vp, C) on the device with Vp = `padded_vocab(V)` and
//! rows V..Vp zero: the three head products run on a multiple of 128 rows (GPT-2's 50,257 is
//! odd, which the matmul kernels run much slower: bench/results/source-comment-history.md),
//! the head writes (…, Vp) logits and the cross-entropy reads the first V of each row in place. The
//! padded rows get no gradient (the embedding never reads them; their logit columns are not
//! in the loss), so AdamW keeps them exactly zero. Training runs `forward_loss`, whose
//! cross-entropy hands the (…, Vp) product its gradient directly; `forward` gives users
//! (B, T, V). Everything that leaves the device (`download`, `grads_to_host`, `to_host`)
//! drops the padded rows; everything that arrives (`upload`, `upload_rows`) adds them: host
//! stores, checkpoints and files stay (V, C).
//!
//! Shapes: B batch, T sequence, C channels, H heads, D = C/H, V vocabulary, Vp the padded
//! vocabulary, L layers.

use std::collections::BTreeMap;

use helios::{
    Activation, AttentionOptions, DType, Device, IndexTensor, MatmulOptions, SoftmaxOptions, Tensor,
};

use crate::config::{GptConfig, ParamSpec};
use crate::params::{HostTensor, ParamStore};
use crate::{Error, Result};

/// Device tensors per transformer block.
const PER_BLOCK: usize = 12;

/// The device's wte rows are a multiple of this (as llm.c pads GPT-2's vocabulary).
pub const VOCAB_MULTIPLE: usize = 128;

/// `v` rounded up to a multiple of `VOCAB_MULTIPLE`: the rows of wte on the device.
pub fn padded_vocab(v: usize) -> usize {
    v.next_multiple_of(VOCAB_MULTIPLE)
}

/// Hugging Face's name of the token embedding, tied to the head.
const WTE: &str = "wte.weight";

/// The rows parameter `spec` has on the device: `padded_vocab(V)` for wte (the one
/// parameter with a vocabulary axis), its own first size otherwise.
pub fn device_rows(spec: &ParamSpec) -> usize {
    match spec.name.as_str() {
        WTE => padded_vocab(spec.shape[0]),
        _ => spec.shape.first().copied().unwrap_or(1),
    }
}

/// `t` on `device` as `dtype` with zero rows appended up to `rows` (its first axis): how a
/// host parameter or AdamW moment of Hugging Face's shape becomes its device tensor.
pub fn upload_rows(t: &HostTensor, rows: usize, device: &Device, dtype: DType) -> Result<Tensor> {
    let have = t.shape.first().copied().unwrap_or(1);
    if rows <= have || t.shape.len() < 2 {
        return t.upload(device, dtype);
    }
    let row: usize = t.shape[1..].iter().product();
    let mut shape = t.shape.clone();
    shape[0] = rows;
    let mut data = Vec::with_capacity(rows * row);
    data.extend_from_slice(&t.data);
    data.resize(rows * row, 0.0);
    HostTensor::new(shape, data)?.upload(device, dtype)
}

/// GPT-2's parameters on a device, one leaf tensor per `GptConfig::param_specs` entry, in
/// that order and of those (Hugging Face) shapes, except wte: (Vp, C), rows V..Vp zero (see
/// the module's note).
pub struct GptParams {
    config: GptConfig,
    /// One per `config.param_specs()`; wte (Vp, C) or, from `from_tensors`, (V, C).
    tensors: Vec<Tensor>,
}

/// The parameters one block reads.
pub(crate) struct Block<'a> {
    pub(crate) ln_1_w: &'a Tensor,    // (C)
    pub(crate) ln_1_b: &'a Tensor,    // (C)
    pub(crate) attn_w: &'a Tensor,    // (C, 3C): q | k | v
    pub(crate) attn_b: &'a Tensor,    // (3C)
    pub(crate) proj_w: &'a Tensor,    // (C, C)
    pub(crate) proj_b: &'a Tensor,    // (C)
    pub(crate) ln_2_w: &'a Tensor,    // (C)
    pub(crate) ln_2_b: &'a Tensor,    // (C)
    pub(crate) fc_w: &'a Tensor,      // (C, 4C)
    pub(crate) fc_b: &'a Tensor,      // (4C)
    pub(crate) fc_proj_w: &'a Tensor, // (4C, C)
    pub(crate) fc_proj_b: &'a Tensor, // (C)
}

impl GptParams {
    /// `store` on `device` as `dtype`, every tensor a leaf that accumulates a gradient, wte
    /// padded to (Vp, C).
    pub fn upload(store: &ParamStore, device: &Device, dtype: DType) -> Result<GptParams> {
        let tensors = store
            .iter()
            .map(|(s, t)| Ok(upload_rows(t, device_rows(&s), device, dtype)?.requires_grad_()))
            .collect::<Result<Vec<_>>>()?;
        Ok(GptParams {
            config: store.config().clone(),
            tensors,
        })
    }

    /// Wraps tensors made elsewhere (one per parameter, e.g. bf16 copies of f32 masters),
    /// each made a gradient leaf. Each has its Hugging Face shape, except that wte may also
    /// be padded, (Vp, C) with rows V..Vp zero (what `upload_rows` to `device_rows` gives).
    /// An unpadded (V, C) wte is kept as it is: the model computes the same, only slower.
    pub fn from_tensors(config: &GptConfig, tensors: Vec<Tensor>) -> Result<GptParams> {
        let specs = config.param_specs();
        if specs.len() != tensors.len() {
            return Err(Error::Params(format!(
                "{} tensors given for {} parameters",
                tensors.len(),
                specs.len()
            )));
        }
        for (s, t) in specs.iter().zip(&tensors) {
            let padded = s.name == WTE && t.shape() == [device_rows(s), s.shape[1]];
            if s.shape != t.shape() && !padded {
                return Err(Error::WrongShape {
                    name: s.name.clone(),
                    expected: s.shape.clone(),
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

    /// The device tensors, one per `config().param_specs()` (wte padded: see `GptParams`).
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The parameters as a host store (f32, wte without its padding).
    pub fn download(&self) -> Result<ParamStore> {
        ParamStore::from_tensors(&self.config, to_host(&self.config, &self.tensors)?)
    }

    /// The accumulated gradients as host tensors by Hugging Face name and shape (zeros where
    /// no gradient reached a parameter; wte's without the padded rows).
    pub fn grads_to_host(&self) -> Result<BTreeMap<String, HostTensor>> {
        let grads = self
            .tensors
            .iter()
            .map(|t| match t.grad() {
                Some(g) => Ok(g),
                None => Ok(Tensor::zeros(t.device(), t.shape(), DType::F32)?),
            })
            .collect::<Result<Vec<_>>>()?;
        to_host(&self.config, &grads)
    }

    /// Forgets every accumulated gradient.
    pub fn zero_grad(&self) {
        self.tensors.iter().for_each(Tensor::zero_grad);
    }

    pub(crate) fn wte(&self) -> &Tensor {
        &self.tensors[0] // (Vp, C); rows V..Vp zero
    }

    pub(crate) fn wpe(&self) -> &Tensor {
        &self.tensors[1] // (maxT, C)
    }

    pub(crate) fn ln_f(&self) -> (&Tensor, &Tensor) {
        let n = self.tensors.len();
        (&self.tensors[n - 2], &self.tensors[n - 1]) // (C), (C)
    }

    pub(crate) fn block(&self, l: usize) -> Block<'_> {
        let start = 2 + PER_BLOCK * l;
        let [ln_1_w, ln_1_b, attn_w, attn_b, proj_w, proj_b, ln_2_w, ln_2_b, fc_w, fc_b, fc_proj_w, fc_proj_b] =
            &self.tensors[start..start + PER_BLOCK]
        else {
            unreachable!("a block has {PER_BLOCK} parameters");
        };
        Block {
            ln_1_w,
            ln_1_b,
            attn_w,
            attn_b,
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

/// Device tensors, one per parameter of `config` in `param_specs` order (wte's padded rows
/// too, as parameters, gradients or moments have them), as host tensors by name of Hugging
/// Face's shapes (widened to f32; the padded rows dropped).
pub fn to_host(config: &GptConfig, tensors: &[Tensor]) -> Result<BTreeMap<String, HostTensor>> {
    config
        .param_specs()
        .into_iter()
        .zip(tensors)
        .map(|(s, t)| Ok((s.name.clone(), host_of(&s, t)?)))
        .collect()
}

/// One device tensor of `spec`'s parameter (or of its optimizer state) as a host tensor of
/// the Hugging Face shape: wte's padded rows left out.
pub(crate) fn host_of(spec: &ParamSpec, t: &Tensor) -> Result<HostTensor> {
    let rows = spec.shape.first().copied().unwrap_or(1);
    let t = match t.shape().first() {
        Some(&have) if have > rows && spec.shape.len() >= 2 => t.narrow(0, 0, rows)?,
        _ => t.clone(),
    };
    HostTensor::download(&t)
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

/// GPT-2's forward pass: logits (B, T, V) for token ids `idx` (B, T) at positions `pos` (T):
/// a view of the head's (B, T, Vp) product (rows at stride Vp), which `loss` reads in place.
pub fn forward(p: &GptParams, idx: &IndexTensor, pos: &IndexTensor) -> Result<Tensor> {
    head(p, &hidden(p, idx, pos)?)
}

/// `loss(&forward(p, idx, pos)?, targets)`, the training step's form: the cross-entropy reads
/// the first V columns of the head's (B, T, Vp) product and its gradient is (B, T, Vp), so
/// backward hands the product its gradient with no narrow/pad copy (which the (B, T, V) view
/// would cost: a pass over the logits). A (1,) tensor.
pub fn forward_loss(
    p: &GptParams,
    idx: &IndexTensor,
    pos: &IndexTensor,
    targets: &IndexTensor,
) -> Result<Tensor> {
    let logits = padded_head(p, &hidden(p, idx, pos)?)?; // (B, T, Vp)
    let v = p.config.vocab_size;
    Ok(logits.cross_entropy_padded(targets, None, v)?.loss)
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
/// transposed view: the product is (..., Vp), and the logits are its first V columns (a
/// view; the padded columns are zero). A single row (generation) is a product and a row
/// sum over wte's first V rows instead: a matmul tile would spend 31 of its 32 rows on
/// nothing (measured slower; bench/results/source-comment-history.md).
pub fn head(p: &GptParams, h: &Tensor) -> Result<Tensor> {
    let (c, v) = (p.config.n_embd, p.config.vocab_size);
    let mut shape = h.shape().to_vec();
    let last = shape.len() - 1;
    if h.len() == c && !h.requires_grad() {
        let wte = p.wte().narrow(0, 0, v)?; // (V, C), rows of (Vp, C): dense
        let logits = wte.mul(&h.reshape(&[1, c])?)?.sum(-1)?; // (V, C) → (V)
        shape[last] = v;
        return Ok(logits.reshape(&shape)?); // (..., V)
    }
    let logits = padded_head(p, h)?; // (..., Vp)
    match logits.shape()[last] == v {
        true => Ok(logits),
        false => Ok(logits.narrow(last, 0, v)?), // (..., V) at stride Vp
    }
}

/// The head's product over every row of wte: (..., Vp) = h (..., C) @ wte^T, columns V..Vp
/// zero.
fn padded_head(p: &GptParams, h: &Tensor) -> Result<Tensor> {
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
/// `forward`'s logits (a view at stride Vp) are read in place, the padded columns never;
/// to train, `forward_loss` saves backward a copy.
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
    let qkv = linear(&h, w.attn_w, w.attn_b)?; // (B, T, 3C)
    let a = causal_self_attention(&qkv, cfg.n_head)?; // (B, T, C)
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

/// Causal self-attention of `n_head` heads over the fused projection qkv (B, T, 3C), laid
/// out q | k | v, each head's D = C/H channels together: → (B, T, C). Each position attends
/// to itself and the positions before it, scores scaled by 1/√D. Runs helios' attention op,
/// which reads q, k and v in place as views of qkv: the flash kernels for f16 and bf16 (the
/// scores never stored), and in f32 on a GPU, from 2 MiB of scores, the materialised form on
/// the matmul kernels, which skips the masked half and recomputes the scores in backward.
/// Head sizes the op does not take run `materialised_attention`, checkpointed so that no
/// layer keeps its scores.
pub fn causal_self_attention(qkv: &Tensor, n_head: usize) -> Result<Tensor> {
    let (b, t, c) = qkv_dims(qkv, n_head)?;
    if !fused_attention_fits(c / n_head) {
        // Checkpointed: backward computes the probabilities again rather than keeping
        // (B, H, T, T) of them per layer.
        return Ok(helios::checkpoint(&[qkv], move |x| {
            materialised(&x[0], (b, t, c), n_head)
        })?);
    }
    fused_attention(qkv, n_head)
}

/// helios' attention op as `causal_self_attention` (head sizes multiples of 16 up to 256).
pub fn fused_attention(qkv: &Tensor, n_head: usize) -> Result<Tensor> {
    let (b, t, c) = qkv_dims(qkv, n_head)?;
    let d = c / n_head;
    // q, k and v are read in place as slices of (B, T, 3, H, D), and backward writes their
    // gradients into the slices of one tensor.
    let qkv = qkv.reshape(&[b, t, 3, n_head, d])?;
    let y = qkv.attention_qkv(&AttentionOptions::causal())?.out; // (B, T, H, D)
    Ok(y.reshape(&[b, t, c])?) // (B, T, C)
}

/// Whether helios' fused attention takes heads of `d` channels (multiples of 16 up to 256).
fn fused_attention_fits(d: usize) -> bool {
    d % 16 == 0 && d <= 256
}

/// The same attention with the (B, H, T, T) scores stored: the reference form the tests
/// hold the fused kernel to.
pub fn materialised_attention(qkv: &Tensor, n_head: usize) -> Result<Tensor> {
    let dims = qkv_dims(qkv, n_head)?;
    Ok(materialised(qkv, dims, n_head)?)
}

/// `materialised_attention` of a qkv whose (B, T, C) were checked.
fn materialised(
    qkv: &Tensor,
    (b, t, c): (usize, usize, usize),
    n_head: usize,
) -> helios::Result<Tensor> {
    let d = c / n_head;
    let qkv = qkv.reshape(&[b, t, 3, n_head, d])?; // (B, T, 3, H, D)
    let part = |i: usize| qkv.narrow(2, i, 1)?.reshape(&[b, t, n_head, d]); // (B, T, H, D)
    let q = part(0)?.permute(&[0, 2, 1, 3])?; // (B, H, T, D)
    let kt = part(1)?.permute(&[0, 2, 3, 1])?; // (B, H, D, T)
    let v = part(2)?.permute(&[0, 2, 1, 3])?; // (B, H, T, D)
    let scores = q.matmul(&kt)?; // (B, H, T, T)
    let att = scores.softmax_with(SoftmaxOptions::causal(1.0 / (d as f32).sqrt()))?; // (B, H, T, T)
    let y = att.matmul(&v)?; // (B, H, T, D)
    y.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c]) // (B, T, C)
}

/// (B, T, C) of a (B, T, 3C) qkv whose C splits into `n_head` heads.
fn qkv_dims(qkv: &Tensor, n_head: usize) -> Result<(usize, usize, usize)> {
    match *qkv.shape() {
        [b, t, c3] if c3 % 3 == 0 && n_head > 0 && (c3 / 3) % n_head == 0 => Ok((b, t, c3 / 3)),
        _ => Err(Error::Params(format!(
            "attention takes a (B, T, 3C) qkv with C a multiple of {n_head} heads, got {:?}",
            qkv.shape()
        ))),
    }
}
