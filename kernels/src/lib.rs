//! The GPU kernels shared by `runtime-cuda` (NVRTC) and `runtime-hip` (hiprtc), and the
//! backend-neutral recipe that turns one plan launch into kernel launches and GEMMs.
//!
//! A GPU backend does three things with this crate and nothing else op-specific:
//! 1. compiles every [`Source`] of [`SOURCES`] once (with [`HEADER`] available as `memo_gpu.h`
//!    and the options of [`compile_options`]);
//! 2. for each plan launch, calls [`launch_steps`] with the arguments' shapes and the
//!    [`KernelContext`];
//! 3. executes the returned [`Step`]s in order on the launch's stream: a [`Step::Kernel`] by name
//!    with its grid, block, dynamic shared memory and parameters, a [`Step::Gemm`] with cuBLAS
//!    `cublasGemmEx` / hipBLAS `hipblasGemmEx` (column-major, bf16 in and out, fp32 compute),
//!    a [`Step::Zero`] with an async memset.
//!
//! Device addresses: [`Param::Ptr`] and [`Operand`] name an argument by its index in
//! [`memo_plan_core::plan::Op::signature`] order plus a byte offset; the backend adds the
//! argument's span offset to the arena's base address. [`Param::Scratch`] points into the
//! backend's per-stream scratch memory ([`scratch_bytes`] of it), [`Param::Status`] at its status
//! words ([`status_error`] reads them), [`Param::Instruction`] is the plan instruction.
//!
//! `kernels/README.md` describes the kernels, the portability header and how to compile-check
//! them; the recipes are in `recipes.rs` (attention's in `attention.rs`).
// The test-only emulated backend implements the unsafe `Backend::launch` and `copy` (it runs them
// synchronously, so it needs nothing of their contract); everything else has no unsafe code.
#![cfg_attr(not(test), forbid(unsafe_code))]
#![cfg_attr(test, deny(unsafe_code))]
#![deny(missing_docs)]

use memo_plan_core::plan::Op;
use memo_runtime::KernelContext;

mod attention;
#[cfg(test)]
mod emulation;
#[cfg(test)]
mod emulation_backend;
mod recipes;
#[cfg(test)]
mod scratch_tests;
#[cfg(test)]
mod tests;

/// The portability header (`memo_gpu.h`): bf16 type and conversions, warp size, shuffles,
/// launch bounds, for CUDA and HIP.
pub const HEADER: &str = include_str!("../memo_gpu.h");

/// One kernel source file.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    /// File name in `kernels/` (e.g. `elementwise.cu`), for compiler logs.
    pub name: &'static str,
    /// The source text.
    pub text: &'static str,
    /// The `extern "C"` kernels it defines.
    pub kernels: &'static [&'static str],
}

impl Source {
    /// The source with `#include "memo_gpu.h"` replaced by [`HEADER`]'s text: what a backend
    /// hands its compiler, so that no include path or named header is needed.
    /// (The header's `#pragma once` is dropped: in a main file clang warns about it.)
    pub fn standalone_text(&self) -> String {
        self.text.replacen("#include \"memo_gpu.h\"", &HEADER.replacen("#pragma once\n", "", 1), 1)
    }
}

/// Every kernel source.
pub const SOURCES: &[Source] = &[
    Source {
        name: "elementwise.cu",
        text: include_str!("../elementwise.cu"),
        kernels: &[
            "memo_embedding_forward",
            "memo_embedding_backward",
            "memo_gelu_forward",
            "memo_gelu_backward",
            "memo_swiglu_forward",
            "memo_swiglu_backward",
            "memo_add",
            "memo_broadcast_row",
            "memo_add_bias",
            "memo_column_sum_partial",
            "memo_column_sum_finish",
        ],
    },
    Source {
        name: "norm.cu",
        text: include_str!("../norm.cu"),
        kernels: &[
            "memo_layer_norm_forward",
            "memo_layer_norm_backward_rows",
            "memo_layer_norm_backward_params",
            "memo_rms_norm_forward",
            "memo_rms_norm_backward_rows",
            "memo_rms_norm_backward_params",
        ],
    },
    Source {
        name: "loss.cu",
        text: include_str!("../loss.cu"),
        kernels: &[
            "memo_cross_entropy",
            "memo_sum_into_scalar",
            "memo_cross_entropy_max",
            "memo_cross_entropy_sums",
            "memo_cross_entropy_finish",
        ],
    },
    Source {
        name: "optim.cu",
        text: include_str!("../optim.cu"),
        kernels: &["memo_sum_squares_partial", "memo_adamw"],
    },
    attention::SOURCE,
    Source { name: "rope.cu", text: include_str!("../rope.cu"), kernels: &["memo_rope", "memo_lse_transpose"] },
];

