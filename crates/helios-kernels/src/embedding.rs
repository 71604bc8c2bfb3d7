//! Embedding: the gather `out[i, :] = table[ids[i], :]` and its backward, the scatter-add
//! `dtable[v, :] = Σ_{i : ids[i] = v} dout[i, :]`, deterministic bit for bit.
//!
//! The one decision a reader must know: the IR has no float atomics, and float addition in
//! arrival order would not be deterministic anyway, so the backward never races on floats.
//! It builds, per vocabulary row, the list of positions that use it (a counting sort whose
//! only atomics are exact u32 counters), puts each list in increasing position order, and
//! then one workgroup per vocabulary row sums its `dout` rows in that order with f32
//! accumulation. Every `dout` row is read once and every `dtable` row written once (rows
//! no id uses are written as zeros), so the bytes moved are the ideal ones plus a few
//! u32 arrays of `n` and `vocab` entries. Six dispatches, in order:
//!
//! 1. `Zero`: `counts[v] = 0` (vocab);
//! 2. `Count`: `counts[ids[i]] += 1` (u32 atomics: exact, so the result is deterministic);
//! 3. `Scan` (one workgroup): `offsets` = exclusive prefix sum of `counts` (vocab + 1
//!    entries), and `counts` back to 0 for use as cursors;
//! 4. `Place`: `pos[offsets[id] + atomic_add(counts[id], 1)] = i`: each list is complete
//!    but in arrival order;
//! 5. `Rank`: invocation i takes its rank r among the positions of its list (how many are
//!    smaller) and writes `sorted[offsets[id] + r] = i`: the list in increasing order, the
//!    same every run (O(k) per id for a list of k, so Σk² in all: cheap for natural text,
//!    quadratic only when one id fills the whole batch);
//! 6. `Sum`: workgroup v sums `dout[sorted[j], :]` over its list into `dtable[v, :]`.
//!
//! Every kernel declares the buffers it reads before those it writes.
//!
//! Ids outside `[0, vocab)` (when they were not checked on the host) give NaN rows in the
//! forward output and are skipped by the backward.

use helios_spirv::{Access, Binding, KernelBuilder, KernelModule, Scalar, SharedLen, Ty, Val};

use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::rows::linear_workgroup;
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};
use crate::KernelError;

/// Workgroup size of the per-element and per-id kernels.
pub const EMBEDDING_WORKGROUP: u32 = 256;
/// Workgroup size of `Sum` (one workgroup per vocabulary row; 64 invocations cover a
/// 768-wide f32 row in 3 vec4 steps).
pub const EMBEDDING_SUM_WORKGROUP: u32 = 64;
/// Workgroup size of `Scan` (one workgroup for the whole vocabulary).
pub const EMBEDDING_SCAN_WORKGROUP: u32 = 512;

/// Which embedding kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EmbeddingStage {
    Forward,
    Zero,
    Count,
    Scan,
    Place,
    Rank,
    Sum,
}

impl EmbeddingStage {
    /// The backward's dispatches, in order.
    pub const BACKWARD: [EmbeddingStage; 6] = [
        EmbeddingStage::Zero,
        EmbeddingStage::Count,
        EmbeddingStage::Scan,
        EmbeddingStage::Place,
        EmbeddingStage::Rank,
        EmbeddingStage::Sum,
    ];
}

/// The signature of an embedding kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EmbeddingKernel {
    pub stage: EmbeddingStage,
    /// Storage of table/out (Forward) or dout/dtable (Sum); `F32` for the index kernels.
    pub storage: Storage,
    /// Elements per access along a row: 4 when the row width divides by 4, else 1 (index
    /// kernels: 1).
    pub lanes: u8,
    pub binding: Binding,
}

