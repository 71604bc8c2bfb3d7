//! The Fq kernels: inputs and output as 48-byte elements reached through buffer device
//! addresses, one kernel per (op, limb layout), one element per invocation.
//!
//! The one decision a reader must know: every kernel reads and writes the host's format
//! (six little-endian u64 limbs, seen as 12 u32 words) with three 16-byte loads/stores per
//! element, whatever layout it multiplies in, so the layout is a pure speed choice that never
//! changes data on the device. Push constants: `a`, [`b`], `out` addresses, then `n`; the grid
//! is two-dimensional so any n fits under `maxComputeWorkGroupCount[0]`.

use helios_spirv::{Access, Binding, KernelBuilder, KernelModule, ParamSlot, Scalar, Ty, Val};

use crate::arith::{Arith, Layout, Limbs, WORDS};
use crate::fq::{ONE, R2_MOD_P};
use crate::{FieldError, Result};

/// An operation over arrays of Fq elements. Add, Sub and Neg work on either representation;
/// Mul and Sqr are Montgomery products (a·b·R⁻¹); ToMont/FromMont convert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldOp {
    Add,
    Sub,
    Neg,
    Mul,
    Sqr,
    ToMont,
    FromMont,
}

impl FieldOp {
    pub const ALL: [FieldOp; 7] = [
        FieldOp::Add,
        FieldOp::Sub,
        FieldOp::Neg,
        FieldOp::Mul,
        FieldOp::Sqr,
        FieldOp::ToMont,
        FieldOp::FromMont,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            FieldOp::Add => "add",
            FieldOp::Sub => "sub",
            FieldOp::Neg => "neg",
            FieldOp::Mul => "mul",
            FieldOp::Sqr => "sqr",
            FieldOp::ToMont => "to_mont",
            FieldOp::FromMont => "from_mont",
        }
    }

    pub fn from_name(name: &str) -> Option<FieldOp> {
        FieldOp::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Number of input arrays.
    pub const fn arity(self) -> usize {
        match self {
            FieldOp::Add | FieldOp::Sub | FieldOp::Mul => 2,
            _ => 1,
        }
    }

    fn emit(self, ar: &mut Arith<'_>, a: &[Val], b: Option<&[Val]>) -> Limbs {
        let b = || b.expect("binary op has b");
        match self {
            FieldOp::Add => ar.add_mod(a, b()),
            FieldOp::Sub => ar.sub_mod(a, b()),
            FieldOp::Neg => ar.neg_mod(a),
            FieldOp::Mul => ar.mont_mul(a, b()),
            FieldOp::Sqr => ar.mont_sqr(a),
            FieldOp::ToMont => ar.mont_mul_by(a, &R2_MOD_P),
            FieldOp::FromMont => ar.mont_mul_by(a, &ONE),
        }
    }
}

/// Default invocations per workgroup (a specialization constant; the bench sweeps it, and 128
/// ran fastest on the GPUs measured: bench/results/source-comment-history.md).
pub const FIELD_WORKGROUP: u32 = 128;

/// Largest element count of one dispatch: the kernels index u32 words (12 per element).
pub const MAX_DISPATCH_ELEMENTS: usize = (u32::MAX / 12) as usize;

/// The signature of an Fq kernel: everything that changes the emitted SPIR-V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FieldKernel {
    pub op: FieldOp,
    pub layout: Layout,
}

impl FieldKernel {
    pub fn name(&self) -> String {
        format!("fq_{}_{}", self.op.name(), self.layout.name())
    }

