//! Embedding lookup and its backward, in f64: the semantics the kernels promise.
//!
//! Forward: `out[i, :] = table[ids[i], :]` (NaN rows for ids outside the table, which the
//! tensor layer rejects first when it knows the ids). Backward: `dtable[v, :] = Σ_{i: ids[i]
//! = v} dout[i, :]`, rows no id uses are 0, ids outside the table contribute nothing.

/// `table` (vocab × dim) rows picked by `ids`: (ids.len() × dim).
pub fn embedding(table: &[f32], dim: usize, ids: &[u32]) -> Vec<f32> {
    let vocab = table.len().checked_div(dim).unwrap_or(0);
    let mut out = Vec::with_capacity(ids.len() * dim);
    for &id in ids {
        let id = id as usize;
        if id < vocab {
            out.extend_from_slice(&table[id * dim..(id + 1) * dim]);
        } else {
            out.resize(out.len() + dim, f32::NAN);
        }
    }
    out
}

/// The gradient of a (vocab × dim) table from `dout` (ids.len() × dim), summed in f64 and
/// rounded once; also returns, per element, Σ|term| (for error bounds of f32 summation).
pub fn embedding_backward(
    dout: &[f32],
    dim: usize,
    ids: &[u32],
    vocab: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut sum = vec![0.0f64; vocab * dim];
    let mut abs = vec![0.0f64; vocab * dim];
    for (i, &id) in ids.iter().enumerate() {
        let id = id as usize;
        if id >= vocab {
            continue;
        }
        for c in 0..dim {
            let x = f64::from(dout[i * dim + c]);
            sum[id * dim + c] += x;
            abs[id * dim + c] += x.abs();
        }
    }
    (
        sum.iter().map(|&v| v as f32).collect(),
        abs.iter().map(|&v| v as f32).collect(),
    )
}
