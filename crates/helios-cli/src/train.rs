// `helios train`: trains a GPT-2 (the `tiny` preset by default) on a text or token file,
// with a progress bar, validation loss, checkpoints and exact resume, then writes a loss
// curve (PNG), a JSON and a CSV log into --out and prints a sample from the trained model.
//
// Everything that can fail because of a flag or a file fails before the first step, with a
// message that names the flag or the file (helios-nn's errors); running out of device memory
// at a batch size says which flags to lower.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use helios::{DType, Device, IndexTensor};
use helios_dist::Rank;
use helios_nn::checkpoint::load_checkpoint;
use helios_nn::generate::Sampling;
use helios_nn::model::{self, GptParams};
use helios_nn::train::{Event, TrainConfig, Trainer};
use helios_nn::{
    load_pretrained, AdamWHyper, GptConfig, LrSchedule, ParamStore, Tokenizer, Tokens,
};
use indicatif::{ProgressBar, ProgressStyle};

use crate::bench::stats::Summary;
use crate::corpus::Corpus;
use crate::plot;
use crate::CliResult;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Precision {
    Fp32,
    Bf16,
    /// f16 weights and activations, f32 masters, dynamic loss scaling.
    F16,
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Model size: tiny, distilgpt2, gpt2 or gpt2-medium (ignored with --init or --resume).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Override the preset's layers.
    #[arg(long)]
    pub n_layer: Option<usize>,
    /// Override the preset's attention heads.
    #[arg(long)]
    pub n_head: Option<usize>,
    /// Override the preset's channels.
    #[arg(long)]
    pub n_embd: Option<usize>,
    /// Override the preset's positions (block size).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Training text (UTF-8, tokenized once and cached) or token file (.bin, u16).
    /// Default: the bundled corpus, 32 works of Shakespeare (3.6 MB; the Helios repository's
    /// data/shakespeare/shakespeare.txt), which the binary carries, so it works from any
    /// directory.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A Hugging Face tokenizer.json instead of GPT-2's BPE.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The last fraction of the tokens validates.
    #[arg(long, default_value_t = 0.05)]
    pub val_fraction: f64,
    /// Optimizer steps in all (a resumed run continues up to this step).
    #[arg(long, default_value_t = 40)]
    pub steps: u64,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Tokens per sequence (at most the model's block size).
    #[arg(long, default_value_t = 64)]
    pub seq: usize,
    /// Micro-batches summed into each optimizer step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    pub accum: usize,
    /// Peak learning rate (after warm-up; cosine decay to --min-lr).
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f64,
    /// Final learning rate (default: --lr / 10).
    #[arg(long)]
    pub min_lr: Option<f64>,
    /// Warm-up steps (default: --steps / 10).
    #[arg(long)]
    pub warmup: Option<u64>,
    /// AdamW weight decay, applied to the matrices only.
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (0: no clipping).
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f64,
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    pub precision: Precision,
    /// Start from these weights (a Hugging Face GPT-2 safetensors file or directory).
    #[arg(long, conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// Continue the run checkpointed in this directory (e.g. OUT/checkpoint).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Where the checkpoint, logs, loss curve and sample go.
    #[arg(long, default_value = "out/train")]
    pub out: PathBuf,
    /// Seeds the initial weights and the batch order.
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Validation loss every N steps and at the end (0: never).
    #[arg(long, default_value_t = 20)]
    pub eval_every: u64,
    /// Validation batches per evaluation.
    #[arg(long, default_value_t = 2)]
    pub eval_batches: usize,
    /// Checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// After one forward and backward on the first batch, write its inputs, logits, loss
    /// and every parameter's gradient (`grad.<HF name>`) to this safetensors file, and stop.
    #[arg(long)]
    pub dump_state: Option<PathBuf>,
    /// Tokens to sample from the trained model at the end (0: none).
    #[arg(long, default_value_t = 60)]
    pub sample_tokens: usize,
    /// The sample's prompt.
    #[arg(long, default_value = "ROMEO:")]
    pub prompt: String,
    /// Data parallel: train on N GPUs of this host, one process each, each with --batch
    /// rows (so N times the batch per step). The ranks talk through MPI (a build with
    /// `--features mpi`, MPICH installed); under an external launcher (`mpiexec`) leave
    /// this out.
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    /// Data parallel, ZeRO-1: shard the optimizer state (AdamW moments, and the f32 master
    /// weights of bf16 and f16 runs) over the ranks, so each rank holds and updates only its
    /// share of the parameters: less memory per GPU, the same training within rounding.
    /// Checkpoints are the same either way. Changes nothing in a run of one process.
    #[arg(long)]
    pub zero: bool,
}

impl TrainArgs {
    fn model_config(&self) -> helios_nn::Result<GptConfig> {
        let mut c = GptConfig::preset(&self.preset)?;
        c.n_layer = self.n_layer.unwrap_or(c.n_layer);
        c.n_head = self.n_head.unwrap_or(c.n_head);
        c.n_embd = self.n_embd.unwrap_or(c.n_embd);
        c.block_size = self.block_size.unwrap_or(c.block_size);
        c.validate()?;
        Ok(c)
    }

    fn train_config(&self) -> TrainConfig {
        let warmup = self.warmup.unwrap_or(self.steps / 10).min(self.steps);
        TrainConfig {
            batch: self.batch,
            seq: self.seq,
            accum: self.accum,
            steps: self.steps,
            schedule: LrSchedule {
                max_lr: self.lr,
                min_lr: self.min_lr.unwrap_or(self.lr / 10.0),
                warmup_steps: warmup,
                total_steps: self.steps,
            },
            adamw: AdamWHyper {
                weight_decay: self.weight_decay,
                grad_clip: (self.grad_clip > 0.0).then_some(self.grad_clip),
                ..AdamWHyper::default()
            },
            precision: match self.precision {
                Precision::Fp32 => DType::F32,
                Precision::Bf16 => DType::BF16,
                Precision::F16 => DType::F16,
            },
            seed: self.seed,
            eval_every: self.eval_every,
            eval_batches: self.eval_batches,
            save_every: self.save_every,
            checkpoint_dir: Some(self.out.join("checkpoint")),
            zero: self.zero,
        }
    }
}

/// Whether `e` is the device running out of memory (or a buffer larger than it allows).
fn is_oom(e: &helios_nn::Error) -> bool {
    use helios_vk::Error as Vk;
    matches!(
        e,
        helios_nn::Error::Helios(helios::Error::Vulkan(
            Vk::OutOfMemory { .. } | Vk::PoolOutOfMemory { .. } | Vk::BufferTooLarge { .. },
        ))
    )
}

/// The largest batch (halving from `cfg.batch`) with which one training step of `init` runs
/// on `device`, found by trying: a probe saves nothing and evaluates nothing.
fn fitting_batch(
    device: &Device,
    init: &ParamStore,
    train: &Tokens,
    cfg: &TrainConfig,
) -> Option<usize> {
    let mut batch = cfg.batch / 2;
    while batch >= 1 {
        let probe = TrainConfig {
            batch,
            steps: 1,
            eval_every: 0,
            save_every: 0,
            checkpoint_dir: None,
            ..cfg.clone()
        };
        let tried = Trainer::new(device, init, train.clone(), None, probe)
            .and_then(|mut t| t.train_step().map(drop));
        match tried {
            Ok(()) => return Some(batch),
            Err(e) if is_oom(&e) => batch /= 2,
            Err(_) => return None,
        }
    }
    None
}

/// Adds what to do to an error; for running out of memory, which batch fits (`fits`, from
/// `fitting_batch`).
fn explain(
    e: helios_nn::Error,
    args: &TrainArgs,
    fits: Option<usize>,
) -> Box<dyn std::error::Error> {
    if !is_oom(&e) {
        return Box::new(e);
    }
    let tokens = args.batch * args.accum;
    match fits {
        Some(b) => format!(
            "{e}\nbatches of {}x{} do not fit in this device's memory; {b}x{} does: use \
             --batch {b}{} to keep the tokens per step",
            args.batch,
            args.seq,
            args.seq,
            if tokens % b == 0 {
                format!(" --accum {}", tokens / b)
            } else {
                String::new()
            },
        )
        .into(),
        None => format!(
            "{e}\nthe device has too little memory for batches of {}x{}, and a batch of 1 does \
             not fit either: lower --seq, or pick a smaller model",
            args.batch, args.seq
        )
        .into(),
    }
}

pub fn run(args: &TrainArgs) -> CliResult {
    let rank = Rank::from_env()?;
    if args.nproc == 0 {
        return Err("--nproc must be at least 1 (the number of GPUs to train on)".into());
    }
    if args.nproc > 1 {
        if rank.world > 1 {
            return Err(format!(
                "--nproc {} in a process that is already rank {} of {}: the launcher starts \
                 the ranks, so leave --nproc out",
                args.nproc, rank.rank, rank.world
            )
            .into());
        }
        let program = std::env::current_exe()?;
        let rest = without_nproc(std::env::args_os().skip(1));
        helios_dist::launch::launch(args.nproc, &program, &rest)?;
        return Ok(());
    }
    match train(args, rank) {
        Err(e) if rank.world > 1 => {
            // The other ranks may be waiting for this one in a collective: stop them all.
            // One write, so that ranks failing together do not interleave their lines.
            let line = format!("error: rank {}: {e}\n", rank.rank);
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            helios::stop_background_tuning();
            helios_dist::abort(1)
        }
        other => other,
    }
}

/// The command line without `--nproc N`: what each rank runs.
fn without_nproc(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        match a.to_str() {
            Some("--nproc") => skip_value = true,
            Some(s) if s.starts_with("--nproc=") => {}
            _ => out.push(a),
        }
    }
    out
}

