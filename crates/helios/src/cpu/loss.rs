//! Cross-entropy over the last axis, in f64: the semantics the fused kernels promise.
//!
//! Per row r with target t: ignored (Some(t) == ignore_index) → loss 0, gradient 0; t outside
//! [0, vocab) → loss NaN, gradient NaN; any NaN logit → loss NaN, gradient NaN; otherwise
//! loss = logsumexp(x) − x_t and dlogits = (softmax(x) − onehot(t)) · scale / count, where
//! count is the number of rows not ignored. The mean is Σ loss / count, and 0 when every row
//! is ignored (PyTorch gives NaN there; a batch of padding should not poison a run).
//!
//! `cross_entropy_strided` is the same over rows that lie `stride` elements apart, of which
//! the first `vocab` are the classes (a padded vocabulary): the columns past `vocab` are never
//! read and their gradient is 0.

/// The reference results, rounded once to f32.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossEntropyRef {
    /// Mean loss over the rows not ignored.
    pub loss: f32,
    /// (rows,)
    pub row_loss: Vec<f32>,
    /// (rows, vocab); (rows, stride) from `cross_entropy_strided`, zeros past `vocab`.
    pub dlogits: Vec<f32>,
}

/// Cross-entropy of `logits` (rows × vocab, row-major) against `targets` (rows,).
pub fn cross_entropy(
    logits: &[f32],
    vocab: usize,
    targets: &[u32],
    ignore_index: Option<u32>,
    scale: f32,
) -> CrossEntropyRef {
    cross_entropy_strided(logits, vocab, vocab, targets, ignore_index, scale)
}

/// Cross-entropy of the first `vocab` columns of `logits` (rows × stride, row-major) against
/// `targets` (rows,); dlogits is rows × stride with zeros in columns `vocab..stride`.
pub fn cross_entropy_strided(
    logits: &[f32],
    vocab: usize,
    stride: usize,
    targets: &[u32],
    ignore_index: Option<u32>,
    scale: f32,
) -> CrossEntropyRef {
    assert!(vocab > 0, "cpu::cross_entropy needs vocab > 0");
    assert!(
        stride >= vocab,
        "cpu::cross_entropy: a row stride below vocab"
    );
    assert_eq!(
        logits.len(),
        targets.len() * stride,
        "cpu::cross_entropy: logits are not rows × stride"
    );
    let pad = stride - vocab;
    let count = targets.iter().filter(|&&t| Some(t) != ignore_index).count();
    let norm = if count > 0 {
        f64::from(scale) / count as f64
    } else {
        0.0
    };
    let mut row_loss: Vec<f64> = Vec::with_capacity(targets.len());
    let mut dlogits = Vec::with_capacity(logits.len());
    for (row, &t) in logits.chunks_exact(stride).zip(targets) {
        let row = &row[..vocab];
        if Some(t) == ignore_index {
            row_loss.push(0.0);
            dlogits.resize(dlogits.len() + stride, 0.0);
            continue;
        }
        let x: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        let target = Some(t as usize).filter(|&u| u < vocab);
        let (Some(target), false) = (target, x.iter().any(|v| v.is_nan())) else {
            row_loss.push(f64::NAN);
            dlogits.resize(dlogits.len() + vocab, f32::NAN);
            dlogits.resize(dlogits.len() + pad, 0.0);
            continue;
        };
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = x.iter().map(|&v| (v - m).exp()).sum();
        let lse = sum.ln() + m;
        row_loss.push(lse - x[target]);
        dlogits.extend(x.iter().enumerate().map(|(j, &v)| {
            let onehot = if j == target { 1.0 } else { 0.0 };
            (((v - lse).exp() - onehot) * norm) as f32
        }));
        dlogits.resize(dlogits.len() + pad, 0.0);
    }
    let loss = if count > 0 {
        row_loss.iter().sum::<f64>() / count as f64
    } else {
        0.0
    };
    CrossEntropyRef {
        loss: loss as f32,
        row_loss: row_loss.iter().map(|&l| l as f32).collect(),
        dlogits,
    }
}
