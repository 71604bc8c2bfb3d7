//! The operands' stages in shared memory and the producer's share of filling them.

use helios_ptx::{Addr, Cmp, Kernel, MatrixDesc, Reg, Space, Swizzle, Ty};

use super::WG_THREADS;

/// Byte layout of one operand's stage (`rows` × `bk`) in shared memory.
///
/// - K-major (A not transposed, B transposed): rows of `bk` k (32 or 64 bytes) with the 32-
///   or 64-byte swizzle (16-byte chunks XORed with the row's bits above the atom's row
///   width), 8-row groups `8 · row bytes` apart (SBO). (The no-swizzle layout of 8 × 16-byte
///   core matrices was 12% slower on a product of two K-major operands.)
/// - M/N-major: the 128-byte swizzle, atoms of 64 rows (128 bytes) × 8 k whose 16-byte
///   chunks are XORed with the k row, so that a warp storing one k row's 512 bytes hits
///   every bank once; atoms along K 1 KiB apart (SBO), along M/N `bk / 8` KiB (LBO).
///
/// Either way a warpgroup's 64 rows of A start `bk · 128` bytes apart.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stage {
    /// Rows of the operand tile along M (A) or N (B).
    pub(super) rows: u32,
    pub(super) bk: u32,
    pub(super) k_major: bool,
}

impl Stage {
    pub(super) const fn bytes(self) -> u32 {
        self.rows * self.bk * 2
    }

    pub(super) const fn row_bytes(self) -> u32 {
        self.bk * 2
    }

    pub(super) fn desc(self) -> MatrixDesc {
        if self.k_major {
            MatrixDesc {
                swizzle: if self.bk == 16 {
                    Swizzle::B32
                } else {
                    Swizzle::B64
                },
                lbo: 16,
                sbo: 8 * self.row_bytes(),
            }
        } else {
            MatrixDesc {
                swizzle: Swizzle::B128,
                lbo: self.bk / 8 * 1024,
                sbo: 1024,
            }
        }
    }

    /// Where the k16 step `s` of the stage starts: 32 bytes along K-major rows, two 8-k
    /// atoms on in M/N-major ones.
    pub(super) const fn k_step(self, s: u32) -> u32 {
        if self.k_major {
            32 * s
        } else {
            2048 * s
        }
    }

    /// Where a warpgroup's 64 rows start.
    pub(super) const fn wg_offset(self) -> u32 {
        self.bk * 128
    }

    /// The row bits a K-major row's chunk index is XORed with: the swizzle's period is 128
    /// bytes of rows.
    pub(super) const fn flip_shift(self) -> u32 {
        if self.bk == 16 {
            2
        } else {
            1
        }
    }
}

/// Whether an operand of `rows` rows stored this way has a stage layout and a load plan:
/// M/N-major rows come in whole swizzle atoms, and a k row's 16-byte chunks divide the
/// producer's threads.
pub(super) const fn loadable(rows: u32, k_major: bool) -> bool {
    if k_major {
        rows % 16 == 0
    } else {
        rows == 128 || rows == 256
    }
}

/// One producer thread's share of an operand's stage: which 16-byte chunks it loads into
/// registers and where each goes in the stage. K-major: `bk / 8` threads a row, rows
/// `t / (bk/8) + i · rows_per_pass`; M/N-major: `rows / 8` threads a k row (contiguous along
/// M/N), k rows `t / (rows/8) + i · rows_per_pass`.
pub(super) struct Loader {
    stage: Stage,
    /// Chunks a thread loads per stage.
    pub(super) count: u32,
    /// Rows (K-major) or k rows (M/N-major) between a thread's chunks.
    rows_per_pass: u32,
    /// Address of this thread's first chunk at k = 0 (u64), the distance between its
    /// chunks (u64) and between k tiles (u64).
    src: Reg,
    chunk_step: Reg,
    tile_step: Reg,
    /// K-major: whether chunk i's row exists (pred); M/N-major: one entry, whether the
    /// thread's columns exist.
    row_ok: Vec<Reg>,
    /// K-major: the chunks' k within the tile; M/N-major: the first chunk's k row (u32).
    k_first: Reg,
    /// Byte offsets in the stage (u32): chunk i at `soff[i % soff.len()] + (i / soff.len())
    /// · soff_step`.
    soff: Vec<Reg>,
    soff_step: u32,
}

