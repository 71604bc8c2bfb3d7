//! The native NVIDIA matmul kernels (PTX with `wgmma`, through VK_NVX_binary_import) against
//! the f64 CPU reference: every native variant in every transpose combination on shapes
//! whose tiles end inside the matrix, batched and strided, f16 and bf16 inputs, f32 and
//! narrow outputs, every epilogue. The figure checked is ‖out − ref‖ / ‖ref‖ against
//! `cpu::matmul::tolerance(out dtype)`. Runs where the device has native kernels (an
//! NVIDIA Hopper GPU); elsewhere it says it skipped, and checks that forcing a native
//! variant is a clear error. Run with `HELIOS_VALIDATION=1` like every test.

use helios::cpu::matmul::{matmul as reference, relative_error, tolerance, MatmulRef};
use helios::{matmul_caps, Activation, DType, MatmulOptions, MatmulVariant, Tensor};

mod common;
use common::matmul::{operand, random};
use common::{assert_no_validation_messages, device};

#[derive(Clone, Copy)]
struct Case {
    variant: MatmulVariant,
    dims: [usize; 4],
    trans: (bool, bool),
    input: DType,
    out: DType,
    bias: bool,
    act: Activation,
    residual: bool,
    act_grad: Activation,
    alpha: f32,
}

impl Case {
    fn new(variant: MatmulVariant, dims: [usize; 4], trans: (bool, bool), input: DType) -> Case {
        Case {
            variant,
            dims,
            trans,
            input,
            out: DType::F32,
            bias: false,
            act: Activation::None,
            residual: false,
            act_grad: Activation::None,
            alpha: 1.0,
        }
    }

    #[track_caller]
    fn check(self, seed: u64) {
        let [batch, m, n, k] = self.dims;
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
            act_grad: self.act_grad,
            out: Some(self.out),
            variant: Some(self.variant),
            splits: None,
        };
        let got = a.matmul_opts(&b, &opts).unwrap().to_vec().unwrap();
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
        let err = relative_error(&got, &want);
        let tol = tolerance(self.out);
        eprintln!(
            "{} b{batch} {m}x{n}x{k} {:?} {}->{}: {err:.2e}",
            self.variant.label(),
            self.trans,
            self.input,
            self.out
        );
        assert!(
            err <= tol,
            "{} b{batch} {m}x{n}x{k} trans {:?} {}->{}: relative error {err:e} > {tol:e}",
            self.variant.label(),
            self.trans,
            self.input,
            self.out
        );
    }
}

const TRANS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

fn natives() -> Vec<MatmulVariant> {
    // The table's native tiles, then the ones measured beside them, reachable by name.
    let others = ["nv128x256k16s4", "nv128x128k32s3", "nv128x192k16s4"]
        .map(|name| MatmulVariant::parse(name).expect("a native tile"));
    helios_kernels::matmul::VARIANTS
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| v.is_native())
        .chain(others)
        .collect()
}

/// Whether the native kernel of `v` exists for these transposes (its tile's M/N-major
/// operands must come in whole swizzle atoms).
fn runs(
    v: MatmulVariant,
    trans: (bool, bool),
    input: DType,
    target: Option<helios_ptx::Target>,
) -> bool {
    helios_kernels::MatmulKernel {
        variant: v,
        input: input.storage(),
        out: input.storage(),
        trans_a: trans.0,
        trans_b: trans.1,
        vec_a: true,
        vec_b: true,
        vec_c: true,
        epilogue: helios_kernels::Epilogue::NONE,
        triangle: helios_kernels::Triangle::Full,
        subgroup: 0,
        exact_k: false,
    }
    .native_feasible(target)
}

/// Shapes whose contiguous extents are multiples of 8 (the 16-byte copies) for `trans`,
/// with every other extent odd where it may be, so tiles end inside the matrix; k both
/// under one k step and over several.
fn shapes(trans: (bool, bool)) -> [[usize; 4]; 3] {
    let m = if trans.0 { 200 } else { 197 };
    let n = if trans.1 { 197 } else { 264 };
    [[1, m, n, 136], [3, 72, 40, 24], [1, 264, 320, 520]]
}

#[test]
fn native_variants_match_the_reference() {
    if matmul_caps(device()).native.is_none() {
        eprintln!(
            "SKIPPED native matmul: {} has no native kernels (VK_NVX_binary_import on a \
             Hopper GPU)",
            device().name()
        );
        let v = natives()[0];
        let a = Tensor::from_slice_as(device(), &[1.0; 64], &[8, 8], DType::BF16).unwrap();
        let err = a
            .matmul_opts(
                &a,
                &MatmulOptions {
                    variant: Some(v),
                    ..MatmulOptions::default()
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&v.label()) && err.contains("cannot run here"),
            "{err}"
        );
        assert_no_validation_messages();
        return;
    }
    let target = matmul_caps(device()).native;
    for (i, v) in natives().into_iter().enumerate() {
        for (j, trans) in TRANS.into_iter().enumerate() {
            let input = if (i + j) % 2 == 0 {
                DType::BF16
            } else {
                DType::F16
            };
            if !runs(v, trans, input, target) {
                eprintln!("{} has no {trans:?} form: skipped", v.label());
                continue;
            }
            for (s, dims) in shapes(trans).into_iter().enumerate() {
                let out = match s {
                    0 => DType::F32,
                    _ => input,
                };
                Case {
                    out,
                    alpha: if s == 1 { 0.5 } else { 1.0 },
                    ..Case::new(v, dims, trans, input)
                }
                .check(1000 + (i * 16 + j * 4 + s) as u64);
            }
        }
    }
    assert_no_validation_messages();
}

/// Every epilogue (bias, GELU and ReLU, residual, an activation's gradient), on the first
/// variant in two transposes, f32 and narrow outputs.
#[test]
fn native_epilogues_match_the_reference() {
    if matmul_caps(device()).native.is_none() {
        eprintln!("SKIPPED native matmul epilogues: no native kernels on this device");
        return;
    }
    let v = natives()[0];
    for (j, trans) in [(false, true), (true, false)].into_iter().enumerate() {
        for input in [DType::BF16, DType::F16] {
            for out in [DType::F32, input] {
                let dims = [2, 136, 264, 200];
                let base = Case {
                    out,
                    ..Case::new(v, dims, trans, input)
                };
                let seed = 2000 + j as u64 * 100;
                Case {
                    bias: true,
                    act: Activation::GeluTanh,
                    residual: true,
                    ..base
                }
                .check(seed);
                Case {
                    bias: true,
                    act: Activation::Relu,
                    ..base
                }
                .check(seed + 10);
                Case {
                    residual: true,
                    act_grad: Activation::GeluTanh,
                    ..base
                }
                .check(seed + 20);
                Case {
                    residual: true,
                    act_grad: Activation::Relu,
                    alpha: 0.25,
                    ..base
                }
                .check(seed + 30);
            }
        }
    }
    assert_no_validation_messages();
}
