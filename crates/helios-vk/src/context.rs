//! The logical device: one compute queue, one timeline, one pipeline cache.
//!
//! A `Context` is the device core (core.rs) and the parts that take it: the queues
//! (queue.rs), the encoder and its spare command lists (batch.rs), the pools (pool.rs) and
//! the submit thread (worker.rs). It is made and torn down here; its methods that use several
//! parts are in encoder.rs, submit.rs, copy_queue.rs, transfer.rs, timer.rs and objects.rs.
//!
//! A `Context` is shared as `Arc<Context>` and is `Send + Sync`; every object made from it
//! (buffers, pipelines) holds that `Arc` (as an `Owner`, owner.rs), so the device outlives
//! them and Drop order is right by construction: objects, then the device, then the instance
//! (also held by `Arc`). Methods that create owned objects take `self: &Arc<Self>` for that
//! reason.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::adapter::{select_adapter_from_env, Adapter};
use crate::batch::{Encoder, DEFAULT_BATCH};
use crate::caps::{Caps, DeviceType, QueueFamily};
use crate::core::Core;
use crate::env;
use crate::error::{vk_err, Error, Result};
use crate::executable::{self, ExecutableCapture, ExecutableStats};
use crate::features::{self, EnabledFeatures};
use crate::instance::{Instance, InstanceOptions};
use crate::native;
use crate::owner::Owner;
use crate::pipeline::Pipeline;
use crate::pipeline_cache::{PipelineCache, PipelineCacheDir, PipelineStats, HELIOS_VERBOSE};
use crate::pool::Pools;
use crate::profile::{ProfileReport, Profiler, HELIOS_PROFILE};
use crate::queue::{CopyQueue, Submitter};
use crate::worker::Jobs;

