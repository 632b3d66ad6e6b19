//! The model, parallel layout and machine a planning command works on: a preset, then a TOML
//! file's fields, then command-line flags, each overriding the one before.
//!
//! The TOML file (`--config FILE`) has up to three tables; every key is optional:
//!
//! ```toml
//! [model]
//! preset = "7b"            # 7b, 13b, 30b, 65b, llama3.1-8b, llama3.1-70b, qwen2.5-7b, ...
//! hf_config = "llama/config.json"  # or a Hugging Face config.json (relative to this file) instead
//! layers = 32
//! hidden = 4096
//! heads = 32
//! ffn_hidden = 16384
//! vocab = 50257
//! seq_len = "1M"           # tokens: K, M and G are binary (1M = 1,048,576)
//! micro_batch = 1
//!
//! [parallel]
//! tensor = 8               # t: tensor/sequence-parallel degree
//! data = 1                 # d: data-parallel degree (default: nodes x gpus_per_node / (c x t) with nodes given, else 1)
//! context = 1              # c: context-parallel degree (each sequence split over c ranks; default 1)
//! nodes = 1                # nodes the d x c x t GPUs fill (default: enough for d x c x t)
//! zero = 1                 # ZeRO stage: 0 replicated, 1 optimizer state sharded over d x c, 2 gradients too
//!
//! [machine]
//! preset = "a800x8"        # a800x8, h100x8, h200x1, mi300x8
//! device_memory = "80GiB"
//! host_memory_per_node = "2TiB"
//! gpus_per_node = 8
//! d2h = "25GB/s"
//! h2d = "25GB/s"
//! gpus_sharing_uplink = 1
//! peak_flops = "312T"
//! achieved_flops = "187T"
//! layer_forward_s = 1.25   # a measured forward time of one layer, replacing the FLOP estimate
//! attention_forward_flops = "45TFLOP/s"   # measured kernel rates (`memo profile`): attention
//! attention_backward_flops = "27TFLOP/s"  # launches and matrix products are timed at them
//! gemm_flops = "600TFLOP/s"                # instead of achieved_flops (`spec/cost-model.md` §7)
//! interconnect_bandwidth = "200GB/s"  # GPU-to-GPU link of the tensor-parallel group, per direction
//! interconnect_latency = "5us"        # one ring step of a collective (s, ms, us, ns; an integer is ns)
//! network_bandwidth = "50GB/s"        # each GPU's share of the network between nodes, per direction
//! network_latency = "8us"             # one ring step across nodes
//! ```
//!
//! Sizes and rates take the units of [`crate::units`], the same as the flags: decimal and binary
//! prefixes and fractions (`1.5TB`, `141GB`, `12.5GB/s`, `25 GiB/s`); an integer (or a string
//! without a unit) is bytes for a size, and refused for a rate (`d2h = "12500"`: a rate needs a
//! unit, e.g. `12.5GB/s`).
//!
//! `--machine-file FILE` reads only a file's `[machine]` table (what `memo profile` writes) and
//! replaces `--config`'s. A `[machine]` table without `preset` must give `device_memory`,
//! `host_memory_per_node`, `d2h`, `h2d` and `peak_flops`; the machine is then named after the
//! file (`spec/cost-model.md` §10). The interconnect and the network default to the preset's
//! (none for a machine without a preset: then `t > 1` needs `interconnect_bandwidth`, and `d > 1`
//! across nodes `network_bandwidth`).
//!
//! Nodes and `d`: a job fills whole nodes (`d x c x t = nodes x gpus_per_node`) or uses part of
//! one. With `nodes` given and `d` not, `d = nodes x gpus_per_node / (c x t)`; with `d` given and
//! `nodes` not, `nodes = d x c x t / gpus_per_node` (1 when that is at most one node); with
//! neither, one node and `d = 1`. A tensor-parallel group stays inside a node; a context-parallel
//! group of `c x t` GPUs sits inside one node or fills whole nodes.
//!
//! `--model PATH` (a path ending in `.json`, or any existing file that parses as JSON) and
//! `hf_config` read a Hugging Face `config.json` with
//! [`memo_plan_core::model::model_from_hf_config`]; the model is named after the file's directory
//! (the repository name in a Hugging Face cache snapshot), and the other fields and flags apply on
//! top of it as on top of a preset.

use std::path::{Path, PathBuf};

use memo_plan_core::model::{
    model_from_hf_config, Architecture, Biases, Ffn, Hardware, Interconnect, MeasuredRates, ModelConfig, Nodes, Norm,
    OptimizerSharding, Parallelism, HARDWARE_PRESETS, MODEL_PRESETS,
};
use serde::Deserialize;

use crate::exit::{self, Failure};

