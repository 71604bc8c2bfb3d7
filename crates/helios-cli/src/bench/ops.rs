// `helios bench ops`: the memory-bound kernels of a training step (softmax, layernorm forward
// and forward+backward, sums, cross-entropy forward+backward, a transposed copy, AdamW) at
// GPT-2 shapes, in GB/s of their ideal traffic and as a share of the compute-copy
// bandwidth, beside PyTorch (`--compare torch`).
//
// Methodology: per (shape, dtype), a compute-shader copy of the same tensor is measured first
// (the ceiling: "% copy" = op GB/s / copy GB/s). Every case then runs `samples` samples of K
// back-to-back ops between two GPU timestamps (K so a sample lasts ~5 ms), per-op time =
// sample / K; outputs are dropped at once so the pool reuses their memory, and inputs rotate
// over enough copies (256 MiB in all) that the L2 cache cannot serve one op from the last.
// Ideal bytes: every input read once and every output written once (x, gamma, beta, dy; y,
// mean, rstd, dx, dgamma, dbeta as the op has them); PyTorch's GB/s uses the same count.
// Cases live in one table, `CASES`: a name, a byte count, the variant description and a
// function that records one op; another op is one more entry (and one in
// bench/torch_reference.py's `OPS_CASES`). AdamW is the one case outside the table: it runs
// once per dtype over GPT-2 124M's 148 parameter tensors (`gpt2_parameters`; shape column
// 1xN for N parameters), not per shape.

use std::path::Path;

use helios::{
    adamw_step, AdamWConfig, AdamWParam, DType, Device, IndexTensor, RowOp, SoftmaxOptions, Tensor,
};
use serde::{Deserialize, Serialize};

use super::stats::Summary;
use super::{random_values, report, summarize, BenchArgs, BenchResult, RunOp};
use crate::CliResult;

/// Input bytes the rotation spans (several times the L2 of current GPUs).
const ROTATE_BYTES: usize = 256 << 20;
const MAX_ROTATION: usize = 32;

/// The tensors one op reads.
struct Inputs {
    /// (rows, cols)
    x: Tensor,
    /// (rows, cols), only for cases that need an output gradient.
    dy: Option<Tensor>,
    /// (cols), in x's dtype.
    gamma: Tensor,
    beta: Tensor,
    /// (rows,) class indices in [0, cols), for cross-entropy.
    targets: IndexTensor,
}

/// One case of the suite (see the module comment).
struct OpCase {
    name: &'static str,
    /// Whether `Inputs::dy` is needed.
    needs_dy: bool,
    /// Ideal bytes for (rows, cols) of `size`-byte elements.
    bytes: fn(rows: u64, cols: u64, size: u64) -> u64,
    /// The kernels it runs on `device`, for the table.
    variant: fn(device: &Device, dtype: DType, rows: usize, cols: usize) -> String,
    /// Records one op (its outputs are dropped on return).
    run: fn(&Inputs) -> helios::Result<()>,
}

/// Bytes of a layernorm forward: x read, y written, gamma and beta read, mean and rstd (f32)
/// written.
fn ln_fwd_bytes(rows: u64, cols: u64, size: u64) -> u64 {
    2 * rows * cols * size + 2 * cols * size + 2 * rows * 4
}

