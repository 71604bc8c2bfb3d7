//! The training loop on the device present (lavapipe in CI), with a small GPT-2: the loss
//! falls, a run of 20 steps equals 10 + checkpoint + resume + 10 bit for bit (weights,
//! moments, losses), a NaN stops the run and leaves the last good checkpoint, and bad
//! inputs fail with an error before any work.

mod common;

use helios::{DType, Device};
use helios_nn::train::{Event, TrainConfig, Trainer};
use helios_nn::{
    load_checkpoint, AdamWHyper, Error, GptConfig, HostTensor, LrSchedule, ParamStore, Tokens,
};

fn device() -> Device {
    Device::from_env().expect("a Vulkan device (install mesa-vulkan-drivers)")
}

fn config() -> GptConfig {
    GptConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32, // head size 16: the fused attention kernel runs
        vocab_size: 32,
        block_size: 16,
        layer_norm_eps: 1e-5,
    }
}

/// A learnable stream: a repeating pattern of period 7 with a little variation.
fn data() -> (Tokens, Tokens) {
    let ids: Vec<u32> = (0..4000u32)
        .map(|i| (i % 7) * 3 + u32::from(i % 29 == 0))
        .collect();
    let all = Tokens::from_ids(&ids, "pattern").unwrap();
    all.split(0.1).unwrap()
}

fn train_config(steps: u64, dir: Option<&std::path::Path>) -> TrainConfig {
    TrainConfig {
        batch: 4,
        seq: 16,
        accum: 2,
        steps,
        schedule: LrSchedule {
            max_lr: 1e-2,
            min_lr: 1e-3,
            warmup_steps: 3.min(steps),
            total_steps: steps,
        },
        adamw: AdamWHyper::default(),
        precision: DType::F32,
        seed: 5,
        eval_every: 5,
        eval_batches: 2,
        save_every: 0,
        checkpoint_dir: dir.map(|d| d.to_path_buf()),
        zero: false,
    }
}

fn store() -> ParamStore {
    ParamStore::init_gpt2(&config(), 11).unwrap()
}

#[test]
fn twenty_steps_equal_ten_plus_resume_plus_ten() {
    let dev = device();
    let scratch = common::Scratch::new("train-resume");
    let (train, val) = data();

    // One run of 20 steps.
    let mut a = Trainer::new(
        &dev,
        &store(),
        train.clone(),
        Some(val.clone()),
        train_config(20, None),
    )
    .unwrap();
    a.run(None, |_| {}).unwrap();
    let losses_a: Vec<f32> = a.history().train.iter().map(|s| s.loss).collect();
    assert!(
        losses_a[19] < losses_a[0] - 0.5,
        "the loss should fall: {losses_a:?}"
    );

    let dir = scratch.join("ckpt");
    let c = ten_then_resume_ten(&dev, (train, val), &dir, train_config, None);

    let losses_c: Vec<f32> = c.history().train.iter().map(|s| s.loss).collect();
    assert_eq!(losses_a, losses_c, "losses differ after the resume");
    assert_eq!(a.history().val, c.history().val);
    assert_eq!(a.weights().unwrap(), c.weights().unwrap(), "weights differ");
    let end = load_checkpoint(&dir).unwrap();
    assert_eq!(end.trainer.unwrap().step, 20);
    assert_eq!(&end.params, &a.weights().unwrap());
    assert!(dev.validation_messages().is_empty());
}

/// 10 steps of a 20-step run of `config` checkpointed into `dir`, then a fresh trainer
/// resumed from it that runs the other 10. `scaler`: the f16 loss scale to start from and
/// the growth interval (which a checkpoint does not carry, so it is set again on resume).
fn ten_then_resume_ten(
    dev: &Device,
    (train, val): (Tokens, Tokens),
    dir: &std::path::Path,
    config: fn(u64, Option<&std::path::Path>) -> TrainConfig,
    scaler: Option<(f32, u32)>,
) -> Trainer {
    let mut b = Trainer::new(
        dev,
        &store(),
        train.clone(),
        Some(val.clone()),
        config(20, Some(dir)),
    )
    .unwrap();
    if let Some((scale, interval)) = scaler {
        b.set_loss_scaler(Some(scale), interval);
    }
    let mut saved = vec![];
    b.run(Some(10), |e| {
        if let Event::Saved { step, .. } = e {
            saved.push(step)
        }
    })
    .unwrap();
    assert_eq!(saved, [10]);
    drop(b);
    let ckpt = load_checkpoint(dir).unwrap();
    let mut c = Trainer::resume(dev, &ckpt, train, Some(val), config(20, Some(dir))).unwrap();
    assert_eq!(c.step_count(), 10);
    if let Some((_, interval)) = scaler {
        c.set_loss_scaler(None, interval);
    }
    c.run(None, |_| {}).unwrap();
    c
}

fn f16_config(steps: u64, dir: Option<&std::path::Path>) -> TrainConfig {
    TrainConfig {
        precision: DType::F16,
        ..train_config(steps, dir)
    }
}

