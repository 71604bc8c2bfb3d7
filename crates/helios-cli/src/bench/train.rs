// `helios bench train`: GPT-2 training steps as `helios train` runs them (the `Trainer`'s
// `train_step`: forward, backward, clipped AdamW), random init, random token ids (or with
// `--tokens text` the bundled corpus, whose frequent tokens lengthen the embedding gradient's
// lists), beside Hugging Face's GPT2LMHeadModel in PyTorch eager and with torch.compile
// (`--compare torch` runs bench/torch_train.py on the same first batch).
//
// Cases (name:layers:batch:seq): distilgpt2:6:8:512 and gpt2:12:8:1024 (with --quick a
// 2-layer 128-wide model on 2x64), each in fp32 and bf16 (f32 master weights), and f16 (with
// dynamic loss scaling on both sides) when `--dtypes` names it. Figures:
// steady-state ms/step (median of the timed steps), tokens/s, the first step's wall time
// (pipeline compilation and tuning included; a second run with the same HELIOS_CACHE_DIR has
// a warm pipeline cache), the step's forward / backward / optimizer split, and device memory:
// what the pool held from the driver after the case (its peak: the pool returns nothing while
// allocations succeed) and the most the case's live buffers needed at once, beside PyTorch's
// max_memory_reserved and max_memory_allocated. Each case starts from an emptied pool.

use std::borrow::Cow;
use std::path::Path;
use std::time::Instant;

use helios::{DType, Device, Tensor};
use helios_nn::{GptConfig, ParamStore, Tokens};
use serde::{Deserialize, Serialize};

use super::stats::Summary;
use super::{summarize, BenchArgs, BenchResult};
use crate::CliResult;

