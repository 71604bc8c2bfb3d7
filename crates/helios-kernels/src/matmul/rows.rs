//! Few-row products: decoding's one token (or batch of a few) against a weight matrix, whose
//! time is B's bytes, not its arithmetic. A tiled kernel walks k one step after another, a
//! memory round trip each, on as many workgroups as output tiles, so it takes several times
//! what streaming the weights would (bench/results/2026-11-30-session47-h200.md).
//!
//! Here a workgroup owns `bm` rows × `bn` columns of C, and its [`ROWS_THREADS`] invocations
//! split the whole k range between them: with B not transposed (k × n, n contiguous)
//! invocation `i` reads rows `i`, `i + 256`, … of the tile's columns, `bn` contiguous
//! elements each; transposed (n × k, k contiguous), chunks of 32 bytes of k of every column.
//! Either way a subgroup's loads are contiguous runs of whole 32-byte sectors, and an
//! invocation's loads are independent of each other, so they are in flight together. At the
//! end each subgroup adds its invocations' sums (subgroup arithmetic: every invocation holds
//! the same outputs), the subgroups' sums meet in shared memory, and one invocation per four
//! outputs stores them through the common epilogue. Rows and columns past the matrix read
//! clamped addresses (their outputs are never stored); k past its end is masked to zero.

use helios_spirv::{
    Binding, Buffer, GroupMode, KernelBuilder, KernelModule, ReduceOp, Scalar, Shared, SharedLen,
    Ty, Val, Var,
};

use super::epilogue::store_quad;
use super::kloop::mask;
use super::params::{declare, tile_origin, Dims, Params};
use super::{MatmulKernel, RowsTile, ROWS_THREADS};
use crate::storage::{buffer_scalar, load_f32};

/// Bytes of B an invocation reads at a time along k when k is contiguous (B transposed): one
/// sector.
const SECTOR: u32 = 32;

pub(crate) fn build(kern: &MatmulKernel, t: RowsTile) -> KernelModule {
    let (bm, bn) = (u32::from(t.bm), u32::from(t.bn));
    let quads = bn / 4;
    let mut k = KernelBuilder::new(kern.name(), Binding::DeviceAddress, [ROWS_THREADS, 1, 1]);
    let elem = buffer_scalar(kern.input);
    let p = declare(&mut k, kern, elem, elem);
    k.begin();

    let (d, m0, n0) = tile_origin(&mut k, &p, bm, bn);
    let tid = k.local_index();
    // The rows of A this tile reads, clamped into the matrix.
    let one = k.u32(1);
    let m_last = k.sub(d.m, one);
    let rows: Vec<Val> = (0..bm)
        .map(|r| {
            let r = k.u32(r);
            let row = k.add(m0, r);
            k.min(row, m_last)
        })
        .collect();
    let cols = Cols::new(&mut k, kern, &d, n0, bn);
    let g = Gather {
        kern,
        p: &p,
        d: &d,
        rows: &rows,
        cols: &cols,
    };
    let vec4 = Ty::vector(Scalar::F32, 4);
    let zero4 = k.constant_bits(vec4, 0);
    if kern.trans_b {
        nt_sums_and_store(&mut k, &g, &d, m0, n0, (bm, bn));
        return k.finish();
    }
    // Sums of 4 outputs each, (row r, columns 4q..4q+3) at r · quads + q.
    let sums: Vec<Val> = {
        let acc: Vec<Var> = (0..bm * quads).map(|_| k.var_init(zero4)).collect();
        split_k(&mut k, tid, ROWS_THREADS, d.k, 4, |k, kk, ok| {
            g.row_nn(k, kk, ok, &acc)
        });
        acc.iter().map(|&v| k.get(v)).collect()
    };

    // Every invocation of a subgroup holds the same outputs: the subgroup adds them, its
    // first invocation leaves the sums in shared memory, and invocation o < bm · quads adds
    // the subgroups' sums of its four outputs and stores them.
    let outs = bm * quads;
    let red = subgroup_sums(&mut k, vec4, sums);
    let zero_u = k.u32(0);
    let outs_v = k.u32(outs);
    let storing = k.lt(tid, outs_v);
    let nsg = k.num_subgroups();
    k.if_(storing, |k| {
        let v = shared_sum(k, red, (zero_u, nsg), outs_v, tid, zero4);
        store_tile_quad(k, &g, (m0, n0), quads, tid, v);
    });
    k.finish()
}

/// Invocations that share one column's k range when B is stored n × k: a subgroup (64
/// invocations or fewer, `MatmulCaps::subgroup_add`) never spans two columns.
const NT_LANES: u32 = 64;

