//! GPT-2 against PyTorch, as llm.c's test_gpt2 does: the reference file
//! (bench/gpt2_reference.py → tests/data/gpt2_ref.safetensors: 2 layers, 2 heads, 64
//! channels, vocabulary 512, B=2, T=16) gives weights, one batch, and PyTorch's logits, loss,
//! every parameter's gradient and the losses of 10 AdamW steps. Everything here is f32.
//!
//! Tolerances, with the errors measured on lavapipe (the test prints them): logits within
//! 1e-5 absolute (measured 3e-7); the loss within 1e-5 (6e-7); each gradient within 1e-4
//! of that gradient's largest magnitude and 1e-5 absolute (worst: 8e-7 relative, ln_1's
//! gain); the 10 AdamW losses within 1e-5 (1e-6). The margins leave room for a GPU's other
//! summation orders.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use helios::{Device, IndexTensor, Tensor};
use helios_nn::config::from_hf_json;
use helios_nn::model::{self, materialised_attention, GptParams};
use helios_nn::optim::AdamW;
use helios_nn::weights::{read_tensors, with_file};
use helios_nn::{AdamWHyper, GptConfig, HostTensor, OptimizerState, ParamStore};
use safetensors::Dtype;

const REF: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/gpt2_ref.safetensors"
);

fn device() -> Device {
    Device::from_env().expect("a Vulkan device (install mesa-vulkan-drivers)")
}

fn ids(name: &str) -> Vec<u32> {
    with_file(Path::new(REF), |st, _| {
        let v = st.tensor(name).unwrap();
        assert_eq!(v.dtype(), Dtype::I32);
        Ok(v.data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect())
    })
    .unwrap()
}

struct Reference {
    config: GptConfig,
    tensors: BTreeMap<String, HostTensor>,
    inputs: Vec<u32>,  // (B, T)
    targets: Vec<u32>, // (B, T)
}

fn reference() -> Reference {
    let meta = with_file(Path::new(REF), |_, meta| Ok(meta)).unwrap();
    let config = from_hf_json(&serde_json::from_str(&meta["config"]).unwrap()).unwrap();
    let scratch = common::Scratch::new("model-ref");
    let path = scratch.join("f32.safetensors");
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
    Reference {
        config,
        tensors: read_tensors(&path).unwrap().tensors,
        inputs: ids("inputs"),
        targets: ids("targets"),
    }
}

impl Reference {
    fn store(&self) -> ParamStore {
        let w = self
            .config
            .param_specs()
            .into_iter()
            .map(|s| (s.name.clone(), self.tensors[&s.name].clone()))
            .collect();
        ParamStore::from_tensors(&self.config, w).unwrap()
    }
}

/// (max |a - b|, max |b|).
fn max_err(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let scale = b.iter().map(|x| x.abs()).fold(0f32, f32::max);
    (err, scale)
}

