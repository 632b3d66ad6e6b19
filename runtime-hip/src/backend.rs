//! [`HipBackend`]: `memo_runtime::Backend` on an AMD GPU.
//!
//! One device arena (`hipMalloc`), one pinned host slab (`hipHostMalloc`, not write-combined),
//! four non-blocking streams in `Stream::ALL` order, the plan's events (no timing). Launches go
//! through `memo_kernels::launch_steps`; GEMMs through hipBLAS on the launch's stream. The plan's
//! events are the only synchronisation between streams; nothing is tracked per allocation.
//!
//! Construction requires hipBLAS: every training plan has GEMMs, so a backend without it could
//! not run a single step; [`HipBackend::new`] says so instead of failing at the first GEMM.

use memo_kernels::{ArgShape, Gemm, KernelLaunch, Step};
use memo_plan_core::plan::{EventId, Op, Stream as PlanStream};
use memo_runtime::{Backend, BackendError, KernelArg, KernelContext, MemoryReport, Space, Span};

use crate::error::HipError;
use crate::marshal::{kernel_error, Layout};
use crate::safe::blas::BlasHandle;
use crate::safe::memory::{is_out_of_memory, DeviceBuffer, PinnedHostBuffer};
use crate::safe::module::{compile_source, device_options, Module};
use crate::safe::stream::{Event, Stream};
use crate::safe::Device;
use crate::sys::hip::{MEMCPY_DEVICE_TO_DEVICE, MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, MEMCPY_HOST_TO_HOST};
use crate::sys::hipblas::HipblasLib;
use crate::sys::hiprtc::HiprtcLib;
use crate::sys::LibrarySearch;
use crate::timing::Timing;
use crate::{result, HipError as Error};

/// The environment variable that names the `--offload-arch` to compile for (e.g. `gfx942`);
/// unset, hiprtc compiles for the current device.
pub const ARCH_VARIABLE: &str = "MEMO_HIP_ARCH";

/// The HIP backend. Fields drop in declaration order: the handle and the events before the
/// streams, the memory before the modules.
pub struct HipBackend {
    blas: BlasHandle,
    /// The stream index the BLAS handle is bound to.
    blas_stream: usize,
    events: Vec<Event>,
    /// Per-instruction timing, when measuring ([`HipBackend::measure`]).
    timing: Option<Timing>,
    /// Whether each event was recorded in this step (a Wait on one not yet recorded is refused:
    /// HIP would wait on an older recording, or on nothing).
    recorded: Vec<bool>,
    arena: Option<DeviceBuffer>,
    host: Option<PinnedHostBuffer>,
    /// Each stream's kernel scratch memory (`Param::Scratch`), grown on demand.
    scratch: Vec<Option<DeviceBuffer>>,
    /// The running launch's scratch from the plan (its argument past the signature: address,
    /// bytes), used instead of the stream's while it is set.
    plan_scratch: Option<(u64, u64)>,
    /// The `memo_kernels::STATUS_WORDS` status words kernels report bad input in
    /// (`Param::Status`), zeroed at allocation and after each read at synchronize.
    status: Option<DeviceBuffer>,
    streams: Vec<Stream>,
    modules: Vec<Module>,
    device: Device,
}

impl HipBackend {
    /// Opens GPU `ordinal` with the libraries found by [`LibrarySearch::from_env`].
    pub fn new(ordinal: usize) -> Result<HipBackend, BackendError> {
        Self::with_library_search(ordinal, &LibrarySearch::from_env())
    }

    /// Opens GPU `ordinal` with the libraries found by `search`.
    pub fn with_library_search(ordinal: usize, search: &LibrarySearch) -> Result<HipBackend, BackendError> {
        Self::open(ordinal, search).map_err(BackendError::from)
    }

