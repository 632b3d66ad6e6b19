//! Plan files through the C ABI: load (bytes, file), check, totals, provenance, buffers; decode
//! errors and broken plans with the decoder's and the checker's own messages; NULL and bad
//! handles.

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use memo_capi::placement::{memo_trace_free, memo_trace_new};
use memo_capi::plan_file::*;
use memo_capi::status::memo_last_error;
use memo_capi::MemoStatus;
use memo_plan_core::check::check_plan;
use memo_plan_core::model::{Hardware, ModelConfig, Parallelism};
use memo_plan_core::plan::{BufferKind, Place, Plan, Strategy};
use memo_plan_core::planner::{plan, PlanRequest};

fn last_error() -> String {
    // Safety: never NULL; copied at once.
    unsafe { CStr::from_ptr(memo_last_error()) }.to_string_lossy().into_owned()
}

/// The tiny model's memo plan on one H200: 4 layers (the last two never swap, so with 2 the plan
/// would have no host slots), h 64, 4 heads, 64 tokens.
fn tiny_plan() -> Plan {
    let request = PlanRequest::new(
        ModelConfig::new("tiny", 4, 64, 4, 64, 1),
        Parallelism::single(),
        Hardware::preset("h200x1").unwrap(),
        Strategy::Memo,
    );
    plan(&request).unwrap().plan
}

fn load(bytes: &[u8]) -> Result<*mut MemoPlan, MemoStatus> {
    let mut out = std::ptr::without_provenance_mut(1);
    // Safety: the bytes and the out-pointer are valid.
    let status = unsafe { memo_plan_load(bytes.as_ptr(), bytes.len(), &mut out) };
    if status == MemoStatus::Ok {
        Ok(out)
    } else {
        assert!(out.is_null(), "a failed load leaves NULL");
        Err(status)
    }
}

fn name(text: *const c_char) -> &'static str {
    // Safety: the library's static names are NUL-terminated and never freed.
    unsafe { CStr::from_ptr(text) }.to_str().unwrap()
}

fn count(f: unsafe extern "C" fn(*const MemoPlan, *mut usize) -> MemoStatus, plan: *const MemoPlan) -> usize {
    let mut out = usize::MAX;
    // Safety: a valid out-pointer.
    assert_eq!(unsafe { f(plan, &mut out) }, MemoStatus::Ok, "{}", last_error());
    out
}

fn violation(plan: *const MemoPlan, index: usize) -> Result<String, MemoStatus> {
    let mut needed = 0usize;
    // Safety: NULL with length 0 asks for the size.
    let status = unsafe { memo_plan_violation(plan, index, null_mut(), 0, &mut needed) };
    if status != MemoStatus::BufferTooSmall {
        return Err(status);
    }
    let mut text = vec![1 as c_char; needed];
    // Safety: room for `needed` bytes.
    let status = unsafe { memo_plan_violation(plan, index, text.as_mut_ptr(), text.len(), null_mut()) };
    assert_eq!(status, MemoStatus::Ok, "{}", last_error());
    // Safety: the library wrote a NUL-terminated string into `text`.
    Ok(unsafe { CStr::from_ptr(text.as_ptr()) }.to_str().unwrap().to_string())
}

