//! Montgomery multiplication by product scanning (Comba, "FIPS") over reduced-radix limbs:
//! w-bit limbs (w = 29 or 30) held in u32 words, every partial product a 32×32→64 multiply
//! added into a 64-bit column accumulator, with one carry normalisation per column instead of
//! an add-with-carry chain per product.
//!
//! The one decision a reader must know: the radix does not divide 384, so a plain Montgomery
//! product here would divide by R' = 2^(n·w) (2⁴⁰⁶ for 14 × 29 bits, 2³⁹⁰ for 13 × 30), not by
//! the API's R = 2³⁸⁴. The multiplier therefore shifts its first operand left by
//! s = n·w − 384 bits (an exact integer shift, a few bit operations per limb, no multiply):
//! (a·2ˢ)·b·R'⁻¹ = a·b·2⁻³⁸⁴. With a, b < p < 2³⁸¹ the result is below (2^(381+s)·p + R'·p)/R'
//! < 1.125p, so one conditional subtraction makes it canonical.
//!
//! Overflow: a column sums up to 2n products below 2^(2w) plus the carry from the column
//! before. 28 products of 29-bit limbs fit one u64 (< 2^62.9); 26 products of 30-bit limbs do
//! not, so that radix keeps two accumulators (a·b terms and m·p terms) and adds their low
//! parts with a small separate carry — in every column (`dual`) or only in the 11 middle
//! columns that could overflow (`hybrid`). [`Radix::fits`] checks the bound; a unit test runs
//! it for every radix the layout table uses. Optionally a·b is one level of Karatsuba done
//! column by column in wrapping u64 arithmetic (exact because each column's true total fits).
//! On an H200 the fastest is 30-bit, Karatsuba, hybrid (`comba30kh`); products through
//! `OpUMulExtended` were slower than u64 multiplies of zero-extended words in every radix.

use helios_spirv::{KernelBuilder, Scalar, Ty, Val};

use crate::fq::{Fq, P, P_INV_NEG};

/// One reduced-radix representation and how its multiplier is emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Radix {
    /// Bits per limb (≤ 30, so a difference of two limbs and a borrow fits an i32).
    pub w: u32,
    /// Two column accumulators (a·b and m·p) instead of one.
    pub dual: bool,
    /// Products through `OpUMulExtended` (else u64 multiplies of zero-extended words).
    pub ext: bool,
    /// a·b by one level of Karatsuba (3 half-size products instead of 4), column-wise.
    pub karatsuba: bool,
    /// With `dual`: split only the middle columns, whose sums could overflow one u64.
    pub hybrid: bool,
}

impl Radix {
    /// Limbs per element: the least n with n·w ≥ 384.
    pub const fn n(self) -> usize {
        384usize.div_ceil(self.w as usize)
    }

    /// Extra left shift of the first operand: n·w − 384.
    pub const fn s(self) -> u32 {
        self.n() as u32 * self.w - 384
    }

    const fn mask(self) -> u64 {
        (1 << self.w) - 1
    }

    /// Whether no column accumulator can overflow 64 bits (limbs at their largest).
    pub fn fits(self) -> bool {
        let n = self.n() as u128;
        let prod = (self.mask() as u128).pow(2);
        let carry_in = 1u128 << (64 - self.w);
        let per_acc = if self.dual { n } else { 2 * n };
        self.w <= 30 && per_acc * prod + carry_in < 1u128 << 64
    }

    /// `x` as n limbs of w bits, least significant first.
    pub fn split(self, x: &Fq) -> Vec<u64> {
        (0..self.n())
            .map(|i| {
                let bit = i * self.w as usize;
                let (word, off) = (bit / 64, bit % 64);
                let mut v = x.get(word).copied().unwrap_or(0) >> off;
                if off + self.w as usize > 64 && word + 1 < 6 {
                    v |= x[word + 1] << (64 - off);
                }
                v & self.mask()
            })
            .collect()
    }
}

/// The Karatsuba split of the two operands and the column sums kept for reuse.
struct Kara {
    h: usize,
    x: Vec<Val>,
    y: Vec<Val>,
    u: Vec<Val>,
    v: Vec<Val>,
    /// x + y and u + v, limb by limb.
    sa: Vec<Val>,
    sb: Vec<Val>,
    /// Columns of x·u and y·v computed so far.
    l: Vec<Val>,
    hh: Vec<Val>,
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
        let (w, mask) = (self.r.w as usize, self.r.mask());
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
        let w = self.r.w as usize;
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
        let (lo_bits, hi_sh) = (
            self.c32((1 << (self.r.w - s)) - 1),
            self.k.u32(self.r.w - s),
        );
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

