//! Storage formats of float tensors and the IR helpers that move them to and from f32.
//!
//! The one decision a reader must know: arithmetic is always f32; a storage format only
//! changes how values are loaded and stored. bf16 is not an IR type (most devices lack it), so
//! a bf16 buffer is declared as `u16` and widened by `u32 << 16` then a bitcast, and narrowed
//! by round-to-nearest-even on the f32 bits, NaN kept NaN (quiet, sign preserved). Every kernel
//! family declares its float buffers with [`buffer_scalar`] and reads and writes them through
//! [`load_f32`] and [`store_f32`], so a new format is added here once.

use helios_spirv::{Buffer, GLOp, KernelBuilder, Scalar, Ty, Val};

/// How float values are stored in a buffer (arithmetic on them is f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Storage {
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16: the top 16 bits of an f32.
    BF16,
}

impl Storage {
    pub const ALL: [Storage; 3] = [Storage::F32, Storage::F16, Storage::BF16];

    /// Bytes per element.
    pub const fn bytes(self) -> u32 {
        match self {
            Storage::F32 => 4,
            Storage::F16 | Storage::BF16 => 2,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Storage::F32 => "f32",
            Storage::F16 => "f16",
            Storage::BF16 => "bf16",
        }
    }
}

/// The IR element type to declare a buffer of this storage with.
pub const fn buffer_scalar(s: Storage) -> Scalar {
    match s {
        Storage::F32 => Scalar::F32,
        Storage::F16 => Scalar::F16,
        Storage::BF16 => Scalar::U16,
    }
}

/// Loads vector `index` (in units of `lanes` elements) of `buf`, stored as `s`, widened to
/// f32 (`lanes` f32 lanes). `buf` must be declared with `buffer_scalar(s)`.
#[track_caller]
pub fn load_f32(k: &mut KernelBuilder, buf: Buffer, index: Val, lanes: u8, s: Storage) -> Val {
    assert_eq!(
        buf.elem,
        buffer_scalar(s),
        "buffer of {} read as {}",
        buf.elem.name(),
        s.name()
    );
    let raw = k.load(buf, index, lanes);
    match s {
        Storage::F32 => raw,
        Storage::F16 => k.convert(raw, Scalar::F32),
        Storage::BF16 => {
            let wide = k.convert(raw, Scalar::U32);
            let sixteen = splat_u32(k, 16, lanes);
            let bits = k.shl(wide, sixteen);
            k.bitcast(bits, Ty::vector(Scalar::F32, lanes))
        }
    }
}

/// Stores the f32 `value` (scalar, 2 or 4 lanes) at vector `index` of `buf`, narrowed to `s`:
/// f16 through `OpFConvert` (round to nearest even), bf16 through round-to-nearest-even on the
/// bits with NaN kept a quiet NaN of the same sign. Through f16 a NaN stays a NaN, but its
/// sign is the implementation's (Vulkan does not fix it; NVIDIA's conversions drop it).
/// Setting it back from the input's bits slowed f16 copies
/// (bench/results/source-comment-history.md), for a sign that IEEE gives no meaning.
#[track_caller]
pub fn store_f32(k: &mut KernelBuilder, buf: Buffer, index: Val, value: Val, s: Storage) {
    assert_eq!(value.ty.scalar, Scalar::F32, "store_f32 of {}", value.ty);
    assert_eq!(
        buf.elem,
        buffer_scalar(s),
        "buffer of {} written as {}",
        buf.elem.name(),
        s.name()
    );
    let narrow = match s {
        Storage::F32 => value,
        Storage::F16 => k.convert(value, Scalar::F16),
        Storage::BF16 => f32_to_bf16_bits(k, value),
    };
    k.store(buf, index, narrow);
}

