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
//!
//! Files (each imports only files below it): this one builds a standalone kernel and launches
//! it (its scalars and input offsets checked); `expr` emits the expression itself (each input
//! read the cheapest way its view allows, every instruction's value at an element or vec4),
//! which a reduction's prologue emits inside its own kernel too; `signature` holds the public
//! signature (`FusedKernel`, its inputs, windows and instructions), its name and its checks.

mod expr;
mod signature;

pub use signature::{Compare, Dims, FusedInput, FusedKernel, Instr, Window};

use helios_spirv::{Access, Binding, Buffer, KernelBuilder, KernelModule, Val};

use crate::elementwise::BinaryOp;
use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::storage::{buffer_scalar, round_to_f16, store_f32, Storage};
use crate::KernelError;

impl FusedKernel {
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
