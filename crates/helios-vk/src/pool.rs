//! The caching allocator: regions of large driver blocks, recycled by size class.
//!
//! Like PyTorch's caching allocator, freed memory is kept and reused rather than returned to
//! the driver, so a steady-state loop of ops makes no driver allocations at all. What is new
//! here is the timeline: a freed region is tagged with the timeline value of its last GPU use.
//! Later GPU work on the queue may take it back at once (the encoder inserts a barrier for
//! the write-after-read), while a region the *host* will write (staging, direct uploads) is
//! handed out only once that value has completed. Memory goes back to the driver only when an
//! allocation fails (or on `empty_cache`): then every block without live regions whose last
//! use has completed is freed, and the allocation is retried once.

use crate::sync::LockExt;
use rustc_hash::FxHashMap as HashMap;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::block::{Block, MemoryLocation};
use crate::core::Core;
use crate::error::{Error, Result};

/// Regions at least this large are cut from segments, best-fit, and split and merged.
/// (Measured on GPT-2 124M bf16 training: 1 MiB held 8.3 GiB, 32 MiB 9.1 GiB, at the same
/// step time; exact-class reuse of everything held 11.6 GiB.)
const LARGE: u64 = 1 << 20;
/// From this size on, classes are multiples of `LARGE_STEP` (below, four per octave).
const HUGE: u64 = 32 << 20;
/// A new segment is this big, or the request's size when larger; the rest is free.
const SEGMENT: u64 = 64 << 20;
/// Huge regions round to this; a split leaves at least this much.
const LARGE_STEP: u64 = 2 << 20;
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
    /// The most `bytes_in_use` has been (summed per location, so a bound on the sum).
    pub peak_in_use: u64,
    /// Bytes held by exported allocations (`Context::export_memory`), which are outside the
    /// pool and counted in none of the fields above.
    pub bytes_exported: u64,
}

impl MemoryStats {
    fn in_use_add(&mut self, bytes: u64) {
        self.bytes_in_use += bytes;
        self.peak_in_use = self.peak_in_use.max(self.bytes_in_use);
    }
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
            peak_in_use: self.peak_in_use + o.peak_in_use,
            bytes_exported: self.bytes_exported + o.bytes_exported,
        }
    }
}

/// The size class of a request: 256 B minimum, then four classes per power of two (at most
/// 25% waste); from 32 MiB on, multiples of 2 MiB.
pub(crate) fn size_class(size: u64) -> u64 {
    let n = size.max(ALIGN);
    if n >= HUGE {
        return n.next_multiple_of(LARGE_STEP);
    }
    let base = 1u64 << (63 - (n - 1).leading_zeros()); // base ≤ n-1 < 2·base
    let step = (base / 4).max(ALIGN);
    n.next_multiple_of(step)
}

/// How far both timelines have run.
#[derive(Clone, Copy, Default)]
pub(crate) struct Completed {
    pub(crate) compute: u64,
    pub(crate) transfer: u64,
}

impl Completed {
    /// Whether every GPU use of a freed region has finished.
    fn covers(&self, r: &FreeRegion) -> bool {
        self.covers_uses(r.free_after, r.transfer_after)
    }

    /// Whether both timelines have run past these last uses.
    fn covers_uses(&self, free_after: u64, transfer_after: u64) -> bool {
        free_after <= self.compute && transfer_after <= self.transfer
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
    /// Cut from a different extent than the region's last occupants (see the top of file).
    pub(crate) remapped: bool,
}

struct FreeRegion {
    block: Arc<Block>,
    offset: u64,
    /// Timeline value of the region's last GPU use.
    free_after: u64,
    /// Transfer-timeline value of its last copy-queue use.
    transfer_after: u64,
}

/// The last uses of a free large region, and whether it is exactly one freed buffer's extent.
#[derive(Clone, Copy)]
struct LargeTags {
    free_after: u64,
    transfer_after: u64,
    whole: bool,
}

/// Free large regions, indexed both ways.
#[derive(Default)]
struct LargeFree {
    /// (size, block id, offset): best fit is the first entry at or after the request.
    by_size: BTreeMap<(u64, u64, u64), LargeTags>,
    /// (block id, offset) → size: a freed region's neighbours, for merging.
    by_place: BTreeMap<(u64, u64), u64>,
}

impl LargeFree {
    fn insert(&mut self, block: u64, offset: u64, size: u64, tags: LargeTags) {
        self.by_size.insert((size, block, offset), tags);
        self.by_place.insert((block, offset), size);
    }

