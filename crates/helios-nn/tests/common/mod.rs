//! Shared by the integration tests: a small model configuration and scratch directories.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use helios_nn::GptConfig;

/// A GPT-2 small enough for files of a few kilobytes: 2 layers, 2 heads, 8 channels,
/// 16 positions, 64 tokens.
pub fn small_config() -> GptConfig {
    GptConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 8,
        vocab_size: 64,
        block_size: 16,
        layer_norm_eps: 1e-5,
    }
}

/// A fresh directory under the system's temp dir, deleted when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "helios-nn-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Names in `dir`, sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
