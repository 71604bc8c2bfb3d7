//! Tuning on real work: a shape class without a stored winner runs its first choice at once,
//! and its other candidates are timed on the products the program computes anyway.
//!
//! The one decision a reader must know: a candidate's results never reach the program
//! before they have matched the incumbent's. Its first run is a shadow: the incumbent writes
//! the real output, the candidate the same product into a scratch tensor, and rows of both
//! are copied aside and compared once the GPU is done. Only then may the candidate compute
//! real outputs, each such run timed between two GPU timestamps, fenced off from its
//! neighbours. The host never waits for any of it: finished timings and comparisons are
//! collected on later calls of the class. Candidates compile on a background thread, and a
//! call whose kernel is not compiled yet simply runs the incumbent.
//!
//! A class explores its plain kernels first, drops any whose fastest run is well behind the
//! best median, then tries k splits of the leaders, as the offline tuner does (`tune`), and
//! settles on the lowest median of `SAMPLES` real runs: written to the same store, read by
//! every later process.

use std::sync::{Arc, Mutex};

use helios_kernels::{MatmulKernel, MatmulVariant, Triangle};
use helios_vk::{GpuSpan, Snapshot};

use super::background;
use super::cache::{store, winner_tag};
use super::caps::matmul_caps;
use super::tune::{split_candidates, timed_candidates};
use crate::ops::matmul::{Plan, Problem};
use crate::ops::online::{compare, fenced, median, warm, RowSample, Verdict};
use crate::realize_lock::LockExt;
use crate::{DType, Result, Tensor};

/// Real runs timed per candidate; its time is their median (the offline tuner's count).
const SAMPLES: usize = 3;

/// A candidate whose fastest of two runs or more is this many times the best median is
/// dropped.
const DROP_SLACK: f64 = 1.25;

/// A candidate whose first run takes this many times the best median so far is dropped at
/// once.
const GROSS_SLACK: f64 = 2.0;

/// Rows of the output compared between a candidate and the incumbent, at most (spread over
/// the whole output: first, last and evenly between), and their bytes at most.
const CHECK_ROWS: u64 = 16;
const CHECK_BYTES: u64 = 8 << 20;

/// One class's exploration (shared by every problem of the class).
pub(crate) struct Explorer {
    key: String,
    state: Mutex<State>,
}

struct State {
    /// `cands[0]` is the incumbent: the first choice, which real calls run meanwhile.
    cands: Vec<Cand>,
    pending: Vec<Pending>,
    splits_added: bool,
    winner: Option<usize>,
    /// Real calls of the class so far.
    calls: u64,
}

struct Cand {
    variant: MatmulVariant,
    splits: u32,
    status: Status,
    /// Per-run GPU times, µs.
    samples: Vec<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Compiled (or compiling), not yet compared with the incumbent.
    Unchecked,
    /// Its shadow run is on the GPU.
    Checking,
    /// Matched the incumbent: may compute real outputs.
    Live,
    /// Failed its comparison, could not run, or too slow.
    Out,
}

enum Pending {
    Time {
        cand: usize,
        span: GpuSpan,
    },
    Check {
        cand: usize,
        span: GpuSpan,
        real: Snapshot,
        shadow: Snapshot,
        rows: Vec<RowSample>,
        out: DType,
    },
}

/// What a call of an exploring class runs: `real` computes the output (timed as candidate
/// `timed` when set), and `shadow`, when set, a candidate beside it into scratch, timed and
/// compared with the real output.
pub(crate) struct Action {
    real: Plan,
    timed: Option<usize>,
    shadow: Option<(usize, Plan)>,
}

fn plan_of(p: &Problem, c: &Cand) -> Plan {
    let caps = matmul_caps(p.a.device());
    Plan {
        kernel: p.kernel(c.variant, caps.subgroup),
        splits: c.splits,
    }
}

/// The kernel a plan launches for `p` (a split plan's sub-problem kernel).
fn launched(p: &Problem, plan: &Plan) -> Option<MatmulKernel> {
    if plan.splits <= 1 {
        return Some(plan.kernel);
    }
    p.split(plan.kernel.variant, plan.splits, plan.kernel.subgroup)
        .map(|(_, k)| k)
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
    let Some(k) = launched(p, plan) else {
        return Compiled::Failed;
    };
    let device = p.a.device();
    if device.has_kernel(&crate::device::KernelKey::Matmul(k)) {
        Compiled::Yes
    } else if background::failed(device, &k) {
        Compiled::Failed
    } else {
        background::compile(device, vec![k]);
        Compiled::Waiting
    }
}

