//! `KernelBuilder`: declares a compute kernel's parameters, then builds its body, then emits
//! a SPIR-V module through `rspirv`.
//!
//! The one decision a reader must know: a kernel has two phases. First its parameters are
//! declared (buffers and push-constant scalars), which fixes the push-constant layout the host
//! must fill; then `begin()` opens `main` and the body is built with typed operations (the
//! `ops`, `control`, `memory` and `subgroup` modules add those methods). Capabilities are
//! added where an operation needs them, so a module declares exactly what it uses.
//!
//! Misusing the builder (adding a parameter after `begin`, mixing operand types) is a bug in a
//! kernel generator, not bad user input, so it panics with `#[track_caller]` at the faulty line.

use std::collections::{BTreeSet, HashMap};

use rspirv::binary::{Assemble, Disassemble};
use rspirv::dr::{self, Operand};
use rspirv::spirv::{self, BuiltIn, Capability, Decoration, Op, StorageClass, Word};

use crate::types::{Scalar, Ty, Val};

/// How buffers reach the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Binding {
    /// 64-bit buffer device addresses inside the push-constant block: no descriptors at all.
    DeviceAddress,
    /// One storage-buffer descriptor per buffer in set 0, binding = declaration order (to be
    /// bound with push descriptors). Vector views of a buffer are aliased variables of the
    /// same binding.
    Descriptor,
}

/// The specialization-constant ids that carry the workgroup size (x, y, z).
pub const WORKGROUP_SIZE_SPEC_IDS: [u32; 3] = [0, 1, 2];

/// Whether a kernel reads or writes a buffer (documentation for the host and the
/// engine's hazard tracking; also decorates descriptor-bound buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

/// A buffer parameter: a run-time sized array of `elem`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    pub(crate) index: usize,
    pub elem: Scalar,
    /// For `buffer_at`: the id of the vec2<u32> device address computed in the kernel.
    pub(crate) address: Option<Word>,
}

/// A push-constant scalar or vector parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    pub(crate) member: u32,
    pub ty: Ty,
}

/// Where the host must put a parameter's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamSlot {
    /// A buffer device address (8 bytes) at this push-constant offset.
    Address { offset: u32 },
    /// A descriptor in set 0 at this binding.
    Descriptor { binding: u32 },
    /// A value of this type at this push-constant offset.
    Value { offset: u32, ty: Ty },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    pub name: String,
    pub slot: ParamSlot,
    /// For buffers: how the kernel uses it.
    pub access: Option<Access>,
}

/// An emitted kernel: the SPIR-V words and what the host needs to launch it.
#[derive(Clone, Debug)]
pub struct KernelModule {
    pub name: String,
    pub words: Vec<u32>,
    pub entry: &'static str,
    pub binding: Binding,
    /// Bytes of push constants the host must supply.
    pub push_size: u32,
    pub params: Vec<ParamInfo>,
    /// The workgroup size this kernel was designed for; override it through the
    /// specialization constants `WORKGROUP_SIZE_SPEC_IDS`.
    pub workgroup_size: [u32; 3],
}

impl KernelModule {
    /// Human-readable SPIR-V assembly, for dumps and snapshot tests.
    pub fn disassemble(&self) -> String {
        match dr::load_words(&self.words) {
            Ok(module) => module.disassemble(),
            Err(e) => format!("<cannot disassemble {}: {e}>", self.name),
        }
    }

    /// The specialization constants that set the workgroup size.
    pub fn workgroup_spec(&self, size: [u32; 3]) -> [(u32, u32); 3] {
        let ids = WORKGROUP_SIZE_SPEC_IDS;
        [(ids[0], size[0]), (ids[1], size[1]), (ids[2], size[2])]
    }
}

struct BufferDecl {
    name: String,
    elem: Scalar,
    access: Access,
    /// Push-constant member (DeviceAddress) or binding (Descriptor).
    slot: u32,
    /// Descriptor mode: one variable per vector width, created on first use.
    views: HashMap<u8, Word>,
}

struct ParamDecl {
    name: String,
    ty: Ty,
}

