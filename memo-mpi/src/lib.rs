//! CPU ranks in separate processes: [`MpiGroup`], an implementation of
//! [`memo_runtime::Collectives`] over Open MPI, for `memo train --device cpu --tensor-parallel T`
//! launched as `T` processes by `mpirun` (one rank each).
//!
//! **Loaded at run time.** The library is opened with `libloading` (`MEMO_MPI_LIBRARY`, else
//! `libmpi.so.40`, Open MPI 4's soname, then `libmpi.so`), so nothing here needs MPI to build and
//! a machine without it gets an error saying what to install, never a panic. It is opened with
//! `RTLD_GLOBAL`: Open MPI's plugins (`mca_*.so`) resolve symbols of `libmpi` when it loads them.
//!
//! **Open MPI only.** MPI fixes the C API but not the ABI: in Open MPI a handle such as
//! `MPI_COMM_WORLD` or `MPI_BYTE` is the *address of an exported global* (`ompi_mpi_comm_world`,
//! `ompi_mpi_byte`, `ompi_mpi_errors_return`), a request is a pointer, `MPI_STATUS_IGNORE` is a
//! null pointer and `MPI_THREAD_SERIALIZED` is 2. MPICH (and its derivatives) use integer handles
//! and other values, so this binding checks `MPI_Get_library_version` and the globals and refuses
//! any other library with a message, rather than calling it with the wrong ABI.
//!
//! **Same bits as the in-process group, by construction.** `all_gather` is MPI's allgather of
//! bytes. `reduce_scatter` and `all_reduce` gather every rank's bytes and apply
//! [`memo_runtime::collective::reduce`] locally, in rank order: the arithmetic is the very function
//! [`memo_runtime::LocalGroup`] applies, on the same inputs, so every rank gets the bits the
//! threaded run gets (MPI's own reductions would add in an order of their choosing). This moves
//! `t` times more bytes than a ring reduction; the CPU ranks are a reference, not a fast path.
//!
//! **Every call checks the others' first.** Each call first gathers a fixed 40-byte description
//! from every rank (which call, its sizes, its exchange peers), so ranks that issue different
//! calls or sizes all fail with the same error before any payload moves (MPI itself would
//! truncate, mismatch silently, or hang).
//!
//! **No hang.** Every wait is a non-blocking call polled with `MPI_Test` until it completes, the
//! group's timeout passes (`MEMO_COLLECTIVE_TIMEOUT` seconds, else
//! [`memo_runtime::collective::DEFAULT_TIMEOUT`]), or a peer's abort arrives. [`Collectives::abort`]
//! sends its reason to every other rank on a tag of its own; every rank keeps a receive posted for
//! it and fails its pending and later calls with [`CollectiveError::RankFailed`] naming the rank.
//! A call that fails leaves its MPI requests pending (MPI cannot cancel a collective), so their
//! buffers are leaked on purpose (MPI may still write them) and the process must not call
//! `MPI_Finalize`: it exits with its error and `mpirun` ends the job ([`MpiGroup::finish`]).
//!
//! **Threads.** MPI is initialised with `MPI_THREAD_SERIALIZED`, and every MPI call here is made
//! under one mutex.
#![deny(missing_docs)]

use std::ffi::{c_char, c_int, c_void, OsString};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
use memo_runtime::collective::{
    reduce, shape_problem, Collective, CollectiveError, Element, Reduction, DEFAULT_TIMEOUT,
};
use memo_runtime::Collectives;

/// The variable naming the library file explicitly.
pub const LIBRARY_VARIABLE: &str = "MEMO_MPI_LIBRARY";

/// The variable giving the group's timeout in seconds (how long one call waits for the others).
pub const TIMEOUT_VARIABLE: &str = "MEMO_COLLECTIVE_TIMEOUT";

/// The files tried when [`LIBRARY_VARIABLE`] is unset: Open MPI 4's soname, then the development
/// link.
pub const NAMES: &[&str] = &["libmpi.so.40", "libmpi.so"];

/// What to install when the library is missing.
pub const INSTALL: &str = "install Open MPI (Debian/Ubuntu: `apt-get install openmpi-bin`, which brings \
                           libmpi.so.40) or set MEMO_MPI_LIBRARY to Open MPI's libmpi.so";

/// Why MPI cannot be used: what failed, where, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpiError(pub String);

impl fmt::Display for MpiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MpiError {}

/// This process's place in an Open MPI job, from the variables `mpirun` sets
/// (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MpiEnv {
    /// This process's rank in the job.
    pub rank: usize,
    /// The job's number of processes.
    pub size: usize,
    /// Its rank among the job's processes on this node.
    pub local_rank: usize,
}

