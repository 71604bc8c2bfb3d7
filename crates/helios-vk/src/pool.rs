// The caching allocator: regions of large driver blocks, recycled by size class.
//
// Like PyTorch's caching allocator, freed memory is kept and reused rather than returned to
// the driver, so a steady-state loop of ops makes no driver allocations at all. What is new
// here is the timeline: a freed region is tagged with the timeline value of its last GPU use.
// Later GPU work on the queue may take it back at once (the encoder inserts a barrier for
// the write-after-read), while a region the *host* will write (staging, direct uploads) is
// handed out only once that value has completed. Memory goes back to the driver only when an
// allocation fails (or on `empty_cache`): then every block without live regions whose last
// use has completed is freed, and the allocation is retried once.

use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::memory::{Block, MemoryLocation};

/// Regions at least this large get a block of their own.
const DEDICATED: u64 = 32 << 20;
/// Size of the blocks small regions are carved from.
const BLOCK: u64 = 256 << 20;
/// Every region starts at a multiple of this (≥ minStorageBufferOffsetAlignment and enough
/// for 16-byte vector access).
const ALIGN: u64 = 256;

/// Allocation counters of one memory location (or their sum).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryStats {
    /// vkAllocateMemory calls (blocks created).
    pub driver_allocations: u64,
    /// Blocks returned to the driver.
    pub driver_frees: u64,
    /// Allocations served from a cached region.
    pub pool_hits: u64,
    /// Allocations that carved a new region.
    pub pool_misses: u64,
    /// Bytes held from the driver.
    pub bytes_held: u64,
    /// Bytes in regions handed out and not yet freed.
    pub bytes_in_use: u64,
}

impl std::ops::Add for MemoryStats {
    type Output = MemoryStats;
    fn add(self, o: MemoryStats) -> MemoryStats {
        MemoryStats {
            driver_allocations: self.driver_allocations + o.driver_allocations,
            driver_frees: self.driver_frees + o.driver_frees,
            pool_hits: self.pool_hits + o.pool_hits,
            pool_misses: self.pool_misses + o.pool_misses,
            bytes_held: self.bytes_held + o.bytes_held,
            bytes_in_use: self.bytes_in_use + o.bytes_in_use,
        }
    }
}

/// The size class of a request: 256 B minimum, then four classes per power of two (at most
/// 25% waste); dedicated sizes round to 64 KiB.
pub(crate) fn size_class(size: u64) -> u64 {
    let n = size.max(ALIGN);
    if n >= DEDICATED {
        return n.next_multiple_of(64 << 10);
    }
    let base = 1u64 << (63 - (n - 1).leading_zeros()); // base ≤ n-1 < 2·base
    let step = (base / 4).max(ALIGN);
    n.next_multiple_of(step)
}

/// How far both timelines have run.
#[derive(Clone, Copy, Default)]
struct Completed {
    compute: u64,
    transfer: u64,
}

impl Completed {
    /// Whether every GPU use of a freed region has finished.
    fn covers(&self, r: &FreeRegion) -> bool {
        r.free_after <= self.compute && r.transfer_after <= self.transfer
    }
}

impl Context {
    fn completed_both(&self) -> Result<Completed> {
        Ok(Completed {
            compute: self.completed()?,
            transfer: self.copies_completed()?,
        })
    }
}

/// A region handed out by the pool.
pub(crate) struct Grant {
    pub(crate) block: Arc<Block>,
    pub(crate) offset: u64,
    /// Bytes reserved (the size class).
    pub(crate) class: u64,
    /// Timeline value of the region's last GPU use by its previous owner (0: fresh).
    pub(crate) free_after: u64,
    /// Transfer-timeline value of its last copy-queue use (0: none).
    pub(crate) transfer_after: u64,
}

struct FreeRegion {
    block: Arc<Block>,
    offset: u64,
    /// Timeline value of the region's last GPU use.
    free_after: u64,
    /// Transfer-timeline value of its last copy-queue use.
    transfer_after: u64,
}