/// The compiler a source is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// NVRTC for an NVIDIA compute capability (`80` for sm_80, `90` for sm_90).
    Cuda {
        /// Compute capability, major * 10 + minor.
        sm: u32,
    },
    /// hiprtc for an AMD architecture (`gfx90a`).
    Hip {
        /// The `--offload-arch` name.
        gfx: &'static str,
    },
}

/// The variant of the CUDA attention kernels' tensor path (`kernels/attention.cu`, the comment
/// at its top). Both compute the same values: the CPU emulation runs both and checks that the
/// pipelined variant's ldmatrix fragments are the baseline's word fragments. HIP builds ignore
/// it (their path is scalar).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionVariant {
    /// Fragments read as 32-bit words, each streamed tile loaded after the barrier that frees its
    /// buffer: the default, verified and measured on an H200 (2026-12-04).
    #[default]
    Baseline,
    /// `ldmatrix` fragments, `cvt.rn.bf16x2.f32` packs, the next streamed tiles' global loads in
    /// flight during the current tile's math (`-DMEMO_ATTN_PIPELINED=1`); not yet run on a GPU.
    Pipelined,
}

impl AttentionVariant {
    /// Every variant.
    pub const ALL: [AttentionVariant; 2] = [AttentionVariant::Baseline, AttentionVariant::Pipelined];

    /// The variant's name (what [`AttentionVariant::parse`] reads).
    pub fn name(self) -> &'static str {
        match self {
            AttentionVariant::Baseline => "baseline",
            AttentionVariant::Pipelined => "pipelined",
        }
    }

    /// The variant named `text`; an error lists the names.
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|v| v.name() == text).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
            format!("unknown attention kernel variant {text:?}: expected one of {}", names.join(", "))
        })
    }

    /// Options to add to [`compile_options`] of a CUDA target.
    pub fn options(self) -> Vec<String> {
        match self {
            AttentionVariant::Baseline => Vec::new(),
            AttentionVariant::Pipelined => vec!["-DMEMO_ATTN_PIPELINED=1".into()],
        }
    }
}

/// The compiler options for `target` (the include of `memo_gpu.h` is the backend's job: it
/// passes [`HEADER`] as a named header or writes it next to the sources).
pub fn compile_options(target: Target) -> Vec<String> {
    match target {
        Target::Cuda { sm } => vec![format!("--gpu-architecture=sm_{sm}"), "-std=c++17".into(), "-DMEMO_CUDA=1".into()],
        Target::Hip { gfx } => vec![format!("--offload-arch={gfx}"), "-std=c++17".into(), "-DMEMO_HIP=1".into()],
    }
}

/// A kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Param {
    /// A device pointer into the backend's scratch memory of the launch's stream, `byte_offset`
    /// bytes from its start (256-byte aligned). A launch's steps use at most
    /// [`KernelLaunch::scratch_bytes`] bytes of it; what one step writes there, a later step of
    /// the same launch reads (stream order). Nothing survives the launch.
    Scratch {
        /// Bytes from the scratch memory's start.
        byte_offset: u64,
    },
    /// A device pointer to the backend's [`STATUS_WORDS`] status words (`u32`), where a kernel
    /// reports bad input (`memo_report` in `memo_gpu.h`); the backend zeroes them when it
    /// allocates and after reading them, and reads them at synchronize ([`status_error`]).
    Status,
    /// The plan instruction's index as a `u32` (saturated), for the status words.
    Instruction,
    /// A device pointer: argument `arg`'s first byte plus `byte_offset`.
    Ptr {
        /// Index in the op's signature.
        arg: usize,
        /// Bytes past the argument's first byte.
        byte_offset: u64,
    },
    /// A 32-bit unsigned integer.
    U32(u32),
    /// A 64-bit unsigned integer.
    U64(u64),
    /// A 32-bit float.
    F32(f32),
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelLaunch {
    /// The `extern "C"` name.
    pub kernel: &'static str,
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    /// Parameters in the kernel's order.
    pub params: Vec<Param>,
    /// Bytes of the stream's scratch memory the launch's steps use (from offset 0; 0 when none).
    /// The same value on every step of a launch: a backend sizes its scratch with
    /// [`scratch_bytes`].
    pub scratch_bytes: u64,
}

/// The recipes' scratch as the planner asks for it (`spec/plan-format.md`, "Launch scratch"):
/// for each launch, [`scratch_bytes`] of its [`launch_steps`], a pure function of the op and its
/// shapes, so a backend that runs these recipes (CUDA, HIP) answers it before planning, with no
/// device. A launch the recipes refuse asks nothing (the backend refuses it when it runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecipeScratch;

