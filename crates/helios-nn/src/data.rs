//! Token data: a text file tokenized once and cached, or a pre-tokenized `.bin`, memory-mapped.
//!
//! Token files hold u16 ids, little-endian: either bare (nanoGPT's `np.uint16.tofile`) or
//! behind llm.c's 1024-byte header (magic 20240520, version 1, token count). Caches are bare
//! u16 files named by the text's content hash and the tokenizer's id, so an edited text or
//! another tokenizer never reads a stale cache, and a cache is itself a valid `.bin` input.
//! `Tokens` is a cheap-to-clone view (an `Arc` and a range), so the train and validation
//! splits are two views of one mapping.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::hash::fnv1a64;
use crate::tokenizer::Tokenizer;
use crate::{atomic, Error, Result};

/// llm.c's token file header: 256 little-endian i32, of which [0] = magic, [1] = version,
/// [2] = token count.
const LLMC_MAGIC: i32 = 20240520;
const LLMC_HEADER_BYTES: usize = 256 * 4;

/// A run of token ids (u16 storage, u32 to callers).
#[derive(Clone)]
pub struct Tokens {
    buf: Arc<Buf>,
    /// Token range [start, end) of `buf` this view covers.
    start: usize,
    end: usize,
}

struct Buf {
    bytes: Bytes,
    /// Byte offset of token 0 (past a header).
    offset: usize,
    /// Tokens in the whole buffer.
    len: usize,
    /// Where the tokens came from, for messages.
    path: PathBuf,
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

impl Tokens {
    /// Opens `path` for training: a `.bin` token file is memory-mapped; anything else is read
    /// as UTF-8 text, tokenized with `tokenizer` and cached in `cache_dir` (once per content
    /// and tokenizer). Every id is checked against the tokenizer's vocabulary.
    pub fn open(path: &Path, tokenizer: &Tokenizer, cache_dir: &Path) -> Result<Tokens> {
        let tokens = if path.extension().is_some_and(|e| e == "bin") {
            Tokens::open_bin(path)?
        } else {
            Tokens::from_text_file(path, tokenizer, cache_dir)?
        };
        tokens.check_vocab(tokenizer.vocab_size())?;
        Ok(tokens)
    }

    /// Memory-maps a token file (bare u16, or llm.c's header + u16).
    pub fn open_bin(path: &Path) -> Result<Tokens> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let size = file.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
        if size == 0 {
            return Err(Error::EmptyData {
                path: path.to_path_buf(),
            });
        }
        // SAFETY: the mapping is read-only and private to this process; token files are not
        // written while a run reads them (caches are replaced by rename, never in place).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let (offset, len) = token_range(&map, path)?;
        if len == 0 {
            return Err(Error::EmptyData {
                path: path.to_path_buf(),
            });
        }
        Ok(Tokens::whole(Buf {
            bytes: Bytes::Mapped(map),
            offset,
            len,
            path: path.to_path_buf(),
        }))
    }