/// B stored n × k (the LM head): the workgroup's invocations form
/// `ROWS_THREADS / NT_LANES` groups of [`NT_LANES`], group `g` taking columns `g`, `g + 4`, …
/// of the tile, each invocation 32-byte chunks of their k range. Each subgroup adds its
/// invocations' sums, the subgroups of a group meet in shared memory, and invocation
/// `o < bm · bn / 4` stores four neighbouring columns (one from each group).
fn nt_sums_and_store(
    k: &mut KernelBuilder,
    g: &Gather,
    d: &Dims,
    m0: Val,
    n0: Val,
    (bm, bn): (u32, u32),
) {
    let kern = g.kern;
    let groups = ROWS_THREADS / NT_LANES;
    let per_group = bn / groups;
    let tid = k.local_index();
    let lanes_v = k.u32(NT_LANES);
    let group = k.div(tid, lanes_v);
    let lane_k = k.rem(tid, lanes_v);
    let one = k.u32(1);
    let n_last = k.max(d.n, one);
    let n_last = k.sub(n_last, one);
    let groups_v = k.u32(groups);
    let cols: Vec<Val> = (0..per_group)
        .map(|q| {
            let c = k.u32(q);
            let c = k.mul(c, groups_v);
            let c = k.add(c, group);
            let c = k.add(n0, c);
            k.min(c, n_last)
        })
        .collect();
    let zero = k.const_f32(0.0);
    let acc: Vec<Var> = (0..bm * per_group).map(|_| k.var_init(zero)).collect();
    let chunk = SECTOR / kern.input.bytes();
    let k_chunks = {
        let c = k.u32(chunk - 1);
        let c = k.add(d.k, c);
        let per = k.u32(chunk);
        k.div(c, per)
    };
    split_k(k, lane_k, NT_LANES, k_chunks, 2, |k, c, ok| {
        g.chunk_nt(k, c, ok, chunk, &cols, &acc)
    });
    // One f32 per (row, column slot) per subgroup.
    let sums: Vec<Val> = acc.iter().map(|&v| k.get(v)).collect();
    let red = subgroup_sums(k, Ty::scalar(Scalar::F32), sums);
    let slots = bm * per_group;
    let slots_v = k.u32(slots);
    // Output quad o = (row r, columns 4q..4q+3): column 4q + l is group l's slot q, summed
    // over the group's subgroups (NT_LANES / subgroup size of them, consecutive).
    let storing = k.lt(tid, slots_v);
    let size = k.subgroup_size();
    let per_sg = k.div(lanes_v, size);
    k.if_(storing, |k| {
        let lanes: Vec<Val> = (0..groups)
            .map(|l| {
                let l_v = k.u32(l);
                let from = k.mul(l_v, per_sg);
                let to = k.add(from, per_sg);
                shared_sum(k, red, (from, to), slots_v, tid, zero)
            })
            .collect();
        let v = k.vector(&lanes);
        store_tile_quad(k, g, (m0, n0), per_group, tid, v);
    });
}

/// Each subgroup adds `values` (the same slots in every invocation), and its first
/// invocation leaves the sums in shared memory at `subgroup · values.len() + i`, for
/// subgroups of 4 invocations or more (`MatmulCaps::subgroup_add`). Returns that array, after
/// a workgroup barrier.
fn subgroup_sums(k: &mut KernelBuilder, elem: Ty, values: Vec<Val>) -> Shared {
    let len = values.len() as u32;
    let red = k.shared_array(elem, SharedLen::Fixed(ROWS_THREADS / 4 * len));
    let sums: Vec<Val> = values
        .into_iter()
        .map(|v| k.subgroup_reduce(ReduceOp::Add, GroupMode::Reduce, v))
        .collect();
    let sg = k.subgroup_id();
    let lane = k.subgroup_invocation_id();
    let zero = k.u32(0);
    let first = k.eq(lane, zero);
    let len_v = k.u32(len);
    k.if_(first, |k| {
        let base = k.mul(sg, len_v);
        for (i, v) in sums.into_iter().enumerate() {
            let at = k.u32(i as u32);
            let at = k.add(base, at);
            k.shared_store(red, at, v);
        }
    });
    k.workgroup_barrier();
    red
}

