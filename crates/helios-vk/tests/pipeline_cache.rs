// The persistent pipeline cache: a second Context loads what the first saved and still builds
// correct pipelines; damaged or foreign files are ignored with a note; disabled persistence
// writes nothing; the HELIOS_* switches, checked in a child process so no test races on the
// process-global environment.

mod common;

use common::shader;
use helios_vk::{Context, ContextOptions, PipelineCacheDir};
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"HELIOSP1";

/// An empty directory of this test's own.
fn temp_root(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("helios-vk-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn cache_file(ctx: &Context) -> PathBuf {
    ctx.pipeline_stats().cache_file.expect("persistence is on")
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn wrap(blob: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(blob.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a64(blob).to_le_bytes());
    out.extend_from_slice(blob);
    out
}

#[test]
fn second_context_loads_the_saved_cache() {
    let root = temp_root("warm");
    let options = ContextOptions::with_cache_dir(&root);

    let cold = common::context_with(&options);
    let path = cache_file(&cold);
    assert!(path.starts_with(root.join("pipelines")), "{path:?}");
    let stats = cold.pipeline_stats();
    assert_eq!(stats.cache_loaded_bytes, 0);
    assert!(stats.cache_note.unwrap().contains("cold start"));
    assert!(!path.exists());
    shader::create_and_run(&cold);
    let cold_stats = cold.pipeline_stats();
    assert_eq!(cold_stats.pipelines_created, 1);
    assert!(cold_stats.total_create_seconds > 0.0);
    common::finish(cold); // saves: a pipeline was created

    let file = std::fs::read(&path).expect("the dropped Context saved its cache");
    assert!(file.starts_with(MAGIC));
    let warm = common::context_with(&options);
    let stats = warm.pipeline_stats();
    assert_eq!(stats.cache_loaded_bytes, file.len() as u64 - 24);
    assert!(stats.cache_loaded_bytes >= 32, "{stats:?}");
    assert_eq!(stats.cache_note, None);
    shader::create_and_run(&warm);
    let warm_stats = warm.pipeline_stats();
    eprintln!(
        "pipeline creation: cold {:.3} ms, warm {:.3} ms ({} bytes loaded)",
        cold_stats.total_create_seconds * 1e3,
        warm_stats.total_create_seconds * 1e3,
        stats.cache_loaded_bytes
    );
    common::finish(warm);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn damaged_or_foreign_files_are_ignored() {
    let root = temp_root("damaged");
    let options = ContextOptions::with_cache_dir(&root);
    let ctx = common::context_with(&options);
    let path = cache_file(&ctx);
    shader::create_and_run(&ctx);
    ctx.save_pipeline_cache().unwrap();
    common::finish(ctx);
    let good = std::fs::read(&path).unwrap();
    let blob = &good[24..];

    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 0x40;
    let mut other_vendor = blob.to_vec();
    other_vendor[8] ^= 1; // vendorID, rewrapped with a valid checksum
    let mut other_uuid = blob.to_vec();
    other_uuid[20] ^= 1;
    let cases: [(&str, Vec<u8>, &str); 6] = [
        ("garbage", b"not a cache at all".to_vec(), "magic"),
        ("empty", Vec::new(), "magic"),
        ("truncated", good[..good.len() - 3].to_vec(), "truncated"),
        ("bit flip", flipped, "checksum"),
        ("other device", wrap(&other_vendor), "stale"),
        ("other driver", wrap(&other_uuid), "UUID"),
    ];
    for (what, bytes, reason) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let ctx = common::context_with(&options);
        let stats = ctx.pipeline_stats();
        assert_eq!(stats.cache_loaded_bytes, 0, "{what}");
        let note = stats.cache_note.unwrap_or_default();
        assert!(note.contains(reason), "{what}: {note}");
        shader::create_and_run(&ctx);
        common::finish(ctx);
        // The drop replaced the bad file with a good one.
        let repaired = std::fs::read(&path).unwrap();
        assert!(repaired.starts_with(MAGIC), "{what}");
    }
    let ctx = common::context_with(&options);
    assert!(ctx.pipeline_stats().cache_loaded_bytes > 0);
    common::finish(ctx);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn disabled_persistence_writes_nothing() {
    let ctx = common::context_with(&ContextOptions {
        pipeline_cache: PipelineCacheDir::Disabled,
        ..Default::default()
    });
    shader::create_and_run(&ctx);
    ctx.save_pipeline_cache().unwrap();
    let stats = ctx.pipeline_stats();
    assert_eq!(stats.cache_file, None);
    assert_eq!(stats.cache_loaded_bytes, 0);
    assert_eq!(stats.pipelines_created, 1);
    common::finish(ctx);
}

/// Runs the `env_child` test in a child process with `vars` set; returns its cache dir.
fn run_child(test: &str, vars: &[(&str, &str)]) -> PathBuf {
    let root = temp_root(test);
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "env_child", "--nocapture", "--test-threads=1"])
        .env("HELIOS_TEST_CHILD", "1")
        .env("HELIOS_CACHE_DIR", &root)
        .env_remove("HELIOS_PIPELINE_CACHE");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the test binary");
    assert!(
        out.status.success(),
        "child failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    root
}

fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("pipelines")).map_or(0, |d| d.count())
}

#[test]
fn environment_switches() {
    let root = run_child("env-on", &[]);
    assert_eq!(files_under(&root), 1, "HELIOS_CACHE_DIR is the cache root");
    std::fs::remove_dir_all(&root).unwrap();

    let root = run_child("env-off", &[("HELIOS_PIPELINE_CACHE", "0")]);
    assert!(!root.exists(), "HELIOS_PIPELINE_CACHE=0 wrote {root:?}");
}

/// Not a test on its own: `environment_switches` runs it in a child process.
#[test]
fn env_child() {
    if std::env::var_os("HELIOS_TEST_CHILD").is_none() {
        return;
    }
    let options = ContextOptions::from_env().unwrap();
    let ctx = common::context_with(&options);
    shader::create_and_run(&ctx);
    ctx.save_pipeline_cache().unwrap();
    common::finish(ctx);
}