impl MpiEnv {
    /// The variables of this process: `None` when `OMPI_COMM_WORLD_SIZE` is unset (not under
    /// Open MPI's `mpirun`), an error naming a malformed or missing one.
    pub fn from_env() -> Result<Option<MpiEnv>, MpiError> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// As [`MpiEnv::from_env`], reading variables through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<Option<MpiEnv>, MpiError> {
        if get("OMPI_COMM_WORLD_SIZE").is_none() {
            return Ok(None);
        }
        let read = |name: &str| -> Result<usize, MpiError> {
            let value = get(name).ok_or_else(|| {
                MpiError(format!(
                    "{name} is not set but OMPI_COMM_WORLD_SIZE is: start the processes with Open MPI's mpirun"
                ))
            })?;
            let text = value.to_string_lossy();
            text.trim().parse::<usize>().map_err(|_| {
                MpiError(format!("{name} is {text:?}, not a number: start the processes with Open MPI's mpirun"))
            })
        };
        let env = MpiEnv {
            rank: read("OMPI_COMM_WORLD_RANK")?,
            size: read("OMPI_COMM_WORLD_SIZE")?,
            local_rank: read("OMPI_COMM_WORLD_LOCAL_RANK")?,
        };
        if env.size == 0 || env.rank >= env.size {
            return Err(MpiError(format!(
                "OMPI_COMM_WORLD_RANK is {} with OMPI_COMM_WORLD_SIZE {}: the rank must be below the size",
                env.rank, env.size
            )));
        }
        Ok(Some(env))
    }
}

/// The group's timeout: [`TIMEOUT_VARIABLE`] in seconds if set (an error if it is not a positive
/// number), else [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> Result<Duration, MpiError> {
    match std::env::var(TIMEOUT_VARIABLE) {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(text) => match text.trim().parse::<f64>() {
            Ok(seconds) if seconds.is_finite() && seconds > 0.0 => Ok(Duration::from_secs_f64(seconds)),
            _ => Err(MpiError(format!("{TIMEOUT_VARIABLE} is {text:?}: give a positive number of seconds"))),
        },
    }
}

// Open MPI's ABI (see the crate's documentation): handles are pointers.
type Handle = *mut c_void;
type Request = *mut c_void;
const SUCCESS: c_int = 0;
const THREAD_SERIALIZED: c_int = 2;
/// The tags of this crate's point-to-point messages (collectives do not use tags).
const ABORT_TAG: c_int = 7001;
const EXCHANGE_TAG: c_int = 7002;
/// The largest abort reason sent (longer ones are cut).
const ABORT_BYTES: usize = 2048;

/// The functions used, resolved once.
struct Fns {
    initialized: unsafe extern "C" fn(*mut c_int) -> c_int,
    init_thread: unsafe extern "C" fn(*mut c_int, *mut *mut *mut c_char, c_int, *mut c_int) -> c_int,
    finalize: unsafe extern "C" fn() -> c_int,
    comm_rank: unsafe extern "C" fn(Handle, *mut c_int) -> c_int,
    comm_size: unsafe extern "C" fn(Handle, *mut c_int) -> c_int,
    comm_set_errhandler: unsafe extern "C" fn(Handle, Handle) -> c_int,
    iallgather:
        unsafe extern "C" fn(*const c_void, c_int, Handle, *mut c_void, c_int, Handle, Handle, *mut Request) -> c_int,
    isend: unsafe extern "C" fn(*const c_void, c_int, Handle, c_int, c_int, Handle, *mut Request) -> c_int,
    irecv: unsafe extern "C" fn(*mut c_void, c_int, Handle, c_int, c_int, Handle, *mut Request) -> c_int,
    test: unsafe extern "C" fn(*mut Request, *mut c_int, *mut c_void) -> c_int,
    cancel: unsafe extern "C" fn(*mut Request) -> c_int,
    get_library_version: unsafe extern "C" fn(*mut c_char, *mut c_int) -> c_int,
}

/// The loaded library: its functions and the addresses of the predefined handles.
struct Mpi {
    fns: Fns,
    world: Handle,
    byte: Handle,
    errors_return: Handle,
    /// Never closed: Open MPI's exit handlers run after `main` returns, so the library must stay
    /// mapped until the process ends (leaked on purpose).
    _library: &'static Library,
}