#[derive(Debug, Serialize)]
struct TrainResult {
    case: String,
    precision: &'static str,
    batch: usize,
    seq: usize,
    ms_per_step: Summary,
    tokens_per_s: f64,
    first_step_s: f64,
    /// Steps (counting the first) after which every step is within 2% of the median: how
    /// long tuning on real work took to settle.
    settled_after: usize,
    /// Steps 2-101 (the hundred after the first, which `first_step_s` times) over a hundred
    /// settled steps (the median): what tuning on real work cost while it explored. `None`
    /// when fewer than 101 steps ran (CPU devices, which run as few as they can).
    first_100: Option<f64>,
    /// Seconds until step 101 ended, the first step included: what a new run waits for its
    /// first hundred steps. A shorter first step can raise `first_100` (the steps waiting for
    /// the native JIT then fall after it) while this falls.
    first_101_s: Option<f64>,
    /// Every step's wall time, ms, the first one included.
    steps_ms: Vec<f64>,
    /// Every step's GPU time (forward, backward, exchange, optimizer: `StepLog`), ms.
    steps_gpu_ms: Vec<f64>,
    /// Every step's host time to record it, up to its one wait, ms.
    steps_record_ms: Vec<f64>,
    /// Per step: GPU time of tuning's exploring runs collected during it
    /// (`helios::exploration_spent`), ms.
    steps_explore_ms: Vec<f64>,
    /// What the batches held: `random` ids or the bundled corpus' `text`.
    tokens: &'static str,
    /// Matmul shape classes still being tuned on real work at the end.
    exploring: usize,
    fwd_ms: f64,
    bwd_ms: f64,
    opt_ms: f64,
    held_gib: f64,
    /// The most the step's live buffers needed at once (held − this: cached, unused memory).
    peak_in_use_gib: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    torch: Vec<TorchTrain>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
struct TorchTrain {
    case: String,
    precision: String,
    mode: String,
    ms_per_step: f64,
    tokens_per_s: f64,
    first_step_s: f64,
    /// `torch.cuda.max_memory_allocated`: live tensors at their peak.
    peak_gib: f64,
    /// `torch.cuda.max_memory_reserved`: what PyTorch's caching allocator held from the driver.
    #[serde(default)]
    reserved_gib: f64,
}

struct Case {
    name: &'static str,
    config: GptConfig,
    batch: usize,
    seq: usize,
}

fn cases(quick: bool) -> BenchResult<Vec<Case>> {
    if quick {
        let config = GptConfig {
            n_layer: 2,
            n_head: 2,
            n_embd: 128,
            block_size: 64,
            ..GptConfig::tiny()
        };
        return Ok(vec![Case {
            name: "quick",
            config,
            batch: 2,
            seq: 64,
        }]);
    }
    Ok(vec![
        Case {
            name: "distilgpt2",
            config: GptConfig::distilgpt2(),
            batch: 8,
            seq: 512,
        },
        Case {
            name: "gpt2",
            config: GptConfig::gpt2(),
            batch: 8,
            seq: 1024,
        },
    ])
}

pub fn run(args: &BenchArgs) -> CliResult {
    let quick = args.quick;
    // 30 timed steps: the median of 10 moved with a few slow ones.
    let steps = args
        .samples
        .map_or(if quick { 3 } else { 30 }, |s| s as usize);
    let precisions: Vec<DType> = if args.dtypes.is_empty() {
        vec![DType::F32, DType::BF16]
    } else {
        args.dtypes
            .iter()
            .filter_map(|d| match d.as_str() {
                "f32" => Some(DType::F32),
                "bf16" => Some(DType::BF16),
                "f16" => Some(DType::F16),
                _ => None,
            })
            .collect()
    };
    let script = super::torch_script_named(args, "bench/torch_train.py")?;
    let text = match args.tokens.as_deref() {
        Some("text") => Some(corpus_ids()?),
        _ => None,
    };
    let device = Device::from_env()?;
    eprintln!("bench: train on {}", device.name());
    let mut results = Vec::new();
    for case in cases(quick)? {
        if !args.cases.is_empty() && !args.cases.iter().any(|c| c == case.name) {
            continue;
        }
        for &precision in &precisions {
            let r = one(&device, &case, precision, steps, text.as_deref())?;
            eprintln!(
                "bench: {} {} on {} tokens: {:.1} ms/step, {:.0} tokens/s, first step {:.2} s, \
                 within 2% of the median after {} steps, steps 2-101 {} the settled time, the \
                 first 101 steps in {} ({} matmul classes still tuning)",
                r.case,
                r.precision,
                r.tokens,
                r.ms_per_step.median,
                r.tokens_per_s,
                r.first_step_s,
                r.settled_after,
                r.first_100.map_or("-".to_string(), |x| format!("{x:.3}x")),
                r.first_101_s.map_or("-".to_string(), |x| format!(
                    "{x:.2} s ({:.2} s at the settled time)",
                    (FIRST_STEPS + 1) as f64 * r.ms_per_step.median / 1e3
                )),
                r.exploring
            );
            results.push(r);
        }
    }
    let (torch_meta, torch_note, rows) = super::torch_side(script.as_deref(), |script| {
        run_torch(script, &results, &precisions, text.as_deref())
    });
    for r in results.iter_mut() {
        r.torch = rows
            .iter()
            .filter(|t| t.case == r.case && t.precision == r.precision)
            .cloned()
            .collect();
    }
    let torch = (torch_meta, torch_note);
    super::finish(args, &device, "train", torch, None, &results, |_| {
        table(&results)
    })
}

/// Most untimed steps, and seconds, `one` waits for tuning on real work to settle
/// (DistilGPT-2's 8.7 ms steps took ~1100 to settle at exploration's 3% budget:
/// bench/results/2026-11-30-session48-h200.md).
const SETTLE_STEPS: usize = 3000;
const SETTLE_SECONDS: f64 = 120.0;

/// The steps after the first that `first_100` sums: on GPUs, untimed steps run at least
/// this far, so that a run which settles sooner still reports it (CPU devices, whose tests
/// run a few steps of tiny models, do not: a hundred steps there took minutes).
const FIRST_STEPS: usize = 100;

/// The bundled corpus' token ids (tokenized once into the data cache, as `helios train`
/// does).
fn corpus_ids() -> BenchResult<Vec<u32>> {
    let tokenizer = helios_nn::Tokenizer::from_option(None)?;
    let cache = helios_nn::data::default_cache_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("helios-cache"));
    Ok(crate::corpus::Corpus::Bundled
        .open(&tokenizer, &cache)?
        .to_vec())
}

