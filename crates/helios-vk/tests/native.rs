// Native kernels (PTX through VK_NVX_binary_import): the clear error where a device lacks the
// extension (lavapipe), and on NVIDIA GPUs PTX kernels launched through the encoder, chained
// by its hazard barriers, mixed with SPIR-V dispatches, through a Recorder, profiled, and
// refused when their arguments would record nonsense. GPU tests skip with a message on
// devices without the extension.

mod common;

use common::shader::{self, PUSH_SIZE};
use helios_vk::{
    Access, Buffer, Context, ContextOptions, Error, MemoryLocation, NativeArg, NativeKernel,
    PipelineCacheDir, PipelineDesc,
};
use std::sync::Arc;

/// Elements per vector: 2^18 + 3, so the last block is partial.
const N: usize = 262_147;
/// Words past the end of each output that no launch may touch.
const GUARD: usize = 61;
const SENTINEL: u32 = 0xDEAD_BEEF;
const BLOCK: u32 = 256;

/// Three kernels for any recent NVIDIA GPU. Parameters follow the CUDA convention the
/// encoder uses: 64-bit device addresses and 32-bit scalars, in `.param` order.
///   vadd_f32(a, b, c: u64, n: u32)   c[i] = a[i] + b[i]
///   vadd_u32(a, b, c: u64, n: u32)   c[i] = a[i] + b[i] (wrapping)
///   scale_shift(x: u64, n: u32, y: u64, s: f32, t: s32)   y[i] = x[i] * s + t
/// (scale_shift mixes sizes, so its u64 after a u32 sits at offset 16, not 12.)
const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry vadd_f32(
    .param .u64 vaddf_a,
    .param .u64 vaddf_b,
    .param .u64 vaddf_c,
    .param .u32 vaddf_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<8>;
    .reg .f32   %f<4>;
    .reg .b64   %rd<12>;

    ld.param.u64        %rd1, [vaddf_a];
    ld.param.u64        %rd2, [vaddf_b];
    ld.param.u64        %rd3, [vaddf_c];
    ld.param.u32        %r1, [vaddf_n];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mad.lo.u32          %r5, %r2, %r3, %r4;
    setp.ge.u32         %p1, %r5, %r1;
    @%p1 bra            $L_vaddf_done;
    cvta.to.global.u64  %rd4, %rd1;
    cvta.to.global.u64  %rd5, %rd2;
    cvta.to.global.u64  %rd6, %rd3;
    mul.wide.u32        %rd7, %r5, 4;
    add.s64             %rd8, %rd4, %rd7;
    add.s64             %rd9, %rd5, %rd7;
    add.s64             %rd10, %rd6, %rd7;
    ld.global.f32       %f1, [%rd8];
    ld.global.f32       %f2, [%rd9];
    add.rn.f32          %f3, %f1, %f2;
    st.global.f32       [%rd10], %f3;
$L_vaddf_done:
    ret;
}

.visible .entry vadd_u32(
    .param .u64 vaddu_a,
    .param .u64 vaddu_b,
    .param .u64 vaddu_c,
    .param .u32 vaddu_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<10>;
    .reg .b64   %rd<12>;

    ld.param.u64        %rd1, [vaddu_a];
    ld.param.u64        %rd2, [vaddu_b];
    ld.param.u64        %rd3, [vaddu_c];
    ld.param.u32        %r1, [vaddu_n];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mad.lo.u32          %r5, %r2, %r3, %r4;
    setp.ge.u32         %p1, %r5, %r1;
    @%p1 bra            $L_vaddu_done;
    cvta.to.global.u64  %rd4, %rd1;
    cvta.to.global.u64  %rd5, %rd2;
    cvta.to.global.u64  %rd6, %rd3;
    mul.wide.u32        %rd7, %r5, 4;
    add.s64             %rd8, %rd4, %rd7;
    add.s64             %rd9, %rd5, %rd7;
    add.s64             %rd10, %rd6, %rd7;
    ld.global.u32       %r6, [%rd8];
    ld.global.u32       %r7, [%rd9];
    add.u32             %r8, %r6, %r7;
    st.global.u32       [%rd10], %r8;
$L_vaddu_done:
    ret;
}

