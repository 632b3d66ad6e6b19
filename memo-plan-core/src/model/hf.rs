//! A [`ModelConfig`] read from a Hugging Face `config.json`, the file every open checkpoint ships.
//!
//! Supported: the Llama family (`LlamaForCausalLM`/`llama`, `MistralForCausalLM`/`mistral`,
//! `Qwen2ForCausalLM`/`qwen2`) and GPT-NeoX (`GPTNeoXForCausalLM`/`gpt_neox`) without its
//! parallel residual. Everything this planner cannot describe exactly is refused with an error
//! that names the field, never approximated: mixtures of experts, sliding-window attention,
//! multi-head latent attention, rotary scalings other than Llama 3's, partial rotary embeddings,
//! biases on projections [`Biases`] cannot express, a head size other than `hidden / heads`, and
//! GPT-2's learned position table (the planner models rotary positions only, so it would
//! undercount GPT-2's parameters and their state).
//!
//! A field whose value is `null` counts as absent, as in `transformers`. Defaults are those of
//! the `transformers` configuration class of the model type, except for sizes: a missing size is
//! an error rather than the class's default shape.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use serde_json::{Map, Value};

use super::{Architecture, Biases, Ffn, ModelConfig, ModelError, Norm, RopeScaling};

#[cfg(test)]
mod tests;

/// Why a `config.json` gives no [`ModelConfig`]. [`fmt::Display`] writes one line naming the field
/// and what to do; the caller prefixes the file.
#[derive(Clone, Debug, PartialEq)]
pub enum HfConfigError {
    /// The text is not JSON.
    Json {
        /// Line of the error, from 1.
        line: usize,
        /// Column of the error, from 1.
        column: usize,
        /// serde_json's message, without its position.
        message: String,
    },
    /// The JSON is not an object.
    NotAnObject {
        /// What it is instead (`an array`, ...).
        found: &'static str,
    },
    /// A required field is absent (or `null`).
    Missing {
        /// The field (`rope_scaling.factor` for a nested one).
        field: String,
    },
    /// A field has the wrong JSON type.
    WrongType {
        /// The field.
        field: String,
        /// What it must be (`a whole number`, ...).
        expected: &'static str,
        /// What it is.
        found: &'static str,
    },
    /// A number out of its range, or sizes that do not fit together.
    OutOfRange {
        /// The field.
        field: String,
        /// Its value.
        value: String,
        /// What it must be.
        expected: String,
    },
    /// A model type or architecture this reader does not know.
    UnknownModel {
        /// `model_type` or `architectures`.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// A feature of the model that the planner does not describe: refused rather than approximated.
    Unsupported {
        /// The field that asks for it.
        field: String,
        /// Its value.
        value: String,
        /// What it means and why it is refused.
        reason: String,
    },
}

/// The model types read, with their causal-LM architecture class, as `SUPPORTED` lists them.
const SUPPORTED: &str = "llama (LlamaForCausalLM), mistral (MistralForCausalLM), qwen2 (Qwen2ForCausalLM), \
                         gpt_neox (GPTNeoXForCausalLM)";

impl fmt::Display for HfConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HfConfigError::Json { line, column, message } => write!(
                f,
                "line {line} column {column}: not valid JSON ({message}); a config.json is one JSON object: fix \
                 the file or download it again"
            ),
            HfConfigError::NotAnObject { found } => write!(
                f,
                "the file is {found}, not a JSON object: give the model's config.json (its top level is an object \
                 with model_type, hidden_size, ...)"
            ),
            HfConfigError::Missing { field } => write!(
                f,
                "{field} is missing: this config.json does not describe the model's shape; add {field} or give the \
                 model's complete config.json"
            ),
            HfConfigError::WrongType { field, expected, found } => {
                write!(f, "{field} is {found}, expected {expected}: fix the value in the file")
            }
            HfConfigError::OutOfRange { field, value, expected } => {
                write!(f, "{field} = {value} is out of range: {expected}")
            }
            HfConfigError::UnknownModel { field, value } => write!(
                f,
                "{field} = {value} is not a model type this planner reads; supported: {SUPPORTED} (or give the shape \
                 with --layers, --hidden, --heads)"
            ),
            HfConfigError::Unsupported { field, value, reason } => {
                write!(f, "{field} = {value}: {reason}")
            }
        }
    }
}