struct BlockState {
    block: Arc<Block>,
    /// Regions handed out and not yet freed.
    live: usize,
}

pub(crate) struct Pool {
    location: MemoryLocation,
    /// Free regions by size class, oldest first.
    /// A deque: regions are taken from the front (the oldest, whose last use is the most
    /// likely to be complete and to need no barrier) and returned at the back.
    free: HashMap<u64, VecDeque<FreeRegion>>,
    /// The block small regions are carved from, and its first unused byte.
    arena: Option<(Arc<Block>, u64)>,
    blocks: HashMap<u64, BlockState>,
    stats: MemoryStats,
}

impl Pool {
    pub(crate) fn new(location: MemoryLocation) -> Pool {
        Pool {
            location,
            free: HashMap::default(),
            arena: None,
            blocks: HashMap::default(),
            stats: MemoryStats::default(),
        }
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        self.stats
    }

    /// A cached region of `class` bytes usable now: any for GPU use, a completed one for host
    /// access. Takes the oldest, whose last use is most likely complete.
    fn take_cached(
        &mut self,
        class: u64,
        host_access: bool,
        completed: Completed,
    ) -> Option<FreeRegion> {
        let list = self.free.get_mut(&class)?;
        let i = list
            .iter()
            .position(|r| !host_access || completed.covers(r))?;
        let r = list.remove(i).expect("index from position");
        Some(r)
    }

    /// Returns every block with no live regions whose regions' last use has completed.
    fn release_unused(&mut self, ctx: &Context, completed: Completed) {
        let busy: std::collections::HashSet<u64> = self
            .free
            .values()
            .flatten()
            .filter(|r| !completed.covers(r))
            .map(|r| r.block.id)
            .collect();
        let arena_id = self.arena.as_ref().map(|(b, _)| b.id);
        let idle: Vec<u64> = self
            .blocks
            .iter()
            .filter(|(id, s)| s.live == 0 && !busy.contains(id) && Some(**id) != arena_id)
            .map(|(id, _)| *id)
            .collect();
        if idle.is_empty() {
            return;
        }
        for list in self.free.values_mut() {
            list.retain(|r| !idle.contains(&r.block.id));
        }
        for id in idle {
            let state = self.blocks.remove(&id).expect("listed above");
            // SAFETY: no live regions, every freed region's last use has completed, and the
            // free lists no longer refer to it, so nothing can reach the block any more.
            unsafe { state.block.destroy(ctx.device()) };
            self.stats.driver_frees += 1;
            self.stats.bytes_held -= state.block.size;
        }
    }
}

impl Context {
    /// A region of at least `size` bytes.
    pub(crate) fn pool_alloc(
        &self,
        size: u64,
        location: MemoryLocation,
        host_access: bool,
    ) -> Result<Grant> {
        let class = size_class(size);
        let completed = if host_access {
            self.completed_both()?
        } else {
            Completed::default()
        };
        let mut pool = self.pool(location);
        if let Some(FreeRegion {
            block,
            offset,
            free_after,
            transfer_after,
        }) = pool.take_cached(class, host_access, completed)
        {
            pool.stats.pool_hits += 1;
            pool.stats.bytes_in_use += class;
            pool.blocks
                .get_mut(&block.id)
                .expect("block of a cached region")
                .live += 1;
            return Ok(Grant {
                block,
                offset,
                class,
                free_after,
                transfer_after,
            });
        }
        pool.stats.pool_misses += 1;
        let (block, offset) = match self.carve(&mut pool, class) {
            Ok(r) => r,
            Err(Error::OutOfMemory { .. }) => {
                // Give cached memory back to the driver and try once more.
                let completed = self.completed_both()?;
                pool.release_unused(self, completed);
                self.carve(&mut pool, class).map_err(|e| match e {
                    Error::OutOfMemory { kind, .. } => Error::PoolOutOfMemory {
                        kind,
                        requested: size,
                        location: location.as_str(),
                        held: pool.stats.bytes_held,
                        in_use: pool.stats.bytes_in_use,
                    },
                    e => e,
                })?
            }
            Err(e) => return Err(e),
        };
        pool.stats.bytes_in_use += class;
        pool.blocks
            .get_mut(&block.id)
            .expect("carved block is tracked")
            .live += 1;
        Ok(Grant {
            block,
            offset,
            class,
            free_after: 0,
            transfer_after: 0,
        })
    }

