//! Native kernels: CUDA kernels from PTX text, run inside Vulkan through VK_NVX_binary_import.
//!
//! NVIDIA's driver JIT-compiles PTX given to `vkCreateCuModuleNVX` and launches the result
//! with `vkCmdCuLaunchKernelNVX` in ordinary command buffers. A [`NativeKernel`] is the second
//! kernel kind beside SPIR-V [`Pipeline`](crate::Pipeline)s, for what SPIR-V cannot express
//! (wgmma, bulk asynchronous copies, mbarriers, register reallocation). Everything else is
//! shared: `Context::launch_native` goes through the same encoder, hazard tracking, batches,
//! profiling and statistics as `Context::dispatch`; buffers travel as device addresses
//! (`NativeArg::buffer`).
//!
//! Two rules come from the driver, not from Vulkan. The pipeline stage a launch is filed
//! under is undocumented; launches are ordered as dispatches, by COMPUTE_SHADER barriers,
//! which the H200 honours: twelve GPT-2 bf16 training steps gave the same losses as with
//! ALL_COMMANDS barriers, and the native GPU tests pass. ALL_COMMANDS barriers cost ~2.5 µs
//! more a launch, 4% of a training step (bench/results/2026-12-01-session53-h200.md); a
//! batch holding launches still opens with one. And dynamic shared memory above
//! maxComputeSharedMemorySize loses the device, so it is refused here. What the probe
//! measured: `../shared/NVX.md`.

use ash::vk;
use std::ffi::{c_void, CStr, CString};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::caps::{Caps, Limits};
use crate::compile_pool::Slot;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::features::EnabledFeatures;
use crate::memory::Buffer;
use crate::owner::Owner;

/// Most bytes of kernel parameters: CUDA's classic limit for a launch's `.param` space.
pub const MAX_NATIVE_PARAM_BYTES: usize = 4096;

/// Most threads in a block on every CUDA GPU.
pub const MAX_NATIVE_BLOCK_THREADS: u32 = 1024;

/// One by-value kernel parameter, in the order (and of the type) the PTX `.entry` declares
/// its `.param`s. Buffers are passed as 64-bit device addresses (`NativeArg::buffer`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NativeArg {
    /// `.param .u32` / `.b32`.
    U32(u32),
    /// `.param .s32`.
    I32(i32),
    /// `.param .f32`.
    F32(f32),
    /// `.param .u64` / `.b64`: device addresses.
    U64(u64),
    /// `.param .s64`.
    I64(i64),
    /// `.param .f64`.
    F64(f64),
}

impl NativeArg {
    /// The device address of `buffer`'s first byte (`.param .u64`).
    pub fn buffer(buffer: &Buffer) -> NativeArg {
        NativeArg::U64(buffer.device_address())
    }

    /// Bytes of the value, which is also its alignment in the `.param` space.
    pub fn size(self) -> usize {
        match self {
            NativeArg::U32(_) | NativeArg::I32(_) | NativeArg::F32(_) => 4,
            NativeArg::U64(_) | NativeArg::I64(_) | NativeArg::F64(_) => 8,
        }
    }

    fn to_le_bytes(self) -> ([u8; 8], usize) {
        let mut out = [0u8; 8];
        let n = self.size();
        match self {
            NativeArg::U32(v) => out[..4].copy_from_slice(&v.to_le_bytes()),
            NativeArg::I32(v) => out[..4].copy_from_slice(&v.to_le_bytes()),
            NativeArg::F32(v) => out[..4].copy_from_slice(&v.to_le_bytes()),
            NativeArg::U64(v) => out.copy_from_slice(&v.to_le_bytes()),
            NativeArg::I64(v) => out.copy_from_slice(&v.to_le_bytes()),
            NativeArg::F64(v) => out.copy_from_slice(&v.to_le_bytes()),
        }
        (out, n)
    }
}

