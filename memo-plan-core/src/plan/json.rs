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
            ", \"layers\": {}, \"hidden\": {}, \"heads\": {}, \"kv_heads\": {}, \"ffn_hidden\": {}, \"vocab\": {}, \
             \"seq_len\": {}, \"micro_batch\": {}",
            m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab, m.seq_len, m.micro_batch
        )?;
        let a = &m.architecture;
        write!(
            out,
            ", \"architecture\": {{\"ffn\": \"{}\", \"norm\": \"{}\", \"biases\": \"{}\", \"tied_embeddings\": {}, \
             \"rope_theta\": ",
            a.ffn.name(),
            a.norm.name(),
            a.biases.name(),
            a.tied_embeddings
        )?;
        number(out, a.rope_theta);
        out.push_str(", \"norm_eps\": ");
        number(out, a.norm_eps);
        out.push_str(", \"rope_scaling\": ");
        match a.rope_scaling {
            Some(scaling) => {
                out.push_str("{\"factor\": ");
                number(out, scaling.factor);
                out.push_str(", \"low_freq_factor\": ");
                number(out, scaling.low_freq_factor);
                out.push_str(", \"high_freq_factor\": ");
                number(out, scaling.high_freq_factor);
                write!(out, ", \"original_max_positions\": {}}}", scaling.original_max_positions)?;
            }
            None => out.push_str("null"),
        }
        out.push_str("}}");
        let parallel = &p.parallel;
        write!(
            out,
            ", \"parallel\": {{\"tensor\": {}, \"data\": {}, \"context\": {}}}",
            parallel.tensor, parallel.data, parallel.context
        )?;
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
        write!(
            out,
            "}}, \"interconnect\": {{\"bytes_per_s\": {}, \"latency_ns\": {}}}",
            p.interconnect.bytes_per_s, p.interconnect.latency_ns
        )?;
        write!(out, ", \"strategy\": \"{}\", \"alpha\": ", p.strategy.name())?;
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
        out.push_str(if self.instructions.is_empty() {
            "],\n  \"rank_programs\": ["
        } else {
            "\n  ],\n  \"rank_programs\": ["
        });
        for (number, program) in self.rank_programs.iter().enumerate() {
            let separator = if number == 0 { "\n    " } else { ",\n    " };
            write!(out, "{separator}{{\"rank\": {}, \"instructions\": [", program.rank)?;
            for (index, instruction) in program.instructions.iter().enumerate() {
                out.push_str(if index == 0 { "\n      " } else { ",\n      " });
                instruction_json(out, index, instruction)?;
            }
            out.push_str(if program.instructions.is_empty() { "]}" } else { "\n    ]}" });
        }
        out.push_str(if self.rank_programs.is_empty() { "]\n}\n" } else { "\n  ]\n}\n" });
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
    write!(
        out,
        ", \"slot\": {}, \"rows\": {}, \"first_row\": {}, \"row_bytes\": {}, \"bytes\": ",
        b.slot, b.rows, b.first_row, b.row_bytes
    )?;
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
                    // The launch's scratch (a malformed plan may carry more: null).
                    None if position == signature.len() => out.push_str("\"scratch\""),
                    None => out.push_str("null"),
                }
                out.push_str(", ");
                region_fields(out, &arg.region)?;
                write!(out, ", \"access\": \"{}\"}}", arg.access.name())?;
            }
            out.push_str("]}}");
        }
        Action::Copy { src, dst, tensor } => {
            out.push_str("\"copy\": {\"src\": {");
            region_fields(out, src)?;
            out.push_str("}, \"dst\": {");
            region_fields(out, dst)?;
            write!(
                out,
                "}}, \"tensor\": {{\"layer\": {}, \"role\": \"{}\", \"start\": {}, \"end\": {}}}}}}}",
                tensor.layer,
                tensor.role.name(),
                tensor.start,
                tensor.end
            )?;
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

#[cfg(test)]
mod tests {
    use alloc::format;
    use alloc::string::String;

    use serde_json::Value;

    use super::{number, string};
    use crate::plan::encode::tests::sample_plan;
    use crate::plan::{Action, Plan};

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn the_view_parses_and_says_what_the_plan_says() {
        let plan = sample_plan();
        let text = plan.to_json();
        let json = parse(&text);
        assert_eq!(json["format_version"], 6);
        let p = &json["provenance"];
        assert_eq!(p["model"]["name"].as_str(), Some(plan.provenance.model.name.as_str()));
        assert_eq!(p["model"]["layers"], 2);
        assert_eq!(
            (&p["model"]["heads"], &p["model"]["kv_heads"], &p["model"]["ffn_hidden"]),
            (&2.into(), &1.into(), &32.into())
        );
        assert_eq!(
            p["model"]["architecture"],
            parse(
                r#"{"ffn": "swiglu", "norm": "rmsnorm", "biases": "qkv", "tied_embeddings": false, "rope_theta": 500000,
                    "norm_eps": 1e-6, "rope_scaling": {"factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                    "original_max_positions": 8192}}"#
            )
        );
        assert_eq!(p["model"]["architecture"]["norm_eps"].as_f64(), Some(1e-6));
        assert_eq!(p["parallel"]["data"], 2);
        assert_eq!(p["parallel"]["context"], 1);
        assert_eq!(p["hardware"]["name"], "test-box");
        assert_eq!(p["hardware"]["measured_layer_forward_s"].as_f64(), Some(0.0123));
        assert_eq!(p["interconnect"], parse(r#"{"bytes_per_s": 200000000000, "latency_ns": 5000}"#));
        assert_eq!(p["strategy"], "memo");
        assert_eq!(p["alpha"].as_f64(), Some(0.47));
        assert_eq!(p["alpha_bound"], "host_memory");
        assert_eq!(p["level1_backward"]["optimal"], false);
        assert_eq!(p["level2"]["peak_bytes"], 6000);
        assert_eq!(json["totals"]["arena_bytes"], 1604);
        assert_eq!(json["events"], 2);

        let buffers = json["buffers"].as_array().unwrap();
        assert_eq!(buffers.len(), plan.buffers.len());
        for (index, (b, j)) in plan.buffers.iter().zip(buffers).enumerate() {
            assert_eq!(j["index"], index);
            assert_eq!(j["name"].as_str(), Some(format!("{b}").as_str()));
            assert_eq!(j["kind"].as_str(), Some(b.kind.name()));
            assert_eq!(j["role"].as_str(), Some(b.role.name()));
            assert_eq!(j["bytes"].as_u64(), b.bytes());
            assert_eq!(j["rows"].as_u64(), Some(b.rows));
            assert_eq!(j["first_row"].as_u64(), Some(b.first_row));
        }
        assert_eq!(buffers[6]["name"], "rounding buffer 1 layer_input");
        assert_eq!(buffers[6]["layer"], Value::Null);
        assert_eq!(buffers[3]["layer"], 0);
        assert_eq!(buffers[10]["place"], parse(r#"{"space": "host", "offset": 0}"#));
        assert_eq!(buffers[2]["place"], parse(r#"{"space": "device", "offset": 64}"#));

        let instructions = json["instructions"].as_array().unwrap();
        assert_eq!(instructions.len(), plan.instructions.len());
        let linear = &instructions[1];
        assert_eq!(linear["stream"], "compute");
        assert_eq!(linear["launch"]["op"], "linear");
        assert_eq!(linear["launch"]["layer"], 0);
        assert_eq!(linear["launch"]["flops"], 2048);
        let args = linear["launch"]["args"].as_array().unwrap();
        assert_eq!(args.len(), 4);
        assert_eq!(args[1], parse(r#"{"param": "weight", "buffer": 3, "start": 0, "end": 8, "access": "read"}"#));
        assert_eq!(args[3]["access"], "write");
        assert_eq!(instructions[2], parse(r#"{"index": 2, "stream": "compute", "record": {"event": 0}}"#));
        assert_eq!(instructions[3]["wait"]["event"], 0);
        assert_eq!(instructions[3]["stream"], "d2h");
        let copy = &instructions[7];
        assert_eq!(copy["stream"], "h2d");
        assert_eq!(copy["copy"]["src"], parse(r#"{"buffer": 10, "start": 0, "end": 4}"#));
        assert_eq!(copy["copy"]["dst"]["buffer"], 6);
        assert_eq!(copy["copy"]["tensor"], parse(r#"{"layer": 0, "role": "layer_input", "start": 0, "end": 4}"#));
        assert_eq!(instructions[9]["launch"]["args"][0]["access"], "read_write");

        // One line per buffer and per instruction, and the same text every time.
        assert_eq!(text.lines().count(), 11 + plan.buffers.len() + plan.instructions.len());
        assert_eq!(json["rank_programs"], parse("[]"));
        assert_eq!(text, sample_plan().to_json());
    }

    #[test]
    fn rank_programs_list_their_instructions() {
        let mut plan = sample_plan();
        let program = plan.instructions[..2].to_vec();
        plan.rank_programs = alloc::vec![crate::plan::RankProgram { rank: 1, instructions: program }];
        let text = plan.to_json();
        let json = parse(&text);
        let programs = json["rank_programs"].as_array().unwrap();
        assert_eq!(programs.len(), 1);
        assert_eq!(programs[0]["rank"], 1);
        let instructions = programs[0]["instructions"].as_array().unwrap();
        assert_eq!(instructions.len(), 2);
        assert_eq!(instructions[0], json["instructions"][0]);
        assert_eq!(instructions[1], json["instructions"][1]);
    }

    #[test]
    fn empty_lists_and_absent_values() {
        let mut plan = sample_plan();
        plan.buffers.clear();
        plan.instructions.clear();
        plan.provenance.hardware.measured_layer_forward_s = None;
        let json = parse(&plan.to_json());
        assert_eq!(json["buffers"], parse("[]"));
        assert_eq!(json["instructions"], parse("[]"));
        assert_eq!(json["provenance"]["hardware"]["measured_layer_forward_s"], Value::Null);
    }

    /// A GPT model's view: every head a key/value head, GeLU, LayerNorm, biases everywhere, tied,
    /// no rope scaling (`null`).
    #[test]
    fn a_gpt_model_shows_its_architecture() {
        let mut plan = sample_plan();
        plan.provenance.model = crate::model::ModelConfig::new("g", 2, 8, 2, 8, 1);
        let json = parse(&plan.to_json());
        let model = &json["provenance"]["model"];
        assert_eq!(model["kv_heads"], 2);
        assert_eq!(
            model["architecture"],
            parse(
                r#"{"ffn": "gelu", "norm": "layernorm", "biases": "all", "tied_embeddings": true, "rope_theta": 10000,
                    "norm_eps": 0.00001, "rope_scaling": null}"#
            )
        );
    }

    /// An invalid in-memory plan (a launch with more arguments than its signature) still gives
    /// valid JSON: the extra argument's `param` is null.
    #[test]
    fn extra_arguments_have_no_param_name() {
        let mut plan = sample_plan();
        if let Action::Launch(launch) = &mut plan.instructions[8].action {
            launch.args.push(launch.args[0]);
            launch.args.push(launch.args[0]);
        }
        // The first past the signature is the launch's scratch; any further one has no name.
        let json = parse(&plan.to_json());
        let signature = match &plan.instructions[8].action {
            Action::Launch(launch) => launch.op.signature().len(),
            _ => unreachable!(),
        };
        assert_eq!(json["instructions"][8]["launch"]["args"][signature]["param"], "scratch");
        assert_eq!(json["instructions"][8]["launch"]["args"][signature + 1]["param"], Value::Null);
    }

    #[test]
    fn strings_are_escaped() {
        let mut text = String::new();
        for code in (0..0x80u32).chain([0xe9, 0x2028, 0x1f600]) {
            text.push(char::from_u32(code).unwrap());
        }
        let mut out = String::new();
        string(&mut out, &text);
        assert_eq!(serde_json::from_str::<String>(&out).unwrap(), text, "{out}");
        let mut out = String::new();
        string(&mut out, "a\"b\\c\nd\u{1f}");
        assert_eq!(out, r#""a\"b\\c\nd\u001f""#);
    }

    #[test]
    fn floats_read_back_exactly() {
        for value in [0.0, -0.0, 0.47, 1.0, 0.1, 1.0 / 3.0, 1e-5, 9.99e-6, 1e16, 1e300, 5e-324, f64::MAX, -2.5e-7] {
            let mut out = String::new();
            number(&mut out, value);
            let back: f64 = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
            assert_eq!(back.to_bits(), value.to_bits(), "{value:?} printed as {out}");
            assert!(out.len() <= 24, "{out}");
        }
        for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut out = String::new();
            number(&mut out, value);
            assert_eq!(out, "null");
        }
        // The decoder rejects a NaN alpha, but an in-memory plan may hold one.
        let mut plan: Plan = sample_plan();
        plan.provenance.alpha = f64::NAN;
        assert_eq!(parse(&plan.to_json())["provenance"]["alpha"], Value::Null);
    }
}
