//! Attention for decoding, inference only: [`Tensor::attention_decode`] attends one new
//! query per head over a key/value cache, and [`Tensor::write_kv`] writes new positions'
//! keys and values into that cache in place.
//!
//! The one decision a reader must know: the cache's length reaches the kernels as a push
//! constant, never as a shape they are compiled for, so a decoder whose cache grows by a
//! key per token compiles nothing after its first token (the matmul/softmax form compiled
//! kernels for each new length, which a cold device's tokens waited for). The cache is
//! allocated once at its capacity and written in place, so a step copies only its new
//! rows. An in-place write records this thread's pending lazy work first (as `copy_into`
//! and the optimizer do), so whatever was asked for before it reads the old values; the
//! encoder's hazard tracking puts a barrier between the write and any later reader of the
//! cache's buffer.

use helios_kernels::attention::decode::{
    decode_chunk, AppendArgs, DecodeKernel, DecodeStage, SplitArgs, DECODE_MAX_HEAD_DIM,
};
use helios_kernels::ViewStrides;

use super::view_of;
use crate::device::KernelKey;
use crate::{DType, Error, Result, Tensor};

fn invalid(op: &'static str, detail: String) -> Error {
    Error::Invalid { op, detail }
}

/// Inference only: an op whose inputs require gradients says how to call it.
fn no_grad_inputs(op: &'static str, inputs: &[&Tensor]) -> Result<()> {
    if crate::autograd::any_needs(inputs) {
        return Err(invalid(
            op,
            "it has no backward, and an input requires gradients; call it under no_grad() or \
             on detach()ed tensors"
                .into(),
        ));
    }
    Ok(())
}

/// Same device and dtype for every tensor of `ts`.
fn same_kind(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    for t in &ts[1..] {
        if !t.device().same(ts[0].device()) {
            return Err(Error::DeviceMismatch { op });
        }
        if t.dtype() != ts[0].dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: ts[0].dtype(),
                rhs: t.dtype(),
            });
        }
    }
    Ok(())
}

/// [B, T, H, D] of a checked view.
fn dims4(t: &Tensor, name: &str) -> Result<([usize; 4], ViewStrides)> {
    let (d, s) = view_of(name, t)?;
    Ok(([d.b, d.t, d.h, d.d], s))
}

/// The caches' [B, capacity, H, D] and their views' strides (K's, V's), which must agree.
fn cache_dims(
    op: &'static str,
    k_cache: &Tensor,
    v_cache: &Tensor,
) -> Result<([usize; 4], [ViewStrides; 2])> {
    let (kd, ks) = dims4(k_cache, "k_cache")?;
    let (vd, vs) = dims4(v_cache, "v_cache")?;
    if kd != vd || strides_of(ks) != strides_of(vs) {
        return Err(invalid(
            op,
            format!(
                "k_cache {:?} and v_cache {:?} must have one shape and layout; allocate them \
                 alike",
                k_cache.layout(),
                v_cache.layout()
            ),
        ));
    }
    Ok((kd, [ks, vs]))
}

fn strides_of(s: ViewStrides) -> (u32, u32, u32) {
    (s.batch, s.seq, s.head)
}

/// Whether no two elements of a [B, T, H, D] view (D dense) share an address: sorted by
/// stride, each axis of more than one element steps past everything the axes inside it
/// cover. Sufficient, and true of every cache made by allocating or slicing.
fn non_overlapping(shape: [usize; 4], s: ViewStrides) -> bool {
    let mut axes: Vec<(usize, usize)> = [
        (shape[0], s.batch as usize),
        (shape[1], s.seq as usize),
        (shape[2], s.head as usize),
    ]
    .into_iter()
    .filter(|&(n, _)| n > 1)
    .collect();
    axes.sort_by_key(|&(_, stride)| stride);
    let mut covered = shape[3];
    for (n, stride) in axes {
        if stride < covered {
            return false;
        }
        covered += stride * (n - 1);
    }
    true
}