impl core::error::Error for HfConfigError {}

/// The families read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Llama,
    Mistral,
    Qwen2,
    Gpt2,
    GptNeoX,
}

/// `model_type`, the causal-LM architecture class, the family.
const FAMILIES: &[(&str, &str, Family)] = &[
    ("llama", "LlamaForCausalLM", Family::Llama),
    ("mistral", "MistralForCausalLM", Family::Mistral),
    ("qwen2", "Qwen2ForCausalLM", Family::Qwen2),
    ("gpt2", "GPT2LMHeadModel", Family::Gpt2),
    ("gpt_neox", "GPTNeoXForCausalLM", Family::GptNeoX),
];

/// Fields whose (non-null, non-zero) presence means a mixture of experts, besides any `moe_*`.
const EXPERT_FIELDS: &[&str] = &[
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "num_shared_experts",
    "router_aux_loss_coef",
];

/// Fields of multi-head latent attention (DeepSeek-V2/V3): low-rank compressed keys, values and
/// queries.
const LATENT_ATTENTION_FIELDS: &[&str] = &["kv_lora_rank", "q_lora_rank"];

const MOE_REASON: &str = "a mixture of experts, which this planner does not model (it plans dense FFNs only: every \
                          expert's weights, the router and the token dispatch are missing); plan a dense model";

/// The model a Hugging Face `config.json` describes, named `name` (the caller's choice: the
/// checkpoint's directory, `_name_or_path`, ...), training on sequences of `seq_len` tokens,
/// `micro_batch` at a time. Refuses, naming the field, whatever the planner cannot describe
/// exactly (see the module's documentation).
pub fn model_from_hf_config(
    json: &str,
    name: &str,
    seq_len: u64,
    micro_batch: u64,
) -> Result<ModelConfig, HfConfigError> {
    let value: Value = serde_json::from_str(json).map_err(|e| {
        let (line, column) = (e.line(), e.column());
        let text = e.to_string();
        let suffix = format!(" at line {line} column {column}");
        let message = text.strip_suffix(suffix.as_str()).unwrap_or(&text).to_owned();
        HfConfigError::Json { line, column, message }
    })?;
    let config = match &value {
        Value::Object(map) => Fields { map, prefix: "" },
        other => return Err(HfConfigError::NotAnObject { found: kind(other) }),
    };
    refuse_experts_and_latent_attention(&config)?;
    let family = family(&config)?;
    let shape = match family {
        Family::Llama | Family::Mistral | Family::Qwen2 => llama_family(&config, family)?,
        Family::GptNeoX => gpt_neox(&config)?,
        Family::Gpt2 => {
            return Err(HfConfigError::Unsupported {
                field: "model_type".into(),
                value: "gpt2".into(),
                reason: "GPT-2 learns absolute position embeddings (a table of n_positions x n_embd, `wpe`), and this \
                         planner models rotary positions only: it would leave out that table's parameters, gradients \
                         and optimizer state; plan it as a custom GPT (--layers, --hidden, --heads, --vocab) knowing \
                         that, or use a rotary model"
                    .into(),
            });
        }
    };
    Ok(ModelConfig {
        name: String::from(name),
        layers: shape.layers,
        hidden: shape.hidden,
        heads: shape.heads,
        kv_heads: shape.kv_heads,
        ffn_hidden: shape.ffn_hidden,
        vocab: shape.vocab,
        seq_len,
        micro_batch,
        architecture: shape.architecture,
    })
}

/// What a config file gives: everything but the name and the sequence.
struct Shape {
    layers: u32,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    ffn_hidden: u64,
    vocab: u64,
    architecture: Architecture,
}

/// A JSON object and its path from the top (`""`, or `"rope_scaling."`), with typed getters that
/// name the field in their errors. `null` is absent.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: &'static str,
}

