//! Every construct the IR offers, emitted in small kernels and checked by `spirv-val` for
//! Vulkan 1.2 and 1.3, in both binding models.

use helios_spirv::{
    validate, Access, Binding, CoopTy, CoopUse, GroupMode, KernelBuilder, KernelModule, ParamSlot,
    ReduceOp, Scalar, SharedLen, TargetEnv, Ty,
};

fn check(m: &KernelModule) {
    for env in [TargetEnv::Vulkan1_2, TargetEnv::Vulkan1_3] {
        if let Err(e) = validate(&m.name, &m.words, env) {
            panic!("{e}\n{}", m.disassemble());
        }
    }
}

const BINDINGS: [Binding; 2] = [Binding::DeviceAddress, Binding::Descriptor];

/// Arithmetic, math, comparisons, select, conversions and vectors over f32/f16/u32/i32/u64.
fn arithmetic(binding: Binding) -> KernelModule {
    let f32x = Ty::scalar(Scalar::F32);
    let mut k = KernelBuilder::new("arith", binding, [64, 1, 1]);
    let a = k.buffer("a", Scalar::F32, Access::Read);
    let h = k.buffer("h", Scalar::F16, Access::ReadWrite);
    let o = k.buffer("o", Scalar::F32, Access::Write);
    let w = k.buffer("w", Scalar::U64, Access::Write);
    let n = k.param("n", Ty::scalar(Scalar::U32));
    let s = k.param("s", f32x);
    k.begin();
    let gid = k.global_id();
    let i = k.extract(gid, 0);
    let nv = k.load_param(n);
    let inb = k.lt(i, nv);
    k.if_(inb, |k| {
        let x4 = k.load(a, i, 4);
        let sv = k.load_param(s);
        let s4 = k.splat(sv, 4);
        let y = k.mul(x4, s4);
        let y = k.exp(y);
        let y = k.log(y);
        let y = k.sqrt(y);
        let y = k.rsqrt(y);
        let y = k.tanh(y);
        let y = k.abs(y);
        let y = k.pow(y, s4);
        let y = k.fma(y, s4, x4);
        let y = k.min(y, s4);
        let y = k.max(y, x4);
        let y = k.neg(y);
        let y = k.div(y, s4);
        let y = k.sub(y, x4);
        let y = k.rem(y, s4);
        let lo = k.const_float(Ty::vector(Scalar::F32, 4), -1.0);
        let hi = k.const_float(Ty::vector(Scalar::F32, 4), 1.0);
        let y = k.clamp(y, lo, hi);
        let nan = k.is_nan(y);
        let inf = k.is_inf(y);
        let bad = k.or(nan, inf);
        let y = k.select(bad, x4, y);
        let lt = k.lt(y, x4);
        let any = k.any(lt);
        let y = k.select(any, y, x4);
        let d = k.dot(y, x4);
        let e = k.extract(y, 2);
        let z = k.add(d, e);
        let v = k.insert(y, z, 1);
        k.store(o, i, v);
        // f16 storage and arithmetic.
        let hv = k.load(h, i, 2);
        let hf = k.convert(hv, Scalar::F32);
        let h2 = k.convert(hf, Scalar::F16);
        let one = k.const_float(Ty::vector(Scalar::F16, 2), 1.5);
        let h3 = k.add(h2, one);
        k.store(h, i, h3);
        // Integer ops and conversions.
        let seven = k.u32(7);
        let r = k.rem(i, seven);
        let sh = k.shl(r, seven);
        let x = k.xor(sh, i);
        let si = k.convert(x, Scalar::I32);
        let neg = k.neg(si);
        let sabs = k.abs(neg);
        let three = k.i32(3);
        let shr = k.shr(sabs, three);
        let wide = k.convert(shr, Scalar::U64);
        let big = k.u64(1 << 40);
        let sum = k.add(wide, big);
        let halves = k.bitcast(sum, Ty::vector(Scalar::U32, 2));
        let lo32 = k.extract(halves, 0);
        let back = k.convert(lo32, Scalar::U64);
        let f = k.convert(back, Scalar::F32);
        let u = k.convert(f, Scalar::U32);
        let uu = k.convert(u, Scalar::U64);
        k.store(w, i, uu);
    });
    k.finish()
}

