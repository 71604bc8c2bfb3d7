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
//! 1. `Zero`: `counts = 0` (`counts_len(vocab)` entries: the counts, vocab + 1 rounded up to
//!    4 so that `Scan` moves four a load, then one total per block of `SCAN_BLOCK` counts);
//! 2. `Count`: `counts[ids[i]] += 1`, and the same to its block's total (u32 atomics: exact,
//!    so the result is deterministic);
//! 3. `Scan` (a workgroup per block): `offsets` = exclusive prefix sum of the counts (vocab + 1
//!    entries, and the padding), each block starting from the sum of the totals before it,
//!    and the counts back to 0 for use as cursors;
//! 4. `Place`: `pos[offsets[id] + atomic_add(counts[id], 1)] = i`: each list is complete
//!    but in arrival order;
//! 5. `Rank`: invocation i takes its rank r among the positions of its list (how many are
//!    smaller) and writes `sorted[offsets[id] + r] = i`: the list in increasing order, the
//!    same every run (O(k) per id for a list of k, so Σk² in all: cheap for natural text,
//!    quadratic only when one id fills the whole batch);
//! 6. `Sum`: workgroup v sums `dout[sorted[j], :]` over its list into `dtable[v, :]`; or,
//!    adding into an existing table (`EmbeddingKernel::sum_into`), onto `dtable[v, :]` in
//!    place, for the rows some id uses only.
//!
//! The kernels that walk a list (`Rank`, `Sum`) issue several loads before they use any: a
//! frequent token's list in natural text has hundreds of positions, and a walk of one
//! dependent load at a time made it the step's longest chain. `Scan` is spread over
//! workgroups for the same reason: one workgroup walking GPT-2's 50304 counts took ~45 µs.
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
/// Workgroup size of `Scan`: a workgroup scans one block of `SCAN_BLOCK` counts.
pub const EMBEDDING_SCAN_WORKGROUP: u32 = 256;
/// Counts one `Scan` workgroup covers, four an invocation.
pub const SCAN_BLOCK: u64 = 4 * EMBEDDING_SCAN_WORKGROUP as u64;
/// Most vector slots of a row one `Sum` invocation accumulates in one walk of a list (a
/// wider row walks it again per group of slots).
pub const EMBEDDING_SUM_SLOTS: u8 = 4;

/// Positions of a list `Rank` compares per step: loads issued together, then used.
const RANK_UNROLL: u32 = 4;

/// Entries of the `counts` and `offsets` scratch arrays for a vocabulary of `vocab` rows:
/// `vocab + 1` rounded up to a multiple of 4 (the padding counts stay 0, so its offsets are
/// the total).
pub fn count_slots(vocab: u64) -> u64 {
    (vocab + 1).next_multiple_of(4)
}

