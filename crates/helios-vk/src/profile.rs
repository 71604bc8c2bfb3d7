//! GPU time per kernel from timestamp queries (`HELIOS_PROFILE=1`).
//!
//! The encoder brackets each dispatch with `begin`/`end` (two timestamps in the command
//! buffer it records), tags the spans of a batch with the batch's timeline value on submit
//! (`submitted`), and hands the completed timeline value to `collect`, which reads finished
//! spans without waiting and adds them to a per-kernel table (`report`).
//!
//! Key decisions:
//! - Both timestamps are written at COMPUTE_SHADER: a timestamp there is written once all
//!   earlier commands have finished their compute work, so a span is the time from the end of
//!   the previous dispatch to the end of this one. Spans tile the GPU timeline without
//!   overlapping, so shares add up to 100% even where independent dispatches run together.
//! - Queries live in a ring of pools of `QUERIES_PER_POOL`. A pool is reset with
//!   vkCmdResetQueryPool in the command buffer that takes it, right before its first
//!   timestamp (query operations on one queue execute in submission order, so no barrier is
//!   needed), and goes back to the ring only when every span in it has been read. The ring
//!   grows on demand up to `MAX_POOLS`; past that, `begin` returns `None` and the span is
//!   counted as dropped, so a caller that never collects cannot grow memory without bound.
//! - One recording stream per Context (the encoder's): `submitted` tags every span ended
//!   since the previous call, in order.

use crate::sync::LockExt;
use ash::vk;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;

use crate::caps::Caps;
use crate::error::{vk_err, Error, Result};

/// `HELIOS_PROFILE=1` turns on GPU timestamps around every dispatch.
pub const HELIOS_PROFILE: &str = "HELIOS_PROFILE";
/// Queries per pool: 2048 spans.
pub const QUERIES_PER_POOL: u32 = 4096;
/// Pools the ring may grow to (256 KiB of queries on the device at 8 bytes each).
pub const MAX_POOLS: usize = 64;

/// One dispatch being timed: returned by [`Profiler::begin`], consumed by [`Profiler::end`].
#[must_use = "pass the span to Profiler::end after the dispatch"]
#[derive(Debug)]
pub struct Span {
    pool: usize,
    /// Index of the begin timestamp; the end timestamp is `query + 1`.
    query: u32,
    name: u32,
    /// The command buffer of the begin timestamp; the end must go into the same one.
    cb: vk::CommandBuffer,
    /// The stage both timestamps are written at.
    stage: vk::PipelineStageFlags,
}

/// A span whose two timestamps are recorded; read back once its batch completes.
#[derive(Clone, Copy, Debug)]
struct Pending {
    /// Timeline value of its batch; 0 until `submitted`.
    value: u64,
    pool: usize,
    query: u32,
    name: u32,
}

struct Pool {
    raw: vk::QueryPool,
    /// Queries handed out since the last reset.
    used: u32,
    /// Ended spans not yet read back.
    outstanding: u32,
    /// Its reset was recorded into the batch still being recorded.
    reset_unsubmitted: bool,
    in_free_list: bool,
}

#[derive(Clone, Copy, Debug)]
struct KernelStats {
    count: u64,
    total_ns: u64,
    min_ns: u64,
    max_ns: u64,
}

#[derive(Default)]
struct State {
    pools: Vec<Pool>,
    free: Vec<usize>,
    /// The pool `begin` takes queries from.
    active: Option<usize>,
    /// Interned kernel names: `names[id]`, and the reverse map.
    names: Vec<String>,
    ids: HashMap<String, u32>,
    /// Spans in recording order; the last `untagged` have no timeline value yet.
    pending: VecDeque<Pending>,
    untagged: usize,
    last_value: u64,
    /// By name id; `None` for names seen in `begin` but never read back.
    stats: Vec<Option<KernelStats>>,
    dropped: u64,
}

/// Per-Context GPU timestamp profiler. All methods take `&self`; state is behind a lock.
pub struct Profiler {
    device: ash::Device,
    /// Nanoseconds per timestamp tick (VkPhysicalDeviceLimits::timestampPeriod).
    period_ns: f64,
    /// Low `timestampValidBits` bits set.
    mask: u64,
    state: Mutex<State>,
}

