//! `memo solve`: place the buffers of a memory request trace in one arena with the lowest peak,
//! check the placement independently, and print it.

use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memo_plan_core::arena::{self, Solution, SolveError, SolveOptions, DEFAULT_BUDGET_NODES};
use memo_plan_core::check::check_placement;
use memo_plan_core::trace::{self, Trace, TraceError, TraceFormat};

use crate::config::parse_bytes;
use crate::exit::{self, Failure};
use crate::human;

/// What `memo solve --help` says it does.
pub const LONG_ABOUT: &str = "\
Place the buffers of a memory request trace in one arena with the lowest peak.

The trace is MEMO's `malloc <id> <size>` / `free <id> <size>` lines (the k-th request happens at
step k; a buffer never freed lives to the end) or an `id,lower,upper,size` CSV with a header
(lifetimes are half-open [lower, upper)); the form is detected from the first line. Sizes are
bytes, optionally with a unit: K, M, G, T, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB.

The placement is checked by an independent checker before it is printed: as CSV
`id,lower,upper,size,offset` on standard output (one row per buffer, in trace order), with a
summary on standard error; or, with --json, as one JSON object and no summary. With --svg, the
placement is also drawn: x = step, y = offset, one rectangle per buffer over its lifetime, the
lower bound and the peak as lines, and the live bytes below.";

const EXAMPLES: &str = "\
Examples:
  memo solve examples/traces/memo-layer.trace
  memo solve --capacity 2GiB --alignment 512 trace.txt > placement.csv
  cat trace.csv | memo solve --json -
  memo solve examples/traces/memo-layer.trace --svg placement.svg > placement.csv";

/// The arguments of `memo solve`.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("{EXAMPLES}\n\n{}", exit::HELP))]
pub struct SolveArgs {
    /// The trace file, or `-` for standard input
    #[arg(value_name = "TRACE")]
    input: PathBuf,

    /// Fail unless the peak fits in this many bytes (e.g. 80GiB, 512MB, 4096)
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    capacity: Option<u64>,

    /// Search nodes the exact search may visit, over the whole solve
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BUDGET_NODES, value_parser = parse_nodes)]
    budget_nodes: u64,

    /// Every offset is a multiple of this many bytes, and every buffer is rounded up to it
    #[arg(long, value_name = "BYTES", default_value = "1", value_parser = parse_bytes)]
    alignment: u64,

    /// Print one JSON object on standard output instead of the CSV, and no summary
    #[arg(long)]
    json: bool,

    /// Also draw the placement as SVG into this file (x = step, y = offset)
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

fn parse_nodes(text: &str) -> Result<u64, String> {
    text.trim().parse().map_err(|_| format!("expected a whole number of search nodes, such as {DEFAULT_BUDGET_NODES}"))
}

/// Runs `memo solve`.
pub fn run(args: &SolveArgs) -> Result<(), Failure> {
    let name = input_name(&args.input);
    let bytes = read_input(&args.input).map_err(|e| {
        Failure::new(exit::IO_ERROR, format!("cannot read {name}: {e}; check the path and permissions"))
    })?;
    let trace = trace::parse_trace(&bytes).map_err(|e| trace_failure(&name, &e))?;
    let options = SolveOptions { capacity: args.capacity, alignment: args.alignment, budget_nodes: args.budget_nodes };

    let started = Instant::now();
    let solution = arena::solve(&trace.buffers, &options).map_err(|e| solve_failure(&name, &e, &options))?;
    let elapsed = started.elapsed();

    check(&name, &trace, &options, &solution)?;
    if let Some(path) = &args.svg {
        let rendered = crate::picture::placement_svg(&name, &trace, &solution, options.alignment, options.capacity);
        crate::picture::write_file(path, &rendered.svg, "SVG")?;
    }

    let solved = Solved {
        name: &name,
        trace: &trace,
        options: &options,
        solution: &solution,
        elapsed,
        svg: args.svg.as_deref(),
    };
    let written = if args.json { write_json(&solved) } else { write_csv(&solved) };
    written.map_err(|e| {
        let advice = if e.kind() == io::ErrorKind::BrokenPipe {
            "the reader closed it early; let it read the whole placement"
        } else {
            "check where standard output goes (disk full? closed?)"
        };
        Failure::new(exit::IO_ERROR, format!("cannot write the placement to standard output: {e}; {advice}"))
    })?;
    if !args.json {
        // A summary that cannot be written is no reason to fail: the placement is out.
        let _ = io::stderr().lock().write_all(solved.summary().as_bytes());
    }
    Ok(())
}

