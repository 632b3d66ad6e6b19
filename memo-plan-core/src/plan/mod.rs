//! The plan: one training step of one GPU as a program (`ARCHITECTURE.md` "The data path";
//! the byte format is `spec/plan-format.md`).
//!
//! A plan holds
//! - [`Buffer`]s: every tensor the step touches, each with its rows, bytes per row, what it is
//!   ([`BufferKind`], [`TensorRole`], layer) and its place: an offset in the ONE device arena or
//!   in the pinned host slab;
//! - [`Instruction`]s, each on one of three [`Stream`]s: [`Action::Launch`] of an [`Op`] over
//!   (buffer, row range) arguments, [`Action::Copy`] of a row range between buffers (host <->
//!   device), [`Action::Record`] and [`Action::Wait`] of events;
//! - [`Totals`]: arena and host bytes and the lower bounds they are measured against;
//! - [`Provenance`]: the model, layout, machine, strategy, α and why, and the solver's statistics.
//!
//! Semantics the planner, the checker and every runtime share:
//! - Instructions are issued in list order. Each stream runs its own instructions in that order,
//!   one at a time. `Record(e)` on stream S completes when every earlier instruction of S has;
//!   `Wait(e)` on stream T holds T's later instructions until `e` completes. Each event is
//!   recorded exactly once, before (in list order) any wait on it.
//! - Buffers of kind [`BufferKind::Input`], [`BufferKind::Parameter`] and
//!   [`BufferKind::OptimizerState`] hold data before the step starts (the runtime writes them);
//!   every other byte holds nothing until an instruction writes it.
//! - A buffer is *live* from the first instruction that touches it to the last (list order).
//!   Device buffers whose live ranges meet must not share arena bytes.
//! - An argument's row range `[start, end)` selects bytes `[start * row_bytes, end * row_bytes)`
//!   of its buffer.
//! - A copy names the rows it moves ([`TensorRows`]: layer, tensor, rows); its host slot must
//!   hold exactly those ([`Buffer::holds`]) and its device side must be that tensor at those
//!   rows. A rounding buffer holds layer `l`'s and layer `l + 2`'s data in turn under the same
//!   buffer ids, so without the name a swap-in of the wrong layer's slot would look well ordered.
//!
//! The plan format is independent of how plans are made: `check::plan` verifies one without
//! trusting the planner.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::model::{Hardware, Interconnect, ModelConfig, Parallelism};
use crate::swap::AlphaBound;

pub mod decode;
pub mod encode;
pub mod json;
pub mod scratch;
pub mod shapes;

pub use decode::PlanDecodeError;

/// The version written into, and required of, encoded plans (`spec/plan-format.md`).
/// Version 2 added swap identities: [`Buffer::first_row`] and [`Action::Copy`]'s `tensor`.
/// Version 3 added tensor parallelism that runs: the collective stream, the all-reduces and the
/// split row-parallel and vocabulary-parallel ops, the interconnect in the provenance, and
/// per-rank programs ([`Plan::rank_programs`]).
/// Version 4 added the model's architecture (key/value heads, FFN and norm kinds, biases, tying,
/// the rotary base and rescaling, the norm's epsilon) and the ops of the Llama family's layer.
/// Version 5 added launch scratch: a launch may carry one argument past its signature, a whole
/// [`TensorRole::Scratch`] transient it writes ([`Launch::scratch`]).
/// Version 6 added context parallelism (`spec/context-parallel.md`): the context-parallel degree
/// `c` in the provenance, ops 34-45 (rotary, the ring attention's blocks, `to_bf16`,
/// `ring_exchange`, the data-group all-reduces), roles 65-70 (the ring's transients), and rank
/// programs keyed by global rank `context_rank * t + tensor_rank` ([`Plan::program`]).
pub const PLAN_FORMAT_VERSION: u16 = 6;

/// Index of a buffer in [`Plan::buffers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BufferId(pub u32);

/// An event, `0..Plan::events`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EventId(pub u32);

impl BufferId {
    /// The index into [`Plan::buffers`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The four streams of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Stream {
    /// Kernels.
    Compute,
    /// Device-to-host copies (swap-out).
    DeviceToHost,
    /// Host-to-device copies (swap-in).
    HostToDevice,
    /// The collectives of the tensor-parallel group ([`Op::is_collective`]), in the same order
    /// on every rank (`spec/tensor-parallel.md`). Plans with `t = 1` have none.
    Collective,
}

/// How many streams a device has: [`Stream::ALL`]'s length.
pub const STREAMS: usize = 4;

impl Stream {
    /// All streams, in index order.
    pub const ALL: [Stream; STREAMS] =
        [Stream::Compute, Stream::DeviceToHost, Stream::HostToDevice, Stream::Collective];

    /// 0, 1, 2, 3: the stream's index (and its code in the byte format).
    pub fn index(self) -> usize {
        match self {
            Stream::Compute => 0,
            Stream::DeviceToHost => 1,
            Stream::HostToDevice => 2,
            Stream::Collective => 3,
        }
    }

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Compute => "compute",
            Stream::DeviceToHost => "d2h",
            Stream::HostToDevice => "h2d",
            Stream::Collective => "collective",
        }
    }
}

