//! The binding against a stand-in library built here from `tests/fake/nccl.c` with gcc (SKIP
//! without gcc): symbol resolution, the version check, the config and unique id as NCCL reads
//! them, the join timeout and abort, the mapping of every result to an error, and the arguments
//! of each collective, for real and without a GPU. Each test builds its own copy (its own file,
//! so its own counters). What each rank of the fake does is written at the top of the C file.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::time::Duration;

use memo_nccl::{Communicator, DataType, Nccl, NcclError, ReduceOp, Search, UniqueId, Version, NCCL};
use memo_runtime::rendezvous::TorchrunEnv;

/// Long enough never to pass when the fake answers.
const NEVER: Duration = Duration::from_secs(20);
/// For the tests whose point is that a timeout passes.
const SHORT: Duration = Duration::from_millis(200);

/// Compiles the fake as `<tmp>/<name>/libnccl.so.2`; `None` (after printing SKIP) without gcc.
fn build(name: &str, defines: &[&str]) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-nccl-{name}"));
    std::fs::create_dir_all(&dir).expect("temporary folder");
    let library = dir.join("libnccl.so.2");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake/nccl.c");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let output = std::process::Command::new(&compiler)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&library)
        .arg(&source)
        .args(defines)
        .output();
    match output {
        Err(e) => {
            skip::skip(format!("no C compiler ({compiler}: {e}) to build the stand-in libnccl.so.2"));
            None
        }
        Ok(out) => {
            assert!(out.status.success(), "{compiler} failed:\n{}", String::from_utf8_lossy(&out.stderr));
            Some(library)
        }
    }
}

/// The fake's counters: init, abort, finalize, destroy, group start, group end, collectives, polls.
fn counts(library: &Path) -> [i32; 8] {
    let mut out = [0i32; 8];
    // Safety: the fake built above; `fake_counts(int*)` writes 8 ints. Opening it again returns the
    // handle `Nccl::load` made (same file), so these are the counters the binding's calls moved.
    unsafe {
        let lib = libloading::Library::new(library).expect("reopen");
        let f: libloading::Symbol<unsafe extern "C" fn(*mut i32)> = lib.get(b"fake_counts\0").expect("fake_counts");
        f(out.as_mut_ptr());
        std::mem::forget(lib); // never unload what the binding uses
    }
    out
}

/// The fake's record of the last collective: count, data type, op (-1 for all-gather), stream,
/// send, recv.
fn last_call(library: &Path) -> (usize, i32, i32, usize, usize, usize) {
    let (mut count, mut dtype, mut op) = (0usize, 0i32, 0i32);
    let (mut stream, mut send, mut recv) = (std::ptr::null_mut(), std::ptr::null(), std::ptr::null_mut());
    type LastCall =
        unsafe extern "C" fn(*mut usize, *mut i32, *mut i32, *mut *mut c_void, *mut *const c_void, *mut *mut c_void);
    // Safety: as in `counts`; the declaration matches `fake_last_call` in the C file.
    unsafe {
        let lib = libloading::Library::new(library).expect("reopen");
        let f: libloading::Symbol<LastCall> = lib.get(b"fake_last_call\0").expect("fake_last_call");
        f(&mut count, &mut dtype, &mut op, &mut stream, &mut send, &mut recv);
        std::mem::forget(lib);
    }
    (count, dtype, op, stream as usize, send as usize, recv as usize)
}

fn load(library: &Path) -> Nccl {
    Nccl::load(&NCCL, &Search::file(library)).expect("the fake loads")
}

const INIT: usize = 0;
const ABORT: usize = 1;
const FINALIZE: usize = 2;
const DESTROY: usize = 3;
const GROUP_START: usize = 4;
const GROUP_END: usize = 5;
const COLLECTIVES: usize = 6;
const POLLS: usize = 7;

#[test]
fn the_library_is_found_by_its_soname_in_a_folder_and_by_path() {
    let Some(library) = build("found", &[]) else { return };
    let dir = library.parent().expect("folder");
    let by_folder = Nccl::load(&NCCL, &Search::only([dir])).expect("loads from the folder");
    assert_eq!(by_folder.origin(), library.display().to_string());
    assert_eq!(by_folder.version(), Version { major: 2, minor: 27, patch: 3 });
    assert_eq!(load(&library).version().to_string(), "2.27.3");
    assert!(!by_folder.supports_multi_rank_per_gpu(), "2.27 never accepts several ranks per GPU");
}

#[test]
fn an_old_library_is_refused_by_its_version_in_both_code_schemes() {
    for (name, code, version) in [("old-2-12", "21212", Some((2, 12, 12))), ("old-2-8", "2804", Some((2, 8, 4)))] {
        let Some(library) = build(name, &[&format!("-DFAKE_VERSION={code}"), "-DFAKE_NO_CONFIG"]) else { return };
        let error = Nccl::load(&NCCL, &Search::file(&library)).expect_err("too old");
        let version = version.map(|(major, minor, patch)| Version { major, minor, patch });
        assert_eq!(
            error,
            NcclError::TooOld { library: library.display().to_string(), code: code.parse().expect("int"), version }
        );
        assert!(error.is_unavailable());
        assert!(error.to_string().contains("2.14.0 or newer is needed"), "{error}");
    }
    let Some(library) = build("not-a-code", &["-DFAKE_VERSION=5000"]) else { return };
    let error = Nccl::load(&NCCL, &Search::file(&library)).expect_err("not a version");
    assert_eq!(error, NcclError::TooOld { library: library.display().to_string(), code: 5000, version: None });
}

