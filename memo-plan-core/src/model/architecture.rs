//! The shape of a transformer layer beyond its sizes: which feed-forward block, which norm, which
//! projections carry biases, whether the classifier is tied to the embedding, and the numbers the
//! kernels need (the rotary base, the norm's epsilon). One [`Architecture`] describes the paper's
//! GPT (GeLU, LayerNorm, biases everywhere, tied) and the Llama family (SwiGLU, RMSNorm, no biases,
//! untied) alike; grouped-query attention is [`super::ModelConfig::kv_heads`].
//!
//! Every per-architecture number is read off one table: [`Architecture::skeletal_widths`] (what a
//! layer keeps per token, for MEMO's LP and the schedule) and [`super::ModelConfig::parameter_count`].

use core::fmt;

use super::ModelError;

/// The feed-forward block of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Ffn {
    /// `fc2(gelu(fc1(x)))`: FC1 `h -> f`, GeLU (tanh approximation), FC2 `f -> h` (GPT).
    Gelu,
    /// `down(silu(gate(x)) * up(x))`: gate and up `h -> f` each (one product of `2f` outputs,
    /// gate first), their gated product, down `f -> h` (Llama, Qwen2, Mistral).
    SwiGlu,
}

/// The normalisation before attention, before the FFN and before the classifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Norm {
    /// `(x - mean) / sqrt(var + eps) * scale + shift` (GPT).
    LayerNorm,
    /// `x / sqrt(mean(x^2) + eps) * scale`: no shift (Llama, Qwen2, Mistral).
    RmsNorm,
}

/// Which linear layers carry a bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Biases {
    /// Q, K, V, the attention output projection and both FFN products (GPT).
    All,
    /// Q, K and V only (Qwen2).
    QkvOnly,
    /// None (Llama, Mistral).
    None,
}

impl Biases {
    /// Whether the Q, K and V projections have biases.
    pub fn qkv(self) -> bool {
        matches!(self, Biases::All | Biases::QkvOnly)
    }

    /// Whether the attention output projection and the FFN products have biases.
    pub fn output_and_ffn(self) -> bool {
        matches!(self, Biases::All)
    }
}

/// Llama 3.1's rescaling of the rotary frequencies for long contexts (`rope_scaling` with
/// `rope_type = "llama3"` in a Hugging Face config). It changes no size or FLOP count, so the
/// planner carries it as data; a trainer whose kernels do not implement it refuses the model.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RopeScaling {
    /// `factor`: how much longer the context is than the original.
    pub factor: f64,
    /// `low_freq_factor`.
    pub low_freq_factor: f64,
    /// `high_freq_factor`.
    pub high_freq_factor: f64,
    /// `original_max_position_embeddings`.
    pub original_max_positions: u64,
}

/// The shape of a transformer layer beyond its sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Architecture {
    /// The feed-forward block.
    pub ffn: Ffn,
    /// The norms.
    pub norm: Norm,
    /// Which projections carry biases.
    pub biases: Biases,
    /// Whether the classifier is the word embedding (`true`) or a `V x h` matrix of its own.
    pub tied_embeddings: bool,
    /// The rotary base `theta`: pair `i` of a head of dimension `d` turns by `pos * theta^(-2i/d)`.
    pub rope_theta: f64,
    /// Llama 3.1's frequency rescaling, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// The norms' epsilon.
    pub norm_eps: f64,
}

/// Elements per token of each of one layer's eleven skeletal tensors, before the division by the
/// tensor-parallel degree: what [`Architecture::skeletal_widths`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkeletalWidths {
    /// The hidden state and the norm outputs: `h`.
    pub hidden: u64,
    /// Queries and the attention output: `heads * head_dim`.
    pub query: u64,
    /// Keys, and values: `kv_heads * head_dim` each.
    pub key_value: u64,
    /// The log-sum-exp, in f32: one per query head.
    pub lse: u64,
    /// FC1's output: `f` (GeLU) or `2f` (SwiGLU: gate and up).
    pub fc1: u64,
    /// The activation's output (GeLU's, or SwiGLU's gated product): `f`.
    pub activation: u64,
}

impl Architecture {
    /// The paper's GPT: GeLU FFN, LayerNorm, biases on every projection, the classifier tied to
    /// the embedding, rotary base 10,000, epsilon 1e-5.
    pub const GPT: Architecture = Architecture {
        ffn: Ffn::Gelu,
        norm: Norm::LayerNorm,
        biases: Biases::All,
        tied_embeddings: true,
        rope_theta: 10_000.0,
        rope_scaling: None,
        norm_eps: 1e-5,
    };

