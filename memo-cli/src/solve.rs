//! `memo solve`: place the buffers of a memory request trace in one arena with the lowest peak,
//! check the placement independently, and print it.

use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memo_place::check::check_placement;
use memo_place::{Progress, SearchMix, Solution, SolveError, SolveOptions, DEFAULT_BUDGET_NODES};
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

The solve is anytime: it stops at --time-limit (default 10 s), at --budget-nodes (no node limit
unless given), or at Ctrl-C, and prints the best placement found by then, saying whether it is proven optimal and how far it is
above the lower bound (a second Ctrl-C ends it at once, with exit 130 and no placement). The time limit covers the whole command: reading the trace, solving, and
checking and writing the placement (the solver stops early enough to leave about a microsecond
per buffer for those). Every solve ends with a checked placement or a verdict: a limit too short
even for one placement gets the first one the solver makes (a start-order sweep), late. A solve
that runs past a second reports its progress on standard error once a second (best peak, lower
bound, nodes per second). With --capacity, a placement under it, or *proven infeasible* (exit 3),
or *not found within the limit* (exit 4).

The search runs on --threads threads (default: the machine's cores, of which it uses up to 3),
each sharing its time among the exact searches differently, and keeps the best answer: the first
proof of optimality or infeasibility, else the lowest peak when all have stopped. With one thread
the placement is the same on every run; with more, a proven peak or verdict is too, but which
placement of that peak comes back may differ between runs.

The placement is checked by an independent checker before it is printed: as CSV
`id,lower,upper,size,offset` on standard output (one row per buffer, in trace order), with a
summary on standard error; or, with --json, as one JSON object and no summary. With --svg, the
placement is also drawn: x = step, y = offset, one rectangle per buffer over its lifetime, the
lower bound and the peak as lines, and the live bytes below.";

const EXAMPLES: &str = "\
Examples:
  memo solve examples/traces/memo-layer.trace
  memo solve --capacity 2GiB --alignment 512 trace.txt > placement.csv
  memo solve --time-limit 60 big.csv > placement.csv
  memo solve --threads 1 trace.csv > placement.csv      # the same placement every run
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

    /// Search nodes the exact search may visit, over the whole solve (each thread) [default: no
    /// limit: the time limit ends the search]
    #[arg(long, value_name = "N", value_parser = parse_nodes)]
    budget_nodes: Option<u64>,

    /// Stop after this many seconds (e.g. 10, 2.5), reading and writing included, and print the best
    /// placement found
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = parse_seconds)]
    time_limit: Duration,

    /// Every offset is a multiple of this many bytes, and every buffer is rounded up to it
    #[arg(long, value_name = "BYTES", default_value = "1", value_parser = parse_bytes)]
    alignment: u64,

    /// Search threads, each with its own mix of searches, the best answer kept (1: the same
    /// placement every run; more than 3 add nothing) [default: the machine's cores]
    #[arg(long, value_name = "N", value_parser = parse_threads)]
    threads: Option<usize>,

    /// Print one JSON object on standard output instead of the CSV, and no summary
    #[arg(long)]
    json: bool,

    /// Also draw the placement as SVG into this file (x = step, y = offset)
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// Longest time limit accepted: a year, far beyond any useful solve, and far inside `Duration`.
const MOST_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

fn parse_seconds(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        // At least a nanosecond: a limit that rounds to zero would read back as `--time-limit 0`.
        Ok(seconds) if (1e-9..=MOST_SECONDS).contains(&seconds) => Ok(Duration::from_secs_f64(seconds)),
        _ => Err("expected a number of seconds above 0 (1e-9 at least), such as 10 or 2.5".to_string()),
    }
}

fn parse_threads(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(threads) if threads >= 1 => Ok(threads),
        _ => Err("expected a whole number of threads, 1 or more, such as 2".to_string()),
    }
}

fn parse_nodes(text: &str) -> Result<u64, String> {
    text.trim().parse().map_err(|_| format!("expected a whole number of search nodes, such as {DEFAULT_BUDGET_NODES}"))
}