    /// A fresh region: from the arena block, a new arena block, or a dedicated block.
    fn carve(&self, pool: &mut Pool, class: u64) -> Result<(Arc<Block>, u64)> {
        if class >= DEDICATED {
            let block = self.new_block(pool, class)?;
            return Ok((block, 0));
        }
        if let Some((block, used)) = &mut pool.arena {
            if *used + class <= block.size {
                let offset = *used;
                *used += class;
                return Ok((Arc::clone(block), offset));
            }
        }
        let max = self.caps().limits.max_memory_allocation_size;
        let size = if max > 0 { BLOCK.min(max) } else { BLOCK };
        let block = self.new_block(pool, size.max(class))?;
        pool.arena = Some((Arc::clone(&block), class));
        Ok((block, 0))
    }

    fn new_block(&self, pool: &mut Pool, size: u64) -> Result<Arc<Block>> {
        if let (MemoryLocation::DeviceLocal, Some(limit)) = (pool.location, self.memory_limit) {
            if pool.stats.bytes_held + size > limit {
                return Err(Error::OutOfMemory {
                    kind: "device",
                    requested: size,
                    location: pool.location.as_str(),
                });
            }
        }
        let id = self.next_block_id();
        let block = Arc::new(Block::new(self, id, size, pool.location)?);
        pool.stats.driver_allocations += 1;
        pool.stats.bytes_held += size;
        pool.blocks.insert(
            id,
            BlockState {
                block: Arc::clone(&block),
                live: 0,
            },
        );
        Ok(block)
    }

    /// Returns a region to its pool, tagged with its last GPU use.
    pub(crate) fn pool_free(
        &self,
        location: MemoryLocation,
        block: Arc<Block>,
        offset: u64,
        class: u64,
        free_after: u64,
        transfer_after: u64,
    ) {
        let mut pool = self.pool(location);
        pool.stats.bytes_in_use -= class;
        if let Some(state) = pool.blocks.get_mut(&block.id) {
            state.live -= 1;
        }
        pool.free.entry(class).or_default().push_back(FreeRegion {
            block,
            offset,
            free_after,
            transfer_after,
        });
    }

    /// Allocation counters, summed over device-local and host-visible memory.
    pub fn memory_stats(&self) -> MemoryStats {
        self.pool(MemoryLocation::DeviceLocal).stats()
            + self.pool(MemoryLocation::HostVisible).stats()
    }

    /// Returns cached memory whose last use has completed to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        let completed = self.completed_both()?;
        for location in [MemoryLocation::DeviceLocal, MemoryLocation::HostVisible] {
            let mut pool = self.pool(location);
            pool.release_unused(self, completed);
        }
        Ok(())
    }

    /// Frees every block. Called from Context's Drop after the device is idle.
    ///
    /// # Safety
    /// The device must be idle and no Buffer may be alive (each holds an Arc<Context>, so
    /// none is when the Context drops).
    pub(crate) unsafe fn destroy_pools(&self) {
        for location in [MemoryLocation::DeviceLocal, MemoryLocation::HostVisible] {
            let mut pool = self.pool(location);
            pool.free.clear();
            pool.arena = None;
            for (_, state) in pool.blocks.drain() {
                state.block.destroy(self.device());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_waste_at_most_a_quarter() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(4096), 4096);
        assert_eq!(size_class(4097), 5120);
        for n in [1000u64, 12345, 1 << 20, (1 << 20) + 1, 30 << 20, 100 << 20] {
            let c = size_class(n);
            assert!(c >= n && c % ALIGN == 0, "{n} -> {c}");
            assert!(n < 1024 || (c - n) * 4 <= n, "{n} -> {c} wastes too much");
        }
    }
}
