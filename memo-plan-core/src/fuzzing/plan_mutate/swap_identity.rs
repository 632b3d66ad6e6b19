//! The swap-identity corruptions (rule 8 of `spec/validity.md`): swap-ins that restore the wrong
//! rows with every event still in place. The byte-level rules cannot see them when they
//! exchange two swap-ins' sources (every slot is still written before it is read, and read back
//! once), which is what three of the four kinds do:
//! - [`Mutation::SwapInOtherLayer`]: a swap-in reads another layer's slot of the same tensor and
//!   size (the two swap-ins' sources are exchanged when the other slot has a swap-in);
//! - [`Mutation::SwapInOtherTensor`]: the same with a slot of another tensor of the same layer
//!   and size (q and k, say);
//! - [`Mutation::SwapInShiftedRows`]: a swap-in writes its rows shifted by 1 to 64 rows in its
//!   buffer (or, when they fill it, reads the slot shifted and writes fewer rows), naming what it
//!   named before or, by `detail`, the shifted rows;
//! - [`Mutation::SwapInRelabelled`]: as `SwapInOtherLayer`, and each exchanged swap-in names the
//!   layer of the slot it now reads, so both sides agree with it; only the reading side of rule
//!   8 (a launch of layer `l` reading rows restored for another layer) sees it. Applied only
//!   where a launch of the swap-in's layer reads its rows before anything rewrites them.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::{Expected, Mutation};
use crate::plan::{Action, BufferId, BufferKind, Plan, Region, Stream, TensorRows};

/// A swap-in: its index, source, destination and the rows it names.
#[derive(Clone, Copy)]
struct SwapIn {
    at: usize,
    src: Region,
    dst: Region,
    tensor: TensorRows,
}

fn swap_ins(plan: &Plan) -> Vec<SwapIn> {
    let mut out = Vec::new();
    for (at, instruction) in plan.instructions.iter().enumerate() {
        if instruction.stream != Stream::HostToDevice {
            continue;
        }
        if let Action::Copy { src, dst, tensor } = instruction.action {
            let from_slot = plan.buffer(src.buffer).is_some_and(|b| b.kind == BufferKind::HostSlot);
            if from_slot {
                out.push(SwapIn { at, src, dst, tensor });
            }
        }
    }
    out
}

/// Bytes of `region`, if its buffer exists and the product fits.
fn bytes(plan: &Plan, region: Region) -> Option<u64> {
    let rows = region.end.checked_sub(region.start)?;
    rows.checked_mul(plan.buffer(region.buffer)?.row_bytes)
}

/// Sets the source (and, with `relabel`, the named layer) of the copy at `at`.
fn redirect(plan: &mut Plan, at: usize, src: Region, layer: Option<u32>) {
    if let Action::Copy { src: old, tensor, .. } = &mut plan.instructions[at].action {
        *old = src;
        if let Some(layer) = layer {
            tensor.layer = layer;
        }
    }
}

/// Whether a launch of `layer` reads the rows the swap-in at `at` writes before anything writes
/// them again: the reader that must not see another layer's rows.
fn read_by_its_layer(plan: &Plan, swap_in: &SwapIn, layer: u32) -> Option<usize> {
    let dst = swap_in.dst;
    let overlaps = |r: &Region| r.buffer == dst.buffer && r.start < dst.end && dst.start < r.end;
    for (index, instruction) in plan.instructions.iter().enumerate().skip(swap_in.at + 1) {
        match &instruction.action {
            Action::Launch(launch) => {
                let signature = launch.op.signature();
                let reads = launch.args.iter().enumerate().any(|(position, arg)| {
                    let access = signature.get(position).map_or(arg.access, |&(_, access)| access);
                    access.reads() && overlaps(&arg.region)
                });
                if reads {
                    return (launch.layer == Some(layer)).then_some(index);
                }
                let writes = launch.args.iter().any(|arg| arg.access.writes() && overlaps(&arg.region));
                if writes {
                    return None;
                }
            }
            Action::Copy { src, dst: written, .. } => {
                if overlaps(src) {
                    return None;
                }
                if overlaps(written) {
                    return None;
                }
            }
            Action::Record(_) | Action::Wait(_) => {}
        }
    }
    None
}

/// Applies one of the four kinds; `None` when the plan has no target for it.
pub(super) fn swap_identity(
    plan: &mut Plan,
    mutation: Mutation,
    target: u32,
    detail: u64,
) -> Option<(String, Expected)> {
    let all = swap_ins(plan);
    for step in 0..all.len() {
        let a = all[(target as usize + step) % all.len()];
        let applied = match mutation {
            Mutation::SwapInShiftedRows => shifted(plan, &a, detail),
            _ => exchanged(plan, &all, &a, mutation, detail),
        };
        if applied.is_some() {
            return applied;
        }
    }
    None
}