#[test]
fn a_planned_plan_reads_back_whole_through_the_c_abi() {
    let original = tiny_plan();
    let handle = load(&original.encode()).unwrap_or_else(|s| panic!("{s:?}: {}", last_error()));
    assert_eq!(memo_plan_check(handle), MemoStatus::Ok, "{}", last_error());
    assert_eq!(count(memo_plan_violation_count, handle), 0);
    assert_eq!(violation(handle, 0), Err(MemoStatus::InvalidArgument));
    assert!(last_error().contains("the plan has 0 violations"), "{}", last_error());

    let mut totals = MemoPlanTotals::default();
    // Safety: a valid out-pointer.
    assert_eq!(unsafe { memo_plan_totals(handle, &mut totals) }, MemoStatus::Ok);
    let t = original.totals;
    assert_eq!(
        (totals.arena_bytes, totals.arena_lower_bound_bytes, totals.host_bytes),
        (t.arena_bytes, t.arena_lower_bound_bytes, t.host_bytes)
    );
    assert_eq!((totals.parameter_bytes, totals.rounding_buffer_bytes), (t.parameter_bytes, t.rounding_buffer_bytes));
    assert!(totals.arena_bytes >= totals.arena_lower_bound_bytes && totals.arena_lower_bound_bytes > 0);

    let mut provenance = std::mem::MaybeUninit::<MemoPlanProvenance>::uninit();
    // Safety: a valid out-pointer; read only after the call wrote it.
    assert_eq!(unsafe { memo_plan_provenance(handle, provenance.as_mut_ptr()) }, MemoStatus::Ok);
    // Safety: written by the successful call.
    let p = unsafe { provenance.assume_init() };
    let q = &original.provenance;
    assert_eq!(name(p.strategy), "memo");
    assert!(["bandwidth", "host_memory", "none", "forced"].contains(&name(p.alpha_bound)));
    assert_eq!((p.alpha, p.swapped_rows, p.layers, p.seq_len), (q.alpha, q.swapped_rows, 4, 64));
    assert_eq!((p.hidden, p.heads, p.micro_batch, p.tensor_parallel, p.data_parallel), (64, 4, 1, 1, 1));
    assert_eq!((p.level2_peak, p.level2_optimal), (q.level2.peak_bytes, u32::from(q.level2.optimal)));
    assert_eq!(p.level1_forward_peak, q.level1_forward.peak_bytes);

    let mut model = [0 as c_char; 16];
    let mut needed = 0;
    // Safety: room for 16 bytes; a valid `needed`.
    assert_eq!(unsafe { memo_plan_model_name(handle, model.as_mut_ptr(), 16, &mut needed) }, MemoStatus::Ok);
    // Safety: NUL-terminated by the call.
    assert_eq!((unsafe { CStr::from_ptr(model.as_ptr()) }.to_str().unwrap(), needed), ("tiny", 5));
    // Safety: room for 4 bytes only: refused, nothing written.
    let short = unsafe { memo_plan_model_name(handle, model.as_mut_ptr(), 4, null_mut()) };
    assert_eq!(short, MemoStatus::BufferTooSmall);
    assert!(last_error().contains("the text needs 5"), "{}", last_error());

    assert_eq!(count(memo_plan_instruction_count, handle), original.instructions.len());
    assert_eq!(count(memo_plan_buffer_count, handle), original.buffers.len());
    let (mut device, mut host) = (0, 0);
    for (index, b) in original.buffers.iter().enumerate() {
        let mut out = std::mem::MaybeUninit::<MemoPlanBuffer>::uninit();
        // Safety: a valid out-pointer; read only after the call wrote it.
        assert_eq!(unsafe { memo_plan_buffer(handle, index, out.as_mut_ptr()) }, MemoStatus::Ok);
        // Safety: written by the successful call.
        let c = unsafe { out.assume_init() };
        assert_eq!((name(c.kind), name(c.role)), (b.kind.name(), b.role.name()), "buffer {index}");
        assert_eq!((c.rows, c.row_bytes, c.bytes), (b.rows, b.row_bytes, b.bytes().unwrap()));
        assert_eq!(c.layer, b.layer.map_or(-1, i64::from));
        assert_eq!(c.slot, u32::from(b.slot));
        match b.place {
            Place::Device { offset } => {
                assert_eq!((c.place, c.offset), (MEMO_PLACE_DEVICE, offset));
                assert!(c.offset + c.bytes <= totals.arena_bytes);
                device += 1;
            }
            Place::Host { offset } => {
                assert_eq!((c.place, c.offset), (MEMO_PLACE_HOST, offset));
                host += 1;
            }
        }
    }
    assert!(device > 0 && host > 0, "the memo plan swaps: it has host slots ({device} device, {host} host)");
    let mut out = std::mem::MaybeUninit::<MemoPlanBuffer>::uninit();
    // Safety: a valid out-pointer.
    let status = unsafe { memo_plan_buffer(handle, original.buffers.len(), out.as_mut_ptr()) };
    assert_eq!(status, MemoStatus::InvalidArgument);
    assert!(last_error().starts_with("memo_plan_buffer: buffer index"), "{}", last_error());

    assert_eq!(memo_plan_free(handle), MemoStatus::Ok);
    assert_eq!(memo_plan_free(handle), MemoStatus::BadHandle);
    assert_eq!(memo_plan_free(null_mut()), MemoStatus::Ok);
}

