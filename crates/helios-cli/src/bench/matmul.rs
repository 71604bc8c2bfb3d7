// `helios bench matmul`: matrix products at the sizes a GPT-2 training step runs (and squares),
// fp32/f16/bf16, beside cuBLAS through PyTorch (`--compare torch`), with the throughput of the
// cooperative-matrix instruction alone as the ceiling each variant is compared with.
//
// Methodology: per case and dtype, the autotuner first checks every feasible variant against
// the f64 reference on a small problem of the same form and times the survivors on the
// case's own operands (its report is kept in the JSON); the winner then runs `samples`
// samples of `r` back-to-back products between two GPU timestamps (`r` chosen so a sample
// lasts ~5 ms), per-op time = sample / r. The relative error ‖out − ref‖ / ‖ref‖ is computed
// against the f64 reference on 8 evenly spaced rows (every column up to 8192, else evenly
// spaced columns). PyTorch runs the same cases with `torch.matmul`, TF32 off, CUDA events
// and the same sampling. Inputs are uniform in [-1, 1), never zeros. With `--variants`, each
// listed variant (table names or cooperative tiles outside the table, `Variant::parse`) is
// forced, unsplit, and measured the same way instead of the tuner's choice: candidate
// designs side by side in one run, beside the same PyTorch figure.
// Case names: `sq<n>` (n×n×n), `gpt2_<layer>_<fwd|dx|dw>` for the linear layers of GPT-2 124M
// at batch×sequence 4096 (qkv 768→2304, fc 768→3072, proj 3072→768, lmhead 768→50257) with
// PyTorch's weight layout (W stored out×in): fwd = X·Wᵀ, dx = dY·W, dw = dYᵀ·X;
// `gpt2_8k_*` the same at 8192 rows (the trainer's 8×1024). Helios's trainer stores W in×out
// (Hugging Face's Conv1D), so there fwd is NN and dx NT: `MxNxK:NT` cases time that form.

use std::path::Path;

use helios::cpu::matmul::{matmul_at, relative_error, MatmulRef};
use helios::{coop_peak, DType, Device, MatmulOptions, MatmulOverrides, MatmulVariant, Tensor};
use serde::{Deserialize, Serialize};

use super::stats::Summary;
use super::{random_values, report, summarize, BenchArgs, BenchResult};
use crate::CliResult;

/// One product: C (m×n) = op(A) · op(B) with inner dimension k.
#[derive(Clone, Debug, Serialize)]
pub struct MmCase {
    pub name: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// A stored k×m.
    pub ta: bool,
    /// B stored n×k.
    pub tb: bool,
}

fn case(name: &str, m: usize, n: usize, k: usize, ta: bool, tb: bool) -> MmCase {
    MmCase {
        name: name.to_owned(),
        m,
        n,
        k,
        ta,
        tb,
    }
}

/// Every case, in order; `--cases` selects by name or group (`squares`, `gpt2`).
pub fn all_cases(quick: bool) -> Vec<MmCase> {
    if quick {
        return vec![
            case("sq256", 256, 256, 256, false, false),
            case("small_fwd", 192, 200, 72, false, true),
            case("small_dw", 72, 200, 192, true, false),
        ];
    }
    let mut v: Vec<MmCase> = [1024, 2048, 3072, 4096, 8192]
        .iter()
        .map(|&n| case(&format!("sq{n}"), n, n, n, false, false))
        .collect();
    for (group, bt) in [("gpt2", 4096), ("gpt2_8k", 8192)] {
        for (layer, out, inp) in [
            ("qkv", 2304, 768),
            ("fc", 3072, 768),
            ("proj", 768, 3072),
            ("lmhead", 50257, 768),
        ] {
            let name = |pass: &str| format!("{group}_{layer}_{pass}");
            v.push(case(&name("fwd"), bt, out, inp, false, true));
            v.push(case(&name("dx"), bt, inp, out, false, false));
            v.push(case(&name("dw"), out, inp, bt, true, false));
        }
    }
    v
}

/// Whether `sel` (a `--cases` entry) selects `name`: the name itself or its group
/// (`squares`, `gpt2` at 4096 rows, `gpt2_8k` at 8192).
fn selects(sel: &str, name: &str) -> bool {
    let in_8k = name.starts_with("gpt2_8k_");
    sel == name
        || (sel == "squares" && name.starts_with("sq"))
        || (sel == "gpt2" && name.starts_with("gpt2_") && !in_8k)
        || (sel == "gpt2_8k" && in_8k)
}

