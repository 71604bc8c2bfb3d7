//! The portable attention kernels: f32 math on any Vulkan device (lavapipe included), f32,
//! f16 or bf16 storage.
//!
//! The one decision a reader must know: every product is a register-tiled SIMT matrix
//! product on tiles staged in shared memory, as a SIMT GEMM does it. A workgroup owns a
//! block of rows (query rows for Forward and Dq, key rows for DkDv) and has
//! [`SIMT_COLS`] × R invocations, R = owned rows / [`SIMT_ROWS`]. Invocation (r, c) owns
//! rows r, r + R, r + 2R, r + 3R and, of a score tile, columns c, c + 8, c + 16, ...; of a
//! D-wide accumulator, the vec4 chunks c, c + 8, ... Per vec4 of the reduced dimension it
//! loads 4 + m vec4s from shared memory for 16·m fused multiply-adds (m = its score
//! columns or chunks).
//!
//! What bounds them on an H100 is latency, not shared-memory bandwidth: 8 rows per
//! invocation (half the loads per multiply-add, half the invocations) measured slower
//! (bench/results/source-comment-history.md). The tiles are as large as 48 KiB (the Vulkan
//! limit on NVIDIA) allows at 128 invocations. Loops stay loops: unrolling the products
//! measured no faster, and both it and prefetching the next block into registers made
//! lavapipe's compiler take minutes per kernel.
//!
//! - Score tiles (S, dP) live in registers; the row maximum of the forward's online softmax
//!   is reduced through a small shared array (no subgroup operations, so the kernels run
//!   wherever Vulkan does). P and dS go to shared memory as the next product's left operand.
//! - Scores are kept in base 2 (Q or K is staged times scale·log2 e), so every exponential
//!   is one `exp2`; L is stored in natural-log units as the cooperative kernels do.
//! - Staged rows are padded to an odd number of vec4s, so the eight rows one load
//!   instruction touches fall on distinct banks; a D-row also holds every chunk an
//!   invocation may read (head dims whose D/4 is not a multiple of 8 read padding into
//!   accumulators that are never stored), so the inner loops carry no bounds checks.
//! - Masks (causal, key padding, rows past T) are applied only on the blocks that need them.
//!
//! This file holds the tiles and the per-stage context ([`Ctx`]); the stage kernels are in
//! `fwd` and `bwd`.

pub(crate) mod bwd;
pub(crate) mod fwd;

use helios_spirv::{KernelBuilder, Scalar, Shared, SharedLen, Ty, Val, Var};

use super::params::{keep, Params, TileRows, View};
use super::signature::{AttentionKernel, AttnStage, SIMT_COLS, SIMT_ROWS};
use crate::storage::{load_f32, store_f32, Storage};

/// vec4s per staged D-row: every chunk any invocation reads, rounded up to odd.
pub(crate) fn head_stride(head_dim: u32) -> u32 {
    (head_dim / 4).div_ceil(SIMT_COLS) * SIMT_COLS + 1
}

/// vec4s per row of a score tile of `cols` columns (odd for the same reason).
pub(crate) fn score_stride(cols: u32) -> u32 {
    cols / 4 + 1
}

/// Shared bytes of a SIMT kernel.
pub(crate) fn shared_bytes(kern: &AttentionKernel) -> u32 {
    let (bq, bk) = kern.variant.blocks();
    let row = head_stride(kern.head_dim) * 16;
    let score = |rows: u32, cols: u32| rows * score_stride(cols) * 16;
    match kern.stage {
        AttnStage::Forward => (bq + 2 * bk) * row + score(bq, bk) + bq * SIMT_COLS * 4,
        AttnStage::Prep => 0,
        AttnStage::DkDv => (2 * bq + 2 * bk) * row + 2 * score(bk, bq) + 2 * bq * 4,
        AttnStage::Dq => (2 * bq + 2 * bk) * row + score(bq, bk),
    }
}

pub(crate) fn v4() -> Ty {
    Ty::vector(Scalar::F32, 4)
}

/// A tile staged in shared memory as rows of `stride` vec4s.
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub(crate) arr: Shared,
    pub(crate) stride: u32,
}

