//! Tiled transpose: a dense `[batch, rows, cols]` copy of a view whose *rows* are the axis
//! that is contiguous in memory (element `(b, i, j)` at `offset + b·sb + i + j·sj`), such as
//! `w.transpose(0, 1)` of a row-major `w`.
//!
//! The one decision a reader must know: the element-wise copy maps consecutive invocations
//! to consecutive output elements, so on such a view every invocation of a subgroup reads
//! a different `sj`-strided element: each load moves a whole 32-byte sector for 2 or 4
//! useful bytes. Here a workgroup moves a 32×32 tile through shared memory instead: it
//! reads the tile down its columns (consecutive invocations, consecutive `i`), and writes
//! it along its rows (consecutive `j`), so both sides move whole sectors. The tile holds f32
//! (f16 and bf16 widen exactly and narrow back to the same bits), with one word of padding
//! per row so that the column reads hit 32 distinct banks.

use helios_spirv::{
    Access, Binding, KernelBuilder, KernelModule, Scalar, Shared, SharedLen, Ty, Val,
};

use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::rows::linear_workgroup;
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};
use crate::KernelError;

/// Edge of the square tile a workgroup moves.
pub const TRANSPOSE_TILE: u32 = 32;
/// Invocations along the tile's second axis: each moves `TILE / ROWS` elements each way.
const ROWS: u32 = 8;
/// Invocations per workgroup.
pub const TRANSPOSE_WORKGROUP: u32 = TRANSPOSE_TILE * ROWS;

/// A `TRANSPOSE_TILE`² tile of f32 that a `TRANSPOSE_WORKGROUP`-invocation workgroup moves
/// through shared memory: invocation (tx, ty) fills element (ty + 8q, tx) of it for each q
/// (`fill`), and after a barrier reads element (tx, ty + 8q) back (`drain`), the transposed
/// one. One word of padding per row keeps both walks on 32 distinct banks.
pub(crate) struct SharedTile {
    tile: Shared,
    /// The invocation's column when filling, its row when draining.
    pub tx: Val,
    ty: Val,
    pad: Val,
}

impl SharedTile {
    /// Declares the tile (after `begin`) and the invocation's place in it.
    pub(crate) fn new(k: &mut KernelBuilder) -> Self {
        let t = TRANSPOSE_TILE;
        let tile = k.shared_array(Ty::scalar(Scalar::F32), SharedLen::Fixed(t * (t + 1)));
        let tc = k.u32(t);
        let lid = k.local_index();
        let tx = k.rem(lid, tc);
        let ty = k.div(lid, tc);
        let pad = k.u32(t + 1);
        SharedTile { tile, tx, ty, pad }
    }

    /// Tiles along an axis of `n` elements: ⌈n / TRANSPOSE_TILE⌉.
    pub(crate) fn along(k: &mut KernelBuilder, n: Val) -> Val {
        let t = k.u32(TRANSPOSE_TILE);
        let tm1 = k.u32(TRANSPOSE_TILE - 1);
        let up = k.add(n, tm1);
        k.div(up, t)
    }

    /// Stores `value(k, i)` at (i, tx) for each of the invocation's rows i = ty + 8q.
    pub(crate) fn fill(
        &self,
        k: &mut KernelBuilder,
        mut value: impl FnMut(&mut KernelBuilder, Val) -> Val,
    ) {
        for q in 0..TRANSPOSE_TILE / ROWS {
            let dq = k.u32(q * ROWS);
            let i = k.add(self.ty, dq);
            let v = value(k, i);
            let w = k.mul(i, self.pad);
            let w = k.add(w, self.tx);
            k.shared_store(self.tile, w, v);
        }
    }

    /// After a workgroup barrier: `store(k, j, v)` with v = (tx, j) for each of the
    /// invocation's columns j = ty + 8q.
    pub(crate) fn drain(
        &self,
        k: &mut KernelBuilder,
        mut store: impl FnMut(&mut KernelBuilder, Val, Val),
    ) {
        for q in 0..TRANSPOSE_TILE / ROWS {
            let dq = k.u32(q * ROWS);
            let j = k.add(self.ty, dq);
            let w = k.mul(self.tx, self.pad);
            let w = k.add(w, j);
            let v = k.shared_load(self.tile, w);
            store(k, j, v);
        }
    }
}

/// The signature of a transpose kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransposeKernel {
    pub storage: Storage,
    pub binding: Binding,
}

