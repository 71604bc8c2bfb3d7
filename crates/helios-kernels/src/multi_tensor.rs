//! Σ x² over many tensors in one dispatch, for global-norm gradient clipping: a table lists
//! chunks of the tensors (device address, first element, element count), workgroup g sums
//! the squares of chunk g in f32 and writes partial g, and an ordinary reduction then sums
//! the partials.
//!
//! The one decision a reader must know: the tensors are reached through addresses read from
//! the table (`KernelBuilder::buffer_at`), not as kernel parameters, so one dispatch covers
//! any number of them. One reduction per tensor cost a GPT-2 step milliseconds (148
//! tensors, each a partial and a combine with a barrier between: latency, not bytes;
//! bench/results/source-comment-history.md); this needs device-address binding, and the
//! host keeps the per-tensor form for descriptors.

use helios_spirv::{Access, Binding, KernelBuilder, KernelModule, ReduceOp, Scalar, Ty, Val};

use crate::launch::{grid, pack_push, Arg, Geometry, Launch};
use crate::rows::{linear_workgroup, Groups, Reducer};
use crate::storage::{buffer_scalar, load_f32, Storage};
use crate::KernelError;

/// Invocations per workgroup.
pub const SUM_SQUARES_WORKGROUP: u32 = 256;
/// Most elements of one chunk: 64 per invocation, in 16-element strides of vec4 loads.
pub const SUM_SQUARES_CHUNK: u32 = 16384;
/// u32 words of one table entry: address (low, high), first element, element count.
pub const SUM_SQUARES_ENTRY: usize = 4;

/// The signature of the kernel: the tensors' storage (one dtype per dispatch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SumSquaresKernel {
    pub storage: Storage,
    pub reducer: Reducer,
}

impl SumSquaresKernel {
    pub fn name(&self) -> String {
        format!(
            "sum_squares_{}_{}_wg{SUM_SQUARES_WORKGROUP}",
            self.storage.name(),
            self.reducer.tag()
        )
    }

    /// Buffers: the table (u32, `SUM_SQUARES_ENTRY` words per chunk) and the partials (f32,
    /// one per chunk); push constant: the chunk count. Every chunk's first element must be a
    /// multiple of 4 and its address aligned to four elements (the host's chunks of dense
    /// tensors are).
    pub fn build(&self) -> KernelModule {
        let w = SUM_SQUARES_WORKGROUP;
        let mut k = KernelBuilder::new(self.name(), Binding::DeviceAddress, [w, 1, 1]);
        let table = k.buffer("table", Scalar::U32, Access::Read);
        let partials = k.buffer("partials", Scalar::F32, Access::Write);
        let chunks = k.param("chunks", Ty::scalar(Scalar::U32));
        k.begin();
        let chunks = k.load_param(chunks);
        let g = linear_workgroup(&mut k);
        let inside = k.lt(g, chunks);
        let zero = k.u32(0);
        // A workgroup past the table reads entry 0 and sums none of it: every invocation
        // must reach the reduction's barriers.
        let entry_at = k.select(inside, g, zero);
        let entry = k.load(table, entry_at, 4);
        let lo = k.extract(entry, 0);
        let hi = k.extract(entry, 1);
        let address = k.vector(&[lo, hi]);
        let first = k.extract(entry, 2);
        let count = k.extract(entry, 3);
        let count = k.select(inside, count, zero);
        let x = k.buffer_at(address, buffer_scalar(self.storage));
        let lid = k.local_index();
        let zf = k.const_f32(0.0);
        let acc = k.var_init(zf);
        for_chunk(&mut k, (lid, w), (first, count), |k, at, lanes| {
            let v = load_f32(k, x, at, lanes, self.storage);
            let sq = if lanes == 1 { k.mul(v, v) } else { k.dot(v, v) };
            let a = k.get(acc);
            let s = k.add(a, sq);
            k.set(acc, s);
        });
        let mut groups = Groups::new(&mut k, self.reducer, w);
        let mine = k.get(acc);
        let total = groups.reduce(&mut k, ReduceOp::Add, mine);
        let leader = k.eq(lid, zero);
        let write = k.and(leader, inside);
        k.if_(write, |k| k.store(partials, g, total));
        k.finish()
    }

