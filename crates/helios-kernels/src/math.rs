//! Numerically careful building blocks shared by kernel families: tanh, power, sigmoid and
//! NaN-propagating min/max, emitted as IR on values of any lane count.
//!
//! GLSL.std.450 leaves `tanh` of large arguments, `pow` of negative bases and `min`/`max` of
//! NaN undefined (and drivers differ), so Helios writes these itself from `exp`/`log2` with
//! the IEEE 754 / C99 special cases spelled out. Every kernel therefore behaves the same on
//! NVIDIA, AMD, Intel and lavapipe.

use helios_spirv::{KernelBuilder, Scalar, Val};

/// A float constant of `like`'s type (f32 or f16, any lane count).
pub fn splat_f(k: &mut KernelBuilder, like: Val, v: f32) -> Val {
    k.const_float(like.ty, v)
}

/// `|r|` with the sign bit of `x` (C's `copysign`), on f32 values.
pub fn copysign(k: &mut KernelBuilder, r: Val, x: Val) -> Val {
    let uty = r.ty.with_scalar(Scalar::U32);
    let rb = k.bitcast(r, uty);
    let xb = k.bitcast(x, uty);
    let mag_mask = k.constant_bits(uty, 0x7fff_ffff);
    let sign_mask = k.constant_bits(uty, 0x8000_0000);
    let mag = k.and(rb, mag_mask);
    let sign = k.and(xb, sign_mask);
    let bits = k.or(mag, sign);
    k.bitcast(bits, r.ty)
}

/// True where the sign bit of the f32 `x` is set (includes -0.0 and negative NaNs).
pub fn sign_bit(k: &mut KernelBuilder, x: Val) -> Val {
    let ity = x.ty.with_scalar(Scalar::I32);
    let xi = k.bitcast(x, ity);
    let zero = k.const_int(ity, 0);
    k.lt(xi, zero)
}

/// tanh(x) = sign(x)·(1 − e)/(1 + e) with e = exp(−2|x|), which never overflows; below
/// |x| < 0.0625 a short Taylor series avoids the cancellation in 1 − e.
pub fn tanh(k: &mut KernelBuilder, x: Val) -> Val {
    let ax = k.abs(x);
    let m2 = splat_f(k, x, -2.0);
    let t = k.mul(ax, m2);
    let e = k.exp(t);
    let one = splat_f(k, x, 1.0);
    let num = k.sub(one, e);
    let den = k.add(one, e);
    let big = k.div(num, den);
    // ax·(1 − ax²/3 + 2ax⁴/15)
    let x2 = k.mul(ax, ax);
    let c2 = splat_f(k, x, 2.0 / 15.0);
    let c1 = splat_f(k, x, -1.0 / 3.0);
    let p = k.fma(x2, c2, c1);
    let p = k.fma(p, x2, one);
    let small = k.mul(ax, p);
    let thr = splat_f(k, x, 0.0625);
    let is_small = k.lt(ax, thr);
    let r = k.select(is_small, small, big);
    copysign(k, r, x)
}

/// 1 / (1 + exp(−x)): exact limits 0 and 1 at ∓∞, NaN in → NaN out.
pub fn sigmoid(k: &mut KernelBuilder, x: Val) -> Val {
    let nx = k.neg(x);
    let e = k.exp(nx);
    let one = splat_f(k, x, 1.0);
    let den = k.add(one, e);
    k.div(one, den)
}

/// x / (1 + exp(−x)).
pub fn silu(k: &mut KernelBuilder, x: Val) -> Val {
    let nx = k.neg(x);
    let e = k.exp(nx);
    let one = splat_f(k, x, 1.0);
    let den = k.add(one, e);
    k.div(x, den)
}

/// GELU, tanh form (GPT-2): 0.5·x·(1 + tanh(z)), z = √(2/π)·(x + 0.044715·x³), computed as
/// x / (1 + exp(−2z)), the same function without the cancellation of 1 + tanh(z) for x < 0.
pub fn gelu_tanh(k: &mut KernelBuilder, x: Val) -> Val {
    let c = splat_f(k, x, 0.044_715);
    let s = splat_f(k, x, -2.0 * 0.797_884_6); // −2·√(2/π)
    let x2 = k.mul(x, x);
    let one = splat_f(k, x, 1.0);
    let inner = k.fma(x2, c, one); // 1 + 0.044715x²
    let z = k.mul(x, inner); // x + 0.044715x³
    let t = k.mul(z, s);
    let e = k.exp(t);
    let den = k.add(one, e);
    k.div(x, den)
}

