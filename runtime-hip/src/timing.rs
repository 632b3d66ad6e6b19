//! Per-instruction timing with HIP events ([`memo_runtime::Backend::timings`]), when asked for
//! with `HipBackend::measure`: a timed event is recorded on the instruction's stream before and
//! after each launch and copy; at synchronize every event is read relative to the step's
//! earliest start. Events come from a pool reused step after step.

use memo_runtime::BackendError;

use crate::safe::stream::{Event, Stream};
use crate::safe::Device;

/// One instruction's (plan index, start, end) in seconds from the step's start.
pub type Span = (usize, f64, f64);

/// The events of the step in progress and the spans of the last synchronised one.
#[derive(Default)]
pub struct Timing {
    pool: Vec<Event>,
    used: usize,
    /// (instruction, start event, end event) of the step in progress.
    marks: Vec<(usize, usize, usize)>,
    last: Vec<Span>,
}

impl Timing {
    /// Records the next pool event on `stream`; its index.
    pub fn mark(&mut self, device: &Device, stream: &Stream) -> Result<usize, BackendError> {
        if self.used == self.pool.len() {
            self.pool.push(Event::timed(device).map_err(|e| BackendError::Other(format!("hip: a timing event: {e}")))?);
        }
        let index = self.used;
        stream
            .record(&self.pool[index])
            .map_err(|e| BackendError::Other(format!("hip: recording a timing event: {e}")))?;
        self.used += 1;
        Ok(index)
    }

    /// Notes that `instruction` ran between events `start` and `end`.
    pub fn span(&mut self, instruction: usize, start: usize, end: usize) {
        self.marks.push((instruction, start, end));
    }

    /// With every stream idle: turns the step's events into spans (the earliest start is 0) and
    /// starts a new step.
    pub fn finish_step(&mut self) -> Result<(), BackendError> {
        let marks = std::mem::take(&mut self.marks);
        self.used = 0;
        let Some(&(_, reference, _)) = marks.first() else { return Ok(()) };
        let seconds = |index: usize| -> Result<f64, BackendError> {
            self.pool[reference]
                .elapsed_ms(&self.pool[index])
                .map(|ms| f64::from(ms) / 1e3)
                .map_err(|e| BackendError::Other(format!("hip: reading a timing event: {e}")))
        };
        let mut spans = Vec::with_capacity(marks.len());
        for &(instruction, start, end) in &marks {
            spans.push((instruction, seconds(start)?, seconds(end)?));
        }
        let origin = spans.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
        for span in &mut spans {
            span.1 -= origin;
            span.2 -= origin;
        }
        self.last = spans;
        Ok(())
    }

    /// The last synchronised step's spans.
    pub fn last(&self) -> Vec<Span> {
        self.last.clone()
    }
}
