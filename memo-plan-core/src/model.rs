//! The model, its parallel layout and the machine, and what follows from them alone: parameter
//! counts, the bytes of model state per GPU, and one layer's skeletal tensors per GPU
//! (`docs/technique.md` section 1; `spec/cost-model.md`).
//!
//! Conventions, all per GPU:
//! - `t` ([`Parallelism::tensor`]) is the tensor- and sequence-parallel degree (Megatron-LM TP + SP).
//!   Parameters, gradients, optimizer state and activations are divided by `t`; every division here
//!   is exact because [`Parallelism::validate_for`] requires `t` to divide `heads`, `ffn_hidden` and
//!   `seq_len`.
//! - `d` ([`Parallelism::data`]) is the data-parallel degree. It changes no per-GPU size here; the
//!   ZeRO sharding of the model state over `d x c` ranks is `model/nodes.rs`'s.
//! - `c` ([`Parallelism::context`]) is the context-parallel degree: each GPU holds the `s / c`
//!   tokens of its rank ([`ModelConfig::rank_seq_len`], the one place `c` enters every per-GPU
//!   token count), shared by its `t` ranks.
//! - Byte counts are `u64` computed with checked arithmetic: an overflow is a [`ModelError::Overflow`],
//!   never a wrap or a panic.
//!
//! The presets (the paper's four models and four machines) live in `model/presets.rs`, every
//! number in one table with where it comes from.

use alloc::string::String;
use core::fmt;

mod architecture;
pub mod hf;
mod nodes;
mod presets;

pub use architecture::{Architecture, Biases, Ffn, Norm, RopeScaling, SkeletalWidths};
pub use hf::{model_from_hf_config, HfConfigError};
pub use nodes::{shard_bytes, Nodes, OptimizerSharding};

pub use presets::{
    HardwarePreset, InterconnectPreset, ModelPreset, ACHIEVED_PERCENT_OF_PEAK, CPU_INTERCONNECT, HARDWARE_PRESETS,
    INTERCONNECT_PRESETS, MODEL_PRESETS,
};

/// Bytes of one bf16 element: weights, gradients and activations are stored in bf16.
pub const BF16_BYTES: u64 = 2;
/// Bytes of one fp32 element: the attention log-sum-exp, master weights and AdamW moments.
pub const FP32_BYTES: u64 = 4;
/// Default vocabulary of the paper's GPT models (the GPT-2 BPE vocabulary).
pub const GPT2_VOCAB: u64 = 50257;

/// A decoder-only transformer (pre-norm layers, learned word embedding, rotary positions; GPT or
/// the Llama family, as its [`Architecture`] says) and the sequence it trains on.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// A name for reports (`7b`, `llama3.1-8b`, ...).
    pub name: String,
    /// Number of transformer layers `n`.
    pub layers: u32,
    /// Hidden size `h`.
    pub hidden: u64,
    /// Query heads; must divide `hidden` (head dimension `hidden / heads`).
    pub heads: u64,
    /// Key/value heads: equal to `heads` for multi-head attention, fewer for grouped-query
    /// attention (each serves `heads / kv_heads` query heads), 1 for multi-query attention. Must
    /// divide `heads`.
    pub kv_heads: u64,
    /// FFN inner size `f` (GeLU: FC1's outputs; SwiGLU: gate's and up's each); `4 * hidden` by
    /// default.
    pub ffn_hidden: u64,
    /// Vocabulary size `V` (50257 by default).
    pub vocab: u64,
    /// Tokens per sequence `s`.
    pub seq_len: u64,
    /// Sequences per micro-batch `b`.
    pub micro_batch: u64,
    /// FFN, norm, biases, tying, rotary base.
    pub architecture: Architecture,
}

/// How the model is split over GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parallelism {
    /// `t`: the tensor- and sequence-parallel degree. Divides every per-GPU size.
    pub tensor: u64,
    /// `d`: the data-parallel degree. Each data-parallel rank trains its own micro-batch.
    pub data: u64,
    /// `c`: the context-parallel degree (Megatron-LM's context parallelism, `spec/cost-model.md`
    /// section 7c). The `c` ranks of one sequence each hold `s / c` of its tokens, as two chunks
    /// (`i` and `2c - 1 - i` of `2c`) so that causal attention work is balanced, and pass K/V
    /// around a ring. 1: no context parallelism.
    pub context: u64,
}

/// One machine type: its GPUs, their host link and their speed. Sizes in bytes, rates per second.
#[derive(Clone, Debug, PartialEq)]
pub struct Hardware {
    /// A name for reports (`a800x8`, ...).
    pub name: String,
    /// Device memory of one GPU.
    pub device_memory_bytes: u64,
    /// Host memory of one node, shared by its GPUs; may be 0 (then nothing can be swapped).
    pub host_memory_per_node_bytes: u64,
    /// GPUs in one node.
    pub gpus_per_node: u64,
    /// Device-to-host copy bandwidth of one GPU when it copies alone.
    pub d2h_bytes_per_s: u64,
    /// Host-to-device copy bandwidth of one GPU when it copies alone.
    pub h2d_bytes_per_s: u64,
    /// How many GPUs share one host uplink (1 = each GPU has its own link). When they all copy at
    /// once, each gets `1 / gpus_sharing_uplink` of the bandwidth.
    pub gpus_sharing_uplink: u64,
    /// Dense bf16 peak FLOP/s of one GPU: the denominator of MFU.
    pub peak_flops: u64,
    /// FLOP/s one GPU actually sustains in a layer's forward: the time model divides FLOPs by it.
    pub achieved_flops: u64,
    /// A measured forward time of one layer, in seconds, for this model and sequence. When given,
    /// it replaces `FLOPs / achieved_flops` (MEMO takes T_layer from a profile).
    pub measured_layer_forward_s: Option<f64>,
    /// FLOP/s of single kernels measured on this machine (`memo profile`): when given, the cost
    /// model times attention and matrix-product launches at them instead of `achieved_flops`.
    pub measured_rates: MeasuredRates,
}

