// Output of `helios bench`: one text table per suite and the JSON record of a run.
//
// Key decision: the JSON carries everything needed to trust a figure later without the
// terminal: date, device, driver, Vulkan API version, the git commit the binary was built
// from (embedded by build.rs), every HELIOS_* variable that was set, the resolved plan
// (sizes, samples, K), and PyTorch's metadata when it was compared. Dates are formatted by
// hand from the Unix epoch (UTC) to avoid a date-time dependency.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use helios::Device;
use serde::Serialize;

use super::{CaseResult, Plan};

/// The commit the binary was built from (`<short hash>[-dirty]` or `unknown`).
pub const COMMIT: &str = env!("HELIOS_GIT_COMMIT");

/// Run metadata, the top-level fields of the JSON.
#[derive(Serialize)]
pub struct RunMeta<'a> {
    pub suite: &'a str,
    /// UTC, ISO 8601.
    pub date: String,
    pub unix_time: u64,
    pub device: String,
    pub driver: String,
    pub driver_version: String,
    pub vulkan_api: String,
    pub commit: &'static str,
    pub helios_version: &'static str,
    /// Every HELIOS_* environment variable set for this run.
    pub env: BTreeMap<String, String>,
    pub plan: &'a Plan,
    /// torch_reference.py's metadata (versions, device) when --compare torch ran.
    pub torch: Option<serde_json::Value>,
    /// Why the torch comparison was skipped, when it was asked for and did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_note: Option<String>,
}

impl<'a> RunMeta<'a> {
    /// `device | driver | Vulkan x | commit c | date`, the first line of every table.
    pub fn run_line(&self) -> String {
        format!(
            "{} | {} | Vulkan {} | commit {} | {}\n",
            self.device, self.driver, self.vulkan_api, self.commit, self.date
        )
    }

    /// `run_line`, then the PyTorch side's versions and device when it ran.
    pub fn header(&self) -> String {
        let mut s = self.run_line();
        if let Some(t) = &self.torch {
            let field = |k: &str| t.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
            s.push_str(&format!(
                "torch {} (CUDA {}) on {}\n",
                field("torch"),
                field("cuda"),
                field("device")
            ));
        }
        s
    }

    pub fn collect(
        device: &Device,
        suite: &'a str,
        plan: &'a Plan,
        torch: Option<serde_json::Value>,
        torch_note: Option<String>,
    ) -> RunMeta<'a> {
        let caps = device.context().caps();
        let unix_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        RunMeta {
            suite,
            date: iso_date(unix_time),
            unix_time,
            device: caps.name.clone(),
            driver: format!("{} {}", caps.driver_name, caps.driver_info)
                .trim()
                .to_owned(),
            driver_version: caps.driver_version.clone(),
            vulkan_api: caps.api_version.clone(),
            commit: COMMIT,
            helios_version: env!("CARGO_PKG_VERSION"),
            env: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into())))
                .filter(|(k, _)| k.starts_with("HELIOS_"))
                .collect(),
            plan,
            torch,
            torch_note,
        }
    }
}

/// The JSON document: the metadata with `results` appended.
pub fn json(meta: &RunMeta, results: &[CaseResult]) -> serde_json::Result<String> {
    #[derive(Serialize)]
    struct Doc<'a> {
        #[serde(flatten)]
        meta: &'a RunMeta<'a>,
        results: &'a [CaseResult],
    }
    Ok(serde_json::to_string_pretty(&Doc { meta, results })? + "\n")
}

/// The header line and one table per suite present in `results`.
pub fn tables(meta: &RunMeta, results: &[CaseResult]) -> String {
    let mut s = meta.header();
    let torch = meta.torch.is_some();
    let dispatch: Vec<&CaseResult> = results.iter().filter(|r| r.suite == "dispatch").collect();
    if !dispatch.is_empty() {
        s.push('\n');
        s += &dispatch_table(&dispatch, torch);
    }
    let bandwidth: Vec<&CaseResult> = results.iter().filter(|r| r.suite == "bandwidth").collect();
    if !bandwidth.is_empty() {
        s.push('\n');
        s += &bandwidth_table(&bandwidth, torch);
    }
    s
}

