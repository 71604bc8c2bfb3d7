//! Pass 4 of the scheduler (`record`): a lowered group's dispatch, its output buffers and
//! its end (`settle`), which a reduction taking the group as its prologue shares.
//!
//! The design decision a reader must know: the members' ops are dropped only once the
//! dispatch that computes them is recorded, which releases their inputs (the memory plan: a
//! buffer returns to the pool once its last reader is recorded).

use std::sync::Arc;

use helios_kernels::Geometry;
use helios_vk::{Access, Buffer, MemoryLocation};

use super::group::Group;
use super::lower::Lowered;
use super::reads::to_u32;
use super::recycle::recycle;
use super::stats::{report, Realised};
use super::Node;
use crate::realize_lock::Realizing;
use crate::Result;

/// Pass 4: records the kernel `lowered` holds for `group`, its outputs in fresh buffers
/// (the root's in `root_location`); then the stored members take their buffers, and the
/// members' ops are dropped (`settle`).
pub(super) fn record(
    group: Group<'_>,
    lowered: &mut Lowered,
    root: &Arc<Node>,
    root_location: MemoryLocation,
    lock: &Realizing,
) -> Result<()> {
    let Lowered {
        kernel,
        leaves,
        scalars,
        outputs,
        ..
    } = &*lowered;
    let device = root.device();
    let ctx = device.context();
    let compiled = device.fused_kernel(kernel)?;
    let buffers = output_buffers(&group, outputs, root, root_location)?;
    let mut in_addrs: smallvec::SmallVec<[u64; 8]> = smallvec::SmallVec::new();
    for (node, offset) in leaves.iter() {
        let b = node.buffer.get().expect("leaves are realised");
        in_addrs.push(b.device_address() + (offset * node.dtype.size()) as u64);
    }
    let out_addrs: smallvec::SmallVec<[u64; 4]> =
        buffers.iter().map(|b| b.device_address()).collect();
    let launch = kernel.launch(
        &compiled.module,
        Geometry {
            workgroup: compiled.workgroup[0],
            max_groups_x: device.max_groups_x(),
        },
        &in_addrs,
        &out_addrs,
        scalars,
        &element_offsets(leaves)?,
    )?;
    {
        let mut accesses: smallvec::SmallVec<[Access; 8]> = leaves
            .iter()
            .map(|(n, _)| Access::read(n.buffer.get().expect("leaves are realised")))
            .collect();
        accesses.extend(buffers.iter().map(Access::write));
        ctx.dispatch(&compiled.pipeline, launch.groups, &launch.push, &accesses)?;
    }
    report(Realised::Kernel(&group, lowered));
    settle(group, lowered, buffers, lock);
    Ok(())
}

/// A buffer for each stored member (`outputs`, topological indices), the root's in
/// `root_location`.
pub(super) fn output_buffers(
    group: &Group<'_>,
    outputs: &[usize],
    root: &Arc<Node>,
    root_location: MemoryLocation,
) -> Result<smallvec::SmallVec<[Buffer; 4]>> {
    let ctx = root.device().context();
    outputs
        .iter()
        .map(|&o| {
            let m = group.node(o);
            let bytes = (m.len * m.dtype.size()).max(4) as u64;
            let location = match Arc::ptr_eq(m, root) {
                true => root_location,
                false => MemoryLocation::DeviceLocal,
            };
            Ok(ctx.create_buffer(bytes, location)?)
        })
        .collect()
}

/// After the dispatch that computes the group is recorded: the stored members take their
/// buffers, every member's op is dropped, and members no one else holds become spares.
pub(super) fn settle(
    mut group: Group<'_>,
    lowered: &mut Lowered,
    buffers: smallvec::SmallVec<[Buffer; 4]>,
    lock: &Realizing,
) {
    for (&o, b) in lowered.outputs.iter().zip(buffers) {
        let _ = group.node(o).buffer.set(b);
    }
    let members = group.release();
    lowered.leaves.clear();
    recycle(members, lock);
}

/// Each leaf's first element (what a descriptor-bound kernel adds to its indices).
pub(crate) fn element_offsets(
    leaves: &[(Arc<Node>, usize)],
) -> Result<smallvec::SmallVec<[u32; 8]>> {
    leaves.iter().map(|&(_, o)| to_u32(o)).collect()
}