/// The sum of `red[s · stride + at]` over subgroups `s` in `from..to` (what
/// `subgroup_sums` left there), starting from `zero`.
fn shared_sum(
    k: &mut KernelBuilder,
    red: Shared,
    (from, to): (Val, Val),
    stride: Val,
    at: Val,
    zero: Val,
) -> Val {
    let total = k.var_init(zero);
    let step = k.u32(1);
    k.for_range(from, to, step, |k, s| {
        let i = k.mul(s, stride);
        let i = k.add(i, at);
        let v = k.shared_load(red, i);
        let sum = k.get(total);
        let sum = k.add(sum, v);
        k.set(total, sum);
    });
    k.get(total)
}

/// Stores `v`, output quad `o` of the tile at (`m0`, `n0`): row `o / quads`, columns
/// `4 · (o % quads)` to 3 more.
fn store_tile_quad(
    k: &mut KernelBuilder,
    g: &Gather,
    (m0, n0): (Val, Val),
    quads: u32,
    o: Val,
    v: Val,
) {
    let quads_v = k.u32(quads);
    let r = k.div(o, quads_v);
    let q = k.rem(o, quads_v);
    let row = k.add(m0, r);
    let four = k.u32(4);
    let c = k.mul(q, four);
    let col = k.add(n0, c);
    store_quad(k, g.kern, g.p, g.d, row, col, v);
}

/// `body(k, i, in_range)` for every `i` in `0..count` this invocation takes: `first`,
/// `first + lanes`, …, `unroll` at a time so that their loads are issued together. Past
/// `count` it gets the last index (an address inside the matrix) and `in_range` false.
fn split_k(
    k: &mut KernelBuilder,
    first: Val,
    lanes: u32,
    count: Val,
    unroll: u32,
    mut body: impl FnMut(&mut KernelBuilder, Val, Val),
) {
    let step = k.u32(lanes * unroll);
    let one = k.u32(1);
    let last = k.max(count, one);
    let last = k.sub(last, one);
    k.for_range(first, count, step, |k, base| {
        for u in 0..unroll {
            let off = k.u32(u * lanes);
            let i = k.add(base, off);
            let ok = k.lt(i, count);
            let i = k.min(i, last);
            body(k, i, ok);
        }
    });
}

/// The tile's columns of B, clamped into the matrix: their first element offsets along n,
/// as 4-column groups where B is read in vectors along n.
struct Cols {
    /// One per column (`bn`).
    each: Vec<Val>,
}

impl Cols {
    fn new(k: &mut KernelBuilder, kern: &MatmulKernel, d: &Dims, n0: Val, bn: u32) -> Cols {
        // With vector loads along n (B not transposed), n is a multiple of 4 and a group is
        // wholly inside or past the end: clamp the group to the last one.
        let width = if !kern.trans_b && kern.vec_b { 4 } else { 1 };
        let w = k.u32(width);
        let last = k.max(d.n, w);
        let last = k.sub(last, w);
        let each = (0..bn)
            .map(|j| {
                let base = k.u32(j - j % width);
                let c = k.add(n0, base);
                let c = k.min(c, last);
                match j % width {
                    0 => c,
                    lane => {
                        let lane = k.u32(lane);
                        k.add(c, lane)
                    }
                }
            })
            .collect();
        Cols { each }
    }
}

/// What reading the operands needs: the kernel, its buffers and dimensions, the tile's rows
/// of A and columns of B.
struct Gather<'a> {
    kern: &'a MatmulKernel,
    p: &'a Params,
    d: &'a Dims,
    rows: &'a [Val],
    cols: &'a Cols,
}

/// Four consecutive positions of k in a chunk: each clamped into the row (`kks`), and
/// whether it exists (`oks`).
struct Quad {
    kks: Vec<Val>,
    oks: Vec<Val>,
}

