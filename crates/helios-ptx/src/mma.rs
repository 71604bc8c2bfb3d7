//! Matrix instructions: Ampere's `mma.sync` and Hopper's warpgroup `wgmma` with its
//! shared-memory matrix descriptors.
//!
//! A descriptor names a matrix in shared memory as core matrices (8 rows of 16 bytes) with
//! two strides: the *leading* byte offset (LBO) between core matrices adjacent along K and
//! the *stride* byte offset (SBO) between core matrices adjacent along M or N. That reading
//! is the one that matched on the H200 (`../shared/NVX.md`); the swapped one sums k < 8 only.

use crate::kernel::Kernel;
use crate::memory::vector_of;
use crate::types::{Reg, Ty};

/// Shared-memory swizzle of a `wgmma` operand (descriptor bits 62–63).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Swizzle {
    None,
    B32,
    B64,
    B128,
}

impl Swizzle {
    const fn bits(self) -> u64 {
        match self {
            Swizzle::None => 0,
            Swizzle::B128 => 1,
            Swizzle::B64 => 2,
            Swizzle::B32 => 3,
        }
    }

    /// Bytes of one swizzled row (the pattern's period), 16 without swizzle.
    pub const fn row_bytes(self) -> u32 {
        match self {
            Swizzle::None => 16,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }

    /// Where the 16-byte chunk `chunk` of row `row` of a swizzled atom lands, in 16-byte
    /// units from the atom's start (the atom is 8 rows of `row_bytes`): the chunk index is
    /// XORed with the bits of the row's 128-byte line (`Swizzle<b, 4, 3>`: for 32-byte rows
    /// row bit 2, for 64-byte rows bits 1-2), as the hardware reads it (checked on an H200
    /// by stores written this way, bench/results/2026-11-30-native-register-producer-h200.md).
    pub const fn chunk(self, row: u32, chunk: u32) -> u32 {
        let per_row = self.row_bytes() / 16;
        let mask = per_row - 1;
        let line = row * self.row_bytes() / 128;
        row * per_row + ((chunk ^ line) & mask) + (chunk & !mask)
    }
}

/// Where a thread's `wgmma` accumulators lie ([`Kernel::wgmma_thread`]): a warpgroup's
/// m64 tile gives each warp 16 rows; a thread holds rows `row` and `row + 8` of its warp's,
/// and in every 8 columns the two at `2 · pair`.
#[derive(Clone, Copy, Debug)]
pub struct AccThread {
    /// The thread's warpgroup in the block (u32).
    pub warpgroup: Reg,
    /// Its warp within the warpgroup, 0–3.
    pub warp: Reg,
    /// Lane / 4: its first row within the warp's 16.
    pub row: Reg,
    /// Lane % 4: its column pair within each 8.
    pub pair: Reg,
}

/// The constant part of a matrix descriptor: layout and strides. The start address is
/// added in the kernel ([`Kernel::wgmma_desc`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatrixDesc {
    pub swizzle: Swizzle,
    /// Leading byte offset: between core matrices adjacent along K (16-byte multiple).
    pub lbo: u32,
    /// Stride byte offset: between 8-row groups along M or N (16-byte multiple).
    pub sbo: u32,
}

impl MatrixDesc {
    /// The descriptor's bits other than the start address.
    pub const fn constant_bits(&self) -> u64 {
        let lbo = ((self.lbo as u64 >> 4) & 0x3FFF) << 16;
        let sbo = ((self.sbo as u64 >> 4) & 0x3FFF) << 32;
        lbo | sbo | (self.swizzle.bits() << 62)
    }

    /// The full descriptor of a matrix starting at shared address `addr`.
    pub const fn encode(&self, addr: u32) -> u64 {
        (((addr & 0x3FFFF) >> 4) as u64) | self.constant_bits()
    }
}

/// Input type of a matrix instruction (f32 accumulation in every form here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaInput {
    F16,
    BF16,
}

impl MmaInput {
    const fn name(self) -> &'static str {
        match self {
            MmaInput::F16 => "f16",
            MmaInput::BF16 => "bf16",
        }
    }
}

/// Where `wgmma`'s A operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgmmaA<'a> {
    /// A descriptor (u64) of A in shared memory; `transpose` when A is stored M-major.
    Shared { desc: Reg, transpose: bool },
    /// Four b32 registers per thread in the documented fragment order.
    Registers(&'a [Reg]),
}

impl Kernel {
    /// `mma.sync.aligned.m16n8k16.row.col.f32.<in>.<in>.f32`: `d = a·b + c` for one warp;
    /// `a` 4, `b` 2, `c` and the result 4 registers.
    pub fn mma_m16n8k16(&mut self, input: MmaInput, a: &[Reg], b: &[Reg], c: &[Reg]) -> Vec<Reg> {
        let d = self.regs(Ty::F32, 4);
        if !self.require(self.target.has_cp_async(), "mma.sync.m16n8k16") {
            return d;
        }
        if a.len() != 4 || b.len() != 2 || c.len() != 4 {
            self.fail("mma.m16n8k16 takes 4, 2 and 4 registers".into());
            return d;
        }
        let t = input.name();
        self.emit(format_args!(
            "mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {}, {}, {}, {}",
            vector_of(&d),
            vector_of(a),
            vector_of(b),
            vector_of(c)
        ));
        d
    }

