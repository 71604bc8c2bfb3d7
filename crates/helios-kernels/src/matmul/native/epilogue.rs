//! The epilogue of the native matmul, from `wgmma`'s accumulators: scale, bias, activation
//! (and its gradient), the pre-activation output, residual, rounding.

use helios_ptx::{Addr, Cmp, Kernel, Reg, Space, Ty};

use super::WG_ROWS;
use crate::matmul::{Activation, MatmulKernel};
use crate::storage::Storage;

/// Where the epilogue writes and what it reads, for every tile of the block: the output
/// and its fused operands, the scale, the product's size (m, n) and the tile's width.
pub(super) struct Out {
    pub(super) alpha: Reg,
    pub(super) m: Reg,
    pub(super) n: Reg,
    pub(super) bn: u32,
    pub(super) tid: Reg,
    pub(super) c: Reg,
    pub(super) off_c: Reg,
    pub(super) ldc: Reg,
    pub(super) bias: Option<Reg>,
    pub(super) residual: Option<Reg>,
    pub(super) off_r: Reg,
    pub(super) ldr: Reg,
    pub(super) pre: Option<Reg>,
}

/// The accumulator layout of `wgmma` m64nN (f32): in warp `w` of the warpgroup, lane
/// `4g + q` holds, for each 8-column block `j`, rows `16w + g` and `16w + g + 8` at columns
/// `8j + 2q` and `8j + 2q + 1`: registers `4j + 2h + {0, 1}` for row half `h`. `(m0, n0)`
/// is the tile's first row and column.
///
/// Stored where they fall, a warp's store writes 8 rows × 16 bytes (16-bit outputs) in 4-byte
/// pieces, and the stores bound the tiles of short products (8192 × 2304 × 768: ~40% of the
/// time). Where the rows allow 16-byte accesses (`vec_c`), the four lanes of each row swap
/// values first (`Wide`) so that each stores 16 contiguous bytes: 8 rows × 64 bytes a warp
/// store, a quarter of the stores. The residual is read the same way.
pub(super) fn epilogue(
    k: &mut Kernel,
    kern: &MatmulKernel,
    acc: &[Reg],
    out: &Out,
    (m0, n0): (Reg, Reg),
) {
    let Out {
        alpha,
        m,
        n,
        bn,
        tid,
        ..
    } = *out;
    let e = kern.epilogue;
    let size = kern.out.bytes();
    let at = k.wgmma_thread(tid);
    let row = k.mad(at.warpgroup, WG_ROWS, m0);
    let row = k.mad(at.warp, 16u32, row);
    let row = k.add(row, at.row);
    let col0 = k.mad(at.pair, 2u32, n0);
    // Columns left from this thread's first: compared against each block's 8j (+1).
    let left = k.sub(n.retype(Ty::S32), col0.retype(Ty::S32));
    let col64 = k.cvt(Ty::U64, col0);
    let bias = out.bias.map(|b| {
        let o = k.mul(col64, size);
        k.add(b, o)
    });
    let wide = Wide::of(k, kern, bn, at.pair, n, n0);
    // Whether each of this thread's two columns of block j is in the product (row and
    // column).
    let oks_at = |k: &mut Kernel, j: u32, row_ok: Reg| -> Vec<Reg> {
        (0..2)
            .map(|i| {
                let c_ok = k.setp(Cmp::Gt, left, (8 * j + i) as i32);
                k.and_pred(c_ok, row_ok)
            })
            .collect()
    };
    // The epilogue's values at 8-column block j, row half h, from the accumulators and the
    // residual's pair `rv`: (pre-activation, output). `oks` guard the bias's loads.
    let value = |k: &mut Kernel, j: u32, h: u32, rv: Option<[Reg; 2]>, oks: &[Reg]| {
        let mut v: Vec<Reg> = (0..2)
            .map(|i| k.mul(acc[(4 * j + 2 * h + i) as usize], alpha))
            .collect();
        if let Some(b) = bias {
            let bv = load_pair(k, kern, Addr::at(b, i64::from(8 * j * size)), oks);
            for i in 0..2 {
                v[i] = k.add(v[i], bv[i]);
            }
        }
        let pre = [v[0], v[1]];
        for x in v.iter_mut() {
            *x = activation(k, e.act(), *x);
        }
        if let Some(rv) = rv {
            for i in 0..2 {
                v[i] = match e.act_grad() {
                    Activation::None => k.add(v[i], rv[i]),
                    act => activation_grad(k, act, rv[i], v[i]),
                };
            }
        }
        (pre, [v[0], v[1]])
    };
    for h in 0..2u32 {
        let r = if h == 0 { row } else { k.add(row, 8u32) };
        let row_ok = k.setp(Cmp::Lt, r, m);
        // Element (r, col) of a row-major matrix at `base` with leading dimension `ld`.
        let at = |k: &mut Kernel, base: Reg, off: Reg, ld: Reg, col: Reg| {
            let o = k.mad_wide(r, ld, off);
            let o = k.add(o, col);
            let o = k.mul(o, size);
            k.add(base, o)
        };
        let Some(w) = &wide else {
            let cptr = at(k, out.c, out.off_c, out.ldc, col64);
            let rptr = out.residual.map(|p| at(k, p, out.off_r, out.ldr, col64));
            let pptr = out.pre.map(|p| at(k, p, out.off_c, out.ldc, col64));
            for j in 0..bn / 8 {
                let off = i64::from(8 * j * size);
                let oks = oks_at(k, j, row_ok);
                let rv = rptr.map(|rp| load_pair(k, kern, Addr::at(rp, off), &oks));
                let (pre, v) = value(k, j, h, rv, &oks);
                if let Some(p) = pptr {
                    store_pair(k, kern, Addr::at(p, off), &pre, &oks);
                }
                store_pair(k, kern, Addr::at(cptr, off), &v, &oks);
            }
            continue;
        };
        let cptr = at(k, out.c, out.off_c, out.ldc, w.col);
        let rptr = out.residual.map(|p| at(k, p, out.off_r, out.ldr, w.col));
        let pptr = out.pre.map(|p| at(k, p, out.off_c, out.ldc, w.col));
        for j0 in (0..bn / 8).step_by(w.blocks as usize) {
            let off = i64::from(8 * j0 * size);
            let ok = w.ok(k, j0, row_ok);
            let rv = rptr.map(|rp| w.load(k, kern, Addr::at(rp, off), ok));
            let (mut pre, mut v) = (Vec::new(), Vec::new());
            for jj in 0..w.blocks {
                let j = j0 + jj;
                let oks = match bias {
                    Some(_) => oks_at(k, j, row_ok),
                    None => Vec::new(),
                };
                let (p, x) = value(k, j, h, rv.as_ref().map(|r| r[jj as usize]), &oks);
                pre.push(p);
                v.push(x);
            }
            if let Some(p) = pptr {
                w.store(k, kern, Addr::at(p, off), &pre, ok);
            }
            w.store(k, kern, Addr::at(cptr, off), &v, ok);
        }
    }
}

