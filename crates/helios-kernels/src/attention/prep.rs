//! The `Prep` kernel of both families: Dsum = rowsum(dO ∘ O), for the backward stages.

use helios_spirv::{KernelBuilder, KernelModule};

use super::params::stat_index;
use super::signature::{AttentionKernel, PREP_WORKGROUP};

/// The `Prep` kernel (shared by both families): Dsum[b, h, t] = Σ_d dO·O in f32 for every
/// (b, t, h) row, rows in that order (a dense [B, T, H, D] view's rows follow one another in
/// memory, so a workgroup streams one contiguous stretch of each input).
///
/// [`AttentionKernel::prep_lanes`] invocations share a row, adjacent in one subgroup: lane ℓ
/// reads pieces ℓ, ℓ + lanes, ... (vec4s, or single elements for views that are not
/// 4-aligned), so each load instruction of a subgroup covers whole 32-byte sectors of
/// several rows, and the lanes' partial sums combine with shuffles (no shared memory, no
/// barrier). Each invocation finds its (b, t, h) once, not once per piece: the divisions by
/// `heads` and `t` (push constants) cost more than the loads' issue. The design before this
/// (64 invocations, every vec4 piece's product through shared memory, (b, t, h) per piece)
/// took well over the bytes' time (bench/results/source-comment-history.md).
///
/// Loads are vec4s of the storage type (8 bytes of halves), not 16-byte words of 8 halves:
/// the element-at-a-time path reads the same buffers, and four lanes' 8-byte loads already
/// fill whole sectors. Without subgroup shuffles (`HELIOS_NO_SUBGROUP`, or a device without
/// them) one invocation takes a row: correct, but then a load instruction touches a sector
/// per invocation (several times the bytes' time when that was the only design).
pub(crate) fn build_prep(kern: &AttentionKernel) -> KernelModule {
    let mut k = KernelBuilder::new(kern.name(), kern.binding, [PREP_WORKGROUP, 1, 1]);
    let p = kern.declare(&mut k, false);
    let lanes = kern.prep_lanes();
    let (o, dout) = (p.views[0], p.views[1]);
    let dsum = p.dsum.expect("prep writes dsum");
    let s = kern.storage;
    let d = kern.head_dim;
    // This invocation's place in the workgroup, numbered so that the `lanes` of a row sit
    // in one subgroup: by subgroup id and lane, not `LocalInvocationIndex` (Vulkan does not
    // tie the two together). Subgroups of a power-of-two size ≥ `lanes` dividing the
    // workgroup (what `prep_lanes` asks of the device) number 0..PREP_WORKGROUP exactly.
    let slot = if lanes > 1 {
        let sg = k.subgroup_id();
        let size = k.subgroup_size();
        let id = k.subgroup_invocation_id();
        let base = k.mul(sg, size);
        k.add(base, id)
    } else {
        k.local_index()
    };
    let shift = k.u32(lanes.trailing_zeros());
    let local = k.shr(slot, shift);
    let mask = k.u32(lanes - 1);
    let lane = k.and(slot, mask);
    let g = crate::rows::linear_workgroup(&mut k);
    let per_group = k.u32(PREP_WORKGROUP / lanes);
    let first = k.mul(g, per_group);
    let row = k.add(first, local);
    let bt = k.mul(p.batch, p.t);
    let rows = k.mul(bt, p.heads);
    let inside = k.lt(row, rows);
    // Rows past the end (the last workgroup's) read row 0 and store nothing: every lane
    // stays active for the shuffles.
    let zero_u = k.u32(0);
    let row = k.select(inside, row, zero_u);
    let h = k.rem(row, p.heads);
    let bt = k.div(row, p.heads);
    let b = k.div(bt, p.t);
    let t = k.rem(bt, p.t);
    let ro = o.row(&mut k, b, t, h);
    let rd = dout.row(&mut k, b, t, h);
    let a4 = o.vec4_aligned(&mut k);
    let b4 = dout.vec4_aligned(&mut k);
    let wide = k.and(a4, b4);
    let zero = k.const_f32(0.0);
    let acc = k.var_init(zero);
    k.if_else(
        wide,
        |k| {
            // All of a lane's loads first, then the products: d / (4·lanes) independent
            // loads of each input in flight per invocation.
            let two = k.u32(2);
            let vo = k.shr(ro, two);
            let vo = k.add(vo, lane);
            let vd = k.shr(rd, two);
            let vd = k.add(vd, lane);
            let pieces = d / 4 / lanes;
            let mut xs = Vec::new();
            for j in 0..pieces {
                let step = k.u32(j * lanes);
                let ao = k.add(vo, step);
                let ad = k.add(vd, step);
                let x = crate::storage::load_f32(k, o.buf, ao, 4, s);
                let y = crate::storage::load_f32(k, dout.buf, ad, 4, s);
                xs.push((x, y));
            }
            let mut sum = k.dot(xs[0].0, xs[0].1);
            for &(x, y) in &xs[1..] {
                let v = k.dot(x, y);
                sum = k.add(sum, v);
            }
            k.set(acc, sum);
        },
        // Views at odd offsets (a fused QKV's, say) are read one element at a time.
        |k| {
            let ao = k.add(ro, lane);
            let ad = k.add(rd, lane);
            let step = k.u32(lanes);
            let end = k.u32(d);
            k.for_range(zero_u, end, step, |k, i| {
                let a = k.add(ao, i);
                let x = crate::storage::load_f32(k, o.buf, a, 1, s);
                let a = k.add(ad, i);
                let y = crate::storage::load_f32(k, dout.buf, a, 1, s);
                let cur = k.get(acc);
                let v = k.fma(x, y, cur);
                k.set(acc, v);
            });
        },
    );
    let mut sum = k.get(acc);
    let mut m = 1;
    while m < lanes {
        let mv = k.u32(m);
        let other = k.subgroup_shuffle_xor(sum, mv);
        sum = k.add(sum, other);
        m *= 2;
    }
    let lead = k.eq(lane, zero_u);
    let store = k.and(inside, lead);
    k.if_(store, |k| {
        let at = stat_index(k, &p, b, h, t);
        k.store(dsum, at, sum);
    });
    k.finish()
}
