//! The k loop the tiled SPIR-V generators (SIMT and cooperative) share, and what bounds its
//! loads: the k range a tile runs, and where loads past the end of k are held or masked.

use helios_spirv::{KernelBuilder, Val, Var};

use super::params::Dims;
use super::{MatmulKernel, Triangle};

/// The shape of a kernel's staged k loop, one value because its variant fixes all of it.
#[derive(Clone, Copy)]
pub(crate) struct Pipeline {
    pub(crate) bk: u32,
    pub(crate) depth: u8,
    pub(crate) stages: u8,
    pub(crate) spare_set: bool,
    pub(crate) stage: [u32; 2],
}

/// The k loop both tiled generators (SIMT and cooperative) share: `stages` (1 or 2)
/// shared-memory stages of `stage` words for A and B, and `depth` tiles of global loads in
/// flight in `depth` register sets, or `depth + 1` with `spare_set`.
///
/// With one stage, step t instead computes on the stage, waits at a barrier, stores tile
/// t+1 into it, refills a set and ends with a second barrier: the loads of a tile are in
/// flight during one step's product either way (NVIDIA's compiler waits for all global
/// loads in flight at the first use of any of them, so `depth` > 1 buys no more).
///
/// Prologue: tile 0 goes into stage 0, tile j (1..=depth) into register set j % sets. Step
/// t then stores tile t+1 (loaded `depth` steps earlier) into stage (t+1) % 2, loads tile
/// t+1+depth into its set, runs `compute(base_a, base_b)` on stage t % 2 and ends with a
/// barrier. The loop is unrolled once per set so set indices are static, and twice where
/// two stages meet one set, so the stage index is too; steps past the last tile see zeros
/// (the loads clamp and mask) and add nothing.
///
/// The spare set: without it, a refill overwrites the set whose old tile the same step
/// stores. NVIDIA's compiler moves the loads of the unrolled body together late in it, so it
/// then loads into fresh registers and copies them into the set at the end of the body,
/// where the copies wait for the loads. With a spare set, the refill goes into the set
/// stored a step earlier: faster for the SIMT kernels, slower for the cooperative ones, short
/// of registers (figures in bench/results/source-comment-history.md).
///
/// Tiles run from k = `k_begin` (a multiple of `bk`) to `k_end` (see `k_span`). `load(k0)`
/// reads the A and B tiles at k offset `k0` into registers; `store(base_a, base_b, a, b,
/// k0)` writes the tile loaded at `k0` into a stage. A kernel that masks the k edge should
/// do it in `store`: a select on the loaded words at load time makes the compiler wait for
/// them there, which turns `depth` steps of latency hiding into one.
pub(crate) fn staged_k_loop(
    k: &mut KernelBuilder,
    (k_begin, k_end): (Val, Val),
    pipe: &Pipeline,
    load: impl Fn(&mut KernelBuilder, Val) -> (Vec<Val>, Vec<Val>),
    store: impl Fn(&mut KernelBuilder, Val, Val, &[Val], &[Val], Val),
    mut compute: impl FnMut(&mut KernelBuilder, Val, Val),
) {
    let Pipeline {
        bk,
        depth,
        stages,
        spare_set,
        stage,
    } = *pipe;
    let depth = u32::from(depth.max(1));
    // Tile j lives in set j % sets; the loop is unrolled once per set, so that set indices
    // are static.
    let sets = depth + u32::from(spare_set);
    let zero = k.u32(0);
    let bk_v = k.u32(bk);
    // The k offset of tile `t` (counted from `k_begin`).
    let tile_k = |k: &mut KernelBuilder, t: Val| {
        let off = k.mul(t, bk_v);
        k.add(k_begin, off)
    };
    let vars = |k: &mut KernelBuilder, (ra, rb): (Vec<Val>, Vec<Val>)| {
        let va: Vec<Var> = ra.into_iter().map(|v| k.var_init(v)).collect();
        let vb: Vec<Var> = rb.into_iter().map(|v| k.var_init(v)).collect();
        (va, vb)
    };
    let (ra, rb) = load(k, k_begin);
    store(k, zero, zero, &ra, &rb, k_begin);
    let mut slots: Vec<Option<(Vec<Var>, Vec<Var>)>> = vec![None; sets as usize];
    if spare_set {
        // Set 0 would hold tile 0, which is in stage 0 already: it starts out free.
        slots[0] = Some(vars(k, (ra, rb)));
    }
    for j in 1..=depth {
        let tile = k.u32(j);
        let k0 = tile_k(k, tile);
        let loaded = load(k, k0);
        slots[(j % sets) as usize] = Some(vars(k, loaded));
    }
    let slots: Vec<(Vec<Var>, Vec<Var>)> = slots
        .into_iter()
        .map(|s| s.expect("every set filled"))
        .collect();
    k.workgroup_barrier();

    let bk_m1 = k.u32(bk - 1);
    let span = k.sub(k_end, k_begin);
    let kpad = k.add(span, bk_m1);
    let tiles = k.div(kpad, bk_v);
    // Two stages and one set: unrolled twice, so that the stage of step u is u % 2. With
    // an odd number of sets above one (the SIMT kernels' two sets and a spare), unrolling
    // to an even count measured slower (bench/results/source-comment-history.md), so there
    // the stage stays an index computed each step.
    let unroll = if stages == 2 && sets == 1 { 2 } else { sets };
    let static_stage = unroll % 2 == 0;
    let dv = k.u32(unroll);
    let dm1 = k.u32(unroll - 1);
    let tiles = k.add(tiles, dm1);
    let tiles = k.div(tiles, dv);
    let tiles = k.mul(tiles, dv);
    let one = k.u32(1);
    let a_stage = k.u32(stage[0]);
    let b_stage = k.u32(stage[1]);
    let single = stages == 1;
    // The product on the stage at index `cur`.
    let mut product = |k: &mut KernelBuilder, cur: Val| {
        let base_a = k.mul(cur, a_stage);
        let base_b = k.mul(cur, b_stage);
        compute(k, base_a, base_b);
    };
    k.for_range(zero, tiles, dv, |k, t0| {
        for u in 0..unroll {
            let off = k.u32(u);
            let kt = k.add(t0, off);
            // With an even unroll t0 is even, so tile kt's stage is u's.
            let (cur, other) = if single {
                (zero, zero)
            } else if static_stage {
                (k.u32(u % 2), k.u32((u + 1) % 2))
            } else {
                let cur = k.and(kt, one);
                (cur, k.xor(cur, one))
            };
            if single {
                // One stage: every invocation is done reading it before it is refilled.
                product(k, cur);
                k.workgroup_barrier();
            }
            let (va, vb) = &slots[((u + 1) % sets) as usize];
            let ra: Vec<Val> = va.iter().map(|&v| k.get(v)).collect();
            let rb: Vec<Val> = vb.iter().map(|&v| k.get(v)).collect();
            let nbase_a = k.mul(other, a_stage);
            let nbase_b = k.mul(other, b_stage);
            let next = k.add(kt, one);
            let next_k0 = tile_k(k, next);
            store(k, nbase_a, nbase_b, &ra, &rb, next_k0);
            // Tile t+1+depth: into the set just stored, or with a spare set, into the set of
            // tile t, stored a step ago.
            let (da, db) = &slots[((u + 1 + depth) % sets) as usize];
            let ahead = k.u32(1 + depth);
            let tile = k.add(kt, ahead);
            let k0 = tile_k(k, tile);
            let (ra, rb) = load(k, k0);
            for (v, x) in da.iter().zip(ra) {
                k.set(*v, x);
            }
            for (v, x) in db.iter().zip(rb) {
                k.set(*v, x);
            }
            if !single {
                product(k, cur);
            }
            k.workgroup_barrier();
        }
    });
}