impl Explorer {
    /// Starts exploring `p`'s class from `first` (the incumbent): compiles the other
    /// candidates in the background.
    pub(crate) fn start(p: &Problem, key: String, first: Plan) -> Arc<Explorer> {
        let mut cands = vec![Cand {
            variant: first.kernel.variant,
            splits: first.splits,
            status: Status::Live,
            samples: Vec::new(),
        }];
        for k in timed_candidates(p) {
            if k.variant != first.kernel.variant || first.splits > 1 {
                cands.push(Cand {
                    variant: k.variant,
                    splits: 1,
                    status: Status::Unchecked,
                    samples: Vec::new(),
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
        background::compile(
            p.a.device(),
            cands[1..].iter().map(|c| plan_of(p, c).kernel).collect(),
        );
        Arc::new(Explorer {
            key,
            state: Mutex::new(State {
                cands,
                pending: Vec::new(),
                splits_added: false,
                winner: None,
                calls: 0,
            }),
        })
    }

    /// Where the exploration stands, in a line: candidates live (with their samples),
    /// unchecked, being checked, and out, and the class's calls so far.
    pub(crate) fn summary(&self) -> String {
        let s = self.state.locked();
        let count = |st: Status| s.cands.iter().filter(|c| c.status == st).count();
        let samples: Vec<usize> = s
            .cands
            .iter()
            .filter(|c| c.status == Status::Live)
            .map(|c| c.samples.len())
            .collect();
        format!(
            "{}: live {} (samples {samples:?}), unchecked {}, checking {}, out {}, {} calls, \
             {} pending",
            self.key,
            samples.len(),
            count(Status::Unchecked),
            count(Status::Checking),
            count(Status::Out),
            s.calls,
            s.pending.len()
        )
    }

    /// The settled winner (variant, splits), if any.
    pub(crate) fn winner(&self) -> Option<(MatmulVariant, u32)> {
        let s = self.state.locked();
        s.winner.map(|w| (s.cands[w].variant, s.cands[w].splits))
    }

    /// The plan real calls of `p` run while nothing is being measured: the best live
    /// candidate so far (the incumbent until another has its samples).
    pub(crate) fn current(&self, p: &Problem) -> Plan {
        let s = self.state.locked();
        plan_of(p, &s.cands[s.best().unwrap_or(0)])
    }

    /// Collects finished measurements, then decides what this call of `p` runs.
    pub(crate) fn next(&self, p: &Problem) -> Result<Action> {
        let ctx = p.a.device().context();
        let mut s = self.state.locked();
        s.calls += 1;
        s.collect(ctx)?;
        if s.winner.is_none() {
            s.advance(p, &self.key);
        }
        let best = plan_of(p, &s.cands[s.winner.or(s.best()).unwrap_or(0)]);
        let plain = Action {
            real: best,
            timed: None,
            shadow: None,
        };
        if s.winner.is_some() || !warm(p.a.device()) {
            return Ok(plain);
        }
        let busy = |s: &State, c: usize| {
            s.pending.iter().any(|q| match q {
                Pending::Time { cand, .. } | Pending::Check { cand, .. } => *cand == c,
            })
        };
        // Round robin over the live candidates still short of samples (the fewest first):
        // a drift of the GPU's clock then touches them all alike.
        let mut timed: Option<usize> = None;
        for c in 0..s.cands.len() {
            let cand = &s.cands[c];
            let wants = cand.status == Status::Live && cand.samples.len() < SAMPLES;
            let fewer = timed.map_or(true, |t| cand.samples.len() < s.cands[t].samples.len());
            if !wants || !fewer || busy(&s, c) {
                continue;
            }
            match compiled(p, &plan_of(p, cand)) {
                Compiled::Yes => timed = Some(c),
                Compiled::Waiting => {}
                Compiled::Failed => s.cands[c].status = Status::Out,
            }
        }
        let mut shadow = None;
        for c in 1..s.cands.len() {
            if s.cands[c].status != Status::Unchecked {
                continue;
            }
            match compiled(p, &plan_of(p, &s.cands[c])) {
                Compiled::Yes => {
                    shadow = Some(c);
                    break;
                }
                Compiled::Waiting => {}
                Compiled::Failed => s.cands[c].status = Status::Out,
            }
        }
        if let Some(c) = shadow {
            s.cands[c].status = Status::Checking;
        }
        Ok(Action {
            real: timed.map_or(best, |c| plan_of(p, &s.cands[c])),
            timed,
            shadow: shadow.map(|c| (c, plan_of(p, &s.cands[c]))),
        })
    }

    /// Records `action` for `p` into `out` (a dense tensor of the output's shape).
    pub(crate) fn run(&self, p: &Problem, action: Action, out: &Tensor) -> Result<()> {
        let ctx = p.a.device().context();
        if action.timed.is_none() && action.shadow.is_none() {
            return p.run_into(&action.real, out);
        }
        // Operands still pending are recorded now, outside the timed spans.
        p.realize_operands()?;
        out.buffer()?;
        if let Some(cand) = action.timed {
            let (ran, span) = fenced(ctx, || p.run_into(&action.real, out))?;
            let mut s = self.state.locked();
            s.pending.push(Pending::Time { cand, span });
            if ran.is_err() {
                // The incumbent writes the output instead, and no shadow compares with it.
                s.cands[cand].status = Status::Out;
                let incumbent = plan_of(p, &s.cands[0]);
                if let Some((c, _)) = action.shadow {
                    s.cands[c].status = Status::Unchecked;
                }
                drop(s);
                return p.run_into(&incumbent, out);
            }
        } else {
            p.run_into(&action.real, out)?;
        }
        let Some((cand, plan)) = action.shadow else {
            return Ok(());
        };
        #[allow(unused_mut)]
        let mut shadow = p.shadow()?;
        #[cfg(test)]
        if tests::SABOTAGED.locked().contains(&p.a.device().id()) {
            shadow.alpha *= 1.5;
        }
        let scratch = shadow.output()?;
        shadow.realize_operands()?;
        scratch.buffer()?;
        let (ran, span) = fenced(ctx, || shadow.run_into(&plan, &scratch))?;
        let (regions, rows) = check_rows(p, out);
        let pending = match ran {
            Ok(()) => Pending::Check {
                cand,
                span,
                real: ctx.snapshot(out.buffer()?, &regions)?,
                shadow: ctx.snapshot(scratch.buffer()?, &regions)?,
                rows,
                out: p.out,
            },
            Err(_) => {
                self.state.locked().cands[cand].status = Status::Out;
                Pending::Time { cand, span }
            }
        };
        self.state.locked().pending.push(pending);
        Ok(())
    }
}

impl State {
    /// The live candidate with the lowest median so far.
    fn best(&self) -> Option<usize> {
        (0..self.cands.len())
            .filter(|&c| self.cands[c].status == Status::Live && !self.cands[c].samples.is_empty())
            .min_by(|&a, &b| {
                median(&self.cands[a].samples).total_cmp(&median(&self.cands[b].samples))
            })
    }

    /// Takes in every finished timing and comparison (never waits).
    fn collect(&mut self, ctx: &helios_vk::Context) -> Result<()> {
        let mut still = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            match p {
                Pending::Time { cand, span } => match ctx.gpu_elapsed_if_done(span)? {
                    Ok(t) => self.cands[cand].samples.push(t.as_secs_f64() * 1e6),
                    Err(span) => still.push(Pending::Time { cand, span }),
                },
                Pending::Check {
                    cand,
                    span,
                    real,
                    shadow,
                    rows,
                    out,
                } => {
                    let (Some(a), Some(b)) =
                        (ctx.read_snapshot(&real)?, ctx.read_snapshot(&shadow)?)
                    else {
                        still.push(Pending::Check {
                            cand,
                            span,
                            real,
                            shadow,
                            rows,
                            out,
                        });
                        continue;
                    };
                    let t = match ctx.gpu_elapsed_if_done(span)? {
                        Ok(t) => t.as_secs_f64() * 1e6,
                        Err(span) => {
                            // Written in the same batch as the snapshots: done with them.
                            ctx.gpu_elapsed(span)?.as_secs_f64() * 1e6
                        }
                    };
                    let c = &mut self.cands[cand];
                    c.status = match compare(&a, &b, &rows, out, matmul_bound(out)) {
                        Verdict::Match => {
                            c.samples.push(t);
                            Status::Live
                        }
                        Verdict::Differ => Status::Out,
                        // Real data with infinities or NaNs proves nothing: check again.
                        Verdict::Inconclusive => Status::Unchecked,
                    };
                }
            }
        }
        self.pending = still;
        Ok(())
    }

    /// Drops candidates well behind the best, adds the split round when the plain one is
    /// done, and settles when every candidate is measured.
    fn advance(&mut self, p: &Problem, key: &str) {
        // Judged on two runs at least: one slow run (a clock dip, a neighbour) drops nothing.
        let judged = |c: &Cand| c.status == Status::Live && c.samples.len() >= 2;
        let bar = self
            .cands
            .iter()
            .filter(|c| judged(c))
            .map(|c| median(&c.samples))
            .fold(f64::INFINITY, f64::min)
            * DROP_SLACK;
        // A gross loser goes on its first run: each more would cost the program its time.
        let first = self
            .cands
            .iter()
            .filter(|c| c.status == Status::Live && !c.samples.is_empty())
            .map(|c| median(&c.samples))
            .fold(f64::INFINITY, f64::min)
            * GROSS_SLACK;
        for c in &mut self.cands {
            let fastest = c.samples.iter().copied().fold(f64::INFINITY, f64::min);
            if (judged(c) && fastest > bar) || (c.status == Status::Live && fastest > first) {
                c.status = Status::Out;
            }
        }
        let done = self.pending.is_empty()
            && self.cands.iter().all(|c| match c.status {
                Status::Live => c.samples.len() >= SAMPLES,
                Status::Out => true,
                Status::Unchecked | Status::Checking => false,
            });
        if !done {
            return;
        }
        if !self.splits_added {
            self.splits_added = true;
            let mut ranked: Vec<(MatmulVariant, f64)> = self
                .cands
                .iter()
                .filter(|c| c.status == Status::Live && c.splits == 1)
                .map(|c| (c.variant, median(&c.samples)))
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
                        samples: Vec::new(),
                    }));
                return;
            }
        }
        let best = self.best().unwrap_or(0);
        self.winner = Some(best);
        let c = &self.cands[best];
        let us = median(&c.samples);
        let tag = winner_tag(c.variant.name(), c.splits);
        store(p.a.device(), key, &tag, us);
        if crate::env::verbose() {
            let tried = self.cands.len();
            eprintln!(
                "helios: matmul tuned {key} on real work: {tag} {us:.1} µs ({tried} candidates, \
                 {} calls)",
                self.calls
            );
        }
    }
}

