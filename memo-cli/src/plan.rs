//! `memo plan`: plan one training step of one GPU for each strategy (or one), check every plan,
//! print the strategies side by side, optionally write a plan file; `--max-seq` finds the longest
//! sequence each strategy fits.

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use memo_plan_core::plan::Strategy;
use memo_plan_core::planner::{self, MaxSequence, PlanReport, PlanRequest, PLAN_BUDGET_NODES};
use memo_plan_core::swap::AlphaBound;
use serde_json::{json, Value};

use crate::config::{Config, ConfigArgs};
use crate::exit::{self, Failure};
use crate::human;

mod progress;

/// What `memo plan --help` says it does.
pub const LONG_ABOUT: &str = "\
Plan one training step of one GPU: where every tensor lives in one device arena, what is swapped
to host memory and what is recomputed, and the program of kernel launches, copies and events on
four streams. Each plan passes the independent plan checker before it is reported or written.

Without --strategy, all four strategies are planned and shown side by side: memo (token-wise swap
and recompute), full-recompute (keep layer inputs only), full-swap (MEMO without the token split,
alpha = 1) and keep-all (keep every activation). Sizes are per GPU.

Step times and MFU are the cost model's estimates (spec/cost-model.md), not measurements; the
table shows MFU with attention halved for the causal mask (--json adds mfu_full). A machine
changed by --config's [machine] keys or the machine flags is marked `(overridden)` in the header,
with what changed. The tensor-parallel degree t cannot pass the machine's GPUs per node: a
tensor-parallel group stays inside a node. --nodes N spreads d x c x t ranks over N nodes (d
follows from N when --dp is not given); --cp C splits each sequence over C context-parallel ranks
(ring attention; spec/cost-model.md section 7c, spec/context-parallel.md: -o writes one program
per context rank; memo train --device cpu --context-parallel C runs them); --zero 1 or 2 shards the optimizer state (and the gradients) over
the d data-parallel ranks, and the step adds their gradient reduction and parameter all-gather,
over the network when d spans nodes. The plan file (-o) holds one tensor-parallel group's program
with its whole model state, so -o is refused with --zero 1 or 2 at d x c > 1. Without --strategy the command exits 8 when no strategy fits; with
--max-seq, when no strategy fits any length (the table is printed first either way).

Units: tokens take binary K, M, G (1M = 1,048,576); sizes decimal or binary units and fractions
(141GB, 1.5TB, 80GiB); rates need a unit (12.5GB/s, 25GiB/s; FLOP/s: 312T).

Any command that may run past 2 s reports progress on standard error: past 2 s, memo plan prints
`memo plan: <seconds> s: ...` lines (each strategy and stage, each length --max-seq probes).
Planning time grows about linearly in layers (BENCHMARKS.md); a step that would take more than
--plan-memory (4 GiB) to plan is refused before it is built, with the memory it would need.";

const EXAMPLES: &str = "\
Examples:
  memo plan --model 7b --seq 1M --machine a800x8 --tp 8
  memo plan --model 7b --seq 1M --machine a800x8 --tp 8 --strategy memo -o plan.memo
  memo plan --model 7b --machine a800x8 --tp 8 --max-seq
  memo plan --model llama3.1-70b --machine h100x8 --tp 8 --nodes 4 --zero 1 --max-seq
  memo plan --model 65b --machine a800x8 --tp 8 --cp 8 --nodes 8 --zero 1 --seq 1408K
  memo plan --model path/to/Llama-3.1-8B/config.json --seq 128K --machine h100x8 --tp 8
  memo plan --config my-cluster.toml --seq 512K --json";

/// The arguments of `memo plan`.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("{EXAMPLES}\n\n{}", exit::HELP))]
pub struct PlanArgs {
    #[command(flatten)]
    config: ConfigArgs,

    /// Plan only this strategy: memo, full-recompute, full-swap, keep-all
    #[arg(long, value_name = "NAME", value_parser = parse_strategy)]
    strategy: Option<Strategy>,

