//! An unsettled class's exploration, kept on disk so that the next process goes on from it.
//!
//! Tuning on real work spends a few percent of each step (`online::BUDGET`), so a class
//! with many candidates and large products (GPT-2's output head) needs several hundred
//! steps to settle. Kept in memory only, it started over in every process: a run shorter
//! than that never settled it and paid the exploring cost for its whole length, and each
//! rank of a data-parallel run, exploring at its own moments, made the others wait in the
//! all-reduce (bench/results/2026-11-30-session50-h200.md).
//!
//! A class's progress is one line of `<cache root>/matmul-progress/<device>.tsv` (the same
//! store, file naming and atomic rewrite as the winners): the incumbent's tag and its median
//! time in the pairs, then each candidate's tag and where it stands (`out`, measured ratios over the
//! incumbent, or `new`). The decision a reader must know: ratios are only comparable over
//! the same incumbent, so progress recorded over another first choice is ignored, and a
//! candidate restored with fewer than a full set of ratios is checked against the real
//! output again before its next ratio counts, as a fresh one is.

use super::cache::{parse_tag, winner_tag, STORE_VERSION};
use helios_kernels::MatmulVariant;

/// Progress per device and class. Its version follows the winners' store: a change that
/// makes old winners mislead makes old ratios mislead too.
static PROGRESS: crate::ops::tuning_store::TuningStore =
    crate::ops::tuning_store::TuningStore::new("matmul-progress", STORE_VERSION, |line| {
        parse(line).is_some()
    });

/// Where one candidate stands.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Standing {
    /// Not yet compared with the incumbent (or being compared when saved).
    New,
    /// Failed its comparison, could not run, or was too slow.
    Out,
    /// Matched the incumbent; its time over the incumbent's, one per pair.
    Ratios(Vec<f64>),
}

/// A class's saved exploration.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Progress {
    /// The incumbent (the class's first choice when it started): (variant, splits).
    pub incumbent: (MatmulVariant, u32),
    /// The incumbent's median time in the pairs so far, µs (0 before any).
    pub incumbent_us: f64,
    /// Every candidate: (variant, splits) and where it stands.
    pub cands: Vec<((MatmulVariant, u32), Standing)>,
}

/// The progress saved for `class` on `device`, if it was made over `incumbent`.
pub(super) fn load(
    device: &crate::Device,
    class: &str,
    incumbent: (MatmulVariant, u32),
) -> Option<Progress> {
    let line = PROGRESS.get(device, class)?;
    parse(&line).filter(|p| p.incumbent == incumbent)
}

/// Saves `progress` for `class` (rewrites the file; a failed write only loses the progress).
pub(super) fn save(device: &crate::Device, class: &str, progress: &Progress) {
    // (The store's time column holds the incumbent's too; `format` carries it for `load`.)
    PROGRESS.put(device, class, &format(progress), progress.incumbent_us);
}

/// Forgets `class`'s progress (tests).
#[cfg(test)]
pub(super) fn forget(device: &crate::Device, class: &str) {
    PROGRESS.remove(device, class)
}

/// `incumbent@µs;tag=out;tag=1.010,0.990;tag=new`: what the store's variant column holds.
fn format(p: &Progress) -> String {
    let tag = |(v, s): (MatmulVariant, u32)| winner_tag(v.name(), s);
    let mut out = format!("{}@{:.3}", tag(p.incumbent), p.incumbent_us);
    for (cand, standing) in &p.cands {
        let state = match standing {
            Standing::New => "new".to_owned(),
            Standing::Out => "out".to_owned(),
            Standing::Ratios(r) => r
                .iter()
                .map(|x| format!("{x:.4}"))
                .collect::<Vec<_>>()
                .join(","),
        };
        out += &format!(";{}={state}", tag(*cand));
    }
    out
}

/// `format`'s inverse; `None` if any part does not parse (a variant this build does not know
/// drops the whole line).
fn parse(line: &str) -> Option<Progress> {
    let mut parts = line.split(';');
    let (incumbent, us) = parts.next()?.split_once('@')?;
    let incumbent = parse_tag(incumbent)?;
    let incumbent_us = us
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)?;
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
            Some((parse_tag(tag)?, standing))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Progress {
        incumbent,
        incumbent_us,
        cands,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_round_trips_and_rejects_what_it_cannot_read() {
        let names: Vec<&str> = helios_kernels::matmul::VARIANTS
            .iter()
            .map(|v| v.0)
            .collect();
        let v = |name: &str| MatmulVariant::by_name(name).expect("a known variant");
        let p = Progress {
            incumbent: (v(names[0]), 1),
            incumbent_us: 41.5,
            cands: vec![
                ((v(names[1]), 1), Standing::Out),
                ((v(names[2]), 1), Standing::Ratios(vec![1.0125, 0.9875])),
                ((v(names[1]), 3), Standing::New),
            ],
        };
        let line = format(&p);
        assert_eq!(parse(&line), Some(p));
        for bad in [
            "nosuchkernel@1.0".to_owned(),
            names[0].to_owned(),
            format!("{}@1.0;nosuchkernel=out", names[0]),
            format!("{}@1.0;{}=1.0,x", names[0], names[1]),
            format!("{}@1.0;{}=-1.0", names[0], names[1]),
            format!("{}@1.0;{}=", names[0], names[1]),
            format!("{}@1.0;{}", names[0], names[1]),
        ] {
            assert_eq!(parse(&bad), None, "{bad}");
        }
    }
}
