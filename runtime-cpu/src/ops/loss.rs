//! Cross-entropy of a chunk of logits, replacing the logits by their gradient in place.

use memo_plan_core::plan::Op;

use super::norm::sum_lanes;
use super::tensor::{dim, f32_vec, load_bf16, scalar, split, split_in, store_bf16, store_f32, u32_vec, BF16};
use super::{Arg, Group, OpContext, OpError, OpErrorKind};

/// `cross_entropy`: `loss += sum over rows of (logsumexp(logits) - logits[target])`, and
/// `logits <- (softmax(logits) - onehot(target)) / loss_scale_tokens`.
///
/// Per row in f32: `m = max`, `z = sum exp(l - m)` (fixed lane order), `lse = m + ln z`,
/// `p = exp(l - m) / z`. The chunk's losses are summed in row order, then added to `loss`.
pub(crate) fn cross_entropy(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let op = Op::CrossEntropy;
    let ([targets], [logits, loss], shape) = split::<1, 2>(op, args, ctx)?;
    let v = dim(shape.width);
    let ids = u32_vec(targets.bytes);
    if let Some((row, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= v) {
        let kind = OpErrorKind::IdOutOfRange { row, id, limit: v };
        return Err(OpError { op, argument: Some(targets.name), kind });
    }
    if v == 0 || ids.is_empty() {
        return Ok(());
    }
    let tokens = ctx.loss_scale_tokens as f32;
    let (mut row, mut exps) = (vec![0.0f32; v], vec![0.0f32; v]);
    let mut chunk_loss = 0.0f32;
    for (bytes, &target) in logits.bytes.chunks_exact_mut(v * BF16).zip(&ids) {
        load_bf16(bytes, &mut row);
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for (e, &l) in exps.iter_mut().zip(&row) {
            *e = (l - max).exp();
        }
        let z = sum_lanes(&exps);
        let target = target as usize;
        let target_logit = row.get(target).copied().unwrap_or(0.0);
        chunk_loss += max + z.ln() - target_logit;
        for (j, (g, &e)) in row.iter_mut().zip(&exps).enumerate() {
            let p = e / z;
            *g = if j == target { (p - 1.0) / tokens } else { p / tokens };
        }
        store_bf16(&row, bytes);
    }
    let total = scalar(loss.bytes) + chunk_loss;
    store_f32(&[total], loss.bytes);
    Ok(())
}

/// Targets of a vocabulary-parallel op, each checked to be below the vocabulary `V`.
fn targets_below(op: Op, bytes: &[u8], name: &'static str, vocab: usize) -> Result<Vec<u32>, OpError> {
    let ids = u32_vec(bytes);
    if let Some((row, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        let kind = OpErrorKind::IdOutOfRange { row, id, limit: vocab };
        return Err(OpError { op, argument: Some(name), kind });
    }
    Ok(ids)
}

/// The vocabulary-parallel geometry of a rank: `V'` columns per row, this rank's first vocabulary
/// id, and its columns below the vocabulary (the rest are padding, ignored).
fn columns(ctx: &OpContext, group: Group, width: usize) -> (usize, usize, usize) {
    let offset = group.rank.saturating_mul(width);
    (width, offset, ctx.vocab.saturating_sub(offset).min(width))
}

/// `cross_entropy_max`: per row, the f32 maximum of this rank's logits below the vocabulary
/// (`-inf` when the rank holds none).
pub(crate) fn cross_entropy_max(args: &mut [Arg<'_>], ctx: &OpContext, group: Group) -> Result<(), OpError> {
    let ([logits], [max], shape) = split_in::<1, 1>(Op::CrossEntropyMax, args, ctx, group)?;
    let (v, _, valid) = columns(ctx, group, dim(shape.width));
    // No rows: nothing to size from the width (which the context alone may make huge).
    if max.rows == 0 {
        return Ok(());
    }
    if v == 0 {
        store_f32(&vec![f32::NEG_INFINITY; max.rows], max.bytes);
        return Ok(());
    }
    let mut row = vec![0.0f32; v];
    let mut out = Vec::with_capacity(max.rows);
    for bytes in logits.bytes.chunks_exact(v * BF16) {
        load_bf16(bytes, &mut row);
        out.push(row[..valid].iter().copied().fold(f32::NEG_INFINITY, f32::max));
    }
    store_f32(&out, max.bytes);
    Ok(())
}

/// `cross_entropy_sums`: per row, with `m` the row's combined maximum: `[sum of exp(l - m) over
/// this rank's logits below the vocabulary (fixed lane order), the target's logit if this rank
/// holds its column, else 0]`.
pub(crate) fn cross_entropy_sums(args: &mut [Arg<'_>], ctx: &OpContext, group: Group) -> Result<(), OpError> {
    let op = Op::CrossEntropySums;
    let ([logits, targets, max], [sums], shape) = split_in::<3, 1>(op, args, ctx, group)?;
    let (v, offset, valid) = columns(ctx, group, dim(shape.width));
    let ids = targets_below(op, targets.bytes, targets.name, ctx.vocab)?;
    if ids.is_empty() {
        return Ok(());
    }
    let maxima = f32_vec(max.bytes);
    let (mut row, mut exps) = (vec![0.0f32; v], vec![0.0f32; valid]);
    let mut out = Vec::with_capacity(2 * ids.len());
    for (index, (&target, &m)) in ids.iter().zip(&maxima).enumerate() {
        if v > 0 {
            load_bf16(&logits.bytes[index * v * BF16..(index + 1) * v * BF16], &mut row);
        }
        for (e, &l) in exps.iter_mut().zip(&row[..valid]) {
            *e = (l - m).exp();
        }
        let local = (target as usize).checked_sub(offset).filter(|&c| c < valid);
        out.push(sum_lanes(&exps));
        out.push(local.map_or(0.0, |c| row[c]));
    }
    store_f32(&out, sums.bytes);
    Ok(())
}

/// `cross_entropy_finish`: with each row's combined maximum `m` and sums `[z, target logit]`,
/// adds `sum over rows of (m + ln z - target logit)` (rows in order, in f32) to `loss`, and
/// replaces this rank's logits below the vocabulary by `(exp(l - m) / z - onehot) /
/// loss_scale_tokens`, the padding columns by 0.
pub(crate) fn cross_entropy_finish(args: &mut [Arg<'_>], ctx: &OpContext, group: Group) -> Result<(), OpError> {
    let op = Op::CrossEntropyFinish;
    let ([targets, max, sums], [logits, loss], shape) = split_in::<3, 2>(op, args, ctx, group)?;
    let (v, offset, valid) = columns(ctx, group, dim(shape.width));
    let ids = targets_below(op, targets.bytes, targets.name, ctx.vocab)?;
    if ids.is_empty() {
        return Ok(());
    }
    let maxima = f32_vec(max.bytes);
    let pairs = f32_vec(sums.bytes);
    let tokens = ctx.loss_scale_tokens as f32;
    let mut row = vec![0.0f32; v];
    let mut chunk_loss = 0.0f32;
    for (index, (&target, &m)) in ids.iter().zip(&maxima).enumerate() {
        let (z, target_logit) = (pairs[2 * index], pairs[2 * index + 1]);
        chunk_loss += m + z.ln() - target_logit;
        if v == 0 {
            continue;
        }
        let bytes = &mut logits.bytes[index * v * BF16..(index + 1) * v * BF16];
        load_bf16(bytes, &mut row);
        let local = (target as usize).checked_sub(offset).filter(|&c| c < valid);
        for (j, g) in row.iter_mut().enumerate() {
            *g = if j >= valid {
                0.0
            } else {
                let p = (*g - m).exp() / z;
                if Some(j) == local {
                    (p - 1.0) / tokens
                } else {
                    p / tokens
                }
            };
        }
        store_bf16(&row, bytes);
    }
    let total = scalar(loss.bytes) + chunk_loss;
    store_f32(&[total], loss.bytes);
    Ok(())
}
