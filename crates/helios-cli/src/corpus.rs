// The corpus `helios train` trains on without `--data`: the repository's
// data/shakespeare/shakespeare.txt (32 works of Shakespeare, 3.6 MB of public-domain text;
// data/shakespeare/README.md says where it comes from), carried in the binary so that the
// default works from any directory and after `cargo install`. build.rs deflates it into
// OUT_DIR (1.4 MB); it is inflated once per run, in about the time a file read takes.

use std::io::Read;
use std::path::{Path, PathBuf};

use helios_nn::{Tokenizer, Tokens};

/// Where the bundled corpus comes from, in the repository.
pub const SOURCE: &str = "data/shakespeare/shakespeare.txt";

/// The corpus as raw DEFLATE; empty when the binary was built from a tree without it.
static PACKED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/corpus.deflate"));

/// The bundled corpus' text.
pub fn text() -> Result<Vec<u8>, String> {
    if PACKED.is_empty() {
        return Err(format!(
            "this helios was built from a tree without {SOURCE}, so it carries no default \
             corpus; give a text or token file with --data"
        ));
    }
    let mut text = Vec::with_capacity(4 << 20);
    flate2::read::DeflateDecoder::new(PACKED)
        .read_to_end(&mut text)
        .map_err(|e| format!("the bundled corpus does not inflate: {e}"))?;
    Ok(text)
}

/// What `--data` names: a file, or (without the flag) the bundled corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corpus {
    File(PathBuf),
    Bundled,
}

impl Corpus {
    /// `--data`'s corpus; the bundled one when the flag is absent, wherever the command runs.
    pub fn from_flag(data: Option<&Path>) -> Corpus {
        match data {
            Some(path) => Corpus::File(path.to_path_buf()),
            None => Corpus::Bundled,
        }
    }

    /// How messages name it.
    pub fn describe(&self) -> String {
        match self {
            Corpus::File(path) => path.display().to_string(),
            Corpus::Bundled => format!("the bundled corpus, {SOURCE} built into helios"),
        }
    }

    /// Its tokens: a file through `Tokens::open`, the bundled text tokenized (or read from
    /// the cache a file of the same bytes would use) in `cache_dir`.
    pub fn open(
        &self,
        tokenizer: &Tokenizer,
        cache_dir: &Path,
    ) -> Result<Tokens, Box<dyn std::error::Error>> {
        Ok(match self {
            Corpus::File(path) => Tokens::open(path, tokenizer, cache_dir)?,
            Corpus::Bundled => {
                let name = Path::new(SOURCE);
                Tokens::from_text(name, &text()?, tokenizer, cache_dir)?
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary carries the repository's corpus byte for byte.
    #[test]
    fn the_bundled_corpus_is_the_repositorys() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(SOURCE);
        let want = std::fs::read(&file).expect("the repository's corpus");
        let got = text().unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the bundled corpus differs from {SOURCE}");
        assert!(
            PACKED.len() < want.len() / 2,
            "carried compressed: {} bytes",
            PACKED.len()
        );
    }

    /// Without `--data` the corpus is the bundled one whatever the current directory: no
    /// path is resolved against it (it was `data/shakespeare/shakespeare.txt`, relative, and
    /// `helios train` failed anywhere but the repository's root: issue 49).
    #[test]
    fn the_default_corpus_does_not_depend_on_the_current_directory() {
        assert_eq!(Corpus::from_flag(None), Corpus::Bundled);
        assert_eq!(
            Corpus::from_flag(Some(Path::new("x.txt"))),
            Corpus::File("x.txt".into())
        );
        assert!(Corpus::Bundled.describe().contains(SOURCE));
    }
}
