// `helios train` out of device memory (a memory limit set through HELIOS_MEMORY_LIMIT): the
// error names a smaller batch that fits, found by trying, and that batch then trains under
// the same limit.

use std::path::PathBuf;
use std::process::{Command, Output};

fn train(batch: usize, out: &PathBuf) -> Output {
    let batch = batch.to_string();
    Command::new(env!("CARGO_BIN_EXE_helios"))
        .args(["train", "--n-layer", "1", "--n-head", "2", "--n-embd", "32"])
        .args([
            "--block-size",
            "64",
            "--seq",
            "64",
            "--steps",
            "1",
            "--eval-every",
            "0",
        ])
        .args(["--sample-tokens", "0", "--batch", &batch, "--out"])
        .arg(out)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env("HELIOS_MEMORY_LIMIT", "384M")
        .env_remove("HELIOS_DEVICE")
        .output()
        .expect("run helios")
}

#[test]
fn out_of_memory_names_a_batch_that_fits() {
    let dir = std::env::temp_dir().join(format!("helios-oom-{}", std::process::id()));
    let out = train(16, &dir.join("big"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "batch 16 should not fit in 384M");
    assert!(stderr.contains("do not fit"), "{stderr}");
    let fits: usize = stderr
        .split("use --batch ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no batch named: {stderr}"));
    assert!((1..16).contains(&fits), "{stderr}");
    let out = train(fits, &dir.join("small"));
    assert!(
        out.status.success(),
        "batch {fits} was said to fit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
