//! Montgomery multiplication by product scanning (Comba, "FIPS") over reduced-radix limbs:
//! 13 × 30-bit limbs held in u32 words, every partial product a 32×32→64 multiply added into
//! a 64-bit column accumulator, with one carry normalisation per column instead of an
//! add-with-carry chain per product.
//!
//! The one decision a reader must know: the radix does not divide 384, so a plain Montgomery
//! product here ([`Comba::redc_mul`]) divides by R' = 2³⁹⁰, not by the API's R = 2³⁸⁴. The
//! API's product ([`Comba::mont_mul`]) therefore shifts its first operand left by
//! s = 390 − 384 bits (an exact integer shift, a few bit operations per limb, no multiply):
//! (a·2ˢ)·b·R'⁻¹ = a·b·2⁻³⁸⁴. With a, b < p < 2³⁸¹ the result is below
//! (2^(381+s)·p + R'·p)/R' < 1.125p, so one conditional subtraction makes it canonical. A
//! chain of products (`Arith::chain_mul`) instead keeps its values scaled by 2ˢ, so each
//! product is a plain `redc_mul`, and may skip the conditional subtraction: with a, b < 2p and
//! 4p < R' the result stays below 2p.
//!
//! Overflow: a column sums up to 2n = 26 products below 2⁶⁰ plus the carry from the column
//! before, which one u64 does not hold in the worst case. So the columns whose exact bound
//! (the operands' bit lengths, p's own limbs) reaches 2⁶⁴ keep two accumulators (a·b terms
//! and m·p terms) and add their low parts with a small separate carry: 3 of 25 for the
//! products the kernels do ([`Radix::split_columns`]). [`Radix::fits`] checks the worst case.
//!
//! Products: a·b by one or two levels of Karatsuba ([`Product`]), the reduction's m·p
//! schoolbook, column by column in wrapping u64 arithmetic (exact because each column's true
//! total fits). Which mix is fastest is measured, not derived: NVIDIA's compiler turns each
//! 32×32→64 multiply-add into one IMAD.WIDE.U32, which costs more than the other
//! instructions (the cost model, from SASS read back from the pipeline cache, is in
//! bench/results/2026-11-22-field-chain.md), so a Karatsuba level pays only where its extra
//! adds cost less than the multiplies it saves. That file also has the variants that lost and
//! were removed: 29-bit limbs, one or two accumulators in every column, products through
//! `OpUMulExtended` (15–20% slower than u64 multiplies of zero-extended words) and a Karatsuba
//! m·p (fewer multiplies, no faster).

use helios_spirv::{KernelBuilder, Scalar, Val};

use crate::fq::{Fq, P, P_BITS, P_INV_NEG};

/// Bits per limb (≤ 30, so a difference of two limbs and a borrow fits an i32).
pub const W: u32 = 30;

/// The reduced-radix multiplier: 13 × 30-bit limbs, and how a·b is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Radix {
    /// Levels of Karatsuba for a·b (each: 3 half-size products instead of 4), column-wise.
    pub karatsuba: u32,
}

impl Radix {
    /// Limbs per element: the least n with n·w ≥ 384.
    pub const fn n(self) -> usize {
        384usize.div_ceil(W as usize)
    }

    /// Extra left shift of the first operand: n·w − 384.
    pub const fn s(self) -> u32 {
        self.n() as u32 * W - 384
    }

    const fn mask(self) -> u64 {
        (1 << W) - 1
    }

    /// Whether no column accumulator can overflow 64 bits (limbs at their largest, every
    /// column split in two accumulators of n products each).
    #[cfg(test)]
    pub fn fits(self) -> bool {
        let n = self.n() as u128;
        let prod = (self.mask() as u128).pow(2);
        let carry_in = 1u128 << (64 - W);
        // Karatsuba operand sums gain a bit per level and must stay u32 factors.
        W + self.karatsuba <= 32 && n * prod + carry_in < 1u128 << 64
    }

