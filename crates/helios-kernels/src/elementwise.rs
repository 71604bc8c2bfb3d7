//! Element-wise kernels: unary, binary (with the activation gradients) and tensor–scalar
//! operations, and casts, on f32, f16 or bf16 storage with f32 arithmetic.
//!
//! The variant table (`Variant`) is part of each kernel's signature. Dense operands take the
//! vec4 kernels: each invocation handles 1, 2 or 4 vec4s (16-byte f32 loads, what saturates
//! memory bandwidth), the last `n % 4` elements are done by one invocation with scalar
//! accesses so no buffer needs padding, and an exact form drops every bounds check when the
//! size is a whole number of tiles. Any other layout (broadcast, transposed, sliced) takes the
//! strided kernel (`elementwise_strided`). The same expression code (`unary_expr`,
//! `binary_expr`) emits every variant's body and, later, the fused kernels of the lazy graph;
//! storage formats are read and written only through `storage::{load_f32, store_f32}`.

use helios_spirv::{Access, Binding, Buffer, KernelBuilder, KernelModule, Scalar, Ty, Val};

use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};
use crate::{math, KernelError};

pub use crate::elementwise_strided::Strides;

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

/// Two-input element-wise operations. `Max` and `Min` propagate NaN. The activation
/// backward ops take `(x, dy)` and give `dx`; NaN in either gives NaN.
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
    /// dx = dy · relu'(x) (0 at x ≤ 0).
    ReluBackward,
    /// dx = dy · silu'(x).
    SiluBackward,
    /// dx = dy · gelu_tanh'(x).
    GeluTanhBackward,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 10] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
        BinaryOp::ReluBackward,
        BinaryOp::SiluBackward,
        BinaryOp::GeluTanhBackward,
    ];

    /// The arithmetic ops: those with tensor–scalar forms.
    pub const ARITHMETIC: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
    ];

    /// Activation gradients `(x, dy) -> dx`.
    pub const ACTIVATION_BACKWARD: [BinaryOp; 3] = [
        BinaryOp::ReluBackward,
        BinaryOp::SiluBackward,
        BinaryOp::GeluTanhBackward,
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
            BinaryOp::ReluBackward => "relu_backward",
            BinaryOp::SiluBackward => "silu_backward",
            BinaryOp::GeluTanhBackward => "gelu_tanh_backward",
        }
    }

    /// Whether the op has tensor–scalar forms (the arithmetic ops do; gradients do not).
    pub const fn has_scalar_form(self) -> bool {
        !matches!(
            self,
            BinaryOp::ReluBackward | BinaryOp::SiluBackward | BinaryOp::GeluTanhBackward
        )
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
        BinaryOp::ReluBackward => math::relu_backward(k, a, b),
        BinaryOp::SiluBackward => math::silu_backward(k, a, b),
        BinaryOp::GeluTanhBackward => math::gelu_tanh_backward(k, a, b),
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

impl ElementwiseOp {
    /// Every op and form the family emits.
    pub fn all() -> Vec<ElementwiseOp> {
        let mut ops: Vec<ElementwiseOp> = UnaryOp::ALL
            .iter()
            .map(|&u| ElementwiseOp::Unary(u))
            .collect();
        for b in BinaryOp::ALL {
            ops.push(ElementwiseOp::Binary(b));
            if b.has_scalar_form() {
                for scalar_first in [false, true] {
                    ops.push(ElementwiseOp::Scalar {
                        op: b,
                        scalar_first,
                    });
                }
            }
        }
        ops
    }
}

/// The variant table: how a kernel walks its elements. `Device::elementwise_kernel` (in
/// `helios`) is the one function that picks a variant for an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Contiguous operands from element 0, `vecs` vec4s per invocation (1, 2 or 4: more
    /// bytes in flight, fewer workgroups). Without `exact`, any size: strips past the end are
    /// checked and invocation 0 does the last `n % 4` elements with scalar accesses. With
    /// `exact`, the size is a whole number of tiles (`exact_fits`): no checks, no tail.
    Vec4 { vecs: u8, exact: bool },
    /// Any layout (broadcast, transposed, sliced, offset): one element per invocation, each
    /// input's element offset computed from `dims` (1..=`MAX_DIMS`) sizes and strides passed
    /// in push constants; the output is contiguous.
    Strided { dims: u8 },
}

