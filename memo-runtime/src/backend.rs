//! The `Backend` trait: what a device must offer to replay a plan (`spec/backends.md`).
//!
//! A backend owns one device arena and one pinned host slab, runs the plan's streams (three, and the
//! collective stream of a tensor-parallel rank), and has events.
//! Calls enqueue work on a stream and return; [`Backend::synchronize`] waits for every stream
//! and reports the first error any of them hit. The backend decides nothing: the interpreter
//! hands it byte spans computed from the plan.
//!
//! [`Backend::launch`] and [`Backend::copy`] are `unsafe`: a backend runs its streams
//! concurrently on shared memory (threads on the CPU, GPU streams on a device) and does not
//! order them by itself, so two calls on different streams that touch the same bytes, one of
//! them writing, with no event between them, race (on the CPU backend, two threads holding
//! `&mut [u8]` to one span). What rules that out is the plan: the independent checker proves
//! that every such pair is ordered (`spec/validity.md`, rules 3 to 5), and
//! [`crate::Replay`], built from a [`memo_plan_core::check::CheckedPlan`], is the caller that
//! keeps the promise. Everything else a backend is handed (a span outside its memory, arguments
//! of one call that overlap a written one, an unknown event) it refuses with an error, safely.

use std::fmt;

use memo_plan_core::plan::{Access, EventId, Op, Stream};

/// Which memory a span is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    /// The device arena.
    Device,
    /// The pinned host slab.
    Host,
}

/// Bytes `[offset, offset + len)` of one space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// Arena or host slab.
    pub space: Space,
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One argument of a launch: its bytes and its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelArg {
    /// The bytes of rows `[first_row, first_row + rows)` of the buffer.
    pub span: Span,
    /// The buffer's first row in this argument (positions for rotary embeddings).
    pub first_row: u64,
    /// Rows in the argument.
    pub rows: u64,
    /// Bytes per row.
    pub row_bytes: u64,
    /// How the op uses it.
    pub access: Access,
}

/// AdamW's hyperparameters and the step number.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator guard.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// Global gradient-norm clip (0: none).
    pub max_grad_norm: f32,
    /// The step being taken, from 1.
    pub step: u64,
    /// Steps over which the learning rate rises linearly to `lr` (0: none). Adam's first steps
    /// move every element by about the rate whatever its gradient, so a wide model at full
    /// rate from step 1 can diverge: at 3e-4 without it, a 2-layer GPT of width 2048 went from
    /// loss 5.65 to 12.3 in one step (CPU), the 1B GPT from 5.5 to 10.7 (H200), 2026-12-04.
    pub warmup_steps: u64,
}

impl AdamW {
    /// The learning rate of step `step` (from 1): `lr * min(1, step / warmup_steps)`.
    pub fn lr_at(&self, step: u64) -> f32 {
        if self.warmup_steps == 0 || step >= self.warmup_steps {
            self.lr
        } else {
            (f64::from(self.lr) * step as f64 / self.warmup_steps as f64) as f32
        }
    }
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            max_grad_norm: 1.0,
            step: 1,
            warmup_steps: 0,
        }
    }
}

/// What every kernel may need beyond its arguments: the model's shape on this GPU and the
/// optimizer's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelContext {
    /// Row width of sequence-sharded activations (`h`).
    pub hidden: u64,
    /// Query heads on this GPU.
    pub heads: u64,
    /// Key/value heads in this GPU's K and V (`ModelConfig::kv_heads_on_gpu`).
    pub kv_heads: u64,
    /// Whether K and V hold every key/value head, replicated on every rank (`t > kv_heads`).
    pub kv_replicated: bool,
    /// The rotary base `theta`.
    pub rope_theta: f64,
    /// The norms' epsilon.
    pub norm_eps: f64,
    /// Tokens per sequence (row `r` is at position `r % seq_len`).
    pub seq_len: u64,
    /// Vocabulary.
    pub vocab: u64,
    /// Tokens of the whole step: the loss is their mean.
    pub loss_scale_tokens: u64,
    /// The optimizer.
    pub adamw: AdamW,
    /// This GPU's rank in its tensor-parallel group, `0..ranks` (`spec/tensor-parallel.md`).
    pub rank: u64,
    /// GPUs in the tensor-parallel group, `t` (1: a single GPU).
    pub ranks: u64,
    /// This GPU's context-parallel rank, `0..context_ranks` (`spec/context-parallel.md`): which
    /// two chunks of each sequence its rows are (`seq_len` is then its rows of one sequence).
    pub context_rank: u64,
    /// Ranks in the context-parallel ring, `c` (1: none).
    pub context_ranks: u64,
}

