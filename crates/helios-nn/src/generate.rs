//! Text generation: sampling the next token from a model's logits (temperature, top-k,
//! top-p, a seeded generator) one token at a time.
//!
//! The one decision a reader must know: `generate` decodes with a key/value cache (one
//! single-position pass per token, `kv_cache`); `generate_recompute` runs the whole window
//! through the blocks for every token and is the reference the tests hold it to. Both run
//! the head, which dominates at GPT-2's vocabulary, for the last position only.

use helios::{no_grad, Device, Tensor};

use crate::kv_cache::{self, KvCache};
use crate::model::{self, GptParams};
use crate::{Error, Result};

/// How to pick each next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits; 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p (1: all).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            seed: 1337,
        }
    }
}

impl Sampling {
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::Config(format!(
                "temperature {} must be 0 (greedy) or positive",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::Config(format!(
                "top-p {} must be in (0, 1]",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// A small seeded generator (SplitMix64): the same seed gives the same text everywhere.
struct Rng(u64);

impl Rng {
    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The token `logits` (V) pick under `s`, using `u` uniform in [0, 1).
pub fn sample(logits: &[f32], s: &Sampling, u: f64) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &l)| {
                if l > best.1 {
                    (i, l)
                } else {
                    best
                }
            })
            .0 as u32
    };
    if s.temperature == 0.0 {
        return argmax();
    }
    draw(logits, &candidates(logits, s.top_k), s, u)
}

/// Token ids by falling logit (ties by index), cut to the `top_k` first (0: all). With a
/// top-k only the k are sorted, after a linear-time selection: sorting all of GPT-2's
/// 50,257 logits took longer than a token's GPU time
/// (bench/results/2026-11-30-session47-note.md).
fn candidates(logits: &[f32], top_k: usize) -> Vec<u32> {
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    if top_k > 0 && top_k < order.len() {
        order.select_nth_unstable_by(top_k - 1, by_logit);
        order.truncate(top_k);
    }
    order.sort_unstable_by(by_logit);
    order
}

/// One of `order` (candidates by falling logit), drawn with `u` from their softmax at
/// `s.temperature`, cut to the shortest prefix holding `s.top_p` of the probability.
fn draw(logits: &[f32], order: &[u32], s: &Sampling, u: f64) -> u32 {
    let max = logits[order[0] as usize];
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| (((logits[i as usize] - max) / s.temperature) as f64).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    // Top-p: the shortest prefix reaching p.
    let mut mass = 0.0;
    let mut keep = probs.len();
    for (i, p) in probs.iter().enumerate() {
        mass += p;
        if mass >= s.top_p as f64 {
            keep = i + 1;
            break;
        }
    }
    let kept: f64 = probs[..keep].iter().sum();
    let mut target = u * kept;
    for (i, p) in probs[..keep].iter().enumerate() {
        if target < *p {
            return order[i];
        }
        target -= p;
    }
    order[keep - 1]
}

/// `prompt` followed by `n` sampled tokens; `on_token` sees each new token as it comes.
/// Decodes with a key/value cache (`kv_cache`): one single-position pass per token. Once the
/// model's `block_size` positions are used, it recomputes the last `block_size` tokens per
/// token instead (as `generate_recompute` does throughout).
pub fn generate(
    params: &GptParams,
    device: &Device,
    prompt: &[u32],
    n: usize,
    s: &Sampling,
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    check(params, prompt, s)?;
    let cfg = params.config();
    if prompt.len() >= cfg.block_size {
        return generate_recompute(params, device, prompt, n, s, on_token);
    }
    let mut rng = Rng(s.seed);
    let mut tokens = prompt.to_vec();
    let mut cache = KvCache::new(params)?;
    let mut logits = None;
    for &t in prompt {
        logits = Some(kv_cache::step(params, &mut cache, t)?); // (1, V)
    }
    let mut logits = logits.expect("the prompt is not empty");
    for i in 0..n {
        let next = sample(&logits.to_vec()?, s, rng.uniform());
        tokens.push(next);
        on_token(next);
        if i + 1 == n {
            break;
        }
        logits = match cache.is_full() {
            false => kv_cache::step(params, &mut cache, next)?,
            true => window_logits(params, device, &tokens)?,
        };
    }
    Ok(tokens)
}

/// `generate` without a cache: every token runs the whole window (up to `block_size` tokens)
/// through the blocks; the head only for the last position. The reference form.
pub fn generate_recompute(
    params: &GptParams,
    device: &Device,
    prompt: &[u32],
    n: usize,
    s: &Sampling,
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    check(params, prompt, s)?;
    let mut rng = Rng(s.seed);
    let mut tokens = prompt.to_vec();
    for _ in 0..n {
        let last = window_logits(params, device, &tokens)?.to_vec()?; // (1, V)
        let next = sample(&last, s, rng.uniform());
        tokens.push(next);
        on_token(next);
    }
    Ok(tokens)
}

/// The logits (1, V) after the last `block_size` of `tokens`.
fn window_logits(params: &GptParams, device: &Device, tokens: &[u32]) -> Result<Tensor> {
    let cfg = params.config();
    let window = &tokens[tokens.len().saturating_sub(cfg.block_size)..];
    let (idx, pos) = model::inputs(cfg, device, window, 1, window.len())?;
    no_grad(|| model::forward_last(params, &idx, &pos))
}

fn check(params: &GptParams, prompt: &[u32], s: &Sampling) -> Result<()> {
    s.validate()?;
    if prompt.is_empty() {
        return Err(Error::Config(
            "the prompt is empty; give at least one token (e.g. <|endoftext|>)".into(),
        ));
    }
    let vocab = params.config().vocab_size;
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::VocabMismatch {
            what: format!("the prompt (token id {bad})"),
            expected: vocab,
            got: bad as usize + 1,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_top_k_and_top_p() {
        let logits = [0.0, 3.0, 1.0, 2.9];
        let greedy = Sampling {
            temperature: 0.0,
            ..Sampling::default()
        };
        assert_eq!(sample(&logits, &greedy, 0.9), 1);
        let top1 = Sampling {
            top_k: 1,
            ..Sampling::default()
        };
        assert_eq!(sample(&logits, &top1, 0.99), 1);
        // Top-2 by k: tokens 1 and 3 only, whatever u is.
        let top2 = Sampling {
            top_k: 2,
            top_p: 1.0,
            temperature: 1.0,
            seed: 0,
        };
        for u in [0.0, 0.3, 0.6, 0.999] {
            assert!([1, 3].contains(&sample(&logits, &top2, u)));
        }
        // A tiny top-p keeps only the most likely token.
        let p = Sampling {
            top_p: 0.01,
            top_k: 0,
            ..top2
        };
        assert_eq!(sample(&logits, &p, 0.999), 1);
    }

    /// The top-k selection orders the candidates as a full stable sort by falling logit
    /// did, ties included, so every u, k and p picks the same token.
    #[test]
    fn top_k_selection_matches_a_full_sort() {
        let sorted = |logits: &[f32], top_k: usize| -> Vec<u32> {
            let mut order: Vec<u32> = (0..logits.len() as u32).collect();
            order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
            if top_k > 0 {
                order.truncate(top_k);
            }
            order
        };
        let mut rng = Rng(7);
        // Logits on a coarse grid: many ties, at the top-k boundary too.
        let logits: Vec<f32> = (0..5000)
            .map(|_| (rng.uniform() * 40.0).floor() as f32 / 4.0)
            .collect();
        for (top_k, top_p) in [
            (1, 1.0),
            (40, 0.95),
            (40, 1.0),
            (333, 0.5),
            (0, 0.9),
            (5000, 1.0),
        ] {
            let s = Sampling {
                temperature: 0.8,
                top_k,
                top_p,
                seed: 0,
            };
            let want = sorted(&logits, top_k);
            assert_eq!(candidates(&logits, top_k), want, "k {top_k}");
            for _ in 0..50 {
                let u = rng.uniform();
                assert_eq!(
                    sample(&logits, &s, u),
                    draw(&logits, &want, &s, u),
                    "k {top_k} p {top_p} u {u}"
                );
            }
        }
    }
}
