//! Layer norm, RMS norm and their backwards. Statistics are per row, in f32, with a summation
//! order fixed by the row's width alone ([`sum_lanes`]), so a row's output is the same in any
//! launch. Both add the context's `norm_eps` (rounded to f32) to the variance or mean square.

use memo_plan_core::plan::Op;

use super::tensor::{bf16_vec, dim, load_bf16, split, store_bf16, BF16};
use super::{Arg, OpContext, OpError};

/// Lanes of [`sum_lanes`].
const LANES: usize = 8;

/// The sum of `values` in a fixed order: element `j` goes to lane `j % 8` (in order), then the
/// lanes are added pairwise. Vectorises, and depends on nothing but `values`.
pub(crate) fn sum_lanes(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (chunks, rest) = values.as_chunks::<LANES>();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(rest) {
        *lane += v;
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

/// The context's epsilon as the kernels add it (f32).
fn epsilon(ctx: &OpContext) -> f32 {
    ctx.norm_eps as f32
}

/// A row's mean and `1 / sqrt(variance + eps)` (two passes).
fn statistics(x: &[f32], centred: &mut [f32], eps: f32) -> (f32, f32) {
    let h = x.len() as f32;
    let mean = sum_lanes(x) / h;
    for (c, &v) in centred.iter_mut().zip(x) {
        let d = v - mean;
        *c = d * d;
    }
    let variance = sum_lanes(centred) / h;
    (mean, 1.0 / (variance + eps).sqrt())
}

/// `layer_norm`: `y = (x - mean) / sqrt(var + eps) * scale + shift`, per row.
pub(crate) fn layer_norm(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([x, scale, shift], [y], shape) = split::<3, 1>(Op::LayerNorm, args, ctx)?;
    let h = dim(shape.width);
    if h == 0 {
        return Ok(());
    }
    let eps = epsilon(ctx);
    let (scale, shift) = (bf16_vec(scale.bytes), bf16_vec(shift.bytes));
    let (mut row, mut scratch, mut out) = (vec![0.0f32; h], vec![0.0f32; h], vec![0.0f32; h]);
    for (src, dst) in x.bytes.chunks_exact(h * BF16).zip(y.bytes.chunks_exact_mut(h * BF16)) {
        load_bf16(src, &mut row);
        let (mean, rstd) = statistics(&row, &mut scratch, eps);
        for (((o, &v), &g), &b) in out.iter_mut().zip(&row).zip(&scale).zip(&shift) {
            *o = (v - mean) * rstd * g + b;
        }
        store_bf16(&out, dst);
    }
    Ok(())
}

/// `layer_norm_backward`: `dx`, `dscale`, `dshift` (all overwritten), statistics recomputed from
/// `x`. `dscale` and `dshift` sum over rows in row order.
pub(crate) fn layer_norm_backward(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([x, scale, dy], [dx, dscale, dshift], shape) = split::<3, 3>(Op::LayerNormBackward, args, ctx)?;
    let h = dim(shape.width);
    if h == 0 {
        return Ok(());
    }
    let (hf, eps) = (h as f32, epsilon(ctx));
    let scale = bf16_vec(scale.bytes);
    let (mut xr, mut dyr, mut xhat, mut g, mut scratch) =
        (vec![0.0f32; h], vec![0.0f32; h], vec![0.0f32; h], vec![0.0f32; h], vec![0.0f32; h]);
    let (mut dscale_sum, mut dshift_sum) = (vec![0.0f32; h], vec![0.0f32; h]);
    let rows = x.bytes.chunks_exact(h * BF16).zip(dy.bytes.chunks_exact(h * BF16));
    for ((xs, dys), dst) in rows.zip(dx.bytes.chunks_exact_mut(h * BF16)) {
        load_bf16(xs, &mut xr);
        load_bf16(dys, &mut dyr);
        let (mean, rstd) = statistics(&xr, &mut scratch, eps);
        for (((xh, gg), &v), (&d, &s)) in xhat.iter_mut().zip(g.iter_mut()).zip(&xr).zip(dyr.iter().zip(&scale)) {
            *xh = (v - mean) * rstd;
            *gg = d * s;
        }
        let mean_g = sum_lanes(&g) / hf;
        for ((t, &gg), &xh) in scratch.iter_mut().zip(&g).zip(&xhat) {
            *t = gg * xh;
        }
        let mean_gx = sum_lanes(&scratch) / hf;
        for ((t, &gg), &xh) in scratch.iter_mut().zip(&g).zip(&xhat) {
            *t = rstd * (gg - mean_g - xh * mean_gx);
        }
        store_bf16(&scratch, dst);
        for (((ds, dsh), &d), &xh) in dscale_sum.iter_mut().zip(dshift_sum.iter_mut()).zip(&dyr).zip(&xhat) {
            *ds += d * xh;
            *dsh += d;
        }
    }
    store_bf16(&dscale_sum, dscale.bytes);
    store_bf16(&dshift_sum, dshift.bytes);
    Ok(())
}

/// A row's `1 / sqrt(mean(x^2) + eps)`; `squares` is scratch of the row's width.
fn rms_statistics(x: &[f32], squares: &mut [f32], eps: f32) -> f32 {
    for (q, &v) in squares.iter_mut().zip(x) {
        *q = v * v;
    }
    let mean_square = sum_lanes(squares) / x.len() as f32;
    1.0 / (mean_square + eps).sqrt()
}

/// `rms_norm`: `y = x / sqrt(mean(x^2) + eps) * scale`, per row.
pub(crate) fn rms_norm(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([x, scale], [y], shape) = split::<2, 1>(Op::RmsNorm, args, ctx)?;
    let h = dim(shape.width);
    if h == 0 {
        return Ok(());
    }
    let eps = epsilon(ctx);
    let scale = bf16_vec(scale.bytes);
    let (mut row, mut scratch, mut out) = (vec![0.0f32; h], vec![0.0f32; h], vec![0.0f32; h]);
    for (src, dst) in x.bytes.chunks_exact(h * BF16).zip(y.bytes.chunks_exact_mut(h * BF16)) {
        load_bf16(src, &mut row);
        let rstd = rms_statistics(&row, &mut scratch, eps);
        for ((o, &v), &g) in out.iter_mut().zip(&row).zip(&scale) {
            *o = v * rstd * g;
        }
        store_bf16(&out, dst);
    }
    Ok(())
}

/// `rms_norm_backward`: `dx` and `dscale` (both overwritten), statistics recomputed from `x`.
/// With `xhat = x * rstd` and `g = dy * scale`: `dx = rstd * (g - xhat * mean(g * xhat))`;
/// `dscale` sums `dy * xhat` over rows in row order.
pub(crate) fn rms_norm_backward(args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let ([x, scale, dy], [dx, dscale], shape) = split::<3, 2>(Op::RmsNormBackward, args, ctx)?;
    let h = dim(shape.width);
    if h == 0 {
        return Ok(());
    }
    let (hf, eps) = (h as f32, epsilon(ctx));
    let scale = bf16_vec(scale.bytes);
    let (mut xr, mut dyr, mut xhat, mut g, mut scratch) =
        (vec![0.0f32; h], vec![0.0f32; h], vec![0.0f32; h], vec![0.0f32; h], vec![0.0f32; h]);
    let mut dscale_sum = vec![0.0f32; h];
    let rows = x.bytes.chunks_exact(h * BF16).zip(dy.bytes.chunks_exact(h * BF16));
    for ((xs, dys), dst) in rows.zip(dx.bytes.chunks_exact_mut(h * BF16)) {
        load_bf16(xs, &mut xr);
        load_bf16(dys, &mut dyr);
        let rstd = rms_statistics(&xr, &mut scratch, eps);
        for (((xh, gg), &v), (&d, &s)) in xhat.iter_mut().zip(g.iter_mut()).zip(&xr).zip(dyr.iter().zip(&scale)) {
            *xh = v * rstd;
            *gg = d * s;
        }
        for ((t, &gg), &xh) in scratch.iter_mut().zip(&g).zip(&xhat) {
            *t = gg * xh;
        }
        let mean_gx = sum_lanes(&scratch) / hf;
        for ((t, &gg), &xh) in scratch.iter_mut().zip(&g).zip(&xhat) {
            *t = rstd * (gg - xh * mean_gx);
        }
        store_bf16(&scratch, dst);
        for ((ds, &d), &xh) in dscale_sum.iter_mut().zip(&dyr).zip(&xhat) {
            *ds += d * xh;
        }
    }
    store_bf16(&dscale_sum, dscale.bytes);
    Ok(())
}