/// Runs `memo solve`.
pub fn run(args: &SolveArgs) -> Result<(), Failure> {
    // The time limit counts from here: reading and parsing the trace are part of the wait.
    let deadline = Instant::now() + args.time_limit;
    let name = input_name(&args.input);
    let bytes = read_input(&args.input).map_err(|e| {
        Failure::new(exit::IO_ERROR, format!("cannot read {name}: {e}; check the path and permissions"))
    })?;
    let trace = trace::parse_trace(&bytes).map_err(|e| trace_failure(&name, &e))?;
    let options = SolveOptions {
        capacity: args.capacity,
        alignment: args.alignment,
        budget_nodes: args.budget_nodes.unwrap_or(u64::MAX),
        ..SolveOptions::default()
    };
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mixes = SearchMix::portfolio(threads);

    let interrupted = interrupt_flag();
    let started = Instant::now();
    // The solver stops early enough to leave the time checking and writing take. A component's
    // first placement (its start-order sweep) may run on into what the limit allows past itself
    // (`FIRST_PLACEMENT_GRACE`): stopped inside it, the component would be stacked.
    let reserve = reserve(trace.buffers.len(), args.svg.is_some());
    let solver_deadline = deadline.checked_sub(reserve);
    let first_placement_deadline =
        deadline.checked_add(args.time_limit / 10 + FIRST_PLACEMENT_GRACE).and_then(|d| d.checked_sub(reserve));
    // The live-bytes bound, known before the search: the progress lines never show a bound of 0 B
    // while the solver's own (at least this one) is still being computed.
    let live_bound = memo_plan_core::lifetime::lower_bound(&trace.buffers, options.alignment.max(1));
    let mut reporter = Reporter { started, last: started, live_bound };
    // What made the callback stop the solve; a solve cut short otherwise ran out of nodes.
    let mut stopped_by = StoppedBy::Budget;
    let mut stop = |progress: &Progress| {
        let now = Instant::now();
        reporter.report(now, progress);
        // Answered afresh at every poll: the solver asks again inside a first placement after a
        // stop, and only the later deadline stops that.
        let deadline = if progress.first_placement { first_placement_deadline } else { solver_deadline };
        let reason = if interrupted.load(Ordering::Relaxed) {
            StoppedBy::Interrupt
        } else if deadline.is_none_or(|d| now >= d) {
            StoppedBy::TimeLimit
        } else {
            return false;
        };
        stopped_by = reason;
        true
    };
    let result = memo_place::solve_portfolio(&trace.buffers, &options, mixes, &mut stop);
    let elapsed = started.elapsed();
    let limits = Limits { time_limit: args.time_limit, budget_nodes: args.budget_nodes, stopped_by };
    let solution = result.map_err(|e| solve_failure(&name, &e, &options, &limits))?;

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
        limits: &limits,
        threads: mixes.len(),
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

/// The time `memo solve` keeps back from the solver, out of `--time-limit`, for what follows it:
/// checking the placement and writing it (and drawing it with `--svg`), which cannot be stopped
/// half-way. Proportional to the buffers: on the 2-core build machine, idle, checking and writing
/// the CSV or the JSON took about 0.15-0.2 us a buffer (BENCHMARKS.md, "tenth pass"); three times
/// that is kept back, for a loaded machine and for stacking after a stopped first placement (0.4
/// us passed the limit in 3 of 108 runs). The SVG adds about 1 us ("fourth pass"), of which twice
/// is kept back. A limit shorter than the reserve stops the solver at its
/// first poll after each component's first placement; the first placement itself is stopped only
/// at the limit plus its grace (`FIRST_PLACEMENT_GRACE`) less the reserve, and then that
/// component is stacked (a placement at once, a poor one).
fn reserve(buffers: usize, svg: bool) -> Duration {
    let mut nanos_per_buffer = RESERVE_NANOS_PER_BUFFER;
    if svg {
        nanos_per_buffer += RESERVE_NANOS_PER_BUFFER_SVG;
    }
    Duration::from_nanos(nanos_per_buffer.saturating_mul(buffers as u64))
}

/// How far past `--time-limit`, besides a tenth of it, a component's first placement may run
/// before it is stopped (and the component stacked): the most the limit is ever passed by
/// (spec/placement.md). On 100k buffers the sweep takes about 0.07 s idle.
const FIRST_PLACEMENT_GRACE: Duration = Duration::from_millis(100);

/// Checking and writing the CSV or the JSON, per buffer (three times the idle cost measured).
const RESERVE_NANOS_PER_BUFFER: u64 = 600;
/// What `--svg` adds per buffer.
const RESERVE_NANOS_PER_BUFFER_SVG: u64 = 2_000;

/// Ctrl-C sets the returned flag, which the solve's stop callback polls: the solve ends and the best
/// placement so far is printed. A second Ctrl-C (the first not acted on yet) ends the process at
/// once, as a plain interrupt would. If the handler cannot be installed, Ctrl-C keeps its default.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&flag);
    let _ = ctrlc::set_handler(move || {
        if seen.swap(true, Ordering::Relaxed) {
            std::process::exit(i32::from(exit::INTERRUPTED));
        }
    });
    flag
}

