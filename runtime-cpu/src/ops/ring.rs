//! Context-parallel ring attention (`spec/context-parallel.md`, op codes 34 to 42): the rotary
//! rotation on its own, attention over one block of queries and keys merged into a running
//! accumulator, the accumulator's start and end, the block's backward into travelling f32
//! accumulators, and the f32 to bf16 rounding.
//!
//! `execute_on_rank` checks each launch against the op table's rules first; each kernel also
//! checks what it reads (its arguments against the op's signature, the heads against the
//! context), so none panics on a launch made elsewhere. Positions come from the context's
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

use memo_plan_core::plan::shapes::AttentionShape;
use memo_plan_core::plan::{Access, Op};

use super::attention::{
    backward_tile, finish_row, gather_rows, pack_lanes, push_rope_angles, rotate, row, row_delta, softmax_tile,
    BackwardKeys, Keys, QueryRow,
};
use super::parallel::{for_each_chunk, map_tasks};
use super::tensor::{
    bf16_bits_to_f32, f32_to_bf16_bytes, f32_vec, shape_context, split_signature, to_u64, In, Out, BF16, WORD,
};
use super::{Arg, Group, OpContext, OpError, OpErrorKind};

/// Rows per chunk of the row-wise kernels' threads.
const CHUNK_ROWS: usize = 64;

/// A shape error of argument `name`.
fn shape_error(op: Op, name: &'static str, expected: String, found: String) -> OpError {
    OpError { op, argument: Some(name), kind: OpErrorKind::Shape { expected, found } }
}

/// `rows` rows, `row_bytes` bytes per row, or a shape error naming `name`.
fn want(
    op: Op,
    name: &'static str,
    (rows, row_bytes): (usize, usize),
    expected: (usize, usize),
    why: &str,
) -> Result<(), OpError> {
    if (rows, row_bytes) == expected {
        return Ok(());
    }
    let expected = format!("{} rows of {} bytes ({why})", expected.0, expected.1);
    Err(shape_error(op, name, expected, format!("{rows} rows of {row_bytes} bytes")))
}

/// The head dimension of the rotary ops: `hidden / (heads * t)` (the context's `heads` are this
/// rank's share of the model's), even and positive.
fn rotary_head_dim(op: Op, ctx: &OpContext, group: Group) -> Result<usize, OpError> {
    let all_heads = ctx.heads.saturating_mul(group.ranks.max(1));
    let head_dim = ctx.hidden.checked_div(all_heads).unwrap_or(0);
    if all_heads == 0 || !ctx.hidden.is_multiple_of(all_heads) || head_dim == 0 || !head_dim.is_multiple_of(2) {
        let problem = format!(
            "is {}; it must be the {all_heads} query heads of the model ({} on this rank) times an even, positive \
             head dimension (rotary positions rotate pairs)",
            ctx.hidden, ctx.heads
        );
        return Err(OpError::context(op, "hidden", problem));
    }
    Ok(head_dim)
}

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
    let sig = op.signature();
    let first_row = args.first().map_or(0, |arg| arg.first_row);
    let ([], [x], _) = split_signature::<0, 1>(op, sig, args)?;
    let layout = shape_context(ctx, group);
    // Every row's position exists (the layout is whole) and the last one fits: checked once here,
    // so the loop below reads them without failing.
    let last_row = first_row.checked_add(x.rows.saturating_sub(1)).map(to_u64);
    if layout.position(0).is_none() || last_row.and_then(|row| layout.position(row)).is_none() {
        let problem = format!(
            "`seq_len` {} with context rank {} of {}: the rank's rows of one sequence must be two equal chunks of \
             a sequence whose positions fit",
            ctx.seq_len, ctx.context_rank, ctx.context_ranks
        );
        return Err(OpError::context(op, "context_rank", problem));
    }
    let head_dim = rotary_head_dim(op, ctx, group)?;
    let head_bytes = head_dim * BF16;
    if !x.row_bytes.is_multiple_of(head_bytes) {
        let expected = format!("rows of whole heads of {head_dim} bf16 ({head_bytes} bytes)");
        return Err(shape_error(op, sig[0].0, expected, format!("{} bytes per row", x.row_bytes)));
    }
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

