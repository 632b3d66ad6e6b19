//! Cross-entropy of a chunk of logits, replacing the logits by their gradient in place.

use memo_plan_core::plan::Op;

use super::norm::sum_lanes;
use super::tensor::{dim, load_bf16, scalar, split, store_bf16, store_f32, u32_vec, BF16};
use super::{Arg, OpContext, OpError, OpErrorKind};

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
