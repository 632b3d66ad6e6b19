//! FLOPs of one layer and of one training step, MFU, and a per-layer forward-time estimate
//! (`spec/cost-model.md`).
//!
//! Only matrix products are counted (the convention of Megatron-LM's and the paper's MFU): the
//! GEMMs `2*m*n*k` and FlashAttention's two products `Q K^T` and `P V`. Layer norms, GeLU, softmax,
//! residual adds and the cross-entropy are memory-bound, well under 1% of the FLOPs, and counted
//! as 0. With `b` sequences of `s` tokens, hidden `h`, MLP width `f` and vocabulary `V`, one
//! layer's forward is
//!
//! ```text
//! Q 2bsh^2 + K, V 2 * 2bsh*g*d + projection 2bsh^2 + FC1 2bshf (SwiGLU: gate and up, 4bshf)
//!   + FC2 2bshf + attention 4bs^2h
//! ```
//!
//! with `g*d` the key/value width (`g` key/value heads of dimension `d = h / heads`; `g*d = h`
//! without grouped-query attention): `24bsh^2 + 4bs^2h` for GPT with `f = 4h`. The attention term is halved under the causal mask when
//! [`AttentionFlops::CausalHalved`] is chosen. The backward is twice the forward. Every count is
//! per GPU: the whole count divided by `t`, exactly (the inputs are validated so that `t` divides
//! `s`, `h` and `f`). Counts are `u128` with checked arithmetic; an overflow is an error.

use core::fmt;

use crate::model::{Hardware, Interconnect, ModelConfig, ModelError, OptimizerSharding, Parallelism};
use crate::plan::Op;

/// How the attention products are counted under the causal mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AttentionFlops {
    /// Half of `4bs^2h`: the masked half is skipped, as FlashAttention does. The right count for
    /// time; the stricter MFU convention.
    CausalHalved,
    /// All of `4bs^2h`, as if no mask. The convention behind many published MFU figures (about 2x
    /// the other at 1M tokens).
    Full,
}

impl AttentionFlops {
    /// Both conventions, in report order.
    pub const BOTH: [AttentionFlops; 2] = [AttentionFlops::CausalHalved, AttentionFlops::Full];

    /// How a report labels the convention.
    pub fn label(self) -> &'static str {
        match self {
            AttentionFlops::CausalHalved => "attention FLOPs halved for the causal mask",
            AttentionFlops::Full => "attention FLOPs counted in full",
        }
    }
}

/// What is wrong with an input of the cost model.
#[derive(Clone, Debug, PartialEq)]
pub enum CostError {
    /// The model, parallel layout or machine is invalid, or a count overflows.
    Model(ModelError),
    /// A step time that is not a finite number of seconds above 0.
    BadStepTime {
        /// The value given.
        seconds: f64,
    },
    /// A swap fraction outside `[0, 1]` (or not a number).
    BadAlpha {
        /// The value given.
        alpha: f64,
    },
    /// A measured layer forward time shorter than the layer's FLOPs take at the peak: it was
    /// measured for another layer shape (a profile of a small model applied to a large one).
    MeasuredAbovePeak {
        /// `measured_layer_forward_s`.
        seconds: f64,
        /// The forward FLOPs of one layer of the planned model (attention halved for the mask).
        layer_flops: u128,
        /// `peak_flops`.
        peak: u64,
    },
}

impl From<ModelError> for CostError {
    fn from(error: ModelError) -> Self {
        CostError::Model(error)
    }
}

impl fmt::Display for CostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CostError::Model(error) => error.fmt(f),
            CostError::BadStepTime { seconds } => {
                write!(f, "step_time_s = {seconds} is not a time: give the measured step time, a finite number of seconds above 0")
            }
            CostError::BadAlpha { alpha } => {
                write!(
                    f,
                    "alpha = {alpha} is not a swap fraction: give a number from 0 (recompute all) to 1 (swap all)"
                )
            }
            CostError::MeasuredAbovePeak { seconds, layer_flops, peak } => write!(
                f,
                "measured_layer_forward_s = {seconds} s would run this model's layer ({layer_flops} FLOPs) at \
                 {:.3e} FLOP/s, above peak_flops = {peak}: the time was measured for another layer shape; \
                 delete measured_layer_forward_s (layer_forward_s in a machine file) to plan from achieved_flops, \
                 or profile this model and sequence",
                *layer_flops as f64 / seconds
            ),
        }
    }
}

