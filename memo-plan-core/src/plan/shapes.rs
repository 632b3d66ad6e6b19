//! The op table's shape rules: for each [`Op`], what its arguments' shapes must be, and the
//! dimensions a kernel needs from them ([`OpShape`]), defined once.
//!
//! Every executor checks a launch here before it computes: the CPU reference kernels
//! (`runtime-cpu/src/ops`) and the GPU recipes (`kernels/src/recipes.rs`) call [`check`] with
//! the launch's argument shapes (rows and bytes per row, in [`Op::signature`] order) and the
//! [`ShapeContext`] (what shapes cannot say: the hidden size, heads, the sequence length, the
//! vocabulary, the loss scale, AdamW's step). So a launch one refuses, the other refuses with the
//! same [`OpError`], and the dimensions both compute with are the same numbers.
//!
//! What stays with an executor is what only it can know: the CPU checks that the bytes passed
//! are `rows * row_bytes` and how each argument is passed, and token ids against the vocabulary;
//! the GPU recipes check their kernels' limits (32-bit widths, BLAS dimensions, the head
//! dimensions with a kernel), reported as [`OpError`]s too.

use alloc::format;
use alloc::string::String;
use core::fmt;

use super::{Access, Op};

/// Bytes of a bf16 element.
const BF16: u64 = 2;
/// Bytes of an f32 or u32 element.
const WORD: u64 = 4;
/// Why a width is `hidden` elements.
const HIDDEN: &str = "`hidden` bf16 of the context";

/// The shape of one launch argument: rows `[first_row, first_row + rows)` of a buffer whose rows
/// are `row_bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ArgShape {
    /// The argument's first row in its buffer (attention reads positions from it).
    pub first_row: u64,
    /// Rows in the argument.
    pub rows: u64,
    /// Bytes per row.
    pub row_bytes: u64,
}

/// What a launch's argument shapes cannot say about the model (one GPU's share of it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShapeContext {
    /// Elements per row of sequence-sharded activations (`h`).
    pub hidden: u64,
    /// Query heads on this GPU.
    pub heads: u64,
    /// Key/value heads in this GPU's K and V (0 reads as `heads`: multi-head attention).
    pub kv_heads: u64,
    /// Whether K and V hold every key/value head of the model, replicated on every rank (when the
    /// group has more ranks than the model has key/value heads; `spec/tensor-parallel.md`), rather
    /// than this rank's share.
    pub kv_replicated: bool,
    /// The rotary base `theta` (10,000 for GPT).
    pub rope_theta: f64,
    /// The norms' epsilon.
    pub norm_eps: f64,
    /// Rows of one sequence: row `r` is sequence `r / seq_len`, position `r % seq_len`.
    pub seq_len: u64,
    /// The vocabulary `V` (token ids and targets are below it). Each rank holds `V' = ceil(V /
    /// ranks)` rows of the embedding ([`ShapeContext::vocab_shard`]); with one rank, all `V`.
    pub vocab: u64,
    /// Tokens of the whole step (`b*s`): cross-entropy divides the loss gradient by it.
    pub loss_scale_tokens: u64,
    /// AdamW's step, counted from 1.
    pub adamw_step: u64,
    /// This GPU's rank in its tensor-parallel group, `0..ranks`.
    pub rank: u64,
    /// GPUs in the tensor-parallel group, `t` (0 reads as 1: `Default` is one GPU).
    pub ranks: u64,
    /// This GPU's context-parallel rank `k`, `0..context_ranks` (`spec/context-parallel.md`):
    /// with `seq_len` the rank's rows of one sequence, it decides each row's position
    /// ([`ShapeContext::position`]).
    pub context_rank: u64,
    /// Context-parallel ranks `c` (0 reads as 1).
    pub context_ranks: u64,
}

impl Default for ShapeContext {
    /// One GPU, every size 0, GPT's rotary base (10,000) and epsilon (1e-5).
    fn default() -> Self {
        ShapeContext {
            hidden: 0,
            heads: 0,
            kv_heads: 0,
            kv_replicated: false,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            seq_len: 0,
            vocab: 0,
            loss_scale_tokens: 0,
            adamw_step: 0,
            rank: 0,
            ranks: 0,
            context_rank: 0,
            context_ranks: 0,
        }
    }
}

impl ShapeContext {
    /// The context of rank `rank` of a group of `ranks` for `model`'s step: its share of the
    /// heads, the K/V heads its K and V hold (and whether they are replicated), the sequence, the
    /// vocabulary, the step's tokens, and AdamW's first step.
    pub fn for_model(model: &crate::model::ModelConfig, rank: u64, ranks: u64) -> Self {
        let ranks = ranks.max(1);
        ShapeContext {
            hidden: model.hidden,
            heads: model.heads / ranks,
            kv_heads: model.kv_heads_on_gpu(ranks),
            kv_replicated: model.kv_replicated(ranks),
            rope_theta: model.architecture.rope_theta,
            norm_eps: model.architecture.norm_eps,
            seq_len: model.seq_len,
            vocab: model.vocab,
            loss_scale_tokens: model.micro_batch.saturating_mul(model.seq_len),
            adamw_step: 1,
            rank,
            ranks,
            context_rank: 0,
            context_ranks: 1,
        }
    }

    /// [`ShapeContext::for_model`] for rank `rank` of the tensor-parallel group of `parallel`:
    /// with context parallelism (`c > 1`) a rank's program holds its `s / c` tokens of each
    /// sequence ([`crate::model::ModelConfig::rank_seq_len`]), so its launches are checked as
    /// sequences of that many rows. The context rank is 0: [`ShapeContext::for_ranks`] names it.
    pub fn for_layout(model: &crate::model::ModelConfig, parallel: &crate::model::Parallelism, rank: u64) -> Self {
        ShapeContext::for_ranks(model, parallel, rank, 0)
    }

    /// [`ShapeContext::for_layout`] for tensor-parallel rank `rank` of context rank
    /// `context_rank` (`0..c`).
    pub fn for_ranks(
        model: &crate::model::ModelConfig,
        parallel: &crate::model::Parallelism,
        rank: u64,
        context_rank: u64,
    ) -> Self {
        ShapeContext {
            seq_len: model.rank_seq_len(parallel),
            context_rank,
            context_ranks: parallel.context.max(1),
            ..ShapeContext::for_model(model, rank, parallel.tensor)
        }
    }

    /// `c`: [`ShapeContext::context_ranks`], at least 1.
    pub fn context_group(&self) -> u64 {
        self.context_ranks.max(1)
    }

    /// The position in its sequence of local row `row` (`spec/context-parallel.md`, "Layout"):
    /// with `L = seq_len` (this rank's rows of one sequence, `s / c`) and `n = L / 2` (one chunk),
    /// `j = row % L` is position `k*n + j` in the rank's first chunk (`j < n`), else
    /// `(2c-1-k)*n + (j - n)` in its second. With `c = 1` that is `row % seq_len`. `None` when
    /// `seq_len` is 0, or when `c > 1` and `seq_len` is odd or `k >= c`.
    pub fn position(&self, row: u64) -> Option<u64> {
        let (k, c, l) = (self.context_rank, self.context_group(), self.seq_len);
        if l == 0 {
            return None;
        }
        let j = row % l;
        if c == 1 {
            return Some(j);
        }
        if k >= c || !l.is_multiple_of(2) {
            return None;
        }
        let n = l / 2;
        if j < n {
            k.checked_mul(n)?.checked_add(j)
        } else {
            // k < c, so 2c - 1 - k >= c: no underflow once 2c fits.
            (c.checked_mul(2)? - 1 - k).checked_mul(n)?.checked_add(j - n)
        }
    }

