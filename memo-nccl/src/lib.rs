//! NCCL (NVIDIA) and RCCL (AMD), one C API, loaded at run time with `libloading`: the
//! collectives of tensor and sequence parallelism (all-gather, reduce-scatter, all-reduce) on raw
//! device pointers and a raw stream, for `runtime-cuda` (NCCL) and `runtime-hip` (RCCL).
//!
//! Why a binding of its own: cudarc's NCCL loader does not try `libnccl.so.2` (NCCL's real
//! soname, the only file NVIDIA's `nvidia-nccl-cu12` wheel ships) and panics when it finds
//! nothing; RCCL has no Rust binding that builds without ROCm. RCCL exports the same `nccl*`
//! functions, values and 128-byte unique id, so one binding serves both, parameterised by a
//! [`Flavour`] (the file names, the variable naming an explicit file, the install advice). This
//! crate sits between `memo-runtime` (whose rendezvous exchanges the unique id across processes,
//! and whose `BackendError` a failure becomes) and the two GPU backends, so neither duplicates it
//! and `memo-runtime` keeps no GPU library and no foreign function call.
//!
//! ```text
//! sys      C types and values of nccl.h, the library search, one function table resolved once
//!   -> Nccl           the loaded library: version, unique ids, groups
//!   -> Communicator   one rank: made with a join timeout, collectives, aborted on any error,
//!                     finalized and destroyed on drop
//! ```
//!
//! Making a communicator waits for every rank, and `ncclCommInitRank` would block forever on a
//! rank that never comes. So every communicator is made non-blocking (`ncclCommInitRankConfig`
//! with `blocking = 0`, NCCL 2.14 or newer) and polled with `ncclCommGetAsyncError` until it is
//! ready, fails, or the timeout passes, when it is aborted (`ncclCommAbort`): the procedure NCCL
//! documents for non-blocking communicators. Every later call on it that returns `ncclInProgress`
//! is polled the same way (`NCCL_COMM_BLOCKING=1` in the environment overrides the config inside
//! NCCL and brings the blocking join back: leave it unset). Nothing here panics on a missing
//! library, symbol or bad input.
#![deny(missing_docs)]

mod error;
pub mod sys;

use std::cell::RefCell;
use std::ffi::{c_int, c_void, CStr};
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use error::NcclError;
use memo_runtime::rendezvous::TorchrunEnv;
pub use sys::Search;
use sys::{Fns, NcclComm, NcclResult, RawUniqueId, IN_PROGRESS, SUCCESS, UNIQUE_ID_BYTES};

/// One of the two libraries: what to load and what to tell the user when it is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flavour {
    /// `"NCCL"` or `"RCCL"`.
    pub library: &'static str,
    /// File names, tried in order (in each folder, then by the system search).
    pub names: &'static [&'static str],
    /// The variable that names the file explicitly.
    pub variable: &'static str,
    /// What to install.
    pub install: &'static str,
}

/// NVIDIA's NCCL: `libnccl.so.2` (its soname), `libnccl.so` (the development link),
/// `MEMO_NCCL_LIBRARY`.
pub const NCCL: Flavour = Flavour {
    library: "NCCL",
    names: &["libnccl.so.2", "libnccl.so"],
    variable: "MEMO_NCCL_LIBRARY",
    install: "install NCCL 2.14 or newer (NVIDIA's libnccl2 package, or `pip install nvidia-nccl-cu12`, which puts \
              libnccl.so.2 in site-packages/nvidia/nccl/lib) and put its folder on LD_LIBRARY_PATH",
};

/// AMD's RCCL: `librccl.so.1` (its soname), `librccl.so`, `MEMO_RCCL_LIBRARY`.
pub const RCCL: Flavour = Flavour {
    library: "RCCL",
    names: &["librccl.so.1", "librccl.so"],
    variable: "MEMO_RCCL_LIBRARY",
    install: "install ROCm's RCCL (package rccl) and set ROCM_PATH to the ROCm root (the folder holding \
              lib/librccl.so.1) or put that folder on LD_LIBRARY_PATH",
};

/// The oldest library accepted: 2.14 added the non-blocking communicator (`ncclConfig_t`'s
/// `blocking`, `ncclCommFinalize`) that the join timeout rests on.
pub const MIN_VERSION: Version = Version { major: 2, minor: 14, patch: 0 };

