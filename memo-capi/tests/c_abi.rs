//! The placement half of the C ABI, called as C calls it: every failure is a status with a
//! message, nothing panics, handles are checked.

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use memo_capi::placement::*;
use memo_capi::status::{memo_last_error, memo_status_name};
use memo_capi::MemoStatus;

const MEMO_LAYER: &str = include_str!("../../examples/traces/memo-layer.trace");

fn last_error() -> String {
    // Safety: memo_last_error never returns NULL and the text lives until the next failing call
    // on this thread; it is copied at once.
    unsafe { CStr::from_ptr(memo_last_error()) }.to_string_lossy().into_owned()
}

fn parse(text: &str) -> *mut MemoTrace {
    let mut trace = null_mut();
    // Safety: the text and the out-pointer are valid.
    let status = unsafe { memo_trace_parse(text.as_ptr(), text.len(), &mut trace) };
    assert_eq!(status, MemoStatus::Ok, "{}", last_error());
    trace
}

fn place(trace: *const MemoTrace, options: Option<MemoPlaceOptions>) -> Result<*mut MemoPlacement, MemoStatus> {
    let mut placement = null_mut();
    let options_ptr = options.as_ref().map_or(null(), |o| o as *const MemoPlaceOptions);
    // Safety: the options (or NULL) and the out-pointer are valid.
    let status = unsafe { memo_place(trace, options_ptr, &mut placement) };
    if status == MemoStatus::Ok {
        Ok(placement)
    } else {
        assert!(placement.is_null(), "a failed memo_place must leave NULL");
        Err(status)
    }
}

fn summary(placement: *const MemoPlacement) -> MemoPlacementSummary {
    let mut summary = MemoPlacementSummary::default();
    // Safety: the out-pointer is valid.
    assert_eq!(unsafe { memo_placement_summary(placement, &mut summary) }, MemoStatus::Ok);
    summary
}

#[test]
fn the_memo_layer_trace_is_placed_at_its_lower_bound() {
    let trace = parse(MEMO_LAYER);
    let placement = place(trace, None).unwrap();
    let s = summary(placement);
    assert_eq!((s.buffers, s.steps, s.peak, s.lower_bound, s.optimal), (12, 24, 2_432_000_000, 2_432_000_000, 1));
    let mut offsets = vec![u64::MAX; 12];
    // Safety: room for 12 offsets.
    assert_eq!(unsafe { memo_placement_offsets(placement, offsets.as_mut_ptr(), 12) }, MemoStatus::Ok);
    let mut buffer = MemoPlacedBuffer::default();
    // Safety: the out-pointer is valid.
    assert_eq!(unsafe { memo_placement_buffer(placement, 2, &mut buffer) }, MemoStatus::Ok);
    assert_eq!((buffer.id, buffer.size, buffer.lower, buffer.upper), (15, 256_000_000, 3, 16));
    assert_eq!(buffer.offset, offsets[2]);
    assert_eq!(memo_placement_free(placement), MemoStatus::Ok);
    assert_eq!(memo_trace_free(trace), MemoStatus::Ok);
}

#[test]
fn a_trace_built_request_by_request_places_like_the_parsed_one() {
    // docs/technique.md section 3: the forward's transients alone need 512 MB.
    let mut trace = null_mut();
    // Safety: the out-pointer is valid.
    assert_eq!(unsafe { memo_trace_new(&mut trace) }, MemoStatus::Ok);
    let mb = 1_000_000;
    for (malloc, id, size) in [
        (true, 13, 128),
        (true, 14, 128),
        (false, 14, 128),
        (false, 13, 128),
        (true, 17, 128),
        (true, 18, 128),
        (true, 19, 256),
        (false, 17, 128),
        (false, 19, 256),
        (false, 18, 128),
    ] {
        let status = if malloc {
            memo_trace_add_malloc(trace, id, size * mb)
        } else {
            memo_trace_add_free(trace, id, size * mb)
        };
        assert_eq!(status, MemoStatus::Ok, "{}", last_error());
    }
    let mut count = 0usize;
    // Safety: the out-pointer is valid.
    assert_eq!(unsafe { memo_trace_buffer_count(trace, &mut count) }, MemoStatus::Ok);
    assert_eq!(count, 5);
    let placement = place(trace, None).unwrap();
    assert_eq!(summary(placement).peak, 512 * mb);
    // The trace may grow after a placement; the placement is unchanged.
    assert_eq!(memo_trace_add_malloc(trace, 99, 1), MemoStatus::Ok);
    assert_eq!(summary(placement).buffers, 5);
    assert_eq!(memo_placement_free(placement), MemoStatus::Ok);
    assert_eq!(memo_trace_free(trace), MemoStatus::Ok);
}