#[test]
fn forward_backward_and_adamw_match_pytorch() {
    let r = reference();
    let dev = device();
    let (b, t) = (2, 16);
    let params = GptParams::upload(&r.store(), &dev, helios::DType::F32).unwrap();
    let (idx, pos) = model::inputs(&r.config, &dev, &r.inputs, b, t).unwrap();
    let targets = IndexTensor::from_slice(&dev, &r.targets, &[b, t]).unwrap();

    let logits = model::forward(&params, &idx, &pos).unwrap(); // (B, T, V)
    let loss = model::loss(&logits, &targets).unwrap();
    loss.backward().unwrap();

    let (err, _) = max_err(&logits.to_vec().unwrap(), &r.tensors["logits"].data);
    println!("logits: max abs error {err:.3e}");
    assert!(err < 1e-5, "logits differ by {err}");
    let got_loss = loss.to_vec().unwrap()[0];
    let want_loss = r.tensors["loss"].data[0];
    println!("loss: {got_loss} vs {want_loss}");
    assert!((got_loss - want_loss).abs() < 1e-5);

    let grads = params.grads_to_host().unwrap();
    let mut worst = (0f32, String::new());
    for spec in r.config.param_specs() {
        let want = &r.tensors[&format!("grad.{}", spec.name)].data;
        let (err, scale) = max_err(&grads[&spec.name].data, want);
        let rel = err / scale.max(1e-12);
        if rel > worst.0 {
            worst = (rel, spec.name.clone());
        }
        assert!(
            err < 1e-5 && rel < 1e-4,
            "grad {}: max abs error {err:.3e}, {rel:.3e} of its max-abs {scale:.3e}",
            spec.name
        );
    }
    println!(
        "gradients: worst relative error {:.3e} ({})",
        worst.0, worst.1
    );

    // 10 AdamW steps on the same batch: lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay
    // 0.1 on the matrices, no clipping (the file's metadata; reference.rs checks it).
    let hyper = AdamWHyper {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        grad_clip: None,
    };
    let mut opt = AdamW::new(&params, &OptimizerState::zeros(&r.config), hyper, None).unwrap();
    let want = &r.tensors["losses"].data;
    let mut got = vec![got_loss];
    opt.step(&params, 1e-3).unwrap();
    for _ in 1..10 {
        let logits = model::forward(&params, &idx, &pos).unwrap();
        let loss = model::loss(&logits, &targets).unwrap();
        loss.backward().unwrap();
        got.push(loss.to_vec().unwrap()[0]);
        opt.step(&params, 1e-3).unwrap();
    }
    println!("losses: {got:?}\nPyTorch: {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() < 1e-5,
            "AdamW losses differ: {got:?} vs {want:?}"
        );
    }
    assert!(dev.validation_messages().is_empty());
}

/// The fused attention the model runs against the materialised reference form, forward
/// and backward (through the fused qkv's gradient), at a T that is not a tile multiple.
#[test]
fn causal_self_attention_matches_the_materialised_form() {
    let dev = device();
    let (b, t, h, d) = (2, 19, 2, 16);
    let c = h * d;
    let n = b * t * 3 * c;
    let vals: Vec<f32> = (0..n)
        .map(|i| (((i * 37) % 23) as f32 - 11.0) / 9.0)
        .collect();
    let dy: Vec<f32> = (0..b * t * c)
        .map(|i| (((i * 13) % 17) as f32 - 8.0) / 5.0)
        .collect();
    let dy = Tensor::from_slice(&dev, &dy, &[b, t, c]).unwrap();
    let run = |f: &dyn Fn(&Tensor) -> Tensor| {
        let qkv = Tensor::from_slice(&dev, &vals, &[b, t, 3 * c])
            .unwrap()
            .requires_grad_();
        let y = f(&qkv);
        y.mul(&dy).unwrap().sum_all().unwrap().backward().unwrap();
        (y.to_vec().unwrap(), qkv.grad().unwrap().to_vec().unwrap())
    };
    let fused = run(&|x| model::fused_attention(x, h).unwrap());
    let reference = run(&|x| materialised_attention(x, h).unwrap());
    let (err, _) = max_err(&fused.0, &reference.0);
    assert!(err < 1e-5, "forward differs by {err}");
    let (err, scale) = max_err(&fused.1, &reference.1);
    assert!(err < 1e-5 * scale.max(1.0), "backward differs by {err}");
    // Position 0 sees only itself: its output is its own v, per head.
    let v0 = &vals[2 * c..3 * c];
    let (err, _) = max_err(&fused.0[..c], v0);
    assert!(err < 1e-6, "{err}");
    assert!(dev.validation_messages().is_empty());
}