/// max(x, 0) with NaN propagated. (Written as `x < 0 ? 0 : x`, NVIDIA's compiler turns it
/// into a max that drops the NaN; the explicit NaN test survives.)
pub fn relu(k: &mut KernelBuilder, x: Val) -> Val {
    let zero = splat_f(k, x, 0.0);
    max_nan_number(k, x, zero, true)
}

/// Maximum or minimum that returns NaN when either operand is NaN (as PyTorch does): six
/// instructions. `max_nan_number` is the three-instruction form for a `b` that is never NaN.
pub fn max_nan(k: &mut KernelBuilder, a: Val, b: Val, want_max: bool) -> Val {
    let m = if want_max { k.max(a, b) } else { k.min(a, b) };
    let na = k.is_nan(a);
    let nb = k.is_nan(b);
    let any = k.or(na, nb);
    let nan = k.add(a, b);
    k.select(any, nan, m)
}

/// `max_nan` for a `b` the caller knows is not NaN (a constant, or a scalar parameter its
/// launch has checked): `isnan(a) ? a : max(a, b)`. GLSL's `FMax` may return either operand
/// of a NaN, so only `a`'s NaN needs the explicit test, which NVIDIA's compiler keeps (see
/// `relu`).
pub fn max_nan_number(k: &mut KernelBuilder, a: Val, b: Val, want_max: bool) -> Val {
    let m = if want_max { k.max(a, b) } else { k.min(a, b) };
    let na = k.is_nan(a);
    k.select(na, a, m)
}

/// C99 `pow(a, b)` on f32: exp2(b·log2|a|) with the sign for odd integer exponents and the
/// special cases of C99 F.9.4.4 (pow(x, ±0) = 1, pow(1, y) = 1, pow(−1, ±∞) = 1, negative
/// finite base with non-integer exponent = NaN, otherwise NaN in → NaN out).
pub fn pow(k: &mut KernelBuilder, a: Val, b: Val) -> Val {
    let ty = a.ty;
    let one = k.const_float(ty, 1.0);
    let zero = k.const_float(ty, 0.0);
    let half = k.const_float(ty, 0.5);
    let two = k.const_float(ty, 2.0);

    let aa = k.abs(a);
    let l = k.log2(aa);
    let bl = k.mul(b, l);
    // Overflow and underflow are decided here rather than left to exp2 of huge or infinite
    // arguments, which some implementations get wrong (llvmpipe returns 0 for exp2(+inf)).
    let e = k.exp2(bl);
    let hi = k.const_float(ty, 128.0);
    let lo = k.const_float(ty, -150.0);
    let inf = k.const_float(ty, f32::INFINITY);
    let over = k.gt(bl, hi);
    let under = k.lt(bl, lo);
    let e = k.select(under, zero, e);
    let mag = k.select(over, inf, e);

    // Is b an integer, and an odd one? (±∞ and |b| ≥ 2^24 count as even integers.)
    let fb = k.floor(b);
    let b_int = k.eq(fb, b);
    let hb = k.mul(b, half);
    let fhb = k.floor(hb);
    let twice = k.mul(fhb, two);
    let parity = k.sub(b, twice);
    let is_one = k.eq(parity, one);
    let b_odd = k.and(b_int, is_one);

    let neg_mag = k.neg(mag);
    let a_neg = sign_bit(k, a);
    let flip = k.and(a_neg, b_odd);
    let r = k.select(flip, neg_mag, mag);

    let a_lt0 = k.lt(a, zero);
    let a_fin = {
        let inf = k.is_inf(a);
        k.not(inf)
    };
    let not_int = k.not(b_int);
    let bad = k.and(a_lt0, a_fin);
    let bad = k.and(bad, not_int);
    let nan = k.const_float(ty, f32::NAN);
    let r = k.select(bad, nan, r);
    // NaN operands give NaN explicitly: some exp2 implementations clamp their argument
    // (llvmpipe's does) and would turn exp2(NaN) into a number.
    let na = k.is_nan(a);
    let nb = k.is_nan(b);
    let any_nan = k.or(na, nb);
    let r = k.select(any_nan, nan, r);

    let m1 = k.const_float(ty, -1.0);
    let a_m1 = k.eq(a, m1);
    let b_inf = k.is_inf(b);
    let m1_inf = k.and(a_m1, b_inf);
    let b0 = k.eq(b, zero);
    let a1 = k.eq(a, one);
    let unit = k.or(b0, a1);
    let unit = k.or(unit, m1_inf);
    k.select(unit, one, r)
}

