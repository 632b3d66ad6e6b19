//! Launch recipes of `attention` and `attention_backward` (kernels in `kernels/attention.cu`).
//!
//! Every kernel works on tiles of [`OWNER_ROWS`] rows of one head of one sequence: grid
//! `(ceil(s / 64), heads, sequences)`, [`THREADS`] threads, static shared memory only (under
//! 48 KiB, so no opt-in attribute is needed). The forward is one kernel; the backward is two
//! independent kernels (dk and dv per key tile, dq per query tile) that need no scratch memory and
//! no atomics. The shape checks mirror `runtime-cpu`'s, so a launch the CPU reference refuses is
//! refused here too, with the same kind of message; head dims other than [`HEAD_DIMS`] have no
//! kernel and are refused.
//!
//! Testing without a GPU: `attention_emulation.rs` re-runs the kernels' code on the CPU (both
//! compute paths, lane by lane for the tensor cores) and the tests compare it with `runtime-cpu`.
//! On a GPU, `kernels/attention_gpu_check.py` compiles the source with NVRTC, launches these
//! recipes' grids and compares with a float64 PyTorch reference.

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
/// Bytes of a bf16 element and of an f32 element.
const BF16: u64 = 2;
const F32: u64 = 4;

/// The shapes of one launch, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    heads: u64,
    head_dim: u64,
    seq_len: u64,
    sequences: u64,
    rows: u64,
    row_bytes: u64,
}

impl Geometry {
    /// The geometry implied by `q` and the context, after the CPU reference's checks and the
    /// kernels' own limits.
    fn new(op: Op, q: &ArgShape, context: &KernelContext) -> Result<Self, RecipeError> {
        let error = |message: String| RecipeError { op, message };
        let (heads, s) = (context.heads, context.seq_len);
        if heads == 0 {
            return Err(error("context `heads` is 0; attention needs at least one head".into()));
        }
        if s == 0 {
            return Err(error("context `seq_len` is 0; it must be the rows of one sequence".into()));
        }
        let elems = q.row_bytes / BF16;
        let head_dim = elems / heads;
        if !q.row_bytes.is_multiple_of(BF16)
            || !elems.is_multiple_of(heads)
            || head_dim == 0
            || !head_dim.is_multiple_of(2)
        {
            return Err(error(format!(
                "argument `q`: expected a row of `heads` ({heads}) heads of an even, positive head dimension (rotary \
                 positions rotate pairs), found {} bytes per row",
                q.row_bytes
            )));
        }
        if !HEAD_DIMS.contains(&head_dim) {
            return Err(error(format!(
                "argument `q`: head dimension {head_dim} ({} bytes per row / {heads} heads) has no GPU kernel; the \
                 supported head dimensions are {HEAD_DIMS:?} (change the model's hidden size or head count)",
                q.row_bytes
            )));
        }
        if !q.first_row.is_multiple_of(s) || !q.rows.is_multiple_of(s) {
            return Err(error(format!(
                "argument `q`: expected whole sequences of `seq_len` = {s} rows (positions are row % seq_len), found \
                 rows {}..{}",
                q.first_row,
                q.first_row.saturating_add(q.rows)
            )));
        }
        let sequences = q.rows / s;
        // The kernels count positions in u32 (a tile may run 63 rows past s) and put heads and
        // sequences on grid y and z.
        if s > u64::from(u32::MAX) - OWNER_ROWS {
            return Err(error(format!(
                "context `seq_len` = {s} is too long for the GPU kernels (at most {})",
                u64::from(u32::MAX) - OWNER_ROWS
            )));
        }
        if heads > GRID_YZ_MAX || sequences > GRID_YZ_MAX {
            return Err(error(format!(
                "{heads} heads and {sequences} sequences in one launch: the GPU kernels take at most {GRID_YZ_MAX} of \
                 each (split the launch)"
            )));
        }
        Ok(Geometry { heads, head_dim, seq_len: s, sequences, rows: q.rows, row_bytes: q.row_bytes })
    }

    /// Checks an input shaped like `q`: same rows and width, whole sequences.
    fn check_like_q(&self, op: Op, name: &str, arg: &ArgShape) -> Result<(), RecipeError> {
        self.check_out_like_q(op, name, arg)?;
        if !arg.first_row.is_multiple_of(self.seq_len) {
            return Err(RecipeError {
                op,
                message: format!(
                    "argument `{name}`: expected whole sequences of `seq_len` = {} rows, found first row {}",
                    self.seq_len, arg.first_row
                ),
            });
        }
        Ok(())
    }

