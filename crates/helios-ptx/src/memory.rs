//! Loads, stores and asynchronous copies: global and shared memory, Ampere's `cp.async`,
//! Hopper's bulk copies with `mbarrier` completion, `ldmatrix` / `stmatrix`.

use crate::kernel::{Cmp, Kernel};
use crate::types::{Reg, Ty};

/// A state space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    Global,
    Shared,
}

impl Space {
    const fn name(self) -> &'static str {
        match self {
            Space::Global => ".global",
            Space::Shared => ".shared",
        }
    }
}

/// An address: a register (u64 global, u32 shared) plus a constant byte offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr {
    pub base: Reg,
    pub offset: i64,
}

impl Addr {
    pub fn new(base: Reg) -> Addr {
        Addr { base, offset: 0 }
    }

    pub fn at(base: Reg, offset: i64) -> Addr {
        Addr { base, offset }
    }

    /// The same address `bytes` further on.
    pub fn plus(self, bytes: i64) -> Addr {
        Addr {
            offset: self.offset + bytes,
            ..self
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.offset {
            0 => write!(f, "[{}]", self.base),
            o if o > 0 => write!(f, "[{}+{o}]", self.base),
            o => write!(f, "[{}{o}]", self.base),
        }
    }
}

/// Memory form of a register type: loads and stores move bits of the right width.
const fn mem_ty(ty: Ty) -> Ty {
    match ty {
        Ty::F16x2 | Ty::BF16x2 => Ty::B32,
        Ty::F16 | Ty::BF16 => Ty::B16,
        t => t,
    }
}

/// `{%r1, %r2, ...}`: a register vector operand.
pub(crate) fn vector_of(regs: &[Reg]) -> String {
    let names: Vec<String> = regs.iter().map(|r| r.to_string()).collect();
    format!("{{{}}}", names.join(", "))
}

impl Kernel {
    /// Loads one value of `ty`.
    pub fn ld(&mut self, space: Space, ty: Ty, at: Addr) -> Reg {
        let r = self.reg(ty);
        self.emit(format_args!(
            "ld{}{} {r}, {at}",
            space.name(),
            mem_ty(ty).suffix()
        ));
        r
    }

    /// Loads a vector of 2 or 4 values of `ty` (the address aligned to the vector's size).
    pub fn ld_v(&mut self, space: Space, ty: Ty, n: usize, at: Addr) -> Vec<Reg> {
        let regs = self.regs(ty, n);
        self.ld_v_into(space, &regs, at);
        regs
    }

    /// A vector load into existing registers where `p` holds; elsewhere they keep their values.
    pub fn ld_v_if(&mut self, p: Reg, space: Space, regs: &[Reg], at: Addr) {
        if !matches!(regs.len(), 2 | 4) {
            self.fail(format!("a vector load of {} values", regs.len()));
            return;
        }
        let ty = mem_ty(regs[0].ty());
        self.emit(format_args!(
            "@{p} ld{}.v{}{} {}, {at}",
            space.name(),
            regs.len(),
            ty.suffix(),
            vector_of(regs)
        ));
    }

    /// Loads into existing registers (2 or 4 of one type).
    pub fn ld_v_into(&mut self, space: Space, regs: &[Reg], at: Addr) {
        if !matches!(regs.len(), 2 | 4) {
            self.fail(format!("a vector load of {} values", regs.len()));
            return;
        }
        let ty = mem_ty(regs[0].ty());
        self.emit(format_args!(
            "ld{}.v{}{} {}, {at}",
            space.name(),
            regs.len(),
            ty.suffix(),
            vector_of(regs)
        ));
    }

    /// A load predicated on `p`; where `p` fails the register keeps `fallback`.
    pub fn ld_if(
        &mut self,
        p: Reg,
        space: Space,
        ty: Ty,
        at: Addr,
        fallback: impl Into<crate::Op>,
    ) -> Reg {
        let r = self.mov(ty, fallback);
        self.emit(format_args!(
            "@{p} ld{}{} {r}, {at}",
            space.name(),
            mem_ty(ty).suffix()
        ));
        r
    }

    /// A load into an existing register where `p` holds (elsewhere it keeps its value);
    /// nothing waits for it until the register is read.
    pub fn ld_into_if(&mut self, p: Reg, space: Space, dst: Reg, at: Addr) {
        self.emit(format_args!(
            "@{p} ld{}{} {dst}, {at}",
            space.name(),
            mem_ty(dst.ty()).suffix()
        ));
    }

    pub fn st(&mut self, space: Space, at: Addr, v: Reg) {
        self.emit(format_args!(
            "st{}{} {at}, {v}",
            space.name(),
            mem_ty(v.ty()).suffix()
        ));
    }

    /// A store predicated on `p`.
    pub fn st_if(&mut self, p: Reg, space: Space, at: Addr, v: Reg) {
        self.emit(format_args!(
            "@{p} st{}{} {at}, {v}",
            space.name(),
            mem_ty(v.ty()).suffix()
        ));
    }

