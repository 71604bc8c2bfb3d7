//! A batch's commands as a list, and its replay into a command buffer.
//!
//! The design decision a reader must know: recording does not call Vulkan. A batch's commands
//! go into a `Commands` list (a few stores each), and `replay` turns the list into a command
//! buffer when the batch is submitted, on the submit thread (worker.rs). The driver's own cost
//! per command (on NVIDIA most of a dispatch's host time) then overlaps the recording of the
//! next batch instead of adding to it. The barriers a command buffer begins and ends with
//! (submit.rs) are here too.

use ash::vk;

use crate::core::Core;
use crate::error::Result;
use crate::native::{self, NativeArg, NativeKernel, NativeSlot, PackedParams};
use crate::pipeline::{self, Pipeline, PipelineSlot};
use std::sync::Arc;

/// A range of one of `Commands`' side lists.
type Span = (u32, u32);

/// One recorded command. Variable-length data (push constants, descriptors, copy regions,
/// kernel names) lives in `Commands`' side lists, so a command is a few words.
#[derive(Clone, Copy, Debug)]
enum Cmd {
    Dispatch {
        /// Index in `pipelines` (resolved at replay: the compile may still be running).
        pipeline: u32,
        layout: vk::PipelineLayout,
        groups: [u32; 3],
        push: Span,
        descriptors: Span,
        /// Index in `names` (profiling only; `u32::MAX` otherwise).
        name: u32,
    },
    /// Dispatch → dispatch (`compute_barrier`).
    ComputeBarrier,
    /// Everything compute or transfer → everything (`compute_transfer_barrier`).
    FullBarrier,
    /// A native kernel launch (native.rs); counted as a dispatch.
    NativeLaunch {
        /// Index in `natives` (resolved at replay: the JIT may still be running).
        function: u32,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        /// Range of `args`.
        params: Span,
        /// Index in `names` (profiling only; `u32::MAX` otherwise).
        name: u32,
    },
    Copy {
        src: vk::Buffer,
        dst: vk::Buffer,
        regions: Span,
    },
    Fill {
        dst: vk::Buffer,
        offset: u64,
        len: u64,
        word: u32,
    },
    ResetQueries {
        pool: vk::QueryPool,
        first: u32,
        count: u32,
    },
    Timestamp {
        pool: vk::QueryPool,
        query: u32,
    },
}

/// The compiled handles of a batch's commands (`Commands::resolve`).
pub(crate) struct Resolved {
    pipelines: Vec<vk::Pipeline>,
    functions: Vec<vk::CuFunctionNVX>,
}

/// A batch's commands, in order, until `replay` records them.
#[derive(Default)]
pub(crate) struct Commands {
    cmds: Vec<Cmd>,
    bytes: Vec<u8>,
    descriptors: Vec<vk::DescriptorBufferInfo>,
    regions: Vec<vk::BufferCopy>,
    names: Vec<String>,
    /// The dispatches' pipelines and the launches' native kernels, whose handles a deferred
    /// compile fills by replay.
    pipelines: Vec<Arc<PipelineSlot>>,
    natives: Vec<Arc<NativeSlot>>,
    /// Arguments of native launches.
    args: Vec<NativeArg>,
    /// Whether a native launch is among the commands: the batch's opening and closing
    /// barriers must then cover all commands (submit.rs).
    pub(crate) native: bool,
}

fn span(start: usize, end: usize) -> Span {
    (start as u32, end as u32)
}

impl Commands {
    /// Empties the lists, keeping their capacity: a recycled `Commands` records the next
    /// batch without growing its vectors again (`Context::recycle_commands`).
    pub(crate) fn clear(&mut self) {
        self.cmds.clear();
        self.bytes.clear();
        self.descriptors.clear();
        self.regions.clear();
        self.names.clear();
        self.pipelines.clear();
        self.natives.clear();
        self.args.clear();
        self.native = false;
    }

    /// The handles `replay` records, waiting for deferred compiles; the first failure if one
    /// failed.
    pub(crate) fn resolve(&self) -> Result<Resolved> {
        let waits = (!self.compiled()).then(std::time::Instant::now);
        let resolved = self.resolve_now();
        if let Some(t) = waits {
            use std::sync::atomic::Ordering::Relaxed;
            SUBMIT_WAITS[0].fetch_add(1, Relaxed);
            SUBMIT_WAITS[1].fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        }
        resolved
    }

