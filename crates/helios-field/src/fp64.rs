//! Montgomery multiplication with the limb products on the FP64 pipe (after Emmart & Weems,
//! "Faster modular exponentiation using double precision floating point arithmetic on the
//! GPU", 2018): eight 48-bit limbs held as f64, every partial product split exactly into a
//! high and a low part by two fused multiply-adds, the parts summed per column as 64-bit
//! integers (the integer pipe), the reduction factors computed on the FP64 pipe too.
//!
//! The one decision a reader must know: the split of a product x·y (|x·y| < 2⁹⁹) is
//!
//! ```text
//! hi = fma(x, y, C)          C = 3·2⁹⁹: hi stays in [2¹⁰⁰, 2¹⁰¹), whose ulp is 2⁴⁸,
//! t  = (C + M) − hi          M = 3·2⁵¹; exact: t = M − H·2⁴⁸ is representable
//! lo = fma(x, y, t)          = L + M exactly, L = x·y − H·2⁴⁸, |L| < 2⁴⁸
//! ```
//!
//! so bits(hi) − bits(C) = H and bits(lo) − bits(M) = L as two's-complement integers
//! (the OpBitcast reinterpretation; no float→int conversion), with x·y = H·2⁴⁸ + L. hi may
//! round either way, so this is exact under every IEEE rounding direction (no rounding mode
//! needs requesting), but **only if the fma is fused**: rounding x·y first loses up to 2⁴⁵.
//! The terms are added into i64 column sums with their biases, and each column subtracts the
//! sum of its biases once (a compile-time constant). 48 · 8 = 384, so R' = R = 2³⁸⁴: no
//! operand shift as in [`crate::comba`].
//!
//! Reduction: the column's low 48 bits t (an integer) become an f64 by OR-ing them into the
//! mantissa of 2⁵² and subtracting 2⁵², m = t·(−p⁻¹) mod 2⁴⁸ is the low part of one more
//! split (masked to [0, 2⁴⁸), so the result stays below 1.125p whatever the rounding), and
//! m·p runs on the FP64 pipe like a·b. Optionally a·b is one level of Karatsuba on 4-limb
//! halves (48 products instead of 64; the half sums are exact in f64, below 2⁴⁹).
//!
//! Column sums on the FP64 pipe (`Fp64Mul::fp_columns`, layout `fp64c`): the i64 column
//! sums, two 64-bit adds per product, not the FP64 pipe, bound `fp64`/`fp64k` (measured:
//! bench/results/2026-11-22-field-h100-fp64.md);
//! there each column's products are chained through the fused multiply-adds instead (the
//! high part accumulates in the `fma`'s addend, its rounding error is recovered exactly as
//! the low part, the low parts are summed in f64), so a product costs four FP64 operations
//! and the integer side adds only each chain's two sums once per column.
//!
//! Fusion: Vulkan does not require GLSL.std.450 `Fma` to be fused (its precision is that of
//! an OpFMul followed by an OpFAdd). VK_KHR_shader_fma's `OpFmaKHR` is the operation that
//! guarantees it; [`FmaKind`] picks either (see `Layout` for which layout uses which).

use helios_spirv::{KernelBuilder, Scalar, Ty, Val};

use crate::fq::{Fq, P, P_INV_NEG};

/// Bits per limb.
pub const W: u32 = 48;
/// Limbs per element.
pub const N: usize = 8;
const MASK: u64 = (1 << W) - 1;
/// The alignment constant of the high part: 3·2⁹⁹.
const C_HI: f64 = 3.0 * (1u128 << 99) as f64;
/// The alignment constant of the low part: 3·2⁵¹.
const C_LO: f64 = 3.0 * (1u64 << 51) as f64;
/// 2⁵²: an integer below 2⁵² OR-ed into its mantissa bits gives 2⁵² + the integer.
const TWO52: f64 = (1u64 << 52) as f64;

/// Which instruction computes the fused multiply-add.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FmaKind {
    /// GLSL.std.450 `Fma`: fused on the drivers measured (NVIDIA's compiler emits DFMA,
    /// llvmpipe an x86 FMA), but not required to be by Vulkan.
    Glsl,
    /// `OpFmaKHR` (SPV_KHR_fma): fused by specification; needs VK_KHR_shader_fma's
    /// `shaderFmaFloat64`.
    Khr,
}

