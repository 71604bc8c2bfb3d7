// Fq kernels on the Vulkan device present (lavapipe in CI), with the validation layer on
// unless HELIOS_VALIDATION=0: every result is compared with blst, the algebraic laws are
// checked on the device, non-canonical input must be rejected before anything is submitted,
// and a test fails on any validation message.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

use helios_field::{
    cpu, edge_elements, random_elements, Batch, Field, FieldConfig, FieldError, FieldOp, Fq, Job,
    Layout, FIELD_WORKGROUP, ONE, P, R_MOD_P,
};
use helios_vk::{env, Context, Instance, InstanceOptions};

/// Held by a test thread from its first context on until the thread ends, so the tests of
/// this binary never use Vulkan at the same time: the Khronos validation layer (Debian's
/// 1.3.239) races one device's creation against another device's commands (helios-vk's
/// tests hold the same kind of lock, session 22); this binary crashed in it once in CI-like
/// runs (SIGSEGV, session 23).
static SERIAL: Mutex<()> = Mutex::new(());

thread_local! {
    static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

fn context() -> Arc<Context> {
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.is_none() {
            // A test that panicked while holding it poisoned nothing it protects.
            *held = Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()));
        }
    });
    let validation = env::flag(env::HELIOS_VALIDATION)
        .expect("HELIOS_VALIDATION must be 0 or 1")
        .unwrap_or(true);
    let instance = Arc::new(Instance::new(&InstanceOptions { validation }).expect("instance"));
    let adapters = instance.adapters().expect("adapters");
    let adapter = helios_vk::select_adapter_from_env(&adapters).expect("adapter");
    Context::new(instance.clone(), adapter).expect("context")
}

#[track_caller]
fn finish(ctx: Arc<Context>) {
    let instance = Arc::clone(ctx.instance());
    drop(ctx);
    let messages = instance.validation_messages();
    assert!(messages.is_empty(), "validation:\n{}", messages.join("\n"));
}

/// The tests' configuration: workgroup 64, the rest default.
fn config(layout: Layout, device_local: bool) -> FieldConfig {
    FieldConfig {
        layout,
        workgroup: 64,
        device_local,
        ..FieldConfig::default()
    }
}

fn field(ctx: &Arc<Context>, layout: Layout, device_local: bool) -> Field {
    Field::with_config(Arc::clone(ctx), config(layout, device_local)).expect("field")
}

/// Every edge value against every edge value, then random pairs: (a, b).
fn inputs(random: usize, seed: u64) -> (Vec<Fq>, Vec<Fq>) {
    let edges = edge_elements();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for x in &edges {
        for y in &edges {
            a.push(*x);
            b.push(*y);
        }
    }
    a.extend(random_elements(random, seed));
    b.extend(random_elements(random, seed + 1));
    (a, b)
}

#[track_caller]
fn assert_same(op: FieldOp, what: &str, got: &[Fq], want: &[Fq], a: &[Fq], b: &[Fq]) {
    assert_eq!(got.len(), want.len());
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what} {op:?} element {i}: a={:x?} b={:x?} got {:x?} want {:x?}",
            a[i], b[i], got[i], want[i]
        );
    }
}

#[test]
fn every_op_and_layout_matches_blst() {
    let ctx = context();
    for layout in Layout::ALL {
        let (a, b) = inputs(300, 1);
        let f = field(&ctx, layout, false);
        for op in FieldOp::ALL {
            let bb: &[Fq] = if op.arity() == 2 { &b } else { &[] };
            let got = f.compute(op, &a, bb).expect("compute");
            let want = cpu::reference(op, &a, &b);
            assert_same(op, layout.name(), &got, &want, &a, &b);
        }
    }
    finish(ctx);
}

#[test]
fn mul_chain_probe_matches_blst() {
    let ctx = context();
    let forms = Layout::ALL
        .into_iter()
        .flat_map(|layout| [(layout, false), (layout, true)]);
    for (layout, chain_canonical) in forms {
        let (a, b) = inputs(100, 31);
        let config = FieldConfig {
            chain_canonical,
            ..config(layout, true)
        };
        let f = Field::with_config(Arc::clone(&ctx), config).expect("field");
        let (da, db, dc) = (
            f.upload(&a).unwrap(),
            f.upload(&b).unwrap(),
            f.alloc(a.len()).unwrap(),
        );
        for k in [0, 1, 5] {
            f.mul_chain(da.all(), db.all(), dc.all(), k).unwrap();
            let want = cpu::mul_chain(&a, &b, k);
            assert_same(
                FieldOp::Mul,
                layout.name(),
                &f.download(dc.all()).unwrap(),
                &want,
                &a,
                &b,
            );
        }
    }
    finish(ctx);
}