pub struct Context {
    /// The device and what was fixed when it was made (core.rs); the parts take this.
    pub(crate) core: Core,
    pub(crate) submitter: Submitter,
    /// The dedicated transfer queue, where the device has one (copy_queue.rs).
    pub(crate) copy_queue: Option<CopyQueue>,
    /// The one open batch all GPU commands are recorded into (encoder.rs).
    pub(crate) encoder: Mutex<Encoder>,
    /// Emptied command lists of submitted batches, for the next ones (encoder.rs).
    pub(crate) spare_commands: Mutex<Vec<crate::commands::Commands>>,
    /// The caching allocator, and the exported allocations beside it (pool.rs).
    pub(crate) pools: Pools,
    /// How long `wait` polls the timeline before blocking (`HELIOS_SPIN_US`).
    pub(crate) spin: Duration,
    /// This Context's own handle, for the batches it queues (worker.rs).
    pub(crate) me: Weak<Context>,
    /// Closed batches waiting for the submit thread (worker.rs).
    pub(crate) jobs: Arc<Jobs<Context>>,
    /// Whether the submit thread runs (else batches are submitted where they close).
    pub(crate) has_worker: bool,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// How a Context is set up beyond its device. `default()` persists the pipeline cache under
/// the user cache dir and does not profile; `from_env()` reads the HELIOS_* switches.
#[derive(Clone, Debug)]
pub struct ContextOptions {
    /// `HELIOS_PIPELINE_CACHE=0` → `Disabled`; `HELIOS_CACHE_DIR=<dir>` → `Root(dir)`.
    pub pipeline_cache: PipelineCacheDir,
    /// `HELIOS_PROFILE=1`: GPU timestamps around every dispatch.
    pub profile: bool,
    /// `HELIOS_VERBOSE=1`: notes about ignored cache files and failed saves on stderr.
    pub verbose: bool,
    /// `HELIOS_BATCH=<n>`: dispatches per submitted batch (0 means the default).
    pub batch_limit: u32,
    /// `HELIOS_SPIN_US=<µs>`: how long a host wait polls before sleeping; `None`: the
    /// device's default (`GPU_SPIN_US` on GPUs, `CPU_SPIN_US` on CPU devices).
    pub spin_us: Option<u32>,
    /// `HELIOS_TRANSFER_QUEUE=0` keeps staged copies on the compute queue even where a
    /// dedicated transfer queue exists.
    pub transfer_queue: bool,
    /// `HELIOS_BAR=0` keeps device-local buffers in the plain device-local memory type even
    /// where all of VRAM is host-visible (resizable BAR).
    pub bar: bool,
    /// `HELIOS_SUBMIT_THREAD=0|1`: whether closed batches are recorded into command buffers
    /// and submitted on a thread of their own (worker.rs); `None`: on GPUs, not on CPU
    /// devices (lavapipe), where that thread competes with the device's own threads (on a
    /// 2-core VM it doubled a small model's median step).
    pub submit_thread: Option<bool>,
    /// `HELIOS_PIPELINE_STATS=1|2`: compute pipelines capture the driver's compiler
    /// statistics (and internal representations), read with `Context::pipeline_statistics`;
    /// ignored with a note where the device lacks VK_KHR_pipeline_executable_properties.
    pub pipeline_statistics: ExecutableCapture,
    /// `HELIOS_COOPMAT2=0` leaves VK_NV_cooperative_matrix2 off (workgroup-scope matrix
    /// kernels then never run).
    pub cooperative_matrix2: bool,
    /// `HELIOS_MEMORY_LIMIT=<bytes>`: the most device-local memory the pool may hold; past
    /// it an allocation fails as out of device memory (after the pool gave back what it
    /// cached).
    pub memory_limit: Option<u64>,
    /// `HELIOS_NATIVE=0` leaves VK_NVX_binary_import off: no native (PTX) kernels even where
    /// the driver offers them.
    pub native_kernels: bool,
}

impl Default for ContextOptions {
    fn default() -> Self {
        ContextOptions {
            pipeline_cache: PipelineCacheDir::default(),
            profile: false,
            verbose: false,
            batch_limit: DEFAULT_BATCH,
            spin_us: None,
            transfer_queue: true,
            bar: true,
            submit_thread: None,
            pipeline_statistics: ExecutableCapture::Off,
            cooperative_matrix2: true,
            memory_limit: None,
            native_kernels: true,
        }
    }
}

impl ContextOptions {
    pub fn from_env() -> Result<Self> {
        Ok(ContextOptions {
            pipeline_cache: PipelineCacheDir::from_env()?,
            profile: env::flag(HELIOS_PROFILE)?.unwrap_or(false),
            verbose: env::flag(HELIOS_VERBOSE)?.unwrap_or(false),
            batch_limit: env::u32_or(env::HELIOS_BATCH, DEFAULT_BATCH)?,
            spin_us: env::u32_opt(env::HELIOS_SPIN_US)?,
            transfer_queue: env::flag(env::HELIOS_TRANSFER_QUEUE)?.unwrap_or(true),
            bar: env::flag(env::HELIOS_BAR)?.unwrap_or(true),
            submit_thread: env::flag(env::HELIOS_SUBMIT_THREAD)?,
            pipeline_statistics: ExecutableCapture::from_env()?,
            cooperative_matrix2: env::flag(env::HELIOS_COOPMAT2)?.unwrap_or(true),
            memory_limit: env::bytes(env::HELIOS_MEMORY_LIMIT)?,
            native_kernels: env::flag(env::HELIOS_NATIVE)?.unwrap_or(true),
        })
    }

    /// Default options with the pipeline cache under `root` (tests use a temp dir).
    pub fn with_cache_dir(root: impl Into<PathBuf>) -> Self {
        ContextOptions {
            pipeline_cache: PipelineCacheDir::Root(root.into()),
            ..Default::default()
        }
    }
}

impl Context {
    /// A Context with `ContextOptions::default()`.
    pub fn new(instance: Arc<Instance>, adapter: &Adapter) -> Result<Arc<Context>> {
        Context::with_options(instance, adapter, &ContextOptions::default())
    }

