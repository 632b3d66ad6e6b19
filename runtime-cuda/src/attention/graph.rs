//! The attention graphs of cuDNN's backend API, built through [`GraphBuilder`] so that the same
//! code that creates cuDNN descriptors (`super::cudnn`) can be recorded ([`super::record`]) and
//! interpreted in f64 without a GPU ([`super::interpret`], tests only).
//!
//! The graphs are the ones cuDNN's own frontend (cudnn-frontend 1.23) builds for causal
//! training attention with bf16 input and output:
//! - [`forward_composite`]: 14 operations (matmul, pointwise, reduction), for any cuDNN 9;
//! - [`forward_fused`]: one `SDPA_FWD` operation with a softmax operation and a one-operation
//!   causal-mask subgraph (cuDNN 9.21 or newer: the causal mask on that operation needs it);
//! - [`backward_composite`]: 22 operations with an f32 dQ accumulator and a softmax-sum buffer
//!   ([`BackwardForm::Accumulate`], Hopper's default, dQ accumulated with atomics), or 21 with dQ
//!   written by one matmul ([`BackwardForm::Deterministic`], the "dP workspace" form).
//!
//! Every tensor is logical (B, H, S, D) with explicit strides: the plan's row-major
//! `[tokens, heads * head_dim]` buffers are strided views ("bshd"), no copies.
//!
//! Grouped-query attention as cuDNN has it: k, v, dk and dv have [`Shape::kv_heads`] heads
//! (`h_kv`, dividing `h_q`; query head `i` attends with K/V head `i / (h_q / h_kv)`) in rows of
//! [`Shape::kv_row`] elements. The matmuls broadcast K and V over each group; the backward
//! computes dK and dV per query head (virtual, bf16, packed) and sums each group with a
//! reduction into dK and dV, as the frontend does ("red_dK_head", "red_dV_head"). With
//! `kv_heads == heads` the graphs are the multi-head ones, descriptor for descriptor. The plan's
//! log-sum-exp is `[tokens, heads]` f32 ([`StatsLayout::TokenMajor`]); cuDNN's frontend uses
//! (B, H, S, 1) packed ([`StatsLayout::HeadMajor`]). Which one cuDNN accepts for its statistics
//! is decided at plan build on the GPU (the token-major view is tried first).

/// A tensor's unique id in a graph and in the variant pack.
pub type Uid = i64;

/// The uids of the non-virtual tensors (the variant pack) and the scalars.
pub mod uid {
    use super::Uid;
    /// q (bf16, bshd).
    pub const Q: Uid = 1;
    /// k (bf16): described transposed (`KT`, dims (B, H, D, S)) in the composite graphs.
    pub const K: Uid = 2;
    /// v (bf16): described transposed (`VT`) in the backward.
    pub const V: Uid = 3;
    /// The attention output (bf16, bshd).
    pub const O: Uid = 4;
    /// The softmax statistics: natural-log LSE of the scaled scores (f32, (B, H, S, 1)).
    pub const STATS: Uid = 5;
    /// The scale 1/sqrt(d) (f32 by value).
    pub const SCALE: Uid = 6;
    /// The masked scores' value, -inf (f32 by value).
    pub const NEG_INF: Uid = 7;
    /// 1.0 (f32 by value; the backward's softmax-sum multiplier).
    pub const ONE: Uid = 8;
    /// The output's gradient (bf16, bshd).
    pub const DO: Uid = 9;
    /// The gradients (bf16, bshd).
    pub const DQ: Uid = 10;
    /// See [`DQ`].
    pub const DK: Uid = 11;
    /// See [`DQ`].
    pub const DV: Uid = 12;
    /// The backward's f32 dQ accumulator (B, H, S, D), scratch.
    pub const DQ_ACCUM: Uid = 13;
    /// The backward's f32 softmax sums `rowsum(dO * O)` (B, H, S, 1), scratch.
    pub const SOFTMAX_SUM: Uid = 14;
    /// Virtual tensors are numbered from here.
    pub const FIRST_VIRTUAL: Uid = 100;
}

/// Element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// bfloat16.
    Bf16,
    /// f32.
    F32,
    /// i32 (index generation).
    I32,
    /// Boolean (comparisons).
    Bool,
}