impl Profiler {
    /// A profiler for `queue_family`, or `None` (with a one-line note on stderr) where the
    /// queue family has no timestamps.
    pub(crate) fn new(
        device: &ash::Device,
        caps: &Caps,
        queue_family: u32,
    ) -> Result<Option<Self>> {
        let bits = caps
            .queue_families
            .iter()
            .find(|q| q.index == queue_family)
            .map_or(0, |q| q.timestamp_valid_bits);
        let period = f64::from(caps.limits.timestamp_period);
        if bits == 0 || period <= 0.0 {
            eprintln!(
                "helios: HELIOS_PROFILE ignored: {} has no timestamps on queue family {queue_family}",
                caps.name
            );
            return Ok(None);
        }
        let profiler = Profiler {
            device: device.clone(),
            period_ns: period,
            mask: valid_bits_mask(bits),
            state: Mutex::new(State::default()),
        };
        // One pool up front, so that a device that cannot make one fails here, loudly.
        let first = profiler.create_pool()?;
        let mut s = profiler.state.locked();
        s.pools.push(first);
        s.free.push(0);
        drop(s);
        Ok(Some(profiler))
    }

    /// Records the timestamp before a dispatch of `kernel_name` into `cb`. `None` when the
    /// ring is full (uncollected spans) or a pool could not be created: the dispatch is then
    /// simply not timed.
    ///
    /// # Safety
    /// `cb` must be a command buffer of this Context's device, recording, for the compute
    /// queue family, and outside any render pass. It must be submitted (then `submitted`
    /// called) or never submitted (then `discarded` called).
    pub unsafe fn begin(&self, cb: vk::CommandBuffer, kernel_name: &str) -> Option<Span> {
        self.begin_at(cb, kernel_name, vk::PipelineStageFlags::COMPUTE_SHADER)
    }

    /// `begin` with both timestamps at `stage` (BOTTOM_OF_PIPE around native launches, whose
    /// stage is unknown: the timestamp then waits for every earlier command).
    ///
    /// # Safety
    /// As for `begin`.
    pub(crate) unsafe fn begin_at(
        &self,
        cb: vk::CommandBuffer,
        kernel_name: &str,
        stage: vk::PipelineStageFlags,
    ) -> Option<Span> {
        let mut s = self.state.locked();
        let pool = match s.active {
            Some(p) if s.pools[p].used + 2 <= QUERIES_PER_POOL => p,
            _ => self.take_pool(&mut s, cb)?,
        };
        let name = s.intern(kernel_name);
        let p = &mut s.pools[pool];
        let query = p.used;
        p.used += 2;
        self.device.cmd_write_timestamp(cb, stage, p.raw, query);
        Some(Span {
            pool,
            query,
            name,
            cb,
            stage,
        })
    }

    /// Records the timestamp after the dispatch that `span` began.
    ///
    /// # Safety
    /// As for `begin`; `cb` must be the command buffer `span` was begun in.
    #[track_caller]
    pub unsafe fn end(&self, cb: vk::CommandBuffer, span: Span) {
        debug_assert_eq!(
            cb, span.cb,
            "a span must end in the command buffer it began in"
        );
        let mut s = self.state.locked();
        let p = &mut s.pools[span.pool];
        p.outstanding += 1;
        self.device
            .cmd_write_timestamp(cb, span.stage, p.raw, span.query + 1);
        s.pending.push_back(Pending {
            value: 0,
            pool: span.pool,
            query: span.query,
            name: span.name,
        });
        s.untagged += 1;
    }

    /// Tags every span ended since the previous `submitted`/`discarded` with the timeline
    /// value its batch signals. Call right after the batch's vkQueueSubmit succeeded.
    #[track_caller]
    pub fn submitted(&self, timeline_value: u64) {
        let mut s = self.state.locked();
        debug_assert!(
            timeline_value > s.last_value,
            "timeline values must increase"
        );
        s.last_value = timeline_value;
        let n = s.untagged;
        let len = s.pending.len();
        for p in s.pending.range_mut(len - n..) {
            p.value = timeline_value;
        }
        s.untagged = 0;
        for pool in &mut s.pools {
            pool.reset_unsubmitted = false;
        }
    }

    /// Forgets the spans recorded since the previous `submitted`: their command buffer was
    /// thrown away unsubmitted (a recording error). Pools whose reset was in it are reset again
    /// on next use.
    pub fn discarded(&self) {
        let mut s = self.state.locked();
        let len = s.pending.len();
        let n = s.untagged;
        let dropped: Vec<Pending> = s.pending.drain(len - n..).collect();
        s.untagged = 0;
        for p in dropped {
            s.pools[p.pool].outstanding -= 1;
        }
        for i in 0..s.pools.len() {
            if std::mem::take(&mut s.pools[i].reset_unsubmitted) {
                // Every span since that reset was in the discarded batch.
                if s.active == Some(i) {
                    s.active = None;
                }
                s.release_if_idle(i);
            }
        }
    }

