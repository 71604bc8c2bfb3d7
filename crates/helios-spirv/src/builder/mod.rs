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
//!
//! This file holds the declaration phase and the module's emission; the builder's other
//! methods live by what they make: `push` (the push-constant block), `views` (buffers as
//! views, their loads and stores), `builtins` (invocation and workgroup ids), `consts`
//! (types, constants and instruction emission).

use std::collections::{BTreeSet, HashMap};

use rspirv::binary::{Assemble, Disassemble};
use rspirv::dr::{self, Operand};
use rspirv::spirv::{self, Capability, Word};

use crate::types::{Scalar, Ty, Val};

mod builtins;
mod consts;
pub(crate) mod patch;
mod push;
mod views;

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
    /// For `buffer_at`: the id of the `vec2<u32>` device address computed in the kernel.
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
            words = patch::placeholders(&words, &raw_ops);
        }
        if !self.fused_fma.is_empty() {
            words = patch::fused_fma(&words, &self.fused_fma);
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