impl core::error::Error for CostError {}

/// The FLOPs of one layer's forward on one GPU, per operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerForwardFlops {
    /// The Q, K and V GEMMs: `2 * bs * h * (h + 2 g d)` (`2 * bs * h * 3h` without grouped-query
    /// attention).
    pub qkv: u128,
    /// `Q K^T`: `2 * b * s^2 * h` (halved under [`AttentionFlops::CausalHalved`]).
    pub attention_scores: u128,
    /// `P V`: `2 * b * s^2 * h` (halved under [`AttentionFlops::CausalHalved`]).
    pub attention_values: u128,
    /// The attention output projection: `2 * bs * h * h`.
    pub projection: u128,
    /// FC1: `2 * bs * h * f` (SwiGLU's gate and up: twice that).
    pub fc1: u128,
    /// FC2 (SwiGLU's down): `2 * bs * f * h`.
    pub fc2: u128,
}

impl LayerForwardFlops {
    /// All of them. Exact for counts from [`layer_forward_flops`], which checked the sum;
    /// saturating for hand-made values.
    pub fn total(&self) -> u128 {
        self.gemm().saturating_add(self.attention())
    }

    /// The four GEMMs.
    pub fn gemm(&self) -> u128 {
        self.qkv.saturating_add(self.projection).saturating_add(self.fc1).saturating_add(self.fc2)
    }

    /// The two attention products.
    pub fn attention(&self) -> u128 {
        self.attention_scores.saturating_add(self.attention_values)
    }
}

/// `a * b`, or an overflow error naming `what`.
fn mul(a: u128, b: u128, what: &'static str) -> Result<u128, ModelError> {
    a.checked_mul(b).ok_or(ModelError::Overflow { what })
}

/// `a + b`, or an overflow error naming `what`.
fn add(a: u128, b: u128, what: &'static str) -> Result<u128, ModelError> {
    a.checked_add(b).ok_or(ModelError::Overflow { what })
}

/// `2 * rows * n * k / t`: one GEMM over `rows` token rows, per GPU.
fn gemm(rows: u128, n: u64, k: u64, tensor: u64, what: &'static str) -> Result<u128, ModelError> {
    Ok(mul(mul(mul(rows, 2, what)?, u128::from(n), what)?, u128::from(k), what)? / u128::from(tensor))
}

fn validated(model: &ModelConfig, parallel: &Parallelism) -> Result<(), ModelError> {
    model.validate()?;
    parallel.validate_for(model)
}

/// The Q, K and V products over `rows` token rows on one GPU: Q `h x h`, K and V `h x g*d` each
/// (the model's FLOPs, divided by `t` even where a group replicates K and V).
fn qkv_flops(model: &ModelConfig, rows: u128, t: u64) -> Result<u128, ModelError> {
    const WHAT: &str = "FLOP count of the Q, K, V products";
    let h = model.hidden;
    let key_value = model.kv_heads.checked_mul(model.head_dim()).ok_or(ModelError::Overflow { what: WHAT })?;
    add(gemm(rows, h, h, t, WHAT)?, mul(gemm(rows, h, key_value, t, WHAT)?, 2, WHAT)?, WHAT)
}

/// One layer's forward FLOPs on one GPU, per operation.
pub fn layer_forward_flops(
    model: &ModelConfig,
    parallel: &Parallelism,
    attention: AttentionFlops,
) -> Result<LayerForwardFlops, CostError> {
    validated(model, parallel)?;
    const WHAT: &str = "FLOP count of one layer";
    let (h, f, t) = (model.hidden, model.ffn_hidden, parallel.tensor);
    // This rank's rows: b s / c ([`ModelConfig::rank_seq_len`]), shared by the t ranks.
    let rows = mul(u128::from(model.micro_batch), u128::from(model.rank_seq_len(parallel)), WHAT)?;
    // Q K^T: for each of b sequences, an s x s product over the h columns of all heads; with
    // context parallelism this rank's s / c queries against all s keys, which with Megatron-LM's
    // balanced chunks (i and 2c-1-i) is exactly 1/c of the causal work too.
    let full_product = mul(mul(rows, u128::from(model.seq_len), WHAT)?, u128::from(h), WHAT)?;
    let product = match attention {
        AttentionFlops::Full => mul(full_product, 2, WHAT)?,
        AttentionFlops::CausalHalved => full_product,
    } / u128::from(t);
    let flops = LayerForwardFlops {
        qkv: qkv_flops(model, rows, t)?,
        attention_scores: product,
        attention_values: product,
        projection: gemm(rows, h, h, t, WHAT)?,
        fc1: mul(gemm(rows, h, f, t, WHAT)?, u128::from(model.architecture.ffn_in_products()), WHAT)?,
        fc2: gemm(rows, f, h, t, WHAT)?,
    };
    // Check once that the sums `total` forms fit.
    let sum = [flops.qkv, flops.projection, flops.fc1, flops.fc2, flops.attention_scores, flops.attention_values]
        .into_iter()
        .try_fold(0u128, |sum, term| add(sum, term, WHAT))?;
    mul(sum, 3, "FLOP count of one layer's forward and backward")?;
    Ok(flops)
}

