//! Multi-limb Fq arithmetic emitted into the kernel IR: add/sub/neg modulo p, the Montgomery
//! product (CIOS) and a dedicated Montgomery square (SOS), all fully unrolled.
//!
//! The one decision a reader must know: the limb layout is a parameter ([`Layout`]), because
//! the fastest one is the one the GPU's compiler turns into the fewest instructions, which is
//! measured, not derived (`helios field bench --sweep`). Four layouts share this code:
//! 12×32-bit limbs with 32×32→64 products written as u64 arithmetic (`U32Wide`), the same with
//! the product from `OpUMulExtended` (`U32Mix`), 12×32-bit limbs with `OpUMulExtended` and
//! `OpIAddCarry` (`U32Ext`), and 6×64-bit limbs with the extended ops on u64 (`U64`). Only the
//! three primitives `mac`, `adc` and `sbb` differ. The `Comba*` layouts multiply in 29- or
//! 30-bit limbs by product scanning ([`crate::comba`]); their add/sub/neg are `U32Mix`'s, and
//! their products convert from and to the 12 words around the multiplier.
//!
//! The `Dual*` layouts compute several elements per invocation, each through one of the
//! single-element layouts above ([`Layout::pipes`]); the kernels (`crate::kernel`) emit one
//! `Arith` per element, so this file never sees them.
//!
//! p < 2³⁸¹ leaves the top limb's highest bits clear, which allows the "no-carry" CIOS
//! variant (no extra carry word per row) and guarantees that a + b never leaves N limbs.

use helios_spirv::{KernelBuilder, Scalar, Ty, Val};

use helios_vk::EnabledFeatures;

use crate::comba::{Comba, Radix};
use crate::fp64::{FmaKind, Fp64, Fp64Mul};
use crate::fq::{pow2_mod_p, Fq, P, P_BITS, P_INV_NEG, R_MOD_P};

/// How an Fq element is held in registers inside a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// 12 × u32; products and carries through u64 arithmetic (one 64-bit multiply-add).
    U32Wide,
    /// 12 × u32; products through `OpUMulExtended`, sums and carries through u64 arithmetic.
    U32Mix,
    /// 12 × u32; products through `OpUMulExtended`, carries through `OpIAddCarry`.
    U32Ext,
    /// 6 × u64; products through `OpUMulExtended` on u64, carries through `OpIAddCarry`.
    U64,
    /// Products in 14 × 29-bit limbs, one u64 column accumulator, u64 multiplies.
    Comba29,
    /// As `Comba29` with products through `OpUMulExtended`.
    Comba29Ext,
    /// As `Comba29` with two accumulators per column (a·b and m·p: two dependency chains).
    Comba29Dual,
    /// Products in 13 × 30-bit limbs, two u64 column accumulators, u64 multiplies.
    Comba30,
    /// As `Comba30` with products through `OpUMulExtended`.
    Comba30Ext,
    /// As `Comba29` with a·b by one level of Karatsuba (357 products instead of 406).
    Comba29K,
    /// As `Comba29K` with products through `OpUMulExtended`.
    Comba29KExt,
    /// As `Comba30` with a·b by one level of Karatsuba (316 products instead of 351).
    Comba30K,
    /// As `Comba30K` with products through `OpUMulExtended`.
    Comba30KExt,
    /// As `Comba30` with two accumulators only in the middle columns (where one could
    /// overflow), one elsewhere.
    Comba30H,
    /// As `Comba30K`, accumulators split as in `Comba30H`.
    Comba30KH,
    /// As `Comba30KH` with the reduction's m·p by one level of Karatsuba too (274 products
    /// instead of 303).
    Comba30KHR,
    /// As `Comba30KH` with a·b by two levels of Karatsuba (278 products).
    Comba30K2H,
    /// Both: two levels for a·b, one for m·p (249 products).
    Comba30K2HR,
    /// As `Comba29K` with the reduction's m·p by one level of Karatsuba (301 products, one
    /// accumulator per column).
    Comba29KR,
    /// As `Comba29KR` with a·b by two levels of Karatsuba (277 products).
    Comba29K2R,
    /// Products on the FP64 pipe ([`crate::fp64`]): 8 × 48-bit limbs as f64, each product
    /// split exactly by two GLSL `Fma`s (fused in practice, not by specification), column
    /// sums in i64. Needs `shaderFloat64`.
    Fp64,
    /// As `Fp64` with a·b by one level of Karatsuba (48 products instead of 64).
    Fp64K,
    /// As `Fp64` with the column sums on the FP64 pipe too (`Fp64::mont_mul_fp_columns`):
    /// four FP64 operations and no 64-bit integer add per product, for GPUs where the
    /// integer side, not the FP64 pipe, limits `Fp64`.
    Fp64C,
    /// Two elements per invocation, one through `Comba30KH` (integer pipe), one through
    /// `Fp64K` (FP64 pipe), as independent straight-line code, so that both pipes work at
    /// once. Add/sub/neg use the integer code for both. Needs `shaderFloat64`.
    Dual,
    /// As `Dual` with three elements per invocation: two through `Comba30KH`, one `Fp64K`.
    Dual21,
    /// As `Dual` with three elements per invocation: one through `Comba30KH`, two `Fp64K`.
    Dual12,
    /// Two elements per invocation, both through `Comba30KH`: the control for `Dual` (two
    /// independent products per invocation without the FP64 pipe), and the multi-element
    /// kernel shape that runs on every device.
    DualInt,
}