/// The flags every planning command shares.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// Model preset (7b, 13b, 30b, 65b, llama3.1-8b, llama3.1-70b, qwen2.5-7b, qwen2.5-72b, mistral-7b) or a
    /// Hugging Face config.json (e.g. --model examples/models/hf/llama3.1-8b/config.json)
    #[arg(long, value_name = "NAME|PATH")]
    pub model: Option<String>,

    /// Tokens per sequence; K, M and G are binary (1M = 1,048,576)
    #[arg(long, value_name = "TOKENS", value_parser = parse_tokens, allow_negative_numbers = true)]
    pub seq: Option<u64>,

    /// Machine preset (a800x8, h100x8, h200x1, mi300x8)
    #[arg(long, value_name = "NAME")]
    pub machine: Option<String>,

    /// A TOML file with a [machine] table (what `memo profile` writes); replaces --config's table
    #[arg(long, value_name = "FILE")]
    pub machine_file: Option<PathBuf>,

    /// Tensor/sequence-parallel degree t (default 1)
    #[arg(long, value_name = "T")]
    pub tp: Option<u64>,

    /// Data-parallel degree d (default: nodes x GPUs per node / (c x t) with --nodes, else 1)
    #[arg(long, value_name = "D")]
    pub dp: Option<u64>,

    /// Context-parallel degree c (default 1): each sequence split over c ranks, two balanced
    /// chunks each, K/V passed around a ring (Megatron-LM's context parallelism); GPUs = d x c x t
    #[arg(long = "cp", value_name = "C")]
    pub cp: Option<u64>,

    /// Nodes the d x t GPUs fill (default: as many as d x t needs); a job on more than one node
    /// fills each (d x t = nodes x GPUs per node)
    #[arg(long, value_name = "N")]
    pub nodes: Option<u64>,

    /// Shard the model state over the d data-parallel ranks (ZeRO stage): 0 replicated, 1 the
    /// optimizer state (fp32 master weights, AdamW moments; Megatron-LM's distributed optimizer),
    /// 2 the gradients too (default 0)
    #[arg(long, value_name = "STAGE", value_parser = parse_zero)]
    pub zero: Option<OptimizerSharding>,

    /// A TOML file with [model], [parallel] and [machine] tables; flags override it
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Sequences per micro-batch
    #[arg(long, value_name = "B", help_heading = "Model overrides")]
    pub micro_batch: Option<u64>,
    /// Transformer layers
    #[arg(long, value_name = "N", help_heading = "Model overrides")]
    pub layers: Option<u32>,
    /// Hidden size
    #[arg(long, value_name = "H", help_heading = "Model overrides")]
    pub hidden: Option<u64>,
    /// Attention (query) heads
    #[arg(long, value_name = "A", help_heading = "Model overrides")]
    pub heads: Option<u64>,
    /// Key/value heads (grouped-query attention; default: as many as the query heads)
    #[arg(long, value_name = "G", help_heading = "Model overrides")]
    pub kv_heads: Option<u64>,
    /// FFN width (default 4 x hidden)
    #[arg(long, value_name = "F", help_heading = "Model overrides")]
    pub ffn_hidden: Option<u64>,
    /// FFN kind: gelu or swiglu
    #[arg(long, value_name = "KIND", value_parser = parse_ffn, help_heading = "Model overrides")]
    pub ffn: Option<Ffn>,
    /// Norm kind: layernorm or rmsnorm
    #[arg(long, value_name = "KIND", value_parser = parse_norm, help_heading = "Model overrides")]
    pub norm: Option<Norm>,
    /// Which projections have biases: all, qkv or none
    #[arg(long, value_name = "WHICH", value_parser = parse_biases, help_heading = "Model overrides")]
    pub biases: Option<Biases>,
    /// Whether the classifier is the word embedding (true) or a matrix of its own (false)
    #[arg(long, value_name = "BOOL", help_heading = "Model overrides")]
    pub tied_embeddings: Option<bool>,
    /// Vocabulary size
    #[arg(long, value_name = "V", help_heading = "Model overrides")]
    pub vocab: Option<u64>,

    /// Memory of one GPU (e.g. 80GiB, 141GB)
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, help_heading = "Machine overrides")]
    pub device_memory: Option<u64>,
    /// Host memory of one node (e.g. 2TiB)
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, help_heading = "Machine overrides")]
    pub host_memory: Option<u64>,
    /// GPUs in one node
    #[arg(long, value_name = "N", help_heading = "Machine overrides")]
    pub gpus_per_node: Option<u64>,
    /// Device-to-host bandwidth of one GPU, with a unit (e.g. 25GB/s, 12.5GiB/s)
    #[arg(long, value_name = "RATE", value_parser = parse_rate, help_heading = "Machine overrides")]
    pub d2h: Option<u64>,
    /// Host-to-device bandwidth of one GPU, with a unit (e.g. 25GB/s, 12.5GiB/s)
    #[arg(long, value_name = "RATE", value_parser = parse_rate, help_heading = "Machine overrides")]
    pub h2d: Option<u64>,
    /// GPUs sharing one host uplink
    #[arg(long, value_name = "N", help_heading = "Machine overrides")]
    pub gpus_sharing_uplink: Option<u64>,
    /// Dense bf16 peak FLOP/s of one GPU (e.g. 312T, 989.5TFLOP/s)
    #[arg(long, value_name = "RATE", value_parser = parse_flops, help_heading = "Machine overrides")]
    pub peak_flops: Option<u64>,
    /// FLOP/s one GPU sustains (e.g. 187T)
    #[arg(long, value_name = "RATE", value_parser = parse_flops, help_heading = "Machine overrides")]
    pub achieved_flops: Option<u64>,
    /// A measured forward time of one layer, in seconds
    #[arg(long, value_name = "SECONDS", help_heading = "Machine overrides")]
    pub layer_time: Option<f64>,
    /// GPU-to-GPU bandwidth of the tensor-parallel group, per direction (e.g. 200GB/s)
    #[arg(long, value_name = "RATE", value_parser = parse_rate, help_heading = "Machine overrides")]
    pub interconnect_bandwidth: Option<u64>,
    /// Latency of one ring step of a collective (e.g. 5us; s, ms, us, ns)
    #[arg(long, value_name = "TIME", value_parser = parse_latency, help_heading = "Machine overrides")]
    pub interconnect_latency: Option<u64>,
    /// Each GPU's share of the network between nodes, per direction (e.g. 50GB/s for 400 Gb/s)
    #[arg(long, value_name = "RATE", value_parser = parse_rate, help_heading = "Machine overrides")]
    pub network_bandwidth: Option<u64>,
    /// Latency of one ring step across nodes (e.g. 8us)
    #[arg(long, value_name = "TIME", value_parser = parse_latency, help_heading = "Machine overrides")]
    pub network_latency: Option<u64>,
}

/// A ZeRO stage: 0, 1 or 2.
pub fn parse_zero(text: &str) -> Result<OptimizerSharding, String> {
    text.trim()
        .parse::<u8>()
        .ok()
        .and_then(OptimizerSharding::from_stage)
        .ok_or_else(|| "expected a ZeRO stage: 0 (replicated), 1 (optimizer state sharded) or 2 (gradients too)".into())
}

/// A resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub model: ModelConfig,
    pub parallel: Parallelism,
    pub hardware: Hardware,
    /// The links of the tensor-parallel group (the preset's, the file's, the flags').
    pub interconnect: Interconnect,
    /// The nodes the job fills and the network between them.
    pub nodes: Nodes,
    /// How the data-parallel ranks share the model state.
    pub sharding: OptimizerSharding,
    /// What the TOML file's `[machine]` fields and the machine flags changed in the machine's preset
    /// (empty without a preset, or when nothing was changed).
    pub machine_overrides: Vec<MachineOverride>,
    /// The file whose `[machine]` table was read (`--machine-file`, else `--config`); empty when
    /// neither was given.
    pub machine_source: String,
}

/// One field of a machine preset that a TOML field or a flag changed.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineOverride {
    /// The TOML key (`gpus_per_node`); `host_memory_per_gpu` for the share that follows from the
    /// host memory and the GPUs per node.
    pub field: &'static str,
    /// The preset's value and the value planned for, in words (`256.00 GiB`, `50GB/s`).
    pub preset_text: String,
    pub value_text: String,
    /// The same as JSON numbers (`null` for a measured layer time the preset lacks).
    pub preset: serde_json::Value,
    pub value: serde_json::Value,
}

impl MachineOverride {
    /// `gpus_per_node 1 -> 8`.
    pub fn text(&self) -> String {
        format!("{} {} -> {}", self.field, self.preset_text, self.value_text)
    }
}

