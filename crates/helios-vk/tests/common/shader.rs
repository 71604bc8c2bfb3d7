// The test kernel, built with rspirv the way helios-spirv will build real ones:
//
//   layout(push_constant) uniform PC { Buf out; uint add; uint n; };   // Buf: uint data[]
//   layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
//   void main() { uint i = gl_GlobalInvocationID.x; if (i < n) out.data[i] = i * 3 + add; }
//
// SPIR-V 1.5, PhysicalStorageBuffer64 addressing, the buffer as a pointer in push constants,
// the workgroup size as a spec-constant composite, an Aligned store.

use helios_vk::{Context, MemoryLocation, Pipeline, PipelineDesc};
use rspirv::binary::Assemble;
use rspirv::dr::{Builder, Operand};
use rspirv::spirv::{
    AddressingModel, BuiltIn, Capability, Decoration, ExecutionModel, FunctionControl,
    MemoryAccess, MemoryModel, SelectionControl, StorageClass,
};
use std::sync::Arc;

/// Push-constant bytes: address (u64), add (u32), n (u32).
pub const PUSH_SIZE: u32 = 16;

pub fn push_constants(address: u64, add: u32, n: u32) -> Vec<u8> {
    let mut p = address.to_le_bytes().to_vec();
    p.extend_from_slice(&add.to_le_bytes());
    p.extend_from_slice(&n.to_le_bytes());
    p
}

pub fn index_times_three_plus() -> Vec<u32> {
    let mut b = Builder::new();
    b.set_version(1, 5);
    b.capability(Capability::Shader);
    b.capability(Capability::PhysicalStorageBufferAddresses);
    b.memory_model(
        AddressingModel::PhysicalStorageBuffer64,
        MemoryModel::GLSL450,
    );

    let void = b.type_void();
    let fn_ty = b.type_function(void, []);
    let boolean = b.type_bool();
    let u32_ty = b.type_int(32, 0);
    let uvec3 = b.type_vector(u32_ty, 3);
    let rta = b.type_runtime_array(u32_ty);
    b.decorate(rta, Decoration::ArrayStride, [Operand::LiteralBit32(4)]);
    let buf = b.type_struct([rta]);
    b.decorate(buf, Decoration::Block, []);
    b.member_decorate(buf, 0, Decoration::Offset, [Operand::LiteralBit32(0)]);
    let buf_ptr = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, buf);
    let elem_ptr = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, u32_ty);
    let pc = b.type_struct([buf_ptr, u32_ty, u32_ty]);
    b.decorate(pc, Decoration::Block, []);
    for (member, offset) in [(0, 0), (1, 8), (2, 12)] {
        b.member_decorate(
            pc,
            member,
            Decoration::Offset,
            [Operand::LiteralBit32(offset)],
        );
    }
    let pc_ptr = b.type_pointer(None, StorageClass::PushConstant, pc);
    let pc_buf_ptr = b.type_pointer(None, StorageClass::PushConstant, buf_ptr);
    let pc_u32_ptr = b.type_pointer(None, StorageClass::PushConstant, u32_ty);
    let in_uvec3_ptr = b.type_pointer(None, StorageClass::Input, uvec3);

    let c0 = b.constant_bit32(u32_ty, 0);
    let c1 = b.constant_bit32(u32_ty, 1);
    let c2 = b.constant_bit32(u32_ty, 2);
    let c3 = b.constant_bit32(u32_ty, 3);
    // Workgroup size defaults to 1x1x1: the test only covers all elements if the
    // specialisation to 64 reaches the driver.
    let sizes: Vec<u32> = (0..3).map(|_| b.spec_constant_bit32(u32_ty, 1)).collect();
    for (id, &s) in sizes.iter().enumerate() {
        b.decorate(s, Decoration::SpecId, [Operand::LiteralBit32(id as u32)]);
    }
    let wg_size = b.spec_constant_composite(uvec3, sizes);
    b.decorate(
        wg_size,
        Decoration::BuiltIn,
        [Operand::BuiltIn(BuiltIn::WorkgroupSize)],
    );

    let push = b.variable(pc_ptr, None, StorageClass::PushConstant, None);
    let gid = b.variable(in_uvec3_ptr, None, StorageClass::Input, None);
    b.decorate(
        gid,
        Decoration::BuiltIn,
        [Operand::BuiltIn(BuiltIn::GlobalInvocationId)],
    );

    let main = b
        .begin_function(void, None, FunctionControl::NONE, fn_ty)
        .unwrap();
    b.begin_block(None).unwrap();
    let g = b.load(uvec3, None, gid, None, []).unwrap();
    let i = b.composite_extract(u32_ty, None, g, [0]).unwrap();
    let n_ptr = b.access_chain(pc_u32_ptr, None, push, [c2]).unwrap();
    let n = b.load(u32_ty, None, n_ptr, None, []).unwrap();
    let in_bounds = b.u_less_than(boolean, None, i, n).unwrap();
    let body = b.id();
    let merge = b.id();
    b.selection_merge(merge, SelectionControl::NONE).unwrap();
    b.branch_conditional(in_bounds, body, merge, []).unwrap();

    b.begin_block(Some(body)).unwrap();
    let out_ptr_ptr = b.access_chain(pc_buf_ptr, None, push, [c0]).unwrap();
    let out = b.load(buf_ptr, None, out_ptr_ptr, None, []).unwrap();
    let add_ptr = b.access_chain(pc_u32_ptr, None, push, [c1]).unwrap();
    let add = b.load(u32_ty, None, add_ptr, None, []).unwrap();
    let times3 = b.i_mul(u32_ty, None, i, c3).unwrap();
    let value = b.i_add(u32_ty, None, times3, add).unwrap();
    let elem = b.access_chain(elem_ptr, None, out, [c0, i]).unwrap();
    b.store(
        elem,
        value,
        Some(MemoryAccess::ALIGNED),
        [Operand::LiteralBit32(4)],
    )
    .unwrap();
    b.branch(merge).unwrap();

    b.begin_block(Some(merge)).unwrap();
    b.ret().unwrap();
    b.end_function().unwrap();
    // SPIR-V 1.4+: the interface lists every global variable the entry point uses.
    b.entry_point(ExecutionModel::GLCompute, main, "main", [push, gid]);
    b.module().assemble()
}