/// One embedding problem: `n` ids into a `vocab` × `dim` table, and the device addresses of
/// its buffers (each stage uses some; ignored with descriptor binding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbeddingArgs {
    pub n: u32,
    pub dim: u32,
    pub vocab: u32,
    /// (n,) u32.
    pub ids: u64,
    /// (vocab, dim), Forward.
    pub table: u64,
    /// (n, dim), Forward.
    pub out: u64,
    /// (n, dim), Sum.
    pub dout: u64,
    /// (vocab, dim), Sum.
    pub dtable: u64,
    /// (vocab,) u32 scratch: counts, then cursors.
    pub counts: u64,
    /// (vocab + 1,) u32: start of each vocabulary row's list.
    pub offsets: u64,
    /// (n,) u32: positions grouped by id, in arrival order.
    pub pos: u64,
    /// (n,) u32: positions grouped by id, in increasing order.
    pub sorted: u64,
}

impl EmbeddingKernel {
    /// The kernel of `stage`; `storage` and `dim` matter to Forward and Sum only.
    pub fn new(stage: EmbeddingStage, storage: Storage, dim: usize, binding: Binding) -> Self {
        let (storage, lanes) = match stage {
            EmbeddingStage::Forward | EmbeddingStage::Sum => {
                (storage, if dim % 4 == 0 { 4 } else { 1 })
            }
            _ => (Storage::F32, 1),
        };
        EmbeddingKernel {
            stage,
            storage,
            lanes,
            binding,
        }
    }

    /// Every embedding kernel for `binding`, for validation and warm-up.
    pub fn all(binding: Binding) -> Vec<EmbeddingKernel> {
        let mut out = Vec::new();
        for stage in [EmbeddingStage::Forward, EmbeddingStage::Sum] {
            for s in Storage::ALL {
                for dim in [4, 3] {
                    out.push(Self::new(stage, s, dim, binding));
                }
            }
        }
        for stage in &EmbeddingStage::BACKWARD[..5] {
            out.push(Self::new(*stage, Storage::F32, 1, binding));
        }
        out
    }

    pub fn name(&self) -> String {
        let v = if self.lanes == 4 { "_v4" } else { "" };
        match self.stage {
            EmbeddingStage::Forward => format!("emb_fwd_{}{v}", self.storage.name()),
            EmbeddingStage::Sum => format!("emb_bwd_sum_{}{v}", self.storage.name()),
            EmbeddingStage::Zero => "emb_bwd_zero".into(),
            EmbeddingStage::Count => "emb_bwd_count".into(),
            EmbeddingStage::Scan => "emb_bwd_scan".into(),
            EmbeddingStage::Place => "emb_bwd_place".into(),
            EmbeddingStage::Rank => "emb_bwd_rank".into(),
        }
    }

    fn workgroup(&self) -> u32 {
        match self.stage {
            EmbeddingStage::Sum => EMBEDDING_SUM_WORKGROUP,
            EmbeddingStage::Scan => EMBEDDING_SCAN_WORKGROUP,
            _ => EMBEDDING_WORKGROUP,
        }
    }

