//! `Tokenizer`: text to token ids and back, offline.
//!
//! GPT-2's byte-level BPE comes from `tiktoken-rs`, whose `r50k_base` table is compiled into
//! the crate, so nothing is downloaded. A Hugging Face `tokenizer.json` is read through the
//! `tokenizers` crate (built with its pure-Rust regex backend: no C or C++ compiler needed).
//! Both encode with special tokens recognised, so a literal `<|endoftext|>` in a corpus is the
//! document separator GPT-2 was trained with, and both decode lossily: a token sequence cut in
//! the middle of a UTF-8 character decodes to U+FFFD rather than failing.

use std::path::Path;

use crate::config::GPT2_VOCAB_SIZE;
use crate::{Error, Result};

/// A tokenizer: GPT-2's BPE or a user's `tokenizer.json`.
pub struct Tokenizer {
    kind: Kind,
    /// Names the exact vocabulary, for cache keys: `r50k_base`, or `hf-<hash of the file>`.
    id: String,
    vocab_size: usize,
}

enum Kind {
    Gpt2(Box<tiktoken_rs::CoreBPE>),
    HuggingFace(Box<tokenizers::Tokenizer>),
}

impl Tokenizer {
    /// GPT-2's BPE (`r50k_base`, 50,257 tokens, `<|endoftext|>` = 50256).
    pub fn gpt2() -> Result<Tokenizer> {
        let bpe = tiktoken_rs::r50k_base()
            .map_err(|e| Error::Tokenizer(format!("building GPT-2's BPE tables: {e}")))?;
        Ok(Tokenizer {
            kind: Kind::Gpt2(Box::new(bpe)),
            id: "r50k_base".into(),
            vocab_size: GPT2_VOCAB_SIZE,
        })
    }

    /// A Hugging Face `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let tok = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            Error::Tokenizer(format!(
                "{} is not a tokenizer.json the tokenizers crate can read: {e}",
                path.display()
            ))
        })?;
        let vocab_size = tok.get_vocab_size(true);
        Ok(Tokenizer {
            kind: Kind::HuggingFace(Box::new(tok)),
            id: format!("hf-{:016x}", crate::hash::fnv1a64(&bytes)),
            vocab_size,
        })
    }

    /// GPT-2's BPE when `path` is `None`, else the `tokenizer.json` at `path`.
    pub fn from_option(path: Option<&Path>) -> Result<Tokenizer> {
        match path {
            Some(p) => Tokenizer::from_file(p),
            None => Tokenizer::gpt2(),
        }
    }

    /// Token ids of `text` (special tokens such as `<|endoftext|>` are recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.kind {
            Kind::Gpt2(bpe) => Ok(bpe.encode_with_special_tokens(text)),
            Kind::HuggingFace(tok) => tok
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| Error::Tokenizer(format!("encoding: {e}"))),
        }
    }

    /// The text of `ids`; an id outside the vocabulary is an error, a cut UTF-8 character
    /// becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(Error::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                self.vocab_size
            )));
        }
        match &self.kind {
            Kind::Gpt2(bpe) => {
                let bytes = bpe.decode_bytes(ids).map_err(|e| {
                    Error::Tokenizer(format!("decoding: unknown token {}", e.token))
                })?;
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Kind::HuggingFace(tok) => tok
                .decode(ids, false)
                .map_err(|e| Error::Tokenizer(format!("decoding: {e}"))),
        }
    }

    /// Tokens in the vocabulary, special tokens included (GPT-2: 50,257).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The end-of-text token's id, if the vocabulary has one.
    pub fn eot(&self) -> Option<u32> {
        match &self.kind {
            Kind::Gpt2(_) => Some(crate::config::GPT2_EOT),
            Kind::HuggingFace(tok) => tok
                .token_to_id("<|endoftext|>")
                .or_else(|| tok.token_to_id("</s>")),
        }
    }

    /// A name for the exact vocabulary (`r50k_base`, `hf-<hash>`); token caches are keyed on it.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("id", &self.id)
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}