    /// Emits the kernel.
    pub fn build(&self) -> KernelModule {
        let mut k =
            KernelBuilder::new(self.name(), Binding::DeviceAddress, [FIELD_WORKGROUP, 1, 1]);
        let a = k.buffer("a", Scalar::U32, Access::Read);
        let b = (self.op.arity() == 2).then(|| k.buffer("b", Scalar::U32, Access::Read));
        let out = k.buffer("out", Scalar::U32, Access::Write);
        let n = k.param("n", Ty::scalar(Scalar::U32));
        k.begin();

        let n = k.load_param(n);
        let i = linear_index(&mut k);
        let inside = k.lt(i, n);
        let (op, layout) = (self.op, self.layout);
        k.if_(inside, |k| {
            let first = first_vector(k, i);
            let xa = load_element(k, a, first);
            let xb = b.map(|b| load_element(k, b, first));
            let mut ar = Arith { k: &mut *k, layout };
            let r = op.emit(&mut ar, &xa, xb.as_deref());
            store_element(k, out, first, &r);
        });
        k.finish()
    }
}

/// Element i's first 16-byte vector: 3·i.
pub(crate) fn first_vector(k: &mut KernelBuilder, i: Val) -> Val {
    let three = k.u32(3);
    k.mul(i, three)
}

/// The invocation's element index over the 2-D grid.
fn linear_index(k: &mut KernelBuilder) -> Val {
    let wid = k.workgroup_id();
    let nwg = k.num_workgroups();
    let (gx, gy, nx) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(nwg, 0));
    let row = k.mul(gy, nx);
    let group = k.add(row, gx);
    let wsize = k.workgroup_size_x();
    let base = k.mul(group, wsize);
    let lid = k.local_index();
    k.add(base, lid)
}

/// The arithmetic-throughput probe: `out = a·bᵏ·R⁻ᵏ`, k (a push constant) dependent
/// Montgomery products per element with every operand in registers, so that memory traffic
/// is negligible and the time is the multiplier's. The benchmark's "G mul/s" comes from it.
/// With `canonical` every intermediate product is made canonical; without, they stay below
/// 2p (`Arith::chain_mul`) and only the result is.
pub fn build_mul_chain(layout: Layout, canonical: bool) -> KernelModule {
    let form = if canonical { "_canonical" } else { "" };
    let name = format!("fq_mul_chain_{}{form}", layout.name());
    let mut k = KernelBuilder::new(name, Binding::DeviceAddress, [FIELD_WORKGROUP, 1, 1]);
    let a = k.buffer("a", Scalar::U32, Access::Read);
    let b = k.buffer("b", Scalar::U32, Access::Read);
    let out = k.buffer("out", Scalar::U32, Access::Write);
    let n = k.param("n", Ty::scalar(Scalar::U32));
    let iterations = k.param("iterations", Ty::scalar(Scalar::U32));
    k.begin();
    let n = k.load_param(n);
    let iterations = k.load_param(iterations);
    let i = linear_index(&mut k);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let first = first_vector(k, i);
        // Operands stay in the multiplier's register form across the loop (the reduced-radix
        // layouts convert once on each side of it, not per product).
        let xa = load_element(k, a, first);
        let xb = load_element(k, b, first);
        let mut ar = Arith { k: &mut *k, layout };
        let (xa, xb) = (ar.enter_chain_form(&xa), ar.enter_chain_form(&xb));
        let acc: Vec<_> = xa.iter().map(|&x| k.var_init(x)).collect();
        let (zero, one) = (k.u32(0), k.u32(1));
        k.for_range(zero, iterations, one, |k, _| {
            let cur: Vec<Val> = acc.iter().map(|&v| k.get(v)).collect();
            let mut ar = Arith { k: &mut *k, layout };
            let next = ar.chain_mul(&cur, &xb, canonical);
            for (&v, x) in acc.iter().zip(next) {
                k.set(v, x);
            }
        });
        let r: Vec<Val> = acc.iter().map(|&v| k.get(v)).collect();
        let mut ar = Arith { k: &mut *k, layout };
        let r = ar.leave_chain_form(&r);
        store_element(k, out, first, &r);
    });
    k.finish()
}

