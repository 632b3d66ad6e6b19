//! Host tests of the record/replay rules, over a fake device allocator (`blocks`: block markers
//! and bi-level plans).

mod blocks;

use std::collections::BTreeMap;

use memo_place::check::check_placement;
use memo_place::generate::SplitMix64;
use memo_place::BufferLifetime;
use memo_plan_core::parse_trace;

use super::plan::{replay_solve_options, MEMO_DEFAULT_REPLAY_ALIGNMENT};
use super::*;

/// A device that never reuses an address (so a reuse bug cannot hide behind a lucky address),
/// refuses frees of what it did not hand out, and fails on request.
#[derive(Debug)]
struct FakeDevice {
    next: usize,
    live: BTreeMap<usize, usize>,
    /// Allocations above this size fail, as an out-of-memory device would.
    fail_above: usize,
}

impl FakeDevice {
    fn new() -> Self {
        FakeDevice { next: 0x1000_0000, live: BTreeMap::new(), fail_above: usize::MAX }
    }
}

impl DeviceAllocator for FakeDevice {
    fn allocate(&mut self, size: usize, _device: i32, _stream: usize) -> Result<usize, DeviceError> {
        if size > self.fail_above {
            return Err(DeviceError::new(format!("out of memory for {size} bytes")));
        }
        let address = self.next;
        self.next += size.max(1).div_ceil(512) * 512 + 512;
        self.live.insert(address, size);
        Ok(address)
    }

    fn free(&mut self, address: usize, _size: usize, _device: i32, _stream: usize) -> Result<(), DeviceError> {
        self.live.remove(&address).map(drop).ok_or_else(|| DeviceError::new(format!("{address:#x} is not live")))
    }
}

/// One request of a test iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// Allocate this many bytes.
    Malloc(usize),
    /// Free the buffer of the iteration's malloc number `.0`.
    Free(usize),
}

/// Runs one iteration's ops; returns each malloc's address, in order. Buffers the ops never free
/// are returned in `survivors` for a later iteration to free.
fn run(
    allocator: &mut RecordReplayAllocator<FakeDevice>,
    ops: &[Op],
    survivors: &mut Vec<(usize, usize)>,
) -> Vec<usize> {
    let mut addresses: Vec<(usize, usize)> = Vec::new();
    let mut freed = Vec::new();
    for &op in ops {
        match op {
            Op::Malloc(size) => addresses.push((allocator.allocate(size, 0, 7).unwrap(), size)),
            Op::Free(index) => {
                allocator.free(addresses[index].0, addresses[index].1, 7).unwrap();
                freed.push(index);
            }
        }
    }
    for (index, &pair) in addresses.iter().enumerate() {
        if !freed.contains(&index) {
            survivors.push(pair);
        }
    }
    addresses.into_iter().map(|(address, _)| address).collect()
}

fn options() -> SolveOptions {
    replay_solve_options(None, MEMO_DEFAULT_REPLAY_ALIGNMENT, 100_000)
}

/// An iteration shaped like a training step: activations made in order and freed in reverse
/// (forward then backward), with transient buffers inside, and one buffer kept past the end.
fn training_like_ops() -> Vec<Op> {
    vec![
        Op::Malloc(4096), // 0 activation
        Op::Malloc(1000), // 1 transient
        Op::Free(1),
        Op::Malloc(8192), // 2 activation
        Op::Malloc(3000), // 3 transient
        Op::Malloc(700),  // 4 transient
        Op::Free(3),
        Op::Free(4),
        Op::Malloc(2048), // 5 gradient, kept past the iteration
        Op::Free(2),
        Op::Malloc(5000), // 6 transient of the backward
        Op::Free(6),
        Op::Free(0),
    ]
}

