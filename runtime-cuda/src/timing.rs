//! Per-instruction timing with CUDA events ([`memo_runtime::Backend::timings`]), when asked for
//! with `CudaBackend::measure`: a timing event is recorded on the instruction's stream before and
//! after each launch and copy; at synchronize every event is read relative to the step's
//! earliest one. Events come from a pool that is reused step after step.

use crate::error::CudaError;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use memo_runtime::BackendError;

/// One instruction's (plan index, start, end) in seconds from the step's start.
pub(crate) type Span = (usize, f64, f64);

/// The events of the step in progress and the spans of the last synchronised one.
#[derive(Default)]
pub(crate) struct Timing {
    pool: Vec<CudaEvent>,
    used: usize,
    /// (instruction, start event, end event) of the step in progress.
    marks: Vec<(usize, usize, usize)>,
    last: Vec<Span>,
}

impl Timing {
    /// Records the next pool event on `stream`; its index.
    pub(crate) fn mark(&mut self, ctx: &Arc<CudaContext>, stream: &CudaStream) -> Result<usize, BackendError> {
        if self.used == self.pool.len() {
            let event = ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| BackendError::from(CudaError::driver("a timing event", e)))?;
            self.pool.push(event);
        }
        let index = self.used;
        self.pool[index]
            .record(stream)
            .map_err(|e| BackendError::from(CudaError::driver("recording a timing event", e)))?;
        self.used += 1;
        Ok(index)
    }

    /// Notes that `instruction` ran between events `start` and `end`.
    pub(crate) fn span(&mut self, instruction: usize, start: usize, end: usize) {
        self.marks.push((instruction, start, end));
    }

    /// After every stream is idle: turns the step's events into spans (the earliest start is 0)
    /// and starts a new step.
    pub(crate) fn finish_step(&mut self) -> Result<(), BackendError> {
        if self.marks.is_empty() {
            self.used = 0;
            return Ok(());
        }
        let reference = &self.pool[self.marks[0].1];
        let seconds = |index: usize| -> Result<f64, BackendError> {
            reference
                .elapsed_ms(&self.pool[index])
                .map(|ms| f64::from(ms) / 1e3)
                .map_err(|e| BackendError::from(CudaError::driver("reading a timing event", e)))
        };
        let mut spans = Vec::with_capacity(self.marks.len());
        for &(instruction, start, end) in &self.marks {
            spans.push((instruction, seconds(start)?, seconds(end)?));
        }
        let origin = spans.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
        for span in &mut spans {
            span.1 -= origin;
            span.2 -= origin;
        }
        self.last = spans;
        self.marks.clear();
        self.used = 0;
        Ok(())
    }

    /// The last synchronised step's spans.
    pub(crate) fn last(&self) -> Vec<Span> {
        self.last.clone()
    }
}
