//! Hazard tracking inside one command buffer: the byte ranges a batch's operations read
//! and wrote since the last barrier, so that a barrier goes in only where an operation
//! touches what an earlier one wrote (or writes what one read).

use std::collections::BTreeMap;
use std::ops::Range;

use helios_vk::Recorder;

/// A byte range of one buffer (named by its device address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub buffer: u64,
    pub bytes: Range<u64>,
}

impl Region {
    pub(crate) fn overlaps(&self, o: &Region) -> bool {
        self.buffer == o.buffer && self.bytes.start < o.bytes.end && o.bytes.start < self.bytes.end
    }
}

/// Regions read and written since the last barrier, each kept as a set of disjoint byte
/// intervals so that a batch of thousands of ops is checked in O(ops · log ops).
#[derive(Default)]
pub(crate) struct Hazards {
    reads: Intervals,
    writes: Intervals,
}

impl Hazards {
    /// Records a barrier first if reading `reads` and writing `write` would race with earlier
    /// work of this command buffer (RAW, WAR, WAW), then notes the accesses.
    pub fn before(&mut self, rec: &mut Recorder<'_>, reads: &[Region], write: Region) {
        let raw = reads.iter().any(|r| self.writes.overlaps(r));
        let waw_war = self.writes.overlaps(&write) || self.reads.overlaps(&write);
        if raw || waw_war {
            rec.barrier();
            *self = Hazards::default();
        }
        for r in reads {
            self.reads.insert(r);
        }
        self.writes.insert(&write);
    }
}

/// Disjoint intervals keyed by (buffer, start) → end; inserting merges overlapping ones.
#[derive(Default)]
struct Intervals(BTreeMap<(u64, u64), u64>);

impl Intervals {
    /// Of disjoint sorted intervals, only the last one starting before `r.end` can overlap r.
    fn overlaps(&self, r: &Region) -> bool {
        self.0
            .range((r.buffer, 0)..(r.buffer, r.bytes.end))
            .next_back()
            .is_some_and(|(_, &end)| end > r.bytes.start)
    }

    fn insert(&mut self, r: &Region) {
        let (mut start, mut end) = (r.bytes.start, r.bytes.end);
        if start == end {
            return;
        }
        let touching: Vec<(u64, u64)> = self
            .0
            .range((r.buffer, 0)..=(r.buffer, end))
            .rev()
            .take_while(|(_, &e)| e >= start)
            .map(|(&k, &e)| (k.1, e))
            .collect();
        for (s, e) in touching {
            self.0.remove(&(r.buffer, s));
            start = start.min(s);
            end = end.max(e);
        }
        self.0.insert((r.buffer, start), end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(buffer: u64, a: u64, b: u64) -> Region {
        Region {
            buffer,
            bytes: a..b,
        }
    }

    #[test]
    fn intervals_merge_and_find_overlaps() {
        let mut set = Intervals::default();
        set.insert(&reg(1, 0, 10));
        set.insert(&reg(1, 20, 30));
        set.insert(&reg(2, 10, 20));
        assert!(set.overlaps(&reg(1, 5, 25)));
        assert!(set.overlaps(&reg(1, 9, 12)));
        assert!(!set.overlaps(&reg(1, 10, 20)));
        assert!(!set.overlaps(&reg(3, 0, 100)));
        set.insert(&reg(1, 10, 20)); // bridges the two: one interval 0..30
        assert_eq!(set.0.len(), 2);
        assert!(set.overlaps(&reg(1, 29, 31)));
        set.insert(&reg(1, 5, 40));
        assert_eq!(set.0.get(&(1, 0)), Some(&40));
        assert!(!set.overlaps(&reg(2, 20, 30)));
        assert!(set.overlaps(&reg(2, 0, 11)));
    }
}
