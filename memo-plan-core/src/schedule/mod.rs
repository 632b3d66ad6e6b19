//! The schedule: one training step of one GPU as an instruction stream over buffers
//! (`ARCHITECTURE.md` "The data path"; `docs/technique.md` section 1, "Execution"). Buffers come out without places;
//! `bilevel` places them.
//!
//! The step, in issue order:
//! 1. the embedding writes layer 0's input;
//! 2. each layer's forward (`layer.rs`); after a swapped layer, the compute stream records an
//!    event, and the device-to-host stream waits for it and copies the layer's swapped data to its
//!    host slots, then records "swapped out";
//! 3. the final norm, then the classifier and cross-entropy in chunks of rows (full logits are
//!    never materialised), each chunk's backward right after its loss, then the final norm's
//!    backward;
//! 4. each layer's backward, last layer first: a swapped layer's data comes back on the
//!    host-to-device stream while the layer above runs its backward; the compute stream waits
//!    for it, recomputes the rows that were not swapped, and runs the backward;
//! 5. the embedding's backward, the gradient norm, AdamW on every parameter.
//!
//! Rounding buffers (`memo`, `full-swap`): layer `l` keeps its skeletal set in rounding buffer
//! `l % 2`. Before the compute stream first writes a rounding buffer whose previous occupant is
//! being swapped out, it waits for that copy ([`Builder::launch`] inserts the wait, so no op can
//! forget it). Before the host-to-device stream refills a rounding buffer, it waits for the
//! backward that last read it.

mod layer;
mod scratch;

use alloc::vec::Vec;
use core::fmt;

use crate::cost::{self, AttentionFlops};
use crate::model::{Architecture, ModelConfig, ModelError, Parallelism, BF16_BYTES, FP32_BYTES};
use crate::plan::shapes;
use crate::plan::{
    Action, Arg, Buffer, BufferId, BufferKind, EventId, Instruction, Launch, Op, Place, Region, Strategy, Stream,
    TensorRole, TensorRows,
};

pub use layer::SKELETAL_ROLES;
pub use scratch::add_scratch;

mod ring;

/// Bytes of one token id or target (u32).
const TOKEN_ID_BYTES: u64 = 4;

/// The most logits bytes one classifier chunk may hold: chunks are as many rows as fit, at least
/// one. 256 MiB keeps the logits a small share of device memory at any vocabulary.
pub const LOGITS_CHUNK_BYTES: u64 = 256 << 20;

/// Which part of a layer a transient belongs to: its level-1 block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// The layer's forward.
    Forward,
    /// The layer's recompute and backward.
    Backward,
}

/// A level-1 block: one layer's forward or backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Block {
    /// The layer.
    pub layer: u32,
    /// Forward or backward.
    pub phase: Phase,
}

/// What the schedule needs to know beyond the model: the strategy and the rows it swaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleOptions {
    /// How activations are kept.
    pub strategy: Strategy,
    /// For `memo`: `floor(alpha * 2^32)`, the swap fraction in fixed point (so the schedule is
    /// integer arithmetic). Ignored by the other strategies (full-swap swaps every row).
    pub alpha_fixed: u64,
}

/// The fixed-point scale of [`ScheduleOptions::alpha_fixed`].
pub const ALPHA_ONE: u64 = 1 << 32;

/// `floor(alpha * rows)` in fixed point.
pub fn swapped_rows(rows: u64, alpha_fixed: u64) -> u64 {
    let alpha = alpha_fixed.min(ALPHA_ONE);
    // < 2^96: fits u128.
    ((u128::from(rows) * u128::from(alpha)) >> 32) as u64
}

/// The swap fraction as [`super::ScheduleOptions::alpha_fixed`] wants it.
pub fn alpha_to_fixed(alpha: f64) -> u64 {
    if alpha.is_nan() || alpha <= 0.0 {
        return 0;
    }
    if alpha >= 1.0 {
        return ALPHA_ONE;
    }
    libm::floor(alpha * ALPHA_ONE as f64) as u64
}

/// The schedule of one step: buffers (places not yet chosen) and instructions.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Every buffer, place `Device { offset: 0 }` or `Host { offset: 0 }` until placed.
    pub buffers: Vec<Buffer>,
    /// For each buffer, the level-1 block it belongs to (per-layer transients only).
    pub blocks: Vec<Option<Block>>,
    /// The instruction stream.
    pub instructions: Vec<Instruction>,
    /// Events used.
    pub events: u32,
    /// Rows of the sequence-sharded token-split tensors that are swapped (`memo`: `floor(alpha *
    /// rows)`; `full-swap`: all; otherwise 0).
    pub swapped_rows: u64,
}

/// Why no schedule could be made.
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleError {
    /// The model or layout is invalid, or a size overflows.
    Model(ModelError),
    /// A FLOP count of one launch does not fit in 64 bits.
    FlopsOverflow {
        /// The op.
        op: &'static str,
    },
    /// A context rank's program would use other buffers, blocks or events than context rank 0's
    /// (the programs may differ only in the ring's row ranges, so that one placement serves them
    /// all): a planner bug, refused rather than placed wrongly.
    ContextRanksDiffer {
        /// The context rank whose program differs.
        context_rank: u64,
    },
}

