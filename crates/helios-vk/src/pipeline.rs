//! Compute pipelines from run-time SPIR-V.
//!
//! The binding model is "no descriptors": a pipeline layout has no sets, only one
//! push-constant range [0, push_constant_size) for the compute stage, and kernels receive
//! buffers as device addresses inside that range. Specialisation constants carry
//! compile-time choices such as the workgroup size. Every pipeline goes through the
//! Context's VkPipelineCache, persisted on disk (pipeline_cache.rs), and its creation time is
//! added to `Context::pipeline_stats`, so cold and warm starts can be told apart.

use ash::vk;
use std::collections::HashSet;
use std::ffi::CString;
use std::sync::Arc;
use std::time::Instant;

use crate::compile_pool::Slot;
use crate::core::Core;
use crate::error::{vk_err, Error, Result};
use crate::owner::Owner;

const SPIRV_MAGIC: u32 = 0x0723_0203;

#[derive(Clone, Copy, Debug)]
pub struct PipelineDesc<'a> {
    /// Shown in errors and validation messages.
    pub name: &'a str,
    pub spirv: &'a [u32],
    pub entry: &'a str,
    /// Bytes; a multiple of 4, at most the device's maxPushConstantsSize.
    pub push_constant_size: u32,
    /// (SpecId, 32-bit value) pairs.
    pub spec_constants: &'a [(u32, u32)],
    /// Storage buffers bound through push descriptors (set 0, bindings 0..n), for kernels
    /// emitted with descriptor bindings; 0 for kernels that take device addresses.
    pub storage_buffers: u32,
}

pub struct Pipeline {
    ctx: Arc<dyn Owner>,
    name: String,
    /// The compiled pipeline, filled at creation or by a compile thread
    /// (`create_pipeline_deferred`).
    slot: Arc<PipelineSlot>,
    layout: vk::PipelineLayout,
    /// Push-descriptor set layout (null when buffers come as device addresses).
    set_layout: vk::DescriptorSetLayout,
    push_constant_size: u32,
    storage_buffers: u32,
    /// What it captures for `Context::pipeline_statistics` (CAPTURE_* flags, or none).
    create_flags: vk::PipelineCreateFlags,
}

/// A pipeline's handle once compiled (or the compile's failure).
pub(crate) type PipelineSlot = Slot<std::result::Result<vk::Pipeline, vk::Result>>;

/// The handle in `slot`, waiting for its compile.
pub(crate) fn handle(slot: &PipelineSlot) -> Result<vk::Pipeline> {
    slot.wait()
        .map_err(|r| Error::vk("vkCreateComputePipelines", r))
}

impl Pipeline {
    /// `Context::create_pipeline` on `ctx`: compiled before this returns.
    pub(crate) fn create(ctx: Arc<dyn Owner>, desc: &PipelineDesc<'_>) -> Result<Arc<Pipeline>> {
        let (pipeline, compile) = Pipeline::parts(ctx, desc)?;
        compile(false);
        handle(&pipeline.slot)?;
        Ok(pipeline)
    }

    /// `Context::create_pipeline_deferred` on `ctx`: compiled on the compile pool.
    pub(crate) fn create_deferred(
        ctx: Arc<dyn Owner>,
        desc: &PipelineDesc<'_>,
    ) -> Result<Arc<Pipeline>> {
        let (pipeline, compile) = Pipeline::parts(ctx, desc)?;
        crate::compile_pool::spawn(Box::new(compile));
        Ok(pipeline)
    }

