use super::*;
use crate::model::MODEL_PRESETS;
use alloc::string::ToString;

/// The published `config.json` files of `examples/models/hf/`, by preset name, with the parameter
/// count each checkpoint states.
const EXAMPLES: [(&str, &str, u64); 5] = [
    ("llama3.1-8b", include_str!("../../../../examples/models/hf/llama3.1-8b/config.json"), 8_030_261_248),
    ("llama3.1-70b", include_str!("../../../../examples/models/hf/llama3.1-70b/config.json"), 70_553_706_496),
    ("qwen2.5-7b", include_str!("../../../../examples/models/hf/qwen2.5-7b/config.json"), 7_615_616_512),
    ("qwen2.5-72b", include_str!("../../../../examples/models/hf/qwen2.5-72b/config.json"), 72_706_203_648),
    ("mistral-7b", include_str!("../../../../examples/models/hf/mistral-7b/config.json"), 7_248_023_552),
];

const LLAMA_8B: &str = EXAMPLES[0].1;
const QWEN_7B: &str = EXAMPLES[2].1;
const MISTRAL_7B: &str = EXAMPLES[4].1;

/// `base` with `changes` applied: `Some(value)` sets a key (a JSON text), `None` removes it.
fn edited(base: &str, changes: &[(&str, Option<&str>)]) -> String {
    let mut value: Value = serde_json::from_str(base).unwrap();
    let map = value.as_object_mut().unwrap();
    for (key, change) in changes {
        match change {
            Some(text) => {
                map.insert((*key).to_string(), serde_json::from_str(text).unwrap());
            }
            None => {
                map.remove(*key);
            }
        }
    }
    serde_json::to_string_pretty(&value).unwrap()
}

/// The error of `json`, checked to be one line that names `field`.
fn refusal(json: &str, field: &str) -> HfConfigError {
    let error = model_from_hf_config(json, "m", 8192, 1).unwrap_err();
    let message = error.to_string();
    assert!(!message.contains('\n'), "{message}");
    assert!(message.contains(field), "{field} not named: {message}");
    error
}

#[test]
fn published_configs_give_the_published_parameter_counts_and_the_presets() {
    for (name, json, parameters) in EXAMPLES {
        let model = model_from_hf_config(json, name, 8192, 2).unwrap();
        assert_eq!(model.parameter_count().unwrap(), parameters, "{name}");
        let preset = MODEL_PRESETS.iter().find(|p| p.name == name).unwrap();
        assert_eq!(preset.published_parameters, Some(parameters), "{name}");
        assert_eq!(model, preset.model(8192, 2), "{name}");
        model.validate().unwrap();
    }
}

#[test]
fn the_name_and_sequence_come_from_the_caller() {
    let model = model_from_hf_config(LLAMA_8B, "Meta-Llama-3.1-8B", 1 << 20, 3).unwrap();
    assert_eq!((model.name.as_str(), model.seq_len, model.micro_batch), ("Meta-Llama-3.1-8B", 1 << 20, 3));
}