impl DataType {
    /// The name in recordings.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Bf16 => "bf16",
            DataType::F32 => "f32",
            DataType::I32 => "i32",
            DataType::Bool => "bool",
        }
    }
}

/// A tensor descriptor: logical dims (always 4) and strides in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Its uid.
    pub uid: Uid,
    /// A name for recordings and errors.
    pub name: &'static str,
    /// Element type.
    pub dtype: DataType,
    /// Logical dims.
    pub dims: [i64; 4],
    /// Strides in elements (the last is 1 for every non-scalar cuDNN accepts here).
    pub strides: [i64; 4],
    /// Produced and consumed inside the graph (never in memory).
    pub is_virtual: bool,
    /// A host scalar passed by value in the variant pack.
    pub by_value: bool,
}

/// The byte alignment promised for every tensor (the frontend's default).
pub const ALIGNMENT: i64 = 16;

/// Pointwise modes used by the graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointwiseMode {
    /// `x + b`.
    Add,
    /// `x - b`.
    Sub,
    /// `x * b`.
    Mul,
    /// `x / b`.
    Div,
    /// `exp(x)`.
    Exp,
    /// `ln(x)`.
    Log,
    /// `x >= b`.
    CmpGe,
    /// `t ? x : b`.
    BinarySelect,
    /// `x`.
    Identity,
    /// The output element's index along an axis.
    GenIndex,
}

impl PointwiseMode {
    /// The name in recordings.
    pub fn name(self) -> &'static str {
        match self {
            PointwiseMode::Add => "add",
            PointwiseMode::Sub => "sub",
            PointwiseMode::Mul => "mul",
            PointwiseMode::Div => "div",
            PointwiseMode::Exp => "exp",
            PointwiseMode::Log => "log",
            PointwiseMode::CmpGe => "cmp_ge",
            PointwiseMode::BinarySelect => "binary_select",
            PointwiseMode::Identity => "identity",
            PointwiseMode::GenIndex => "gen_index",
        }
    }
}

/// Reduction operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Maximum.
    Max,
    /// Sum.
    Add,
}

/// An operation descriptor built by [`GraphBuilder::operation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpId(pub usize);

/// An operation graph built by [`GraphBuilder::graph`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphId(pub usize);

/// One operation. Tensors are named by uid and declared before ([`GraphBuilder::tensor`]);
/// every compute type is f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `y = mode(x, b, t)`; `b` and `t` as the mode needs; `axis` only for
    /// [`PointwiseMode::GenIndex`]; `precision` is the math precision.
    Pointwise {
        /// The mode.
        mode: PointwiseMode,
        /// First input.
        x: Uid,
        /// Second input.
        b: Option<Uid>,
        /// Third input (the condition of [`PointwiseMode::BinarySelect`]).
        t: Option<Uid>,
        /// Output.
        y: Uid,
        /// [`PointwiseMode::GenIndex`]'s axis.
        axis: Option<i64>,
        /// Math precision.
        precision: DataType,
    },
    /// `c = a @ b` over the last two dims, batched over the first two.
    Matmul {
        /// (.., M, K).
        a: Uid,
        /// (.., K, N).
        b: Uid,
        /// (.., M, N).
        c: Uid,
    },
    /// `y = reduce(x)` over the axes where `y`'s dim is 1 and `x`'s is not.
    Reduction {
        /// The operator.
        op: ReduceOp,
        /// Input.
        x: Uid,
        /// Output.
        y: Uid,
    },
    /// `y` is `x`'s memory described by `y`'s dims and strides (a transpose by strides).
    Reshape {
        /// Input.
        x: Uid,
        /// Output.
        y: Uid,
    },
    /// Causal (top-left) mask: `y = row >= col ? x : fill`.
    DiagonalBandMask {
        /// Scores.
        x: Uid,
        /// The fill value (by value).
        fill: Uid,
        /// Masked scores.
        y: Uid,
    },
    /// `y = softmax(x)` along the last axis, `stats` its natural-log LSE.
    Softmax {
        /// Scores.
        x: Uid,
        /// Probabilities.
        y: Uid,
        /// LSE.
        stats: Uid,
    },
    /// The fused forward: `o = softmax(mask(q k^T * scale)) v`, statistics by `softmax`.
    SdpaForward {
        /// q (bshd).
        q: Uid,
        /// k (bshd, not transposed).
        k: Uid,
        /// v (bshd).
        v: Uid,
        /// o (bshd).
        o: Uid,
        /// The scale (by value).
        scale: Uid,
        /// The finalized softmax operation that produces the statistics.
        softmax: OpId,
        /// The finalized mask subgraph.
        mask: GraphId,
        /// The subgraph's input uid (the scaled scores).
        mask_input: Uid,
        /// The subgraph's output uid (the masked scores).
        mask_output: Uid,
    },
}

