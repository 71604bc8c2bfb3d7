// `helios bench graph`: the lazy graph as a user sees it, beside PyTorch eager and
// `torch.compile` (`--compare torch` runs bench/torch_graph.py).
//
// Cases:
// - `chain1000`: 1000 dependent element-wise ops on 1024 f32, then a read; host wall per op.
// - `roundtrip`: one op and its read-back; latency.
// - `mixed32`: 32 mixed element-wise ops with a broadcast bias over 4096×4096 f32; time, and
//   the ratio to moving the ideal bytes once (one read of x, one write of y) at the speed of a
//   copy of the same tensor measured in this run.
// - `mlp_block`: GPT-2's MLP block (LN → fc+bias → GELU → proj+bias → +x) forward and
//   backward over 8192×768, f32 and bf16; time per step, kernels per step, and with
//   HELIOS_PROFILE=1 the share of GPU time outside matmul and the GPU time per step (the
//   wall time's excess over it is the GPU's idle time: the host's start, submits, waits).
// - `host12`: host time to build and realise a 12-block transformer's forward and backward
//   (GPT-2's block as `helios_nn` writes it, at small shapes, so the GPU is not what is
//   measured): the first step (cold: kernels generated and compiled) and the median of later
//   ones (cached), and the same until the submit thread has submitted everything too
//   (`host12_submitted`).
// Key decision: every time is host wall clock around `synchronize`, as a user's loop sees it,
// the same methodology as the PyTorch script.

use std::path::Path;
use std::time::Instant;

use helios::{DType, Device, IndexTensor, MatmulOptions, Tensor};
use serde::{Deserialize, Serialize};

use super::stats::Summary;
use super::{random_values, summarize, BenchArgs, BenchResult};
use crate::CliResult;

/// One measured case.
#[derive(Debug, Serialize)]
struct GraphResult {
    case: String,
    dtype: &'static str,
    /// What was run (shape, kernels).
    variant: String,
    /// Per op (`chain1000`), per step, or per call, µs.
    time_us: Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    kernels_per_step: Option<f64>,
    /// `mixed32`: time / (ideal bytes at this run's copy bandwidth).
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_ideal: Option<f64>,
    /// `mlp_block` with HELIOS_PROFILE=1: GPU time outside matmul kernels / all.
    #[serde(skip_serializing_if = "Option::is_none")]
    outside_matmul: Option<f64>,
    /// `mlp_block` with HELIOS_PROFILE=1: the kernels' GPU time per step, µs. Below the
    /// step's wall time by the GPU's idle time in it (the host's start, submits and waits).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_us_per_step: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    torch: Option<TorchGraph>,
}

/// A case as bench/torch_graph.py reports it.
#[derive(Clone, Debug, Deserialize, Serialize)]
struct TorchGraph {
    case: String,
    dtype: String,
    eager_us: f64,
    #[serde(default)]
    compile_us: Option<f64>,
    #[serde(default)]
    eager_kernels: Option<f64>,
    #[serde(default)]
    compile_kernels: Option<f64>,
    /// `mlp_block`: the share of eager's (compiled code's) GPU time outside GEMM kernels.
    #[serde(default)]
    eager_outside_mm: Option<f64>,
    #[serde(default)]
    compile_outside_mm: Option<f64>,
}

struct Sizes {
    samples: usize,
    mixed: (usize, usize),
    mlp_rows: usize,
    mlp_c: usize,
    host: (usize, usize, usize, usize),
}

/// The suite's cases, in the order they run (`--cases` selects among them).
const CASES: [&str; 6] = [
    "chain1000",
    "roundtrip",
    "mixed32",
    "mlp_block",
    "mlp_plain",
    "host12",
];

