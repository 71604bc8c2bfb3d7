//! Reference scaled-dot-product attention and its gradients, f64 throughout, on dense
//! [B, T, H, D] inputs. This defines the semantics the kernels promise: key j is seen by
//! query i of batch row b when `j < min(T, lens[b])` and, if causal, j ≤ i; a query with no
//! key gets O = 0, L = −inf and zero gradients.

/// (batch, sequence, heads, head dim).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDims {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub d: usize,
}

impl AttnDims {
    fn at(&self, b: usize, t: usize, h: usize) -> usize {
        ((b * self.t + t) * self.h + h) * self.d
    }
}

/// The mask's options.
#[derive(Clone, Copy, Debug)]
pub struct AttnMask<'a> {
    pub causal: bool,
    /// Keys per batch row (key padding).
    pub lens: Option<&'a [u32]>,
}

/// Probabilities P[i][j] (f64) of one (b, h) and the row log-sum-exps.
fn probs(
    q: &[f32],
    k: &[f32],
    s: AttnDims,
    mask: AttnMask,
    scale: f64,
    b: usize,
    h: usize,
) -> (Vec<f64>, Vec<f64>) {
    let t = s.t;
    let kend = mask.lens.map_or(t, |l| (l[b] as usize).min(t));
    let mut p = vec![0.0f64; t * t];
    let mut lse = vec![f64::NEG_INFINITY; t];
    for i in 0..t {
        let qi = &q[s.at(b, i, h)..][..s.d];
        let last = if mask.causal { kend.min(i + 1) } else { kend };
        if last == 0 {
            continue;
        }
        let mut m = f64::NEG_INFINITY;
        for j in 0..last {
            let kj = &k[s.at(b, j, h)..][..s.d];
            let dot: f64 = qi.iter().zip(kj).map(|(&a, &c)| a as f64 * c as f64).sum();
            p[i * t + j] = dot * scale;
            m = m.max(dot * scale);
        }
        let mut sum = 0.0;
        for j in 0..last {
            let e = (p[i * t + j] - m).exp();
            p[i * t + j] = e;
            sum += e;
        }
        for j in 0..last {
            p[i * t + j] /= sum;
        }
        lse[i] = m + sum.ln();
    }
    (p, lse)
}

/// O ([B, T, H, D]) and L ([B, H, T]).
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: AttnDims,
    mask: AttnMask,
    scale: f32,
) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![0.0f32; s.b * s.t * s.h * s.d];
    let mut lse = vec![0.0f32; s.b * s.h * s.t];
    for b in 0..s.b {
        for h in 0..s.h {
            let (p, l) = probs(q, k, s, mask, scale as f64, b, h);
            for i in 0..s.t {
                lse[(b * s.h + h) * s.t + i] = l[i] as f32;
                for e in 0..s.d {
                    let mut acc = 0.0f64;
                    for j in 0..s.t {
                        let w = p[i * s.t + j];
                        if w != 0.0 {
                            acc += w * v[s.at(b, j, h) + e] as f64;
                        }
                    }
                    out[s.at(b, i, h) + e] = acc as f32;
                }
            }
        }
    }
    (out, lse)
}

/// dQ, dK, dV (each [B, T, H, D]) from the upstream gradient `dout` of O.
pub fn attention_backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    s: AttnDims,
    mask: AttnMask,
    scale: f32,
) -> [Vec<f32>; 3] {
    let n = s.b * s.t * s.h * s.d;
    let (mut dq, mut dk, mut dv) = (vec![0.0f64; n], vec![0.0f64; n], vec![0.0f64; n]);
    let t = s.t;
    for b in 0..s.b {
        for h in 0..s.h {
            let (p, _) = probs(q, k, s, mask, scale as f64, b, h);
            for i in 0..t {
                let doi = &dout[s.at(b, i, h)..][..s.d];
                // dP[i][j] = dO[i]·V[j]; dS = P ∘ (dP − Σ_j P dP).
                let dp: Vec<f64> = (0..t)
                    .map(|j| {
                        let vj = &v[s.at(b, j, h)..][..s.d];
                        doi.iter().zip(vj).map(|(&a, &c)| a as f64 * c as f64).sum()
                    })
                    .collect();
                let rowdot: f64 = (0..t).map(|j| p[i * t + j] * dp[j]).sum();
                for j in 0..t {
                    let w = p[i * t + j];
                    if w == 0.0 {
                        continue;
                    }
                    let ds = w * (dp[j] - rowdot) * scale as f64;
                    let (qi, kj, ij) = (s.at(b, i, h), s.at(b, j, h), s.at(b, j, h));
                    for e in 0..s.d {
                        dv[ij + e] += w * doi[e] as f64;
                        dq[qi + e] += ds * k[kj + e] as f64;
                        dk[kj + e] += ds * q[qi + e] as f64;
                    }
                }
            }
        }
    }
    let f = |x: Vec<f64>| x.into_iter().map(|v| v as f32).collect();
    [f(dq), f(dk), f(dv)]
}

/// The largest |got − want| over max(|want|): the error measure the tests bound.
pub fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    let scale = want
        .iter()
        .fold(0.0f64, |m, &w| m.max((w as f64).abs()))
        .max(1e-30);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let e = (g as f64 - w as f64).abs();
            if e.is_nan() {
                f64::INFINITY
            } else {
                e
            }
        })
        .fold(0.0, f64::max)
        / scale
}

/// Single-query attention over a key/value cache (decoding): O[b, h] =
/// Σ_{j<len} softmax_j(scale·q[b, h]·K[b, j, h]) V[b, j, h], with q and O dense [B, H, D]
/// and K, V dense [B, capacity, H, D] (`s.t` is the capacity; rows from `len` on are never
/// read). `len` ≥ 1.
pub fn attention_decode(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: AttnDims,
    len: usize,
    scale: f32,
) -> Vec<f32> {
    assert!((1..=s.t).contains(&len), "len {len} of capacity {}", s.t);
    let mut out = vec![0.0f32; s.b * s.h * s.d];
    for b in 0..s.b {
        for h in 0..s.h {
            let qi = &q[(b * s.h + h) * s.d..][..s.d];
            let scores: Vec<f64> = (0..len)
                .map(|j| {
                    let kj = &k[s.at(b, j, h)..][..s.d];
                    let dot: f64 = qi.iter().zip(kj).map(|(&a, &c)| a as f64 * c as f64).sum();
                    dot * scale as f64
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|&x| (x - m).exp()).collect();
            let sum: f64 = p.iter().sum();
            for e in 0..s.d {
                let acc: f64 = (0..len).map(|j| p[j] * v[s.at(b, j, h) + e] as f64).sum();
                out[(b * s.h + h) * s.d + e] = (acc / sum) as f32;
            }
        }
    }
    out
}
