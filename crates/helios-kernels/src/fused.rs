//! Fused element-wise kernels: one generated kernel for a whole group of element-wise nodes
//! of the lazy graph (an expression DAG over several inputs, with several outputs).
//!
//! The one decision a reader must know: the problem is baked into the code. The output
//! shape, every input's strides (after merging dimensions contiguous in all of them) and
//! every constant are part of the kernel's signature, so index arithmetic divides by
//! constants and the push constants carry only buffer addresses (each input's address
//! already points at its first element). A training loop repeats the same shapes, so each
//! group compiles once and the schedule cache finds it by this signature; a loop whose
//! shapes or constants change every step would compile every step.
//!
//! Work layout: when the innermost merged dimension is a multiple of 4, each invocation
//! handles `vecs` vec4s (strips of the workgroup, as the plain element-wise kernels do) and
//! every input is read the cheapest way its strides allow: one vector load (row-contiguous
//! and 16-byte aligned), one scalar load splat to four lanes (broadcast along the inner
//! dimension), or four scalar loads. Otherwise each invocation does one element.

use helios_spirv::{Access, Binding, Buffer, CmpOp, KernelBuilder, KernelModule, Scalar, Ty, Val};

use crate::elementwise::{binary_expr, unary_expr, BinaryOp, UnaryOp};
use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::storage::{buffer_scalar, f32_to_bf16_bits, load_f32, round_to_f16, store_f32, Storage};
use crate::{math, KernelError};

/// A comparison giving 1.0 where true and 0.0 where false (NaN compares unequal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compare {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Compare {
    pub const ALL: [Compare; 6] = [
        Compare::Lt,
        Compare::Le,
        Compare::Gt,
        Compare::Ge,
        Compare::Eq,
        Compare::Ne,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Compare::Lt => "lt",
            Compare::Le => "le",
            Compare::Gt => "gt",
            Compare::Ge => "ge",
            Compare::Eq => "eq",
            Compare::Ne => "ne",
        }
    }

    /// The comparison on f64 values (the CPU reference).
    pub fn eval(self, a: f64, b: f64) -> bool {
        match self {
            Compare::Lt => a < b,
            Compare::Le => a <= b,
            Compare::Gt => a > b,
            Compare::Ge => a >= b,
            Compare::Eq => a == b,
            Compare::Ne => a != b,
        }
    }

    fn op(self) -> CmpOp {
        match self {
            Compare::Lt => CmpOp::Lt,
            Compare::Le => CmpOp::Le,
            Compare::Gt => CmpOp::Gt,
            Compare::Ge => CmpOp::Ge,
            Compare::Eq => CmpOp::Eq,
            Compare::Ne => CmpOp::Ne,
        }
    }
}

/// One instruction of a fused expression. Operands are indices of earlier instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Instr {
    /// Input `i`'s element, widened to f32.
    Input(u16),
    /// Scalar parameter `i` (a push constant: the same kernel serves every value, and no
    /// compiler folds `x · 0` to 0 for a NaN `x`).
    Scalar(u16),
    Unary(UnaryOp, u32),
    /// `op(a, b)`. A `Max` or `Min` with one `Scalar` operand takes that scalar to be a
    /// number (three instructions instead of six: only the other operand's NaN is tested);
    /// `launch` refuses a NaN there. `max(x, NaN)` is NaN for every `x`, so it is written
    /// `Add` (`x + NaN`).
    Binary(BinaryOp, u32, u32),
    /// 1.0 where `a op b`, else 0.0.
    Compare(Compare, u32, u32),
    /// `c != 0 ? a : b` (c, a, b).
    Where(u32, u32, u32),
    /// The value rounded to a storage format's precision (a cast inside the expression).
    Round(Storage, u32),
}

