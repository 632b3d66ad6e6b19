//! The memory timeline of a plan (`memo show --svg`): every device buffer over its live range,
//! coloured by kind, with the live bytes below.
//!
//! Live ranges are recomputed here from the plan alone, by the rule of `spec/validity.md`:
//! instruction indices, both ends included; parameters, gradients, optimizer state and scalars
//! over the whole step; an input from instruction 0 to its last touch; every other buffer from its
//! first touch to its last; an untouched buffer that holds nothing before the step is unused and
//! not drawn. The maximum of the live bytes is then the plan's `arena_lower_bound_bytes` (a test
//! holds the two to each other).

use memo_plan_core::bilevel::persists_across_steps;
use memo_plan_core::plan::{Action, BufferKind, Place, Plan};
use memo_plan_core::simulate;

use super::axis;
use super::figure::{Block, Class, Column, Figure, Level, LevelStyle, LiveStep};

/// What the x axis measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XAxis {
    /// Instruction index, in issue order (the order live ranges are defined in).
    Index,
    /// Simulated time of the cost model (`spec/cost-model.md` section 7), in seconds.
    Time,
}

/// The device kinds in drawing order: bottom of the live-bytes stack first.
pub const KINDS: [(BufferKind, &str, &str); 9] = [
    (BufferKind::OptimizerState, "optimizer state", "#1f3f7a"),
    (BufferKind::Gradient, "gradient", "#7fb2e5"),
    (BufferKind::Parameter, "parameter", "#3d7cc9"),
    (BufferKind::Scalar, "scalar", "#7f7f7f"),
    (BufferKind::Input, "input (tokens, targets)", "#e6c229"),
    (BufferKind::RoundingBuffer, "rounding buffer", "#e08a1e"),
    (BufferKind::Skeletal, "skeletal (kept)", "#d1495b"),
    (BufferKind::CrossLayer, "cross-layer", "#8e5ea2"),
    (BufferKind::Transient, "transient", "#2a9d8f"),
];

/// The colour class of a device buffer's kind; `None` for host slots (not in the arena).
pub fn class_of(kind: BufferKind) -> Option<usize> {
    KINDS.iter().position(|(k, _, _)| *k == kind)
}

fn classes() -> Vec<Class> {
    KINDS.iter().map(|(_, name, colour)| Class { name: (*name).to_string(), colour }).collect()
}

/// Each buffer's live range `[first, last]` in instruction indices (both included), by the rule of
/// `spec/validity.md`; `None` for unused buffers and for every buffer of a plan without
/// instructions.
pub fn live_ranges(plan: &Plan) -> Vec<Option<(usize, usize)>> {
    let none = || vec![None; plan.buffers.len()];
    if plan.instructions.is_empty() {
        return none();
    }
    // The planner's own computation of the same rule; its ranges are half-open.
    match memo_plan_core::bilevel::live_ranges(&plan.buffers, &plan.instructions) {
        Ok(ranges) => ranges.into_iter().map(|r| r.map(|(first, end)| (first as usize, end as usize - 1))).collect(),
        // More than 2^32 - 1 instructions: no plan file can hold that many (u32 counts).
        Err(_) => none(),
    }
}

/// The device buffers' live bytes at each instruction, per class of [`KINDS`].
pub fn live_bytes_by_instruction(plan: &Plan) -> Vec<[u64; 9]> {
    let steps = plan.instructions.len();
    let mut delta = vec![[0i128; 9]; steps + 1];
    for (range, buffer) in live_ranges(plan).into_iter().zip(&plan.buffers) {
        let (Some((first, last)), Place::Device { .. }, Some(class)) = (range, buffer.place, class_of(buffer.kind))
        else {
            continue;
        };
        let bytes = i128::from(buffer.bytes().unwrap_or(0));
        delta[first][class] += bytes;
        delta[last + 1][class] -= bytes;
    }
    let mut running = [0i128; 9];
    let mut live = Vec::with_capacity(steps);
    for row in delta.iter().take(steps) {
        let mut out = [0u64; 9];
        for class in 0..9 {
            running[class] += row[class];
            out[class] = u64::try_from(running[class].max(0)).unwrap_or(u64::MAX);
        }
        live.push(out);
    }
    live
}

