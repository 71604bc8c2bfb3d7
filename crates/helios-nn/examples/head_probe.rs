//! Times the tied head's three products on the chosen device, for GPT-2's vocabulary and
//! for it padded to a multiple of 128. Default: the tiny preset's training shape in f32;
//! `M=8192 C=768 DTYPE=bf16` is GPT-2 124M at 8×1024:
//!
//!     cargo run --release -p helios-nn --example head_probe
use std::time::Instant;

use helios::{DType, Device, Tensor};

/// A named product to time.
type Case<'a> = (&'a str, Box<dyn Fn() -> helios::Result<Tensor> + 'a>);

fn main() -> helios::Result<()> {
    let dev = Device::from_env()?;
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (m, c) = (env("M", 256), env("C", 128));
    let dtype = match std::env::var("DTYPE").as_deref() {
        Ok("bf16") => DType::BF16,
        Ok("f16") => DType::F16,
        _ => DType::F32,
    };
    for v in [50257usize, 50304] {
        let h = Tensor::full(&dev, &[m, c], 0.01, dtype)?; // (BT, C)
        let wte = Tensor::full(&dev, &[v, c], 0.02, dtype)?; // (V, C)
        let g = Tensor::full(&dev, &[m, v], 0.001, dtype)?; // (BT, V)
        let cases: [Case; 3] = [
            (
                "logits = h wte^T",
                Box::new(|| h.matmul(&wte.transpose(0, 1)?)),
            ),
            ("dh = g wte", Box::new(|| g.matmul(&wte))),
            ("dwte = g^T h", Box::new(|| g.transpose(0, 1)?.matmul(&h))),
        ];
        for (name, f) in cases {
            f()?.realize()?;
            dev.synchronize()?;
            let t0 = Instant::now();
            for _ in 0..3 {
                f()?.realize()?;
            }
            dev.synchronize()?;
            let ms = t0.elapsed().as_secs_f64() * 1e3 / 3.0;
            let gflops = 2.0 * (m * c * v) as f64 / (ms * 1e6);
            println!("V={v:6} {name:18} {ms:8.2} ms  {gflops:8.1} GFLOP/s");
        }
    }
    Ok(())
}