/// Outputs fed back as inputs: 1000 dependent products per element (edge values included, so
/// p − 1 and values with high limbs set run through long chains), and repeated squaring in
/// place through a batch, for every layout.
#[test]
fn long_chains_match_blst() {
    let ctx = context();
    let k = 1000;
    for layout in Layout::ALL {
        let (a, b) = inputs(16, 61);
        let want = cpu::mul_chain(&a, &b, k);
        let mut want_sq = a.clone();
        for _ in 0..20 {
            want_sq = cpu::reference(FieldOp::Sqr, &want_sq, &[]);
        }
        let f = field(&ctx, layout, true);
        let (da, db, dc) = (
            f.upload(&a).unwrap(),
            f.upload(&b).unwrap(),
            f.alloc(a.len()).unwrap(),
        );
        f.mul_chain(da.all(), db.all(), dc.all(), k).unwrap();
        let got = f.download(dc.all()).unwrap();
        assert_same(FieldOp::Mul, layout.name(), &got, &want, &a, &b);
        let mut batch = Batch::new();
        for _ in 0..20 {
            batch.push(FieldOp::Sqr, &[da.all()], dc.all()).unwrap();
            batch
                .push(FieldOp::Add, &[dc.all(), dc.all()], da.all())
                .unwrap();
            batch
                .push(FieldOp::Sub, &[da.all(), dc.all()], da.all())
                .unwrap(); // da = dc
        }
        f.run(&batch).unwrap();
        let got = f.download(da.all()).unwrap();
        assert_same(FieldOp::Sqr, layout.name(), &got, &want_sq, &a, &b);
    }
    finish(ctx);
}

/// Lengths 0 to 9 on slices starting at odd elements, out of place and in place, and the
/// chain probe: results match blst and nothing outside the output slice is written.
#[test]
fn every_length_and_offset_stays_in_bounds() {
    let ctx = context();
    let total = 24;
    let (a, b) = (random_elements(total, 41), random_elements(total, 42));
    let guard = random_elements(total, 43);
    let layout = helios_field::DEFAULT_LAYOUT;
    let f = field(&ctx, layout, true);
    let (da, db) = (f.upload(&a).unwrap(), f.upload(&b).unwrap());
    for n in [0, 1, 2, 3, 4, 5, 7, 8, 9] {
        for start in [0, 1, 3] {
            let r = start..start + n;
            let what = format!("{} n={n} start={start}", layout.name());
            let (sa, sb) = (da.slice(r.clone()).unwrap(), db.slice(r.clone()).unwrap());
            let expect = |part: &[Fq]| {
                let mut want = guard.clone();
                want[r.clone()].copy_from_slice(part);
                want
            };
            for op in FieldOp::ALL {
                let out = f.upload(&guard).unwrap();
                let mut batch = Batch::new();
                batch
                    .push(op, &[sa, sb][..op.arity()], out.slice(r.clone()).unwrap())
                    .unwrap();
                f.run(&batch).unwrap();
                let want = expect(&cpu::reference(op, &a[r.clone()], &b[r.clone()]));
                assert_same(op, &what, &f.download(out.all()).unwrap(), &want, &a, &b);
            }
            // In place: x = x·b, then x = x².
            let x = f.upload(&a).unwrap();
            let xs = x.slice(r.clone()).unwrap();
            let mut batch = Batch::new();
            batch.push(FieldOp::Mul, &[xs, sb], xs).unwrap();
            batch.push(FieldOp::Sqr, &[xs], xs).unwrap();
            f.run(&batch).unwrap();
            let ab = cpu::reference(FieldOp::Mul, &a[r.clone()], &b[r.clone()]);
            let mut want = a.clone();
            want[r.clone()].copy_from_slice(&cpu::reference(FieldOp::Sqr, &ab, &[]));
            let got = f.download(x.all()).unwrap();
            assert_same(FieldOp::Sqr, &what, &got, &want, &a, &b);
            // The chain probe.
            let out = f.upload(&guard).unwrap();
            f.mul_chain(sa, sb, out.slice(r.clone()).unwrap(), 3)
                .unwrap();
            let want = expect(&cpu::mul_chain(&a[r.clone()], &b[r.clone()], 3));
            let got = f.download(out.all()).unwrap();
            assert_same(FieldOp::Mul, &what, &got, &want, &a, &b);
        }
    }
    finish(ctx);
}

