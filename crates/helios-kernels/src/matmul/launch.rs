//! What a device can run (`MatmulCaps`, `MatmulKernel::feasible`/`fits`) and what a launch
//! passes (`MatmulAddresses`, `MatmulKernel::launch`): the host side of a kernel, apart from
//! the SPIR-V it emits.

use helios_spirv::KernelModule;

use super::{exact_k, vector_elems, MatmulKernel, MatmulShape, RowOp, Triangle, Variant, WgTile};
use crate::launch::{pack_push, Arg, Args, Launch};
use crate::storage::Storage;
use crate::KernelError;

/// Which operands allow vector accesses of `width` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alignment {
    pub a: bool,
    pub b: bool,
    pub c: bool,
}

impl Alignment {
    /// An operand may use `width`-element vectors when its contiguous extent, its leading
    /// dimension and its batch strides are multiples of `width` (then a vector never
    /// straddles a row, and every row starts aligned).
    pub fn of(s: &MatmulShape, trans_a: bool, trans_b: bool, width: u32) -> Alignment {
        let ok = |extent: u32, ld: u32, stride: u32, inner: u32| {
            extent % width == 0
                && ld % width == 0
                && (s.batch <= 1 || stride % width == 0)
                && (s.inner <= 1 || inner % width == 0)
        };
        Alignment {
            a: ok(
                if trans_a { s.m } else { s.k },
                s.lda,
                s.stride_a,
                s.inner_a,
            ),
            b: ok(
                if trans_b { s.k } else { s.n },
                s.ldb,
                s.stride_b,
                s.inner_b,
            ),
            c: ok(s.n, s.ldc, s.stride_c, s.inner_c) && ok(s.n, s.ldr, s.stride_r, s.inner_r),
        }
    }
}

/// Device properties the selection and the generators need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulCaps {
    pub max_shared_bytes: u32,
    pub max_invocations: u32,
    pub subgroup: u32,
    /// 16×16×16 f16×f16→f32 fragments (subgroup scope) are reported and enabled.
    pub coop_f16: bool,
    /// 16×16×16 bf16×bf16→f32 fragments are reported and enabled.
    pub coop_bf16: bool,
    /// Workgroup-scope matrices (VK_NV_cooperative_matrix2) the device runs, per input type.
    pub coop_wg: Vec<WgSupport>,
    /// Tensor-addressed loads of such matrices (`cooperativeMatrixTensorAddressing`).
    pub coop_wg_tensor: bool,
    /// On a CPU device (lavapipe), how many host threads run workgroups at once; `None` on
    /// GPUs.
    pub cpu_threads: Option<u32>,
    /// The PTX target of the device's native kernels (VK_NVX_binary_import), if it has them.
    pub native: Option<helios_ptx::Target>,
    /// Compute subgroups can add (what the `rows` kernels reduce with), none is narrower
    /// than 4 invocations (their shared memory holds 64 subgroups' sums) nor wider than 64
    /// (with B stored n × k, 64 invocations share a column).
    pub subgroup_add: bool,
}

/// One input type's workgroup-scope support: `m × n × k` products of f32-accumulated
/// matrices whose dimensions are multiples of `granularity` (at most `max_dimension`), in
/// workgroups of exactly `invocations`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgSupport {
    pub input: Storage,
    pub invocations: u32,
    pub granularity: [u32; 3],
    pub max_dimension: u32,
}

impl WgSupport {
    fn runs(&self, input: Storage, t: WgTile, invocations: u32) -> bool {
        let dims = [u32::from(t.bm), u32::from(t.bn), u32::from(t.bk)];
        self.input == input
            && self.invocations == invocations
            && dims
                .iter()
                .zip(self.granularity)
                .all(|(&d, g)| d % g.max(1) == 0 && d <= self.max_dimension)
    }
}

impl MatmulKernel {
    /// Whether this kernel can run on a device with `caps` (shared memory, workgroup size,
    /// fragment support for the input storage).
    pub fn feasible(&self, caps: &MatmulCaps) -> bool {
        let v = self.variant;
        if !v.well_formed()
            || v.shared_bytes(self.trans_a, self.trans_b) > caps.max_shared_bytes
            || v.threads(caps.subgroup) > caps.max_invocations
            || !self.epilogue.is_valid()
        {
            return false;
        }
        match v {
            Variant::Simt(_) => !self.epilogue.col_sums() || self.triangle == Triangle::Full,
            Variant::Native(t) => super::native::feasible(self, t, caps.native),
            Variant::Rows(_) => {
                self.triangle == Triangle::Full && !self.epilogue.col_sums() && caps.subgroup_add
            }
            _ if self.triangle.masks_a() || self.epilogue.col_sums() => false,
            Variant::Wg(t) => {
                (!t.tensor || (self.input == Storage::F16 && caps.coop_wg_tensor))
                    && self.epilogue.is_plain()
                    && self.triangle == Triangle::Full
                    && self.vec_a
                    && self.vec_b
                    && self.vec_c
                    && self.subgroup == caps.subgroup
                    && caps
                        .coop_wg
                        .iter()
                        .any(|s| s.runs(self.input, t, v.threads(caps.subgroup)))
            }
            Variant::Coop(t) => {
                let frags = match self.input {
                    Storage::F16 => caps.coop_f16,
                    Storage::BF16 => caps.coop_bf16,
                    Storage::F32 => false,
                };
                // Fragment-multiple shares and k steps: `well_formed`, checked above.
                frags
                    && caps.subgroup == self.subgroup
                    && super::coop::scratch(t, self.trans_a, self.trans_b, caps.subgroup).is_some()
            }
        }
    }