impl Tensor {
    /// Single-query attention over a key/value cache, for decoding (inference only).
    ///
    /// `self` holds one query per batch row and head: [B, H, D], or [B, 1, H, D] and
    /// [B, 1, 1, H, D] (a slice of a fused QKV projection, read in place). `k_cache` and
    /// `v_cache` ([B, capacity, H, D], any strides with the last axis dense, both of one
    /// layout) hold the keys and values of the positions so far; the first `len` rows
    /// count. Returns O[b, h] = Σ_{j<len} softmax_j(scale·q[b, h]·k[b, j, h]) v[b, j, h],
    /// dense, [B, H, D] for a [B, H, D] query and [B, 1, H, D] otherwise; `scale` `None` is
    /// 1/√D. f32, f16 or bf16 (f32 arithmetic); any head dim up to 256.
    ///
    /// One compiled kernel of each stage serves every `len` (see the module's notes).
    pub fn attention_decode(
        &self,
        k_cache: &Tensor,
        v_cache: &Tensor,
        len: usize,
        scale: Option<f32>,
    ) -> Result<Tensor> {
        const OP: &str = "attention_decode";
        no_grad_inputs(OP, &[self, k_cache, v_cache])?;
        same_kind(OP, &[self, k_cache, v_cache])?;
        let q = match self.shape().len() {
            3 => {
                let s = self.shape();
                self.reshape(&[s[0], 1, s[1], s[2]])?
            }
            _ => self.clone(),
        };
        let ([b, t, h, d], qs) = dims4(&q, "q")?;
        if t != 1 {
            return Err(invalid(
                OP,
                format!(
                    "q has shape {:?}: one query per head, [B, H, D] or [B, 1, H, D]; for \
                     several queries use attention()",
                    self.shape()
                ),
            ));
        }
        let (kd, [ks, vs]) = cache_dims(OP, k_cache, v_cache)?;
        let cap = kd[1];
        if (kd[0], kd[2], kd[3]) != (b, h, d) {
            return Err(invalid(
                OP,
                format!(
                    "the caches are [B, capacity, H, D] = {kd:?}, the query's (B, H, D) is {:?}; \
                     they must agree",
                    (b, h, d)
                ),
            ));
        }
        if d == 0 || d > DECODE_MAX_HEAD_DIM as usize {
            return Err(invalid(
                OP,
                format!("head dim {d} is not supported; use 1 to {DECODE_MAX_HEAD_DIM}"),
            ));
        }
        if len == 0 || len > cap {
            return Err(invalid(
                OP,
                format!(
                    "len {len} is outside 1..={cap} (the caches' capacity); write the new \
                     position with write_kv first, and recompute once the cache is full"
                ),
            ));
        }
        let out_shape: &[usize] = match self.shape().len() {
            3 => &[b, h, d],
            _ => &[b, 1, h, d],
        };
        let device = self.device();
        let out = Tensor::empty(device, out_shape, self.dtype())?;
        if b * h == 0 {
            return Ok(out);
        }
        let bh = u32::try_from(b * h).map_err(|_| invalid(OP, format!("{b}·{h} rows")))?;
        let len32 = len as u32; // ≤ cap, which view_of checked fits u32
        let chunk = decode_chunk(len32, bh);
        let splits = len32.div_ceil(chunk);
        let part_len = (b * h) * splits as usize * (d + 2);
        let part = Tensor::empty(device, &[part_len], DType::F32)?;
        let storage = self.dtype().storage();
        let binding = device.binding();
        let split = DecodeKernel {
            stage: DecodeStage::Split { head_dim: d as u32 },
            storage,
            binding,
        };
        let args = SplitArgs {
            batch: b as u32,
            heads: h as u32,
            len: len32,
            chunk,
            scale: scale.unwrap_or(1.0 / (d as f32).sqrt()),
            q: qs,
            kv: [ks, vs],
        };
        let combine = DecodeKernel {
            stage: DecodeStage::Combine,
            storage,
            binding,
        };
        // Compiled with the first call, one chunk or not: a cache that outgrows its first
        // chunk later then compiles nothing in the middle of generation.
        device.kernel(KernelKey::AttentionDecode(combine), || combine.build())?;
        let (ob, pb) = (out.buffer()?, part.buffer()?);
        device.dispatch_rows(
            KernelKey::AttentionDecode(split),
            || split.build(),
            &[q.buffer()?, k_cache.buffer()?, v_cache.buffer()?],
            &[ob, pb],
            |c, g, addrs| Ok(split.launch_split(&c.module, g.max_groups_x, &args, addrs)?),
        )?;
        if splits > 1 {
            device.dispatch_rows(
                KernelKey::AttentionDecode(combine),
                || combine.build(),
                &[pb],
                &[ob],
                |c, g, addrs| {
                    let sizes = (bh, d as u32, splits);
                    Ok(combine.launch_combine(&c.module, g.max_groups_x, sizes, addrs)?)
                },
            )?;
        }
        Ok(out)
    }