    /// Tokenizes the UTF-8 text at `path`, or reads its cache from `cache_dir`.
    pub fn from_text_file(path: &Path, tokenizer: &Tokenizer, cache_dir: &Path) -> Result<Tokens> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Tokens::from_text(path, &bytes, tokenizer, cache_dir)
    }

    /// Tokenizes the UTF-8 text `bytes` (a corpus held in memory, such as the one `helios
    /// train` carries), or reads its cache from `cache_dir`; `name` stands for the file in
    /// messages and names the cache, which is the one a file of these bytes and that name
    /// would use.
    pub fn from_text(
        name: &Path,
        bytes: &[u8],
        tokenizer: &Tokenizer,
        cache_dir: &Path,
    ) -> Result<Tokens> {
        let path = name;
        if tokenizer.vocab_size() > u16::MAX as usize + 1 {
            return Err(Error::Data(format!(
                "the tokenizer has {} tokens, but token files hold u16 ids (at most 65,536); use a smaller vocabulary",
                tokenizer.vocab_size()
            )));
        }
        let cache = cache_path(path, bytes, tokenizer, cache_dir);
        if cache.exists() {
            return Tokens::open_bin(&cache);
        }
        let text = std::str::from_utf8(bytes).map_err(|e| {
            Error::Data(format!(
                "{} is not UTF-8 text ({e}); a pre-tokenized file must end in .bin",
                path.display()
            ))
        })?;
        let ids = tokenizer.encode(text)?;
        if ids.is_empty() {
            return Err(Error::EmptyData {
                path: path.to_path_buf(),
            });
        }
        let encoded = encode_u16(&ids, tokenizer.vocab_size(), path)?;
        std::fs::create_dir_all(cache_dir).map_err(|e| Error::io(cache_dir, e))?;
        atomic::write_bytes(&cache, &encoded)?;
        Tokens::open_bin(&cache)
    }

    /// Tokens held in memory (tests, generated data); `name` appears in messages.
    pub fn from_ids(ids: &[u32], name: &str) -> Result<Tokens> {
        let path = PathBuf::from(name);
        if ids.is_empty() {
            return Err(Error::EmptyData { path });
        }
        let bytes = encode_u16(ids, u16::MAX as usize + 1, &path)?;
        Ok(Tokens::whole(Buf {
            len: ids.len(),
            bytes: Bytes::Owned(bytes),
            offset: 0,
            path,
        }))
    }

    fn whole(buf: Buf) -> Tokens {
        let end = buf.len;
        Tokens {
            buf: Arc::new(buf),
            start: 0,
            end,
        }
    }

    /// Tokens in this view.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file the tokens came from (or the name given to `from_ids`).
    pub fn path(&self) -> &Path {
        &self.buf.path
    }

    /// Token `i` of this view. Panics if `i >= len()` (an index bug, not a data error).
    #[track_caller]
    pub fn get(&self, i: usize) -> u32 {
        assert!(i < self.len(), "token {i} of {}", self.len());
        let at = self.buf.offset + 2 * (self.start + i);
        let b = self.buf.bytes.as_slice();
        u16::from_le_bytes([b[at], b[at + 1]]) as u32
    }

    /// Tokens [from, from + out.len()) of this view, into `out`.
    #[track_caller]
    pub fn read_into(&self, from: usize, out: &mut [u32]) {
        assert!(from + out.len() <= self.len(), "tokens out of range");
        let at = self.buf.offset + 2 * (self.start + from);
        let b = &self.buf.bytes.as_slice()[at..at + 2 * out.len()];
        for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
            *o = u16::from_le_bytes([pair[0], pair[1]]) as u32;
        }
    }

    /// All tokens of this view.
    pub fn to_vec(&self) -> Vec<u32> {
        let mut v = vec![0; self.len()];
        self.read_into(0, &mut v);
        v
    }

    /// Fails on the first id not below `vocab_size` (a file made by another tokenizer).
    pub fn check_vocab(&self, vocab_size: usize) -> Result<()> {
        if vocab_size > u16::MAX as usize {
            return Ok(()); // every u16 id is in range
        }
        let at = self.buf.offset + 2 * self.start;
        let bytes = &self.buf.bytes.as_slice()[at..at + 2 * self.len()];
        for (position, pair) in bytes.chunks_exact(2).enumerate() {
            let id = u16::from_le_bytes([pair[0], pair[1]]) as u32;
            if id as usize >= vocab_size {
                return Err(Error::TokenOutOfRange {
                    path: self.buf.path.clone(),
                    position: self.start + position,
                    id,
                    vocab: vocab_size,
                });
            }
        }
        Ok(())
    }

    /// Splits into (train, validation): validation is the last `val_fraction` of the tokens
    /// (at least one token when the fraction is positive), training the rest.
    pub fn split(&self, val_fraction: f64) -> Result<(Tokens, Tokens)> {
        if !(0.0..1.0).contains(&val_fraction) {
            return Err(Error::Data(format!(
                "validation fraction {val_fraction} must be at least 0 and below 1 (e.g. 0.1 for the last 10%)"
            )));
        }
        let n = self.len();
        let mut n_val = (n as f64 * val_fraction).round() as usize;
        if val_fraction > 0.0 {
            n_val = n_val.max(1);
        }
        if n_val >= n {
            return Err(Error::Data(format!(
                "{} holds {n} tokens, too few to split off a validation fraction of {val_fraction}",
                self.buf.path.display()
            )));
        }
        let cut = self.start + n - n_val;
        let train = Tokens {
            buf: self.buf.clone(),
            start: self.start,
            end: cut,
        };
        let val = Tokens {
            buf: self.buf.clone(),
            start: cut,
            end: self.end,
        };
        Ok((train, val))
    }

    /// A 64-bit fingerprint of this view's ids (sampler states record it, so a run never
    /// resumes on other data). Reads every token once.
    pub fn fingerprint(&self) -> u64 {
        let at = self.buf.offset + 2 * self.start;
        fnv1a64(&self.buf.bytes.as_slice()[at..at + 2 * self.len()])
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tokens({}, [{}..{}))",
            self.buf.path.display(),
            self.start,
            self.end
        )
    }
}