fn dispatch_table(rows: &[&CaseResult], torch: bool) -> String {
    let mut t = Table::new(&[
        "case",
        "variant",
        "median µs/op",
        "p95",
        "CV",
        "record µs/op",
        "barriers/op",
        "batches/sample",
    ]);
    let gpu = rows.iter().any(|r| r.gpu_us.is_some());
    if gpu {
        t.extend_headers(&["GPU µs/op"]);
    }
    if torch {
        t.extend_headers(&["torch µs/op", "torch record", "torch/helios"]);
    }
    for r in rows {
        let mut row = vec![
            r.case.clone(),
            r.variant.clone(),
            us(r.time_us.median),
            us(r.time_us.p95),
            pct(100.0 * r.time_us.cv),
            r.record_us.map_or_else(dash, |s| us(s.median)),
            r.barriers_per_op.map_or_else(dash, |b| format!("{b:.2}")),
            r.batches_per_sample
                .map_or_else(dash, |b| format!("{b:.1}")),
        ];
        if gpu {
            row.push(r.gpu_us.map_or_else(dash, us));
        }
        if torch {
            let tc = r.torch.as_ref();
            row.push(tc.map_or_else(dash, |c| us(c.median_us)));
            row.push(tc.and_then(|c| c.record_us).map_or_else(dash, us));
            row.push(r.speedup_vs_torch().map_or_else(dash, ratio));
        }
        t.push(row);
    }
    format!(
        "dispatch: {} elements f32; wall time per op (record = host time until the last op \
         returned){}\n{}",
        super::dispatch::ELEMENTS,
        if torch {
            "; torch/helios > 1: Helios faster"
        } else {
            ""
        },
        t.render()
    )
}

fn bandwidth_table(rows: &[&CaseResult], torch: bool) -> String {
    let mut t = Table::new(&[
        "case",
        "dtype",
        "elements",
        "variant",
        "median µs",
        "p95",
        "CV",
        "GB/s",
        "% copy",
    ]);
    let gpu = rows.iter().any(|r| r.gpu_us.is_some());
    if gpu {
        t.extend_headers(&["GPU µs"]);
    }
    if torch {
        t.extend_headers(&["torch µs", "torch GB/s", "helios/torch"]);
    }
    for r in rows {
        let mut row = vec![
            r.case.clone(),
            r.dtype.to_owned(),
            r.elements.to_string(),
            r.variant.clone(),
            us(r.time_us.median),
            us(r.time_us.p95),
            pct(100.0 * r.time_us.cv),
            r.gbps.map_or_else(dash, gbps),
            r.pct_of_copy.map_or_else(dash, pct),
        ];
        if gpu {
            row.push(r.gpu_us.map_or_else(dash, us));
        }
        if torch {
            let tc = r.torch.as_ref();
            row.push(tc.map_or_else(dash, |c| us(c.median_us)));
            row.push(tc.and_then(|c| c.gbps).map_or_else(dash, gbps));
            row.push(r.speedup_vs_torch().map_or_else(dash, ratio));
        }
        t.push(row);
    }
    format!(
        "bandwidth: GPU time (timestamps) of K back-to-back ops in one batch, per op; GB/s = \
         bytes read + written / median{}\n{}",
        if torch {
            "; helios/torch > 1: Helios faster"
        } else {
            ""
        },
        t.render()
    )
}

/// A plain text table: first column left-aligned, the rest right-aligned except `variant`.
struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn extend_headers(&mut self, more: &[&str]) {
        self.headers.extend(more.iter().map(|h| h.to_string()));
    }

    fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(row.len(), self.headers.len());
        self.rows.push(row);
    }

    fn render(&self) -> String {
        let cols = self.headers.len();
        let mut width: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in width.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let left = |i: usize| i == 0 || matches!(self.headers[i].as_str(), "variant" | "dtype");
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, cell) in cells.iter().enumerate().take(cols) {
                let pad = width[i].saturating_sub(cell.chars().count());
                if i > 0 {
                    s.push_str("  ");
                }
                if left(i) {
                    s.push_str(cell);
                    s.extend(std::iter::repeat(' ').take(pad));
                } else {
                    s.extend(std::iter::repeat(' ').take(pad));
                    s.push_str(cell);
                }
            }
            s.trim_end().to_owned() + "\n"
        };
        let mut out = line(&self.headers);
        for row in &self.rows {
            out += &line(row);
        }
        out
    }
}

fn dash() -> String {
    "-".to_owned()
}

/// Microseconds with three significant digits or so.
fn us(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3}")
    } else if v < 1000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// GB/s: whole numbers where they are large, three decimals on slow (CPU) devices.
fn gbps(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.0}")
    }
}

fn pct(v: f64) -> String {
    format!("{v:.1}%")
}

fn ratio(v: f64) -> String {
    if v < 0.1 {
        format!("{v:.4}x")
    } else {
        format!("{v:.2}x")
    }
}

/// Writes `text` to stdout; a closed pipe (`| head`) is not an error.
pub fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the Unix epoch (proleptic Gregorian, UTC).
pub fn iso_date(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Year, month, day of `days` since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_dates() {
        assert_eq!(iso_date(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_date(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso_date(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(iso_date(1_798_761_599), "2026-12-31T23:59:59Z");
        assert_eq!(iso_date(4_107_542_400), "2100-03-01T00:00:00Z");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["case", "variant", "median"]);
        t.push(vec!["a".into(), "long variant".into(), "1.5".into()]);
        t.push(vec!["longer".into(), "v".into(), "10.25".into()]);
        let s = t.render();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "case    variant       median");
        assert_eq!(lines[1], "a       long variant     1.5");
        assert_eq!(lines[2], "longer  v              10.25");
    }
}
