//! The family's one selection function, `choose`, and its per-process memo (the order of
//! precedence is in the module docs of `tune`).

use std::sync::{Arc, Mutex};

use helios_kernels::matmul::default_variant;
use helios_kernels::{MatmulShape, MatmulVariant};
use helios_vk::DeviceType;

use super::cache::{cached, class_key, earlier};
use super::caps::matmul_caps;
use super::exhaustive::{filling_split, tune};
use super::explore::Explorer;
use super::standin::stand_in;
use crate::ops::matmul::{Plan, Problem};
use crate::realize_lock::LockExt;
use crate::{DType, Device, Error, Result};

/// How a kernel was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// `MatmulOverrides::variant`.
    Forced,
    /// `HELIOS_MATMUL_VARIANT`.
    Env,
    /// A winner tuned earlier (this process or the cache file).
    Cached,
    /// Tuned just now (exhaustively, or on real work).
    Tuned,
    /// The class is being tuned on real work; this is its best kernel so far.
    Exploring,
    /// `default_variant` (tuning off or not worth it on this device).
    Default,
}

impl Choice {
    pub const fn name(self) -> &'static str {
        match self {
            Choice::Forced => "forced",
            Choice::Env => "env",
            Choice::Cached => "cached",
            Choice::Tuned => "tuned",
            Choice::Exploring => "exploring",
            Choice::Default => "default",
        }
    }
}

fn invalid(detail: String) -> Error {
    Error::Invalid {
        op: "matmul",
        detail,
    }
}

/// `HELIOS_MATMUL_VARIANT`: a variant name from `helios_kernels::matmul::VARIANTS`, or a
/// cooperative tile outside it in the same grammar (`MatmulVariant::parse`).
fn env_variant() -> Result<Option<MatmulVariant>> {
    let Some(name) = crate::env::matmul_variant() else {
        return Ok(None);
    };
    MatmulVariant::parse(name).map(Some).ok_or_else(|| {
        let names: Vec<&str> = helios_kernels::matmul::VARIANTS
            .iter()
            .map(|(n, _)| *n)
            .collect();
        invalid(format!(
            "HELIOS_MATMUL_VARIANT={name:?} names no variant; use one of {}, or a \
             cooperative tile {}",
            names.join(", "),
            MatmulVariant::COOP_GRAMMAR
        ))
    })
}

/// How a class without a stored winner is tuned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tuning {
    /// Not at all: the first choice stays.
    Off,
    /// On the program's own calls, never waiting (`explore`): the default on GPUs.
    Online,
    /// Every candidate checked and timed before the first call returns (`tune`): for a
    /// long run that wants its best kernels from the first step.
    Exhaustive,
}

static EXHAUSTIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every class without a stored winner tune exhaustively before its first call
/// returns where it would tune on real work, as `HELIOS_MATMUL_TUNE=full` does (`helios
/// bench --tune full`, the kernel suites' default). Where tuning is off it stays off.
pub fn set_exhaustive_tuning(on: bool) {
    EXHAUSTIVE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// `base` with `set_exhaustive_tuning` applied: where tuning is on, it becomes exhaustive
/// (where it is off, as on CPU devices by default, it stays off). Attention follows it too.
pub(crate) fn upgraded(base: Tuning) -> Tuning {
    match base {
        Tuning::Online if EXHAUSTIVE.load(std::sync::atomic::Ordering::Relaxed) => {
            Tuning::Exhaustive
        }
        other => other,
    }
}

/// How this device tunes: `HELIOS_MATMUL_TUNE=0` off, `=1` online also on CPU devices
/// (where timing is slow and means little), `=full` exhaustive; by default online on GPUs
/// and off on CPU devices.
pub fn tuning(device: &Device) -> Tuning {
    #[cfg(test)]
    if let Some(t) = crate::ops::online::test_tuning(device) {
        return t;
    }
    upgraded(match crate::env::matmul_tune() {
        Some(t) => t,
        None if device.context().caps().device_type == DeviceType::Cpu => Tuning::Off,
        None => Tuning::Online,
    })
}

/// What the memo remembers for a problem.
#[derive(Clone)]
enum Memo {
    Fixed(Plan, Choice),
    Exploring(Arc<Explorer>),
}

/// The family's one selection function (see the module docs for the order). A class being
/// explored answers its best kernel so far.
pub(crate) fn choose(p: &Problem) -> Result<(Plan, Choice)> {
    Ok(match resolve(p, false)? {
        // A class not yet explored, tuning online: its first choice, or that one's stand-in
        // while its native kernel is JIT-compiled, as an explored class would run.
        Memo::Fixed(plan, Choice::Default) if tuning(p.a.device()) == Tuning::Online => {
            (stand_in(p, &plan).unwrap_or(plan), Choice::Default)
        }
        Memo::Fixed(plan, how) => (plan, how),
        Memo::Exploring(e) => (e.current(p), Choice::Exploring),
    })
}

/// Records the product of `p` into `out` (dense, of the output's shape) with the chosen
/// kernel: where the class is being explored, through its explorer, which may time this
/// call or try a candidate beside it.
pub(crate) fn run_into(p: &Problem, out: &crate::Tensor) -> Result<()> {
    match resolve(p, true)? {
        Memo::Fixed(plan, _) => p.run_into(&plan, out),
        Memo::Exploring(e) => {
            let action = e.next(p)?;
            e.run(p, action, out)
        }
    }
}

/// `run_into` a fresh output.
pub(crate) fn run(p: &Problem) -> Result<crate::Tensor> {
    let out = p.output()?;
    run_into(p, &out)?;
    Ok(out)
}

/// The memo's answer for `p`, working it out on a miss. Only a call that records the product
/// through its explorer (`explore`) starts one: the others (a kernel's name, a product into
/// a given view) take the class's explorer if it exists, else the first choice, unmemoised.
fn resolve(p: &Problem, explore: bool) -> Result<Memo> {
    let device = p.a.device();
    let forced = match p.forced {
        Some(v) => Some((v, Choice::Forced)),
        None => env_variant()?.map(|v| (v, Choice::Env)),
    };
    if forced.is_some() {
        return choose_uncached(p, forced, explore);
    }
    // A training loop asks the same few hundred questions every step: remember the answers
    // (the class key is a formatted string, the store a locked map of strings).
    let key: MemoKey = (
        device.id(),
        device.binding(),
        p.input,
        p.out,
        p.trans,
        p.shape,
        p.epilogue,
        p.triangle,
    );
    let hit = memo().locked().get(&key).cloned();
    if let Some(hit) = hit {
        let Memo::Exploring(e) = &hit else {
            return Ok(hit);
        };
        let Some((v, splits)) = e.winner() else {
            return Ok(hit);
        };
        let plan = Plan {
            kernel: p.kernel(v, matmul_caps(device).subgroup),
            splits,
        };
        // Until the winner is compiled for this problem, its explorer runs the incumbent.
        if !super::explore::ready(p, &plan) {
            return Ok(hit);
        }
        let settled = Memo::Fixed(plan, Choice::Tuned);
        memo().locked().insert(key, settled.clone());
        return Ok(settled);
    }
    let chosen = choose_uncached(p, None, explore)?;
    let unexplored = matches!(chosen, Memo::Fixed(_, Choice::Default))
        && !explore
        && tuning(device) == Tuning::Online;
    if !unexplored {
        memo().locked().insert(key, chosen.clone());
    }
    Ok(chosen)
}

/// (device, binding, input, output, transposes, shape, epilogue, triangle) of a matmul
/// problem.
type MemoKey = (
    usize,
    helios_spirv::Binding,
    DType,
    DType,
    (bool, bool),
    helios_kernels::MatmulShape,
    helios_kernels::Epilogue,
    helios_kernels::Triangle,
);

fn memo() -> &'static Mutex<rustc_hash::FxHashMap<MemoKey, Memo>> {
    static MEMO: std::sync::OnceLock<Mutex<rustc_hash::FxHashMap<MemoKey, Memo>>> =
        std::sync::OnceLock::new();
    MEMO.get_or_init(Default::default)
}

