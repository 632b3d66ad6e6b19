//! Bad launches give errors that say what and where; no launch panics.

use memo_plan_core::plan::Op;

use super::super::{execute_with_threads, Arg, ArgData, OpErrorKind};
use super::{context, run_threads, OpContext, Rng, T};

/// The message of the error `op` gives on `tensors`.
fn error_of(op: Op, ctx: &OpContext, tensors: &mut [T]) -> (OpErrorKind, String) {
    match run_threads(op, ctx, tensors, 1) {
        Ok(()) => panic!("{} accepted a bad launch", op.name()),
        Err(error) => (error.kind.clone(), error.to_string()),
    }
}

#[test]
fn wrong_count_access_and_byte_count_are_errors() {
    let ctx = context(4, 1, 2, 3);
    let (kind, message) = error_of(Op::Gelu, &ctx, &mut [T::zeros(2, 8)]);
    assert_eq!(kind, OpErrorKind::ArgumentCount { expected: 2, found: 1 });
    assert!(message.contains("op `gelu`") && message.contains("x, y"), "{message}");

    let (x, mut y) = (T::zeros(2, 8), T::zeros(2, 8));
    let mut args = [
        Arg { data: ArgData::Read(&x.data), first_row: 0, rows: 2, row_bytes: 8 },
        Arg { data: ArgData::Read(&y.data), first_row: 0, rows: 2, row_bytes: 8 },
    ];
    let error = execute_with_threads(Op::Gelu, &mut args, &ctx, 1).unwrap_err();
    assert_eq!(error.argument, Some("y"));
    assert!(error.to_string().contains("passed as read"), "{error}");
    let mut args = [
        Arg { data: ArgData::Read(&x.data), first_row: 0, rows: 3, row_bytes: 8 },
        Arg { data: ArgData::Write(&mut y.data), first_row: 0, rows: 2, row_bytes: 8 },
    ];
    let error = execute_with_threads(Op::Gelu, &mut args, &ctx, 1).unwrap_err();
    assert_eq!(error.kind, OpErrorKind::ByteCount { rows: 3, row_bytes: 8, bytes: 16 });
}

#[test]
fn shape_mismatches_name_the_argument_and_the_expectation() {
    let ctx = context(4, 2, 3, 5);
    // A weight of 3 input features for an x of 4.
    let mut t = [T::zeros(2, 8), T::zeros(6, 6), T::zeros(1, 12), T::zeros(2, 12)];
    let (_, message) = error_of(Op::Linear, &ctx, &mut t);
    assert!(message.contains("argument `weight`") && message.contains("expected 8 bytes per row"), "{message}");
    // Attention over 4 rows of sequences of 3.
    let mut t = [T::zeros(4, 8), T::zeros(4, 8), T::zeros(4, 8), T::zeros(4, 8), T::zeros(4, 8)];
    let (_, message) = error_of(Op::Attention, &ctx, &mut t);
    assert!(message.contains("argument `q`") && message.contains("whole sequences"), "{message}");
    // A token id beyond the vocabulary.
    let mut t = [T::ids(&[1, 5]), T::zeros(5, 8), T::zeros(2, 8)];
    let (kind, message) = error_of(Op::Embedding, &ctx, &mut t);
    assert_eq!(kind, OpErrorKind::IdOutOfRange { row: 1, id: 5, limit: 5 });
    assert!(message.contains("argument `tokens`"), "{message}");
    // A layer norm wider than the context's hidden size.
    let mut t = [T::zeros(2, 10), T::zeros(1, 10), T::zeros(1, 10), T::zeros(2, 10)];
    let (_, message) = error_of(Op::LayerNorm, &ctx, &mut t);
    assert!(message.contains("argument `x`") && message.contains("`hidden`"), "{message}");
    // A loss scale of zero.
    let mut t = [T::zeros(1, 10), T::ids(&[0]), T::zeros(1, 4)];
    let mut zero_scale = ctx;
    zero_scale.loss_scale_tokens = 0;
    let (_, message) = error_of(Op::CrossEntropy, &zero_scale, &mut t);
    assert!(message.contains("loss_scale_tokens"), "{message}");
}

#[test]
fn collectives_need_a_multi_gpu_backend() {
    for op in [Op::AllGather, Op::ReduceScatter] {
        let (kind, message) = error_of(op, &context(4, 1, 2, 3), &mut [T::zeros(2, 8), T::zeros(2, 8)]);
        assert_eq!(kind, OpErrorKind::NeedsMultiGpu);
        assert!(message.contains("needs a multi-GPU backend (t > 1)"), "{message}");
    }
    for op in [Op::AllReduceSumBf16, Op::AllReduceSumF32, Op::AllReduceMaxF32] {
        let (kind, _) = error_of(op, &context(4, 1, 2, 3), &mut [T::zeros(2, 8)]);
        assert_eq!(kind, OpErrorKind::NeedsMultiGpu);
    }
}