    /// Force memo's swap fraction alpha (0..1) instead of solving MEMO's LP
    #[arg(long, value_name = "ALPHA")]
    alpha: Option<f64>,

    /// Find the longest sequence each strategy fits (in steps of 1K tokens)
    #[arg(long)]
    max_seq: bool,

    /// Write the plan (needs --strategy) to this file
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,

    /// Search nodes of each placement problem
    #[arg(long, value_name = "N", default_value_t = PLAN_BUDGET_NODES)]
    budget_nodes: u64,

    /// The most memory planning may take (as estimated from the step's instructions and
    /// buffers before it is built); a larger step is refused with the size it would need
    #[arg(long, value_name = "BYTES", value_parser = crate::config::parse_bytes,
          default_value_t = planner::DEFAULT_PLAN_MEMORY_LIMIT, hide_default_value = true)]
    plan_memory: u64,

    /// Print JSON instead of the table
    #[arg(long)]
    json: bool,
}

fn parse_strategy(text: &str) -> Result<Strategy, String> {
    Strategy::from_name(text.trim()).ok_or_else(|| "expected memo, full-recompute, full-swap or keep-all".to_string())
}

/// One planned strategy, how long planning took, and what would make it fit (empty when it fits).
struct Planned {
    report: PlanReport,
    elapsed: Duration,
    remedies: Vec<String>,
}

/// Runs `memo plan`.
pub fn run(args: &PlanArgs) -> Result<(), Failure> {
    if args.max_seq {
        return run_max_seq(args);
    }
    let config = args.config.resolve()?;
    if args.output.is_some() && args.strategy.is_none() {
        return Err(Failure::new(
            exit::BAD_INPUT,
            "-o writes one plan: choose it with --strategy (e.g. --strategy memo)",
        ));
    }
    // ZeRO shards over the d x c ranks that share a tensor-parallel rank (d alone without context
    // parallelism); the file carries whole model state either way.
    let sharding_ranks = config.parallel.gradient_ranks();
    if args.output.is_some() && config.sharding.shards_optimizer_state() && sharding_ranks > 1 {
        let group = if config.parallel.context > 1 {
            format!("d x c = {} x {} = {sharding_ranks}", config.parallel.data, config.parallel.context)
        } else {
            format!("d = {}", config.parallel.data)
        };
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "-o with --zero {} at {group}: a plan file holds one tensor-parallel group's program with its whole \
                 model state (the format has no data-parallel sharding yet), so it would not be the plan shown; \
                 drop -o, or plan the file with --zero 0",
                config.sharding.stage(),
            ),
        ));
    }
    let strategies = match args.strategy {
        Some(strategy) => vec![strategy],
        None => Strategy::ALL.to_vec(),
    };
    let mut planned = Vec::new();
    let progress = progress::Reporter::start(crate::progress::after()?);
    let count = strategies.len();
    for (index, strategy) in strategies.into_iter().enumerate() {
        let forced_alpha = if strategy == Strategy::Memo { args.alpha } else { None };
        let request = PlanRequest {
            forced_alpha,
            budget_nodes: args.budget_nodes,
            memory_limit_bytes: args.plan_memory,
            ..request(&config, strategy)
        };
        let context = format!("strategy {} ({} of {count})", strategy.name(), index + 1);
        progress.context(context.clone());
        let started = Instant::now();
        let report =
            planner::plan_observed(&request, &mut progress.observer()).map_err(|e| strategy_failure(strategy, &e))?;
        let elapsed = started.elapsed();
        progress.detail(format!("check ({} instructions)", report.plan.instructions.len()));
        crate::checked::check(&report.plan)?;
        if !report.fits() {
            progress.context(format!("{context}, does not fit: searching the longest sequence that does"));
        }
        let remedies = planner::remedies_observed(&request, &report, &mut progress.observer());
        planned.push(Planned { report, elapsed, remedies });
    }
    // The progress lines end before the result.
    drop(progress);
    if let (Some(path), [one]) = (&args.output, planned.as_slice()) {
        let bytes = crate::checked::write_plan(path, &one.report.plan)?;
        eprintln!(
            "memo plan: wrote the {} plan to {} ({bytes} bytes)",
            one.report.plan.provenance.strategy.name(),
            path.display()
        );
    }
    let text = if args.json { json_text(&config, &planned) } else { table(&config, &planned) };
    write_stdout(&text)?;
    match (args.strategy, planned.as_slice()) {
        (Some(strategy), [one]) if !one.report.fits() => Err(Failure::new(
            exit::DOES_NOT_FIT,
            format!("the {} plan does not fit: {}", strategy.name(), one.remedies.join("; ")),
        )),
        (None, all) if !all.iter().any(|p| p.report.fits()) => Err(Failure::new(
            exit::NONE_FITS,
            format!(
                "no strategy fits {} tokens on {}: the table above says by how much and what would fit",
                config.model.seq_len, config.hardware.name,
            ),
        )),
        _ => Ok(()),
    }
}

