//! Model descriptions through the C ABI: a Hugging Face `config.json` read as the planner reads
//! it (`memo_model_from_hf_config`, the same refusals as `memo plan --model config.json`), and the
//! model a plan file was made for (`memo_plan_model`), both as one `MemoModel`.

use std::ffi::c_char;

use memo_plan_core::model::{model_from_hf_config, ModelConfig};

use crate::ffi_util::{bytes_arg, static_name, write_out};
use crate::plan_file::{loaded, MemoPlan};
use crate::status::{guard, CapiError, MemoStatus};

/// A model's shape and architecture (`spec/cost-model.md` section 1). The names are static text
/// (never freed, never NULL).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoModel {
    /// Parameters of the whole model (embedding, layers, final norm, an untied classifier).
    pub parameter_count: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (fewer than `heads` with grouped-query attention).
    pub kv_heads: u64,
    /// FFN width.
    pub ffn_hidden: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// The rotary base.
    pub rope_theta: f64,
    /// The norms' epsilon.
    pub norm_eps: f64,
    /// The FFN: `"gelu"` or `"swiglu"`.
    pub ffn: *const c_char,
    /// The norm: `"layernorm"` or `"rmsnorm"`.
    pub norm: *const c_char,
    /// Which projections have biases: `"all"`, `"qkv"` or `"none"`.
    pub biases: *const c_char,
    /// Transformer layers.
    pub layers: u32,
    /// 1 when the classifier is the word embedding, 0 when it is a matrix of its own.
    pub tied_embeddings: u32,
    /// 1 when the model has Llama 3.1's rope rescaling (planned, not trained), else 0.
    pub rope_scaling: u32,
}

impl MemoModel {
    fn of(model: &ModelConfig) -> Result<Self, CapiError> {
        let parameter_count = model
            .parameter_count()
            .map_err(|e| CapiError::new(MemoStatus::InvalidArgument, format!("the model is not valid: {e}")))?;
        let a = &model.architecture;
        Ok(MemoModel {
            parameter_count,
            hidden: model.hidden,
            heads: model.heads,
            kv_heads: model.kv_heads,
            ffn_hidden: model.ffn_hidden,
            vocab: model.vocab,
            seq_len: model.seq_len,
            micro_batch: model.micro_batch,
            rope_theta: a.rope_theta,
            norm_eps: a.norm_eps,
            ffn: static_name(a.ffn.name()),
            norm: static_name(a.norm.name()),
            biases: static_name(a.biases.name()),
            layers: model.layers,
            tied_embeddings: u32::from(a.tied_embeddings),
            rope_scaling: u32::from(a.rope_scaling.is_some()),
        })
    }
}

/// Reads the Hugging Face `config.json` text `json[0 .. len)` (UTF-8) as the planner does, for
/// sequences of `seq_len` tokens, `micro_batch` at a time, and writes the model to `*out`. A
/// config the planner cannot describe exactly (mixture of experts, sliding windows, latent
/// attention, an unknown `model_type`, a missing or mistyped field, malformed JSON) is refused
/// with `MEMO_STATUS_INVALID_ARGUMENT`, the last error naming the field.
///
/// # Safety
/// `json` is valid for reading `len` bytes (or NULL with `len` 0); `out` is NULL (refused) or
/// valid for writing one `MemoModel`.
#[no_mangle]
pub unsafe extern "C" fn memo_model_from_hf_config(
    json: *const u8,
    len: usize,
    seq_len: u64,
    micro_batch: u64,
    out: *mut MemoModel,
) -> MemoStatus {
    guard("memo_model_from_hf_config", || {
        if out.is_null() {
            return Err(CapiError::null("out"));
        }
        // Safety: forwarded from this function's contract.
        let bytes = unsafe { bytes_arg(json, len, "json")? };
        let text = std::str::from_utf8(bytes)
            .map_err(|e| CapiError::new(MemoStatus::InvalidArgument, format!("the config is not UTF-8 text ({e})")))?;
        let model = model_from_hf_config(text, "config", seq_len, micro_batch)
            .map_err(|e| CapiError::new(MemoStatus::InvalidArgument, e.to_string()))?;
        let described = MemoModel::of(&model)?;
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", described) }
    })
}

/// Writes the model a loaded plan was made for to `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for writing one `MemoModel`.
#[no_mangle]
pub unsafe extern "C" fn memo_plan_model(plan: *const MemoPlan, out: *mut MemoModel) -> MemoStatus {
    guard("memo_plan_model", || {
        let loaded = loaded(plan)?;
        let described = MemoModel::of(&loaded.plan.provenance.model)?;
        // Safety: forwarded from this function's contract.
        unsafe { write_out(out, "out", described) }
    })
}