/// Byte offset of each argument and the total size, each at its natural alignment: the
/// layout ptxas gives the `.param` list.
pub(crate) fn param_layout(args: &[NativeArg]) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(args.len());
    let mut end = 0usize;
    for a in args {
        let at = end.next_multiple_of(a.size());
        offsets.push(at);
        end = at + a.size();
    }
    (offsets, end)
}

/// Arguments packed for one launch, and the array of pointers to each value that
/// `VkCuLaunchInfoNVX::pParams` takes (CUDA's `kernelParams` convention). Reused across the
/// launches of a batch at replay.
#[derive(Default)]
pub(crate) struct PackedParams {
    /// 8-byte words, so every value sits at its natural alignment in host memory too.
    words: Vec<u64>,
    pointers: Vec<*const c_void>,
}

impl PackedParams {
    /// Packs `args`; the pointers stay valid until the next `pack` or drop.
    pub(crate) fn pack(&mut self, args: &[NativeArg]) {
        let (offsets, size) = param_layout(args);
        self.words.clear();
        self.words.resize(size.div_ceil(8), 0);
        let base = self.words.as_mut_ptr().cast::<u8>();
        for (a, &at) in args.iter().zip(&offsets) {
            let (bytes, n) = a.to_le_bytes();
            // SAFETY: `at + n <= size <= 8 * words.len()`.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(at), n) };
        }
        self.pointers.clear();
        let base = self.words.as_ptr().cast::<u8>();
        // SAFETY: each offset is inside the words just written.
        self.pointers.extend(
            offsets
                .iter()
                .map(|&at| unsafe { base.add(at) }.cast::<c_void>()),
        );
    }

    /// One pointer per argument, into the packed words.
    pub(crate) fn pointers(&self) -> &[*const c_void] {
        &self.pointers
    }

    #[cfg(test)]
    fn bytes(&self) -> &[u8] {
        // SAFETY: plain integers viewed as bytes.
        unsafe {
            std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.words.len() * 8)
        }
    }
}

/// Checks a launch's caller-supplied arguments against the device's limits. Pure, so it is
/// tested without a GPU that has the extension.
pub(crate) fn check_launch(
    limits: &Limits,
    kernel: &str,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    params: &[NativeArg],
) -> Result<()> {
    let invalid = |detail: String| Error::InvalidLaunch {
        kernel: kernel.to_owned(),
        detail,
    };
    if grid.contains(&0) || block.contains(&0) {
        return Err(invalid(format!(
            "grid {grid:?} and block {block:?} need every dimension at least 1"
        )));
    }
    let max_grid = limits.max_workgroup_count;
    if grid.iter().zip(max_grid).any(|(&g, m)| g > m) {
        return Err(invalid(format!(
            "grid {grid:?} exceeds the device limit {max_grid:?}; split the launch"
        )));
    }
    let max_block = limits.max_workgroup_size;
    let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
    let max_threads = MAX_NATIVE_BLOCK_THREADS.min(limits.max_workgroup_invocations);
    if block.iter().zip(max_block).any(|(&b, m)| b > m) || threads > u64::from(max_threads) {
        return Err(invalid(format!(
            "block {block:?} ({threads} threads) exceeds the device limits {max_block:?} and \
             {max_threads} threads per block"
        )));
    }
    // Past this limit the launch does not fail: it loses the device.
    let max_shared = limits.max_compute_shared_memory;
    if shared_bytes > max_shared {
        return Err(invalid(format!(
            "{shared_bytes} bytes of dynamic shared memory exceed maxComputeSharedMemorySize \
             ({max_shared}), the most this path can give a block; tile the kernel smaller"
        )));
    }
    let (_, size) = param_layout(params);
    if size > MAX_NATIVE_PARAM_BYTES {
        return Err(invalid(format!(
            "{size} bytes of parameters exceed {MAX_NATIVE_PARAM_BYTES}; pass a buffer's \
             address instead"
        )));
    }
    Ok(())
}