/// How the FP64 multiplier is emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp64Mul {
    /// a·b by one level of Karatsuba (48 products instead of 64).
    pub karatsuba: bool,
    pub fma: FmaKind,
    /// Column sums on the FP64 pipe ([`Fp64::mont_mul_fp_columns`]): the high parts chained
    /// through the fused multiply-adds, the low parts summed as f64, so each product costs
    /// four FP64 operations and no integer one (instead of three and two 64-bit adds).
    pub fp_columns: bool,
}

/// `x` as eight 48-bit limbs, least significant first.
pub fn split_limbs(x: &Fq) -> [u64; N] {
    std::array::from_fn(|i| {
        let bit = i * W as usize;
        let (word, off) = (bit / 64, bit % 64);
        let mut v = x[word] >> off;
        if off + W as usize > 64 && word + 1 < 6 {
            v |= x[word + 1] << (64 - off);
        }
        v & MASK
    })
}

/// A column chain on the FP64 pipe (`Fp64::chain_mac`): the running high part (f64 in
/// [2¹⁰⁰, 2¹⁰¹), from C_HI) and the sum of the exact low parts (f64 in [2⁵², 2⁵³), from
/// C_LO), if any is left in it.
#[derive(Clone, Copy)]
struct Chain {
    hi: Val,
    lo: Option<Val>,
}

/// A column sum in progress: an i64 value and the sum of the biases it carries (mod 2⁶⁴).
#[derive(Clone, Copy)]
struct Col {
    v: Option<Val>,
    bias: u64,
}

impl Col {
    const ZERO: Col = Col { v: None, bias: 0 };
}

/// Emits FP64 limb arithmetic into a kernel.
pub struct Fp64<'k> {
    pub k: &'k mut KernelBuilder,
    pub mul: Fp64Mul,
}

