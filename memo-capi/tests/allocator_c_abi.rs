//! The allocator half of the C ABI, on the host backend: record, plan, replay through the
//! exported functions, as a framework calls them. The allocator is process-wide, so everything
//! runs in one test, in order.

use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};

use memo_capi::record_replay::ffi::*;
use memo_capi::status::memo_last_error;
use memo_capi::{MemoAllocatorStats, MemoPlaceOptions, MemoStatus};

fn last_error() -> String {
    // Safety: never NULL; copied at once.
    unsafe { CStr::from_ptr(memo_last_error()) }.to_string_lossy().into_owned()
}

fn stats() -> MemoAllocatorStats {
    let mut stats = MemoAllocatorStats::default();
    // Safety: valid out-pointer.
    assert_eq!(unsafe { memo_allocator_stats(&mut stats) }, MemoStatus::Ok);
    stats
}

/// One iteration as a framework makes it: `sizes[i]` allocated in order, then freed in reverse
/// except the last, which is kept (a gradient); returns the pointers and the kept one.
fn iteration(sizes: &[isize]) -> (Vec<*mut c_void>, (*mut c_void, isize)) {
    let stream = std::ptr::without_provenance_mut(0x5);
    let pointers: Vec<*mut c_void> = sizes.iter().map(|&size| memo_alloc(size, 0, stream)).collect();
    assert!(pointers.iter().all(|p| !p.is_null()), "{}", last_error());
    for (&pointer, &size) in pointers.iter().zip(sizes).rev().skip(1) {
        memo_free(pointer, size, 0, stream);
    }
    let kept = (*pointers.last().unwrap(), *sizes.last().unwrap());
    assert_eq!(memo_iteration_end(), MemoStatus::Ok);
    (pointers, kept)
}

#[test]
fn record_plan_replay_through_the_c_abi() {
    assert_eq!(memo_allocator_select_backend(7), MemoStatus::InvalidArgument);
    assert_eq!(memo_allocator_select_backend(MEMO_BACKEND_HOST), MemoStatus::Ok, "{}", last_error());
    assert_eq!(stats().mode, MEMO_MODE_PASSTHROUGH);

    // Refusals before there is anything to replay, and bad arguments.
    assert_eq!(memo_allocator_replay(0), MemoStatus::InvalidState);
    assert!(last_error().starts_with("memo_allocator_replay: no plan"), "{}", last_error());
    // Safety: NULL options are allowed.
    assert_eq!(unsafe { memo_allocator_plan(null()) }, MemoStatus::InvalidState);
    assert!(memo_alloc(-1, 0, null_mut()).is_null());
    assert_eq!(last_error(), "memo_alloc: size -1 is negative");
    // Safety: NULL is refused.
    assert_eq!(unsafe { memo_allocator_stats(null_mut()) }, MemoStatus::NullPointer);
    // Safety: NULL is refused.
    assert_eq!(unsafe { memo_allocator_plan_file(null(), null()) }, MemoStatus::NullPointer);
    let missing = CString::new("/nonexistent/iteration.trace").unwrap();
    // Safety: a valid string.
    assert_eq!(unsafe { memo_allocator_plan_file(missing.as_ptr(), null()) }, MemoStatus::Io);
    memo_free(std::ptr::without_provenance_mut(0x1234), 8, 0, null_mut());
    assert!(last_error().contains("did not hand out"), "{}", last_error());
    memo_free(null_mut(), 0, 0, null_mut());
    assert_eq!(stats().unknown_frees, 1);

    // Record two iterations into a directory.
    let dir = std::env::temp_dir().join(format!("memo-capi-abi-{}", std::process::id()));
    let dir_text = CString::new(dir.to_str().unwrap()).unwrap();
    // Safety: a valid string.
    assert_eq!(unsafe { memo_allocator_record(dir_text.as_ptr()) }, MemoStatus::Ok);
    let sizes = [4096, 1000, 8192, 300, 2048];
    let mut kept = Vec::new();
    for _ in 0..2 {
        kept.push(iteration(&sizes).1);
    }
    let recorded = stats();
    assert_eq!((recorded.mode, recorded.recorded_iterations), (MEMO_MODE_RECORD, 2));
    assert!(dir.join("iteration-0001.trace").is_file());

    // Plan, with an alignment that cannot hold device pointers refused first.
    let mut options = MemoPlaceOptions { capacity: u64::MAX, alignment: 64, budget_nodes: 10_000 };
    // Safety: valid options.
    assert_eq!(unsafe { memo_allocator_plan(&options) }, MemoStatus::InvalidArgument);
    options.alignment = 512;
    // Safety: valid options.
    assert_eq!(unsafe { memo_allocator_plan(&options) }, MemoStatus::Ok, "{}", last_error());
    let planned = stats();
    // All but the kept buffer are alive at once before the frees: 4096 + 1024 + 8192 + 512.
    assert_eq!(
        (planned.plan_ready, planned.plan_peak, planned.plan_lower_bound, planned.plan_optimal),
        (1, 13824, 13824, 1)
    );
    // The file written by record plans the same.
    let file = CString::new(dir.join("iteration-0001.trace").to_str().unwrap()).unwrap();
    // Safety: a valid string; NULL options.
    assert_eq!(unsafe { memo_allocator_plan_file(file.as_ptr(), null()) }, MemoStatus::Ok, "{}", last_error());
    assert_eq!(stats().plan_peak, 13824);

    // Replay: the arena is the plan's peak; the same pointers every iteration.
    assert_eq!(memo_allocator_replay(0), MemoStatus::Ok, "{}", last_error());
    assert_eq!(memo_allocator_reset_stats(), MemoStatus::Ok);
    let (first, kept_now) = iteration(&sizes);
    kept.push(kept_now);
    let (second, kept_now) = iteration(&sizes);
    kept.push(kept_now);
    assert_eq!(first[..4], second[..4], "replay must give the planned addresses every iteration");
    let replayed = stats();
    assert_eq!(replayed.mode, MEMO_MODE_REPLAY);
    assert_eq!((replayed.replayed, replayed.unplanned, replayed.fallbacks), (8, 2, 0));
    assert_eq!(replayed.arena_bytes, 13824);
    assert!(first.iter().all(|p| p.addr() % 256 == 0));

    // A divergent iteration falls back and is counted.
    let divergent = [4096, 1000, 8000, 300, 2048];
    kept.push(iteration(&divergent).1);
    let after = stats();
    assert_eq!((after.fallbacks, after.fallback_size_mismatch, after.fallback_bytes), (1, 1, 8000));

    // The backend cannot change while memory is out; after freeing everything it can.
    assert_eq!(memo_allocator_select_backend(MEMO_BACKEND_HOST), MemoStatus::InvalidState);
    for (pointer, size) in kept {
        memo_free(pointer, size, 0, null_mut());
    }
    assert_eq!(memo_allocator_release_arena(), MemoStatus::Ok);
    let done = stats();
    assert_eq!((done.device_bytes_live, done.requested_bytes_live, done.unknown_frees), (0, 0, 0));
    assert_eq!(memo_allocator_select_backend(MEMO_BACKEND_HOST), MemoStatus::Ok, "{}", last_error());
    std::fs::remove_dir_all(&dir).unwrap();

    blocks_make_bilevel_plans();
}

