//! [`CudaBackend`]: one device arena, one pinned host slab, four streams, the plan's events,
//! and the kernels of `memo-kernels` compiled by NVRTC at construction.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice};
use memo_kernels::{
    launch_steps, lse_transpose_step, rope_step, scratch_bytes, status_error, ArgShape, AttentionVariant, Param,
    STATUS_WORDS,
};
use memo_plan_core::plan::shapes::AttentionShape;
use memo_plan_core::plan::{EventId, Op, Stream};
use memo_runtime::{Backend, BackendError, KernelArg, KernelContext, MemoryReport, Space, Span};

use crate::attention::cudnn::{refusal, version_text, Cudnn, Pass};
use crate::attention::graph::{uid, BackwardForm, Shape, StatsLayout};
use crate::attention::{self, AttentionChoice, AttentionScratch, KeyValueView};
use crate::error::CudaError;
use crate::exec::{self, Resolved};

#[path = "collectives.rs"]
mod collectives;
use crate::timing::Timing;
use crate::{compile, probe};

/// The environment variable that picks how attention runs ([`AttentionChoice`]): `cudnn` (the
/// default: cuDNN's fused attention, our kernels when cuDNN cannot run, with one line saying
/// why), `cudnn-deterministic` (the same with the deterministic backward), or our kernels in the
/// variant `baseline` (verified on an H200) or `pipelined`; any other value is an error.
pub const ATTENTION_VARIABLE: &str = "MEMO_CUDA_ATTENTION";

/// The choice [`ATTENTION_VARIABLE`]'s value names (unset or empty: the default).
fn attention_choice(value: Option<&str>) -> Result<AttentionChoice, BackendError> {
    match value {
        Some(name) if !name.is_empty() => {
            AttentionChoice::parse(name).map_err(|e| BackendError::Other(format!("{ATTENTION_VARIABLE}={name}: {e}")))
        }
        _ => Ok(AttentionChoice::default()),
    }
}

/// The arena and the host slab.
struct Memory {
    /// The device arena (its allocation holds at least one byte).
    arena: CudaSlice<u8>,
    /// Bytes the plan asked for.
    arena_bytes: u64,
    /// The pinned host slab, page-locked and NOT write-combined (the CPU reads swapped-out
    /// activations back from it). Only owned here (dropping it frees the slab); it is used
    /// through `host_address`.
    _host: PinnedHostSlice<u8>,
    /// Its first byte, taken once at allocation (an address: the slab is written by copies the
    /// GPU runs, so no Rust reference to it is ever held).
    host_address: usize,
    /// Bytes the plan asked for.
    host_bytes: u64,
}

/// The MEMO backend on one NVIDIA GPU.
///
/// Streams: [`Stream::Compute`], [`Stream::DeviceToHost`], [`Stream::HostToDevice`] and
/// [`Stream::Collective`] are four non-blocking CUDA streams; the plan's events are CUDA events
/// and are the only synchronisation between them (cudarc's per-allocation event tracking is
/// off). Kernel launches and copies are enqueued and return; [`Backend::synchronize`] waits and reports the first error, including the
/// status words kernels write on bad input (an out-of-range token, a non-finite gradient norm).
pub struct CudaBackend {
    /// cuDNN, when attention runs on it (dropped before the context: its handle and plans belong
    /// to the context).
    cudnn: Option<Cudnn>,
    ordinal: usize,
    /// How attention was asked to run ([`ATTENTION_VARIABLE`]).
    attention: AttentionChoice,
    /// The variant our attention kernels are compiled in (baseline under a cuDNN choice: the
    /// fallback).
    variant: AttentionVariant,
    /// How attention runs now, for [`CudaBackend::describe`] (the line printed at construction).
    attention_note: String,
    device_name: String,
    /// The NVRTC that compiled the kernels, for [`CudaBackend::describe`].
    nvrtc: String,
    /// Compute capability, major * 10 + minor.
    sm: u32,
    ctx: Arc<CudaContext>,
    /// Indexed by [`Stream::index`].
    streams: Vec<Arc<CudaStream>>,
    /// One cuBLAS handle per stream (a handle's workspace must not be shared across streams).
    blas: Vec<CudaBlas>,
    functions: HashMap<&'static str, CudaFunction>,
    /// [`STATUS_WORDS`] u32 that kernels write on bad input.
    status: CudaSlice<u32>,
    /// Per-stream scratch for kernels' partial sums, grown on demand.
    scratch: Vec<Option<CudaSlice<u8>>>,
    events: Vec<CudaEvent>,
    memory: Option<Memory>,
    /// Per-instruction timing, when [`CudaBackend::measure`] turned it on.
    timing: Option<Timing>,
    /// The NCCL communicator of the plan's collective launches, once joined (`collectives.rs`).
    collectives: collectives::Joined,
}

fn driver_error(what: &str) -> impl Fn(cudarc::driver::DriverError) -> BackendError + '_ {
    move |error| CudaError::driver(what, error).into()
}

/// An allocation failure: out of memory, or the driver's other error as it is.
fn allocation_error(what: &'static str, bytes: u64) -> impl Fn(cudarc::driver::DriverError) -> BackendError {
    move |error| {
        if error.0 == cudarc::driver::sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            BackendError::OutOfMemory { what, bytes }
        } else {
            CudaError::driver(format!("allocating {bytes} bytes for the {what}"), error).into()
        }
    }
}

