//! Causal attention with rotary positions: the forward (online softmax over blocks of keys,
//! FlashAttention's recurrence) and its backward (FlashAttention-2's, from the saved output and
//! log-sum-exp). Nothing of size `s x s` is ever in memory: a query row meets one block of
//! [`KEY_BLOCK`] keys at a time.
//!
//! Layout: `q`, `out` and their gradients are `b*s` rows of `heads * head_dim` bf16 (head `h`
//! in elements `[h*head_dim, (h+1)*head_dim)`); `k`, `v` and theirs are `b*s` rows of
//! `kv_heads * head_dim` bf16; `lse` is `b*s` rows of `heads` f32. Row `r` is position `r % s`
//! of sequence `r / s`; a launch covers whole sequences.
//!
//! Grouped-query attention: query head `i` attends with K/V head `kv_head(i)` of the op table's
//! [`AttentionShape`] (`(first_query + i) / group`); with `kv_heads == heads` that is head `i`.
//! The backward's `dk` and `dv` of a K/V head sum the gradients of the query heads that use it,
//! in increasing query head order (f32, rounded once); a K/V head no query head of the launch
//! uses (K and V replicated) gets zeros.
//!
//! Rotary positions (RoPE, base `theta` = the context's `rope_theta`) rotate each pair
//! `(2i, 2i+1)` of a head of `q` and `k` by the angle `pos * theta^(-2i/head_dim)` inside the op:
//! the stored `q` and `k` are the projections' outputs, and the backward returns gradients with
//! respect to them.
//!
//! Each (sequence, query head) is one task on one thread; every sum runs in a fixed order
//! (scores sequentially over the head dimension, keys in increasing order, query heads of a K/V
//! head in increasing order), so the result does not depend on the thread count.

use memo_plan_core::plan::Op;

use super::parallel::map_tasks;
use memo_plan_core::plan::shapes::{AttentionShape, OpShape};

use super::tensor::{bf16_bits_to_f32, dim, f32_to_bf16_bytes, f32_vec, split_in, In, BF16, WORD};
use super::{Arg, Group, OpContext, OpError};

/// Keys per block of the online softmax (the score tile of one query row).
pub(crate) const KEY_BLOCK: usize = 64;

/// Shapes of one launch.
#[derive(Clone, Copy)]
struct Geometry {
    /// The op table's geometry (for [`AttentionShape::kv_head`]).
    shape: AttentionShape,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    seq_len: usize,
    sequences: usize,
    /// Bytes of a row of `q` (and `out`, `dout`, `dq`).
    row_bytes: usize,
    /// Bytes of a row of `k` (and `v`, `dk`, `dv`).
    kv_row_bytes: usize,
    /// RoPE's base.
    rope_theta: f64,
}

impl Geometry {
    /// The geometry the op table checked (`shape.attention`), with the row widths of `q` and
    /// `k` and the context's rotary base.
    fn new(shape: &OpShape, q: &In<'_>, k: &In<'_>, ctx: &OpContext) -> Result<Self, OpError> {
        let a = shape.attention_geometry()?;
        Ok(Geometry {
            shape: a,
            heads: dim(a.heads),
            kv_heads: dim(a.kv_heads),
            head_dim: dim(a.head_dim),
            seq_len: dim(a.seq_len),
            sequences: dim(a.sequences),
            row_bytes: q.row_bytes,
            kv_row_bytes: k.row_bytes,
            rope_theta: ctx.rope_theta,
        })
    }