/// Small dimensions of a launch.
struct Dims {
    m: usize,
    h: usize,
    f: usize,
    heads: usize,
    head_dim: usize,
    s: usize,
    sequences: usize,
    vocab: usize,
}

/// Random bf16/u32/f32 bytes of the right shapes for `op`: a valid launch.
fn valid_launch(op: Op, d: &Dims, rng: &mut Rng) -> Vec<T> {
    let (m, h, f, v) = (d.m, d.h, d.f, d.vocab);
    let ids: Vec<u32> = (0..m).map(|_| rng.below(v) as u32).collect();
    let ids = |_: &mut Rng| T::ids(&ids);
    let mut bf =
        |rows: usize, width: usize| T { row_bytes: 2 * width, ..T::bf16(&rng.bf16_vec(rows * width, 2.0), rows) };
    let rows = d.sequences * d.s;
    let hd = d.heads * d.head_dim;
    match op {
        Op::Embedding => vec![ids(&mut Rng::new(0)), T::zeros(v, 2 * h), T::zeros(m, 2 * h)],
        Op::LayerNorm => vec![bf(m, h), bf(1, h), bf(1, h), bf(m, h)],
        Op::Linear => vec![bf(m, h), bf(f, h), bf(1, f), bf(m, f)],
        Op::Attention => vec![bf(rows, hd), bf(rows, hd), bf(rows, hd), bf(rows, hd), T::zeros(rows, 4 * d.heads)],
        Op::Gelu | Op::AllGather | Op::ReduceScatter => vec![bf(m, h), bf(m, h)],
        Op::Add | Op::GeluBackward => vec![bf(m, h), bf(m, h), bf(m, h)],
        Op::LinearBackwardInput | Op::LinearBackwardInputAccumulate => vec![bf(m, f), bf(f, h), bf(m, h)],
        Op::LinearBackwardWeight => vec![bf(m, h), bf(m, f), bf(f, h), bf(1, f)],
        Op::LayerNormBackward => vec![bf(m, h), bf(1, h), bf(m, h), bf(m, h), bf(1, h), bf(1, h)],
        Op::AttentionBackward => {
            let mut t: Vec<T> = (0..4).map(|_| bf(rows, hd)).collect();
            t.push(T::zeros(rows, 4 * d.heads));
            t.extend((0..4).map(|_| bf(rows, hd)));
            t
        }
        Op::Classifier => vec![bf(m, h), bf(v, h), bf(m, v)],
        Op::CrossEntropy => vec![bf(m, v), ids(&mut Rng::new(0)), T::f32s(&[0.0], 1)],
        Op::ClassifierBackwardWeight => vec![bf(m, h), bf(m, v), bf(v, h)],
        Op::EmbeddingBackward => vec![ids(&mut Rng::new(0)), bf(m, h), bf(v, h)],
        Op::Zero => vec![bf(m, h)],
        Op::GradNormSquared => vec![bf(m, h), T::f32s(&[0.0], 1)],
        Op::AdamW => vec![bf(m, h), bf(m, h), T::zeros(m, 12 * h), T::f32s(&[1.0], 1)],
        Op::AllReduceSumBf16 => vec![bf(m, h)],
        Op::AllReduceSumF32 | Op::AllReduceMaxF32 => vec![T::zeros(m, 4 * h)],
        Op::LinearNoBias => vec![bf(m, h), bf(f, h), bf(m, f)],
        Op::AddBias => vec![bf(1, h), bf(m, h)],
        Op::CrossEntropyMax => vec![bf(m, v), T::zeros(m, 4)],
        Op::CrossEntropySums => vec![bf(m, v), ids(&mut Rng::new(0)), T::zeros(m, 4), T::zeros(m, 8)],
        Op::CrossEntropyFinish => {
            let sums: Vec<f32> = (0..m).flat_map(|_| [2.0, 0.5]).collect();
            vec![
                bf(m, v),
                ids(&mut Rng::new(0)),
                T::zeros(m, 4),
                T { row_bytes: 8, ..T::f32s(&sums, m) },
                T::f32s(&[0.0], 1),
            ]
        }
        Op::RmsNorm => vec![bf(m, h), bf(1, h), bf(m, h)],
        Op::RmsNormBackward => vec![bf(m, h), bf(1, h), bf(m, h), bf(m, h), bf(1, h)],
        Op::Swiglu => vec![bf(m, 2 * h), bf(m, h)],
        Op::SwigluBackward => vec![bf(m, 2 * h), bf(m, h), bf(m, 2 * h)],
        Op::LinearBackwardWeightNoBias => vec![bf(m, h), bf(m, f), bf(f, h)],
        // Context parallelism's ops: any arguments here (this test only asks that nothing
        // panics); their valid and invalid launches are `tests/ring.rs`'s.
        _ => (0..op.signature().len()).map(|_| bf(m, h)).collect(),
    }
}