/// The lanes of an accumulator row (`q` = lane mod 4) exchanging values so that each
/// accesses 16 contiguous bytes: for 16-bit outputs over 4 blocks of 8 columns (lane `q`
/// takes block `q`: a 4 × 4 transpose of 4-byte pairs), for f32 over 2 (lane `q` takes
/// half `q / 2` of block `q mod 2`).
struct Wide {
    /// 8-column blocks one exchange covers.
    blocks: u32,
    /// `q mod 2 = 1`, `q ≥ 2`.
    odd: Reg,
    high: Reg,
    /// This lane's first column after the exchange (u64, from the tile's first).
    col: Reg,
    /// Columns from this lane's block to the product's edge (s32).
    left: Reg,
}

impl Wide {
    /// The exchange for `kern`'s output, or `None` where its rows do not allow 16-byte
    /// accesses or the tile's width is not whole exchanges.
    fn of(k: &mut Kernel, kern: &MatmulKernel, bn: u32, q: Reg, n: Reg, n0: Reg) -> Option<Wide> {
        let blocks = match kern.out {
            Storage::F32 => 2,
            _ => 4,
        };
        if !kern.vec_c || bn % (8 * blocks) != 0 {
            return None;
        }
        let odd = {
            let b = k.and(q, 1u32);
            k.setp(Cmp::Ne, b, 0u32)
        };
        let high = k.setp(Cmp::Ge, q, 2u32);
        // 16-bit: block q, column 0; f32: block q mod 2, column 4 · (q / 2).
        let (block, within) = match blocks {
            4 => (q, k.mov(Ty::U32, 0u32)),
            _ => {
                let b = k.and(q, 1u32).retype(Ty::U32);
                let half = k.shr(q, 1u32).retype(Ty::U32);
                (b, k.mul(half, 4u32))
            }
        };
        let first = k.mad(block, 8u32, n0);
        let col = k.add(first, within);
        let col = k.cvt(Ty::U64, col);
        let left = k.sub(n.retype(Ty::S32), first.retype(Ty::S32));
        Some(Wide {
            blocks,
            odd,
            high,
            col,
            left,
        })
    }

