//! Harness for the trace parsers: [`parse_trace`], [`parse_memo_text`] and [`parse_dsa_csv`].
//!
//! What [`check`] asserts:
//! - on any bytes, every parser returns `Ok` or `Err`, never panics;
//! - an `Ok` trace is well formed: at least one buffer, every buffer `lower < upper <= steps`, no
//!   id names two buffers alive at the same step; a text trace has exactly one request per step
//!   (a `malloc` at some buffer's `lower` or a `free` at its `upper`) and `never_freed` counts the
//!   buffers alive at the end; a CSV trace has `steps` = the largest `upper`;
//! - round trips: any `Ok` trace written back as `id,lower,upper,size` CSV parses to the same
//!   buffers (for a CSV trace, the same `Trace`); a text trace written back as `malloc`/`free`
//!   lines parses to the same `Trace`;
//! - `parse_trace` answers exactly as the parser of the form it detects; when it cannot tell the
//!   form, both parsers fail;
//! - an error names a line of the input (line 0 only for an input with no request at all) and
//!   displays as a non-empty message;
//! - a generated valid trace (either form, with comments, blank lines, units, tabs, CRLF and
//!   reused ids) parses to exactly the lifetimes it was built with.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt::{self, Write};

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::lifetime::BufferLifetime;
use crate::trace::{parse_dsa_csv, parse_memo_text, parse_trace, Trace, TraceError, TraceErrorKind, TraceFormat};

/// The shape of generated traces.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Requests of a generated text trace, at most.
    pub max_requests: u32,
    /// Rows of a generated CSV trace, at most.
    pub max_rows: usize,
    /// Ids are mostly drawn from `0..=id_pool`, so that they are reused.
    pub id_pool: u64,
}

/// The limits of the trace harness.
pub const OPTIONS: Options = Options { max_requests: 200, max_rows: 100, id_pool: 8 };

/// One fuzz case. The first byte of the input chooses the variant: an ASCII byte (below 0x80)
/// makes the whole input, that byte included, a [`TraceCase::Bytes`], so a trace file is a seed
/// as it is; a byte from 0x80 up builds a [`TraceCase::Text`] (even) or [`TraceCase::Csv`] (odd)
/// from the bytes after it.
#[derive(Clone)]
pub enum TraceCase {
    /// Any bytes, given to every parser.
    Bytes(Vec<u8>),
    /// A valid `malloc`/`free` trace and what it must parse to.
    Text(TextTrace),
    /// A valid CSV trace and what it must parse to.
    Csv(CsvTrace),
}

impl TraceCase {
    /// The variant the first byte asks for; `None` for raw bytes (an ASCII or no first byte).
    fn structured(u: &mut Unstructured<'_>) -> Result<Option<bool>> {
        match u.peek_bytes(1) {
            Some(&[tag]) if tag >= 0x80 => {
                u.bytes(1)?;
                Ok(Some(tag % 2 == 0))
            }
            _ => Ok(None),
        }
    }
}

/// Raw bytes print as a byte string (`b"malloc 1 2\n"`), which reads far better than a list of
/// numbers in a crash report.
impl fmt::Debug for TraceCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceCase::Bytes(bytes) => write!(f, "Bytes(b\"{}\")", bytes.escape_ascii()),
            TraceCase::Text(text) => f.debug_tuple("Text").field(text).finish(),
            TraceCase::Csv(csv) => f.debug_tuple("Csv").field(csv).finish(),
        }
    }
}

impl<'a> Arbitrary<'a> for TraceCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(match TraceCase::structured(u)? {
            None => TraceCase::Bytes(u.arbitrary()?),
            Some(true) => TraceCase::Text(u.arbitrary()?),
            Some(false) => TraceCase::Csv(u.arbitrary()?),
        })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> Result<Self> {
        Ok(match TraceCase::structured(&mut u)? {
            None => TraceCase::Bytes(u.take_rest().to_vec()),
            Some(true) => TraceCase::Text(u.arbitrary()?),
            Some(false) => TraceCase::Csv(u.arbitrary()?),
        })
    }
}

