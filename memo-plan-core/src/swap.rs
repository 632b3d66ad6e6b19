//! MEMO's swap fraction alpha (`docs/technique.md` section 1; `spec/cost-model.md`): the share of each
//! token-split skeletal tensor that is copied to host after a layer's forward (tokens
//! `[0, alpha*s)`); the rest, tokens `[alpha*s, s)`, is recomputed before the layer's backward.
//!
//! The one-variable LP, per GPU, with `F = S_input + S_attn + LSE` (always swapped),
//! `O = S_others` (token-split), `B` the device-to-host bandwidth one GPU gets, `T` one layer's
//! forward time, `n` layers and `M` the host memory of one GPU:
//!
//! ```text
//! maximise alpha
//! subject to (F + alpha*O) / B     <= T      (the copy hides under the next layer's forward)
//!            (n - 2) * (F + alpha*O) <= M      (host capacity; the last two layers never swap)
//!            0 <= alpha <= 1
//! ```
//!
//! Closed form: `alpha* = min((B*T - F) / O, (M/(n-2) - F) / O)`, `alpha = clamp(alpha*, 0, 1)`.
//! When `alpha* < 0` the input and the attention output (with its LSE) are still swapped whole
//! (`docs/technique.md` section 4): the report gives the forward stall this causes when bandwidth is short,
//! and the host-memory shortfall when host memory is, with what would remove each.

use core::fmt;

use crate::cost::{self, AttentionFlops, CostError};
use crate::model::{Hardware, ModelConfig, ModelError, Parallelism};

/// Which constraint fixed alpha.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AlphaBound {
    /// The copy must hide under one layer's forward: PCIe is the limit (short sequences).
    Bandwidth,
    /// The swapped layers must fit in host memory (long sequences).
    HostMemory,
    /// Neither: every row's copy fits and hides, alpha = 1 (or no layer swaps at all, or the
    /// strategy swaps nothing).
    None,
    /// The caller chose alpha ([`SwapOptions::forced_alpha`]).
    Forced,
}

impl AlphaBound {
    /// How a report names it.
    pub fn label(self) -> &'static str {
        match self {
            AlphaBound::Bandwidth => "bound by host-link bandwidth",
            AlphaBound::HostMemory => "bound by host memory",
            AlphaBound::None => "no constraint binds",
            AlphaBound::Forced => "forced",
        }
    }
}

/// What is wrong with the inputs of the alpha LP.
#[derive(Clone, Debug, PartialEq)]
pub enum SwapError {
    /// The model, parallel layout or machine is invalid, or a size overflows.
    Model(ModelError),
    /// Another error of the cost model.
    Cost(CostError),
    /// A forced alpha outside `[0, 1]` or not a number.
    BadForcedAlpha {
        /// The value given.
        alpha: f64,
    },
    /// A field of an [`AlphaProblem`] that must be at least 1 is 0.
    Zero {
        /// The field.
        field: &'static str,
    },
    /// An [`AlphaProblem`] layer time that is not a finite number of seconds above 0.
    BadLayerTime {
        /// The value given.
        seconds: f64,
    },
}

impl From<ModelError> for SwapError {
    fn from(error: ModelError) -> Self {
        SwapError::Model(error)
    }
}

impl From<CostError> for SwapError {
    fn from(error: CostError) -> Self {
        match error {
            CostError::Model(error) => SwapError::Model(error),
            other => SwapError::Cost(other),
        }
    }
}

impl fmt::Display for SwapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SwapError::Model(error) => error.fmt(f),
            SwapError::Cost(error) => error.fmt(f),
            SwapError::BadForcedAlpha { alpha } => write!(
                f,
                "forced_alpha = {alpha} is not a swap fraction: give a number from 0 (swap only the input \
                 and attention output) to 1 (swap everything), or leave it unset to solve for alpha"
            ),
            SwapError::Zero { field } => {
                write!(f, "{field} is 0: the alpha LP needs it to be at least 1")
            }
            SwapError::BadLayerTime { seconds } => write!(
                f,
                "layer_forward_s = {seconds} is not a time: give one layer's forward time, a finite \
                 number of seconds above 0"
            ),
        }
    }
}

impl core::error::Error for SwapError {}