impl<'a> Fields<'a> {
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, expected: &'static str, value: &Value) -> HfConfigError {
        HfConfigError::WrongType { field: self.name(key), expected, found: kind(value) }
    }

    fn required<T>(&self, key: &str, value: Option<T>) -> Result<T, HfConfigError> {
        value.ok_or_else(|| HfConfigError::Missing { field: self.name(key) })
    }

    /// A whole number (an integral float such as `8192.0` too).
    fn uint(&self, key: &str) -> Result<Option<u64>, HfConfigError> {
        let Some(value) = self.get(key) else { return Ok(None) };
        const EXPECTED: &str = "a whole number";
        match value {
            Value::Number(n) => match (n.as_u64(), n.as_f64()) {
                (Some(v), _) => Ok(Some(v)),
                (None, Some(x)) if (0.0..9.007_199_254_740_992e15).contains(&x) && x == libm::trunc(x) => {
                    Ok(Some(x as u64))
                }
                _ => Err(HfConfigError::OutOfRange {
                    field: self.name(key),
                    value: n.to_string(),
                    expected: "expected a whole number of at least 0".into(),
                }),
            },
            other => Err(self.wrong(key, EXPECTED, other)),
        }
    }

    /// A size: a whole number of at least 1.
    fn size(&self, key: &str) -> Result<u64, HfConfigError> {
        let value = self.required(key, self.uint(key)?)?;
        if value == 0 {
            return Err(HfConfigError::OutOfRange {
                field: self.name(key),
                value: "0".into(),
                expected: "a model needs at least 1".into(),
            });
        }
        Ok(value)
    }

    fn float(&self, key: &str) -> Result<Option<f64>, HfConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err(self.wrong(key, "a number", other)),
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, HfConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong(key, "true or false", other)),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>, HfConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, HfConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(map)),
            Some(other) => Err(self.wrong(key, "an object", other)),
        }
    }
}

/// The JSON type of a value, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value as the file spells it, for messages.
fn shown(value: &Value) -> String {
    value.to_string()
}

/// Whether a field's value turns a feature on: anything but `null`, `false`, `0` and `[]`.
fn switched_on(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::Array(items) => !items.is_empty(),
        _ => true,
    }
}

/// Refuses mixtures of experts (by field, then by model type or architecture) and multi-head
/// latent attention, whatever the model type says.
fn refuse_experts_and_latent_attention(config: &Fields<'_>) -> Result<(), HfConfigError> {
    // The expert counts first (in EXPERT_FIELDS' order), then any `moe_*` field.
    let named = EXPERT_FIELDS.iter().filter_map(|key| config.map.get_key_value(*key));
    let prefixed = config.map.iter().filter(|(key, _)| key.starts_with("moe_"));
    if let Some((key, value)) = named.chain(prefixed).find(|(_, value)| switched_on(value)) {
        return Err(HfConfigError::Unsupported { field: key.clone(), value: shown(value), reason: MOE_REASON.into() });
    }
    for key in LATENT_ATTENTION_FIELDS {
        if let Some(value) = config.get(key) {
            return Err(HfConfigError::Unsupported {
                field: (*key).into(),
                value: shown(value),
                reason: "multi-head latent attention (DeepSeek's low-rank compressed keys, values and queries), \
                         which this planner does not model (it plans multi-head and grouped-query attention)"
                    .into(),
            });
        }
    }
    let is_moe_name = |name: &str| {
        let lower = name.to_ascii_lowercase();
        lower.contains("moe")
            || lower.starts_with("deepseek")
            || ["mixtral", "dbrx", "jamba", "arctic", "llama4", "grok"].iter().any(|p| lower.starts_with(p))
    };
    if let Some(model_type) = config.string("model_type")? {
        if is_moe_name(model_type) {
            return Err(HfConfigError::Unsupported {
                field: "model_type".into(),
                value: model_type.into(),
                reason: MOE_REASON.into(),
            });
        }
    }
    for architecture in architectures(config)? {
        if is_moe_name(architecture) {
            return Err(HfConfigError::Unsupported {
                field: "architectures".into(),
                value: architecture.into(),
                reason: MOE_REASON.into(),
            });
        }
    }
    Ok(())
}

/// The `architectures` list (empty when absent).
fn architectures<'a>(config: &Fields<'a>) -> Result<Vec<&'a str>, HfConfigError> {
    match config.get("architectures") {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().ok_or_else(|| config.wrong("architectures", "an array of strings", item)))
            .collect(),
        Some(other) => Err(config.wrong("architectures", "an array of strings", other)),
    }
}