pub fn run(args: &BenchArgs) -> CliResult {
    let quick = args.quick;
    let sizes = Sizes {
        samples: args
            .samples
            .map_or(if quick { 3 } else { 25 }, |s| s as usize),
        mixed: if quick { (64, 256) } else { (4096, 4096) },
        mlp_rows: if quick { 64 } else { 8192 },
        mlp_c: if quick { 64 } else { 768 },
        // layers, batch, sequence, width
        host: if quick {
            (2, 1, 16, 32)
        } else {
            (12, 1, 64, 128)
        },
    };
    let dtypes: Vec<DType> = if args.dtypes.is_empty() {
        vec![DType::F32, DType::BF16]
    } else {
        args.dtypes
            .iter()
            .filter_map(|d| DType::ALL.into_iter().find(|t| t.name() == d))
            .collect()
    };
    let cases: Vec<&str> = match args.cases.is_empty() {
        true => CASES.to_vec(),
        false => args
            .cases
            .iter()
            .map(|c| {
                CASES
                    .iter()
                    .copied()
                    .find(|&k| k == c.trim())
                    .ok_or_else(|| {
                        format!(
                            "--cases: the graph suite has no case {c:?}; its cases are {}",
                            CASES.join(", ")
                        )
                    })
            })
            .collect::<Result<_, _>>()?,
    };
    let script = super::torch_script_named(args, "bench/torch_graph.py")?;
    let device = Device::from_env()?;
    eprintln!("bench: graph on {}", device.name());
    let mut results = Vec::new();
    for case in CASES.iter().filter(|c| cases.contains(c)) {
        match *case {
            "chain1000" => results.push(chain(&device, &sizes)?),
            "roundtrip" => results.push(roundtrip(&device, &sizes)?),
            "mixed32" => results.push(mixed(&device, &sizes)?),
            "mlp_block" | "mlp_plain" => {
                for &dt in &dtypes {
                    results.push(mlp_block(&device, &sizes, dt, *case == "mlp_plain")?);
                }
            }
            _ => results.extend(host12(&device, &sizes)?),
        }
    }

    let (torch_meta, torch_note, rows) = super::torch_side(script.as_deref(), |script| {
        run_torch(script, &sizes, &dtypes, &cases, quick)
    });
    for r in results.iter_mut() {
        // mlp_plain is mlp_block written with plain ops: PyTorch's side is the same.
        let case = match r.case.as_str() {
            "mlp_plain" => "mlp_block",
            c => c,
        };
        r.torch = rows
            .iter()
            .find(|t| t.case == case && t.dtype == r.dtype)
            .cloned();
    }
    let torch = (torch_meta, torch_note);
    super::finish(args, &device, "graph", torch, None, &results, |_| {
        table(&results)
    })
}

fn result(case: &str, dtype: DType, variant: String, time_us: Summary) -> GraphResult {
    GraphResult {
        case: case.to_string(),
        dtype: dtype.name(),
        variant,
        time_us,
        kernels_per_step: None,
        vs_ideal: None,
        outside_matmul: None,
        gpu_us_per_step: None,
        torch: None,
    }
}

/// `samples` timings (µs) of `step` after `warmup` untimed ones, with the encoder's
/// dispatches per step.
fn timed(
    device: &Device,
    samples: usize,
    warmup: usize,
    mut step: impl FnMut() -> helios::Result<()>,
) -> BenchResult<(Vec<f64>, f64)> {
    for _ in 0..warmup {
        step()?;
        device.synchronize()?;
    }
    let before = device.encoder_stats();
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        device.synchronize()?;
        let t0 = Instant::now();
        step()?;
        device.synchronize()?;
        times.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let kernels = (device.encoder_stats().dispatches - before.dispatches) as f64 / samples as f64;
    Ok((times, kernels))
}

fn chain(device: &Device, s: &Sizes) -> BenchResult<GraphResult> {
    const OPS: usize = 1000;
    let x = Tensor::from_slice(device, &random_values(1024, 1), &[1024])?;
    let (times, kernels) = timed(device, s.samples, 3, || {
        let mut t = x.clone();
        for i in 0..OPS {
            t = match i % 2 {
                0 => t.mul_scalar(1.0001)?,
                _ => t.add_scalar(-0.0001)?,
            };
        }
        t.to_vec().map(drop)
    })?;
    let per_op: Vec<f64> = times.iter().map(|t| t / OPS as f64).collect();
    let mut r = result(
        "chain1000",
        DType::F32,
        format!("{OPS} ops on 1024, then to_vec; µs per op"),
        summarize(&per_op, "chain1000")?,
    );
    r.kernels_per_step = Some(kernels);
    Ok(r)
}

fn roundtrip(device: &Device, s: &Sizes) -> BenchResult<GraphResult> {
    let x = Tensor::from_slice(device, &random_values(1024, 2), &[1024])?;
    let (times, kernels) = timed(device, s.samples * 40, 20, || {
        x.add_scalar(1.0)?.to_vec().map(drop)
    })?;
    let mut r = result(
        "roundtrip",
        DType::F32,
        "add_scalar + to_vec on 1024".into(),
        summarize(&times, "roundtrip")?,
    );
    r.kernels_per_step = Some(kernels);
    Ok(r)
}

