//! Rule 8 of `spec/validity.md`: a swap copy moves the rows it names. Every copy names
//! ([`TensorRows`]) the layer, tensor and rows it moves; its host slot must hold exactly those
//! (the slot's layer, role and `first_row`), and its device side must be that tensor at those rows
//! (a rounding buffer has no layer of its own, so only its role and rows are compared). The
//! byte-level rules cannot see a swap-in of the wrong slot: the slot was written and the events
//! order it, and the rounding buffer's ids are the same for layers `l` and `l + 2`.
//!
//! The reading side (a launch of layer `l` reading bytes a swap-in of another layer restored) is
//! checked in the byte simulation, where the last writer of each byte is known.

use alloc::vec::Vec;

use super::{BufferRef, PlanViolation, Resolved, Space};
use crate::plan::{Region, TensorRows};

/// The tensor rows `[first_row + start, first_row + end)` that `region` of `buffer` holds, or
/// `None` when they pass 2^64.
fn rows_held(buffer: &BufferRef, region: Region) -> Option<(u64, u64)> {
    let first = buffer.buffer.first_row;
    Some((first.checked_add(region.start)?, first.checked_add(region.end)?))
}

/// Checks one copy whose two sides exist. A copy that does not go between the host slab and the
/// arena is `CopyNotHostDevice` already and is not checked here: it has no slot side.
pub(super) fn check_copy_identity(
    instruction: usize,
    tensor: TensorRows,
    (src, src_region): (Resolved, Region),
    (dst, dst_region): (Resolved, Region),
    out: &mut Vec<PlanViolation>,
) {
    let (swap_in, (slot, slot_region), (device, device_region)) = match (src.space, dst.space) {
        (Space::HostSlab, Space::Arena) => (true, (src.buffer, src_region), (dst.buffer, dst_region)),
        (Space::Arena, Space::HostSlab) => (false, (dst.buffer, dst_region), (src.buffer, src_region)),
        _ => return,
    };
    let holds = slot.buffer.layer.zip(rows_held(&slot, slot_region)).map(|(layer, (start, end))| TensorRows {
        layer,
        role: slot.buffer.role,
        start,
        end,
    });
    if holds != Some(tensor) {
        out.push(PlanViolation::SwapSlotMismatch { instruction, tensor, slot, swap_in, holds });
    }
    let device_layer_ok = device.buffer.layer.is_none_or(|layer| layer == tensor.layer);
    if device.buffer.role != tensor.role
        || !device_layer_ok
        || rows_held(&device, device_region) != Some((tensor.start, tensor.end))
    {
        out.push(PlanViolation::SwapDeviceMismatch {
            instruction,
            tensor,
            device,
            swap_in,
            start: device_region.start,
            end: device_region.end,
        });
    }
}
