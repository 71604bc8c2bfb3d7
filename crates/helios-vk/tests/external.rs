// Sharing with another API: exported memory read and written through an fd imported into a
// second device, regions used like any buffer (kernels, hazards, drops), and external
// timelines ordering the queues. A second Context on the same GPU stands in for CUDA.
//
// lavapipe (Mesa 22.3) exports memory but offers no VK_KHR_external_semaphore_fd: there the
// timeline tests run with `create_timeline` (the same ordering, signalled from the host) and
// the fd test of timelines says it is skipped; the GPU runs all of it.

mod common;

use std::os::fd::IntoRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::shader::{self, PUSH_SIZE};
use helios_vk::{
    vk, Access, Buffer, Context, ContextOptions, Error, ExportedMemory, ExternalTimeline,
    MemoryLocation, PipelineDesc, BUFFER_USAGE,
};

const N: u32 = 1000;
const WORKGROUP: u32 = 64;

fn pipeline(ctx: &Arc<Context>) -> Arc<helios_vk::Pipeline> {
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

/// Records `buf[i] = 3i + add` for the first `n` u32s of `buf`.
fn fill(ctx: &Context, pipe: &Arc<helios_vk::Pipeline>, buf: &Buffer, add: u32, n: u32) {
    let push = shader::push_constants(buf.device_address(), add, n);
    let access = Access::write(buf).range(0, u64::from(n) * 4);
    ctx.dispatch(pipe, [n.div_ceil(WORKGROUP), 1, 1], &push, &[access])
        .unwrap();
}

fn read_u32s(ctx: &Arc<Context>, buf: &Buffer, offset: u64, n: usize) -> Vec<u32> {
    let mut bytes = vec![0u8; n * 4];
    ctx.download(buf, offset, &mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn expected(add: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| i * 3 + add).collect()
}

/// Whether `ctx` exports memory; where not, checks that `export_memory` says why.
fn exports_memory(ctx: &Arc<Context>) -> bool {
    if ctx.enabled().export_memory {
        return true;
    }
    let err = ctx.export_memory(4096).unwrap_err();
    assert!(matches!(err, Error::ExportUnsupported { .. }), "{err}");
    assert!(
        err.to_string().contains("VK_KHR_external_memory_fd"),
        "{err}"
    );
    eprintln!("SKIPPED: {} cannot export memory: {err}", ctx.caps().name);
    false
}

/// Timelines to test ordering with: a host-only one always, an exported one where the
/// driver has them (elsewhere, checks the error that says why).
fn timelines(ctx: &Context) -> Vec<ExternalTimeline> {
    let mut out = vec![ctx.create_timeline().unwrap()];
    match ctx.export_timeline() {
        Ok(t) => out.push(t),
        Err(e) => {
            assert!(!ctx.enabled().export_timeline);
            assert!(
                e.to_string().contains("VK_KHR_external_semaphore_fd"),
                "{e}"
            );
            eprintln!(
                "note: {} cannot export timelines ({e}); ordering is tested with a host-only one",
                ctx.caps().name
            );
        }
    }
    out
}

/// Polls `done` for up to 10 s.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// A context whose host waits poll for 5 s before blocking in vkWaitSemaphores: the
/// validation layer 1.3.239 stalls 10 s there and reports a timeout ("most likely a
/// validation bug") when one thread blocks while another signals the semaphore the GPU work
/// waits for (Vulkan-ValidationLayers #4649, reworked in 2024).
fn polling_context() -> Arc<Context> {
    common::context_with(&ContextOptions {
        spin_us: Some(5_000_000),
        ..ContextOptions::default()
    })
}

// ---------------------------------------------------------------- exported memory

/// An exported allocation imported into a second device, with a buffer made as the
/// exporter's was (the spec wants identical buffers for dedicated opaque-fd imports).
struct Imported {
    ctx: Arc<Context>,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
}

impl Imported {
    fn new(ctx: Arc<Context>, mem: &ExportedMemory) -> Imported {
        let device = ctx.raw_device();
        let (_, buffer_size) = mem.raw_buffer();
        let families = ctx.queue_families();
        let mut external = vk::ExternalMemoryBufferCreateInfo::default()
            .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        let mut info = vk::BufferCreateInfo::default()
            .size(buffer_size)
            .usage(BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut external);
        if families.len() > 1 {
            info = info
                .sharing_mode(vk::SharingMode::CONCURRENT)
                .queue_family_indices(&families);
        }
        let buffer = unsafe { device.create_buffer(&info, None) }.unwrap();
        let fd = mem.fd().unwrap();
        let mut import = vk::ImportMemoryFdInfoKHR::default()
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD)
            .fd(fd.into_raw_fd()); // the driver owns it once the import succeeds
        let mut dedicated = vk::MemoryDedicatedAllocateInfo::default().buffer(buffer);
        let mut flags =
            vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(mem.allocation_size())
            .memory_type_index(mem.memory_type_index())
            .push_next(&mut import)
            .push_next(&mut dedicated)
            .push_next(&mut flags);
        let memory = unsafe { device.allocate_memory(&alloc, None) }.unwrap();
        unsafe { device.bind_buffer_memory(buffer, memory, 0) }.unwrap();
        Imported {
            ctx,
            buffer,
            memory,
        }
    }

    /// Copies `len` bytes between raw buffers on this device's queue and waits (the Context
    /// is idle meanwhile, so using its queue directly is safe).
    fn copy(&self, src: (vk::Buffer, u64), dst: (vk::Buffer, u64), len: u64) {
        let device = self.ctx.raw_device();
        let family = self.ctx.queue_family_index();
        unsafe {
            let queue = device.get_device_queue(family, 0);
            let pool = device
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default().queue_family_index(family),
                    None,
                )
                .unwrap();
            let cb = device
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )
                .unwrap()[0];
            device
                .begin_command_buffer(cb, &vk::CommandBufferBeginInfo::default())
                .unwrap();
            let barrier = |src_stage, src_access, dst_stage, dst_access| {
                let b = vk::MemoryBarrier::default()
                    .src_access_mask(src_access)
                    .dst_access_mask(dst_access);
                device.cmd_pipeline_barrier(
                    cb,
                    src_stage,
                    dst_stage,
                    vk::DependencyFlags::empty(),
                    &[b],
                    &[],
                    &[],
                );
            };
            use vk::{AccessFlags as A, PipelineStageFlags as S};
            barrier(
                S::ALL_COMMANDS,
                A::MEMORY_WRITE,
                S::TRANSFER,
                A::TRANSFER_READ | A::TRANSFER_WRITE,
            );
            let region = vk::BufferCopy {
                src_offset: src.1,
                dst_offset: dst.1,
                size: len,
            };
            device.cmd_copy_buffer(cb, src.0, dst.0, &[region]);
            barrier(S::TRANSFER, A::TRANSFER_WRITE, S::HOST, A::HOST_READ);
            device.end_command_buffer(cb).unwrap();
            let fence = device
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .unwrap();
            let cbs = [cb];
            let submit = vk::SubmitInfo::default().command_buffers(&cbs);
            device.queue_submit(queue, &[submit], fence).unwrap();
            device.wait_for_fences(&[fence], true, u64::MAX).unwrap();
            device.destroy_fence(fence, None);
            device.destroy_command_pool(pool, None);
        }
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        let device = self.ctx.raw_device();
        unsafe {
            device.destroy_buffer(self.buffer, None);
            device.free_memory(self.memory, None);
        }
    }
}

