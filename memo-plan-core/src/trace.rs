//! Memory request traces, the input of placement, in two text forms (`spec/trace-format.md`):
//!
//! - MEMO's form, one request per line, as its profiler logs them:
//!   `malloc <id> <size>` or `free <id> <size>`, `#` starting a comment. The k-th request (counting
//!   from 0, comments and blank lines skipped) happens at step k: a buffer malloc'd at step `m` and
//!   freed at step `f` is alive over `[m, f)`. A buffer never freed lives to the end of the trace
//!   (`upper` = the number of requests); [`Trace::never_freed`] counts them. Sizes are bytes,
//!   optionally with a unit: `K`/`KB`, `M`/`MB`, `G`/`GB`, `T`/`TB` (powers of 1000) or
//!   `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024).
//! - the CSV form of public dynamic-storage-allocation benchmarks: a header naming the columns
//!   `id,lower,upper,size` (any order; an `offset` column, as `memo solve` writes, is ignored),
//!   then one buffer per line with the half-open lifetime `[lower, upper)`.
//!
//! In both, an id names at most one live buffer at a time; it may be reused once freed.
//! [`parse_trace`] tells the forms apart by their first meaningful line.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;

use crate::lifetime::BufferLifetime;

/// Which text form a trace was written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TraceFormat {
    /// `malloc <id> <size>` / `free <id> <size>` lines.
    MemoText,
    /// `id,lower,upper,size` CSV with a header.
    DsaCsv,
}

/// A parsed trace: every buffer with its lifetime, in the order the trace introduced them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The form it was read from.
    pub format: TraceFormat,
    /// The buffers, in order of their `malloc` (text) or of their lines (CSV).
    pub buffers: Vec<BufferLifetime>,
    /// The number of steps: requests in the text form, the largest `upper` in the CSV form.
    pub steps: u32,
    /// How many buffers of a text trace were never freed (they live to the end of the trace).
    pub never_freed: u32,
}

/// What was wrong with a trace, and on which line (1-based, counting every line of the input).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    /// The line the problem is on (0 when it concerns the input as a whole).
    pub line: usize,
    /// What is wrong.
    pub kind: TraceErrorKind,
}

/// The kinds of trace error. Each names the values involved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceErrorKind {
    /// The input has no request or buffer line at all.
    Empty,
    /// The first meaningful line is neither a `malloc`/`free` request nor a CSV header.
    UnknownFormat,
    /// A line is not valid UTF-8.
    NotUtf8,
    /// A text line does not start with `malloc` or `free`.
    UnknownRequest,
    /// A line has the wrong number of fields.
    FieldCount {
        /// How many fields the form needs.
        expected: usize,
        /// How many the line has.
        found: usize,
    },
    /// A field is not a number (or a size with a known unit) that fits in 64 bits.
    BadNumber {
        /// Which field (`id`, `size`, `lower`, `upper`).
        field: &'static str,
    },
    /// `malloc` of an id that is still allocated.
    DoubleMalloc {
        /// The id.
        id: u64,
        /// The line of the `malloc` that is still live.
        previous_line: usize,
    },
    /// `free` of an id that is not allocated (never, or already freed).
    FreeOfUnknown {
        /// The id.
        id: u64,
    },
    /// `free` names a size other than its `malloc`'s.
    SizeMismatch {
        /// The id.
        id: u64,
        /// The size given at `malloc`.
        malloc_size: u64,
        /// The size given at `free`.
        free_size: u64,
    },
    /// A CSV header lacks a column, repeats one or names an unknown one.
    BadHeader,
    /// A CSV buffer with `upper <= lower`.
    EmptyLifetime {
        /// The id.
        id: u64,
    },
    /// A CSV id whose lifetime overlaps another buffer with the same id.
    DuplicateLiveId {
        /// The id.
        id: u64,
        /// The line of the other buffer.
        previous_line: usize,
    },
    /// More requests or steps than fit in a `u32`.
    TooManySteps,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "line {}: ", self.line)?;
        }
        match &self.kind {
            TraceErrorKind::Empty => f.write_str("the trace has no requests: expected `malloc <id> <size>` / `free <id> <size>` lines or an `id,lower,upper,size` CSV"),
            TraceErrorKind::UnknownFormat => f.write_str("cannot tell the trace format: expected `malloc <id> <size>` / `free <id> <size>` or a CSV header `id,lower,upper,size`"),
            TraceErrorKind::NotUtf8 => f.write_str("not UTF-8 text"),
            TraceErrorKind::UnknownRequest => f.write_str("expected `malloc <id> <size>` or `free <id> <size>`"),
            TraceErrorKind::FieldCount { expected, found } => write!(f, "expected {expected} fields, found {found}"),
            TraceErrorKind::BadNumber { field } => write!(f, "the {field} is not a non-negative integer that fits in 64 bits (sizes may end in K, M, G, T, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"),
            TraceErrorKind::DoubleMalloc { id, previous_line } => write!(f, "malloc of id {id}, which is still allocated since line {previous_line}: free it first or use another id"),
            TraceErrorKind::FreeOfUnknown { id } => write!(f, "free of id {id}, which is not allocated (never malloc'd, or already freed)"),
            TraceErrorKind::SizeMismatch { id, malloc_size, free_size } => write!(f, "free of id {id} with size {free_size}, but it was malloc'd with size {malloc_size}"),
            TraceErrorKind::BadHeader => f.write_str("the CSV header must name the columns id, lower, upper and size once each (an offset column is allowed and ignored)"),
            TraceErrorKind::EmptyLifetime { id } => write!(f, "buffer {id} has upper <= lower; lifetimes are half-open [lower, upper) and must not be empty"),
            TraceErrorKind::DuplicateLiveId { id, previous_line } => write!(f, "id {id} is already used by the buffer on line {previous_line} during an overlapping lifetime"),
            TraceErrorKind::TooManySteps => write!(f, "more than {} steps", u32::MAX),
        }
    }
}

