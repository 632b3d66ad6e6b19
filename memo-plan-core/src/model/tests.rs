use super::*;
use alloc::format;
use alloc::vec::Vec;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
const ONE_M: u64 = 1 << 20;

/// The tiny model the hand-computed values below use: h 8, 2 heads, ffn 32, V 10, s 4, b 1.
pub(crate) fn tiny() -> ModelConfig {
    let mut model = ModelConfig::new("tiny", 2, 8, 2, 4, 1);
    model.vocab = 10;
    model
}

#[test]
fn presets_have_the_papers_shapes() {
    let shapes: [(&str, u32, u64, u64); 4] =
        [("7b", 32, 4096, 32), ("13b", 40, 5120, 40), ("30b", 48, 7168, 56), ("65b", 80, 8192, 64)];
    for (name, layers, hidden, heads) in shapes {
        let model = ModelConfig::preset(name, 4096, 1).unwrap();
        assert_eq!((model.layers, model.hidden, model.heads), (layers, hidden, heads), "{name}");
        assert_eq!(model.ffn_hidden, 4 * hidden);
        assert_eq!(model.vocab, 50257);
        model.validate().unwrap();
    }
    assert_eq!(ModelConfig::preset("7B", 8, 2).unwrap().name, "7b");
}

#[test]
fn parameter_count_of_7b_is_about_6_7e9() {
    let model = ModelConfig::preset("7b", ONE_M, 1).unwrap();
    // 32 * (4h^2 + 2hf + 9h + f) + V*h + 2h, h = 4096, f = 16384.
    assert_eq!(model.parameter_count().unwrap(), 32 * 201_379_840 + 50257 * 4096 + 8192);
    assert_eq!(model.parameter_count().unwrap(), 6_650_015_744);
    let ratio = model.parameter_count().unwrap() as f64 / 6.7e9;
    assert!((0.97..1.03).contains(&ratio), "{ratio}");
    // The larger presets land near their names too.
    for (name, expected) in [("13b", 13.0e9), ("30b", 30.0e9), ("65b", 65.0e9)] {
        let count = ModelConfig::preset(name, 4096, 1).unwrap().parameter_count().unwrap() as f64;
        assert!((0.9..1.1).contains(&(count / expected)), "{name}: {count}");
    }
}

#[test]
fn parameter_count_of_a_tiny_model_by_hand() {
    // layer: 4*64 + 2*8*32 + 9*8 + 32 = 872; 2 layers; embedding 10*8; final norm 16.
    assert_eq!(tiny().parameter_count().unwrap(), 2 * 872 + 80 + 16);
}

#[test]
fn model_state_is_16_bytes_per_parameter_divided_by_t() {
    let model = ModelConfig::preset("7b", ONE_M, 1).unwrap();
    let state = model.model_state_bytes(&Parallelism::new(8, 1)).unwrap();
    let per_gpu = 6_650_015_744u64.div_ceil(8);
    assert_eq!(state.parameters_per_gpu, per_gpu);
    assert_eq!((state.parameters, state.gradients, state.optimizer), (2 * per_gpu, 2 * per_gpu, 12 * per_gpu));
    assert_eq!(state.total, 16 * per_gpu);
    // About 12.4 GiB per GPU.
    assert!(state.total > 12 * GIB && state.total < 13 * GIB, "{}", state.total);
}

#[test]
fn skeletal_set_of_7b_at_1m_on_8_gpus() {
    let model = ModelConfig::preset("7b", ONE_M, 1).unwrap();
    let set = model.skeletal_set(&Parallelism::new(8, 1)).unwrap();
    // bsh / t = 2^20 * 2^12 / 8 = 2^29 elements, 1 GiB in bf16.
    assert_eq!(set.input_bytes, GIB);
    assert_eq!(set.attention_bytes, GIB);
    assert_eq!(set.others_bytes, 14 * GIB);
    // LSE: 32 heads * 2^20 tokens * 4 B / 8 = 16 MiB.
    assert_eq!(set.lse_bytes, 16 * MIB);
    let bf16_bytes: u64 =
        set.tensors.iter().filter(|t| t.kind != SkeletalKind::AttentionLogSumExp).map(|t| t.bytes).sum();
    assert_eq!(bf16_bytes, 1 << 34);
    assert_eq!(set.total_bytes, (1 << 34) + 16 * MIB);
    assert_eq!(set.always_swapped_bytes(), 2 * GIB + 16 * MIB);
    // docs/technique.md section 3: 128 GiB per layer over the 8 GPUs, 4 TiB for all 32 layers (bf16 tensors).
    assert_eq!(bf16_bytes * 8, 128 * GIB);
    assert_eq!(bf16_bytes * 8 * 32, 4 * TIB);
}

