//! Split-K: a product computed as partial products over consecutive k ranges into an f32
//! workspace, then summed in one pass into the output's dtype. SPIR-V kernels read equal
//! parts through offset operands; native kernels take their part of the k tiles themselves
//! (`MatmulShape::k_parts`), so any part count works for them.

use helios_kernels::matmul::vector_elems;
use helios_kernels::{Epilogue, MatmulKernel, MatmulShape, MatmulVariant, Triangle};

use super::{invalid, to_u32, Plan, Problem};
use crate::{DType, Result, Tensor};

impl Problem {
    /// The shape of one batched launch computing the product as `splits` partial products
    /// over consecutive k ranges (batch `i` reads k in `[i·K/s, (i+1)·K/s)` and writes its
    /// own dense M×N f32 slice), or `None` where split-K does not apply: a batched product,
    /// an epilogue other than scaling (bias, activation and residual act on the sum), or,
    /// for the SPIR-V kernels, k not cut into equal ranges of a multiple of 8 elements
    /// (which keeps their vector accesses). Native kernels (`native`) cut k themselves, in
    /// whole k tiles, and take any count up to one 16-deep tile a part.
    fn split_shape(&self, splits: u32, native: bool) -> Option<MatmulShape> {
        let s = &self.shape;
        if splits < 2
            || s.batch != 1
            || !self.epilogue.is_plain()
            || self.triangle != Triangle::Full
        {
            return None;
        }
        let (k, stride_a, stride_b, k_parts) = if native {
            // The kernel takes its part of the k tiles itself (`MatmulShape::k_parts`): any
            // count up to one tile a part, so the parts can fill the SMs.
            if splits > s.k.div_ceil(16) {
                return None;
            }
            (s.k, 0, 0, splits)
        } else {
            let kc = s.k / splits;
            if kc * splits != s.k || kc % 8 != 0 {
                return None;
            }
            let stride_a = if self.trans.0 {
                kc.checked_mul(s.lda)?
            } else {
                kc
            };
            let stride_b = if self.trans.1 {
                kc
            } else {
                kc.checked_mul(s.ldb)?
            };
            (kc, stride_a, stride_b, 1)
        };
        let mn = s.m.checked_mul(s.n)?;
        mn.checked_mul(splits)?;
        Some(MatmulShape {
            batch: splits,
            k,
            stride_a,
            stride_b,
            ldc: s.n,
            ldr: s.n,
            stride_c: mn,
            stride_r: mn,
            k_parts,
            ..*s
        })
    }

    /// The launch shape (`split_shape`) and kernel of `variant` (f32 output, no epilogue) that
    /// compute this product split `splits` ways, or `None` where it cannot be split so or the
    /// variant's tiles do not divide a part.
    pub(crate) fn split(
        &self,
        variant: MatmulVariant,
        splits: u32,
        subgroup: u32,
    ) -> Option<(MatmulShape, MatmulKernel)> {
        let sub = self.split_shape(splits, variant.is_native())?;
        let mut k = MatmulKernel::new(
            variant,
            self.input.storage(),
            DType::F32.storage(),
            self.trans,
            &sub,
            Epilogue::NONE,
            subgroup,
        );
        let w = vector_elems(variant) as usize;
        k.vec_a &= self.a.layout().offset() % w == 0;
        k.vec_b &= self.b.layout().offset() % w == 0;
        k.fits(&sub).then_some((sub, k))
    }

    /// Runs `plan`, a split plan, into `out`: the parts' products into a workspace, then
    /// their sum.
    pub(super) fn run_split(&self, plan: &Plan, out: &Tensor) -> Result<()> {
        let (sub, kernel) = self
            .split(plan.kernel.variant, plan.splits, plan.kernel.subgroup)
            .ok_or_else(|| {
                invalid(format!(
                    "this product cannot be split {} ways with variant {} (see \
                     MatmulOverrides::splits)",
                    plan.splits,
                    plan.kernel.variant.label()
                ))
            })?;
        let (m, n) = (sub.m as usize, sub.n as usize);
        let device = self.a.device();
        let partials = Tensor::empty(device, &[plan.splits as usize, m, n], DType::F32)?;
        self.record_shape(&kernel, &sub, &partials)?;
        // The k slices' f32 products summed in one pass that stores the output's dtype (a
        // sum then a cast was two passes, 48 a GPT-2 bf16 step).
        let len = to_u32("split-K product", m * n)?;
        device.sum_partial_rows(
            partials.buffer()?,
            out.buffer()?,
            None,
            (plan.splits, len),
            self.out,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    /// Native kernels take any part count up to one 16-deep k tile a part and cut k
    /// themselves (whole operands, `k_parts`); the SPIR-V kernels only equal parts of a
    /// multiple of 8, which they read through offset operands.
    #[test]
    fn split_shapes_cut_k_by_kernel_family() {
        let device = Device::from_env().expect("a Vulkan device");
        let a = Tensor::from_slice(&device, &[0.5f32; 24 * 1000], &[24, 1000]).expect("a");
        let b = Tensor::from_slice(&device, &[0.25f32; 1000 * 40], &[1000, 40]).expect("b");
        let p = Problem::new(&a, &b, &crate::ops::MatmulSpec::default()).expect("problem");

        let native = p.split_shape(7, true).expect("7 native parts");
        assert_eq!((native.batch, native.k, native.k_parts), (7, 1000, 7));
        assert_eq!(
            (native.stride_a, native.stride_b, native.stride_c),
            (0, 0, 24 * 40)
        );
        assert_eq!(p.split_shape(63, true).map(|s| s.k_parts), Some(63));
        assert_eq!(p.split_shape(64, true), None, "a part of no k tile");

        assert_eq!(p.split_shape(7, false), None, "1000 is not 7 equal parts");
        assert_eq!(p.split_shape(4, false), None, "250 is not a multiple of 8");
        let spirv = p.split_shape(5, false).expect("5 equal parts");
        assert_eq!((spirv.batch, spirv.k, spirv.k_parts), (5, 200, 1));
        assert_eq!((spirv.stride_a, spirv.stride_b), (200, 200 * 40));
        assert_eq!(p.split_shape(1, true), None);
    }
}