/// What every SIMT stage knows once its parameters are loaded.
pub(crate) struct Ctx {
    pub(crate) p: Params,
    pub(crate) storage: Storage,
    pub(crate) causal: bool,
    pub(crate) bq: u32,
    pub(crate) bk: u32,
    pub(crate) head_dim: u32,
    pub(crate) wg: u32,
    pub(crate) tid: Val,
    /// This invocation's column index (0..SIMT_COLS).
    pub(crate) tc: Val,
    /// The owned rows of the workgroup's block, local indices.
    pub(crate) rows: Vec<Val>,
    /// vec4 chunks of D per invocation (the last may lie past D for some invocations).
    pub(crate) chunks: u32,
}

impl Ctx {
    pub(crate) fn new(kern: &AttentionKernel) -> (KernelBuilder, Ctx) {
        let wg = kern.workgroup();
        let mut k = KernelBuilder::new(kern.name(), kern.binding, [wg, 1, 1]);
        let p = kern.declare(&mut k, false);
        let (bq, bk) = kern.variant.blocks();
        let (owned, other) = if kern.stage == AttnStage::DkDv {
            (bk, bq)
        } else {
            (bq, bk)
        };
        assert!(
            owned % SIMT_ROWS == 0 && other % SIMT_COLS == 0,
            "SIMT blocks of {owned}x{other}"
        );
        let tid = k.local_index();
        let cols = k.u32(SIMT_COLS);
        let tr = k.div(tid, cols);
        let tc = k.rem(tid, cols);
        let stride = owned / SIMT_ROWS;
        let rows = (0..SIMT_ROWS)
            .map(|i| {
                let o = k.u32(i * stride);
                k.add(tr, o)
            })
            .collect();
        let c = Ctx {
            p,
            storage: kern.storage,
            causal: kern.causal,
            bq,
            bk,
            head_dim: kern.head_dim,
            wg,
            tid,
            tc,
            rows,
            chunks: (kern.head_dim / 4).div_ceil(SIMT_COLS),
        };
        (k, c)
    }

    /// A staged tile of `rows` D-rows.
    pub(crate) fn head_tile(&self, k: &mut KernelBuilder, rows: u32) -> Tile {
        let stride = head_stride(self.head_dim);
        let arr = k.shared_array(v4(), SharedLen::Fixed(rows * stride));
        Tile { arr, stride }
    }

    /// A score tile of `rows` × `cols`.
    pub(crate) fn score_tile(&self, k: &mut KernelBuilder, rows: u32, cols: u32) -> Tile {
        let stride = score_stride(cols);
        let arr = k.shared_array(v4(), SharedLen::Fixed(rows * stride));
        Tile { arr, stride }
    }

    /// The `n` score columns this invocation owns: tc, tc + 8, ...
    pub(crate) fn cols(&self, k: &mut KernelBuilder, n: u32) -> Vec<Val> {
        (0..n / SIMT_COLS)
            .map(|j| {
                let o = k.u32(j * SIMT_COLS);
                k.add(self.tc, o)
            })
            .collect()
    }

    /// Stages rows t0..t0+count of `view` (zeros at t >= tend) into `dst`, times `mul`:
    /// vec4 loads where the view's offset and strides allow them (the fused QKV layout
    /// does), else one element at a time.
    pub(crate) fn load_tile(
        &self,
        k: &mut KernelBuilder,
        view: View,
        rows: &TileRows,
        dst: Tile,
        mul: Option<Val>,
    ) {
        let aligned = view.vec4_aligned(k);
        k.if_else(
            aligned,
            |k| self.load_tile_with(k, view, rows, dst, mul, 4),
            |k| self.load_tile_with(k, view, rows, dst, mul, 1),
        );
    }