    /// The K/V head query head `head` attends with.
    fn kv_head(&self, head: usize) -> usize {
        dim(self.shape.kv_head(head as u64))
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// `(cos, sin)` of the rotary angle for each position `< s` and pair `< head_dim / 2`.
fn rope_table(g: &Geometry) -> Vec<(f32, f32)> {
    let mut table = Vec::with_capacity(g.seq_len * (g.head_dim / 2));
    for pos in 0..g.seq_len {
        push_rope_angles(&mut table, g.rope_theta, g.head_dim, pos);
    }
    table
}

/// Appends `(cos, sin)` of the rotary angle `pos * theta^(-2i/head_dim)` for each pair
/// `i < head_dim / 2` to `table`: the angles of one position, computed in f64 and rounded to f32
/// (the one definition `attention` and the context-parallel `rotary` share).
pub(super) fn push_rope_angles(table: &mut Vec<(f32, f32)>, theta: f64, head_dim: usize, pos: usize) {
    for i in 0..head_dim / 2 {
        let inv_freq = theta.powf(-2.0 * i as f64 / head_dim as f64);
        let (sin, cos) = (pos as f64 * inv_freq).sin_cos();
        table.push((cos as f32, sin as f32));
    }
}

/// Rotates each row (`head_dim` wide) of `x` by its position's angles; `inverse` rotates back
/// (the transpose, for gradients).
pub(super) fn rotate(x: &mut [f32], table: &[(f32, f32)], head_dim: usize, inverse: bool) {
    let pairs = head_dim / 2;
    for (row, angles) in x.chunks_exact_mut(head_dim).zip(table.chunks_exact(pairs)) {
        for (pair, &(cos, sin)) in row.chunks_exact_mut(2).zip(angles) {
            let (a, b) = (pair[0], pair[1]);
            if inverse {
                pair[0] = a * cos + b * sin;
                pair[1] = b * cos - a * sin;
            } else {
                pair[0] = a * cos - b * sin;
                pair[1] = a * sin + b * cos;
            }
        }
    }
}

/// Head `head` of sequence `seq` of `x` (rows of `row_bytes`), as `s x head_dim` f32.
fn gather(x: &[u8], row_bytes: usize, g: &Geometry, seq: usize, head: usize) -> Vec<f32> {
    let start = seq * g.seq_len * row_bytes;
    let rows = x.get(start..start + g.seq_len * row_bytes).unwrap_or(&[]);
    gather_rows(rows, row_bytes, g.seq_len, g.head_dim, head)
}

/// Head `head` (`head_dim` wide) of the first `rows` rows of `x` (rows of `row_bytes` bf16
/// bytes), as `rows x head_dim` f32 (zeros where `x` is short).
pub(super) fn gather_rows(x: &[u8], row_bytes: usize, rows: usize, head_dim: usize, head: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * head_dim];
    let offset = head * head_dim * BF16;
    if row_bytes == 0 || head_dim == 0 {
        return out;
    }
    for (dst, row) in out.chunks_exact_mut(head_dim).zip(x.chunks_exact(row_bytes)) {
        let Some(src) = row.get(offset..offset + head_dim * BF16) else { continue };
        for (value, pair) in dst.iter_mut().zip(src.chunks_exact(BF16)) {
            *value = bf16_bits_to_f32(pair[0], pair[1]);
        }
    }
    out
}

/// Writes `values` (`s x head_dim`) as head `head` of sequence `seq` of `x` (bf16, rows of
/// `row_bytes`).
fn scatter(x: &mut [u8], row_bytes: usize, g: &Geometry, seq: usize, head: usize, values: &[f32]) {
    let start = seq * g.seq_len * row_bytes;
    let Some(rows) = x.get_mut(start..start + g.seq_len * row_bytes) else { return };
    let offset = head * g.head_dim * BF16;
    for (src, row) in values.chunks_exact(g.head_dim).zip(rows.chunks_exact_mut(row_bytes)) {
        let Some(dst) = row.get_mut(offset..offset + g.head_dim * BF16) else { continue };
        for (pair, &value) in dst.chunks_exact_mut(BF16).zip(src) {
            pair.copy_from_slice(&f32_to_bf16_bytes(value));
        }
    }
}

/// Lanes of the register tiles below (two 4-lane vectors on baseline x86-64).
const LANES: usize = 8;

/// An `s x d` matrix (keys or values of one head) as tiles of `LANES` rows: tile `t` holds
/// `[c][lane]` = row `t * LANES + lane`, element `c` (zero past `s`), so the dot products of one
/// query with `LANES` consecutive keys read one contiguous `d x LANES` block.
pub(super) fn pack_lanes(x: &[f32], s: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; s.div_ceil(LANES) * LANES * d];
    for (j, row) in x.chunks_exact(d).take(s).enumerate() {
        let base = (j / LANES) * LANES * d + j % LANES;
        for (c, &value) in row.iter().enumerate() {
            if let Some(slot) = out.get_mut(base + c * LANES) {
                *slot = value;
            }
        }
    }
    out
}

