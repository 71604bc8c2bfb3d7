//! Checkpoints and weight files: bit-exact round trips, Hugging Face's name variants, and
//! every error a damaged or mismatched file must give.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{small_config, Scratch};
use helios::DType;
use helios_nn::checkpoint::{CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE};
use helios_nn::{
    load_checkpoint, load_pretrained, load_weights, save_checkpoint, save_pretrained, save_weights,
    AdamWHyper, BatchSampler, Error, GptConfig, HostTensor, LrSchedule, OptimizerState, ParamStore,
    Tokens, TrainerState,
};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

fn params(seed: u64) -> ParamStore {
    let mut p = ParamStore::init_gpt2(&small_config(), seed).unwrap();
    // Make biases and gains non-trivial too.
    let names: Vec<String> = p.iter().map(|(s, _)| s.name).collect();
    for (i, n) in names.iter().enumerate() {
        let mut t = p.get(n).unwrap().clone();
        for (j, v) in t.data.iter_mut().enumerate() {
            *v += (i * 31 + j) as f32 * 1e-3;
        }
        p.set(n, t).unwrap();
    }
    p
}

fn optimizer(config: &GptConfig) -> OptimizerState {
    let mut o = OptimizerState::zeros(config);
    o.step = 17;
    for (k, (m, v)) in o.m.values_mut().zip(o.v.values_mut()).enumerate() {
        for (j, (a, b)) in m.data.iter_mut().zip(v.data.iter_mut()).enumerate() {
            *a = ((k + j) as f32).sin() * 1e-2;
            *b = ((k * j) as f32).cos().abs() * 1e-4 + 1e-12;
        }
    }
    o
}

fn trainer(config: &GptConfig) -> TrainerState {
    let data = Tokens::from_ids(&(0..500).collect::<Vec<_>>(), "mem").unwrap();
    let mut sampler = BatchSampler::new(data, 2, 8, 99).unwrap();
    for _ in 0..17 {
        sampler.next_batch();
    }
    TrainerState {
        format: helios_nn::checkpoint::TRAINER_FORMAT,
        step: 17,
        seed: 99,
        sampler: sampler.state(),
        schedule: LrSchedule {
            max_lr: 6e-4,
            min_lr: 6e-5,
            warmup_steps: 10,
            total_steps: 1000,
        },
        adamw: AdamWHyper::default(),
        model: config.clone(),
        extra: serde_json::json!({"data": "data/shakespeare/shakespeare.txt", "loss": [5.5, 5.25]}),
    }
}