/// f32 `value` rounded to the nearest f16 (ties to even), still f32: overflow to ±inf, f16
/// subnormals kept, NaN kept. Computed by scaling with powers of two and `RoundEven`, which
/// every step leaves exact, rather than `OpFConvert` there and back: Vulkan leaves the
/// rounding of a narrowing `OpFConvert` to the implementation unless a decoration fixes it,
/// and NVIDIA's compiler may drop an f32 → f16 → f32 round trip held in registers. A fused
/// group that rounds an f16 value in registers (a reduction's prologue) then rounded it
/// differently from the same group storing it (1 ulp, `graph::reductions_compute_a_pending_
/// group_in_their_loads` on an H100).
pub fn round_to_f16(k: &mut KernelBuilder, value: Val) -> Val {
    let lanes = value.ty.lanes;
    let float = Ty::vector(Scalar::F32, lanes);
    let bits = k.bitcast(value, Ty::vector(Scalar::U32, lanes));
    let twenty_three = splat_u32(k, 23, lanes);
    let shifted = k.shr(bits, twenty_three);
    let exp_mask = splat_u32(k, 0xff, lanes);
    let exp = k.and(shifted, exp_mask);
    // The f16 quantum at this magnitude is 2^q, q = max(e, −14) − 10 for the unbiased
    // exponent e (−14: below it f16 is subnormal, with a fixed quantum 2^−24). Scale by 2^−q
    // (biased exponent min(264 − exp, 151)), round to an integer, scale back by 2^q
    // (biased max(exp, 113) − 10). Both scales are normal f32 for every exp up to 255.
    let pow2 = |k: &mut KernelBuilder, biased: Val| {
        let bits = k.shl(biased, twenty_three);
        k.bitcast(bits, float)
    };
    let c264 = splat_u32(k, 264, lanes);
    let c151 = splat_u32(k, 151, lanes);
    let down = k.sub(c264, exp);
    let down = k.min(down, c151);
    let down = pow2(k, down);
    let c113 = splat_u32(k, 113, lanes);
    let ten = splat_u32(k, 10, lanes);
    let up = k.max(exp, c113);
    let up = k.sub(up, ten);
    let up = pow2(k, up);
    let scaled = k.mul(value, down);
    let whole = k.glsl_op(GLOp::RoundEven, &[scaled]);
    let rounded = k.mul(whole, up);
    // Past the largest f16 (65504) it is ±inf, with the sign of `value`.
    let sign_mask = splat_u32(k, 0x8000_0000, lanes);
    let sign = k.and(bits, sign_mask);
    let inf_bits = splat_u32(k, 0x7f80_0000, lanes);
    let inf = k.or(sign, inf_bits);
    let inf = k.bitcast(inf, float);
    let max = k.const_f32(65504.0);
    let max = k.splat(max, lanes);
    let magnitude = k.abs(rounded);
    let over = k.gt(magnitude, max);
    k.select(over, inf, rounded)
}

/// The bf16 bit patterns (`u16` lanes) of f32 `value`, rounded to nearest even.
pub fn f32_to_bf16_bits(k: &mut KernelBuilder, value: Val) -> Val {
    let lanes = value.ty.lanes;
    let bits = k.bitcast(value, Ty::vector(Scalar::U32, lanes));
    let sixteen = splat_u32(k, 16, lanes);
    let one = splat_u32(k, 1, lanes);
    let bias = splat_u32(k, 0x7fff, lanes);
    let high = k.shr(bits, sixteen);
    let odd = k.and(high, one);
    let biased = k.add(bits, bias);
    let biased = k.add(biased, odd);
    let rounded = k.shr(biased, sixteen);
    // A NaN whose payload sits in the low bits would round to infinity (or wrap the sign):
    // keep its sign and top bits and set the quiet bit instead.
    let quiet = splat_u32(k, 0x0040, lanes);
    let nan_bits = k.or(high, quiet);
    let is_nan = k.is_nan(value);
    let out = k.select(is_nan, nan_bits, rounded);
    k.convert(out, Scalar::U16)
}

fn splat_u32(k: &mut KernelBuilder, v: u32, lanes: u8) -> Val {
    let s = k.u32(v);
    k.splat(s, lanes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use helios_spirv::{validate, Access, Binding, TargetEnv};

    /// A copy kernel `dst[i] = src[i]` between every pair of storages, scalar and vec4, in both
    /// binding models, passes spirv-val.
    #[test]
    fn conversions_validate() {
        for binding in [Binding::DeviceAddress, Binding::Descriptor] {
            for from in Storage::ALL {
                for to in Storage::ALL {
                    let name = format!("cast_{}_{}", from.name(), to.name());
                    let mut k = KernelBuilder::new(name, binding, [64, 1, 1]);
                    let src = k.buffer("src", buffer_scalar(from), Access::Read);
                    let dst = k.buffer("dst", buffer_scalar(to), Access::Write);
                    k.begin();
                    let i = k.local_index();
                    for lanes in [1, 4] {
                        let v = load_f32(&mut k, src, i, lanes, from);
                        assert_eq!(v.ty, Ty::vector(Scalar::F32, lanes));
                        store_f32(&mut k, dst, i, v, to);
                    }
                    let m = k.finish();
                    for env in [TargetEnv::Vulkan1_2, TargetEnv::Vulkan1_3] {
                        if let Err(e) = validate(&m.name, &m.words, env) {
                            panic!("{e}\n{}", m.disassemble());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn names_and_sizes() {
        assert_eq!(Storage::BF16.bytes(), 2);
        assert_eq!(Storage::F32.bytes(), 4);
        assert_eq!(buffer_scalar(Storage::BF16), Scalar::U16);
        assert_eq!(Storage::F16.name(), "f16");
    }
}