/// The k range `[begin, end)` a workgroup whose tile starts at row `m0` runs (`begin` a
/// multiple of `bk`): all of k, or the part `kern.triangle` leaves (see `Triangle`).
pub(crate) fn k_span(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    d: &Dims,
    m0: Val,
    bm: u32,
    bk: u32,
) -> (Val, Val) {
    let zero = k.u32(0);
    match kern.triangle {
        Triangle::Full | Triangle::LowerC => (zero, d.k),
        Triangle::LowerA => {
            let bm_v = k.u32(bm);
            let end = k.add(m0, bm_v);
            (zero, k.min(end, d.k))
        }
        Triangle::UpperA => {
            let bk_v = k.u32(bk);
            let steps = k.div(m0, bk_v);
            let begin = k.mul(steps, bk_v);
            (k.min(begin, d.k), d.k)
        }
    }
}

/// Ends the workgroup when `kern.triangle` is `LowerC` and its tile (rows from `m0`, `bm` of
/// them; columns from `n0`) lies wholly above the diagonal. Uniform over the workgroup, so
/// it may precede barriers.
pub(crate) fn skip_upper_tile(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    m0: Val,
    n0: Val,
    bm: u32,
) {
    if kern.triangle == Triangle::LowerC {
        let last = k.u32(bm - 1);
        let last = k.add(m0, last);
        let above = k.gt(n0, last);
        k.return_if(above);
    }
}

/// The index of this invocation's `j`-th unit of a staged tile of `units` units loaded by
/// `threads` invocations, and, when `units` is not a multiple of `threads`, whether that
/// unit exists.
///
/// An invocation without a unit gets the tile's last one: the loads are unguarded, and with
/// exact k nothing clamps k either, so an index past the tile would read k rows past the end
/// of the matrix. (It did: simt64x64d1, 256 invocations for 128 units, read up to 7 rows
/// past A's last one, and on an H100 a fresh-cache tuning of a 768×3072×8192 TN product
/// hung there.) Callers skip the stores of units that do not exist.
pub(crate) fn unit_index(
    k: &mut KernelBuilder,
    units: u32,
    tid: Val,
    threads: u32,
    j: u32,
) -> (Val, Option<Val>) {
    let off = k.u32(j * threads);
    let idx = k.add(tid, off);
    if units % threads == 0 {
        return (idx, None);
    }
    let n = k.u32(units);
    let valid = k.lt(idx, n);
    let last = k.u32(units - 1);
    (k.min(idx, last), Some(valid))
}

/// Where a kernel built with `exact_k` reads the tiles its loop prefetches past the end: the
/// k of the last tile inside k (`K − bk`), so one clamp a tile keeps every load in bounds
/// and no tile the loop computes needs a mask. `None` (clamp and mask per element) for other
/// kernels and for triangles.
pub(crate) fn last_tile(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    d: &Dims,
    bk: u32,
) -> Option<Val> {
    (kern.exact_k && kern.triangle == Triangle::Full).then(|| {
        let bk = k.u32(bk);
        let kk = k.max(d.k, bk);
        k.sub(kk, bk)
    })
}

/// A tile's k for its loads: `k0`, held at `last` (see [`last_tile`]).
pub(crate) fn tile_k0(k: &mut KernelBuilder, last: Option<Val>, k0: Val) -> Val {
    match last {
        Some(last) => k.min(k0, last),
        None => k0,
    }
}

/// `if cond { a } else { b }` without branching, for in-bounds masking.
pub(crate) fn mask(k: &mut KernelBuilder, cond: Val, v: Val) -> Val {
    let zero = k.constant_bits(v.ty, 0);
    k.select(cond, v, zero)
}
