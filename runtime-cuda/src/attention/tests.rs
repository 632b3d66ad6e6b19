//! The graphs' mathematics without a GPU: the recorded forward and backward graphs, run by the
//! f64 interpreter on the plan's strided layout, against attention from its definition (f64) and
//! against the CPU backend's attention op (through the RoPE rotation the cuDNN path adds); the
//! recordings against golden files (regenerate with
//! `MEMO_BLESS=1 cargo test -p runtime-cuda --lib attention::tests::golden` and review the diff).

use std::path::PathBuf;

use super::graph::{backward_composite, forward_composite, forward_fused, uid, BackwardForm, Shape, StatsLayout, Uid};
use super::interpret::{run, Bindings};
use super::record::{Event, Recorder};
use super::{key_value_view, scratch, AttentionChoice, KeyValueView};
use memo_plan_core::plan::shapes::{self, AttentionShape, ShapeContext};
use memo_plan_core::plan::Op;

/// (sequences, heads, tokens per sequence, head dim): one length not a multiple of 128, head
/// dims 64 and 128, several heads, two sequences.
const CASES: [(i64, i64, i64, i64); 3] = [(1, 2, 200, 64), (2, 2, 128, 128), (2, 3, 77, 64)];

/// The interpreter's f64 against the f64 reference: only summation order differs.
const F64_TOLERANCE: f64 = 1e-10;

/// Deterministic values in [-1, 1) that bf16 represents exactly (8 significant bits), so the CPU
/// backend reads the same inputs.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) % 256) as f64 / 128.0 - 1.0
        })
        .collect()
}

/// Grouped-query cases as (sequences, heads of the launch, K/V heads in k, tokens per
/// sequence, head dim, rank, ranks, K/V replicated): 4 query heads on 2 and on 1 K/V head, and
/// K/V replicated at `t = 4` (2 K/V heads, 2 query heads a rank: ranks 1 and 2 use K/V heads 0
/// and 1, each one head of a row of two) and at `t = 2` with one K/V head.
type GroupedCase = (u64, u64, u64, u64, u64, u64, u64, bool);
const GROUPED: [GroupedCase; 5] = [
    (2, 4, 2, 33, 16, 0, 1, false),
    (1, 4, 1, 40, 32, 0, 1, false),
    (2, 2, 2, 21, 16, 1, 4, true),
    (1, 2, 2, 30, 16, 2, 4, true),
    (1, 2, 1, 17, 16, 1, 2, true),
];

/// The op table's geometry of an attention backward launch of `case` (its shape rule, so
/// `group` and `first_query` are the ones the backends get).
fn geometry(&(b, h, kv, s, d, rank, ranks, replicated): &GroupedCase) -> AttentionShape {
    let rows = b * s;
    let arg = |row_bytes: u64| shapes::ArgShape { first_row: 0, rows, row_bytes };
    let (q, k, lse) = (arg(h * d * 2), arg(kv * d * 2), arg(h * 4));
    let args = [q, k, k, q, lse, q, q, k, k];
    let context = ShapeContext {
        hidden: h * d,
        heads: h,
        kv_heads: kv,
        kv_replicated: replicated,
        seq_len: s,
        vocab: 1,
        rank,
        ranks,
        ..ShapeContext::default()
    };
    let checked = shapes::check(Op::AttentionBackward, &args, &context).unwrap();
    checked.attention_geometry().unwrap()
}

/// The multi-head geometry of `shape`.
fn multi_head(shape: &Shape) -> AttentionShape {
    let u = |v: i64| v as u64;
    AttentionShape {
        heads: u(shape.heads),
        kv_heads: u(shape.heads),
        group: 1,
        first_query: 0,
        head_dim: u(shape.head_dim),
        seq_len: u(shape.seq),
        sequences: u(shape.batch),
    }
}

/// Inputs in the plan's layout: q, dO as `[b*s, h*d]`, k, v as `[b*s, kv_row]`.
struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    d_o: Vec<f64>,
}

fn inputs(shape: &Shape, seed: u64) -> Inputs {
    let n = (shape.batch * shape.seq * shape.row) as usize;
    let n_kv = (shape.batch * shape.seq * shape.kv_row) as usize;
    Inputs { q: values(n, seed), k: values(n_kv, seed + 1), v: values(n_kv, seed + 2), d_o: values(n, seed + 3) }
}