impl CudaBackend {
    /// Opens device `ordinal`: probes the libraries, creates the context and the streams, and
    /// compiles every kernel of [`memo_kernels::SOURCES`] for the device's compute capability,
    /// the attention kernels in the variant [`ATTENTION_VARIABLE`] names (default: baseline).
    /// A missing library or device is [`BackendError::Unavailable`], never a panic.
    pub fn new(ordinal: usize) -> Result<Self, BackendError> {
        Self::with_attention(ordinal, None)
    }

    /// [`CudaBackend::new`] with attention run as `attention` says (`None`: as
    /// [`ATTENTION_VARIABLE`] says). Under a cuDNN choice, cuDNN is probed after the device is
    /// open: missing, older than 9, or failing `cudnnCreate` gives one line on stderr saying why
    /// and our kernels (baseline); otherwise one line names the version and the forward's form
    /// (fused from cuDNN 9.21, else composite).
    pub fn with_attention(ordinal: usize, attention: Option<AttentionChoice>) -> Result<Self, BackendError> {
        let attention = match attention {
            Some(choice) => choice,
            None => attention_choice(std::env::var(ATTENTION_VARIABLE).ok().as_deref())?,
        };
        let variant = match attention {
            AttentionChoice::Kernels(variant) => variant,
            AttentionChoice::Cudnn { .. } => AttentionVariant::default(),
        };
        probe::libraries()?;
        let count = CudaContext::device_count().map_err(|error| {
            BackendError::Unavailable(format!(
                "device {ordinal}: the NVIDIA driver library loads but reports no usable device ({error}); check \
                 `nvidia-smi` and CUDA_VISIBLE_DEVICES"
            ))
        })?;
        let count = usize::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(BackendError::Unavailable(format!(
                "device {ordinal}: the driver reports {count} NVIDIA device(s); pick an ordinal below {count}"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| BackendError::Unavailable(format!("device {ordinal}: cannot create a CUDA context: {e}")))?;
        // Safety: called before any allocation or stream exists, so no tracked slice or pending
        // event is affected; the plan's events order every access (the contract of the unsafe
        // `Backend::launch` and `Backend::copy`, which a checked plan meets).
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(driver_error("compute capability"))?;
        let sm = u32::try_from(major * 10 + minor).unwrap_or(0);
        let device_name = ctx.name().unwrap_or_else(|_| "unknown NVIDIA GPU".into());
        let mut streams = Vec::with_capacity(Stream::ALL.len());
        let mut blas = Vec::with_capacity(Stream::ALL.len());
        for stream in Stream::ALL {
            let created = ctx.new_stream().map_err(driver_error(stream.name()))?;
            blas.push(
                CudaBlas::new(created.clone())
                    .map_err(|e| CudaError::Cublas {
                        what: format!("a handle for the {} stream", stream.name()),
                        status: e.to_string(),
                    })
                    .map_err(BackendError::from)?,
            );
            streams.push(created);
        }
        let functions = compile::kernels(&ctx, sm, variant)?;
        let nvrtc = compile::nvrtc_version().map_or("NVRTC".to_string(), |(a, b)| format!("NVRTC {a}.{b}"));
        let status = streams[0].alloc_zeros::<u32>(STATUS_WORDS).map_err(driver_error("status words"))?;
        ctx.synchronize().map_err(driver_error("initialisation"))?;
        let (cudnn, attention_note) = match attention {
            AttentionChoice::Kernels(variant) => (None, format!("our attention kernels ({})", variant.name())),
            AttentionChoice::Cudnn { deterministic } => {
                ctx.bind_to_thread().map_err(driver_error("making the context current"))?;
                match Cudnn::open(streams[Stream::Compute.index()].cu_stream() as cudarc::cudnn::sys::cudaStream_t) {
                    Ok(cudnn) => {
                        let note = format!(
                            "cuDNN {} {} forward, {} backward",
                            version_text(cudnn.version),
                            if cudnn.fused { "fused" } else { "composite" },
                            if deterministic { "deterministic" } else { "atomic-dQ" }
                        );
                        (Some(cudnn), note)
                    }
                    Err(why) => (None, format!("our attention kernels ({}): {why}", variant.name())),
                }
            }
        };
        eprintln!("attention: {attention_note}");
        Ok(CudaBackend {
            cudnn,
            ordinal,
            attention,
            variant,
            attention_note,
            device_name,
            nvrtc,
            sm,
            ctx,
            streams,
            blas,
            functions,
            status,
            scratch: Stream::ALL.iter().map(|_| None).collect(),
            events: Vec::new(),
            memory: None,
            timing: None,
            collectives: Default::default(),
        })
    }

    /// Measure every launch and copy with CUDA events ([`Backend::timings`]): two timing events
    /// per instruction, read at synchronize. Off by default (events cost a little).
    pub fn measure(mut self) -> Self {
        self.timing = Some(Timing::default());
        self
    }

    /// Records a timing event on `stream` when measuring.
    fn mark(&mut self, stream: Stream) -> Result<Option<usize>, BackendError> {
        match self.timing.as_mut() {
            Some(timing) => timing.mark(&self.ctx, &self.streams[stream.index()]).map(Some),
            None => Ok(None),
        }
    }

    /// Notes an instruction's start and end marks.
    fn note(&mut self, instruction: usize, start: Option<usize>, end: Option<usize>) {
        if let (Some(timing), Some(start), Some(end)) = (self.timing.as_mut(), start, end) {
            timing.span(instruction, start, end);
        }
    }

    /// The device, its compute capability, the compiler of the kernels and the attention
    /// variant, for logs.
    pub fn describe(&self) -> String {
        format!(
            "{} (sm_{}), kernels compiled by {}, attention: {}",
            self.name(),
            self.sm,
            self.nvrtc,
            self.attention_note
        )
    }

    /// The device's compute capability as `major * 10 + minor` (90 for an H100 or H200).
    pub fn compute_capability(&self) -> u32 {
        self.sm
    }

    /// Joins the NCCL communicator of `id` as `rank` of `world_size` on this backend's device
    /// (its context made current on the calling thread first), waiting at most `timeout` for
    /// every rank (`memo_nccl::Communicator::init`). Drop the communicator before the backend:
    /// it lives in this device's context.
    pub fn join_collectives(
        &self,
        nccl: &crate::nccl::Nccl,
        id: &crate::nccl::UniqueId,
        world_size: usize,
        rank: usize,
        timeout: std::time::Duration,
    ) -> Result<crate::nccl::Communicator, BackendError> {
        self.bind()?;
        crate::nccl::Communicator::init(nccl, id, world_size, rank, timeout).map_err(BackendError::from)
    }

    /// Makes the context current on the calling thread: the backend is `Send`, and the raw
    /// driver calls (copies, memsets) use the thread's current context.
    fn bind(&self) -> Result<(), BackendError> {
        self.ctx.bind_to_thread().map_err(driver_error("making the context current"))
    }

    fn memory(&self) -> Result<&Memory, BackendError> {
        self.memory
            .as_ref()
            .ok_or_else(|| BackendError::Other(format!("{}: no memory yet: call allocate", self.name())))
    }

    /// The device address of `span`, after checking it lies inside its space.
    fn address(&self, span: Span) -> Result<u64, BackendError> {
        let memory = self.memory()?;
        let (base, size) = match span.space {
            Space::Device => {
                let (pointer, _sync) = memory.arena.device_ptr(&self.streams[0]);
                (pointer, memory.arena_bytes)
            }
            Space::Host => (memory.host_address as u64, memory.host_bytes),
        };
        match span.offset.checked_add(span.len) {
            Some(end) if end <= size => Ok(base + span.offset),
            _ => Err(BackendError::OutOfBounds { span, size }),
        }
    }

    fn stream(&self, stream: Stream) -> &Arc<CudaStream> {
        &self.streams[stream.index()]
    }

    fn event(&self, instruction: usize, event: EventId) -> Result<&CudaEvent, BackendError> {
        self.events.get(event.0 as usize).ok_or_else(|| BackendError::Kernel {
            instruction,
            message: format!("event {} is beyond the {} allocated events", event.0 as usize, self.events.len()),
        })
    }

    /// How attention runs now: the line printed at construction, or the fallback's.
    pub fn attention(&self) -> &str {
        &self.attention_note
    }

    /// Leaves cuDNN for our kernels for the rest of the run, with one line saying why.
    fn leave_cudnn(&mut self, why: &str) {
        self.cudnn = None;
        self.attention_note = format!("our attention kernels ({}): {why}", self.variant.name());
        eprintln!("attention: {}", self.attention_note);
    }

    /// The cuDNN plan for `pass` on `shape` (built and cached now): the pass and the shape that
    /// built (a fused forward that does not build falls back to the composite one; statistics
    /// the plan's token-major view cuDNN refuses fall back to its head-major layout with a
    /// transpose each launch; each with one line) and the plan's workspace. A pass a version
    /// rule refuses at this shape ([`refusal`]) is `None` with cuDNN kept for the other launches
    /// (those launches run on our kernels; one line per reason, added to
    /// [`CudaBackend::attention`]). Any other failure leaves cuDNN
    /// ([`CudaBackend::leave_cudnn`]) and is `None`.
    fn cudnn_workspace(&mut self, pass: Pass, shape: &Shape) -> Option<(Pass, Shape, u64)> {
        let cudnn = self.cudnn.as_mut()?;
        let why = match cudnn.plan_for(pass, shape) {
            Ok((plan, built)) => return Some((pass, built, plan.workspace)),
            Err(why) => why,
        };
        // A version rule refuses this pass at this shape only (a known-bad backward, or one the
        // frontend runs with a padding workaround we do not build): those launches run on our
        // kernels, cuDNN keeps the others; said once per reason, and in `attention()`.
        if let Some(reason) = refusal(cudnn.version, pass, shape) {
            let line = format!(
                "our kernels for the {pass:?} launches cuDNN {} refuses: {reason}",
                version_text(cudnn.version)
            );
            if !self.attention_note.contains(&line) {
                eprintln!("attention: {line}");
                self.attention_note = format!("{}; {line}", self.attention_note);
            }
            return None;
        }
        if pass == (Pass::Forward { fused: true }) {
            eprintln!(
                "attention: cuDNN {}: the fused forward did not build ({why}); the composite forward runs instead",
                version_text(cudnn.version)
            );
            cudnn.fused = false;
            return self.cudnn_workspace(Pass::Forward { fused: false }, shape);
        }
        self.leave_cudnn(&format!("cuDNN could not build the attention plan for {shape:?}: {why}"));
        None
    }

    /// The pass of an attention launch of `geometry` under the current choice, and how its K/V
    /// heads are shown to cuDNN ([`attention::key_value_view`]: the graph shape, the offset into
    /// the K/V rows, whether dk and dv are zeroed first).
    fn cudnn_pass(&self, op: Op, geometry: &AttentionShape) -> Result<(Pass, KeyValueView), CudaError> {
        let view = attention::key_value_view(geometry)?;
        let deterministic = matches!(self.attention, AttentionChoice::Cudnn { deterministic: true });
        let pass = match op {
            Op::Attention => Pass::Forward { fused: self.cudnn.as_ref().is_some_and(|c| c.fused) },
            _ => Pass::Backward(if deterministic { BackwardForm::Deterministic } else { BackwardForm::Accumulate }),
        };
        Ok((pass, view))
    }

    /// What attention launch `op` of `geometry` needs on the device besides its arguments, for
    /// the planner: on the cuDNN path, the rotated q and k, the backward's dQ accumulator and
    /// softmax sums, and the execution plan's workspace (the plan is built now, and cached for
    /// the run); nothing when our kernels run attention (they need no scratch). Building the
    /// plan may leave cuDNN (one line), after which this answers for our kernels.
    pub fn attention_scratch(&mut self, op: Op, geometry: &AttentionShape) -> Result<AttentionScratch, BackendError> {
        if !matches!(op, Op::Attention | Op::AttentionBackward) || self.cudnn.is_none() {
            return Ok(AttentionScratch::default());
        }
        self.bind()?;
        let (pass, view) = match self.cudnn_pass(op, geometry) {
            Ok(found) => found,
            Err(why) => {
                self.leave_cudnn(&format!("cuDNN cannot describe this attention launch: {why}"));
                return Ok(AttentionScratch::default());
            }
        };
        let Some((pass, built, workspace)) = self.cudnn_workspace(pass, &view.shape) else {
            return Ok(AttentionScratch::default());
        };
        let deterministic = pass == Pass::Backward(BackwardForm::Deterministic);
        let head_major = built.stats == StatsLayout::HeadMajor;
        Ok(attention::scratch(op, geometry, deterministic, head_major, workspace))
    }

    /// The scratch sizer to plan `model` at `tensor`-way parallelism with, before planning
    /// (`spec/backends.md`): the recipes' scratch, and each attention launch's
    /// [`CudaBackend::attention_scratch`] (which builds the cuDNN plans now, cached for the run).
    /// A plan made with it carries every launch's scratch, so [`Backend::memory`]'s
    /// `scratch_bytes` stays 0.
    pub fn cuda_scratch_sizer(
        &mut self,
        model: &memo_plan_core::model::ModelConfig,
        tensor: u64,
    ) -> Result<crate::CudaScratch, BackendError> {
        let mut sizer = crate::CudaScratch::default();
        for (op, geometry) in crate::CudaScratch::attention_geometries(model, tensor) {
            let bytes = self.attention_scratch(op, &geometry)?.layout().1;
            if bytes > 0 {
                sizer = sizer.with_attention(op, geometry, bytes);
            }
        }
        Ok(sizer)
    }

    /// Runs an attention launch on cuDNN: rotates q and k into the scratch (`memo_rope`), runs
    /// the forward or backward plan, and (backward) rotates dq and dk back in place. `Ok(false)`:
    /// our kernels run the launch (cuDNN was left, or refuses this launch's shape by a version
    /// rule).
    ///
    /// # Safety
    /// The contract of [`Backend::launch`]: the plan orders every access of the arguments.
    unsafe fn launch_cudnn(
        &mut self,
        instruction: usize,
        stream: Stream,
        op: Op,
        spans: &[(CUdeviceptr, u64)],
        shapes: &[ArgShape],
        context: &KernelContext,
    ) -> Result<bool, BackendError> {
        let kernel_error = |message: String| BackendError::Kernel { instruction, message };
        let geometry = memo_kernels::attention_shape(op, shapes, context).map_err(|e| kernel_error(e.to_string()))?;
        if geometry.sequences == 0 || geometry.seq_len == 0 {
            return Ok(true);
        }
        let (pass, view) = match self.cudnn_pass(op, &geometry) {
            Ok(found) => found,
            Err(why) => {
                self.leave_cudnn(&format!("cuDNN cannot describe this attention launch: {why}"));
                return Ok(false);
            }
        };
        let Some((pass, shape, workspace)) = self.cudnn_workspace(pass, &view.shape) else { return Ok(false) };
        let deterministic = pass == Pass::Backward(BackwardForm::Deterministic);
        let head_major = shape.stats == StatsLayout::HeadMajor;
        let needs = attention::scratch(op, &geometry, deterministic, head_major, workspace);
        let ([rotated_q, rotated_k, accumulator, sums, statistics, work], total) = needs.layout();
        // The plan's scratch for this launch; a plan made without the backend's sizer: the
        // stream's scratch, grown on demand like the kernels' partial sums.
        let (base, total) = match crate::scratch::source(op, spans, total) {
            Ok(crate::scratch::Source::Plan(base, len)) => (base, len),
            Ok(crate::scratch::Source::None) => (0, 0),
            // No scratch in the plan, or less than this cuDNN plan needs (its engine, and so its
            // workspace, is chosen again at run time and may differ from what was asked before
            // planning): the stream's, counted in `memory().scratch_bytes`, rather than failing
            // the run.
            Ok(crate::scratch::Source::Stream) | Err(_) => (self.ensure_scratch(stream, total)?, total),
        };
        let status = self.status.device_ptr(&self.streams[0]).0;
        let resolved = Resolved {
            args: spans,
            scratch: Some((base, total)),
            status,
            instruction: u32::try_from(instruction).unwrap_or(u32::MAX),
        };
        let cuda_stream = self.streams[stream.index()].clone();
        let run = |step: &memo_kernels::Step, backend: &Self| {
            exec::run_step(step, &resolved, &backend.functions, &cuda_stream, &backend.blas[stream.index()])
                .map_err(|message| kernel_error(format!("op `{}` (cuDNN path): {message}", op.name())))
        };
        let ptr = |arg: usize| Param::Ptr { arg, byte_offset: 0 };
        // k and dk hold `kv_heads` heads a row (every K/V head of the model when replicated):
        // rotated (and rotated back) as rows of that many heads.
        let kv_geometry = AttentionShape { heads: geometry.kv_heads, ..geometry };
        run(&rope_step(ptr(0), Param::Scratch { byte_offset: rotated_q }, &geometry, false, context.rope_theta), self)?;
        run(
            &rope_step(ptr(1), Param::Scratch { byte_offset: rotated_k }, &kv_geometry, false, context.rope_theta),
            self,
        )?;
        let address =
            |arg: usize| spans.get(arg).map(|s| s.0).ok_or_else(|| kernel_error(format!("no argument {arg}")));
        // The one K/V head cuDNN sees when K and V are replicated starts this far into each row.
        let kv_offset = view.offset * 2;
        let stats = Param::Scratch { byte_offset: statistics };
        if head_major && op == Op::AttentionBackward {
            run(&lse_transpose_step(ptr(4), stats, &geometry, true), self)?;
        }
        let mut pointers = vec![
            (uid::Q, base + rotated_q),
            (uid::K, base + rotated_k + kv_offset),
            (uid::V, address(2)? + kv_offset),
            (uid::O, address(3)?),
            (uid::STATS, if head_major { base + statistics } else { address(4)? }),
        ];
        if op == Op::AttentionBackward {
            pointers.extend([
                (uid::DO, address(5)?),
                (uid::DQ, address(6)?),
                (uid::DK, address(7)? + kv_offset),
                (uid::DV, address(8)? + kv_offset),
                (uid::SOFTMAX_SUM, base + sums),
            ]);
            if view.zero_gradients {
                // The graph writes the columns of its one K/V head only: the other heads' columns
                // of dk and dv (no query head of this launch uses them) are zeroed first, whole
                // buffers, on the launch stream.
                let bytes = geometry
                    .sequences
                    .saturating_mul(geometry.seq_len)
                    .saturating_mul(geometry.kv_heads)
                    .saturating_mul(geometry.head_dim)
                    .saturating_mul(2);
                for arg in [7, 8] {
                    let (pointer, len) = spans[arg];
                    let bytes = usize::try_from(bytes).ok().filter(|&b| b as u64 <= len).ok_or_else(|| {
                        kernel_error(format!("argument {arg}: {bytes} bytes of K/V gradient in {len}"))
                    })?;
                    // Safety: `bytes` lie inside argument `arg`'s span (checked just above); the
                    // stream orders this memset before the plan that writes the used head.
                    unsafe { cudarc::driver::result::memset_d8_async(pointer, 0, bytes, cuda_stream.cu_stream()) }
                        .map_err(|e| kernel_error(format!("zeroing the unused K/V heads' gradients: {e}")))?;
                }
            }
            if !deterministic {
                pointers.push((uid::DQ_ACCUM, base + accumulator));
                let bytes = usize::try_from(needs.dq_accumulator)
                    .map_err(|_| kernel_error("dQ accumulator above usize".into()))?;
                // Safety: `bytes` from `accumulator` lie inside the scratch just ensured; the
                // stream orders this memset before the plan that accumulates into them.
                unsafe {
                    cudarc::driver::result::memset_d8_async(base + accumulator, 0, bytes, cuda_stream.cu_stream())
                }
                .map_err(|e| kernel_error(format!("zeroing the dQ accumulator: {e}")))?;
            }
        }
        let scale = 1.0 / (geometry.head_dim as f32).sqrt();
        let cudnn = self.cudnn.as_mut().ok_or_else(|| kernel_error("cuDNN vanished".into()))?;
        cudnn.set_stream(cuda_stream.cu_stream() as cudarc::cudnn::sys::cudaStream_t).map_err(|e| e.at(instruction))?;
        let handle = cudnn.handle();
        let fill = cudnn.mask_fill();
        let plan = cudnn.plan(pass, &shape).map_err(|e| e.at(instruction))?;
        // Safety: every pointer addresses the extent its tensor spans: q, k (rotated) and the
        // accumulator, sums and workspace in the scratch laid out above for this shape; v, o,
        // lse, dout, dq, dk, dv are the launch's arguments, bounds-checked spans whose rows the
        // op table checked (`rows * heads * head_dim` bf16 for q, o, dout, dq, `rows * kv_heads *
        // head_dim` for k, v, dk, dv, `rows * heads` f32); k, v, dk, dv from `kv_offset`, which
        // `key_value_view` keeps one head short of a row's end (h_kv = 1 then); the stream
        // orders the rotations before and the rotations back after; the plan orders the rest.
        unsafe { plan.execute(handle, &pointers, base + work, scale, fill) }.map_err(|e| e.at(instruction))?;
        if head_major && op == Op::Attention {
            run(&lse_transpose_step(stats, ptr(4), &geometry, false), self)?;
        }
        if op == Op::AttentionBackward {
            run(&rope_step(ptr(6), ptr(6), &geometry, true, context.rope_theta), self)?;
            run(&rope_step(ptr(7), ptr(7), &kv_geometry, true, context.rope_theta), self)?;
        }
        Ok(true)
    }

    /// The scratch of one launch that needs `needed` bytes: the plan's, its argument past `op`'s
    /// signature (`spec/plan-format.md`, "Launch scratch"), when it has one; else (a plan made
    /// without [`crate::CudaScratch`]) the stream's scratch memory grown on demand, outside the
    /// arena. `Err` (the message) when the plan's is smaller than `needed`.
    fn launch_scratch(
        &mut self,
        stream: Stream,
        op: Op,
        spans: &[(CUdeviceptr, u64)],
        needed: u64,
    ) -> Result<Option<(CUdeviceptr, u64)>, String> {
        match crate::scratch::source(op, spans, needed)? {
            crate::scratch::Source::None => Ok(None),
            crate::scratch::Source::Plan(base, len) => Ok(Some((base, len))),
            crate::scratch::Source::Stream => {
                self.ensure_scratch(stream, needed).map(|base| Some((base, needed))).map_err(|e| e.to_string())
            }
        }
    }

    /// Grows the scratch memory of `stream` to `bytes` (waits for the device first: the old
    /// scratch may still be in use by enqueued kernels).
    fn ensure_scratch(&mut self, stream: Stream, bytes: u64) -> Result<CUdeviceptr, BackendError> {
        let index = stream.index();
        let have = self.scratch[index].as_ref().map_or(0, |s| s.len() as u64);
        if have < bytes.max(1) {
            self.ctx.synchronize().map_err(driver_error("waiting before growing the scratch memory"))?;
            let grown = bytes.max(have.saturating_mul(2)).max(1 << 20);
            let len =
                usize::try_from(grown).map_err(|_| BackendError::OutOfMemory { what: "scratch", bytes: grown })?;
            self.scratch[index] = None;
            // Safety: the scratch is written by the kernels before they read it (each recipe's
            // first step writes what its later steps read), so its initial contents never matter.
            let slice =
                unsafe { self.streams[index].alloc::<u8>(len) }.map_err(allocation_error("kernel scratch", grown))?;
            self.scratch[index] = Some(slice);
        }
        let scratch = self.scratch[index].as_ref().ok_or_else(|| BackendError::Other("scratch vanished".into()))?;
        let (pointer, _sync) = scratch.device_ptr(&self.streams[index]);
        Ok(pointer)
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.device_name)
    }

    fn allocate(&mut self, arena_bytes: u64, host_bytes: u64, events: u32) -> Result<(), BackendError> {
        self.bind()?;
        self.ctx.synchronize().map_err(driver_error("waiting before allocation"))?;
        self.memory = None;
        self.events.clear();
        let arena_len = usize::try_from(arena_bytes.max(1))
            .map_err(|_| BackendError::OutOfMemory { what: "device arena", bytes: arena_bytes })?;
        let host_len = usize::try_from(host_bytes.max(1))
            .ok()
            .filter(|&len| len < isize::MAX as usize)
            .ok_or(BackendError::OutOfMemory { what: "pinned host slab", bytes: host_bytes })?;
        // Safety: the arena is zeroed below, before any use.
        let arena =
            unsafe { self.streams[0].alloc::<u8>(arena_len) }.map_err(allocation_error("device arena", arena_bytes))?;
        // Safety: flags 0 = page-locked, not write-combined, not mapped; the slab is zeroed
        // below before any use.
        let mut host = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(host_len, 0) }
            .map_err(allocation_error("pinned host slab", host_bytes))?;
        let host_address = host.as_mut_ptr().map_err(driver_error("pinned host slab"))? as usize;
        {
            let (pointer, _sync) = arena.device_ptr(&self.streams[0]);
            // Safety: `pointer` is the start of `arena_len` freshly allocated device bytes.
            unsafe { cudarc::driver::result::memset_d8_async(pointer, 0, arena_len, self.streams[0].cu_stream()) }
                .map_err(driver_error("zeroing the arena"))?;
        }
        // Safety: `host_address` is the start of `host_len` page-locked bytes no GPU work uses yet.
        unsafe { std::ptr::write_bytes(host_address as *mut u8, 0, host_len) };
        for _ in 0..events {
            let event =
                self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(driver_error("event"))?;
            self.events.push(event);
        }
        self.ctx.synchronize().map_err(driver_error("allocation"))?;
        self.memory = Some(Memory { arena, arena_bytes, _host: host, host_address, host_bytes });
        Ok(())
    }