/// Where graphs are built: cuDNN descriptors, or a recording.
pub trait GraphBuilder {
    /// What goes wrong.
    type Error;
    /// Declares (creates and finalizes) a tensor descriptor.
    fn tensor(&mut self, tensor: &Tensor) -> Result<(), Self::Error>;
    /// Creates and finalizes an operation descriptor.
    fn operation(&mut self, op: &Operation) -> Result<OpId, Self::Error>;
    /// Creates and finalizes an operation graph of `ops`; `main` graphs get the handle and are
    /// the ones executed, others are subgraphs of a fused operation.
    fn graph(&mut self, ops: &[OpId], main: bool) -> Result<GraphId, Self::Error>;
}

/// How the statistics (LSE) are laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatsLayout {
    /// The plan's: `[tokens, heads]` f32, strides (S*H, 1, H, 1).
    TokenMajor,
    /// cuDNN's frontend's: (B, H, S, 1) packed, strides (H*S, S, 1, 1).
    HeadMajor,
}

/// The backward's form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackwardForm {
    /// dQ accumulated in an f32 buffer (atomics on Hopper: not bit-reproducible), then cast.
    Accumulate,
    /// dQ by one matmul from dS (the "dP workspace" form, deterministic; more workspace).
    Deterministic,
}

/// One attention launch's geometry and memory layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Sequences.
    pub batch: i64,
    /// Heads.
    pub heads: i64,
    /// Tokens per sequence.
    pub seq: i64,
    /// Elements per head.
    pub head_dim: i64,
    /// Elements per token row of q, o, dO and dQ (`heads * head_dim` in the plan).
    pub row: i64,
    /// K/V heads as cuDNN sees them (`h_kv`): they divide `heads`; `heads` for multi-head
    /// attention.
    pub kv_heads: i64,
    /// Elements per token row of k, v, dK and dV (`kv_heads * head_dim` in the plan; more when
    /// the graph reads one head of a row holding every K/V head of the model).
    pub kv_row: i64,
    /// The statistics' layout.
    pub stats: StatsLayout,
}

impl Shape {
    /// The plan's layout: rows of `heads * head_dim`, token-major statistics.
    pub fn plan(batch: i64, heads: i64, seq: i64, head_dim: i64) -> Self {
        Self::grouped(batch, heads, heads, seq, head_dim)
    }

    /// The plan's layout with `kv_heads` K/V heads (grouped-query attention; `kv_heads` divides
    /// `heads`): rows of `kv_heads * head_dim` for k, v, dK and dV.
    pub fn grouped(batch: i64, heads: i64, kv_heads: i64, seq: i64, head_dim: i64) -> Self {
        Shape {
            batch,
            heads,
            seq,
            head_dim,
            row: heads * head_dim,
            kv_heads,
            kv_row: kv_heads * head_dim,
            stats: StatsLayout::TokenMajor,
        }
    }

    /// Whether K and V have fewer heads than Q (the backward then sums dK and dV per group).
    fn is_grouped(&self) -> bool {
        self.kv_heads != self.heads
    }

    /// (B, H_kv, S, D) over a row-major `[tokens, kv_row]` buffer: k, v, dK, dV.
    fn kv_bshd(&self) -> ([i64; 4], [i64; 4]) {
        let (b, h, s, d, r) = (self.batch, self.kv_heads, self.seq, self.head_dim, self.kv_row);
        ([b, h, s, d], [s * r, d, r, 1])
    }