impl Fp64<'_> {
    fn i64(&mut self, v: u64) -> Val {
        self.k.i64(v as i64)
    }

    /// An integer in [0, 2⁵²) held in an i64 as the f64 of the same value.
    fn int_to_f64(&mut self, v: Val) -> Val {
        let two52 = self.i64(TWO52.to_bits());
        let biased = self.k.or(v, two52);
        let f = self.k.bitcast(biased, Ty::scalar(Scalar::F64));
        let two52 = self.k.f64(TWO52);
        self.k.sub(f, two52)
    }

    fn fma(&mut self, a: Val, b: Val, c: Val) -> Val {
        match self.mul.fma {
            FmaKind::Glsl => self.k.fma(a, b, c),
            FmaKind::Khr => self.k.fma_fused(a, b, c),
        }
    }

    /// The exact split of x·y (|x·y| < 2⁹⁹): (bits of hi, bits of lo) as i64, with
    /// x·y = (hi − bits(C_HI))·2⁴⁸ + (lo − bits(C_LO)).
    fn split(&mut self, x: Val, y: Val) -> (Val, Val) {
        let c = self.k.f64(C_HI);
        let cm = self.k.f64(C_HI + C_LO);
        let hi = self.fma(x, y, c);
        let t = self.k.sub(cm, hi);
        let lo = self.fma(x, y, t);
        let i64t = Ty::scalar(Scalar::I64);
        (self.k.bitcast(hi, i64t), self.k.bitcast(lo, i64t))
    }

    fn add(&mut self, col: &mut Col, v: Val, bias: u64) {
        col.v = Some(match col.v {
            Some(x) => self.k.add(x, v),
            None => v,
        });
        col.bias = col.bias.wrapping_add(bias);
    }

    fn add_col(&mut self, col: &mut Col, other: Col) {
        if let Some(v) = other.v {
            self.add(col, v, other.bias);
        }
    }

    fn sub_col(&mut self, col: &mut Col, other: Col) {
        if let Some(v) = other.v {
            col.v = Some(match col.v {
                Some(x) => self.k.sub(x, v),
                None => self.k.neg(v),
            });
            col.bias = col.bias.wrapping_sub(other.bias);
        }
    }

    /// Adds x·y: its low part to `lo`, its high part to `hi` (the next column).
    fn mac(&mut self, lo: &mut Col, hi: &mut Col, x: Val, y: Val) {
        let (h, l) = self.split(x, y);
        self.add(lo, l, C_LO.to_bits());
        self.add(hi, h, C_HI.to_bits());
    }

    /// The column's value with its biases removed.
    fn finish(&mut self, col: Col) -> Val {
        let v = match col.v {
            Some(v) => v,
            None => return self.i64(col.bias.wrapping_neg()),
        };
        if col.bias == 0 {
            return v;
        }
        let b = self.i64(col.bias.wrapping_neg());
        self.k.add(v, b)
    }

    /// The split-column sums of the product of two limb vectors: entry c holds the low parts
    /// of the products in column c and the high parts of those in column c − 1.
    fn product_columns(&mut self, f: &[Val], g: &[Val]) -> Vec<Col> {
        let mut cols = vec![Col::ZERO; f.len() + g.len()];
        for c in 0..f.len() + g.len() - 1 {
            for i in c.saturating_sub(g.len() - 1)..=c.min(f.len() - 1) {
                let (mut lo, mut hi) = (cols[c], cols[c + 1]);
                self.mac(&mut lo, &mut hi, f[i], g[c - i]);
                (cols[c], cols[c + 1]) = (lo, hi);
            }
        }
        cols
    }

    /// A constant element as f64 limbs.
    pub fn constant(&mut self, x: &Fq) -> Vec<Val> {
        split_limbs(x)
            .into_iter()
            .map(|v| self.k.f64(v as f64))
            .collect()
    }

    /// Twelve u32 words (the element's bytes) to eight f64 limbs.
    pub fn unpack_words(&mut self, w: &[Val]) -> Vec<Val> {
        let (low16, sh16, expo) = (self.k.u32(0xffff), self.k.u32(16), self.k.u32(0x4330_0000));
        let two52 = self.k.f64(TWO52);
        let mut limbs = Vec::with_capacity(N);
        for q in 0..N / 2 {
            // Limb 2q is bits 0..48 of words 3q, 3q+1; limb 2q+1 bits 16..64 of 3q+1, 3q+2.
            let (w0, w1, w2) = (w[3 * q], w[3 * q + 1], w[3 * q + 2]);
            let hi0 = self.k.and(w1, low16);
            let lo1a = self.k.shr(w1, sh16);
            let lo1b = self.k.shl(w2, sh16);
            let lo1 = self.k.or(lo1a, lo1b);
            let hi1 = self.k.shr(w2, sh16);
            for (lo, hi) in [(w0, hi0), (lo1, hi1)] {
                let hi = self.k.or(hi, expo);
                let pair = self.k.vector(&[lo, hi]);
                let f = self.k.bitcast(pair, Ty::scalar(Scalar::F64));
                limbs.push(self.k.sub(f, two52));
            }
        }
        limbs
    }

    /// Eight canonical f64 limbs (integers in [0, 2⁴⁸)) back to twelve u32 words.
    pub fn pack_words(&mut self, limbs: &[Val]) -> Vec<Val> {
        let (low16, sh16) = (self.k.u32(0xffff), self.k.u32(16));
        let two52 = self.k.f64(TWO52);
        let mut parts = Vec::with_capacity(N);
        for &l in limbs {
            let f = self.k.add(l, two52);
            let pair = self.k.bitcast(f, Ty::vector(Scalar::U32, 2));
            let (lo, hi) = (self.k.extract(pair, 0), self.k.extract(pair, 1));
            parts.push((lo, self.k.and(hi, low16)));
        }
        let mut words = Vec::with_capacity(12);
        for q in 0..N / 2 {
            let ((lo0, hi0), (lo1, hi1)) = (parts[2 * q], parts[2 * q + 1]);
            words.push(lo0);
            let a = self.k.shl(lo1, sh16);
            words.push(self.k.or(hi0, a));
            let b = self.k.shr(lo1, sh16);
            let c = self.k.shl(hi1, sh16);
            words.push(self.k.or(b, c));
        }
        words
    }

    /// a·b·2⁻³⁸⁴ mod p, canonical, for canonical a, b given as eight f64 limbs.
    pub fn mont_mul(&mut self, a: &[Val], b: &[Val]) -> Vec<Val> {
        if self.mul.fp_columns {
            return self.mont_mul_fp_columns(a, b);
        }
        let p = self.constant(&P);
        let pinv = self.k.f64((P_INV_NEG & MASK) as f64);
        let (mask, wbits) = (self.i64(MASK), self.i64(u64::from(W)));
        let mut ab = self.mul.karatsuba.then(|| Kara::new(self, a, b));
        let mut m: Vec<Val> = Vec::with_capacity(N);
        let mut t: Vec<Val> = Vec::with_capacity(N);
        // `pend`: high parts of the products of the column before (they belong to this one).
        let mut pend = Col::ZERO;
        let mut carry: Option<Val> = None;
        for col in 0..2 * N - 1 {
            let mut acc = std::mem::replace(&mut pend, Col::ZERO);
            if let Some(c) = carry {
                self.add(&mut acc, c, 0);
            }
            let (lo, hi) = (col.saturating_sub(N - 1), col.min(N - 1));
            match ab.as_mut() {
                Some(kt) => {
                    let c = kt.column(self, col);
                    self.add_col(&mut acc, c);
                }
                None => {
                    for i in lo..=hi {
                        self.mac(&mut acc, &mut pend, a[i], b[col - i]);
                    }
                }
            }
            for (i, &mi) in m.iter().enumerate().take(hi + 1).skip(lo) {
                let pj = p[col - i];
                let (h, l) = self.split(mi, pj);
                self.add(&mut acc, l, C_LO.to_bits());
                self.add(&mut pend, h, C_HI.to_bits());
            }
            let mut v = self.finish(acc);
            if col < N {
                // m = t·(−p⁻¹) mod 2⁴⁸ from the low part of one more split; adding m·p
                // clears the column's low 48 bits.
                let low = self.k.and(v, mask);
                let tf = self.int_to_f64(low);
                let (_, l) = self.split(tf, pinv);
                let ml = self.k.and(l, mask);
                let mf = self.int_to_f64(ml);
                m.push(mf);
                let (h, l) = self.split(mf, p[0]);
                let c_lo = self.i64(C_LO.to_bits().wrapping_neg());
                let s = self.k.add(v, l);
                v = self.k.add(s, c_lo);
                self.add(&mut pend, h, C_HI.to_bits());
            } else {
                t.push(self.k.and(v, mask));
            }
            carry = Some(self.k.shr(v, wbits));
        }
        // The top limb: the last column's carry and high parts (and, with Karatsuba, a·b's
        // column 2N − 1). The result is below 1.125p < 2³⁸¹, so it fits in 48 bits.
        let mut top = pend;
        if let Some(kt) = ab.as_mut() {
            let c = kt.column(self, 2 * N - 1);
            self.add_col(&mut top, c);
        }
        if let Some(c) = carry {
            self.add(&mut top, c, 0);
        }
        t.push(self.finish(top));
        self.reduce_once(&t)
    }

    /// Adds x·y (|x·y| < 2⁹⁶) to a column chain on the FP64 pipe. The first product of a
    /// chain is the plain split against C_HI; each later one rounds into the running high
    /// part, `hi' = fma(x, y, hi)`, whose rounding error is recovered exactly:
    /// `d = hi − hi'` is exact (both multiples of 2⁴⁸ in [2¹⁰⁰, 2¹⁰¹)), and
    /// `l = fma(x, y, d) = x·y − (hi' − hi)` is an integer below 2⁴⁸ (one ulp) in magnitude,
    /// so exact; it is added to the chain's low sum, or, where the chain has none (its first
    /// product, or after `take_low`), becomes it as `fma(x, y, d + C_LO)` = C_LO + l (d + C_LO
    /// is exact: d is a multiple of 2⁴⁸ below 2⁹⁷). Bounds, in any rounding direction: a
    /// chain takes at most 8 products below 2⁹⁶, so its high part stays within C_HI ± 2⁹⁹
    /// (its binade) and its low sum within C_LO ± 2⁵¹ (its binade, ulp 1): every f64
    /// operation here is exact except the rounding `fma`s, whose error is what `l` recovers.
    fn chain_mac(&mut self, chain: &mut Option<Chain>, x: Val, y: Val) {
        let next = match *chain {
            None => {
                let c = self.k.f64(C_HI);
                let cm = self.k.f64(C_HI + C_LO);
                let hi = self.fma(x, y, c);
                let t = self.k.sub(cm, hi);
                Chain {
                    hi,
                    lo: Some(self.fma(x, y, t)),
                }
            }
            Some(Chain { hi: prev, lo }) => {
                let hi = self.fma(x, y, prev);
                let d = self.k.sub(prev, hi);
                let lo = match lo {
                    Some(sum) => {
                        let l = self.fma(x, y, d);
                        self.k.add(sum, l)
                    }
                    None => {
                        let m = self.k.f64(C_LO);
                        let t = self.k.add(d, m);
                        self.fma(x, y, t)
                    }
                };
                Chain { hi, lo: Some(lo) }
            }
        };
        *chain = Some(next);
    }

    /// The chain's low sum, as biased i64 bits (C_LO + Σ l), taken out of it.
    fn take_low(&mut self, chain: &mut Option<Chain>) -> Option<Val> {
        let lo = chain.as_mut()?.lo.take()?;
        Some(self.k.bitcast(lo, Ty::scalar(Scalar::I64)))
    }

    /// Adds what is left of a chain to the integer columns: its low sum to `lo`, its high
    /// part to `hi` (the next column), each with its bias.
    fn chain_into(&mut self, mut chain: Option<Chain>, lo: &mut Col, hi: &mut Col) {
        if let Some(l) = self.take_low(&mut chain) {
            self.add(lo, l, C_LO.to_bits());
        }
        if let Some(c) = chain {
            let h = self.k.bitcast(c.hi, Ty::scalar(Scalar::I64));
            self.add(hi, h, C_HI.to_bits());
        }
    }

    /// `mont_mul` with the column sums on the FP64 pipe (see `chain_mac`): per column two
    /// chains, one for the a·b products and one for the m·p products (so at most 8 products
    /// each, and two independent dependency chains), and the integer side only adds each
    /// chain's two sums, the carry and the biases once per column.
    pub fn mont_mul_fp_columns(&mut self, a: &[Val], b: &[Val]) -> Vec<Val> {
        let p = self.constant(&P);
        let pinv = self.k.f64((P_INV_NEG & MASK) as f64);
        let (mask, wbits) = (self.i64(MASK), self.i64(u64::from(W)));
        let mut m: Vec<Val> = Vec::with_capacity(N);
        let mut t: Vec<Val> = Vec::with_capacity(N);
        let mut pend = Col::ZERO;
        let mut carry: Option<Val> = None;
        for col in 0..2 * N - 1 {
            let (lo, hi) = (col.saturating_sub(N - 1), col.min(N - 1));
            let (mut ab, mut mp) = (None, None);
            // Interleaved so that the two chains' operations sit side by side.
            for i in lo..=hi {
                self.chain_mac(&mut ab, a[i], b[col - i]);
                if i < m.len() {
                    self.chain_mac(&mut mp, m[i], p[col - i]);
                }
            }
            let mut acc = std::mem::replace(&mut pend, Col::ZERO);
            if let Some(c) = carry {
                self.add(&mut acc, c, 0);
            }
            self.chain_into(ab, &mut acc, &mut pend);
            if col < N {
                // The m·p chain's low sum so far goes in now; m·p₀ comes after m, its low
                // part apart. Its bias (a multiple of 2⁴⁸, as all the biases: their low 48
                // bits are zero) is removed now, which leaves the low 48 bits that m is
                // computed from unchanged.
                if let Some(l) = self.take_low(&mut mp) {
                    self.add(&mut acc, l, C_LO.to_bits());
                }
                acc.bias = acc.bias.wrapping_add(C_LO.to_bits());
                let v = self.finish(acc);
                let low = self.k.and(v, mask);
                let tf = self.int_to_f64(low);
                let (_, l) = self.split(tf, pinv);
                let ml = self.k.and(l, mask);
                let mf = self.int_to_f64(ml);
                m.push(mf);
                self.chain_mac(&mut mp, mf, p[0]);
                let l0 = self.take_low(&mut mp).expect("m·p₀ was just added");
                let v = self.k.add(v, l0);
                let mut empty = Col::ZERO; // the chain's low sum is out already
                self.chain_into(mp, &mut empty, &mut pend);
                carry = Some(self.k.shr(v, wbits));
            } else {
                self.chain_into(mp, &mut acc, &mut pend);
                let v = self.finish(acc);
                t.push(self.k.and(v, mask));
                carry = Some(self.k.shr(v, wbits));
            }
        }
        // The top limb: the last column's carry and high parts (below 2⁴⁸, as in mont_mul).
        let mut top = pend;
        if let Some(c) = carry {
            self.add(&mut top, c, 0);
        }
        t.push(self.finish(top));
        self.reduce_once(&t)
    }

    /// `t − p` if t ≥ p, else t, for t < 2p as eight i64 limbs (< 2⁴⁸ each), to f64 limbs.
    fn reduce_once(&mut self, t: &[Val]) -> Vec<Val> {
        let p = split_limbs(&P);
        let (mask, wbits) = (self.i64(MASK), self.i64(u64::from(W)));
        let mut borrow: Option<Val> = None; // 0 or −1
        let mut d = Vec::with_capacity(N);
        for (&ti, &pi) in t.iter().zip(&p) {
            let pi = self.i64(pi.wrapping_neg());
            let mut v = self.k.add(ti, pi);
            if let Some(b) = borrow {
                v = self.k.add(v, b);
            }
            borrow = Some(self.k.shr(v, wbits));
            d.push(self.k.and(v, mask));
        }
        let zero = self.i64(0);
        let keep = self.k.lt(borrow.expect("eight limbs"), zero); // t < p
        t.iter()
            .zip(d)
            .map(|(&ti, di)| {
                let r = self.k.select(keep, ti, di);
                self.int_to_f64(r)
            })
            .collect()
    }
}

