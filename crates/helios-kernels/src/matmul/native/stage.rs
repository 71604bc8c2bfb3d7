//! The operands' stages in shared memory: the layouts the copy engine writes and `wgmma`
//! reads.

use helios_ptx::{MatrixDesc, Swizzle};

/// Byte layout of one operand's stage (`rows` × `bk`) in shared memory.
///
/// - K-major (A not transposed, B transposed): rows of `bk` k (32 or 64 bytes) with the 32-
///   or 64-byte swizzle (16-byte chunks XORed with the row's bits above the atom's row
///   width), 8-row groups `8 · row bytes` apart (SBO). (The no-swizzle layout of 8 × 16-byte
///   core matrices was 12% slower on a product of two K-major operands.) One copy box of
///   `bk × rows` writes it.
/// - M/N-major: the 128-byte swizzle, atoms of 64 rows (128 bytes) × 8 k whose 16-byte
///   chunks are XORed with the k row; atoms along K 1 KiB apart (SBO), along M/N `bk / 8`
///   KiB (LBO). A copy box of 64 rows × `bk` writes a column of atoms.
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
}

/// Whether an operand of `rows` rows stored this way has a stage layout the copy engine
/// fills: M/N-major rows come in whole 64-row swizzle atoms, K-major rows in 8-row groups
/// of one copy box (at most 256 rows).
pub(super) const fn loadable(rows: u32, k_major: bool) -> bool {
    if k_major {
        rows % 8 == 0 && rows <= 256
    } else {
        rows % 64 == 0
    }
}
