//! `Device`: a cheap handle on one Vulkan device plus the kernels compiled for it.
//!
//! Pipelines are cached in memory by kernel signature (`KernelKey`: the kernel family's
//! description, which names every property that changes the emitted SPIR-V), so each kernel
//! is generated and compiled once per device.

use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex};

use helios_kernels::reduce::ReduceKernel;
use helios_kernels::rows::RowConfig;
use helios_kernels::softmax::SoftmaxKernel;
use helios_kernels::{ElementwiseKernel, ElementwiseOp, FusedKernel, Variant, MAX_DIMS};
use helios_vk::NativeKernel;

use crate::realize_lock::LockExt;
use crate::DType;

/// Largest read-back done by a copy kernel into host memory (larger ones use the copy engine,
/// which moves big buffers faster).
const KERNEL_READBACK_MAX: usize = 1 << 20;

/// Default warm-up before timed GPU work, ms (see [`Device::warm_up`]): longer than the
/// idle SM clock takes to come up under sustained load
/// (`bench/results/2026-11-25-clocks-h100-session15.txt`).
pub const WARM_UP_MS: u32 = 1000;

/// Kernel choices a Device makes for every op (the environment sets them in `Device::new`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    /// How kernels receive buffers (`HELIOS_BINDING`).
    pub binding: Binding,
    /// vec4s per invocation in element-wise kernels: 1, 2 or 4 (`HELIOS_EW_VECS`); `None`
    /// picks per dtype what measured fastest on the H200 (f32: 1, f16: 2, whose 8-byte vec4
    /// loads need two per invocation to keep enough bytes in flight).
    pub elementwise_vecs: Option<u8>,
    /// Element-wise kernels without bounds checks when the size is a whole number of tiles
    /// (false keeps the checks, to measure them).
    pub elementwise_exact: bool,
    /// How tensors are read back (`HELIOS_READBACK`).
    pub readback: Readback,
    /// Subgroup operations in reductions, softmax and norms; `false` (`HELIOS_NO_SUBGROUP=1`)
    /// uses shared-memory trees only. Ignored where the device lacks subgroup arithmetic or
    /// shuffles in compute shaders.
    pub subgroups: bool,
    /// Variant and tuning of the row kernels: reduce, softmax, norms (`HELIOS_ROWS`,
    /// `HELIOS_ROW_UNROLL`, `HELIOS_ROW_SLOTS`, `HELIOS_SPLIT_GROUPS`, `HELIOS_WG`).
    pub rows: RowConfig,
}

/// How the operands of an element-wise op lie in memory, as far as choosing its kernel goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandLayout {
    /// Every operand row-major from the start of its buffer, all of `len` elements.
    Contiguous { len: usize },
    /// Anything else, needing `dims` strided dimensions after merging contiguous ones.
    Strided { dims: usize },
}

/// How `Tensor::to_vec` moves data to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readback {
    /// A copy kernel into host memory for small reads on discrete GPUs, else the copy engine.
    Auto,
    /// Always a copy kernel writing host memory.
    Kernel,
    /// Always a staging copy (or an in-place read of host memory).
    CopyEngine,
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig {
            binding: Binding::DeviceAddress,
            elementwise_vecs: None,
            elementwise_exact: true,
            readback: Readback::Auto,
            subgroups: true,
            rows: RowConfig::default(),
        }
    }
}
use helios_spirv::{Binding, KernelModule, ParamSlot};
use helios_vk::{Context, Pipeline, PipelineDesc};

use crate::Result;

