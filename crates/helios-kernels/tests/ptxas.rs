//! Every native (PTX) kernel the matmul family can emit goes through `ptxas` for the target
//! it is built for, as every SPIR-V module goes through `spirv-val`: each variant in every
//! transpose, storage and epilogue, and the attention forward, Dq and DkDv in every
//! storage, head dim and mask, without register spills.

use helios_kernels::attention::{AttentionKernel, AttnStage, NATIVE_VARIANTS};
use helios_kernels::matmul::native_variants;
use helios_kernels::{
    Activation, Epilogue, MatmulKernel, MatmulVariant as Variant, Storage, Triangle,
};
use helios_ptx::{ptxas, sass, Target};

const FULL: Epilogue = Epilogue::forward(true, Activation::GeluTanh, true);

const SAVING_PRE: Epilogue = Epilogue::Forward {
    bias: true,
    act: Activation::GeluTanh,
    residual: false,
    store_pre: true,
};

const ACT_GRAD: Epilogue = Epilogue::ActGrad(Activation::GeluTanh);

const RELU: Epilogue = Epilogue::forward(true, Activation::Relu, false);

const TRANS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

fn kernel(
    variant: Variant,
    input: Storage,
    out: Storage,
    trans: (bool, bool),
    vec_c: bool,
    epilogue: Epilogue,
) -> MatmulKernel {
    MatmulKernel {
        variant,
        input,
        out,
        trans_a: trans.0,
        trans_b: trans.1,
        vec_a: true,
        vec_b: true,
        vec_c,
        epilogue,
        triangle: Triangle::Full,
        subgroup: 0,
        exact_k: false,
    }
}

fn check(k: &MatmulKernel) {
    if !k.native_feasible(Some(Target::SM90A)) {
        return;
    }
    let m = k
        .build_native(Target::SM90A)
        .unwrap_or_else(|e| panic!("{e}"));
    assemble(&m);
}

fn assemble(m: &helios_ptx::Module) -> Vec<u8> {
    let report = ptxas(&m.name, &m.text, &Target::SM90A.name()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (report.spill_stores, report.spill_loads),
        (0, 0),
        "{} spills ({} registers):\n{:?}",
        m.name,
        report.registers,
        report.warnings
    );
    assert!(
        report.warnings.is_empty(),
        "{}: {:?}",
        m.name,
        report.warnings
    );
    report.cubin
}

/// Every native variant in every transpose; the first also in every storage and epilogue.
#[test]
fn native_matmul_kernels_assemble() {
    let variants = native_variants();
    assert!(!variants.is_empty());
    for (i, &v) in variants.iter().enumerate() {
        for (j, trans) in TRANS.into_iter().enumerate() {
            check(&kernel(
                v,
                Storage::BF16,
                Storage::BF16,
                trans,
                true,
                Epilogue::NONE,
            ));
            check(&kernel(
                v,
                Storage::F16,
                Storage::F32,
                trans,
                j % 2 == 0,
                FULL,
            ));
            if i == 0 {
                // Every epilogue into every output storage, the inputs and the output's
                // vector stores alternating (each module costs ptxas a few tenths of a second).
                let mut n = j;
                for out in Storage::ALL {
                    for ep in [Epilogue::NONE, FULL, ACT_GRAD, SAVING_PRE, RELU] {
                        let input = [Storage::F16, Storage::BF16][n % 2];
                        check(&kernel(v, input, out, trans, n % 3 != 0, ep));
                        n += 1;
                    }
                }
            }
        }
    }
}

/// A target without Hopper's architecture-specific instructions (`wgmma`, `setmaxnreg`) gets
/// an error naming the instruction, not a module its driver would reject.
#[test]
fn native_matmul_needs_wgmma() {
    let k = kernel(
        native_variants()[0],
        Storage::BF16,
        Storage::BF16,
        (false, true),
        true,
        Epilogue::NONE,
    );
    let err = k.build_native(Target::SM90).unwrap_err().to_string();
    assert!(
        (err.contains("wgmma") || err.contains("setmaxnreg")) && err.contains("which sm_90 does"),
        "{err}"
    );
}

