//! Each op's result against a naive f64 computation on the same (bf16-representable) inputs.
//!
//! Tolerance: a bf16 result is the f32 result rounded once, within 2^-9 of it relatively; the
//! f32 sums add about `k * 2^-24` of the sum of magnitudes. So `2^-8` relative plus `2^-10` of
//! the largest value (for entries that cancel to near zero) holds with room, and a wrong index,
//! sign, scale or mask is far outside it.

use memo_plan_core::plan::Op;

use super::super::attention::{forward_blocked, forward_on_rank, KEY_BLOCK};
use super::super::Group;
use super::reference::{self, dot};
use super::{args_of, assert_close, context, f64s, run, run_threads, Rng, T};

const REL: f64 = 1.0 / 256.0;
const ABS: f64 = 1.0 / 1024.0;

#[test]
fn embedding_copies_the_rows_of_the_tokens() {
    let mut rng = Rng::new(1);
    let (vocab, h) = (11, 6);
    let table = T::bf16(&rng.bf16_vec(vocab * h, 1.0), vocab);
    let ids = [3u32, 0, 10, 3, 7];
    let mut t = [T::ids(&ids), table.clone(), T::zeros(ids.len(), h * 2)];
    run(Op::Embedding, &context(h, 1, 5, vocab), &mut t);
    for (row, &id) in ids.iter().enumerate() {
        assert_eq!(t[2].slice(row, row + 1).data, table.slice(id as usize, id as usize + 1).data, "row {row}");
    }
}

#[test]
fn layer_norm_matches_the_reference() {
    let mut rng = Rng::new(2);
    let (m, h) = (5, 40);
    let (x, scale, shift) = (rng.bf16_vec(m * h, 2.0), rng.bf16_vec(h, 1.5), rng.bf16_vec(h, 0.5));
    let mut t = [T::bf16(&x, m), T::bf16(&scale, 1), T::bf16(&shift, 1), T::zeros(m, h * 2)];
    run(Op::LayerNorm, &context(h, 1, m, 1), &mut t);
    let want = reference::layer_norm(&f64s(&x), &f64s(&scale), &f64s(&shift));
    assert_close("layer_norm y", &t[3].values(), &want, REL, ABS);
}

fn check_linear(seed: u64, m: usize, k: usize, n: usize) {
    let mut rng = Rng::new(seed);
    let (x, w, b) = (rng.bf16_vec(m * k, 1.0), rng.bf16_vec(n * k, 0.5), rng.bf16_vec(n, 0.5));
    let mut t = [T::bf16(&x, m), T::bf16(&w, n), T::bf16(&b, 1), T::zeros(m, n * 2)];
    run(Op::Linear, &context(k, 1, m, 1), &mut t);
    let want = reference::linear(&f64s(&x), &f64s(&w), &f64s(&b), k);
    assert_close(&format!("linear {m}x{k}x{n}"), &t[3].values(), &want, REL, ABS);
}

#[test]
fn linear_matches_the_reference_on_ragged_shapes() {
    check_linear(3, 9, 37, 19);
    check_linear(4, 1, 1, 1);
    // A contraction longer than the cache block (256) and more rows than one chunk (64).
    check_linear(5, 70, 300, 11);
}

#[test]
fn linear_with_no_input_features_writes_the_bias() {
    let mut t = [T::zeros(3, 0), T::zeros(2, 0), T::bf16(&[1.5, -2.0], 1), T::zeros(3, 4)];
    run(Op::Linear, &context(0, 1, 3, 1), &mut t);
    assert_eq!(t[3].values(), [1.5, -2.0, 1.5, -2.0, 1.5, -2.0]);
}

#[test]
fn linear_backward_input_and_its_accumulating_twin() {
    let mut rng = Rng::new(6);
    let (m, k, n) = (7, 13, 10);
    let (dy, w, old) = (rng.bf16_vec(m * n, 1.0), rng.bf16_vec(n * k, 1.0), rng.bf16_vec(m * k, 1.0));
    let dyw: Vec<f64> =
        (0..m * k).map(|e| (0..n).map(|j| f64::from(dy[e / k * n + j] * w[j * k + e % k])).sum()).collect();
    let mut t = [T::bf16(&dy, m), T::bf16(&w, n), T::bf16(&old, m)];
    run(Op::LinearBackwardInput, &context(k, 1, m, 1), &mut t);
    assert_close("dx = dy W", &t[2].values(), &dyw, REL, ABS);
    let mut t = [T::bf16(&dy, m), T::bf16(&w, n), T::bf16(&old, m)];
    run(Op::LinearBackwardInputAccumulate, &context(k, 1, m, 1), &mut t);
    let want: Vec<f64> = dyw.iter().zip(&old).map(|(a, &b)| a + f64::from(b)).collect();
    assert_close("dx += dy W", &t[2].values(), &want, REL, ABS);
}

