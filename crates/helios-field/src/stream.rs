//! Streaming mode: an operation over host arrays of any length, cut into chunks whose
//! upload, compute and download overlap.
//!
//! The one decision a reader must know: three chunk slots rotate, so while the GPU runs chunk
//! k the host copies chunk k+1 in and chunk k-1 out. Each chunk is one submit (copy in,
//! dispatch, copy out in device-local mode; one dispatch on host-visible memory), ordered by
//! the context's timeline. Every input is checked canonical before the first chunk runs, and
//! the slots' GPU work is always waited for before their buffers are dropped, errors included.

use std::sync::Arc;

use helios_vk::{Buffer, Context, MemoryLocation};

use crate::engine::{record_dispatch, Field};
use crate::fq::{Fq, FQ_BYTES};
use crate::host::check_job;
use crate::kernel::FieldOp;
use crate::transfer::{ensure, read, write};
use crate::{FieldError, Result};

/// Chunks in flight.
const SLOTS: usize = 3;

/// Default chunk length of [`Field::stream`] callers that have no better idea (48 MiB in).
pub const DEFAULT_STREAM_CHUNK: usize = 1 << 19;

#[derive(Default)]
struct Slot {
    host_in: Option<Buffer>,
    host_out: Option<Buffer>,
    dev_in: Option<Buffer>,
    dev_out: Option<Buffer>,
    /// (timeline value, first element, length) of the chunk in flight.
    pending: Option<(u64, usize, usize)>,
}

/// Waits for every submitted chunk when dropped, so no buffer is freed under the GPU.
struct Drain<'c> {
    ctx: &'c Arc<Context>,
    slots: Vec<Slot>,
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        if let Some(v) = self
            .slots
            .iter()
            .filter_map(|s| s.pending.map(|p| p.0))
            .max()
        {
            // A failed wait means a lost device; nothing else can be done in a destructor.
            let _ = self.ctx.wait(v);
        }
    }
}

impl Field {
    /// `out = op(a, b)` over host arrays (`b` empty for unary ops), `chunk` elements per
    /// submit with upload, compute and download of different chunks overlapping.
    pub fn stream(
        &self,
        op: FieldOp,
        a: &[Fq],
        b: &[Fq],
        out: &mut [Fq],
        chunk: usize,
    ) -> Result<()> {
        check_job(op, a, b, out.len())?;
        if chunk == 0 {
            return Err(FieldError::Shape {
                op: op.name(),
                detail: "stream chunk length must be at least 1".into(),
            });
        }
        let compiled = self.compiled(op)?;
        let ctx = self.context();
        let (device_local, workgroup) = (self.config().device_local, self.config().workgroup);
        let chunk = chunk.min(a.len().max(1));
        let arity = op.arity();
        let in_bytes = (arity * chunk) as u64 * FQ_BYTES;
        let out_bytes = chunk as u64 * FQ_BYTES;

        let mut drain = Drain {
            ctx,
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        };
        for (k, start) in (0..a.len()).step_by(chunk).enumerate() {
            let len = chunk.min(a.len() - start);
            let slot = &mut drain.slots[k % SLOTS];
            finish_chunk(ctx, slot, out)?;

            let host_in = ensure(
                ctx,
                &mut slot.host_in,
                in_bytes,
                MemoryLocation::HostVisible,
            )?;
            write(ctx, host_in, 0, &a[start..start + len])?;
            if arity == 2 {
                write(ctx, host_in, len as u64 * FQ_BYTES, &b[start..start + len])?;
            }
            ensure(
                ctx,
                &mut slot.host_out,
                out_bytes,
                MemoryLocation::HostVisible,
            )?;
            if device_local {
                ensure(ctx, &mut slot.dev_in, in_bytes, MemoryLocation::DeviceLocal)?;
                ensure(
                    ctx,
                    &mut slot.dev_out,
                    out_bytes,
                    MemoryLocation::DeviceLocal,
                )?;
            }
            let (host_in, host_out) = (slot.host_in.as_ref(), slot.host_out.as_ref());
            let (host_in, host_out) = (host_in.expect("ensured"), host_out.expect("ensured"));
            let (dev_in, dev_out) = if device_local {
                (slot.dev_in.as_ref(), slot.dev_out.as_ref())
            } else {
                (Some(host_in), Some(host_out))
            };
            let (dev_in, dev_out) = (dev_in.expect("ensured"), dev_out.expect("ensured"));
            let n_bytes = len as u64 * FQ_BYTES;
            let inputs: Vec<u64> = (0..arity as u64)
                .map(|i| dev_in.device_address() + i * n_bytes)
                .collect();
            // SAFETY: the slot's buffers stay alive until this value is waited for, either by
            // `finish_chunk` when the slot is reused or at the end, or by `Drain` on error.
            let value = unsafe {
                ctx.submit(|rec| {
                    if device_local {
                        rec.copy_buffer(host_in, 0, dev_in, 0, arity as u64 * n_bytes)?;
                        rec.barrier();
                    }
                    let out_addr = dev_out.device_address();
                    record_dispatch(rec, &compiled, workgroup, (inputs, out_addr), len)?;
                    if device_local {
                        rec.barrier();
                        rec.copy_buffer(dev_out, 0, host_out, 0, n_bytes)?;
                    }
                    Ok(())
                })?
            };
            slot.pending = Some((value, start, len));
        }
        // Finish the remaining chunks in submission order.
        let mut order: Vec<usize> = (0..SLOTS).collect();
        order.sort_by_key(|&i| drain.slots[i].pending.map(|p| p.0));
        for i in order {
            finish_chunk(ctx, &mut drain.slots[i], out)?;
        }
        Ok(())
    }
}

/// Waits for the slot's chunk, if any, and copies its results out.
fn finish_chunk(ctx: &Arc<Context>, slot: &mut Slot, out: &mut [Fq]) -> Result<()> {
    let Some((value, start, len)) = slot.pending else {
        return Ok(());
    };
    ctx.wait(value)?;
    slot.pending = None;
    let host_out = slot.host_out.as_ref().expect("a pending slot has buffers");
    read(ctx, host_out, 0, &mut out[start..start + len])
}