    /// Emits the kernel (buffers and push constants in the order `launch` packs them).
    pub fn build(&self) -> KernelModule {
        let mut k = KernelBuilder::new(self.name(), self.binding, [self.workgroup(), 1, 1]);
        let u = Scalar::U32;
        let b = |k: &mut KernelBuilder, name: &str, w: bool| {
            let access = if w { Access::ReadWrite } else { Access::Read };
            k.buffer(name, u, access)
        };
        match self.stage {
            EmbeddingStage::Forward => self.build_forward(&mut k),
            EmbeddingStage::Zero => {
                let counts = k.buffer("counts", u, Access::Write);
                let vocab = k.param("vocab", Ty::scalar(u));
                k.begin();
                let vocab = k.load_param(vocab);
                let i = global_index(&mut k);
                let inside = k.lt(i, vocab);
                k.if_(inside, |k| {
                    let z = k.u32(0);
                    k.store(counts, i, z);
                });
            }
            EmbeddingStage::Count => {
                let ids = b(&mut k, "ids", false);
                let counts = b(&mut k, "counts", true);
                let (n, vocab) = n_vocab_params(&mut k);
                k.begin();
                for_valid_id(&mut k, ids, n, vocab, |k, _, id| {
                    let one = k.u32(1);
                    k.atomic_add(counts, id, one);
                });
            }
            EmbeddingStage::Scan => build_scan(&mut k),
            EmbeddingStage::Place => {
                let ids = b(&mut k, "ids", false);
                let offsets = b(&mut k, "offsets", false);
                let counts = b(&mut k, "counts", true);
                let pos = k.buffer("pos", u, Access::Write);
                let (n, vocab) = n_vocab_params(&mut k);
                k.begin();
                for_valid_id(&mut k, ids, n, vocab, |k, i, id| {
                    let one = k.u32(1);
                    let cursor = k.atomic_add(counts, id, one);
                    let start = k.load(offsets, id, 1);
                    let slot = k.add(start, cursor);
                    k.store(pos, slot, i);
                });
            }
            EmbeddingStage::Rank => {
                let ids = b(&mut k, "ids", false);
                let offsets = b(&mut k, "offsets", false);
                let pos = b(&mut k, "pos", false);
                let sorted = k.buffer("sorted", u, Access::Write);
                let (n, vocab) = n_vocab_params(&mut k);
                k.begin();
                for_valid_id(&mut k, ids, n, vocab, |k, i, id| {
                    let start = k.load(offsets, id, 1);
                    let one = k.u32(1);
                    let next = k.add(id, one);
                    let end = k.load(offsets, next, 1);
                    let zero = k.u32(0);
                    let rank = k.var_init(zero);
                    k.for_range(start, end, one, |k, j| {
                        let q = k.load(pos, j, 1);
                        let before = k.lt(q, i);
                        let (one, zero) = (k.u32(1), k.u32(0));
                        let inc = k.select(before, one, zero);
                        let r = k.get(rank);
                        let r = k.add(r, inc);
                        k.set(rank, r);
                    });
                    let r = k.get(rank);
                    let slot = k.add(start, r);
                    k.store(sorted, slot, i);
                });
            }
            EmbeddingStage::Sum => self.build_sum(&mut k),
        }
        k.finish()
    }

    fn build_forward(&self, k: &mut KernelBuilder) {
        let (s, lanes) = (self.storage, self.lanes);
        let elem = buffer_scalar(s);
        let ids = k.buffer("ids", Scalar::U32, Access::Read);
        let table = k.buffer("table", elem, Access::Read);
        let out = k.buffer("out", elem, Access::Write);
        let n = k.param("n", Ty::scalar(Scalar::U32));
        let dim = k.param("dim", Ty::scalar(Scalar::U32));
        let vocab = k.param("vocab", Ty::scalar(Scalar::U32));
        k.begin();
        let (n, dim, vocab) = (k.load_param(n), k.load_param(dim), k.load_param(vocab));
        let dl = slots_per_row(k, dim, lanes);
        let total = k.mul(n, dl);
        let g = global_index(k);
        let inside = k.lt(g, total);
        k.if_(inside, |k| {
            let i = k.div(g, dl);
            let at = k.mul(i, dl);
            let c = k.sub(g, at);
            let id = k.load(ids, i, 1);
            let valid = k.lt(id, vocab);
            let ty = Ty::vector(elem, lanes);
            // The stored bits are copied as they are: the gather is exact in every storage.
            let x = k.if_value(
                valid,
                ty,
                |k| {
                    let row = k.mul(id, dl);
                    let src = k.add(row, c);
                    k.load(table, src, lanes)
                },
                |k| {
                    let bits = match s {
                        Storage::F32 => u64::from(f32::NAN.to_bits()),
                        Storage::F16 => 0x7e00,
                        Storage::BF16 => 0x7fc0,
                    };
                    k.constant_bits(ty, bits)
                },
            );
            k.store(out, g, x);
        });
    }

