//! The graphs' mathematics without a GPU: the recorded forward and backward graphs, run by the
//! f64 interpreter on the plan's strided layout, against attention from its definition (f64) and
//! against the CPU backend's attention op (through the RoPE rotation the cuDNN path adds); the
//! recordings against golden files (regenerate with
//! `MEMO_BLESS=1 cargo test -p runtime-cuda --lib attention::tests::golden` and review the diff).

use std::path::PathBuf;

use super::graph::{backward_composite, forward_composite, forward_fused, uid, BackwardForm, Shape, StatsLayout};
use super::interpret::{run, Bindings};
use super::record::{Event, Recorder};
use super::{scratch, AttentionChoice};
use memo_plan_core::plan::shapes::AttentionShape;
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

/// Inputs in the plan's layout: q, k, v, dO as `[b*s, h*d]`.
struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    d_o: Vec<f64>,
}

fn inputs(shape: &Shape, seed: u64) -> Inputs {
    let n = (shape.batch * shape.seq * shape.row) as usize;
    Inputs { q: values(n, seed), k: values(n, seed + 1), v: values(n, seed + 2), d_o: values(n, seed + 3) }
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
/// `dP = dO v^T`, `dS = P (dP - rowsum(P dP))`, `dQ = scale dS k`, `dK = scale dS^T q`.
#[allow(clippy::needless_range_loop)] // the definition's indices, as written
fn reference(shape: &Shape, x: &Inputs) -> Results {
    let (b, h, s, d, r) =
        (shape.batch as usize, shape.heads as usize, shape.seq as usize, shape.head_dim as usize, shape.row as usize);
    let scale = 1.0 / (d as f64).sqrt();
    let at = |seq: usize, pos: usize, head: usize, c: usize| (seq * s + pos) * r + head * d + c;
    let n = b * s * r;
    let mut out =
        Results { o: vec![0.0; n], lse: vec![0.0; b * s * h], dq: vec![0.0; n], dk: vec![0.0; n], dv: vec![0.0; n] };
    for seq in 0..b {
        for head in 0..h {
            let dot = |a: &[f64], i: usize, bb: &[f64], j: usize| -> f64 {
                (0..d).map(|c| a[at(seq, i, head, c)] * bb[at(seq, j, head, c)]).sum()
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
                        out.o[at(seq, i, head, c)] += p[i][j] * x.v[at(seq, j, head, c)];
                    }
                }
            }
            for i in 0..s {
                let dp: Vec<f64> = (0..=i).map(|j| dot(&x.d_o, i, &x.v, j)).collect();
                let delta: f64 = (0..=i).map(|j| p[i][j] * dp[j]).sum();
                for j in 0..=i {
                    let ds = p[i][j] * (dp[j] - delta);
                    for c in 0..d {
                        out.dv[at(seq, j, head, c)] += p[i][j] * x.d_o[at(seq, i, head, c)];
                        out.dq[at(seq, i, head, c)] += scale * ds * x.k[at(seq, j, head, c)];
                        out.dk[at(seq, j, head, c)] += scale * ds * x.q[at(seq, i, head, c)];
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
    let n = x.q.len();
    let rows = (shape.batch * shape.heads * shape.seq) as usize;
    let scale = 1.0 / (shape.head_dim as f64).sqrt();
    let mut forward = Recorder::default();
    let graph = if fused { forward_fused(&mut forward, shape) } else { forward_composite(&mut forward, shape) };
    let Ok(graph) = graph;
    let mut bound = Bindings::new();
    bound.insert(uid::Q, x.q.clone());
    bound.insert(uid::K, x.k.clone());
    bound.insert(uid::V, x.v.clone());
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
    for id in [uid::DQ, uid::DK, uid::DV] {
        bound.insert(id, vec![f64::NAN; n]);
    }
    if form == BackwardForm::Accumulate {
        bound.insert(uid::DQ_ACCUM, vec![0.0; n]);
    }
    bound.insert(uid::SOFTMAX_SUM, vec![f64::NAN; rows]);
    run(&backward, graph, &mut bound).unwrap_or_else(|e| panic!("backward: {e}"));
    Results { o, lse, dq: bound[&uid::DQ].clone(), dk: bound[&uid::DK].clone(), dv: bound[&uid::DV].clone() }
}

/// The largest absolute difference (NaN if a value is not finite or the lengths differ).
fn max_error(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::NAN;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| if x.is_finite() && y.is_finite() { (x - y).abs() } else { f64::NAN })
        .fold(0.0, f64::max)
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
        let want = reference(&shape, &x);
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
        let want = reference(&shape, &x);
        let label = format!("fused, deterministic b={b} h={h} s={s} d={d}");
        compare(&label, &interpret(&shape, &x, true, BackwardForm::Deterministic, None), &want, F64_TOLERANCE);
    }
}

#[test]
fn the_head_major_statistics_layout_computes_the_same() {
    let (b, h, s, d) = CASES[2];
    let shape = Shape { stats: StatsLayout::HeadMajor, ..Shape::plan(b, h, s, d) };
    let x = inputs(&shape, 7);
    let want = reference(&shape, &x);
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
    let want = reference(&shape, &x);
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
    assert_eq!(count(&r, true), (21, 21));
}

/// The golden recordings: 16K tokens, 16 heads of 128 (the shape measured on the H200).
#[test]
fn golden_recordings() {
    let shape = Shape::plan(1, 16, 16384, 128);
    let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden");
    let bless = std::env::var_os("MEMO_BLESS").is_some();
    let mut recordings = Vec::new();
    let mut r = Recorder::default();
    let Ok(_) = forward_composite(&mut r, &shape);
    recordings.push(("attention-forward-composite.txt", r));
    let mut r = Recorder::default();
    let Ok(_) = forward_fused(&mut r, &shape);
    recordings.push(("attention-forward-fused.txt", r));
    let mut r = Recorder::default();
    let Ok(_) = backward_composite(&mut r, &shape, BackwardForm::Accumulate);
    recordings.push(("attention-backward.txt", r));
    let mut r = Recorder::default();
    let Ok(_) = backward_composite(&mut r, &shape, BackwardForm::Deterministic);
    recordings.push(("attention-backward-deterministic.txt", r));
    for (name, recording) in recordings {
        let path = folder.join(name);
        let text = format!(
            "# cuDNN graph recorded by runtime-cuda (attention::record) for b=1 h=16 s=16384 d=128, plan layout.\n\
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

/// RoPE (base 10000, pairs (2i, 2i+1)) of a `[tokens, heads * d]` buffer, or its inverse, in f64.
fn rotate(x: &mut [f64], shape: &Shape, inverse: bool) {
    let (s, d) = (shape.seq as usize, shape.head_dim as usize);
    for (token, row) in x.chunks_exact_mut(shape.row as usize).enumerate() {
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

/// The cuDNN path's arithmetic end to end (rotate q and k, the graphs, rotate dq and dk back),
/// interpreted, against the CPU backend's attention op (f32 inside, bf16 out).
#[test]
fn the_graphs_with_rope_match_the_cpu_backend() {
    use runtime_cpu::ops::{self, ArgData, OpContext};
    for (case, &(b, h, s, d)) in CASES.iter().enumerate() {
        let shape = Shape::plan(b, h, s, d);
        let x = inputs(&shape, 10 * case as u64 + 5);
        let mut rotated = Inputs { q: x.q.clone(), k: x.k.clone(), v: x.v.clone(), d_o: x.d_o.clone() };
        rotate(&mut rotated.q, &shape, false);
        rotate(&mut rotated.k, &shape, false);
        let mut got = interpret(&shape, &rotated, false, BackwardForm::Accumulate, None);
        rotate(&mut got.dq, &shape, true);
        rotate(&mut got.dk, &shape, true);

        let (rows, row_bytes) = ((b * s) as usize, (shape.row * 2) as usize);
        let context = OpContext {
            hidden: shape.row as usize,
            heads: h as usize,
            kv_heads: 0,
            kv_replicated: false,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            seq_len: s as usize,
            vocab: 1,
            loss_scale_tokens: rows,
            adamw: Default::default(),
        };
        let (q, k, v, d_o) = (bf16_bytes(&x.q), bf16_bytes(&x.k), bf16_bytes(&x.v), bf16_bytes(&x.d_o));
        let (mut o, mut lse) = (vec![0u8; rows * row_bytes], vec![0u8; rows * h as usize * 4]);
        {
            let mut args = vec![
                arg(ArgData::Read(&q), rows, row_bytes),
                arg(ArgData::Read(&k), rows, row_bytes),
                arg(ArgData::Read(&v), rows, row_bytes),
                arg(ArgData::Write(&mut o), rows, row_bytes),
                arg(ArgData::Write(&mut lse), rows, h as usize * 4),
            ];
            ops::execute_with_threads(Op::Attention, &mut args, &context, 1).unwrap();
        }
        let (mut dq, mut dk, mut dv) =
            (vec![0u8; rows * row_bytes], vec![0u8; rows * row_bytes], vec![0u8; rows * row_bytes]);
        {
            let mut args = vec![
                arg(ArgData::Read(&q), rows, row_bytes),
                arg(ArgData::Read(&k), rows, row_bytes),
                arg(ArgData::Read(&v), rows, row_bytes),
                arg(ArgData::Read(&o), rows, row_bytes),
                arg(ArgData::Read(&lse), rows, h as usize * 4),
                arg(ArgData::Read(&d_o), rows, row_bytes),
                arg(ArgData::Write(&mut dq), rows, row_bytes),
                arg(ArgData::Write(&mut dk), rows, row_bytes),
                arg(ArgData::Write(&mut dv), rows, row_bytes),
            ];
            ops::execute_with_threads(Op::AttentionBackward, &mut args, &context, 1).unwrap();
        }
        let cpu = Results {
            o: from_bf16(&o),
            lse: lse.chunks_exact(4).map(|w| f64::from(f32::from_le_bytes([w[0], w[1], w[2], w[3]]))).collect(),
            dq: from_bf16(&dq),
            dk: from_bf16(&dk),
            dv: from_bf16(&dv),
        };
        // The CPU rounds its outputs to bf16 (2^-9 relative) and computes in f32; the backward
        // starts from its own bf16 output: 2^-7 of the largest magnitude covers both here.
        for (name, g, c) in [
            ("o", &got.o, &cpu.o),
            ("lse", &got.lse, &cpu.lse),
            ("dq", &got.dq, &cpu.dq),
            ("dk", &got.dk, &cpu.dk),
            ("dv", &got.dv, &cpu.dv),
        ] {
            let largest = c.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let error = max_error(g, c);
            println!("cpu b={b} h={h} s={s} d={d} {name}: max |error| {error:.3e} (largest {largest:.3})");
            assert!(error <= largest / 128.0 + 1e-4, "{name}: {error:e} from the CPU backend (largest {largest})");
        }
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