/// Trains `case` for `steps` timed steps after the first and the untimed ones that let
/// tuning settle, on `text` (token ids) or on random ids.
fn one(
    device: &Device,
    case: &Case,
    precision: DType,
    steps: usize,
    text: Option<&[u32]>,
) -> BenchResult<TrainResult> {
    let cfg = &case.config;
    let ids: Cow<[u32]> = match text {
        Some(ids) => Cow::Borrowed(ids),
        None => {
            let need = (case.batch * case.seq + 1) * (steps + 4);
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            (0..need)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % cfg.vocab_size as u64) as u32
                })
                .collect()
        }
    };
    let train = Tokens::from_ids(&ids, "bench")?;
    let init = ParamStore::init_gpt2(cfg, 1337)?;
    let tc = helios_nn::train::TrainConfig::steps_only(
        case.batch,
        case.seq,
        (steps + 3 + SETTLE_STEPS) as u64,
        precision,
    );
    device.empty_cache()?;
    let mut trainer = helios_nn::train::Trainer::new(device, &init, train, None, tc)?;
    drop(init);
    device.synchronize()?;
    let verbose = super::verbose();
    let compiles = || device.context().pipeline_stats();
    warm_clock(device)?;
    let before = compiles();
    let waited = helios::waited_compiles();
    let mut trace = Trace::new();
    let t0 = Instant::now();
    let log = trainer.train_step()?;
    device.synchronize()?;
    trace.push(&log);
    let first = t0.elapsed().as_secs_f64();
    let after = compiles();
    if verbose {
        let now = helios::waited_compiles();
        eprintln!(
            "bench: {} first step: {:.2} s (ending at {:.0} ms, the compile lines' clock), {} \
             pipelines created in {:.2} s and {} native kernels in {:.2} s (all threads); \
             waited for {} pipelines ({:.2} s) and {} native kernels ({:.2} s)",
            case.name,
            first,
            device.context().created_at().elapsed().as_secs_f64() * 1e3,
            after.pipelines_created - before.pipelines_created,
            after.total_create_seconds - before.total_create_seconds,
            after.native_created - before.native_created,
            after.native_create_seconds - before.native_create_seconds,
            now.0 - waited.0,
            now.1 - waited.1,
            now.2 - waited.2,
            now.3 - waited.3
        );
    }
    let mut all = vec![first * 1e3];
    // A cold first step leaves the GPU idle for seconds of compiling, and NVIDIA's driver
    // lowers its clock: steps 2-5 then run up to 4x slow whatever the tuning
    // (bench/results/2026-11-30-session48-h200.md). HELIOS_BENCH_REWARM=1 warms the clock
    // again here, to measure tuning's own cost in `first_100`.
    if std::env::var("HELIOS_BENCH_REWARM").as_deref() == Ok("1") {
        warm_clock(device)?;
    }
    // Untimed steps until no shape class is still tuning on real work (at least two, a
    // hundred on GPUs, and for the clock's warm-up time, which a long first step may have
    // let fall; at most SETTLE_STEPS or SETTLE_SECONDS): the timed steps are of settled
    // kernels, and `settled_after` says how long settling took.
    let settling = Instant::now();
    let least = match device.context().caps().device_type {
        helios_vk::DeviceType::Cpu => 3,
        _ => FIRST_STEPS + 1,
    };
    while all.len() < least
        || settling.elapsed() < device.warm_up_time()
        || (helios::tuning_in_progress(device) > 0
            && all.len() < SETTLE_STEPS
            && settling.elapsed().as_secs_f64() < SETTLE_SECONDS)
    {
        let waited = helios::waited_compiles();
        let submits = helios_vk::submit_compile_waits();
        let memory = device.memory_stats();
        let t = Instant::now();
        let log = trainer.train_step()?;
        device.synchronize()?;
        all.push(t.elapsed().as_secs_f64() * 1e3);
        trace.push(&log);
        // The steps right after the first, where exploring starts, and any step four times
        // its predecessors' median: what they waited for.
        let n = all.len();
        let stalled =
            n > 6 && Summary::of(&all[n - 6..n - 1]).is_some_and(|m| all[n - 1] > 4.0 * m.median);
        if (n <= 5 || stalled) && verbose {
            let now = helios::waited_compiles();
            let subs = helios_vk::submit_compile_waits();
            let mem = device.memory_stats();
            eprintln!(
                "bench: {} step {n}: {:.3} s (ending at {:.0} ms; GPU {:.1} ms, recording {:.1} \
                 ms); waited for {} pipelines ({:.2} s) and {} native kernels ({:.2} s) when \
                 asking, {} submits for compiles ({:.2} s); {} driver allocations and {} frees \
                 (holding {:.2} GiB); {} classes tuning",
                case.name,
                all[n - 1] / 1e3,
                device.context().created_at().elapsed().as_secs_f64() * 1e3,
                gpu_ms(&log),
                log.record_ms,
                now.0 - waited.0,
                now.1 - waited.1,
                now.2 - waited.2,
                now.3 - waited.3,
                subs.0 - submits.0,
                subs.1 - submits.1,
                mem.driver_allocations - memory.driver_allocations,
                mem.driver_frees - memory.driver_frees,
                mem.bytes_held as f64 / (1u64 << 30) as f64,
                helios::tuning_in_progress(device)
            );
        }
    }
    if verbose {
        let (pairs, us) = helios::exploration_spent();
        eprintln!(
            "bench: {} exploring so far: {pairs} pairs, {:.1} ms of their extra runs' GPU time",
            case.name,
            us / 1e3
        );
    }
    let mut times = Vec::with_capacity(steps);
    let (mut fwd, mut bwd, mut opt) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..steps {
        device.synchronize()?;
        let t = Instant::now();
        let log = trainer.train_step()?;
        device.synchronize()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        all.push(t.elapsed().as_secs_f64() * 1e3);
        trace.push(&log);
        fwd.push(log.fwd_ms);
        bwd.push(log.bwd_ms);
        opt.push(log.opt_ms);
    }
    let ms = summarize(&times, case.name)?;
    if verbose {
        for line in helios::matmul_exploring(device) {
            eprintln!("bench: still tuning {line}");
        }
    }
    let med = |v: &[f64]| summarize(v, case.name).map(|s| s.median);
    // Steps 2-101's wall time, ms, where that many ran.
    let hundred = (all.len() > FIRST_STEPS).then(|| all[1..=FIRST_STEPS].iter().sum::<f64>());
    Ok(TrainResult {
        case: case.name.to_string(),
        precision: precision_name(precision),
        batch: case.batch,
        seq: case.seq,
        tokens_per_s: (case.batch * case.seq) as f64 / (ms.median / 1e3),
        ms_per_step: ms,
        first_step_s: first,
        settled_after: all
            .iter()
            .rposition(|&t| t > ms.median * 1.02)
            .map_or(0, |i| i + 1),
        first_100: hundred.map(|h| h / (FIRST_STEPS as f64 * ms.median)),
        first_101_s: hundred.map(|h| first + h / 1e3),
        steps_ms: all,
        steps_gpu_ms: trace.gpu_ms,
        steps_record_ms: trace.record_ms,
        steps_explore_ms: trace.explore_ms,
        tokens: if text.is_some() { "text" } else { "random" },
        exploring: helios::matmul_exploring(device).len(),
        fwd_ms: med(&fwd)?,
        bwd_ms: med(&bwd)?,
        opt_ms: med(&opt)?,
        held_gib: gib(device.memory_stats().bytes_held),
        peak_in_use_gib: gib(device.memory_stats().peak_in_use),
        torch: Vec::new(),
    })
}

