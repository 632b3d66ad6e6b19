//! The non-collective ops of the `t > 1` step (`spec/tensor-parallel.md`): the bias-free linear
//! and the bias added after, the vocabulary-parallel embedding and the split cross-entropy, on
//! simulated ranks (the all-reduces between the split ops done here in rank order, as the
//! collectives' contract says).

use memo_plan_core::plan::Op;

use super::super::{execute_on_rank, Group, OpErrorKind};
use super::{args_of, context, run, OpContext, Rng, T};

/// Runs `op` as rank `rank` of `ranks`; panics on an error.
fn run_on(op: Op, ctx: &OpContext, rank: usize, ranks: usize, tensors: &mut [T]) {
    let group = Group { rank, ranks };
    if let Err(error) = execute_on_rank(op, &mut args_of(op, tensors), ctx, group, 1) {
        panic!("rank {rank} of {ranks}: {error}");
    }
}

fn bf(rng: &mut Rng, rows: usize, width: usize) -> T {
    T { row_bytes: 2 * width, ..T::bf16(&rng.bf16_vec(rows * width, 2.0), rows) }
}

/// `linear_no_bias` is `linear` with a zero bias, bit for bit; `add_bias` then adds the bias to
/// each element in f32 and rounds once.
#[test]
fn linear_no_bias_then_add_bias() {
    let mut rng = Rng::new(11);
    let (m, k, n) = (5, 12, 7);
    let ctx = context(k, 1, 1, 1);
    let (x, w) = (bf(&mut rng, m, k), bf(&mut rng, n, k));
    let mut fused = [x.clone(), w.clone(), T::zeros(1, 2 * n), T::zeros(m, 2 * n)];
    run(Op::Linear, &ctx, &mut fused);
    let mut split = [x, w, T::zeros(m, 2 * n)];
    run(Op::LinearNoBias, &ctx, &mut split);
    assert_eq!(split[2].data, fused[3].data, "linear_no_bias = linear with a zero bias");
    let bias = bf(&mut rng, 1, n);
    let partial = split[2].values();
    let mut added = [bias.clone(), split[2].clone()];
    run(Op::AddBias, &ctx, &mut added);
    let b = bias.values();
    let want: Vec<f32> = partial.iter().enumerate().map(|(i, &y)| super::round_bf16(y + b[i % n])).collect();
    assert_eq!(added[1].values(), want);
}

/// Per rank `k` of `t`: the logits' columns `[k V', (k+1) V')` of the whole `V`-column logits
/// (padding columns past `V` hold garbage the ops must ignore).
fn shard(logits: &[f32], rows: usize, vocab: usize, t: usize, k: usize) -> T {
    let shard = vocab.div_ceil(t);
    let mut values = Vec::with_capacity(rows * shard);
    for row in 0..rows {
        for c in 0..shard {
            let id = k * shard + c;
            values.push(if id < vocab { logits[row * vocab + id] } else { 1000.0 });
        }
    }
    T { row_bytes: 2 * shard, ..T::bf16(&values, rows) }
}

/// The split cross-entropy on `t` simulated ranks, the all-reduces done in rank order: each
/// rank's gradient shard and its loss.
fn split_cross_entropy(ctx: &OpContext, logits: &[f32], targets: &[u32], t: usize) -> Vec<(T, f32)> {
    let (rows, vocab) = (targets.len(), ctx.vocab);
    let mut shards: Vec<T> = (0..t).map(|k| shard(logits, rows, vocab, t, k)).collect();
    let mut maxima = vec![f32::NEG_INFINITY; rows];
    for (k, logits) in shards.iter().enumerate() {
        let mut args = [logits.clone(), T::zeros(rows, 4)];
        run_on(Op::CrossEntropyMax, ctx, k, t, &mut args);
        for (m, v) in maxima.iter_mut().zip(args[1].f32_values()) {
            *m = m.max(v);
        }
    }
    let max = T::f32s(&maxima, rows);
    let mut sums = vec![0.0f32; 2 * rows];
    for (k, logits) in shards.iter().enumerate() {
        let mut args = [logits.clone(), T::ids(targets), max.clone(), T::zeros(rows, 8)];
        run_on(Op::CrossEntropySums, ctx, k, t, &mut args);
        for (s, v) in sums.iter_mut().zip(args[3].f32_values()) {
            *s += v;
        }
    }
    let sums = T { row_bytes: 8, ..T::f32s(&sums, rows) };
    shards
        .iter_mut()
        .enumerate()
        .map(|(k, logits)| {
            let mut args = [logits.clone(), T::ids(targets), max.clone(), sums.clone(), T::f32s(&[0.0], 1)];
            run_on(Op::CrossEntropyFinish, ctx, k, t, &mut args);
            let [gradient, _, _, _, loss] = args;
            (gradient, loss.f32_values()[0])
        })
        .collect()
}

