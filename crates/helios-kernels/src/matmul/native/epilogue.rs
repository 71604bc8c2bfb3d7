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
    for h in 0..2u32 {
        let r = if h == 0 { row } else { k.add(row, 8u32) };
        let row_ok = k.setp(Cmp::Lt, r, m);
        // Element (r, col0) of a row-major matrix at `base` with leading dimension `ld`.
        let at = |k: &mut Kernel, base: Reg, off: Reg, ld: Reg| {
            let o = k.mad_wide(r, ld, off);
            let o = k.add(o, col64);
            let o = k.mul(o, size);
            k.add(base, o)
        };
        let cptr = at(k, out.c, out.off_c, out.ldc);
        let rptr = out.residual.map(|p| at(k, p, out.off_r, out.ldr));
        let pptr = out.pre.map(|p| at(k, p, out.off_c, out.ldc));
        for j in 0..bn / 8 {
            let off = i64::from(8 * j * size);
            let oks: Vec<Reg> = (0..2)
                .map(|i| {
                    let c_ok = k.setp(Cmp::Gt, left, (8 * j + i) as i32);
                    k.and_pred(c_ok, row_ok)
                })
                .collect();
            let mut v: Vec<Reg> = (0..2)
                .map(|i| k.mul(acc[(4 * j + 2 * h + i) as usize], alpha))
                .collect();
            if let Some(b) = bias {
                let bv = load_pair(k, kern, Addr::at(b, off), &oks);
                for i in 0..2 {
                    v[i] = k.add(v[i], bv[i]);
                }
            }
            if let Some(p) = pptr {
                store_pair(k, kern, Addr::at(p, off), &v, &oks);
            }
            for x in v.iter_mut() {
                *x = activation(k, e.act(), *x);
            }
            if let Some(rp) = rptr {
                let rv = load_pair(k, kern, Addr::at(rp, off), &oks);
                for i in 0..2 {
                    v[i] = match e.act_grad() {
                        Activation::None => k.add(v[i], rv[i]),
                        act => activation_grad(k, act, rv[i], v[i]),
                    };
                }
            }
            store_pair(k, kern, Addr::at(cptr, off), &v, &oks);
        }
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
