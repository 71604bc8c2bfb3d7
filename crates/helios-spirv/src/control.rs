//! Structured control flow (if, if/else, loops) and function-local mutable variables.
//!
//! SPIR-V for Vulkan demands structured control flow: every branch names its merge block and
//! every loop its continue block. Closures give that structure for free: the body of an `if`
//! or a loop is a closure, and the builder emits headers, merges and back edges around it.
//! Values flow out of branches through variables (`var`), which the driver promotes to
//! registers; no phi nodes are needed.

use rspirv::dr::Operand;
use rspirv::spirv::{LoopControl, Op, SelectionControl, StorageClass, Word};

use crate::builder::{id, KernelBuilder};
use crate::types::{Scalar, Ty, Val};

/// A function-local variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Var {
    ptr: Word,
    pub ty: Ty,
}

impl KernelBuilder {
    /// A new uninitialized function-local variable.
    pub fn var(&mut self, ty: Ty) -> Var {
        self.arith_caps(ty.scalar);
        let ptr_ty = self.ptr_ty(StorageClass::Function, ty);
        let ptr = self.b.id();
        let inst = rspirv::dr::Instruction::new(
            Op::Variable,
            Some(ptr_ty),
            Some(ptr),
            vec![Operand::StorageClass(StorageClass::Function)],
        );
        // Vulkan requires function variables at the top of the entry block.
        let current = self.b.selected_block();
        self.b.select_block(Some(0)).expect("entry block exists");
        self.b
            .insert_into_block(rspirv::dr::InsertPoint::Begin, inst)
            .expect("entry block");
        self.b.select_block(current).expect("restore block");
        Var { ptr, ty }
    }

    /// A new variable holding `init`.
    pub fn var_init(&mut self, init: Val) -> Var {
        let v = self.var(init.ty);
        self.set(v, init);
        v
    }

    pub fn get(&mut self, v: Var) -> Val {
        let ty = self.ty(v.ty);
        let rid = self.inst(Op::Load, Some(ty), vec![id(v.ptr)]);
        Val { id: rid, ty: v.ty }
    }

    #[track_caller]
    pub fn set(&mut self, v: Var, value: Val) {
        assert!(
            v.ty == value.ty,
            "store of {} into a {} variable",
            value.ty,
            v.ty
        );
        self.inst_void(Op::Store, vec![id(v.ptr), value.into()]);
    }

    fn branch(&mut self, target: Word) {
        self.b.branch(target).expect("branch inside a block");
    }

    fn block(&mut self, label: Word) {
        self.b
            .begin_block(Some(label))
            .expect("previous block is terminated");
    }

    #[track_caller]
    fn check_cond(&self, cond: Val) {
        assert!(
            cond.ty == Ty::scalar(Scalar::Bool),
            "branch condition must be a scalar bool"
        );
    }

    /// Opens `if cond` without an else: the selection header, then the `then` block the
    /// caller fills; returns the merge label.
    #[track_caller]
    fn open_if(&mut self, cond: Val) -> Word {
        self.check_cond(cond);
        let (then_l, merge) = (self.b.id(), self.b.id());
        self.b
            .selection_merge(merge, SelectionControl::NONE)
            .expect("selection merge");
        self.b
            .branch_conditional(cond.id, then_l, merge, [])
            .expect("conditional branch");
        self.block(then_l);
        merge
    }

    /// `if cond { then }`.
    #[track_caller]
    pub fn if_(&mut self, cond: Val, then: impl FnOnce(&mut Self)) {
        let merge = self.open_if(cond);
        then(self);
        self.branch(merge);
        self.block(merge);
    }

    /// `if cond { return }`: the invocation ends here. A kernel with barriers must call it
    /// with a condition uniform over the workgroup (every invocation leaves, or none does).
    #[track_caller]
    pub fn return_if(&mut self, cond: Val) {
        let merge = self.open_if(cond);
        self.b.ret().expect("return");
        self.block(merge);
    }

    /// `if cond { then } else { otherwise }`.
    #[track_caller]
    pub fn if_else(
        &mut self,
        cond: Val,
        then: impl FnOnce(&mut Self),
        otherwise: impl FnOnce(&mut Self),
    ) {
        self.check_cond(cond);
        let (then_l, else_l, merge) = (self.b.id(), self.b.id(), self.b.id());
        self.b
            .selection_merge(merge, SelectionControl::NONE)
            .expect("selection merge");
        self.b
            .branch_conditional(cond.id, then_l, else_l, [])
            .expect("conditional branch");
        self.block(then_l);
        then(self);
        self.branch(merge);
        self.block(else_l);
        otherwise(self);
        self.branch(merge);
        self.block(merge);
    }

    /// `cond ? then() : otherwise()` where both arms compute a value of one type; the arms'
    /// side effects happen only on the taken branch.
    #[track_caller]
    pub fn if_value(
        &mut self,
        cond: Val,
        ty: Ty,
        then: impl FnOnce(&mut Self) -> Val,
        otherwise: impl FnOnce(&mut Self) -> Val,
    ) -> Val {
        let out = self.var(ty);
        self.if_else(
            cond,
            |k| {
                let v = then(k);
                k.set(out, v);
            },
            |k| {
                let v = otherwise(k);
                k.set(out, v);
            },
        );
        self.get(out)
    }

    /// A structured loop: evaluates `cond` before each iteration, runs `body` while it holds,
    /// and runs `step` (the continue block) after each iteration.
    #[track_caller]
    pub fn while_(
        &mut self,
        cond: impl FnOnce(&mut Self) -> Val,
        body: impl FnOnce(&mut Self),
        step: impl FnOnce(&mut Self),
    ) {
        let (header, check, body_l, cont, merge) = (
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
        );
        self.branch(header);
        self.block(header);
        self.b
            .loop_merge(merge, cont, LoopControl::NONE, [])
            .expect("loop merge");
        self.branch(check);
        self.block(check);
        let c = cond(self);
        self.check_cond(c);
        self.b
            .branch_conditional(c.id, body_l, merge, [])
            .expect("loop condition");
        self.block(body_l);
        body(self);
        self.branch(cont);
        self.block(cont);
        step(self);
        self.branch(header);
        self.block(merge);
    }

    /// `for i in (start..end).step_by(step)` on integers of one type; `body` gets `i`.
    #[track_caller]
    pub fn for_range(
        &mut self,
        start: Val,
        end: Val,
        step: Val,
        body: impl FnOnce(&mut Self, Val),
    ) {
        assert!(
            start.ty.scalar.is_int() && start.ty.lanes == 1,
            "loop counter must be an integer"
        );
        let i = self.var_init(start);
        self.while_(
            |k| {
                let iv = k.get(i);
                k.lt(iv, end)
            },
            |k| {
                let iv = k.get(i);
                body(k, iv);
            },
            |k| {
                let iv = k.get(i);
                let next = k.add(iv, step);
                k.set(i, next);
            },
        );
    }
}