/// FLOP rates of single kernels measured on one GPU (`memo profile`'s `attention_forward_flops`,
/// `attention_backward_flops` and `gemm_flops`), each optional. The cost model
/// (`spec/cost-model.md` section 7) times an attention forward launch at
/// `attention_forward_flops`, an attention backward launch at `attention_backward_flops` and every
/// matrix-product launch (the linear layers, their backward, the classifier) at `gemm_flops`;
/// a launch whose rate is absent, and every other launch, is timed as without them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MeasuredRates {
    /// One attention forward's FLOP/s, counting its two products with the causal half skipped
    /// (`2 b s^2 h / t` per launch, as the plan's launches count them).
    pub attention_forward_flops: Option<u64>,
    /// One attention backward's FLOP/s, counting what FlashAttention's backward executes: 5/2 of
    /// the forward's FLOPs ([`crate::cost::attention_backward_executed_flops`]; the plan's launch
    /// counts the model's 2x).
    pub attention_backward_flops: Option<u64>,
    /// One matrix product's FLOP/s (`2 * rows * in * out`).
    pub gemm_flops: Option<u64>,
}

impl MeasuredRates {
    /// No measured rate.
    pub const NONE: MeasuredRates =
        MeasuredRates { attention_forward_flops: None, attention_backward_flops: None, gemm_flops: None };

    /// The rates by their machine-file key, in report order.
    pub fn named(&self) -> [(&'static str, Option<u64>); 3] {
        [
            ("attention_forward_flops", self.attention_forward_flops),
            ("attention_backward_flops", self.attention_backward_flops),
            ("gemm_flops", self.gemm_flops),
        ]
    }

    /// Whether no rate is given.
    pub fn is_empty(&self) -> bool {
        self.named().iter().all(|(_, rate)| rate.is_none())
    }
}

/// The links between the GPUs of one tensor-parallel group (`spec/cost-model.md`, "Collectives"):
/// a ring in which every GPU sends to one neighbour while it receives from the other. Part of the
/// machine description beside [`Hardware`]; [`Interconnect::for_hardware`] gives a preset's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Interconnect {
    /// Bytes per second one GPU sends to its ring neighbour (per direction; a "bidirectional"
    /// datasheet figure is twice this). 0: unknown, and then a plan with `t > 1` is refused.
    pub bytes_per_s: u64,
    /// Latency of one ring step, nanoseconds.
    pub latency_ns: u64,
}

impl Interconnect {
    /// No interconnect known: plans with `t = 1` need none.
    pub const UNKNOWN: Interconnect = Interconnect { bytes_per_s: 0, latency_ns: 0 };

    /// The interconnect of the machine preset named like `hardware` (case-insensitive; `cpu` for
    /// the CPU backend's ranks, which share host memory), or [`Interconnect::UNKNOWN`].
    pub fn for_hardware(hardware: &Hardware) -> Self {
        if hardware.name.eq_ignore_ascii_case("cpu") {
            return CPU_INTERCONNECT;
        }
        INTERCONNECT_PRESETS
            .iter()
            .find(|p| p.machine.eq_ignore_ascii_case(&hardware.name))
            .map_or(Interconnect::UNKNOWN, |p| p.interconnect)
    }

    /// Each GPU's share of the network between nodes of the machine preset named like `hardware`
    /// (case-insensitive), or [`Interconnect::UNKNOWN`] (the CPU backend's ranks have none).
    pub fn network_for_hardware(hardware: &Hardware) -> Self {
        INTERCONNECT_PRESETS
            .iter()
            .find(|p| p.machine.eq_ignore_ascii_case(&hardware.name))
            .map_or(Interconnect::UNKNOWN, |p| p.network)
    }

    /// Checks that a group of `tensor` GPUs has a known bandwidth (`t = 1` needs none).
    pub fn validate_for(&self, tensor: u64) -> Result<(), ModelError> {
        if tensor > 1 && self.bytes_per_s == 0 {
            return Err(zero("interconnect_bytes_per_s"));
        }
        Ok(())
    }
}

