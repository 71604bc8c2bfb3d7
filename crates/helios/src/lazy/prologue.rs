//! The reduction-prologue pass: a reduction of a pending result computes the result's
//! fusion group where it would load its elements, instead of reading back what the group's
//! own kernel stored. Passes 1 to 3 run as for any group; the reduction records instead of
//! pass 4, and the group ends as pass 4 ends it (`settle`).
//!
//! The design decision a reader must know: fusion never recomputes here either. What
//! realising the group would store, the reduction's first step stores.

use std::sync::Arc;

use helios_vk::{Buffer, MemoryLocation};

use super::lower::{choose_outputs, lower, push_fits, Lowered};
use super::record::{output_buffers, settle};
use super::stats::{report, Realised};
use super::{collect, Node};
use crate::Result;

/// The pending group ending at `root` lowered as a reduction's prologue: the reduction
/// computes the group's elements where it would load the root's, and `reduce` records it,
/// given the lowering (whose kernel and leaves it may take) and the buffers the reduction
/// must also store the group's outputs into. Prerequisites are realised first. `None`
/// (nothing recorded): fusion is off, the root is realised, or the group has too many
/// buffers for the reduction's push constants.
///
/// - Where no one but the caller's tensor holds the root (`root` is that tensor's
///   reference) and no one outside the group holds another member, nothing is stored (the
///   buffers are none). The members stay pending, held by the caller's tensor, but nothing
///   will ever read them.
/// - Otherwise the reduction stores what realising the group would store: every member held
///   outside it, and the root (fusion never recomputes, so a value someone may still read
///   is stored). Those members are then realised, as if by their own kernel, which the
///   reduction saves: a second pass over the group's result, and a dispatch. A method
///   chain's temporaries hold their members; so does a gradient that a linear layer's
///   backward both reduces (the bias) and multiplies.
pub(crate) fn with_prologue<R>(
    root: &Arc<Node>,
    reduce: impl FnOnce(&mut Lowered, &[Buffer]) -> Result<R>,
) -> Result<Option<R>> {
    if !crate::env::fusion() {
        return Ok(None);
    }
    let one = crate::realize_lock::lock();
    let Some(group) = collect(root, &one)? else {
        return Ok(None);
    };
    let last = group.len() - 1;
    debug_assert!(Arc::ptr_eq(group.node(last), root), "the root comes last");
    let mut lowered = Lowered::default();
    choose_outputs(&group, &mut lowered);
    lower(&group, root, &mut lowered)?;
    // Besides its uses inside the group, the root is held by the group and the caller's
    // tensor; every other member by no one.
    let held_outside = |j: usize| group.held_outside(j) > if j == last { 2 } else { 0 };
    let stored = (0..group.len()).any(held_outside);
    // The reduction's push constants hold the group's addresses (inputs, and the outputs it
    // stores), its own (at most three) and its seven parameters: past the device's budget,
    // the group is realised apart, split as `realize_with` splits any group, and the
    // reduction reads its result.
    let fits = push_fits(
        root.device(),
        lowered.kernel.inputs.len() + 3,
        if stored { lowered.outputs.len() } else { 0 },
        lowered.scalars.len() + 7,
    );
    if !fits {
        return Ok(None);
    }
    if !stored {
        debug_assert_eq!(lowered.outputs[..], [last], "the root alone is an output");
        let out = reduce(&mut lowered, &[])?;
        report(Realised::Prologue {
            group: &group,
            outputs: 0,
        });
        return Ok(Some(out));
    }
    let buffers = output_buffers(&group, &lowered.outputs, root, MemoryLocation::DeviceLocal)?;
    let out = reduce(&mut lowered, &buffers)?;
    report(Realised::Prologue {
        group: &group,
        outputs: lowered.outputs.len(),
    });
    settle(group, &mut lowered, buffers, &one);
    Ok(Some(out))
}
