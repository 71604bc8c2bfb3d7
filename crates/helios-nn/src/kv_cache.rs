//! Incremental decoding with a key/value cache: each new token costs one single-position pass
//! through the blocks (its q, k, v; attention over the cached keys and values) and one
//! (1, C) x (C, V) head product, instead of a pass over the whole window.
//!
//! The one decision a reader must know: each layer's keys and values are allocated once, at
//! the model's block size ((1, block_size, H, D) each), and a step writes its position's k
//! and v into row `len` in place (`Tensor::write_kv`: no copy of the older rows). The
//! single query then attends over the first len + 1 rows with `Tensor::attention_decode`,
//! whose kernels take the length at run time, so a token compiles nothing that the first
//! one did not (a product and softmax of a new shape per token did, and a cold device's
//! tokens waited for them). Every cached key precedes the query, so no mask is needed.
//! A cache holds a batch of sequences that advance together, one position a step (a batch
//! of prompts of one length, or one prompt sampled several ways); once the model's block
//! size is reached the caller recomputes the window instead.

use helios::{no_grad, Activation, IndexTensor, MatmulOptions, Tensor};

use crate::model::{Block, GptParams};
use crate::{Error, Result};

/// Keys and values of every layer for the positions decoded so far.
pub struct KvCache {
    /// Per layer: (batch, block_size, H, D) keys and values, rows 0..len written.
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Positions cached.
    len: usize,
    /// The model's block size: positions that fit.
    capacity: usize,
    /// Sequences decoded together.
    batch: usize,
}

impl KvCache {
    /// An empty cache of one sequence for `params`' configuration: every layer's keys and
    /// values allocated (2 · L · block_size · C values of the model's dtype).
    pub fn new(params: &GptParams) -> Result<KvCache> {
        KvCache::with_batch(params, 1)
    }

    /// An empty cache of `batch` sequences that `step_batch` advances together (`batch`
    /// times `new`'s memory).
    pub fn with_batch(params: &GptParams, batch: usize) -> Result<KvCache> {
        if batch == 0 {
            return Err(Error::Config(
                "a key/value cache holds at least one sequence".into(),
            ));
        }
        let cfg = params.config();
        let (device, dtype) = (params.wte().device(), params.wte().dtype());
        let shape = [batch, cfg.block_size, cfg.n_head, cfg.n_embd / cfg.n_head];
        let layer = || Tensor::zeros(device, &shape, dtype);
        let k = (0..cfg.n_layer)
            .map(|_| layer())
            .collect::<helios::Result<_>>()?;
        let v = (0..cfg.n_layer)
            .map(|_| layer())
            .collect::<helios::Result<_>>()?;
        Ok(KvCache {
            k,
            v,
            len: 0,
            capacity: cfg.block_size,
            batch,
        })
    }

    /// Sequences decoded together.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the model has no position left for another token.
    pub fn is_full(&self) -> bool {
        self.len == self.capacity
    }
}

/// Feeds `token` at the next position; returns the logits (1, V) for the position after it.
pub fn step(params: &GptParams, cache: &mut KvCache, token: u32) -> Result<Tensor> {
    step_batch(params, cache, &[token])
}

/// Feeds `tokens`, one per sequence of the cache, at the next position; returns the logits
/// (batch, V) for the position after it.
pub fn step_batch(params: &GptParams, cache: &mut KvCache, tokens: &[u32]) -> Result<Tensor> {
    let cfg = params.config();
    let b = cache.batch;
    if tokens.len() != b {
        return Err(Error::Config(format!(
            "{} tokens for a key/value cache of {b} sequences: give one per sequence",
            tokens.len()
        )));
    }
    if cache.is_full() {
        return Err(Error::Config(format!(
            "the key/value cache holds the model's {} positions; recompute the window instead",
            cfg.block_size
        )));
    }
    let device = params.wte().device().clone();
    no_grad(|| -> Result<Tensor> {
        let id = IndexTensor::from_slice(&device, tokens, &[b, 1])?; // (B, 1)
        let pos = IndexTensor::from_slice(&device, &[cache.len as u32], &[1])?; // (1)
        let mut x = params
            .wte()
            .embedding(&id)?
            .add(&params.wpe().embedding(&pos)?)?; // (B, 1, C)
        for l in 0..cfg.n_layer {
            let kv = (&cache.k[l], &cache.v[l]);
            x = block_step(&params.block(l), &x, kv, cache.len, cfg)?; // (B, 1, C)
        }
        cache.len += 1;
        let (w, bias) = params.ln_f();
        let h = x
            .layer_norm(w, bias, cfg.layer_norm_eps)?
            .y
            .reshape(&[b, cfg.n_embd])?; // (B, C)
        crate::model::head(params, &h) // (B, V)
    })
}

/// One block for a single new position `pos`: x (B, 1, C) → (B, 1, C), writing the
/// position's k and v into row `pos` of the layer's caches (B, block_size, H, D).
fn block_step(
    w: &Block,
    x: &Tensor,
    (k_cache, v_cache): (&Tensor, &Tensor),
    pos: usize,
    cfg: &crate::GptConfig,
) -> Result<Tensor> {
    let (c, nh) = (cfg.n_embd, cfg.n_head);
    let (b, d) = (x.shape()[0], c / nh);
    let h = x.layer_norm(w.ln_1_w, w.ln_1_b, cfg.layer_norm_eps)?.y; // (B, 1, C)
    let qkv = h.matmul_opts(
        w.attn_w,
        &MatmulOptions {
            bias: Some(w.attn_b),
            ..MatmulOptions::default()
        },
    )?; // (B, 1, 3C): q | k | v
        // Views of the product, read in place by the kernels.
    let head = |i: usize| qkv.narrow(2, i * c, c)?.reshape(&[b, 1, nh, d]); // (B, 1, H, D)
    let (q, k, v) = (head(0)?, head(1)?, head(2)?);
    Tensor::write_kv(k_cache, v_cache, pos, &k, &v)?;
    let y = q
        .attention_decode(k_cache, v_cache, pos + 1, None)? // (B, 1, H, D)
        .reshape(&[b, 1, c])?;
    let x = y.matmul_opts(
        w.proj_w,
        &MatmulOptions {
            bias: Some(w.proj_b),
            residual: Some(x),
            ..MatmulOptions::default()
        },
    )?; // (B, 1, C)
    let h = x.layer_norm(w.ln_2_w, w.ln_2_b, cfg.layer_norm_eps)?.y; // (B, 1, C)
    let f = h.matmul_opts(
        w.fc_w,
        &MatmulOptions {
            bias: Some(w.fc_b),
            act: Activation::GeluTanh,
            ..MatmulOptions::default()
        },
    )?; // (B, 1, 4C)
    Ok(f.matmul_opts(
        w.fc_proj_w,
        &MatmulOptions {
            bias: Some(w.fc_proj_b),
            residual: Some(&x),
            ..MatmulOptions::default()
        },
    )?) // (B, 1, C)
}