/// What a buffer is for; decides its initial state and how pictures colour it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BufferKind {
    /// Data the runtime writes before the step: token ids and targets (u32 per row).
    Input,
    /// A bf16 parameter; holds data before the step.
    Parameter,
    /// A parameter's bf16 gradient; written during the step.
    Gradient,
    /// fp32 master weights and the AdamW moments of one parameter; holds data before the step.
    OptimizerState,
    /// A skeletal tensor in one of the two rounding buffers shared by alternating layers.
    RoundingBuffer,
    /// A skeletal tensor kept on the device by its own layer from forward to backward.
    Skeletal,
    /// Made and freed inside one layer's forward or backward (level-1 placement), or inside the
    /// embedding, classifier or optimizer.
    Transient,
    /// Passed between layers or phases: the gradient of a layer's output, the final hidden state.
    CrossLayer,
    /// A region of the pinned host slab holding one swapped tensor (or its swapped rows).
    HostSlot,
    /// A few fp32 accumulators (the loss, the squared gradient norm).
    Scalar,
}

impl BufferKind {
    /// Every kind, in code order.
    pub const ALL: [BufferKind; 10] = [
        BufferKind::Input,
        BufferKind::Parameter,
        BufferKind::Gradient,
        BufferKind::OptimizerState,
        BufferKind::RoundingBuffer,
        BufferKind::Skeletal,
        BufferKind::Transient,
        BufferKind::CrossLayer,
        BufferKind::HostSlot,
        BufferKind::Scalar,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            BufferKind::Input => "input",
            BufferKind::Parameter => "parameter",
            BufferKind::Gradient => "gradient",
            BufferKind::OptimizerState => "optimizer_state",
            BufferKind::RoundingBuffer => "rounding_buffer",
            BufferKind::Skeletal => "skeletal",
            BufferKind::Transient => "transient",
            BufferKind::CrossLayer => "cross_layer",
            BufferKind::HostSlot => "host_slot",
            BufferKind::Scalar => "scalar",
        }
    }

    /// Whether the buffer holds data before the first instruction (the runtime fills it).
    pub fn initialised_before_step(self) -> bool {
        matches!(self, BufferKind::Input | BufferKind::Parameter | BufferKind::OptimizerState)
    }
}

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "defmt", derive(defmt::Format))]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every value, in code order (the byte format stores the index).
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The name reports, plans' JSON and `spec/plan-format.md` use.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)*
                }
            }

            /// The code in the byte format: the index in [`Self::ALL`].
            pub fn code(self) -> u16 {
                self as u16
            }

            /// The value with byte-format code `code`, if any.
            pub fn from_code(code: u16) -> Option<Self> {
                Self::ALL.get(usize::from(code)).copied()
            }
        }
    };
}