/// What went wrong in a backend. Every variant says what and how to fix it.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendError {
    /// The device or its library is missing.
    Unavailable(String),
    /// Memory could not be allocated.
    OutOfMemory {
        /// What was being allocated.
        what: &'static str,
        /// Bytes asked for.
        bytes: u64,
    },
    /// A span outside the allocated memory (a plan/backend mismatch).
    OutOfBounds {
        /// The span.
        span: Span,
        /// The size of its space.
        size: u64,
    },
    /// A kernel failed (bad shapes, an op the backend cannot run).
    Kernel {
        /// Which instruction.
        instruction: usize,
        /// The kernel's message.
        message: String,
    },
    /// Checked mode caught an access the plan did not order.
    Unordered(String),
    /// The step was stopped at an instruction boundary before its update began (a stop asked for
    /// through [`crate::control::StopGate`]): the parameters and optimizer state are the previous
    /// step's.
    Interrupted,
    /// Anything else.
    Other(String),
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Unavailable(what) => write!(f, "backend unavailable: {what}"),
            BackendError::OutOfMemory { what, bytes } => {
                write!(f, "cannot allocate {bytes} bytes for the {what}: plan a shorter sequence or a smaller model")
            }
            BackendError::OutOfBounds { span, size } => write!(
                f,
                "{:?} bytes [{}, {}) lie outside its {size} bytes: the plan does not match the allocated memory",
                span.space,
                span.offset,
                span.offset.saturating_add(span.len)
            ),
            BackendError::Kernel { instruction, message } => write!(f, "instruction {instruction}: {message}"),
            BackendError::Unordered(message) => write!(f, "checked mode: {message}"),
            BackendError::Interrupted => {
                f.write_str("the step was stopped before its update began (the previous step's state is intact)")
            }
            BackendError::Other(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for BackendError {}

/// Bytes a backend holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Device bytes allocated (the arena).
    pub device_bytes: u64,
    /// Pinned host bytes allocated (the slab).
    pub host_bytes: u64,
    /// Device bytes a GPU backend's kernels hold beyond the arena as scratch, for launches whose
    /// plan gives them none (a plan made without [`Backend::scratch_sizer`]: the partial sums of
    /// the deterministic reductions, cuDNN attention's needs; grown during the first step). 0 when
    /// the plan carries every launch's scratch (`memo train`'s plans), and on the CPU.
    pub scratch_bytes: u64,
}

/// What a checked backend verified against the executed events so far (cumulative over the
/// steps; a violation fails its step, so a run that goes on has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Launches and copies whose every access was checked.
    pub instructions: u64,
    /// Byte ranges (arguments' spans, copies' sources and destinations) checked.
    pub spans: u64,
    /// Waits whose event was checked to have been recorded before they returned.
    pub waits: u64,
}

/// A device that replays plans. Work is enqueued per stream; [`Backend::synchronize`] waits.
// Its two unsafe methods are where the workspace's memory safety rests on the plan checker.
#[allow(unsafe_code)]
pub trait Backend {
    /// A name for reports (`cpu`, `cuda:0`, ...).
    fn name(&self) -> String;

    /// Allocates the arena, the host slab and `events` events (replacing earlier ones).
    fn allocate(&mut self, arena_bytes: u64, host_bytes: u64, events: u32) -> Result<(), BackendError>;

    /// Copies `bytes` into the span (synchronously, with every stream idle).
    fn upload(&mut self, span: Span, bytes: &[u8]) -> Result<(), BackendError>;

    /// Reads the span (synchronously, with every stream idle).
    fn download(&mut self, span: Span) -> Result<Vec<u8>, BackendError>;

    /// Enqueues a kernel on `stream`. `instruction` is its index in the plan, for errors.
    ///
    /// # Safety
    ///
    /// Every access of this launch (its arguments' spans, read or written as their
    /// [`Access`] says) must be ordered with every conflicting access of the work enqueued on
    /// the other streams (a conflict: overlapping bytes, one of the two a write), before and
    /// after it until the next [`Backend::synchronize`]: by a [`Backend::record`] on one stream
    /// and a [`Backend::wait`] for that event on the other, as the plan checker requires
    /// (`spec/validity.md`, rules 3 to 5). Replaying a
    /// [`memo_plan_core::check::CheckedPlan`] in list order, as [`crate::Replay`] does, meets
    /// this. Spans outside the allocated memory and arguments that overlap a written one are
    /// not the caller's to avoid: the backend refuses them.
    unsafe fn launch(
        &mut self,
        instruction: usize,
        stream: Stream,
        op: Op,
        args: &[KernelArg],
        context: &KernelContext,
    ) -> Result<(), BackendError>;

    /// Enqueues a copy of `src` into `dst` (equal lengths) on `stream`.
    ///
    /// # Safety
    ///
    /// As for [`Backend::launch`]: reading `src` and writing `dst` must be ordered with every
    /// conflicting access of the other streams' work by events, as a checked plan orders them.
    unsafe fn copy(&mut self, instruction: usize, stream: Stream, src: Span, dst: Span) -> Result<(), BackendError>;