    /// Key/value heads in K and V: [`ShapeContext::kv_heads`], or `heads` when it is 0.
    pub fn kv_heads_in_tensor(&self) -> u64 {
        if self.kv_heads == 0 {
            self.heads
        } else {
            self.kv_heads
        }
    }

    /// `t`: [`ShapeContext::ranks`], at least 1.
    pub fn group(&self) -> u64 {
        self.ranks.max(1)
    }

    /// `V' = ceil(V / t)`: the embedding rows, and the logits columns, of one rank.
    pub fn vocab_shard(&self) -> u64 {
        self.vocab.div_ceil(self.group())
    }

    /// `rank * V'`: the vocabulary id of this rank's first embedding row and logits column.
    pub fn vocab_offset(&self) -> u64 {
        self.rank.saturating_mul(self.vocab_shard())
    }

    /// This rank's logits columns below the vocabulary: `min(V', V - rank * V')` (0 when the
    /// rank holds padding only).
    pub fn vocab_columns(&self) -> u64 {
        self.vocab.saturating_sub(self.vocab_offset()).min(self.vocab_shard())
    }

    /// The query heads of the whole model that K and V serve, and this rank's first query head
    /// as K counts them (grouped-query attention: `attention` and the ring's blocks alike); with
    /// K and V replicated (`t > kv_heads`) every query head of the model, else this rank's. An
    /// error names `kv_heads` when they do not divide those query heads, or exceed this rank's
    /// unless replicated.
    fn query_heads(&self, op: Op) -> Result<(u64, u64), OpError> {
        let (heads, kv_heads) = (self.heads, self.kv_heads_in_tensor());
        let (all_heads, first_query) = if self.kv_replicated {
            self.check_rank(op)?;
            (heads.saturating_mul(self.group()), self.rank.saturating_mul(heads))
        } else {
            (heads, 0)
        };
        if kv_heads == 0 || !all_heads.is_multiple_of(kv_heads) || (!self.kv_replicated && kv_heads > heads) {
            let problem = format!(
                "is {kv_heads}; it must divide the query heads {all_heads} (grouped-query attention), and be at most \
                 the {heads} query heads of this rank unless K and V are replicated"
            );
            return Err(OpError::context(op, "kv_heads", problem));
        }
        Ok((all_heads, first_query))
    }

    /// Checks `rank < ranks` for an op that depends on the rank.
    fn check_rank(&self, op: Op) -> Result<(), OpError> {
        if self.rank >= self.group() {
            let problem = format!("is {}, but the group has {} rank(s)", self.rank, self.group());
            return Err(OpError::context(op, "rank", problem));
        }
        Ok(())
    }
}

/// The dimensions of an attention launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Query heads (the context's).
    pub heads: u64,
    /// Key/value heads in `k` and `v`.
    pub kv_heads: u64,
    /// Query heads per key/value head in the whole model (`H / H_kv`).
    pub group: u64,
    /// The index, in the model's query heads, of this launch's query head 0 as the K/V heads of
    /// `k` count it: 0 when `k` holds this rank's share of the heads, `rank * heads` when `k`
    /// holds every head (replicated).
    pub first_query: u64,
    /// Elements of one head in a row of `q` (even: rotary positions rotate pairs).
    pub head_dim: u64,
    /// Rows of one sequence.
    pub seq_len: u64,
    /// Whole sequences in the launch.
    pub sequences: u64,
}

/// The dimensions of a launch whose shapes passed [`check`].
///
/// `rows` are the rows the op runs over: tokens for activations (the rows of `x`, `dy`, `q`,
/// `logits` or `tokens`), the parameter's rows for the optimizer ops, the buffer's for `zero`.
/// `width` is elements per row of the op's main operand: the input features of a matrix product
/// (`hidden` for the classifier), the bf16 elements of an element-wise, norm, optimizer or
/// attention row, `vocab` for cross-entropy, the embedding's row for the embedding ops, bytes for
/// `zero` (which knows no element type) and 0 for the collectives (which check nothing here).
/// `features` are the output features of a matrix product (`vocab` for the classifier and the
/// embedding ops), else 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpShape {
    /// The op.
    pub op: Op,
    /// Rows the op runs over.
    pub rows: u64,
    /// Elements per row of the main operand.
    pub width: u64,
    /// Output features of a matrix product.
    pub features: u64,
    /// `rows * width`: checked to fit 64 bits for the ops that visit every element (`gelu`,
    /// `gelu_backward`, `add`, `grad_norm_squared`, `adamw`), saturated for the others.
    pub elements: u64,
    /// Heads, head dimension and sequences: `attention` and `attention_backward` only.
    pub attention: Option<AttentionShape>,
}

impl OpShape {
    /// The launch's matrix-product FLOPs, `2 * rows * width * features` (saturated), as
    /// [`super::Launch::flops`] counts them: the linear layers, their backward and the
    /// classifier's products; 0 for the rest (attention's are counted per layer by the cost
    /// model, the other ops are memory-bound).
    pub fn matmul_flops(&self) -> u64 {
        match self.op {
            Op::Linear
            | Op::LinearNoBias
            | Op::LinearBackwardInput
            | Op::LinearBackwardInputAccumulate
            | Op::LinearBackwardWeight
            | Op::LinearBackwardWeightNoBias
            | Op::Classifier
            | Op::ClassifierBackwardWeight => matmul_flops(self.rows, self.width, self.features).unwrap_or(u64::MAX),
            Op::AttentionBlock | Op::AttentionBlockCausal => {
                let causal = self.op == Op::AttentionBlockCausal;
                attention_block_flops(self.rows, self.features, self.width, causal).unwrap_or(u64::MAX)
            }
            Op::AttentionBlockBackward | Op::AttentionBlockBackwardCausal => {
                let causal = self.op == Op::AttentionBlockBackwardCausal;
                attention_block_flops(self.rows, self.features, self.width, causal)
                    .and_then(|f| f.checked_mul(2))
                    .unwrap_or(u64::MAX)
            }
            _ => 0,
        }
    }
}

impl AttentionShape {
    /// The head of `k` and `v` that query head `head` (of this launch) attends with:
    /// `(first_query + head) / group`.
    pub fn kv_head(&self, head: u64) -> u64 {
        (self.first_query + head) / self.group.max(1)
    }
}

impl OpShape {
    /// The attention geometry of an `attention` or `attention_backward` launch; an error for any
    /// other op's shape (a backend that asks for it there has a bug).
    pub fn attention_geometry(&self) -> Result<AttentionShape, OpError> {
        self.attention.ok_or_else(|| OpError {
            op: self.op,
            argument: None,
            kind: OpErrorKind::Unsupported {
                reason: "the op table gave no attention geometry for this launch; please report it".into(),
            },
        })
    }
}

/// `2 * rows * in_features * out_features`: the FLOPs of one matrix product over `rows` rows,
/// or `None` when that overflows 64 bits.
pub fn matmul_flops(rows: u64, in_features: u64, out_features: u64) -> Option<u64> {
    let product = u128::from(rows) * u128::from(in_features) * u128::from(out_features) * 2;
    u64::try_from(product).ok()
}

/// Why a launch cannot run, on any backend. `Display` names the op, the argument and what was
/// expected.
#[derive(Clone, Debug, PartialEq)]
pub struct OpError {
    /// The op launched.
    pub op: Op,
    /// The argument at fault (its name in [`Op::signature`]), if one is.
    pub argument: Option<&'static str>,
    /// What is wrong.
    pub kind: OpErrorKind,
}

/// What is wrong with a launch: its shapes or context (the rules of [`check`]), how a backend
/// was handed its arguments, the data, or a backend's limits.
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
    /// A field of the context this op cannot work with.
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
    /// A launch the rules allow but this backend's kernels cannot run (a limit of theirs).
    Unsupported {
        /// What, and what to change.
        reason: String,
    },
    /// `all_gather` and `reduce_scatter` need the GPUs of a tensor-parallel group.
    NeedsMultiGpu,
}

