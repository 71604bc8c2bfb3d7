//! The `Split` stage: one workgroup per (b, h, chunk of keys), scores in shared memory.

use helios_spirv::{
    Access, Buffer, KernelBuilder, KernelModule, Scalar, Shared, SharedLen, Ty, Val,
};

use super::{DecodeKernel, DECODE_MAX_CHUNK, DECODE_WORKGROUP};
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};

/// What the `Split` stage's phases share, once its parameters are loaded.
struct SplitCtx {
    storage: Storage,
    head_dim: u32,
    /// vec4s of a D-row (the last one partial when D is no multiple of 4).
    chunks: u32,
    /// Key groups of the V sum, each a row of `chunks` invocations.
    groups: u32,
    lid: Val,
    /// Whether the views' rows start on multiples of 4 elements (a run-time value); `None`
    /// when D is no multiple of 4, so no row can be read as vec4s.
    wide: Option<Val>,
    /// This workgroup's keys: k0..k0 + n.
    k0: Val,
    n: Val,
    /// The caches' sequence stride.
    st: Val,
}

/// The kernel's buffers.
struct Buffers {
    q: Buffer,
    k: Buffer,
    v: Buffer,
    o: Buffer,
    part: Buffer,
}

impl SplitCtx {
    /// `body(k, wide)` for the views' case: under a run-time branch when both are possible.
    fn by_width(&self, k: &mut KernelBuilder, body: impl Fn(&mut KernelBuilder, bool)) {
        match self.wide {
            Some(wide) => k.if_else(wide, |k| body(k, true), |k| body(k, false)),
            None => body(k, false),
        }
    }

    /// Element index of key k0 + t's row, from the (b, h) row `base` of a cache.
    fn key_row(&self, k: &mut KernelBuilder, base: Val, t: Val) -> Val {
        let j = k.add(self.k0, t);
        let x = k.mul(j, self.st);
        k.add(base, x)
    }

    /// Elements 4c..4c + 4 of the D-row starting at element `row` of `buf` as an f32 vec4,
    /// zeros past D: one vec4 load when `wide` (the row starts on a multiple of 4 and D is
    /// one), else a load per element, those past D skipped.
    fn load4(&self, k: &mut KernelBuilder, buf: Buffer, row: Val, c: Val, wide: bool) -> Val {
        if wide {
            let two = k.u32(2);
            let at = k.shr(row, two);
            let at = k.add(at, c);
            return load_f32(k, buf, at, 4, self.storage);
        }
        let four = k.u32(4);
        let e0 = k.mul(c, four);
        let dv = k.u32(self.head_dim);
        let parts: Vec<Val> = (0..4)
            .map(|i| {
                let o = k.u32(i);
                let e = k.add(e0, o);
                let at = k.add(row, e);
                if self.head_dim % 4 == 0 {
                    return load_f32(k, buf, at, 1, self.storage);
                }
                // Past D: read the row's first element (always there), use zero.
                let inside = k.lt(e, dv);
                let at = k.select(inside, at, row);
                let x = load_f32(k, buf, at, 1, self.storage);
                let zero = k.const_f32(0.0);
                k.select(inside, x, zero)
            })
            .collect();
        k.vector(&parts)
    }

    /// Stores vec4 `x` as elements 4c..4c + 4 (c = the invocation's index) of the dense
    /// D-row at element `row` of `buf`, those past D dropped.
    fn store4(&self, k: &mut KernelBuilder, buf: Buffer, row: Val, x: Val, s: Storage) {
        if self.head_dim % 4 == 0 {
            let two = k.u32(2);
            let at = k.shr(row, two);
            let at = k.add(at, self.lid);
            store_f32(k, buf, at, x, s);
            return;
        }
        let four = k.u32(4);
        let e0 = k.mul(self.lid, four);
        let dv = k.u32(self.head_dim);
        for i in 0..4 {
            let o = k.u32(i);
            let e = k.add(e0, o);
            let inside = k.lt(e, dv);
            let y = k.extract(x, i);
            k.if_(inside, |k| {
                let at = k.add(row, e);
                store_f32(k, buf, at, y, s);
            });
        }
    }