#[test]
fn a_library_lacking_a_function_is_refused_by_the_functions_name() {
    let Some(library) = build("no-config", &["-DFAKE_NO_CONFIG"]) else { return };
    assert_eq!(
        Nccl::load(&NCCL, &Search::file(&library)).expect_err("lacks a function"),
        NcclError::SymbolNotFound { library: library.display().to_string(), symbol: "ncclCommInitRankConfig" }
    );
}

#[test]
fn rank_0_joins_and_each_collective_passes_its_arguments() {
    let Some(library) = build("collectives", &[]) else { return };
    let nccl = load(&library);
    let id = nccl.unique_id().expect("unique id");
    assert_eq!(id.0[..4], [1, 4, 7, 10]);
    // The fake refuses the id unless its 128 bytes arrive by value intact, and the config unless
    // its size, magic, version and blocking are where NCCL reads them.
    let comm = Communicator::init(&nccl, &id, 4, 0, NEVER).expect("rank 0 joins");
    assert_eq!((comm.rank(), comm.world_size()), (0, 4));
    let stream = 0x5eed_usize as *mut c_void;
    // Safety: the fake reads no memory through these addresses; it records them.
    unsafe {
        comm.all_gather(0x1000, 0x2000, 5, DataType::Bf16, stream).expect("all-gather");
        assert_eq!(last_call(&library), (5, 9, -1, 0x5eed, 0x1000, 0x2000));
        comm.reduce_scatter(0x3000, 0x4000, 6, DataType::F32, ReduceOp::Max, stream).expect("reduce-scatter");
        assert_eq!(last_call(&library), (6, 7, 2, 0x5eed, 0x3000, 0x4000));
        comm.all_reduce(0x5000, 0x5000, 7, DataType::U32, ReduceOp::Sum, stream).expect("all-reduce");
        assert_eq!(last_call(&library), (7, 3, 0, 0x5eed, 0x5000, 0x5000));
        nccl.group(&[&comm], || comm.all_reduce(0x6000, 0x7000, 8, DataType::U8, ReduceOp::Sum, stream))
            .expect("grouped all-reduce");
        assert_eq!(last_call(&library), (8, 1, 0, 0x5eed, 0x6000, 0x7000));
    }
    comm.check().expect("no asynchronous error");
    let before = counts(&library);
    assert_eq!((before[INIT], before[COLLECTIVES], before[GROUP_START], before[GROUP_END]), (1, 4, 1, 1));
    drop(comm);
    let after = counts(&library);
    assert_eq!((after[FINALIZE], after[DESTROY], after[ABORT]), (1, 1, 0), "dropped: finalized and destroyed");
}

#[test]
fn a_rank_that_never_joins_times_out_and_is_aborted() {
    let Some(library) = build("timeout", &[]) else { return };
    let nccl = load(&library);
    let id = nccl.unique_id().expect("unique id");
    let error = Communicator::init(&nccl, &id, 4, 1, SHORT).expect_err("never joins");
    assert_eq!(error, NcclError::Timeout { call: "ncclCommInitRankConfig", rank: 1, world_size: 4, waited: SHORT });
    assert!(error.to_string().contains("did not complete within 200ms; the communicator was aborted"), "{error}");
    let counts = counts(&library);
    assert_eq!((counts[INIT], counts[ABORT], counts[DESTROY]), (1, 1, 0));
}

#[test]
fn a_failed_join_carries_the_call_the_result_its_string_and_the_last_error() {
    let Some(library) = build("init-fails", &[]) else { return };
    let nccl = load(&library);
    let id = nccl.unique_id().expect("unique id");
    let error = Communicator::init(&nccl, &id, 4, 2, NEVER).expect_err("fails");
    assert_eq!(
        error.to_string(),
        "ncclCommInitRankConfig failed: ncclSystemError (2): fake: unhandled system error; last error: fake: socket \
         connect to the bootstrap root failed"
    );
    assert!(!error.is_unavailable());
}

