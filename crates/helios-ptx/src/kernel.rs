//! The kernel builder: parameters, registers, arithmetic and control flow.
//!
//! A [`Kernel`] collects instructions as text while handing out typed registers; `finish`
//! declares what was used and returns the module. Instructions a target lacks are not
//! emitted: they are recorded and `finish` returns [`BuildError::Unsupported`], so a
//! generator cannot produce a module its device would reject.

use std::fmt::Write as _;

use crate::types::{Class, Op, Reg, Target, Ty};

/// Why a kernel could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("kernel `{kernel}` uses `{instruction}`, which {target} does not have")]
    Unsupported {
        kernel: String,
        instruction: &'static str,
        target: String,
    },
    #[error("kernel `{kernel}`: {detail}")]
    Invalid { kernel: String, detail: String },
}

/// A kernel parameter, read with [`Kernel::ld_param`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    index: usize,
    ty: Ty,
}

/// A branch target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(u32);

/// A statically allocated shared-memory array; its address is a 32-bit shared address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedArray {
    index: usize,
}

/// Comparison operators of `setp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Cmp {
    const fn name(self) -> &'static str {
        match self {
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
            Cmp::Lt => "lt",
            Cmp::Le => "le",
            Cmp::Gt => "gt",
            Cmp::Ge => "ge",
        }
    }
}

/// Special registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    TidX,
    TidY,
    CtaIdX,
    CtaIdY,
    CtaIdZ,
    NCtaIdX,
    NCtaIdY,
    NTidX,
    LaneId,
    WarpId,
    SmId,
    Clock64,
}

impl Special {
    const fn name(self) -> &'static str {
        match self {
            Special::TidX => "%tid.x",
            Special::TidY => "%tid.y",
            Special::CtaIdX => "%ctaid.x",
            Special::CtaIdY => "%ctaid.y",
            Special::CtaIdZ => "%ctaid.z",
            Special::NCtaIdX => "%nctaid.x",
            Special::NCtaIdY => "%nctaid.y",
            Special::NTidX => "%ntid.x",
            Special::LaneId => "%laneid",
            Special::WarpId => "%warpid",
            Special::SmId => "%smid",
            Special::Clock64 => "%clock64",
        }
    }
}

/// One kernel (one `.entry`) under construction.
pub struct Kernel {
    pub(crate) name: String,
    pub(crate) target: Target,
    params: Vec<(String, Ty)>,
    counts: [u32; 6],
    pub(crate) body: String,
    labels: u32,
    shared: Vec<(String, u32, u32)>,
    threads: Option<u32>,
    max_regs: Option<u32>,
    min_blocks: Option<u32>,
    pub(crate) error: Option<BuildError>,
}

impl Kernel {
    /// An empty kernel named `name` (a PTX identifier) for `target`.
    pub fn new(name: &str, target: Target) -> Kernel {
        let mut k = Kernel {
            name: name.to_owned(),
            target,
            params: Vec::new(),
            counts: [0; 6],
            body: String::new(),
            labels: 0,
            shared: Vec::new(),
            threads: None,
            max_regs: None,
            min_blocks: None,
            error: None,
        };
        let valid = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && name.chars().next().is_some_and(|c| !c.is_ascii_digit());
        if !valid {
            k.fail(format!("`{name}` is not a PTX identifier"));
        }
        k
    }