/// One layer's backward FLOPs on one GPU: twice the forward (the gradients with respect to the
/// inputs and to the weights each cost one forward).
pub fn layer_backward_flops(
    model: &ModelConfig,
    parallel: &Parallelism,
    attention: AttentionFlops,
) -> Result<u128, CostError> {
    // Cannot overflow: layer_forward_flops checked three times the total.
    Ok(layer_forward_flops(model, parallel, attention)?.total() * 2)
}

/// The tokens of each sequence MEMO recomputes at swap fraction `alpha`: `[floor(alpha*s), s)`,
/// so `s - floor(alpha*s)`.
pub fn recomputed_tokens(seq_len: u64, alpha: f64) -> Result<u64, CostError> {
    if !(0.0..=1.0).contains(&alpha) {
        return Err(CostError::BadAlpha { alpha });
    }
    // f64 -> u64 `as` saturates; min() keeps rounding at huge s inside [0, s].
    let swapped = (libm::floor(alpha * seq_len as f64) as u64).min(seq_len);
    Ok(seq_len - swapped)
}

/// The FLOPs of recomputing `recomputed_tokens` tokens of each of the `b` sequences of one layer
/// before its backward, on one GPU: the row-wise ops that rebuild the token-split tensors from the
/// layer input and the attention output (norm, QKV, projection + residual, norm, FC1, the
/// activation).
/// Attention is not recomputed. Counted: the QKV, projection and FC1 GEMMs over those rows.
pub fn recompute_flops(model: &ModelConfig, parallel: &Parallelism, recomputed_tokens: u64) -> Result<u128, CostError> {
    validated(model, parallel)?;
    const WHAT: &str = "FLOP count of the recompute";
    let (h, t) = (model.hidden, parallel.tensor);
    let rows = mul(u128::from(model.micro_batch), u128::from(recomputed_tokens), WHAT)?;
    let qkv = qkv_flops(model, rows, t)?;
    let projection = gemm(rows, h, h, t, WHAT)?;
    let products = u128::from(model.architecture.ffn_in_products());
    let fc1 = mul(gemm(rows, h, model.ffn_hidden, t, WHAT)?, products, WHAT)?;
    Ok(add(add(qkv, projection, WHAT)?, fc1, WHAT)?)
}

/// The classifier's forward FLOPs on one GPU: `2 * b*s * h * V / t` (the logits GEMM; the
/// cross-entropy counts 0). Its backward is twice this.
pub fn classifier_forward_flops(model: &ModelConfig, parallel: &Parallelism) -> Result<u128, CostError> {
    validated(model, parallel)?;
    const WHAT: &str = "FLOP count of the classifier";
    let rows = mul(u128::from(model.micro_batch), u128::from(model.rank_seq_len(parallel)), WHAT)?;
    Ok(gemm(rows, model.hidden, model.vocab, parallel.tensor, WHAT)?)
}

/// The FLOPs of one training step (one micro-batch per data-parallel rank) on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepFlops {
    /// How the attention products were counted.
    pub attention: AttentionFlops,
    /// Model FLOPs: `3 * (n * layer forward + classifier forward)`, recompute excluded. The MFU
    /// numerator.
    pub model_flops: u128,
    /// Recompute FLOPs: `(n - 2) * recompute` (the last two layers never swap, so never recompute).
    pub recompute_flops: u128,
    /// What the GPU executes: model plus recompute FLOPs.
    pub hardware_flops: u128,
}