    /// The launch over `chunks` table entries, with the table's and the partials' device
    /// addresses.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        chunks: u32,
        table: u64,
        partials: u64,
    ) -> Result<Launch, KernelError> {
        let args = [
            Arg::Address(table),
            Arg::Address(partials),
            Arg::U32(chunks),
        ];
        table_launch(module, geometry, chunks, &args)
    }

    /// Kernels for validation: every storage, both reducers.
    pub fn samples() -> Vec<SumSquaresKernel> {
        let mut out = Vec::new();
        for storage in Storage::ALL {
            for reducer in [
                Reducer::Subgroup {
                    block: 32,
                    whole: true,
                },
                Reducer::SharedTree,
            ] {
                out.push(SumSquaresKernel { storage, reducer });
            }
        }
        out
    }
}

/// Elements one workgroup of [`CopyManyKernel`] copies: 64 per invocation.
pub const COPY_MANY_CHUNK: u32 = 16384;
/// u32 words of one [`CopyManyKernel`] table entry: source address (low, high), destination
/// address (low, high), first element, element count.
pub const COPY_MANY_ENTRY: usize = 6;

/// Copies many tensors of one storage in one dispatch, bit for bit: the table lists chunks
/// (source, destination, first element, count), workgroup g copies chunk g. What a
/// data-parallel step runs to put ~150 gradients into the exchange's arena, where a copy a
/// tensor was ~150 dispatches, most of them tiny.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyManyKernel {
    pub storage: Storage,
}

impl CopyManyKernel {
    pub fn name(&self) -> String {
        format!(
            "copy_many_{}_wg{SUM_SQUARES_WORKGROUP}",
            self.storage.name()
        )
    }

    /// Buffer: the table (u32, `COPY_MANY_ENTRY` words per chunk); push constant: the chunk
    /// count. Every chunk's first element must be a multiple of 4 and both its addresses
    /// aligned to four elements.
    pub fn build(&self) -> KernelModule {
        let w = SUM_SQUARES_WORKGROUP;
        let mut k = KernelBuilder::new(self.name(), Binding::DeviceAddress, [w, 1, 1]);
        let table = k.buffer("table", Scalar::U32, Access::Read);
        let chunks = k.param("chunks", Ty::scalar(Scalar::U32));
        k.begin();
        let chunks = k.load_param(chunks);
        let g = linear_workgroup(&mut k);
        let inside = k.lt(g, chunks);
        k.if_(inside, |k| {
            let six = k.u32(COPY_MANY_ENTRY as u32);
            let e0 = k.mul(g, six);
            let word = |k: &mut KernelBuilder, i: u32| {
                let c = k.u32(i);
                let at = k.add(e0, c);
                k.load(table, at, 1)
            };
            let address = |k: &mut KernelBuilder, i: u32| {
                let lo = word(k, i);
                let hi = word(k, i + 1);
                k.vector(&[lo, hi])
            };
            let (src, dst) = (address(k, 0), address(k, 2));
            let first = word(k, 4);
            let count = word(k, 5);
            // Bits, whatever they mean: 16-bit storages as u16, widened to u32 and back (a
            // module moving 16-bit values must declare 16-bit arithmetic, which these
            // width-only conversions do, as bf16's loads elsewhere).
            let scalar = match self.storage.bytes() {
                2 => Scalar::U16,
                _ => Scalar::U32,
            };
            let src = k.buffer_at(src, scalar);
            let dst = k.buffer_at_mut(dst, scalar);
            let lid = k.local_index();
            for_chunk(k, (lid, w), (first, count), |k, at, lanes| {
                let v = k.load(src, at, lanes);
                let v = match scalar {
                    Scalar::U16 => {
                        let wide = k.convert(v, Scalar::U32);
                        k.convert(wide, Scalar::U16)
                    }
                    _ => v,
                };
                k.store(dst, at, v);
            });
        });
        k.finish()
    }

    /// The launch over `chunks` table entries, with the table's device address.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        chunks: u32,
        table: u64,
    ) -> Result<Launch, KernelError> {
        table_launch(
            module,
            geometry,
            chunks,
            &[Arg::Address(table), Arg::U32(chunks)],
        )
    }

    /// Kernels for validation: every storage.
    pub fn samples() -> Vec<CopyManyKernel> {
        Storage::ALL
            .into_iter()
            .map(|storage| CopyManyKernel { storage })
            .collect()
    }
}

