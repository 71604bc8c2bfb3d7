// `helios bench <dispatch|bandwidth|all>`: Helios's own benchmarks, with PyTorch measured
// side by side (`--compare torch`) and a JSON record of the run (`--json PATH`).
//
// Each suite returns plain `CaseResult` rows; `report` prints them and writes the JSON,
// `torch` runs `bench/torch_reference.py` and attaches its figures to the matching rows.
// Key decision: every figure is a per-op time summarized over many samples (median, p95,
// coefficient of variation), measured with host clocks around `synchronize`, so that the
// same methodology can be reproduced in PyTorch and nothing depends on GPU profiling
// support. A missing python3, torch or CUDA device is a note, never a failure.

mod attention;
mod bandwidth;
mod dispatch;
mod generate;
mod graph;
mod matmul;
mod ops;
mod report;
pub(crate) mod stats;
mod torch;
mod train;

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use helios::Device;
use serde::Serialize;

use crate::CliResult;
use bandwidth::BandwidthPlan;
use dispatch::DispatchPlan;
use stats::Summary;

/// Errors inside the bench module (all turned into `error: ...` by `main`).
pub type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Args)]
pub struct BenchArgs {
    /// dispatch: host overhead of tiny ops; bandwidth: memory-bound kernels in GB/s; all: both;
    /// matmul: matrix products (squares, GPT-2 shapes) in TFLOP/s, not part of `all`;
    /// ops: softmax, layernorm and sums at GPT-2 shapes in GB/s, not part of `all`;
    /// graph: the lazy graph (fused chains, a GPT-2 MLP block fwd+bwd, host time of a
    /// transformer step), not part of `all`; train: GPT-2 training steps (DistilGPT-2 8x512,
    /// GPT-2 124M 8x1024, fp32 and bf16) beside Hugging Face in PyTorch, not part of `all`;
    /// generate: GPT-2 124M KV-cache decoding, batch 1 and 8, 200 greedy tokens each timed,
    /// fp32 and bf16, a cold and a warm pass, beside Hugging Face `generate`, not part of
    /// `all`.
    #[arg(value_enum)]
    suite: Suite,
    /// Few iterations and small sizes (a smoke test, e.g. on lavapipe); figures are not
    /// meaningful.
    #[arg(long)]
    quick: bool,
    /// Write the results and run metadata as JSON to PATH (`-` for stdout; tables then go to
    /// stderr).
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Measure the same cases with PyTorch on CUDA and print them side by side.
    #[arg(long, value_enum, value_name = "WHAT")]
    compare: Option<Compare>,
    /// The PyTorch script for --compare torch (default: bench/torch_reference.py under the
    /// current directory or the directories above the helios binary).
    #[arg(long, value_name = "PATH")]
    torch_script: Option<PathBuf>,
    /// Tensor sizes for the bandwidth suite, comma-separated element counts; K and M suffixes
    /// are powers of two (default 4M,64M; with --quick 64K).
    #[arg(long, value_delimiter = ',', value_parser = parse_elements)]
    sizes: Vec<usize>,
    /// Element types, comma-separated (bandwidth: default f32,f16, bf16 on request; matmul:
    /// default all three; generate: f32,bf16).
    #[arg(long, value_delimiter = ',', value_parser = ["f32", "f16", "bf16"])]
    dtypes: Vec<String>,
    /// Timed samples per case (default 25; with --quick 3); also the round-trip iterations
    /// (default 2000; with --quick 20); generate: new tokens (default 200; with --quick 16);
    /// train: timed steps (default 30; with --quick 3).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    samples: Option<u32>,
    /// Ops per chain / independent sample in the dispatch suite (default 1000; --quick 100).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    ops: Option<u32>,
    /// Matmul cases, comma-separated: names (sq4096, gpt2_fc_fwd, ...), groups (squares,
    /// gpt2 at 4096 rows, gpt2_8k at 8192) or shapes MxNxK[:NN|NT|TN|TT]; ops cases:
    /// softmax, layernorm_fwd, layernorm_fwdbwd, cross_entropy_fwdbwd, transpose, sum_all,
    /// sum_last; graph cases: chain1000, roundtrip, mixed32, mlp_block, mlp_plain, host12;
    /// default all.
    #[arg(long, value_delimiter = ',')]
    cases: Vec<String>,
    /// Matmul only: time these variants side by side on every case instead of the tuner's
    /// choice, comma-separated: table names (`helios_kernels::matmul::VARIANTS`) or
    /// cooperative tiles in the same grammar, `coop<bm>x<bn>w<wm>x<wn>k<bk>` then `d<1-3>` or
    /// `s1`, native `nv<bm>x<bn>k<bk>s<stages>`, few-row `rows<bm>x<bn>`.
    /// Each is checked against the f64 reference like any result; one a case cannot run is
    /// reported and skipped.
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Shapes for the ops suite, comma-separated ROWSxCOLS (default 4096x768, 4096x3072,
    /// 4096x50257; with --quick 64x768, 4x50257).
    #[arg(long, value_delimiter = ',')]
    shapes: Vec<String>,
    /// How kernels are chosen for shapes without stored winners: `full`, every shape tuned
    /// exhaustively before its first call (as HELIOS_MATMUL_TUNE=full; the default of the
    /// kernel suites, which time settled kernels), or `online`, a first choice at once,
    /// tuned on the benchmark's own calls (the default of train and generate).
    #[arg(long, value_parser = ["online", "full"])]
    tune: Option<String>,
    /// train: what the batches hold: `random` ids (the default, as earlier runs), or `text`,
    /// the bundled corpus `helios train` reads, whose frequent tokens make the embedding's
    /// gradient sum long lists. PyTorch's side trains on the same first batch.
    #[arg(long, value_parser = ["random", "text"])]
    tokens: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Suite {
    Dispatch,
    Bandwidth,
    All,
    Matmul,
    Ops,
    Graph,
    Attention,
    Train,
    Generate,
}

impl Suite {
    fn name(self) -> &'static str {
        match self {
            Suite::Dispatch => "dispatch",
            Suite::Bandwidth => "bandwidth",
            Suite::All => "all",
            Suite::Matmul => "matmul",
            Suite::Ops => "ops",
            Suite::Graph => "graph",
            Suite::Attention => "attention",
            Suite::Train => "train",
            Suite::Generate => "generate",
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Compare {
    Torch,
}

/// Everything a run measures, resolved from the arguments (and recorded in the JSON).
#[derive(Debug, Serialize)]
pub struct Plan {
    quick: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    dispatch: Option<DispatchPlan>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bandwidth: Option<BandwidthPlan>,
}

impl Plan {
    fn from_args(args: &BenchArgs) -> Plan {
        let q = args.quick;
        let samples = args.samples.map(|s| s as usize);
        let dispatch = (args.suite != Suite::Bandwidth).then(|| DispatchPlan {
            ops: args.ops.map_or(if q { 100 } else { 1000 }, |o| o as usize),
            samples: samples.unwrap_or(if q { 3 } else { 25 }),
            roundtrip_iters: samples.unwrap_or(if q { 20 } else { 2000 }),
            warmup: if q { 1 } else { 3 },
        });
        let bandwidth = (args.suite != Suite::Dispatch).then(|| BandwidthPlan {
            sizes: if !args.sizes.is_empty() {
                args.sizes.clone()
            } else if q {
                vec![64 << 10]
            } else {
                vec![4 << 20, 64 << 20]
            },
            dtypes: if args.dtypes.is_empty() {
                vec!["f32", "f16"]
            } else {
                let mut d: Vec<&'static str> = Vec::new();
                for name in ["f32", "f16", "bf16"] {
                    if args.dtypes.iter().any(|a| a == name) {
                        d.push(name);
                    }
                }
                d
            },
            samples: samples.unwrap_or(if q { 3 } else { 25 }),
            target_sample_us: if q { 1_000.0 } else { 5_000.0 },
            max_ops_per_sample: if q { 8 } else { 4096 },
        });
        Plan {
            quick: q,
            dispatch,
            bandwidth,
        }
    }
}

/// One measured case: a row of the table and an element of the JSON `results`.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub suite: &'static str,
    pub case: String,
    /// The kernel and the batch setting (or K for bandwidth).
    pub variant: String,
    pub dtype: &'static str,
    pub elements: usize,
    /// Ops timed together in one sample (1 for the round trip).
    pub ops_per_sample: usize,
    /// Wall time per op, µs.
    pub time_us: Summary,
    /// Mean GPU time per dispatch from timestamp queries, µs (only with HELIOS_PROFILE=1;
    /// the timestamps themselves cost a little).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_us: Option<f64>,
    /// Host time per op until the last op returned (before waiting), µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record_us: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub barriers_per_op: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batches_per_sample: Option<f64>,
    /// Bytes read plus written by one op.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_op: Option<u64>,
    /// Effective bandwidth at the median time, GB/s (10^9 bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    /// `gbps` as a percentage of the copy of the same dtype and size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pct_of_copy: Option<f64>,
    /// PyTorch's figures for the same case, with --compare torch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch: Option<torch::TorchCase>,
}

impl CaseResult {
    pub fn new(
        suite: &'static str,
        case: &str,
        variant: String,
        dtype: &'static str,
        elements: usize,
        ops_per_sample: usize,
        time_us: Summary,
    ) -> CaseResult {
        CaseResult {
            suite,
            case: case.to_owned(),
            variant,
            dtype,
            elements,
            ops_per_sample,
            time_us,
            gpu_us: None,
            record_us: None,
            barriers_per_op: None,
            batches_per_sample: None,
            bytes_per_op: None,
            gbps: None,
            pct_of_copy: None,
            torch: None,
        }
    }

    /// The name of the PyTorch case this one is compared with (PyTorch has no batch setting,
    /// so both chain variants compare with its one chain).
    pub fn torch_case(&self) -> &str {
        match self.case.as_str() {
            "chain_batched" | "chain_per_op_submit" => "chain",
            c => c,
        }
    }

    /// PyTorch's median time over ours: above 1 means Helios is faster.
    pub fn speedup_vs_torch(&self) -> Option<f64> {
        let t = self.torch.as_ref()?;
        (self.time_us.median > 0.0).then(|| t.median_us / self.time_us.median)
    }
}

/// Restores the device's batch limit however the benchmark ends.
struct BatchLimitGuard<'a> {
    device: &'a Device,
    limit: u32,
}

impl Drop for BatchLimitGuard<'_> {
    fn drop(&mut self) {
        self.device.set_batch_limit(self.limit);
    }
}

pub fn run(args: &BenchArgs) -> CliResult {
    // Kernel benchmarks time settled kernels, so their shapes tune before their first call;
    // train and generate measure what a user sees, tuning on real work included.
    let user_facing = matches!(args.suite, Suite::Train | Suite::Generate);
    match args.tune.as_deref() {
        Some("full") => helios::set_exhaustive_tuning(true),
        None if !user_facing => helios::set_exhaustive_tuning(true),
        _ => {}
    }
    if args.suite == Suite::Matmul {
        return matmul::run(args);
    }
    if args.suite == Suite::Ops {
        return ops::run(args);
    }
    if args.suite == Suite::Graph {
        return graph::run(args);
    }
    if args.suite == Suite::Attention {
        return attention::run(args);
    }
    if args.suite == Suite::Train {
        return train::run(args);
    }
    if args.suite == Suite::Generate {
        return generate::run(args);
    }
    let plan = Plan::from_args(args);
    if plan.bandwidth.as_ref().is_some_and(|b| b.dtypes.is_empty()) {
        return Err("--dtypes selects no element type; use f32, f16, bf16 or several".into());
    }
    // Resolve the script before measuring, so a wrong --torch-script fails in a second.
    let script = torch_script(args)?;

    let device = Device::from_env()?;
    let mut results = Vec::new();
    {
        let _guard = BatchLimitGuard {
            device: &device,
            limit: device.context().batch_limit(),
        };
        if let Some(p) = &plan.dispatch {
            eprintln!("bench: dispatch on {}", device.name());
            results.extend(dispatch::run(&device, p)?);
        }
        if let Some(p) = &plan.bandwidth {
            eprintln!("bench: bandwidth on {}", device.name());
            results.extend(bandwidth::run(&device, p)?);
        }
        device.synchronize()?;
    }

    let mut torch_meta = None;
    let mut torch_note = None;
    if let Some(script) = &script {
        eprintln!("bench: running {}", script.display());
        match torch::run(script, args.suite.name(), &plan) {
            Ok(run) => {
                torch::attach(&mut results, &run.results);
                torch_meta = Some(run.meta);
            }
            Err(note) => {
                eprintln!("note: torch comparison skipped: {note}");
                torch_note = Some(note);
            }
        }
    }

    let meta = report::RunMeta::collect(&device, args.suite.name(), &plan, torch_meta, torch_note);
    let to_stdout_json = args.json.as_deref() == Some(std::path::Path::new("-"));
    let tables = report::tables(&meta, &results);
    if to_stdout_json {
        eprint!("{tables}");
    } else {
        report::write_stdout(&tables)?;
    }
    if let Some(path) = &args.json {
        let json = report::json(&meta, &results)?;
        write_json(path, &json)?;
    }

    // Pipeline creation: cold (empty cache) vs warm (persisted VkPipelineCache) shows in the
    // time across two runs with the same HELIOS_CACHE_DIR.
    let ps = device.context().pipeline_stats();
    eprintln!(
        "bench: {} pipelines created in {:.1} ms ({:.2} ms each); pipeline cache: {} bytes loaded{}",
        ps.pipelines_created,
        ps.total_create_seconds * 1e3,
        ps.total_create_seconds * 1e3 / ps.pipelines_created.max(1) as f64,
        ps.cache_loaded_bytes,
        ps.cache_file
            .as_ref()
            .map(|f| format!(" from {}", f.display()))
            .unwrap_or_default()
    );

    no_validation_messages(&device)
}

/// The PyTorch script for `--compare torch`: `None` (with a note) when it is not asked for
/// or not found at the default place; an error when a path the user gave is wrong.
fn torch_script(args: &BenchArgs) -> Result<Option<std::path::PathBuf>, String> {
    torch_script_named(args, torch::SCRIPT)
}

/// `torch_script` for a suite with its own script (`bench/<name>.py`).
fn torch_script_named(
    args: &BenchArgs,
    script: &str,
) -> Result<Option<std::path::PathBuf>, String> {
    match args.compare {
        Some(Compare::Torch) => match torch::locate(args.torch_script.as_deref(), script) {
            Ok(p) => Ok(Some(p)),
            Err(e) if args.torch_script.is_some() => Err(e),
            Err(note) => {
                eprintln!("note: torch comparison skipped: {note}");
                Ok(None)
            }
        },
        None => Ok(None),
    }
}

/// Writes a suite's JSON to `path` (`-`: standard output).
/// Runs the PyTorch side of a suite where a script was found: its metadata and rows, or the
/// note that says why the comparison was skipped (printed too).
fn torch_side<T>(
    script: Option<&std::path::Path>,
    run: impl FnOnce(&std::path::Path) -> Result<(serde_json::Value, Vec<T>), String>,
) -> (Option<serde_json::Value>, Option<String>, Vec<T>) {
    let Some(script) = script else {
        return (None, None, Vec::new());
    };
    eprintln!("bench: running {}", script.display());
    match run(script) {
        Ok((meta, rows)) => (Some(meta), None, rows),
        Err(note) => {
            eprintln!("note: torch comparison skipped: {note}");
            (None, Some(note), Vec::new())
        }
    }
}

/// A torch script's JSON on stdout (`{"meta": ..., "results": [...]}`), or its last stderr
/// line when it failed.
fn torch_results<T: serde::de::DeserializeOwned>(
    script: &std::path::Path,
    out: &std::process::Output,
) -> Result<(serde_json::Value, Vec<T>), String> {
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("failed").to_string());
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{}: bad JSON: {e}", script.display()))?;
    let rows = serde_json::from_value(doc["results"].clone())
        .map_err(|e| format!("{}: bad results: {e}", script.display()))?;
    Ok((doc["meta"].clone(), rows))
}