    /// Reads back every span whose batch's timeline value is `<= completed_value` and adds it
    /// to the table. Never waits: the timeline says those queries are written.
    pub fn collect(&self, completed_value: u64) -> Result<()> {
        let mut s = self.state.locked();
        let ready = s
            .pending
            .iter()
            .take_while(|p| p.value != 0 && p.value <= completed_value)
            .count();
        let mut done = 0;
        while done < ready {
            // A run: consecutive spans in one pool with adjacent queries, one read.
            let first = s.pending[done];
            let run = s
                .pending
                .range(done..ready)
                .enumerate()
                .take_while(|(i, p)| p.pool == first.pool && p.query == first.query + 2 * *i as u32)
                .count();
            let mut ticks = vec![0u64; 2 * run];
            // SAFETY: these queries were reset and written by batches that have completed.
            let read = unsafe {
                self.device.get_query_pool_results(
                    s.pools[first.pool].raw,
                    first.query,
                    &mut ticks,
                    vk::QueryResultFlags::TYPE_64,
                )
            };
            match read {
                Ok(()) => {}
                // Not written after all (a caller passed a value not yet reached): later.
                Err(vk::Result::NOT_READY) => break,
                Err(r) => return Err(Error::vk("vkGetQueryPoolResults", r)),
            }
            for (i, pair) in ticks.chunks_exact(2).enumerate() {
                let name = s.pending[done + i].name;
                let ns = ticks_to_ns(pair[0], pair[1], self.mask, self.period_ns);
                s.add(name, ns);
            }
            s.pools[first.pool].outstanding -= run as u32;
            s.release_if_idle(first.pool);
            done += run;
        }
        s.pending.drain(..done);
        Ok(())
    }

    /// The table so far, largest total first (call `collect` first for fresh numbers).
    pub fn report(&self) -> ProfileReport {
        let s = self.state.locked();
        let all_ns: u64 = s.stats.iter().flatten().map(|k| k.total_ns).sum();
        let mut rows: Vec<ProfileRow> = s
            .stats
            .iter()
            .enumerate()
            .filter_map(|(id, k)| {
                let k = (*k)?;
                Some(ProfileRow {
                    name: s.names[id].clone(),
                    count: k.count,
                    total_ns: k.total_ns,
                    mean_ns: k.total_ns as f64 / k.count as f64,
                    min_ns: k.min_ns,
                    max_ns: k.max_ns,
                    share: if all_ns == 0 {
                        0.0
                    } else {
                        k.total_ns as f64 / all_ns as f64
                    },
                })
            })
            .collect();
        rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));
        ProfileReport {
            rows,
            pending_spans: s.pending.len() as u64,
            dropped_spans: s.dropped,
        }
    }

    /// Clears the table and the dropped count; spans still in flight are kept.
    pub fn reset(&self) {
        let mut s = self.state.locked();
        s.stats.iter_mut().for_each(|k| *k = None);
        s.dropped = 0;
    }

    /// Query pools in the ring (for tests and `helios info`).
    pub fn query_pools(&self) -> usize {
        self.state.locked().pools.len()
    }

    /// Destroys the query pools.
    ///
    /// # Safety
    /// The device must be idle and the profiler unused afterwards.
    pub(crate) unsafe fn destroy(&self) {
        for pool in &self.state.locked().pools {
            self.device.destroy_query_pool(pool.raw, None);
        }
    }

    /// Makes a free (or new) pool active and records its reset into `cb`.
    unsafe fn take_pool(&self, s: &mut State, cb: vk::CommandBuffer) -> Option<usize> {
        if let Some(old) = s.active.take() {
            s.release_if_idle(old);
        }
        let index = match s.free.pop() {
            Some(i) => i,
            None if s.pools.len() < MAX_POOLS => match self.create_pool() {
                Ok(pool) => {
                    s.pools.push(pool);
                    s.pools.len() - 1
                }
                Err(_) => {
                    s.dropped += 1;
                    return None;
                }
            },
            None => {
                s.dropped += 1;
                return None;
            }
        };
        let p = &mut s.pools[index];
        self.device
            .cmd_reset_query_pool(cb, p.raw, 0, QUERIES_PER_POOL);
        p.used = 0;
        p.in_free_list = false;
        p.reset_unsubmitted = true;
        s.active = Some(index);
        Some(index)
    }

    fn create_pool(&self) -> Result<Pool> {
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(QUERIES_PER_POOL);
        // SAFETY: valid device and create info; destroyed in `destroy`.
        let raw = unsafe { self.device.create_query_pool(&info, None) }
            .map_err(vk_err("vkCreateQueryPool"))?;
        Ok(Pool {
            raw,
            used: 0,
            outstanding: 0,
            reset_unsubmitted: false,
            in_free_list: true,
        })
    }
}