fn check_attention(seed: u64, sequences: usize, s: usize, heads: usize, d: usize, key_block: usize) {
    let mut rng = Rng::new(seed);
    let rows = sequences * s;
    let width = heads * d;
    let (q, k, v) = (rng.bf16_vec(rows * width, 2.0), rng.bf16_vec(rows * width, 2.0), rng.bf16_vec(rows * width, 1.0));
    let mut t =
        [T::bf16(&q, rows), T::bf16(&k, rows), T::bf16(&v, rows), T::zeros(rows, width * 2), T::zeros(rows, heads * 4)];
    let ctx = context(width, heads, s, 1);
    let mut args = super::args_of(Op::Attention, &mut t);
    if let Err(error) = forward_blocked(&mut args, &ctx, 2, key_block) {
        panic!("{error}");
    }
    drop(args);
    let (out, lse) = reference::attention(&f64s(&q), &f64s(&k), &f64s(&v), s, heads, d);
    let what = format!("attention {sequences}x{s} heads {heads} dim {d} key block {key_block}");
    assert_close(&format!("{what}: out"), &t[3].values(), &out, REL, ABS);
    assert_close(&format!("{what}: lse"), &t[4].f32_values(), &lse, 1e-5, 1e-6);
}

#[test]
fn attention_matches_an_explicit_softmax() {
    check_attention(7, 2, 7, 2, 8, KEY_BLOCK);
    check_attention(8, 2, 7, 2, 4, KEY_BLOCK);
    // Several key blocks per row, a block size that does not divide the sequence.
    check_attention(9, 2, 7, 2, 8, 3);
    check_attention(10, 1, 150, 2, 4, KEY_BLOCK);
}

#[test]
fn gelu_add_and_zero() {
    let mut rng = Rng::new(11);
    let (a, b) = (rng.bf16_vec(24, 4.0), rng.bf16_vec(24, 4.0));
    let mut t = [T::bf16(&a, 4), T::zeros(4, 12)];
    run(Op::Gelu, &context(6, 1, 4, 1), &mut t);
    assert_close("gelu", &t[1].values(), &reference::gelu(&f64s(&a)), REL, ABS);
    let mut t = [T::bf16(&a, 4), T::bf16(&b, 4), T::zeros(4, 12)];
    run(Op::Add, &context(6, 1, 4, 1), &mut t);
    let sum: Vec<f64> = a.iter().zip(&b).map(|(x, y)| f64::from(*x) + f64::from(*y)).collect();
    assert_close("add", &t[2].values(), &sum, REL, ABS);
    let mut t = [T::bf16(&a, 4)];
    run(Op::Zero, &context(6, 1, 4, 1), &mut t);
    assert!(t[0].data.iter().all(|&byte| byte == 0));
}

#[test]
fn classifier_is_a_product_with_the_embedding() {
    let mut rng = Rng::new(12);
    let (m, h, vocab) = (6, 16, 21);
    let (x, e) = (rng.bf16_vec(m * h, 1.0), rng.bf16_vec(vocab * h, 1.0));
    let mut t = [T::bf16(&x, m), T::bf16(&e, vocab), T::zeros(m, vocab * 2)];
    run(Op::Classifier, &context(h, 1, m, vocab), &mut t);
    let want = reference::linear(&f64s(&x), &f64s(&e), &vec![0.0; vocab], h);
    assert_close("logits", &t[2].values(), &want, REL, ABS);
}

#[test]
fn cross_entropy_adds_the_loss_and_leaves_its_gradient() {
    let mut rng = Rng::new(13);
    let (m, vocab, tokens) = (5, 9, 40);
    let logits = rng.bf16_vec(m * vocab, 3.0);
    let targets = [0u32, 8, 4, 4, 1];
    let mut ctx = context(4, 1, m, vocab);
    ctx.loss_scale_tokens = tokens;
    let mut t = [T::bf16(&logits, m), T::ids(&targets), T::f32s(&[1.5], 1)];
    run(Op::CrossEntropy, &ctx, &mut t);
    let losses = reference::cross_entropy(&f64s(&logits), &targets, vocab);
    let loss = 1.5 + losses.iter().sum::<f64>();
    assert_close("loss", &t[2].f32_values(), &[loss], 1e-6, 0.0);
    let mut grad = Vec::new();
    for (row, &target) in logits.chunks(vocab).zip(&targets) {
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let z: f64 = row.iter().map(|&l| f64::from(l - max).exp()).sum();
        for (j, &l) in row.iter().enumerate() {
            let p = f64::from(l - max).exp() / z;
            grad.push((p - f64::from(u8::from(j == target as usize))) / tokens as f64);
        }
    }
    assert_close("dlogits", &t[0].values(), &grad, REL, ABS);
}