impl Instr {
    pub fn name(&self) -> &'static str {
        match self {
            Instr::Input(_) => "input",
            Instr::Scalar(_) => "scalar",
            Instr::Unary(u, _) => u.name(),
            Instr::Binary(b, ..) => b.name(),
            Instr::Compare(c, ..) => c.name(),
            Instr::Where(..) => "where",
            Instr::Round(..) => "cast",
        }
    }

    fn operands(&self) -> impl Iterator<Item = u32> {
        let (a, b, c) = match *self {
            Instr::Input(_) | Instr::Scalar(_) => (None, None, None),
            Instr::Unary(_, a) | Instr::Round(_, a) => (Some(a), None, None),
            Instr::Binary(_, a, b) | Instr::Compare(_, a, b) => (Some(a), Some(b), None),
            Instr::Where(c, a, b) => (Some(c), Some(a), Some(b)),
        };
        a.into_iter().chain(b).chain(c)
    }
}

/// Sizes or strides of a fused input, inline up to `MAX_DIMS`.
pub type Dims = smallvec::SmallVec<[u32; crate::MAX_DIMS]>;

/// One input of a fused kernel, read as a view of the output's elements: output element `e`
/// reads the input at the coordinates of `e` in `shape`, through `strides`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedInput {
    pub dtype: Storage,
    /// (dims) the view's shape, outermost first, dimensions contiguous in both the view and
    /// the input merged; its product is the kernel's element count. Inline: the scheduler
    /// builds a signature per realisation to look its kernel up, without allocating.
    pub shape: Dims,
    /// (dims) element strides along `shape`; 0 where broadcast.
    pub strides: Dims,
    /// Whether the address passed for this input is 16-byte aligned for vec4 loads (its
    /// first element sits a multiple of 4 elements into a buffer).
    pub aligned: bool,
    /// A zero-padded read: only coordinates `start..start + len` along `dim` of `shape` hold
    /// input elements (at coordinate − start); elsewhere the value is 0. The vector form
    /// keeps it only where every vec4 lies wholly inside or outside (see
    /// [`Window::keeps_vec4s`]).
    pub window: Option<Window>,
}

/// The window of a zero-padded input (see [`FusedInput::window`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub dim: u8,
    pub start: u32,
    pub len: u32,
}

impl Window {
    /// Whether the four elements of every vec4 of a view of `dims` dimensions lie on the same
    /// side of the window: it cuts an outer dimension (a concatenation along it: the
    /// gradient of q, k and v assembled into one of a fused QKV), or the innermost one at
    /// multiples of 4.
    pub fn keeps_vec4s(&self, dims: usize) -> bool {
        usize::from(self.dim) + 1 < dims || (self.start % 4 == 0 && self.len % 4 == 0)
    }
}

/// The signature of a fused kernel: everything that changes the emitted SPIR-V.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedKernel {
    pub binding: Binding,
    /// Elements of every output (each dense).
    pub len: u32,
    pub inputs: Vec<FusedInput>,
    pub code: Vec<Instr>,
    /// (instruction, storage) of each output.
    pub outputs: Vec<(u32, Storage)>,
    /// Scalar parameters (`Instr::Scalar`), pushed after the addresses.
    pub scalars: u16,
    /// vec4s per invocation in the vector form (1, 2 or 4).
    pub vecs: u8,
}

/// How one input is read for four consecutive elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    /// Element index = output element index (dense, same shape).
    Dense,
    /// One vector load at the element offset / 4.
    Vector,
    /// One scalar load, splat to four lanes (inner stride 0).
    Splat,
    /// Four scalar loads, `inner` elements apart.
    Gather,
}

impl FusedKernel {
    /// Whether invocations handle vec4s: the element count and every input view's innermost
    /// dimension are multiples of 4, so four consecutive elements share a row of each input,
    /// and every window keeps vec4s whole.
    pub fn vectorized(&self) -> bool {
        self.len % 4 == 0
            && self.inputs.iter().all(|i| {
                i.shape.last().is_some_and(|&s| s % 4 == 0)
                    && i.window.map_or(true, |w| w.keeps_vec4s(i.shape.len()))
            })
    }

