//! The cost model's timeline (`spec/cost-model.md` section "Timeline"): the plan's three streams
//! simulated in issue order.
//!
//! Each stream runs its instructions one after another. A launch takes its FLOPs divided by the
//! rate the machine sustains (`achieved_flops`, or the rate implied by a measured layer time);
//! memory-bound launches (0 FLOPs: norms, GeLU, adds, the collectives) take no time in this
//! model. A copy takes its bytes divided by the per-GPU bandwidth of its direction while every
//! GPU on the uplink copies. A record marks the time its stream reached it; a wait moves its
//! stream to that time if it is later. Because every wait follows its record in issue order, one
//! pass in issue order gives every start and end exactly.

use alloc::vec::Vec;

use crate::cost::{self, CostError};
use crate::plan::{Action, Plan, Stream};

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
    /// Seconds each stream spends running launches or copies, by [`Stream::index`].
    pub busy_s: [f64; 3],
    /// Seconds each stream spends waiting for events.
    pub stall_s: [f64; 3],
    /// The FLOP rate a launch runs at.
    pub flops_per_s: f64,
}

/// Simulates `plan` on its own hardware.
pub fn simulate(plan: &Plan) -> Result<Timeline, CostError> {
    let p = &plan.provenance;
    let rate = cost::flops_per_s(&p.model, &p.parallel, &p.hardware)?;
    let bandwidth = [
        1.0, // compute: no copies
        p.hardware.d2h_effective_bytes_per_s().max(1) as f64,
        p.hardware.h2d_effective_bytes_per_s().max(1) as f64,
    ];
    let mut clock = [0.0f64; 3];
    let mut busy = [0.0f64; 3];
    let mut stall = [0.0f64; 3];
    let mut events: Vec<f64> = alloc::vec![0.0; plan.events as usize];
    let mut spans = Vec::with_capacity(plan.instructions.len());
    for instruction in &plan.instructions {
        let s = instruction.stream.index();
        let start = clock[s];
        let end = match &instruction.action {
            Action::Launch(launch) => start + launch.flops as f64 / rate,
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
    Ok(Timeline { spans, step_time_s, busy_s: busy, stall_s: stall, flops_per_s: rate })
}

impl Timeline {
    /// Seconds the compute stream waited for copies.
    pub fn compute_stall_s(&self) -> f64 {
        self.stall_s[Stream::Compute.index()]
    }
}