/// The vec4-per-invocation counts the family emits.
pub const ELEMENTWISE_VECS: [u8; 3] = [1, 2, 4];

/// Storage types the element-wise family supports.
pub const ELEMENTWISE_DTYPES: [Storage; 3] = Storage::ALL;

/// Default workgroup size (invocations along x).
pub const ELEMENTWISE_WORKGROUP: u32 = 256;

/// Most dimensions a strided kernel indexes (after merging dimensions that are contiguous in
/// every operand); 6 keeps a binary kernel's push constants under the 128 bytes every device
/// offers.
pub const MAX_DIMS: usize = 6;

/// The signature of an element-wise kernel: everything that changes the emitted SPIR-V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ElementwiseKernel {
    pub op: ElementwiseOp,
    /// Storage of the inputs (math is always f32).
    pub dtype: Storage,
    /// Storage of the output: `dtype` except for casts (`Unary(Copy)` between storages).
    pub out: Storage,
    pub binding: Binding,
    pub variant: Variant,
}

impl ElementwiseKernel {
    /// Every element-wise kernel the library can emit with inputs stored as `dtype`, for
    /// validation and warm-up: every op in every variant, and casts to every other storage.
    pub fn all(dtype: Storage, binding: Binding) -> Vec<ElementwiseKernel> {
        let mut variants: Vec<Variant> = Vec::new();
        for vecs in ELEMENTWISE_VECS {
            for exact in [false, true] {
                variants.push(Variant::Vec4 { vecs, exact });
            }
        }
        for dims in 1..=MAX_DIMS as u8 {
            variants.push(Variant::Strided { dims });
        }
        let mut out = Vec::new();
        for op in ElementwiseOp::all() {
            let outs: &[Storage] = if op == ElementwiseOp::Unary(UnaryOp::Copy) {
                &Storage::ALL
            } else {
                std::slice::from_ref(&dtype)
            };
            for &o in outs {
                for &variant in &variants {
                    out.push(ElementwiseKernel {
                        op,
                        dtype,
                        out: o,
                        binding,
                        variant,
                    });
                }
            }
        }
        out
    }

    /// A name that identifies the kernel (used in profiles and dumps): `ew_<op>_<dtype>`,
    /// then `_to_<out>` for casts, `_v<n>` for 2 or 4 vec4s, `_exact`, or `_s<dims>`.
    pub fn name(&self) -> String {
        let mut name = self.op_name();
        if self.out != self.dtype {
            name.push_str("_to_");
            name.push_str(self.out.name());
        }
        match self.variant {
            Variant::Vec4 { vecs, exact } => {
                if vecs != 1 {
                    name.push_str(&format!("_v{vecs}"));
                }
                if exact {
                    name.push_str("_exact");
                }
            }
            Variant::Strided { dims } => name.push_str(&format!("_s{dims}")),
        }
        name
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

    /// Whether the exact variant with `vecs` vec4s per invocation covers `n` elements: a
    /// whole number of tiles, on a grid without spare workgroups.
    pub fn exact_fits(vecs: u8, n: u64, geometry: Geometry) -> bool {
        let tile = 4 * u64::from(vecs) * u64::from(geometry.workgroup);
        if n == 0 || n % tile != 0 {
            return false;
        }
        let groups = n / tile;
        match grid(groups, geometry.max_groups_x) {
            Ok([x, y, _]) => u64::from(x) * u64::from(y) == groups,
            Err(_) => false,
        }
    }

    /// Emits the kernel. Push constants: input address(es), output address, `n`, for the
    /// scalar form the scalar `s`, and for the strided variant the shape, then each input's
    /// strides and offset.
    pub fn build(&self) -> KernelModule {
        let mut k = KernelBuilder::new(self.name(), self.binding, [ELEMENTWISE_WORKGROUP, 1, 1]);
        let io = Io::declare(&mut k, self);
        let strided = match self.variant {
            Variant::Strided { dims } => Some(crate::elementwise_strided::declare(
                &mut k,
                usize::from(dims),
                self.inputs(),
            )),
            Variant::Vec4 { .. } => None,
        };
        k.begin();
        let io = io.begin(&mut k);

        // Linear workgroup index over the (possibly 2-D) grid.
        let wid = k.workgroup_id();
        let nwg = k.num_workgroups();
        let (gx, gy, nx) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(nwg, 0));
        let row = k.mul(gy, nx);
        let group = k.add(row, gx);
        match (self.variant, strided) {
            (Variant::Vec4 { vecs, exact }, _) => vec4_body(&mut k, &io, group, vecs, exact),
            (Variant::Strided { .. }, Some(params)) => strided_body(&mut k, &io, group, &params),
            (Variant::Strided { .. }, None) => unreachable!("strided params declared above"),
        }
        k.finish()
    }

