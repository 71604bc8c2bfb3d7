//! Integer division and remainder. ptxas divides by a constant the long way (a reciprocal
//! on the MUFU unit, then corrections, ~20 instructions) where nvcc would have reduced it
//! first, so `div` and `rem` strength-reduce unsigned division by immediates themselves:
//! the ring slot of every key block in the native kernels, the matmul's three-stage ring.

use crate::kernel::{bits, Kernel};
use crate::types::{Op, Reg, Ty};

impl Kernel {
    pub fn div(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        let b = b.into();
        if let Some(shift) = pow2_divisor(a, &b) {
            return self.shr(a, shift);
        }
        if let Some(magic) = Magic::of(a, &b) {
            return self.div_magic(a, magic);
        }
        let op = if a.ty.is_float() { "div.rn" } else { "div" };
        self.binary(op, a.ty, a.into(), b)
    }

    pub fn rem(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        let b = b.into();
        if let Some(shift) = pow2_divisor(a, &b) {
            let r = self.reg(a.ty);
            let mask = (1u64 << shift) - 1;
            self.emit(format_args!("and{} {r}, {a}, {mask}", bits(a.ty).suffix()));
            return r;
        }
        if let Some(magic) = Magic::of(a, &b) {
            let q = self.div_magic(a, magic);
            let whole = self.mul(q, magic.divisor);
            return self.sub(a, whole);
        }
        self.binary("rem", a.ty, a.into(), b)
    }

    /// `a / d` for unsigned 32-bit `a` and the constant of `magic`: t = mulhi(m, a), then
    /// (t + (a − t) / 2) >> (l − 1) (`Magic::quotient` is the same on the CPU).
    fn div_magic(&mut self, a: Reg, magic: Magic) -> Reg {
        let t = self.reg(Ty::U32);
        self.emit(format_args!("mul.hi.u32 {t}, {a}, {}", magic.multiplier));
        let rest = self.sub(a, t);
        let half = self.shr(rest, 1u32);
        let sum = self.add(t, half);
        self.shr(sum, magic.shift - 1)
    }
}

/// The shift that divides unsigned `a` by `b` where `b` is an immediate power of two.
fn pow2_divisor(a: Reg, b: &Op) -> Option<u32> {
    match (a.ty, b) {
        (Ty::U32 | Ty::U64, &Op::Imm(v)) if v > 0 && v.count_ones() == 1 => {
            Some(v.trailing_zeros())
        }
        _ => None,
    }
}

/// Unsigned 32-bit division by a constant `divisor` that is not a power of two, as a
/// multiply-high and shifts (Granlund and Montgomery; exact for every dividend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Magic {
    divisor: u32,
    /// ⌊2³² (2ˡ − d) / d⌋ + 1, with l = ⌈log₂ d⌉ (fits 32 bits when d is not a power of 2).
    multiplier: u32,
    shift: u32,
}

impl Magic {
    /// The constants for dividing unsigned 32-bit `a` by immediate `b`, where they apply.
    fn of(a: Reg, b: &Op) -> Option<Magic> {
        match (a.ty, b) {
            (Ty::U32, &Op::Imm(v)) => u32::try_from(v).ok().and_then(Magic::new),
            _ => None,
        }
    }

    fn new(divisor: u32) -> Option<Magic> {
        if divisor < 3 || divisor.is_power_of_two() {
            return None;
        }
        let shift = 32 - (divisor - 1).leading_zeros();
        let d = u64::from(divisor);
        let m = ((1u64 << 32) * ((1u64 << shift) - d)) / d + 1;
        Some(Magic {
            divisor,
            multiplier: u32::try_from(m).ok()?,
            shift,
        })
    }

    /// What `div_magic`'s instructions compute, step for step.
    #[cfg(test)]
    fn quotient(self, n: u32) -> u32 {
        let t = ((u64::from(self.multiplier) * u64::from(n)) >> 32) as u32;
        (t + ((n - t) >> 1)) >> (self.shift - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Special;
    use crate::types::Target;

    /// Unsigned division and remainder by an immediate power of two are a shift and a mask,
    /// by another unsigned 32-bit immediate a multiply-high and shifts; signed division
    /// stays a division.
    #[test]
    fn powers_of_two_divide_by_shifting() {
        let mut k = Kernel::new("divide", Target::SM80);
        let tid = k.special(Special::TidX);
        let q = k.div(tid, 8u32);
        let r = k.rem(tid, 8u32);
        let s = k.cvt(Ty::S32, tid);
        let qs = k.div(s, 8i32);
        let q3 = k.div(tid, 3u32);
        let one = k.rem(tid, 1u32);
        let m = k.finish().unwrap();
        let line = |reg: Reg| {
            let name = reg.to_string();
            m.text
                .lines()
                .find(|l| l.contains(&format!(" {name},")))
                .unwrap_or_else(|| panic!("{name} not defined:\n{}", m.text))
                .trim()
                .to_string()
        };
        assert_eq!(line(q), format!("shr.u32 {q}, {tid}, 3;"));
        assert_eq!(line(r), format!("and.b32 {r}, {tid}, 7;"));
        assert!(line(qs).starts_with("div.s32"), "{}", line(qs));
        assert!(line(q3).starts_with("shr.u32"), "{}", line(q3));
        assert!(m.text.contains("mul.hi.u32"), "{}", m.text);
        assert!(!m.text.contains("div.u32"), "{}", m.text);
        assert_eq!(line(one), format!("and.b32 {one}, {tid}, 0;"));
    }

    /// The multiply-high division's instructions, modelled on the CPU, against `/` and `%`
    /// over each divisor's edges and random dividends, for small, large and extreme
    /// divisors.
    #[test]
    fn constant_division_is_exact() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng as u32
        };
        let extreme = [
            u32::MAX,
            u32::MAX - 1,
            (1 << 31) + 1,
            (1 << 31) - 1,
            641,
            6_700_417,
        ];
        let divisors: Vec<u32> = (3..2000)
            .chain(extreme)
            .chain((0..200).map(|_| next()))
            .collect();
        let mut checked = 0;
        for d in divisors {
            let Some(magic) = Magic::new(d) else {
                assert!(d.is_power_of_two() || d < 3, "{d}");
                continue;
            };
            let mut ns = vec![0, 1, d - 1, d, d.wrapping_add(1), u32::MAX, u32::MAX - 1];
            // The last multiples of d below u32::MAX and the values just under them.
            for q in (0..=4).filter_map(|k| (u32::MAX / d).checked_sub(k)) {
                ns.extend([
                    q * d,
                    (q * d).wrapping_sub(1),
                    q * d + (d - 1).min(u32::MAX - q * d),
                ]);
            }
            ns.extend((0..64).map(|_| next()));
            for n in ns {
                assert_eq!(magic.quotient(n), n / d, "{n} / {d}");
            }
            checked += 1;
        }
        assert!(checked > 1900, "{checked}");
    }
}