    /// Checks an output shaped like `q`: same rows and width.
    fn check_out_like_q(&self, op: Op, name: &str, arg: &ArgShape) -> Result<(), RecipeError> {
        if arg.rows != self.rows {
            return Err(RecipeError {
                op,
                message: format!(
                    "argument `{name}`: expected the rows of `q` ({}), found {} rows",
                    self.rows, arg.rows
                ),
            });
        }
        if arg.row_bytes != self.row_bytes {
            return Err(RecipeError {
                op,
                message: format!(
                    "argument `{name}`: expected the row width of `q` ({} bytes), found {} bytes per row",
                    self.row_bytes, arg.row_bytes
                ),
            });
        }
        Ok(())
    }

    /// Checks the log-sum-exp: the rows of `q`, one f32 per head.
    fn check_lse(&self, op: Op, arg: &ArgShape) -> Result<(), RecipeError> {
        if arg.rows != self.rows || arg.row_bytes != self.heads * F32 {
            return Err(RecipeError {
                op,
                message: format!(
                    "argument `lse`: expected {} rows of one f32 per head ({} bytes per row), found {} rows of {} bytes",
                    self.rows,
                    self.heads * F32,
                    arg.rows,
                    arg.row_bytes
                ),
            });
        }
        Ok(())
    }

    /// `(ceil(s / 64), heads, sequences)`.
    fn grid(&self) -> [u32; 3] {
        // Geometry::new bounds all three (s <= u32::MAX - 64, heads and sequences <= 65535).
        let tiles = self.seq_len.div_ceil(OWNER_ROWS);
        [to_u32(tiles), to_u32(self.heads), to_u32(self.sequences)]
    }

    /// The scale of the scores, computed as the CPU reference does.
    fn scale(&self) -> f32 {
        // head_dim is one of HEAD_DIMS: exact in f32.
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// A launch of `kernel` over every tile with these pointer arguments.
    fn launch(&self, kernel: &'static str, pointers: impl IntoIterator<Item = usize>) -> Step {
        let mut params: Vec<Param> = pointers.into_iter().map(|arg| Param::Ptr { arg, byte_offset: 0 }).collect();
        params.extend([Param::U32(to_u32(self.seq_len)), Param::U32(to_u32(self.heads)), Param::F32(self.scale())]);
        Step::Kernel(KernelLaunch {
            kernel,
            grid: self.grid(),
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

/// Exactly `count` arguments, or an error.
fn want_args(op: Op, args: &[ArgShape], count: usize) -> Result<(), RecipeError> {
    if args.len() != count {
        let message = format!("expected {count} arguments (the op's signature), found {}", args.len());
        return Err(RecipeError { op, message });
    }
    Ok(())
}

/// The kernel for `stage` or an error naming the head dim (Geometry::new already refused others).
fn kernel(op: Op, stage: &str, head_dim: u64) -> Result<&'static str, RecipeError> {
    kernel_name(stage, head_dim).ok_or_else(|| RecipeError {
        op,
        message: format!("no `{stage}` kernel for head dimension {head_dim}; supported: {HEAD_DIMS:?}"),
    })
}

/// `attention` (arguments q, k, v, out, lse): one kernel.
pub(crate) fn forward_steps(args: &[ArgShape], context: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let op = Op::Attention;
    want_args(op, args, 5)?;
    let (q, k, v, out, lse) = (&args[0], &args[1], &args[2], &args[3], &args[4]);
    let g = Geometry::new(op, q, context)?;
    g.check_like_q(op, "k", k)?;
    g.check_like_q(op, "v", v)?;
    g.check_out_like_q(op, "out", out)?;
    g.check_lse(op, lse)?;
    if g.sequences == 0 {
        return Ok(Vec::new());
    }
    Ok(vec![g.launch(kernel(op, "forward", g.head_dim)?, 0..5)])
}

/// `attention_backward` (arguments q, k, v, out, lse, dout, dq, dk, dv): the dk/dv kernel, then
/// the dq kernel (independent of each other; each gets all nine pointers).
pub(crate) fn backward_steps(args: &[ArgShape], context: &KernelContext) -> Result<Vec<Step>, RecipeError> {
    let op = Op::AttentionBackward;
    want_args(op, args, 9)?;
    let q = &args[0];
    let g = Geometry::new(op, q, context)?;
    for (name, arg) in [("k", &args[1]), ("v", &args[2]), ("out", &args[3]), ("dout", &args[5])] {
        g.check_like_q(op, name, arg)?;
    }
    g.check_lse(op, &args[4])?;
    for (name, arg) in [("dq", &args[6]), ("dk", &args[7]), ("dv", &args[8])] {
        g.check_out_like_q(op, name, arg)?;
    }
    if g.sequences == 0 {
        return Ok(Vec::new());
    }
    Ok(vec![
        g.launch(kernel(op, "backward_dkdv", g.head_dim)?, 0..9),
        g.launch(kernel(op, "backward_dq", g.head_dim)?, 0..9),
    ])
}

#[cfg(test)]
#[path = "attention_emulation.rs"]
mod emulation;

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
