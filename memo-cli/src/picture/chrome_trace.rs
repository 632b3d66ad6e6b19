//! The cost model's simulated timeline of a plan as a Chrome trace-event file
//! (`memo show --chrome-trace`), which Perfetto (ui.perfetto.dev) and chrome://tracing open.
//!
//! The JSON object form: `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`,
//! one event per line. Process 0 is the GPU; threads 0, 1, 2 are the compute, device-to-host and
//! host-to-device streams (`thread_name` metadata). Each launch, copy and wait is a complete
//! (`"X"`) event with `ts` and `dur` in microseconds (whole nanoseconds), each record an instant
//! (`"i"`) event; a counter (`"C"`) track gives the device buffers' live bytes by kind over time.
//! Events are sorted by `ts` (stably, so each stream keeps its issue order). Names say what ran:
//! `layer 3 linear`, `recompute layer 3 layer_norm`, `copy layer 5 q (d2h)`, `wait e12`; `args`
//! carry the instruction index, bytes and FLOPs.

use memo_plan_core::plan::{Action, Buffer, BufferKind, Op, Place, Plan, Stream, TensorRole};
use memo_plan_core::simulate::{self, Timeline};
use serde_json::{json, Value};

use crate::picture::plan::{class_of, live_over_time, live_ranges, time_intervals, KINDS};

/// Whole nanoseconds (times and durations are differences of these, so rounding never reorders
/// the events of one stream nor makes a duration negative).
fn nanos(seconds: f64) -> u64 {
    (seconds * 1e9).round().max(0.0) as u64
}

/// Nanoseconds as the format's microseconds.
fn micros(nanos: u64) -> f64 {
    nanos as f64 / 1000.0
}

/// Whether a tensor is a gradient (of an activation or a parameter).
fn is_gradient(buffer: &Buffer) -> bool {
    use TensorRole as R;
    buffer.kind == BufferKind::Gradient
        || matches!(
            buffer.role,
            R::OutputGradient
                | R::InputNormOutputGradient
                | R::QueryGradient
                | R::KeyGradient
                | R::ValueGradient
                | R::AttentionOutputGradient
                | R::AttentionResidualGradient
                | R::PostAttentionNormOutputGradient
                | R::Fc1OutputGradient
                | R::GeluOutputGradient
                | R::NormInputGradient
                | R::FinalNormOutputGradient
                | R::EmbeddingOutputGradient
        )
}

/// The phase of each launch of a layer: backward when it is a backward op or touches a gradient,
/// or comes after its layer's backward began (the re-gathers of `t > 1`); recompute when it comes
/// after some layer's backward began but before its own; forward otherwise.
fn phases(plan: &Plan) -> Vec<&'static str> {
    // A set, not a vector indexed by layer: a plan file's layer numbers are not trusted sizes.
    let mut began = std::collections::BTreeSet::new();
    let mut any_began = false;
    let mut out = Vec::with_capacity(plan.instructions.len());
    for instruction in &plan.instructions {
        let Action::Launch(launch) = &instruction.action else {
            out.push("");
            continue;
        };
        let Some(layer) = launch.layer else {
            out.push("step");
            continue;
        };
        let touches_gradient = launch.args.iter().any(|arg| plan.buffer(arg.region.buffer).is_some_and(is_gradient));
        let phase = if is_backward(launch.op) || touches_gradient {
            began.insert(layer);
            any_began = true;
            "backward"
        } else if began.contains(&layer) {
            "backward"
        } else if any_began {
            "recompute"
        } else {
            "forward"
        };
        out.push(phase);
    }
    out
}

fn is_backward(op: Op) -> bool {
    matches!(
        op,
        Op::LinearBackwardInput
            | Op::LinearBackwardInputAccumulate
            | Op::LinearBackwardWeight
            | Op::GeluBackward
            | Op::LayerNormBackward
            | Op::AttentionBackward
    )
}