/// Attention's results in the plan's layout (lse `[b*s, h]`).
#[derive(Clone, Debug)]
struct Results {
    o: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

/// Causal attention and its gradients from the definition, in f64: `S = scale q k^T` over keys
/// `j <= i`, `lse_i = ln sum_j exp(S_ij)`, `P = exp(S - lse)`, `O = P v`; `dV = P^T dO`,
/// `dP = dO v^T`, `dS = P (dP - rowsum(P dP))`, `dQ = scale dS k`, `dK = scale dS^T q`. Grouped:
/// K and V expanded per query head, query head `i` reading K/V head `g.kv_head(i)` of rows of
/// `g.kv_heads` heads, and dK, dV of a K/V head the sums over the query heads that read it (0
/// for a head no query head reads).
#[allow(clippy::needless_range_loop)] // the definition's indices, as written
fn reference(g: &AttentionShape, x: &Inputs) -> Results {
    let (b, h, s, d) = (g.sequences as usize, g.heads as usize, g.seq_len as usize, g.head_dim as usize);
    let (r, r_kv) = (h * d, g.kv_heads as usize * d);
    let scale = 1.0 / (d as f64).sqrt();
    let at = |seq: usize, pos: usize, head: usize, c: usize| (seq * s + pos) * r + head * d + c;
    let at_kv = |seq: usize, pos: usize, head: usize, c: usize| (seq * s + pos) * r_kv + head * d + c;
    let (n, n_kv) = (b * s * r, b * s * r_kv);
    let mut out = Results {
        o: vec![0.0; n],
        lse: vec![0.0; b * s * h],
        dq: vec![0.0; n],
        dk: vec![0.0; n_kv],
        dv: vec![0.0; n_kv],
    };
    for seq in 0..b {
        for head in 0..h {
            let kv = g.kv_head(head as u64) as usize;
            let dot = |a: &[f64], i: usize, bb: &[f64], j: usize| -> f64 {
                (0..d).map(|c| a[at(seq, i, head, c)] * bb[at_kv(seq, j, kv, c)]).sum()
            };
            let mut p = vec![vec![0.0; s]; s];
            for i in 0..s {
                let scores: Vec<f64> = (0..=i).map(|j| scale * dot(&x.q, i, &x.k, j)).collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + scores.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                out.lse[(seq * s + i) * h + head] = lse;
                for j in 0..=i {
                    p[i][j] = (scores[j] - lse).exp();
                    for c in 0..d {
                        out.o[at(seq, i, head, c)] += p[i][j] * x.v[at_kv(seq, j, kv, c)];
                    }
                }
            }
            for i in 0..s {
                let dp: Vec<f64> = (0..=i).map(|j| dot(&x.d_o, i, &x.v, j)).collect();
                let delta: f64 = (0..=i).map(|j| p[i][j] * dp[j]).sum();
                for j in 0..=i {
                    let ds = p[i][j] * (dp[j] - delta);
                    for c in 0..d {
                        out.dv[at_kv(seq, j, kv, c)] += p[i][j] * x.d_o[at(seq, i, head, c)];
                        out.dq[at(seq, i, head, c)] += scale * ds * x.k[at_kv(seq, j, kv, c)];
                        out.dk[at_kv(seq, j, kv, c)] += scale * ds * x.q[at(seq, i, head, c)];
                    }
                }
            }
        }
    }
    out
}

/// The statistics of `lse` (token-major) in `layout`.
fn stats_memory(shape: &Shape, lse: &[f64]) -> Vec<f64> {
    let (b, h, s) = (shape.batch as usize, shape.heads as usize, shape.seq as usize);
    match shape.stats {
        StatsLayout::TokenMajor => lse.to_vec(),
        StatsLayout::HeadMajor => {
            let mut out = vec![0.0; lse.len()];
            for seq in 0..b {
                for pos in 0..s {
                    for head in 0..h {
                        out[(seq * h + head) * s + pos] = lse[(seq * s + pos) * h + head];
                    }
                }
            }
            out
        }
    }
}

/// Runs the forward graph `fused` or composite, then the backward graph in `form`, through the
/// interpreter; returns what they wrote, lse in the token-major layout.
fn interpret(shape: &Shape, x: &Inputs, fused: bool, form: BackwardForm, o_and_lse: Option<&Results>) -> Results {
    let view = KeyValueView { shape: *shape, offset: 0, zero_gradients: false };
    interpret_view(&view, x, fused, form, o_and_lse)
}

/// [`interpret`] as the backend launches the graphs of `view`: k, v, dk and dv bound from
/// `view.offset` elements into their buffers (the pointers' offset), dk and dv NaN before the
/// backward unless `view.zero_gradients` zeroes them (the memset), so columns the graph leaves
/// unwritten show.
fn interpret_view(
    view: &KeyValueView,
    x: &Inputs,
    fused: bool,
    form: BackwardForm,
    o_and_lse: Option<&Results>,
) -> Results {
    let shape = &view.shape;
    let offset = view.offset as usize;
    let n = x.q.len();
    let rows = (shape.batch * shape.heads * shape.seq) as usize;
    let scale = 1.0 / (shape.head_dim as f64).sqrt();
    let mut forward = Recorder::default();
    let graph = if fused { forward_fused(&mut forward, shape) } else { forward_composite(&mut forward, shape) };
    let Ok(graph) = graph;
    let mut bound = Bindings::new();
    bound.insert(uid::Q, x.q.clone());
    bound.insert(uid::K, x.k[offset..].to_vec());
    bound.insert(uid::V, x.v[offset..].to_vec());
    bound.insert(uid::O, vec![f64::NAN; n]);
    bound.insert(uid::STATS, vec![f64::NAN; rows]);
    bound.insert(uid::SCALE, vec![scale]);
    bound.insert(uid::NEG_INF, vec![f64::NEG_INFINITY]);
    run(&forward, graph, &mut bound).unwrap_or_else(|e| panic!("forward: {e}"));
    let mut o = bound[&uid::O].clone();
    let mut stats = bound[&uid::STATS].clone();
    if let Some(given) = o_and_lse {
        // The backward from the reference's forward, so its error is its own.
        o = given.o.clone();
        stats = stats_memory(shape, &given.lse);
    }
    let lse = match shape.stats {
        StatsLayout::TokenMajor => stats.clone(),
        StatsLayout::HeadMajor => {
            let (b, h, s) = (shape.batch as usize, shape.heads as usize, shape.seq as usize);
            let mut out = vec![0.0; rows];
            for seq in 0..b {
                for pos in 0..s {
                    for head in 0..h {
                        out[(seq * s + pos) * h + head] = stats[(seq * h + head) * s + pos];
                    }
                }
            }
            out
        }
    };
    let mut backward = Recorder::default();
    let Ok(graph) = backward_composite(&mut backward, shape, form);
    bound.insert(uid::O, o.clone());
    bound.insert(uid::STATS, stats);
    bound.insert(uid::DO, x.d_o.clone());
    bound.insert(uid::ONE, vec![1.0]);
    bound.insert(uid::DQ, vec![f64::NAN; n]);
    let gradient = vec![if view.zero_gradients { 0.0 } else { f64::NAN }; x.k.len()];
    for id in [uid::DK, uid::DV] {
        bound.insert(id, gradient[offset..].to_vec());
    }
    if form == BackwardForm::Accumulate {
        bound.insert(uid::DQ_ACCUM, vec![0.0; n]);
    }
    bound.insert(uid::SOFTMAX_SUM, vec![f64::NAN; rows]);
    run(&backward, graph, &mut bound).unwrap_or_else(|e| panic!("backward: {e}"));
    let whole = |id: Uid| [&gradient[..offset], &bound[&id][..]].concat();
    Results { o, lse, dq: bound[&uid::DQ].clone(), dk: whole(uid::DK), dv: whole(uid::DV) }
}

/// The largest absolute difference (NaN if a value is not finite or the lengths differ).
fn max_error(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::NAN;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| if x.is_finite() && y.is_finite() { (x - y).abs() } else { f64::NAN })
        // Not `f64::max`, which drops a NaN: a non-finite value must fail the comparison.
        .fold(0.0, |m: f64, e: f64| if m.is_nan() || e.is_nan() { f64::NAN } else { m.max(e) })
}

