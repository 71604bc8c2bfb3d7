//! GptConfig: presets, parameter counts against Hugging Face's, validation, config.json.

use helios_nn::config::{from_hf_json, to_hf_json, PRESETS};
use helios_nn::{Error, GptConfig};

#[test]
fn presets_have_gpt2_parameter_counts() {
    // Hugging Face's counts (tied head counted once).
    assert_eq!(GptConfig::gpt2().num_params(), 124_439_808);
    assert_eq!(GptConfig::gpt2_medium().num_params(), 354_823_168);
    assert_eq!(GptConfig::distilgpt2().num_params(), 81_912_576);
    assert_eq!(GptConfig::tiny().num_params(), 7_242_624);
    assert_eq!(GptConfig::gpt2().num_params_non_embedding(), 85_056_000);
    assert_eq!(GptConfig::default(), GptConfig::tiny());
    for (name, _) in PRESETS {
        let c: GptConfig = name.parse().unwrap();
        c.validate().unwrap();
    }
    assert!(matches!(
        GptConfig::preset("gpt5"),
        Err(Error::UnknownPreset(_))
    ));
}

#[test]
fn param_specs_follow_hugging_face() {
    let c = GptConfig::gpt2();
    let specs = c.param_specs();
    assert_eq!(specs.len(), 2 + 12 * 12 + 2);
    assert_eq!(specs[0].name, "wte.weight");
    assert_eq!(specs[0].shape, vec![50257, 768]);
    assert_eq!(specs[1].name, "wpe.weight");
    assert_eq!(specs[1].shape, vec![1024, 768]);
    let find = |n: &str| specs.iter().find(|s| s.name == n).unwrap();
    assert_eq!(find("h.0.attn.c_attn.weight").shape, vec![768, 2304]); // Conv1D [in, out]
    assert_eq!(find("h.11.mlp.c_fc.weight").shape, vec![768, 3072]);
    assert_eq!(find("h.11.mlp.c_proj.weight").shape, vec![3072, 768]);
    assert_eq!(specs.last().unwrap().name, "ln_f.bias");
    // Weight decay on the matrices alone.
    for s in &specs {
        assert_eq!(s.weight_decay, s.shape.len() == 2, "{}", s.name);
    }
    assert_eq!(specs.iter().filter(|s| s.weight_decay).count(), 2 + 4 * 12);
}

#[test]
fn validation_names_the_field() {
    let mut c = GptConfig::tiny();
    c.n_head = 3; // 128 % 3 != 0
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("n_embd (128) is not a multiple of n_head (3)"),
        "{e}"
    );
    let mut c = GptConfig::tiny();
    c.n_layer = 0;
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("n_layer is 0"));
    let mut c = GptConfig::tiny();
    c.layer_norm_eps = f32::NAN;
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("layer_norm_eps"));
    let mut c = GptConfig::tiny();
    c.vocab_size = usize::MAX / 2;
    assert!(c.validate().is_err());
}

#[test]
fn hf_config_json_round_trips_and_refuses_variants() {
    for c in [GptConfig::tiny(), GptConfig::gpt2_medium()] {
        let v = to_hf_json(&c);
        assert_eq!(v["model_type"], "gpt2");
        assert_eq!(v["n_positions"], c.block_size);
        assert_eq!(from_hf_json(&v).unwrap(), c);
    }
    // A small vocabulary has no <|endoftext|>: transformers warns on an out-of-range id.
    let mut small = GptConfig::tiny();
    small.vocab_size = 512;
    assert!(to_hf_json(&small)["eos_token_id"].is_null());

    // The published gpt2 config.json (abridged): defaults fill what it leaves out.
    let published = serde_json::json!({
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
        "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257
    });
    assert_eq!(from_hf_json(&published).unwrap(), GptConfig::gpt2());

    for (key, bad) in [
        ("activation_function", serde_json::json!("relu")),
        ("n_inner", serde_json::json!(1000)),
        ("model_type", serde_json::json!("llama")),
        ("scale_attn_by_inverse_layer_idx", serde_json::json!(true)),
        ("n_head", serde_json::json!(7)),
        ("n_layer", serde_json::json!("twelve")),
    ] {
        let mut v = published.clone();
        v[key] = bad;
        let e = from_hf_json(&v).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{key}: {e}");
    }
}

#[test]
fn lr_schedule_warms_up_then_follows_a_cosine() {
    use helios_nn::LrSchedule;
    let s = LrSchedule {
        max_lr: 6e-4,
        min_lr: 6e-5,
        warmup_steps: 10,
        total_steps: 110,
    };
    s.validate().unwrap();
    assert!((s.lr_at(0) - 6e-5).abs() < 1e-12); // (0+1)/10 of max
    assert!((s.lr_at(9) - 6e-4).abs() < 1e-12);
    assert!((s.lr_at(10) - 6e-4).abs() < 1e-12);
    assert!((s.lr_at(60) - 3.3e-4).abs() < 1e-12); // half way down the cosine
    assert!((s.lr_at(110) - 6e-5).abs() < 1e-12);
    assert_eq!(s.lr_at(10_000), 6e-5);
    assert!((1..10).all(|i| s.lr_at(i) > s.lr_at(i - 1)));
    assert!((11..=110).all(|i| s.lr_at(i) <= s.lr_at(i - 1)));
    assert_eq!(LrSchedule::constant(1e-3).lr_at(5), 1e-3);
    let mut bad = s;
    bad.min_lr = 1.0;
    assert!(bad.validate().is_err());
    bad = s;
    bad.warmup_steps = 200;
    assert!(bad.validate().is_err());
}