fn mixed(device: &Device, s: &Sizes) -> BenchResult<GraphResult> {
    let (rows, cols) = s.mixed;
    let x = Tensor::from_slice(device, &random_values(rows * cols, 3), &[rows, cols])?;
    let b = Tensor::from_slice(device, &random_values(cols, 4), &[cols])?;
    super::profile_start(device)?;
    let (copy, _) = timed(device, s.samples, 3, || x.copy()?.realize())?;
    let copy_gpu = super::busiest_kernel_us(device)?;
    super::profile_start(device)?;
    let (times, kernels) = timed(device, s.samples, 3, || {
        // 32 element-wise ops: the bias, one GELU, and scalings, residuals, clamps and
        // differences (arithmetic, as most of a training step's element-wise work is).
        let mut y = x.add(&b)?.gelu_tanh()?;
        for i in 0..5 {
            y = y
                .mul_scalar(0.5 + 0.1 * i as f32)?
                .add(&x)?
                .maximum_scalar(-1.0)?;
            y = y.sub(&b)?.minimum_scalar(1.0)?.add_scalar(0.25)?;
        }
        y.realize()
    })?;
    let fused_gpu = super::busiest_kernel_us(device)?;
    let copy_med = summarize(&copy, "copy")?.median;
    let time = summarize(&times, "mixed32")?;
    let gpu = match (fused_gpu, copy_gpu) {
        (Some(f), Some(c)) => format!("; GPU {f:.1} µs, copy {c:.1} ({:.2}x)", f / c),
        _ => String::new(),
    };
    let mut r = result(
        "mixed32",
        DType::F32,
        format!("32 ops (1 GELU), bias ({cols}) over {rows}x{cols}; copy {copy_med:.1} µs{gpu}"),
        time,
    );
    r.kernels_per_step = Some(kernels);
    r.vs_ideal = Some(time.median / copy_med);
    Ok(r)
}

/// Untimed steps before `mlp_block`'s samples (kept out of its profile).
const WARMUP: usize = 3;

/// GPT-2's MLP block, fwd+bwd: with the epilogue options `helios_nn` passes, or (`plain`,
/// the case mlp_plain) written with plain ops, `x.matmul(&w)?.add(&b)?.gelu_tanh()?`, whose
/// tails the scheduler folds into the products' epilogues.
fn mlp_block(device: &Device, s: &Sizes, dt: DType, plain: bool) -> BenchResult<GraphResult> {
    let (n, c) = (s.mlp_rows, s.mlp_c);
    let t = |len: usize, shape: &[usize], seed: u64, scale: f32| -> helios::Result<Tensor> {
        let v: Vec<f32> = random_values(len, seed).iter().map(|x| x * scale).collect();
        Tensor::from_slice_as(device, &v, shape, dt)
    };
    let x = t(n * c, &[n, c], 5, 1.0)?.requires_grad_();
    let dy = t(n * c, &[n, c], 6, 1.0)?;
    let gamma = t(c, &[c], 7, 1.0)?.requires_grad_();
    let beta = t(c, &[c], 8, 0.1)?.requires_grad_();
    let w1 = t(c * 4 * c, &[c, 4 * c], 9, 0.02)?.requires_grad_();
    let b1 = t(4 * c, &[4 * c], 10, 0.02)?.requires_grad_();
    let w2 = t(4 * c * c, &[4 * c, c], 11, 0.02)?.requires_grad_();
    let b2 = t(c, &[c], 12, 0.02)?.requires_grad_();
    let params = [&x, &gamma, &beta, &w1, &b1, &w2, &b2];
    let step = || -> helios::Result<()> {
        let h = x.layer_norm(&gamma, &beta, 1e-5)?.y;
        let y = match plain {
            true => {
                let h = h.matmul(&w1)?.add(&b1)?.gelu_tanh()?;
                h.matmul(&w2)?.add(&b2)?.add(&x)?
            }
            false => {
                let fc = MatmulOptions {
                    bias: Some(&b1),
                    act: helios::Activation::GeluTanh,
                    ..Default::default()
                };
                let h = h.matmul_opts(&w1, &fc)?;
                let proj = MatmulOptions {
                    bias: Some(&b2),
                    residual: Some(&x),
                    ..Default::default()
                };
                h.matmul_opts(&w2, &proj)?
            }
        };
        y.mul(&dy)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
        for p in params {
            p.grad().expect("backward reached it").realize()?;
            p.zero_grad();
        }
        Ok(())
    };
    // Warm-up outside the profile, so that it holds the timed steps' kernels alone.
    for _ in 0..WARMUP {
        step()?;
        device.synchronize()?;
    }
    super::profile_start(device)?;
    let (times, kernels) = timed(device, s.samples, 0, step)?;
    let name = if plain { "mlp_plain" } else { "mlp_block" };
    let form = if plain {
        "plain ops"
    } else {
        "epilogue options"
    };
    let mut r = result(
        name,
        dt,
        format!("LN→fc+b→GELU→proj+b→+x fwd+bwd, {n}x{c}, {form}"),
        summarize(&times, name)?,
    );
    r.kernels_per_step = Some(kernels);
    if let Some(report) = device.profile_report()? {
        let total: u64 = report.rows.iter().map(|r| r.total_ns).sum();
        let mm: u64 = report
            .rows
            .iter()
            .filter(|r| r.name.starts_with("mm_"))
            .map(|r| r.total_ns)
            .sum();
        r.outside_matmul = (total > 0).then(|| (total - mm) as f64 / total as f64);
        let per_step = total as f64 / s.samples as f64 / 1e3;
        r.gpu_us_per_step = Some(per_step);
        eprintln!(
            "{name} {dt}: GPU time per kernel (timed steps)\n{report}\n\
             {name} {dt}: GPU time {per_step:.1} µs a step, wall median {:.1} µs",
            r.time_us.median
        );
    }
    Ok(r)
}

