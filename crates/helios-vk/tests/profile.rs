// The timestamp profiler, driven the way the encoder will drive it, through command buffers
// recorded here with raw Vulkan calls: counts per kernel equal the dispatches recorded,
// durations are non-zero, only completed batches are read, the query ring wraps and reuses
// its pools, a discarded batch is forgotten (and its pool reset again), all with validation
// silent.

mod common;

use ash::vk;
use common::shader::{self, PUSH_SIZE};
use common::LockExt;
use helios_vk::{
    Buffer, Context, ContextOptions, MemoryLocation, Pipeline, PipelineCacheDir, PipelineDesc,
    Profiler, QUERIES_PER_POOL,
};
use std::sync::Arc;

const WORKGROUP: u32 = 64;

/// One test at a time: each makes its own Vulkan device and submits raw command buffers,
/// and lavapipe with the validation layer once crashed (SIGSEGV) with several of these
/// running at once on a loaded 2-core machine.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.locked()
}
const WIDE: u32 = 1 << 16;

fn profiled_context() -> Arc<Context> {
    let instance = common::instance();
    let adapters = instance.adapters().expect("enumerate adapters");
    let adapter = helios_vk::select_adapter_from_env(&adapters).expect("select adapter");
    let options = ContextOptions {
        pipeline_cache: PipelineCacheDir::Disabled,
        profile: true,
        ..ContextOptions::default()
    };
    Context::with_options(instance.clone(), adapter, &options).expect("create context")
}

fn pipeline(ctx: &Arc<Context>) -> Arc<Pipeline> {
    let spirv = shader::index_times_three_plus();
    ctx.create_pipeline(&PipelineDesc {
        name: "index_times_three_plus",
        spirv: &spirv,
        entry: "main",
        push_constant_size: PUSH_SIZE,
        spec_constants: &[(0, WORKGROUP), (1, 1), (2, 1)],
        storage_buffers: 0,
    })
    .unwrap()
}

/// Records a command buffer with `record`, submits it on the Context's queue and waits.
/// Stands in for the encoder, which owns the real command buffers.
fn record_and_run(ctx: &Context, submit: bool, record: impl FnOnce(vk::CommandBuffer)) {
    let device = ctx.raw_device();
    // SAFETY: test-local pool, buffer and fence, destroyed below after the wait; nothing
    // else uses this Context's queue meanwhile.
    unsafe {
        let pool_info =
            vk::CommandPoolCreateInfo::default().queue_family_index(ctx.queue_family_index());
        let pool = device.create_command_pool(&pool_info, None).unwrap();
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        let cb = device.allocate_command_buffers(&alloc).unwrap()[0];
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        device.begin_command_buffer(cb, &begin).unwrap();
        barrier(device, cb);
        record(cb);
        let to_host = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ);
        device.cmd_pipeline_barrier(
            cb,
            vk::PipelineStageFlags::COMPUTE_SHADER,
            vk::PipelineStageFlags::HOST,
            vk::DependencyFlags::empty(),
            &[to_host],
            &[],
            &[],
        );
        device.end_command_buffer(cb).unwrap();
        if submit {
            let fence = device
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .unwrap();
            let queue = device.get_device_queue(ctx.queue_family_index(), 0);
            let cbs = [cb];
            let info = vk::SubmitInfo::default().command_buffers(&cbs);
            device.queue_submit(queue, &[info], fence).unwrap();
            device.wait_for_fences(&[fence], true, u64::MAX).unwrap();
            device.destroy_fence(fence, None);
        }
        device.destroy_command_pool(pool, None);
    }
}

/// Compute and transfer writes before → compute reads and writes after.
fn barrier(device: &ash::Device, cb: vk::CommandBuffer) {
    use vk::{AccessFlags as A, PipelineStageFlags as S};
    let b = vk::MemoryBarrier::default()
        .src_access_mask(A::SHADER_WRITE | A::TRANSFER_WRITE)
        .dst_access_mask(A::SHADER_READ | A::SHADER_WRITE);
    // SAFETY: `cb` is recording.
    unsafe {
        device.cmd_pipeline_barrier(
            cb,
            S::COMPUTE_SHADER | S::TRANSFER,
            S::COMPUTE_SHADER,
            vk::DependencyFlags::empty(),
            &[b],
            &[],
            &[],
        )
    };
}

/// One profiled dispatch writing `n` elements of `buf` (n = 0 writes nothing).
fn timed_dispatch(
    ctx: &Context,
    profiler: &Profiler,
    cb: vk::CommandBuffer,
    name: &str,
    pipe: &Pipeline,
    buf: &Buffer,
    n: u32,
) {
    let device = ctx.raw_device();
    let push = shader::push_constants(buf.device_address(), 1, n);
    // SAFETY: `cb` is recording on this Context's compute queue family; the pipeline and
    // buffer outlive the wait in `record_and_run`.
    unsafe {
        let span = profiler.begin(cb, name).expect("the ring has room");
        device.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipe.raw());
        device.cmd_push_constants(cb, pipe.layout(), vk::ShaderStageFlags::COMPUTE, 0, &push);
        device.cmd_dispatch(cb, n.div_ceil(WORKGROUP).max(1), 1, 1);
        profiler.end(cb, span);
    }
}

fn row<'a>(report: &'a helios_vk::ProfileReport, name: &str) -> &'a helios_vk::ProfileRow {
    report
        .rows
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no row {name} in\n{report}"))
}