/// One level of Karatsuba for a·b in split-column form: a = x + y·2^(4w), b = u + v·2^(4w),
/// a·b = L + (S − L − H)·2^(4w) + H·2^(8w) with L = x·u, H = y·v, S = (x+y)(u+v). The
/// identity is linear, so it holds between the split-column arrays (whose weighted sums are
/// the products), and the i64 columns, differences included, stay far from overflow.
struct Kara {
    x: Vec<Val>,
    y: Vec<Val>,
    u: Vec<Val>,
    v: Vec<Val>,
    sa: Vec<Val>,
    sb: Vec<Val>,
    l: Option<Vec<Col>>,
    s: Option<Vec<Col>>,
    h: Option<Vec<Col>>,
}

impl Kara {
    const HALF: usize = N / 2;

    fn new(e: &mut Fp64<'_>, a: &[Val], b: &[Val]) -> Kara {
        let h = Kara::HALF;
        // Sums of two limbs below 2⁴⁸: exact in f64, below 2⁴⁹, so products stay below 2⁹⁸.
        let sa = (0..h).map(|i| e.k.add(a[i], a[h + i])).collect();
        let sb = (0..h).map(|i| e.k.add(b[i], b[h + i])).collect();
        Kara {
            x: a[..h].to_vec(),
            y: a[h..].to_vec(),
            u: b[..h].to_vec(),
            v: b[h..].to_vec(),
            sa,
            sb,
            l: None,
            s: None,
            h: None,
        }
    }

