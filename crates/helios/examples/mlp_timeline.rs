//! Where a GPU-bound step's wall time goes outside its kernels: `bench graph`'s MLP block
//! (LN → fc+bias+GELU → proj+bias+residual, forward and backward, 8192×768 by default) with
//! host timestamps after each op, and a second thread that notes on the same clock when
//! each timeline value is submitted and when the GPU reaches it. Prints the events of the
//! last steps relative to each step's start: a batch submitted after the GPU finished the
//! previous one left the GPU idle for the difference.
//!
//!     cargo run --release -p helios --example mlp_timeline
//!
//! `SHAPE=rows,c` sets the size, `DTYPE=bf16` the element type, `STEPS` the timed steps
//! (default 12, the last 3 printed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use helios::{Activation, DType, Device, MatmulOptions, Tensor};

fn main() -> helios::Result<()> {
    let dev = Device::from_env()?;
    let (n, c) = match std::env::var("SHAPE") {
        Ok(v) => {
            let mut it = v.split(',').filter_map(|x| x.trim().parse::<usize>().ok());
            (it.next().unwrap_or(8192), it.next().unwrap_or(768))
        }
        Err(_) => (8192, 768),
    };
    let dt = match std::env::var("DTYPE").as_deref() {
        Ok("bf16") => DType::BF16,
        Ok("f16") => DType::F16,
        _ => DType::F32,
    };
    let steps: usize = std::env::var("STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let t = |len: usize, shape: &[usize], seed: u64, scale: f32| -> helios::Result<Tensor> {
        let v: Vec<f32> = (0..len)
            .map(|i| scale * (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 500.0 - 1.0))
            .collect();
        Tensor::from_slice_as(&dev, &v, shape, dt)
    };
    let x = t(n * c, &[n, c], 5, 1.0)?.requires_grad_();
    let dy = t(n * c, &[n, c], 6, 1.0)?;
    let gamma = t(c, &[c], 7, 1.0)?.requires_grad_();
    let beta = t(c, &[c], 8, 0.1)?.requires_grad_();
    let w1 = t(c * 4 * c, &[c, 4 * c], 9, 0.02)?.requires_grad_();
    let b1 = t(4 * c, &[4 * c], 10, 0.02)?.requires_grad_();
    let w2 = t(4 * c * c, &[4 * c, c], 11, 0.02)?.requires_grad_();
    let b2 = t(c, &[c], 12, 0.02)?.requires_grad_();
    let params = [&x, &gamma, &beta, &w1, &b1, &w2, &b2];

    let epoch = Instant::now();
    let us = move || epoch.elapsed().as_secs_f64() * 1e6;
    let events: Arc<Mutex<Vec<(f64, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let ctx = Arc::clone(dev.context());
        let (events, stop) = (Arc::clone(&events), Arc::clone(&stop));
        std::thread::spawn(move || {
            // Notes `what` and the value whenever the value moves off `last`.
            let note = |what: &str, value: u64, last: &mut u64| {
                if value != *last {
                    events
                        .lock()
                        .unwrap()
                        .push((us(), format!("{what} {value}")));
                    *last = value;
                }
            };
            let (mut done, mut sub) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                let d = ctx.completed().unwrap_or(done);
                note("submitted", ctx.last_submitted(), &mut sub);
                note("GPU reached", d, &mut done);
                std::hint::spin_loop();
            }
        })
    };
    let mark = |what: &str| events.lock().unwrap().push((us(), what.to_string()));
    let mut starts = Vec::new();
    for i in 0..steps + 3 {
        dev.synchronize()?;
        if i == 3 {
            events.lock().unwrap().clear();
        }
        let t0 = us();
        starts.push(t0);
        mark("step");
        let h = x.layer_norm(&gamma, &beta, 1e-5)?.y;
        mark("ln recorded");
        let fc = MatmulOptions {
            bias: Some(&b1),
            act: Activation::GeluTanh,
            ..Default::default()
        };
        let h = h.matmul_opts(&w1, &fc)?;
        mark("fc recorded");
        let proj = MatmulOptions {
            bias: Some(&b2),
            residual: Some(&x),
            ..Default::default()
        };
        let y = h.matmul_opts(&w2, &proj)?;
        mark("proj recorded");
        let loss = y.mul(&dy)?.to_dtype(DType::F32)?.sum_all()?;
        mark("loss recorded");
        loss.backward()?;
        mark("backward built");
        for p in params {
            p.grad().expect("backward reached it").realize()?;
            p.zero_grad();
        }
        mark("grads recorded");
        dev.synchronize()?;
        mark("synchronized");
    }
    stop.store(true, Ordering::Relaxed);
    watcher.join().expect("watcher");
    let mut events = events.lock().unwrap().clone();
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let first_printed = starts[starts.len().saturating_sub(3)];
    let mut step_start = 0.0;
    for (time, what) in events.iter().filter(|e| e.0 >= first_printed) {
        if what == "step" {
            step_start = *time;
            println!("--");
        }
        println!("{:9.1} µs  {what}", time - step_start);
    }
    Ok(())
}