    /// Reduces each invocation's `x` (max, or sum) over the workgroup through `red` (a
    /// tree, log2 of [`DECODE_WORKGROUP`] steps); every invocation gets the result.
    fn reduce(&self, k: &mut KernelBuilder, red: Shared, x: Val, max: bool) -> Val {
        // Nobody still reads `red` from a previous reduction.
        k.workgroup_barrier();
        k.shared_store(red, self.lid, x);
        k.workgroup_barrier();
        let mut step = DECODE_WORKGROUP / 2;
        while step > 0 {
            let s = k.u32(step);
            let low = k.lt(self.lid, s);
            k.if_(low, |k| {
                let other = k.add(self.lid, s);
                let a = k.shared_load(red, self.lid);
                let b = k.shared_load(red, other);
                let y = if max { k.max(a, b) } else { k.add(a, b) };
                k.shared_store(red, self.lid, y);
            });
            k.workgroup_barrier();
            step /= 2;
        }
        let zero = k.u32(0);
        k.shared_load(red, zero)
    }

    /// Phase 1: q (its row at `q_row`) into `sq`, times `s2` = scale·log2 e, by the first
    /// `chunks` invocations.
    fn stage_q(&self, k: &mut KernelBuilder, q: Buffer, q_row: Val, s2: Val, sq: Shared) {
        let cc = k.u32(self.chunks);
        let staging = k.lt(self.lid, cc);
        k.if_(staging, |k| {
            let x = k.var(v4());
            self.by_width(k, |k, wide| {
                let y = self.load4(k, q, q_row, self.lid, wide);
                k.set(x, y);
            });
            let x = k.get(x);
            let m = k.splat(s2, 4);
            let x = k.mul(x, m);
            k.shared_store(sq, self.lid, x);
        });
        k.workgroup_barrier();
    }

    /// Phase 2: the scores q·k of the chunk's keys into `scores`, invocation i taking keys
    /// i, i + W, ...; returns its running maximum.
    fn scores(
        &self,
        k: &mut KernelBuilder,
        keys: Buffer,
        k_base: Val,
        sq: Shared,
        scores: Shared,
    ) -> Val {
        let ninf = k.const_f32(f32::NEG_INFINITY);
        let mloc = k.var_init(ninf);
        let wc = k.u32(DECODE_WORKGROUP);
        let cc = k.u32(self.chunks);
        self.by_width(k, |k, wide| {
            k.for_range(self.lid, self.n, wc, |k, t| {
                let row = self.key_row(k, k_base, t);
                let zero4 = k.const_float(v4(), 0.0);
                let acc = k.var_init(zero4);
                let (z, one) = (k.u32(0), k.u32(1));
                k.for_range(z, cc, one, |k, ci| {
                    let kv = self.load4(k, keys, row, ci, wide);
                    let qv = k.shared_load(sq, ci);
                    let a = k.get(acc);
                    let a = k.fma(qv, kv, a);
                    k.set(acc, a);
                });
                let a = k.get(acc);
                let ones = k.const_float(v4(), 1.0);
                let dot = k.dot(a, ones);
                k.shared_store(scores, t, dot);
                let m = k.get(mloc);
                let m = k.max(m, dot);
                k.set(mloc, m);
            });
        });
        k.get(mloc)
    }

    /// Phase 3: each invocation turns the scores it wrote into 2^(score − shift) (no
    /// barrier needed in between); returns the sum of its own.
    fn exponentiate(&self, k: &mut KernelBuilder, scores: Shared, shift: Val) -> Val {
        let zero = k.const_f32(0.0);
        let lloc = k.var_init(zero);
        let wc = k.u32(DECODE_WORKGROUP);
        k.for_range(self.lid, self.n, wc, |k, t| {
            let x = k.shared_load(scores, t);
            let x = k.sub(x, shift);
            let p = k.exp2(x);
            k.shared_store(scores, t, p);
            let l = k.get(lloc);
            let l = k.add(l, p);
            k.set(lloc, l);
        });
        k.get(lloc)
    }

