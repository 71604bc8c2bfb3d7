//! Host cost of recording a library op (a profiling probe for the matmul's selection,
//! push-constant packing, output allocation and the encoder): rounds of 1000 small matmuls
//! of realised operands, no autograd. Prints host µs per matmul (recording only).
//!
//!     cargo run --release -p helios --example mm_probe
//!
//! Rounds after the first run through `steady`, which callgrind can count alone:
//! `HELIOS_SPIN_US=0 valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect=mm_probe::steady target/release/examples/mm_probe` (two rounds, 2000
//! matmuls).

use helios::{Device, Tensor};

/// 1000 matmuls, each output dropped at once (its buffer goes back to the pool).
#[inline(never)]
fn steady(x: &Tensor, w: &Tensor) -> helios::Result<()> {
    for _ in 0..1000 {
        let y = x.matmul(w)?;
        drop(y);
    }
    Ok(())
}

fn main() -> helios::Result<()> {
    let dev = Device::from_env()?;
    let v: Vec<f32> = (0..64 * 32).map(|i| (i as f32 * 0.37).fract()).collect();
    let x = Tensor::from_slice(&dev, &v[..16 * 32], &[16, 32])?;
    let w = Tensor::from_slice(&dev, &v[..32 * 32], &[32, 32])?;
    for i in 0..3 {
        let t0 = std::time::Instant::now();
        if i == 0 {
            for _ in 0..1000 {
                x.matmul(&w)?;
            }
        } else {
            steady(&x, &w)?;
        }
        let host = t0.elapsed().as_secs_f64() * 1e6 / 1000.0;
        dev.synchronize()?;
        println!("round {i}: {host:.2} µs host per matmul");
    }
    Ok(())
}
