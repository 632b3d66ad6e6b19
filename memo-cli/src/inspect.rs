//! `memo check` and `memo show`: read a plan file, verify it with the independent checker, and
//! report on it.

use std::io::{self, Write};
use std::path::PathBuf;

use memo_plan_core::check::plan::check_plan;
use memo_plan_core::cost;
use memo_plan_core::plan::{Action, BufferKind, Plan, Stream};
use memo_plan_core::simulate;
use serde_json::{json, Value};

use crate::checked;
use crate::exit::{self, Failure};
use crate::human;
use crate::picture::{self, XAxis};

const CHECK_EXAMPLES: &str = "\
Examples:
  memo plan --model 7b --seq 1M --machine a800x8 --tp 8 --strategy memo -o plan.memo
  memo check plan.memo";

/// The arguments of `memo check`.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("{CHECK_EXAMPLES}\n\n{}", exit::HELP))]
pub struct CheckArgs {
    /// The plan file
    #[arg(value_name = "PLAN")]
    plan: PathBuf,

    /// Print one JSON object instead of text
    #[arg(long)]
    json: bool,
}

const SHOW_EXAMPLES: &str = "\
Examples:
  memo show plan.memo
  memo show plan.memo --json
  memo show plan.memo --dump-json > plan.json
  memo show plan.memo --svg memory.svg                       # the arena over the step
  memo show plan.memo --svg memory.svg --x time              # ... over simulated time
  memo show keep-all.memo --svg compare.svg --compare memo.memo
  memo show plan.memo --chrome-trace trace.json              # open in ui.perfetto.dev

The SVG shows the device arena (x: instruction or simulated time, y: address; one rectangle per
buffer over its live range, coloured by kind; the arena size and the lower bound as lines) above
the live bytes. The Chrome trace is the cost model's timeline of the four streams.";

/// The arguments of `memo show`.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("{SHOW_EXAMPLES}\n\n{}", exit::HELP))]
pub struct ShowArgs {
    /// The plan file
    #[arg(value_name = "PLAN")]
    plan: PathBuf,

    /// Print the summary as one JSON object
    #[arg(long, conflicts_with = "dump_json")]
    json: bool,

    /// Print the whole plan (buffers, instructions) as JSON
    #[arg(long)]
    dump_json: bool,

    /// Write the memory timeline of the device arena as SVG to this file
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,

    /// The SVG's x axis: instruction index (default) or simulated time
    #[arg(long = "x", value_name = "AXIS", value_enum, requires = "svg")]
    x_axis: Option<XAxis>,

    /// Draw this second plan beside the first in the SVG, on the same byte scale
    #[arg(long, value_name = "OTHER_PLAN", requires = "svg")]
    compare: Option<PathBuf>,

    /// Write the simulated timeline of the four streams as Chrome trace-event JSON to this file
    #[arg(long, value_name = "FILE")]
    chrome_trace: Option<PathBuf>,
}

fn write_stdout(text: &str) -> Result<(), Failure> {
    io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write to standard output: {e}; is the pipe closed?")))
}

/// Runs `memo check`: every violation on its own line, exit 6 if there is any.
pub fn run_check(args: &CheckArgs) -> Result<(), Failure> {
    let plan = checked::read_plan(&args.plan)?;
    let name = args.plan.display().to_string();
    let violations = check_plan(&plan).err().unwrap_or_default();
    let text = if args.json {
        let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
        format!(
            "{}\n",
            json!({"plan": name, "valid": violations.is_empty(), "buffers": plan.buffers.len(),
                   "instructions": plan.instructions.len(), "events": plan.events, "violations": list})
        )
    } else if violations.is_empty() {
        format!(
            "{name}: valid ({} plan, {} buffers, {} instructions, {} events; arena {}, host {})\n",
            plan.provenance.strategy.name(),
            plan.buffers.len(),
            plan.instructions.len(),
            plan.events,
            human::bytes(plan.totals.arena_bytes),
            human::bytes(plan.totals.host_bytes),
        )
    } else {
        let mut out = String::new();
        for violation in &violations {
            out.push_str(&format!("{name}: {violation}\n"));
        }
        out
    };
    write_stdout(&text)?;
    if violations.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            exit::PLAN_INVALID,
            format!("{name}: {} violation(s) of the plan rules (spec/validity.md)", violations.len()),
        ))
    }
}

/// Runs `memo show`.
pub fn run_show(args: &ShowArgs) -> Result<(), Failure> {
    let plan = checked::read_plan(&args.plan)?;
    let name = args.plan.display().to_string();
    if let Err(violations) = check_plan(&plan) {
        return Err(Failure::new(
            exit::PLAN_INVALID,
            format!("{name}: the plan violates {} rule(s); `memo check {name}` lists them", violations.len()),
        ));
    }
    let written = write_pictures(args, &plan, &name)?;
    if args.dump_json {
        return write_stdout(&format!("{}\n", plan.to_json()));
    }
    let mut summary = summarise(&plan)?;
    for (key, line, value) in written {
        summary.text.push_str(&line);
        summary.json[key] = value;
    }
    let text = if args.json { format!("{}\n", summary.json) } else { summary.text };
    write_stdout(&text)
}