    /// Column `col` (0 ≤ col < 2N) of a·b in split-column form; the sub-products are
    /// computed when their first column is needed.
    fn column(&mut self, e: &mut Fp64<'_>, col: usize) -> Col {
        let h = Kara::HALF;
        let width = 2 * h; // columns of a sub-product
        let mut acc = Col::ZERO;
        if col < width {
            let (x, u) = (self.x.clone(), self.u.clone());
            let l = self.l.get_or_insert_with(|| e.product_columns(&x, &u));
            e.add_col(&mut acc, l[col]);
        }
        if col >= h && col - h < width {
            let j = col - h;
            let (sa, sb) = (self.sa.clone(), self.sb.clone());
            let s = self.s.get_or_insert_with(|| e.product_columns(&sa, &sb));
            e.add_col(&mut acc, s[j]);
            let l = self.l.as_ref().expect("L precedes S");
            e.sub_col(&mut acc, l[j]);
            let (y, v) = (self.y.clone(), self.v.clone());
            let hh = self.h.get_or_insert_with(|| e.product_columns(&y, &v));
            e.sub_col(&mut acc, hh[j]);
        }
        if col >= 2 * h && col - 2 * h < width {
            let hh = self
                .h
                .as_ref()
                .expect("H was computed for an earlier column");
            e.add_col(&mut acc, hh[col - 2 * h]);
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fq::random_elements;

    /// Limbs of `W` bits (low first) packed into an element, less p once when that leaves
    /// it canonical: the last step of the host models.
    fn pack_reduced(t: &[i64]) -> Fq {
        let mut out = [0u64; 6];
        for (i, &v) in t.iter().enumerate() {
            let bit = i * W as usize;
            out[bit / 64] |= (v as u64) << (bit % 64);
            if bit % 64 + W as usize > 64 && bit / 64 + 1 < 6 {
                out[bit / 64 + 1] |= (v as u64) >> (64 - bit % 64);
            }
        }
        if !crate::fq::is_canonical(&out) {
            let mut borrow = 0u128;
            for (o, &pi) in out.iter_mut().zip(&P) {
                let d = (*o as u128).wrapping_sub(pi as u128 + borrow);
                *o = d as u64;
                borrow = (d >> 127) & 1;
            }
        }
        out
    }

    /// The split on the host, with `f64::mul_add` (fused): exact for the extreme operands
    /// the kernel can meet (limbs, Karatsuba sums, m and p limbs).
    #[test]
    fn split_is_exact_on_the_host() {
        let check = |x: u64, y: u64| {
            let (xf, yf) = (x as f64, y as f64);
            let hi = xf.mul_add(yf, C_HI);
            let t = (C_HI + C_LO) - hi;
            let lo = xf.mul_add(yf, t);
            let h = hi.to_bits().wrapping_sub(C_HI.to_bits()) as i64 as i128;
            let l = lo.to_bits().wrapping_sub(C_LO.to_bits()) as i64 as i128;
            assert_eq!(h * (1 << W) + l, x as i128 * y as i128, "{x} · {y}");
            assert!(l.abs() < 1 << W);
        };
        let max49 = (1u64 << 49) - 2;
        for x in [0, 1, 2, MASK - 1, MASK, 1 << 47, max49] {
            for y in [0, 1, 3, MASK, 1 << 40, max49, 0x5555_5555_5555] {
                check(x, y);
            }
        }
        for (i, e) in random_elements(64, 5).iter().enumerate() {
            let l = split_limbs(e);
            check(l[i % N], l[(i + 3) % N] + l[(i + 5) % N]);
        }
        assert_eq!(C_HI + C_LO - C_HI, C_LO, "C + M is exact");
    }

    /// The schoolbook multiplier of `Fp64::mont_mul` step by step on the host (fused
    /// `mul_add`, wrapping i64 columns), against blst: checks the algorithm apart from the
    /// emitter.
    #[test]
    fn host_model_matches_blst() {
        fn split(x: f64, y: f64) -> (i64, i64) {
            let hi = x.mul_add(y, C_HI);
            let lo = x.mul_add(y, (C_HI + C_LO) - hi);
            (hi.to_bits() as i64, lo.to_bits() as i64)
        }
        let to_f = |v: i64| f64::from_bits(v as u64 | TWO52.to_bits()) - TWO52;
        let (ch, cl) = (C_HI.to_bits() as i64, C_LO.to_bits() as i64);
        let mont = |a: &Fq, b: &Fq| -> Fq {
            let (a, b) = (
                split_limbs(a).map(|v| v as f64),
                split_limbs(b).map(|v| v as f64),
            );
            let p = split_limbs(&P).map(|v| v as f64);
            let pinv = (P_INV_NEG & MASK) as f64;
            let (mut m, mut t) = (Vec::new(), Vec::new());
            let (mut pend, mut carry) = (0i64, 0i64);
            for col in 0..2 * N - 1 {
                let mut acc = pend.wrapping_add(carry);
                pend = 0;
                let (lo, hi) = (col.saturating_sub(N - 1), col.min(N - 1));
                for i in lo..=hi {
                    let (h, l) = split(a[i], b[col - i]);
                    acc = acc.wrapping_add(l - cl);
                    pend = pend.wrapping_add(h - ch);
                    if i < m.len() {
                        let (h, l) = split(m[i], p[col - i]);
                        acc = acc.wrapping_add(l - cl);
                        pend = pend.wrapping_add(h - ch);
                    }
                }
                if col < N {
                    let (_, l) = split(to_f(acc & MASK as i64), pinv);
                    let mi = to_f(l & MASK as i64);
                    m.push(mi);
                    let (h, l) = split(mi, p[0]);
                    acc = acc.wrapping_add(l - cl);
                    assert_eq!(acc & MASK as i64, 0);
                    pend = pend.wrapping_add(h - ch);
                } else {
                    t.push(acc & MASK as i64);
                }
                carry = acc >> W;
            }
            t.push(pend + carry);
            pack_reduced(&t)
        };
        let mut xs = crate::fq::edge_elements();
        xs.extend(random_elements(200, 17));
        let ys: Vec<Fq> = xs.iter().rev().copied().collect();
        let want = crate::cpu::reference(crate::FieldOp::Mul, &xs, &ys);
        for i in 0..xs.len() {
            assert_eq!(mont(&xs[i], &ys[i]), want[i], "{:x?} · {:x?}", xs[i], ys[i]);
        }
    }

    /// `Fp64::mont_mul_fp_columns` step by step on the host (fused `mul_add`, f64 chains,
    /// wrapping i64 columns), against blst, with the chain bounds it relies on asserted.
    #[test]
    fn host_model_of_fp_columns_matches_blst() {
        #[derive(Clone, Copy)]
        struct Chain {
            hi: f64,
            lo: Option<f64>,
        }
        fn mac(chain: &mut Option<Chain>, x: f64, y: f64) {
            let next = match *chain {
                None => {
                    let hi = x.mul_add(y, C_HI);
                    let lo = x.mul_add(y, (C_HI + C_LO) - hi);
                    Chain { hi, lo: Some(lo) }
                }
                Some(Chain { hi: prev, lo }) => {
                    let hi = x.mul_add(y, prev);
                    let d = prev - hi;
                    assert_eq!(d, prev - hi, "exact");
                    let lo = match lo {
                        Some(sum) => sum + x.mul_add(y, d),
                        None => x.mul_add(y, d + C_LO),
                    };
                    Chain { hi, lo: Some(lo) }
                }
            };
            // Both sums stay in their binades (so their bits are exact integers).
            let (hb, lb) = (next.hi.to_bits() >> 52, next.lo.map(|l| l.to_bits() >> 52));
            assert_eq!(hb, C_HI.to_bits() >> 52);
            assert_eq!(lb, Some(C_LO.to_bits() >> 52));
            *chain = Some(next);
        }
        let bits = |x: f64| x.to_bits() as i64;
        let (ch, cl) = (bits(C_HI), bits(C_LO));
        let to_f = |v: i64| f64::from_bits(v as u64 | TWO52.to_bits()) - TWO52;
        let mont = |a: &Fq, b: &Fq| -> Fq {
            let (a, b) = (
                split_limbs(a).map(|v| v as f64),
                split_limbs(b).map(|v| v as f64),
            );
            let p = split_limbs(&P).map(|v| v as f64);
            let pinv = (P_INV_NEG & MASK) as f64;
            let (mut m, mut t): (Vec<f64>, Vec<i64>) = (Vec::new(), Vec::new());
            let (mut pend, mut carry) = (0i64, 0i64);
            for col in 0..2 * N - 1 {
                let (lo, hi) = (col.saturating_sub(N - 1), col.min(N - 1));
                let (mut ab, mut mp) = (None, None);
                for i in lo..=hi {
                    mac(&mut ab, a[i], b[col - i]);
                    if i < m.len() {
                        mac(&mut mp, m[i], p[col - i]);
                    }
                }
                let mut v = pend.wrapping_add(carry);
                pend = 0;
                let ab: Chain = ab.expect("every column has a·b terms");
                v = v.wrapping_add(bits(ab.lo.unwrap()) - cl);
                pend = pend.wrapping_add(bits(ab.hi) - ch);
                if col < N {
                    if let Some(c) = mp.as_mut() {
                        v = v.wrapping_add(bits(c.lo.take().unwrap()) - cl);
                    }
                    let (_, l) = {
                        let x = to_f(v & MASK as i64);
                        let hi = x.mul_add(pinv, C_HI);
                        (hi, x.mul_add(pinv, (C_HI + C_LO) - hi))
                    };
                    let mi = to_f(bits(l) & MASK as i64);
                    m.push(mi);
                    mac(&mut mp, mi, p[0]);
                    let c = mp.unwrap();
                    v = v.wrapping_add(bits(c.lo.unwrap()) - cl);
                    assert_eq!(v & MASK as i64, 0);
                    pend = pend.wrapping_add(bits(c.hi) - ch);
                } else {
                    let c = mp.expect("the upper columns have m·p terms");
                    v = v.wrapping_add(bits(c.lo.unwrap()) - cl);
                    pend = pend.wrapping_add(bits(c.hi) - ch);
                    t.push(v & MASK as i64);
                }
                carry = v >> W;
            }
            t.push(pend + carry);
            pack_reduced(&t)
        };
        let mut xs = crate::fq::edge_elements();
        xs.extend(random_elements(300, 23));
        let ys: Vec<Fq> = xs.iter().rev().copied().collect();
        let want = crate::cpu::reference(crate::FieldOp::Mul, &xs, &ys);
        for i in 0..xs.len() {
            assert_eq!(mont(&xs[i], &ys[i]), want[i], "{:x?} · {:x?}", xs[i], ys[i]);
            assert_eq!(
                mont(&xs[i], &xs[i]),
                crate::cpu::reference(crate::FieldOp::Sqr, &xs[i..=i], &[])[0]
            );
        }
    }

    #[test]
    fn limbs_round_trip() {
        for x in random_elements(50, 9) {
            let l = split_limbs(&x);
            let mut back = [0u64; 6];
            for (i, &v) in l.iter().enumerate() {
                let bit = i * W as usize;
                back[bit / 64] |= v << (bit % 64);
                if bit % 64 + W as usize > 64 {
                    back[bit / 64 + 1] |= v >> (64 - bit % 64);
                }
            }
            assert_eq!(back, x);
        }
    }
}
