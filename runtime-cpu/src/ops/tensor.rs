//! Argument views and element conversions.
//!
//! [`split`] checks how a launch's arguments were passed (count, access, byte count), then their
//! shapes against the op table's rules (`memo_plan_core::plan::shapes::check`, shared with the GPU
//! recipes), and hands the op its read and written arguments as fixed-size arrays, in signature
//! order, with the launch's checked dimensions.
//!
//! Elements are read and written through little-endian byte chunks, so no alignment is assumed.

use half::bf16;
use memo_plan_core::plan::shapes::{self, check_argument_count, ArgShape, OpShape, ShapeContext};
use memo_plan_core::plan::{Access, Op};

use super::{Arg, ArgData, Group, OpContext, OpError, OpErrorKind};

/// Bytes of a bf16 element.
pub(crate) const BF16: usize = 2;
/// Bytes of an f32 or u32 element.
pub(crate) const WORD: usize = 4;

/// A read-only argument.
pub(crate) struct In<'s> {
    pub name: &'static str,
    pub bytes: &'s [u8],
    pub rows: usize,
    pub row_bytes: usize,
}

/// A written (or read-and-written) argument.
pub(crate) struct Out<'s> {
    pub bytes: &'s mut [u8],
    pub rows: usize,
    pub row_bytes: usize,
}

/// A count of the host's memory as `u64` (exact on every host this runs on).
pub(crate) fn to_u64(value: usize) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// A dimension of [`OpShape`] as `usize`. The op table derives each from the arguments' shapes
/// (which are in memory) or from the [`OpContext`] (a `usize`), so it fits.
pub(crate) fn dim(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// What the op table needs of the context and of the rank's place in its group.
pub(crate) fn shape_context(ctx: &OpContext, group: Group) -> ShapeContext {
    ShapeContext {
        hidden: to_u64(ctx.hidden),
        heads: to_u64(ctx.heads),
        kv_heads: to_u64(ctx.kv_heads),
        kv_replicated: ctx.kv_replicated,
        rope_theta: ctx.rope_theta,
        norm_eps: ctx.norm_eps,
        seq_len: to_u64(ctx.seq_len),
        vocab: to_u64(ctx.vocab),
        loss_scale_tokens: to_u64(ctx.loss_scale_tokens),
        adamw_step: ctx.adamw.step,
        rank: to_u64(group.rank),
        ranks: to_u64(group.ranks),
        context_rank: to_u64(ctx.context_rank),
        context_ranks: to_u64(ctx.context_ranks),
    }
}

/// Checks `args` against `op`'s signature and the op table's shape rules, and splits them into
/// the `R` read-only and the `W` written ones, each in signature order, with the launch's
/// dimensions.
pub(crate) fn split<'s, const R: usize, const W: usize>(
    op: Op,
    args: &'s mut [Arg<'_>],
    ctx: &OpContext,
) -> Result<([In<'s>; R], [Out<'s>; W], OpShape), OpError> {
    split_in(op, args, ctx, Group::SINGLE)
}

/// [`split`] for a rank of a tensor-parallel group: the op table's rules for vocabulary shards
/// and collectives depend on the group.
pub(crate) fn split_in<'s, const R: usize, const W: usize>(
    op: Op,
    args: &'s mut [Arg<'_>],
    ctx: &OpContext,
    group: Group,
) -> Result<([In<'s>; R], [Out<'s>; W], OpShape), OpError> {
    check_argument_count(op, args.len())?;
    let (reads, writes, arg_shapes) = split_signature::<R, W>(op, op.signature(), args)?;
    let shape = shapes::check(op, &arg_shapes, &shape_context(ctx, group))?;
    Ok((reads, writes, shape))
}