/// The launch of a table-driven kernel: one workgroup per table entry (`chunks`), `args`
/// as its push constants.
fn table_launch(
    module: &KernelModule,
    geometry: Geometry,
    chunks: u32,
    args: &[Arg],
) -> Result<Launch, KernelError> {
    let push = pack_push(&module.name, &module.params, module.push_size, args)?;
    Ok(Launch {
        groups: grid(u64::from(chunks), geometry.max_groups_x)?,
        push,
    })
}

/// The [`CopyManyKernel`] table for copies (source address, destination address, element
/// count each): chunks of at most `COPY_MANY_CHUNK` elements. Empty copies add none.
pub fn copy_many_table(copies: &[(u64, u64, u64)]) -> Vec<u32> {
    let mut table = Vec::new();
    for &(src, dst, len) in copies {
        for (first, count) in chunks(len, COPY_MANY_CHUNK) {
            table.extend([
                src as u32,
                (src >> 32) as u32,
                dst as u32,
                (dst >> 32) as u32,
            ]);
            table.extend([first, count]);
        }
    }
    table
}

/// The table for tensors at `addresses` (device address, element count each): chunks of at
/// most `SUM_SQUARES_CHUNK` elements, `SUM_SQUARES_ENTRY` words each. Empty tensors add none.
pub fn sum_squares_table(tensors: &[(u64, u64)]) -> Vec<u32> {
    let mut table = Vec::new();
    for &(address, len) in tensors {
        for (first, count) in chunks(len, SUM_SQUARES_CHUNK) {
            table.extend([address as u32, (address >> 32) as u32, first, count]);
        }
    }
    table
}

/// Runs `visit(k, slot, lanes)` over invocation `lid`'s share (of a workgroup of `w`) of a
/// table chunk: `count` elements from element `first`, a multiple of 4. Whole vec4s first
/// (`slot` in units of 4 elements, `lanes` 4), then the last `count % 4` elements one by one.
fn for_chunk(
    k: &mut KernelBuilder,
    (lid, w): (Val, u32),
    (first, count): (Val, Val),
    visit: impl Fn(&mut KernelBuilder, Val, u8),
) {
    let step = k.u32(w);
    let two = k.u32(2);
    let quads = k.shr(count, two);
    let q0 = k.shr(first, two);
    let done = k.shl(quads, two);
    let t0 = k.add(done, lid);
    for (from, to, base, lanes) in [(lid, quads, q0, 4), (t0, count, first, 1)] {
        k.for_range(from, to, step, |k, i| {
            let at = k.add(base, i);
            visit(k, at, lanes);
        });
    }
}

/// (first element, count) of each chunk of at most `chunk` elements of `len` (u32: the
/// callers keep tensors under 2³² elements).
fn chunks(len: u64, chunk: u32) -> impl Iterator<Item = (u32, u32)> {
    (0..len)
        .step_by(chunk as usize)
        .map(move |first| (first as u32, (len - first).min(u64::from(chunk)) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_table_chunks_every_element_once() {
        let t = copy_many_table(&[(0x1_0000_0100, 0x2_0000_0000, 20_000), (0x200, 0x400, 0)]);
        let entries: Vec<&[u32]> = t.chunks(COPY_MANY_ENTRY).collect();
        assert_eq!(
            entries,
            [
                &[0x100, 1, 0, 2, 0, COPY_MANY_CHUNK][..],
                &[0x100, 1, 0, 2, COPY_MANY_CHUNK, 20_000 - COPY_MANY_CHUNK][..],
            ]
        );
    }

    #[test]
    fn table_chunks_every_element_once() {
        let t = sum_squares_table(&[(0x1_0000_0100, 40_000), (0x200, 0), (0x300, 5)]);
        let entries: Vec<&[u32]> = t.chunks(SUM_SQUARES_ENTRY).collect();
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0], [0x100, 1, 0, SUM_SQUARES_CHUNK]);
        assert_eq!(entries[1], [0x100, 1, SUM_SQUARES_CHUNK, SUM_SQUARES_CHUNK]);
        assert_eq!(
            entries[2],
            [
                0x100,
                1,
                2 * SUM_SQUARES_CHUNK,
                40_000 - 2 * SUM_SQUARES_CHUNK
            ]
        );
        assert_eq!(entries[3], [0x300, 0, 0, 5]);
    }
}