/// Runs the project's `spirv-val` (`helios_spirv::validator`) for Vulkan 1.2; panics with its
/// message when the module is rejected or the validator cannot run.
pub fn spirv_val(words: &[u32]) {
    helios_spirv::validate("test shader", words, helios_spirv::TargetEnv::Vulkan1_2)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Elements [`create_and_run`] writes, and its workgroup size.
pub const RUN_N: u32 = 1000;
pub const RUN_WORKGROUP: u32 = 64;

/// Creates the `index_times_three_plus` pipeline on `ctx`, runs it over [`RUN_N`] elements,
/// checks every one and returns the pipeline.
pub fn create_and_run(ctx: &Arc<Context>) -> Arc<Pipeline> {
    let spirv = index_times_three_plus();
    let pipe = ctx
        .create_pipeline(&PipelineDesc {
            name: "index_times_three_plus",
            spirv: &spirv,
            entry: "main",
            push_constant_size: PUSH_SIZE,
            spec_constants: &[(0, RUN_WORKGROUP), (1, 1), (2, 1)],
            storage_buffers: 0,
        })
        .expect("create pipeline");
    let buf = ctx
        .create_buffer(u64::from(RUN_N) * 4, MemoryLocation::HostVisible)
        .unwrap();
    let push = push_constants(buf.device_address(), 5, RUN_N);
    ctx.submit_and_wait(|rec| rec.dispatch(&pipe, [RUN_N.div_ceil(RUN_WORKGROUP), 1, 1], &push))
        .unwrap();
    let mut bytes = vec![0u8; RUN_N as usize * 4];
    ctx.download(&buf, 0, &mut bytes).unwrap();
    for (i, c) in bytes.chunks_exact(4).enumerate() {
        let v = u32::from_le_bytes(c.try_into().unwrap());
        assert_eq!(v, i as u32 * 3 + 5, "element {i}");
    }
    pipe
}
