//! What tuning on real work needs to run a candidate beside a real product (`explore`): the
//! product with fresh side outputs (a shadow), its operands realised before the timed span,
//! and the rows of both outputs compared, within what bound.

use helios_kernels::Triangle;

use crate::ops::matmul::Problem;
use crate::ops::online::RowSample;
use crate::{DType, Result, Tensor};

/// Rows of the output compared between a candidate and the incumbent, at most (spread over
/// the whole output: first, last and evenly between), and their bytes at most.
const CHECK_ROWS: u64 = 16;
const CHECK_BYTES: u64 = 8 << 20;

/// What a product's shadow run needs (only the explorer uses them).
impl Problem {
    /// Realises every operand and side output, so that recording the product records nothing
    /// else (a pending producer would otherwise land inside a timed span).
    pub(crate) fn realize_operands(&self) -> Result<()> {
        let all = [
            &self.bias,
            &self.residual,
            &self.rows,
            &self.pre,
            &self.sums,
        ];
        for t in [&self.a, &self.b]
            .into_iter()
            .chain(all.into_iter().flatten())
        {
            t.buffer()?;
        }
        Ok(())
    }

    /// The same product with its side outputs (`pre`, `sums`) in fresh tensors: for running
    /// a candidate kernel beside the real one without touching anything the program reads.
    pub(crate) fn shadow(&self) -> Result<Problem> {
        let fresh = |t: &Option<Tensor>| -> Result<Option<Tensor>> {
            t.as_ref()
                .map(|t| Tensor::empty(t.device(), t.shape(), t.dtype()))
                .transpose()
        };
        Ok(Problem {
            a: self.a.clone(),
            b: self.b.clone(),
            bias: self.bias.clone(),
            residual: self.residual.clone(),
            rows: self.rows.clone(),
            pre: fresh(&self.pre)?,
            sums: fresh(&self.sums)?,
            shape: self.shape,
            trans: self.trans,
            input: self.input,
            out: self.out,
            epilogue: self.epilogue,
            alpha: self.alpha,
            out_shape: self.out_shape.clone(),
            forced: self.forced,
            forced_splits: self.forced_splits,
            triangle: self.triangle,
        })
    }
}

/// Byte ranges of `out` to compare (rows spread over every batch matrix) and what they hold.
pub(super) fn check_rows(p: &Problem, out: &Tensor) -> (Vec<(u64, u64)>, Vec<RowSample>) {
    let s = &p.shape;
    let size = p.out.size() as u64;
    let n = u64::from(s.n);
    let m = u64::from(s.m).max(1);
    let total = m * u64::from(s.batch);
    let row_bytes = (n * size).max(1);
    let count = CHECK_ROWS.min((CHECK_BYTES / row_bytes).max(1)).min(total);
    let base = (out.layout().offset() * p.out.size()) as u64;
    // Where row r of the batch of matrices starts, in elements (see `MatmulShape`).
    let start = |r: u64| {
        let (bi, row) = (r / m, r % m);
        let inner = u64::from(s.inner.max(1));
        let batch = (bi / inner) * u64::from(s.stride_c)
            + match inner {
                1 => 0,
                _ => (bi % inner) * u64::from(s.inner_c),
            };
        batch + row * u64::from(s.ldc)
    };
    let mut picked: Vec<u64> = (0..count)
        .map(|i| match count {
            1 => 0,
            _ => i * (total - 1) / (count - 1),
        })
        .collect();
    picked.dedup();
    let regions = picked
        .iter()
        .map(|&r| (base + start(r) * size, n * size))
        .collect();
    let rows = picked
        .iter()
        .map(|&r| RowSample {
            row: match p.triangle {
                Triangle::LowerC => (r % m) as u32,
                _ => u32::MAX,
            },
            len: n as u32,
        })
        .collect();
    (regions, rows)
}

/// How far a candidate's rows may be from the incumbent's: four times the tests' tolerance
/// for the dtype (each kernel is within one of the exact product), and for f32 at least
/// 1e-4 (long sums in another order differ by more than the tests' short ones).
pub(super) fn matmul_bound(out: DType) -> f64 {
    let bound = 4.0 * crate::cpu::matmul::tolerance(out);
    match out {
        DType::F32 => bound.max(1e-4),
        _ => bound,
    }
}