/// What is wrong with a model, parallel layout or machine. Each names the field and what would fix
/// it.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelError {
    /// A field that must be at least 1 is 0.
    Zero {
        /// The field.
        field: &'static str,
    },
    /// `hidden` is not a multiple of `heads`.
    HeadsDoNotDivideHidden {
        /// `hidden`.
        hidden: u64,
        /// `heads`.
        heads: u64,
    },
    /// The head dimension `hidden / heads` is odd: rotary positions rotate pairs of a head's
    /// elements, so no kernel can run it.
    OddHeadDimension {
        /// `hidden`.
        hidden: u64,
        /// `heads`.
        heads: u64,
    },
    /// `kv_heads` does not divide `heads` (each key/value head serves the same number of query
    /// heads).
    KvHeadsDoNotDivideHeads {
        /// `heads`.
        heads: u64,
        /// `kv_heads`.
        kv_heads: u64,
    },
    /// Neither does `t` divide `kv_heads` (each rank holds `kv_heads / t` of them) nor `kv_heads`
    /// divide `t` (each key/value head replicated on `t / kv_heads` ranks).
    KvHeadsAndTensorParallel {
        /// `kv_heads`.
        kv_heads: u64,
        /// `t`.
        tensor: u64,
    },
    /// A number the kernels use (the rotary base, the norm's epsilon, the rope rescaling) that is
    /// out of its range.
    BadArchitecture {
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// SwiGLU with biases on the FFN's products (`Biases::All`): no model of the family has them,
    /// and the tensor-parallel split of a `[gate | up]` bias is not implemented.
    SwiGluWithFfnBiases,
    /// The tensor-parallel degree does not divide a size it splits.
    NotDivisibleByTensorParallel {
        /// The field that must be a multiple of `t` (`heads`, `ffn_hidden`, `seq_len`).
        field: &'static str,
        /// Its value.
        value: u64,
        /// `t`.
        tensor: u64,
    },
    /// With `c > 1`, `seq_len` is not a multiple of `2 c t` (two chunks per context-parallel
    /// rank, each split over the `t` ranks).
    NotDivisibleByContextParallel {
        /// `seq_len`.
        seq_len: u64,
        /// `c`.
        context: u64,
        /// `t`.
        tensor: u64,
    },
    /// A size computed from the inputs does not fit in 64 bits (128 for FLOPs).
    Overflow {
        /// What was being computed.
        what: &'static str,
    },
    /// `achieved_flops` is above `peak_flops`.
    AchievedAbovePeak {
        /// `achieved_flops`.
        achieved: u64,
        /// `peak_flops`.
        peak: u64,
    },
    /// A measured kernel rate ([`MeasuredRates`]) is above `peak_flops`.
    MeasuredRateAbovePeak {
        /// Its key (`gemm_flops`, ...).
        field: &'static str,
        /// The rate.
        rate: u64,
        /// `peak_flops`.
        peak: u64,
    },
    /// `measured_layer_forward_s` is not a finite number above 0.
    BadMeasuredTime {
        /// The value given.
        seconds: f64,
    },
    /// No model preset has this name.
    UnknownModel {
        /// The name asked for.
        name: String,
    },
    /// No hardware preset has this name.
    UnknownHardware {
        /// The name asked for.
        name: String,
    },
    /// A tensor-parallel group larger than a node: its collectives would cross the network.
    TensorParallelAboveNode {
        /// `t`.
        tensor: u64,
        /// GPUs in one node.
        gpus_per_node: u64,
    },
    /// The `d * c * t` ranks do not fill the nodes (or do not fit one), or `t` does not divide a
    /// node's GPUs on more than one node ([`Nodes::validate_for`]).
    RanksDoNotFillNodes {
        /// `t`.
        tensor: u64,
        /// `d`.
        data: u64,
        /// `c`.
        context: u64,
        /// Nodes of the job.
        nodes: u64,
        /// GPUs in one node.
        gpus_per_node: u64,
    },
    /// On more than one node, a context-parallel group's `t c` GPUs neither divide a node's GPUs
    /// nor are whole nodes: some groups would be split unevenly between two nodes.
    ContextGroupStraddlesNodes {
        /// `t`.
        tensor: u64,
        /// `c`.
        context: u64,
        /// GPUs in one node.
        gpus_per_node: u64,
    },
}