/// With one rank, the split cross-entropy gives the fused `cross_entropy`'s bits (gradient and
/// loss); with `t` = 2, 3 and 4 ranks (a vocabulary none divides), every rank gets the same loss,
/// the gradient shards put together are the fused gradient within bf16 rounding, the loss within
/// f32 rounding, and padding columns get 0.
#[test]
fn the_split_cross_entropy_is_the_fused_one() {
    let mut rng = Rng::new(12);
    let (rows, vocab) = (6, 11);
    let mut ctx = context(4, 1, 1, vocab);
    ctx.loss_scale_tokens = 24;
    let logits = T::bf16(&rng.bf16_vec(rows * vocab, 4.0), rows).values();
    let targets: Vec<u32> = (0..rows).map(|_| rng.below(vocab) as u32).collect();
    let mut fused = [T::bf16(&logits, rows), T::ids(&targets), T::f32s(&[0.0], 1)];
    run(Op::CrossEntropy, &ctx, &mut fused);
    let (fused_gradient, fused_loss) = (fused[0].values(), fused[2].f32_values()[0]);

    let single = split_cross_entropy(&ctx, &logits, &targets, 1);
    assert_eq!(single[0].0.data, fused[0].data, "t = 1: the same gradient bits");
    assert_eq!(single[0].1.to_bits(), fused_loss.to_bits(), "t = 1: the same loss bits");

    for t in [2, 3, 4] {
        let ranks = split_cross_entropy(&ctx, &logits, &targets, t);
        let shard = vocab.div_ceil(t);
        for (k, (gradient, loss)) in ranks.iter().enumerate() {
            assert_eq!(loss.to_bits(), ranks[0].1.to_bits(), "t = {t}: rank {k}'s loss differs from rank 0's");
            assert!((loss - fused_loss).abs() <= 1e-5 * fused_loss.abs(), "t = {t}: {loss} vs {fused_loss}");
            let values = gradient.values();
            for row in 0..rows {
                for c in 0..shard {
                    let (id, g) = (k * shard + c, values[row * shard + c]);
                    if id >= vocab {
                        assert_eq!(g, 0.0, "t = {t}: padding column {id} has a gradient");
                        continue;
                    }
                    let want = fused_gradient[row * vocab + id];
                    // Two bf16 roundings of values below 1 / loss_scale_tokens.
                    assert!(
                        (g - want).abs() <= 2.0 * want.abs() / 128.0 + 1e-6,
                        "t = {t} row {row} id {id}: {g} vs {want}"
                    );
                }
            }
        }
    }
}

/// Targets at or above the vocabulary are refused by the split ops; ids below it but inside a
/// rank's padding never occur, so an id is checked against `V`, not the shard.
#[test]
fn split_cross_entropy_refuses_targets_outside_the_vocabulary() {
    let ctx = context(4, 1, 1, 5);
    let group = Group { rank: 1, ranks: 2 };
    let mut args = [T::zeros(2, 6), T::ids(&[1, 5]), T::zeros(2, 4), T::zeros(2, 8)];
    let error = execute_on_rank(Op::CrossEntropySums, &mut args_of(Op::CrossEntropySums, &mut args), &ctx, group, 1)
        .unwrap_err();
    assert_eq!(error.kind, OpErrorKind::IdOutOfRange { row: 1, id: 5, limit: 5 });
    // A rank outside the group is a context error, not a panic.
    let outside = Group { rank: 2, ranks: 2 };
    let mut args = [T::zeros(2, 6), T::zeros(2, 4)];
    let error = execute_on_rank(Op::CrossEntropyMax, &mut args_of(Op::CrossEntropyMax, &mut args), &ctx, outside, 1)
        .unwrap_err();
    assert!(error.to_string().contains("context field `rank`"), "{error}");
}

/// The lookup over the gathered table (`t V'` rows) returns each id's row; the classifier takes
/// the rank's shard (`V'` rows) and its weight gradient accumulates into the shard.
#[test]
fn vocabulary_parallel_embedding_and_classifier_shapes() {
    let mut rng = Rng::new(13);
    let (h, vocab, t) = (4, 5, 2);
    let ctx = context(h, 1, 1, vocab);
    let table = bf(&mut rng, t * vocab.div_ceil(t), h);
    let ids = [4u32, 0, 3];
    let mut args = [T::ids(&ids), table.clone(), T::zeros(3, 2 * h)];
    run_on(Op::Embedding, &ctx, 1, t, &mut args);
    for (row, &id) in ids.iter().enumerate() {
        assert_eq!(
            args[2].data[row * 2 * h..(row + 1) * 2 * h],
            table.data[id as usize * 2 * h..(id as usize + 1) * 2 * h]
        );
    }
    // Id 5 is a row of the gathered table (padding) but not a token: refused.
    let mut args = [T::ids(&[5]), table, T::zeros(1, 2 * h)];
    let error =
        execute_on_rank(Op::Embedding, &mut args_of(Op::Embedding, &mut args), &ctx, Group { rank: 0, ranks: t }, 1)
            .unwrap_err();
    assert_eq!(error.kind, OpErrorKind::IdOutOfRange { row: 0, id: 5, limit: 5 });
    let shard = vocab.div_ceil(t);
    let mut args = [bf(&mut rng, 3, h), bf(&mut rng, shard, h), T::zeros(3, 2 * shard)];
    run_on(Op::Classifier, &ctx, 0, t, &mut args);
}