/// (byte offset of token 0, token count) of a token file's bytes.
fn token_range(bytes: &[u8], path: &Path) -> Result<(usize, usize)> {
    let word = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    if bytes.len() >= LLMC_HEADER_BYTES && word(0) == LLMC_MAGIC {
        let (version, count) = (word(1), word(2));
        if version != 1 {
            return Err(Error::Data(format!(
                "{}: llm.c token file version {version}; only version 1 (u16 GPT-2 tokens) is supported",
                path.display()
            )));
        }
        let need = LLMC_HEADER_BYTES + 2 * count.max(0) as usize;
        if count < 0 || bytes.len() < need {
            return Err(Error::corrupt(
                path,
                format!(
                    "its header promises {count} tokens ({need} bytes) but the file has {} bytes",
                    bytes.len()
                ),
            ));
        }
        return Ok((LLMC_HEADER_BYTES, count as usize));
    }
    if bytes.len() % 2 != 0 {
        return Err(Error::corrupt(
            path,
            format!("{} bytes is not a whole number of u16 tokens", bytes.len()),
        ));
    }
    Ok((0, bytes.len() / 2))
}

/// `ids` as little-endian u16 bytes; every id must be below `vocab` and fit 16 bits.
fn encode_u16(ids: &[u32], vocab: usize, path: &Path) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(2 * ids.len());
    for (position, &id) in ids.iter().enumerate() {
        if id as usize >= vocab.min(u16::MAX as usize + 1) {
            return Err(Error::TokenOutOfRange {
                path: path.to_path_buf(),
                position,
                id,
                vocab: vocab.min(u16::MAX as usize + 1),
            });
        }
        out.extend_from_slice(&(id as u16).to_le_bytes());
    }
    Ok(out)
}

/// `<cache root>/tokens`, with the cache root Helios' other caches use: `$HELIOS_CACHE_DIR`,
/// else `$XDG_CACHE_HOME/helios` (an absolute path), else `$HOME/.cache/helios`; `None` when
/// none is set (then cache beside the output instead).
pub fn default_cache_dir() -> Option<PathBuf> {
    Some(crate::env::cache_root()?.join("tokens"))
}

/// `cache_dir/STEM.TOKENIZER.HASH.bin` for the text `bytes` read from `path`.
pub fn cache_path(path: &Path, bytes: &[u8], tokenizer: &Tokenizer, cache_dir: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "text".into());
    let hash = fnv1a64(bytes) ^ (bytes.len() as u64).rotate_left(32);
    cache_dir.join(format!("{stem}.{}.{hash:016x}.bin", tokenizer.id()))
}
