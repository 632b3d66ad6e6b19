//! Every backward against central finite differences of the f64 reference forward.
//!
//! For a forward `y = f(inputs)` and a random cotangent `dy`, the scalar `L = sum(y * dy)` has
//! gradient `dL/dx`, which is what a backward op returns given `dy`. The finite differences are
//! taken in f64 on the f64 reference (`reference`), on the same bf16-representable inputs the op
//! gets, so they are accurate to about 1e-8: all the disagreement is the op's bf16 storage.
//!
//! Tolerance: `2^-8` relative plus a share of the largest gradient entry. A backward's errors are
//! absolute, not relative to each entry: an entry that is a small difference of large terms
//! (layer norm's projection, attention's `p (dp - D)`) carries the rounding of those terms. The
//! share is `2^-10` where the backward reads only bf16 inputs and rounds once (linear, GeLU,
//! cross-entropy, the embedding) and `2^-7` where it also reads a bf16-rounded forward result
//! (attention reads `out`, rounded to 8 bits, to form `D = dout . out`) or subtracts
//! row means (layer norm). Each test prints the largest error it saw.

use memo_plan_core::plan::Op;

use super::super::attention::{backward_blocked, backward_on_rank, forward_blocked, KEY_BLOCK};
use super::forward::{gqa_forward, Gqa};
use super::reference::{self, dot, numerical_gradient};
use super::{args_of, assert_close, context, f64s, run, Rng, T};

const REL: f64 = 1.0 / 256.0;
const TIGHT: f64 = 1.0 / 1024.0;
const LOOSE: f64 = 1.0 / 128.0;

#[test]
fn linear_backward_matches_finite_differences() {
    let mut rng = Rng::new(21);
    let (m, k, n) = (6, 9, 5);
    let (x, w, b, dy) =
        (rng.bf16_vec(m * k, 1.0), rng.bf16_vec(n * k, 1.0), rng.bf16_vec(n, 1.0), rng.bf16_vec(m * n, 1.0));
    let (x64, w64, b64, dy64) = (f64s(&x), f64s(&w), f64s(&b), f64s(&dy));
    let ctx = context(k, 1, m, 1);

    let mut t = [T::bf16(&dy, m), T::bf16(&w, n), T::zeros(m, k * 2)];
    run(Op::LinearBackwardInput, &ctx, &mut t);
    let want = numerical_gradient(&x64, |x| dot(&reference::linear(x, &w64, &b64, k), &dy64));
    assert_close("linear dx", &t[2].values(), &want, REL, TIGHT);

    let mut t = [T::bf16(&x, m), T::bf16(&dy, m), T::zeros(n, k * 2), T::zeros(1, n * 2)];
    run(Op::LinearBackwardWeight, &ctx, &mut t);
    let want = numerical_gradient(&w64, |w| dot(&reference::linear(&x64, w, &b64, k), &dy64));
    assert_close("linear dW", &t[2].values(), &want, REL, TIGHT);
    let want = numerical_gradient(&b64, |b| dot(&reference::linear(&x64, &w64, b, k), &dy64));
    assert_close("linear dbias", &t[3].values(), &want, REL, TIGHT);
}

#[test]
fn layer_norm_backward_matches_finite_differences() {
    let mut rng = Rng::new(22);
    let (m, h) = (4, 12);
    let (x, scale, shift, dy) =
        (rng.bf16_vec(m * h, 2.0), rng.bf16_vec(h, 1.5), rng.bf16_vec(h, 1.0), rng.bf16_vec(m * h, 1.0));
    let (x64, s64, sh64, dy64) = (f64s(&x), f64s(&scale), f64s(&shift), f64s(&dy));
    let mut t = [
        T::bf16(&x, m),
        T::bf16(&scale, 1),
        T::bf16(&dy, m),
        T::zeros(m, h * 2),
        T::zeros(1, h * 2),
        T::zeros(1, h * 2),
    ];
    run(Op::LayerNormBackward, &context(h, 1, m, 1), &mut t);
    let want = numerical_gradient(&x64, |x| dot(&reference::layer_norm(x, &s64, &sh64), &dy64));
    assert_close("layer_norm dx", &t[3].values(), &want, REL, LOOSE);
    let want = numerical_gradient(&s64, |s| dot(&reference::layer_norm(&x64, s, &sh64), &dy64));
    assert_close("layer_norm dscale", &t[4].values(), &want, REL, TIGHT);
    let want = numerical_gradient(&sh64, |sh| dot(&reference::layer_norm(&x64, &s64, sh), &dy64));
    assert_close("layer_norm dshift", &t[5].values(), &want, REL, TIGHT);
}