/// The fields of `hardware` and `interconnect` that differ from the preset `preset` (and its
/// interconnect), with the host memory per GPU that follows when the host memory or the GPUs per
/// node changed.
fn machine_overrides(
    preset: &Hardware,
    hardware: &Hardware,
    interconnect: &Interconnect,
    network: &Interconnect,
) -> Vec<MachineOverride> {
    use crate::human::binary_units;
    use crate::units::exact_decimal;
    let mut out = Vec::new();
    let mut push = |field, before: u64, after: u64, text: &dyn Fn(u64) -> String| {
        if before != after {
            out.push(MachineOverride {
                field,
                preset_text: text(before),
                value_text: text(after),
                preset: before.into(),
                value: after.into(),
            });
        }
    };
    let bytes = |n: u64| binary_units(n);
    let count = |n: u64| n.to_string();
    let rate = |n: u64| exact_decimal(n, "B/s");
    let flops = |n: u64| exact_decimal(n, "FLOP/s");
    let nanoseconds = |n: u64| format!("{n} ns");
    push("device_memory", preset.device_memory_bytes, hardware.device_memory_bytes, &bytes);
    push("host_memory_per_node", preset.host_memory_per_node_bytes, hardware.host_memory_per_node_bytes, &bytes);
    push("gpus_per_node", preset.gpus_per_node, hardware.gpus_per_node, &count);
    push("host_memory_per_gpu", preset.host_memory_per_gpu_bytes(), hardware.host_memory_per_gpu_bytes(), &bytes);
    push("d2h", preset.d2h_bytes_per_s, hardware.d2h_bytes_per_s, &rate);
    push("h2d", preset.h2d_bytes_per_s, hardware.h2d_bytes_per_s, &rate);
    push("gpus_sharing_uplink", preset.gpus_sharing_uplink, hardware.gpus_sharing_uplink, &count);
    push("peak_flops", preset.peak_flops, hardware.peak_flops, &flops);
    push("achieved_flops", preset.achieved_flops, hardware.achieved_flops, &flops);
    let preset_link = Interconnect::for_hardware(preset);
    push("interconnect_bandwidth", preset_link.bytes_per_s, interconnect.bytes_per_s, &rate);
    push("interconnect_latency", preset_link.latency_ns, interconnect.latency_ns, &nanoseconds);
    let preset_network = Interconnect::network_for_hardware(preset);
    push("network_bandwidth", preset_network.bytes_per_s, network.bytes_per_s, &rate);
    push("network_latency", preset_network.latency_ns, network.latency_ns, &nanoseconds);
    for ((field, before), (_, after)) in preset.measured_rates.named().into_iter().zip(hardware.measured_rates.named())
    {
        if before != after {
            let text = |r: Option<u64>| r.map_or("none".to_string(), |r| exact_decimal(r, "FLOP/s"));
            out.push(MachineOverride {
                field,
                preset_text: text(before),
                value_text: text(after),
                preset: before.into(),
                value: after.into(),
            });
        }
    }
    if preset.measured_layer_forward_s != hardware.measured_layer_forward_s {
        let text = |s: Option<f64>| s.map_or("none".to_string(), |s| format!("{s} s"));
        out.push(MachineOverride {
            field: "layer_forward_s",
            preset_text: text(preset.measured_layer_forward_s),
            value_text: text(hardware.measured_layer_forward_s),
            preset: preset.measured_layer_forward_s.into(),
            value: hardware.measured_layer_forward_s.into(),
        });
    }
    out
}

