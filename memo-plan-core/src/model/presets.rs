//! Every preset number, in one place.
//!
//! The models are the paper's (MEMO, arXiv 2407.12117, its table of model configurations; GPT with
//! GeLU, FFN 4h, vocabulary 50257) and the open models of the Llama family, from their published
//! `config.json` files. The machines are vendor datasheet figures plus round
//! assumptions for what a copy or a kernel achieves in practice. **All machine numbers are
//! assumptions**: a user overrides any of them by editing the [`Hardware`] value a preset returns
//! (or by giving a measured layer forward time), and should, once they have measured their own
//! machine.

use alloc::string::String;

use super::{Architecture, Biases, Hardware, Interconnect, ModelConfig, RopeScaling};

/// `1 << 30` bytes.
const GIB: u64 = 1 << 30;
/// `1 << 40` bytes.
const TIB: u64 = 1 << 40;
/// `10^9`: copy rates are quoted in decimal GB/s.
const GB: u64 = 1_000_000_000;
/// `10^12`: peak rates are quoted in decimal TFLOP/s.
const TFLOPS: u64 = 1_000_000_000_000;

/// The share of the dense bf16 peak one GPU is assumed to sustain in a layer's forward, in percent.
/// Assumption: large bf16 GEMMs and FlashAttention-2's forward reach roughly 60-75% of peak on
/// A100/H100-class parts; 60% is the round, conservative end. Used only when no measured layer
/// time is given.
pub const ACHIEVED_PERCENT_OF_PEAK: u64 = 60;

/// A model preset: the paper's GPT shapes, and published open models.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelPreset {
    /// Lookup name.
    pub name: &'static str,
    /// Where the numbers come from.
    pub source: &'static str,
    /// Transformer layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// FFN width.
    pub ffn_hidden: u64,
    /// Vocabulary.
    pub vocab: u64,
    /// FFN, norm, biases, tying, rotary base.
    pub architecture: Architecture,
    /// The parameter count the model's publisher states (its checkpoint's tensors summed), which
    /// [`super::ModelConfig::parameter_count`] must reproduce; `None` for the paper's GPT shapes,
    /// which have no checkpoint.
    pub published_parameters: Option<u64>,
}

impl ModelPreset {
    /// The model this preset describes, training on sequences of `seq_len` tokens, `micro_batch`
    /// at a time.
    pub fn model(&self, seq_len: u64, micro_batch: u64) -> ModelConfig {
        ModelConfig {
            name: String::from(self.name),
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            ffn_hidden: self.ffn_hidden,
            vocab: self.vocab,
            seq_len,
            micro_batch,
            architecture: self.architecture,
        }
    }
}

/// The paper's GPT layer of hidden size `h` with `heads` heads (FFN 4h, vocabulary 50257).
const fn gpt(name: &'static str, layers: u32, hidden: u64, heads: u64) -> ModelPreset {
    ModelPreset {
        name,
        source: "MEMO (arXiv 2407.12117), its table of model configurations: GPT, GeLU FFN 4h, vocabulary 50257",
        layers,
        hidden,
        heads,
        kv_heads: heads,
        ffn_hidden: 4 * hidden,
        vocab: super::GPT2_VOCAB,
        architecture: Architecture::GPT,
        published_parameters: None,
    }
}

/// Llama 3.1's rotary rescaling (its `config.json`: `rope_type` llama3, factor 8, low 1, high 4,
/// original context 8192).
const LLAMA31_ROPE_SCALING: RopeScaling =
    RopeScaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_positions: 8192 };

/// Llama 3.1's layer: SwiGLU, RMSNorm (eps 1e-5), no biases, untied, rotary base 500,000 rescaled.
const LLAMA31: Architecture =
    Architecture { rope_scaling: Some(LLAMA31_ROPE_SCALING), ..Architecture::llama(500_000.0, 1e-5) };

