//! Tuning on real work: a shape class without a stored winner runs its first choice at once,
//! and its other candidates are timed beside the products the program computes anyway.
//!
//! The one decision a reader must know: every measurement is a pair. On an exploring call
//! the incumbent computes the real output as always, and one candidate computes the same
//! product into a scratch tensor right after it (a shadow), both fenced and timed in one
//! command buffer. A candidate's score is its median time over the incumbent's in the same
//! call: the GPU's clock, which drifts while a fresh program compiles and warms up, cancels
//! out of the ratio. A candidate's first shadow is also compared with the real output from
//! rows copied aside. Candidates never compute anything the program reads until the class
//! settles, so exploring cannot change a result. The host never waits: finished timings and
//! comparisons are collected on later calls, and candidates compile on background threads
//! (`background`), tried as soon as each is ready.
//!
//! A class explores its plain kernels first, drops any well behind the best, then tries k
//! splits of the leaders, as the offline tuner does (`tune`), and settles on the lowest
//! median ratio: written to the same store, read by every later process. Until then its
//! progress is saved at each milestone (`ops::tuning_progress`), and a later process goes on
//! from it rather than starting over.

use std::sync::{Arc, Mutex};

use helios_kernels::{MatmulKernel, MatmulVariant};
use helios_vk::{GpuSpan, Snapshot};

use super::cache::{parse_tag, store, winner_tag, PROGRESS};
use super::caps::matmul_caps;
use super::exhaustive::{split_candidates, timed_candidates};
use super::shadow::{check_rows, matmul_bound};
use super::standin::{launched, stand_in};
use crate::ops::background;
use crate::ops::matmul::{Plan, Problem};
use crate::ops::online::{
    compare, fenced, median, refund, spend, warm, RowSample, Verdict, FIRST_ESTIMATE_US,
};
use crate::ops::tuning_progress::{Progress, Standing};
use crate::realize_lock::LockExt;
use crate::{DType, Result, Tensor};

/// Paired runs per candidate; its score is the median ratio (the offline tuner's count).
const SAMPLES: usize = 3;

/// A candidate whose best of two ratios or more is this many times the best median is
/// dropped.
const DROP_SLACK: f64 = 1.25;

/// A candidate whose first ratio is this many times the best median so far is dropped at
/// once.
const GROSS_SLACK: f64 = 2.0;

/// How long `State::compiled` trusts a "not yet" while no background compile finishes.
const ASK_AGAIN: std::time::Duration = std::time::Duration::from_millis(20);

/// One class's exploration (shared by every problem of the class).
pub(crate) struct Explorer {
    key: String,
    state: Mutex<State>,
}

struct State {
    /// `cands[0]` is the incumbent: the first choice, which real calls run meanwhile.
    cands: Vec<Cand>,
    /// The incumbent's times in the pairs, µs (for the store's figure).
    incumbent_us: Vec<f64>,
    pending: Vec<Pending>,
    splits_added: bool,
    winner: Option<usize>,
    /// Real calls of the class so far.
    calls: u64,
    /// What `compiled` answered per (kernel, splits): compiled, or not yet as of a
    /// background generation and a time (`State::compiled`).
    seen: rustc_hash::FxHashMap<(MatmulKernel, u32), Option<(u64, std::time::Instant)>>,
    /// `milestones()` when the progress was last saved (`save_if_moved`).
    saved: (usize, usize, usize),
}

struct Cand {
    variant: MatmulVariant,
    splits: u32,
    status: Status,
    /// Its time over the incumbent's, one per pair (the incumbent's own: none, it is 1).
    ratios: Vec<f64>,
}

