//! `Device::kernel_statistics` on a Context that asks for the driver's compiler statistics
//! (VK_KHR_pipeline_executable_properties): kernels still compile and compute correctly
//! (validated), and the query succeeds for every kernel compiled; where the device offers the
//! extension (not lavapipe in Mesa 22), each kernel reports an executable with statistics.

use std::sync::Arc;

use helios::{Device, Tensor};
use helios_vk::{Context, ContextOptions, ExecutableCapture, Instance, InstanceOptions};
use helios_vk::{PipelineCacheDir, StatValue};

#[test]
fn kernel_statistics_of_every_compiled_kernel() {
    let instance = Arc::new(Instance::new(&InstanceOptions::from_env().unwrap()).unwrap());
    let adapters = instance.adapters().unwrap();
    let adapter = helios_vk::select_adapter_from_env(&adapters).unwrap();
    let options = ContextOptions {
        pipeline_statistics: ExecutableCapture::Representations,
        pipeline_cache: PipelineCacheDir::Disabled,
        ..ContextOptions::default()
    };
    let ctx = Context::with_options(instance.clone(), adapter, &options).unwrap();
    let supported = ctx.caps().features.pipeline_executable_info;
    let d = Device::new(ctx);
    let a = Tensor::from_slice(&d, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let b = Tensor::from_slice(&d, &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]).unwrap();
    let c = a.matmul(&b).unwrap().exp().unwrap();
    let want = [4.0f32, 5.0, 10.0, 11.0].map(f32::exp);
    for (got, want) in c.to_vec().unwrap().iter().zip(want) {
        assert!((got - want).abs() <= want * 1e-5, "{got} vs {want}");
    }

    let stats = d.kernel_statistics().expect("kernel statistics");
    if !supported {
        assert!(stats.is_empty());
        eprintln!("{} lacks VK_KHR_pipeline_executable_properties", d.name());
    } else {
        assert!(stats.len() >= 2, "{stats:?}");
        assert!(stats.windows(2).all(|w| w[0].kernel <= w[1].kernel));
        for k in &stats {
            assert!(!k.executables.is_empty(), "{}: no executables", k.kernel);
            let line: Vec<String> = k.executables[0]
                .stats
                .iter()
                .map(|(n, v): &(String, StatValue)| format!("{n}={v}"))
                .collect();
            eprintln!("{}: {}", k.kernel, line.join(", "));
        }
    }
    let m = d.validation_messages();
    assert!(m.is_empty(), "validation messages:\n{}", m.join("\n"));
}
