//! The CPU reference kernels: every op of `spec/plan-format.md`'s op table on host memory.
//!
//! The plan interpreter hands each launch to [`execute`]: the op, its arguments in
//! [`Op::signature`] order (each the bytes of the rows the launch touches), and an
//! [`OpContext`] with what the arguments' shapes cannot say (heads, sequence length, the loss
//! scale, AdamW's hyperparameters).
//!
//! Numerics (the same on every backend, `spec/backends.md`): activations, parameters and
//! their gradients are bf16 (little-endian bytes), every sum is accumulated in f32 and rounded to
//! bf16 once; the attention log-sum-exp, the optimizer state and the scalars are f32; token ids
//! and targets are u32.
//!
//! Two properties the runtime's bit-exactness rests on:
//! - **Row-range invariance.** A row-wise op (`layer_norm`, `linear`, `gelu`, `add`, and the
//!   other per-row ops) computes each output row from that input row alone, with a summation
//!   order that depends on nothing else: not on how many rows the launch has, where they start,
//!   or how the rows are split across threads. So MEMO's recompute of tokens `[a, s)` gives the
//!   same bits as the forward over all tokens. The GEMM (`gemm.rs`) sums each output element over
//!   the contraction index in one fixed sequential order; blocking only pauses that sum.
//! - **Determinism.** Every op gives the same bits for the same inputs, whatever the thread
//!   count: threads split the output into fixed chunks and never share a sum.
//!
//! Errors, never panics: a wrong argument count, access, byte count or shape, a token id outside
//! the vocabulary, a context that cannot work, and the collectives (which need a multi-GPU
//! backend) come back as [`OpError`].
#![forbid(unsafe_code)]

use memo_plan_core::plan::Op;

mod attention;
mod elementwise;
mod gemm;
mod linear;
mod loss;
mod norm;
mod optim;
mod parallel;
mod ring;
mod tensor;

#[cfg(test)]
mod tests;

pub use parallel::{set_threads, threads};

/// AdamW's hyperparameters for one step (PyTorch's `AdamW` semantics: decoupled weight decay on
/// every parameter it is given, bias-corrected moments, the global-norm clip; `step` is 1-based):
/// the runtime's own type, so the interpreter passes it through unchanged.
pub use memo_runtime::AdamW;

/// What a launch's arguments cannot say about the model (the rank's place in a tensor-parallel
/// group comes apart, as a [`Group`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpContext {
    /// Elements per row of sequence-sharded activations (the model's `h` when `t = 1`).
    pub hidden: usize,
    /// Query heads on this GPU.
    pub heads: usize,
    /// Key/value heads in this GPU's K and V (0 reads as `heads`).
    pub kv_heads: usize,
    /// Whether K and V hold every key/value head, replicated on every rank.
    pub kv_replicated: bool,
    /// The rotary base `theta`.
    pub rope_theta: f64,
    /// The norms' epsilon.
    pub norm_eps: f64,
    /// Rows of one sequence: rows are `b*s`, row `r` is sequence `r / s`, position `r % s`.
    pub seq_len: usize,
    /// The vocabulary `V` (each of `t` ranks holds `ceil(V / t)` embedding rows).
    pub vocab: usize,
    /// Tokens of the whole step (`b*s`): cross-entropy divides the loss gradient by it.
    pub loss_scale_tokens: usize,
    /// The optimizer's hyperparameters.
    pub adamw: AdamW,
    /// This rank's place in the context-parallel ring (`spec/context-parallel.md`): rank
    /// `context_rank` of `context_ranks` (0 reads as 1). Only `rotary` and `rotary_backward` read
    /// it: they give each row its position in the whole sequence.
    pub context_rank: usize,
    /// Ranks in the context-parallel ring, `c`.
    pub context_ranks: usize,
}

/// A rank's place in its tensor-parallel group: what the vocabulary-parallel ops (the embedding
/// and classifier shards, the split cross-entropy) need beyond [`OpContext`]. The runtime's
/// kernel context gives it (`rank`, `ranks`); [`Group::SINGLE`] is one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// This rank, `0..ranks`.
    pub rank: usize,
    /// GPUs in the group, `t`.
    pub ranks: usize,
}

impl Group {
    /// One GPU: rank 0 of 1.
    pub const SINGLE: Group = Group { rank: 0, ranks: 1 };
}

/// An argument's bytes, read-only or writable. `ReadWrite` arguments come as `Write`.
#[derive(Debug)]
pub enum ArgData<'a> {
    /// An argument the op only reads.
    Read(&'a [u8]),
    /// An argument the op writes (or reads and writes).
    Write(&'a mut [u8]),
}

/// One argument of a launch: rows `[first_row, first_row + rows)` of a buffer.
#[derive(Debug)]
pub struct Arg<'a> {
    /// Exactly the bytes of those rows: `rows * row_bytes` bytes.
    pub data: ArgData<'a>,
    /// The first row's index in its buffer (attention reads positions from it).
    pub first_row: usize,
    /// Rows in `data`.
    pub rows: usize,
    /// Bytes per row of the buffer.
    pub row_bytes: usize,
}

