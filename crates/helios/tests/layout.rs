//! Views, broadcasting, strided inputs and casts on the Vulkan device present (lavapipe in CI)
//! against the CPU reference: property tests over random shapes (odd sizes, never zeros),
//! broadcasts, views and dtypes, plus the edge cases by name. Run with `HELIOS_VALIDATION=1`;
//! every test fails on any validation message.
//!
//! Tolerances are the element-wise ones (`cpu::Tolerance`) widened by one rounding to the
//! storage type: f16 rtol 1e-3, bf16 rtol 8e-3 (half an ulp each, either side).

use helios::cpu::{self, Tolerance};
use helios::{BinaryOp, DType, Error, Layout, Tensor, UnaryOp};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{assert_no_validation_messages, device};

fn round(dtype: DType, v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| dtype.round(x)).collect()
}

/// Random values in ±[0.1, 4): never zero, inside every tested op's domain.
fn values(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let m = rng.gen_range(0.1f32..4.0);
            if rng.gen_bool(0.5) {
                m
            } else {
                -m
            }
        })
        .collect()
}

#[track_caller]
fn assert_close(what: &str, tol: Tolerance, got: &[f32], want: &[f32]) {
    if let Some((i, g, w)) = tol.first_mismatch(got, want) {
        panic!("{what}: element {i} = {g:e}, expected {w:e} ({tol:?})");
    }
}

/// How an operand of logical shape `shape` is made: dense, or a view of a larger or
/// differently ordered buffer, so that the kernel sees strides, offsets and stride-0 dims.
#[derive(Clone, Copy, Debug)]
enum Make {
    Dense,
    /// A buffer with dimensions `i` and `j` swapped, transposed back.
    Transposed,
    /// A buffer one element longer (at both ends) along one dimension, narrowed.
    Narrowed,
    /// A buffer with size 1 in randomly chosen dimensions, broadcast back (stride 0).
    Expanded,
}

/// Makes the freshly uploaded buffer tensor into the operand's view.
type ViewFn = Box<dyn Fn(&Tensor) -> Tensor>;

/// A tensor of logical `shape` made as `how`, and its values in row-major order.
fn operand(rng: &mut StdRng, shape: &[usize], how: Make, dtype: DType) -> (Tensor, Vec<f32>) {
    let d = device();
    let nd = shape.len();
    let (base_shape, view): (Vec<usize>, ViewFn) = match how {
        Make::Transposed if nd >= 2 => {
            let (i, j) = (rng.gen_range(0..nd), rng.gen_range(0..nd));
            let mut s = shape.to_vec();
            s.swap(i, j);
            (s, Box::new(move |t: &Tensor| t.transpose(i, j).unwrap()))
        }
        Make::Narrowed if nd >= 1 => {
            let dim = rng.gen_range(0..nd);
            let mut s = shape.to_vec();
            s[dim] += 2;
            let len = shape[dim];
            (
                s,
                Box::new(move |t: &Tensor| t.narrow(dim, 1, len).unwrap()),
            )
        }
        Make::Expanded if nd >= 1 => {
            let s: Vec<usize> = shape
                .iter()
                .map(|&n| if rng.gen_bool(0.5) { 1 } else { n })
                .collect();
            let target = shape.to_vec();
            (
                s,
                Box::new(move |t: &Tensor| t.broadcast_to(&target).unwrap()),
            )
        }
        _ => (shape.to_vec(), Box::new(|t: &Tensor| t.clone())),
    };
    let n: usize = base_shape.iter().product();
    let data = round(dtype, &values(rng, n));
    let base = Tensor::from_slice_as(d, &data, &base_shape, dtype).unwrap();
    let t = view(&base);
    assert_eq!(t.shape(), shape);
    let logical = cpu::gather(&data, t.layout());
    (t, logical)
}