#[test]
fn capacities_give_infeasible_or_a_fitting_placement() {
    let trace = parse(MEMO_LAYER);
    let mut options = memo_place_options_default();
    assert_eq!(options.capacity, MEMO_NO_CAPACITY);
    options.capacity = 2_431_999_999;
    assert_eq!(place(trace, Some(options)).unwrap_err(), MemoStatus::Infeasible);
    let message = last_error();
    assert!(message.starts_with("memo_place: proven infeasible"), "{message}");
    options.capacity = 2_432_000_000;
    let placement = place(trace, Some(options)).unwrap();
    assert_eq!(summary(placement).peak, 2_432_000_000);
    memo_placement_free(placement);
    memo_trace_free(trace);
}

#[test]
fn null_pointers_are_refused_with_messages() {
    // Safety: (all calls below) every pointer is NULL or valid; NULLs are what is tested.
    unsafe {
        assert_eq!(memo_trace_new(null_mut()), MemoStatus::NullPointer);
        assert_eq!(last_error(), "memo_trace_new: `out` is NULL; pass a valid pointer");
        let mut trace = null_mut();
        assert_eq!(memo_trace_parse(null(), 5, &mut trace), MemoStatus::NullPointer);
        assert!(last_error().contains("`text` is NULL"), "{}", last_error());
        assert_eq!(memo_trace_add_malloc(null_mut(), 1, 1), MemoStatus::NullPointer);
        assert!(last_error().contains("`trace` is NULL"));
        assert_eq!(memo_trace_buffer_count(null(), null_mut()), MemoStatus::NullPointer);
        assert_eq!(memo_place(null(), null(), null_mut()), MemoStatus::NullPointer);
        let mut placement = null_mut();
        assert_eq!(memo_place(null(), null(), &mut placement), MemoStatus::NullPointer);
        assert_eq!(memo_placement_summary(null(), null_mut()), MemoStatus::NullPointer);
        assert_eq!(memo_placement_offsets(null(), null_mut(), 0), MemoStatus::NullPointer);
        assert_eq!(memo_placement_buffer(null(), 0, null_mut()), MemoStatus::NullPointer);
        // Freeing NULL is allowed, as free(NULL) is.
        assert_eq!(memo_trace_free(null_mut()), MemoStatus::Ok);
        assert_eq!(memo_placement_free(null_mut()), MemoStatus::Ok);

        let trace = parse(MEMO_LAYER);
        let placement = place(trace, None).unwrap();
        assert_eq!(memo_trace_buffer_count(trace, null_mut()), MemoStatus::NullPointer);
        assert_eq!(memo_placement_summary(placement, null_mut()), MemoStatus::NullPointer);
        assert_eq!(memo_placement_offsets(placement, null_mut(), 12), MemoStatus::NullPointer);
        assert!(last_error().contains("`offsets` is NULL"));
        memo_placement_free(placement);
        memo_trace_free(trace);
    }
}