#[test]
fn a_plan_file_loads_like_its_bytes_and_bad_files_say_why() {
    let bytes = tiny_plan().encode();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plan_c_abi_tiny.memo");
    std::fs::write(&path, &bytes).unwrap();
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let mut handle = null_mut();
    // Safety: a valid path and out-pointer.
    assert_eq!(unsafe { memo_plan_load_file(c_path.as_ptr(), &mut handle) }, MemoStatus::Ok, "{}", last_error());
    assert_eq!(memo_plan_check(handle), MemoStatus::Ok);
    assert_eq!(count(memo_plan_buffer_count, handle), tiny_plan().buffers.len());
    assert_eq!(memo_plan_free(handle), MemoStatus::Ok);

    let missing = CString::new("/nonexistent/plan.memo").unwrap();
    // Safety: a valid path and out-pointer.
    assert_eq!(unsafe { memo_plan_load_file(missing.as_ptr(), &mut handle) }, MemoStatus::Io);
    assert!(handle.is_null());
    assert!(last_error().starts_with("memo_plan_load_file: cannot read the plan /nonexistent/plan.memo"));

    // A truncated file: the decoder's message, after the path.
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    // Safety: a valid path and out-pointer.
    assert_eq!(unsafe { memo_plan_load_file(c_path.as_ptr(), &mut handle) }, MemoStatus::PlanDecode);
    let expected = Plan::decode(&bytes[..bytes.len() / 2]).unwrap_err().to_string();
    assert_eq!(last_error(), format!("memo_plan_load_file: {}: {expected}", path.display()));
    std::fs::remove_file(&path).unwrap();

    // Bytes that are not a plan at all, and none.
    assert_eq!(load(b"malloc 1 10\n"), Err(MemoStatus::PlanDecode));
    assert!(last_error().starts_with("memo_plan_load: the plan bytes: "), "{}", last_error());
    assert!(last_error().contains("MEMOPLAN"), "the decoder says what it expected: {}", last_error());
    assert_eq!(load(&[]), Err(MemoStatus::PlanDecode));
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    assert_eq!(load(&flipped), Err(MemoStatus::PlanDecode));
    assert_eq!(last_error(), format!("memo_plan_load: the plan bytes: {}", Plan::decode(&flipped).unwrap_err()));
}

#[test]
fn a_plan_that_breaks_the_rules_is_plan_invalid_with_each_violation() {
    // Two live device buffers moved onto the same bytes: the checker must say so; the bytes
    // still decode (the decoder checks structure, not safety).
    let mut broken = tiny_plan();
    let parameters: Vec<usize> =
        (0..broken.buffers.len()).filter(|&i| broken.buffers[i].kind == BufferKind::Parameter).take(2).collect();
    let offset = match broken.buffers[parameters[0]].place {
        Place::Device { offset } => offset,
        Place::Host { .. } => unreachable!("parameters are on the device"),
    };
    broken.buffers[parameters[1]].place = Place::Device { offset };
    let expected: Vec<String> = check_plan(&broken).unwrap_err().iter().map(ToString::to_string).collect();
    let handle = load(&broken.encode()).unwrap();
    assert_eq!(count(memo_plan_violation_count, handle), expected.len());
    assert_eq!(memo_plan_check(handle), MemoStatus::PlanInvalid);
    let message = last_error();
    assert!(
        message
            .starts_with(&format!("memo_plan_check: the plan breaks {} rule(s) of spec/validity.md", expected.len())),
        "{message}"
    );
    assert!(message.contains(&expected[0]), "{message}");
    assert!(expected.iter().any(|v| v.contains("share arena bytes")), "{expected:?}");
    for (index, text) in expected.iter().enumerate() {
        assert_eq!(violation(handle, index).as_ref(), Ok(text));
    }
    assert_eq!(violation(handle, expected.len()), Err(MemoStatus::InvalidArgument));
    assert_eq!(memo_plan_free(handle), MemoStatus::Ok);
}

#[test]
fn null_pointers_and_bad_handles_are_refused() {
    let handle = load(&tiny_plan().encode()).unwrap();
    let mut size = 0usize;
    // Safety: NULL out-pointers are refused before anything is done.
    unsafe {
        assert_eq!(memo_plan_load(null(), 4, null_mut()), MemoStatus::NullPointer);
        let mut out = null_mut();
        assert_eq!(memo_plan_load(null(), 4, &mut out), MemoStatus::NullPointer);
        assert_eq!(last_error(), "memo_plan_load: `bytes` is NULL; pass a valid pointer");
        assert_eq!(memo_plan_load_file(null(), &mut out), MemoStatus::NullPointer);
        assert_eq!(memo_plan_totals(handle, null_mut()), MemoStatus::NullPointer);
        assert_eq!(memo_plan_provenance(handle, null_mut()), MemoStatus::NullPointer);
        assert_eq!(memo_plan_buffer(handle, 0, null_mut()), MemoStatus::NullPointer);
        assert_eq!(memo_plan_buffer_count(handle, null_mut()), MemoStatus::NullPointer);
        assert_eq!(memo_plan_instruction_count(null(), &mut size), MemoStatus::NullPointer);
        assert_eq!(memo_plan_violation_count(handle, null_mut()), MemoStatus::NullPointer);
        // Room claimed but no buffer: refused, not written through.
        assert_eq!(memo_plan_model_name(handle, null_mut(), 64, &mut size), MemoStatus::NullPointer);
        assert_eq!(size, 5, "`needed` is written even when the copy is refused");
    }
    assert_eq!(memo_plan_check(null()), MemoStatus::NullPointer);

    // A trace handle is not a plan handle; a freed plan is gone; a made-up value is refused.
    let mut trace = null_mut();
    // Safety: a valid out-pointer.
    assert_eq!(unsafe { memo_trace_new(&mut trace) }, MemoStatus::Ok);
    assert_eq!(memo_plan_check(trace.cast()), MemoStatus::BadHandle);
    assert!(last_error().contains("is not a live MemoPlan handle"), "{}", last_error());
    assert_eq!(memo_trace_free(trace), MemoStatus::Ok);
    assert_eq!(memo_plan_free(handle), MemoStatus::Ok);
    // Safety: a valid out-pointer; the handle is refused before it is used.
    assert_eq!(unsafe { memo_plan_buffer_count(handle, &mut size) }, MemoStatus::BadHandle);
    assert_eq!(memo_plan_check(std::ptr::without_provenance(0xDEAD_BEEF)), MemoStatus::BadHandle);
}