/// `shape` with some dimensions set to 1 and some leading ones dropped (what broadcasts to it).
fn broadcastable(rng: &mut StdRng, shape: &[usize]) -> Vec<usize> {
    let drop = rng.gen_range(0..=shape.len().min(1));
    shape[drop..]
        .iter()
        .map(|&n| if rng.gen_bool(0.3) { 1 } else { n })
        .collect()
}

fn make(i: u8) -> Make {
    [
        Make::Dense,
        Make::Transposed,
        Make::Narrowed,
        Make::Expanded,
    ][usize::from(i % 4)]
}

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

const PROP_BINARY: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::GeluTanhBackward,
    BinaryOp::SiluBackward,
];

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Binary ops on two operands, each broadcast and made as a view, in every dtype.
    #[test]
    fn binary_ops_broadcast_over_views(
        shape in prop::collection::vec(1usize..=7, 1..=4),
        op in prop::sample::select(PROP_BINARY.to_vec()),
        dtype in prop::sample::select(DTYPES.to_vec()),
        (ma, mb) in (0u8..4, 0u8..4),
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let sa = broadcastable(&mut rng, &shape);
        let sb = broadcastable(&mut rng, &shape);
        let (a, va) = operand(&mut rng, &sa, make(ma), dtype);
        let (b, vb) = operand(&mut rng, &sb, make(mb), dtype);
        let (want, want_shape) = cpu::broadcast_binary(op, &va, &sa, &vb, &sb).unwrap();
        let y = a.binary(op, &b).unwrap();
        prop_assert_eq!(y.shape(), &want_shape[..]);
        prop_assert!(y.is_contiguous());
        let tol = Tolerance::binary(op).stored_as(dtype);
        assert_close(
            &format!("{op:?} {dtype} {sa:?}({ma}) with {sb:?}({mb})"),
            tol,
            &y.to_vec().unwrap(),
            &round(dtype, &want),
        );
        assert_no_validation_messages();
    }

    /// Unary and scalar ops, casts and `contiguous()` of views.
    #[test]
    fn unary_ops_casts_and_copies_of_views(
        shape in prop::collection::vec(1usize..=9, 1..=5),
        dtype in prop::sample::select(DTYPES.to_vec()),
        to in prop::sample::select(DTYPES.to_vec()),
        how in 0u8..4,
        permute in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut x, mut vx) = operand(&mut rng, &shape, make(how), dtype);
        if permute {
            // Reverse the dimensions on top of the view.
            let order: Vec<usize> = (0..shape.len()).rev().collect();
            x = x.permute(&order).unwrap();
            let l = Layout::contiguous(&shape).permute(&order).unwrap();
            vx = cpu::gather(&vx, &l);
        }
        let what = format!("{dtype} {:?} (made {how}, permuted {permute})", x.layout());
        let exp = x.exp().unwrap().to_vec().unwrap();
        let tol = Tolerance::unary(UnaryOp::Exp).stored_as(dtype);
        assert_close(&format!("exp {what}"), tol, &exp, &round(dtype, &cpu::unary(UnaryOp::Exp, &vx)));
        let s = x.scalar_first_op(BinaryOp::Sub, 0.75).unwrap().to_vec().unwrap();
        let want = round(dtype, &cpu::scalar(BinaryOp::Sub, &vx, 0.75, true));
        assert_close(&format!("0.75 - x {what}"), Tolerance::EXACT.stored_as(dtype), &s, &want);
        // A copy and a cast are exact: the same value, or the value rounded once.
        let c = x.contiguous().unwrap();
        prop_assert!(c.is_contiguous());
        prop_assert_eq!(c.to_vec().unwrap(), vx.clone());
        prop_assert_eq!(x.to_vec().unwrap(), vx.clone());
        let cast = x.to_dtype(to).unwrap();
        prop_assert_eq!(cast.dtype(), to);
        prop_assert_eq!(cast.to_vec().unwrap(), round(to, &vx));
        assert_no_validation_messages();
    }
}

