//! Scaled-dot-product attention on tensors: forward (O and the row log-sum-exp L) and
//! backward (dQ, dK, dV), flash style (scores never reach memory), except f32 without key
//! lengths on a GPU with `MATERIALISED_MIN_BYTES` to `MATERIALISED_BYTES` of scores, which
//! runs the faster materialised form on the matmul kernels (`materialised`; no flash
//! variant forced).
//!
//! The one decision a reader must know: Q, K and V are read in place through their strides,
//! so the three views [`Tensor::split_qkv`] cuts from the fused QKV projection's
//! [B, T, 3, H, D] output (or `narrow(2, i, 1)` of it) cost no copy; outputs are dense
//! [B, T, H, D], which the output projection reads as [B·T, H·D] without a transpose.
//! Kernel choice is one function, [`choose`]: a forced variant, else `HELIOS_ATTN_VARIANT`,
//! else the tuned one cached for (device, head dim, dtype), else cooperative matrices for
//! f16/bf16 where the device has 16×16×16 fragments, else the largest SIMT tile that fits.
//!
//! Beside this file: `select` (the kernel of each stage), `tune` (block sizes tuned on real
//! work, or exhaustively), `materialised` (the scores stored, on the matmul kernels) and
//! `decode` (one new query against a key/value cache).

mod decode;
mod materialised;
mod select;
pub(crate) mod tune;

use helios_kernels::attention::{AttentionKernel, AttnShape, AttnStage, AttnVariant, ViewStrides};

use crate::device::KernelKey;
use crate::{DType, Device, Error, IndexTensor, Result, Tensor};
use helios_vk::Access;
use materialised::HeadView;
use select::choose;
pub(crate) use select::forced_by_env;

/// Runs, before any work is queued, what the first attention call on `device` with `dtype`
/// inputs would otherwise run inside the program's first step: the probe of the cooperative
/// fragment layout, which reads its result back and so waits for everything queued before
/// it (on a cold H200, ~0.85 s of the first step: the first matmul's pipeline compiling).
/// Nothing where it ran already or where the cooperative kernels cannot run.
pub fn prepare_attention(device: &crate::Device, dtype: crate::DType) {
    let storage = dtype.storage();
    if select::coop_kernels(device, storage) {
        let _ = select::frag_map(device, storage);
    }
}

/// How attention is applied.
#[derive(Clone, Default)]
pub struct AttentionOptions {
    /// Mask key j for query i when j > i.
    pub causal: bool,
    /// Scores are scale·Q·Kᵀ; `None` is 1/√D.
    pub scale: Option<f32>,
    /// Keys per batch row (\[B] u32; key padding of inference prompts): keys j ≥ len are
    /// masked.
    pub key_lengths: Option<IndexTensor>,
    /// Forces a kernel variant for every stage (tests, benchmarks).
    pub variant: Option<AttnVariant>,
    /// Forces a variant for one stage only (the tuner; `variant` wins over it).
    pub stage_variant: Option<(AttnStage, AttnVariant)>,
    /// Forces the f32 form without key lengths (tests, benchmarks): `Some(true)` stores the
    /// scores and runs the matmul kernels, `Some(false)` the flash kernels; `None` decides
    /// by device and size (`materialised::wanted`).
    pub stored_scores: Option<bool>,
}

impl AttentionOptions {
    /// Causal with the default scale.
    pub fn causal() -> AttentionOptions {
        AttentionOptions {
            causal: true,
            ..Default::default()
        }
    }
}

/// The forward's results.
#[derive(Clone)]
pub struct AttentionOutput {
    /// [B, T, H, D], the inputs' dtype.
    pub out: Tensor,
    /// [B, H, T] f32: log Σ_j exp(score), −inf for a query with no key.
    pub lse: Tensor,
}

/// The gradients of Q, K and V, each dense [B, T, H, D].
#[derive(Clone)]
pub struct AttentionGrads {
    pub dq: Tensor,
    pub dk: Tensor,
    pub dv: Tensor,
}

/// (B, T, H, D) of a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Dims {
    pub(super) b: usize,
    pub(super) t: usize,
    pub(super) h: usize,
    pub(super) d: usize,
}

const OP: &str = "attention";

pub(super) fn invalid(detail: String) -> Error {
    Error::Invalid { op: OP, detail }
}

