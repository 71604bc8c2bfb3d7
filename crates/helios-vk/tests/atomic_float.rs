// f32 atomic add on storage buffers (VK_EXT_shader_atomic_float shaderBufferFloat32AtomicAdd)
// end to end: the feature is enabled wherever it is supported, and a helios-spirv kernel
// using `atomic_fadd` runs in both binding models with exact sums.

mod common;

use helios_spirv::{Access as Use, Binding, KernelBuilder, KernelModule, ParamSlot, Scalar, Ty};
use helios_vk::{Access, Context, MemoryLocation, PipelineDesc};
use std::sync::Arc;

/// Invocations; each adds `(i % 7) + 1` to `out[i % SLOTS]`.
const N: u32 = 4099;
const SLOTS: u32 = 4;

fn value(i: u32) -> f32 {
    (i % 7 + 1) as f32
}

/// `if (i < n) old[i] = atomicAdd(out[i % SLOTS], float(i % 7 + 1));`
fn kernel(binding: Binding) -> KernelModule {
    let mut k = KernelBuilder::new("atomic_fadd_test", binding, [64, 1, 1]);
    let out = k.buffer("out", Scalar::F32, Use::ReadWrite);
    let old = k.buffer("old", Scalar::F32, Use::Write);
    let n = k.param("n", Ty::scalar(Scalar::U32));
    k.begin();
    let gid = k.global_id();
    let i = k.extract(gid, 0);
    let nv = k.load_param(n);
    let inb = k.lt(i, nv);
    k.if_(inb, |k| {
        let seven = k.u32(7);
        let one = k.u32(1);
        let r = k.rem(i, seven);
        let r = k.add(r, one);
        let v = k.convert(r, Scalar::F32);
        let slots = k.u32(SLOTS);
        let slot = k.rem(i, slots);
        let prev = k.atomic_fadd(out, slot, v);
        k.store(old, i, prev);
    });
    k.finish()
}

fn read_f32s(ctx: &Arc<Context>, buf: &helios_vk::Buffer, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    ctx.download(buf, 0, &mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn run(ctx: &Arc<Context>, binding: Binding) {
    let m = kernel(binding);
    helios_spirv::validate(&m.name, &m.words, helios_spirv::TargetEnv::Vulkan1_2)
        .unwrap_or_else(|e| panic!("{e}"));
    let descriptors = m
        .params
        .iter()
        .filter(|p| matches!(p.slot, ParamSlot::Descriptor { .. }))
        .count() as u32;
    let pipe = ctx
        .create_pipeline(&PipelineDesc {
            name: &m.name,
            spirv: &m.words,
            entry: m.entry,
            push_constant_size: m.push_size,
            spec_constants: &m.workgroup_spec(m.workgroup_size),
            storage_buffers: descriptors,
        })
        .expect("create pipeline");
    let out = ctx
        .create_buffer(u64::from(SLOTS) * 4, MemoryLocation::DeviceLocal)
        .unwrap();
    let old = ctx
        .create_buffer(u64::from(N) * 4, MemoryLocation::DeviceLocal)
        .unwrap();
    ctx.upload(&out, 0, &[0u8; SLOTS as usize * 4]).unwrap();

    let mut push = vec![0u8; m.push_size as usize];
    for p in &m.params {
        let (offset, bytes) = match (&p.slot, p.name.as_str()) {
            (ParamSlot::Address { offset }, "out") => {
                (*offset, out.device_address().to_le_bytes().to_vec())
            }
            (ParamSlot::Address { offset }, "old") => {
                (*offset, old.device_address().to_le_bytes().to_vec())
            }
            (ParamSlot::Value { offset, .. }, "n") => (*offset, N.to_le_bytes().to_vec()),
            (ParamSlot::Descriptor { .. }, _) => continue,
            (slot, name) => panic!("unexpected parameter {name} at {slot:?}"),
        };
        let at = offset as usize;
        push[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    // Descriptor binding i is accesses[i]: declaration order.
    ctx.dispatch(
        &pipe,
        [N.div_ceil(m.workgroup_size[0]), 1, 1],
        &push,
        &[Access::write(&out), Access::write(&old)],
    )
    .unwrap();

    let sums = read_f32s(ctx, &out, SLOTS as usize);
    let olds = read_f32s(ctx, &old, N as usize);
    for s in 0..SLOTS {
        // Every partial sum is a small integer, so the result is exact in any order.
        let want: f32 = (s..N).step_by(SLOTS as usize).map(value).sum();
        assert_eq!(sums[s as usize], want, "{binding:?} slot {s}");
        // The returned old values of one slot chain from 0 to the sum: in increasing order
        // each is the previous one plus that invocation's value (all values are positive).
        let mut chain: Vec<(f32, f32)> = (s..N)
            .step_by(SLOTS as usize)
            .map(|i| (olds[i as usize], value(i)))
            .collect();
        chain.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut acc = 0.0f32;
        for (prev, v) in chain {
            assert_eq!(prev, acc, "{binding:?} slot {s}: returned old values");
            acc += v;
        }
        assert_eq!(acc, want);
    }
    drop((pipe, out, old));
}

#[test]
fn f32_atomic_add_is_enabled_where_supported_and_sums_exactly() {
    let ctx = common::context();
    let supported = ctx.caps().features.shader_buffer_float32_atomic_add;
    assert_eq!(ctx.enabled().shader_buffer_float32_atomic_add, supported);
    if !supported {
        eprintln!(
            "skipping the f32 atomic dispatch: {} lacks shaderBufferFloat32AtomicAdd",
            ctx.caps().name
        );
        common::finish(ctx);
        return;
    }
    run(&ctx, Binding::DeviceAddress);
    if ctx.enabled().push_descriptor {
        run(&ctx, Binding::Descriptor);
    }
    common::finish(ctx);
}