    pub fn target(&self) -> Target {
        self.target
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Records the first error; `finish` returns it.
    pub(crate) fn fail(&mut self, detail: String) {
        if self.error.is_none() {
            self.error = Some(BuildError::Invalid {
                kernel: self.name.clone(),
                detail,
            });
        }
    }

    /// Whether the target has an instruction; records the error when it does not.
    pub(crate) fn require(&mut self, has: bool, instruction: &'static str) -> bool {
        if !has && self.error.is_none() {
            self.error = Some(BuildError::Unsupported {
                kernel: self.name.clone(),
                instruction,
                target: self.target.name(),
            });
        }
        has
    }

    /// Appends one instruction line.
    pub(crate) fn emit(&mut self, args: std::fmt::Arguments<'_>) {
        self.body.push_str("    ");
        self.body.write_fmt(args).expect("writing to a String");
        self.body.push_str(";\n");
    }

    /// A comment line in the emitted text (a name for a phase of the kernel).
    pub fn comment(&mut self, text: &str) {
        for line in text.lines() {
            let _ = writeln!(self.body, "    // {line}");
        }
    }

    // ---- declarations ----------------------------------------------------------------

    /// Exactly `n` threads per block (`.reqntid`): lets the compiler budget registers.
    pub fn threads(&mut self, n: u32) {
        self.threads = Some(n);
    }

    /// At most `n` registers per thread (`.maxnreg`); needed for `setmaxnreg` to apply.
    pub fn max_registers(&mut self, n: u32) {
        self.max_regs = Some(n);
    }

    /// At least `n` blocks resident per SM (`.minnctapersm`).
    pub fn min_blocks(&mut self, n: u32) {
        self.min_blocks = Some(n);
    }

    /// A by-value kernel parameter. Host code passes parameters in declaration order.
    pub fn param(&mut self, name: &str, ty: Ty) -> Param {
        self.params.push((name.to_owned(), ty));
        Param {
            index: self.params.len() - 1,
            ty,
        }
    }

    /// A shared array of `bytes` bytes aligned to `align`.
    pub fn shared(&mut self, name: &str, align: u32, bytes: u32) -> SharedArray {
        self.shared.push((name.to_owned(), align, bytes));
        SharedArray {
            index: self.shared.len() - 1,
        }
    }

    /// Bytes of static shared memory declared so far.
    pub fn shared_bytes(&self) -> u32 {
        self.shared.iter().map(|s| s.2.next_multiple_of(s.1)).sum()
    }

    /// A fresh register.
    pub fn reg(&mut self, ty: Ty) -> Reg {
        let c = &mut self.counts[ty.class().index()];
        *c += 1;
        Reg { ty, n: *c - 1 }
    }

    /// `n` fresh registers.
    pub fn regs(&mut self, ty: Ty, n: usize) -> Vec<Reg> {
        (0..n).map(|_| self.reg(ty)).collect()
    }

    /// A new label, placed later with [`Kernel::place`].
    pub fn label(&mut self) -> Label {
        self.labels += 1;
        Label(self.labels - 1)
    }

    /// Places `label` here.
    pub fn place(&mut self, label: Label) {
        let _ = writeln!(self.body, "$L{}:", label.0);
    }

    // ---- values ----------------------------------------------------------------------

    pub fn ld_param(&mut self, p: Param) -> Reg {
        let r = self.reg(p.ty);
        let name = self.params[p.index].0.clone();
        self.emit(format_args!("ld.param{} {r}, [{name}]", p.ty.suffix()));
        r
    }

    /// A global pointer parameter, converted to a global address.
    pub fn ld_param_global(&mut self, p: Param) -> Reg {
        let r = self.ld_param(p);
        let g = self.reg(Ty::U64);
        self.emit(format_args!("cvta.to.global.u64 {g}, {r}"));
        g
    }

    pub fn special(&mut self, s: Special) -> Reg {
        let ty = if s == Special::Clock64 {
            Ty::U64
        } else {
            Ty::U32
        };
        let r = self.reg(ty);
        self.emit(format_args!("mov{} {r}, {}", ty.suffix(), s.name()));
        r
    }

    /// The 32-bit shared-memory address of `array`.
    pub fn shared_address(&mut self, array: SharedArray) -> Reg {
        let r = self.reg(Ty::U32);
        let name = self.shared[array.index].0.clone();
        self.emit(format_args!("mov.u32 {r}, {name}"));
        r
    }

    pub fn mov(&mut self, ty: Ty, v: impl Into<Op>) -> Reg {
        let r = self.reg(ty);
        let v = v.into();
        self.emit(format_args!("mov{} {r}, {v}", mov_ty(ty).suffix()));
        r
    }

    /// Overwrites `dst` (loop state, accumulators).
    pub fn assign(&mut self, dst: Reg, v: impl Into<Op>) {
        let v = v.into();
        self.emit(format_args!("mov{} {dst}, {v}", mov_ty(dst.ty).suffix()));
    }

    pub(crate) fn binary(&mut self, op: &str, ty: Ty, a: Op, b: Op) -> Reg {
        let r = self.reg(ty);
        self.emit(format_args!("{op}{} {r}, {a}, {b}", ty.suffix()));
        r
    }

    /// `dst = a <op> b` into an existing register.
    pub fn update(&mut self, op: &str, dst: Reg, a: impl Into<Op>, b: impl Into<Op>) {
        let (a, b) = (a.into(), b.into());
        self.emit(format_args!("{op}{} {dst}, {a}, {b}", dst.ty.suffix()));
    }

    pub fn add(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        self.binary("add", a.ty, a.into(), b.into())
    }

    pub fn sub(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        self.binary("sub", a.ty, a.into(), b.into())
    }

    /// Low half of the product (integers); the product (floats).
    pub fn mul(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        let op = if a.ty.is_float() { "mul" } else { "mul.lo" };
        self.binary(op, a.ty, a.into(), b.into())
    }

    /// The full 64-bit product of two 32-bit integers.
    pub fn mul_wide(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        let ty = if a.ty == Ty::S32 { Ty::S64 } else { Ty::U64 };
        let r = self.reg(ty);
        let b = b.into();
        self.emit(format_args!("mul.wide{} {r}, {a}, {b}", a.ty.suffix()));
        r
    }

    /// `a · b + c` (low half for integers).
    pub fn mad(&mut self, a: Reg, b: impl Into<Op>, c: impl Into<Op>) -> Reg {
        let r = self.reg(a.ty);
        let (b, c) = (b.into(), c.into());
        let op = if a.ty.is_float() { "fma.rn" } else { "mad.lo" };
        self.emit(format_args!("{op}{} {r}, {a}, {b}, {c}", a.ty.suffix()));
        r
    }

    /// `a · b + c` with a 64-bit result from 32-bit `a`, `b`.
    pub fn mad_wide(&mut self, a: Reg, b: impl Into<Op>, c: Reg) -> Reg {
        let ty = if a.ty == Ty::S32 { Ty::S64 } else { Ty::U64 };
        let r = self.reg(ty);
        let b = b.into();
        self.emit(format_args!("mad.wide{} {r}, {a}, {b}, {c}", a.ty.suffix()));
        r
    }

    pub fn min(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        self.binary("min", a.ty, a.into(), b.into())
    }

    pub fn max(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        self.binary("max", a.ty, a.into(), b.into())
    }

    pub fn and(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        self.binary("and", bits(a.ty), a.into(), b.into())
    }

    pub fn or(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        self.binary("or", bits(a.ty), a.into(), b.into())
    }

    pub fn xor(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        self.binary("xor", bits(a.ty), a.into(), b.into())
    }

    pub fn shl(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        let r = self.reg(a.ty);
        let b = b.into();
        self.emit(format_args!("shl{} {r}, {a}, {b}", bits(a.ty).suffix()));
        r
    }

    /// Logical right shift for unsigned and bit types, arithmetic for signed ones.
    pub fn shr(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        self.binary("shr", a.ty, a.into(), b.into())
    }

    /// Float `a · b + c`, rounded once.
    pub fn fma(&mut self, a: Reg, b: impl Into<Op>, c: impl Into<Op>) -> Reg {
        self.mad(a, b, c)
    }

    pub fn neg(&mut self, a: Reg) -> Reg {
        let r = self.reg(a.ty);
        self.emit(format_args!("neg{} {r}, {a}", a.ty.suffix()));
        r
    }

    pub fn abs(&mut self, a: Reg) -> Reg {
        let r = self.reg(a.ty);
        self.emit(format_args!("abs{} {r}, {a}", a.ty.suffix()));
        r
    }

    /// The larger of `a` and `b`, NaN if either is (sm_80+).
    pub fn max_nan(&mut self, a: Reg, b: impl Into<Op>) -> Reg {
        self.require(self.target.has_cp_async(), "max.NaN");
        self.binary("max.NaN", a.ty, a.into(), b.into())
    }

    /// `1 / a`, rounded to nearest.
    pub fn rcp_exact(&mut self, a: Reg) -> Reg {
        let r = self.reg(a.ty);
        self.emit(format_args!("rcp.rn{} {r}, {a}", a.ty.suffix()));
        r
    }

    /// A 32-bit register's bits as an f32 (and back): the classes differ, the bits do not.
    pub fn bits_to_f32(&mut self, a: Reg) -> Reg {
        let r = self.reg(Ty::F32);
        self.emit(format_args!("mov.b32 {r}, {}", a.retype(Ty::B32)));
        r
    }

    pub fn f32_to_bits(&mut self, a: Reg) -> Reg {
        let r = self.reg(Ty::B32);
        self.emit(format_args!("mov.b32 {r}, {a}"));
        r
    }

    /// `2^a`, approximate (the SFU's `ex2`).
    pub fn ex2(&mut self, a: Reg) -> Reg {
        let r = self.reg(a.ty);
        self.emit(format_args!("ex2.approx.ftz{} {r}, {a}", a.ty.suffix()));
        r
    }

    /// `log2(a)`, approximate (the SFU's `lg2`).
    pub fn lg2(&mut self, a: Reg) -> Reg {
        let r = self.reg(a.ty);
        self.emit(format_args!("lg2.approx.ftz{} {r}, {a}", a.ty.suffix()));
        r
    }

    /// `1 / a`, approximate.
    pub fn rcp(&mut self, a: Reg) -> Reg {
        let r = self.reg(a.ty);
        self.emit(format_args!("rcp.approx.ftz{} {r}, {a}", a.ty.suffix()));
        r
    }

    /// Hardware `tanh` (sm_75+, about 2^-11 relative error).
    pub fn tanh(&mut self, a: Reg) -> Reg {
        let r = self.reg(a.ty);
        self.emit(format_args!("tanh.approx{} {r}, {a}", a.ty.suffix()));
        r
    }

    pub fn setp(&mut self, cmp: Cmp, a: Reg, b: impl Into<Op>) -> Reg {
        let p = self.reg(Ty::Pred);
        let b = b.into();
        self.emit(format_args!(
            "setp.{}{} {p}, {a}, {b}",
            cmp.name(),
            a.ty.suffix()
        ));
        p
    }

    /// `p ? a : b`.
    pub fn selp(&mut self, p: Reg, a: impl Into<Op>, b: impl Into<Op>, ty: Ty) -> Reg {
        let r = self.reg(ty);
        let (a, b) = (a.into(), b.into());
        self.emit(format_args!(
            "selp{} {r}, {a}, {b}, {p}",
            mov_ty(ty).suffix()
        ));
        r
    }

    pub fn and_pred(&mut self, a: Reg, b: Reg) -> Reg {
        let r = self.reg(Ty::Pred);
        self.emit(format_args!("and.pred {r}, {a}, {b}"));
        r
    }

    pub fn or_pred(&mut self, a: Reg, b: Reg) -> Reg {
        let r = self.reg(Ty::Pred);
        self.emit(format_args!("or.pred {r}, {a}, {b}"));
        r
    }

    pub fn not_pred(&mut self, a: Reg) -> Reg {
        let r = self.reg(Ty::Pred);
        self.emit(format_args!("not.pred {r}, {a}"));
        r
    }

    /// Conversion to `to`, rounding to nearest even where the value changes.
    pub fn cvt(&mut self, to: Ty, a: Reg) -> Reg {
        let r = self.reg(to);
        let from = a.ty;
        let rnd = if to.is_float() && (!from.is_float() || to.bytes() < from.bytes()) {
            ".rn"
        } else if !to.is_float() && from.is_float() {
            ".rzi"
        } else {
            ""
        };
        self.emit(format_args!(
            "cvt{rnd}{}{} {r}, {a}",
            to.suffix(),
            from.suffix()
        ));
        r
    }

    /// Two f32 rounded to nearest even into one register of two halves (`hi` in the upper
    /// 16 bits): `cvt.rn.bf16x2.f32`, one instruction (sm_80+), or its f16 form.
    pub fn cvt_pack(&mut self, to: Ty, hi: Reg, lo: Reg) -> Reg {
        let ok = self.target.has_cp_async();
        self.require(ok, "cvt.rn.bf16x2.f32");
        let r = self.reg(to);
        self.emit(format_args!("cvt.rn{}.f32 {r}, {hi}, {lo}", to.suffix()));
        r
    }

    /// Two 16-bit values into one 32-bit register (`lo` in the lower half).
    pub fn pack_halves(&mut self, lo: Reg, hi: Reg) -> Reg {
        let r = self.reg(Ty::B32);
        self.emit(format_args!("mov.b32 {r}, {{{lo}, {hi}}}"));
        r
    }

    /// The two 16-bit halves of a 32-bit register, as `(lo, hi)` of type `half`.
    pub fn unpack_halves(&mut self, v: Reg, half: Ty) -> (Reg, Reg) {
        let (lo, hi) = (self.reg(half), self.reg(half));
        self.emit(format_args!(
            "mov.b32 {{{lo}, {hi}}}, {}",
            v.retype(Ty::B32)
        ));
        (lo, hi)
    }

    /// An f32 from a 16-bit float (exact).
    pub fn widen(&mut self, a: Reg) -> Reg {
        let r = self.reg(Ty::F32);
        self.emit(format_args!("cvt.f32{} {r}, {a}", a.ty.suffix()));
        r
    }

    /// Warp shuffle: `mode` is `idx`, `up`, `down` or `bfly`; every lane takes part.
    pub fn shfl(&mut self, mode: &str, v: Reg, lane: impl Into<Op>, clamp: u32) -> Reg {
        let r = self.reg(v.ty);
        let lane = lane.into();
        // `.b32` takes any 32-bit register, floats included.
        self.emit(format_args!(
            "shfl.sync.{mode}.b32 {r}, {v}, {lane}, {clamp}, 0xffffffff"
        ));
        r
    }

    /// Whether `p` holds in any lane of the warp; every lane takes part.
    pub fn vote_any(&mut self, p: Reg) -> Reg {
        let r = self.reg(Ty::Pred);
        self.emit(format_args!("vote.sync.any.pred {r}, {p}, 0xffffffff"));
        r
    }

    // ---- control ---------------------------------------------------------------------

    pub fn bra(&mut self, to: Label) {
        self.emit(format_args!("bra.uni $L{}", to.0));
    }

    /// Branches to `to` where `p` holds (or fails, with `negate`).
    pub fn bra_if(&mut self, p: Reg, negate: bool, to: Label) {
        let bang = if negate { "!" } else { "" };
        self.emit(format_args!("@{bang}{p} bra $L{}", to.0));
    }

    /// Runs `body` only where `p` holds.
    pub fn if_(&mut self, p: Reg, body: impl FnOnce(&mut Kernel)) {
        let skip = self.label();
        self.bra_if(p, true, skip);
        body(self);
        self.place(skip);
    }

    /// `for i in (start..end).step_by(step)` over a u32 register (`end` a register or an
    /// immediate); the body gets `i`. The loop runs at least zero times.
    pub fn for_range(
        &mut self,
        start: impl Into<Op>,
        end: impl Into<Op>,
        step: u32,
        body: impl FnOnce(&mut Kernel, Reg),
    ) {
        let end = end.into();
        let i = self.mov(Ty::U32, start);
        let (top, done) = (self.label(), self.label());
        self.place(top);
        let stop = self.setp(Cmp::Ge, i, end);
        self.bra_if(stop, false, done);
        body(self, i);
        self.update("add", i, i, step);
        self.bra(top);
        self.place(done);
    }

    /// Block-wide barrier `id` (all threads of the block).
    pub fn bar_sync(&mut self, id: u32) {
        self.emit(format_args!("bar.sync {id}"));
    }

    /// Named barrier `id` for `threads` threads (a multiple of 32).
    pub fn bar_sync_n(&mut self, id: u32, threads: u32) {
        self.emit(format_args!("bar.sync {id}, {threads}"));
    }

    /// Arrives at named barrier `id` for `threads` threads without waiting.
    pub fn bar_arrive_n(&mut self, id: u32, threads: u32) {
        self.emit(format_args!("bar.arrive {id}, {threads}"));
    }

    /// Waits at named barrier `id` (a register: 0–15) until `threads` threads have arrived.
    pub fn bar_sync_reg(&mut self, id: Reg, threads: u32) {
        self.emit(format_args!("bar.sync {id}, {threads}"));
    }

    /// Arrives at named barrier `id` without waiting (a producer's signal).
    pub fn bar_arrive_reg(&mut self, id: Reg, threads: u32) {
        self.emit(format_args!("bar.arrive {id}, {threads}"));
    }

    pub fn ret(&mut self) {
        self.emit(format_args!("ret"));
    }

    // ---- output ----------------------------------------------------------------------

    /// The kernel as a `.entry` (without the module header).
    pub(crate) fn entry_text(&self) -> String {
        let mut s = String::new();
        let _ = write!(s, ".visible .entry {}(", self.name);
        for (i, (name, ty)) in self.params.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(s, "{sep}\n    .param {} {name}", param_ty(*ty).suffix());
        }
        s.push_str("\n)\n");
        if let Some(n) = self.threads {
            let _ = writeln!(s, ".reqntid {n}");
        }
        if let Some(n) = self.max_regs {
            let _ = writeln!(s, ".maxnreg {n}");
        }
        if let Some(n) = self.min_blocks {
            let _ = writeln!(s, ".minnctapersm {n}");
        }
        s.push_str("{\n");
        for c in Class::ALL {
            let n = self.counts[c.index()];
            if n > 0 {
                let _ = writeln!(s, "    .reg {} %{}<{n}>;", c.decl(), c.prefix());
            }
        }
        for (name, align, bytes) in &self.shared {
            let _ = writeln!(s, "    .shared .align {align} .b8 {name}[{bytes}];");
        }
        s.push_str(&self.body);
        s.push_str("    ret;\n}\n");
        s
    }