/// Entries of the `counts` scratch array: `count_slots(vocab)` counts, then one total per
/// block of `SCAN_BLOCK` of them.
pub fn counts_len(vocab: u64) -> u64 {
    let slots = count_slots(vocab);
    slots + slots.div_ceil(SCAN_BLOCK)
}

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
    /// `Sum`: vector slots of a row each invocation accumulates per walk of a list, 1 to
    /// `EMBEDDING_SUM_SLOTS` (as many as the row needs); 1 for the other stages.
    pub slots: u8,
    /// `Sum`: `None` writes every row of a new `dtable` in `storage` (zeros where no id is);
    /// `Some(s)` adds the sums into an existing `dtable` of storage `s` in place, touching
    /// only the rows some id uses.
    pub into: Option<Storage>,
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
    /// (`counts_len(vocab)`,) u32 scratch: counts, then cursors, then the blocks' totals.
    pub counts: u64,
    /// (`count_slots(vocab)`,) u32: start of each vocabulary row's list (vocab + 1 entries,
    /// then padding).
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
        let slots = match stage {
            EmbeddingStage::Sum => {
                let per_row = (dim / usize::from(lanes)).max(1);
                per_row
                    .div_ceil(EMBEDDING_SUM_WORKGROUP as usize)
                    .min(usize::from(EMBEDDING_SUM_SLOTS)) as u8
            }
            _ => 1,
        };
        EmbeddingKernel {
            stage,
            storage,
            lanes,
            slots,
            into: None,
            binding,
        }
    }

    /// `Sum` that adds `dout`'s rows (in `storage`) into a table of storage `table` in place.
    pub fn sum_into(storage: Storage, table: Storage, dim: usize, binding: Binding) -> Self {
        EmbeddingKernel {
            into: Some(table),
            ..Self::new(EmbeddingStage::Sum, storage, dim, binding)
        }
    }

    /// Every embedding kernel for `binding`, for validation and warm-up.
    pub fn all(binding: Binding) -> Vec<EmbeddingKernel> {
        let mut out = Vec::new();
        for s in Storage::ALL {
            for dim in [4, 3] {
                out.push(Self::new(EmbeddingStage::Forward, s, dim, binding));
            }
            // One to four slots per walk.
            for dim in [4, 3, 512, 768, 1024] {
                out.push(Self::new(EmbeddingStage::Sum, s, dim, binding));
            }
            for table in Storage::ALL {
                for dim in [4, 3, 768] {
                    out.push(Self::sum_into(s, table, dim, binding));
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
            EmbeddingStage::Sum => {
                let into = match self.into {
                    Some(t) => format!("_into_{}", t.name()),
                    None => String::new(),
                };
                let (s, slots) = (self.storage.name(), self.slots);
                format!("emb_bwd_sum_{s}{into}{v}_s{slots}")
            }
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
                let len = k.param("len", Ty::scalar(u));
                k.begin();
                let len = k.load_param(len);
                let i = global_index(&mut k);
                let inside = k.lt(i, len);
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
                for_valid_id(&mut k, ids, n, vocab, |k, _, id, vocab| {
                    let one = k.u32(1);
                    k.atomic_add(counts, id, one);
                    let slots = padded_slots(k, vocab);
                    let shift = k.u32(SCAN_BLOCK.trailing_zeros());
                    let block = k.shr(id, shift);
                    let total = k.add(slots, block);
                    k.atomic_add(counts, total, one);
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
                for_valid_id(&mut k, ids, n, vocab, |k, i, id, _| {
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
                for_valid_id(&mut k, ids, n, vocab, |k, i, id, _| {
                    let start = k.load(offsets, id, 1);
                    let one = k.u32(1);
                    let next = k.add(id, one);
                    let end = k.load(offsets, next, 1);
                    let zero = k.u32(0);
                    let rank = k.var_init(zero);
                    // The list holds i, so it is not empty: `end - 1` is inside it.
                    let last = k.sub(end, one);
                    let step = k.u32(RANK_UNROLL);
                    k.for_range(start, end, step, |k, j| {
                        let loaded: Vec<(Val, Val)> = (0..RANK_UNROLL)
                            .map(|u| {
                                let ju = offset(k, j, u);
                                let inside = k.lt(ju, end);
                                let at = k.min(ju, last);
                                (inside, k.load(pos, at, 1))
                            })
                            .collect();
                        for (inside, q) in loaded {
                            let before = k.lt(q, i);
                            let earlier = k.and(inside, before);
                            let (one, zero) = (k.u32(1), k.u32(0));
                            let inc = k.select(earlier, one, zero);
                            let r = k.get(rank);
                            let r = k.add(r, inc);
                            k.set(rank, r);
                        }
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

    /// Positions of a list `Sum` takes per step: their rows' loads are all issued before the
    /// first addition (fewer for f32 rows, which take twice the registers).
    fn sum_positions(&self) -> u32 {
        match self.storage {
            Storage::F32 => 4,
            Storage::F16 | Storage::BF16 => 8,
        }
    }

    fn build_sum(&self, k: &mut KernelBuilder) {
        let (s, lanes, slots) = (self.storage, self.lanes, u32::from(self.slots));
        let positions = self.sum_positions();
        let elem = buffer_scalar(s);
        let (ts, access) = match self.into {
            Some(t) => (t, Access::ReadWrite),
            None => (s, Access::Write),
        };
        let offsets = k.buffer("offsets", Scalar::U32, Access::Read);
        let sorted = k.buffer("sorted", Scalar::U32, Access::Read);
        let dout = k.buffer("dout", elem, Access::Read);
        let dtable = k.buffer("dtable", buffer_scalar(ts), access);
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
            // Adding into a table, a row no id uses stays as it is.
            let nonempty = k.lt(start, end);
            let work = match self.into {
                Some(_) => nonempty,
                None => k.bool(true),
            };
            k.if_(work, |k| {
                let lid = k.local_index();
                let wg = k.workgroup_size_x();
                let row = k.mul(v, dl);
                let last_slot = k.sub(dl, one);
                let slots_v = k.u32(slots);
                let per_walk = k.mul(wg, slots_v);
                let fty = Ty::vector(Scalar::F32, lanes);
                // One walk of the list per `slots` slots of each invocation (one walk for rows up
                // to 4 × 64 vectors wide).
                k.for_range(lid, dl, per_walk, |k, c0| {
                    // Slot t is c0 + t·wg; past the row's end it reads the last slot and is not
                    // stored.
                    let cols: Vec<(Val, Val)> = (0..slots)
                        .map(|t| {
                            let t = k.u32(t);
                            let step = k.mul(wg, t);
                            let c = k.add(c0, step);
                            let stored = k.lt(c, dl);
                            (c, stored)
                        })
                        .collect();
                    let clamped: Vec<Val> =
                        cols.iter().map(|&(c, _)| k.min(c, last_slot)).collect();
                    // From 0, or from the table's row when adding into it.
                    let accs: Vec<_> = clamped
                        .iter()
                        .map(|&c| {
                            let first = match self.into {
                                Some(t) => {
                                    let at = k.add(row, c);
                                    load_f32(k, dtable, at, lanes, t)
                                }
                                None => k.const_float(fty, 0.0),
                            };
                            k.var_init(first)
                        })
                        .collect();
                    let step = k.u32(positions);
                    k.if_(nonempty, |k| {
                        let last = k.sub(end, one);
                        // The positions of a step, loaded one step ahead: a step then waits
                        // for its rows' loads only, not for the indices before them.
                        let index = |k: &mut KernelBuilder, j: Val, u: u32| -> Val {
                            let ju = offset(k, j, u);
                            let ju = k.min(ju, last);
                            k.load(sorted, ju, 1)
                        };
                        let next: Vec<_> = (0..positions)
                            .map(|u| {
                                let p = index(k, start, u);
                                k.var_init(p)
                            })
                            .collect();
                        k.for_range(start, end, step, |k, j| {
                            let ps: Vec<Val> = next.iter().map(|&p| k.get(p)).collect();
                            let rows: Vec<Vec<Val>> = ps
                                .iter()
                                .map(|&p| {
                                    let prow = k.mul(p, dl);
                                    clamped
                                        .iter()
                                        .map(|&c| {
                                            let src = k.add(prow, c);
                                            load_f32(k, dout, src, lanes, s)
                                        })
                                        .collect()
                                })
                                .collect();
                            let ahead = k.add(j, step);
                            for (u, &p) in (0..positions).zip(&next) {
                                let q = index(k, ahead, u);
                                k.set(p, q);
                            }
                            // In increasing position order: the same additions in the same
                            // order every run, and as one position at a time would make them.
                            for (u, xs) in (0..positions).zip(&rows) {
                                let ju = offset(k, j, u);
                                let inside = k.lt(ju, end);
                                for (&acc, &x) in accs.iter().zip(xs) {
                                    let a = k.get(acc);
                                    let sum = k.add(a, x);
                                    let a = k.select(inside, sum, a);
                                    k.set(acc, a);
                                }
                            }
                        });
                    });
                    for (&(c, stored), &acc) in cols.iter().zip(&accs) {
                        k.if_(stored, |k| {
                            let a = k.get(acc);
                            let at = k.add(row, c);
                            store_f32(k, dtable, at, a, ts);
                        });
                    }
                });
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
        let padded: [u32; 1];
        let (params, invocations): (&[u32], u64) = match self.stage {
            EmbeddingStage::Forward => (&[a.n, a.dim, a.vocab], u64::from(a.n) * per_row),
            EmbeddingStage::Zero => {
                padded = [counts_len(u64::from(a.vocab)) as u32];
                (&padded, u64::from(padded[0]))
            }
            EmbeddingStage::Count | EmbeddingStage::Place | EmbeddingStage::Rank => {
                (&[a.n, a.vocab], u64::from(a.n))
            }
            EmbeddingStage::Scan => (
                &[a.vocab],
                count_slots(u64::from(a.vocab)).div_ceil(SCAN_BLOCK) * wg,
            ),
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

/// `j + u`.
fn offset(k: &mut KernelBuilder, j: Val, u: u32) -> Val {
    if u == 0 {
        return j;
    }
    let u = k.u32(u);
    k.add(j, u)
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

/// Runs `f(k, i, id, vocab)` in invocation i < n when `ids[i] < vocab`.
fn for_valid_id(
    k: &mut KernelBuilder,
    ids: helios_spirv::Buffer,
    n: helios_spirv::Param,
    vocab: helios_spirv::Param,
    f: impl FnOnce(&mut KernelBuilder, Val, Val, Val),
) {
    let (n, vocab) = (k.load_param(n), k.load_param(vocab));
    let i = global_index(k);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let id = k.load(ids, i, 1);
        let valid = k.lt(id, vocab);
        k.if_(valid, |k| f(k, i, id, vocab));
    });
}

/// `count_slots(vocab)` on the device: (vocab + 4) rounded down to a multiple of 4.
fn padded_slots(k: &mut KernelBuilder, vocab: Val) -> Val {
    let four = k.u32(4);
    let v4 = k.add(vocab, four);
    let mask = k.u32(!3);
    k.and(v4, mask)
}

/// Workgroup b: `offsets[v] = Σ_{u<v} counts[u]` for the `SCAN_BLOCK` counts of block b
/// (v up to `count_slots(vocab)`), and those counts reset to 0. The block starts from the
/// sum of the totals `Count` kept for the blocks before it; invocation t owns four counts,
/// and the invocations' totals are scanned in shared memory (Hillis–Steele, integers: exact
/// in any order).
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
    let block = linear_workgroup(k);
    let zero = k.u32(0);
    let slots = padded_slots(k, vocab);
    let two = k.u32(2);
    let vectors = k.shr(slots, two);
    // The totals of the blocks before this one, summed by the whole workgroup (the last of
    // an inclusive scan).
    let before = k.var_init(zero);
    k.for_range(lid, block, wg, |k, c| {
        let at = k.add(slots, c);
        let t = k.load(counts, at, 1);
        let b = k.get(before);
        let b = k.add(b, t);
        k.set(before, b);
    });
    let b = k.get(before);
    let one = k.u32(1);
    let wm1 = k.sub(wg, one);
    inclusive_scan(k, sums, lid, wg, b);
    let start = k.shared_load(sums, wm1);
    k.workgroup_barrier();
    // This invocation's four counts.
    let base = k.mul(block, wg);
    let v = k.add(base, lid);
    let inside = k.lt(v, vectors);
    let ty = Ty::vector(Scalar::U32, 4);
    let c = k.if_value(
        inside,
        ty,
        |k| k.load(counts, v, 4),
        |k| k.constant_bits(ty, 0),
    );
    let (x, y, z, w) = (
        k.extract(c, 0),
        k.extract(c, 1),
        k.extract(c, 2),
        k.extract(c, 3),
    );
    let xy = k.add(x, y);
    let zw = k.add(z, w);
    let mine = k.add(xy, zw);
    let incl = inclusive_scan(k, sums, lid, wg, mine);
    let r = k.sub(incl, mine);
    let r = k.add(r, start);
    k.if_(inside, |k| {
        let rx = k.add(r, x);
        let rxy = k.add(rx, y);
        let rxyz = k.add(rxy, z);
        let o = k.vector(&[r, rx, rxy, rxyz]);
        k.store(offsets, v, o);
        let zeros = k.splat(zero, 4);
        k.store(counts, v, zeros);
    });
}

/// The inclusive prefix sum of `value` over the workgroup's invocations, through `sums`
/// (one u32 per invocation), which holds every invocation's result afterwards.
fn inclusive_scan(
    k: &mut KernelBuilder,
    sums: helios_spirv::Shared,
    lid: Val,
    wg: Val,
    value: Val,
) -> Val {
    let zero = k.u32(0);
    let one = k.u32(1);
    k.shared_store(sums, lid, value);
    k.workgroup_barrier();
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
    let r = k.shared_load(sums, lid);
    k.workgroup_barrier();
    r
}