/// A handle on one GPU (or lavapipe); clones share the device.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    ctx: Arc<Context>,
    config: KernelConfig,
    /// Invocations per element-wise workgroup (`HELIOS_WG` or the family's default), known
    /// before compiling so that the exact variant can be chosen.
    elementwise_workgroup: u32,
    /// FxHash: looked up on every op.
    kernels: Mutex<FxHashMap<KernelKey, Arc<Compiled>>>,
    /// Fused kernels apart, looked up by reference: the scheduler lowers every group into a
    /// signature it reuses, and a kernel found (every group of a step like the last) costs
    /// no allocation.
    fused: Mutex<FxHashMap<FusedKernel, Arc<Compiled>>>,
    /// The cooperative-matrix fragment layouts of f16 and bf16, once probed.
    frag_maps: [std::sync::OnceLock<Option<helios_kernels::FragMap>>; 2],
    /// The tuning stores' key for this device (`tuning_store::device_key`), built once: the
    /// attention tuner looks its winners up on every call.
    tuning_key: std::sync::OnceLock<String>,
    /// Native (PTX) kernels by signature, JIT-compiled by the driver on first use.
    native: Mutex<FxHashMap<KernelKey, Arc<NativeKernel>>>,
    /// The PTX target the driver accepts, once probed (`native_target`).
    native_target: std::sync::OnceLock<Option<helios_ptx::Target>>,
    /// Where native kernels write their tensor maps, made on first use (`native_maps`).
    native_maps: std::sync::OnceLock<helios_vk::Buffer>,
    /// What matmul selection needs of the device, once found (`ops::matmul_caps`): every
    /// product and attention call asks, and finding it compares feature strings.
    matmul_caps: std::sync::OnceLock<helios_kernels::MatmulCaps>,
}

impl Device {
    /// The best device present (`HELIOS_DEVICE` selects another by index or name), with the
    /// validation layer when `HELIOS_VALIDATION=1`.
    pub fn from_env() -> Result<Device> {
        Ok(Device::new(Context::from_env()?))
    }

    /// Wraps an existing Vulkan context, with the binding model from `HELIOS_BINDING`
    /// (`address`, the default, or `descriptor`; falls back to addresses with a note when the
    /// device lacks push descriptors).
    pub fn new(ctx: Arc<Context>) -> Device {
        let binding = match crate::env::binding() {
            Binding::Descriptor if !ctx.enabled().push_descriptor => {
                eprintln!("helios: HELIOS_BINDING=descriptor needs VK_KHR_push_descriptor; using device addresses");
                Binding::DeviceAddress
            }
            b => b,
        };
        let config = KernelConfig {
            binding,
            elementwise_vecs: crate::env::elementwise_vecs(),
            elementwise_exact: true,
            readback: crate::env::readback().unwrap_or(Readback::Auto),
            subgroups: !crate::env::no_subgroup(),
            rows: crate::env::row_config(),
        };
        Device::with_config(ctx, config)
    }

    /// Wraps an existing Vulkan context with an explicit binding model.
    pub fn with_binding(ctx: Arc<Context>, binding: Binding) -> Device {
        let config = KernelConfig {
            binding,
            ..KernelConfig::default()
        };
        Device::with_config(ctx, config)
    }

    /// Wraps an existing Vulkan context with explicit kernel choices (tests and tuning;
    /// `new` reads them from the environment).
    pub fn with_config(ctx: Arc<Context>, config: KernelConfig) -> Device {
        Device {
            inner: Arc::new(DeviceInner {
                ctx,
                config,
                elementwise_workgroup: crate::env::workgroup_override()
                    .unwrap_or(helios_kernels::ELEMENTWISE_WORKGROUP),
                kernels: Mutex::new(FxHashMap::default()),
                fused: Mutex::new(FxHashMap::default()),
                frag_maps: Default::default(),
                tuning_key: Default::default(),
                native: Mutex::new(FxHashMap::default()),
                native_target: Default::default(),
                native_maps: Default::default(),
                matmul_caps: Default::default(),
            }),
        }
    }

    /// Where the f16 (`bf16 = false`) or bf16 fragment layout is remembered once probed.
    pub(crate) fn frag_map_cell(
        &self,
        bf16: bool,
    ) -> &std::sync::OnceLock<Option<helios_kernels::FragMap>> {
        &self.inner.frag_maps[usize::from(bf16)]
    }