/// Loops, if/else, variables, shared memory, barriers and subgroup operations: a
/// workgroup sum reduction written both ways.
fn reduction(binding: Binding) -> KernelModule {
    let f = Ty::scalar(Scalar::F32);
    let u = Ty::scalar(Scalar::U32);
    let mut k = KernelBuilder::new("reduce", binding, [128, 1, 1]);
    let x = k.buffer("x", Scalar::F32, Access::Read);
    let out = k.buffer("out", Scalar::F32, Access::Write);
    let count = k.buffer("count", Scalar::U32, Access::ReadWrite);
    let n = k.param("n", u);
    k.begin();
    let lid = k.local_index();
    let wid = k.workgroup_id();
    let wg = k.extract(wid, 0);
    let nv = k.load_param(n);
    let zero = k.const_float(f, 0.0);
    let acc = k.var_init(zero);
    let wsize = k.workgroup_size_x();
    let nwg = k.num_workgroups();
    let groups = k.extract(nwg, 0);
    let stride = k.mul(wsize, groups);
    let start0 = k.mul(wg, wsize);
    let start = k.add(start0, lid);
    k.for_range(start, nv, stride, |k, i| {
        let v = k.load(x, i, 1);
        let a = k.get(acc);
        let s = k.add(a, v);
        k.set(acc, s);
    });
    // Shared-memory tree.
    let sh = k.shared_array(f, SharedLen::WorkgroupX);
    let a = k.get(acc);
    k.shared_store(sh, lid, a);
    k.workgroup_barrier();
    let two = k.u32(2);
    let half0 = k.div(wsize, two);
    let half = k.var_init(half0);
    let zero_u = k.u32(0);
    let one = k.u32(1);
    k.while_(
        |k| {
            let h = k.get(half);
            k.gt(h, zero_u)
        },
        |k| {
            let h = k.get(half);
            let active = k.lt(lid, h);
            k.if_(active, |k| {
                let other = k.add(lid, h);
                let p = k.shared_load(sh, lid);
                let q = k.shared_load(sh, other);
                let s = k.add(p, q);
                k.shared_store(sh, lid, s);
            });
            k.workgroup_barrier();
        },
        |k| {
            let h = k.get(half);
            let h2 = k.shr(h, one);
            k.set(half, h2);
        },
    );
    // Subgroup path.
    let sg = k.subgroup_reduce(ReduceOp::Add, GroupMode::Reduce, a);
    let mx = k.subgroup_reduce(ReduceOp::Max, GroupMode::InclusiveScan, a);
    let lane = k.subgroup_invocation_id();
    let xor = k.subgroup_shuffle_xor(mx, one);
    let sh2 = k.subgroup_shuffle(xor, lane);
    let b0 = k.subgroup_broadcast(sh2, 0);
    let bf = k.subgroup_broadcast_first(b0);
    let sz = k.subgroup_size();
    let _ = k.subgroup_id();
    let _ = k.num_subgroups();
    let pos = k.gt(bf, zero);
    let all = k.subgroup_all(pos);
    let anyv = k.subgroup_any(all);
    let picked = k.if_value(anyv, f, |_| sg, |_| bf);
    let first = k.eq(lid, zero_u);
    k.if_else(
        first,
        |k| {
            let total = k.shared_load(sh, zero_u);
            let t = k.add(total, picked);
            k.store(out, wg, t);
            let _old = k.atomic_add(count, zero_u, sz);
        },
        |k| k.buffer_memory_barrier(),
    );
    k.finish()
}

#[test]
fn arithmetic_module_validates() {
    for b in BINDINGS {
        let m = arithmetic(b);
        if std::env::var("HELIOS_DUMP_KERNELS").is_ok() {
            println!("{}", m.disassemble());
        }
        check(&m);
    }
}

#[test]
fn control_flow_shared_and_subgroup_module_validates() {
    for b in BINDINGS {
        check(&reduction(b));
    }
}

/// `out[i % 4] += x[i]` through f32 atomics, in a bounds check; the old value is stored too.
fn float_atomics(binding: Binding) -> KernelModule {
    let mut k = KernelBuilder::new("atomic_fadd", binding, [64, 1, 1]);
    let x = k.buffer("x", Scalar::F32, Access::Read);
    let out = k.buffer("out", Scalar::F32, Access::ReadWrite);
    let old = k.buffer("old", Scalar::F32, Access::Write);
    let n = k.param("n", Ty::scalar(Scalar::U32));
    k.begin();
    let gid = k.global_id();
    let i = k.extract(gid, 0);
    let nv = k.load_param(n);
    let inb = k.lt(i, nv);
    k.if_(inb, |k| {
        let v = k.load(x, i, 1);
        let four = k.u32(4);
        let slot = k.rem(i, four);
        let prev = k.atomic_fadd(out, slot, v);
        k.store(old, i, prev);
        // A constant operand and an i32 index.
        let one = k.const_f32(1.0);
        let zero = k.i32(0);
        let _ = k.atomic_fadd(out, zero, one);
    });
    k.finish()
}