/// A planner error for one strategy. The strategy is named apart from the message, so that `memo`
/// the strategy does not read as the `memo: ` prefix of every message.
fn strategy_failure(strategy: Strategy, error: &planner::PlanError) -> Failure {
    Failure::new(exit::BAD_INPUT, format!("cannot plan strategy {}: {error}", strategy.name()))
}

fn request(config: &Config, strategy: Strategy) -> PlanRequest {
    let request = PlanRequest::new(config.model.clone(), config.parallel, config.hardware.clone(), strategy);
    PlanRequest { interconnect: config.interconnect, nodes: config.nodes, sharding: config.sharding, ..request }
}

fn write_stdout(text: &str) -> Result<(), Failure> {
    io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write to standard output: {e}; is the pipe closed?")))
}

/// The alpha-bound name the JSON uses.
fn bound_name(bound: AlphaBound) -> &'static str {
    match bound {
        AlphaBound::Bandwidth => "bandwidth",
        AlphaBound::HostMemory => "host_memory",
        AlphaBound::None => "none",
        AlphaBound::Forced => "forced",
    }
}

/// Where a ring of the header's collectives runs: `across` (which nodes it spans) over the
/// network, with the link's figures, or inside the node.
fn ring_place(across: Option<&str>, link: &memo_plan_core::model::Interconnect) -> String {
    match across {
        Some(across) => format!(
            "{across}: the network, {:.0} GB/s per GPU per direction, {:.1} us per ring step",
            link.bytes_per_s as f64 / 1e9,
            link.latency_ns as f64 / 1e3
        ),
        None => "inside the node (its links)".to_string(),
    }
}