    /// 32×32→64 multiplies per Montgomery product, besides the n 32-bit ones that make m:
    /// a·b by its Karatsuba levels, m·p schoolbook (n²).
    #[cfg(test)]
    pub fn multiplies(self) -> usize {
        fn product(n: usize, levels: u32) -> usize {
            if levels == 0 || n < 2 {
                return n * n;
            }
            let h = n.div_ceil(2);
            2 * product(h, levels - 1) + product(n - h, levels - 1)
        }
        let n = self.n();
        product(n, self.karatsuba) + n * n
    }

    /// Which columns of a product of operands below 2^a_bits and 2^b_bits are summed in two
    /// accumulators: exactly those whose one-accumulator total could reach 2⁶⁴. That bound is
    /// exact per column: the operands' top limbs are as short as their bit bounds make them,
    /// the m·p terms use p's own limbs, and the carry in is the previous column's bound >> w.
    /// For a chain's operands (below 2p < 2³⁸²) that is 3 columns instead of the 11 that
    /// full-width limbs would give.
    pub fn split_columns(self, a_bits: u32, b_bits: u32) -> Vec<bool> {
        let (n, w) = (self.n(), W as usize);
        let mask = u128::from(self.mask());
        let limb_max = |bits: u32, i: usize| -> u128 {
            let (bits, lo) = (bits as usize, i * w);
            match bits.saturating_sub(lo) {
                0 => 0,
                b if b >= w => mask,
                b => (1 << b) - 1,
            }
        };
        let p = self.split(&P);
        let mut carry = 0u128;
        (0..2 * n - 1)
            .map(|c| {
                let ab: u128 = terms(c, n, n)
                    .map(|i| limb_max(a_bits, i) * limb_max(b_bits, c - i))
                    .sum();
                let mp: u128 = terms(c, n, n).map(|i| mask * u128::from(p[c - i])).sum();
                // + 2: the low-part carry of a split column; + 4: the split carries' rounding.
                let total = ab + mp + carry + 2;
                carry = (total >> w) + 4;
                total >= 1 << 64
            })
            .collect()
    }

    /// `x` as n limbs of w bits, least significant first.
    pub fn split(self, x: &Fq) -> Vec<u64> {
        (0..self.n())
            .map(|i| {
                let bit = i * W as usize;
                let (word, off) = (bit / 64, bit % 64);
                let mut v = x.get(word).copied().unwrap_or(0) >> off;
                if off + W as usize > 64 && word + 1 < 6 {
                    v |= x[word + 1] << (64 - off);
                }
                v & self.mask()
            })
            .collect()
    }
}

/// The i of column c's terms f_i·g_(c−i) in a product of f_len by g_len limbs, ascending:
/// i < f_len and c − i < g_len (empty where there are none).
fn terms(c: usize, f_len: usize, g_len: usize) -> std::ops::Range<usize> {
    (c + 1).saturating_sub(g_len)..(c + 1).min(f_len)
}

/// The columns of f·g as wrapping u64 sums, emitted lazily (a column's multiplies appear
/// when the multiplier first asks for it): schoolbook at the leaves, one Karatsuba level per
/// inner node. With L = f_lo·g_lo, H = f_hi·g_hi, M = (f_lo + f_hi)(g_lo + g_hi) and
/// B = 2^(hw), f·g = L + (M − L − H)·B + H·B². A node keeps D_k = L_k − H_(k−h), so that
/// column c is D_c − D_(c−h) + M_(c−h): two adds per column and one per D_k, where adding
/// L and H where they appear would take four per column. The identity holds column by
/// column (no carry crosses a column), so the sums may wrap: whatever column total the
/// caller finally needs fits 64 bits and comes out exact. M is read once and multiplies
/// straight into the caller's accumulator.
struct Product {
    f: Vec<Val>,
    g: Vec<Val>,
    split: Option<Split>,
}

