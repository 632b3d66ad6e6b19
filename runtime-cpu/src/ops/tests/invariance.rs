//! Bit-exactness: MEMO recomputes rows `[a, s)` of the row-wise ops after a forward over all
//! rows, and the two must agree to the bit; every op must give the same bits on every run and
//! for every thread count.

use memo_plan_core::plan::Op;

use super::super::{execute_on_rank, Group};
use super::forward::Gqa;
use super::{args_of, context, run, run_threads, OpContext, Rng, T};

/// Rows of the invariance cases: more than two GEMM chunks (64 rows), not a multiple of a tile.
const M: usize = 150;

/// Fails with the first differing byte when two runs' tensors differ.
fn same(got: &[T], want: &[T], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            (g.rows, g.row_bytes, g.data.len()),
            (w.rows, w.row_bytes, w.data.len()),
            "{what}: tensor {i} shape"
        );
        if let Some(at) = g.data.iter().zip(&w.data).position(|(a, b)| a != b) {
            panic!("{what}: tensor {i} differs first at byte {at} (row {})", at / g.row_bytes.max(1));
        }
    }
}

/// Runs `op` over all `M` rows, then over pieces of the rows (slicing the arguments listed in
/// `row_args`, passing the others whole), and checks that each piece's rows are byte-identical
/// to the same rows of the full run; also with 2 and 3 threads.
fn check_row_ranges(op: Op, ctx: &OpContext, tensors: &[T], row_args: &[usize]) {
    let mut full = tensors.to_vec();
    run(op, ctx, &mut full);
    for threads in [2, 3] {
        let mut again = tensors.to_vec();
        run_threads(op, ctx, &mut again, threads).unwrap();
        same(&again, &full, &format!("{}: {threads} threads", op.name()));
    }
    let splits: [&[usize]; 9] = [
        &[0, 1, M],
        &[0, 3, M],
        &[0, 5, M],
        &[0, 17, M],
        &[0, 64, M],
        &[0, 65, M],
        &[0, M - 1, M],
        &[0, 7, 40, 77, 131, M],
        &[0, M],
    ];
    for (case, split) in splits.iter().enumerate() {
        for window in split.windows(2) {
            let (a, b) = (window[0], window[1]);
            let mut part: Vec<T> = tensors
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let mut t = if row_args.contains(&i) { t.slice(a, b) } else { t.clone() };
                    // Odd cases: as a recompute into a buffer of its own, rows start at 0.
                    if case % 2 == 1 {
                        t.first_row = 0;
                    }
                    t
                })
                .collect();
            run(op, ctx, &mut part);
            for &i in row_args {
                let what = format!("{}: argument {i}, rows {a}..{b}", op.name());
                same(std::slice::from_ref(&part[i]), &[full[i].slice(a, b)], &what);
            }
        }
    }
}

#[test]
fn row_wise_ops_give_the_same_bits_on_any_row_range() {
    let mut rng = Rng::new(31);
    let (h, f, vocab) = (40, 24, 33);
    let ctx = context(h, 1, M, vocab);
    let x = T::bf16(&rng.bf16_vec(M * h, 2.0), M);
    let x2 = T::bf16(&rng.bf16_vec(M * h, 2.0), M);
    let wide = T::bf16(&rng.bf16_vec(M * f, 2.0), M);
    let (scale, shift) = (T::bf16(&rng.bf16_vec(h, 1.0), 1), T::bf16(&rng.bf16_vec(h, 1.0), 1));
    let (w, bias) = (T::bf16(&rng.bf16_vec(f * h, 0.3), f), T::bf16(&rng.bf16_vec(f, 0.3), 1));
    let embedding = T::bf16(&rng.bf16_vec(vocab * h, 1.0), vocab);
    let ids: Vec<u32> = (0..M).map(|_| rng.below(vocab) as u32).collect();

    check_row_ranges(Op::LayerNorm, &ctx, &[x.clone(), scale, shift, T::zeros(M, h * 2)], &[0, 3]);
    check_row_ranges(Op::Linear, &ctx, &[x.clone(), w.clone(), bias, T::zeros(M, f * 2)], &[0, 3]);
    check_row_ranges(Op::Add, &ctx, &[x.clone(), x2.clone(), T::zeros(M, h * 2)], &[0, 1, 2]);
    check_row_ranges(Op::Gelu, &ctx, &[x.clone(), T::zeros(M, h * 2)], &[0, 1]);
    check_row_ranges(Op::GeluBackward, &ctx, &[x.clone(), x2.clone(), T::zeros(M, h * 2)], &[0, 1, 2]);
    check_row_ranges(Op::LinearBackwardInput, &ctx, &[wide.clone(), w.clone(), T::zeros(M, h * 2)], &[0, 2]);
    check_row_ranges(Op::LinearBackwardInputAccumulate, &ctx, &[wide, w, x2], &[0, 2]);
    check_row_ranges(Op::Embedding, &ctx, &[T::ids(&ids), embedding.clone(), T::zeros(M, h * 2)], &[0, 2]);
    check_row_ranges(Op::Classifier, &ctx, &[x, embedding, T::zeros(M, vocab * 2)], &[0, 2]);
    let logits = T::bf16(&rng.bf16_vec(M * vocab, 3.0), M);
    let mut ctx = ctx;
    ctx.loss_scale_tokens = 4 * M;
    check_row_ranges(Op::CrossEntropy, &ctx, &[logits, T::ids(&ids), T::f32s(&[0.0], 1)], &[0, 1]);
}