/// The first version that accepts several ranks on one GPU, with `NCCL_MULTI_RANK_GPU_ENABLE`
/// set (NCCL's `init.cc`; refused since 2.5 as "Duplicate GPU detected" before).
pub const MULTI_RANK_GPU_VERSION: Version = Version { major: 2, minor: 30, patch: 0 };

/// An NCCL version, as `ncclGetVersion` encodes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// `NCCL_MAJOR`.
    pub major: u32,
    /// `NCCL_MINOR`.
    pub minor: u32,
    /// `NCCL_PATCH`.
    pub patch: u32,
}

impl Version {
    /// Decodes `NCCL_VERSION_CODE`: `major * 10000 + minor * 100 + patch` from 2.9 on,
    /// `major * 1000 + minor * 100 + patch` up to 2.8 (`NCCL_VERSION` in `nccl.h`). `None` for a
    /// code neither scheme produces.
    pub fn from_code(code: i32) -> Option<Version> {
        let code = u32::try_from(code).ok()?;
        let version = if code >= 20900 {
            Version { major: code / 10000, minor: code % 10000 / 100, patch: code % 100 }
        } else if (1000..2900).contains(&code) {
            Version { major: code / 1000, minor: code % 1000 / 100, patch: code % 100 }
        } else {
            return None;
        };
        Some(version)
    }

    /// The code `nccl.h`'s `NCCL_VERSION(major, minor, patch)` gives.
    pub fn code(&self) -> u32 {
        if self.major <= 2 && self.minor <= 8 {
            self.major * 1000 + self.minor * 100 + self.patch
        } else {
            self.major * 10000 + self.minor * 100 + self.patch
        }
    }

    /// Whether NCCL of this version accepts several ranks on one GPU when
    /// `NCCL_MULTI_RANK_GPU_ENABLE` holds `enable`: 2.30 or newer and the value a non-zero
    /// integer (NCCL reads it as one).
    pub fn supports_multi_rank_per_gpu(&self, enable: Option<&str>) -> bool {
        *self >= MULTI_RANK_GPU_VERSION && enable.and_then(|v| v.trim().parse::<i64>().ok()).is_some_and(|v| v != 0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// `ncclDataType_t` values the runtime's tensors use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ncclBfloat16` (9).
    Bf16,
    /// `ncclFloat32` (7).
    F32,
    /// `ncclUint32` (3).
    U32,
    /// `ncclUint8` (1).
    U8,
}

impl DataType {
    /// The `ncclDataType_t` value.
    pub fn raw(self) -> c_int {
        match self {
            DataType::Bf16 => 9,
            DataType::F32 => 7,
            DataType::U32 => 3,
            DataType::U8 => 1,
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            DataType::Bf16 => 2,
            DataType::F32 | DataType::U32 => 4,
            DataType::U8 => 1,
        }
    }
}

/// `ncclRedOp_t` values the runtime uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `ncclSum` (0).
    Sum,
    /// `ncclMax` (2).
    Max,
}

impl ReduceOp {
    /// The `ncclRedOp_t` value.
    pub fn raw(self) -> c_int {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 2,
        }
    }
}

/// `ncclUniqueId`: made by rank 0 ([`Nccl::unique_id`]), handed to every rank (in one process,
/// by copy; across processes, by `memo_runtime::rendezvous`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// From the bytes of a rendezvous; an error unless there are exactly 128.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId, NcclError> {
        let array = <[u8; UNIQUE_ID_BYTES]>::try_from(bytes)
            .map_err(|_| NcclError::Invalid(format!("a unique id is {UNIQUE_ID_BYTES} bytes, not {}", bytes.len())))?;
        Ok(UniqueId(array))
    }

    fn raw(&self) -> RawUniqueId {
        RawUniqueId { internal: self.0.map(|b| b as std::ffi::c_char) }
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId(")?;
        for byte in &self.0[..8] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "...)")
    }
}

/// The loaded library (NCCL or RCCL). Cheap to copy; the library stays loaded for the process.
#[derive(Clone, Copy)]
pub struct Nccl {
    fns: &'static Fns,
    origin: &'static str,
    version: Version,
    flavour: Flavour,
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ({})", self.flavour.library, self.version, self.origin)
    }
}