    /// Stores a vector of 2 or 4 registers of one type, optionally predicated.
    pub fn st_v(&mut self, space: Space, at: Addr, regs: &[Reg], p: Option<Reg>) {
        if !matches!(regs.len(), 2 | 4) {
            self.fail(format!("a vector store of {} values", regs.len()));
            return;
        }
        let guard = p.map(|p| format!("@{p} ")).unwrap_or_default();
        let ty = mem_ty(regs[0].ty());
        self.emit(format_args!(
            "{guard}st{}.v{}{} {at}, {}",
            space.name(),
            regs.len(),
            ty.suffix(),
            vector_of(regs)
        ));
    }

    // ---- Ampere asynchronous copies --------------------------------------------------

    /// `cp.async` of `bytes` (4, 8 or 16) from global `src` to shared `dst`. With
    /// `src_bytes`, only that many are read and the rest of the destination is zeroed: the
    /// bounds check of a tile edge costs no branch. 16-byte copies bypass L1 (`.cg`).
    pub fn cp_async(&mut self, dst: Addr, src: Addr, bytes: u32, src_bytes: Option<Reg>) {
        let ok = self.target.has_cp_async();
        if !self.require(ok, "cp.async") {
            return;
        }
        if !matches!(bytes, 4 | 8 | 16) {
            self.fail(format!("cp.async of {bytes} bytes (4, 8 or 16)"));
            return;
        }
        let cache = if bytes == 16 { "cg" } else { "ca" };
        match src_bytes {
            Some(n) => self.emit(format_args!(
                "cp.async.{cache}.shared.global {dst}, {src}, {bytes}, {n}"
            )),
            None => self.emit(format_args!(
                "cp.async.{cache}.shared.global {dst}, {src}, {bytes}"
            )),
        }
    }

    /// Closes the group of `cp.async` issued by this thread since the last commit.
    pub fn cp_async_commit(&mut self) {
        if self.require(self.target.has_cp_async(), "cp.async.commit_group") {
            self.emit(format_args!("cp.async.commit_group"));
        }
    }

    /// Waits until at most `pending` of this thread's committed groups are in flight.
    pub fn cp_async_wait(&mut self, pending: u32) {
        if self.require(self.target.has_cp_async(), "cp.async.wait_group") {
            self.emit(format_args!("cp.async.wait_group {pending}"));
        }
    }

    // ---- Hopper: mbarrier and bulk copies --------------------------------------------

    /// Initialises the 8-byte mbarrier at shared `bar` to expect `count` arrivals a phase.
    pub fn mbarrier_init(&mut self, bar: Addr, count: u32) {
        if self.require(self.target.has_bulk(), "mbarrier.init") {
            self.emit(format_args!("mbarrier.init.shared::cta.b64 {bar}, {count}"));
        }
    }

    /// Arrives on `bar` and announces `bytes` more of transactions (bulk copies) this phase.
    pub fn mbarrier_arrive_expect_tx(&mut self, bar: Addr, bytes: impl Into<crate::Op>) {
        if self.require(self.target.has_bulk(), "mbarrier.arrive.expect_tx") {
            let bytes = bytes.into();
            self.emit(format_args!(
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, {bar}, {bytes}"
            ));
        }
    }

    /// Arrives on `bar` (one of its expected arrivals).
    pub fn mbarrier_arrive(&mut self, bar: Addr) {
        if self.require(self.target.has_bulk(), "mbarrier.arrive") {
            self.emit(format_args!("mbarrier.arrive.shared::cta.b64 _, {bar}"));
        }
    }

    /// Makes `bar` track this thread's earlier `cp.async` copies: it counts one arrival
    /// when they land (`.noinc`: the arrival is one of those `mbarrier_init` expects).
    pub fn cp_async_mbarrier_arrive(&mut self, bar: Addr) {
        if self.require(self.target.has_bulk(), "cp.async.mbarrier.arrive") {
            self.emit(format_args!(
                "cp.async.mbarrier.arrive.noinc.shared::cta.b64 {bar}"
            ));
        }
    }

    /// Spins until the phase of `bar` with parity `parity` (0 or 1, a register or an
    /// immediate) has completed.
    pub fn mbarrier_wait(&mut self, bar: Addr, parity: impl Into<crate::Op>) {
        if !self.require(self.target.has_bulk(), "mbarrier.try_wait.parity") {
            return;
        }
        let parity = parity.into();
        let done = self.reg(Ty::Pred);
        let top = self.label();
        self.place(top);
        self.emit(format_args!(
            "mbarrier.try_wait.parity.shared::cta.b64 {done}, {bar}, {parity}"
        ));
        self.bra_if(done, true, top);
    }

    /// `cp.async.bulk` of `bytes` (a multiple of 16, both addresses 16-byte aligned) from
    /// global to shared, completing as transactions on `bar`.
    pub fn bulk_g2s(&mut self, dst: Addr, src: Addr, bytes: impl Into<crate::Op>, bar: Addr) {
        if self.require(self.target.has_bulk(), "cp.async.bulk") {
            let bytes = bytes.into();
            self.emit(format_args!(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes {dst}, {src}, {bytes}, {bar}"
            ));
        }
    }

