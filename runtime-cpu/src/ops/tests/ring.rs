//! The context-parallel ring attention kernels (`ring.rs`): a ring of `c` ranks simulated by hand
//! (each rank's chunks, its `rotary`, the forward ring's blocks in the design's order, the
//! backward ring with travelling accumulators, `to_bf16`, `rotary_backward`), reassembled and
//! compared with `attention` and `attention_backward` over the whole sequence within a bound
//! derived below; bits independent of the thread count; the rotation's positions; errors, never
//! panics.

use memo_plan_core::plan::Op;

use super::super::attention::{push_rope_angles, rotate};
use super::super::{execute_on_rank, Arg, ArgData, Group, OpContext, OpError};
use super::{args_of, context, Rng, T};

/// bf16's unit roundoff: round to nearest with 8 significand bits, `|bf16(x) - x| <= U |x|`.
const U: f64 = 1.0 / 256.0;

/// Rows `[a, b)` of `t`, read-only.
fn rd(t: &T, a: usize, b: usize) -> Arg<'_> {
    let rb = t.row_bytes;
    Arg { data: ArgData::Read(&t.data[a * rb..b * rb]), first_row: t.first_row + a, rows: b - a, row_bytes: rb }
}

/// Rows `[a, b)` of `t`, writable.
fn wr(t: &mut T, a: usize, b: usize) -> Arg<'_> {
    let rb = t.row_bytes;
    Arg { data: ArgData::Write(&mut t.data[a * rb..b * rb]), first_row: t.first_row + a, rows: b - a, row_bytes: rb }
}

/// The rows `rows` of `t`, in that order, as a tensor starting at row 0.
fn pick(t: &T, rows: &[usize]) -> T {
    let rb = t.row_bytes;
    let data = rows.iter().flat_map(|&r| t.data[r * rb..(r + 1) * rb].iter().copied()).collect();
    T { data, rows: rows.len(), row_bytes: rb, first_row: 0 }
}

/// Writes the rows of `src` to rows `rows` of `dst`.
fn put(dst: &mut T, rows: &[usize], src: &T) {
    let rb = dst.row_bytes;
    for (i, &r) in rows.iter().enumerate() {
        dst.data[r * rb..(r + 1) * rb].copy_from_slice(&src.data[i * rb..(i + 1) * rb]);
    }
}

/// One problem: `b` sequences of `s` tokens over `c` context ranks.
#[derive(Clone, Copy, Debug)]
struct Problem {
    seed: u64,
    c: usize,
    b: usize,
    s: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    /// The tensor-parallel rank: with `ranks > 1`, K and V hold every K/V head, replicated (the
    /// context's `heads` are this rank's share of the model's).
    tp: Group,
}

impl Problem {
    fn n(&self) -> usize {
        self.s / (2 * self.c)
    }

    /// The rank's rows of one sequence, `s / c`.
    fn local(&self) -> usize {
        self.s / self.c
    }

    /// Rows, in the whole `b*s` layout, of context rank `k`'s local rows in order (per sequence
    /// chunk `k`, then chunk `2c-1-k`).
    fn rank_rows(&self, k: usize) -> Vec<usize> {
        let n = self.n();
        let mut rows = Vec::new();
        for seq in 0..self.b {
            for chunk in [k, 2 * self.c - 1 - k] {
                rows.extend((0..n).map(|j| seq * self.s + chunk * n + j));
            }
        }
        rows
    }

    /// The whole-sequence context (`seq_len = s`).
    fn full_context(&self) -> OpContext {
        let hidden = self.heads * self.d * self.tp.ranks;
        OpContext {
            kv_heads: self.kv_heads,
            kv_replicated: self.tp.ranks > 1,
            ..context(hidden, self.heads, self.s, 1)
        }
    }

    /// The K/V head query head `head` attends with (`AttentionShape::kv_head`).
    fn kv_of(&self, head: usize) -> usize {
        (self.tp.rank * self.heads + head) / (self.heads * self.tp.ranks / self.kv_heads)
    }

    /// Context rank `k`'s context: `seq_len` its rows of one sequence.
    fn rank_context(&self, k: usize) -> OpContext {
        OpContext { seq_len: self.local(), context_rank: k, context_ranks: self.c, ..self.full_context() }
    }
}

/// The whole problem's inputs (rows of all `b*s` tokens).
struct Inputs {
    q: T,
    k: T,
    v: T,
    dout: T,
}

fn inputs(p: &Problem) -> Inputs {
    let mut rng = Rng::new(p.seed);
    let rows = p.b * p.s;
    let (qw, kw) = (p.heads * p.d, p.kv_heads * p.d);
    Inputs {
        q: T::bf16(&rng.bf16_vec(rows * qw, 1.5), rows),
        k: T::bf16(&rng.bf16_vec(rows * kw, 1.5), rows),
        v: T::bf16(&rng.bf16_vec(rows * kw, 1.0), rows),
        dout: T::bf16(&rng.bf16_vec(rows * qw, 1.0), rows),
    }
}