fn compare(label: &str, got: &Results, want: &Results, tolerance: f64) {
    for (name, g, w) in [
        ("o", &got.o, &want.o),
        ("lse", &got.lse, &want.lse),
        ("dq", &got.dq, &want.dq),
        ("dk", &got.dk, &want.dk),
        ("dv", &got.dv, &want.dv),
    ] {
        let error = max_error(g, w);
        println!("{label} {name}: max |error| {error:.3e}");
        assert!(error <= tolerance, "{label}: {name} differs from the reference by {error:e} (> {tolerance:e})");
    }
}

#[test]
fn the_composite_graphs_compute_attention_and_its_gradients() {
    for (case, &(b, h, s, d)) in CASES.iter().enumerate() {
        let shape = Shape::plan(b, h, s, d);
        let x = inputs(&shape, 10 * case as u64 + 1);
        let want = reference(&multi_head(&shape), &x);
        let label = format!("composite b={b} h={h} s={s} d={d}");
        compare(&label, &interpret(&shape, &x, false, BackwardForm::Accumulate, None), &want, F64_TOLERANCE);
        // The backward alone, from the reference's forward.
        let backward = interpret(&shape, &x, false, BackwardForm::Accumulate, Some(&want));
        compare(&format!("{label} (backward from the reference)"), &backward, &want, F64_TOLERANCE);
    }
}

