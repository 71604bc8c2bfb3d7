//! Saves a randomly initialised GPT-2 the way Helios saves trained ones, for checking that
//! Hugging Face `transformers` loads it (`bench/gpt2_reference.py --check-helios DIR`).
//!
//! ```sh
//! cargo run -p helios-nn --example export_random -- OUT_DIR [preset|ref] [f32|f16|bf16]
//! ```
//! `ref` is the reference script's model: 2 layers, 2 heads, 64 channels, 64 positions,
//! vocabulary 512. Writes OUT_DIR/pretrained (config.json + model.safetensors) and
//! OUT_DIR/checkpoint (the same plus optimizer and trainer state).

use std::path::PathBuf;

use helios::DType;
use helios_nn::{
    save_checkpoint, save_pretrained, AdamWHyper, BatchSampler, GptConfig, LrSchedule,
    OptimizerState, ParamStore, TrainerState,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = args.first().map(PathBuf::from) else {
        eprintln!(
            "usage: export_random OUT_DIR [tiny|distilgpt2|gpt2|gpt2-medium|ref] [f32|f16|bf16]"
        );
        std::process::exit(2);
    };
    let config = match args.get(1).map(String::as_str).unwrap_or("ref") {
        "ref" => GptConfig {
            n_layer: 2,
            n_head: 2,
            n_embd: 64,
            vocab_size: 512,
            block_size: 64,
            layer_norm_eps: 1e-5,
        },
        name => GptConfig::preset(name)?,
    };
    let dtype = match args.get(2).map(String::as_str).unwrap_or("f32") {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        other => return Err(format!("unknown dtype {other}").into()),
    };
    let params = ParamStore::init_gpt2(&config, 1234)?;
    save_pretrained(&out.join("pretrained"), &params, dtype)?;

    let ids: Vec<u32> = (0..4096u32)
        .map(|i| (i * 7919) % config.vocab_size as u32)
        .collect();
    let data = helios_nn::Tokens::from_ids(&ids, "generated")?;
    let sampler = BatchSampler::new(data, 2, 16, 1234)?;
    let trainer = TrainerState {
        format: helios_nn::checkpoint::TRAINER_FORMAT,
        step: 0,
        seed: 1234,
        sampler: sampler.state(),
        schedule: LrSchedule::constant(1e-3),
        adamw: AdamWHyper::default(),
        model: config.clone(),
        extra: serde_json::Value::Null,
    };
    let optimizer = OptimizerState::zeros(&config);
    save_checkpoint(&out.join("checkpoint"), &params, &optimizer, &trainer)?;
    println!(
        "saved {} parameters ({dtype}) to {}",
        config.num_params(),
        out.display()
    );
    Ok(())
}