#[test]
fn spans_per_kernel_from_completed_batches() {
    let _one = serial();
    let ctx = profiled_context();
    let Some(profiler) = ctx.profiler() else {
        eprintln!("SKIPPED: {} has no timestamps", ctx.adapter().name());
        return;
    };
    let pipe = pipeline(&ctx);
    let buf = ctx
        .create_buffer(u64::from(WIDE) * 4, MemoryLocation::HostVisible)
        .unwrap();

    record_and_run(&ctx, true, |cb| {
        for i in 0..9 {
            let (name, n) = if i % 3 == 2 {
                ("narrow", 64)
            } else {
                ("wide", WIDE)
            };
            timed_dispatch(&ctx, profiler, cb, name, &pipe, &buf, n);
            barrier(ctx.raw_device(), cb);
        }
    });
    profiler.submitted(1);
    record_and_run(&ctx, true, |cb| {
        for _ in 0..4 {
            timed_dispatch(&ctx, profiler, cb, "wide", &pipe, &buf, WIDE);
            barrier(ctx.raw_device(), cb);
        }
    });
    profiler.submitted(2);

    // Nothing is read before its batch is known complete.
    profiler.collect(0).unwrap();
    let report = profiler.report();
    assert!(report.rows.is_empty());
    assert_eq!(report.pending_spans, 13);

    profiler.collect(1).unwrap();
    let report = profiler.report();
    assert_eq!(row(&report, "wide").count, 6);
    assert_eq!(row(&report, "narrow").count, 3);
    assert_eq!(report.pending_spans, 4);

    profiler.collect(2).unwrap();
    let report = profiler.report();
    eprintln!("{report}");
    assert_eq!(report.pending_spans, 0);
    assert_eq!(report.dropped_spans, 0);
    let (wide, narrow) = (row(&report, "wide"), row(&report, "narrow"));
    assert_eq!((wide.count, narrow.count), (10, 3));
    for r in &report.rows {
        assert!(r.min_ns > 0 && r.min_ns <= r.max_ns, "{r:?}");
        assert!(r.total_ns >= r.count * r.min_ns, "{r:?}");
        assert!((r.mean_ns - r.total_ns as f64 / r.count as f64).abs() < 1e-6);
        // Plausible: no tiny dispatch takes a minute, even on a CPU.
        assert!(r.max_ns < 60_000_000_000, "{r:?}");
    }
    // No timing comparisons between kernels: tests never depend on speed (a loaded CI
    // machine reorders them).
    assert!(report
        .rows
        .windows(2)
        .all(|w| w[0].total_ns >= w[1].total_ns));
    let shares: f64 = report.rows.iter().map(|r| r.share).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{shares}");
    let table = report.to_string();
    assert!(table.contains("wide") && table.contains("narrow") && table.contains("mean µs"));

    // The last dispatch ran: the profiler did not disturb the work.
    let mut bytes = vec![0u8; 8];
    ctx.download(&buf, 4, &mut bytes).unwrap();
    assert_eq!(bytes, [4, 0, 0, 0, 7, 0, 0, 0]);

    profiler.reset();
    assert!(profiler.report().rows.is_empty());
    // Through the Context: collects up to its completed value; nothing left to read.
    assert!(ctx.profile_report().unwrap().unwrap().rows.is_empty());
    drop((pipe, buf));
    common::finish(ctx);
}

#[test]
fn ring_wraps_and_reuses_pools() {
    let _one = serial();
    let ctx = profiled_context();
    let Some(profiler) = ctx.profiler() else {
        return;
    };
    let pipe = pipeline(&ctx);
    let buf = ctx.create_buffer(4, MemoryLocation::DeviceLocal).unwrap();
    // More spans than one pool holds, so a second pool is reset mid-command-buffer.
    let per_batch = QUERIES_PER_POOL as u64 / 2 + 1000;
    // A batch of 1.5 pools spreads over at most 3 (the tail of the active one, one whole,
    // the start of another); without reuse, 6 batches would need 9 or more.
    for value in 1..=6u64 {
        record_and_run(&ctx, true, |cb| {
            for _ in 0..per_batch {
                // n = 0: nothing written, so independent dispatches need no barrier.
                timed_dispatch(&ctx, profiler, cb, "empty", &pipe, &buf, 0);
            }
        });
        profiler.submitted(value);
        profiler.collect(value).unwrap();
        let report = profiler.report();
        assert_eq!(row(&report, "empty").count, per_batch * value);
        assert_eq!(report.pending_spans, 0);
        assert!(profiler.query_pools() <= 3, "pools are reused, not added");
    }
    drop((pipe, buf));
    common::finish(ctx);
}

#[test]
fn discarded_batch_is_forgotten() {
    let _one = serial();
    let ctx = profiled_context();
    let Some(profiler) = ctx.profiler() else {
        return;
    };
    let pipe = pipeline(&ctx);
    let buf = ctx.create_buffer(4, MemoryLocation::DeviceLocal).unwrap();
    // The first batch takes the first pool and records its reset, then is thrown away:
    // the next batch must reset that pool again (validation checks it at submit).
    record_and_run(&ctx, false, |cb| {
        for _ in 0..3 {
            timed_dispatch(&ctx, profiler, cb, "lost", &pipe, &buf, 0);
        }
    });
    profiler.discarded();
    record_and_run(&ctx, true, |cb| {
        timed_dispatch(&ctx, profiler, cb, "kept", &pipe, &buf, 0);
    });
    profiler.submitted(1);
    profiler.collect(1).unwrap();
    let report = profiler.report();
    assert_eq!(report.rows.len(), 1, "{report}");
    assert_eq!(row(&report, "kept").count, 1);
    drop((pipe, buf));
    common::finish(ctx);
}

#[test]
fn off_unless_asked() {
    let _one = serial();
    let ctx = common::context();
    assert!(ctx.profiler().is_none());
    assert_eq!(ctx.profile_report().unwrap(), None);
    common::finish(ctx);
}