/// GPT-2's pre-LN transformer block over (b, t, c), 4 heads, as `helios_nn` writes it: the
/// fused q|k|v projection with its bias, the attention op reading q, k and v in place
/// (`causal_self_attention`), the output projection with its bias and the residual in its
/// epilogue, then the MLP (fc with bias and GELU, proj with bias and residual). Parameters
/// in `p`: ln_1 w, b; attn w (c, 3c), b; proj w (c, c), b; ln_2 w, b; fc w (c, 4c), b;
/// fc proj w (4c, c), b.
fn block(x: &Tensor, p: &[Tensor]) -> helios_nn::Result<Tensor> {
    fn linear<'a>(
        bias: &'a Tensor,
        residual: Option<&'a Tensor>,
        act: helios::Activation,
    ) -> MatmulOptions<'a> {
        MatmulOptions {
            bias: Some(bias),
            residual,
            act,
            ..Default::default()
        }
    }
    let none = helios::Activation::None;
    let h = x.layer_norm(&p[0], &p[1], 1e-5)?.y;
    let qkv = h.matmul_opts(&p[2], &linear(&p[3], None, none))?;
    let a = helios_nn::model::causal_self_attention(&qkv, HOST12_HEADS)?;
    let x = a.matmul_opts(&p[4], &linear(&p[5], Some(x), none))?;
    let h = x.layer_norm(&p[6], &p[7], 1e-5)?.y;
    let f = h.matmul_opts(&p[8], &linear(&p[9], None, helios::Activation::GeluTanh))?;
    Ok(f.matmul_opts(&p[10], &linear(&p[11], Some(&x), none))?)
}

/// Heads of host12's blocks.
const HOST12_HEADS: usize = 4;

fn host12(device: &Device, s: &Sizes) -> BenchResult<Vec<GraphResult>> {
    let (layers, b, t, c) = s.host;
    let mut seed = 20;
    let mut param = |shape: &[usize], scale: f32| -> helios::Result<Tensor> {
        seed += 1;
        let len = shape.iter().product();
        let v: Vec<f32> = random_values(len, seed).iter().map(|x| x * scale).collect();
        Ok(Tensor::from_slice(device, &v, shape)?.requires_grad_())
    };
    let mut params = Vec::new();
    for _ in 0..layers {
        params.push(vec![
            param(&[c], 1.0)?,
            param(&[c], 0.1)?,
            param(&[c, 3 * c], 0.05)?,
            param(&[3 * c], 0.02)?,
            param(&[c, c], 0.05)?,
            param(&[c], 0.02)?,
            param(&[c], 1.0)?,
            param(&[c], 0.1)?,
            param(&[c, 4 * c], 0.05)?,
            param(&[4 * c], 0.02)?,
            param(&[4 * c, c], 0.05)?,
            param(&[c], 0.02)?,
        ]);
    }
    let x = Tensor::from_slice(device, &random_values(b * t * c, 40), &[b, t, c])?;
    let targets = IndexTensor::from_slice(device, &vec![3; b * t], &[b * t])?;
    // Host µs until everything is recorded (the thread is free), and until it is submitted
    // too (the submit thread's last batch included).
    let step = || -> BenchResult<(f64, f64)> {
        let t0 = Instant::now();
        let mut h = x.clone();
        for p in &params {
            h = block(&h, p)?;
        }
        let loss = h.reshape(&[b * t, c])?.cross_entropy(&targets, None)?.loss;
        loss.backward()?;
        for p in params.iter().flatten() {
            p.grad().expect("backward reached it").realize()?;
            p.zero_grad();
        }
        // Host time: everything recorded, nothing waited for.
        let host = t0.elapsed().as_secs_f64() * 1e6;
        device.flush()?;
        let submitted = t0.elapsed().as_secs_f64() * 1e6;
        device.synchronize()?;
        Ok((host, submitted))
    };
    let (cold, _) = step()?;
    let mut cached = Vec::with_capacity(s.samples);
    let mut submitted = Vec::with_capacity(s.samples);
    for _ in 0..s.samples {
        let (host, all) = step()?;
        cached.push(host);
        submitted.push(all);
    }
    let variant = format!("{layers} blocks, b{b} t{t} c{c}, fwd+bwd recorded");
    Ok(vec![
        result(
            "host12_cold",
            DType::F32,
            variant.clone(),
            summarize(&[cold], "cold")?,
        ),
        result(
            "host12_cached",
            DType::F32,
            variant.clone(),
            summarize(&cached, "cached")?,
        ),
        result(
            "host12_submitted",
            DType::F32,
            variant,
            summarize(&submitted, "cached, until submitted")?,
        ),
    ])
}

