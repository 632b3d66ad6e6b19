//! The hard sets of issue 19, measured: for each generated set, how many instances the solver
//! places at their known optimum (or best known peak) when asked for exactly that capacity
//! within a time limit, the time each took, and the search's nodes per second; for the
//! operator graphs, the gap to the lower bound after a time limit.
//!
//! `cargo run --release -p memo-place --example hard_report` prints every table;
//! `... -- packings [SECONDS]` or `... -- graphs [SECONDS]` one part (limits default to 1 s and
//! 10 s; MEMO_GRAPHS=N and MEMO_PIPELINED=N take the first N sizes of operator graphs and of
//! pipelined graphs); `... -- csv BLOCKS OPS SEED [MICRO STAGGER]` writes an operator graph (or a
//! pipelined graph of MICRO micro-batches) as a CSV trace, `... -- csv KIND N SEED` a packing
//! instance as one; `... -- one KIND N SEED [SECONDS]` one packing instance (KIND: guillotine,
//! pinwheel, holes), with the progress the solver reports; `... -- trace PATH CAPACITY [SECONDS]` the time an
//! `id,lower,upper,size` CSV takes to be placed under a capacity. Solves run the search mixes side
//! by side as `memo solve` does (`solve_portfolio`, one thread per core); MEMO_THREADS=1 runs the
//! default mix alone, MEMO_MIX=balanced|restarts|bounds one mix.

use memo_place::check::check_placement;
use memo_place::generate::{
    known_optimum, non_guillotine, operator_graph, pipelined_graph, with_holes, GraphShape, PipelineShape,
};
use memo_place::{lower_bound, BufferLifetime, SolveError, SolveOptions};
use memo_place::{solve_portfolio, Progress, SearchMix};
use std::time::{Duration, Instant};

const HEIGHT: u64 = 1 << 20;

fn packing(kind: &str, n: usize, seed: u64) -> Vec<BufferLifetime> {
    let steps = 4 * n as u32;
    match kind {
        "guillotine" => known_optimum(seed, n, steps, HEIGHT),
        "pinwheel" => non_guillotine(seed, n, steps, HEIGHT),
        _ => with_holes(seed, n, n / 50, steps, HEIGHT),
    }
}