#[test]
fn gelu_backward_matches_finite_differences() {
    let mut rng = Rng::new(23);
    let (x, dy) = (rng.bf16_vec(40, 4.0), rng.bf16_vec(40, 1.0));
    let dy64 = f64s(&dy);
    let mut t = [T::bf16(&x, 4), T::bf16(&dy, 4), T::zeros(4, 20)];
    run(Op::GeluBackward, &context(10, 1, 4, 1), &mut t);
    let want = numerical_gradient(&f64s(&x), |x| dot(&reference::gelu(x), &dy64));
    assert_close("gelu dx", &t[2].values(), &want, REL, TIGHT);
}

fn check_attention_backward(seed: u64, sequences: usize, s: usize, heads: usize, d: usize, key_block: usize) {
    let mut rng = Rng::new(seed);
    let (rows, width) = (sequences * s, heads * d);
    let (q, k, v, dout) = (
        rng.bf16_vec(rows * width, 2.0),
        rng.bf16_vec(rows * width, 2.0),
        rng.bf16_vec(rows * width, 1.0),
        rng.bf16_vec(rows * width, 1.0),
    );
    let ctx = context(width, heads, s, 1);
    let mut fwd =
        [T::bf16(&q, rows), T::bf16(&k, rows), T::bf16(&v, rows), T::zeros(rows, width * 2), T::zeros(rows, heads * 4)];
    forward_blocked(&mut args_of(Op::Attention, &mut fwd), &ctx, 1, key_block).unwrap();
    let [q_t, k_t, v_t, out, lse] = fwd;
    let zeros = T::zeros(rows, width * 2);
    let mut t = [q_t, k_t, v_t, out, lse, T::bf16(&dout, rows), zeros.clone(), zeros.clone(), zeros];
    backward_blocked(&mut args_of(Op::AttentionBackward, &mut t), &ctx, 1, key_block).unwrap();
    let (q64, k64, v64, dout64) = (f64s(&q), f64s(&k), f64s(&v), f64s(&dout));
    let loss = |q: &[f64], k: &[f64], v: &[f64]| dot(&reference::attention(q, k, v, s, heads, d).0, &dout64);
    let what = format!("attention {sequences}x{s} heads {heads} dim {d} key block {key_block}");
    let want = numerical_gradient(&q64, |q| loss(q, &k64, &v64));
    assert_close(&format!("{what}: dq"), &t[6].values(), &want, REL, LOOSE);
    let want = numerical_gradient(&k64, |k| loss(&q64, k, &v64));
    assert_close(&format!("{what}: dk"), &t[7].values(), &want, REL, LOOSE);
    let want = numerical_gradient(&v64, |v| loss(&q64, &k64, v));
    assert_close(&format!("{what}: dv"), &t[8].values(), &want, REL, LOOSE);
}

#[test]
fn attention_backward_matches_finite_differences() {
    check_attention_backward(24, 2, 7, 2, 8, KEY_BLOCK);
    check_attention_backward(25, 2, 7, 2, 4, 3);
    check_attention_backward(26, 1, 5, 1, 2, 1);
}

#[test]
fn cross_entropy_gradient_matches_finite_differences() {
    let mut rng = Rng::new(27);
    let (m, vocab, tokens) = (4, 7, 10);
    let logits = rng.bf16_vec(m * vocab, 3.0);
    let targets = [6u32, 0, 3, 3];
    let mut ctx = context(4, 1, m, vocab);
    ctx.loss_scale_tokens = tokens;
    let mut t = [T::bf16(&logits, m), T::ids(&targets), T::f32s(&[0.0], 1)];
    run(Op::CrossEntropy, &ctx, &mut t);
    let want = numerical_gradient(&f64s(&logits), |l| {
        reference::cross_entropy(l, &targets, vocab).iter().sum::<f64>() / tokens as f64
    });
    assert_close("cross_entropy dlogits", &t[0].values(), &want, REL, TIGHT);
}

