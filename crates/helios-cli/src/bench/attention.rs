// `helios bench attention`: fused causal attention, forward and forward+backward, at GPT-2
// shapes (B=8 H=12 T=512 and 1024, D=64) and B=4 H=16 T=2048 D=128, in bf16, f16 and f32,
// beside PyTorch's `scaled_dot_product_attention` and the naive form that stores the scores
// (`--compare torch`, bench/torch_attention.py, same run).
//
// Methodology as `bench ops`: each sample is K back-to-back ops between two GPU timestamps
// (K so a sample lasts ~5 ms), per-op time = sample / K, outputs dropped at once. Q, K and V
// are the three views of one fused [B, T, 3, H, D] tensor (what the QKV projection writes);
// fwd+bwd is `attention` then `attention_backward` with a random dO. TFLOP/s counts causal
// FLOPs: forward 2·B·H·T²·D (two T×T×D products, half the scores masked), fwd+bwd 3.5× that
// (the backward's five products), whatever a kernel recomputes.

use std::path::Path;

use helios::{AttentionOptions, AttnStage, DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::stats::Summary;
use super::{random_values, report, summarize, BenchArgs, BenchResult};
use crate::CliResult;

/// (B, H, T, D).
const SHAPES: [(usize, usize, usize, usize); 3] =
    [(8, 12, 512, 64), (8, 12, 1024, 64), (4, 16, 2048, 128)];
const QUICK_SHAPES: [(usize, usize, usize, usize); 1] = [(1, 2, 70, 64)];
const MODES: [&str; 2] = ["fwd", "fwdbwd"];

/// PyTorch's figures for one case (bench/torch_attention.py).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct TorchAttn {
    pub case: String,
    pub dtype: String,
    pub shape: String,
    /// SDPA.
    pub median_us: f64,
    pub p95_us: f64,
    /// The naive form (scores stored), when it ran.
    #[serde(default)]
    pub naive_us: Option<f64>,
    /// SDPA with FlashAttention-2 forced (mma.sync, as Helios's kernels), f16/bf16.
    #[serde(default)]
    pub flash2_us: Option<f64>,
    /// The kernel family SDPA ran ("cudnn-wgmma", "flash2", ...: bench/torch_attention.py).
    #[serde(default)]
    pub backend: Option<String>,
    /// "graph" (CUDA-graph replay: GPU time, as Helios's timestamps) or "eager".
    #[serde(default)]
    pub timing: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AttnResult {
    pub case: &'static str,
    pub dtype: &'static str,
    /// "BxHxTxD".
    pub shape: String,
    pub variant: String,
    pub ops_per_sample: usize,
    pub time_us: Summary,
    pub tflops: f64,
    pub torch: Option<TorchAttn>,
}

fn flops(mode: &str, (b, h, t, d): (usize, usize, usize, usize)) -> f64 {
    let fwd = 2.0 * (b * h * d) as f64 * (t * t) as f64;
    if mode == "fwd" {
        fwd
    } else {
        3.5 * fwd
    }
}

/// Samples of one attention call (up to 8 dispatches, fwd+bwd with Prep); quick runs
/// keep K at 2.
fn time_op(
    device: &Device,
    run: &dyn Fn() -> helios::Result<()>,
    samples: usize,
    quick: bool,
) -> BenchResult<(Vec<f64>, usize)> {
    let (target_us, max_k) = if quick { (1_000.0, 2) } else { (5_000.0, 512) };
    let plan = super::Sampling {
        target_us,
        first: 2,
        max_k,
        dispatches: 8,
    };
    super::time_ops(device, &|_| run(), samples, plan)
}

fn parse_dtype(name: &str) -> Option<DType> {
    ["f32", "f16", "bf16"]
        .iter()
        .zip([DType::F32, DType::F16, DType::BF16])
        .find(|(n, _)| **n == name)
        .map(|(_, d)| d)
}

pub fn run(args: &BenchArgs) -> CliResult {
    let quick = args.quick;
    let samples = args
        .samples
        .map_or(if quick { 3 } else { 20 }, |s| s as usize);
    let dtypes: Vec<DType> = if args.dtypes.is_empty() {
        vec![DType::BF16, DType::F16, DType::F32]
    } else {
        args.dtypes.iter().filter_map(|d| parse_dtype(d)).collect()
    };
    let shapes: Vec<(usize, usize, usize, usize)> = if !args.shapes.is_empty() {
        args.shapes
            .iter()
            .map(|s| parse_shape(s))
            .collect::<Result<_, _>>()?
    } else if quick {
        QUICK_SHAPES.to_vec()
    } else {
        SHAPES.to_vec()
    };
    let modes: Vec<&'static str> = MODES
        .into_iter()
        .filter(|m| args.cases.is_empty() || args.cases.iter().any(|c| c == m))
        .collect();
    // --torch-script names the attention script here (bench/torch_attention.py by default).
    let script = match (&args.compare, &args.torch_script) {
        (None, _) => None,
        (Some(_), Some(p)) => Some(p.clone()),
        (Some(_), None) => match locate_script() {
            Ok(p) => Some(p),
            Err(note) => {
                eprintln!("note: torch comparison skipped: {note}");
                None
            }
        },
    };

    let device = Device::from_env()?;
    let limit = device.context().batch_limit();
    eprintln!("bench: attention on {}", device.name());
    let mut results = Vec::new();
    let opts = AttentionOptions::causal();
    for &shape @ (b, h, t, d) in &shapes {
        for &dt in &dtypes {
            let n = b * t * 3 * h * d;
            let qkv = Tensor::from_slice_as(&device, &random_values(n, 1), &[b, t, 3, h, d], dt)?;
            let [q, k, v] = qkv.split_qkv()?;
            let dout = Tensor::from_slice_as(
                &device,
                &random_values(b * t * h * d, 2),
                &[b, t, h, d],
                dt,
            )?;
            for &mode in &modes {
                let fwd = || q.attention(&k, &v, &opts).map(drop);
                let both = || {
                    let f = q.attention(&k, &v, &opts)?;
                    q.attention_backward(&k, &v, &f, &dout, &opts).map(drop)
                };
                let run: &dyn Fn() -> helios::Result<()> = if mode == "fwd" { &fwd } else { &both };
                super::profile_start(&device)?;
                let (times, kk) = time_op(&device, run, samples, quick)?;
                let stages = stage_times(&device)?;
                let time_us = summarize(&times, mode)?;
                let mut variant = q.attention_kernel(AttnStage::Forward, &opts)?;
                if mode == "fwdbwd" {
                    variant = format!(
                        "{variant} + {} + {}",
                        q.attention_kernel(AttnStage::DkDv, &opts)?,
                        q.attention_kernel(AttnStage::Dq, &opts)?
                    );
                }
                variant.push_str(&stages);
                let r = AttnResult {
                    case: mode,
                    dtype: dt.name(),
                    shape: format!("{b}x{h}x{t}x{d}"),
                    variant,
                    ops_per_sample: kk,
                    tflops: flops(mode, shape) / (time_us.median * 1e-6) / 1e12,
                    time_us,
                    torch: None,
                };
                eprintln!(
                    "bench: attention {mode} {} {} {:.1} µs {:.1} TFLOP/s",
                    r.dtype, r.shape, r.time_us.median, r.tflops
                );
                results.push(r);
            }
            device.synchronize()?;
        }
    }
    device.set_batch_limit(limit);

    let (torch_meta, torch_note, rows) = super::torch_side(script.as_deref(), |script| {
        run_torch(script, &modes, &shapes, &dtypes, samples, quick)
    });
    for r in results.iter_mut() {
        r.torch = rows
            .iter()
            .find(|t| t.case == r.case && t.dtype == r.dtype && t.shape == r.shape)
            .cloned();
    }
    let torch = (torch_meta, torch_note);
    super::finish(
        args,
        &device,
        "attention",
        torch,
        Some(samples),
        &results,
        |meta| table(meta, &results),
    )
}

/// With HELIOS_PROFILE=1, the mean GPU time of each attention stage's kernel since
/// `profile_start` (the stage from the kernel's name), e.g. "; GPU µs fwd 74.5 prep 8.1
/// dkdv 130.2 dq 92.3"; empty otherwise. Timestamps around every dispatch slow the ops a
/// little, so the case's own median is the figure to quote.
fn stage_times(device: &Device) -> BenchResult<String> {
    let Some(rows) = super::profile_rows(device)? else {
        return Ok(String::new());
    };
    let stages: Vec<String> = rows
        .iter()
        .filter_map(|row| {
            let stage = row.name.strip_prefix("attn_")?.split('_').next()?;
            Some(format!("{stage} {:.1}", row.mean_ns / 1e3))
        })
        .collect();
    Ok(match stages.is_empty() {
        true => String::new(),
        false => format!("; GPU µs {}", stages.join(" ")),
    })
}

/// bench/torch_attention.py under the current directory or above the binary.
fn locate_script() -> Result<std::path::PathBuf, String> {
    super::torch::locate(None, "bench/torch_attention.py")
}

/// "BxHxTxD".
fn parse_shape(s: &str) -> Result<(usize, usize, usize, usize), String> {
    let v: Vec<usize> = s
        .split('x')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("--shapes {s:?}: use BxHxTxD"))?;
    match v[..] {
        [b, h, t, d] => Ok((b, h, t, d)),
        _ => Err(format!("--shapes {s:?}: use BxHxTxD")),
    }
}