/// The trace file's text for `plan` (named `name` in the process title).
pub fn chrome_trace(plan: &Plan, name: &str) -> Result<String, String> {
    let timeline = simulate::simulate(plan).map_err(|e| format!("the cost model cannot time {name}: {e}"))?;
    let time_model =
        "spec/cost-model.md section 7: launches take FLOPs / rate (memory-bound ones 0), copies bytes / bandwidth, \
         collectives their ring time";
    Ok(trace_of(plan, name, &timeline, "memo show --chrome-trace", time_model))
}

/// The trace file's text for `plan` with the instruction times of `timeline` (simulated, or
/// measured by a backend), labelled with the command that made it and where the times come from.
pub fn trace_of(plan: &Plan, name: &str, timeline: &Timeline, generator: &str, time_model: &str) -> String {
    let p = &plan.provenance;
    let mut metadata = vec![json!({"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
        "args": {"name": format!("{} plan ({name}): {} {} tokens, t = {}, on {}", p.strategy.name(), p.model.name,
                                   p.model.seq_len, p.parallel.tensor, p.hardware.name)}})];
    for stream in Stream::ALL {
        let label = match stream {
            Stream::Compute => "compute",
            Stream::DeviceToHost => "d2h (device to host)",
            Stream::HostToDevice => "h2d (host to device)",
            Stream::Collective => "collective (tensor-parallel group)",
        };
        let tid = stream.index();
        metadata.push(json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": label}}));
        metadata
            .push(json!({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid, "args": {"sort_index": tid}}));
    }
    let mut events = instruction_events(plan, timeline);
    events.extend(memory_counter(plan, timeline));
    // Stable: equal times keep issue order.
    events.sort_by_key(|e| e.0);

    let other = json!({
        "generator": generator,
        "plan": name,
        "strategy": p.strategy.name(),
        "model": p.model.name,
        "seq_len": p.model.seq_len,
        "machine": p.hardware.name,
        "step_time_s": timeline.step_time_s,
        "flops_per_s": timeline.flops_per_s,
        "time_model": time_model,
    });
    let mut text = String::from("{\"traceEvents\":[\n");
    let lines: Vec<String> = metadata.iter().chain(events.iter().map(|(_, e)| e)).map(Value::to_string).collect();
    text.push_str(&lines.join(",\n"));
    text.push_str(&format!("\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{other}\n}}\n"));
    text
}

/// One event per instruction: launches, copies and waits as complete events, records as instants.
fn instruction_events(plan: &Plan, timeline: &Timeline) -> Vec<(u64, Value)> {
    let buffer_name =
        |id: memo_plan_core::plan::BufferId| plan.buffer(id).map_or_else(|| format!("#{}", id.0), |b| b.to_string());
    let phase = phases(plan);
    let mut recorded_on = vec![None; plan.events as usize];
    for instruction in &plan.instructions {
        if let Action::Record(event) = instruction.action {
            if let Some(slot) = recorded_on.get_mut(event.0 as usize) {
                *slot = Some(instruction.stream.name());
            }
        }
    }
    let mut events = Vec::with_capacity(plan.instructions.len());
    for (index, (instruction, span)) in plan.instructions.iter().zip(&timeline.spans).enumerate() {
        let tid = instruction.stream.index();
        let start = nanos(span.start_s);
        let ts = micros(start);
        let dur = micros(nanos(span.end_s).saturating_sub(start));
        let event = match &instruction.action {
            Action::Launch(launch) => {
                let op = launch.op.name();
                let category = phase[index];
                let name = match (launch.layer, category) {
                    (Some(layer), "recompute") => format!("recompute layer {layer} {op}"),
                    (Some(layer), _) => format!("layer {layer} {op}"),
                    (None, _) => op.to_string(),
                };
                let mut bytes = 0u64;
                let mut writes = Vec::new();
                for arg in &launch.args {
                    let row_bytes = plan.buffer(arg.region.buffer).map_or(0, |b| b.row_bytes);
                    bytes =
                        bytes.saturating_add(arg.region.end.saturating_sub(arg.region.start).saturating_mul(row_bytes));
                    if arg.access.writes() {
                        writes.push(buffer_name(arg.region.buffer));
                    }
                }
                json!({"name": name, "cat": category, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": tid,
                       "args": {"instruction": index, "op": op, "flops": launch.flops, "bytes": bytes, "writes": writes}})
            }
            Action::Copy { src, dst, .. } => {
                let row_bytes = plan.buffer(src.buffer).map_or(0, |b| b.row_bytes);
                let bytes = src.end.saturating_sub(src.start).saturating_mul(row_bytes);
                // Name the tensor by its host slot, which knows its layer (a rounding buffer does not).
                let host_side = [src.buffer, dst.buffer]
                    .into_iter()
                    .find(|&id| plan.buffer(id).is_some_and(|b| b.kind == BufferKind::HostSlot))
                    .and_then(|id| plan.buffer(id));
                let tensor = match host_side {
                    Some(slot) => match slot.layer {
                        Some(layer) => format!("layer {layer} {}", slot.role.name()),
                        None => slot.role.name().to_string(),
                    },
                    None => buffer_name(src.buffer),
                };
                json!({"name": format!("copy {tensor} ({})", instruction.stream.name()), "cat": "copy", "ph": "X",
                       "ts": ts, "dur": dur, "pid": 0, "tid": tid,
                       "args": {"instruction": index, "bytes": bytes, "from": buffer_name(src.buffer),
                                "to": buffer_name(dst.buffer), "rows": [src.start, src.end]}})
            }
            Action::Record(event) => {
                json!({"name": format!("record e{}", event.0), "cat": "event", "ph": "i", "s": "t",
                   "ts": ts, "pid": 0, "tid": tid, "args": {"instruction": index, "event": event.0}})
            }
            Action::Wait(event) => {
                let on = recorded_on.get(event.0 as usize).copied().flatten().unwrap_or("nowhere");
                json!({"name": format!("wait e{}", event.0), "cat": "wait", "ph": "X", "ts": ts, "dur": dur, "pid": 0,
                       "tid": tid, "args": {"instruction": index, "event": event.0, "recorded_on": on, "stall_us": dur}})
            }
        };
        events.push((start, event));
    }
    events
}

/// The live bytes of the device buffers by kind, as a counter track: one event per change. An
/// instant (buffers used only by launches that take no time) is followed 1 ns later by the level
/// after it, so spikes stay visible.
fn memory_counter(plan: &Plan, timeline: &Timeline) -> Vec<(u64, Value)> {
    let ranges = live_ranges(plan);
    let intervals = time_intervals(plan, &ranges, timeline);
    let classes: Vec<Option<usize>> = plan
        .buffers
        .iter()
        .map(|b| if matches!(b.place, Place::Device { .. }) { class_of(b.kind) } else { None })
        .collect();
    let present: Vec<usize> = (0..KINDS.len()).filter(|&k| classes.contains(&Some(k))).collect();
    let mut events: Vec<(u64, Value)> = Vec::new();
    let mut previous: Option<Vec<u64>> = None;
    for step in live_over_time(plan, &intervals, &classes) {
        let values: Vec<u64> = present.iter().map(|&k| step.by_class[k]).collect();
        if previous.as_ref() == Some(&values) {
            continue;
        }
        let mut at = nanos(step.x0);
        if let Some(&(last, _)) = events.last() {
            at = at.max(last + 1);
        }
        let ts = micros(at);
        let args: serde_json::Map<String, Value> =
            present.iter().zip(&values).map(|(&k, bytes)| (KINDS[k].0.name().to_string(), json!(bytes))).collect();
        events.push((
            at,
            json!({"name": "device memory (live bytes)", "ph": "C", "ts": ts, "pid": 0, "tid": 0, "args": args}),
        ));
        previous = Some(values);
    }
    events
}
