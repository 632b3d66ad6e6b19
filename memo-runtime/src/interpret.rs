//! The plan interpreter: allocate a checked plan's memory on a backend and replay its
//! instructions. It decides nothing: each buffer becomes a span at its planned offset, each
//! instruction one backend call.
//!
//! It is the one caller of the backends' unsafe [`Backend::launch`] and [`Backend::copy`]: a
//! [`Replay`] is made from a [`CheckedPlan`], whose instructions order every conflicting access
//! (the checker proved it), and replays them in list order, so the calls keep those methods'
//! contract. Only the `unsafe` [`Replay::new_unchecked`] makes one from a plan that was not
//! checked, and its caller takes over the proof.

use memo_plan_core::check::CheckedPlan;
use memo_plan_core::plan::{Action, BufferId, Place, Plan, Region};

use crate::backend::{Backend, KernelArg, KernelContext, Space, Span};
pub use crate::error::RuntimeError;

/// A checked plan, ready to replay: every buffer's span.
#[derive(Debug)]
pub struct Replay {
    /// Checked (or taken under [`Replay::new_unchecked`]'s contract), and never changed after.
    plan: Plan,
    spans: Vec<Span>,
    /// The tensor-parallel rank whose program ([`Plan::program`]) is replayed.
    rank: u32,
}

impl Replay {
    /// Resolves the buffers' spans of a plan the independent checker accepted.
    pub fn new(plan: CheckedPlan) -> Result<Self, RuntimeError> {
        Self::for_rank(plan, 0)
    }

    /// As [`Replay::new`], replaying rank `rank`'s program of a tensor-parallel plan (the shared
    /// one unless the plan lists another for it, [`Plan::program`]; the checker checked each).
    pub fn for_rank(plan: CheckedPlan, rank: u32) -> Result<Self, RuntimeError> {
        let plan = plan.into_plan();
        let spans = spans(&plan)?;
        Ok(Replay { plan, spans, rank })
    }

    /// Resolves the spans of a plan WITHOUT checking it: for testing that a backend's checked
    /// mode traps at run time what the checker would have refused. A real run always goes
    /// through [`Replay::new`].
    ///
    /// # Safety
    ///
    /// Every backend this replay runs on must keep the streams' accesses from racing although
    /// the plan may not order them: either `plan` orders every conflicting access as
    /// [`CheckedPlan::check`] would prove (rules 3 to 5 of `spec/validity.md`), or the backend
    /// traps an unordered access before making it (the CPU backend's checked mode,
    /// `CpuBackend::checked`, does: of two conflicting accesses the second is refused before it
    /// touches memory, and the step fails).
    #[allow(unsafe_code)]
    pub unsafe fn new_unchecked(plan: Plan) -> Result<Self, RuntimeError> {
        let spans = spans(&plan)?;
        Ok(Replay { plan, spans, rank: 0 })
    }

    /// The instructions this replay runs: its rank's program.
    pub fn program(&self) -> &[memo_plan_core::plan::Instruction] {
        self.plan.program(self.rank)
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
        self.run_range(backend, context, 0..self.program().len())
    }

    /// Replays instructions `range` (clamped to the plan) and waits for the streams. A prefix of
    /// a checked plan is safe on its own: happens-before involves only instructions earlier in
    /// list order, so every read in the prefix is still ordered after its last write
    /// (`spec/validity.md`, rules 3 and 4). The evaluation runs the forward up to the logits so.
    ///
    /// It returns only once the streams are idle, on an error too: what a failed replay left
    /// enqueued could otherwise still run beside the next replay's work, which the plan does
    /// not order against it.
    pub fn run_range(
        &self,
        backend: &mut dyn Backend,
        context: &KernelContext,
        range: std::ops::Range<usize>,
    ) -> Result<(), RuntimeError> {
        match self.enqueue(backend, context, range) {
            Ok(()) => backend.synchronize()?,
            Err(error) => {
                // The enqueue error is the one to report; the streams' own is secondary.
                let _ = backend.synchronize();
                return Err(error);
            }
        }
        Ok(())
    }

    /// Enqueues instructions `range` (clamped) on `backend`'s streams, without waiting.
    #[allow(unsafe_code)]
    fn enqueue(
        &self,
        backend: &mut dyn Backend,
        context: &KernelContext,
        range: std::ops::Range<usize>,
    ) -> Result<(), RuntimeError> {
        let program = self.program();
        let end = range.end.min(program.len());
        let start = range.start.min(end);
        let mut args = Vec::new();
        for (index, instruction) in program.iter().enumerate().take(end).skip(start) {
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
                    // Safety: `self.plan` orders every conflicting access (a checked plan, or
                    // `new_unchecked`'s caller vouched for the backend). Its instructions are
                    // issued in list order onto idle streams (every replay ends with them idle),
                    // and a contiguous range is ordered on its own: a happens-before path between
                    // two of its instructions runs only through the instructions between them.
                    unsafe { backend.launch(index, stream, launch.op, &args, context) }?;
                }
                Action::Copy { src, dst, .. } => {
                    // Safety: as for the launch above.
                    unsafe { backend.copy(index, stream, self.region_span(src), self.region_span(dst)) }?;
                }
                Action::Record(event) => backend.record(index, stream, *event)?,
                Action::Wait(event) => backend.wait(index, stream, *event)?,
            }
        }
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