const CASES: &[OpCase] = &[
    OpCase {
        name: "softmax",
        needs_dy: false,
        bytes: |r, c, s| 2 * r * c * s,
        variant: |d, t, r, c| d.describe_row_op(RowOp::Softmax { backward: false }, t, r, c),
        run: |i| i.x.softmax_with(SoftmaxOptions::default()).map(drop),
    },
    OpCase {
        name: "layernorm_fwd",
        needs_dy: false,
        bytes: ln_fwd_bytes,
        variant: |d, t, r, c| d.describe_row_op(RowOp::Norm { backward: false }, t, r, c),
        run: |i| i.x.layer_norm(&i.gamma, &i.beta, 1e-5).map(drop),
    },
    OpCase {
        name: "layernorm_fwdbwd",
        needs_dy: true,
        // Forward, then backward: x, gamma, mean, rstd, dy read; dx, dgamma, dbeta written.
        bytes: |r, c, s| ln_fwd_bytes(r, c, s) + 3 * r * c * s + 3 * c * s + 2 * r * 4,
        variant: |d, t, r, c| {
            format!(
                "{} | {}",
                d.describe_row_op(RowOp::Norm { backward: false }, t, r, c),
                d.describe_row_op(RowOp::Norm { backward: true }, t, r, c)
            )
        },
        run: |i| {
            let f = i.x.layer_norm(&i.gamma, &i.beta, 1e-5)?;
            let dy = i.dy.as_ref().expect("layernorm_fwdbwd has dy");
            let mean = f.mean.as_ref().expect("layernorm saves the mean");
            i.x.layer_norm_backward(&i.gamma, mean, &f.rstd, dy)
                .map(drop)
        },
    },
    OpCase {
        name: "cross_entropy_fwdbwd",
        needs_dy: false,
        // Logits and targets read, dlogits and the loss written (the kernels read the logits
        // twice: 3 of these 2 logit-sized transfers; PyTorch's chain moves about 6).
        bytes: |r, c, s| 2 * r * c * s + 4 * r + 4,
        variant: |d, _, r, c| d.describe_cross_entropy(r, c),
        run: |i| i.x.cross_entropy_with_grad(&i.targets, None, 1.0).map(drop),
    },
    OpCase {
        name: "transpose",
        needs_dy: false,
        // x.t() made dense: x read, the copy written.
        bytes: |r, c, s| 2 * r * c * s,
        variant: |d, t, r, c| d.describe_transpose(t, r, c),
        run: |i| i.x.transpose(0, 1)?.contiguous().map(drop),
    },
    OpCase {
        name: "sum_all",
        needs_dy: false,
        bytes: |r, c, s| r * c * s + s,
        variant: |d, t, r, c| d.describe_row_op(RowOp::Reduce { all: true }, t, r, c),
        run: |i| i.x.sum_all().map(drop),
    },
    OpCase {
        name: "sum_last",
        needs_dy: false,
        bytes: |r, c, s| r * c * s + r * s,
        variant: |d, t, r, c| d.describe_row_op(RowOp::Reduce { all: false }, t, r, c),
        run: |i| i.x.sum(-1).map(drop),
    },
];

/// The shapes measured by default (GPT-2: width, MLP width, vocabulary, at 4096 tokens).
const SHAPES: [(usize, usize); 3] = [(4096, 768), (4096, 3072), (4096, 50257)];
/// Small shapes for --quick (a smoke test on lavapipe).
const QUICK_SHAPES: [(usize, usize); 2] = [(64, 768), (4, 50257)];

/// PyTorch's figures for one case.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct TorchOp {
    pub case: String,
    pub dtype: String,
    pub rows: usize,
    pub cols: usize,
    pub median_us: f64,
    pub p95_us: f64,
    pub cv: f64,
    /// GB/s of the same ideal bytes (filled in here).
    #[serde(default)]
    pub gbps: Option<f64>,
}

/// One measured case.
#[derive(Clone, Debug, Serialize)]
pub struct OpResult {
    pub case: &'static str,
    pub dtype: &'static str,
    pub rows: usize,
    pub cols: usize,
    pub variant: String,
    pub ops_per_sample: usize,
    pub input_sets: usize,
    pub time_us: Summary,
    pub bytes_per_op: u64,
    pub gbps: f64,
    /// GB/s of the compute-shader copy of x measured in this run.
    pub copy_gbps: f64,
    pub pct_of_copy: f64,
    pub torch: Option<TorchOp>,
}