/// Builds one compute kernel. See the module docs for the two phases.
pub struct KernelBuilder {
    pub(crate) b: dr::Builder,
    name: String,
    binding: Binding,
    workgroup_size: [u32; 3],
    caps: BTreeSet<u32>,
    exts: BTreeSet<&'static str>,
    /// Push-constant members in declaration order: buffers (DeviceAddress) and values.
    push_members: Vec<PushMember>,
    buffers: Vec<BufferDecl>,
    params: Vec<ParamDecl>,
    consts: HashMap<(Ty, u64), Word>,
    /// View structs by (element, read-only).
    views: HashMap<(Ty, bool), Word>,
    builtins: HashMap<u32, Word>,
    glsl: Option<Word>,
    pub(crate) interface: Vec<Word>,
    push_var: Option<Word>,
    push_struct: Option<Word>,
    wg_spec: Option<[Word; 3]>,
    begun: bool,
    /// Results of `fma_fused`, rewritten into `OpFmaKHR` by `finish` (see `fma`).
    pub(crate) fused_fma: Vec<Word>,
    /// Declare the workgroup size as a `LocalSize` literal too (workgroup-scope cooperative
    /// matrices need it known when the module is compiled).
    pub(crate) literal_local_size: bool,
    /// Placeholders for instructions rspirv cannot name: result id → (opcode, has a result
    /// type), rewritten by `finish` (see `tensor`).
    pub(crate) raw_ops: HashMap<Word, (u32, bool)>,
    /// Emit SPIR-V 1.6 (tensor addressing needs it) instead of 1.5.
    pub(crate) spirv_1_6: bool,
    /// Some atomic has device scope: under the Vulkan memory model that needs
    /// `VulkanMemoryModelDeviceScope` (added by `finish`).
    pub(crate) device_scope: bool,
    /// Float adds, subtractions, products and quotients are decorated `NoContraction` (see
    /// `set_exact_arithmetic`).
    pub(crate) exact_arithmetic: bool,
}

#[derive(Clone, Copy)]
enum PushMember {
    Buffer(usize),
    Param(usize),
}

