//! The CPU backend: the device arena and the pinned host slab are host allocations, each stream is
//! a thread executing its commands in order, events are real (a flag and a condition variable).
//! Copies can be throttled to a bandwidth so that swap overlap is exercised for real.
//!
//! Memory is shared by the four stream threads through raw pointers. What makes that sound is the
//! contract of the unsafe [`Backend::launch`] and [`Backend::copy`]: any two accesses to
//! overlapping bytes, one of them a write, are ordered by stream order and events (the checked
//! plan that [`memo_runtime::Replay`] replays proves it), and this backend honours stream order
//! and events, refusing an event it did not allocate rather than passing a wait on it. Inside one
//! launch or copy, arguments that overlap with a write are refused before any slice is made; in
//! checked mode, an access the executed events do not order is refused before it is made.
//!
//! With a group ([`CpuBackend::with_collectives`]) the backend is one rank of a tensor-parallel
//! group: the plan's collective launches (`all_gather`, `reduce_scatter`, `all_reduce_*`) go to
//! the group on the stream the plan puts them on (the collective stream), where they block until
//! every rank has issued them. With a data group ([`CpuBackend::with_data_group`]: the ranks
//! that share its tensor-parallel rank) the context-parallel collectives (`data_all_reduce_*`,
//! `ring_exchange`) go to that one. A stream error aborts every group, so the other ranks'
//! collectives fail rather than wait for this one.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use memo_plan_core::plan::{Access, CollectiveGroup, EventId, Op, Stream};
use memo_runtime::collective::Collective;
use memo_runtime::control::StepControl;
use memo_runtime::{
    Backend, BackendError, CheckReport, Collectives, KernelArg, KernelContext, MemoryReport, Space, Span,
};

use crate::checked::Shadow;
use crate::memory::Memory;
use crate::ops;

/// A command for one stream's thread.
enum Command {
    Launch {
        instruction: usize,
        op: Op,
        args: Vec<KernelArg>,
        context: KernelContext,
    },
    Copy {
        instruction: usize,
        src: Span,
        dst: Span,
    },
    Record {
        instruction: usize,
        event: EventId,
    },
    Wait {
        instruction: usize,
        event: EventId,
    },
    /// Answer on the channel once every earlier command is done.
    Flush(Sender<()>),
}

/// The events of one step, and the first error of any stream.
struct Shared {
    state: Mutex<SharedState>,
    changed: Condvar,
    /// The groups this backend is a rank of: the plan's collectives run on them.
    groups: Groups,
}

/// A rank's groups (`Op::collective_group`): its tensor-parallel group, and the ranks with its
/// tensor-parallel rank (the data and context ranks: the gradients' sums and the ring).
#[derive(Clone, Default)]
struct Groups {
    tensor: Option<Arc<dyn Collectives>>,
    data: Option<Arc<dyn Collectives>>,
}

impl Groups {
    /// The group `op` runs on, if it is a collective and the backend is a rank of that group.
    fn of(&self, op: Op) -> Option<&dyn Collectives> {
        match op.collective_group()? {
            CollectiveGroup::Tensor => self.tensor.as_deref(),
            CollectiveGroup::Data | CollectiveGroup::Ring => self.data.as_deref(),
        }
    }

    /// Marks this rank failed in every group, so that no rank waits for it.
    fn abort(&self, reason: &str) {
        self.tensor.iter().chain(&self.data).for_each(|group| group.abort(reason));
    }
}

struct SharedState {
    recorded: Vec<bool>,
    error: Option<BackendError>,
    /// When timing: the step's start and each instruction's (index, start, end) in seconds.
    timing: Option<(std::time::Instant, Vec<Timing>)>,
    /// The spans of the last synchronised step that ran instructions.
    last_timing: Vec<Timing>,
    /// Told what runs, and asked before each instruction ([`Backend::control`]).
    control: Option<Arc<StepControl>>,
}

/// One measured instruction: (plan index, start, end) in seconds from the step's start.
type Timing = (usize, f64, f64);

impl Shared {
    /// Records the step's first error and wakes every waiting stream; a rank of a group also
    /// aborts the group, so that no other rank waits for its collectives.
    fn fail(&self, error: BackendError) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.groups.abort(&error.to_string());
        state.error.get_or_insert(error);
        self.changed.notify_all();
    }

    /// Whether the step failed, and the control to report to.
    fn failed_and_control(&self) -> (bool, Option<Arc<StepControl>>) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (state.error.is_some(), state.control.clone())
    }
}

