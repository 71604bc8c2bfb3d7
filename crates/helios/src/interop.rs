//! Sharing tensors with another API on the same GPU: gradients handed to NCCL (through CUDA)
//! without a copy through the host.
//!
//! An [`ExportedArena`] is one exported allocation ([`ExportedMemory`]); its tensors are
//! realised, row-major regions of it, so the other API imports the allocation once and finds
//! each tensor at base + offset. [`Tensor::copy_into`] writes any tensor into such a tensor
//! (a gradient into the arena), and [`Device::signal_external`] / [`Device::wait_external`]
//! order the device's work against the other API's through an [`ExternalTimeline`]:
//!
//! ```no_run
//! # fn step(dev: &helios::Device, grads: &[helios::Tensor]) -> helios::Result<()> {
//! use helios::interop::ExportedArena;
//! let arena = ExportedArena::new(dev, 1 << 20)?; // its fd and size go to CUDA once
//! let timeline = dev.export_timeline()?; // likewise
//! let (mut slots, mut at) = (Vec::new(), 0);
//! for g in grads {
//!     let slot = arena.tensor(at, g.shape(), g.dtype())?;
//!     at = arena.next_offset(at, &slot);
//!     slots.push(slot);
//! }
//! for (g, slot) in grads.iter().zip(&slots) {
//!     g.copy_into(slot)?;
//! }
//! dev.signal_external(&timeline, 1)?; // CUDA waits for 1, all-reduces, signals 2
//! dev.wait_external(&timeline, 2)?; // the optimizer, recorded next, reads `slots`
//! # Ok(()) }
//! ```
//!
//! The decision a reader must know: arena tensors are ordinary realised tensors (any op reads
//! them) whose storage is written in place, by `copy_into` or by the other API. Both
//! `copy_into` and the device calls first record the pending lazy work of this thread, as an
//! in-place optimizer step does, so that what was asked for before them runs before them.

use std::os::fd::OwnedFd;

use helios_kernels::{ElementwiseOp, UnaryOp};
pub use helios_vk::{ExportedMemory, ExternalTimeline};

use crate::tensor::record_elementwise;
use crate::{DType, Device, Error, Result, Tensor};

/// Device memory exportable as one opaque fd, whose tensors are regions of it.
pub struct ExportedArena {
    device: Device,
    memory: ExportedMemory,
}

impl ExportedArena {
    /// An arena of `bytes` bytes on `device`. Errors where the device cannot export memory
    /// (the message names the missing extension, VK_KHR_external_memory_fd).
    pub fn new(device: &Device, bytes: u64) -> Result<ExportedArena> {
        let memory = device.context().export_memory(bytes)?;
        Ok(ExportedArena {
            device: device.clone(),
            memory,
        })
    }

    /// The exported allocation (its fd, sizes and address).
    pub fn memory(&self) -> &ExportedMemory {
        &self.memory
    }

    /// A new fd for the allocation, owned by the caller (see [`ExportedMemory::fd`]).
    pub fn fd(&self) -> Result<OwnedFd> {
        Ok(self.memory.fd()?)
    }

    /// The allocation's size, which CUDA's import needs (at least [`size`](Self::size)).
    pub fn allocation_size(&self) -> u64 {
        self.memory.allocation_size()
    }

    /// Bytes tensors may cover.
    pub fn size(&self) -> u64 {
        self.memory.size()
    }

    /// What tensor offsets must be multiples of (256 bytes on every device seen so far).
    pub fn alignment(&self) -> u64 {
        self.memory.alignment()
    }

    /// The first aligned offset after `tensor`, placed at `offset`: where the next tensor of
    /// a packed layout goes.
    pub fn next_offset(&self, offset: u64, tensor: &Tensor) -> u64 {
        let bytes = (tensor.len() * tensor.dtype().size()) as u64;
        (offset + bytes).next_multiple_of(self.alignment())
    }

    /// A realised, row-major tensor of `shape` and `dtype` whose elements are the arena's
    /// bytes from `offset` on (a multiple of [`alignment`](Self::alignment)). Its values are
    /// whatever the bytes hold; tensors of one arena may overlap. It keeps the arena's memory
    /// alive.
    pub fn tensor(&self, offset: u64, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let bytes = shape
            .iter()
            .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| Error::Invalid {
                op: "ExportedArena::tensor",
                detail: format!("shape {shape:?} of {dtype} overflows the address space"),
            })?;
        let region = self.memory.region(offset, bytes)?;
        Ok(Tensor::from_buffer(&self.device, region, shape, dtype))
    }
}

impl std::fmt::Debug for ExportedArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportedArena")
            .field("memory", &self.memory)
            .finish()
    }
}