/// Opens the first of `names` that loads (a name with a `/` is a path), and checks it is Open MPI.
fn load(names: &[String]) -> Result<Mpi, MpiError> {
    let mut tried = Vec::new();
    let mut found = None;
    for name in names {
        // Safety: opening Open MPI's libmpi runs its initialisers, which only set up its own
        // state; the library is not used until checked below.
        match unsafe { Library::open(Some(name), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(library) => {
                found = Some((name.clone(), library));
                break;
            }
            Err(error) => tried.push(format!("{name} ({error})")),
        }
    }
    let Some((path, library)) = found else {
        return Err(MpiError(format!("cannot load Open MPI: tried {}; {INSTALL}", tried.join(", "))));
    };
    let not_open_mpi = |what: &str| {
        MpiError(format!(
            "{path} is not Open MPI ({what}): memo reads Open MPI's handles (the addresses of its globals \
             ompi_mpi_comm_world, ompi_mpi_byte), which other MPI libraries (MPICH, Intel MPI) do not have; \
             {INSTALL}"
        ))
    };
    macro_rules! function {
        ($name:literal) => {
            // Safety: the symbol is one of MPI's C functions, whose signature in Open MPI's mpi.h
            // is the field's type (handles are pointers in Open MPI's ABI, checked below).
            *unsafe { library.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| MpiError(format!("{path} has no {}: {e}; {INSTALL}", $name)))?
        };
    }
    macro_rules! global {
        ($name:literal) => {{
            // Safety: taking the address of an exported global only; it is passed to MPI as the
            // handle, never read or written here.
            let found = unsafe { library.get::<*mut c_void>(concat!($name, "\0").as_bytes()) };
            *found.map_err(|_| not_open_mpi(concat!("it exports no ", $name)))?
        }};
    }
    let world = global!("ompi_mpi_comm_world");
    let byte = global!("ompi_mpi_byte");
    let errors_return = global!("ompi_mpi_errors_return");
    let fns = Fns {
        initialized: function!("MPI_Initialized"),
        init_thread: function!("MPI_Init_thread"),
        finalize: function!("MPI_Finalize"),
        comm_rank: function!("MPI_Comm_rank"),
        comm_size: function!("MPI_Comm_size"),
        comm_set_errhandler: function!("MPI_Comm_set_errhandler"),
        iallgather: function!("MPI_Iallgather"),
        isend: function!("MPI_Isend"),
        irecv: function!("MPI_Irecv"),
        test: function!("MPI_Test"),
        cancel: function!("MPI_Cancel"),
        get_library_version: function!("MPI_Get_library_version"),
    };
    // MPI_MAX_LIBRARY_VERSION_STRING is 256 in Open MPI; more room costs nothing.
    let mut text = vec![0 as c_char; 8192];
    let mut len: c_int = 0;
    // Safety: the buffer is larger than MPI_MAX_LIBRARY_VERSION_STRING; this call may be made
    // before MPI_Init (MPI 3.0).
    let code = unsafe { (fns.get_library_version)(text.as_mut_ptr(), &mut len) };
    let bytes: Vec<u8> = text.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    let version = String::from_utf8_lossy(&bytes).lines().next().unwrap_or_default().to_string();
    if code != SUCCESS || !version.starts_with("Open MPI") {
        return Err(not_open_mpi(&format!("its version string is {version:?}")));
    }
    Ok(Mpi { fns, world, byte, errors_return, _library: Box::leak(Box::new(library)) })
}

/// The file names to try: [`LIBRARY_VARIABLE`] alone if set, else [`NAMES`].
fn names_from_env() -> Vec<String> {
    match std::env::var_os(LIBRARY_VARIABLE) {
        Some(path) => vec![path.to_string_lossy().into_owned()],
        None => NAMES.iter().map(|name| name.to_string()).collect(),
    }
}

/// Loads the library as [`MpiGroup::init`] would and says which it is, without initialising
/// MPI: its first version line, or why it cannot be used.
pub fn probe() -> Result<String, MpiError> {
    probe_names(&names_from_env())
}

/// [`probe`] with the file names to try.
pub fn probe_names(names: &[String]) -> Result<String, MpiError> {
    let mpi = load(names)?;
    let mut text = vec![0 as c_char; 8192];
    let mut len: c_int = 0;
    // Safety: as in `load`.
    unsafe { (mpi.fns.get_library_version)(text.as_mut_ptr(), &mut len) };
    let bytes: Vec<u8> = text.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    Ok(String::from_utf8_lossy(&bytes).lines().next().unwrap_or_default().to_string())
}

/// What MPI state the mutex guards.
struct State {
    /// Calls this rank completed (the next call's number).
    calls: u64,
    /// The posted receive of a peer's abort, and its buffer (null once it completed).
    abort_request: Request,
    abort_buffer: Box<[u8]>,
    /// Sends of this rank's abort, kept until the process ends (MPI reads their buffers).
    abort_sends: Vec<(Request, Vec<u8>)>,
    /// Whether a request is pending after a failed call: then MPI must not be finalised.
    pending: bool,
}

/// One rank of a tensor-parallel group whose ranks are the processes of an Open MPI job
/// (`MPI_COMM_WORLD`), one rank per process.
pub struct MpiGroup {
    mpi: Mpi,
    rank: usize,
    ranks: usize,
    timeout: Duration,
    state: Mutex<State>,
    /// The group's first failure; every call fails with it from then on.
    failure: Mutex<Option<CollectiveError>>,
    /// Set by [`Collectives::abort`] before it takes the state's lock, so a call polling under
    /// that lock stops at once.
    aborting: AtomicBool,
}

// Safety: the raw pointers are Open MPI's handles and requests; every MPI call is made under the
// `state` mutex (MPI_THREAD_SERIALIZED: one thread in MPI at a time), and the handles themselves
// are process-wide constants.
unsafe impl Send for MpiGroup {}
// Safety: as for Send: all shared mutable state is behind mutexes or atomics.
unsafe impl Sync for MpiGroup {}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The description of a call every rank gathers before the payload: kind, two sizes, the
/// exchange's peers, the call number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    kind: u64,
    input: u64,
    output: u64,
    peers: u64,
    call: u64,
}