impl Cand {
    fn score(&self, incumbent: bool) -> f64 {
        match incumbent {
            true => 1.0,
            false => median(&self.ratios),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Compiled (or compiling), not yet compared with the incumbent.
    Unchecked,
    /// Its first shadow is on the GPU.
    Checking,
    /// Matched the incumbent: its pairs count.
    Live,
    /// Failed its comparison, could not run, or too slow.
    Out,
}

/// A pair on the GPU: the incumbent's real run and candidate `cand`'s shadow, and for a
/// first shadow the rows to compare.
struct Pending {
    cand: usize,
    real: GpuSpan,
    shadow: GpuSpan,
    check: Option<Check>,
    /// What the exploration budget was charged for the shadow, µs (`online::spend`).
    charged_us: f64,
}

struct Check {
    real: Snapshot,
    shadow: Snapshot,
    rows: Vec<RowSample>,
    out: DType,
}

/// What a call of an exploring class runs: `real` computes the output, and `shadow`, when
/// set, a candidate beside it into scratch (compared when `check`).
pub(crate) struct Action {
    real: Plan,
    /// (candidate, its plan, first run, µs charged to the budget).
    shadow: Option<(usize, Plan, bool, f64)>,
}

fn plan_of(p: &Problem, c: &Cand) -> Plan {
    let caps = matmul_caps(p.a.device());
    Plan {
        kernel: p.kernel(c.variant, caps.subgroup),
        splits: c.splits,
    }
}

/// Whether `plan`'s kernel for `p` can run now.
enum Compiled {
    Yes,
    /// Queued on the background threads (a problem of the class with other offsets may want
    /// other vector widths than the round compiled: those are queued on first sight).
    Waiting,
    /// It failed to compile here.
    Failed,
}

fn compiled(p: &Problem, plan: &Plan) -> Compiled {
    let Some((k, sum_len)) = launched(p, plan) else {
        return Compiled::Failed;
    };
    let device = p.a.device();
    // A split product also sums its partial products: that kernel must be ready too.
    let sum_ready = sum_len.map_or(true, |len| {
        device.partial_rows_ready(len, p.out).unwrap_or(false)
    });
    if !sum_ready {
        Compiled::Waiting
    } else if device.has_kernel(&crate::device::KernelKey::Matmul(k)) {
        Compiled::Yes
    } else if background::failed(device, &k) {
        Compiled::Failed
    } else {
        background::compile(device, vec![k]);
        Compiled::Waiting
    }
}

/// Whether everything `plan` launches for `p` is compiled; if not, the missing kernels'
/// compiles are started.
pub(crate) fn ready(p: &Problem, plan: &Plan) -> bool {
    matches!(compiled(p, plan), Compiled::Yes)
}

impl Explorer {
    /// Starts exploring `p`'s class from `first` (the incumbent): queues the other
    /// candidates' compiles.
    pub(crate) fn start(p: &Problem, key: String, first: Plan) -> Arc<Explorer> {
        let mut cands = vec![Cand {
            variant: first.kernel.variant,
            splits: first.splits,
            status: Status::Live,
            ratios: Vec::new(),
        }];
        for k in timed_candidates(p) {
            if k.variant != first.kernel.variant || first.splits > 1 {
                cands.push(Cand {
                    variant: k.variant,
                    splits: 1,
                    status: Status::Unchecked,
                    ratios: Vec::new(),
                });
            }
        }
        // The likelier winners first: the background threads compile in this order, and a
        // candidate is tried as soon as it is compiled.
        let family = |v: MatmulVariant| match () {
            _ if v.is_native() => 0,
            _ if v.is_coop() => 1,
            _ => 2,
        };
        cands[1..].sort_by_key(|c| family(c.variant));
        let mut state = State {
            cands,
            incumbent_us: Vec::new(),
            pending: Vec::new(),
            splits_added: false,
            winner: None,
            calls: 0,
            seen: Default::default(),
            saved: (0, 0, 0),
        };
        let device = p.a.device();
        let incumbent = winner_tag(first.kernel.variant.name(), first.splits);
        if let Some(saved) = PROGRESS.load(device, &key, &incumbent) {
            state.resume(saved);
        }
        state.saved = state.milestones();
        // Only what is left to measure: a finished candidate compiles if it wins.
        background::compile(
            device,
            state.cands[1..]
                .iter()
                .filter(|c| c.status == Status::Unchecked)
                .map(|c| plan_of(p, c).kernel)
                .collect(),
        );
        Arc::new(Explorer {
            key,
            state: Mutex::new(state),
        })
    }

    /// Where the exploration stands, in a line: candidates live (with their pairs),
    /// unchecked, being checked, and out, and the class's calls so far.
    pub(crate) fn summary(&self) -> String {
        let s = self.state.locked();
        let count = |st: Status| s.cands.iter().filter(|c| c.status == st).count();
        let pairs: Vec<usize> = s.cands[1..]
            .iter()
            .filter(|c| c.status == Status::Live)
            .map(|c| c.ratios.len())
            .collect();
        format!(
            "{}: live {} (pairs {pairs:?}), unchecked {}, checking {}, out {}, {} calls, {} \
             pending",
            self.key,
            pairs.len(),
            count(Status::Unchecked),
            count(Status::Checking),
            count(Status::Out),
            s.calls,
            s.pending.len()
        )
    }

    /// Releases the timers of pairs never collected (the device is going away, idle).
    pub(crate) fn discard(&self, ctx: &helios_vk::Context) {
        for p in std::mem::take(&mut self.state.locked().pending) {
            let _ = ctx.gpu_elapsed(p.real);
            let _ = ctx.gpu_elapsed(p.shadow);
        }
    }

    /// The settled winner (variant, splits), if any.
    pub(crate) fn winner(&self) -> Option<(MatmulVariant, u32)> {
        let s = self.state.locked();
        s.winner.map(|w| (s.cands[w].variant, s.cands[w].splits))
    }

    /// The plan real calls of `p` run: the winner once settled, the incumbent until then
    /// (or its stand-in while its native kernel is JIT-compiled: `stand_in`).
    pub(crate) fn current(&self, p: &Problem) -> Plan {
        self.state.locked().real_plan(p).0
    }

    /// Collects finished pairs, then decides what this call of `p` runs.
    pub(crate) fn next(&self, p: &Problem) -> Result<Action> {
        let mut s = self.state.locked();
        s.calls += 1;
        s.collect(p.a.device())?;
        if s.winner.is_none() {
            s.advance(p, &self.key);
        }
        if s.winner.is_none() {
            s.save_if_moved(p.a.device(), &self.key);
        }
        let (real, standing_in) = s.real_plan(p);
        // A pair's ratio is over the incumbent's time: none while a stand-in runs.
        if s.winner.is_some() || standing_in || !warm(p.a.device()) {
            return Ok(Action { real, shadow: None });
        }
        let busy = |s: &State, c: usize| s.pending.iter().any(|q| q.cand == c);
        // A first shadow for the next unchecked candidate that is compiled, else a pair for
        // the live one with the fewest (round robin: every candidate sees the same moments).
        let mut pick: Option<(usize, bool)> = None;
        for c in 1..s.cands.len() {
            let cand = &s.cands[c];
            let check = cand.status == Status::Unchecked;
            let wants = check || (cand.status == Status::Live && cand.ratios.len() < SAMPLES);
            let better = match pick {
                None => true,
                Some((_, true)) => false,
                Some((t, false)) => check || cand.ratios.len() < s.cands[t].ratios.len(),
            };
            if !wants || !better || busy(&s, c) {
                continue;
            }
            let plan = plan_of(p, cand);
            match s.compiled(p, &plan) {
                Compiled::Yes => pick = Some((c, check)),
                Compiled::Waiting => {}
                Compiled::Failed => s.cands[c].status = Status::Out,
            }
        }
        let Some((c, check)) = pick else {
            return Ok(Action { real, shadow: None });
        };
        // The shadow costs about what the incumbent does.
        let estimate = match s.incumbent_us.is_empty() {
            true => FIRST_ESTIMATE_US,
            false => median(&s.incumbent_us),
        };
        if !spend(p.a.device(), estimate) {
            return Ok(Action { real, shadow: None });
        }
        if check {
            s.cands[c].status = Status::Checking;
        }
        Ok(Action {
            real,
            shadow: Some((c, plan_of(p, &s.cands[c]), check, estimate)),
        })
    }

    /// Records `action` for `p` into `out` (a dense tensor of the output's shape).
    pub(crate) fn run(&self, p: &Problem, action: Action, out: &Tensor) -> Result<()> {
        let Some((cand, plan, check, charged_us)) = action.shadow else {
            return p.run_into(&action.real, out);
        };
        let ctx = p.a.device().context();
        #[allow(unused_mut)]
        let mut shadow = p.shadow()?;
        #[cfg(test)]
        if tests::SABOTAGED.locked().contains(&p.a.device().id()) {
            shadow.alpha *= 1.5;
        }
        let scratch = shadow.output()?;
        // Operands still pending are recorded now, outside the timed spans.
        p.realize_operands()?;
        shadow.realize_operands()?;
        out.buffer()?;
        scratch.buffer()?;
        // One batch for both spans and the copies: collecting the pair never waits.
        let _hold = ctx.hold_submits();
        let (ran, real) = fenced(ctx, || p.run_into(&action.real, out))?;
        if let Err(e) = ran {
            // The timer is released before the error goes up (a flush and a wait: a rare path).
            let _ = ctx.gpu_elapsed(real);
            return Err(e);
        }
        let (ran, shadow_span) = fenced(ctx, || shadow.run_into(&plan, &scratch))?;
        let check = match (&ran, check) {
            (Ok(()), true) => {
                let (regions, rows) = check_rows(p, out);
                Some(Check {
                    real: ctx.snapshot(out.buffer()?, &regions)?,
                    shadow: ctx.snapshot(scratch.buffer()?, &regions)?,
                    rows,
                    out: p.out,
                })
            }
            _ => None,
        };
        let mut s = self.state.locked();
        if ran.is_err() {
            s.cands[cand].status = Status::Out;
        }
        s.pending.push(Pending {
            cand,
            real,
            shadow: shadow_span,
            check,
            charged_us,
        });
        Ok(())
    }
}

impl State {
    /// Takes up a class's exploration where an earlier process left it
    /// (`ops::tuning_progress`): its candidates' standings, the split round if it had begun,
    /// and the incumbent's time.
    fn resume(&mut self, saved: Progress) {
        for (tag, standing) in saved.cands {
            let Some((variant, splits)) = parse_tag(&tag) else {
                continue;
            };
            let at = self
                .cands
                .iter()
                .position(|c| (c.variant, c.splits) == (variant, splits));
            let c = match at {
                Some(0) => continue,
                Some(c) => c,
                // A split candidate: the round had begun.
                None if splits > 1 => {
                    self.splits_added = true;
                    self.cands.push(Cand {
                        variant,
                        splits,
                        status: Status::Unchecked,
                        ratios: Vec::new(),
                    });
                    self.cands.len() - 1
                }
                // A plain candidate this build no longer times for the class.
                None => continue,
            };
            let cand = &mut self.cands[c];
            (cand.status, cand.ratios) = match standing {
                Standing::New => (Status::Unchecked, Vec::new()),
                Standing::Out => (Status::Out, Vec::new()),
                // Checked against the real output again unless fully measured.
                Standing::Ratios(r) if r.len() >= SAMPLES => (Status::Live, r),
                Standing::Ratios(r) => (Status::Unchecked, r),
            };
        }
        if saved.incumbent_us > 0.0 {
            self.incumbent_us.push(saved.incumbent_us);
        }
    }

    /// What a save records progress at: candidates out, candidates fully measured, and
    /// candidates in all (the split round adds some).
    fn milestones(&self) -> (usize, usize, usize) {
        let out = self
            .cands
            .iter()
            .filter(|c| c.status == Status::Out)
            .count();
        let done = self.cands[1..]
            .iter()
            .filter(|c| c.status == Status::Live && c.ratios.len() >= SAMPLES)
            .count();
        (out, done, self.cands.len())
    }

    /// Saves the exploration when a milestone moved since the last save (a few dozen
    /// writes of one short line per class, not one per pair).
    fn save_if_moved(&mut self, device: &crate::Device, key: &str) {
        let now = self.milestones();
        if now == self.saved {
            return;
        }
        self.saved = now;
        PROGRESS.save(device, key, &self.progress());
    }

    /// The exploration as `ops::tuning_progress` saves it.
    fn progress(&self) -> Progress {
        let standing = |c: &Cand| match c.status {
            Status::Out => Standing::Out,
            _ if c.ratios.is_empty() => Standing::New,
            _ => Standing::Ratios(c.ratios.clone()),
        };
        let tag = |c: &Cand| winner_tag(c.variant.name(), c.splits);
        Progress {
            incumbent: tag(&self.cands[0]),
            incumbent_us: match self.incumbent_us.is_empty() {
                true => 0.0,
                false => median(&self.incumbent_us),
            },
            cands: self.cands[1..]
                .iter()
                .map(|c| (tag(c), standing(c)))
                .collect(),
        }
    }

    /// `compiled`, remembered: a kernel found compiled stays so, and one not yet is asked
    /// again only once a background compile has finished or `ASK_AGAIN` has passed (a split's
    /// sum kernel compiles elsewhere). Asking takes locks and hashes, and a fresh class asks
    /// for each of its ~20 candidates on every call: in a fresh GPT-2 run's second step that
    /// was most of ~0.2 s of recording (bench/results/2026-11-30-session48-h200.md).
    fn compiled(&mut self, p: &Problem, plan: &Plan) -> Compiled {
        let key = (plan.kernel, plan.splits);
        let generation = background::generation();
        match self.seen.get(&key) {
            Some(None) => return Compiled::Yes,
            Some(Some((g, at))) if *g == generation && at.elapsed() < ASK_AGAIN => {
                return Compiled::Waiting
            }
            _ => {}
        }
        let asked = std::time::Instant::now();
        let answer = compiled(p, plan);
        match answer {
            Compiled::Yes => self.seen.insert(key, None),
            Compiled::Waiting => self.seen.insert(key, Some((generation, asked))),
            Compiled::Failed => self.seen.remove(&key),
        };
        answer
    }

    /// The plan real calls of `p` run, and whether it stands in for the incumbent: the
    /// winner once settled and compiled for `p` (a problem of the class the shadows never
    /// ran may need other vector widths: queued meanwhile), else the incumbent, or its
    /// stand-in until its native kernel is compiled. So switching to the winner never makes
    /// a submit wait, nor does a cold driver's JIT.
    fn real_plan(&self, p: &Problem) -> (Plan, bool) {
        if let Some(w) = self.winner {
            let plan = plan_of(p, &self.cands[w]);
            if ready(p, &plan) {
                return (plan, false);
            }
        }
        let incumbent = plan_of(p, &self.cands[0]);
        match stand_in(p, &incumbent) {
            Some(plan) => (plan, true),
            None => (incumbent, false),
        }
    }

    /// Takes in every finished pair and comparison (never waits).
    fn collect(&mut self, device: &crate::Device) -> Result<()> {
        let ctx = device.context();
        let mut still = Vec::new();
        for mut p in std::mem::take(&mut self.pending) {
            let verdict = match &p.check {
                Some(c) => match (ctx.read_snapshot(&c.real)?, ctx.read_snapshot(&c.shadow)?) {
                    (Some(a), Some(b)) => {
                        Some(compare(&a, &b, &c.rows, c.out, matmul_bound(c.out)))
                    }
                    _ => {
                        still.push(p);
                        continue;
                    }
                },
                None => None,
            };
            // Both spans are in the batch of the snapshots, or of each other.
            let real = match ctx.gpu_elapsed_if_done(p.real)? {
                Ok(t) => t.as_secs_f64() * 1e6,
                Err(span) => {
                    p.real = span;
                    still.push(p);
                    continue;
                }
            };
            let shadow = ctx.gpu_elapsed(p.shadow)?.as_secs_f64() * 1e6;
            refund(device, p.charged_us, shadow);
            self.incumbent_us.push(real);
            let c = &mut self.cands[p.cand];
            c.status = match (c.status, verdict) {
                (Status::Out, _) => Status::Out,
                (_, Some(Verdict::Differ)) => Status::Out,
                // Real data with infinities or NaNs proves nothing: check again.
                (_, Some(Verdict::Inconclusive)) => Status::Unchecked,
                _ => Status::Live,
            };
            if c.status == Status::Live && real > 0.0 {
                c.ratios.push(shadow / real);
            }
        }
        self.pending = still;
        Ok(())
    }

    /// The live candidate (or the incumbent) with the lowest score.
    fn best(&self) -> usize {
        (0..self.cands.len())
            .filter(|&c| {
                c == 0 || (self.cands[c].status == Status::Live && !self.cands[c].ratios.is_empty())
            })
            .min_by(|&a, &b| {
                self.cands[a]
                    .score(a == 0)
                    .total_cmp(&self.cands[b].score(b == 0))
            })
            .unwrap_or(0)
    }

    /// Drops candidates well behind the best, adds the split round when the plain one is
    /// done, and settles when every candidate is measured.
    fn advance(&mut self, p: &Problem, key: &str) {
        let best = self.best();
        let top = self.cands[best].score(best == 0);
        for c in &mut self.cands[1..] {
            let fastest = c.ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let first = c.ratios.first().copied().unwrap_or(0.0);
            // Judged on two pairs at least; a gross loser on its first.
            let slow =
                (c.ratios.len() >= 2 && fastest > top * DROP_SLACK) || first > top * GROSS_SLACK;
            if c.status == Status::Live && slow {
                c.status = Status::Out;
            }
        }
        let done = self.pending.is_empty()
            && self.cands[1..].iter().all(|c| match c.status {
                Status::Live => c.ratios.len() >= SAMPLES,
                Status::Out => true,
                Status::Unchecked | Status::Checking => false,
            });
        if !done {
            return;
        }
        if !self.splits_added {
            self.splits_added = true;
            let mut ranked: Vec<(MatmulVariant, f64)> = (0..self.cands.len())
                .filter(|&c| {
                    let cand = &self.cands[c];
                    cand.splits == 1 && (c == 0 || cand.status == Status::Live)
                })
                .map(|c| (self.cands[c].variant, self.cands[c].score(c == 0)))
                .collect();
            ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
            let known: Vec<(MatmulVariant, u32)> =
                self.cands.iter().map(|c| (c.variant, c.splits)).collect();
            let splits: Vec<(MatmulVariant, u32, MatmulKernel)> = split_candidates(p, &ranked)
                .into_iter()
                .filter(|(v, s, _)| !known.contains(&(*v, *s)))
                .collect();
            if !splits.is_empty() {
                background::compile(p.a.device(), splits.iter().map(|s| s.2).collect());
                self.cands
                    .extend(splits.into_iter().map(|(variant, splits, _)| Cand {
                        variant,
                        splits,
                        status: Status::Unchecked,
                        ratios: Vec::new(),
                    }));
                return;
            }
        }
        let best = self.best();
        self.winner = Some(best);
        let c = &self.cands[best];
        let us = median(&self.incumbent_us) * c.score(best == 0);
        let tag = winner_tag(c.variant.name(), c.splits);
        store(p.a.device(), key, &tag, us);
        if crate::env::verbose() {
            eprintln!(
                "helios: matmul tuned {key} on real work: {tag} {us:.1} µs, {:.2}x the first \
                 choice ({} candidates, {} calls)",
                c.score(best == 0),
                self.cands.len(),
                self.calls
            );
        }
    }
}

#[cfg(test)]
pub(super) mod tests;
