// Host <-> buffer copies for the synchronous runtime.
//
// A mapped buffer is read and written in place. Anything else goes through a temporary
// host-visible staging buffer and `vkCmdCopyBuffer`, in chunks of at most `STAGING_CHUNK`
// bytes so that a multi-GiB tensor never needs a multi-GiB staging allocation. A
// persistent staging ring (and no staging at all on unified memory) comes with the async
// engine.

use std::sync::Arc;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::memory::{Buffer, MemoryLocation};

/// Largest staging buffer one transfer allocates.
pub const STAGING_CHUNK: u64 = 64 << 20;

impl Context {
    /// Writes `bytes` into `dst` at `offset`, and returns once the data is in place.
    pub fn upload(self: &Arc<Self>, dst: &Buffer, offset: u64, bytes: &[u8]) -> Result<()> {
        self.check_own(dst, "upload destination")?;
        dst.check_range("upload", offset, bytes.len() as u64)?;
        if bytes.is_empty() {
            return Ok(());
        }
        if dst.is_mapped() {
            return dst.write_mapped(offset, bytes);
        }
        let staging = self.create_buffer(chunk_len(bytes.len()), MemoryLocation::HostVisible)?;
        for (i, chunk) in bytes.chunks(STAGING_CHUNK as usize).enumerate() {
            staging.write_mapped(0, chunk)?;
            let at = offset + i as u64 * STAGING_CHUNK;
            self.submit_and_wait(|rec| rec.copy_buffer(&staging, 0, dst, at, chunk.len() as u64))?;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes of `src` starting at `offset` into `out`.
    pub fn download(self: &Arc<Self>, src: &Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check_own(src, "download source")?;
        src.check_range("download", offset, out.len() as u64)?;
        if out.is_empty() {
            return Ok(());
        }
        if src.is_mapped() {
            return src.read_mapped(offset, out);
        }
        let staging = self.create_buffer(chunk_len(out.len()), MemoryLocation::HostVisible)?;
        for (i, chunk) in out.chunks_mut(STAGING_CHUNK as usize).enumerate() {
            let at = offset + i as u64 * STAGING_CHUNK;
            self.submit_and_wait(|rec| rec.copy_buffer(src, at, &staging, 0, chunk.len() as u64))?;
            staging.read_mapped(0, chunk)?;
        }
        Ok(())
    }

    fn check_own(&self, buffer: &Buffer, what: &'static str) -> Result<()> {
        if std::ptr::eq(buffer.context(), self) {
            Ok(())
        } else {
            Err(Error::ForeignObject { what })
        }
    }
}

fn chunk_len(len: usize) -> u64 {
    (len as u64).min(STAGING_CHUNK)
}
