//! Element-wise kernels: unary, binary and tensor–scalar operations on f32.
//!
//! Each invocation handles one vec4 (16-byte loads and stores, what saturates memory
//! bandwidth); the last `n % 4` elements are done by one invocation with scalar accesses, so
//! no buffer needs padding. The same expression code (`unary_expr`, `binary_expr`) emits both
//! the vec4 body and the scalar tail, and later the fused kernels of the lazy graph.

use helios_spirv::{Access, Binding, KernelBuilder, KernelModule, Scalar, Ty, Val};

use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};

use crate::launch::{grid, pack_push, Arg, Geometry, Launch};
use crate::{math, KernelError};

/// One-input element-wise operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// y = x: the compute-shader copy (on discrete GPUs several times faster than the copy
    /// engine's vkCmdCopyBuffer).
    Copy,
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    /// GELU, tanh approximation (as GPT-2 uses).
    GeluTanh,
    Silu,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 12] = [
        UnaryOp::Copy,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Copy => "copy",
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
        }
    }
}

/// Two-input element-wise operations. `Max` and `Min` propagate NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    /// C99 `pow`.
    Pow,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Pow => "pow",
        }
    }
}

/// Emits `op(x)` for a float value of any lane count.
pub fn unary_expr(k: &mut KernelBuilder, op: UnaryOp, x: Val) -> Val {
    match op {
        UnaryOp::Copy => x,
        UnaryOp::Neg => k.neg(x),
        UnaryOp::Abs => k.abs(x),
        UnaryOp::Exp => k.exp(x),
        UnaryOp::Log => k.log(x),
        UnaryOp::Sqrt => k.sqrt(x),
        UnaryOp::Rsqrt => k.rsqrt(x),
        UnaryOp::Tanh => math::tanh(k, x),
        UnaryOp::Sigmoid => math::sigmoid(k, x),
        UnaryOp::Relu => math::relu(k, x),
        UnaryOp::GeluTanh => math::gelu_tanh(k, x),
        UnaryOp::Silu => math::silu(k, x),
    }
}

/// Emits `op(a, b)` for float values of one type.
pub fn binary_expr(k: &mut KernelBuilder, op: BinaryOp, a: Val, b: Val) -> Val {
    match op {
        BinaryOp::Add => k.add(a, b),
        BinaryOp::Sub => k.sub(a, b),
        BinaryOp::Mul => k.mul(a, b),
        BinaryOp::Div => k.div(a, b),
        BinaryOp::Max => math::max_nan(k, a, b, true),
        BinaryOp::Min => math::max_nan(k, a, b, false),
        BinaryOp::Pow => math::pow(k, a, b),
    }
}

/// Which element-wise computation a kernel performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementwiseOp {
    /// y = op(x)
    Unary(UnaryOp),
    /// y = op(a, b)
    Binary(BinaryOp),
    /// y = op(x, s), or op(s, x) when `scalar_first`.
    Scalar { op: BinaryOp, scalar_first: bool },
}

/// The signature of an element-wise kernel: everything that changes the emitted SPIR-V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ElementwiseKernel {
    pub op: ElementwiseOp,
    /// Storage of inputs and output (math is always f32).
    pub dtype: Storage,
    pub binding: Binding,
    /// vec4s per invocation: 1, 2 or 4 (more bytes in flight per invocation, fewer
    /// workgroups).
    pub vecs: u8,
}

/// The vec4-per-invocation counts the family emits.
pub const ELEMENTWISE_VECS: [u8; 3] = [1, 2, 4];

/// Storage types the element-wise family supports.
pub const ELEMENTWISE_DTYPES: [Storage; 3] = Storage::ALL;

/// Default workgroup size (invocations along x).
pub const ELEMENTWISE_WORKGROUP: u32 = 256;

