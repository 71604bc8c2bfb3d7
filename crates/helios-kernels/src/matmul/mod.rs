//! Matrix multiply: `C[b] = epilogue(alpha · op(A[b]) · op(B[b]))` for a batch of strided
//! matrices, with `op` the identity or a transpose read in place (no transpose pass).
//!
//! The kernel families share this module's signature, launch and epilogue code:
//! - `simt`: tiled FMA kernels for any storage (f32 math), the portable path;
//! - `coop`: cooperative-matrix kernels for f16/bf16 inputs with f32 accumulation,
//!   double-buffered through shared memory, where the device reports the fragment shapes;
//! - `wg`: workgroup-scope matrices (VK_NV_cooperative_matrix2);
//! - `native`: PTX with Hopper's `wgmma` for NVIDIA's native path (helios-ptx), built
//!   by `MatmulKernel::build_native` instead of `build`;
//! - `rows`: products of a few rows (decoding), k split across a workgroup's invocations.
//!
//! The variant table (`VARIANTS`) names every tile configuration; `default_variant` is the one
//! documented selection rule used before (or without) the autotuner in `helios`, which times
//! the feasible candidates and persists the winner. Key decision: a kernel's signature holds
//! only what changes the SPIR-V (variant, storages, transposes, which operands may use
//! 16-byte vector accesses, epilogue); sizes, leading dimensions, batch strides and alpha are
//! push constants, so one pipeline serves every shape with the same alignment.
//!
//! Files: this one holds the signature (`MatmulKernel`, `MatmulShape`) and its name; `variant`
//! the tiles and their table, `epilogue` what happens to a product before it is stored (and
//! the SPIR-V that does it), `launch` what a device runs and the push constants of a launch,
//! `select` the default choice and the tuner's candidates. The SPIR-V generators (`simt`,
//! `coop`, `wg`, `rows`) build on `params` (the declared buffers and push constants, the workgroup's
//! tile) and `kloop` (the staged k loop and its loads' bounds); `native` builds PTX on its own.

mod coop;
mod epilogue;
mod kloop;
mod launch;
mod native;
mod params;
mod rows;
mod select;
mod simt;
mod variant;
mod wg;

pub use crate::native_maps::{native_workspace_bytes, NATIVE_MAPS_BYTES};
pub use coop::CoopPeakKernel;
pub use epilogue::{Activation, Epilogue, RowOp, Triangle};
pub use launch::{Alignment, MatmulAddresses, MatmulCaps, WgSupport};
pub use native::NativeLaunch;
pub use select::{candidates, default_variant};
pub use variant::{
    native_variants, vector_elems, CoopTile, NativeTile, RowsTile, SimtTile, Variant, WgTile,
    BK_SIMT, FRAG, ROWS_THREADS, VARIANTS, WG_GRANULE,
};

use helios_spirv::KernelModule;

use crate::storage::Storage;

/// The signature of a matmul kernel: everything that changes the emitted SPIR-V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulKernel {
    pub variant: Variant,
    /// Storage of A and B.
    pub input: Storage,
    /// Storage of C (and of bias and residual).
    pub out: Storage,
    /// A is stored K×M (read as its transpose).
    pub trans_a: bool,
    /// B is stored N×K.
    pub trans_b: bool,
    /// A, B, C (and residual) may use vector accesses along their contiguous dimension
    /// (see `Alignment::of`).
    pub vec_a: bool,
    pub vec_b: bool,
    pub vec_c: bool,
    pub epilogue: Epilogue,
    /// Which triangle the product skips (`Triangle::Full` for every ordinary product).
    pub triangle: Triangle,
    /// Subgroup size the cooperative kernels are built for (0 for SIMT).
    pub subgroup: u32,
    /// k is a whole number of the k loop's unrolled steps (see [`exact_k`]) and the whole of
    /// k is run, so no tile the loop computes passes the end: its loads need no per-element
    /// k clamp and its shared-memory stores no mask, which made the f32 GPT-2 products
    /// faster (bench/results/2026-11-25-matmul-f32-h100-session14-exact-k.txt).
    pub exact_k: bool,
}

/// Whether `variant` may run `shape` with [`MatmulKernel::exact_k`]: k a multiple of the
/// loop's unrolled step (SIMT [`SimtTile::k_step`], cooperative `bk` × prefetch depth;
/// workgroup scope never). The triangle forms, whose k range varies per tile, never do
/// (`Problem::kernel`).
pub fn exact_k(variant: Variant, shape: &MatmulShape) -> bool {
    let step = match variant {
        Variant::Simt(t) => t.k_step(),
        Variant::Coop(t) => u32::from(t.bk) * u32::from(t.depth.max(1)),
        Variant::Wg(_) | Variant::Native(_) | Variant::Rows(_) => return false,
    };
    shape.k > 0 && shape.k % step == 0
}

/// Sizes and strides of one launch (all in elements). A is `m × k` (stored `k × m` when
/// transposed) with leading dimension `lda`; B is `k × n` (`n × k`) with `ldb`; C and the
/// residual are `m × n` row-major with `ldc`/`ldr`. The batch may have two levels, as the
/// (B, H) heads of attention viewed in place do: batch `i` is (`i / inner`, `i % inner`) and
/// starts at `(i / inner) · stride_* + (i % inner) · inner_*` (`inner` 1: `i · stride_*`).
///
/// `k_parts` above 1 splits k inside the launch (native kernels only): batch `i` then
/// multiplies only its part `i % k_parts` of the k tiles, parts differing by at most one
/// tile, so a split need not divide k (`crate::matmul` callers sum the parts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulShape {
    pub batch: u32,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub lda: u32,
    pub ldb: u32,
    pub ldc: u32,
    pub ldr: u32,
    pub stride_a: u32,
    pub stride_b: u32,
    pub stride_c: u32,
    pub stride_r: u32,
    /// Inner batch count (1: one level); it divides `batch`.
    pub inner: u32,
    pub inner_a: u32,
    pub inner_b: u32,
    pub inner_c: u32,
    pub inner_r: u32,
    pub k_parts: u32,
}