impl Loader {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        k: &mut Kernel,
        stage: Stage,
        ptr: Reg,
        ld: Reg,
        r0: Reg,
        rows_total: Reg,
        t: Reg,
    ) -> Loader {
        let (rows, bk) = (stage.rows, stage.bk);
        let ld_bytes = k.mul_wide(ld, 2u32);
        let tile_step = if stage.k_major {
            k.mov(Ty::U64, i64::from(bk * 2))
        } else {
            k.mul(ld_bytes, bk)
        };
        if stage.k_major {
            let per_row = bk / 8;
            let rows_per_pass = WG_THREADS / per_row;
            let count = rows / rows_per_pass;
            let row = k.div(t, per_row);
            let kc = k.rem(t, per_row);
            let k_first = k.mul(kc, 8u32);
            let grow = k.add(r0, row);
            let o = k.mul_wide(grow, ld);
            let kc64 = k.cvt(Ty::U64, k_first);
            let o = k.add(o, kc64);
            let o = k.shl(o, 1u32);
            let src = k.add(ptr, o);
            let chunk_step = k.mul(ld_bytes, rows_per_pass);
            let row_ok = (0..count)
                .map(|i| {
                    let r = k.add(grow, rows_per_pass * i);
                    k.setp(Cmp::Lt, r, rows_total)
                })
                .collect();
            // Row · row bytes + 16 · (kc ^ (row >> flip) % per_row): the swizzle, the same
            // for every chunk (rows_per_pass leaves those row bits alone).
            let flip = k.shr(row, stage.flip_shift());
            let flip = k.rem(flip, per_row);
            let c = k.xor(kc, flip).retype(Ty::U32);
            let s0 = k.mul(row, stage.row_bytes());
            let s0 = k.mad(c, 16u32, s0);
            Loader {
                stage,
                count,
                rows_per_pass,
                src,
                chunk_step,
                tile_step,
                row_ok,
                k_first,
                soff: vec![s0],
                soff_step: rows_per_pass * stage.row_bytes(),
            }
        } else {
            let per_row = rows / 8;
            let rows_per_pass = WG_THREADS / per_row;
            let count = bk / rows_per_pass;
            let mc = k.rem(t, per_row);
            let kr = k.div(t, per_row);
            let col = k.mad(mc, 8u32, r0);
            let o = k.mul_wide(kr, ld);
            let c64 = k.cvt(Ty::U64, col);
            let o = k.add(o, c64);
            let o = k.shl(o, 1u32);
            let src = k.add(ptr, o);
            let chunk_step = k.mul(ld_bytes, rows_per_pass);
            let ok = k.setp(Cmp::Lt, col, rows_total);
            // Chunk i's k row kr + i·rows_per_pass, swizzled: atom (mc / 8)·lbo + (k / 8)·1024
            // + (k % 8)·128 + ((mc % 8) ^ (k % 8))·16. The pattern repeats every 8 k rows.
            let patterns = (8 / rows_per_pass).clamp(1, count);
            let atom = k.shr(mc, 3u32);
            let a_off = k.mul(atom, stage.desc().lbo);
            let ch = k.and(mc, 7u32).retype(Ty::U32);
            let soff = (0..patterns)
                .map(|i| {
                    let kk = k.add(kr, i * rows_per_pass);
                    let g = k.shr(kk, 3u32);
                    let r = k.and(kk, 7u32).retype(Ty::U32);
                    let x = k.xor(ch, r).retype(Ty::U32);
                    let o = k.mad(g, 1024u32, a_off);
                    let o = k.mad(r, 128u32, o);
                    k.mad(x, 16u32, o)
                })
                .collect();
            Loader {
                stage,
                count,
                rows_per_pass,
                src,
                chunk_step,
                tile_step,
                row_ok: vec![ok],
                k_first: kr,
                soff,
                soff_step: patterns * rows_per_pass / 8 * 1024,
            }
        }
    }

    /// Registers for one stage's chunks.
    pub(super) fn buffer(&self, k: &mut Kernel) -> Vec<[Reg; 4]> {
        (0..self.count)
            .map(|_| [0; 4].map(|_| k.reg(Ty::B32)))
            .collect()
    }

    /// Loads this thread's chunks of k tile `tile` into `buf` (zeros where a chunk lies
    /// outside the matrix); `kmax` is K − bk·tile.
    pub(super) fn load(&self, k: &mut Kernel, buf: &[[Reg; 4]], tile: Reg, kmax: Reg) {
        let t64 = k.cvt(Ty::U64, tile);
        let off = k.mul(t64, self.tile_step);
        let mut at = k.add(self.src, off);
        for (i, regs) in buf.iter().enumerate() {
            let i = i as u32;
            let ok = if self.stage.k_major {
                let k_ok = k.setp(Cmp::Lt, self.k_first, kmax);
                k.and_pred(k_ok, self.row_ok[i as usize])
            } else {
                let kk = k.add(self.k_first, i * self.rows_per_pass);
                let k_ok = k.setp(Cmp::Lt, kk, kmax);
                k.and_pred(k_ok, self.row_ok[0])
            };
            for &r in regs {
                k.assign(r, 0u32);
            }
            k.ld_v_if(ok, Space::Global, regs, Addr::new(at));
            if i + 1 < self.count {
                at = k.add(at, self.chunk_step);
            }
        }
    }

    /// Stores `buf` into the stage at shared address `sbase`.
    pub(super) fn store(&self, k: &mut Kernel, buf: &[[Reg; 4]], sbase: Reg) {
        let n = self.soff.len();
        let bases: Vec<Reg> = self.soff.iter().map(|&o| k.add(sbase, o)).collect();
        for (i, regs) in buf.iter().enumerate() {
            let at = Addr::at(bases[i % n], i64::from((i / n) as u32 * self.soff_step));
            k.st_v(Space::Shared, at, regs, None);
        }
    }
}