impl OpErrorKind {
    /// Writes what is wrong (the part after the op and the argument) for a launch of `op`.
    fn write(&self, op: Op, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpErrorKind::ArgumentCount { expected, found } => {
                write!(f, "{found} arguments, but the op takes {expected} (")?;
                for (index, (name, _)) in op.signature().iter().enumerate() {
                    let separator = if index == 0 { "" } else { ", " };
                    write!(f, "{separator}{name}")?;
                }
                f.write_str("); the plan or the interpreter is wrong")
            }
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
            OpErrorKind::Unsupported { reason } => f.write_str(reason),
            OpErrorKind::NeedsMultiGpu => f.write_str(
                "needs a multi-GPU backend (t > 1); this backend runs plans made with tensor parallelism t = 1",
            ),
        }
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op `{}`", self.op.name())?;
        if let Some(argument) = self.argument {
            write!(f, ", argument `{argument}`")?;
        }
        f.write_str(": ")?;
        self.kind.write(self.op, f)
    }
}

impl core::error::Error for OpError {}

impl OpError {
    /// A context field `op` cannot work with.
    pub fn context(op: Op, field: &'static str, problem: String) -> Self {
        OpError { op, argument: None, kind: OpErrorKind::Context { field, problem } }
    }

    /// The refusal of a context-parallel op (codes 34-45, [`Op::is_context_parallel`]) by a
    /// backend (`backend`: "CPU", "GPU") whose kernels for it are not wired yet: plans carry
    /// the ring (`spec/context-parallel.md`), the runtimes do not run it yet.
    pub fn not_yet_wired(op: Op, backend: &str) -> Self {
        let reason = format!(
            "context parallelism's ops are not yet wired into the {backend} backend: plans with c > 1 can be made \
             and checked, not run; train with context parallelism 1"
        );
        OpError { op, argument: None, kind: OpErrorKind::Unsupported { reason } }
    }

    /// The refusal of a collective by a single-device backend.
    pub fn needs_multi_gpu(op: Op) -> Self {
        OpError { op, argument: None, kind: OpErrorKind::NeedsMultiGpu }
    }

    /// A shape argument `index` of `op` has (`found`) where the op needs `expected`.
    pub fn shape(op: Op, index: usize, expected: String, found: String) -> Self {
        OpError { op, argument: argument_name(op, index), kind: OpErrorKind::Shape { expected, found } }
    }
}

/// The name of argument `index` of `op` in its signature.
pub fn argument_name(op: Op, index: usize) -> Option<&'static str> {
    op.signature().get(index).map(|&(name, _)| name)
}

/// Checks that a launch of `op` has its signature's number of arguments.
pub fn check_argument_count(op: Op, found: usize) -> Result<(), OpError> {
    let expected = op.signature().len();
    if found == expected {
        return Ok(());
    }
    Err(OpError { op, argument: None, kind: OpErrorKind::ArgumentCount { expected, found } })
}

/// Checks a launch of `op` with arguments of these shapes (in [`Op::signature`] order) against
/// the op table's rules (`spec/plan-format.md`, "The ops"), and returns its dimensions. The first
/// rule broken is the error, in signature order within each op.
pub fn check(op: Op, args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    match op {
        Op::Embedding => embedding(args, ctx, Op::Embedding),
        Op::EmbeddingBackward => embedding(args, ctx, Op::EmbeddingBackward),
        Op::LayerNorm | Op::LayerNormBackward | Op::RmsNorm | Op::RmsNormBackward => norm(op, args, ctx),
        Op::Linear => linear(args),
        Op::LinearBackwardInput | Op::LinearBackwardInputAccumulate => linear_backward_input(op, args),
        Op::LinearBackwardWeight => linear_backward_weight(args),
        Op::Classifier | Op::ClassifierBackwardWeight => classifier(op, args, ctx),
        Op::Gelu | Op::GeluBackward | Op::Add => elementwise(op, args),
        Op::Attention | Op::AttentionBackward => attention(op, args, ctx),
        Op::CrossEntropy => cross_entropy(args, ctx),
        Op::GradNormSquared => grad_norm_squared(args),
        Op::AdamW => adamw(args, ctx),
        Op::Zero => {
            let [buffer] = arguments(op, args)?;
            Ok(shape(op, buffer.s.rows, buffer.s.row_bytes, 0))
        }
        Op::AllGather | Op::ReduceScatter => gather_scatter(op, args, ctx),
        Op::AllReduceSumBf16 | Op::AllReduceSumF32 | Op::AllReduceMaxF32 => {
            let [x] = arguments(op, args)?;
            let (elem, what) = if op == Op::AllReduceSumBf16 { (BF16, "bf16") } else { (WORD, "f32") };
            let width = x.elems(elem, what)?;
            let elements = x.total(width)?;
            Ok(OpShape { elements, ..shape(op, x.s.rows, width, 0) })
        }
        Op::LinearNoBias => linear_no_bias(args),
        Op::AddBias => add_bias(args),
        Op::CrossEntropyMax | Op::CrossEntropySums | Op::CrossEntropyFinish => cross_entropy_part(op, args, ctx),
        Op::Swiglu | Op::SwigluBackward => swiglu(op, args),
        Op::LinearBackwardWeightNoBias => linear_backward_weight_no_bias(args),
        Op::Rotary | Op::RotaryBackward => rotary(op, args, ctx),
        Op::AttentionBlock
        | Op::AttentionBlockCausal
        | Op::AttentionBlockBackward
        | Op::AttentionBlockBackwardCausal
        | Op::AttentionRingInit
        | Op::AttentionRingFinish => attention_block(op, args, ctx),
        Op::ToBf16 => {
            let [x, y] = arguments(op, args)?;
            let width = y.elems(BF16, "bf16")?;
            x.want_rows(y.s.rows, "the rows of `y`")?;
            x.want_elems(width, WORD, "one f32 per bf16 of `y`")?;
            let elements = y.total(width)?;
            Ok(OpShape { elements, ..shape(op, y.s.rows, width, 0) })
        }
        Op::RingExchange => {
            let [x, y] = arguments(op, args)?;
            y.want_rows(x.s.rows, "the rows of `x`: a ring exchange receives what the previous rank sends")?;
            y.want_row_bytes(x.s.row_bytes, "the row width of `x`")?;
            Ok(shape(op, x.s.rows, 0, 0))
        }
        Op::DataAllReduceSumBf16 | Op::DataAllReduceSumF32 => {
            let [x] = arguments(op, args)?;
            let (elem, what) = if op == Op::DataAllReduceSumBf16 { (BF16, "bf16") } else { (WORD, "f32") };
            let width = x.elems(elem, what)?;
            let elements = x.total(width)?;
            Ok(OpShape { elements, ..shape(op, x.s.rows, width, 0) })
        }
    }
}

/// The head dimension `hidden / (heads * t)` of the context (rotary and the ring's blocks), with
/// the context's errors: no heads, or a hidden size that is not whole heads of an even width.
pub fn head_dim(op: Op, ctx: &ShapeContext) -> Result<u64, OpError> {
    let all_heads = ctx.heads.saturating_mul(ctx.group());
    if all_heads == 0 {
        return Err(OpError::context(op, "heads", "is 0; the op needs at least one head".into()));
    }
    let d = ctx.hidden / all_heads;
    if !ctx.hidden.is_multiple_of(all_heads) || d == 0 || !d.is_multiple_of(2) {
        let problem = format!(
            "is {}: it must be {all_heads} heads (`heads` x `ranks`) of an even, positive head dimension",
            ctx.hidden
        );
        return Err(OpError::context(op, "hidden", problem));
    }
    Ok(d)
}