    /// Whether this lane's 16 bytes of the exchange starting at block `j0` are in the
    /// product (`vec_c` makes n a multiple of 8: a block is all in or all out).
    fn ok(&self, k: &mut Kernel, j0: u32, row_ok: Reg) -> Reg {
        let in_n = k.setp(Cmp::Gt, self.left, (8 * j0) as i32);
        k.and_pred(in_n, row_ok)
    }

    /// Stores the pairs `v` (one per block, as the accumulators hold them) rounded to the
    /// output storage, 16 bytes a lane at `at` (the lane's address of block `j0`).
    fn store(&self, k: &mut Kernel, kern: &MatmulKernel, at: Addr, v: &[[Reg; 2]], ok: Reg) {
        let words: Vec<Reg> = match kern.out {
            Storage::F32 => self.pairs_to_lanes(k, v[0], v[1]).to_vec(),
            s => {
                let ty = if s == Storage::F16 {
                    Ty::F16x2
                } else {
                    Ty::BF16x2
                };
                let x: Vec<Reg> = v
                    .iter()
                    .map(|p| k.cvt_pack(ty, p[1], p[0]).retype(Ty::B32))
                    .collect();
                self.transpose(k, [x[0], x[1], x[2], x[3]]).to_vec()
            }
        };
        k.st_v(Space::Global, at, &words, Some(ok));
    }

    /// Loads 16 bytes a lane at `at` (stored like the output) and returns each block's pair
    /// as the accumulators hold them, as f32 (0 where not `ok`).
    fn load(&self, k: &mut Kernel, kern: &MatmulKernel, at: Addr, ok: Reg) -> Vec<[Reg; 2]> {
        let ty = match kern.out {
            Storage::F32 => Ty::F32,
            _ => Ty::B32,
        };
        let w: Vec<Reg> = (0..4)
            .map(|_| match ty {
                Ty::F32 => k.mov(ty, 0.0f32),
                _ => k.mov(ty, 0u32),
            })
            .collect();
        k.ld_v_if(ok, Space::Global, &w, at);
        match kern.out {
            Storage::F32 => {
                let (p0, p1) = self.lanes_to_pairs(k, [w[0], w[1], w[2], w[3]]);
                vec![p0, p1]
            }
            s => {
                let x = self.transpose(k, [w[0], w[1], w[2], w[3]]);
                x.iter()
                    .map(|&x| {
                        let (lo, hi) = k.unpack_halves(x, Ty::B16);
                        [half_to_f32(k, s, lo), half_to_f32(k, s, hi)]
                    })
                    .collect()
            }
        }
    }