/// The largest divisor of `value` that is at most `limit`, for suggesting a tensor-parallel degree;
/// `None` when the search would be long (a limit above 2^16: no such degree is realistic).
fn largest_divisor_up_to(value: u64, limit: u64) -> Option<u64> {
    if limit > 1 << 16 {
        return None;
    }
    (1..=limit.min(value)).rev().find(|&d| value.is_multiple_of(d))
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::Zero { field } => write!(f, "{field} is 0: {}", zero_fix(field)),
            ModelError::HeadsDoNotDivideHidden { hidden, heads } => write!(
                f,
                "hidden = {hidden} is not a multiple of heads = {heads}: choose heads that divide hidden \
                 (head size = hidden / heads)"
            ),
            ModelError::OddHeadDimension { hidden, heads } => write!(
                f,
                "the head dimension hidden / heads = {hidden} / {heads} = {} is odd: rotary positions rotate pairs \
                 of each head's elements; choose heads so that hidden / heads is even",
                hidden / heads
            ),
            ModelError::KvHeadsDoNotDivideHeads { heads, kv_heads } => write!(
                f,
                "kv_heads = {kv_heads} does not divide heads = {heads}: grouped-query attention gives every \
                 key/value head the same number of query heads; use a kv_heads that divides {heads}"
            ),
            ModelError::KvHeadsAndTensorParallel { kv_heads, tensor } => write!(
                f,
                "kv_heads = {kv_heads} and the tensor-parallel degree t = {tensor}: t must divide kv_heads (each \
                 rank holds kv_heads / t key/value heads) or kv_heads must divide t (each key/value head is \
                 replicated on t / kv_heads ranks); use a t that is a divisor or a multiple of {kv_heads}"
            ),
            ModelError::SwiGluWithFfnBiases => f.write_str(
                "biases = all with a SwiGLU FFN is not supported (no model of the Llama family has FFN biases): \
                 use biases = qkv or none",
            ),
            ModelError::BadArchitecture { field, value } => write!(
                f,
                "{field} = {value} is out of range: rope_theta is a rotary base above 1, norm_eps a number \
                 between 0 and 1, rope_scaling's factors at least 1 with low_freq_factor < high_freq_factor"
            ),
            ModelError::NotDivisibleByTensorParallel { field, value, tensor } => {
                let below = value - value.checked_rem(*tensor).unwrap_or(0);
                let above = below.saturating_add(*tensor);
                write!(
                    f,
                    "{field} = {value} is not a multiple of the tensor-parallel degree t = {tensor}: use a {field} "
                )?;
                // 0 is no size: offer the multiples of t that are one.
                if below == 0 {
                    write!(f, "divisible by {tensor} (e.g. {above})")?;
                } else {
                    write!(f, "divisible by {tensor} (e.g. {below} or {above})")?;
                }
                write!(f, " or a t that divides {value}")?;
                match largest_divisor_up_to(*value, *tensor) {
                    Some(t) if t > 1 => write!(f, " (e.g. {t})"),
                    _ => Ok(()),
                }
            }
            ModelError::NotDivisibleByContextParallel { seq_len, context, tensor } => {
                let Some(multiple) = context.checked_mul(2).and_then(|m| m.checked_mul(*tensor)) else {
                    return write!(
                        f,
                        "2 x c x t = 2 x {context} x {tensor} is past 64 bits, so no seq_len = {seq_len} or other is a \
                         multiple of it (context parallelism gives each of the c ranks two of 2c chunks of the \
                         sequence, each split over the t ranks); use a smaller c"
                    );
                };
                let multiple = multiple.max(1);
                let below = seq_len - seq_len % multiple;
                let above = below.saturating_add(multiple);
                write!(
                    f,
                    "seq_len = {seq_len} is not a multiple of 2 x c x t = 2 x {context} x {tensor} = {multiple}: \
                     context parallelism gives each of the c ranks two of 2c equal chunks of the sequence, each \
                     split over the t ranks; use a seq_len divisible by {multiple} (e.g. "
                )?;
                if below == 0 {
                    write!(f, "{above})")?;
                } else {
                    write!(f, "{below} or {above})")?;
                }
                f.write_str(" or a smaller c")
            }
            ModelError::Overflow { what } => write!(
                f,
                "the {what} does not fit in an integer (64 bits for bytes, 128 for FLOPs): the model or \
                 sequence is too large to plan; \
                 use a shorter seq_len, a smaller micro_batch or a larger t"
            ),
            ModelError::AchievedAbovePeak { achieved, peak } => write!(
                f,
                "achieved_flops = {achieved} is above peak_flops = {peak}: achieved_flops is what one \
                 GPU sustains in practice and must be at most the peak"
            ),
            ModelError::MeasuredRateAbovePeak { field, rate, peak } => write!(
                f,
                "{field} = {rate} is above peak_flops = {peak}: a measured kernel rate is at most the \
                 peak; raise peak_flops or measure again"
            ),
            ModelError::BadMeasuredTime { seconds } => write!(
                f,
                "measured_layer_forward_s = {seconds} is not a time: give a finite number of seconds \
                 above 0, or leave it unset to estimate it from achieved_flops"
            ),
            ModelError::UnknownModel { name } => {
                write!(f, "no model preset is named `{name}`; valid names: ")?;
                write_names(f, MODEL_PRESETS.iter().map(|p| p.name))
            }
            ModelError::UnknownHardware { name } => {
                write!(f, "no hardware preset is named `{name}`; valid names: ")?;
                write_names(f, HARDWARE_PRESETS.iter().map(|p| p.name))
            }
            ModelError::TensorParallelAboveNode { tensor, gpus_per_node } => write!(
                f,
                "t = {tensor} needs {tensor} GPUs in one node, but a node has {gpus_per_node}: a tensor-parallel \
                 group stays inside one node (its collectives run on every layer, too often for the network); \
                 use t = {gpus_per_node} or less and more data-parallel ranks or nodes for the other GPUs"
            ),
            ModelError::RanksDoNotFillNodes { tensor, data, context, nodes, gpus_per_node } => {
                let group = tensor.saturating_mul(*context);
                let gpus = group.saturating_mul(*data);
                let have = nodes.saturating_mul(*gpus_per_node);
                if *context > 1 {
                    write!(f, "d x c x t = {data} x {context} x {tensor} = {gpus} GPUs")?;
                } else {
                    write!(f, "d x t = {data} x {tensor} = {gpus} GPUs")?;
                }
                write!(f, " on {nodes} node(s) of {gpus_per_node} GPUs ({have} GPUs): ")?;
                if *nodes > 1 && !gpus_per_node.is_multiple_of(*tensor) {
                    return write!(
                        f,
                        "t = {tensor} does not divide the {gpus_per_node} GPUs of a node, so a tensor-parallel group \
                         would straddle two nodes; use a t that divides {gpus_per_node}"
                    );
                }
                f.write_str(
                    "a job on more than one node fills every node (d x c x t = nodes x GPUs per node; on one node \
                     it may use part of it); ",
                )?;
                // The d that fills the nodes with this c x t; when c x t alone is more GPUs than the
                // nodes have, no d does, and the fix is fewer c or more nodes.
                if group > have {
                    let nodes_needed = group.div_ceil((*gpus_per_node).max(1));
                    return write!(
                        f,
                        "c x t = {context} x {tensor} = {group} GPUs alone is more than the nodes have; use \
                         {nodes_needed} node(s) or more, or a smaller c"
                    );
                }
                let fitting_d = (have / group.max(1)).max(1);
                let fitting_nodes = gpus.div_ceil((*gpus_per_node).max(1)).max(1);
                if gpus_per_node.is_multiple_of(*tensor) && gpus.is_multiple_of(*gpus_per_node) {
                    write!(f, "use d = {fitting_d} or {fitting_nodes} node(s)")
                } else {
                    write!(f, "use d = {fitting_d}")
                }
            }
            ModelError::ContextGroupStraddlesNodes { tensor, context, gpus_per_node } => {
                let group = tensor.saturating_mul(*context);
                write!(
                    f,
                    "c x t = {context} x {tensor} = {group} GPUs per context-parallel group on nodes of \
                     {gpus_per_node} GPUs: a group must sit inside one node (c x t dividing {gpus_per_node}) or \
                     fill whole nodes (c x t a multiple of {gpus_per_node}), or some groups would be split \
                     unevenly between two nodes; use a c with c x t dividing or a multiple of {gpus_per_node}"
                )
            }
        }
    }
}

impl core::error::Error for ModelError {}

fn write_names<'a>(f: &mut fmt::Formatter<'_>, names: impl Iterator<Item = &'a str>) -> fmt::Result {
    for (index, name) in names.enumerate() {
        if index > 0 {
            f.write_str(", ")?;
        }
        f.write_str(name)?;
    }
    Ok(())
}

/// What to do about a zero field.
fn zero_fix(field: &str) -> &'static str {
    match field {
        "achieved_flops" => "give the FLOP/s one GPU sustains (e.g. 60% of peak_flops) or a measured_layer_forward_s",
        "layers" | "hidden" | "heads" | "kv_heads" | "ffn_hidden" | "vocab" | "seq_len" | "micro_batch" => {
            "a model needs at least 1 of each"
        }
        "tensor" | "data" | "context" => "a parallel degree is at least 1 (1 = no parallelism)",
        "nodes" => "a job runs on at least 1 node",
        "network_bytes_per_s" => {
            "with d > 1 or c > 1 across nodes the data-parallel and context-parallel collectives need each GPU's network bandwidth per \
             direction: give --network-bandwidth or `network_bandwidth` in the machine table"
        }
        "interconnect_bytes_per_s" => {
            "with t > 1 (or c > 1, whose ring attention runs on the same links) the collectives need the GPUs' \
             link bandwidth per direction: give \
             --interconnect-bandwidth or `interconnect_bytes_per_s` in the machine file"
        }
        _ => "give the machine's value (at least 1)",
    }
}