/// What the ring gives, reassembled in the whole layout, and the block area (query-key pairs)
/// each rank launched at each step.
struct RingResult {
    out: T,
    lse: T,
    dq: T,
    dk: T,
    dv: T,
    areas: Vec<Vec<usize>>,
}

fn check(result: Result<(), OpError>) {
    if let Err(error) = result {
        panic!("{error}");
    }
}

/// A block launch: causal or not, the rows `[a, b)` of Q and of K/V.
type BlockLaunch = (bool, (usize, usize), (usize, usize));

/// The blocks rank `k` launches at step `i` for one sequence whose local rows start at `base`,
/// as `(causal, q rows, k rows)` (rows local to the rank holding them): the design's order.
fn step_blocks(p: &Problem, k: usize, i: usize, base: usize) -> Vec<BlockLaunch> {
    let n = p.n();
    let (a, bb) = ((base, base + n), (base + n, base + 2 * n));
    if i == 0 {
        return vec![(true, a, a), (false, bb, a), (true, bb, bb)];
    }
    let j = (k + p.c - i) % p.c;
    if j < k {
        vec![(false, (base, base + 2 * n), a)]
    } else {
        vec![(false, bb, (base, base + 2 * n))]
    }
}

/// The pairs a block computes: all of them, or the diagonal block's lower triangle.
fn area(causal: bool, q: (usize, usize), k: (usize, usize)) -> usize {
    let (rq, rk) = (q.1 - q.0, k.1 - k.0);
    if causal {
        rq * (rq + 1) / 2
    } else {
        rq * rk
    }
}

