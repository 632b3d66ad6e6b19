//! One recipe per op: the op table's shape checks (`memo_plan_core::plan::shapes::check`, the
//! same call the CPU reference makes), the kernels' own limits, then the kernels and GEMMs that
//! compute it, sized from the checked [`OpShape`].
//!
//! GEMM layout. Every matrix in the arena is row-major bf16. BLAS is column-major, and a
//! row-major `r x c` matrix is the column-major `c x r` matrix (its transpose) with leading
//! dimension `c`. So `Y = X W^T` (row-major) is computed as `Y^T = W X^T` (column-major):
//! `m` = columns of Y, `n` = rows of Y, `op(A)` = W (stored as `W^T`, so transposed), `op(B)` =
//! `X^T` (as stored). Each GEMM below states its product both ways.
//!
//! Rounding. A GEMM computes in f32 and rounds C once; an accumulating op (`beta = 1`) adds the
//! stored bf16 value in f32 before that rounding, and `linear` writes its bias into `y` first and
//! uses `beta = 1`, so `y = round(x W^T + bias)`, one rounding as on the CPU. Only the order of
//! the f32 sums differs from the CPU (cuBLAS picks it), which the GPU tests' tolerance covers.

use memo_plan_core::plan::shapes::{self, OpError, OpShape, ShapeContext};
use memo_plan_core::plan::Op;
use memo_runtime::KernelContext;

use crate::{ArgShape, Gemm, KernelLaunch, Operand, Param, RecipeError, Step};

/// f32 and u32 bytes.
const WORD: u64 = 4;
/// Threads of the row and element kernels (whole warps on NVIDIA and AMD).
const BLOCK: u32 = 256;
/// Most blocks a grid-stride launch uses along x (the kernels loop over the rest).
const MAX_BLOCKS: u64 = 1 << 16;
/// Row chunks of a column sum: enough blocks to fill a GPU, partials that stay small.
const COLUMN_CHUNKS: u64 = 64;
/// Blocks of the gradient norm's first stage (fixed by the size alone: a fixed summation order).
const NORM_BLOCKS: u64 = 1024;
/// Columns one block of `memo_embedding_backward` owns (`MEMO_EMB_TILE * MEMO_EMB_COLS`).
const EMBEDDING_BACKWARD_COLUMNS: u64 = 256 * 8;
/// Scratch offsets are rounded up to this (any vector load is aligned): the plan's alignment.
const SCRATCH_ALIGN: u64 = memo_plan_core::bilevel::ALIGNMENT;

/// The launch, for the kernels' own limits (the op table's rules were checked by
/// [`shapes::check`]): errors name the argument by its index.
struct Args {
    op: Op,
}

impl Args {
    fn error(&self, index: usize, expected: String, found: String) -> RecipeError {
        OpError::shape(self.op, index, expected, found)
    }

    /// A count that a kernel takes as `u32` (row widths, the vocabulary).
    fn small(&self, index: usize, value: u64, what: &str) -> Result<u32, RecipeError> {
        u32::try_from(value).map_err(|_| {
            self.error(index, format!("{what} below 2^32 (the kernels index rows with 32 bits)"), value.to_string())
        })
    }

    /// A GEMM dimension or leading dimension (BLAS takes `int`).
    fn dim(&self, index: usize, value: u64, what: &str) -> Result<u32, RecipeError> {
        match u32::try_from(value) {
            Ok(v) if v <= i32::MAX as u32 => Ok(v),
            _ => Err(self.error(
                index,
                format!("{what} below 2^31 (BLAS dimensions are 32-bit signed); plan smaller chunks"),
                value.to_string(),
            )),
        }
    }
}

/// What the op table needs of the kernel context.
pub(crate) fn shape_context(ctx: &KernelContext) -> ShapeContext {
    ShapeContext {
        hidden: ctx.hidden,
        heads: ctx.heads,
        kv_heads: ctx.kv_heads,
        kv_replicated: ctx.kv_replicated,
        rope_theta: ctx.rope_theta,
        norm_eps: ctx.norm_eps,
        seq_len: ctx.seq_len,
        vocab: ctx.vocab,
        loss_scale_tokens: ctx.loss_scale_tokens,
        adamw_step: ctx.adamw.step,
        // This GPU's place in its tensor-parallel group: the vocabulary shard of the embedding,
        // classifier and cross-entropy ops (`spec/tensor-parallel.md`).
        rank: ctx.rank,
        ranks: ctx.ranks,
        // No GPU kernels of context parallelism yet (`without_kernel` refuses its ops).
        context_rank: 0,
        context_ranks: 1,
    }
}

