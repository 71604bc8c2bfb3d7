//! GPU time of the phases of a training step (forward, backward, collectives, optimizer),
//! like CUDA events: timestamps around each phase's work, read after the step's one wait,
//! so the host never stops the GPU to time it. Where the queue has no timestamps (or a
//! timer cannot be made), host time instead.

use std::time::Instant;

use helios::Device;
use helios_vk::{GpuSpan, GpuTimer};

use crate::Result;

/// A phase being recorded.
pub(crate) enum Phase {
    Gpu(GpuTimer),
    Host(Instant),
}

/// A recorded phase, to be read once its work has run.
pub(crate) enum Span {
    Gpu(GpuSpan),
    Host(f64),
}

impl Phase {
    /// Starts timing the work recorded from now on.
    pub(crate) fn start(device: &Device) -> Phase {
        match device.context().start_gpu_timer() {
            Ok(t) => Phase::Gpu(t),
            Err(_) => Phase::Host(Instant::now()),
        }
    }

    /// Ends the phase after the work recorded so far.
    pub(crate) fn stop(self, device: &Device) -> Result<Span> {
        Ok(match self {
            Phase::Gpu(t) => Span::Gpu(
                device
                    .context()
                    .stop_gpu_timer(t)
                    .map_err(helios::Error::from)?,
            ),
            Phase::Host(t) => Span::Host(t.elapsed().as_secs_f64() * 1e3),
        })
    }
}

/// The milliseconds of `spans` together; waits for their work.
pub(crate) fn total_ms(device: &Device, spans: Vec<Span>) -> Result<f64> {
    let mut ms = 0.0;
    for span in spans {
        ms += match span {
            Span::Gpu(s) => {
                let elapsed = device
                    .context()
                    .gpu_elapsed(s)
                    .map_err(helios::Error::from)?;
                elapsed.as_secs_f64() * 1e3
            }
            Span::Host(ms) => ms,
        };
    }
    Ok(ms)
}