/// Byte ranges of `out` to compare (rows spread over every batch matrix) and what they hold.
fn check_rows(p: &Problem, out: &Tensor) -> (Vec<(u64, u64)>, Vec<RowSample>) {
    let s = &p.shape;
    let size = p.out.size() as u64;
    let n = u64::from(s.n);
    let m = u64::from(s.m).max(1);
    let total = m * u64::from(s.batch);
    let row_bytes = (n * size).max(1);
    let count = CHECK_ROWS.min((CHECK_BYTES / row_bytes).max(1)).min(total);
    let base = (out.layout().offset() * p.out.size()) as u64;
    // Where row r of the batch of matrices starts, in elements (see `MatmulShape`).
    let start = |r: u64| {
        let (bi, row) = (r / m, r % m);
        let inner = u64::from(s.inner.max(1));
        let batch = (bi / inner) * u64::from(s.stride_c)
            + match inner {
                1 => 0,
                _ => (bi % inner) * u64::from(s.inner_c),
            };
        batch + row * u64::from(s.ldc)
    };
    let mut picked: Vec<u64> = (0..count)
        .map(|i| match count {
            1 => 0,
            _ => i * (total - 1) / (count - 1),
        })
        .collect();
    picked.dedup();
    let regions = picked
        .iter()
        .map(|&r| (base + start(r) * size, n * size))
        .collect();
    let rows = picked
        .iter()
        .map(|&r| RowSample {
            row: match p.triangle {
                Triangle::LowerC => (r % m) as u32,
                _ => u32::MAX,
            },
            len: n as u32,
        })
        .collect();
    (regions, rows)
}