/// The last-position head and greedy generation agree with the full forward pass.
#[test]
fn forward_last_and_greedy_generation_follow_the_full_forward() {
    use helios_nn::generate::{generate, Sampling};
    let r = reference();
    let dev = device();
    let params = GptParams::upload(&r.store(), &dev, helios::DType::F32).unwrap();
    let prompt = &r.inputs[..5];
    let greedy = Sampling {
        temperature: 0.0,
        ..Sampling::default()
    };
    let out = generate(&params, &dev, prompt, 3, &greedy, |_| {}).unwrap();
    assert_eq!(&out[..5], prompt);
    let v = r.config.vocab_size;
    for i in 5..8 {
        let (idx, pos) = model::inputs(&r.config, &dev, &out[..i], 1, i).unwrap();
        let all = helios::no_grad(|| model::forward(&params, &idx, &pos))
            .unwrap()
            .to_vec()
            .unwrap(); // (1, i, V)
        let last = &all[(i - 1) * v..];
        let last_only = helios::no_grad(|| model::forward_last(&params, &idx, &pos))
            .unwrap()
            .to_vec()
            .unwrap(); // (1, V)
        let (err, _) = max_err(&last_only, last);
        assert!(err < 1e-5, "{err}");
        let argmax = (0..v).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap();
        assert_eq!(out[i], argmax as u32, "token {i}");
    }
}

/// bf16 autocast (bf16 weights and activations, f32 master weights and moments) follows the
/// fp32 PyTorch reference loosely: the first loss within 0.02, the tenth within 0.05
/// (measured on lavapipe: 1e-4 and 2e-4; the loose bounds allow a GPU's bf16 matmuls).
#[test]
fn bf16_with_f32_masters_follows_the_reference() {
    let r = reference();
    let dev = device();
    let (b, t) = (2, 16);
    let (params, master) =
        helios_nn::optim::upload_with_master(&r.store(), &dev, helios::DType::BF16).unwrap();
    assert_eq!(params.tensors()[0].dtype(), helios::DType::BF16);
    let (idx, pos) = model::inputs(&r.config, &dev, &r.inputs, b, t).unwrap();
    let targets = IndexTensor::from_slice(&dev, &r.targets, &[b, t]).unwrap();
    let hyper = AdamWHyper {
        grad_clip: None,
        ..AdamWHyper::default()
    };
    let mut opt = AdamW::new(&params, &OptimizerState::zeros(&r.config), hyper, master).unwrap();
    let want = &r.tensors["losses"].data;
    let mut got = vec![];
    for _ in 0..10 {
        let logits = model::forward(&params, &idx, &pos).unwrap();
        let loss = model::loss(&logits, &targets).unwrap();
        loss.backward().unwrap();
        got.push(loss.to_vec().unwrap()[0]);
        opt.step(&params, 1e-3).unwrap();
    }
    println!("bf16 losses: {got:?}");
    assert!((got[0] - want[0]).abs() < 0.02, "{got:?} vs {want:?}");
    assert!((got[9] - want[9]).abs() < 0.05, "{got:?} vs {want:?}");
    // The masters moved in f32; the model's bf16 tensors are their rounding.
    let w = opt.weights(&params).unwrap();
    let wte = &w.get("wte.weight").unwrap().data;
    let bf = params.tensors()[0].to_vec().unwrap();
    assert!(wte
        .iter()
        .zip(&bf)
        .all(|(m, b)| helios::DType::BF16.round(*m) == *b));
    assert!(dev.validation_messages().is_empty());
}