fn heading(config: &Config) -> String {
    let (m, p, h) = (&config.model, &config.parallel, &config.hardware);
    let interconnect = if p.tensor > 1 {
        let i = &config.interconnect;
        format!(
            "; interconnect {:.0} GB/s per direction, {:.1} us per ring step",
            i.bytes_per_s as f64 / 1e9,
            i.latency_ns as f64 / 1e3
        )
    } else {
        String::new()
    };
    let overridden = if config.machine_overrides.is_empty() { "" } else { " (overridden)" };
    let nodes = config.nodes.count;
    let place = if nodes == 1 { h.name.clone() } else { format!("{nodes} nodes of {}", h.name) };
    let line = format!(
        "{} ({}), {} tokens x {} sequence(s), t = {}, {}d = {}, on {place}{overridden}: {} per GPU, {} host per node \
         ({} per GPU)\n",
        m.name,
        m.shape_summary(),
        m.seq_len,
        m.micro_batch,
        p.tensor,
        if p.context > 1 { format!("c = {}, ", p.context) } else { String::new() },
        p.data,
        human::binary_units(h.device_memory_bytes),
        human::binary_units(h.host_memory_per_node_bytes),
        human::binary_units(h.host_memory_per_gpu_bytes()),
    );
    let mut text = match line.strip_suffix('\n') {
        Some(body) => format!("{body}{interconnect}\n"),
        None => line,
    };
    if p.context > 1 {
        let link = config.nodes.context_parallel_link(p, h, &config.interconnect);
        let place = ring_place(config.nodes.context_parallel_crosses_nodes(p, h).then_some("across nodes"), &link);
        text.push_str(&format!(
            "context parallel: c = {} ranks per sequence, {} tokens each (two chunks of {}), ring attention {place}\n",
            p.context,
            m.rank_seq_len(p),
            m.rank_seq_len(p) / 2,
        ));
    }
    if p.gradient_ranks() > 1 {
        let link = config.nodes.data_parallel_link(p, &config.interconnect);
        let across = format!("across {nodes} nodes");
        let place = ring_place(config.nodes.data_parallel_crosses_nodes(p).then_some(across.as_str()), &link);
        let ranks = if p.context > 1 {
            format!("d x c = {} x {} = {} ranks reduce the gradients", p.data, p.context, p.gradient_ranks())
        } else {
            format!("d = {} ranks per group", p.data)
        };
        text.push_str(&format!("data parallel: {ranks}, {place}; {}\n", config.sharding));
    }
    if !config.machine_overrides.is_empty() {
        let changes: Vec<String> = config.machine_overrides.iter().map(|o| o.text()).collect();
        text.push_str(&format!("machine {} overridden: {}\n", h.name, changes.join("; ")));
    }
    if let Some(line) = measured_rates_note(h, &config.machine_source) {
        text.push_str(&line);
        text.push('\n');
    }
    text
}

/// What the step estimate takes from the machine's measured kernel rates, in one line; `None`
/// when it has none.
fn measured_rates_note(hardware: &memo_plan_core::model::Hardware, source: &str) -> Option<String> {
    let rates = &hardware.measured_rates;
    if rates.is_empty() {
        return None;
    }
    let given: Vec<String> = rates
        .named()
        .iter()
        .filter_map(|(key, rate)| rate.map(|r| format!("{key} {}", crate::units::exact_decimal(r, "FLOP/s"))))
        .collect();
    let missing: Vec<&str> = rates.named().iter().filter(|(_, r)| r.is_none()).map(|(key, _)| *key).collect();
    let mut line = format!(
        "step (est.) uses the measured kernel rates of {source}: {} (attention launches and matrix products at \
         them; other launches at achieved_flops)",
        given.join(", ")
    );
    if !missing.is_empty() {
        line.push_str(&format!("; not measured, so at achieved_flops: {}", missing.join(", ")));
    }
    Some(line)
}

