// `helios bench` end to end on whatever device is present (lavapipe in CI), in --quick mode:
// the JSON parses and holds the run metadata and every case, and the torch comparison either
// runs or degrades to a note. Timings are never asserted; the runs are kept small so the
// file finishes in seconds even in debug builds with validation on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn helios(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_helios"))
        .args(args)
        .env_remove("HELIOS_DEVICE")
        .output()
        .expect("run helios")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

fn has_python() -> bool {
    Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Adds `--compare torch --torch-script script` to `args` where python3 runs (a stand-in
/// script then answers for PyTorch).
fn compare_with_stand_in<'a>(args: &mut Vec<&'a str>, script: &'a Path) {
    if has_python() {
        args.extend([
            "--compare",
            "torch",
            "--torch-script",
            script.to_str().unwrap(),
        ]);
    }
}

fn check_metadata(v: &serde_json::Value, suite: &str) {
    assert_eq!(v["suite"], suite);
    for key in ["date", "device", "driver", "vulkan_api", "commit"] {
        assert!(v[key].as_str().is_some_and(|s| !s.is_empty()), "{key}: {v}");
    }
    assert!(v["env"].is_object());
    assert!(v["unix_time"].as_u64().is_some_and(|t| t > 0));
}

#[test]
fn dispatch_quick_writes_json() {
    let path = tmp("bench-dispatch.json");
    let out = helios(&[
        "bench",
        "dispatch",
        "--quick",
        "--json",
        path.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(text(&out.stdout).contains("chain_per_op_submit"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("valid JSON");
    check_metadata(&v, "dispatch");
    let cases: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["case"].as_str().unwrap())
        .collect();
    assert_eq!(
        cases,
        [
            "roundtrip",
            "chain_batched",
            "chain_per_op_submit",
            "independent"
        ]
    );
    for r in v["results"].as_array().unwrap() {
        assert!(
            r["time_us"]["median"].as_f64().is_some_and(|t| t > 0.0),
            "{r}"
        );
    }
    // The counters show each case measured what it claims.
    let r = &v["results"];
    assert!(r[1]["barriers_per_op"].as_f64().unwrap() > 0.9);
    // One batch, or a few when the encoder submits early to a GPU that ran dry.
    let batches = r[1]["batches_per_sample"].as_f64().unwrap();
    assert!((1.0..=8.0).contains(&batches), "{batches}");
    assert_eq!(r[3]["barriers_per_op"].as_f64(), Some(0.0));
    assert!(r[2]["batches_per_sample"].as_f64().unwrap() >= 100.0);
}

#[test]
fn bandwidth_quick_json_on_stdout() {
    let out = helios(&[
        "bench",
        "bandwidth",
        "--quick",
        "--sizes",
        "4096",
        "--json",
        "-",
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Tables go to stderr when stdout carries the JSON.
    assert!(stderr.contains("% copy"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    check_metadata(&v, "bandwidth");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 6, "copy/add/exp x f32/f16");
    for r in results {
        assert_eq!(r["elements"], 4096);
        assert!(r["gbps"].as_f64().is_some_and(|g| g > 0.0), "{r}");
        assert!(r["pct_of_copy"].as_f64().is_some(), "{r}");
    }
    assert_eq!(results[0]["case"], "copy");
    assert_eq!(results[0]["pct_of_copy"].as_f64(), Some(100.0));
    assert_eq!(results[1]["bytes_per_op"], 3 * 4096 * 4);
    assert_eq!(results[3]["dtype"], "f16");
}

#[test]
fn compare_with_a_stand_in_torch_script() {
    if !has_python() {
        eprintln!("skipped: no python3");
        return;
    }
    // A stand-in for torch_reference.py that answers with fixed figures.
    let script = tmp("fake_torch_reference.py");
    std::fs::write(
        &script,
        r#"import json, sys
assert "--json" in sys.argv and "--suite" in sys.argv
print(json.dumps({"suite": "bandwidth", "torch": "9.9", "cuda": "0", "device": "Fake",
  "results": [{"suite": "bandwidth", "case": "add", "dtype": "f32", "elements": 4096,
               "median_us": 1.0, "p95_us": 1.5, "cv": 0.1, "gbps": 49.152}]}))
"#,
    )
    .unwrap();
    let out = helios(&[
        "bench",
        "bandwidth",
        "--quick",
        "--sizes",
        "4096",
        "--dtypes",
        "f32",
        "--compare",
        "torch",
        "--torch-script",
        script.to_str().unwrap(),
        "--json",
        "-",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("torch 9.9"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["torch"]["device"], "Fake");
    let add = &v["results"][1];
    assert_eq!(add["case"], "add");
    assert_eq!(add["torch"]["gbps"].as_f64(), Some(49.152));
    assert!(v["results"][0]["torch"].is_null());
}

#[test]
fn compare_without_torch_is_a_note_or_runs() {
    // With the real script: a machine without torch/CUDA gets a note and Helios's figures;
    // one with them gets the comparison. Either way the run succeeds.
    let out = helios(&[
        "bench",
        "bandwidth",
        "--quick",
        "--sizes",
        "1024",
        "--dtypes",
        "f16",
        "--compare",
        "torch",
        "--torch-script",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../bench/torch_reference.py"
        ),
        "--json",
        "-",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert!(v["torch"].is_object() || v["torch_note"].is_string(), "{v}");
}

#[test]
fn bad_arguments_are_errors() {
    let out = helios(&[
        "bench",
        "bandwidth",
        "--compare",
        "torch",
        "--torch-script",
        "/nonexistent/torch_reference.py",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no such file"));
    for args in [
        &["bench", "bandwidth", "--sizes", "0"][..],
        &["bench", "bandwidth", "--sizes", "lots"],
        &["bench", "bandwidth", "--dtypes", "f64"],
        &["bench", "dispatch", "--ops", "0"],
        &["bench", "everything"],
        &["bench", "graph", "--quick", "--cases", "chain"],
        &["bench", "matmul", "--quick", "--variants", "coop12x"],
        &["bench", "matmul", "--quick", "--variants", "simt64x64d9"],
    ] {
        let out = helios(args);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(!text(&out.stderr).contains("panicked"), "{args:?}");
    }
}

/// `--variants` times each listed variant instead of the tuner's choice, checked against the
/// reference; one the case cannot run (a cooperative tile on f32 operands) is skipped.
#[test]
fn matmul_variants_side_by_side() {
    let out = helios(&[
        "bench",
        "matmul",
        "--quick",
        "--cases",
        "sq256",
        "--dtypes",
        "f32",
        "--samples",
        "1",
        "--variants",
        "simt64x64d2,coop128x256w2x8k32s1,simt128x64d1",
        "--json",
        "-",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("sq256 f32 skipped"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    check_metadata(&v, "matmul");
    let rows = v["results"].as_array().expect("results");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["variant"].as_str()).collect();
    assert_eq!(names, ["simt64x64d2", "simt128x64d1"]);
    for r in rows {
        assert_eq!(r["how"], "forced");
        assert!(r["candidates"].as_array().is_some_and(|c| c.is_empty()));
        assert!(r["rel_err"].as_f64().is_some_and(|e| e < 1e-5), "{r}");
    }
}

/// `--cases` runs only the graph cases named (host12 gives its cold and cached rows).
#[test]
fn graph_quick_selected_cases() {
    let out = helios(&[
        "bench",
        "graph",
        "--quick",
        "--samples",
        "2",
        "--cases",
        "host12,chain1000",
        "--json",
        "-",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    check_metadata(&v, "graph");
    let names: Vec<&str> = v["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|r| r["case"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "chain1000",
            "host12_cold",
            "host12_cached",
            "host12_submitted"
        ]
    );
}

#[test]
fn torch_reference_help_parses() {
    if !has_python() {
        eprintln!("skipped: no python3");
        return;
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/");
    for (script, option) in [
        ("torch_reference.py", "--suite"),
        ("torch_graph.py", "--cases"),
        ("torch_train.py", "--ids"),
    ] {
        let out = Command::new("python3")
            .args([&format!("{dir}{script}"), "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains(option), "{script}");
    }
}

#[test]
fn ops_quick_with_a_stand_in_torch_script() {
    // Every ops case at two small shapes (one row longer than a workgroup's registers), JSON
    // on stdout; with python3, a stand-in torch script whose softmax figure gets attached.
    let script = tmp("fake_torch_ops.py");
    std::fs::write(
        &script,
        r#"import json, sys
assert sys.argv[sys.argv.index("--suite") + 1] == "ops"
assert "softmax" in sys.argv[sys.argv.index("--ops-cases") + 1]
print(json.dumps({"suite": "ops", "torch": "9.9", "cuda": "0", "device": "Fake",
  "results": [{"suite": "ops", "case": "softmax", "dtype": "f32", "elements": 1600,
               "rows": 16, "cols": 100, "median_us": 2.0, "p95_us": 2.5, "cv": 0.1}]}))
"#,
    )
    .unwrap();
    let mut args = vec![
        "bench",
        "ops",
        "--quick",
        "--shapes",
        "16x100,3x9001",
        "--samples",
        "2",
        "--json",
        "-",
    ];
    compare_with_stand_in(&mut args, &script);
    let out = helios(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    check_metadata(&v, "ops");
    let results = v["results"].as_array().unwrap();
    // 2 shapes × 2 dtypes (f32, bf16) × 7 cases, then AdamW once per dtype.
    assert_eq!(results.len(), 30);
    for r in results {
        assert!(r["gbps"].as_f64().is_some_and(|g| g > 0.0), "{r}");
        assert!(r["variant"].as_str().is_some_and(|s| !s.is_empty()));
    }
    assert_eq!(results[0]["case"], "softmax");
    if has_python() {
        assert_eq!(results[0]["torch"]["median_us"].as_f64(), Some(2.0));
        // Torch's GB/s from Helios's byte count: 2·1600·4 bytes in 2 µs.
        assert_eq!(results[0]["torch"]["gbps"].as_f64(), Some(6.4));
        assert!(results[1]["torch"].is_null());
    }
}

#[test]
fn generate_quick_with_a_stand_in_torch_script() {
    // A cold and a warm pass of 3 tokens each at batch 1 and 8; with python3, a stand-in
    // torch script whose rows attach to the Helios row of the same pass, precision and batch.
    let script = tmp("fake_torch_generate.py");
    std::fs::write(
        &script,
        r#"import json, sys
assert sys.argv[sys.argv.index("--new-tokens") + 1] == "3"
assert sys.argv[sys.argv.index("--precisions") + 1] == "fp32"
row = {"precision": "fp32", "first_token_ms": 9.0, "ms_per_token": 2.0, "p95_ms": 2.5,
       "max_ms": 3.0, "tokens_per_s": 500.0, "timing": "per_step"}
rows = [dict(row, batch=b, **{"pass": p}) for p in ["cold", "warm"] for b in [1, 8]]
print(json.dumps({"meta": {"torch": "9.9", "cuda": "0", "device": "Fake"}, "results": rows}))
"#,
    )
    .unwrap();
    let mut args = vec![
        "bench",
        "generate",
        "--quick",
        "--samples",
        "3",
        "--dtypes",
        "f32",
        "--json",
        "-",
    ];
    compare_with_stand_in(&mut args, &script);
    let out = helios(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    check_metadata(&v, "generate");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    let runs = [("cold", 1), ("cold", 8), ("warm", 1), ("warm", 8)];
    for (r, (pass, batch)) in results.iter().zip(runs) {
        assert_eq!(
            (r["pass"].as_str(), r["batch"].as_u64()),
            (Some(pass), Some(batch))
        );
        assert_eq!(r["tokens_ms"].as_array().map(Vec::len), Some(3));
        assert_eq!(r["ms_per_token"]["samples"], 2);
        if has_python() {
            let torch = r["torch"].as_array().unwrap();
            assert_eq!(torch.len(), 1, "{r}");
            assert_eq!(torch[0]["batch"].as_u64(), Some(batch), "{r}");
        }
    }
}

#[test]
fn train_quick_on_text_with_a_stand_in_torch_script() {
    // The bundled corpus on both sides: Helios trains on it, and the torch script gets its
    // first ids as little-endian u32 (a stand-in checks them and answers for both modes).
    let script = tmp("fake_torch_train.py");
    std::fs::write(
        &script,
        r#"import json, struct, sys
path = sys.argv[sys.argv.index("--ids") + 1]
data = open(path, "rb").read()
ids = struct.unpack("<%dI" % (len(data) // 4), data)
assert len(ids) >= 2 * 64 and max(ids) < 50257 and len(set(ids)) < len(ids), len(ids)
row = {"case": "quick", "precision": "bf16", "ms_per_step": 5.0, "tokens_per_s": 25600.0,
       "first_step_s": 1.0, "peak_gib": 0.1, "reserved_gib": 0.2}
rows = [dict(row, mode=m) for m in ["eager", "compile"]]
print(json.dumps({"meta": {"torch": "9.9", "device": "Fake"}, "results": rows}))
"#,
    )
    .unwrap();
    let mut args = vec![
        "bench", "train", "--quick", "--dtypes", "bf16", "--tokens", "text", "--json", "-",
    ];
    compare_with_stand_in(&mut args, &script);
    let out = helios(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    check_metadata(&v, "train");
    let r = &v["results"][0];
    assert_eq!(r["tokens"], "text", "{r}");
    if has_python() {
        assert_eq!(r["torch"].as_array().map(Vec::len), Some(2), "{r}");
    }
}