/// NaN where `a` or `b` is NaN, else `r` (the gradients promise NaN in → NaN out even where
/// their formula would multiply the NaN by zero or select it away).
fn nan_if_either(k: &mut KernelBuilder, a: Val, b: Val, r: Val) -> Val {
    let na = k.is_nan(a);
    let nb = k.is_nan(b);
    let any = k.or(na, nb);
    let nan = k.add(a, b);
    k.select(any, nan, r)
}

/// relu'(x)·dy: dy where x > 0, else 0 (PyTorch's convention at 0).
pub fn relu_backward(k: &mut KernelBuilder, x: Val, dy: Val) -> Val {
    let zero = splat_f(k, x, 0.0);
    let pos = k.gt(x, zero);
    let r = k.select(pos, dy, zero);
    nan_if_either(k, x, dy, r)
}

/// sigmoid(x) and 1 − sigmoid(x), each without cancellation or overflow: with e = exp(−x),
/// s = 1/(1 + e), and 1 − s is e·s where e ≤ 1 (x ≥ 0) and 1 − s where s is small (x < 0).
fn sigmoid_pair(k: &mut KernelBuilder, x: Val) -> (Val, Val) {
    let nx = k.neg(x);
    let e = k.exp(nx);
    let one = splat_f(k, x, 1.0);
    let den = k.add(one, e);
    let s = k.div(one, den);
    let es = k.mul(e, s);
    let one_minus = k.sub(one, s);
    let zero = splat_f(k, x, 0.0);
    let neg = k.lt(x, zero);
    let q = k.select(neg, one_minus, es);
    (s, q)
}

/// silu'(x)·dy with silu'(x) = s·(1 + x·(1 − s)), s = sigmoid(x); the limits 1 at +∞ and 0
/// at −∞ are set explicitly (the formula gives ∞·0 there).
pub fn silu_backward(k: &mut KernelBuilder, x: Val, dy: Val) -> Val {
    let (s, q) = sigmoid_pair(k, x);
    let one = splat_f(k, x, 1.0);
    let t = k.fma(x, q, one);
    let d = k.mul(s, t);
    let inf = k.is_inf(x);
    let d = saturate(k, x, d, inf);
    let r = k.mul(dy, d);
    nan_if_either(k, x, dy, r)
}

/// `d`, or where `far` holds its limit: 1 for positive and 0 for negative `x`.
fn saturate(k: &mut KernelBuilder, x: Val, d: Val, far: Val) -> Val {
    let zero = splat_f(k, x, 0.0);
    let one = splat_f(k, x, 1.0);
    let pos = k.gt(x, zero);
    let limit = k.select(pos, one, zero);
    k.select(far, limit, d)
}

/// gelu_tanh'(x)·dy. With p = sigmoid(2z) = (1 + tanh z)/2 and z = √(2/π)·(x + 0.044715x³):
/// gelu' = p + 2x·p·(1 − p)·√(2/π)·(1 + 3·0.044715x²), which has no cancellation for
/// negative x (unlike the tanh form). Past |x| > 10 the derivative is 1 or 0 within 4e-36,
/// and the formula would overflow (x³, ∞·0), so the limit is used there.
pub fn gelu_tanh_backward(k: &mut KernelBuilder, x: Val, dy: Val) -> Val {
    let c = splat_f(k, x, 0.044_715);
    let c3 = splat_f(k, x, 3.0 * 0.044_715);
    let k0 = splat_f(k, x, 0.797_884_6); // √(2/π)
    let two = splat_f(k, x, 2.0);
    let one = splat_f(k, x, 1.0);
    let x2 = k.mul(x, x);
    let inner = k.fma(x2, c, one);
    let xi = k.mul(x, inner);
    let z = k.mul(xi, k0);
    let z2 = k.mul(z, two);
    let (p, q) = sigmoid_pair(k, z2);
    let slope = k.fma(x2, c3, one);
    let slope = k.mul(slope, k0);
    let pq = k.mul(p, q);
    let x2t = k.mul(x, two);
    let t = k.mul(x2t, pq);
    let d = k.fma(t, slope, p);
    let ax = k.abs(x);
    let ten = splat_f(k, x, 10.0);
    let far = k.gt(ax, ten);
    let d = saturate(k, x, d, far);
    let r = k.mul(dy, d);
    nan_if_either(k, x, dy, r)
}
