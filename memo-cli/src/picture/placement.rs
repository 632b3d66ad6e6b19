//! The placement picture of a memory request trace (`memo solve --svg`): x = step, y = offset,
//! each buffer a rectangle over its lifetime `[lower, upper)`, with the lower bound, the peak and
//! any capacity as lines, and the live bytes below.

use memo_plan_core::arena::Solution;
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

/// The live footprint bytes at each step: its maximum is the solver's lower bound.
pub fn live_bytes_by_step(trace: &Trace, alignment: u64) -> Vec<u64> {
    let steps = trace.buffers.iter().map(|b| b.upper).max().unwrap_or(0).max(trace.steps) as usize;
    let mut delta = vec![0i128; steps + 1];
    for buffer in &trace.buffers {
        let (lower, upper) = (buffer.lower as usize, (buffer.upper as usize).min(steps));
        if lower < upper {
            delta[lower] += i128::from(footprint(buffer.size, alignment));
            delta[upper] -= i128::from(footprint(buffer.size, alignment));
        }
    }
    let mut running = 0i128;
    delta
        .iter()
        .take(steps)
        .map(|d| {
            running += d;
            u64::try_from(running.max(0)).unwrap_or(u64::MAX)
        })
        .collect()
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
    let live: Vec<LiveStep> = live_bytes_by_step(trace, alignment)
        .into_iter()
        .enumerate()
        .map(|(step, bytes)| LiveStep { x0: step as f64, x1: (step + 1) as f64, by_class: vec![bytes] })
        .collect();
    let x_max = live.len() as f64;
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