/// The classes being explored, per (device, class key): every problem of a class shares one.
fn explorers() -> &'static Mutex<Explorers> {
    static EXPLORERS: std::sync::OnceLock<Mutex<Explorers>> = std::sync::OnceLock::new();
    EXPLORERS.get_or_init(Default::default)
}

/// (device, class key) → the class's explorer.
type Explorers = rustc_hash::FxHashMap<(usize, String), Arc<Explorer>>;

/// Drops the remembered choices and explorations of the device with `id` (it is going away;
/// `ctx` is its context, idle), and the timers its explorations still hold.
pub(crate) fn forget_device(id: usize, ctx: &helios_vk::Context) {
    memo().locked().retain(|k, _| k.0 != id);
    let gone: Vec<Arc<Explorer>> = {
        let mut all = explorers().locked();
        let keys: Vec<_> = all.keys().filter(|k| k.0 == id).cloned().collect();
        keys.iter().filter_map(|k| all.remove(k)).collect()
    };
    for e in gone {
        e.discard(ctx);
    }
    crate::ops::attention::tune::forget_device(id, ctx);
    crate::ops::online::forget_device(id);
}

/// Forgets class `key` of `device` in this process only, as a new process would start it
/// (tests: the disk keeps its winner and progress). Its pairs in flight are released.
#[cfg(test)]
pub(super) fn forget_class(device: &Device, key: &str) {
    let Some(e) = explorers().locked().remove(&(device.id(), key.to_owned())) else {
        return;
    };
    memo()
        .locked()
        .retain(|_, m| !matches!(m, Memo::Exploring(x) if Arc::ptr_eq(x, &e)));
    device.synchronize().expect("idle");
    e.discard(device.context());
}

/// The explorer of class `key` on `device`, if it is exploring (tests).
#[cfg(test)]
pub(super) fn explorer(device: &Device, key: &str) -> Option<Arc<Explorer>> {
    explorers()
        .locked()
        .get(&(device.id(), key.to_owned()))
        .cloned()
}

/// How many shape classes of `device` (matmul and attention) are still being tuned on real
/// work: 0 once everything the program has run is settled.
pub fn tuning_in_progress(device: &Device) -> usize {
    matmul_exploring(device).len() + crate::ops::attention::tune::exploring_count(device)
}

/// The classes of `device` still being tuned on real work, a line each: the class key and
/// where its exploration stands.
pub fn matmul_exploring(device: &Device) -> Vec<String> {
    let mut v: Vec<String> = explorers()
        .locked()
        .iter()
        .filter(|(k, e)| k.0 == device.id() && e.winner().is_none())
        .map(|(_, e)| e.summary())
        .collect();
    v.sort();
    v
}