/// (B, T, H, D) and the strides of a [B, T, H, D] (or [B, T, 1, H, D]) view whose last
/// axis has stride 1.
pub(super) fn view_of(name: &str, t: &Tensor) -> Result<(Dims, ViewStrides)> {
    let (shape, strides) = (t.shape(), t.layout().strides());
    let (dims, head_axis) = match shape.len() {
        4 => ((shape[0], shape[1], shape[2], shape[3]), 2),
        5 if shape[2] == 1 => ((shape[0], shape[1], shape[3], shape[4]), 3),
        _ => {
            return Err(invalid(format!(
                "{name} has shape {shape:?}; expected [B, T, H, D] (or [B, T, 1, H, D], a narrow of the fused [B, T, 3, H, D] QKV)"
            )))
        }
    };
    if strides[strides.len() - 1] != 1 && dims.3 > 1 {
        return Err(invalid(format!(
            "{name}'s head dimension has stride {}; it must be 1 (call contiguous() first)",
            strides[strides.len() - 1]
        )));
    }
    let fit = |v: usize| u32::try_from(v).ok();
    let span = t.layout().offset() + t.layout().span();
    let vs = match (
        fit(t.layout().offset()),
        fit(strides[0]),
        fit(strides[1]),
        fit(strides[head_axis]),
        fit(span),
    ) {
        (Some(offset), Some(batch), Some(seq), Some(head), Some(_)) => ViewStrides {
            offset,
            batch,
            seq,
            head,
        },
        _ => {
            return Err(invalid(format!(
                "{name} spans more than 2^32 elements; split the batch"
            )))
        }
    };
    let d = Dims {
        b: dims.0,
        t: dims.1,
        h: dims.2,
        d: dims.3,
    };
    Ok((d, vs))
}

fn same(name: &str, a: &Tensor, b: &Tensor, da: Dims, db: Dims) -> Result<()> {
    if da != db {
        return Err(invalid(format!(
            "{name} has (B, T, H, D) = {:?}, q has {:?}; self-attention needs them equal",
            (db.b, db.t, db.h, db.d),
            (da.b, da.t, da.h, da.d)
        )));
    }
    if !a.device().same(b.device()) {
        return Err(Error::DeviceMismatch { op: OP });
    }
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op: OP,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    Ok(())
}

impl Tensor {
    /// The Q, K and V views ([B, T, 1, H, D] each, no copy) of a fused [B, T, 3, H, D]
    /// tensor; `attention` reads them in place.
    pub fn split_qkv(&self) -> Result<[Tensor; 3]> {
        let shape = self.shape();
        if shape.len() != 5 || shape[2] != 3 {
            return Err(invalid(format!(
                "split_qkv needs a [B, T, 3, H, D] tensor, got {shape:?}"
            )));
        }
        Ok([
            self.narrow(2, 0, 1)?,
            self.narrow(2, 1, 1)?,
            self.narrow(2, 2, 1)?,
        ])
    }