fn ptr(arg: usize) -> Param {
    Param::Ptr { arg, byte_offset: 0 }
}

fn operand(arg: usize) -> Operand {
    Operand { arg, byte_offset: 0 }
}

/// Blocks for a grid-stride loop over `units` units of `per_block` each.
fn blocks(units: u64, per_block: u64) -> u32 {
    units.div_ceil(per_block.max(1)).clamp(1, MAX_BLOCKS) as u32
}

fn align(bytes: u64) -> u64 {
    bytes.div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN
}

/// A kernel launch with a 1-D block.
fn kernel(name: &'static str, grid: [u32; 3], block: u32, params: Vec<Param>, scratch_bytes: u64) -> Step {
    Step::Kernel(KernelLaunch { kernel: name, grid, block: [block, 1, 1], shared_bytes: 0, params, scratch_bytes })
}

/// Row chunking of a column sum over `rows` rows: (rows per chunk, chunks).
fn column_chunks(rows: u64) -> (u64, u64) {
    let per_chunk = rows.div_ceil(COLUMN_CHUNKS).max(1);
    (per_chunk, rows.div_ceil(per_chunk))
}

/// The recipe of one launch.
pub(crate) fn steps(op: Op, args: &[ArgShape], ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let s = shapes::check(op, args, &shape_context(ctx))?;
    let a = Args { op };
    match op {
        Op::Embedding => embedding(&a, &s, ctx),
        Op::LayerNorm => layer_norm(&a, &s, ctx),
        Op::Linear => linear(&a, &s),
        Op::Gelu => elementwise(&s, "memo_gelu_forward", &[0], 1),
        Op::GeluBackward => elementwise(&s, "memo_gelu_backward", &[0, 1], 2),
        Op::Add => elementwise(&s, "memo_add", &[0, 1], 2),
        Op::LinearBackwardInput => linear_backward_input(&a, &s, false),
        Op::LinearBackwardInputAccumulate => linear_backward_input(&a, &s, true),
        Op::LinearBackwardWeight => linear_backward_weight(&a, &s),
        Op::LayerNormBackward => norm_backward(&a, &s, ctx, false),
        Op::Classifier => classifier(&a, &s),
        Op::CrossEntropy => cross_entropy(&a, &s, ctx),
        Op::ClassifierBackwardWeight => classifier_backward_weight(&a, &s),
        Op::EmbeddingBackward => embedding_backward(&a, &s, ctx),
        Op::Zero => Ok(vec![Step::Zero { arg: 0 }]),
        Op::GradNormSquared => grad_norm_squared(&s),
        Op::AdamW => adamw(&a, &s, ctx),
        Op::Attention | Op::AttentionBackward => crate::attention::steps(&s, args, ctx),
        Op::AllGather | Op::ReduceScatter | Op::AllReduceSumBf16 | Op::AllReduceSumF32 | Op::AllReduceMaxF32 => {
            Err(OpError::needs_multi_gpu(op))
        }
        Op::LinearNoBias => linear_no_bias(&a, &s),
        Op::AddBias => add_bias(&a, &s),
        Op::CrossEntropyMax => cross_entropy_max(&a, &s, ctx),
        Op::CrossEntropySums => cross_entropy_sums(&a, &s, ctx),
        Op::CrossEntropyFinish => cross_entropy_finish(&a, &s, ctx),
        Op::RmsNorm => rms_norm(&a, &s, ctx),
        Op::RmsNormBackward => norm_backward(&a, &s, ctx, true),
        Op::Swiglu => swiglu(&a, &s, "memo_swiglu_forward", &[0, 1]),
        Op::SwigluBackward => swiglu(&a, &s, "memo_swiglu_backward", &[0, 1, 2]),
        Op::LinearBackwardWeightNoBias => linear_backward_weight_no_bias(&a, &s),
        // Context parallelism's ops: no GPU kernels yet ([`without_kernel`] says so up front).
        Op::Rotary
        | Op::RotaryBackward
        | Op::AttentionBlock
        | Op::AttentionBlockCausal
        | Op::AttentionRingInit
        | Op::AttentionRingFinish
        | Op::AttentionBlockBackward
        | Op::AttentionBlockBackwardCausal
        | Op::ToBf16
        | Op::RingExchange
        | Op::DataAllReduceSumBf16
        | Op::DataAllReduceSumF32 => Err(OpError::not_yet_wired(op, "GPU")),
    }
}