/// `rotary` [x] and `rotary_backward` [dx]: rows of whole heads of the context's head dimension
/// (query or key/value heads), bf16; positions from the context ([`ShapeContext::position`]), so
/// `seq_len` must give them.
fn rotary(op: Op, args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    let [x] = arguments(op, args)?;
    let d = head_dim(op, ctx)?;
    let elems = x.elems(BF16, "bf16")?;
    if !elems.is_multiple_of(d) {
        return Err(x.error(format!("whole heads of the head dimension {d}"), format!("{elems} bf16 per row")));
    }
    if ctx.position(0).is_none() {
        let problem = format!(
            "is {} with context rank {} of {}: positions need a positive `seq_len`, even when c > 1, and a context \
             rank below c",
            ctx.seq_len,
            ctx.context_rank,
            ctx.context_group()
        );
        return Err(OpError::context(op, "seq_len", problem));
    }
    let elements = x.total(elems)?;
    Ok(OpShape { elements, ..shape(op, x.s.rows, elems, 0) })
}

/// The ring attention's ops (`spec/context-parallel.md`): `attention_block(_causal)` [q, k, v,
/// out_acc, lse], `attention_block_backward(_causal)` [q, k, v, out, lse, dout, dq_acc, dk_acc,
/// dv_acc], `attention_ring_init` [out_acc, lse], `attention_ring_finish` [out_acc, out]. Query
/// rows (`q`, `out`, `dout`) have the context's heads; `k`, `v` (any rows; a causal block's equal
/// to `q`'s) its K/V heads; the accumulators are f32 (`out_acc`, `dq_acc` like `q`, `dk_acc`,
/// `dv_acc` like `k`), `lse` one f32 per head per query row. `rows` are the query rows,
/// `features` the key rows, `width` a query row's elements; the geometry's `seq_len` is the key
/// rows and `sequences` 1 (a block needs no whole sequences).
fn attention_block(op: Op, args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    check_argument_count(op, args.len())?;
    let named = |index: usize| Arg::at(op, args, index);
    let d = head_dim(op, ctx)?;
    let heads = ctx.heads;
    let kv_heads = ctx.kv_heads_in_tensor();
    let (all_heads, first_query) = ctx.query_heads(op)?;
    let q_row = heads.saturating_mul(d).saturating_mul(BF16);
    let kv_row = kv_heads.saturating_mul(d).saturating_mul(BF16);
    let lse_row = heads.saturating_mul(WORD);
    // (position, row bytes, whether its rows are the keys' rather than the queries').
    let layout: &[(usize, u64, bool)] = match op {
        Op::AttentionRingInit => &[(0, q_row.saturating_mul(2), false), (1, lse_row, false)],
        Op::AttentionRingFinish => &[(0, q_row.saturating_mul(2), false), (1, q_row, false)],
        Op::AttentionBlock | Op::AttentionBlockCausal => &[
            (0, q_row, false),
            (1, kv_row, true),
            (2, kv_row, true),
            (3, q_row.saturating_mul(2), false),
            (4, lse_row, false),
        ],
        _ => &[
            (0, q_row, false),
            (1, kv_row, true),
            (2, kv_row, true),
            (3, q_row, false),
            (4, lse_row, false),
            (5, q_row, false),
            (6, q_row.saturating_mul(2), false),
            (7, kv_row.saturating_mul(2), true),
            (8, kv_row.saturating_mul(2), true),
        ],
    };
    let queries = named(0).s.rows;
    let keys = layout.iter().find(|l| l.2).map_or(0, |&(index, _, _)| named(index).s.rows);
    let causal = matches!(op, Op::AttentionBlockCausal | Op::AttentionBlockBackwardCausal);
    for &(index, row_bytes, key_rows) in layout {
        let arg = named(index);
        let why = match (index, row_bytes) {
            (_, b) if b == lse_row && arg.name == "lse" => "one f32 per head",
            (_, b) if b == q_row.saturating_mul(2) || b == kv_row.saturating_mul(2) => {
                "f32 of the heads of the context's head dimension"
            }
            _ => "the context's heads of its head dimension, bf16",
        };
        arg.want_row_bytes(row_bytes, why)?;
        if key_rows {
            arg.want_rows(keys, "the rows of `k`")?;
        } else {
            arg.want_rows(queries, if index == 0 { "its own rows" } else { "the rows of the first argument" })?;
        }
    }
    if causal && keys != queries {
        return Err(named(1)
            .error(format!("the rows of `q` ({queries}): a causal block is on the diagonal"), format!("{keys} rows")));
    }
    let geometry = AttentionShape {
        heads,
        kv_heads,
        group: all_heads / kv_heads,
        first_query,
        head_dim: d,
        seq_len: keys,
        sequences: 1,
    };
    let elems = heads.saturating_mul(d);
    Ok(OpShape { attention: Some(geometry), ..shape(op, queries, elems, keys) })
}

/// The matrix-product FLOPs of one ring attention block over `queries` x `keys` rows with
/// `elements` bf16 per query row (the heads of this GPU times the head dimension), counted as
/// `attention`'s are: `Q K^T` and `P V`, `2 * 2 * queries * keys * elements`, halved for a causal
/// block; its backward twice that. `None` on overflow.
pub fn attention_block_flops(queries: u64, keys: u64, elements: u64, causal: bool) -> Option<u64> {
    let full = u128::from(queries) * u128::from(keys) * u128::from(elements) * 4;
    u64::try_from(if causal { full / 2 } else { full }).ok()
}

/// `swiglu` [x, y] and `swiglu_backward` [x, dy, dx]: `x` (and `dx`) rows of `2w` bf16, the gate
/// then the up projection; `y` (and `dy`) rows of `w`. `width` is `w`.
fn swiglu(op: Op, args: &[ArgShape]) -> Result<OpShape, OpError> {
    check_argument_count(op, args.len())?;
    let named = |index: usize| Arg::at(op, args, index);
    let x = named(0);
    let both = x.elems(BF16, "bf16")?;
    // Zero-width rows are valid (nothing to compute), as for every other per-row op.
    if !both.is_multiple_of(2) {
        let expected = "a row of `[gate | up]`: an even number of bf16".into();
        return Err(x.error(expected, format!("{both} bf16 per row")));
    }
    let w = both / 2;
    let (half, whole): (&[usize], &[usize]) = if op == Op::Swiglu { (&[1], &[]) } else { (&[1], &[2]) };
    for &index in half {
        let arg = named(index);
        arg.want_rows(x.s.rows, "one row per row of `x`")?;
        arg.want_elems(w, BF16, "half the row width of `x`: the gated product")?;
    }
    for &index in whole {
        let arg = named(index);
        arg.want_rows(x.s.rows, "one row per row of `x`")?;
        arg.want_row_bytes(x.s.row_bytes, "the row width of `x`: `[dgate | dup]`")?;
    }
    let elements = x.total(w)?;
    Ok(OpShape { elements, ..shape(op, x.s.rows, w, 0) })
}

/// `linear_backward_weight_no_bias` [x, dy, dweight].
fn linear_backward_weight_no_bias(args: &[ArgShape]) -> Result<OpShape, OpError> {
    let op = Op::LinearBackwardWeightNoBias;
    let [x, dy, dweight] = arguments(op, args)?;
    let k = x.elems(BF16, "bf16")?;
    let n = dy.elems(BF16, "bf16")?;
    dy.want_rows(x.s.rows, "one gradient row per row of `x`")?;
    dweight.want_rows(n, "one row per output feature: the row width of `dy`")?;
    dweight.want_elems(k, BF16, "one bf16 per input feature: the row width of `x`")?;
    Ok(shape(op, x.s.rows, k, n))
}

