//! Times the tied head's three products at the tiny preset's training shape on the chosen
//! device, for GPT-2's vocabulary and for it padded to a multiple of 128:
//!
//!     cargo run --release -p helios-nn --example head_probe
use std::time::Instant;

use helios::{DType, Device, Tensor};

/// A named product to time.
type Case<'a> = (&'a str, Box<dyn Fn() -> helios::Result<Tensor> + 'a>);

fn main() -> helios::Result<()> {
    let dev = Device::from_env()?;
    let (m, c) = (256, 128);
    for v in [50257usize, 50304] {
        let h = Tensor::full(&dev, &[m, c], 0.01, DType::F32)?; // (BT, C)
        let wte = Tensor::full(&dev, &[v, c], 0.02, DType::F32)?; // (V, C)
        let g = Tensor::full(&dev, &[m, v], 0.001, DType::F32)?; // (BT, V)
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
            println!("V={v:6} {name:18} {ms:8.1} ms  {gflops:5.2} GFLOP/s");
        }
    }
    Ok(())
}
