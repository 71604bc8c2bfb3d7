//! What the matmul tests share: random values rounded to a dtype (never zeros), a matrix
//! stored transposed and viewed back (so a kernel reads a column-major operand in place), and
//! a product checked against the f64 CPU reference.

use helios::cpu::matmul::{matmul as reference, relative_error, tolerance, MatmulRef};
use helios::{Activation, DType, MatmulOptions, MatmulOverrides, MatmulVariant, Tensor};
use rand::{Rng, SeedableRng};

use super::device;

/// `n` values uniform in [-1, 1), rounded to `dtype`.
pub fn random(n: usize, dtype: DType, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| dtype.round(rng.gen_range(-1.0f32..1.0)))
        .collect()
}

/// A `(batch, rows, cols)` tensor holding row-major `host`, stored transposed and viewed back
/// when `trans`.
pub fn operand(host: &[f32], dims: [usize; 3], trans: bool, dtype: DType) -> Tensor {
    let [b, r, c] = dims;
    if !trans {
        return Tensor::from_slice_as(device(), host, &dims, dtype).unwrap();
    }
    let mut t = vec![0f32; host.len()];
    for bi in 0..b {
        for ri in 0..r {
            for ci in 0..c {
                t[(bi * c + ci) * r + ri] = host[(bi * r + ri) * c + ci];
            }
        }
    }
    Tensor::from_slice_as(device(), &t, &[b, c, r], dtype)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
}

/// One checked product.
#[derive(Clone, Copy)]
pub struct Case {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans: (bool, bool),
    pub input: DType,
    pub out: DType,
    pub bias: bool,
    pub act: Activation,
    pub residual: bool,
    /// Multiply by this activation's derivative at the residual instead of adding it.
    pub act_grad: Activation,
    pub alpha: f32,
    pub variant: Option<MatmulVariant>,
    pub splits: Option<u32>,
}

impl Case {
    pub fn new(batch: usize, m: usize, n: usize, k: usize) -> Case {
        Case {
            batch,
            m,
            n,
            k,
            trans: (false, false),
            input: DType::F32,
            out: DType::F32,
            bias: false,
            act: Activation::None,
            residual: false,
            act_grad: Activation::None,
            alpha: 1.0,
            variant: None,
            splits: None,
        }
    }

    /// Runs the case; returns the relative error.
    pub fn run(self, seed: u64) -> f64 {
        let Case { batch, m, n, k, .. } = self;
        let a_host = random(batch * m * k, self.input, seed);
        let b_host = random(batch * k * n, self.input, seed + 1);
        let bias_host = random(n, self.out, seed + 2);
        let res_host = random(batch * m * n, self.out, seed + 3);
        let a = operand(&a_host, [batch, m, k], self.trans.0, self.input);
        let b = operand(&b_host, [batch, k, n], self.trans.1, self.input);
        let bias = Tensor::from_slice_as(device(), &bias_host, &[n], self.out).unwrap();
        let res = Tensor::from_slice_as(device(), &res_host, &[batch, m, n], self.out).unwrap();
        let opts = MatmulOptions {
            alpha: self.alpha,
            bias: self.bias.then_some(&bias),
            act: self.act,
            residual: self.residual.then_some(&res),
            out: Some(self.out),
        };
        let overrides = MatmulOverrides {
            act_grad: self.act_grad,
            variant: self.variant,
            splits: self.splits,
        };
        let c = a.matmul_overridden(&b, &opts, &overrides).unwrap();
        assert_eq!(c.shape(), [batch, m, n]);
        assert_eq!(c.dtype(), self.out);
        let got = c.to_vec().unwrap();
        let want = reference(
            &a_host,
            &b_host,
            &MatmulRef {
                batch,
                m,
                n,
                k,
                alpha: self.alpha,
                bias: self.bias.then_some(&bias_host[..]),
                act: self.act,
                residual: self.residual.then_some(&res_host[..]),
                act_grad: self.act_grad,
            },
        );
        relative_error(&got, &want)
    }

    /// Runs the case and fails if its relative error is over the output dtype's tolerance;
    /// returns the error.
    #[track_caller]
    pub fn check(self, seed: u64) -> f64 {
        self.check_within(seed, tolerance(self.out))
    }

    /// `check` against a stated tolerance `tol` instead of the output dtype's.
    #[track_caller]
    pub fn check_within(self, seed: u64, tol: f64) -> f64 {
        let err = self.run(seed);
        // Each product's error in the log (`--nocapture`): what a GPU run reports per dtype.
        eprintln!(
            "{} b{} {}x{}x{} {:?} {}->{}: {err:.2e}",
            self.variant.map_or("chosen".into(), |v| v.label()),
            self.batch,
            self.m,
            self.n,
            self.k,
            self.trans,
            self.input,
            self.out
        );
        assert!(
            err <= tol,
            "b{} {}x{}x{} trans {:?} {}->{} variant {:?}: relative error {err:e} > {tol:e}",
            self.batch,
            self.m,
            self.n,
            self.k,
            self.trans,
            self.input,
            self.out,
            self.variant.map(|v| v.label())
        );
        err
    }
}

pub const TRANS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];
