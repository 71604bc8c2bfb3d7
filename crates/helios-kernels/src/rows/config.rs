//! Row tuning and the host-side choices: how invocations combine (`Reducer`), the knobs read
//! from the environment (`RowConfig`), and, for a row length, the invocations per row and
//! whether a softmax or norm row is cached in registers or streamed.

use crate::storage::Storage;

/// How invocations combine values (the choice `HELIOS_NO_SUBGROUP=1` flips).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reducer {
    /// Subgroup operations. `block` is the smallest subgroup size the device may use (a power
    /// of two); `whole` says every subgroup has exactly `block` invocations, so a block
    /// reduces with one subgroup reduction instead of a shuffle butterfly.
    Subgroup { block: u32, whole: bool },
    /// Shared memory and workgroup barriers only.
    SharedTree,
}

impl Reducer {
    /// A short tag for kernel names ("sg8", "sg32w", "tree").
    pub fn tag(self) -> String {
        match self {
            Reducer::Subgroup { block, whole } => {
                format!("sg{block}{}", if whole { "w" } else { "" })
            }
            Reducer::SharedTree => "tree".to_owned(),
        }
    }
}

/// Which candidate a row family (softmax, norms) runs; `Auto` leaves it to the family's
/// selection function (`HELIOS_ROWS=cached|streaming` forces one, for tuning and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RowVariant {
    #[default]
    Auto,
    /// The row lives in registers between its reductions: one read, one write.
    Cached,
    /// The row is streamed once per pass (long rows).
    Streaming,
}

/// Tuning knobs of the row kernels (reduce, softmax, norms), read from the environment once
/// per device (see `helios::env`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowConfig {
    pub variant: RowVariant,
    /// Slots (16-byte loads) per invocation per loop step (`HELIOS_ROW_UNROLL`; default 4,
    /// and [`stream_unroll`] for streamed softmax/norm rows): see [`RowConfig::unroll`].
    pub unroll: Option<u8>,
    /// Most slots per invocation a cached variant keeps in registers
    /// (`HELIOS_ROW_SLOTS`; default: the family's own).
    pub cached_slots: Option<u32>,
    /// Workgroups a split reduction aims for (`HELIOS_SPLIT_GROUPS`, default 2048).
    pub target_groups: u32,
    /// Workgroup size for every row kernel (`HELIOS_WG`; default: the family's own).
    pub workgroup: Option<u32>,
    /// Rows each group of the cached norm backward walks, accumulating dgamma/dbeta
    /// (`HELIOS_NORM_ROWS`; default `norm::norm_bwd_rows`).
    pub norm_rows: Option<u32>,
    /// Softmax and norm rows a multiple of 4 long run kernels without per-slot checks
    /// ([`Row::whole`](super::Row::whole); false keeps the checks, to measure them).
    pub whole_rows: bool,
}

/// Workgroup of a streamed softmax/norm row: long rows (a 50257 vocabulary) go through one
/// workgroup each, and a larger one keeps fewer rows in flight per SM, so the second pass
/// over a row finds it in L2. Faster than 256 for softmax and layernorm in f32 and bf16 on
/// the H200 at 4096×50257 (bench/results/2026-11-22-ops-h200-warm.md; figures in
/// bench/results/source-comment-history.md).
pub const STREAM_WORKGROUP: u32 = 1024;

/// Slots per invocation per loop step of a streamed row of `storage` (at
/// [`STREAM_WORKGROUP`]): 4 for f32, 2 for f16/bf16, each the faster on the H200 at
/// 4096×50257; 8 made the norm backward spill (bench/results/source-comment-history.md).
pub const fn stream_unroll(storage: Storage) -> u8 {
    if storage.bytes() >= 4 {
        4
    } else {
        2
    }
}

impl RowConfig {
    /// Slots per loop step of the reductions (`HELIOS_ROW_UNROLL`, else 4).
    pub fn unroll(&self) -> u8 {
        self.unroll.unwrap_or(4)
    }

    /// Slots per loop step of a streamed softmax/norm row of `storage` (`HELIOS_ROW_UNROLL`,
    /// else [`stream_unroll`]).
    pub fn stream_unroll(&self, storage: Storage) -> u8 {
        self.unroll.unwrap_or(stream_unroll(storage))
    }
}

/// A softmax/norm family's choice for one row length: the variant, invocations per row and
/// the workgroup size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowChoice<V> {
    pub variant: V,
    pub threads: u32,
    pub workgroup: u32,
}

/// Rows of `len` elements, `threads` invocations on each: what a softmax or norm launch lays
/// over its grid, kept together because every such launch checks and packs all three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLaunch {
    pub rows: u32,
    pub len: u32,
    pub threads: u32,
}