/// `out[j - j0] = sum_c row[c] * x[j][c]` for keys `j` in `[j0, j1)`, `tiles` being `x` packed
/// by [`pack_lanes`]. Each sum runs over `c` in order from 0.0, whatever the block bounds (a
/// tile's lanes outside `[j0, j1)` are computed and dropped), so forward and backward compute
/// bit-identical scores.
fn dots(row: &[f32], tiles: &[f32], j0: usize, j1: usize, out: &mut [f32]) {
    let d = row.len();
    if j1 <= j0 {
        return;
    }
    for tile in j0 / LANES..=(j1 - 1) / LANES {
        let Some(block) = tiles.get(tile * LANES * d..(tile + 1) * LANES * d) else { return };
        let (block, _) = block.as_chunks::<LANES>();
        let mut acc = [0.0f32; LANES];
        for (&a, lanes) in row.iter().zip(block) {
            for (t, &b) in acc.iter_mut().zip(lanes) {
                *t += a * b;
            }
        }
        for (lane, &value) in acc.iter().enumerate() {
            let j = tile * LANES + lane;
            if (j0..j1).contains(&j) {
                if let Some(slot) = out.get_mut(j - j0) {
                    *slot = value;
                }
            }
        }
    }
}

/// `acc += sum_j weights[j] * x[j0 + j]` over rows of `x` (`s x acc.len()`), each element
/// adding its terms in increasing `j`; `LANES` elements of `acc` stay in registers.
fn accumulate_rows(acc: &mut [f32], weights: &[f32], x: &[f32], j0: usize) {
    let d = acc.len();
    for (tile, chunk) in acc.chunks_mut(LANES).enumerate() {
        let c0 = tile * LANES;
        let mut t = [0.0f32; LANES];
        t[..chunk.len()].copy_from_slice(chunk);
        for (j, &w) in weights.iter().enumerate() {
            let at = (j0 + j) * d + c0;
            let Some(src) = x.get(at..at + chunk.len()) else { return };
            if let Ok(src) = <&[f32; LANES]>::try_from(src) {
                for (a, &b) in t.iter_mut().zip(src) {
                    *a += w * b;
                }
            } else {
                for (a, &b) in t.iter_mut().zip(src) {
                    *a += w * b;
                }
            }
        }
        chunk.copy_from_slice(&t[..chunk.len()]);
    }
}

/// `acc += p * x` elementwise.
#[inline]
fn axpy(acc: &mut [f32], p: f32, x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += p * b;
    }
}

/// Rows `j` of an `s x d` matrix.
#[inline]
pub(super) fn row(x: &[f32], d: usize, j: usize) -> &[f32] {
    x.get(j * d..(j + 1) * d).unwrap_or(&[])
}

/// One (sequence, head): the output (`s x head_dim`) and log-sum-exp (`s`), keys in blocks of
/// `key_block`.
fn forward_head(q: &[f32], k: &[f32], v: &[f32], g: &Geometry, key_block: usize) -> (Vec<f32>, Vec<f32>) {
    let (s, d, scale) = (g.seq_len, g.head_dim, g.scale());
    let kt = pack_lanes(k, s, d);
    let mut out = vec![0.0f32; s * d];
    let mut lse = vec![0.0f32; s];
    let mut scores = vec![0.0f32; key_block];
    for (i, lse_i) in lse.iter_mut().enumerate() {
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
        let Some(acc) = out.get_mut(i * d..(i + 1) * d) else { break };
        let qi = row(q, d, i);
        let mut j0 = 0;
        while j0 <= i {
            let j1 = (j0 + key_block).min(i + 1);
            let keys = Keys { tiles: &kt, v, j0, j1 };
            softmax_tile(qi, &keys, scale, &mut scores, acc, (&mut max, &mut sum));
            j0 = j1;
        }
        *lse_i = finish_row(acc, max, sum);
    }
    (out, lse)
}

/// Keys `[j0, j1)` of one head: `k` packed by [`pack_lanes`] and `v` (`s x head_dim`).
pub(super) struct Keys<'a> {
    pub tiles: &'a [f32],
    pub v: &'a [f32],
    pub j0: usize,
    pub j1: usize,
}