#[test]
fn bad_handles_are_refused_with_messages() {
    let trace = parse(MEMO_LAYER);
    let placement = place(trace, None).unwrap();
    // A placement handle where a trace is expected, and the other way round.
    assert_eq!(memo_trace_add_malloc(placement.cast(), 1, 1), MemoStatus::BadHandle);
    assert!(last_error().contains("is not a live MemoTrace handle"), "{}", last_error());
    assert_eq!(memo_placement_free(trace.cast()), MemoStatus::BadHandle);
    // Made-up values.
    assert_eq!(memo_trace_free(std::ptr::without_provenance_mut(0xdead_beef)), MemoStatus::BadHandle);
    let mut s = MemoPlacementSummary::default();
    // Safety: the out-pointer is valid; the handle is made up, which is what is tested.
    let status = unsafe { memo_placement_summary(std::ptr::without_provenance(usize::MAX), &mut s) };
    assert_eq!(status, MemoStatus::BadHandle);
    // Use after free and double free.
    assert_eq!(memo_placement_free(placement), MemoStatus::Ok);
    assert_eq!(memo_placement_free(placement), MemoStatus::BadHandle);
    // Safety: as above.
    assert_eq!(unsafe { memo_placement_summary(placement, &mut s) }, MemoStatus::BadHandle);
    assert_eq!(memo_trace_free(trace), MemoStatus::Ok);
    assert_eq!(memo_trace_add_free(trace, 13, 128_000_000), MemoStatus::BadHandle);
    assert_eq!(place(trace, None).unwrap_err(), MemoStatus::BadHandle);
}

#[test]
fn bad_requests_and_texts_are_invalid_traces_naming_the_problem() {
    let mut trace = null_mut();
    let text = "malloc 1 10\nfree 2 10\n";
    // Safety: valid text and out-pointer.
    assert_eq!(unsafe { memo_trace_parse(text.as_ptr(), text.len(), &mut trace) }, MemoStatus::InvalidTrace);
    assert!(trace.is_null());
    assert_eq!(
        last_error(),
        "memo_trace_parse: line 2: free of id 2, which is not allocated (never malloc'd, or already freed)"
    );
    // Safety: NULL with length 0 is an empty text.
    assert_eq!(unsafe { memo_trace_parse(null(), 0, &mut trace) }, MemoStatus::InvalidTrace);

    let trace = parse("malloc 1 10\n");
    assert_eq!(memo_trace_add_malloc(trace, 1, 10), MemoStatus::InvalidTrace);
    assert!(last_error().contains("still allocated since request 0"), "{}", last_error());
    assert_eq!(memo_trace_add_free(trace, 1, 11), MemoStatus::InvalidTrace);
    assert_eq!(memo_trace_add_free(trace, 1, 10), MemoStatus::Ok);
    memo_trace_free(trace);
}

#[test]
fn short_arrays_and_bad_indices_are_refused() {
    let trace = parse(MEMO_LAYER);
    let placement = place(trace, None).unwrap();
    let mut offsets = [0u64; 11];
    // Safety: room for 11 offsets, and 11 is what is passed.
    let status = unsafe { memo_placement_offsets(placement, offsets.as_mut_ptr(), offsets.len()) };
    assert_eq!(status, MemoStatus::BufferTooSmall);
    assert!(last_error().contains("room for 11 offsets; the placement has 12"), "{}", last_error());
    assert_eq!(offsets, [0; 11], "nothing is written when the array is short");
    let mut buffer = MemoPlacedBuffer::default();
    // Safety: valid out-pointer.
    assert_eq!(unsafe { memo_placement_buffer(placement, 12, &mut buffer) }, MemoStatus::InvalidArgument);
    assert!(last_error().contains("index 12 is out of range"), "{}", last_error());
    memo_placement_free(placement);
    memo_trace_free(trace);
}

#[test]
fn sizes_past_2_to_the_64_are_too_large() {
    let trace = parse("malloc 1 18446744073709551615\nmalloc 2 18446744073709551615\n");
    assert_eq!(place(trace, None).unwrap_err(), MemoStatus::TooLarge);
    memo_trace_free(trace);
}

