//! The BLS12-381 base field Fq on the host: the modulus and Montgomery constants, the element
//! type of the host API, and the canonical-input check every upload goes through.
//!
//! The one decision a reader must know: an element is `[u64; 6]`, little-endian limbs, and
//! that is also its byte layout on the device (48 bytes, 16-byte aligned), so uploads and
//! downloads are plain copies whatever limb layout the kernels compute in. Kernels never see
//! a value ≥ p: only canonical values are uploaded, and every kernel returns canonical values.

use crate::FieldError;

/// One Fq element: six 64-bit limbs, least significant first. The kernels treat it as a raw
/// residue; whether it is in Montgomery form is the caller's convention (`ToMont`/`FromMont`
/// convert, `Mul`/`Sqr` are Montgomery products).
pub type Fq = [u64; 6];

/// Bytes of one element on the device.
pub const FQ_BYTES: u64 = 48;

/// p = 0x1a0111ea397fe69a4b1ba7b6434bacd764774b84f38512bf6730d2a0f6b0f6241eabfffeb153ffffb9feffffffffaaab
pub const P: Fq = [
    0xb9fe_ffff_ffff_aaab,
    0x1eab_fffe_b153_ffff,
    0x6730_d2a0_f6b0_f624,
    0x6477_4b84_f385_12bf,
    0x4b1b_a7b6_434b_acd7,
    0x1a01_11ea_397f_e69a,
];

/// -p⁻¹ mod 2⁶⁴ (the Montgomery reduction constant; its low half is the 32-bit one).
pub const P_INV_NEG: u64 = mont_inv_neg(P[0]);

/// p < 2^P_BITS (and 2p < 2^(P_BITS + 1)).
pub const P_BITS: u32 = 381;

/// R mod p with R = 2³⁸⁴: the Montgomery form of 1.
pub const R_MOD_P: Fq = [
    0x7609_0000_0002_fffd,
    0xebf4_000b_c40c_0002,
    0x5f48_9857_53c7_58ba,
    0x77ce_5853_7052_5745,
    0x5c07_1a97_a256_ec6d,
    0x15f6_5ec3_fa80_e493,
];

/// R² mod p: multiplying by it in Montgomery form converts into Montgomery form.
pub const R2_MOD_P: Fq = [
    0xf4df_1f34_1c34_1746,
    0x0a76_e6a6_09d1_04f1,
    0x8de5_476c_4c95_b6d5,
    0x67eb_88a9_939d_83c0,
    0x9a79_3e85_b519_952d,
    0x1198_8fe5_92ca_e3aa,
];

/// The integer 1 (not in Montgomery form).
pub const ONE: Fq = [1, 0, 0, 0, 0, 0];

/// -x⁻¹ mod 2⁶⁴ for odd x, by Newton iteration (each step doubles the correct bits).
const fn mont_inv_neg(x: u64) -> u64 {
    let mut inv: u64 = 1;
    let mut i = 0;
    while i < 6 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(x.wrapping_mul(inv)));
        i += 1;
    }
    inv.wrapping_neg()
}

/// `2^k mod p` for k ≥ 384 (host side, for kernel constants): R mod p doubled k − 384 times.
pub(crate) fn pow2_mod_p(k: u32) -> Fq {
    assert!(k >= 384, "pow2_mod_p starts from R = 2^384");
    (384..k).fold(R_MOD_P, |x, _| double_mod_p(&x))
}

/// 2x mod p for x < p: the doubling (under 2^382, so no carry leaves the top limb), less p
/// where it reached p.
fn double_mod_p(x: &Fq) -> Fq {
    let mut d = [0u64; 6];
    let mut carry = 0u64;
    for (di, &xi) in d.iter_mut().zip(x) {
        *di = (xi << 1) | carry;
        carry = xi >> 63;
    }
    if is_canonical(&d) {
        return d;
    }
    let mut r = [0u64; 6];
    let mut borrow = false;
    for ((ri, &di), &pi) in r.iter_mut().zip(&d).zip(&P) {
        let (v, b1) = di.overflowing_sub(pi);
        let (v, b2) = v.overflowing_sub(u64::from(borrow));
        *ri = v;
        borrow = b1 || b2;
    }
    r
}