    /// (B, H_kv, D, S): the same buffer transposed by strides.
    fn kv_bhds(&self) -> ([i64; 4], [i64; 4]) {
        let (b, h, s, d, r) = (self.batch, self.kv_heads, self.seq, self.head_dim, self.kv_row);
        ([b, h, d, s], [s * r, d, 1, r])
    }

    /// (B, H, S, D) over a row-major `[tokens, row]` buffer.
    fn bshd(&self) -> ([i64; 4], [i64; 4]) {
        let (b, h, s, d, r) = (self.batch, self.heads, self.seq, self.head_dim, self.row);
        ([b, h, s, d], [s * r, d, r, 1])
    }

    /// (B, H, S, S) scores, packed.
    fn scores(&self) -> ([i64; 4], [i64; 4]) {
        let (b, h, s) = (self.batch, self.heads, self.seq);
        ([b, h, s, s], [h * s * s, s * s, s, 1])
    }

    /// (B, H, S, S) scores transposed: the same memory as [`Shape::scores`] read as (kv, q).
    fn scores_transposed(&self) -> ([i64; 4], [i64; 4]) {
        let (b, h, s) = (self.batch, self.heads, self.seq);
        ([b, h, s, s], [h * s * s, s * s, 1, s])
    }

    /// (B, H, S, 1) row statistics, packed.
    fn rows(&self) -> ([i64; 4], [i64; 4]) {
        let (b, h, s) = (self.batch, self.heads, self.seq);
        ([b, h, s, 1], [h * s, s, 1, 1])
    }

    /// The statistics' dims and strides.
    fn stats(&self) -> ([i64; 4], [i64; 4]) {
        let (b, h, s) = (self.batch, self.heads, self.seq);
        match self.stats {
            StatsLayout::TokenMajor => ([b, h, s, 1], [s * h, 1, h, 1]),
            StatsLayout::HeadMajor => self.rows(),
        }
    }

    /// (B, H, S, D) packed (f32 scratch and virtual intermediates).
    fn packed(&self) -> ([i64; 4], [i64; 4]) {
        let (b, h, s, d) = (self.batch, self.heads, self.seq, self.head_dim);
        ([b, h, s, d], [h * s * d, s * d, d, 1])
    }
}

/// Declares tensors as they are first used and numbers the virtual ones.
struct Emitter<'a, B: GraphBuilder> {
    builder: &'a mut B,
    next_virtual: Uid,
    ops: Vec<OpId>,
}

impl<'a, B: GraphBuilder> Emitter<'a, B> {
    fn new(builder: &'a mut B) -> Self {
        Emitter { builder, next_virtual: uid::FIRST_VIRTUAL, ops: Vec::new() }
    }

    fn real(
        &mut self,
        uid: Uid,
        name: &'static str,
        dtype: DataType,
        (dims, strides): ([i64; 4], [i64; 4]),
    ) -> Result<Uid, B::Error> {
        let tensor = Tensor { uid, name, dtype, dims, strides, is_virtual: false, by_value: false };
        self.builder.tensor(&tensor)?;
        Ok(uid)
    }

    fn scalar(&mut self, uid: Uid, name: &'static str) -> Result<Uid, B::Error> {
        let tensor = Tensor {
            uid,
            name,
            dtype: DataType::F32,
            dims: [1; 4],
            strides: [1; 4],
            is_virtual: false,
            by_value: true,
        };
        self.builder.tensor(&tensor)?;
        Ok(uid)
    }

    fn virt(
        &mut self,
        name: &'static str,
        dtype: DataType,
        (dims, strides): ([i64; 4], [i64; 4]),
    ) -> Result<Uid, B::Error> {
        let uid = self.next_virtual;
        self.next_virtual += 1;
        let tensor = Tensor { uid, name, dtype, dims, strides, is_virtual: true, by_value: false };
        self.builder.tensor(&tensor)?;
        Ok(uid)
    }

    fn op(&mut self, op: Operation) -> Result<OpId, B::Error> {
        let id = self.builder.operation(&op)?;
        self.ops.push(id);
        Ok(id)
    }

    fn pointwise(&mut self, mode: PointwiseMode, x: Uid, b: Option<Uid>, y: Uid) -> Result<OpId, B::Error> {
        self.op(Operation::Pointwise { mode, x, b, t: None, y, axis: None, precision: DataType::F32 })
    }