/// The family `model_type` names (else the first of `architectures`); every architecture listed
/// must be that family's causal LM.
fn family(config: &Fields<'_>) -> Result<Family, HfConfigError> {
    let architectures = architectures(config)?;
    let (model_type, class, family) = match config.string("model_type")? {
        Some(model_type) => *FAMILIES
            .iter()
            .find(|(t, _, _)| *t == model_type)
            .ok_or_else(|| HfConfigError::UnknownModel { field: "model_type", value: model_type.into() })?,
        None => match architectures.first() {
            Some(first) => *FAMILIES
                .iter()
                .find(|(_, c, _)| c == first)
                .ok_or_else(|| HfConfigError::UnknownModel { field: "architectures", value: (*first).into() })?,
            None => return Err(HfConfigError::Missing { field: "model_type".into() }),
        },
    };
    if let Some(other) = architectures.iter().find(|a| **a != class) {
        return Err(HfConfigError::Unsupported {
            field: "architectures".into(),
            value: (*other).into(),
            reason: format!(
                "model_type {model_type} is planned as {class} (a causal language model: the layers, then the \
                 classifier over the vocabulary); give the config of a {class} checkpoint"
            ),
        });
    }
    Ok(family)
}

/// `num_hidden_layers` as a `u32`.
fn layers(config: &Fields<'_>, key: &str) -> Result<u32, HfConfigError> {
    let layers = config.size(key)?;
    u32::try_from(layers).map_err(|_| HfConfigError::OutOfRange {
        field: key.into(),
        value: layers.to_string(),
        expected: format!("at most {} layers", u32::MAX),
    })
}

/// The attention heads: `heads` must divide `hidden`, `head_dim` (if given) be `hidden / heads`,
/// and `kv_heads` divide `heads`.
fn heads(config: &Fields<'_>, hidden: u64, kv_key: Option<&str>) -> Result<(u64, u64), HfConfigError> {
    let heads = config.size("num_attention_heads")?;
    if !hidden.is_multiple_of(heads) {
        return Err(HfConfigError::OutOfRange {
            field: "num_attention_heads".into(),
            value: heads.to_string(),
            expected: format!("it must divide hidden_size = {hidden} (the head size is hidden_size / heads)"),
        });
    }
    if let Some(head_dim) = config.uint("head_dim")? {
        if head_dim != hidden / heads {
            return Err(HfConfigError::Unsupported {
                field: "head_dim".into(),
                value: head_dim.to_string(),
                reason: format!(
                    "a head size other than hidden_size / num_attention_heads = {} is not modelled (the planner \
                     sizes Q, K, V and the output projection from hidden_size); plan a model whose head_dim is \
                     {0} or absent",
                    hidden / heads
                ),
            });
        }
    }
    let kv_heads = match kv_key {
        Some(key) => config.uint(key)?.unwrap_or(heads),
        None => heads,
    };
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(HfConfigError::OutOfRange {
            field: kv_key.unwrap_or("num_key_value_heads").into(),
            value: kv_heads.to_string(),
            expected: format!(
                "it must divide num_attention_heads = {heads} (each key/value head serves as many query heads)"
            ),
        });
    }
    Ok((heads, kv_heads))
}

/// The rotary base and rescaling: `rope_parameters` (transformers 5: `rope_theta` and the
/// scaling in one object) if present, else the first of `theta_keys` (default 10,000) and
/// `rope_scaling`.
fn rope(config: &Fields<'_>, theta_keys: &[&str]) -> Result<(f64, Option<RopeScaling>), HfConfigError> {
    let mut theta = None;
    for key in theta_keys {
        if theta.is_none() {
            theta = config.float(key)?;
        }
    }
    if let Some(map) = config.object("rope_parameters")? {
        let parameters = Fields { map, prefix: "rope_parameters." };
        let theta = parameters.float("rope_theta")?.or(theta).unwrap_or(10_000.0);
        return Ok((theta, scaling(&parameters)?));
    }
    let scaling = match config.object("rope_scaling")? {
        Some(map) => scaling(&Fields { map, prefix: "rope_scaling." })?,
        None => None,
    };
    Ok((theta.unwrap_or(10_000.0), scaling))
}