fn table(config: &Config, planned: &[Planned]) -> String {
    let mut out = heading(config);
    for p in planned {
        if let Some(swap) = &p.report.swap {
            if p.report.plan.provenance.strategy == Strategy::Memo {
                out.push_str(&format!("memo: {swap}\n"));
            }
        }
    }
    out.push('\n');
    out.push_str(&format!(
        "{:<15} {:>4} {:>11} {:>11} {:>11} {:>11} {:>11} {:>12} {:>9} {:>11} {:>9}\n",
        "strategy",
        "fits",
        "device",
        "arena LB",
        "params",
        "rounding",
        "host/GPU",
        "step (est.)",
        "collect.",
        "MFU (est.)",
        "plan"
    ));
    for p in planned {
        let r = &p.report;
        let t = &r.plan.totals;
        out.push_str(&format!(
            "{:<15} {:>4} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11.1}s {:>8.1}s {:>10.1}% {:>9}\n",
            r.plan.provenance.strategy.name(),
            if r.fits() { "yes" } else { "NO" },
            human::binary_units(r.device_bytes()),
            human::binary_units(r.arena_lower_bound_bytes()),
            human::binary_units(r.model_state_bytes()),
            human::binary_units(t.rounding_buffer_bytes),
            human::binary_units(t.host_bytes),
            r.step_time_s(),
            collective_s(r),
            r.mfu.causal_halved * 100.0,
            human::duration(p.elapsed),
        ));
    }
    out.push_str(ESTIMATES_NOTE);
    for p in planned {
        let r = &p.report;
        let prov = &r.plan.provenance;
        let level = |s: &memo_plan_core::plan::PlacementSummary| {
            if s.peak_bytes == s.lower_bound_bytes {
                format!("{} (= lower bound)", human::binary_units(s.peak_bytes))
            } else {
                format!(
                    "{} (lower bound {}, {} above: {})",
                    human::binary_units(s.peak_bytes),
                    human::binary_units(s.lower_bound_bytes),
                    human::binary_units(s.peak_bytes - s.lower_bound_bytes),
                    if s.optimal { "proven optimal" } else { "not proven optimal" }
                )
            }
        };
        out.push_str(&format!(
            "{}: level 1 forward {}, backward {}; level 2 {}",
            prov.strategy.name(),
            level(&prov.level1_forward),
            level(&prov.level1_backward),
            level(&prov.level2),
        ));
        if r.data_parallel.saved_bytes > 0 {
            out.push_str(&format!(
                " (the plan's, with its whole model state; sharding over d takes {} off every figure of the table)",
                human::binary_units(r.data_parallel.saved_bytes)
            ));
        }
        let gap = r.plan.totals.arena_bytes.saturating_sub(r.plan.totals.arena_lower_bound_bytes);
        let padding = alignment_padding(&r.plan);
        if gap > padding {
            out.push_str(&format!(
                "; the arena is {} above the live-bytes bound of the whole step: each level-1 block reserves \
                 its peak over its whole span",
                human::binary_units(gap)
            ));
        } else if gap > 0 {
            out.push_str(&format!(
                "; the arena is {} above the live-bytes bound of the whole step: the 256-byte alignment of \
                 small buffers",
                human::binary_units(gap)
            ));
        }
        out.push('\n');
        for remedy in &p.remedies {
            out.push_str(&format!("  does not fit: {remedy}\n"));
        }
    }
    out
}

/// The line under the headline table: which figures are the cost model's, and what they count.
pub const ESTIMATES_NOTE: &str = "
Estimates, not measurements: step, collect. and MFU come from the cost model (spec/cost-model.md), not
from a GPU. MFU: model FLOPs over the estimated step, attention halved for the causal mask, recompute
excluded (--json adds mfu_full, attention counted in full). collect.: seconds the collectives take on
the collective stream (ring time over the interconnect; the compute stream waits for each), and with
d > 1 the data-parallel gradient reduction and parameter all-gather after the backward, with c > 1
the ring attention's transfers that the attention does not hide.
";

/// Seconds the step's collectives take: the plan's on the collective stream, and the
/// data-parallel ones after it.
fn collective_s(report: &PlanReport) -> f64 {
    report.timeline.stream_busy_s(&report.plan, memo_plan_core::plan::Stream::Collective)
        + report.context_parallel.exposed_s()
        + report.data_parallel.time.total_s()
}

/// Bytes lost to rounding device buffers up to the placement alignment.
fn alignment_padding(plan: &memo_plan_core::plan::Plan) -> u64 {
    let align = memo_plan_core::bilevel::ALIGNMENT;
    plan.buffers
        .iter()
        .filter(|b| matches!(b.place, memo_plan_core::plan::Place::Device { .. }))
        .filter_map(|b| b.bytes())
        .map(|bytes| bytes.div_ceil(align) * align - bytes)
        .sum()
}

/// `{attention_forward_flops, attention_backward_flops, gemm_flops}` (FLOP/s, `null` for one not
/// measured) when the step was timed with the machine's measured kernel rates, else `null`.
fn measured_rates_json(hardware: &memo_plan_core::model::Hardware) -> Value {
    let rates = &hardware.measured_rates;
    if rates.is_empty() {
        return Value::Null;
    }
    Value::Object(rates.named().iter().map(|(key, rate)| (key.to_string(), json!(rate))).collect())
}