#[test]
fn defaults_are_the_transformers_classes() {
    // Without kv heads (multi-head), act, eps, theta, tying, scaling: transformers' defaults.
    let json = edited(
        LLAMA_8B,
        &[
            ("num_key_value_heads", None),
            ("hidden_act", None),
            ("rms_norm_eps", None),
            ("rope_theta", None),
            ("tie_word_embeddings", None),
            ("rope_scaling", Some("null")),
            ("architectures", None),
        ],
    );
    let model = model_from_hf_config(&json, "m", 4096, 1).unwrap();
    assert_eq!(model.kv_heads, 32);
    assert_eq!(model.architecture, Architecture::llama(10_000.0, 1e-6));
    // The model type may come from the architecture alone; `rope_type: default` is no scaling.
    let json = edited(LLAMA_8B, &[("model_type", None), ("rope_scaling", Some(r#"{"rope_type": "default"}"#))]);
    assert_eq!(model_from_hf_config(&json, "m", 4096, 1).unwrap().architecture.rope_scaling, None);
    // transformers 5 keeps the base and the scaling in `rope_parameters`.
    let json = edited(
        LLAMA_8B,
        &[
            ("rope_theta", None),
            ("rope_scaling", None),
            (
                "rope_parameters",
                Some(
                    r#"{"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
                ),
            ),
        ],
    );
    assert_eq!(
        model_from_hf_config(&json, "llama3.1-8b", 8192, 1).unwrap(),
        ModelConfig::preset("llama3.1-8b", 8192, 1).unwrap()
    );
}

#[test]
fn gpt_neox_with_sequential_residuals_is_read() {
    let json = r#"{"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 512,
        "intermediate_size": 2048, "num_attention_heads": 8, "num_hidden_layers": 6, "vocab_size": 50304,
        "hidden_act": "gelu_new", "layer_norm_eps": 1e-05, "rotary_pct": 1.0, "rotary_emb_base": 10000,
        "use_parallel_residual": false, "tie_word_embeddings": false}"#;
    let model = model_from_hf_config(json, "neox", 2048, 1).unwrap();
    assert_eq!((model.layers, model.hidden, model.heads, model.kv_heads), (6, 512, 8, 8));
    assert_eq!((model.ffn_hidden, model.vocab), (2048, 50304));
    assert_eq!(
        model.architecture,
        Architecture { tied_embeddings: false, ..Architecture::GPT },
        "LayerNorm, GeLU, biases everywhere, untied"
    );
    // The transformers defaults refuse: a parallel residual, a quarter of each head rotated, erf GeLU.
    let refused = |change: (&str, Option<&str>), field: &str| {
        let mut value: Value = serde_json::from_str(json).unwrap();
        let map = value.as_object_mut().unwrap();
        match change.1 {
            Some(text) => map.insert(change.0.to_string(), serde_json::from_str(text).unwrap()),
            None => map.remove(change.0),
        };
        refusal(&value.to_string(), field);
    };
    refused(("use_parallel_residual", Some("true")), "use_parallel_residual");
    refused(("use_parallel_residual", None), "use_parallel_residual");
    refused(("rotary_pct", Some("0.25")), "rotary_pct");
    refused(("rotary_pct", None), "rotary_pct");
    refused(("hidden_act", Some(r#""gelu""#)), "hidden_act");
    refused(("attention_bias", Some("false")), "attention_bias");
}

#[test]
fn gpt2_is_refused_for_its_learned_positions() {
    let json = r#"{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 12, "n_embd": 768,
        "n_head": 12, "n_positions": 1024, "vocab_size": 50257, "activation_function": "gelu_new"}"#;
    let message = refusal(json, "model_type").to_string();
    assert!(message.contains("position"), "{message}");
}

#[test]
fn mixtures_of_experts_are_refused() {
    let mixtral = edited(
        MISTRAL_7B,
        &[("num_local_experts", Some("8")), ("num_experts_per_tok", Some("2")), ("model_type", Some(r#""mixtral""#))],
    );
    let message = refusal(&mixtral, "num_local_experts").to_string();
    assert!(message.contains("experts"), "{message}");
    refusal(&edited(QWEN_7B, &[("num_experts", Some("60"))]), "num_experts");
    refusal(&edited(QWEN_7B, &[("moe_intermediate_size", Some("1408"))]), "moe_intermediate_size");
    refusal(&edited(LLAMA_8B, &[("n_routed_experts", Some("64"))]), "n_routed_experts");
    refusal(&edited(QWEN_7B, &[("model_type", Some(r#""qwen2_moe""#))]), "model_type");
    refusal(&edited(LLAMA_8B, &[("model_type", Some(r#""deepseek_v3""#))]), "model_type");
    refusal(&edited(LLAMA_8B, &[("architectures", Some(r#"["MixtralForCausalLM"]"#))]), "architectures");
}

#[test]
fn sliding_windows_are_refused() {
    let message = refusal(&edited(MISTRAL_7B, &[("sliding_window", Some("4096"))]), "sliding_window").to_string();
    assert!(message.contains("4096"), "{message}");
    // Qwen2's window is off unless use_sliding_window is true, whatever sliding_window says.
    refusal(&edited(QWEN_7B, &[("use_sliding_window", Some("true"))]), "use_sliding_window");
}

#[test]
fn latent_attention_is_refused() {
    refusal(&edited(LLAMA_8B, &[("kv_lora_rank", Some("512")), ("q_lora_rank", Some("null"))]), "kv_lora_rank");
    refusal(&edited(LLAMA_8B, &[("q_lora_rank", Some("1536"))]), "q_lora_rank");
}

#[test]
fn unknown_model_types_are_refused() {
    let message = refusal(&edited(LLAMA_8B, &[("model_type", Some(r#""falcon""#))]), "model_type").to_string();
    assert!(message.contains("falcon") && message.contains("llama"), "{message}");
    let json = edited(LLAMA_8B, &[("model_type", None), ("architectures", Some(r#"["FalconForCausalLM"]"#))]);
    refusal(&json, "architectures");
    refusal(&edited(LLAMA_8B, &[("architectures", Some(r#"["LlamaForSequenceClassification"]"#))]), "architectures");
    refusal(&edited(LLAMA_8B, &[("model_type", None), ("architectures", None)]), "model_type");
}

#[test]
fn biases_the_planner_cannot_describe_are_refused() {
    refusal(&edited(LLAMA_8B, &[("attention_bias", Some("true"))]), "attention_bias");
    refusal(&edited(LLAMA_8B, &[("mlp_bias", Some("true"))]), "mlp_bias");
}

#[test]
fn other_unmodelled_features_are_refused() {
    let yarn = r#"{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}"#;
    refusal(&edited(QWEN_7B, &[("rope_scaling", Some(yarn))]), "rope_scaling.rope_type");
    refusal(&edited(LLAMA_8B, &[("rope_scaling", Some(r#"{"type": "linear", "factor": 2.0}"#))]), "rope_scaling.type");
    let message = refusal(&edited(MISTRAL_7B, &[("head_dim", Some("160"))]), "head_dim").to_string();
    assert!(message.contains("128"), "{message}");
    model_from_hf_config(&edited(MISTRAL_7B, &[("head_dim", Some("128"))]), "m", 4096, 1).unwrap();
    refusal(&edited(LLAMA_8B, &[("hidden_act", Some(r#""gelu""#))]), "hidden_act");
    refusal(&edited(QWEN_7B, &[("use_mrope", Some("true"))]), "use_mrope");
}

#[test]
fn malformed_json_names_the_line_and_column() {
    let broken = LLAMA_8B.replacen("\"hidden_size\": 4096,", "\"hidden_size\": 4096,,", 1);
    let line = 1 + broken[..broken.find(",,").unwrap()].matches('\n').count();
    let error = refusal(&broken, &format!("line {line} column"));
    assert!(matches!(error, HfConfigError::Json { line: l, .. } if l == line), "{error:?}");
    refusal("[1, 2]", "not a JSON object");
    refusal("", "line 1");
}

#[test]
fn missing_and_mistyped_fields_are_named() {
    let error = refusal(&edited(LLAMA_8B, &[("intermediate_size", None)]), "intermediate_size");
    assert_eq!(error, HfConfigError::Missing { field: "intermediate_size".into() });
    refusal(&edited(QWEN_7B, &[("num_hidden_layers", Some("null"))]), "num_hidden_layers");
    let error = refusal(&edited(LLAMA_8B, &[("hidden_size", Some(r#""4096""#))]), "hidden_size");
    assert!(matches!(error, HfConfigError::WrongType { .. }), "{error:?}");
    refusal(&edited(LLAMA_8B, &[("tie_word_embeddings", Some("0"))]), "tie_word_embeddings");
    let scaling = r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}"#;
    refusal(&edited(LLAMA_8B, &[("rope_scaling", Some(scaling))]), "rope_scaling.original_max_position_embeddings");
    refusal(&edited(LLAMA_8B, &[("num_attention_heads", Some("0"))]), "num_attention_heads");
    refusal(&edited(LLAMA_8B, &[("num_attention_heads", Some("30"))]), "num_attention_heads");
    refusal(&edited(LLAMA_8B, &[("num_key_value_heads", Some("5"))]), "num_key_value_heads");
    refusal(&edited(LLAMA_8B, &[("rms_norm_eps", Some("2.0"))]), "rms_norm_eps");
    refusal(&edited(LLAMA_8B, &[("num_hidden_layers", Some("5000000000"))]), "num_hidden_layers");
    refusal(&edited(LLAMA_8B, &[("vocab_size", Some("-1"))]), "vocab_size");
    // An integral float is a whole number.
    model_from_hf_config(&edited(LLAMA_8B, &[("vocab_size", Some("128256.0"))]), "m", 4096, 1).unwrap();
}