    /// Phase 4: Σ p·V, invocation (g, ci) summing keys g, g + groups, ... on vec4 ci of D
    /// into `sums`; then the groups' sums added up by the first `chunks` invocations (the
    /// others get zero).
    fn sum_v(
        &self,
        k: &mut KernelBuilder,
        values: Buffer,
        v_base: Val,
        probs: Shared,
        sums: Shared,
    ) -> Val {
        let (gc, cc) = (k.u32(self.groups), k.u32(self.chunks));
        let g = k.div(self.lid, cc);
        let ci = k.rem(self.lid, cc);
        let active = k.lt(g, gc);
        let zero4 = k.const_float(v4(), 0.0);
        let acc = k.var_init(zero4);
        k.if_(active, |k| {
            self.by_width(k, |k, wide| {
                k.for_range(g, self.n, gc, |k, t| {
                    let p = k.shared_load(probs, t);
                    let row = self.key_row(k, v_base, t);
                    let vv = self.load4(k, values, row, ci, wide);
                    let p = k.splat(p, 4);
                    let a = k.get(acc);
                    let a = k.fma(p, vv, a);
                    k.set(acc, a);
                });
            });
            let a = k.get(acc);
            k.shared_store(sums, self.lid, a);
        });
        k.workgroup_barrier();
        let total = k.var_init(zero4);
        let staging = k.lt(self.lid, cc);
        k.if_(staging, |k| {
            for gi in 0..self.groups {
                let o = k.u32(gi * self.chunks);
                let at = k.add(self.lid, o);
                let x = k.shared_load(sums, at);
                let t = k.get(total);
                let t = k.add(t, x);
                k.set(total, t);
            }
        });
        k.get(total)
    }
}

fn v4() -> Ty {
    Ty::vector(Scalar::F32, 4)
}

/// The `Split` kernel (see the module's notes): workgroup (s, b·H + h) takes keys
/// s·chunk .. min((s + 1)·chunk, len).
pub(super) fn split(kern: &DecodeKernel, head_dim: u32) -> KernelModule {
    let w = DECODE_WORKGROUP;
    let chunks = head_dim.div_ceil(4);
    let groups = w / chunks;
    let mut k = KernelBuilder::new(kern.name(), kern.binding, [w, 1, 1]);
    let elem = buffer_scalar(kern.storage);
    let bufs = Buffers {
        q: k.buffer("q", elem, Access::Read),
        k: k.buffer("k", elem, Access::Read),
        v: k.buffer("v", elem, Access::Read),
        o: k.buffer("o", elem, Access::Write),
        part: k.buffer("part", Scalar::F32, Access::Write),
    };
    let u = Ty::scalar(Scalar::U32);
    let sizes = ["len", "heads", "chunk"].map(|n| k.param(n, u));
    let scale = k.param("scale", Ty::scalar(Scalar::F32));
    // q's offset and (batch, head) strides; k's and v's offsets and shared strides.
    let strides = [
        "q_off", "q_sb", "q_sh", "k_off", "v_off", "kv_sb", "kv_st", "kv_sh",
    ]
    .map(|n| k.param(n, u));
    k.begin();
    let [len, heads, chunk] = sizes.map(|p| k.load_param(p));
    let scale = k.load_param(scale);
    let [q_off, q_sb, q_sh, k_off, v_off, sb, st, sh] = strides.map(|p| k.load_param(p));
    let f = Ty::scalar(Scalar::F32);
    let sq = k.shared_array(v4(), SharedLen::Fixed(chunks));
    let scores = k.shared_array(f, SharedLen::Fixed(DECODE_MAX_CHUNK));
    let red = k.shared_array(f, SharedLen::Fixed(w));
    let sums = k.shared_array(v4(), SharedLen::Fixed(groups * chunks));

    // Grid (chunks, B·H), never folded (the launch checks the limits).
    let wid = k.workgroup_id();
    let nwg = k.num_workgroups();
    let (s, bh) = (k.extract(wid, 0), k.extract(wid, 1));
    let (splits, rows) = (k.extract(nwg, 0), k.extract(nwg, 1));
    let b = k.div(bh, heads);
    let h = k.rem(bh, heads);
    // This chunk's keys: k0..k0 + n (none past len, none past the scores array).
    let k0 = k.mul(s, chunk);
    let live = k.lt(k0, len);
    let left = k.sub(len, k0);
    let n = k.min(left, chunk);
    let zero_u = k.u32(0);
    let n = k.select(live, n, zero_u);
    let max_chunk = k.u32(DECODE_MAX_CHUNK);
    let n = k.min(n, max_chunk);
    let base = |k: &mut KernelBuilder, off: Val, (sb, sh): (Val, Val)| {
        let x = k.mul(b, sb);
        let y = k.mul(h, sh);
        let x = k.add(x, y);
        k.add(x, off)
    };
    let q_row = base(&mut k, q_off, (q_sb, q_sh));
    let k_base = base(&mut k, k_off, (sb, sh));
    let v_base = base(&mut k, v_off, (sb, sh));
    let wide = (head_dim % 4 == 0).then(|| {
        let x = [q_sb, q_sh, k_off, v_off, sb, st, sh]
            .into_iter()
            .fold(q_off, |x, y| k.or(x, y));
        let three = k.u32(3);
        let x = k.and(x, three);
        k.eq(x, zero_u)
    });
    let c = SplitCtx {
        storage: kern.storage,
        head_dim,
        chunks,
        groups,
        lid: k.local_index(),
        wide,
        k0,
        n,
        st,
    };

    // Scores in base 2 (q staged times scale·log2 e), so every exponential is one exp2.
    let l2e = k.const_f32(std::f32::consts::LOG2_E);
    let s2 = k.mul(scale, l2e);
    c.stage_q(&mut k, bufs.q, q_row, s2, sq);
    let m = c.scores(&mut k, bufs.k, k_base, sq, scores);
    let m = c.reduce(&mut k, red, m, true);
    // A chunk whose scores are all −inf shifts by 0, so its exponentials are 0, not NaN.
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let none = k.eq(m, ninf);
    let zero = k.const_f32(0.0);
    let shift = k.select(none, zero, m);
    let l = c.exponentiate(&mut k, scores, shift);
    // Its barriers also publish the probabilities to every invocation.
    let l = c.reduce(&mut k, red, l, false);
    let total = c.sum_v(&mut k, bufs.v, v_base, scores, sums);
    store(&mut k, &c, &bufs, (bh, s, splits, rows), (m, l, total));
    k.finish()
}