named_enum! {
    /// What tensor a buffer holds, in the model's terms. With [`Buffer::layer`] it names the
    /// tensor in errors and tells a runtime how to initialise parameters.
    TensorRole {
        /// Token ids of the local rows (u32).
        Tokens => "tokens",
        /// Next-token targets of the local rows (u32).
        Targets => "targets",
        /// Word embedding, tied to the classifier (`V x h`, rows sharded by `t`).
        Embedding => "embedding",
        /// A layer norm's scale.
        NormScale1 => "norm1_scale",
        /// A layer norm's shift.
        NormShift1 => "norm1_shift",
        /// Query projection weight.
        QueryWeight => "wq",
        /// Query projection bias.
        QueryBias => "bq",
        /// Key projection weight.
        KeyWeight => "wk",
        /// Key projection bias.
        KeyBias => "bk",
        /// Value projection weight.
        ValueWeight => "wv",
        /// Value projection bias.
        ValueBias => "bv",
        /// Attention output projection weight.
        ProjectionWeight => "wo",
        /// Attention output projection bias.
        ProjectionBias => "bo",
        /// The second layer norm's scale.
        NormScale2 => "norm2_scale",
        /// The second layer norm's shift.
        NormShift2 => "norm2_shift",
        /// FC1 weight (SwiGLU: the gate's rows, then the up projection's, of this rank's shard).
        Fc1Weight => "w1",
        /// FC1 bias.
        Fc1Bias => "b1",
        /// FC2 weight (SwiGLU: the down projection).
        Fc2Weight => "w2",
        /// FC2 bias.
        Fc2Bias => "b2",
        /// The final layer norm's scale.
        FinalNormScale => "final_norm_scale",
        /// The final layer norm's shift.
        FinalNormShift => "final_norm_shift",
        /// Skeletal: the layer input.
        LayerInput => "layer_input",
        /// Skeletal: the first norm's output.
        InputNormOutput => "input_norm_out",
        /// Skeletal: queries.
        Query => "q",
        /// Skeletal: keys.
        Key => "k",
        /// Skeletal: values.
        Value => "v",
        /// Skeletal: attention output.
        AttentionOutput => "attention_out",
        /// Skeletal: attention log-sum-exp (fp32).
        AttentionLogSumExp => "attention_lse",
        /// Skeletal: hidden state after attention and its residual add.
        AttentionResidual => "attention_residual",
        /// Skeletal: the second norm's output.
        PostAttentionNormOutput => "post_attention_norm_out",
        /// Skeletal: FC1 output (SwiGLU: `[gate | up]` per row).
        Fc1Output => "fc1_out",
        /// Skeletal: the FFN activation's output (GeLU's, or SwiGLU's `silu(gate) * up`); the
        /// name keeps the byte format's first role of this kind.
        GeluOutput => "gelu_out",
        /// Transient: a sequence-parallel all-gather of a norm output (t > 1).
        GatheredNormOutput => "gathered_norm_out",
        /// Transient: the projection's output before the residual add.
        ProjectionOutput => "projection_out",
        /// Transient: FC2's output before the residual add.
        Fc2Output => "fc2_out",
        /// Transient: a partial sum before a sequence-parallel reduce-scatter (t > 1).
        PartialSum => "partial_sum",
        /// Cross-layer: a layer's output (the last layer's: the final hidden state).
        LayerOutput => "layer_output",
        /// The final norm's output.
        FinalNormOutput => "final_norm_out",
        /// Transient: one chunk of logits (then, in place, their gradient).
        LogitsChunk => "logits_chunk",
        /// Scalar: the summed loss.
        Loss => "loss",
        /// Scalar: the squared gradient norm.
        GradNormSquared => "grad_norm_squared",
        /// Gradient of a layer's output (cross-layer) or of a tensor inside a layer (transient).
        OutputGradient => "d_layer_output",
        /// Transient gradient of the first norm's output.
        InputNormOutputGradient => "d_input_norm_out",
        /// Transient gradient of the queries.
        QueryGradient => "dq",
        /// Transient gradient of the keys.
        KeyGradient => "dk",
        /// Transient gradient of the values.
        ValueGradient => "dv",
        /// Transient gradient of the attention output.
        AttentionOutputGradient => "d_attention_out",
        /// Transient gradient of the hidden state after attention.
        AttentionResidualGradient => "d_attention_residual",
        /// Transient gradient of the second norm's output.
        PostAttentionNormOutputGradient => "d_post_attention_norm_out",
        /// Transient gradient of FC1's output.
        Fc1OutputGradient => "d_fc1_out",
        /// Transient gradient of GeLU's output.
        GeluOutputGradient => "d_gelu_out",
        /// Transient: a norm backward's input gradient before the residual add.
        NormInputGradient => "d_norm_input",
        /// Gradient of the final norm's output.
        FinalNormOutputGradient => "d_final_norm_out",
        /// Gradient of the embedding output (the first layer's input).
        EmbeddingOutputGradient => "d_embedding_out",
        /// A transient over the recomputed rows only (the projection output in the recompute).
        RecomputedProjectionOutput => "recomputed_projection_out",
        /// Transient (t > 1): the embedding table all-gathered from every rank's shard
        /// (`t * ceil(V/t)` rows, rank-major).
        GatheredEmbedding => "gathered_embedding",
        /// Transient (t > 1): the lookup's gradient over the gathered table, before its
        /// reduce-scatter to the vocabulary shards.
        GatheredEmbeddingGradient => "d_gathered_embedding",
        /// Transient (t > 1): a share of the embedding shard's gradient (the classifier's, or the
        /// reduce-scattered lookup's) before the two are added into the gradient.
        EmbeddingGradientPart => "d_embedding_part",
        /// Transient (t > 1): the targets of a chunk's gathered rows (u32, all-gathered).
        GatheredTargets => "gathered_targets",
        /// Transient (t > 1): per row of a logits chunk, the f32 maximum over the vocabulary.
        LogitsMax => "logits_max",
        /// Transient (t > 1): per row of a logits chunk, two f32: the sum of `exp(logit - max)`
        /// and the target's logit.
        LogitsSums => "logits_sums",
        /// Gradient (t > 1): every layer-norm scale's and shift's gradient back to back (per layer
        /// norm 1 scale, shift, norm 2 scale, shift; then the final norm's), one all-reduce.
        ReplicatedGradients => "replicated_gradients",
        /// The classifier of a model whose classifier is not tied to the embedding (`V x h`,
        /// rows sharded by `t` like the embedding's).
        ClassifierWeight => "classifier",
        /// Gradient (t > kv_heads): the replicated K and V biases' gradients back to back, one
        /// all-reduce (the weights' are rows of [`TensorRole::ReplicatedGradients`]).
        ReplicatedBiasGradients => "replicated_bias_gradients",
        /// Transient: one launch's scratch, the bytes its kernels need besides its arguments (its
        /// trailing argument, [`Launch::scratch`]; one row of the bytes a
        /// [`scratch::ScratchSizer`] asked for). Live only during that launch.
        Scratch => "scratch",
        /// Transient (c > 1): the ring attention's f32 output accumulator, one row per query row
        /// (`attention_ring_init`, `attention_block*`, `attention_ring_finish`).
        AttentionOutputAccumulator => "attention_out_acc",
        /// Transient (c > 1): one of the two ring buffers of keys another context rank sent
        /// ([`Buffer::slot`] 0 or 1; rows and width of `k`).
        RingKey => "ring_k",
        /// Transient (c > 1): one of the two ring buffers of values ([`Buffer::slot`] 0 or 1).
        RingValue => "ring_v",
        /// Transient (c > 1): the f32 accumulator of the queries' gradient over the ring backward.
        QueryGradientAccumulator => "dq_acc",
        /// Transient (c > 1): one of the two f32 accumulators of a K chunk's gradient, which
        /// travel the ring with their K/V ([`Buffer::slot`] 0 or 1).
        KeyGradientAccumulator => "dk_acc",
        /// Transient (c > 1): one of the two f32 accumulators of a V chunk's gradient
        /// ([`Buffer::slot`] 0 or 1).
        ValueGradientAccumulator => "dv_acc",
    }
}