    pub fn with_options(
        instance: Arc<Instance>,
        adapter: &Adapter,
        options: &ContextOptions,
    ) -> Result<Arc<Context>> {
        if adapter.instance_handle() != instance.raw().handle() {
            return Err(Error::ForeignAdapter);
        }
        let caps = adapter.caps();
        features::check_required(caps)?;
        let queue_family =
            pick_queue_family(&caps.queue_families).ok_or_else(|| Error::DeviceUnsupported {
                device: caps.name.clone(),
                missing: "a queue family with compute support".into(),
            })?;
        let want_stats = options.pipeline_statistics != ExecutableCapture::Off;
        let (mut enabled, withheld) = features::plan(
            caps,
            instance.validation_layer_version(),
            want_stats,
            options.cooperative_matrix2,
            options.native_kernels,
        );
        if want_stats && !enabled.pipeline_executable_info {
            eprintln!(
                "helios: pipeline statistics not captured: {} lacks \
                 VK_KHR_pipeline_executable_properties",
                caps.name
            );
        }
        for ext in withheld {
            eprintln!(
                "helios: {ext} left off: the installed validation layer predates it \
                 (update vulkan-validationlayers, or unset HELIOS_VALIDATION to use it)"
            );
        }
        let transfer_family = options
            .transfer_queue
            .then(|| pick_transfer_family(&caps.queue_families))
            .flatten();
        let families: Vec<u32> = std::iter::once(queue_family)
            .chain(transfer_family)
            .collect();
        let device =
            features::create_device(instance.raw(), adapter.raw(), caps, &families, &enabled)?;

        let objects = init_device_objects(&instance, adapter, &device, queue_family, options);
        let (submitter, pipeline_cache, profiler) = match objects {
            Ok(objects) => objects,
            Err(e) => {
                // SAFETY: nothing else was created on the device or submitted to it.
                unsafe { device.destroy_device(None) };
                return Err(e);
            }
        };
        let copy_queue = match transfer_family
            .map(|f| CopyQueue::new(&device, f))
            .transpose()
        {
            Ok(q) => q,
            Err(e) => {
                // SAFETY: nothing was submitted yet.
                unsafe {
                    submitter.destroy(&device);
                    pipeline_cache.destroy(&device);
                    if let Some(p) = &profiler {
                        p.destroy();
                    }
                    device.destroy_device(None);
                }
                return Err(e);
            }
        };
        // SAFETY: plain query on a valid physical device.
        let memory = unsafe {
            instance
                .raw()
                .get_physical_device_memory_properties(adapter.raw())
        };
        let debug_utils = instance
            .options()
            .validation
            .then(|| ash::ext::debug_utils::Device::new(instance.raw(), &device));
        let push_descriptor = enabled
            .push_descriptor
            .then(|| ash::khr::push_descriptor::Device::new(instance.raw(), &device));
        let pipeline_executable = enabled.pipeline_executable_info.then(|| {
            ash::khr::pipeline_executable_properties::Device::new(instance.raw(), &device)
        });
        let mut native_off = native::unavailable_reason(caps, options.native_kernels, &enabled);
        let native = match enabled.native_kernels {
            true => match native::load(instance.raw(), &device) {
                Ok(n) => Some(n),
                Err(why) => {
                    eprintln!("helios: native kernels off: {why}");
                    enabled.native_kernels = false;
                    native_off = Some(why);
                    None
                }
            },
            false => None,
        };
        let external_memory_fd = enabled
            .export_memory
            .then(|| ash::khr::external_memory_fd::Device::new(instance.raw(), &device));
        let external_semaphore_fd = enabled
            .export_timeline
            .then(|| ash::khr::external_semaphore_fd::Device::new(instance.raw(), &device));
        let capture = match enabled.pipeline_executable_info {
            true => options.pipeline_statistics,
            false => ExecutableCapture::Off,
        };
        let jobs = Jobs::new();
        let threaded = options
            .submit_thread
            .unwrap_or(caps.device_type != DeviceType::Cpu);
        let worker = threaded.then(|| jobs.spawn()).flatten();
        Ok(Arc::new_cyclic(|me| Context {
            core: Core {
                instance,
                adapter: adapter.clone(),
                device,
                debug_utils,
                push_descriptor,
                pipeline_executable,
                capture,
                native,
                native_off,
                external_memory_fd,
                external_semaphore_fd,
                queue_family,
                transfer_family,
                bar: options.bar,
                pipeline_cache,
                profiler,
                memory,
                enabled,
            },
            submitter,
            copy_queue,
            encoder: Mutex::new(Encoder::new(match options.batch_limit {
                0 => DEFAULT_BATCH,
                n => n,
            })),
            spare_commands: Mutex::new(Vec::new()),
            pools: Pools::new(options.memory_limit),
            spin: Duration::from_micros(u64::from(options.spin_us.unwrap_or(
                match caps.device_type {
                    DeviceType::Cpu => CPU_SPIN_US,
                    _ => GPU_SPIN_US,
                },
            ))),
            me: me.clone(),
            jobs,
            has_worker: worker.is_some(),
            worker: Mutex::new(worker),
        }))
    }