    /// The descriptor of a matrix at shared address `addr` (u32) with layout `desc`.
    pub fn wgmma_desc(&mut self, addr: Reg, desc: &MatrixDesc) -> Reg {
        let masked = self.and(addr, 0x3FFFFu32);
        let units = self.shr(masked.retype(Ty::U32), 4u32);
        let wide = self.cvt(Ty::U64, units);
        let bits = desc.constant_bits() as i64;
        self.or(wide, bits).retype(Ty::U64)
    }

    /// The same descriptor `bytes` further on (a 16-byte multiple inside shared memory).
    pub fn desc_offset(&mut self, desc: Reg, bytes: u32) -> Reg {
        if bytes % 16 != 0 {
            self.fail(format!("descriptor offset {bytes} is not a multiple of 16"));
        }
        self.add(desc, i64::from(bytes >> 4))
    }

    /// Makes register and accumulator writes visible to the next `wgmma`.
    pub fn wgmma_fence(&mut self) {
        if self.require(self.target.has_wgmma(), "wgmma.fence") {
            self.emit(format_args!("wgmma.fence.sync.aligned"));
        }
    }

    pub fn wgmma_commit(&mut self) {
        if self.require(self.target.has_wgmma(), "wgmma.commit_group") {
            self.emit(format_args!("wgmma.commit_group.sync.aligned"));
        }
    }

    /// Thread `tid`'s place (`tid` a u32 index in a block of warpgroups) in the layout of
    /// `wgmma`'s f32 accumulators, which every consumer of them needs.
    pub fn wgmma_thread(&mut self, tid: Reg) -> AccThread {
        let warpgroup = self.shr(tid, 7u32);
        let warp = {
            let t = self.and(tid, 127u32).retype(Ty::U32);
            self.shr(t, 5u32)
        };
        let lane = self.and(tid, 31u32).retype(Ty::U32);
        let row = self.shr(lane, 2u32);
        let pair = self.and(lane, 3u32).retype(Ty::U32);
        AccThread {
            warpgroup,
            warp,
            row,
            pair,
        }
    }

    /// Waits until at most `pending` committed `wgmma` groups are in flight.
    pub fn wgmma_wait(&mut self, pending: u32) {
        if self.require(self.target.has_wgmma(), "wgmma.wait_group") {
            self.emit(format_args!("wgmma.wait_group.sync.aligned {pending}"));
        }
    }

    /// `wgmma.mma_async m64nNk16` with f32 accumulators `acc` (N/2 registers a thread, N a
    /// multiple of 8 up to 256), B a descriptor (`b_transpose`: B stored N-major), and
    /// `scale_d` a predicate: false zeroes the accumulators first.
    pub fn wgmma(
        &mut self,
        input: MmaInput,
        acc: &[Reg],
        a: WgmmaA<'_>,
        b_desc: Reg,
        b_transpose: bool,
        scale_d: Reg,
    ) {
        if !self.require(self.target.has_wgmma(), "wgmma.mma_async") {
            return;
        }
        let n = acc.len() * 2;
        if n == 0 || n % 8 != 0 || n > 256 {
            self.fail(format!("wgmma with {} accumulators (N = {n})", acc.len()));
            return;
        }
        let t = input.name();
        let tb = u32::from(b_transpose);
        let d = vector_of(acc);
        match a {
            WgmmaA::Shared { desc, transpose } => {
                let ta = u32::from(transpose);
                self.emit(format_args!(
                    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {d}, {desc}, {b_desc}, {scale_d}, 1, 1, {ta}, {tb}"
                ));
            }
            WgmmaA::Registers(regs) => {
                if regs.len() != 4 {
                    self.fail("wgmma's register A takes 4 registers".into());
                    return;
                }
                let a = vector_of(regs);
                self.emit(format_args!(
                    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {d}, {a}, {b_desc}, {scale_d}, 1, 1, {tb}"
                ));
            }
        }
    }

    /// Raises (`grow`) or lowers this warpgroup's register budget to `n` (a multiple of 8,
    /// 24–256); the kernel needs `max_registers` for it to apply.
    pub fn setmaxnreg(&mut self, grow: bool, n: u32) {
        if !self.require(self.target.has_wgmma(), "setmaxnreg") {
            return;
        }
        if n % 8 != 0 || !(24..=256).contains(&n) {
            self.fail(format!("setmaxnreg {n}"));
            return;
        }
        let dir = if grow { "inc" } else { "dec" };
        self.emit(format_args!("setmaxnreg.{dir}.sync.aligned.u32 {n}"));
    }
}