/// The paper's four models (MEMO, table of model configurations), then the open models people
/// train on long contexts, each from its published `config.json`.
pub const MODEL_PRESETS: &[ModelPreset] = &[
    gpt("7b", 32, 4096, 32),
    gpt("13b", 40, 5120, 40),
    gpt("30b", 48, 7168, 56),
    gpt("65b", 80, 8192, 64),
    ModelPreset {
        name: "llama3.1-8b",
        source: "meta-llama/Llama-3.1-8B config.json (LlamaForCausalLM); 8,030,261,248 parameters in its checkpoint",
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        ffn_hidden: 14336,
        vocab: 128_256,
        architecture: LLAMA31,
        published_parameters: Some(8_030_261_248),
    },
    ModelPreset {
        name: "llama3.1-70b",
        source: "meta-llama/Llama-3.1-70B config.json (LlamaForCausalLM); 70,553,706,496 parameters in its checkpoint",
        layers: 80,
        hidden: 8192,
        heads: 64,
        kv_heads: 8,
        ffn_hidden: 28672,
        vocab: 128_256,
        architecture: LLAMA31,
        published_parameters: Some(70_553_706_496),
    },
    ModelPreset {
        name: "qwen2.5-7b",
        source: "Qwen/Qwen2.5-7B config.json (Qwen2ForCausalLM: Q/K/V biases, rms_norm_eps 1e-6); 7,615,616,512 \
                 parameters in its checkpoint",
        layers: 28,
        hidden: 3584,
        heads: 28,
        kv_heads: 4,
        ffn_hidden: 18944,
        vocab: 152_064,
        architecture: Architecture { biases: Biases::QkvOnly, ..Architecture::llama(1_000_000.0, 1e-6) },
        published_parameters: Some(7_615_616_512),
    },
    ModelPreset {
        name: "qwen2.5-72b",
        source: "Qwen/Qwen2.5-72B config.json (Qwen2ForCausalLM: Q/K/V biases, rms_norm_eps 1e-5); 72,706,203,648 \
                 parameters in its checkpoint",
        layers: 80,
        hidden: 8192,
        heads: 64,
        kv_heads: 8,
        ffn_hidden: 29568,
        vocab: 152_064,
        architecture: Architecture { biases: Biases::QkvOnly, ..Architecture::llama(1_000_000.0, 1e-5) },
        published_parameters: Some(72_706_203_648),
    },
    ModelPreset {
        name: "mistral-7b",
        source: "mistralai/Mistral-7B-v0.3 config.json (MistralForCausalLM, no sliding window); 7,248,023,552 \
                 parameters in its checkpoint",
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        ffn_hidden: 14336,
        vocab: 32_768,
        architecture: Architecture::llama(1_000_000.0, 1e-5),
        published_parameters: Some(7_248_023_552),
    },
];

/// A machine preset. `achieved_flops` is derived: `peak_flops * ACHIEVED_PERCENT_OF_PEAK / 100`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HardwarePreset {
    /// Lookup name.
    pub name: &'static str,
    /// Where the numbers come from.
    pub source: &'static str,
    /// Device memory of one GPU.
    pub device_memory_bytes: u64,
    /// Host memory of one node.
    pub host_memory_per_node_bytes: u64,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Copy bandwidth per GPU, each way (device-to-host and host-to-device).
    pub copy_bytes_per_s: u64,
    /// GPUs sharing one host uplink.
    pub gpus_sharing_uplink: u64,
    /// Dense bf16 peak of one GPU.
    pub peak_flops: u64,
}

