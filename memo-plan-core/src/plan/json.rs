//! A JSON view of a plan, for tools and people (`spec/plan-format.md`, "The JSON view").
//!
//! Written by hand (the crate is `no_std` and has no serde): one object, with one line per buffer
//! and per instruction, so that `grep` and line diffs work on it too. Deterministic: the same plan
//! gives the same text. Strings are escaped as JSON requires; floats are printed with the fewest
//! digits that read back to the same `f64` (`null` when not finite); integers are exact (a reader
//! in a language whose numbers are doubles loses precision above 2^53, as always with JSON).
//!
//! The view is for reading. The byte format ([`Plan::encode`]) is the one a runtime executes.

use alloc::string::String;
use core::fmt::Write;

use super::encode::alpha_bound_name;
use super::{Action, Buffer, Instruction, Place, PlacementSummary, Plan, Region, PLAN_FORMAT_VERSION};

impl Plan {
    /// The plan as JSON (see the module docs and `spec/plan-format.md` for its shape).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(512 + 200 * self.buffers.len() + 160 * self.instructions.len());
        let _ = self.write_json(&mut out);
        out
    }

    /// Writes [`Plan::to_json`]'s text to `out` (writing to a `String` cannot fail).
    fn write_json(&self, out: &mut String) -> core::fmt::Result {
        let p = &self.provenance;
        let m = &p.model;
        let h = &p.hardware;
        write!(out, "{{\n  \"format_version\": {PLAN_FORMAT_VERSION},\n  \"provenance\": {{\"model\": {{\"name\": ")?;
        string(out, &m.name);
        write!(
            out,
            ", \"layers\": {}, \"hidden\": {}, \"heads\": {}, \"ffn_hidden\": {}, \"vocab\": {}, \"seq_len\": {}, \
             \"micro_batch\": {}}}",
            m.layers, m.hidden, m.heads, m.ffn_hidden, m.vocab, m.seq_len, m.micro_batch
        )?;
        write!(out, ", \"parallel\": {{\"tensor\": {}, \"data\": {}}}", p.parallel.tensor, p.parallel.data)?;
        out.push_str(", \"hardware\": {\"name\": ");
        string(out, &h.name);
        write!(
            out,
            ", \"device_memory_bytes\": {}, \"host_memory_per_node_bytes\": {}, \"gpus_per_node\": {}, \
             \"d2h_bytes_per_s\": {}, \"h2d_bytes_per_s\": {}, \"gpus_sharing_uplink\": {}, \"peak_flops\": {}, \
             \"achieved_flops\": {}, \"measured_layer_forward_s\": ",
            h.device_memory_bytes,
            h.host_memory_per_node_bytes,
            h.gpus_per_node,
            h.d2h_bytes_per_s,
            h.h2d_bytes_per_s,
            h.gpus_sharing_uplink,
            h.peak_flops,
            h.achieved_flops
        )?;
        match h.measured_layer_forward_s {
            Some(seconds) => number(out, seconds),
            None => out.push_str("null"),
        }
        write!(out, "}}, \"strategy\": \"{}\", \"alpha\": ", p.strategy.name())?;
        number(out, p.alpha);
        write!(
            out,
            ", \"alpha_bound\": \"{}\", \"alpha_bound_label\": \"{}\", \"swapped_rows\": {}",
            alpha_bound_name(p.alpha_bound),
            p.alpha_bound.label(),
            p.swapped_rows
        )?;
        for (name, summary) in
            [("level1_forward", &p.level1_forward), ("level1_backward", &p.level1_backward), ("level2", &p.level2)]
        {
            write!(out, ", \"{name}\": ")?;
            placement_summary(out, summary)?;
        }
        let t = &self.totals;
        write!(
            out,
            "}},\n  \"totals\": {{\"arena_bytes\": {}, \"arena_lower_bound_bytes\": {}, \"host_bytes\": {}, \
             \"parameter_bytes\": {}, \"rounding_buffer_bytes\": {}}},\n  \"events\": {},\n  \"buffers\": [",
            t.arena_bytes,
            t.arena_lower_bound_bytes,
            t.host_bytes,
            t.parameter_bytes,
            t.rounding_buffer_bytes,
            self.events
        )?;
        for (index, buffer) in self.buffers.iter().enumerate() {
            out.push_str(if index == 0 { "\n    " } else { ",\n    " });
            buffer_json(out, index, buffer)?;
        }
        out.push_str(if self.buffers.is_empty() {
            "],\n  \"instructions\": ["
        } else {
            "\n  ],\n  \"instructions\": ["
        });
        for (index, instruction) in self.instructions.iter().enumerate() {
            out.push_str(if index == 0 { "\n    " } else { ",\n    " });
            instruction_json(out, index, instruction)?;
        }
        out.push_str(if self.instructions.is_empty() { "]\n}\n" } else { "\n  ]\n}\n" });
        Ok(())
    }
}

