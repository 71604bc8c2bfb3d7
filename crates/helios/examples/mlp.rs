//! Trains a small MLP with autograd on the best Vulkan device (lavapipe without a GPU):
//! a two-layer GELU network learning y = sin(3x) on 256 points, with AdamW.
//!
//!     cargo run --release -p helios --example mlp
//!
//! `HELIOS_DEBUG=1` prints every fused kernel the lazy graph runs.

use helios::{adamw_step, AdamWConfig, AdamWParam, DType, Device, Tensor};

fn main() -> helios::Result<()> {
    let dev = Device::from_env()?;
    println!("device: {}", dev.name());
    let (n, hidden) = (256, 64);

    // Data: x in [-1, 1], target sin(3x).
    let xs: Vec<f32> = (0..n)
        .map(|i| -1.0 + 2.0 * i as f32 / (n - 1) as f32)
        .collect();
    let ys: Vec<f32> = xs.iter().map(|x| (3.0 * x).sin()).collect();
    let x = Tensor::from_slice(&dev, &xs, &[n, 1])?; // (n, 1)
    let y = Tensor::from_slice(&dev, &ys, &[n, 1])?; // (n, 1)

    // Parameters, deterministic small initial values.
    let init = |len: usize, scale: f32| -> Vec<f32> {
        (0..len)
            .map(|i| scale * ((i as f32 * 0.618_034).fract() - 0.5))
            .collect()
    };
    let w1 = Tensor::from_slice(&dev, &init(hidden, 2.0), &[1, hidden])?.requires_grad_(); // (1, H)
    let b1 = Tensor::from_slice(&dev, &init(hidden, 1.0), &[hidden])?.requires_grad_(); // (H,)
    let w2 = Tensor::from_slice(&dev, &init(hidden, 0.5), &[hidden, 1])?.requires_grad_(); // (H, 1)
    let b2 = Tensor::zeros(&dev, &[1], DType::F32)?.requires_grad_(); // (1,)
    let params = [&w1, &b1, &w2, &b2];
    let moments: Vec<(Tensor, Tensor)> = params
        .iter()
        .map(|p| {
            Ok((
                Tensor::zeros(&dev, p.shape(), DType::F32)?,
                Tensor::zeros(&dev, p.shape(), DType::F32)?,
            ))
        })
        .collect::<helios::Result<_>>()?;
    let config = AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    };

    for step in 1..=500u32 {
        // Forward: the bias add, GELU, the residual error and the square fuse into few kernels.
        let h = x.matmul(&w1)?.add(&b1)?.gelu_tanh()?; // (n, H)
        let pred = h.matmul(&w2)?.add(&b2)?; // (n, 1)
        let loss = pred.sub(&y)?.pow_scalar(2.0)?.mean_all()?; // ()
        loss.backward()?;

        let grads: Vec<Tensor> = params
            .iter()
            .map(|p| p.grad().expect("backward reached it"))
            .collect();
        let list: Vec<AdamWParam> = params
            .iter()
            .zip(&grads)
            .zip(&moments)
            .map(|((param, grad), (m, v))| AdamWParam {
                param,
                grad,
                m,
                v,
                copy: None,
                weight_decay: 0.0,
            })
            .collect();
        adamw_step(&list, &config, step)?;
        params.iter().for_each(|p| p.zero_grad());
        if step == 1 || step % 100 == 0 {
            println!("step {step:4}  loss {:.5}", loss.to_vec()?[0]);
        }
    }
    Ok(())
}