#[test]
fn device_resident_batches_and_streams_match_blst() {
    let ctx = context();
    for device_local in [true, false] {
        let f = field(&ctx, helios_field::DEFAULT_LAYOUT, device_local);
        let what = if device_local {
            "device-local"
        } else {
            "host-visible"
        };
        let n = 1000;
        let (a, b) = (random_elements(n, 7), random_elements(n, 8));
        let (da, db, dc) = (
            f.upload(&a).unwrap(),
            f.upload(&b).unwrap(),
            f.alloc(n).unwrap(),
        );
        assert!(f.download(dc.all()).unwrap().iter().all(|x| *x == [0; 6]));

        // A dependent chain in one submit: c = a·b; c = c + a; c = c²; plus independent ops on
        // the halves of a fourth array.
        let d = f.alloc(n).unwrap();
        let (lo, hi) = (d.slice(0..n / 2).unwrap(), d.slice(n / 2..n).unwrap());
        let mut batch = Batch::new();
        batch
            .push(FieldOp::Mul, &[da.all(), db.all()], dc.all())
            .unwrap();
        batch
            .push(FieldOp::Add, &[dc.all(), da.all()], dc.all())
            .unwrap();
        batch.push(FieldOp::Sqr, &[dc.all()], dc.all()).unwrap();
        batch
            .push(FieldOp::Neg, &[da.slice(0..n / 2).unwrap()], lo)
            .unwrap();
        batch
            .push(
                FieldOp::Sub,
                &[da.slice(n / 2..n).unwrap(), db.slice(n / 2..n).unwrap()],
                hi,
            )
            .unwrap();
        f.run(&batch).unwrap();

        let mul = cpu::reference(FieldOp::Mul, &a, &b);
        let add = cpu::reference(FieldOp::Add, &mul, &a);
        let want_c = cpu::reference(FieldOp::Sqr, &add, &[]);
        let got_c = f.download(dc.all()).unwrap();
        assert_same(FieldOp::Sqr, what, &got_c, &want_c, &a, &b);
        let mut want_d = cpu::reference(FieldOp::Neg, &a[..n / 2], &[]);
        want_d.extend(cpu::reference(FieldOp::Sub, &a[n / 2..], &b[n / 2..]));
        assert_same(
            FieldOp::Sub,
            what,
            &f.download(d.all()).unwrap(),
            &want_d,
            &a,
            &b,
        );

        // write + read of a sub-range.
        f.write(d.slice(10..20).unwrap(), &b[..10]).unwrap();
        assert_eq!(f.download(d.slice(10..20).unwrap()).unwrap(), &b[..10]);

        // Streaming: chunks that do not divide n, more chunks than slots.
        for op in [FieldOp::Mul, FieldOp::ToMont] {
            let bb: &[Fq] = if op.arity() == 2 { &b } else { &[] };
            let mut out = vec![[0; 6]; n];
            f.stream(op, &a, bb, &mut out, 96).unwrap();
            assert_same(op, what, &out, &cpu::reference(op, &a, &b), &a, &b);
        }

        // One-shot batch of jobs of different ops and sizes (including empty).
        let sizes = [1usize, 0, 77, 513];
        let mut outs: Vec<Vec<Fq>> = sizes.iter().map(|&s| vec![[0; 6]; s]).collect();
        let ops = [FieldOp::Add, FieldOp::Mul, FieldOp::FromMont, FieldOp::Sub];
        let mut jobs: Vec<Job<'_>> = outs
            .iter_mut()
            .zip(sizes.iter().zip(ops))
            .map(|(out, (&s, op))| Job {
                op,
                a: &a[..s],
                b: if op.arity() == 2 { &b[..s] } else { &[] },
                out,
            })
            .collect();
        f.compute_batch(&mut jobs).unwrap();
        for ((out, &s), op) in outs.iter().zip(&sizes).zip(ops) {
            let want = cpu::reference(op, &a[..s], &b[..s]);
            assert_same(op, what, out, &want, &a, &b);
        }
    }
    finish(ctx);
}