impl Nccl {
    /// Loads the library `search` finds, checks its version ([`MIN_VERSION`]) and resolves every
    /// function. A missing library, function or too old a version is an error that says which
    /// and how to fix it ([`NcclError::is_unavailable`]).
    pub fn load(flavour: &Flavour, search: &Search) -> Result<Nccl, NcclError> {
        let loaded = sys::load(flavour, search)?;
        // Safety: `ncclResult_t ncclGetVersion(int*)` (`nccl.h`).
        let get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult =
            unsafe { sys::resolve(&loaded, "ncclGetVersion")? };
        let mut code: c_int = 0;
        // Safety: writes one int through a valid pointer.
        let status = unsafe { get_version(&mut code) };
        if status != SUCCESS {
            return Err(NcclError::Call {
                call: "ncclGetVersion",
                code: status,
                name: sys::result_name(status),
                message: String::from("(the library failed before its error strings were resolved)"),
                last: None,
            });
        }
        let library = loaded.origin.clone();
        let version = match Version::from_code(code) {
            Some(version) if version >= MIN_VERSION => version,
            version => return Err(NcclError::TooOld { library, code, version }),
        };
        let fns = Box::leak(Box::new(sys::resolve_all(&loaded)?));
        Ok(Nccl { fns, origin: Box::leak(library.into_boxed_str()), version, flavour: *flavour })
    }

    /// The file or name it was loaded from.
    pub fn origin(&self) -> &'static str {
        self.origin
    }

    /// Its version (`ncclGetVersion`; RCCL reports the NCCL version it implements).
    pub fn version(&self) -> Version {
        self.version
    }

    /// NCCL or RCCL.
    pub fn flavour(&self) -> Flavour {
        self.flavour
    }

    /// Whether several ranks may share one GPU here: NCCL (not RCCL) 2.30 or newer with
    /// `NCCL_MULTI_RANK_GPU_ENABLE` set to a non-zero integer in this process's environment.
    pub fn supports_multi_rank_per_gpu(&self) -> bool {
        let enable = std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").ok();
        self.flavour.library == NCCL.library && self.version.supports_multi_rank_per_gpu(enable.as_deref())
    }

    /// A new unique id (`ncclGetUniqueId`): call once, on rank 0.
    pub fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut raw = RawUniqueId { internal: [0; UNIQUE_ID_BYTES] };
        // Safety: writes one `ncclUniqueId` through a valid pointer.
        let code = unsafe { (self.fns.ncclGetUniqueId)(&mut raw) };
        self.check("ncclGetUniqueId", code, std::ptr::null_mut())?;
        Ok(UniqueId(raw.internal.map(|c| c as u8)))
    }

    /// Runs `calls` between `ncclGroupStart` and `ncclGroupEnd` (needed when one thread issues
    /// collectives on several communicators), then waits until every communicator of `comms`
    /// has taken them (each within its timeout). `ncclGroupEnd` runs even when `calls` fails.
    pub fn group<R>(
        &self,
        comms: &[&Communicator],
        calls: impl FnOnce() -> Result<R, NcclError>,
    ) -> Result<R, NcclError> {
        // Safety: no arguments; groups nest, and this one is always ended below.
        let code = unsafe { (self.fns.ncclGroupStart)() };
        self.check("ncclGroupStart", code, std::ptr::null_mut())?;
        let result = calls();
        // Safety: ends the group started above.
        let code = unsafe { (self.fns.ncclGroupEnd)() };
        let value = result?;
        match code {
            SUCCESS => {}
            IN_PROGRESS => {
                for comm in comms {
                    comm.settle("ncclGroupEnd", IN_PROGRESS)?;
                }
            }
            _ => {
                let error = self.error("ncclGroupEnd", code, std::ptr::null_mut());
                for comm in comms {
                    comm.fail(error.clone());
                }
                return Err(error);
            }
        }
        Ok(value)
    }

    fn check(&self, call: &'static str, code: NcclResult, comm: NcclComm) -> Result<(), NcclError> {
        if code == SUCCESS {
            Ok(())
        } else {
            Err(self.error(call, code, comm))
        }
    }

    /// The error of `call` returning `code`, with NCCL's string for it and its last error.
    fn error(&self, call: &'static str, code: NcclResult, comm: NcclComm) -> NcclError {
        // Safety: `ncclGetErrorString` takes any code and returns a static string or null.
        let message = c_text(unsafe { (self.fns.ncclGetErrorString)(code) }).unwrap_or_default();
        // Safety: `ncclGetLastError` takes a communicator or null and returns a string or null.
        let last = self.fns.ncclGetLastError.and_then(|f| c_text(unsafe { f(comm) })).filter(|s| !s.trim().is_empty());
        NcclError::Call { call, code, name: sys::result_name(code), message, last }
    }

    /// Polls `comm` until its state is not `ncclInProgress`, up to `timeout`. On an error or the
    /// timeout the communicator is aborted (the caller must not use it again).
    fn wait(
        &self,
        comm: NcclComm,
        call: &'static str,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<(), NcclError> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(10);
        loop {
            let mut state: NcclResult = IN_PROGRESS;
            // Safety: `comm` is a live communicator; writes one int.
            let code = unsafe { (self.fns.ncclCommGetAsyncError)(comm, &mut state) };
            let failure = if code != SUCCESS {
                Some(self.error("ncclCommGetAsyncError", code, comm))
            } else if state == SUCCESS {
                return Ok(());
            } else if state != IN_PROGRESS {
                Some(self.error(call, state, comm))
            } else if start.elapsed() >= timeout {
                Some(NcclError::Timeout { call, rank, world_size, waited: timeout })
            } else {
                None
            };
            if let Some(error) = failure {
                self.abort(comm);
                return Err(error);
            }
            std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    fn abort(&self, comm: NcclComm) {
        // Safety: `comm` is a live communicator, never used again after this call. Its result is
        // not an error the caller can act on (the communicator is gone either way).
        let _ = unsafe { (self.fns.ncclCommAbort)(comm) };
    }
}

fn c_text(text: *const std::ffi::c_char) -> Option<String> {
    if text.is_null() {
        return None;
    }
    // Safety: NCCL returns NUL-terminated strings that live at least until the next call.
    Some(unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned())
}

/// One rank of a communicator: made with a join timeout, used for collectives, aborted on the
/// first error, finalized and destroyed when dropped.
///
/// `Send` but not `Sync`: NCCL forbids concurrent calls on one communicator, and any thread may
/// use it in turn. The calls use the device that is current on the calling thread when the
/// communicator is made (CUDA: the context made current; HIP: `hipSetDevice`).
pub struct Communicator {
    nccl: Nccl,
    comm: NcclComm,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    /// `Some(why)` once aborted.
    aborted: RefCell<Option<String>>,
}

// Safety: an `ncclComm_t` is a heap object that any host thread may use; NCCL forbids only
// concurrent calls on it, which `!Sync` (the `RefCell`) rules out.
unsafe impl Send for Communicator {}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Communicator(rank {} of {}, {:?})", self.rank, self.world_size, self.nccl)
    }
}

