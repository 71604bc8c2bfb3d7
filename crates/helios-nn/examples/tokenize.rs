//! Tokenizes a text file once (GPT-2's BPE, or a tokenizer.json) and caches the tokens as a
//! u16 `.bin` file; prints the token count, the split, and the time it took.
//!
//! ```sh
//! cargo run --release -p helios-nn --example tokenize -- data/shakespeare/shakespeare.txt [CACHE_DIR] [tokenizer.json]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use helios_nn::{Tokenizer, Tokens};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let Some(text) = args.first() else {
        eprintln!("usage: tokenize TEXT_OR_BIN [CACHE_DIR] [tokenizer.json]");
        std::process::exit(2);
    };
    let cache = args
        .get(1)
        .cloned()
        .or_else(helios_nn::data::default_cache_dir)
        .unwrap_or_else(|| std::env::temp_dir().join("helios-tokens"));
    let tokenizer = Tokenizer::from_option(args.get(2).map(PathBuf::as_path))?;
    let start = Instant::now();
    let tokens = Tokens::open(text, &tokenizer, &cache)?;
    let took = start.elapsed();
    let (train, val) = tokens.split(0.1)?;
    println!(
        "{}: {} tokens ({} train, {} validation) in {:.2} s; cached at {}",
        text.display(),
        tokens.len(),
        train.len(),
        val.len(),
        took.as_secs_f64(),
        tokens.path().display()
    );
    Ok(())
}
