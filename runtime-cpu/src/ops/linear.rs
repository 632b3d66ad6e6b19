//! Linear layers and the tied classifier, forward and backward, on [`gemm`].
//!
//! Weights are `out_features x in_features` (rows are output features). Every output element is
//! one sequential f32 sum rounded to bf16 once; a bias is added after the sum, an accumulating op
//! adds the sum to the stored bf16 value in f32 and rounds once.

use memo_plan_core::plan::Op;

use super::gemm::{gemm, ASource, PackedB};
use super::tensor::{bf16_bits_to_f32, bf16_vec, dim, f32_to_bf16_bytes, split, split_in, store_bf16, BF16};
use super::{Arg, Group, OpContext, OpError};

/// What the epilogue does with a row of `C`.
#[derive(Clone, Copy)]
enum Store<'a> {
    /// `out = round(c)`.
    Overwrite,
    /// `out = round(c + bias)`.
    Bias(&'a [f32]),
    /// `out = round(out + c)`.
    Accumulate,
}

/// Writes the `n` columns of each row of `c` (row stride `n_pad`) into the bf16 rows of `out`.
fn store_rows(c: &[f32], n_pad: usize, n: usize, out: &mut [u8], how: Store<'_>) {
    if n == 0 {
        return;
    }
    for (row, dst) in out.chunks_exact_mut(n * BF16).enumerate() {
        let Some(sums) = c.get(row * n_pad..row * n_pad + n) else { return };
        match how {
            Store::Overwrite => store_bf16(sums, dst),
            Store::Bias(bias) => {
                for ((pair, &sum), &b) in dst.chunks_exact_mut(BF16).zip(sums).zip(bias) {
                    pair.copy_from_slice(&f32_to_bf16_bytes(sum + b));
                }
            }
            Store::Accumulate => {
                for (pair, &sum) in dst.chunks_exact_mut(BF16).zip(sums) {
                    let old = bf16_bits_to_f32(pair[0], pair[1]);
                    pair.copy_from_slice(&f32_to_bf16_bytes(old + sum));
                }
            }
        }
    }
}