#[test]
fn skeletal_table_rows_match_memo() {
    let model = ModelConfig::preset("7b", ONE_M, 1).unwrap();
    let set = model.skeletal_set(&Parallelism::new(8, 1)).unwrap();
    let bsh = (1u64 << 32) / 8;
    let rows: [(SkeletalKind, u64, Handling); 11] = [
        (SkeletalKind::LayerInput, bsh, Handling::AlwaysSwapped),
        (SkeletalKind::InputNormOutput, bsh, Handling::TokenSplit),
        (SkeletalKind::Query, bsh, Handling::TokenSplit),
        (SkeletalKind::Key, bsh, Handling::TokenSplit),
        (SkeletalKind::Value, bsh, Handling::TokenSplit),
        (SkeletalKind::AttentionOutput, bsh, Handling::AlwaysSwapped),
        (SkeletalKind::AttentionLogSumExp, 32 * ONE_M / 8, Handling::AlwaysSwapped),
        (SkeletalKind::AttentionResidual, bsh, Handling::TokenSplit),
        (SkeletalKind::PostAttentionNormOutput, bsh, Handling::TokenSplit),
        (SkeletalKind::Fc1Output, 4 * bsh, Handling::TokenSplit),
        (SkeletalKind::ActivationOutput, 4 * bsh, Handling::TokenSplit),
    ];
    for (tensor, (kind, elements, handling)) in set.tensors.iter().zip(rows) {
        assert_eq!((tensor.kind, tensor.elements, tensor.handling), (kind, elements, handling));
        let width = if kind == SkeletalKind::AttentionLogSumExp { 4 } else { 2 };
        assert_eq!(tensor.bytes, elements * width, "{}", kind.name());
    }
}

#[test]
fn skeletal_set_scales_with_micro_batch_and_ffn() {
    let mut model = tiny();
    model.micro_batch = 3;
    model.ffn_hidden = 24;
    let set = model.skeletal_set(&Parallelism::new(2, 1)).unwrap();
    // b*s*h/t = 3*4*8/2 = 48 elements; b*s*f/t = 3*4*24/2 = 144; LSE 3*2*4/2 = 12.
    assert_eq!(set.input_bytes, 96);
    assert_eq!(set.others_bytes, 2 * (6 * 48 + 2 * 144));
    assert_eq!(set.lse_bytes, 48);
}

#[test]
fn zero_fields_are_errors_naming_the_field() {
    type Setter = fn(&mut ModelConfig);
    let cases: [(&str, Setter); 7] = [
        ("layers", |m| m.layers = 0),
        ("hidden", |m| m.hidden = 0),
        ("heads", |m| m.heads = 0),
        ("ffn_hidden", |m| m.ffn_hidden = 0),
        ("vocab", |m| m.vocab = 0),
        ("seq_len", |m| m.seq_len = 0),
        ("micro_batch", |m| m.micro_batch = 0),
    ];
    for (field, set) in cases {
        let mut model = tiny();
        set(&mut model);
        assert_eq!(model.validate(), Err(ModelError::Zero { field }));
        assert_eq!(model.parameter_count(), Err(ModelError::Zero { field }));
        assert_eq!(model.skeletal_set(&Parallelism::single()).unwrap_err(), ModelError::Zero { field });
        assert_eq!(model.model_state_bytes(&Parallelism::single()).unwrap_err(), ModelError::Zero { field });
        let text = format!("{}", ModelError::Zero { field });
        assert!(text.starts_with(field) && text.contains("at least 1"), "{text}");
    }
    for (field, parallel) in [("tensor", Parallelism::new(0, 1)), ("data", Parallelism::new(1, 0))] {
        assert_eq!(parallel.validate_for(&tiny()), Err(ModelError::Zero { field }));
    }
}