named_enum! {
    /// A kernel. Each takes a fixed list of arguments ([`Op::signature`]); `spec/plan-format.md`
    /// gives the arithmetic. Row ranges let one launch work on some tokens only (the recompute
    /// of tokens `[alpha*s, s)`, the classifier's chunks).
    Op {
        /// `out = embedding[tokens]`.
        Embedding => "embedding",
        /// `y = layer_norm(x) * scale + shift`.
        LayerNorm => "layer_norm",
        /// `y = x W^T + bias`.
        Linear => "linear",
        /// Causal FlashAttention with rotary positions: `out, lse = attention(q, k, v)`. With fewer
        /// key/value heads than query heads (grouped-query attention) each K/V head serves a group
        /// of query heads ([`shapes::AttentionShape::kv_head`]).
        Attention => "attention",
        /// `y = gelu(x)` (tanh approximation).
        Gelu => "gelu",
        /// `y = a + b`.
        Add => "add",
        /// Sequence-parallel all-gather over the `t` GPUs of a tensor-parallel group.
        AllGather => "all_gather",
        /// Sequence-parallel reduce-scatter over the `t` GPUs.
        ReduceScatter => "reduce_scatter",
        /// `dx = dy W`.
        LinearBackwardInput => "linear_backward_input",
        /// `dx += dy W`.
        LinearBackwardInputAccumulate => "linear_backward_input_accumulate",
        /// `dW = dy^T x`, `dbias = sum over rows of dy`.
        LinearBackwardWeight => "linear_backward_weight",
        /// `dx = dy * gelu'(x)`.
        GeluBackward => "gelu_backward",
        /// The layer norm's backward: `dx`, `dscale`, `dshift` (statistics recomputed from x).
        LayerNormBackward => "layer_norm_backward",
        /// FlashAttention's backward: `dq, dk, dv` from `q, k, v, out, lse, dout`.
        AttentionBackward => "attention_backward",
        /// `logits = x embedding^T` over a chunk of rows.
        Classifier => "classifier",
        /// Cross-entropy of a logits chunk against its targets: adds the chunk's summed loss to
        /// `loss` and replaces the logits by their gradient (scaled by 1 / tokens of the step).
        CrossEntropy => "cross_entropy",
        /// `dembedding += dlogits^T x` over a chunk.
        ClassifierBackwardWeight => "classifier_backward_weight",
        /// `dembedding[tokens] += dout` (scatter-add).
        EmbeddingBackward => "embedding_backward",
        /// Sets a buffer to zero.
        Zero => "zero",
        /// `sum_squares += sum of grad^2` (fp32).
        GradNormSquared => "grad_norm_squared",
        /// AdamW on fp32 master weights with global-norm gradient clipping; writes the bf16
        /// parameter back.
        AdamW => "adamw",
        /// In place over the tensor-parallel group: `x = sum over ranks of x` (bf16 elements,
        /// summed in f32 in rank order, rounded once).
        AllReduceSumBf16 => "all_reduce_sum_bf16",
        /// In place over the group: `x = sum over ranks of x` (f32, summed in rank order).
        AllReduceSumF32 => "all_reduce_sum_f32",
        /// In place over the group: `x = maximum over ranks of x` (f32).
        AllReduceMaxF32 => "all_reduce_max_f32",
        /// `y = x W^T` without a bias: a row-parallel product's partial sum.
        LinearNoBias => "linear_no_bias",
        /// `y += bias` on every row (bf16, added in f32 and rounded once).
        AddBias => "add_bias",
        /// Per row of a vocabulary-parallel logits chunk: the f32 maximum over this rank's
        /// columns below the vocabulary.
        CrossEntropyMax => "cross_entropy_max",
        /// Per row: `sums = [sum of exp(logit - max) over this rank's columns below the
        /// vocabulary, the target's logit if this rank holds its column, else 0]` (f32).
        CrossEntropySums => "cross_entropy_sums",
        /// Adds the rows' loss from the combined max and sums to `loss` and replaces this rank's
        /// logits by their gradient (scaled by 1 / tokens of the step).
        CrossEntropyFinish => "cross_entropy_finish",
        /// `y = x / sqrt(mean(x^2) + eps) * scale` (RMSNorm; `eps` is the context's).
        RmsNorm => "rms_norm",
        /// RMSNorm's backward: `dx` and `dscale` (the statistic recomputed from x).
        RmsNormBackward => "rms_norm_backward",
        /// SwiGLU's gate: `x` rows of `[gate | up]` (`2w` elements), `y = silu(gate) * up` (`w`).
        Swiglu => "swiglu",
        /// SwiGLU's backward: `dx = [dgate | dup]` from `x = [gate | up]` and `dy`.
        SwigluBackward => "swiglu_backward",
        /// `dW = dy^T x` of a linear layer without a bias.
        LinearBackwardWeightNoBias => "linear_backward_weight_no_bias",
        /// In place: rotates each head's pairs `(2i, 2i+1)` of every row by the row's position
        /// ([`shapes::ShapeContext::position`]), as `attention` does inside (c > 1: the ring
        /// carries rotated keys; `spec/context-parallel.md`).
        Rotary => "rotary",
        /// In place: the inverse rotation of the same positions (the gradient of the un-rotated
        /// input).
        RotaryBackward => "rotary_backward",
        /// One block of ring attention without a mask: every `q` row attends every `k` row (both
        /// rotated); merges the block's output and log-sum-exp into `out_acc` and `lse`.
        AttentionBlock => "attention_block",
        /// As `attention_block` with a diagonal block's causal mask (equal rows of `q` and `k`).
        AttentionBlockCausal => "attention_block_causal",
        /// `out_acc = 0`, `lse = -inf`: an empty accumulator.
        AttentionRingInit => "attention_ring_init",
        /// `out = bf16(out_acc)`.
        AttentionRingFinish => "attention_ring_finish",
        /// One block's backward without a mask: adds to the f32 `dq_acc`, `dk_acc`, `dv_acc`.
        AttentionBlockBackward => "attention_block_backward",
        /// As `attention_block_backward` with the diagonal block's causal mask.
        AttentionBlockBackwardCausal => "attention_block_backward_causal",
        /// `y = bf16(x)` (f32 in, round to nearest even).
        ToBf16 => "to_bf16",
        /// Context-parallel ring (collective stream): sends `x` to context rank `k + 1 mod c`,
        /// receives `y` from `k - 1 mod c` (same tensor-parallel rank).
        RingExchange => "ring_exchange",
        /// In place over the data group (every rank with this tensor-parallel rank: `d x c`):
        /// `x = sum over ranks of x` (bf16, f32 in rank order, rounded once).
        DataAllReduceSumBf16 => "data_all_reduce_sum_bf16",
        /// As `data_all_reduce_sum_bf16`, f32.
        DataAllReduceSumF32 => "data_all_reduce_sum_f32",
    }
}

