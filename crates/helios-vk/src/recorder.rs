//! Recording into the open batch: dispatch, native launch, barrier, copy.
//!
//! The checks and recording shared by the encoder (declared accesses, barriers decided by
//! hazard tracking) and by `Recorder`, which only exists inside `Context::submit*` closures
//! (explicit barriers). Every argument that comes from the caller (push-constant sizes, group
//! counts, copy ranges, objects from another device) is checked and returns an error instead
//! of recording something the validation layer would reject. What is recorded is a list of
//! commands (commands.rs), replayed into a command buffer when the batch is submitted.

use ash::vk;

use crate::batch::OpenBatch;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::native::{self, NativeArg, NativeKernel};
use crate::pipeline::Pipeline;
use std::sync::Arc;

/// Largest region per `vkCmdCopyBuffer` region: lavapipe crashes on a 2 GiB region.
pub const MAX_COPY_REGION: u64 = 1 << 30;

/// Records into a command buffer of the encoder (`Context::submit*` closures). Dispatches
/// recorded here declare no buffer accesses, so ordering between them is the caller's: call
/// `barrier()` where one depends on another.
pub struct Recorder<'a> {
    ctx: &'a Core,
    batch: &'a mut OpenBatch,
}

/// Checks a dispatch's caller-supplied arguments against the pipeline and device limits.
pub(crate) fn check_dispatch(
    ctx: &Core,
    pipeline: &Pipeline,
    groups: [u32; 3],
    push_constants: &[u8],
) -> Result<()> {
    let invalid = |detail: String| Error::InvalidDispatch {
        pipeline: pipeline.name().to_owned(),
        detail,
    };
    if !std::ptr::eq(pipeline.core(), ctx) {
        return Err(invalid(
            "the pipeline was created on a different Context".into(),
        ));
    }
    let len = push_constants.len();
    if len as u64 > u64::from(pipeline.push_constant_size()) {
        return Err(invalid(format!(
            "{len} bytes of push constants, but the pipeline declares {}",
            pipeline.push_constant_size()
        )));
    }
    if len % 4 != 0 {
        return Err(invalid(format!(
            "{len} bytes of push constants; Vulkan needs a multiple of 4"
        )));
    }
    let max = ctx.caps().limits.max_workgroup_count;
    if groups.iter().zip(max).any(|(&g, m)| g > m) {
        return Err(invalid(format!(
            "{groups:?} workgroups exceed the device limit {max:?}; split the dispatch"
        )));
    }
    Ok(())
}
/// Adds a dispatch to the batch's commands (bound, pushed and dispatched at replay).
/// Arguments were checked.
pub(crate) fn record_dispatch(
    ctx: &Core,
    batch: &mut OpenBatch,
    pipeline: &Pipeline,
    groups: [u32; 3],
    push_constants: &[u8],
    descriptors: &[vk::DescriptorBufferInfo],
) {
    let profiling = ctx.profiler.is_some();
    batch
        .commands
        .dispatch(profiling, pipeline, groups, push_constants, descriptors);
    batch.dispatches += 1;
}

/// Adds a native launch to the batch's commands and keeps the kernel alive with the batch.
/// Arguments were checked (`native::check_native`).
pub(crate) fn record_native(
    ctx: &Core,
    batch: &mut OpenBatch,
    kernel: &Arc<NativeKernel>,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    params: &[NativeArg],
) {
    let profiling = ctx.profiler.is_some();
    batch
        .commands
        .launch(profiling, kernel, grid, block, shared, params);
    batch.dispatches += 1;
    if !batch.keep_native.iter().any(|k| Arc::ptr_eq(k, kernel)) {
        batch.keep_native.push(Arc::clone(kernel));
    }
}

impl<'a> Recorder<'a> {
    pub(crate) fn new(ctx: &'a Core, batch: &'a mut OpenBatch) -> Self {
        Recorder { ctx, batch }
    }

    /// Records one compute dispatch of `groups` workgroups with `push_constants` at offset 0.
    pub fn dispatch(
        &mut self,
        pipeline: &Pipeline,
        groups: [u32; 3],
        push_constants: &[u8],
    ) -> Result<()> {
        check_dispatch(self.ctx, pipeline, groups, push_constants)?;
        if pipeline.storage_buffers() > 0 {
            return Err(Error::InvalidDispatch {
                pipeline: pipeline.name().to_owned(),
                detail: "binds buffers through push descriptors; use Context::dispatch, which \
                         binds its declared accesses"
                    .into(),
            });
        }
        record_dispatch(self.ctx, self.batch, pipeline, groups, push_constants, &[]);
        Ok(())
    }

    /// Records a native kernel launch (see `Context::launch_native`). Like `dispatch` here,
    /// it declares no accesses: order it with `barrier()` before and after, as a dispatch.
    /// The batch keeps the kernel alive.
    pub fn launch_native(
        &mut self,
        kernel: &Arc<NativeKernel>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        params: &[NativeArg],
    ) -> Result<()> {
        native::check_native(self.ctx, kernel, grid, block, shared_bytes, params)?;
        record_native(
            self.ctx,
            self.batch,
            kernel,
            grid,
            block,
            shared_bytes,
            params,
        );
        Ok(())
    }

    /// Makes all earlier compute and transfer writes visible to all later compute and
    /// transfer accesses (and orders later writes after earlier reads); around native
    /// launches, all earlier writes to all later accesses.
    pub fn barrier(&mut self) {
        self.batch.barrier();
    }

    /// Copies `size` bytes; regions are split at `MAX_COPY_REGION`. Size 0 records nothing.
    pub fn copy_buffer(
        &mut self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        size: u64,
    ) -> Result<()> {
        for (buf, what) in [
            (src, "copy_buffer source"),
            (dst, "copy_buffer destination"),
        ] {
            if !std::ptr::eq(buf.core(), self.ctx) {
                return Err(Error::ForeignObject { what });
            }
        }
        src.check_range("copy_buffer source", src_offset, size)?;
        dst.check_range("copy_buffer destination", dst_offset, size)?;
        if size == 0 {
            return Ok(());
        }
        let (src_at, dst_at) = (src.offset() + src_offset, dst.offset() + dst_offset);
        if src.raw() == dst.raw() && src_at < dst_at + size && dst_at < src_at + size {
            return Err(Error::OverlappingCopy);
        }
        let regions = (0..size)
            .step_by(MAX_COPY_REGION as usize)
            .map(|start| vk::BufferCopy {
                src_offset: src.offset() + src_offset + start,
                dst_offset: dst.offset() + dst_offset + start,
                size: (size - start).min(MAX_COPY_REGION),
            });
        self.batch.commands.copy(src.raw(), dst.raw(), regions);
        Ok(())
    }

    /// Dispatches recorded so far (for flush thresholds and tests).
    pub fn dispatch_count(&self) -> u32 {
        self.batch.dispatches
    }
}