/// One plan's column: blocks, live steps and lines; the x extent.
fn column(plan: &Plan, name: &str, x: XAxis, capacity_line: bool) -> Result<Column, String> {
    let ranges = live_ranges(plan);
    let totals = &plan.totals;
    let mut blocks = Vec::new();
    let (x_max, live) = match x {
        XAxis::Index => {
            for (index, (range, buffer)) in ranges.iter().zip(&plan.buffers).enumerate() {
                let (Some((first, last)), Place::Device { offset }, Some(class)) =
                    (*range, buffer.place, class_of(buffer.kind))
                else {
                    continue;
                };
                let bytes = buffer.bytes().unwrap_or(0);
                let title = format!(
                    "#{index} {buffer}: {} at {}, live over instructions {first}..={last}",
                    axis::bytes_label(bytes),
                    axis::bytes_label(offset)
                );
                blocks.push(Block {
                    x0: first as f64,
                    x1: (last + 1) as f64,
                    offset,
                    bytes,
                    class,
                    title,
                    label: String::new(),
                });
            }
            let live = live_bytes_by_instruction(plan)
                .into_iter()
                .enumerate()
                .map(|(i, by_class)| LiveStep { x0: i as f64, x1: (i + 1) as f64, by_class: by_class.to_vec() })
                .collect();
            (plan.instructions.len() as f64, live)
        }
        XAxis::Time => {
            let timeline =
                simulate::simulate(plan).map_err(|e| format!("the cost model cannot time this plan: {e}"))?;
            if timeline.step_time_s.is_nan() || timeline.step_time_s <= 0.0 {
                return Err(format!(
                    "{name}: the simulated step takes no time (no launch has FLOPs), so a time axis is empty; \
                     use --x index"
                ));
            }
            let intervals = time_intervals(plan, &ranges, &timeline);
            for (index, (interval, buffer)) in intervals.iter().zip(&plan.buffers).enumerate() {
                let (Some((start, end)), Place::Device { offset }, Some(class)) =
                    (*interval, buffer.place, class_of(buffer.kind))
                else {
                    continue;
                };
                let bytes = buffer.bytes().unwrap_or(0);
                let title = format!(
                    "#{index} {buffer}: {} at {}, in use {start:.4} s .. {end:.4} s",
                    axis::bytes_label(bytes),
                    axis::bytes_label(offset)
                );
                blocks.push(Block { x0: start, x1: end, offset, bytes, class, title, label: String::new() });
            }
            let classes_of: Vec<Option<usize>> = plan
                .buffers
                .iter()
                .map(|b| if matches!(b.place, Place::Device { .. }) { class_of(b.kind) } else { None })
                .collect();
            let live = live_over_time(plan, &intervals, &classes_of);
            (timeline.step_time_s, live)
        }
    };
    let mut levels = vec![
        Level { bytes: totals.arena_bytes, label: "arena".into(), style: LevelStyle::Peak },
        Level { bytes: totals.arena_lower_bound_bytes, label: "lower bound".into(), style: LevelStyle::LowerBound },
    ];
    if capacity_line {
        levels.push(Level {
            bytes: plan.provenance.hardware.device_memory_bytes,
            label: "GPU memory".into(),
            style: LevelStyle::Capacity,
        });
    }
    let live_levels = vec![Level {
        bytes: totals.arena_lower_bound_bytes,
        label: "lower bound = peak live".into(),
        style: LevelStyle::LivePeak,
    }];
    Ok(Column { heading: String::new(), x_max, blocks, live, levels, live_levels })
}

/// Per buffer, the simulated interval in seconds in which instructions use it: from the earliest
/// start to the latest end of the instructions that touch it; the whole step for kinds live over
/// the whole step; from 0 for inputs.
pub fn time_intervals(
    plan: &Plan,
    ranges: &[Option<(usize, usize)>],
    timeline: &simulate::Timeline,
) -> Vec<Option<(f64, f64)>> {
    let mut intervals: Vec<Option<(f64, f64)>> = vec![None; plan.buffers.len()];
    let mut touch = |buffer: usize, start: f64, end: f64| {
        if let Some(interval) = intervals.get_mut(buffer) {
            *interval = Some(interval.map_or((start, end), |(s, e)| (s.min(start), e.max(end))));
        }
    };
    for (instruction, span) in plan.instructions.iter().zip(&timeline.spans) {
        match &instruction.action {
            Action::Launch(launch) => {
                launch.args.iter().for_each(|arg| touch(arg.region.buffer.index(), span.start_s, span.end_s))
            }
            Action::Copy { src, dst, .. } => {
                touch(src.buffer.index(), span.start_s, span.end_s);
                touch(dst.buffer.index(), span.start_s, span.end_s);
            }
            Action::Record(_) | Action::Wait(_) => {}
        }
    }
    for ((interval, buffer), range) in intervals.iter_mut().zip(&plan.buffers).zip(ranges) {
        if range.is_none() {
            *interval = None;
        } else if persists_across_steps(buffer.kind) {
            *interval = Some((0.0, timeline.step_time_s));
        } else if buffer.kind == BufferKind::Input {
            *interval = Some((0.0, interval.map_or(0.0, |(_, end)| end)));
        }
    }
    intervals
}