fn placement_summary(out: &mut String, s: &PlacementSummary) -> core::fmt::Result {
    write!(
        out,
        "{{\"buffers\": {}, \"peak_bytes\": {}, \"lower_bound_bytes\": {}, \"optimal\": {}, \"nodes\": {}}}",
        s.buffers, s.peak_bytes, s.lower_bound_bytes, s.optimal, s.nodes
    )
}

fn buffer_json(out: &mut String, index: usize, b: &Buffer) -> core::fmt::Result {
    write!(out, "{{\"index\": {index}, \"name\": ")?;
    string(out, &alloc::format!("{b}"));
    write!(out, ", \"kind\": \"{}\", \"role\": \"{}\", \"layer\": ", b.kind.name(), b.role.name())?;
    optional(out, b.layer)?;
    write!(out, ", \"slot\": {}, \"rows\": {}, \"row_bytes\": {}, \"bytes\": ", b.slot, b.rows, b.row_bytes)?;
    optional(out, b.bytes())?;
    let (space, offset) = match b.place {
        Place::Device { offset } => ("device", offset),
        Place::Host { offset } => ("host", offset),
    };
    write!(out, ", \"place\": {{\"space\": \"{space}\", \"offset\": {offset}}}}}")
}

fn instruction_json(out: &mut String, index: usize, instruction: &Instruction) -> core::fmt::Result {
    write!(out, "{{\"index\": {index}, \"stream\": \"{}\", ", instruction.stream.name())?;
    match &instruction.action {
        Action::Launch(launch) => {
            write!(out, "\"launch\": {{\"op\": \"{}\", \"layer\": ", launch.op.name())?;
            optional(out, launch.layer)?;
            write!(out, ", \"flops\": {}, \"args\": [", launch.flops)?;
            let signature = launch.op.signature();
            for (position, arg) in launch.args.iter().enumerate() {
                out.push_str(if position == 0 { "{\"param\": " } else { ", {\"param\": " });
                match signature.get(position) {
                    Some((name, _)) => write!(out, "\"{name}\"")?,
                    None => out.push_str("null"),
                }
                out.push_str(", ");
                region_fields(out, &arg.region)?;
                write!(out, ", \"access\": \"{}\"}}", arg.access.name())?;
            }
            out.push_str("]}}");
        }
        Action::Copy { src, dst } => {
            out.push_str("\"copy\": {\"src\": {");
            region_fields(out, src)?;
            out.push_str("}, \"dst\": {");
            region_fields(out, dst)?;
            out.push_str("}}}");
        }
        Action::Record(event) => write!(out, "\"record\": {{\"event\": {}}}}}", event.0)?,
        Action::Wait(event) => write!(out, "\"wait\": {{\"event\": {}}}}}", event.0)?,
    }
    Ok(())
}

fn region_fields(out: &mut String, region: &Region) -> core::fmt::Result {
    write!(out, "\"buffer\": {}, \"start\": {}, \"end\": {}", region.buffer.0, region.start, region.end)
}

fn optional<T: core::fmt::Display>(out: &mut String, value: Option<T>) -> core::fmt::Result {
    match value {
        Some(v) => write!(out, "{v}"),
        None => {
            out.push_str("null");
            Ok(())
        }
    }
}

/// `value` as a JSON string literal: `"` and `\` escaped, control characters as `\n`, `\t`, ... or
/// `\u00XX`; everything else as it is (JSON text is UTF-8).
pub(crate) fn string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as a JSON number with the fewest digits that read back to the same `f64` (Rust's
/// `Display` and `LowerExp` both print the shortest round-tripping digits); plain notation for
/// magnitudes in `[1e-5, 1e16)` and zero, exponent notation otherwise; `null` when not finite
/// (JSON has no NaN or infinity).
pub(crate) fn number(out: &mut String, value: f64) {
    let _ = if !value.is_finite() {
        write!(out, "null")
    } else if value == 0.0 || (1e-5..1e16).contains(&value.abs()) {
        write!(out, "{value}")
    } else {
        write!(out, "{value:e}")
    };
}
