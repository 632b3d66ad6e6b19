//! Context-parallel ring attention (`spec/context-parallel.md`, op codes 34 to 42): the rotary
//! rotation on its own, attention over one block of queries and keys merged into a running
//! accumulator, the accumulator's start and end, the block's backward into travelling f32
//! accumulators, and the f32 to bf16 rounding.
//!
//! Each kernel splits its arguments as every kernel does (`tensor::split_in`: the signature,
//! then the op table's shape rules, `shapes::check`), and takes the block's heads and rows from
//! what those rules found, so a launch made elsewhere is refused with the error every backend
//! gives, never a panic. Positions come from the context's
//! `context_rank` and `context_ranks` through `ShapeContext::position`, the one place they are
//! defined.
//!
//! Layout: `q`, `out`, `dout` are rows of `heads * head_dim` bf16, `k`, `v` rows of
//! `kv_heads * head_dim` bf16 (as `attention`); `out_acc`, `dq_acc` rows of `heads * head_dim`
//! f32, `dk_acc`, `dv_acc` rows of `kv_heads * head_dim` f32, `lse` rows of `heads` f32. A block
//! kernel's regions are any rows: the ring step picks them (one sequence's chunks), the kernel
//! reads no positions (`q` and `k` come rotated).
//!
//! Numerics: the block's scores and its output are `attention`'s arithmetic (the shared
//! `softmax_tile` and `backward_tile` of `attention.rs` with the whole key range as one tile: each query row's
//! scores in full, keys in increasing order); `rotary` is `attention`'s own rotation
//! (`rotate` with `push_rope_angles`) rounded once to bf16. Threads take whole heads, and no
//! two threads add into the same number, so the bits do not depend on the thread count.

use memo_plan_core::plan::shapes::{self, AttentionShape, OpShape};
use memo_plan_core::plan::Op;

use super::attention::{
    backward_tile, finish_row, gather_rows, pack_lanes, push_rope_angles, rotate, row, row_delta, softmax_tile,
    BackwardKeys, Keys, QueryRow,
};
use super::parallel::{for_each_chunk, map_tasks};
use super::tensor::{bf16_bits_to_f32, f32_to_bf16_bytes, f32_vec, shape_context, split_in, to_u64, Out, BF16, WORD};
use super::{Arg, Group, OpContext, OpError};

/// Rows per chunk of the row-wise kernels' threads.
const CHUNK_ROWS: usize = 64;

/// `rotary` (code 34, `inverse` false): rotates pairs `(2i, 2i+1)` of every head of every row of
/// `x` (in place) by the row's position (`ShapeContext::position` of `first_row + i`, from the
/// context's `context_rank` and `context_ranks`), `attention`'s rotation in f32, rounded once;
/// heads: `row_bytes / 2 / head_dim`. `rotary_backward` (code 35, `inverse` true): the angle
/// negated at the same positions, the gradient of the un-rotated input.
pub(crate) fn rotary(
    op: Op,
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    group: Group,
    threads: usize,
    inverse: bool,
) -> Result<(), OpError> {
    let first_row = args.first().map_or(0, |arg| arg.first_row);
    let ([], [x], _) = split_in::<0, 1>(op, args, ctx, group)?;
    let layout = shape_context(ctx, group);
    // The op table checked the layout gives positions; the launch's last row's must fit too, so
    // the loop below reads every one without failing.
    let last_row = first_row.checked_add(x.rows.saturating_sub(1)).map(to_u64);
    if last_row.and_then(|row| layout.position(row)).is_none() {
        let problem = format!(
            "`seq_len` {} with context rank {} of {}: the rank's rows of one sequence must be two equal chunks of \
             a sequence whose positions fit",
            ctx.seq_len, ctx.context_rank, ctx.context_ranks
        );
        return Err(OpError::context(op, "context_rank", problem));
    }
    // The op table checked the rows are whole heads of this head dimension.
    let head_dim = usize::try_from(shapes::head_dim(op, &layout)?).unwrap_or(usize::MAX);
    if x.rows == 0 || x.row_bytes == 0 {
        return Ok(());
    }
    let (seq_len, row_bytes, theta) = (ctx.seq_len, x.row_bytes, ctx.rope_theta);
    // Row `first_row + i` without overflow: its offset in its sequence.
    let base = first_row % seq_len;
    for_each_chunk(x.bytes, CHUNK_ROWS * row_bytes, threads, |chunk_index, chunk| {
        let mut angles = Vec::with_capacity(head_dim / 2);
        let mut values = vec![0.0f32; row_bytes / BF16];
        for (r, bytes) in chunk.chunks_exact_mut(row_bytes).enumerate() {
            let i = chunk_index * CHUNK_ROWS + r;
            let pos = layout.position(to_u64(base + i % seq_len)).map_or(0, |p| usize::try_from(p).unwrap_or(0));
            angles.clear();
            push_rope_angles(&mut angles, theta, head_dim, pos);
            for (value, pair) in values.iter_mut().zip(bytes.chunks_exact(BF16)) {
                *value = bf16_bits_to_f32(pair[0], pair[1]);
            }
            for head in values.chunks_exact_mut(head_dim) {
                rotate(head, &angles, head_dim, inverse);
            }
            for (pair, &value) in bytes.chunks_exact_mut(BF16).zip(&values) {
                pair.copy_from_slice(&f32_to_bf16_bytes(value));
            }
        }
    });
    Ok(())
}