const HEADER_BYTES: usize = 40;
const EXCHANGE_KIND: u64 = 100;

impl Header {
    fn kind_of(collective: Collective) -> u64 {
        let element = |e: Element| match e {
            Element::Bf16 => 0,
            Element::F32 => 1,
        };
        match collective {
            Collective::AllGather => 1,
            Collective::ReduceScatter(e) => 2 + element(e),
            Collective::AllReduce(e, Reduction::Sum) => 10 + element(e),
            Collective::AllReduce(e, Reduction::Max) => 20 + element(e),
            // `Collective::run` makes a ring shift an exchange: it is never a collective call.
            Collective::RingShift => EXCHANGE_KIND,
        }
    }

    fn collective(kind: u64) -> Option<Collective> {
        let element = |bit: u64| if bit == 0 { Element::Bf16 } else { Element::F32 };
        match kind {
            1 => Some(Collective::AllGather),
            2 | 3 => Some(Collective::ReduceScatter(element(kind - 2))),
            10 | 11 => Some(Collective::AllReduce(element(kind - 10), Reduction::Sum)),
            20 | 21 => Some(Collective::AllReduce(element(kind - 20), Reduction::Max)),
            _ => None,
        }
    }

    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        for (i, v) in [self.kind, self.input, self.output, self.peers, self.call].iter().enumerate() {
            out[i * 8..(i + 1) * 8].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    fn decode(bytes: &[u8]) -> Header {
        let word = |i: usize| {
            bytes.get(i * 8..(i + 1) * 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes).unwrap_or(u64::MAX)
        };
        Header { kind: word(0), input: word(1), output: word(2), peers: word(3), call: word(4) }
    }

    fn what(&self) -> String {
        match Header::collective(self.kind) {
            Some(collective) => collective.to_string(),
            None if self.kind == EXCHANGE_KIND => "an exchange".into(),
            None => format!("an unknown call ({})", self.kind),
        }
    }
}

impl MpiGroup {
    /// Loads Open MPI ([`LIBRARY_VARIABLE`] or [`NAMES`]), initialises it (unless this process
    /// already did) with `MPI_THREAD_SERIALIZED`, and makes `MPI_COMM_WORLD` the group, with the
    /// timeout of [`timeout_from_env`].
    pub fn init() -> Result<MpiGroup, MpiError> {
        Self::init_with(&names_from_env(), timeout_from_env()?)
    }

    /// As [`MpiGroup::init`], with the file names to try and the timeout.
    pub fn init_with(names: &[String], timeout: Duration) -> Result<MpiGroup, MpiError> {
        let mpi = load(names)?;
        let call = |function: &str, code: c_int| {
            if code == SUCCESS {
                Ok(())
            } else {
                Err(MpiError(format!("{function} failed with MPI error {code}: is this process started by mpirun?")))
            }
        };
        let mut initialized: c_int = 0;
        // Safety: MPI_Initialized may be called at any time.
        call("MPI_Initialized", unsafe { (mpi.fns.initialized)(&mut initialized) })?;
        if initialized == 0 {
            let mut provided: c_int = 0;
            // Safety: null argc/argv are allowed (MPI 2.0); called once per process.
            let code = unsafe {
                (mpi.fns.init_thread)(std::ptr::null_mut(), std::ptr::null_mut(), THREAD_SERIALIZED, &mut provided)
            };
            call("MPI_Init_thread", code)?;
            if provided < THREAD_SERIALIZED {
                return Err(MpiError(format!(
                    "Open MPI provides thread level {provided}, below MPI_THREAD_SERIALIZED (2) which memo needs (its \
                     ranks' collectives are issued from more than one thread, one at a time): use an Open MPI built \
                     with thread support"
                )));
            }
        }
        // Errors return codes instead of ending the job, so each can be reported with its call.
        // Safety: both handles are Open MPI's predefined globals.
        call("MPI_Comm_set_errhandler", unsafe { (mpi.fns.comm_set_errhandler)(mpi.world, mpi.errors_return) })?;
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // Safety: the world communicator after MPI_Init.
        call("MPI_Comm_rank", unsafe { (mpi.fns.comm_rank)(mpi.world, &mut rank) })?;
        // Safety: as above.
        call("MPI_Comm_size", unsafe { (mpi.fns.comm_size)(mpi.world, &mut size) })?;
        let mut abort_buffer = vec![0u8; ABORT_BYTES + 8].into_boxed_slice();
        let mut abort_request: Request = std::ptr::null_mut();
        // Safety: the buffer lives in the group's state (a Box: it does not move) until the
        // request completes or the process ends; ANY_SOURCE is -1 in Open MPI.
        let code = unsafe {
            (mpi.fns.irecv)(
                abort_buffer.as_mut_ptr().cast(),
                abort_buffer.len() as c_int,
                mpi.byte,
                -1,
                ABORT_TAG,
                mpi.world,
                &mut abort_request,
            )
        };
        call("MPI_Irecv", code)?;
        Ok(MpiGroup {
            mpi,
            rank: rank.max(0) as usize,
            ranks: size.max(1) as usize,
            timeout,
            state: Mutex::new(State { calls: 0, abort_request, abort_buffer, abort_sends: Vec::new(), pending: false }),
            failure: Mutex::new(None),
            aborting: AtomicBool::new(false),
        })
    }

