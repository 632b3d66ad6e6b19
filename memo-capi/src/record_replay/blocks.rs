//! Bi-level planning of a recorded iteration (`docs/technique.md` section 2) from block markers.
//!
//! A framework marks the requests of a repeated block (one layer's forward, one layer's backward)
//! with `memo_block_begin(key)` / `memo_block_end()`. Record mode writes the marks into the trace
//! as comment lines, which every trace reader skips:
//!
//! ```text
//! # memo-block begin 7
//! malloc 12 4096
//! ...
//! # memo-block end 7
//! ```
//!
//! The plan step then places, with the planner's own two levels (`memo_plan_core::bilevel`):
//! 1. **level 1**: each block instance's *own* buffers (malloc'd and freed inside it), once per
//!    distinct (key, requests) pair: instances with the same key whose own buffers have the same
//!    sizes and lifetimes relative to the block's start share one solve and one layout;
//! 2. **level 2**: the iteration, with each instance as one request of its level-1 peak over the
//!    span of its own buffers, and every other buffer (those that cross a block's edge: skeletal
//!    activations, layer outputs) as itself.
//!
//! The caller still runs the independent checker on the result.

use memo_place::{BufferLifetime, SolveOptions};
use memo_plan_core::bilevel::{place_two_level, Level2Request, PlacementError};

use crate::status::{CapiError, MemoStatus};

/// The word after `#` that starts a block marker line.
pub const MARKER: &str = "memo-block";

/// The comment line that opens block `key`.
pub fn begin_line(key: i64) -> String {
    format!("# {MARKER} begin {key}")
}

/// The comment line that closes block `key`.
pub fn end_line(key: i64) -> String {
    format!("# {MARKER} end {key}")
}

/// One block instance: requests `[begin, end)` of the iteration (request numbers, the trace's
/// steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSpan {
    /// The key the framework gave it.
    pub key: i64,
    /// The step of its first request.
    pub begin: u32,
    /// The step after its last request.
    pub end: u32,
}

/// The block markers of a trace in MEMO's text form, as request spans. Requests are counted as
/// `memo_plan_core::trace` counts them (a line with something before any `#`), so the spans
/// line up with the parsed trace's steps. Errors name the line: an unreadable marker, a `begin`
/// inside an open block (blocks do not nest), an `end` with no open block or another key, a
/// block still open at the end of the trace.
pub fn block_spans(text: &[u8]) -> Result<Vec<BlockSpan>, CapiError> {
    let mut spans = Vec::new();
    let mut open: Option<(i64, u32, usize)> = None;
    let mut requests: u32 = 0;
    let bad = |line: usize, what: String| CapiError::new(MemoStatus::InvalidTrace, format!("line {line}: {what}"));
    for (index, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        let Ok(raw) = std::str::from_utf8(raw) else {
            return Err(bad(line, "not UTF-8 text".into()));
        };
        let (before, comment) = raw.split_once('#').unwrap_or((raw, ""));
        if !before.trim().is_empty() {
            requests = requests.saturating_add(1);
            continue;
        }
        let mut words = comment.split_whitespace();
        if words.next() != Some(MARKER) {
            continue;
        }
        let fields: Vec<&str> = words.collect();
        let key = match fields.as_slice() {
            [_, key] => key
                .parse::<i64>()
                .map_err(|_| bad(line, format!("block marker key `{key}` is not a 64-bit signed integer")))?,
            _ => {
                return Err(bad(
                    line,
                    format!(
                        "a block marker reads `# {MARKER} begin <key>` or `# {MARKER} end <key>`, not `#{comment}`"
                    ),
                ))
            }
        };
        match (fields[0], open) {
            ("begin", None) => open = Some((key, requests, line)),
            ("begin", Some((open_key, _, open_line))) => {
                return Err(bad(
                    line,
                    format!(
                        "block {key} begins inside block {open_key} (opened on line {open_line}); blocks do not nest"
                    ),
                ))
            }
            ("end", Some((open_key, begin, _))) if open_key == key => {
                spans.push(BlockSpan { key, begin, end: requests });
                open = None;
            }
            ("end", Some((open_key, _, open_line))) => {
                return Err(bad(line, format!("end of block {key}, but block {open_key} is open (line {open_line})")))
            }
            ("end", None) => return Err(bad(line, format!("end of block {key}, but no block is open"))),
            (word, _) => {
                return Err(bad(line, format!("block marker `{word}`: expected `begin` or `end`")));
            }
        }
    }
    if let Some((key, _, line)) = open {
        return Err(bad(line, format!("block {key} is never ended")));
    }
    Ok(spans)
}

/// A bi-level placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BiLevel {
    /// One offset per input buffer, in input order.
    pub offsets: Vec<u64>,
    /// The arena: the highest offset + footprint.
    pub peak: u64,
    /// Block instances placed at level 1 (those with buffers of their own).
    pub instances: u64,
    /// Distinct level-1 problems solved.
    pub level1_problems: u64,
}

/// Places `buffers` bi-level over the block instances `spans` (disjoint, in order), with the
/// planner's own two levels ([`memo_plan_core::bilevel::place_two_level`]): each instance's own
/// buffers are a level-1 block keyed by the framework's key, every other buffer a level-2
/// request of its own. Level-1 solves minimise with `options`' alignment and budget; the level-2
/// solve uses `options` whole (capacity included). A level-2 failure under a capacity is not a
/// proof that no placement fits (the caller may try the flat solve).
pub fn place_bilevel(
    buffers: &[BufferLifetime],
    spans: &[BlockSpan],
    options: &SolveOptions,
) -> Result<BiLevel, PlacementError> {
    // Each buffer's instance, if it is one of its own (malloc'd and freed inside it: its free,
    // request `upper`, comes before the block's end).
    let mut own: Vec<Vec<usize>> = vec![Vec::new(); spans.len()];
    let mut in_block = vec![false; buffers.len()];
    for (index, buffer) in buffers.iter().enumerate() {
        let span = spans.partition_point(|s| s.end <= buffer.lower);
        if spans.get(span).is_some_and(|s| s.begin <= buffer.lower && buffer.upper < s.end) {
            own[span].push(index);
            in_block[index] = true;
        }
    }
    // Level 2 in the order the allocator has always used: the buffers of no instance as
    // themselves, then each instance with buffers of its own.
    let mut requests: Vec<Level2Request<i64>> =
        (0..buffers.len()).filter(|&i| !in_block[i]).map(|i| Level2Request::Group(vec![i])).collect();
    requests.extend(
        spans
            .iter()
            .zip(own)
            .filter(|(_, members)| !members.is_empty())
            .map(|(span, members)| Level2Request::Block { key: span.key, members }),
    );
    let level1_options = SolveOptions { capacity: None, ..*options };
    let placed = place_two_level(buffers, &requests, &level1_options, options)?;
    Ok(BiLevel {
        // Every buffer is in one request; `u64::MAX` keeps a broken answer from panicking (the
        // independent checker the caller runs would then refuse it).
        offsets: placed.offsets.iter().map(|o| o.unwrap_or(u64::MAX)).collect(),
        peak: placed.level2.peak_bytes,
        instances: placed.problem_of.iter().flatten().count() as u64,
        level1_problems: placed.level1.len() as u64,
    })
}
