//! Subgroup (warp/wave) operations: reductions and scans, broadcast, shuffles, votes.
//!
//! These are the fast path of every reduction kernel; the shared-memory tree is the fallback
//! where a device lacks the needed subgroup features (helios-vk's `Caps` says which).

use rspirv::dr::Operand;
use rspirv::spirv::{Capability, GroupOperation, Op, Scope};

use crate::builder::{id, KernelBuilder};
use crate::types::{Kind, Scalar, Ty, Val};

/// The combining operation of a subgroup reduction or scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Add,
    Mul,
    Min,
    Max,
}

/// Whole-subgroup reduction, or inclusive/exclusive prefix scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupMode {
    Reduce,
    InclusiveScan,
    ExclusiveScan,
}

impl KernelBuilder {
    fn subgroup_scope(&mut self) -> u32 {
        self.const_u32(Scope::Subgroup as u32)
    }

    /// Combines `v` across the active invocations of the subgroup.
    #[track_caller]
    pub fn subgroup_reduce(&mut self, op: ReduceOp, mode: GroupMode, v: Val) -> Val {
        self.capability(Capability::GroupNonUniform);
        self.capability(Capability::GroupNonUniformArithmetic);
        let kind = v.ty.scalar.kind();
        let code = match (op, kind) {
            (ReduceOp::Add, Kind::Float) => Op::GroupNonUniformFAdd,
            (ReduceOp::Add, Kind::Signed | Kind::Unsigned) => Op::GroupNonUniformIAdd,
            (ReduceOp::Mul, Kind::Float) => Op::GroupNonUniformFMul,
            (ReduceOp::Mul, Kind::Signed | Kind::Unsigned) => Op::GroupNonUniformIMul,
            (ReduceOp::Min, Kind::Float) => Op::GroupNonUniformFMin,
            (ReduceOp::Min, Kind::Signed) => Op::GroupNonUniformSMin,
            (ReduceOp::Min, Kind::Unsigned) => Op::GroupNonUniformUMin,
            (ReduceOp::Max, Kind::Float) => Op::GroupNonUniformFMax,
            (ReduceOp::Max, Kind::Signed) => Op::GroupNonUniformSMax,
            (ReduceOp::Max, Kind::Unsigned) => Op::GroupNonUniformUMax,
            (_, Kind::Bool) => panic!("subgroup {op:?} of bool: use subgroup_any/all"),
        };
        let group_op = match mode {
            GroupMode::Reduce => GroupOperation::Reduce,
            GroupMode::InclusiveScan => GroupOperation::InclusiveScan,
            GroupMode::ExclusiveScan => GroupOperation::ExclusiveScan,
        };
        self.arith_caps(v.ty.scalar);
        let scope = self.subgroup_scope();
        let ty = self.ty(v.ty);
        let rid = self.inst(
            code,
            Some(ty),
            vec![id(scope), Operand::GroupOperation(group_op), v.into()],
        );
        Val { id: rid, ty: v.ty }
    }

    /// `v` from invocation `lane` (a constant) of the subgroup.
    pub fn subgroup_broadcast(&mut self, v: Val, lane: u32) -> Val {
        self.capability(Capability::GroupNonUniformBallot);
        let scope = self.subgroup_scope();
        let lane = self.const_u32(lane);
        let ty = self.ty(v.ty);
        let rid = self.inst(
            Op::GroupNonUniformBroadcast,
            Some(ty),
            vec![id(scope), v.into(), id(lane)],
        );
        Val { id: rid, ty: v.ty }
    }

    /// `v` from the lowest active invocation.
    pub fn subgroup_broadcast_first(&mut self, v: Val) -> Val {
        self.capability(Capability::GroupNonUniformBallot);
        let scope = self.subgroup_scope();
        let ty = self.ty(v.ty);
        let rid = self.inst(
            Op::GroupNonUniformBroadcastFirst,
            Some(ty),
            vec![id(scope), v.into()],
        );
        Val { id: rid, ty: v.ty }
    }

    /// `v` from invocation `lane` (any u32 value) of the subgroup.
    #[track_caller]
    pub fn subgroup_shuffle(&mut self, v: Val, lane: Val) -> Val {
        self.shuffle(Op::GroupNonUniformShuffle, v, lane)
    }

    /// `v` from invocation `self ^ mask`: the butterfly step of a tree reduction.
    #[track_caller]
    pub fn subgroup_shuffle_xor(&mut self, v: Val, mask: Val) -> Val {
        self.shuffle(Op::GroupNonUniformShuffleXor, v, mask)
    }

    #[track_caller]
    fn shuffle(&mut self, op: Op, v: Val, lane: Val) -> Val {
        assert!(
            lane.ty == Ty::scalar(Scalar::U32),
            "shuffle lane must be a u32"
        );
        self.capability(Capability::GroupNonUniformShuffle);
        let scope = self.subgroup_scope();
        let ty = self.ty(v.ty);
        let rid = self.inst(op, Some(ty), vec![id(scope), v.into(), lane.into()]);
        Val { id: rid, ty: v.ty }
    }

    /// True in exactly one active invocation (the lowest).
    pub fn subgroup_elect(&mut self) -> Val {
        self.capability(Capability::GroupNonUniform);
        let scope = self.subgroup_scope();
        let bool_ty = Ty::scalar(Scalar::Bool);
        let ty = self.ty(bool_ty);
        let rid = self.inst(Op::GroupNonUniformElect, Some(ty), vec![id(scope)]);
        Val {
            id: rid,
            ty: bool_ty,
        }
    }

    /// True if `cond` holds in any active invocation.
    pub fn subgroup_any(&mut self, cond: Val) -> Val {
        self.vote(Op::GroupNonUniformAny, cond)
    }

    /// True if `cond` holds in every active invocation.
    pub fn subgroup_all(&mut self, cond: Val) -> Val {
        self.vote(Op::GroupNonUniformAll, cond)
    }

    fn vote(&mut self, op: Op, cond: Val) -> Val {
        assert!(
            cond.ty == Ty::scalar(Scalar::Bool),
            "vote needs a scalar bool"
        );
        self.capability(Capability::GroupNonUniformVote);
        let scope = self.subgroup_scope();
        let ty = self.ty(cond.ty);
        let rid = self.inst(op, Some(ty), vec![id(scope), cond.into()]);
        Val {
            id: rid,
            ty: cond.ty,
        }
    }
}