/// Runs `op` twice on one thread and once on 4: all three leave identical bytes everywhere.
fn check_deterministic(op: Op, ctx: &OpContext, tensors: &[T]) {
    let mut first = tensors.to_vec();
    run(op, ctx, &mut first);
    let mut second = tensors.to_vec();
    run(op, ctx, &mut second);
    same(&first, &second, &format!("{}: two runs", op.name()));
    let mut threaded = tensors.to_vec();
    run_threads(op, ctx, &mut threaded, 4).unwrap();
    same(&first, &threaded, &format!("{}: 4 threads", op.name()));
}

#[test]
fn every_op_is_deterministic_whatever_the_thread_count() {
    let mut rng = Rng::new(32);
    let (seqs, s, heads, d) = (2, 33, 3, 8);
    let (rows, width) = (seqs * s, heads * d);
    let ctx = context(width, heads, s, M);
    let bf = |rng: &mut Rng, rows: usize, width: usize| T::bf16(&rng.bf16_vec(rows * width, 1.5), rows);
    let (q, k, v) = (bf(&mut rng, rows, width), bf(&mut rng, rows, width), bf(&mut rng, rows, width));
    let attention = [q, k, v, T::zeros(rows, width * 2), T::zeros(rows, heads * 4)];
    check_deterministic(Op::Attention, &ctx, &attention);
    let mut saved = attention.to_vec();
    run(Op::Attention, &ctx, &mut saved);
    let mut backward = saved;
    backward.push(bf(&mut rng, rows, width));
    backward.extend([T::zeros(rows, width * 2), T::zeros(rows, width * 2), T::zeros(rows, width * 2)]);
    check_deterministic(Op::AttentionBackward, &ctx, &backward);

    // GEMMs whose output has more rows than one chunk: weight rows, vocabulary entries.
    let (x, dy) = (bf(&mut rng, rows, width), bf(&mut rng, rows, M));
    let lbw = [x.clone(), dy.clone(), T::zeros(M, width * 2), T::zeros(1, M * 2)];
    check_deterministic(Op::LinearBackwardWeight, &ctx, &lbw);
    check_deterministic(Op::ClassifierBackwardWeight, &ctx, &[x.clone(), dy, bf(&mut rng, M, width)]);

    let (scale, grad) = (bf(&mut rng, 1, width), bf(&mut rng, rows, width));
    let lnb =
        [x.clone(), scale, grad.clone(), T::zeros(rows, width * 2), T::zeros(1, width * 2), T::zeros(1, width * 2)];
    check_deterministic(Op::LayerNormBackward, &ctx, &lnb);
    let ids: Vec<u32> = (0..rows).map(|_| rng.below(5) as u32).collect();
    check_deterministic(Op::EmbeddingBackward, &ctx, &[T::ids(&ids), grad.clone(), bf(&mut rng, M, width)]);
    check_deterministic(Op::GradNormSquared, &ctx, &[grad.clone(), T::f32s(&[0.5], 1)]);
    let state = T::f32s(&rng.bf16_vec(rows * width * 3, 0.5), rows);
    check_deterministic(Op::AdamW, &ctx, &[x, grad, state, T::f32s(&[3.0], 1)]);
}