    /// A pipeline with its layouts made and its slot empty, and the compile that fills it.
    fn parts(
        ctx: Arc<dyn Owner>,
        desc: &PipelineDesc<'_>,
    ) -> Result<(Arc<Pipeline>, impl FnOnce(bool) + Send + 'static)> {
        let core = ctx.core();
        let invalid = |detail: String| Error::InvalidPipeline {
            pipeline: desc.name.to_owned(),
            detail,
        };
        if desc.spirv.first() != Some(&SPIRV_MAGIC) {
            return Err(invalid(
                "the code is not a SPIR-V module (no magic number)".into(),
            ));
        }
        let max_push = core.caps().limits.max_push_constants_size;
        if desc.push_constant_size > max_push {
            return Err(invalid(format!(
                "needs {} bytes of push constants but the device allows {max_push}",
                desc.push_constant_size
            )));
        }
        if desc.push_constant_size % 4 != 0 {
            return Err(invalid(format!(
                "push_constant_size {} is not a multiple of 4",
                desc.push_constant_size
            )));
        }
        if desc.storage_buffers > 0 && core.push_descriptor.is_none() {
            return Err(invalid(
                "binds buffers through push descriptors, which this device lacks \
                 (VK_KHR_push_descriptor); use device-address kernels"
                    .into(),
            ));
        }
        let entry = CString::new(desc.entry)
            .map_err(|_| invalid("the entry point name contains a NUL byte".into()))?;
        let mut seen = HashSet::new();
        if let Some((id, _)) = desc.spec_constants.iter().find(|(id, _)| !seen.insert(*id)) {
            return Err(invalid(format!(
                "specialization constant {id} is given twice"
            )));
        }

        let (set_layout, layout) = layouts(core, desc)?;
        let slot = Arc::new(PipelineSlot::default());
        let pipeline = Arc::new(Pipeline {
            ctx: Arc::clone(&ctx),
            name: desc.name.to_owned(),
            slot: slot.clone(),
            layout,
            set_layout,
            push_constant_size: desc.push_constant_size,
            storage_buffers: desc.storage_buffers,
            create_flags: core.capture.create_flags(),
        });
        let spirv = desc.spirv.to_vec();
        let spec = desc.spec_constants.to_vec();
        let name = desc.name.to_owned();
        let compile = move |stopping: bool| {
            if stopping {
                slot.set(Err(vk::Result::ERROR_INITIALIZATION_FAILED));
                return;
            }
            let started = Instant::now();
            let core = ctx.core();
            let r = compile_pipeline(core, &spirv, &entry, &spec, layout);
            if let Ok(raw) = r {
                core.pipeline_cache.record_creation(&name, false, started);
                core.set_name(raw, &name);
            }
            slot.set(r);
        };
        Ok((pipeline, compile))
    }
}

/// The push-descriptor set layout (null without buffers bound so) and the pipeline
/// layout of `desc`.
fn layouts(
    core: &Core,
    desc: &PipelineDesc<'_>,
) -> Result<(vk::DescriptorSetLayout, vk::PipelineLayout)> {
    let device = core.device();
    let set_layout = if desc.storage_buffers > 0 {
        let bindings: Vec<vk::DescriptorSetLayoutBinding> = (0..desc.storage_buffers)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let info = vk::DescriptorSetLayoutCreateInfo::default()
            .flags(vk::DescriptorSetLayoutCreateFlags::PUSH_DESCRIPTOR_KHR)
            .bindings(&bindings);
        // SAFETY: valid device; push descriptors are enabled (checked by the caller).
        unsafe { device.create_descriptor_set_layout(&info, None) }
            .map_err(vk_err("vkCreateDescriptorSetLayout"))?
    } else {
        vk::DescriptorSetLayout::null()
    };
    let destroy_set_layout = || {
        if set_layout != vk::DescriptorSetLayout::null() {
            // SAFETY: not used by any pipeline.
            unsafe { device.destroy_descriptor_set_layout(set_layout, None) };
        }
    };
    let ranges = [vk::PushConstantRange {
        stage_flags: vk::ShaderStageFlags::COMPUTE,
        offset: 0,
        size: desc.push_constant_size,
    }];
    let ranges: &[vk::PushConstantRange] = if desc.push_constant_size > 0 {
        &ranges
    } else {
        &[]
    };
    let set_layouts = [set_layout];
    let set_layouts: &[vk::DescriptorSetLayout] = if desc.storage_buffers > 0 {
        &set_layouts
    } else {
        &[]
    };
    let layout_info = vk::PipelineLayoutCreateInfo::default()
        .push_constant_ranges(ranges)
        .set_layouts(set_layouts);
    // SAFETY: valid device and create info.
    match unsafe { device.create_pipeline_layout(&layout_info, None) } {
        Ok(layout) => Ok((set_layout, layout)),
        Err(r) => {
            destroy_set_layout();
            Err(Error::vk("vkCreatePipelineLayout", r))
        }
    }
}

