//! Which rank owns which tensors under ZeRO-1 (the optimizer state sharded over the ranks):
//! each rank owns one contiguous run of the tensor list, and only the owner keeps that
//! tensor's optimizer state and updates it.
//!
//! The decision a reader must know: shards are whole tensors, never parts of one, so the
//! optimizer's per-tensor kernel runs unchanged and an owner's update is the update one
//! process would make. Runs are contiguous so that each rank's share of a packed buffer is
//! one range: one reduce and one broadcast per rank, not one per tensor.

use std::ops::Range;

use crate::{Error, Result};

/// Each rank's run of tensors: `ranges[r]` for rank r, in rank order, together covering every
/// tensor exactly once. A rank may own none (more ranks than tensors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shards {
    ranges: Vec<Range<usize>>,
}

impl Shards {
    /// Splits tensors of `sizes` elements (in their order) over `world` ranks so that the
    /// largest share is as small as any split into contiguous runs allows (it sets each
    /// rank's memory), each rank taking about an even part of what the ones before it left.
    /// A pure function of its arguments: every rank computes the same split. Ranks beyond
    /// the tensors' number own none.
    pub fn balanced(sizes: &[usize], world: usize) -> Result<Shards> {
        if world == 0 {
            return Err(Error::Zero(
                "a run needs at least one rank to own tensors".into(),
            ));
        }
        let sizes: Vec<u128> = sizes.iter().map(|&s| s as u128).collect();
        let cap = smallest_cap(&sizes, world);
        let n = sizes.len();
        let (mut ranges, mut start) = (Vec::with_capacity(world), 0);
        for r in 0..world {
            let ranks_left = (world - r) as u128;
            let remaining: u128 = sizes[start..].iter().sum();
            let (mut end, mut load) = (start, 0u128);
            // Take tensors while the share stays under the cap and a tensor's midpoint falls
            // within an even share of what is left; one at least, so that no rank is idle
            // while a later one holds several.
            while end < n
                && load + sizes[end] <= cap
                && (end == start || (2 * load + sizes[end]) * ranks_left <= 2 * remaining)
            {
                load += sizes[end];
                end += 1;
            }
            // Then enough that the later ranks can hold the rest under the cap (always
            // possible without passing it: the greedy fill that proved the cap does so).
            while end < n && !fits(&sizes[end..], cap, world - r - 1) {
                end += 1;
            }
            ranges.push(start..end);
            start = end;
        }
        debug_assert_eq!(start, n, "every tensor has an owner");
        Ok(Shards { ranges })
    }

    /// Every tensor owned by the only rank of a run of one.
    pub fn whole(tensors: usize) -> Shards {
        Shards {
            ranges: std::iter::once(0..tensors).collect(),
        }
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.ranges.len()
    }

    /// The number of tensors.
    pub fn tensors(&self) -> usize {
        self.ranges.last().map_or(0, |r| r.end)
    }

    /// The tensors `rank` owns (empty for a rank beyond the world, as for one that owns none).
    pub fn range(&self, rank: usize) -> Range<usize> {
        self.ranges.get(rank).cloned().unwrap_or(0..0)
    }

    /// The rank that owns tensor `i`, or `None` past the last tensor.
    pub fn owner(&self, i: usize) -> Option<usize> {
        self.ranges.iter().position(|r| r.contains(&i))
    }

    /// Checks that these shards split `tensors` tensors over `world` ranks (what a collective
    /// is about to rely on).
    pub(crate) fn check(&self, tensors: usize, world: usize) -> Result<()> {
        if self.tensors() != tensors || self.world() != world {
            return Err(Error::Zero(format!(
                "the shards split {} tensors over {} ranks, but this call has {tensors} \
                 tensors and {world} ranks; make the shards from the same tensor list and world",
                self.tensors(),
                self.world()
            )));
        }
        Ok(())
    }
}

/// Whether `sizes`, in order, fill at most `ranks` runs of at most `cap` elements each
/// (filling each run as far as it goes, which needs the fewest runs).
fn fits(sizes: &[u128], cap: u128, ranks: usize) -> bool {
    let (mut used, mut load) = (0usize, 0u128);
    for &s in sizes {
        if s > cap {
            return false;
        }
        if used == 0 || load + s > cap {
            used += 1;
            load = 0;
        }
        load += s;
    }
    used <= ranks
}