/// A case given as a shape, `MxNxK` with an optional `:NN|NT|TN|TT` (which operands are
/// stored transposed); `None` when `s` is not one.
fn custom_case(s: &str) -> Option<MmCase> {
    let (dims, op) = s.split_once(':').unwrap_or((s, "NN"));
    let d: Vec<usize> = dims
        .split('x')
        .map(|v| v.parse().ok().filter(|&n| n > 0))
        .collect::<Option<_>>()?;
    let [m, n, k] = d[..] else { return None };
    let (ta, tb) = match op.to_ascii_uppercase().as_str() {
        "NN" => (false, false),
        "NT" => (false, true),
        "TN" => (true, false),
        "TT" => (true, true),
        _ => return None,
    };
    // The name must not hold ':' (the PyTorch script's case separator).
    Some(case(&s.replace(':', "_"), m, n, k, ta, tb))
}

/// Throughput of the cooperative-matrix instruction alone.
#[derive(Clone, Debug, Serialize)]
pub struct PeakRow {
    pub dtype: &'static str,
    pub kernel: String,
    pub tflops: f64,
}

/// PyTorch's figures for one case.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct TorchMm {
    pub case: String,
    pub dtype: String,
    pub median_us: f64,
    pub p95_us: f64,
    pub cv: f64,
    pub tflops: f64,
    pub rel_err: f64,
}

/// One tuner candidate, for the JSON.
#[derive(Clone, Debug, Serialize)]
pub struct CandidateRow {
    /// The variant's name, with `/k<n>` when k is split n ways.
    pub variant: String,
    pub check_error: f64,
    pub passed: bool,
    pub time_us: Option<f64>,
}

/// One measured case.
#[derive(Clone, Debug, Serialize)]
pub struct MmResult {
    pub case: MmCase,
    pub dtype: &'static str,
    pub variant: String,
    pub kernel: String,
    /// How the variant was chosen (tuned, cached, env, ...).
    pub how: &'static str,
    pub ops_per_sample: u32,
    pub time_us: Summary,
    pub tflops: f64,
    pub rel_err: f64,
    /// Share of the cooperative-matrix peak of the same dtype, %.
    pub pct_of_peak: Option<f64>,
    /// The driver's compiler statistics of the kernel (on NVIDIA register count, binary
    /// size, stack, local and shared memory), where they were captured
    /// (`HELIOS_PIPELINE_STATS=1`): empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_stats: Vec<(String, String)>,
    pub candidates: Vec<CandidateRow>,
    pub torch: Option<TorchMm>,
}

/// The logical (rows × cols) matrix `host` on the device, stored transposed when `trans`.
fn upload(
    device: &Device,
    host: &[f32],
    rows: usize,
    cols: usize,
    trans: bool,
    dt: DType,
) -> BenchResult<Tensor> {
    if !trans {
        return Ok(Tensor::from_slice_as(device, host, &[rows, cols], dt)?);
    }
    let mut t = vec![0f32; host.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = host[r * cols + c];
        }
    }
    Ok(Tensor::from_slice_as(device, &t, &[cols, rows], dt)?.transpose(0, 1)?)
}

fn parse_dtype(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| d.name() == name)
}