/// Records two iterations of `ops`, plans the second, and switches to replay.
fn recorded_and_planned(ops: &[Op]) -> (RecordReplayAllocator<FakeDevice>, Vec<(usize, usize)>) {
    let mut allocator = RecordReplayAllocator::new(FakeDevice::new());
    let mut survivors = Vec::new();
    allocator.record(None).unwrap();
    for _ in 0..2 {
        run(&mut allocator, ops, &mut survivors);
        allocator.end_iteration().unwrap();
    }
    allocator.plan_recorded(&options()).unwrap();
    allocator.replay(0).unwrap();
    (allocator, survivors)
}

#[test]
fn record_writes_each_iteration_in_memo_text_form() {
    let mut allocator = RecordReplayAllocator::new(FakeDevice::new());
    let before = allocator.allocate(64, 0, 0).unwrap();
    allocator.record(None).unwrap();
    let mut survivors = Vec::new();
    run(&mut allocator, &[Op::Malloc(10), Op::Malloc(20), Op::Free(0)], &mut survivors);
    allocator.free(before, 64, 0).unwrap();
    allocator.end_iteration().unwrap();
    let text = allocator.last_trace().unwrap().to_string();
    let requests: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(requests, ["malloc 0 10", "malloc 1 20", "free 0 10"]);
    assert!(text.contains("# free of an earlier buffer: 64 bytes"), "{text}");
    assert!(text.contains("1 buffers never freed"), "{text}");
    let trace = parse_trace(text.as_bytes()).unwrap();
    assert_eq!(
        trace.buffers,
        [
            BufferLifetime { id: 0, lower: 0, upper: 2, size: 10 },
            BufferLifetime { id: 1, lower: 1, upper: 3, size: 20 }
        ]
    );

    // The survivor of iteration 0 freed in iteration 1 is an earlier buffer there; ids restart.
    run(&mut allocator, &[Op::Malloc(30), Op::Free(0)], &mut Vec::new());
    allocator.free(survivors[0].0, 20, 0).unwrap();
    allocator.end_iteration().unwrap();
    let text = allocator.last_trace().unwrap();
    let requests: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(requests, ["malloc 0 30", "free 0 30"]);
    assert!(text.contains("# free of an earlier buffer: 20 bytes"), "{text}");
    assert_eq!(allocator.recorded_iterations(), 2);
}

#[test]
fn replay_hands_out_exactly_the_planned_addresses() {
    let ops = training_like_ops();
    let (mut allocator, _) = recorded_and_planned(&ops);
    let plan = allocator.plan().unwrap().clone();
    let base = allocator.arena().unwrap().base;
    assert_eq!(allocator.arena().unwrap().bytes, plan.arena_bytes);
    allocator.reset_counters();
    for _ in 0..3 {
        let mut survivors = Vec::new();
        let addresses = run(&mut allocator, &ops, &mut survivors);
        for (k, (&address, slot)) in addresses.iter().zip(&plan.slots).enumerate() {
            match *slot {
                Slot::Arena { offset, .. } => assert_eq!(address, base + offset as usize, "request {k}"),
                Slot::Device { .. } => assert!(allocator.arena().unwrap().offset_of(address).is_none(), "request {k}"),
            }
        }
        for (address, size) in survivors {
            allocator.free(address, size, 7).unwrap();
        }
        allocator.end_iteration().unwrap();
    }
    let c = allocator.counters();
    assert_eq!((c.replayed, c.unplanned, c.fallbacks, c.unknown_frees), (3 * 6, 3, 0, 0));
    // The plan is MEMO's: the arena buffers at their lower bound (4096 + 8192 + 3000 + 700 at
    // once, each rounded to 512).
    assert_eq!(plan.lower_bound, 4096 + 8192 + 3072 + 1024);
    assert_eq!(plan.arena_bytes, plan.lower_bound);
    assert!(plan.optimal);
}

