//! Host cost of building and realising element-wise chains (a profiling probe for the lazy
//! graph's per-node overhead): 20 × 1000 dependent ops on 1024 elements, each chain read back;
//! then `bench graph`'s mixed32 step (32 ops, two inputs, a broadcast) at a small size.
//!
//!     cargo run --release -p helios --example chain_probe

use std::time::Instant;

fn main() -> helios::Result<()> {
    let dev = helios::Device::from_env()?;
    let x = helios::Tensor::from_slice(&dev, &vec![0.5; 1024], &[1024])?;
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for round in 0..rounds {
        let (total, build, realize) = if round == 0 {
            chains(&x)?
        } else {
            steady_chains(&x)?
        };
        println!(
            "round {round}: {:.3} µs/op in all, {:.3} µs/op building, {:.3} realising",
            total * 1e6 / 20_000.0,
            build * 1e6 / 20_000.0,
            realize * 1e6 / 20_000.0
        );
    }
    // One-node groups: the fixed cost of a realisation.
    let t0 = Instant::now();
    for _ in 0..2000 {
        let t = x.add_scalar(1.0)?;
        t.realize()?;
    }
    dev.synchronize()?;
    println!(
        "one-node realisations: {:.3} µs each (recorded and run)",
        t0.elapsed().as_secs_f64() * 1e6 / 2000.0
    );
    // `bench graph`'s mixed32 step at a small size: 32 ops over two inputs, one broadcast.
    let (rows, cols) = (64, 256);
    let m = helios::Tensor::from_slice(&dev, &vec![0.5; rows * cols], &[rows, cols])?;
    let b = helios::Tensor::from_slice(&dev, &vec![0.25; cols], &[cols])?;
    mixed(&m, &b)?;
    let (build, realize) = steady_mixed(&m, &b)?;
    println!("mixed32 steps: {build:.2} µs building, {realize:.2} realising");
    Ok(())
}

/// 500 mixed32 steps after the first (callgrind: `--toggle-collect=chain_probe::steady_mixed`).
#[inline(never)]
fn steady_mixed(x: &helios::Tensor, b: &helios::Tensor) -> helios::Result<(f64, f64)> {
    let (mut build, mut realize) = (0.0, 0.0);
    for _ in 0..500 {
        let (bu, re) = mixed(x, b)?;
        build += bu;
        realize += re;
    }
    Ok((build * 1e6 / 500.0, realize * 1e6 / 500.0))
}

/// One mixed32 step, waited for: seconds building and realising.
fn mixed(x: &helios::Tensor, b: &helios::Tensor) -> helios::Result<(f64, f64)> {
    let t0 = Instant::now();
    let mut y = x.add(b)?.gelu_tanh()?;
    for i in 0..5 {
        y = y
            .mul_scalar(0.5 + 0.1 * i as f32)?
            .add(x)?
            .maximum_scalar(-1.0)?;
        y = y.sub(b)?.minimum_scalar(1.0)?.add_scalar(0.25)?;
    }
    let t1 = Instant::now();
    y.realize()?;
    let t2 = Instant::now();
    x.device().synchronize()?;
    Ok(((t1 - t0).as_secs_f64(), (t2 - t1).as_secs_f64()))
}

/// Rounds after the first (which compiles): their own symbol, so that `valgrind
/// --tool=callgrind --collect-atstart=no --toggle-collect=chain_probe::steady_chains` counts
/// the steady state alone (with `HELIOS_SPIN_US=0`, so host waits do not poll).
#[inline(never)]
fn steady_chains(x: &helios::Tensor) -> helios::Result<(f64, f64, f64)> {
    chains(x)
}

/// 20 chains of 1000 ops, each realised and read back: seconds in all, building, realising.
fn chains(x: &helios::Tensor) -> helios::Result<(f64, f64, f64)> {
    let t0 = Instant::now();
    let mut build = 0.0;
    let mut realize = 0.0;
    for _ in 0..20 {
        let b0 = Instant::now();
        let mut t = x.clone();
        for i in 0..1000 {
            t = if i % 2 == 0 {
                t.mul_scalar(1.0001)?
            } else {
                t.add_scalar(-0.0001)?
            };
        }
        build += b0.elapsed().as_secs_f64();
        let r0 = Instant::now();
        t.realize()?;
        realize += r0.elapsed().as_secs_f64();
        t.to_vec()?;
    }
    Ok((t0.elapsed().as_secs_f64(), build, realize))
}