impl OpResult {
    /// PyTorch's median time over ours: above 1 means Helios is faster.
    pub fn speedup(&self) -> Option<f64> {
        let t = self.torch.as_ref()?;
        (self.time_us.median > 0.0).then(|| t.median_us / self.time_us.median)
    }
}

fn parse_dtype(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| d.name() == name)
}

/// "4096x768" → (4096, 768).
fn parse_shape(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?} is not a shape ROWSxCOLS (e.g. 4096x768)");
    let (r, c) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
    let r: usize = r.trim().parse().map_err(|_| bad())?;
    let c: usize = c.trim().parse().map_err(|_| bad())?;
    if r == 0 || c == 0 || r.saturating_mul(c) >= 1 << 31 {
        return Err(format!("{s}: rows·cols must be between 1 and 2^31 − 1"));
    }
    Ok((r, c))
}

/// Input sets for one (shape, dtype): enough distinct copies to span `ROTATE_BYTES`.
fn input_sets(
    device: &Device,
    rows: usize,
    cols: usize,
    dt: DType,
    dy: bool,
) -> BenchResult<Vec<Inputs>> {
    let n = rows * cols;
    let set_bytes = (n * dt.size() * (1 + usize::from(dy))).max(1);
    let count = ROTATE_BYTES.div_ceil(set_bytes).clamp(1, MAX_ROTATION);
    let x = random_values(n, 0x0b5);
    let g: Vec<f32> = random_values(cols, 0x0b6)
        .iter()
        .map(|v| 1.0 + 0.5 * v)
        .collect();
    let b = random_values(cols, 0x0b7);
    let d = dy.then(|| random_values(n, 0x0b8));
    let t: Vec<u32> = random_values(rows, 0x0b9)
        .iter()
        .map(|v| (((v + 1.0) / 2.0) * cols as f32) as u32 % cols as u32)
        .collect();
    let targets = IndexTensor::from_slice(device, &t, &[rows])?;
    let mut sets = Vec::with_capacity(count);
    for _ in 0..count {
        sets.push(Inputs {
            x: Tensor::from_slice_as(device, &x, &[rows, cols], dt)?,
            dy: d
                .as_ref()
                .map(|d| Tensor::from_slice_as(device, d, &[rows, cols], dt))
                .transpose()?,
            gamma: Tensor::from_slice_as(device, &g, &[cols], dt)?,
            beta: Tensor::from_slice_as(device, &b, &[cols], dt)?,
            targets: targets.clone(),
        });
    }
    device.synchronize()?;
    Ok(sets)
}

/// Warm-up, K calibration, then `samples` samples (ops of up to 2 dispatches).
fn time_op(
    device: &Device,
    run: RunOp,
    samples: usize,
    quick: bool,
) -> BenchResult<(Vec<f64>, usize)> {
    let (target_us, max_k) = if quick { (1_000.0, 4) } else { (5_000.0, 2048) };
    let plan = super::Sampling {
        target_us,
        first: 4,
        max_k,
        dispatches: 2,
    };
    super::time_ops(device, run, samples, plan)
}

/// The AdamW case's name (outside `CASES`: it has its own inputs).
const ADAMW_CASE: &str = "adamw_gpt2";

/// GPT-2 124M's parameter tensors (148, 124,439,808 parameters; bench/torch_reference.py's
/// `gpt2_parameters` lists the same): token and position embeddings, 12 blocks of (ln_1,
/// attn qkv, attn proj, ln_2, mlp fc, mlp proj; weights and biases), ln_f. `--quick`: one
/// block and a 256-token vocabulary.
fn gpt2_parameters(quick: bool) -> Vec<Vec<usize>> {
    let (vocab, layers, c) = if quick {
        (256, 1, 768)
    } else {
        (50257, 12, 768)
    };
    let mut p = vec![vec![vocab, c], vec![1024, c]];
    for _ in 0..layers {
        p.extend([
            vec![c],
            vec![c],
            vec![c, 3 * c],
            vec![3 * c],
            vec![c, c],
            vec![c],
            vec![c],
            vec![c],
            vec![c, 4 * c],
            vec![4 * c],
            vec![4 * c, c],
            vec![c],
        ]);
    }
    p.extend([vec![c], vec![c]]);
    p
}

