//! Linear layers and the tied classifier, forward and backward, on [`gemm`].
//!
//! Weights are `out_features x in_features` (rows are output features). Every output element is
//! one sequential f32 sum rounded to bf16 once; a bias is added after the sum, an accumulating op
//! adds the sum to the stored bf16 value in f32 and rounds once.

use memo_plan_core::plan::Op;

use super::gemm::{gemm, ASource, PackedB};
use super::tensor::{bf16_bits_to_f32, bf16_vec, f32_to_bf16_bytes, split, store_bf16, Shape, BF16};
use super::{Arg, OpContext, OpError};

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
pub(crate) fn linear(args: &mut [Arg<'_>], threads: usize) -> Result<(), OpError> {
    let op = Op::Linear;
    let ([x, weight, bias], [y]) = split::<3, 1>(op, args)?;
    let k = x.elems(op, BF16, "bf16")?;
    let n = weight.rows;
    weight.want_elems(op, k, BF16, "one bf16 weight per input feature: the row width of `x`")?;
    bias.want_rows(op, 1, "a bias is one row")?;
    bias.want_elems(op, n, BF16, "one bf16 per output feature: the rows of `weight`")?;
    y.want_rows(op, x.rows, "one output row per row of `x`")?;
    y.want_elems(op, n, BF16, "one bf16 per output feature: the rows of `weight`")?;
    let b = PackedB::from_bf16_transposed(weight.bytes, n, k);
    let bias = bf16_vec(bias.bytes);
    let a = ASource::Rows { bytes: x.bytes, k };
    gemm(a, &b, y.bytes, y.row_bytes, threads, |_, c, n_pad, out| store_rows(c, n_pad, n, out, Store::Bias(&bias)));
    Ok(())
}

/// `linear_backward_input` (`dx = dy W`) and its accumulating twin (`dx += dy W`).
pub(crate) fn backward_input(args: &mut [Arg<'_>], accumulate: bool, threads: usize) -> Result<(), OpError> {
    let op = if accumulate { Op::LinearBackwardInputAccumulate } else { Op::LinearBackwardInput };
    let ([dy, weight], [dx]) = split::<2, 1>(op, args)?;
    let n = dy.elems(op, BF16, "bf16")?;
    weight.want_rows(op, n, "one weight row per output feature: the row width of `dy`")?;
    let k = weight.elems(op, BF16, "bf16")?;
    dx.want_rows(op, dy.rows, "one row per row of `dy`")?;
    dx.want_elems(op, k, BF16, "one bf16 per input feature: the row width of `weight`")?;
    let b = PackedB::from_bf16(weight.bytes, n, k);
    let how = if accumulate { Store::Accumulate } else { Store::Overwrite };
    let a = ASource::Rows { bytes: dy.bytes, k: n };
    gemm(a, &b, dx.bytes, dx.row_bytes, threads, |_, c, n_pad, out| store_rows(c, n_pad, k, out, how));
    Ok(())
}

/// `linear_backward_weight`: `dW = dy^T x` and `dbias = sum over rows of dy` (both overwritten).
pub(crate) fn backward_weight(args: &mut [Arg<'_>], threads: usize) -> Result<(), OpError> {
    let op = Op::LinearBackwardWeight;
    let ([x, dy], [dweight, dbias]) = split::<2, 2>(op, args)?;
    let k = x.elems(op, BF16, "bf16")?;
    let n = dy.elems(op, BF16, "bf16")?;
    dy.want_rows(op, x.rows, "one gradient row per row of `x`")?;
    dweight.want_rows(op, n, "one row per output feature: the row width of `dy`")?;
    dweight.want_elems(op, k, BF16, "one bf16 per input feature: the row width of `x`")?;
    dbias.want_rows(op, 1, "a bias gradient is one row")?;
    dbias.want_elems(op, n, BF16, "one bf16 per output feature: the row width of `dy`")?;
    let b = PackedB::from_bf16(x.bytes, x.rows, k);
    let a = ASource::Columns { bytes: dy.bytes, width: n };
    gemm(a, &b, dweight.bytes, dweight.row_bytes, threads, |_, c, n_pad, out| {
        store_rows(c, n_pad, k, out, Store::Overwrite)
    });
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

/// Checks the tied embedding against the context: `vocab` rows of `hidden` bf16.
pub(crate) fn check_embedding(op: Op, embedding: &impl Shape, ctx: &OpContext) -> Result<(), OpError> {
    embedding.want_rows(op, ctx.vocab, "the vocabulary size `vocab` of the context")?;
    embedding.want_elems(op, ctx.hidden, BF16, "`hidden` bf16 of the context")
}

/// `classifier`: `logits = x E^T` over a chunk of rows.
pub(crate) fn classifier(args: &mut [Arg<'_>], ctx: &OpContext, threads: usize) -> Result<(), OpError> {
    let op = Op::Classifier;
    let ([x, embedding], [logits]) = split::<2, 1>(op, args)?;
    check_embedding(op, &embedding, ctx)?;
    let h = ctx.hidden;
    x.want_elems(op, h, BF16, "`hidden` bf16 of the context")?;
    logits.want_rows(op, x.rows, "one row of logits per row of `x`")?;
    logits.want_elems(op, ctx.vocab, BF16, "one bf16 per vocabulary entry")?;
    let b = PackedB::from_bf16_transposed(embedding.bytes, ctx.vocab, h);
    let a = ASource::Rows { bytes: x.bytes, k: h };
    let v = ctx.vocab;
    gemm(a, &b, logits.bytes, logits.row_bytes, threads, |_, c, n_pad, out| {
        store_rows(c, n_pad, v, out, Store::Overwrite)
    });
    Ok(())
}

/// `classifier_backward_weight`: `dE += dlogits^T x` over a chunk.
pub(crate) fn classifier_backward_weight(args: &mut [Arg<'_>], ctx: &OpContext, threads: usize) -> Result<(), OpError> {
    let op = Op::ClassifierBackwardWeight;
    let ([x, dlogits], [dembedding]) = split::<2, 1>(op, args)?;
    check_embedding(op, &dembedding, ctx)?;
    let h = ctx.hidden;
    x.want_elems(op, h, BF16, "`hidden` bf16 of the context")?;
    dlogits.want_rows(op, x.rows, "one gradient row per row of `x`")?;
    dlogits.want_elems(op, ctx.vocab, BF16, "one bf16 per vocabulary entry")?;
    let b = PackedB::from_bf16(x.bytes, x.rows, h);
    let a = ASource::Columns { bytes: dlogits.bytes, width: ctx.vocab };
    gemm(a, &b, dembedding.bytes, dembedding.row_bytes, threads, |_, c, n_pad, out| {
        store_rows(c, n_pad, h, out, Store::Accumulate)
    });
    Ok(())
}
