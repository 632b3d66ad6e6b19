//! The placement picture of a memory request trace (`memo solve --svg`): x = step, y = offset,
//! each buffer a rectangle over its lifetime `[lower, upper)`, with the lower bound, the peak and
//! any capacity as lines, and the live bytes below.

use memo_place::Solution;
use memo_plan_core::trace::Trace;

use super::axis;
use super::figure::{Block, Class, Column, Figure, Level, LevelStyle, LiveStep};

/// Colours cycled by trace order, so neighbouring buffers differ.
const PALETTE: [&str; 6] = ["#3d7cc9", "#e08a1e", "#2a9d8f", "#d1495b", "#8e5ea2", "#7fb2e5"];

/// `size` rounded up to `alignment` (as the solver places it).
fn footprint(size: u64, alignment: u64) -> u64 {
    let a = alignment.max(1);
    size.div_ceil(a).saturating_mul(a)
}

/// The live footprint bytes as steps of constant value, from a sweep over the lifetimes' ends
/// (never a vector indexed by step: a CSV trace may name steps up to 2^32 - 1). Its maximum is
/// the solver's lower bound.
pub fn live_steps(trace: &Trace, alignment: u64) -> Vec<LiveStep> {
    let mut changes: Vec<(u32, i128)> = Vec::with_capacity(2 * trace.buffers.len());
    for buffer in trace.buffers.iter().filter(|b| b.lower < b.upper) {
        let bytes = i128::from(footprint(buffer.size, alignment));
        changes.push((buffer.lower, bytes));
        changes.push((buffer.upper, -bytes));
    }
    changes.sort_unstable();
    let mut steps = Vec::new();
    let mut live = 0i128;
    let mut i = 0;
    while i < changes.len() {
        let at = changes[i].0;
        while i < changes.len() && changes[i].0 == at {
            live += changes[i].1;
            i += 1;
        }
        if let Some(&(next, _)) = changes.get(i) {
            let bytes = u64::try_from(live.max(0)).unwrap_or(u64::MAX);
            steps.push(LiveStep { x0: f64::from(at), x1: f64::from(next), by_class: vec![bytes] });
        }
    }
    steps
}

/// The figure of `solution` for `trace` (named `name`), with `capacity` drawn when given.
pub fn figure(name: &str, trace: &Trace, solution: &Solution, alignment: u64, capacity: Option<u64>) -> Figure {
    let blocks: Vec<Block> = trace
        .buffers
        .iter()
        .zip(&solution.offsets)
        .enumerate()
        .map(|(index, (buffer, &offset))| Block {
            x0: f64::from(buffer.lower),
            x1: f64::from(buffer.upper),
            offset,
            bytes: buffer.size,
            class: index % PALETTE.len(),
            title: format!(
                "id {}: {} at {}, steps [{}, {})",
                buffer.id,
                axis::bytes_label(buffer.size),
                axis::bytes_label(offset),
                buffer.lower,
                buffer.upper
            ),
            label: format!("id {}", buffer.id),
        })
        .collect();
    let live = live_steps(trace, alignment);
    let x_max = f64::from(trace.buffers.iter().map(|b| b.upper).max().unwrap_or(0).max(trace.steps));
    let mut levels = vec![
        Level { bytes: solution.peak, label: "peak".into(), style: LevelStyle::Peak },
        Level { bytes: solution.lower_bound, label: "lower bound".into(), style: LevelStyle::LowerBound },
    ];
    if let Some(capacity) = capacity {
        levels.push(Level { bytes: capacity, label: "capacity".into(), style: LevelStyle::Capacity });
    }
    let verdict = if solution.optimal { "proven optimal" } else { "not proven optimal" };
    let heading = format!(
        "{} buffers: peak {}, lower bound {} ({verdict})",
        trace.buffers.len(),
        axis::bytes_label(solution.peak),
        axis::bytes_label(solution.lower_bound)
    );
    let column = Column {
        heading,
        x_max,
        blocks,
        live,
        levels,
        live_levels: vec![Level {
            bytes: solution.lower_bound,
            label: "lower bound = peak live".into(),
            style: LevelStyle::LivePeak,
        }],
    };
    let classes: Vec<Class> = PALETTE.iter().map(|colour| Class { name: "buffer".into(), colour }).collect();
    let mut notes = vec![
        "Each buffer is a rectangle over its lifetime [lower, upper) at its offset; colours cycle in trace order \
         to tell neighbours apart."
            .to_string(),
    ];
    if alignment > 1 {
        notes.push(format!(
            "Offsets are multiples of {alignment} bytes; live bytes count each buffer rounded up to that, as the \
             lower bound does."
        ));
    }
    Figure {
        title: format!("Placement of {name}"),
        x_label: "step (trace order)".to_string(),
        y_label: "offset".to_string(),
        classes,
        live_classes: vec![Class { name: "live bytes".into(), colour: "#5a6b7d" }],
        legend: vec![
            Class { name: "buffer (colours cycle)".into(), colour: PALETTE[0] },
            Class { name: "live bytes".into(), colour: "#5a6b7d" },
        ],
        columns: vec![column],
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memo_plan_core::trace::parse_trace;

    /// The sweep's peak is the lower bound the solver reports, and a lifetime ending at step
    /// 4,000,000,000 costs a few steps, not a vector of 4 billion.
    #[test]
    fn live_steps_peak_at_the_lower_bound_without_a_vector_per_step() {
        let trace = parse_trace(b"id,lower,upper,size\n1,0,3,100\n2,2,4000000000,50\n3,3,5,30\n").unwrap();
        let steps = live_steps(&trace, 64);
        let values: Vec<(f64, f64, u64)> = steps.iter().map(|s| (s.x0, s.x1, s.by_class[0])).collect();
        assert_eq!(values, [(0.0, 2.0, 128), (2.0, 3.0, 192), (3.0, 5.0, 128), (5.0, 4e9, 64)]);
        let solution =
            memo_place::solve(&trace.buffers, &memo_place::SolveOptions { alignment: 64, ..Default::default() })
                .unwrap();
        assert_eq!(solution.lower_bound, 192);
        let figure = figure("t", &trace, &solution, 64, None);
        assert_eq!(figure.columns[0].x_max, 4e9);
    }
}