/// Decoding with the key/value cache gives the tokens and logits of recomputing the window,
/// also past the model's block size (where it falls back to recomputing).
#[test]
fn kv_cache_generation_matches_recomputation() {
    use helios_nn::generate::{generate, generate_recompute, Sampling};
    use helios_nn::kv_cache::{self, KvCache};
    let r = reference();
    let dev = device();
    let params = GptParams::upload(&r.store(), &dev, helios::DType::F32).unwrap();
    // Logits of every position of the batch's first row, one cached step at a time.
    let t = 16;
    let row = &r.inputs[..t];
    let v = r.config.vocab_size;
    let mut cache = KvCache::new(&params).unwrap();
    for (i, &tok) in row.iter().enumerate() {
        let got = kv_cache::step(&params, &mut cache, tok)
            .unwrap()
            .to_vec()
            .unwrap();
        let want = &r.tensors["logits"].data[i * v..(i + 1) * v];
        let (err, _) = max_err(&got, want);
        assert!(err < 1e-4, "position {i}: {err}");
    }
    // Sampled generation, crossing the block size (64) from a 10-token prompt.
    let s = Sampling {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 3,
    };
    let prompt = &r.inputs[..10];
    // What the first token is drawn from: the whole prompt's last logits, as recomputation
    // gets them, against the reference.
    let (idx, pos) = model::inputs(&r.config, &dev, prompt, 1, prompt.len()).unwrap();
    let last = helios::no_grad(|| model::forward_last(&params, &idx, &pos))
        .unwrap()
        .to_vec()
        .unwrap();
    let at = prompt.len() - 1;
    let (err, _) = max_err(&last, &r.tensors["logits"].data[at * v..(at + 1) * v]);
    assert!(err < 1e-4, "prompt logits: {err}");
    let cached = generate(&params, &dev, prompt, 60, &s, |_| {}).unwrap();
    let full = generate_recompute(&params, &dev, prompt, 60, &s, |_| {}).unwrap();
    assert_eq!(cached, full);
    assert!(dev.validation_messages().is_empty());
}