impl Communicator {
    /// Joins the communicator of `id` as `rank` of `world_size` on the calling thread's current
    /// device (`ncclCommInitRankConfig`, non-blocking), waiting at most `timeout` for every rank
    /// to join: past it the communicator is aborted and the error is [`NcclError::Timeout`].
    /// Every rank must call this, each on its own thread or process, with the same `id` and
    /// `world_size`.
    pub fn init(
        nccl: &Nccl,
        id: &UniqueId,
        world_size: usize,
        rank: usize,
        timeout: Duration,
    ) -> Result<Communicator, NcclError> {
        let (Ok(world), Ok(rank32)) = (c_int::try_from(world_size), c_int::try_from(rank)) else {
            return Err(NcclError::Invalid(format!("rank {rank} of {world_size}: beyond a C int")));
        };
        if world_size == 0 || rank >= world_size {
            return Err(NcclError::Invalid(format!(
                "rank {rank} of a world of {world_size}: ranks are 0 to world size - 1"
            )));
        }
        let mut comm: NcclComm = std::ptr::null_mut();
        let mut config = sys::Config::non_blocking();
        // Safety: `comm` and `config` are valid for writes and reads; the id is passed by value;
        // NCCL reads `config.size` bytes of the config, which is that many bytes long.
        let code = unsafe { (nccl.fns.ncclCommInitRankConfig)(&mut comm, world, id.raw(), rank32, &mut config) };
        if code != SUCCESS && code != IN_PROGRESS {
            let error = nccl.error("ncclCommInitRankConfig", code, comm);
            if !comm.is_null() {
                nccl.abort(comm);
            }
            return Err(error);
        }
        if comm.is_null() {
            return Err(NcclError::Invalid("ncclCommInitRankConfig returned no communicator".into()));
        }
        nccl.wait(comm, "ncclCommInitRankConfig", rank, world_size, timeout)?;
        Ok(Communicator { nccl: *nccl, comm, rank, world_size, timeout, aborted: RefCell::new(None) })
    }

