//! Per-element and per-row ops: the embedding lookup and its scatter-add, GeLU, SwiGLU, the
//! residual add, zero. Each output element depends on its own inputs only, so row ranges and threads
//! cannot change it.

use memo_plan_core::plan::Op;

use super::tensor::{bf16_bits_to_f32, dim, f32_to_bf16_bytes, split, split_in, u32_vec, BF16};
use super::{Arg, Group, OpContext, OpError, OpErrorKind};

/// `sqrt(2 / pi)`, of GeLU's tanh approximation.
const GELU_C: f32 = 0.797_884_6;
/// The cubic coefficient of GeLU's tanh approximation.
const GELU_A: f32 = 0.044_715;

/// GeLU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[inline]
pub(crate) fn gelu_value(x: f32) -> f32 {
    let u = GELU_C * (x + GELU_A * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

/// The derivative of [`gelu_value`].
#[inline]
pub(crate) fn gelu_derivative(x: f32) -> f32 {
    let u = GELU_C * (x + GELU_A * x * x * x);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
}

/// The logistic sigmoid `1 / (1 + exp(-g))`.
#[inline]
fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + (-g).exp())
}

/// SiLU: `g / (1 + exp(-g))`.
#[inline]
pub(crate) fn silu_value(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// The derivative of [`silu_value`]: `s (1 + g (1 - s))`, `s` the sigmoid of `g`.
#[inline]
pub(crate) fn silu_derivative(g: f32) -> f32 {
    let s = sigmoid(g);
    s * (1.0 + g * (1.0 - s))
}

/// Token ids of a `tokens` argument (one u32 per row, as the op table checked), each checked
/// to be below `limit`.
fn token_ids(op: Op, tokens: &super::tensor::In<'_>, limit: usize) -> Result<Vec<u32>, OpError> {
    let ids = u32_vec(tokens.bytes);
    if let Some((row, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= limit) {
        let kind = OpErrorKind::IdOutOfRange { row, id, limit };
        return Err(OpError { op, argument: Some(tokens.name), kind });
    }
    Ok(ids)
}

/// `embedding`: `out[r] = embedding[tokens[r]]` (the whole table: with `t > 1`, the gathered
/// one, whose row `i` is vocabulary id `i`). Ids must be below the vocabulary.
pub(crate) fn embedding(args: &mut [Arg<'_>], ctx: &OpContext, group: Group) -> Result<(), OpError> {
    let op = Op::Embedding;
    let ([tokens, embedding], [out], _) = split_in::<2, 1>(op, args, ctx, group)?;
    let ids = token_ids(op, &tokens, embedding.rows.min(ctx.vocab))?;
    let width = embedding.row_bytes;
    if width == 0 {
        return Ok(());
    }
    for (&id, dst) in ids.iter().zip(out.bytes.chunks_exact_mut(width)) {
        let start = id as usize * width;
        if let Some(src) = embedding.bytes.get(start..start + width) {
            dst.copy_from_slice(src);
        }
    }
    Ok(())
}

/// `embedding_backward`: `dembedding[tokens[r]] += dout[r]`. The rows of one token are summed in
/// f32 in row order onto the stored bf16 value, which is rounded once.
pub(crate) fn embedding_backward(args: &mut [Arg<'_>], ctx: &OpContext, group: Group) -> Result<(), OpError> {
    let op = Op::EmbeddingBackward;
    let ([tokens, dout], [dembedding], _) = split_in::<2, 1>(op, args, ctx, group)?;
    let ids = token_ids(op, &tokens, dembedding.rows.min(ctx.vocab))?;
    let width = dembedding.row_bytes;
    if width == 0 || ids.is_empty() {
        return Ok(());
    }
    // Rows grouped by token, each group in row order (the sort is stable).
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&row| ids[row]);
    let mut sum = vec![0.0f32; width / BF16];
    let mut group_start = 0;
    while group_start < order.len() {
        let id = ids[order[group_start]];
        let group_end =
            order[group_start..].iter().position(|&row| ids[row] != id).map_or(order.len(), |n| group_start + n);
        let start = id as usize * width;
        let Some(dst) = dembedding.bytes.get_mut(start..start + width) else { break };
        for (s, pair) in sum.iter_mut().zip(dst.chunks_exact(BF16)) {
            *s = bf16_bits_to_f32(pair[0], pair[1]);
        }
        for &row in &order[group_start..group_end] {
            let Some(src) = dout.bytes.get(row * width..(row + 1) * width) else { continue };
            for (s, pair) in sum.iter_mut().zip(src.chunks_exact(BF16)) {
                *s += bf16_bits_to_f32(pair[0], pair[1]);
            }
        }
        for (pair, &s) in dst.chunks_exact_mut(BF16).zip(&sum) {
            pair.copy_from_slice(&f32_to_bf16_bytes(s));
        }
        group_start = group_end;
    }
    Ok(())
}

/// `gelu`: `y = gelu(x)`.
pub(crate) fn gelu(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([x], [y], _) = split::<1, 1>(Op::Gelu, args, ctx)?;
    for (dst, src) in y.bytes.chunks_exact_mut(BF16).zip(x.bytes.chunks_exact(BF16)) {
        dst.copy_from_slice(&f32_to_bf16_bytes(gelu_value(bf16_bits_to_f32(src[0], src[1]))));
    }
    Ok(())
}

/// `gelu_backward`: `dx = dy * gelu'(x)`.
pub(crate) fn gelu_backward(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([x, dy], [dx], _) = split::<2, 1>(Op::GeluBackward, args, ctx)?;
    for ((dst, xs), dys) in
        dx.bytes.chunks_exact_mut(BF16).zip(x.bytes.chunks_exact(BF16)).zip(dy.bytes.chunks_exact(BF16))
    {
        let (xv, dyv) = (bf16_bits_to_f32(xs[0], xs[1]), bf16_bits_to_f32(dys[0], dys[1]));
        dst.copy_from_slice(&f32_to_bf16_bytes(dyv * gelu_derivative(xv)));
    }
    Ok(())
}

/// `add`: `y = a + b`.
pub(crate) fn add(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([a, b], [y], _) = split::<2, 1>(Op::Add, args, ctx)?;
    for ((dst, av), bv) in
        y.bytes.chunks_exact_mut(BF16).zip(a.bytes.chunks_exact(BF16)).zip(b.bytes.chunks_exact(BF16))
    {
        let sum = bf16_bits_to_f32(av[0], av[1]) + bf16_bits_to_f32(bv[0], bv[1]);
        dst.copy_from_slice(&f32_to_bf16_bytes(sum));
    }
    Ok(())
}

/// `add_bias`: `y[r] += bias` on every row, each element added in f32 and rounded once.
pub(crate) fn add_bias(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([bias], [y], _) = split::<1, 1>(Op::AddBias, args, ctx)?;
    if bias.row_bytes == 0 {
        return Ok(());
    }
    for row in y.bytes.chunks_exact_mut(bias.row_bytes) {
        for (dst, b) in row.chunks_exact_mut(BF16).zip(bias.bytes.chunks_exact(BF16)) {
            let sum = bf16_bits_to_f32(dst[0], dst[1]) + bf16_bits_to_f32(b[0], b[1]);
            dst.copy_from_slice(&f32_to_bf16_bytes(sum));
        }
    }
    Ok(())
}

/// `zero`: every byte of the rows to 0 (0.0 in bf16 and f32 alike).
pub(crate) fn zero(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([], [buffer], _) = split::<0, 1>(Op::Zero, args, ctx)?;
    buffer.bytes.fill(0);
    Ok(())
}

/// `swiglu`: rows of `x` are `[gate | up]` (`2w` bf16), `y = silu(gate) * up` (`w` bf16).
pub(crate) fn swiglu(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([x], [y], shape) = split::<1, 1>(Op::Swiglu, args, ctx)?;
    let half = dim(shape.width).saturating_mul(BF16);
    if half == 0 {
        return Ok(());
    }
    for (src, dst) in x.bytes.chunks_exact(2 * half).zip(y.bytes.chunks_exact_mut(half)) {
        let (gate, up) = src.split_at(half);
        for ((out, g), u) in dst.chunks_exact_mut(BF16).zip(gate.chunks_exact(BF16)).zip(up.chunks_exact(BF16)) {
            let (g, u) = (bf16_bits_to_f32(g[0], g[1]), bf16_bits_to_f32(u[0], u[1]));
            out.copy_from_slice(&f32_to_bf16_bytes(silu_value(g) * u));
        }
    }
    Ok(())
}

/// `swiglu_backward`: `dx = [dgate | dup]` with `dgate = dy * up * silu'(gate)` and
/// `dup = dy * silu(gate)`.
pub(crate) fn swiglu_backward(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([x, dy], [dx], shape) = split::<2, 1>(Op::SwigluBackward, args, ctx)?;
    let half = dim(shape.width).saturating_mul(BF16);
    if half == 0 {
        return Ok(());
    }
    let rows = x.bytes.chunks_exact(2 * half).zip(dy.bytes.chunks_exact(half));
    for ((src, dys), dst) in rows.zip(dx.bytes.chunks_exact_mut(2 * half)) {
        let (gate, up) = src.split_at(half);
        let (dgate, dup) = dst.split_at_mut(half);
        let inputs = gate.chunks_exact(BF16).zip(up.chunks_exact(BF16)).zip(dys.chunks_exact(BF16));
        for (((g, u), d), (dg, du)) in inputs.zip(dgate.chunks_exact_mut(BF16).zip(dup.chunks_exact_mut(BF16))) {
            let (g, u, d) = (bf16_bits_to_f32(g[0], g[1]), bf16_bits_to_f32(u[0], u[1]), bf16_bits_to_f32(d[0], d[1]));
            dg.copy_from_slice(&f32_to_bf16_bytes(d * u * silu_derivative(g)));
            du.copy_from_slice(&f32_to_bf16_bytes(d * silu_value(g)));
        }
    }
    Ok(())
}