/// Greedy decoding with the key/value cache, token by token: each step's logits match
/// recomputing the whole window (f32 within 1e-4 absolute, as above, measured 2e-7; bf16
/// within 1e-2 of logits below 1, a few bf16 ulps, since the two paths round different
/// intermediates to bf16: measured identical on lavapipe; both printed), the f32 argmax is
/// the same token, and `generate` at temperature 0 gives recomputation's tokens, crossing
/// the block size.
#[test]
fn greedy_kv_cache_decoding_matches_recomputation_token_by_token() {
    use helios_nn::generate::{generate, generate_recompute, Sampling};
    use helios_nn::kv_cache::{self, KvCache};
    let r = reference();
    let dev = device();
    let argmax = |x: &[f32]| (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap() as u32;
    for (dtype, tol) in [(helios::DType::F32, 1e-4), (helios::DType::BF16, 1e-2)] {
        let params = GptParams::upload(&r.store(), &dev, dtype).unwrap();
        let mut tokens = r.inputs[..5].to_vec();
        let mut cache = KvCache::new(&params).unwrap();
        let mut logits = None;
        for &t in &tokens {
            logits = Some(kv_cache::step(&params, &mut cache, t).unwrap());
        }
        let (mut worst, mut scale) = (0f32, 0f32);
        while !cache.is_full() {
            let cached = logits.take().unwrap().to_vec().unwrap();
            let (idx, pos) = model::inputs(&r.config, &dev, &tokens, 1, tokens.len()).unwrap();
            let full = helios::no_grad(|| model::forward_last(&params, &idx, &pos))
                .unwrap()
                .to_vec()
                .unwrap();
            let (err, of) = max_err(&cached, &full);
            assert!(
                err <= tol,
                "{dtype} at {} tokens: {err} of {of}",
                tokens.len()
            );
            worst = worst.max(err);
            scale = scale.max(of);
            let next = argmax(&cached);
            if dtype == helios::DType::F32 {
                assert_eq!(next, argmax(&full), "at {} tokens", tokens.len());
            }
            tokens.push(next);
            logits = Some(kv_cache::step(&params, &mut cache, next).unwrap());
        }
        println!(
            "{dtype}: cached against recomputed logits, max abs error {worst:.2e} of {scale:.2e}"
        );
    }
    let params = GptParams::upload(&r.store(), &dev, helios::DType::F32).unwrap();
    let greedy = Sampling {
        temperature: 0.0,
        ..Sampling::default()
    };
    let prompt = &r.inputs[..3];
    let cached = generate(&params, &dev, prompt, 70, &greedy, |_| {}).unwrap();
    let full = generate_recompute(&params, &dev, prompt, 70, &greedy, |_| {}).unwrap();
    assert_eq!(cached, full);
    assert!(dev.validation_messages().is_empty());
}

/// A cache of several sequences decodes each as the reference computes its row: every
/// row's logits at every position: f32 within 1e-4 and bf16 within 1e-2 absolute, the
/// bounds one sequence gets against its recomputation (lavapipe: 2.1e-7 and 4.5e-3).
/// A step given a token count other than the batch's says so.
#[test]
fn kv_cache_decodes_a_batch_of_sequences_like_the_reference() {
    use helios_nn::kv_cache::{self, KvCache};
    let r = reference();
    let dev = device();
    let shape = &r.tensors["logits"].shape; // (B, T, V)
    let (b, t, v) = (shape[0], shape[1].min(12), shape[2]);
    assert!(b > 1, "the reference has {b} rows");
    let full_t = shape[1];
    for (dtype, tol) in [(helios::DType::F32, 1e-4), (helios::DType::BF16, 1e-2)] {
        let params = GptParams::upload(&r.store(), &dev, dtype).unwrap();
        let mut cache = KvCache::with_batch(&params, b).unwrap();
        assert_eq!(cache.batch(), b);
        let mut worst = 0f32;
        for i in 0..t {
            let tokens: Vec<u32> = (0..b).map(|row| r.inputs[row * full_t + i]).collect();
            let got = kv_cache::step_batch(&params, &mut cache, &tokens)
                .unwrap()
                .to_vec()
                .unwrap();
            assert_eq!(got.len(), b * v);
            for row in 0..b {
                let at = (row * full_t + i) * v;
                let want = &r.tensors["logits"].data[at..at + v];
                let (err, _) = max_err(&got[row * v..(row + 1) * v], want);
                assert!(err < tol, "{dtype} row {row} position {i}: {err}");
                worst = worst.max(err);
            }
        }
        println!("{dtype}: {b} sequences of {t} positions, max abs error {worst:.2e}");
        let err = kv_cache::step_batch(&params, &mut cache, &[1]).unwrap_err();
        assert!(err.to_string().contains("one per sequence"), "{err}");
    }
    assert!(dev.validation_messages().is_empty());
}

/// Decoding with the cache compiles nothing after its first two tokens, while the cache
/// grows from 3 keys to 160 (past the 64 keys of one attention chunk at 2 heads), as the
/// matmul and softmax of every new length did before. A fresh device: only this test's
/// kernels count.
#[test]
fn kv_cache_steps_compile_nothing_after_the_first_tokens() {
    use helios_nn::kv_cache::{self, KvCache};
    let dev = device();
    let config = GptConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        vocab_size: 128,
        block_size: 160,
        layer_norm_eps: 1e-5,
    };
    let store = ParamStore::init_gpt2(&config, 5).unwrap();
    for dtype in [helios::DType::F32, helios::DType::BF16] {
        let params = GptParams::upload(&store, &dev, dtype).unwrap();
        let mut cache = KvCache::new(&params).unwrap();
        let mut compiled = None;
        let mut token = 1;
        while !cache.is_full() {
            let logits = kv_cache::step(&params, &mut cache, token).unwrap();
            let l = logits.to_vec().unwrap();
            token = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
            if cache.len() == 2 {
                compiled = Some(dev.compiled_kernels());
            }
        }
        assert_eq!(
            Some(dev.compiled_kernels()),
            compiled,
            "{dtype}: tokens 3 to 160 compiled kernels"
        );
    }
    assert!(dev.validation_messages().is_empty());
}