    fn upload(&mut self, span: Span, bytes: &[u8]) -> Result<(), BackendError> {
        self.bind()?;
        if bytes.len() as u64 != span.len {
            return Err(BackendError::Other(format!("upload of {} bytes into a span of {}", bytes.len(), span.len)));
        }
        let address = self.address(span)?;
        self.ctx.synchronize().map_err(driver_error("waiting before an upload"))?;
        match span.space {
            Space::Device => {
                // Safety: `address` starts `span.len` bytes inside the arena (checked), and every
                // stream is idle.
                unsafe { cudarc::driver::result::memcpy_htod_sync(address, bytes) }.map_err(driver_error("upload"))?;
                // From pageable memory the call may return before the DMA lands, and the streams
                // are non-blocking (they do not wait for it): wait here.
                self.ctx.synchronize().map_err(driver_error("upload"))?;
            }
            // Safety: `address` starts `span.len` bytes inside the slab (checked); no GPU work is
            // pending.
            Space::Host => unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), address as *mut u8, bytes.len()) },
        }
        Ok(())
    }

    fn download(&mut self, span: Span) -> Result<Vec<u8>, BackendError> {
        self.bind()?;
        let address = self.address(span)?;
        let len =
            usize::try_from(span.len).map_err(|_| BackendError::OutOfMemory { what: "download", bytes: span.len })?;
        self.ctx.synchronize().map_err(driver_error("waiting before a download"))?;
        let mut out = vec![0u8; len];
        match span.space {
            // Safety: `address` starts `len` bytes inside the arena (checked); streams are idle.
            Space::Device => unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut out, address) }
                .map_err(driver_error("download"))?,
            // Safety: as above, inside the slab.
            Space::Host => unsafe { std::ptr::copy_nonoverlapping(address as *const u8, out.as_mut_ptr(), len) },
        }
        Ok(out)
    }

    unsafe fn launch(
        &mut self,
        instruction: usize,
        stream: Stream,
        op: Op,
        args: &[KernelArg],
        context: &KernelContext,
    ) -> Result<(), BackendError> {
        self.bind()?;
        let kernel_error = |message: String| BackendError::Kernel { instruction, message };
        let mut spans = Vec::with_capacity(args.len());
        for (index, arg) in args.iter().enumerate() {
            if arg.span.space != Space::Device {
                let name = op.signature().get(index).map_or("?", |(name, _)| *name);
                return Err(kernel_error(format!(
                    "op `{}`: argument `{name}` is in the host slab; kernels read device memory only (the plan is \
                     wrong)",
                    op.name()
                )));
            }
            spans.push((self.address(arg.span)?, arg.span.len));
        }
        // The tensor-parallel group's collectives run on NCCL; context parallelism's (the data
        // group's sums, the ring) have no communicator here yet and go on to the kernel table,
        // which refuses them by name.
        let collective = memo_runtime::collective::Collective::of_op(op).filter(|_| !op.is_context_parallel());
        if let Some(collective) = collective {
            // Safety: this method's own contract, passed on.
            return unsafe { self.launch_collective(instruction, stream, op, collective, &spans) };
        }
        // The signature's arguments; one past them is the launch's scratch.
        let shapes: Vec<ArgShape> = args
            .iter()
            .take(op.signature().len())
            .map(|a| ArgShape { first_row: a.first_row, rows: a.rows, row_bytes: a.row_bytes })
            .collect();
        if matches!(op, Op::Attention | Op::AttentionBackward) && self.cudnn.is_some() {
            let start = self.mark(stream)?;
            // Safety: this function's own contract (the plan orders the accesses), passed on.
            let ran = unsafe { self.launch_cudnn(instruction, stream, op, &spans, &shapes, context) }?;
            if ran {
                let end = self.mark(stream)?;
                self.note(instruction, start, end);
                return Ok(());
            }
        }
        let steps = launch_steps(op, &shapes, context).map_err(|e| kernel_error(e.to_string()))?;
        let scratch = self.launch_scratch(stream, op, &spans, scratch_bytes(&steps)).map_err(kernel_error)?;
        let status = self.status.device_ptr(&self.streams[0]).0;
        let resolved =
            Resolved { args: &spans, scratch, status, instruction: u32::try_from(instruction).unwrap_or(u32::MAX) };
        let cuda_stream = self.streams[stream.index()].clone();
        let start = self.mark(stream)?;
        for step in &steps {
            exec::run_step(step, &resolved, &self.functions, &cuda_stream, &self.blas[stream.index()])
                .map_err(|message| kernel_error(format!("op `{}`: {message}", op.name())))?;
        }
        let end = self.mark(stream)?;
        self.note(instruction, start, end);
        Ok(())
    }

    unsafe fn copy(&mut self, instruction: usize, stream: Stream, src: Span, dst: Span) -> Result<(), BackendError> {
        self.bind()?;
        if src.len != dst.len {
            return Err(BackendError::Kernel {
                instruction,
                message: format!("copy of {} bytes into {} bytes", src.len, dst.len),
            });
        }
        let (from, to) = (self.address(src)?, self.address(dst)?);
        let len = usize::try_from(src.len).map_err(|_| BackendError::OutOfBounds { span: src, size: 0 })?;
        if len == 0 {
            return Ok(());
        }
        let start = self.mark(stream)?;
        let cu_stream = self.stream(stream).cu_stream();
        let failed = |e| BackendError::Kernel { instruction, message: format!("copy: {e}") };
        // Why the copies below are sound: both ranges lie inside their allocations (checked by
        // `address`); the plan's events order this copy against every other access of those bytes
        // (the contract of this unsafe method), and the host slab is page-locked, so the copy is
        // truly asynchronous and stays valid until the stream passes it.
        match (src.space, dst.space) {
            // Safety: as said above the match.
            (Space::Device, Space::Host) => unsafe {
                cudarc::driver::sys::cuMemcpyDtoHAsync_v2(to as *mut std::ffi::c_void, from, len, cu_stream).result()
            }
            .map_err(failed)?,
            // Safety: as said above the match.
            (Space::Host, Space::Device) => unsafe {
                cudarc::driver::sys::cuMemcpyHtoDAsync_v2(to, from as *const std::ffi::c_void, len, cu_stream).result()
            }
            .map_err(failed)?,
            (Space::Device, Space::Device) => {
                // Safety: as said above the match.
                unsafe { cudarc::driver::result::memcpy_dtod_async(to, from, len, cu_stream) }.map_err(failed)?
            }
            (Space::Host, Space::Host) => {
                return Err(BackendError::Kernel {
                    instruction,
                    message: "a host-to-host copy: plans copy between the arena and the host slab only".into(),
                })
            }
        }
        let end = self.mark(stream)?;
        self.note(instruction, start, end);
        Ok(())
    }

    fn record(&mut self, instruction: usize, stream: Stream, event: EventId) -> Result<(), BackendError> {
        let cuda_event = self.event(instruction, event)?;
        cuda_event
            .record(self.stream(stream))
            .map_err(|e| BackendError::Kernel { instruction, message: format!("recording an event: {e}") })
    }

    fn wait(&mut self, instruction: usize, stream: Stream, event: EventId) -> Result<(), BackendError> {
        let cuda_event = self.event(instruction, event)?;
        self.stream(stream)
            .wait(cuda_event)
            .map_err(|e| BackendError::Kernel { instruction, message: format!("waiting on an event: {e}") })
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.bind()?;
        self.settle_collectives()?;
        for (stream, cuda_stream) in Stream::ALL.iter().zip(&self.streams) {
            cuda_stream.synchronize().map_err(|e| {
                BackendError::from(CudaError::driver(format!("{}: the {} stream", self.name(), stream.name()), e))
            })?;
        }
        self.ctx.check_err().map_err(driver_error("an earlier asynchronous call"))?;
        if let Some(timing) = self.timing.as_mut() {
            timing.finish_step()?;
        }
        let mut words = [0u32; STATUS_WORDS];
        let (status, _sync) = self.status.device_ptr(&self.streams[0]);
        // Safety: `status` holds STATUS_WORDS u32 and every stream is idle.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut words, status) }
            .map_err(driver_error("status words"))?;
        if let Some((instruction, message)) = status_error(words) {
            // Safety: as above; cleared so the next step starts clean.
            unsafe { cudarc::driver::result::memset_d8_sync(status, 0, STATUS_WORDS * 4) }
                .map_err(driver_error("status words"))?;
            // A "synchronous" memset of device memory may return early, and the streams are
            // non-blocking (unordered with it): wait before any kernel can report again.
            self.ctx.synchronize().map_err(driver_error("status words"))?;
            return Err(BackendError::Kernel { instruction, message });
        }
        Ok(())
    }

    fn timings(&mut self) -> Option<Vec<(usize, f64, f64)>> {
        self.timing.as_ref().map(Timing::last)
    }

    fn scratch_sizer(
        &mut self,
        model: &memo_plan_core::model::ModelConfig,
        tensor: u64,
    ) -> Result<Box<dyn memo_plan_core::plan::scratch::ScratchSizer>, BackendError> {
        Ok(Box::new(self.cuda_scratch_sizer(model, tensor)?))
    }

    fn memory(&self) -> MemoryReport {
        self.memory
            .as_ref()
            .map(|m| MemoryReport {
                device_bytes: m.arena_bytes,
                host_bytes: m.host_bytes,
                scratch_bytes: self.scratch.iter().flatten().map(|s| s.len() as u64).sum(),
            })
            .unwrap_or_default()
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.bind();
        self.release_collectives();
        // Enqueued work may still use the arena, the slab or the scratch: wait before they are
        // freed. An error here has nowhere to go (the next context reports it).
        if self.ctx.synchronize().is_err() {
            // After a device fault the context is broken and cuBLAS's handle destruction fails,
            // which cudarc's `Drop for CudaBlas` unwraps (a panic, an abort while unwinding):
            // leak the handles instead; the process's context goes with them.
            for blas in self.blas.drain(..) {
                std::mem::forget(blas);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attention_variable_names_a_choice_or_is_refused() {
        assert_eq!(attention_choice(None).unwrap(), AttentionChoice::Cudnn { deterministic: false });
        assert_eq!(attention_choice(Some("")).unwrap(), AttentionChoice::Cudnn { deterministic: false });
        assert_eq!(
            attention_choice(Some("cudnn-deterministic")).unwrap(),
            AttentionChoice::Cudnn { deterministic: true }
        );
        assert_eq!(attention_choice(Some("baseline")).unwrap(), AttentionChoice::Kernels(AttentionVariant::Baseline));
        assert_eq!(attention_choice(Some("pipelined")).unwrap(), AttentionChoice::Kernels(AttentionVariant::Pipelined));
        let error = attention_choice(Some("fast")).unwrap_err().to_string();
        assert!(
            error.contains("MEMO_CUDA_ATTENTION=fast")
                && error.contains("cudnn, cudnn-deterministic, baseline, pipelined"),
            "{error}"
        );
    }
}