/// The JSON object of one plan (`spec/cost-model.md` lists the fields).
pub fn plan_json(config: &Config, planned_report: &PlanReport, elapsed: Duration, remedies: &[String]) -> Value {
    let r = planned_report;
    let prov = &r.plan.provenance;
    let t = &r.plan.totals;
    let skeletal = config.model.skeletal_set(&config.parallel).map(|s| s.total_bytes).unwrap_or(0);
    let summary = |s: &memo_plan_core::plan::PlacementSummary| {
        json!({"buffers": s.buffers, "peak_bytes": s.peak_bytes, "lower_bound_bytes": s.lower_bound_bytes,
               "optimal": s.optimal, "nodes": s.nodes})
    };
    let mut value = json!({
        "strategy": prov.strategy.name(),
        "model": config.model.name,
        "seq_len": config.model.seq_len,
        "micro_batch": config.model.micro_batch,
        "tensor_parallel": config.parallel.tensor,
        "data_parallel": config.parallel.data,
        "context_parallel": config.parallel.context,
        "machine": config.hardware.name,
        "machine_overrides": config.machine_overrides.iter().map(|o| json!({"field": o.field, "preset": o.preset,
            "value": o.value})).collect::<Vec<_>>(),
        "alpha": prov.alpha,
        "alpha_bound": bound_name(prov.alpha_bound),
        "swapped_rows": prov.swapped_rows,
        "device_bytes": r.device_bytes(),
        "arena_bytes": t.arena_bytes,
        "parameter_bytes": r.model_state_bytes(),
        "rounding_buffer_bytes": t.rounding_buffer_bytes,
        "arena_lower_bound_bytes": r.arena_lower_bound_bytes(),
        "host_bytes": t.host_bytes,
        "skeletal_bytes_per_layer": skeletal,
        "step_time_s": r.step_time_s(),
        "measured_rates": measured_rates_json(&config.hardware),
        "compute_stall_s": r.timeline.compute_stall_s(),
        "collective_s": collective_s(r),
        "collectives": r.plan.instructions.iter().filter(|i| i.stream == memo_plan_core::plan::Stream::Collective
            && matches!(i.action, memo_plan_core::plan::Action::Launch(_))).count(),
        "interconnect_bytes_per_s": prov.interconnect.bytes_per_s,
        "interconnect_latency_ns": prov.interconnect.latency_ns,
        "mfu_causal": r.mfu.causal_halved,
        "mfu_full": r.mfu.full,
        "fits": r.fits(),
        "device_excess_bytes": r.misfit.as_ref().map_or(0, |m| m.device_excess_bytes),
        "host_excess_bytes": r.misfit.as_ref().map_or(0, |m| m.host_excess_bytes),
        "remedies": remedies,
        "level1_forward": summary(&prov.level1_forward),
        "level1_backward": summary(&prov.level1_backward),
        "level2": summary(&prov.level2),
        "buffers": r.plan.buffers.len(),
        "instructions": r.plan.instructions.len(),
        "plan_time_ms": human::millis(elapsed),
    });
    // The data-parallel layout and what it changes (`spec/cost-model.md` section 8).
    let dp = &r.data_parallel;
    let extra = [
        ("nodes", json!(config.nodes.count)),
        ("zero", json!(config.sharding.stage())),
        ("plan_parameter_bytes", json!(t.parameter_bytes)),
        ("sharded_away_bytes", json!(dp.saved_bytes)),
        ("data_parallel_across_nodes", json!(dp.across_nodes)),
        (
            "data_parallel_s",
            json!({"reduce_gradients": dp.time.reduce_gradients_s,
            "gather_parameters": dp.time.gather_parameters_s}),
        ),
        (
            "context_parallel_s",
            json!({"ring_kv_bytes": r.context_parallel.kv_bytes,
            "forward_transfer": r.context_parallel.forward_transfer_s,
            "forward_chunk": r.context_parallel.forward_chunk_s,
            "backward_transfer": r.context_parallel.backward_transfer_s,
            "backward_chunk": r.context_parallel.backward_chunk_s,
            "exposed": r.context_parallel.exposed_s()}),
        ),
        ("network_bytes_per_s", json!(config.nodes.network.bytes_per_s)),
        ("network_latency_ns", json!(config.nodes.network.latency_ns)),
    ];
    if let Value::Object(fields) = &mut value {
        fields.extend(extra.into_iter().map(|(key, v)| (key.to_string(), v)));
    }
    value
}