/// The group a collective runs over (`spec/validity.md`, rule 9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CollectiveGroup {
    /// The `t` ranks of a tensor-parallel group ([`Op::is_collective`]).
    Tensor,
    /// The ranks with the same tensor-parallel rank (`d x c` of them): the gradients' and the
    /// loss's sums.
    Data,
    /// The context-parallel ring: a send to the next context rank and a receive from the
    /// previous one (`ring_exchange`).
    Ring,
}

impl Op {
    /// Whether the op is a collective of the tensor-parallel group: it runs on
    /// [`Stream::Collective`], every rank issues it in the same order with the same sizes
    /// (`spec/validity.md`, rule 9), and a single-device backend refuses it.
    pub fn is_collective(self) -> bool {
        matches!(
            self,
            Op::AllGather | Op::ReduceScatter | Op::AllReduceSumBf16 | Op::AllReduceSumF32 | Op::AllReduceMaxF32
        )
    }

    /// The group of a collective (any op on [`Stream::Collective`]), `None` for the others.
    /// [`Op::is_collective`] is [`CollectiveGroup::Tensor`] only: a backend that runs `t > 1`
    /// plans need not run the context-parallel ring or the data group's sums.
    pub fn collective_group(self) -> Option<CollectiveGroup> {
        match self {
            _ if self.is_collective() => Some(CollectiveGroup::Tensor),
            Op::DataAllReduceSumBf16 | Op::DataAllReduceSumF32 => Some(CollectiveGroup::Data),
            Op::RingExchange => Some(CollectiveGroup::Ring),
            _ => None,
        }
    }

    /// Whether the op is one of context parallelism's (ops 34-45): a backend without the ring
    /// refuses these by name.
    pub fn is_context_parallel(self) -> bool {
        self.code() >= Op::Rotary.code()
    }

    /// The stream a launch of the op runs on: [`Stream::Collective`] for the collectives of
    /// every group, [`Stream::Compute`] for the rest.
    pub fn stream(self) -> Stream {
        if self.collective_group().is_some() {
            Stream::Collective
        } else {
            Stream::Compute
        }
    }
}

/// How a launch uses one argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Access {
    /// Reads the rows.
    Read,
    /// Overwrites the rows without reading them.
    Write,
    /// Reads then writes the rows (accumulate, in place).
    ReadWrite,
}

impl Access {
    /// Whether the op reads the argument's previous contents.
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// Whether the op changes the argument.
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::ReadWrite => "read_write",
        }
    }
}