impl From<ModelError> for ScheduleError {
    fn from(error: ModelError) -> Self {
        ScheduleError::Model(error)
    }
}

impl From<cost::CostError> for ScheduleError {
    fn from(error: cost::CostError) -> Self {
        match error {
            cost::CostError::Model(error) => ScheduleError::Model(error),
            _ => ScheduleError::FlopsOverflow { op: "attention" },
        }
    }
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::Model(error) => error.fmt(f),
            ScheduleError::FlopsOverflow { op } => write!(
                f,
                "the FLOPs of one {op} launch do not fit in 64 bits: the sequence is too long for this model; \
                 use fewer tokens or a higher tensor-parallel degree"
            ),
            ScheduleError::ContextRanksDiffer { context_rank } => write!(
                f,
                "context rank {context_rank}'s program uses other buffers than context rank 0's, where only the \
                 ring's row ranges may differ: a planner bug, nothing was placed; plan with --cp 1 and report the \
                 command"
            ),
        }
    }
}

impl core::error::Error for ScheduleError {}

/// One GPU's sizes, all checked once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub layers: u32,
    pub tensor: u64,
    /// Rows of sequence-sharded activations: `b * s / (c t)`.
    pub local_rows: u64,
    /// Rows of head-sharded activations: `b * s / c`, this context-parallel rank's tokens (equal
    /// to `local_rows` when `t = 1`).
    pub full_rows: u64,
    /// `h * 2`: a row of a sequence-sharded activation.
    pub hidden_row: u64,
    /// `h / t * 2`: a row of q, k, v, the attention output.
    pub head_row: u64,
    /// `heads / t * 4`: a row of the log-sum-exp.
    pub lse_row: u64,
    /// `f / t * 2`: a row of the FFN activation's output (GeLU's or SwiGLU's) and of its
    /// gradient.
    pub ffn_row: u64,
    /// A row of FC1's output and its gradient: `f / t * 2` (GeLU) or `2f / t * 2` (SwiGLU's gate
    /// and up).
    pub fc1_row: u64,
    /// Elements of a row of k and v: this GPU's key/value heads times the head dimension.
    pub kv_width: u64,
    /// `kv_width * 2`: a row of k, v and their gradients.
    pub kv_row: u64,
    /// Whether every rank holds every key/value head (`t > kv_heads`).
    pub kv_replicated: bool,
    /// FFN, norm, biases, tying.
    pub architecture: Architecture,
    pub hidden: u64,
    pub ffn: u64,
    /// Embedding rows on this GPU: `ceil(V / t)`.
    pub vocab_rows: u64,
    /// Rows of one classifier chunk (of the local rows).
    pub chunk_rows: u64,
    /// Attention FLOPs of one layer's forward, causal mask halved.
    pub attention_flops: u64,
    /// Context-parallel ranks `c` (`spec/context-parallel.md`); 1 without context parallelism.
    pub context: u64,
    /// The context rank whose program is built, `0..c`.
    pub context_rank: u64,
    /// Rows of one sequence on this context rank: `s / c` (two chunks of `s / 2c`).
    pub rank_seq: u64,
}

impl Shape {
    pub(crate) fn new(model: &ModelConfig, parallel: &Parallelism) -> Result<Self, ScheduleError> {
        model.validate()?;
        parallel.validate_for(model)?;
        let t = parallel.tensor;
        let overflow = |what| ModelError::Overflow { what };
        // This context-parallel rank's tokens ([`ModelConfig::rank_seq_len`]): the rows of every
        // head-sharded tensor, which sequence parallelism then splits over the t ranks.
        let full_rows = model.micro_batch.checked_mul(model.rank_seq_len(parallel)).ok_or(overflow("rows b*s"))?;
        let hidden_row = model.hidden.checked_mul(BF16_BYTES).ok_or(overflow("row bytes"))?;
        let ffn_row = (model.ffn_hidden / t).checked_mul(BF16_BYTES).ok_or(overflow("row bytes"))?;
        let fc1_row = ffn_row.checked_mul(model.architecture.ffn_in_products()).ok_or(overflow("row bytes"))?;
        let kv_width = model.kv_heads_on_gpu(t).checked_mul(model.head_dim()).ok_or(overflow("row bytes"))?;
        let kv_row = kv_width.checked_mul(BF16_BYTES).ok_or(overflow("row bytes"))?;
        let lse_row = (model.heads / t).checked_mul(FP32_BYTES).ok_or(overflow("row bytes"))?;
        let vocab_rows = model.vocab.div_ceil(t);
        // The classifier's logits of one chunk: gathered rows (t per local row) x V/t columns.
        let logits_row = vocab_rows.checked_mul(BF16_BYTES).ok_or(overflow("logits row bytes"))?;
        let chunk_rows = (LOGITS_CHUNK_BYTES / logits_row.saturating_mul(t).max(1)).max(1).min(full_rows / t);
        let attention = cost::layer_forward_flops(model, parallel, AttentionFlops::CausalHalved)?.attention();
        let attention_flops = u64::try_from(attention).map_err(|_| ScheduleError::FlopsOverflow { op: "attention" })?;
        // Every buffer's bytes must fit too: the largest is the gathered FC1 output, full_rows x f/t
        // (2f/t for SwiGLU).
        for (rows, row) in
            [(full_rows, hidden_row), (full_rows, fc1_row), (full_rows, kv_row), (vocab_rows, hidden_row)]
        {
            rows.checked_mul(row).ok_or(overflow("buffer bytes"))?;
            rows.checked_mul(row).and_then(|b| b.checked_mul(6)).ok_or(overflow("optimizer-state bytes"))?;
        }
        Ok(Shape {
            layers: model.layers,
            tensor: t,
            local_rows: full_rows / t,
            full_rows,
            hidden_row,
            head_row: (model.hidden / t) * BF16_BYTES,
            lse_row,
            ffn_row,
            fc1_row,
            kv_width,
            kv_row,
            kv_replicated: model.kv_replicated(t),
            architecture: model.architecture,
            hidden: model.hidden,
            ffn: model.ffn_hidden,
            vocab_rows,
            chunk_rows,
            attention_flops,
            context: parallel.context.max(1),
            context_rank: 0,
            rank_seq: model.rank_seq_len(parallel),
        })
    }
}

