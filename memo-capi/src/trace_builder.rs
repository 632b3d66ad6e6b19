//! A trace built one request at a time, with the rules of MEMO's text form
//! (`spec/trace-format.md`) checked at each request, so that a bad request is refused where it
//! happens and leaves the trace as it was.

use std::collections::BTreeMap;

use memo_plan_core::trace::{Trace, TraceFormat};
use memo_plan_core::BufferLifetime;

use crate::status::{CapiError, MemoStatus};

/// `upper` of a buffer not freed yet.
const OPEN: u32 = u32::MAX;

/// A memory request trace under construction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceBuilder {
    /// Buffers in the order of their `malloc` (or of their CSV lines); `upper == OPEN` while live.
    buffers: Vec<BufferLifetime>,
    /// Live id -> (index into `buffers`, the request number of its `malloc`).
    live: BTreeMap<u64, (usize, u32)>,
    /// Requests so far: the step the next request happens at.
    steps: u32,
}

impl TraceBuilder {
    /// An empty trace.
    pub fn new() -> Self {
        TraceBuilder::default()
    }

    /// Continues a parsed trace: buffers it never freed are live, so a later `free` closes them;
    /// later requests happen after its last step.
    pub fn from_trace(trace: Trace) -> Self {
        let mut builder = TraceBuilder { buffers: trace.buffers, live: BTreeMap::new(), steps: trace.steps };
        if trace.format == TraceFormat::MemoText {
            // In the text form a buffer lives to the end exactly when it was never freed (a freed
            // buffer's upper is the step of its free, which is below the number of steps).
            for (index, buffer) in builder.buffers.iter_mut().enumerate() {
                if buffer.upper == trace.steps {
                    buffer.upper = OPEN;
                    builder.live.insert(buffer.id, (index, buffer.lower));
                }
            }
        }
        builder
    }

    /// The step of the next request, or an error if there is none left.
    fn next_step(&self) -> Result<u32, CapiError> {
        if self.steps >= OPEN - 1 {
            return Err(CapiError::new(
                MemoStatus::InvalidTrace,
                format!("the trace already has {} requests, the most a trace can hold", self.steps),
            ));
        }
        Ok(self.steps)
    }

    /// Appends `malloc id size`.
    pub fn add_malloc(&mut self, id: u64, size: u64) -> Result<(), CapiError> {
        let step = self.next_step()?;
        if let Some(&(_, since)) = self.live.get(&id) {
            return Err(CapiError::new(
                MemoStatus::InvalidTrace,
                format!("request {step}: malloc of id {id}, which is still allocated since request {since}: free it first or use another id"),
            ));
        }
        self.live.insert(id, (self.buffers.len(), step));
        self.buffers.push(BufferLifetime { id, lower: step, upper: OPEN, size });
        self.steps = step + 1;
        Ok(())
    }

    /// Appends `free id size`.
    pub fn add_free(&mut self, id: u64, size: u64) -> Result<(), CapiError> {
        let step = self.next_step()?;
        let Some(&(index, _)) = self.live.get(&id) else {
            return Err(CapiError::new(
                MemoStatus::InvalidTrace,
                format!("request {step}: free of id {id}, which is not allocated (never malloc'd, or already freed)"),
            ));
        };
        let malloc_size = self.buffers[index].size;
        if malloc_size != size {
            return Err(CapiError::new(
                MemoStatus::InvalidTrace,
                format!(
                    "request {step}: free of id {id} with size {size}, but it was malloc'd with size {malloc_size}"
                ),
            ));
        }
        self.live.remove(&id);
        self.buffers[index].upper = step;
        self.steps = step + 1;
        Ok(())
    }

    /// Buffers so far.
    pub fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    /// Requests so far (for a parsed CSV trace: its largest `upper`, plus the requests since).
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// The buffers with their lifetimes; a buffer not freed yet lives to the end of the trace.
    pub fn lifetimes(&self) -> Vec<BufferLifetime> {
        self.buffers
            .iter()
            .map(|b| BufferLifetime { upper: if b.upper == OPEN { self.steps } else { b.upper }, ..*b })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memo_plan_core::parse_trace;

    #[test]
    fn requests_give_the_same_lifetimes_as_the_parser() {
        let text = "malloc 1 10\nmalloc 2 20\nfree 1 10\nmalloc 1 5\nfree 2 20\n";
        let mut builder = TraceBuilder::new();
        builder.add_malloc(1, 10).unwrap();
        builder.add_malloc(2, 20).unwrap();
        builder.add_free(1, 10).unwrap();
        builder.add_malloc(1, 5).unwrap();
        builder.add_free(2, 20).unwrap();
        assert_eq!(builder.lifetimes(), parse_trace(text.as_bytes()).unwrap().buffers);
        assert_eq!(builder.steps(), 5);
    }

    #[test]
    fn bad_requests_are_refused_and_change_nothing() {
        let mut builder = TraceBuilder::new();
        builder.add_malloc(7, 64).unwrap();
        let before = builder.clone();
        let double = builder.add_malloc(7, 64).unwrap_err();
        assert_eq!(double.status, MemoStatus::InvalidTrace);
        assert!(double.message.contains("still allocated since request 0"), "{}", double.message);
        let unknown = builder.add_free(8, 64).unwrap_err();
        assert!(unknown.message.contains("free of id 8"), "{}", unknown.message);
        let size = builder.add_free(7, 65).unwrap_err();
        assert!(size.message.contains("malloc'd with size 64"), "{}", size.message);
        assert_eq!(builder, before);
    }

    #[test]
    fn a_parsed_trace_continues_with_its_never_freed_buffers_live() {
        let parsed = parse_trace(b"malloc 1 10\nmalloc 2 20\nfree 1 10\n").unwrap();
        let mut builder = TraceBuilder::from_trace(parsed);
        builder.add_free(2, 20).unwrap();
        let text = parse_trace(b"malloc 1 10\nmalloc 2 20\nfree 1 10\nfree 2 20\n").unwrap();
        assert_eq!(builder.lifetimes(), text.buffers);
    }

    #[test]
    fn a_parsed_csv_trace_has_nothing_live() {
        let parsed = parse_trace(b"id,lower,upper,size\n1,0,4,8\n").unwrap();
        let mut builder = TraceBuilder::from_trace(parsed);
        assert!(builder.add_free(1, 8).is_err());
        builder.add_malloc(1, 8).unwrap();
        assert_eq!(builder.lifetimes()[1], BufferLifetime { id: 1, lower: 4, upper: 5, size: 8 });
    }
}
