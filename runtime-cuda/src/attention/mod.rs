//! Attention on cuDNN's fused kernels (the backend graph API), and what it needs.
//!
//! - [`graph`]: the forward and backward graphs, built through a small trait
//!   ([`graph::GraphBuilder`]) so that exactly what is handed to cuDNN can be recorded
//!   ([`record::Recorder`]), compared with golden files and run by an f64 interpreter in the
//!   tests (no GPU needed).
//! - `cudnn` (private): the trait on cuDNN through bindings of our own (statuses read as
//!   integers); descriptors owned and destroyed, every status checked, engine configurations
//!   deduplicated and bounded, execution plans and refusals cached per (pass, shape), the LSE
//!   layout and the version gates per cuDNN version.
//! - [`scratch`]: the device bytes one attention launch needs besides its plan arguments, as a
//!   function of its shape, for the planner ([`AttentionScratch`]).
//!
//! RoPE: cuDNN has no rotary fusion, so the launch first rotates q and k into two transients
//! (`memo_rope` of `memo-kernels`), runs cuDNN on the rotated copies, and (backward) rotates the
//! gradients dq and dk back in place (`spec/schedule.md`, "RoPE on the cuDNN path").

pub(crate) mod cudnn;
pub mod graph;
#[cfg(test)]
mod interpret;
pub mod record;
#[cfg(test)]
mod tests;

use graph::Shape;
use memo_kernels::AttentionVariant;
use memo_plan_core::plan::shapes::AttentionShape;
use memo_plan_core::plan::Op;

/// How attention runs on the CUDA backend (`MEMO_CUDA_ATTENTION`, `memo train --attention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionChoice {
    /// cuDNN's fused attention (the default); our kernels when cuDNN is absent, too old or fails
    /// to build a plan, with one line saying why.
    Cudnn {
        /// The backward's form: dQ accumulated with atomics (false, cuDNN's Hopper default), or
        /// the deterministic "dP workspace" form (true).
        deterministic: bool,
    },
    /// Our kernels (`kernels/attention.cu`) in a variant.
    Kernels(AttentionVariant),
}

impl Default for AttentionChoice {
    fn default() -> Self {
        AttentionChoice::Cudnn { deterministic: false }
    }
}

impl AttentionChoice {
    /// Every name [`AttentionChoice::parse`] reads.
    pub const NAMES: [&'static str; 4] = ["cudnn", "cudnn-deterministic", "baseline", "pipelined"];

    /// The choice named `name`.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "cudnn" => Ok(AttentionChoice::Cudnn { deterministic: false }),
            "cudnn-deterministic" => Ok(AttentionChoice::Cudnn { deterministic: true }),
            other => AttentionVariant::parse(other)
                .map(AttentionChoice::Kernels)
                .map_err(|_| format!("unknown attention `{other}`; the choices are {}", Self::NAMES.join(", "))),
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            AttentionChoice::Cudnn { deterministic: false } => "cudnn",
            AttentionChoice::Cudnn { deterministic: true } => "cudnn-deterministic",
            AttentionChoice::Kernels(variant) => variant.name(),
        }
    }
}

/// Opens cuDNN as the backend does (probe, version, `cudnnCreate`; on the default stream) and
/// closes it again: the line that says what the cuDNN path would run, or why it cannot. Never
/// panics, whatever library is (or is not) found.
pub fn probe_cudnn() -> Result<String, crate::CudaError> {
    let opened = cudnn::Cudnn::open(std::ptr::null_mut())?;
    Ok(format!(
        "cuDNN {} {} forward",
        cudnn::version_text(opened.version),
        if opened.fused { "fused" } else { "composite" }
    ))
}

/// Bytes of device memory one attention launch on the cuDNN path needs besides its arguments,
/// in the order [`AttentionScratch::layout`] places them (each start aligned to
/// [`SCRATCH_ALIGNMENT`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionScratch {
    /// q rotated by RoPE (bf16, tokens x heads x head_dim).
    pub rotated_q: u64,
    /// k rotated by RoPE (bf16, tokens x kv_heads x head_dim: every K/V head of `k`).
    pub rotated_k: u64,
    /// Backward, accumulating form only: the f32 dQ accumulator, B*H*S*D*4 (zeroed before use).
    pub dq_accumulator: u64,
    /// Backward only: the f32 softmax sums `rowsum(dO * O)`, B*H*S*4.
    pub softmax_sum: u64,
    /// When cuDNN is given head-major statistics (the default; token-major only where the
    /// version reads and writes such strides correctly, `spec/backends.md`): the LSE in cuDNN's
    /// packed layout (f32, B*H*S*4), transposed from or to the plan's on every launch.
    pub statistics: u64,
    /// cuDNN's own workspace for the chosen execution plan (known only once the plan is built
    /// on the device: [`scratch`] takes it as an argument).
    pub workspace: u64,
}

/// Alignment of each part of the scratch: the plan's ([`memo_plan_core::bilevel::ALIGNMENT`],
/// 256 bytes, what allocators give; cuDNN is promised 16).
pub const SCRATCH_ALIGNMENT: u64 = memo_plan_core::bilevel::ALIGNMENT;

impl AttentionScratch {
    /// The parts' byte offsets (rotated q, rotated k, dQ accumulator, softmax sums, head-major
    /// statistics, workspace) and the total, each part starting at a multiple of
    /// [`SCRATCH_ALIGNMENT`].
    pub fn layout(&self) -> ([u64; 6], u64) {
        let mut offsets = [0u64; 6];
        let mut end = 0u64;
        let parts =
            [self.rotated_q, self.rotated_k, self.dq_accumulator, self.softmax_sum, self.statistics, self.workspace];
        for (slot, bytes) in offsets.iter_mut().zip(parts) {
            *slot = end.next_multiple_of(SCRATCH_ALIGNMENT);
            end = *slot + bytes;
        }
        (offsets, end.next_multiple_of(SCRATCH_ALIGNMENT))
    }