/// One case in one dtype: the tuner's choice (its report kept), or `forced`, unsplit.
fn measure(
    device: &Device,
    c: &MmCase,
    dt: DType,
    samples: usize,
    seed: u64,
    forced: Option<MatmulVariant>,
) -> BenchResult<MmResult> {
    let round = |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| dt.round(x)).collect() };
    let a_host = round(random_values(c.m * c.k, seed));
    let b_host = round(random_values(c.k * c.n, seed + 1));
    let a = upload(device, &a_host, c.m, c.k, c.ta, dt)?;
    let b = upload(device, &b_host, c.k, c.n, c.tb, dt)?;
    let opts = MatmulOptions::default();
    let forcing = MatmulOverrides {
        variant: forced,
        splits: forced.map(|_| 1),
        ..MatmulOverrides::default()
    };

    // Tune (unless a variant is forced, here or by HELIOS_MATMUL_VARIANT), then use the
    // choice.
    let mut candidates = Vec::new();
    if forced.is_none()
        && std::env::var("HELIOS_MATMUL_VARIANT").map_or(true, |v| v.trim().is_empty())
    {
        let report = a.matmul_tune(&b, &opts)?;
        candidates = report
            .candidates
            .iter()
            .map(|r| CandidateRow {
                variant: r.label(),
                check_error: r.check_error,
                passed: r.passed,
                time_us: r.time_us,
            })
            .collect();
    }
    let choice = a.matmul_choice_overridden(&b, &opts, &forcing)?;
    let fixed = MatmulOverrides {
        variant: Some(choice.variant),
        splits: Some(choice.splits),
        ..forcing
    };

    // Correctness on sampled rows (the output is reused by the timed runs below, so that
    // they measure the kernel, not the allocator).
    let out = a.matmul_overridden(&b, &opts, &fixed)?;
    let rows: Vec<usize> = (0..8).map(|i| i * (c.m - 1) / 7).collect();
    let step = c.n.div_ceil(8192);
    let cols: Vec<usize> = (0..c.n).step_by(step).collect();
    let mut got = Vec::new();
    for &r in &rows {
        let row = out.narrow(0, r, 1)?.to_vec()?;
        got.extend(cols.iter().map(|&j| row[j]));
    }
    let pairs: Vec<(usize, usize)> = rows.iter().map(|&r| (0, r)).collect();
    let want = matmul_at(
        &a_host,
        &b_host,
        &MatmulRef::plain(1, c.m, c.n, c.k),
        &pairs,
        &cols,
    );
    let rel_err = relative_error(&got, &want);

    // Timing.
    let ctx = device.context();
    let sample = |reps: u32| -> BenchResult<f64> {
        let t = ctx.start_gpu_timer()?;
        for _ in 0..reps {
            if choice.splits > 1 {
                // The split form sums into a fresh tensor (from the pool, as in training).
                a.matmul_overridden(&b, &opts, &fixed)?.realize()?;
            } else {
                a.matmul_into_overridden(&b, &out, &opts, &fixed)?;
            }
        }
        let span = ctx.stop_gpu_timer(t)?;
        Ok(ctx.gpu_elapsed(span)?.as_secs_f64() * 1e6 / f64::from(reps))
    };
    sample(1)?;
    let probe = sample(2)?;
    let reps = (5000.0 / probe.max(1e-3)).ceil().clamp(1.0, 100.0) as u32;
    device.warm_up(|| sample(reps).map(drop))?;
    let times: Vec<f64> = (0..samples)
        .map(|_| sample(reps))
        .collect::<BenchResult<_>>()?;
    let time_us = summarize(&times, &c.name)?;
    let kernel_stats = kernel_stats(device, &choice.kernel)?;
    let flops = 2.0 * c.m as f64 * c.n as f64 * c.k as f64;
    Ok(MmResult {
        case: c.clone(),
        dtype: dt.name(),
        variant: choice.label(),
        kernel: choice.kernel,
        how: choice.how.name(),
        ops_per_sample: reps,
        time_us,
        tflops: flops / (time_us.median * 1e-6) / 1e12,
        rel_err,
        pct_of_peak: None,
        kernel_stats,
        candidates,
        torch: None,
    })
}

/// The captured compiler statistics of `kernel`'s executables, as (name, value) text.
fn kernel_stats(device: &Device, kernel: &str) -> BenchResult<Vec<(String, String)>> {
    let all = device.kernel_statistics()?;
    Ok(all
        .into_iter()
        .filter(|k| k.kernel == kernel)
        .flat_map(|k| k.executables)
        .flat_map(|e| e.stats)
        .map(|(name, value)| (name, value.to_string()))
        .collect())
}

/// The register count among a result's statistics (NVIDIA names it "Register Count").
fn registers(r: &MmResult) -> Option<&str> {
    r.kernel_stats
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("register count"))
        .map(|(_, v)| v.as_str())
}