/// A step's GPU time: forward, backward, exchange and optimizer (`StepLog`), ms.
fn gpu_ms(l: &helios_nn::train::StepLog) -> f64 {
    l.fwd_ms + l.bwd_ms + l.comm_ms + l.opt_ms
}

/// Per step, what `TrainResult`'s `steps_*_ms` hold beside its wall time.
struct Trace {
    gpu_ms: Vec<f64>,
    record_ms: Vec<f64>,
    explore_ms: Vec<f64>,
    /// `helios::exploration_spent`'s GPU time at the last step, µs.
    spent_us: f64,
}

impl Trace {
    fn new() -> Trace {
        Trace {
            gpu_ms: Vec::new(),
            record_ms: Vec::new(),
            explore_ms: Vec::new(),
            spent_us: helios::exploration_spent().1,
        }
    }

    fn push(&mut self, log: &helios_nn::train::StepLog) {
        let spent = helios::exploration_spent().1;
        self.gpu_ms.push(gpu_ms(log));
        self.record_ms.push(log.record_ms);
        self.explore_ms.push((spent - self.spent_us) / 1e3);
        self.spent_us = spent;
    }
}

/// Keeps the GPU busy for its warm-up time (`Device::warm_up`) with copies of 64 MiB, so
/// that the first steps run at the working clock. Without it a run whose first step is
/// quick (a warm cache) timed its next ~8 steps at the idle clock, 2.5-4× slow
/// (bench/results/2026-11-29-session43-h200.md), and counted them as tuning not settled.
fn warm_clock(device: &Device) -> BenchResult<()> {
    let src = Tensor::zeros(device, &[1 << 24], DType::F32)?;
    let dst = Tensor::zeros(device, &[1 << 24], DType::F32)?;
    device.warm_up(|| {
        for _ in 0..16 {
            src.copy_into(&dst)?;
        }
        device.synchronize()
    })?;
    Ok(())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// A precision as the tables and the PyTorch script name it.
pub(super) fn precision_name(p: DType) -> &'static str {
    match p {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "fp32",
    }
}