/// A number in a TOML file: an integer, or a string with a unit. An integer is read as the same
/// digits in a string would be (bytes for a size; a rate needs a unit, so it is refused).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Quantity {
    Integer(i64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    model: ModelTable,
    #[serde(default)]
    parallel: ParallelTable,
    #[serde(default)]
    machine: MachineTable,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelTable {
    preset: Option<String>,
    hf_config: Option<PathBuf>,
    layers: Option<u32>,
    hidden: Option<u64>,
    heads: Option<u64>,
    kv_heads: Option<u64>,
    ffn_hidden: Option<u64>,
    ffn: Option<String>,
    norm: Option<String>,
    biases: Option<String>,
    tied_embeddings: Option<bool>,
    rope_theta: Option<f64>,
    norm_eps: Option<f64>,
    vocab: Option<u64>,
    seq_len: Option<Quantity>,
    micro_batch: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParallelTable {
    tensor: Option<u64>,
    data: Option<u64>,
    context: Option<u64>,
    nodes: Option<u64>,
    zero: Option<u8>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineTable {
    preset: Option<String>,
    device_memory: Option<Quantity>,
    host_memory_per_node: Option<Quantity>,
    gpus_per_node: Option<u64>,
    d2h: Option<Quantity>,
    h2d: Option<Quantity>,
    gpus_sharing_uplink: Option<u64>,
    peak_flops: Option<Quantity>,
    achieved_flops: Option<Quantity>,
    layer_forward_s: Option<f64>,
    attention_forward_flops: Option<Quantity>,
    attention_backward_flops: Option<Quantity>,
    gemm_flops: Option<Quantity>,
    interconnect_bandwidth: Option<Quantity>,
    interconnect_latency: Option<Quantity>,
    network_bandwidth: Option<Quantity>,
    network_latency: Option<Quantity>,
}

pub use crate::units::{parse_bytes, parse_flops, parse_rate, parse_tokens};

/// A latency in nanoseconds: a number with a unit `s`, `ms`, `us` or `ns` (5us, 0.5ms), or a
/// whole number of nanoseconds.
pub fn parse_latency(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let expected = "expected a latency such as 5us, 0.5ms or 2000ns (units s, ms, us, ns; a bare number is ns)";
    let (number, scale) = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]
        .iter()
        .find_map(|&(unit, scale)| text.strip_suffix(unit).map(|n| (n.trim(), scale)))
        .unwrap_or((text, 1.0));
    let value: f64 = number.parse().map_err(|_| expected.to_string())?;
    let nanoseconds = value * scale;
    if !nanoseconds.is_finite() || nanoseconds < 0.0 || nanoseconds >= u64::MAX as f64 {
        return Err(format!("{text}: {expected}"));
    }
    Ok(nanoseconds.round() as u64)
}

fn quantity(value: &Quantity, parse: fn(&str) -> Result<u64, String>, file: &str, key: &str) -> Result<u64, Failure> {
    let (text, shown) = match value {
        Quantity::Integer(n) => (n.to_string(), n.to_string()),
        Quantity::Text(text) => (text.clone(), format!("{text:?}")),
    };
    parse(&text).map_err(|e| Failure::new(exit::BAD_INPUT, format!("{file}: {key} = {shown}: {e}")))
}

/// The machine presets with more than one GPU per node: `a800x8 (8), h100x8 (8), ...`.
fn multi_gpu_presets() -> String {
    HARDWARE_PRESETS
        .iter()
        .filter(|p| p.gpus_per_node > 1)
        .map(|p| format!("{} ({} GPUs)", p.name, p.gpus_per_node))
        .collect::<Vec<_>>()
        .join(", ")
}

fn preset_names<T>(presets: &[T], name: fn(&T) -> &'static str) -> String {
    presets.iter().map(name).collect::<Vec<_>>().join(", ")
}

impl ConfigArgs {
    /// Resolves preset, file and flags into one configuration.
    pub fn resolve(&self) -> Result<Config, Failure> {
        let (file, file_name) = match &self.config {
            Some(path) => (read_file(path, "--config")?, path.display().to_string()),
            None => (File::default(), String::new()),
        };
        let file_name = file_name.as_str();
        let seq = match (self.seq, &file.model.seq_len) {
            (Some(seq), _) => seq,
            (None, Some(q)) => quantity(q, parse_tokens, file_name, "model.seq_len")?,
            (None, None) => {
                return Err(Failure::new(exit::BAD_INPUT, "no sequence length: give --seq (e.g. --seq 1M)"));
            }
        };
        let micro_batch = self.micro_batch.or(file.model.micro_batch).unwrap_or(1);
        // The flag's model (a preset or a config.json) replaces the file's.
        let source = match (&self.model, &file.model.preset, &file.model.hf_config) {
            (Some(arg), _, _) => match hf_config_arg(arg) {
                Some(path) => ModelSource::HfConfig(path),
                None => ModelSource::Preset(arg.clone()),
            },
            (None, Some(_), Some(_)) => {
                return Err(Failure::new(
                    exit::BAD_INPUT,
                    format!("{file_name}: the [model] table gives both preset and hf_config: keep one"),
                ));
            }
            (None, Some(preset), None) => ModelSource::Preset(preset.clone()),
            (None, None, Some(path)) => {
                // Relative to the TOML file, as the file's author sees it.
                let base = Path::new(file_name).parent().unwrap_or(Path::new(""));
                ModelSource::HfConfig(base.join(path))
            }
            (None, None, None) => ModelSource::Shape,
        };
        let mut model = match &source {
            ModelSource::HfConfig(path) => hf_model(path, seq, micro_batch)?,
            ModelSource::Preset(name) => ModelConfig::preset(name, seq, micro_batch).map_err(|_| {
                Failure::new(
                    exit::BAD_INPUT,
                    format!(
                        "unknown model preset {name:?}: use one of {}, a Hugging Face config.json or give the \
                         shape in --config",
                        preset_names(MODEL_PRESETS, |p| p.name)
                    ),
                )
            })?,
            ModelSource::Shape => {
                let m = &file.model;
                match (m.layers.or(self.layers), m.hidden.or(self.hidden), m.heads.or(self.heads)) {
                    (Some(layers), Some(hidden), Some(heads)) => {
                        ModelConfig::new("custom", layers, hidden, heads, seq, micro_batch)
                    }
                    _ => {
                        return Err(Failure::new(
                            exit::BAD_INPUT,
                            "no model: give --model 7b (or another preset, or a Hugging Face config.json), or layers, \
                             hidden and heads",
                        ));
                    }
                }
            }
        };
        let m = &file.model;
        apply(&mut model.layers, [m.layers, self.layers]);
        apply(&mut model.hidden, [m.hidden, self.hidden]);
        // Multi-head attention stays so when the head count changes; a grouped model keeps its
        // K/V heads (the model's validation says if they no longer divide the heads).
        let multi_head = model.kv_heads == model.heads;
        apply(&mut model.heads, [m.heads, self.heads]);
        if multi_head {
            model.kv_heads = model.heads;
        }
        apply(&mut model.kv_heads, [m.kv_heads, self.kv_heads]);
        // A new hidden size moves the default MLP width with it.
        if m.hidden.or(self.hidden).is_some() {
            model.ffn_hidden = model.hidden.saturating_mul(4);
        }
        apply(&mut model.ffn_hidden, [m.ffn_hidden, self.ffn_hidden]);
        apply(&mut model.vocab, [m.vocab, self.vocab]);
        apply_architecture(&mut model.architecture, m, file_name)?;
        let a = &mut model.architecture;
        apply(&mut a.ffn, [self.ffn]);
        apply(&mut a.norm, [self.norm]);
        apply(&mut a.biases, [self.biases]);
        apply(&mut a.tied_embeddings, [self.tied_embeddings]);

        let tensor = self.tp.or(file.parallel.tensor).unwrap_or(1);
        let context = self.cp.or(file.parallel.context).unwrap_or(1);
        let sharding = match (self.zero, file.parallel.zero) {
            (Some(sharding), _) => sharding,
            (None, Some(stage)) => OptimizerSharding::from_stage(stage).ok_or_else(|| {
                Failure::new(
                    exit::BAD_INPUT,
                    format!("{file_name}: parallel.zero = {stage}: expected a ZeRO stage 0, 1 or 2"),
                )
            })?,
            (None, None) => OptimizerSharding::Replicated,
        };

        // A machine file (what `memo profile` writes) replaces --config's [machine] table.
        let (machine_table, machine_file_name) = match &self.machine_file {
            Some(path) => (read_file(path, "--machine-file")?.machine, path.display().to_string()),
            None => (file.machine, file_name.to_string()),
        };
        let preset_name = self.machine.clone().or_else(|| machine_table.preset.clone());
        let mut hardware = machine_of_table(&machine_table, self.machine.as_deref(), &machine_file_name)?;
        let mut interconnect = interconnect_of_table(&machine_table, &hardware, &machine_file_name)?;
        apply(&mut interconnect.bytes_per_s, [self.interconnect_bandwidth]);
        apply(&mut interconnect.latency_ns, [self.interconnect_latency]);
        let mut network = network_of_table(&machine_table, &hardware, &machine_file_name)?;
        apply(&mut network.bytes_per_s, [self.network_bandwidth]);
        apply(&mut network.latency_ns, [self.network_latency]);
        let flags = [
            (&mut hardware.device_memory_bytes, self.device_memory),
            (&mut hardware.host_memory_per_node_bytes, self.host_memory),
            (&mut hardware.gpus_per_node, self.gpus_per_node),
            (&mut hardware.d2h_bytes_per_s, self.d2h),
            (&mut hardware.h2d_bytes_per_s, self.h2d),
            (&mut hardware.gpus_sharing_uplink, self.gpus_sharing_uplink),
            (&mut hardware.peak_flops, self.peak_flops),
            (&mut hardware.achieved_flops, self.achieved_flops),
        ];
        for (field, value) in flags {
            apply(field, [value]);
        }
        if let Some(seconds) = self.layer_time {
            hardware.measured_layer_forward_s = Some(seconds);
        }
        model.validate().map_err(|e| Failure::new(exit::BAD_INPUT, format!("model: {e}")))?;
        hardware.validate().map_err(|e| Failure::new(exit::BAD_INPUT, format!("machine: {e}")))?;
        // d follows from the nodes over the c x t GPUs of one sequence.
        let (data, node_count) = data_and_nodes(
            tensor.saturating_mul(context),
            self.dp.or(file.parallel.data),
            self.nodes.or(file.parallel.nodes),
            hardware.gpus_per_node,
        );
        let parallel = Parallelism::new(tensor, data).with_context(context);
        parallel.validate_for(&model).map_err(|e| Failure::new(exit::BAD_INPUT, format!("parallel layout: {e}")))?;
        // c > 1 ranks inside a node pass K/V over the node's links as t > 1 ranks gather.
        interconnect
            .validate_for(parallel.tensor.max(parallel.context))
            .map_err(|e| Failure::new(exit::BAD_INPUT, format!("machine: {e}")))?;
        let machine_overrides = match preset_name.as_deref().map(Hardware::preset) {
            Some(Ok(preset)) => machine_overrides(&preset, &hardware, &interconnect, &network),
            _ => Vec::new(),
        };
        if parallel.tensor > hardware.gpus_per_node {
            let gpus = hardware.gpus_per_node;
            let changed = machine_overrides.iter().any(|o| o.field == "gpus_per_node");
            return Err(Failure::new(
                exit::BAD_INPUT,
                format!(
                    "parallel layout: t = {} needs {} GPUs in one node, but {} has {gpus} GPU{} per node{}: a \
                     tensor-parallel group stays inside one node (its collectives run in every layer, too often \
                     for the network between nodes); use {} (with --nodes for more GPUs), or a machine with more \
                     GPUs per node ({})",
                    parallel.tensor,
                    parallel.tensor,
                    hardware.name,
                    if gpus == 1 { "" } else { "s" },
                    if changed { " (as overridden)" } else { "" },
                    if gpus == 1 { "--tp 1".to_string() } else { format!("--tp {gpus} or less") },
                    multi_gpu_presets(),
                ),
            ));
        }
        let nodes = Nodes { count: node_count, network };
        nodes.validate_for(&parallel, &hardware).map_err(|e| {
            let origin = match (self.dp.or(file.parallel.data), self.nodes.or(file.parallel.nodes)) {
                (Some(_), Some(_)) => "; or leave --dp out: d then follows from --nodes",
                (None, Some(_)) => " (d followed from --nodes: nodes x GPUs per node / (c x t))",
                (Some(_), None) => " (the nodes followed from --dp: d x c x t GPUs over whole nodes)",
                (None, None) => "",
            };
            Failure::new(exit::BAD_INPUT, format!("parallel layout: {e}{origin}"))
        })?;
        Ok(Config {
            model,
            parallel,
            hardware,
            interconnect,
            nodes,
            sharding,
            machine_overrides,
            machine_source: machine_file_name,
        })
    }
}

/// `d` and the node count from what was given (`spec/cost-model.md` section 10): both as given;
/// `d = nodes x gpus_per_node / t` from the nodes; the nodes `d x t` needs from `d` (one when it
/// fits one node); one node and `d = 1` from neither. [`Nodes::validate_for`] then refuses a
/// layout that does not fill its nodes, so a derived count that does not divide is caught there.
fn data_and_nodes(tensor: u64, data: Option<u64>, nodes: Option<u64>, gpus_per_node: u64) -> (u64, u64) {
    match (data, nodes) {
        (Some(data), Some(nodes)) => (data, nodes),
        (None, Some(nodes)) => (nodes.saturating_mul(gpus_per_node).checked_div(tensor).unwrap_or(0).max(1), nodes),
        (Some(data), None) => {
            let gpus = data.saturating_mul(tensor);
            (data, gpus.div_ceil(gpus_per_node.max(1)).max(1))
        }
        (None, None) => (1, 1),
    }
}

/// Where the model of a planning command comes from.
enum ModelSource {
    /// A preset's name.
    Preset(String),
    /// A Hugging Face `config.json`.
    HfConfig(PathBuf),
    /// `layers`, `hidden` and `heads` given one by one.
    Shape,
}

/// The `config.json` that `--model ARG` names, if it names one: a path ending in `.json`, or an
/// existing file whose text parses as JSON (a preset name otherwise).
fn hf_config_arg(arg: &str) -> Option<PathBuf> {
    let path = Path::new(arg);
    if arg.to_ascii_lowercase().ends_with(".json") {
        return Some(path.to_path_buf());
    }
    let is_json = path.is_file()
        && std::fs::read_to_string(path).is_ok_and(|text| serde_json::from_str::<serde_json::Value>(&text).is_ok());
    is_json.then(|| path.to_path_buf())
}

/// The model of a Hugging Face `config.json`. Every failure is one line naming the file: an
/// unreadable file is an I/O error (exit 1), a config the planner cannot describe bad input (2).
fn hf_model(path: &Path, seq_len: u64, micro_batch: u64) -> Result<ModelConfig, Failure> {
    let name = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| {
        let (code, what) = match e.kind() {
            std::io::ErrorKind::InvalidData => {
                (exit::BAD_INPUT, "it is not UTF-8 text; a config.json is JSON".to_string())
            }
            _ => (exit::IO_ERROR, format!("{e}; check the path and permissions")),
        };
        Failure::new(code, format!("cannot read {name}: {what}"))
    })?;
    model_from_hf_config(&text, &hf_model_name(path), seq_len, micro_batch)
        .map_err(|e| Failure::new(exit::BAD_INPUT, format!("{name}: {e}")))
}

/// A `config.json`'s model name: its directory's name (`.../Llama-3.1-8B/config.json`), the
/// repository's in a Hugging Face cache snapshot (`models--meta-llama--Llama-3.1-8B/snapshots/
/// <commit>/config.json`), else the file's stem.
fn hf_model_name(path: &Path) -> String {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let name_of = |p: Option<&Path>| p.and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned());
    let directory = absolute.parent();
    let snapshots = directory.and_then(Path::parent);
    if name_of(snapshots).as_deref() == Some("snapshots") {
        if let Some(repository) = name_of(snapshots.and_then(Path::parent)) {
            if let Some(model) = repository.strip_prefix("models--").and_then(|r| r.rsplit("--").next()) {
                return model.to_string();
            }
        }
    }
    name_of(directory)
        .filter(|n| !n.is_empty())
        .or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "custom".to_string())
}