/// In f32 the model's attention (helios' op, in its materialised form) keeps only its output
/// and log-sum-exp for backward: after the forward pass nothing of the (B, H, T, T) scores
/// or probabilities is held, while the plain materialised form holds at least the
/// probabilities. Gradients agree.
#[test]
fn f32_attention_keeps_no_scores_for_backward() {
    let dev = device();
    let (b, t, h, d) = (2, 128, 4, 16);
    let c = h * d;
    let vals: Vec<f32> = (0..b * t * 3 * c)
        .map(|i| (((i * 29) % 31) as f32 - 15.0) / 40.0)
        .collect();
    let scores = (b * h * t * t * 4) as u64;
    let run = |f: &dyn Fn(&Tensor) -> Tensor| {
        let qkv = Tensor::from_slice(&dev, &vals, &[b, t, 3 * c])
            .unwrap()
            .requires_grad_();
        dev.synchronize().unwrap();
        let before = dev.memory_stats().bytes_in_use;
        let y = f(&qkv);
        y.realize().unwrap();
        dev.synchronize().unwrap();
        let held = dev.memory_stats().bytes_in_use - before;
        y.sum_all().unwrap().backward().unwrap();
        (held, qkv.grad().unwrap().to_vec().unwrap())
    };
    let (held_ckpt, g_ckpt) = run(&|x| model::causal_self_attention(x, h).unwrap());
    let (held_plain, g_plain) = run(&|x| materialised_attention(x, h).unwrap());
    assert!(
        held_ckpt < scores,
        "checkpointed forward holds {held_ckpt} B, scores are {scores} B"
    );
    assert!(
        held_plain >= scores,
        "plain {held_plain} B, scores {scores} B"
    );
    // The op's products skip the masked half and read the heads in place: the same sums
    // in another order.
    let (err, scale) = max_err(&g_ckpt, &g_plain);
    assert!(err < 1e-6 * scale.max(1.0), "gradients differ by {err}");
    assert!(dev.validation_messages().is_empty());
}