#[test]
fn the_fused_forward_and_the_deterministic_backward_compute_the_same() {
    for (case, &(b, h, s, d)) in CASES.iter().enumerate() {
        let shape = Shape::plan(b, h, s, d);
        let x = inputs(&shape, 10 * case as u64 + 2);
        let want = reference(&multi_head(&shape), &x);
        let label = format!("fused, deterministic b={b} h={h} s={s} d={d}");
        compare(&label, &interpret(&shape, &x, true, BackwardForm::Deterministic, None), &want, F64_TOLERANCE);
    }
}

#[test]
fn the_head_major_statistics_layout_computes_the_same() {
    let (b, h, s, d) = CASES[2];
    let shape = Shape { stats: StatsLayout::HeadMajor, ..Shape::plan(b, h, s, d) };
    let x = inputs(&shape, 7);
    let want = reference(&multi_head(&shape), &x);
    compare("head-major stats", &interpret(&shape, &x, false, BackwardForm::Accumulate, None), &want, F64_TOLERANCE);
}

/// The comparison can fail: the forward graph with its causal mask dropped (the select replaced
/// by an identity) is far from the reference.
#[test]
fn a_graph_without_its_mask_is_caught() {
    use super::graph::{Operation, PointwiseMode};
    let (b, h, s, d) = CASES[2];
    let shape = Shape::plan(b, h, s, d);
    let x = inputs(&shape, 3);
    let want = reference(&multi_head(&shape), &x);
    let mut recorder = Recorder::default();
    let Ok(graph) = forward_composite(&mut recorder, &shape);
    let mut dropped = 0;
    for event in &mut recorder.events {
        if let Event::Operation(Operation::Pointwise { mode, b, t, .. }) = event {
            if *mode == PointwiseMode::BinarySelect {
                (*mode, *b, *t) = (PointwiseMode::Identity, None, None);
                dropped += 1;
            }
        }
    }
    assert_eq!(dropped, 1);
    let n = x.q.len();
    let mut bound = Bindings::new();
    for (id, value) in [(uid::Q, &x.q), (uid::K, &x.k), (uid::V, &x.v)] {
        bound.insert(id, value.clone());
    }
    bound.insert(uid::O, vec![f64::NAN; n]);
    bound.insert(uid::STATS, vec![f64::NAN; (b * h * s) as usize]);
    bound.insert(uid::SCALE, vec![1.0 / (d as f64).sqrt()]);
    bound.insert(uid::NEG_INF, vec![f64::NEG_INFINITY]);
    run(&recorder, graph, &mut bound).unwrap();
    let error = max_error(&bound[&uid::O], &want.o);
    assert!(error > 1e-3, "attention without its mask is within {error:e} of causal attention");
}

#[test]
fn operation_counts_are_the_frontends() {
    let shape = Shape::plan(1, 16, 16384, 128);
    let count = |recorder: &Recorder, main_only: bool| {
        let graph = recorder
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Graph { ops, main } if *main || !main_only => Some(ops.len()),
                _ => None,
            })
            .sum::<usize>();
        (graph, recorder.operations().len())
    };
    let mut r = Recorder::default();
    let Ok(_) = forward_composite(&mut r, &shape);
    assert_eq!(count(&r, true), (14, 14));
    let mut r = Recorder::default();
    let Ok(_) = forward_fused(&mut r, &shape);
    // One fused op in the main graph; the mask and the softmax are referred to by it.
    assert_eq!(count(&r, true), (1, 3));
    let mut r = Recorder::default();
    let Ok(_) = backward_composite(&mut r, &shape, BackwardForm::Accumulate);
    assert_eq!(count(&r, true), (22, 22));
    let mut r = Recorder::default();
    let Ok(_) = backward_composite(&mut r, &shape, BackwardForm::Deterministic);
    assert_eq!(count(&r, true), (21, 21)); // Grouped K/V: the same forward; the backward sums dK and dV per group (two reductions).
    let grouped = Shape::grouped(1, 16, 4, 16384, 128);
    let mut r = Recorder::default();
    let Ok(_) = forward_composite(&mut r, &grouped);
    assert_eq!(count(&r, true), (14, 14));
    let mut r = Recorder::default();
    let Ok(_) = forward_fused(&mut r, &grouped);
    assert_eq!(count(&r, true), (1, 3));
    let mut r = Recorder::default();
    let Ok(_) = backward_composite(&mut r, &grouped, BackwardForm::Accumulate);
    assert_eq!(count(&r, true), (24, 24));
    let mut r = Recorder::default();
    let Ok(_) = backward_composite(&mut r, &grouped, BackwardForm::Deterministic);
    assert_eq!(count(&r, true), (23, 23));
}