    pub(crate) fn load_tile_with(
        &self,
        k: &mut KernelBuilder,
        view: View,
        rows: &TileRows,
        dst: Tile,
        mul: Option<Val>,
        lanes: u8,
    ) {
        let TileRows {
            b,
            h,
            t0,
            tend,
            count: rows,
        } = *rows;
        let per_row = self.head_dim / u32::from(lanes);
        let s = self.storage;
        let end = k.u32(rows * per_row);
        let step = k.u32(self.wg);
        k.for_range(self.tid, end, step, |k, idx| {
            let pr = k.u32(per_row);
            let row = k.div(idx, pr);
            let col = k.rem(idx, pr);
            let t = k.add(t0, row);
            let ok = k.lt(t, tend);
            let zero_u = k.u32(0);
            let tc = k.select(ok, t, zero_u);
            let at = view.row(k, b, tc, h);
            let at = if lanes == 4 {
                let four = k.u32(4);
                k.div(at, four)
            } else {
                at
            };
            let at = k.add(at, col);
            let x = load_f32(k, view.buf, at, lanes, s);
            let zero = k.const_float(x.ty, 0.0);
            let x = k.select(ok, x, zero);
            let x = match mul {
                Some(m) if lanes == 4 => {
                    let m = k.splat(m, 4);
                    k.mul(x, m)
                }
                Some(m) => k.mul(x, m),
                None => x,
            };
            let stride = k.u32(dst.stride);
            let slot = k.mul(row, stride);
            if lanes == 4 {
                let slot = k.add(slot, col);
                k.shared_store(dst.arr, slot, x);
            } else {
                let four = k.u32(4);
                let q = k.div(col, four);
                let slot = k.add(slot, q);
                let lane = k.rem(col, four);
                k.shared_store_lane(dst.arr, slot, lane, x);
            }
        });
    }