#[test]
fn heads_must_divide_hidden() {
    let mut model = tiny();
    model.heads = 3;
    assert_eq!(model.validate(), Err(ModelError::HeadsDoNotDivideHidden { hidden: 8, heads: 3 }));
    assert!(format!("{}", model.validate().unwrap_err()).contains("choose heads that divide hidden"));
}

/// `--tp 64` on a 32-head model once suggested "a heads divisible by 64 (e.g. 0 or 64)": 0 heads
/// is no model. The suggestions are sizes, and a t that divides the field.
#[test]
fn a_t_above_the_field_suggests_no_zero() {
    let model = ModelConfig::preset("7b", 1 << 20, 1).unwrap();
    let e = Parallelism::new(64, 1).validate_for(&model).unwrap_err();
    assert_eq!(e, ModelError::NotDivisibleByTensorParallel { field: "heads", value: 32, tensor: 64 });
    let text = format!("{e}");
    assert!(text.contains("divisible by 64 (e.g. 64)") && !text.contains("e.g. 0"), "{text}");
    assert!(text.contains("a t that divides 32 (e.g. 32)"), "{text}");
    let e = ModelError::NotDivisibleByTensorParallel { field: "heads", value: 56, tensor: 16 };
    assert!(format!("{e}").contains("(e.g. 48 or 64) or a t that divides 56 (e.g. 14)"), "{e}");
}

#[test]
fn tensor_parallel_must_divide_heads_ffn_and_seq() {
    Parallelism::new(8, 1).validate_for(&ModelConfig::preset("7b", 1000, 1).unwrap()).unwrap();
    let model = ModelConfig::preset("7b", 1001, 1).unwrap();
    let e = Parallelism::new(8, 1).validate_for(&model).unwrap_err();
    assert_eq!(e, ModelError::NotDivisibleByTensorParallel { field: "seq_len", value: 1001, tensor: 8 });
    let text = format!("{e}");
    assert!(text.contains("seq_len = 1001") && text.contains("e.g. 1000 or 1008"), "{text}");
    let model = ModelConfig::preset("30b", 1024, 1).unwrap();
    assert_eq!(
        model.skeletal_set(&Parallelism::new(16, 1)).unwrap_err(),
        ModelError::NotDivisibleByTensorParallel { field: "heads", value: 56, tensor: 16 }
    );
    let mut model = ModelConfig::preset("7b", 1024, 1).unwrap();
    model.ffn_hidden = 11000;
    assert_eq!(
        model.model_state_bytes(&Parallelism::new(16, 1)).unwrap_err(),
        ModelError::NotDivisibleByTensorParallel { field: "ffn_hidden", value: 11000, tensor: 16 }
    );
    // Display must not panic on a hand-made error with t = 0.
    let text = format!("{}", ModelError::NotDivisibleByTensorParallel { field: "heads", value: 5, tensor: 0 });
    assert!(text.contains("heads = 5"));
}

#[test]
fn huge_values_are_overflow_errors_not_panics() {
    // The largest even hidden size (an odd head dimension is refused before any size is computed).
    let model = ModelConfig::new("huge", u32::MAX, u64::MAX - 1, 1, u64::MAX, u64::MAX);
    assert!(matches!(model.parameter_count(), Err(ModelError::Overflow { .. })));
    assert!(matches!(model.skeletal_set(&Parallelism::single()), Err(ModelError::Overflow { .. })));
    assert!(matches!(model.model_state_bytes(&Parallelism::single()), Err(ModelError::Overflow { .. })));
    // Parameters fit, activations do not.
    let model = ModelConfig::new("long", 1, 8, 2, 1 << 62, 1);
    model.parameter_count().unwrap();
    let e = model.skeletal_set(&Parallelism::single()).unwrap_err();
    assert!(matches!(e, ModelError::Overflow { .. }));
    assert!(format!("{e}").contains("use a shorter seq_len"));
    // The 4h default saturates rather than wrapping; the overflow is reported later.
    let model = ModelConfig::new("wide", 1, u64::MAX / 2 + 1, 1, 1, 1);
    assert_eq!(model.ffn_hidden, u64::MAX);
    assert!(matches!(model.parameter_count(), Err(ModelError::Overflow { .. })));
}