/// The tail of a suite with one results table: run metadata, the table, the JSON document
/// (the metadata and `results`), and the validation check.
fn finish<R: Serialize>(
    args: &BenchArgs,
    device: &Device,
    suite: &str,
    (torch_meta, torch_note): (Option<serde_json::Value>, Option<String>),
    samples: Option<usize>,
    results: &[R],
    table: impl FnOnce(&report::RunMeta) -> String,
) -> CliResult {
    let plan = Plan {
        quick: args.quick,
        dispatch: None,
        bandwidth: None,
    };
    let meta = report::RunMeta::collect(device, suite, &plan, torch_meta, torch_note);
    #[derive(Serialize)]
    struct Doc<'a, R> {
        #[serde(flatten)]
        meta: &'a report::RunMeta<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        samples: Option<usize>,
        results: &'a [R],
    }
    emit(
        args.json.as_deref(),
        &table(&meta),
        &Doc {
            meta: &meta,
            samples,
            results,
        },
    )?;
    no_validation_messages(device)
}

/// Prints a suite's tables (to stderr when `--json -` puts the JSON on stdout) and writes
/// `doc` where `--json` asks.
fn emit(json: Option<&std::path::Path>, text: &str, doc: &impl Serialize) -> CliResult {
    if json == Some(std::path::Path::new("-")) {
        eprint!("{text}");
    } else {
        report::write_stdout(text)?;
    }
    if let Some(path) = json {
        write_json(path, &(serde_json::to_string_pretty(doc)? + "\n"))?;
    }
    Ok(())
}