/// A launch's read arguments, its written ones, and what else the split found (`S`).
pub(crate) type Split<'s, const R: usize, const W: usize, S> = ([In<'s>; R], [Out<'s>; W], S);

/// Checks how `args` were passed against `signature` (the count, each argument's byte count and
/// access) and splits them into the `R` read-only and the `W` written ones, in signature order,
/// with their shapes for the op table's rules. Errors name `op` and the signature's argument.
pub(crate) fn split_signature<'s, const R: usize, const W: usize>(
    op: Op,
    signature: &[(&'static str, Access)],
    args: &'s mut [Arg<'_>],
) -> Result<Split<'s, R, W, Vec<ArgShape>>, OpError> {
    if args.len() != signature.len() {
        let kind = OpErrorKind::ArgumentCount { expected: signature.len(), found: args.len() };
        return Err(OpError { op, argument: None, kind });
    }
    let mut reads = Vec::with_capacity(R);
    let mut writes = Vec::with_capacity(W);
    let mut arg_shapes = Vec::with_capacity(args.len());
    for (arg, &(name, access)) in args.iter_mut().zip(signature) {
        let (rows, row_bytes, first_row) = (arg.rows, arg.row_bytes, arg.first_row);
        let bytes = match &arg.data {
            ArgData::Read(data) => data.len(),
            ArgData::Write(data) => data.len(),
        };
        if rows.checked_mul(row_bytes) != Some(bytes) {
            let kind = OpErrorKind::ByteCount { rows, row_bytes, bytes };
            return Err(OpError { op, argument: Some(name), kind });
        }
        arg_shapes.push(ArgShape { first_row: to_u64(first_row), rows: to_u64(rows), row_bytes: to_u64(row_bytes) });
        match (&mut arg.data, access) {
            (ArgData::Read(data), Access::Read) => reads.push(In { name, bytes: data, rows, row_bytes }),
            (ArgData::Write(data), Access::Write | Access::ReadWrite) => {
                writes.push(Out { bytes: data, rows, row_bytes })
            }
            (data, expected) => {
                let found = if matches!(data, ArgData::Read(_)) { "read" } else { "write" };
                let kind = OpErrorKind::ArgumentAccess { expected, found };
                return Err(OpError { op, argument: Some(name), kind });
            }
        }
    }
    // The counts follow from the signature; a mismatch here means `R`/`W` disagree with it.
    let internal = |found| OpError { op, argument: None, kind: OpErrorKind::ArgumentCount { expected: R + W, found } };
    let reads: [In<'s>; R] = reads.try_into().map_err(|v: Vec<In<'s>>| internal(v.len()))?;
    let writes: [Out<'s>; W] = writes.try_into().map_err(|v: Vec<Out<'s>>| internal(v.len()))?;
    Ok((reads, writes, arg_shapes))
}

/// The f32 value of little-endian bf16 bytes (exact).
#[inline]
pub(crate) fn bf16_bits_to_f32(lo: u8, hi: u8) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([lo, hi])) << 16)
}

/// `x` rounded to bf16 (nearest, ties to even; NaN stays NaN), as little-endian bytes.
#[inline]
pub(crate) fn f32_to_bf16_bytes(x: f32) -> [u8; 2] {
    bf16::from_f32(x).to_bits().to_le_bytes()
}

/// `x` rounded to bf16 and back (what storing then loading gives).
#[cfg(test)]
pub(crate) fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Converts bf16 bytes into `out` (`bytes.len() == 2 * out.len()`; extra elements are ignored).
pub(crate) fn load_bf16(bytes: &[u8], out: &mut [f32]) {
    for (value, pair) in out.iter_mut().zip(bytes.chunks_exact(BF16)) {
        *value = bf16_bits_to_f32(pair[0], pair[1]);
    }
}

/// bf16 bytes as a vector of f32.
pub(crate) fn bf16_vec(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(BF16).map(|pair| bf16_bits_to_f32(pair[0], pair[1])).collect()
}

/// Rounds `values` to bf16 into `bytes`.
pub(crate) fn store_bf16(values: &[f32], bytes: &mut [u8]) {
    for (pair, &value) in bytes.chunks_exact_mut(BF16).zip(values) {
        pair.copy_from_slice(&f32_to_bf16_bytes(value));
    }
}

/// Little-endian 4-byte words as f32.
pub(crate) fn f32_vec(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(WORD).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
}

/// Little-endian 4-byte words as u32.
pub(crate) fn u32_vec(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(WORD).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
}

/// Writes `values` as little-endian f32 into `bytes`.
pub(crate) fn store_f32(values: &[f32], bytes: &mut [u8]) {
    for (word, value) in bytes.chunks_exact_mut(WORD).zip(values) {
        word.copy_from_slice(&value.to_le_bytes());
    }
}

/// The single f32 of a one-row scalar argument (checked by the caller to be 4 bytes).
pub(crate) fn scalar(bytes: &[u8]) -> f32 {
    f32_vec(bytes).first().copied().unwrap_or(0.0)
}