/// Never print a placement the independent checker has not accepted: a rejection is a solver bug.
fn check(name: &str, trace: &Trace, options: &SolveOptions, solution: &Solution) -> Result<(), Failure> {
    check_placement(&trace.buffers, &solution.offsets, options.alignment, solution.peak, options.capacity).map_err(
        |violations| {
            Failure::new(
                exit::INTERNAL_ERROR,
                format!(
                    "internal error: the solver's placement of {name} failed the independent check \
                     ({} violation(s), first: {}); this is a bug, please report it with the trace and the \
                     command line",
                    violations.len(),
                    violations.first().map(ToString::to_string).unwrap_or_default()
                ),
            )
        },
    )
}

/// How the input is named in messages.
fn input_name(input: &Path) -> String {
    if is_stdin(input) {
        "<stdin>".to_string()
    } else {
        input.display().to_string()
    }
}

fn is_stdin(input: &Path) -> bool {
    input.as_os_str() == "-"
}

fn read_input(input: &Path) -> io::Result<Vec<u8>> {
    if is_stdin(input) {
        let mut bytes = Vec::new();
        io::stdin().lock().read_to_end(&mut bytes)?;
        Ok(bytes)
    } else {
        std::fs::read(input)
    }
}

/// `<file>:<line>: <what>`, or `<file>: <what>` for a problem with the input as a whole.
fn trace_failure(name: &str, error: &TraceError) -> Failure {
    let what = TraceError { line: 0, kind: error.kind.clone() };
    let message = if error.line > 0 { format!("{name}:{}: {what}", error.line) } else { format!("{name}: {what}") };
    Failure::new(exit::BAD_INPUT, message)
}

fn solve_failure(name: &str, error: &SolveError, options: &SolveOptions) -> Failure {
    match *error {
        SolveError::ProvenInfeasible { capacity, lower_bound } => Failure::new(
            exit::INFEASIBLE,
            format!(
                "{name}: proven infeasible: every placement needs at least {}, above --capacity {}; \
                 raise --capacity to at least {lower_bound}",
                human::bytes(lower_bound),
                human::bytes(capacity)
            ),
        ),
        SolveError::NotFoundWithinBudget { capacity, best_peak, lower_bound, .. } => Failure::new(
            exit::NOT_FOUND,
            format!(
                "{name}: no placement under --capacity {} found within --budget-nodes {} (best peak {}, \
                 lower bound {}); raise --budget-nodes or --capacity",
                human::bytes(capacity),
                options.budget_nodes,
                human::bytes(best_peak),
                human::bytes(lower_bound),
            ),
        ),
        SolveError::TooLarge => Failure::new(
            exit::BAD_INPUT,
            format!(
                "{name}: the buffers, rounded up to --alignment {}, add up to more than 2^64 bytes; \
                 use smaller sizes or a smaller alignment",
                options.alignment
            ),
        ),
        SolveError::EmptyLifetime { .. } => {
            Failure::new(exit::BAD_INPUT, format!("{name}: {error}; give every buffer at least one step"))
        }
    }
}

/// A checked solution and what is needed to print it.
struct Solved<'a> {
    name: &'a str,
    trace: &'a Trace,
    options: &'a SolveOptions,
    solution: &'a Solution,
    elapsed: Duration,
    /// Where `--svg` drew the placement.
    svg: Option<&'a Path>,
}

fn write_csv(solved: &Solved) -> io::Result<()> {
    let mut out = BufWriter::new(io::stdout().lock());
    writeln!(out, "id,lower,upper,size,offset")?;
    for (b, offset) in solved.trace.buffers.iter().zip(&solved.solution.offsets) {
        writeln!(out, "{},{},{},{},{offset}", b.id, b.lower, b.upper, b.size)?;
    }
    out.flush()
}