    /// Scaled-dot-product attention of queries `self` with keys `k` and values `v` (each
    /// [B, T, H, D], any strides with the last axis dense; f32, f16 or bf16 alike).
    ///
    /// Differentiable in Q, K and V: `backward()` through `out` runs `attention_backward`
    /// (the saved `lse` and the output, no scores stored). Q, K and V taken as `narrow`s of one
    /// fused QKV tensor get their gradients summed into one fused kernel of padded writes;
    /// `attention_qkv` on the fused tensor writes them into one gradient instead.
    pub fn attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        opts: &AttentionOptions,
    ) -> Result<AttentionOutput> {
        let fwd = self.attention_raw(k, v, opts)?;
        if !crate::autograd::any_needs(&[self, k, v]) {
            return Ok(fwd);
        }
        prepare_backward(self, opts, false);
        let (q, kd, vd) = (self.detach(), k.detach(), v.detach());
        let saved = AttentionOutput {
            out: fwd.out.detach(),
            lse: fwd.lse.clone(),
        };
        let opts = opts.clone();
        let out =
            crate::autograd::record("attention", &[self, k, v], fwd.out.clone(), move |g, _| {
                let g = g.to_dtype(q.dtype())?;
                let grads = q.attention_backward(&kd, &vd, &saved, &g, &opts)?;
                // Each in its input's own shape ([B, T, 1, H, D] for `split_qkv` views).
                Ok(smallvec::smallvec![
                    Some(grads.dq.reshape(q.shape())?),
                    Some(grads.dk.reshape(kd.shape())?),
                    Some(grads.dv.reshape(vd.shape())?),
                ])
            });
        Ok(AttentionOutput { out, lse: fwd.lse })
    }

    /// `attention` over the three slices of a fused [B, T, 3, H, D] tensor (q, k and v
    /// along axis 2, as `split_qkv` gives them), read in place, with one gradient: its
    /// backward writes dQ, dK and dV straight into the slices of one [B, T, 3, H, D]
    /// tensor. (Through `split_qkv` views, `attention` gives each slice its own gradient,
    /// which the views' backward pads and sums: a pass over all three, once a layer.)
    pub fn attention_qkv(&self, opts: &AttentionOptions) -> Result<AttentionOutput> {
        let shape = self.shape();
        if shape.len() != 5 || shape[2] != 3 {
            return Err(invalid(format!(
                "attention_qkv needs a [B, T, 3, H, D] tensor, got {shape:?}"
            )));
        }
        let head = [shape[0], shape[1], shape[3], shape[4]];
        let views = |x: &Tensor| -> Result<[Tensor; 3]> {
            let [q, k, v] = x.split_qkv()?;
            Ok([q.reshape(&head)?, k.reshape(&head)?, v.reshape(&head)?])
        };
        let [q, k, v] = views(self)?;
        let fwd = q.attention_raw(&k, &v, opts)?;
        if !crate::autograd::any_needs(&[self]) {
            return Ok(fwd);
        }
        prepare_backward(&q, opts, true);
        let [q, k, v] = views(&self.detach())?;
        let saved = AttentionOutput {
            out: fwd.out.detach(),
            lse: fwd.lse.clone(),
        };
        let opts = opts.clone();
        let out =
            crate::autograd::record("attention_qkv", &[self], fwd.out.clone(), move |g, _| {
                let g = g.to_dtype(q.dtype())?;
                let [dqkv, ..] = q.backward_impl(&k, &v, &saved, &g, &opts, true)?;
                Ok(smallvec::smallvec![Some(dqkv)])
            });
        Ok(AttentionOutput { out, lse: fwd.lse })
    }

    fn attention_raw(
        &self,
        k: &Tensor,
        v: &Tensor,
        opts: &AttentionOptions,
    ) -> Result<AttentionOutput> {
        let (q, k, v) = &shared_strides(self, k, v)?;
        let (dims, qs) = view_of("q", q)?;
        let (dk, ks) = view_of("k", k)?;
        let (dv, vs) = view_of("v", v)?;
        same("k", q, k, dims, dk)?;
        same("v", q, v, dims, dv)?;
        check_dims(dims)?;
        let lens = lengths(opts, dims)?;
        if materialised_form(q, dims, opts) {
            let scale = opts.scale.unwrap_or(1.0 / (dims.d as f32).sqrt());
            return materialised::forward(
                [head_view(q, qs), head_view(k, ks), head_view(v, vs)],
                dims,
                opts,
                scale,
            );
        }
        if tune::wanted(q, dims.d, &[AttnStage::Forward], opts) {
            tune::tune_forward(q, k, v, opts)?;
        }
        let device = self.device();
        let out = Tensor::empty(device, &[dims.b, dims.t, dims.h, dims.d], self.dtype())?;
        let lse = Tensor::empty(device, &[dims.b, dims.h, dims.t], DType::F32)?;
        let mut reads = vec![q.buffer()?, k.buffer()?, v.buffer()?];
        reads.extend(lens);
        let writes = [out.buffer()?, lse.buffer()?];
        q.record_attention(
            AttnStage::Forward,
            dims,
            opts,
            (&[qs, ks, vs], false),
            &reads,
            &writes,
        )?;
        let real = AttentionOutput { out, lse };
        tune::explore_forward(q, k, v, opts, &real)?;
        Ok(real)
    }

    /// dQ, dK, dV of `self.attention(k, v, opts)` from its output `fwd` and the gradient
    /// `dout` ([B, T, H, D]) of `fwd.out`. Deterministic: no atomics, a fixed summation
    /// order.
    pub fn attention_backward(
        &self,
        k: &Tensor,
        v: &Tensor,
        fwd: &AttentionOutput,
        dout: &Tensor,
        opts: &AttentionOptions,
    ) -> Result<AttentionGrads> {
        let [dq, dk, dv] = self.backward_impl(k, v, fwd, dout, opts, false)?;
        Ok(AttentionGrads { dq, dk, dv })
    }

    /// `attention_backward`'s dQ, dK and dV as three tensors, or (`packed`) three handles of
    /// one dense [B, T, 3, H, D] tensor whose slices along axis 2 they are: the kernels write
    /// each into its slice (offsets 0, HD, 2HD, row stride 3HD).
    pub(crate) fn backward_impl(
        &self,
        k: &Tensor,
        v: &Tensor,
        fwd: &AttentionOutput,
        dout: &Tensor,
        opts: &AttentionOptions,
        packed: bool,
    ) -> Result<[Tensor; 3]> {
        let (q, k, v) = &shared_strides(self, k, v)?;
        let (dims, qs) = view_of("q", q)?;
        let (dk, ks) = view_of("k", k)?;
        let (dv, vs) = view_of("v", v)?;
        let (dd, ds) = view_of("dout", dout)?;
        let (od, os) = view_of("out", &fwd.out)?;
        same("k", q, k, dims, dk)?;
        same("v", q, v, dims, dv)?;
        same("dout", q, dout, dims, dd)?;
        same("out", q, &fwd.out, dims, od)?;
        check_dims(dims)?;
        if fwd.lse.shape() != [dims.b, dims.h, dims.t]
            || fwd.lse.dtype() != DType::F32
            || !fwd.lse.is_contiguous()
        {
            return Err(invalid(format!(
                "lse must be the forward's dense f32 [B, H, T] = {:?}, got {} {:?}",
                [dims.b, dims.h, dims.t],
                fwd.lse.dtype(),
                fwd.lse.shape()
            )));
        }
        let lens = lengths(opts, dims)?;
        if materialised_form(q, dims, opts) {
            let scale = opts.scale.unwrap_or(1.0 / (dims.d as f32).sqrt());
            let g = materialised::backward(
                [head_view(q, qs), head_view(k, ks), head_view(v, vs)],
                head_view(dout, ds),
                fwd,
                dims,
                opts,
                scale,
            )?;
            if !packed {
                return Ok([g.dq, g.dk, g.dv]);
            }
            let one = [dims.b, dims.t, 1, dims.h, dims.d];
            let parts = [
                g.dq.reshape(&one)?,
                g.dk.reshape(&one)?,
                g.dv.reshape(&one)?,
            ];
            let p = Tensor::cat(&[&parts[0], &parts[1], &parts[2]], 2)?;
            return Ok([p.clone(), p.clone(), p]);
        }
        if tune::wanted(q, dims.d, &[AttnStage::DkDv, AttnStage::Dq], opts) {
            tune::tune_backward(q, k, v, fwd, dout, opts)?;
        }
        let lse_off = fwd.lse.layout().offset();
        if lse_off != 0 {
            return Err(invalid(
                "lse must start its buffer (the forward's own)".into(),
            ));
        }
        let device = self.device();
        let views = [qs, ks, vs, ds];
        let dsum = Tensor::empty(device, &[dims.b, dims.h, dims.t], DType::F32)?;
        // Where dQ, dK and dV go: three dense tensors, or the slices of one packed tensor
        // (each kernel gets its buffer and writes at its slice's offset).
        let targets: [Tensor; 3] = if packed {
            let g = Tensor::empty(device, &[dims.b, dims.t, 3, dims.h, dims.d], self.dtype())?;
            [g.clone(), g.clone(), g]
        } else {
            let shape = [dims.b, dims.t, dims.h, dims.d];
            let one = || Tensor::empty(device, &shape, self.dtype());
            [one()?, one()?, one()?]
        };
        let (gq, gk, gv) = (&targets[0], &targets[1], &targets[2]);
        let dq = choose(q, AttnStage::Dq, dims, opts, aligned(&views))?;
        let inputs = [q.buffer()?, k.buffer()?, v.buffer()?, dout.buffer()?];
        if dq.own_dsum {
            // Dq computes Dsum from dO and O (row-major from its buffer's start) and writes
            // it for DkDv, which runs after it: no Prep pass.
            let o = fwd.out.contiguous()?;
            let mut reads = inputs.to_vec();
            reads.extend([fwd.lse.buffer()?, o.buffer()?]);
            reads.extend(lens);
            let writes = [dsum.buffer()?, gq.buffer()?];
            q.record_attention(AttnStage::Dq, dims, opts, (&views, packed), &reads, &writes)?;
        } else {
            self.record_attention(
                AttnStage::Prep,
                dims,
                opts,
                (&[os, ds], false),
                &[fwd.out.buffer()?, dout.buffer()?],
                &[dsum.buffer()?],
            )?;
        }
        let mut reads = inputs.to_vec();
        reads.extend([fwd.lse.buffer()?, dsum.buffer()?]);
        reads.extend(lens);
        q.record_attention(
            AttnStage::DkDv,
            dims,
            opts,
            (&views, packed),
            &reads,
            &[gk.buffer()?, gv.buffer()?],
        )?;
        if !dq.own_dsum {
            let writes = [gq.buffer()?];
            q.record_attention(AttnStage::Dq, dims, opts, (&views, packed), &reads, &writes)?;
        }
        tune::explore_backward(self, k, v, fwd, dout, opts, (&targets, packed))?;
        Ok(targets)
    }

    /// The kernel `choose` picks for `stage` of attention on `self` (q) with `opts`, or
    /// `materialised` where the scores are stored (f32; see `materialised`).
    pub fn attention_kernel(&self, stage: AttnStage, opts: &AttentionOptions) -> Result<String> {
        Ok(self
            .attention_kernel_of(stage, opts)?
            .map_or_else(|| "materialised".into(), |k| k.name()))
    }

    /// `attention_kernel`'s choice itself (`None`: the materialised form), judged from q's
    /// view alone (a call with other views may pick narrower loads).
    pub(crate) fn attention_kernel_of(
        &self,
        stage: AttnStage,
        opts: &AttentionOptions,
    ) -> Result<Option<AttentionKernel>> {
        let (dims, s) = view_of("q", self)?;
        if materialised_form(self, dims, opts) {
            return Ok(None);
        }
        Ok(Some(choose(self, stage, dims, opts, aligned(&[s]))?))
    }

    /// Records `stage` over the strided inputs `views`, writing dense [B, T, H, D] outputs
    /// or (`packed`) the slices of one [B, T, 3, H, D] gradient.
    fn record_attention(
        &self,
        stage: AttnStage,
        dims: Dims,
        opts: &AttentionOptions,
        (views, packed): (&[ViewStrides], bool),
        reads: &[&helios_vk::Buffer],
        writes: &[&helios_vk::Buffer],
    ) -> Result<()> {
        if dims.b * dims.t * dims.h == 0 {
            return Ok(());
        }
        let kern = AttentionKernel {
            packed,
            ..choose(self, stage, dims, opts, aligned(views))?
        };
        let scale = opts.scale.unwrap_or(1.0 / (dims.d as f32).sqrt());
        let device = self.device();
        let shape = AttnShape {
            batch: dims.b as u32,
            t: dims.t as u32,
            heads: dims.h as u32,
        };
        if kern.variant.is_native() {
            return record_native(device, &kern, shape, scale, views, reads, writes);
        }
        device.dispatch_rows(
            KernelKey::Attention(kern),
            || kern.build(),
            reads,
            writes,
            |c, g, addrs| Ok(kern.launch(&c.module, g.max_groups_x, shape, scale, views, addrs)?),
        )
    }
}