    /// `cp.async.bulk` from shared to global, in this thread's bulk group.
    pub fn bulk_s2g(&mut self, dst: Addr, src: Addr, bytes: impl Into<crate::Op>) {
        if self.require(self.target.has_bulk(), "cp.async.bulk") {
            let bytes = bytes.into();
            self.emit(format_args!(
                "cp.async.bulk.global.shared::cta.bulk_group {dst}, {src}, {bytes}"
            ));
        }
    }

    pub fn bulk_commit(&mut self) {
        if self.require(self.target.has_bulk(), "cp.async.bulk.commit_group") {
            self.emit(format_args!("cp.async.bulk.commit_group"));
        }
    }

    /// Waits until at most `pending` bulk groups of this thread are in flight (reads done).
    pub fn bulk_wait(&mut self, pending: u32) {
        if self.require(self.target.has_bulk(), "cp.async.bulk.wait_group") {
            self.emit(format_args!("cp.async.bulk.wait_group.read {pending}"));
        }
    }

    /// Orders this thread's ordinary shared-memory accesses before later ones of the async
    /// proxy (`wgmma` operand reads, bulk copies): needed after plain or `cp.async` stores
    /// that `wgmma` reads next.
    pub fn fence_proxy_async(&mut self) {
        if self.require(self.target.has_bulk(), "fence.proxy.async") {
            self.emit(format_args!("fence.proxy.async.shared::cta"));
        }
    }

    // ---- blocks handing data to each other through global memory ----------------------

    /// `fence.acq_rel.gpu`: this thread's earlier memory accesses (and those ordered
    /// before them by a barrier) before its later ones, for every thread of the GPU.
    pub fn fence_gpu(&mut self) {
        self.emit(format_args!("fence.acq_rel.gpu"));
    }

    /// A u32 from global memory with acquire semantics at GPU scope (a flag another block
    /// releases).
    pub fn ld_acquire_gpu(&mut self, at: Addr) -> Reg {
        let r = self.reg(Ty::U32);
        self.emit(format_args!("ld.acquire.gpu.global.u32 {r}, {at}"));
        r
    }

    /// Adds `v` to a u32 in global memory (relaxed, GPU scope; `fence_gpu` first to
    /// release).
    pub fn red_add_gpu(&mut self, at: Addr, v: impl Into<crate::Op>) {
        let v = v.into();
        self.emit(format_args!("red.relaxed.gpu.global.add.u32 {at}, {v}"));
    }

    /// Stores a u32 to global memory (relaxed, GPU scope).
    pub fn st_relaxed_gpu(&mut self, at: Addr, v: impl Into<crate::Op>) {
        let v = v.into();
        self.emit(format_args!("st.relaxed.gpu.global.u32 {at}, {v}"));
    }

    /// A vector load of 2 or 4 values from global memory through L2 only (`.cg`): data
    /// another SM wrote, which this SM's L1 may hold an old copy of.
    pub fn ld_v_global_cg(&mut self, ty: Ty, n: usize, at: Addr) -> Vec<Reg> {
        let regs = self.regs(ty, n);
        if !matches!(n, 2 | 4) {
            self.fail(format!("a vector load of {n} values"));
            return regs;
        }
        self.emit(format_args!(
            "ld.global.cg.v{n}{} {}, {at}",
            mem_ty(ty).suffix(),
            vector_of(&regs)
        ));
        regs
    }

    // ---- matrix loads and stores -----------------------------------------------------

    /// `ldmatrix` of `count` (1, 2 or 4) 8×8 b16 matrices, each lane giving one row address
    /// (lanes 8i..8i+7 for matrix i); `trans` transposes each matrix.
    pub fn ldmatrix(&mut self, count: usize, trans: bool, at: Addr) -> Vec<Reg> {
        let regs = self.regs(Ty::B32, count);
        if !self.require(self.target.has_cp_async(), "ldmatrix") {
            return regs;
        }
        if !matches!(count, 1 | 2 | 4) {
            self.fail(format!("ldmatrix of {count} matrices"));
            return regs;
        }
        let t = if trans { ".trans" } else { "" };
        self.emit(format_args!(
            "ldmatrix.sync.aligned.m8n8.x{count}{t}.shared.b16 {}, {at}",
            vector_of(&regs)
        ));
        regs
    }

    /// `stmatrix` of 1, 2 or 4 8×8 b16 matrices (sm_90), the inverse of `ldmatrix`.
    pub fn stmatrix(&mut self, trans: bool, at: Addr, regs: &[Reg]) {
        if !self.require(self.target.has_bulk(), "stmatrix") {
            return;
        }
        if !matches!(regs.len(), 1 | 2 | 4) {
            self.fail(format!("stmatrix of {} matrices", regs.len()));
            return;
        }
        let t = if trans { ".trans" } else { "" };
        self.emit(format_args!(
            "stmatrix.sync.aligned.m8n8.x{}{t}.shared.b16 {at}, {}",
            regs.len(),
            vector_of(regs)
        ));
    }

    /// Whether `a < b` for u32 values, as a predicate (a bounds check).
    pub fn lt_u32(&mut self, a: Reg, b: impl Into<crate::Op>) -> Reg {
        self.setp(Cmp::Lt, a, b)
    }
}
