//! The NCCL backend: gradients are averaged on the GPU, with no copy through the host.
//!
//! Backward's gradients are copied into one exportable Vulkan allocation (the arena), which
//! CUDA imports once; a Vulkan timeline semaphore, also imported, orders the two APIs on the
//! GPU. Each step: Vulkan copies the gradients (and the loss) in and signals value 2k+1; the
//! CUDA stream waits for it, sums the arena over the ranks in place and signals 2k+2; every
//! later Vulkan command (the optimizer first) waits for that. The host only enqueues, and
//! the ranks meet once a step. The division by the number of ranks is the optimizer's (it
//! multiplies as it reads): no pass over the gradients of its own. Under ZeRO-1 the same
//! arena carries both halves of the step, one exchange each: the gradients, reduced to each
//! shard's owner, then the updated parameters (of the gradients' shapes and dtypes), each
//! shard broadcast from its owner.

use helios::interop::{ExportedArena, ExternalTimeline};
use helios::{DType, Device, Tensor};
use helios_cuda::{
    Comm, Context, Cuda, DeviceBuffer, DevicePtr, ExternalMemory, ExternalSemaphore, Nccl,
    NcclDtype, NcclOp, Stream, UniqueId,
};

use crate::{Collective, Error, Rank, Result, Shards};

/// Whether this host can run `ranks` NCCL ranks (the libraries load and CUDA sees as many
/// GPUs), or why not.
pub fn available(ranks: usize) -> std::result::Result<(), String> {
    let cuda = Cuda::load().map_err(|e| e.to_string())?;
    let gpus = cuda.device_count().map_err(|e| e.to_string())?;
    if gpus < ranks {
        return Err(format!("CUDA sees {gpus} GPUs, fewer than {ranks} ranks"));
    }
    Nccl::load().map(drop).map_err(|e| e.to_string())
}

/// One rank's NCCL communicator and what it shares with Vulkan. Field order is drop order:
/// CUDA lets go of the imported memory and semaphore before Vulkan frees them.
pub struct NcclCollective {
    arena: Option<Arena>,
    /// A few f32 that CUDA sees, for `sum_f32` (made on first use).
    scalar: Option<Arena>,
    sem: ExternalSemaphore,
    host: Option<DeviceBuffer>,
    comm: Option<Comm>,
    stream: Stream,
    timeline: ExternalTimeline,
    /// The timeline's last value (both APIs signal it, always higher).
    value: u64,
    nccl: Nccl,
    ctx: Context,
    device: Device,
    rank: Rank,
    /// What found the other ranks, kept until `finish` (MPI, when it started the ranks).
    bootstrap: Option<Box<dyn Collective>>,
}

/// Which arena an exchange carries.
#[derive(Clone, Copy)]
enum Home {
    Gradients,
    Scalar,
}

/// The gradients' (and under ZeRO-1 the parameters') home that CUDA sees: one tensor per
/// parameter, packed at aligned offsets.
struct Arena {
    /// CUDA's mapping, dropped before the Vulkan arena.
    _memory: ExternalMemory,
    base: DevicePtr,
    /// Per parameter: its gradient's shape and dtype (the arena is rebuilt if they change).
    specs: Vec<(Vec<usize>, DType)>,
    tensors: Vec<Tensor>,
    /// Per parameter: (byte offset, elements, dtype) of its slot.
    slots: Vec<(u64, usize, NcclDtype)>,
    _arena: ExportedArena,
}

impl Arena {
    /// The slots of parameters `range` as contiguous runs of one dtype, (byte offset,
    /// elements, dtype): one collective each.
    fn runs(&self, range: std::ops::Range<usize>) -> Vec<(u64, usize, NcclDtype)> {
        let mut runs: Vec<(u64, usize, NcclDtype)> = Vec::new();
        for &(start, elements, dtype) in &self.slots[range] {
            let size = dtype.size_bytes() as u64;
            match runs.last_mut() {
                Some(r) if r.2 == dtype && r.0 + r.1 as u64 * size == start => r.1 += elements,
                _ => runs.push((start, elements, dtype)),
            }
        }
        runs.retain(|r| r.1 > 0);
        runs
    }

    fn ptr(&self, offset: u64) -> DevicePtr {
        self.base.offset(offset).expect("inside the arena")
    }
}

fn nccl_dtype(d: DType) -> NcclDtype {
    match d {
        DType::F32 => NcclDtype::F32,
        DType::F16 => NcclDtype::F16,
        DType::BF16 => NcclDtype::Bf16,
    }
}