/// Live bytes over time: a buffer in use over `[start, end)` counts from `start` until `end`; one
/// used only at an instant (`start == end`: launches without FLOPs take no time) counts at that
/// instant, which becomes a zero-width step.
pub fn live_over_time(plan: &Plan, intervals: &[Option<(f64, f64)>], classes: &[Option<usize>]) -> Vec<LiveStep> {
    let width = KINDS.len();
    // (time, kind: 0 = end of an interval, 1 = start, 2 = instant; class, bytes)
    // Intervals that end with the step (the model state) never end here: instants at the step's
    // last moment (the optimizer's launches take no time) still see them.
    let last = intervals.iter().flatten().map(|&(_, end)| end).fold(0.0, f64::max);
    let mut events: Vec<(f64, u8, usize, u64)> = Vec::new();
    for ((interval, buffer), class) in intervals.iter().zip(&plan.buffers).zip(classes) {
        let (Some((start, end)), Some(class)) = (*interval, *class) else { continue };
        let bytes = buffer.bytes().unwrap_or(0);
        if end > start {
            events.push((start, 1, class, bytes));
            if end < last {
                events.push((end, 0, class, bytes));
            }
        } else {
            events.push((start, 2, class, bytes));
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut live = vec![0u64; width];
    let mut steps = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let time = events[i].0;
        let mut instants = vec![0u64; width];
        while i < events.len() && events[i].0 == time {
            let (_, kind, class, bytes) = events[i];
            match kind {
                0 => live[class] = live[class].saturating_sub(bytes),
                1 => live[class] = live[class].saturating_add(bytes),
                _ => instants[class] = instants[class].saturating_add(bytes),
            }
            i += 1;
        }
        if instants.iter().any(|&b| b > 0) {
            let at: Vec<u64> = live.iter().zip(&instants).map(|(a, b)| a.saturating_add(*b)).collect();
            steps.push(LiveStep { x0: time, x1: time, by_class: at });
        }
        // After the last event nothing is live: no step.
        if let Some(next) = events.get(i).map(|e| e.0) {
            steps.push(LiveStep { x0: time, x1: next, by_class: live.clone() });
        }
    }
    steps
}

/// The figure of one plan, or of several side by side on one byte scale (`--compare`).
pub fn figure(plans: &[(&str, &Plan)], x: XAxis) -> Result<Figure, String> {
    let highest =
        plans.iter().map(|(_, p)| p.totals.arena_bytes.max(p.totals.arena_lower_bound_bytes)).max().unwrap_or(0);
    let mut columns = Vec::new();
    for (name, plan) in plans {
        // The GPU's memory is drawn when it is on the scale of the plans (not 80 GiB over a few MiB).
        let device = plan.provenance.hardware.device_memory_bytes;
        let capacity_line = device <= highest.saturating_mul(3) / 2;
        let mut column = column(plan, name, x, capacity_line)?;
        column.heading = heading(name, plan, plans.len() > 1);
        columns.push(column);
    }
    let same_setting = plans.windows(2).all(|w| setting(w[0].1) == setting(w[1].1));
    let title = match plans {
        [(_, plan)] => {
            format!("Device memory of one training step, {} plan: {}", plan.provenance.strategy.name(), setting(plan))
        }
        [(_, first), ..] if same_setting => format!("Device memory of one training step: {}", setting(first)),
        _ => "Device memory of one training step".to_string(),
    };
    let x_label = match x {
        XAxis::Index => "instruction (issue order)",
        XAxis::Time => "simulated time (s), cost model of spec/cost-model.md",
    };
    let mut notes = vec![match x {
        XAxis::Index => "A buffer is live from the first instruction touching it to the last; parameters, gradients, \
                         optimizer state and scalars over the whole step (spec/validity.md). Host slots are not drawn."
            .to_string(),
        XAxis::Time => "A buffer is drawn from the start of the first instruction touching it to the end of the last; \
                        launches without FLOPs (norms, GeLU, adds) take no time in the cost model. Host slots are not drawn."
            .to_string(),
    }];
    if plans.len() > 1 && !same_setting {
        notes.push("The plans are of different settings (see each heading); one byte scale for all.".to_string());
    }
    let classes = classes();
    let present = |kind: usize| {
        plans.iter().any(|(_, p)| {
            p.buffers.iter().any(|b| matches!(b.place, Place::Device { .. }) && class_of(b.kind) == Some(kind))
        })
    };
    let legend = classes.iter().enumerate().filter(|(k, _)| present(*k)).map(|(_, c)| c.clone()).collect();
    Ok(Figure {
        title,
        x_label: x_label.to_string(),
        y_label: "arena address".to_string(),
        classes: classes.clone(),
        live_classes: classes,
        legend,
        columns,
        notes,
    })
}

/// Model, sequence, layout and machine in a few words.
fn setting(plan: &Plan) -> String {
    let p = &plan.provenance;
    format!(
        "{} ({} layers), {} tokens x {}, t = {}, on {}",
        p.model.name, p.model.layers, p.model.seq_len, p.model.micro_batch, p.parallel.tensor, p.hardware.name
    )
}

fn heading(name: &str, plan: &Plan, with_name: bool) -> String {
    let t = &plan.totals;
    let mut text = format!(
        "{}: arena {}, lower bound {}",
        plan.provenance.strategy.name(),
        axis::bytes_label(t.arena_bytes),
        axis::bytes_label(t.arena_lower_bound_bytes)
    );
    if t.host_bytes > 0 {
        text.push_str(&format!(", host {}", axis::bytes_label(t.host_bytes)));
    }
    if with_name {
        // The file name alone: a long directory would push the figures apart.
        let file = std::path::Path::new(name).file_name().map_or(name.into(), |f| f.to_string_lossy());
        text.push_str(&format!(" ({file})"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use memo_plan_core::model::{Hardware, ModelConfig, Parallelism};
    use memo_plan_core::plan::Strategy;
    use memo_plan_core::planner::{self, PlanRequest};

    fn small_plan(strategy: Strategy) -> Plan {
        let mut model = ModelConfig::preset("7b", 1024, 1).unwrap();
        model.layers = 4;
        model.hidden = 256;
        (model.heads, model.kv_heads) = (4, 4);
        model.ffn_hidden = 1024;
        let request = PlanRequest::new(model, Parallelism::single(), Hardware::preset("a800x8").unwrap(), strategy);
        planner::plan(&request).unwrap().plan
    }

    /// The peak of the recomputed live bytes is the plan's own lower bound: the picture and the
    /// checker agree on what is live when.
    #[test]
    fn peak_live_bytes_equal_the_lower_bound() {
        for strategy in Strategy::ALL {
            let plan = small_plan(strategy);
            let peak = live_bytes_by_instruction(&plan).iter().map(|row| row.iter().sum::<u64>()).max().unwrap();
            assert_eq!(peak, plan.totals.arena_lower_bound_bytes, "{}", strategy.name());
        }
    }

    #[test]
    fn time_steps_are_ordered_and_always_hold_the_model_state() {
        let plan = small_plan(Strategy::Memo);
        let column = column(&plan, "p", XAxis::Time, false).unwrap();
        assert!(column.x_max > 0.0);
        assert!(column.live.windows(2).all(|w| w[0].x1 <= w[1].x0 + 1e-12 && w[0].x0 <= w[0].x1));
        let whole: u64 =
            plan.buffers.iter().filter(|b| persists_across_steps(b.kind)).map(|b| b.bytes().unwrap()).sum();
        assert!(column.live.iter().all(|s| s.by_class.iter().sum::<u64>() >= whole));
    }

    #[test]
    fn a_plan_without_instructions_has_no_live_ranges() {
        let mut plan = small_plan(Strategy::KeepAll);
        plan.instructions.clear();
        assert!(live_ranges(&plan).iter().all(Option::is_none));
        assert!(live_bytes_by_instruction(&plan).is_empty());
    }
}