impl ElementwiseKernel {
    /// Every element-wise kernel the library can emit, for validation and warm-up.
    pub fn all(dtype: Storage, binding: Binding) -> Vec<ElementwiseKernel> {
        let mut ops: Vec<ElementwiseOp> = UnaryOp::ALL
            .iter()
            .map(|&u| ElementwiseOp::Unary(u))
            .collect();
        for b in BinaryOp::ALL {
            ops.push(ElementwiseOp::Binary(b));
            ops.push(ElementwiseOp::Scalar {
                op: b,
                scalar_first: false,
            });
            ops.push(ElementwiseOp::Scalar {
                op: b,
                scalar_first: true,
            });
        }
        ops.into_iter()
            .flat_map(|op| {
                ELEMENTWISE_VECS.map(|vecs| ElementwiseKernel {
                    op,
                    dtype,
                    binding,
                    vecs,
                })
            })
            .collect()
    }

    /// A name that identifies the kernel (used in profiles and dumps).
    pub fn name(&self) -> String {
        let base = self.op_name();
        match self.vecs {
            1 => base,
            v => format!("{base}_v{v}"),
        }
    }

    fn op_name(&self) -> String {
        let t = self.dtype.name();
        match self.op {
            ElementwiseOp::Unary(u) => format!("ew_{}_{t}", u.name()),
            ElementwiseOp::Binary(b) => format!("ew_{}_{t}", b.name()),
            ElementwiseOp::Scalar {
                op,
                scalar_first: false,
            } => format!("ew_{}_scalar_{t}", op.name()),
            ElementwiseOp::Scalar {
                op,
                scalar_first: true,
            } => format!("ew_scalar_{}_{t}", op.name()),
        }
    }

    /// Number of buffer inputs.
    pub fn inputs(&self) -> usize {
        match self.op {
            ElementwiseOp::Binary(_) => 2,
            _ => 1,
        }
    }

    /// Emits the kernel. Push constants: input address(es), output address, `n`, and for the
    /// scalar form the scalar `s`.
    pub fn build(&self) -> KernelModule {
        let f32_ty = Ty::scalar(Scalar::F32);
        let mut k = KernelBuilder::new(self.name(), self.binding, [ELEMENTWISE_WORKGROUP, 1, 1]);
        let dtype = self.dtype;
        let elem = buffer_scalar(dtype);
        let a = k.buffer("a", elem, Access::Read);
        let b = match self.op {
            ElementwiseOp::Binary(_) => Some(k.buffer("b", elem, Access::Read)),
            _ => None,
        };
        let y = k.buffer("y", elem, Access::Write);
        let n = k.param("n", Ty::scalar(Scalar::U32));
        let s = match self.op {
            ElementwiseOp::Scalar { .. } => Some(k.param("s", f32_ty)),
            _ => None,
        };
        k.begin();

        // Linear workgroup index over the (possibly 2-D) grid.
        let wid = k.workgroup_id();
        let nwg = k.num_workgroups();
        let (gx, gy, nx) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(nwg, 0));
        let row = k.mul(gy, nx);
        let group = k.add(row, gx);
        let wsize = k.workgroup_size_x();
        let lid = k.local_index();

        let n = k.load_param(n);
        let s = s.map(|p| k.load_param(p));
        let op = self.op;
        // Inputs of element (vector) `idx`, widened to f32 (storage may be f16).
        let load = |k: &mut KernelBuilder, idx: Val, lanes: u8| -> (Val, Option<Val>) {
            let x = load_f32(k, a, idx, lanes, dtype);
            let bv = b.map(|b| load_f32(k, b, idx, lanes, dtype));
            (x, bv)
        };
        let compute = |k: &mut KernelBuilder, x: Val, bv: Option<Val>| -> Val {
            match op {
                ElementwiseOp::Unary(u) => unary_expr(k, u, x),
                ElementwiseOp::Binary(bop) => binary_expr(k, bop, x, bv.expect("binary has b")),
                ElementwiseOp::Scalar { op, scalar_first } => {
                    let sv = k.splat(s.expect("scalar form has s"), x.ty.lanes);
                    if scalar_first {
                        binary_expr(k, op, sv, x)
                    } else {
                        binary_expr(k, op, x, sv)
                    }
                }
            }
        };
        let store = |k: &mut KernelBuilder, idx: Val, r: Val| {
            store_f32(k, y, idx, r, dtype);
        };