/// A parameter with its gradient and optimizer state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Param {
    pub value: BufferId,
    /// Its gradient: a whole buffer, or (`t > 1`, a replicated norm parameter) one row of the
    /// replicated-gradients buffer.
    pub grad: Region,
    pub state: BufferId,
    /// Whether every rank holds all of it (norms, the row-parallel biases): its gradient's squares
    /// are added once, after the all-reduce of the sharded ones.
    pub replicated: bool,
}

/// Builds buffers and instructions; the one place that emits instructions, so the rounding-buffer
/// waits cannot be forgotten.
pub(crate) struct Builder {
    pub shape: Shape,
    buffers: Vec<Buffer>,
    blocks: Vec<Option<Block>>,
    instructions: Vec<Instruction>,
    events: u32,
    /// Per rounding buffer: the swap-out of its previous occupant, not yet waited for by compute.
    pending_swap_out: [Option<EventId>; 2],
    /// Every parameter, in creation order (the optimizer walks it).
    pub params: Vec<Param>,
    /// With `t > 1`: the buffers of the replicated parameters' gradients that one all-reduce each
    /// sums over the ranks, by row width: every norm's (and, when K and V are replicated, their
    /// weights') rows of `h`, and the replicated K and V biases' rows. Each with its next free row.
    replicated_grads: Vec<(BufferId, u64)>,
}

impl Builder {
    fn new(shape: Shape) -> Self {
        Builder {
            shape,
            buffers: Vec::new(),
            blocks: Vec::new(),
            instructions: Vec::new(),
            events: 0,
            pending_swap_out: [None, None],
            params: Vec::new(),
            replicated_grads: Vec::new(),
        }
    }

    /// A new buffer (device, or host for host slots); `block` for per-layer transients.
    pub fn buffer(
        &mut self,
        kind: BufferKind,
        role: TensorRole,
        layer: Option<u32>,
        rows: u64,
        row_bytes: u64,
        block: Option<Block>,
    ) -> BufferId {
        self.buffer_in_slot(kind, role, layer, 0, rows, row_bytes, block)
    }

    #[allow(clippy::too_many_arguments)]
    fn buffer_in_slot(
        &mut self,
        kind: BufferKind,
        role: TensorRole,
        layer: Option<u32>,
        slot: u8,
        rows: u64,
        row_bytes: u64,
        block: Option<Block>,
    ) -> BufferId {
        let place = if kind == BufferKind::HostSlot { Place::Host { offset: 0 } } else { Place::Device { offset: 0 } };
        let id = BufferId(self.buffers.len() as u32);
        self.buffers.push(Buffer { kind, role, layer, slot, rows, first_row: 0, row_bytes, place });
        self.blocks.push(block);
        id
    }

    /// A parameter of `rows` x `row_elements` with its gradient and optimizer state.
    pub fn param(&mut self, role: TensorRole, layer: Option<u32>, rows: u64, row_elements: u64) -> Param {
        self.param_of(role, layer, rows, row_elements, false)
    }

    /// A parameter every rank holds whole (its gradient is whole on every rank too).
    pub fn replicated_param(&mut self, role: TensorRole, layer: Option<u32>, rows: u64, row_elements: u64) -> Param {
        self.param_of(role, layer, rows, row_elements, true)
    }

    /// A norm's scale or shift (`1 x h`, replicated; see [`Builder::replicated_rows_param`]).
    pub fn norm_param(&mut self, role: TensorRole, layer: Option<u32>) -> Param {
        let h = self.shape.hidden;
        self.replicated_rows_param(role, layer, 1, h)
    }