    /// The 4 × 4 transpose of 4-byte words over the lanes of a row: lane q's word i becomes
    /// lane i's word q (its own inverse). Two butterfly rounds: lanes q and q ^ 2 swap half
    /// their words, then q and q ^ 1 one word of each half.
    fn transpose(&self, k: &mut Kernel, x: [Reg; 4]) -> [Reg; 4] {
        let (hi, lo) = (self.high, self.odd);
        let s0 = k.selp(hi, x[0], x[2], Ty::B32);
        let s1 = k.selp(hi, x[1], x[3], Ty::B32);
        let r0 = k.shfl("bfly", s0, 2u32, 0x1f);
        let r1 = k.shfl("bfly", s1, 2u32, 0x1f);
        let z = [
            k.selp(hi, r0, x[0], Ty::B32),
            k.selp(hi, r1, x[1], Ty::B32),
            k.selp(hi, x[2], r0, Ty::B32),
            k.selp(hi, x[3], r1, Ty::B32),
        ];
        let s0 = k.selp(lo, z[0], z[1], Ty::B32);
        let s1 = k.selp(lo, z[2], z[3], Ty::B32);
        let t0 = k.shfl("bfly", s0, 1u32, 0x1f);
        let t1 = k.shfl("bfly", s1, 1u32, 0x1f);
        [
            k.selp(lo, t0, z[0], Ty::B32),
            k.selp(lo, z[1], t0, Ty::B32),
            k.selp(lo, t1, z[2], Ty::B32),
            k.selp(lo, z[3], t1, Ty::B32),
        ]
    }

    /// f32: lane q's pairs of blocks 0 and 1 become 4 contiguous values, block q mod 2 at
    /// column 4 · (q / 2): lanes q and q ^ 1 swap one pair.
    fn pairs_to_lanes(&self, k: &mut Kernel, p0: [Reg; 2], p1: [Reg; 2]) -> [Reg; 4] {
        let lo = self.odd;
        let r: Vec<Reg> = (0..2)
            .map(|i| {
                let s = k.selp(lo, p0[i], p1[i], Ty::F32);
                k.shfl("bfly", s, 1u32, 0x1f)
            })
            .collect();
        [
            k.selp(lo, r[0], p0[0], Ty::F32),
            k.selp(lo, r[1], p0[1], Ty::F32),
            k.selp(lo, p1[0], r[0], Ty::F32),
            k.selp(lo, p1[1], r[1], Ty::F32),
        ]
    }

    /// The inverse of `pairs_to_lanes`.
    fn lanes_to_pairs(&self, k: &mut Kernel, w: [Reg; 4]) -> ([Reg; 2], [Reg; 2]) {
        let lo = self.odd;
        let r: Vec<Reg> = (0..2)
            .map(|i| {
                let s = k.selp(lo, w[i], w[2 + i], Ty::F32);
                k.shfl("bfly", s, 1u32, 0x1f)
            })
            .collect();
        let p0 = [0, 1].map(|i| k.selp(lo, r[i], w[i], Ty::F32));
        let p1 = [0, 1].map(|i| k.selp(lo, w[2 + i], r[i], Ty::F32));
        (p0, p1)
    }
}

/// Two adjacent elements of a buffer stored like the output, as f32 (0 where not ok).
fn load_pair(k: &mut Kernel, kern: &MatmulKernel, at: Addr, oks: &[Reg]) -> [Reg; 2] {
    match kern.out {
        Storage::F32 => [0, 1].map(|i| {
            k.ld_if(
                oks[i],
                Space::Global,
                Ty::F32,
                at.plus(4 * i as i64),
                0.0f32,
            )
        }),
        s => [0, 1].map(|i| {
            let h = k.ld_if(oks[i], Space::Global, Ty::B16, at.plus(2 * i as i64), 0u32);
            half_to_f32(k, s, h)
        }),
    }
}

/// A 16-bit float (bits in a b16 register) as f32.
fn half_to_f32(k: &mut Kernel, s: Storage, h: Reg) -> Reg {
    match s {
        Storage::F16 => k.widen(h.retype(Ty::F16)),
        _ => {
            // bf16 is the high half of an f32.
            let zero = k.mov(Ty::B16, 0u32);
            let w = k.pack_halves(zero, h);
            k.bits_to_f32(w)
        }
    }
}