/// `all_gather` [x, y]: `y` is `t` times `x`'s rows, of the same width. `reduce_scatter` [x, y]:
/// bf16, `x` is `t` times `y`'s rows. `width` is 0 (the op knows no element type for the
/// all-gather) and `rows` are `x`'s.
fn gather_scatter(op: Op, args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    let [x, y] = arguments(op, args)?;
    let t = ctx.group();
    y.want_row_bytes(x.s.row_bytes, "the row width of `x`")?;
    if op == Op::AllGather {
        match x.s.rows.checked_mul(t) {
            Some(rows) => y.want_rows(rows, "`ranks` times the rows of `x`: every rank's rows, rank-major")?,
            None => return Err(y.error("fewer than 2^64 rows".into(), format!("{} rows x {t} ranks", x.s.rows))),
        }
    } else {
        x.elems(BF16, "bf16")?;
        match y.s.rows.checked_mul(t) {
            Some(rows) => x.want_rows(rows, "`ranks` times the rows of `y`: one share per rank, rank-major")?,
            None => return Err(x.error("fewer than 2^64 rows".into(), format!("{} rows x {t} ranks", y.s.rows))),
        }
    }
    Ok(shape(op, x.s.rows, 0, 0))
}

/// `linear_no_bias` [x, weight, y].
fn linear_no_bias(args: &[ArgShape]) -> Result<OpShape, OpError> {
    let op = Op::LinearNoBias;
    let [x, weight, y] = arguments(op, args)?;
    let k = x.elems(BF16, "bf16")?;
    let n = weight.s.rows;
    weight.want_elems(k, BF16, "one bf16 weight per input feature: the row width of `x`")?;
    y.want_rows(x.s.rows, "one output row per row of `x`")?;
    y.want_elems(n, BF16, "one bf16 per output feature: the rows of `weight`")?;
    Ok(shape(op, x.s.rows, k, n))
}

/// `add_bias` [bias, y]: one bf16 bias row, as wide as `y`'s rows.
fn add_bias(args: &[ArgShape]) -> Result<OpShape, OpError> {
    let op = Op::AddBias;
    let [bias, y] = arguments(op, args)?;
    bias.want_rows(1, "a bias is one row")?;
    let width = bias.elems(BF16, "bf16")?;
    y.want_row_bytes(bias.s.row_bytes, "the row width of `bias`")?;
    let elements = y.total(width)?;
    Ok(OpShape { elements, ..shape(op, y.s.rows, width, 0) })
}

/// `cross_entropy_max` [logits, max], `cross_entropy_sums` [logits, targets, max, sums],
/// `cross_entropy_finish` [logits, targets, max, sums, loss]: logits of `V'` bf16 columns, one
/// u32 target, one f32 max and two f32 sums per row.
fn cross_entropy_part(op: Op, args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    check_argument_count(op, args.len())?;
    let named = |index: usize| Arg::at(op, args, index);
    ctx.check_rank(op)?;
    let logits = named(0);
    logits.want_elems(ctx.vocab_shard(), BF16, "one bf16 per column of this rank: `ceil(vocab / ranks)`")?;
    let rows = logits.s.rows;
    let (targets, max, sums) = match op {
        Op::CrossEntropyMax => (None, named(1), None),
        _ => (Some(named(1)), named(2), Some(named(3))),
    };
    if let Some(targets) = targets {
        targets.want_rows(rows, "one target per row of `logits`")?;
        targets.want_row_bytes(WORD, "one u32 target per row")?;
    }
    max.want_rows(rows, "one maximum per row of `logits`")?;
    max.want_row_bytes(WORD, "one f32 maximum per row")?;
    if let Some(sums) = sums {
        sums.want_rows(rows, "one pair of sums per row of `logits`")?;
        sums.want_row_bytes(2 * WORD, "two f32 per row: the sum of exponentials and the target's logit")?;
    }
    if op == Op::CrossEntropyFinish {
        let loss = named(4);
        loss.want_rows(1, "the loss is one f32")?;
        loss.want_row_bytes(WORD, "the loss is one f32")?;
        if ctx.loss_scale_tokens == 0 {
            return Err(OpError::context(
                op,
                "loss_scale_tokens",
                "is 0; it must be the step's token count b*s".into(),
            ));
        }
    }
    Ok(shape(op, rows, ctx.vocab_shard(), 0))
}

/// One argument, named, for the rules below.
#[derive(Clone, Copy)]
struct Arg {
    op: Op,
    name: &'static str,
    s: ArgShape,
}

/// The `N` arguments of `op`, after the count check.
fn arguments<const N: usize>(op: Op, args: &[ArgShape]) -> Result<[Arg; N], OpError> {
    check_argument_count(op, args.len())?;
    if N != args.len() {
        // A rule written for another arity than the signature's: the table is wrong.
        return Err(OpError {
            op,
            argument: None,
            kind: OpErrorKind::ArgumentCount { expected: N, found: args.len() },
        });
    }
    Ok(core::array::from_fn(|index| Arg::at(op, args, index)))
}

impl Arg {
    /// Argument `index` of a launch of `op` (after the count check, so it is there).
    fn at(op: Op, args: &[ArgShape], index: usize) -> Self {
        Arg { op, name: argument_name(op, index).unwrap_or("?"), s: args.get(index).copied().unwrap_or_default() }
    }

    fn error(&self, expected: String, found: String) -> OpError {
        OpError { op: self.op, argument: Some(self.name), kind: OpErrorKind::Shape { expected, found } }
    }

    /// Elements per row, for elements of `elem` bytes (`what` names the element type).
    fn elems(&self, elem: u64, what: &str) -> Result<u64, OpError> {
        if !self.s.row_bytes.is_multiple_of(elem) {
            let expected = format!("a row of whole {what} elements (a multiple of {elem} bytes)");
            return Err(self.error(expected, format!("{} bytes per row", self.s.row_bytes)));
        }
        Ok(self.s.row_bytes / elem)
    }

    /// Bytes per row: `expected` bytes, `why` says where the number comes from.
    fn want_row_bytes(&self, expected: u64, why: &str) -> Result<(), OpError> {
        if self.s.row_bytes == expected {
            return Ok(());
        }
        Err(self.error(format!("{expected} bytes per row ({why})"), format!("{} bytes per row", self.s.row_bytes)))
    }

    /// Bytes per row: `count` elements of `elem` bytes (`count` may come from another argument or
    /// the context, so the product is checked).
    fn want_elems(&self, count: u64, elem: u64, why: &str) -> Result<(), OpError> {
        match count.checked_mul(elem) {
            Some(bytes) => self.want_row_bytes(bytes, why),
            None => Err(self.error(
                format!("{count} elements of {elem} bytes per row ({why}), more than memory holds"),
                format!("{} bytes per row", self.s.row_bytes),
            )),
        }
    }

    /// The row count.
    fn want_rows(&self, expected: u64, why: &str) -> Result<(), OpError> {
        if self.s.rows == expected {
            return Ok(());
        }
        Err(self.error(format!("{expected} rows ({why})"), format!("{} rows", self.s.rows)))
    }

    /// `rows * per_row` elements, checked to fit 64 bits.
    fn total(&self, per_row: u64) -> Result<u64, OpError> {
        self.s
            .rows
            .checked_mul(per_row)
            .ok_or_else(|| self.error("fewer than 2^64 elements".into(), format!("{} rows of {per_row}", self.s.rows)))
    }

    /// A `1 x hidden` bf16 vector: a norm's scale, shift or their gradients.
    fn norm_vector(&self, hidden: u64) -> Result<(), OpError> {
        self.want_rows(1, "a norm's scale and shift are one row")?;
        self.want_elems(hidden, BF16, HIDDEN)
    }