    /// Whether column `col` is summed in two accumulators: always for a dual radix, and for
    /// a hybrid one only where one accumulator could pass 2⁶⁴ (2 terms per a·b term, each
    /// below 2^(2w), plus a carry in below 2^(65−w)).
    fn split_column(&self, col: usize) -> bool {
        if !self.r.dual {
            return false;
        }
        if !self.r.hybrid {
            return true;
        }
        let n = self.r.n();
        let terms = 2 * (col.min(n - 1) - col.saturating_sub(n - 1) + 1) as u128;
        terms * u128::from(self.r.mask()).pow(2) + (1u128 << (65 - self.r.w)) >= 1u128 << 64
    }

    /// `acc + x·y` in u64, for u32 x, y.
    fn mac(&mut self, acc: Val, x: Val, y: Val) -> Val {
        let p = if self.r.ext {
            let (lo, hi) = self.k.umul_extended(x, y);
            let pair = self.k.vector(&[lo, hi]);
            self.k.bitcast(pair, Ty::scalar(Scalar::U64))
        } else {
            let (x, y) = (
                self.k.convert(x, Scalar::U64),
                self.k.convert(y, Scalar::U64),
            );
            self.k.mul(x, y)
        };
        self.k.add(acc, p)
    }

    fn low(&mut self, acc: Val) -> Val {
        self.k.convert(acc, Scalar::U32)
    }

    fn shift_out(&mut self, acc: Val) -> Val {
        let w = self.k.u64(u64::from(self.r.w));
        self.k.shr(acc, w)
    }