fn train(args: &TrainArgs, rank: Rank) -> CliResult {
    let started = Instant::now();
    // Rank 0 reports; the other ranks print only their errors.
    let first = rank.is_first();
    macro_rules! say {
        ($($t:tt)*) => { if first { println!($($t)*) } };
    }
    let cfg = args.train_config();
    if args.accum == 0 {
        return Err("--accum must be at least 1".into());
    }
    if !(0.0..1.0).contains(&args.val_fraction) {
        return Err("--val-fraction must be in [0, 1)".into());
    }
    let shape_flags = [args.n_layer, args.n_head, args.n_embd, args.block_size];
    if (args.init.is_some() || args.resume.is_some()) && shape_flags.iter().any(Option::is_some) {
        return Err(
            "--n-layer/--n-head/--n-embd/--block-size describe a new model; with --init or \
                    --resume the model's shape comes from its config.json"
                .into(),
        );
    }
    if args.dump_state.is_some() && rank.world > 1 {
        return Err("--dump-state runs one process: leave out --nproc and the launcher".into());
    }
    let device = helios_dist::device_for(&rank)?;
    let comm = helios_dist::connect(&device, rank)?;
    say!("device: {}", device.name());
    if rank.world > 1 {
        say!(
            "data parallel: {} ranks over {}, batches of {}x{} each{}",
            rank.world,
            comm.backend(),
            args.batch,
            args.seq,
            match args.zero {
                true => "; optimizer state sharded (ZeRO-1)",
                false => "",
            }
        );
    }

    // Data first: the cheapest thing to get wrong.
    let tokenizer = Tokenizer::from_option(args.tokenizer.as_deref())?;
    // The sample's prompt too, so that a bad one fails now rather than after the training.
    let prompt = tokenizer.encode(&args.prompt)?;
    if args.sample_tokens > 0 && prompt.is_empty() {
        return Err(
            "--prompt is empty: give the sample a prompt (e.g. --prompt \"ROMEO:\"), \
                    or --sample-tokens 0 for no sample"
                .into(),
        );
    }
    let cache = helios_nn::data::default_cache_dir().unwrap_or_else(|| args.out.join("cache"));
    let corpus = Corpus::from_flag(args.data.as_deref());
    let tokens = corpus.open(&tokenizer, &cache)?;
    let (train, val) = tokens.split(args.val_fraction)?;
    let val = (!val.is_empty()).then_some(val);
    say!(
        "data: {} ({} tokens: {} train, {} validation)",
        corpus.describe(),
        tokens.len(),
        train.len(),
        val.as_ref().map_or(0, Tokens::len)
    );

    // Out of memory at this batch size: the weights, data and configuration to find one that
    // fits, once whatever failed has been dropped.
    let probe_cfg = cfg.clone();
    let probe_train = train.clone();
    let oom = |e: helios_nn::Error, init: &ParamStore| {
        let fits = is_oom(&e)
            .then(|| fitting_batch(&device, init, &probe_train, &probe_cfg))
            .flatten();
        explain(e, args, fits)
    };
    let (mut trainer, init) = if let Some(dir) = &args.resume {
        let ckpt = load_checkpoint(dir)?;
        check_vocab(ckpt.params.config(), &tokenizer)?;
        let t = match Trainer::resume_with(&device, &ckpt, train, val, cfg, comm) {
            Ok(t) => t,
            Err(e) => return Err(oom(e, &ckpt.params)),
        };
        say!("resumed {} at step {}", dir.display(), t.step_count());
        (t, ckpt.params)
    } else {
        let init = match &args.init {
            Some(path) => load_pretrained(path, None)?,
            None => ParamStore::init_gpt2(&args.model_config()?, args.seed)?,
        };
        check_vocab(init.config(), &tokenizer)?;
        match Trainer::new_with(&device, &init, train, val, cfg, comm) {
            Ok(t) => (t, init),
            Err(e) => return Err(oom(e, &init)),
        }
    };
    let model = trainer.params().config().clone();
    say!(
        "model: {} layers, {} heads, {} channels, vocabulary {}, {:.2}M parameters; \
         batches of {}x{}x{} ({:?})",
        model.n_layer,
        model.n_head,
        model.n_embd,
        model.vocab_size,
        model.num_params() as f64 / 1e6,
        args.batch,
        args.seq,
        args.accum,
        args.precision
    );

    if let Some(path) = &args.dump_state {
        dump_state(&trainer, &device, args, path)?;
        println!("wrote {}", path.display());
        return Ok(());
    }

    if first {
        std::fs::create_dir_all(&args.out)
            .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    }
    let start_step = trainer.step_count();
    let bar = match first {
        true => ProgressBar::new(args.steps),
        false => ProgressBar::hidden(),
    };
    bar.set_position(start_step);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
        )
        .expect("a valid template"),
    );
    let loud = first && bar.is_hidden(); // no terminal: print lines instead
    let note = |line: String| match (first, loud) {
        (false, _) => {}
        (true, true) => println!("{line}"),
        (true, false) => bar.println(line),
    };
    let profiling = std::env::var_os("HELIOS_PROFILE").is_some();
    let t0 = Instant::now();
    let result = trainer.run(None, |e| match e {
        Event::Step(s) => {
            let ms = s.step_ms;
            let comm = match rank.world > 1 {
                true => format!(" comm {:.0}", s.comm_ms),
                false => String::new(),
            };
            let msg = format!(
                "loss {:.4} | {:.0} tok/s | fwd {:.0} bwd {:.0}{comm} opt {:.0} ms | lr {:.2e} | norm {:.2}",
                s.loss,
                s.tokens as f64 / (ms / 1e3),
                s.fwd_ms,
                s.bwd_ms,
                s.opt_ms,
                s.lr,
                s.grad_norm
            );
            let msg = match (s.loss_scale, s.skipped) {
                (Some(scale), true) => format!("{msg} | scale {scale} overflow: update skipped"),
                (Some(scale), false) => format!("{msg} | scale {scale}"),
                _ => msg,
            };
            if profiling && s.step == start_step + 1 {
                // The table covers the steady state: the first step (compilation, tuning)
                // is collected and cleared.
                let first = device.synchronize().and_then(|()| device.profile_report());
                if let (Ok(_), Some(p)) = (first, device.context().profiler()) {
                    p.reset();
                }
            }
            if loud && (s.step == start_step + 1 || s.step % 10 == 0 || s.step == args.steps) {
                println!("step {:5}/{} {msg}", s.step, args.steps);
            }
            bar.set_message(msg);
            bar.inc(1);
        }
        Event::Eval(v) => note(format!("step {:5}: validation loss {:.4}", v.step, v.loss)),
        Event::Saved { step, dir } => {
            if step != args.steps {
                note(format!("step {step:5}: checkpoint {}", dir.display()));
            }
        }
    });
    bar.finish();
    if let Err(e) = result {
        // Free the failed run's memory before trying smaller batches.
        drop(trainer);
        return Err(oom(e, &init));
    }
    let train_s = t0.elapsed().as_secs_f64();
    // Under ZeRO-1 the f32 weights are gathered from every rank: before the ranks part.
    let weights = match args.sample_tokens {
        0 => None,
        _ => trainer.gather_weights()?,
    };
    trainer.finish()?;
    if !first {
        return Ok(());
    }

    // Summary, logs and the curve.
    let h = trainer.history();
    let ran: Vec<_> = h.train.iter().filter(|s| s.step > start_step).collect();
    if let (Some(first), Some(last)) = (h.train.first(), h.train.last()) {
        let steady: Vec<f64> = ran.iter().skip(1).map(|s| s.step_ms).collect();
        // The first step of a run compiles and tunes: the rate is the later steps' (none
        // when the run had one step).
        let rate = match Summary::of(&steady) {
            None => String::new(),
            Some(ms) => format!(
                "; {:.1} ms/step (p95 {:.1}), {:.0} tokens/s (steady state)",
                ms.median,
                ms.p95,
                last.tokens as f64 / (ms.median / 1e3)
            ),
        };
        println!(
            "trained {} steps in {train_s:.1} s: loss {:.3} -> {:.3}{}{rate}",
            ran.len(),
            first.loss,
            last.loss,
            h.val
                .last()
                .map(|v| format!(" (validation {:.3})", v.loss))
                .unwrap_or_default(),
        );
    }
    // Why a short run's steps were a few percent slower than they will be.
    let tuning = helios::tuning_in_progress(&device);
    if tuning > 0 {
        println!(
            "kernel tuning: {tuning} shape classes still being tuned on real work (a few \
             percent of each step meanwhile); the next run goes on where this one stopped"
        );
    }
    if profiling {
        if let Some(report) = device.profile_report()? {
            println!("GPU time per kernel, every step after the first:\n{report}");
        }
        // What the kernel choices rest on: stored winners, and classes still being tuned
        // on real work (their first choice runs meanwhile).
        let exploring = helios::matmul_exploring(&device);
        println!(
            "matmul tuning: {} winners stored for this device, {} classes still tuning on \
             real work",
            helios::stored_winners(&device, "matmul"),
            exploring.len()
        );
        for line in exploring {
            println!("  {line}");
        }
    }
    write_logs(&args.out, h)?;
    match plot::loss_curve(&args.out.join("loss.png"), h) {
        Ok(()) => {}
        Err(e) => eprintln!("warning: no loss curve: {e}"),
    }
    println!(
        "wrote {}/checkpoint, log.json, log.csv, loss.png",
        args.out.display()
    );

    if let Some(weights) = weights {
        let s = Sampling {
            seed: args.seed,
            ..Sampling::default()
        };
        println!("--- sample ({} tokens) ---", args.sample_tokens);
        print!("{}", args.prompt);
        let params = GptParams::upload(&weights, &device, DType::F32)?;
        crate::generate::stream(
            &params,
            &device,
            &tokenizer,
            &prompt,
            args.sample_tokens,
            &s,
            true,
        )?;
        println!("\n---");
    }
    println!("total {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn check_vocab(model: &GptConfig, tok: &Tokenizer) -> helios_nn::Result<()> {
    if tok.vocab_size() > model.vocab_size {
        return Err(helios_nn::Error::VocabMismatch {
            what: format!("the tokenizer ({})", tok.id()),
            expected: model.vocab_size,
            got: tok.vocab_size(),
        });
    }
    Ok(())
}