/// The refusal [`steps`] gives `op` whatever its shapes, when it has no GPU kernel (the
/// collectives run on NCCL or RCCL, so none today). Kept so that a runner's check of a plan's
/// ops before it opens devices stays in one place.
pub(crate) fn without_kernel(op: Op) -> Option<RecipeError> {
    // Context parallelism's ops (`spec/context-parallel.md`) have no GPU kernels yet.
    op.is_context_parallel().then(|| OpError::not_yet_wired(op, "GPU"))
}

/// The norms' epsilon as the kernels take it (f32, as the CPU reference uses it).
fn norm_eps(ctx: &KernelContext) -> Param {
    Param::F32(ctx.norm_eps as f32)
}

/// The parameters both embedding kernels take: the three arguments in order, then the shape.
fn embedding_params(rows: u64, width: u32, vocab: u32) -> Vec<Param> {
    vec![
        ptr(0),
        ptr(1),
        ptr(2),
        Param::U64(rows),
        Param::U32(width),
        Param::U32(vocab),
        Param::Status,
        Param::Instruction,
    ]
}

/// Token ids below this are valid for the embedding ops: the table's rows, but not its padding
/// rows past the vocabulary `V` (with `t > 1` the gathered table has `t * ceil(V / t)` rows), as
/// on the CPU.
fn token_limit(s: &OpShape, ctx: &KernelContext) -> u64 {
    s.features.min(ctx.vocab)
}

/// `embedding` [tokens, embedding, out].
fn embedding(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let rows = s.rows;
    let width = a.small(1, s.width, "a row width")?;
    let vocab = a.small(1, token_limit(s, ctx), "a vocabulary")?;
    if rows == 0 {
        return Ok(Vec::new());
    }
    let params = embedding_params(rows, width, vocab);
    Ok(vec![kernel("memo_embedding_forward", [blocks(rows, 1), 1, 1], BLOCK, params, 0)])
}

/// `embedding_backward` [tokens, dout, dembedding (read-write)].
fn embedding_backward(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let rows = s.rows;
    let width = a.small(2, s.width, "a row width")?;
    let vocab = a.small(2, token_limit(s, ctx), "a vocabulary")?;
    if rows == 0 {
        return Ok(Vec::new());
    }
    if vocab == 0 {
        return Err(OpError::context(a.op, "vocab", "is 0, so every token id is out of range".into()));
    }
    let column_tiles = u64::from(width).div_ceil(EMBEDDING_BACKWARD_COLUMNS).max(1);
    let column_tiles = u32::try_from(column_tiles).ok().filter(|&t| t <= 65_535).ok_or_else(|| {
        a.error(2, "rows of at most 65535 * 2048 elements".into(), format!("{width} elements per row"))
    })?;
    let params = embedding_params(rows, width, vocab);
    Ok(vec![kernel("memo_embedding_backward", [blocks(u64::from(vocab), 1), column_tiles, 1], BLOCK, params, 0)])
}

/// An element-wise op: `inputs` have the output's (argument `output`) shape, bf16.
fn elementwise(s: &OpShape, name: &'static str, inputs: &[usize], output: usize) -> Result<Vec<Step>, RecipeError> {
    let n = s.elements;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut params: Vec<Param> = inputs.iter().map(|&i| ptr(i)).collect();
    params.push(ptr(output));
    params.push(Param::U64(n));
    Ok(vec![kernel(name, [blocks(n, u64::from(BLOCK)), 1, 1], BLOCK, params, 0)])
}

/// `layer_norm` [x, scale, shift, y].
fn layer_norm(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let (rows, h) = (s.rows, s.width);
    let width = a.small(0, h, "`hidden`")?;
    if rows == 0 || width == 0 {
        return Ok(Vec::new());
    }
    let params = vec![ptr(0), ptr(1), ptr(2), ptr(3), Param::U64(rows), Param::U32(width), norm_eps(ctx)];
    Ok(vec![kernel("memo_layer_norm_forward", [blocks(rows, 1), 1, 1], BLOCK, params, 0)])
}