/// A rotary scaling object (its `rope_type`, or the older `type`): `default` (none) or Llama 3's
/// rescaling; any other is refused.
fn scaling(scaling: &Fields<'_>) -> Result<Option<RopeScaling>, HfConfigError> {
    let (key, rope_type) = match scaling.string("rope_type")? {
        Some(t) => ("rope_type", t),
        None => ("type", scaling.required("rope_type", scaling.string("type")?)?),
    };
    match rope_type {
        "default" => Ok(None),
        "llama3" => {
            let number = |key: &str| scaling.float(key).and_then(|v| scaling.required(key, v));
            Ok(Some(RopeScaling {
                factor: number("factor")?,
                low_freq_factor: number("low_freq_factor")?,
                high_freq_factor: number("high_freq_factor")?,
                original_max_positions: scaling.size("original_max_position_embeddings")?,
            }))
        }
        other => Err(HfConfigError::Unsupported {
            field: scaling.name(key),
            value: format!("{other:?}"),
            reason: "a rotary scaling other than Llama 3's (`llama3`), which the planner's kernels do not \
                     implement; use rope_scaling null or llama3"
                .into(),
        }),
    }
}

/// Checks the architecture's numbers, naming the config's fields.
fn checked(architecture: Architecture, eps_key: &str) -> Result<Architecture, HfConfigError> {
    architecture.validate().map_err(|error| match error {
        ModelError::BadArchitecture { field, value } => HfConfigError::OutOfRange {
            field: if field == "norm_eps" { eps_key.into() } else { field.into() },
            value: format!("{value}"),
            expected: "rope_theta is a rotary base above 1, the norm's epsilon a number between 0 and 1, \
                       rope_scaling's factors at least 1 with low_freq_factor < high_freq_factor"
                .into(),
        },
        // (SwiGLU with FFN biases: no family this reader maps produces it.)
        other => HfConfigError::Unsupported {
            field: "model_type".into(),
            value: "this architecture".into(),
            reason: other.to_string(),
        },
    })?;
    Ok(architecture)
}

/// Llama, Mistral and Qwen2: SwiGLU, RMSNorm, grouped-query attention.
fn llama_family(config: &Fields<'_>, family: Family) -> Result<Shape, HfConfigError> {
    let hidden = config.size("hidden_size")?;
    let layers = layers(config, "num_hidden_layers")?;
    let (heads, kv_heads) = heads(config, hidden, Some("num_key_value_heads"))?;
    let ffn_hidden = config.size("intermediate_size")?;
    let vocab = config.size("vocab_size")?;
    let act = config.string("hidden_act")?.unwrap_or("silu");
    if act != "silu" && act != "swish" {
        return Err(HfConfigError::Unsupported {
            field: "hidden_act".into(),
            value: format!("{act:?}"),
            reason: "this model type's FFN is SwiGLU, gated by silu; another gate is not modelled".into(),
        });
    }
    let biases = match family {
        Family::Qwen2 => Biases::QkvOnly,
        _ => Biases::None,
    };
    if family == Family::Llama {
        if let Some(true) = config.boolean("attention_bias")? {
            return Err(HfConfigError::Unsupported {
                field: "attention_bias".into(),
                value: "true".into(),
                reason: "Llama's attention_bias puts biases on Q, K, V and the output projection but none on the \
                         FFN, which this planner's bias kinds (all, Q/K/V only, none) do not describe"
                    .into(),
            });
        }
        if let Some(true) = config.boolean("mlp_bias")? {
            return Err(HfConfigError::Unsupported {
                field: "mlp_bias".into(),
                value: "true".into(),
                reason: "biases on the FFN's gate, up and down projections alone are not one of this planner's \
                         bias kinds (all, Q/K/V only, none)"
                    .into(),
            });
        }
    }
    match family {
        Family::Mistral => {
            if let Some(window) = config.get("sliding_window") {
                return Err(sliding_window("sliding_window", window));
            }
        }
        Family::Qwen2 => {
            if let Some(true) = config.boolean("use_sliding_window")? {
                return Err(sliding_window("use_sliding_window", &Value::Bool(true)));
            }
            if let Some(true) = config.boolean("use_mrope")? {
                return Err(HfConfigError::Unsupported {
                    field: "use_mrope".into(),
                    value: "true".into(),
                    reason: "multimodal rotary positions (Qwen2-VL) are not modelled; plan a text model".into(),
                });
            }
        }
        _ => {}
    }
    let (rope_theta, rope_scaling) = rope(config, &["rope_theta"])?;
    let architecture = Architecture {
        ffn: Ffn::SwiGlu,
        norm: Norm::RmsNorm,
        biases,
        tied_embeddings: config.boolean("tie_word_embeddings")?.unwrap_or(false),
        rope_theta,
        rope_scaling,
        norm_eps: config.float("rms_norm_eps")?.unwrap_or(1e-6),
    };
    let architecture = checked(architecture, "rms_norm_eps")?;
    Ok(Shape { layers, hidden, heads, kv_heads, ffn_hidden, vocab, architecture })
}