fn zero(field: &'static str) -> ModelError {
    ModelError::Zero { field }
}

fn overflow(what: &'static str) -> ModelError {
    ModelError::Overflow { what }
}

/// `a * b`, or an overflow error naming `what`.
fn mul(a: u64, b: u64, what: &'static str) -> Result<u64, ModelError> {
    a.checked_mul(b).ok_or(overflow(what))
}

/// `a + b`, or an overflow error naming `what`.
fn add(a: u64, b: u64, what: &'static str) -> Result<u64, ModelError> {
    a.checked_add(b).ok_or(overflow(what))
}

impl ModelConfig {
    /// A GPT model ([`Architecture::GPT`], multi-head attention) with `ffn_hidden = 4 * hidden`
    /// (saturating: the sizes computed from it then report the overflow) and the GPT-2 vocabulary.
    pub fn new(name: &str, layers: u32, hidden: u64, heads: u64, seq_len: u64, micro_batch: u64) -> Self {
        ModelConfig {
            name: String::from(name),
            layers,
            hidden,
            heads,
            kv_heads: heads,
            ffn_hidden: hidden.saturating_mul(4),
            vocab: GPT2_VOCAB,
            seq_len,
            micro_batch,
            architecture: Architecture::GPT,
        }
    }

    /// The preset named `name` (case-insensitive: `7b` ... `65b`, `llama3.1-8b`, ...; see
    /// [`MODEL_PRESETS`]) training on sequences of `seq_len` tokens, `micro_batch` at a time.
    pub fn preset(name: &str, seq_len: u64, micro_batch: u64) -> Result<Self, ModelError> {
        let preset = MODEL_PRESETS
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| ModelError::UnknownModel { name: String::from(name) })?;
        Ok(preset.model(seq_len, micro_batch))
    }

    /// The layer's shape in words for reports: `32 layers, h 4096, 32 heads` for a GPT, followed
    /// by `8 K/V heads` with grouped-query attention and by the architecture where it is not GPT's
    /// (`SwiGLU FFN 14336, RMSNorm, no biases, untied`).
    pub fn shape_summary(&self) -> String {
        use core::fmt::Write;
        let mut text = alloc::format!("{} layers, h {}, {} heads", self.layers, self.hidden, self.heads);
        if self.kv_heads != self.heads {
            let _ = write!(text, ", {} K/V heads", self.kv_heads);
        }
        let a = &self.architecture;
        if *a != Architecture::GPT {
            let ffn = match a.ffn {
                Ffn::Gelu => "GeLU",
                Ffn::SwiGlu => "SwiGLU",
            };
            let norm = match a.norm {
                Norm::LayerNorm => "LayerNorm",
                Norm::RmsNorm => "RMSNorm",
            };
            let biases = match a.biases {
                Biases::All => "biases",
                Biases::QkvOnly => "Q/K/V biases",
                Biases::None => "no biases",
            };
            let tied = if a.tied_embeddings { "tied" } else { "untied" };
            let _ =
                write!(text, ", {ffn} FFN {}, {norm}, {biases}, {tied}, rope theta {}", self.ffn_hidden, a.rope_theta);
            if a.rope_scaling.is_some() {
                text.push_str(" (llama3 scaling)");
            }
        }
        text
    }

    /// Tokens of each sequence that one context-parallel rank holds: `s / c` (its two chunks of
    /// `s / 2c`), which the `t` ranks of its tensor-parallel group then share. Every per-GPU
    /// token count of the model, schedule, swap and cost modules starts here, so `c` enters in
    /// this one place (exact once [`Parallelism::validate_for`] holds: `2 c t` divides `s`).
    pub fn rank_seq_len(&self, parallel: &Parallelism) -> u64 {
        self.seq_len / parallel.context.max(1)
    }

    /// The head dimension `hidden / heads` (0 when `heads` is 0).
    pub fn head_dim(&self) -> u64 {
        self.hidden.checked_div(self.heads).unwrap_or(0)
    }

    /// Checks that every field is at least 1, that `heads` divides `hidden` into an even head
    /// dimension (RoPE rotates pairs), that `kv_heads` divides `heads`, and the architecture's
    /// numbers. (Sizes computed later report their own
    /// overflow.)
    pub fn validate(&self) -> Result<(), ModelError> {
        let fields = [
            ("layers", u64::from(self.layers)),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("ffn_hidden", self.ffn_hidden),
            ("vocab", self.vocab),
            ("seq_len", self.seq_len),
            ("micro_batch", self.micro_batch),
        ];
        if let Some((field, _)) = fields.iter().find(|(_, value)| *value == 0) {
            return Err(zero(field));
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(ModelError::HeadsDoNotDivideHidden { hidden: self.hidden, heads: self.heads });
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(ModelError::OddHeadDimension { hidden: self.hidden, heads: self.heads });
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(ModelError::KvHeadsDoNotDivideHeads { heads: self.heads, kv_heads: self.kv_heads });
        }
        self.architecture.validate()
    }

    /// Parameters of the whole model (not per GPU), with `d = hidden / heads`, `g = kv_heads`:
    /// - word embedding `V * h`; positions are rotary, so there is no position table;
    /// - per layer: Q `h * h`, K and V `h * g*d` each, the output projection `h * h`; the FFN
    ///   `2 h f` (GeLU: FC1, FC2) or `3 h f` (SwiGLU: gate, up, down); biases where
    ///   [`Biases`] puts them (Q `h`, K and V `g*d` each; projection `h`; FC1 `f`, FC2 `h`); two
    ///   norms of `h` (RMSNorm) or `2h` (LayerNorm: scale and shift);
    /// - the final norm;
    /// - the classifier `V * h`, unless tied to the word embedding.
    ///
    /// The vocabulary is not padded (Megatron-LM pads it to a multiple of 128 * t).
    pub fn parameter_count(&self) -> Result<u64, ModelError> {
        self.validate()?;
        const WHAT: &str = "parameter count";
        let arch = &self.architecture;
        let (h, f) = (self.hidden, self.ffn_hidden);
        let kv = mul(self.kv_heads, self.head_dim(), WHAT)?;
        // Weights: Q and the projection h x h, K and V h x kv, FFN (products) x h x f.
        let mut layer = mul(mul(h, h, WHAT)?, 2, WHAT)?;
        layer = add(layer, mul(mul(h, kv, WHAT)?, 2, WHAT)?, WHAT)?;
        let ffn_products = arch.ffn_in_products() + 1;
        layer = add(layer, mul(mul(h, f, WHAT)?, ffn_products, WHAT)?, WHAT)?;
        if arch.biases.qkv() {
            layer = add(layer, add(h, mul(kv, 2, WHAT)?, WHAT)?, WHAT)?;
        }
        if arch.biases.output_and_ffn() {
            layer = add(layer, add(h, add(mul(f, arch.ffn_in_products(), WHAT)?, h, WHAT)?, WHAT)?, WHAT)?;
        }
        let norm = mul(h, arch.norm_vectors(), WHAT)?;
        layer = add(layer, mul(norm, 2, WHAT)?, WHAT)?;
        let layers = mul(layer, u64::from(self.layers), WHAT)?;
        let tables = if arch.tied_embeddings { 1 } else { 2 };
        let embedding = mul(mul(self.vocab, h, WHAT)?, tables, WHAT)?;
        add(add(layers, embedding, WHAT)?, norm, WHAT)
    }

    /// Parameters of the K and V projections of the whole model (weights and biases): the ones a
    /// tensor-parallel group replicates when `t > kv_heads`.
    fn key_value_parameters(&self) -> Result<u64, ModelError> {
        const WHAT: &str = "parameter count";
        let kv = mul(self.kv_heads, self.head_dim(), WHAT)?;
        let per_projection =
            add(mul(self.hidden, kv, WHAT)?, if self.architecture.biases.qkv() { kv } else { 0 }, WHAT)?;
        mul(mul(per_projection, 2, WHAT)?, u64::from(self.layers), WHAT)
    }

    /// Bytes of model state on one GPU (see [`ModelStateBytes`]).
    pub fn model_state_bytes(&self, parallel: &Parallelism) -> Result<ModelStateBytes, ModelError> {
        self.validate()?;
        parallel.validate_for(self)?;
        let t = parallel.tensor;
        let count = self.parameter_count()?;
        // With t > kv_heads every rank holds all of K and V (spec/tensor-parallel.md): the rest
        // is divided by t.
        let per_gpu = if self.kv_replicated(t) {
            let kv = self.key_value_parameters()?;
            add((count - kv).div_ceil(t), kv, "parameter count")?
        } else {
            count.div_ceil(t)
        };
        let parameters = mul(per_gpu, BF16_BYTES, "parameter bytes")?;
        let gradients = mul(per_gpu, BF16_BYTES, "gradient bytes")?;
        let optimizer = mul(per_gpu, 3 * FP32_BYTES, "optimizer-state bytes")?;
        let total = add(add(parameters, gradients, "model-state bytes")?, optimizer, "model-state bytes")?;
        Ok(ModelStateBytes { parameters_per_gpu: per_gpu, parameters, gradients, optimizer, total })
    }

    /// Whether a group of `t` GPUs replicates K and V: `t > kv_heads`, so that every rank holds
    /// every key/value head (`spec/tensor-parallel.md` section 8).
    pub fn kv_replicated(&self, tensor: u64) -> bool {
        tensor > self.kv_heads
    }

    /// Key/value heads in K and V on one GPU of a group of `t`: `kv_heads / t`, or all
    /// `kv_heads` when they are replicated ([`ModelConfig::kv_replicated`]).
    pub fn kv_heads_on_gpu(&self, tensor: u64) -> u64 {
        if self.kv_replicated(tensor) {
            self.kv_heads
        } else {
            self.kv_heads / tensor.max(1)
        }
    }

    /// One layer's skeletal tensors on one GPU, as in `docs/technique.md` section 1, their widths
    /// read off [`Architecture::skeletal_widths`].
    pub fn skeletal_set(&self, parallel: &Parallelism) -> Result<SkeletalSet, ModelError> {
        self.validate()?;
        parallel.validate_for(self)?;
        let t = parallel.tensor;
        let widths = self.architecture.skeletal_widths(self.hidden, self.heads, self.kv_heads, self.ffn_hidden);
        // Elements per token on one GPU. Exact: t divides seq_len, heads, ffn_hidden (so h and
        // the FFN widths); K and V hold kv_heads / t heads, or all of them, replicated.
        const WHAT: &str = "activation elements per token";
        let kv = mul(self.kv_heads_on_gpu(t), self.head_dim(), WHAT)?;
        let tokens = mul(self.micro_batch, self.rank_seq_len(parallel), "tokens per step b*s")?;
        let elements = |per_token: u64| mul(tokens, per_token, "activation elements of one layer");
        let hidden = elements(widths.hidden / t)?;
        let query = elements(widths.query / t)?;
        let lse = elements(widths.lse / t)?;
        use Handling::{AlwaysSwapped, TokenSplit};
        use SkeletalKind as K;
        let entries = [
            (K::LayerInput, hidden, BF16_BYTES, AlwaysSwapped),
            (K::InputNormOutput, hidden, BF16_BYTES, TokenSplit),
            (K::Query, query, BF16_BYTES, TokenSplit),
            (K::Key, elements(kv)?, BF16_BYTES, TokenSplit),
            (K::Value, elements(kv)?, BF16_BYTES, TokenSplit),
            (K::AttentionOutput, query, BF16_BYTES, AlwaysSwapped),
            (K::AttentionLogSumExp, lse, FP32_BYTES, AlwaysSwapped),
            (K::AttentionResidual, hidden, BF16_BYTES, TokenSplit),
            (K::PostAttentionNormOutput, hidden, BF16_BYTES, TokenSplit),
            (K::Fc1Output, elements(widths.fc1 / t)?, BF16_BYTES, TokenSplit),
            (K::ActivationOutput, elements(widths.activation / t)?, BF16_BYTES, TokenSplit),
        ];
        let mut tensors = [SkeletalTensor { kind: K::LayerInput, elements: 0, bytes: 0, handling: AlwaysSwapped }; 11];
        let (mut others_bytes, mut total) = (0u64, 0u64);
        for (slot, (kind, elements, element_bytes, handling)) in tensors.iter_mut().zip(entries) {
            let bytes = mul(elements, element_bytes, "skeletal tensor bytes")?;
            total = add(total, bytes, "skeletal bytes of one layer")?;
            if handling == TokenSplit {
                others_bytes = add(others_bytes, bytes, "skeletal bytes of one layer")?;
            }
            *slot = SkeletalTensor { kind, elements, bytes, handling };
        }
        Ok(SkeletalSet {
            tensors,
            input_bytes: mul(hidden, BF16_BYTES, "activation bytes")?,
            attention_bytes: mul(query, BF16_BYTES, "activation bytes")?,
            lse_bytes: mul(lse, FP32_BYTES, "log-sum-exp bytes")?,
            others_bytes,
            total_bytes: total,
        })
    }
}