/// One step of the online softmax of query row `qi` over the keys `[j0, j1)`: their scaled
/// scores (sequential over the head dimension), the new maximum, `acc` rescaled and the keys'
/// `exp(score - max) * v` added in key order, and the running `(max, sum)` updated. `scores`
/// holds at least `j1 - j0` values (scratch).
pub(super) fn softmax_tile(
    qi: &[f32],
    keys: &Keys<'_>,
    scale: f32,
    scores: &mut [f32],
    acc: &mut [f32],
    (max, sum): (&mut f32, &mut f32),
) {
    let (j0, j1) = (keys.j0, keys.j1);
    let Some(block) = scores.get_mut(..j1.saturating_sub(j0)) else { return };
    dots(qi, keys.tiles, j0, j1, block);
    let mut block_max = f32::NEG_INFINITY;
    for score in block.iter_mut() {
        *score *= scale;
        block_max = block_max.max(*score);
    }
    let new_max = max.max(block_max);
    let correction = (*max - new_max).exp();
    let mut block_sum = 0.0f32;
    for score in block.iter_mut() {
        *score = (*score - new_max).exp();
        block_sum += *score;
    }
    *sum = *sum * correction + block_sum;
    for a in acc.iter_mut() {
        *a *= correction;
    }
    accumulate_rows(acc, block, keys.v, j0);
    *max = new_max;
}

/// Ends a query row's online softmax: `acc /= sum`, and returns the natural log-sum-exp
/// `max + ln(sum)`.
pub(super) fn finish_row(acc: &mut [f32], max: f32, sum: f32) -> f32 {
    for a in acc.iter_mut() {
        *a /= sum;
    }
    max + sum.ln()
}

/// `attention`: `out, lse = attention(rope(q), rope(k), v)`, causal within each sequence, as
/// rank `group.rank` (which query heads of replicated K/V heads this launch has).
pub(crate) fn forward(args: &mut [Arg<'_>], ctx: &OpContext, group: Group, threads: usize) -> Result<(), OpError> {
    forward_on_rank(args, ctx, group, threads, KEY_BLOCK)
}

/// [`forward`] on one GPU with another key block (tests cover several blocks with short
/// sequences).
#[cfg(test)]
pub(crate) fn forward_blocked(
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    threads: usize,
    key_block: usize,
) -> Result<(), OpError> {
    forward_on_rank(args, ctx, Group::SINGLE, threads, key_block)
}

/// [`forward`] with another key block.
pub(crate) fn forward_on_rank(
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    group: Group,
    threads: usize,
    key_block: usize,
) -> Result<(), OpError> {
    let op = Op::Attention;
    let ([q, k, v], [out, lse], shape) = split_in::<3, 2>(op, args, ctx, group)?;
    let g = Geometry::new(&shape, &q, &k, ctx)?;
    if g.sequences == 0 {
        return Ok(());
    }
    let table = rope_table(&g);
    let key_block = key_block.max(1);
    let results = map_tasks(g.sequences * g.heads, threads, |task| {
        let (seq, head) = (task / g.heads, task % g.heads);
        let kv = g.kv_head(head);
        let mut qh = gather(q.bytes, g.row_bytes, &g, seq, head);
        let mut kh = gather(k.bytes, g.kv_row_bytes, &g, seq, kv);
        rotate(&mut qh, &table, g.head_dim, false);
        rotate(&mut kh, &table, g.head_dim, false);
        forward_head(&qh, &kh, &gather(v.bytes, g.kv_row_bytes, &g, seq, kv), &g, key_block)
    });
    for (task, (values, sums)) in results.iter().enumerate() {
        let (seq, head) = (task / g.heads, task % g.heads);
        scatter(out.bytes, g.row_bytes, &g, seq, head, values);
        for (i, &value) in sums.iter().enumerate() {
            let at = ((seq * g.seq_len + i) * g.heads + head) * WORD;
            if let Some(word) = lse.bytes.get_mut(at..at + WORD) {
                word.copy_from_slice(&value.to_le_bytes());
            }
        }
    }
    Ok(())
}

/// Gradients of one (sequence, head) with respect to the rotated `q`, `k` and to `v`.
struct HeadGradients {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// Inputs of one (sequence, head) of the backward (`q`, `k` rotated).
struct HeadInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    out: &'a [f32],
    dout: &'a [f32],
    lse: &'a [f32],
}

/// FlashAttention-2's backward for one (sequence, head): with `D_i = dout_i . out_i` and
/// `p_ij = exp(s_ij - lse_i)` (the forward's scores, bit for bit): `dv_j += p_ij dout_i`,
/// `ds_ij = p_ij (dout_i . v_j - D_i)`, `dq_i += ds_ij k_j`, `dk_j += ds_ij q_i`, then `dq` and
/// `dk` times the scale. Query rows in order, keys in order within each.
fn backward_head(x: &HeadInputs<'_>, g: &Geometry, key_block: usize) -> HeadGradients {
    let (s, d, scale) = (g.seq_len, g.head_dim, g.scale());
    let kt = pack_lanes(x.k, s, d);
    let vt = pack_lanes(x.v, s, d);
    let mut grads = HeadGradients { dq: vec![0.0; s * d], dk: vec![0.0; s * d], dv: vec![0.0; s * d] };
    let mut scratch = (vec![0.0f32; key_block], vec![0.0f32; key_block]);
    for i in 0..s {
        let (qi, douti) = (row(x.q, d, i), row(x.dout, d, i));
        let query = QueryRow {
            q: qi,
            dout: douti,
            delta: row_delta(douti, row(x.out, d, i)),
            lse: x.lse.get(i).copied().unwrap_or(0.0),
        };
        let mut j0 = 0;
        while j0 <= i {
            let j1 = (j0 + key_block).min(i + 1);
            let keys = BackwardKeys { k: x.k, k_tiles: &kt, v_tiles: &vt, j0, j1 };
            let dq = grads.dq.get_mut(i * d..(i + 1) * d).unwrap_or(&mut []);
            backward_tile(&query, &keys, scale, &mut scratch, (&mut grads.dk, &mut grads.dv, dq));
            j0 = j1;
        }
    }
    for value in grads.dq.iter_mut().chain(grads.dk.iter_mut()) {
        *value *= scale;
    }
    grads
}

/// `D_i = dout_i . out_i`, summed over the head dimension in order.
pub(super) fn row_delta(dout: &[f32], out: &[f32]) -> f32 {
    dout.iter().zip(out).fold(0.0f32, |acc, (&a, &b)| acc + a * b)
}

/// One query row of the backward: rotated `q_i`, `dout_i`, `D_i` and the final `lse_i`.
pub(super) struct QueryRow<'a> {
    pub q: &'a [f32],
    pub dout: &'a [f32],
    pub delta: f32,
    pub lse: f32,
}