    /// A one-f32 scalar.
    fn scalar(&self) -> Result<(), OpError> {
        self.want_rows(1, "a scalar is one row")?;
        self.want_row_bytes(WORD, "a scalar is one f32")
    }

    /// One rank's shard of the tied embedding (or its gradient): `ceil(vocab / ranks)` rows of
    /// `hidden` bf16 (`vocab` rows with one rank).
    fn tied_embedding(&self, ctx: &ShapeContext) -> Result<(), OpError> {
        let why = "this rank's share of the vocabulary size `vocab` of the context: `ceil(vocab / ranks)`";
        self.want_rows(ctx.vocab_shard(), why)?;
        self.want_elems(ctx.hidden, BF16, HIDDEN)
    }

    /// The whole (gathered) embedding table or its gradient: `ranks * ceil(vocab / ranks)` rows
    /// of `hidden` bf16 (`vocab` rows with one rank).
    fn whole_embedding(&self, ctx: &ShapeContext) -> Result<(), OpError> {
        let rows = ctx.vocab_shard().saturating_mul(ctx.group());
        let why =
            "the vocabulary size `vocab` of the context, padded to every rank's rows: `ranks * ceil(vocab / ranks)`";
        self.want_rows(rows, why)?;
        self.want_elems(ctx.hidden, BF16, HIDDEN)
    }
}

fn shape(op: Op, rows: u64, width: u64, features: u64) -> OpShape {
    OpShape { op, rows, width, features, elements: rows.saturating_mul(width), attention: None }
}

/// `embedding` [tokens, embedding, out] and `embedding_backward` [tokens, dout, dembedding].
fn embedding(args: &[ArgShape], ctx: &ShapeContext, op: Op) -> Result<OpShape, OpError> {
    let [tokens, rows_arg, table] = arguments(op, args)?;
    // The forward reads the table (argument 1) into `out` (2); the backward scatters `dout` (1)
    // into the table's gradient (2).
    let (table, per_token, table_name) = match op {
        Op::Embedding => (rows_arg, table, "embedding"),
        _ => (table, rows_arg, "dembedding"),
    };
    table.whole_embedding(ctx)?;
    let why_rows = if op == Op::Embedding { "one row per token" } else { "one gradient row per token" };
    per_token.want_rows(tokens.s.rows, why_rows)?;
    per_token.want_row_bytes(table.s.row_bytes, &format!("the row width of `{table_name}`"))?;
    tokens.want_row_bytes(WORD, "one u32 token id per row")?;
    Ok(shape(op, tokens.s.rows, table.s.row_bytes / BF16, table.s.rows))
}

/// The norms: `layer_norm` [x, scale, shift, y], `layer_norm_backward` [x, scale, dy, dx,
/// dscale, dshift], `rms_norm` [x, scale, y], `rms_norm_backward` [x, scale, dy, dx, dscale]: by
/// their names in the signature, the rows (`x`, `y`, `dy`, `dx`) are `h` bf16 wide, one per row
/// of `x`, and the vectors (`scale`, `shift` and their gradients) one row of `h` bf16.
fn norm(op: Op, args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    check_argument_count(op, args.len())?;
    let h = ctx.hidden;
    let x = Arg::at(op, args, 0);
    x.want_elems(h, BF16, HIDDEN)?;
    for index in 1..args.len() {
        let arg = Arg::at(op, args, index);
        match arg.name {
            "scale" | "shift" | "dscale" | "dshift" => arg.norm_vector(h)?,
            _ => {
                let why = if arg.name == "dy" { "one gradient row per row of `x`" } else { "one row per row of `x`" };
                arg.want_rows(x.s.rows, why)?;
                arg.want_elems(h, BF16, HIDDEN)?;
            }
        }
    }
    Ok(shape(op, x.s.rows, h, 0))
}

/// `linear` [x, weight, bias, y]: `k` input features (the width of `x`), `n` output features
/// (the rows of `weight`).
fn linear(args: &[ArgShape]) -> Result<OpShape, OpError> {
    let op = Op::Linear;
    let [x, weight, bias, y] = arguments(op, args)?;
    let k = x.elems(BF16, "bf16")?;
    let n = weight.s.rows;
    weight.want_elems(k, BF16, "one bf16 weight per input feature: the row width of `x`")?;
    bias.want_rows(1, "a bias is one row")?;
    bias.want_elems(n, BF16, "one bf16 per output feature: the rows of `weight`")?;
    y.want_rows(x.s.rows, "one output row per row of `x`")?;
    y.want_elems(n, BF16, "one bf16 per output feature: the rows of `weight`")?;
    Ok(shape(op, x.s.rows, k, n))
}

/// `linear_backward_input(_accumulate)` [dy, weight, dx].
fn linear_backward_input(op: Op, args: &[ArgShape]) -> Result<OpShape, OpError> {
    let [dy, weight, dx] = arguments(op, args)?;
    let n = dy.elems(BF16, "bf16")?;
    weight.want_rows(n, "one weight row per output feature: the row width of `dy`")?;
    let k = weight.elems(BF16, "bf16")?;
    dx.want_rows(dy.s.rows, "one row per row of `dy`")?;
    dx.want_elems(k, BF16, "one bf16 per input feature: the row width of `weight`")?;
    Ok(shape(op, dy.s.rows, k, n))
}

/// `linear_backward_weight` [x, dy, dweight, dbias].
fn linear_backward_weight(args: &[ArgShape]) -> Result<OpShape, OpError> {
    let op = Op::LinearBackwardWeight;
    let [x, dy, dweight, dbias] = arguments(op, args)?;
    let k = x.elems(BF16, "bf16")?;
    let n = dy.elems(BF16, "bf16")?;
    dy.want_rows(x.s.rows, "one gradient row per row of `x`")?;
    dweight.want_rows(n, "one row per output feature: the row width of `dy`")?;
    dweight.want_elems(k, BF16, "one bf16 per input feature: the row width of `x`")?;
    dbias.want_rows(1, "a bias gradient is one row")?;
    dbias.want_elems(n, BF16, "one bf16 per output feature: the row width of `dy`")?;
    Ok(shape(op, x.s.rows, k, n))
}

/// `classifier` [x, embedding, logits] and `classifier_backward_weight` [x, dlogits,
/// dembedding]: `hidden` input features, `vocab` output features.
fn classifier(op: Op, args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    let [x, second, third] = arguments(op, args)?;
    let (table, logits, why) = match op {
        Op::Classifier => (second, third, "one row of logits per row of `x`"),
        _ => (third, second, "one gradient row per row of `x`"),
    };
    table.tied_embedding(ctx)?;
    x.want_elems(ctx.hidden, BF16, HIDDEN)?;
    logits.want_rows(x.s.rows, why)?;
    logits.want_elems(ctx.vocab_shard(), BF16, "one bf16 per embedding row of this rank")?;
    Ok(shape(op, x.s.rows, ctx.hidden, ctx.vocab_shard()))
}

/// `gelu` [x, y], `gelu_backward` [x, dy, dx], `add` [a, b, y]: every argument has the first's
/// shape, bf16.
fn elementwise(op: Op, args: &[ArgShape]) -> Result<OpShape, OpError> {
    check_argument_count(op, args.len())?;
    let named = |index: usize| Arg::at(op, args, index);
    let first = named(0);
    let width = first.elems(BF16, "bf16")?;
    for index in 1..args.len() {
        let other = named(index);
        other.want_rows(first.s.rows, &format!("the rows of `{}`", first.name))?;
        other.want_row_bytes(first.s.row_bytes, &format!("the row width of `{}`", first.name))?;
    }
    let elements = first.total(width)?;
    Ok(OpShape { elements, ..shape(op, first.s.rows, width, 0) })
}