/// One Karatsuba level: h, the sub-products [L, H, M], and the D_k emitted so far (a value,
/// and whether it stands for −value: D_k = −H_(k−h) where L has no column k).
struct Split {
    h: usize,
    parts: Box<[Product; 3]>,
    d: Vec<Option<(Val, bool)>>,
}

impl Product {
    /// f·g for equal-length operands by `levels` of Karatsuba. Each level's operand sums are
    /// one bit wider; [`Radix::fits`] keeps them within a u32.
    fn new(k: &mut KernelBuilder, f: &[Val], g: &[Val], levels: u32) -> Self {
        let n = f.len();
        let split = (levels > 0 && n >= 2).then(|| {
            let h = n.div_ceil(2);
            let mut sum = |z: &[Val]| -> Vec<Val> {
                (0..h)
                    .map(|i| z.get(h + i).map_or(z[i], |&hi| k.add(z[i], hi)))
                    .collect()
            };
            let (sf, sg) = (sum(f), sum(g));
            let lo = Product::new(k, &f[..h], &g[..h], levels - 1);
            let hi = Product::new(k, &f[h..], &g[h..], levels - 1);
            let mid = Product::new(k, &sf, &sg, levels - 1);
            let d = vec![None; h + hi.columns()];
            Split {
                h,
                parts: Box::new([lo, hi, mid]),
                d,
            }
        });
        Product {
            f: f.to_vec(),
            g: g.to_vec(),
            split,
        }
    }

    fn columns(&self) -> usize {
        self.f.len() + self.g.len() - 1
    }

    /// `acc + column c` (acc unchanged past the last column).
    fn add_to(&mut self, cb: &mut Comba, mut acc: Option<Val>, c: usize) -> Option<Val> {
        if c >= self.columns() {
            return acc;
        }
        let Some(sp) = self.split.as_mut() else {
            for i in terms(c, self.f.len(), self.g.len()) {
                acc = Some(cb.mac_opt(acc, self.f[i], self.g[c - i]));
            }
            return acc;
        };
        let h = sp.h;
        if c < sp.d.len() {
            acc = Some(sp.add_d(cb, acc, c, false));
        }
        if c >= h {
            let [_, _, mid] = &mut *sp.parts;
            acc = mid.add_to(cb, acc, c - h);
            if c - h < sp.d.len() {
                acc = Some(sp.add_d(cb, acc, c - h, true));
            }
        }
        acc
    }
}

impl Split {
    /// `acc ± D_k`, emitting D_k on first use.
    fn add_d(&mut self, cb: &mut Comba, acc: Option<Val>, k: usize, minus: bool) -> Val {
        let (v, negated) = match self.d[k] {
            Some(d) => d,
            None => {
                let [lo, hi, _] = &mut *self.parts;
                let l = lo.add_to(cb, None, k);
                let hk = k.checked_sub(self.h).and_then(|j| hi.add_to(cb, None, j));
                let d = cb.difference(l, hk);
                self.d[k] = Some(d);
                d
            }
        };
        cb.add_signed(acc, v, minus != negated)
    }
}

/// Emits reduced-radix arithmetic into a kernel.
pub struct Comba<'k> {
    pub k: &'k mut KernelBuilder,
    pub r: Radix,
}

