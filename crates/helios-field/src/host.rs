//! The one-shot host API: `compute` and `compute_batch` take host arrays, and in one submit
//! move them to the GPU, run the operations and bring the results back.
//!
//! The one decision a reader must know: transfers go through scratch buffers the `Field`
//! keeps and grows (never one allocation per call), and the memory path is the config's:
//! host-visible scratch the kernels read and write directly over the bus, or host-visible
//! staging plus device-local scratch joined by copy commands inside the same submit. Large
//! host copies are split over all cores, since on a fast GPU they are most of the cost.

use helios_vk::sync::LockExt;
use helios_vk::{Buffer, MemoryLocation};
use rayon::prelude::*;

use crate::engine::{record_dispatch, Field};
use crate::fq::{check_canonical, Fq, FQ_BYTES};
use crate::hazards::{Hazards, Region};
use crate::kernel::{FieldOp, MAX_DISPATCH_ELEMENTS};
use crate::transfer::{ensure, read, write};
use crate::{FieldError, Result};

/// One operation of a [`Field::compute_batch`]: `out = op(a, b)`; `b` is empty for unary ops.
pub struct Job<'a> {
    pub op: FieldOp,
    pub a: &'a [Fq],
    pub b: &'a [Fq],
    pub out: &'a mut [Fq],
}

/// Checks arity, lengths and canonical inputs of every job before anything runs.
pub(crate) fn check_job(op: FieldOp, a: &[Fq], b: &[Fq], out: usize) -> Result<()> {
    let shape = |detail: String| FieldError::Shape {
        op: op.name(),
        detail,
    };
    let b_len = if op.arity() == 2 { a.len() } else { 0 };
    if b.len() != b_len {
        return Err(shape(format!(
            "input b has {} elements; expected {b_len} (a has {})",
            b.len(),
            a.len()
        )));
    }
    if out != a.len() {
        return Err(shape(format!(
            "the output has {out} elements but the inputs {}",
            a.len()
        )));
    }
    if a.len() > MAX_DISPATCH_ELEMENTS {
        return Err(FieldError::TooLarge {
            what: "one operation",
            size: a.len(),
            max: MAX_DISPATCH_ELEMENTS,
        });
    }
    check_canonical("a", a)?;
    check_canonical("b", b)
}

impl Field {
    /// `op(a, b)` for host arrays (`b` empty for unary ops), in one submit.
    pub fn compute(&self, op: FieldOp, a: &[Fq], b: &[Fq]) -> Result<Vec<Fq>> {
        let mut out = vec![[0u64; 6]; a.len()];
        self.compute_batch(&mut [Job {
            op,
            a,
            b,
            out: &mut out,
        }])?;
        Ok(out)
    }

    /// Many independent operations on host arrays in one submit: inputs are copied in
    /// together, every job is one dispatch, and outputs are copied out together.
    pub fn compute_batch(&self, jobs: &mut [Job<'_>]) -> Result<()> {
        for j in jobs.iter() {
            check_job(j.op, j.a, j.b, j.out.len())?;
        }
        let compiled = jobs
            .iter()
            .map(|j| self.compiled(j.op))
            .collect::<Result<Vec<_>>>()?;
        let in_elems: usize = jobs.iter().map(|j| j.a.len() + j.b.len()).sum();
        let out_elems: usize = jobs.iter().map(|j| j.out.len()).sum();
        let (in_bytes, out_bytes) = (in_elems as u64 * FQ_BYTES, out_elems as u64 * FQ_BYTES);
        if out_bytes == 0 {
            return Ok(());
        }

        let ctx = self.context();
        let device_local = self.config().device_local;
        let workgroup = self.config().workgroup;
        let mut guard = self.scratch.locked();
        let s = &mut *guard;
        let host_in = ensure(ctx, &mut s.host_in, in_bytes, MemoryLocation::HostVisible)?;
        let host_out = ensure(ctx, &mut s.host_out, out_bytes, MemoryLocation::HostVisible)?;
        let (dev_in, dev_out) = if device_local {
            let i = ensure(ctx, &mut s.dev_in, in_bytes, MemoryLocation::DeviceLocal)?;
            let o = ensure(ctx, &mut s.dev_out, out_bytes, MemoryLocation::DeviceLocal)?;
            (i, o)
        } else {
            (host_in, host_out)
        };

        // Pack inputs: a0 b0 a1 b1 ...; outputs: out0 out1 ... (jobs copied in parallel).
        let mut at = 0u64;
        let mut input_offsets = Vec::with_capacity(jobs.len());
        for j in jobs.iter() {
            let offs: Vec<u64> = (0..j.op.arity())
                .map(|i| at + (i * j.a.len()) as u64 * FQ_BYTES)
                .collect();
            at += (j.a.len() + j.b.len()) as u64 * FQ_BYTES;
            input_offsets.push(offs);
        }
        jobs.par_iter()
            .zip(&input_offsets)
            .try_for_each(|(j, offs)| -> Result<()> {
                write(ctx, host_in, offs[0], j.a)?;
                if let Some(&o) = offs.get(1) {
                    write(ctx, host_in, o, j.b)?;
                }
                Ok(())
            })?;

        ctx.submit_and_wait(|rec| {
            if device_local {
                rec.copy_buffer(host_in, 0, dev_in, 0, in_bytes)?;
                rec.barrier();
            }
            let mut out_at = 0u64;
            let mut hazards = Hazards::default();
            for ((j, c), offs) in jobs.iter().zip(&compiled).zip(&input_offsets) {
                let reads: Vec<Region> =
                    offs.iter().map(|&o| region(dev_in, o, j.a.len())).collect();
                hazards.before(rec, &reads, region(dev_out, out_at, j.a.len()));
                let inputs = offs.iter().map(|&o| dev_in.device_address() + o).collect();
                let out = dev_out.device_address() + out_at;
                record_dispatch(rec, c, workgroup, (inputs, out), j.a.len())?;
                out_at += j.out.len() as u64 * FQ_BYTES;
            }
            if device_local {
                rec.barrier();
                rec.copy_buffer(dev_out, 0, host_out, 0, out_bytes)?;
            }
            Ok(())
        })?;

        let mut out_offsets = Vec::with_capacity(jobs.len());
        let mut at = 0u64;
        for j in jobs.iter() {
            out_offsets.push(at);
            at += j.out.len() as u64 * FQ_BYTES;
        }
        jobs.par_iter_mut()
            .zip(&out_offsets)
            .try_for_each(|(j, &o)| read(ctx, host_out, o, j.out))?;
        Ok(())
    }
}

fn region(buf: &Buffer, offset: u64, elems: usize) -> Region {
    Region {
        buffer: buf.device_address(),
        bytes: offset..offset + elems as u64 * FQ_BYTES,
    }
}