#[test]
fn views_are_metadata() {
    // A device of its own: the binary's other tests record work on the shared one while
    // this one compares encoder counts.
    let own = common::device_with(|c| c);
    let d = &own;
    let data: Vec<f32> = (0..24).map(|i| i as f32 + 1.0).collect();
    let x = Tensor::from_slice(d, &data, &[2, 3, 4]).unwrap();
    d.synchronize().unwrap();
    let before = d.encoder_stats();
    let t = x.transpose(0, 2).unwrap();
    let n = t.narrow(1, 1, 2).unwrap();
    let p = x.permute(&[1, 2, 0]).unwrap();
    let b = x
        .narrow(2, 3, 1)
        .unwrap()
        .broadcast_to(&[5, 2, 3, 7])
        .unwrap();
    let r = x.reshape(&[6, 4]).unwrap();
    let s = x.slice(0, 1..2).unwrap();
    assert_eq!(d.encoder_stats(), before, "views record no GPU work");
    assert_eq!(t.shape(), &[4, 3, 2]);
    assert_eq!(t.layout().strides(), &[1, 4, 12]);
    assert_eq!((n.shape(), n.layout().offset()), (&[4, 2, 2][..], 4));
    assert_eq!(p.shape(), &[3, 4, 2]);
    assert_eq!(b.layout().strides(), &[0, 12, 4, 0]);
    assert!(r.is_contiguous() && !t.is_contiguous());
    assert_eq!(s.to_vec().unwrap(), data[12..].to_vec());
    // x[i, j, k] = 12i + 4j + k + 1.
    let tv = t.to_vec().unwrap();
    assert_eq!(tv[..4], [1.0, 13.0, 5.0, 17.0]);
    let bv = b.to_vec().unwrap();
    assert_eq!(bv.len(), 5 * 2 * 3 * 7);
    assert_eq!(bv[..8], [4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 8.0]);
    // A block of rows starting 16-byte aligned (the vec4 path with device addresses) and one
    // that does not (the strided path).
    let m = Tensor::from_slice(d, &data, &[6, 4]).unwrap();
    for start in [2, 1] {
        let rows = m.narrow(0, start, 3).unwrap();
        let want: Vec<f32> = data[4 * start..4 * start + 12].iter().map(|v| -v).collect();
        assert_eq!(rows.neg().unwrap().to_vec().unwrap(), want);
    }
    // Reshaping a transposed view copies first, then has the transposed order.
    let rt = t.reshape(&[24]).unwrap();
    assert!(rt.is_contiguous());
    assert_eq!(rt.to_vec().unwrap(), tv);
    common::assert_clean(d);
}