impl memo_plan_core::plan::scratch::ScratchSizer for RecipeScratch {
    fn scratch_bytes(&self, op: Op, args: &[ArgShape], ctx: &memo_plan_core::plan::shapes::ShapeContext) -> u64 {
        launch_steps(op, args, &kernel_context(ctx)).map_or(0, |steps| scratch_bytes(&steps))
    }
}

/// The kernels' context for the op table's shape context, as a backend sizes scratch before
/// planning (the optimizer's settings, but its step, do not size anything: defaults).
pub fn kernel_context(ctx: &memo_plan_core::plan::shapes::ShapeContext) -> KernelContext {
    KernelContext {
        hidden: ctx.hidden,
        heads: ctx.heads,
        kv_heads: ctx.kv_heads,
        kv_replicated: ctx.kv_replicated,
        rope_theta: ctx.rope_theta,
        norm_eps: ctx.norm_eps,
        seq_len: ctx.seq_len,
        vocab: ctx.vocab,
        loss_scale_tokens: ctx.loss_scale_tokens,
        adamw: memo_runtime::AdamW { step: ctx.adamw_step, ..memo_runtime::AdamW::default() },
        rank: ctx.rank,
        ranks: ctx.ranks,
        context_rank: ctx.context_rank,
        context_ranks: ctx.context_ranks,
    }
}

/// The scratch memory `steps` need: the largest [`KernelLaunch::scratch_bytes`].
pub fn scratch_bytes(steps: &[Step]) -> u64 {
    steps
        .iter()
        .map(|step| match step {
            Step::Kernel(launch) => launch.scratch_bytes,
            Step::Gemm(_) | Step::Zero { .. } => 0,
        })
        .max()
        .unwrap_or(0)
}

/// Status words a backend keeps for [`Param::Status`].
pub const STATUS_WORDS: usize = 4;

/// What non-zero status words say: the plan instruction and the message, for
/// `BackendError::Kernel` (`None` when the words are all zero: no kernel reported anything).
pub fn status_error(words: [u32; STATUS_WORDS]) -> Option<(usize, String)> {
    let [code, instruction, a, b] = words;
    let message = match code {
        0 => return None,
        1 => format!(
            "a kernel found token id {b} in row {a} of `tokens`, not below the vocabulary size; the input data is \
             corrupt"
        ),
        2 => format!(
            "a kernel found target {b} in row {a} of `targets`, not below the vocabulary size; the input data is \
             corrupt"
        ),
        3 => format!(
            "op `adamw`, argument `grad_norm_squared`: the value is {}: the gradients overflowed or hold NaN; lower \
             the learning rate or check the data (no parameter was updated by this launch)",
            f32::from_bits(a)
        ),
        other => format!("a kernel reported status code {other} ({a}, {b}), which this version does not know"),
    };
    Some((instruction as usize, message))
}

/// A matrix operand of a GEMM: argument `arg` from `byte_offset` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    /// Index in the op's signature.
    pub arg: usize,
    /// Bytes past the argument's first byte.
    pub byte_offset: u64,
}

/// `C = alpha * op(A) op(B) + beta * C`, column-major as BLAS defines it; A, B and C bf16,
/// computed in fp32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    /// `op(A) = A^T`.
    pub transpose_a: bool,
    /// `op(B) = B^T`.
    pub transpose_b: bool,
    /// Rows of `op(A)` and of C.
    pub m: u32,
    /// Columns of `op(B)` and of C.
    pub n: u32,
    /// Columns of `op(A)`, rows of `op(B)`.
    pub k: u32,
    /// A.
    pub a: Operand,
    /// A's leading dimension.
    pub lda: u32,
    /// B.
    pub b: Operand,
    /// B's leading dimension.
    pub ldb: u32,
    /// C.
    pub c: Operand,
    /// C's leading dimension.
    pub ldc: u32,
    /// alpha.
    pub alpha: f32,
    /// beta (1.0 accumulates into C).
    pub beta: f32,
}

/// One thing a backend does for a launch, in order, on the launch's stream.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// A kernel from [`SOURCES`].
    Kernel(KernelLaunch),
    /// A GEMM.
    Gemm(Gemm),
    /// Set every byte of argument `arg` to zero.
    Zero {
        /// Index in the op's signature.
        arg: usize,
    },
}

/// The shape of one launch argument (what the backend knows from the plan): the op table's.
pub use memo_plan_core::plan::shapes::ArgShape;