#[test]
fn an_asynchronous_error_aborts_the_communicator_and_refuses_later_calls() {
    let Some(library) = build("async-error", &[]) else { return };
    let nccl = load(&library);
    let id = nccl.unique_id().expect("unique id");
    let comm = Communicator::init(&nccl, &id, 4, 3, NEVER).expect("rank 3 joins");
    let error = comm.check().expect_err("the peer is gone");
    let NcclError::Call { code: 6, name: "ncclRemoteError", last: Some(last), .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(last, "fake: peer 1 closed the connection");
    // Safety: refused before the library is called (the fake would record it).
    let later = unsafe { comm.all_reduce(0x1000, 0x1000, 1, DataType::F32, ReduceOp::Sum, std::ptr::null_mut()) };
    assert_eq!(later, Err(NcclError::Aborted { call: "ncclAllReduce", cause: error.to_string() }));
    drop(comm);
    let counts = counts(&library);
    assert_eq!((counts[ABORT], counts[COLLECTIVES], counts[FINALIZE], counts[DESTROY]), (1, 0, 0, 0));
}

#[test]
fn a_collective_the_library_refuses_is_an_error_and_aborts() {
    let Some(library) = build("bad-call", &[]) else { return };
    let nccl = load(&library);
    let comm = Communicator::init(&nccl, &nccl.unique_id().expect("id"), 2, 0, NEVER).expect("joins");
    // Safety: the fake refuses a null buffer without reading anything.
    let error = unsafe { comm.all_gather(0, 0x2000, 4, DataType::Bf16, std::ptr::null_mut()) }.expect_err("null");
    assert_eq!(
        error,
        NcclError::Call {
            call: "ncclAllGather",
            code: 4,
            name: "ncclInvalidArgument",
            message: "fake: invalid argument".into(),
            last: Some("fake: a null buffer".into()),
        }
    );
    comm.abort(); // already aborted: not aborted twice
    let counts = counts(&library);
    assert_eq!((counts[ABORT], counts[DESTROY]), (1, 0));
}

#[test]
fn arguments_the_library_cannot_take_are_refused_before_it_is_called() {
    let Some(library) = build("invalid", &[]) else { return };
    let nccl = load(&library);
    let id = nccl.unique_id().expect("id");
    for (world, rank) in [(0, 0), (4, 4), (usize::MAX, 0)] {
        assert!(matches!(Communicator::init(&nccl, &id, world, rank, NEVER), Err(NcclError::Invalid(_))));
    }
    let comm = Communicator::init(&nccl, &id, 4, 0, NEVER).expect("joins");
    // Safety: refused before the library is called.
    let overflow = unsafe { comm.all_gather(1, 2, usize::MAX / 2, DataType::F32, std::ptr::null_mut()) };
    assert!(matches!(overflow, Err(NcclError::Invalid(_))), "{overflow:?}");
    assert_eq!(counts(&library)[COLLECTIVES], 0);
    comm.destroy().expect("destroyed");
    assert_eq!(counts(&library)[INIT], 1);
}

#[test]
fn torchrun_ranks_get_the_id_over_tcp_and_join_with_it() {
    let Some(library) = build("torchrun", &[]) else { return };
    let nccl = load(&library);
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
    let env = |rank| TorchrunEnv {
        rank,
        world_size: 2,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        port,
        timeout: Duration::from_secs(1),
    };
    let (zero, one) = std::thread::scope(|scope| {
        let one = scope.spawn(|| Communicator::from_torchrun(&nccl, &env(1)).map(|c| c.rank()));
        let zero = Communicator::from_torchrun(&nccl, &env(0)).map(|c| c.rank());
        (zero, one.join().expect("no panic"))
    });
    assert_eq!(zero, Ok(0));
    // Rank 1 of the fake never joins; had the id's bytes changed on the way, the fake would have
    // refused them with ncclInvalidArgument instead.
    assert_eq!(
        one,
        Err(NcclError::Timeout {
            call: "ncclCommInitRankConfig",
            rank: 1,
            world_size: 2,
            waited: Duration::from_secs(1)
        })
    );
    assert_eq!(UniqueId::from_bytes(&[0; 128]).map(|id| id.0[0]), Ok(0));
}

#[test]
fn a_group_that_ends_in_progress_is_waited_for_and_an_aborted_member_is_not_polled() {
    let Some(library) = build("group-in-progress", &["-DFAKE_GROUP_IN_PROGRESS"]) else { return };
    let nccl = load(&library);
    let comm = Communicator::init(&nccl, &nccl.unique_id().expect("id"), 2, 0, NEVER).expect("joins");
    // Safety: the fake reads no memory through these addresses.
    let grouped = nccl.group(&[&comm], || unsafe {
        comm.all_reduce(0x1000, 0x1000, 3, DataType::F32, ReduceOp::Sum, std::ptr::null_mut())
    });
    assert_eq!(grouped, Ok(()));
    let polls = counts(&library)[POLLS];
    // A call that fails inside the group aborts the communicator; a closure that ignores the error
    // still ends the group, which must then not poll the aborted communicator.
    let ignored = nccl.group(&[&comm], || {
        // Safety: the fake refuses a null buffer without reading anything.
        let _ = unsafe { comm.all_gather(0, 0x2000, 1, DataType::U8, std::ptr::null_mut()) };
        Ok(())
    });
    let Err(NcclError::Aborted { call: "ncclGroupEnd", cause }) = &ignored else { panic!("{ignored:?}") };
    assert!(cause.starts_with("ncclAllGather failed: ncclInvalidArgument (4)"), "{cause}");
    let after = counts(&library);
    assert_eq!(after[POLLS], polls, "the aborted communicator was polled");
    assert_eq!((after[GROUP_START], after[GROUP_END], after[ABORT]), (2, 2, 1));
}
