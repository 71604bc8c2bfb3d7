//! The PyTorch reference (bench/gpt2_reference.py → tests/data/gpt2_ref.safetensors): its
//! shapes and metadata, and that its weights load as a Helios parameter store. The logits,
//! loss, gradient and AdamW comparisons come with the model.

use std::collections::BTreeMap;
use std::path::Path;

use helios_nn::config::from_hf_json;
use helios_nn::weights::{read_tensors, with_file};
use helios_nn::{GptConfig, HostTensor, ParamStore};
use safetensors::Dtype;

const REF: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/gpt2_ref.safetensors"
);

fn metadata() -> std::collections::HashMap<String, String> {
    with_file(Path::new(REF), |_, meta| Ok(meta)).unwrap()
}

fn json(meta: &std::collections::HashMap<String, String>, key: &str) -> serde_json::Value {
    serde_json::from_str(&meta[key]).unwrap()
}

/// (B, T) int32 token ids of the file.
fn ids(name: &str) -> Vec<i32> {
    with_file(Path::new(REF), |st, _| {
        let v = st.tensor(name).unwrap();
        assert_eq!(v.dtype(), Dtype::I32, "{name}");
        assert_eq!(v.shape(), [2, 16], "{name}");
        Ok(v.data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect())
    })
    .unwrap()
}

#[test]
fn reference_metadata_describes_the_run() {
    let meta = metadata();
    let config = from_hf_json(&json(&meta, "config")).unwrap();
    assert_eq!(
        config,
        GptConfig {
            n_layer: 2,
            n_head: 2,
            n_embd: 64,
            vocab_size: 512,
            block_size: 64,
            layer_norm_eps: 1e-5,
        }
    );
    let adamw = json(&meta, "adamw");
    assert_eq!(adamw["lr"], 1e-3);
    assert_eq!(adamw["beta1"], 0.9);
    assert_eq!(adamw["beta2"], 0.95);
    assert_eq!(adamw["eps"], 1e-8);
    assert_eq!(adamw["weight_decay"], 0.1);
    assert!(adamw["grad_clip"].is_null());
    assert_eq!(meta["steps"], "10");
    assert_eq!(json(&meta, "batch")["B"], 2);
    assert_eq!(json(&meta, "batch")["T"], 16);
    assert!(json(&meta, "versions")["torch"].is_string());
}

#[test]
fn reference_tensors_have_the_expected_shapes() {
    let meta = metadata();
    let config = from_hf_json(&json(&meta, "config")).unwrap();
    // The int32 tokens: targets are the inputs shifted by one.
    let (x, y) = (ids("inputs"), ids("targets"));
    for b in 0..2 {
        assert_eq!(x[b * 16 + 1..(b + 1) * 16], y[b * 16..(b + 1) * 16 - 1]);
    }
    assert!(x.iter().chain(&y).all(|&t| (0..512).contains(&t)));

    // Everything but the token ids is f32.
    with_file(Path::new(REF), |st, _| {
        for (name, v) in st.iter() {
            if name != "inputs" && name != "targets" {
                assert_eq!(v.dtype(), Dtype::F32, "{name}");
            }
        }
        Ok(())
    })
    .unwrap();
    let specs = config.param_specs();
    let all = read_f32_tensors();
    assert_eq!(
        all.len(),
        2 * specs.len() + 3,
        "weights, grads, logits, loss, losses"
    );
    let mut weights = BTreeMap::new();
    for s in &specs {
        assert_eq!(all[&s.name].shape, s.shape, "{}", s.name);
        assert_eq!(
            all[&format!("grad.{}", s.name)].shape,
            s.shape,
            "grad.{}",
            s.name
        );
        assert!(all[&format!("grad.{}", s.name)]
            .data
            .iter()
            .all(|g| g.is_finite()));
        weights.insert(s.name.clone(), all[&s.name].clone());
    }
    assert_eq!(all["logits"].shape, [2, 16, 512]);
    let loss = all["loss"].data[0];
    // A fresh model is near uniform: ln(512) = 6.24.
    assert!((loss - 512f32.ln()).abs() < 0.1, "{loss}");
    let losses = &all["losses"].data;
    assert_eq!(losses.len(), 10);
    assert_eq!(losses[0], loss);
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
    // The weights form a complete store of the configuration.
    let store = ParamStore::from_tensors(&config, weights).unwrap();
    assert_eq!(store.num_params(), config.num_params());
    assert_eq!(config.num_params(), 136_960);
}

/// Every f32 tensor of the reference file (its int32 ids left out).
fn read_f32_tensors() -> BTreeMap<String, HostTensor> {
    // read_tensors refuses integer tensors by design, so copy the f32 ones to a scratch
    // file first: this also exercises read_tensors on a file transformers' stack wrote.
    let dir = std::env::temp_dir().join(format!("helios-nn-ref-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("f32.safetensors");
    with_file(Path::new(REF), |st, _| {
        let views: Vec<_> = st
            .iter()
            .filter(|(_, v)| v.dtype() == Dtype::F32)
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
        Ok(())
    })
    .unwrap();
    let tensors = read_tensors(&path).unwrap().tensors;
    std::fs::remove_dir_all(&dir).unwrap();
    tensors
}