    /// The Llama family's layer: SwiGLU, RMSNorm, no biases, untied, with this rotary base and
    /// epsilon.
    pub const fn llama(rope_theta: f64, norm_eps: f64) -> Architecture {
        Architecture {
            ffn: Ffn::SwiGlu,
            norm: Norm::RmsNorm,
            biases: Biases::None,
            tied_embeddings: false,
            rope_theta,
            rope_scaling: None,
            norm_eps,
        }
    }

    /// Elements per token of each skeletal tensor of one layer, whole (not yet divided by `t`),
    /// for a model of hidden size `hidden`, `heads` query heads and `kv_heads` key/value heads of
    /// dimension `hidden / heads`, and FFN width `ffn`. Saturating: the caller's checked products
    /// report an overflow.
    pub fn skeletal_widths(&self, hidden: u64, heads: u64, kv_heads: u64, ffn: u64) -> SkeletalWidths {
        let head_dim = hidden.checked_div(heads).unwrap_or(0);
        SkeletalWidths {
            hidden,
            query: hidden,
            key_value: kv_heads.saturating_mul(head_dim),
            lse: heads,
            fc1: ffn.saturating_mul(self.ffn_in_products()),
            activation: ffn,
        }
    }

    /// Parameters of one norm: scale and shift (LayerNorm) or scale alone (RMSNorm), per element.
    pub fn norm_vectors(&self) -> u64 {
        match self.norm {
            Norm::LayerNorm => 2,
            Norm::RmsNorm => 1,
        }
    }

    /// Linear products of the FFN from `h` to `f` (1 for GeLU's FC1, 2 for SwiGLU's gate and up).
    pub fn ffn_in_products(&self) -> u64 {
        match self.ffn {
            Ffn::Gelu => 1,
            Ffn::SwiGlu => 2,
        }
    }

    /// Checks the numbers the kernels use: a rotary base above 1, an epsilon above 0 and below 1,
    /// a rescaling with factors at least 1 and `low < high`; and that SwiGLU comes without FFN
    /// biases (no model of the family has them, and the tensor-parallel split of a `[gate | up]`
    /// bias is not implemented).
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.ffn == Ffn::SwiGlu && self.biases == Biases::All {
            return Err(ModelError::SwiGluWithFfnBiases);
        }
        let bad = |field: &'static str, value: f64| Err(ModelError::BadArchitecture { field, value });
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad("rope_theta", self.rope_theta);
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            return bad("norm_eps", self.norm_eps);
        }
        if let Some(scaling) = self.rope_scaling {
            if !(scaling.factor.is_finite() && scaling.factor >= 1.0) {
                return bad("rope_scaling.factor", scaling.factor);
            }
            if !(scaling.low_freq_factor.is_finite()
                && scaling.high_freq_factor.is_finite()
                && scaling.low_freq_factor > 0.0
                && scaling.low_freq_factor < scaling.high_freq_factor)
            {
                return bad("rope_scaling.low_freq_factor", scaling.low_freq_factor);
            }
            if scaling.original_max_positions == 0 {
                return bad("rope_scaling.original_max_position_embeddings", 0.0);
            }
        }
        Ok(())
    }
}

impl Ffn {
    /// A short name for reports and files: `gelu`, `swiglu`.
    pub fn name(self) -> &'static str {
        match self {
            Ffn::Gelu => "gelu",
            Ffn::SwiGlu => "swiglu",
        }
    }

    /// Every kind, in byte-format code order.
    pub const ALL: [Ffn; 2] = [Ffn::Gelu, Ffn::SwiGlu];
}

impl Norm {
    /// A short name for reports and files: `layernorm`, `rmsnorm`.
    pub fn name(self) -> &'static str {
        match self {
            Norm::LayerNorm => "layernorm",
            Norm::RmsNorm => "rmsnorm",
        }
    }

    /// Every kind, in byte-format code order.
    pub const ALL: [Norm; 2] = [Norm::LayerNorm, Norm::RmsNorm];
}

impl Biases {
    /// A short name for reports and files: `all`, `qkv`, `none`.
    pub fn name(self) -> &'static str {
        match self {
            Biases::All => "all",
            Biases::QkvOnly => "qkv",
            Biases::None => "none",
        }
    }

    /// Every kind, in byte-format code order.
    pub const ALL: [Biases; 3] = [Biases::All, Biases::QkvOnly, Biases::None];
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} FFN, {}, biases {}, {} classifier, rope theta {}",
            self.ffn.name(),
            self.norm.name(),
            self.biases.name(),
            if self.tied_embeddings { "tied" } else { "untied" },
            self.rope_theta
        )?;
        if self.rope_scaling.is_some() {
            f.write_str(" (llama3 rope scaling)")?;
        }
        Ok(())
    }
}