impl NcclCollective {
    /// Joins the NCCL communicator of `rank`'s run on `device`. The ranks find each other
    /// through `bootstrap` when given (rank 0's unique id travels over it), else through
    /// NCCL's own bootstrap at `NCCL_COMM_ID=host:port`, which every rank must have set.
    pub fn connect(
        device: &Device,
        rank: Rank,
        mut bootstrap: Option<Box<dyn Collective>>,
    ) -> Result<NcclCollective> {
        let enabled = device.context().enabled();
        if !(enabled.export_memory && enabled.export_timeline) {
            return Err(Error::Unsupported(format!(
                "NCCL needs Vulkan memory and timeline semaphores exportable as fds \
                 (VK_KHR_external_memory_fd, VK_KHR_external_semaphore_fd), which {} does not \
                 offer",
                device.name()
            )));
        }
        let cuda = Cuda::load()?;
        let gpu = cuda.device_by_uuid(&device.context().caps().device_uuid_bytes)?;
        let ctx = gpu.primary_context()?;
        let stream = Stream::new(&ctx)?;
        let nccl = Nccl::load()?;
        let id = match bootstrap.as_mut() {
            Some(b) => {
                let mut bytes = match rank.rank {
                    0 => *UniqueId::new(&nccl)?.as_bytes(),
                    _ => [0u8; 128],
                };
                b.broadcast(&mut bytes)?;
                UniqueId::from_bytes(bytes)
            }
            None => {
                if rank.world > 1 && std::env::var_os("NCCL_COMM_ID").is_none() {
                    return Err(Error::Environment(
                        "the ranks find each other through NCCL_COMM_ID=host:port (rank 0's \
                         host and a free port), which is not set: set it for every rank, or \
                         start them with `helios train --nproc N` or `mpiexec`"
                            .into(),
                    ));
                }
                // With NCCL_COMM_ID set, every rank makes the same id.
                UniqueId::new(&nccl)?
            }
        };
        let comm = Comm::init_rank(&nccl, &ctx, rank.world, &id, rank.rank)?;
        let timeline = device.export_timeline()?;
        let sem = ExternalSemaphore::import_timeline(&ctx, timeline.fd()?)?;
        Ok(NcclCollective {
            arena: None,
            scalar: None,
            sem,
            host: None,
            comm: Some(comm),
            stream,
            timeline,
            value: 0,
            nccl,
            ctx,
            device: device.clone(),
            rank,
            bootstrap,
        })
    }

    fn comm(&self) -> &Comm {
        self.comm.as_ref().expect("used after finish")
    }

    /// A CUDA buffer of exactly `bytes` for host values (reused while the size stays).
    fn host_buffer(&mut self, bytes: usize) -> Result<&mut DeviceBuffer> {
        if self.host.as_ref().map(DeviceBuffer::len) != Some(bytes) {
            self.host = None;
            self.host = Some(DeviceBuffer::alloc(&self.ctx, bytes.max(1))?);
        }
        Ok(self.host.as_mut().expect("just made"))
    }

    /// The arena for tensors like `like` (gradients, or the parameters they belong to),
    /// made (and imported into CUDA) on first use or when their shapes change.
    fn arena_for(&mut self, like: &[Tensor]) -> Result<&Arena> {
        self.arena_in(Home::Gradients, like)
    }

    /// The arena `home` names, for tensors like `like`.
    fn arena_in(&mut self, home: Home, like: &[Tensor]) -> Result<&Arena> {
        let specs: Vec<(Vec<usize>, DType)> = like
            .iter()
            .map(|g| (g.shape().to_vec(), g.dtype()))
            .collect();
        if self.home(home).map(|a| &a.specs) != Some(&specs) {
            // The old arena may still be in CUDA's hands: let its work finish first.
            self.stream.synchronize()?;
            *self.home_mut(home) = None;
            let made = self.make_arena(specs)?;
            *self.home_mut(home) = Some(made);
        }
        Ok(self.home(home).expect("just made"))
    }

    /// The arena `home` names, once made.
    fn home(&self, home: Home) -> Option<&Arena> {
        match home {
            Home::Gradients => self.arena.as_ref(),
            Home::Scalar => self.scalar.as_ref(),
        }
    }

    fn home_mut(&mut self, home: Home) -> &mut Option<Arena> {
        match home {
            Home::Gradients => &mut self.arena,
            Home::Scalar => &mut self.scalar,
        }
    }

