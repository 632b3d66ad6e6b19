//! Checked mode: the runtime twin of the plan checker. While the streams run, every launch and
//! copy is checked against what the executed events actually ordered: each stream thread keeps a
//! vector clock (ticked per launch or copy, stored by a record, joined by a wait when the wait
//! returns), and a shadow of the arena and the host slab remembers, per byte range, the last
//! write and the latest read of each stream. An access that is not ordered after a conflicting
//! one on another stream is trapped: the step fails with a message naming both instructions.
//!
//! It catches plans that were never checked (`Replay::new_unchecked`) and a backend that does not
//! honour its events. Of two conflicting accesses it refuses the second before it touches memory
//! (the shadow is updated under its lock before an access runs), so even an unchecked plan does no
//! unordered access here: that is what `Replay::new_unchecked`'s safety contract can rest on. It
//! costs a lock per access, so it is for tests and debugging.

use std::collections::BTreeMap;
use std::sync::Mutex;

use memo_plan_core::plan::{EventId, Stream};
use memo_runtime::{CheckReport, Space, Span};

/// Streams of a plan: one clock entry and one latest read per stream.
const STREAMS: usize = Stream::ALL.len();

type Clock = [u64; STREAMS];

/// The last write of a byte range and the latest read of each stream since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    end: u64,
    /// (stream, its tick, instruction) of the last write.
    write: Option<(usize, u64, usize)>,
    /// Per stream: (tick, instruction) of its latest read since that write.
    reads: [Option<(u64, usize)>; STREAMS],
}

#[derive(Default)]
struct State {
    clocks: [Clock; STREAMS],
    events: Vec<Option<Clock>>,
    /// Per space: segments keyed by their start, disjoint.
    spaces: [BTreeMap<u64, Segment>; 2],
}

/// What every step so far verified (kept across [`Shadow::reset`]).
#[derive(Default)]
struct Counts {
    report: CheckReport,
}

/// The shadow state of a checked backend.
#[derive(Default)]
pub struct Shadow {
    state: Mutex<State>,
    counts: Mutex<Counts>,
}

fn space_index(space: Space) -> usize {
    match space {
        Space::Device => 0,
        Space::Host => 1,
    }
}

/// Splits the segment containing `at` (if any) so that a segment starts at `at`.
fn split_at(map: &mut BTreeMap<u64, Segment>, at: u64) {
    let Some((&start, &segment)) = map.range(..at).next_back() else { return };
    if segment.end > at {
        map.insert(start, Segment { end: at, ..segment });
        map.insert(at, segment);
    }
}

impl Shadow {
    /// Resets for a step with `events` events: clocks, events and the shadow. Data written before
    /// the step (uploads) is treated as ordered before everything.
    pub fn reset(&self, events: u32) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *state = State { events: vec![None; events as usize], ..State::default() };
    }

    /// A record on `stream`: the event captures the stream's clock.
    pub fn record(&self, stream: Stream, event: EventId) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let clock = state.clocks[stream.index()];
        if let Some(slot) = state.events.get_mut(event.0 as usize) {
            *slot = Some(clock);
        }
    }

    /// What the checks have verified so far, over every step: launches and copies, their byte
    /// ranges, and waits (a violation fails its step, so none of these found one).
    pub fn report(&self) -> CheckReport {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).report
    }

    /// A wait on `stream` that has returned: the stream learns the event's clock.
    pub fn waited(&self, stream: Stream, event: EventId) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Some(clock)) = state.events.get(event.0 as usize).copied() else {
            return Err(format!(
                "the {} stream passed a wait on event {} that was never recorded",
                stream.name(),
                event.0
            ));
        };
        let own = &mut state.clocks[stream.index()];
        for (mine, theirs) in own.iter_mut().zip(clock) {
            *mine = (*mine).max(theirs);
        }
        drop(state);
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).report.waits += 1;
        Ok(())
    }

    /// One launch or copy on `stream` (plan instruction `instruction`): reads then writes, each
    /// checked against the other streams' conflicting accesses.
    pub fn access(&self, stream: Stream, instruction: usize, reads: &[Span], writes: &[Span]) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = stream.index();
        state.clocks[s][s] += 1;
        let clock = state.clocks[s];
        let ordered = |other: usize, tick: u64| other == s || tick <= clock[other];
        let stream_name = |i: usize| Stream::ALL[i].name();
        for (spans, writing) in [(reads, false), (writes, true)] {
            for span in spans.iter().filter(|span| span.len > 0) {
                let map = &mut state.spaces[space_index(span.space)];
                let end = span.offset + span.len;
                split_at(map, span.offset);
                split_at(map, end);
                // Fill the gaps: bytes never touched this step (written before it).
                let mut cursor = span.offset;
                let existing: Vec<(u64, Segment)> = map.range(span.offset..end).map(|(&k, &v)| (k, v)).collect();
                for (start, segment) in &existing {
                    if *start > cursor {
                        map.insert(cursor, Segment { end: *start, write: None, reads: [None; STREAMS] });
                    }
                    cursor = segment.end;
                }
                if cursor < end {
                    map.insert(cursor, Segment { end, write: None, reads: [None; STREAMS] });
                }
                for segment in map.range_mut(span.offset..end).map(|(_, v)| v) {
                    if let Some((other, tick, by)) = segment.write {
                        if !ordered(other, tick) {
                            let what = if writing { "writes" } else { "reads" };
                            return Err(format!(
                                "instruction {instruction} on the {} stream {what} bytes that instruction {by} on the {} \
                                 stream wrote, with no event ordering them",
                                stream_name(s),
                                stream_name(other)
                            ));
                        }
                    }
                    if writing {
                        for (other, read) in segment.reads.iter().enumerate() {
                            if let Some((tick, by)) = read {
                                if !ordered(other, *tick) {
                                    return Err(format!(
                                        "instruction {instruction} on the {} stream overwrites bytes that instruction \
                                         {by} on the {} stream may still be reading (no event orders them)",
                                        stream_name(s),
                                        stream_name(other)
                                    ));
                                }
                            }
                        }
                        segment.write = Some((s, clock[s], instruction));
                        segment.reads = [None; STREAMS];
                    } else {
                        segment.reads[s] = Some((clock[s], instruction));
                    }
                }
            }
        }
        drop(state);
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.report.instructions += 1;
        counts.report.spans += (reads.iter().chain(writes).filter(|span| span.len > 0).count()) as u64;
        Ok(())
    }
}