/// The heads of a block launch, checked as `attention` checks them (`shapes::attention`): the
/// context's heads and K/V heads, the head dimension from `q`'s row, `k` and `v` alike.
struct Block {
    shape: AttentionShape,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    q_rows: usize,
    k_rows: usize,
}

impl Block {
    fn new(
        op: Op,
        sig: &[(&'static str, Access)],
        ctx: &OpContext,
        group: Group,
        q: &In<'_>,
        k: &In<'_>,
        v: &In<'_>,
    ) -> Result<Self, OpError> {
        let heads = ctx.heads;
        let kv_heads = if ctx.kv_heads == 0 { heads } else { ctx.kv_heads };
        if heads == 0 {
            return Err(OpError::context(op, "heads", "is 0; attention needs at least one head".into()));
        }
        let ranks = group.ranks.max(1);
        let (all_heads, first_query) = if ctx.kv_replicated {
            if group.rank >= ranks {
                let problem = format!("is {}, but the group has {ranks} rank(s)", group.rank);
                return Err(OpError::context(op, "rank", problem));
            }
            (heads.saturating_mul(ranks), group.rank.saturating_mul(heads))
        } else {
            (heads, 0)
        };
        if kv_heads == 0 || !all_heads.is_multiple_of(kv_heads) || (!ctx.kv_replicated && kv_heads > heads) {
            let problem = format!(
                "is {kv_heads}; it must divide the query heads {all_heads} (grouped-query attention), and be at most \
                 the {heads} query heads of this rank unless K and V are replicated"
            );
            return Err(OpError::context(op, "kv_heads", problem));
        }
        let elems = q.row_bytes / BF16;
        let head_dim = elems / heads;
        if !q.row_bytes.is_multiple_of(BF16)
            || !elems.is_multiple_of(heads)
            || head_dim == 0
            || !head_dim.is_multiple_of(2)
        {
            let expected = format!("a row of `heads` ({heads}) heads of an even, positive head dimension");
            return Err(shape_error(op, sig[0].0, expected, format!("{} bytes per row", q.row_bytes)));
        }
        let kv_row = kv_heads.saturating_mul(head_dim).saturating_mul(BF16);
        let why = "`kv_heads` heads of `q`'s head dimension";
        want(op, sig[1].0, (k.rows, k.row_bytes), (k.rows, kv_row), why)?;
        want(op, sig[2].0, (v.rows, v.row_bytes), (k.rows, kv_row), "the rows and width of `k`")?;
        let shape = AttentionShape {
            heads: heads as u64,
            kv_heads: kv_heads as u64,
            group: (all_heads / kv_heads) as u64,
            first_query: first_query as u64,
            head_dim: head_dim as u64,
            seq_len: 0,
            sequences: 0,
        };
        Ok(Block { shape, heads, kv_heads, head_dim, q_rows: q.rows, k_rows: k.rows })
    }

    fn kv_head(&self, head: usize) -> usize {
        usize::try_from(self.shape.kv_head(head as u64)).unwrap_or(usize::MAX)
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Bytes of an f32 row of `heads` heads (`out_acc`, `dq_acc`).
    fn acc_row(&self) -> usize {
        self.heads.saturating_mul(self.head_dim).saturating_mul(WORD)
    }

    /// Bytes of an f32 row of `kv_heads` heads (`dk_acc`, `dv_acc`).
    fn kv_acc_row(&self) -> usize {
        self.kv_heads.saturating_mul(self.head_dim).saturating_mul(WORD)
    }

    /// Checks the causal mask's square block.
    fn check_causal(&self, op: Op, sig: &[(&'static str, Access)], causal: bool) -> Result<(), OpError> {
        if causal && self.k_rows != self.q_rows {
            let expected = format!("{} rows (a diagonal block has as many keys as queries)", self.q_rows);
            return Err(shape_error(op, sig[1].0, expected, format!("{} rows", self.k_rows)));
        }
        Ok(())
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
    let sig = op.signature();
    let ([q, k, v], [out_acc, lse], _) = split_signature::<3, 2>(op, sig, args)?;
    let b = Block::new(op, sig, ctx, group, &q, &k, &v)?;
    b.check_causal(op, sig, causal)?;
    want(op, sig[3].0, (out_acc.rows, out_acc.row_bytes), (b.q_rows, b.acc_row()), "f32 rows of `q`'s heads")?;
    want(
        op,
        sig[4].0,
        (lse.rows, lse.row_bytes),
        (b.q_rows, b.heads.saturating_mul(WORD)),
        "one f32 per head of `q`'s rows",
    )?;
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
pub(crate) fn attention_ring_init(op: Op, args: &mut [Arg<'_>], ctx: &OpContext) -> Result<(), OpError> {
    let sig = op.signature();
    let ([], [out_acc, lse], _) = split_signature::<0, 2>(op, sig, args)?;
    let heads = ctx.heads;
    if heads == 0 {
        return Err(OpError::context(op, "heads", "is 0; attention needs at least one head".into()));
    }
    let head_bytes = heads.saturating_mul(WORD);
    if !out_acc.row_bytes.is_multiple_of(head_bytes) {
        let expected = format!("rows of `heads` ({heads}) heads of f32");
        return Err(shape_error(op, sig[0].0, expected, format!("{} bytes per row", out_acc.row_bytes)));
    }
    want(op, sig[1].0, (lse.rows, lse.row_bytes), (out_acc.rows, head_bytes), "one f32 per head of `out_acc`'s rows")?;
    out_acc.bytes.fill(0);
    for word in lse.bytes.chunks_exact_mut(WORD) {
        word.copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
    }
    Ok(())
}

/// `attention_ring_finish` (code 39): `out = bf16(out_acc)`.
pub(crate) fn attention_ring_finish(op: Op, args: &mut [Arg<'_>]) -> Result<(), OpError> {
    round_rows(op, args)
}

/// `to_bf16` (code 42): `y = bf16(x)`, round to nearest even.
pub(crate) fn to_bf16(op: Op, args: &mut [Arg<'_>]) -> Result<(), OpError> {
    round_rows(op, args)
}

/// `y = bf16(x)` for an f32 `x` and a bf16 `y` of the same rows and elements.
fn round_rows(op: Op, args: &mut [Arg<'_>]) -> Result<(), OpError> {
    let sig = op.signature();
    let ([x], [y], _) = split_signature::<1, 1>(op, sig, args)?;
    if !x.row_bytes.is_multiple_of(WORD) {
        let expected = "rows of whole f32 (a multiple of 4 bytes)".to_string();
        return Err(shape_error(op, sig[0].0, expected, format!("{} bytes per row", x.row_bytes)));
    }
    want(op, sig[1].0, (y.rows, y.row_bytes), (x.rows, x.row_bytes / WORD * BF16), "a bf16 for each f32 of the input")?;
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
    let sig = op.signature();
    let ([q, k, v, out, lse, dout], [mut dq_acc, mut dk_acc, mut dv_acc], _) = split_signature::<6, 3>(op, sig, args)?;
    let b = Block::new(op, sig, ctx, group, &q, &k, &v)?;
    b.check_causal(op, sig, causal)?;
    want(op, sig[3].0, (out.rows, out.row_bytes), (b.q_rows, q.row_bytes), "the rows and width of `q`")?;
    want(
        op,
        sig[4].0,
        (lse.rows, lse.row_bytes),
        (b.q_rows, b.heads.saturating_mul(WORD)),
        "one f32 per head of `q`'s rows",
    )?;
    want(op, sig[5].0, (dout.rows, dout.row_bytes), (b.q_rows, q.row_bytes), "the rows and width of `q`")?;
    want(op, sig[6].0, (dq_acc.rows, dq_acc.row_bytes), (b.q_rows, b.acc_row()), "f32 rows of `q`'s heads")?;
    want(op, sig[7].0, (dk_acc.rows, dk_acc.row_bytes), (b.k_rows, b.kv_acc_row()), "f32 rows of `k`'s heads")?;
    want(op, sig[8].0, (dv_acc.rows, dv_acc.row_bytes), (b.k_rows, b.kv_acc_row()), "f32 rows of `k`'s heads")?;
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
