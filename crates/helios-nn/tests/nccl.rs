//! The NCCL backend in a world of one rank, on an NVIDIA GPU (ignored elsewhere): every
//! step exports nothing new but copies the gradients into the shared arena, signals CUDA
//! through the exported timeline, all-reduces there and waits for CUDA before the
//! optimizer. A world of one must then train bit for bit like one process, and so must a
//! world of one with the optimizer state sharded (ZeRO-1: the gradients reduced to their
//! owner and the updated parameters broadcast from it through the same arena, the squared
//! norm summed over the ranks through NCCL).
//!
//! Kernel tuning off (`HELIOS_MATMUL_TUNE=0`): tuning on real work switches kernels during a
//! run, and bit-for-bit comparisons between runs need the same kernels in both.
//!
//! ```sh
//! export LD_LIBRARY_PATH=<python>/site-packages/nvidia/nccl/lib
//! HELIOS_MATMUL_TUNE=0 cargo test --release -p helios-nn --test nccl -- --ignored --nocapture
//! ```

use helios::{DType, Device};
use helios_dist::{Launcher, NcclCollective, Rank};
use helios_nn::train::{TrainConfig, Trainer};
use helios_nn::{GptConfig, LrSchedule, ParamStore, Tokens};

fn data() -> Tokens {
    let ids: Vec<u32> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % 50257)
        .collect();
    Tokens::from_ids(&ids, "noise").unwrap()
}

/// Losses, gradient norms and final weights of `steps` steps, and the median time of a
/// step and of its gradient averaging (ms), after the first step.
fn run(
    dev: &Device,
    store: &ParamStore,
    cfg: &TrainConfig,
    nccl: bool,
) -> (Vec<(f32, f32)>, ParamStore, f64, f64) {
    let mut t = match nccl {
        false => Trainer::new(dev, store, data(), None, cfg.clone()).unwrap(),
        true => {
            let one = Rank {
                rank: 0,
                world: 1,
                local_rank: 0,
                launcher: Launcher::Env,
            };
            let comm = NcclCollective::connect(dev, one, None).expect("NCCL on this GPU");
            Trainer::new_with(dev, store, data(), None, cfg.clone(), Box::new(comm)).unwrap()
        }
    };
    t.run(None, |_| {}).unwrap();
    t.finish().unwrap();
    let h = &t.history().train;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let step = median(h.iter().skip(1).map(|s| s.step_ms).collect());
    let comm = median(h.iter().skip(1).map(|s| s.comm_ms).collect());
    let losses = h.iter().map(|s| (s.loss, s.grad_norm)).collect();
    (losses, t.weights().unwrap(), step, comm)
}

#[test]
#[ignore = "needs an NVIDIA GPU and NCCL on LD_LIBRARY_PATH"]
fn a_world_of_one_over_nccl_trains_bit_for_bit_like_one_process() {
    let dev = Device::from_env().unwrap();
    for (name, config, batch, seq, steps) in [
        ("small", GptConfig::preset("tiny").unwrap(), 4, 64, 8),
        ("gpt2", GptConfig::preset("gpt2").unwrap(), 8, 1024, 30),
    ] {
        let store = ParamStore::init_gpt2(&config, 3).unwrap();
        for precision in [DType::F32, DType::BF16] {
            let mut cfg = TrainConfig::steps_only(batch, seq, steps, precision);
            cfg.schedule = LrSchedule::constant(3e-4);
            let zero = TrainConfig {
                zero: true,
                ..cfg.clone()
            };
            // Alone first, to compile every kernel; the figures are the later runs'.
            run(&dev, &store, &cfg, false);
            let (b, wb, step_b, comm) = run(&dev, &store, &cfg, true);
            let (z, wz, step_z, comm_z) = run(&dev, &store, &zero, true);
            let (a, wa, step_a, _) = run(&dev, &store, &cfg, false);
            for (what, got, weights) in [("NCCL", &b, &wb), ("NCCL, ZeRO-1", &z, &wz)] {
                assert_eq!(&a, got, "{name} {precision:?} {what}: losses and norms");
                for ((s, x), (_, y)) in wa.iter().zip(weights.iter()) {
                    let p = precision;
                    assert!(x.data == y.data, "{name} {p:?} {what}: {} differs", s.name);
                }
            }
            println!(
                "checked: {name} {} {batch}x{seq}, {steps} steps: NCCL world of one equals one \
                 process bit for bit, sharded (ZeRO-1) or not; step {step_a:.2} ms alone, \
                 {step_b:.2} ms over NCCL (gradient averaging {comm:.2} ms), {step_z:.2} ms \
                 sharded (reduce, norm and broadcast {comm_z:.2} ms)",
                precision.name()
            );
        }
    }
}