fn sliding_window(field: &str, value: &Value) -> HfConfigError {
    HfConfigError::Unsupported {
        field: field.into(),
        value: shown(value),
        reason: "sliding-window attention (each token attends only to the last window of tokens), which this \
                 planner does not model (it plans full causal attention); plan a checkpoint without a window \
                 (sliding_window null, use_sliding_window false)"
            .into(),
    }
}

/// GPT-NeoX with sequential residuals: LayerNorm, biases everywhere, GeLU, full rotary.
fn gpt_neox(config: &Fields<'_>) -> Result<Shape, HfConfigError> {
    // transformers' GPTNeoXConfig defaults: use_parallel_residual true, rotary_pct 0.25,
    // hidden_act gelu, attention_bias true, layer_norm_eps 1e-5, rotary_emb_base 10000, untied.
    let parallel = config.boolean("use_parallel_residual")?.unwrap_or(true);
    if parallel {
        let value = if config.get("use_parallel_residual").is_some() { "true" } else { "absent (default true)" };
        return Err(HfConfigError::Unsupported {
            field: "use_parallel_residual".into(),
            value: value.into(),
            reason: "attention and the MLP read the same input and add to one residual (x + attn(ln1(x)) + \
                     mlp(ln2(x))), which this planner's sequential layer does not describe; only \
                     use_parallel_residual false is read"
                .into(),
        });
    }
    let hidden = config.size("hidden_size")?;
    let layers = layers(config, "num_hidden_layers")?;
    let (heads, kv_heads) = heads(config, hidden, None)?;
    let ffn_hidden = config.size("intermediate_size")?;
    let vocab = config.size("vocab_size")?;
    let (pct_key, pct) = match config.float("rotary_pct")? {
        Some(pct) => ("rotary_pct", Some(pct)),
        None => ("partial_rotary_factor", config.float("partial_rotary_factor")?),
    };
    if pct != Some(1.0) {
        let value = pct.map_or_else(|| "absent (default 0.25)".to_string(), |p| format!("{p}"));
        return Err(HfConfigError::Unsupported {
            field: pct_key.into(),
            value,
            reason: "rotary embeddings on only part of each head are not modelled (the planner rotates whole \
                     heads); only rotary_pct 1.0 is read"
                .into(),
        });
    }
    let act = config.string("hidden_act")?.unwrap_or("gelu");
    if !matches!(act, "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") {
        return Err(HfConfigError::Unsupported {
            field: "hidden_act".into(),
            value: format!("{act:?}"),
            reason: "the planner's GeLU is the tanh approximation (gelu_new, gelu_pytorch_tanh, gelu_fast); \
                     another activation (the exact erf GeLU `gelu` included) is not what its kernels compute"
                .into(),
        });
    }
    if let Some(false) = config.boolean("attention_bias")? {
        return Err(HfConfigError::Unsupported {
            field: "attention_bias".into(),
            value: "false".into(),
            reason: "biases on the FFN but not on attention are not one of this planner's bias kinds (all, Q/K/V \
                     only, none)"
                .into(),
        });
    }
    let (rope_theta, rope_scaling) = rope(config, &["rotary_emb_base", "rope_theta"])?;
    let architecture = Architecture {
        ffn: Ffn::Gelu,
        norm: Norm::LayerNorm,
        biases: Biases::All,
        tied_embeddings: config.boolean("tie_word_embeddings")?.unwrap_or(false),
        rope_theta,
        rope_scaling,
        norm_eps: config.float("layer_norm_eps")?.unwrap_or(1e-5),
    };
    let architecture = checked(architecture, "layer_norm_eps")?;
    Ok(Shape { layers, hidden, heads, kv_heads, ffn_hidden, vocab, architecture })
}