/// f16 with dynamic loss scaling, from a scale so large that the first backward overflows:
/// that step changes no weight and halves the scale, the scale falls until steps succeed,
/// doubles after every 4 good steps (a shortened growth interval), the loss falls, and 10
/// steps + checkpoint + resume + 10 equal 20 bit for bit, scales included.
#[test]
fn f16_loss_scaling_skips_overflows_grows_and_resumes_exactly() {
    let dev = device();
    let scratch = common::Scratch::new("train-f16");
    let (train, val) = data();
    let start = 2f32.powi(22);

    // The first step overflows: nothing changes but the scale.
    let mut t = Trainer::new(&dev, &store(), train.clone(), None, f16_config(20, None)).unwrap();
    t.set_loss_scaler(Some(start), 4);
    let before = t.weights().unwrap();
    let log = t.train_step().unwrap();
    assert!(
        log.skipped,
        "a loss scale of 2^22 must overflow f16 gradients"
    );
    assert_eq!(log.loss_scale, Some(start));
    assert_eq!(
        t.weights().unwrap(),
        before,
        "a skipped step changed the weights"
    );
    assert_eq!(t.loss_scaler().unwrap().scale, start / 2.0);

    // A whole run: the scale follows the rule step by step.
    let mut a = Trainer::new(
        &dev,
        &store(),
        train.clone(),
        Some(val.clone()),
        f16_config(20, None),
    )
    .unwrap();
    a.set_loss_scaler(Some(start), 4);
    a.run(None, |_| {}).unwrap();
    let steps = &a.history().train;
    let (mut scale, mut good) = (start, 0);
    for s in steps {
        assert_eq!(s.loss_scale, Some(scale), "step {}", s.step);
        if s.skipped {
            (scale, good) = (scale / 2.0, 0);
        } else {
            good += 1;
            if good == 4 {
                (scale, good) = (scale * 2.0, 0);
            }
        }
    }
    let skipped = steps.iter().filter(|s| s.skipped).count();
    assert!((2..15).contains(&skipped), "{skipped} of 20 steps skipped");
    let losses: Vec<f32> = steps.iter().map(|s| s.loss).collect();
    assert!(
        losses[19] < losses[0] - 0.5,
        "the loss should fall: {losses:?}"
    );

    // 10 + resume + 10.
    let dir = scratch.join("ckpt");
    let c = ten_then_resume_ten(&dev, (train, val), &dir, f16_config, Some((start, 4)));
    let trace = |t: &Trainer| -> Vec<(f32, Option<f32>, bool)> {
        let h = &t.history().train;
        h.iter()
            .map(|s| (s.loss, s.loss_scale, s.skipped))
            .collect()
    };
    assert_eq!(
        trace(&a),
        trace(&c),
        "losses or scales differ after the resume"
    );
    assert_eq!(a.history().val, c.history().val);
    assert_eq!(a.weights().unwrap(), c.weights().unwrap(), "weights differ");
    assert!(dev.validation_messages().is_empty());
}

/// ZeRO-1 in a run of one process: its one shard holds every parameter, and the sharded
/// step (the squared norm read back and uploaded again, the owner's update, the broadcast)
/// trains bit for bit like the plain one in every precision, f16's skipped steps included;
/// the checkpoint gathered from the shard is the plain run's.
#[test]
fn a_sharded_optimizer_in_a_run_of_one_changes_nothing() {
    let dev = device();
    let scratch = common::Scratch::new("train-zero");
    let (train, val) = data();
    for precision in [DType::F32, DType::BF16, DType::F16] {
        let run = |zero: bool| {
            let dir = scratch.join(&format!("{}-{zero}", precision.name()));
            let cfg = TrainConfig {
                precision,
                zero,
                ..train_config(6, Some(&dir))
            };
            let mut t = Trainer::new(&dev, &store(), train.clone(), Some(val.clone()), cfg);
            let t = t.as_mut().unwrap();
            // f16: a scale that overflows, so that steps are skipped.
            t.set_loss_scaler(Some(2f32.powi(22)), 2);
            t.run(None, |_| {}).unwrap();
            let h = t.history();
            let log: Vec<(f32, u32, bool)> = h
                .train
                .iter()
                .map(|s| (s.loss, s.grad_norm.to_bits(), s.skipped))
                .collect();
            let ckpt = load_checkpoint(&dir).unwrap();
            (log, h.val.clone(), t.weights().unwrap(), ckpt.optimizer)
        };
        let (plain, sharded) = (run(false), run(true));
        let name = precision.name();
        assert_eq!(plain.0, sharded.0, "{name}: losses, norms or skips differ");
        assert_eq!(plain.1, sharded.1, "{name}: validation losses differ");
        assert!(plain.2 == sharded.2, "{name}: weights differ");
        assert!(plain.3 == sharded.3, "{name}: saved moments differ");
        if precision == DType::F16 {
            assert!(plain.0.iter().any(|s| s.2), "no f16 step was skipped");
        }
    }
    assert!(dev.validation_messages().is_empty());
}