/// Exchanges `a`'s source with a slot of another layer (same tensor) or another tensor (same
/// layer) of the same bytes; relabels the named layers for [`Mutation::SwapInRelabelled`].
fn exchanged(
    plan: &mut Plan,
    all: &[SwapIn],
    a: &SwapIn,
    mutation: Mutation,
    detail: u64,
) -> Option<(String, Expected)> {
    let slot = *plan.buffer(a.src.buffer)?;
    let size = bytes(plan, a.src)?;
    let other_layer = mutation != Mutation::SwapInOtherTensor;
    // Host slots of the same shape (so the exchange leaves every copy's sizes and every slot's
    // reads as they were), of the other layer or tensor.
    let candidates: Vec<BufferId> = plan
        .buffers
        .iter()
        .enumerate()
        .filter(|(index, b)| {
            let fits = b.kind == BufferKind::HostSlot
                && *index != a.src.buffer.index()
                && b.layer.is_some()
                && b.rows == slot.rows
                && b.row_bytes == slot.row_bytes;
            let other = if other_layer {
                b.role == slot.role && b.layer != slot.layer
            } else {
                b.role != slot.role && b.layer == slot.layer
            };
            fits && other && size > 0
        })
        .map(|(index, _)| BufferId(index as u32))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let chosen = candidates[(detail % candidates.len() as u64) as usize];
    let new_src = Region::rows(chosen, 0, a.src.end - a.src.start);
    let chosen_layer = plan.buffer(chosen)?.layer?;
    let relabel = mutation == Mutation::SwapInRelabelled;
    // For a relabelled exchange, the swap-in's own layer must read what it restores.
    let reader = if relabel { Some(read_by_its_layer(plan, a, a.tensor.layer)?) } else { None };
    // The swap-in that read the chosen slot reads `a`'s instead, so every slot is still read.
    let partner = all.iter().find(|b| b.src.buffer == chosen && b.at != a.at).copied();
    redirect(plan, a.at, new_src, relabel.then_some(chosen_layer));
    if let Some(b) = partner {
        let back = Region::rows(a.src.buffer, a.src.start, a.src.start + (b.src.end - b.src.start));
        redirect(plan, b.at, back, relabel.then_some(a.tensor.layer));
    }
    let what = format!(
        "swap-in {} ({}) reads host slot #{} (layer {chosen_layer} {}){}{}",
        a.at,
        a.tensor,
        chosen.0,
        plan.buffer(chosen)?.role.name(),
        partner.map_or(String::new(), |b| format!(", and swap-in {} reads #{}", b.at, a.src.buffer.0)),
        if relabel { ", each naming its new slot's layer" } else { "" }
    );
    let expected = match reader {
        Some(reader) => Expected::Variant("swapped_in_for_other_layer", Some(reader)),
        None => Expected::SwapIdentity(a.at),
    };
    Some((what, expected))
}

/// Shifts the rows `a` restores by `k` in 1..=64 (fewer where the buffer has less room).
fn shifted(plan: &mut Plan, a: &SwapIn, detail: u64) -> Option<(String, Expected)> {
    let device_rows = plan.buffer(a.dst.buffer)?.rows;
    let shift = |room: u64| 1 + detail % room.min(64);
    let room_after = device_rows.checked_sub(a.dst.end)?;
    let len = a.dst.end.checked_sub(a.dst.start)?;
    let (src, dst) = if room_after > 0 {
        let k = shift(room_after);
        (a.src, Region::rows(a.dst.buffer, a.dst.start + k, a.dst.end + k))
    } else if a.dst.start > 0 {
        let k = shift(a.dst.start);
        (a.src, Region::rows(a.dst.buffer, a.dst.start - k, a.dst.end - k))
    } else if len > 1 {
        // The rows fill the buffer: the slot's rows from k on land k rows early.
        let k = shift(len - 1);
        (Region::rows(a.src.buffer, a.src.start + k, a.src.end), Region::rows(a.dst.buffer, a.dst.start, a.dst.end - k))
    } else {
        return None;
    };
    let rename = detail & (1 << 32) != 0;
    if let Action::Copy { src: s, dst: d, tensor } = &mut plan.instructions[a.at].action {
        *s = src;
        *d = dst;
        if rename {
            tensor.start = dst.start;
            tensor.end = dst.end;
        }
    }
    let what = format!(
        "swap-in {} ({}) copies slot rows [{}, {}) to rows [{}, {}){}",
        a.at,
        a.tensor,
        src.start,
        src.end,
        dst.start,
        dst.end,
        if rename { ", naming the rows it writes" } else { "" }
    );
    Some((what, Expected::SwapIdentity(a.at)))
}