/// How to choose alpha.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwapOptions {
    /// Use this alpha instead of solving the LP (1.0 = full swap, no recompute). The report still
    /// gives the LP's own optimum, and the stall and host shortfall the forced value causes.
    pub forced_alpha: Option<f64>,
    /// How attention FLOPs enter `T_layer` when it is estimated from FLOPs (ignored when the
    /// hardware has a measured layer time). [`AttentionFlops::CausalHalved`] by default: a GPT's
    /// FlashAttention skips the masked half.
    pub attention: AttentionFlops,
}

impl Default for SwapOptions {
    fn default() -> Self {
        SwapOptions { forced_alpha: None, attention: AttentionFlops::CausalHalved }
    }
}

impl SwapOptions {
    /// Full swap: alpha = 1, nothing recomputed.
    pub fn full_swap() -> Self {
        SwapOptions { forced_alpha: Some(1.0), ..SwapOptions::default() }
    }
}

/// The numbers of the alpha LP, all per GPU. [`AlphaProblem::from_model`] fills them from a
/// model, layout and machine; a caller with a measured profile may fill them directly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlphaProblem {
    /// `n`, the number of layers (the last two never swap).
    pub layers: u32,
    /// `F = S_input + S_attn + LSE`: bytes of one layer always swapped whole.
    pub always_swapped_bytes: u64,
    /// `O = S_others`: bytes of one layer's token-split tensors.
    pub token_split_bytes: u64,
    /// `B`: device-to-host bytes per second one GPU gets while its uplink's GPUs all copy.
    pub bandwidth_bytes_per_s: u64,
    /// `T`: one layer's forward time in seconds.
    pub layer_forward_s: f64,
    /// `M`: host bytes one GPU may fill with swapped activations.
    pub host_bytes: u64,
    /// Tokens per sequence, for the longest-sequence remedy (the always-swapped bytes are taken
    /// to grow in proportion to it).
    pub seq_len: u64,
    /// A suggested sequence length is a multiple of this (the tensor-parallel degree `t`).
    pub seq_len_multiple: u64,
}

/// The chosen alpha, why, and what it costs. Bytes and times are per GPU and per layer unless
/// named otherwise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwapFraction {
    /// The swap fraction, in `[0, 1]`.
    pub alpha: f64,
    /// Which constraint fixed it.
    pub bound: AlphaBound,
    /// The LP's optimum before clamping to `[0, 1]`: `min(alpha_bandwidth, alpha_host)`. Negative
    /// when even the input and attention output cannot be swapped within the constraints.
    pub alpha_unclamped: f64,
    /// The root of the bandwidth constraint, `(B*T - F) / O`.
    pub alpha_bandwidth: f64,
    /// The root of the host constraint, `(M/(n-2) - F) / O` (`+inf` when no layer swaps).
    pub alpha_host: f64,
    /// Layers whose skeletal tensors are swapped: `n - 2` (0 when `n <= 2`).
    pub swapped_layers: u32,
    /// Bytes copied to host per swapped layer: `F + floor(alpha * O)`.
    pub swapped_bytes_per_layer: u64,
    /// The time that copy takes at `B`.
    pub swap_out_time_s: f64,
    /// `T`, one layer's forward time.
    pub layer_forward_s: f64,
    /// How much longer than `T` the copy takes, per swapped layer: the compute stream waits this
    /// long before overwriting the rounding buffer. 0 unless alpha was forced or `alpha* < 0`
    /// because of bandwidth.
    pub forward_stall_s: f64,
    /// The bandwidth at which this copy would hide under `T`: `swapped_bytes_per_layer / T`.
    /// Above `B` exactly when there is a stall.
    pub bandwidth_for_no_stall_bytes_per_s: f64,
    /// Host bytes this alpha needs on one GPU: `(n - 2) * swapped_bytes_per_layer`. Multiply by
    /// the GPUs of a node for the node's host memory.
    pub host_bytes_needed: u64,
    /// Host bytes one GPU has, `M`.
    pub host_bytes_available: u64,
    /// `host_bytes_needed - host_bytes_available` when positive: the plan does not fit in host
    /// memory. 0 unless alpha was forced or `alpha* < 0` because of host memory.
    pub host_shortfall_bytes: u64,
    /// The longest sequence (a multiple of `t`) whose input and attention output, for every
    /// swapped layer, fit in host memory: the "fewer tokens" remedy of a host shortfall. `None`
    /// when no layer swaps (no limit).
    pub max_seq_len_for_host: Option<u64>,
}