/// Writes raw tensors (name, dtype, shape, little-endian bytes) with the safetensors crate.
fn write_raw(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn f32_bytes(t: &HostTensor) -> Vec<u8> {
    t.data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The store's tensors as raw f32 entries, named by `rename`.
fn raw_entries(
    p: &ParamStore,
    rename: impl Fn(&str) -> String,
) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    p.iter()
        .map(|(s, t)| (rename(&s.name), Dtype::F32, t.shape.clone(), f32_bytes(t)))
        .collect()
}

#[test]
fn checkpoint_round_trip_is_bit_exact() {
    let dir = Scratch::new("ckpt");
    let ckpt = dir.join("run/ckpt");
    let (p, cfg) = (params(1), small_config());
    let (o, t) = (optimizer(&cfg), trainer(&cfg));
    save_checkpoint(&ckpt, &p, &o, &t).unwrap();
    assert_eq!(
        common::entries(&ckpt),
        [CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE]
    );
    // No staging or old directories are left beside it.
    assert_eq!(common::entries(&dir.join("run")), ["ckpt"]);

    let back = load_checkpoint(&ckpt).unwrap();
    assert_eq!(back.params, p); // f32 equality of every value: bit-exact for finite values
    for ((a, _), (b, _)) in back.params.iter().zip(p.iter()) {
        assert_eq!(a, b);
    }
    let bits = |s: &ParamStore| -> Vec<u32> {
        s.iter()
            .flat_map(|(_, t)| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
            .collect()
    };
    assert_eq!(bits(&back.params), bits(&p));
    assert_eq!(back.optimizer.as_ref(), Some(&o));
    assert_eq!(back.trainer.as_ref(), Some(&t));

    // Saving again replaces it whole.
    let p2 = params(2);
    save_checkpoint(&ckpt, &p2, &o, &t).unwrap();
    assert_eq!(load_checkpoint(&ckpt).unwrap().params, p2);
    assert_eq!(common::entries(&dir.join("run")), ["ckpt"]);
}

#[test]
fn narrow_dtypes_round_trip_bit_exact() {
    for dtype in [DType::BF16, DType::F16] {
        let dir = Scratch::new("narrow");
        let mut p = params(3);
        let names: Vec<String> = p.iter().map(|(s, _)| s.name).collect();
        for n in &names {
            let mut t = p.get(n).unwrap().clone();
            t.round_to(dtype);
            p.set(n, t).unwrap();
        }
        save_pretrained(dir.path(), &p, dtype).unwrap();
        assert_eq!(common::entries(dir.path()), [CONFIG_FILE, MODEL_FILE]);
        // 2 bytes a value (plus the header).
        let size = std::fs::metadata(dir.join(MODEL_FILE)).unwrap().len() as usize;
        assert!(size < 2 * p.num_params() + 8192, "{size}");
        let back = load_pretrained(dir.path(), None).unwrap();
        assert_eq!(back, p, "{dtype}");
        // A lone weights file too, with the config given.
        let file = dir.join("w.safetensors");
        save_weights(&file, &p, dtype).unwrap();
        assert_eq!(load_pretrained(&file, Some(&small_config())).unwrap(), p);
        // Without a config the one beside the file is used.
        assert_eq!(load_pretrained(&file, None).unwrap(), p);
    }
}

#[test]
fn hugging_face_name_variants_load() {
    let dir = Scratch::new("names");
    let (p, cfg) = (params(4), small_config());
    let wte = p.get("wte.weight").unwrap().clone();
    let mask = (Dtype::F32, vec![1, 1, 16, 16], vec![0u8; 4 * 256]);

    // As transformers' GPT2LMHeadModel.save_pretrained writes it: prefixed, no lm_head.
    let prefixed = dir.join("prefixed.safetensors");
    write_raw(&prefixed, &raw_entries(&p, |n| format!("transformer.{n}")));
    assert_eq!(load_weights(&prefixed, &cfg).unwrap(), p);

    // As the published gpt2 checkpoint: no prefix, the attention-mask buffers present.
    let mut entries = raw_entries(&p, |n| n.to_string());
    for l in 0..2 {
        entries.push((
            format!("h.{l}.attn.bias"),
            mask.0,
            mask.1.clone(),
            mask.2.clone(),
        ));
        entries.push((
            format!("h.{l}.attn.masked_bias"),
            Dtype::F32,
            vec![],
            vec![0; 4],
        ));
    }
    let bare = dir.join("bare.safetensors");
    write_raw(&bare, &entries);
    assert_eq!(load_weights(&bare, &cfg).unwrap(), p);

    // With the tied head stored as well (equal to wte), prefixed and not.
    let mut with_head = raw_entries(&p, |n| format!("transformer.{n}"));
    with_head.push((
        "lm_head.weight".into(),
        Dtype::F32,
        wte.shape.clone(),
        f32_bytes(&wte),
    ));
    let head = dir.join("head.safetensors");
    write_raw(&head, &with_head);
    assert_eq!(load_weights(&head, &cfg).unwrap(), p);

    // Only lm_head, no wte: the same tensor under its other name.
    let mut head_only = raw_entries(&p, |n| n.to_string());
    head_only.retain(|e| e.0 != "wte.weight");
    head_only.push((
        "lm_head.weight".into(),
        Dtype::F32,
        wte.shape.clone(),
        f32_bytes(&wte),
    ));
    let h = dir.join("head_only.safetensors");
    write_raw(&h, &head_only);
    assert_eq!(load_weights(&h, &cfg).unwrap(), p);

    // An untied head is refused: Helios ties it.
    let mut other = wte.clone();
    other.data[0] += 1.0;
    let mut untied = raw_entries(&p, |n| n.to_string());
    untied.push((
        "lm_head.weight".into(),
        Dtype::F32,
        other.shape.clone(),
        f32_bytes(&other),
    ));
    let u = dir.join("untied.safetensors");
    write_raw(&u, &untied);
    assert!(matches!(
        load_weights(&u, &cfg),
        Err(Error::UntiedHead { .. })
    ));

    // What Helios writes has the prefix and no head, as save_pretrained does.
    let ours = dir.join("ours.safetensors");
    save_weights(&ours, &p, DType::F32).unwrap();
    let names = helios_nn::weights::with_file(&ours, |st, meta| {
        assert_eq!(meta.get("format").map(String::as_str), Some("pt"));
        Ok(st.names().iter().map(|s| s.to_string()).collect::<Vec<_>>())
    })
    .unwrap();
    assert!(
        names.iter().all(|n| n.starts_with("transformer.")),
        "{names:?}"
    );
    assert_eq!(names.len(), cfg.param_specs().len());
}

#[test]
fn damaged_and_mismatched_files_give_the_right_error() {
    let dir = Scratch::new("errors");
    let (p, cfg) = (params(5), small_config());
    let good = dir.join("good.safetensors");
    save_weights(&good, &p, DType::F32).unwrap();
    let bytes = std::fs::read(&good).unwrap();

    // Missing file.
    let e = load_weights(&dir.join("none.safetensors"), &cfg).unwrap_err();
    assert!(matches!(e, Error::MissingFile { .. }), "{e}");

    // Truncated: mid-data, mid-header, and shorter than the length prefix.
    for keep in [bytes.len() - 100, 200, 5, 0] {
        let t = dir.join("truncated.safetensors");
        std::fs::write(&t, &bytes[..keep]).unwrap();
        let e = load_weights(&t, &cfg).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{keep}: {e}");
        assert!(e.to_string().contains("corrupt or truncated"), "{e}");
    }
    // Garbage header.
    let mut g = bytes.clone();
    g[10] = b'!';
    let garbled = dir.join("garbled.safetensors");
    std::fs::write(&garbled, &g).unwrap();
    assert!(matches!(
        load_weights(&garbled, &cfg),
        Err(Error::Corrupt { .. })
    ));

    // Missing tensor.
    let mut entries = raw_entries(&p, |n| n.to_string());
    entries.retain(|e| e.0 != "h.1.mlp.c_fc.bias");
    let missing = dir.join("missing.safetensors");
    write_raw(&missing, &entries);
    match load_weights(&missing, &cfg).unwrap_err() {
        Error::MissingTensor { name, .. } => assert_eq!(name, "h.1.mlp.c_fc.bias"),
        e => panic!("{e}"),
    }

    // Wrong shape: a transposed Conv1D weight ([out, in] as nn.Linear would store it).
    let mut entries = raw_entries(&p, |n| n.to_string());
    let e = entries
        .iter_mut()
        .find(|e| e.0 == "h.0.mlp.c_fc.weight")
        .unwrap();
    e.2 = vec![32, 8];
    let wrong = dir.join("wrong.safetensors");
    write_raw(&wrong, &entries);
    match load_weights(&wrong, &cfg).unwrap_err() {
        Error::WrongShape {
            name,
            expected,
            got,
        } => {
            assert_eq!(name, "h.0.mlp.c_fc.weight");
            assert_eq!((expected, got), (vec![8, 32], vec![32, 8]));
        }
        e => panic!("{e}"),
    }

    // Vocabulary mismatch: a checkpoint of another vocabulary.
    let mut bigger = cfg.clone();
    bigger.vocab_size = 80;
    let e = load_weights(&good, &bigger).unwrap_err();
    match &e {
        Error::VocabMismatch { expected, got, .. } => assert_eq!((*expected, *got), (80, 64)),
        _ => panic!("{e}"),
    }

    // Unsupported dtype.
    let mut entries = raw_entries(&p, |n| n.to_string());
    let e = entries.iter_mut().find(|e| e.0 == "ln_f.bias").unwrap();
    e.1 = Dtype::I32;
    let ints = dir.join("ints.safetensors");
    write_raw(&ints, &entries);
    match load_weights(&ints, &cfg).unwrap_err() {
        Error::UnsupportedDtype { name, dtype } => {
            assert_eq!((name.as_str(), dtype.as_str()), ("ln_f.bias", "I32"))
        }
        e => panic!("{e}"),
    }

    // The same parameter twice, with and without the prefix.
    let mut entries = raw_entries(&p, |n| n.to_string());
    let dup = entries.iter().find(|e| e.0 == "ln_f.bias").unwrap().clone();
    entries.push(("transformer.ln_f.bias".into(), dup.1, dup.2, dup.3));
    let twice = dir.join("twice.safetensors");
    write_raw(&twice, &entries);
    let e = load_weights(&twice, &cfg).unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");

    // A tensor that is no GPT-2 parameter (another architecture's head).
    let mut entries = raw_entries(&p, |n| n.to_string());
    entries.push(("score.weight".into(), Dtype::F32, vec![2, 8], vec![0; 64]));
    let extra = dir.join("extra.safetensors");
    write_raw(&extra, &entries);
    assert!(matches!(
        load_weights(&extra, &cfg),
        Err(Error::UnexpectedTensor { .. })
    ));
}

#[test]
fn checkpoint_directory_errors() {
    let dir = Scratch::new("dir-errors");
    let cfg = small_config();
    let e = load_checkpoint(&dir.join("none")).unwrap_err();
    assert!(matches!(e, Error::MissingFile { .. }), "{e}");

    let ckpt = dir.join("ckpt");
    save_checkpoint(&ckpt, &params(6), &optimizer(&cfg), &trainer(&cfg)).unwrap();
    // Half the resume state.
    std::fs::remove_file(ckpt.join(TRAINER_FILE)).unwrap();
    let e = load_checkpoint(&ckpt).unwrap_err();
    assert!(e.to_string().contains("go together"), "{e}");
    // No config.json.
    std::fs::remove_file(ckpt.join(CONFIG_FILE)).unwrap();
    let e = load_checkpoint(&ckpt).unwrap_err();
    assert!(
        matches!(
            e,
            Error::MissingFile {
                what: "config.json",
                ..
            }
        ),
        "{e}"
    );
    // A corrupt config.json.
    std::fs::write(ckpt.join(CONFIG_FILE), "{ not json").unwrap();
    assert!(matches!(load_checkpoint(&ckpt), Err(Error::Json { .. })));

    // Inconsistent inputs are refused before anything is written.
    let good = dir.join("good");
    let mut t = trainer(&cfg);
    t.step = 3;
    let e = save_checkpoint(&good, &params(6), &optimizer(&cfg), &t).unwrap_err();
    assert!(e.to_string().contains("differ"), "{e}");
    let mut o = optimizer(&cfg);
    o.m.remove("wpe.weight");
    assert!(save_checkpoint(&good, &params(6), &o, &trainer(&cfg)).is_err());
    assert!(!good.exists());

    // A damaged optimizer file fails the load and leaves the message naming it.
    save_checkpoint(&good, &params(6), &optimizer(&cfg), &trainer(&cfg)).unwrap();
    let opt = good.join(OPTIMIZER_FILE);
    let len = std::fs::metadata(&opt).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&opt)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let e = load_checkpoint(&good).unwrap_err();
    assert!(e.to_string().contains("optimizer.safetensors"), "{e}");
}

#[test]
fn bad_input_never_replaces_a_checkpoint() {
    let dir = Scratch::new("keep");
    let cfg = small_config();
    let ckpt = dir.join("ckpt");
    let p = params(7);
    save_checkpoint(&ckpt, &p, &optimizer(&cfg), &trainer(&cfg)).unwrap();
    let mut o = optimizer(&cfg);
    o.v.insert("h.0.ln_1.weight".into(), HostTensor::zeros(&[3]));
    assert!(save_checkpoint(&ckpt, &params(8), &o, &trainer(&cfg)).is_err());
    assert_eq!(load_checkpoint(&ckpt).unwrap().params, p);
    // A store can only be built with the right names and shapes.
    let mut map: BTreeMap<String, HostTensor> = p.clone().into_tensors();
    map.insert("h.0.ln_1.weight".into(), HostTensor::zeros(&[9]));
    assert!(matches!(
        ParamStore::from_tensors(&cfg, map),
        Err(Error::WrongShape { .. })
    ));
}

#[test]
fn a_save_keeps_the_users_files_and_refuses_what_it_cannot_keep() {
    let dir = Scratch::new("user-files");
    let model = dir.join("model");
    let p = params(9);
    save_pretrained(&model, &p, DType::F32).unwrap();
    std::fs::write(model.join("tokenizer.json"), "{}").unwrap();
    std::fs::write(model.join("README.md"), "# my model").unwrap();
    save_pretrained(&model, &params(10), DType::BF16).unwrap();
    assert_eq!(
        common::entries(&model),
        ["README.md", CONFIG_FILE, MODEL_FILE, "tokenizer.json"]
    );
    assert_eq!(
        std::fs::read_to_string(model.join("README.md")).unwrap(),
        "# my model"
    );

    // A subdirectory cannot be carried: the save is refused and nothing changes.
    std::fs::create_dir(model.join("runs")).unwrap();
    let e = save_pretrained(&model, &p, DType::F32).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    assert!(model.join("runs").is_dir());
    assert_ne!(load_pretrained(&model, None).unwrap(), p);

    // A path that is a file is not replaced by a checkpoint.
    let file = dir.join("notes.txt");
    std::fs::write(&file, "keep me").unwrap();
    assert!(save_pretrained(&file, &p, DType::F32).is_err());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

/// A NaN or infinity in loaded weights (`--init`, `--resume`) or in a resumed optimizer's
/// moments is refused when the file is loaded, naming the tensor and the file; it used to
/// reach the first step, which stopped with "lower the learning rate" (issue 49).
#[test]
fn non_finite_weights_and_moments_are_refused_when_loaded() {
    let dir = Scratch::new("non-finite");
    let cfg = small_config();

    // Weights saved by Helios with one NaN, loaded the way `helios train --init` does: a
    // directory with config.json, or its safetensors file (config.json beside it).
    let mut p = params(7);
    let mut w = p.get("h.1.attn.c_proj.weight").unwrap().clone();
    w.data[5] = f32::NAN;
    p.set("h.1.attn.c_proj.weight", w).unwrap();
    let model = dir.join("model");
    save_pretrained(&model, &p, DType::F32).unwrap();
    let file = model.join(MODEL_FILE);
    for init in [model.clone(), file.clone()] {
        let e = load_pretrained(&init, None).unwrap_err();
        match &e {
            Error::NonFiniteTensor {
                path,
                name,
                index,
                count,
                ..
            } => {
                assert_eq!(path, &file);
                assert_eq!(name, "transformer.h.1.attn.c_proj.weight");
                assert_eq!((*index, *count), (5, 1));
            }
            _ => panic!("{e}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("transformer.h.1.attn.c_proj.weight")
                && msg.contains(&file.display().to_string()),
            "{msg}"
        );
        assert!(!msg.contains("learning rate"), "{msg}");
    }

    // An infinity in an f16 file (written with the safetensors crate) names its stored name.
    let mut entries = raw_entries(&params(7), |n| n.to_string());
    let e = entries.iter_mut().find(|e| e.0 == "ln_f.weight").unwrap();
    e.1 = Dtype::F16;
    e.3 = (0..8)
        .flat_map(|i| {
            let v = if i == 2 { f32::INFINITY } else { 1.0 };
            half::f16::from_f32(v).to_le_bytes()
        })
        .collect();
    let inf = dir.join("inf.safetensors");
    write_raw(&inf, &entries);
    let e = load_weights(&inf, &cfg).unwrap_err();
    assert!(
        matches!(&e, Error::NonFiniteTensor { name, index: 2, .. } if name == "ln_f.weight"),
        "{e}"
    );

    // A checkpoint whose weights are finite but one moment is not (`--resume`).
    let ckpt = dir.join("ckpt");
    let mut o = optimizer(&cfg);
    o.v.get_mut("h.0.mlp.c_fc.weight").unwrap().data[1] = f32::INFINITY;
    save_checkpoint(&ckpt, &params(7), &o, &trainer(&cfg)).unwrap();
    let e = load_checkpoint(&ckpt).unwrap_err();
    match &e {
        Error::NonFiniteTensor { path, name, .. } => {
            assert_eq!(path, &ckpt.join(OPTIMIZER_FILE));
            assert_eq!(name, "exp_avg_sq.h.0.mlp.c_fc.weight");
        }
        _ => panic!("{e}"),
    }
    // And weights with a NaN in a checkpoint.
    let mut p = params(7);
    let mut w = p.get("wpe.weight").unwrap().clone();
    w.data[0] = f32::NAN;
    p.set("wpe.weight", w).unwrap();
    save_checkpoint(&ckpt, &p, &optimizer(&cfg), &trainer(&cfg)).unwrap();
    let e = load_checkpoint(&ckpt).unwrap_err();
    assert!(
        matches!(&e, Error::NonFiniteTensor { name, .. } if name == "transformer.wpe.weight"),
        "{e}"
    );
}
