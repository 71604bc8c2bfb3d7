//! What every attention generator declares and reads: a stage's buffers and push constants
//! ([`AttentionKernel::declare`], in the order `AttentionKernel::build` documents), the
//! strided views they describe, and the grid and key-range arithmetic the stages share
//! (block coordinates, key and query block ranges, masks, row-statistics indices).

use helios_spirv::{Access, Buffer, KernelBuilder, Param, Scalar, Ty, Val};

use super::signature::{AttentionKernel, AttnStage};
use crate::storage::buffer_scalar;

/// Rows t0..t0+count of head (b, h), zeros at t >= tend: what a stage stages from a view
/// (the SIMT tiles, `frag::stage`), as one value, so none gets swapped.
#[derive(Clone, Copy)]
pub(crate) struct TileRows {
    pub(crate) b: Val,
    pub(crate) h: Val,
    pub(crate) t0: Val,
    pub(crate) tend: Val,
    pub(crate) count: u32,
}

/// A strided view inside a kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    pub buf: Buffer,
    off: Val,
    sb: Val,
    st: Val,
    sh: Val,
}

impl View {
    /// Element index of (b, t, h, 0).
    pub fn row(&self, k: &mut KernelBuilder, b: Val, t: Val, h: Val) -> Val {
        let x = k.mul(b, self.sb);
        let y = k.mul(t, self.st);
        let z = k.mul(h, self.sh);
        let x = k.add(x, y);
        let x = k.add(x, z);
        k.add(x, self.off)
    }

    /// Whether every row starts on a multiple of 4 elements (offset and strides are).
    pub fn vec4_aligned(&self, k: &mut KernelBuilder) -> Val {
        let x = k.or(self.off, self.sb);
        let y = k.or(self.st, self.sh);
        let x = k.or(x, y);
        let three = k.u32(3);
        let x = k.and(x, three);
        let zero = k.u32(0);
        k.eq(x, zero)
    }
}

/// A kernel's parameters, loaded.
#[derive(Clone)]
pub(crate) struct Params {
    /// Strided inputs in declaration order: Forward q, k, v; Prep o, do; backward q, k, v, do.
    pub views: Vec<View>,
    /// L (Forward: written; backward: read).
    pub lse: Option<Buffer>,
    /// Dsum (Prep and a Dq with `own_dsum`: written; backward: read).
    pub dsum: Option<Buffer>,
    /// O, dense [B, T, H, D] (a Dq with `own_dsum`).
    pub o: Option<Buffer>,
    pub lens: Option<Buffer>,
    /// Outputs: Forward o; DkDv dk, dv; Dq dq. Dense [B, T, H, D], or with `packed` the
    /// slices of one [B, T, 3, H, D] tensor (offsets 0, HD, 2HD, row stride 3HD).
    pub outs: Vec<View>,
    pub t: Val,
    pub heads: Val,
    pub batch: Val,
    pub scale: Val,
}