/// Records a native (PTX) attention kernel: its tensor maps go to the device's native
/// workspace, written by every native launch (which orders them).
fn record_native(
    device: &Device,
    kern: &AttentionKernel,
    shape: AttnShape,
    scale: f32,
    views: &[ViewStrides],
    reads: &[&helios_vk::Buffer],
    writes: &[&helios_vk::Buffer],
) -> Result<()> {
    let target = super::native::target(device, &kern.name())?;
    let maps = device.native_maps()?;
    let addrs: smallvec::SmallVec<[u64; 8]> = reads
        .iter()
        .chain(writes)
        .map(|b| b.device_address())
        .collect();
    let sms = device.context().caps().sm_count;
    let launch = kern.native_launch(shape, scale, views, &addrs, maps.device_address(), sms)?;
    let accesses: smallvec::SmallVec<[Access; 8]> = reads
        .iter()
        .map(|b| Access::read(b))
        .chain(writes.iter().map(|b| Access::write(b)))
        .chain([Access::write(maps)])
        .collect();
    super::native::record(
        device,
        KernelKey::Attention(*kern),
        || Ok(kern.build_native(target)?),
        &launch,
        &accesses,
    )
}

/// Whether this attention runs in the materialised form (`materialised::wanted`).
fn materialised_form(q: &Tensor, dims: Dims, opts: &AttentionOptions) -> bool {
    let cpu = q.device().context().caps().device_type == helios_vk::DeviceType::Cpu;
    materialised::wanted(q.dtype(), dims, opts, forced_by_env(), cpu)
}