/// The golden recordings: 16K tokens, 16 heads of 128 (the shape measured on the H200); the
/// same with 4 K/V heads (grouped-query attention, `attention-gqa-*`), and the backward with K/V
/// replicated (one K/V head read from rows of 4, `attention-replicated-backward.txt`).
#[test]
fn golden_recordings() {
    let shape = Shape::plan(1, 16, 16384, 128);
    let grouped = Shape::grouped(1, 16, 4, 16384, 128);
    let replicated = Shape { kv_row: 4 * 128, ..Shape::grouped(1, 16, 1, 16384, 128) };
    let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden");
    let bless = std::env::var_os("MEMO_BLESS").is_some();
    let mut recordings = Vec::new();
    for (prefix, shape, what) in
        [("attention", &shape, String::new()), ("attention-gqa", &grouped, " kv_heads=4".to_string())]
    {
        let mut r = Recorder::default();
        let Ok(_) = forward_composite(&mut r, shape);
        recordings.push((format!("{prefix}-forward-composite.txt"), r, what.clone()));
        let mut r = Recorder::default();
        let Ok(_) = forward_fused(&mut r, shape);
        recordings.push((format!("{prefix}-forward-fused.txt"), r, what.clone()));
        let mut r = Recorder::default();
        let Ok(_) = backward_composite(&mut r, shape, BackwardForm::Accumulate);
        recordings.push((format!("{prefix}-backward.txt"), r, what.clone()));
        let mut r = Recorder::default();
        let Ok(_) = backward_composite(&mut r, shape, BackwardForm::Deterministic);
        recordings.push((format!("{prefix}-backward-deterministic.txt"), r, what));
    }
    let mut r = Recorder::default();
    let Ok(_) = backward_composite(&mut r, &replicated, BackwardForm::Accumulate);
    let what = " kv_heads=1 of rows of 4 heads (K/V replicated)".to_string();
    recordings.push(("attention-replicated-backward.txt".to_string(), r, what));
    for (name, recording, what) in recordings {
        let path = folder.join(&name);
        let text = format!(
            "# cuDNN graph recorded by runtime-cuda (attention::record) for b=1 h=16{what} s=16384 d=128, plan layout.\n\
             # Regenerate: MEMO_BLESS=1 cargo test -p runtime-cuda --lib attention::tests::golden\n{}",
            recording.text()
        );
        if bless {
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; create it with MEMO_BLESS=1", path.display()));
        assert!(golden == text, "{name}: the recorded graph differs from the golden file (MEMO_BLESS=1 if intended)");
    }
}

/// RoPE (base 10000, pairs (2i, 2i+1)) of a `[tokens, row]` buffer of heads of `d` in sequences
/// of `s`, or its inverse, in f64.
fn rotate(x: &mut [f64], row: usize, s: usize, d: usize, inverse: bool) {
    for (token, row) in x.chunks_exact_mut(row).enumerate() {
        let pos = (token % s) as f64;
        for head in row.chunks_exact_mut(d) {
            for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                let (sin, cos) = (pos * 10_000f64.powf(-2.0 * i as f64 / d as f64)).sin_cos();
                let sin = if inverse { -sin } else { sin };
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * cos - b * sin;
                pair[1] = a * sin + b * cos;
            }
        }
    }
}

fn arg(data: runtime_cpu::ops::ArgData<'_>, rows: usize, row_bytes: usize) -> runtime_cpu::ops::Arg<'_> {
    runtime_cpu::ops::Arg { data, first_row: 0, rows, row_bytes }
}

fn bf16_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|&v| half::bf16::from_f64(v).to_le_bytes()).collect()
}