    fn remove(&mut self, block: u64, offset: u64, size: u64) -> LargeTags {
        self.by_place.remove(&(block, offset));
        self.by_size
            .remove(&(size, block, offset))
            .expect("indexed both ways")
    }

    /// Frees `[offset, offset + size)` of `block`, merged with free neighbours.
    fn free(&mut self, block: u64, mut offset: u64, mut size: u64, mut tags: LargeTags) {
        let merge = |t: &mut LargeTags, o: LargeTags| {
            t.free_after = t.free_after.max(o.free_after);
            t.transfer_after = t.transfer_after.max(o.transfer_after);
            t.whole = false;
        };
        let before = self
            .by_place
            .range(..(block, offset))
            .next_back()
            .map(|(&k, &v)| (k, v));
        if let Some(((b, o), len)) = before {
            if b == block && o + len == offset {
                merge(&mut tags, self.remove(b, o, len));
                offset = o;
                size += len;
            }
        }
        if let Some(&len) = self.by_place.get(&(block, offset + size)) {
            merge(&mut tags, self.remove(block, offset + size, len));
            size += len;
        }
        self.insert(block, offset, size, tags);
    }

    /// The smallest free region of at least `class` bytes (usable by the host if
    /// `host_access`), cut to `class` when the rest is worth keeping: (block id, offset,
    /// bytes granted, tags of the region it came from, whether the grant is that exact
    /// region).
    fn take(
        &mut self,
        class: u64,
        host_access: bool,
        completed: Completed,
    ) -> Option<(u64, u64, u64, LargeTags, bool)> {
        let (&(size, block, offset), _) = self
            .by_size
            .range((class, 0, 0)..)
            .find(|(_, t)| !host_access || completed.covers_uses(t.free_after, t.transfer_after))?;
        let tags = self.remove(block, offset, size);
        if size - class >= LARGE.max(size / 8) {
            let rest = LargeTags {
                whole: false,
                ..tags
            };
            self.insert(block, offset + class, size - class, rest);
            return Some((block, offset, class, tags, false));
        }
        Some((block, offset, size, tags, tags.whole))
    }