impl Op {
    /// The op's arguments in order: what each is, and how the op accesses it. A launch of this
    /// op has exactly these arguments; [`shapes::check`] holds the rules for their shapes.
    pub fn signature(self) -> &'static [(&'static str, Access)] {
        use Access::{Read as R, ReadWrite as RW, Write as W};
        match self {
            Op::Embedding => &[("tokens", R), ("embedding", R), ("out", W)],
            Op::LayerNorm => &[("x", R), ("scale", R), ("shift", R), ("y", W)],
            Op::Linear => &[("x", R), ("weight", R), ("bias", R), ("y", W)],
            Op::Attention => &[("q", R), ("k", R), ("v", R), ("out", W), ("lse", W)],
            Op::Gelu => &[("x", R), ("y", W)],
            Op::Add => &[("a", R), ("b", R), ("y", W)],
            Op::AllGather | Op::ReduceScatter => &[("x", R), ("y", W)],
            Op::LinearBackwardInput => &[("dy", R), ("weight", R), ("dx", W)],
            Op::LinearBackwardInputAccumulate => &[("dy", R), ("weight", R), ("dx", RW)],
            Op::LinearBackwardWeight => &[("x", R), ("dy", R), ("dweight", W), ("dbias", W)],
            Op::GeluBackward => &[("x", R), ("dy", R), ("dx", W)],
            Op::LayerNormBackward => &[("x", R), ("scale", R), ("dy", R), ("dx", W), ("dscale", W), ("dshift", W)],
            Op::AttentionBackward => {
                &[("q", R), ("k", R), ("v", R), ("out", R), ("lse", R), ("dout", R), ("dq", W), ("dk", W), ("dv", W)]
            }
            Op::Classifier => &[("x", R), ("embedding", R), ("logits", W)],
            Op::CrossEntropy => &[("logits", RW), ("targets", R), ("loss", RW)],
            Op::ClassifierBackwardWeight => &[("x", R), ("dlogits", R), ("dembedding", RW)],
            Op::EmbeddingBackward => &[("tokens", R), ("dout", R), ("dembedding", RW)],
            Op::Zero => &[("buffer", W)],
            Op::GradNormSquared => &[("grad", R), ("sum_squares", RW)],
            Op::AdamW => &[("parameter", RW), ("grad", R), ("optimizer_state", RW), ("grad_norm_squared", R)],
            Op::AllReduceSumBf16 | Op::AllReduceSumF32 | Op::AllReduceMaxF32 => &[("x", RW)],
            Op::LinearNoBias => &[("x", R), ("weight", R), ("y", W)],
            Op::AddBias => &[("bias", R), ("y", RW)],
            Op::CrossEntropyMax => &[("logits", R), ("max", W)],
            Op::CrossEntropySums => &[("logits", R), ("targets", R), ("max", R), ("sums", W)],
            Op::CrossEntropyFinish => &[("logits", RW), ("targets", R), ("max", R), ("sums", R), ("loss", RW)],
            Op::RmsNorm => &[("x", R), ("scale", R), ("y", W)],
            Op::RmsNormBackward => &[("x", R), ("scale", R), ("dy", R), ("dx", W), ("dscale", W)],
            Op::Swiglu => &[("x", R), ("y", W)],
            Op::SwigluBackward => &[("x", R), ("dy", R), ("dx", W)],
            Op::LinearBackwardWeightNoBias => &[("x", R), ("dy", R), ("dweight", W)],
            Op::Rotary => &[("x", RW)],
            Op::RotaryBackward => &[("dx", RW)],
            Op::AttentionBlock | Op::AttentionBlockCausal => {
                &[("q", R), ("k", R), ("v", R), ("out_acc", RW), ("lse", RW)]
            }
            Op::AttentionRingInit => &[("out_acc", W), ("lse", W)],
            Op::AttentionRingFinish => &[("out_acc", R), ("out", W)],
            Op::AttentionBlockBackward | Op::AttentionBlockBackwardCausal => &[
                ("q", R),
                ("k", R),
                ("v", R),
                ("out", R),
                ("lse", R),
                ("dout", R),
                ("dq_acc", RW),
                ("dk_acc", RW),
                ("dv_acc", RW),
            ],
            Op::ToBf16 => &[("x", R), ("y", W)],
            Op::RingExchange => &[("x", R), ("y", W)],
            Op::DataAllReduceSumBf16 | Op::DataAllReduceSumF32 => &[("x", RW)],
        }
    }
}

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Place {
    /// At this byte offset in the device arena.
    Device {
        /// Bytes from the arena's start.
        offset: u64,
    },
    /// At this byte offset in the pinned host slab.
    Host {
        /// Bytes from the slab's start.
        offset: u64,
    },
}

/// One tensor of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Buffer {
    /// What it is for.
    pub kind: BufferKind,
    /// What tensor it holds.
    pub role: TensorRole,
    /// The layer it belongs to; `None` for the embedding, classifier, optimizer and the rounding
    /// buffers (shared by layers; [`Buffer::slot`] names which).
    pub layer: Option<u32>,
    /// For rounding buffers: 0 or 1. For host slots and per-layer tensors: 0.
    pub slot: u8,
    /// Rows (tokens for activations, output features for weights, 1 for scalars).
    pub rows: u64,
    /// The row of its tensor that its row 0 holds: a host slot of layer `l` holds rows
    /// `[first_row, first_row + rows)` of layer `l`'s tensor `role` (its identity,
    /// [`Buffer::holds`]), which the checker holds every copy to. The planner writes 0 but for
    /// the host slots of head-sharded token-split tensors at `t > 1`, one per rank segment `k`,
    /// which hold rows `[k*r, k*r + a)`.
    pub first_row: u64,
    /// Bytes of one row.
    pub row_bytes: u64,
    /// Its place in the arena or the host slab.
    pub place: Place,
}

impl Buffer {
    /// `rows * row_bytes`, or `None` when that overflows.
    pub fn bytes(&self) -> Option<u64> {
        self.rows.checked_mul(self.row_bytes)
    }

    /// Which rows of which layer's tensor the buffer holds: `[first_row, first_row + rows)` of
    /// `role` of `layer`. `None` for a buffer without a layer (rounding buffers are shared by
    /// alternating layers, so a copy into one names the layer itself) or whose last row does not
    /// fit in 64 bits.
    pub fn holds(&self) -> Option<TensorRows> {
        let end = self.first_row.checked_add(self.rows)?;
        Some(TensorRows { layer: self.layer?, role: self.role, start: self.first_row, end })
    }
}

/// Rows `[start, end)` of tensor `role` of layer `layer`: what a swap copy moves, and what a host
/// slot holds. The checker holds every copy's to both of its sides (`spec/validity.md`, rule 8),
/// so a swap-in cannot restore another layer's or another tensor's rows, or other rows, unseen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TensorRows {
    /// The layer whose tensor it is.
    pub layer: u32,
    /// The tensor.
    pub role: TensorRole,
    /// First row of the tensor.
    pub start: u64,
    /// One past the last row.
    pub end: u64,
}

impl fmt::Display for TensorRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "layer {} {} rows [{}, {})", self.layer, self.role.name(), self.start, self.end)
    }
}

impl fmt::Display for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.layer) {
            (BufferKind::RoundingBuffer, _) => write!(f, "rounding buffer {} {}", self.slot, self.role.name()),
            (_, Some(layer)) => write!(f, "layer {layer} {} ({})", self.role.name(), self.kind.name()),
            (_, None) => write!(f, "{} ({})", self.role.name(), self.kind.name()),
        }
    }
}

/// Rows `[start, end)` of one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Region {
    /// The buffer.
    pub buffer: BufferId,
    /// First row.
    pub start: u64,
    /// One past the last row.
    pub end: u64,
}

