// `helios bench generate`: autoregressive decoding of GPT-2 124M (random init) with the
// key/value cache, the way `helios generate` runs it, beside Hugging Face's `generate` in
// PyTorch (`--compare torch` runs bench/torch_generate.py).
//
// An 8-token prompt, then 200 greedy tokens (`--samples N` sets the count; with --quick a
// 2-layer 128-wide model and 16 tokens), fp32 and bf16 weights, batch 1 (`generate`) and
// batch 8 (the prompt 8 times, one cache of 8 sequences stepped together, as Hugging Face's
// batch of 8 does). Every token is timed on its own, from the previous token's id on the
// host to this one's: each step reads its logits back before it feeds the next tokens, as
// any user's loop must. Figures: time to first token (the prompt's single-position steps and
// the first pick), then median / p95 / max ms per token over the others. The whole run is
// done twice in one process: "cold" with whatever caches HELIOS_CACHE_DIR holds (a fresh
// directory is what a new user sees), then "warm"; the cold pass's max says whether a token
// waited on pipeline compilation or a kernel tuner.

use std::path::Path;
use std::time::Instant;

use helios::{DType, Device};
use helios_nn::generate::{generate, sample, Sampling};
use helios_nn::kv_cache::{self, KvCache};
use helios_nn::model::GptParams;
use helios_nn::{GptConfig, ParamStore};
use serde::{Deserialize, Serialize};

use super::stats::Summary;
use super::train::precision_name;
use super::{report, summarize, BenchArgs, BenchResult};
use crate::CliResult;

/// "The quick brown fox jumps over the lazy" in GPT-2's tokenizer; the weights are random,
/// so only the length matters, and both sides use the same ids.
const PROMPT: [u32; 8] = [464, 2068, 7586, 21831, 18045, 625, 262, 16931];

/// The batches measured, on both sides.
const BATCHES: [usize; 2] = [1, 8];