    /// Where the tuning stores' key for this device is remembered once built.
    pub(crate) fn tuning_key_cell(&self) -> &std::sync::OnceLock<String> {
        &self.inner.tuning_key
    }

    /// The kernel choices this device makes.
    pub fn config(&self) -> KernelConfig {
        self.inner.config
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.inner.ctx
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.inner.ctx.caps().name
    }

    /// Validation-layer messages collected so far (empty unless `HELIOS_VALIDATION=1`).
    pub fn validation_messages(&self) -> Vec<String> {
        self.inner.ctx.validation_messages()
    }

    /// Submits everything recorded so far without waiting.
    pub fn flush(&self) -> Result<()> {
        self.inner.ctx.flush()?;
        Ok(())
    }

    /// Waits until everything recorded so far has run.
    pub fn synchronize(&self) -> Result<()> {
        crate::lazy::realize_all()?;
        Ok(self.inner.ctx.synchronize()?)
    }

    /// How long [`Device::warm_up`] keeps the GPU busy: `HELIOS_WARM_MS`, else
    /// [`WARM_UP_MS`] on GPUs and nothing on CPU devices (lavapipe has no clocks to raise).
    pub fn warm_up_time(&self) -> std::time::Duration {
        let default = match self.inner.ctx.caps().device_type {
            helios_vk::DeviceType::Cpu => 0,
            _ => WARM_UP_MS,
        };
        std::time::Duration::from_millis(u64::from(crate::env::warm_ms().unwrap_or(default)))
    }

    /// Runs `work` (something that records GPU work and waits for it, ideally for a few ms)
    /// again and again for [`Device::warm_up_time`] (not at all when that is zero).
    ///
    /// Why: NVIDIA's driver lowers an idle GPU's SM clock after well under a second without
    /// work, and raises it only after some tenths of a second of sustained load, so timing
    /// that follows compiles or CPU work runs several times slow
    /// (`bench/results/2026-11-22-clocks-h200.md`). Everything that times kernels (the
    /// tuners, `helios bench`) warms up first, for longer than the clock takes to rise (a
    /// shorter warm-up left the first candidates slow; bench/results/source-comment-history.md).
    /// (Waiting for the call's time to settle does not work: at the idle clock it is steady
    /// too.)
    pub fn warm_up<E>(
        &self,
        mut work: impl FnMut() -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let time = self.warm_up_time();
        let start = std::time::Instant::now();
        while start.elapsed() < time {
            work()?;
        }
        Ok(())
    }

    /// Driver allocations, pool hits and bytes held by the caching allocator.
    pub fn memory_stats(&self) -> helios_vk::MemoryStats {
        self.inner.ctx.memory_stats()
    }

    /// Waits for the GPU, returns every cached block no buffer uses to the driver, and starts
    /// the peak-in-use counter again: what follows is measured on its own.
    pub fn empty_cache(&self) -> Result<()> {
        self.synchronize()?;
        self.inner.ctx.empty_cache()?;
        self.inner.ctx.reset_peak_memory();
        Ok(())
    }

    /// Batches, dispatches and barriers submitted so far.
    pub fn encoder_stats(&self) -> helios_vk::EncoderStats {
        self.inner.ctx.encoder_stats()
    }

    /// Dispatches per submitted batch (1 submits every op on its own).
    pub fn set_batch_limit(&self, dispatches: u32) {
        self.inner.ctx.set_batch_limit(dispatches)
    }

    /// Per-kernel GPU time since the last reset (`None` unless profiling is on:
    /// `HELIOS_PROFILE=1`). Waits for recorded work first so every dispatch is counted.
    pub fn profile_report(&self) -> Result<Option<helios_vk::ProfileReport>> {
        self.inner.ctx.synchronize()?;
        Ok(self.inner.ctx.profile_report()?)
    }