    /// A process's rank of a multi-process job as `torchrun` starts it: rank 0 makes the unique
    /// id and hands it out over its own TCP listener (`memo_runtime::rendezvous`), then every rank
    /// joins with `env.timeout` as the join timeout too. The device is the calling thread's
    /// current one: make device `env.local_rank` current first.
    pub fn from_torchrun(nccl: &Nccl, env: &TorchrunEnv) -> Result<Communicator, NcclError> {
        let bytes = env.exchange(|| nccl.unique_id().map(|id| id.0.to_vec()).map_err(|e| e.to_string()))?;
        let id = UniqueId::from_bytes(&bytes)?;
        Communicator::init(nccl, &id, env.world_size, env.rank, env.timeout)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The bound on every wait for this communicator.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The library.
    pub fn nccl(&self) -> &Nccl {
        &self.nccl
    }

    /// `ncclAllGather`: `send_count` elements from `send` on every rank land at
    /// `recv + rank * send_count` on every rank, in stream order on `stream`.
    ///
    /// # Safety
    /// `send` must address `send_count` elements of `dtype`, and `recv` `world_size * send_count`
    /// (not overlapping `send` unless `send == recv + rank * send_count * dtype.bytes()`), of
    /// device memory of this communicator's device, valid until the operation completes on
    /// `stream`, a live stream of that device; nothing else may access `recv` meanwhile.
    pub unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        const CALL: &str = "ncclAllGather";
        self.ready(CALL)?;
        self.extent(CALL, send_count, dtype)?;
        // Safety: the caller's contract; the communicator is live (not aborted).
        let code = unsafe {
            (self.nccl.fns.ncclAllGather)(
                send as usize as *const c_void,
                recv as usize as *mut c_void,
                send_count,
                dtype.raw(),
                self.comm,
                stream,
            )
        };
        self.settle(CALL, code)
    }