/// A generated input and the trace it must parse to.
#[derive(Clone, Debug)]
pub struct GeneratedTrace {
    /// The text.
    pub input: String,
    /// What [`parse_trace`] must return for it.
    pub expected: Trace,
}

/// A valid `malloc`/`free` trace, built request by request.
#[derive(Clone, Debug)]
pub struct TextTrace(pub GeneratedTrace);

/// A valid `id,lower,upper,size` CSV trace, built row by row.
#[derive(Clone, Debug)]
pub struct CsvTrace(pub GeneratedTrace);

/// Size units and their multipliers, as the trace format accepts them.
const UNITS: [(&str, u64); 14] = [
    ("", 1),
    ("B", 1),
    ("K", 1_000),
    ("KB", 1_000),
    ("M", 1_000_000),
    ("MB", 1_000_000),
    ("G", 1_000_000_000),
    ("GB", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("TB", 1_000_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

/// Comment lines (each must be ignored, including the request-like and comma-holding ones).
const COMMENTS: [&str; 5] = ["#", "# forward", "#malloc 1 2", "# id,lower,upper,size", "## free 3 4, 5"];

/// A size as text, with a unit when the bytes fit in a `u64`, and its value in bytes.
fn size_text(u: &mut Unstructured<'_>) -> Result<(String, u64)> {
    let (unit, multiplier) = *u.choose(&UNITS)?;
    let mantissa: u64 = match u.int_in_range(0..=2u8)? {
        0 => u.int_in_range(0..=9)?,
        1 => u.int_in_range(0..=1_000_000)?,
        _ => u.arbitrary()?,
    };
    let zeros = if u.ratio(1, 8)? { "00" } else { "" };
    Ok(match mantissa.checked_mul(multiplier) {
        Some(bytes) => (format!("{zeros}{mantissa}{unit}"), bytes),
        None => (format!("{zeros}{mantissa}"), mantissa),
    })
}

/// An id: mostly from the small pool (so ids repeat), sometimes any `u64`; replaced by a fresh
/// one while `taken` says it is in use.
fn pick_id(u: &mut Unstructured<'_>, fresh: &mut u64, taken: impl Fn(u64) -> bool) -> Result<u64> {
    let mut id = if u.ratio(1, 8)? { u.arbitrary()? } else { u.int_in_range(0..=OPTIONS.id_pool)? };
    while taken(id) {
        id = *fresh;
        *fresh += 1;
    }
    Ok(id)
}

/// How the lines of a generated trace are laid out.
struct Layout {
    newline: &'static str,
    separator: &'static str,
    indent: &'static str,
    trailing_comment: bool,
    noise: bool,
    final_newline: bool,
}

impl Layout {
    fn arbitrary(u: &mut Unstructured<'_>) -> Result<Layout> {
        Ok(Layout {
            newline: u.choose(&["\n", "\r\n"])?,
            separator: u.choose(&[" ", "  ", "\t", " \t "])?,
            indent: u.choose(&["", "  ", "\t"])?,
            trailing_comment: u.arbitrary()?,
            noise: u.arbitrary()?,
            final_newline: u.arbitrary()?,
        })
    }

    /// Appends a comment or blank line now and then, when the layout has noise.
    fn noise(&self, u: &mut Unstructured<'_>, out: &mut String) -> Result<()> {
        if self.noise && u.ratio(1, 6)? {
            let line = if u.arbitrary()? { "" } else { *u.choose(&COMMENTS)? };
            out.push_str(line);
            out.push_str(self.newline);
        }
        Ok(())
    }

    /// Appends one meaningful line.
    fn line(&self, u: &mut Unstructured<'_>, out: &mut String, content: &str) -> Result<()> {
        out.push_str(self.indent);
        out.push_str(content);
        if self.trailing_comment && u.ratio(1, 4)? {
            out.push_str(" # note, free 1 2");
        }
        out.push_str(self.newline);
        Ok(())
    }

    fn finish(&self, out: &mut String) {
        if !self.final_newline && out.ends_with(self.newline) {
            out.truncate(out.len() - self.newline.len());
        }
    }
}

impl<'a> Arbitrary<'a> for TextTrace {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let layout = Layout::arbitrary(u)?;
        let requests = u.int_in_range(1..=OPTIONS.max_requests)?;
        let mut input = String::new();
        let mut buffers: Vec<BufferLifetime> = Vec::new();
        // The live buffers: index into `buffers` and how their `free` spells the size.
        let mut live: Vec<(usize, String)> = Vec::new();
        let mut fresh = OPTIONS.id_pool + 1;
        let sep = layout.separator;
        for step in 0..requests {
            layout.noise(u, &mut input)?;
            if live.is_empty() || u.arbitrary()? {
                let id = pick_id(u, &mut fresh, |id| live.iter().any(|&(i, _)| buffers[i].id == id))?;
                let (text, size) = size_text(u)?;
                // `free` may spell the same size differently: only the value must match.
                let free_text = if u.ratio(1, 4)? { format!("{size}") } else { text.clone() };
                layout.line(u, &mut input, &format!("malloc{sep}{id}{sep}{text}"))?;
                buffers.push(BufferLifetime { id, lower: step, upper: u32::MAX, size });
                live.push((buffers.len() - 1, free_text));
            } else {
                let (index, free_text) = live.swap_remove(u.choose_index(live.len())?);
                layout.line(u, &mut input, &format!("free{sep}{}{sep}{free_text}", buffers[index].id))?;
                buffers[index].upper = step;
            }
        }
        layout.noise(u, &mut input)?;
        layout.finish(&mut input);
        for &(index, _) in &live {
            buffers[index].upper = requests;
        }
        let expected =
            Trace { format: TraceFormat::MemoText, buffers, steps: requests, never_freed: live.len() as u32 };
        Ok(TextTrace(GeneratedTrace { input, expected }))
    }
}

/// The columns of the CSV form, with the names the header may give them.
const COLUMN_NAMES: [&[&str]; 5] = [
    &["id", "buffer", "ID", "Buffer"],
    &["lower", "start", "begin", "LOWER", "Start"],
    &["upper", "end", "Upper", "END"],
    &["size", "SIZE", "Size"],
    &["offset", "Offset"],
];

impl<'a> Arbitrary<'a> for CsvTrace {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let layout = Layout::arbitrary(u)?;
        // Column order: a shuffle of id, lower, upper, size, with or without an offset column.
        let mut columns: Vec<usize> = vec![0, 1, 2, 3];
        if u.arbitrary()? {
            columns.push(4);
        }
        for i in (1..columns.len()).rev() {
            let j = u.int_in_range(0..=i)?;
            columns.swap(i, j);
        }
        let pad = |u: &mut Unstructured<'_>| -> Result<&'static str> { Ok(*u.choose(&["", " ", "\t"])?) };
        let mut header = String::new();
        for (position, &column) in columns.iter().enumerate() {
            if position > 0 {
                header.push(',');
            }
            let (before, after) = (pad(u)?, pad(u)?);
            let _ = write!(header, "{before}{}{after}", u.choose(COLUMN_NAMES[column])?);
        }
        let mut input = String::new();
        layout.noise(u, &mut input)?;
        layout.line(u, &mut input, &header)?;

        let rows = u.int_in_range(1..=OPTIONS.max_rows)?;
        let mut buffers: Vec<BufferLifetime> = Vec::with_capacity(rows);
        let mut fresh = OPTIONS.id_pool + 1;
        for _ in 0..rows {
            layout.noise(u, &mut input)?;
            let lower = if u.ratio(1, 8)? { u.int_in_range(0..=u32::MAX - 1)? } else { u.int_in_range(0..=200)? };
            let room = u32::MAX - 1 - lower;
            let extra = if u.ratio(1, 8)? { u.int_in_range(0..=room)? } else { u.int_in_range(0..=room.min(50))? };
            let upper = lower + 1 + extra;
            let span = BufferLifetime { id: 0, lower, upper, size: 0 };
            let id = pick_id(u, &mut fresh, |id| buffers.iter().any(|b| b.id == id && b.overlaps_in_time(&span)))?;
            let (size_text, size) = size_text(u)?;
            let offset: u64 = u.arbitrary()?;
            let mut row = String::new();
            for (position, &column) in columns.iter().enumerate() {
                if position > 0 {
                    row.push(',');
                }
                let value = match column {
                    0 => format!("{id}"),
                    1 => format!("{lower}"),
                    2 => format!("{upper}"),
                    3 => size_text.clone(),
                    _ => format!("{offset}"),
                };
                let (before, after) = (pad(u)?, pad(u)?);
                let _ = write!(row, "{before}{value}{after}");
            }
            layout.line(u, &mut input, &row)?;
            buffers.push(BufferLifetime { id, lower, upper, size });
        }
        layout.finish(&mut input);
        let steps = buffers.iter().map(|b| b.upper).max().unwrap_or(0);
        let expected = Trace { format: TraceFormat::DsaCsv, buffers, steps, never_freed: 0 };
        Ok(CsvTrace(GeneratedTrace { input, expected }))
    }
}

/// Checks one case (see the module docs); panics on the first violated invariant.
pub fn check(case: TraceCase) {
    match case {
        TraceCase::Bytes(bytes) => check_bytes(&bytes),
        TraceCase::Text(TextTrace(generated)) | TraceCase::Csv(CsvTrace(generated)) => {
            let parsed = parse_trace(generated.input.as_bytes());
            assert_eq!(parsed.as_ref(), Ok(&generated.expected), "input:\n{}", generated.input);
            check_bytes(generated.input.as_bytes());
        }
    }
}

/// The invariants that hold for any input.
fn check_bytes(input: &[u8]) {
    let any = parse_trace(input);
    let text = parse_memo_text(input);
    let csv = parse_dsa_csv(input);
    for result in [&any, &text, &csv] {
        match result {
            Ok(trace) => well_formed(trace),
            Err(e) => sensible_error(e, input),
        }
    }
    match &any {
        Ok(trace) if trace.format == TraceFormat::MemoText => assert_eq!(any, text, "parse_trace vs parse_memo_text"),
        Ok(_) => assert_eq!(any, csv, "parse_trace vs parse_dsa_csv"),
        Err(e) if e.kind == TraceErrorKind::UnknownFormat => {
            assert!(text.is_err() && csv.is_err(), "format unknown, yet text {text:?}, csv {csv:?}");
        }
        Err(_) => assert!(any == text || any == csv, "parse_trace {any:?} is neither parser's answer"),
    }
    if let Ok(trace) = &text {
        assert_eq!(trace.format, TraceFormat::MemoText);
        assert_eq!(parse_memo_text(as_text(trace).as_bytes()).as_ref(), Ok(trace), "text round trip");
        csv_round_trip(trace);
    }
    if let Ok(trace) = &csv {
        assert_eq!(trace.format, TraceFormat::DsaCsv);
        csv_round_trip(trace);
    }
}

/// The well-formedness invariants of an `Ok` trace (see the module docs).
fn well_formed(trace: &Trace) {
    assert!(!trace.buffers.is_empty(), "an Ok trace without buffers");
    for b in &trace.buffers {
        assert!(b.lower < b.upper && b.upper <= trace.steps, "{b:?} in a trace of {} steps", trace.steps);
    }
    let mut by_id: Vec<&BufferLifetime> = trace.buffers.iter().collect();
    by_id.sort_by_key(|b| (b.id, b.lower));
    for pair in by_id.windows(2) {
        assert!(pair[0].id != pair[1].id || !pair[0].overlaps_in_time(pair[1]), "one id, two live buffers: {pair:?}");
    }
    match trace.format {
        TraceFormat::MemoText => {
            let mut requests = vec![0u32; trace.steps as usize];
            for b in &trace.buffers {
                requests[b.lower as usize] += 1;
                if b.upper < trace.steps {
                    requests[b.upper as usize] += 1;
                }
            }
            assert!(requests.iter().all(|&r| r == 1), "text trace steps without exactly one request: {requests:?}");
            let alive_at_end = trace.buffers.iter().filter(|b| b.upper == trace.steps).count();
            assert_eq!(trace.never_freed as usize, alive_at_end, "never_freed");
        }
        TraceFormat::DsaCsv => {
            assert_eq!(Some(trace.steps), trace.buffers.iter().map(|b| b.upper).max(), "CSV steps");
            assert_eq!(trace.never_freed, 0);
        }
    }
}

fn sensible_error(e: &TraceError, input: &[u8]) {
    let lines = input.split(|&b| b == b'\n').count();
    assert!(e.line <= lines, "{e:?} in an input of {lines} lines");
    assert_eq!(e.line == 0, e.kind == TraceErrorKind::Empty, "only an empty trace has no line: {e:?}");
    assert!(!format!("{e}").is_empty());
}

/// A well-formed text trace written back as `malloc`/`free` lines, one per step.
fn as_text(trace: &Trace) -> String {
    let mut lines: Vec<String> = vec![String::new(); trace.steps as usize];
    for b in &trace.buffers {
        lines[b.lower as usize] = format!("malloc {} {}", b.id, b.size);
        if b.upper < trace.steps {
            lines[b.upper as usize] = format!("free {} {}", b.id, b.size);
        }
    }
    lines.join("\n")
}

/// Writes any `Ok` trace as `id,lower,upper,size` CSV and parses it again.
fn csv_round_trip(trace: &Trace) {
    let mut csv = String::from("id,lower,upper,size\n");
    for b in &trace.buffers {
        let _ = writeln!(csv, "{},{},{},{}", b.id, b.lower, b.upper, b.size);
    }
    let again = parse_dsa_csv(csv.as_bytes()).unwrap_or_else(|e| panic!("CSV round trip: {e}\n{csv}"));
    assert_eq!(again.buffers, trace.buffers, "CSV round trip");
    if trace.format == TraceFormat::DsaCsv {
        assert_eq!(&again, trace, "CSV round trip");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke() {
        super::super::smoke(0x7472_6163_6500, 2_400, 2_000, check);
    }

    #[test]
    fn the_example_trace_passes() {
        check(TraceCase::Bytes(include_bytes!("../../../examples/traces/memo-layer.trace").to_vec()));
    }

    #[test]
    fn the_committed_corpus_passes() {
        super::super::run_corpus("trace_parse", check);
    }

    #[test]
    fn a_trace_file_is_a_seed_as_it_is() {
        let input = b"malloc 1 2\nfree 1 2\n";
        let case = TraceCase::arbitrary_take_rest(Unstructured::new(input)).unwrap();
        assert!(matches!(&case, TraceCase::Bytes(bytes) if bytes == input), "{case:?}");
        let text = TraceCase::arbitrary_take_rest(Unstructured::new(&[0x80, 7, 7, 7])).unwrap();
        assert!(matches!(text, TraceCase::Text(_)), "{text:?}");
        let csv = TraceCase::arbitrary_take_rest(Unstructured::new(&[0x81, 7, 7, 7])).unwrap();
        assert!(matches!(csv, TraceCase::Csv(_)), "{csv:?}");
    }
}