/// The element's 12 words, from three 16-byte vectors starting at vector `first`.
pub(crate) fn load_element(k: &mut KernelBuilder, buf: helios_spirv::Buffer, first: Val) -> Limbs {
    let mut limbs = Vec::with_capacity(WORDS);
    for v in 0..3 {
        let off = k.u32(v);
        let idx = k.add(first, off);
        let vec = k.load(buf, idx, 4);
        for lane in 0..4 {
            limbs.push(k.extract(vec, lane));
        }
    }
    limbs
}

/// 12 words to three 16-byte vectors starting at vector `first`.
pub(crate) fn store_element(
    k: &mut KernelBuilder,
    buf: helios_spirv::Buffer,
    first: Val,
    limbs: &[Val],
) {
    for (v, parts) in limbs.chunks(4).enumerate() {
        let off = k.u32(v as u32);
        let idx = k.add(first, off);
        let vec = k.vector(parts);
        k.store(buf, idx, vec);
    }
}

/// The push-constant block for one dispatch: the addresses of `inputs` and `out`, then the
/// u32 values (`n`, and the iteration count of the chain kernel) in declaration order.
pub fn push_constants(module: &KernelModule, inputs: &[u64], out: u64, values: &[u32]) -> Vec<u8> {
    let mut bytes = vec![0u8; module.push_size as usize];
    let mut addresses = inputs.iter().chain(std::iter::once(&out));
    let mut values = values.iter();
    for p in &module.params {
        match &p.slot {
            ParamSlot::Address { offset } => {
                let at = *offset as usize;
                let addr = addresses.next().expect("one address per buffer parameter");
                bytes[at..at + 8].copy_from_slice(&addr.to_le_bytes());
            }
            ParamSlot::Value { offset, .. } => {
                let at = *offset as usize;
                let v = values.next().expect("one value per value parameter");
                bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            ParamSlot::Descriptor { .. } => unreachable!("field kernels use device addresses"),
        }
    }
    bytes
}

/// The grid for `n` elements at `workgroup` invocations per group: the kernel library's
/// balanced folding, with rows of at most 65535 groups (every device's minimum limit).
pub fn grid(n: usize, workgroup: u32) -> Result<[u32; 3]> {
    if n > MAX_DISPATCH_ELEMENTS {
        return Err(FieldError::TooLarge {
            what: "one dispatch",
            size: n,
            max: MAX_DISPATCH_ELEMENTS,
        });
    }
    let groups = (n as u64).div_ceil(u64::from(workgroup));
    helios_kernels::grid(groups, helios_kernels::launch::MIN_GROUPS_LIMIT).map_err(|_| {
        FieldError::TooLarge {
            what: "one dispatch",
            size: n,
            max: MAX_DISPATCH_ELEMENTS,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use helios_spirv::{validate, TargetEnv};

    #[test]
    fn every_kernel_passes_spirv_val() {
        for layout in Layout::ALL {
            for op in FieldOp::ALL {
                let m = FieldKernel { op, layout }.build();
                for env in [TargetEnv::Vulkan1_2, TargetEnv::Vulkan1_3] {
                    validate(&m.name, &m.words, env).unwrap_or_else(|e| panic!("{e}"));
                }
                let expected = if op.arity() == 2 { 28 } else { 20 };
                assert_eq!(m.push_size, expected, "{}", m.name);
            }
            let m = build_mul_chain(layout, false);
            validate(&m.name, &m.words, TargetEnv::Vulkan1_2).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn grid_folds_into_two_dimensions() {
        assert_eq!(grid(0, 128).unwrap(), [0, 1, 1]);
        assert_eq!(grid(64, 128).unwrap(), [1, 1, 1]);
        assert_eq!(grid(257, 128).unwrap(), [3, 1, 1]);
        // 131072 groups in three balanced rows, not 65535 + 65535 + 2.
        assert_eq!(grid(1 << 24, 128).unwrap(), [43691, 3, 1]);
        assert!(grid(MAX_DISPATCH_ELEMENTS + 1, 128).is_err());
    }
}
