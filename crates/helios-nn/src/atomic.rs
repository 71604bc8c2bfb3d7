//! Crash-safe file and directory replacement.
//!
//! A file is written to a temporary name in its own directory, flushed to disk (`fsync`), and
//! renamed over the target, and then the directory itself is flushed so the rename survives a
//! power cut. At every instant the target is either the complete old file or the complete new
//! one; a failure or crash mid-write leaves only a stray temporary file, which carries the
//! `.tmp-` marker and is never read. Directories (checkpoints of several files) are replaced
//! the same way, one level up: see `replace_dir`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// A name beside `path` that no other writer uses: `.NAME.tmp-PID-N`.
pub(crate) fn temp_sibling(path: &Path, kind: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    path.with_file_name(format!(".{name}.{kind}-{}-{n}-{nanos}", std::process::id()))
}

/// The directory holding `path` ("." for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Flushes a directory's entries (new names, renames) to disk. A no-op where directories
/// cannot be opened as files (Windows).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let d = File::open(dir).map_err(|e| Error::io(dir, e))?;
        d.sync_all().map_err(|e| Error::io(dir, e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Writes `path` through `write`, atomically: the old file stays whole until the new one is
/// complete and on disk.
pub(crate) fn write_file(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<()> {
    let tmp = temp_sibling(path, "tmp");
    let result = (|| -> Result<()> {
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut w = BufWriter::new(file);
        write(&mut w).map_err(|e| Error::io(path, e))?;
        w.flush().map_err(|e| Error::io(path, e))?;
        let file = w
            .into_inner()
            .map_err(|e| Error::io(path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(path, e))?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        sync_dir(parent_dir(path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes `bytes` to `path` atomically.
pub(crate) fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_file(path, |w| w.write_all(bytes))
}

/// Replaces directory `dir` by the complete directory `staged` (a sibling of it, already
/// flushed), keeping the old one until the new one has its name.
///
/// POSIX cannot rename a directory over a non-empty one, so this takes two renames: `dir` to
/// a `.old-` sibling, then `staged` to `dir`. A crash between them leaves `dir` missing and
/// the old checkpoint whole under its `.old-` name; `recover_dir` puts it back.
pub(crate) fn replace_dir(staged: &Path, dir: &Path) -> Result<()> {
    let parent = parent_dir(dir);
    let old = if dir.exists() {
        let old = temp_sibling(dir, "old");
        std::fs::rename(dir, &old).map_err(|e| Error::io(dir, e))?;
        fail_point::in_swap();
        Some(old)
    } else {
        None
    };
    if let Err(e) = std::fs::rename(staged, dir) {
        // Put the old checkpoint back before reporting.
        if let Some(old) = &old {
            let _ = std::fs::rename(old, dir);
        }
        return Err(Error::io(dir, e));
    }
    sync_dir(parent)?;
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(old);
    }
    Ok(())
}

/// Siblings of `dir` left by an interrupted `replace_dir` or staging: (`.old-`, `.stage-`).
fn leftovers(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut old, mut staged) = (Vec::new(), Vec::new());
    let Some(name) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return (old, staged);
    };
    let Ok(entries) = std::fs::read_dir(parent_dir(dir)) else {
        return (old, staged);
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if let Some(rest) = file_name.strip_prefix(&format!(".{name}.")) {
            if rest.starts_with("old-") {
                old.push(entry.path());
            } else if rest.starts_with("stage-") {
                staged.push(entry.path());
            }
        }
    }
    old.sort();
    staged.sort();
    (old, staged)
}

/// Undoes what a crash in `replace_dir` or while staging left behind: a missing `dir` whose
/// old version waits under a `.old-` name is renamed back. With `clean` (a writer, which owns
/// the siblings), stale `.old-` and `.stage-` siblings are deleted too; a reader leaves them,
/// since another process may be staging a save. Returns whether `dir` was restored.
pub(crate) fn recover_dir(dir: &Path, clean: bool) -> Result<bool> {
    let (old, staged) = leftovers(dir);
    let mut restored = false;
    if !dir.exists() {
        if let Some(newest) = old.last() {
            std::fs::rename(newest, dir).map_err(|e| Error::io(dir, e))?;
            sync_dir(parent_dir(dir))?;
            restored = true;
        }
    }
    if !clean {
        return Ok(restored);
    }
    for p in old.iter().chain(&staged) {
        if p.exists() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
    Ok(restored)
}

/// Test-only hooks that make a save fail or crash at a chosen point.
pub(crate) mod fail_point {
    #[cfg(test)]
    use std::cell::Cell;

    #[cfg(test)]
    thread_local! {
        /// Panic (a simulated crash) when this many more tensors have been encoded.
        pub static PANIC_AFTER_TENSORS: Cell<Option<usize>> = const { Cell::new(None) };
        /// Return an I/O error instead of writing this file.
        pub static FAIL_BEFORE: Cell<Option<&'static str>> = const { Cell::new(None) };
        /// Panic between the two renames of `replace_dir`.
        pub static CRASH_IN_SWAP: Cell<bool> = const { Cell::new(false) };
    }

    #[cfg(test)]
    pub fn tensor_written() {
        PANIC_AFTER_TENSORS.with(|c| match c.get() {
            Some(0) => {
                c.set(None);
                panic!("fail point: crash while writing tensors");
            }
            Some(n) => c.set(Some(n - 1)),
            None => {}
        });
    }

    #[allow(unused_variables)]
    pub fn before(file: &'static str) -> crate::Result<()> {
        #[cfg(test)]
        if FAIL_BEFORE.with(|c| c.get()) == Some(file) {
            FAIL_BEFORE.with(|c| c.set(None));
            return Err(crate::Error::io(
                std::path::Path::new(file),
                std::io::Error::other("fail point: disk full"),
            ));
        }
        Ok(())
    }

    pub fn in_swap() {
        #[cfg(test)]
        if CRASH_IN_SWAP.with(|c| c.replace(false)) {
            panic!("fail point: crash between the renames");
        }
    }
}
