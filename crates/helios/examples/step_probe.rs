//! Host cost of one transformer training step's graph (a profiling probe for the scheduler,
//! autograd and library-op recording): 12 pre-LN blocks at tiny sizes, forward and backward
//! recorded, then waited for. Prints host µs per step (recording only) and the heap
//! allocations the step made (a deterministic measure of host work: malloc and free are
//! about a third of the recording thread's time).
//!
//!     cargo run --release -p helios --example step_probe
//!
//! Steps from the third on run through `steady_step`, which callgrind can count alone (see
//! there); `STEPS` sets how many run (default 8), `SHAPE=t,c` the sequence length and width
//! (default 16,32; `bench graph`'s host12 is 64,128), and `EARLY=0` turns off the encoder's
//! early submits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Counts heap allocations (the host cost of a step is largely malloc and free).
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

use helios::{Activation, AttentionOptions, Device, IndexTensor, MatmulOptions, Tensor};

/// GPT-2's block as `helios_nn` writes it (and `bench graph`'s host12): fused q|k|v
/// projection with bias, the attention op reading q, k, v in place as its slices, output
/// projection with bias and residual, then the MLP with biases, GELU and residual.
fn block(x: &Tensor, p: &[Tensor], b: usize, t: usize, c: usize) -> helios::Result<Tensor> {
    let heads = 4;
    let d = c / heads;
    fn linear<'a>(
        bias: &'a Tensor,
        residual: Option<&'a Tensor>,
        act: Activation,
    ) -> MatmulOptions<'a> {
        MatmulOptions {
            bias: Some(bias),
            residual,
            act,
            ..Default::default()
        }
    }
    let h = x.layer_norm(&p[0], &p[1], 1e-5)?.y;
    let a = h
        .matmul_opts(&p[2], &linear(&p[3], None, Activation::None))?
        .reshape(&[b, t, 3, heads, d])?
        .attention_qkv(&AttentionOptions::causal())?
        .out
        .reshape(&[b, t, c])?;
    let x = a.matmul_opts(&p[4], &linear(&p[5], Some(x), Activation::None))?;
    let h = x.layer_norm(&p[6], &p[7], 1e-5)?.y;
    let f = h.matmul_opts(&p[8], &linear(&p[9], None, Activation::GeluTanh))?;
    f.matmul_opts(&p[10], &linear(&p[11], Some(&x), Activation::None))
}

fn main() -> helios::Result<()> {
    let dev = Device::from_env()?;
    let (t, c) = match std::env::var("SHAPE") {
        Ok(v) => {
            let mut it = v.split(',').filter_map(|x| x.trim().parse::<usize>().ok());
            (it.next().unwrap_or(16), it.next().unwrap_or(32))
        }
        Err(_) => (16, 32),
    };
    let (layers, b) = (12, 1);
    if std::env::var("EARLY").is_ok_and(|v| v == "0") {
        dev.set_early_submit(false);
    }
    let param = |shape: &[usize], s: f32| -> helios::Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| s * ((i as f32 * 0.618).fract() - 0.5))
            .collect();
        Ok(Tensor::from_slice(&dev, &v, shape)?.requires_grad_())
    };
    let mut params = Vec::new();
    for _ in 0..layers {
        let mut p = Vec::new();
        for (shape, s) in [
            (vec![c], 1.0),
            (vec![c], 0.1),
            (vec![c, 3 * c], 0.1),
            (vec![3 * c], 0.1),
            (vec![c, c], 0.1),
            (vec![c], 0.1),
            (vec![c], 1.0),
            (vec![c], 0.1),
            (vec![c, 4 * c], 0.1),
            (vec![4 * c], 0.1),
            (vec![4 * c, c], 0.1),
            (vec![c], 0.1),
        ] {
            p.push(param(&shape, s)?);
        }
        params.push(p);
    }
    let x = Tensor::from_slice(&dev, &vec![0.1; b * t * c], &[b, t, c])?;
    let targets = IndexTensor::from_slice(&dev, &vec![3; b * t], &[b * t])?;
    let steps: usize = std::env::var("STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    for i in 0..steps {
        // Step 0 compiles (and, on GPUs, tunes); the later ones are the steady state.
        let allocs = ALLOCS.load(Ordering::Relaxed);
        let submit_ns = dev.encoder_stats().submit_ns;
        let (host, fwd, bwd, submitted) = if i < 2 {
            step(&x, &params, &targets, (b, t, c))?
        } else {
            steady_step(&x, &params, &targets, (b, t, c))?
        };
        let allocs = ALLOCS.load(Ordering::Relaxed) - allocs;
        let submit = (dev.encoder_stats().submit_ns - submit_ns) as f64 / 1e3;
        dev.synchronize()?;
        println!(
            "step {i}: {host:.0} µs host (forward {fwd:.0}, backward {bwd:.0}; all submitted at {submitted:.0}; recording and submitting command buffers {submit:.0}), {allocs} allocations, {} dispatches, {} barriers, {} batches, {} pipelines so far",
            dev.encoder_stats().dispatches,
            dev.encoder_stats().barriers,
            dev.encoder_stats().batches,
            dev.context().pipeline_stats().pipelines_created
        );
    }
    // With HELIOS_PROFILE=1, the kernels of a step by count (the census a host cut starts
    // from: every dispatch costs host time, ours and the driver's).
    if let Some(report) = dev.profile_report()? {
        let mut rows = report.rows;
        rows.sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
        for r in rows {
            println!("{:8.1} a step  {}", r.count as f64 / steps as f64, r.name);
        }
    }
    Ok(())
}

/// Host µs: all recorded, of that the forward and the backward, and all submitted.
type Timing = (f64, f64, f64, f64);

/// A step after the first two (compiles, tuning, pool growth): its own symbol, so that
/// `valgrind --tool=callgrind --collect-atstart=no --toggle-collect=step_probe::steady_step`
/// counts the steady state alone.
#[inline(never)]
fn steady_step(
    x: &Tensor,
    params: &[Vec<Tensor>],
    targets: &IndexTensor,
    shape: (usize, usize, usize),
) -> helios::Result<Timing> {
    step(x, params, targets, shape)
}

/// One step's recording.
fn step(
    x: &Tensor,
    params: &[Vec<Tensor>],
    targets: &IndexTensor,
    (b, t, c): (usize, usize, usize),
) -> helios::Result<Timing> {
    let t0 = Instant::now();
    let mut h = x.clone();
    for p in params {
        h = block(&h, p, b, t, c)?;
    }
    let loss = h.reshape(&[b * t, c])?.cross_entropy(targets, None)?.loss;
    let fwd = t0.elapsed().as_secs_f64() * 1e6;
    loss.backward()?;
    let bwd = t0.elapsed().as_secs_f64() * 1e6 - fwd;
    for p in params.iter().flatten() {
        p.grad().expect("reached").realize()?;
        p.zero_grad();
    }
    let host = t0.elapsed().as_secs_f64() * 1e6;
    x.device().flush()?;
    Ok((host, fwd, bwd, t0.elapsed().as_secs_f64() * 1e6))
}
