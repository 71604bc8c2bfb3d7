//! Which matmul kernel runs: the one selection function of the family, the tuners behind
//! it, their on-disk cache, and the cooperative-matrix peak microbenchmark.
//!
//! Order of precedence (`choose`): a variant forced by the caller (`MatmulOverrides::variant`),
//! then `HELIOS_MATMUL_VARIANT=<name>`, then the stored winner for the problem's shape class.
//! A class without one runs its first choice at once (the old driver's winner after a driver
//! update, else a rule: `first_choice`) and, on GPUs, is tuned on real work (`explore`):
//! candidates compile on background threads and run beside the program's own calls, checked
//! against the incumbent's output and timed in pairs with it, until the class settles. With
//! `HELIOS_MATMUL_TUNE=full` a class is instead tuned exhaustively before its first call
//! returns (`exhaustive`: each candidate checked against the f64 CPU reference, then timed);
//! `HELIOS_MATMUL_TUNE=0` keeps the first choice. Winners persist in
//! `<cache root>/matmul/<device uuid>-<driver version>-<features>.tsv` (one `variant  µs
//! class` line per class), and a class's exploration that has not settled in
//! `<cache root>/matmul-progress/`, so that the next process goes on from it.
//!
//! The files: `caps` (what the device offers matmul), `choose` (the selection, its
//! per-process memo and the first choice), `standin` (the SPIR-V kernel a class runs while
//! its native first choice is JIT-compiled), `explore` (tuning on real work; its compile
//! threads are `ops::background`, shared with attention's, and an unsettled class's progress
//! is kept by `ops::tuning_progress`) and `shadow` (a candidate's run beside the real
//! product and the rows compared), `cache` (shape classes and the
//! on-disk winners), `exhaustive` (the exhaustive tuner: candidates, split-K, reports),
//! `check` (a candidate's correctness check against the CPU reference), `timing` (GPU
//! timing of candidates) and `peak` (the cooperative-matrix peak microbenchmark).

mod cache;
mod caps;
mod check;
mod choose;
mod exhaustive;
mod explore;
mod peak;
mod shadow;
mod standin;
mod timing;

pub use crate::ops::background::stop as stop_background_tuning;
pub(crate) use cache::winner_tag;
pub use caps::matmul_caps;
pub(crate) use choose::{choose, forget_device, run, run_into, upgraded};
pub use choose::{
    matmul_exploring, set_exhaustive_tuning, tuning, tuning_in_progress, Choice, Tuning,
};
pub use exhaustive::{CandidateResult, TuneReport};
pub use peak::{coop_peak, CoopPeak};