/// One random change that may break the launch.
fn perturb(tensors: &mut Vec<T>, ctx: &mut OpContext, rng: &mut Rng) {
    if tensors.is_empty() {
        tensors.push(T::zeros(1, 2));
        return;
    }
    let i = rng.below(tensors.len());
    match rng.below(9) {
        0 => {
            tensors.remove(i);
        }
        1 => tensors.push(T::zeros(1, 2)),
        2 => {
            // Rows that disagree with the bytes.
            tensors[i].rows += 1;
        }
        3 => {
            let t = &mut tensors[i];
            let extra = 1 + rng.below(3);
            t.row_bytes += extra;
            t.data.resize(t.rows * t.row_bytes, 0xff);
        }
        4 => {
            let t = &mut tensors[i];
            t.rows += 1;
            t.data.resize(t.rows * t.row_bytes, 0x7f);
        }
        5 => tensors[i].first_row += 1 + rng.below(5),
        6 => tensors[i].data.iter_mut().for_each(|b| *b = rng.below(256) as u8),
        7 => {
            *ctx = OpContext {
                hidden: rng.below(6),
                heads: rng.below(3),
                seq_len: rng.below(4),
                vocab: rng.below(6),
                loss_scale_tokens: rng.below(2),
                ..*ctx
            }
        }
        _ => ctx.adamw.step = 0,
    }
}

#[test]
fn random_launches_never_panic() {
    let mut rng = Rng::new(41);
    let mut valid_ok = 0;
    // 4200 rounds: about 3000 over the ops whose valid launches this file draws, as before
    // context parallelism's twelve ops (drawn with any arguments, never counted as valid: their
    // valid launches are `tests/ring.rs`'s) joined the table.
    for round in 0..4200 {
        let op = Op::ALL[round % Op::ALL.len()];
        let d = Dims {
            m: rng.below(6),
            h: rng.below(6),
            f: rng.below(5),
            heads: 1 + rng.below(3),
            head_dim: 2 * (1 + rng.below(2)),
            s: 1 + rng.below(4),
            sequences: rng.below(3),
            vocab: 1 + rng.below(6),
        };
        let mut ctx = context(d.h, d.heads, d.s, d.vocab);
        let mut tensors = valid_launch(op, &d, &mut rng);
        let perturbed = rng.below(2) == 0;
        if perturbed {
            for _ in 0..1 + rng.below(2) {
                perturb(&mut tensors, &mut ctx, &mut rng);
            }
        }
        let threads = 1 + rng.below(3);
        let result = run_threads(op, &ctx, &mut tensors, threads);
        if !perturbed && !op.is_collective() && !op.is_context_parallel() {
            if let Err(error) = result {
                panic!("a valid launch failed: {error}");
            }
            valid_ok += 1;
        }
    }
    assert!(valid_ok > 1000, "only {valid_ok} valid launches ran");
}

#[test]
fn empty_arguments_with_huge_widths_or_contexts_never_panic() {
    // Zero rows make any width consistent with zero bytes, so nothing may be sized from a width
    // or a context field alone. Widths are drawn to match a huge context often.
    let n = 1usize << 40;
    let widths = [2 * n, 4 * n, 12 * n, 2 * (n / 8), usize::MAX, 2, 4, 8];
    let mut rng = Rng::new(42);
    for op in Op::ALL.iter().copied() {
        for _ in 0..200 {
            let mut pick = |small: usize| if rng.below(2) == 0 { n } else { small };
            let (hidden, vocab, seq_len, heads) = (pick(4), pick(5), pick(3), pick(2));
            let ctx = OpContext { hidden, vocab, seq_len, heads, ..context(4, 2, 3, 5) };
            let mut tensors: Vec<T> = op
                .signature()
                .iter()
                .map(|_| match rng.below(4) {
                    0 => T::zeros(1, 4),
                    _ => T { data: Vec::new(), rows: 0, row_bytes: widths[rng.below(widths.len())], first_row: 0 },
                })
                .collect();
            let _ = run_threads(op, &ctx, &mut tensors, 2);
        }
    }
}

/// The context-parallel collectives (`ring_exchange`, `data_all_reduce_*`) need the other
/// ranks: a lone rank refuses them with an error value naming the op, after the op table's
/// checks, never a panic (a backend with a group runs them there).
#[test]
fn context_parallel_collectives_are_refused_on_a_lone_rank() {
    let ctx = context(4, 2, 3, 5);
    for op in [Op::RingExchange, Op::DataAllReduceSumBf16, Op::DataAllReduceSumF32] {
        let width = if op == Op::DataAllReduceSumF32 { 16 } else { 8 };
        let mut tensors: Vec<T> = op.signature().iter().map(|_| T::zeros(1, width)).collect();
        let (kind, message) = error_of(op, &ctx, &mut tensors);
        assert_eq!(kind, OpErrorKind::NeedsMultiGpu, "{op:?}: {message}");
        assert!(message.starts_with(&format!("op `{}`", op.name())), "{message}");
    }
}