#[test]
fn broadcasting_matches_numpy() {
    let d = device();
    let a = Tensor::from_slice(d, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let row = Tensor::from_slice(d, &[10.0, 20.0, 30.0], &[3]).unwrap();
    let col = Tensor::from_slice(d, &[100.0, 200.0], &[2, 1]).unwrap();
    let scalar = Tensor::from_slice(d, &[0.5], &[]).unwrap();
    assert_eq!(
        a.add(&row).unwrap().to_vec().unwrap(),
        [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]
    );
    let outer = col.mul(&row).unwrap();
    assert_eq!(outer.shape(), &[2, 3]);
    assert_eq!(
        outer.to_vec().unwrap(),
        [1000.0, 2000.0, 3000.0, 2000.0, 4000.0, 6000.0]
    );
    let s = scalar.sub(&a).unwrap();
    assert_eq!(s.shape(), &[2, 3]);
    assert_eq!(s.to_vec().unwrap()[..2], [-0.5, -1.5]);
    // An empty dimension broadcasts to an empty result without a dispatch.
    let e = Tensor::from_slice(d, &[], &[0, 3]).unwrap();
    assert_eq!(e.add(&row).unwrap().shape(), &[0, 3]);
    for (x, y) in [
        (&a, &col.transpose(0, 1).unwrap()),
        (&row, &col.reshape(&[2]).unwrap()),
    ] {
        match x.add(y) {
            Err(e @ Error::ShapeMismatch { .. }) => {
                assert!(e.to_string().contains("broadcast"), "{e}")
            }
            other => panic!("incompatible shapes gave {other:?}"),
        }
    }
    assert_no_validation_messages();
}

#[test]
fn bad_views_are_errors() {
    let d = device();
    let x = Tensor::from_slice(d, &[1.0; 6], &[2, 3]).unwrap();
    let invalid = |r: helios::Result<Tensor>| match r {
        Err(e @ Error::InvalidView { .. }) => e.to_string(),
        other => panic!("expected InvalidView, got {other:?}"),
    };
    assert!(invalid(x.reshape(&[4])).contains("elements"));
    assert!(invalid(x.transpose(0, 2)).contains("dimension 2"));
    assert!(invalid(x.permute(&[0, 0])).contains("permutation"));
    assert!(invalid(x.narrow(1, 2, 2)).contains("outside"));
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = x.slice(1, 2..1);
    assert!(invalid(reversed).contains("reversed"));
    assert!(invalid(x.broadcast_to(&[3, 3])).contains("broadcast"));
    assert!(invalid(x.broadcast_to(&[3])).contains("broadcast"));
    // Seven dimensions that no merge can reduce: fused kernels bake any number of them.
    let vals: Vec<f32> = (0..128).map(|i| i as f32).collect();
    let y = Tensor::from_slice(d, &vals, &[2; 7]).unwrap();
    let reversed = y.permute(&[6, 5, 4, 3, 2, 1, 0]).unwrap();
    let got = reversed.add_scalar(1.0).unwrap().to_vec().unwrap();
    let want: Vec<f32> = (0..128usize)
        .map(|i| (i.reverse_bits() >> (usize::BITS - 7)) as f32 + 1.0)
        .collect();
    assert_eq!(got, want, "7 strided dims");
    // Eight dimensions that merge into one are fine.
    let z = Tensor::from_slice(d, &[1.5; 256], &[2; 8]).unwrap();
    assert_eq!(
        z.narrow(7, 0, 2).unwrap().neg().unwrap().to_vec().unwrap(),
        vec![-1.5; 256]
    );
    assert_no_validation_messages();
}

/// Casts between every pair of float dtypes, stored and fused: ±inf, NaN (payloads in the
/// low bits, both signs; the sign kept except through f16), overflow, and ties, which round
/// to even.
#[test]
fn casts_round_to_nearest_even_and_keep_specials() {
    let d = device();
    let bits = |b: u32| f32::from_bits(b);
    let specials = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        bits(0x7f80_0001), // NaN with only a low payload bit: must not become inf
        bits(0xff80_0001), // the same, negative
        bits(0xffc0_0000), // -NaN
        -0.0,
        0.0,
        f32::MAX,
        65520.0,           // f16 tie between 65504 and infinity: rounds to infinity
        1.0 + 1.0 / 256.0, // bf16 tie: rounds down to 1 (even)
        1.0 + 3.0 / 256.0, // bf16 tie: rounds up to 1 + 2^-6 (even)
        -(1.0 + 3.0 / 256.0),
        1.0 + 1.0 / 2048.0, // f16 tie: rounds down to 1
        1.0 + 3.0 / 2048.0, // f16 tie: rounds up to 1 + 2^-9
        3.140625,
    ];
    for from in DTYPES {
        let src = round(from, &specials);
        let x = Tensor::from_slice_as(d, &src, &[src.len()], from).unwrap();
        for to in DTYPES {
            let got = x.to_dtype(to).unwrap().to_vec().unwrap();
            // A NaN keeps its sign unless it passes through f16, whose conversions leave the
            // sign to the implementation (NVIDIA's drop it; see `store_f32`).
            let sign_kept = from != DType::F16 && to != DType::F16;
            for (i, (&g, &v)) in got.iter().zip(&src).enumerate() {
                let want = to.round(v);
                let same = if want.is_nan() {
                    g.is_nan() && (!sign_kept || g.is_sign_negative() == want.is_sign_negative())
                } else {
                    g.to_bits() == want.to_bits()
                };
                assert!(
                    same,
                    "{from}→{to}: element {i} ({v:e}) = {g:e}, want {want:e}"
                );
            }
        }
    }
    // The ties by value, not only against `half`.
    let f = Tensor::from_vec1(d, &specials).unwrap();
    let bf = f.to_dtype(DType::BF16).unwrap().to_vec().unwrap();
    assert_eq!(bf[10..13], [1.0, 1.0 + 1.0 / 64.0, -(1.0 + 1.0 / 64.0)]);
    assert!(bf[3].is_nan() && bf[4].is_nan() && bf[4].is_sign_negative());
    assert_eq!(bf[8], f32::INFINITY);
    let h = f.to_dtype(DType::F16).unwrap().to_vec().unwrap();
    assert_eq!(h[9], f32::INFINITY);
    assert_eq!(h[13..15], [1.0, 1.0 + 1.0 / 512.0]);
    // The same rounding inside one fused kernel (f32 → f16 → f32 in registers); NaN stays
    // NaN (its sign, as above, is the implementation's).
    let round_trip = f
        .to_dtype(DType::F16)
        .and_then(|t| t.to_dtype(DType::F32))
        .unwrap()
        .to_vec()
        .unwrap();
    for (i, (&g, &v)) in round_trip.iter().zip(&specials).enumerate() {
        let want = DType::F16.round(v);
        let same = match want.is_nan() {
            true => g.is_nan(),
            false => g.to_bits() == want.to_bits(),
        };
        assert!(
            same,
            "f32→f16→f32 fused: element {i} ({v:e}) = {g:e}, want {want:e}"
        );
    }
    assert_no_validation_messages();
}