/// The machine of a `[machine]` table: its `preset` (or `preset_override`, e.g. `--machine`) with
/// the table's fields on top. With no preset, the table must give every field that has no default
/// (`device_memory`, `host_memory_per_node`, `d2h`, `h2d`, `peak_flops`): `gpus_per_node` and
/// `gpus_sharing_uplink` default to 1, `achieved_flops` to 60% of `peak_flops`.
fn machine_of_table(table: &MachineTable, preset_override: Option<&str>, file: &str) -> Result<Hardware, Failure> {
    let f = table;
    let q = |value: &Option<Quantity>, parse, key| -> Result<Option<u64>, Failure> {
        value.as_ref().map(|v| quantity(v, parse, file, key)).transpose()
    };
    let device_memory = q(&f.device_memory, parse_bytes, "machine.device_memory")?;
    let host_memory = q(&f.host_memory_per_node, parse_bytes, "machine.host_memory_per_node")?;
    let d2h = q(&f.d2h, parse_rate, "machine.d2h")?;
    let h2d = q(&f.h2d, parse_rate, "machine.h2d")?;
    let peak = q(&f.peak_flops, parse_flops, "machine.peak_flops")?;
    let achieved = q(&f.achieved_flops, parse_flops, "machine.achieved_flops")?;
    let measured_rates = MeasuredRates {
        attention_forward_flops: q(&f.attention_forward_flops, parse_flops, "machine.attention_forward_flops")?,
        attention_backward_flops: q(&f.attention_backward_flops, parse_flops, "machine.attention_backward_flops")?,
        gemm_flops: q(&f.gemm_flops, parse_flops, "machine.gemm_flops")?,
    };
    let mut hardware = match preset_override.map(str::to_string).or(f.preset.clone()) {
        Some(name) => Hardware::preset(&name).map_err(|_| {
            Failure::new(
                exit::BAD_INPUT,
                format!("unknown machine preset {name:?}: use one of {}", preset_names(HARDWARE_PRESETS, |p| p.name)),
            )
        })?,
        None => match (device_memory, host_memory, d2h, h2d, peak) {
            (Some(device), Some(host), Some(d2h), Some(h2d), Some(peak)) => Hardware {
                name: Path::new(file).file_stem().map_or("custom".into(), |s| s.to_string_lossy().into_owned()),
                device_memory_bytes: device,
                host_memory_per_node_bytes: host,
                gpus_per_node: 1,
                d2h_bytes_per_s: d2h,
                h2d_bytes_per_s: h2d,
                gpus_sharing_uplink: 1,
                peak_flops: peak,
                achieved_flops: peak / 100 * memo_plan_core::model::ACHIEVED_PERCENT_OF_PEAK,
                measured_layer_forward_s: None,
                measured_rates: MeasuredRates::NONE,
            },
            _ if file.is_empty() || [device_memory, host_memory, d2h, h2d, peak].iter().all(Option::is_none) => {
                return Err(Failure::new(
                    exit::BAD_INPUT,
                    format!(
                        "no machine: give --machine with one of {} (or --machine-file)",
                        preset_names(HARDWARE_PRESETS, |p| p.name)
                    ),
                ))
            }
            _ => {
                return Err(Failure::new(
                    exit::BAD_INPUT,
                    format!(
                        "{file}: the [machine] table needs a preset ({}) or all of device_memory, \
                         host_memory_per_node, d2h, h2d and peak_flops",
                        preset_names(HARDWARE_PRESETS, |p| p.name)
                    ),
                ))
            }
        },
    };
    apply(&mut hardware.device_memory_bytes, [device_memory]);
    apply(&mut hardware.host_memory_per_node_bytes, [host_memory]);
    apply(&mut hardware.gpus_per_node, [f.gpus_per_node]);
    apply(&mut hardware.d2h_bytes_per_s, [d2h]);
    apply(&mut hardware.h2d_bytes_per_s, [h2d]);
    apply(&mut hardware.gpus_sharing_uplink, [f.gpus_sharing_uplink]);
    apply(&mut hardware.peak_flops, [peak]);
    apply(&mut hardware.achieved_flops, [achieved]);
    if let Some(seconds) = f.layer_forward_s {
        hardware.measured_layer_forward_s = Some(seconds);
    }
    hardware.measured_rates = measured_rates;
    Ok(hardware)
}