/// Why an op could not run: the one launch error of every backend, defined with the op table's
/// shape rules (`memo_plan_core::plan::shapes`). `Display` names the op, the argument and what was
/// expected.
pub use memo_plan_core::plan::shapes::{OpError, OpErrorKind};

/// Runs `op` on `args` (in [`Op::signature`] order) with the process-wide thread count
/// ([`threads`]).
pub fn execute(op: Op, args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    execute_with_threads(op, args, ctx, threads())
}

/// Runs `op` on `args` with at most `threads` threads (0 or 1: the calling thread only). The
/// result's bits do not depend on `threads`.
pub fn execute_with_threads(op: Op, args: &mut [Arg<'_>], ctx: &OpContext, threads: usize) -> Result<(), OpError> {
    execute_on_rank(op, args, ctx, Group::SINGLE, threads)
}

/// Runs `op` on `args` as rank `group.rank` of a tensor-parallel group of `group.ranks` (the
/// non-collective ops only: a collective needs the other ranks, and this reference refuses it
/// after checking its arguments), with at most `threads` threads.
pub fn execute_on_rank(
    op: Op,
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    group: Group,
    threads: usize,
) -> Result<(), OpError> {
    let threads = threads.max(1);
    match op {
        Op::Embedding => elementwise::embedding(args, ctx, group),
        Op::LayerNorm => norm::layer_norm(args, ctx),
        Op::Linear => linear::linear(args, ctx, threads),
        Op::Attention => attention::forward(args, ctx, group, threads),
        Op::Gelu => elementwise::gelu(args, ctx),
        Op::Add => elementwise::add(args, ctx),
        Op::AllGather | Op::ReduceScatter => {
            // Check the arguments first so a malformed launch reports that, not the backend.
            tensor::split_in::<1, 1>(op, args, ctx, group)?;
            Err(OpError::needs_multi_gpu(op))
        }
        Op::AllReduceSumBf16 | Op::AllReduceSumF32 | Op::AllReduceMaxF32 => {
            tensor::split_in::<0, 1>(op, args, ctx, group)?;
            Err(OpError::needs_multi_gpu(op))
        }
        Op::LinearNoBias => linear::linear_no_bias(args, ctx, threads),
        Op::AddBias => elementwise::add_bias(args, ctx),
        Op::CrossEntropyMax => loss::cross_entropy_max(args, ctx, group),
        Op::CrossEntropySums => loss::cross_entropy_sums(args, ctx, group),
        Op::CrossEntropyFinish => loss::cross_entropy_finish(args, ctx, group),
        Op::LinearBackwardInput => linear::backward_input(args, ctx, false, threads),
        Op::LinearBackwardInputAccumulate => linear::backward_input(args, ctx, true, threads),
        Op::LinearBackwardWeight => linear::backward_weight(args, ctx, true, threads),
        Op::GeluBackward => elementwise::gelu_backward(args, ctx),
        Op::LayerNormBackward => norm::layer_norm_backward(args, ctx),
        Op::AttentionBackward => attention::backward(args, ctx, group, threads),
        Op::Classifier => linear::classifier(args, ctx, group, threads),
        Op::CrossEntropy => loss::cross_entropy(args, ctx),
        Op::ClassifierBackwardWeight => linear::classifier_backward_weight(args, ctx, group, threads),
        Op::EmbeddingBackward => elementwise::embedding_backward(args, ctx, group),
        Op::Zero => elementwise::zero(args, ctx),
        Op::GradNormSquared => optim::grad_norm_squared(args, ctx),
        Op::AdamW => optim::adamw(args, ctx),
        Op::RmsNorm => norm::rms_norm(args, ctx),
        Op::RmsNormBackward => norm::rms_norm_backward(args, ctx),
        Op::Swiglu => elementwise::swiglu(args, ctx),
        Op::SwigluBackward => elementwise::swiglu_backward(args, ctx),
        Op::LinearBackwardWeightNoBias => linear::backward_weight(args, ctx, false, threads),
        // Context parallelism's ops (`spec/context-parallel.md`).
        Op::Rotary | Op::RotaryBackward => ring::rotary(op, args, ctx, group, threads, op == Op::RotaryBackward),
        Op::AttentionBlock | Op::AttentionBlockCausal => {
            ring::attention_block(op, args, ctx, group, threads, op == Op::AttentionBlockCausal)
        }
        Op::AttentionRingInit => ring::attention_ring_init(op, args, ctx, group),
        Op::AttentionRingFinish => ring::attention_ring_finish(op, args, ctx, group),
        Op::AttentionBlockBackward | Op::AttentionBlockBackwardCausal => {
            ring::attention_block_backward(op, args, ctx, group, threads, op == Op::AttentionBlockBackwardCausal)
        }
        Op::ToBf16 => ring::to_bf16(op, args, ctx, group),
        Op::RingExchange => {
            tensor::split_in::<1, 1>(op, args, ctx, group)?;
            Err(OpError::needs_multi_gpu(op))
        }
        Op::DataAllReduceSumBf16 | Op::DataAllReduceSumF32 => {
            tensor::split_in::<0, 1>(op, args, ctx, group)?;
            Err(OpError::needs_multi_gpu(op))
        }
    }
}
