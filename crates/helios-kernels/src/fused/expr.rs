//! The expression of a fused kernel, emitted at one element or vec4: its inputs read the
//! cheapest way their views allow (`Read`), then every instruction in order. A standalone
//! fused kernel stores the outputs (`mod.rs`); a reduction's prologue folds them.

use helios_spirv::{Access, Binding, Buffer, CmpOp, KernelBuilder, Scalar, Ty, Val};

use super::signature::{FusedInput, FusedKernel, Instr};
use crate::elementwise::{binary_expr, unary_expr, BinaryOp};
use crate::math;
use crate::storage::{buffer_scalar, f32_to_bf16_bits, load_f32, round_to_f16, Storage};

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

    /// Every instruction's value at element `at` (lanes 1) or vec4 `at` (lanes 4).
    /// `params` are the loaded `declare_params`.
    pub(super) fn values(
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