#[test]
fn exported_memory_is_read_and_written_through_its_fd_on_another_device() {
    let ctx = common::context();
    if !exports_memory(&ctx) {
        return common::finish(ctx);
    }
    let caps = &ctx.caps().external;
    assert!(caps.memory_fd && caps.memory.exportable && caps.memory.importable);
    assert_eq!(ctx.caps().device_uuid_bytes.len(), 16);
    assert_eq!(
        ctx.caps().device_uuid,
        ctx.caps()
            .device_uuid_bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let pool_before = ctx.memory_stats();
    let size: u64 = 3 * 4096 + 100;
    let mem = ctx.export_memory(size).unwrap();
    assert!(mem.dedicated());
    assert_eq!(mem.size(), size);
    assert!(mem.allocation_size() >= size);
    assert_eq!(mem.raw_buffer().1, size.next_multiple_of(256));
    assert_eq!(ctx.memory_stats().bytes_exported, mem.allocation_size());

    // Two regions written with the context's upload, read through a third that spans both.
    let align = mem.alignment();
    assert!(align >= 256 && align.is_power_of_two());
    let (a_at, b_at) = (0, 2 * 4096);
    let a = mem.region(a_at, 4096).unwrap();
    let b = mem.region(b_at, 4096 + 100).unwrap();
    let (data_a, data_b) = (common::random_bytes(4096, 1), common::random_bytes(4196, 2));
    ctx.upload(&a, 0, &data_a).unwrap();
    ctx.upload(&b, 0, &data_b).unwrap();
    let whole = mem.region(0, size).unwrap();
    assert_eq!(whole.device_address(), mem.device_address());
    assert_eq!(b.device_address(), mem.device_address() + b_at);
    let mut seen = vec![0u8; size as usize];
    ctx.download(&whole, 0, &mut seen).unwrap();
    assert!(seen[..4096] == data_a[..] && seen[b_at as usize..] == data_b[..]);

    // The fd imported into another device sees those bytes...
    let other = Imported::new(common::context(), &mem);
    let stage = other
        .ctx
        .create_buffer(size, MemoryLocation::HostVisible)
        .unwrap();
    other.copy((other.buffer, 0), (stage.raw(), stage.offset()), size);
    let mut imported = vec![0u8; size as usize];
    other.ctx.download(&stage, 0, &mut imported).unwrap();
    assert!(
        imported == seen,
        "the import reads other bytes than were uploaded"
    );
    // ...and what it writes (CUDA's all-reduce result) is what this context reads.
    let reduced = common::random_bytes(4096, 3);
    other.ctx.upload(&stage, 0, &reduced).unwrap();
    other.copy((stage.raw(), stage.offset()), (other.buffer, 4096), 4096);
    let mut back = vec![0u8; 4096];
    ctx.download(&mem.region(4096, 4096).unwrap(), 0, &mut back)
        .unwrap();
    assert!(
        back == reduced,
        "a write through the import is not seen by the exporter"
    );
    let other_ctx = Arc::clone(&other.ctx);
    drop((stage, other));
    common::finish(other_ctx);

    // The memory lives while a region does, and never passes through the pool.
    drop(mem);
    assert!(ctx.memory_stats().bytes_exported > 0);
    ctx.download(&a, 0, &mut back).unwrap();
    assert!(back == data_a);
    drop((a, b, whole));
    let after = ctx.memory_stats();
    assert_eq!(after.bytes_exported, 0);
    assert_eq!(after.bytes_in_use, pool_before.bytes_in_use);
    common::finish(ctx);
}

#[test]
fn regions_must_be_aligned_and_inside() {
    let ctx = common::context();
    if !exports_memory(&ctx) {
        return common::finish(ctx);
    }
    let mem = ctx.export_memory(10_000).unwrap();
    let align = mem.alignment();
    for offset in [1, 100, align / 2, align + 4] {
        let err = mem.region(offset, 16).unwrap_err();
        assert!(matches!(err, Error::Misaligned { .. }), "{err}");
        assert!(
            err.to_string().contains(&format!("multiple of {align}")),
            "{err}"
        );
    }
    for (offset, len) in [(0, 10_001), (align * 39, 1000), (u64::MAX - 255, 300)] {
        let offset = offset / align * align;
        let err = mem.region(offset, len).unwrap_err();
        assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
    }
    // The last byte, and empty regions inside, are fine.
    let last = 10_000 / align * align;
    assert_eq!(
        mem.region(last, 10_000 - last).unwrap().size(),
        10_000 - last
    );
    assert_eq!(mem.region(align, 0).unwrap().size(), 0);
    drop(mem);
    common::finish(ctx);
}

#[test]
fn kernels_write_regions_with_barriers_only_where_regions_overlap() {
    let ctx = common::context();
    if !exports_memory(&ctx) {
        return common::finish(ctx);
    }
    let pipe = pipeline(&ctx);
    let bytes = u64::from(N) * 4;
    let mem = ctx.export_memory(4 * bytes).unwrap();
    let at = |i: u64| (i * bytes).next_multiple_of(mem.alignment());
    let whole = mem.region(0, 4 * bytes).unwrap();
    let (r0, r1, r2) = (
        mem.region(at(0), bytes).unwrap(),
        mem.region(at(1), bytes).unwrap(),
        mem.region(at(2), bytes).unwrap(),
    );
    let barriers = || ctx.encoder_stats().barriers;
    {
        // One batch, so the encoder's barriers are all there is between the kernels.
        let _hold = ctx.hold_submits();
        fill(&ctx, &pipe, &whole, 100, 4 * N);
        let b0 = barriers();
        fill(&ctx, &pipe, &r1, 1, N); // inside `whole`: write after write
        fill(&ctx, &pipe, &r2, 2, N); // disjoint from r1; `whole` is fenced already
        ctx.flush().unwrap();
        // (Kernels reach memory through device addresses, which sync validation does not
        // see: the barrier count is the check.)
        let added = barriers() - b0;
        assert_eq!(
            added, 1,
            "one barrier after the whole-arena write, none between regions"
        );
    }
    fill(&ctx, &pipe, &r0, 0, N);
    assert_eq!(read_u32s(&ctx, &r0, 0, N as usize), expected(0, N));
    assert_eq!(read_u32s(&ctx, &r1, 0, N as usize), expected(1, N));
    assert_eq!(read_u32s(&ctx, &r2, 0, N as usize), expected(2, N));
    // Bytes past r2 keep the whole-arena kernel's values.
    let first = ((at(2) + bytes) / 4) as u32;
    let tail = read_u32s(&ctx, &whole, at(2) + bytes, (4 * N - first) as usize);
    let want: Vec<u32> = (first..4 * N).map(|i| i * 3 + 100).collect();
    assert!(
        tail == want,
        "bytes no region wrote lost the whole-arena kernel's values"
    );
    // The copy of a region into an ordinary buffer is ordered after the writes.
    let copy = ctx
        .create_buffer(bytes, MemoryLocation::DeviceLocal)
        .unwrap();
    fill(&ctx, &pipe, &r1, 7, N);
    let mut host = vec![0u8; bytes as usize];
    ctx.download(&r1, 0, &mut host).unwrap();
    ctx.upload(&copy, 0, &host).unwrap();
    assert_eq!(read_u32s(&ctx, &copy, 0, N as usize), expected(7, N));
    // (Sync validation reports any hazard the encoder missed: checked by `finish`.)
    drop((whole, r0, r1, r2, mem, copy));
    common::finish(ctx);
}

#[test]
fn dropping_an_export_in_use_waits_for_the_gpu() {
    let ctx = common::context();
    if !exports_memory(&ctx) {
        return common::finish(ctx);
    }
    let pipe = pipeline(&ctx);
    for _ in 0..3 {
        let mem = ctx.export_memory(u64::from(N) * 4).unwrap();
        let r = mem.region(0, u64::from(N) * 4).unwrap();
        // Recorded, not submitted: freeing the memory now would be a use after free, which
        // the validation layer reports.
        let hold = ctx.hold_submits();
        fill(&ctx, &pipe, &r, 3, N);
        drop(hold);
        let v = r.last_write();
        assert!(v > ctx.completed().unwrap());
        drop((mem, r));
        assert!(
            ctx.completed().unwrap() >= v,
            "the drop did not wait for the kernel"
        );
        assert_eq!(ctx.memory_stats().bytes_exported, 0);
    }
    common::finish(ctx);
}

// ---------------------------------------------------------------- external timelines

#[test]
fn work_recorded_after_wait_external_waits_for_the_value() {
    let ctx = polling_context();
    let pipe = pipeline(&ctx);
    for t in timelines(&ctx) {
        let buf = ctx
            .create_buffer(u64::from(N) * 4, MemoryLocation::DeviceLocal)
            .unwrap();
        // Recorded before the wait: runs without it.
        fill(&ctx, &pipe, &buf, 1, N);
        let before = buf.last_write();
        ctx.wait_external(&t, 1).unwrap();
        assert!(
            eventually(|| ctx.completed().unwrap() >= before),
            "work recorded before wait_external waited"
        );
        // Recorded after: waits for the value, on the GPU.
        fill(&ctx, &pipe, &buf, 2, N);
        let after = buf.last_write();
        ctx.flush().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let early = ctx.completed().unwrap() >= after;
        t.signal(1).unwrap(); // before asserting, so a failure cannot hang the drop
        assert!(
            !early,
            "work recorded after wait_external ran before the value"
        );
        ctx.wait(after).unwrap();
        assert_eq!(read_u32s(&ctx, &buf, 0, N as usize), expected(2, N));

        // A read-back of such work blocks until the value arrives (from another thread).
        ctx.wait_external(&t, 2).unwrap();
        fill(&ctx, &pipe, &buf, 3, N);
        let start = Instant::now();
        let seen = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                t.signal(2).unwrap();
            });
            read_u32s(&ctx, &buf, 0, N as usize)
        });
        assert!(start.elapsed() >= Duration::from_millis(150));
        assert_eq!(seen, expected(3, N));

        // A value already reached costs nothing; later batches do not wait again.
        ctx.wait_external(&t, 2).unwrap();
        fill(&ctx, &pipe, &buf, 4, N);
        assert_eq!(read_u32s(&ctx, &buf, 0, N as usize), expected(4, N));
        ctx.synchronize().unwrap();
    }
    finish_tolerating_layer_stall(ctx);
}