/// A vocabulary that is not a multiple of 128 (300, padded to 384 on the device) gives the
/// logits, loss, gradients (through `forward_loss`, what training runs, and through
/// `loss(forward)`), gradient norms and AdamW steps of the same model run unpadded (wte
/// (V, C) through `GptParams::from_tensors`), its padded rows stay exactly zero under
/// weight decay, everything that reaches the host has Hugging Face's shapes, and sampling
/// with the key/value cache picks ids below V and equals recomputation. Tolerances: 1e-6 of
/// each tensor's largest magnitude (the same f32 arithmetic; only the matmul tiles and the
/// cross-entropy's row alignment differ; measured on lavapipe: printed).
#[test]
fn padded_vocabulary_equals_the_unpadded_model() {
    use helios_nn::generate::{generate, generate_recompute, Sampling};
    use helios_nn::model::padded_vocab;
    let dev = device();
    let config = GptConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        vocab_size: 300,
        block_size: 16,
        layer_norm_eps: 1e-5,
    };
    let (v, c, vp) = (300, 32, padded_vocab(300));
    assert_eq!(vp, 384);
    assert_eq!(padded_vocab(512), 512);
    let store = ParamStore::init_gpt2(&config, 7).unwrap();
    let padded = GptParams::upload(&store, &dev, helios::DType::F32).unwrap();
    assert_eq!(padded.tensors()[0].shape(), &[vp, c]);
    let plain = store
        .iter()
        .map(|(_, t)| t.upload(&dev, helios::DType::F32).unwrap())
        .collect();
    let plain = GptParams::from_tensors(&config, plain).unwrap();
    assert_eq!(plain.tensors()[0].shape(), &[v, c]);

    let (b, t) = (2, 16);
    let ids: Vec<u32> = (0..b * t).map(|i| ((i * 97 + 13) % v) as u32).collect();
    let tg: Vec<u32> = (0..b * t).map(|i| ((i * 61 + 299) % v) as u32).collect();
    let (idx, pos) = model::inputs(&config, &dev, &ids, b, t).unwrap();
    let targets = IndexTensor::from_slice(&dev, &tg, &[b, t]).unwrap();
    let close = |what: &str, got: &[f32], want: &[f32]| {
        let (err, scale) = max_err(got, want);
        println!("{what}: max abs error {err:.3e} of {scale:.3e}");
        assert!(err <= 1e-6 * scale.max(1e-6), "{what}: {err} of {scale}");
    };
    let hyper = AdamWHyper {
        grad_clip: Some(1.0),
        weight_decay: 0.1,
        ..AdamWHyper::default()
    };
    let zeros = OptimizerState::zeros(&config);
    let mut opt_p = AdamW::new(&padded, &zeros, hyper, None).unwrap();
    let mut opt_u = AdamW::new(&plain, &zeros, hyper, None).unwrap();
    // The (B, T, V) logits' loss and gradients (backward through the view's narrow).
    let via_view = |p: &GptParams| {
        let logits = model::forward(p, &idx, &pos).unwrap();
        assert_eq!(logits.shape(), &[b, t, v]);
        let loss = model::loss(&logits, &targets).unwrap();
        loss.backward().unwrap();
        let grads = p.grads_to_host().unwrap();
        p.zero_grad();
        (logits.to_vec().unwrap(), loss.to_vec().unwrap(), grads)
    };
    let (logits_p, loss_p, grads_p) = via_view(&padded);
    let (logits_u, loss_u, grads_u) = via_view(&plain);
    close("view logits", &logits_p, &logits_u);
    close("view loss", &loss_p, &loss_u);
    for spec in config.param_specs() {
        assert_eq!(grads_p[&spec.name].shape, spec.shape);
        let what = format!("view grad {}", spec.name);
        close(&what, &grads_p[&spec.name].data, &grads_u[&spec.name].data);
    }
    // Training's form, with AdamW steps (decay, clipping to the global norm).
    for step in 0..5 {
        let run = |p: &GptParams, opt: &mut AdamW| {
            let logits = helios::no_grad(|| model::forward(p, &idx, &pos)).unwrap();
            let loss = model::forward_loss(p, &idx, &pos, &targets).unwrap();
            loss.backward().unwrap();
            let grads = p.grads_to_host().unwrap();
            let norm = opt.step(p, 1e-2).unwrap().to_vec().unwrap();
            (
                logits.to_vec().unwrap(),
                loss.to_vec().unwrap(),
                grads,
                norm,
            )
        };
        let (logits_p, loss_p, grads_p, norm_p) = run(&padded, &mut opt_p);
        let (logits_u, loss_u, grads_u, norm_u) = run(&plain, &mut opt_u);
        close(&format!("step {step} logits"), &logits_p, &logits_u);
        close(&format!("step {step} loss"), &loss_p, &loss_u);
        close(&format!("step {step} grad norm"), &norm_p, &norm_u);
        if step == 0 {
            for spec in config.param_specs() {
                assert_eq!(grads_p[&spec.name].shape, spec.shape);
                let what = format!("grad {}", spec.name);
                close(&what, &grads_p[&spec.name].data, &grads_u[&spec.name].data);
            }
        }
    }
    // The padded rows are still exactly zero (decay of 0 is 0; their gradient is 0), and
    // nothing of them reaches the host.
    let wte = padded.tensors()[0].to_vec().unwrap();
    assert!(wte[v * c..].iter().all(|&x| x == 0.0), "padded rows moved");
    let (wp, wu) = (padded.download().unwrap(), plain.download().unwrap());
    for spec in config.param_specs() {
        assert_eq!(wp.get(&spec.name).unwrap().shape, spec.shape);
        close(
            &format!("weights {}", spec.name),
            &wp.get(&spec.name).unwrap().data,
            &wu.get(&spec.name).unwrap().data,
        );
    }
    let state = opt_p.state(&padded).unwrap();
    assert_eq!(state.m["wte.weight"].shape, [v, c]);
    assert_eq!(state.v["wte.weight"].shape, [v, c]);

    // Generation: every id below V, the cache equal to recomputation, crossing the block size.
    let s = Sampling {
        temperature: 1.5,
        top_k: 0,
        top_p: 1.0,
        seed: 9,
    };
    let prompt = &ids[..5];
    let cached = generate(&padded, &dev, prompt, 30, &s, |_| {}).unwrap();
    let full = generate_recompute(&padded, &dev, prompt, 30, &s, |_| {}).unwrap();
    assert_eq!(cached, full);
    assert!(cached.iter().all(|&id| (id as usize) < v));
    let last = helios::no_grad(|| model::forward_last(&padded, &idx, &pos))
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(last.len(), b * v);
    assert!(dev.validation_messages().is_empty());
}