/// Stores two adjacent f32 values rounded to the output storage: one vector store where
/// the row allows it, else one predicated store each.
fn store_pair(k: &mut Kernel, kern: &MatmulKernel, at: Addr, v: &[Reg], oks: &[Reg]) {
    match (kern.out, kern.vec_c) {
        (Storage::F32, true) => k.st_v(Space::Global, at, v, Some(oks[0])),
        (Storage::F32, false) => {
            for i in 0..2 {
                k.st_if(oks[i], Space::Global, at.plus(4 * i as i64), v[i]);
            }
        }
        (s, true) => {
            let ty = if s == Storage::F16 {
                Ty::F16x2
            } else {
                Ty::BF16x2
            };
            let packed = k.cvt_pack(ty, v[1], v[0]);
            k.st_if(oks[0], Space::Global, at, packed.retype(Ty::B32));
        }
        (s, false) => {
            let ty = if s == Storage::F16 { Ty::F16 } else { Ty::BF16 };
            for i in 0..2 {
                let h = k.cvt(ty, v[i]);
                k.st_if(oks[i], Space::Global, at.plus(2 * i as i64), h);
            }
        }
    }
}

/// `act(x)`: ReLU propagating NaN; GELU (tanh form) as x / (1 + exp(−2z)), without the
/// cancellation of 1 + tanh(z) for x < 0.
fn activation(k: &mut Kernel, act: Activation, x: Reg) -> Reg {
    match act {
        Activation::None => x,
        Activation::Relu => k.max_nan(x, 0.0f32),
        Activation::GeluTanh => {
            let x2 = k.mul(x, x);
            let inner = k.fma(x2, 0.044_715f32, 1.0f32);
            let z = k.mul(x, inner);
            // exp(−2·√(2/π)·z) = 2^(z·(−2·√(2/π)·log2 e))
            let t = k.mul(z, -2.0 * 0.797_884_6 * std::f32::consts::LOG2_E);
            let ex = k.ex2(t);
            let den = k.add(ex, 1.0f32);
            k.div(x, den)
        }
    }
}

/// `act'(x) · dy`. GELU: with p = sigmoid(2z), gelu' = p + 2x·p·(1 − p)·√(2/π)·(1 +
/// 3·0.044715x²); past |x| > 10 the limit (0 or 1), where the formula would overflow.
fn activation_grad(k: &mut Kernel, act: Activation, x: Reg, dy: Reg) -> Reg {
    match act {
        Activation::None => dy,
        Activation::Relu => {
            let pos = k.setp(Cmp::Gt, x, 0.0f32);
            k.selp(pos, dy, 0.0f32, Ty::F32)
        }
        Activation::GeluTanh => {
            let k0 = 0.797_884_6f32;
            let x2 = k.mul(x, x);
            let inner = k.fma(x2, 0.044_715f32, 1.0f32);
            let z = k.mul(x, inner);
            let t = k.mul(z, -2.0 * k0 * std::f32::consts::LOG2_E);
            let ex = k.ex2(t);
            let den = k.add(ex, 1.0f32);
            let p = k.rcp_exact(den);
            let q = k.mul(ex, p);
            let slope = k.fma(x2, 3.0 * 0.044_715f32, 1.0f32);
            let slope = k.mul(slope, k0);
            let pq = k.mul(p, q);
            let x2p = k.mul(x, 2.0f32);
            let tt = k.mul(x2p, pq);
            let d = k.fma(tt, slope, p);
            let ax = k.abs(x);
            let far = k.setp(Cmp::Gt, ax, 10.0f32);
            let pos = k.setp(Cmp::Gt, x, 0.0f32);
            let limit = k.selp(pos, 1.0f32, 0.0f32, Ty::F32);
            let d = k.selp(far, limit, d, Ty::F32);
            k.mul(dy, d)
        }
    }
}