    /// Total bytes ([`AttentionScratch::layout`]'s).
    pub fn total(&self) -> u64 {
        self.layout().1
    }
}

/// What attention launch `op` ([`Op::Attention`] or [`Op::AttentionBackward`]) of `shape` needs
/// on the cuDNN path besides its arguments; `workspace` is the execution plan's workspace bytes
/// (`CudaBackend::attention_scratch` builds the plan and reads it), `deterministic` the
/// backward's form, `head_major_statistics` whether cuDNN took the plan's LSE layout (false) or
/// needs its own (true). Other ops need nothing. Saturates rather than overflows.
pub fn scratch(
    op: Op,
    shape: &AttentionShape,
    deterministic: bool,
    head_major_statistics: bool,
    workspace: u64,
) -> AttentionScratch {
    let rows = shape.sequences.saturating_mul(shape.seq_len);
    let heads_rows = rows.saturating_mul(shape.heads);
    let elements = heads_rows.saturating_mul(shape.head_dim);
    let rotated = elements.saturating_mul(2);
    let rotated_k = rows.saturating_mul(shape.kv_heads).saturating_mul(shape.head_dim).saturating_mul(2);
    let statistics = if head_major_statistics { heads_rows.saturating_mul(4) } else { 0 };
    match op {
        Op::Attention => {
            AttentionScratch { rotated_q: rotated, rotated_k, statistics, workspace, ..Default::default() }
        }
        Op::AttentionBackward => AttentionScratch {
            rotated_q: rotated,
            rotated_k,
            dq_accumulator: if deterministic { 0 } else { elements.saturating_mul(4) },
            softmax_sum: heads_rows.saturating_mul(4),
            statistics,
            workspace,
        },
        _ => AttentionScratch::default(),
    }
}

/// How one launch's K and V (and dK, dV) are shown to cuDNN ([`key_value_view`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyValueView {
    /// The graphs' shape (the plan's token-major statistics; the backend may switch them).
    pub shape: Shape,
    /// Elements from the start of each row of k, v, dk and dv to the first one cuDNN reads or
    /// writes: added (in bytes, twice this) to the four pointers of the variant pack.
    pub offset: u64,
    /// Whether dk and dv are zeroed before the backward: their rows hold K/V heads that no query
    /// head of the launch uses, which the graph does not write and the op's contract makes 0.
    pub zero_gradients: bool,
}

/// How the K/V heads of an attention launch of `geometry` are described to cuDNN, whose grouped
/// attention maps query head `i` to K/V head `i / (h_q / h_kv)`:
/// - `first_query == 0` and `group == heads / kv_heads` (multi-head, grouped-query and
///   multi-query attention on this rank's share of the heads): `h_kv = kv_heads`, rows of
///   `kv_heads * head_dim`, offset 0;
/// - else (K and V replicated: they hold every K/V head of the model, and every query head of
///   the launch uses the one head `kv_head(0)`, as the model's rule `t % kv_heads == 0` makes
///   it): `h_kv = 1` at an offset of `kv_head(0) * head_dim` elements in rows of the full
///   `kv_heads * head_dim`, and dk and dv zeroed before the backward when they hold other heads.
///
/// An error (in one line) when neither describes the launch: query heads that use several K/V
/// heads without cuDNN's grouping, a dimension above `i64`, or an offset that is not a multiple
/// of 16 bytes (cuDNN's promised alignment).
pub fn key_value_view(geometry: &AttentionShape) -> Result<KeyValueView, crate::CudaError> {
    use crate::CudaError::Launch;
    let int = |v: u64| i64::try_from(v).map_err(|_| Launch(format!("attention dimension {v} above 2^63")));
    let (heads, kv_heads) = (geometry.heads, geometry.kv_heads);
    if heads == 0 || kv_heads == 0 {
        return Err(Launch(format!("attention with {heads} query and {kv_heads} K/V heads")));
    }
    let (b, h, s, d) = (int(geometry.sequences)?, int(heads)?, int(geometry.seq_len)?, int(geometry.head_dim)?);
    let kv_row = int(kv_heads.saturating_mul(geometry.head_dim))?;
    if geometry.first_query == 0 && heads.is_multiple_of(kv_heads) && geometry.group == heads / kv_heads {
        let shape = Shape::grouped(b, h, int(kv_heads)?, s, d);
        return Ok(KeyValueView { shape, offset: 0, zero_gradients: false });
    }
    let (first, last) = (geometry.kv_head(0), geometry.kv_head(heads - 1));
    if first != last || first >= kv_heads {
        return Err(Launch(format!(
            "query heads {}..{} use K/V heads {first}..={last} of {kv_heads} (group {}): cuDNN's grouped attention \
             needs them to use K/V heads from 0 in groups of heads / kv_heads, or all one head",
            geometry.first_query,
            geometry.first_query.saturating_add(heads),
            geometry.group
        )));
    }
    let offset = first.saturating_mul(geometry.head_dim);
    if !offset.saturating_mul(2).is_multiple_of(16) {
        return Err(Launch(format!(
            "K/V head {first} starts {} bytes into its row, not a multiple of 16 (head dimension {})",
            offset.saturating_mul(2),
            geometry.head_dim
        )));
    }
    let shape = Shape { kv_heads: 1, kv_row, ..Shape::grouped(b, h, 1, s, d) };
    Ok(KeyValueView { shape, offset, zero_gradients: kv_heads > 1 })
}