impl Parallelism {
    /// `t`-way tensor/sequence parallelism and `d`-way data parallelism.
    pub fn new(tensor: u64, data: u64) -> Self {
        Parallelism { tensor, data, context: 1 }
    }

    /// One GPU: `t = d = c = 1`.
    pub fn single() -> Self {
        Parallelism { tensor: 1, data: 1, context: 1 }
    }

    /// This layout with `c`-way context parallelism.
    pub fn with_context(self, context: u64) -> Self {
        Parallelism { context, ..self }
    }

    /// GPUs used: `t * c * d` (saturating).
    pub fn gpus(&self) -> u64 {
        self.tensor.saturating_mul(self.context).saturating_mul(self.data)
    }

    /// The multiple every sequence length must be for this layout: `t`, and `2 c t` with context
    /// parallelism (two chunks per context-parallel rank, each split over the `t` ranks);
    /// saturating.
    pub fn seq_len_multiple(&self) -> u64 {
        if self.context > 1 {
            self.context.saturating_mul(2).saturating_mul(self.tensor)
        } else {
            self.tensor
        }
    }

    /// The ranks that share the model state's optimizer sharding and the gradients' reduction:
    /// the data-parallel and context-parallel ranks together, `d * c` (saturating), as
    /// Megatron-LM's distributed optimizer shards over its data-parallel x context-parallel group
    /// (the `c` ranks of a sequence hold the same parameters and each computes a part of their
    /// gradients).
    pub fn gradient_ranks(&self) -> u64 {
        self.data.saturating_mul(self.context)
    }

