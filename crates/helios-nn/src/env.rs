//! Every `HELIOS_*` switch helios-nn reads, read here and nowhere else (documented in
//! `docs/ENVIRONMENT.md`).

use std::path::PathBuf;

/// `HELIOS_CACHE_DIR=<dir>`: the root of Helios' on-disk caches; `None` when unset or empty.
pub(crate) fn cache_root() -> Option<PathBuf> {
    std::env::var_os("HELIOS_CACHE_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}
