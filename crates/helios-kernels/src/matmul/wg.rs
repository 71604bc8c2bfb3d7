//! Workgroup-scope cooperative-matrix matmul (VK_NV_cooperative_matrix2): the whole workgroup
//! owns one `bm × bk` A matrix, one `bk × bn` B matrix and the `bm × bn` f32 accumulator, and
//! the driver decides how they are staged through shared memory and spread over the matrix
//! units. The kernel itself is the textbook loop: load A and B straight from global memory,
//! multiply-accumulate, and store the scaled, converted accumulator once at the end.
//!
//! What a reader must know: loads read whole tiles without bounds checks (the extension's
//! clamped tensor loads need opcodes our SPIR-V tooling lacks), so a variant only runs on
//! shapes its tile divides exactly ([`MatmulKernel::fits`]) with 16-byte aligned operands,
//! and the epilogue is scaling and rounding only; everything else goes to the subgroup-scope
//! and SIMT variants.

use helios_spirv::{
    Binding, CoopLayout, CoopStride, CoopTy, CoopUse, KernelBuilder, KernelModule, Scalar,
};

use super::params::{declare, tile_origin};
use super::{MatmulKernel, WgTile};
use crate::storage::Storage;

/// Halves per 16-byte word: A and B are addressed as `vec4<u32>`.
const WORD: u32 = 8;

fn scalar(s: Storage) -> Scalar {
    match s {
        Storage::F16 => Scalar::F16,
        Storage::BF16 => Scalar::BF16,
        Storage::F32 => Scalar::F32,
    }
}

pub(crate) fn build(kern: &MatmulKernel, t: WgTile) -> KernelModule {
    let (bm, bn, bk) = (u32::from(t.bm), u32::from(t.bn), u32::from(t.bk));
    let threads = kern.variant.threads(kern.subgroup);
    let mut k = KernelBuilder::new(kern.name(), Binding::DeviceAddress, [threads, 1, 1]);
    let operand = if t.tensor {
        scalar(kern.input)
    } else {
        Scalar::U32
    };
    let p = declare(&mut k, kern, operand, operand);
    k.begin();

    let (d, m0, n0) = tile_origin(&mut k, &p, bm, bn);
    let word = k.u32(WORD);
    let lda = k.div(d.lda, word);
    let ldb = k.div(d.ldb, word);

    let input = scalar(kern.input);
    let ta = CoopTy::workgroup(input, bm, bk, CoopUse::A);
    let tb = CoopTy::workgroup(input, bk, bn, CoopUse::B);
    let tc = CoopTy::workgroup(Scalar::F32, bm, bn, CoopUse::Accumulator);
    let acc = k.coop_var(tc);
    let zero = k.coop_zero(tc);
    k.coop_set(acc, zero);

    // Element offsets of the tile's first A row / B column at k = 0; a k step moves A by
    // `bk` elements along its k direction (`bk · lda` when A is stored K×M), B likewise.
    let (a_base, a_step, a_layout) = if kern.trans_a {
        (m0, d.lda, CoopLayout::ColumnMajor)
    } else {
        (k.mul(m0, d.lda), k.u32(1), CoopLayout::RowMajor)
    };
    let (b_base, b_step, b_layout) = if kern.trans_b {
        (k.mul(n0, d.ldb), k.u32(1), CoopLayout::ColumnMajor)
    } else {
        (n0, d.ldb, CoopLayout::RowMajor)
    };
    let a_base = k.add(a_base, d.off_a);
    let b_base = k.add(b_base, d.off_b);
    let load = |k: &mut KernelBuilder, k0| {
        let a_at = k.mul(k0, a_step);
        let a_at = k.add(a_base, a_at);
        let a_at = k.div(a_at, word);
        let b_at = k.mul(k0, b_step);
        let b_at = k.add(b_base, b_at);
        let b_at = k.div(b_at, word);
        let a = k.coop_load(
            ta,
            p.a,
            4,
            a_at,
            CoopStride {
                stride: lda,
                layout: a_layout,
            },
            16,
        );
        let b = k.coop_load(
            tb,
            p.b,
            4,
            b_at,
            CoopStride {
                stride: ldb,
                layout: b_layout,
            },
            16,
        );
        (a, b)
    };
    let zero_k = k.u32(0);
    let step = k.u32(bk);
    if t.tensor {
        // Each operand as a 2-D tensor in its stored orientation; a transposed one is read
        // through a view that swaps the coordinates.
        let view = (kern.trans_a || kern.trans_b).then(|| k.tensor_view_transpose());
        let (a_rows, a_cols) = if kern.trans_a { (d.k, d.m) } else { (d.m, d.k) };
        let (b_rows, b_cols) = if kern.trans_b { (d.n, d.k) } else { (d.k, d.n) };
        let la = k.tensor_layout_2d(a_rows, a_cols, d.lda);
        let lb = k.tensor_layout_2d(b_rows, b_cols, d.ldb);
        k.for_range(zero_k, d.k, step, |k, k0| {
            let sa = if kern.trans_a {
                k.tensor_slice(la, k0, bk, m0, bm)
            } else {
                k.tensor_slice(la, m0, bm, k0, bk)
            };
            let sb = if kern.trans_b {
                k.tensor_slice(lb, n0, bn, k0, bk)
            } else {
                k.tensor_slice(lb, k0, bk, n0, bn)
            };
            let va = if kern.trans_a { view } else { None };
            let vb = if kern.trans_b { view } else { None };
            let a = k.coop_load_tensor(ta, p.a, d.off_a, sa, va);
            let b = k.coop_load_tensor(tb, p.b, d.off_b, sb, vb);
            let c = k.coop_get(acc);
            let c = k.coop_muladd(a, b, c);
            k.coop_set(acc, c);
        });
    } else if t.prefetch {
        // The next step's operands are loaded before this step's product is issued.
        let (va, vb) = (k.coop_var(ta), k.coop_var(tb));
        let (a, b) = load(&mut k, zero_k);
        k.coop_set(va, a);
        k.coop_set(vb, b);
        k.for_range(step, d.k, step, |k, k0| {
            let (a, b) = (k.coop_get(va), k.coop_get(vb));
            let (na, nb) = load(k, k0);
            k.coop_set(va, na);
            k.coop_set(vb, nb);
            let c = k.coop_get(acc);
            let c = k.coop_muladd(a, b, c);
            k.coop_set(acc, c);
        });
        let (a, b) = (k.coop_get(va), k.coop_get(vb));
        let c = k.coop_get(acc);
        let c = k.coop_muladd(a, b, c);
        k.coop_set(acc, c);
    } else {
        k.for_range(zero_k, d.k, step, |k, k0| {
            let (a, b) = load(k, k0);
            let c = k.coop_get(acc);
            let c = k.coop_muladd(a, b, c);
            k.coop_set(acc, c);
        });
    }

    let c = k.coop_get(acc);
    let c = k.coop_scale(c, d.alpha);
    let c = k.coop_convert(c, scalar(kern.out));
    let at = k.mul(m0, d.ldc);
    let at = k.add(at, n0);
    let at = k.add(at, d.off_c);
    k.coop_store(
        c,
        p.c,
        1,
        at,
        CoopStride {
            stride: d.ldc,
            layout: CoopLayout::RowMajor,
        },
        16,
    );
    k.finish()
}