impl Region {
    /// Rows `[start, end)` of `buffer`.
    pub fn rows(buffer: BufferId, start: u64, end: u64) -> Self {
        Region { buffer, start, end }
    }
}

/// One argument of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Arg {
    /// The rows it touches.
    pub region: Region,
    /// How (must equal the op's [`Op::signature`] at this position).
    pub access: Access,
}

/// A kernel launch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Launch {
    /// The kernel.
    pub op: Op,
    /// Its arguments, in [`Op::signature`] order, then, when its kernels need scratch memory, one
    /// more: the whole of a [`TensorRole::Scratch`] transient, [`Access::Write`]
    /// ([`Launch::scratch`]).
    pub args: Vec<Arg>,
    /// The layer it belongs to, for reports; `None` outside the layers.
    pub layer: Option<u32>,
    /// Matrix-product FLOPs of the launch (`spec/cost-model.md`), for the time model; 0 for
    /// memory-bound ops.
    pub flops: u64,
}

impl Launch {
    /// The launch's scratch argument: the one past [`Op::signature`], if any.
    pub fn scratch(&self) -> Option<&Arg> {
        self.args.get(self.op.signature().len())
    }
}

/// What an instruction does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Runs a kernel.
    Launch(Launch),
    /// Copies `src`'s bytes to `dst` (same byte count; one side on the host, one on the device):
    /// a swap-out (device to host slot) or a swap-in (host slot to device).
    Copy {
        /// Read.
        src: Region,
        /// Written.
        dst: Region,
        /// Whose rows it moves. Its device side may be a rounding buffer, which has no layer of
        /// its own, so the copy names the layer; both sides must agree with it.
        tensor: TensorRows,
    },
    /// Completes when every earlier instruction of its stream has.
    Record(EventId),
    /// Holds its stream's later instructions until the event completes.
    Wait(EventId),
}

/// One instruction on one stream.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instruction {
    /// The stream that runs it.
    pub stream: Stream,
    /// What it does.
    pub action: Action,
}

/// How the step keeps the activations its backward needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Strategy {
    /// Every layer keeps its whole skeletal set on the device.
    KeepAll,
    /// Only layer inputs are kept; the backward reruns each layer's forward (attention included).
    FullRecompute,
    /// MEMO without the token split: alpha = 1, every skeletal tensor swapped whole.
    FullSwap,
    /// MEMO: input and attention output swapped whole, the first alpha*s tokens of the others
    /// swapped and the rest recomputed.
    Memo,
}

impl Strategy {
    /// Every strategy, in report order.
    pub const ALL: [Strategy; 4] = [Strategy::Memo, Strategy::FullRecompute, Strategy::FullSwap, Strategy::KeepAll];

    /// The name the CLI and the JSON use.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::KeepAll => "keep-all",
            Strategy::FullRecompute => "full-recompute",
            Strategy::FullSwap => "full-swap",
            Strategy::Memo => "memo",
        }
    }

    /// The strategy named `name` (as [`Strategy::name`] writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        Strategy::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The byte-format code.
    pub fn code(self) -> u8 {
        match self {
            Strategy::KeepAll => 0,
            Strategy::FullRecompute => 1,
            Strategy::FullSwap => 2,
            Strategy::Memo => 3,
        }
    }

    /// The strategy with byte-format code `code`.
    pub fn from_code(code: u8) -> Option<Self> {
        Strategy::ALL.into_iter().find(|s| s.code() == code)
    }
}

/// One placement problem the planner solved, as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PlacementSummary {
    /// Requests placed.
    pub buffers: u32,
    /// The peak of the placement, in bytes.
    pub peak_bytes: u64,
    /// The maximum of live bytes over time: no placement can be lower.
    pub lower_bound_bytes: u64,
    /// Whether the peak is proven minimal.
    pub optimal: bool,
    /// Search nodes spent.
    pub nodes: u64,
}

/// How the plan was made.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    /// The model and sequence.
    pub model: ModelConfig,
    /// The parallel layout (the plan is one GPU's).
    pub parallel: Parallelism,
    /// The machine.
    pub hardware: Hardware,
    /// The links between the GPUs of the tensor-parallel group.
    pub interconnect: Interconnect,
    /// The strategy.
    pub strategy: Strategy,
    /// The swap fraction (1 for full-swap; 0 for keep-all and full-recompute, which swap nothing).
    pub alpha: f64,
    /// Which constraint bound alpha.
    pub alpha_bound: AlphaBound,
    /// Rows of each token-split tensor copied to host (`floor(alpha * rows)`); the rest are
    /// recomputed.
    pub swapped_rows: u64,
    /// Level 1: one layer's forward transients.
    pub level1_forward: PlacementSummary,
    /// Level 1: one layer's backward transients (recompute included).
    pub level1_backward: PlacementSummary,
    /// Level 2: the whole step with per-layer blocks.
    pub level2: PlacementSummary,
}

