//! Incremental decoding with a key/value cache: each new token costs one single-position pass
//! through the blocks (its q, k, v; attention over the cached keys and values) and one
//! (1, C) x (C, V) head product, instead of a pass over the whole window.
//!
//! The one decision a reader must know: each layer's cache is a (1, t, C) key and value
//! tensor that grows by `Tensor::cat` of the new position's k and v (a copy of t·C values
//! per token, small beside the products; helios' `matmul_into` cannot write into a row view
//! of a preallocated cache, it wants outputs that start their buffer). The single query
//! attends over the cached prefix with the scores stored ((1, H, 1, t+1), small); every
//! cached key precedes it, so no mask is needed. Batch 1 only; once the model's block size
//! is reached the caller recomputes the window instead.

use helios::{no_grad, Activation, IndexTensor, MatmulOptions, Tensor};

use crate::model::{Block, GptParams};
use crate::{Error, Result};

/// Keys and values of every layer for the positions decoded so far.
pub struct KvCache {
    /// Per layer: (1, len, C) keys and values (`None` before the first position).
    k: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
    /// Positions cached.
    len: usize,
    /// The model's block size: positions that fit.
    capacity: usize,
}

impl KvCache {
    /// An empty cache for `params`' configuration.
    pub fn new(params: &GptParams) -> KvCache {
        let cfg = params.config();
        KvCache {
            k: vec![None; cfg.n_layer],
            v: vec![None; cfg.n_layer],
            len: 0,
            capacity: cfg.block_size,
        }
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
    let cfg = params.config();
    if cache.is_full() {
        return Err(Error::Config(format!(
            "the key/value cache holds the model's {} positions; recompute the window instead",
            cfg.block_size
        )));
    }
    let device = params.wte().device().clone();
    no_grad(|| -> Result<Tensor> {
        let id = IndexTensor::from_slice(&device, &[token], &[1, 1])?; // (1, 1)
        let pos = IndexTensor::from_slice(&device, &[cache.len as u32], &[1])?; // (1)
        let mut x = params
            .wte()
            .embedding(&id)?
            .add(&params.wpe().embedding(&pos)?)?; // (1, 1, C)
        for l in 0..cfg.n_layer {
            let (k, v) = (&mut cache.k[l], &mut cache.v[l]);
            x = block_step(&params.block(l), &x, k, v, cfg)?; // (1, 1, C)
        }
        cache.len += 1;
        let (w, b) = params.ln_f();
        let h = x
            .layer_norm(w, b, cfg.layer_norm_eps)?
            .y
            .reshape(&[1, cfg.n_embd])?; // (1, C)
        crate::model::head(params, &h) // (1, V)
    })
}

/// One block for a single new position: x (1, 1, C) → (1, 1, C), appending the position's
/// k and v to the layer's caches (1, t, C) → (1, t+1, C).
fn block_step(
    w: &Block,
    x: &Tensor,
    k_cache: &mut Option<Tensor>,
    v_cache: &mut Option<Tensor>,
    cfg: &crate::GptConfig,
) -> Result<Tensor> {
    let (c, nh) = (cfg.n_embd, cfg.n_head);
    let d = c / nh;
    let h = x.layer_norm(w.ln_1_w, w.ln_1_b, cfg.layer_norm_eps)?.y; // (1, 1, C)
    let qkv = h.matmul_opts(
        w.attn_w,
        &MatmulOptions {
            bias: Some(w.attn_b),
            ..MatmulOptions::default()
        },
    )?; // (1, 1, 3C): q | k | v
    let q = qkv.narrow(2, 0, c)?; // (1, 1, C)
    for (i, cache) in [(1, &mut *k_cache), (2, &mut *v_cache)] {
        let new = qkv.narrow(2, i * c, c)?; // (1, 1, C)
        *cache = Some(match cache.take() {
            None => new.contiguous()?,
            Some(old) => Tensor::cat(&[&old, &new], 1)?, // (1, t+1, C)
        });
    }
    let (k_cache, v_cache) = (
        k_cache.as_ref().expect("set"),
        v_cache.as_ref().expect("set"),
    );
    let n = k_cache.shape()[1];
    let q = q.reshape(&[1, nh, 1, d])?; // (1, H, 1, D): one position, so no permute
    let heads = |cache: &Tensor| -> Result<Tensor> {
        Ok(cache
            .narrow(1, 0, n)?
            .reshape(&[1, n, nh, d])?
            .permute(&[0, 2, 1, 3])?)
    }; // (1, H, n, D)
    let k = heads(k_cache)?.transpose(2, 3)?; // (1, H, D, n)
    let v = heads(v_cache)?; // (1, H, n, D)
    let att = q
        .matmul_opts(
            &k,
            &MatmulOptions {
                alpha: 1.0 / (d as f32).sqrt(),
                ..MatmulOptions::default()
            },
        )?
        .softmax()?; // (1, H, 1, n)
    let y = att.matmul(&v)?.reshape(&[1, 1, c])?; // (1, H, 1, D) → (1, 1, C)
    let x = y.matmul_opts(
        w.proj_w,
        &MatmulOptions {
            bias: Some(w.proj_b),
            residual: Some(x),
            ..MatmulOptions::default()
        },
    )?; // (1, 1, C)
    let h = x.layer_norm(w.ln_2_w, w.ln_2_b, cfg.layer_norm_eps)?.y; // (1, 1, C)
    let f = h.matmul_opts(
        w.fc_w,
        &MatmulOptions {
            bias: Some(w.fc_b),
            act: Activation::GeluTanh,
            ..MatmulOptions::default()
        },
    )?; // (1, 1, 4C)
    Ok(f.matmul_opts(
        w.fc_proj_w,
        &MatmulOptions {
            bias: Some(w.fc_proj_b),
            residual: Some(&x),
            ..MatmulOptions::default()
        },
    )?) // (1, 1, C)
}