    /// Whether the kernel handles every size of `shape`: the `Wg` variants load whole tiles
    /// unchecked, so their tile must divide M, N and K exactly; the others take any shape,
    /// and only native kernels split k inside a launch (`MatmulShape::k_parts`).
    pub fn fits(&self, shape: &MatmulShape) -> bool {
        if shape.k_parts > 1 && !self.variant.is_native() {
            return false;
        }
        match self.variant {
            Variant::Wg(t) => {
                shape.m % u32::from(t.bm) == 0
                    && shape.n % u32::from(t.bn) == 0
                    && shape.k % u32::from(t.bk) == 0
            }
            // Stream-K spreads one matrix's k steps over the grid.
            Variant::Native(t) if t.stream => shape.batch <= 1 && shape.k_parts <= 1 && shape.k > 0,
            _ => true,
        }
    }

    /// Workgroups and push constants for `shape` with buffers at `addr`.
    pub fn launch(
        &self,
        module: &KernelModule,
        shape: &MatmulShape,
        addr: &MatmulAddresses,
        alpha: f32,
    ) -> Result<Launch, KernelError> {
        let bad = |detail: String| KernelError::Arguments {
            kernel: module.name.clone(),
            detail,
        };
        let al = Alignment::of(
            shape,
            self.trans_a,
            self.trans_b,
            vector_elems(self.variant),
        );
        if (self.vec_a && !al.a) || (self.vec_b && !al.b) || (self.vec_c && !al.c) {
            return Err(bad(format!(
                "built for vector accesses the shape does not allow: {shape:?}"
            )));
        }
        if !self.fits(shape) {
            return Err(bad(format!(
                "its tile does not divide the shape, or only a native kernel splits its k: \
                 {shape:?}"
            )));
        }
        if self.exact_k && (self.triangle != Triangle::Full || !exact_k(self.variant, shape)) {
            return Err(bad(format!(
                "built for a k that is a whole number of loop steps; k = {} is not",
                shape.k
            )));
        }
        if self.epilogue.bias() != addr.bias.is_some()
            || self.epilogue.residual() != addr.residual.is_some()
            || (self.epilogue.row() != RowOp::None) != addr.rows.is_some()
            || self.epilogue.store_pre() != addr.pre.is_some()
            || self.epilogue.col_sums() != addr.sums.is_some()
        {
            return Err(bad(
                "bias/residual/row/pre/sums buffers do not match the epilogue".into(),
            ));
        }
        if self.epilogue.col_sums()
            && (!matches!(self.variant, Variant::Simt(_))
                || shape.batch != 1
                || self.triangle != Triangle::Full)
        {
            return Err(bad(format!(
                "column sums need a SIMT tile, a batch of one and the whole k range; got {} \
                 with a batch of {}",
                self.variant.label(),
                shape.batch
            )));
        }
        let (bm, bn) = self.variant.tile();
        let gx = shape.n.div_ceil(bn);
        let gy = shape.m.div_ceil(bm);
        if shape.inner == 0 || shape.batch % shape.inner != 0 {
            return Err(bad(format!(
                "inner batch count {} does not divide the batch {}",
                shape.inner, shape.batch
            )));
        }
        if gy > 65535 || shape.batch > 65535 || gx > 65535 {
            return Err(KernelError::TooLarge {
                what: "matmul grid",
                size: u64::from(gx) * u64::from(gy) * u64::from(shape.batch),
            });
        }
        // Inline: this runs for every product recorded.
        let mut args = Args::new();
        args.extend([
            Arg::Address(addr.a),
            Arg::Address(addr.b),
            Arg::Address(addr.c),
        ]);
        if let Some(b) = addr.bias {
            args.push(Arg::Address(b));
        }
        if let Some(r) = addr.residual {
            args.push(Arg::Address(r));
        }
        if let Some(r) = addr.rows {
            args.push(Arg::Address(r));
        }
        if let Some(r) = addr.pre {
            args.push(Arg::Address(r));
        }
        if let Some(r) = addr.sums {
            args.push(Arg::Address(r));
        }
        args.extend(shape.launch_values().map(Arg::U32));
        args.push(Arg::F32(alpha));
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch {
            groups: [gx, gy, shape.batch],
            push,
        })
    }
}

/// Device addresses of a launch's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulAddresses {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub bias: Option<u64>,
    pub residual: Option<u64>,
    /// The row op's values (f32), when the epilogue has one.
    pub rows: Option<u64>,
    /// The second output (`Epilogue::store_pre`).
    pub pre: Option<u64>,
    /// B's column sums (`Epilogue::col_sums`).
    pub sums: Option<u64>,
    /// Where native kernels write their tensor maps
    /// ([`native_workspace_bytes`](crate::matmul::native_workspace_bytes) device-local bytes).
    pub maps: Option<u64>,
}
