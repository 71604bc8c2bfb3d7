// A compute pipeline from rspirv-built SPIR-V, dispatched through buffer device addresses in
// push constants; the timeline seams; argument errors.

mod common;

use common::shader::{self, PUSH_SIZE};
use helios_vk::{Context, Error, MemoryLocation, PipelineDesc};
use std::sync::Arc;

const N: u32 = 1000;
const WORKGROUP: u32 = 64;

fn pipeline(ctx: &Arc<Context>, spirv: &[u32]) -> Arc<helios_vk::Pipeline> {
    ctx.create_pipeline(&PipelineDesc {
        name: "index_times_three_plus",
        spirv,
        entry: "main",
        push_constant_size: PUSH_SIZE,
        spec_constants: &[(0, WORKGROUP), (1, 1), (2, 1)],
        storage_buffers: 0,
    })
    .unwrap()
}

fn read_u32s(ctx: &Arc<Context>, buf: &helios_vk::Buffer, n: usize) -> Vec<u32> {
    let mut bytes = vec![0u8; n * 4];
    ctx.download(buf, 0, &mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn spirv_is_valid() {
    shader::spirv_val(&shader::index_times_three_plus());
}

#[test]
fn dispatch_writes_every_element_in_bounds() {
    let ctx = common::context();
    let spirv = shader::index_times_three_plus();
    let pipe = pipeline(&ctx, &spirv);
    // 100 elements past N must keep their sentinel: the bounds check works.
    let total = N as usize + 100;
    for location in [MemoryLocation::DeviceLocal, MemoryLocation::HostVisible] {
        let buf = ctx.create_buffer(total as u64 * 4, location).unwrap();
        ctx.upload(&buf, 0, &vec![0xFF; total * 4]).unwrap();
        let groups = N.div_ceil(WORKGROUP);
        ctx.submit_and_wait(|rec| {
            rec.dispatch(
                &pipe,
                [groups, 1, 1],
                &shader::push_constants(buf.device_address(), 7, N),
            )
        })
        .unwrap();
        let got = read_u32s(&ctx, &buf, total);
        for (i, &v) in got.iter().enumerate() {
            let want = if i < N as usize {
                i as u32 * 3 + 7
            } else {
                u32::MAX
            };
            assert_eq!(v, want, "{location:?} element {i}");
        }
    }
    drop(pipe);
    common::finish(ctx);
}

#[test]
fn repeated_dispatches_with_barriers_and_timeline() {
    let ctx = common::context();
    let spirv = shader::index_times_three_plus();
    let pipe = pipeline(&ctx, &spirv);
    let buf = ctx
        .create_buffer(u64::from(N) * 4, MemoryLocation::DeviceLocal)
        .unwrap();
    let groups = [N.div_ceil(WORKGROUP), 1, 1];
    // Same pipeline three times in one command buffer (bound once), last write wins.
    let before = ctx.last_submitted();
    ctx.submit_and_wait(|rec| {
        for add in [1, 2, 3] {
            rec.dispatch(
                &pipe,
                groups,
                &shader::push_constants(buf.device_address(), add, N),
            )?;
            rec.barrier();
        }
        assert_eq!(rec.dispatch_count(), 3);
        Ok(())
    })
    .unwrap();
    assert_eq!(ctx.last_submitted(), before + 1);
    assert!(ctx.completed().unwrap() > before);
    assert_eq!(read_u32s(&ctx, &buf, 4), [3, 6, 9, 12]);

    // The async seams: several submits in flight, then one wait.
    let push = shader::push_constants(buf.device_address(), 100, N);
    // SAFETY: `pipe` and `buf` outlive the wait below.
    let values: Vec<u64> = (0..3)
        .map(|_| unsafe { ctx.submit(|rec| rec.dispatch(&pipe, groups, &push)) }.unwrap())
        .collect();
    assert!(values.windows(2).all(|w| w[1] == w[0] + 1));
    ctx.wait(*values.last().unwrap()).unwrap();
    assert!(ctx.completed().unwrap() >= values[2]);
    assert_eq!(read_u32s(&ctx, &buf, 2), [100, 103]);
    let err = ctx.wait(values[2] + 10).unwrap_err();
    assert!(matches!(err, Error::WaitOnUnsubmitted { .. }), "{err}");
    ctx.wait(0).unwrap();
    drop((pipe, buf));
    common::finish(ctx);
}

#[test]
fn recording_errors_submit_nothing() {
    let ctx = common::context();
    let spirv = shader::index_times_three_plus();
    let pipe = pipeline(&ctx, &spirv);
    let too_many = vec![0u8; PUSH_SIZE as usize + 4];
    let err = ctx
        .submit_and_wait(|rec| rec.dispatch(&pipe, [1, 1, 1], &too_many))
        .unwrap_err();
    assert!(err.to_string().contains("push constants"), "{err}");
    let err = ctx
        .submit_and_wait(|rec| rec.dispatch(&pipe, [1, 1, 1], &[0u8; 6]))
        .unwrap_err();
    assert!(err.to_string().contains("multiple of 4"), "{err}");
    let err = ctx
        .submit_and_wait(|rec| rec.dispatch(&pipe, [u32::MAX, 1, 1], &[]))
        .unwrap_err();
    assert!(err.to_string().contains("device limit"), "{err}");
    assert_eq!(
        ctx.last_submitted(),
        0,
        "failed recordings are not submitted"
    );
    drop(pipe);
    common::finish(ctx);
}

#[test]
fn pipeline_desc_errors() {
    let ctx = common::context();
    let spirv = shader::index_times_three_plus();
    let desc = PipelineDesc {
        name: "bad",
        spirv: &spirv,
        entry: "main",
        push_constant_size: PUSH_SIZE,
        spec_constants: &[],
        storage_buffers: 0,
    };
    let max = ctx.caps().limits.max_push_constants_size;
    let cases = [
        PipelineDesc {
            push_constant_size: max + 4,
            ..desc
        },
        PipelineDesc {
            push_constant_size: 6,
            ..desc
        },
        PipelineDesc {
            spirv: &[1, 2, 3],
            ..desc
        },
        PipelineDesc {
            entry: "ma\0in",
            ..desc
        },
        PipelineDesc {
            spec_constants: &[(0, 1), (0, 2)],
            ..desc
        },
    ];
    for case in &cases {
        let err = ctx.create_pipeline(case).unwrap_err();
        assert!(matches!(err, Error::InvalidPipeline { .. }), "{err}");
    }
    common::finish(ctx);
}