    /// Checks that the three degrees are at least 1, that `2 c t` divides `seq_len` when
    /// `c > 1`, that `t` divides `heads`, `ffn_hidden` and
    /// `seq_len` (so every per-GPU size is exact; `t` then divides `hidden` too), and that `t`
    /// divides `kv_heads` or `kv_heads` divides `t`.
    pub fn validate_for(&self, model: &ModelConfig) -> Result<(), ModelError> {
        if self.tensor == 0 {
            return Err(zero("tensor"));
        }
        if self.data == 0 {
            return Err(zero("data"));
        }
        if self.context == 0 {
            return Err(zero("context"));
        }
        // Context parallelism cuts each sequence into 2c chunks, two per rank, and each chunk is
        // split over the t ranks by sequence parallelism: every per-GPU token count is exact when
        // 2 c t divides s.
        if self.context > 1 {
            // Past 64 bits no length is a multiple (the saturated figure would accept u64::MAX).
            let multiple = self.context.checked_mul(2).and_then(|m| m.checked_mul(self.tensor));
            if !multiple.is_some_and(|m| model.seq_len.is_multiple_of(m)) {
                return Err(ModelError::NotDivisibleByContextParallel {
                    seq_len: model.seq_len,
                    context: self.context,
                    tensor: self.tensor,
                });
            }
        }
        for (field, value) in [("heads", model.heads), ("ffn_hidden", model.ffn_hidden), ("seq_len", model.seq_len)] {
            if !value.is_multiple_of(self.tensor) {
                return Err(ModelError::NotDivisibleByTensorParallel { field, value, tensor: self.tensor });
            }
        }
        let kv = model.kv_heads;
        if kv > 0 && !kv.is_multiple_of(self.tensor) && !self.tensor.is_multiple_of(kv) {
            return Err(ModelError::KvHeadsAndTensorParallel { kv_heads: kv, tensor: self.tensor });
        }
        Ok(())
    }
}

impl Hardware {
    /// The preset named `name` (case-insensitive: `a800x8`, `h100x8`, `h200x1`, `mi300x8`).
    pub fn preset(name: &str) -> Result<Self, ModelError> {
        HARDWARE_PRESETS
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .map(presets::HardwarePreset::hardware)
            .ok_or_else(|| ModelError::UnknownHardware { name: String::from(name) })
    }

    /// Checks that every count and rate is at least 1, that `achieved_flops` and every measured
    /// kernel rate are at most `peak_flops`, and
    /// that a measured layer time is a finite positive number. A time source is required:
    /// `achieved_flops` may be 0 only when `measured_layer_forward_s` is given.
    pub fn validate(&self) -> Result<(), ModelError> {
        let fields = [
            ("device_memory_bytes", self.device_memory_bytes),
            ("gpus_per_node", self.gpus_per_node),
            ("d2h_bytes_per_s", self.d2h_bytes_per_s),
            ("h2d_bytes_per_s", self.h2d_bytes_per_s),
            ("gpus_sharing_uplink", self.gpus_sharing_uplink),
            ("peak_flops", self.peak_flops),
        ];
        if let Some((field, _)) = fields.iter().find(|(_, value)| *value == 0) {
            return Err(zero(field));
        }
        if self.achieved_flops > self.peak_flops {
            return Err(ModelError::AchievedAbovePeak { achieved: self.achieved_flops, peak: self.peak_flops });
        }
        for (field, rate) in self.measured_rates.named() {
            match rate {
                Some(0) => return Err(zero(field)),
                Some(rate) if rate > self.peak_flops => {
                    return Err(ModelError::MeasuredRateAbovePeak { field, rate, peak: self.peak_flops })
                }
                _ => {}
            }
        }
        match self.measured_layer_forward_s {
            Some(seconds) if !(seconds.is_finite() && seconds > 0.0) => Err(ModelError::BadMeasuredTime { seconds }),
            Some(_) => Ok(()),
            None if self.achieved_flops == 0 => Err(zero("achieved_flops")),
            None => Ok(()),
        }
    }

