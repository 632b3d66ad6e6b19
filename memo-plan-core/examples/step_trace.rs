//! The planner's own placement instances: one planned training step's device buffers as a flat
//! trace (`id,lower,upper,size`, instruction steps, bytes), the problem the bi-level placement
//! splits in two. A benchmark instance for `memo solve` and its peers taken from a real plan
//! rather than from a generator.
//!
//! `cargo run --release -p memo-plan-core --example step_trace -- MODEL SEQ MACHINE T [STRATEGY]`,
//! standard output redirected to a CSV file (model and machine presets as `memo plan` names them,
//! e.g. `7b 1048576 a800x8 8 memo`; the strategy defaults to memo). Summary on standard error.

use memo_plan_core::bilevel::live_ranges;
use memo_plan_core::model::{Hardware, ModelConfig, Parallelism};
use memo_plan_core::plan::{BufferKind, Strategy};
use memo_plan_core::planner::{plan, PlanRequest};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("step_trace: {message}");
            eprintln!("usage: step_trace MODEL SEQ MACHINE T [STRATEGY], e.g. 7b 1048576 a800x8 8 memo");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let [model, seq, machine, t, rest @ ..] = args else {
        return Err("four arguments needed".into());
    };
    let number = |what: &str, text: &str| text.parse::<u64>().map_err(|e| format!("{what} {text:?}: {e}"));
    let strategy_name = rest.first().map_or("memo", String::as_str);
    let strategy = Strategy::from_name(strategy_name).ok_or(format!("no strategy {strategy_name:?}"))?;
    let model = ModelConfig::preset(model, number("SEQ", seq)?, 1).map_err(|e| e.to_string())?;
    let hardware = Hardware::preset(machine).map_err(|e| e.to_string())?;
    let request = PlanRequest::new(model, Parallelism::new(number("T", t)?, 1), hardware, strategy);
    let report = plan(&request).map_err(|e| e.to_string())?;
    let plan = &report.plan;
    let ranges = live_ranges(&plan.buffers, &plan.instructions).map_err(|e| e.to_string())?;
    println!("id,lower,upper,size");
    let mut written = 0;
    for (id, (buffer, range)) in plan.buffers.iter().zip(&ranges).enumerate() {
        // Host slots live in the pinned host slab, not in the device arena.
        let (Some((lower, upper)), false) = (range, buffer.kind == BufferKind::HostSlot) else { continue };
        let size = buffer.bytes().ok_or(format!("buffer {id}: its size passes 64 bits"))?;
        println!("{id},{lower},{upper},{size}");
        written += 1;
    }
    eprintln!(
        "step_trace: {written} device buffers over {} instructions (strategy {}, fits: {})",
        plan.instructions.len(),
        strategy.name(),
        report.fits()
    );
    Ok(())
}