fn choose_uncached(
    p: &Problem,
    forced: Option<(MatmulVariant, Choice)>,
    explore: bool,
) -> Result<Memo> {
    let device = p.a.device();
    let caps = matmul_caps(device);
    if let Some((v, how)) = forced {
        let k = p.kernel(v, caps.subgroup);
        if !k.feasible(&caps) {
            return Err(invalid(format!(
                "variant {} cannot run here ({} inputs, {} on {}): it needs more shared \
                 memory or invocations than the device has, or cooperative-matrix support",
                v.label(),
                p.input,
                if p.trans.0 || p.trans.1 {
                    "transposed operands"
                } else {
                    "row-major operands"
                },
                device.name()
            )));
        }
        if !k.fits(&p.shape) {
            return Err(invalid(format!(
                "variant {} needs M, N and K to be multiples of its tile ({:?}); \
                 this product is {}x{}x{}: pick another variant or pad the operands",
                v.label(),
                v,
                p.shape.m,
                p.shape.n,
                p.shape.k
            )));
        }
        let splits = match (how, p.forced_splits) {
            (Choice::Forced, Some(s)) if s > 1 => {
                if p.split(v, s, caps.subgroup).is_none() {
                    return Err(invalid(format!(
                        "this product cannot be split {s} ways: split-K needs one unbatched \
                         product without bias, activation or residual, and k ({}) cut into \
                         {s} equal multiples of 8 that the variant's tile divides",
                        p.shape.k
                    )));
                }
                s
            }
            _ => 1,
        };
        return Ok(Memo::Fixed(Plan { kernel: k, splits }, how));
    }
    let key = class_key(p);
    if let Some((v, splits)) = cached(device, &key) {
        let k = p.kernel(v, caps.subgroup);
        let split_ok = splits == 1 || p.split(v, splits, caps.subgroup).is_some();
        if k.feasible(&caps) && k.fits(&p.shape) && split_ok {
            return Ok(Memo::Fixed(Plan { kernel: k, splits }, Choice::Cached));
        }
    }
    // After a driver update, the old driver's winner is the first choice, checked again
    // on real work; else the rule.
    let first = earlier(device, &key)
        .map(|(v, splits)| (p.kernel(v, caps.subgroup), splits))
        .filter(|(k, splits)| {
            k.feasible(&caps)
                && k.fits(&p.shape)
                && (*splits == 1 || p.split(k.variant, *splits, caps.subgroup).is_some())
        })
        .map_or_else(
            || first_choice(p),
            |(kernel, splits)| Plan { kernel, splits },
        );
    let s = &p.shape;
    // Nothing to tune where there is no product to time.
    let empty = s.m == 0 || s.n == 0 || s.k == 0 || s.batch == 0;
    match tuning(device) {
        _ if empty => Ok(Memo::Fixed(first, Choice::Default)),
        Tuning::Off => Ok(Memo::Fixed(first, Choice::Default)),
        Tuning::Online => {
            let mut all = explorers().locked();
            let e = match (all.get(&(device.id(), key.clone())), explore) {
                (Some(e), _) => e.clone(),
                (None, true) => all
                    .entry((device.id(), key.clone()))
                    .or_insert_with(|| Explorer::start(p, key, first))
                    .clone(),
                (None, false) => return Ok(Memo::Fixed(first, Choice::Default)),
            };
            Ok(Memo::Exploring(e))
        }
        Tuning::Exhaustive => {
            let report = tune(p)?;
            Ok(match report.winner.and_then(MatmulVariant::by_name) {
                Some(v) => Memo::Fixed(
                    Plan {
                        kernel: p.kernel(v, caps.subgroup),
                        splits: report.winner_splits,
                    },
                    Choice::Tuned,
                ),
                None => Memo::Fixed(first, Choice::Default),
            })
        }
    }
}

/// Rows up to which a product is decoding's (one token per sequence, eight sequences).
const DECODE_ROWS: u32 = 16;