    /// Instance from `HELIOS_VALIDATION`, device from `HELIOS_DEVICE` (or the default order),
    /// options from `ContextOptions::from_env`.
    pub fn from_env() -> Result<Arc<Context>> {
        Context::from_env_with(&ContextOptions::from_env()?)
    }

    /// As `from_env`, with `options` for the Context.
    pub fn from_env_with(options: &ContextOptions) -> Result<Arc<Context>> {
        let instance = Arc::new(Instance::new(&InstanceOptions::from_env()?)?);
        let adapters = instance.adapters()?;
        let adapter = select_adapter_from_env(&adapters)?;
        Context::with_options(instance, adapter, options)
    }

    pub fn caps(&self) -> &Caps {
        self.core.caps()
    }

    /// Features actually enabled on this device; kernels check these, not `caps()`.
    pub fn enabled(&self) -> &EnabledFeatures {
        self.core.enabled()
    }

    pub fn adapter(&self) -> &Adapter {
        &self.core.adapter
    }

    pub fn instance(&self) -> &Arc<Instance> {
        &self.core.instance
    }

    /// Shortcut for `instance().validation_messages()`.
    pub fn validation_messages(&self) -> Vec<String> {
        self.core.instance.validation_messages()
    }

    pub fn queue_family_index(&self) -> u32 {
        self.core.queue_family
    }

    /// The queue families Helios submits to: compute, and the transfer family if in use.
    pub fn queue_families(&self) -> Vec<u32> {
        self.core.queue_families()
    }

    /// Whether staged copies run on a dedicated transfer queue.
    pub fn has_transfer_queue(&self) -> bool {
        self.copy_queue.is_some()
    }

    /// Pipeline creation counters and where the pipeline cache persists.
    pub fn pipeline_stats(&self) -> PipelineStats {
        self.core.pipeline_cache.stats()
    }

    /// When this Context's pipeline cache was made: the zero of `HELIOS_VERBOSE`'s compile
    /// lines ("from N ms"), so a caller can place its own events among them.
    pub fn created_at(&self) -> std::time::Instant {
        self.core.pipeline_cache.born()
    }

    /// Writes the pipeline cache to its file now (also done when the Context drops). Does
    /// nothing when persistence is off.
    pub fn save_pipeline_cache(&self) -> Result<()> {
        self.core.pipeline_cache.save(self.device())
    }

    /// What pipelines of this Context capture; `Off` unless it was asked for and the device
    /// offers VK_KHR_pipeline_executable_properties.
    pub fn executable_capture(&self) -> ExecutableCapture {
        self.core.capture
    }

    /// The `HELIOS_PIPELINE_STATS` report: one stderr line of statistics per executable of
    /// `pipeline` (`helios: stats <name>: <stat>=<value>, ...`). Returns the executables it
    /// printed, empty (and prints nothing) when statistics are not captured.
    pub fn report_statistics(&self, name: &str, pipeline: &Pipeline) -> Vec<ExecutableStats> {
        executable::report(name, self.pipeline_statistics(pipeline))
    }