    /// Grid and push constants for `n` elements at `addrs`; `scalar` is required by the
    /// scalar form, `strides` by the strided variant.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        n: u64,
        addrs: ElementwiseAddresses,
        scalar: Option<f32>,
        strides: Option<&Strides>,
    ) -> Result<Launch, KernelError> {
        let ElementwiseAddresses { inputs, output } = addrs;
        let bad = |detail: String| KernelError::Arguments {
            kernel: self.name(),
            detail,
        };
        let n32 = u32::try_from(n).map_err(|_| KernelError::TooLarge {
            what: "element count",
            size: n,
        })?;
        if inputs.len() != self.inputs() {
            return Err(bad(format!(
                "expects {} inputs, got {}",
                self.inputs(),
                inputs.len()
            )));
        }
        // Descriptor-bound kernels get their buffers from the dispatch's bindings instead.
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.extend(inputs.iter().map(|&a| Arg::Address(a)));
            args.push(Arg::Address(output));
        }
        args.push(Arg::U32(n32));
        match (self.op, scalar) {
            (ElementwiseOp::Scalar { .. }, Some(s)) => args.push(Arg::F32(s)),
            (ElementwiseOp::Scalar { .. }, None) => return Err(bad("needs a scalar".into())),
            _ => {}
        }
        let groups = match (self.variant, strides) {
            (Variant::Vec4 { vecs, exact }, None) => {
                if exact && !Self::exact_fits(vecs, n, geometry) {
                    return Err(bad(format!("exact variant launched on {n} elements")));
                }
                // One invocation per vec4 of each strip; at least one workgroup when there is
                // a tail.
                let tile = u64::from(geometry.workgroup) * u64::from(vecs);
                (n / 4).div_ceil(tile).max(u64::from(n > 0))
            }
            (Variant::Strided { dims }, Some(st)) => {
                crate::elementwise_strided::push_args(usize::from(dims), n, st, &mut args)
                    .map_err(bad)?;
                n.div_ceil(u64::from(geometry.workgroup))
            }
            (Variant::Vec4 { .. }, Some(_)) => return Err(bad("takes no strides".into())),
            (Variant::Strided { .. }, None) => return Err(bad("needs strides".into())),
        };
        let groups = grid(groups, geometry.max_groups_x)?;
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }
}

/// The device addresses one element-wise launch reads and writes, named so that the inputs
/// and the output cannot be swapped at a call site.
#[derive(Clone, Copy, Debug)]
pub struct ElementwiseAddresses<'a> {
    pub inputs: &'a [u64],
    pub output: u64,
}

/// The buffers and scalar of one element-wise kernel and the code that reads, computes and
/// writes one element (or vec4), shared by every variant.
struct Io<S> {
    a: Buffer,
    b: Option<Buffer>,
    y: Buffer,
    n: helios_spirv::Param,
    s: S,
    op: ElementwiseOp,
    dtype: Storage,
    out: Storage,
}

impl Io<Option<helios_spirv::Param>> {
    fn declare(k: &mut KernelBuilder, kernel: &ElementwiseKernel) -> Self {
        let elem = buffer_scalar(kernel.dtype);
        let a = k.buffer("a", elem, Access::Read);
        let b = match kernel.op {
            ElementwiseOp::Binary(_) => Some(k.buffer("b", elem, Access::Read)),
            _ => None,
        };
        let y = k.buffer("y", buffer_scalar(kernel.out), Access::Write);
        let n = k.param("n", Ty::scalar(Scalar::U32));
        let s = match kernel.op {
            ElementwiseOp::Scalar { .. } => Some(k.param("s", Ty::scalar(Scalar::F32))),
            _ => None,
        };
        Io {
            a,
            b,
            y,
            n,
            s,
            op: kernel.op,
            dtype: kernel.dtype,
            out: kernel.out,
        }
    }

