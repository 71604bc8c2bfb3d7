//! Host <-> buffer transfers, asynchronous where the host does not need to wait.
//!
//! Uploads never wait: a mapped buffer the GPU no longer uses (unified memory, device memory
//! behind a full BAR mapping, or a host-visible buffer) is written in place; anything else is copied into a staging region
//! from the host-visible pool and a copy is recorded into the open batch, ordered before
//! later dispatches by the encoder's hazard tracking. Staging regions come back to the pool
//! tagged with the copy's timeline value, so the pool acts as a ring: the host reuses a region
//! only once the GPU has finished reading it. Downloads are the one place the host waits: for
//! exactly the buffer's last write (mapped) or for the copy into staging.

use std::sync::Arc;

use crate::block::MemoryLocation;
use crate::context::Context;
use crate::copy_queue::Copy;
use crate::error::{Error, Result};
use crate::memory::Buffer;

/// Largest staging region one transfer uses at a time.
pub const STAGING_CHUNK: u64 = 64 << 20;

/// Byte ranges of a buffer copied aside in the command stream, at the point where
/// [`Context::snapshot`] recorded them: readable once the GPU got there, without waiting.
#[derive(Debug)]
pub struct Snapshot {
    buffer: Buffer,
    /// Timeline value of the batch holding the copies.
    value: u64,
}

impl Context {
    /// Records copies of `regions` (offset, length in bytes) of `src` into one host-visible
    /// buffer, in order with the work recorded before and after; [`Context::read_snapshot`]
    /// reads them back once done. For comparing results on the side of real work without
    /// stopping the host.
    pub fn snapshot(self: &Arc<Self>, src: &Buffer, regions: &[(u64, u64)]) -> Result<Snapshot> {
        self.check_own(src, "snapshot source")?;
        let total: u64 = regions.iter().map(|r| r.1).sum();
        let buffer = self.create_host_buffer(total.max(4), MemoryLocation::HostVisible)?;
        let mut at = 0;
        for &(offset, len) in regions.iter().filter(|r| r.1 > 0) {
            src.check_range("snapshot", offset, len)?;
            self.record_copy(src, offset, &buffer, at, len)?;
            at += len;
        }
        let value = buffer.last_write();
        Ok(Snapshot { buffer, value })
    }

    /// The bytes of a snapshot (its regions back to back), or `None` while the GPU has not
    /// reached it.
    pub fn read_snapshot(&self, snapshot: &Snapshot) -> Result<Option<Vec<u8>>> {
        if self.completed()? < snapshot.value {
            return Ok(None);
        }
        let mut out = vec![0u8; snapshot.buffer.size() as usize];
        snapshot.buffer.read_mapped(0, &mut out)?;
        Ok(Some(out))
    }

    /// Writes `bytes` into `dst` at `offset`. Returns at once: GPU work recorded later sees
    /// the data, and the host may reuse `bytes` immediately.
    pub fn upload(self: &Arc<Self>, dst: &Buffer, offset: u64, bytes: &[u8]) -> Result<()> {
        self.check_own(dst, "upload destination")?;
        dst.check_range("upload", offset, bytes.len() as u64)?;
        if bytes.is_empty() {
            return Ok(());
        }
        // In place only once no GPU work still touches the region: neither a compute batch
        // nor a copy on the transfer queue (which could otherwise land after this write).
        if dst.is_mapped()
            && dst.last_use() <= self.completed()?
            && dst.transfer_use() <= self.copies_completed()?
        {
            return dst.write_mapped(offset, bytes);
        }
        for (i, chunk) in bytes.chunks(STAGING_CHUNK as usize).enumerate() {
            let staging =
                self.create_host_buffer(chunk.len() as u64, MemoryLocation::HostVisible)?;
            staging.write_mapped(0, chunk)?;
            let at = offset + i as u64 * STAGING_CHUNK;
            let len = chunk.len() as u64;
            if self.copy_queue.is_some() {
                // On the copy engine, after the compute work that last used `dst`; compute
                // batches that use `dst` later wait for the copy (encoder, submit).
                let after = dst.last_use();
                if after > self.last_submitted() {
                    self.flush()?;
                }
                let copy = Copy {
                    src: &staging,
                    src_offset: 0,
                    dst,
                    dst_offset: at,
                    len,
                };
                let value = self.submit_copies(&[copy], after)?;
                self.keep_until_copied(value, staging);
            } else {
                self.record_copy(&staging, 0, dst, at, len)?;
            }
        }
        Ok(())
    }

    /// Reads `out.len()` bytes of `src` starting at `offset` into `out`, waiting for the
    /// GPU work that writes `src` (and only for that).
    pub fn download(self: &Arc<Self>, src: &Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check_own(src, "download source")?;
        src.check_range("download", offset, out.len() as u64)?;
        if out.is_empty() {
            return Ok(());
        }
        // Mapped memory is read in place when it is host memory (host-visible buffers, or
        // anything on unified memory). Device memory behind a BAR mapping is not: the CPU's
        // uncached reads cross PCIe one cache line at a time, far slower than a staging copy
        // (measured: bench/results/source-comment-history.md).
        let host_memory =
            src.location() == MemoryLocation::HostVisible || self.caps().unified_memory;
        if src.is_mapped() && host_memory {
            let v = src.last_write();
            if v > 0 {
                self.wait(v)?;
            }
            return src.read_mapped(offset, out);
        }
        for (i, chunk) in out.chunks_mut(STAGING_CHUNK as usize).enumerate() {
            let staging =
                self.create_host_buffer(chunk.len() as u64, MemoryLocation::HostVisible)?;
            let at = offset + i as u64 * STAGING_CHUNK;
            let len = chunk.len() as u64;
            if self.copy_queue.is_some() {
                // On the copy engine after the compute work that wrote `src`: compute keeps
                // running while the data crosses PCIe.
                let after = src.last_write();
                if after > self.last_submitted() {
                    self.flush()?;
                }
                let copy = Copy {
                    src,
                    src_offset: at,
                    dst: &staging,
                    dst_offset: 0,
                    len,
                };
                let value = self.submit_copies(&[copy], after)?;
                self.wait_copies(value)?;
            } else {
                self.record_copy(src, at, &staging, 0, len)?;
                self.wait(staging.last_write())?;
            }
            staging.read_mapped(0, chunk)?;
        }
        Ok(())
    }

    fn check_own(&self, buffer: &Buffer, what: &'static str) -> Result<()> {
        if std::ptr::eq(buffer.core(), &self.core) {
            Ok(())
        } else {
            Err(Error::ForeignObject { what })
        }
    }
}