    /// Bytes of push constants a kernel needs: an address per input and output, 4 bytes per
    /// scalar.
    pub fn push_bytes(inputs: usize, outputs: usize, scalars: usize) -> u32 {
        (8 * (inputs + outputs) + 4 * scalars) as u32
    }

    /// `fused<n>_<first op>_<last op>`: enough to recognise a group in a profile.
    pub fn name(&self) -> String {
        let ops: Vec<&str> = self
            .code
            .iter()
            .filter(|i| !matches!(i, Instr::Input(_) | Instr::Scalar(_)))
            .map(Instr::name)
            .collect();
        match (ops.first(), ops.last()) {
            (Some(a), Some(b)) if ops.len() > 1 => format!("fused{}_{a}_{b}", ops.len()),
            (Some(a), _) => format!("fused1_{a}"),
            _ => "fused0_copy".to_string(),
        }
    }

    /// Checks operands refer to earlier instructions, inputs exist and shapes agree.
    pub fn check(&self) -> Result<(), KernelError> {
        let bad = |detail: String| KernelError::Arguments {
            kernel: self.name(),
            detail,
        };
        for (i, ins) in self.code.iter().enumerate() {
            if ins.operands().any(|o| o as usize >= i) {
                return Err(bad(format!("instruction {i} reads a later value")));
            }
            match ins {
                Instr::Input(x) if usize::from(*x) >= self.inputs.len() => {
                    return Err(bad(format!("instruction {i} reads missing input {x}")));
                }
                Instr::Scalar(x) if *x >= self.scalars => {
                    return Err(bad(format!("instruction {i} reads missing scalar {x}")));
                }
                _ => {}
            }
        }
        for inp in &self.inputs {
            let n: u64 = inp.shape.iter().map(|&s| u64::from(s)).product();
            if inp.strides.len() != inp.shape.len() || n != u64::from(self.len) {
                return Err(bad(format!(
                    "input view {:?} (strides {:?}) does not hold {} elements",
                    inp.shape, inp.strides, self.len
                )));
            }
        }
        if self.outputs.is_empty()
            || self
                .outputs
                .iter()
                .any(|&(o, _)| o as usize >= self.code.len())
        {
            return Err(bad("outputs must name instructions".into()));
        }
        Ok(())
    }

    /// How `input` is read for `lanes` elements (one-element evaluations of a vectorized
    /// kernel, at a reduction's row edges, read one element).
    fn read(&self, input: &FusedInput, lanes: u8) -> Read {
        let dims = input.shape.len();
        let dense: bool = {
            let mut expect = 1u64;
            let mut ok = true;
            for d in (0..dims).rev() {
                ok &= input.shape[d] == 1 || u64::from(input.strides[d]) == expect;
                expect *= u64::from(input.shape[d]);
            }
            ok
        };
        // A window shifts the coordinates, so the element index never addresses the input.
        let dense = dense && input.window.is_none();
        let inner = input.strides.last().copied().unwrap_or(1);
        if !self.vectorized() || lanes == 1 {
            return if dense { Read::Dense } else { Read::Gather };
        }
        if dense && input.aligned {
            return Read::Dense;
        }
        let outer_aligned = input.strides[..dims - 1].iter().all(|s| s % 4 == 0);
        if inner == 1 && outer_aligned && input.aligned {
            Read::Vector
        } else if inner == 0 {
            Read::Splat
        } else {
            Read::Gather
        }
    }

    /// Declares the inputs' buffers (`in<i>`) in `k`.
    pub(crate) fn declare_inputs(&self, k: &mut KernelBuilder) -> Vec<Buffer> {
        (0..self.inputs.len())
            .map(|i| {
                let elem = buffer_scalar(self.inputs[i].dtype);
                k.buffer(&format!("in{i}"), elem, Access::Read)
            })
            .collect()
    }