    /// The group's first failure, if any.
    pub fn failure(&self) -> Option<CollectiveError> {
        lock(&self.failure).clone()
    }

    /// Ends this process's use of MPI: `MPI_Finalize` when no MPI request is pending (every call
    /// completed, or failed on a check before any payload moved), so `mpirun` sees a clean exit.
    /// After a failure that left requests pending, or an abort, it does nothing (MPI requests may be pending, and
    /// `MPI_Finalize` would wait for peers that may never come): the process then exits with its
    /// error, and `mpirun` ends the others.
    pub fn finish(self) -> Result<(), MpiError> {
        let mut state = lock(&self.state);
        if state.pending || self.aborting.load(Ordering::SeqCst) {
            return Ok(());
        }
        if !state.abort_request.is_null() {
            // Safety: the request is this group's posted receive; cancelling and completing it
            // with MPI_Test is how MPI retires a receive that will not match.
            unsafe { (self.mpi.fns.cancel)(&mut state.abort_request) };
            let deadline = Instant::now() + self.timeout;
            while !state.abort_request.is_null() && Instant::now() < deadline {
                let mut done: c_int = 0;
                // Safety: as above.
                unsafe { (self.mpi.fns.test)(&mut state.abort_request, &mut done, std::ptr::null_mut()) };
                if done == 0 {
                    std::thread::yield_now();
                } else {
                    // Open MPI's MPI_REQUEST_NULL is the address of a global, not a null pointer:
                    // a null pointer is this crate's own mark of a completed request.
                    state.abort_request = std::ptr::null_mut();
                }
            }
        }
        // Safety: no request of this group is pending.
        let code = unsafe { (self.mpi.fns.finalize)() };
        if code != SUCCESS {
            return Err(MpiError(format!("MPI_Finalize failed with MPI error {code}")));
        }
        Ok(())
    }

    fn fail(&self, error: CollectiveError) -> CollectiveError {
        lock(&self.failure).get_or_insert(error).clone()
    }

    fn mpi_failed(&self, function: &str, code: c_int) -> CollectiveError {
        self.fail(CollectiveError::RankFailed {
            rank: self.rank,
            reason: format!("{function} failed with MPI error {code} (Open MPI's message is above, if it printed one)"),
        })
    }

    /// Polls `requests` until all complete. Fails (leaving them pending) when a peer's abort
    /// arrives, this rank aborts, or the timeout passes; `what` names the call for messages.
    fn wait(
        &self,
        state: &mut State,
        requests: &mut [Request],
        what: &dyn Fn() -> String,
    ) -> Result<(), CollectiveError> {
        let started = Instant::now();
        let mut idle = 0u32;
        loop {
            let mut all = true;
            for request in requests.iter_mut().filter(|r| !r.is_null()) {
                let mut done: c_int = 0;
                // Safety: a request this call started; MPI sets it to MPI_REQUEST_NULL once
                // complete (and it is skipped after).
                let code = unsafe { (self.mpi.fns.test)(request, &mut done, std::ptr::null_mut()) };
                if code != SUCCESS {
                    state.pending = true;
                    return Err(self.mpi_failed("MPI_Test", code));
                }
                if done != 0 {
                    // Completed (MPI set it to its MPI_REQUEST_NULL, a global's address): mark it.
                    *request = std::ptr::null_mut();
                }
                all &= done != 0;
            }
            if all {
                return Ok(());
            }
            if let Some(error) = self.peer_abort(state) {
                state.pending = true;
                return Err(self.fail(error));
            }
            if self.aborting.load(Ordering::SeqCst) {
                state.pending = true;
                return Err(self
                    .failure()
                    .unwrap_or_else(|| CollectiveError::RankFailed { rank: self.rank, reason: "it aborted".into() }));
            }
            if started.elapsed() >= self.timeout {
                state.pending = true;
                return Err(self.fail(CollectiveError::RankFailed {
                    rank: self.rank,
                    reason: format!(
                        "{} did not complete: it waited {:.1} s for the other ranks (MPI does not say which rank is \
                         missing): a rank is stuck, died, or replays another plan; {TIMEOUT_VARIABLE} sets the wait",
                        what(),
                        self.timeout.as_secs_f64()
                    ),
                }));
            }
            // Back off from spinning to short sleeps: a rank waits for its peers' computation.
            idle = idle.saturating_add(1);
            if idle < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// A peer's abort, if one arrived: `RankFailed` naming it.
    fn peer_abort(&self, state: &mut State) -> Option<CollectiveError> {
        if state.abort_request.is_null() {
            return None;
        }
        let mut done: c_int = 0;
        // Safety: the group's posted receive; its buffer lives in the state.
        let code = unsafe { (self.mpi.fns.test)(&mut state.abort_request, &mut done, std::ptr::null_mut()) };
        if code != SUCCESS || done == 0 {
            return None;
        }
        state.abort_request = std::ptr::null_mut();
        let buffer = &state.abort_buffer;
        let rank = u32::from_le_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]) as usize;
        let len = (u32::from_le_bytes([buffer[4], buffer[5], buffer[6], buffer[7]]) as usize).min(ABORT_BYTES);
        let reason = String::from_utf8_lossy(&buffer[8..8 + len]).into_owned();
        Some(CollectiveError::RankFailed { rank, reason })
    }

