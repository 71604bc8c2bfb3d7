//! The push-constant block: its members' layout and the loads of parameters from it.

use rspirv::dr::Operand;
use rspirv::spirv::{Capability, Decoration, Op, StorageClass, Word};

use super::*;
use crate::types::{Ty, Val};

impl KernelBuilder {
    fn member_layout(&self, m: PushMember) -> (u32, u32) {
        match m {
            PushMember::Buffer(_) => (8, 8),
            PushMember::Param(pi) => {
                let ty = self.params[pi].ty;
                let align = match ty.lanes {
                    1 => ty.scalar.bytes(),
                    2 => 2 * ty.scalar.bytes(),
                    _ => 4 * ty.scalar.bytes(),
                };
                (ty.bytes(), align)
            }
        }
    }

    /// std430-style offsets of the push-constant members.
    pub(super) fn push_offsets(&self) -> Vec<u32> {
        let mut offset = 0u32;
        self.push_members
            .iter()
            .map(|&m| {
                let (size, align) = self.member_layout(m);
                offset = offset.next_multiple_of(align);
                let at = offset;
                offset += size;
                at
            })
            .collect()
    }

    pub(super) fn push_size(&self) -> u32 {
        let offsets = self.push_offsets();
        match self.push_members.last() {
            Some(&m) => offsets[offsets.len() - 1] + self.member_layout(m).0,
            None => 0,
        }
    }

    pub(super) fn declare_push_block(&mut self) {
        if self.push_members.is_empty() {
            return;
        }
        let offsets = self.push_offsets();
        let members: Vec<Word> = self
            .push_members
            .clone()
            .into_iter()
            .map(|m| match m {
                PushMember::Buffer(bi) => {
                    let elem = Ty::scalar(self.buffers[bi].elem);
                    let readonly = self.read_only(bi);
                    self.view_pointer_type(elem, readonly)
                }
                PushMember::Param(pi) => {
                    let ty = self.params[pi].ty;
                    if ty.scalar.bytes() == 2 {
                        self.capability(Capability::StoragePushConstant16);
                    } else if ty.scalar.bytes() == 1 {
                        self.capability(Capability::StoragePushConstant8);
                    }
                    self.ty(ty)
                }
            })
            .collect();
        let fresh = self.b.id();
        let st = self.b.type_struct_id(Some(fresh), members);
        self.b.decorate(st, Decoration::Block, []);
        for (i, off) in offsets.iter().enumerate() {
            self.b.member_decorate(
                st,
                i as u32,
                Decoration::Offset,
                [Operand::LiteralBit32(*off)],
            );
        }
        let ptr = self.b.type_pointer(None, StorageClass::PushConstant, st);
        let var = self.global_variable(ptr, StorageClass::PushConstant);
        self.push_struct = Some(st);
        self.push_var = Some(var);
    }

    /// Loads a push-constant value parameter.
    pub fn load_param(&mut self, p: Param) -> Val {
        let var = self.push_var.expect("push block declared");
        let ptr_ty = self.ptr_ty(StorageClass::PushConstant, p.ty);
        let idx = self.const_u32(p.member);
        let ptr = self.inst(Op::AccessChain, Some(ptr_ty), vec![id(var), id(idx)]);
        let ty = self.ty(p.ty);
        let id = self.inst(Op::Load, Some(ty), vec![id(ptr)]);
        Val { id, ty: p.ty }
    }
}