    fn make_arena(&self, specs: Vec<(Vec<usize>, DType)>) -> Result<Arena> {
        // Each tensor at an aligned offset; tensors of one dtype that end where the next
        // begins form one run (`Arena::runs`), so that one collective covers it.
        let align = self.device.context().region_alignment();
        let mut slots = Vec::with_capacity(specs.len());
        let mut at = 0u64;
        for (shape, dtype) in &specs {
            let (elements, size) = (shape.iter().product::<usize>(), dtype.size() as u64);
            let start = at.next_multiple_of(align);
            slots.push((start, elements, nccl_dtype(*dtype)));
            at = start + elements as u64 * size;
        }
        let arena = ExportedArena::new(&self.device, at.max(align))?;
        let tensors = specs
            .iter()
            .zip(&slots)
            .map(|((shape, dtype), &(off, _, _))| arena.tensor(off, shape, *dtype))
            .collect::<helios::Result<Vec<_>>>()?;
        let memory = ExternalMemory::import(
            &self.ctx,
            arena.fd()?,
            arena.allocation_size(),
            arena.memory().dedicated(),
        )?;
        let base = memory.mapped_buffer(0, arena.allocation_size())?;
        Ok(Arena {
            _memory: memory,
            base,
            specs,
            tensors,
            slots,
            _arena: arena,
        })
    }

    /// Runs `collectives` on the CUDA stream between the arena's filling and its reading:
    /// after every Vulkan command recorded so far, and before every one recorded later.
    fn exchange(
        &mut self,
        collectives: impl FnOnce(&Comm, &Stream, &Arena) -> helios_cuda::Result<()>,
    ) -> Result<()> {
        self.exchange_in(Home::Gradients, collectives)
    }

