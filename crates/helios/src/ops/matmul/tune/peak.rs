//! The cooperative-matrix peak microbenchmark.

use super::caps::matmul_caps;
use crate::{DType, Device, Result, Tensor};

/// The cooperative-matrix instruction's throughput alone.
#[derive(Clone, Debug)]
pub struct CoopPeak {
    pub kernel: String,
    pub tflops: f64,
    pub time_us: f64,
}

/// Measures `CoopPeakKernel` for `dtype` (f16 or bf16): `None` where the device has no such
/// fragments. Launches enough workgroups to fill any GPU several times over.
pub fn coop_peak(device: &Device, dtype: DType) -> Result<Option<CoopPeak>> {
    let caps = matmul_caps(device);
    let ok = match dtype {
        DType::F16 => caps.coop_f16,
        DType::BF16 => caps.coop_bf16,
        DType::F32 => false,
    };
    if !ok {
        return Ok(None);
    }
    let kernel = helios_kernels::CoopPeakKernel {
        input: dtype.storage(),
        frags: 4,
        subgroups: 4,
        subgroup: caps.subgroup,
    };
    let groups = 132 * 16;
    let iters = 4096u32;
    let a = Tensor::from_slice_as(
        device,
        &(0..2 * 4 * 256)
            .map(|i| (i % 7) as f32 * 0.125)
            .collect::<Vec<_>>(),
        &[2 * 4 * 256],
        dtype,
    )?;
    let c = Tensor::empty(
        device,
        &[(groups * kernel.subgroups * 16 * 256) as usize],
        DType::F32,
    )?;
    let compiled = device.kernel(crate::device::KernelKey::CoopPeak(kernel), || {
        kernel.build()
    })?;
    let push = helios_kernels::pack_push(
        &compiled.module.name,
        &compiled.module.params,
        compiled.module.push_size,
        &[
            helios_kernels::Arg::Address(a.address()?),
            helios_kernels::Arg::Address(c.address()?),
            helios_kernels::Arg::U32(iters),
        ],
    )?;
    let ctx = device.context();
    let run = || -> Result<()> {
        ctx.dispatch(
            &compiled.pipeline,
            [groups, 1, 1],
            &push,
            &[
                helios_vk::Access::read(a.buffer()?),
                helios_vk::Access::write(c.buffer()?),
            ],
        )?;
        Ok(())
    };
    run()?;
    device.warm_up(|| {
        run()?;
        device.synchronize()
    })?;
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = ctx.start_gpu_timer()?;
        run()?;
        let span = ctx.stop_gpu_timer(t)?;
        times.push(ctx.gpu_elapsed(span)?.as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let secs = times[2];
    Ok(Some(CoopPeak {
        kernel: kernel.name(),
        tflops: kernel.flops(groups, iters) / secs / 1e12,
        time_us: secs * 1e6,
    }))
}