fn run_torch(
    script: &Path,
    results: &[TrainResult],
    precisions: &[DType],
    text: Option<&[u32]>,
) -> Result<(serde_json::Value, Vec<TorchTrain>), String> {
    let layers = |name: &str| match name {
        "distilgpt2" => 6,
        "gpt2" => 12,
        _ => 2,
    };
    let mut cases: Vec<String> = results
        .iter()
        .map(|r| format!("{}:{}:{}:{}", r.case, layers(&r.case), r.batch, r.seq))
        .collect();
    cases.dedup();
    let names: Vec<&str> = precisions.iter().map(|&p| precision_name(p)).collect();
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script).args([
        "--json",
        "-",
        "--cases",
        &cases.join(","),
        "--precisions",
        &names.join(","),
    ]);
    // The text's first ids, little-endian u32: each case's batch is its first batch × seq.
    let ids_file = match text {
        Some(ids) => {
            let most = results.iter().map(|r| r.batch * r.seq).max().unwrap_or(0);
            let bytes: Vec<u8> = ids[..most.min(ids.len())]
                .iter()
                .flat_map(|i| i.to_le_bytes())
                .collect();
            let path =
                std::env::temp_dir().join(format!("helios-bench-ids-{}", std::process::id()));
            std::fs::write(&path, bytes)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            cmd.arg("--ids").arg(&path);
            Some(path)
        }
        None => None,
    };
    let out = cmd.output().map_err(|e| format!("cannot run python3: {e}"));
    if let Some(path) = ids_file {
        let _ = std::fs::remove_file(path);
    }
    super::torch_results(script, &out?)
}

fn table(results: &[TrainResult]) -> String {
    let mut s = String::from(
        "case        prec   BxT       ms/step     p95  tokens/s  first s  2% after  2-101  fwd/bwd/opt ms   held/peak GiB | torch eager ms  compile ms  (first s, reserved/peak GiB)\n",
    );
    for r in results {
        let torch = |mode: &str| r.torch.iter().find(|t| t.mode == mode);
        let fmt = |t: Option<&TorchTrain>| match t {
            Some(t) => format!(
                "{:>8.1} ({:.1} s, {:.1}/{:.1})",
                t.ms_per_step, t.first_step_s, t.reserved_gib, t.peak_gib
            ),
            None => "       -".to_string(),
        };
        s.push_str(&format!(
            "{:11} {:5} {:>4}x{:<5} {:>8.1} {:>7.1} {:>9.0} {:>8.2} {:>9}  {:>5}  {:>5.1}/{:>5.1}/{:>5.1}  {:>6.2}/{:<6.2} | {}  {}\n",
            r.case,
            r.precision,
            r.batch,
            r.seq,
            r.ms_per_step.median,
            r.ms_per_step.p95,
            r.tokens_per_s,
            r.first_step_s,
            r.settled_after,
            r.first_100.map_or("-".to_string(), |x| format!("{x:.3}")),
            r.fwd_ms,
            r.bwd_ms,
            r.opt_ms,
            r.held_gib,
            r.peak_in_use_gib,
            fmt(torch("eager")),
            fmt(torch("compile"))
        ));
    }
    s
}