#[derive(Debug, Serialize)]
struct GenResult {
    case: &'static str,
    /// "cold" (the first pass in the process) or "warm" (the second).
    pass: &'static str,
    precision: &'static str,
    batch: usize,
    prompt_tokens: usize,
    new_tokens: usize,
    /// From the call to the first new token's id on the host, prompt included, ms.
    first_token_ms: f64,
    /// Tokens 2..N, each from the previous token's ids to its own (one per sequence).
    ms_per_token: Summary,
    /// batch · 1000 / the median ms per token.
    tokens_per_s: f64,
    /// Every token's wall time, ms, the first one included.
    tokens_ms: Vec<f64>,
    /// Pipelines created during the pass, compiled or from the on-disk pipeline cache (0: all
    /// were in memory already).
    pipelines_built: u64,
    /// Matmul shape classes still being tuned on real work after the pass.
    exploring: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    torch: Vec<TorchGen>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
struct TorchGen {
    pass: String,
    precision: String,
    batch: usize,
    first_token_ms: f64,
    /// Median over tokens 2..N; per sequence step, so batch 8 makes 8 tokens in it.
    ms_per_token: f64,
    p95_ms: f64,
    max_ms: f64,
    tokens_per_s: f64,
    /// "per_step" (a stopping criterion stamps every step) or "total/n".
    timing: String,
}

pub fn run(args: &BenchArgs) -> CliResult {
    let (case, config) = match args.quick {
        true => (
            "quick",
            GptConfig {
                n_layer: 2,
                n_head: 2,
                n_embd: 128,
                block_size: 64,
                ..GptConfig::tiny()
            },
        ),
        false => ("gpt2", GptConfig::gpt2()),
    };
    let n = args
        .samples
        .map_or(if args.quick { 16 } else { 200 }, |s| s as usize);
    if n < 2 {
        return Err(
            "--samples: generate needs at least 2 tokens (the first is timed apart)".into(),
        );
    }
    // Past the block size `generate` recomputes the window, which is not what is measured.
    if PROMPT.len() + n - 1 > config.block_size {
        return Err(format!(
            "--samples {n}: {} prompt tokens and {n} new ones exceed the model's {} positions",
            PROMPT.len(),
            config.block_size
        )
        .into());
    }
    let precisions = precisions(&args.dtypes)?;
    let script = super::torch_script_named(args, "bench/torch_generate.py")?;
    let device = Device::from_env()?;
    eprintln!("bench: generate on {}", device.name());
    let store = ParamStore::init_gpt2(&config, 1337)?;
    let models = precisions
        .iter()
        .map(|&p| Ok((p, GptParams::upload(&store, &device, p)?)))
        .collect::<BenchResult<Vec<_>>>()?;
    drop(store);
    let mut results = Vec::new();
    for pass in ["cold", "warm"] {
        for ((precision, params), batch) in models
            .iter()
            .flat_map(|m| BATCHES.iter().map(move |&b| (m, b)))
        {
            let r = one(&device, params, case, pass, *precision, batch, n)?;
            eprintln!(
                "bench: {pass} {} batch {batch} first token {:.1} ms, {:.2} ms/token (p95 {:.2}, \
                 max {:.2}), {:.0} tokens/s, {} pipelines built",
                r.precision,
                r.first_token_ms,
                r.ms_per_token.median,
                r.ms_per_token.p95,
                r.ms_per_token.max,
                r.tokens_per_s,
                r.pipelines_built
            );
            results.push(r);
        }
    }
    let (torch_meta, torch_note, rows) = super::torch_side(script.as_deref(), |script| {
        run_torch(script, &config, n, &precisions)
    });
    for r in results.iter_mut() {
        r.torch = rows
            .iter()
            .filter(|t| t.pass == r.pass && t.precision == r.precision && t.batch == r.batch)
            .cloned()
            .collect();
    }
    let torch = (torch_meta, torch_note);
    super::finish(
        args,
        &device,
        "generate",
        torch,
        Some(n),
        &results,
        |meta| table(meta, &results),
    )
}

/// The weight dtypes `--dtypes` names (default fp32 and bf16).
fn precisions(dtypes: &[String]) -> BenchResult<Vec<DType>> {
    if dtypes.is_empty() {
        return Ok(vec![DType::F32, DType::BF16]);
    }
    let mut v = Vec::new();
    for d in dtypes {
        let p = match d.as_str() {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            other => return Err(format!("generate measures f32 and bf16, not {other}").into()),
        };
        if !v.contains(&p) {
            v.push(p);
        }
    }
    Ok(v)
}

/// One greedy decode of `n` tokens after the prompt, every token stamped as it comes: batch
/// 1 through `generate`, a larger batch through one cache of `batch` sequences.
fn one(
    device: &Device,
    params: &GptParams,
    case: &'static str,
    pass: &'static str,
    precision: DType,
    batch: usize,
    n: usize,
) -> BenchResult<GenResult> {
    let greedy = Sampling {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
    };
    let built = || device.context().pipeline_stats().pipelines_created;
    let before = built();
    // HELIOS_PROFILE=1: each pass's own per-kernel table, printed after it.
    super::profile_start(device)?;
    device.synchronize()?;
    let mut stamps: Vec<Instant> = Vec::with_capacity(n);
    let t0 = Instant::now();
    // HELIOS_VERBOSE=1: a token twice as slow as the one before it is printed when it ends,
    // on the clock of the compile lines, so the log shows what it waited for.
    let verbose = super::verbose();
    let born = device.context().created_at();
    let mut stamp = || {
        let now = Instant::now();
        if let (true, [.., a, b]) = (verbose, stamps.as_slice()) {
            let (last, this) = (*b - *a, now - *b);
            if this > 2 * last && this.as_secs_f64() > 1e-3 {
                eprintln!(
                    "bench: {pass} {} batch {batch} token {} took {:.2} ms (the one before \
                     {:.2}), ending at {:.0} ms",
                    precision_name(precision),
                    stamps.len() + 1,
                    this.as_secs_f64() * 1e3,
                    last.as_secs_f64() * 1e3,
                    (now - born).as_secs_f64() * 1e3
                );
            }
        }
        stamps.push(now);
    };
    match batch {
        1 => drop(generate(params, device, &PROMPT, n, &greedy, |_| stamp())?),
        _ => decode_batch(params, batch, n, &greedy, |_| stamp())?,
    }
    let mut last = t0;
    let tokens_ms: Vec<f64> = stamps
        .iter()
        .map(|&t| {
            let ms = (t - last).as_secs_f64() * 1e3;
            last = t;
            ms
        })
        .collect();
    if device.context().profiler().is_some() {
        if let Some(report) = device.profile_report()? {
            eprintln!(
                "bench: {pass} {} batch {batch}, GPU time of its {n} tokens by kernel:\n{report}",
                precision_name(precision)
            );
        }
    }
    let ms = summarize(&tokens_ms[1..], case)?;
    Ok(GenResult {
        case,
        pass,
        precision: precision_name(precision),
        batch,
        prompt_tokens: PROMPT.len(),
        new_tokens: n,
        first_token_ms: tokens_ms[0],
        tokens_per_s: batch as f64 * 1e3 / ms.median,
        ms_per_token: ms,
        tokens_ms,
        pipelines_built: built() - before,
        exploring: helios::matmul_exploring(device).len(),
        torch: Vec::new(),
    })
}

/// `generate` for `batch` copies of the prompt in one cache: `n` steps of `batch` tokens,
/// `on_step` called with each step's tokens.
fn decode_batch(
    params: &GptParams,
    batch: usize,
    n: usize,
    s: &Sampling,
    mut on_step: impl FnMut(&[u32]),
) -> BenchResult<()> {
    let v = params.config().vocab_size;
    let mut cache = KvCache::with_batch(params, batch)?;
    let mut logits = None;
    for &t in &PROMPT {
        logits = Some(kv_cache::step_batch(params, &mut cache, &vec![t; batch])?);
    }
    let mut logits = logits.expect("the prompt is not empty");
    for i in 0..n {
        let host = logits.to_vec()?; // (batch, V)
        let next: Vec<u32> = host.chunks_exact(v).map(|l| sample(l, s, 0.0)).collect();
        on_step(&next);
        if i + 1 == n {
            break;
        }
        logits = kv_cache::step_batch(params, &mut cache, &next)?;
    }
    Ok(())
}

fn run_torch(
    script: &Path,
    cfg: &GptConfig,
    n: usize,
    precisions: &[DType],
) -> Result<(serde_json::Value, Vec<TorchGen>), String> {
    let prompt: Vec<String> = PROMPT.iter().map(u32::to_string).collect();
    let names: Vec<&str> = precisions.iter().map(|&p| precision_name(p)).collect();
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(["--json", "-"])
        .args(["--layers", &cfg.n_layer.to_string()])
        .args(["--heads", &cfg.n_head.to_string()])
        .args(["--embd", &cfg.n_embd.to_string()])
        .args(["--positions", &cfg.block_size.to_string()])
        .args(["--prompt", &prompt.join(",")])
        .args(["--new-tokens", &n.to_string()])
        .args(["--precisions", &names.join(",")])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    super::torch_results(script, &out)
}

fn table(meta: &report::RunMeta, results: &[GenResult]) -> String {
    let mut s = meta.header();
    s.push_str(
        "pass  prec  batch  tokens  first ms  ms/token     p95     max  tokens/s  built  tuning | torch first ms  ms/token     max  tokens/s\n",
    );
    let mut per_sum = false;
    for r in results {
        per_sum |= r.torch.iter().any(|t| t.timing != "per_step");
        let torch = r.torch.first().map_or("             -".to_string(), |t| {
            format!(
                "{:>14.1}  {:>8.2}  {:>6.2}  {:>8.0}",
                t.first_token_ms, t.ms_per_token, t.max_ms, t.tokens_per_s
            )
        });
        s.push_str(&format!(
            "{:5} {:5} {:>5}  {:>6}  {:>8.1}  {:>8.2}  {:>6.2}  {:>6.2}  {:>8.0}  {:>5}  {:>6} | {torch}\n",
            r.pass,
            r.precision,
            r.batch,
            r.new_tokens,
            r.first_token_ms,
            r.ms_per_token.median,
            r.ms_per_token.p95,
            r.ms_per_token.max,
            r.tokens_per_s,
            r.pipelines_built,
            r.exploring,
        ));
    }
    // The suite's point: whether any token of the first pass waited (compilation, tuning).
    for cold in results.iter().filter(|r| r.pass == "cold") {
        let warm = results
            .iter()
            .find(|w| w.pass == "warm" && w.precision == cold.precision && w.batch == cold.batch);
        if let Some(warm) = warm {
            s.push_str(&format!(
                "{} batch {}: slowest cold token (after the first) {:.2} ms, {:.2}x the warm \
                 median\n",
                cold.precision,
                cold.batch,
                cold.ms_per_token.max,
                cold.ms_per_token.max / warm.ms_per_token.median
            ));
        }
    }
    if per_sum {
        s.push_str("note: some torch rows are total time / tokens, not per-step stamps\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_default_to_both_and_refuse_f16() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(precisions(&[]).unwrap(), vec![DType::F32, DType::BF16]);
        assert_eq!(precisions(&names(&["bf16"])).unwrap(), vec![DType::BF16]);
        assert!(precisions(&names(&["f32", "f16"])).is_err());
    }
}