/// The network of a `[machine]` table: its `network_bandwidth` and `network_latency` over those
/// of the machine's preset (`Interconnect::network_for_hardware`).
fn network_of_table(table: &MachineTable, hardware: &Hardware, file: &str) -> Result<Interconnect, Failure> {
    let mut network = Interconnect::network_for_hardware(hardware);
    if let Some(value) = &table.network_bandwidth {
        network.bytes_per_s = quantity(value, parse_rate, file, "machine.network_bandwidth")?;
    }
    if let Some(value) = &table.network_latency {
        network.latency_ns = quantity(value, parse_latency, file, "machine.network_latency")?;
    }
    Ok(network)
}

/// The interconnect of a `[machine]` table: its `interconnect_bandwidth` and
/// `interconnect_latency` over those of the machine's preset (`Interconnect::for_hardware`).
fn interconnect_of_table(table: &MachineTable, hardware: &Hardware, file: &str) -> Result<Interconnect, Failure> {
    let mut interconnect = Interconnect::for_hardware(hardware);
    if let Some(value) = &table.interconnect_bandwidth {
        interconnect.bytes_per_s = quantity(value, parse_rate, file, "machine.interconnect_bandwidth")?;
    }
    if let Some(value) = &table.interconnect_latency {
        interconnect.latency_ns = quantity(value, parse_latency, file, "machine.interconnect_latency")?;
    }
    Ok(interconnect)
}

/// The machine a `memo train` or `memo profile` runs for: `--machine-file FILE` (its `[machine]`
/// table), else the preset `name`. The result is validated.
pub fn machine(preset: &str, machine_file: Option<&Path>) -> Result<Hardware, Failure> {
    let hardware = match machine_file {
        Some(path) => {
            let name = path.display().to_string();
            let file = read_file(path, "--machine-file")?;
            let hardware = machine_of_table(&file.machine, None, &name)?;
            hardware.validate().map_err(|e| Failure::new(exit::BAD_INPUT, format!("{name}: machine: {e}")))?;
            hardware
        }
        None => machine_of_table(&MachineTable::default(), Some(preset), "")?,
    };
    Ok(hardware)
}

/// A model from the `[model]` table of a TOML file (a preset name and/or layers, hidden, heads;
/// `vocab` defaults to 256 here, the byte-level vocabulary of `memo train`).
fn model_from_file(path: &Path, seq_len: u64, micro_batch: u64) -> Result<ModelConfig, Failure> {
    let file = read_file(path, "--model")?;
    let m = &file.model;
    let name = path.display().to_string();
    let mut model = match (&m.preset, &m.hf_config) {
        (Some(_), Some(_)) => {
            return Err(Failure::new(
                exit::BAD_INPUT,
                format!("{name}: the [model] table gives both preset and hf_config: keep one"),
            ))
        }
        (Some(preset), None) => ModelConfig::preset(preset, seq_len, micro_batch)
            .map_err(|e| Failure::new(exit::BAD_INPUT, format!("{name}: model.preset: {e}")))?,
        (None, Some(hf)) => hf_model(&path.parent().unwrap_or(Path::new("")).join(hf), seq_len, micro_batch)?,
        (None, None) => match (m.layers, m.hidden, m.heads) {
            (Some(layers), Some(hidden), Some(heads)) => {
                let mut model = ModelConfig::new("custom", layers, hidden, heads, seq_len, micro_batch);
                model.vocab = 256;
                model
            }
            _ => {
                return Err(Failure::new(
                    exit::BAD_INPUT,
                    format!("{name}: the [model] table needs a preset or layers, hidden and heads"),
                ))
            }
        },
    };
    apply(&mut model.kv_heads, [m.kv_heads]);
    apply(&mut model.ffn_hidden, [m.ffn_hidden]);
    apply(&mut model.vocab, [m.vocab]);
    apply_architecture(&mut model.architecture, m, &name)?;
    model.validate().map_err(|e| Failure::new(exit::BAD_INPUT, format!("{name}: model: {e}")))?;
    Ok(model)
}

/// The architecture fields of a `[model]` table over `architecture`: `ffn`, `norm`, `biases`
/// (by their names), `tied_embeddings`, `rope_theta`, `norm_eps`.
fn apply_architecture(architecture: &mut Architecture, m: &ModelTable, file_name: &str) -> Result<(), Failure> {
    let bad =
        |field: &str, error: String| Failure::new(exit::BAD_INPUT, format!("{file_name}: model.{field}: {error}"));
    if let Some(ffn) = &m.ffn {
        architecture.ffn = parse_ffn(ffn).map_err(|e| bad("ffn", e))?;
    }
    if let Some(norm) = &m.norm {
        architecture.norm = parse_norm(norm).map_err(|e| bad("norm", e))?;
    }
    if let Some(biases) = &m.biases {
        architecture.biases = parse_biases(biases).map_err(|e| bad("biases", e))?;
    }
    apply(&mut architecture.tied_embeddings, [m.tied_embeddings]);
    apply(&mut architecture.rope_theta, [m.rope_theta]);
    apply(&mut architecture.norm_eps, [m.norm_eps]);
    Ok(())
}