impl SwapFraction {
    /// Whether the swapped data fits in host memory.
    pub fn fits_in_host(&self) -> bool {
        self.host_shortfall_bytes == 0
    }

    /// The tokens of a sequence of `seq_len` whose token-split tensors are swapped:
    /// `floor(alpha * seq_len)`, the prefix `[0, that)`.
    pub fn swapped_tokens(&self, seq_len: u64) -> u64 {
        // f64 -> u64 `as` saturates; min() guards rounding at huge lengths.
        (libm::floor(self.alpha * seq_len as f64) as u64).min(seq_len)
    }
}

impl fmt::Display for SwapFraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "alpha = {:.4} ({}); LP optimum {:.4}", self.alpha, self.bound.label(), self.alpha_unclamped)?;
        if self.forward_stall_s > 0.0 {
            write!(
                f,
                "; forward stall {:.4} s per layer (the copy needs {:.2} GB/s to hide)",
                self.forward_stall_s,
                self.bandwidth_for_no_stall_bytes_per_s / 1e9
            )?;
        }
        if self.host_shortfall_bytes > 0 {
            write!(
                f,
                "; host memory short by {} per GPU ({} bytes; needs {})",
                crate::planner::binary_units(self.host_shortfall_bytes),
                self.host_shortfall_bytes,
                crate::planner::binary_units(self.host_bytes_needed)
            )?;
            if let Some(tokens) = self.max_seq_len_for_host {
                write!(f, "; at most {tokens} tokens keep the always-swapped tensors within it")?;
            }
        }
        Ok(())
    }
}

impl AlphaProblem {
    /// The LP's numbers for a model on a machine: skeletal sizes from
    /// [`ModelConfig::skeletal_set`], `B` from [`Hardware::d2h_effective_bytes_per_s`], `M` from
    /// [`Hardware::host_memory_per_gpu_bytes`], `T` from [`cost::layer_forward_time_s`].
    pub fn from_model(
        model: &ModelConfig,
        parallel: &Parallelism,
        hardware: &Hardware,
        attention: AttentionFlops,
    ) -> Result<Self, SwapError> {
        hardware.validate()?;
        let set = model.skeletal_set(parallel)?;
        Ok(AlphaProblem {
            layers: model.layers,
            always_swapped_bytes: set.always_swapped_bytes(),
            token_split_bytes: set.others_bytes,
            bandwidth_bytes_per_s: hardware.d2h_effective_bytes_per_s(),
            layer_forward_s: cost::layer_forward_time_s(model, parallel, hardware, attention)?,
            host_bytes: hardware.host_memory_per_gpu_bytes(),
            // The whole sequence: F is this GPU's bytes at s, so F s' / s scales to any s'.
            seq_len: model.seq_len,
            seq_len_multiple: parallel.seq_len_multiple(),
        })
    }

