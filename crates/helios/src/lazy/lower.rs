//! Passes 2 and 3 of the scheduler: which members a group's kernel stores (`choose_outputs`)
//! and the group as one `FusedKernel` (`lower`), with its leaves and scalar values
//! (`Lowered`), and the push-constant budget every such kernel must fit (`push_fits`).
//!
//! The design decision a reader must know: every read is deduplicated (`read_input`), so a
//! kernel's inputs are its distinct reads: a bias broadcast into ten adds is one input, and
//! the push-constant budget counts each buffer once.

use std::sync::Arc;

use helios_kernels::{BinaryOp, FusedInput, FusedKernel, Instr};

use super::group::{dense_edge, Group};
use super::reads::{out_shape, read, read_padded};
use super::{ElemOp, Input, Node};
use crate::layout::Dims;
use crate::{DType, Device, Error, Layout, Result};

/// Pass 3's product: a group's fused kernel, the leaves it reads and its scalar values.
pub(crate) struct Lowered {
    /// The signature, which finds the compiled kernel (the schedule cache).
    pub kernel: FusedKernel,
    /// Per kernel input: the node read, and the element its read starts at.
    pub leaves: Vec<(Arc<Node>, usize)>,
    /// The values of the kernel's scalar parameters.
    pub scalars: Vec<f32>,
    /// Pass 2's choice: the members stored (topological indices), the root and members held
    /// outside the group.
    pub(super) outputs: smallvec::SmallVec<[usize; 4]>,
    /// `lower`'s scratch: per kernel input, its instruction.
    input_instr: Vec<u32>,
    /// `lower`'s scratch: per member in topological order, its instruction.
    member_instr: Vec<u32>,
    /// `lower`'s scratch: the views read so far (kernel input, view, the reading op's
    /// shape).
    views: Vec<(usize, Layout, Dims)>,
}

impl Default for Lowered {
    fn default() -> Lowered {
        Lowered {
            kernel: FusedKernel {
                binding: helios_spirv::Binding::DeviceAddress,
                len: 0,
                inputs: Vec::new(),
                code: Vec::new(),
                outputs: Vec::new(),
                scalars: 0,
                vecs: 1,
            },
            leaves: Vec::new(),
            scalars: Vec::new(),
            outputs: smallvec::SmallVec::new(),
            input_instr: Vec::new(),
            member_instr: Vec::new(),
            views: Vec::new(),
        }
    }
}

impl Lowered {
    /// Empties every list, keeping the allocations.
    pub(super) fn clear(&mut self) {
        self.outputs.clear();
        self.clear_kernel();
    }

    /// Empties every list but pass 2's `outputs`, keeping the allocations.
    fn clear_kernel(&mut self) {
        self.kernel.inputs.clear();
        self.kernel.code.clear();
        self.kernel.outputs.clear();
        self.leaves.clear();
        self.scalars.clear();
        self.input_instr.clear();
        self.member_instr.clear();
        self.views.clear();
    }
}

/// Pass 2: the members the group's kernel stores, into `out.outputs` (topological indices):
/// each member something outside the group holds (a user's tensor, a saved tensor for
/// backward, another pending node), and the root, its last member.
pub(super) fn choose_outputs(g: &Group<'_>, out: &mut Lowered) {
    out.outputs.clear();
    out.outputs.extend((0..g.len()).filter(|&j| {
        let m = g.node(j);
        Arc::strong_count(m) > g.uses(m) || j + 1 == g.len()
    }));
}

/// Pass 3: the group as one fused kernel computing every member and storing those pass 2
/// chose (`out.outputs`), written into `out`, whose allocations it reuses (a group like the
/// last one lowered allocates nothing).
pub(super) fn lower(g: &Group<'_>, root: &Arc<Node>, out: &mut Lowered) -> Result<()> {
    let device = root.device();
    out.clear_kernel();
    for j in 0..g.len() {
        let at = lower_member(g, j, out)?;
        out.member_instr.push(at);
    }
    let Lowered {
        kernel,
        scalars,
        outputs,
        member_instr,
        ..
    } = out;
    for &j in outputs.iter() {
        kernel
            .outputs
            .push((member_instr[j], g.node(j).dtype.storage()));
    }
    kernel.len = u32::try_from(root.len).map_err(|_| {
        Error::Kernel(helios_kernels::KernelError::TooLarge {
            what: "element count",
            size: root.len as u64,
        })
    })?;
    kernel.binding = device.binding();
    kernel.scalars = scalars.len() as u16;
    kernel.vecs = device.config().elementwise_vecs.unwrap_or(1);
    debug_assert!(kernel.check().is_ok(), "{:?}", kernel.check());
    Ok(())
}

/// Whether a kernel with `inputs` and `outputs` buffer addresses and `scalars` parameters in
/// its push constants fits `device`'s budget (128 bytes on lavapipe: a dozen inputs). The
/// one check, for a group's own kernel (`realize_with` splits a group that does not fit)
/// and a reduction computing the group in its loads (`with_prologue`).
pub(super) fn push_fits(device: &Device, inputs: usize, outputs: usize, scalars: usize) -> bool {
    let budget = device.context().caps().limits.max_push_constants_size;
    FusedKernel::push_bytes(inputs, outputs, scalars) <= budget
}