    /// The module: header and this one entry.
    pub fn finish(self) -> Result<crate::Module, BuildError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let text = format!(
            "//\n// Generated by helios-ptx\n//\n.version {}\n.target {}\n.address_size 64\n\n{}",
            self.target.isa(),
            self.target.name(),
            self.entry_text()
        );
        Ok(crate::Module {
            name: self.name,
            target: self.target,
            text,
            params: self.params.iter().map(|p| p.1).collect(),
            shared_bytes: self.shared.iter().map(|s| s.2.next_multiple_of(s.1)).sum(),
            threads: self.threads,
        })
    }
}

/// The bit type of a value's width, for the logical instructions.
pub(crate) const fn bits(ty: Ty) -> Ty {
    match ty.bytes() {
        2 => Ty::B16,
        8 => Ty::B64,
        _ => Ty::B32,
    }
}

/// `mov` has no packed or bf16 forms: they move as bits.
const fn mov_ty(ty: Ty) -> Ty {
    match ty {
        Ty::F16x2 | Ty::BF16x2 => Ty::B32,
        Ty::BF16 | Ty::F16 => Ty::B16,
        t => t,
    }
}

/// Parameters are declared as plain integer or float types.
const fn param_ty(ty: Ty) -> Ty {
    match ty {
        Ty::F16x2 | Ty::BF16x2 => Ty::B32,
        Ty::BF16 | Ty::F16 => Ty::B16,
        t => t,
    }
}