/// Keys `[j0, j1)` of one head for the backward: `k` (`s x head_dim`), and `k`, `v` packed by
/// [`pack_lanes`].
pub(super) struct BackwardKeys<'a> {
    pub k: &'a [f32],
    pub k_tiles: &'a [f32],
    pub v_tiles: &'a [f32],
    pub j0: usize,
    pub j1: usize,
}

/// FlashAttention-2's backward of query row `query` over the keys `[j0, j1)`, before the
/// scale: for each key `j` in order, `p = exp(score * scale - lse)`, `ds = p (dout . v_j - D)`,
/// `dv_j += p dout`, `dk_j += ds q`; then `dq_row += sum_j ds_j k_j` (keys in order). `dk` and
/// `dv` are `s x head_dim` (indexed by key), `scratch` two vectors of at least `j1 - j0`.
pub(super) fn backward_tile(
    query: &QueryRow<'_>,
    keys: &BackwardKeys<'_>,
    scale: f32,
    scratch: &mut (Vec<f32>, Vec<f32>),
    (dk, dv, dq_row): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let (j0, j1, d) = (keys.j0, keys.j1, query.q.len());
    let len = j1.saturating_sub(j0);
    let (Some(pb), Some(dpb)) = (scratch.0.get_mut(..len), scratch.1.get_mut(..len)) else { return };
    dots(query.q, keys.k_tiles, j0, j1, pb);
    dots(query.dout, keys.v_tiles, j0, j1, dpb);
    for (j, (score, dpj)) in (j0..j1).zip(pb.iter_mut().zip(dpb.iter_mut())) {
        let pj = (*score * scale - query.lse).exp();
        let ds = pj * (*dpj - query.delta);
        if let Some(dv) = dv.get_mut(j * d..(j + 1) * d) {
            axpy(dv, pj, query.dout);
        }
        if let Some(dk) = dk.get_mut(j * d..(j + 1) * d) {
            axpy(dk, ds, query.q);
        }
        *dpj = ds;
    }
    if dq_row.len() == d {
        accumulate_rows(dq_row, dpb, keys.k, j0);
    }
}