#[test]
fn unknown_presets_list_the_valid_names() {
    let e = ModelConfig::preset("8b", 1, 1).unwrap_err();
    assert_eq!(e, ModelError::UnknownModel { name: "8b".into() });
    // The paper's four GPT shapes, then the Llama-family presets.
    assert_eq!(
        format!("{e}"),
        "no model preset is named `8b`; valid names: 7b, 13b, 30b, 65b, llama3.1-8b, llama3.1-70b, qwen2.5-7b, \
         qwen2.5-72b, mistral-7b"
    );
    let e = Hardware::preset("a100").unwrap_err();
    assert_eq!(
        format!("{e}"),
        "no hardware preset is named `a100`; valid names: a800x8, h100x8, h200x1, h200x8, mi300x8"
    );
}

#[test]
fn hardware_presets_hold_the_datasheet_numbers() {
    let a800 = Hardware::preset("A800x8").unwrap();
    assert_eq!(a800.device_memory_bytes, 80 * GIB);
    assert_eq!(a800.host_memory_per_node_bytes, 2 * TIB);
    assert_eq!(a800.host_memory_per_gpu_bytes(), 256 * GIB);
    assert_eq!((a800.d2h_bytes_per_s, a800.h2d_bytes_per_s), (25_000_000_000, 25_000_000_000));
    assert_eq!(a800.peak_flops, 312_000_000_000_000);
    assert_eq!(a800.achieved_flops, 312_000_000_000_000 / 100 * 60);
    let peaks: [(&str, u64, u64); 3] = [("h100x8", 989, 8), ("h200x1", 989, 1), ("mi300x8", 1307, 8)];
    for (name, tflops, gpus) in peaks {
        let hardware = Hardware::preset(name).unwrap();
        hardware.validate().unwrap();
        assert_eq!(hardware.peak_flops, tflops * 1_000_000_000_000, "{name}");
        assert_eq!(hardware.gpus_per_node, gpus, "{name}");
        assert_eq!(hardware.d2h_bytes_per_s, 50_000_000_000, "{name}");
    }
    assert_eq!(Hardware::preset("mi300x8").unwrap().device_memory_bytes, 192 * GIB);
    for preset in HARDWARE_PRESETS {
        assert!(!preset.source.is_empty());
        preset.hardware().validate().unwrap();
    }
}

#[test]
fn shared_uplinks_divide_the_bandwidth() {
    let mut hardware = Hardware::preset("a800x8").unwrap();
    hardware.gpus_sharing_uplink = 2;
    hardware.h2d_bytes_per_s = 20_000_000_000;
    assert_eq!(hardware.d2h_effective_bytes_per_s(), 12_500_000_000);
    assert_eq!(hardware.h2d_effective_bytes_per_s(), 10_000_000_000);
    hardware.gpus_sharing_uplink = 0;
    hardware.gpus_per_node = 0;
    assert_eq!((hardware.d2h_effective_bytes_per_s(), hardware.host_memory_per_gpu_bytes()), (0, 0));
}