impl KernelBuilder {
    /// A new kernel named `name` (used for dumps, profiling and pipeline caching) with a
    /// default workgroup size.
    pub fn new(name: impl Into<String>, binding: Binding, workgroup_size: [u32; 3]) -> Self {
        let mut b = dr::Builder::new();
        b.set_version(1, 5);
        let mut kb = KernelBuilder {
            b,
            name: name.into(),
            binding,
            workgroup_size,
            caps: BTreeSet::new(),
            exts: BTreeSet::new(),
            push_members: Vec::new(),
            buffers: Vec::new(),
            params: Vec::new(),
            consts: HashMap::new(),
            views: HashMap::new(),
            builtins: HashMap::new(),
            glsl: None,
            interface: Vec::new(),
            push_var: None,
            push_struct: None,
            wg_spec: None,
            begun: false,
            fused_fma: Vec::new(),
            literal_local_size: false,
            device_scope: false,
            raw_ops: HashMap::new(),
            spirv_1_6: false,
            exact_arithmetic: false,
        };
        kb.capability(Capability::Shader);
        if binding == Binding::DeviceAddress {
            kb.capability(Capability::PhysicalStorageBufferAddresses);
        }
        kb
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// While on, every float add, subtraction, product and quotient the builder emits is
    /// decorated `NoContraction`, so the driver may not fuse a product and a sum into one
    /// rounding (an FMA). Code emitted in more than one kernel, which must give bit-identical
    /// results in each (an element-wise group computed in its own kernel or in a reduction's
    /// loads), is emitted under it: otherwise whether a product is contracted depends on what
    /// surrounds it. Returns the previous setting.
    pub fn set_exact_arithmetic(&mut self, on: bool) -> bool {
        std::mem::replace(&mut self.exact_arithmetic, on)
    }

    pub fn binding(&self) -> Binding {
        self.binding
    }

    // ---------------------------------------------------------------- declaration phase

    /// Declares a buffer of `elem` values.
    #[track_caller]
    pub fn buffer(&mut self, name: &str, elem: Scalar, access: Access) -> Buffer {
        assert!(
            !self.begun,
            "kernel {}: declare buffer {name} before begin()",
            self.name
        );
        assert!(elem != Scalar::Bool, "buffers cannot hold bool");
        let index = self.buffers.len();
        let slot = match self.binding {
            Binding::DeviceAddress => {
                self.push_members.push(PushMember::Buffer(index));
                (self.push_members.len() - 1) as u32
            }
            Binding::Descriptor => index as u32,
        };
        self.buffers.push(BufferDecl {
            name: name.to_string(),
            elem,
            access,
            slot,
            views: HashMap::new(),
        });
        Buffer {
            index,
            elem,
            address: None,
        }
    }

    /// Declares a push-constant value parameter.
    #[track_caller]
    pub fn param(&mut self, name: &str, ty: Ty) -> Param {
        assert!(
            !self.begun,
            "kernel {}: declare param {name} before begin()",
            self.name
        );
        assert!(
            ty.scalar != Scalar::Bool,
            "push constants cannot hold bool; pass a u32"
        );
        self.params.push(ParamDecl {
            name: name.to_string(),
            ty,
        });
        self.push_members
            .push(PushMember::Param(self.params.len() - 1));
        Param {
            member: (self.push_members.len() - 1) as u32,
            ty,
        }
    }

    /// Ends the declaration phase and opens the body of `main`.
    #[track_caller]
    pub fn begin(&mut self) {
        assert!(!self.begun, "kernel {}: begin() called twice", self.name);
        self.begun = true;
        self.declare_push_block();
        self.declare_workgroup_size();
        let void = self.b.type_void();
        let fn_ty = self.b.type_function(void, vec![]);
        self.b
            .begin_function(void, None, spirv::FunctionControl::NONE, fn_ty)
            .expect("begin main");
        self.b.begin_block(None).expect("entry block");
    }

    // ---------------------------------------------------------------- emission

    /// Closes `main` and assembles the module.
    #[track_caller]
    pub fn finish(mut self) -> KernelModule {
        assert!(self.begun, "kernel {}: finish() before begin()", self.name);
        self.b.ret().expect("return from main");
        self.b.end_function().expect("end main");
        let main = self.b.module_ref().functions[0]
            .def_id()
            .expect("main has an id");

        let addressing = match self.binding {
            Binding::DeviceAddress => spirv::AddressingModel::PhysicalStorageBuffer64,
            Binding::Descriptor => spirv::AddressingModel::Logical,
        };
        // Cooperative matrices require the Vulkan memory model (coop.rs asks for it).
        let model = if self.caps.contains(&(Capability::VulkanMemoryModel as u32)) {
            if self.device_scope {
                self.caps
                    .insert(Capability::VulkanMemoryModelDeviceScope as u32);
            }
            spirv::MemoryModel::Vulkan
        } else {
            spirv::MemoryModel::GLSL450
        };
        self.b.memory_model(addressing, model);
        for &cap in &self.caps {
            let cap = Capability::from_u32(cap).expect("known capability");
            self.b.capability(cap);
        }
        for ext in std::mem::take(&mut self.exts) {
            self.b.extension(ext);
        }
        let interface = self.interface.clone();
        self.b
            .entry_point(spirv::ExecutionModel::GLCompute, main, "main", interface);
        if self.literal_local_size {
            self.b
                .execution_mode(main, spirv::ExecutionMode::LocalSize, self.workgroup_size);
        }
        let name = self.name.clone();
        self.b.name(main, name.clone()); // keeps the kernel's name visible in dumps

        let params = self.param_infos();
        let push_size = self.push_size();
        if self.spirv_1_6 {
            self.b.set_version(1, 6);
        }
        let raw_ops = std::mem::take(&mut self.raw_ops);
        let mut words = self.b.module().assemble();
        if !raw_ops.is_empty() {
            words = crate::tensor::patch(&words, &raw_ops);
        }
        if !self.fused_fma.is_empty() {
            words = crate::fma::patch(&words, &self.fused_fma);
        }
        KernelModule {
            words,
            name,
            entry: "main",
            binding: self.binding,
            push_size,
            params,
            workgroup_size: self.workgroup_size,
        }
    }

    fn param_infos(&self) -> Vec<ParamInfo> {
        let offsets = self.push_offsets();
        let mut out = Vec::new();
        for (i, m) in self.push_members.iter().enumerate() {
            match *m {
                PushMember::Buffer(bi) => {
                    let buf = &self.buffers[bi];
                    out.push(ParamInfo {
                        name: buf.name.clone(),
                        slot: ParamSlot::Address { offset: offsets[i] },
                        access: Some(buf.access),
                    });
                }
                PushMember::Param(pi) => {
                    let p = &self.params[pi];
                    out.push(ParamInfo {
                        name: p.name.clone(),
                        slot: ParamSlot::Value {
                            offset: offsets[i],
                            ty: p.ty,
                        },
                        access: None,
                    });
                }
            }
        }
        if self.binding == Binding::Descriptor {
            for buf in &self.buffers {
                out.push(ParamInfo {
                    name: buf.name.clone(),
                    slot: ParamSlot::Descriptor { binding: buf.slot },
                    access: Some(buf.access),
                });
            }
        }
        out
    }

    // ---------------------------------------------------------------- push constants

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
    fn push_offsets(&self) -> Vec<u32> {
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

    fn push_size(&self) -> u32 {
        let offsets = self.push_offsets();
        match self.push_members.last() {
            Some(&m) => offsets[offsets.len() - 1] + self.member_layout(m).0,
            None => 0,
        }
    }

    fn declare_push_block(&mut self) {
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

    // ---------------------------------------------------------------- buffers (views)

    /// The pointer type (PhysicalStorageBuffer) to a block holding a run-time array of `elem`.
    /// The PhysicalStorageBuffer pointer type to `elem`'s view struct, and the runtime-array
    /// type that struct holds.
    pub(crate) fn view_pointer_and_array(&mut self, elem: Ty) -> (Word, Word) {
        let st = self.view_struct(elem, false);
        let array = self
            .b
            .module_ref()
            .types_global_values
            .iter()
            .find(|i| i.result_id == Some(st))
            .and_then(|i| match i.operands.first() {
                Some(Operand::IdRef(a)) => Some(*a),
                _ => None,
            })
            .expect("a view struct holds its runtime array");
        (self.view_pointer_type(elem, false), array)
    }

    /// The device address of `buf` (device-address binding) as a pointer to its scalar view.
    pub(crate) fn buffer_base(&mut self, buf: Buffer) -> Word {
        let member = self.buffers[buf.index].slot;
        let var = self.push_var.expect("push block declared");
        let readonly = self.read_only(buf.index);
        let scalar_view = self.view_pointer_type(Ty::scalar(buf.elem), readonly);
        let pc_ptr = self
            .b
            .type_pointer(None, StorageClass::PushConstant, scalar_view);
        let m = self.const_u32(member);
        let slot = self.inst(Op::AccessChain, Some(pc_ptr), vec![id(var), id(m)]);
        self.inst(Op::Load, Some(scalar_view), vec![id(slot)])
    }

    /// Whether buffer `index` is only read (its device-address views are `NonWritable`).
    fn read_only(&self, index: usize) -> bool {
        self.buffers[index].access == Access::Read
    }

    fn view_pointer_type(&mut self, elem: Ty, readonly: bool) -> Word {
        let st = self.view_struct(elem, readonly);
        self.b
            .type_pointer(None, StorageClass::PhysicalStorageBuffer, st)
    }

    /// `struct { elem data[]; }` decorated as a Block with an explicit stride, its member
    /// `NonWritable` when `readonly` (device-address views of buffers the kernel only reads,
    /// which lets the driver use its read-only load path). One type per (element, read-only)
    /// so decorations are emitted exactly once.
    fn view_struct(&mut self, elem: Ty, readonly: bool) -> Word {
        // Descriptor and device-address views share one struct type: the layout is the same.
        if let Some(&id) = self.views.get(&(elem, readonly)) {
            return id;
        }
        self.storage_caps(elem.scalar);
        let elem_id = self.ty(elem);
        let fresh = self.b.id();
        let arr = self.b.type_runtime_array_id(Some(fresh), elem_id);
        self.b.decorate(
            arr,
            Decoration::ArrayStride,
            [Operand::LiteralBit32(elem.bytes())],
        );
        let fresh = self.b.id();
        let st = self.b.type_struct_id(Some(fresh), [arr]);
        self.b.decorate(st, Decoration::Block, []);
        self.b
            .member_decorate(st, 0, Decoration::Offset, [Operand::LiteralBit32(0)]);
        if readonly {
            self.b.member_decorate(st, 0, Decoration::NonWritable, []);
        }
        self.views.insert((elem, readonly), st);
        st
    }

    fn storage_caps(&mut self, s: Scalar) {
        match s.bytes() {
            2 => {
                self.capability(Capability::StorageBuffer16BitAccess);
            }
            1 => {
                self.capability(Capability::StorageBuffer8BitAccess);
            }
            _ => {}
        }
    }

    /// A read-only buffer at a device address the kernel computed: a vec2 of u32, low word
    /// first, as a table of tensors stores addresses (SPIR-V bitcasts such a vector to a
    /// physical pointer, so no 64-bit integers are needed). For kernels that walk many
    /// tensors in one dispatch; device-address binding only, loads only.
    #[track_caller]
    pub fn buffer_at(&mut self, address: Val, elem: Scalar) -> Buffer {
        assert!(
            self.binding == Binding::DeviceAddress,
            "buffer_at needs device addresses"
        );
        assert!(
            address.ty == Ty::vector(Scalar::U32, 2),
            "a device address is a vec2<u32>, got {}",
            address.ty
        );
        Buffer {
            index: usize::MAX,
            elem,
            address: Some(address.id),
        }
    }

    /// Panics on a write to a `buffer_at` buffer (its views are `NonWritable`).
    #[track_caller]
    pub(crate) fn assert_writable(&self, buf: Buffer) {
        assert!(
            buf.address.is_none(),
            "buffers at computed addresses are read-only"
        );
    }

    /// A pointer to element `index` of `buf` viewed as an array of `lanes`-wide vectors,
    /// with the alignment the access may assume.
    pub(crate) fn element_pointer(&mut self, buf: Buffer, lanes: u8, index: Val) -> (Word, u32) {
        assert!(
            matches!(lanes, 1 | 2 | 4),
            "buffer access is 1, 2 or 4 lanes wide, got {lanes}"
        );
        assert!(
            index.ty.scalar.is_int() && index.ty.lanes == 1,
            "index must be an integer"
        );
        let elem = Ty::vector(buf.elem, lanes);
        let zero = self.const_u32(0);
        match self.binding {
            Binding::DeviceAddress => {
                let base = match buf.address {
                    // A computed address: straight to the (read-only) view of the access.
                    Some(address) => {
                        let view = self.view_pointer_type(elem, true);
                        self.inst(Op::Bitcast, Some(view), vec![id(address)])
                    }
                    None if lanes == 1 => self.buffer_base(buf),
                    None => {
                        let base = self.buffer_base(buf);
                        let readonly = self.read_only(buf.index);
                        let view = self.view_pointer_type(elem, readonly);
                        self.inst(Op::Bitcast, Some(view), vec![id(base)])
                    }
                };
                let ptr_ty = self.ptr_ty(StorageClass::PhysicalStorageBuffer, elem);
                let ptr = self.inst(
                    Op::AccessChain,
                    Some(ptr_ty),
                    vec![id(base), id(zero), id(index.id)],
                );
                (ptr, elem.bytes())
            }
            Binding::Descriptor => {
                let var = self.descriptor_view(buf.index, lanes);
                let ptr_ty = self.ptr_ty(StorageClass::StorageBuffer, elem);
                let ptr = self.inst(
                    Op::AccessChain,
                    Some(ptr_ty),
                    vec![id(var), id(zero), id(index.id)],
                );
                (ptr, elem.bytes())
            }
        }
    }

    fn descriptor_view(&mut self, index: usize, lanes: u8) -> Word {
        if let Some(&var) = self.buffers[index].views.get(&lanes) {
            return var;
        }
        let (elem, binding, access) = {
            let d = &self.buffers[index];
            (Ty::vector(d.elem, lanes), d.slot, d.access)
        };
        let st = self.view_struct(elem, false);
        let ptr = self.b.type_pointer(None, StorageClass::StorageBuffer, st);
        let var = self.global_variable(ptr, StorageClass::StorageBuffer);
        self.b
            .decorate(var, Decoration::DescriptorSet, [Operand::LiteralBit32(0)]);
        self.b
            .decorate(var, Decoration::Binding, [Operand::LiteralBit32(binding)]);
        if access == Access::Read {
            self.b.decorate(var, Decoration::NonWritable, []);
        }
        self.buffers[index].views.insert(lanes, var);
        var
    }

    // ---------------------------------------------------------------- builtins

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

    fn declare_workgroup_size(&mut self) {
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

    // ---------------------------------------------------------------- types and constants

    /// Adds a capability to the module (idempotent).
    pub fn capability(&mut self, cap: Capability) {
        self.caps.insert(cap as u32);
    }

    /// Adds an extension to the module (idempotent).
    pub fn extension(&mut self, ext: &'static str) {
        self.exts.insert(ext);
    }

    /// The SPIR-V type id of `ty` (non-aggregate types are de-duplicated by rspirv).
    pub fn ty(&mut self, ty: Ty) -> Word {
        let s = match ty.scalar {
            Scalar::Bool => self.b.type_bool(),
            Scalar::F16 => self.b.type_float(16),
            Scalar::F32 => self.b.type_float(32),
            Scalar::F64 => self.b.type_float(64),
            Scalar::BF16 => self.bf16_type(),
            Scalar::U8 => self.b.type_int(8, 0),
            Scalar::U16 => self.b.type_int(16, 0),
            Scalar::I32 => self.b.type_int(32, 1),
            Scalar::U32 => self.b.type_int(32, 0),
            Scalar::I64 => self.b.type_int(64, 1),
            Scalar::U64 => self.b.type_int(64, 0),
        };
        if ty.lanes == 1 {
            s
        } else {
            self.b.type_vector(s, ty.lanes as u32)
        }
    }

    pub(crate) fn ptr_ty(&mut self, class: StorageClass, ty: Ty) -> Word {
        let t = self.ty(ty);
        self.b.type_pointer(None, class, t)
    }

    /// Marks that arithmetic on `s` happens in the kernel: 8/16/64-bit types need a
    /// capability beyond storage.
    pub(crate) fn arith_caps(&mut self, s: Scalar) {
        match s {
            Scalar::F16 => self.capability(Capability::Float16),
            Scalar::U16 => self.capability(Capability::Int16),
            Scalar::U8 => self.capability(Capability::Int8),
            Scalar::I64 | Scalar::U64 => self.capability(Capability::Int64),
            Scalar::F64 => self.capability(Capability::Float64),
            _ => {}
        }
    }

    /// A constant of type `ty` whose every lane holds the bit pattern `bits`.
    pub fn constant_bits(&mut self, ty: Ty, bits: u64) -> Val {
        if let Some(&id) = self.consts.get(&(ty, bits)) {
            return Val { id, ty };
        }
        self.arith_caps(ty.scalar);
        let id = if ty.lanes > 1 {
            let lane = self.constant_bits(Ty::scalar(ty.scalar), bits).id;
            let ty_id = self.ty(ty);
            self.b
                .constant_composite(ty_id, vec![lane; ty.lanes as usize])
        } else {
            let ty_id = self.ty(ty);
            match ty.scalar {
                Scalar::Bool if bits != 0 => self.b.constant_true(ty_id),
                Scalar::Bool => self.b.constant_false(ty_id),
                Scalar::F64 | Scalar::I64 | Scalar::U64 => self.b.constant_bit64(ty_id, bits),
                _ => self.b.constant_bit32(ty_id, bits as u32),
            }
        };
        self.consts.insert((ty, bits), id);
        Val { id, ty }
    }

    pub fn const_f32(&mut self, v: f32) -> Val {
        self.constant_bits(Ty::scalar(Scalar::F32), v.to_bits() as u64)
    }
    pub fn const_u32(&mut self, v: u32) -> Word {
        self.constant_bits(Ty::scalar(Scalar::U32), v as u64).id
    }
    pub fn u32(&mut self, v: u32) -> Val {
        self.constant_bits(Ty::scalar(Scalar::U32), v as u64)
    }
    pub fn i32(&mut self, v: i32) -> Val {
        self.constant_bits(Ty::scalar(Scalar::I32), v as u32 as u64)
    }
    pub fn u64(&mut self, v: u64) -> Val {
        self.constant_bits(Ty::scalar(Scalar::U64), v)
    }
    pub fn i64(&mut self, v: i64) -> Val {
        self.constant_bits(Ty::scalar(Scalar::I64), v as u64)
    }
    pub fn f64(&mut self, v: f64) -> Val {
        self.constant_bits(Ty::scalar(Scalar::F64), v.to_bits())
    }
    pub fn bool(&mut self, v: bool) -> Val {
        self.constant_bits(Ty::scalar(Scalar::Bool), v as u64)
    }
    /// An f16 constant from its IEEE binary16 bit pattern.
    pub fn f16_bits(&mut self, bits: u16) -> Val {
        self.constant_bits(Ty::scalar(Scalar::F16), bits as u64)
    }
    /// A float constant of the given float type (f32 or f16, rounded to nearest).
    #[track_caller]
    pub fn const_float(&mut self, ty: Ty, v: f32) -> Val {
        let bits = match ty.scalar {
            Scalar::F32 => v.to_bits() as u64,
            Scalar::F16 => half::f16::from_f32(v).to_bits() as u64,
            Scalar::F64 => f64::from(v).to_bits(),
            s => panic!("const_float of non-float type {}", s.name()),
        };
        self.constant_bits(ty, bits)
    }
    /// An integer constant of the given integer type.
    #[track_caller]
    pub fn const_int(&mut self, ty: Ty, v: i64) -> Val {
        assert!(ty.scalar.is_int(), "const_int of non-integer type {ty}");
        let mask = if ty.scalar.bits() == 64 {
            u64::MAX
        } else {
            (1u64 << ty.scalar.bits()) - 1
        };
        self.constant_bits(ty, v as u64 & mask)
    }

    pub(crate) fn glsl(&mut self) -> Word {
        match self.glsl {
            Some(id) => id,
            None => {
                let id = self.b.ext_inst_import("GLSL.std.450");
                self.glsl = Some(id);
                id
            }
        }
    }

    /// A module-scope variable, listed in the entry point's interface (SPIR-V 1.4+ wants every
    /// global the entry point touches there). rspirv's `variable` would put it in the open block.
    pub(crate) fn global_variable(&mut self, ptr_ty: Word, class: StorageClass) -> Word {
        let var = self.b.id();
        let inst = dr::Instruction::new(
            Op::Variable,
            Some(ptr_ty),
            Some(var),
            vec![Operand::StorageClass(class)],
        );
        self.b
            .insert_types_global_values(dr::InsertPoint::End, inst);
        self.interface.push(var);
        var
    }

    /// Emits one instruction into the current block and returns its result id.
    pub(crate) fn inst(&mut self, op: Op, result_ty: Option<Word>, operands: Vec<Operand>) -> Word {
        let id = result_ty.map(|_| self.b.id());
        let inst = dr::Instruction::new(op, result_ty, id, operands);
        self.b
            .insert_into_block(dr::InsertPoint::End, inst)
            .unwrap_or_else(|e| panic!("kernel {}: {op:?} outside a block: {e}", self.name));
        id.unwrap_or(0)
    }

    /// Emits an instruction without a result.
    pub(crate) fn inst_void(&mut self, op: Op, operands: Vec<Operand>) {
        let inst = dr::Instruction::new(op, None, None, operands);
        self.b
            .insert_into_block(dr::InsertPoint::End, inst)
            .unwrap_or_else(|e| panic!("kernel {}: {op:?} outside a block: {e}", self.name));
    }
}

/// An id operand. (rspirv turns a bare `u32` into a *literal*, so ids are always wrapped.)
pub(crate) fn id(w: Word) -> Operand {
    Operand::IdRef(w)
}

impl From<Val> for Operand {
    fn from(v: Val) -> Operand {
        Operand::IdRef(v.id)
    }
}