/// One transpose: `dst[b, i, j] = src[offset + b·batch_stride + i + j·col_stride]` for
/// `b < batch`, `i < rows`, `j < cols`, with `dst` dense. Element units throughout.
#[derive(Clone, Copy, Debug, Default)]
pub struct TransposeArgs {
    pub src: u64,
    pub dst: u64,
    pub batch: u32,
    pub rows: u32,
    pub cols: u32,
    pub offset: u32,
    pub batch_stride: u32,
    pub col_stride: u32,
}

impl TransposeKernel {
    pub fn name(&self) -> String {
        format!("transpose_{}_t{TRANSPOSE_TILE}", self.storage.name())
    }

    pub fn build(&self) -> KernelModule {
        let t = TRANSPOSE_TILE;
        let mut k = KernelBuilder::new(self.name(), self.binding, [TRANSPOSE_WORKGROUP, 1, 1]);
        let elem = buffer_scalar(self.storage);
        let src = k.buffer("src", elem, Access::Read);
        let dst = k.buffer("dst", elem, Access::Write);
        let u = Ty::scalar(Scalar::U32);
        let params = [
            "batch",
            "rows",
            "cols",
            "offset",
            "batch_stride",
            "col_stride",
        ]
        .map(|name| k.param(name, u));
        k.begin();
        let [batch, rows, cols, offset, batch_stride, col_stride] = params.map(|p| k.load_param(p));
        let tile = SharedTile::new(&mut k);

        // Which tile: workgroups walk the tiles of a matrix row by row, then the batch.
        let g = linear_workgroup(&mut k);
        let tc = k.u32(t);
        let tiles_c = SharedTile::along(&mut k, cols);
        let tiles_r = SharedTile::along(&mut k, rows);
        let per_matrix = k.mul(tiles_r, tiles_c);
        let b = k.div(g, per_matrix);
        let rest = k.rem(g, per_matrix);
        let tr = k.div(rest, tiles_c);
        let tcol = k.rem(rest, tiles_c);
        let i0 = k.mul(tr, tc);
        let j0 = k.mul(tcol, tc);
        // A workgroup past the last matrix (a folded grid's spares) moves nothing, but still
        // reaches the barrier.
        let live = k.lt(b, batch);
        let tx = tile.tx;
        let src_base = k.mul(b, batch_stride);
        let src_base = k.add(src_base, offset);
        let plane = k.mul(rows, cols);
        let dst_base = k.mul(b, plane);

        // Down the columns: invocation tx reads row i0 + tx of columns j0 + ty + 8q, and puts
        // it at tile[j - j0][i - i0].
        let i = k.add(i0, tx);
        let i_in = k.lt(i, rows);
        let i_in = k.and(i_in, live);
        tile.fill(&mut k, |k, jj| {
            let j = k.add(j0, jj);
            let j_in = k.lt(j, cols);
            let inside = k.and(i_in, j_in);
            let at = k.mul(j, col_stride);
            let at = k.add(at, i);
            let at = k.add(at, src_base);
            let zero = k.u32(0);
            let at = k.select(inside, at, zero);
            load_f32(k, src, at, 1, self.storage)
        });
        k.workgroup_barrier();
        // Along the rows: invocation tx writes column j0 + tx of rows i0 + ty + 8q.
        let j = k.add(j0, tx);
        let j_in = k.lt(j, cols);
        let j_in = k.and(j_in, live);
        tile.drain(&mut k, |k, ii, v| {
            let i = k.add(i0, ii);
            let i_in = k.lt(i, rows);
            let inside = k.and(i_in, j_in);
            k.if_(inside, |k| {
                let at = k.mul(i, cols);
                let at = k.add(at, j);
                let at = k.add(at, dst_base);
                store_f32(k, dst, at, v, self.storage);
            });
        });
        k.finish()
    }

    /// The launch: one workgroup per tile, buffers by address (ignored with descriptors).
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        a: &TransposeArgs,
    ) -> Result<Launch, KernelError> {
        let t = u64::from(TRANSPOSE_TILE);
        let tiles = u64::from(a.rows).div_ceil(t) * u64::from(a.cols).div_ceil(t);
        let groups = grid(tiles * u64::from(a.batch), geometry.max_groups_x)?;
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.extend([Arg::Address(a.src), Arg::Address(a.dst)]);
        }
        args.extend(
            [
                a.batch,
                a.rows,
                a.cols,
                a.offset,
                a.batch_stride,
                a.col_stride,
            ]
            .map(Arg::U32),
        );
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }

    /// Kernels for validation: every storage, both binding models.
    pub fn samples() -> Vec<TransposeKernel> {
        let mut out = Vec::new();
        for binding in [Binding::DeviceAddress, Binding::Descriptor] {
            for storage in Storage::ALL {
                out.push(TransposeKernel { storage, binding });
            }
        }
        out
    }
}