    /// A parameter every rank holds whole. With `t > 1` its gradient is the next `rows` rows of
    /// the replicated-gradients buffer of its row width ([`Builder::reserve_replicated_gradients`]),
    /// which one all-reduce sums over the ranks; with `t = 1`, a buffer of its own.
    pub fn replicated_rows_param(
        &mut self,
        role: TensorRole,
        layer: Option<u32>,
        rows: u64,
        row_elements: u64,
    ) -> Param {
        let row_bytes = row_elements * BF16_BYTES;
        let buffers = &self.buffers;
        let pool = self.replicated_grads.iter_mut().find(|(id, _)| buffers[id.index()].row_bytes == row_bytes);
        let Some((grads, next)) = pool else { return self.replicated_param(role, layer, rows, row_elements) };
        let grad = Region::rows(*grads, *next, *next + rows);
        *next += rows;
        let value = self.buffer(BufferKind::Parameter, role, layer, rows, row_bytes, None);
        let state = self.buffer(BufferKind::OptimizerState, role, layer, rows, row_elements * 3 * FP32_BYTES, None);
        let param = Param { value, grad, state, replicated: true };
        self.params.push(param);
        param
    }

    fn param_of(&mut self, role: TensorRole, layer: Option<u32>, rows: u64, row_elements: u64, rep: bool) -> Param {
        let value = self.buffer(BufferKind::Parameter, role, layer, rows, row_elements * BF16_BYTES, None);
        let grad = self.buffer(BufferKind::Gradient, role, layer, rows, row_elements * BF16_BYTES, None);
        // fp32 master weights, AdamW m and v.
        let state = self.buffer(BufferKind::OptimizerState, role, layer, rows, row_elements * 3 * FP32_BYTES, None);
        let param = Param { value, grad: self.all(grad), state, replicated: rep };
        self.params.push(param);
        param
    }

    /// With `t > 1`: the buffers holding the replicated parameters' gradients
    /// ([`replicated_gradient_rows`]), made before any such parameter.
    fn reserve_replicated_gradients(&mut self, rows: &[(ReplicatedPool, TensorRole, Option<u32>, u64)]) {
        let shape = self.shape;
        for (pool, role, row_bytes) in [
            (ReplicatedPool::Hidden, TensorRole::ReplicatedGradients, shape.hidden_row),
            (ReplicatedPool::KeyValueBias, TensorRole::ReplicatedBiasGradients, shape.kv_row),
        ] {
            let total: u64 = rows.iter().filter(|r| r.0 == pool).map(|r| r.3).sum();
            if total > 0 {
                let id = self.buffer(BufferKind::Gradient, role, None, total, row_bytes, None);
                self.replicated_grads.push((id, 0));
            }
        }
    }

    /// The replicated-gradients buffers, each to be all-reduced once.
    fn replicated_gradients(&self) -> Vec<Region> {
        self.replicated_grads.iter().map(|&(id, _)| self.all(id)).collect()
    }

    pub fn rows_of(&self, id: BufferId) -> u64 {
        self.buffers[id.index()].rows
    }

    /// The row of its tensor that row 0 of `id` holds.
    pub fn first_row_of(&self, id: BufferId) -> u64 {
        self.buffers[id.index()].first_row
    }

    /// Says that row 0 of `id` holds row `first_row` of its tensor (a host slot of a rank
    /// segment).
    pub fn set_first_row(&mut self, id: BufferId, first_row: u64) {
        self.buffers[id.index()].first_row = first_row;
    }

    /// All rows of `id`.
    pub fn all(&self, id: BufferId) -> Region {
        Region::rows(id, 0, self.rows_of(id))
    }

    /// Launches `op` on `regions` (in `op.signature()` order) on its stream ([`Op::stream`]).
    /// Waits first for the swap-out of a rounding buffer it writes, if that copy was not waited
    /// for yet. A collective goes on the collective stream between two events: compute records,
    /// the collective stream waits, runs it and records, compute waits.
    pub fn launch(&mut self, op: Op, layer: Option<u32>, flops: u64, regions: &[Region]) {
        let signature = op.signature();
        debug_assert_eq!(signature.len(), regions.len(), "{op:?}");
        for (region, (_, access)) in regions.iter().zip(signature) {
            let buffer = self.buffers[region.buffer.index()];
            if access.writes() && buffer.kind == BufferKind::RoundingBuffer {
                if let Some(event) = self.pending_swap_out[usize::from(buffer.slot)].take() {
                    self.wait(Stream::Compute, event);
                }
            }
        }
        let args = regions.iter().zip(signature).map(|(&region, &(_, access))| Arg { region, access }).collect();
        let launch = Action::Launch(Launch { op, args, layer, flops });
        if op.stream() == Stream::Collective {
            // Events both ways: the collective starts after compute wrote its input, and compute
            // goes on (reads its output, or overwrites its buffers) after it completed.
            let ready = self.record(Stream::Compute);
            self.wait(Stream::Collective, ready);
            self.push(Stream::Collective, launch);
            let done = self.record(Stream::Collective);
            self.wait(Stream::Compute, done);
        } else {
            self.push(Stream::Compute, launch);
        }
    }

    /// Launches `op` on `regions` on `stream` with no events: the caller orders it (the ring's
    /// exchanges overlap compute, so they are not fenced one by one as [`Builder::launch`] does).
    pub fn launch_on(&mut self, stream: Stream, op: Op, layer: Option<u32>, flops: u64, regions: &[Region]) {
        let signature = op.signature();
        debug_assert_eq!(signature.len(), regions.len(), "{op:?}");
        let args = regions.iter().zip(signature).map(|(&region, &(_, access))| Arg { region, access }).collect();
        self.push(stream, Action::Launch(Launch { op, args, layer, flops }));
    }

