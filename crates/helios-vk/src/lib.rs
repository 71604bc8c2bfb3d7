//! helios-vk: the Vulkan runtime under Helios.
//!
//! Loads Vulkan at run time, probes what each device can do ([`Caps`]), creates a logical
//! device ([`Context`]) with every useful feature it supports, and offers buffers addressed
//! by device address, compute pipelines from run-time SPIR-V, and submission ordered by one
//! timeline semaphore. Dispatches are batched by the encoder (`Context::dispatch`), whose
//! closed batches are recorded into command buffers and submitted on a submit thread on GPUs
//! (worker.rs); `submit`/`completed`/`wait` and the blocking `upload`/`download` sit beside
//! it. It knows nothing of tensors.
//!
//! Kernels come in two kinds: SPIR-V compute [`Pipeline`]s, which run on every device, and
//! [`NativeKernel`]s, CUDA kernels from PTX text that NVIDIA's driver compiles and launches
//! through VK_NVX_binary_import (native.rs; `EnabledFeatures::native_kernels` says whether a
//! device has them). Both are recorded by the same encoder (`Context::dispatch`,
//! `Context::launch_native`), so they mix freely in one batch, ordered by the same hazard
//! tracking, over the same buffers.
//!
//! How the modules relate, in three layers. Below the Context: `instance` loads Vulkan;
//! `probe` (with `coopmat2`) fills [`Caps`] for each device, `adapter` picks one and
//! `features` decides what to enable; `core` holds the logical device made from them. The
//! parts take that core, never the Context: memory (`block` allocates from the driver, `pool`
//! carves and recycles, `memory` has the buffers), kernels (`pipeline`, `pipeline_cache`,
//! `executable`, `native`), sharing with CUDA (`external`), the open batch (`batch`, with
//! `hazards` deciding its barriers, `commands` listing and replaying its commands,
//! `recorder` checking and adding them), the queues (`queue`) and the submit thread
//! (`worker`). Objects made on a Context keep it alive through `owner`. In the middle,
//! [`Context`] (`context`) composes the core and the parts. Above it are its methods that use
//! several parts: recording (`encoder`), submitting and waiting (`submit`), copies on the
//! transfer queue (`copy_queue`), host transfers (`transfer`), GPU timers (`timer`) and
//! making objects (`objects`). `caps`, `conv` and `env` are plain data and pure functions,
//! `sync` holds the lock helpers and `profile` the dispatch timestamps.
//!
//! ```no_run
//! # fn main() -> helios_vk::Result<()> {
//! let ctx = helios_vk::Context::from_env()?; // HELIOS_VALIDATION, HELIOS_DEVICE
//! let buf = ctx.create_buffer(1024, helios_vk::MemoryLocation::DeviceLocal)?;
//! ctx.upload(&buf, 0, &[1u8; 1024])?;
//! # Ok(()) }
//! ```

mod adapter;
mod batch;
mod block;
mod caps;
mod commands;
mod compile_pool;
mod context;
pub mod conv;
mod coopmat2;
mod copy_queue;
mod core;
mod encoder;
pub mod env;
mod error;
mod executable;
mod external;
mod features;
mod hazards;
mod instance;
mod memory;
mod native;
mod objects;
mod owner;
mod pipeline;
mod pipeline_cache;
mod pool;
mod probe;
mod profile;
mod queue;
mod recorder;
mod submit;
pub mod sync;
mod timer;
mod transfer;
mod worker;

pub use adapter::{select_adapter, select_adapter_from_env, Adapter};
pub use batch::{Access, EncoderStats, DEFAULT_BATCH};
pub use block::{choose_memory_type, MemoryLocation};
pub use caps::{
    Caps, CooperativeMatrixShape, DeviceType, External, ExternalSupport, Features, Limits,
    MemoryHeap, MemoryType, QueueFamily, Subgroup,
};
pub use commands::submit_compile_waits;
pub use compile_pool::stop_compiles;
pub use context::{pick_queue_family, pick_transfer_family, Context, ContextOptions};
pub use coopmat2::{CooperativeMatrix2, FlexibleShape};
pub use encoder::SubmitHold;
pub use error::{Error, Result};
pub use executable::{ExecutableCapture, ExecutableStats, StatValue, HELIOS_PIPELINE_STATS};
pub use external::{ExportedMemory, ExternalTimeline, REGION_ALIGN};
pub use features::EnabledFeatures;
pub use instance::{Instance, InstanceOptions};
pub use memory::Buffer;
pub use native::{NativeArg, NativeKernel, MAX_NATIVE_BLOCK_THREADS, MAX_NATIVE_PARAM_BYTES};
pub use pipeline::{Pipeline, PipelineDesc};
pub use pipeline_cache::{
    PipelineCacheDir, PipelineStats, HELIOS_CACHE_DIR, HELIOS_PIPELINE_CACHE, HELIOS_VERBOSE,
};
pub use pool::MemoryStats;
pub use probe::BUFFER_USAGE;
pub use profile::{
    ProfileReport, ProfileRow, Profiler, Span, HELIOS_PROFILE, MAX_POOLS, QUERIES_PER_POOL,
};
pub use recorder::{Recorder, MAX_COPY_REGION};
pub use timer::{GpuSpan, GpuTimer};
pub use transfer::{Snapshot, STAGING_CHUNK};

/// Re-exported so callers can name the raw types in the few escape hatches (`Buffer::raw`).
pub use ash::vk;

// The runtime is shared across threads; keep that a compile-time fact.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Instance>();
    send_sync::<Context>();
    send_sync::<Buffer>();
    send_sync::<Pipeline>();
    send_sync::<NativeKernel>();
    send_sync::<Adapter>();
    send_sync::<Profiler>();
    send_sync::<ExportedMemory>();
    send_sync::<ExternalTimeline>();
};