    /// Ops 3-6 of the forward: `y = row >= col ? x : -inf` (`neg_inf` declared already).
    fn causal_mask(&mut self, shape: &Shape, x: Uid, neg_inf: Uid, y: Uid) -> Result<(), B::Error> {
        let scores = shape.scores();
        let row = self.virt("row_index", DataType::I32, scores)?;
        self.op(Operation::Pointwise {
            mode: PointwiseMode::GenIndex,
            x,
            b: None,
            t: None,
            y: row,
            axis: Some(2),
            precision: DataType::F32,
        })?;
        let col = self.virt("col_index", DataType::I32, scores)?;
        self.op(Operation::Pointwise {
            mode: PointwiseMode::GenIndex,
            x,
            b: None,
            t: None,
            y: col,
            axis: Some(3),
            precision: DataType::F32,
        })?;
        let keep = self.virt("causal", DataType::Bool, scores)?;
        self.op(Operation::Pointwise {
            mode: PointwiseMode::CmpGe,
            x: row,
            b: Some(col),
            t: None,
            y: keep,
            axis: None,
            precision: DataType::Bool,
        })?;
        self.op(Operation::Pointwise {
            mode: PointwiseMode::BinarySelect,
            x,
            b: Some(neg_inf),
            t: Some(keep),
            y,
            axis: None,
            precision: DataType::F32,
        })?;
        Ok(())
    }

    /// `a @ b` into the K/V gradient `output` (dV = P^T dO, dK = dS^T Q): one matmul when K and
    /// V have every query head's head, else the frontend's GQA form: a matmul into a virtual
    /// per-query-head gradient (bf16, packed), then a reduction that sums each group of
    /// `heads / kv_heads` query heads into `output`.
    fn grouped_matmul(
        &mut self,
        shape: &Shape,
        a: Uid,
        b: Uid,
        output: Uid,
        (name, full_name): (&'static str, &'static str),
    ) -> Result<(), B::Error> {
        if !shape.is_grouped() {
            let c = self.real(output, name, DataType::Bf16, shape.bshd())?;
            self.op(Operation::Matmul { a, b, c })?;
            return Ok(());
        }
        let full = self.virt(full_name, DataType::Bf16, shape.packed())?;
        self.op(Operation::Matmul { a, b, c: full })?;
        let c = self.real(output, name, DataType::Bf16, shape.kv_bshd())?;
        self.op(Operation::Reduction { op: ReduceOp::Add, x: full, y: c })?;
        Ok(())
    }

    /// The main graph of every op emitted.
    fn finish(self) -> Result<GraphId, B::Error> {
        let ops = self.ops;
        self.builder.graph(&ops, true)
    }
}

/// The forward as 14 operations: `S = Q K^T * scale`, causal mask, softmax with its LSE into
/// the statistics, `O = P V` (P cast to bf16). Returns the main graph.
pub fn forward_composite<B: GraphBuilder>(builder: &mut B, shape: &Shape) -> Result<GraphId, B::Error> {
    let mut e = Emitter::new(builder);
    let scores = shape.scores();
    let rows = shape.rows();
    let q = e.real(uid::Q, "q", DataType::Bf16, shape.bshd())?;
    let kt = e.real(uid::K, "k_transposed", DataType::Bf16, shape.kv_bhds())?;
    let s0 = e.virt("scores", DataType::F32, scores)?;
    e.op(Operation::Matmul { a: q, b: kt, c: s0 })?;
    let scale = e.scalar(uid::SCALE, "scale")?;
    let s1 = e.virt("scaled", DataType::F32, scores)?;
    e.pointwise(PointwiseMode::Mul, s0, Some(scale), s1)?;
    let neg_inf = e.scalar(uid::NEG_INF, "neg_inf")?;
    let s2 = e.virt("masked", DataType::F32, scores)?;
    e.causal_mask(shape, s1, neg_inf, s2)?;
    let max = e.virt("row_max", DataType::F32, rows)?;
    e.op(Operation::Reduction { op: ReduceOp::Max, x: s2, y: max })?;
    let s3 = e.virt("shifted", DataType::F32, scores)?;
    e.pointwise(PointwiseMode::Sub, s2, Some(max), s3)?;
    let exp = e.virt("exp", DataType::F32, scores)?;
    e.pointwise(PointwiseMode::Exp, s3, None, exp)?;
    let sum = e.virt("row_sum", DataType::F32, rows)?;
    e.op(Operation::Reduction { op: ReduceOp::Add, x: exp, y: sum })?;
    let log = e.virt("log_sum", DataType::F32, rows)?;
    e.pointwise(PointwiseMode::Log, sum, None, log)?;
    let stats = e.real(uid::STATS, "stats", DataType::F32, shape.stats())?;
    e.pointwise(PointwiseMode::Add, max, Some(log), stats)?;
    let p = e.virt("probabilities", DataType::Bf16, scores)?;
    e.pointwise(PointwiseMode::Div, exp, Some(sum), p)?;
    let v = e.real(uid::V, "v", DataType::Bf16, shape.kv_bshd())?;
    let o = e.real(uid::O, "o", DataType::Bf16, shape.bshd())?;
    e.op(Operation::Matmul { a: p, b: v, c: o })?;
    e.finish()
}