fn from_bf16(bytes: &[u8]) -> Vec<f64> {
    bytes.chunks_exact(2).map(|p| half::bf16::from_le_bytes([p[0], p[1]]).to_f64()).collect()
}

/// The cuDNN path's arithmetic end to end for `view` (rotate q, and k with all its K/V heads;
/// the graphs; rotate dq and dk back), interpreted.
fn interpret_with_rope(view: &KeyValueView, x: &Inputs) -> Results {
    let shape = &view.shape;
    let (s, d) = (shape.seq as usize, shape.head_dim as usize);
    let mut rotated = Inputs { q: x.q.clone(), k: x.k.clone(), v: x.v.clone(), d_o: x.d_o.clone() };
    rotate(&mut rotated.q, shape.row as usize, s, d, false);
    rotate(&mut rotated.k, shape.kv_row as usize, s, d, false);
    let mut got = interpret_view(view, &rotated, false, BackwardForm::Accumulate, None);
    rotate(&mut got.dq, shape.row as usize, s, d, true);
    rotate(&mut got.dk, shape.kv_row as usize, s, d, true);
    got
}

/// The CPU backend's attention op and its backward on `x` (bf16 in and out, f32 inside), as
/// `rank` of `ranks` with K/V `replicated` or not.
fn cpu_attention(g: &AttentionShape, x: &Inputs, rank: usize, ranks: usize, replicated: bool) -> Results {
    use runtime_cpu::ops::{self, ArgData, Group, OpContext};
    let (b, h, s, d) = (g.sequences as usize, g.heads as usize, g.seq_len as usize, g.head_dim as usize);
    let (rows, row_bytes, kv_bytes) = (b * s, h * d * 2, g.kv_heads as usize * d * 2);
    let context = OpContext {
        hidden: h * d,
        heads: h,
        kv_heads: g.kv_heads as usize,
        kv_replicated: replicated,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len: s,
        vocab: 1,
        loss_scale_tokens: rows,
        adamw: Default::default(),
        context_rank: 0,
        context_ranks: 1,
    };
    let group = Group { rank, ranks };
    let (q, k, v, d_o) = (bf16_bytes(&x.q), bf16_bytes(&x.k), bf16_bytes(&x.v), bf16_bytes(&x.d_o));
    let (mut o, mut lse) = (vec![0u8; rows * row_bytes], vec![0u8; rows * h * 4]);
    {
        let mut args = vec![
            arg(ArgData::Read(&q), rows, row_bytes),
            arg(ArgData::Read(&k), rows, kv_bytes),
            arg(ArgData::Read(&v), rows, kv_bytes),
            arg(ArgData::Write(&mut o), rows, row_bytes),
            arg(ArgData::Write(&mut lse), rows, h * 4),
        ];
        ops::execute_on_rank(Op::Attention, &mut args, &context, group, 1).unwrap();
    }
    // dk and dv start as garbage: the op must write every element (zeros for unused heads).
    let (mut dq, mut dk, mut dv) =
        (vec![0u8; rows * row_bytes], vec![0x7fu8; rows * kv_bytes], vec![0x7fu8; rows * kv_bytes]);
    {
        let mut args = vec![
            arg(ArgData::Read(&q), rows, row_bytes),
            arg(ArgData::Read(&k), rows, kv_bytes),
            arg(ArgData::Read(&v), rows, kv_bytes),
            arg(ArgData::Read(&o), rows, row_bytes),
            arg(ArgData::Read(&lse), rows, h * 4),
            arg(ArgData::Read(&d_o), rows, row_bytes),
            arg(ArgData::Write(&mut dq), rows, row_bytes),
            arg(ArgData::Write(&mut dk), rows, kv_bytes),
            arg(ArgData::Write(&mut dv), rows, kv_bytes),
        ];
        ops::execute_on_rank(Op::AttentionBackward, &mut args, &context, group, 1).unwrap();
    }
    Results {
        o: from_bf16(&o),
        lse: lse.chunks_exact(4).map(|w| f64::from(f32::from_le_bytes([w[0], w[1], w[2], w[3]]))).collect(),
        dq: from_bf16(&dq),
        dk: from_bf16(&dk),
        dv: from_bf16(&dv),
    }
}

