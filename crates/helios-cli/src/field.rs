// `helios field bench`: BLS12-381 Fq arithmetic on the GPU against blst on one core and on
// all cores, kernel-only and end to end, per size; `--sweep` first measures every in-shader
// limb layout and workgroup size (how the defaults were chosen).
//
// Definitions, so numbers can be compared across runs: *kernel* is data resident on the
// device, B independent ops of n elements recorded back to back in one submit (time per op);
// *end to end* starts from host arrays and ends with results in host arrays (canonical check,
// copies, submit, wait), either one op per submit (*single*, the latency floor) or B jobs per
// submit (*batched*), or the streaming mode over the same B·n elements (*stream*: chunks whose
// copies overlap the GPU work). B = max(1, batch-elems / n). Host-visible (hv) and
// device-local with staging (dl) paths are both measured. The *chain probe* runs 256 dependent
// Montgomery products per element in registers (intermediate products below 2p, the result
// canonical; `HELIOS_FIELD_CHAIN_CANONICAL=1` makes every one canonical): the multiplier's own
// throughput, which an array op (3 × 48 bytes of memory traffic per product) cannot show.
// Every configuration is checked against blst first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use helios_field::{
    cpu, edge_elements, random_elements, Batch, Field, FieldConfig, FieldOp, Fq, FqVec, Job, Layout,
};
use helios_vk::Context;
use serde::Serialize;

use crate::CliResult;

#[derive(Args)]
pub struct FieldArgs {
    #[command(subcommand)]
    command: FieldCommand,
}

#[derive(Subcommand)]
enum FieldCommand {
    /// Throughput and latency of Fq ops on the GPU vs blst on the CPU.
    Bench(BenchArgs),
}