    fn drop_block(&mut self, block: u64) {
        let keys: Vec<(u64, u64)> = self
            .by_place
            .range((block, 0)..(block + 1, 0))
            .map(|(&k, _)| k)
            .collect();
        for (b, o) in keys {
            let len = self.by_place[&(b, o)];
            self.remove(b, o, len);
        }
    }
}

struct BlockState {
    block: Arc<Block>,
    /// Regions handed out and not yet freed.
    live: usize,
}

pub(crate) struct Pool {
    location: MemoryLocation,
    /// Free small regions by size class, oldest first.
    /// A deque: regions are taken from the front (the oldest, whose last use is the most
    /// likely to be complete and to need no barrier) and returned at the back.
    free: HashMap<u64, VecDeque<FreeRegion>>,
    /// Free large regions.
    large: LargeFree,
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
            large: LargeFree::default(),
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
    fn release_unused(&mut self, ctx: &Core, completed: Completed) {
        let mut busy: std::collections::HashSet<u64> = self
            .free
            .values()
            .flatten()
            .filter(|r| !completed.covers(r))
            .map(|r| r.block.id)
            .collect();
        busy.extend(
            self.large
                .by_size
                .iter()
                .filter(|(_, t)| !completed.covers_uses(t.free_after, t.transfer_after))
                .map(|(&(_, block, _), _)| block),
        );
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
        for &id in &idle {
            self.large.drop_block(id);
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

/// The caching allocator of a Context: a pool per memory location, and what is counted and
/// freed beside them (block ids, exported allocations).
pub(crate) struct Pools {
    /// Device-local and host-visible memory (`MemoryLocation::index`).
    pools: [Mutex<Pool>; 2],
    next_block: AtomicU64,
    /// `ContextOptions::memory_limit`.
    memory_limit: Option<u64>,
    /// Bytes held by exported allocations (external.rs), which the pools do not count.
    pub(crate) exported_bytes: AtomicU64,
    /// Exported blocks whose drop could not wait for the GPU; freed once the device is idle.
    graveyard: Mutex<Vec<Arc<Block>>>,
}

impl Pools {
    pub(crate) fn new(memory_limit: Option<u64>) -> Pools {
        Pools {
            pools: [
                Mutex::new(Pool::new(MemoryLocation::DeviceLocal)),
                Mutex::new(Pool::new(MemoryLocation::HostVisible)),
            ],
            next_block: AtomicU64::new(1),
            memory_limit,
            exported_bytes: AtomicU64::new(0),
            graveyard: Mutex::new(Vec::new()),
        }
    }

    fn pool(&self, location: MemoryLocation) -> MutexGuard<'_, Pool> {
        self.pools[location.index()].locked()
    }

    pub(crate) fn next_block_id(&self) -> u64 {
        self.next_block.fetch_add(1, Ordering::Relaxed)
    }

    /// Frees `block` when the Context drops, after the device went idle (an exported block
    /// whose drop could not wait for the GPU's last use).
    pub(crate) fn defer_destroy(&self, block: Arc<Block>) {
        self.graveyard.locked().push(block);
    }

    /// A region of at least `size` bytes. `timelines` reads how far the GPU has run, for
    /// host access and before memory goes back to the driver.
    pub(crate) fn alloc(
        &self,
        core: &Core,
        size: u64,
        location: MemoryLocation,
        host_access: bool,
        timelines: impl Fn() -> Result<Completed>,
    ) -> Result<Grant> {
        let class = size_class(size);
        let completed = if host_access {
            timelines()?
        } else {
            Completed::default()
        };
        let mut pool = self.pool(location);
        if class >= LARGE {
            if let Some((id, offset, bytes, tags, exact)) =
                pool.large.take(class, host_access, completed)
            {
                pool.stats.pool_hits += 1;
                pool.stats.in_use_add(bytes);
                let state = pool.blocks.get_mut(&id).expect("block of a cached region");
                state.live += 1;
                return Ok(Grant {
                    block: Arc::clone(&state.block),
                    offset,
                    class: bytes,
                    free_after: tags.free_after,
                    transfer_after: tags.transfer_after,
                    remapped: !exact,
                });
            }
        }
        if let Some(FreeRegion {
            block,
            offset,
            free_after,
            transfer_after,
        }) = pool.take_cached(class, host_access, completed)
        {
            pool.stats.pool_hits += 1;
            pool.stats.in_use_add(class);
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
                remapped: false,
            });
        }
        pool.stats.pool_misses += 1;
        let (block, offset) = match self.carve(core, &mut pool, class) {
            Ok(r) => r,
            Err(Error::OutOfMemory { .. }) => {
                // Give cached memory back to the driver and try once more.
                let completed = timelines()?;
                pool.release_unused(core, completed);
                self.carve(core, &mut pool, class).map_err(|e| match e {
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
        pool.stats.in_use_add(class);
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
            remapped: false,
        })
    }

    /// A fresh region: from the arena block or a new arena block (small), or from a new
    /// segment whose rest is left free (large).
    fn carve(&self, core: &Core, pool: &mut Pool, class: u64) -> Result<(Arc<Block>, u64)> {
        if class >= LARGE {
            let size = block_size(core, SEGMENT).max(class);
            let block = self.new_block(core, pool, size)?;
            if size > class {
                let rest = LargeTags {
                    free_after: 0,
                    transfer_after: 0,
                    whole: false,
                };
                pool.large.insert(block.id, class, size - class, rest);
            }
            return Ok((block, 0));
        }
        if let Some((block, used)) = &mut pool.arena {
            if *used + class <= block.size {
                let offset = *used;
                *used += class;
                return Ok((Arc::clone(block), offset));
            }
        }
        let block = self.new_block(core, pool, block_size(core, BLOCK).max(class))?;
        pool.arena = Some((Arc::clone(&block), class));
        Ok((block, 0))
    }

    fn new_block(&self, core: &Core, pool: &mut Pool, size: u64) -> Result<Arc<Block>> {
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
        let block = Arc::new(Block::new(core, id, size, pool.location)?);
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
    pub(crate) fn free(
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
        if class >= LARGE {
            let tags = LargeTags {
                free_after,
                transfer_after,
                whole: true,
            };
            pool.large.free(block.id, offset, class, tags);
            return;
        }
        pool.free.entry(class).or_default().push_back(FreeRegion {
            block,
            offset,
            free_after,
            transfer_after,
        });
    }

    /// Allocation counters, summed over device-local and host-visible memory, and the bytes
    /// of exported allocations.
    pub(crate) fn stats(&self) -> MemoryStats {
        let mut stats = self.pool(MemoryLocation::DeviceLocal).stats()
            + self.pool(MemoryLocation::HostVisible).stats();
        stats.bytes_exported = self.exported();
        stats
    }

    /// Bytes in exported allocations (not part of the pool's).
    fn exported(&self) -> u64 {
        self.exported_bytes.load(Ordering::Relaxed)
    }

    /// Starts `peak_in_use` again from what is in use now.
    pub(crate) fn reset_peak(&self) {
        for location in [MemoryLocation::DeviceLocal, MemoryLocation::HostVisible] {
            let mut pool = self.pool(location);
            pool.stats.peak_in_use = pool.stats.bytes_in_use;
        }
    }

    /// Returns cached memory whose last use has completed (by `completed`) to the driver.
    pub(crate) fn empty(&self, core: &Core, completed: Completed) {
        for location in [MemoryLocation::DeviceLocal, MemoryLocation::HostVisible] {
            let mut pool = self.pool(location);
            pool.release_unused(core, completed);
        }
    }

    /// Frees every block, then the exported blocks left for the Context's drop. Called from
    /// Context's Drop after the device is idle.
    ///
    /// # Safety
    /// The device must be idle and no Buffer may be alive (each holds its Context, so none
    /// is when the Context drops).
    pub(crate) unsafe fn destroy(&mut self, device: &ash::Device) {
        for location in [MemoryLocation::DeviceLocal, MemoryLocation::HostVisible] {
            let mut pool = self.pool(location);
            pool.free.clear();
            pool.large = LargeFree::default();
            pool.arena = None;
            for (_, state) in pool.blocks.drain() {
                state.block.destroy(device);
            }
        }
        for block in self
            .graveyard
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default()
        {
            block.destroy(device);
        }
    }
}

/// `want` bytes, or the device's maxMemoryAllocationSize where that is smaller.
fn block_size(core: &Core, want: u64) -> u64 {
    match core.caps().limits.max_memory_allocation_size {
        0 => want,
        max => want.min(max),
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

    fn tags(free_after: u64) -> LargeTags {
        LargeTags {
            free_after,
            transfer_after: 0,
            whole: true,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn large_regions_best_fit_split_and_merge() {
        let done = Completed::default();
        let mut f = LargeFree::default();
        f.free(1, 0, 384 * MIB, tags(5));
        f.free(2, 0, 96 * MIB, tags(6));
        // Best fit: the 96 MiB region, exactly, not remapped.
        let (b, o, len, t, exact) = f.take(96 * MIB, false, done).unwrap();
        assert_eq!((b, o, len, t.free_after, exact), (2, 0, 96 * MIB, 6, true));
        // Two 100 MiB pieces cut from the 384 MiB one, in address order.
        let (b, o, len, _, exact) = f.take(100 * MIB, false, done).unwrap();
        assert_eq!((b, o, len, exact), (1, 0, 100 * MIB, false));
        let (b, o, len, _, _) = f.take(100 * MIB, false, done).unwrap();
        assert_eq!((b, o, len), (1, 100 * MIB, 100 * MIB));
        // The 184 MiB rest is too small for 200 MiB.
        assert!(f.take(200 * MIB, false, done).is_none());
        // Freed pieces merge with the rest, in either order, keeping the latest use.
        f.free(1, 100 * MIB, 100 * MIB, tags(9));
        f.free(1, 0, 100 * MIB, tags(7));
        assert_eq!(f.by_place.len(), 1);
        let (b, o, len, t, exact) = f.take(384 * MIB, false, done).unwrap();
        assert_eq!(
            (b, o, len, t.free_after, exact),
            (1, 0, 384 * MIB, 9, false)
        );
        // A rest under an eighth of the region is handed out with it, not split off.
        f.free(1, 0, 384 * MIB, tags(1));
        let (_, _, len, _, _) = f.take(360 * MIB, false, done).unwrap();
        assert_eq!(len, 384 * MIB);
        assert!(f.by_size.is_empty());
    }

    #[test]
    fn host_access_takes_only_completed_large_regions() {
        let mut f = LargeFree::default();
        f.free(1, 0, 64 * MIB, tags(10));
        f.free(2, 0, 128 * MIB, tags(3));
        let at = |compute| Completed {
            compute,
            transfer: 0,
        };
        let (b, o, ..) = f.take(64 * MIB, true, at(5)).unwrap();
        assert_eq!(
            (b, o),
            (2, 0),
            "block 1's last use (10) has not completed at 5"
        );
        let (b, o, ..) = f.take(64 * MIB, true, at(5)).unwrap();
        assert_eq!((b, o), (2, 64 * MIB), "the rest of block 2");
        assert!(f.take(64 * MIB, true, at(5)).is_none());
        f.free(2, 0, 64 * MIB, tags(3));
        f.drop_block(2);
        let (b, ..) = f.take(64 * MIB, false, at(0)).unwrap();
        assert_eq!(b, 1, "GPU use may take a region still in flight");
        assert!(f.by_size.is_empty() && f.by_place.is_empty());
    }
}
