//! Context parallelism in the step (`c > 1`, `spec/context-parallel.md`): rotary positions
//! applied after the Q and K projections, the ring attention's forward and backward with their
//! double-buffered exchanges on the collective stream, and the data group's sums of the
//! gradients and the loss.
//!
//! Context rank `k` holds chunks `k` and `2c-1-k` of each sequence (`n = s / 2c` rows each); a
//! step `i` of the ring works on the K/V of context rank `j = (k - i) mod c`. The launches of a
//! step differ between context ranks only in their row ranges, so every context rank's program
//! has the same instructions over the same buffers (the same lifetimes, one placement), and the
//! planner writes one program per context rank.

use alloc::vec::Vec;

use super::{Block, Builder, ScheduleError};
use crate::plan::shapes::attention_block_flops;
use crate::plan::{BufferKind, EventId, Op, Region, Stream, TensorRole};

/// Rotates the rows of `regions` (the Q or K rows a projection just wrote) by their positions.
pub(crate) fn rotary(b: &mut Builder, layer: u32, regions: &[Region]) {
    for &region in regions {
        b.launch(Op::Rotary, Some(layer), 0, &[region]);
    }
}

/// A region of rows `[start, end)` relative to `region`'s first row.
fn sub(region: Region, start: u64, end: u64) -> Region {
    Region::rows(region.buffer, region.start + start, region.start + end)
}

/// Rows `[start, end)`.
type Rows = (u64, u64);

/// The (query rows, key rows, causal) blocks of ring step `step` for one sequence whose rows
/// start at `base`: the load-balanced split of `spec/context-parallel.md` ("The ring").
fn step_blocks(b: &Builder, step: u64, base: u64) -> Vec<(Rows, Rows, bool)> {
    let shape = &b.shape;
    let (k, c, l) = (shape.context_rank, shape.context, shape.rank_seq);
    let n = l / 2;
    let (first, second, whole) = ((base, base + n), (base + n, base + l), (base, base + l));
    if step == 0 {
        return alloc::vec![(first, first, true), (second, first, false), (second, second, true)];
    }
    let source = (k + c - step % c) % c;
    if source < k {
        alloc::vec![(whole, first, false)]
    } else {
        alloc::vec![(second, whole, false)]
    }
}

/// The FLOPs of one block launch (`backward`: twice the forward's).
fn block_flops(b: &Builder, queries: u64, keys: u64, causal: bool, backward: bool) -> Result<u64, ScheduleError> {
    let elements = b.shape.head_row / 2;
    let op = if backward { "attention block backward" } else { "attention block" };
    let forward = attention_block_flops(queries, keys, elements, causal).ok_or(ScheduleError::FlopsOverflow { op })?;
    if backward {
        forward.checked_mul(2).ok_or(ScheduleError::FlopsOverflow { op })
    } else {
        Ok(forward)
    }
}

/// `count` (1 or 2) buffers (`slot` 0, 1) of `role`, `full_rows` x `row_bytes`, in `block`.
fn pair(b: &mut Builder, role: TensorRole, layer: u32, row_bytes: u64, block: Block, count: u8) -> Vec<Region> {
    let rows = b.shape.full_rows;
    (0..count)
        .map(|slot| {
            let id = b.buffer_in_slot(BufferKind::Transient, role, Some(layer), slot, rows, row_bytes, Some(block));
            b.all(id)
        })
        .collect()
}

/// The K/V ring buffers a ring of `c` ranks uses: two, one in use while the other receives;
/// one when `c = 2` (a single exchange; a second buffer would never be touched).
fn kv_buffers(c: u64) -> u8 {
    if c > 2 {
        2
    } else {
        1
    }
}

/// `ring_exchange` of each `(x, y)` on the collective stream; the caller orders it with events.
fn exchange(b: &mut Builder, layer: u32, pairs: &[(Region, Region)]) {
    for &(x, y) in pairs {
        b.launch_on(Stream::Collective, Op::RingExchange, Some(layer), 0, &[x, y]);
    }
}

/// The collective stream waits for everything compute has issued so far.
fn collective_after_compute(b: &mut Builder) {
    let ready = b.record(Stream::Compute);
    b.wait(Stream::Collective, ready);
}