.visible .entry scale_shift(
    .param .u64 ss_x,
    .param .u32 ss_n,
    .param .u64 ss_y,
    .param .f32 ss_s,
    .param .s32 ss_t
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<8>;
    .reg .f32   %f<6>;
    .reg .b64   %rd<8>;

    ld.param.u64        %rd1, [ss_x];
    ld.param.u32        %r1, [ss_n];
    ld.param.u64        %rd2, [ss_y];
    ld.param.f32        %f1, [ss_s];
    ld.param.s32        %r2, [ss_t];
    mov.u32             %r3, %ctaid.x;
    mov.u32             %r4, %ntid.x;
    mov.u32             %r5, %tid.x;
    mad.lo.u32          %r6, %r3, %r4, %r5;
    setp.ge.u32         %p1, %r6, %r1;
    @%p1 bra            $L_ss_done;
    cvta.to.global.u64  %rd3, %rd1;
    cvta.to.global.u64  %rd4, %rd2;
    mul.wide.u32        %rd5, %r6, 4;
    add.s64             %rd6, %rd3, %rd5;
    add.s64             %rd7, %rd4, %rd5;
    ld.global.f32       %f2, [%rd6];
    mul.rn.f32          %f3, %f2, %f1;
    cvt.rn.f32.s32      %f4, %r2;
    add.rn.f32          %f5, %f3, %f4;
    st.global.f32       [%rd7], %f5;
$L_ss_done:
    ret;
}
"#;

/// The context for a GPU test, or `None` (with a visible note) where native kernels are off.
fn native_context(options: Option<&ContextOptions>) -> Option<Arc<Context>> {
    let ctx = match options {
        Some(o) => common::context_with(o),
        None => common::context(),
    };
    if !ctx.enabled().native_kernels {
        eprintln!(
            "SKIPPED: {} has no native kernels (VK_NVX_binary_import not enabled)",
            ctx.adapter().name()
        );
        return None;
    }
    Some(ctx)
}

fn kernel(ctx: &Arc<Context>, entry: &str) -> Arc<NativeKernel> {
    let k = ctx
        .create_native_kernel(PTX, entry, entry)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((k.name(), k.entry()), (entry, entry));
    eprintln!("{entry}: JIT took {:?}", k.jit_time());
    k
}

fn grid(n: usize) -> [u32; 3] {
    [(n as u32).div_ceil(BLOCK), 1, 1]
}

/// A device-local buffer of `N + GUARD` words: `words` then sentinels.
fn vector(ctx: &Arc<Context>, words: impl Iterator<Item = u32>) -> Buffer {
    let mut all: Vec<u32> = words.take(N).collect();
    assert_eq!(all.len(), N);
    all.resize(N + GUARD, SENTINEL);
    let bytes: Vec<u8> = all.iter().flat_map(|w| w.to_le_bytes()).collect();
    let buf = ctx
        .create_buffer(bytes.len() as u64, MemoryLocation::DeviceLocal)
        .unwrap();
    ctx.upload(&buf, 0, &bytes).unwrap();
    buf
}

fn output(ctx: &Arc<Context>) -> Buffer {
    vector(ctx, std::iter::repeat(SENTINEL))
}

/// All `N + GUARD` words; asserts the guard words are untouched.
fn read(ctx: &Arc<Context>, buf: &Buffer) -> Vec<u32> {
    let mut bytes = vec![0u8; (N + GUARD) * 4];
    ctx.download(buf, 0, &mut bytes).unwrap();
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(
        words[N..].iter().all(|&w| w == SENTINEL),
        "a launch wrote past element {N}"
    );
    words
}

fn f32s(n: usize, f: impl Fn(usize) -> f32) -> impl Iterator<Item = u32> {
    (0..n).map(move |i| f(i).to_bits())
}

/// Only the first N elements of a vector are declared: the guards stay unordered.
fn vread(buf: &Buffer) -> Access<'_> {
    Access::read(buf).range(0, N as u64 * 4)
}

fn vwrite(buf: &Buffer) -> Access<'_> {
    Access::write(buf).range(0, N as u64 * 4)
}

fn addr(buf: &Buffer) -> NativeArg {
    NativeArg::buffer(buf)
}

#[test]
fn caps_report_the_extension() {
    let ctx = common::context();
    let caps = ctx.caps();
    assert_eq!(
        caps.features.native_kernels,
        caps.has_extension("VK_NVX_binary_import")
    );
    // Enabled only where offered; with it, the entry points are loaded.
    assert!(!ctx.enabled().native_kernels || caps.features.native_kernels);
    assert_eq!(ctx.enabled().native_kernels, ctx.has_native_kernels());
    common::finish(ctx);
}