    /// Gathers `input` (the same length on every rank) from every rank, in rank order.
    fn gather(&self, state: &mut State, input: &[u8], what: &dyn Fn() -> String) -> Result<Vec<u8>, CollectiveError> {
        let count = c_int::try_from(input.len()).ok().filter(|_| input.len().checked_mul(self.ranks).is_some());
        let Some(count) = count else {
            return Err(self.fail(CollectiveError::RankFailed {
                rank: self.rank,
                reason: format!("{}: {} bytes per rank is over MPI's count limit (2^31 - 1)", what(), input.len()),
            }));
        };
        let send = input.to_vec();
        let mut gathered = vec![0u8; input.len() * self.ranks];
        let mut request: Request = std::ptr::null_mut();
        // Safety: `send` and `gathered` outlive the request: on success it completed below; on
        // failure both are leaked, since MPI may still use them.
        let code = unsafe {
            (self.mpi.fns.iallgather)(
                send.as_ptr().cast(),
                count,
                self.mpi.byte,
                gathered.as_mut_ptr().cast(),
                count,
                self.mpi.byte,
                self.mpi.world,
                &mut request,
            )
        };
        if code != SUCCESS {
            return Err(self.mpi_failed("MPI_Iallgather", code));
        }
        match self.wait(state, std::slice::from_mut(&mut request), what) {
            Ok(()) => Ok(gathered),
            Err(error) => {
                std::mem::forget(send);
                std::mem::forget(gathered);
                Err(error)
            }
        }
    }

    /// The common start of every call: fails at once after a failure, then gathers every rank's
    /// header and returns them with this call's number.
    fn begin(&self, state: &mut State, header: Header) -> Result<Vec<Header>, CollectiveError> {
        if let Some(failure) = self.failure() {
            return Err(failure);
        }
        let what = || format!("collective #{} ({})", header.call, header.what());
        let bytes = self.gather(state, &header.encode(), &what)?;
        Ok(bytes.chunks_exact(HEADER_BYTES).map(Header::decode).collect())
    }

    /// A collective: the headers agree and fit, then every rank's input is gathered.
    fn collective(&self, collective: Collective, input: &[u8], output_len: usize) -> Result<Vec<u8>, CollectiveError> {
        let mut state = lock(&self.state);
        let call = state.calls;
        let header = Header {
            kind: Header::kind_of(collective),
            input: input.len() as u64,
            output: output_len as u64,
            peers: 0,
            call,
        };
        let headers = self.begin(&mut state, header)?;
        if let Some(error) = self.disagreement(&headers, call) {
            return Err(self.fail(error));
        }
        if let Some(problem) = shape_problem(collective, input.len(), output_len, self.ranks) {
            return Err(self.fail(CollectiveError::Shape { rank: self.rank, collective, problem }));
        }
        let what = || format!("collective #{call} ({collective})");
        let gathered = self.gather(&mut state, input, &what)?;
        state.calls += 1;
        Ok(gathered)
    }

    /// Why the ranks' headers of a collective do not agree (the same error on every rank).
    fn disagreement(&self, headers: &[Header], call: u64) -> Option<CollectiveError> {
        let first = headers.first()?;
        let (other, theirs) = headers.iter().enumerate().find(|(_, h)| *h != first)?;
        let described = |rank: usize, h: &Header| (rank, Header::collective(h.kind), h.input as usize);
        match (described(0, first), described(other, theirs)) {
            ((r0, Some(c0), n0), (r1, Some(c1), n1)) if first.call == theirs.call => {
                Some(CollectiveError::Mismatch { call, first: (r0, c0, n0), second: (r1, c1, n1) })
            }
            _ => Some(CollectiveError::Exchange {
                call,
                problem: format!(
                    "rank 0 issued {} as call #{} but rank {other} issued {} as call #{}",
                    first.what(),
                    first.call,
                    theirs.what(),
                    theirs.call
                ),
            }),
        }
    }