    /// The whole of every buffer of `kind`, in id order.
    pub fn buffers_of_kind(&self, kind: BufferKind) -> Vec<Region> {
        let ids = (0..self.buffers.len()).filter(|&i| self.buffers[i].kind == kind);
        ids.map(|i| self.all(BufferId(i as u32))).collect()
    }

    pub fn copy(&mut self, stream: Stream, src: Region, dst: Region, tensor: TensorRows) {
        self.push(stream, Action::Copy { src, dst, tensor });
    }

    pub fn record(&mut self, stream: Stream) -> EventId {
        let event = EventId(self.events);
        self.events += 1;
        self.push(stream, Action::Record(event));
        event
    }

    pub fn wait(&mut self, stream: Stream, event: EventId) {
        self.push(stream, Action::Wait(event));
    }

    /// The compute stream must wait for `event` before it next writes rounding buffer `slot`.
    pub fn note_swap_out(&mut self, slot: usize, event: EventId) {
        self.pending_swap_out[slot] = Some(event);
    }

    fn push(&mut self, stream: Stream, action: Action) {
        self.instructions.push(Instruction { stream, action });
    }

    /// `2 * rows * in * out` of a linear layer over `rows` rows with `weight` (`out` rows of
    /// `in` bf16 elements): the op table's count (`plan::shapes::matmul_flops`), which a
    /// backend's checked launch reports too.
    pub fn linear_flops(&self, rows: u64, weight: BufferId) -> Result<u64, ScheduleError> {
        let w = &self.buffers[weight.index()];
        shapes::matmul_flops(rows, w.row_bytes / BF16_BYTES, w.rows)
            .ok_or(ScheduleError::FlopsOverflow { op: "linear" })
    }

    /// For `t > 1`, all-gathers `x`'s rows over the tensor-parallel group into a new transient
    /// (t times the rows); for `t = 1`, `x` itself.
    pub fn gathered(&mut self, x: Region, layer: Option<u32>, block: Option<Block>) -> Region {
        if self.shape.tensor == 1 {
            return x;
        }
        let row_bytes = self.buffers[x.buffer.index()].row_bytes;
        let rows = (x.end - x.start) * self.shape.tensor;
        let gathered =
            self.buffer(BufferKind::Transient, TensorRole::GatheredNormOutput, layer, rows, row_bytes, block);
        let out = self.all(gathered);
        self.launch(Op::AllGather, layer, 0, &[x, out]);
        out
    }

    /// The region a row-parallel product writes: for `t = 1`, `dest` itself; for `t > 1`, a new
    /// partial-sum transient of t times the rows, to be reduce-scattered into `dest` by
    /// [`Builder::scatter`].
    pub fn partial_for(&mut self, dest: Region, layer: Option<u32>, block: Option<Block>) -> Region {
        if self.shape.tensor == 1 {
            return dest;
        }
        let row_bytes = self.buffers[dest.buffer.index()].row_bytes;
        let rows = (dest.end - dest.start) * self.shape.tensor;
        let partial = self.buffer(BufferKind::Transient, TensorRole::PartialSum, layer, rows, row_bytes, block);
        self.all(partial)
    }

    /// Completes [`Builder::partial_for`]: reduce-scatters `partial` into `dest` when they differ.
    pub fn scatter(&mut self, partial: Region, dest: Region, layer: Option<u32>) {
        if partial != dest {
            self.launch(Op::ReduceScatter, layer, 0, &[partial, dest]);
        }
    }

    /// A row-parallel linear layer from head-sharded `segments` (one region per rank segment, or
    /// one for all rows) into sequence-sharded `dest`. With `t = 1`: `linear` with its bias
    /// (`linear_no_bias` without one). With `t > 1`: `linear_no_bias` of each segment into its
    /// share of a partial sum, the reduce-scatter into `dest`, then `add_bias` once if there is a
    /// bias (`spec/tensor-parallel.md` section 4).
    pub fn row_parallel(
        &mut self,
        layer: Option<u32>,
        block: Option<Block>,
        segments: &[Region],
        (weight, bias): (Param, Option<Param>),
        dest: Region,
    ) -> Result<(), ScheduleError> {
        let w = self.all(weight.value);
        let bias = bias.map(|bias| self.all(bias.value));
        if self.shape.tensor == 1 {
            for &x in segments {
                let flops = self.linear_flops(x.end - x.start, weight.value)?;
                match bias {
                    Some(bi) => self.launch(Op::Linear, layer, flops, &[x, w, bi, dest]),
                    None => self.launch(Op::LinearNoBias, layer, flops, &[x, w, dest]),
                }
            }
            return Ok(());
        }
        let partial = self.partial_for(dest, layer, block);
        let mut at = partial.start;
        for &x in segments {
            let rows = x.end - x.start;
            let flops = self.linear_flops(rows, weight.value)?;
            let share = Region::rows(partial.buffer, at, at + rows);
            self.launch(Op::LinearNoBias, layer, flops, &[x, w, share]);
            at += rows;
        }
        self.scatter(partial, dest, layer);
        if let Some(bi) = bias {
            self.launch(Op::AddBias, layer, 0, &[bi, dest]);
        }
        Ok(())
    }