/// The kernel a class runs before anything was timed: a rule read off the tuners' winners
/// on GPT-2's classes (H200, bf16 and f32: bench/results/2026-11-29-session34-note.md).
/// - [`DECODE_ROWS`] rows or fewer (decoding), unsplit, on a GPU whose subgroups add: the
///   few-row tiles where they beat the tiled kernels on GPT-2's decode products (H200,
///   bench/results/2026-11-30-session47-h200.md): `rows1x8` for one row of B stored k × n,
///   and of f32 B stored n × k (the LM head); `rows8x8` for up to 8 rows of f32, and of
///   halves when the output is at most 1024 wide (wider, the cooperative tile wins).
///   Otherwise, f16/bf16 with native kernels: `coop64x64w2x2k64d2`, the winner on real work
///   of most of GPT-2's decode classes (bench/results/2026-11-30-decode-first-choice-h200.txt),
///   `coop32x64w1x2k32d2` with B stored n × k (the LM head: it won both batches).
/// - Otherwise, f16/bf16 with native kernels: the native tile of the fewer rounds of tiles
///   over the SMs (`native_tile`).
/// - f32 on a GPU: `simt128x64d1` (won 22 of 35), `simt32x32d1` for outputs 64 wide or
///   less (won all four such classes) and for decoding's other products (it won all five
///   of GPT-2's, 2-2.7× the first tile: session 47's call A).
/// - Otherwise the documented default (`helios_kernels::matmul::default_variant`).
/// - k at least twice the larger output side, unbatched: split in 4 (won 9 of the 10 such
///   classes), where the product can be split so; a native kernel in the parts that fill
///   the SMs (`filling_split`).
pub(crate) fn first_choice(p: &Problem) -> Plan {
    let caps = matmul_caps(p.a.device());
    let s = &p.shape;
    let fits = |name: &str| {
        let v = MatmulVariant::by_name(name)?;
        let k = p.kernel(v, caps.subgroup);
        (k.feasible(&caps) && k.fits(s)).then_some(k)
    };
    let half = matches!(p.input, DType::F16 | DType::BF16);
    let gpu = caps.cpu_threads.is_none();
    // Decoding's products: a few rows of one matrix.
    let few_rows = s.batch == 1 && s.m <= DECODE_ROWS;
    // The few-row tile where one wins (`rows_tile`) and the device runs it (`fits`: its
    // subgroups add); else the rules below.
    let rows = match gpu && few_rows {
        true => rows_tile(s, p.trans.1, half).and_then(fits),
        false => None,
    };
    let ruled = match () {
        _ if rows.is_some() => rows,
        _ if half && caps.native.is_some() && few_rows && p.trans.1 => fits("coop32x64w1x2k32d2")
            .or_else(|| fits("coop64x64w2x2k64d2"))
            .or_else(|| fits(native_tile(s, None))),
        _ if half && caps.native.is_some() && few_rows => {
            fits("coop64x64w2x2k64d2").or_else(|| fits(native_tile(s, None)))
        }
        _ if half && caps.native.is_some() => {
            let sms = p.a.device().context().caps().sm_count;
            fits(native_tile(s, sms))
        }
        _ if !half && gpu && (s.n <= 64 || few_rows) => fits("simt32x32d1"),
        _ if !half && gpu => fits("simt128x64d1"),
        _ => None,
    };
    let kernel = ruled.unwrap_or_else(|| {
        let d = default_variant(
            p.input.storage(),
            p.out.storage(),
            p.trans,
            s,
            p.epilogue,
            &caps,
        );
        p.kernel(d.variant, caps.subgroup)
    });
    let long_k = gpu && s.batch == 1 && !few_rows && u64::from(s.k) >= 2 * u64::from(s.m.max(s.n));
    // Native kernels split k in as many parts as fill the SMs.
    let parts = filling_split(p, kernel.variant).unwrap_or(4);
    let splits = match long_k && p.split(kernel.variant, parts, caps.subgroup).is_some() {
        true => parts,
        false => 1,
    };
    Plan { kernel, splits }
}

/// The few-row tile a decoding product of shape `s` (B stored n × k: `trans_b`; f16/bf16
/// inputs: `half`) starts on, where one beats the tiled kernels (`first_choice`).
fn rows_tile(s: &MatmulShape, trans_b: bool, half: bool) -> Option<&'static str> {
    match (trans_b, s.m, half) {
        (_, 0, _) => None,
        (false, 1, _) | (true, 1, false) => Some("rows1x8"),
        (false, 2..=8, false) => Some("rows8x8"),
        (false, 2..=8, true) if s.n <= 1024 => Some("rows8x8"),
        _ => None,
    }
}