    /// Invocations per element-wise workgroup (`HELIOS_WG` or the family's default).
    pub(crate) fn elementwise_workgroup(&self) -> u32 {
        self.inner.elementwise_workgroup
    }

    /// `find`'s answer, found once per device (`ops::matmul_caps`).
    pub(crate) fn matmul_caps_once(
        &self,
        find: impl FnOnce() -> helios_kernels::MatmulCaps,
    ) -> &helios_kernels::MatmulCaps {
        self.inner.matmul_caps.get_or_init(find)
    }

    /// `maxComputeWorkGroupCount[0]`: how wide a grid may be before it folds into rows.
    pub(crate) fn max_groups_x(&self) -> u32 {
        self.inner.ctx.caps().limits.max_workgroup_count[0]
    }

    /// The element-wise kernel this device runs for `op` on `dtype` inputs giving `out`
    /// (`dtype` except for casts): the family's one selection function.
    ///
    /// - Operands all dense and of the output's shape: the vec4 kernel with `vecs` vec4s per
    ///   invocation (`KernelConfig::elementwise_vecs`, else f32: 1, f16/bf16: 2, measured on
    ///   the H200 for f16; bf16 shares f16's 8-byte vectors), exact (no bounds checks, no
    ///   tail) when `len` is a whole number of tiles on a grid without spare workgroups.
    /// - Anything else (broadcast, strided, offset views): the strided kernel for `dims`
    ///   merged dimensions (1..=`MAX_DIMS`).
    pub fn elementwise_kernel(
        &self,
        op: ElementwiseOp,
        dtype: DType,
        out: DType,
        operands: OperandLayout,
    ) -> ElementwiseKernel {
        let config = &self.inner.config;
        let variant = match operands {
            OperandLayout::Contiguous { len } => {
                let vecs = config.elementwise_vecs.unwrap_or(match dtype {
                    DType::F32 => 1,
                    DType::F16 | DType::BF16 => 2,
                });
                let geometry = helios_kernels::Geometry {
                    workgroup: self.inner.elementwise_workgroup,
                    max_groups_x: self.max_groups_x(),
                };
                let exact = config.elementwise_exact
                    && ElementwiseKernel::exact_fits(vecs, len as u64, geometry);
                Variant::Vec4 { vecs, exact }
            }
            OperandLayout::Strided { dims } => Variant::Strided {
                dims: dims.clamp(1, MAX_DIMS) as u8,
            },
        };
        ElementwiseKernel {
            op,
            dtype: dtype.storage(),
            out: out.storage(),
            binding: config.binding,
            variant,
        }
    }

    /// Whether a read-back of `bytes` goes through a copy kernel into host memory rather than
    /// a staging copy (discrete GPUs, small reads; `HELIOS_READBACK=copy|kernel` forces one).
    pub(crate) fn kernel_readback(&self, bytes: usize) -> bool {
        match self.inner.config.readback {
            Readback::Kernel => true,
            Readback::CopyEngine => false,
            Readback::Auto => !self.inner.ctx.caps().unified_memory && bytes <= KERNEL_READBACK_MAX,
        }
    }

    /// How kernels on this device receive their buffers.
    pub fn binding(&self) -> Binding {
        self.inner.config.binding
    }

    /// Whether batches are submitted early when the GPU idles (default on).
    pub fn set_early_submit(&self, enabled: bool) {
        self.inner.ctx.set_early_submit(enabled)
    }