impl core::error::Error for TraceError {}

fn err(line: usize, kind: TraceErrorKind) -> TraceError {
    TraceError { line, kind }
}

/// The lines of the input with their 1-based numbers, comments and surrounding blanks stripped,
/// empty lines skipped.
fn meaningful_lines(input: &[u8]) -> impl Iterator<Item = (usize, Result<&str, TraceError>)> {
    input.split(|&b| b == b'\n').enumerate().filter_map(|(index, raw)| {
        let line = index + 1;
        let text = match core::str::from_utf8(raw) {
            Ok(text) => text,
            Err(_) => return Some((line, Err(err(line, TraceErrorKind::NotUtf8)))),
        };
        let text = text.split('#').next().unwrap_or("").trim();
        (!text.is_empty()).then_some((line, Ok(text)))
    })
}

/// Parses either form, telling them apart by the first meaningful line: a line with a comma is a
/// CSV header, a line starting with `malloc` or `free` is MEMO's form.
pub fn parse_trace(input: &[u8]) -> Result<Trace, TraceError> {
    match meaningful_lines(input).next() {
        None => Err(err(0, TraceErrorKind::Empty)),
        Some((_, Err(e))) => Err(e),
        Some((line, Ok(text))) => {
            let first = text.split_whitespace().next().unwrap_or("");
            if text.contains(',') {
                parse_dsa_csv(input)
            } else if first == "malloc" || first == "free" {
                parse_memo_text(input)
            } else {
                Err(err(line, TraceErrorKind::UnknownFormat))
            }
        }
    }
}

/// Parses MEMO's `malloc <id> <size>` / `free <id> <size>` form.
pub fn parse_memo_text(input: &[u8]) -> Result<Trace, TraceError> {
    // id -> (index into buffers, line of its malloc) for the buffers alive now.
    let mut live: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    let mut buffers: Vec<BufferLifetime> = Vec::new();
    let mut step: u32 = 0;
    for (line, text) in meaningful_lines(input) {
        let text = text?;
        let mut fields = text.split_whitespace();
        let op = fields.next().unwrap_or("");
        let is_malloc = match op {
            "malloc" => true,
            "free" => false,
            _ => return Err(err(line, TraceErrorKind::UnknownRequest)),
        };
        let rest: heapless::Vec<&str, 2> = fields.by_ref().take(2).collect();
        let found = 1 + rest.len() + fields.count();
        if found != 3 {
            return Err(err(line, TraceErrorKind::FieldCount { expected: 3, found }));
        }
        let id = parse_u64(rest[0]).ok_or(err(line, TraceErrorKind::BadNumber { field: "id" }))?;
        let size = parse_size(rest[1]).ok_or(err(line, TraceErrorKind::BadNumber { field: "size" }))?;
        if is_malloc {
            if let Some(&(_, previous_line)) = live.get(&id) {
                return Err(err(line, TraceErrorKind::DoubleMalloc { id, previous_line }));
            }
            live.insert(id, (buffers.len(), line));
            buffers.push(BufferLifetime { id, lower: step, upper: u32::MAX, size });
        } else {
            let Some((index, _)) = live.remove(&id) else {
                return Err(err(line, TraceErrorKind::FreeOfUnknown { id }));
            };
            let buffer = &mut buffers[index];
            if buffer.size != size {
                return Err(err(line, TraceErrorKind::SizeMismatch { id, malloc_size: buffer.size, free_size: size }));
            }
            buffer.upper = step;
        }
        step = step.checked_add(1).ok_or(err(line, TraceErrorKind::TooManySteps))?;
    }
    if buffers.is_empty() {
        return Err(err(0, TraceErrorKind::Empty));
    }
    let never_freed = live.len() as u32;
    for (index, _) in live.into_values() {
        buffers[index].upper = step;
    }
    Ok(Trace { format: TraceFormat::MemoText, buffers, steps: step, never_freed })
}