/// Every native attention kernel that exists (forward, Dq, DkDv): each tile at the head
/// dims it takes (32 to 256), f16 and bf16, causal or not, with and without key padding, the backward's
/// packed outputs.
#[test]
fn native_attention_kernels_assemble() {
    let mut built = 0;
    for variant in NATIVE_VARIANTS {
        // Whole panels, and each padding a head dim can take (16, 32, 48 channels); GPT-2's
        // and head dim 128 in both storages, the others in one (the modules cost ptxas
        // seconds each).
        for (j, head_dim) in [32, 48, 64, 80, 96, 128, 144, 192, 256]
            .into_iter()
            .enumerate()
        {
            let both = matches!(head_dim, 64 | 128);
            for (i, storage) in [Storage::BF16, Storage::F16]
                .into_iter()
                .enumerate()
                .filter(|&(i, _)| both || i == j % 2)
            {
                for (causal, stage, own_dsum) in [true, false].into_iter().flat_map(|c| {
                    [
                        (AttnStage::Forward, false),
                        (AttnStage::Dq, false),
                        (AttnStage::Dq, true),
                        (AttnStage::DkDv, false),
                    ]
                    .map(|(s, o)| (c, s, o))
                }) {
                    let k = AttentionKernel {
                        stage,
                        storage,
                        head_dim,
                        causal,
                        padded: causal == (i == 0),
                        variant,
                        binding: helios_spirv::Binding::DeviceAddress,
                        subgroup: 0,
                        frag: None,
                        pipelined: false,
                        own_dsum,
                        packed: stage != AttnStage::Forward && causal,
                    };
                    if !k.native_feasible(Some(Target::SM90A)) {
                        continue;
                    }
                    let m = k
                        .build_native(Target::SM90A)
                        .unwrap_or_else(|e| panic!("{e}"));
                    let cubin = assemble(&m);
                    let text = sass(&m.name, &cubin).unwrap_or_else(|e| panic!("{e}"));
                    if let Err(e) = fragments_kept(&text) {
                        panic!("{}: {e}", m.name);
                    }
                    built += 1;
                }
            }
        }
    }
    println!("{built} native attention modules assembled");
    assert!(built >= 8, "{built} native attention kernels");
}

/// The register-allocation fault met on the H200 (bench/results/2026-11-29-native-
/// attention-h200.md): a `wgmma` whose A operand is a loop-invariant register fragment (Q
/// in the forward and Dq, dO in Dq, K and V in DkDv: the forms without `.tnspB`) had those
/// registers reused for scratch inside the loop, so the next key block multiplied garbage.
/// Checks, on the SASS, that nothing inside the innermost loop around such an `HGMMA`
/// writes a register it reads as A. (A kernel with two code paths, as DkDv's split roles,
/// may use one path's fragments as the other's scratch: each loop is judged alone.)
fn fragments_kept(sass: &str) -> Result<(), String> {
    let lines: Vec<&str> = sass.lines().collect();
    let hgmma: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains("HGMMA"))
        .collect();
    if hgmma.is_empty() {
        return Err("no HGMMA in the kernel".into());
    }
    // Loops: a branch back to a label (`.L_x_3:` ... `@!P0 BRA `(.L_x_3) ;`).
    let label_at = |name: &str| lines.iter().position(|l| l.trim() == format!("{name}:"));
    let loops: Vec<(usize, usize)> = (0..lines.len())
        .filter_map(|j| {
            let l = lines[j];
            let name = l.split("`(").nth(1)?.split(')').next()?;
            let t = label_at(name)?;
            (l.contains("BRA") && t < j).then_some((t, j))
        })
        .collect();
    // Each HGMMA's window: its innermost loop, or (outside loops) the span of those HGMMAs.
    let mut windows: std::collections::BTreeMap<(usize, usize), Vec<usize>> = Default::default();
    for &i in &hgmma {
        let inner = loops
            .iter()
            .filter(|&&(t, j)| t < i && i < j)
            .min_by_key(|&&(t, j)| j - t)
            .copied();
        windows
            .entry(inner.unwrap_or((usize::MAX, 0)))
            .or_default()
            .push(i);
    }
    for (&(t, j), ops) in &windows {
        let (from, to) = match t {
            usize::MAX => (ops[0], ops[ops.len() - 1]),
            _ => (t, j),
        };
        clobbered(&lines, ops, from, to)?;
    }
    Ok(())
}