impl Comba<'_> {
    fn c32(&mut self, v: u64) -> Val {
        self.k.u32(v as u32)
    }

    /// Twelve u32 words (the element's bytes) to n limbs of w bits.
    pub fn unpack_words(&mut self, words: &[Val]) -> Vec<Val> {
        let (w, mask) = (W as usize, self.r.mask());
        let mask = self.c32(mask);
        (0..self.r.n())
            .map(|i| {
                let bit = i * w;
                let (j, off) = (bit / 32, (bit % 32) as u32);
                let mut v = words[j];
                if off > 0 {
                    let sh = self.k.u32(off);
                    v = self.k.shr(v, sh);
                }
                if off as usize + w > 32 && j + 1 < words.len() {
                    let sh = self.k.u32(32 - off);
                    let hi = self.k.shl(words[j + 1], sh);
                    v = self.k.or(v, hi);
                }
                self.k.and(v, mask)
            })
            .collect()
    }

    /// n normalised limbs (each < 2^w, value < 2³⁸⁴) back to twelve u32 words.
    pub fn pack_words(&mut self, limbs: &[Val]) -> Vec<Val> {
        let w = W as usize;
        (0..12)
            .map(|j| {
                let (lo, hi) = (32 * j, 32 * j + 32);
                let mut word: Option<Val> = None;
                for (i, &limb) in limbs.iter().enumerate() {
                    let (a, b) = (i * w, i * w + w);
                    if b <= lo || a >= hi {
                        continue;
                    }
                    let part = if a >= lo {
                        let sh = self.k.u32((a - lo) as u32);
                        self.k.shl(limb, sh)
                    } else {
                        let sh = self.k.u32((lo - a) as u32);
                        self.k.shr(limb, sh)
                    };
                    word = Some(match word {
                        None => part,
                        Some(x) => self.k.or(x, part),
                    });
                }
                word.unwrap_or_else(|| self.k.u32(0))
            })
            .collect()
    }

    /// A constant element as limbs.
    pub fn constant(&mut self, x: &Fq) -> Vec<Val> {
        self.r.split(x).into_iter().map(|v| self.c32(v)).collect()
    }

    /// `a · 2ˢ` as n limbs; exact for a < 2³⁸⁴.
    fn shift_in(&mut self, a: &[Val]) -> Vec<Val> {
        let s = self.r.s();
        if s == 0 {
            return a.to_vec();
        }
        let (lo_bits, hi_sh) = (self.c32((1 << (W - s)) - 1), self.k.u32(W - s));
        let s = self.k.u32(s);
        (0..a.len())
            .map(|i| {
                let low = self.k.and(a[i], lo_bits);
                let v = self.k.shl(low, s);
                if i == 0 {
                    v
                } else {
                    let carry = self.k.shr(a[i - 1], hi_sh);
                    self.k.or(v, carry)
                }
            })
            .collect()
    }

    /// `acc + x·y` in u64, for u32 x, y.
    fn mac(&mut self, acc: Val, x: Val, y: Val) -> Val {
        let p = self.wide(x, y);
        self.k.add(acc, p)
    }

    /// `x·y` in u64, for u32 x, y.
    fn wide(&mut self, x: Val, y: Val) -> Val {
        let (x, y) = (
            self.k.convert(x, Scalar::U64),
            self.k.convert(y, Scalar::U64),
        );
        self.k.mul(x, y)
    }

    fn low(&mut self, acc: Val) -> Val {
        self.k.convert(acc, Scalar::U32)
    }

    fn shift_out(&mut self, acc: Val) -> Val {
        let w = self.k.u64(u64::from(W));
        self.k.shr(acc, w)
    }

    /// `acc + x·y` where an absent accumulator is zero.
    fn mac_opt(&mut self, acc: Option<Val>, x: Val, y: Val) -> Val {
        match acc {
            Some(acc) => self.mac(acc, x, y),
            None => self.wide(x, y),
        }
    }

    fn add_opt(&mut self, acc: Option<Val>, v: Val) -> Val {
        match acc {
            Some(acc) => self.k.add(acc, v),
            None => v,
        }
    }

    fn sub_opt(&mut self, acc: Option<Val>, v: Val) -> Val {
        let acc = acc.unwrap_or_else(|| self.k.u64(0));
        self.k.sub(acc, v)
    }

    /// `acc − v` where `negative`, else `acc + v`.
    fn add_signed(&mut self, acc: Option<Val>, v: Val, negative: bool) -> Val {
        if negative {
            self.sub_opt(acc, v)
        } else {
            self.add_opt(acc, v)
        }
    }

    /// The Karatsuba D_k = L_k − H_(k−h) from the columns that exist, as (value, whether it
    /// stands for −value): D_k = −H_(k−h) where L has no column k.
    fn difference(&mut self, l: Option<Val>, h: Option<Val>) -> (Val, bool) {
        match (l, h) {
            (Some(l), Some(h)) => (self.k.sub(l, h), false),
            (Some(l), None) => (l, false),
            (None, Some(h)) => (h, true),
            (None, None) => unreachable!("D_k for k < h + H's columns has a term"),
        }
    }

    /// `acc` plus column `col`'s m·p terms over the m limbs known so far (all but m_col
    /// while col < n: m_col zeroes column col, so it is known only once the rest is summed).
    fn add_mp(&mut self, mut acc: Val, col: usize, m: &[Val], p: &[Val]) -> Val {
        for i in terms(col, m.len(), p.len()) {
            acc = self.mac(acc, m[i], p[col - i]);
        }
        acc
    }

    /// a·b·2⁻³⁸⁴ mod p, canonical, for canonical a, b given as n normalised limbs.
    pub fn mont_mul(&mut self, a: &[Val], b: &[Val]) -> Vec<Val> {
        let a = self.shift_in(a);
        self.redc_mul(&a, b, (P_BITS + self.r.s(), P_BITS), true)
    }

    /// The Montgomery product with respect to the radix's own R' = 2^(n·w): a·b·R'⁻¹ mod p,
    /// for a < 2^a_bits and b < 2^b_bits (`bits`), a·b < 4p². With `canonical` the result is
    /// below p; without, below 2p (the final conditional subtraction is left out, which a
    /// chain of products may do: 4p < R', so (a·b + m·p)/R' < 2p again).
    pub fn redc_mul(
        &mut self,
        a: &[Val],
        b: &[Val],
        bits: (u32, u32),
        canonical: bool,
    ) -> Vec<Val> {
        let n = self.r.n();
        let split = self.r.split_columns(bits.0, bits.1);
        let p = self.constant(&P);
        let mask = self.c32(self.r.mask());
        let inv = self.c32(P_INV_NEG & self.r.mask());
        let zero64 = self.k.u64(0);
        let wbits = self.k.u32(W);
        let zero32 = self.k.u32(0);
        let mut ab = Product::new(self.k, a, b, self.r.karatsuba);
        // x: the column's a·b terms, and its m·p terms unless the column is split; while
        // columns are split, y = (the m·p terms, the carry 0..=2 of the two accumulators' low
        // parts).
        let mut x = zero64;
        let mut y: Option<(Val, Val)> = None;
        let mut m: Vec<Val> = Vec::with_capacity(n);
        let mut t: Vec<Val> = Vec::with_capacity(n);
        for (col, &split_col) in split.iter().enumerate() {
            match (split_col, y) {
                (true, None) => y = Some((zero64, zero32)),
                (false, Some((yv, c))) => {
                    x = self.k.add(x, yv);
                    let c = self.k.convert(c, Scalar::U64);
                    x = self.k.add(x, c);
                    y = None;
                }
                _ => {}
            }
            x = ab.add_to(self, Some(x), col).expect("an accumulator");
            match y {
                Some((yv, c)) => y = Some((self.add_mp(yv, col, &m, &p), c)),
                None => x = self.add_mp(x, col, &m, &p),
            }
            let lx = self.low(x);
            let sum_low = match y {
                Some((yv, c)) => {
                    let ly = self.low(yv);
                    let s = self.k.add(lx, ly);
                    self.k.add(s, c)
                }
                None => lx,
            };
            if col < n {
                // m = low · (−p⁻¹) mod 2^w zeroes the column's low w bits.
                let mk = self.k.mul(sum_low, inv);
                let mk = self.k.and(mk, mask);
                match y {
                    Some((yv, c)) => {
                        let y2 = self.mac(yv, mk, p[0]);
                        // (x + y2 + c) mod 2^w = 0: the carry out of the low parts is
                        // ((x mod 2^w) + (y2 mod 2^w) + c) >> w.
                        let ly2 = self.low(y2);
                        let (mx, my) = (self.k.and(lx, mask), self.k.and(ly2, mask));
                        let s = self.k.add(mx, my);
                        let s = self.k.add(s, c);
                        y = Some((y2, self.k.shr(s, wbits)));
                    }
                    None => x = self.mac(x, mk, p[0]),
                }
                m.push(mk);
            } else {
                match y {
                    Some((yv, c)) => {
                        let ly = self.low(yv);
                        let (mx, my) = (self.k.and(lx, mask), self.k.and(ly, mask));
                        let s = self.k.add(mx, my);
                        let s = self.k.add(s, c);
                        t.push(self.k.and(s, mask));
                        y = Some((yv, self.k.shr(s, wbits)));
                    }
                    None => t.push(self.k.and(lx, mask)),
                }
            }
            x = self.shift_out(x);
            if let Some((yv, c)) = y {
                y = Some((self.shift_out(yv), c));
            }
        }
        // The last column's carry is the top limb (< 2^w: the result is below 2p < 2^(n·w)).
        let mut top = self.low(x);
        if let Some((yv, c)) = y {
            let ly = self.low(yv);
            top = self.k.add(top, ly);
            top = self.k.add(top, c);
        }
        t.push(top);
        if canonical {
            self.reduce_once(&t, &p)
        } else {
            t
        }
    }

    /// `t − p` if t ≥ p, else t, for normalised t < 2p.
    fn reduce_once(&mut self, t: &[Val], p: &[Val]) -> Vec<Val> {
        let mask = self.c32(self.r.mask());
        let sign = self.k.u32(31);
        let mut borrow = self.k.u32(0);
        let mut d = Vec::with_capacity(t.len());
        for (&ti, &pi) in t.iter().zip(p) {
            // |ti − pi − borrow| < 2³¹ since limbs are below 2³⁰: bit 31 is the borrow.
            let v = self.k.sub(ti, pi);
            let v = self.k.sub(v, borrow);
            borrow = self.k.shr(v, sign);
            d.push(self.k.and(v, mask));
        }
        let zero = self.k.u32(0);
        let keep = self.k.ne(borrow, zero); // t < p
        t.iter()
            .zip(d)
            .map(|(&ti, di)| self.k.select(keep, ti, di))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fq::random_elements;

    #[test]
    fn radices_fit_and_split_round_trips() {
        for layout in crate::Layout::ALL {
            let Some(r) = layout.radix() else { continue };
            assert_eq!((r.n(), r.s()), (13, 6));
            assert!(r.fits(), "{r:?}");
            for x in random_elements(50, 3) {
                let limbs = r.split(&x);
                let mut back = [0u64; 6];
                for (i, &l) in limbs.iter().enumerate() {
                    assert!(l < 1 << W);
                    let bit = i * W as usize;
                    back[bit / 64] |= l << (bit % 64);
                    if bit % 64 + W as usize > 64 && bit / 64 + 1 < 6 {
                        back[bit / 64 + 1] |= l >> (64 - bit % 64);
                    }
                }
                assert_eq!(back, x);
            }
        }
        // Only the columns whose exact bound reaches 2⁶⁴ are split: five for full-width
        // operands, three for a chain's (< 2p) and the API's (a·2⁶ and b < p).
        let r = crate::Layout::Comba30K2H.radix().unwrap();
        let split = |a, b| -> Vec<usize> {
            let s = r.split_columns(a, b);
            (0..s.len()).filter(|&i| s[i]).collect()
        };
        assert_eq!(split(390, 390), (10..=14).collect::<Vec<_>>());
        assert_eq!(split(382, 382), (10..=12).collect::<Vec<_>>());
        assert_eq!(split(387, 381), (10..=12).collect::<Vec<_>>());
        // Why any column is split: 2n products of 30-bit limbs overflow one u64.
        let prod = u128::from(r.mask()).pow(2);
        assert!(2 * r.n() as u128 * prod >= 1 << 64);
    }
}