    /// `exchange` of the arena `home` names.
    fn exchange_in(
        &mut self,
        home: Home,
        collectives: impl FnOnce(&Comm, &Stream, &Arena) -> helios_cuda::Result<()>,
    ) -> Result<()> {
        let (ready, done) = (self.value + 1, self.value + 2);
        self.value = done;
        self.device.signal_external(&self.timeline, ready)?;
        self.stream.wait_external(&self.sem, ready)?;
        let arena = self
            .home(home)
            .expect("made before its exchange (arena_in)");
        let comm = self.comm.as_ref().expect("used after finish");
        self.nccl.group(|| collectives(comm, &self.stream, arena))?;
        self.stream.signal_external(&self.sem, done)?;
        self.device.wait_external(&self.timeline, done)?;
        Ok(())
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn broadcast_from(&mut self, root: usize, bytes: &mut [u8]) -> Result<()> {
        crate::check_root(root, self.rank.world)?;
        let buf = self.host_buffer(bytes.len())?;
        buf.copy_from_host(bytes)?;
        let ptr = buf.ptr();
        // SAFETY: `ptr` holds `bytes.len()` bytes and outlives the synchronize below.
        unsafe {
            self.comm()
                .broadcast(ptr, ptr, bytes.len(), NcclDtype::U8, root, &self.stream)?;
        }
        self.stream.synchronize()?;
        self.host.as_ref().expect("made").copy_to_host(bytes)?;
        Ok(())
    }

    fn mean(&mut self, values: &mut [f64]) -> Result<()> {
        let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let buf = self.host_buffer(bytes.len())?;
        buf.copy_from_host(&bytes)?;
        let ptr = buf.ptr();
        // SAFETY: `ptr` holds `values.len()` f64 and outlives the synchronize below.
        unsafe {
            self.comm().all_reduce(
                ptr,
                ptr,
                values.len(),
                NcclDtype::F64,
                NcclOp::Sum,
                &self.stream,
            )?;
        }
        self.stream.synchronize()?;
        self.host.as_ref().expect("made").copy_to_host(&mut bytes)?;
        let n = self.rank.world as f64;
        for (v, b) in values.iter_mut().zip(bytes.chunks_exact(8)) {
            *v = f64::from_le_bytes(b.try_into().expect("8 bytes")) / n;
        }
        Ok(())
    }

    fn sum_f32(&mut self, values: &Tensor) -> Result<Tensor> {
        if values.shape().len() != 1 || values.dtype() != DType::F32 {
            return Err(Error::Environment(format!(
                "sum_f32 takes a (k,) f32 tensor, not {:?} {:?}",
                values.shape(),
                values.dtype()
            )));
        }
        let slot = self
            .arena_in(Home::Scalar, std::slice::from_ref(values))?
            .tensors[0]
            .clone();
        values.copy_into(&slot)?;
        let count = values.len();
        self.exchange_in(Home::Scalar, |comm, stream, arena| {
            let ptr = arena.ptr(0);
            // SAFETY: `count` f32 at the start of the mapped arena, which outlives the
            // stream's work (dropping it waits for the GPU).
            unsafe { comm.all_reduce(ptr, ptr, count, NcclDtype::F32, NcclOp::Sum, stream) }
        })?;
        // The slot itself: the next call's copy into it waits for this one's readers.
        Ok(slot)
    }

    fn sum_gradients(&mut self, tensors: &[Tensor], loss: &Tensor) -> Result<Tensor> {
        crate::check_loss(loss)?;
        let mut all = crate::gradients(tensors)?;
        all.push(loss.clone());
        self.arena_for(&all)?;
        let arena = self.arena.as_ref().expect("made by arena_for");
        // One dispatch for all of them: a copy each was ~150 dispatches, most tiny.
        let pairs: Vec<(&Tensor, &Tensor)> = all.iter().zip(&arena.tensors).collect();
        self.device.copy_many(&pairs)?;
        self.exchange(|comm, stream, arena| {
            for (offset, count, dtype) in arena.runs(0..arena.slots.len()) {
                let ptr = arena.ptr(offset);
                // SAFETY: the run lies inside the mapped arena, which outlives the stream's
                // work (dropping the arena waits for the GPU).
                unsafe { comm.all_reduce(ptr, ptr, count, dtype, NcclOp::Sum, stream)? };
            }
            Ok(())
        })?;
        let arena = self.arena.as_ref().expect("made by arena_for");
        for (t, slot) in tensors.iter().zip(&arena.tensors) {
            t.set_grad(Some(slot.clone()))?;
        }
        Ok(arena.tensors[tensors.len()].clone())
    }

    fn reduce_gradients(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()> {
        shards.check(tensors.len(), self.rank.world)?;
        let grads = crate::gradients(tensors)?;
        self.arena_for(&grads)?;
        let arena = self.arena.as_ref().expect("made by arena_for");
        let pairs: Vec<(&Tensor, &Tensor)> = grads.iter().zip(&arena.tensors).collect();
        self.device.copy_many(&pairs)?;
        let world = self.rank.world;
        self.exchange(|comm, stream, arena| {
            for owner in 0..world {
                for (offset, count, dtype) in arena.runs(shards.range(owner)) {
                    let ptr = arena.ptr(offset);
                    // SAFETY: as in `sum_gradients`; in place on the owner.
                    unsafe { comm.reduce(ptr, ptr, count, dtype, NcclOp::Sum, owner, stream)? };
                }
            }
            Ok(())
        })?;
        let arena = self.arena.as_ref().expect("made by arena_for");
        for i in shards.range(self.rank.rank) {
            tensors[i].set_grad(Some(arena.tensors[i].clone()))?;
        }
        Ok(())
    }

    fn broadcast_owned(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()> {
        shards.check(tensors.len(), self.rank.world)?;
        // The gradients' arena, when the parameters match it (they do: a gradient has its
        // parameter's shape and dtype). The optimizer has read the gradients by now: Vulkan
        // orders these copies after its reads.
        self.arena_for(tensors)?;
        let arena = self.arena.as_ref().expect("made by arena_for");
        let mine = shards.range(self.rank.rank);
        let pairs: Vec<(&Tensor, &Tensor)> = mine
            .clone()
            .map(|i| (&tensors[i], &arena.tensors[i]))
            .collect();
        self.device.copy_many(&pairs)?;
        let world = self.rank.world;
        self.exchange(|comm, stream, arena| {
            for owner in 0..world {
                for (offset, count, dtype) in arena.runs(shards.range(owner)) {
                    let ptr = arena.ptr(offset);
                    // SAFETY: as in `sum_gradients`.
                    unsafe { comm.broadcast(ptr, ptr, count, dtype, owner, stream)? };
                }
            }
            Ok(())
        })?;
        let arena = self.arena.as_ref().expect("made by arena_for");
        let pairs: Vec<(&Tensor, &Tensor)> = tensors
            .iter()
            .zip(&arena.tensors)
            .enumerate()
            .filter(|(i, _)| !mine.contains(i))
            .map(|(_, (t, slot))| (slot, t))
            .collect();
        self.device.copy_many(&pairs)?;
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        // Every rank is here: the communicator can wait for its peers as it is destroyed.
        self.device.synchronize()?;
        self.stream.synchronize()?;
        self.comm = None;
        if let Some(b) = self.bootstrap.as_mut() {
            b.finish()?;
        }
        Ok(())
    }
}

impl Drop for NcclCollective {
    fn drop(&mut self) {
        // Not finished: a rank failed, and destroying the communicator would wait for peers
        // that may never come. Abort it instead.
        if let Some(comm) = self.comm.take() {
            let _ = comm.abort();
        }
    }
}