        // Each workgroup covers `vecs` consecutive strips of `wsize` vec4s; invocation `lid`
        // takes element `lid` of each strip, so every strip's accesses are coalesced.
        let two = k.u32(2);
        let full = k.shr(n, two); // whole vec4s
        let vecs = u32::from(self.vecs);
        let v = k.u32(vecs);
        let tile = k.mul(v, wsize);
        let tile_start = k.mul(group, tile);
        let first = k.add(tile_start, lid);
        let index = |k: &mut KernelBuilder, j: u32| -> Val {
            if j == 0 {
                return first;
            }
            let jv = k.u32(j);
            let off = k.mul(jv, wsize);
            k.add(first, off)
        };
        let last = index(&mut k, vecs - 1);
        let whole = k.lt(last, full);
        k.if_else(
            whole,
            |k| {
                // The whole tile is in range: all loads first (bytes in flight), then math,
                // then stores.
                let idx: Vec<Val> = (0..vecs).map(|j| index(k, j)).collect();
                let inputs: Vec<(Val, Option<Val>)> = idx.iter().map(|&i| load(k, i, 4)).collect();
                let outs: Vec<Val> = inputs
                    .into_iter()
                    .map(|(x, bv)| compute(k, x, bv))
                    .collect();
                for (i, r) in idx.into_iter().zip(outs) {
                    store(k, i, r);
                }
            },
            |k| {
                for j in 0..vecs {
                    let i = index(k, j);
                    let inside = k.lt(i, full);
                    k.if_(inside, |k| {
                        let (x, bv) = load(k, i, 4);
                        let r = compute(k, x, bv);
                        store(k, i, r);
                    });
                }
            },
        );
        // Invocation 0 also does the 0-3 elements past the last whole vec4.
        let zero = k.u32(0);
        let g0 = k.eq(group, zero);
        let l0 = k.eq(lid, zero);
        let is_tail = k.and(g0, l0);
        k.if_(is_tail, |k| {
            let first = k.shl(full, two);
            for j in 0..3 {
                let off = k.u32(j);
                let e = k.add(first, off);
                let inside = k.lt(e, n);
                k.if_(inside, |k| {
                    let (x, bv) = load(k, e, 1);
                    let r = compute(k, x, bv);
                    store(k, e, r);
                });
            }
        });
        k.finish()
    }

    /// Grid and push constants for `n` elements. `inputs` are the input buffers' device
    /// addresses; `scalar` is required by the scalar form.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        n: u64,
        inputs: &[u64],
        output: u64,
        scalar: Option<f32>,
    ) -> Result<Launch, KernelError> {
        let n32 = u32::try_from(n).map_err(|_| KernelError::TooLarge {
            what: "element count",
            size: n,
        })?;
        if inputs.len() != self.inputs() {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: format!("expects {} inputs, got {}", self.inputs(), inputs.len()),
            });
        }
        // Descriptor-bound kernels get their buffers from the dispatch's bindings instead.
        let mut args: Vec<Arg> = Vec::with_capacity(4);
        if self.binding == Binding::DeviceAddress {
            args.extend(inputs.iter().map(|&a| Arg::Address(a)));
            args.push(Arg::Address(output));
        }
        args.push(Arg::U32(n32));
        match (self.op, scalar) {
            (ElementwiseOp::Scalar { .. }, Some(s)) => args.push(Arg::F32(s)),
            (ElementwiseOp::Scalar { .. }, None) => {
                return Err(KernelError::Arguments {
                    kernel: self.name(),
                    detail: "needs a scalar".into(),
                })
            }
            _ => {}
        }
        // One invocation per vec4 of each strip; at least one workgroup when there is a tail.
        let tile = u64::from(geometry.workgroup) * u64::from(self.vecs);
        let groups = (n / 4).div_ceil(tile).max(u64::from(n > 0));
        let groups = grid(groups, geometry.max_groups_x)?;
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }
}
