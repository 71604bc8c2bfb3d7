//! Attention of one new query per head over a key/value cache (decoding): for batch row b
//! and head h, O[b, h] = Σ_{j<len} softmax_j(scale·q[b, h]·K[b, j, h]) V[b, j, h]; and the
//! kernel that writes a new position's keys and values into the cache in place.
//!
//! The one decision a reader must know: nothing about the cache's length is compiled in.
//! `len` and the keys each workgroup takes (`chunk`) are push constants, so one kernel per
//! stage, storage and head dim serves every length: a decoder whose cache grows by one key
//! per token compiles nothing after its first token (the products and softmax it replaces
//! compiled a new shape on each). The keys are split over workgroups as flash-decoding
//! does: `Split` gives each (b, h, chunk of keys) a workgroup that writes its chunk's score
//! maximum, exponential sum and weighted sum of V, and `Combine` merges the chunks; a cache
//! of one chunk skips `Combine` (`Split` normalises and stores O itself). [`decode_chunk`]
//! is the one selection function: the chunk length for a cache length and head count.
//!
//! Inside a `Split` workgroup the chunk's scores live in shared memory: one invocation per
//! key computes q·k (base 2: q is staged times scale·log2 e), two tree reductions give the
//! maximum and the sum, then the invocations are laid out as (key group, vec4 of D) for the
//! sum of p·V, whose row loads are then contiguous across invocations. No subgroup
//! operations, so it runs wherever Vulkan does. Rows are read as vec4s when every view's
//! offset and strides are multiples of 4 (a run-time test), else one element at a time.
//!
//! Layouts: q is a strided [B, H, D] view (offset, batch and head strides); K and V are
//! strided [B, capacity, H, D] views sharing their strides; O is dense [B, H, D]. The
//! partials are one f32 buffer: the sums of V, [B·H, splits, D], then (max, sum) pairs,
//! [B·H, splits, 2].
//!
//! Files: this one holds the signature, the selection function and the launches; `split`
//! the `Split` kernel; `per_element` the `Append` and `Combine` kernels.

mod per_element;
mod split;

use helios_spirv::{Binding, KernelModule};

use super::signature::ViewStrides;
use crate::launch::{grid, pack_push, Arg, Args, Launch, MIN_GROUPS_LIMIT};
use crate::storage::Storage;
use crate::KernelError;

/// Invocations per workgroup of every stage.
pub const DECODE_WORKGROUP: u32 = 128;
/// Most keys a `Split` workgroup takes: its scores sit in shared memory (2 KiB).
pub const DECODE_MAX_CHUNK: u32 = 512;
/// Keys per workgroup are a multiple of this.
pub const DECODE_CHUNK_STEP: u32 = 64;
/// Largest head dim of `Split`: two key groups of 64 vec4s at 128 invocations.
pub const DECODE_MAX_HEAD_DIM: u32 = 256;
/// `Split` workgroups [`decode_chunk`] aims for: about one per SM of a large GPU, so a
/// single head's keys spread over the device.
const DECODE_TARGET_GROUPS: u32 = 128;

/// The stages of decoding attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeStage {
    /// Copies new keys and values ([B, n, H, D] views) into rows pos..pos + n of the
    /// caches; D is a push constant.
    Append,
    /// One workgroup per (b, h, chunk of keys): the chunk's partials, or O when the cache
    /// is one chunk.
    Split { head_dim: u32 },
    /// Merges the partials of every chunk into O; D is a push constant.
    Combine,
}

/// The signature of a decoding-attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeKernel {
    pub stage: DecodeStage,
    pub storage: Storage,
    pub binding: Binding,
}

/// The keys per `Split` workgroup for a cache of `len` keys and `bh` (batch × heads) rows:
/// enough chunks that B·H·chunks reaches `DECODE_TARGET_GROUPS` where the keys allow it,
/// each a multiple of [`DECODE_CHUNK_STEP`] keys, at most [`DECODE_MAX_CHUNK`]. A short
/// cache is one chunk (no `Combine`).
pub fn decode_chunk(len: u32, bh: u32) -> u32 {
    let splits = DECODE_TARGET_GROUPS.div_ceil(bh.max(1));
    len.div_ceil(splits)
        .next_multiple_of(DECODE_CHUNK_STEP)
        .clamp(DECODE_CHUNK_STEP, DECODE_MAX_CHUNK)
}

/// One `Append` launch: rows 0..rows of the sources go to rows pos..pos + rows of the
/// caches. Sources (k, v) share strides, as do the caches.
#[derive(Clone, Copy, Debug)]
pub struct AppendArgs {
    pub batch: u32,
    pub rows: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub pos: u32,
    /// The new keys and values.
    pub src: [ViewStrides; 2],
    /// The key and value caches.
    pub dst: [ViewStrides; 2],
}