#[test]
fn status_names_are_the_header_names() {
    // Safety: memo_status_name returns static NUL-terminated text.
    let name = |status: i32| unsafe { CStr::from_ptr(memo_status_name(status)) }.to_str().unwrap();
    assert_eq!(name(MemoStatus::Infeasible as i32), "MEMO_STATUS_INFEASIBLE");
    assert_eq!(name(1000), "MEMO_STATUS_UNKNOWN");
    let header = include_str!("../include/memo.h");
    for status in MemoStatus::all() {
        assert!(header.contains(&format!("{} = {},", status.name(), status as i32)), "{}", status.name());
    }
}

#[test]
fn handles_work_from_many_threads_at_once() {
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for round in 0..50u64 {
                    let trace = parse(MEMO_LAYER);
                    assert_eq!(memo_trace_add_malloc(trace, 1000 + t, round + 1), MemoStatus::Ok);
                    let placement = place(trace, None).unwrap();
                    assert_eq!(summary(placement).buffers, 13);
                    assert_eq!(memo_trace_free(trace), MemoStatus::Ok);
                    assert_eq!(memo_placement_free(placement), MemoStatus::Ok);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn random_calls_with_any_handles_and_values_never_fail_internally() {
    // A fixed-seed stream of calls mixing live, freed and made-up handles with extreme values:
    // every answer must be a status other than MEMO_STATUS_INTERNAL (a caught panic).
    let mut state = 0x5EED_u64;
    let mut next = move || {
        // SplitMix64.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let extreme = [0, 1, 2, 255, 256, 4096, u32::MAX as u64, u64::MAX / 2, u64::MAX - 1, u64::MAX];
    // Made-up handles far above any the counter issues: small ones (0x77 was one) are live
    // handles of the tests running beside this one in the same process, and freeing one of
    // those made `handles_work_from_many_threads_at_once` fail now and then (CI, 2026-12-04).
    let mut traces: Vec<*mut MemoTrace> = vec![std::ptr::without_provenance_mut(usize::MAX - 0x77)];
    let mut placements: Vec<*mut MemoPlacement> = vec![std::ptr::without_provenance_mut(usize::MAX - 0x78)];
    let mut outcomes = [0u32; 13];
    for _ in 0..3000 {
        let value =
            |r: u64| if r.is_multiple_of(2) { extreme[(r / 2 % extreme.len() as u64) as usize] } else { r % 64 };
        let trace = traces[(next() % traces.len() as u64) as usize];
        let placement = placements[(next() % placements.len() as u64) as usize];
        let status = match next() % 9 {
            0 => {
                let mut out = null_mut();
                // Safety: valid out-pointer.
                let status = unsafe { memo_trace_new(&mut out) };
                traces.push(out);
                status
            }
            1 | 2 => memo_trace_add_malloc(trace, next() % 8, value(next())),
            3 => memo_trace_add_free(trace, next() % 8, value(next())),
            4 => memo_trace_free(trace),
            5 => {
                let options =
                    MemoPlaceOptions { capacity: value(next()), alignment: value(next()), budget_nodes: next() % 1000 };
                let mut out = null_mut();
                // Safety: valid options and out-pointer.
                let status = unsafe { memo_place(trace, &options, &mut out) };
                if !out.is_null() {
                    placements.push(out);
                }
                outcomes[status as usize] += 1;
                status
            }
            6 => {
                let mut s = MemoPlacementSummary::default();
                // Safety: valid out-pointer.
                unsafe { memo_placement_summary(placement, &mut s) }
            }
            7 => {
                let mut offsets = [0u64; 4];
                // Safety: room for 4.
                unsafe { memo_placement_offsets(placement, offsets.as_mut_ptr(), offsets.len()) }
            }
            _ => memo_placement_free(placement),
        };
        assert_ne!(status, MemoStatus::Internal, "{}", last_error());
        if status != MemoStatus::Ok {
            assert!(!last_error().is_empty());
        }
    }
    // The stream reaches placements that succeed and ones that fail for each reason of substance.
    for status in [MemoStatus::Ok, MemoStatus::BadHandle, MemoStatus::Infeasible, MemoStatus::TooLarge] {
        assert!(outcomes[status as usize] > 5, "{outcomes:?}");
    }
}