fn write_json(solved: &Solved) -> io::Result<()> {
    let (trace, solution) = (solved.trace, solved.solution);
    let offsets: Vec<serde_json::Value> = trace
        .buffers
        .iter()
        .zip(&solution.offsets)
        .map(|(b, &offset)| serde_json::json!({ "id": b.id, "offset": offset }))
        .collect();
    let mut object = serde_json::json!({
        "format": format_name(trace.format),
        "buffers": trace.buffers.len(),
        "steps": trace.steps,
        "never_freed": trace.never_freed,
        "alignment": solved.options.alignment.max(1),
        "capacity": solved.options.capacity,
        "lower_bound": solution.lower_bound,
        "peak": solution.peak,
        "greedy_peak": solution.stats.greedy_peak,
        "optimal": solution.optimal,
        "components": solution.stats.components,
        "nodes": solution.stats.nodes,
        "budget_exhausted": solution.stats.budget_exhausted,
        "unsearched_components": solution.stats.unsearched_components,
        "elapsed_ms": human::millis(solved.elapsed),
        "offsets": offsets,
    });
    if let Some(svg) = solved.svg {
        object["svg"] = serde_json::json!(svg.display().to_string());
    }
    let mut out = BufWriter::new(io::stdout().lock());
    serde_json::to_writer(&mut out, &object)?;
    writeln!(out)?;
    out.flush()
}

fn format_name(format: TraceFormat) -> &'static str {
    match format {
        TraceFormat::MemoText => "memo-text",
        TraceFormat::DsaCsv => "dsa-csv",
    }
}

impl Solved<'_> {
    /// The human summary, one figure per line.
    fn summary(&self) -> String {
        let (trace, solution, stats) = (self.trace, self.solution, &self.solution.stats);
        let mut lines = vec![format!("memo solve: {} ({})", self.name, format_name(trace.format))];
        let mut row = |label: &str, value: String| lines.push(format!("  {label:<20}{value}"));
        row("buffers", trace.buffers.len().to_string());
        row("steps", trace.steps.to_string());
        if trace.format == TraceFormat::MemoText {
            row("never freed", trace.never_freed.to_string());
        }
        if self.options.alignment > 1 {
            row("alignment", human::bytes(self.options.alignment));
        }
        if let Some(capacity) = self.options.capacity {
            row("capacity", human::bytes(capacity));
        }
        row("lower bound", human::bytes(solution.lower_bound));
        row("peak", human::bytes(solution.peak));
        row("peak / lower bound", human::ratio(solution.peak, solution.lower_bound));
        row("optimality", if solution.optimal { "proven optimal" } else { "not proven optimal" }.to_string());
        row("greedy peak", human::bytes(stats.greedy_peak));
        row(
            "components",
            format!(
                "{} (largest {} buffers; {} placed by reductions; {} too large to search)",
                stats.components, stats.largest_component, stats.fixed_buffers, stats.unsearched_components
            ),
        );
        let exhausted = if stats.budget_exhausted { " (budget exhausted)" } else { "" };
        row("search nodes", format!("{} of {}{exhausted}", stats.nodes, self.options.budget_nodes));
        row("elapsed", human::duration(self.elapsed));
        if let Some(svg) = self.svg {
            row("picture", svg.display().to_string());
        }
        lines.push(String::new());
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exit-70 path: a placement the checker rejects is reported, never printed.
    #[test]
    fn a_placement_that_fails_the_check_is_an_internal_error() {
        let trace = trace::parse_trace(b"malloc 1 10\nmalloc 2 10\nfree 1 10\nfree 2 10\n").unwrap();
        let options = SolveOptions::default();
        let mut solution = arena::solve(&trace.buffers, &options).unwrap();
        assert!(check("t", &trace, &options, &solution).is_ok());
        solution.offsets = vec![0, 5];
        let failure = check("t", &trace, &options, &solution).unwrap_err();
        assert_eq!(failure.code(), exit::INTERNAL_ERROR);
        assert!(failure.message().contains("please report it"), "{}", failure.message());
    }

    #[test]
    fn trace_errors_name_file_and_line() {
        let error = trace::parse_trace(b"malloc 1 10\nfree 2 10\n").unwrap_err();
        let failure = trace_failure("t.trace", &error);
        assert_eq!(failure.code(), exit::BAD_INPUT);
        assert!(failure.message().starts_with("t.trace:2: free of id 2"), "{}", failure.message());
    }

    #[test]
    fn option_values_take_units() {
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("512MB"), Ok(512_000_000));
        assert!(parse_bytes("2 lots").unwrap_err().starts_with("expected a byte count"));
        assert_eq!(parse_nodes("100"), Ok(100));
        assert!(parse_nodes("-1").is_err());
    }
}
