//! Launch recipes of `attention` and `attention_backward` (kernels in `kernels/attention.cu`).
//!
//! Every kernel works on tiles of [`OWNER_ROWS`] rows of one head of one sequence: grid
//! `(ceil(s / 64), heads, sequences)` (the dk/dv kernel: `kv_heads` on y), [`THREADS`] threads,
//! static shared memory only (under 48 KiB, so no opt-in attribute is needed). The forward is one
//! kernel; the backward is two independent kernels (dk and dv per key tile of a K/V head, dq per
//! query tile) that need no scratch memory and no atomics. Grouped-query attention: query head `i`
//! uses K/V head `(first_query + i) / group`
//! ([`AttentionShape::kv_head`](memo_plan_core::plan::shapes::AttentionShape::kv_head)); the dk/dv
//! block of a K/V head sums the gradients of the launch's query heads that use it, in increasing
//! head order, in its f32 accumulators (deterministic), and stores zeros for a K/V head none of
//! them uses (replicated K/V). The shapes are the op table's (`memo_plan_core::plan::shapes::check`, the CPU
//! reference's check too), so a launch the CPU reference refuses is refused here with the same
//! error; head dims other than [`HEAD_DIMS`] have no kernel and are refused.
//!
//! Testing without a GPU: `attention_emulation.rs` re-runs the kernels' code on the CPU (both
//! compute paths, lane by lane for the tensor cores) and the tests compare it with `runtime-cpu`.
//! On a GPU, `kernels/attention_gpu_check.py` compiles the source with NVRTC, launches these
//! recipes' grids and compares with a float64 PyTorch reference.

use memo_plan_core::plan::shapes::{OpError, OpErrorKind, OpShape};
use memo_plan_core::plan::Op;
use memo_runtime::KernelContext;

use crate::{ArgShape, KernelLaunch, Param, RecipeError, Source, Step};

/// The kernel source.
pub(crate) const SOURCE: Source = Source {
    name: "attention.cu",
    text: include_str!("../attention.cu"),
    kernels: &[
        "memo_attention_forward_d16",
        "memo_attention_forward_d32",
        "memo_attention_forward_d64",
        "memo_attention_forward_d128",
        "memo_attention_backward_dkdv_d16",
        "memo_attention_backward_dkdv_d32",
        "memo_attention_backward_dkdv_d64",
        "memo_attention_backward_dkdv_d128",
        "memo_attention_backward_dq_d16",
        "memo_attention_backward_dq_d32",
        "memo_attention_backward_dq_d64",
        "memo_attention_backward_dq_d128",
    ],
};

/// Head dims with a kernel (`MEMO_ATTENTION_KERNELS` in the source).
pub(crate) const HEAD_DIMS: [u64; 4] = [16, 32, 64, 128];
/// Rows of q (forward, dq) or of k (dk, dv) per block: `MEMO_ATTN_OWNER` in the source.
pub(crate) const OWNER_ROWS: u64 = 64;
/// Threads per block: `MEMO_ATTN_THREADS` in the source.
pub(crate) const THREADS: u32 = 128;
/// CUDA's limit on grid y and z (heads and sequences).
const GRID_YZ_MAX: u64 = 65_535;

/// The shapes of one launch, checked.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Geometry {
    heads: u64,
    /// Key/value heads in k, v, dk, dv.
    kv_heads: u64,
    /// Query heads per K/V head in the whole model.
    group: u64,
    /// This launch's query head 0 as the K/V heads count them (`AttentionShape::first_query`).
    first_query: u64,
    head_dim: u64,
    seq_len: u64,
    sequences: u64,
    /// RoPE's base (`KernelContext::rope_theta`).
    rope_theta: f64,
}