    /// Declares the parameters in `k`, after whatever it declared before: the scalars
    /// (`s<i>`), then, under descriptor binding, each input's element offset (`off<i>`:
    /// a descriptor binds the whole buffer, where an address would point at the view).
    pub(crate) fn declare_params(&self, k: &mut KernelBuilder) -> Vec<helios_spirv::Param> {
        let mut params: Vec<helios_spirv::Param> = (0..self.scalars)
            .map(|i| k.param(&format!("s{i}"), Ty::scalar(Scalar::F32)))
            .collect();
        if self.binding == Binding::Descriptor {
            params.extend(
                (0..self.inputs.len())
                    .map(|i| k.param(&format!("off{i}"), Ty::scalar(Scalar::U32))),
            );
        }
        params
    }

    /// The loaded parameters split into (scalars, input offsets).
    pub(crate) fn split_params<'a>(&self, params: &'a [Val]) -> (&'a [Val], &'a [Val]) {
        params.split_at(usize::from(self.scalars))
    }

    /// The values of the outputs in `which` (each rounded to its storage, as a stored value
    /// would be) at element `at` (`lanes` 1) or at the four elements of vec4 `at` (`lanes`
    /// 4: one vector evaluation when `vectorized`, else one per element), inside another
    /// kernel: a reduction's prologue, which folds the root (the last output) and may store
    /// the members held outside its group.
    pub(crate) fn outputs_at(
        &self,
        k: &mut KernelBuilder,
        inputs: &[Buffer],
        params: &[Val],
        at: Val,
        lanes: u8,
        which: std::ops::Range<usize>,
    ) -> Vec<Val> {
        if lanes == 4 && !self.vectorized() {
            let two = k.u32(2);
            let e0 = k.shl(at, two);
            let per_element: Vec<Vec<Val>> = (0..4)
                .map(|j| {
                    let off = k.u32(j);
                    let e = k.add(e0, off);
                    self.outputs_at(k, inputs, params, e, 1, which.clone())
                })
                .collect();
            return (0..which.len())
                .map(|o| {
                    let parts: Vec<Val> = per_element.iter().map(|v| v[o]).collect();
                    k.vector(&parts)
                })
                .collect();
        }
        let vals = self.values(k, inputs, params, at, lanes);
        self.outputs[which]
            .iter()
            .map(|&(o, s)| round(k, vals[o as usize], s))
            .collect()
    }

    /// Emits the kernel. Push constants: each input's address, then each output's.
    pub fn build(&self, workgroup: u32) -> KernelModule {
        let mut k = KernelBuilder::new(self.name(), self.binding, [workgroup, 1, 1]);
        let inputs = self.declare_inputs(&mut k);
        let outputs: Vec<Buffer> = (0..self.outputs.len())
            .map(|i| {
                let elem = buffer_scalar(self.outputs[i].1);
                k.buffer(&format!("out{i}"), elem, Access::Write)
            })
            .collect();
        let params = self.declare_params(&mut k);
        k.begin();
        let scalars: Vec<Val> = params.into_iter().map(|p| k.load_param(p)).collect();
        let wid = k.workgroup_id();
        let nwg = k.num_workgroups();
        let (gx, gy, nx) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(nwg, 0));
        let row = k.mul(gy, nx);
        let group = k.add(row, gx);
        // The workgroup size is a specialisation constant (HELIOS_WG may override `workgroup`).
        let wsize = k.workgroup_size_x();
        let lid = k.local_index();
        let n = self.len;
        if self.vectorized() {
            let vecs = u32::from(self.vecs);
            let v = k.u32(vecs);
            let tile = k.mul(v, wsize);
            let start = k.mul(group, tile);
            let first = k.add(start, lid);
            let nvec = k.u32(n / 4);
            for j in 0..vecs {
                let q = if j == 0 {
                    first
                } else {
                    let jv = k.u32(j);
                    let off = k.mul(jv, wsize);
                    k.add(first, off)
                };
                let inside = k.lt(q, nvec);
                k.if_(inside, |k| {
                    self.element(k, &inputs, &outputs, &scalars, q, 4)
                });
            }
        } else {
            let base = k.mul(group, wsize);
            let e = k.add(base, lid);
            let nv = k.u32(n);
            let inside = k.lt(e, nv);
            k.if_(inside, |k| {
                self.element(k, &inputs, &outputs, &scalars, e, 1)
            });
        }
        k.finish()
    }

    /// Computes and stores output element `at` (lanes 1) or vec4 `at` (lanes 4).
    fn element(
        &self,
        k: &mut KernelBuilder,
        inputs: &[Buffer],
        outputs: &[Buffer],
        scalars: &[Val],
        at: Val,
        lanes: u8,
    ) {
        let vals = self.values(k, inputs, scalars, at, lanes);
        for (&(o, s), &buf) in self.outputs.iter().zip(outputs) {
            // Rounded first, so that the store's conversion is exact whatever rounding the
            // driver gives it, and agrees with `round` in a reduction's prologue.
            let v = match s {
                Storage::F16 => round_to_f16(k, vals[o as usize]),
                _ => vals[o as usize],
            };
            store_f32(k, buf, at, v, s);
        }
    }

    /// Every instruction's value at element `at` (lanes 1) or vec4 `at` (lanes 4).
    /// `params` are the loaded `declare_params`.
    fn values(
        &self,
        k: &mut KernelBuilder,
        inputs: &[Buffer],
        params: &[Val],
        at: Val,
        lanes: u8,
    ) -> Vec<Val> {
        // Without contraction: the same group computed here and in a reduction's loads (a
        // prologue) must round alike, whatever code surrounds it.
        let contracting = k.set_exact_arithmetic(true);
        let (scalars, offsets) = self.split_params(params);
        let e = if lanes == 4 {
            let two = k.u32(2);
            k.shl(at, two)
        } else {
            at
        };
        // Coordinates of element `e` per view shape, computed once for the inputs needing them.
        let mut coords: Vec<(&[u32], Vec<Val>)> = Vec::new();
        let mut vals: Vec<Val> = Vec::with_capacity(self.code.len());
        let fty = Ty::vector(Scalar::F32, lanes);
        for ins in &self.code {
            let v = match *ins {
                Instr::Input(i) => {
                    let input = &self.inputs[usize::from(i)];
                    let read = self.read(input, lanes);
                    if read == Read::Dense {
                        // Under descriptor binding the view starts `offsets[i]` elements in
                        // (a multiple of 4 where vectors are read: `aligned`).
                        let at = match offsets.get(usize::from(i)) {
                            None => at,
                            Some(&o) if lanes == 4 => {
                                let two = k.u32(2);
                                let q = k.shr(o, two);
                                k.add(at, q)
                            }
                            Some(&o) => k.add(at, o),
                        };
                        load_f32(k, inputs[usize::from(i)], at, lanes, input.dtype)
                    } else {
                        let cs = match coords.iter().find(|(s, _)| *s == input.shape.as_slice()) {
                            Some((_, cs)) => cs.clone(),
                            None => {
                                let cs = coordinates(k, &input.shape, e);
                                coords.push((&input.shape, cs.clone()));
                                cs
                            }
                        };
                        let mut cs = cs;
                        // A padded read: the window's coordinate shifted, 0 outside.
                        let inside = input.window.map(|w| {
                            let d = usize::from(w.dim);
                            let start = k.u32(w.start);
                            let end = k.u32(w.start + w.len);
                            let lo = k.ge(cs[d], start);
                            let hi = k.lt(cs[d], end);
                            let inside = k.and(lo, hi);
                            let shifted = k.sub(cs[d], start);
                            let zero = k.u32(0);
                            cs[d] = k.select(inside, shifted, zero);
                            inside
                        });
                        let mut off = match offsets.get(usize::from(i)) {
                            Some(&o) => o,
                            None => k.u32(0),
                        };
                        for (c, &s) in cs.iter().zip(&input.strides) {
                            if s != 0 {
                                let sv = k.u32(s);
                                let t = k.mul(*c, sv);
                                off = k.add(off, t);
                            }
                        }
                        let v = self.load(k, inputs[usize::from(i)], input, read, off, lanes);
                        match inside {
                            Some(inside) => {
                                let zero = k.const_float(fty, 0.0);
                                k.select(inside, v, zero)
                            }
                            None => v,
                        }
                    }
                }
                Instr::Scalar(i) => k.splat(scalars[usize::from(i)], lanes),
                Instr::Unary(op, a) => unary_expr(k, op, vals[a as usize]),
                Instr::Binary(op, a, b) => self.binary(k, op, (a, b), &vals),
                Instr::Compare(op, a, b) => {
                    let c = k.cmp(op.op(), vals[a as usize], vals[b as usize]);
                    let one = k.const_float(fty, 1.0);
                    let zero = k.const_float(fty, 0.0);
                    k.select(c, one, zero)
                }
                Instr::Where(c, a, b) => {
                    let zero = k.const_float(fty, 0.0);
                    let cond = k.cmp(CmpOp::Ne, vals[c as usize], zero);
                    k.select(cond, vals[a as usize], vals[b as usize])
                }
                Instr::Round(s, a) => round(k, vals[a as usize], s),
            };
            vals.push(v);
        }
        k.set_exact_arithmetic(contracting);
        vals
    }

    /// `op` over the values of instructions `a` and `b`: a max or min of a scalar parameter
    /// (a number: see `Instr::Binary`) tests only the other operand for NaN.
    fn binary(&self, k: &mut KernelBuilder, op: BinaryOp, (a, b): (u32, u32), vals: &[Val]) -> Val {
        let (va, vb) = (vals[a as usize], vals[b as usize]);
        let want_max = match op {
            BinaryOp::Max => true,
            BinaryOp::Min => false,
            _ => return binary_expr(k, op, va, vb),
        };
        match (self.is_scalar(a), self.is_scalar(b)) {
            (false, true) => math::max_nan_number(k, va, vb, want_max),
            (true, false) => math::max_nan_number(k, vb, va, want_max),
            _ => binary_expr(k, op, va, vb),
        }
    }

    fn is_scalar(&self, i: u32) -> bool {
        matches!(self.code[i as usize], Instr::Scalar(_))
    }

    /// Checks the scalar values a launch passes: one feeding a max or min must be a number
    /// (the kernel does not test it for NaN).
    pub(crate) fn check_scalars(&self, scalars: &[f32]) -> Result<(), KernelError> {
        if scalars.len() != usize::from(self.scalars) {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: format!("expects {} scalars, got {}", self.scalars, scalars.len()),
            });
        }
        if !scalars.iter().any(|s| s.is_nan()) {
            return Ok(());
        }
        for ins in &self.code {
            let Instr::Binary(BinaryOp::Max | BinaryOp::Min, a, b) = *ins else {
                continue;
            };
            for o in [a, b] {
                if let Instr::Scalar(i) = self.code[o as usize] {
                    if scalars[usize::from(i)].is_nan() {
                        return Err(KernelError::Arguments {
                            kernel: self.name(),
                            detail: format!(
                                "scalar {i} is NaN but feeds a max or min, which take their \
                                 scalar as a number (write max(x, NaN) as x + NaN)"
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    fn load(
        &self,
        k: &mut KernelBuilder,
        buf: Buffer,
        input: &FusedInput,
        read: Read,
        off: Val,
        lanes: u8,
    ) -> Val {
        match read {
            Read::Dense => unreachable!("dense reads use the element index"),
            Read::Vector => {
                let two = k.u32(2);
                let q = k.shr(off, two);
                load_f32(k, buf, q, 4, input.dtype)
            }
            Read::Splat => {
                let x = load_f32(k, buf, off, 1, input.dtype);
                k.splat(x, lanes)
            }
            Read::Gather => {
                if lanes == 1 {
                    return load_f32(k, buf, off, 1, input.dtype);
                }
                let inner = input.strides.last().copied().unwrap_or(1);
                let parts: Vec<Val> = (0..4)
                    .map(|j| {
                        let idx = if j == 0 {
                            off
                        } else {
                            let step = k.u32(j * inner);
                            k.add(off, step)
                        };
                        load_f32(k, buf, idx, 1, input.dtype)
                    })
                    .collect();
                k.vector(&parts)
            }
        }
    }

    /// Grid and push constants. `inputs` and `outputs` are device addresses, each input's
    /// pointing at its view's first element (ignored under descriptor binding, where the
    /// dispatch binds the buffers in the same order and `offsets` gives each input view's
    /// first element).
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        inputs: &[u64],
        outputs: &[u64],
        scalars: &[f32],
        offsets: &[u32],
    ) -> Result<Launch, KernelError> {
        if inputs.len() != self.inputs.len() || outputs.len() != self.outputs.len() {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: format!(
                    "expects {} inputs and {} outputs, got {} and {}",
                    self.inputs.len(),
                    self.outputs.len(),
                    inputs.len(),
                    outputs.len()
                ),
            });
        }
        let n = u64::from(self.len);
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.extend(inputs.iter().chain(outputs).map(|&a| Arg::Address(a)));
        }
        self.check_scalars(scalars)?;
        args.extend(scalars.iter().map(|&s| Arg::F32(s)));
        self.offset_args(offsets, &mut args)?;
        let per_group = if self.vectorized() {
            4 * u64::from(self.vecs) * u64::from(geometry.workgroup)
        } else {
            u64::from(geometry.workgroup)
        };
        let groups = grid(n.div_ceil(per_group), geometry.max_groups_x)?;
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }
}

impl FusedKernel {
    /// Pushes the input offsets (descriptor binding only; checked against the inputs).
    pub(crate) fn offset_args(&self, offsets: &[u32], args: &mut Args) -> Result<(), KernelError> {
        if self.binding != Binding::Descriptor {
            return Ok(());
        }
        if offsets.len() != self.inputs.len() {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: format!(
                    "expects {} input offsets, got {}",
                    self.inputs.len(),
                    offsets.len()
                ),
            });
        }
        args.extend(offsets.iter().map(|&o| Arg::U32(o)));
        Ok(())
    }
}