/// One AdamW step over GPT-2 124M's parameters: f32 master weights and moments, gradients in
/// `dt`, and for a narrow `dt` a copy of the new weights in `dt` (mixed precision); weight
/// decay 0.1 on matrices, 0 on vectors. Every tensor is its own barrier-free dispatch.
fn adamw_case(device: &Device, dt: DType, samples: usize, quick: bool) -> BenchResult<OpResult> {
    let shapes = gpt2_parameters(quick);
    let n: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    let narrow = dt != DType::F32;
    let mut state = Vec::with_capacity(shapes.len());
    for (i, shape) in shapes.iter().enumerate() {
        let len: usize = shape.iter().product();
        let p = random_values(len, 0x0c0 + i as u64);
        let g = random_values(len, 0x1c0 + i as u64);
        let zeros = vec![0.0f32; len];
        state.push((
            Tensor::from_slice(device, &p, shape)?,
            Tensor::from_slice_as(device, &g, shape, dt)?,
            Tensor::from_slice(device, &zeros, shape)?,
            Tensor::from_slice(device, &zeros, shape)?,
            narrow
                .then(|| Tensor::from_slice_as(device, &zeros, shape, dt))
                .transpose()?,
            if shape.len() > 1 { 0.1 } else { 0.0 },
        ));
    }
    device.synchronize()?;
    let params: Vec<AdamWParam> = state
        .iter()
        .map(|(p, g, m, v, c, wd)| AdamWParam {
            param: p,
            grad: g,
            m,
            v,
            copy: c.as_ref(),
            weight_decay: *wd,
        })
        .collect();
    let config = AdamWConfig {
        lr: 6e-4,
        ..AdamWConfig::default()
    };
    let step = |i: usize| adamw_step(&params, &config, 1 + i as u32 % 1000);
    let (times, k) = time_op(device, &step, samples, quick)?;
    let time_us = summarize(&times, ADAMW_CASE)?;
    // p, m, v read and written (f32), the gradient read, the copy written.
    let size = dt.size() as u64;
    let bytes = n as u64 * (24 + size + if narrow { size } else { 0 });
    let gbps = bytes as f64 / (time_us.median * 1e-6) / 1e9;
    // The ceiling: a compute copy of the largest tensor (the token embedding, f32).
    let wte = &state[0].0;
    let copy_op = |_: usize| wte.copy().map(drop);
    let (copy_times, _) = time_op(device, &copy_op, samples, quick)?;
    let copy = summarize(&copy_times, "copy")?;
    let copy_gbps = 2.0 * (wte.len() * 4) as f64 / (copy.median * 1e-6) / 1e9;
    eprintln!(
        "bench: {ADAMW_CASE} {} 1x{n} {:.2} µs {gbps:.0} GB/s",
        dt.name(),
        time_us.median
    );
    Ok(OpResult {
        case: ADAMW_CASE,
        dtype: dt.name(),
        rows: 1,
        cols: n,
        variant: format!(
            "{} tensors, one dispatch each{}",
            shapes.len(),
            if narrow { ", f32 master + copy" } else { "" }
        ),
        ops_per_sample: k,
        input_sets: 1,
        time_us,
        bytes_per_op: bytes,
        gbps,
        copy_gbps,
        pct_of_copy: 100.0 * gbps / copy_gbps,
        torch: None,
    })
}

