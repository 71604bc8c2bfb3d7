//! GPU timestamps around every dispatch (HELIOS_PROFILE): counts and names per kernel.

use std::sync::Arc;

use helios::{Device, Tensor};
use helios_vk::{Context, ContextOptions, Instance, InstanceOptions, PipelineCacheDir};

#[test]
fn profile_counts_every_dispatch_by_kernel() {
    let instance = Arc::new(Instance::new(&InstanceOptions::from_env().unwrap()).unwrap());
    let adapters = instance.adapters().unwrap();
    let adapter = helios_vk::select_adapter_from_env(&adapters).unwrap();
    let options = ContextOptions {
        profile: true,
        pipeline_cache: PipelineCacheDir::Disabled,
        ..ContextOptions::default()
    };
    let ctx = Context::with_options(instance.clone(), adapter, &options).unwrap();
    let d = Device::new(ctx);
    let x = Tensor::from_vec1(&d, &vec![0.5f32; 10_000]).unwrap();
    let mut t = x.clone();
    for _ in 0..7 {
        // Realised one by one: seven kernels, not one fused chain.
        t = t.exp().unwrap();
        t.realize().unwrap();
    }
    let u = x.add(&t).unwrap();
    u.realize().unwrap();
    let report = d.profile_report().unwrap().expect("profiling is on");
    let count = |name: &str| {
        report
            .rows
            .iter()
            .find(|r| r.name == name)
            .map_or(0, |r| r.count)
    };
    assert_eq!(count("fused1_exp"), 7, "{report}");
    assert_eq!(count("fused1_add"), 1, "{report}");
    assert!(report.rows.iter().all(|r| r.total_ns > 0), "{report}");
    let messages = instance.validation_messages();
    assert!(
        messages.is_empty(),
        "validation messages:\n{}",
        messages.join("\n")
    );
}

#[test]
fn gpu_timer_measures_recorded_work() {
    let d = Device::from_env().unwrap();
    let x = Tensor::from_vec1(&d, &vec![0.25f32; 100_000]).unwrap();
    let ctx = d.context();
    let timer = ctx.start_gpu_timer().unwrap();
    let mut t = x.clone();
    for _ in 0..5 {
        t = t.tanh().unwrap();
    }
    t.realize().unwrap();
    let span = ctx.stop_gpu_timer(timer).unwrap();
    let elapsed = ctx.gpu_elapsed(span).unwrap();
    assert!(elapsed.as_nanos() > 0);
    assert_eq!(t.to_vec().unwrap().len(), 100_000);
    let messages = d.validation_messages();
    assert!(
        messages.is_empty(),
        "validation messages:\n{}",
        messages.join("\n")
    );
}