/// A view of a tensor, for table-driven tests.
type View = fn(&Tensor) -> Tensor;

/// `contiguous()` of a large transposed matrix (a batch of them, an offset view) copies it
/// through the tiled transpose, recorded at once, and gives exactly the elements in order,
/// sizes not multiples of the 32-wide tile; a small one stays a lazy element-wise copy.
#[test]
fn large_transposes_copy_through_tiles() {
    let d = common::device_with(|c| c);
    let mut rng = StdRng::seed_from_u64(31);
    for dtype in DTYPES {
        // (shape of the row-major source, how it is viewed, whether the tiles copy it).
        let cases: [(&[usize], View, bool); 4] = [
            (&[300, 257], |x| x.transpose(0, 1).unwrap(), true),
            (&[3, 130, 201], |x| x.transpose(1, 2).unwrap(), true),
            (
                &[310, 260],
                |x| {
                    x.narrow(0, 5, 300)
                        .unwrap()
                        .narrow(1, 2, 257)
                        .unwrap()
                        .transpose(0, 1)
                        .unwrap()
                },
                true,
            ),
            (&[40, 33], |x| x.transpose(0, 1).unwrap(), false),
        ];
        for (shape, view, tiled) in cases {
            let n: usize = shape.iter().product();
            let host = round(dtype, &values(&mut rng, n));
            let x = Tensor::from_slice_as(&d, &host, shape, dtype).unwrap();
            let v = view(&x);
            // The reference: the view's elements in row-major order, from its layout.
            let l = v.layout();
            let want: Vec<f32> = l.indices().iter().map(|&i| host[i]).collect();
            d.synchronize().unwrap();
            let before = d.encoder_stats().dispatches;
            let c = v.contiguous().unwrap();
            let recorded = d.encoder_stats().dispatches - before;
            assert_eq!(recorded, u64::from(tiled), "{dtype} {shape:?}: dispatches");
            assert!(c.is_contiguous() && c.shape() == v.shape());
            let got = c.to_vec().unwrap();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                "{dtype} {shape:?}: the copy differs from the view"
            );
        }
    }
    common::assert_clean(&d);
}
