// VK_KHR_pipeline_executable_properties: with statistics asked for, pipelines still build,
// run and go through the persistent cache cleanly (validated), and the query succeeds; where
// the device offers the extension (not lavapipe in Mesa 22) it returns executables with
// statistics.

mod common;

use common::shader;
use helios_vk::{vk, Context, ContextOptions, ExecutableCapture, PipelineCacheDir};
use std::sync::Arc;

/// Checks what `pipeline_statistics` returns for `pipe` on a Context that asked for `mode`.
fn check(ctx: &Arc<Context>, pipe: &helios_vk::Pipeline, mode: ExecutableCapture) {
    let supported = ctx.caps().features.pipeline_executable_info;
    assert_eq!(ctx.enabled().pipeline_executable_info, supported);
    let want = if supported {
        mode
    } else {
        ExecutableCapture::Off
    };
    assert_eq!(ctx.executable_capture(), want);
    let flags = pipe.create_flags();
    assert_eq!(
        flags.contains(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR),
        want != ExecutableCapture::Off
    );
    let execs = ctx.pipeline_statistics(pipe).expect("pipeline statistics");
    if !supported {
        assert!(execs.is_empty(), "{execs:?}");
        return;
    }
    assert!(!execs.is_empty(), "no executables reported");
    for e in &execs {
        assert!(!e.name.is_empty(), "{e:?}");
        if mode != ExecutableCapture::Representations {
            assert!(e.representations.is_empty() && e.binary_representations.is_empty());
        }
    }
    eprintln!("{execs:#?}");
}

#[test]
fn statistics_on_request() {
    for mode in [
        ExecutableCapture::Statistics,
        ExecutableCapture::Representations,
    ] {
        let ctx = common::context_with(&ContextOptions {
            pipeline_cache: PipelineCacheDir::Disabled,
            pipeline_statistics: mode,
            ..Default::default()
        });
        let pipe = shader::create_and_run(&ctx);
        check(&ctx, &pipe, mode);
        drop(pipe);
        common::finish(ctx);
    }
}

#[test]
fn off_by_default() {
    let ctx = common::context_with(&ContextOptions {
        pipeline_cache: PipelineCacheDir::Disabled,
        ..Default::default()
    });
    assert!(!ctx.enabled().pipeline_executable_info);
    assert_eq!(ctx.executable_capture(), ExecutableCapture::Off);
    let pipe = shader::create_and_run(&ctx);
    assert_eq!(pipe.create_flags(), vk::PipelineCreateFlags::empty());
    assert!(ctx.pipeline_statistics(&pipe).unwrap().is_empty());
    drop(pipe);
    common::finish(ctx);
}

/// Capturing pipelines go through the persisted cache: a cold start saves them, a warm start
/// loads them and still builds, runs and answers the query.
#[test]
fn statistics_through_the_persistent_cache() {
    let root = std::env::temp_dir().join(format!("helios-vk-exec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mode = ExecutableCapture::Representations;
    for _start in ["cold", "warm"] {
        let ctx = common::context_with(&ContextOptions {
            pipeline_statistics: mode,
            ..ContextOptions::with_cache_dir(&root)
        });
        let pipe = shader::create_and_run(&ctx);
        check(&ctx, &pipe, mode);
        drop(pipe);
        ctx.save_pipeline_cache().unwrap();
        common::finish(ctx);
    }
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn foreign_pipeline_is_refused() {
    let a = common::context_with(&ContextOptions {
        pipeline_cache: PipelineCacheDir::Disabled,
        ..Default::default()
    });
    let b = common::context_with(&ContextOptions {
        pipeline_cache: PipelineCacheDir::Disabled,
        ..Default::default()
    });
    let pipe = shader::create_and_run(&a);
    let err = b.pipeline_statistics(&pipe).unwrap_err();
    assert!(
        matches!(err, helios_vk::Error::ForeignObject { .. }),
        "{err}"
    );
    drop(pipe);
    common::finish(a);
    common::finish(b);
}