/// The fused forward (cuDNN >= 9.21): a causal-mask subgraph (one diagonal-band mask), a softmax
/// operation that writes the statistics, and one `SDPA_FWD` operation. Returns the main graph.
pub fn forward_fused<B: GraphBuilder>(builder: &mut B, shape: &Shape) -> Result<GraphId, B::Error> {
    let scores = shape.scores();
    let mut e = Emitter::new(builder);
    let q = e.real(uid::Q, "q", DataType::Bf16, shape.bshd())?;
    let k = e.real(uid::K, "k", DataType::Bf16, shape.kv_bshd())?;
    let v = e.real(uid::V, "v", DataType::Bf16, shape.kv_bshd())?;
    let o = e.real(uid::O, "o", DataType::Bf16, shape.bshd())?;
    let scale = e.scalar(uid::SCALE, "scale")?;
    let neg_inf = e.scalar(uid::NEG_INF, "neg_inf")?;
    // The mask subgraph and the softmax are finalized operations the fused one refers to; they
    // are not operations of the main graph.
    let mask_input = e.virt("mask_input", DataType::F32, scores)?;
    let mask_output = e.virt("mask_output", DataType::F32, scores)?;
    let band = e.builder.operation(&Operation::DiagonalBandMask { x: mask_input, fill: neg_inf, y: mask_output })?;
    let mask = e.builder.graph(&[band], false)?;
    let softmax_x = e.virt("softmax_input", DataType::F32, scores)?;
    let softmax_y = e.virt("softmax_output", DataType::F32, scores)?;
    let stats = e.real(uid::STATS, "stats", DataType::F32, shape.stats())?;
    let softmax = e.builder.operation(&Operation::Softmax { x: softmax_x, y: softmax_y, stats })?;
    e.op(Operation::SdpaForward { q, k, v, o, scale, softmax, mask, mask_input, mask_output })?;
    e.finish()
}