/// Prints the progress of a long solve on standard error, once a second from the first second on.
struct Reporter {
    started: Instant,
    last: Instant,
    /// The trace's live-bytes lower bound, computed before the search.
    live_bound: u64,
}

impl Reporter {
    fn report(&mut self, now: Instant, progress: &Progress) {
        let elapsed = now.duration_since(self.started);
        if elapsed < Duration::from_secs(1) || now.duration_since(self.last) < Duration::from_secs(1) {
            return;
        }
        self.last = now;
        let _ = writeln!(io::stderr().lock(), "{}", self.line(elapsed, progress));
    }

    /// One progress line: `memo solve: 1.0 s: best peak 2.38 GiB (gap +0.00%), lower bound 2.38 GiB,
    /// 123 nodes (0.1k nodes/s)`.
    fn line(&self, elapsed: Duration, progress: &Progress) -> String {
        let lower_bound = progress.lower_bound.max(self.live_bound);
        let rate = progress.nodes as f64 / elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        let best = if progress.peak == 0 {
            "greedy placement under way".to_string()
        } else {
            format!("best peak {} (gap {})", human::binary_units(progress.peak), gap(progress.peak, lower_bound))
        };
        format!(
            "memo solve: {:.1} s: {best}, lower bound {}, {} nodes ({:.1}k nodes/s)",
            elapsed.as_secs_f64(),
            human::binary_units(lower_bound),
            progress.nodes,
            rate / 1000.0
        )
    }
}

/// How far `peak` is above `lower_bound`, in percent: `+0.30%`.
fn gap(peak: u64, lower_bound: u64) -> String {
    if lower_bound == 0 {
        return "+0.00%".to_string();
    }
    let excess = peak.saturating_sub(lower_bound) as f64;
    format!("+{:.2}%", excess * 100.0 / lower_bound as f64)
}

/// What ended a solve that did not settle everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StoppedBy {
    TimeLimit,
    Interrupt,
    Budget,
}

/// The limits of a solve and which one ended it (if the solve was cut short).
struct Limits {
    time_limit: Duration,
    /// `--budget-nodes`, if given.
    budget_nodes: Option<u64>,
    stopped_by: StoppedBy,
}

impl Limits {
    /// Why the search ended early, for a person: `the time limit (10 s)`.
    fn reason(&self) -> String {
        match self.stopped_by {
            StoppedBy::TimeLimit => format!("the time limit (--time-limit {})", seconds(self.time_limit)),
            StoppedBy::Interrupt => "Ctrl-C".to_string(),
            StoppedBy::Budget => match self.budget_nodes {
                Some(budget) => format!("the node budget (--budget-nodes {budget})"),
                None => "the node budget".to_string(), // 2^64 nodes: not in a lifetime
            },
        }
    }

    /// The same as a JSON value.
    fn json_reason(&self) -> &'static str {
        match self.stopped_by {
            StoppedBy::TimeLimit => "time_limit",
            StoppedBy::Interrupt => "interrupt",
            StoppedBy::Budget => "budget_nodes",
        }
    }
}