impl Tensor {
    /// Writes this tensor's values (any layout, realised or pending) into `dst`'s storage,
    /// converted to `dst`'s dtype: one copy kernel, recorded on the device's stream, so every
    /// later reader of `dst` (a kernel, a read-back, another API after
    /// `Device::signal_external`) sees them. `dst` must have the same shape and be dense
    /// (row-major from the start of its storage, as arena tensors are), and must not share
    /// memory with this tensor. Every tensor viewing `dst`'s storage sees the new values; no
    /// gradient flows through the write.
    ///
    /// Pending element-wise work of this thread is recorded first, so what was asked for
    /// before the call (a pending op reading `dst`) reads the old values.
    pub fn copy_into(&self, dst: &Tensor) -> Result<()> {
        const OP: &str = "copy_into";
        let invalid = |detail: String| Error::Invalid { op: OP, detail };
        if !self.device().same(dst.device()) {
            return Err(Error::DeviceMismatch { op: OP });
        }
        if self.shape() != dst.shape() {
            return Err(invalid(format!(
                "shapes {:?} and {:?} differ; reshape the source first",
                self.shape(),
                dst.shape()
            )));
        }
        if !dst.layout().is_dense() {
            return Err(invalid(
                "the destination is a strided or offset view; write into a dense tensor (an \
                 arena tensor, or a whole one)"
                    .into(),
            ));
        }
        if self.node_addr() == dst.node_addr() {
            if self.layout().same(dst.layout()) {
                return Ok(()); // its own values
            }
            return Err(invalid(
                "the source is another view of the destination's storage; copy it with \
                 contiguous() first"
                    .into(),
            ));
        }
        if self.is_empty() {
            return Ok(());
        }
        // The write is in place: whatever was asked for before reads the old values.
        crate::lazy::realize_all()?;
        let out = dst.buffer()?;
        let copy = ElementwiseOp::Unary(UnaryOp::Copy);
        record_elementwise(copy, &[self], None, self.shape(), dst.dtype(), out)
    }
}

impl Device {
    /// `src.copy_into(dst)` for every `(src, dst)` pair, bit for bit: the pairs of one dtype
    /// whose tensors are both dense (as a gradient and its arena slot are) go in one
    /// dispatch of a table-driven copy, where the device binds buffers by address; any other
    /// pair is copied by `copy_into` (which converts dtypes and reads any layout). The same
    /// checks and errors as `copy_into`; pending element-wise work of this thread is
    /// recorded first.
    pub fn copy_many(&self, pairs: &[(&Tensor, &Tensor)]) -> Result<()> {
        crate::lazy::realize_all()?;
        let by_address = self.binding() == helios_spirv::Binding::DeviceAddress;
        let fast = |(src, dst): &(&Tensor, &Tensor)| {
            by_address
                && src.device().same(self)
                && dst.device().same(self)
                && src.dtype() == dst.dtype()
                && src.shape() == dst.shape()
                && src.layout().is_dense()
                && dst.layout().is_dense()
                && src.node_addr() != dst.node_addr()
                && !src.is_empty()
                && u32::try_from(src.len()).is_ok()
        };
        for pair in pairs.iter().filter(|p| !fast(p)) {
            pair.0.copy_into(pair.1)?;
        }
        for dtype in DType::ALL {
            let group: Vec<&(&Tensor, &Tensor)> = pairs
                .iter()
                .filter(|p| fast(p) && p.0.dtype() == dtype)
                .collect();
            if group.is_empty() {
                continue;
            }
            let copies = group
                .iter()
                .map(|(src, dst)| Ok((src.address()?, dst.address()?, src.len() as u64)))
                .collect::<Result<Vec<_>>>()?;
            let table = helios_kernels::copy_many_table(&copies);
            let chunks = table.len() / helios_kernels::multi_tensor::COPY_MANY_ENTRY;
            let table = crate::IndexTensor::from_slice(self, &table, &[table.len()])?;
            let kernel = helios_kernels::CopyManyKernel {
                storage: dtype.storage(),
            };
            let mut reads = group
                .iter()
                .map(|(src, _)| src.buffer())
                .collect::<Result<Vec<_>>>()?;
            reads.push(table.buffer());
            let writes = group
                .iter()
                .map(|(_, dst)| dst.buffer())
                .collect::<Result<Vec<_>>>()?;
            let table_at = table.buffer().device_address();
            self.dispatch_rows(
                crate::device::KernelKey::CopyMany(kernel),
                || kernel.build(),
                &reads,
                &writes,
                |c, g, _| Ok(kernel.launch(&c.module, g, chunks as u32, table_at)?),
            )?;
        }
        Ok(())
    }

    /// A timeline semaphore exportable as an opaque fd (see `Context::export_timeline`);
    /// errors where the device cannot export one (naming VK_KHR_external_semaphore_fd).
    pub fn export_timeline(&self) -> Result<ExternalTimeline> {
        Ok(self.context().export_timeline()?)
    }

    /// Has `timeline` reach `value` once all work asked for so far has run on the GPU:
    /// pending element-wise work of this thread is recorded first, then the signal follows
    /// everything recorded (see `Context::signal_external`). The host does not wait.
    pub fn signal_external(&self, timeline: &ExternalTimeline, value: u64) -> Result<()> {
        crate::lazy::realize_all()?;
        Ok(self.context().signal_external(timeline, value)?)
    }

    /// Has all GPU work recorded after this call wait until `timeline` reaches `value`
    /// (set by another API, another thread or the host). Pending element-wise work of this
    /// thread is recorded first, so it does not wait. The host does not wait here, but a
    /// read-back of work recorded after the call waits for `value` (see
    /// `Context::wait_external`).
    pub fn wait_external(&self, timeline: &ExternalTimeline, value: u64) -> Result<()> {
        crate::lazy::realize_all()?;
        Ok(self.context().wait_external(timeline, value)?)
    }
}