impl MatmulShape {
    /// Packed (contiguous) operands for these transposes.
    pub fn packed(batch: u32, m: u32, n: u32, k: u32, trans_a: bool, trans_b: bool) -> Self {
        MatmulShape {
            batch,
            m,
            n,
            k,
            lda: if trans_a { m } else { k },
            ldb: if trans_b { k } else { n },
            ldc: n,
            ldr: n,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            stride_r: m * n,
            inner: 1,
            inner_a: 0,
            inner_b: 0,
            inner_c: 0,
            inner_r: 0,
            k_parts: 1,
        }
    }

    /// The sizes, leading dimensions and batch strides as every matmul kernel takes them,
    /// after its buffers (the SPIR-V push constants and the native kernels' parameters).
    pub(crate) fn launch_values(&self) -> [u32; 16] {
        [
            self.m,
            self.n,
            self.k,
            self.lda,
            self.ldb,
            self.ldc,
            self.ldr,
            self.stride_a,
            self.stride_b,
            self.stride_c,
            self.stride_r,
            self.inner,
            self.inner_a,
            self.inner_b,
            self.inner_c,
            self.inner_r,
        ]
    }

    /// Multiply-adds × 2.
    pub fn flops(&self) -> f64 {
        2.0 * f64::from(self.batch) * f64::from(self.m) * f64::from(self.n) * f64::from(self.k)
    }
}

impl MatmulKernel {
    /// The kernel for `variant` on this problem: vector flags from the shape's alignment.
    pub fn new(
        variant: Variant,
        input: Storage,
        out: Storage,
        trans: (bool, bool),
        shape: &MatmulShape,
        epilogue: Epilogue,
        subgroup: u32,
    ) -> MatmulKernel {
        let al = Alignment::of(shape, trans.0, trans.1, vector_elems(variant));
        MatmulKernel {
            variant,
            input,
            out,
            trans_a: trans.0,
            trans_b: trans.1,
            vec_a: al.a,
            vec_b: al.b,
            vec_c: al.c,
            epilogue,
            triangle: Triangle::Full,
            subgroup: if variant.is_coop() { subgroup } else { 0 },
            exact_k: exact_k(variant, shape),
        }
    }

    /// `mm_<variant>_<in>_<out>_<nn|nt|tn|tt>[_v<abc>][_<epilogue>][_tri<lc|la|ua>]`.
    pub fn name(&self) -> String {
        let t = |x: bool| if x { 't' } else { 'n' };
        let mut vec = String::new();
        for (flag, c) in [(self.vec_a, 'a'), (self.vec_b, 'b'), (self.vec_c, 'c')] {
            if flag {
                vec.push(c);
            }
        }
        format!(
            "mm_{}_{}_{}_{}{}{}{}{}",
            self.variant.label(),
            self.input.name(),
            self.out.name(),
            t(self.trans_a),
            t(self.trans_b),
            if vec.is_empty() {
                String::new()
            } else {
                format!("_v{vec}")
            },
            self.epilogue.tag(),
            self.triangle.tag()
        ) + if self.exact_k { "_xk" } else { "" }
    }

    /// Emits the kernel.
    pub fn build(&self) -> KernelModule {
        match self.variant {
            Variant::Simt(t) => simt::build(self, t),
            Variant::Coop(t) => coop::build(self, t),
            Variant::Wg(t) => wg::build(self, t),
            Variant::Rows(t) => rows::build(self, t),
            // Native kernels are PTX (`build_native`); callers branch on `is_native` first.
            Variant::Native(_) => {
                unreachable!("{} is a native kernel: use build_native", self.name())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exact_k` holds exactly where k is a whole number of the loop's unrolled steps:
    /// SIMT 8 × (depth + 1) (the spare register set), cooperative bk × depth, never for
    /// workgroup scope or k = 0.
    #[test]
    fn exact_k_follows_the_loop_step() {
        let shape = |k: u32| MatmulShape::packed(1, 64, 64, k, false, false);
        let v = |name: &str| Variant::by_name(name).expect("a variant of the table");
        for (name, step) in [
            ("simt128x64d1", 16),
            ("simt64x64d2", 24),
            ("coop128x256w2x4k48s1", 48),
            ("coop128x128w4x4k32d2", 64),
            ("coop128x256w2x4k16d1", 16),
        ] {
            for k in [step, 2 * step, 768, 3072, 8192, step + 8, 0] {
                let want = k > 0 && k % step == 0;
                assert_eq!(exact_k(v(name), &shape(k)), want, "{name} k = {k}");
            }
        }
        assert!(!exact_k(v("wg128x128k16w4p"), &shape(1024)));
        // The constructor sets it from the shape; launch refuses a shape it does not fit.
        let kern = MatmulKernel::new(
            v("simt128x64d1"),
            Storage::F32,
            Storage::F32,
            (false, false),
            &shape(48),
            Epilogue::NONE,
            0,
        );
        assert!(kern.exact_k && kern.name().ends_with("_xk"));
        let module = kern.build();
        let addr = MatmulAddresses {
            a: 0,
            b: 0,
            c: 0,
            bias: None,
            residual: None,
            rows: None,
            pre: None,
            sums: None,
            maps: None,
        };
        assert!(kern.launch(&module, &shape(48), &addr, 1.0).is_ok());
        assert!(kern.launch(&module, &shape(40), &addr, 1.0).is_err());
    }
}