impl Geometry {
    /// The geometry the op table checked, within the kernels' own limits.
    fn new(shape: &OpShape, q: &ArgShape, ctx: &KernelContext) -> Result<Self, RecipeError> {
        let op = shape.op;
        let unsupported = |argument: Option<&'static str>, reason: String| OpError {
            op,
            argument,
            kind: OpErrorKind::Unsupported { reason },
        };
        let a = shape.attention_geometry()?;
        let (heads, head_dim, s, sequences) = (a.heads, a.head_dim, a.seq_len, a.sequences);
        if !HEAD_DIMS.contains(&head_dim) {
            let reason = format!(
                "head dimension {head_dim} ({} bytes per row / {heads} heads) has no GPU kernel; the supported head \
                 dimensions are {HEAD_DIMS:?} (change the model's hidden size or head count)",
                q.row_bytes
            );
            return Err(unsupported(Some("q"), reason));
        }
        // The kernels count positions in u32 (a tile may run 63 rows past s) and put heads and
        // sequences on grid y and z.
        if s > u64::from(u32::MAX) - OWNER_ROWS {
            let problem =
                format!("= {s} is too long for the GPU kernels (at most {})", u64::from(u32::MAX) - OWNER_ROWS);
            return Err(OpError::context(op, "seq_len", problem));
        }
        if heads > GRID_YZ_MAX || a.kv_heads > GRID_YZ_MAX || sequences > GRID_YZ_MAX {
            let reason = format!(
                "{heads} heads ({} key/value heads) and {sequences} sequences in one launch: the GPU kernels take at \
                 most {GRID_YZ_MAX} of each (split the launch)",
                a.kv_heads
            );
            return Err(unsupported(None, reason));
        }
        // The kernels compute (first_query + head) / group and kv_head * group in u32.
        let last_query = a.first_query.saturating_add(heads);
        if a.group == 0 || last_query > u64::from(u32::MAX) || a.kv_heads.saturating_mul(a.group) > u64::from(u32::MAX)
        {
            let reason = format!(
                "query heads {}..{last_query} in groups of {} on {} key/value heads are beyond the GPU kernels' 32-bit \
                 head indices",
                a.first_query, a.group, a.kv_heads
            );
            return Err(unsupported(Some("k"), reason));
        }
        Ok(Geometry {
            heads,
            kv_heads: a.kv_heads,
            group: a.group,
            first_query: a.first_query,
            head_dim,
            seq_len: s,
            sequences,
            rope_theta: ctx.rope_theta,
        })
    }

    /// `(ceil(s / 64), heads, sequences)`: `heads` is the query heads, or the K/V heads for the
    /// dk/dv kernel.
    fn grid(&self, heads: u64) -> [u32; 3] {
        // Geometry::new bounds all three (s <= u32::MAX - 64, heads and sequences <= 65535).
        let tiles = self.seq_len.div_ceil(OWNER_ROWS);
        [to_u32(tiles), to_u32(heads), to_u32(self.sequences)]
    }

    /// The scale of the scores, computed as the CPU reference does.
    fn scale(&self) -> f32 {
        // head_dim is one of HEAD_DIMS: exact in f32.
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// A launch of `kernel` over every tile of `grid_heads` heads with these pointer arguments.
    fn launch(&self, kernel: &'static str, grid_heads: u64, pointers: impl IntoIterator<Item = usize>) -> Step {
        let mut params: Vec<Param> = pointers.into_iter().map(|arg| Param::Ptr { arg, byte_offset: 0 }).collect();
        params.extend([
            Param::U32(to_u32(self.seq_len)),
            Param::U32(to_u32(self.heads)),
            Param::U32(to_u32(self.kv_heads)),
            Param::U32(to_u32(self.group)),
            Param::U32(to_u32(self.first_query)),
            Param::F32(self.scale()),
            // RoPE's base as the bits of an f64: the kernels take the inverse frequencies
            // theta^(-2i/D) in double, as the CPU does.
            Param::U64(self.rope_theta.to_bits()),
        ]);
        Step::Kernel(KernelLaunch {
            kernel,
            grid: self.grid(grid_heads),
            block: [THREADS, 1, 1],
            shared_bytes: 0,
            params,
            scratch_bytes: 0,
        })
    }
}

/// A value [`Geometry::new`] has bounded (saturates rather than wraps if that ever changes).
fn to_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// The kernel `memo_attention_{stage}_d{head_dim}`.
fn kernel_name(stage: &str, head_dim: u64) -> Option<&'static str> {
    let name = format!("memo_attention_{stage}_d{head_dim}");
    SOURCE.kernels.iter().copied().find(|&kernel| kernel == name)
}

/// The kernel for `stage` or an error naming the head dim (Geometry::new already refused others).
fn kernel(op: Op, stage: &str, head_dim: u64) -> Result<&'static str, RecipeError> {
    kernel_name(stage, head_dim).ok_or_else(|| OpError {
        op,
        argument: None,
        kind: OpErrorKind::Unsupported {
            reason: format!("no `{stage}` kernel for head dimension {head_dim}; supported: {HEAD_DIMS:?}"),
        },
    })
}

/// `attention` (arguments q, k, v, out, lse): one kernel over the query heads; `attention_backward`
/// (arguments q, k, v, out, lse, dout, dq, dk, dv): the dk/dv kernel over the K/V heads, then the
/// dq kernel over the query heads (independent of each other; each gets all nine pointers).
/// `shape` is the op table's check of `args`.
pub(crate) fn steps(shape: &OpShape, args: &[ArgShape], ctx: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let op = shape.op;
    let q = args.first().copied().unwrap_or_default();
    let g = Geometry::new(shape, &q, ctx)?;
    if g.sequences == 0 {
        return Ok(Vec::new());
    }
    if op == Op::Attention {
        return Ok(vec![g.launch(kernel(op, "forward", g.head_dim)?, g.heads, 0..5)]);
    }
    Ok(vec![
        g.launch(kernel(op, "backward_dkdv", g.head_dim)?, g.kv_heads, 0..9),
        g.launch(kernel(op, "backward_dq", g.head_dim)?, g.heads, 0..9),
    ])
}

#[cfg(test)]
#[path = "attention_emulation.rs"]
mod emulation;

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