    /// Host memory one GPU may use for swapped activations: the node's host memory divided
    /// evenly among its GPUs (rounded down; 0 if `gpus_per_node` is 0).
    pub fn host_memory_per_gpu_bytes(&self) -> u64 {
        self.host_memory_per_node_bytes.checked_div(self.gpus_per_node).unwrap_or(0)
    }

    /// Device-to-host bandwidth one GPU gets while all GPUs on its uplink copy at once:
    /// `d2h_bytes_per_s / gpus_sharing_uplink` (rounded down; 0 if the divisor is 0).
    pub fn d2h_effective_bytes_per_s(&self) -> u64 {
        self.d2h_bytes_per_s.checked_div(self.gpus_sharing_uplink).unwrap_or(0)
    }

    /// Host-to-device bandwidth one GPU gets while all GPUs on its uplink copy at once.
    pub fn h2d_effective_bytes_per_s(&self) -> u64 {
        self.h2d_bytes_per_s.checked_div(self.gpus_sharing_uplink).unwrap_or(0)
    }
}

/// Bytes of model state on one GPU, with mixed-precision AdamW: bf16 parameters (2 B), bf16
/// gradients (2 B), and fp32 master weights plus the AdamW moments m and v (3 x 4 = 12 B): 16 bytes
/// per parameter, divided by `t` (rounded up: layer norms are in fact replicated, a negligible
/// difference). Not divided by `d`: no ZeRO sharding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelStateBytes {
    /// Parameters held by one GPU: `ceil(parameter_count / t)`.
    pub parameters_per_gpu: u64,
    /// bf16 parameters.
    pub parameters: u64,
    /// bf16 gradients.
    pub gradients: u64,
    /// fp32 master weights, AdamW m and v.
    pub optimizer: u64,
    /// The sum.
    pub total: u64,
}

/// How MEMO handles a skeletal tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Handling {
    /// Copied to host whole after the layer's forward (layer input, attention output, LSE).
    AlwaysSwapped,
    /// Tokens `[0, alpha*s)` copied to host, tokens `[alpha*s, s)` recomputed before the backward.
    TokenSplit,
}

/// The skeletal tensors of one pre-norm layer, in the order the forward makes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SkeletalKind {
    /// The layer's input hidden state (`bsh`).
    LayerInput,
    /// The first layer norm's output (`bsh`).
    InputNormOutput,
    /// Attention queries (`bsh`).
    Query,
    /// Attention keys (`b * s * kv_heads * head_dim`).
    Key,
    /// Attention values (`b * s * kv_heads * head_dim`).
    Value,
    /// Attention output before the projection (`bsh`).
    AttentionOutput,
    /// The softmax log-sum-exp FlashAttention saves (`b * heads * s`, fp32).
    AttentionLogSumExp,
    /// The hidden state after the projection and the residual add (`bsh`).
    AttentionResidual,
    /// The second layer norm's output (`bsh`).
    PostAttentionNormOutput,
    /// FC1's output (`b * s * f`; SwiGLU: gate and up, `b * s * 2f`).
    Fc1Output,
    /// The FFN activation's output: GeLU's, or SwiGLU's `silu(gate) * up` (`b * s * f`).
    ActivationOutput,
}

impl SkeletalKind {
    /// A short name for reports and plans.
    pub fn name(self) -> &'static str {
        match self {
            SkeletalKind::LayerInput => "layer_input",
            SkeletalKind::InputNormOutput => "input_norm_out",
            SkeletalKind::Query => "q",
            SkeletalKind::Key => "k",
            SkeletalKind::Value => "v",
            SkeletalKind::AttentionOutput => "attention_out",
            SkeletalKind::AttentionLogSumExp => "attention_lse",
            SkeletalKind::AttentionResidual => "attention_residual",
            SkeletalKind::PostAttentionNormOutput => "post_attention_norm_out",
            SkeletalKind::Fc1Output => "fc1_out",
            SkeletalKind::ActivationOutput => "ffn_act_out",
        }
    }
}

/// One skeletal tensor of one layer, on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkeletalTensor {
    /// Which tensor.
    pub kind: SkeletalKind,
    /// Elements on one GPU (the whole tensor's divided by `t`).
    pub elements: u64,
    /// Bytes on one GPU (bf16: 2 per element; the log-sum-exp is fp32: 4).
    pub bytes: u64,
    /// Swapped whole, or split by tokens.
    pub handling: Handling,
}

/// One layer's skeletal tensors on one GPU and the sums MEMO's alpha LP uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkeletalSet {
    /// The eleven tensors, in forward order.
    pub tensors: [SkeletalTensor; 11],
    /// `S_input`: the layer input's bytes.
    pub input_bytes: u64,
    /// `S_attn`: the attention output's bytes (without the log-sum-exp).
    pub attention_bytes: u64,
    /// The log-sum-exp's bytes, swapped with the attention output.
    pub lse_bytes: u64,
    /// `S_others`: the token-split tensors' bytes (14 bsh elements for GPT with `ffn_hidden = 4h`).
    pub others_bytes: u64,
    /// All eleven tensors' bytes.
    pub total_bytes: u64,
}

impl SkeletalSet {
    /// Bytes swapped whatever alpha is: `S_input + S_attn + LSE`. Exact for a set from
    /// [`ModelConfig::skeletal_set`] (the three are parts of `total_bytes`, which fit); saturating
    /// for hand-made values.
    pub fn always_swapped_bytes(&self) -> u64 {
        self.input_bytes.saturating_add(self.attention_bytes).saturating_add(self.lse_bytes)
    }
}

#[cfg(test)]
pub(crate) mod tests;