    fn finish(self, swapped_rows: u64) -> Schedule {
        Schedule {
            buffers: self.buffers,
            blocks: self.blocks,
            instructions: self.instructions,
            events: self.events,
            swapped_rows,
        }
    }
}

/// Which buffer of replicated gradients a parameter's gradient rows are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicatedPool {
    /// [`TensorRole::ReplicatedGradients`]: rows of `h` (norm vectors, replicated K/V weights).
    Hidden,
    /// [`TensorRole::ReplicatedBiasGradients`]: rows of the K/V width (replicated K/V biases).
    KeyValueBias,
}

/// The replicated parameters whose gradients, with `t > 1`, are rows of one of the
/// replicated-gradients buffers, in row order within each: `(pool, role, layer, rows)`. Per
/// layer the first norm's scale (and shift, LayerNorm), K's and V's weights (and biases) when
/// replicated, the second norm's; then the final norm's. Empty with `t = 1`. The schedule
/// reserves exactly these rows; a runtime reads them back by the same list.
pub fn replicated_gradient_rows(
    model: &ModelConfig,
    tensor: u64,
) -> Vec<(ReplicatedPool, TensorRole, Option<u32>, u64)> {
    use ReplicatedPool::{Hidden, KeyValueBias};
    let mut rows = Vec::new();
    if tensor <= 1 {
        return rows;
    }
    let shift = model.architecture.norm == crate::model::Norm::LayerNorm;
    let kv_width = model.kv_heads_on_gpu(tensor).saturating_mul(model.head_dim());
    let norm = |rows: &mut Vec<_>, scale: TensorRole, shift_role: TensorRole, layer: Option<u32>| {
        rows.push((Hidden, scale, layer, 1));
        if shift {
            rows.push((Hidden, shift_role, layer, 1));
        }
    };
    for l in 0..model.layers {
        let layer = Some(l);
        norm(&mut rows, TensorRole::NormScale1, TensorRole::NormShift1, layer);
        if model.kv_replicated(tensor) {
            for (weight, bias) in
                [(TensorRole::KeyWeight, TensorRole::KeyBias), (TensorRole::ValueWeight, TensorRole::ValueBias)]
            {
                rows.push((Hidden, weight, layer, kv_width));
                if model.architecture.biases.qkv() {
                    rows.push((KeyValueBias, bias, layer, 1));
                }
            }
        }
        norm(&mut rows, TensorRole::NormScale2, TensorRole::NormShift2, layer);
    }
    norm(&mut rows, TensorRole::FinalNormScale, TensorRole::FinalNormShift, None);
    rows
}

/// Builds the step's schedule for `model` on `parallel` with `options`.
pub fn build(
    model: &ModelConfig,
    parallel: &Parallelism,
    options: &ScheduleOptions,
) -> Result<Schedule, ScheduleError> {
    build_for_context_rank(model, parallel, options, 0)
}