/// The FLOPs of one training step on one GPU at swap fraction `alpha`.
pub fn step_flops(
    model: &ModelConfig,
    parallel: &Parallelism,
    attention: AttentionFlops,
    alpha: f64,
) -> Result<StepFlops, CostError> {
    const WHAT: &str = "FLOP count of one step";
    let layer = layer_forward_flops(model, parallel, attention)?.total();
    let layers = u128::from(model.layers);
    let forward = add(mul(layer, layers, WHAT)?, classifier_forward_flops(model, parallel)?, WHAT)?;
    let model_flops = mul(forward, 3, WHAT)?;
    let tokens = recomputed_tokens(model.rank_seq_len(parallel), alpha)?;
    let swapped_layers = u128::from(model.layers.saturating_sub(2));
    let recompute = mul(recompute_flops(model, parallel, tokens)?, swapped_layers, WHAT)?;
    Ok(StepFlops {
        attention,
        model_flops,
        recompute_flops: recompute,
        hardware_flops: add(model_flops, recompute, WHAT)?,
    })
}

/// `T_layer`, one layer's forward time on one GPU, in seconds: the hardware's measured value when
/// it has one, else the layer's GEMM FLOPs over the GEMM rate plus its attention FLOPs over the
/// attention forward rate ([`LaunchRates`]: the measured rates where the machine has them,
/// `achieved_flops` otherwise, so `layer forward FLOPs / achieved_flops` without them). Pass
/// [`AttentionFlops::CausalHalved`] for a causal GPT: FlashAttention skips the masked half.
pub fn layer_forward_time_s(
    model: &ModelConfig,
    parallel: &Parallelism,
    hardware: &Hardware,
    attention: AttentionFlops,
) -> Result<f64, CostError> {
    let flops = layer_forward_flops(model, parallel, attention)?;
    let rates = LaunchRates::of(model, parallel, hardware)?;
    Ok(match hardware.measured_layer_forward_s {
        Some(seconds) => seconds,
        None if hardware.measured_rates.is_empty() => flops.total() as f64 / rates.achieved,
        None => flops.gemm() as f64 / rates.gemm + flops.attention() as f64 / rates.attention_forward,
    })
}

/// FLOPs an attention backward executes for a forward of `forward_flops`: FlashAttention's backward
/// runs five `s x s` products (the recomputed scores, `dV`, `dP`, `dQ`, `dK`) against the
/// forward's two, so 5/2 of the forward (the convention of FlashAttention's own benchmarks and of
/// `memo profile`'s `attention_backward_flops`). The model's count, which MFU and the plan's launches
/// use, is 2x the forward (section 5), so a backward launch executes 5/4 of its counted FLOPs.
pub fn attention_backward_executed_flops(forward_flops: f64) -> f64 {
    forward_flops * 2.5
}

/// The FLOP rates the timeline runs launches at (`spec/cost-model.md` section 7), per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaunchRates {
    /// `achieved_flops`, or the rate a measured layer time implies ([`flops_per_s`]): every launch
    /// with FLOPs whose kind has no measured rate.
    pub achieved: f64,
    /// Attention forward launches: the measured `attention_forward_flops`, else `achieved`.
    pub attention_forward: f64,
    /// Attention backward launches, in executed FLOPs ([`attention_backward_executed_flops`]):
    /// the measured `attention_backward_flops`, else `achieved` (then over the counted FLOPs, as
    /// before measured rates: the backward counted at 2x the forward).
    pub attention_backward: Option<f64>,
    /// Matrix-product launches (linear layers, their backward, the classifier): the measured
    /// `gemm_flops`, else `achieved`.
    pub gemm: f64,
}

impl LaunchRates {
    /// The rates of `hardware` for `model` on `parallel` (the model is needed for a measured layer
    /// time's rate). Errors as [`flops_per_s`].
    pub fn of(model: &ModelConfig, parallel: &Parallelism, hardware: &Hardware) -> Result<Self, CostError> {
        let achieved = flops_per_s(model, parallel, hardware)?;
        let measured = &hardware.measured_rates;
        // validate() (in flops_per_s) made every measured rate at least 1.
        let rate = |r: Option<u64>| r.map(|r| r as f64);
        Ok(LaunchRates {
            achieved,
            attention_forward: rate(measured.attention_forward_flops).unwrap_or(achieved),
            attention_backward: rate(measured.attention_backward_flops),
            gemm: rate(measured.gemm_flops).unwrap_or(achieved),
        })
    }