    /// For each pair (A, B) of staged D-row tiles: the owned-rows × `cols` products
    /// A[row]·B[col] over D, out[pair][i][j] for rows[i] and cols[j]. A loop over D's
    /// vec4s, not unrolled: unrolling measured no faster on an H100, and lavapipe's
    /// compiler takes minutes over the unrolled kernels.
    pub(crate) fn dots(
        &self,
        k: &mut KernelBuilder,
        pairs: &[(Tile, Tile)],
        cols: &[Val],
    ) -> Vec<Vec<Vec<Val>>> {
        let accs: Vec<Vec<Vec<Var>>> = pairs
            .iter()
            .map(|_| {
                self.rows
                    .iter()
                    .map(|_| {
                        cols.iter()
                            .map(|_| {
                                let z = k.const_f32(0.0);
                                k.var_init(z)
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let base = |k: &mut KernelBuilder, t: Tile, r: Val| {
            let s = k.u32(t.stride);
            k.mul(r, s)
        };
        let a_base: Vec<Vec<Val>> = pairs
            .iter()
            .map(|&(a, _)| self.rows.iter().map(|&r| base(k, a, r)).collect())
            .collect();
        let b_base: Vec<Vec<Val>> = pairs
            .iter()
            .map(|&(_, b)| cols.iter().map(|&c| base(k, b, c)).collect())
            .collect();
        let zero = k.u32(0);
        let one = k.u32(1);
        let dv = k.u32(self.head_dim / 4);
        k.for_range(zero, dv, one, |k, v| {
            for (x, &(a, b)) in pairs.iter().enumerate() {
                let lanes = |k: &mut KernelBuilder, t: Tile, at: Val| {
                    let at = k.add(at, v);
                    let x = k.shared_load(t.arr, at);
                    (0..4).map(|l| k.extract(x, l)).collect::<Vec<Val>>()
                };
                let av: Vec<Vec<Val>> = a_base[x].iter().map(|&at| lanes(k, a, at)).collect();
                let bv: Vec<Vec<Val>> = b_base[x].iter().map(|&at| lanes(k, b, at)).collect();
                for (i, ai) in av.iter().enumerate() {
                    for (j, bj) in bv.iter().enumerate() {
                        let mut acc = k.get(accs[x][i][j]);
                        for l in 0..4 {
                            acc = k.fma(ai[l], bj[l], acc);
                        }
                        k.set(accs[x][i][j], acc);
                    }
                }
            }
        });
        accs.iter()
            .map(|p| {
                p.iter()
                    .map(|row| row.iter().map(|&v| k.get(v)).collect())
                    .collect()
            })
            .collect()
    }

    /// Zeroed D-wide accumulators: [owned row][chunk] vec4s.
    pub(crate) fn zero_accs(&self, k: &mut KernelBuilder) -> Vec<Vec<Var>> {
        self.rows
            .iter()
            .map(|_| {
                (0..self.chunks)
                    .map(|_| {
                        let z = k.const_float(v4(), 0.0);
                        k.var_init(z)
                    })
                    .collect()
            })
            .collect()
    }

    /// For each (acc, scores, B): acc[i] += Σ_x scores[rows[i]][x] · B[x] over the `n`
    /// columns of the score tile (= staged rows of B), on the owned chunks of D.
    pub(crate) fn axpy(&self, k: &mut KernelBuilder, terms: &[(&[Vec<Var>], Tile, Tile)], n: u32) {
        let s_base: Vec<Vec<Val>> = terms
            .iter()
            .map(|&(_, s, _)| {
                self.rows
                    .iter()
                    .map(|&r| {
                        let st = k.u32(s.stride);
                        k.mul(r, st)
                    })
                    .collect()
            })
            .collect();
        let zero = k.u32(0);
        let one = k.u32(1);
        let n4 = k.u32(n / 4);
        k.for_range(zero, n4, one, |k, x4| {
            for (t, &(acc, s, b)) in terms.iter().enumerate() {
                let sv: Vec<Val> = s_base[t]
                    .iter()
                    .map(|&at| {
                        let at = k.add(at, x4);
                        k.shared_load(s.arr, at)
                    })
                    .collect();
                let four = k.u32(4);
                let x0 = k.mul(x4, four);
                for l in 0..4u32 {
                    let lc = k.u32(l);
                    let x = k.add(x0, lc);
                    let st = k.u32(b.stride);
                    let row = k.mul(x, st);
                    let row = k.add(row, self.tc);
                    let bv: Vec<Val> = (0..self.chunks)
                        .map(|c| {
                            let o = k.u32(c * SIMT_COLS);
                            let at = k.add(row, o);
                            k.shared_load(b.arr, at)
                        })
                        .collect();
                    for (i, &w) in sv.iter().enumerate() {
                        let w = k.extract(w, l);
                        let w = k.splat(w, 4);
                        for (c, &bc) in bv.iter().enumerate() {
                            let cur = k.get(acc[i][c]);
                            let nv = k.fma(w, bc, cur);
                            k.set(acc[i][c], nv);
                        }
                    }
                }
            }
        });
    }

    /// Writes score values[i][j] at (rows[i], cols[j]) of `tile`.
    pub(crate) fn store_scores(
        &self,
        k: &mut KernelBuilder,
        tile: Tile,
        cols: &[Val],
        values: &[Vec<Val>],
    ) {
        let four = k.u32(4);
        let st = k.u32(tile.stride);
        for (i, &r) in self.rows.iter().enumerate() {
            let base = k.mul(r, st);
            for (j, &c) in cols.iter().enumerate() {
                let q = k.div(c, four);
                let at = k.add(base, q);
                let lane = k.rem(c, four);
                k.shared_store_lane(tile.arr, at, lane, values[i][j]);
            }
        }
    }

    /// Stores owned row i's accumulator, times `mul[i]`, as dense row (b, t0 + rows[i], h)
    /// of `buf`, for rows inside T and chunks inside D.
    pub(crate) fn store_rows(
        &self,
        k: &mut KernelBuilder,
        out: View,
        acc: &[Vec<Var>],
        (b, h): (Val, Val),
        t0: Val,
        mul: &[Val],
    ) {
        let dv = self.head_dim / 4;
        for (i, &r) in self.rows.iter().enumerate() {
            let t = k.add(t0, r);
            let inside = k.lt(t, self.p.t);
            k.if_(inside, |k| {
                let base = out.row(k, b, t, h);
                let four = k.u32(4);
                let base = k.div(base, four);
                let m = k.splat(mul[i], 4);
                for (c, &a) in acc[i].iter().enumerate() {
                    let o = k.u32(c as u32 * SIMT_COLS);
                    let chunk = k.add(self.tc, o);
                    let at = k.add(base, chunk);
                    let x = k.get(a);
                    let x = k.mul(x, m);
                    if (c as u32 + 1) * SIMT_COLS > dv {
                        let dvc = k.u32(dv);
                        let inside = k.lt(chunk, dvc);
                        k.if_(inside, |k| store_f32(k, out.buf, at, x, self.storage));
                    } else {
                        store_f32(k, out.buf, at, x, self.storage);
                    }
                }
            });
        }
    }

    /// The loop over key blocks 0..nkb of Forward and Dq: block kb's keys and values staged
    /// in `sk` and `sv` between two barriers, then `body(k, k0)`.
    pub(crate) fn over_key_blocks(
        &self,
        k: &mut KernelBuilder,
        (b, h): (Val, Val),
        nkb: Val,
        kend: Val,
        (sk, sv): (Tile, Tile),
        body: impl FnOnce(&mut KernelBuilder, Val),
    ) {
        let (kv, vv) = (self.p.views[1], self.p.views[2]);
        let bk = self.bk;
        let (z, one) = (k.u32(0), k.u32(1));
        k.for_range(z, nkb, one, |k, kb| {
            let bkc = k.u32(bk);
            let k0 = k.mul(kb, bkc);
            k.workgroup_barrier();
            let keys = TileRows {
                b,
                h,
                t0: k0,
                tend: kend,
                count: bk,
            };
            self.load_tile(k, kv, &keys, sk, None);
            self.load_tile(k, vv, &keys, sv, None);
            k.workgroup_barrier();
            body(k, k0);
        });
    }

    /// Whether the block of queries q0.. (bq of them) and keys k0.. (bk) holds a pair the
    /// mask drops: a key at or past `kend`, or (causal) a key after a query.
    pub(crate) fn needs_mask(&self, k: &mut KernelBuilder, q0: Val, k0: Val, kend: Val) -> Val {
        let bk = k.u32(self.bk);
        let kl = k.add(k0, bk);
        let past = k.gt(kl, kend);
        if !self.causal {
            return past;
        }
        // The block's last key lies after its first query.
        let one = k.u32(1);
        let last = k.sub(kl, one);
        let after = k.gt(last, q0);
        k.or(past, after)
    }

    /// Each matrix's [i][j], or `fill` where (query, key) of (rows[i], cols[j]) is dropped:
    /// only computed when `need` holds, the mask once for all the matrices.
    pub(crate) fn mask(
        &self,
        k: &mut KernelBuilder,
        matrices: Vec<Vec<Vec<Val>>>,
        need: Val,
        query_key: &dyn Fn(&mut KernelBuilder, usize, usize) -> (Val, Val),
        kend: Val,
        fill: f32,
    ) -> Vec<Vec<Vec<Val>>> {
        let vars: Vec<Vec<Vec<Var>>> = matrices
            .iter()
            .map(|m| {
                m.iter()
                    .map(|r| r.iter().map(|&v| k.var_init(v)).collect())
                    .collect()
            })
            .collect();
        k.if_(need, |k| {
            let f = k.const_f32(fill);
            for i in 0..self.rows.len() {
                for j in 0..vars[0][i].len() {
                    let (q, key) = query_key(k, i, j);
                    let kp = keep(k, self.causal, q, key, kend);
                    for m in &vars {
                        let x = k.get(m[i][j]);
                        let x = k.select(kp, x, f);
                        k.set(m[i][j], x);
                    }
                }
            }
        });
        vars.iter()
            .map(|m| {
                m.iter()
                    .map(|r| r.iter().map(|&v| k.get(v)).collect())
                    .collect()
            })
            .collect()
    }
}

/// `m == -inf ? 0 : m`: the shift that keeps a row with no key yet finite.
pub(crate) fn safe_max(k: &mut KernelBuilder, m: Val) -> Val {
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let zero = k.const_f32(0.0);
    let none = k.eq(m, ninf);
    k.select(none, zero, m)
}

/// scale · log2 e: scores times this are in base 2.
pub(crate) fn base2_scale(k: &mut KernelBuilder, c: &Ctx) -> Val {
    let l = k.const_f32(std::f32::consts::LOG2_E);
    k.mul(c.p.scale, l)
}
