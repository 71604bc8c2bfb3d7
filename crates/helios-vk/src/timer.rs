//! GPU timers: two timestamps around a stretch of recorded work, like CUDA events.
//!
//! Benchmarks compare with PyTorch's CUDA-event timings, which measure from when the GPU
//! starts the first op to when it finishes the last, without the host's submit and wake-up
//! latency. A `GpuTimer` does the same on the encoder's command stream: `start` writes a
//! timestamp into the open batch, `stop` writes another after everything recorded since, and
//! `elapsed` waits for the batch and reads both. Each timer has its own two-query pool (this
//! is a measuring tool, not a hot path).

use ash::vk;

use crate::context::Context;
use crate::error::{vk_err, Error, Result};

/// A started GPU timer; `Context::stop_gpu_timer` ends it.
#[derive(Debug)]
pub struct GpuTimer {
    pool: vk::QueryPool,
}

/// A stopped GPU timer whose result can be read once its batch completes.
#[derive(Debug)]
pub struct GpuSpan {
    pool: vk::QueryPool,
    /// Timeline value of the batch holding the stop timestamp.
    value: u64,
}

impl Context {
    /// Writes a start timestamp after the work recorded so far has finished.
    pub fn start_gpu_timer(&self) -> Result<GpuTimer> {
        let family = &self.caps().queue_families[self.queue_family_index() as usize];
        if family.timestamp_valid_bits == 0 {
            return Err(Error::DeviceUnsupported {
                device: self.caps().name.clone(),
                missing: "timestamps on its compute queue".into(),
            });
        }
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2);
        // SAFETY: valid device and create info.
        let pool = unsafe { self.device().create_query_pool(&info, None) }
            .map_err(vk_err("vkCreateQueryPool"))?;
        let recorded = self.with_batch(|batch| {
            batch.commands.reset_queries(pool, 0, 2);
            batch.commands.timestamp(pool, 0);
            Ok(())
        });
        if let Err(e) = recorded {
            // SAFETY: nothing was recorded that uses the pool.
            unsafe { self.device().destroy_query_pool(pool, None) };
            return Err(e);
        }
        Ok(GpuTimer { pool })
    }

    /// Writes the stop timestamp after everything recorded since `start_gpu_timer`.
    pub fn stop_gpu_timer(&self, timer: GpuTimer) -> Result<GpuSpan> {
        let pool = timer.pool;
        let value = self.with_batch(|batch| {
            // Query 1 was reset with the pool.
            batch.commands.timestamp(pool, 1);
            Ok(batch.value)
        })?;
        Ok(GpuSpan { pool, value })
    }

    /// `gpu_elapsed` without waiting: the span back (`Err`) while its batch has not completed.
    /// For measuring work a program does anyway (the tuners' exploration), where the host
    /// must never stop for a timing.
    pub fn gpu_elapsed_if_done(
        &self,
        span: GpuSpan,
    ) -> Result<std::result::Result<std::time::Duration, GpuSpan>> {
        if self.completed()? < span.value {
            return Ok(Err(span));
        }
        self.gpu_elapsed(span).map(Ok)
    }

    /// A full barrier in the open batch: what is recorded next starts only after everything
    /// recorded so far has finished. Around a timed stretch of real work, it keeps the
    /// neighbours out of the measurement (a timestamp waits for earlier work, but does not
    /// hold back later work).
    pub fn full_barrier(&self) -> Result<()> {
        self.with_batch(|batch| {
            batch.barrier();
            Ok(())
        })
    }

    /// Waits for the span's batch and returns the GPU time between the two timestamps.
    pub fn gpu_elapsed(&self, span: GpuSpan) -> Result<std::time::Duration> {
        self.wait(span.value)?;
        let mut ticks = [0u64; 2];
        // SAFETY: both queries were written by a batch that has completed.
        let read = unsafe {
            self.device().get_query_pool_results(
                span.pool,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64,
            )
        };
        // SAFETY: the batch that used the pool has completed.
        unsafe { self.device().destroy_query_pool(span.pool, None) };
        read.map_err(vk_err("vkGetQueryPoolResults"))?;
        let family = &self.caps().queue_families[self.queue_family_index() as usize];
        let mask = match family.timestamp_valid_bits {
            64.. => u64::MAX,
            bits => (1u64 << bits) - 1,
        };
        let delta = (ticks[1] & mask).wrapping_sub(ticks[0] & mask) & mask;
        let ns = delta as f64 * f64::from(self.caps().limits.timestamp_period);
        Ok(std::time::Duration::from_nanos(ns as u64))
    }
}