#[test]
fn classifier_backward_matches_finite_differences() {
    let mut rng = Rng::new(28);
    let (m, h, vocab) = (5, 6, 9);
    let (x, e, dlogits) = (rng.bf16_vec(m * h, 1.0), rng.bf16_vec(vocab * h, 1.0), rng.bf16_vec(m * vocab, 1.0));
    let (x64, e64, dl64) = (f64s(&x), f64s(&e), f64s(&dlogits));
    let zero_bias = vec![0.0; vocab];
    let ctx = context(h, 1, m, vocab);
    let mut t = [T::bf16(&dlogits, m), T::bf16(&e, vocab), T::zeros(m, h * 2)];
    run(Op::LinearBackwardInput, &ctx, &mut t);
    let want = numerical_gradient(&x64, |x| dot(&reference::linear(x, &e64, &zero_bias, h), &dl64));
    assert_close("classifier dx", &t[2].values(), &want, REL, TIGHT);
    let mut t = [T::bf16(&x, m), T::bf16(&dlogits, m), T::zeros(vocab, h * 2)];
    run(Op::ClassifierBackwardWeight, &ctx, &mut t);
    let want = numerical_gradient(&e64, |e| dot(&reference::linear(&x64, e, &zero_bias, h), &dl64));
    assert_close("classifier dE", &t[2].values(), &want, REL, TIGHT);
}

#[test]
fn embedding_backward_matches_finite_differences() {
    let mut rng = Rng::new(29);
    let (h, vocab) = (4, 6);
    let ids = [1u32, 4, 1, 1, 0, 5, 4];
    let (e, dout) = (rng.bf16_vec(vocab * h, 1.0), rng.bf16_vec(ids.len() * h, 1.0));
    let dout64 = f64s(&dout);
    let mut t = [T::ids(&ids), T::bf16(&dout, ids.len()), T::zeros(vocab, h * 2)];
    run(Op::EmbeddingBackward, &context(h, 1, ids.len(), vocab), &mut t);
    let lookup = |e: &[f64]| -> Vec<f64> {
        ids.iter().flat_map(|&id| e[id as usize * h..(id as usize + 1) * h].to_vec()).collect()
    };
    let want = numerical_gradient(&f64s(&e), |e| dot(&lookup(e), &dout64));
    assert_close("embedding dE", &t[2].values(), &want, REL, TIGHT);
}

#[test]
fn rms_norm_backward_matches_finite_differences() {
    let mut rng = Rng::new(51);
    let (m, h) = (4, 12);
    let (x, scale, dy) = (rng.bf16_vec(m * h, 2.0), rng.bf16_vec(h, 1.5), rng.bf16_vec(m * h, 1.0));
    let (x64, s64, dy64) = (f64s(&x), f64s(&scale), f64s(&dy));
    for eps in [1e-5, 0.5] {
        let mut ctx = context(h, 1, m, 1);
        ctx.norm_eps = eps;
        // Garbage in the outputs: both are overwritten.
        let mut t = [T::bf16(&x, m), T::bf16(&scale, 1), T::bf16(&dy, m), T::bf16(&dy, m), T::bf16(&scale, 1)];
        run(Op::RmsNormBackward, &ctx, &mut t);
        let want = numerical_gradient(&x64, |x| dot(&reference::rms_norm(x, &s64, eps), &dy64));
        assert_close(&format!("rms_norm dx, eps {eps}"), &t[3].values(), &want, REL, LOOSE);
        let want = numerical_gradient(&s64, |s| dot(&reference::rms_norm(&x64, s, eps), &dy64));
        assert_close(&format!("rms_norm dscale, eps {eps}"), &t[4].values(), &want, REL, TIGHT);
    }
}

#[test]
fn swiglu_backward_matches_finite_differences() {
    let mut rng = Rng::new(52);
    let (m, w) = (4, 9);
    let (x, dy) = (rng.bf16_vec(m * 2 * w, 6.0), rng.bf16_vec(m * w, 1.0));
    let dy64 = f64s(&dy);
    let mut t = [T::bf16(&x, m), T::bf16(&dy, m), T::zeros(m, 4 * w)];
    run(Op::SwigluBackward, &context(w, 1, m, 1), &mut t);
    let want = numerical_gradient(&f64s(&x), |x| dot(&reference::swiglu(x, w), &dy64));
    assert_close("swiglu dx", &t[2].values(), &want, REL, TIGHT);
}