/// `rms_norm` [x, scale, y].
fn rms_norm(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let (rows, h) = (s.rows, s.width);
    let width = a.small(0, h, "`hidden`")?;
    if rows == 0 || width == 0 {
        return Ok(Vec::new());
    }
    let params = vec![ptr(0), ptr(1), ptr(2), Param::U64(rows), Param::U32(width), norm_eps(ctx)];
    Ok(vec![kernel("memo_rms_norm_forward", [blocks(rows, 1), 1, 1], BLOCK, params, 0)])
}

/// `swiglu` [x, y] and `swiglu_backward` [x, dy, dx]: one thread per gated element (`rows * w`),
/// the pointer arguments `pointers` in order, then the rows and `w`.
fn swiglu(a: &Args, s: &OpShape, name: &'static str, pointers: &[usize]) -> Result<Vec<Step>, RecipeError> {
    let width = a.small(0, s.width, "half a row of `x`")?;
    let n = s.elements;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut params: Vec<Param> = pointers.iter().map(|&i| ptr(i)).collect();
    params.extend([Param::U64(s.rows), Param::U32(width)]);
    Ok(vec![kernel(name, [blocks(n, u64::from(BLOCK)), 1, 1], BLOCK, params, 0)])
}

/// The norms' backward: `layer_norm_backward` [x, scale, dy, dx, dscale, dshift] (the kernels
/// `memo_layer_norm_backward_*`, two statistics per row, two parameter gradients) and
/// `rms_norm_backward` [x, scale, dy, dx, dscale] (`memo_rms_norm_backward_*`, one statistic,
/// one gradient).
///
/// Scratch: each row's statistics at 0 (LayerNorm: mean and rstd; RMSNorm: rstd), then per
/// parameter gradient its row-chunk partial sums, each summed in chunk order by
/// `memo_column_sum_finish` into its argument (4, then 5).
fn norm_backward(a: &Args, s: &OpShape, ctx: &KernelContext, rms: bool) -> Result<Vec<Step>, RecipeError> {
    let (kernels, statistics, gradients): ([&'static str; 2], u64, &[usize]) = if rms {
        (["memo_rms_norm_backward_rows", "memo_rms_norm_backward_params"], 1, &[4])
    } else {
        (["memo_layer_norm_backward_rows", "memo_layer_norm_backward_params"], 2, &[4, 5])
    };
    let (rows, h) = (s.rows, s.width);
    let width = a.small(0, h, "`hidden`")?;
    if width == 0 {
        return Ok(Vec::new());
    }
    if rows == 0 {
        return Ok(gradients.iter().map(|&arg| Step::Zero { arg }).collect());
    }
    let (per_chunk, chunks) = column_chunks(rows);
    let stats_bytes =
        rows.checked_mul(statistics * WORD).ok_or_else(|| a.error(0, "fewer rows".into(), rows.to_string()))?;
    let partial = align(stats_bytes);
    let per_gradient = chunks * h * WORD;
    let scratch = partial + gradients.len() as u64 * per_gradient;
    let column_blocks = blocks(h, u64::from(BLOCK));
    let chunks32 = chunks as u32; // at most COLUMN_CHUNKS
    let rows_params = vec![
        ptr(0),
        ptr(1),
        ptr(2),
        ptr(3),
        Param::Scratch { byte_offset: 0 },
        Param::U64(rows),
        Param::U32(width),
        norm_eps(ctx),
    ];
    let params_params = vec![
        ptr(0),
        ptr(2),
        Param::Scratch { byte_offset: 0 },
        Param::Scratch { byte_offset: partial },
        Param::U64(rows),
        Param::U32(width),
        Param::U64(per_chunk),
    ];
    let mut steps = vec![
        kernel(kernels[0], [blocks(rows, 1), 1, 1], BLOCK, rows_params, scratch),
        kernel(kernels[1], [column_blocks, chunks32, 1], BLOCK, params_params, scratch),
    ];
    for (index, &arg) in gradients.iter().enumerate() {
        let sums = Param::Scratch { byte_offset: partial + index as u64 * per_gradient };
        let params = vec![sums, ptr(arg), Param::U32(chunks32), Param::U32(width)];
        steps.push(kernel("memo_column_sum_finish", [column_blocks, 1, 1], BLOCK, params, scratch));
    }
    Ok(steps)
}

/// A GEMM, or what an empty contraction means: `C = 0` (beta 0) or nothing (beta 1).
fn gemm_or_empty(gemm: Gemm) -> Vec<Step> {
    if gemm.m == 0 || gemm.n == 0 {
        Vec::new()
    } else if gemm.k == 0 {
        if gemm.beta == 0.0 {
            vec![Step::Zero { arg: gemm.c.arg }]
        } else {
            Vec::new()
        }
    } else {
        vec![Step::Gemm(gemm)]
    }
}

/// `linear` [x, weight, bias, y]: `y = x W^T + bias`: the bias broadcast into y, then the
/// product added over it.
fn linear(a: &Args, s: &OpShape) -> Result<Vec<Step>, RecipeError> {
    let (rows, n) = (s.rows, s.features);
    if rows == 0 || n == 0 {
        return Ok(Vec::new());
    }
    let width = a.small(1, n, "output features")?;
    let total = rows.saturating_mul(n);
    let mut steps = vec![kernel(
        "memo_broadcast_row",
        [blocks(total, u64::from(BLOCK)), 1, 1],
        BLOCK,
        vec![ptr(2), ptr(3), Param::U64(rows), Param::U32(width)],
        0,
    )];
    steps.extend(forward_product(a, s, 3, 1.0)?);
    Ok(steps)
}

/// `linear_no_bias` [x, weight, y]: `y = x W^T`, one rounding (the GEMM of `linear` with beta 0
/// and no bias).
fn linear_no_bias(a: &Args, s: &OpShape) -> Result<Vec<Step>, RecipeError> {
    forward_product(a, s, 2, 0.0)
}

/// The forward product of a linear layer into argument `output`: `y = x W^T + beta * y`.
fn forward_product(a: &Args, s: &OpShape, output: usize, beta: f32) -> Result<Vec<Step>, RecipeError> {
    let (rows, k, n) = (s.rows, s.width, s.features);
    // Y^T (n x rows) = W (n x k) X^T (k x rows): A = the weight buffer (k x n column-major,
    // transposed), B = x (k x rows column-major), C = y (n x rows column-major).
    Ok(gemm_or_empty(Gemm {
        transpose_a: true,
        transpose_b: false,
        m: a.dim(1, n, "output features")?,
        n: a.dim(0, rows, "rows")?,
        k: a.dim(0, k, "input features")?,
        a: operand(1),
        lda: a.dim(0, k.max(1), "input features")?,
        b: operand(0),
        ldb: a.dim(0, k.max(1), "input features")?,
        c: operand(output),
        ldc: a.dim(1, n.max(1), "output features")?,
        alpha: 1.0,
        beta,
    }))
}

/// `add_bias` [bias, y (read-write)]: `y = round(y + bias)` per row.
fn add_bias(a: &Args, s: &OpShape) -> Result<Vec<Step>, RecipeError> {
    let n = s.elements;
    if n == 0 || s.width == 0 {
        return Ok(Vec::new());
    }
    let width = a.small(0, s.width, "a row width")?;
    Ok(vec![kernel(
        "memo_add_bias",
        [blocks(n, u64::from(BLOCK)), 1, 1],
        BLOCK,
        vec![ptr(0), ptr(1), Param::U64(s.rows), Param::U32(width)],
        0,
    )])
}

/// `linear_backward_input(_accumulate)` [dy, weight, dx]: `dx (+)= dy W`.
fn linear_backward_input(a: &Args, s: &OpShape, accumulate: bool) -> Result<Vec<Step>, RecipeError> {
    let (rows, k, n) = (s.rows, s.width, s.features);
    // dX^T (k x rows) = W^T (k x n) dY^T (n x rows): A = the weight buffer (k x n column-major,
    // as stored), B = dy (n x rows column-major), C = dx (k x rows column-major).
    Ok(gemm_or_empty(Gemm {
        transpose_a: false,
        transpose_b: false,
        m: a.dim(1, k, "input features")?,
        n: a.dim(0, rows, "rows")?,
        k: a.dim(0, n, "output features")?,
        a: operand(1),
        lda: a.dim(1, k.max(1), "input features")?,
        b: operand(0),
        ldb: a.dim(0, n.max(1), "output features")?,
        c: operand(2),
        ldc: a.dim(1, k.max(1), "input features")?,
        alpha: 1.0,
        beta: if accumulate { 1.0 } else { 0.0 },
    }))
}

/// Column sums of bf16 argument `src` (`rows x width`) into the bf16 row `dst` (scratch: the
/// row-chunk partials).
fn column_sum(src: usize, dst: usize, rows: u64, width: u32) -> Vec<Step> {
    let (per_chunk, chunks) = column_chunks(rows);
    let scratch = chunks * u64::from(width) * WORD;
    let column_blocks = blocks(u64::from(width), u64::from(BLOCK));
    let chunks32 = chunks as u32; // at most COLUMN_CHUNKS
    vec![
        kernel(
            "memo_column_sum_partial",
            [column_blocks, chunks32, 1],
            BLOCK,
            vec![
                ptr(src),
                Param::Scratch { byte_offset: 0 },
                Param::U64(rows),
                Param::U32(width),
                Param::U64(per_chunk),
            ],
            scratch,
        ),
        kernel(
            "memo_column_sum_finish",
            [column_blocks, 1, 1],
            BLOCK,
            vec![Param::Scratch { byte_offset: 0 }, ptr(dst), Param::U32(chunks32), Param::U32(width)],
            scratch,
        ),
    ]
}

/// `linear_backward_weight` [x, dy, dweight, dbias]: `dW = dy^T x`, `dbias = column sums of dy`.
fn linear_backward_weight(a: &Args, s: &OpShape) -> Result<Vec<Step>, RecipeError> {
    let (rows, n) = (s.rows, s.features);
    if n == 0 {
        return Ok(Vec::new());
    }
    if rows == 0 {
        return Ok(vec![Step::Zero { arg: 2 }, Step::Zero { arg: 3 }]);
    }
    let mut steps = weight_gradient(a, s)?;
    steps.extend(column_sum(1, 3, rows, a.small(1, n, "output features")?));
    Ok(steps)
}

/// `linear_backward_weight_no_bias` [x, dy, dweight]: `dW = dy^T x`, the GEMM of
/// `linear_backward_weight` without the bias's column sums.
fn linear_backward_weight_no_bias(a: &Args, s: &OpShape) -> Result<Vec<Step>, RecipeError> {
    if s.features == 0 {
        return Ok(Vec::new());
    }
    if s.rows == 0 {
        return Ok(vec![Step::Zero { arg: 2 }]);
    }
    weight_gradient(a, s)
}

/// `dweight` (argument 2) `= dy^T x` for x (argument 0) and dy (argument 1).
fn weight_gradient(a: &Args, s: &OpShape) -> Result<Vec<Step>, RecipeError> {
    let (rows, k, n) = (s.rows, s.width, s.features);
    // dW^T (k x n) = X^T (k x rows) dY (rows x n): A = x (k x rows column-major, as stored),
    // B = dy (n x rows column-major, transposed), C = dweight (k x n column-major).
    Ok(gemm_or_empty(Gemm {
        transpose_a: false,
        transpose_b: true,
        m: a.dim(0, k, "input features")?,
        n: a.dim(1, n, "output features")?,
        k: a.dim(0, rows, "rows")?,
        a: operand(0),
        lda: a.dim(0, k.max(1), "input features")?,
        b: operand(1),
        ldb: a.dim(1, n, "output features")?,
        c: operand(2),
        ldc: a.dim(0, k.max(1), "input features")?,
        alpha: 1.0,
        beta: 0.0,
    }))
}

/// `classifier` [x, embedding, logits]: `logits = x E^T`.
fn classifier(a: &Args, s: &OpShape) -> Result<Vec<Step>, RecipeError> {
    let (h, vocab) = (s.width, s.features);
    // Logits^T (vocab x rows) = E (vocab x h) X^T (h x rows), as in `linear`.
    Ok(gemm_or_empty(Gemm {
        transpose_a: true,
        transpose_b: false,
        m: a.dim(1, vocab, "the vocabulary")?,
        n: a.dim(0, s.rows, "rows")?,
        k: a.dim(0, h, "`hidden`")?,
        a: operand(1),
        lda: a.dim(0, h.max(1), "`hidden`")?,
        b: operand(0),
        ldb: a.dim(0, h.max(1), "`hidden`")?,
        c: operand(2),
        ldc: a.dim(1, vocab.max(1), "the vocabulary")?,
        alpha: 1.0,
        beta: 0.0,
    }))
}

/// `classifier_backward_weight` [x, dlogits, dembedding (read-write)]: `dE += dlogits^T x`.
fn classifier_backward_weight(a: &Args, s: &OpShape) -> Result<Vec<Step>, RecipeError> {
    let (h, vocab) = (s.width, s.features);
    // dE^T (h x vocab) += X^T (h x rows) dLogits (rows x vocab), as in linear_backward_weight.
    Ok(gemm_or_empty(Gemm {
        transpose_a: false,
        transpose_b: true,
        m: a.dim(0, h, "`hidden`")?,
        n: a.dim(1, vocab, "the vocabulary")?,
        k: a.dim(0, s.rows, "rows")?,
        a: operand(0),
        lda: a.dim(0, h.max(1), "`hidden`")?,
        b: operand(1),
        ldb: a.dim(1, vocab.max(1), "the vocabulary")?,
        c: operand(2),
        ldc: a.dim(0, h.max(1), "`hidden`")?,
        alpha: 1.0,
        beta: 1.0,
    }))
}

/// `cross_entropy` [logits (read-write), targets, loss (read-write)]. Scratch: one f32 loss per
/// row, summed into `loss` in a fixed order by `memo_sum_into_scalar`.
fn cross_entropy(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let rows = s.rows;
    let vocab = a.small(0, s.width, "a vocabulary")?;
    if rows == 0 {
        return Ok(Vec::new());
    }
    let scratch = rows.checked_mul(WORD).ok_or_else(|| a.error(0, "fewer rows".into(), rows.to_string()))?;
    Ok(vec![
        kernel(
            "memo_cross_entropy",
            [blocks(rows, 1), 1, 1],
            BLOCK,
            vec![
                ptr(0),
                ptr(1),
                Param::Scratch { byte_offset: 0 },
                Param::U64(rows),
                Param::U32(vocab),
                Param::F32(ctx.loss_scale_tokens as f32),
                Param::Status,
                Param::Instruction,
            ],
            scratch,
        ),
        kernel(
            "memo_sum_into_scalar",
            [1, 1, 1],
            1024,
            vec![Param::Scratch { byte_offset: 0 }, Param::U64(rows), ptr(2)],
            scratch,
        ),
    ])
}

/// The rank's vocabulary geometry for the split cross-entropy: (`V'` columns, the columns below
/// the vocabulary, the rank's first vocabulary id, `V`), each checked to fit the kernels.
fn vocab_geometry(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<(u32, u32, u64, u32), RecipeError> {
    let shape_ctx = shape_context(ctx);
    let width = a.small(0, s.width, "a vocabulary shard")?;
    let valid = a.small(0, shape_ctx.vocab_columns(), "a vocabulary shard")?;
    let vocab = u32::try_from(ctx.vocab)
        .map_err(|_| OpError::context(a.op, "vocab", format!("is {}; the kernels take it below 2^32", ctx.vocab)))?;
    Ok((width, valid, shape_ctx.vocab_offset(), vocab))
}

/// `cross_entropy_max` [logits, max]: per row, the maximum of this rank's logits below `V`.
fn cross_entropy_max(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let (width, valid, _, _) = vocab_geometry(a, s, ctx)?;
    if s.rows == 0 {
        return Ok(Vec::new());
    }
    let params = vec![ptr(0), ptr(1), Param::U64(s.rows), Param::U32(width), Param::U32(valid)];
    Ok(vec![kernel("memo_cross_entropy_max", [blocks(s.rows, 1), 1, 1], BLOCK, params, 0)])
}

/// `cross_entropy_sums` [logits, targets, max, sums]: per row, the sum of exponentials of this
/// rank's logits and the target's logit if this rank holds it (at the rank's vocabulary offset).
fn cross_entropy_sums(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let (width, valid, offset, vocab) = vocab_geometry(a, s, ctx)?;
    if s.rows == 0 {
        return Ok(Vec::new());
    }
    let params = vec![
        ptr(0),
        ptr(1),
        ptr(2),
        ptr(3),
        Param::U64(s.rows),
        Param::U32(width),
        Param::U32(valid),
        Param::U64(offset),
        Param::U32(vocab),
        Param::Status,
        Param::Instruction,
    ];
    Ok(vec![kernel("memo_cross_entropy_sums", [blocks(s.rows, 1), 1, 1], BLOCK, params, 0)])
}

/// `cross_entropy_finish` [logits (read-write), targets, max, sums, loss (read-write)]. Scratch:
/// one f32 loss per row, summed into `loss` in a fixed order by `memo_sum_into_scalar`.
fn cross_entropy_finish(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let (width, valid, offset, vocab) = vocab_geometry(a, s, ctx)?;
    let rows = s.rows;
    if rows == 0 {
        return Ok(Vec::new());
    }
    let scratch = rows.checked_mul(WORD).ok_or_else(|| a.error(0, "fewer rows".into(), rows.to_string()))?;
    Ok(vec![
        kernel(
            "memo_cross_entropy_finish",
            [blocks(rows, 1), 1, 1],
            BLOCK,
            vec![
                ptr(0),
                ptr(1),
                ptr(2),
                ptr(3),
                Param::Scratch { byte_offset: 0 },
                Param::U64(rows),
                Param::U32(width),
                Param::U32(valid),
                Param::U64(offset),
                Param::U32(vocab),
                Param::F32(ctx.loss_scale_tokens as f32),
                Param::Status,
                Param::Instruction,
            ],
            scratch,
        ),
        kernel(
            "memo_sum_into_scalar",
            [1, 1, 1],
            1024,
            vec![Param::Scratch { byte_offset: 0 }, Param::U64(rows), ptr(4)],
            scratch,
        ),
    ])
}

/// `grad_norm_squared` [grad, sum_squares (read-write)]. Scratch: one f32 per first-stage block.
fn grad_norm_squared(s: &OpShape) -> Result<Vec<Step>, RecipeError> {
    let n = s.elements;
    if n == 0 {
        return Ok(Vec::new());
    }
    let partials = n.div_ceil(u64::from(BLOCK)).clamp(1, NORM_BLOCKS);
    let scratch = partials * WORD;
    Ok(vec![
        kernel(
            "memo_sum_squares_partial",
            [partials as u32, 1, 1],
            BLOCK,
            vec![ptr(0), Param::U64(n), Param::Scratch { byte_offset: 0 }],
            scratch,
        ),
        kernel(
            "memo_sum_into_scalar",
            [1, 1, 1],
            1024,
            vec![Param::Scratch { byte_offset: 0 }, Param::U64(partials), ptr(1)],
            scratch,
        ),
    ])
}

/// `adamw` [parameter (read-write), grad, optimizer_state (read-write), grad_norm_squared].
/// The host-side constants are computed exactly as the CPU reference computes them.
fn adamw(a: &Args, s: &OpShape, ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let hp = ctx.adamw;
    let rows = s.rows;
    let width = a.small(0, s.width, "a row width")?;
    let n = s.elements;
    let step = hp.step as f64;
    let correction1 = (1.0 - f64::from(hp.beta1).powf(step)) as f32;
    let correction2_sqrt = (1.0 - f64::from(hp.beta2).powf(step)).sqrt() as f32;
    let step_size = hp.lr / correction1;
    let decay = 1.0 - hp.lr * hp.weight_decay;
    // Launched even when empty: the kernel still checks the norm (the CPU errors on a
    // non-finite norm whatever the parameter's size).
    Ok(vec![kernel(
        "memo_adamw",
        [blocks(n, u64::from(BLOCK)), 1, 1],
        BLOCK,
        vec![
            ptr(0),
            ptr(1),
            ptr(2),
            ptr(3),
            Param::U64(rows),
            Param::U32(width),
            Param::F32(hp.beta1),
            Param::F32(hp.beta2),
            Param::F32(hp.eps),
            Param::F32(hp.max_grad_norm),
            Param::F32(step_size),
            Param::F32(decay),
            Param::F32(correction2_sqrt),
            Param::Status,
            Param::Instruction,
        ],
        0,
    )])
}