/// The backward as the frontend's composite graph (22 operations with
/// [`BackwardForm::Accumulate`], 21 with [`BackwardForm::Deterministic`]; two reductions more
/// with grouped K/V, summing dK and dV over each group): softmax sums
/// `rowsum(dO * O)`, the probabilities again from the statistics (`P = exp(mask(S * scale) - LSE)`),
/// `dV = P^T dO`, `dS = P * (dO V^T - sums) * scale`, `dK = dS^T Q`, `dQ = dS K`. Returns the
/// main graph.
pub fn backward_composite<B: GraphBuilder>(
    builder: &mut B,
    shape: &Shape,
    form: BackwardForm,
) -> Result<GraphId, B::Error> {
    let mut e = Emitter::new(builder);
    let scores = shape.scores();
    let rows = shape.rows();
    // 1-3: softmax sums.
    let d_o = e.real(uid::DO, "do", DataType::Bf16, shape.bshd())?;
    let o = e.real(uid::O, "o", DataType::Bf16, shape.bshd())?;
    // The frontend gives this virtual tensor strides (HSD, SD, HD, 1); virtual strides are
    // not memory, and packed ones keep every tensor of the recording a valid memory layout.
    let product = e.virt("do_times_o", DataType::F32, shape.packed())?;
    e.pointwise(PointwiseMode::Mul, d_o, Some(o), product)?;
    let row_sum = e.virt("do_o_row_sum", DataType::F32, rows)?;
    e.op(Operation::Reduction { op: ReduceOp::Add, x: product, y: row_sum })?;
    let one = e.scalar(uid::ONE, "one")?;
    let sums = e.real(uid::SOFTMAX_SUM, "softmax_sum", DataType::F32, rows)?;
    e.pointwise(PointwiseMode::Mul, row_sum, Some(one), sums)?;
    // 4-11: the probabilities.
    let q = e.real(uid::Q, "q", DataType::Bf16, shape.bshd())?;
    let kt = e.real(uid::K, "k_transposed", DataType::Bf16, shape.kv_bhds())?;
    let s0 = e.virt("scores", DataType::F32, scores)?;
    e.op(Operation::Matmul { a: q, b: kt, c: s0 })?;
    let scale = e.scalar(uid::SCALE, "scale")?;
    let s1 = e.virt("scaled", DataType::F32, scores)?;
    e.pointwise(PointwiseMode::Mul, s0, Some(scale), s1)?;
    let stats = e.real(uid::STATS, "stats", DataType::F32, shape.stats())?;
    let s2 = e.virt("minus_lse", DataType::F32, scores)?;
    e.pointwise(PointwiseMode::Sub, s1, Some(stats), s2)?;
    let neg_inf = e.scalar(uid::NEG_INF, "neg_inf")?;
    let s3 = e.virt("masked", DataType::F32, scores)?;
    e.causal_mask(shape, s2, neg_inf, s3)?;
    let p = e.virt("probabilities", DataType::F32, scores)?;
    e.pointwise(PointwiseMode::Exp, s3, None, p)?;
    // 12-13: dV = P^T dO.
    let pt = e.virt("probabilities_transposed", DataType::Bf16, shape.scores_transposed())?;
    e.op(Operation::Reshape { x: p, y: pt })?;
    e.grouped_matmul(shape, pt, d_o, uid::DV, ("dv", "dv_full_heads"))?;
    // 14-17: dS.
    let vt = e.real(uid::V, "v_transposed", DataType::Bf16, shape.kv_bhds())?;
    let dp = e.virt("dp", DataType::F32, scores)?;
    e.op(Operation::Matmul { a: d_o, b: vt, c: dp })?;
    let dp_minus = e.virt("dp_minus_sum", DataType::F32, scores)?;
    e.pointwise(PointwiseMode::Sub, dp, Some(sums), dp_minus)?;
    let dp_p = e.virt("dp_times_p", DataType::F32, scores)?;
    e.pointwise(PointwiseMode::Mul, dp_minus, Some(p), dp_p)?;
    let ds = e.virt("ds", DataType::F32, scores)?;
    e.pointwise(PointwiseMode::Mul, dp_p, Some(scale), ds)?;
    // 18-19: dK = dS^T Q.
    let dst = e.virt("ds_transposed", DataType::Bf16, shape.scores_transposed())?;
    e.op(Operation::Reshape { x: ds, y: dst })?;
    e.grouped_matmul(shape, dst, q, uid::DK, ("dk", "dk_full_heads"))?;
    // 20-22: dQ = dS K.
    let kn = e.virt("k", DataType::F32, shape.kv_bshd())?;
    e.op(Operation::Reshape { x: kt, y: kn })?;
    match form {
        BackwardForm::Accumulate => {
            let accum = e.real(uid::DQ_ACCUM, "dq_accumulator", DataType::F32, shape.packed())?;
            e.op(Operation::Matmul { a: ds, b: kn, c: accum })?;
            let dq = e.real(uid::DQ, "dq", DataType::Bf16, shape.bshd())?;
            e.pointwise(PointwiseMode::Identity, accum, None, dq)?;
        }
        BackwardForm::Deterministic => {
            let dq = e.real(uid::DQ, "dq", DataType::Bf16, shape.bshd())?;
            e.op(Operation::Matmul { a: ds, b: kn, c: dq })?;
        }
    }
    e.finish()
}