/// Member `j`'s instruction, added to the kernel's code after what it reads (kernel inputs,
/// scalars). Inputs computed by earlier members are their instructions.
fn lower_member(g: &Group<'_>, j: usize, out: &mut Lowered) -> Result<u32> {
    let (m, p) = (g.node(j), g.op(j));
    if let ElemOp::Pad { dim, start, full } = p.op {
        // A padded read shifts coordinates: a kernel input of its own, never deduplicated.
        let i = &p.inputs[0];
        let (input, offset) = read_padded(i, dim, start, full)?;
        let x = add_input(out, input, &i.node, offset);
        return Ok(out.input_instr[x]);
    }
    // Per input (at most three: `where`), its instruction.
    let mut args = [0u32; 3];
    // The op's output shape (the inputs broadcast together), for reads of stored inputs.
    let mut shape: Option<Dims> = None;
    for (k, i) in p.inputs.iter().enumerate() {
        args[k] = match g.member(&i.node) {
            Some(at) if dense_edge(i, m.len) => out.member_instr[at],
            _ => read_input(i, m.len, &p.inputs, &mut shape, out)?,
        };
    }
    let ins = instr(p.op, m.dtype, args, out);
    out.kernel.code.push(ins);
    Ok((out.kernel.code.len() - 1) as u32)
}

/// The instruction that reads stored input `i` of an op of `len` elements over `op_inputs`
/// (`shape`: the op's output shape, computed on first need), deduplicated: a view read
/// before at this shape (a broadcast bias, added again and again) is that read, found
/// without working it out again; the same leaf read the same way is one kernel input.
fn read_input(
    i: &Input,
    len: usize,
    op_inputs: &[Input],
    shape: &mut Option<Dims>,
    out: &mut Lowered,
) -> Result<u32> {
    if let Some(view) = &i.view {
        let shape = shape.get_or_insert_with(|| out_shape(op_inputs));
        let seen = |(x, v, s): &&(usize, Layout, Dims)| {
            Arc::ptr_eq(&out.leaves[*x].0, &i.node) && v.same(view) && s == shape
        };
        if let Some(&(x, ..)) = out.views.iter().find(seen) {
            return Ok(out.input_instr[x]);
        }
    }
    let (input, offset) = read(i, len, op_inputs, shape)?;
    let same = |((n, o), r): (&(Arc<Node>, usize), &FusedInput)| {
        Arc::ptr_eq(n, &i.node) && *o == offset && *r == input
    };
    let x = match out
        .leaves
        .iter()
        .zip(out.kernel.inputs.iter())
        .position(same)
    {
        Some(x) => x,
        None => add_input(out, input, &i.node, offset),
    };
    if let (Some(view), Some(shape)) = (&i.view, &*shape) {
        out.views.push((x, view.clone(), shape.clone()));
    }
    Ok(out.input_instr[x])
}

/// Adds kernel input `input`, which reads `node` from element `offset`, and its
/// instruction; the input's index.
fn add_input(out: &mut Lowered, input: FusedInput, node: &Arc<Node>, offset: usize) -> usize {
    let Lowered {
        kernel,
        leaves,
        input_instr,
        ..
    } = out;
    kernel.inputs.push(input);
    leaves.push((node.clone(), offset));
    kernel
        .code
        .push(Instr::Input((kernel.inputs.len() - 1) as u16));
    input_instr.push((kernel.code.len() - 1) as u32);
    kernel.inputs.len() - 1
}

/// The instruction computing `op` (output `dtype`) over the instructions `args`; a scalar
/// operand is added to the code first.
fn instr(op: ElemOp, dtype: DType, args: [u32; 3], out: &mut Lowered) -> Instr {
    match op {
        ElemOp::Unary(u) => Instr::Unary(u, args[0]),
        ElemOp::Binary(b) => Instr::Binary(b, args[0], args[1]),
        ElemOp::Scalar {
            op,
            s,
            scalar_first,
        } => {
            // The fused max and min take their scalar to be a number (`Instr::Binary`);
            // with a NaN scalar every element is NaN, which `x + NaN` computes.
            let op = match op {
                BinaryOp::Max | BinaryOp::Min if s.is_nan() => BinaryOp::Add,
                op => op,
            };
            let c = constant(out, s);
            match scalar_first {
                true => Instr::Binary(op, c, args[0]),
                false => Instr::Binary(op, args[0], c),
            }
        }
        ElemOp::Compare(c) => Instr::Compare(c, args[0], args[1]),
        ElemOp::CompareScalar(cmp, s) => {
            let c = constant(out, s);
            Instr::Compare(cmp, args[0], c)
        }
        ElemOp::Where => Instr::Where(args[0], args[1], args[2]),
        ElemOp::Cast => Instr::Round(dtype.storage(), args[0]),
        ElemOp::Pad { .. } => unreachable!("lowered as a kernel input"),
        ElemOp::Product { .. } => unreachable!("a product is never a member"),
    }
}

/// The instruction reading scalar parameter `s` (one parameter per distinct value).
fn constant(out: &mut Lowered, s: f32) -> u32 {
    let scalars = &mut out.scalars;
    let i = match scalars.iter().position(|x| x.to_bits() == s.to_bits()) {
        Some(i) => i,
        None => {
            scalars.push(s);
            scalars.len() - 1
        }
    };
    out.kernel.code.push(Instr::Scalar(i as u16));
    (out.kernel.code.len() - 1) as u32
}
