//! The Fq kernels: inputs and output as 48-byte elements reached through buffer device
//! addresses, one kernel per (op, limb layout); one element per invocation, or P for the
//! `Dual*` layouts (element P·i + j through the layout's j-th pipe, `Layout::pipes`).
//!
//! The one decision a reader must know: every kernel reads and writes the host's format
//! (six little-endian u64 limbs) with three 16-byte loads/stores per element, whatever layout
//! it computes in, so the layout is a pure speed choice that never changes data on the device.
//! Push constants: `a`, [`b`], `out` addresses, then `n`; the grid is two-dimensional so any
//! n fits under `maxComputeWorkGroupCount[0]`. A multi-element invocation keeps its P
//! elements' code in one basic block (so the GPU's compiler can interleave them): where n is
//! not a multiple of P, the last invocation computes its missing elements on a copy of
//! element n − 1 (in bounds) and does not store them.

use helios_spirv::{Access, Binding, KernelBuilder, KernelModule, ParamSlot, Scalar, Ty, Val};

use crate::arith::{Arith, Layout, Limbs};
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
        let word = self.layout.word();
        let a = k.buffer("a", word, Access::Read);
        let b = (self.op.arity() == 2).then(|| k.buffer("b", word, Access::Read));
        let out = k.buffer("out", word, Access::Write);
        let n = k.param("n", Ty::scalar(Scalar::U32));
        k.begin();

        let pipes = self.layout.pipes();
        let n = k.load_param(n);
        let (base, inside) = invocation_base(&mut k, n, pipes.len());

        let op = self.op;
        k.if_(inside, |k| {
            let slots = slots(k, base, n, &pipes);
            let inputs: Vec<(Limbs, Option<Limbs>)> = slots
                .iter()
                .map(|s| {
                    let xa = load_element(k, a, s.first, s.layout);
                    let xb = b.map(|b| load_element(k, b, s.first, s.layout));
                    (xa, xb)
                })
                .collect();
            // Every element's arithmetic before any store: one straight-line block.
            let results: Vec<Limbs> = slots
                .iter()
                .zip(&inputs)
                .map(|(s, (xa, xb))| {
                    let mut ar = Arith {
                        k: &mut *k,
                        layout: s.layout,
                    };
                    op.emit(&mut ar, xa, xb.as_deref())
                })
                .collect();
            store_elements(k, out, &slots, &results);
        });
        k.finish()
    }
}

/// One element of an invocation: its first 16-byte vector (3 × its index), the single-element
/// layout it is computed in, and whether it is stored (`None`: always, inside the bounds
/// check; else a bool, false for the copies of element n − 1 at the end of the array).
struct Slot {
    first: Val,
    layout: Layout,
    store: Option<Val>,
}

/// The invocation's first element P·i and whether it is inside the array (P·i < n).
fn invocation_base(k: &mut KernelBuilder, n: Val, per_invocation: usize) -> (Val, Val) {
    let i = linear_index(k);
    let base = if per_invocation == 1 {
        i
    } else {
        let p = k.u32(per_invocation as u32);
        k.mul(i, p)
    };
    let inside = k.lt(base, n);
    (base, inside)
}

/// The invocation's elements base + j, one per pipe; for base < n. Elements past the end
/// are clamped to n − 1 (loaded and computed, not stored).
fn slots(k: &mut KernelBuilder, base: Val, n: Val, pipes: &[Layout]) -> Vec<Slot> {
    let three = k.u32(3);
    let last = (pipes.len() > 1).then(|| {
        let one = k.u32(1);
        k.sub(n, one)
    });
    pipes
        .iter()
        .enumerate()
        .map(|(j, &layout)| {
            let (index, store) = match (j, last) {
                (0, _) | (_, None) => (base, None),
                (j, Some(last)) => {
                    let off = k.u32(j as u32);
                    let e = k.add(base, off);
                    let inside = k.lt(e, n);
                    (k.min(e, last), Some(inside))
                }
            };
            Slot {
                first: k.mul(index, three),
                layout,
                store,
            }
        })
        .collect()
}

fn store_elements(k: &mut KernelBuilder, out: helios_spirv::Buffer, slots: &[Slot], r: &[Limbs]) {
    for (s, r) in slots.iter().zip(r) {
        match s.store {
            None => store_element(k, out, s.first, s.layout, r),
            Some(inside) => k.if_(inside, |k| store_element(k, out, s.first, s.layout, r)),
        }
    }
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
    let word = layout.word();
    let a = k.buffer("a", word, Access::Read);
    let b = k.buffer("b", word, Access::Read);
    let out = k.buffer("out", word, Access::Write);
    let n = k.param("n", Ty::scalar(Scalar::U32));
    let iterations = k.param("iterations", Ty::scalar(Scalar::U32));
    k.begin();
    let pipes = layout.pipes();
    let n = k.load_param(n);
    let iterations = k.load_param(iterations);
    let (base, inside) = invocation_base(&mut k, n, pipes.len());
    k.if_(inside, |k| {
        let slots = slots(k, base, n, &pipes);
        // Operands stay in the multiplier's register form across the loop (the reduced-radix
        // and f64 layouts convert once on each side of it, not per product). With several
        // elements per invocation, each element's chain is dependent within itself only.
        let mut chains = Vec::with_capacity(slots.len());
        for s in &slots {
            let xa = load_element(k, a, s.first, s.layout);
            let xb = load_element(k, b, s.first, s.layout);
            let mut ar = Arith {
                k: &mut *k,
                layout: s.layout,
            };
            let (xa, xb) = (ar.enter_chain_form(&xa), ar.enter_chain_form(&xb));
            let acc: Vec<_> = xa.iter().map(|&x| k.var_init(x)).collect();
            chains.push((acc, xb));
        }
        let (zero, one) = (k.u32(0), k.u32(1));
        k.for_range(zero, iterations, one, |k, _| {
            let cur: Vec<Vec<Val>> = chains
                .iter()
                .map(|(acc, _)| acc.iter().map(|&v| k.get(v)).collect())
                .collect();
            let next: Vec<Limbs> = slots
                .iter()
                .zip(&chains)
                .zip(&cur)
                .map(|((s, (_, xb)), cur)| {
                    let mut ar = Arith {
                        k: &mut *k,
                        layout: s.layout,
                    };
                    ar.chain_mul(cur, xb, canonical)
                })
                .collect();
            for ((acc, _), next) in chains.iter().zip(next) {
                for (&v, x) in acc.iter().zip(next) {
                    k.set(v, x);
                }
            }
        });
        let results: Vec<Limbs> = slots
            .iter()
            .zip(&chains)
            .map(|(s, (acc, _))| {
                let r: Vec<Val> = acc.iter().map(|&v| k.get(v)).collect();
                let mut ar = Arith {
                    k: &mut *k,
                    layout: s.layout,
                };
                ar.leave_chain_form(&r)
            })
            .collect();
        store_elements(k, out, &slots, &results);
    });
    k.finish()
}