/// [`build`] for context rank `context_rank` of `parallel.context` (`spec/context-parallel.md`):
/// the same buffers and the same instructions but for the ring attention's row ranges, which
/// depend on the context rank. With `c = 1`, context rank 0 is [`build`].
pub fn build_for_context_rank(
    model: &ModelConfig,
    parallel: &Parallelism,
    options: &ScheduleOptions,
    context_rank: u64,
) -> Result<Schedule, ScheduleError> {
    let mut shape = Shape::new(model, parallel)?;
    if context_rank >= shape.context {
        return Err(ScheduleError::Model(ModelError::Overflow { what: "context rank (not below c)" }));
    }
    shape.context_rank = context_rank;
    let mut b = Builder::new(shape);
    let replicated_rows = replicated_gradient_rows(model, parallel.tensor);
    let (r, layers) = (shape.local_rows, shape.layers);

    let tokens = b.buffer(BufferKind::Input, TensorRole::Tokens, None, r, TOKEN_ID_BYTES, None);
    let targets = b.buffer(BufferKind::Input, TensorRole::Targets, None, r, TOKEN_ID_BYTES, None);
    let embedding = b.param(TensorRole::Embedding, None, shape.vocab_rows, shape.hidden);
    // An untied classifier: its own V x h matrix, sharded like the embedding.
    let untied = (!shape.architecture.tied_embeddings)
        .then(|| b.param(TensorRole::ClassifierWeight, None, shape.vocab_rows, shape.hidden));
    b.reserve_replicated_gradients(&replicated_rows);
    let layer_params: Vec<layer::LayerParams> = (0..layers).map(|l| layer::LayerParams::new(&mut b, l)).collect();
    let final_norm_params =
        layer::NormParams::new(&mut b, None, TensorRole::FinalNormScale, TensorRole::FinalNormShift);
    let loss = b.buffer(BufferKind::Scalar, TensorRole::Loss, None, 1, FP32_BYTES, None);
    let grad_norm = b.buffer(BufferKind::Scalar, TensorRole::GradNormSquared, None, 1, FP32_BYTES, None);

    // Where each layer keeps its skeletal set, and which layers swap.
    let mut storage = layer::Storage::new(&mut b, options.strategy, options.alpha_fixed);
    let final_hidden = b.buffer(BufferKind::CrossLayer, TensorRole::LayerOutput, None, r, shape.hidden_row, None);

    // 1. Embedding into layer 0's input (t > 1: from the gathered table).
    let first_input = storage.forward_set(0).input();
    let out = b.all(first_input);
    let tok = b.all(tokens);
    let emb = b.all(embedding.value);
    let table = if shape.tensor == 1 {
        emb
    } else {
        let rows = shape.vocab_rows * shape.tensor;
        let id = b.buffer(BufferKind::Transient, TensorRole::GatheredEmbedding, None, rows, shape.hidden_row, None);
        let table = b.all(id);
        b.launch(Op::AllGather, None, 0, &[emb, table]);
        table
    };
    b.launch(Op::Embedding, None, 0, &[tok, table, out]);

    // 2. Forward.
    for l in 0..layers {
        let set = storage.forward_set(l);
        let output = if l + 1 < layers { storage.forward_set(l + 1).input() } else { final_hidden };
        layer::forward(&mut b, l, &layer_params[l as usize], &set, output)?;
        storage.swap_out(&mut b, l);
    }

    // 3. Final norm, chunked classifier + cross-entropy with its backward, final norm backward.
    let final_norm = b.buffer(BufferKind::Transient, TensorRole::FinalNormOutput, None, r, shape.hidden_row, None);
    let d_final_norm =
        b.buffer(BufferKind::Transient, TensorRole::FinalNormOutputGradient, None, r, shape.hidden_row, None);
    let (x, y) = (b.all(final_hidden), b.all(final_norm));
    final_norm_params.forward(&mut b, None, x, y);
    // The classifier's gradient: an untied classifier's own; a tied one's share of the embedding
    // gradient: the gradient itself with t = 1, a transient added to the lookup's share at the
    // end with t > 1.
    let classifier_weight = untied.unwrap_or(embedding);
    let d_classifier = if let Some(untied) = untied {
        untied.grad
    } else if shape.tensor == 1 {
        embedding.grad
    } else {
        let rows = shape.vocab_rows;
        let id = b.buffer(BufferKind::Transient, TensorRole::EmbeddingGradientPart, None, rows, shape.hidden_row, None);
        b.all(id)
    };
    let loss_all = b.all(loss);
    b.launch(Op::Zero, None, 0, &[loss_all]);
    b.launch(Op::Zero, None, 0, &[d_classifier]);
    classifier(&mut b, classifier_weight, d_classifier, final_norm, d_final_norm, targets, loss)?;
    let d_output = storage.new_output_gradient(&mut b, layers - 1);
    let (x, dy, dx) = (b.all(final_hidden), b.all(d_final_norm), b.all(d_output));
    final_norm_params.backward(&mut b, None, x, dy, dx);

    // 4. Backward, last layer first.
    let mut d_out = d_output;
    for l in (0..layers).rev() {
        storage.before_backward(&mut b, l);
        let set = storage.backward_set(l);
        let params = &layer_params[l as usize];
        if let Some(what) = storage.recompute(&b, l) {
            layer::recompute(&mut b, l, params, &set, what)?;
        }
        let d_in = if l > 0 {
            storage.new_output_gradient(&mut b, l - 1)
        } else {
            b.buffer(BufferKind::Transient, TensorRole::EmbeddingOutputGradient, None, r, shape.hidden_row, None)
        };
        layer::backward(&mut b, l, params, &set, d_out, d_in)?;
        storage.after_backward(&mut b, l);
        d_out = d_in;
    }

    // 5. (t > 1: the layer norms' gradients summed over the ranks.) Embedding backward,
    // gradient norm, AdamW.
    for replicated in b.replicated_gradients() {
        b.launch(Op::AllReduceSumBf16, None, 0, &[replicated]);
    }
    let (tok, dy) = (b.all(tokens), b.all(d_out));
    if shape.tensor == 1 {
        if untied.is_some() {
            // Nothing accumulated into it yet: the lookup's scatter-add starts from zero.
            b.launch(Op::Zero, None, 0, &[embedding.grad]);
        }
        b.launch(Op::EmbeddingBackward, None, 0, &[tok, dy, embedding.grad]);
    } else {
        // The lookup's gradient over the gathered table, reduce-scattered to the shards.
        let rows = shape.vocab_rows * shape.tensor;
        let whole =
            b.buffer(BufferKind::Transient, TensorRole::GatheredEmbeddingGradient, None, rows, shape.hidden_row, None);
        let whole = b.all(whole);
        b.launch(Op::Zero, None, 0, &[whole]);
        b.launch(Op::EmbeddingBackward, None, 0, &[tok, dy, whole]);
        if untied.is_some() {
            // The lookup's share is the whole gradient: no part to add (a transient made here
            // anyway would be used by no instruction, which the placement refuses).
            b.launch(Op::ReduceScatter, None, 0, &[whole, embedding.grad]);
        } else {
            let role = TensorRole::EmbeddingGradientPart;
            let part = b.buffer(BufferKind::Transient, role, None, shape.vocab_rows, shape.hidden_row, None);
            let part = b.all(part);
            b.launch(Op::ReduceScatter, None, 0, &[whole, part]);
            b.launch(Op::Add, None, 0, &[d_classifier, part, embedding.grad]);
        }
    }
    if shape.context > 1 {
        // Context parallelism: each rank's gradients and loss are its tokens' share; the sums
        // over the context ranks come before the gradient norm.
        ring::data_all_reduce(&mut b, loss_all);
    }
    let norm = b.all(grad_norm);
    b.launch(Op::Zero, None, 0, &[norm]);
    let params = b.params.clone();
    // With t > 1: the sharded gradients' squares, summed over the ranks, then the replicated
    // ones' (equal on every rank) once.
    let sharded = shape.tensor > 1;
    for p in params.iter().filter(|p| !(sharded && p.replicated)) {
        b.launch(Op::GradNormSquared, None, 0, &[p.grad, norm]);
    }
    if sharded {
        b.launch(Op::AllReduceSumF32, None, 0, &[norm]);
        for p in params.iter().filter(|p| p.replicated) {
            b.launch(Op::GradNormSquared, None, 0, &[p.grad, norm]);
        }
    }
    for p in &params {
        let (value, state) = (b.all(p.value), b.all(p.state));
        b.launch(Op::AdamW, None, 0, &[value, p.grad, state, norm]);
    }
    Ok(b.finish(storage.swapped_rows()))
}