    /// a·b·2⁻³⁸⁴ mod p, canonical, for canonical a, b given as n normalised limbs.
    pub fn mont_mul(&mut self, a: &[Val], b: &[Val]) -> Vec<Val> {
        let n = self.r.n();
        let a = self.shift_in(a);
        let p = self.constant(&P);
        let mask = self.c32(self.r.mask());
        let inv = self.c32(P_INV_NEG & self.r.mask());
        let zero64 = self.k.u64(0);
        let wbits = self.k.u32(self.r.w);
        let zero32 = self.k.u32(0);
        // x: the column's a·b terms, and its m·p terms unless the column is split; while
        // columns are split, y = (the m·p terms, the carry 0..=2 of the two accumulators' low
        // parts).
        let mut x = zero64;
        let mut y: Option<(Val, Val)> = None;
        let mut m: Vec<Val> = Vec::with_capacity(n);
        let mut t: Vec<Val> = Vec::with_capacity(n);
        let mut kara = self.r.karatsuba.then(|| self.karatsuba_setup(&a, b));
        for col in 0..2 * n - 1 {
            match (self.split_column(col), y) {
                (true, None) => y = Some((zero64, zero32)),
                (false, Some((yv, c))) => {
                    x = self.k.add(x, yv);
                    let c = self.k.convert(c, Scalar::U64);
                    x = self.k.add(x, c);
                    y = None;
                }
                _ => {}
            }
            let lo = col.saturating_sub(n - 1);
            let hi = col.min(n - 1);
            if let Some(kt) = kara.as_mut() {
                x = self.karatsuba_column(kt, x, col);
            }
            // Interleave the two kinds of terms so independent multiplies sit side by side.
            for i in lo..=hi {
                if kara.is_none() {
                    x = self.mac(x, a[i], b[col - i]);
                }
                if i < m.len() {
                    match y {
                        Some((yv, c)) => y = Some((self.mac(yv, m[i], p[col - i]), c)),
                        None => x = self.mac(x, m[i], p[col - i]),
                    }
                }
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
                m.push(mk);
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
        // The last column's carry is the top limb (< 2^w: the result is < 1.125p).
        let mut top = self.low(x);
        if let Some((yv, c)) = y {
            let ly = self.low(yv);
            top = self.k.add(top, ly);
            top = self.k.add(top, c);
        }
        t.push(top);
        self.reduce_once(&t, &p)
    }

    /// Splits both operands at h = ⌈n/2⌉ limbs: a = x + y·2^(hw), b = u + v·2^(hw).
    fn karatsuba_setup(&mut self, a: &[Val], b: &[Val]) -> Kara {
        let h = a.len().div_ceil(2);
        let mut sum = |z: &[Val]| -> Vec<Val> {
            (0..h)
                .map(|i| match z.get(h + i) {
                    Some(&hi) => self.k.add(z[i], hi), // < 2^(w+1): still one u32
                    None => z[i],
                })
                .collect()
        };
        let (sa, sb) = (sum(a), sum(b));
        Kara {
            h,
            x: a[..h].to_vec(),
            y: a[h..].to_vec(),
            u: b[..h].to_vec(),
            v: b[h..].to_vec(),
            sa,
            sb,
            l: Vec::new(),
            hh: Vec::new(),
        }
    }

    /// Σ f[i]·g[col−i] over the valid i, from zero.
    fn column_sum(&mut self, f: &[Val], g: &[Val], col: usize) -> Val {
        let mut acc = self.k.u64(0);
        self.column_into(&mut acc, f, g, col);
        acc
    }

    fn column_into(&mut self, acc: &mut Val, f: &[Val], g: &[Val], col: usize) {
        for i in col.saturating_sub(g.len().saturating_sub(1))..=col.min(f.len() - 1) {
            if col - i < g.len() {
                *acc = self.mac(*acc, f[i], g[col - i]);
            }
        }
    }

    /// Adds column `col` of a·b to `acc` the Karatsuba way: a·b = L + (M − L − H)·2^(hw) +
    /// H·2^(2hw) with L = x·u, H = y·v, M = (x+y)(u+v). The identity holds column by column
    /// (no carries cross it), so everything is u64 arithmetic modulo 2⁶⁴ whose column total
    /// (the schoolbook column, which fits) comes out exact. L and H columns are kept for
    /// their second use h columns later.
    fn karatsuba_column(&mut self, kt: &mut Kara, mut acc: Val, col: usize) -> Val {
        let h = kt.h;
        if col < 2 * h - 1 {
            let l = self.column_sum(&kt.x, &kt.u, col);
            acc = self.k.add(acc, l);
            kt.l.push(l);
        }
        if col >= h && col - h < 2 * h - 1 {
            let j = col - h;
            self.column_into(&mut acc, &kt.sa, &kt.sb, j);
            acc = self.k.sub(acc, kt.l[j]);
            if j < 2 * kt.y.len() - 1 {
                let hj = self.column_sum(&kt.y, &kt.v, j);
                acc = self.k.sub(acc, hj);
                kt.hh.push(hj);
            }
        }
        if col >= 2 * h && col - 2 * h < kt.hh.len() {
            acc = self.k.add(acc, kt.hh[col - 2 * h]);
        }
        acc
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
        for (w, dual, n, s) in [(29, false, 14, 22), (29, true, 14, 22), (30, true, 13, 6)] {
            let r = Radix {
                w,
                dual,
                ext: false,
                karatsuba: false,
                hybrid: false,
            };
            assert_eq!((r.n(), r.s()), (n, s));
            assert!(r.fits(), "{r:?}");
            for x in random_elements(50, 3) {
                let limbs = r.split(&x);
                let mut back = [0u64; 6];
                for (i, &l) in limbs.iter().enumerate() {
                    assert!(l < 1 << w);
                    let bit = i * w as usize;
                    back[bit / 64] |= l << (bit % 64);
                    if bit % 64 + w as usize > 64 && bit / 64 + 1 < 6 {
                        back[bit / 64 + 1] |= l >> (64 - bit % 64);
                    }
                }
                assert_eq!(back, x);
            }
        }
        // A hybrid 30-bit radix splits exactly the columns with 16 or more terms.
        let mut k = helios_spirv::KernelBuilder::new(
            "split",
            helios_spirv::Binding::DeviceAddress,
            [64, 1, 1],
        );
        let r = crate::Layout::Comba30H.radix().unwrap();
        let c = Comba { k: &mut k, r };
        let split: Vec<usize> = (0..2 * r.n() - 1).filter(|&i| c.split_column(i)).collect();
        assert_eq!(split, (7..=17).collect::<Vec<_>>());
        // 30-bit limbs in one accumulator would overflow: that is why that radix is dual.
        assert!(!Radix {
            w: 30,
            dual: false,
            ext: false,
            karatsuba: false,
            hybrid: false,
        }
        .fits());
    }
}