/// The search mixes run side by side, as `memo solve` runs them: `SearchMix::portfolio` of as
/// many threads as the machine has cores; MEMO_THREADS=N sets the threads (1: the default mix
/// alone, deterministic), MEMO_MIX=balanced|restarts|bounds runs that mix alone.
fn mixes() -> &'static [SearchMix] {
    match std::env::var("MEMO_MIX").as_deref() {
        Ok("balanced") => return &[SearchMix::Balanced],
        Ok("restarts") => return &[SearchMix::Restarts],
        Ok("bounds") => return &[SearchMix::Bounds],
        _ => {}
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    SearchMix::portfolio(std::env::var("MEMO_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(cores))
}

/// Solves under a wall-clock limit (the callback), with an unlimited node budget.
fn timed(buffers: &[BufferLifetime], capacity: Option<u64>, limit: Duration, verbose: bool) -> (Outcome, f64, u64) {
    // A fixed node budget (MEMO_BUDGET_NODES) measures the cost per node on a loaded machine,
    // where wall-clock rates vary: the same nodes are visited, so instructions compare.
    let budget_nodes = std::env::var("MEMO_BUDGET_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
    let options = SolveOptions { capacity, alignment: 1, budget_nodes, ..SolveOptions::default() };
    let start = Instant::now();
    let mut nodes = 0;
    let mut last_print = start;
    let result = solve_portfolio(buffers, &options, mixes(), &mut |p: &Progress| {
        nodes = p.nodes;
        if verbose && last_print.elapsed() > Duration::from_millis(500) {
            last_print = Instant::now();
            eprintln!("  {:.1} s: {p:?}", start.elapsed().as_secs_f64());
        }
        start.elapsed() >= limit
    });
    let seconds = start.elapsed().as_secs_f64();
    let outcome = match result {
        Ok(s) => {
            check_placement(buffers, &s.offsets, 1, s.peak, capacity).expect("the checker accepts every solution");
            nodes = nodes.max(s.stats.nodes);
            Outcome::Placed {
                peak: s.peak,
                lower_bound: s.lower_bound,
                greedy: s.stats.greedy_peak,
                optimal: s.optimal,
            }
        }
        Err(SolveError::NotFoundWithinBudget { best_peak, .. }) => Outcome::NotFound { best_peak },
        Err(SolveError::ProvenInfeasible { .. }) => Outcome::Infeasible,
        Err(e) => panic!("{e}"),
    };
    (outcome, seconds, nodes)
}

enum Outcome {
    Placed { peak: u64, lower_bound: u64, greedy: u64, optimal: bool },
    NotFound { best_peak: u64 },
    Infeasible,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let part = args.first().map(String::as_str).unwrap_or("all");
    let seconds = |i: usize, default: f64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    if part == "csv" {
        // `csv BLOCKS OPS SEED [MICRO STAGGER]`: an operator graph (with MICRO: a pipelined graph of
        // MICRO micro-batches) as a DSA CSV trace on stdout (for `memo solve`, or for a peer such
        // as MiniMalloc, which reads the same `id,lower,upper,size` columns); `csv KIND N SEED`
        // (KIND: guillotine, pinwheel, holes) one packing instance of the hard sets.
        let arg = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
        let shape =
            GraphShape { blocks: arg(1, 64) as u32, ops_per_block: arg(2, 470) as u32, activation_bytes: 1 << 28 };
        let kind = args.get(1).map(String::as_str).unwrap_or("");
        let buffers = if ["guillotine", "pinwheel", "holes"].contains(&kind) {
            packing(kind, arg(2, 300) as usize, arg(3, 0))
        } else if args.len() > 4 {
            pipelined_graph(
                arg(3, 0),
                PipelineShape { graph: shape, micro_batches: arg(4, 16) as u32, stagger: arg(5, 10) as u32 },
            )
        } else {
            operator_graph(arg(3, 0), shape)
        };
        println!("id,lower,upper,size");
        for b in buffers {
            println!("{},{},{},{}", b.id, b.lower, b.upper, b.size);
        }
        return;
    }
    if part == "trace" {
        // `trace PATH CAPACITY [SECONDS]`: an `id,lower,upper,size` CSV solved at a capacity,
        // stopped as soon as a placement under it is found: the time to reach the capacity.
        let path = args.get(1).map(String::as_str).unwrap_or("-");
        let capacity: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(HEIGHT);
        let text = std::fs::read_to_string(path).expect("readable trace");
        let buffers: Vec<BufferLifetime> = text
            .lines()
            .skip(1)
            .filter_map(|line| {
                let f: Vec<u64> = line.split(',').map(|x| x.trim().parse().ok()).collect::<Option<_>>()?;
                Some(BufferLifetime { id: f[0], lower: f[1] as u32, upper: f[2] as u32, size: f[3] })
            })
            .collect();
        let limit = Duration::from_secs_f64(seconds(3, 10.0));
        let options =
            SolveOptions { capacity: Some(capacity), alignment: 1, budget_nodes: u64::MAX, ..SolveOptions::default() };
        let start = Instant::now();
        let mut nodes = 0;
        let result = solve_portfolio(&buffers, &options, mixes(), &mut |p: &Progress| {
            nodes = p.nodes;
            (p.peak != 0 && p.peak <= capacity) || start.elapsed() >= limit
        });
        let secs = start.elapsed().as_secs_f64();
        let verdict = match result {
            Ok(s) => {
                check_placement(&buffers, &s.offsets, 1, s.peak, Some(capacity)).expect("the checker accepts it");
                format!("placed, peak {}", s.peak)
            }
            Err(e) => format!("{e}"),
        };
        println!("{path}: {} buffers: {verdict}, {secs:.3} s, {nodes} nodes", buffers.len());
        return;
    }
    if part == "one" {
        let kind = args.get(1).map(String::as_str).unwrap_or("pinwheel");
        let n: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(300);
        let seed: u64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(0);
        let buffers = packing(kind, n, seed);
        // MEMO_MINIMISE=1: no capacity, watch the peak fall.
        let capacity = std::env::var_os("MEMO_MINIMISE").is_none().then_some(HEIGHT);
        let (outcome, secs, nodes) = timed(&buffers, capacity, Duration::from_secs_f64(seconds(4, 10.0)), true);
        let verdict = match outcome {
            Outcome::Placed { peak, .. } => format!("placed, peak {peak}"),
            Outcome::NotFound { best_peak } => format!("not found, best {best_peak}"),
            Outcome::Infeasible => "proven infeasible".into(),
        };
        println!("{kind} {n} seed {seed}: {verdict}, {secs:.3} s, {nodes} nodes ({:.0} nodes/s)", nodes as f64 / secs);
        return;
    }
    if part == "all" || part == "packings" {
        let limit = Duration::from_secs_f64(seconds(1, 1.0));
        println!("Packings at capacity = best known peak (2^20), limit {limit:?} each, seeds 0-9:");
        println!("| set | buffers | placed at capacity | median s | max s | nodes | nodes/s |");
        println!("|---|---|---|---|---|---|---|");
        for kind in ["guillotine", "pinwheel", "holes"] {
            for n in [300usize, 500] {
                let (mut placed, mut times, mut all_nodes) = (0, Vec::new(), 0u64);
                for seed in 0..10 {
                    let buffers = packing(kind, n, seed);
                    let (outcome, secs, nodes) = timed(&buffers, Some(HEIGHT), limit, false);
                    if matches!(outcome, Outcome::Placed { .. }) {
                        placed += 1;
                    }
                    times.push(secs);
                    all_nodes += nodes;
                }
                times.sort_by(f64::total_cmp);
                let total: f64 = times.iter().sum();
                println!(
                    "| {kind} | {n} | {placed}/10 | {:.3} | {:.3} | {all_nodes} | {:.0} |",
                    times[5],
                    times[9],
                    all_nodes as f64 / total
                );
            }
        }
    }
    if part == "all" || part == "graphs" {
        let limit = Duration::from_secs_f64(seconds(1, 10.0));
        println!("Operator graphs, minimise, limit {limit:?} each:");
        println!("| graph | buffers | greedy gap | solve gap | proven | s |");
        println!("|---|---|---|---|---|---|");
        // MEMO_GRAPHS=N: only the first N sizes (1: the 20k graphs).
        let sizes: usize = std::env::var("MEMO_GRAPHS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
        // Operator graphs, then pipelined graphs (16 micro-batches; the stagger is a tenth of a
        // micro-batch's blocks x ops), each at about 20k, 50k and 100k buffers.
        let shapes = [(24u32, 250u32, 0u32), (48, 320, 0), (64, 470, 0), (4, 100, 16), (4, 250, 16), (8, 250, 16)];
        let pipelined: usize = std::env::var("MEMO_PIPELINED").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
        let chosen = shapes[..3].iter().take(sizes).chain(shapes[3..].iter().take(pipelined));
        for &(blocks, ops, micro) in chosen {
            for seed in 0..2u64 {
                let shape = GraphShape { blocks, ops_per_block: ops, activation_bytes: 1 << 28 };
                let buffers = if micro == 0 {
                    operator_graph(seed, shape)
                } else {
                    pipelined_graph(
                        seed,
                        PipelineShape { graph: shape, micro_batches: micro, stagger: blocks * ops / 40 },
                    )
                };
                let (outcome, secs, _) = timed(&buffers, None, limit, false);
                let Outcome::Placed { peak, lower_bound: lb, greedy, optimal } = outcome else { unreachable!() };
                assert_eq!(lb, lower_bound(&buffers, 1));
                let gap = |p: u64| (p - lb) as f64 * 100.0 / lb as f64;
                println!(
                    "| {blocks}x{ops}{} seed {seed} | {} | +{:.3}% | +{:.3}% | {optimal} | {secs:.2} |",
                    if micro == 0 { String::new() } else { format!(" x{micro} pipelined") },
                    buffers.len(),
                    gap(greedy),
                    gap(peak)
                );
            }
        }
    }
}