/// The ring of `p.c` ranks, by hand, with `threads` threads per kernel.
fn simulate(p: &Problem, x: &Inputs, threads: usize) -> RingResult {
    let (c, group) = (p.c, p.tp);
    let ctx: Vec<OpContext> = (0..c).map(|k| p.rank_context(k)).collect();
    let (qw, kw) = (p.heads * p.d, p.kv_heads * p.d);
    let rows_of: Vec<Vec<usize>> = (0..c).map(|k| p.rank_rows(k)).collect();
    let r = p.b * p.local();
    // Each rank's q, k (rotated in place over its rows), v and dout.
    let mut q: Vec<T> = rows_of.iter().map(|rows| pick(&x.q, rows)).collect();
    let mut kk: Vec<T> = rows_of.iter().map(|rows| pick(&x.k, rows)).collect();
    let v: Vec<T> = rows_of.iter().map(|rows| pick(&x.v, rows)).collect();
    let dout: Vec<T> = rows_of.iter().map(|rows| pick(&x.dout, rows)).collect();
    for k in 0..c {
        check(execute_on_rank(Op::Rotary, &mut [wr(&mut q[k], 0, r)], &ctx[k], group, threads));
        check(execute_on_rank(Op::Rotary, &mut [wr(&mut kk[k], 0, r)], &ctx[k], group, threads));
    }
    let mut areas = vec![vec![0usize; c]; c];
    // The forward ring.
    let mut out: Vec<T> = Vec::new();
    let mut lse: Vec<T> = Vec::new();
    for (k, rank_areas) in areas.iter_mut().enumerate() {
        let (mut acc, mut l) = (T::zeros(r, qw * 4), T::zeros(r, p.heads * 4));
        check(execute_on_rank(
            Op::AttentionRingInit,
            &mut [wr(&mut acc, 0, r), wr(&mut l, 0, r)],
            &ctx[k],
            group,
            threads,
        ));
        for (i, step_area) in rank_areas.iter_mut().enumerate() {
            let j = (k + c - i) % c;
            for seq in 0..p.b {
                for (causal, qr, kr) in step_blocks(p, k, i, seq * p.local()) {
                    *step_area += area(causal, qr, kr);
                    let mut args = [
                        rd(&q[k], qr.0, qr.1),
                        rd(&kk[j], kr.0, kr.1),
                        rd(&v[j], kr.0, kr.1),
                        wr(&mut acc, qr.0, qr.1),
                        wr(&mut l, qr.0, qr.1),
                    ];
                    let op = if causal { Op::AttentionBlockCausal } else { Op::AttentionBlock };
                    check(execute_on_rank(op, &mut args, &ctx[k], group, threads));
                }
            }
        }
        let mut o = T::zeros(r, qw * 2);
        check(execute_on_rank(
            Op::AttentionRingFinish,
            &mut [rd(&acc, 0, r), wr(&mut o, 0, r)],
            &ctx[k],
            group,
            threads,
        ));
        out.push(o);
        lse.push(l);
    }
    // The backward ring: `dk_acc[j]`, `dv_acc[j]` travel with rank `j`'s K/V: at step `i` they are
    // on rank `(j + i) mod c`, one rank at a time, so visiting the ranks in any order within a
    // step adds to each in the ring's order.
    let mut dq_acc: Vec<T> = (0..c).map(|_| T::zeros(r, qw * 4)).collect();
    let mut dk_acc: Vec<T> = (0..c).map(|_| T::zeros(r, kw * 4)).collect();
    let mut dv_acc: Vec<T> = (0..c).map(|_| T::zeros(r, kw * 4)).collect();
    for i in 0..c {
        for k in 0..c {
            let j = (k + c - i) % c;
            for seq in 0..p.b {
                for (causal, qr, kr) in step_blocks(p, k, i, seq * p.local()) {
                    let mut args = [
                        rd(&q[k], qr.0, qr.1),
                        rd(&kk[j], kr.0, kr.1),
                        rd(&v[j], kr.0, kr.1),
                        rd(&out[k], qr.0, qr.1),
                        rd(&lse[k], qr.0, qr.1),
                        rd(&dout[k], qr.0, qr.1),
                        wr(&mut dq_acc[k], qr.0, qr.1),
                        wr(&mut dk_acc[j], kr.0, kr.1),
                        wr(&mut dv_acc[j], kr.0, kr.1),
                    ];
                    let op = if causal { Op::AttentionBlockBackwardCausal } else { Op::AttentionBlockBackward };
                    check(execute_on_rank(op, &mut args, &ctx[k], group, threads));
                }
            }
        }
    }
    let rows = p.b * p.s;
    let mut result = RingResult {
        out: T::zeros(rows, qw * 2),
        lse: T::zeros(rows, p.heads * 4),
        dq: T::zeros(rows, qw * 2),
        dk: T::zeros(rows, kw * 2),
        dv: T::zeros(rows, kw * 2),
        areas,
    };
    for k in 0..c {
        let run = |op: Op, args: &mut [Arg<'_>]| check(execute_on_rank(op, args, &ctx[k], group, threads));
        let (mut dq, mut dk, mut dv) = (T::zeros(r, qw * 2), T::zeros(r, kw * 2), T::zeros(r, kw * 2));
        run(Op::ToBf16, &mut [rd(&dq_acc[k], 0, r), wr(&mut dq, 0, r)]);
        run(Op::ToBf16, &mut [rd(&dk_acc[k], 0, r), wr(&mut dk, 0, r)]);
        run(Op::ToBf16, &mut [rd(&dv_acc[k], 0, r), wr(&mut dv, 0, r)]);
        run(Op::RotaryBackward, &mut [wr(&mut dq, 0, r)]);
        run(Op::RotaryBackward, &mut [wr(&mut dk, 0, r)]);
        let rows = &rows_of[k];
        put(&mut result.out, rows, &out[k]);
        put(&mut result.lse, rows, &lse[k]);
        put(&mut result.dq, rows, &dq);
        put(&mut result.dk, rows, &dk);
        put(&mut result.dv, rows, &dv);
    }
    result
}

/// `attention` and `attention_backward` over the whole sequences: out, lse, dq, dk, dv.
fn reference(p: &Problem, x: &Inputs) -> [T; 5] {
    let ctx = p.full_context();
    let rows = p.b * p.s;
    let (qw, kw) = (p.heads * p.d, p.kv_heads * p.d);
    let mut fwd = [x.q.clone(), x.k.clone(), x.v.clone(), T::zeros(rows, qw * 2), T::zeros(rows, p.heads * 4)];
    check(execute_on_rank(Op::Attention, &mut args_of(Op::Attention, &mut fwd), &ctx, p.tp, 1));
    let [q, k, v, out, lse] = fwd;
    let (dq, dk, dv) = (T::zeros(rows, qw * 2), T::zeros(rows, kw * 2), T::zeros(rows, kw * 2));
    let mut bwd = [q, k, v, out.clone(), lse.clone(), x.dout.clone(), dq, dk, dv];
    check(execute_on_rank(Op::AttentionBackward, &mut args_of(Op::AttentionBackward, &mut bwd), &ctx, p.tp, 1));
    let [_, _, _, _, _, _, dq, dk, dv] = bwd;
    [out, lse, dq, dk, dv]
}

/// Per-element tolerances of the ring against the reference: out, lse, dq, dk, dv.
///
/// The derivation. Both sides compute the same formulas; they differ by (a) the ring's q and k
/// rotated in f32 *and rounded to bf16* by `rotary` (the reference keeps the f32 rotation), (b)
/// the ring's extra roundings of the gradients (`to_bf16`, then `rotary_backward`'s rotation and
/// rounding, where the reference rotates in f32 and rounds once), (c) f32 rounding in different
/// orders (the block merges). With `u = 2^-8` (bf16), per (sequence, head):
/// - scores: `q' = q(1+e)`, `k' = k(1+e')`, `|e|, |e'| <= u`, so
///   `|s'_ij - s_ij| <= (2u + u^2) scale sum_c |q_ic||k_jc| <= Delta = 2.01 u max_ij A_ij` with
///   `A_ij = scale sum_c |q_ic||k_jc|`;
/// - `lse = log sum_j exp(s_ij)` is monotone with unit slope in every score: `|lse' - lse| <= Delta`;
/// - `p_ij = exp(s_ij - lse_i)`: the exponent moves by at most `rho = 2 Delta + g`, so
///   `|p' - p| <= (e^rho - 1) p`; `g` bounds the f32 rounding of both sides: at most
///   `s + d + 16` roundings of relative `2^-24` each (the dot over `d`, the sums over `s` keys,
///   the merges), on magnitudes up to `1 + max|lse| + max A`, twice (either side):
///   `g = (s + d + 16) 2^-23 (1 + max|lse| + max A)`; write `eta = e^rho - 1 + g`;
/// - `out_i = sum_j p_ij v_j`: `|out' - out| <= eta sum_j p_ij |v_j| = E`, and both round to bf16:
///   `tol = E + u (2|out| + E)`;
/// - backward: `dP_ij = dout_i . v_j` is the same f32 on both sides (same inputs, same order);
///   `D_i = dout_i . out_i` moves by `ED_i = sum_c |dout_ic| tol_out_ic + g sum_c |dout_ic out_ic|`;
///   `dS = p (dP - D)` by `EdS = eta p |dP - D| + e^rho p ED`;
/// - `dv_j = sum_i p_ij dout_i`: `Ev = eta sum_i p_ij |dout_i|`, rounded on both sides:
///   `tol = Ev + u (2|dv| + Ev)`;
/// - rotated-frame `dq_i = scale sum_j dS_ij k_j` (the ring's `k'`): `Eq = scale sum_j (EdS_ij
///   |k_j| (1+u) + |dS_ij| (u + g) |k_j|)`; likewise `dk_j` with `q_i`, summed over the query heads
///   of a K/V head (errors add). The ring rounds it (`to_bf16`: `u (|g| + E)`), rotates back by an
///   orthonormal pair rotation (each element's error at most the pair's two errors added, plus
///   `g` of the pair's magnitudes), and rounds (`u`); the reference rounds once:
///   `tol_c = R + u (2|final_c| + R)`, `R = sum over the pair (E + u (|g| + E)) + g (|g_a| + |g_b|)`.
///
/// Products of two error terms are bounded by the first-order terms' 1%: every tolerance is
/// multiplied by 1.01. The reference's own values (exact f64 from its f32-rotated q, k) stand
/// in for the unknown exact ones.
struct Tolerances {
    out: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

/// `x` (rows of `width` bf16 heads of `d`) rotated as `attention` rotates it (f32), as f64:
/// element `[row][head*d + c]`.
fn rotated(t: &T, p: &Problem, theta: f64) -> Vec<f64> {
    let mut values = t.values();
    let width = t.row_bytes / 2;
    let mut angles = Vec::new();
    for (r, row) in values.chunks_exact_mut(width).enumerate() {
        angles.clear();
        push_rope_angles(&mut angles, theta, p.d, r % p.s);
        for head in row.chunks_exact_mut(p.d) {
            rotate(head, &angles, p.d, false);
        }
    }
    values.iter().map(|&v| f64::from(v)).collect()
}

fn tolerances(p: &Problem, x: &Inputs, want: &[T; 5]) -> Tolerances {
    let (d, s, h, hk) = (p.d, p.s, p.heads, p.kv_heads);
    let theta = p.full_context().rope_theta;
    let scale = 1.0 / (d as f64).sqrt();
    let (q, k) = (rotated(&x.q, p, theta), rotated(&x.k, p, theta));
    let v: Vec<f64> = x.v.values().iter().map(|&a| f64::from(a)).collect();
    let dout: Vec<f64> = x.dout.values().iter().map(|&a| f64::from(a)).collect();
    let out: Vec<f64> = want[0].values().iter().map(|&a| f64::from(a)).collect();
    let rows = p.b * s;
    let (qw, kw) = (h * d, hk * d);
    let mut tol = Tolerances {
        out: vec![0.0; rows * qw],
        lse: vec![0.0; rows * h],
        dq: vec![0.0; rows * qw],
        dk: vec![0.0; rows * kw],
        dv: vec![0.0; rows * kw],
    };
    // Rotated-frame gradients and their error bounds, K/V heads summed over their query heads.
    let (mut gk, mut ek, mut ev) = (vec![0.0; rows * kw], vec![0.0; rows * kw], vec![0.0; rows * kw]);
    let (mut gq, mut eq) = (vec![0.0; rows * qw], vec![0.0; rows * qw]);
    for seq in 0..p.b {
        for head in 0..h {
            let kv = p.kv_of(head);
            let qa = |i: usize, c: usize| q[(seq * s + i) * qw + head * d + c];
            let ka = |j: usize, c: usize| k[(seq * s + j) * kw + kv * d + c];
            let va = |j: usize, c: usize| v[(seq * s + j) * kw + kv * d + c];
            let da = |i: usize, c: usize| dout[(seq * s + i) * qw + head * d + c];
            let oa = |i: usize, c: usize| out[(seq * s + i) * qw + head * d + c];
            let mut score = vec![vec![0.0f64; s]; s];
            let mut max_a = 0.0f64;
            for (i, score_i) in score.iter_mut().enumerate() {
                for (j, score_ij) in score_i.iter_mut().enumerate().take(i + 1) {
                    *score_ij = scale * (0..d).map(|c| qa(i, c) * ka(j, c)).sum::<f64>();
                    max_a = max_a.max(scale * (0..d).map(|c| (qa(i, c) * ka(j, c)).abs()).sum::<f64>());
                }
            }
            let lse: Vec<f64> = (0..s)
                .map(|i| {
                    let m = score[i][..=i].iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                    m + score[i][..=i].iter().map(|&z| (z - m).exp()).sum::<f64>().ln()
                })
                .collect();
            let max_lse = lse.iter().fold(0.0f64, |a, &b| a.max(b.abs()));
            let delta = 2.01 * U * max_a;
            let g = (s + d + 16) as f64 * 2f64.powi(-23) * (1.0 + max_lse + max_a);
            let rho = 2.0 * delta + g;
            let eta = rho.exp() - 1.0 + g;
            let pr = |i: usize, j: usize| if j <= i { (score[i][j] - lse[i]).exp() } else { 0.0 };
            let mut tol_out = vec![0.0f64; s * d];
            for i in 0..s {
                tol.lse[(seq * s + i) * h + head] = delta + g;
                for c in 0..d {
                    let e = eta * (0..=i).map(|j| pr(i, j) * va(j, c).abs()).sum::<f64>();
                    tol_out[i * d + c] = e + U * (2.0 * oa(i, c).abs() + e);
                    tol.out[(seq * s + i) * qw + head * d + c] = tol_out[i * d + c];
                }
            }
            for i in 0..s {
                let dd: f64 = (0..d).map(|c| da(i, c) * oa(i, c)).sum();
                let ed: f64 =
                    (0..d).map(|c| da(i, c).abs() * tol_out[i * d + c] + g * (da(i, c) * oa(i, c)).abs()).sum();
                for j in 0..=i {
                    let pij = pr(i, j);
                    let dp: f64 = (0..d).map(|c| da(i, c) * va(j, c)).sum();
                    let ds = pij * (dp - dd);
                    let eds = eta * pij * (dp - dd).abs() + rho.exp() * pij * ed;
                    for c in 0..d {
                        let (qi, kj) = ((seq * s + i) * qw + head * d + c, (seq * s + j) * kw + kv * d + c);
                        gq[qi] += scale * ds * ka(j, c);
                        eq[qi] += scale * (eds * ka(j, c).abs() * (1.0 + U) + ds.abs() * (U + g) * ka(j, c).abs());
                        gk[kj] += scale * ds * qa(i, c);
                        ek[kj] += scale * (eds * qa(i, c).abs() * (1.0 + U) + ds.abs() * (U + g) * qa(i, c).abs());
                        ev[kj] += eta * pij * da(i, c).abs();
                    }
                }
            }
        }
    }
    // The gradients' final roundings (and the ring's rotation back), per pair of elements.
    let finish = |grad: &[f64], err: &[f64], final_values: &[f32], tol: &mut [f64]| {
        for (pair, (gs, es)) in grad.chunks_exact(2).zip(err.chunks_exact(2)).enumerate() {
            let r: f64 = gs.iter().zip(es).map(|(&gx, &ex)| ex + U * (gx.abs() + ex)).sum::<f64>()
                + G_ROTATION * (gs[0].abs() + gs[1].abs());
            for e in 0..2 {
                let at = 2 * pair + e;
                tol[at] = r + U * (2.0 * f64::from(final_values[at]).abs() + r);
            }
        }
    };
    finish(&gq, &eq, &want[2].values(), &mut tol.dq);
    finish(&gk, &ek, &want[3].values(), &mut tol.dk);
    for ((t, &e), &w) in tol.dv.iter_mut().zip(&ev).zip(&want[4].values()) {
        *t = e + U * (2.0 * f64::from(w).abs() + e);
    }
    for t in tol.out.iter_mut().chain(&mut tol.lse).chain(&mut tol.dq).chain(&mut tol.dk).chain(&mut tol.dv) {
        *t *= 1.01;
    }
    tol
}

/// The f32 rounding of one rotation back, relative to the pair's magnitudes: `cos`, `sin`
/// rounded to f32, two products and a sum, on either side.
const G_ROTATION: f64 = 8.0 / (1u64 << 24) as f64;

/// Asserts `|got - want| <= tol` elementwise; returns the largest `error / tol`.
fn within(what: &str, got: &[f32], want: &[f32], tol: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    assert_eq!(got.len(), tol.len(), "{what}: tolerances");
    let mut worst = 0.0f64;
    for (i, ((&a, &b), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        let error = (f64::from(a) - f64::from(b)).abs();
        assert!(error <= t, "{what}[{i}]: ring {a}, attention {b}: error {error:e} above the bound {t:e}");
        if t > 0.0 {
            worst = worst.max(error / t);
        }
    }
    eprintln!("{what}: largest error {worst:.3} of the bound");
    worst
}

fn check_ring(p: Problem) {
    let x = inputs(&p);
    let got = simulate(&p, &x, 1);
    let want = reference(&p, &x);
    let tol = tolerances(&p, &x, &want);
    let what = format!("{p:?}");
    within(&format!("{what}: out"), &got.out.values(), &want[0].values(), &tol.out);
    within(&format!("{what}: lse"), &got.lse.f32_values(), &want[1].f32_values(), &tol.lse);
    within(&format!("{what}: dq"), &got.dq.values(), &want[2].values(), &tol.dq);
    within(&format!("{what}: dk"), &got.dk.values(), &want[3].values(), &tol.dk);
    within(&format!("{what}: dv"), &got.dv.values(), &want[4].values(), &tol.dv);
    // Load balance: at every step every rank launches the same area; per sequence `2n^2` pairs
    // at steps `i >= 1`, and `2n^2 + n` at step 0 (two causal diagonals and one full block).
    let n = p.n();
    for (k, steps) in got.areas.iter().enumerate() {
        for (i, &a) in steps.iter().enumerate() {
            let want = p.b * (2 * n * n + if i == 0 { n } else { 0 });
            assert_eq!(a, want, "{what}: rank {k} step {i} launches {a} query-key pairs, not {want}");
        }
    }
}

#[test]
fn the_ring_matches_attention_over_the_whole_sequence() {
    let p = |seed, c, b, s, heads, kv_heads, d| Problem { seed, c, b, s, heads, kv_heads, d, tp: Group::SINGLE };
    // c = 1: the blocks alone (one causal diagonal per sequence at step 0, split in two chunks).
    check_ring(p(1, 1, 1, 32, 2, 2, 8));
    check_ring(p(2, 1, 2, 64, 4, 2, 16));
    // c = 2 and 4, grouped-query heads (4 over 2, 2 over 1), several sequences.
    check_ring(p(3, 2, 2, 32, 4, 2, 16));
    check_ring(p(4, 2, 1, 64, 1, 1, 8));
    check_ring(p(5, 4, 1, 64, 4, 2, 8));
    check_ring(p(6, 4, 2, 48, 2, 1, 16));
    // Sequences longer than attention's key tile (64): its online softmax rescales, the blocks
    // do not.
    check_ring(p(8, 2, 1, 160, 2, 1, 8));
    // Tensor-parallel rank 1 of 2 with K and V replicated: 2 query heads here, 4 in the model,
    // over 2 K/V heads (K/V head 0 unused on this rank: its gradients are zero).
    check_ring(Problem { tp: Group { rank: 1, ranks: 2 }, ..p(9, 2, 1, 32, 2, 2, 8) });
    check_ring(Problem { tp: Group { rank: 0, ranks: 4 }, ..p(10, 4, 1, 32, 1, 2, 8) });
}

#[test]
fn the_ring_gives_the_same_bits_on_one_and_three_threads() {
    let p = Problem { seed: 7, c: 2, b: 1, s: 64, heads: 4, kv_heads: 2, d: 8, tp: Group::SINGLE };
    let x = inputs(&p);
    let (one, three) = (simulate(&p, &x, 1), simulate(&p, &x, 3));
    for (what, a, b) in [
        ("out", &one.out, &three.out),
        ("lse", &one.lse, &three.lse),
        ("dq", &one.dq, &three.dq),
        ("dk", &one.dk, &three.dk),
        ("dv", &one.dv, &three.dv),
    ] {
        assert!(a.data == b.data, "{what} differs between 1 and 3 threads");
    }
}

#[test]
fn rotary_rotates_each_row_by_its_ring_position() {
    // Rank k's rows rotated with its layout are the whole sequence's rows rotated at c = 1, bit
    // for bit, on any row range; and rotary_backward undoes rotary within two roundings.
    let (b, s, c, heads, d) = (2, 32, 4, 3, 8);
    let mut rng = Rng::new(11);
    let x = T::bf16(&rng.bf16_vec(b * s * heads * d, 2.0), b * s);
    let full = context(heads * d, heads, s, 1);
    let mut whole = x.clone();
    check(execute_on_rank(Op::Rotary, &mut [wr(&mut whole, 0, b * s)], &full, Group::SINGLE, 1));
    let p = Problem { seed: 0, c, b, s, heads, kv_heads: heads, d, tp: Group::SINGLE };
    let r = b * p.local();
    for k in 0..c {
        let ctx = p.rank_context(k);
        let rows = p.rank_rows(k);
        let mut local = pick(&x, &rows);
        check(execute_on_rank(Op::Rotary, &mut [wr(&mut local, 0, r)], &ctx, Group::SINGLE, 3));
        assert!(local.data == pick(&whole, &rows).data, "rank {k}: positions");
        // Rows [5, r) of the buffer alone: the same bits.
        let mut part = pick(&x, &rows);
        check(execute_on_rank(Op::Rotary, &mut [wr(&mut part, 5, r)], &ctx, Group::SINGLE, 1));
        assert!(part.data[5 * part.row_bytes..] == local.data[5 * local.row_bytes..], "rank {k}: row range");
        check(execute_on_rank(Op::RotaryBackward, &mut [wr(&mut local, 0, r)], &ctx, Group::SINGLE, 2));
        // bf16(R x) = R x + e with |e_c| <= u (|x_a| + |x_b|) (the pair (a, b) of c); rotated
        // back, each element moves by at most |e_a| + |e_b| <= 2u (|x_a| + |x_b|), then one more
        // rounding: 3u (|x_a| + |x_b|) covers both (and the f32 rotations' 2^-22).
        let back = local.values();
        for (got, want) in back.chunks_exact(2).zip(pick(&x, &rows).values().chunks_exact(2)) {
            let bound = 3.0 * 2.0f32.powi(-8) * (want[0].abs() + want[1].abs());
            for (a, e) in got.iter().zip(want) {
                assert!((a - e).abs() <= bound, "round trip: {a} vs {e} (bound {bound})");
            }
        }
    }
}

#[test]
fn merge_and_rounding_edge_cases() {
    let ctx = context(8, 1, 4, 1);
    // A block without keys changes nothing.
    let (mut acc, mut lse) = (T::f32s(&[1.0; 8], 1), T::f32s(&[0.5], 1));
    let (q, k) = (T::bf16(&[0.25; 8], 1), T::zeros(0, 16));
    let mut args = [rd(&q, 0, 1), rd(&k, 0, 0), rd(&k, 0, 0), wr(&mut acc, 0, 1), wr(&mut lse, 0, 1)];
    check(execute_on_rank(Op::AttentionBlock, &mut args, &ctx, Group::SINGLE, 1));
    assert_eq!((acc.f32_values(), lse.f32_values()), (vec![1.0; 8], vec![0.5]));
    // One key: o_b = v, l_b = score; merged with an equal accumulator, out stays, lse adds ln 2.
    let v = T::bf16(&[1.0; 8], 1);
    let k = T::bf16(&[0.0; 8], 1);
    let mut args = [rd(&q, 0, 1), rd(&k, 0, 1), rd(&v, 0, 1), wr(&mut acc, 0, 1), wr(&mut lse, 0, 1)];
    check(execute_on_rank(Op::AttentionBlock, &mut args, &ctx, Group::SINGLE, 1));
    let l = lse.f32_values()[0];
    assert!((l - (0.5f32.exp() + 1.0).ln()).abs() < 1e-6, "lse {l}");
    // to_bf16 rounds to nearest, ties to even.
    let x = T::f32s(&[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), -0.0, f32::NEG_INFINITY], 1);
    let mut y = T::zeros(1, 8);
    check(execute_on_rank(Op::ToBf16, &mut [rd(&x, 0, 1), wr(&mut y, 0, 1)], &ctx, Group::SINGLE, 1));
    assert_eq!(y.values()[..2], [1.0, 1.0 + 4.0 * 2f32.powi(-8)]);
    assert!(y.values()[2].is_sign_negative() && y.values()[3] == f32::NEG_INFINITY);
}

/// The ring's kernels (codes 34 to 42), each run through `execute_on_rank` as a plan's launch.
const OPS: [Op; 9] = [
    Op::Rotary,
    Op::RotaryBackward,
    Op::AttentionBlock,
    Op::AttentionBlockCausal,
    Op::AttentionRingInit,
    Op::AttentionRingFinish,
    Op::AttentionBlockBackward,
    Op::AttentionBlockBackwardCausal,
    Op::ToBf16,
];

/// Runs the kernel `which` (an index of [`OPS`]) on `args`, with 2 threads.
fn call(which: usize, args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    execute_on_rank(OPS[which], args, ctx, Group::SINGLE, 2)
}

/// `tensors` as arguments of a launch with `sig`: read ones as `Read`, the others `Write`.
fn args_for<'a>(sig: &[(&str, memo_plan_core::plan::Access)], tensors: &'a mut [T]) -> Vec<Arg<'a>> {
    tensors
        .iter_mut()
        .enumerate()
        .map(|(i, t)| {
            let data = match sig.get(i).map(|a| a.1) {
                Some(memo_plan_core::plan::Access::Read) => ArgData::Read(&t.data),
                _ => ArgData::Write(&mut t.data),
            };
            Arg { data, first_row: t.first_row, rows: t.rows, row_bytes: t.row_bytes }
        })
        .collect()
}