/// The native tile a class starts on: `nv256x192k16s3w2` where its rounds of tiles over the
/// device's `sms` take less time than `nv128x192k16s4`'s, a tile of the first costing 1.63
/// of the second's (their 4096³ times over their rounds:
/// bench/results/2026-11-29-native-release-h200.md). So the larger tile wins where its tiles
/// fill the SMs, the smaller one where they leave most idle. With fewer tiles than SMs and
/// a long k (the weight gradients), stream-K order
/// (bench/results/2026-11-29-native-epilogue-streamk-h200.md): the larger tile where each of
/// its tiles is shared by at most four SMs (GPT-2's 3072 × 768 and 768 × 3072 settled on it in
/// every session, 0.83-0.93× the smaller one's time: 2026-11-30-session48-h200.md), else the
/// smaller one (768 × 768).
fn native_tile(s: &MatmulShape, sms: Option<u32>) -> &'static str {
    let Some(sms) = sms.filter(|&n| n > 0) else {
        return "nv128x192k16s4";
    };
    let tiles = |bm: u32, bn: u32| {
        u64::from(s.batch) * u64::from(s.m.div_ceil(bm)) * u64::from(s.n.div_ceil(bn))
    };
    // Fewer tiles than SMs and a long k (the weight gradients): stream-K shares the k steps
    // out (2304 × 768 × 8192: 86.5 µs against 129.1 in whole tiles).
    if s.batch == 1 && s.k >= 512 && tiles(128, 192) < u64::from(sms) {
        return match 4 * tiles(256, 192) >= u64::from(sms) {
            true => "nv256x192k16s3w2sk",
            false => "nv128x192k16s4sk",
        };
    }
    let rounds = |bm: u32, bn: u32| tiles(bm, bn).div_ceil(u64::from(sms));
    match 163 * rounds(256, 192) < 100 * rounds(128, 192) {
        true => "nv256x192k16s3w2",
        false => "nv128x192k16s4",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2's products at 8192 rows on 132 SMs: the large tile where its tiles fill the
    /// SMs (as measured); stream-K order for the weight gradients (fewer tiles than SMs, long
    /// k), the large tile where it makes a quarter as many tiles as SMs or more, the small one
    /// for 768 × 768; and the small one where the SM count is unknown.
    #[test]
    fn the_native_tile_follows_the_rounds_of_tiles() {
        let tile = |m, n, sms| native_tile(&MatmulShape::packed(1, m, n, 768, false, true), sms);
        assert_eq!(tile(4096, 4096, Some(132)), "nv256x192k16s3w2");
        assert_eq!(tile(8192, 2304, Some(132)), "nv256x192k16s3w2");
        assert_eq!(tile(8192, 768, Some(132)), "nv256x192k16s3w2");
        assert_eq!(tile(3072, 768, Some(132)), "nv256x192k16s3w2sk");
        assert_eq!(tile(768, 3072, Some(132)), "nv256x192k16s3w2sk");
        assert_eq!(tile(2304, 768, Some(132)), "nv256x192k16s3w2sk");
        assert_eq!(tile(768, 2304, Some(132)), "nv256x192k16s3w2sk");
        assert_eq!(tile(768, 768, Some(132)), "nv128x192k16s4sk");
        let short = MatmulShape::packed(1, 768, 768, 256, false, true);
        assert_eq!(native_tile(&short, Some(132)), "nv128x192k16s4");
        assert_eq!(tile(8192, 2304, None), "nv128x192k16s4");
    }

    /// Decoding's products on the few-row tiles where they won on the H200: one row (B
    /// either way in f32, B stored k × n in halves), up to 8 rows of f32 B stored k × n, and
    /// of halves up to 1024 columns; none past 8 rows.
    #[test]
    fn few_rows_start_where_the_rows_tiles_won() {
        let tile = |m, n, trans_b, half| {
            rows_tile(
                &MatmulShape::packed(1, m, n, 768, false, trans_b),
                trans_b,
                half,
            )
        };
        assert_eq!(tile(1, 2304, false, true), Some("rows1x8"));
        assert_eq!(tile(1, 768, false, false), Some("rows1x8"));
        assert_eq!(tile(1, 50257, true, false), Some("rows1x8"));
        assert_eq!(tile(1, 50257, true, true), None);
        assert_eq!(tile(8, 3072, false, false), Some("rows8x8"));
        assert_eq!(tile(8, 768, false, true), Some("rows8x8"));
        assert_eq!(tile(8, 3072, false, true), None);
        assert_eq!(tile(8, 50257, true, false), None);
        assert_eq!(tile(9, 768, false, false), None);
        assert_eq!(tile(0, 768, false, false), None);
    }
}
