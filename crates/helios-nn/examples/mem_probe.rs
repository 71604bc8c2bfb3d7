//! Device memory of training steps: what the pool holds from the driver against the most its
//! live buffers ever needed (the gap is memory cached in size classes no later request fits).
//!
//!     PRESET=gpt2 BATCH=1 SEQ=1024 PRECISION=f32 STEPS=2 \
//!         cargo run --release -p helios-nn --example mem_probe
use helios::{DType, Device};
use helios_nn::{GptConfig, ParamStore, Tokens};

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::from_env()?;
    let cfg = GptConfig::preset(&env("PRESET", "tiny"))?;
    let batch: usize = env("BATCH", "1").parse()?;
    let seq: usize = env("SEQ", "64").parse()?;
    let steps: u64 = env("STEPS", "2").parse()?;
    let precision = match env("PRECISION", "f32").as_str() {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        _ => DType::F32,
    };
    let ids: Vec<u32> = (0..(batch * seq + 1) * (steps as usize + 1))
        .map(|i| (i * 7919 % cfg.vocab_size) as u32)
        .collect();
    let train = Tokens::from_ids(&ids, "probe")?;
    let init = ParamStore::init_gpt2(&cfg, 1)?;
    let tc = helios_nn::train::TrainConfig::steps_only(batch, seq, steps, precision);
    let mut trainer = helios_nn::train::Trainer::new(&dev, &init, train, None, tc)?;
    drop(init);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for step in 0..steps {
        trainer.train_step()?;
        dev.synchronize()?;
        let m = dev.memory_stats();
        println!(
            "step {step}: held {:.3} GiB, peak in use {:.3} GiB, in use now {:.3} GiB, {} driver allocations",
            gib(m.bytes_held),
            gib(m.peak_in_use),
            gib(m.bytes_in_use),
            m.driver_allocations
        );
    }
    Ok(())
}