/// `got` (f64) against the CPU backend's `cpu`: the CPU rounds its outputs to bf16 (2^-9
/// relative) and computes in f32; its backward starts from its own bf16 output: 2^-7 of the
/// largest magnitude covers both here.
fn compare_with_cpu(label: &str, got: &Results, cpu: &Results) {
    for (name, g, c) in [
        ("o", &got.o, &cpu.o),
        ("lse", &got.lse, &cpu.lse),
        ("dq", &got.dq, &cpu.dq),
        ("dk", &got.dk, &cpu.dk),
        ("dv", &got.dv, &cpu.dv),
    ] {
        let largest = c.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let error = max_error(g, c);
        println!("cpu {label} {name}: max |error| {error:.3e} (largest {largest:.3})");
        assert!(error <= largest / 128.0 + 1e-4, "{label} {name}: {error:e} from the CPU backend (largest {largest})");
    }
}

/// The cuDNN path's arithmetic end to end (rotate q and k, the graphs, rotate dq and dk back),
/// interpreted, against the CPU backend's attention op (f32 inside, bf16 out).
#[test]
fn the_graphs_with_rope_match_the_cpu_backend() {
    for (case, &(b, h, s, d)) in CASES.iter().enumerate() {
        let shape = Shape::plan(b, h, s, d);
        let x = inputs(&shape, 10 * case as u64 + 5);
        let view = KeyValueView { shape, offset: 0, zero_gradients: false };
        let got = interpret_with_rope(&view, &x);
        let cpu = cpu_attention(&multi_head(&shape), &x, 0, 1, false);
        compare_with_cpu(&format!("b={b} h={h} s={s} d={d}"), &got, &cpu);
    }
}

/// How each grouped case is shown to cuDNN: native grouping (h_kv = the K/V heads, offset 0)
/// on a rank's share; with K/V replicated, one head at its offset in rows of every head, dk and
/// dv zeroed first when the rows hold other heads.
#[test]
fn grouped_and_replicated_key_values_are_described_as_cudnn_groups() {
    let described: Vec<(i64, i64, u64, bool)> = GROUPED
        .iter()
        .map(|case| {
            let view = key_value_view(&geometry(case)).unwrap();
            (view.shape.kv_heads, view.shape.kv_row, view.offset, view.zero_gradients)
        })
        .collect();
    assert_eq!(
        described,
        [(2, 32, 0, false), (1, 32, 0, false), (1, 32, 0, true), (1, 32, 16, true), (1, 16, 0, false)]
    );
    // Multi-head attention is the multi-head shape.
    let mha = key_value_view(&multi_head(&Shape::plan(2, 3, 77, 64))).unwrap();
    assert_eq!(mha, KeyValueView { shape: Shape::plan(2, 3, 77, 64), offset: 0, zero_gradients: false });
    // Replicated K/V whose group does not keep a rank's query heads on one K/V head (3 K/V heads
    // at t = 4, which the model's rule refuses): refused in one line, not mis-described.
    let split = geometry(&(1, 3, 3, 8, 16, 1, 4, true));
    assert_eq!((split.kv_head(0), split.kv_head(2)), (0, 1));
    let error = key_value_view(&split).unwrap_err().to_string();
    assert!(error.contains("K/V heads 0..=1 of 3") && !error.contains('\n'), "{error}");
}

/// Grouped-query and replicated K/V: the recorded graphs (both forward forms, both backward
/// forms, and the head-major statistics) against the grouped reference, dK and dV summed over
/// each group and 0 for a K/V head no query head of the launch uses.
#[test]
fn the_grouped_graphs_compute_grouped_attention() {
    for (case, grouped) in GROUPED.iter().enumerate() {
        let g = geometry(grouped);
        let view = key_value_view(&g).unwrap();
        let x = inputs(&view.shape, 10 * case as u64 + 8);
        let want = reference(&g, &x);
        // The reference gives exactly 0 to the K/V heads no query head uses (and only those
        // are zeroed by the backend).
        let d = g.head_dim as usize;
        let unused: Vec<usize> =
            (0..g.kv_heads).filter(|&kv| (0..g.heads).all(|i| g.kv_head(i) != kv)).map(|kv| kv as usize).collect();
        assert_eq!(view.zero_gradients, !unused.is_empty());
        for row in want.dk.chunks_exact(g.kv_heads as usize * d).chain(want.dv.chunks_exact(g.kv_heads as usize * d)) {
            assert!(unused.iter().all(|&kv| row[kv * d..(kv + 1) * d].iter().all(|&v| v == 0.0)));
        }
        let label = format!("{grouped:?}");
        for (fused, form) in [(false, BackwardForm::Accumulate), (true, BackwardForm::Deterministic)] {
            let got = interpret_view(&view, &x, fused, form, None);
            compare(&format!("{label} fused={fused} {form:?}"), &got, &want, F64_TOLERANCE);
        }
        let head_major = KeyValueView { shape: Shape { stats: StatsLayout::HeadMajor, ..view.shape }, ..view };
        let got = interpret_view(&head_major, &x, false, BackwardForm::Deterministic, Some(&want));
        compare(&format!("{label} head-major, backward from the reference"), &got, &want, F64_TOLERANCE);
    }
}