impl Layout {
    pub const ALL: [Layout; 27] = [
        Layout::U32Wide,
        Layout::U32Mix,
        Layout::U32Ext,
        Layout::U64,
        Layout::Comba29,
        Layout::Comba29Ext,
        Layout::Comba29Dual,
        Layout::Comba30,
        Layout::Comba30Ext,
        Layout::Comba29K,
        Layout::Comba29KExt,
        Layout::Comba30K,
        Layout::Comba30KExt,
        Layout::Comba30H,
        Layout::Comba30KH,
        Layout::Comba30KHR,
        Layout::Comba30K2H,
        Layout::Comba30K2HR,
        Layout::Comba29KR,
        Layout::Comba29K2R,
        Layout::Fp64,
        Layout::Fp64K,
        Layout::Fp64C,
        Layout::Dual,
        Layout::Dual21,
        Layout::Dual12,
        Layout::DualInt,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Layout::U32Wide => "u32wide",
            Layout::U32Mix => "u32mix",
            Layout::U32Ext => "u32ext",
            Layout::U64 => "u64",
            Layout::Comba29 => "comba29",
            Layout::Comba29Ext => "comba29e",
            Layout::Comba29Dual => "comba29d",
            Layout::Comba30 => "comba30",
            Layout::Comba30Ext => "comba30e",
            Layout::Comba29K => "comba29k",
            Layout::Comba29KExt => "comba29ke",
            Layout::Comba30K => "comba30k",
            Layout::Comba30KExt => "comba30ke",
            Layout::Comba30H => "comba30h",
            Layout::Comba30KH => "comba30kh",
            Layout::Comba30KHR => "comba30khr",
            Layout::Comba30K2H => "comba30k2h",
            Layout::Comba30K2HR => "comba30k2hr",
            Layout::Comba29KR => "comba29kr",
            Layout::Comba29K2R => "comba29k2r",
            Layout::Fp64 => "fp64",
            Layout::Fp64K => "fp64k",
            Layout::Fp64C => "fp64c",
            Layout::Dual => "dual",
            Layout::Dual21 => "dual21",
            Layout::Dual12 => "dual12",
            Layout::DualInt => "dualint",
        }
    }

    /// The layouts of the elements one invocation computes, in order: element `P·i + j` of
    /// an array (P = `pipes().len()`) goes through `pipes()[j]`. The layout itself except
    /// for the `Dual*` layouts, whose entries are single-element layouts.
    pub fn pipes(self) -> Vec<Layout> {
        use Layout::{Comba30KH as I, Fp64K as F};
        match self {
            Layout::Dual => vec![I, F],
            Layout::Dual21 => vec![I, I, F],
            Layout::Dual12 => vec![I, F, F],
            Layout::DualInt => vec![I, I],
            _ => vec![self],
        }
    }

    /// Elements per invocation of the layout's kernels.
    pub fn elements_per_invocation(self) -> usize {
        self.pipes().len()
    }

    /// Whether the layout's products run (in part) on the FP64 pipe with GLSL `Fma`, whose
    /// exactness a [`Field`](crate::Field) self-tests before using it.
    pub fn needs_fused_fma(self) -> bool {
        self.pipes()
            .iter()
            .any(|l| l.fp64().is_some_and(|m| m.fma == FmaKind::Glsl))
    }

    /// The reduced radix the multiplier works in, for the product-scanning layouts.
    pub const fn radix(self) -> Option<Radix> {
        // (bits, dual, ext, Karatsuba levels of a·b, Karatsuba m·p, hybrid)
        let (w, dual, ext, karatsuba, kred, hybrid) = match self {
            Layout::Comba29 => (29, false, false, 0, false, false),
            Layout::Comba29Ext => (29, false, true, 0, false, false),
            Layout::Comba29Dual => (29, true, false, 0, false, false),
            Layout::Comba30 => (30, true, false, 0, false, false),
            Layout::Comba30Ext => (30, true, true, 0, false, false),
            Layout::Comba29K => (29, false, false, 1, false, false),
            Layout::Comba29KExt => (29, false, true, 1, false, false),
            Layout::Comba30K => (30, true, false, 1, false, false),
            Layout::Comba30KExt => (30, true, true, 1, false, false),
            Layout::Comba30H => (30, true, false, 0, false, true),
            Layout::Comba30KH => (30, true, false, 1, false, true),
            Layout::Comba30KHR => (30, true, false, 1, true, true),
            Layout::Comba30K2H => (30, true, false, 2, false, true),
            Layout::Comba30K2HR => (30, true, false, 2, true, true),
            Layout::Comba29KR => (29, false, false, 1, true, false),
            Layout::Comba29K2R => (29, false, false, 2, true, false),
            _ => return None,
        };
        Some(Radix {
            w,
            dual,
            ext,
            karatsuba,
            kred,
            hybrid,
        })
    }

    /// The FP64 multiplier of the `Fp64*` layouts.
    pub const fn fp64(self) -> Option<Fp64Mul> {
        let (karatsuba, fp_columns, fma) = match self {
            Layout::Fp64 => (false, false, FmaKind::Glsl),
            Layout::Fp64K => (true, false, FmaKind::Glsl),
            Layout::Fp64C => (false, true, FmaKind::Glsl),
            _ => return None,
        };
        Some(Fp64Mul {
            karatsuba,
            fma,
            fp_columns,
        })
    }

    /// The device features the layout's kernels need beyond the ones every layout uses, as
    /// (Vulkan feature name, whether `enabled` has it).
    pub fn requirements(self, enabled: &EnabledFeatures) -> Vec<(&'static str, bool)> {
        if self.pipes().iter().any(|l| l.fp64().is_some()) {
            vec![("shaderFloat64", enabled.shader_float64)]
        } else {
            Vec::new()
        }
    }

    /// Whether the layout's multiplier works in its own register form (reduced-radix or f64
    /// limbs) rather than in the layout's words.
    const fn has_mul_form(self) -> bool {
        self.radix().is_some() || self.fp64().is_some()
    }

    pub fn from_name(name: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The limb type.
    pub const fn word(self) -> Scalar {
        match self {
            Layout::U64 => Scalar::U64,
            _ => Scalar::U32,
        }
    }

    /// Limbs per element.
    pub const fn limbs(self) -> usize {
        match self {
            Layout::U64 => 6,
            _ => 12,
        }
    }

    /// `x` split into this layout's limbs, least significant first.
    pub fn split(self, x: &Fq) -> Vec<u64> {
        match self.word() {
            Scalar::U32 => x.iter().flat_map(|&l| [l & 0xffff_ffff, l >> 32]).collect(),
            _ => x.to_vec(),
        }
    }
}

