// Data-parallel training on the default device (lavapipe in CI) over MPI (issue 47): two
// ranks with half the batch each train the model one process trains with the whole batch,
// whether `helios train --nproc 2` or `mpiexec -n 2` starts them, and so do two ranks that
// shard the optimizer state (`--zero`, ZeRO-1); a run resumes with another number of ranks,
// and with or without `--zero` whichever wrote the checkpoint; ranks that disagree, or one
// that dies, stop the run with a clear error.
// Built only with the `mpi` feature, as scripts/test.sh builds the tests.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use helios_nn::checkpoint::load_checkpoint;

/// A fresh, empty directory under the system's temp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("helios-dp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A two-layer model, 6 steps of `batch` rows of 32 tokens, validation every 3 steps.
fn train_args(out: &Path, batch: usize, steps: u64) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--n-layer",
        "2",
        "--n-head",
        "2",
        "--n-embd",
        "32",
        "--block-size",
        "32",
        "--seq",
        "32",
        "--eval-every",
        "3",
        "--eval-batches",
        "2",
        "--sample-tokens",
        "0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--batch".into(), batch.to_string()]);
    args.extend(["--steps".into(), steps.to_string()]);
    args.extend(["--out".into(), out.display().to_string()]);
    args
}

/// One test at a time: each starts two or three processes, and CI may have two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn helios() -> Command {
    Command::new(env!("CARGO_BIN_EXE_helios"))
}

fn mpiexec() -> Command {
    Command::new("mpiexec")
}

fn check(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// (step, loss, validation loss or NaN, gradient norm) per line of a run's log.csv.
fn losses(out: &Path) -> Vec<(u64, f64, f64, f64)> {
    let csv = std::fs::read_to_string(out.join("log.csv")).unwrap();
    csv.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let num = |s: &str| s.parse::<f64>().unwrap_or(f64::NAN);
            (f[0].parse().unwrap(), num(f[1]), num(f[2]), num(f[4]))
        })
        .collect()
}

/// Relative difference, NaN equal to NaN (steps without validation).
fn rel(a: f64, b: f64) -> f64 {
    if a.is_nan() && b.is_nan() {
        return 0.0;
    }
    (a - b).abs() / a.abs().max(1e-12)
}

/// The two runs logged the same steps, with losses and norms within `tol` (relative).
fn same_losses(a: &Path, b: &Path, tol: f64) {
    let (la, lb) = (losses(a), losses(b));
    assert_eq!(la.len(), lb.len(), "{la:?}\n{lb:?}");
    for (x, y) in la.iter().zip(&lb) {
        assert_eq!(x.0, y.0);
        for (u, v) in [(x.1, y.1), (x.2, y.2), (x.3, y.3)] {
            assert!(
                rel(u, v) <= tol,
                "step {}: {u} against {v}\n{la:?}\n{lb:?}",
                x.0
            );
        }
    }
}

/// The largest difference between the two checkpoints' weights, over their largest value.
fn weight_difference(a: &Path, b: &Path) -> f64 {
    let (ca, cb) = (
        load_checkpoint(&a.join("checkpoint")).unwrap(),
        load_checkpoint(&b.join("checkpoint")).unwrap(),
    );
    let (mut diff, mut scale) = (0.0f64, 0.0f64);
    for ((sa, ta), (sb, tb)) in ca.params.iter().zip(cb.params.iter()) {
        assert_eq!(sa.name, sb.name);
        for (x, y) in ta.data.iter().zip(&tb.data) {
            diff = diff.max((x - y).abs() as f64);
            scale = scale.max(x.abs() as f64);
        }
    }
    diff / scale
}

/// Every rank's sum of squares and mean differs from one process's only in the order of
/// f32 additions: losses agree to about 1e-7 relative; after six AdamW steps the weights
/// agree to about 1e-6 of their largest value. The tolerances leave a factor of ten.
const LOSS_TOL: f64 = 1e-6;
const WEIGHT_TOL: f64 = 1e-5;