/// A valid launch of kernel `which` with 2 heads over 1 K/V head of dimension 4, 4 query rows
/// and (`keys`) key rows.
fn valid(which: usize, keys: usize) -> Vec<T> {
    let (q, kv) = (2 * 4, 4);
    let keys = if which == 3 || which == 7 { 4 } else { keys };
    match which {
        0 | 1 => vec![T::zeros(4, q * 2)],
        2 | 3 => {
            vec![T::zeros(4, q * 2), T::zeros(keys, kv * 2), T::zeros(keys, kv * 2), T::zeros(4, q * 4), T::zeros(4, 8)]
        }
        4 => vec![T::zeros(4, q * 4), T::zeros(4, 8)],
        5 | 8 => vec![T::zeros(4, q * 4), T::zeros(4, q * 2)],
        _ => vec![
            T::zeros(4, q * 2),
            T::zeros(keys, kv * 2),
            T::zeros(keys, kv * 2),
            T::zeros(4, q * 2),
            T::zeros(4, 8),
            T::zeros(4, q * 2),
            T::zeros(4, q * 4),
            T::zeros(keys, kv * 4),
            T::zeros(keys, kv * 4),
        ],
    }
}

#[test]
fn every_kernel_refuses_bad_launches_with_an_error() {
    let ctx = OpContext { kv_heads: 1, context_rank: 1, context_ranks: 2, ..context(8, 2, 4, 1) };
    for (which, op) in OPS.iter().enumerate() {
        let sig = op.signature();
        let mut ok = valid(which, 6);
        assert_eq!(call(which, &mut args_for(sig, &mut ok), &ctx), Ok(()), "kernel {which}");
        // One argument too few.
        let mut fewer = valid(which, 6);
        fewer.pop();
        assert!(call(which, &mut args_for(sig, &mut fewer), &ctx).is_err(), "kernel {which}: count");
        // Each argument one row short, then a row 2 bytes wider.
        for index in 0..sig.len() {
            for (drows, dbytes) in [(1usize, 0usize), (0, 2)] {
                let mut t = valid(which, 6);
                let a = &mut t[index];
                let (rows, row_bytes) = (a.rows.saturating_sub(drows), a.row_bytes + dbytes);
                *a = T::zeros(rows, row_bytes);
                let result = call(which, &mut args_for(sig, &mut t), &ctx);
                // A row fewer of the rotary ops' lone argument is still a launch; every other
                // change is refused, naming the argument.
                if matches!(which, 0 | 1) && drows == 1 {
                    assert_eq!(result, Ok(()), "kernel {which}: fewer rows");
                } else {
                    let error = result.expect_err(&format!("kernel {which} argument {index} {drows} {dbytes}"));
                    assert!(error.argument.is_some(), "kernel {which}: {error}");
                }
            }
        }
        // A read argument passed writable.
        if let Some(index) = sig.iter().position(|a| a.1 == memo_plan_core::plan::Access::Read) {
            let mut t = valid(which, 6);
            let mut copy = t[index].data.clone();
            let mut args = args_for(sig, &mut t);
            args[index].data = ArgData::Write(&mut copy);
            assert!(call(which, &mut args, &ctx).is_err(), "kernel {which}: access");
        }
    }
    // The context: no heads, a rank outside the ring, an odd rank sequence with c > 1.
    let mut x = valid(0, 6);
    let none = OpContext { heads: 0, ..ctx };
    assert!(call(0, &mut args_for(Op::Rotary.signature(), &mut x), &none).is_err());
    assert!(call(2, &mut args_for(Op::AttentionBlock.signature(), &mut valid(2, 6)), &none).is_err());
    let outside = OpContext { context_rank: 2, ..ctx };
    assert!(call(0, &mut args_for(Op::Rotary.signature(), &mut x), &outside).is_err());
    let odd = OpContext { seq_len: 5, ..ctx };
    assert!(call(1, &mut args_for(Op::RotaryBackward.signature(), &mut x), &odd).is_err());
    // A causal block with fewer keys than queries.
    let mut t = valid(2, 3);
    assert!(call(3, &mut args_for(Op::AttentionBlock.signature(), &mut t), &ctx).is_err());
}