impl AttentionKernel {
    /// Declares the buffers and push constants (see `build`), then begins the body; with
    /// `words` the strided inputs are u32 buffers (16-byte loads of 8 halves).
    pub(crate) fn declare(&self, k: &mut KernelBuilder, words: bool) -> Params {
        let elem = if words {
            Scalar::U32
        } else {
            buffer_scalar(self.storage)
        };
        let f32s = Scalar::F32;
        let names: &[&str] = match self.stage {
            AttnStage::Forward => &["q", "k", "v"],
            AttnStage::Prep => &["o", "do"],
            _ => &["q", "k", "v", "do"],
        };
        let ins: Vec<Buffer> = names
            .iter()
            .map(|n| k.buffer(n, elem, Access::Read))
            .collect();
        let backward = matches!(self.stage, AttnStage::DkDv | AttnStage::Dq);
        let mut lse = None;
        let mut dsum = None;
        let mut o = None;
        if backward {
            lse = Some(k.buffer("lse", f32s, Access::Read));
            if self.own_dsum {
                o = Some(k.buffer("o", elem, Access::Read));
            } else {
                dsum = Some(k.buffer("dsum", f32s, Access::Read));
            }
        }
        let lens = (self.padded && self.stage != AttnStage::Prep)
            .then(|| k.buffer("lens", Scalar::U32, Access::Read));
        let out_elem = buffer_scalar(self.storage);
        let outs: Vec<Buffer> = match self.stage {
            AttnStage::Forward => {
                let o = k.buffer("o", out_elem, Access::Write);
                lse = Some(k.buffer("lse", f32s, Access::Write));
                vec![o]
            }
            AttnStage::Prep => {
                dsum = Some(k.buffer("dsum", f32s, Access::Write));
                vec![]
            }
            AttnStage::DkDv => vec![
                k.buffer("dk", out_elem, Access::Write),
                k.buffer("dv", out_elem, Access::Write),
            ],
            AttnStage::Dq => {
                if self.own_dsum {
                    dsum = Some(k.buffer("dsum", f32s, Access::Write));
                }
                vec![k.buffer("dq", out_elem, Access::Write)]
            }
        };
        let u = Ty::scalar(Scalar::U32);
        let [t, heads, batch] = ["t", "heads", "batch"].map(|n| k.param(n, u));
        let scale = k.param("scale", Ty::scalar(Scalar::F32));
        // Per group of inputs sharing strides: each member's offset, then the strides.
        let groups: Vec<(Vec<Param>, [Param; 3])> = stride_groups(self.stage)
            .iter()
            .map(|g| {
                let offs = g
                    .iter()
                    .map(|&i| k.param(&format!("{}_off", names[i]), u))
                    .collect();
                let st = ["sb", "st", "sh"].map(|s| k.param(&format!("{}_{s}", names[g[0]]), u));
                (offs, st)
            })
            .collect();
        k.begin();
        let (t, heads) = (k.load_param(t), k.load_param(heads));
        // The outputs: dense [B, T, H, D], or (`packed`) the slices of one [B, T, 3, H, D]
        // tensor that the host passes for each: dq at 0, dk at HD, dv at 2HD, rows 3HD apart.
        let dh = k.u32(self.head_dim);
        let hd = k.mul(heads, dh);
        let zero = k.u32(0);
        let (st, offs) = match (self.packed, self.stage) {
            (true, stage) => {
                let (two, three) = (k.u32(2), k.u32(3));
                let st = k.mul(hd, three);
                match stage {
                    AttnStage::DkDv => (st, vec![hd, k.mul(hd, two)]),
                    _ => (st, vec![zero]),
                }
            }
            (false, _) => (hd, vec![zero; outs.len()]),
        };
        let sb = k.mul(t, st);
        let out_views: Vec<View> = outs
            .iter()
            .zip(offs)
            .map(|(&buf, off)| View {
                buf,
                off,
                sb,
                st,
                sh: dh,
            })
            .collect();
        let mut views: Vec<Option<View>> = vec![None; ins.len()];
        for (g, (offs, st)) in stride_groups(self.stage).iter().zip(&groups) {
            let [sb, st, sh] = st.map(|p| k.load_param(p));
            for (&i, &o) in g.iter().zip(offs) {
                let off = k.load_param(o);
                views[i] = Some(View {
                    buf: ins[i],
                    off,
                    sb,
                    st,
                    sh,
                });
            }
        }
        let views = views
            .into_iter()
            .map(|v| v.expect("every input in a group"))
            .collect();
        Params {
            views,
            lse,
            dsum,
            o,
            lens,
            outs: out_views,
            t,
            heads,
            batch: k.load_param(batch),
            scale: k.load_param(scale),
        }
    }
}

/// Strided inputs that share one set of strides (push constants are 128 bytes on some
/// devices): Q, K and V (separate tensors of one shape, or views of one fused QKV), and
/// dO or O alone. Indices into the stage's strided inputs.
pub fn stride_groups(stage: AttnStage) -> &'static [&'static [usize]] {
    match stage {
        AttnStage::Forward => &[&[0, 1, 2]],
        AttnStage::Prep => &[&[0], &[1]],
        AttnStage::DkDv | AttnStage::Dq => &[&[0, 1, 2], &[3]],
    }
}