/// log.json (every step and evaluation) and log.csv (step, loss, val_loss, lr, norm, ms).
fn write_logs(out: &Path, h: &helios_nn::History) -> CliResult {
    let json = serde_json::to_string_pretty(h)?;
    std::fs::write(out.join("log.json"), json)
        .map_err(|e| format!("cannot write {}: {e}", out.join("log.json").display()))?;
    let mut csv = String::from(
        "step,loss,val_loss,lr,grad_norm,fwd_ms,bwd_ms,opt_ms,tokens,loss_scale,skipped,comm_ms,step_ms\n",
    );
    for s in &h.train {
        let val = h
            .val
            .iter()
            .find(|v| v.step == s.step)
            .map(|v| v.loss.to_string())
            .unwrap_or_default();
        let scale = s.loss_scale.map(|x| x.to_string()).unwrap_or_default();
        csv += &format!(
            "{},{},{val},{},{},{:.3},{:.3},{:.3},{},{scale},{},{:.3},{:.3}\n",
            s.step,
            s.loss,
            s.lr,
            s.grad_norm,
            s.fwd_ms,
            s.bwd_ms,
            s.opt_ms,
            s.tokens,
            u8::from(s.skipped),
            s.comm_ms,
            s.step_ms
        );
    }
    std::fs::write(out.join("log.csv"), csv)
        .map_err(|e| format!("cannot write {}: {e}", out.join("log.csv").display()))?;
    Ok(())
}