/// Seconds as given on the command line: `10`, `2.5`, `0.000001`.
fn seconds(duration: Duration) -> String {
    let text = format!("{:.9}", duration.as_secs_f64());
    text.trim_end_matches('0').trim_end_matches('.').to_string()
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

fn solve_failure(name: &str, error: &SolveError, options: &SolveOptions, limits: &Limits) -> Failure {
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
                "{name}: not found within the limit: no placement under --capacity {} found before {} \
                 stopped the search (best peak {}, lower bound {}; none ruled out); raise --time-limit, \
                 --budget-nodes or --capacity",
                human::bytes(capacity),
                limits.reason(),
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
    limits: &'a Limits,
    /// The searches run side by side (`--threads`, at most one per mix).
    threads: usize,
    /// Where `--svg` drew the placement.
    svg: Option<&'a Path>,
}

/// The placement as CSV on stdout, built in memory first: the digits by hand, as formatting each
/// line took 0.2 us a buffer, a quarter of a run stopped at once on 100k buffers (BENCHMARKS.md).
fn write_csv(solved: &Solved) -> io::Result<()> {
    let buffers = &solved.trace.buffers;
    let mut text: Vec<u8> = Vec::with_capacity(32 + 48 * buffers.len());
    text.extend_from_slice(b"id,lower,upper,size,offset\n");
    for (b, &offset) in buffers.iter().zip(&solved.solution.offsets) {
        for (value, end) in
            [(b.id, b','), (b.lower.into(), b','), (b.upper.into(), b','), (b.size, b','), (offset, b'\n')]
        {
            push_decimal(&mut text, value);
            text.push(end);
        }
    }
    let mut out = io::stdout().lock();
    out.write_all(&text)?;
    out.flush()
}

/// Appends `value` in decimal.
fn push_decimal(text: &mut Vec<u8>, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut first = digits.len();
    loop {
        first -= 1;
        digits[first] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    text.extend_from_slice(&digits[first..]);
}

fn write_json(solved: &Solved) -> io::Result<()> {
    let (trace, solution, stats) = (solved.trace, solved.solution, &solved.solution.stats);
    let object = JsonPlacement {
        alignment: solved.options.alignment.max(1),
        budget_exhausted: stats.budget_exhausted,
        buffers: trace.buffers.len(),
        capacity: solved.options.capacity,
        components: stats.components,
        elapsed_ms: human::millis(solved.elapsed),
        format: format_name(trace.format),
        greedy_peak: stats.greedy_peak,
        lower_bound: solution.lower_bound,
        never_freed: trace.never_freed,
        nodes: stats.nodes,
        offsets: JsonOffsets(solved),
        optimal: solution.optimal,
        peak: solution.peak,
        steps: trace.steps,
        stopped: solved.stopped().map(|_| solved.limits.json_reason()),
        svg: solved.svg.map(|svg| svg.display().to_string()),
        threads: solved.threads,
        time_limit_s: solved.limits.time_limit.as_secs_f64(),
        unsearched_components: stats.unsearched_components,
    };
    let mut out = BufWriter::new(io::stdout().lock());
    serde_json::to_writer(&mut out, &object)?;
    writeln!(out)?;
    out.flush()
}

/// The `--json` object, its fields in alphabetical order (as a `serde_json::Value` printed them
/// before); serialised straight to the output: a `Value` per buffer took 1.2 us a buffer, a large
/// share of a short time limit on 100k buffers.
#[derive(serde::Serialize)]
struct JsonPlacement<'a> {
    alignment: u64,
    budget_exhausted: bool,
    buffers: usize,
    capacity: Option<u64>,
    components: u32,
    elapsed_ms: f64,
    format: &'static str,
    greedy_peak: u64,
    lower_bound: u64,
    never_freed: u32,
    nodes: u64,
    offsets: JsonOffsets<'a>,
    optimal: bool,
    peak: u64,
    steps: u32,
    stopped: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    svg: Option<String>,
    threads: usize,
    time_limit_s: f64,
    unsearched_components: u32,
}

/// `[{"id","offset"}]` in input order, written as it is read.
struct JsonOffsets<'a>(&'a Solved<'a>);

impl serde::Serialize for JsonOffsets<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Row {
            id: u64,
            offset: u64,
        }
        let (trace, solution) = (self.0.trace, self.0.solution);
        serializer.collect_seq(trace.buffers.iter().zip(&solution.offsets).map(|(b, &offset)| Row { id: b.id, offset }))
    }
}