#[test]
fn a_nan_stops_the_run_and_keeps_the_last_good_checkpoint() {
    let dev = device();
    let scratch = common::Scratch::new("train-nan");
    let dir = scratch.join("ckpt");
    let (train, val) = data();
    let cfg = TrainConfig {
        save_every: 1,
        ..train_config(4, Some(&dir))
    };
    let mut t = Trainer::new(
        &dev,
        &store(),
        train.clone(),
        Some(val.clone()),
        cfg.clone(),
    )
    .unwrap();
    t.run(Some(2), |_| {}).unwrap();
    drop(t);

    // Poison one weight of the checkpoint in memory and continue from it.
    let mut ckpt = load_checkpoint(&dir).unwrap();
    let mut w = ckpt.params.get("h.0.mlp.c_fc.weight").unwrap().clone();
    w.data[3] = f32::NAN;
    ckpt.params.set("h.0.mlp.c_fc.weight", w).unwrap();
    let mut t = Trainer::resume(&dev, &ckpt, train, Some(val), cfg).unwrap();
    let err = t.run(None, |_| {}).unwrap_err();
    assert!(matches!(err, Error::NonFinite { step: 3, .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("step 3") && msg.contains("(step 2)"), "{msg}");

    // The checkpoint on disk is still step 2's, whole and finite.
    let on_disk = load_checkpoint(&dir).unwrap();
    assert_eq!(on_disk.trainer.unwrap().step, 2);
    assert!(on_disk
        .params
        .iter()
        .all(|(_, t): (_, &HostTensor)| t.data.iter().all(|v| v.is_finite())));
}

#[test]
fn bad_inputs_fail_before_training() {
    let dev = device();
    let (train, val) = data();
    // Tokens beyond the model's vocabulary.
    let big = Tokens::from_ids(&[40u32; 200], "big ids").unwrap();
    let err = Trainer::new(&dev, &store(), big, None, train_config(2, None))
        .err()
        .unwrap();
    assert!(matches!(err, Error::TokenOutOfRange { .. }), "{err}");
    // Too few tokens for one batch.
    let short = Tokens::from_ids(&[1u32; 10], "short").unwrap();
    let err = Trainer::new(&dev, &store(), short, None, train_config(2, None))
        .err()
        .unwrap();
    assert!(matches!(err, Error::TooFewTokens { .. }), "{err}");
    // A sequence longer than the model's positions.
    let cfg = TrainConfig {
        seq: 17,
        ..train_config(2, None)
    };
    let err = Trainer::new(&dev, &store(), train.clone(), Some(val.clone()), cfg)
        .err()
        .unwrap();
    assert!(err.to_string().contains("block size"), "{err}");
    // Resuming with another batch size.
    let scratch = common::Scratch::new("train-bad");
    let dir = scratch.join("ckpt");
    let mut t = Trainer::new(
        &dev,
        &store(),
        train.clone(),
        None,
        train_config(1, Some(&dir)),
    )
    .unwrap();
    t.run(None, |_| {}).unwrap();
    let ckpt = load_checkpoint(&dir).unwrap();
    let cfg = TrainConfig {
        batch: 3,
        ..train_config(2, None)
    };
    let err = Trainer::resume(&dev, &ckpt, train, None, cfg)
        .err()
        .unwrap();
    assert!(matches!(err, Error::SamplerMismatch { .. }), "{err}");
}

/// A vocabulary that is not a multiple of 128 (32, padded to 128 on the device): the
/// checkpoint's weights and AdamW moments hold wte as (V, C), never the padded rows, in
/// bf16 (f32 masters) as in f32, and the device's padded rows stay zero while training.
#[test]
fn checkpoints_hold_the_unpadded_vocabulary() {
    let dev = device();
    let scratch = common::Scratch::new("train-padded");
    let (train, val) = data();
    let cfg = config();
    let (v, c) = (cfg.vocab_size, cfg.n_embd);
    for precision in [DType::F32, DType::BF16] {
        let dir = scratch.join(precision.name());
        let tc = TrainConfig {
            precision,
            eval_every: 0,
            ..train_config(3, Some(&dir))
        };
        let mut t = Trainer::new(&dev, &store(), train.clone(), Some(val.clone()), tc).unwrap();
        t.run(None, |_| {}).unwrap();
        let wte = &t.params().tensors()[0];
        assert_eq!(wte.shape(), &[helios_nn::model::padded_vocab(v), c]);
        let rows = wte.to_vec().unwrap();
        assert!(rows[v * c..].iter().all(|&x| x == 0.0), "padded rows moved");
        for file in ["model.safetensors", "optimizer.safetensors"] {
            let bytes = std::fs::read(dir.join(file)).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let mut seen = 0;
            for (name, view) in st.tensors() {
                if name.ends_with("wte.weight") {
                    assert_eq!(view.shape(), [v, c], "{file}: {name}");
                    seen += 1;
                }
            }
            assert!(seen > 0, "{file} holds wte");
        }
        let ckpt = load_checkpoint(&dir).unwrap();
        assert_eq!(ckpt.params.get("wte.weight").unwrap().shape, [v, c]);
    }
    assert!(dev.validation_messages().is_empty());
}