/// An element in registers: `layout.limbs()` words, least significant first.
pub type Limbs = Vec<Val>;

/// Emits limb arithmetic for one layout into a kernel.
pub struct Arith<'k> {
    pub k: &'k mut KernelBuilder,
    pub layout: Layout,
}

impl Arith<'_> {
    fn word_ty(&self) -> Ty {
        Ty::scalar(self.layout.word())
    }

    /// A word constant.
    pub fn word(&mut self, v: u64) -> Val {
        let ty = self.word_ty();
        self.k.constant_bits(ty, v)
    }

    /// A constant element (e.g. p, R² mod p) as limbs.
    pub fn constant(&mut self, x: &Fq) -> Limbs {
        self.layout
            .split(x)
            .into_iter()
            .map(|w| self.word(w))
            .collect()
    }

    fn split_u64(&mut self, t: Val) -> (Val, Val) {
        let pair = self.k.bitcast(t, Ty::vector(Scalar::U32, 2));
        (self.k.extract(pair, 0), self.k.extract(pair, 1))
    }

    fn widen(&mut self, x: Val) -> Val {
        self.k.convert(x, Scalar::U64)
    }

    /// `(lo, hi)` of `a * b + c + d`; cannot overflow two words.
    pub fn mac(&mut self, a: Val, b: Val, c: Val, d: Val) -> (Val, Val) {
        match self.layout {
            Layout::U32Wide => {
                let (a, b, c, d) = (self.widen(a), self.widen(b), self.widen(c), self.widen(d));
                let p = self.k.mul(a, b);
                let t = self.k.add(p, c);
                let t = self.k.add(t, d);
                self.split_u64(t)
            }
            Layout::U32Ext | Layout::U64 => {
                let (lo, hi) = self.k.umul_extended(a, b);
                let (s, c1) = self.k.iadd_carry(lo, c);
                let (s, c2) = self.k.iadd_carry(s, d);
                let hi = self.k.add(hi, c1);
                (s, self.k.add(hi, c2))
            }
            _ => {
                let (lo, hi) = self.k.umul_extended(a, b);
                let pair = self.k.vector(&[lo, hi]);
                let p = self.k.bitcast(pair, Ty::scalar(Scalar::U64));
                let (c, d) = (self.widen(c), self.widen(d));
                let t = self.k.add(p, c);
                let t = self.k.add(t, d);
                self.split_u64(t)
            }
        }
    }

    /// `(a + b + carry mod W, carry out)` with carries 0 or 1.
    pub fn adc(&mut self, a: Val, b: Val, carry: Val) -> (Val, Val) {
        match self.layout {
            Layout::U32Ext | Layout::U64 => {
                let (s, c1) = self.k.iadd_carry(a, b);
                let (s, c2) = self.k.iadd_carry(s, carry);
                (s, self.k.or(c1, c2)) // at most one of the two carries is set
            }
            _ => {
                let (a, b, c) = (self.widen(a), self.widen(b), self.widen(carry));
                let t = self.k.add(a, b);
                let t = self.k.add(t, c);
                self.split_u64(t)
            }
        }
    }

    /// `(a - b - borrow mod W, borrow out)` with borrows 0 or 1.
    pub fn sbb(&mut self, a: Val, b: Val, borrow: Val) -> (Val, Val) {
        match self.layout {
            Layout::U32Ext | Layout::U64 => {
                let (d, b1) = self.k.isub_borrow(a, b);
                let (d, b2) = self.k.isub_borrow(d, borrow);
                (d, self.k.or(b1, b2))
            }
            _ => {
                let (a, b, c) = (self.widen(a), self.widen(b), self.widen(borrow));
                let t = self.k.sub(a, b);
                let t = self.k.sub(t, c);
                let (lo, hi) = self.split_u64(t);
                let one = self.word(1);
                (lo, self.k.and(hi, one)) // hi is all ones after a borrow, else 0
            }
        }
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

    /// m = t · (-p⁻¹) mod W.
    fn reduction_factor(&mut self, t: Val) -> Val {
        let inv = match self.layout.word() {
            Scalar::U32 => P_INV_NEG & 0xffff_ffff,
            _ => P_INV_NEG,
        };
        let inv = self.word(inv);
        self.k.mul(t, inv)
    }

    /// The product-scanning emitter of a `Comba*` layout.
    fn comba(&mut self) -> Option<Comba<'_>> {
        let r = self.layout.radix()?;
        Some(Comba { k: self.k, r })
    }

    /// An element in the multiplier's register form (the limbs `mont_mul_form` takes and
    /// returns): the layout's limbs, or the reduced-radix limbs of a `Comba*` layout.
    pub fn enter_mul_form(&mut self, x: &[Val]) -> Limbs {
        if let Some(mut f) = self.fp64() {
            return f.unpack_words(x);
        }
        match self.comba() {
            Some(mut c) => c.unpack_words(x),
            None => x.to_vec(),
        }
    }

    /// The FP64 emitter of an `Fp64*` layout.
    fn fp64(&mut self) -> Option<Fp64<'_>> {
        let mul = self.layout.fp64()?;
        Some(Fp64 { k: self.k, mul })
    }

    /// Back from the multiplier's register form to the layout's limbs.
    pub fn leave_mul_form(&mut self, x: &[Val]) -> Limbs {
        if let Some(mut f) = self.fp64() {
            return f.pack_words(x);
        }
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

    /// Back from chain form to the layout's limbs, canonical (one product with R mod p for
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
        if let Some(mut f) = self.fp64() {
            return f.mont_mul(a, b);
        }
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
        let x = if let Some(mut f) = self.fp64() {
            f.constant(x)
        } else if let Some(mut c) = self.comba() {
            c.constant(x)
        } else {
            self.constant(x)
        };
        let r = self.mont_mul_form(&a, &x);
        self.leave_mul_form(&r)
    }

    /// CIOS, no-carry variant, in the layout's limbs.
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
    /// `Comba*` and `Fp64*` layouts square with their multiplier.
    pub fn mont_sqr(&mut self, a: &[Val]) -> Limbs {
        if self.layout.has_mul_form() {
            let a = self.enter_mul_form(a);
            let r = self.mont_mul_form(&a, &a);
            return self.leave_mul_form(&r);
        }
        let n = a.len();
        let bits = self.layout.word().bits();
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
        let top_shift = self.word(u64::from(bits - 1));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp64_layouts_need_shader_float64() {
        let mut enabled = EnabledFeatures::default();
        for layout in Layout::ALL {
            let unmet = layout.requirements(&enabled).iter().any(|(_, ok)| !ok);
            let fp64 = matches!(
                layout,
                Layout::Fp64
                    | Layout::Fp64K
                    | Layout::Fp64C
                    | Layout::Dual
                    | Layout::Dual21
                    | Layout::Dual12
            );
            assert_eq!(unmet, fp64, "{}", layout.name());
            assert_eq!(layout.needs_fused_fma(), fp64, "{}", layout.name());
        }
        enabled.shader_float64 = true;
        assert!(Layout::ALL
            .iter()
            .all(|l| l.requirements(&enabled).iter().all(|(_, ok)| *ok)));
    }

    /// A multi-element layout's pipes are single-element layouts, one of each kind in `Dual`.
    #[test]
    fn pipes_are_single_element_layouts() {
        for layout in Layout::ALL {
            let pipes = layout.pipes();
            assert_eq!(pipes.len(), layout.elements_per_invocation());
            if pipes.len() == 1 {
                assert_eq!(pipes, [layout]);
            }
            for p in pipes {
                assert_eq!(p.pipes(), [p], "{} in {}", p.name(), layout.name());
            }
        }
        assert_eq!(Layout::Dual.pipes(), [Layout::Comba30KH, Layout::Fp64K]);
        assert_eq!(Layout::from_name("dual"), Some(Layout::Dual));
        assert_eq!(Layout::DualInt.elements_per_invocation(), 2);
        assert_eq!(Layout::Dual21.elements_per_invocation(), 3);
    }
}