/// A checked view as the materialised form's operand.
fn head_view(t: &Tensor, s: ViewStrides) -> HeadView<'_> {
    HeadView {
        t,
        batch: s.batch as usize,
        seq: s.seq as usize,
        head: s.head as usize,
    }
}

/// Q, K and V with one set of (batch, seq, head) strides, which the kernels share between
/// them (offsets differ): the three views of a fused QKV, or three dense tensors, as they
/// are; anything else is made dense first (a copy each).
fn shared_strides(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let key = |t: &Tensor| view_of("q", t).map(|(_, s)| (s.batch, s.seq, s.head)).ok();
    let (a, b, c) = (key(q), key(k), key(v));
    if a.is_some() && a == b && b == c {
        return Ok((q.clone(), k.clone(), v.clone()));
    }
    let dense = |t: &Tensor| {
        if t.shape().len() == 5 && t.shape()[2] == 1 {
            let s = t.shape();
            t.contiguous()?.reshape(&[s[0], s[1], s[3], s[4]])
        } else {
            t.contiguous()
        }
    };
    Ok((dense(q)?, dense(k)?, dense(v)?))
}

/// Offsets and strides all multiples of 8 elements.
/// Starts compiling the backward kernels that a forward with gradients will need (q's
/// choice; `packed`: writing one [B, T, 3, H, D] gradient), without waiting: a native
/// kernel's JIT takes a good fraction of a second, and these then compile beside the rest
/// of the first step instead of one after another when the backward first asks. Only a
/// head start: what fails here fails again, and is reported, when the backward chooses.
fn prepare_backward(q: &Tensor, opts: &AttentionOptions, packed: bool) {
    for stage in [AttnStage::Dq, AttnStage::DkDv] {
        let kern = select::unchecked(|| q.attention_kernel_of(stage, opts));
        if let Ok(Some(k)) = kern {
            if k.variant.is_native() {
                let k = AttentionKernel { packed, ..k };
                let _ = tune::start_compile(q.device(), k, true);
            }
        }
    }
}