/// The classifier in chunks of rows: logits of one chunk, its cross-entropy (loss added, logits
/// replaced by their gradient), the gradient of the final norm's output for those rows, and the
/// embedding gradient's share (into `d_embedding`). One logits buffer serves every chunk. With
/// `t > 1` the chunk's rows are gathered from every rank, the logits are this rank's vocabulary
/// columns, and the cross-entropy is split around two all-reduces (`spec/tensor-parallel.md`).
fn classifier(
    b: &mut Builder,
    embedding: Param,
    d_embedding: Region,
    final_norm: BufferId,
    d_final_norm: BufferId,
    targets: BufferId,
    loss: BufferId,
) -> Result<(), ScheduleError> {
    let shape = b.shape;
    let chunk_rows = shape.chunk_rows;
    let logits_rows = chunk_rows * shape.tensor;
    let logits = b.buffer(
        BufferKind::Transient,
        TensorRole::LogitsChunk,
        None,
        logits_rows,
        shape.vocab_rows * BF16_BYTES,
        None,
    );
    // t > 1: per gathered row of a chunk, its target, the combined maximum and the two sums (one
    // buffer each, reused by every chunk like the logits).
    let (row_targets, row_max, row_sums) = if shape.tensor > 1 {
        let targets =
            b.buffer(BufferKind::Transient, TensorRole::GatheredTargets, None, logits_rows, TOKEN_ID_BYTES, None);
        let max = b.buffer(BufferKind::Transient, TensorRole::LogitsMax, None, logits_rows, FP32_BYTES, None);
        let sums = b.buffer(BufferKind::Transient, TensorRole::LogitsSums, None, logits_rows, 2 * FP32_BYTES, None);
        (targets, max, sums)
    } else {
        (logits, logits, logits)
    };
    let mut start = 0;
    while start < shape.local_rows {
        let end = (start + chunk_rows).min(shape.local_rows);
        let rows = (end - start) * shape.tensor;
        let x = b.gathered(Region::rows(final_norm, start, end), None, None);
        let chunk = Region::rows(logits, 0, rows);
        let flops = b.linear_flops(rows, embedding.value)?;
        let emb = b.all(embedding.value);
        b.launch(Op::Classifier, None, flops, &[x, emb, chunk]);
        let (t, l) = (Region::rows(targets, start, end), b.all(loss));
        if shape.tensor == 1 {
            b.launch(Op::CrossEntropy, None, 0, &[chunk, t, l]);
        } else {
            let gathered = Region::rows(row_targets, 0, rows);
            b.launch(Op::AllGather, None, 0, &[t, gathered]);
            let t = gathered;
            let max = Region::rows(row_max, 0, rows);
            let pair = Region::rows(row_sums, 0, rows);
            b.launch(Op::CrossEntropyMax, None, 0, &[chunk, max]);
            b.launch(Op::AllReduceMaxF32, None, 0, &[max]);
            b.launch(Op::CrossEntropySums, None, 0, &[chunk, t, max, pair]);
            b.launch(Op::AllReduceSumF32, None, 0, &[pair]);
            b.launch(Op::CrossEntropyFinish, None, 0, &[chunk, t, max, pair, l]);
        }
        let dx = Region::rows(d_final_norm, start, end);
        let partial = b.partial_for(dx, None, None);
        b.launch(Op::LinearBackwardInput, None, flops, &[chunk, emb, partial]);
        b.scatter(partial, dx, None);
        b.launch(Op::ClassifierBackwardWeight, None, flops, &[x, chunk, d_embedding]);
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
