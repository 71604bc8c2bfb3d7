//! Hazard tracking: what the dispatches since the last barrier read and wrote, so that the
//! open batch (batch.rs) gets a barrier only where a new access overlaps an earlier write, or
//! writes over an earlier read.

/// What the tracker needs of one access: the pool region it touches, its absolute byte
/// range there, and whether it writes (batch.rs's `Access` of a buffer).
pub(crate) trait Touch {
    fn span(&self) -> (RegionKey, u64, u64);
    fn writes(&self) -> bool;
}

/// A pool region: (block id, offset of the region in the block); an exported allocation is
/// one key, (block id, 0), however many regions view it (`Buffer::hazard_key`).
pub(crate) type RegionKey = (u64, u64);

/// Bytes `[start, end)` of a block; empty when `start >= end`.
#[derive(Clone, Copy, Default)]
struct Cover {
    start: u64,
    end: u64,
}

impl Cover {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }

    fn extend(&mut self, start: u64, end: u64) {
        if self.start >= self.end {
            *self = Cover { start, end };
        } else {
            self.start = self.start.min(start);
            self.end = self.end.max(end);
        }
    }
}

/// What the dispatches since the last barrier read and wrote in one region, as covering
/// ranges: O(1) per access however many dispatches read the same tensor. Covering is
/// conservative (two disjoint writes to one region look like one), which can only add a
/// barrier, never miss one.
#[derive(Clone, Copy, Default)]
struct RegionUse {
    read: Cover,
    written: Cover,
}

/// Accesses since the last barrier, per pool region.
#[derive(Default)]
pub(crate) struct Hazards {
    /// FxHash: the keys are small integers and this map is hit on every dispatch.
    regions: rustc_hash::FxHashMap<RegionKey, RegionUse>,
}

impl Hazards {
    pub(crate) fn conflicts(&self, accesses: &[impl Touch]) -> bool {
        accesses.iter().any(|a| {
            let (key, start, end) = a.span();
            self.regions.get(&key).is_some_and(|u| {
                u.written.overlaps(start, end) || (a.writes() && u.read.overlaps(start, end))
            })
        })
    }

    pub(crate) fn add(&mut self, accesses: &[impl Touch]) {
        for a in accesses {
            let (key, start, end) = a.span();
            if start < end {
                let u = self.regions.entry(key).or_default();
                if a.writes() {
                    u.written.extend(start, end);
                } else {
                    u.read.extend(start, end);
                }
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.regions.clear();
    }
}
