//! The plan interpreter: check the plan, allocate its memory on a backend, and replay its
//! instructions. It decides nothing: each buffer becomes a span at its planned offset, each
//! instruction one backend call.

use std::fmt;

use memo_plan_core::check::{check_plan, PlanViolation};
use memo_plan_core::plan::{Action, BufferId, Place, Plan, Region};

use crate::backend::{Backend, BackendError, KernelArg, KernelContext, Space, Span};

/// Why a plan cannot be replayed.
#[derive(Debug)]
pub enum RuntimeError {
    /// The plan violates the rules (`spec/validity.md`).
    Invalid(Vec<PlanViolation>),
    /// A buffer's bytes do not fit in 64 bits.
    BufferTooLarge {
        /// Its index.
        buffer: usize,
    },
    /// The backend failed.
    Backend(BackendError),
    /// The trainer's own error (data, checkpoints, configuration).
    Trainer(String),
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Invalid(violations) => {
                write!(f, "the plan violates {} rule(s); first: ", violations.len())?;
                match violations.first() {
                    Some(v) => v.fmt(f),
                    None => Ok(()),
                }
            }
            RuntimeError::BufferTooLarge { buffer } => write!(f, "buffer #{buffer} is larger than 2^64 bytes"),
            RuntimeError::Backend(error) => error.fmt(f),
            RuntimeError::Trainer(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for RuntimeError {}

impl From<BackendError> for RuntimeError {
    fn from(error: BackendError) -> Self {
        RuntimeError::Backend(error)
    }
}

/// A checked plan, ready to replay: every buffer's span.
#[derive(Debug)]
pub struct Replay {
    plan: Plan,
    spans: Vec<Span>,
}

impl Replay {
    /// Checks `plan` with the independent checker and resolves its buffers' spans.
    pub fn new(plan: Plan) -> Result<Self, RuntimeError> {
        check_plan(&plan).map_err(RuntimeError::Invalid)?;
        let spans = spans(&plan)?;
        Ok(Replay { plan, spans })
    }

    /// Resolves the spans of a plan WITHOUT checking it: only for testing that a backend's
    /// checked mode catches what the checker would (a real run always uses [`Replay::new`]).
    pub fn new_unchecked(plan: Plan) -> Result<Self, RuntimeError> {
        let spans = spans(&plan)?;
        Ok(Replay { plan, spans })
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The whole span of buffer `id`.
    pub fn span(&self, id: BufferId) -> Span {
        self.spans[id.index()]
    }

    /// The span of rows `[start, end)` of a region's buffer.
    fn region_span(&self, region: &Region) -> Span {
        let whole = self.spans[region.buffer.index()];
        let row_bytes = self.plan.buffers[region.buffer.index()].row_bytes;
        // The checker proved start <= end <= rows and rows * row_bytes fits.
        Span {
            space: whole.space,
            offset: whole.offset + region.start * row_bytes,
            len: (region.end - region.start) * row_bytes,
        }
    }

    /// Allocates the plan's arena, host slab and events on `backend`.
    pub fn allocate(&self, backend: &mut dyn Backend) -> Result<(), RuntimeError> {
        let totals = &self.plan.totals;
        backend.allocate(totals.arena_bytes, totals.host_bytes, self.plan.events)?;
        Ok(())
    }

    /// Replays every instruction once on `backend` and waits for the streams.
    pub fn run(&self, backend: &mut dyn Backend, context: &KernelContext) -> Result<(), RuntimeError> {
        self.run_range(backend, context, 0..self.plan.instructions.len())
    }

    /// Replays instructions `range` (clamped to the plan) and waits for the streams. A prefix of
    /// a checked plan is safe on its own: happens-before involves only instructions earlier in
    /// list order, so every read in the prefix is still ordered after its last write
    /// (`spec/validity.md`, rules 3 and 4). The evaluation runs the forward up to the logits so.
    pub fn run_range(
        &self,
        backend: &mut dyn Backend,
        context: &KernelContext,
        range: std::ops::Range<usize>,
    ) -> Result<(), RuntimeError> {
        let end = range.end.min(self.plan.instructions.len());
        let start = range.start.min(end);
        let mut args = Vec::new();
        for (index, instruction) in self.plan.instructions.iter().enumerate().take(end).skip(start) {
            let stream = instruction.stream;
            match &instruction.action {
                Action::Launch(launch) => {
                    args.clear();
                    for arg in &launch.args {
                        let region = arg.region;
                        args.push(KernelArg {
                            span: self.region_span(&region),
                            first_row: region.start,
                            rows: region.end - region.start,
                            row_bytes: self.plan.buffers[region.buffer.index()].row_bytes,
                            access: arg.access,
                        });
                    }
                    backend.launch(index, stream, launch.op, &args, context)?;
                }
                Action::Copy { src, dst, .. } => {
                    backend.copy(index, stream, self.region_span(src), self.region_span(dst))?;
                }
                Action::Record(event) => backend.record(index, stream, *event)?,
                Action::Wait(event) => backend.wait(index, stream, *event)?,
            }
        }
        backend.synchronize()?;
        Ok(())
    }
}

/// Every buffer's span.
fn spans(plan: &Plan) -> Result<Vec<Span>, RuntimeError> {
    plan.buffers
        .iter()
        .enumerate()
        .map(|(index, buffer)| {
            let len = buffer.bytes().ok_or(RuntimeError::BufferTooLarge { buffer: index })?;
            Ok(match buffer.place {
                Place::Device { offset } => Span { space: Space::Device, offset, len },
                Place::Host { offset } => Span { space: Space::Host, offset, len },
            })
        })
        .collect()
}