/// `value` rounded to the precision of `s` (round to nearest even), still f32.
fn round(k: &mut KernelBuilder, value: Val, s: Storage) -> Val {
    let lanes = value.ty.lanes;
    match s {
        Storage::F32 => value,
        Storage::F16 => round_to_f16(k, value),
        Storage::BF16 => {
            let bits = f32_to_bf16_bits(k, value);
            let wide = k.convert(bits, Scalar::U32);
            let sixteen = k.u32(16);
            let sixteen = k.splat(sixteen, lanes);
            let hi = k.shl(wide, sixteen);
            k.bitcast(hi, Ty::vector(Scalar::F32, lanes))
        }
    }
}

/// The coordinates (outermost first) of element `e` in `shape`, by divisions by constants.
fn coordinates(k: &mut KernelBuilder, shape: &[u32], e: Val) -> Vec<Val> {
    let dims = shape.len();
    let mut cs = vec![e; dims];
    let mut rest = e;
    for d in (1..dims).rev() {
        let size = k.u32(shape[d]);
        cs[d] = k.rem(rest, size);
        rest = k.div(rest, size);
    }
    cs[0] = rest;
    cs
}

#[cfg(test)]
mod tests {
    use super::*;
    use helios_spirv::{validate, TargetEnv};

    /// `op(x, s)` over 64 f32, with `s` a scalar (or a second input).
    fn kernel(op: BinaryOp, scalar: bool) -> FusedKernel {
        let input = FusedInput {
            dtype: Storage::F32,
            shape: Dims::from_slice(&[64]),
            strides: Dims::from_slice(&[1]),
            aligned: true,
            window: None,
        };
        let (second, inputs, scalars) = match scalar {
            true => (Instr::Scalar(0), vec![input], 1),
            false => (Instr::Input(1), vec![input.clone(), input], 0),
        };
        FusedKernel {
            binding: Binding::DeviceAddress,
            len: 64,
            inputs,
            code: vec![Instr::Input(0), second, Instr::Binary(op, 0, 1)],
            outputs: vec![(2, Storage::F32)],
            scalars,
            vecs: 1,
        }
    }