#[test]
fn a_divergent_request_falls_back_and_is_counted() {
    let ops = training_like_ops();
    let (mut allocator, _) = recorded_and_planned(&ops);
    let arena = allocator.arena().unwrap();
    allocator.reset_counters();
    let mut divergent = ops.clone();
    divergent[3] = Op::Malloc(8000); // size differs from the plan's 8192
    divergent.push(Op::Malloc(100)); // one request more than the plan
    divergent.push(Op::Free(7));
    let addresses = run(&mut allocator, &divergent, &mut Vec::new());
    assert!(arena.offset_of(addresses[2]).is_none(), "the divergent request must not be in the arena");
    assert!(arena.offset_of(addresses[7]).is_none());
    let c = allocator.counters();
    assert_eq!((c.fallbacks, c.fallback_size_mismatch, c.fallback_beyond_plan), (2, 1, 1));
    assert_eq!(c.fallback_bytes, 8100);
    assert_eq!(c.replayed, 5);
}

#[test]
fn a_buffer_freed_late_is_never_overlapped() {
    let ops = training_like_ops();
    let (mut allocator, _) = recorded_and_planned(&ops);
    allocator.reset_counters();
    // Keep every transient alive to the end: each later planned request that reuses their bytes
    // must fall back instead.
    let late: Vec<Op> = ops.iter().copied().filter(|op| matches!(op, Op::Malloc(_))).collect();
    let mut survivors = Vec::new();
    let addresses = run(&mut allocator, &late, &mut survivors);
    let c = allocator.counters();
    assert!(c.fallback_overlap > 0, "{c:?}");
    assert_eq!(c.fallbacks, c.fallback_overlap);
    assert_no_overlap(&survivors);
    assert_eq!(addresses.len(), 7);
}

#[test]
fn zero_size_and_other_device_requests_keep_their_place_out_of_the_plan() {
    let ops = training_like_ops();
    let (mut allocator, _) = recorded_and_planned(&ops);
    let base = allocator.arena().unwrap().base;
    let first_offset = match allocator.plan().unwrap().slots[0] {
        Slot::Arena { offset, .. } => offset,
        Slot::Device { .. } => unreachable!("the first request is freed within the iteration"),
    };
    assert_eq!(allocator.allocate(0, 0, 0).unwrap(), 0);
    let elsewhere = allocator.allocate(4096, 1, 0).unwrap();
    let first = allocator.allocate(4096, 0, 0).unwrap();
    assert_eq!(first, base + first_offset as usize);
    assert_ne!(elsewhere, first);
    assert_eq!(allocator.counters().fallback_other_device, 1);
    allocator.free(0, 0, 0).unwrap();
    allocator.free(elsewhere, 4096, 1).unwrap();
    allocator.free(first, 4096, 0).unwrap();
}

#[test]
fn unknown_and_double_frees_are_refused_and_counted() {
    let (mut allocator, _) = recorded_and_planned(&training_like_ops());
    let address = allocator.allocate(4096, 0, 0).unwrap();
    allocator.free(address, 4096, 0).unwrap();
    let twice = allocator.free(address, 4096, 0).unwrap_err();
    assert_eq!(twice.status, MemoStatus::InvalidArgument);
    assert!(twice.message.contains("inside the arena"), "{}", twice.message);
    let stray = allocator.free(0x42_0000, 8, 0).unwrap_err();
    assert!(stray.message.contains("did not hand out"), "{}", stray.message);
    assert_eq!(allocator.counters().unknown_frees, 2);
    allocator.free(0, 0, 0).unwrap();
}

#[test]
fn device_failures_are_errors_and_leave_the_mode() {
    let ops = training_like_ops();
    let mut allocator = RecordReplayAllocator::new(FakeDevice::new());
    assert_eq!(allocator.replay(0).unwrap_err().status, MemoStatus::InvalidState);
    assert_eq!(allocator.plan_recorded(&options()).unwrap_err().status, MemoStatus::InvalidState);
    allocator.record(None).unwrap();
    run(&mut allocator, &ops, &mut Vec::new());
    allocator.end_iteration().unwrap();
    allocator.plan_recorded(&options()).unwrap();
    allocator.device.fail_above = 1000;
    let error = allocator.replay(0).unwrap_err();
    assert_eq!(error.status, MemoStatus::Device);
    assert!(error.message.contains("cannot allocate the arena"), "{}", error.message);
    assert_eq!(allocator.mode(), Mode::Record);
    assert_eq!(allocator.allocate(5000, 0, 0).unwrap_err().status, MemoStatus::Device);
    assert_eq!(allocator.counters().device_errors, 2);
}

