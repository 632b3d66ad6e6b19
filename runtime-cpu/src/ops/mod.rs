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

use std::fmt;

use memo_plan_core::plan::{Access, Op};

mod attention;
mod elementwise;
mod gemm;
mod linear;
mod loss;
mod norm;
mod optim;
mod parallel;
mod tensor;

#[cfg(test)]
mod tests;

pub use parallel::{set_threads, threads};

/// AdamW's hyperparameters for one step (PyTorch's `AdamW` semantics: decoupled weight decay on
/// every parameter it is given, bias-corrected moments, the global-norm clip; `step` is 1-based):
/// the runtime's own type, so the interpreter passes it through unchanged.
pub use memo_runtime::AdamW;

/// What a launch's arguments cannot say about the model (`t = 1`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpContext {
    /// Elements per row of sequence-sharded activations (the model's `h` when `t = 1`).
    pub hidden: usize,
    /// Attention heads on this GPU.
    pub heads: usize,
    /// Rows of one sequence: rows are `b*s`, row `r` is sequence `r / s`, position `r % s`.
    pub seq_len: usize,
    /// Rows of the word embedding (the vocabulary).
    pub vocab: usize,
    /// Tokens of the whole step (`b*s`): cross-entropy divides the loss gradient by it.
    pub loss_scale_tokens: usize,
    /// The optimizer's hyperparameters.
    pub adamw: AdamW,
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

/// Why an op could not run. `Display` names the op, the argument and what was expected.
#[derive(Clone, Debug, PartialEq)]
pub struct OpError {
    /// The op launched.
    pub op: Op,
    /// The argument at fault (its name in [`Op::signature`]), if one is.
    pub argument: Option<&'static str>,
    /// What is wrong.
    pub kind: OpErrorKind,
}

/// What is wrong with a launch.
#[derive(Clone, Debug, PartialEq)]
pub enum OpErrorKind {
    /// Another number of arguments than the op's signature has.
    ArgumentCount {
        /// The signature's count.
        expected: usize,
        /// The launch's.
        found: usize,
    },
    /// An argument passed read-only where the op writes it, or writable where it only reads.
    ArgumentAccess {
        /// The signature's access.
        expected: Access,
        /// `"read"` or `"write"`: how it was passed.
        found: &'static str,
    },
    /// The bytes passed are not `rows * row_bytes`.
    ByteCount {
        /// Rows claimed.
        rows: usize,
        /// Bytes per row claimed.
        row_bytes: usize,
        /// Bytes passed.
        bytes: usize,
    },
    /// The shape does not fit the op or the other arguments.
    Shape {
        /// What the op needs, and why.
        expected: String,
        /// What the argument has.
        found: String,
    },
    /// A token id or target that is not below the vocabulary size.
    IdOutOfRange {
        /// The row (within the argument) holding it.
        row: usize,
        /// The id.
        id: u32,
        /// The vocabulary size.
        limit: usize,
    },
    /// A field of [`OpContext`] this op cannot work with.
    Context {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A value that is NaN or infinite where the step cannot continue (the gradient norm).
    NotFinite {
        /// The value.
        value: f32,
    },
    /// `all_gather` and `reduce_scatter` need the GPUs of a tensor-parallel group.
    NeedsMultiGpu,
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op `{}`", self.op.name())?;
        if let Some(argument) = self.argument {
            write!(f, ", argument `{argument}`")?;
        }
        f.write_str(": ")?;
        match &self.kind {
            OpErrorKind::ArgumentCount { expected, found } => write!(
                f,
                "{found} arguments, but the op takes {expected} ({}); the plan or the interpreter is wrong",
                signature_names(self.op)
            ),
            OpErrorKind::ArgumentAccess { expected, found } => write!(
                f,
                "passed as {found}, but the op's signature says {}; pass read arguments as ArgData::Read and \
                 write or read_write ones as ArgData::Write",
                expected.name()
            ),
            OpErrorKind::ByteCount { rows, row_bytes, bytes } => {
                write!(f, "{bytes} bytes passed for {rows} rows of {row_bytes} bytes; pass exactly those rows' bytes")
            }
            OpErrorKind::Shape { expected, found } => write!(f, "expected {expected}, found {found}"),
            OpErrorKind::IdOutOfRange { row, id, limit } => {
                write!(f, "row {row} holds id {id}, not below the vocabulary size {limit}; the input data is corrupt")
            }
            OpErrorKind::Context { field, problem } => write!(f, "context field `{field}`: {problem}"),
            OpErrorKind::NotFinite { value } => write!(
                f,
                "the value is {value}: the gradients overflowed or hold NaN; lower the learning rate or check the data"
            ),
            OpErrorKind::NeedsMultiGpu => f.write_str(
                "needs a multi-GPU backend (t > 1); the CPU backend runs plans made with tensor parallelism t = 1",
            ),
        }
    }
}

impl std::error::Error for OpError {}

fn signature_names(op: Op) -> String {
    let names: Vec<&str> = op.signature().iter().map(|(name, _)| *name).collect();
    names.join(", ")
}

/// Runs `op` on `args` (in [`Op::signature`] order) with the process-wide thread count
/// ([`threads`]).
pub fn execute(op: Op, args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    execute_with_threads(op, args, ctx, threads())
}

/// Runs `op` on `args` with at most `threads` threads (0 or 1: the calling thread only). The
/// result's bits do not depend on `threads`.
pub fn execute_with_threads(op: Op, args: &mut [Arg<'_>], ctx: &OpContext, threads: usize) -> Result<(), OpError> {
    let threads = threads.max(1);
    match op {
        Op::Embedding => elementwise::embedding(args, ctx),
        Op::LayerNorm => norm::layer_norm(args, ctx),
        Op::Linear => linear::linear(args, threads),
        Op::Attention => attention::forward(args, ctx, threads),
        Op::Gelu => elementwise::gelu(args),
        Op::Add => elementwise::add(args),
        Op::AllGather | Op::ReduceScatter => {
            // Check the arguments first so a malformed launch reports that, not the backend.
            tensor::split::<1, 1>(op, args)?;
            Err(OpError { op, argument: None, kind: OpErrorKind::NeedsMultiGpu })
        }
        Op::LinearBackwardInput => linear::backward_input(args, false, threads),
        Op::LinearBackwardInputAccumulate => linear::backward_input(args, true, threads),
        Op::LinearBackwardWeight => linear::backward_weight(args, threads),
        Op::GeluBackward => elementwise::gelu_backward(args),
        Op::LayerNormBackward => norm::layer_norm_backward(args, ctx),
        Op::AttentionBackward => attention::backward(args, ctx, threads),
        Op::Classifier => linear::classifier(args, ctx, threads),
        Op::CrossEntropy => loss::cross_entropy(args, ctx),
        Op::ClassifierBackwardWeight => linear::classifier_backward_weight(args, ctx, threads),
        Op::EmbeddingBackward => elementwise::embedding_backward(args, ctx),
        Op::Zero => elementwise::zero(args),
        Op::GradNormSquared => optim::grad_norm_squared(args),
        Op::AdamW => optim::adamw(args, ctx),
    }
}
