//! What every SPIR-V matmul kernel declares and loads first: its buffers and push constants
//! (in launch order, which `MatmulKernel::launch` packs), and the workgroup's batch and tile.

use helios_spirv::{Access, Buffer, KernelBuilder, Param, Scalar, Ty, Val};

use super::{MatmulKernel, RowOp};
use crate::storage::buffer_scalar;

/// The buffers and push constants every matmul kernel declares, in launch order.
pub(crate) struct Params {
    pub a: Buffer,
    pub b: Buffer,
    pub c: Buffer,
    pub bias: Option<Buffer>,
    pub residual: Option<Buffer>,
    pub rows: Option<Buffer>,
    pub pre: Option<Buffer>,
    pub sums: Option<Buffer>,
    pub m: Param,
    pub n: Param,
    pub k: Param,
    pub lda: Param,
    pub ldb: Param,
    pub ldc: Param,
    pub ldr: Param,
    pub stride_a: Param,
    pub stride_b: Param,
    pub stride_c: Param,
    pub stride_r: Param,
    pub inner: [Param; 5],
    pub alpha: Param,
}

/// Declares the parameters; A and B are declared with `a_elem`/`b_elem` (the SIMT kernels use
/// the storage's scalar, the cooperative ones `u32`/`u16` words they reinterpret).
pub(crate) fn declare(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    a_elem: Scalar,
    b_elem: Scalar,
) -> Params {
    let out = buffer_scalar(kern.out);
    let a = k.buffer("a", a_elem, Access::Read);
    let b = k.buffer("b", b_elem, Access::Read);
    let c = k.buffer("c", out, Access::Write);
    let bias = kern
        .epilogue
        .bias()
        .then(|| k.buffer("bias", out, Access::Read));
    let residual = kern
        .epilogue
        .residual()
        .then(|| k.buffer("residual", out, Access::Read));
    let rows =
        (kern.epilogue.row() != RowOp::None).then(|| k.buffer("rows", Scalar::F32, Access::Read));
    let pre = kern
        .epilogue
        .store_pre()
        .then(|| k.buffer("pre", out, Access::Write));
    let sums = kern
        .epilogue
        .col_sums()
        .then(|| k.buffer("sums", out, Access::Write));
    let u = Ty::scalar(Scalar::U32);
    let mut p = |name: &str| k.param(name, u);
    let (m, n, kk) = (p("m"), p("n"), p("k"));
    let (lda, ldb, ldc, ldr) = (p("lda"), p("ldb"), p("ldc"), p("ldr"));
    let (stride_a, stride_b, stride_c, stride_r) =
        (p("stride_a"), p("stride_b"), p("stride_c"), p("stride_r"));
    let inner = ["inner", "inner_a", "inner_b", "inner_c", "inner_r"].map(&mut p);
    let alpha = k.param("alpha", Ty::scalar(Scalar::F32));
    Params {
        a,
        b,
        c,
        bias,
        residual,
        rows,
        pre,
        sums,
        m,
        n,
        k: kk,
        lda,
        ldb,
        ldc,
        ldr,
        stride_a,
        stride_b,
        stride_c,
        stride_r,
        inner,
        alpha,
    }
}

/// Push-constant values loaded once at the top of a kernel.
#[derive(Clone, Copy)]
pub(crate) struct Dims {
    pub m: Val,
    pub n: Val,
    pub k: Val,
    pub lda: Val,
    pub ldb: Val,
    pub ldc: Val,
    pub ldr: Val,
    pub alpha: Val,
    /// This workgroup's (flat) batch index.
    pub batch: Val,
    /// Element offsets of this workgroup's batch in A, B, C and the residual.
    pub off_a: Val,
    pub off_b: Val,
    pub off_c: Val,
    pub off_r: Val,
}

fn load_dims(k: &mut KernelBuilder, p: &Params, batch: Val) -> Dims {
    let ld = |k: &mut KernelBuilder, q: Param| k.load_param(q);
    let (m, n, kk) = (ld(k, p.m), ld(k, p.n), ld(k, p.k));
    let (lda, ldb, ldc, ldr) = (ld(k, p.lda), ld(k, p.ldb), ld(k, p.ldc), ld(k, p.ldr));
    let alpha = ld(k, p.alpha);
    // Batch `batch` is (outer, inner) = (batch / inner, batch % inner).
    let inner = ld(k, p.inner[0]);
    let outer_i = k.div(batch, inner);
    let inner_i = k.rem(batch, inner);
    let off = |k: &mut KernelBuilder, q: Param, qi: Param| {
        let s = k.load_param(q);
        let si = k.load_param(qi);
        let o = k.mul(outer_i, s);
        let i = k.mul(inner_i, si);
        k.add(o, i)
    };
    let off_a = off(k, p.stride_a, p.inner[1]);
    let off_b = off(k, p.stride_b, p.inner[2]);
    let off_c = off(k, p.stride_c, p.inner[3]);
    let off_r = off(k, p.stride_r, p.inner[4]);
    Dims {
        m,
        n,
        k: kk,
        lda,
        ldb,
        ldc,
        ldr,
        alpha,
        batch,
        off_a,
        off_b,
        off_c,
        off_r,
    }
}

/// This workgroup's problem: the launch's dimensions (with its batch's offsets) and the
/// first row and column of its `bm × bn` output tile.
pub(crate) fn tile_origin(k: &mut KernelBuilder, p: &Params, bm: u32, bn: u32) -> (Dims, Val, Val) {
    let (tile_m, tile_n, batch) = tile_coords(k);
    let d = load_dims(k, p, batch);
    let bm_v = k.u32(bm);
    let bn_v = k.u32(bn);
    let m0 = k.mul(tile_m, bm_v);
    let n0 = k.mul(tile_n, bn_v);
    (d, m0, n0)
}

/// Workgroup tile coordinates (row tile, column tile) with grouped rasterization: runs of
/// `GROUP` row tiles are walked column by column, so workgroups running together share A
/// row panels and B column panels in L2.
fn tile_coords(k: &mut KernelBuilder) -> (Val, Val, Val) {
    const GROUP: u32 = 8;
    let wid = k.workgroup_id();
    let nwg = k.num_workgroups();
    let (x, y, z) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(wid, 2));
    let (gx, gy) = (k.extract(nwg, 0), k.extract(nwg, 1));
    let row_len = k.mul(y, gx);
    let pid = k.add(row_len, x);
    let g = k.u32(GROUP);
    let per_group = k.mul(g, gx);
    let group = k.div(pid, per_group);
    let first = k.mul(group, g);
    let left = k.sub(gy, first);
    let size = k.min(left, g);
    let in_group = k.rem(pid, per_group);
    let r = k.rem(in_group, size);
    let tile_m = k.add(first, r);
    let tile_n = k.div(in_group, size);
    (tile_m, tile_n, z)
}