/// `cross_entropy` [logits, targets, loss].
fn cross_entropy(args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    let op = Op::CrossEntropy;
    let [logits, targets, loss] = arguments(op, args)?;
    if ctx.group() > 1 {
        let problem = format!(
            "is {}; the whole-vocabulary cross_entropy needs one rank (use cross_entropy_max, _sums and _finish)",
            ctx.ranks
        );
        return Err(OpError::context(op, "ranks", problem));
    }
    logits.want_elems(ctx.vocab, BF16, "one bf16 per vocabulary entry (`vocab` of the context)")?;
    targets.want_rows(logits.s.rows, "one target per row of `logits`")?;
    targets.want_row_bytes(WORD, "one u32 target per row")?;
    loss.want_rows(1, "the loss is one f32")?;
    loss.want_row_bytes(WORD, "the loss is one f32")?;
    if ctx.loss_scale_tokens == 0 {
        return Err(OpError::context(op, "loss_scale_tokens", "is 0; it must be the step's token count b*s".into()));
    }
    Ok(shape(op, logits.s.rows, ctx.vocab, 0))
}

/// `grad_norm_squared` [grad, sum_squares].
fn grad_norm_squared(args: &[ArgShape]) -> Result<OpShape, OpError> {
    let op = Op::GradNormSquared;
    let [grad, sum_squares] = arguments(op, args)?;
    let width = grad.elems(BF16, "bf16")?;
    let elements = grad.total(width)?;
    sum_squares.scalar()?;
    Ok(OpShape { elements, ..shape(op, grad.s.rows, width, 0) })
}

/// `adamw` [parameter, grad, optimizer_state, grad_norm_squared].
fn adamw(args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    let op = Op::AdamW;
    let [parameter, grad, state, norm] = arguments(op, args)?;
    let e = parameter.elems(BF16, "bf16")?;
    grad.want_rows(parameter.s.rows, "the rows of `parameter`")?;
    grad.want_row_bytes(parameter.s.row_bytes, "the row width of `parameter`")?;
    state.want_rows(parameter.s.rows, "one state row per row of `parameter`")?;
    state.want_elems(e, 3 * WORD, "f32 master weight, m and v per element of a `parameter` row")?;
    norm.scalar()?;
    if ctx.adamw_step == 0 {
        let problem = "is 0; steps count from 1 (bias correction divides by 1 - beta^step)";
        return Err(OpError::context(op, "adamw.step", problem.into()));
    }
    let elements = parameter.total(e)?;
    Ok(OpShape { elements, ..shape(op, parameter.s.rows, e, 0) })
}

/// Signature positions of attention arguments, each with whether it is shaped like `k` (else
/// like `q`).
type Positions = &'static [(usize, bool)];

/// `attention` [q, k, v, out, lse] and `attention_backward` [q, k, v, out, lse, dout, dq, dk,
/// dv]: `q` sets the geometry; `k` and `v` (and `dk`, `dv`) have `q`'s rows and the context's
/// key/value heads of `q`'s head dimension; `out`, `dout`, `dq` have `q`'s shape; inputs start on
/// a sequence; `lse` is one f32 per query head per row.
fn attention(op: Op, args: &[ArgShape], ctx: &ShapeContext) -> Result<OpShape, OpError> {
    check_argument_count(op, args.len())?;
    let named = |index: usize| Arg::at(op, args, index);
    let (heads, kv_heads, s) = (ctx.heads, ctx.kv_heads_in_tensor(), ctx.seq_len);
    if heads == 0 {
        return Err(OpError::context(op, "heads", "is 0; attention needs at least one head".into()));
    }
    if s == 0 {
        return Err(OpError::context(op, "seq_len", "is 0; it must be the rows of one sequence".into()));
    }
    // The query heads per K/V head of the whole model, and this launch's first query head as K
    // counts them.
    let (all_heads, first_query) = ctx.query_heads(op)?;
    let group = all_heads / kv_heads;
    let q = named(0);
    let elems = q.elems(BF16, "bf16")?;
    let head_dim = elems / heads;
    if !elems.is_multiple_of(heads) || head_dim == 0 || !head_dim.is_multiple_of(2) {
        let expected = format!(
            "a row of `heads` ({heads}) heads of an even, positive head dimension (rotary positions rotate pairs)"
        );
        return Err(q.error(expected, format!("{elems} bf16 per row")));
    }
    if !q.s.first_row.is_multiple_of(s) || !q.s.rows.is_multiple_of(s) {
        let expected = format!("whole sequences of `seq_len` = {s} rows (positions are row % seq_len)");
        let found = format!("rows {}..{}", q.s.first_row, q.s.first_row.saturating_add(q.s.rows));
        return Err(q.error(expected, found));
    }
    let kv_row = kv_heads.saturating_mul(head_dim).saturating_mul(BF16);
    // Signature positions: inputs (they start on a sequence) shaped like `q` or like `k`, `lse`,
    // and outputs shaped like `q` or like `k`.
    let (inputs, lse, outputs): (Positions, usize, Positions) = if op == Op::Attention {
        (&[(1, true), (2, true)], 4, &[(3, false)])
    } else {
        (&[(1, true), (2, true), (3, false), (5, false)], 4, &[(6, false), (7, true), (8, true)])
    };
    let like = |arg: &Arg, key_value: bool| -> Result<(), OpError> {
        arg.want_rows(q.s.rows, "the rows of `q`")?;
        if key_value {
            arg.want_row_bytes(kv_row, "the context's `kv_heads` heads of `q`'s head dimension")
        } else {
            arg.want_row_bytes(q.s.row_bytes, "the row width of `q`")
        }
    };
    for &(index, key_value) in inputs {
        let arg = named(index);
        like(&arg, key_value)?;
        if !arg.s.first_row.is_multiple_of(s) {
            let expected = format!("whole sequences of `seq_len` = {s} rows");
            return Err(arg.error(expected, format!("first row {}", arg.s.first_row)));
        }
    }
    if op == Op::Attention {
        for &(index, key_value) in outputs {
            like(&named(index), key_value)?;
        }
    }
    let lse = named(lse);
    lse.want_rows(q.s.rows, "the rows of `q`")?;
    lse.want_elems(heads, WORD, "one f32 per head")?;
    if op == Op::AttentionBackward {
        for &(index, key_value) in outputs {
            like(&named(index), key_value)?;
        }
    }
    let geometry =
        AttentionShape { heads, kv_heads, group, first_query, head_dim, seq_len: s, sequences: q.s.rows / s };
    Ok(OpShape { attention: Some(geometry), ..shape(op, q.s.rows, elems, 0) })
}

#[cfg(test)]
mod tests {
    use alloc::string::ToString;

    use super::*;

    fn arg(rows: u64, row_bytes: u64) -> ArgShape {
        ArgShape { first_row: 0, rows, row_bytes }
    }

    fn context() -> ShapeContext {
        ShapeContext {
            hidden: 4,
            heads: 2,
            seq_len: 3,
            vocab: 5,
            loss_scale_tokens: 6,
            adamw_step: 1,
            rank: 0,
            ranks: 1,
            ..ShapeContext::default()
        }
    }

    #[test]
    fn a_linear_launch_gives_its_dimensions_and_flops() {
        let shape = check(Op::Linear, &[arg(6, 8), arg(3, 8), arg(1, 6), arg(6, 6)], &context()).unwrap();
        assert_eq!((shape.rows, shape.width, shape.features), (6, 4, 3));
        assert_eq!(shape.matmul_flops(), 2 * 6 * 4 * 3);
        assert_eq!(matmul_flops(u64::MAX, 2, 1), None);
    }