#[test]
fn hardware_errors_name_the_field() {
    type Setter = fn(&mut Hardware);
    let cases: [(ModelError, Setter); 8] = [
        (ModelError::Zero { field: "device_memory_bytes" }, |h| h.device_memory_bytes = 0),
        (ModelError::Zero { field: "gpus_per_node" }, |h| h.gpus_per_node = 0),
        (ModelError::Zero { field: "d2h_bytes_per_s" }, |h| h.d2h_bytes_per_s = 0),
        (ModelError::Zero { field: "h2d_bytes_per_s" }, |h| h.h2d_bytes_per_s = 0),
        (ModelError::Zero { field: "gpus_sharing_uplink" }, |h| h.gpus_sharing_uplink = 0),
        (ModelError::Zero { field: "peak_flops" }, |h| h.peak_flops = 0),
        (ModelError::Zero { field: "achieved_flops" }, |h| h.achieved_flops = 0),
        (ModelError::AchievedAbovePeak { achieved: 313_000_000_000_000, peak: 312_000_000_000_000 }, |h| {
            h.achieved_flops = 313_000_000_000_000
        }),
    ];
    for (expected, set) in cases {
        let mut hardware = Hardware::preset("a800x8").unwrap();
        set(&mut hardware);
        assert_eq!(hardware.validate(), Err(expected));
    }
    let text = format!("{}", ModelError::Zero { field: "achieved_flops" });
    assert!(text.contains("measured_layer_forward_s"), "{text}");
    // A measured time stands in for achieved_flops, but must be a real time.
    let mut hardware = Hardware::preset("a800x8").unwrap();
    hardware.achieved_flops = 0;
    hardware.measured_layer_forward_s = Some(0.5);
    hardware.validate().unwrap();
    for seconds in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        hardware.measured_layer_forward_s = Some(seconds);
        assert!(matches!(hardware.validate(), Err(ModelError::BadMeasuredTime { .. })), "{seconds}");
    }
    assert!(format!("{}", hardware.validate().unwrap_err()).contains("finite number of seconds"));
    // Zero host memory is allowed: the swap report then shows the shortfall.
    let mut hardware = Hardware::preset("a800x8").unwrap();
    hardware.host_memory_per_node_bytes = 0;
    hardware.validate().unwrap();
}

#[test]
fn every_error_displays_a_fix() {
    let errors = [
        ModelError::Zero { field: "gpus_per_node" },
        ModelError::Zero { field: "tensor" },
        ModelError::HeadsDoNotDivideHidden { hidden: 10, heads: 3 },
        ModelError::NotDivisibleByTensorParallel { field: "seq_len", value: 10, tensor: 4 },
        ModelError::Overflow { what: "parameter count" },
        ModelError::AchievedAbovePeak { achieved: 2, peak: 1 },
        ModelError::BadMeasuredTime { seconds: -1.0 },
        ModelError::UnknownModel { name: "x".into() },
        ModelError::UnknownHardware { name: "y".into() },
    ];
    for error in errors {
        let text = format!("{error}");
        assert!(text.contains(':') || text.contains(';'), "{text}");
        assert!(!text.contains("{"), "{text}");
    }
}

/// Every preset with a published parameter count reproduces it exactly: the checkpoint's tensors
/// summed (`ModelConfig::parameter_count`'s per-architecture formula).
#[test]
fn presets_reproduce_their_published_parameter_counts() {
    let mut published = 0;
    for preset in MODEL_PRESETS {
        let Some(count) = preset.published_parameters else { continue };
        let model = preset.model(8192, 1);
        model.validate().unwrap();
        assert_eq!(model.parameter_count().unwrap(), count, "{}", preset.name);
        published += 1;
    }
    assert_eq!(published, 5);
}

/// The GPT presets' parameter counts and skeletal sets are what they were before the Llama family:
/// `4h^2 + 2hf + 9h + f` per layer, `V h + 2h` besides; eleven tensors with q, k and v all `bsh`.
#[test]
fn gpt_presets_are_unchanged_by_the_architecture() {
    for name in ["7b", "13b", "30b", "65b"] {
        let model = ModelConfig::preset(name, 32 << 10, 1).unwrap();
        assert_eq!(model.kv_heads, model.heads, "{name}");
        assert_eq!(model.architecture, Architecture::GPT, "{name}");
        let (h, f, v) = (model.hidden, model.ffn_hidden, model.vocab);
        let per_layer = 4 * h * h + 2 * h * f + 9 * h + f;
        let old = u64::from(model.layers) * per_layer + v * h + 2 * h;
        assert_eq!(model.parameter_count().unwrap(), old, "{name}");
        for t in [1u64, 8] {
            let parallel = Parallelism::new(t, 1);
            let state = model.model_state_bytes(&parallel).unwrap();
            assert_eq!(state.parameters_per_gpu, old.div_ceil(t), "{name} t={t}");
            let set = model.skeletal_set(&parallel).unwrap();
            let bsh = model.micro_batch * model.seq_len * h / t;
            let bsf = model.micro_batch * model.seq_len * f / t;
            let lse = model.micro_batch * model.seq_len * model.heads / t;
            let expected: [u64; 11] = [bsh, bsh, bsh, bsh, bsh, bsh, lse, bsh, bsh, bsf, bsf];
            let elements: Vec<u64> = set.tensors.iter().map(|t| t.elements).collect();
            assert_eq!(elements, expected, "{name} t={t}");
            assert_eq!(set.others_bytes, 2 * (6 * bsh + 2 * bsf), "{name} t={t}");
            assert_eq!(set.total_bytes, 2 * (8 * bsh + 2 * bsf) + 4 * lse, "{name} t={t}");
        }
    }
}