/// Why native kernels are off on a Context, or `None` where they are on.
pub(crate) fn unavailable_reason(
    caps: &Caps,
    wanted: bool,
    enabled: &EnabledFeatures,
) -> Option<String> {
    if enabled.native_kernels {
        None
    } else if !caps.features.native_kernels {
        Some(
            "its driver does not offer VK_NVX_binary_import (NVIDIA's proprietary driver does)"
                .into(),
        )
    } else if !wanted {
        Some("HELIOS_NATIVE=0 turned VK_NVX_binary_import off".into())
    } else {
        Some(
            "VK_NVX_binary_import was left off: the installed validation layer predates it \
             (update vulkan-validationlayers, or unset HELIOS_VALIDATION)"
                .into(),
        )
    }
}

/// The extension's entry points, or why not: ash substitutes a panicking stub for a missing
/// one, and a panic inside an `extern "system"` call aborts, so each is checked first.
pub(crate) fn load(
    instance: &ash::Instance,
    device: &ash::Device,
) -> std::result::Result<ash::nvx::binary_import::Device, String> {
    let names: [&CStr; 5] = [
        c"vkCreateCuModuleNVX",
        c"vkCreateCuFunctionNVX",
        c"vkDestroyCuModuleNVX",
        c"vkDestroyCuFunctionNVX",
        c"vkCmdCuLaunchKernelNVX",
    ];
    for name in names {
        // SAFETY: valid device; the name is NUL-terminated.
        let f = unsafe { instance.get_device_proc_addr(device.handle(), name.as_ptr()) };
        if f.is_none() {
            return Err(format!(
                "its driver lists VK_NVX_binary_import but has no {}",
                name.to_string_lossy()
            ));
        }
    }
    Ok(ash::nvx::binary_import::Device::new(instance, device))
}

/// A CUDA kernel JIT-compiled from PTX by the driver, launched with `Context::launch_native`.
/// Batches that use it keep it alive until they complete.
pub struct NativeKernel {
    ctx: Arc<dyn Owner>,
    name: String,
    entry: String,
    /// Filled by the JIT, at creation or on the compile pool (`create_native_kernel_deferred`).
    slot: Arc<NativeSlot>,
}

/// A native kernel's module and function once JIT-compiled, and the JIT's time (or the call
/// that failed).
pub(crate) type NativeSlot = Slot<Jitted>;