/// `attention_backward`: `dq, dk, dv` (overwritten) from `q, k, v, out, lse, dout`, through the
/// rotary rotation (gradients are with respect to the unrotated `q` and `k`). A K/V head's `dk`
/// and `dv` sum its query heads' in increasing query head order; unused K/V heads get zeros.
pub(crate) fn backward(args: &mut [Arg<'_>], ctx: &OpContext, group: Group, threads: usize) -> Result<(), OpError> {
    backward_on_rank(args, ctx, group, threads, KEY_BLOCK)
}

/// [`backward`] on one GPU with another key block.
#[cfg(test)]
pub(crate) fn backward_blocked(
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    threads: usize,
    key_block: usize,
) -> Result<(), OpError> {
    backward_on_rank(args, ctx, Group::SINGLE, threads, key_block)
}

/// [`backward`] with another key block.
pub(crate) fn backward_on_rank(
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    group: Group,
    threads: usize,
    key_block: usize,
) -> Result<(), OpError> {
    let op = Op::AttentionBackward;
    let ([q, k, v, out, lse, dout], [dq, dk, dv], shape) = split_in::<6, 3>(op, args, ctx, group)?;
    let g = Geometry::new(&shape, &q, &k, ctx)?;
    if g.sequences == 0 {
        return Ok(());
    }
    let table = rope_table(&g);
    let key_block = key_block.max(1);
    let all_lse = f32_vec(lse.bytes);
    let results = map_tasks(g.sequences * g.heads, threads, |task| {
        let (seq, head) = (task / g.heads, task % g.heads);
        let kv = g.kv_head(head);
        let mut qh = gather(q.bytes, g.row_bytes, &g, seq, head);
        let mut kh = gather(k.bytes, g.kv_row_bytes, &g, seq, kv);
        rotate(&mut qh, &table, g.head_dim, false);
        rotate(&mut kh, &table, g.head_dim, false);
        let lse_head: Vec<f32> = (0..g.seq_len)
            .map(|i| all_lse.get((seq * g.seq_len + i) * g.heads + head).copied().unwrap_or(0.0))
            .collect();
        let (vh, outh, douth) = (
            gather(v.bytes, g.kv_row_bytes, &g, seq, kv),
            gather(out.bytes, g.row_bytes, &g, seq, head),
            gather(dout.bytes, g.row_bytes, &g, seq, head),
        );
        let inputs = HeadInputs { q: &qh, k: &kh, v: &vh, out: &outh, dout: &douth, lse: &lse_head };
        let mut grads = backward_head(&inputs, &g, key_block);
        rotate(&mut grads.dq, &table, g.head_dim, true);
        rotate(&mut grads.dk, &table, g.head_dim, true);
        grads
    });
    for (task, grads) in results.iter().enumerate() {
        let (seq, head) = (task / g.heads, task % g.heads);
        scatter(dq.bytes, g.row_bytes, &g, seq, head, &grads.dq);
    }
    // Each K/V head: the sum of its query heads' gradients, in increasing query head order. The
    // first term is taken as is (not added to 0.0), so with one query head per K/V head the bits
    // are that head's own (a -0.0 stays -0.0).
    let zeros = vec![0.0f32; g.seq_len * g.head_dim];
    for seq in 0..g.sequences {
        for kv in 0..g.kv_heads {
            let mut users = (0..g.heads).filter(|&head| g.kv_head(head) == kv);
            let Some(first) = users.next().and_then(|head| results.get(seq * g.heads + head)) else {
                scatter(dk.bytes, g.kv_row_bytes, &g, seq, kv, &zeros);
                scatter(dv.bytes, g.kv_row_bytes, &g, seq, kv, &zeros);
                continue;
            };
            let (mut dk_sum, mut dv_sum) = (first.dk.clone(), first.dv.clone());
            for grads in users.filter_map(|head| results.get(seq * g.heads + head)) {
                for (sum, &value) in dk_sum.iter_mut().zip(&grads.dk) {
                    *sum += value;
                }
                for (sum, &value) in dv_sum.iter_mut().zip(&grads.dv) {
                    *sum += value;
                }
            }
            scatter(dk.bytes, g.kv_row_bytes, &g, seq, kv, &dk_sum);
            scatter(dv.bytes, g.kv_row_bytes, &g, seq, kv, &dv_sum);
        }
    }
    Ok(())
}