/// The machines. Each `source` says where its numbers come from.
pub const HARDWARE_PRESETS: &[HardwarePreset] = &[
    HardwarePreset {
        name: "a800x8",
        source: "8x NVIDIA A800-80GB (A100 compute: 312 TFLOP/s dense bf16, datasheet; 80 GiB HBM2e), \
                 2 TiB host per node (the paper's testbed); PCIe gen4 x16 is 32 GB/s raw, ~25 GB/s \
                 assumed achieved per GPU each way with pinned memory",
        device_memory_bytes: 80 * GIB,
        host_memory_per_node_bytes: 2 * TIB,
        gpus_per_node: 8,
        copy_bytes_per_s: 25 * GB,
        gpus_sharing_uplink: 1,
        peak_flops: 312 * TFLOPS,
    },
    HardwarePreset {
        name: "h100x8",
        source: "8x NVIDIA H100-80GB SXM (989 TFLOP/s dense bf16, datasheet; 80 GiB HBM3), 2 TiB host \
                 per node (assumed); PCIe gen5 x16 is 64 GB/s raw, ~50 GB/s assumed achieved",
        device_memory_bytes: 80 * GIB,
        host_memory_per_node_bytes: 2 * TIB,
        gpus_per_node: 8,
        copy_bytes_per_s: 50 * GB,
        gpus_sharing_uplink: 1,
        peak_flops: 989 * TFLOPS,
    },
    HardwarePreset {
        name: "h200x1",
        source: "1x NVIDIA H200 (141 GB HBM3e marketed, ~140 GiB reported by the driver; 989 TFLOP/s \
                 dense bf16, datasheet), 256 GiB host (assumed); PCIe gen5 x16, ~50 GB/s assumed achieved",
        device_memory_bytes: 140 * GIB,
        host_memory_per_node_bytes: 256 * GIB,
        gpus_per_node: 1,
        copy_bytes_per_s: 50 * GB,
        gpus_sharing_uplink: 1,
        peak_flops: 989 * TFLOPS,
    },
    HardwarePreset {
        name: "h200x8",
        source: "8x NVIDIA H200 SXM (141 GB HBM3e marketed, ~140 GiB reported by the driver; 989 TFLOP/s dense \
                 bf16, datasheet), 2 TiB host per node (assumed); PCIe gen5 x16, ~50 GB/s assumed achieved",
        device_memory_bytes: 140 * GIB,
        host_memory_per_node_bytes: 2 * TIB,
        gpus_per_node: 8,
        copy_bytes_per_s: 50 * GB,
        gpus_sharing_uplink: 1,
        peak_flops: 989 * TFLOPS,
    },
    HardwarePreset {
        name: "mi300x8",
        source: "8x AMD Instinct MI300X (192 GiB HBM3; 1307 TFLOP/s dense bf16, datasheet), 2 TiB host \
                 per node (assumed); PCIe gen5 x16, ~50 GB/s assumed achieved",
        device_memory_bytes: 192 * GIB,
        host_memory_per_node_bytes: 2 * TIB,
        gpus_per_node: 8,
        copy_bytes_per_s: 50 * GB,
        gpus_sharing_uplink: 1,
        peak_flops: 1307 * TFLOPS,
    },
];

impl HardwarePreset {
    /// The [`Hardware`] this preset describes, with no measured layer time.
    pub fn hardware(&self) -> Hardware {
        Hardware {
            name: String::from(self.name),
            device_memory_bytes: self.device_memory_bytes,
            host_memory_per_node_bytes: self.host_memory_per_node_bytes,
            gpus_per_node: self.gpus_per_node,
            d2h_bytes_per_s: self.copy_bytes_per_s,
            h2d_bytes_per_s: self.copy_bytes_per_s,
            gpus_sharing_uplink: self.gpus_sharing_uplink,
            peak_flops: self.peak_flops,
            achieved_flops: self.peak_flops / 100 * ACHIEVED_PERCENT_OF_PEAK,
            measured_layer_forward_s: None,
            measured_rates: super::MeasuredRates::NONE,
        }
    }
}

/// The interconnect of a machine preset, and where its numbers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterconnectPreset {
    /// The [`HardwarePreset`] it belongs to.
    pub machine: &'static str,
    /// Where the numbers come from, and what is assumed.
    pub source: &'static str,
    /// The figures.
    pub interconnect: Interconnect,
    /// Each GPU's share of the network between nodes, per direction, and the latency of one ring
    /// step across it.
    pub network: Interconnect,
    /// Where the network's numbers come from, and what is assumed.
    pub network_source: &'static str,
}