/// True when `x < p`.
#[inline]
pub fn is_canonical(x: &Fq) -> bool {
    for i in (0..6).rev() {
        if x[i] != P[i] {
            return x[i] < P[i];
        }
    }
    false
}

/// Errors on the first element ≥ p, naming the input and the index.
pub fn check_canonical(input: &'static str, xs: &[Fq]) -> Result<(), FieldError> {
    // Large inputs are checked on all cores; the check is part of every upload's cost.
    const PAR: usize = 1 << 16;
    let bad = if xs.len() >= PAR {
        use rayon::prelude::*;
        xs.par_iter().position_first(|x| !is_canonical(x))
    } else {
        xs.iter().position(|x| !is_canonical(x))
    };
    match bad {
        None => Ok(()),
        Some(index) => Err(FieldError::NonCanonical {
            input,
            index,
            value: to_hex(&xs[index]),
        }),
    }
}

/// Big-endian hex, for messages.
pub fn to_hex(x: &Fq) -> String {
    let mut s = String::from("0x");
    for limb in x.iter().rev() {
        s.push_str(&format!("{limb:016x}"));
    }
    s
}

/// Deterministic pseudo-random canonical elements (xorshift64*, rejection sampling below p),
/// for tests and benchmarks: failures reproduce from the seed.
pub fn random_elements(n: usize, seed: u64) -> Vec<Fq> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let mut x = [0u64; 6];
        for limb in x.iter_mut() {
            *limb = next();
        }
        x[5] &= (1 << 61) - 1; // p < 2^381: keeps the rejection rate near 1/5
        if is_canonical(&x) {
            out.push(x);
        }
    }
    out
}

/// Values that stress carries and the final subtraction: 0, 1, 2, p-1, p-2, (p-1)/2,
/// (p+1)/2, R mod p, all-ones low limbs, and values with the top limb at its largest.
pub fn edge_elements() -> Vec<Fq> {
    let sub_small = |k: u64| {
        let mut x = P;
        x[0] -= k; // p[0] ends in ...aaab, so no borrow for small k
        x
    };
    let half = |x: Fq| {
        let mut h = [0u64; 6];
        for i in 0..6 {
            h[i] = x[i] >> 1 | if i < 5 { x[i + 1] << 63 } else { 0 };
        }
        h
    };
    let p_plus_1_half = {
        let mut x = half(P);
        x[0] += 1;
        x
    };
    vec![
        [0; 6],
        ONE,
        [2, 0, 0, 0, 0, 0],
        sub_small(1),
        sub_small(2),
        half(sub_small(1)),
        p_plus_1_half,
        R_MOD_P,
        [u64::MAX, u64::MAX, u64::MAX, u64::MAX, u64::MAX, 0],
        [u64::MAX, u64::MAX, u64::MAX, u64::MAX, 0, P[5]],
        [0, 0, 0, 0, 0, P[5]],
        [0, 0, 0, 0, P[4], P[5]],
        [u64::MAX, 0, u64::MAX, 0, u64::MAX, P[5] - 1],
        [u64::MAX, u64::MAX, u64::MAX, u64::MAX, u64::MAX, P[5] - 1],
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants() {
        assert_eq!(P_INV_NEG, 0x89f3_fffc_fffc_fffd);
        assert_eq!(P[0].wrapping_mul(P_INV_NEG), u64::MAX); // p * (-p^-1) = -1
        assert!(is_canonical(&R_MOD_P) && is_canonical(&R2_MOD_P));
        assert!(!is_canonical(&P));
        assert!(edge_elements().iter().all(is_canonical));
        assert!(random_elements(1000, 1).iter().all(is_canonical));
    }

    #[test]
    fn rejects_values_at_or_above_p() {
        let mut xs = random_elements(10, 2);
        assert!(check_canonical("a", &xs).is_ok());
        xs[7] = P;
        let e = check_canonical("a", &xs).unwrap_err();
        assert!(
            matches!(e, FieldError::NonCanonical { index: 7, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("element 7"), "{e}");
        xs[7] = [u64::MAX; 6];
        xs[3] = [0, 0, 0, 0, 0, 1 << 62];
        assert!(matches!(
            check_canonical("b", &xs),
            Err(FieldError::NonCanonical { index: 3, .. })
        ));
    }
}