    /// Loads the scalar parameter (after `begin`).
    fn begin(self, k: &mut KernelBuilder) -> Io<Option<Val>> {
        let s = self.s.map(|p| k.load_param(p));
        Io {
            a: self.a,
            b: self.b,
            y: self.y,
            n: self.n,
            s,
            op: self.op,
            dtype: self.dtype,
            out: self.out,
        }
    }
}

impl Io<Option<Val>> {
    fn n(&self, k: &mut KernelBuilder) -> Val {
        k.load_param(self.n)
    }

    /// The inputs at element (vector) index `ia` of `a` and `ib` of `b`, widened to f32.
    fn load(&self, k: &mut KernelBuilder, ia: Val, ib: Val, lanes: u8) -> [Option<Val>; 2] {
        let x = load_f32(k, self.a, ia, lanes, self.dtype);
        let bv = self.b.map(|b| load_f32(k, b, ib, lanes, self.dtype));
        [Some(x), bv]
    }

    fn compute(&self, k: &mut KernelBuilder, inputs: [Option<Val>; 2]) -> Val {
        let x = inputs[0].expect("input a loaded");
        match self.op {
            ElementwiseOp::Unary(u) => unary_expr(k, u, x),
            ElementwiseOp::Binary(bop) => binary_expr(k, bop, x, inputs[1].expect("binary has b")),
            ElementwiseOp::Scalar { op, scalar_first } => {
                let sv = k.splat(self.s.expect("scalar form has s"), x.ty.lanes);
                if scalar_first {
                    binary_expr(k, op, sv, x)
                } else {
                    binary_expr(k, op, x, sv)
                }
            }
        }
    }

    fn store(&self, k: &mut KernelBuilder, idx: Val, r: Val) {
        store_f32(k, self.y, idx, r, self.out);
    }
}

/// The strided variant: one element per invocation, output element `i`, inputs at their
/// strided offsets (`elementwise_strided::offsets`).
fn strided_body(
    k: &mut KernelBuilder,
    io: &Io<Option<Val>>,
    group: Val,
    p: &crate::elementwise_strided::StridedParams,
) {
    let wsize = k.workgroup_size_x();
    let lid = k.local_index();
    let base = k.mul(group, wsize);
    let i = k.add(base, lid);
    let n = io.n(k);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let offsets = crate::elementwise_strided::offsets(k, i, p);
        let ib = offsets.get(1).copied().unwrap_or(offsets[0]);
        let x = io.load(k, offsets[0], ib, 1);
        let r = io.compute(k, x);
        io.store(k, i, r);
    });
}

/// The contiguous variants. Each workgroup covers `vecs` consecutive strips of `wsize` vec4s;
/// invocation `lid` takes element `lid` of each strip, so every strip's accesses are
/// coalesced.
fn vec4_body(k: &mut KernelBuilder, io: &Io<Option<Val>>, group: Val, vecs: u8, exact: bool) {
    let wsize = k.workgroup_size_x();
    let lid = k.local_index();
    let n = io.n(k);
    let two = k.u32(2);
    let full = k.shr(n, two); // whole vec4s
    let vecs = u32::from(vecs);
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
    // The whole tile is in range: all loads first (bytes in flight), then math, then stores.
    let whole_tile = |k: &mut KernelBuilder| {
        let idx: Vec<Val> = (0..vecs).map(|j| index(k, j)).collect();
        let inputs: Vec<[Option<Val>; 2]> = idx.iter().map(|&i| io.load(k, i, i, 4)).collect();
        let outs: Vec<Val> = inputs.into_iter().map(|x| io.compute(k, x)).collect();
        for (i, r) in idx.into_iter().zip(outs) {
            io.store(k, i, r);
        }
    };
    if exact {
        // `exact_fits` guarantees every invocation of the grid has a whole tile.
        whole_tile(k);
        return;
    }
    let last = index(k, vecs - 1);
    let whole = k.lt(last, full);
    k.if_else(whole, whole_tile, |k| {
        for j in 0..vecs {
            let i = index(k, j);
            let inside = k.lt(i, full);
            k.if_(inside, |k| {
                let x = io.load(k, i, i, 4);
                let r = io.compute(k, x);
                io.store(k, i, r);
            });
        }
    });
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
                let x = io.load(k, e, e, 1);
                let r = io.compute(k, x);
                io.store(k, e, r);
            });
        }
    });
}