    /// An identity for per-device memos (the shared state's address; unique while it lives).
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Whether two handles refer to one device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The compiled kernel with signature `key`, generated by `build` and compiled on first
    /// use only.
    pub(crate) fn kernel(
        &self,
        key: KernelKey,
        build: impl FnOnce() -> KernelModule,
    ) -> Result<Arc<Compiled>> {
        if let Some(k) = self.inner.kernels.locked().get(&key) {
            return Ok(k.clone());
        }
        // Compiled outside the lock: the background threads of tuning compile beside the
        // program (two threads wanting one kernel at once may both compile it; one wins).
        let compiled = self.compile(build(), fixed_workgroup(&key))?;
        let mut cache = self.inner.kernels.locked();
        Ok(cache.entry(key).or_insert(compiled).clone())
    }

    /// Kernels compiled for this device so far (pipelines, fused kernels and native
    /// kernels, those of background tuning included): a loop that asks for no new kernel
    /// leaves it unchanged, which is how a test sees that a warm loop compiles nothing.
    pub fn compiled_kernels(&self) -> usize {
        let inner = &self.inner;
        inner.kernels.locked().len() + inner.fused.locked().len() + inner.native.locked().len()
    }

    /// Whether the kernel with signature `key` is compiled already (as a pipeline, its
    /// deferred compile finished, or a native kernel): using it then costs no wait.
    pub(crate) fn has_kernel(&self, key: &KernelKey) -> bool {
        let spirv = self.inner.kernels.locked().get(key).cloned();
        let native = self.inner.native.locked().get(key).cloned();
        spirv.is_some_and(|c| c.pipeline.is_ready()) || native.is_some_and(|k| k.is_ready())
    }