/// Whether a line in `lines[from..to]` other than an HGMMA writes a register that one of
/// the HGMMAs at `ops` reads as a kept A fragment.
fn clobbered(lines: &[&str], ops: &[usize], from: usize, to: usize) -> Result<(), String> {
    // `HGMMA.64xNx16.F32.BF16 Rd, Ra, gdesc[..], ...`: Ra..Ra+3 are A, unless B is transposed
    // (there A is the block's P or dS, new each block).
    let mut held = std::collections::BTreeSet::new();
    for &i in ops {
        let l = lines[i];
        let words: Vec<&str> = l.split_whitespace().collect();
        let Some(at) = words.iter().position(|o| o.starts_with("HGMMA")) else {
            continue;
        };
        let a = words.get(at + 2).map(|o| o.trim_end_matches(','));
        if let (Some(a), false) = (a.and_then(|a| a.strip_prefix('R')), l.contains("tnspB")) {
            if let Ok(r) = a.parse::<u32>() {
                held.extend(r..r + 4);
            }
        }
    }
    for l in &lines[from + 1..to] {
        if l.contains("HGMMA") {
            continue;
        }
        // `/*addr*/ [@P] OPCODE Rdst, ...`: the first operand is the one written.
        let mut words = l.split_whitespace().skip_while(|o| o.starts_with("/*"));
        let mut op = words.next();
        if op.is_some_and(|o| o.starts_with('@')) {
            op = words.next();
        }
        let dst = words
            .next()
            .map(|o| o.trim_end_matches(',').trim_end_matches(';'));
        let reg = dst
            .and_then(|d| d.strip_prefix('R'))
            .and_then(|r| r.parse::<u32>().ok());
        if let (Some(op), Some(r)) = (op, reg) {
            if held.contains(&r) && !op.starts_with("ST") {
                return Err(format!(
                    "R{r}, a wgmma A fragment kept across the loop, is written: {}",
                    l.trim()
                ));
            }
        }
    }
    Ok(())
}

/// The check fails where a loop-invariant A fragment is overwritten, and passes where only
/// the per-block (transposed-B) operands are.
#[test]
fn fragment_check_finds_a_clobbered_operand() {
    let good = "\
        /*0100*/ HGMMA.64x64x16.F32.BF16 R24, R88, gdesc[UR4], RZ, !UPT ;
        /*0110*/ IMAD R20, R1, 0x40, R4 ;
        /*0120*/ F2FP.BF16.F32.PACK_AB R36, R25, R24 ;
        /*0130*/ HGMMA.64x64x16.F32.BF16 R56, R36, gdesc[UR4].tnspB, R56 ;";
    assert_eq!(fragments_kept(good), Ok(()));
    let bad = good.replace("IMAD R20", "IMAD R89");
    let err = fragments_kept(&bad).unwrap_err();
    assert!(err.contains("R89"), "{err}");
    assert!(fragments_kept("/*0000*/ EXIT ;").is_err());
    // In loops: each loop alone, so another path's loop may reuse the registers.
    let looped = |body: &str| format!(".L_x_1:\n{body}\n        /*0140*/ @!P0 BRA `(.L_x_1) ;");
    let other = "\
        /*0200*/ IMAD R89, R1, 0x40, R4 ;
        /*0210*/ HGMMA.64x64x16.F32.BF16 R24, R120, gdesc[UR4], RZ, !UPT ;";
    let two = format!(
        "{}\n.L_x_2:\n{other}\n        /*0220*/ @!P1 BRA `(.L_x_2) ;",
        looped(good)
    );
    assert_eq!(fragments_kept(&two), Ok(()));
    let err = fragments_kept(&looped(&bad)).unwrap_err();
    assert!(err.contains("R89"), "{err}");
}