    fn count(module: &KernelModule, op: &str) -> usize {
        module
            .disassemble()
            .lines()
            .filter(|l| l.contains(op))
            .count()
    }

    /// A max or min of a scalar tests only the tensor operand for NaN (three instructions,
    /// where two tensors take six); the snapshot of that choice.
    #[test]
    fn scalar_max_and_min_test_one_operand_for_nan() {
        for op in [BinaryOp::Max, BinaryOp::Min] {
            let with_scalar = kernel(op, true).build(64);
            assert_eq!(count(&with_scalar, "OpIsNan"), 1);
            assert_eq!(count(&with_scalar, "OpLogicalOr"), 0);
            let two_tensors = kernel(op, false).build(64);
            assert_eq!(count(&two_tensors, "OpIsNan"), 2);
        }
    }

    /// Every float product and sum of the expression is decorated `NoContraction` (so a group
    /// rounds alike in its own kernel and in a reduction's loads), and nothing else is.
    #[test]
    fn expressions_are_not_contracted() {
        let mut k = kernel(BinaryOp::Mul, true);
        // x·s + x, then (x·s + x) − s.
        k.code.extend([
            Instr::Binary(BinaryOp::Add, 2, 0),
            Instr::Binary(BinaryOp::Sub, 3, 1),
        ]);
        k.outputs = vec![(4, Storage::F32)];
        let module = k.build(64);
        for env in [TargetEnv::Vulkan1_2, TargetEnv::Vulkan1_3] {
            validate(&module.name, &module.words, env).unwrap_or_else(|e| panic!("{e}"));
        }
        let asm = module.disassemble();
        let results = |ops: &[&str]| -> Vec<String> {
            asm.lines()
                .filter(|l| ops.iter().any(|op| l.contains(&format!("= {op} "))))
                .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
                .collect()
        };
        let float = results(&["OpFMul", "OpFAdd", "OpFSub"]);
        let decorated: Vec<&str> = asm
            .lines()
            .filter(|l| l.contains("NoContraction"))
            .filter_map(|l| l.split_whitespace().nth(1))
            .collect();
        assert_eq!(float.len(), 3, "{asm}");
        assert_eq!(decorated.len(), float.len(), "{asm}");
        for id in &float {
            assert!(
                decorated.contains(&id.as_str()),
                "{id} not decorated:\n{asm}"
            );
        }
    }

    /// The launch refuses a NaN scalar where the kernel takes it as a number, and accepts it
    /// elsewhere.
    #[test]
    fn a_nan_scalar_of_a_max_is_refused() {
        let geometry = Geometry {
            workgroup: 64,
            max_groups_x: 65535,
        };
        for op in [BinaryOp::Max, BinaryOp::Min, BinaryOp::Add] {
            let k = kernel(op, true);
            let m = k.build(64);
            let launch = |s: f32| k.launch(&m, geometry, &[0x1000], &[0x2000], &[s], &[]);
            assert!(launch(2.0).is_ok());
            let nan = launch(f32::NAN);
            match op {
                BinaryOp::Add => assert!(nan.is_ok(), "{nan:?}"),
                _ => assert!(
                    matches!(nan, Err(KernelError::Arguments { .. })),
                    "{op:?}: {nan:?}"
                ),
            }
        }
    }
}