    fn validate(&self) -> Result<(), SwapError> {
        let fields = [
            ("layers", u64::from(self.layers)),
            ("token_split_bytes", self.token_split_bytes),
            ("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s),
            ("seq_len", self.seq_len),
            ("seq_len_multiple", self.seq_len_multiple),
        ];
        if let Some((field, _)) = fields.iter().find(|(_, value)| *value == 0) {
            return Err(SwapError::Zero { field });
        }
        if !(self.layer_forward_s.is_finite() && self.layer_forward_s > 0.0) {
            return Err(SwapError::BadLayerTime { seconds: self.layer_forward_s });
        }
        Ok(())
    }

    /// Solves the LP in closed form, or evaluates `forced_alpha` (which must be in `[0, 1]`).
    pub fn solve(&self, forced_alpha: Option<f64>) -> Result<SwapFraction, SwapError> {
        self.validate()?;
        if let Some(alpha) = forced_alpha {
            if !(0.0..=1.0).contains(&alpha) {
                return Err(SwapError::BadForcedAlpha { alpha });
            }
        }
        let swapped_layers = self.layers.saturating_sub(2);
        let bandwidth = self.bandwidth_bytes_per_s as f64;
        let fixed = self.always_swapped_bytes as f64;
        let split = self.token_split_bytes as f64;
        if swapped_layers == 0 {
            // Every layer keeps its skeletal set in a rounding buffer: nothing is copied, nothing
            // recomputed, no constraint applies.
            let alpha = forced_alpha.unwrap_or(1.0);
            return Ok(SwapFraction {
                alpha,
                bound: if forced_alpha.is_some() { AlphaBound::Forced } else { AlphaBound::None },
                alpha_unclamped: f64::INFINITY,
                alpha_bandwidth: f64::INFINITY,
                alpha_host: f64::INFINITY,
                swapped_layers,
                swapped_bytes_per_layer: 0,
                swap_out_time_s: 0.0,
                layer_forward_s: self.layer_forward_s,
                forward_stall_s: 0.0,
                bandwidth_for_no_stall_bytes_per_s: 0.0,
                host_bytes_needed: 0,
                host_bytes_available: self.host_bytes,
                host_shortfall_bytes: 0,
                max_seq_len_for_host: None,
            });
        }
        // Host bytes one swapped layer may use, exactly.
        let host_per_layer = self.host_bytes / u64::from(swapped_layers);
        let alpha_bandwidth = (bandwidth * self.layer_forward_s - fixed) / split;
        let alpha_host = (host_per_layer as f64 - fixed) / split;
        let alpha_unclamped = alpha_bandwidth.min(alpha_host);
        let (alpha, bound) = match forced_alpha {
            Some(alpha) => (alpha, AlphaBound::Forced),
            None if alpha_unclamped >= 1.0 => (1.0, AlphaBound::None),
            None if alpha_bandwidth <= alpha_host => (alpha_unclamped.max(0.0), AlphaBound::Bandwidth),
            None => (alpha_unclamped.max(0.0), AlphaBound::HostMemory),
        };
        let mut split_swapped = (libm::floor(alpha * split) as u64).min(self.token_split_bytes);
        if forced_alpha.is_none() {
            // Keep f64 rounding from overshooting the exact host capacity by a byte.
            if let Some(room) = host_per_layer.checked_sub(self.always_swapped_bytes) {
                split_swapped = split_swapped.min(room);
            }
        }
        let what = "host bytes of the swapped layers";
        let swapped_bytes_per_layer =
            self.always_swapped_bytes.checked_add(split_swapped).ok_or(ModelError::Overflow { what })?;
        let host_bytes_needed =
            swapped_bytes_per_layer.checked_mul(u64::from(swapped_layers)).ok_or(ModelError::Overflow { what })?;
        let swap_out_time_s = swapped_bytes_per_layer as f64 / bandwidth;
        // An unforced alpha >= 0 meets the bandwidth constraint by construction.
        let may_stall = forced_alpha.is_some() || alpha_bandwidth < 0.0;
        let forward_stall_s = if may_stall { (swap_out_time_s - self.layer_forward_s).max(0.0) } else { 0.0 };
        Ok(SwapFraction {
            alpha,
            bound,
            alpha_unclamped,
            alpha_bandwidth,
            alpha_host,
            swapped_layers,
            swapped_bytes_per_layer,
            swap_out_time_s,
            layer_forward_s: self.layer_forward_s,
            forward_stall_s,
            bandwidth_for_no_stall_bytes_per_s: swapped_bytes_per_layer as f64 / self.layer_forward_s,
            host_bytes_needed,
            host_bytes_available: self.host_bytes,
            host_shortfall_bytes: host_bytes_needed.saturating_sub(self.host_bytes),
            max_seq_len_for_host: Some(self.max_seq_len_for_host(host_per_layer)),
        })
    }

    /// The longest multiple of `seq_len_multiple` tokens whose always-swapped bytes,
    /// `F * tokens / seq_len`, fit in `host_per_layer`.
    fn max_seq_len_for_host(&self, host_per_layer: u64) -> u64 {
        if self.always_swapped_bytes == 0 {
            return u64::MAX - u64::MAX % self.seq_len_multiple;
        }
        // < 2^128: both factors are below 2^64.
        let tokens = u128::from(host_per_layer) * u128::from(self.seq_len) / u128::from(self.always_swapped_bytes);
        let tokens = u64::try_from(tokens).unwrap_or(u64::MAX);
        tokens - tokens % self.seq_len_multiple
    }
}

/// MEMO's alpha for a model on a machine: [`AlphaProblem::from_model`], then
/// [`AlphaProblem::solve`] (or the forced value of `options`).
pub fn swap_fraction(
    model: &ModelConfig,
    parallel: &Parallelism,
    hardware: &Hardware,
    options: &SwapOptions,
) -> Result<SwapFraction, SwapError> {
    AlphaProblem::from_model(model, parallel, hardware, options.attention)?.solve(options.forced_alpha)
}

#[cfg(test)]
mod tests;