/// One forward and backward on the first training batch, written as safetensors: inputs and
/// targets (B, T) i32, logits (B, T, V), loss (1), `grad.<name>` for every parameter.
fn dump_state(trainer: &Trainer, device: &Device, args: &TrainArgs, path: &Path) -> CliResult {
    let cfg = trainer.params().config().clone();
    let weights = trainer.weights()?;
    let params = GptParams::upload(&weights, device, DType::F32)?;
    let batch = trainer.peek_batch();
    let (b, t) = (batch.batch, batch.seq_len);
    let (idx, pos) = model::inputs(&cfg, device, &batch.inputs, b, t)?;
    let targets = IndexTensor::from_slice(device, &batch.targets, &[b, t])?;
    let logits = model::forward(&params, &idx, &pos)?; // (B, T, V)
    let loss = model::loss(&logits, &targets)?; // (1)
    loss.backward()?;
    let grads = params.grads_to_host()?;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>, safetensors::Dtype)> = vec![];
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let i32s = |v: &[u32]| {
        v.iter()
            .flat_map(|&x| (x as i32).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    use safetensors::Dtype as D;
    tensors.push(("inputs".into(), vec![b, t], i32s(&batch.inputs), D::I32));
    tensors.push(("targets".into(), vec![b, t], i32s(&batch.targets), D::I32));
    tensors.push((
        "logits".into(),
        logits.shape().to_vec(),
        f32s(&logits.to_vec()?),
        D::F32,
    ));
    tensors.push(("loss".into(), vec![1], f32s(&loss.to_vec()?), D::F32));
    for (spec, w) in weights.iter() {
        tensors.push((spec.name.clone(), spec.shape.clone(), f32s(&w.data), D::F32));
        let g = &grads[&spec.name];
        tensors.push((
            format!("grad.{}", spec.name),
            g.shape.clone(),
            f32s(&g.data),
            D::F32,
        ));
    }
    let views = tensors
        .iter()
        .map(|(n, shape, bytes, dtype)| {
            Ok((
                n.clone(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    let meta = std::collections::HashMap::from([(
        "config".to_string(),
        helios_nn::config::to_hf_json(&cfg).to_string(),
    )]);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    safetensors::serialize_to_file(views, Some(meta), path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let _ = args;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rank runs the launcher's command line without `--nproc` and its value, in
    /// either spelling; everything else, in order.
    #[test]
    fn ranks_run_the_command_without_nproc() {
        let args = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let line = args(&[
            "train",
            "--nproc",
            "2",
            "--batch",
            "4",
            "--nproc=3",
            "--out",
            "o",
        ]);
        assert_eq!(
            without_nproc(line.into_iter()),
            args(&["train", "--batch", "4", "--out", "o"])
        );
    }
}