impl Provenance {
    /// What this plan swaps and recomputes, in words, for reports: which layers swap (the last
    /// two never do), how many rows of each token-split tensor go to host, what alpha means here.
    /// A plan in which no layer swaps says so instead of quoting an alpha that selects nothing.
    pub fn swap_summary(&self) -> String {
        use alloc::format;
        let layers = self.model.layers;
        // A rank's rows: its context rank's s / c tokens of each sequence, split over t.
        let rank_tokens = self.model.rank_seq_len(&self.parallel);
        let rows = self.model.micro_batch.saturating_mul(rank_tokens) / self.parallel.tensor.max(1);
        match self.strategy {
            Strategy::KeepAll => String::from(
                "nothing swapped or recomputed: every layer keeps its skeletal tensors on the device (keep-all)",
            ),
            Strategy::FullRecompute => String::from(
                "nothing swapped: every layer keeps its input and recomputes the rest before its backward \
                 (full-recompute)",
            ),
            Strategy::Memo | Strategy::FullSwap if layers <= 2 => format!(
                "nothing swapped: with {layers} layer(s), every layer is one of the last two, which keep their \
                 skeletal tensors in the rounding buffers; alpha does not apply"
            ),
            Strategy::Memo | Strategy::FullSwap => {
                let swapped = layers - 2;
                let recomputed = rows - self.swapped_rows.min(rows);
                let split = if recomputed == 0 {
                    format!("all {rows} rows of each token-split tensor (nothing recomputed)")
                } else {
                    format!(
                        "the first {} of {rows} rows of each token-split tensor, recomputing the other {recomputed}",
                        self.swapped_rows
                    )
                };
                format!(
                    "alpha {:.4} ({}): layers 0-{} ({swapped} of {layers}) swap their input and attention output \
                     whole and {split}; layers {} and {} keep theirs in the rounding buffers",
                    self.alpha,
                    self.alpha_bound.label(),
                    swapped - 1,
                    layers - 2,
                    layers - 1
                )
            }
        }
    }
}

/// The plan's sizes. The checker recomputes each from the buffers and instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Totals {
    /// Bytes of the device arena: the highest end of a device buffer.
    pub arena_bytes: u64,
    /// The maximum, over instructions, of the bytes of device buffers live at once: no placement
    /// of these buffers with these lifetimes needs less.
    pub arena_lower_bound_bytes: u64,
    /// Bytes of the pinned host slab: the highest end of a host slot.
    pub host_bytes: u64,
    /// Bytes of parameters, gradients and optimizer state.
    pub parameter_bytes: u64,
    /// Bytes of the rounding buffers.
    pub rounding_buffer_bytes: u64,
}

/// The program of one rank that does not run the shared one ([`Plan::rank_programs`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RankProgram {
    /// The global rank `context_rank * t + tensor_rank`, `0..c*t` (with `c = 1`: the
    /// tensor-parallel rank). An entry at `k * t` (`k >= 1`) is context rank `k`'s program, run by
    /// each of its tensor-parallel ranks that has no entry of its own ([`Plan::program`]).
    pub rank: u32,
    /// Its program, in issue order, over the plan's buffers and events.
    pub instructions: Vec<Instruction>,
}

/// One GPU's training step: buffers, instructions, sizes and provenance.
///
/// With `t > 1` every rank of the tensor-parallel group runs [`Plan::instructions`] over its own
/// arena (same buffers, same places, its own data), unless [`Plan::rank_programs`] gives it its
/// own program. With context parallelism (`c > 1`, `spec/context-parallel.md`) the ring
/// attention's launches differ between context ranks, so the planner writes one program per
/// context rank: context rank 0's is [`Plan::instructions`], context rank `k`'s the rank program
/// keyed `k * t`, shared by that context rank's `t` tensor-parallel ranks. With `c = 1` the
/// planner writes no rank programs; the format carries them so that the checker's cross-rank rule
/// (`spec/validity.md`, rule 9) is a real check for plans made elsewhere.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// How it was made.
    pub provenance: Provenance,
    /// Every tensor; [`BufferId`] indexes this.
    pub buffers: Vec<Buffer>,
    /// The number of events; [`EventId`]s are `0..events`.
    pub events: u32,
    /// The program, in issue order: every rank's, but those in [`Plan::rank_programs`].
    pub instructions: Vec<Instruction>,
    /// Ranks that run another program than [`Plan::instructions`], by increasing rank.
    pub rank_programs: Vec<RankProgram>,
    /// Sizes.
    pub totals: Totals,
}

impl Plan {
    /// The buffer `id`, if it exists.
    pub fn buffer(&self, id: BufferId) -> Option<&Buffer> {
        self.buffers.get(id.index())
    }

    /// The program global rank `rank` (`context_rank * t + tensor_rank`) runs: its entry in
    /// [`Plan::rank_programs`]; else, for a context rank `k >= 1`, the entry at `k * t` (its
    /// context rank's program); else the shared one, [`Plan::instructions`]. With `c = 1` that is
    /// the entry of the rank, else the shared program, as in format version 5.
    pub fn program(&self, rank: u32) -> &[Instruction] {
        let entry = |key: u32| self.rank_programs.iter().find(|p| p.rank == key).map(|p| &p.instructions[..]);
        let t = u32::try_from(self.provenance.parallel.tensor.max(1)).unwrap_or(u32::MAX);
        let first_of_context = rank - rank % t;
        entry(rank)
            .or_else(|| if first_of_context > 0 { entry(first_of_context) } else { None })
            .unwrap_or(&self.instructions[..])
    }

    /// Program `index` of the plan as listed: 0 the shared one ([`Plan::instructions`]), `i >= 1`
    /// rank program `i - 1`'s (the shared one past the end).
    pub fn program_at(&self, index: usize) -> &[Instruction] {
        match index.checked_sub(1).and_then(|i| self.rank_programs.get(i)) {
            Some(program) => &program.instructions[..],
            None => &self.instructions[..],
        }
    }

    /// The context rank `k` and tensor-parallel rank of global rank `rank`.
    pub fn rank_coordinates(&self, rank: u32) -> (u32, u32) {
        let t = u32::try_from(self.provenance.parallel.tensor.max(1)).unwrap_or(u32::MAX);
        (rank / t, rank % t)
    }
}