    /// Enqueues the recording of `event` on `stream` (plan instruction `instruction`). An event
    /// beyond those allocated is refused with an error, never ignored: launches and copies rely
    /// on the ordering events give.
    fn record(&mut self, instruction: usize, stream: Stream, event: EventId) -> Result<(), BackendError>;

    /// Makes `stream` wait for `event` (plan instruction `instruction`). An event beyond those
    /// allocated is refused with an error: a wait that falls through would leave unordered what
    /// the plan ordered.
    fn wait(&mut self, instruction: usize, stream: Stream, event: EventId) -> Result<(), BackendError>;

    /// Waits for every stream; the first error any of them hit.
    fn synchronize(&mut self) -> Result<(), BackendError>;

    /// What is allocated.
    fn memory(&self) -> MemoryReport;

    /// The scratch each launch of a plan of `model` at `tensor`-way parallelism needs on this
    /// backend besides its arguments, asked before planning (`spec/plan-format.md`, "Launch
    /// scratch"): plan with it (`PlannedStep::with_scratch`) and the plan owns those bytes, so
    /// [`MemoryReport::scratch_bytes`] stays 0. The default: none.
    fn scratch_sizer(
        &mut self,
        model: &memo_plan_core::model::ModelConfig,
        tensor: u64,
    ) -> Result<Box<dyn memo_plan_core::plan::scratch::ScratchSizer>, BackendError> {
        let _ = (model, tensor);
        Ok(Box::new(memo_plan_core::plan::scratch::NoScratch))
    }

    /// When the backend measures: each instruction of the last synchronised step with its start
    /// and end in seconds from the step's start, `(instruction, start, end)`. `None` when it does
    /// not measure.
    fn timings(&mut self) -> Option<Vec<(usize, f64, f64)>> {
        None
    }

    /// Reports each instruction it runs to `control` and asks it before running one, stopping
    /// the step at that boundary ([`BackendError::Interrupted`]) when it says so
    /// (`crate::control`); `None` removes it. Returns whether the backend does so; one that does
    /// not (the default) runs every step to its end.
    fn control(&mut self, control: Option<std::sync::Arc<crate::control::StepControl>>) -> bool {
        let _ = control;
        false
    }

    /// In a checked mode that verifies every access against the executed events: what it has
    /// verified so far. `None` for a backend that does not check.
    fn checks(&self) -> Option<CheckReport> {
        None
    }
}

/// A boxed backend is a backend: `Trainer<Box<dyn Backend>>` serves whichever device was chosen
/// at run time (the `memo` command line, the cross-backend tests).
#[allow(unsafe_code)]
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn allocate(&mut self, arena_bytes: u64, host_bytes: u64, events: u32) -> Result<(), BackendError> {
        (**self).allocate(arena_bytes, host_bytes, events)
    }
    fn upload(&mut self, span: Span, bytes: &[u8]) -> Result<(), BackendError> {
        (**self).upload(span, bytes)
    }
    fn download(&mut self, span: Span) -> Result<Vec<u8>, BackendError> {
        (**self).download(span)
    }
    fn scratch_sizer(
        &mut self,
        model: &memo_plan_core::model::ModelConfig,
        tensor: u64,
    ) -> Result<Box<dyn memo_plan_core::plan::scratch::ScratchSizer>, BackendError> {
        (**self).scratch_sizer(model, tensor)
    }
    unsafe fn launch(
        &mut self,
        instruction: usize,
        stream: Stream,
        op: Op,
        args: &[KernelArg],
        context: &KernelContext,
    ) -> Result<(), BackendError> {
        // Safety: the caller keeps `launch`'s contract; the boxed backend is the same backend.
        unsafe { (**self).launch(instruction, stream, op, args, context) }
    }
    unsafe fn copy(&mut self, instruction: usize, stream: Stream, src: Span, dst: Span) -> Result<(), BackendError> {
        // Safety: the caller keeps `copy`'s contract; the boxed backend is the same backend.
        unsafe { (**self).copy(instruction, stream, src, dst) }
    }
    fn record(&mut self, instruction: usize, stream: Stream, event: EventId) -> Result<(), BackendError> {
        (**self).record(instruction, stream, event)
    }
    fn wait(&mut self, instruction: usize, stream: Stream, event: EventId) -> Result<(), BackendError> {
        (**self).wait(instruction, stream, event)
    }
    fn synchronize(&mut self) -> Result<(), BackendError> {
        (**self).synchronize()
    }
    fn memory(&self) -> MemoryReport {
        (**self).memory()
    }
    fn timings(&mut self) -> Option<Vec<(usize, f64, f64)>> {
        (**self).timings()
    }

    fn control(&mut self, control: Option<std::sync::Arc<crate::control::StepControl>>) -> bool {
        (**self).control(control)
    }

    fn checks(&self) -> Option<CheckReport> {
        (**self).checks()
    }
}
