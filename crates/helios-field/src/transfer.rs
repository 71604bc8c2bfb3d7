//! Moving field elements between the host and GPU buffers: the scratch buffers a `Field`
//! keeps and grows (never one allocation per call), and host copies split over all cores
//! when large, since on a fast GPU they are most of a one-shot call's cost.

use std::sync::Arc;

use helios_vk::{Buffer, Context, MemoryLocation};
use rayon::prelude::*;

use crate::fq::Fq;
use crate::Result;

/// Buffers reused across calls, grown to the largest request seen.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) host_in: Option<Buffer>,
    pub(crate) host_out: Option<Buffer>,
    pub(crate) dev_in: Option<Buffer>,
    pub(crate) dev_out: Option<Buffer>,
}

/// A buffer of at least `bytes` in `slot`, replacing a smaller one.
pub(crate) fn ensure<'s>(
    ctx: &Arc<Context>,
    slot: &'s mut Option<Buffer>,
    bytes: u64,
    location: MemoryLocation,
) -> Result<&'s Buffer> {
    let fits = slot.as_ref().is_some_and(|b| b.size() >= bytes);
    if !fits {
        *slot = None; // free the old one first
        let size = bytes.max(1 << 16).next_power_of_two();
        *slot = Some(ctx.create_buffer(size, location)?);
    }
    Ok(slot.as_ref().expect("just ensured"))
}

/// Host copies at least this large are split over all cores.
const PAR_COPY_BYTES: usize = 1 << 20;

fn as_bytes(xs: &[Fq]) -> &[u8] {
    bytemuck::cast_slice(xs)
}

fn as_bytes_mut(xs: &mut [Fq]) -> &mut [u8] {
    bytemuck::cast_slice_mut(xs)
}

/// Writes `data` into `buf` at byte `offset` (a plain copy for mapped buffers).
pub(crate) fn write(ctx: &Arc<Context>, buf: &Buffer, offset: u64, data: &[Fq]) -> Result<()> {
    let bytes = as_bytes(data);
    if !buf.is_mapped() || bytes.len() < PAR_COPY_BYTES {
        return Ok(ctx.upload(buf, offset, bytes)?);
    }
    let chunk = copy_chunk(bytes.len());
    bytes
        .par_chunks(chunk)
        .enumerate()
        .try_for_each(|(i, c)| ctx.upload(buf, offset + (i * chunk) as u64, c))?;
    Ok(())
}

/// Reads `out.len()` elements of `buf` from byte `offset`.
pub(crate) fn read(ctx: &Arc<Context>, buf: &Buffer, offset: u64, out: &mut [Fq]) -> Result<()> {
    let bytes = as_bytes_mut(out);
    if !buf.is_mapped() || bytes.len() < PAR_COPY_BYTES {
        return Ok(ctx.download(buf, offset, bytes)?);
    }
    let chunk = copy_chunk(bytes.len());
    bytes
        .par_chunks_mut(chunk)
        .enumerate()
        .try_for_each(|(i, c)| ctx.download(buf, offset + (i * chunk) as u64, c))?;
    Ok(())
}

fn copy_chunk(len: usize) -> usize {
    (len / rayon::current_num_threads()).max(PAR_COPY_BYTES / 4)
}