    /// Writes the keys `k` and values `v` of new positions ([B, n, H, D] each, or
    /// [B, n, 1, H, D] slices of a fused QKV projection, read in place) into rows
    /// `pos..pos + n` of `k_cache` and `v_cache` ([B, capacity, H, D], of one layout), in
    /// place: one kernel, and every tensor viewing the caches' storage sees the new rows.
    /// Inference only (no gradient flows through the write). The caches must be two
    /// tensors of their own storage, neither `k` nor `v` a view of it; `pos + n` must not
    /// pass the capacity.
    ///
    /// Pending element-wise work of this thread is recorded first, so what was asked for
    /// before the call (a pending op reading a cache) reads the old values.
    pub fn write_kv(
        k_cache: &Tensor,
        v_cache: &Tensor,
        pos: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        const OP: &str = "write_kv";
        no_grad_inputs(OP, &[k_cache, v_cache, k, v])?;
        same_kind(OP, &[k_cache, v_cache, k, v])?;
        let (kd, [ks, vs]) = cache_dims(OP, k_cache, v_cache)?;
        if k_cache.node_addr() == v_cache.node_addr() {
            return Err(invalid(
                OP,
                "k_cache and v_cache share storage; allocate them as two tensors".into(),
            ));
        }
        if !non_overlapping(kd, ks) {
            return Err(invalid(
                OP,
                format!(
                    "the caches' layout {:?} has elements that share storage (a broadcast or \
                     expanded view); write into an allocated tensor",
                    k_cache.layout()
                ),
            ));
        }
        for (name, t) in [("k", k), ("v", v)] {
            if t.node_addr() == k_cache.node_addr() || t.node_addr() == v_cache.node_addr() {
                return Err(invalid(
                    OP,
                    format!("{name} views a cache's storage; copy it with contiguous() first"),
                ));
            }
        }
        // The kernel reads k and v through one set of strides; others are copied dense.
        let (k, v) = match (view_of("k", k), view_of("v", v)) {
            (Ok((_, a)), Ok((_, b))) if strides_of(a) == strides_of(b) => (k.clone(), v.clone()),
            _ => (k.contiguous()?, v.contiguous()?),
        };
        let (nd, ns) = dims4(&k, "k")?;
        let (nvd, nvs) = dims4(&v, "v")?;
        if nd != nvd || (nd[0], nd[2], nd[3]) != (kd[0], kd[2], kd[3]) {
            return Err(invalid(
                OP,
                format!(
                    "k {nd:?} and v {nvd:?} must be [B, n, H, D] with the caches' B, H and D \
                     ({kd:?})"
                ),
            ));
        }
        let n = nd[1];
        if pos.checked_add(n).map_or(true, |end| end > kd[1]) {
            return Err(invalid(
                OP,
                format!(
                    "rows {pos}..{} do not fit the caches' {} positions; recompute the window \
                     once the cache is full",
                    pos.saturating_add(n),
                    kd[1]
                ),
            ));
        }
        if nd.iter().product::<usize>() == 0 {
            return Ok(());
        }
        // The write is in place: whatever was asked for before reads the old values.
        crate::lazy::realize_all()?;
        let device = k_cache.device();
        let kern = DecodeKernel {
            stage: DecodeStage::Append,
            storage: k.dtype().storage(),
            binding: device.binding(),
        };
        let args = AppendArgs {
            batch: nd[0] as u32,
            rows: n as u32,
            heads: nd[2] as u32,
            head_dim: nd[3] as u32,
            pos: pos as u32, // < capacity, which view_of checked fits u32
            src: [ns, nvs],
            dst: [ks, vs],
        };
        device.dispatch_rows(
            KernelKey::AttentionDecode(kern),
            || kern.build(),
            &[k.buffer()?, v.buffer()?],
            &[k_cache.buffer()?, v_cache.buffer()?],
            |c, g, addrs| Ok(kern.launch_append(&c.module, g.max_groups_x, &args, addrs)?),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(batch: u32, seq: u32, head: u32) -> ViewStrides {
        ViewStrides {
            offset: 0,
            batch,
            seq,
            head,
        }
    }

    #[test]
    fn overlap_is_found_in_broadcasts_only() {
        // Dense [2, 8, 3, 4], a slice of a [2, 8, 2, 3, 4] pair, and size-1 axes of any stride.
        assert!(non_overlapping([2, 8, 3, 4], view(96, 12, 4)));
        assert!(non_overlapping([2, 8, 3, 4], view(192, 24, 4)));
        assert!(non_overlapping([1, 8, 1, 4], view(0, 4, 0)));
        // An expanded batch, and heads closer than D.
        assert!(!non_overlapping([2, 8, 3, 4], view(0, 12, 4)));
        assert!(!non_overlapping([2, 8, 3, 4], view(96, 12, 2)));
    }
}
