//! The scheduler's statistics (`graph_stats`) and its debug report (`HELIOS_DEBUG=1`).
//!
//! The design decision a reader must know: every realisation reports what it recorded
//! through `report`, once, so the counters and the printed lines cannot disagree.

use std::sync::atomic::{AtomicU64, Ordering};

use super::group::Group;
use super::lower::Lowered;
use super::{recycle, Node};

/// Counters of the scheduler's work since the process started (tests and benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Fused kernels dispatched.
    pub kernels: u64,
    /// Pending nodes computed by them.
    pub nodes: u64,
    /// Outputs they wrote to memory.
    pub outputs: u64,
    /// Groups computed inside a reduction's loads instead (never stored; their nodes count
    /// in `nodes`).
    pub prologues: u64,
    /// Matrix products that computed the element-wise nodes reading them in their epilogue
    /// (those nodes count in `nodes`; no fused kernel ran for them).
    pub epilogues: u64,
    /// Graph nodes (realised or pending) alive now.
    pub live_nodes: u64,
    /// Autograd nodes alive now (recorded ops whose graph has not been released).
    pub live_grad_nodes: u64,
}

static KERNELS: AtomicU64 = AtomicU64::new(0);
static NODES: AtomicU64 = AtomicU64::new(0);
static OUTPUTS: AtomicU64 = AtomicU64::new(0);
static PROLOGUES: AtomicU64 = AtomicU64::new(0);
static EPILOGUES: AtomicU64 = AtomicU64::new(0);
pub(crate) static LIVE_GRAD: AtomicU64 = AtomicU64::new(0);

/// What the scheduler has done so far (process-wide).
pub fn graph_stats() -> GraphStats {
    GraphStats {
        kernels: KERNELS.load(Ordering::Relaxed),
        nodes: NODES.load(Ordering::Relaxed),
        outputs: OUTPUTS.load(Ordering::Relaxed),
        prologues: PROLOGUES.load(Ordering::Relaxed),
        epilogues: EPILOGUES.load(Ordering::Relaxed),
        live_nodes: recycle::live_nodes(),
        live_grad_nodes: LIVE_GRAD.load(Ordering::Relaxed),
    }
}

/// A realisation, as recorded.
pub(super) enum Realised<'a, 'r> {
    /// A fused kernel computing `group`, lowered as `lowered` (pass 4, `record`).
    Kernel(&'a Group<'r>, &'a Lowered),
    /// A reduction computing `group` in its loads, storing `outputs` of its members
    /// (`with_prologue`).
    Prologue {
        group: &'a Group<'r>,
        outputs: usize,
    },
    /// Product kernel `kernel` computing `group` in its epilogue, storing its last member
    /// `end` (`epilogue::fold`).
    Epilogue {
        kernel: &'a str,
        group: &'a Group<'r>,
        end: &'a Node,
    },
    /// Product kernel `kernel` as it was built, its output `out` (`realize_product`).
    Product { kernel: &'a str, out: &'a Node },
}

/// Counts a realisation in `graph_stats` and, with `HELIOS_DEBUG=1`, prints it.
pub(super) fn report(r: Realised<'_, '_>) {
    if crate::env::debug() {
        print(&r);
    }
    match r {
        Realised::Kernel(group, lowered) => {
            KERNELS.fetch_add(1, Ordering::Relaxed);
            NODES.fetch_add(group.len() as u64, Ordering::Relaxed);
            OUTPUTS.fetch_add(lowered.outputs.len() as u64, Ordering::Relaxed);
        }
        Realised::Prologue { group, outputs } => {
            NODES.fetch_add(group.len() as u64, Ordering::Relaxed);
            PROLOGUES.fetch_add(1, Ordering::Relaxed);
            OUTPUTS.fetch_add(outputs as u64, Ordering::Relaxed);
        }
        Realised::Epilogue { group, .. } => {
            EPILOGUES.fetch_add(1, Ordering::Relaxed);
            NODES.fetch_add(group.len() as u64, Ordering::Relaxed);
        }
        Realised::Product { .. } => {}
    }
}

/// One line on stderr for a realisation (a prologue prints none: its reduction is the
/// kernel).
fn print(r: &Realised<'_, '_>) {
    let ops = |group: &Group<'_>| {
        let ops: Vec<&str> = (0..group.len()).map(|j| group.op(j).op.name()).collect();
        ops.join(" ")
    };
    let bytes = |n: &Node| n.len * n.dtype.size();
    match *r {
        Realised::Kernel(group, lowered) => {
            let Lowered {
                kernel,
                leaves,
                outputs,
                ..
            } = lowered;
            let bytes_in: usize = leaves.iter().map(|(n, _)| bytes(n)).sum();
            let bytes_out: usize = outputs.iter().map(|&o| bytes(group.node(o))).sum();
            eprintln!(
                "helios: realise {}: {} nodes [{}], {} inputs, {} outputs, {} elements, {} B read, {} B written",
                kernel.name(),
                group.len(),
                ops(group),
                leaves.len(),
                outputs.len(),
                kernel.len,
                bytes_in,
                bytes_out
            );
        }
        Realised::Prologue { .. } => {}
        Realised::Epilogue { kernel, group, end } => eprintln!(
            "helios: realise {kernel}: a product and {} nodes [{}] in its epilogue, {} B written",
            group.len(),
            ops(group),
            bytes(end)
        ),
        Realised::Product { kernel, out } => eprintln!(
            "helios: realise {kernel}: a product, {} B written",
            bytes(out)
        ),
    }
}