/// The ring forward in place of `attention(q, k, v, out, lse)` (`args` in that order): the
/// accumulator initialised, step 0 on the local (rotated) K/V, steps `1..c` on the K/V received
/// into two ring buffers in turn (the exchange for step `i + 1` runs on the collective stream
/// while compute runs step `i`), then `out = bf16(out_acc)`.
pub(crate) fn forward(b: &mut Builder, layer: u32, block: Block, args: [Region; 5]) -> Result<(), ScheduleError> {
    let [q, k, v, out, lse] = args;
    let shape = b.shape;
    let l = Some(layer);
    let c = shape.context;
    let acc = b.buffer(
        BufferKind::Transient,
        TensorRole::AttentionOutputAccumulator,
        l,
        shape.full_rows,
        shape.head_row * 2,
        Some(block),
    );
    let acc = b.all(acc);
    let count = kv_buffers(c);
    let ring_k = pair(b, TensorRole::RingKey, layer, shape.kv_row, block, count);
    let ring_v = pair(b, TensorRole::RingValue, layer, shape.kv_row, block, count);
    let slot = |step: u64| (step % u64::from(count)) as usize;
    b.launch(Op::AttentionRingInit, l, 0, &[acc, lse]);
    // arrived[i]: step i's K/V is in its ring buffer (i >= 1).
    let mut arrived: Vec<Option<EventId>> = alloc::vec![None];
    // Step 1's K/V: this rank's own, once the projections (and rotary) wrote them.
    collective_after_compute(b);
    exchange(b, layer, &[(k, ring_k[0]), (v, ring_v[0])]);
    arrived.push(Some(b.record(Stream::Collective)));
    for step in 0..c {
        let hand = if step == 0 { (k, v) } else { (ring_k[slot(step - 1)], ring_v[slot(step - 1)]) };
        if let Some(Some(event)) = arrived.get(step as usize) {
            b.wait(Stream::Compute, *event);
        }
        if step >= 1 && step + 1 < c {
            // The other ring buffer was read by step `step - 1`, which compute has issued: the
            // exchange overwrites it after that.
            collective_after_compute(b);
            exchange(b, layer, &[(hand.0, ring_k[slot(step)]), (hand.1, ring_v[slot(step)])]);
            arrived.push(Some(b.record(Stream::Collective)));
        }
        // Validation makes `rank_seq` at least 2 at c > 1; 0 would give no blocks, not a panic.
        for sequence in 0..shape.full_rows.checked_div(shape.rank_seq).unwrap_or(0) {
            for (queries, keys, causal) in step_blocks(b, step, sequence * shape.rank_seq) {
                let flops = block_flops(b, queries.1 - queries.0, keys.1 - keys.0, causal, false)?;
                let op = if causal { Op::AttentionBlockCausal } else { Op::AttentionBlock };
                let (kr, vr) = (sub(hand.0, keys.0, keys.1), sub(hand.1, keys.0, keys.1));
                let (qr, ar, lr) =
                    (sub(q, queries.0, queries.1), sub(acc, queries.0, queries.1), sub(lse, queries.0, queries.1));
                b.launch(op, l, flops, &[qr, kr, vr, ar, lr]);
            }
        }
    }
    b.launch(Op::AttentionRingFinish, l, 0, &[acc, out]);
    Ok(())
}