#[test]
fn algebraic_laws_hold_on_the_device() {
    let ctx = context();
    let f = field(&ctx, helios_field::DEFAULT_LAYOUT, false);
    let (a, b) = inputs(200, 11);
    let c = random_elements(a.len(), 13);
    let n = a.len();
    let (da, db, dc) = (
        f.upload(&a).unwrap(),
        f.upload(&b).unwrap(),
        f.upload(&c).unwrap(),
    );
    let one = f.upload(&vec![R_MOD_P; n]).unwrap(); // 1 in Montgomery form
    let t: Vec<_> = (0..10).map(|_| f.alloc(n).unwrap()).collect();
    let s = |i: usize| t[i].all();
    let mut batch = Batch::new();
    macro_rules! push {
        ($op:expr, $ins:expr, $out:expr) => {
            batch.push($op, $ins, $out).unwrap()
        };
    }
    push!(FieldOp::Add, &[da.all(), db.all()], s(0)); // a + b
    push!(FieldOp::Add, &[db.all(), da.all()], s(1)); // b + a
    push!(FieldOp::Sub, &[s(0), db.all()], s(2)); // (a + b) - b
    push!(FieldOp::Mul, &[da.all(), db.all()], s(3)); // ab
    push!(FieldOp::Mul, &[db.all(), da.all()], s(4)); // ba
    push!(FieldOp::Mul, &[da.all(), one.all()], s(5)); // a·1
    push!(FieldOp::Add, &[db.all(), dc.all()], s(6));
    push!(FieldOp::Mul, &[da.all(), s(6)], s(6)); // a(b + c), in place
    push!(FieldOp::Mul, &[da.all(), dc.all()], s(7));
    push!(FieldOp::Add, &[s(3), s(7)], s(7)); // ab + ac
    push!(FieldOp::ToMont, &[da.all()], s(8));
    push!(FieldOp::FromMont, &[s(8)], s(8)); // from(to(a))
    push!(FieldOp::Neg, &[da.all()], s(9));
    push!(FieldOp::Add, &[s(9), da.all()], s(9)); // -a + a
    f.run(&batch).unwrap();
    let get = |i: usize| f.download(s(i)).unwrap();
    assert_eq!(get(0), get(1), "a + b = b + a");
    assert_eq!(get(2), a, "(a + b) - b = a");
    assert_eq!(get(3), get(4), "ab = ba");
    assert_eq!(get(5), a, "a·1 = a");
    assert_eq!(get(6), get(7), "a(b + c) = ab + ac");
    assert_eq!(get(8), a, "Montgomery round trip");
    assert!(get(9).iter().all(|x| *x == [0; 6]), "a + (-a) = 0");
    // Squaring is the product with itself.
    let sq = f.compute(FieldOp::Sqr, &a, &[]).unwrap();
    assert_eq!(sq, f.compute(FieldOp::Mul, &a, &a).unwrap(), "a² = a·a");
    drop((da, db, dc, one, t));
    finish(ctx);
}

#[test]
fn non_canonical_input_is_rejected_before_anything_runs() {
    let ctx = context();
    let f = field(&ctx, helios_field::DEFAULT_LAYOUT, true);
    let mut a = random_elements(100, 21);
    let b = random_elements(100, 22);
    a[57] = P;
    let before = ctx.last_submitted();
    let nc = |r: Result<_, FieldError>| match r {
        Err(FieldError::NonCanonical { index, .. }) => index,
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("non-canonical input accepted"),
    };
    assert_eq!(nc(f.upload(&a).map(|_| ())), 57);
    assert_eq!(nc(f.compute(FieldOp::Add, &b, &a).map(|_| ())), 57);
    let mut out = vec![[0; 6]; 100];
    assert_eq!(nc(f.stream(FieldOp::Mul, &b, &a, &mut out, 10)), 57);
    a[57] = [u64::MAX; 6];
    let err = f.compute(FieldOp::Neg, &a, &[]).unwrap_err();
    assert!(
        err.to_string().contains("element 57") && err.to_string().contains(">= p"),
        "{err}"
    );
    assert_eq!(ctx.last_submitted(), before, "nothing may be submitted");

    // Shapes and ranges are errors too, not panics.
    let good = f.upload(&b).unwrap();
    let short = f.alloc(10).unwrap();
    assert!(matches!(
        f.compute(FieldOp::Add, &b, &b[..5]),
        Err(FieldError::Shape { .. })
    ));
    assert!(matches!(
        f.compute(FieldOp::Neg, &b, &b),
        Err(FieldError::Shape { .. })
    ));
    assert!(matches!(
        good.slice(90..101),
        Err(FieldError::OutOfRange { .. })
    ));
    let mut batch = Batch::new();
    assert!(batch.push(FieldOp::Add, &[good.all()], good.all()).is_err());
    assert!(batch
        .push(FieldOp::Add, &[good.all(), good.all()], short.all())
        .is_err());
    let overlap = (good.slice(0..10).unwrap(), good.slice(5..15).unwrap());
    assert!(batch.push(FieldOp::Sqr, &[overlap.0], overlap.1).is_err());
    assert!(f.stream(FieldOp::Sqr, &b, &[], &mut out, 0).is_err());
    assert_eq!(ONE[0], 1);
    drop((good, short));
    finish(ctx);
}

#[test]
fn default_workgroup_is_a_whole_number_of_subgroups() {
    assert_eq!(FIELD_WORKGROUP % 32, 0);
}
