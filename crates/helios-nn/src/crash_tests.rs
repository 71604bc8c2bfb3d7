//! Saves that fail or crash part-way (through the test-only fail points in
//! `atomic::fail_point`) must leave the previous checkpoint loadable and unchanged.

use std::path::{Path, PathBuf};

use crate::atomic::fail_point::{CRASH_IN_SWAP, FAIL_BEFORE, PANIC_AFTER_TENSORS};
use crate::checkpoint::{OPTIMIZER_FILE, TRAINER_FORMAT};
use crate::{
    load_checkpoint, save_checkpoint, save_weights, AdamWHyper, BatchSampler, GptConfig,
    LrSchedule, OptimizerState, ParamStore, Tokens, TrainerState,
};

fn config() -> GptConfig {
    GptConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 8,
        vocab_size: 64,
        block_size: 16,
        layer_norm_eps: 1e-5,
    }
}

fn state(seed: u64) -> (ParamStore, OptimizerState, TrainerState) {
    let cfg = config();
    let params = ParamStore::init_gpt2(&cfg, seed).unwrap();
    let data = Tokens::from_ids(&(0..100).collect::<Vec<_>>(), "mem").unwrap();
    let trainer = TrainerState {
        format: TRAINER_FORMAT,
        step: 0,
        seed,
        sampler: BatchSampler::new(data, 2, 4, seed).unwrap().state(),
        schedule: LrSchedule::constant(1e-3),
        adamw: AdamWHyper::default(),
        model: cfg.clone(),
        extra: serde_json::Value::Null,
    };
    (params, OptimizerState::zeros(&cfg), trainer)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("helios-nn-crash-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs `f`, which must panic (a simulated crash), without printing the panic.
fn crash(f: impl FnOnce()) {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    assert!(caught.is_err(), "the fail point did not fire");
}

#[test]
fn crash_while_writing_tensors_keeps_the_old_checkpoint() {
    let root = scratch("tensors");
    let ckpt = root.join("ckpt");
    let (p1, o1, t1) = state(1);
    save_checkpoint(&ckpt, &p1, &o1, &t1).unwrap();

    // Crash in the middle of model.safetensors, then in the middle of the optimizer file.
    let (p2, o2, t2) = state(2);
    for after in [5, 40] {
        PANIC_AFTER_TENSORS.with(|c| c.set(Some(after)));
        crash(|| {
            let _ = save_checkpoint(&ckpt, &p2, &o2, &t2);
        });
        let back = load_checkpoint(&ckpt).unwrap();
        assert_eq!(back.params, p1);
        assert_eq!(back.trainer.unwrap(), t1);
    }
    // The crashed saves' staging directories stay until the next save clears them.
    assert!(names(&root).iter().any(|n| n.starts_with(".ckpt.stage-")));
    save_checkpoint(&ckpt, &p2, &o2, &t2).unwrap();
    assert_eq!(names(&root), ["ckpt"]);
    assert_eq!(load_checkpoint(&ckpt).unwrap().params, p2);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn an_io_error_mid_save_keeps_the_old_checkpoint() {
    let root = scratch("io");
    let ckpt = root.join("ckpt");
    let (p1, o1, t1) = state(3);
    save_checkpoint(&ckpt, &p1, &o1, &t1).unwrap();
    let (p2, o2, t2) = state(4);
    FAIL_BEFORE.with(|c| c.set(Some(OPTIMIZER_FILE)));
    let e = save_checkpoint(&ckpt, &p2, &o2, &t2).unwrap_err();
    assert!(e.to_string().contains("disk full"), "{e}");
    assert_eq!(load_checkpoint(&ckpt).unwrap().params, p1);
    // An error (unlike a crash) removes its own staging directory at once.
    assert_eq!(names(&root), ["ckpt"]);
    // And the next save goes through.
    save_checkpoint(&ckpt, &p2, &o2, &t2).unwrap();
    assert_eq!(load_checkpoint(&ckpt).unwrap().params, p2);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_crash_between_the_renames_is_recovered() {
    let root = scratch("swap");
    let ckpt = root.join("ckpt");
    let (p1, o1, t1) = state(5);
    save_checkpoint(&ckpt, &p1, &o1, &t1).unwrap();
    let (p2, o2, t2) = state(6);
    CRASH_IN_SWAP.with(|c| c.set(true));
    crash(|| {
        let _ = save_checkpoint(&ckpt, &p2, &o2, &t2);
    });
    // The old checkpoint waits under its .old- name; the new one under .stage-.
    assert!(!ckpt.exists());
    let left = names(&root);
    assert!(left.iter().any(|n| n.starts_with(".ckpt.old-")), "{left:?}");
    assert!(
        left.iter().any(|n| n.starts_with(".ckpt.stage-")),
        "{left:?}"
    );
    // Loading puts the old one back (and leaves the staged one to the next save).
    assert_eq!(load_checkpoint(&ckpt).unwrap().params, p1);
    assert!(!names(&root).iter().any(|n| n.starts_with(".ckpt.old-")));

    // The same crash, then a save (not a load) is the next thing to touch the directory.
    CRASH_IN_SWAP.with(|c| c.set(true));
    crash(|| {
        let _ = save_checkpoint(&ckpt, &p2, &o2, &t2);
    });
    save_checkpoint(&ckpt, &p2, &o2, &t2).unwrap();
    assert_eq!(load_checkpoint(&ckpt).unwrap().params, p2);
    assert_eq!(names(&root), ["ckpt"]);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_crashed_weights_save_keeps_the_old_file() {
    let root = scratch("file");
    let file = root.join("model.safetensors");
    let (p1, ..) = state(7);
    save_weights(&file, &p1, helios::DType::BF16).unwrap();
    let before = std::fs::read(&file).unwrap();
    let (p2, ..) = state(8);
    PANIC_AFTER_TENSORS.with(|c| c.set(Some(3)));
    crash(|| {
        let _ = save_weights(&file, &p2, helios::DType::BF16);
    });
    assert_eq!(std::fs::read(&file).unwrap(), before);
    std::fs::remove_dir_all(&root).unwrap();
}