#[derive(Args)]
struct BenchArgs {
    /// Element counts (K = 1024, M = 1024²).
    #[arg(long, value_delimiter = ',', default_value = "64,1K,4K,16K,64K,1M,16M")]
    sizes: Vec<String>,
    /// Operations to time (add, sub, neg, mul, sqr, to_mont, from_mont).
    #[arg(long, value_delimiter = ',', default_value = "add,mul")]
    ops: Vec<String>,
    /// Elements per batched submit: B = max(1, batch-elems / n) ops per submit.
    #[arg(long, default_value = "1M")]
    batch_elems: String,
    /// Measure every limb layout and workgroup size first (kernel-only, at --sweep-size).
    #[arg(long)]
    sweep: bool,
    #[arg(long, default_value = "4M")]
    sweep_size: String,
    /// Workgroup sizes the sweep tries.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256")]
    sweep_workgroups: Vec<u32>,
    /// Limb layouts the sweep tries, in this order (default: all of them).
    #[arg(long, value_delimiter = ',')]
    sweep_layouts: Vec<String>,
    /// After the sweep, run the tables with the layout and workgroup fastest for mul.
    #[arg(long)]
    use_best: bool,
    /// Stop sampling a measurement after this many seconds (at least 3 samples are taken).
    #[arg(long, default_value_t = 0.4)]
    budget: f64,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

pub fn run(args: &FieldArgs) -> CliResult {
    match &args.command {
        FieldCommand::Bench(b) => bench(b),
    }
}

fn parse_count(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    digits
        .parse::<usize>()
        .map(|d| d * mult)
        .map_err(|_| format!("`{s}` is not a count (use e.g. 64, 4K, 16M)"))
}

// ------------------------------------------------------------------------------- timing

#[derive(Clone, Debug, Serialize)]
struct Stats {
    median_s: f64,
    p95_s: f64,
    /// Coefficient of variation (standard deviation / mean).
    cv: f64,
    samples: usize,
}

/// Warms up for `HELIOS_WARM_MS` (default `helios::WARM_UP_MS`; at least one call:
/// compiles, fills caches, and lets the GPU leave its idle clock, see
/// `helios::Device::warm_up`), then samples `f` until `budget` is spent (3 to 50 samples).
/// `f` returns the time of one sample (so it can exclude set-up).
fn measure(budget: f64, mut f: impl FnMut() -> Result<Duration, String>) -> Result<Stats, String> {
    let warm = helios::env::warm_ms().unwrap_or(helios::WARM_UP_MS);
    let start = Instant::now();
    f()?;
    while start.elapsed() < Duration::from_millis(u64::from(warm)) {
        f()?;
    }
    let start = Instant::now();
    let mut t = Vec::new();
    while t.len() < 3 || (t.len() < 50 && start.elapsed().as_secs_f64() < budget) {
        t.push(f()?.as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    let n = t.len();
    let mean = t.iter().sum::<f64>() / n as f64;
    let var = t.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
    Ok(Stats {
        median_s: t[n / 2],
        p95_s: t[((n as f64 * 0.95).ceil() as usize).clamp(1, n) - 1],
        cv: var.sqrt() / mean,
        samples: n,
    })
}

/// Times `f` repeated enough times that one sample lasts at least ~2 ms; per-call time.
fn timed_calls(mut f: impl FnMut()) -> Duration {
    let mut reps = 1u32;
    loop {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        let e = t.elapsed();
        if e >= Duration::from_millis(2) || reps >= 1 << 16 {
            return e / reps;
        }
        reps *= 4;
    }
}

fn e<E: std::fmt::Display>(x: E) -> String {
    x.to_string()
}

// ------------------------------------------------------------------------------- report

#[derive(Serialize)]
struct SweepRow {
    layout: &'static str,
    workgroup: u32,
    op: &'static str,
    n: usize,
    kernel: Stats,
    g_ops_per_s: f64,
}

#[derive(Serialize)]
struct Row {
    op: &'static str,
    n: usize,
    batch: usize,
    cpu_1core: Stats,
    cpu_all_cores: Stats,
    /// Time per op (of n elements), device-resident, B ops per submit.
    kernel: Stats,
    e2e_single_hv: Stats,
    e2e_single_dl: Stats,
    /// Time per submit of B jobs.
    e2e_batched_hv: Stats,
    e2e_batched_dl: Stats,
    /// Streaming mode over the same B·n elements (time for all of them).
    e2e_stream_hv: Stats,
    e2e_stream_dl: Stats,
    speedup_e2e_batched_vs_1core: f64,
    speedup_e2e_stream_vs_1core: f64,
    speedup_e2e_batched_vs_all_cores: f64,
    speedup_kernel_vs_1core: f64,
    speedup_kernel_vs_all_cores: f64,
    kernel_g_ops_per_s: f64,
}

#[derive(Serialize)]
struct ChainResult {
    n: usize,
    products_per_element: u32,
    kernel: Stats,
    g_mul_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    suite: &'static str,
    unix_time: u64,
    date: String,
    device: String,
    driver: String,
    vulkan: String,
    commit: String,
    env: BTreeMap<String, String>,
    cpu_threads: usize,
    layout: &'static str,
    workgroup: u32,
    default_device_local: bool,
    batch_elems: usize,
    sweep: Vec<SweepRow>,
    mul_chain: ChainResult,
    results: Vec<Row>,
}

// ------------------------------------------------------------------------------- bench

fn bench(args: &BenchArgs) -> CliResult {
    let sizes = args
        .sizes
        .iter()
        .map(|s| parse_count(s))
        .collect::<Result<Vec<_>, _>>()?;
    let ops = args
        .ops
        .iter()
        .map(|s| FieldOp::from_name(s.trim()).ok_or_else(|| format!("unknown op `{s}`")))
        .collect::<Result<Vec<_>, _>>()?;
    let batch_elems = parse_count(&args.batch_elems)?;
    let ctx = Context::from_env()?;
    let caps = ctx.caps();
    let mut base = FieldConfig::from_env()?;
    println!(
        "Fq bench on {} ({} {}), {} CPU threads; layout {}, workgroup {}, default path {}",
        caps.name,
        caps.driver_name,
        caps.driver_info,
        rayon::current_num_threads(),
        base.layout.name(),
        base.workgroup,
        if base.device_local { "dl" } else { "hv" }
    );

    let mut sweep = Vec::new();
    if args.sweep {
        let n = parse_count(&args.sweep_size)?;
        let layouts = if args.sweep_layouts.is_empty() {
            Layout::ALL.to_vec()
        } else {
            args.sweep_layouts
                .iter()
                .map(|s| Layout::from_name(s.trim()).ok_or_else(|| format!("unknown layout `{s}`")))
                .collect::<Result<Vec<_>, _>>()?
        };
        sweep = run_sweep(&ctx, n, &layouts, &args.sweep_workgroups, args.budget)?;
        if args.use_best {
            if let Some((layout, workgroup)) = best_of(&sweep) {
                base.layout = layout;
                base.workgroup = workgroup;
                println!(
                    "using the fastest multiplier: layout {}, workgroup {workgroup}",
                    layout.name()
                );
            }
        }
    }

    let hv = Field::with_config(
        ctx.clone(),
        FieldConfig {
            device_local: false,
            ..base
        },
    )?;
    let dl = Field::with_config(
        ctx.clone(),
        FieldConfig {
            device_local: true,
            ..base
        },
    )?;
    for f in [&hv, &dl] {
        check(f, &FieldOp::ALL)?;
    }
    println!("check: every op equals blst on both memory paths");
    let chain = {
        let n = 1 << 22;
        let (da, db) = (
            upload(&dl, &random_elements(n, 9))?,
            upload(&dl, &random_elements(n, 10))?,
        );
        let dc = dl.alloc(n).map_err(e)?;
        let stats = chain_time(&dl, &da, &db, &dc, args.budget)?;
        let g = (n as u64 * CHAIN as u64) as f64 / stats.median_s / 1e9;
        // The probe's result is checked too (first 1024 elements).
        let got = dl.download(dc.slice(0..1024).map_err(e)?).map_err(e)?;
        let (a0, b0) = (random_elements(1024, 9), random_elements(1024, 10));
        if got != cpu::mul_chain(&a0, &b0, CHAIN) {
            return Err("mul chain probe differs from blst".into());
        }
        println!(
            "Montgomery multiplier (chain probe, {CHAIN} dependent products per element, n = {n}): \
             {g:.2} G mul/s [median {}, p95 {}]",
            fmt_time(stats.median_s),
            fmt_time(stats.p95_s)
        );
        ChainResult {
            n,
            products_per_element: CHAIN,
            kernel: stats,
            g_mul_per_s: g,
        }
    };

    let max_n = sizes.iter().copied().max().unwrap_or(0);
    let pool = random_elements(max_n.max(batch_elems), 1);
    let pool_b = random_elements(max_n.max(batch_elems), 2);
    let mut rows = Vec::new();
    for &op in &ops {
        println!(
            "\n{} (times per op of n elements: median [p95, cv])",
            op.name()
        );
        println!(
            "{:>9} {:>5} | {:>22} {:>22} | {:>22} | {:>22} {:>22} | {:>22} {:>22}",
            "n",
            "B",
            "cpu 1 core",
            "cpu all cores",
            "gpu kernel",
            "e2e single hv",
            "e2e single dl",
            "e2e batched hv",
            "e2e batched dl"
        );
        for &n in &sizes {
            let row = bench_one((&hv, &dl), op, n, batch_elems, &pool, &pool_b, args.budget)?;
            print_row(&row);
            rows.push(row);
        }
        print_speedups(op, &rows);
    }

    let report = Report {
        suite: "field",
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        date: today(),
        device: caps.name.clone(),
        driver: format!(
            "{} {} ({})",
            caps.driver_name, caps.driver_info, caps.driver_version
        ),
        vulkan: caps.api_version.clone(),
        commit: commit(),
        env: std::env::vars()
            .filter(|(k, _)| k.starts_with("HELIOS_"))
            .collect(),
        cpu_threads: rayon::current_num_threads(),
        layout: base.layout.name(),
        workgroup: base.workgroup,
        default_device_local: base.device_local,
        batch_elems,
        sweep,
        mul_chain: chain,
        results: rows,
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
        println!("\nwrote {}", path.display());
    }
    let messages = ctx.validation_messages();
    if !messages.is_empty() {
        return Err(format!("{} Vulkan validation message(s)", messages.len()).into());
    }
    Ok(())
}

/// Every op of `f` on edge and random inputs against blst.
fn check(f: &Field, ops: &[FieldOp]) -> Result<(), String> {
    let edges = edge_elements();
    let (mut a, mut b): (Vec<Fq>, Vec<Fq>) = edges
        .iter()
        .flat_map(|x| edges.iter().map(move |y| (*x, *y)))
        .unzip();
    a.extend(random_elements(4096, 5));
    b.extend(random_elements(4096, 6));
    for &op in ops {
        let bb: &[Fq] = if op.arity() == 2 { &b } else { &[] };
        let got = f.compute(op, &a, bb).map_err(e)?;
        let want = cpu::reference(op, &a, &b);
        if let Some(i) = (0..a.len()).find(|&i| got[i] != want[i]) {
            return Err(format!(
                "{} ({:?}) differs from blst at element {i}: a={:x?} b={:x?} gpu={:x?} cpu={:x?}",
                op.name(),
                f.config(),
                a[i],
                b[i],
                got[i],
                want[i]
            ));
        }
    }
    Ok(())
}

fn run_sweep(
    ctx: &Arc<Context>,
    n: usize,
    layouts: &[Layout],
    workgroups: &[u32],
    budget: f64,
) -> Result<Vec<SweepRow>, String> {
    println!("\nsweep: kernel-only G op/s at n = {n} (device-local), per layout and workgroup");
    // Arrays belong to the context, so every configuration below uses the same ones.
    let any = Field::with_config(
        ctx.clone(),
        FieldConfig {
            device_local: true,
            ..FieldConfig::default()
        },
    )
    .map_err(e)?;
    let (da, db) = (
        upload(&any, &random_elements(n, 3))?,
        upload(&any, &random_elements(n, 4))?,
    );
    let dc = any.alloc(n).map_err(e)?;
    // The environment's settings besides the swept ones (e.g. HELIOS_FIELD_CHAIN_CANONICAL).
    let env = FieldConfig::from_env().map_err(e)?;
    let mut rows = Vec::new();
    for &layout in layouts {
        for (w, &wg) in workgroups.iter().enumerate() {
            let config = FieldConfig {
                layout,
                workgroup: wg,
                device_local: true,
                ..env
            };
            let f = Field::with_config(ctx.clone(), config).map_err(e)?;
            if w == 0 {
                check(&f, &FieldOp::ALL)?;
            }
            let mut line = format!("  {:>8} wg {:>4}:", layout.name(), wg);
            let chain = chain_time(&f, &da, &db, &dc, budget)?;
            let g = (n as u64 * CHAIN as u64) as f64 / chain.median_s / 1e9;
            line += &format!("  mul-chain {g:6.2} G/s");
            rows.push(SweepRow {
                layout: layout.name(),
                workgroup: wg,
                op: "mul_chain",
                n,
                kernel: chain,
                g_ops_per_s: g,
            });
            for op in [FieldOp::Add, FieldOp::Mul, FieldOp::Sqr] {
                let stats = kernel_time(&f, op, (&da, &db, &dc), n, 1, budget)?;
                let g = n as f64 / stats.median_s / 1e9;
                line += &format!("  {} {:6.2} G/s", op.name(), g);
                rows.push(SweepRow {
                    layout: layout.name(),
                    workgroup: wg,
                    op: op.name(),
                    n,
                    kernel: stats,
                    g_ops_per_s: g,
                });
            }
            println!("{line}");
        }
    }
    Ok(rows)
}

/// Montgomery products per element in the chain probe: enough that loading, converting and
/// storing each element once (and, for the reduced-radix layouts, the three products that scale
/// into and out of the chain form) are about 1% of the time (at 32 they were 3-9%).
const CHAIN: u32 = 256;

/// Time of one chain-probe dispatch (CHAIN products per element of `out`).
fn chain_time(f: &Field, a: &FqVec, b: &FqVec, out: &FqVec, budget: f64) -> Result<Stats, String> {
    measure(budget, || {
        let t = Instant::now();
        f.mul_chain(a.all(), b.all(), out.all(), CHAIN).map_err(e)?;
        Ok(t.elapsed())
    })
}

/// The layout and workgroup size with the fastest Montgomery multiplier (chain probe).
fn best_of(sweep: &[SweepRow]) -> Option<(Layout, u32)> {
    sweep
        .iter()
        .filter(|r| r.op == "mul_chain")
        .max_by(|a, b| a.g_ops_per_s.total_cmp(&b.g_ops_per_s))
        .and_then(|r| Layout::from_name(r.layout).map(|l| (l, r.workgroup)))
}

fn upload(f: &Field, x: &[Fq]) -> Result<FqVec, String> {
    f.upload(x).map_err(e)
}

/// Time per op: `batch` independent ops of n elements (slices of the arrays: inputs a and b,
/// b unused by unary ops, and the output), repeated so a submit holds at least 4
/// dispatches; repeats of one slice are separated by barriers.
fn kernel_time(
    f: &Field,
    op: FieldOp,
    (a, b, out): (&FqVec, &FqVec, &FqVec),
    n: usize,
    batch: usize,
    budget: f64,
) -> Result<Stats, String> {
    let reps = 4usize.div_ceil(batch);
    let mut recorded = Batch::new();
    for _ in 0..reps {
        for j in 0..batch {
            let r = j * n..(j + 1) * n;
            let sa = a.slice(r.clone()).map_err(e)?;
            let sb = b.slice(r.clone()).map_err(e)?;
            let so = out.slice(r).map_err(e)?;
            let ins = if op.arity() == 2 {
                vec![sa, sb]
            } else {
                vec![sa]
            };
            recorded.push(op, &ins, so).map_err(e)?;
        }
    }
    let per = (reps * batch) as u32;
    measure(budget, || {
        let t = Instant::now();
        f.run(&recorded).map_err(e)?;
        Ok(t.elapsed() / per)
    })
}

/// One row of the table: `op` on n elements on the CPU (one core, all cores) and on the
/// field's two memory paths (host-visible, device-local), singly and `batch_elems` at a time.
fn bench_one(
    (hv, dl): (&Field, &Field),
    op: FieldOp,
    n: usize,
    batch_elems: usize,
    pool: &[Fq],
    pool_b: &[Fq],
    budget: f64,
) -> Result<Row, String> {
    let batch = (batch_elems / n.max(1)).max(1);
    let total = n * batch;
    let (a_all, b_all) = if total <= pool.len() {
        (pool[..total].to_vec(), pool_b[..total].to_vec())
    } else {
        (random_elements(total, 7), random_elements(total, 8))
    };
    let (a, b) = (&a_all[..n], &b_all[..n]);
    let bb: &[Fq] = if op.arity() == 2 { b } else { &[] };

    let mut out = vec![[0u64; 6]; n];
    let cpu_1core = measure(budget, || {
        Ok(timed_calls(|| cpu::apply(op, a, b, &mut out)))
    })?;
    let cpu_all_cores = measure(budget, || {
        Ok(timed_calls(|| cpu::apply_parallel(op, a, b, &mut out)))
    })?;

    let kernel = {
        let (da, db, dc) = (
            upload(dl, &a_all)?,
            upload(dl, &b_all)?,
            dl.alloc(total).map_err(e)?,
        );
        kernel_time(dl, op, (&da, &db, &dc), n, batch, budget)?
    };

    let mut out1 = vec![[0u64; 6]; n];
    let mut single = |f: &Field| {
        measure(budget, || {
            let t = Instant::now();
            f.compute_batch(&mut [Job {
                op,
                a,
                b: bb,
                out: &mut out1,
            }])
            .map_err(e)?;
            Ok(t.elapsed())
        })
    };
    let mut outs = vec![[0u64; 6]; total];
    let mut batched = |f: &Field| {
        measure(budget, || {
            let mut jobs: Vec<Job<'_>> = outs
                .chunks_mut(n.max(1))
                .enumerate()
                .map(|(j, out)| Job {
                    op,
                    a: &a_all[j * n..(j + 1) * n],
                    b: if op.arity() == 2 {
                        &b_all[j * n..(j + 1) * n]
                    } else {
                        &[]
                    },
                    out,
                })
                .collect();
            let t = Instant::now();
            f.compute_batch(&mut jobs).map_err(e)?;
            Ok(t.elapsed())
        })
    };
    let e2e_single_hv = single(hv)?;
    let e2e_single_dl = single(dl)?;
    let e2e_batched_hv = batched(hv)?;
    let e2e_batched_dl = batched(dl)?;
    let chunk = (total / 8).max(1 << 16).min(total.max(1));
    let mut streamed = |f: &Field| {
        let bb: &[Fq] = if op.arity() == 2 { &b_all } else { &[] };
        measure(budget, || {
            let t = Instant::now();
            f.stream(op, &a_all, bb, &mut outs, chunk).map_err(e)?;
            Ok(t.elapsed())
        })
    };
    let e2e_stream_hv = streamed(hv)?;
    let e2e_stream_dl = streamed(dl)?;
    // Spot-check the batched output of the last run against blst.
    let want = cpu::reference(op, &a_all[total - n..], &b_all[total - n..]);
    if outs[total - n..] != want[..] {
        return Err(format!(
            "{} at n={n}: batched result differs from blst",
            op.name()
        ));
    }

    let best_batched = e2e_batched_hv.median_s.min(e2e_batched_dl.median_s) / batch as f64;
    let best_stream = e2e_stream_hv.median_s.min(e2e_stream_dl.median_s) / batch as f64;
    Ok(Row {
        op: op.name(),
        n,
        batch,
        speedup_e2e_batched_vs_1core: cpu_1core.median_s / best_batched,
        speedup_e2e_stream_vs_1core: cpu_1core.median_s / best_stream,
        speedup_e2e_batched_vs_all_cores: cpu_all_cores.median_s / best_batched,
        speedup_kernel_vs_1core: cpu_1core.median_s / kernel.median_s,
        speedup_kernel_vs_all_cores: cpu_all_cores.median_s / kernel.median_s,
        kernel_g_ops_per_s: n as f64 / kernel.median_s / 1e9,
        cpu_1core,
        cpu_all_cores,
        kernel,
        e2e_single_hv,
        e2e_single_dl,
        e2e_batched_hv,
        e2e_batched_dl,
        e2e_stream_hv,
        e2e_stream_dl,
    })
}

fn fmt_time(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1}us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2}ms", s * 1e3)
    } else {
        format!("{s:.2}s")
    }
}