    /// The driver's statistics (and, when captured, text representations) of every
    /// executable of `pipeline`; empty when statistics are not captured
    /// (`Context::executable_capture` is `Off`).
    pub fn pipeline_statistics(&self, pipeline: &Pipeline) -> Result<Vec<ExecutableStats>> {
        if !std::ptr::eq(pipeline.core(), &self.core) {
            return Err(Error::ForeignObject {
                what: "the pipeline whose statistics were asked for",
            });
        }
        executable::statistics(
            self.core.pipeline_executable.as_ref(),
            pipeline.raw(),
            pipeline.create_flags(),
        )
    }

    /// The driver's pipeline cache contents (what `save_pipeline_cache` writes, unwrapped).
    pub fn pipeline_cache_data(&self) -> Result<Vec<u8>> {
        let cache = self.core.pipeline_cache();
        // SAFETY: the cache belongs to this device; the driver synchronises cache access.
        unsafe { self.device().get_pipeline_cache_data(cache) }
            .map_err(vk_err("vkGetPipelineCacheData"))
    }

    /// The profiler, when this Context was created with profiling on and the device has
    /// timestamps.
    pub fn profiler(&self) -> Option<&Profiler> {
        self.core.profiler.as_ref()
    }

    /// Collects every completed span and returns the table; `None` when not profiling.
    pub fn profile_report(&self) -> Result<Option<ProfileReport>> {
        let Some(p) = self.profiler() else {
            return Ok(None);
        };
        p.collect(self.completed()?)?;
        Ok(Some(p.report()))
    }

    pub(crate) fn device(&self) -> &ash::Device {
        self.core.device()
    }

    /// The raw device, for recording into command buffers Helios does not own (profiling
    /// tests, interop). Destroying it or its queue's objects is the caller's bug.
    pub fn raw_device(&self) -> &ash::Device {
        self.core.device()
    }

    /// This Context as the objects made on it hold it (owner.rs).
    pub(crate) fn owner(&self) -> Arc<dyn Owner> {
        self.me.upgrade().expect("a Context in use has a handle")
    }
}

/// What buffers, exported memory, timelines, pipelines and native kernels use of the Context
/// they hold (owner.rs).
impl Owner for Context {
    fn core(&self) -> &Core {
        &self.core
    }

    fn pools(&self) -> &Pools {
        &self.pools
    }

    fn wait(&self, value: u64) -> Result<()> {
        Context::wait(self, value)
    }