/// How far a candidate's rows may be from the incumbent's: four times the tests' tolerance
/// for the dtype (each kernel is within one of the exact product), and for f32 at least
/// 1e-4 (long sums in another order differ by more than the tests' short ones).
fn matmul_bound(out: DType) -> f64 {
    let bound = 4.0 * crate::cpu::matmul::tolerance(out);
    match out {
        DType::F32 => bound.max(1e-4),
        _ => bound,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ops::matmul_tune::choose::TEST_TUNING;
    use crate::ops::matmul_tune::Tuning;
    use crate::Device;

    /// Devices whose candidates compute a wrong product in their shadow runs.
    pub(in crate::ops::matmul_tune) static SABOTAGED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

    fn random(device: &Device, shape: &[usize], seed: u64) -> (Tensor, Vec<f32>) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let v: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        (Tensor::from_slice(device, &v, shape).expect("upload"), v)
    }

    /// Calls `a · b` until its class settles (at most `limit` calls), checking every result
    /// against the f64 reference; returns the calls and the final choice.
    fn explore_until_settled(
        device: &Device,
        (m, n, k): (usize, usize, usize),
        limit: usize,
    ) -> (usize, crate::MatmulChoice) {
        let (a, av) = random(device, &[m, k], 11);
        let (b, bv) = random(device, &[k, n], 12);
        let key = super::super::cache::class_key(
            &Problem::new(&a, &b, &Default::default()).expect("problem"),
        );
        super::super::cache::forget(device, &key);
        let want = crate::cpu::matmul::matmul(
            &av,
            &bv,
            &crate::cpu::matmul::MatmulRef {
                batch: 1,
                m,
                n,
                k,
                alpha: 1.0,
                bias: None,
                act: helios_kernels::Activation::None,
                residual: None,
                act_grad: helios_kernels::Activation::None,
            },
        );
        let opts = crate::MatmulOptions::default();
        for call in 1..=limit {
            let got = a.matmul(&b).expect("product").to_vec().expect("read");
            let err = crate::cpu::matmul::relative_error(&got, &want);
            assert!(err <= 1e-5, "call {call}: relative error {err:.2e}");
            // The candidates' compiles run on their own thread; a real program goes on
            // with the incumbent meanwhile, a test waits to keep its call count short.
            super::background::wait_idle();
            let choice = a.matmul_choice(&b, &opts).expect("choice");
            if choice.how == crate::Choice::Tuned {
                return (call, choice);
            }
        }
        panic!("the class did not settle in {limit} calls");
    }

    /// A class explores on real calls (every result right meanwhile), settles on one of its
    /// candidates, stays there, and the winner is on disk for the next process.
    #[test]
    fn a_class_explores_settles_and_persists() {
        let device = Device::from_env().expect("a Vulkan device");
        TEST_TUNING.locked().push((device.id(), Tuning::Online));
        let (calls, choice) = explore_until_settled(&device, (72, 40, 56), 200);
        eprintln!("settled after {calls} calls on {}", choice.label());
        assert!(
            calls > 3,
            "settled after {calls} calls: nothing was explored"
        );
        let (a, _) = random(&device, &[72, 56], 1);
        let (b, _) = random(&device, &[56, 40], 2);
        let p = Problem::new(&a, &b, &Default::default()).expect("problem");
        let key = super::super::cache::class_key(&p);
        let stored = super::super::cache::cached(&device, &key).expect("a stored winner");
        assert_eq!((stored.0, stored.1), (choice.variant, choice.splits));
        let again = a.matmul_choice(&b, &Default::default()).expect("choice");
        assert_eq!(again.how, crate::Choice::Tuned, "it stays settled");
        assert_eq!(again.kernel, choice.kernel);
        super::super::cache::forget(&device, &key);
        let messages = device.validation_messages();
        assert!(messages.is_empty(), "validation: {messages:?}");
    }

    /// Candidates whose shadow results differ from the incumbent's never compute a real
    /// output, and the class settles on the incumbent.
    #[test]
    fn a_candidate_that_differs_is_never_chosen() {
        let device = Device::from_env().expect("a Vulkan device");
        TEST_TUNING.locked().push((device.id(), Tuning::Online));
        SABOTAGED.locked().push(device.id());
        let (a, _) = random(&device, &[88, 64], 3);
        let (b, _) = random(&device, &[64, 24], 4);
        let p = Problem::new(&a, &b, &Default::default()).expect("problem");
        let first = crate::ops::matmul_tune::choose::first_choice(&p);
        let (_, choice) = explore_until_settled(&device, (88, 24, 64), 200);
        assert_eq!(choice.variant, first.kernel.variant, "the incumbent stays");
        assert_eq!(choice.splits, first.splits);
        super::super::cache::forget(&device, &super::super::cache::class_key(&p));
        let messages = device.validation_messages();
        assert!(messages.is_empty(), "validation: {messages:?}");
    }
}