fn cell(st: &Stats, per: usize) -> String {
    let p = per as f64;
    format!(
        "{} [{}, {:.0}%]",
        fmt_time(st.median_s / p),
        fmt_time(st.p95_s / p),
        st.cv * 100.0
    )
}

fn print_row(r: &Row) {
    println!(
        "{:>9} {:>5} | {:>22} {:>22} | {:>22} | {:>22} {:>22} | {:>22} {:>22} | {:>22} {:>22}",
        r.n,
        r.batch,
        cell(&r.cpu_1core, 1),
        cell(&r.cpu_all_cores, 1),
        cell(&r.kernel, 1),
        cell(&r.e2e_single_hv, 1),
        cell(&r.e2e_single_dl, 1),
        cell(&r.e2e_batched_hv, r.batch),
        cell(&r.e2e_batched_dl, r.batch),
        cell(&r.e2e_stream_hv, r.batch),
        cell(&r.e2e_stream_dl, r.batch),
    );
}

fn print_speedups(op: FieldOp, rows: &[Row]) {
    println!(
        "  speedups of {} (medians; e2e = faster of hv/dl):",
        op.name()
    );
    println!(
        "  {:>9} | {:>13} {:>13} {:>13} | {:>10} {:>10} | {:>10} | {:>12}",
        "n",
        "e2e-batch/1c",
        "e2e-batch/all",
        "e2e-strm/1c",
        "kernel/1c",
        "kernel/all",
        "kernel G/s",
        "1-op latency"
    );
    for r in rows.iter().filter(|r| r.op == op.name()) {
        println!(
            "  {:>9} | {:>12.1}x {:>12.1}x {:>12.1}x | {:>9.1}x {:>9.1}x | {:>10.3} | {:>12}",
            r.n,
            r.speedup_e2e_batched_vs_1core,
            r.speedup_e2e_batched_vs_all_cores,
            r.speedup_e2e_stream_vs_1core,
            r.speedup_kernel_vs_1core,
            r.speedup_kernel_vs_all_cores,
            r.kernel_g_ops_per_s,
            fmt_time(r.e2e_single_hv.median_s.min(r.e2e_single_dl.median_s)),
        );
    }
}

/// The commit: `HELIOS_COMMIT` at run time or build time, else `git rev-parse`.
fn commit() -> String {
    if let Ok(c) = std::env::var("HELIOS_COMMIT") {
        return c;
    }
    if let Some(c) = option_env!("HELIOS_COMMIT") {
        return c.to_string();
    }
    std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Today's UTC date, YYYY-MM-DD (civil-from-days, no date crate needed).
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}