/// One iteration of four identical marked "layers", each allocating and freeing its own
/// transients around one activation that the next layer frees; returns the pointers.
fn layered_iteration() -> Vec<*mut c_void> {
    let mut pointers = Vec::new();
    let mut activation = memo_alloc(4096, 0, null_mut());
    pointers.push(activation);
    for _ in 0..4 {
        assert_eq!(memo_block_begin(7), MemoStatus::Ok, "{}", last_error());
        let (a, b) = (memo_alloc(1000, 0, null_mut()), memo_alloc(3000, 0, null_mut()));
        memo_free(a, 1000, 0, null_mut());
        memo_free(b, 3000, 0, null_mut());
        let next = memo_alloc(4096, 0, null_mut());
        memo_free(activation, 4096, 0, null_mut());
        activation = next;
        assert_eq!(memo_block_end(), MemoStatus::Ok, "{}", last_error());
        pointers.extend([a, b, next]);
    }
    memo_free(activation, 4096, 0, null_mut());
    assert_eq!(memo_iteration_end(), MemoStatus::Ok);
    pointers
}

/// Block markers through the C ABI: refused out of order while recording, recorded, planned
/// bi-level, ignored in replay.
fn blocks_make_bilevel_plans() {
    assert_eq!(memo_block_end(), MemoStatus::Ok, "nothing to check outside record mode");
    // Safety: NULL keeps the trace in memory.
    assert_eq!(unsafe { memo_allocator_record(null()) }, MemoStatus::Ok);
    assert_eq!(memo_block_end(), MemoStatus::InvalidState);
    assert_eq!(last_error(), "memo_block_end: no block is open in this iteration: call memo_block_begin first");
    layered_iteration();
    // Safety: NULL options.
    assert_eq!(unsafe { memo_allocator_plan(null()) }, MemoStatus::Ok, "{}", last_error());
    let planned = stats();
    assert_eq!((planned.plan_block_instances, planned.plan_level1_problems), (4, 1));
    // An activation with both transients (1024 + 3072 at 512 alignment), or two activations: the
    // bi-level plan reaches the lower bound.
    assert_eq!((planned.plan_peak, planned.plan_lower_bound, planned.plan_optimal), (8192, 8192, 1));
    assert_eq!(memo_allocator_replay(0), MemoStatus::Ok, "{}", last_error());
    assert_eq!(memo_allocator_reset_stats(), MemoStatus::Ok);
    let (first, second) = (layered_iteration(), layered_iteration());
    assert_eq!(first, second);
    let replayed = stats();
    assert_eq!((replayed.replayed, replayed.fallbacks, replayed.requested_bytes_live), (26, 0, 0));
    assert_eq!(memo_allocator_release_arena(), MemoStatus::Ok);
}
