//! The CPU reference and baseline, on blst (supranational's audited BLS12-381 library, the
//! one under `blstrs`).
//!
//! The one decision a reader must know: blst's `blst_fp` is the same six little-endian 64-bit
//! limbs as [`Fq`], and `blst_fp_mul` is the Montgomery product with R = 2³⁸⁴, so every GPU
//! kernel has an exact blst counterpart on raw limbs and results compare bit for bit.
//! `apply` is one core; `apply_parallel` splits the arrays over all cores with rayon.

use blst::blst_fp;
use rayon::prelude::*;

use crate::fq::{Fq, R2_MOD_P};
use crate::kernel::FieldOp;

#[inline]
fn fp(x: &Fq) -> blst_fp {
    blst_fp { l: *x }
}

/// `op` on one element (b is ignored by unary ops).
#[inline]
pub fn apply_one(op: FieldOp, a: &Fq, b: &Fq) -> Fq {
    let (a, b) = (fp(a), fp(b));
    let mut r = blst_fp::default();
    // SAFETY: blst reads and writes exactly one blst_fp through each pointer; all are valid
    // and properly aligned locals. Inputs are canonical (the callers check), as blst assumes.
    unsafe {
        match op {
            FieldOp::Add => blst::blst_fp_add(&mut r, &a, &b),
            FieldOp::Sub => blst::blst_fp_sub(&mut r, &a, &b),
            FieldOp::Neg => blst::blst_fp_cneg(&mut r, &a, true),
            FieldOp::Mul => blst::blst_fp_mul(&mut r, &a, &b),
            FieldOp::Sqr => blst::blst_fp_sqr(&mut r, &a),
            FieldOp::ToMont => blst::blst_fp_mul(&mut r, &a, &fp(&R2_MOD_P)),
            FieldOp::FromMont => {
                let mut out = [0u64; 6];
                blst::blst_uint64_from_fp(out.as_mut_ptr(), &a);
                return out;
            }
        }
    }
    r.l
}

/// `out[i] = op(a[i], b[i])` on the calling thread. `b` is empty for unary ops.
pub fn apply(op: FieldOp, a: &[Fq], b: &[Fq], out: &mut [Fq]) {
    if op.arity() == 2 {
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            *o = apply_one(op, x, y);
        }
    } else {
        for (o, x) in out.iter_mut().zip(a) {
            *o = apply_one(op, x, x);
        }
    }
}

/// As [`apply`], on all cores of rayon's global pool.
pub fn apply_parallel(op: FieldOp, a: &[Fq], b: &[Fq], out: &mut [Fq]) {
    // Chunks big enough that scheduling costs little, small enough to balance.
    let chunk = (a.len() / (rayon::current_num_threads() * 4)).max(1024);
    if op.arity() == 2 {
        out.par_chunks_mut(chunk)
            .zip(a.par_chunks(chunk))
            .zip(b.par_chunks(chunk))
            .for_each(|((o, x), y)| apply(op, x, y, o));
    } else {
        out.par_chunks_mut(chunk)
            .zip(a.par_chunks(chunk))
            .for_each(|(o, x)| apply(op, x, &[], o));
    }
}

/// The chain probe's reference: `a·bᵏ·R⁻ᵏ` per element (k Montgomery products).
pub fn mul_chain(a: &[Fq], b: &[Fq], iterations: u32) -> Vec<Fq> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let mut acc = *x;
            for _ in 0..iterations {
                acc = apply_one(FieldOp::Mul, &acc, y);
            }
            acc
        })
        .collect()
}

/// Convenience: `op` over whole arrays into a new vector (single-threaded).
pub fn reference(op: FieldOp, a: &[Fq], b: &[Fq]) -> Vec<Fq> {
    let mut out = vec![[0u64; 6]; a.len()];
    apply(op, a, b, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fq::{edge_elements, random_elements, ONE, P, R_MOD_P};

    #[test]
    fn blst_matches_the_constants() {
        // to_mont(1) = R mod p, from_mont(R mod p) = 1, Montgomery product with R mod p is
        // the identity, and -1 = p - 1.
        let zero = [0u64; 6];
        assert_eq!(apply_one(FieldOp::ToMont, &ONE, &zero), R_MOD_P);
        assert_eq!(apply_one(FieldOp::FromMont, &R_MOD_P, &zero), ONE);
        let x = random_elements(1, 9)[0];
        assert_eq!(apply_one(FieldOp::Mul, &x, &R_MOD_P), x);
        let mut pm1 = P;
        pm1[0] -= 1;
        assert_eq!(apply_one(FieldOp::Neg, &ONE, &zero), pm1);
        assert_eq!(apply_one(FieldOp::Neg, &zero, &zero), zero);
    }

    /// The kernels' constants 2^k mod p (doubled on the host without blst) agree with blst's
    /// modular addition at every k the limb layouts use and past them.
    #[test]
    fn powers_of_two_match_blst() {
        let mut x = R_MOD_P;
        for k in 384..1200 {
            assert_eq!(crate::fq::pow2_mod_p(k), x, "2^{k} mod p");
            x = apply_one(FieldOp::Add, &x, &x);
        }
    }

    #[test]
    fn parallel_equals_serial() {
        let mut a = random_elements(5000, 3);
        a.extend(edge_elements());
        let b = random_elements(a.len(), 4);
        for op in FieldOp::ALL {
            let serial = reference(op, &a, &b);
            let mut par = vec![[0u64; 6]; a.len()];
            apply_parallel(op, &a, &b, &mut par);
            assert_eq!(serial, par, "{op:?}");
        }
    }
}