    fn build_sum(&self, k: &mut KernelBuilder) {
        let (s, lanes) = (self.storage, self.lanes);
        let elem = buffer_scalar(s);
        let offsets = k.buffer("offsets", Scalar::U32, Access::Read);
        let sorted = k.buffer("sorted", Scalar::U32, Access::Read);
        let dout = k.buffer("dout", elem, Access::Read);
        let dtable = k.buffer("dtable", elem, Access::Write);
        let dim = k.param("dim", Ty::scalar(Scalar::U32));
        let vocab = k.param("vocab", Ty::scalar(Scalar::U32));
        k.begin();
        let (dim, vocab) = (k.load_param(dim), k.load_param(vocab));
        let dl = slots_per_row(k, dim, lanes);
        let v = linear_workgroup(k);
        let inside = k.lt(v, vocab);
        k.if_(inside, |k| {
            let start = k.load(offsets, v, 1);
            let one = k.u32(1);
            let next = k.add(v, one);
            let end = k.load(offsets, next, 1);
            let lid = k.local_index();
            let wg = k.workgroup_size_x();
            let row = k.mul(v, dl);
            let fty = Ty::vector(Scalar::F32, lanes);
            k.for_range(lid, dl, wg, |k, c| {
                let zero = k.const_float(fty, 0.0);
                let acc = k.var_init(zero);
                // In increasing position order: the same additions in the same order every
                // run.
                k.for_range(start, end, one, |k, j| {
                    let p = k.load(sorted, j, 1);
                    let prow = k.mul(p, dl);
                    let at = k.add(prow, c);
                    let x = load_f32(k, dout, at, lanes, s);
                    let a = k.get(acc);
                    let a = k.add(a, x);
                    k.set(acc, a);
                });
                let a = k.get(acc);
                let at = k.add(row, c);
                store_f32(k, dtable, at, a, s);
            });
        });
    }

    /// Grid and push constants for `a`.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        a: &EmbeddingArgs,
    ) -> Result<Launch, KernelError> {
        let address = self.binding == Binding::DeviceAddress;
        let bufs: &[u64] = match self.stage {
            EmbeddingStage::Forward => &[a.ids, a.table, a.out],
            EmbeddingStage::Zero => &[a.counts],
            EmbeddingStage::Count => &[a.ids, a.counts],
            EmbeddingStage::Scan => &[a.counts, a.offsets],
            EmbeddingStage::Place => &[a.ids, a.offsets, a.counts, a.pos],
            EmbeddingStage::Rank => &[a.ids, a.offsets, a.pos, a.sorted],
            EmbeddingStage::Sum => &[a.offsets, a.sorted, a.dout, a.dtable],
        };
        let mut args = Args::new();
        if address {
            args.extend(bufs.iter().map(|&b| Arg::Address(b)));
        }
        let wg = u64::from(geometry.workgroup);
        let per_row = u64::from(a.dim) / u64::from(self.lanes);
        let (params, invocations): (&[u32], u64) = match self.stage {
            EmbeddingStage::Forward => (&[a.n, a.dim, a.vocab], u64::from(a.n) * per_row),
            EmbeddingStage::Zero => (&[a.vocab], u64::from(a.vocab)),
            EmbeddingStage::Count | EmbeddingStage::Place | EmbeddingStage::Rank => {
                (&[a.n, a.vocab], u64::from(a.n))
            }
            EmbeddingStage::Scan => (&[a.vocab], wg),
            EmbeddingStage::Sum => (&[a.dim, a.vocab], u64::from(a.vocab) * wg),
        };
        args.extend(params.iter().map(|&p| Arg::U32(p)));
        let groups = grid(invocations.div_ceil(wg), geometry.max_groups_x)?;
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }
}

/// `dim / lanes`: vector slots per row.
fn slots_per_row(k: &mut KernelBuilder, dim: Val, lanes: u8) -> Val {
    if lanes == 1 {
        return dim;
    }
    let two = k.u32(2);
    k.shr(dim, two)
}

