// Embeds the git commit the binary is built from as HELIOS_GIT_COMMIT, for `helios bench`'s
// JSON: the short hash, with "-dirty" when tracked files differ from it; and compresses the
// bundled corpus (data/shakespeare/shakespeare.txt, 3.6 MB) into OUT_DIR for `helios train`
// to carry (`src/corpus.rs`), 1.4 MB as raw DEFLATE.
//
// Key decision: never fail the build over it. Without git or a .git directory (the GPU
// machine gets a copy of the tree) the value is "unknown"; HELIOS_BUILD_COMMIT, when set,
// overrides everything so that such a build can still be labelled.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let root = Path::new(&manifest).join("../..");
    println!("cargo:rerun-if-env-changed=HELIOS_BUILD_COMMIT");
    // Rerun when the commit or the index moves, or any source in the workspace changes (the
    // dirty flag depends on them); a directory is scanned recursively by cargo.
    for p in [
        ".git/HEAD",
        ".git/index",
        ".git/refs",
        "crates",
        "Cargo.toml",
    ] {
        let path = root.join(p);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let commit = std::env::var("HELIOS_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| describe(&root).unwrap_or_else(|| "unknown".to_owned()));
    println!("cargo:rustc-env=HELIOS_GIT_COMMIT={}", commit.trim());
    compress_corpus(&root);
}

/// `OUT_DIR/corpus.deflate`: the bundled corpus as raw DEFLATE, or an empty file when the
/// tree has no corpus (then `helios train` asks for `--data`). Compressed again only when
/// the corpus is newer than the last output, since this script reruns on every source edit.
fn compress_corpus(root: &Path) {
    let corpus = root.join("data/shakespeare/shakespeare.txt");
    println!("cargo:rerun-if-changed={}", corpus.display());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("corpus.deflate");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(input), Some(output)) = (modified(&corpus), modified(&out)) {
        if output >= input {
            return;
        }
    }
    let packed = match std::fs::read(&corpus) {
        Ok(text) => {
            use std::io::Write;
            let mut z = flate2::write::DeflateEncoder::new(
                Vec::with_capacity(text.len() / 2),
                flate2::Compression::best(),
            );
            z.write_all(&text).expect("compressing in memory");
            z.finish().expect("compressing in memory")
        }
        Err(e) => {
            println!(
                "cargo:warning=no bundled corpus ({}: {e}); `helios train` will need --data",
                corpus.display()
            );
            Vec::new()
        }
    };
    let staged = out.with_extension("tmp");
    std::fs::write(&staged, packed).expect("writing OUT_DIR");
    std::fs::rename(&staged, &out).expect("writing OUT_DIR");
}

/// `<short hash>` or `<short hash>-dirty`, or `None` when git cannot tell.
fn describe(root: &Path) -> Option<String> {
    if !root.join(".git").exists() {
        return None;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let hash = git(&["rev-parse", "--short", "HEAD"]).filter(|h| !h.is_empty())?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{hash}-dirty") } else { hash })
}