impl State {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        self.stats.push(None);
        id
    }

    fn add(&mut self, name: u32, ns: u64) {
        let k = self.stats[name as usize].get_or_insert(KernelStats {
            count: 0,
            total_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        });
        k.count += 1;
        k.total_ns += ns;
        k.min_ns = k.min_ns.min(ns);
        k.max_ns = k.max_ns.max(ns);
    }

    /// Returns a pool to the ring once it is not active and holds no unread span.
    fn release_if_idle(&mut self, i: usize) {
        let p = &mut self.pools[i];
        if self.active != Some(i) && p.outstanding == 0 && !p.in_free_list {
            p.in_free_list = true;
            self.free.push(i);
        }
    }
}

/// GPU time of one span: masked to the valid bits (so a counter wrap still subtracts
/// right), converted with the timestamp period.
fn ticks_to_ns(begin: u64, end: u64, mask: u64, period_ns: f64) -> u64 {
    let ticks = end.wrapping_sub(begin) & mask;
    (ticks as f64 * period_ns).round() as u64
}

fn valid_bits_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Per-kernel GPU time, largest total first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileReport {
    pub rows: Vec<ProfileRow>,
    /// Spans recorded but not read back yet (batch not complete, or not collected).
    pub pending_spans: u64,
    /// Dispatches left untimed because the query ring was full.
    pub dropped_spans: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProfileRow {
    pub name: String,
    pub count: u64,
    pub total_ns: u64,
    pub mean_ns: f64,
    pub min_ns: u64,
    pub max_ns: u64,
    /// Fraction of all profiled GPU time, in [0, 1].
    pub share: f64,
}

impl ProfileReport {
    pub fn total_ns(&self) -> u64 {
        self.rows.iter().map(|r| r.total_ns).sum()
    }
}

impl fmt::Display for ProfileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .rows
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(0)
            .max("kernel".len());
        writeln!(
            f,
            "{:<width$}  {:>8}  {:>10}  {:>10}  {:>6}",
            "kernel", "count", "total ms", "mean µs", "share"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<width$}  {:>8}  {:>10.3}  {:>10.2}  {:>5.1}%",
                r.name,
                r.count,
                r.total_ns as f64 / 1e6,
                r.mean_ns / 1e3,
                r.share * 100.0
            )?;
        }
        let count: u64 = self.rows.iter().map(|r| r.count).sum();
        write!(
            f,
            "{:<width$}  {:>8}  {:>10.3}",
            "total",
            count,
            self.total_ns() as f64 / 1e6
        )?;
        if self.pending_spans > 0 || self.dropped_spans > 0 {
            write!(
                f,
                "\n({} spans pending, {} dropped: ring full)",
                self.pending_spans, self.dropped_spans
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_masked_and_scaled() {
        let mask = valid_bits_mask(36);
        assert_eq!(mask, (1 << 36) - 1);
        assert_eq!(valid_bits_mask(64), u64::MAX);
        assert_eq!(ticks_to_ns(100, 350, mask, 1.0), 250);
        // The 36-bit counter wrapped between the two timestamps.
        assert_eq!(ticks_to_ns(mask - 9, 10, mask, 1.0), 20);
        assert_eq!(ticks_to_ns(0, 3, u64::MAX, 41.67), 125);
    }

    #[test]
    fn report_table() {
        let report = ProfileReport {
            rows: vec![
                ProfileRow {
                    name: "matmul_f16".into(),
                    count: 4,
                    total_ns: 3_000_000,
                    mean_ns: 750_000.0,
                    min_ns: 700_000,
                    max_ns: 800_000,
                    share: 0.75,
                },
                ProfileRow {
                    name: "add".into(),
                    count: 10,
                    total_ns: 1_000_000,
                    mean_ns: 100_000.0,
                    min_ns: 90_000,
                    max_ns: 110_000,
                    share: 0.25,
                },
            ],
            pending_spans: 0,
            dropped_spans: 0,
        };
        let text = report.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("kernel"), "{text}");
        assert!(
            lines[1].starts_with("matmul_f16") && lines[1].contains("75.0%"),
            "{text}"
        );
        assert!(
            lines[1].contains("3.000") && lines[1].contains("750.00"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("total") && lines[3].contains("14"),
            "{text}"
        );
    }
}