impl<V> RowChoice<V> {
    /// The same layout with the variant turned into a family's own.
    pub fn map<W>(self, f: impl FnOnce(V) -> W) -> RowChoice<W> {
        RowChoice {
            variant: f(self.variant),
            threads: self.threads,
            workgroup: self.workgroup,
        }
    }
}

impl Default for RowConfig {
    fn default() -> Self {
        RowConfig {
            variant: RowVariant::Auto,
            unroll: None,
            cached_slots: None,
            target_groups: 2048,
            workgroup: None,
            norm_rows: None,
            whole_rows: true,
        }
    }
}

/// Threads per row for a row of `slots` slots, `per_thread` slots per invocation, in a
/// workgroup of `workgroup`: the smallest power of two giving each at most `per_thread`,
/// capped at the workgroup.
pub fn threads_for(slots: u64, per_thread: u32, workgroup: u32) -> u32 {
    let want = slots.div_ceil(u64::from(per_thread.max(1))).max(1);
    let t = want.next_power_of_two().min(u64::from(workgroup));
    t as u32
}

/// How a softmax or norm row is laid over invocations (with the threads per row and the
/// workgroup in the [`RowChoice`] around it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowPlan {
    /// The row kept in registers: `slots` slots per invocation.
    Cached { slots: u8 },
    /// The row streamed (read more than once), `unroll` slots per invocation per step.
    Streaming { unroll: u8 },
}

/// The cached-or-streaming decision the row families share. `slots`: slots a row touches in
/// the cached layout; `stream_slots`: in the streaming one; `per`: the most slots per
/// invocation the cached variant keeps by default; `workgroup`: the family's own size;
/// `max_workgroup`: the device's largest power of two. `Cached` when the row fits in a
/// workgroup at `per` slots each (with the fewest invocations that do), else `Streaming` in a
/// workgroup of [`STREAM_WORKGROUP`] with `stream_unroll` slots of 4 per step;
/// `cfg.variant` forces one (cached only where a row fits in 16 slots per invocation) and
/// `cfg.workgroup` (`HELIOS_WG`) fixes the workgroup of both.
pub fn plan_row(
    slots: u64,
    stream_slots: u64,
    per: u32,
    cfg: &RowConfig,
    workgroup: u32,
    max_workgroup: u32,
    stream_unroll: u8,
) -> RowChoice<RowPlan> {
    let cached_wg = cfg.workgroup.unwrap_or(workgroup).min(max_workgroup);
    let w = u64::from(cached_wg);
    let streaming = || {
        let wg = cfg.workgroup.unwrap_or(STREAM_WORKGROUP).min(max_workgroup);
        let per = u32::from(stream_unroll) * 4;
        RowChoice {
            variant: RowPlan::Streaming {
                unroll: stream_unroll,
            },
            threads: threads_for(stream_slots, per, wg),
            workgroup: wg,
        }
    };
    let cached = |per: u32| {
        let threads = threads_for(slots, per, cached_wg);
        let slots = slots.div_ceil(u64::from(threads)).max(1) as u8;
        RowChoice {
            variant: RowPlan::Cached { slots },
            threads,
            workgroup: cached_wg,
        }
    };
    match cfg.variant {
        RowVariant::Streaming => streaming(),
        RowVariant::Cached if slots <= w * 16 => cached(per.max(slots.div_ceil(w) as u32)),
        _ if slots <= w * u64::from(per) => cached(per),
        _ => streaming(),
    }
}

/// Whether rows of `len` elements, back to back, cover whole 16-byte slots of 4 elements
/// (kernels built with [`Row::whole`](super::Row::whole) may then run), unless `cfg` turns
/// that off.
pub fn whole_rows(len: u64, cfg: &RowConfig) -> bool {
    cfg.whole_rows && len % 4 == 0
}

/// Slots a row of `len` elements touches at most, walked `vec` elements per slot, when rows
/// lie back to back (rows of a multiple of 4 are all aligned; others may touch one more).
pub fn row_slots(len: u64, vec: u8) -> u64 {
    if vec == 1 || len % 4 == 0 {
        len.div_ceil(u64::from(vec))
    } else {
        len / 4 + 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_per_row() {
        assert_eq!(threads_for(193, 4, 256), 64);
        assert_eq!(threads_for(192, 6, 256), 32);
        assert_eq!(threads_for(12566, 4, 256), 256);
        assert_eq!(threads_for(2, 4, 256), 1);
        assert_eq!(threads_for(0, 4, 256), 1);
        assert_eq!(row_slots(768, 4), 192);
        assert_eq!(row_slots(50257, 4), 12566);
        assert_eq!(row_slots(5, 4), 3);
        assert_eq!(row_slots(7, 1), 7);
    }
}