#[test]
fn linear_backward_weight_no_bias_is_the_weight_gradient_without_the_bias() {
    let mut rng = Rng::new(53);
    let (m, k, n) = (70, 9, 5);
    let (x, w, dy) = (rng.bf16_vec(m * k, 1.0), rng.bf16_vec(n * k, 1.0), rng.bf16_vec(m * n, 1.0));
    let (x64, dy64, zero_bias) = (f64s(&x), f64s(&dy), vec![0.0; n]);
    let ctx = context(k, 1, m, 1);
    let mut t = [T::bf16(&x, m), T::bf16(&dy, m), T::bf16(&w, n)];
    run(Op::LinearBackwardWeightNoBias, &ctx, &mut t);
    let want = numerical_gradient(&f64s(&w), |w| dot(&reference::linear(&x64, w, &zero_bias, k), &dy64));
    assert_close("linear_no_bias dW", &t[2].values(), &want, REL, TIGHT);
    let mut with_bias = [T::bf16(&x, m), T::bf16(&dy, m), T::zeros(n, k * 2), T::zeros(1, n * 2)];
    run(Op::LinearBackwardWeight, &ctx, &mut with_bias);
    assert_eq!(t[2].data, with_bias[2].data, "dW differs from linear_backward_weight's");
}

/// Grouped-query attention's backward against finite differences of the f64 reference with K
/// and V expanded per query head; K/V heads no query head uses must come back exactly zero.
fn check_gqa_backward(seed: u64, c: Gqa, key_block: usize) {
    let mut rng = Rng::new(seed);
    let rows = c.sequences * c.s;
    let (width, kv_width) = (c.heads * c.d, c.kv_heads * c.d);
    let (q, k, v, dout) = (
        rng.bf16_vec(rows * width, 2.0),
        rng.bf16_vec(rows * kv_width, 2.0),
        rng.bf16_vec(rows * kv_width, 1.0),
        rng.bf16_vec(rows * width, 1.0),
    );
    let [q_t, k_t, v_t, out, lse] = gqa_forward(&c, &q, &k, &v, 1, key_block);
    // Garbage in the outputs: all three are overwritten.
    let (garbage, kv_garbage) = (T::bf16(&dout, rows), T::bf16(&k, rows));
    let mut t = [q_t, k_t, v_t, out, lse, T::bf16(&dout, rows), garbage, kv_garbage.clone(), kv_garbage];
    backward_on_rank(&mut args_of(Op::AttentionBackward, &mut t), &c.context(), c.group(), 1, key_block).unwrap();
    let (q64, k64, v64, dout64) = (f64s(&q), f64s(&k), f64s(&v), f64s(&dout));
    let loss = |q: &[f64], k: &[f64], v: &[f64]| {
        dot(&reference::attention_theta(q, &c.expand(k), &c.expand(v), c.s, c.heads, c.d, c.theta).0, &dout64)
    };
    let what = format!("{c:?} key block {key_block}");
    let want = numerical_gradient(&q64, |q| loss(q, &k64, &v64));
    assert_close(&format!("{what}: dq"), &t[6].values(), &want, REL, LOOSE);
    let want = numerical_gradient(&k64, |k| loss(&q64, k, &v64));
    assert_close(&format!("{what}: dk"), &t[7].values(), &want, REL, LOOSE);
    let want = numerical_gradient(&v64, |v| loss(&q64, &k64, v));
    assert_close(&format!("{what}: dv"), &t[8].values(), &want, REL, LOOSE);
    let kv_of = reference::kv_of(c.heads, c.kv_heads, c.replicated);
    for kv in (0..c.kv_heads).filter(|&kv| (0..c.heads).all(|i| kv_of(i) != kv)) {
        for (name, grad) in [("dk", &t[7]), ("dv", &t[8])] {
            for row in grad.data.chunks_exact(kv_width * 2) {
                assert!(row[kv * c.d * 2..(kv + 1) * c.d * 2].iter().all(|&b| b == 0), "{what}: {name} head {kv}");
            }
        }
    }
}

#[test]
fn grouped_query_attention_backward_matches_finite_differences() {
    let base = Gqa { sequences: 2, s: 6, heads: 4, kv_heads: 2, d: 4, replicated: None, theta: 10_000.0 };
    check_gqa_backward(54, base, KEY_BLOCK);
    check_gqa_backward(55, Gqa { kv_heads: 1, ..base }, 4);
    // Rank 1 of 2, K/V replicated: K/V heads 1, 2, 2 used, head 0 zero.
    check_gqa_backward(56, Gqa { heads: 3, kv_heads: 3, replicated: Some((1, 2)), ..base }, 2);
    // Rank 1 of 2, 4 heads each, 2 K/V heads (group 4), rotary base 500000: head 1 only.
    check_gqa_backward(57, Gqa { replicated: Some((1, 2)), theta: 500_000.0, ..base }, KEY_BLOCK);
}