/// `helios bench matmul`.
pub fn run(args: &BenchArgs) -> CliResult {
    let quick = args.quick;
    let samples = args
        .samples
        .map_or(if quick { 3 } else { 10 }, |s| s as usize);
    let dtypes: Vec<DType> = if args.dtypes.is_empty() {
        DType::ALL.to_vec()
    } else {
        args.dtypes.iter().filter_map(|d| parse_dtype(d)).collect()
    };
    let mut cases = all_cases(quick);
    if !args.cases.is_empty() {
        let custom: Vec<MmCase> = args.cases.iter().filter_map(|s| custom_case(s)).collect();
        cases.retain(|c| args.cases.iter().any(|sel| selects(sel, &c.name)));
        cases.extend(custom);
        if cases.is_empty() {
            return Err(
                "--cases selects no matmul case (names: sq1024.., gpt2_*, gpt2_8k_*, groups: \
                 squares, gpt2, gpt2_8k, or a shape MxNxK[:NN|NT|TN|TT])"
                    .into(),
            );
        }
    }
    let forced: Vec<Option<MatmulVariant>> = match args.variants.is_empty() {
        true => vec![None],
        false => args
            .variants
            .iter()
            .map(|name| {
                MatmulVariant::parse(name.trim()).map(Some).ok_or_else(|| {
                    format!(
                        "--variants: {name:?} names no matmul variant (a table name, or \
                         {})",
                        MatmulVariant::COOP_GRAMMAR
                    )
                })
            })
            .collect::<Result<_, _>>()?,
    };
    let script = super::torch_script(args)?;

    let device = Device::from_env()?;
    eprintln!("bench: matmul on {}", device.name());
    let mut peaks = Vec::new();
    for dt in [DType::F16, DType::BF16] {
        if let Some(p) = coop_peak(&device, dt)? {
            eprintln!(
                "bench: {} peak {:.1} TFLOP/s ({})",
                dt.name(),
                p.tflops,
                p.kernel
            );
            peaks.push(PeakRow {
                dtype: dt.name(),
                kernel: p.kernel,
                tflops: p.tflops,
            });
        }
    }
    let mut results = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        for (&dt, &v) in dtypes
            .iter()
            .flat_map(|dt| forced.iter().map(move |v| (dt, v)))
        {
            let mut r = match measure(&device, c, dt, samples, 1000 + 10 * i as u64, v) {
                Ok(r) => r,
                // A listed variant this case cannot run (its dtype, shared memory, ...): the
                // selection refuses it as invalid. Anything else (a lost device, memory) ends
                // the run as usual.
                Err(e)
                    if v.is_some()
                        && matches!(
                            e.downcast_ref::<helios::Error>(),
                            Some(helios::Error::Invalid { .. })
                        ) =>
                {
                    eprintln!("bench: {} {} skipped: {e}", c.name, dt.name());
                    device.synchronize()?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            r.pct_of_peak = peaks
                .iter()
                .find(|p| p.dtype == r.dtype && r.variant.starts_with("coop"))
                .map(|p| 100.0 * r.tflops / p.tflops);
            eprintln!(
                "bench: {} {} {} {:.1} µs {:.1} TFLOP/s err {:.1e}",
                c.name, r.dtype, r.variant, r.time_us.median, r.tflops, r.rel_err
            );
            results.push(r);
            device.synchronize()?;
        }
    }

    let (torch_meta, torch_note, rows) = super::torch_side(script.as_deref(), |script| {
        run_torch(script, &cases, &dtypes, samples, quick)
    });
    for r in results.iter_mut() {
        r.torch = rows
            .iter()
            .find(|t| t.case == r.case.name && t.dtype == r.dtype)
            .cloned();
    }

    let plan = super::Plan {
        quick,
        dispatch: None,
        bandwidth: None,
    };
    let meta = report::RunMeta::collect(&device, "matmul", &plan, torch_meta, torch_note);
    #[derive(Serialize)]
    struct Doc<'a> {
        #[serde(flatten)]
        meta: &'a report::RunMeta<'a>,
        samples: usize,
        peak: &'a [PeakRow],
        results: &'a [MmResult],
    }
    let doc = Doc {
        meta: &meta,
        samples,
        peak: &peaks,
        results: &results,
    };
    super::emit(args.json.as_deref(), &table(&meta, &peaks, &results), &doc)?;
    super::no_validation_messages(&device)
}

/// Runs `torch_reference.py --suite matmul` for the same cases.
fn run_torch(
    script: &Path,
    cases: &[MmCase],
    dtypes: &[DType],
    samples: usize,
    quick: bool,
) -> Result<(serde_json::Value, Vec<TorchMm>), String> {
    let spec: Vec<String> = cases
        .iter()
        .map(|c| {
            format!(
                "{}:{}:{}:{}:{}:{}",
                c.name, c.m, c.n, c.k, c.ta as u8, c.tb as u8
            )
        })
        .collect();
    let names: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
    let mut cmd = super::torch::command(script, "matmul", quick);
    cmd.args(["--mm-cases", &spec.join(",")])
        .args(["--dtypes", &names.join(",")])
        .args(["--mm-samples", &samples.to_string()]);
    super::torch::execute(script, cmd)
}

/// TFLOP/s: one decimal, more on slow (CPU) devices.
fn tflops(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.4}")
    } else {
        format!("{v:.1}")
    }
}