    fn resolve_now(&self) -> Result<Resolved> {
        Ok(Resolved {
            pipelines: self
                .pipelines
                .iter()
                .map(|s| pipeline::handle(s))
                .collect::<Result<_>>()?,
            functions: self
                .natives
                .iter()
                .map(|s| native::function(s))
                .collect::<Result<_>>()?,
        })
    }

    /// Whether every pipeline and native kernel is compiled (replay would not wait).
    pub(crate) fn compiled(&self) -> bool {
        self.pipelines.iter().all(|s| s.ready()) && self.natives.iter().all(|s| s.ready())
    }

    pub(crate) fn compute_barrier(&mut self) {
        self.cmds.push(Cmd::ComputeBarrier);
    }

    pub(crate) fn full_barrier(&mut self) {
        self.cmds.push(Cmd::FullBarrier);
    }

    /// The barriers recorded so far, in order: "compute" or "full".
    #[cfg(test)]
    pub(crate) fn barrier_kinds(&self) -> Vec<&'static str> {
        self.cmds
            .iter()
            .filter_map(|c| match c {
                Cmd::ComputeBarrier => Some("compute"),
                Cmd::FullBarrier => Some("full"),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn fill(&mut self, dst: vk::Buffer, offset: u64, len: u64, word: u32) {
        self.cmds.push(Cmd::Fill {
            dst,
            offset,
            len,
            word,
        });
    }

    pub(crate) fn reset_queries(&mut self, pool: vk::QueryPool, first: u32, count: u32) {
        self.cmds.push(Cmd::ResetQueries { pool, first, count });
    }

    pub(crate) fn timestamp(&mut self, pool: vk::QueryPool, query: u32) {
        self.cmds.push(Cmd::Timestamp { pool, query });
    }

    /// Records the commands into `cb` (begun, after its opening barrier).
    ///
    /// # Safety
    /// `cb` is recording on `ctx`'s device, and every object the commands name is alive
    /// (the batch keeps its pipelines; buffers outlive their last use by pool tagging or by
    /// the caller's `submit` contract).
    pub(crate) unsafe fn replay(&self, ctx: &Core, cb: vk::CommandBuffer, resolved: &Resolved) {
        let device = ctx.device();
        let mut bound = vk::Pipeline::null();
        let mut packed = PackedParams::default();
        let range = |(a, b): Span| a as usize..b as usize;
        for cmd in &self.cmds {
            match *cmd {
                Cmd::Dispatch {
                    pipeline,
                    layout,
                    groups,
                    push,
                    descriptors,
                    name,
                } => {
                    let pipeline = resolved.pipelines[pipeline as usize];
                    // With HELIOS_PROFILE=1, timestamps bracket the dispatch (after any
                    // barrier before it, in this same command buffer).
                    let span = match (&ctx.profiler, self.names.get(name as usize)) {
                        (Some(p), Some(name)) => p.begin(cb, name),
                        _ => None,
                    };
                    if bound != pipeline {
                        device.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipeline);
                        bound = pipeline;
                    }
                    let infos = &self.descriptors[range(descriptors)];
                    if !infos.is_empty() {
                        let writes: Vec<vk::WriteDescriptorSet> = infos
                            .iter()
                            .enumerate()
                            .map(|(i, info)| {
                                vk::WriteDescriptorSet::default()
                                    .dst_binding(i as u32)
                                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                                    .buffer_info(std::slice::from_ref(info))
                            })
                            .collect();
                        let pd = ctx
                            .push_descriptor
                            .as_ref()
                            .expect("checked at pipeline creation");
                        pd.cmd_push_descriptor_set(
                            cb,
                            vk::PipelineBindPoint::COMPUTE,
                            layout,
                            0,
                            &writes,
                        );
                    }
                    let bytes = &self.bytes[range(push)];
                    if !bytes.is_empty() {
                        device.cmd_push_constants(
                            cb,
                            layout,
                            vk::ShaderStageFlags::COMPUTE,
                            0,
                            bytes,
                        );
                    }
                    device.cmd_dispatch(cb, groups[0], groups[1], groups[2]);
                    if let (Some(p), Some(span)) = (&ctx.profiler, span) {
                        p.end(cb, span);
                    }
                }
                Cmd::NativeLaunch {
                    function,
                    grid,
                    block,
                    shared,
                    params,
                    name,
                } => {
                    let function = resolved.functions[function as usize];
                    // Its stage is unknown: the timestamps wait for all earlier commands.
                    let span = match (&ctx.profiler, self.names.get(name as usize)) {
                        (Some(p), Some(name)) => {
                            p.begin_at(cb, name, vk::PipelineStageFlags::BOTTOM_OF_PIPE)
                        }
                        _ => None,
                    };
                    packed.pack(&self.args[range(params)]);
                    let pointers = packed.pointers();
                    let info = vk::CuLaunchInfoNVX {
                        function,
                        grid_dim_x: grid[0],
                        grid_dim_y: grid[1],
                        grid_dim_z: grid[2],
                        block_dim_x: block[0],
                        block_dim_y: block[1],
                        block_dim_z: block[2],
                        shared_mem_bytes: shared,
                        param_count: pointers.len(),
                        p_params: if pointers.is_empty() {
                            std::ptr::null()
                        } else {
                            pointers.as_ptr()
                        },
                        ..Default::default()
                    };
                    let nvx = ctx.native.as_ref().expect("a launch implies the extension");
                    (nvx.fp().cmd_cu_launch_kernel_nvx)(cb, &info);
                    // The driver may use Vulkan's compute state for its launch: rebind.
                    bound = vk::Pipeline::null();
                    if let (Some(p), Some(span)) = (&ctx.profiler, span) {
                        p.end(cb, span);
                    }
                }
                Cmd::ComputeBarrier => compute_barrier(device, cb),
                Cmd::FullBarrier => compute_transfer_barrier(device, cb),
                Cmd::Copy { src, dst, regions } => {
                    device.cmd_copy_buffer(cb, src, dst, &self.regions[range(regions)])
                }
                Cmd::Fill {
                    dst,
                    offset,
                    len,
                    word,
                } => device.cmd_fill_buffer(cb, dst, offset, len, word),
                Cmd::ResetQueries { pool, first, count } => {
                    device.cmd_reset_query_pool(cb, pool, first, count)
                }
                Cmd::Timestamp { pool, query } => device.cmd_write_timestamp(
                    cb,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    pool,
                    query,
                ),
            }
        }
    }

    /// Adds a dispatch (bound, pushed and dispatched at replay), named for the profiler
    /// where `profiling`. Arguments were checked.
    pub(crate) fn dispatch(
        &mut self,
        profiling: bool,
        pipeline: &Pipeline,
        groups: [u32; 3],
        push_constants: &[u8],
        descriptors: &[vk::DescriptorBufferInfo],
    ) {
        let push = self.bytes.len();
        self.bytes.extend_from_slice(push_constants);
        let infos = self.descriptors.len();
        self.descriptors.extend_from_slice(descriptors);
        let name = self.name(profiling, pipeline.name());
        self.pipelines.push(pipeline.slot().clone());
        self.cmds.push(Cmd::Dispatch {
            pipeline: self.pipelines.len() as u32 - 1,
            layout: pipeline.layout(),
            groups,
            push: span(push, self.bytes.len()),
            descriptors: span(infos, self.descriptors.len()),
            name,
        });
    }

    /// Adds a native launch, named for the profiler where `profiling`. Arguments were
    /// checked (`check_native`).
    pub(crate) fn launch(
        &mut self,
        profiling: bool,
        kernel: &NativeKernel,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        params: &[NativeArg],
    ) {
        let first = self.args.len();
        self.args.extend_from_slice(params);
        let name = self.name(profiling, kernel.name());
        self.natives.push(kernel.slot().clone());
        self.cmds.push(Cmd::NativeLaunch {
            function: self.natives.len() as u32 - 1,
            grid,
            block,
            shared,
            params: span(first, self.args.len()),
            name,
        });
        self.native = true;
    }

    /// Adds a copy from `src` to `dst` of `regions`. Arguments were checked.
    pub(crate) fn copy(
        &mut self,
        src: vk::Buffer,
        dst: vk::Buffer,
        regions: impl IntoIterator<Item = vk::BufferCopy>,
    ) {
        let first = self.regions.len();
        self.regions.extend(regions);
        self.cmds.push(Cmd::Copy {
            src,
            dst,
            regions: span(first, self.regions.len()),
        });
    }

    /// The index of `name` in `names` for the profiler's span, where `profiling`;
    /// `u32::MAX` otherwise.
    fn name(&mut self, profiling: bool, name: &str) -> u32 {
        match profiling {
            true => {
                self.names.push(name.to_owned());
                self.names.len() as u32 - 1
            }
            false => u32::MAX,
        }
    }
}

fn global_barrier(
    device: &ash::Device,
    cb: vk::CommandBuffer,
    src: (vk::PipelineStageFlags, vk::AccessFlags),
    dst: (vk::PipelineStageFlags, vk::AccessFlags),
) {
    let barrier = vk::MemoryBarrier::default()
        .src_access_mask(src.1)
        .dst_access_mask(dst.1);
    // SAFETY: `cb` is recording on `device`. Plain vkCmdPipelineBarrier keeps Vulkan 1.2
    // devices working (synchronization2 is 1.3 core).
    unsafe {
        device.cmd_pipeline_barrier(
            cb,
            src.0,
            dst.0,
            vk::DependencyFlags::empty(),
            &[barrier],
            &[],
            &[],
        )
    };
}

const COMPUTE_TRANSFER: vk::PipelineStageFlags = vk::PipelineStageFlags::from_raw(
    vk::PipelineStageFlags::COMPUTE_SHADER.as_raw() | vk::PipelineStageFlags::TRANSFER.as_raw(),
);

/// Dispatch → dispatch: compute writes visible to compute reads and writes.
pub(crate) fn compute_barrier(device: &ash::Device, cb: vk::CommandBuffer) {
    use vk::AccessFlags as A;
    use vk::PipelineStageFlags as S;
    global_barrier(
        device,
        cb,
        (S::COMPUTE_SHADER, A::SHADER_WRITE),
        (S::COMPUTE_SHADER, A::SHADER_READ | A::SHADER_WRITE),
    );
}

pub(crate) fn compute_transfer_barrier(device: &ash::Device, cb: vk::CommandBuffer) {
    use vk::AccessFlags as A;
    global_barrier(
        device,
        cb,
        (COMPUTE_TRANSFER, A::SHADER_WRITE | A::TRANSFER_WRITE),
        (
            COMPUTE_TRANSFER,
            A::SHADER_READ | A::SHADER_WRITE | A::TRANSFER_READ | A::TRANSFER_WRITE,
        ),
    );
}

/// Anything → anything: opens a batch with native launches. Inside a batch launches are
/// ordered as dispatches (native.rs); at its edges, once a batch, this costs nothing
/// measurable and keeps whatever other queue work preceded it ordered.
pub(crate) fn native_barrier(device: &ash::Device, cb: vk::CommandBuffer) {
    use vk::AccessFlags as A;
    let all = (
        vk::PipelineStageFlags::ALL_COMMANDS,
        A::MEMORY_READ | A::MEMORY_WRITE,
    );
    global_barrier(device, cb, all, all);
}

/// Device writes → host reads: a host wait on the semaphore alone does not make device
/// writes visible to the host. From all commands when the batch has native launches.
pub(crate) fn host_read_barrier(device: &ash::Device, cb: vk::CommandBuffer, native: bool) {
    use vk::AccessFlags as A;
    let src = match native {
        true => (vk::PipelineStageFlags::ALL_COMMANDS, A::MEMORY_WRITE),
        false => (COMPUTE_TRANSFER, A::SHADER_WRITE | A::TRANSFER_WRITE),
    };
    global_barrier(
        device,
        cb,
        src,
        (vk::PipelineStageFlags::HOST, A::HOST_READ),
    );
}

/// Batches whose submit waited for a deferred compile, and the nanoseconds it waited.
static SUBMIT_WAITS: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Batches whose submit waited for deferred compiles so far, and the seconds waited: what a
/// cold program loses to compiles it asked for later than it needed them.
pub fn submit_compile_waits() -> (u64, f64) {
    use std::sync::atomic::Ordering::Relaxed;
    (
        SUBMIT_WAITS[0].load(Relaxed),
        SUBMIT_WAITS[1].load(Relaxed) as f64 * 1e-9,
    )
}