/// Lanes per 16-byte vector.
fn lanes(layout: Layout) -> u8 {
    (16 / layout.word().bytes()) as u8
}

pub(crate) fn load_element(
    k: &mut KernelBuilder,
    buf: helios_spirv::Buffer,
    first: Val,
    layout: Layout,
) -> Limbs {
    let lanes = lanes(layout);
    let mut limbs = Vec::with_capacity(layout.limbs());
    for v in 0..3 {
        let off = k.u32(v);
        let idx = k.add(first, off);
        let vec = k.load(buf, idx, lanes);
        for lane in 0..lanes as u32 {
            limbs.push(k.extract(vec, lane));
        }
    }
    limbs
}

pub(crate) fn store_element(
    k: &mut KernelBuilder,
    buf: helios_spirv::Buffer,
    first: Val,
    layout: Layout,
    limbs: &[Val],
) {
    let lanes = lanes(layout) as usize;
    for (v, parts) in limbs.chunks(lanes).enumerate() {
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

/// The grid for `n` elements at `per_invocation` elements per invocation and `workgroup`
/// invocations per group: the kernel library's balanced folding, with rows of at most 65535
/// groups (every device's minimum limit).
pub fn grid(n: usize, per_invocation: usize, workgroup: u32) -> Result<[u32; 3]> {
    if n > MAX_DISPATCH_ELEMENTS {
        return Err(FieldError::TooLarge {
            what: "one dispatch",
            size: n,
            max: MAX_DISPATCH_ELEMENTS,
        });
    }
    let invocations = (n as u64).div_ceil(per_invocation.max(1) as u64);
    let groups = invocations.div_ceil(u64::from(workgroup));
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

    /// A multi-element kernel keeps its elements' arithmetic in one basic block (so the
    /// GPU's compiler can interleave the pipes): its only blocks beyond those of its first
    /// pipe's kernel are the guarded stores of the other elements (two labels each). The
    /// chain's loop body likewise.
    #[test]
    fn multi_element_kernels_are_straight_line() {
        let labels = |m: &KernelModule| m.disassemble().matches("OpLabel").count();
        for layout in Layout::ALL {
            let pipes = layout.pipes();
            let extra = 2 * (pipes.len() - 1);
            for op in [FieldOp::Mul, FieldOp::Sqr, FieldOp::ToMont, FieldOp::Add] {
                let one = FieldKernel {
                    op,
                    layout: pipes[0],
                }
                .build();
                let m = FieldKernel { op, layout }.build();
                assert_eq!(labels(&m), labels(&one) + extra, "{}", m.name);
            }
            let (one, m) = (
                build_mul_chain(pipes[0], false),
                build_mul_chain(layout, false),
            );
            assert_eq!(labels(&m), labels(&one) + extra, "{}", m.name);
        }
        let dual = FieldKernel {
            op: FieldOp::Mul,
            layout: Layout::Dual,
        }
        .build()
        .disassemble();
        assert!(dual.contains("Fma"), "the FP64 pipe's fused multiply-adds");
        assert!(dual.contains("OpIMul"), "the integer pipe's products");
    }

    #[test]
    fn grid_folds_into_two_dimensions() {
        assert_eq!(grid(0, 1, 128).unwrap(), [0, 1, 1]);
        assert_eq!(grid(64, 1, 128).unwrap(), [1, 1, 1]);
        // 131072 groups in three balanced rows, not 65535 + 65535 + 2.
        assert_eq!(grid(1 << 24, 1, 128).unwrap(), [43691, 3, 1]);
        assert!(grid(MAX_DISPATCH_ELEMENTS + 1, 1, 128).is_err());
        // Two elements per invocation: half the invocations, rounded up.
        assert_eq!(grid(256, 2, 128).unwrap(), [1, 1, 1]);
        assert_eq!(grid(257, 2, 128).unwrap(), [2, 1, 1]);
        assert_eq!(grid(1 << 24, 2, 128).unwrap(), [32768, 2, 1]); // 65536 groups
        assert_eq!(grid(1 << 24, 3, 128).unwrap(), [43691, 1, 1]); // ⌈2²⁴/3⌉/128 ↑
        assert!(grid(MAX_DISPATCH_ELEMENTS + 1, 2, 128).is_err());
    }
}