#[test]
fn accumulating_weight_gradients_add_to_what_is_there() {
    let mut rng = Rng::new(14);
    let (m, h, vocab) = (9, 8, 12);
    let (x, dlogits, old) = (rng.bf16_vec(m * h, 1.0), rng.bf16_vec(m * vocab, 1.0), rng.bf16_vec(vocab * h, 1.0));
    let mut t = [T::bf16(&x, m), T::bf16(&dlogits, m), T::bf16(&old, vocab)];
    run(Op::ClassifierBackwardWeight, &context(h, 1, m, vocab), &mut t);
    let want: Vec<f64> = (0..vocab * h)
        .map(|e| {
            f64::from(old[e]) + (0..m).map(|r| f64::from(dlogits[r * vocab + e / h] * x[r * h + e % h])).sum::<f64>()
        })
        .collect();
    assert_close("dE += dlogits^T x", &t[2].values(), &want, REL, ABS);

    // Token 2 appears three times: its rows are summed onto the stored gradient.
    let ids = [2u32, 5, 2, 0, 2];
    let dout = rng.bf16_vec(ids.len() * h, 1.0);
    let mut t = [T::ids(&ids), T::bf16(&dout, ids.len()), T::bf16(&old, vocab)];
    run(Op::EmbeddingBackward, &context(h, 1, ids.len(), vocab), &mut t);
    let mut want = f64s(&old);
    for (r, &id) in ids.iter().enumerate() {
        for c in 0..h {
            want[id as usize * h + c] += f64::from(dout[r * h + c]);
        }
    }
    assert_close("dE[tokens] += dout", &t[2].values(), &want, REL, ABS);
}

#[test]
fn grad_norm_squared_accumulates_the_sum_of_squares() {
    let mut rng = Rng::new(15);
    let grad = rng.bf16_vec(7 * 19, 1.0);
    let mut t = [T::bf16(&grad, 7), T::f32s(&[2.0], 1)];
    run(Op::GradNormSquared, &context(19, 1, 7, 1), &mut t);
    let g = f64s(&grad);
    assert_close("sum of squares", &t[1].f32_values(), &[2.0 + dot(&g, &g)], 1e-6, 0.0);
}

/// One AdamW step in f64, as written in PyTorch's documentation (with the clip applied first).
fn adamw_by_hand(w: f64, m: f64, v: f64, g: f64, clip: f64, hp: &super::AdamW) -> (f64, f64, f64) {
    let (lr, b1, b2) = (f64::from(hp.lr), f64::from(hp.beta1), f64::from(hp.beta2));
    let t = hp.step as f64;
    let g = g * clip;
    let w = w * (1.0 - lr * f64::from(hp.weight_decay));
    let m = b1 * m + (1.0 - b1) * g;
    let v = b2 * v + (1.0 - b2) * g * g;
    let m_hat = m / (1.0 - b1.powf(t));
    let v_hat = v / (1.0 - b2.powf(t));
    (w - lr * m_hat / (v_hat.sqrt() + f64::from(hp.eps)), m, v)
}