/// `helios bench ops`.
pub fn run(args: &BenchArgs) -> CliResult {
    let quick = args.quick;
    let samples = args
        .samples
        .map_or(if quick { 3 } else { 25 }, |s| s as usize);
    let dtypes: Vec<DType> = if args.dtypes.is_empty() {
        vec![DType::F32, DType::BF16]
    } else {
        args.dtypes.iter().filter_map(|d| parse_dtype(d)).collect()
    };
    let shapes: Vec<(usize, usize)> = if !args.shapes.is_empty() {
        args.shapes
            .iter()
            .map(|s| parse_shape(s))
            .collect::<Result<_, _>>()?
    } else if quick {
        QUICK_SHAPES.to_vec()
    } else {
        SHAPES.to_vec()
    };
    let cases: Vec<&OpCase> = CASES
        .iter()
        .filter(|c| args.cases.is_empty() || args.cases.iter().any(|s| s == c.name))
        .collect();
    let adamw = args.cases.is_empty() || args.cases.iter().any(|s| s == ADAMW_CASE);
    if cases.is_empty() && !adamw {
        let mut names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
        names.push(ADAMW_CASE);
        return Err(format!("--cases selects no ops case (names: {})", names.join(", ")).into());
    }
    let script = super::torch_script(args)?;

    let device = Device::from_env()?;
    let limit = device.context().batch_limit();
    eprintln!("bench: ops on {}", device.name());
    let mut results = Vec::new();
    for &(rows, cols) in shapes.iter().filter(|_| !cases.is_empty()) {
        for &dt in &dtypes {
            let dy = cases.iter().any(|c| c.needs_dy);
            let sets = input_sets(&device, rows, cols, dt, dy)?;
            let n = (rows * cols) as u64;
            let size = dt.size() as u64;
            let copy_op = |i: usize| sets[i % sets.len()].x.copy().map(drop);
            let (copy_times, _) = time_op(&device, &copy_op, samples, quick)?;
            let copy = summarize(&copy_times, "copy")?;
            let copy_gbps = 2.0 * (n * size) as f64 / (copy.median * 1e-6) / 1e9;
            for c in &cases {
                let op = |i: usize| (c.run)(&sets[i % sets.len()]);
                let (times, k) = time_op(&device, &op, samples, quick)?;
                let time_us = summarize(&times, c.name)?;
                let bytes = (c.bytes)(rows as u64, cols as u64, size);
                let gbps = bytes as f64 / (time_us.median * 1e-6) / 1e9;
                let r = OpResult {
                    case: c.name,
                    dtype: dt.name(),
                    rows,
                    cols,
                    variant: (c.variant)(&device, dt, rows, cols),
                    ops_per_sample: k,
                    input_sets: sets.len(),
                    time_us,
                    bytes_per_op: bytes,
                    gbps,
                    copy_gbps,
                    pct_of_copy: 100.0 * gbps / copy_gbps,
                    torch: None,
                };
                eprintln!(
                    "bench: {} {} {rows}x{cols} {:.2} µs {:.0} GB/s ({:.0}% copy)",
                    c.name, r.dtype, r.time_us.median, r.gbps, r.pct_of_copy
                );
                results.push(r);
            }
            drop(sets);
            device.synchronize()?;
        }
    }
    if adamw {
        for &dt in &dtypes {
            results.push(adamw_case(&device, dt, samples, quick)?);
        }
    }
    device.set_batch_limit(limit);

    let (torch_meta, torch_note, rows) = super::torch_side(script.as_deref(), |script| {
        run_torch(script, &cases, adamw, &shapes, &dtypes, samples, quick)
    });
    for r in results.iter_mut() {
        r.torch = rows
            .iter()
            .find(|t| {
                t.case == r.case && t.dtype == r.dtype && t.rows == r.rows && t.cols == r.cols
            })
            .cloned()
            .map(|mut t| {
                t.gbps = Some(r.bytes_per_op as f64 / (t.median_us * 1e-6) / 1e9);
                t
            });
    }

    let torch = (torch_meta, torch_note);
    super::finish(
        args,
        &device,
        "ops",
        torch,
        Some(samples),
        &results,
        |meta| table(meta, &results),
    )
}

