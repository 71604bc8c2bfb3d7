//! The device-resident API: a [`Field`] owns the pipelines; [`FqVec`] is an array of elements
//! on the device; a [`Batch`] records many operations on slices of such arrays and runs them
//! in one submit. Upload once, run many ops on the device, download when asked.
//!
//! The one decision a reader must know: a batch inserts a barrier only where an operation
//! touches a region an earlier operation of the batch wrote (or writes one it read), so many
//! independent operations run back to back without draining the GPU between them, while
//! dependent chains (x = a·b; y = x + c) stay correct.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use helios_spirv::KernelModule;
use helios_vk::sync::LockExt;
use helios_vk::{Buffer, Context, MemoryLocation, Pipeline, PipelineDesc, Recorder};

use crate::arith::Layout;
use crate::fq::{check_canonical, Fq, FQ_BYTES};
use crate::hazards::{Hazards, Region};
use crate::kernel::{build_mul_chain, grid, push_constants, FieldKernel, FieldOp, FIELD_WORKGROUP};
use crate::transfer::{self, Scratch};
use crate::{env, FieldError, Result};

/// The measured defaults (bench/results/2026-11-22-field-h200.md and
/// 2026-11-22-field-chain.md have the figures). Layout: comba30k2h (13 × 30-bit product
/// scanning, a·b by two Karatsuba levels, two accumulators only in the columns that could
/// overflow) has the fastest multiplier on the GPUs measured; comba30kh, the previous
/// default, keeps slightly faster array ops on some (`HELIOS_FIELD_LAYOUT=comba30kh`;
/// bench/results/source-comment-history.md).
pub const DEFAULT_LAYOUT: Layout = Layout::Comba30K2H;
/// Memory path: device-local won end to end for batched and streamed work at every size and
/// for single ops from 1M elements (host-visible is ahead only for single small ops, by a few
/// µs), besides being the only path where device-resident ops run at HBM speed.
pub const DEFAULT_DEVICE_LOCAL: bool = true;

/// How a [`Field`] runs: limb layout, workgroup size, memory path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldConfig {
    pub layout: Layout,
    pub workgroup: u32,
    /// Device-local arrays and scratch reached through staging copies (true), or host-visible
    /// memory the GPU reads and writes directly (false).
    pub device_local: bool,
    /// The chain probe (`Field::mul_chain`) makes every intermediate product canonical
    /// (true), or keeps them below 2p and makes only the last one canonical (false, the
    /// default: how a chain of products is computed; the result is the same).
    pub chain_canonical: bool,
}

impl Default for FieldConfig {
    fn default() -> Self {
        FieldConfig {
            layout: DEFAULT_LAYOUT,
            workgroup: FIELD_WORKGROUP,
            device_local: DEFAULT_DEVICE_LOCAL,
            chain_canonical: false,
        }
    }
}

impl FieldConfig {
    /// The defaults, overridden by `HELIOS_FIELD_DEVICE_LOCAL`, `HELIOS_FIELD_LAYOUT`,
    /// `HELIOS_FIELD_WORKGROUP` and `HELIOS_FIELD_CHAIN_CANONICAL`.
    pub fn from_env() -> Result<FieldConfig> {
        let d = FieldConfig::default();
        Ok(FieldConfig {
            layout: env::layout()?.unwrap_or(d.layout),
            workgroup: env::workgroup()?.unwrap_or(d.workgroup),
            device_local: env::device_local()?.unwrap_or(d.device_local),
            chain_canonical: env::chain_canonical()?.unwrap_or(d.chain_canonical),
        })
    }

    pub fn location(&self) -> MemoryLocation {
        if self.device_local {
            MemoryLocation::DeviceLocal
        } else {
            MemoryLocation::HostVisible
        }
    }
}

/// Fq arithmetic on one Vulkan device.
pub struct Field {
    ctx: Arc<Context>,
    config: FieldConfig,
    kernels: Mutex<HashMap<FieldOp, Compiled>>,
    chain: Mutex<Option<Compiled>>,
    pub(crate) scratch: Mutex<Scratch>,
}