fn check_adamw(seed: u64, norm_squared: f32, step: u64) {
    let mut rng = Rng::new(seed);
    let (rows, e) = (3, 5);
    let grad = rng.bf16_vec(rows * e, 1.0);
    let mut state = Vec::new();
    for _ in 0..rows {
        state.extend(rng.bf16_vec(e, 1.0)); // master
        state.extend(rng.bf16_vec(e, 0.1)); // m
        state.extend(rng.bf16_vec(e, 0.1).iter().map(|v| v.abs())); // v >= 0
    }
    let mut ctx = context(e, 1, rows, 1);
    ctx.adamw.step = step;
    let mut t = [T::zeros(rows, e * 2), T::bf16(&grad, rows), T::f32s(&state, rows), T::f32s(&[norm_squared], 1)];
    run(Op::AdamW, &ctx, &mut t);
    let norm = f64::from(norm_squared).sqrt();
    let clip = if norm > f64::from(ctx.adamw.max_grad_norm) { f64::from(ctx.adamw.max_grad_norm) / norm } else { 1.0 };
    let new_state = t[2].f32_values();
    let mut want = Vec::new();
    for r in 0..rows {
        let at = |part: usize, c: usize| f64::from(state[r * 3 * e + part * e + c]);
        let updated: Vec<_> = (0..e)
            .map(|c| adamw_by_hand(at(0, c), at(1, c), at(2, c), f64::from(grad[r * e + c]), clip, &ctx.adamw))
            .collect();
        want.extend(updated.iter().map(|u| u.0));
        want.extend(updated.iter().map(|u| u.1));
        want.extend(updated.iter().map(|u| u.2));
    }
    assert_close(&format!("adamw state (norm^2 {norm_squared}, step {step})"), &new_state, &want, 1e-5, 1e-7);
    for r in 0..rows {
        for c in 0..e {
            let master = new_state[r * 3 * e + c];
            assert_eq!(t[0].values()[r * e + c], half::bf16::from_f32(master).to_f32(), "parameter = rounded master");
        }
    }
}

#[test]
fn adamw_matches_a_hand_written_step() {
    check_adamw(16, 0.25, 1); // norm 0.5 < 1: no clipping
    check_adamw(17, 16.0, 3); // norm 4 > 1: gradients scaled by 1/4
    check_adamw(18, 0.0, 10);
}

#[test]
fn adamw_refuses_a_non_finite_gradient_norm() {
    for bad in [f32::NAN, f32::INFINITY] {
        let mut t = [T::zeros(1, 2), T::zeros(1, 2), T::zeros(1, 12), T::f32s(&[bad], 1)];
        let error = run_threads(Op::AdamW, &context(1, 1, 1, 1), &mut t, 1).unwrap_err();
        assert!(error.to_string().contains("grad_norm_squared"), "{error}");
    }
}

#[test]
fn layer_norm_adds_the_context_epsilon() {
    let mut rng = Rng::new(11);
    let (m, h) = (4, 24);
    let (x, scale, shift) = (rng.bf16_vec(m * h, 0.5), rng.bf16_vec(h, 1.5), rng.bf16_vec(h, 0.5));
    let mut ctx = context(h, 1, m, 1);
    ctx.norm_eps = 0.25;
    let mut t = [T::bf16(&x, m), T::bf16(&scale, 1), T::bf16(&shift, 1), T::zeros(m, h * 2)];
    run(Op::LayerNorm, &ctx, &mut t);
    let want = reference::layer_norm_eps(&f64s(&x), &f64s(&scale), &f64s(&shift), 0.25);
    assert_close("layer_norm y, eps 0.25", &t[3].values(), &want, REL, ABS);
}

#[test]
fn rms_norm_matches_the_reference() {
    let mut rng = Rng::new(12);
    for (m, h, eps) in [(5, 40, 1e-5), (3, 7, 1e-6), (4, 24, 0.25)] {
        let (x, scale) = (rng.bf16_vec(m * h, 2.0), rng.bf16_vec(h, 1.5));
        let mut ctx = context(h, 1, m, 1);
        ctx.norm_eps = eps;
        let mut t = [T::bf16(&x, m), T::bf16(&scale, 1), T::zeros(m, h * 2)];
        run(Op::RmsNorm, &ctx, &mut t);
        let want = reference::rms_norm(&f64s(&x), &f64s(&scale), eps);
        assert_close(&format!("rms_norm {m}x{h} eps {eps}: y"), &t[2].values(), &want, REL, ABS);
    }
}

#[test]
fn swiglu_matches_the_reference() {
    let mut rng = Rng::new(13);
    let (m, w) = (6, 13);
    // Gates from -8 to 8: both tails of the sigmoid.
    let x = rng.bf16_vec(m * 2 * w, 8.0);
    let mut t = [T::bf16(&x, m), T::zeros(m, w * 2)];
    run(Op::Swiglu, &context(w, 1, m, 1), &mut t);
    assert_close("swiglu y", &t[1].values(), &reference::swiglu(&f64s(&x), w), REL, ABS);
}

/// A grouped-query attention case: `heads` query heads on this launch, `kv_heads` K/V heads in
/// `k` and `v`, K/V replicated over `(rank, ranks)` when given.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gqa {
    pub sequences: usize,
    pub s: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
    pub replicated: Option<(usize, usize)>,
    pub theta: f64,
}

