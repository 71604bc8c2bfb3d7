//! The stages with one invocation per element: `Append` (new keys and values into the
//! caches) and `Combine` (the chunks' partials into O).

use helios_spirv::{Access, KernelBuilder, KernelModule, Scalar, Ty, Val};

use super::{DecodeKernel, DECODE_WORKGROUP};
use crate::rows::global_index;
use crate::storage::{buffer_scalar, load_f32, store_f32};

/// The `Append` kernel: one invocation per element of [B, n, H, D]. Values pass through f32
/// as every kernel's loads and stores do (exact for every value of the storage but NaN
/// payloads).
pub(super) fn append(kern: &DecodeKernel) -> KernelModule {
    let mut k = KernelBuilder::new(kern.name(), kern.binding, [DECODE_WORKGROUP, 1, 1]);
    let elem = buffer_scalar(kern.storage);
    let ins = [
        k.buffer("k", elem, Access::Read),
        k.buffer("v", elem, Access::Read),
    ];
    let outs = [
        k.buffer("k_cache", elem, Access::Write),
        k.buffer("v_cache", elem, Access::Write),
    ];
    let u = Ty::scalar(Scalar::U32);
    let sizes = ["batch", "rows", "heads", "head_dim", "pos"].map(|n| k.param(n, u));
    // Offsets of k and v, then their shared (batch, seq, head) strides.
    let src = ["k_off", "v_off", "src_sb", "src_st", "src_sh"].map(|n| k.param(n, u));
    let dst = ["kc_off", "vc_off", "dst_sb", "dst_st", "dst_sh"].map(|n| k.param(n, u));
    k.begin();
    let [batch, rows, heads, d, pos] = sizes.map(|p| k.load_param(p));
    let [k_off, v_off, src_sb, src_st, src_sh] = src.map(|p| k.load_param(p));
    let [kc_off, vc_off, dst_sb, dst_st, dst_sh] = dst.map(|p| k.load_param(p));
    let wg = k.u32(DECODE_WORKGROUP);
    let i = global_index(&mut k, wg);
    let hd = k.mul(heads, d);
    let nhd = k.mul(rows, hd);
    let n = k.mul(batch, nhd);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let e = k.rem(i, d);
        let rest = k.div(i, d);
        let h = k.rem(rest, heads);
        let rest = k.div(rest, heads);
        let t = k.rem(rest, rows);
        let b = k.div(rest, rows);
        let at = |k: &mut KernelBuilder, off: Val, (sb, st, sh): (Val, Val, Val), t: Val| {
            let x = k.mul(b, sb);
            let y = k.mul(t, st);
            let z = k.mul(h, sh);
            let x = k.add(x, y);
            let x = k.add(x, z);
            let x = k.add(x, off);
            k.add(x, e)
        };
        let row = k.add(pos, t);
        for (x, (so, co)) in [(k_off, kc_off), (v_off, vc_off)].into_iter().enumerate() {
            let from = at(k, so, (src_sb, src_st, src_sh), t);
            let to = at(k, co, (dst_sb, dst_st, dst_sh), row);
            let value = load_f32(k, ins[x], from, 1, kern.storage);
            store_f32(k, outs[x], to, value, kern.storage);
        }
    });
    k.finish()
}
/// The `Combine` kernel: one invocation per element (b·H + h, d) of O, merging the chunks'
/// partials: M = max m_s, O = Σ_s 2^(m_s − M) acc_s / Σ_s 2^(m_s − M) l_s.
pub(super) fn combine(kern: &DecodeKernel) -> KernelModule {
    let mut k = KernelBuilder::new(kern.name(), kern.binding, [DECODE_WORKGROUP, 1, 1]);
    let part = k.buffer("part", Scalar::F32, Access::Read);
    let ob = k.buffer("o", buffer_scalar(kern.storage), Access::Write);
    let u = Ty::scalar(Scalar::U32);
    let params = ["rows", "head_dim", "splits"].map(|n| k.param(n, u));
    k.begin();
    let [rows, d, splits] = params.map(|p| k.load_param(p));
    let wg = k.u32(DECODE_WORKGROUP);
    let i = global_index(&mut k, wg);
    let n = k.mul(rows, d);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let bh = k.div(i, d);
        let e = k.rem(i, d);
        let slot0 = k.mul(bh, splits);
        let stats = k.mul(n, splits);
        let (z, one, two) = (k.u32(0), k.u32(1), k.u32(2));
        let stat = |k: &mut KernelBuilder, s: Val, which: Val| {
            let slot = k.add(slot0, s);
            let at = k.mul(slot, two);
            let at = k.add(stats, at);
            let at = k.add(at, which);
            k.load(part, at, 1)
        };
        let ninf = k.const_f32(f32::NEG_INFINITY);
        let mx = k.var_init(ninf);
        k.for_range(z, splits, one, |k, s| {
            let m = stat(k, s, z);
            let cur = k.get(mx);
            let m = k.max(cur, m);
            k.set(mx, m);
        });
        let m = k.get(mx);
        let none = k.eq(m, ninf);
        let zero = k.const_f32(0.0);
        let shift = k.select(none, zero, m);
        let lsum = k.var_init(zero);
        let osum = k.var_init(zero);
        k.for_range(z, splits, one, |k, s| {
            let ms = stat(k, s, z);
            let x = k.sub(ms, shift);
            let wgt = k.exp2(x);
            let ls = stat(k, s, one);
            let cur = k.get(lsum);
            let cur = k.fma(ls, wgt, cur);
            k.set(lsum, cur);
            let slot = k.add(slot0, s);
            let at = k.mul(slot, d);
            let at = k.add(at, e);
            let a = k.load(part, at, 1);
            let cur = k.get(osum);
            let cur = k.fma(a, wgt, cur);
            k.set(osum, cur);
        });
        let l = k.get(lsum);
        let o = k.get(osum);
        let empty = k.eq(l, zero);
        let y = k.div(o, l);
        let y = k.select(empty, zero, y);
        store_f32(k, ob, i, y, kern.storage);
    });
    k.finish()
}