#[derive(Clone)]
pub(crate) struct Compiled {
    pub module: Arc<KernelModule>,
    pub pipeline: Arc<Pipeline>,
}

/// An array of Fq elements in device memory (device-local or host-visible per the config).
pub struct FqVec {
    ctx: Arc<Context>,
    buf: Buffer,
    len: usize,
}

/// A contiguous range of an [`FqVec`].
#[derive(Clone, Copy)]
pub struct FqSlice<'a> {
    vec: &'a FqVec,
    start: usize,
    len: usize,
}

impl Field {
    /// A field on `ctx` with the configuration from the environment.
    pub fn new(ctx: Arc<Context>) -> Result<Field> {
        Field::with_config(ctx, FieldConfig::from_env()?)
    }

    /// A field on `ctx` with `config`.
    pub fn with_config(ctx: Arc<Context>, config: FieldConfig) -> Result<Field> {
        Ok(Field {
            ctx,
            config,
            kernels: Mutex::new(HashMap::new()),
            chain: Mutex::new(None),
            scratch: Mutex::new(Scratch::default()),
        })
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn config(&self) -> FieldConfig {
        self.config
    }

    /// Compiles the pipelines of `ops` now rather than on first use.
    pub fn warm_up(&self, ops: &[FieldOp]) -> Result<()> {
        for &op in ops {
            self.compiled(op)?;
        }
        Ok(())
    }

    pub(crate) fn compiled(&self, op: FieldOp) -> Result<Compiled> {
        if let Some(c) = self.kernels.locked().get(&op) {
            return Ok(c.clone());
        }
        // Built without the lock held: compiling can take a while on some drivers.
        let module = FieldKernel {
            op,
            layout: self.config.layout,
        }
        .build();
        let compiled = self.compile(module)?;
        self.kernels.locked().insert(op, compiled.clone());
        Ok(compiled)
    }

    fn compile(&self, module: KernelModule) -> Result<Compiled> {
        let pipeline = self.ctx.create_pipeline(&PipelineDesc {
            name: &module.name,
            spirv: &module.words,
            entry: module.entry,
            push_constant_size: module.push_size,
            spec_constants: &module.workgroup_spec([self.config.workgroup, 1, 1]),
            storage_buffers: 0,
        })?;
        // HELIOS_PIPELINE_STATS=1|2 (which makes the Context capture statistics).
        self.ctx.report_statistics(&module.name, &pipeline);
        Ok(Compiled {
            module: Arc::new(module),
            pipeline,
        })
    }

    /// `out = a·bᵏ·R⁻ᵏ` with k = `iterations`: k dependent Montgomery products per element
    /// in registers. It measures the multiplier's throughput (see `build_mul_chain`).
    pub fn mul_chain(
        &self,
        a: FqSlice<'_>,
        b: FqSlice<'_>,
        out: FqSlice<'_>,
        iterations: u32,
    ) -> Result<()> {
        for (s, what) in [(a, "input a"), (b, "input b"), (out, "the output")] {
            self.check_own(s, what)?;
            if s.len != out.len {
                return Err(FieldError::Shape {
                    op: "mul_chain",
                    detail: format!("{what} has {} elements, the output {}", s.len, out.len),
                });
            }
        }
        if out.len > crate::kernel::MAX_DISPATCH_ELEMENTS {
            return Err(FieldError::TooLarge {
                what: "one operation",
                size: out.len,
                max: crate::kernel::MAX_DISPATCH_ELEMENTS,
            });
        }
        let c = {
            let mut chain = self.chain.locked();
            match chain.as_ref() {
                Some(c) => c.clone(),
                None => {
                    let c = self.compile(build_mul_chain(
                        self.config.layout,
                        self.config.chain_canonical,
                    ))?;
                    *chain = Some(c.clone());
                    c
                }
            }
        };
        if out.len == 0 {
            return Ok(());
        }
        let groups = grid(out.len, self.config.workgroup)?;
        let push = push_constants(
            &c.module,
            &[a.address(), b.address()],
            out.address(),
            &[out.len as u32, iterations],
        );
        self.ctx
            .submit_and_wait(|rec| rec.dispatch(&c.pipeline, groups, &push))?;
        Ok(())
    }

    /// A zero-filled array of `len` elements.
    pub fn alloc(&self, len: usize) -> Result<FqVec> {
        let bytes = len as u64 * FQ_BYTES;
        let buf = self.ctx.create_buffer(bytes, self.config.location())?;
        // Zeroed, so that no kernel ever reads a non-canonical value.
        let zeros = vec![0u8; bytes.min(helios_vk::STAGING_CHUNK) as usize];
        let mut at = 0;
        while at < bytes {
            let n = (bytes - at).min(zeros.len() as u64);
            self.ctx.upload(&buf, at, &zeros[..n as usize])?;
            at += n;
        }
        Ok(FqVec {
            ctx: Arc::clone(&self.ctx),
            buf,
            len,
        })
    }

    /// Uploads `data` into a new array; fails before allocating if an element is ≥ p.
    pub fn upload(&self, data: &[Fq]) -> Result<FqVec> {
        check_canonical("data", data)?;
        let buf = self
            .ctx
            .create_buffer(data.len() as u64 * FQ_BYTES, self.config.location())?;
        transfer::write(&self.ctx, &buf, 0, data)?;
        Ok(FqVec {
            ctx: Arc::clone(&self.ctx),
            buf,
            len: data.len(),
        })
    }

    /// Overwrites `dst` with `data` (same length); fails before writing if an element is ≥ p.
    pub fn write(&self, dst: FqSlice<'_>, data: &[Fq]) -> Result<()> {
        self.check_own(dst, "write destination")?;
        if data.len() != dst.len {
            return Err(FieldError::Shape {
                op: "write",
                detail: format!("{} elements into a slice of {}", data.len(), dst.len),
            });
        }
        check_canonical("data", data)?;
        transfer::write(&self.ctx, &dst.vec.buf, dst.byte_offset(), data)
    }

    /// Reads `src` back to the host.
    pub fn download(&self, src: FqSlice<'_>) -> Result<Vec<Fq>> {
        let mut out = vec![[0u64; 6]; src.len];
        self.read(src, &mut out)?;
        Ok(out)
    }

    /// Reads `src` into `out` (same length).
    pub fn read(&self, src: FqSlice<'_>, out: &mut [Fq]) -> Result<()> {
        self.check_own(src, "read source")?;
        if out.len() != src.len {
            return Err(FieldError::Shape {
                op: "read",
                detail: format!("{} elements into a buffer of {}", src.len, out.len()),
            });
        }
        transfer::read(&self.ctx, &src.vec.buf, src.byte_offset(), out)
    }

    /// Runs one operation and waits: `out = op(inputs)`.
    pub fn apply(&self, op: FieldOp, inputs: &[FqSlice<'_>], out: FqSlice<'_>) -> Result<()> {
        let mut batch = Batch::new();
        batch.push(op, inputs, out)?;
        self.run(&batch)
    }

    /// Runs every operation of `batch` in one submit, in order, and waits.
    pub fn run(&self, batch: &Batch<'_>) -> Result<()> {
        let compiled = self.check_batch(batch)?;
        self.ctx.submit_and_wait(|rec| {
            let mut hazards = Hazards::default();
            for (op, c) in batch.ops.iter().zip(&compiled) {
                let reads: Vec<Region> = op.inputs().map(|s| s.region()).collect();
                hazards.before(rec, &reads, op.out.region());
                record_dispatch(rec, c, self.config.workgroup, op.addresses(), op.out.len)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    fn check_batch(&self, batch: &Batch<'_>) -> Result<Vec<Compiled>> {
        for op in &batch.ops {
            for s in op.inputs() {
                self.check_own(s, "an input array")?;
            }
            self.check_own(op.out, "an output array")?;
        }
        batch.ops.iter().map(|op| self.compiled(op.op)).collect()
    }

    fn check_own(&self, s: FqSlice<'_>, what: &'static str) -> Result<()> {
        if Arc::ptr_eq(&s.vec.ctx, &self.ctx) {
            Ok(())
        } else {
            Err(FieldError::ForeignArray { what })
        }
    }
}

/// Records one dispatch of `c` over `n` elements.
pub(crate) fn record_dispatch(
    rec: &mut Recorder<'_>,
    c: &Compiled,
    workgroup: u32,
    (inputs, out): (Vec<u64>, u64),
    n: usize,
) -> helios_vk::Result<()> {
    if n == 0 {
        return Ok(());
    }
    // Lengths were checked against MAX_DISPATCH_ELEMENTS when the work was described.
    let groups = grid(n, workgroup).map_err(|e| helios_vk::Error::InvalidDispatch {
        pipeline: c.module.name.clone(),
        detail: e.to_string(),
    })?;
    let push = push_constants(&c.module, &inputs, out, &[n as u32]);
    rec.dispatch(&c.pipeline, groups, &push)
}

impl FqVec {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn location(&self) -> MemoryLocation {
        self.buf.location()
    }

    /// The whole array as a slice.
    pub fn all(&self) -> FqSlice<'_> {
        FqSlice {
            vec: self,
            start: 0,
            len: self.len,
        }
    }

    /// Elements `range` of the array.
    pub fn slice(&self, range: Range<usize>) -> Result<FqSlice<'_>> {
        if range.start > range.end || range.end > self.len {
            return Err(FieldError::OutOfRange {
                what: "FqVec::slice",
                start: range.start,
                end: range.end,
                len: self.len,
            });
        }
        Ok(FqSlice {
            vec: self,
            start: range.start,
            len: range.end - range.start,
        })
    }
}

impl<'a> From<&'a FqVec> for FqSlice<'a> {
    fn from(v: &'a FqVec) -> Self {
        v.all()
    }
}

impl FqSlice<'_> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn byte_offset(&self) -> u64 {
        self.start as u64 * FQ_BYTES
    }

    fn address(&self) -> u64 {
        self.vec.buf.device_address() + self.byte_offset()
    }

    fn region(&self) -> Region {
        let start = self.byte_offset();
        Region {
            buffer: self.vec.buf.device_address(),
            bytes: start..start + self.len as u64 * FQ_BYTES,
        }
    }
}

/// Operations recorded for one submit.
#[derive(Default)]
pub struct Batch<'a> {
    ops: Vec<Recorded<'a>>,
}

