//! GPU timing of the tuner's candidates.

use helios_kernels::MatmulKernel;

use crate::ops::matmul::{Plan, Problem};
use crate::{Device, Result, Tensor};

/// `HELIOS_TUNE_TRACE=1`: each step of a class's tuning as it starts (where a tuning stalls).
pub(super) fn trace(what: std::fmt::Arguments) {
    if crate::env::tune_trace() {
        eprintln!("helios: matmul tuning: {what}");
    }
}

/// Per-run GPU time of `reps` back-to-back runs of `kernel` into `out`, µs.
pub(super) fn sample(p: &Problem, kernel: &MatmulKernel, out: &Tensor, reps: u32) -> Result<f64> {
    let ctx = p.a.device().context();
    let t = ctx.start_gpu_timer()?;
    for _ in 0..reps {
        p.record(kernel, out)?;
    }
    let span = ctx.stop_gpu_timer(t)?;
    Ok(ctx.gpu_elapsed(span)?.as_secs_f64() * 1e6 / f64::from(reps))
}

/// One run of `plan` per rep (a split plan's sum pass included), µs per run.
pub(super) fn sample_plan(p: &Problem, plan: &Plan, reps: u32) -> Result<f64> {
    let ctx = p.a.device().context();
    let t = ctx.start_gpu_timer()?;
    for _ in 0..reps {
        p.run(plan)?.realize()?;
    }
    let span = ctx.stop_gpu_timer(t)?;
    Ok(ctx.gpu_elapsed(span)?.as_secs_f64() * 1e6 / f64::from(reps))
}

/// A candidate to time: `sample(reps)` records `reps` back-to-back runs and returns the GPU
/// time per run in µs.
pub(super) struct Sampler<'a> {
    pub(super) max_reps: u32,
    pub(super) sample: Box<dyn Fn(u32) -> Result<f64> + 'a>,
}

/// Each candidate's median time per run, µs, in `candidates`' order (`None` where there is
/// no candidate: one that failed its check).
///
/// In this order:
/// 1. One run of every candidate, which compiles it. The correctness check does not always
///    compile the kernel that is timed (exact k follows the shape), and with a cold driver
///    cache a class's compiles took 3 s, long enough for the GPU's clock to fall.
/// 2. A warm-up ([`Device::warm_up`]) with the first candidate, to raise the clock.
/// 3. Back-to-back runs per sample so that a sample lasts ~2 ms (at most `max_reps`).
/// 4. Three rounds that take every candidate in turn; a candidate's time is its median. A
///    clock dip during one candidate's samples then cannot crown it (it once did on an H100).
///
/// Before step 1 came first, a cold-cache tuning timed a GPT-2 class at a low clock and gave
/// it a slow winner (both cases in bench/results/source-comment-history.md).
pub(super) fn time_candidates(
    device: &Device,
    candidates: &[Option<Sampler>],
) -> Result<Vec<Option<f64>>> {
    let live = || candidates.iter().flatten();
    let Some(first) = live().next() else {
        return Ok(vec![None; candidates.len()]);
    };
    for (i, c) in live().enumerate() {
        trace(format_args!("first run of timed candidate {i}"));
        (c.sample)(1)?;
    }
    trace(format_args!("warm-up"));
    device.warm_up(|| (first.sample)(4.min(first.max_reps)).map(drop))?;
    let mut reps = Vec::with_capacity(candidates.len());
    for c in live() {
        let once = (c.sample)(1)?;
        reps.push(if once > 0.0 {
            (2000.0 / once).ceil().clamp(1.0, f64::from(c.max_reps)) as u32
        } else {
            c.max_reps
        });
    }
    trace(format_args!("reps {reps:?}"));
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(3); reps.len()];
    for round in 0..3 {
        trace(format_args!("round {round}"));
        for ((c, &r), s) in live().zip(&reps).zip(&mut samples) {
            s.push((c.sample)(r)?);
        }
    }
    let mut medians = samples.into_iter().map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[1]
    });
    Ok(candidates
        .iter()
        .map(|c| c.as_ref().and_then(|_| medians.next()))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// Every candidate runs once (its compile) before any is timed, the reps per sample
    /// follow each one's time, and a candidate that failed its check keeps its place.
    #[test]
    fn candidates_compile_first_and_keep_their_places() {
        let device = Device::from_env().expect("a Vulkan device");
        let calls = RefCell::new(Vec::new());
        let sampler = |id: u32, us: f64| {
            let calls = &calls;
            Some(Sampler {
                max_reps: 4,
                sample: Box::new(move |reps| {
                    calls.borrow_mut().push((id, reps));
                    Ok(us)
                }),
            })
        };
        let candidates = [None, sampler(1, 5.0), None, sampler(3, 3000.0)];
        let times = time_candidates(&device, &candidates).expect("timed");
        assert_eq!(times, [None, Some(5.0), None, Some(3000.0)]);
        let warm = calls.borrow().len() - 10;
        let calls = calls.borrow();
        assert_eq!(calls[..2], [(1, 1), (3, 1)], "compiles first");
        assert!(calls[2..2 + warm].iter().all(|&c| c == (1, 4)), "warm-up");
        let timed = &calls[2 + warm..];
        assert_eq!(
            timed[..2],
            [(1, 1), (3, 1)],
            "one run each to size the samples"
        );
        // 5 µs runs fill a 2 ms sample only at 400 reps (capped at 4); 3 ms ones need 1.
        assert_eq!(timed[2..], [(1, 4), (3, 1), (1, 4), (3, 1), (1, 4), (3, 1)]);
    }
}