fn run_torch(
    script: &Path,
    s: &Sizes,
    dtypes: &[DType],
    cases: &[&str],
    quick: bool,
) -> Result<(serde_json::Value, Vec<TorchGraph>), String> {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script).args(["--json", "-"]);
    cmd.args(["--samples", &s.samples.to_string()]);
    cmd.args(["--mixed", &format!("{}x{}", s.mixed.0, s.mixed.1)]);
    cmd.args(["--mlp", &format!("{}x{}", s.mlp_rows, s.mlp_c)]);
    let names: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
    cmd.args(["--dtypes", &names.join(",")]);
    // host12 has no PyTorch side; mlp_plain's is mlp_block's.
    let mut torch_cases: Vec<&str> = Vec::new();
    for &c in cases {
        let c = if c == "mlp_plain" { "mlp_block" } else { c };
        if c != "host12" && !torch_cases.contains(&c) {
            torch_cases.push(c);
        }
    }
    cmd.args(["--cases", &torch_cases.join(",")]);
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("failed").to_string());
    }
    if std::env::var("HELIOS_PROFILE").as_deref() == Ok("1") {
        // The script's per-kernel tables (it reads the same variable), beside ours.
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{}: bad JSON: {e}", script.display()))?;
    let rows: Vec<TorchGraph> = serde_json::from_value(doc["results"].clone())
        .map_err(|e| format!("{}: bad results: {e}", script.display()))?;
    Ok((doc["meta"].clone(), rows))
}

fn table(results: &[GraphResult]) -> String {
    let mut s = String::from(
        "case           dtype  median µs    p95 µs   cv%  kernels  vs ideal  outside mm  torch eager  compile  (kernels eager/compile)  (outside mm eager/compile)  variant\n",
    );
    for r in results {
        let opt = |v: Option<f64>, w: usize, p: usize| match v {
            Some(v) => format!("{v:>w$.p$}"),
            None => format!("{:>w$}", "-"),
        };
        let pair = |a: Option<f64>, b: Option<f64>, scale: f64, p: usize| {
            format!(
                "{}/{}",
                opt(a.map(|v| v * scale), 0, p).trim(),
                opt(b.map(|v| v * scale), 0, p).trim()
            )
        };
        let (te, tc, tk, tm) = match &r.torch {
            Some(t) => (
                Some(t.eager_us),
                t.compile_us,
                pair(t.eager_kernels, t.compile_kernels, 1.0, 0),
                pair(t.eager_outside_mm, t.compile_outside_mm, 100.0, 1),
            ),
            None => (None, None, "-".into(), "-".into()),
        };
        s.push_str(&format!(
            "{:14} {:5} {:>10.2} {:>9.2} {:>5.1} {} {} {} {} {} {:>24} {:>27}  {}\n",
            r.case,
            r.dtype,
            r.time_us.median,
            r.time_us.p95,
            100.0 * r.time_us.cv,
            opt(r.kernels_per_step, 8, 1),
            opt(r.vs_ideal, 9, 2),
            opt(r.outside_matmul.map(|v| 100.0 * v), 10, 1),
            opt(te, 12, 2),
            opt(tc, 8, 2),
            tk,
            tm,
            r.variant
        ));
    }
    s
}
