// `--compare torch`: runs `bench/torch_reference.py` for the same cases and attaches its
// figures to Helios's rows.
//
// Key decision: the script is a separate process that prints one JSON document on stdout
// (`--json -`) and, when python3, torch or a CUDA device is missing, exits non-zero with a
// one-line reason on stderr; every failure here becomes that one-line note for the caller,
// never an error, so a machine without PyTorch still gets Helios's figures.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::{CaseResult, Plan};

/// Where the script lives relative to the repository root.
pub const SCRIPT: &str = "bench/torch_reference.py";

/// One case as `torch_reference.py` reports it (times per op in µs).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct TorchCase {
    pub suite: String,
    pub case: String,
    pub dtype: String,
    pub elements: usize,
    pub median_us: f64,
    pub p95_us: f64,
    pub cv: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
}

/// The script's whole output: metadata (torch and CUDA versions, device) and the cases.
pub struct TorchRun {
    pub meta: serde_json::Value,
    pub results: Vec<TorchCase>,
}

/// The script to run: `explicit` if given, else `bench/torch_reference.py` under the current
/// directory or one of the directories above the running binary (`target/release/helios`
/// sits two levels below the repository root).
pub fn locate(explicit: Option<&Path>, script: &str) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--torch-script {}: no such file", p.display()))
        };
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).take(4).map(Path::to_path_buf));
    }
    roots
        .iter()
        .map(|r| r.join(script))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!("{script} not found; run from the repository root or pass --torch-script PATH")
        })
}

/// Runs the script for `suite` with the sizes and counts of `plan`.
pub fn run(script: &Path, suite: &str, plan: &Plan) -> Result<TorchRun, String> {
    let mut cmd = command(script, suite, plan.quick);
    if let Some(d) = &plan.dispatch {
        cmd.args(["--ops", &d.ops.to_string()]);
        cmd.args(["--samples", &d.samples.to_string()]);
        cmd.args(["--roundtrip-iters", &d.roundtrip_iters.to_string()]);
    }
    if let Some(b) = &plan.bandwidth {
        let sizes: Vec<String> = b.sizes.iter().map(|s| s.to_string()).collect();
        cmd.args(["--sizes", &sizes.join(",")]);
        cmd.args(["--dtypes", &b.dtypes.join(",")]);
        cmd.args(["--bw-samples", &b.samples.to_string()]);
    }
    let (meta, results) = execute(script, cmd)?;
    Ok(TorchRun { meta, results })
}

/// `python3 <script> --suite <suite> --json -` (plus `--quick`): each suite adds its own
/// case arguments and passes the command to `execute`.
pub fn command(script: &Path, suite: &str, quick: bool) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(script).args(["--suite", suite, "--json", "-"]);
    if quick {
        cmd.arg("--quick");
    }
    cmd
}

/// Runs a prepared `python3 torch_reference.py …` command and splits its JSON into the run
/// metadata and the result rows (every suite's rows deserialize into their own type). Errors
/// are one line: the script's last message, or why it could not run.
pub fn execute<T: serde::de::DeserializeOwned>(
    script: &Path,
    mut cmd: Command,
) -> Result<(serde_json::Value, Vec<T>), String> {
    let out = cmd.output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "python3 is not installed".to_owned(),
        _ => format!("cannot run python3: {e}"),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        // The script's own failures already name it; a traceback's last line does not.
        let last = last.trim();
        return Err(if last.starts_with("torch_reference.py:") {
            last.to_owned()
        } else {
            format!("{} failed: {last}", script.display())
        });
    }
    parse(&out.stdout).map_err(|e| format!("{} printed unusable JSON: {e}", script.display()))
}

fn parse<T: serde::de::DeserializeOwned>(
    stdout: &[u8],
) -> Result<(serde_json::Value, Vec<T>), serde_json::Error> {
    let mut meta: serde_json::Value = serde_json::from_slice(stdout)?;
    let results = match meta.as_object_mut().and_then(|m| m.remove("results")) {
        Some(r) => serde_json::from_value(r)?,
        None => Vec::new(),
    };
    Ok((meta, results))
}

/// Gives each Helios row the PyTorch case with the same suite, case, dtype and size.
pub fn attach(results: &mut [CaseResult], torch: &[TorchCase]) {
    for r in results.iter_mut() {
        r.torch = torch
            .iter()
            .find(|t| {
                t.suite == r.suite
                    && t.case == r.torch_case()
                    && t.dtype == r.dtype
                    && t.elements == r.elements
            })
            .cloned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::Summary;

    #[test]
    fn parses_and_attaches_by_case_dtype_and_size() {
        let json = br#"{"suite": "all", "torch": "2.11", "results": [
            {"suite": "dispatch", "case": "chain", "dtype": "f32", "elements": 1024,
             "median_us": 7.0, "p95_us": 8.0, "cv": 0.1, "record_us": 6.5},
            {"suite": "bandwidth", "case": "add", "dtype": "f16", "elements": 4096,
             "median_us": 2.0, "p95_us": 2.5, "cv": 0.05, "gbps": 12.0}]}"#;
        let (meta, results): (_, Vec<TorchCase>) = parse(json).unwrap();
        assert_eq!(meta["torch"], "2.11");
        assert!(meta.get("results").is_none());
        let s = Summary::of(&[3.5]).unwrap();
        let mut rows = vec![
            CaseResult::new(
                "dispatch",
                "chain_batched",
                String::new(),
                "f32",
                1024,
                1,
                s,
            ),
            CaseResult::new(
                "dispatch",
                "chain_per_op_submit",
                String::new(),
                "f32",
                1024,
                1,
                s,
            ),
            CaseResult::new("bandwidth", "add", String::new(), "f16", 4096, 1, s),
            CaseResult::new("bandwidth", "add", String::new(), "f32", 4096, 1, s),
        ];
        attach(&mut rows, &results);
        assert_eq!(rows[0].torch.as_ref().unwrap().median_us, 7.0);
        assert_eq!(rows[0].speedup_vs_torch(), Some(2.0));
        assert!(rows[1].torch.is_some());
        assert_eq!(rows[2].torch.as_ref().unwrap().gbps, Some(12.0));
        assert!(rows[3].torch.is_none());
    }

    #[test]
    fn bad_json_is_an_error() {
        assert!(parse::<TorchCase>(b"torch says hi").is_err());
    }

    #[test]
    fn missing_explicit_script_is_reported() {
        let e = locate(Some(Path::new("/nonexistent/torch_reference.py")), SCRIPT).unwrap_err();
        assert!(e.contains("no such file"), "{e}");
    }
}