    /// Seconds a launch of `op` counted at `flops` FLOPs (its [`crate::plan::Launch::flops`])
    /// takes: attention forward `flops / attention_forward`; attention backward `(5/4) flops /
    /// attention_backward` with a measured backward rate (the executed FLOPs over it), else `flops
    /// / achieved`; matrix products `flops / gemm`; any other op `flops / achieved` (memory-bound
    /// ops count 0 FLOPs, so 0 s). Collectives are timed by [`collective_time_s`], not here.
    pub fn launch_time_s(&self, op: Op, flops: u64) -> f64 {
        let flops = flops as f64;
        match op {
            Op::Attention => flops / self.attention_forward,
            Op::AttentionBackward => match self.attention_backward {
                Some(rate) => attention_backward_executed_flops(flops / 2.0) / rate,
                None => flops / self.achieved,
            },
            Op::Linear
            | Op::LinearNoBias
            | Op::LinearBackwardInput
            | Op::LinearBackwardInputAccumulate
            | Op::LinearBackwardWeight
            | Op::LinearBackwardWeightNoBias
            | Op::Classifier
            | Op::ClassifierBackwardWeight => flops / self.gemm,
            _ => flops / self.achieved,
        }
    }
}

/// The FLOP rate of one GPU: `achieved_flops`, or, with a measured layer forward time, one
/// layer's forward FLOPs (attention halved for the causal mask) divided by it. A measured time
/// that makes the rate exceed `peak_flops` is an error, never a rate: MFU above 100% of the peak
/// is impossible, and such a time belongs to another layer shape.
pub fn flops_per_s(model: &ModelConfig, parallel: &Parallelism, hardware: &Hardware) -> Result<f64, CostError> {
    hardware.validate()?;
    match hardware.measured_layer_forward_s {
        Some(seconds) => {
            let layer_flops = layer_forward_flops(model, parallel, AttentionFlops::CausalHalved)?.total();
            let rate = layer_flops as f64 / seconds;
            if rate > hardware.peak_flops as f64 {
                return Err(CostError::MeasuredAbovePeak { seconds, layer_flops, peak: hardware.peak_flops });
            }
            Ok(rate)
        }
        // validate() made achieved_flops >= 1 when nothing was measured.
        None => Ok(hardware.achieved_flops as f64),
    }
}

/// Model FLOPs utilisation of one step, under both attention conventions. Always report which.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mfu {
    /// The step time it was computed for, in seconds.
    pub step_time_s: f64,
    /// Model FLOPs per GPU, attention halved for the causal mask.
    pub model_flops_causal_halved: u128,
    /// Model FLOPs per GPU, attention counted in full.
    pub model_flops_full: u128,
    /// MFU with attention FLOPs halved for the causal mask, in `[0, inf)` (above 1 means the step
    /// time is impossibly short).
    pub causal_halved: f64,
    /// MFU with attention FLOPs counted in full.
    pub full: f64,
}

impl fmt::Display for Mfu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MFU {:.1}% ({}), {:.1}% ({})",
            self.causal_halved * 100.0,
            AttentionFlops::CausalHalved.label(),
            self.full * 100.0,
            AttentionFlops::Full.label()
        )
    }
}

/// MFU = model FLOPs per GPU / (`step_time_s` * `peak_flops`), recompute excluded, under both
/// attention conventions.
pub fn mfu(
    model: &ModelConfig,
    parallel: &Parallelism,
    hardware: &Hardware,
    step_time_s: f64,
) -> Result<Mfu, CostError> {
    hardware.validate()?;
    if !(step_time_s.is_finite() && step_time_s > 0.0) {
        return Err(CostError::BadStepTime { seconds: step_time_s });
    }
    // alpha does not change model FLOPs; 1.0 skips the recompute term.
    let causal = step_flops(model, parallel, AttentionFlops::CausalHalved, 1.0)?.model_flops;
    let full = step_flops(model, parallel, AttentionFlops::Full, 1.0)?.model_flops;
    let capacity = step_time_s * hardware.peak_flops as f64;
    Ok(Mfu {
        step_time_s,
        model_flops_causal_halved: causal,
        model_flops_full: full,
        causal_halved: causal as f64 / capacity,
        full: full as f64 / capacity,
    })
}