    /// Why the ranks' exchange headers do not pair up (the same words on every rank).
    fn unpaired(&self, headers: &[Header]) -> Option<String> {
        if let Some((k, h)) = headers.iter().enumerate().find(|(_, h)| h.kind != EXCHANGE_KIND) {
            return Some(format!("rank {k} issued {} where the others issued an exchange", h.what()));
        }
        if let Some((k, _)) = headers.iter().enumerate().find(|(_, h)| h.call != headers[0].call) {
            return Some(format!("rank {k} is at call #{} while rank 0 is at #{}", headers[k].call, headers[0].call));
        }
        let peers = |h: &Header| ((h.peers & 0xFFFF_FFFF) as usize, (h.peers >> 32) as usize);
        for (k, h) in headers.iter().enumerate() {
            let (send_to, receive_from) = peers(h);
            if send_to >= headers.len() || receive_from >= headers.len() {
                return Some(format!(
                    "rank {k} sends to rank {send_to} and receives from rank {receive_from} in a group of {}",
                    headers.len()
                ));
            }
            let sender = &headers[receive_from];
            let (their_target, _) = peers(sender);
            if their_target != k {
                return Some(format!("rank {k} receives from rank {receive_from}, which sends to rank {their_target}"));
            }
            if sender.input != h.output {
                return Some(format!(
                    "rank {receive_from} sends {} bytes to rank {k}, which receives {}",
                    sender.input, h.output
                ));
            }
        }
        None
    }
}

impl Collectives for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<(), CollectiveError> {
        let gathered = self.collective(Collective::AllGather, input, output.len())?;
        output.copy_from_slice(&gathered[..output.len()]);
        Ok(())
    }

    fn reduce_scatter(&self, element: Element, input: &[u8], output: &mut [u8]) -> Result<(), CollectiveError> {
        let gathered = self.collective(Collective::ReduceScatter(element), input, output.len())?;
        // Rank j's input is gathered[j*m .. (j+1)*m]; this rank's share of it starts at k*n.
        let (m, n, k) = (input.len(), output.len(), self.rank);
        let shares: Vec<&[u8]> = (0..self.ranks).map(|j| &gathered[j * m + k * n..j * m + (k + 1) * n]).collect();
        reduce(element, Reduction::Sum, &shares, output);
        Ok(())
    }

    fn all_reduce(&self, element: Element, reduction: Reduction, data: &mut [u8]) -> Result<(), CollectiveError> {
        let gathered = self.collective(Collective::AllReduce(element, reduction), data, data.len())?;
        let inputs: Vec<&[u8]> = gathered.chunks_exact(data.len().max(1)).collect();
        if !data.is_empty() {
            reduce(element, reduction, &inputs, data);
        }
        Ok(())
    }

    fn exchange(
        &self,
        send_to: usize,
        send: &[u8],
        receive_from: usize,
        receive: &mut [u8],
    ) -> Result<(), CollectiveError> {
        let mut state = lock(&self.state);
        let call = state.calls;
        let peers = (send_to.min(u32::MAX as usize) as u64) | ((receive_from.min(u32::MAX as usize) as u64) << 32);
        let header =
            Header { kind: EXCHANGE_KIND, input: send.len() as u64, output: receive.len() as u64, peers, call };
        let headers = self.begin(&mut state, header)?;
        if let Some(problem) = self.unpaired(&headers) {
            return Err(self.fail(CollectiveError::Exchange { call, problem }));
        }
        let (Ok(send_count), Ok(receive_count)) = (c_int::try_from(send.len()), c_int::try_from(receive.len())) else {
            return Err(self.fail(CollectiveError::Exchange {
                call,
                problem: format!("rank {}: over MPI's count limit (2^31 - 1 bytes)", self.rank),
            }));
        };
        let outgoing = send.to_vec();
        let mut incoming = vec![0u8; receive.len()];
        let mut requests: [Request; 2] = [std::ptr::null_mut(); 2];
        // Safety: both buffers outlive the requests (completed below, or leaked on failure); the
        // peers were checked to be ranks of the world.
        let code = unsafe {
            (self.mpi.fns.irecv)(
                incoming.as_mut_ptr().cast(),
                receive_count,
                self.mpi.byte,
                receive_from as c_int,
                EXCHANGE_TAG,
                self.mpi.world,
                &mut requests[0],
            )
        };
        if code != SUCCESS {
            return Err(self.mpi_failed("MPI_Irecv", code));
        }
        // Safety: as above.
        let code = unsafe {
            (self.mpi.fns.isend)(
                outgoing.as_ptr().cast(),
                send_count,
                self.mpi.byte,
                send_to as c_int,
                EXCHANGE_TAG,
                self.mpi.world,
                &mut requests[1],
            )
        };
        if code != SUCCESS {
            state.pending = true;
            std::mem::forget(incoming);
            return Err(self.mpi_failed("MPI_Isend", code));
        }
        let what = || format!("exchange #{call}");
        if let Err(error) = self.wait(&mut state, &mut requests, &what) {
            std::mem::forget(outgoing);
            std::mem::forget(incoming);
            return Err(error);
        }
        receive.copy_from_slice(&incoming);
        state.calls += 1;
        Ok(())
    }