fn run_torch(
    script: &Path,
    modes: &[&str],
    shapes: &[(usize, usize, usize, usize)],
    dtypes: &[DType],
    samples: usize,
    quick: bool,
) -> Result<(serde_json::Value, Vec<TorchAttn>), String> {
    let shapes: Vec<String> = shapes
        .iter()
        .map(|(b, h, t, d)| format!("{b}x{h}x{t}x{d}"))
        .collect();
    let dts: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script).args(["--json", "-"]);
    if quick {
        cmd.arg("--quick");
    }
    cmd.args(["--modes", &modes.join(",")])
        .args(["--shapes", &shapes.join(",")])
        .args(["--dtypes", &dts.join(",")])
        .args(["--samples", &samples.to_string()]);
    super::torch::execute(script, cmd)
}

fn table(meta: &report::RunMeta, rows: &[AttnResult]) -> String {
    use std::fmt::Write as _;
    let mut s = meta.header();
    let mut table: Vec<Vec<String>> = vec![[
        "case",
        "dtype",
        "BxHxTxD",
        "median µs",
        "p95",
        "TFLOP/s",
        "sdpa µs",
        "sdpa TFLOP/s",
        "sdpa/helios",
        "naive µs",
        "naive/helios",
        "flash2 µs",
        "torch timing",
        "sdpa kernel",
        "variant",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect()];
    for r in rows {
        let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.1}"));
        let text = |v: Option<&str>| v.unwrap_or("-").to_owned();
        let sdpa = r.torch.as_ref().map(|t| t.median_us);
        let naive = r.torch.as_ref().and_then(|t| t.naive_us);
        let tf = sdpa.map(|u| r.tflops * r.time_us.median / u);
        let ratio =
            |x: Option<f64>| x.map_or("-".to_owned(), |u| format!("{:.2}x", u / r.time_us.median));
        table.push(vec![
            r.case.to_owned(),
            r.dtype.to_owned(),
            r.shape.clone(),
            format!("{:.1}", r.time_us.median),
            format!("{:.1}", r.time_us.p95),
            format!("{:.1}", r.tflops),
            f(sdpa),
            f(tf),
            ratio(sdpa),
            f(naive),
            ratio(naive),
            f(r.torch.as_ref().and_then(|t| t.flash2_us)),
            text(r.torch.as_ref().and_then(|t| t.timing.as_deref())),
            text(r.torch.as_ref().and_then(|t| t.backend.as_deref())),
            r.variant.clone(),
        ]);
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
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .zip(&width)
            .map(|(c, w)| format!("{c:>w$}", w = *w))
            .collect();
        let _ = writeln!(s, "{}", line.join("  ").trim_end());
    }
    s
}