/// This invocation's index over the whole (folded) grid.
fn global_index(k: &mut KernelBuilder) -> Val {
    let wg = k.workgroup_size_x();
    crate::rows::global_index(k, wg)
}

fn n_vocab_params(k: &mut KernelBuilder) -> (helios_spirv::Param, helios_spirv::Param) {
    let n = k.param("n", Ty::scalar(Scalar::U32));
    let vocab = k.param("vocab", Ty::scalar(Scalar::U32));
    (n, vocab)
}

/// Runs `f(k, i, id)` in invocation i < n when `ids[i] < vocab`.
fn for_valid_id(
    k: &mut KernelBuilder,
    ids: helios_spirv::Buffer,
    n: helios_spirv::Param,
    vocab: helios_spirv::Param,
    f: impl FnOnce(&mut KernelBuilder, Val, Val),
) {
    let (n, vocab) = (k.load_param(n), k.load_param(vocab));
    let i = global_index(k);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let id = k.load(ids, i, 1);
        let valid = k.lt(id, vocab);
        k.if_(valid, |k| f(k, i, id));
    });
}

/// One workgroup: `offsets[v] = Σ_{u<v} counts[u]` for v in 0..=vocab, and `counts` reset to
/// 0. Invocation t owns a contiguous chunk of `counts`; chunk totals are scanned in shared
/// memory (Hillis–Steele, integers: exact in any order).
fn build_scan(k: &mut KernelBuilder) {
    let u = Ty::scalar(Scalar::U32);
    let counts = k.buffer("counts", Scalar::U32, Access::ReadWrite);
    let offsets = k.buffer("offsets", Scalar::U32, Access::Write);
    let vocab = k.param("vocab", u);
    k.begin();
    let sums = k.shared_array(u, SharedLen::WorkgroupX);
    let vocab = k.load_param(vocab);
    let lid = k.local_index();
    let wg = k.workgroup_size_x();
    let one = k.u32(1);
    let zero = k.u32(0);
    let wm1 = k.sub(wg, one);
    let vw = k.add(vocab, wm1);
    let chunk = k.div(vw, wg);
    let start = k.mul(lid, chunk);
    let start = k.min(start, vocab);
    let end = k.add(start, chunk);
    let end = k.min(end, vocab);
    let acc = k.var_init(zero);
    k.for_range(start, end, one, |k, v| {
        let c = k.load(counts, v, 1);
        let a = k.get(acc);
        let a = k.add(a, c);
        k.set(acc, a);
    });
    let mine = k.get(acc);
    k.shared_store(sums, lid, mine);
    k.workgroup_barrier();
    // Inclusive scan of the chunk totals.
    let d = k.var_init(one);
    k.while_(
        |k| {
            let dv = k.get(d);
            k.lt(dv, wg)
        },
        |k| {
            let dv = k.get(d);
            let x = k.shared_load(sums, lid);
            let has = k.ge(lid, dv);
            let from = k.sub(lid, dv);
            let from = k.select(has, from, zero);
            let y = k.shared_load(sums, from);
            let y = k.select(has, y, zero);
            let r = k.add(x, y);
            k.workgroup_barrier();
            k.shared_store(sums, lid, r);
            k.workgroup_barrier();
        },
        |k| {
            let dv = k.get(d);
            let dv = k.add(dv, dv);
            k.set(d, dv);
        },
    );
    let incl = k.shared_load(sums, lid);
    let running = k.sub(incl, mine);
    let running = k.var_init(running);
    k.for_range(start, end, one, |k, v| {
        let c = k.load(counts, v, 1);
        let r = k.get(running);
        k.store(offsets, v, r);
        let r = k.add(r, c);
        k.set(running, r);
        k.store(counts, v, zero);
    });
    let last = k.eq(lid, wm1);
    k.if_(last, |k| k.store(offsets, vocab, incl));
}