/// `common::finish`, except for the one message the validation layer 1.3.239 reports when a
/// thread waits on work that another thread's host signal releases (see `polling_context`):
/// polling narrows the window but a loaded CI machine still hit it once, and the message
/// itself says "most likely a validation bug". Every other message still fails the test.
fn finish_tolerating_layer_stall(ctx: Arc<Context>) {
    const LAYER_STALL: &str = "UNASSIGNED-VkSemaphore-state-timeout";
    let instance = Arc::clone(ctx.instance());
    drop(ctx);
    let messages = instance.validation_messages();
    let others: Vec<&String> = messages
        .iter()
        .filter(|m| !m.contains(LAYER_STALL))
        .collect();
    assert!(
        others.is_empty(),
        "{} validation message(s):\n{}",
        others.len(),
        messages.join("\n")
    );
    if others.len() < messages.len() {
        eprintln!("note: the validation layer reported its timeline stall ({LAYER_STALL})");
    }
}

#[test]
fn signal_external_follows_the_work_before_it() {
    let ctx = common::context();
    let pipe = pipeline(&ctx);
    for t in timelines(&ctx) {
        let buf = ctx
            .create_buffer(u64::from(N) * 4, MemoryLocation::DeviceLocal)
            .unwrap();
        let staged = ctx
            .create_buffer(u64::from(N) * 4, MemoryLocation::DeviceLocal)
            .unwrap();
        fill(&ctx, &pipe, &buf, 9, N);
        let v = buf.last_write();
        // A staged upload (on the copy queue, where there is one) is covered too.
        let data: Vec<u8> = expected(5, N)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        ctx.upload(&staged, 0, &data).unwrap();
        ctx.signal_external(&t, 5).unwrap();
        assert!(
            t.wait(5, Duration::from_secs(10)).unwrap(),
            "never signalled"
        );
        assert!(t.value().unwrap() >= 5);
        assert!(
            ctx.completed().unwrap() >= v,
            "signalled before the work before it"
        );
        assert_eq!(read_u32s(&ctx, &buf, 0, N as usize), expected(9, N));
        assert_eq!(read_u32s(&ctx, &staged, 0, N as usize), expected(5, N));
        // Nothing recorded: an empty batch signals.
        ctx.signal_external(&t, 6).unwrap();
        assert!(t.wait(6, Duration::from_secs(10)).unwrap());
        // Values only increase, whoever signals.
        for bad in [0, 3, 6] {
            let err = ctx.signal_external(&t, bad).unwrap_err();
            assert!(matches!(err, Error::TimelineValue { .. }), "{err}");
            assert!(matches!(t.signal(bad), Err(Error::TimelineValue { .. })));
        }
        // A host wait that times out says so.
        assert!(!t.wait(7, Duration::from_millis(10)).unwrap());
        // Signal, then wait for the same value: the GPU orders its own work through it.
        fill(&ctx, &pipe, &buf, 10, N);
        ctx.signal_external(&t, 7).unwrap();
        ctx.wait_external(&t, 7).unwrap();
        fill(&ctx, &pipe, &buf, 11, N);
        assert_eq!(read_u32s(&ctx, &buf, 0, N as usize), expected(11, N));
        ctx.synchronize().unwrap();
    }
    // A timeline of another context is refused.
    let other = common::context();
    let foreign = other.create_timeline().unwrap();
    for err in [
        ctx.signal_external(&foreign, 1).unwrap_err(),
        ctx.wait_external(&foreign, 1).unwrap_err(),
    ] {
        assert!(matches!(err, Error::ForeignObject { .. }), "{err}");
    }
    drop(foreign);
    common::finish(other);
    common::finish(ctx);
}