    /// `ncclReduceScatter`: the element-wise `op` over ranks of `world_size * recv_count`
    /// elements at `send`; rank r receives block r (`recv_count` elements) at `recv`.
    ///
    /// # Safety
    /// As [`Communicator::all_gather`], with `send` holding `world_size * recv_count` elements and
    /// `recv` `recv_count` (in place when `recv == send + rank * recv_count * dtype.bytes()`).
    pub unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        const CALL: &str = "ncclReduceScatter";
        self.ready(CALL)?;
        self.extent(CALL, recv_count, dtype)?;
        // Safety: the caller's contract; the communicator is live.
        let code = unsafe {
            (self.nccl.fns.ncclReduceScatter)(
                send as usize as *const c_void,
                recv as usize as *mut c_void,
                recv_count,
                dtype.raw(),
                op.raw(),
                self.comm,
                stream,
            )
        };
        self.settle(CALL, code)
    }

    /// `ncclAllReduce`: the element-wise `op` over ranks of `count` elements at `send`, on every
    /// rank at `recv` (in place when equal).
    ///
    /// # Safety
    /// As [`Communicator::all_gather`], with `count` elements at each of `send` and `recv`.
    pub unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        const CALL: &str = "ncclAllReduce";
        self.ready(CALL)?;
        self.extent(CALL, count, dtype)?;
        // Safety: the caller's contract; the communicator is live.
        let code = unsafe {
            (self.nccl.fns.ncclAllReduce)(
                send as usize as *const c_void,
                recv as usize as *mut c_void,
                count,
                dtype.raw(),
                op.raw(),
                self.comm,
                stream,
            )
        };
        self.settle(CALL, code)
    }

    /// `ncclCommGetAsyncError`: an error raised since (a peer gone, a network failure) aborts
    /// the communicator and is returned. Call it after synchronising the stream.
    pub fn check(&self) -> Result<(), NcclError> {
        const CALL: &str = "ncclCommGetAsyncError";
        self.ready(CALL)?;
        let mut state: NcclResult = SUCCESS;
        // Safety: a live communicator; writes one int.
        let code = unsafe { (self.nccl.fns.ncclCommGetAsyncError)(self.comm, &mut state) };
        if code != SUCCESS {
            return Err(self.fail(self.nccl.error(CALL, code, self.comm)));
        }
        match state {
            SUCCESS => Ok(()),
            IN_PROGRESS => self.settle(CALL, IN_PROGRESS),
            _ => Err(self.fail(self.nccl.error("a collective (asynchronous error)", state, self.comm))),
        }
    }

    /// Finalizes (waiting at most the timeout; aborting past it) and destroys the communicator.
    pub fn destroy(self) -> Result<(), NcclError> {
        let result = self.release();
        std::mem::forget(self);
        result
    }

    /// Aborts the communicator now (`ncclCommAbort`: pending operations are dropped).
    pub fn abort(self) {
        if self.aborted.borrow().is_none() {
            self.nccl.abort(self.comm);
        }
        std::mem::forget(self);
    }

    fn release(&self) -> Result<(), NcclError> {
        if self.aborted.borrow().is_some() {
            return Ok(()); // already aborted: nothing left to free
        }
        let fns = self.nccl.fns;
        if let Some(finalize) = fns.ncclCommFinalize {
            // Safety: a live communicator, finalized once.
            let code = unsafe { finalize(self.comm) };
            match code {
                SUCCESS => {}
                IN_PROGRESS => {
                    self.nccl.wait(self.comm, "ncclCommFinalize", self.rank, self.world_size, self.timeout)?
                }
                _ => {
                    let error = self.nccl.error("ncclCommFinalize", code, self.comm);
                    self.nccl.abort(self.comm);
                    return Err(error);
                }
            }
        }
        // Safety: a live, finalized communicator, never used again.
        let code = unsafe { (fns.ncclCommDestroy)(self.comm) };
        // A non-blocking destroy may return ncclInProgress and finish in the background; the
        // communicator must not be touched again either way.
        if code == SUCCESS || code == IN_PROGRESS {
            Ok(())
        } else {
            Err(self.nccl.error("ncclCommDestroy", code, std::ptr::null_mut()))
        }
    }

    /// Refuses a call on an aborted communicator.
    fn ready(&self, call: &'static str) -> Result<(), NcclError> {
        match &*self.aborted.borrow() {
            Some(cause) => Err(NcclError::Aborted { call, cause: cause.clone() }),
            None => Ok(()),
        }
    }

    /// Refuses a count whose whole-world extent does not fit in memory addresses.
    fn extent(&self, call: &'static str, count: usize, dtype: DataType) -> Result<(), NcclError> {
        match count.checked_mul(self.world_size).and_then(|n| n.checked_mul(dtype.bytes())) {
            Some(_) => Ok(()),
            None => Err(NcclError::Invalid(format!(
                "{call}: {count} elements of {dtype:?} on each of {} ranks overflow the address space",
                self.world_size
            ))),
        }
    }

    /// The outcome of `call` having returned `code`: done, waited for (a non-blocking call in
    /// progress), or an error that aborts the communicator.
    fn settle(&self, call: &'static str, code: NcclResult) -> Result<(), NcclError> {
        match code {
            SUCCESS => Ok(()),
            IN_PROGRESS => {
                // Never poll an aborted (freed) communicator: a group may end after one of its
                // calls failed and aborted it.
                self.ready(call)?;
                let result = self.nccl.wait(self.comm, call, self.rank, self.world_size, self.timeout);
                if let Err(error) = &result {
                    // `wait` aborted it already.
                    *self.aborted.borrow_mut() = Some(error.to_string());
                }
                result
            }
            _ => Err(self.fail(self.nccl.error(call, code, self.comm))),
        }
    }

    /// Aborts the communicator (once) and keeps why.
    fn fail(&self, error: NcclError) -> NcclError {
        let mut aborted = self.aborted.borrow_mut();
        if aborted.is_none() {
            self.nccl.abort(self.comm);
            *aborted = Some(error.to_string());
        }
        error
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// Loads NCCL from `MEMO_NCCL_LIBRARY` if set, else `libnccl.so.2` then `libnccl.so` by the
/// system search.
pub fn load_nccl() -> Result<Nccl, NcclError> {
    Nccl::load(&NCCL, &Search::from_env(&NCCL, Vec::new()))
}

/// Loads RCCL from `MEMO_RCCL_LIBRARY` if set, else `librccl.so.1` then `librccl.so` in each of
/// `dirs` (the HIP backend passes its ROCm folders), then by the system search.
pub fn load_rccl(dirs: Vec<PathBuf>) -> Result<Nccl, NcclError> {
    Nccl::load(&RCCL, &Search::from_env(&RCCL, dirs))
}

#[cfg(test)]
mod tests;