    /// As [`HipBackend::with_library_search`], with the typed error. In order: the HIP runtime
    /// ([`HipError::LibraryNotFound`]), a device ([`HipError::NoDevice`],
    /// [`HipError::InvalidOrdinal`]), the wavefront size, hiprtc, hipBLAS, the streams, every
    /// kernel source compiled and loaded, and the hipBLAS `GemmEx` convention probed.
    pub fn open(ordinal: usize, search: &LibrarySearch) -> Result<HipBackend, HipError> {
        let (device, hip) = Device::open(search, ordinal)?;
        match device.warp_size() {
            64 => {}
            32 => {
                return Err(Error::Unsupported(format!(
                    "{} has 32-wide wavefronts (RDNA): the kernels are written for 64 (memo_gpu.h MEMO_WARP_SIZE); \
                     use a CDNA GPU (MI200, MI300)",
                    device.name()
                )))
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "{} reports a wavefront size of {other} for hipDeviceAttributeWarpSize (87): this HIP runtime's \
                     attribute numbering differs from ROCm 5-7's; the backend does not guess",
                    device.name()
                )))
            }
        }
        let rtc = HiprtcLib::load(search, &hip)?;
        let blas_lib = HipblasLib::load(search)?;
        let streams = PlanStream::ALL.iter().map(|_| Stream::new(&device)).collect::<Result<Vec<_>, _>>()?;
        let arch = std::env::var(ARCH_VARIABLE).ok().filter(|a| !a.is_empty());
        let options = device_options(arch.as_deref());
        let mut modules = Vec::with_capacity(memo_kernels::SOURCES.len());
        for source in memo_kernels::SOURCES {
            let code = compile_source(&rtc.fns, source, &options)?;
            modules.push(Module::load(&device, &code, source.name, source.kernels)?);
        }
        let blas = BlasHandle::new(&device, &blas_lib, &streams[PlanStream::Compute.index()])?;
        Ok(HipBackend {
            blas,
            blas_stream: PlanStream::Compute.index(),
            events: Vec::new(),
            timing: None,
            recorded: Vec::new(),
            arena: None,
            host: None,
            scratch: PlanStream::ALL.iter().map(|_| None).collect(),
            plan_scratch: None,
            status: None,
            streams,
            modules,
            device,
        })
    }

    /// Measure every launch and copy ([`Backend::timings`]): a timed event before and after each
    /// on its stream, read at synchronize.
    pub fn measure(mut self) -> Self {
        self.timing = Some(Timing::default());
        self
    }

    /// When measuring, records a timing event on `stream`.
    fn mark(&mut self, stream: PlanStream) -> Result<Option<usize>, BackendError> {
        let Some(timing) = self.timing.as_mut() else { return Ok(None) };
        let stream = self
            .streams
            .get(stream.index())
            .ok_or_else(|| BackendError::Other(format!("the hip backend has no {} stream", stream.name())))?;
        timing.mark(&self.device, stream).map(Some)
    }

    /// When measuring, closes `instruction`'s span begun at `start`.
    fn close_mark(&mut self, instruction: usize, stream: PlanStream, start: Option<usize>) -> Result<(), BackendError> {
        if let Some(start) = start {
            if let Some(end) = self.mark(stream)? {
                if let Some(timing) = self.timing.as_mut() {
                    timing.span(instruction, start, end);
                }
            }
        }
        Ok(())
    }

    /// The hipBLAS `GemmEx` convention found.
    pub fn gemm_convention(&self) -> crate::safe::blas::GemmConvention {
        self.blas.convention()
    }

    /// Joins the RCCL communicator of `id` as `rank` of `world_size` on this backend's device
    /// (set on the calling thread first), waiting at most `timeout` for every rank
    /// (`memo_nccl::Communicator::init`). Drop the communicator before the backend.
    pub fn join_collectives(
        &self,
        rccl: &crate::rccl::Nccl,
        id: &crate::rccl::UniqueId,
        world_size: usize,
        rank: usize,
        timeout: std::time::Duration,
    ) -> Result<crate::rccl::Communicator, BackendError> {
        self.bind()?;
        crate::rccl::Communicator::init(rccl, id, world_size, rank, timeout).map_err(BackendError::from)
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.device.bind().map_err(BackendError::from)
    }

    /// Where the memory is, with stream `stream`'s scratch.
    fn layout(&self, stream: usize) -> Layout {
        let region = |buffer: Option<(u64, u64)>| buffer.unwrap_or((0, 0));
        Layout {
            arena: region(self.arena.as_ref().map(|b| (b.base(), b.bytes()))),
            host: region(self.host.as_ref().map(|b| (b.base(), b.bytes()))),
            scratch: self.plan_scratch.unwrap_or_else(|| {
                region(self.scratch.get(stream).and_then(Option::as_ref).map(|b| (b.base(), b.bytes())))
            }),
            status: self.status.as_ref().map(DeviceBuffer::base),
        }
    }

    fn size_of(&self, space: Space) -> u64 {
        self.layout(0).size_of(space)
    }

    fn address(&self, span: Span) -> Result<u64, BackendError> {
        self.layout(0).address(span)
    }

    fn stream(&self, stream: PlanStream) -> Result<&Stream, BackendError> {
        self.streams
            .get(stream.index())
            .ok_or_else(|| BackendError::Other(format!("the hip backend has no {} stream", stream.name())))
    }

    fn event_index(&self, instruction: usize, event: EventId) -> Result<usize, BackendError> {
        let index = event.0 as usize;
        if index >= self.events.len() {
            return Err(BackendError::Kernel {
                instruction,
                message: format!("event {} does not exist: {} allocated", event.0, self.events.len()),
            });
        }
        Ok(index)
    }

    fn run_step(
        &mut self,
        instruction: usize,
        op: Op,
        args: &[KernelArg],
        stream: usize,
        step: &Step,
    ) -> Result<(), BackendError> {
        match step {
            Step::Kernel(launch) => self.run_kernel(instruction, op, args, stream, launch),
            Step::Gemm(gemm) => self.run_gemm(instruction, op, args, stream, gemm),
            Step::Zero { arg } => {
                let span = args
                    .get(*arg)
                    .ok_or_else(|| {
                        kernel_error(instruction, op, format!("zero of argument {arg}, which does not exist"))
                    })?
                    .span;
                let address = self.address(span)?;
                if span.len > 0 {
                    // Safety: the span lies in the arena (checked by `address`), which outlives
                    // the stream's work (the backend synchronises before freeing it); the caller
                    // of the unsafe `Backend::launch` orders it against the other streams.
                    unsafe {
                        result::memory::set_async(
                            self.device.hip(),
                            address as *mut _,
                            0,
                            span.len as usize,
                            self.streams[stream].raw(),
                        )
                    }
                    .map_err(|e| kernel_error(instruction, op, e))?;
                }
                Ok(())
            }
        }
    }

    fn run_kernel(
        &mut self,
        instruction: usize,
        op: Op,
        args: &[KernelArg],
        stream: usize,
        launch: &KernelLaunch,
    ) -> Result<(), BackendError> {
        let (module, function) =
            self.modules.iter().find_map(|m| m.function(launch.kernel).map(|f| (m, f))).ok_or_else(|| {
                kernel_error(instruction, op, format!("kernel `{}` is in no compiled source", launch.kernel))
            })?;
        let mut slots = self.layout(stream).kernel_params(instruction, op, args, launch)?;
        let mut pointers: Vec<*mut std::ffi::c_void> = slots.iter_mut().map(|s| s.as_mut_ptr().cast()).collect();
        // Safety: the function belongs to `module`; each pointer points at a slot holding a value
        // of the recipe's parameter type (the recipe and the kernel come from the same crate);
        // device addresses lie inside the arguments (checked by `operand`); the caller of the
        // unsafe `Backend::launch` orders them against the other streams' accesses.
        unsafe {
            module.launch(
                function,
                launch.grid,
                launch.block,
                launch.shared_bytes,
                self.streams[stream].raw(),
                &mut pointers,
            )
        }
        .map_err(|e| kernel_error(instruction, op, format!("kernel `{}`: {e}", launch.kernel)))
    }

    fn run_gemm(
        &mut self,
        instruction: usize,
        op: Op,
        args: &[KernelArg],
        stream: usize,
        gemm: &Gemm,
    ) -> Result<(), BackendError> {
        let call = self.layout(stream).gemm_call(instruction, op, args, gemm)?;
        if self.blas_stream != stream {
            self.blas.set_stream(&self.streams[stream]).map_err(|e| kernel_error(instruction, op, e))?;
            self.blas_stream = stream;
        }
        // Safety: A, B and C lie inside their arguments for the extents the shape implies
        // (checked above); the arena outlives the stream's work.
        unsafe { self.blas.gemm(&call) }.map_err(|e| kernel_error(instruction, op, e))
    }

    /// Bytes of every stream's kernel scratch.
    fn scratch_held(&self) -> u64 {
        self.scratch.iter().flatten().map(DeviceBuffer::bytes).sum()
    }

    /// Makes stream `stream`'s scratch hold at least `bytes`. Growing waits for the stream first:
    /// work already queued on it may still use the old scratch.
    fn ensure_scratch(&mut self, instruction: usize, stream: usize, bytes: u64) -> Result<(), BackendError> {
        let have = self.scratch[stream].as_ref().map_or(0, DeviceBuffer::bytes);
        if bytes <= have {
            return Ok(());
        }
        self.streams[stream]
            .synchronize()
            .map_err(|e| BackendError::Kernel { instruction, message: format!("before growing the scratch: {e}") })?;
        self.scratch[stream] = None;
        let buffer = DeviceBuffer::new(&self.device, bytes).map_err(|e| {
            if is_out_of_memory(&e) {
                BackendError::OutOfMemory { what: "kernel scratch", bytes }
            } else {
                BackendError::from(e)
            }
        })?;
        self.scratch[stream] = Some(buffer);
        Ok(())
    }

    /// Writes zeros over the status words.
    fn clear_status(&self) -> Result<(), HipError> {
        if let Some(status) = &self.status {
            let zeros = [0u32; memo_kernels::STATUS_WORDS];
            // Safety: the status buffer holds exactly these words; the copy is synchronous.
            unsafe {
                result::memory::copy(
                    self.device.hip(),
                    status.base() as *mut _,
                    zeros.as_ptr().cast(),
                    std::mem::size_of_val(&zeros),
                    MEMCPY_HOST_TO_DEVICE,
                )?;
            }
        }
        Ok(())
    }

    /// What the kernels reported since the last read (`None`: nothing), and clears it. Call with
    /// every stream idle.
    fn take_status(&self) -> Result<Option<(usize, String)>, HipError> {
        let Some(status) = &self.status else { return Ok(None) };
        let mut words = [0u32; memo_kernels::STATUS_WORDS];
        // Safety: the status buffer holds exactly these words; the copy is synchronous.
        unsafe {
            result::memory::copy(
                self.device.hip(),
                words.as_mut_ptr().cast(),
                status.base() as *const _,
                std::mem::size_of_val(&words),
                MEMCPY_DEVICE_TO_HOST,
            )?;
        }
        let reported = memo_kernels::status_error(words);
        if reported.is_some() {
            self.clear_status()?;
        }
        Ok(reported)
    }

    /// Waits for every stream; the first error.
    fn wait_streams(&self) -> Result<(), HipError> {
        let mut first = Ok(());
        for stream in &self.streams {
            if let Err(e) = stream.synchronize() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl Drop for HipBackend {
    fn drop(&mut self) {
        // Work still queued may touch the arena: let it finish before anything is freed.
        // Errors cannot be returned from here and the device is going away with the backend.
        let _ = self.device.bind();
        let _ = self.wait_streams();
    }
}

impl Backend for HipBackend {
    fn name(&self) -> String {
        format!("hip:{} ({})", self.device.ordinal(), self.device.name())
    }

    fn allocate(&mut self, arena_bytes: u64, host_bytes: u64, events: u32) -> Result<(), BackendError> {
        self.bind()?;
        self.wait_streams().map_err(BackendError::from)?;
        self.events.clear();
        self.arena = None;
        self.host = None;
        self.status = None;
        self.scratch.iter_mut().for_each(|s| *s = None);
        self.arena = Some(DeviceBuffer::new(&self.device, arena_bytes).map_err(|e| {
            if is_out_of_memory(&e) {
                BackendError::OutOfMemory { what: "device arena", bytes: arena_bytes }
            } else {
                BackendError::from(e)
            }
        })?);
        self.host = Some(PinnedHostBuffer::new(&self.device, host_bytes).map_err(|e| {
            if is_out_of_memory(&e) {
                BackendError::OutOfMemory { what: "pinned host slab", bytes: host_bytes }
            } else {
                BackendError::from(e)
            }
        })?);
        // Zeroed, as on the CPU and CUDA backends, so that every backend starts a plan from the
        // same bytes.
        if let Some(arena) = &self.arena {
            arena.zero(&self.streams[PlanStream::Compute.index()])?;
        }
        if let Some(host) = self.host.as_mut() {
            // Safety: every stream is idle (waited above) and the slab is new.
            unsafe { host.zero() };
        }
        self.events = (0..events).map(|_| Event::new(&self.device)).collect::<Result<Vec<_>, _>>()?;
        self.recorded = vec![false; events as usize];
        let status_bytes = (memo_kernels::STATUS_WORDS * std::mem::size_of::<u32>()) as u64;
        self.status = Some(DeviceBuffer::new(&self.device, status_bytes)?);
        self.clear_status()?;
        Ok(())
    }

    fn upload(&mut self, span: Span, bytes: &[u8]) -> Result<(), BackendError> {
        self.synchronize()?;
        if bytes.len() as u64 != span.len {
            return Err(BackendError::Other(format!("upload of {} bytes into a span of {}", bytes.len(), span.len)));
        }
        let address = self.address(span)?;
        match span.space {
            Space::Device if span.len > 0 => {
                // Safety: the span lies in the arena (checked); the copy is synchronous.
                unsafe {
                    result::memory::copy(
                        self.device.hip(),
                        address as *mut _,
                        bytes.as_ptr().cast(),
                        bytes.len(),
                        MEMCPY_HOST_TO_DEVICE,
                    )
                }
                .map_err(BackendError::from)
            }
            Space::Device => Ok(()),
            Space::Host => {
                let host = self.host.as_mut().ok_or(BackendError::OutOfBounds { span, size: 0 })?;
                // Safety: every stream is idle (synchronized above).
                unsafe { host.write(span.offset, bytes) }.ok_or(BackendError::OutOfBounds { span, size: host.bytes() })
            }
        }
    }

    fn download(&mut self, span: Span) -> Result<Vec<u8>, BackendError> {
        self.synchronize()?;
        let address = self.address(span)?;
        match span.space {
            Space::Device => {
                let mut out = vec![0u8; span.len as usize];
                if span.len > 0 {
                    // Safety: the span lies in the arena (checked); the copy is synchronous.
                    unsafe {
                        result::memory::copy(
                            self.device.hip(),
                            out.as_mut_ptr().cast(),
                            address as *const _,
                            out.len(),
                            MEMCPY_DEVICE_TO_HOST,
                        )
                    }
                    .map_err(BackendError::from)?;
                }
                Ok(out)
            }
            Space::Host => {
                let host = self.host.as_ref().ok_or(BackendError::OutOfBounds { span, size: 0 })?;
                // Safety: every stream is idle (synchronized above).
                unsafe { host.read(span.offset, span.len) }
                    .ok_or(BackendError::OutOfBounds { span, size: host.bytes() })
            }
        }
    }

    unsafe fn launch(
        &mut self,
        instruction: usize,
        stream: PlanStream,
        op: Op,
        args: &[KernelArg],
        context: &KernelContext,
    ) -> Result<(), BackendError> {
        self.bind()?;
        let start = self.mark(stream)?;
        self.enqueue_launch(instruction, stream, op, args, context)?;
        self.close_mark(instruction, stream, start)
    }

    unsafe fn copy(
        &mut self,
        instruction: usize,
        stream: PlanStream,
        src: Span,
        dst: Span,
    ) -> Result<(), BackendError> {
        self.bind()?;
        let start = self.mark(stream)?;
        self.enqueue_copy(instruction, stream, src, dst)?;
        self.close_mark(instruction, stream, start)
    }

    fn timings(&mut self) -> Option<Vec<(usize, f64, f64)>> {
        self.timing.as_ref().map(Timing::last)
    }

    fn record(&mut self, instruction: usize, stream: PlanStream, event: EventId) -> Result<(), BackendError> {
        self.bind()?;
        let index = self.event_index(instruction, event)?;
        self.stream(stream)?
            .record(&self.events[index])
            .map_err(|e| BackendError::Kernel { instruction, message: format!("record of event {}: {e}", event.0) })?;
        self.recorded[index] = true;
        Ok(())
    }

    fn wait(&mut self, instruction: usize, stream: PlanStream, event: EventId) -> Result<(), BackendError> {
        self.bind()?;
        let index = self.event_index(instruction, event)?;
        if !self.recorded[index] {
            return Err(BackendError::Kernel {
                instruction,
                message: format!(
                    "wait on event {} before it is recorded in this step: a HIP stream would not wait for it (the \
                     checker's rule WaitBeforeRecord; replay only checked plans)",
                    event.0
                ),
            });
        }
        self.stream(stream)?
            .wait(&self.events[index])
            .map_err(|e| BackendError::Kernel { instruction, message: format!("wait on event {}: {e}", event.0) })
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.bind()?;
        let waited = self.wait_streams();
        self.recorded.iter_mut().for_each(|r| *r = false);
        waited.map_err(|e| BackendError::Other(format!("hip: a stream failed: {e}")))?;
        if let Some(timing) = self.timing.as_mut() {
            timing.finish_step()?;
        }
        if let Some((instruction, message)) = self.take_status()? {
            return Err(BackendError::Kernel { instruction, message });
        }
        self.device.take_deferred().map_err(BackendError::from)
    }

    /// The recipes' scratch ([`memo_kernels::RecipeScratch`]): HIP runs every op, attention
    /// included, on our kernels.
    fn scratch_sizer(
        &mut self,
        _model: &memo_plan_core::model::ModelConfig,
        _tensor: u64,
    ) -> Result<Box<dyn memo_plan_core::plan::scratch::ScratchSizer>, BackendError> {
        Ok(Box::new(memo_kernels::RecipeScratch))
    }

    fn memory(&self) -> MemoryReport {
        MemoryReport {
            device_bytes: self.size_of(Space::Device),
            host_bytes: self.size_of(Space::Host),
            scratch_bytes: self.scratch_held(),
        }
    }
}

// The work these enqueue touches memory other streams' work may touch too: they serve only the
// unsafe `Backend::launch` and `Backend::copy`, whose callers order such accesses by events.
impl HipBackend {
    fn enqueue_launch(
        &mut self,
        instruction: usize,
        stream: PlanStream,
        op: Op,
        args: &[KernelArg],
        context: &KernelContext,
    ) -> Result<(), BackendError> {
        self.stream(stream)?;
        let mut shapes = Vec::with_capacity(args.len());
        let signature = op.signature().len();
        for (index, arg) in args.iter().enumerate() {
            if arg.span.space != Space::Device {
                return Err(kernel_error(instruction, op, format!("argument {index} is not in the device arena")));
            }
            self.address(arg.span)?;
            if index < signature {
                shapes.push(ArgShape { first_row: arg.first_row, rows: arg.rows, row_bytes: arg.row_bytes });
            }
        }
        let steps = memo_kernels::launch_steps(op, &shapes, context)
            .map_err(|e| BackendError::Kernel { instruction, message: e.to_string() })?;
        let needed = memo_kernels::scratch_bytes(&steps);
        // The plan's scratch (its argument past the signature) when it has one; else (a plan
        // made without `memo_kernels::RecipeScratch`) the stream's, grown on demand.
        self.plan_scratch = None;
        match args.get(signature) {
            Some(scratch) if scratch.span.len >= needed => {
                self.plan_scratch = Some((self.address(scratch.span)?, scratch.span.len));
            }
            Some(scratch) => {
                let message = format!(
                    "the plan gives {} bytes of scratch, the kernels need {needed} (the plan was made for another \
                     backend's scratch sizer)",
                    scratch.span.len
                );
                return Err(kernel_error(instruction, op, message));
            }
            None => self.ensure_scratch(instruction, stream.index(), needed)?,
        }
        let ran = steps.iter().try_for_each(|step| self.run_step(instruction, op, args, stream.index(), step));
        self.plan_scratch = None;
        ran
    }

    fn enqueue_copy(
        &mut self,
        instruction: usize,
        stream: PlanStream,
        src: Span,
        dst: Span,
    ) -> Result<(), BackendError> {
        if src.len != dst.len {
            return Err(BackendError::Kernel {
                instruction,
                message: format!("copy of {} bytes into a span of {}", src.len, dst.len),
            });
        }
        let from = self.address(src)?;
        let to = self.address(dst)?;
        if src.len == 0 {
            return Ok(());
        }
        let kind = match (src.space, dst.space) {
            (Space::Device, Space::Device) => MEMCPY_DEVICE_TO_DEVICE,
            (Space::Device, Space::Host) => MEMCPY_DEVICE_TO_HOST,
            (Space::Host, Space::Device) => MEMCPY_HOST_TO_DEVICE,
            (Space::Host, Space::Host) => MEMCPY_HOST_TO_HOST,
        };
        let raw = self.stream(stream)?.raw();
        // Safety: both spans lie in memory this backend owns (checked by `address`), which
        // outlives the stream's work; the caller of the unsafe `Backend::copy` orders them
        // against the other streams' accesses.
        unsafe {
            result::memory::copy_async(self.device.hip(), to as *mut _, from as *const _, src.len as usize, kind, raw)
        }
        .map_err(|e| BackendError::Kernel { instruction, message: format!("copy: {e}") })
    }
}