/// Writes the files `--svg` and `--chrome-trace` ask for; returns, for each, its JSON key, a line
/// for the text summary and a JSON value.
fn write_pictures(args: &ShowArgs, plan: &Plan, name: &str) -> Result<Vec<(&'static str, String, Value)>, Failure> {
    let mut written = Vec::new();
    if let Some(path) = &args.svg {
        let other = match &args.compare {
            Some(other_path) => {
                let other = checked::read_plan(other_path)?;
                let other_name = other_path.display().to_string();
                if let Err(violations) = check_plan(&other) {
                    return Err(Failure::new(
                        exit::PLAN_INVALID,
                        format!(
                            "{other_name} (--compare): the plan violates {} rule(s); `memo check {other_name}` lists them",
                            violations.len()
                        ),
                    ));
                }
                Some((other_name, other))
            }
            None => None,
        };
        let mut plans = vec![(name, plan)];
        if let Some((other_name, other)) = &other {
            plans.push((other_name.as_str(), other));
        }
        let rendered = picture::plan_svg(&plans, args.x_axis.unwrap_or(XAxis::Index))?;
        picture::write_file(path, &rendered.svg, "SVG")?;
        let shown = path.display().to_string();
        written.push((
            "svg",
            format!(
                "wrote {shown}: {} rectangles ({} buffers merged into strips, {} too small to draw), {}\n",
                rendered.rectangles,
                rendered.merged_buffers,
                rendered.skipped_buffers,
                human::binary_units(rendered.svg.len() as u64)
            ),
            json!({"path": shown, "bytes": rendered.svg.len(), "rectangles": rendered.rectangles,
                   "merged_buffers": rendered.merged_buffers, "skipped_buffers": rendered.skipped_buffers}),
        ));
    }
    if let Some(path) = &args.chrome_trace {
        let text = picture::chrome_trace::chrome_trace(plan, name).map_err(|e| Failure::new(exit::BAD_INPUT, e))?;
        picture::write_file(path, &text, "Chrome trace")?;
        let shown = path.display().to_string();
        written.push((
            "chrome_trace",
            format!(
                "wrote {shown}: the simulated timeline as Chrome trace events, {} (open it in ui.perfetto.dev or chrome://tracing)\n",
                human::binary_units(text.len() as u64)
            ),
            json!({"path": shown, "bytes": text.len()}),
        ));
    }
    Ok(written)
}

struct Summary {
    text: String,
    json: Value,
}

/// The buffers of one kind: how many, the most bytes live at once, and their sizes added up.
struct KindBytes {
    kind: BufferKind,
    buffers: u64,
    /// The most bytes of this kind live at one instruction (live ranges as in `spec/validity.md`).
    peak_live_bytes: u64,
    /// Every buffer's size, added up over the step (saturating).
    summed_bytes: u64,
}

/// Each kind that has buffers, in `BufferKind::ALL`'s order. A 7B step at 128K tokens has 761
/// transient buffers summing to 399 GiB, of which 1.67 GiB is live at once: only the peak compares
/// with the arena.
fn bytes_by_kind(plan: &Plan) -> Vec<KindBytes> {
    let ranges = crate::picture::plan::live_ranges(plan);
    let steps = plan.instructions.len();
    let mut out = Vec::new();
    for kind in BufferKind::ALL {
        let mut buffers = 0u64;
        let mut summed = 0u64;
        let mut delta = vec![0i128; steps + 1];
        for (buffer, range) in plan.buffers.iter().zip(&ranges).filter(|(b, _)| b.kind == kind) {
            let bytes = buffer.bytes().unwrap_or(u64::MAX);
            buffers += 1;
            summed = summed.saturating_add(bytes);
            if let Some((first, last)) = *range {
                delta[first] += i128::from(bytes);
                delta[(last + 1).min(steps)] -= i128::from(bytes);
            }
        }
        if buffers == 0 {
            continue;
        }
        let (mut live, mut peak) = (0i128, 0i128);
        for change in &delta {
            live += change;
            peak = peak.max(live);
        }
        let peak_live_bytes = u64::try_from(peak).unwrap_or(u64::MAX);
        out.push(KindBytes { kind, buffers, peak_live_bytes, summed_bytes: summed });
    }
    out
}