#[test]
fn without_the_extension_kernels_are_refused_clearly() {
    let ctx = common::context();
    if ctx.enabled().native_kernels {
        eprintln!("SKIPPED: {} has native kernels", ctx.adapter().name());
        return common::finish(ctx);
    }
    let err = ctx
        .create_native_kernel(PTX, "vadd_f32", "vadd")
        .unwrap_err();
    assert!(matches!(err, Error::NativeUnavailable { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("VK_NVX_binary_import"), "{text}");
    assert!(text.contains(&ctx.caps().name), "{text}");
    common::finish(ctx);
}

#[test]
fn helios_native_0_turns_them_off() {
    let options = ContextOptions {
        native_kernels: false,
        ..ContextOptions::default()
    };
    let ctx = common::context_with(&options);
    assert!(!ctx.enabled().native_kernels && !ctx.has_native_kernels());
    let text = ctx
        .create_native_kernel(PTX, "vadd_f32", "vadd")
        .unwrap_err()
        .to_string();
    let why = match ctx.caps().features.native_kernels {
        true => "HELIOS_NATIVE=0",
        false => "VK_NVX_binary_import",
    };
    assert!(text.contains(why), "{text}");
    common::finish(ctx);
}

/// out = a + b, then out2 = out + b, in one batch: the second launch reads what the first
/// wrote, so the encoder must put a (full) barrier between them. Plus a u32 add and a
/// kernel with mixed parameter sizes in the same batch.
#[test]
fn dependent_launches_in_one_batch() {
    let Some(ctx) = native_context(None) else {
        return;
    };
    let (vadd, vaddu, scale) = (
        kernel(&ctx, "vadd_f32"),
        kernel(&ctx, "vadd_u32"),
        kernel(&ctx, "scale_shift"),
    );
    let a_of = |i: usize| i as f32 * 0.5;
    let b_of = |i: usize| (i % 1000) as f32 - 250.0;
    let (a, b) = (vector(&ctx, f32s(N, a_of)), vector(&ctx, f32s(N, b_of)));
    let ua_of = |i: usize| (i as u32).wrapping_mul(2_654_435_761);
    let ub_of = |i: usize| u32::MAX - i as u32;
    let (ua, ub) = (
        vector(&ctx, (0..N).map(ua_of)),
        vector(&ctx, (0..N).map(ub_of)),
    );
    let (out, out2, uout, scaled) = (output(&ctx), output(&ctx), output(&ctx), output(&ctx));
    ctx.synchronize().unwrap();

    // One batch: no early submit, so every launch lands in the batch being recorded.
    ctx.set_early_submit(false);
    let before = ctx.encoder_stats();
    let n = NativeArg::U32(N as u32);
    ctx.launch_native(
        &vadd,
        grid(N),
        [BLOCK, 1, 1],
        0,
        &[addr(&a), addr(&b), addr(&out), n],
        &[vread(&a), vread(&b), vwrite(&out)],
    )
    .unwrap();
    ctx.launch_native(
        &vadd,
        grid(N),
        [BLOCK, 1, 1],
        0,
        &[addr(&out), addr(&b), addr(&out2), n],
        &[vread(&out), vread(&b), vwrite(&out2)],
    )
    .unwrap();
    ctx.launch_native(
        &vaddu,
        grid(N),
        [BLOCK, 1, 1],
        0,
        &[addr(&ua), addr(&ub), addr(&uout), n],
        &[vread(&ua), vread(&ub), vwrite(&uout)],
    )
    .unwrap();
    ctx.launch_native(
        &scale,
        grid(N),
        [BLOCK, 1, 1],
        0,
        &[
            addr(&out2),
            n,
            addr(&scaled),
            NativeArg::F32(2.0),
            NativeArg::I32(-3),
        ],
        &[vread(&out2), vwrite(&scaled)],
    )
    .unwrap();
    ctx.synchronize().unwrap();
    ctx.set_early_submit(true);
    let after = ctx.encoder_stats();
    assert_eq!(after.batches - before.batches, 1, "{before:?} → {after:?}");
    assert_eq!(after.dispatches - before.dispatches, 4);
    // out → out2 → scaled: two read-after-write hazards; the u32 add is independent.
    assert_eq!(
        after.barriers - before.barriers,
        2,
        "{before:?} → {after:?}"
    );

    // The kernels may be dropped now: the batch that used them has completed.
    drop((vadd, vaddu, scale));
    let (got, got2, gotu, gots) = (
        read(&ctx, &out),
        read(&ctx, &out2),
        read(&ctx, &uout),
        read(&ctx, &scaled),
    );
    for i in 0..N {
        let sum = a_of(i) + b_of(i);
        assert_eq!(f32::from_bits(got[i]), sum, "out[{i}]");
        let sum2 = sum + b_of(i);
        assert_eq!(f32::from_bits(got2[i]), sum2, "out2[{i}]");
        assert_eq!(gotu[i], ua_of(i).wrapping_add(ub_of(i)), "uout[{i}]");
        assert_eq!(f32::from_bits(gots[i]), sum2 * 2.0 + -3.0, "scaled[{i}]");
    }
    drop((a, b, ua, ub, out, out2, uout, scaled));
    common::finish(ctx);
}

/// SPIR-V dispatch writes x → native launch reads x → SPIR-V dispatch overwrites x →
/// native launch reads it again, in one batch: barriers in both directions between the two
/// kernel kinds.
#[test]
fn native_launches_and_spirv_dispatches_in_one_batch() {
    let Some(ctx) = native_context(None) else {
        return;
    };
    let vaddu = kernel(&ctx, "vadd_u32");
    let spirv = shader::index_times_three_plus();
    let pipe = ctx
        .create_pipeline(&PipelineDesc {
            name: "index_times_three_plus",
            spirv: &spirv,
            entry: "main",
            push_constant_size: PUSH_SIZE,
            spec_constants: &[(0, 64), (1, 1), (2, 1)],
            storage_buffers: 0,
        })
        .unwrap();
    let b_of = |i: usize| (i as u32) ^ 0x5555;
    let x = output(&ctx);
    let b = vector(&ctx, (0..N).map(b_of));
    let (y, z) = (output(&ctx), output(&ctx));
    ctx.synchronize().unwrap();

    ctx.set_early_submit(false);
    let before = ctx.encoder_stats();
    let n = N as u32;
    let groups = [n.div_ceil(64), 1, 1];
    let fill = |add: u32| {
        ctx.dispatch(
            &pipe,
            groups,
            &shader::push_constants(x.device_address(), add, n),
            &[vwrite(&x)],
        )
        .unwrap()
    };
    let add = |out: &Buffer| {
        ctx.launch_native(
            &vaddu,
            grid(N),
            [BLOCK, 1, 1],
            0,
            &[addr(&x), addr(&b), addr(out), NativeArg::U32(n)],
            &[vread(&x), vread(&b), vwrite(out)],
        )
        .unwrap()
    };
    fill(7);
    add(&y);
    fill(100);
    add(&z);
    ctx.synchronize().unwrap();
    ctx.set_early_submit(true);
    let after = ctx.encoder_stats();
    assert_eq!(after.batches - before.batches, 1);
    assert_eq!(after.dispatches - before.dispatches, 4);
    assert_eq!(
        after.barriers - before.barriers,
        3,
        "{before:?} → {after:?}"
    );

    let (gy, gz) = (read(&ctx, &y), read(&ctx, &z));
    for i in 0..N {
        let base = i as u32 * 3;
        assert_eq!(gy[i], (base + 7).wrapping_add(b_of(i)), "y[{i}]");
        assert_eq!(gz[i], (base + 100).wrapping_add(b_of(i)), "z[{i}]");
    }
    drop((vaddu, pipe, x, b, y, z));
    common::finish(ctx);
}

/// The same chain through a Recorder, with explicit barriers.
#[test]
fn recorder_launches() {
    let Some(ctx) = native_context(None) else {
        return;
    };
    let vadd = kernel(&ctx, "vadd_f32");
    let (a, b) = (
        vector(&ctx, f32s(N, |i| i as f32)),
        vector(&ctx, f32s(N, |_| 1.0)),
    );
    let (out, out2) = (output(&ctx), output(&ctx));
    ctx.synchronize().unwrap();
    let n = NativeArg::U32(N as u32);
    ctx.submit_and_wait(|rec| {
        rec.launch_native(
            &vadd,
            grid(N),
            [BLOCK, 1, 1],
            0,
            &[addr(&a), addr(&b), addr(&out), n],
        )?;
        rec.barrier();
        rec.launch_native(
            &vadd,
            grid(N),
            [BLOCK, 1, 1],
            0,
            &[addr(&out), addr(&b), addr(&out2), n],
        )?;
        assert_eq!(rec.dispatch_count(), 2);
        Ok(())
    })
    .unwrap();
    let got = read(&ctx, &out2);
    for (i, &w) in got[..N].iter().enumerate() {
        assert_eq!(f32::from_bits(w), i as f32 + 2.0, "out2[{i}]");
    }
    drop((vadd, a, b, out, out2));
    common::finish(ctx);
}

#[test]
fn profile_names_native_kernels() {
    let options = ContextOptions {
        pipeline_cache: PipelineCacheDir::Disabled,
        profile: true,
        ..ContextOptions::default()
    };
    let Some(ctx) = native_context(Some(&options)) else {
        return;
    };
    if ctx.profiler().is_none() {
        eprintln!("SKIPPED: {} has no timestamps", ctx.adapter().name());
        return common::finish(ctx);
    }
    let vadd = ctx
        .create_native_kernel(PTX, "vadd_f32", "native_vadd")
        .unwrap();
    let (a, out) = (vector(&ctx, f32s(N, |i| i as f32)), output(&ctx));
    for _ in 0..3 {
        ctx.launch_native(
            &vadd,
            grid(N),
            [BLOCK, 1, 1],
            0,
            &[addr(&a), addr(&a), addr(&out), NativeArg::U32(N as u32)],
            &[vread(&a), vwrite(&out)],
        )
        .unwrap();
    }
    ctx.synchronize().unwrap();
    let report = ctx.profile_report().unwrap().unwrap();
    eprintln!("{report}");
    let row = report
        .rows
        .iter()
        .find(|r| r.name == "native_vadd")
        .unwrap_or_else(|| panic!("no row native_vadd in\n{report}"));
    assert_eq!(row.count, 3);
    assert!(row.min_ns > 0, "{row:?}");
    let got = read(&ctx, &out);
    assert_eq!(f32::from_bits(got[N - 1]), 2.0 * (N - 1) as f32);
    drop((vadd, a, out));
    common::finish(ctx);
}

#[test]
fn rejected_ptx_names_the_kernel() {
    let Some(ctx) = native_context(None) else {
        return;
    };
    let bad =
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry broken() { nonsense; }\n";
    let err = ctx
        .create_native_kernel(bad, "broken", "broken_kernel")
        .unwrap_err();
    assert!(matches!(err, Error::NativeRejected { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("broken_kernel") && text.contains("ptxas"),
        "{text}"
    );
    // Valid PTX, unknown entry point.
    let err = ctx
        .create_native_kernel(PTX, "no_such_entry", "missing")
        .unwrap_err();
    assert!(matches!(err, Error::NativeRejected { .. }), "{err}");
    assert!(err.to_string().contains("no_such_entry"), "{err}");
    // A NUL inside the text would cut it short: refused before the driver sees it.
    let err = ctx.create_native_kernel("a\0b", "a", "nul").unwrap_err();
    assert!(matches!(err, Error::InvalidPipeline { .. }), "{err}");
    common::finish(ctx);
}

/// Arguments that would record nonsense (or lose the device) are errors, and nothing is
/// recorded for them.
#[test]
fn bad_launch_arguments_record_nothing() {
    let Some(ctx) = native_context(None) else {
        return;
    };
    let vadd = kernel(&ctx, "vadd_f32");
    let out = output(&ctx);
    ctx.synchronize().unwrap();
    let before = ctx.encoder_stats();
    let args = [addr(&out), addr(&out), addr(&out), NativeArg::U32(0)];
    let max_shared = ctx.caps().limits.max_compute_shared_memory;
    let launch = |grid: [u32; 3], block: [u32; 3], shared: u32| {
        ctx.launch_native(&vadd, grid, block, shared, &args, &[vwrite(&out)])
            .unwrap_err()
    };
    for err in [
        launch([1, 1, 1], [BLOCK, 1, 1], max_shared + 1),
        launch([0, 1, 1], [BLOCK, 1, 1], 0),
        launch([1, 1, 1], [2048, 1, 1], 0),
        launch([1, 1, 1], [0, 1, 1], 0),
    ] {
        assert!(matches!(err, Error::InvalidLaunch { .. }), "{err}");
        assert!(err.to_string().contains("vadd_f32"), "{err}");
    }
    let err = ctx
        .submit_and_wait(|rec| {
            rec.launch_native(&vadd, [1, 1, 1], [BLOCK, 1, 1], max_shared + 1, &args)
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("maxComputeSharedMemorySize"),
        "{err}"
    );

    // A kernel of another Context.
    let other = common::context();
    if other.enabled().native_kernels {
        let foreign = kernel(&other, "vadd_f32");
        let err = ctx
            .launch_native(&foreign, [1, 1, 1], [1, 1, 1], 0, &args, &[])
            .unwrap_err();
        assert!(err.to_string().contains("different Context"), "{err}");
        drop(foreign);
    }
    common::finish(other);
    ctx.synchronize().unwrap();
    assert_eq!(ctx.encoder_stats().dispatches, before.dispatches);
    drop((vadd, out));
    common::finish(ctx);
}
