// `helios generate`: text from a trained checkpoint or Hugging Face GPT-2 weights, streamed
// token by token as it is sampled (temperature, top-k, top-p, a seed).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use helios::{DType, Device};
use helios_nn::generate::{generate, generate_recompute, Sampling};
use helios_nn::model::GptParams;
use helios_nn::{load_pretrained, Tokenizer};

use crate::CliResult;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A checkpoint directory (helios train's OUT/checkpoint), a save_pretrained directory,
    /// or a GPT-2 safetensors file with config.json beside it.
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, default_value = "ROMEO:")]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 100)]
    pub tokens: usize,
    /// 0 picks the most likely token every time.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Sample among the k most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Sample among the most likely tokens that make up this probability.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// A Hugging Face tokenizer.json instead of GPT-2's BPE.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Recompute the whole window for every token instead of using the key/value cache.
    #[arg(long)]
    pub no_kv_cache: bool,
}

pub fn run(args: &GenerateArgs) -> CliResult {
    let s = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    s.validate()?;
    let tokenizer = Tokenizer::from_option(args.tokenizer.as_deref())?;
    let store = load_pretrained(&args.model, None)?;
    if tokenizer.vocab_size() > store.config().vocab_size {
        return Err(helios_nn::Error::VocabMismatch {
            what: format!("the tokenizer ({})", tokenizer.id()),
            expected: store.config().vocab_size,
            got: tokenizer.vocab_size(),
        }
        .into());
    }
    let prompt = tokenizer.encode(&args.prompt)?;
    let device = Device::from_env()?;
    eprintln!("device: {}", device.name());
    let params = GptParams::upload(&store, &device, DType::F32)?;
    print!("{}", args.prompt);
    let t0 = std::time::Instant::now();
    stream(
        &params,
        &device,
        &tokenizer,
        &prompt,
        args.tokens,
        &s,
        !args.no_kv_cache,
    )?;
    println!();
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{} tokens in {secs:.2} s ({:.1} ms/token{})",
        args.tokens,
        secs * 1e3 / args.tokens.max(1) as f64,
        if args.no_kv_cache {
            ", no KV cache"
        } else {
            ""
        }
    );
    if std::env::var_os("HELIOS_PROFILE").is_some() {
        if let Some(report) = device.profile_report()? {
            eprintln!("{report}");
        }
    }
    Ok(())
}

/// Samples `n` tokens after `prompt`, printing the text as it grows.
pub fn stream(
    params: &GptParams,
    device: &Device,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    n: usize,
    s: &Sampling,
    kv_cache: bool,
) -> CliResult {
    // Decode the whole continuation each time and print what is new, so that characters
    // split across tokens come out whole.
    let mut new: Vec<u32> = Vec::with_capacity(n);
    let mut printed = 0;
    let mut out = std::io::stdout();
    let on_token = |t| {
        new.push(t);
        if let Ok(text) = tokenizer.decode(&new) {
            if text.len() > printed && text.is_char_boundary(printed) && !text.ends_with('\u{fffd}')
            {
                let _ = write!(out, "{}", &text[printed..]);
                let _ = out.flush();
                printed = text.len();
            }
        }
    };
    match kv_cache {
        true => generate(params, device, prompt, n, s, on_token)?,
        false => generate_recompute(params, device, prompt, n, s, on_token)?,
    };
    Ok(())
}