#[test]
fn two_ranks_with_half_the_batch_train_the_model_one_rank_trains() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("same");
    let (one, two, mpi) = (root.join("one"), root.join("two"), root.join("mpi"));
    check(
        &helios().args(train_args(&one, 4, 6)).output().unwrap(),
        "one rank",
    );
    let out = helios()
        .args(train_args(&two, 2, 6))
        .args(["--nproc", "2"])
        .output()
        .unwrap();
    let stdout = check(&out, "--nproc 2");
    assert!(stdout.contains("2 ranks over mpi"), "{stdout}");
    let out = mpiexec()
        .args(["-n", "2", env!("CARGO_BIN_EXE_helios")])
        .args(train_args(&mpi, 2, 6))
        .output()
        .unwrap();
    check(&out, "mpiexec -n 2");
    same_losses(&one, &two, LOSS_TOL);
    // The same ranks over the same MPI: the same bits.
    same_losses(&two, &mpi, 0.0);
    let d = weight_difference(&one, &two);
    eprintln!("weights: largest difference {d:.2e} of the largest weight");
    assert!(d <= WEIGHT_TOL, "{d}");
    // Tokens per step count every rank's.
    let log = std::fs::read_to_string(two.join("log.json")).unwrap();
    assert!(log.contains("\"tokens\": 128"), "{log}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_run_of_two_ranks_resumes_with_one() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("resume");
    let (whole, part) = (root.join("whole"), root.join("part"));
    // A constant learning rate: a run of 3 steps is the first half of a run of 6.
    let constant = ["--lr", "1e-3", "--min-lr", "1e-3", "--warmup", "0"];
    let two = |out: &Path, steps: u64| {
        let out = helios()
            .args(train_args(out, 2, steps))
            .args(constant)
            .args(["--nproc", "2"])
            .output()
            .unwrap();
        check(&out, "--nproc 2");
    };
    two(&whole, 6);
    two(&part, 3);
    // The checkpoint holds the whole run's batch (4 rows): one rank of 4 continues it.
    let resume = resume_args(&part, 4, 6);
    let out = helios().args(&resume).args(constant).output().unwrap();
    check(&out, "resume");
    same_losses(&whole, &part, LOSS_TOL);
    std::fs::remove_dir_all(&root).unwrap();
}

/// `--out` of a resumed run: `train_args` without the model's shape (the checkpoint has it)
/// and with `--resume DIR/checkpoint`.
fn resume_args(dir: &Path, batch: usize, steps: u64) -> Vec<String> {
    let model_flags = 8; // --n-layer .. --block-size
    let mut args = train_args(dir, batch, steps);
    args.drain(1..1 + model_flags);
    args.extend([
        "--resume".into(),
        dir.join("checkpoint").display().to_string(),
    ]);
    args
}

/// Copies the files of `from` into a new directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// ZeRO-1 sums the squared gradient norm in another order than one process (each rank sums
/// its shard, then the ranks' sums are added), which moves the clipped update by an f32
/// rounding: losses and norms agreed to 2e-7 relative and weights to 1.1e-6 here, within
/// the tolerances above by a factor of five.
#[test]
fn two_ranks_with_sharded_optimizer_state_train_the_model_one_rank_trains() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("zero");
    let (one, zero, part) = (root.join("one"), root.join("zero"), root.join("part"));
    // A constant learning rate: a run of 3 steps is the first half of a run of 6.
    let constant = ["--lr", "1e-3", "--min-lr", "1e-3", "--warmup", "0"];
    let out = helios()
        .args(train_args(&one, 4, 6))
        .args(constant)
        .output()
        .unwrap();
    check(&out, "one rank");
    let two = |out: &Path, steps: u64| {
        let out = helios()
            .args(train_args(out, 2, steps))
            .args(constant)
            .args(["--nproc", "2", "--zero"])
            .output()
            .unwrap();
        check(&out, "--nproc 2 --zero")
    };
    let stdout = two(&zero, 6);
    assert!(
        stdout.contains("2 ranks over mpi") && stdout.contains("sharded (ZeRO-1)"),
        "{stdout}"
    );
    same_losses(&one, &zero, LOSS_TOL);
    let d = weight_difference(&one, &zero);
    eprintln!("weights: largest difference {d:.2e} of the largest weight");
    assert!(d <= WEIGHT_TOL, "{d}");
    // Half of it, then the rest in one process with the whole batch, `--zero` accepted there.
    two(&part, 3);
    let out = helios()
        .args(resume_args(&part, 4, 6))
        .args(constant)
        .arg("--zero")
        .output()
        .unwrap();
    check(&out, "resume in one process");
    same_losses(&one, &part, LOSS_TOL);
    std::fs::remove_dir_all(&root).unwrap();
}