/// Compiles the pipeline: the driver's work, the slow part.
fn compile_pipeline(
    core: &Core,
    spirv: &[u32],
    entry: &CString,
    spec_constants: &[(u32, u32)],
    layout: vk::PipelineLayout,
) -> std::result::Result<vk::Pipeline, vk::Result> {
    let device = core.device();
    let module_info = vk::ShaderModuleCreateInfo::default().code(spirv);
    // SAFETY: valid device; the code starts with the SPIR-V magic number (checked).
    let module = unsafe { device.create_shader_module(&module_info, None) }?;

    let entries: Vec<vk::SpecializationMapEntry> = (0u32..)
        .zip(spec_constants)
        .map(|(i, &(id, _))| vk::SpecializationMapEntry {
            constant_id: id,
            offset: 4 * i,
            size: 4,
        })
        .collect();
    let data: Vec<u8> = spec_constants
        .iter()
        .flat_map(|&(_, v)| v.to_ne_bytes())
        .collect();
    let spec = vk::SpecializationInfo::default()
        .map_entries(&entries)
        .data(&data);
    let mut stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(entry);
    if !entries.is_empty() {
        stage = stage.specialization_info(&spec);
    }
    // CAPTURE_* flags when statistics are asked for (executable.rs). The pipeline cache is
    // used as always; NVIDIA 580 still reports statistics for pipelines built from a loaded
    // cache (tests/executable.rs, run on an H200).
    let info = vk::ComputePipelineCreateInfo::default()
        .flags(core.capture.create_flags())
        .stage(stage)
        .layout(layout);
    // SAFETY: module and layout are valid; the cache belongs to this device.
    let created = unsafe { device.create_compute_pipelines(core.pipeline_cache(), &[info], None) };
    // SAFETY: a shader module may be destroyed once pipelines are created from it.
    unsafe { device.destroy_shader_module(module, None) };
    created.map(|p| p[0]).map_err(|(_, r)| r)
}

impl Pipeline {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of push constants the layout declares.
    pub fn push_constant_size(&self) -> u32 {
        self.push_constant_size
    }

    /// The raw pipeline, for recording into command buffers Helios does not own (waits for
    /// a deferred compile; a null handle if it failed).
    pub fn raw(&self) -> vk::Pipeline {
        handle(&self.slot).unwrap_or(vk::Pipeline::null())
    }

    /// Whether its compile has finished (always, unless deferred).
    pub fn is_ready(&self) -> bool {
        self.slot.ready()
    }

    /// Waits for a deferred compile; its error if it failed.
    pub fn wait(&self) -> Result<()> {
        handle(&self.slot).map(drop)
    }

    pub(crate) fn slot(&self) -> &Arc<PipelineSlot> {
        &self.slot
    }

    /// The raw layout (one push-constant range; set 0 of push descriptors if any).
    pub fn layout(&self) -> vk::PipelineLayout {
        self.layout
    }

    /// Storage buffers bound through push descriptors (0: device addresses).
    pub fn storage_buffers(&self) -> u32 {
        self.storage_buffers
    }

    /// The VkPipelineCreateFlags it was created with (the CAPTURE_* flags of
    /// `Context::executable_capture`, or none).
    pub fn create_flags(&self) -> vk::PipelineCreateFlags {
        self.create_flags
    }

    /// The device core of the Context it was made on (for checking that it is that one).
    pub(crate) fn core(&self) -> &Core {
        self.ctx.core()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // SAFETY: synchronous runtime: no pending work uses it (with the unsafe `submit`,
        // keeping it alive is the caller's contract).
        // A deferred compile ends first (its thread holds the slot, not the pipeline).
        let raw = handle(&self.slot).unwrap_or(vk::Pipeline::null());
        unsafe {
            self.ctx.core().device().destroy_pipeline(raw, None);
            self.ctx
                .core()
                .device()
                .destroy_pipeline_layout(self.layout, None);
            if self.set_layout != vk::DescriptorSetLayout::null() {
                self.ctx
                    .core()
                    .device()
                    .destroy_descriptor_set_layout(self.set_layout, None);
            }
        }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("name", &self.name)
            .field("push_constant_size", &self.push_constant_size)
            .finish()
    }
}