/// The comparison can fail: without the zeroing, the unused K/V head's dk and dv are whatever
/// the buffers held (NaN here).
#[test]
fn replicated_gradients_without_the_zeroing_are_caught() {
    let g = geometry(&GROUPED[3]);
    let view = key_value_view(&g).unwrap();
    let x = inputs(&view.shape, 4);
    let got =
        interpret_view(&KeyValueView { zero_gradients: false, ..view }, &x, false, BackwardForm::Accumulate, None);
    assert!(max_error(&got.dk, &reference(&g, &x).dk).is_nan());
}

/// The grouped and replicated cases end to end with RoPE against the CPU backend's op on the
/// same rank of the same group.
#[test]
fn the_grouped_graphs_with_rope_match_the_cpu_backend() {
    for (case, grouped) in GROUPED.iter().enumerate() {
        let &(_, _, _, _, _, rank, ranks, replicated) = grouped;
        let g = geometry(grouped);
        let view = key_value_view(&g).unwrap();
        let x = inputs(&view.shape, 10 * case as u64 + 9);
        let got = interpret_with_rope(&view, &x);
        let cpu = cpu_attention(&g, &x, rank as usize, ranks as usize, replicated);
        compare_with_cpu(&format!("{grouped:?}"), &got, &cpu);
    }
}

#[test]
fn scratch_is_a_function_of_the_shape() {
    let shape = AttentionShape {
        heads: 16,
        kv_heads: 16,
        group: 1,
        first_query: 0,
        head_dim: 128,
        seq_len: 16384,
        sequences: 1,
    };
    let elements = 16 * 128 * 16384u64;
    let forward = scratch(Op::Attention, &shape, false, false, 1000);
    assert_eq!(
        (forward.rotated_q, forward.rotated_k, forward.dq_accumulator, forward.softmax_sum),
        (elements * 2, elements * 2, 0, 0)
    );
    let backward = scratch(Op::AttentionBackward, &shape, false, false, 0);
    assert_eq!(backward.dq_accumulator, elements * 4);
    assert_eq!(backward.softmax_sum, 16 * 16384 * 4);
    assert_eq!(scratch(Op::AttentionBackward, &shape, true, false, 0).dq_accumulator, 0);
    let (offsets, total) = backward.layout();
    assert!(offsets.iter().all(|o| o % 256 == 0) && offsets.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(total, elements * 2 * 2 + elements * 4 + 16 * 16384 * 4);
    // Grouped: the rotated k holds the K/V heads of `k` (all of them when replicated).
    let grouped = AttentionShape { kv_heads: 4, group: 4, ..shape };
    let backward = scratch(Op::AttentionBackward, &grouped, false, false, 0);
    assert_eq!((backward.rotated_q, backward.rotated_k), (elements * 2, elements / 4 * 2));
    assert_eq!((backward.dq_accumulator, backward.softmax_sum), (elements * 4, 16 * 16384 * 4));
    let head_major = scratch(Op::Attention, &shape, false, true, 0);
    assert_eq!(head_major.statistics, 16 * 16384 * 4);
    assert_eq!(scratch(Op::Linear, &shape, false, true, 5).total(), 0);
}

#[test]
fn attention_choices_parse() {
    assert_eq!(AttentionChoice::parse("cudnn"), Ok(AttentionChoice::Cudnn { deterministic: false }));
    assert_eq!(AttentionChoice::parse("cudnn-deterministic"), Ok(AttentionChoice::Cudnn { deterministic: true }));
    for name in AttentionChoice::NAMES {
        assert_eq!(AttentionChoice::parse(name).map(AttentionChoice::name), Ok(name));
    }
    let error = AttentionChoice::parse("fast").unwrap_err();
    assert!(error.contains("cudnn, cudnn-deterministic, baseline, pipelined"), "{error}");
}