fn format_name(format: TraceFormat) -> &'static str {
    match format {
        TraceFormat::MemoText => "memo-text",
        TraceFormat::DsaCsv => "dsa-csv",
    }
}

impl Solved<'_> {
    /// Whether the search was cut short (by time, Ctrl-C or the node budget), and by what.
    fn stopped(&self) -> Option<String> {
        let stats = &self.solution.stats;
        (stats.stopped || stats.budget_exhausted).then(|| self.limits.reason())
    }

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
        row("gap to lower bound", gap(solution.peak, solution.lower_bound));
        if let Some(reason) = self.stopped() {
            row("stopped by", reason);
        }
        row("greedy peak", human::bytes(stats.greedy_peak));
        row(
            "components",
            format!(
                "{} (largest {} buffers; {} placed by reductions; {} too large to search)",
                stats.components, stats.largest_component, stats.fixed_buffers, stats.unsearched_components
            ),
        );
        let exhausted = if stats.budget_exhausted && !stats.stopped { " (budget exhausted)" } else { "" };
        let mut nodes = stats.nodes.to_string();
        if self.threads > 1 {
            nodes += &format!(" on {} threads", self.threads);
        }
        match (self.limits.budget_nodes, self.threads > 1) {
            (Some(budget), true) => nodes += &format!(", {budget} each at most"),
            (Some(budget), false) => nodes += &format!(" of {budget}"),
            (None, _) => {}
        }
        row("search nodes", nodes + exhausted);
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
        let mut solution = memo_place::solve(&trace.buffers, &options).unwrap();
        assert!(check("t", &trace, &options, &solution).is_ok());
        solution.offsets = vec![0, 5];
        let failure = check("t", &trace, &options, &solution).unwrap_err();
        assert_eq!(failure.code(), exit::INTERNAL_ERROR);
        assert!(failure.message().contains("please report it"), "{}", failure.message());
    }

    /// The first progress line once said "lower bound 0 B": the solver had not computed its bound
    /// yet. The trace's live-bytes bound is known before the search starts.
    #[test]
    fn progress_lines_show_the_live_bytes_bound_before_the_solver_has_one() {
        let trace = trace::parse_trace(b"malloc 1 1GiB\nmalloc 2 1GiB\nfree 1 1GiB\nfree 2 1GiB\n").unwrap();
        let now = Instant::now();
        let live_bound = memo_plan_core::lifetime::lower_bound(&trace.buffers, 1);
        let reporter = Reporter { started: now, last: now, live_bound };
        let before = Progress { nodes: 0, peak: 0, lower_bound: 0, first_placement: true };
        let line = reporter.line(Duration::from_secs(1), &before);
        assert!(line.contains("greedy placement under way, lower bound 2.00 GiB,"), "{line}");
        let later = Progress { nodes: 10, peak: 3 << 30, lower_bound: 2 << 30, first_placement: false };
        let line = reporter.line(Duration::from_secs(2), &later);
        assert!(line.contains("best peak 3.00 GiB (gap +50.00%), lower bound 2.00 GiB,"), "{line}");
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
        assert!(parse_bytes("2 lots").unwrap_err().contains("expected a byte count"));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_nodes("100"), Ok(100));
        assert_eq!(parse_seconds("2.5"), Ok(Duration::from_millis(2500)));
        for bad in ["0", "-1", "NaN", "inf", "ten"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds(Duration::from_millis(2500)), "2.5");
        assert_eq!(seconds(Duration::from_secs(10)), "10");
        assert_eq!(parse_seconds("0.000001").map(seconds), Ok("0.000001".to_string()));
        assert!(parse_seconds("1e-10").is_err());
        assert_eq!(gap(1003, 1000), "+0.30%");
        assert_eq!(gap(0, 0), "+0.00%");
        assert!(parse_nodes("-1").is_err());
    }
}