#[test]
fn the_arena_is_released_only_when_nothing_in_it_is_live() {
    let (mut allocator, survivors) = recorded_and_planned(&training_like_ops());
    let first = allocator.allocate(4096, 0, 0).unwrap();
    assert_eq!(allocator.release_arena().unwrap_err().status, MemoStatus::InvalidState);
    allocator.free(first, 4096, 0).unwrap();
    allocator.release_arena().unwrap();
    assert_eq!(allocator.mode(), Mode::Passthrough);
    for (address, size) in survivors {
        allocator.free(address, size, 0).unwrap();
    }
    assert!(allocator.is_idle());
    assert!(allocator.device.live.is_empty());
    assert_eq!((allocator.device_bytes_live(), allocator.requested_bytes_live()), (0, 0));
}

#[test]
fn traces_written_to_a_directory_plan_like_the_recorded_one() {
    let dir = std::env::temp_dir().join(format!("memo-capi-record-{}", std::process::id()));
    let mut allocator = RecordReplayAllocator::new(FakeDevice::new());
    allocator.record(Some(dir.clone())).unwrap();
    run(&mut allocator, &training_like_ops(), &mut Vec::new());
    allocator.end_iteration().unwrap();
    let from_memory = allocator.plan_recorded(&options()).unwrap().clone();
    let text = std::fs::read(dir.join("iteration-0000.trace")).unwrap();
    let from_file = allocator.plan_text(&text, &options()).unwrap().clone();
    assert_eq!(from_memory, from_file);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plans_refuse_small_alignments_and_csv_traces() {
    let text = b"malloc 0 100\nfree 0 100\n";
    let small = replay_solve_options(None, 64, 1000);
    assert_eq!(ReplayPlan::from_text(text, &small).unwrap_err().status, MemoStatus::InvalidArgument);
    assert_eq!(replay_solve_options(None, 1, 1000).alignment, MEMO_DEFAULT_REPLAY_ALIGNMENT);
    let csv = b"id,lower,upper,size\n0,0,1,100\n";
    assert_eq!(ReplayPlan::from_text(csv, &options()).unwrap_err().status, MemoStatus::InvalidTrace);
    let tight = replay_solve_options(Some(256), 512, 1000);
    assert_eq!(ReplayPlan::from_text(text, &tight).unwrap_err().status, MemoStatus::Infeasible);
}

/// Fails if two of `live` (address, size) share a byte. Independent of the allocator: a scan of
/// every pair.
fn assert_no_overlap(live: &[(usize, usize)]) {
    for (i, &(a, a_size)) in live.iter().enumerate() {
        for &(b, b_size) in &live[i + 1..] {
            assert!(a + a_size <= b || b + b_size <= a, "{a:#x}+{a_size} overlaps {b:#x}+{b_size}");
        }
    }
}

/// A random iteration: `mallocs` requests of random sizes, each freed after a random delay or
/// (rarely) never.
fn random_ops(rng: &mut SplitMix64, mallocs: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    for index in 0..mallocs {
        ops.push(Op::Malloc(rng.between(1, 20_000) as usize));
        open.push(index);
        while !open.is_empty() && rng.below(3) == 0 {
            let pick = rng.below(open.len() as u64) as usize;
            ops.push(Op::Free(open.swap_remove(pick)));
        }
    }
    rng.shuffle(&mut open);
    for index in open {
        if rng.below(8) != 0 {
            ops.push(Op::Free(index));
        }
    }
    ops
}

/// `ops` perturbed: sizes changed, requests dropped or added, frees moved later or earlier.
fn perturbed(rng: &mut SplitMix64, ops: &[Op]) -> Vec<Op> {
    let mut mallocs: Vec<usize> =
        ops.iter().filter_map(|op| if let Op::Malloc(s) = op { Some(*s) } else { None }).collect();
    for size in mallocs.iter_mut() {
        if rng.below(10) == 0 {
            *size = rng.between(1, 20_000) as usize;
        }
    }
    if rng.below(2) == 0 {
        mallocs.push(rng.between(1, 20_000) as usize);
    }
    // Each buffer's free moves by a random number of positions, or disappears.
    let mut events: Vec<(u64, Op)> = Vec::new();
    let mut malloc_index = 0;
    for (position, op) in ops.iter().enumerate() {
        let key = 4 * position as u64;
        match *op {
            Op::Malloc(_) => {
                events.push((key, Op::Malloc(mallocs[malloc_index])));
                malloc_index += 1;
            }
            Op::Free(index) if rng.below(10) != 0 => {
                let shifted = (key + rng.below(40)).saturating_sub(20);
                events.push((shifted, Op::Free(index)));
            }
            Op::Free(_) => {}
        }
    }
    for size in &mallocs[malloc_index..] {
        events.push((4 * ops.len() as u64, Op::Malloc(*size)));
    }
    events.sort_by_key(|&(key, _)| key);
    // Keep every free after its malloc.
    let mut seen = 0;
    let mut result = Vec::new();
    let mut pending: Vec<usize> = Vec::new();
    for (_, op) in events {
        match op {
            Op::Malloc(_) => {
                result.push(op);
                seen += 1;
                pending.retain(|&index| {
                    if index < seen {
                        result.push(Op::Free(index));
                        false
                    } else {
                        true
                    }
                });
            }
            Op::Free(index) if index < seen => result.push(op),
            Op::Free(index) => pending.push(index),
        }
    }
    result
}

#[test]
fn random_request_streams_never_get_overlapping_memory() {
    let mut rng = SplitMix64::new(0xA110C);
    for case in 0..300 {
        let mallocs = 1 + rng.below(40) as usize;
        let recorded = random_ops(&mut rng, mallocs);
        let mut allocator = RecordReplayAllocator::new(FakeDevice::new());
        allocator.record(None).unwrap();
        let mut survivors = Vec::new();
        run(&mut allocator, &recorded, &mut survivors);
        allocator.end_iteration().unwrap();
        let plan = allocator.plan_recorded(&options()).unwrap().clone();
        // The plan itself passes the independent placement checker.
        let trace = parse_trace(allocator.last_trace().unwrap().as_bytes()).unwrap();
        let arena_buffers: Vec<BufferLifetime> =
            trace.buffers.iter().copied().filter(|b| b.upper < trace.steps).collect();
        let offsets: Vec<u64> = plan
            .slots
            .iter()
            .filter_map(|s| if let Slot::Arena { offset, .. } = s { Some(*offset) } else { None })
            .collect();
        check_placement(&arena_buffers, &offsets, plan.alignment, plan.arena_bytes, None)
            .unwrap_or_else(|v| panic!("case {case}: {v:?}"));
        allocator.replay(0).unwrap();

        // Replay several iterations, exact or perturbed, checking every live allocation after
        // every request; survivors of one iteration live into the next.
        let mut live: BTreeMap<usize, usize> = survivors.into_iter().collect();
        for _ in 0..4 {
            let ops = if rng.below(3) == 0 { recorded.clone() } else { perturbed(&mut rng, &recorded) };
            let mut addresses: Vec<(usize, usize)> = Vec::new();
            for op in ops {
                match op {
                    Op::Malloc(size) => {
                        let address = allocator.allocate(size, 0, 0).unwrap();
                        addresses.push((address, size));
                        assert!(live.insert(address, size).is_none(), "case {case}: {address:#x} handed out twice");
                        let pairs: Vec<(usize, usize)> = live.iter().map(|(&a, &s)| (a, s)).collect();
                        assert_no_overlap(&pairs);
                    }
                    Op::Free(index) => {
                        let (address, size) = addresses[index];
                        allocator.free(address, size, 0).unwrap_or_else(|e| panic!("case {case}: {e}"));
                        live.remove(&address);
                    }
                }
            }
            allocator.end_iteration().unwrap();
            // Occasionally free the survivors, as a framework frees last iteration's gradients.
            if rng.below(2) == 0 {
                for (address, size) in std::mem::take(&mut live) {
                    allocator.free(address, size, 0).unwrap();
                }
            }
        }
        let c = allocator.counters();
        assert_eq!(c.unknown_frees + c.device_errors, 0, "case {case}: {c:?}");
        assert_eq!(allocator.requested_bytes_live(), live.values().map(|&s| s as u64).sum::<u64>());
    }
}

#[test]
fn random_calls_in_any_mode_never_fail_internally_or_overlap() {
    // Any order of record, plan, replay, passthrough, release, iteration ends, allocations and
    // frees: every call answers (an error is fine), no bookkeeping goes wrong (a debug-build
    // underflow would panic), and live memory never overlaps.
    let mut rng = SplitMix64::new(0xC0FFEE);
    let (mut replayed, mut fallbacks) = (0, 0);
    for case in 0..40 {
        let mut allocator = RecordReplayAllocator::new(FakeDevice::new());
        allocator.device.fail_above = if case % 4 == 0 { 30_000 } else { usize::MAX };
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mallocs = 1 + rng.below(12) as usize;
        let pattern = random_ops(&mut rng, mallocs);
        for _ in 0..400 {
            match rng.below(20) {
                0 => allocator.record(None).unwrap(),
                1 => drop(allocator.plan_recorded(&options())),
                2 => drop(allocator.replay(rng.below(2) as i32)),
                3 => allocator.passthrough(),
                4 => drop(allocator.release_arena()),
                5 => allocator.end_iteration().unwrap(),
                6..=9 => {
                    // One whole iteration of the pattern, its survivors kept.
                    let mut addresses: Vec<Option<(usize, usize)>> = Vec::new();
                    for &op in &pattern {
                        match op {
                            Op::Malloc(size) => {
                                let result = allocator.allocate(size, 0, 0).ok().map(|a| (a, size));
                                if let Some(pair) = result {
                                    live.push(pair);
                                    assert_no_overlap(&live);
                                }
                                addresses.push(result);
                            }
                            Op::Free(index) => {
                                if let Some((address, size)) = addresses[index].take() {
                                    allocator.free(address, size, 0).unwrap_or_else(|e| panic!("case {case}: {e}"));
                                    live.retain(|&(a, _)| a != address);
                                }
                            }
                        }
                    }
                    allocator.end_iteration().unwrap();
                }
                10..=14 => {
                    let size = rng.below(40_000) as usize;
                    if let Ok(address) = allocator.allocate(size, rng.below(3).min(1) as i32, 0) {
                        live.push((address, size));
                        assert_no_overlap(&live);
                    }
                }
                _ if !live.is_empty() => {
                    let (address, size) = live.swap_remove(rng.below(live.len() as u64) as usize);
                    allocator.free(address, size, 0).unwrap_or_else(|e| panic!("case {case}: {e}"));
                }
                _ => {}
            }
        }
        assert_eq!(allocator.counters().unknown_frees, 0);
        replayed += allocator.counters().replayed;
        fallbacks += allocator.counters().fallbacks;
        assert_eq!(allocator.requested_bytes_live(), live.iter().map(|&(_, s)| s as u64).sum::<u64>());
        for (address, size) in live {
            allocator.free(address, size, 0).unwrap();
        }
        allocator.release_arena().unwrap();
        assert!(allocator.is_idle() && allocator.device.live.is_empty(), "case {case}");
    }
    // The stream reaches replay, and both of its outcomes.
    assert!(replayed > 100 && fallbacks > 100, "replayed {replayed}, fell back {fallbacks}");
}
