//! Row machinery shared by the reduce, softmax and norm families: combining values across a
//! group of invocations, and walking one row of a tensor in 16-byte slots.
//!
//! Key decisions a reader must know:
//! - A row is processed by a *group* of `T` consecutive invocations (`T` a power of two that
//!   divides the workgroup size): a whole workgroup for long rows, a subgroup or less for short
//!   ones (several rows per workgroup). [`Groups::reduce`] combines one value per invocation
//!   over its group and hands the result to every member. With subgroups it uses shuffles (or
//!   one subgroup reduction where the subgroup size is fixed) inside blocks of the device's
//!   smallest subgroup size, then one round through shared memory between blocks; the
//!   fallback ([`Reducer::SharedTree`], `HELIOS_NO_SUBGROUP=1`) is a tree in shared memory.
//!   Blocks are runs of consecutive `LocalInvocationIndex` values, which is how every Vulkan
//!   implementation we know forms subgroups.
//! - Slots are aligned to the *buffer*, not to the row: slot `s` holds elements `[4s, 4s+4)`.
//!   A row that starts or ends mid-slot (any row whose length is not a multiple of 4, e.g. a
//!   vocabulary of 50257) still gets 16-byte loads for every slot it covers whole; only its
//!   two edge slots fall back to per-element accesses. Lanes outside the row get a fill value
//!   (the identity of what the kernel computes) and are never stored.
//!
//! Files (each imports only files below it): `walk` walks a row (`Row`, its slots and edges;
//! `for_each_slot`); `groups` combines values, across a vector's lanes, across a group
//! (`Groups`), and as order keys for max, min and argmax; `config` holds the tuning knobs
//! (`RowConfig`, `Reducer`) and the host-side choices (invocations per row, cached or
//! streaming rows, slot counts).

mod config;
mod groups;
mod walk;

pub use config::{
    plan_row, row_slots, stream_unroll, threads_for, whole_rows, Reducer, RowChoice, RowConfig,
    RowLaunch, RowPlan, RowVariant, STREAM_WORKGROUP,
};
pub use groups::{combine, hreduce, hsum, identity, key_value, order_key, Groups};
pub use walk::{for_each_slot, for_each_slot_by, global_index, linear_workgroup, Row};