#[test]
fn float_atomic_add_module_validates() {
    for b in BINDINGS {
        let m = float_atomics(b);
        let asm = m.disassemble();
        for want in [
            "OpCapability AtomicFloat32AddEXT",
            "OpExtension \"SPV_EXT_shader_atomic_float_add\"",
            "OpAtomicFAddEXT",
        ] {
            assert!(asm.contains(want), "{b:?}: no {want} in\n{asm}");
        }
        check(&m);
    }
}

/// Under the Vulkan memory model (which cooperative matrices bring in), a device-scope atomic
/// needs the VulkanMemoryModelDeviceScope capability: the builder adds it.
#[test]
fn device_scope_atomics_under_the_vulkan_memory_model_validate() {
    let mut k = KernelBuilder::new("coop_fadd", Binding::DeviceAddress, [32, 1, 1]);
    let out = k.buffer("out", Scalar::F32, Access::ReadWrite);
    k.begin();
    let ty = CoopTy::new(Scalar::F16, 16, 16, CoopUse::A);
    let _ = k.coop_var(ty);
    let i = k.local_index();
    let one = k.const_f32(1.0);
    k.atomic_fadd(out, i, one);
    // spirv-val refuses the atomic without the capability (rspirv cannot disassemble
    // cooperative-matrix types, so the validator is the check).
    let m = k.finish();
    if let Err(e) = validate(&m.name, &m.words, TargetEnv::Vulkan1_3) {
        panic!("{e}");
    }
}

#[test]
#[should_panic(expected = "atomic_fadd needs an f32 buffer and value")]
fn float_atomic_add_rejects_integer_buffers() {
    let mut k = KernelBuilder::new("bad_fadd", Binding::DeviceAddress, [1, 1, 1]);
    let out = k.buffer("out", Scalar::U32, Access::ReadWrite);
    k.begin();
    let i = k.local_index();
    let one = k.const_f32(1.0);
    k.atomic_fadd(out, i, one);
}

#[test]
fn empty_kernel_validates() {
    for b in BINDINGS {
        let mut k = KernelBuilder::new("empty", b, [1, 1, 1]);
        k.begin();
        check(&k.finish());
    }
}

#[test]
fn push_constant_layout_is_std430() {
    let mut k = KernelBuilder::new("layout", Binding::DeviceAddress, [64, 1, 1]);
    let _x = k.buffer("x", Scalar::F32, Access::Read);
    let _n = k.param("n", Ty::scalar(Scalar::U32));
    let _y = k.buffer("y", Scalar::F32, Access::Write);
    let _v = k.param("v", Ty::vector(Scalar::F32, 4));
    let _s = k.param("s", Ty::scalar(Scalar::F32));
    k.begin();
    let m = k.finish();
    let offsets: Vec<u32> = m
        .params
        .iter()
        .map(|p| match p.slot {
            ParamSlot::Address { offset } | ParamSlot::Value { offset, .. } => offset,
            ParamSlot::Descriptor { .. } => unreachable!(),
        })
        .collect();
    assert_eq!(offsets, vec![0, 8, 16, 32, 48]);
    assert_eq!(m.push_size, 52);
    check(&m);
}

#[test]
fn descriptor_binding_numbers_follow_declaration_order() {
    let mut k = KernelBuilder::new("desc", Binding::Descriptor, [64, 1, 1]);
    let a = k.buffer("a", Scalar::F32, Access::Read);
    let b = k.buffer("b", Scalar::F32, Access::Write);
    k.begin();
    let i = k.local_index();
    let v = k.load(a, i, 4);
    k.store(b, i, v);
    let s = k.load(a, i, 1);
    k.store(b, i, s);
    let m = k.finish();
    let bindings: Vec<_> = m.params.iter().map(|p| p.slot.clone()).collect();
    assert_eq!(
        bindings,
        vec![
            ParamSlot::Descriptor { binding: 0 },
            ParamSlot::Descriptor { binding: 1 }
        ]
    );
    assert_eq!(m.push_size, 0);
    check(&m);
}

#[test]
fn spirv_val_rejects_a_broken_module() {
    // The gate must be able to fail: drop the entry point's function body terminator.
    let mut k = KernelBuilder::new("broken", Binding::DeviceAddress, [1, 1, 1]);
    k.begin();
    let mut m = k.finish();
    m.words.truncate(m.words.len() - 2);
    let err = validate("broken", &m.words, TargetEnv::Vulkan1_2).unwrap_err();
    assert!(
        matches!(err, helios_spirv::ValidateError::Invalid { .. }),
        "{err}"
    );
}