    fn abort(&self, reason: &str) {
        let error = CollectiveError::RankFailed { rank: self.rank, reason: reason.to_string() };
        let first = lock(&self.failure).is_none();
        self.fail(error);
        self.aborting.store(true, Ordering::SeqCst);
        if !first {
            return;
        }
        let mut message = Vec::with_capacity(ABORT_BYTES + 8);
        let reason = &reason.as_bytes()[..reason.len().min(ABORT_BYTES)];
        message.extend_from_slice(&(self.rank as u32).to_le_bytes());
        message.extend_from_slice(&(reason.len() as u32).to_le_bytes());
        message.extend_from_slice(reason);
        let mut state = lock(&self.state);
        for peer in (0..self.ranks).filter(|&p| p != self.rank) {
            let buffer = message.clone();
            let mut request: Request = std::ptr::null_mut();
            // Safety: the buffer is kept in the state until the process ends (MPI reads it
            // whenever the peer receives); the peer is a rank of the world.
            let code = unsafe {
                (self.mpi.fns.isend)(
                    buffer.as_ptr().cast(),
                    buffer.len() as c_int,
                    self.mpi.byte,
                    peer as c_int,
                    ABORT_TAG,
                    self.mpi.world,
                    &mut request,
                )
            };
            if code == SUCCESS {
                state.abort_sends.push((request, buffer));
            }
        }
        // Give the sends a chance to leave (small messages go eagerly), within the timeout.
        let mut requests: Vec<Request> = state.abort_sends.iter().map(|(r, _)| *r).collect();
        let deadline = Instant::now() + self.timeout.min(Duration::from_secs(10));
        while requests.iter().any(|r| !r.is_null()) && Instant::now() < deadline {
            for request in requests.iter_mut().filter(|r| !r.is_null()) {
                let mut done: c_int = 0;
                // Safety: a send this call started; its buffer is in the state.
                unsafe { (self.mpi.fns.test)(request, &mut done, std::ptr::null_mut()) };
                if done != 0 {
                    *request = std::ptr::null_mut();
                }
            }
            std::thread::yield_now();
        }
        state.pending = true;
        for (slot, request) in state.abort_sends.iter_mut().zip(requests) {
            slot.0 = request;
        }
    }
}

impl fmt::Debug for MpiGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MpiGroup {{ rank: {}, ranks: {} }}", self.rank, self.ranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_variables_are_read_and_checked() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| OsString::from(*v))
        };
        assert_eq!(MpiEnv::from_vars(vars(&[])), Ok(None));
        const ALL: &[(&str, &str)] =
            &[("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "2")];
        assert_eq!(MpiEnv::from_vars(vars(ALL)), Ok(Some(MpiEnv { rank: 2, size: 4, local_rank: 2 })));
        let bad = MpiEnv::from_vars(vars(&[("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_RANK", "x")])).unwrap_err();
        assert!(bad.0.contains("OMPI_COMM_WORLD_RANK is \"x\""), "{bad}");
        let missing = MpiEnv::from_vars(vars(&[("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_RANK", "1")]));
        assert!(missing.unwrap_err().0.contains("OMPI_COMM_WORLD_LOCAL_RANK is not set"));
        const OVER: &[(&str, &str)] =
            &[("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "0")];
        assert!(MpiEnv::from_vars(vars(OVER)).unwrap_err().0.contains("below the size"));
    }

    #[test]
    fn a_missing_library_is_an_error_saying_what_to_install() {
        let error = probe_names(&["/nonexistent/libmpi.so.40".into()]).unwrap_err();
        assert!(error.0.contains("cannot load Open MPI: tried /nonexistent/libmpi.so.40"), "{error}");
        assert!(error.0.contains("apt-get install openmpi-bin"), "{error}");
        let error = MpiGroup::init_with(&["/nonexistent/libmpi.so.40".into()], Duration::from_secs(1)).unwrap_err();
        assert!(error.0.contains("cannot load Open MPI"), "{error}");
    }

    #[test]
    fn another_library_is_refused_as_not_open_mpi() {
        // The C library loads everywhere this test runs and exports none of Open MPI's globals.
        let error = probe_names(&["libc.so.6".into()]).unwrap_err();
        assert!(error.0.contains("is not Open MPI") && error.0.contains("ompi_mpi_comm_world"), "{error}");
    }

    #[test]
    fn headers_round_trip_and_name_their_call() {
        for collective in [
            Collective::AllGather,
            Collective::ReduceScatter(Element::Bf16),
            Collective::ReduceScatter(Element::F32),
            Collective::AllReduce(Element::Bf16, Reduction::Sum),
            Collective::AllReduce(Element::F32, Reduction::Sum),
            Collective::AllReduce(Element::F32, Reduction::Max),
            Collective::AllReduce(Element::Bf16, Reduction::Max),
        ] {
            assert_eq!(Header::collective(Header::kind_of(collective)), Some(collective));
        }
        let header = Header { kind: EXCHANGE_KIND, input: 3, output: 4, peers: 1 | (2 << 32), call: 9 };
        assert_eq!(Header::decode(&header.encode()), header);
        assert_eq!(header.what(), "an exchange");
        assert_eq!(shape_problem(Collective::AllGather, 2, 8, 4), None);
        assert!(shape_problem(Collective::ReduceScatter(Element::Bf16), 6, 2, 2).is_some());
    }
}