fn aligned(views: &[ViewStrides]) -> bool {
    views.iter().all(|v| {
        [v.offset, v.batch, v.seq, v.head]
            .iter()
            .all(|x| x % 8 == 0)
    })
}

fn check_dims(d: Dims) -> Result<()> {
    if d.d == 0 || d.d % 16 != 0 || d.d > 256 {
        return Err(invalid(format!(
            "head dim {} is not supported; use a multiple of 16 up to 256 (32, 64, 80, 96, 128 ...)",
            d.d
        )));
    }
    let rows = d.b as u64 * d.t as u64 * d.h as u64 * d.d as u64;
    if rows > u64::from(u32::MAX) {
        return Err(invalid(format!(
            "{rows} elements exceed the kernels' 2^32; split the batch"
        )));
    }
    Ok(())
}

/// The key-length buffer of `opts`, checked against the batch.
fn lengths(opts: &AttentionOptions, d: Dims) -> Result<Option<&helios_vk::Buffer>> {
    match &opts.key_lengths {
        None => Ok(None),
        Some(l) if l.shape() == [d.b] => Ok(Some(l.buffer())),
        Some(l) => Err(invalid(format!(
            "key_lengths has shape {:?}; it needs one length per batch row, [{}]",
            l.shape(),
            d.b
        ))),
    }
}