fn table(meta: &report::RunMeta, peaks: &[PeakRow], rows: &[MmResult]) -> String {
    use std::fmt::Write as _;
    let mut s = meta.run_line();
    for p in peaks {
        let _ = writeln!(
            s,
            "cooperative-matrix peak {}: {:.1} TFLOP/s ({})",
            p.dtype, p.tflops, p.kernel
        );
    }
    let torch = rows.iter().any(|r| r.torch.is_some());
    let regs = rows.iter().any(|r| registers(r).is_some());
    let mut head = vec![
        "case",
        "dtype",
        "m×n×k",
        "op",
        "variant",
        "median µs",
        "p95",
        "CV",
        "TFLOP/s",
        "rel err",
        "% peak",
    ];
    if regs {
        head.push("regs");
    }
    if torch {
        head.extend([
            "torch µs",
            "torch TFLOP/s",
            "torch err",
            "helios/torch time",
        ]);
    }
    let mut lines: Vec<Vec<String>> = vec![head.iter().map(|h| h.to_string()).collect()];
    for r in rows {
        let c = &r.case;
        let op = format!(
            "{}{}",
            if c.ta { 'T' } else { 'N' },
            if c.tb { 'T' } else { 'N' }
        );
        let mut line = vec![
            c.name.clone(),
            r.dtype.to_owned(),
            format!("{}×{}×{}", c.m, c.n, c.k),
            op,
            r.variant.clone(),
            format!("{:.1}", r.time_us.median),
            format!("{:.1}", r.time_us.p95),
            format!("{:.1}%", 100.0 * r.time_us.cv),
            tflops(r.tflops),
            format!("{:.1e}", r.rel_err),
            r.pct_of_peak.map_or("-".into(), |p| format!("{p:.0}%")),
        ];
        if regs {
            line.push(registers(r).unwrap_or("-").to_string());
        }
        if torch {
            match &r.torch {
                Some(t) => line.extend([
                    format!("{:.1}", t.median_us),
                    tflops(t.tflops),
                    format!("{:.1e}", t.rel_err),
                    format!("{:.2}x", r.time_us.median / t.median_us),
                ]),
                None => line.extend(["-".into(), "-".into(), "-".into(), "-".into()]),
            }
        }
        lines.push(line);
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let _ = writeln!(
        s,
        "\nmatmul: GPU time per product (timestamps), TFLOP/s at the median, rel err = ‖out−ref‖/‖ref‖ on sampled rows vs f64{}",
        if torch { "; helios/torch time < 1: Helios faster" } else { "" }
    );
    for l in &lines {
        let mut row = String::new();
        for (i, cell) in l.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            if i > 0 {
                row.push_str("  ");
            }
            if i <= 1 || i == 4 {
                row.push_str(cell);
                row.push_str(&" ".repeat(pad));
            } else {
                row.push_str(&" ".repeat(pad));
                row.push_str(cell);
            }
        }
        s.push_str(row.trim_end());
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPT-2 groups are disjoint: `gpt2` is the 4096-row shapes, `gpt2_8k` the 8192-row
    /// ones, twelve each; a name selects only itself.
    #[test]
    fn gpt2_groups_select_their_rows() {
        let cases = all_cases(false);
        let group = |sel: &str| -> Vec<&MmCase> {
            cases.iter().filter(|c| selects(sel, &c.name)).collect()
        };
        let (small, large) = (group("gpt2"), group("gpt2_8k"));
        assert_eq!((small.len(), large.len()), (12, 12));
        assert!(small.iter().all(|c| c.m == 4096 || c.k == 4096));
        assert!(large.iter().all(|c| c.m == 8192 || c.k == 8192));
        assert!(small.iter().all(|c| !c.name.starts_with("gpt2_8k")));
        let fc = group("gpt2_8k_fc_dw");
        assert_eq!(fc.len(), 1);
        assert_eq!(
            (fc[0].m, fc[0].n, fc[0].k, fc[0].ta),
            (3072, 768, 8192, true)
        );
        assert_eq!(group("squares").len(), 5);
    }

    /// A result's register count comes from the driver's statistic of that name, whatever
    /// its case; without captured statistics there is none (and no table column).
    #[test]
    fn register_count_from_kernel_statistics() {
        let mut r = MmResult {
            case: case("sq256", 256, 256, 256, false, false),
            dtype: "bf16",
            variant: "coop128x256w2x8k32s1".into(),
            kernel: "mm_coop128x256w2x8k32s1_bf16_bf16_nn_vabc".into(),
            how: "forced",
            ops_per_sample: 1,
            time_us: Summary::of(&[10.0, 11.0]).expect("finite samples"),
            tflops: 1.0,
            rel_err: 1e-3,
            pct_of_peak: None,
            kernel_stats: Vec::new(),
            candidates: Vec::new(),
            torch: None,
        };
        assert_eq!(registers(&r), None);
        r.kernel_stats = vec![
            ("Binary Size".into(), "35200".into()),
            ("Register Count".into(), "128".into()),
        ];
        assert_eq!(registers(&r), Some("128"));
    }
}
