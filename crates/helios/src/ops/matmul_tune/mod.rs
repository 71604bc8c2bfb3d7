//! Which matmul kernel runs: the one selection function of the family, the autotuner behind
//! it, its on-disk cache, and the cooperative-matrix peak microbenchmark.
//!
//! Order of precedence (`choose`): a variant forced by the caller (`MatmulOverrides::variant`),
//! then `HELIOS_MATMUL_VARIANT=<name>`, then the tuned winner for the problem's shape class,
//! then (on GPUs, unless `HELIOS_MATMUL_TUNE=0`) tuning now, else the documented default
//! (`helios_kernels::matmul::default_variant`). Key decision: a candidate may win only after
//! it passed a correctness check against the f64 CPU reference on fresh random inputs; then
//! it is timed with GPU timestamps on the caller's own operands. Winners persist in
//! `<cache root>/matmul/<device uuid>-<driver version>-<features>.tsv` (one `variant  µs
//! class` line per class), so tuning happens once per device, driver and set of enabled
//! kernel features, and a new driver retunes.
//!
//! The files: `caps` (what the device offers matmul), `choose` (the selection and its
//! per-process memo), `cache` (shape classes and the on-disk winners), `tune` (the tuner:
//! candidates, split-K, reports), `check` (a candidate's correctness check), `timing` (GPU
//! timing of candidates) and `peak` (the cooperative-matrix peak microbenchmark).

mod background;
mod cache;
mod caps;
mod check;
mod choose;
mod explore;
mod peak;
mod timing;
mod tune;

pub use background::stop as stop_background_tuning;
pub(crate) use cache::winner_tag;
pub use caps::matmul_caps;
pub(crate) use choose::{choose, exhaustive, forget_device, run, run_into};
pub use choose::{matmul_exploring, set_exhaustive_tuning, Choice, Tuning};
pub use peak::{coop_peak, CoopPeak};
pub use tune::{CandidateResult, TuneReport};