/// Each GPU's own 400 Gb/s NIC (InfiniBand NDR or RoCE: one ConnectX-7 per GPU in NVIDIA's DGX
/// H100/H200 and in the MI300X platforms): 400 Gb/s = 50 GB/s per direction. Latency assumed
/// 8 us per ring step: a few microseconds of switch and wire plus NCCL's proxy, above NVLink's 5.
const NETWORK_400G: Interconnect = Interconnect { bytes_per_s: 50 * GB, latency_ns: 8 * US };
/// 400 Gb/s per GPU, the sources of [`NETWORK_400G`].
const NETWORK_400G_SOURCE: &str = "one 400 Gb/s InfiniBand NDR / RoCE NIC per GPU (DGX H100-class nodes): \
                                   50 GB/s per direction; 8 us per ring step assumed";
/// DGX A100-class nodes: one 200 Gb/s InfiniBand HDR NIC per GPU, 25 GB/s per direction.
const NETWORK_200G: Interconnect = Interconnect { bytes_per_s: 25 * GB, latency_ns: 8 * US };

/// Microseconds as nanoseconds.
const US: u64 = 1_000;

/// Every machine preset's interconnect. Bandwidths are per direction (a ring step sends one share
/// while it receives another); latencies are an assumed per-step figure of a ring collective
/// (NCCL's and RCCL's small-message latency is a few microseconds per step on NVLink/xGMI).
pub const INTERCONNECT_PRESETS: &[InterconnectPreset] = &[
    InterconnectPreset {
        machine: "a800x8",
        source: "NVIDIA A800 SXM: NVLink 400 GB/s bidirectional (datasheet; the A100's 600 GB/s cut for export), \
                 through NVSwitch: 200 GB/s per direction assumed for a ring; 5 us per step assumed",
        interconnect: Interconnect { bytes_per_s: 200 * GB, latency_ns: 5 * US },
        network: NETWORK_200G,
        network_source: "one 200 Gb/s InfiniBand HDR NIC per GPU (DGX A100-class nodes): 25 GB/s per direction; \
                         8 us per ring step assumed",
    },
    InterconnectPreset {
        machine: "h100x8",
        source: "NVIDIA H100 SXM: NVLink 4, 900 GB/s bidirectional (datasheet), through NVSwitch: 450 GB/s per \
                 direction; 5 us per step assumed",
        interconnect: Interconnect { bytes_per_s: 450 * GB, latency_ns: 5 * US },
        network: NETWORK_400G,
        network_source: NETWORK_400G_SOURCE,
    },
    InterconnectPreset {
        machine: "h200x1",
        source: "NVIDIA H200 SXM: NVLink 4, 900 GB/s bidirectional (datasheet): 450 GB/s per direction, for \
                 groups of H200s (this preset has one GPU); 5 us per step assumed",
        interconnect: Interconnect { bytes_per_s: 450 * GB, latency_ns: 5 * US },
        network: NETWORK_400G,
        network_source: NETWORK_400G_SOURCE,
    },
    InterconnectPreset {
        machine: "h200x8",
        source: "NVIDIA H200 SXM: NVLink 4, 900 GB/s bidirectional (datasheet), through NVSwitch: 450 GB/s per \
                 direction; 5 us per step assumed",
        interconnect: Interconnect { bytes_per_s: 450 * GB, latency_ns: 5 * US },
        network: NETWORK_400G,
        network_source: NETWORK_400G_SOURCE,
    },
    InterconnectPreset {
        machine: "mi300x8",
        source: "AMD Instinct MI300X platform: 7 Infinity Fabric links per GPU, 896 GB/s aggregate bidirectional \
                 peer-to-peer (datasheet), 448 GB/s per direction when RCCL spreads rings over all 7 links \
                 (one link alone is 64 GB/s); an upper bound; 5 us per step assumed",
        interconnect: Interconnect { bytes_per_s: 448 * GB, latency_ns: 5 * US },
        network: NETWORK_400G,
        network_source: NETWORK_400G_SOURCE,
    },
];

/// The CPU backend's ranks (threads over host memory): 10 GB/s per direction and 1 us per step,
/// round figures like the CPU machine's own (only the timeline depends on them).
pub const CPU_INTERCONNECT: Interconnect = Interconnect { bytes_per_s: 10 * GB, latency_ns: US };