#[test]
fn llama_row_wise_ops_give_the_same_bits_on_any_row_range() {
    let mut rng = Rng::new(33);
    let h = 40;
    let ctx = context(h, 1, M, 1);
    let x = T::bf16(&rng.bf16_vec(M * h, 2.0), M);
    let dy = T::bf16(&rng.bf16_vec(M * h, 2.0), M);
    let both = T::bf16(&rng.bf16_vec(M * 2 * h, 4.0), M);
    let scale = T::bf16(&rng.bf16_vec(h, 1.0), 1);
    check_row_ranges(Op::RmsNorm, &ctx, &[x.clone(), scale.clone(), T::zeros(M, h * 2)], &[0, 2]);
    // `dscale` sums over the launch's rows; `dx` is row-wise.
    let rnb = [x, scale.clone(), dy.clone(), T::zeros(M, h * 2), T::zeros(1, h * 2)];
    check_row_ranges(Op::RmsNormBackward, &ctx, &rnb, &[0, 2, 3]);
    check_row_ranges(Op::Swiglu, &ctx, &[both.clone(), T::zeros(M, h * 2)], &[0, 1]);
    check_row_ranges(Op::SwigluBackward, &ctx, &[both, dy, T::zeros(M, h * 4)], &[0, 1, 2]);
}

/// Runs `op` as `group`'s rank on 1 and on 3 threads: identical bytes everywhere.
fn check_three_threads(op: Op, ctx: &OpContext, group: Group, tensors: &[T]) -> Vec<T> {
    let mut one = tensors.to_vec();
    execute_on_rank(op, &mut args_of(op, &mut one), ctx, group, 1).unwrap();
    let mut three = tensors.to_vec();
    execute_on_rank(op, &mut args_of(op, &mut three), ctx, group, 3).unwrap();
    same(&three, &one, &format!("{}: 3 threads", op.name()));
    one
}

#[test]
fn llama_ops_give_the_same_bits_on_one_and_three_threads() {
    let mut rng = Rng::new(34);
    let (rows, h, f) = (M, 24, 70);
    let ctx = context(h, 1, rows, 1);
    let bf = |rng: &mut Rng, rows: usize, width: usize| T::bf16(&rng.bf16_vec(rows * width, 1.5), rows);
    let (x, dy, scale) = (bf(&mut rng, rows, h), bf(&mut rng, rows, h), bf(&mut rng, 1, h));
    let single = Group::SINGLE;
    check_three_threads(Op::RmsNorm, &ctx, single, &[x.clone(), scale.clone(), T::zeros(rows, h * 2)]);
    let rnb = [x.clone(), scale, dy.clone(), T::zeros(rows, h * 2), T::zeros(1, h * 2)];
    check_three_threads(Op::RmsNormBackward, &ctx, single, &rnb);
    let both = bf(&mut rng, rows, 2 * h);
    check_three_threads(Op::Swiglu, &ctx, single, &[both.clone(), T::zeros(rows, h * 2)]);
    check_three_threads(Op::SwigluBackward, &ctx, single, &[both, dy, T::zeros(rows, h * 4)]);
    // More weight rows than one GEMM chunk.
    let dyf = bf(&mut rng, rows, f);
    check_three_threads(Op::LinearBackwardWeightNoBias, &ctx, single, &[x, dyf, T::zeros(f, h * 2)]);

    let base = Gqa { sequences: 2, s: 33, heads: 4, kv_heads: 2, d: 8, replicated: None, theta: 500_000.0 };
    let cases = [
        base,
        Gqa { kv_heads: 1, ..base },
        Gqa { heads: 3, kv_heads: 3, replicated: Some((1, 2)), ..base },
        Gqa { replicated: Some((1, 2)), ..base },
    ];
    for c in cases {
        let ctx = c.context();
        let (r, width, kv_width) = (c.sequences * c.s, c.heads * c.d, c.kv_heads * c.d);
        let (q, k, v) = (bf(&mut rng, r, width), bf(&mut rng, r, kv_width), bf(&mut rng, r, kv_width));
        let forward = [q, k, v, T::zeros(r, width * 2), T::zeros(r, c.heads * 4)];
        let mut backward = check_three_threads(Op::Attention, &ctx, c.group(), &forward);
        backward.push(bf(&mut rng, r, width));
        backward.extend([T::zeros(r, width * 2), T::zeros(r, kv_width * 2), T::zeros(r, kv_width * 2)]);
        check_three_threads(Op::AttentionBackward, &ctx, c.group(), &backward);
    }
}
