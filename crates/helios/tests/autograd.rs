//! Autograd's mechanics: the graph's release after backward, gradient accumulation, an op
//! saving only what its backward reads, a training loop whose memory reaches a steady state,
//! and checkpointing (per-op gradient checks: `autograd_ops`, `autograd_matmul`,
//! `autograd_nn`; the finite-difference check itself: `common/grad.rs`).

mod common;

use common::grad::{check, random, up, LOCK};
use common::{assert_no_validation_messages, device, LockExt};
use helios::{graph_stats, no_grad, DType, IndexTensor, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn graph_is_released_and_gradients_accumulate() {
    let _l = LOCK.locked();
    let d = device();
    let w = Tensor::from_slice(d, &[0.5, -1.0, 2.0], &[3])
        .unwrap()
        .requires_grad_();
    let x = Tensor::from_slice(d, &[1.0, 2.0, 3.0], &[3]).unwrap();
    let before = graph_stats();
    {
        // A forward without backward keeps nothing.
        let y = x.mul(&w).unwrap().tanh().unwrap().sum_all().unwrap();
        assert!(graph_stats().live_grad_nodes > before.live_grad_nodes);
        drop(y);
    }
    assert_eq!(graph_stats().live_grad_nodes, before.live_grad_nodes);
    assert_eq!(graph_stats().live_nodes, before.live_nodes);
    for step in 1..=2 {
        let loss = x.mul(&w).unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        // A second backward through the same graph is an error that says why.
        let again = loss.backward().unwrap_err().to_string();
        assert!(again.contains("already used"), "{again}");
        drop(loss);
        assert_eq!(
            graph_stats().live_grad_nodes,
            before.live_grad_nodes,
            "graph released"
        );
        let g = w.grad().unwrap().to_vec().unwrap();
        assert_eq!(
            g,
            vec![step as f32, 2.0 * step as f32, 3.0 * step as f32],
            "accumulates"
        );
    }
    w.zero_grad();
    assert!(w.grad().is_none());
    // no_grad records nothing; detach cuts the graph.
    let y = no_grad(|| x.mul(&w).unwrap());
    assert!(!y.requires_grad());
    assert!(!w.detach().requires_grad());
    assert_no_validation_messages();
}

/// An op saves only what its backward rule reads: in `exp(x·2 + b)` the scale and the add
/// read nothing back and the exponential reads its output, so the forward's one fused
/// kernel stores one array (before, every intermediate was held for backward and stored),
/// and the gradients still match the CPU.
#[test]
fn forward_stores_only_what_backward_reads() {
    let _l = LOCK.locked();
    let mut rng = StdRng::seed_from_u64(21);
    let (xv, bv) = (
        random(&mut rng, 24, -1.0, 1.0),
        random(&mut rng, 6, -1.0, 1.0),
    );
    let x = up(&xv, &[4, 6]).requires_grad_();
    let b = up(&bv, &[6]).requires_grad_();
    let before = graph_stats();
    let y = {
        // The chain's temporaries end with this statement, so the sum (which realises its
        // input at once) finds `e` held by this binding and by exp's backward only.
        let e = x.mul_scalar(2.0).unwrap().add(&b).unwrap().exp().unwrap();
        e.sum_all().unwrap()
    };
    y.realize().unwrap();
    let after = graph_stats();
    assert_eq!(
        after.kernels - before.kernels,
        1,
        "one fused forward kernel"
    );
    assert_eq!(
        after.outputs - before.outputs,
        1,
        "only exp's output is stored"
    );
    y.backward().unwrap();
    let (gx, gb) = (
        x.grad().unwrap().to_vec().unwrap(),
        b.grad().unwrap().to_vec().unwrap(),
    );
    let mut want_b = [0.0f64; 6];
    for (i, &g) in gx.iter().enumerate() {
        let e = (2.0 * xv[i] + bv[i % 6]).exp();
        assert!(
            (f64::from(g) - 2.0 * e).abs() <= 1e-5 * (1.0 + 2.0 * e),
            "dx[{i}]"
        );
        want_b[i % 6] += e;
    }
    for (j, (&g, w)) in gb.iter().zip(want_b).enumerate() {
        assert!((f64::from(g) - w).abs() <= 1e-5 * (1.0 + w), "db[{j}]");
    }
    assert_no_validation_messages();
}

#[test]
fn training_loop_reaches_a_memory_steady_state() {
    let _l = LOCK.locked();
    let d = device();
    let mut rng = StdRng::seed_from_u64(8);
    let (n, i, h, o) = (16, 8, 16, 4);
    let mut param = |shape: &[usize]| {
        let len: usize = shape.iter().product();
        let v: Vec<f32> = (0..len).map(|_| rng.gen_range(-0.3f32..0.3)).collect();
        Tensor::from_slice(d, &v, shape).unwrap().requires_grad_()
    };
    let (w1, b1, w2, b2) = (param(&[i, h]), param(&[h]), param(&[h, o]), param(&[o]));
    let params = [&w1, &b1, &w2, &b2];
    let zeros = |p: &Tensor| Tensor::zeros(d, p.shape(), DType::F32).unwrap();
    let moments: Vec<(Tensor, Tensor)> = params.iter().map(|p| (zeros(p), zeros(p))).collect();
    let x = Tensor::from_slice(d, &vec![0.5; n * i], &[n, i]).unwrap();
    let targets = IndexTensor::from_slice(d, &vec![1; n], &[n]).unwrap();
    let cfg = helios::AdamWConfig::default();
    let mut at_10 = None;
    let mut allocs_at_2 = 0;
    let mut first_loss = 0.0;
    let mut last_loss = 0.0;
    for step in 1..=1000u32 {
        let loss = {
            // The bias and GELU in the product's epilogue (in f32 the kernel also stores the
            // GELU's input, and the second product's input gradient comes out through it).
            let fc = helios::MatmulOptions {
                bias: Some(&b1),
                act: helios::Activation::GeluTanh,
                ..Default::default()
            };
            let hid = x.matmul_opts(&w1, &fc).unwrap();
            let logits = hid.matmul(&w2).unwrap().add(&b2).unwrap();
            logits.cross_entropy(&targets, None).unwrap().loss
        };
        loss.backward().unwrap();
        let grads: Vec<Tensor> = params.iter().map(|p| p.grad().unwrap()).collect();
        let list: Vec<helios::AdamWParam> = params
            .iter()
            .zip(&grads)
            .zip(&moments)
            .map(|((p, g), (m, v))| helios::AdamWParam {
                param: p,
                grad: g,
                m,
                v,
                copy: None,
                weight_decay: 0.0,
            })
            .collect();
        helios::adamw_step(&list, &cfg, step).unwrap();
        params.iter().for_each(|p| p.zero_grad());
        if step == 1 || step == 1000 {
            let l = loss.to_vec().unwrap()[0];
            if step == 1 {
                first_loss = l;
            } else {
                last_loss = l;
            }
        }
        drop(list);
        drop((loss, grads));
        if step == 2 {
            d.synchronize().unwrap();
            allocs_at_2 = d.memory_stats().driver_allocations;
        }
        if step == 10 {
            d.synchronize().unwrap();
            at_10 = Some((d.memory_stats().bytes_in_use, graph_stats().live_nodes));
        }
    }
    d.synchronize().unwrap();
    let (bytes_10, nodes_10) = at_10.unwrap();
    assert_eq!(
        d.memory_stats().bytes_in_use,
        bytes_10,
        "device bytes in use at step 1000 = step 10"
    );
    assert_eq!(
        graph_stats().live_nodes,
        nodes_10,
        "live graph nodes at step 1000 = step 10"
    );
    assert_eq!(
        d.memory_stats().driver_allocations,
        allocs_at_2,
        "no driver allocation after step 2"
    );
    assert!(
        last_loss < 0.1 * first_loss,
        "the MLP learns: {first_loss} → {last_loss}"
    );
    assert_no_validation_messages();
}

/// `checkpoint` keeps one graph node and the inputs instead of the function's graph, and its
/// gradients equal the recorded graph's bit for bit (the recomputation runs the same
/// kernels); an input that needs no gradient gets none.
#[test]
fn checkpoint_recomputes_the_same_gradients() {
    let _l = LOCK.locked();
    let mut rng = StdRng::seed_from_u64(12);
    let (m, k, n) = (9, 7, 5);
    let a = random(&mut rng, m * k, -1.0, 1.0);
    let b = random(&mut rng, k * n, -1.0, 1.0);
    let c = random(&mut rng, m * n, -1.0, 1.0);
    let w = up(&random(&mut rng, m * n, -1.0, 1.0), &[m, n]);
    let f = |x: &[Tensor]| -> helios::Result<Tensor> {
        x[0].matmul(&x[1])?
            .add(&x[2])?
            .tanh()?
            .softmax()?
            .mul(&x[2])
    };
    let run = |checkpointed: bool| {
        let a = up(&a, &[m, k]).requires_grad_();
        let b = up(&b, &[k, n]).requires_grad_();
        let c = up(&c, &[m, n]); // no gradient
        let before = graph_stats().live_grad_nodes;
        let y = match checkpointed {
            true => helios::checkpoint(&[&a, &b, &c], f).unwrap(),
            false => f(&[a.clone(), b.clone(), c.clone()]).unwrap(),
        };
        let nodes = graph_stats().live_grad_nodes - before;
        let loss = y.mul(&w).unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        let grads = (
            a.grad().unwrap().to_vec().unwrap(),
            b.grad().unwrap().to_vec().unwrap(),
        );
        (y.to_vec().unwrap(), grads, nodes, c.grad().is_none())
    };
    let (y0, g0, nodes0, _) = run(false);
    let (y1, g1, nodes1, c_none) = run(true);
    assert_eq!(y0, y1, "forward");
    assert_eq!(g0, g1, "gradients of a and b");
    assert!(c_none, "c needs no gradient");
    assert_eq!(nodes1, 1, "one node for the checkpointed function");
    assert!(
        nodes0 > 1,
        "the recorded graph has a node per op ({nodes0})"
    );
    assert_eq!(graph_stats().live_grad_nodes, 0, "released after backward");
    assert_no_validation_messages();
}

/// A checkpointed norm inside a residual stream: the checkpoint's backward runs a backward
/// of its own, which must not disturb the gradient the engine offered the checkpoint's rule
/// (the residual's, for h).
#[test]
fn checkpoint_in_a_residual_stream_keeps_the_offered_gradient() {
    let mut rng = StdRng::seed_from_u64(29);
    let (r, c) = (4, 10);
    let x = random(&mut rng, r * c, -2.0, 2.0);
    let gamma = random(&mut rng, c, 0.5, 1.5);
    let beta = random(&mut rng, c, -0.5, 0.5);
    check(
        "checkpointed layer_norm in a residual stream",
        &[(x, vec![r, c]), (gamma, vec![c]), (beta, vec![c])],
        |t| {
            let h = t[0].mul_scalar(1.5).unwrap();
            let y = helios::checkpoint(&[&h, &t[1], &t[2]], |u| {
                Ok(u[0].layer_norm(&u[1], &u[2], 1e-5)?.y)
            })
            .unwrap();
            h.add(&y).unwrap()
        },
        move |h| {
            let mut out = Vec::new();
            for row in h[0].chunks(c) {
                let hs: Vec<f64> = row.iter().map(|v| 1.5 * v).collect();
                let m = hs.iter().sum::<f64>() / c as f64;
                let var = hs.iter().map(|v| (v - m).powi(2)).sum::<f64>() / c as f64;
                let rstd = 1.0 / (var + 1e-5).sqrt();
                out.extend((0..c).map(|j| (hs[j] - m) * rstd * h[1][j] + h[2][j] + hs[j]));
            }
            out
        },
    );
}