/// Seconds one collective takes on a ring of `ranks` GPUs (`spec/cost-model.md`, "Collectives"),
/// with `bytes` the bytes of its first argument on one rank (`x`: the all-gather's input, the
/// reduce-scatter's input, the all-reduce's buffer). With `n` one rank's share, `B` the
/// bandwidth per direction and `L` the latency of one step: all-gather and reduce-scatter take
/// `(t-1) (n/B + L)` (`n` is the all-gather's `x`, the reduce-scatter's `x / t`); an all-reduce
/// is a reduce-scatter then an all-gather of `x / t`: `2 (t-1) (n/B + L)`. 0 for `t = 1`, for
/// ops that are not collectives, and without a known bandwidth.
pub fn collective_time_s(op: Op, bytes: u64, ranks: u64, interconnect: &Interconnect) -> f64 {
    if ranks <= 1 || !op.is_collective() || interconnect.bytes_per_s == 0 {
        return 0.0;
    }
    let steps = (ranks - 1) as f64;
    let bandwidth = interconnect.bytes_per_s as f64;
    let latency = interconnect.latency_ns as f64 * 1e-9;
    let (share, passes) = match op {
        Op::AllGather => (bytes as f64, 1.0),
        Op::ReduceScatter => (bytes as f64 / ranks as f64, 1.0),
        _ => (bytes as f64 / ranks as f64, 2.0),
    };
    passes * steps * (share / bandwidth + latency)
}

/// Seconds of one step's data-parallel collectives (`spec/cost-model.md` section 7b), each a
/// ring over the `d` ranks of a data-parallel group on `link` (the node's links, or the slowest
/// of them and the network when the group spans nodes: [`crate::model::Nodes::data_parallel_link`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DataParallelTime {
    /// The gradients' reduction: an all-reduce of the bf16 gradients (ZeRO 0), or their
    /// reduce-scatter (ZeRO 1 and 2).
    pub reduce_gradients_s: f64,
    /// ZeRO 1 and 2: the all-gather of the bf16 parameters each rank updated; 0 for ZeRO 0.
    pub gather_parameters_s: f64,
}

impl DataParallelTime {
    /// Both together.
    pub fn total_s(&self) -> f64 {
        self.reduce_gradients_s + self.gather_parameters_s
    }
}

/// The data-parallel collectives of one step on one GPU holding `gradient_bytes` of bf16
/// gradients and `parameter_bytes` of bf16 parameters (its tensor-parallel shard, whole), over
/// `data` ranks on `link`. Each is priced as one collective of the whole buffer (the buckets a
/// framework issues add a latency each: microseconds against the seconds of the bytes).
pub fn data_parallel_time(
    gradient_bytes: u64,
    parameter_bytes: u64,
    data: u64,
    sharding: OptimizerSharding,
    link: &Interconnect,
) -> DataParallelTime {
    if data <= 1 {
        return DataParallelTime::default();
    }
    if !sharding.shards_optimizer_state() {
        return DataParallelTime {
            reduce_gradients_s: collective_time_s(Op::AllReduceSumBf16, gradient_bytes, data, link),
            gather_parameters_s: 0.0,
        };
    }
    DataParallelTime {
        reduce_gradients_s: collective_time_s(Op::ReduceScatter, gradient_bytes, data, link),
        gather_parameters_s: collective_time_s(Op::AllGather, parameter_bytes.div_ceil(data), data, link),
    }
}

#[cfg(test)]
mod tests;

/// Ring attention of one step on one GPU under `c`-way context parallelism (`spec/cost-model.md`
/// section 7c): what one ring step sends, and the seconds of it the attention does not hide.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ContextParallelTime {
    /// Bytes of K and V one GPU sends per forward ring step: its rank's `b s / c` tokens of the
    /// key/value heads it holds, bf16 (the backward sends these and dK, dV: twice).
    pub kv_bytes: u64,
    /// Seconds of one forward ring step's transfer: `kv_bytes / B + L`.
    pub forward_transfer_s: f64,
    /// Seconds of one backward ring step's transfer: `2 kv_bytes / B + L`.
    pub backward_transfer_s: f64,
    /// Seconds of one layer's attention forward per ring step (its launch over `c`): what hides
    /// a forward transfer.
    pub forward_chunk_s: f64,
    /// Likewise for the attention backward.
    pub backward_chunk_s: f64,
    /// The step's exposed forward seconds: `launches (c - 1) max(0, transfer - chunk)`, over the
    /// plan's attention forward launches (`n`, and again each layer full recompute reruns).
    pub forward_exposed_s: f64,
    /// The step's exposed backward seconds.
    pub backward_exposed_s: f64,
}