/// Why a launch has no recipe: the op, the argument and what is wrong, and how to fix it. It is
/// the launch error of every backend (`memo_plan_core::plan::shapes::OpError`), so a launch the
/// CPU reference refuses is refused here with the same error.
pub type RecipeError = memo_plan_core::plan::shapes::OpError;

/// The steps that run `op` on arguments of these shapes (in signature order). Shapes are
/// checked by the op table's rules, the CPU reference's check; an op with no GPU kernel (the collectives, which
/// need several GPUs) is an error.
pub fn launch_steps(op: Op, args: &[ArgShape], context: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    recipes::steps(op, args, context)
}

/// The dimensions of an attention launch (`op` is [`Op::Attention`] or
/// [`Op::AttentionBackward`]) after the op table's check of its arguments: what a backend that
/// runs attention by other means than [`launch_steps`] (runtime-cuda's cuDNN path) needs.
pub fn attention_shape(
    op: Op,
    args: &[ArgShape],
    context: &KernelContext,
) -> Result<memo_plan_core::plan::shapes::AttentionShape, RecipeError> {
    let shape = memo_plan_core::plan::shapes::check(op, args, &recipes::shape_context(context))?;
    shape.attention_geometry()
}

/// Threads per block of `memo_rope` (`rope.cu`).
pub const ROPE_THREADS: u32 = 256;
/// At most this many blocks of `memo_rope` (it loops over the rest, grid-stride).
const ROPE_MAX_BLOCKS: u64 = 1 << 20;

/// One launch of `memo_rope` (`rope.cu`): `y = RoPE(x)` (or its inverse, for gradients) over the
/// rows of `shape` (`sequences * seq_len` rows of `heads * head_dim` bf16), base `rope_theta`
/// (the model's, [`KernelContext::rope_theta`]). `x` and `y` are pointer parameters
/// ([`Param::Ptr`] or [`Param::Scratch`]) and may be the same (in place).
pub fn rope_step(
    x: Param,
    y: Param,
    shape: &memo_plan_core::plan::shapes::AttentionShape,
    inverse: bool,
    rope_theta: f64,
) -> Step {
    let rows = shape.sequences.saturating_mul(shape.seq_len);
    let pairs = rows.saturating_mul(shape.heads).saturating_mul(shape.head_dim / 2);
    let blocks = pairs.div_ceil(u64::from(ROPE_THREADS)).clamp(1, ROPE_MAX_BLOCKS);
    let narrow = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    Step::Kernel(KernelLaunch {
        kernel: "memo_rope",
        grid: [narrow(blocks), 1, 1],
        block: [ROPE_THREADS, 1, 1],
        shared_bytes: 0,
        params: vec![
            x,
            y,
            Param::U64(rows),
            Param::U32(narrow(shape.heads)),
            Param::U32(narrow(shape.head_dim)),
            Param::U32(narrow(shape.seq_len)),
            Param::U32(u32::from(inverse)),
            Param::U64(rope_theta.to_bits()),
        ],
        scratch_bytes: 0,
    })
}

/// One launch of `memo_lse_transpose` (`rope.cu`): the log-sum-exp of `shape` between the plan's
/// token-major `[rows, heads]` f32 and cuDNN's head-major (sequence, head, position) layout
/// (`to_head_major`: from the plan's to cuDNN's; else back). `x` and `y` must not overlap.
pub fn lse_transpose_step(
    x: Param,
    y: Param,
    shape: &memo_plan_core::plan::shapes::AttentionShape,
    to_head_major: bool,
) -> Step {
    let elements = shape.sequences.saturating_mul(shape.seq_len).saturating_mul(shape.heads);
    let blocks = elements.div_ceil(u64::from(ROPE_THREADS)).clamp(1, ROPE_MAX_BLOCKS);
    let narrow = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    Step::Kernel(KernelLaunch {
        kernel: "memo_lse_transpose",
        grid: [narrow(blocks), 1, 1],
        block: [ROPE_THREADS, 1, 1],
        shared_bytes: 0,
        params: vec![
            x,
            y,
            Param::U64(shape.sequences),
            Param::U32(narrow(shape.seq_len)),
            Param::U32(narrow(shape.heads)),
            Param::U32(u32::from(to_head_major)),
        ],
        scratch_bytes: 0,
    })
}

/// Why `op` cannot run on a GPU at all, whatever its shapes: an op with no GPU kernel. `None`
/// for every op today (the `t > 1` step's split ops have kernels; the collectives run on NCCL or
/// RCCL). A runner checks a plan's ops with this before it opens devices, so that a plan with
/// such an op would be refused before anything runs.
pub fn without_gpu_kernel(op: Op) -> Option<RecipeError> {
    recipes::without_kernel(op)
}
