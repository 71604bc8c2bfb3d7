//! An unsettled class's tuning on real work, kept on disk so that the next process goes on
//! from it (matmul's `explore` and attention's).
//!
//! Tuning on real work spends a few percent of each step (`online::BUDGET`), so a class
//! with many candidates and large products (GPT-2's output head) needs several hundred
//! steps to settle. Kept in memory only, it started over in every process: a run shorter
//! than that never settled it and paid the exploring cost for its whole length, and each
//! rank of a data-parallel run, exploring at its own moments, made the others wait in the
//! all-reduce (bench/results/2026-11-30-session50-h200.md).
//!
//! A class's progress is one line of `<cache root>/<family>-progress/<device>.tsv` (the
//! winners' store, file naming and atomic rewrite): the incumbent's tag, then each
//! candidate's tag and where it stands (`out`, its measured ratios over the incumbent, or
//! `new`); the store's time column holds the incumbent's median time in the pairs. The
//! decision a reader must know: ratios are only comparable over the same incumbent, so
//! progress recorded over another incumbent is ignored; and a tuner checks a candidate
//! restored with fewer than a full set of ratios against the real output again before its
//! next ratio counts, as it checks a fresh one.

use crate::ops::tuning_store::TuningStore;
use crate::Device;

/// Where one candidate stands.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Standing {
    /// Not yet compared with the incumbent (or being compared when saved).
    New,
    /// Failed its comparison, could not run, or was too slow.
    Out,
    /// Matched the incumbent; its time over the incumbent's, one per pair.
    Ratios(Vec<f64>),
}

/// A class's saved exploration; tags are the family's stored variant names.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Progress {
    pub incumbent: String,
    /// The incumbent's median time in the pairs so far, µs (0 before any).
    pub incumbent_us: f64,
    pub cands: Vec<(String, Standing)>,
}

/// One kernel family's progress per device and class.
pub(crate) struct ProgressStore {
    store: TuningStore,
    /// Whether this build knows a variant tag.
    known: fn(&str) -> bool,
}

impl ProgressStore {
    /// The store of `family` (`matmul`, `attention`), whose `version` follows its winners'
    /// store: a change that makes old winners mislead makes old ratios mislead too.
    pub(crate) const fn new(
        family: &'static str,
        version: u32,
        known: fn(&str) -> bool,
    ) -> ProgressStore {
        ProgressStore {
            // Lines are checked tag by tag in `load`, with `known`.
            store: TuningStore::new(family, version, |_| true),
            known,
        }
    }

    /// The progress saved for `class` on `device`, if it was made over `incumbent` and this
    /// build knows every tag in it.
    pub(crate) fn load(&self, device: &Device, class: &str, incumbent: &str) -> Option<Progress> {
        let (line, incumbent_us) = self.store.entry(device, class)?;
        parse(&line, incumbent_us)
            .filter(|p| p.incumbent == incumbent)
            .filter(|p| p.cands.iter().all(|c| (self.known)(&c.0)))
    }

    /// Saves `progress` for `class` (rewrites the file; a failed write only loses progress).
    pub(crate) fn save(&self, device: &Device, class: &str, progress: &Progress) {
        self.store
            .put(device, class, &format(progress), progress.incumbent_us);
    }

    /// Forgets `class`'s progress (tests).
    #[cfg(test)]
    pub(crate) fn forget(&self, device: &Device, class: &str) {
        self.store.remove(device, class)
    }
}

/// `incumbent;tag=out;tag=1.0100,0.9900;tag=new`: what the store's variant column holds.
fn format(p: &Progress) -> String {
    let mut out = p.incumbent.clone();
    for (tag, standing) in &p.cands {
        let state = match standing {
            Standing::New => "new".to_owned(),
            Standing::Out => "out".to_owned(),
            Standing::Ratios(r) => r
                .iter()
                .map(|x| format!("{x:.4}"))
                .collect::<Vec<_>>()
                .join(","),
        };
        out += &format!(";{tag}={state}");
    }
    out
}

/// `format`'s inverse, with the incumbent's time from the store's time column; `None` if
/// any part does not parse.
fn parse(line: &str, incumbent_us: f64) -> Option<Progress> {
    if !(incumbent_us.is_finite() && incumbent_us >= 0.0) {
        return None;
    }
    let mut parts = line.split(';');
    let incumbent = parts.next().filter(|t| !t.is_empty())?;
    let cands = parts
        .map(|part| {
            let (tag, state) = part.split_once('=')?;
            let standing = match state {
                "new" => Standing::New,
                "out" => Standing::Out,
                r => Standing::Ratios(
                    r.split(',')
                        .map(|x| x.parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0))
                        .collect::<Option<Vec<f64>>>()?,
                ),
            };
            Some((tag.to_owned(), standing))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Progress {
        incumbent: incumbent.to_owned(),
        incumbent_us,
        cands,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_round_trips_and_rejects_what_it_cannot_read() {
        let p = Progress {
            incumbent: "nv256x192k16s3w2".into(),
            incumbent_us: 41.5,
            cands: vec![
                ("coop64x64".into(), Standing::Out),
                (
                    "nv128x192k16s4".into(),
                    Standing::Ratios(vec![1.0125, 0.9875]),
                ),
                ("nv128x192k16s4/k3".into(), Standing::New),
            ],
        };
        assert_eq!(parse(&format(&p), p.incumbent_us), Some(p.clone()));
        assert_eq!(parse(&format(&p), f64::NAN), None, "a time that is not one");
        assert_eq!(parse(&format(&p), -1.0), None, "a negative time");
        for bad in ["", "a;b=1.0,x", "a;b=-1.0", "a;b=", "a;b"] {
            assert_eq!(parse(bad, 1.0), None, "{bad}");
        }
    }
}