    #[test]
    fn errors_name_the_op_the_argument_and_the_rule() {
        let error = check(Op::Linear, &[arg(6, 8), arg(3, 6), arg(1, 6), arg(6, 6)], &context()).unwrap_err();
        assert_eq!(error.argument, Some("weight"));
        assert_eq!(
            error.to_string(),
            "op `linear`, argument `weight`: expected 8 bytes per row (one bf16 weight per input feature: the row \
             width of `x`), found 6 bytes per row"
        );
        let error = check(Op::Gelu, &[arg(1, 2)], &context()).unwrap_err();
        assert_eq!(error.kind, OpErrorKind::ArgumentCount { expected: 2, found: 1 });
        assert_eq!(
            error.to_string(),
            "op `gelu`: 1 arguments, but the op takes 2 (x, y); the plan or the interpreter is wrong"
        );
    }

    #[test]
    fn attention_checks_whole_sequences_and_gives_the_geometry() {
        let q = ArgShape { first_row: 3, rows: 6, row_bytes: 16 };
        let lse = ArgShape { first_row: 3, rows: 6, row_bytes: 8 };
        let shape = check(Op::Attention, &[q, q, q, q, lse], &context()).unwrap();
        assert_eq!(
            shape.attention,
            Some(AttentionShape {
                heads: 2,
                kv_heads: 2,
                group: 1,
                first_query: 0,
                head_dim: 4,
                seq_len: 3,
                sequences: 2
            })
        );
        let k = ArgShape { first_row: 1, ..q };
        let error = check(Op::Attention, &[q, k, q, q, lse], &context()).unwrap_err();
        assert!(error.to_string().contains("argument `k`: expected whole sequences"), "{error}");
    }

    /// Context rank k of c holds chunks k and 2c-1-k of each sequence (spec/context-parallel.md):
    /// with s = 16, c = 2 (L = 8 local rows per sequence, chunks of n = 4), rank 0 holds positions
    /// 0-3 and 12-15, rank 1 positions 4-11; the next sequence starts over.
    #[test]
    fn positions_follow_the_load_balanced_chunks() {
        let ctx = |k, c, seq_len| ShapeContext { context_rank: k, context_ranks: c, seq_len, ..context() };
        let rank0: alloc::vec::Vec<u64> = (0..10).map(|r| ctx(0, 2, 8).position(r).unwrap()).collect();
        assert_eq!(rank0, [0, 1, 2, 3, 12, 13, 14, 15, 0, 1]);
        let rank1: alloc::vec::Vec<u64> = (0..8).map(|r| ctx(1, 2, 8).position(r).unwrap()).collect();
        assert_eq!(rank1, [4, 5, 6, 7, 8, 9, 10, 11]);
        // c = 1: row % seq_len, whatever the parity (the default context is c = 1).
        assert_eq!(ctx(0, 0, 3).position(7), Some(1));
        // Refused: no sequence, an odd one at c > 1, a rank past c.
        assert_eq!((ctx(0, 2, 0).position(0), ctx(0, 2, 7).position(0), ctx(2, 2, 8).position(0)), (None, None, None));
    }

    /// The ring's ops: block shapes (queries x keys, f32 accumulators), a causal block on the
    /// diagonal only, FLOPs counted like attention's (halved when causal, doubled backward), the
    /// exchange's two sides equal, rotary on whole heads.
    #[test]
    fn the_ring_ops_check_their_shapes_and_count_their_flops() {
        // h = 4, 2 heads of 2: q rows of 8 bytes, lse of 8, out_acc of 16.
        let ctx = ShapeContext { context_ranks: 2, seq_len: 4, ..context() };
        let (q, k, acc, lse) = (arg(2, 8), arg(4, 8), arg(2, 16), arg(2, 8));
        let block = check(Op::AttentionBlock, &[q, k, k, acc, lse], &ctx).unwrap();
        assert_eq!((block.rows, block.features, block.width), (2, 4, 4));
        assert_eq!(block.matmul_flops(), 4 * 2 * 4 * 4);
        let causal = check(Op::AttentionBlockCausal, &[q, q, q, acc, lse], &ctx).unwrap();
        assert_eq!(causal.matmul_flops(), 4 * 2 * 2 * 4 / 2);
        let error = check(Op::AttentionBlockCausal, &[q, k, k, acc, lse], &ctx).unwrap_err();
        assert!(error.to_string().contains("a causal block is on the diagonal"), "{error}");
        let error = check(Op::AttentionBlock, &[q, k, k, arg(2, 8), lse], &ctx).unwrap_err();
        assert_eq!(error.argument, Some("out_acc"));
        let (kacc, dq) = (arg(4, 16), arg(2, 16));
        let backward = check(Op::AttentionBlockBackward, &[q, k, k, q, lse, q, dq, kacc, kacc], &ctx).unwrap();
        assert_eq!(backward.matmul_flops(), 2 * block.matmul_flops());
        assert!(check(Op::RingExchange, &[arg(3, 8), arg(3, 8)], &ctx).is_ok());
        let error = check(Op::RingExchange, &[arg(3, 8), arg(2, 8)], &ctx).unwrap_err();
        assert_eq!(error.argument, Some("y"));
        assert_eq!(check(Op::ToBf16, &[arg(3, 16), arg(3, 8)], &ctx).unwrap().elements, 12);
        assert!(check(Op::ToBf16, &[arg(3, 8), arg(3, 8)], &ctx).is_err());
        assert!(check(Op::Rotary, &[arg(5, 8)], &ctx).is_ok());
        assert!(check(Op::Rotary, &[arg(5, 6)], &ctx).is_err(), "3 bf16 are not whole heads of 2");
        let odd = ShapeContext { seq_len: 3, ..ctx };
        let error = check(Op::Rotary, &[arg(5, 8)], &odd).unwrap_err();
        assert!(matches!(error.kind, OpErrorKind::Context { field: "seq_len", .. }), "{error}");
        // Every new op is on the collective stream exactly when it is a collective.
        for op in [Op::RingExchange, Op::DataAllReduceSumBf16, Op::DataAllReduceSumF32] {
            assert_eq!(op.stream(), crate::plan::Stream::Collective);
            assert!(!op.is_collective(), "{op:?} is not the tensor group's");
        }
        assert_eq!(Op::Rotary.stream(), crate::plan::Stream::Compute);
    }

    /// The ring's ops with huge contexts and shapes give errors or shapes, never a panic
    /// (overflowing widths saturate and then mismatch).
    #[test]
    fn the_ring_ops_never_panic_on_huge_values() {
        let huge = [0, 1, 2, 3, u64::MAX / 3, u64::MAX / 2, u64::MAX - 1, u64::MAX];
        for &op in Op::ALL.iter().filter(|op| op.is_context_parallel()) {
            for (i, &value) in huge.iter().enumerate() {
                let other = huge[(i * 5 + 3) % huge.len()];
                let ctx = ShapeContext {
                    hidden: value,
                    heads: other,
                    kv_heads: value,
                    seq_len: other,
                    context_rank: value,
                    context_ranks: other,
                    ..context()
                };
                let args: alloc::vec::Vec<ArgShape> = (0..op.signature().len())
                    .map(|a| ArgShape { first_row: value, rows: huge[(i + a) % huge.len()], row_bytes: other })
                    .collect();
                let _ = check(op, &args, &ctx);
                let _ = ctx.position(value);
            }
        }
    }

    #[test]
    fn every_op_refuses_a_wrong_argument_count_without_panicking() {
        for &op in Op::ALL {
            let too_many = [ArgShape::default(); 12];
            let error = check(op, &too_many, &context()).unwrap_err();
            assert_eq!(error.kind, OpErrorKind::ArgumentCount { expected: op.signature().len(), found: 12 });
        }
    }
}