/// Parses the `id,lower,upper,size` CSV form (header required).
pub fn parse_dsa_csv(input: &[u8]) -> Result<Trace, TraceError> {
    let mut lines = meaningful_lines(input);
    let (header_line, header) = lines.next().ok_or(err(0, TraceErrorKind::Empty))?;
    let header = header?;
    // Column positions of id, lower, upper, size; an offset column is skipped.
    let mut columns: [Option<usize>; 4] = [None; 4];
    let mut width = 0;
    for (position, name) in header.split(',').enumerate() {
        width += 1;
        let slot = match name.trim().to_ascii_lowercase().as_str() {
            "id" | "buffer" => 0,
            "lower" | "start" | "begin" => 1,
            "upper" | "end" => 2,
            "size" => 3,
            "offset" => continue,
            _ => return Err(err(header_line, TraceErrorKind::BadHeader)),
        };
        if columns[slot].replace(position).is_some() {
            return Err(err(header_line, TraceErrorKind::BadHeader));
        }
    }
    let [Some(id_col), Some(lower_col), Some(upper_col), Some(size_col)] = columns else {
        return Err(err(header_line, TraceErrorKind::BadHeader));
    };
    let mut buffers = Vec::new();
    let mut lines_of: Vec<usize> = Vec::new();
    let mut steps = 0u32;
    for (line, text) in lines {
        let text = text?;
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.len() != width {
            return Err(err(line, TraceErrorKind::FieldCount { expected: width, found: fields.len() }));
        }
        let number = |col: usize, field: &'static str| {
            parse_u64(fields[col]).ok_or(err(line, TraceErrorKind::BadNumber { field }))
        };
        let step = |col: usize, field: &'static str| {
            number(col, field).and_then(|v| u32::try_from(v).map_err(|_| err(line, TraceErrorKind::TooManySteps)))
        };
        let id = number(id_col, "id")?;
        let lower = step(lower_col, "lower")?;
        let upper = step(upper_col, "upper")?;
        let size = parse_size(fields[size_col]).ok_or(err(line, TraceErrorKind::BadNumber { field: "size" }))?;
        if upper <= lower {
            return Err(err(line, TraceErrorKind::EmptyLifetime { id }));
        }
        steps = steps.max(upper);
        buffers.push(BufferLifetime { id, lower, upper, size });
        lines_of.push(line);
    }
    if buffers.is_empty() {
        return Err(err(0, TraceErrorKind::Empty));
    }
    // An id names one live buffer at a time: sort by (id, lower) and compare neighbours.
    let mut by_id: Vec<usize> = (0..buffers.len()).collect();
    by_id.sort_unstable_by_key(|&i| (buffers[i].id, buffers[i].lower, i));
    for pair in by_id.windows(2) {
        let (a, b) = (&buffers[pair[0]], &buffers[pair[1]]);
        if a.id == b.id && a.overlaps_in_time(b) {
            let (first, second) =
                if lines_of[pair[0]] < lines_of[pair[1]] { (pair[0], pair[1]) } else { (pair[1], pair[0]) };
            return Err(err(
                lines_of[second],
                TraceErrorKind::DuplicateLiveId { id: a.id, previous_line: lines_of[first] },
            ));
        }
    }
    Ok(Trace { format: TraceFormat::DsaCsv, buffers, steps, never_freed: 0 })
}

fn parse_u64(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A byte count, with an optional unit suffix (see the module docs).
pub fn parse_size(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    parse_u64(digits)?.checked_mul(multiplier)
}

#[cfg(test)]
mod tests;
