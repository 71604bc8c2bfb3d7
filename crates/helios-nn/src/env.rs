//! Every `HELIOS_*` switch helios-nn reads, read here and nowhere else (documented in
//! `docs/ENVIRONMENT.md`).

use std::path::PathBuf;

use helios_vk::{PipelineCacheDir, HELIOS_CACHE_DIR};

/// The root of Helios' on-disk caches, read as the pipeline cache and the tuners read it:
/// `HELIOS_CACHE_DIR=<dir>`, else the user's cache directory (`PipelineCacheDir::User`);
/// `None` when neither is known.
pub(crate) fn cache_root() -> Option<PathBuf> {
    helios_vk::env::string(HELIOS_CACHE_DIR)
        .map(PathBuf::from)
        .or_else(|| PipelineCacheDir::User.root())
}
