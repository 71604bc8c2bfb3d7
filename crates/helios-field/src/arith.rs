//! Multi-limb Fq arithmetic emitted into the kernel IR: add/sub/neg modulo p, the Montgomery
//! product (CIOS) and a dedicated Montgomery square (SOS), all fully unrolled, over 12 × 32-bit
//! words (the element's bytes).
//!
//! The one decision a reader must know: the multiplier is a parameter ([`Layout`]), because
//! the fastest one is the one the GPU's compiler turns into the fewest instructions, which is
//! measured, not derived (`helios field bench --sweep`). `U32Mix` multiplies the 12 words
//! directly (products through `OpUMulExtended`, sums and carries through u64 arithmetic); the
//! `Comba*` layouts convert the words to 13 × 30-bit limbs around a product-scanning
//! multiplier ([`crate::comba`]). Add/sub/neg are the same code for every layout. The other
//! layouts measured (other word sizes and carry primitives, 29-bit limbs, Karatsuba
//! reductions, products on the FP64 pipe, several elements per invocation) lost and were
//! removed; their figures are in bench/results/2026-11-22-field-h200.md,
//! 2026-11-22-field-h100-fp64.md and 2026-11-22-field-chain.md.
//!
//! p < 2³⁸¹ leaves the top limb's highest bits clear, which allows the "no-carry" CIOS
//! variant (no extra carry word per row) and guarantees that a + b never leaves 12 words.

use helios_spirv::{KernelBuilder, Scalar, Ty, Val};

use crate::comba::{Comba, Radix};
use crate::fq::{pow2_mod_p, Fq, P, P_BITS, P_INV_NEG, R_MOD_P};

/// How an Fq element is multiplied inside a kernel. Each layout is kept for a reason the
/// measurements give (bench/results/2026-11-22-field-chain.md, H100 and H200).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// 12 × u32, CIOS; products through `OpUMulExtended`, sums and carries through u64
    /// arithmetic. The plain schoolbook baseline the sweep compares against, and the
    /// add/sub/neg of every layout.
    U32Mix,
    /// Products in 13 × 30-bit limbs by product scanning, a·b by one level of Karatsuba,
    /// two u64 accumulators only in the columns that could overflow one. A slower multiplier
    /// than `Comba30K2H` but faster in the array ops the API runs, with fewer registers.
    Comba30KH,
    /// As `Comba30KH` with a·b by two levels of Karatsuba (278 wide multiplies instead of
    /// 303): the fastest multiplier measured, and the default.
    Comba30K2H,
}

impl Layout {
    pub const ALL: [Layout; 3] = [Layout::U32Mix, Layout::Comba30KH, Layout::Comba30K2H];

    pub const fn name(self) -> &'static str {
        match self {
            Layout::U32Mix => "u32mix",
            Layout::Comba30KH => "comba30kh",
            Layout::Comba30K2H => "comba30k2h",
        }
    }

    /// The reduced-radix multiplier, for the product-scanning layouts.
    pub(crate) const fn radix(self) -> Option<Radix> {
        match self {
            Layout::U32Mix => None,
            Layout::Comba30KH => Some(Radix { karatsuba: 1 }),
            Layout::Comba30K2H => Some(Radix { karatsuba: 2 }),
        }
    }

    pub fn from_name(name: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.name() == name)
    }
}

/// Words per element.
pub const WORDS: usize = 12;

/// `x` as 12 u32 words, least significant first.
fn split_words(x: &Fq) -> Vec<u64> {
    x.iter().flat_map(|&l| [l & 0xffff_ffff, l >> 32]).collect()
}

/// An element in registers: [`WORDS`] words, or a multiplier's limbs, least significant first.
pub type Limbs = Vec<Val>;

/// Emits limb arithmetic for one layout into a kernel.
pub struct Arith<'k> {
    pub k: &'k mut KernelBuilder,
    pub layout: Layout,
}