struct Worker {
    sender: Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

/// The CPU backend.
pub struct CpuBackend {
    memory: Option<Arc<Memory>>,
    shared: Arc<Shared>,
    workers: Vec<Worker>,
    copy_bytes_per_s: Option<u64>,
    /// Checked mode's shadow state, when on.
    shadow: Option<Arc<Shadow>>,
    /// Whether the stream threads time each instruction ([`CpuBackend::measure`]).
    measuring: bool,
    /// Events of the last allocation: a record or wait of any other is refused.
    events: u32,
}

impl CpuBackend {
    /// A backend whose copies run at full speed.
    pub fn new() -> Self {
        Self::with_copy_bandwidth(None)
    }

    /// A backend whose copies take `bytes / rate` seconds at least, like a host link.
    pub fn with_copy_bandwidth(copy_bytes_per_s: Option<u64>) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(SharedState {
                recorded: Vec::new(),
                error: None,
                timing: None,
                last_timing: Vec::new(),
                control: None,
            }),
            changed: Condvar::new(),
            groups: Groups::default(),
        });
        CpuBackend {
            memory: None,
            shared,
            workers: Vec::new(),
            copy_bytes_per_s,
            shadow: None,
            measuring: false,
            events: 0,
        }
    }

    /// Measure every instruction's start and end ([`Backend::timings`]). Takes effect from the
    /// next [`Backend::allocate`], which starts the stream threads.
    pub fn measure(mut self) -> Self {
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        state.timing = Some((std::time::Instant::now(), Vec::new()));
        drop(state);
        self.measuring = true;
        self
    }

    /// A backend in checked mode (`checked.rs`): every access the executed events do not order
    /// after a conflicting one fails the step with [`BackendError::Unordered`].
    pub fn checked() -> Self {
        let mut backend = Self::new();
        backend.shadow = Some(Arc::new(Shadow::default()));
        backend
    }

    /// Makes this backend rank `group.rank()` of a tensor-parallel group: the plan's collective
    /// launches run on `group` (without one they are refused, as on a single GPU). Call before
    /// [`Backend::allocate`]; it stops any stream threads, so memory must be allocated again.
    pub fn with_collectives(self, group: Arc<dyn Collectives>) -> Self {
        let data = self.shared.groups.data.clone();
        self.with_groups(Groups { tensor: Some(group), data })
    }

    /// Makes this backend rank `group.rank()` of the ranks that share its tensor-parallel rank
    /// (its context rank, with context parallelism: `spec/context-parallel.md`): the plan's
    /// `data_all_reduce_*` and `ring_exchange` run on `group`. As [`CpuBackend::with_collectives`],
    /// call before [`Backend::allocate`].
    pub fn with_data_group(self, group: Arc<dyn Collectives>) -> Self {
        let tensor = self.shared.groups.tensor.clone();
        self.with_groups(Groups { tensor, data: Some(group) })
    }

    fn with_groups(mut self, groups: Groups) -> Self {
        self.stop_workers();
        self.memory = None;
        let (timing, control) = {
            let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            (state.timing.take(), state.control.take())
        };
        self.shared = Arc::new(Shared {
            state: Mutex::new(SharedState {
                recorded: Vec::new(),
                error: None,
                timing,
                last_timing: Vec::new(),
                control,
            }),
            changed: Condvar::new(),
            groups,
        });
        self
    }

    /// The tensor-parallel group this backend is a rank of, if any.
    pub fn collectives(&self) -> Option<&Arc<dyn Collectives>> {
        self.shared.groups.tensor.as_ref()
    }

    fn memory(&self) -> Result<&Arc<Memory>, BackendError> {
        self.memory
            .as_ref()
            .ok_or_else(|| BackendError::Other("the CPU backend has no memory yet: call allocate".into()))
    }

    fn send(&self, stream: Stream, command: Command) -> Result<(), BackendError> {
        let worker = self
            .workers
            .get(stream.index())
            .ok_or_else(|| BackendError::Other("the CPU backend has no streams yet: call allocate".into()))?;
        worker
            .sender
            .send(command)
            .map_err(|_| BackendError::Other(format!("the {} stream's thread has stopped", stream.name())))
    }

    /// Refuses an event this allocation does not have: its flag would not exist, and a wait on it
    /// would order nothing.
    fn known(&self, instruction: usize, event: EventId) -> Result<(), BackendError> {
        if event.0 < self.events {
            return Ok(());
        }
        Err(BackendError::Kernel {
            instruction,
            message: format!("event {} is not one of the {} allocated", event.0, self.events),
        })
    }

    fn stop_workers(&mut self) {
        for worker in self.workers.drain(..) {
            drop(worker.sender);
            if let Some(thread) = worker.thread {
                let _ = thread.join();
            }
        }
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

/// What a stream thread needs.
struct WorkerContext {
    stream: Stream,
    memory: Arc<Memory>,
    shared: Arc<Shared>,
    copy_bytes_per_s: Option<u64>,
    shadow: Option<Arc<Shadow>>,
    /// Time each instruction (only then does a command touch the shared timing state).
    measuring: bool,
}

/// Checked mode: records the access, or fails the step if it is unordered.
fn check_access(context: &WorkerContext, instruction: usize, reads: &[Span], writes: &[Span]) -> bool {
    match &context.shadow {
        Some(shadow) => match shadow.access(context.stream, instruction, reads, writes) {
            Ok(()) => true,
            Err(message) => {
                context.shared.fail(BackendError::Unordered(message));
                false
            }
        },
        None => true,
    }
}

/// The instruction a command runs, if it is one of the plan's.
fn instruction_of(command: &Command) -> Option<usize> {
    match command {
        Command::Launch { instruction, .. }
        | Command::Copy { instruction, .. }
        | Command::Record { instruction, .. }
        | Command::Wait { instruction, .. } => Some(*instruction),
        Command::Flush(_) => None,
    }
}

fn run_worker(receiver: Receiver<Command>, context: WorkerContext) {
    for command in receiver {
        let measured = instruction_of(&command).filter(|_| context.measuring).and_then(|instruction| {
            let state = context.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            state.timing.as_ref().map(|(epoch, _)| (instruction, epoch.elapsed().as_secs_f64()))
        });
        run_command(command, &context);
        if let Some((instruction, start)) = measured {
            let mut state = context.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((epoch, spans)) = state.timing.as_mut() {
                let end = epoch.elapsed().as_secs_f64();
                spans.push((instruction, start, end));
            }
        }
    }
}

fn run_command(command: Command, context: &WorkerContext) {
    let WorkerContext { shared, .. } = context;
    let Some(instruction) = instruction_of(&command) else {
        return execute(command, context);
    };
    let (failed, control) = shared.failed_and_control();
    // After an error, nothing more runs; waits fall through so no thread blocks forever.
    if failed {
        return;
    }
    if let Some(control) = &control {
        // Stopping at this boundary, before the update began (`memo_runtime::control`).
        if !control.may_run(instruction) {
            shared.fail(BackendError::Interrupted);
            return;
        }
        if context.stream == Stream::Compute {
            control.compute_began(instruction);
        }
    }
    execute(command, context);
    if let Some(control) = &control {
        control.finished_one();
    }
}

fn execute(command: Command, context: &WorkerContext) {
    let WorkerContext { memory, shared, copy_bytes_per_s, .. } = context;
    let copy_bytes_per_s = *copy_bytes_per_s;
    {
        match command {
            Command::Flush(done) => {
                let _ = done.send(());
            }
            Command::Launch { instruction, op, args, context: kernel } => {
                let reads: Vec<Span> = args.iter().filter(|a| a.access.reads()).map(|a| a.span).collect();
                let writes: Vec<Span> = args.iter().filter(|a| a.access.writes()).map(|a| a.span).collect();
                if !check_access(context, instruction, &reads, &writes) {
                    return;
                }
                if let Err(message) = launch(memory, op, &args, &kernel, &shared.groups) {
                    shared.fail(BackendError::Kernel { instruction, message });
                }
            }
            Command::Copy { instruction, src, dst } => {
                if !check_access(context, instruction, &[src], &[dst]) {
                    return;
                }
                let started = std::time::Instant::now();
                if let Err(message) = memory.copy(src, dst) {
                    shared.fail(BackendError::Kernel { instruction, message });
                } else if let Some(rate) = copy_bytes_per_s.filter(|&r| r > 0) {
                    let wanted = Duration::from_secs_f64(src.len as f64 / rate as f64);
                    if let Some(rest) = wanted.checked_sub(started.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            }
            Command::Record { event, .. } => {
                if let Some(shadow) = &context.shadow {
                    shadow.record(context.stream, event);
                }
                let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(flag) = state.recorded.get_mut(event.0 as usize) {
                    *flag = true;
                }
                shared.changed.notify_all();
            }
            Command::Wait { event, .. } => {
                let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                while state.error.is_none() && !state.recorded.get(event.0 as usize).copied().unwrap_or(true) {
                    state = shared.changed.wait(state).unwrap_or_else(|p| p.into_inner());
                }
                drop(state);
                if let Some(shadow) = &context.shadow {
                    if let Err(message) = shadow.waited(context.stream, event) {
                        shared.fail(BackendError::Unordered(message));
                    }
                }
            }
        }
    }
}

/// Runs one kernel on the arena: checks the arguments, makes the slices, calls the op (a
/// collective: the group's call, when the backend has a group).
fn launch(memory: &Memory, op: Op, args: &[KernelArg], context: &KernelContext, groups: &Groups) -> Result<(), String> {
    for (i, a) in args.iter().enumerate() {
        if a.span.space != Space::Device {
            return Err(format!("{}: argument {i} is not in the device arena", op.name()));
        }
        for b in &args[i + 1..] {
            let overlap = a.span.offset < b.span.offset + b.span.len && b.span.offset < a.span.offset + a.span.len;
            let writes = a.access != Access::Read || b.access != Access::Read;
            if overlap && writes && a.span.len > 0 && b.span.len > 0 {
                return Err(format!("{}: arguments overlap and one is written", op.name()));
            }
        }
    }
    let mut views = memory.views(args)?;
    if let (Some(collective), Some(group)) = (Collective::of_op(op), groups.of(op)) {
        return run_collective(op, collective, group, &mut views);
    }
    let mut kernel_args: Vec<ops::Arg<'_>> = views
        .iter_mut()
        .zip(args)
        .map(|(data, a)| ops::Arg {
            data: data.take(),
            first_row: a.first_row as usize,
            rows: a.rows as usize,
            row_bytes: a.row_bytes as usize,
        })
        .collect();
    let ctx = ops::OpContext {
        hidden: context.hidden as usize,
        heads: context.heads as usize,
        kv_heads: context.kv_heads as usize,
        kv_replicated: context.kv_replicated,
        rope_theta: context.rope_theta,
        norm_eps: context.norm_eps,
        seq_len: context.seq_len as usize,
        vocab: context.vocab as usize,
        loss_scale_tokens: context.loss_scale_tokens as usize,
        adamw: context.adamw,
        context_rank: usize::try_from(context.context_rank).unwrap_or(usize::MAX),
        context_ranks: usize::try_from(context.context_ranks).unwrap_or(usize::MAX),
    };
    let group = ops::Group {
        rank: usize::try_from(context.rank).unwrap_or(usize::MAX),
        ranks: usize::try_from(context.ranks).unwrap_or(usize::MAX),
    };
    ops::execute_on_rank(op, &mut kernel_args, &ctx, group, ops::threads()).map_err(|e| e.to_string())
}

/// A collective launch on the group: `(x read, y written)`, or `x` read and written in place
/// for an all-reduce; the accesses must be the signature's.
fn run_collective(
    op: Op,
    collective: Collective,
    group: &dyn Collectives,
    views: &mut [crate::memory::View<'_>],
) -> Result<(), String> {
    let mut data: Vec<ops::ArgData<'_>> = views.iter_mut().map(crate::memory::View::take).collect();
    let result = match (collective.in_place(), data.as_mut_slice()) {
        (true, [ops::ArgData::Write(x)]) => collective.run(group, &[], x),
        (false, [ops::ArgData::Read(x), ops::ArgData::Write(y)]) => collective.run(group, x, y),
        _ => {
            return Err(format!(
                "{}: a collective launch needs {} (the op's signature), got {} argument(s)",
                op.name(),
                if collective.in_place() { "one argument read and written" } else { "x read and y written" },
                data.len()
            ))
        }
    };
    result.map_err(|e| format!("{}: {e}", op.name()))
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn allocate(&mut self, arena_bytes: u64, host_bytes: u64, events: u32) -> Result<(), BackendError> {
        self.stop_workers();
        let memory = Arc::new(Memory::new(arena_bytes, host_bytes)?);
        {
            let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            state.recorded = vec![false; events as usize];
            state.error = None;
        }
        self.events = events;
        if let Some(shadow) = &self.shadow {
            shadow.reset(events);
        }
        for stream in Stream::ALL {
            let (sender, receiver) = channel();
            let context = WorkerContext {
                stream,
                memory: Arc::clone(&memory),
                shared: Arc::clone(&self.shared),
                copy_bytes_per_s: self.copy_bytes_per_s,
                shadow: self.shadow.clone(),
                measuring: self.measuring,
            };
            let thread = std::thread::Builder::new()
                .name(format!("memo-{}", stream.name()))
                .spawn(move || run_worker(receiver, context))
                .map_err(|e| BackendError::Other(format!("cannot start the {} stream's thread: {e}", stream.name())))?;
            self.workers.push(Worker { sender, thread: Some(thread) });
        }
        self.memory = Some(memory);
        Ok(())
    }

    fn upload(&mut self, span: Span, bytes: &[u8]) -> Result<(), BackendError> {
        self.synchronize()?;
        self.memory()?.write(span, bytes)
    }

    fn download(&mut self, span: Span) -> Result<Vec<u8>, BackendError> {
        self.synchronize()?;
        self.memory()?.read(span)
    }

    unsafe fn launch(
        &mut self,
        instruction: usize,
        stream: Stream,
        op: Op,
        args: &[KernelArg],
        context: &KernelContext,
    ) -> Result<(), BackendError> {
        // The signature's arguments: the CPU's ops need no scratch, so a launch's scratch argument
        // (a plan made for a GPU backend's sizer) is left unused.
        let args = args.iter().take(op.signature().len()).cloned().collect();
        self.send(stream, Command::Launch { instruction, op, args, context: *context })
    }

    unsafe fn copy(&mut self, instruction: usize, stream: Stream, src: Span, dst: Span) -> Result<(), BackendError> {
        self.send(stream, Command::Copy { instruction, src, dst })
    }

    fn record(&mut self, instruction: usize, stream: Stream, event: EventId) -> Result<(), BackendError> {
        self.known(instruction, event)?;
        self.send(stream, Command::Record { instruction, event })
    }

    fn wait(&mut self, instruction: usize, stream: Stream, event: EventId) -> Result<(), BackendError> {
        self.known(instruction, event)?;
        self.send(stream, Command::Wait { instruction, event })
    }

    fn timings(&mut self) -> Option<Vec<(usize, f64, f64)>> {
        let state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        state.timing.as_ref().map(|_| state.last_timing.clone())
    }

    /// Every stream thread reports to `control` and asks it before each instruction.
    fn control(&mut self, control: Option<Arc<StepControl>>) -> bool {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner()).control = control;
        true
    }

    fn checks(&self) -> Option<CheckReport> {
        self.shadow.as_ref().map(|shadow| shadow.report())
    }

    /// Waits for every stream, then resets the events for the next step.
    fn synchronize(&mut self) -> Result<(), BackendError> {
        let mut pending = Vec::new();
        for stream in Stream::ALL {
            if self.workers.len() == Stream::ALL.len() {
                let (done, wait) = channel();
                self.send(stream, Command::Flush(done))?;
                pending.push((stream, wait));
            }
        }
        for (stream, wait) in pending {
            wait.recv()
                .map_err(|_| BackendError::Other(format!("the {} stream's thread has stopped", stream.name())))?;
        }
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(shadow) = &self.shadow {
            shadow.reset(state.recorded.len() as u32);
        }
        state.recorded.iter_mut().for_each(|r| *r = false);
        let state = &mut *state;
        if let Some((epoch, spans)) = state.timing.as_mut() {
            if !spans.is_empty() {
                state.last_timing = std::mem::take(spans);
            }
            *epoch = std::time::Instant::now();
        }
        match state.error.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn memory(&self) -> MemoryReport {
        self.memory.as_ref().map_or(MemoryReport::default(), |m| MemoryReport {
            device_bytes: m.arena_bytes(),
            host_bytes: m.host_bytes(),
            scratch_bytes: 0,
        })
    }
}