/// One of `all`'s values by its name (case-insensitive), or the list of names.
fn by_name<T: Copy>(text: &str, all: &[T], name: impl Fn(T) -> &'static str, what: &str) -> Result<T, String> {
    all.iter().copied().find(|&v| name(v).eq_ignore_ascii_case(text.trim())).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|&v| name(v)).collect();
        format!("`{text}` is no {what}: use one of {}", names.join(", "))
    })
}

/// `gelu` or `swiglu`.
pub fn parse_ffn(text: &str) -> Result<Ffn, String> {
    by_name(text, &Ffn::ALL, Ffn::name, "FFN kind")
}

/// `layernorm` or `rmsnorm`.
pub fn parse_norm(text: &str) -> Result<Norm, String> {
    by_name(text, &Norm::ALL, Norm::name, "norm kind")
}

/// `all`, `qkv` or `none`.
pub fn parse_biases(text: &str) -> Result<Biases, String> {
    by_name(text, &Biases::ALL, Biases::name, "bias setting")
}

/// Overrides `field` with each given value in turn (later ones win).
fn apply<T: Copy, const N: usize>(field: &mut T, values: [Option<T>; N]) {
    for value in values.into_iter().flatten() {
        *field = value;
    }
}

/// The model `--model ARG` names for `memo train` and `memo profile`: `tiny`, `small`, `tiny-llama`,
/// `small-llama` (`memo_runtime::TRAINING_MODELS`), or a TOML
/// file with a `[model]` table (any existing file is read as one, whatever its extension).
pub fn model_arg(arg: &str, seq_len: u64, micro_batch: u64) -> Result<ModelConfig, Failure> {
    if let Some(mut model) = memo_runtime::training_model(arg, seq_len) {
        model.micro_batch = micro_batch;
        return Ok(model);
    }
    if let Some(path) = hf_config_arg(arg) {
        return hf_model(&path, seq_len, micro_batch);
    }
    if arg.ends_with(".toml") || Path::new(arg).is_file() {
        return model_from_file(arg.as_ref(), seq_len, micro_batch);
    }
    Err(Failure::new(
        exit::BAD_INPUT,
        format!(
            "--model {arg}: no such model or file; use tiny, small, tiny-llama, small-llama, a TOML file with a [model] \
             table or a Hugging Face config.json"
        ),
    ))
}

/// A TOML file as its table. An unreadable file is an I/O error (exit 1) with the OS's reason; a
/// file that is not UTF-8 text (a binary given by mistake) or not TOML is bad input (exit 2)
/// naming the file, the line and column, and what the option takes.
fn read_file(path: &Path, option: &str) -> Result<File, Failure> {
    let text = read_text(path, option)?;
    toml::from_str(&text).map_err(|e| Failure::new(exit::BAD_INPUT, toml_error_line(path, &text, &e)))
}

/// The contents of a text file the user named, or a one-line failure.
fn read_text(path: &Path, option: &str) -> Result<String, Failure> {
    let name = path.display();
    let bytes = std::fs::read(path).map_err(|e| {
        Failure::new(exit::IO_ERROR, format!("cannot read {name}: {e}; check the path and permissions"))
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
        Failure::new(
            exit::BAD_INPUT,
            format!(
                "{name}:{line}: not a text file (byte {at} is not UTF-8): {option} takes a TOML file; is this \
                 the file you meant?"
            ),
        )
    })
}