impl Gather<'_> {
    /// A at (`row`, `kk`), one element.
    fn a(&self, k: &mut KernelBuilder, row: Val, kk: Val) -> Val {
        let (major, minor) = if self.kern.trans_a {
            (kk, row)
        } else {
            (row, kk)
        };
        let at = k.mul(major, self.d.lda);
        let at = k.add(at, self.d.off_a);
        let at = k.add(at, minor);
        load_f32(k, self.p.a, at, 1, self.kern.input)
    }

    /// B not transposed: row `kk` of the tile's columns added into `acc` (vec4 per row of A
    /// and 4 columns), times A's elements at `kk` (zero where `ok` is false).
    fn row_nn(&self, k: &mut KernelBuilder, kk: Val, ok: Val, acc: &[Var]) {
        let (kern, d) = (self.kern, self.d);
        let start = k.mul(kk, d.ldb);
        let start = k.add(start, d.off_b);
        let quads = self.cols.each.len() / 4;
        let b: Vec<Val> = (0..quads)
            .map(|q| {
                let v = if kern.vec_b {
                    let at = k.add(start, self.cols.each[4 * q]);
                    let four = k.u32(4);
                    let at = k.div(at, four);
                    load_f32(k, self.p.b, at, 4, kern.input)
                } else {
                    let lanes: Vec<Val> = (0..4)
                        .map(|l| {
                            let at = k.add(start, self.cols.each[4 * q + l]);
                            load_f32(k, self.p.b, at, 1, kern.input)
                        })
                        .collect();
                    k.vector(&lanes)
                };
                mask(k, ok, v)
            })
            .collect();
        for (r, &row) in self.rows.iter().enumerate() {
            let a = self.a(k, row, kk);
            let a = mask(k, ok, a);
            let a = k.splat(a, 4);
            for (q, &bq) in b.iter().enumerate() {
                let slot = acc[r * quads + q];
                let sum = k.get(slot);
                let sum = k.fma(a, bq, sum);
                k.set(slot, sum);
            }
        }
    }

    /// Four consecutive k of a row of `buf`, element `start + kk · stride` (`None`: 1) for
    /// the quad's positions, zero where past k: one vector load where `vec` (consecutive
    /// elements, k a multiple of 4, so the quad is all in or all out), else four.
    fn load_quad(
        &self,
        k: &mut KernelBuilder,
        buf: Buffer,
        start: Val,
        stride: Option<Val>,
        vec: bool,
        q: &Quad,
    ) -> Val {
        let input = self.kern.input;
        if vec {
            let at = k.add(start, q.kks[0]);
            let four = k.u32(4);
            let at = k.div(at, four);
            let v = load_f32(k, buf, at, 4, input);
            return mask(k, q.oks[0], v);
        }
        let lanes: Vec<Val> = (0..4)
            .map(|l| {
                let step = match stride {
                    Some(s) => k.mul(q.kks[l], s),
                    None => q.kks[l],
                };
                let at = k.add(start, step);
                let v = load_f32(k, buf, at, 1, input);
                mask(k, q.oks[l], v)
            })
            .collect();
        k.vector(&lanes)
    }

    /// B transposed: chunk `c` of k (`chunk` elements from `c · chunk`) of the columns
    /// `cols` (this invocation's, clamped into the matrix), dotted with the same stretch of
    /// A's rows into `acc` (one f32 per row and column, row-major).
    fn chunk_nt(
        &self,
        k: &mut KernelBuilder,
        c: Val,
        ok: Val,
        chunk: u32,
        cols: &[Val],
        acc: &[Var],
    ) {
        let (kern, d) = (self.kern, self.d);
        let bn = cols.len();
        let per = k.u32(chunk);
        let k0 = k.mul(c, per);
        let one = k.u32(1);
        let k_last = k.max(d.k, one);
        let k_last = k.sub(k_last, one);
        for e in 0..chunk / 4 {
            let off = k.u32(4 * e);
            let kq = k.add(k0, off);
            // Which of the 4 k positions exist (k need not be a multiple of the chunk), and
            // their addresses clamped into the row.
            let (kks, oks): (Vec<Val>, Vec<Val>) = (0..4)
                .map(|l| {
                    let lo = k.u32(l);
                    let kk = k.add(kq, lo);
                    let in_k = k.lt(kk, d.k);
                    let in_k = k.and(in_k, ok);
                    (k.min(kk, k_last), in_k)
                })
                .unzip();
            let quad = Quad { kks, oks };
            let a: Vec<Val> = self
                .rows
                .iter()
                .map(|&row| match kern.trans_a {
                    // A stored k × m: the row's k are `lda` apart.
                    true => {
                        let start = k.add(d.off_a, row);
                        self.load_quad(k, self.p.a, start, Some(d.lda), false, &quad)
                    }
                    false => {
                        let start = k.mul(row, d.lda);
                        let start = k.add(start, d.off_a);
                        self.load_quad(k, self.p.a, start, None, kern.vec_a, &quad)
                    }
                })
                .collect();
            for (j, &col) in cols.iter().enumerate() {
                let start = k.mul(col, d.ldb);
                let start = k.add(start, d.off_b);
                let b = self.load_quad(k, self.p.b, start, None, kern.vec_b, &quad);
                for (r, &av) in a.iter().enumerate() {
                    let slot = acc[r * bn + j];
                    let mut sum = k.get(slot);
                    for l in 0..4 {
                        let x = k.extract(av, l);
                        let y = k.extract(b, l);
                        sum = k.fma(x, y, sum);
                    }
                    k.set(slot, sum);
                }
            }
        }
    }
}