    /// Compiles those of `kernels` not compiled yet, several at once (one driver compile
    /// per host thread, up to the host's parallelism), so that the `kernel` calls that follow
    /// find them. Why: a tuner compiles every candidate of a shape class, and the driver's
    /// compiles were most of a class's tuning time (bench/results/source-comment-history.md).
    /// Vulkan allows concurrent pipeline creation (the pipeline cache synchronizes itself).
    pub(crate) fn precompile<F: FnOnce() -> KernelModule + Send>(
        &self,
        kernels: Vec<(KernelKey, F)>,
    ) -> Result<()> {
        let todo: Vec<_> = {
            let cache = self.inner.kernels.locked();
            let mut seen = std::collections::HashSet::new();
            kernels
                .into_iter()
                .filter(|(key, _)| !cache.contains_key(key) && seen.insert(key.clone()))
                .collect()
        };
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(todo.len());
        if threads <= 1 {
            for (key, build) in todo {
                self.kernel(key, build)?.pipeline.wait()?;
            }
            return Ok(());
        }
        let queue = std::sync::Mutex::new(todo.into_iter());
        let compiled = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..threads {
                let worker = || loop {
                    let next = queue.locked().next();
                    let Some((key, build)) = next else { break };
                    // Compiled by the time `precompile` returns, as its callers expect.
                    let c = self.compile(build(), fixed_workgroup(&key)).and_then(|c| {
                        c.pipeline.wait()?;
                        Ok(c)
                    });
                    compiled.locked().push((key, c));
                };
                compile_thread(s, worker);
            }
        });
        let mut cache = self.inner.kernels.locked();
        for (key, c) in compiled.into_value() {
            // A failed compile is reported where the kernel is asked for (`kernel` tries
            // again), as it would be without the precompile.
            if let Ok(c) = c {
                cache.entry(key).or_insert(c);
            }
        }
        Ok(())
    }

    /// The PTX target of this device's native kernels, or `None` where it has none
    /// (no VK_NVX_binary_import, `HELIOS_NATIVE=0`). Which architecture a driver runs is
    /// not in Vulkan's properties, so the first call asks the driver: it JIT-compiles a
    /// one-instruction `sm_90a` module only a Hopper GPU accepts (the first module of a
    /// process also pays the driver's CUDA start-up).
    pub fn native_target(&self) -> Option<helios_ptx::Target> {
        *self.inner.native_target.get_or_init(|| {
            let ctx = &self.inner.ctx;
            if !ctx.has_native_kernels() {
                return None;
            }
            let target = helios_ptx::Target::SM90A;
            let mut k = helios_ptx::Kernel::new("helios_probe_sm90a", target);
            k.wgmma_fence();
            let module = k.finish().ok()?;
            ctx.create_native_kernel(&module.text, &module.name, &module.name)
                .ok()
                .map(|_| target)
        })
    }

    /// The native kernel with signature `key`, built by `build` and JIT-compiled by the
    /// driver on first use only; `urgent`: the program is about to launch it, so its JIT
    /// goes before those of tuning's candidates (the driver JITs one at a time).
    pub(crate) fn native_kernel(
        &self,
        key: KernelKey,
        build: impl FnOnce() -> Result<helios_ptx::Module>,
        urgent: bool,
    ) -> Result<Arc<NativeKernel>> {
        if let Some(k) = self.inner.native.locked().get(&key) {
            return Ok(k.clone());
        }
        let started = std::time::Instant::now();
        let module = build()?;
        crate::env::dump_native(&module);
        // JIT-compiled on the pool, as pipelines are (`Compiled`): launches wait at submit.
        let kernel = self.inner.ctx.create_native_kernel_deferred(
            &module.text,
            &module.name,
            &module.name,
            urgent,
        )?;
        count_waited(&WAITED_NATIVE, started);
        let mut cache = self.inner.native.locked();
        Ok(cache.entry(key).or_insert(kernel).clone())
    }

    /// The workspace where native kernels write their tensor maps
    /// (`helios_kernels::NATIVE_MAPS_BYTES`); native launches never overlap, so one serves
    /// them all.
    pub(crate) fn native_maps(&self) -> Result<&helios_vk::Buffer> {
        if let Some(b) = self.inner.native_maps.get() {
            return Ok(b);
        }
        let sms = self.context().caps().sm_count.unwrap_or(0);
        let b = self.context().create_buffer(
            helios_kernels::native_workspace_bytes(sms),
            helios_vk::MemoryLocation::DeviceLocal,
        )?;
        // Stream-K's flags start at zero (and each launch leaves them so).
        self.context().fill(&b, 0)?;
        Ok(self.inner.native_maps.get_or_init(|| b))
    }

    /// Whether the native kernel with signature `key` was asked for (compiled or not).
    pub(crate) fn native_requested(&self, key: &KernelKey) -> bool {
        self.inner.native.locked().contains_key(key)
    }

    /// JIT-compiles those of `kernels` not compiled yet, several at once (as `precompile`
    /// does for pipelines): the driver's JIT of a matmul module takes a good fraction of a
    /// second, and a tuner asks for a dozen.
    pub(crate) fn precompile_native<F: FnOnce() -> Result<helios_ptx::Module> + Send>(
        &self,
        kernels: Vec<(KernelKey, F)>,
    ) -> Result<()> {
        let todo: Vec<_> = {
            let cache = self.inner.native.locked();
            kernels
                .into_iter()
                .filter(|(key, _)| !cache.contains_key(key))
                .collect()
        };
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(todo.len());
        let queue = Mutex::new(todo.into_iter());
        std::thread::scope(|s| {
            for _ in 0..threads {
                let worker = || loop {
                    let next = queue.locked().next();
                    let Some((key, build)) = next else { break };
                    // A failure is reported where the kernel is asked for, as in `precompile`.
                    let _ = self
                        .native_kernel(key, build, false)
                        .and_then(|k| Ok(k.wait()?));
                };
                compile_thread(s, worker);
            }
        });
        Ok(())
    }

    /// The compiled fused kernel with signature `kernel`, compiled on first use only.
    pub(crate) fn fused_kernel(&self, kernel: &FusedKernel) -> Result<Arc<Compiled>> {
        let mut cache = self.inner.fused.locked();
        if let Some(k) = cache.get(kernel) {
            return Ok(k.clone());
        }
        let compiled = self.compile(kernel.build(self.elementwise_workgroup()), false)?;
        cache.insert(kernel.clone(), compiled.clone());
        Ok(compiled)
    }

    /// `module`'s pipeline (`fixed`: its workgroup size is never overridden).
    fn compile(&self, module: KernelModule, fixed: bool) -> Result<Arc<Compiled>> {
        let started = std::time::Instant::now();
        crate::env::dump_kernel(&module);
        // HELIOS_WG overrides the workgroup size along x (for tuning experiments).
        let mut workgroup = module.workgroup_size;
        if let Some(x) = crate::env::workgroup_override().filter(|_| !fixed) {
            workgroup[0] = x;
        }
        let spec = module.workgroup_spec(workgroup);
        let pipeline = self.inner.ctx.create_pipeline_deferred(&PipelineDesc {
            name: &module.name,
            spirv: &module.words,
            entry: module.entry,
            push_constant_size: module.push_size,
            spec_constants: &spec,
            storage_buffers: module
                .params
                .iter()
                .filter(|p| matches!(p.slot, ParamSlot::Descriptor { .. }))
                .count() as u32,
        })?;
        let compiled = Arc::new(Compiled {
            pipeline,
            module,
            workgroup,
        });
        if crate::env::pipeline_stats_report() {
            self.report_statistics(&compiled);
        }
        count_waited(&WAITED_SPIRV, started);
        // A kernel the program asks for while its classes explore may make a submit wait for
        // its compile: say which.
        if crate::env::verbose() && on_program_thread() && crate::ops::online::exploring(self) {
            eprintln!(
                "helios: the program asked for {} while tuning on real work",
                compiled.module.name
            );
        }
        Ok(compiled)
    }

    /// What the driver's compiler reports about every kernel compiled so far (on NVIDIA
    /// register count, local (spill) and shared memory...), sorted by kernel name. Empty unless the Context
    /// captures statistics (`HELIOS_PIPELINE_STATS=1|2`, or
    /// `ContextOptions::pipeline_statistics`) on a device that offers
    /// VK_KHR_pipeline_executable_properties.
    pub fn kernel_statistics(&self) -> Result<Vec<KernelStats>> {
        let ctx = &self.inner.ctx;
        if ctx.executable_capture() == helios_vk::ExecutableCapture::Off {
            return Ok(Vec::new());
        }
        let compiled: Vec<Arc<Compiled>> = {
            let cache = self.inner.kernels.locked();
            let fused = self.inner.fused.locked();
            cache.values().chain(fused.values()).cloned().collect()
        };
        let mut out = compiled
            .iter()
            .map(|c| {
                Ok(KernelStats {
                    kernel: c.module.name.clone(),
                    executables: ctx.pipeline_statistics(&c.pipeline)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        out.sort_by(|a, b| a.kernel.cmp(&b.kernel));
        Ok(out)
    }

    /// The `HELIOS_PIPELINE_STATS` hook: one stderr line of statistics per executable of a
    /// newly compiled kernel, and its text representations under `HELIOS_DUMP_KERNELS`.
    /// Failures are notes, never errors: this is a debugging aid.
    fn report_statistics(&self, compiled: &Compiled) {
        let name = &compiled.module.name;
        let executables = self.inner.ctx.report_statistics(name, &compiled.pipeline);
        crate::env::dump_representations(name, &executables);
    }
}

/// What the driver reports about one compiled kernel (`Device::kernel_statistics`).
#[derive(Clone, Debug)]
pub struct KernelStats {
    /// The kernel's name (as in profiles and `HELIOS_DUMP_KERNELS` dumps).
    pub kernel: String,
    /// Usually one (the compute shader).
    pub executables: Vec<helios_vk::ExecutableStats>,
}

/// The signature of every kernel the tensor layer compiles: one variant per kernel family,
/// each holding the family's own signature type (hashing it is cheaper than formatting it,
/// which matters at a few hundred nanoseconds per op).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum KernelKey {
    Elementwise(ElementwiseKernel),
    Reduce(ReduceKernel),
    Matmul(helios_kernels::MatmulKernel),
    CoopPeak(helios_kernels::CoopPeakKernel),
    CoopProbe(helios_kernels::CoopProbeKernel),
    CrossEntropy(helios_kernels::CrossEntropyKernel),
    Embedding(helios_kernels::EmbeddingKernel),
    AdamW(helios_kernels::AdamWKernel),
    Softmax(SoftmaxKernel),
    Norm(helios_kernels::norm::NormKernel),
    NormParam(helios_kernels::norm::NormParamKernel),
    Attention(helios_kernels::AttentionKernel),
    AttentionDecode(helios_kernels::DecodeKernel),
    SumSquares(helios_kernels::SumSquaresKernel),
    CopyMany(helios_kernels::CopyManyKernel),
    Transpose(helios_kernels::TransposeKernel),
}

/// A kernel ready to dispatch: its pipeline and the module it came from (whose parameter
/// layout the launch code packs push constants against).
pub(crate) struct Compiled {
    pub pipeline: Arc<Pipeline>,
    pub module: KernelModule,
    /// The workgroup size the pipeline was specialized with.
    pub workgroup: [u32; 3],
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // Retire every batch so the pipelines they keep alive (which hold the Context) are
        // released; errors here can only mean a lost device, which the drop cannot report.
        let _ = self.ctx.synchronize();
        // A later device may get this address: it must not inherit this one's choices.
        crate::ops::forget_device(self as *const DeviceInner as usize, &self.ctx);
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name())
            .finish()
    }
}