fn summarise(plan: &Plan) -> Result<Summary, Failure> {
    let p = &plan.provenance;
    let t = &plan.totals;
    let timeline = simulate::simulate(plan).map_err(|e| Failure::new(exit::BAD_INPUT, format!("cost model: {e}")))?;
    let mfu = cost::mfu(&p.model, &p.parallel, &p.hardware, timeline.step_time_s.max(f64::MIN_POSITIVE))
        .map_err(|e| Failure::new(exit::BAD_INPUT, format!("cost model: {e}")))?;
    let by_kind = bytes_by_kind(plan);
    let mut per_stream = [[0u64; 4]; Stream::ALL.len()];
    for instruction in &plan.instructions {
        let column = match instruction.action {
            Action::Launch(_) => 0,
            Action::Copy { .. } => 1,
            Action::Record(_) => 2,
            Action::Wait(_) => 3,
        };
        per_stream[instruction.stream.index()][column] += 1;
    }
    let mut text = format!(
        "{} plan: {} ({}), {} tokens x {}, t = {}, d = {}, on {}\n",
        p.strategy.name(),
        p.model.name,
        p.model.shape_summary(),
        p.model.seq_len,
        p.model.micro_batch,
        p.parallel.tensor,
        p.parallel.data,
        p.hardware.name
    );
    if p.parallel.context > 1 {
        // spec/context-parallel.md: one program per context rank; the counts below are context
        // rank 0's (the others differ only in the ring attention's row ranges).
        text.push_str(&format!(
            "context parallel: c = {} ranks per sequence, one program each ({} rank program(s) besides the shared \
             one); the counts below are context rank 0's\n",
            p.parallel.context,
            plan.rank_programs.len()
        ));
    }
    text.push_str(&format!("{}\n", p.swap_summary()));
    text.push_str(&format!(
        "device arena {} (lower bound {}); host slab {}; GPU memory {}\n",
        human::bytes(t.arena_bytes),
        human::bytes(t.arena_lower_bound_bytes),
        human::bytes(t.host_bytes),
        human::bytes(p.hardware.device_memory_bytes)
    ));
    text.push_str(
        "buffers by kind (peak live: the most bytes of the kind live at once; summed: every buffer's size added \
         up over the step, each counted once however briefly it lives):\n",
    );
    text.push_str(&format!("  {:<16} {:>7} {:>12} {:>12}\n", "kind", "buffers", "peak live", "summed"));
    for k in &by_kind {
        text.push_str(&format!(
            "  {:<16} {:>7} {:>12} {:>12}\n",
            k.kind.name(),
            k.buffers,
            human::binary_units(k.peak_live_bytes),
            human::binary_units(k.summed_bytes)
        ));
    }
    text.push_str("instructions (launch / copy / record / wait):\n");
    for stream in Stream::ALL {
        let c = per_stream[stream.index()];
        text.push_str(&format!("  {:<8} {:>6} {:>6} {:>6} {:>6}\n", stream.name(), c[0], c[1], c[2], c[3]));
    }
    for (label, s) in
        [("level 1 forward", &p.level1_forward), ("level 1 backward", &p.level1_backward), ("level 2", &p.level2)]
    {
        text.push_str(&format!(
            "{label}: {} requests, peak {}, lower bound {}, {}\n",
            s.buffers,
            human::binary_units(s.peak_bytes),
            human::binary_units(s.lower_bound_bytes),
            if s.optimal { "optimal" } else { "not proven optimal" }
        ));
    }
    let collective_s = timeline.stream_busy_s(plan, Stream::Collective);
    text.push_str(&format!(
        "simulated step {:.3} s (compute busy {:.3} s, waiting {:.3} s; d2h busy {:.3} s; h2d busy {:.3} s; \
         collective busy {:.3} s)\n{}\n",
        timeline.step_time_s,
        timeline.busy_s[0],
        timeline.compute_stall_s(),
        timeline.busy_s[1],
        timeline.busy_s[2],
        collective_s,
        mfu
    ));
    let json = json!({
        "strategy": p.strategy.name(),
        "model": p.model.name,
        "seq_len": p.model.seq_len,
        "machine": p.hardware.name,
        "alpha": p.alpha,
        "swapped_rows": p.swapped_rows,
        "arena_bytes": t.arena_bytes,
        "arena_lower_bound_bytes": t.arena_lower_bound_bytes,
        "host_bytes": t.host_bytes,
        "parameter_bytes": t.parameter_bytes,
        "rounding_buffer_bytes": t.rounding_buffer_bytes,
        "buffers": plan.buffers.len(),
        "instructions": plan.instructions.len(),
        "events": plan.events,
        "bytes_by_kind": by_kind.iter().map(|k| json!({"kind": k.kind.name(), "buffers": k.buffers,
            "peak_live_bytes": k.peak_live_bytes, "summed_bytes": k.summed_bytes})).collect::<Vec<_>>(),
        "step_time_s": timeline.step_time_s,
        "compute_stall_s": timeline.compute_stall_s(),
        "collective_s": collective_s,
        "mfu_causal": mfu.causal_halved,
        "mfu_full": mfu.full,
    });
    Ok(Summary { text, json })
}