#[test]
fn random_launches_never_panic() {
    let mut rng = Rng::new(99);
    for _ in 0..3000 {
        let which = rng.below(9);
        let sig = OPS[which].signature();
        let mut t = valid(which, 1 + rng.below(6));
        // Perturb a few arguments' rows and widths, sometimes the count.
        for _ in 0..rng.below(3) {
            let index = rng.below(t.len());
            let (rows, row_bytes) = (rng.below(7), rng.below(40));
            t[index] = T::zeros(rows, row_bytes);
            t[index].first_row = rng.below(1000);
        }
        if rng.below(10) == 0 {
            t.truncate(rng.below(t.len() + 1));
        }
        let ctx = OpContext {
            kv_heads: rng.below(3),
            kv_replicated: rng.below(4) == 0,
            context_rank: rng.below(4),
            context_ranks: rng.below(4),
            ..context(rng.below(20), rng.below(4), rng.below(9), 1)
        };
        let _ = call(which, &mut args_for(sig, &mut t), &ctx);
    }
    // Huge numbers in the context and layout.
    let ctx = OpContext {
        kv_heads: usize::MAX,
        context_rank: usize::MAX - 1,
        context_ranks: usize::MAX,
        ..context(usize::MAX, usize::MAX, usize::MAX, 1)
    };
    for (which, op) in OPS.iter().enumerate() {
        let sig = op.signature();
        let mut t = valid(which, 6);
        let _ = call(which, &mut args_for(sig, &mut t), &ctx);
    }
}