/// `file:line:column: message` for a TOML error: toml's own rendering spans several lines with a
/// source excerpt and `|` gutters, which a one-line error cannot hold.
fn toml_error_line(path: &Path, text: &str, error: &toml::de::Error) -> String {
    let name = path.display();
    let message = error.message().trim().replace('\n', " ");
    match error.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = 1 + before.matches('\n').count();
            let column = 1 + before.rsplit('\n').next().map_or(0, |l| l.chars().count());
            format!("{name}:{line}:{column}: {message}")
        }
        None => format!("{name}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toml_rate_needs_a_unit_and_an_integer_size_is_bytes() {
        let dir = std::env::temp_dir().join(format!("memo-config-units-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("units.toml");
        let resolve = |machine: &str| {
            std::fs::write(
                &path,
                format!("[model]\npreset = \"7b\"\nseq_len = \"32K\"\n[machine]\npreset = \"a800x8\"\n{machine}"),
            )
            .unwrap();
            ConfigArgs { config: Some(path.clone()), tp: Some(8), ..ConfigArgs::default() }.resolve()
        };
        let message = |machine: &str| resolve(machine).unwrap_err().message().to_string();
        assert!(message("d2h = \"12500\"\n").ends_with("machine.d2h = \"12500\": a rate needs a unit, e.g. 12.5GB/s or 25GiB/s (decimal KB/s..PB/s, binary KiB/s..PiB/s)"));
        assert!(message("d2h = 12500\n").contains("machine.d2h = 12500: a rate needs a unit"));
        assert!(message("peak_flops = 312\n").contains("machine.peak_flops = 312: a FLOP rate needs a unit"));
        assert!(message("device_memory = -1\n").contains("can't be negative"));
        let config = resolve(
            "d2h = \"12.5GB/s\"\nh2d = \"25 GiB/s\"\ndevice_memory = 85899345920\nhost_memory_per_node = \"1.5TB\"\n",
        )
        .unwrap();
        assert_eq!(config.hardware.d2h_bytes_per_s, 12_500_000_000);
        assert_eq!(config.hardware.h2d_bytes_per_s, 25 << 30);
        assert_eq!(config.hardware.device_memory_bytes, 80 << 30);
        assert_eq!(config.hardware.host_memory_per_node_bytes, 1_500_000_000_000);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn flags_override_the_file_which_overrides_the_preset() {
        let dir = std::env::temp_dir().join(format!("memo-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            "[model]\npreset = \"7b\"\nlayers = 4\nseq_len = \"32K\"\n[machine]\npreset = \"a800x8\"\nd2h = \"10GB/s\"\n",
        )
        .unwrap();
        let args = ConfigArgs { config: Some(path.clone()), layers: Some(6), tp: Some(2), ..ConfigArgs::default() };
        let config = args.resolve().unwrap();
        assert_eq!(config.model.layers, 6);
        assert_eq!(config.model.hidden, 4096);
        assert_eq!(config.model.seq_len, 32 << 10);
        assert_eq!(config.hardware.d2h_bytes_per_s, 10_000_000_000);
        assert_eq!(config.parallel.tensor, 2);
        std::fs::write(&path, "[model]\npreset = \"7b\"\nlayerz = 4\n").unwrap();
        let error = ConfigArgs { config: Some(path), ..ConfigArgs::default() }.resolve().unwrap_err();
        assert!(error.message().contains("layerz"), "{}", error.message());
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[cfg(test)]
mod interconnect_tests {
    use super::*;

    #[test]
    fn latencies_parse_with_their_units() {
        assert_eq!(parse_latency("5us"), Ok(5_000));
        assert_eq!(parse_latency("0.5ms"), Ok(500_000));
        assert_eq!(parse_latency("2000ns"), Ok(2_000));
        assert_eq!(parse_latency("1s"), Ok(1_000_000_000));
        assert_eq!(parse_latency("750"), Ok(750));
        for bad in ["", "fast", "-1us", "1e30s", "nan"] {
            assert!(parse_latency(bad).is_err(), "{bad}");
        }
    }

    /// The preset's interconnect, then the machine file's keys, then the flags.
    #[test]
    fn the_interconnect_comes_from_the_preset_the_file_and_the_flags() {
        let base = ConfigArgs {
            model: Some("7b".into()),
            seq: Some(1 << 20),
            machine: Some("a800x8".into()),
            tp: Some(8),
            ..ConfigArgs::default()
        };
        let config = base.resolve().unwrap();
        assert_eq!(config.interconnect, Interconnect { bytes_per_s: 200_000_000_000, latency_ns: 5_000 });
        let dir = std::env::temp_dir().join(format!("memo-interconnect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("machine.toml");
        std::fs::write(
            &path,
            "[machine]\npreset = \"h100x8\"\ninterconnect_bandwidth = \"100GB/s\"\ninterconnect_latency = \"2us\"\n",
        )
        .unwrap();
        let from_file =
            ConfigArgs { machine: None, machine_file: Some(path.clone()), ..base.clone() }.resolve().unwrap();
        assert_eq!(from_file.interconnect, Interconnect { bytes_per_s: 100_000_000_000, latency_ns: 2_000 });
        let flagged = ConfigArgs {
            machine: None,
            machine_file: Some(path),
            interconnect_bandwidth: Some(50_000_000_000),
            interconnect_latency: Some(1),
            ..base.clone()
        };
        assert_eq!(
            flagged.resolve().unwrap().interconnect,
            Interconnect { bytes_per_s: 50_000_000_000, latency_ns: 1 }
        );
        // A machine without a preset has no interconnect: t > 1 asks for one.
        let custom = dir.join("custom.toml");
        std::fs::write(
            &custom,
            "[machine]\ndevice_memory = \"80GiB\"\nhost_memory_per_node = \"2TiB\"\nd2h = \"25GB/s\"\nh2d = \"25GB/s\"\n\
             peak_flops = \"312T\"\n",
        )
        .unwrap();
        let error = ConfigArgs { machine: None, machine_file: Some(custom), ..base }.resolve().unwrap_err();
        assert!(error.message().contains("interconnect_bytes_per_s"), "{}", error.message());
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[cfg(test)]
mod hf_tests {
    use super::*;

    #[test]
    fn a_config_json_is_named_after_its_directory_or_its_repository() {
        assert_eq!(hf_model_name(Path::new("examples/models/hf/llama3.1-8b/config.json")), "llama3.1-8b");
        let snapshot = "/cache/hub/models--meta-llama--Llama-3.1-8B/snapshots/0e9e39f/config.json";
        assert_eq!(hf_model_name(Path::new(snapshot)), "Llama-3.1-8B");
        assert_eq!(hf_model_name(Path::new("/qwen.json")), "qwen");
    }

    #[test]
    fn a_toml_hf_config_is_read_relative_to_the_toml_and_flags_apply_on_top() {
        let dir = std::env::temp_dir().join(format!("memo-hf-config-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("Mistral-7B-v0.3")).unwrap();
        let json = include_str!("../../examples/models/hf/mistral-7b/config.json");
        std::fs::write(dir.join("Mistral-7B-v0.3/config.json"), json).unwrap();
        let toml = dir.join("cluster.toml");
        std::fs::write(&toml, "[model]\nhf_config = \"Mistral-7B-v0.3/config.json\"\nseq_len = \"32K\"\n").unwrap();
        let args = ConfigArgs {
            config: Some(toml.clone()),
            machine: Some("h100x8".into()),
            layers: Some(4),
            ..ConfigArgs::default()
        };
        let config = args.resolve().unwrap();
        let mut expected = ModelConfig::preset("mistral-7b", 32 << 10, 1).unwrap();
        expected.name = "Mistral-7B-v0.3".into();
        expected.layers = 4;
        assert_eq!(config.model, expected);
        // The flag's model replaces the file's.
        let flagged = ConfigArgs { model: Some("7b".into()), ..args.clone() }.resolve().unwrap();
        assert_eq!(flagged.model.name, "7b");
        // Both in the table is ambiguous.
        std::fs::write(&toml, "[model]\npreset = \"7b\"\nhf_config = \"Mistral-7B-v0.3/config.json\"\n").unwrap();
        let error = ConfigArgs { seq: Some(1024), ..args }.resolve().unwrap_err();
        assert!(error.message().contains("hf_config"), "{}", error.message());
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[cfg(test)]
mod node_tests {
    use super::*;

    /// `d` follows from the nodes, the nodes from `d`, and neither given is one node with `d = 1`
    /// (part of it when `t` is below its GPUs).
    #[test]
    fn data_and_nodes_follow_from_each_other() {
        assert_eq!(data_and_nodes(8, None, Some(4), 8), (4, 4));
        assert_eq!(data_and_nodes(2, None, Some(2), 8), (8, 2));
        assert_eq!(data_and_nodes(8, Some(4), None, 8), (4, 4));
        assert_eq!(data_and_nodes(2, Some(3), None, 8), (3, 1), "6 of a node's 8 GPUs");
        assert_eq!(data_and_nodes(4, Some(3), None, 8), (3, 2), "12 GPUs: refused later, they do not fill 2 nodes");
        assert_eq!(data_and_nodes(2, None, None, 8), (1, 1));
        assert_eq!(data_and_nodes(8, Some(2), Some(4), 8), (2, 4), "both as given, checked later");
        // Zeros reach the validation that names them, without a division by zero here.
        assert_eq!(data_and_nodes(0, None, Some(2), 8), (1, 2));
        assert_eq!(data_and_nodes(8, Some(0), None, 8), (0, 1));
    }

    /// The network comes from the preset, then the machine file's keys, then the flags, and the
    /// header lists what changed against the preset.
    #[test]
    fn the_network_comes_from_the_preset_and_the_flags() {
        let args = ConfigArgs {
            model: Some("7b".into()),
            seq: Some(8192),
            machine: Some("h100x8".into()),
            tp: Some(8),
            nodes: Some(2),
            ..ConfigArgs::default()
        };
        let config = args.resolve().unwrap();
        assert_eq!((config.parallel.data, config.nodes.count), (2, 2));
        assert_eq!(config.nodes.network, Interconnect { bytes_per_s: 50_000_000_000, latency_ns: 8_000 });
        assert!(config.machine_overrides.is_empty());
        let flagged = ConfigArgs { network_bandwidth: Some(25_000_000_000), network_latency: Some(3_000), ..args }
            .resolve()
            .unwrap();
        assert_eq!(flagged.nodes.network, Interconnect { bytes_per_s: 25_000_000_000, latency_ns: 3_000 });
        let fields: Vec<&str> = flagged.machine_overrides.iter().map(|o| o.field).collect();
        assert_eq!(fields, ["network_bandwidth", "network_latency"]);
    }
}