/// Llama 3.1 8B (32 query heads, 8 key/value heads of 128, FFN 14336) at t = 8: K and V hold
/// `b*s*kv*d/t` elements, a quarter of Q's; SwiGLU's FC1 output (gate and up) is twice the gated
/// product's.
#[test]
fn llama_skeletal_set_has_grouped_keys_and_a_double_fc1() {
    let model = ModelConfig::preset("llama3.1-8b", 8192, 2).unwrap();
    let t = 8;
    let set = model.skeletal_set(&Parallelism::new(t, 1)).unwrap();
    let of = |kind: SkeletalKind| *set.tensors.iter().find(|x| x.kind == kind).unwrap();
    let tokens = 2 * 8192;
    let kv = tokens * model.kv_heads * model.head_dim() / t;
    assert_eq!(kv, tokens * 8 * 128 / 8);
    assert_eq!(of(SkeletalKind::Key).elements, kv);
    assert_eq!(of(SkeletalKind::Value).elements, kv);
    assert_eq!(of(SkeletalKind::Query).elements, 4 * kv);
    assert_eq!(of(SkeletalKind::Query).elements, tokens * 4096 / t);
    assert_eq!(of(SkeletalKind::Fc1Output).elements, 2 * of(SkeletalKind::ActivationOutput).elements);
    assert_eq!(of(SkeletalKind::ActivationOutput).elements, tokens * 14336 / t);
    assert_eq!(of(SkeletalKind::AttentionLogSumExp).elements, tokens * 32 / t);
    let total: u64 = set.tensors.iter().map(|x| x.bytes).sum();
    assert_eq!(set.total_bytes, total);
}

/// `t` must divide `kv_heads` (each rank holds its share) or be a multiple of it (K and V
/// replicated); any other `t` is refused with the message that says so.
#[test]
fn tensor_parallel_and_kv_heads() {
    // 24 query heads, 4 key/value heads: t in {1, 2, 4} divides 4; t in {8, 12, 24} is a multiple
    // of 4 (and divides the heads); t in {3, 6} does neither.
    let mut model = ModelConfig::new("gqa", 2, 24 * 8, 24, 48, 1);
    model.kv_heads = 4;
    model.ffn_hidden = 48;
    model.validate().unwrap();
    for t in [1u64, 2, 4, 8, 12, 24] {
        Parallelism::new(t, 1).validate_for(&model).unwrap_or_else(|e| panic!("t = {t}: {e}"));
        assert_eq!(model.kv_replicated(t), t > 4, "t = {t}");
        assert_eq!(model.kv_heads_on_gpu(t), if t > 4 { 4 } else { 4 / t }, "t = {t}");
        model.skeletal_set(&Parallelism::new(t, 1)).unwrap();
    }
    for t in [3u64, 6] {
        let e = Parallelism::new(t, 1).validate_for(&model).unwrap_err();
        assert_eq!(e, ModelError::KvHeadsAndTensorParallel { kv_heads: 4, tensor: t });
        let text = format!("{e}");
        assert!(text.contains(&format!("kv_heads = 4 and the tensor-parallel degree t = {t}")), "{text}");
        assert!(text.contains("use a t that is a divisor or a multiple of 4"), "{text}");
        assert_eq!(model.skeletal_set(&Parallelism::new(t, 1)).unwrap_err(), e);
        assert_eq!(model.model_state_bytes(&Parallelism::new(t, 1)).unwrap_err(), e);
    }
    // Multi-query attention (one key/value head): every t that divides the heads.
    model.kv_heads = 1;
    for t in [1u64, 2, 3, 4, 6, 8] {
        Parallelism::new(t, 1).validate_for(&model).unwrap();
    }
}