/// Whether `key`'s kernel keeps its own workgroup size (`HELIOS_WG` never overrides it):
/// matmul tiles and the other kernels built around their workgroup.
fn fixed_workgroup(key: &KernelKey) -> bool {
    matches!(
        key,
        KernelKey::Matmul(_)
            | KernelKey::CoopPeak(_)
            | KernelKey::Attention(_)
            | KernelKey::AttentionDecode(_)
            | KernelKey::SumSquares(_)
            | KernelKey::CopyMany(_)
            | KernelKey::Transpose(_)
    )
}

/// Compiles the program waited for (SPIR-V pipelines, native kernels): count and
/// nanoseconds, on threads other than the background and precompile ones.
static WAITED_SPIRV: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];
static WAITED_NATIVE: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Whether this thread is one of the program's (not a background or precompile thread).
fn on_program_thread() -> bool {
    !std::thread::current()
        .name()
        .is_some_and(|n| n.starts_with("helios-"))
}

fn count_waited(counter: &[std::sync::atomic::AtomicU64; 2], started: std::time::Instant) {
    use std::sync::atomic::Ordering::Relaxed;
    if !on_program_thread() {
        return;
    }
    counter[0].fetch_add(1, Relaxed);
    counter[1].fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
}

/// Compiles the program's own threads waited for so far: (SPIR-V pipelines, seconds, native
/// kernels, seconds). What a cold first step spends compiling, without the background's.
pub fn waited_compiles() -> (u64, f64, u64, f64) {
    use std::sync::atomic::Ordering::Relaxed;
    let get = |c: &[std::sync::atomic::AtomicU64; 2]| {
        (c[0].load(Relaxed), c[1].load(Relaxed) as f64 * 1e-9)
    };
    let (a, b) = get(&WAITED_SPIRV);
    let (c, d) = get(&WAITED_NATIVE);
    (a, b, c, d)
}

/// Spawns a precompile worker named as helios's own (its compiles are not waited for by the
/// program's threads directly).
fn compile_thread<'s, F: FnOnce() + Send + 's>(s: &'s std::thread::Scope<'s, '_>, f: F) {
    std::thread::Builder::new()
        .name("helios-compile".into())
        .spawn_scoped(s, f)
        .expect("a compile thread");
}