fn json_text(config: &Config, planned: &[Planned]) -> String {
    let value = match planned {
        [one] => plan_json(config, &one.report, one.elapsed, &one.remedies),
        many => json!({"strategies": many.iter().map(|p| plan_json(config, &p.report, p.elapsed, &p.remedies))
            .collect::<Vec<_>>()}),
    };
    format!("{value}\n")
}

/// What stops a length, in words: `1306K: device +1.2 GiB (kept: fc1_out 4.0 GiB; largest buffer:
/// partial_sum 1.1 GiB)`, the host's likewise.
fn limit_text(limit: &planner::SequenceLimit) -> String {
    let tensor = |what: &str, t: Option<(memo_plan_core::plan::TensorRole, u64)>| {
        t.map(|(role, bytes)| format!("{what} {} {}", role.name(), human::binary_units(bytes)))
    };
    let mut text = format!("{}K:", limit.seq_len >> 10);
    let Some(misfit) = &limit.misfit else {
        text.push_str(" too long to plan (a size past 64 bits)");
        return text;
    };
    if misfit.device_excess_bytes > 0 {
        let state = limit.model_state_bytes.map(|bytes| format!("model state {}", human::binary_units(bytes)));
        let parts: Vec<String> =
            [state, tensor("kept:", limit.device_kept), tensor("largest buffer:", limit.device_largest)]
                .into_iter()
                .flatten()
                .collect();
        text.push_str(&format!(" device +{} ({})", human::binary_units(misfit.device_excess_bytes), parts.join("; ")));
    }
    if misfit.host_excess_bytes > 0 {
        let parts: Vec<String> = [tensor("swapped:", limit.host_kept)].into_iter().flatten().collect();
        text.push_str(&format!(" host +{} ({})", human::binary_units(misfit.host_excess_bytes), parts.join("; ")));
    }
    text
}