/// `linear`: `y = x W^T + bias`.
pub(crate) fn linear(args: &mut [Arg<'_>], ctx: &OpContext, threads: usize) -> Result<(), OpError> {
    let ([x, weight, bias], [y], shape) = split::<3, 1>(Op::Linear, args, ctx)?;
    let (k, n) = (dim(shape.width), dim(shape.features));
    let b = PackedB::from_bf16_transposed(weight.bytes, n, k);
    let bias = bf16_vec(bias.bytes);
    let a = ASource::Rows { bytes: x.bytes, k };
    gemm(a, &b, y.bytes, y.row_bytes, threads, |_, c, n_pad, out| store_rows(c, n_pad, n, out, Store::Bias(&bias)));
    Ok(())
}

/// `linear_no_bias`: `y = x W^T` (a row-parallel product's partial sum; each element the same
/// sequential f32 sum as `linear`'s, rounded once, without the bias).
pub(crate) fn linear_no_bias(args: &mut [Arg<'_>], ctx: &OpContext, threads: usize) -> Result<(), OpError> {
    let ([x, weight], [y], shape) = split::<2, 1>(Op::LinearNoBias, args, ctx)?;
    let (k, n) = (dim(shape.width), dim(shape.features));
    let b = PackedB::from_bf16_transposed(weight.bytes, n, k);
    let a = ASource::Rows { bytes: x.bytes, k };
    gemm(a, &b, y.bytes, y.row_bytes, threads, |_, c, n_pad, out| store_rows(c, n_pad, n, out, Store::Overwrite));
    Ok(())
}

/// `linear_backward_input` (`dx = dy W`) and its accumulating twin (`dx += dy W`).
pub(crate) fn backward_input(
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    accumulate: bool,
    threads: usize,
) -> Result<(), OpError> {
    let op = if accumulate { Op::LinearBackwardInputAccumulate } else { Op::LinearBackwardInput };
    let ([dy, weight], [dx], shape) = split::<2, 1>(op, args, ctx)?;
    let (k, n) = (dim(shape.width), dim(shape.features));
    let b = PackedB::from_bf16(weight.bytes, n, k);
    let how = if accumulate { Store::Accumulate } else { Store::Overwrite };
    let a = ASource::Rows { bytes: dy.bytes, k: n };
    gemm(a, &b, dx.bytes, dx.row_bytes, threads, |_, c, n_pad, out| store_rows(c, n_pad, k, out, how));
    Ok(())
}

/// `linear_backward_weight`: `dW = dy^T x` and `dbias = sum over rows of dy` (both overwritten);
/// `linear_backward_weight_no_bias` (`with_bias` false): `dW` alone, the same bits.
pub(crate) fn backward_weight(
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    with_bias: bool,
    threads: usize,
) -> Result<(), OpError> {
    let (x, dy, dweight, dbias, shape) = if with_bias {
        let ([x, dy], [dweight, dbias], shape) = split::<2, 2>(Op::LinearBackwardWeight, args, ctx)?;
        (x, dy, dweight, Some(dbias), shape)
    } else {
        let ([x, dy], [dweight], shape) = split::<2, 1>(Op::LinearBackwardWeightNoBias, args, ctx)?;
        (x, dy, dweight, None, shape)
    };
    let (k, n) = (dim(shape.width), dim(shape.features));
    let b = PackedB::from_bf16(x.bytes, x.rows, k);
    let a = ASource::Columns { bytes: dy.bytes, width: n };
    gemm(a, &b, dweight.bytes, dweight.row_bytes, threads, |_, c, n_pad, out| {
        store_rows(c, n_pad, k, out, Store::Overwrite)
    });
    let Some(dbias) = dbias else { return Ok(()) };
    let mut sums = vec![0.0f32; n];
    if n > 0 {
        for row in dy.bytes.chunks_exact(n * BF16) {
            for (sum, pair) in sums.iter_mut().zip(row.chunks_exact(BF16)) {
                *sum += bf16_bits_to_f32(pair[0], pair[1]);
            }
        }
    }
    store_bf16(&sums, dbias.bytes);
    Ok(())
}

/// `classifier`: `logits = x E^T` over a chunk of rows.
pub(crate) fn classifier(args: &mut [Arg<'_>], ctx: &OpContext, group: Group, threads: usize) -> Result<(), OpError> {
    let ([x, embedding], [logits], shape) = split_in::<2, 1>(Op::Classifier, args, ctx, group)?;
    let (h, v) = (dim(shape.width), dim(shape.features));
    let b = PackedB::from_bf16_transposed(embedding.bytes, v, h);
    let a = ASource::Rows { bytes: x.bytes, k: h };
    gemm(a, &b, logits.bytes, logits.row_bytes, threads, |_, c, n_pad, out| {
        store_rows(c, n_pad, v, out, Store::Overwrite)
    });
    Ok(())
}

/// `classifier_backward_weight`: `dE += dlogits^T x` over a chunk.
pub(crate) fn classifier_backward_weight(
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    group: Group,
    threads: usize,
) -> Result<(), OpError> {
    let ([x, dlogits], [dembedding], shape) = split_in::<2, 1>(Op::ClassifierBackwardWeight, args, ctx, group)?;
    let (h, v) = (dim(shape.width), dim(shape.features));
    let b = PackedB::from_bf16(x.bytes, x.rows, h);
    let a = ASource::Columns { bytes: dlogits.bytes, width: v };
    gemm(a, &b, dembedding.bytes, dembedding.row_bytes, threads, |_, c, n_pad, out| {
        store_rows(c, n_pad, h, out, Store::Accumulate)
    });
    Ok(())
}