struct Recorded<'a> {
    op: FieldOp,
    a: FqSlice<'a>,
    b: Option<FqSlice<'a>>,
    out: FqSlice<'a>,
}

impl<'a> Recorded<'a> {
    fn inputs(&self) -> impl Iterator<Item = FqSlice<'a>> + '_ {
        std::iter::once(self.a).chain(self.b)
    }

    fn addresses(&self) -> (Vec<u64>, u64) {
        (
            self.inputs().map(|s| s.address()).collect(),
            self.out.address(),
        )
    }
}

impl<'a> Batch<'a> {
    pub fn new() -> Self {
        Batch { ops: Vec::new() }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Appends `out = op(inputs)`; inputs and output have one length. `out` may be one of the
    /// inputs (in place) but must not partly overlap one.
    pub fn push(&mut self, op: FieldOp, inputs: &[FqSlice<'a>], out: FqSlice<'a>) -> Result<()> {
        let shape = |detail: String| FieldError::Shape {
            op: op.name(),
            detail,
        };
        if inputs.len() != op.arity() {
            return Err(shape(format!(
                "takes {} input(s), got {}",
                op.arity(),
                inputs.len()
            )));
        }
        for (i, s) in inputs.iter().enumerate() {
            if s.len != out.len {
                return Err(shape(format!(
                    "input {i} has {} elements but the output has {}",
                    s.len, out.len
                )));
            }
            let (r, w) = (s.region(), out.region());
            if r.overlaps(&w) && r.bytes != w.bytes {
                return Err(shape(format!(
                    "input {i} partly overlaps the output; use the same slice for in-place work"
                )));
            }
        }
        if out.len > crate::kernel::MAX_DISPATCH_ELEMENTS {
            return Err(FieldError::TooLarge {
                what: "one operation",
                size: out.len,
                max: crate::kernel::MAX_DISPATCH_ELEMENTS,
            });
        }
        self.ops.push(Recorded {
            op,
            a: inputs[0],
            b: inputs.get(1).copied(),
            out,
        });
        Ok(())
    }
}