/// The smallest cap with which `sizes` fit in `world` contiguous runs (binary search: `fits`
/// is monotone in the cap).
fn smallest_cap(sizes: &[u128], world: usize) -> u128 {
    let total: u128 = sizes.iter().sum();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let (mut lo, mut hi) = (
        largest.max(total.div_ceil(world as u128)),
        total.max(largest),
    );
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match fits(sizes, mid, world) {
            true => hi = mid,
            false => lo = mid + 1,
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2 small's parameters in `param_specs` order (wte padded to 50304 rows).
    fn gpt2() -> Vec<usize> {
        let (c, v, t) = (768, 50304, 1024);
        let mut s = vec![v * c, t * c];
        for _ in 0..12 {
            s.extend([
                c,
                c,
                c * 3 * c,
                3 * c,
                c * c,
                c,
                c,
                c,
                c * 4 * c,
                4 * c,
                4 * c * c,
                c,
            ]);
        }
        s.extend([c, c]);
        s
    }

    fn loads(sizes: &[usize], shards: &Shards) -> Vec<usize> {
        (0..shards.world())
            .map(|r| sizes[shards.range(r)].iter().sum())
            .collect()
    }

    /// The smallest largest share over every contiguous split (tries them all).
    fn brute_force(sizes: &[usize], world: usize) -> usize {
        fn go(sizes: &[usize], world: usize) -> usize {
            if world == 1 {
                return sizes.iter().sum();
            }
            (0..=sizes.len())
                .map(|k| {
                    sizes[..k]
                        .iter()
                        .sum::<usize>()
                        .max(go(&sizes[k..], world - 1))
                })
                .min()
                .unwrap()
        }
        go(sizes, world)
    }

    fn check_cover(shards: &Shards, n: usize, world: usize) {
        assert_eq!(shards.world(), world);
        assert_eq!(shards.tensors(), n);
        let mut next = 0;
        for r in 0..world {
            let range = shards.range(r);
            assert_eq!(range.start, next, "{shards:?}");
            next = range.end;
            for i in range {
                assert_eq!(shards.owner(i), Some(r));
            }
        }
        assert_eq!(next, n);
        assert_eq!(shards.owner(n), None);
    }

    #[test]
    fn every_tensor_has_one_owner_and_the_largest_share_is_the_smallest_possible() {
        // Small lists against every split, from a fixed pseudo-random stream.
        let mut x = 12345u64;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as usize
        };
        for _ in 0..300 {
            let n = next() % 9;
            let sizes: Vec<usize> = (0..n).map(|_| 1 + next() % 20).collect();
            for world in 1..=5 {
                let shards = Shards::balanced(&sizes, world).unwrap();
                check_cover(&shards, n, world);
                let largest = loads(&sizes, &shards).into_iter().max().unwrap_or(0);
                assert_eq!(
                    largest,
                    brute_force(&sizes, world),
                    "{sizes:?} over {world}"
                );
                // Every rank computes the same split.
                assert_eq!(shards, Shards::balanced(&sizes, world).unwrap());
            }
        }
    }

    #[test]
    fn gpt2_splits_evenly_and_no_rank_idles_while_another_holds_several() {
        let sizes = gpt2();
        let total: usize = sizes.iter().sum();
        for world in [1, 2, 3, 4, 8] {
            let shards = Shards::balanced(&sizes, world).unwrap();
            check_cover(&shards, sizes.len(), world);
            let l = loads(&sizes, &shards);
            // wte alone is 31% of the model: past three ranks it sets the largest share.
            let ideal = (total / world).max(sizes[0]);
            let largest = *l.iter().max().unwrap();
            assert!(largest <= ideal + ideal / 20, "{world}: {l:?}");
            assert!(l.iter().all(|&x| x > 0), "{world}: {l:?}");
        }
        assert_eq!(
            Shards::balanced(&sizes, 1).unwrap(),
            Shards::whole(sizes.len())
        );
        // A rank is never left empty while tensors remain for it.
        let shards = Shards::balanced(&[10, 1, 1], 3).unwrap();
        assert_eq!(loads(&[10, 1, 1], &shards), [10, 1, 1]);
    }

    #[test]
    fn more_ranks_than_tensors_leave_the_last_ranks_empty_and_no_ranks_is_an_error() {
        let shards = Shards::balanced(&[5, 3], 4).unwrap();
        check_cover(&shards, 2, 4);
        assert_eq!(loads(&[5, 3], &shards), [5, 3, 0, 0]);
        let none = Shards::balanced(&[], 3).unwrap();
        check_cover(&none, 0, 3);
        let err = Shards::balanced(&[5, 3], 0).unwrap_err().to_string();
        assert!(err.contains("at least one rank"), "{err}");
        assert!(shards.check(2, 4).is_ok());
        let err = shards.check(3, 4).unwrap_err().to_string();
        assert!(err.contains("2 tensors over 4 ranks"), "{err}");
    }
}