impl Arith<'_> {
    /// A word constant.
    pub fn word(&mut self, v: u64) -> Val {
        self.k.constant_bits(Ty::scalar(Scalar::U32), v)
    }

    /// A constant element (e.g. p, R² mod p) as words.
    pub fn constant(&mut self, x: &Fq) -> Limbs {
        split_words(x).into_iter().map(|w| self.word(w)).collect()
    }

    fn split_u64(&mut self, t: Val) -> (Val, Val) {
        let pair = self.k.bitcast(t, Ty::vector(Scalar::U32, 2));
        (self.k.extract(pair, 0), self.k.extract(pair, 1))
    }

    fn widen(&mut self, x: Val) -> Val {
        self.k.convert(x, Scalar::U64)
    }

    /// `(lo, hi)` of `a * b + c + d`; cannot overflow two words. The product comes from
    /// `OpUMulExtended` and the sums from u64 arithmetic: in this CIOS that measured faster
    /// than a u64 multiply of zero-extended words, and 2.5× faster than `OpIAddCarry` chains.
    pub fn mac(&mut self, a: Val, b: Val, c: Val, d: Val) -> (Val, Val) {
        let (lo, hi) = self.k.umul_extended(a, b);
        let pair = self.k.vector(&[lo, hi]);
        let p = self.k.bitcast(pair, Ty::scalar(Scalar::U64));
        let (c, d) = (self.widen(c), self.widen(d));
        let t = self.k.add(p, c);
        let t = self.k.add(t, d);
        self.split_u64(t)
    }

    /// `(a + b + carry mod 2³², carry out)` with carries 0 or 1.
    pub fn adc(&mut self, a: Val, b: Val, carry: Val) -> (Val, Val) {
        let (a, b, c) = (self.widen(a), self.widen(b), self.widen(carry));
        let t = self.k.add(a, b);
        let t = self.k.add(t, c);
        self.split_u64(t)
    }

    /// `(a - b - borrow mod 2³², borrow out)` with borrows 0 or 1.
    pub fn sbb(&mut self, a: Val, b: Val, borrow: Val) -> (Val, Val) {
        let (a, b, c) = (self.widen(a), self.widen(b), self.widen(borrow));
        let t = self.k.sub(a, b);
        let t = self.k.sub(t, c);
        let (lo, hi) = self.split_u64(t);
        let one = self.word(1);
        (lo, self.k.and(hi, one)) // hi is all ones after a borrow, else 0
    }

    /// `x - p` if `x ≥ p`, else `x`, for x < 2p.
    pub fn reduce_once(&mut self, x: &[Val]) -> Limbs {
        let p = self.constant(&P);
        let mut borrow = self.word(0);
        let mut d = Vec::with_capacity(x.len());
        for (&xi, &pi) in x.iter().zip(&p) {
            let (di, b) = self.sbb(xi, pi, borrow);
            d.push(di);
            borrow = b;
        }
        let zero = self.word(0);
        let keep = self.k.ne(borrow, zero); // x < p: keep x
        x.iter()
            .zip(d)
            .map(|(&xi, di)| self.k.select(keep, xi, di))
            .collect()
    }

    /// (a + b) mod p.
    pub fn add_mod(&mut self, a: &[Val], b: &[Val]) -> Limbs {
        let mut carry = self.word(0);
        let mut s = Vec::with_capacity(a.len());
        for (&ai, &bi) in a.iter().zip(b) {
            let (si, c) = self.adc(ai, bi, carry);
            s.push(si);
            carry = c;
        }
        // a + b < 2p < 2^382: the last carry is always 0.
        self.reduce_once(&s)
    }

    /// (a - b) mod p.
    pub fn sub_mod(&mut self, a: &[Val], b: &[Val]) -> Limbs {
        let mut borrow = self.word(0);
        let mut d = Vec::with_capacity(a.len());
        for (&ai, &bi) in a.iter().zip(b) {
            let (di, br) = self.sbb(ai, bi, borrow);
            d.push(di);
            borrow = br;
        }
        let p = self.constant(&P);
        let mut carry = self.word(0);
        let mut e = Vec::with_capacity(a.len());
        for (&di, &pi) in d.iter().zip(&p) {
            let (ei, c) = self.adc(di, pi, carry);
            e.push(ei);
            carry = c;
        }
        let zero = self.word(0);
        let wrapped = self.k.ne(borrow, zero);
        e.into_iter()
            .zip(d)
            .map(|(ei, di)| self.k.select(wrapped, ei, di))
            .collect()
    }

    /// (-a) mod p: p - a, or 0 for a = 0.
    pub fn neg_mod(&mut self, a: &[Val]) -> Limbs {
        let p = self.constant(&P);
        let mut borrow = self.word(0);
        let mut d = Vec::with_capacity(a.len());
        for (&pi, &ai) in p.iter().zip(a) {
            let (di, br) = self.sbb(pi, ai, borrow);
            d.push(di);
            borrow = br;
        }
        let mut any = a[0];
        for &ai in &a[1..] {
            any = self.k.or(any, ai);
        }
        let zero = self.word(0);
        let nonzero = self.k.ne(any, zero);
        d.into_iter()
            .map(|di| self.k.select(nonzero, di, zero))
            .collect()
    }

    /// m = t · (-p⁻¹) mod 2³².
    fn reduction_factor(&mut self, t: Val) -> Val {
        let inv = self.word(P_INV_NEG & 0xffff_ffff);
        self.k.mul(t, inv)
    }

    /// The product-scanning emitter of a `Comba*` layout.
    fn comba(&mut self) -> Option<Comba<'_>> {
        let r = self.layout.radix()?;
        Some(Comba { k: self.k, r })
    }

    /// An element in the multiplier's register form (the limbs `mont_mul_form` takes and
    /// returns): the words, or the reduced-radix limbs of a `Comba*` layout.
    pub fn enter_mul_form(&mut self, x: &[Val]) -> Limbs {
        match self.comba() {
            Some(mut c) => c.unpack_words(x),
            None => x.to_vec(),
        }
    }

    /// Back from the multiplier's register form to the words.
    pub fn leave_mul_form(&mut self, x: &[Val]) -> Limbs {
        match self.comba() {
            Some(mut c) => c.pack_words(x),
            None => x.to_vec(),
        }
    }

    /// An element in the form a chain of dependent products keeps it in ([`Arith::chain_mul`]):
    /// the multiplier's register form, and for a `Comba*` layout also scaled by 2ˢ
    /// (s = n·w − 384, one product with the constant 2^(384+s) mod p), so that each product
    /// in the chain is a Montgomery product with respect to the radix's own R' = 2^(n·w),
    /// without the operand shift that maps R' onto the API's R = 2³⁸⁴.
    pub fn enter_chain_form(&mut self, x: &[Val]) -> Limbs {
        let limbs = self.enter_mul_form(x);
        match self.comba() {
            Some(mut c) if c.r.s() > 0 => {
                let scale = c.constant(&pow2_mod_p(384 + c.r.s()));
                c.mont_mul(&limbs, &scale)
            }
            _ => limbs,
        }
    }

    /// One product of a chain, in chain form. With `canonical` false a `Comba*` layout skips
    /// the final conditional subtraction (results stay below 2p, which its next product
    /// accepts); other layouts always return canonical results.
    pub fn chain_mul(&mut self, a: &[Val], b: &[Val], canonical: bool) -> Limbs {
        // Operands of a lazy chain are below 2p, of a canonical one below p.
        let bits = P_BITS + u32::from(!canonical);
        match self.comba() {
            Some(mut c) => c.redc_mul(a, b, (bits, bits), canonical),
            None => self.mont_mul_form(a, b),
        }
    }

    /// Back from chain form to the words, canonical (one product with R mod p for
    /// a `Comba*` layout: x·2³⁸⁴·R'⁻¹ = x·2⁻ˢ).
    pub fn leave_chain_form(&mut self, x: &[Val]) -> Limbs {
        let limbs = match self.comba() {
            Some(mut c) => {
                let r = c.constant(&R_MOD_P);
                c.redc_mul(x, &r, (P_BITS + 1, P_BITS), true)
            }
            None => x.to_vec(),
        };
        self.leave_mul_form(&limbs)
    }

    /// Montgomery product a·b·R⁻¹ mod p of canonical a, b in the multiplier's register form.
    pub fn mont_mul_form(&mut self, a: &[Val], b: &[Val]) -> Limbs {
        match self.comba() {
            Some(mut c) => c.mont_mul(a, b),
            None => self.cios_mul(a, b),
        }
    }

    /// Montgomery product a·b·R⁻¹ mod p for canonical a, b.
    pub fn mont_mul(&mut self, a: &[Val], b: &[Val]) -> Limbs {
        let (a, b) = (self.enter_mul_form(a), self.enter_mul_form(b));
        let r = self.mont_mul_form(&a, &b);
        self.leave_mul_form(&r)
    }

    /// Montgomery product with a constant: a·x·R⁻¹ mod p.
    pub fn mont_mul_by(&mut self, a: &[Val], x: &Fq) -> Limbs {
        let a = self.enter_mul_form(a);
        let x = match self.comba() {
            Some(mut c) => c.constant(x),
            None => self.constant(x),
        };
        let r = self.mont_mul_form(&a, &x);
        self.leave_mul_form(&r)
    }

    /// CIOS, no-carry variant, in words.
    fn cios_mul(&mut self, a: &[Val], b: &[Val]) -> Limbs {
        let n = a.len();
        let p = self.constant(&P);
        let zero = self.word(0);
        let mut t = vec![zero; n];
        for &bi in b {
            let (t0, mut carry_a) = self.mac(a[0], bi, t[0], zero);
            let m = self.reduction_factor(t0);
            let (_, mut carry_m) = self.mac(m, p[0], t0, zero);
            for j in 1..n {
                let (tj, ca) = self.mac(a[j], bi, t[j], carry_a);
                carry_a = ca;
                let (tj1, cm) = self.mac(m, p[j], tj, carry_m);
                t[j - 1] = tj1;
                carry_m = cm;
            }
            t[n - 1] = self.k.add(carry_m, carry_a);
        }
        self.reduce_once(&t)
    }

    /// Montgomery square a²·R⁻¹ mod p: the product with each cross term once (doubled by a
    /// shift), then a separate (SOS) reduction; about 20% fewer multiplies than `mont_mul`.
    /// `Comba*` layouts square with their multiplier.
    pub fn mont_sqr(&mut self, a: &[Val]) -> Limbs {
        if self.layout.radix().is_some() {
            let a = self.enter_mul_form(a);
            let r = self.mont_mul_form(&a, &a);
            return self.leave_mul_form(&r);
        }
        let n = a.len();
        let zero = self.word(0);
        let mut t = vec![zero; 2 * n];
        // Cross terms a_i·a_j, i < j.
        for i in 0..n - 1 {
            let mut carry = zero;
            for j in i + 1..n {
                let (lo, hi) = self.mac(a[i], a[j], t[i + j], carry);
                t[i + j] = lo;
                carry = hi;
            }
            t[i + n] = carry;
        }
        // Double (the cross-term sum is below a²/2 < 2^(2·384-1), so nothing leaves 2N words).
        let top_shift = self.word(31);
        let one = self.word(1);
        for k in (1..2 * n).rev() {
            let hi = self.k.shl(t[k], one);
            let lo = self.k.shr(t[k - 1], top_shift);
            t[k] = self.k.or(hi, lo);
        }
        t[0] = self.k.shl(t[0], one);
        // Diagonal terms a_i².
        let mut carry = zero;
        for i in 0..n {
            let (lo, hi) = self.mac(a[i], a[i], zero, zero);
            let (s, c) = self.adc(t[2 * i], lo, carry);
            t[2 * i] = s;
            let (s, c) = self.adc(t[2 * i + 1], hi, c);
            t[2 * i + 1] = s;
            carry = c;
        }
        self.reduce_sos(t)
    }

    /// Montgomery reduction of a 2N-word value t < p·R: t·R⁻¹ mod p.
    fn reduce_sos(&mut self, mut t: Vec<Val>) -> Limbs {
        let n = t.len() / 2;
        let p = self.constant(&P);
        let zero = self.word(0);
        let mut top = zero;
        for i in 0..n {
            let m = self.reduction_factor(t[i]);
            let (_, mut carry) = self.mac(m, p[0], t[i], zero);
            for j in 1..n {
                let (lo, hi) = self.mac(m, p[j], t[i + j], carry);
                t[i + j] = lo;
                carry = hi;
            }
            let (s, c) = self.adc(t[i + n], carry, top);
            t[i + n] = s;
            top = c;
        }
        // (t + M·p)/R < 2p < R: the final `top` is 0.
        self.reduce_once(&t[n..])
    }
}