    fn wait_copies(&self, value: u64) -> Result<()> {
        Context::wait_copies(self, value)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // Queued batches hold a handle, so none is queued now. The submit thread ends; where
        // this runs on it (it dropped the last handle), it ends once this returns.
        self.jobs.close();
        let worker = self.worker.get_mut().map(Option::take).unwrap_or(None);
        if let Some(w) = worker {
            if w.thread().id() != std::thread::current().id() {
                let _ = w.join();
            }
        }
        // SAFETY: buffers and pipelines hold an Arc<Context>, so none is left; waiting for
        // idle first makes destroying the command pools and semaphore legal.
        unsafe {
            let _ = self.core.device.device_wait_idle();
            self.pools.destroy(&self.core.device);
            let core = &self.core;
            if let Some(q) = &self.copy_queue {
                q.destroy(&core.device);
            }
            self.submitter.destroy(&core.device);
            if let Some(profiler) = &core.profiler {
                profiler.destroy();
            }
            // Saves the cache file first if a pipeline was created since the last save.
            core.pipeline_cache.destroy(&core.device);
            core.device.destroy_device(None);
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.core.adapter.name())
            .field("queue_family", &self.core.queue_family)
            .field("enabled", &self.core.enabled)
            .finish()
    }
}

/// A transfer-only queue family (the copy engine), if the device has one.
pub fn pick_transfer_family(families: &[QueueFamily]) -> Option<u32> {
    families
        .iter()
        .find(|q| q.queue_count > 0 && q.has("transfer") && !q.has("compute") && !q.has("graphics"))
        .map(|q| q.index)
}

/// Default for `HELIOS_SPIN_US` on GPUs: a host wait polls for up to 100 ms before it
/// sleeps in the driver, as CUDA's default wait spins. Waking from that sleep costs about
/// 100 µs on the H100 host (a VM), and every training step ends in a wait: polling
/// throughout measured faster than a 1 ms poll in `bench graph` and `bench train` (figures
/// in bench/results/source-comment-history.md).
///
/// Past the first millisecond the poll yields the core between reads
/// (`Context::wait_timeline`); host12 measured no slower for it, nor faster without the
/// yield. A wait longer than 100 ms pays the wake-up, under 0.1% of it.
const GPU_SPIN_US: u32 = 100_000;

/// Default for `HELIOS_SPIN_US` on CPU devices (lavapipe): long enough to catch a short
/// kernel, short enough not to take a core from the device's own threads while a long one
/// runs.
const CPU_SPIN_US: u32 = 1000;

/// The queue family Helios submits to: the first with graphics and compute (the universal
/// family, which every driver schedules well), else the first with compute. A dedicated
/// transfer family for overlapping copies is a later step.
pub fn pick_queue_family(families: &[QueueFamily]) -> Option<u32> {
    let usable = |q: &&QueueFamily| q.queue_count > 0 && q.has("compute");
    families
        .iter()
        .filter(usable)
        .find(|q| q.has("graphics"))
        .or_else(|| families.iter().find(usable))
        .map(|q| q.index)
}

/// The per-device objects a Context owns, cleaned up here if one of them fails.
fn init_device_objects(
    instance: &Instance,
    adapter: &Adapter,
    device: &ash::Device,
    queue_family: u32,
    options: &ContextOptions,
) -> Result<(Submitter, PipelineCache, Option<Profiler>)> {
    // SAFETY: the queue family was requested with one queue at creation.
    let queue = unsafe { device.get_device_queue(queue_family, 0) };
    let submitter = Submitter::new(device, queue, queue_family)?;
    let (raw, pd) = (instance.raw(), adapter.raw());
    let cache = PipelineCache::new(raw, pd, device, &options.pipeline_cache, options.verbose);
    let cache = match cache {
        Ok(cache) => cache,
        Err(e) => {
            // SAFETY: nothing was submitted yet.
            unsafe { submitter.destroy(device) };
            return Err(e);
        }
    };
    let profiler = match options.profile {
        true => Profiler::new(device, adapter.caps(), queue_family),
        false => Ok(None),
    };
    match profiler {
        Ok(profiler) => Ok((submitter, cache, profiler)),
        Err(e) => {
            // SAFETY: nothing was submitted or created from the cache yet.
            unsafe {
                submitter.destroy(device);
                cache.destroy(device);
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family(index: u32, flags: &[&str], queue_count: u32) -> QueueFamily {
        QueueFamily {
            index,
            flags: flags.iter().map(|f| f.to_string()).collect(),
            queue_count,
            timestamp_valid_bits: 64,
        }
    }

    #[test]
    fn queue_family_choice() {
        // H200-like: universal family first.
        let h200 = [
            family(0, &["graphics", "compute", "transfer"], 16),
            family(1, &["compute", "transfer"], 8),
            family(2, &["transfer"], 2),
        ];
        assert_eq!(pick_queue_family(&h200), Some(0));
        let compute_only = [family(0, &["transfer"], 1), family(1, &["compute"], 1)];
        assert_eq!(pick_queue_family(&compute_only), Some(1));
        let late_universal = [
            family(0, &["compute"], 1),
            family(1, &["graphics", "compute"], 1),
        ];
        assert_eq!(pick_queue_family(&late_universal), Some(1));
        assert_eq!(
            pick_queue_family(&[family(0, &["graphics", "compute"], 0)]),
            None
        );
        assert_eq!(pick_queue_family(&[]), None);
    }

    #[test]
    fn transfer_family_is_transfer_only() {
        let h200 = [
            family(0, &["graphics", "compute", "transfer"], 16),
            family(1, &["transfer", "sparse_binding"], 2),
            family(2, &["compute", "transfer"], 8),
        ];
        assert_eq!(pick_transfer_family(&h200), Some(1));
        let lavapipe = [family(0, &["graphics", "compute", "transfer"], 1)];
        assert_eq!(pick_transfer_family(&lavapipe), None);
        assert_eq!(pick_transfer_family(&[family(0, &["transfer"], 0)]), None);
    }
}
