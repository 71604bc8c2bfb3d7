//! Built-in inputs: invocation and workgroup ids, sizes, subgroup ids.

use rspirv::dr::Operand;
use rspirv::spirv::{BuiltIn, Capability, Decoration, Op, StorageClass};

use super::*;
use crate::types::{Scalar, Ty, Val};

impl KernelBuilder {
    fn builtin(&mut self, builtin: BuiltIn, ty: Ty) -> Val {
        let var = match self.builtins.get(&(builtin as u32)) {
            Some(&v) => v,
            None => {
                let ptr = self.ptr_ty(StorageClass::Input, ty);
                let var = self.global_variable(ptr, StorageClass::Input);
                self.b
                    .decorate(var, Decoration::BuiltIn, [Operand::BuiltIn(builtin)]);
                self.builtins.insert(builtin as u32, var);
                var
            }
        };
        let ty_id = self.ty(ty);
        let id = self.inst(Op::Load, Some(ty_id), vec![id(var)]);
        Val { id, ty }
    }

    /// gl_GlobalInvocationID.
    pub fn global_id(&mut self) -> Val {
        self.builtin(BuiltIn::GlobalInvocationId, Ty::vector(Scalar::U32, 3))
    }
    /// gl_LocalInvocationID.
    pub fn local_id(&mut self) -> Val {
        self.builtin(BuiltIn::LocalInvocationId, Ty::vector(Scalar::U32, 3))
    }
    /// gl_LocalInvocationIndex (flattened local id).
    pub fn local_index(&mut self) -> Val {
        self.builtin(BuiltIn::LocalInvocationIndex, Ty::scalar(Scalar::U32))
    }
    /// gl_WorkGroupID.
    pub fn workgroup_id(&mut self) -> Val {
        self.builtin(BuiltIn::WorkgroupId, Ty::vector(Scalar::U32, 3))
    }
    /// gl_NumWorkGroups.
    pub fn num_workgroups(&mut self) -> Val {
        self.builtin(BuiltIn::NumWorkgroups, Ty::vector(Scalar::U32, 3))
    }
    pub fn subgroup_size(&mut self) -> Val {
        self.capability(Capability::GroupNonUniform);
        self.builtin(BuiltIn::SubgroupSize, Ty::scalar(Scalar::U32))
    }
    pub fn subgroup_invocation_id(&mut self) -> Val {
        self.capability(Capability::GroupNonUniform);
        self.builtin(BuiltIn::SubgroupLocalInvocationId, Ty::scalar(Scalar::U32))
    }
    pub fn subgroup_id(&mut self) -> Val {
        self.capability(Capability::GroupNonUniform);
        self.builtin(BuiltIn::SubgroupId, Ty::scalar(Scalar::U32))
    }
    pub fn num_subgroups(&mut self) -> Val {
        self.capability(Capability::GroupNonUniform);
        self.builtin(BuiltIn::NumSubgroups, Ty::scalar(Scalar::U32))
    }

    /// The workgroup size as a specialization-constant `uvec3` (usable in arithmetic and as
    /// a shared-array length).
    pub fn workgroup_size(&mut self) -> Val {
        let [x, y, z] = self.wg_spec.expect("declared in begin()");
        let ty = Ty::vector(Scalar::U32, 3);
        let ty_id = self.ty(ty);
        let id = self.inst(
            Op::CompositeConstruct,
            Some(ty_id),
            vec![id(x), id(y), id(z)],
        );
        Val { id, ty }
    }

    /// The workgroup size along x, a specialization constant.
    pub fn workgroup_size_x(&self) -> Val {
        let [x, _, _] = self.wg_spec.expect("declared in begin()");
        Val {
            id: x,
            ty: Ty::scalar(Scalar::U32),
        }
    }

    pub(super) fn declare_workgroup_size(&mut self) {
        let u32_ty = self.ty(Ty::scalar(Scalar::U32));
        let mut comps = [0; 3];
        for (i, c) in comps.iter_mut().enumerate() {
            *c = self.b.spec_constant_bit32(u32_ty, self.workgroup_size[i]);
            self.b.decorate(
                *c,
                Decoration::SpecId,
                [Operand::LiteralBit32(WORKGROUP_SIZE_SPEC_IDS[i])],
            );
        }
        let v3 = self.ty(Ty::vector(Scalar::U32, 3));
        let wg = self.b.spec_constant_composite(v3, comps);
        self.b.decorate(
            wg,
            Decoration::BuiltIn,
            [Operand::BuiltIn(BuiltIn::WorkgroupSize)],
        );
        self.wg_spec = Some(comps);
    }
}