/// Checkpoints keep one format: a sharded run's resumes sharded bit for bit, and resumes
/// unsharded (and an unsharded run's resumes sharded) to the same weights. In bf16, so that
/// the f32 master weights, which ZeRO-1 shards too, travel to and from the checkpoint.
/// Without clipping: the norm, summed in another order sharded and unsharded, then does not
/// steer the update. (With it, a last-bit difference in one step's clipping can round a
/// bf16 copy to its other neighbour, and Adam's steps on near-zero gradients spread that:
/// 8e-5 of the largest weight after six steps in one seed's run.) One row per rank: what is
/// tested here does not depend on the batch.
#[test]
fn checkpoints_move_between_sharded_and_whole_optimizer_state() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("zero-resume");
    // A constant learning rate: a run of 3 steps is the first half of a run of 6.
    let flags = [
        "--lr",
        "1e-3",
        "--min-lr",
        "1e-3",
        "--warmup",
        "0",
        "--precision",
        "bf16",
        "--grad-clip",
        "0",
        "--nproc",
        "2",
    ];
    let run = |args: Vec<String>, zero: bool| {
        let mut cmd = helios();
        cmd.args(args).args(flags);
        if zero {
            cmd.arg("--zero");
        }
        check(
            &cmd.output().unwrap(),
            &format!("--nproc 2 (--zero: {zero})"),
        );
    };
    let (whole, sharded, plain) = (root.join("whole"), root.join("sharded"), root.join("plain"));
    let unsharded = root.join("unsharded");
    run(train_args(&whole, 1, 6), true);
    run(train_args(&sharded, 1, 3), true);
    copy_dir(&sharded.join("checkpoint"), &unsharded.join("checkpoint"));
    run(train_args(&plain, 1, 3), false);

    run(resume_args(&sharded, 1, 6), true);
    same_losses(&whole, &sharded, 0.0);
    assert_eq!(weight_difference(&whole, &sharded), 0.0);
    let moments = |dir: &Path| load_checkpoint(&dir.join("checkpoint")).unwrap().optimizer;
    assert!(moments(&whole) == moments(&sharded), "the moments differ");

    run(resume_args(&unsharded, 1, 6), false);
    run(resume_args(&plain, 1, 6), true);
    for resumed in [&unsharded, &plain] {
        // The logged norms may differ in their last bits; nothing else may.
        same_losses(&whole, resumed, LOSS_TOL);
        let d = weight_difference(&whole, resumed);
        assert_eq!(d, 0.0, "{}", resumed.display());
    }
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn ranks_that_disagree_or_die_stop_the_run_with_a_clear_error() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("fail");
    let exe = env!("CARGO_BIN_EXE_helios");
    let args = train_args(&root.join("run"), 2, 4);
    // MPMD: rank 1 runs with another seed, so another batch order and other weights.
    let out = mpiexec()
        .args(["-n", "1", exe])
        .args(&args)
        .args([":", "-n", "1", exe])
        .args(&args)
        .args(["--seed", "7"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("rank 1 disagrees with rank 0 about the training settings"),
        "{stderr}"
    );
    // Rank 1 cannot read its data and stops; rank 0, waiting for it, is stopped too.
    let t = Instant::now();
    let out = mpiexec()
        .args(["-n", "1", exe])
        .args(&args)
        .args([":", "-n", "1", exe])
        .args(&args)
        .args(["--data", "/nonexistent/corpus.txt"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("rank 1") && stderr.contains("/nonexistent/corpus.txt"),
        "{stderr}"
    );
    assert!(t.elapsed() < Duration::from_secs(120), "{:?}", t.elapsed());
    // Started by a launcher without MPI, a rank says what it lacks instead of waiting.
    let out = helios()
        .args(&args)
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("needs NCCL") && stderr.contains("mpiexec"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}
