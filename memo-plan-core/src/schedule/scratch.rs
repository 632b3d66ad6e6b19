//! Launch scratch in the schedule: each launch whose kernels need scratch memory (the backend's
//! [`ScratchSizer`]) gets a [`TensorRole::Scratch`] transient as its trailing argument, used by
//! that launch only, so bi-level placement places it and the checker checks it like any
//! transient (`spec/schedule.md` section 2, `spec/plan-format.md` "Launch scratch").

use alloc::vec::Vec;

use super::{Block, Schedule, ScheduleError};
use crate::model::{ModelConfig, ModelError, Parallelism};
use crate::plan::scratch::{scratch_row_bytes, ScratchSizer};
use crate::plan::shapes::{ArgShape, ShapeContext};
use crate::plan::{Access, Action, Arg, Buffer, BufferKind, Place, Region, TensorRole};

/// What a scratch size or a buffer count that does not fit is.
const OVERFLOW: ModelError = ModelError::Overflow { what: "launch scratch" };

/// Adds a scratch argument to every launch of `schedule` for which `sizer` asks bytes: the most
/// it asks over the ranks of the group (every rank runs the same program over the same places).
/// The scratch joins the level-1 block of the launch's first argument that has one, else the
/// block of the layer's last launch that had one (a layer's launches whose arguments are all kept
/// tensors), else none (a level-2 transient). A launch that already has a scratch argument keeps
/// it.
pub fn add_scratch(
    schedule: &mut Schedule,
    model: &ModelConfig,
    parallel: &Parallelism,
    sizer: &dyn ScratchSizer,
) -> Result<(), ScheduleError> {
    let ranks = parallel.tensor.max(1);
    let contexts: Vec<ShapeContext> = (0..ranks).map(|rank| ShapeContext::for_layout(model, parallel, rank)).collect();
    let mut last_block: Option<Block> = None;
    let mut shapes = Vec::new();
    for index in 0..schedule.instructions.len() {
        let Action::Launch(launch) = &schedule.instructions[index].action else { continue };
        let signature = launch.op.signature().len();
        if launch.args.len() != signature {
            continue;
        }
        shapes.clear();
        let mut block = None;
        for arg in &launch.args {
            let buffer = schedule.buffers.get(arg.region.buffer.index()).ok_or(OVERFLOW)?;
            let rows = arg.region.end.checked_sub(arg.region.start).ok_or(OVERFLOW)?;
            shapes.push(ArgShape { first_row: arg.region.start, rows, row_bytes: buffer.row_bytes });
            block = block.or(schedule.blocks.get(arg.region.buffer.index()).copied().flatten());
        }
        let block = match (block, launch.layer) {
            (Some(block), _) => Some(block),
            (None, Some(layer)) => last_block.filter(|b| b.layer == layer),
            (None, None) => None,
        };
        if block.is_some() {
            last_block = block;
        }
        let bytes = contexts.iter().map(|ctx| sizer.scratch_bytes(launch.op, &shapes, ctx)).max().unwrap_or(0);
        if bytes == 0 {
            continue;
        }
        let row_bytes = scratch_row_bytes(bytes).ok_or(OVERFLOW)?;
        let layer = launch.layer;
        let id = crate::plan::BufferId(u32::try_from(schedule.buffers.len()).map_err(|_| OVERFLOW)?);
        schedule.buffers.push(Buffer {
            kind: BufferKind::Transient,
            role: TensorRole::Scratch,
            layer,
            slot: 0,
            rows: 1,
            first_row: 0,
            row_bytes,
            place: Place::Device { offset: 0 },
        });
        schedule.blocks.push(block);
        if let Action::Launch(launch) = &mut schedule.instructions[index].action {
            launch.args.push(Arg { region: Region::rows(id, 0, 1), access: Access::Write });
        }
    }
    Ok(())
}