/// With c-way context parallelism a GPU holds s / (t c) tokens of every sequence-split tensor and
/// s / c tokens of its K/V heads: each skeletal tensor at (t, c) is the one at (t, 1) over c, each
/// derived here from the model's own shapes.
#[test]
fn context_parallel_divides_every_token_split_tensor_by_c() {
    let model = ModelConfig::preset("llama3.1-8b", 256 << 10, 1).unwrap();
    let (s, h, t) = (model.seq_len, model.hidden, 8u64);
    let head_dim = h / model.heads;
    for c in [2u64, 4] {
        let parallel = Parallelism::new(t, 1).with_context(c);
        assert_eq!(model.rank_seq_len(&parallel), s / c);
        let set = model.skeletal_set(&parallel).unwrap();
        let tokens = s / c;
        let by_kind = |kind: SkeletalKind| set.tensors.iter().find(|x| x.kind == kind).unwrap().bytes;
        assert_eq!(by_kind(SkeletalKind::LayerInput), tokens * h / t * BF16_BYTES, "c = {c}");
        assert_eq!(by_kind(SkeletalKind::Key), tokens * (model.kv_heads / t) * head_dim * BF16_BYTES);
        assert_eq!(by_kind(SkeletalKind::Fc1Output), tokens * 2 * model.ffn_hidden / t * BF16_BYTES);
        assert_eq!(by_kind(SkeletalKind::AttentionLogSumExp), tokens * model.heads / t * FP32_BYTES);
        let whole = model.skeletal_set(&Parallelism::new(t, 1)).unwrap();
        assert_eq!(set.total_bytes * c, whole.total_bytes);
        assert_eq!(set.others_bytes * c, whole.others_bytes);
        // The model state does not depend on c (ZeRO shards it; see nodes.rs).
        assert_eq!(model.model_state_bytes(&parallel), model.model_state_bytes(&Parallelism::new(t, 1)));
        assert_eq!(parallel.gpus(), t * c);
        assert_eq!(parallel.seq_len_multiple(), 2 * c * t);
    }
}

/// Two chunks per context-parallel rank, each split over t: s must be a multiple of 2 c t; the
/// refusal names the numbers and the nearest lengths that work.
#[test]
fn context_parallel_needs_two_chunks_per_rank_split_over_t() {
    let model = ModelConfig::preset("7b", 3000, 1).unwrap();
    let parallel = Parallelism::new(8, 1).with_context(4);
    let error = parallel.validate_for(&model).unwrap_err();
    assert_eq!(error, ModelError::NotDivisibleByContextParallel { seq_len: 3000, context: 4, tensor: 8 });
    let message = format!("{error}");
    for words in ["2 x c x t = 2 x 4 x 8 = 64", "e.g. 2944 or 3008", "or a smaller c"] {
        assert!(message.contains(words), "{message:?} lacks {words:?}");
    }
    // Shorter than one multiple: only the one above is offered.
    let short = ModelConfig { seq_len: 32, ..model.clone() };
    assert!(format!("{}", parallel.validate_for(&short).unwrap_err()).contains("(e.g. 64)"));
    // t alone divides 3000 - 8 = 2992 but not 2 c t: c = 1 accepts what c = 4 refuses.
    let t_only = ModelConfig { seq_len: 2992, ..model.clone() };
    assert_eq!(Parallelism::new(8, 1).validate_for(&t_only), Ok(()));
    assert!(parallel.validate_for(&t_only).is_err());
    // A c so large that 2 c t passes 64 bits: refused, with no wrapped or saturated figure.
    let huge = Parallelism::new(2, 1).with_context(u64::MAX / 2);
    let message = format!("{}", huge.validate_for(&model).unwrap_err());
    assert!(message.contains("past 64 bits") && message.contains("use a smaller c"), "{message}");
    assert!(!message.contains(&format!("= {}", u64::MAX)), "{message}");
    assert_eq!(parallel.validate_for(&ModelConfig { seq_len: 4096, ..model }), Ok(()));
}