#[test]
fn plans_are_read_from_many_threads_at_once() {
    let bytes = tiny_plan().encode();
    let handle = load(&bytes).unwrap().addr();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let bytes = bytes.clone();
            std::thread::spawn(move || {
                let shared: *const MemoPlan = std::ptr::without_provenance(handle);
                for _ in 0..20 {
                    assert_eq!(memo_plan_check(shared), MemoStatus::Ok);
                    let own = load(&bytes).unwrap();
                    assert_eq!(count(memo_plan_buffer_count, own), count(memo_plan_buffer_count, shared));
                    assert_eq!(memo_plan_free(own), MemoStatus::Ok);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(memo_plan_free(std::ptr::without_provenance_mut(handle)), MemoStatus::Ok);
}

/// Fixes the header's length and checksum after a change to the body, so that mutated bytes
/// reach the decoder's structure checks instead of stopping at the checksum.
fn reseal(bytes: &mut [u8]) {
    use memo_plan_core::plan::encode::{checksum, header, HEADER_BYTES};
    let length = bytes.len() as u64;
    bytes[header::LENGTH..header::LENGTH + 8].copy_from_slice(&length.to_le_bytes());
    let sum = checksum(&bytes[HEADER_BYTES..]);
    bytes[header::CHECKSUM..header::CHECKSUM + 4].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn mutated_plans_are_refused_or_read_never_internal() {
    // A fixed-seed stream of byte changes to a real plan: every call answers with a status of
    // substance (never MEMO_STATUS_INTERNAL, a caught panic), and both outcomes of each step
    // are reached.
    let original = tiny_plan().encode();
    let mut rng = memo_plan_core::generate::SplitMix64::new(0x91A7);
    let (mut decoded, mut refused, mut invalid) = (0, 0, 0);
    for _ in 0..300 {
        let mut bytes = original.clone();
        for _ in 0..1 + rng.below(3) {
            let at = memo_plan_core::plan::encode::HEADER_BYTES
                + rng.below((bytes.len() - memo_plan_core::plan::encode::HEADER_BYTES) as u64) as usize;
            bytes[at] = rng.next_u64() as u8;
        }
        if rng.below(4) == 0 {
            bytes.truncate(bytes.len() - rng.below(64) as usize);
        }
        reseal(&mut bytes);
        let plan = match load(&bytes) {
            Ok(plan) => plan,
            Err(status) => {
                assert_eq!(status, MemoStatus::PlanDecode, "{}", last_error());
                refused += 1;
                continue;
            }
        };
        decoded += 1;
        let check = memo_plan_check(plan);
        assert!(matches!(check, MemoStatus::Ok | MemoStatus::PlanInvalid), "{check:?}: {}", last_error());
        invalid += usize::from(check == MemoStatus::PlanInvalid);
        for index in 0..count(memo_plan_violation_count, plan) {
            assert!(violation(plan, index).is_ok_and(|text| !text.is_empty()));
        }
        for index in 0..count(memo_plan_buffer_count, plan) {
            let mut out = std::mem::MaybeUninit::<MemoPlanBuffer>::uninit();
            // Safety: a valid out-pointer.
            let status = unsafe { memo_plan_buffer(plan, index, out.as_mut_ptr()) };
            assert_eq!(status, MemoStatus::Ok, "{}", last_error());
        }
        assert_eq!(memo_plan_free(plan), MemoStatus::Ok);
    }
    assert!(decoded > 20 && refused > 20 && invalid > 5, "decoded {decoded}, refused {refused}, invalid {invalid}");
}