fn run_max_seq(args: &PlanArgs) -> Result<(), Failure> {
    let mut config_args = args.config.clone();
    // The search sets the length itself; a given one is only a starting shape.
    config_args.seq.get_or_insert(1 << 10);
    let config = config_args.resolve()?;
    if args.output.is_some() {
        return Err(Failure::new(exit::BAD_INPUT, "--max-seq writes no plan file: drop -o"));
    }
    let granularity = planner::max_seq_granularity(config.parallel.seq_len_multiple());
    let strategies = match args.strategy {
        Some(strategy) => vec![strategy],
        None => Strategy::ALL.to_vec(),
    };
    let mut found: Vec<(MaxSequence, Duration)> = Vec::new();
    let progress = progress::Reporter::start(crate::progress::after()?);
    let count = strategies.len();
    for (index, strategy) in strategies.into_iter().enumerate() {
        let forced_alpha = if strategy == Strategy::Memo { args.alpha } else { None };
        let request = PlanRequest {
            forced_alpha,
            budget_nodes: args.budget_nodes,
            memory_limit_bytes: args.plan_memory,
            ..request(&config, strategy)
        };
        progress.context(format!("--max-seq, strategy {} ({} of {count})", strategy.name(), index + 1));
        let started = Instant::now();
        let result = planner::longest_sequence_observed(&request, &mut progress.observer())
            .map_err(|e| strategy_failure(strategy, &e))?;
        if let Some(report) = &result.report {
            progress.detail(format!(
                "check of the plan at {} tokens ({} instructions)",
                report.plan.provenance.model.seq_len,
                report.plan.instructions.len()
            ));
            crate::checked::check(&report.plan)?;
        }
        found.push((result, started.elapsed()));
    }
    drop(progress);
    let text = if args.json {
        let rows: Vec<Value> = found
            .iter()
            .map(|(m, elapsed)| {
                json!({
                    "strategy": m.strategy.name(),
                    "max_seq_len": m.seq_len,
                    "plans_made": m.plans_made,
                    "search_time_ms": human::millis(*elapsed),
                    "limit": m.limit.as_ref().map(|l| json!({
                        "seq_len": l.seq_len,
                        "device_excess_bytes": l.misfit.as_ref().map(|f| f.device_excess_bytes),
                        "host_excess_bytes": l.misfit.as_ref().map(|f| f.host_excess_bytes),
                        "device_kept": l.device_kept.map(|(role, bytes)| json!({"role": role.name(), "bytes": bytes})),
                        "device_largest_buffer":
                            l.device_largest.map(|(role, bytes)| json!({"role": role.name(), "bytes": bytes})),
                        "host_kept": l.host_kept.map(|(role, bytes)| json!({"role": role.name(), "bytes": bytes})),
                        "model_state_bytes": l.model_state_bytes,
                    })),
                    "plan": m.report.as_ref().map(|r| {
                        let mut c = config.clone();
                        c.model.seq_len = r.plan.provenance.model.seq_len;
                        plan_json(&c, r, Duration::ZERO, &[])
                    }),
                })
            })
            .collect();
        format!("{}\n", json!({ "granularity": granularity, "max_seq": rows }))
    } else {
        let p = &config.parallel;
        let mut out = heading(&config).replacen(&format!("{} tokens", config.model.seq_len), "longest sequence", 1);
        if p.context > 1 {
            // The rank's tokens of the header's default length say nothing here: name the share.
            let rank = config.model.rank_seq_len(p);
            out = out.replacen(
                &format!("{rank} tokens each (two chunks of {})", rank / 2),
                &format!("s / {} tokens each (two chunks of s / {})", p.context, 2 * p.context),
                1,
            );
        }
        out.push_str(&format!(
            "\n{:<15} {:>12} {:>8} {:>11} {:>11} {:>12} {:>11} {:>9}\n",
            "strategy", "max tokens", "(K)", "device", "host/GPU", "step (est.)", "MFU (est.)", "search"
        ));
        for (m, elapsed) in &found {
            match (&m.seq_len, &m.report) {
                (Some(tokens), Some(r)) => out.push_str(&format!(
                    "{:<15} {:>12} {:>7}K {:>11} {:>11} {:>11.1}s {:>10.1}% {:>9}\n",
                    m.strategy.name(),
                    tokens,
                    tokens >> 10,
                    human::binary_units(r.device_bytes()),
                    human::binary_units(r.plan.totals.host_bytes),
                    r.step_time_s(),
                    r.mfu.causal_halved * 100.0,
                    human::duration(*elapsed),
                )),
                _ => out.push_str(&format!(
                    "{:<15} {:>12}   (not even {granularity} tokens fit)\n",
                    m.strategy.name(),
                    "none"
                )),
            }
        }
        out.push_str("\nWhat stops the next length:\n");
        for (m, _) in &found {
            if let Some(limit) = &m.limit {
                out.push_str(&format!("  {:<15} {}\n", m.strategy.name(), limit_text(limit)));
            }
        }
        out.push_str(&format!("\nSearched multiples of {granularity} tokens up to {}.\n", planner::MAX_SEQ_LIMIT));
        out.push_str("Step and MFU are the cost model's estimates (spec/cost-model.md), not measurements.\n");
        out
    };
    write_stdout(&text)?;
    if found.iter().all(|(m, _)| m.seq_len.is_none()) {
        let which = match args.strategy {
            Some(strategy) => format!("strategy {}", strategy.name()),
            None => "strategy".to_string(),
        };
        return Err(Failure::new(
            exit::NONE_FITS,
            format!(
                "no {which} fits any length on {}, not even {granularity} tokens: the table above says what \
                 stops each",
                config.hardware.name,
            ),
        ));
    }
    Ok(())
}
