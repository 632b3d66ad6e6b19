//! The cost model's timeline (`spec/cost-model.md` section "Timeline"): the plan's four streams
//! simulated in issue order.
//!
//! Each stream runs its instructions one after another. A launch takes its FLOPs divided by the
//! rate the machine sustains: an attention or matrix-product launch at the machine's measured
//! kernel rate when it has one ([`cost::LaunchRates`]), every other launch at `achieved_flops`
//! (or the rate implied by a measured layer time); memory-bound launches (0 FLOPs: norms, GeLU,
//! adds) take no time in this model. A collective
//! takes its ring time over the interconnect ([`cost::collective_time_s`]). A copy takes its bytes divided by the per-GPU bandwidth of its direction while every
//! GPU on the uplink copies. A record marks the time its stream reached it; a wait moves its
//! stream to that time if it is later. Because every wait follows its record in issue order, one
//! pass in issue order gives every start and end exactly.

use alloc::vec::Vec;

use crate::cost::{self, CostError};
use crate::plan::{Action, Plan, Stream, STREAMS};

/// When one instruction ran, in seconds from the step's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    /// Start.
    pub start_s: f64,
    /// End (equal to the start for records, and for waits that did not wait).
    pub end_s: f64,
}

/// The simulated step.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// Per instruction, in plan order.
    pub spans: Vec<Span>,
    /// When the last stream finishes: the step time.
    pub step_time_s: f64,
    /// Seconds the compute, d2h and h2d streams spend running launches or copies, by
    /// [`Stream::index`] (the collective stream's: [`Timeline::stream_busy_s`]).
    pub busy_s: [f64; 3],
    /// Seconds the compute, d2h and h2d streams spend waiting for events.
    pub stall_s: [f64; 3],
    /// The FLOP rate a launch runs at when its kind has no measured rate (`achieved_flops`, or
    /// the rate a measured layer time implies).
    pub flops_per_s: f64,
}

/// Simulates `plan` on its own hardware.
pub fn simulate(plan: &Plan) -> Result<Timeline, CostError> {
    let p = &plan.provenance;
    let rates = cost::LaunchRates::of(&p.model, &p.parallel, &p.hardware)?;
    let bandwidth = [
        1.0, // compute: no copies
        p.hardware.d2h_effective_bytes_per_s().max(1) as f64,
        p.hardware.h2d_effective_bytes_per_s().max(1) as f64,
        1.0, // collective: no copies
    ];
    let ranks = p.parallel.tensor;
    let mut clock = [0.0f64; STREAMS];
    let mut busy = [0.0f64; STREAMS];
    let mut stall = [0.0f64; STREAMS];
    let mut events: Vec<f64> = alloc::vec![0.0; plan.events as usize];
    let mut spans = Vec::with_capacity(plan.instructions.len());
    for instruction in &plan.instructions {
        let s = instruction.stream.index();
        let start = clock[s];
        let end = match &instruction.action {
            Action::Launch(launch) if launch.op.is_collective() => {
                let bytes = launch.args.first().map_or(0, |arg| {
                    let row_bytes = plan.buffer(arg.region.buffer).map_or(0, |b| b.row_bytes);
                    arg.region.end.saturating_sub(arg.region.start).saturating_mul(row_bytes)
                });
                start + cost::collective_time_s(launch.op, bytes, ranks, &p.interconnect)
            }
            Action::Launch(launch) => start + rates.launch_time_s(launch.op, launch.flops),
            Action::Copy { src, .. } => {
                let bytes = plan.buffer(src.buffer).map_or(0, |b| (src.end - src.start).saturating_mul(b.row_bytes));
                start + bytes as f64 / bandwidth[s]
            }
            Action::Record(event) => {
                if let Some(time) = events.get_mut(event.0 as usize) {
                    *time = start;
                }
                start
            }
            Action::Wait(event) => start.max(events.get(event.0 as usize).copied().unwrap_or(0.0)),
        };
        match instruction.action {
            Action::Wait(_) => stall[s] += end - start,
            _ => busy[s] += end - start,
        }
        clock[s] = end;
        spans.push(Span { start_s: start, end_s: end });
    }
    let step_time_s = clock.iter().copied().fold(0.0, f64::max);
    Ok(Timeline {
        spans,
        step_time_s,
        busy_s: [busy[0], busy[1], busy[2]],
        stall_s: [stall[0], stall[1], stall[2]],
        flops_per_s: rates.achieved,
    })
}

impl Timeline {
    /// Seconds the compute stream waited for copies and collectives.
    pub fn compute_stall_s(&self) -> f64 {
        self.stall_s[Stream::Compute.index()]
    }

    /// Seconds `stream` spends running launches or copies in `plan` (this timeline's plan): the
    /// sum of its instructions' spans, waits excluded. For the compute, d2h and h2d streams this
    /// is [`Timeline::busy_s`]; for the collective stream it is the collectives' time.
    pub fn stream_busy_s(&self, plan: &Plan, stream: Stream) -> f64 {
        plan.instructions
            .iter()
            .zip(&self.spans)
            .filter(|(i, _)| i.stream == stream && !matches!(i.action, Action::Wait(_)))
            .map(|(_, span)| span.end_s - span.start_s)
            .sum()
    }
}
