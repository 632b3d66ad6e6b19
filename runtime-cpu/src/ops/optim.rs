//! The optimizer: the squared global gradient norm and AdamW on fp32 master weights.

use memo_plan_core::plan::Op;

use super::tensor::{bf16_bits_to_f32, dim, f32_to_bf16_bytes, scalar, split, store_f32, BF16, WORD};
use super::{Arg, OpContext, OpError, OpErrorKind};

/// Lanes of the sum of squares (a fixed order that vectorises).
const LANES: usize = 8;

/// `grad_norm_squared`: `sum_squares += sum of grad^2`. Element `j` of the gradient goes to lane
/// `j % 8`; the lanes are added pairwise, then to `sum_squares` (all f32).
pub(crate) fn grad_norm_squared(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([grad], [sum_squares], _) = split::<1, 1>(Op::GradNormSquared, args, ctx)?;
    let mut lanes = [0.0f32; LANES];
    let (chunks, rest) = grad.bytes.as_chunks::<{ LANES * BF16 }>();
    for chunk in chunks {
        for (lane, pair) in lanes.iter_mut().zip(chunk.chunks_exact(BF16)) {
            let g = bf16_bits_to_f32(pair[0], pair[1]);
            *lane += g * g;
        }
    }
    for (lane, pair) in lanes.iter_mut().zip(rest.chunks_exact(BF16)) {
        let g = bf16_bits_to_f32(pair[0], pair[1]);
        *lane += g * g;
    }
    let sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    let total = scalar(sum_squares.bytes) + sum;
    store_f32(&[total], sum_squares.bytes);
    Ok(())
}

/// `adamw`: one AdamW step on a parameter (PyTorch's `AdamW`, with global-norm clipping).
///
/// With `clip = min(1, max_grad_norm / sqrt(grad_norm_squared))` (1 when `max_grad_norm` is 0),
/// per element, in f32:
/// `g = grad * clip`; `w *= 1 - lr * weight_decay`; `m = b1 m + (1 - b1) g`;
/// `v = b2 v + (1 - b2) g^2`; `w -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)`;
/// then the bf16 parameter is `w` rounded. The optimizer state row of a parameter row of `e`
/// elements holds `e` master weights, then `e` m, then `e` v (f32).
///
/// A non-finite squared norm is an error: the step would write NaN into every parameter.
pub(crate) fn adamw(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let op = Op::AdamW;
    let ([grad, norm], [parameter, state], shape) = split::<2, 2>(op, args, ctx)?;
    let e = dim(shape.width);
    let hp = ctx.adamw;
    let norm_squared = scalar(norm.bytes);
    if !norm_squared.is_finite() {
        let kind = OpErrorKind::NotFinite { value: norm_squared };
        return Err(OpError { op, argument: Some(norm.name), kind });
    }
    let grad_norm = norm_squared.sqrt();
    let clip = if hp.max_grad_norm > 0.0 && grad_norm > hp.max_grad_norm { hp.max_grad_norm / grad_norm } else { 1.0 };
    let step = hp.step as f64;
    let correction1 = (1.0 - f64::from(hp.beta1).powf(step)) as f32;
    let correction2_sqrt = (1.0 - f64::from(hp.beta2).powf(step)).sqrt() as f32;
    let step_size = hp.lr / correction1;
    let decay = 1.0 - hp.lr * hp.weight_decay;
    if e == 0 {
        return Ok(());
    }
    let rows = parameter.bytes.chunks_exact_mut(e * BF16).zip(grad.bytes.chunks_exact(e * BF16));
    for ((param_row, grad_row), state_row) in rows.zip(state.bytes.chunks_exact_mut(3 * WORD * e)) {
        let (master, moments) = state_row.split_at_mut(e * WORD);
        let (first, second) = moments.split_at_mut(e * WORD);
        let words = master.chunks_exact_mut(WORD).zip(first.chunks_exact_mut(WORD)).zip(second.chunks_exact_mut(WORD));
        let elems = param_row.chunks_exact_mut(BF16).zip(grad_row.chunks_exact(BF16));
        for (((w_bytes, m_bytes), v_bytes), (p_bytes, g_bytes)) in words.zip(elems) {
            let read = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let g = bf16_bits_to_f32(g_bytes[0], g_bytes[1]) * clip;
            let mut w = read(w_bytes) * decay;
            let m = hp.beta1 * read(m_bytes) + (1.0 - hp.beta1) * g;
            let v = hp.beta2 * read(v_bytes) + (1.0 - hp.beta2) * g * g;
            w -= step_size * m / (v.sqrt() / correction2_sqrt + hp.eps);
            w_bytes.copy_from_slice(&w.to_le_bytes());
            m_bytes.copy_from_slice(&m.to_le_bytes());
            v_bytes.copy_from_slice(&v.to_le_bytes());
            p_bytes.copy_from_slice(&f32_to_bf16_bytes(w));
        }
    }
    Ok(())
}