#[test]
fn exported_timeline_orders_two_devices() {
    // Each side's validation layer sees only its own signals of the shared semaphore; host
    // waits poll so that the 1.3.239 layer's blocking-wait tracking is not involved.
    let ctx = polling_context();
    let host_only = ctx.create_timeline().unwrap();
    assert!(!host_only.is_exportable());
    let err = host_only.fd().unwrap_err();
    assert!(matches!(err, Error::ExportUnsupported { .. }), "{err}");
    if !ctx.enabled().export_timeline {
        let x = &ctx.caps().external;
        eprintln!(
            "SKIPPED: {} cannot export timeline semaphores (VK_KHR_external_semaphore_fd \
             listed: {}, exportable: {}); run this test on a GPU",
            ctx.caps().name,
            x.semaphore_fd,
            x.timeline.exportable
        );
        drop(host_only);
        return common::finish(ctx);
    }
    let t = ctx.export_timeline().unwrap();
    assert!(t.is_exportable());
    // The second device imports it as CUDA would, and each side orders the other.
    let other = polling_context();
    let imported = other.import_timeline(t.fd().unwrap()).unwrap();
    let wait_other = |value: u64| imported.wait(value, Duration::from_secs(10)).unwrap();
    let pipe = pipeline(&ctx);
    let buf = ctx
        .create_buffer(u64::from(N) * 4, MemoryLocation::DeviceLocal)
        .unwrap();
    fill(&ctx, &pipe, &buf, 1, N);
    let v = buf.last_write();
    ctx.signal_external(&t, 1).unwrap();
    assert!(wait_other(1), "the importer never saw the signal");
    assert!(ctx.completed().unwrap() >= v);
    // The importer signals 2 (as CUDA's all-reduce would); work waiting for it then runs.
    ctx.wait_external(&t, 2).unwrap();
    fill(&ctx, &pipe, &buf, 2, N);
    let after = buf.last_write();
    ctx.flush().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let early = ctx.completed().unwrap() >= after;
    imported.signal(2).unwrap();
    assert!(!early, "work ran before the importer's signal");
    assert_eq!(read_u32s(&ctx, &buf, 0, N as usize), expected(2, N));
    // And the importer's GPU work waits for this side's signal, in the other direction.
    let obuf = other
        .create_buffer(u64::from(N) * 4, MemoryLocation::DeviceLocal)
        .unwrap();
    let opipe = pipeline(&other);
    other.wait_external(&imported, 3).unwrap();
    fill(&other, &opipe, &obuf, 3, N);
    let oafter = obuf.last_write();
    other.flush().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let early = other.completed().unwrap() >= oafter;
    ctx.signal_external(&t, 3).unwrap();
    assert!(
        !early,
        "the importer's work ran before the exporter's signal"
    );
    assert_eq!(read_u32s(&other, &obuf, 0, N as usize), expected(3, N));
    ctx.synchronize().unwrap();
    other.synchronize().unwrap();
    drop((t, host_only, imported, obuf, opipe));
    common::finish(other);
    common::finish(ctx);
}