/// The ring backward in place of `attention_backward(q, k, v, out, lse, dout, dq, dk, dv)`
/// (`args` in that order): `dq_acc` and step 0's `dk_acc`, `dv_acc` zeroed; per step the same
/// blocks as the forward's, their K/V exchanged ahead as in the forward, and after each step the
/// accumulators of the K/V in hand sent on (the `c`-th exchange brings each home); then the
/// gradients rounded to bf16 and rotated back.
pub(crate) fn backward(b: &mut Builder, layer: u32, block: Block, args: [Region; 9]) -> Result<(), ScheduleError> {
    let [q, k, v, out, lse, dout, dq, dk, dv] = args;
    let shape = b.shape;
    let l = Some(layer);
    let c = shape.context;
    let dq_acc = b.buffer(
        BufferKind::Transient,
        TensorRole::QueryGradientAccumulator,
        l,
        shape.full_rows,
        shape.head_row * 2,
        Some(block),
    );
    let dq_acc = b.all(dq_acc);
    let count = kv_buffers(c);
    let ring_k = pair(b, TensorRole::RingKey, layer, shape.kv_row, block, count);
    let ring_v = pair(b, TensorRole::RingValue, layer, shape.kv_row, block, count);
    let slot = |step: u64| (step % u64::from(count)) as usize;
    // Two accumulator buffers whatever c: each step's exchange sends one and receives the other.
    let acc_k = pair(b, TensorRole::KeyGradientAccumulator, layer, shape.kv_row * 2, block, 2);
    let acc_v = pair(b, TensorRole::ValueGradientAccumulator, layer, shape.kv_row * 2, block, 2);
    for zero in [dq_acc, acc_k[0], acc_v[0]] {
        b.launch(Op::Zero, l, 0, &[zero]);
    }
    let mut kv_arrived: Vec<Option<EventId>> = alloc::vec![None];
    let mut acc_arrived: Vec<Option<EventId>> = alloc::vec![None];
    collective_after_compute(b);
    exchange(b, layer, &[(k, ring_k[0]), (v, ring_v[0])]);
    kv_arrived.push(Some(b.record(Stream::Collective)));
    for step in 0..c {
        let s = step as usize;
        let hand = if step == 0 { (k, v) } else { (ring_k[slot(step - 1)], ring_v[slot(step - 1)]) };
        let acc = (acc_k[s % 2], acc_v[s % 2]);
        for event in [kv_arrived.get(s), acc_arrived.get(s)].into_iter().flatten().flatten() {
            b.wait(Stream::Compute, *event);
        }
        if step >= 1 && step + 1 < c {
            collective_after_compute(b);
            exchange(b, layer, &[(hand.0, ring_k[slot(step)]), (hand.1, ring_v[slot(step)])]);
            kv_arrived.push(Some(b.record(Stream::Collective)));
        }
        // Validation makes `rank_seq` at least 2 at c > 1; 0 would give no blocks, not a panic.
        for sequence in 0..shape.full_rows.checked_div(shape.rank_seq).unwrap_or(0) {
            for (queries, keys, causal) in step_blocks(b, step, sequence * shape.rank_seq) {
                let flops = block_flops(b, queries.1 - queries.0, keys.1 - keys.0, causal, true)?;
                let op = if causal { Op::AttentionBlockBackwardCausal } else { Op::AttentionBlockBackward };
                let qs = |r: Region| sub(r, queries.0, queries.1);
                let ks = |r: Region| sub(r, keys.0, keys.1);
                let regions =
                    [qs(q), ks(hand.0), ks(hand.1), qs(out), qs(lse), qs(dout), qs(dq_acc), ks(acc.0), ks(acc.1)];
                b.launch(op, l, flops, &regions);
            }
        }
        // The accumulators of the K/V in hand go on to the next rank once this step wrote them.
        collective_after_compute(b);
        let next = (s + 1) % 2;
        exchange(b, layer, &[(acc.0, acc_k[next]), (acc.1, acc_v[next])]);
        acc_arrived.push(Some(b.record(Stream::Collective)));
    }
    if let Some(Some(event)) = acc_arrived.last() {
        b.wait(Stream::Compute, *event);
    }
    let home = (c % 2) as usize;
    b.launch(Op::ToBf16, l, 0, &[dq_acc, dq]);
    b.launch(Op::ToBf16, l, 0, &[acc_k[home], dk]);
    b.launch(Op::ToBf16, l, 0, &[acc_v[home], dv]);
    b.launch(Op::RotaryBackward, l, 0, &[dq]);
    b.launch(Op::RotaryBackward, l, 0, &[dk]);
    Ok(())
}

/// Every gradient buffer, then the loss, summed over the data group (the `d x c` ranks with this
/// tensor-parallel rank), between one pair of events: the collective stream starts after compute
/// wrote them, compute goes on (the gradient norm) after the last.
pub(crate) fn data_all_reduce(b: &mut Builder, loss: Region) {
    let gradients: Vec<Region> = b.buffers_of_kind(BufferKind::Gradient);
    collective_after_compute(b);
    for gradient in gradients {
        b.launch_on(Stream::Collective, Op::DataAllReduceSumBf16, None, 0, &[gradient]);
    }
    b.launch_on(Stream::Collective, Op::DataAllReduceSumF32, None, 0, &[loss]);
    let done = b.record(Stream::Collective);
    b.wait(Stream::Compute, done);
}