fn write_json(path: &std::path::Path, json: &str) -> CliResult {
    if path == std::path::Path::new("-") {
        report::write_stdout(json)?;
    } else {
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(())
}

/// Fails the run when the validation layer spoke (its messages are printed first).
fn no_validation_messages(device: &Device) -> CliResult {
    let messages = device.validation_messages();
    if !messages.is_empty() {
        for m in &messages {
            eprintln!("{m}");
        }
        return Err(format!(
            "{} Vulkan validation message(s), printed above",
            messages.len()
        )
        .into());
    }
    Ok(())
}

/// Whether `HELIOS_VERBOSE=1`: the benches then say what their steps and tokens waited for.
pub(super) fn verbose() -> bool {
    std::env::var("HELIOS_VERBOSE").as_deref() == Ok("1")
}

/// With HELIOS_PROFILE=1: empties the profiler's table, so that `gpu_mean_us` sees only
/// the dispatches recorded after this call.
pub(super) fn profile_start(device: &Device) -> BenchResult<()> {
    if let Some(p) = device.context().profiler() {
        device.synchronize()?;
        device.context().profile_report()?;
        p.reset();
    }
    Ok(())
}

/// The profiler's rows for the dispatches since `profile_start`, once they have run; `None`
/// unless profiling.
fn profile_rows(device: &Device) -> BenchResult<Option<Vec<helios_vk::ProfileRow>>> {
    if device.context().profiler().is_none() {
        return Ok(None);
    }
    device.synchronize()?;
    Ok(device.context().profile_report()?.map(|r| r.rows))
}

/// Mean GPU time of `kernel`'s dispatches since `profile_start`, µs; `None` unless profiling.
fn gpu_mean_us(device: &Device, kernel: &str) -> BenchResult<Option<f64>> {
    Ok(profile_rows(device)?
        .and_then(|rows| rows.into_iter().find(|row| row.name == kernel))
        .map(|row| row.mean_ns / 1e3))
}

/// Mean GPU time of the kernel that took the most time since `profile_start` (a case's one
/// fused kernel, whatever its generated name), µs; `None` unless profiling.
fn busiest_kernel_us(device: &Device) -> BenchResult<Option<f64>> {
    Ok(profile_rows(device)?
        .and_then(|rows| rows.into_iter().max_by_key(|row| row.total_ns))
        .map(|row| row.mean_ns / 1e3))
}

/// Records op number `i` of a sample.
type RunOp<'a> = &'a dyn Fn(usize) -> helios::Result<()>;

/// How `time_ops` sizes its samples: K ops back to back per sample, K calibrated so that a
/// sample lasts about `target_us`, at most `max_k`; the first calibration sample runs
/// `first` ops (after one of `first / 2`, which compiles); each op records at most
/// `dispatches` dispatches (the batch holds a whole sample).
#[derive(Clone, Copy)]
struct Sampling {
    target_us: f64,
    first: usize,
    max_k: usize,
    dispatches: usize,
}

/// Per-op GPU time (µs) of `k` ops back to back, between two GPU timestamps.
fn gpu_sample(device: &Device, run: RunOp, k: usize, dispatches: usize) -> BenchResult<f64> {
    device.set_batch_limit(u32::try_from(dispatches * k + 64).unwrap_or(u32::MAX));
    device.synchronize()?;
    let ctx = device.context();
    let timer = ctx.start_gpu_timer()?;
    for i in 0..k {
        run(i)?;
    }
    let span = ctx.stop_gpu_timer(timer)?;
    Ok(ctx.gpu_elapsed(span)?.as_secs_f64() * 1e6 / k as f64)
}

/// Warm-up, K calibration, then `samples` samples of per-op µs, and K.
fn time_ops(
    device: &Device,
    run: RunOp,
    samples: usize,
    s: Sampling,
) -> BenchResult<(Vec<f64>, usize)> {
    let sample = |k: usize| gpu_sample(device, run, k, s.dispatches);
    sample((s.first / 2).max(1))?;
    let mut k = s.first.min(s.max_k);
    for _ in 0..2 {
        let per = sample(k)?;
        k = if per > 0.0 {
            (s.target_us / per).ceil() as usize
        } else {
            s.max_k
        }
        .clamp(1, s.max_k);
    }
    device.warm_up(|| sample(k).map(drop))?;
    let times = (0..samples)
        .map(|_| sample(k))
        .collect::<BenchResult<Vec<f64>>>()?;
    Ok((times, k))
}

/// `Summary::of`, with an error naming the case when the samples cannot be summarized.
fn summarize(values: &[f64], case: &str) -> BenchResult<Summary> {
    Summary::of(values).ok_or_else(|| format!("{case}: no finite timing samples").into())
}

/// Parses an element count: `4096`, `64K`, `4M` (K = 1024, M = 1024²).
fn parse_elements(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1usize << 10),
        Some('M') => (&s[..s.len() - 1], 1usize << 20),
        _ => (s, 1),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not an element count (e.g. 4096, 64K, 4M)"))?;
    match n.checked_mul(mult) {
        Some(v) if (1..=(1usize << 30)).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: sizes must be between 1 and 1G elements")),
    }
}

/// `n` pseudo-random values in [-1, 1), never all zero, reproducible from `seed`
/// (xorshift64*: no dependency, and fast enough for 64M elements).
pub fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
            // 24 random bits -> [0, 1) -> [-1, 1)
            ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_counts() {
        assert_eq!(parse_elements("4096"), Ok(4096));
        assert_eq!(parse_elements("64K"), Ok(65536));
        assert_eq!(parse_elements("4M"), Ok(4_194_304));
        assert_eq!(parse_elements("64m"), Ok(67_108_864));
        assert!(parse_elements("0").is_err());
        assert!(parse_elements("x").is_err());
        assert!(parse_elements("").is_err());
        assert!(parse_elements("99999999999999M").is_err());
    }

    #[test]
    fn random_values_are_spread_and_reproducible() {
        let a = random_values(10_000, 7);
        assert_eq!(a, random_values(10_000, 7));
        assert_ne!(a, random_values(10_000, 8));
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!(mean.abs() < 0.05, "{mean}");
        assert!(a.iter().filter(|v| **v == 0.0).count() < 10);
    }
}