/// One `Split` launch.
#[derive(Clone, Copy, Debug)]
pub struct SplitArgs {
    pub batch: u32,
    pub heads: u32,
    /// Keys cached (≥ 1).
    pub len: u32,
    /// Keys per workgroup ([`decode_chunk`]).
    pub chunk: u32,
    pub scale: f32,
    /// The query's offset, batch and head strides (`seq` unused).
    pub q: ViewStrides,
    /// The key and value caches (they share strides).
    pub kv: [ViewStrides; 2],
}

impl DecodeKernel {
    pub fn name(&self) -> String {
        let stage = match self.stage {
            DecodeStage::Append => "append".to_string(),
            DecodeStage::Split { head_dim } => format!("split_d{head_dim}"),
            DecodeStage::Combine => "combine".to_string(),
        };
        format!("attn_decode_{stage}_{}", self.storage.name())
    }

    /// Emits the kernel. Buffers, in order: Append k, v, k_cache, v_cache; Split q, k, v, o,
    /// part; Combine part, o. Push constants after them: Append batch, rows, heads, head_dim,
    /// pos, the sources' k and v offsets and (batch, seq, head) strides, the caches' the
    /// same; Split len, heads, chunk, scale, q's offset and (batch, head) strides, k and v
    /// offsets and their (batch, seq, head) strides; Combine rows (B·H), head_dim, splits.
    pub fn build(&self) -> KernelModule {
        match self.stage {
            DecodeStage::Append => per_element::append(self),
            DecodeStage::Split { head_dim } => {
                assert!(
                    (1..=DECODE_MAX_HEAD_DIM).contains(&head_dim),
                    "head dim {head_dim} is outside 1..={DECODE_MAX_HEAD_DIM}"
                );
                split::split(self, head_dim)
            }
            DecodeStage::Combine => per_element::combine(self),
        }
    }

    /// The `Append` launch; `buffers`: device addresses in declaration order (ignored with
    /// descriptors).
    pub fn launch_append(
        &self,
        module: &KernelModule,
        max_groups_x: u32,
        a: &AppendArgs,
        buffers: &[u64],
    ) -> Result<Launch, KernelError> {
        self.expect(module, matches!(self.stage, DecodeStage::Append))?;
        for g in [a.src, a.dst] {
            same_strides(module, g)?;
        }
        let n = u64::from(a.batch) * u64::from(a.rows) * u64::from(a.heads) * u64::from(a.head_dim);
        if n > u64::from(u32::MAX) {
            return Err(KernelError::TooLarge {
                what: "keys and values to append",
                size: n,
            });
        }
        let groups = grid(n.div_ceil(u64::from(DECODE_WORKGROUP)), max_groups_x)?;
        let mut args = self.addresses(buffers);
        args.extend([a.batch, a.rows, a.heads, a.head_dim, a.pos].map(Arg::U32));
        for g in [a.src, a.dst] {
            args.extend([g[0].offset, g[1].offset, g[0].batch, g[0].seq, g[0].head].map(Arg::U32));
        }
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }

    /// The `Split` launch: a grid of (chunks, B·H) workgroups.
    pub fn launch_split(
        &self,
        module: &KernelModule,
        max_groups_x: u32,
        a: &SplitArgs,
        buffers: &[u64],
    ) -> Result<Launch, KernelError> {
        self.expect(module, matches!(self.stage, DecodeStage::Split { .. }))?;
        same_strides(module, a.kv)?;
        if a.len == 0 || a.chunk == 0 || a.chunk > DECODE_MAX_CHUNK {
            return Err(KernelError::Arguments {
                kernel: module.name.clone(),
                detail: format!(
                    "len {} and chunk {} must be at least 1, chunk at most {DECODE_MAX_CHUNK}",
                    a.len, a.chunk
                ),
            });
        }
        let splits = a.len.div_ceil(a.chunk);
        let bh = u64::from(a.batch) * u64::from(a.heads);
        for (what, size, limit) in [
            ("batch × heads", bh, MIN_GROUPS_LIMIT),
            ("key chunks", u64::from(splits), max_groups_x),
        ] {
            if size > u64::from(limit) {
                return Err(KernelError::TooLarge { what, size });
            }
        }
        let mut args = self.addresses(buffers);
        args.extend([a.len, a.heads, a.chunk].map(Arg::U32));
        args.push(Arg::F32(a.scale));
        args.extend([a.q.offset, a.q.batch, a.q.head].map(Arg::U32));
        let kv = a.kv;
        args.extend(
            [
                kv[0].offset,
                kv[1].offset,
                kv[0].batch,
                kv[0].seq,
                kv[0].head,
            ]
            .map(Arg::U32),
        );
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch {
            groups: [splits, bh as u32, 1],
            push,
        })
    }

    /// The `Combine` launch over `rows` (B·H) rows of `head_dim` from `splits` chunks.
    pub fn launch_combine(
        &self,
        module: &KernelModule,
        max_groups_x: u32,
        (rows, head_dim, splits): (u32, u32, u32),
        buffers: &[u64],
    ) -> Result<Launch, KernelError> {
        self.expect(module, self.stage == DecodeStage::Combine)?;
        let n = u64::from(rows) * u64::from(head_dim);
        let part = n * u64::from(splits) + u64::from(rows) * u64::from(splits) * 2;
        if part > u64::from(u32::MAX) {
            return Err(KernelError::TooLarge {
                what: "attention partials",
                size: part,
            });
        }
        let groups = grid(n.div_ceil(u64::from(DECODE_WORKGROUP)), max_groups_x)?;
        let mut args = self.addresses(buffers);
        args.extend([rows, head_dim, splits].map(Arg::U32));
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }

    fn expect(&self, module: &KernelModule, stage_ok: bool) -> Result<(), KernelError> {
        match stage_ok {
            true => Ok(()),
            false => Err(KernelError::Arguments {
                kernel: module.name.clone(),
                detail: format!("the launch is not for the {:?} stage", self.stage),
            }),
        }
    }

    fn addresses(&self, buffers: &[u64]) -> Args {
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.extend(buffers.iter().map(|&a| Arg::Address(a)));
        }
        args
    }

    /// Kernels for validation: every stage and storage, both binding models, the head dims
    /// 16, 64, 80, 128 and 256 and two that are no multiple of 4 (36, 250).
    pub fn samples() -> Vec<DecodeKernel> {
        let mut out = Vec::new();
        for binding in [Binding::DeviceAddress, Binding::Descriptor] {
            for storage in Storage::ALL {
                let stages = [16, 36, 64, 80, 128, 250, 256]
                    .map(|head_dim| DecodeStage::Split { head_dim })
                    .into_iter()
                    .chain([DecodeStage::Append, DecodeStage::Combine]);
                for stage in stages {
                    out.push(DecodeKernel {
                        stage,
                        storage,
                        binding,
                    });
                }
            }
        }
        out
    }
}
/// Two views of one stride group (k and v) must share their strides.
fn same_strides(module: &KernelModule, g: [ViewStrides; 2]) -> Result<(), KernelError> {
    let key = |v: ViewStrides| (v.batch, v.seq, v.head);
    if key(g[0]) != key(g[1]) {
        return Err(KernelError::Arguments {
            kernel: module.name.clone(),
            detail: format!(
                "keys and values differ in strides: {:?} vs {:?}",
                g[0], g[1]
            ),
        });
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_spread_the_keys_within_bounds() {
        // GPT-2 small decoding (12 heads): 11 chunks wanted; short caches are one chunk.
        assert_eq!(decode_chunk(1, 12), 64);
        assert_eq!(decode_chunk(64, 12), 64);
        assert_eq!(decode_chunk(1024, 12), 128);
        // Many rows fill the device alone: one chunk as long as allowed.
        assert_eq!(decode_chunk(100, 4096), 128);
        assert_eq!(decode_chunk(100_000, 4096), DECODE_MAX_CHUNK);
        assert_eq!(decode_chunk(1 << 20, 1), DECODE_MAX_CHUNK);
        for len in [1, 2, 17, 100, 300, 1000, 5000, 70_000] {
            for bh in [1, 2, 6, 12, 96, 1000] {
                let c = decode_chunk(len, bh);
                assert!(
                    c % DECODE_CHUNK_STEP == 0 && c <= DECODE_MAX_CHUNK,
                    "{len} {bh}"
                );
            }
        }
    }

    /// One `Split` launch's grid: chunks along x, rows along y; bad arguments are errors.
    #[test]
    fn split_launches_cover_every_chunk() {
        let kern = DecodeKernel {
            stage: DecodeStage::Split { head_dim: 64 },
            storage: Storage::F32,
            binding: Binding::DeviceAddress,
        };
        let m = kern.build();
        let view = ViewStrides {
            offset: 0,
            batch: 64 * 3 * 4,
            seq: 64 * 3,
            head: 64,
        };
        let mut a = SplitArgs {
            batch: 2,
            heads: 3,
            len: 300,
            chunk: 64,
            scale: 0.125,
            q: view,
            kv: [view, ViewStrides { offset: 64, ..view }],
        };
        let l = kern.launch_split(&m, 65535, &a, &[0; 5]).unwrap();
        assert_eq!(l.groups, [5, 6, 1]);
        a.chunk = DECODE_MAX_CHUNK + 64;
        assert!(kern.launch_split(&m, 65535, &a, &[0; 5]).is_err());
        a.chunk = 64;
        a.kv[1].seq += 1;
        assert!(kern.launch_split(&m, 65535, &a, &[0; 5]).is_err());
        let combine = DecodeKernel {
            stage: DecodeStage::Combine,
            ..kern
        };
        assert!(kern.launch_combine(&m, 65535, (6, 64, 5), &[0; 2]).is_err());
        let cm = combine.build();
        assert!(combine
            .launch_combine(&cm, 65535, (6, 64, 5), &[0; 2])
            .is_ok());
    }
}