/// (b, h, block index) of this workgroup: grid (heads of a
/// [`head_group`](super::head_group), blocks, groups); the block reversed when `reverse`
/// (causal query blocks near the end have the most keys, so they start first).
pub(crate) fn block_coords(
    k: &mut KernelBuilder,
    p: &Params,
    block: u32,
    reverse: bool,
) -> (Val, Val, Val) {
    let wid = k.workgroup_id();
    let nwg = k.num_workgroups();
    let (gx, x, gz) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(wid, 2));
    let per_group = k.extract(nwg, 0);
    let first = k.mul(gz, per_group);
    let bh = k.add(first, gx);
    let b = k.div(bh, p.heads);
    let h = k.rem(bh, p.heads);
    let idx = if reverse {
        let bv = k.u32(block - 1);
        let tb = k.add(p.t, bv);
        let bv = k.u32(block);
        let n = k.div(tb, bv);
        let one = k.u32(1);
        let last = k.sub(n, one);
        k.sub(last, x)
    } else {
        x
    };
    (b, h, idx)
}

/// Keys of batch row `b` that exist: min(T, lens[b]) with padding, else T.
pub(crate) fn key_end(k: &mut KernelBuilder, p: &Params, b: Val) -> Val {
    match p.lens {
        Some(lens) => {
            let l = k.load(lens, b, 1);
            k.min(l, p.t)
        }
        None => p.t,
    }
}

/// Key blocks of `bk` a query block of `bq` rows at `q0` visits: the keys below `kend`,
/// and when causal only those up to its last row.
pub(crate) fn key_blocks(
    k: &mut KernelBuilder,
    causal: bool,
    (q0, bq): (Val, u32),
    kend: Val,
    bk: u32,
) -> Val {
    let kmax = if causal {
        let bqc = k.u32(bq);
        let e = k.add(q0, bqc);
        k.min(kend, e)
    } else {
        kend
    };
    let bkm = k.u32(bk - 1);
    let e = k.add(kmax, bkm);
    let bkc = k.u32(bk);
    k.div(e, bkc)
}

/// The query blocks of `bq` a key block at `k0` visits, as the range [first, end): none
/// when the block starts at or past `kend`, and when causal none before the one holding k0.
pub(crate) fn query_blocks(
    k: &mut KernelBuilder,
    p: &Params,
    causal: bool,
    k0: Val,
    kend: Val,
    bq: u32,
) -> (Val, Val) {
    let bqc = k.u32(bq);
    let bqm = k.u32(bq - 1);
    let e = k.add(p.t, bqm);
    let end = k.div(e, bqc);
    let first = if causal { k.div(k0, bqc) } else { k.u32(0) };
    let live = k.lt(k0, kend);
    let z = k.u32(0);
    (first, k.select(live, end, z))
}

/// Index of (b, h, t) in an f32 [B, H, T] row-statistics buffer.
pub(crate) fn stat_index(k: &mut KernelBuilder, p: &Params, b: Val, h: Val, t: Val) -> Val {
    let bh = k.mul(b, p.heads);
    let bh = k.add(bh, h);
    let x = k.mul(bh, p.t);
    k.add(x, t)
}

/// Element index of (b, t, h, 0) in a dense [B, T, H, D] tensor (the forward's O, which a Dq
/// with `own_dsum` reads).
pub(crate) fn dense_row(k: &mut KernelBuilder, p: &Params, d: u32, b: Val, t: Val, h: Val) -> Val {
    let bt = k.mul(b, p.t);
    let bt = k.add(bt, t);
    let x = k.mul(bt, p.heads);
    let x = k.add(x, h);
    let dv = k.u32(d);
    k.mul(x, dv)
}

/// Whether key `j` of query `i` is kept: j < kend and, when causal, j ≤ i.
pub(crate) fn keep(k: &mut KernelBuilder, causal: bool, i: Val, j: Val, kend: Val) -> Val {
    let inside = k.lt(j, kend);
    if causal {
        let seen = k.le(j, i);
        k.and(inside, seen)
    } else {
        inside
    }
}