impl Gqa {
    pub(super) fn context(&self) -> super::OpContext {
        let mut ctx = context(self.heads * self.d, self.heads, self.s, 1);
        ctx.kv_heads = self.kv_heads;
        ctx.kv_replicated = self.replicated.is_some();
        ctx.rope_theta = self.theta;
        ctx
    }

    pub(super) fn group(&self) -> Group {
        self.replicated.map_or(Group::SINGLE, |(rank, ranks)| Group { rank, ranks })
    }

    /// `k` or `v` (rows of `kv_heads * d`) as one head per query head.
    pub(super) fn expand(&self, x: &[f64]) -> Vec<f64> {
        let kv_of = reference::kv_of(self.heads, self.kv_heads, self.replicated);
        reference::expand_kv(x, self.kv_heads, self.heads, self.d, kv_of)
    }
}

/// Runs the forward of case `c` (threads, key block) on `q, k, v`: `[q, k, v, out, lse]`.
pub(super) fn gqa_forward(c: &Gqa, q: &[f32], k: &[f32], v: &[f32], threads: usize, key_block: usize) -> [T; 5] {
    let rows = c.sequences * c.s;
    let mut t = [
        T::bf16(q, rows),
        T::bf16(k, rows),
        T::bf16(v, rows),
        T::zeros(rows, c.heads * c.d * 2),
        T::zeros(rows, c.heads * 4),
    ];
    if let Err(error) =
        forward_on_rank(&mut args_of(Op::Attention, &mut t), &c.context(), c.group(), threads, key_block)
    {
        panic!("{error}");
    }
    t
}

fn check_gqa(seed: u64, c: Gqa, key_block: usize) {
    let mut rng = Rng::new(seed);
    let rows = c.sequences * c.s;
    let (width, kv_width) = (c.heads * c.d, c.kv_heads * c.d);
    let (q, k, v) =
        (rng.bf16_vec(rows * width, 2.0), rng.bf16_vec(rows * kv_width, 2.0), rng.bf16_vec(rows * kv_width, 1.0));
    let t = gqa_forward(&c, &q, &k, &v, 2, key_block);
    let (out, lse) =
        reference::attention_theta(&f64s(&q), &c.expand(&f64s(&k)), &c.expand(&f64s(&v)), c.s, c.heads, c.d, c.theta);
    let what = format!("{c:?} key block {key_block}");
    assert_close(&format!("{what}: out"), &t[3].values(), &out, REL, ABS);
    assert_close(&format!("{what}: lse"), &t[4].f32_values(), &lse, 1e-5, 1e-6);

    // Each query head computes exactly what multi-head attention computes with its K/V head
    // copied in: the same bits.
    let expand32 = |x: &[f32]| -> Vec<f32> { c.expand(&f64s(x)).iter().map(|&v| v as f32).collect() };
    let mha = Gqa { kv_heads: c.heads, replicated: None, ..c };
    let full = gqa_forward(&mha, &q, &expand32(&k), &expand32(&v), 1, key_block);
    assert_eq!(t[3].data, full[3].data, "{what}: out differs from multi-head attention on copied K/V");
    assert_eq!(t[4].data, full[4].data, "{what}: lse differs from multi-head attention on copied K/V");
}

#[test]
fn grouped_query_attention_matches_the_reference_with_k_and_v_expanded() {
    let base = Gqa { sequences: 2, s: 7, heads: 4, kv_heads: 2, d: 8, replicated: None, theta: 10_000.0 };
    check_gqa(14, base, KEY_BLOCK);
    check_gqa(15, Gqa { kv_heads: 1, ..base }, 3);
    check_gqa(16, Gqa { kv_heads: 4, ..base }, KEY_BLOCK);
    // Replicated K/V: rank 1 of 2 has query heads 3..6 of 6; three K/V heads of group 2, so
    // the launch's heads use K/V heads 1, 2, 2 (and none uses head 0).
    check_gqa(17, Gqa { heads: 3, kv_heads: 3, d: 4, replicated: Some((1, 2)), ..base }, 2);
    // Rank 2 of 4 with 4 query heads each and 2 K/V heads (group 8): K/V head 1 only.
    check_gqa(18, Gqa { replicated: Some((2, 4)), ..base }, KEY_BLOCK);
}

#[test]
fn attention_rotates_with_the_context_rope_theta() {
    let c = Gqa { sequences: 1, s: 40, heads: 2, kv_heads: 1, d: 8, replicated: None, theta: 500_000.0 };
    check_gqa(19, c, KEY_BLOCK);
}
