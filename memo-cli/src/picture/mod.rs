//! Pictures people judge plans by: SVG memory timelines of plans (`memo show --svg`) and of
//! trace placements (`memo solve --svg`), written as plain SVG text (no browser or system
//! library), atomically.
//!
//! - [`svg`]: the writer; [`axis`]: ticks and byte labels;
//! - [`figure`]: the layout shared by both pictures (arena panel, live-bytes panel, legend) and
//!   what it does with rectangles under a pixel;
//! - [`plan`]: a plan's device buffers over their live ranges (instruction index or simulated
//!   time), coloured by kind; [`placement`]: a trace's buffers over their lifetimes.

pub mod axis;
pub mod chrome_trace;
pub mod figure;
pub mod placement;
pub mod plan;
pub mod svg;

use std::path::Path;

use memo_place::Solution;
use memo_plan_core::plan::Plan;
use memo_plan_core::trace::Trace;

pub use figure::Rendered;
pub use plan::XAxis;

use crate::exit::{self, Failure};

/// The memory timeline of `plans` (one, or several side by side on one byte scale), each named
/// by its file.
pub fn plan_svg(plans: &[(&str, &Plan)], x: XAxis) -> Result<Rendered, Failure> {
    let figure = plan::figure(plans, x).map_err(|e| Failure::new(exit::BAD_INPUT, e))?;
    Ok(figure::render(&figure))
}

/// The placement picture of `solution` for `trace`.
pub fn placement_svg(
    name: &str,
    trace: &Trace,
    solution: &Solution,
    alignment: u64,
    capacity: Option<u64>,
) -> Rendered {
    figure::render(&placement::figure(name, trace, solution, alignment, capacity))
}

/// Writes `text` to `path` atomically (a temporary sibling, then a rename), with an error that
/// names the file and what to check.
pub fn write_file(path: &Path, text: &str, what: &str) -> Result<(), Failure> {
    crate::checked::write_atomically(path, text.as_bytes()).map_err(|e| {
        Failure::new(
            exit::IO_ERROR,
            format!(
                "cannot write the {what} to {}: {e}; check that the directory exists and is writable",
                path.display()
            ),
        )
    })
}