type Jitted =
    std::result::Result<(vk::CuModuleNVX, vk::CuFunctionNVX, Duration), (&'static str, vk::Result)>;

/// The function in `slot`, waiting for its JIT.
pub(crate) fn function(slot: &NativeSlot) -> Result<vk::CuFunctionNVX> {
    slot.wait()
        .map(|j| j.1)
        .map_err(|(call, r)| Error::vk(call, r))
}

impl NativeKernel {
    /// `Context::create_native_kernel` on `ctx`: JIT-compiled before this returns.
    pub(crate) fn create(
        ctx: Arc<dyn Owner>,
        ptx: &str,
        entry: &str,
        name: &str,
    ) -> Result<Arc<NativeKernel>> {
        let (kernel, jit) = NativeKernel::parts(ctx, ptx, entry, name)?;
        jit(false);
        match kernel.slot.wait() {
            Ok(_) => Ok(kernel),
            Err((call, result)) => Err(match result {
                vk::Result::ERROR_DEVICE_LOST
                | vk::Result::ERROR_OUT_OF_HOST_MEMORY
                | vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => Error::vk(call, result),
                _ => Error::NativeRejected {
                    kernel: name.to_owned(),
                    entry: entry.to_owned(),
                    call,
                    result,
                },
            }),
        }
    }

    /// `Context::create_native_kernel_deferred` on `ctx`: JIT-compiled on the native lane
    /// of the compile pool.
    pub(crate) fn create_deferred(
        ctx: Arc<dyn Owner>,
        ptx: &str,
        entry: &str,
        name: &str,
        urgent: bool,
    ) -> Result<Arc<NativeKernel>> {
        let (kernel, jit) = NativeKernel::parts(ctx, ptx, entry, name)?;
        crate::compile_pool::spawn_native(Box::new(jit), urgent);
        Ok(kernel)
    }

    /// A native kernel with its slot empty, and the JIT that fills it.
    fn parts(
        ctx: Arc<dyn Owner>,
        ptx: &str,
        entry: &str,
        name: &str,
    ) -> Result<(Arc<NativeKernel>, impl FnOnce(bool) + Send + 'static)> {
        let core = ctx.core();
        if core.native.is_none() {
            return Err(Error::NativeUnavailable {
                device: core.caps().name.clone(),
                reason: core
                    .native_off
                    .clone()
                    .unwrap_or_else(|| "VK_NVX_binary_import is off".into()),
            });
        }
        let invalid = |detail: &str| Error::InvalidPipeline {
            pipeline: name.to_owned(),
            detail: detail.to_owned(),
        };
        let entry_c =
            CString::new(entry).map_err(|_| invalid("the entry point name contains a NUL byte"))?;
        // The driver reads PTX as a C string: a NUL inside would cut it short.
        let mut data = CString::new(ptx)
            .map_err(|_| invalid("the PTX text contains a NUL byte"))?
            .into_bytes_with_nul();
        data.shrink_to_fit();
        let slot = Arc::new(NativeSlot::default());
        let kernel = Arc::new(NativeKernel {
            ctx: Arc::clone(&ctx),
            name: name.to_owned(),
            entry: entry.to_owned(),
            slot: slot.clone(),
        });
        let name = name.to_owned();
        let jit = move |stopping: bool| {
            if stopping {
                slot.set(Err((
                    "vkCreateCuModuleNVX (skipped: the process is stopping)",
                    vk::Result::ERROR_INITIALIZATION_FAILED,
                )));
                return;
            }
            let started = Instant::now();
            let core = ctx.core();
            let r = jit_module(core, &data, &entry_c);
            if let Ok((module, function, _)) = r {
                core.pipeline_cache.record_creation(&name, true, started);
                core.set_name(module, &name);
                core.set_name(function, &name);
            }
            slot.set(r);
        };
        Ok((kernel, jit))
    }
}

/// The driver's JIT of `data` (PTX, NUL-terminated) and the lookup of `entry`.
fn jit_module(core: &Core, data: &[u8], entry: &CString) -> Jitted {
    let nvx = core
        .native
        .as_ref()
        .expect("checked by NativeKernel::parts");
    let fp = nvx.fp();
    let device = core.device().handle();
    let started = Instant::now();
    let info = vk::CuModuleCreateInfoNVX::default().data(data);
    let mut module = vk::CuModuleNVX::null();
    // SAFETY: the extension is enabled and its entry points checked (`load`); `info`
    // points at `data`, alive for the call.
    let r = unsafe { (fp.create_cu_module_nvx)(device, &info, std::ptr::null(), &mut module) };
    if r != vk::Result::SUCCESS {
        return Err(("vkCreateCuModuleNVX", r));
    }
    let info = vk::CuFunctionCreateInfoNVX::default()
        .module(module)
        .name(entry);
    let mut function = vk::CuFunctionNVX::null();
    // SAFETY: as above; the module was just created.
    let r = unsafe { (fp.create_cu_function_nvx)(device, &info, std::ptr::null(), &mut function) };
    if r != vk::Result::SUCCESS {
        // SAFETY: unused module of this device.
        unsafe { (fp.destroy_cu_module_nvx)(device, module, std::ptr::null()) };
        return Err(("vkCreateCuFunctionNVX", r));
    }
    Ok((module, function, started.elapsed()))
}

/// The checks of `Context::launch_native` shared with `Recorder::launch_native`, on the
/// Context whose core is `core`.
pub(crate) fn check_native(
    core: &Core,
    kernel: &NativeKernel,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    params: &[NativeArg],
) -> Result<()> {
    if !std::ptr::eq(kernel.core(), core) {
        return Err(Error::InvalidLaunch {
            kernel: kernel.name.clone(),
            detail: "the kernel was created on a different Context".into(),
        });
    }
    check_launch(
        &core.caps().limits,
        &kernel.name,
        grid,
        block,
        shared_bytes,
        params,
    )
}

impl NativeKernel {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The PTX `.entry` it runs.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// Host time the driver took to create the module and function (its PTX JIT; the first
    /// kernel of a process also pays the driver's CUDA start-up).
    pub fn jit_time(&self) -> Duration {
        self.slot.wait().map_or(Duration::ZERO, |j| j.2)
    }

    /// The raw function, for recording into command buffers Helios does not own (waits for
    /// a deferred JIT; a null handle if it failed).
    pub fn raw(&self) -> vk::CuFunctionNVX {
        function(&self.slot).unwrap_or(vk::CuFunctionNVX::null())
    }

    /// Whether its JIT has finished (always, unless deferred).
    pub fn is_ready(&self) -> bool {
        self.slot.ready()
    }

    /// Waits for a deferred JIT; its error if it failed.
    pub fn wait(&self) -> Result<()> {
        function(&self.slot).map(drop)
    }

    pub(crate) fn slot(&self) -> &Arc<NativeSlot> {
        &self.slot
    }

    /// The device core of the Context it was made on (for checking that it is that one).
    pub(crate) fn core(&self) -> &Core {
        self.ctx.core()
    }
}

impl Drop for NativeKernel {
    fn drop(&mut self) {
        let core = self.ctx.core();
        let fp = core
            .native
            .as_ref()
            .expect("a NativeKernel exists only where the extension is loaded")
            .fp();
        let device = core.device().handle();
        // A deferred JIT ends first; a failed one left nothing to destroy.
        let Ok((module, function, _)) = self.slot.wait() else {
            return;
        };
        // SAFETY: batches that launch it hold an Arc until they complete (with the unsafe
        // `submit`, Recorder launches keep it too), so no pending work uses it.
        unsafe {
            (fp.destroy_cu_function_nvx)(device, function, std::ptr::null());
            (fp.destroy_cu_module_nvx)(device, module, std::ptr::null());
        }
    }
}

impl std::fmt::Debug for NativeKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeKernel")
            .field("name", &self.name)
            .field("entry", &self.entry)
            .field("ready", &self.slot.ready())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200's limits, as Vulkan reports them.
    fn h200() -> Limits {
        Limits {
            max_compute_shared_memory: 49152,
            max_workgroup_size: [1024, 1024, 64],
            max_workgroup_invocations: 1024,
            max_workgroup_count: [2147483647, 65535, 65535],
            ..Default::default()
        }
    }

    fn detail(e: Error) -> String {
        match e {
            Error::InvalidLaunch { kernel, detail } => {
                assert_eq!(kernel, "k");
                detail
            }
            other => panic!("not InvalidLaunch: {other}"),
        }
    }

    #[test]
    fn launch_arguments_within_limits() {
        let l = h200();
        let args = [NativeArg::U64(1), NativeArg::U32(2)];
        assert!(check_launch(&l, "k", [1, 1, 1], [1, 1, 1], 0, &[]).is_ok());
        assert!(check_launch(
            &l,
            "k",
            [2147483647, 65535, 65535],
            [1024, 1, 1],
            49152,
            &args
        )
        .is_ok());
        assert!(check_launch(&l, "k", [1, 1, 1], [16, 16, 4], 0, &args).is_ok());

        let e = detail(check_launch(&l, "k", [0, 1, 1], [128, 1, 1], 0, &args).unwrap_err());
        assert!(e.contains("at least 1"), "{e}");
        let e = detail(check_launch(&l, "k", [1, 1, 1], [128, 0, 1], 0, &args).unwrap_err());
        assert!(e.contains("at least 1"), "{e}");
        let e = detail(check_launch(&l, "k", [1, 65536, 1], [128, 1, 1], 0, &args).unwrap_err());
        assert!(e.contains("device limit"), "{e}");
        let e = detail(check_launch(&l, "k", [1, 1, 1], [32, 32, 2], 0, &args).unwrap_err());
        assert!(e.contains("2048 threads"), "{e}");
        let e = detail(check_launch(&l, "k", [1, 1, 1], [1, 1, 65], 0, &args).unwrap_err());
        assert!(e.contains("threads per block"), "{e}");
        // One byte past the limit would lose the device: refused.
        let e = detail(check_launch(&l, "k", [1, 1, 1], [128, 1, 1], 49153, &args).unwrap_err());
        assert!(e.contains("maxComputeSharedMemorySize (49152)"), "{e}");
        let e =
            detail(check_launch(&l, "k", [1, 1, 1], [128, 1, 1], 227 << 10, &args).unwrap_err());
        assert!(e.contains("shared memory"), "{e}");
        let many = vec![NativeArg::U64(0); MAX_NATIVE_PARAM_BYTES / 8 + 1];
        let e = detail(check_launch(&l, "k", [1, 1, 1], [1, 1, 1], 0, &many).unwrap_err());
        assert!(e.contains("bytes of parameters"), "{e}");
        // A device allowing more threads than CUDA still gets CUDA's 1024.
        let wide = Limits {
            max_workgroup_invocations: 2048,
            max_workgroup_size: [2048, 1024, 64],
            ..h200()
        };
        assert!(check_launch(&wide, "k", [1, 1, 1], [2048, 1, 1], 0, &[]).is_err());
    }

    #[test]
    fn params_at_natural_alignment() {
        use NativeArg::*;
        let args = [
            U32(7),
            U64(0x1122_3344_5566_7788),
            F32(1.5),
            I32(-2),
            F64(0.25),
            I64(-1),
        ];
        let (offsets, size) = param_layout(&args);
        assert_eq!(offsets, [0, 8, 16, 20, 24, 32]);
        assert_eq!(size, 40);
        assert_eq!(param_layout(&[]), (vec![], 0));
        assert_eq!(param_layout(&[U32(1), U32(2), U32(3)]), (vec![0, 4, 8], 12));
        assert_eq!(param_layout(&[U32(1), U64(2)]).1, 16);

        let mut packed = PackedParams::default();
        packed.pack(&args);
        let bytes = packed.bytes();
        assert_eq!(&bytes[0..4], &7u32.to_le_bytes());
        assert_eq!(&bytes[4..8], &[0; 4], "padding before the u64");
        assert_eq!(&bytes[8..16], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&bytes[16..20], &1.5f32.to_le_bytes());
        assert_eq!(&bytes[20..24], &(-2i32).to_le_bytes());
        assert_eq!(&bytes[24..32], &0.25f64.to_le_bytes());
        assert_eq!(&bytes[32..40], &(-1i64).to_le_bytes());

        // pParams: one pointer per argument, to its value, aligned for its type.
        let p = packed.pointers();
        assert_eq!(p.len(), args.len());
        for (ptr, a) in p.iter().zip(&args) {
            assert_eq!(*ptr as usize % a.size(), 0, "{a:?} misaligned");
        }
        // SAFETY: the pointers point into `packed`, alive here, at values of these types.
        unsafe {
            assert_eq!(*(p[0] as *const u32), 7);
            assert_eq!(*(p[1] as *const u64), 0x1122_3344_5566_7788);
            assert_eq!(*(p[2] as *const f32), 1.5);
            assert_eq!(*(p[3] as *const i32), -2);
            assert_eq!(*(p[4] as *const f64), 0.25);
            assert_eq!(*(p[5] as *const i64), -1);
        }

        // Reuse for the next launch: fewer arguments, nothing left over.
        packed.pack(&[U32(9)]);
        assert_eq!(packed.pointers().len(), 1);
        assert_eq!(packed.bytes().len(), 8);
        // SAFETY: as above.
        assert_eq!(unsafe { *(packed.pointers()[0] as *const u32) }, 9);
        packed.pack(&[]);
        assert!(packed.pointers().is_empty());
    }

    #[test]
    fn buffer_args_are_addresses() {
        assert_eq!(NativeArg::U64(5).size(), 8);
        assert_eq!(NativeArg::F32(0.0).size(), 4);
    }
}