impl ContextParallelTime {
    /// Both directions' exposed seconds.
    pub fn exposed_s(&self) -> f64 {
        self.forward_exposed_s + self.backward_exposed_s
    }
}

/// Bytes of K and V (together) that one GPU holds for its rank's tokens and passes on at each
/// ring step: `2 * b * (s / c) * k_gpu * 2`, with `k_gpu` the key/value width on one GPU of a
/// group of `t` (`kv_heads / t` heads, or all of them when `t > kv_heads` replicates them).
pub fn ring_kv_bytes(model: &ModelConfig, parallel: &Parallelism) -> Result<u64, CostError> {
    validated(model, parallel)?;
    let overflow = ModelError::Overflow { what: "ring attention K/V bytes" };
    let width = model.kv_heads_on_gpu(parallel.tensor).checked_mul(model.head_dim()).ok_or(overflow.clone())?;
    let bytes = model
        .micro_batch
        .checked_mul(model.rank_seq_len(parallel))
        .and_then(|rows| rows.checked_mul(width))
        .and_then(|elements| elements.checked_mul(2 * crate::model::BF16_BYTES))
        .ok_or(overflow)?;
    Ok(bytes)
}

/// The ring attention of one step of `model` on `parallel` (`c = parallel.context` ranks) on
/// `hardware`, its K/V passed over `link` (the node's links, or across nodes the slowest of them
/// and the network: [`crate::model::Nodes::context_parallel_link`]). Each of the plan's
/// `forward_launches` attention launches (one per layer, and one more per layer that full
/// recompute reruns) runs `c - 1` ring steps, and each of its `backward_launches` `c - 1` more;
/// each step's transfer overlaps the attention of the chunk in hand, one `c`-th of the launch, and
/// only what is longer than that is exposed. All zero for `c = 1`.
pub fn context_parallel_time(
    model: &ModelConfig,
    parallel: &Parallelism,
    hardware: &Hardware,
    link: &Interconnect,
    forward_launches: u64,
    backward_launches: u64,
) -> Result<ContextParallelTime, CostError> {
    let c = parallel.context;
    if c <= 1 {
        validated(model, parallel)?;
        return Ok(ContextParallelTime::default());
    }
    let kv_bytes = ring_kv_bytes(model, parallel)?;
    let rates = LaunchRates::of(model, parallel, hardware)?;
    let attention = layer_forward_flops(model, parallel, AttentionFlops::CausalHalved)?.attention();
    let attention = u64::try_from(attention).map_err(|_| ModelError::Overflow { what: "attention FLOPs" })?;
    let steps = (c - 1) as f64;
    let forward_chunk_s = rates.launch_time_s(Op::Attention, attention) / c as f64;
    let backward_chunk_s = rates.launch_time_s(Op::AttentionBackward, attention.saturating_mul(2)) / c as f64;
    // No bandwidth known: validation refuses that across nodes, and a node's links are needed
    // for t > 1 only; a ring inside a node without a known link is timed as free, as a
    // collective without one is ([`collective_time_s`]).
    let transfer = |bytes: u64| {
        if link.bytes_per_s == 0 {
            0.0
        } else {
            bytes as f64 / link.bytes_per_s as f64 + link.latency_ns as f64 * 1e-9
        }
    };
    let forward_transfer_s = transfer(kv_bytes);
    let backward_transfer_s = transfer(kv_bytes.saturating_mul(2));
    let (forward_launches, backward_launches) = (forward_launches as f64, backward_launches as f64);
    Ok(ContextParallelTime {
        kv_bytes,
        forward_transfer_s,
        backward_transfer_s,
        forward_chunk_s,
        backward_chunk_s,
        forward_exposed_s: forward_launches * steps * (forward_transfer_s - forward_chunk_s).max(0.0),
        backward_exposed_s: backward_launches * steps * (backward_transfer_s - backward_chunk_s).max(0.0),
    })
}