/// Phase 5, by the first `chunks` invocations: O = total / l when the cache is one chunk,
/// else the chunk's partials (the sum of V; lane 0 the pair (m, l) after every sum).
fn store(
    k: &mut KernelBuilder,
    c: &SplitCtx,
    bufs: &Buffers,
    (bh, s, splits, rows): (Val, Val, Val, Val),
    (m, l, total): (Val, Val, Val),
) {
    let cc = k.u32(c.chunks);
    let staging = k.lt(c.lid, cc);
    k.if_(staging, |k| {
        let one = k.u32(1);
        let single = k.eq(splits, one);
        let dv = k.u32(c.head_dim);
        k.if_else(
            single,
            |k| {
                let zero = k.const_f32(0.0);
                let empty = k.eq(l, zero);
                let onef = k.const_f32(1.0);
                let r = k.div(onef, l);
                let r = k.select(empty, zero, r);
                let r = k.splat(r, 4);
                let o = k.mul(total, r);
                let row = k.mul(bh, dv);
                c.store4(k, bufs.o, row, o, c.storage);
            },
            |k| {
                let slot = k.mul(bh, splits);
                let slot = k.add(slot, s);
                let row = k.mul(slot, dv);
                c.store4(k, bufs.part, row, total, Storage::F32);
                let zero_u = k.u32(0);
                let first = k.eq(c.lid, zero_u);
                k.if_(first, |k| {
                    let all = k.mul(rows, splits);
                    let all = k.mul(all, dv);
                    let two = k.u32(2);
                    let at = k.mul(slot, two);
                    let at = k.add(all, at);
                    k.store(bufs.part, at, m);
                    let at = k.add(at, one);
                    k.store(bufs.part, at, l);
                });
            },
        );
    });
}