/// Runs `torch_reference.py --suite ops` for the same cases, shapes and dtypes.
fn run_torch(
    script: &Path,
    cases: &[&OpCase],
    adamw: bool,
    shapes: &[(usize, usize)],
    dtypes: &[DType],
    samples: usize,
    quick: bool,
) -> Result<(serde_json::Value, Vec<TorchOp>), String> {
    let mut names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    if adamw {
        names.push(ADAMW_CASE);
    }
    let shapes: Vec<String> = shapes.iter().map(|(r, c)| format!("{r}x{c}")).collect();
    let dts: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
    let mut cmd = super::torch::command(script, "ops", quick);
    cmd.args(["--ops-cases", &names.join(",")])
        .args(["--ops-shapes", &shapes.join(",")])
        .args(["--dtypes", &dts.join(",")])
        .args(["--ops-samples", &samples.to_string()]);
    super::torch::execute(script, cmd)
}

/// GB/s: whole numbers where they are large, three decimals on slow (CPU) devices.
fn gbps(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.0}")
    }
}

fn table(meta: &report::RunMeta, rows: &[OpResult]) -> String {
    use std::fmt::Write as _;
    let mut s = meta.header();
    let torch = rows.iter().any(|r| r.torch.is_some());
    let mut head = vec![
        "case",
        "dtype",
        "shape",
        "median µs",
        "p95",
        "CV",
        "GB/s",
        "% copy",
    ];
    if torch {
        head.extend(["torch µs", "torch GB/s", "torch/helios"]);
    }
    head.push("variant");
    let mut table: Vec<Vec<String>> = vec![head.iter().map(|h| h.to_string()).collect()];
    for r in rows {
        let mut row = vec![
            r.case.to_owned(),
            r.dtype.to_owned(),
            format!("{}x{}", r.rows, r.cols),
            format!("{:.2}", r.time_us.median),
            format!("{:.2}", r.time_us.p95),
            format!("{:.1}%", 100.0 * r.time_us.cv),
            gbps(r.gbps),
            format!("{:.1}%", r.pct_of_copy),
        ];
        if torch {
            match &r.torch {
                Some(t) => row.extend([
                    format!("{:.2}", t.median_us),
                    t.gbps.map_or("-".into(), gbps),
                    r.speedup().map_or("-".into(), |x| format!("{x:.2}x")),
                ]),
                None => row.extend(["-".into(), "-".into(), "-".into()]),
            }
        }
        row.push(r.variant.clone());
        table.push(row);
    }
    let cols = table[0].len();
    let width: Vec<usize> = (0..cols)
        .map(|i| {
            table
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let _ = writeln!(
        s,
        "\nops: GPU time (timestamps) per op of K back-to-back ops; GB/s = ideal bytes (inputs read once, \
         outputs written once) / median; % copy = of the compute copy of the same tensor{}",
        if torch { "; torch/helios > 1: Helios faster" } else { "" }
    );
    for r in &table {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            let pad = width[i] - cell.chars().count();
            if i > 0 {
                line.push_str("  ");
            }
            if i < 3 || i == cols - 1 {
                line.push_str(cell);
                line.extend(std::iter::repeat(' ').take(pad));
            } else {
                line.extend(std::iter::repeat(' ').take(pad));
                line.push_str(cell);
            }
        }
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        assert_eq!(parse_shape("4096x768"), Ok((4096, 768)));
        assert_eq!(parse_shape(" 8 X 50257 "), Ok((8, 50257)));
        assert!(parse_shape("4096").is_err());
        assert!(parse_shape("0x5").is_err());
        assert!(parse_shape("65536x65536").is_err());
    }

    #[test]
    fn case_names_are_unique() {
        for (i, a) in CASES.iter().enumerate() {
            assert!(CASES[i + 1..].iter().all(|b| b.name != a.name));
        }
        assert_eq!((CASES[0].bytes)(2, 3, 4), 48);
    }
}