/// The heads and rows of a block launch, as the op table's rules found them
/// (`shapes::attention_block`: its geometry, its query rows and its key rows).
struct Block {
    shape: AttentionShape,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    q_rows: usize,
    k_rows: usize,
}

impl Block {
    fn of(op: Op, shape: &OpShape) -> Result<Self, OpError> {
        let Some(geometry) = shape.attention else {
            return Err(OpError::context(op, "heads", "the op table gave the block no attention geometry".into()));
        };
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Ok(Block {
            shape: geometry,
            heads: size(geometry.heads),
            kv_heads: size(geometry.kv_heads),
            head_dim: size(geometry.head_dim),
            q_rows: size(shape.rows),
            k_rows: size(shape.features),
        })
    }

    fn kv_head(&self, head: usize) -> usize {
        usize::try_from(self.shape.kv_head(head as u64)).unwrap_or(usize::MAX)
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Keys query row `i` sees: `0..=i` in a causal block, all of them in the others.
    fn keys_of(&self, i: usize, causal: bool) -> usize {
        if causal {
            (i + 1).min(self.k_rows)
        } else {
            self.k_rows
        }
    }
}

/// Reads little-endian f32 `at` of `bytes` (0.0 past the end).
fn f32_at(bytes: &[u8], at: usize) -> f32 {
    bytes.get(at * WORD..(at + 1) * WORD).map_or(0.0, |w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

/// Writes little-endian f32 `value` `at` of `bytes` (nothing past the end).
fn set_f32(bytes: &mut [u8], at: usize, value: f32) {
    if let Some(word) = bytes.get_mut(at * WORD..(at + 1) * WORD) {
        word.copy_from_slice(&value.to_le_bytes());
    }
}

/// Merges a block's `o_b`, `l_b` into one accumulator row (one head): with `m = max(lse, l_b)`,
/// `l = m + ln(exp(lse - m) + exp(l_b - m))`, `out_acc = out_acc * exp(lse - l) + o_b *
/// exp(l_b - l)` (each product rounded, then the sum; f32), `lse = l`. A block without keys
/// (`l_b = -inf`) changes nothing; an empty accumulator (`lse = -inf`) takes `o_b`, `l_b` as
/// they are (what the formula gives for a finite `out_acc`).
fn merge(acc: &mut [f32], lse: &mut f32, o_b: &[f32], l_b: f32) {
    if l_b == f32::NEG_INFINITY {
        return;
    }
    if *lse == f32::NEG_INFINITY {
        for (a, &o) in acc.iter_mut().zip(o_b) {
            *a = o;
        }
        *lse = l_b;
        return;
    }
    let m = lse.max(l_b);
    let l = m + ((*lse - m).exp() + (l_b - m).exp()).ln();
    let (wa, wb) = ((*lse - l).exp(), (l_b - l).exp());
    for (a, &o) in acc.iter_mut().zip(o_b) {
        *a = *a * wa + o * wb;
    }
    *lse = l;
}

/// `attention_block` (code 36; `causal` false): every q row attends every k row (no mask); the
/// block's softmax-normalised output `o_b` and log-sum-exp `l_b` merged into `out_acc`, `lse`
/// (`lse = logaddexp(lse, l_b)`, `out_acc` reweighted: [`merge`]). `attention_block_causal`
/// (code 37; `causal` true): with a diagonal block's causal mask (q row `r` of its region sees k
/// rows `0..=r` of its region; equal rows).
pub(crate) fn attention_block(
    op: Op,
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    group: Group,
    threads: usize,
    causal: bool,
) -> Result<(), OpError> {
    let ([q, k, v], [out_acc, lse], shape) = split_in::<3, 2>(op, args, ctx, group)?;
    let b = Block::of(op, &shape)?;
    let (d, scale) = (b.head_dim, b.scale());
    let results = map_tasks(b.heads, threads, |head| {
        let kv = b.kv_head(head);
        let qh = gather_rows(q.bytes, q.row_bytes, b.q_rows, d, head);
        let kh = gather_rows(k.bytes, k.row_bytes, b.k_rows, d, kv);
        let vh = gather_rows(v.bytes, v.row_bytes, b.k_rows, d, kv);
        let kt = pack_lanes(&kh, b.k_rows, d);
        let mut scores = vec![0.0f32; b.k_rows];
        let mut out = vec![0.0f32; b.q_rows * d];
        let mut sums = vec![f32::NEG_INFINITY; b.q_rows];
        for (i, (acc, lse_i)) in out.chunks_exact_mut(d).zip(sums.iter_mut()).enumerate() {
            let keys = Keys { tiles: &kt, v: &vh, j0: 0, j1: b.keys_of(i, causal) };
            if keys.j1 == 0 {
                continue;
            }
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
            softmax_tile(row(&qh, d, i), &keys, scale, &mut scores, acc, (&mut max, &mut sum));
            *lse_i = finish_row(acc, max, sum);
        }
        (out, sums)
    });
    let mut acc = vec![0.0f32; d];
    for (head, (values, sums)) in results.iter().enumerate() {
        for (i, &l_b) in sums.iter().enumerate() {
            let lse_at = i * b.heads + head;
            let acc_at = lse_at * d;
            for (c, a) in acc.iter_mut().enumerate() {
                *a = f32_at(out_acc.bytes, acc_at + c);
            }
            let mut l = f32_at(lse.bytes, lse_at);
            merge(&mut acc, &mut l, row(values, d, i), l_b);
            for (c, &a) in acc.iter().enumerate() {
                set_f32(out_acc.bytes, acc_at + c, a);
            }
            set_f32(lse.bytes, lse_at, l);
        }
    }
    Ok(())
}

/// `attention_ring_init` (code 38): `out_acc = 0`, `lse = -inf` (rows of `heads` f32 and of
/// `heads` whole heads of f32).
pub(crate) fn attention_ring_init(op: Op, args: &mut [Arg<'_>], ctx: &OpContext, group: Group) -> Result<(), OpError> {
    let ([], [out_acc, lse], _) = split_in::<0, 2>(op, args, ctx, group)?;
    out_acc.bytes.fill(0);
    for word in lse.bytes.chunks_exact_mut(WORD) {
        word.copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
    }
    Ok(())
}

/// `attention_ring_finish` (code 39): `out = bf16(out_acc)`.
pub(crate) fn attention_ring_finish(
    op: Op,
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    group: Group,
) -> Result<(), OpError> {
    round_rows(op, args, ctx, group)
}

/// `to_bf16` (code 42): `y = bf16(x)`, round to nearest even.
pub(crate) fn to_bf16(op: Op, args: &mut [Arg<'_>], ctx: &OpContext, group: Group) -> Result<(), OpError> {
    round_rows(op, args, ctx, group)
}

/// `y = bf16(x)` for an f32 `x` and a bf16 `y` of the same rows and elements.
fn round_rows(op: Op, args: &mut [Arg<'_>], ctx: &OpContext, group: Group) -> Result<(), OpError> {
    let ([x], [y], _) = split_in::<1, 1>(op, args, ctx, group)?;
    for (pair, word) in y.bytes.chunks_exact_mut(BF16).zip(x.bytes.chunks_exact(WORD)) {
        pair.copy_from_slice(&f32_to_bf16_bytes(f32::from_le_bytes([word[0], word[1], word[2], word[3]])));
    }
    Ok(())
}

/// Gradients of one head of a block, before they are added to the accumulators.
struct BlockGradients {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// Adds `values` to the f32 rows of `acc` (rows of `row_len` f32), at element `offset` of each
/// row, `width` elements per row.
fn add_into(acc: &mut Out<'_>, values: &[f32], (offset, width): (usize, usize)) {
    let row_len = acc.row_bytes / WORD;
    for (r, src) in values.chunks_exact(width.max(1)).enumerate() {
        for (c, &value) in src.iter().enumerate() {
            let at = r * row_len + offset + c;
            let sum = f32_at(acc.bytes, at) + value;
            set_f32(acc.bytes, at, sum);
        }
    }
}

/// `attention_block_backward` (code 40; `causal` false): with the final `out` and `lse`, no
/// mask: `P = exp(scale q k^T - lse)`, `D = rowsum(dout * out)`, `dS = P (dout v^T - D)`;
/// `dq_acc += scale dS k`, `dk_acc += scale dS^T q`, `dv_acc += P^T dout` (f32; a K/V head sums
/// its query heads in head order; each accumulator element gets one add per launch).
/// `attention_block_backward_causal` (code 41; `causal` true): with the diagonal block's causal
/// mask.
pub(crate) fn attention_block_backward(
    op: Op,
    args: &mut [Arg<'_>],
    ctx: &OpContext,
    group: Group,
    threads: usize,
    causal: bool,
) -> Result<(), OpError> {
    let ([q, k, v, out, lse, dout], [mut dq_acc, mut dk_acc, mut dv_acc], shape) =
        split_in::<6, 3>(op, args, ctx, group)?;
    let b = Block::of(op, &shape)?;
    let (d, scale) = (b.head_dim, b.scale());
    let all_lse = f32_vec(lse.bytes);
    let results = map_tasks(b.heads, threads, |head| {
        let kv = b.kv_head(head);
        let qh = gather_rows(q.bytes, q.row_bytes, b.q_rows, d, head);
        let kh = gather_rows(k.bytes, k.row_bytes, b.k_rows, d, kv);
        let vh = gather_rows(v.bytes, v.row_bytes, b.k_rows, d, kv);
        let outh = gather_rows(out.bytes, out.row_bytes, b.q_rows, d, head);
        let douth = gather_rows(dout.bytes, dout.row_bytes, b.q_rows, d, head);
        let (kt, vt) = (pack_lanes(&kh, b.k_rows, d), pack_lanes(&vh, b.k_rows, d));
        let mut grads =
            BlockGradients { dq: vec![0.0; b.q_rows * d], dk: vec![0.0; b.k_rows * d], dv: vec![0.0; b.k_rows * d] };
        let mut scratch = (vec![0.0f32; b.k_rows], vec![0.0f32; b.k_rows]);
        for i in 0..b.q_rows {
            let (qi, douti) = (row(&qh, d, i), row(&douth, d, i));
            let lse_i = all_lse.get(i * b.heads + head).copied().unwrap_or(0.0);
            let query = QueryRow { q: qi, dout: douti, delta: row_delta(douti, row(&outh, d, i)), lse: lse_i };
            let keys = BackwardKeys { k: &kh, k_tiles: &kt, v_tiles: &vt, j0: 0, j1: b.keys_of(i, causal) };
            let dq = grads.dq.get_mut(i * d..(i + 1) * d).unwrap_or(&mut []);
            backward_tile(&query, &keys, scale, &mut scratch, (&mut grads.dk, &mut grads.dv, dq));
        }
        for value in grads.dq.iter_mut().chain(grads.dk.iter_mut()) {
            *value *= scale;
        }
        grads
    });
    for (head, grads) in results.iter().enumerate() {
        add_into(&mut dq_acc, &grads.dq, (head * d, d));
    }
    // Each K/V head: its query heads' sum in head order (the first taken as is), added once.
    for kv in 0..b.kv_heads {
        let mut users = (0..b.heads).filter(|&head| b.kv_head(head) == kv).filter_map(|head| results.get(head));
        let Some(first) = users.next() else { continue };
        let (mut dk_sum, mut dv_sum) = (first.dk.clone(), first.dv.clone());
        for grads in users {
            for (sum, &value) in dk_sum.iter_mut().zip(&grads.dk) {
                *sum += value;
            }
            for (sum, &value) in dv_sum.iter_mut().zip(&grads.dv) {
                *sum += value;
            }
        }
        add_into(&mut dk_acc, &dk_sum, (kv * d, d));
        add_into(&mut dv_acc, &dv_sum, (kv * d, d));
    }
    Ok(())
}
