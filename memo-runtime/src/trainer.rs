//! The GPT trainer: plan once, initialise the parameters and the optimizer state in the arena,
//! then per step upload the tokens, replay the plan, and read the loss.
//!
//! Parameters are initialised from the seed and each parameter's (role, layer) only, never from
//! its place or its position in the plan, so every strategy starts from the same weights:
//! weights `N(0, 0.02)` (the residual projections `wo` and `w2` scaled by `1/sqrt(2n)`, as GPT-2
//! does), biases and norm shifts 0, norm scales 1. AdamW's state starts at master = the bf16
//! parameter, m = v = 0.

use std::sync::{mpsc, Arc};

use half::bf16;
use memo_plan_core::check::CheckedPlan;
use memo_plan_core::generate::SplitMix64;
use memo_plan_core::model::{Architecture, Hardware, ModelConfig, Parallelism};
use memo_plan_core::plan::shapes::ShapeContext;
use memo_plan_core::plan::{Buffer, BufferId, BufferKind, Strategy, TensorRole};
use memo_plan_core::planner::{self, PlanReport, PlanRequest};

use crate::backend::{AdamW, Backend, BackendError, CheckReport, KernelContext, MemoryReport};
use crate::checkpoint::{Checkpoint, SavedTensor, StateKind};
use crate::control::{StepControl, StopGate};
use crate::error::{CheckpointMismatch, PlanMismatch, RuntimeError, TokenError};
use crate::interpret::Replay;

mod logits;
mod parallel;
pub mod shard;

pub use parallel::{ParallelTrainer, RankGroups};
use shard::{Shard, ShardLayout};

/// A machine description for planning on the CPU backend: what the host gives one "device".
/// Copies are modelled at 10 GB/s and kernels at 20 GFLOP/s; only α and the fit depend on them.
pub fn cpu_hardware(device_memory_bytes: u64) -> Hardware {
    Hardware {
        name: "cpu".to_string(),
        device_memory_bytes,
        host_memory_per_node_bytes: device_memory_bytes,
        gpus_per_node: 1,
        d2h_bytes_per_s: 10_000_000_000,
        h2d_bytes_per_s: 10_000_000_000,
        gpus_sharing_uplink: 1,
        peak_flops: 20_000_000_000,
        achieved_flops: 20_000_000_000,
        measured_layer_forward_s: None,
        measured_rates: memo_plan_core::model::MeasuredRates::NONE,
    }
}

/// The models `memo train` knows by name (byte-level vocabulary of 256): GPTs `tiny` and
/// `small`, and Llama-shaped `tiny-llama` and `small-llama` (grouped-query attention with half as
/// many K/V heads, SwiGLU of width 2.75h, RMSNorm, no biases, an untied classifier).
pub fn training_model(name: &str, seq_len: u64) -> Option<ModelConfig> {
    let (layers, hidden, heads, llama) = match name {
        "tiny" => (2, 64, 4, false),
        "small" => (4, 128, 4, false),
        "tiny-llama" => (2, 64, 4, true),
        "small-llama" => (4, 128, 4, true),
        _ => return None,
    };
    let mut model = ModelConfig::new(name, layers, hidden, heads, seq_len, 1);
    model.vocab = 256;
    if llama {
        model.kv_heads = heads / 2;
        model.ffn_hidden = hidden * 11 / 4;
        model.architecture = Architecture::llama(10_000.0, 1e-5);
    }
    Some(model)
}

/// The names [`training_model`] knows.
pub const TRAINING_MODELS: [&str; 4] = ["tiny", "small", "tiny-llama", "small-llama"];

/// What to train.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The model and sequence (`micro_batch` sequences per step).
    pub model: ModelConfig,
    /// How activations are kept.
    pub strategy: Strategy,
    /// For memo: α instead of the LP's.
    pub forced_alpha: Option<f64>,
    /// The machine the plan is made for.
    pub hardware: Hardware,
    /// Seeds the parameters.
    pub seed: u64,
    /// The optimizer (its `step` is set per step).
    pub adamw: AdamW,
}

impl TrainOptions {
    /// What the planner is asked for: this model on one GPU of the machine, with this strategy.
    pub fn plan_request(&self) -> PlanRequest {
        let mut request =
            PlanRequest::new(self.model.clone(), Parallelism::single(), self.hardware.clone(), self.strategy);
        request.forced_alpha = self.forced_alpha;
        request
    }
}

/// The step planned for [`TrainOptions`], before anything is allocated: what a caller inspects
/// (does it fit the machine?) and then trains with, so that the step is planned once.
#[derive(Clone, Debug)]
pub struct PlannedStep {
    options: TrainOptions,
    report: PlanReport,
    plan_s: f64,
}

impl PlannedStep {
    /// Plans the step of `options` (on one GPU).
    pub fn new(options: &TrainOptions) -> Result<Self, RuntimeError> {
        Self::tensor_parallel(options, 1)
    }

    /// Plans one rank's step of `options` with `tensor`-way tensor and sequence parallelism
    /// (`spec/tensor-parallel.md`); the planner refuses a `tensor` that does not divide the
    /// heads, the FFN width and the sequence.
    pub fn tensor_parallel(options: &TrainOptions, tensor: u64) -> Result<Self, RuntimeError> {
        Self::tensor_parallel_with_scratch(options, tensor, &memo_plan_core::plan::scratch::NoScratch)
    }

    /// Plans the step of `options` (on one GPU) with the launch scratch `scratch` asks
    /// ([`Backend::scratch_sizer`], `spec/plan-format.md` "Launch scratch").
    pub fn with_scratch(
        options: &TrainOptions,
        scratch: &dyn memo_plan_core::plan::scratch::ScratchSizer,
    ) -> Result<Self, RuntimeError> {
        Self::tensor_parallel_with_scratch(options, 1, scratch)
    }

    /// [`PlannedStep::tensor_parallel`] with the launch scratch `scratch` asks.
    pub fn tensor_parallel_with_scratch(
        options: &TrainOptions,
        tensor: u64,
        scratch: &dyn memo_plan_core::plan::scratch::ScratchSizer,
    ) -> Result<Self, RuntimeError> {
        Self::with_layout(options, Parallelism { tensor, ..Parallelism::single() }, scratch)
    }

    /// Plans the step of `options` for the ranks of `parallel` (`t`-way tensor and `c`-way
    /// context parallelism: `spec/context-parallel.md`), with the launch scratch `scratch` asks.
    pub fn with_layout(
        options: &TrainOptions,
        parallel: Parallelism,
        scratch: &dyn memo_plan_core::plan::scratch::ScratchSizer,
    ) -> Result<Self, RuntimeError> {
        if options.model.architecture.rope_scaling.is_some() {
            return Err(RuntimeError::ModelNotTrainable(
                "its rope_scaling (Llama 3.1's rescaled rotary frequencies) is not implemented by the kernels; \
                 `memo plan` plans it, and a copy of the model without rope_scaling trains"
                    .into(),
            ));
        }
        let started = std::time::Instant::now();
        let mut request = options.plan_request();
        request.parallel = parallel;
        let report = planner::plan_with_scratch(&request, scratch)?;
        Ok(PlannedStep { options: options.clone(), report, plan_s: started.elapsed().as_secs_f64() })
    }

    /// The tensor-parallel degree the step was planned for.
    pub fn tensor(&self) -> u64 {
        self.report.plan.provenance.parallel.tensor
    }

    /// The planner's report: the plan, its fit on the machine, its timeline.
    pub fn report(&self) -> &PlanReport {
        &self.report
    }

    /// What was planned for.
    pub fn options(&self) -> &TrainOptions {
        &self.options
    }
}

/// A parameter's (role, layer) and its bytes.
pub type NamedBytes = ((TensorRole, Option<u32>), Vec<u8>);

/// A model being trained on a backend.
pub struct Trainer<B: Backend> {
    backend: B,
    replay: Replay,
    report: PlanReport,
    context: KernelContext,
    tokens: BufferId,
    targets: BufferId,
    loss: BufferId,
    step: u64,
    setup: SetupTimes,
    /// This rank and the group's size (0 and 1 on one GPU).
    rank: u64,
    ranks: u64,
    /// Progress and stopping ([`Trainer::set_stop_gate`]), when asked for.
    control: Option<Arc<StepControl>>,
}

/// Seconds [`Trainer::new`] spent in each of its stages (on a GPU, allocation pins the host slab
/// and initialisation draws and uploads every parameter: both grow with the model).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SetupTimes {
    /// Making the plan (the planner and the arena placement).
    pub plan_s: f64,
    /// Checking the plan and allocating the arena, the pinned host slab and the events.
    pub allocate_s: f64,
    /// Drawing every parameter and its optimizer state and uploading them.
    pub initialise_s: f64,
}

fn find(report: &PlanReport, role: TensorRole) -> Result<BufferId, RuntimeError> {
    report
        .plan
        .buffers
        .iter()
        .position(|b| b.role == role && b.layer.is_none())
        .map(|i| BufferId(i as u32))
        .ok_or(RuntimeError::Plan(PlanMismatch::NoBuffer(role)))
}

impl<B: Backend> Trainer<B> {
    /// Plans the step, checks the plan, allocates it on `backend` and initialises the model.
    pub fn new(backend: B, options: &TrainOptions) -> Result<Self, RuntimeError> {
        Self::with_plan(backend, PlannedStep::new(options)?)
    }

    /// Checks the planned step's plan, allocates it on `backend` and initialises the model.
    pub fn with_plan(backend: B, planned: PlannedStep) -> Result<Self, RuntimeError> {
        let checking = std::time::Instant::now();
        let checked = CheckedPlan::check(planned.report.plan.clone()).map_err(RuntimeError::Invalid)?;
        Self::for_rank(backend, planned, checked, 0, checking)
    }

    /// Global rank `rank` (`context_rank * t + tensor_rank`) of a parallel step
    /// ([`ParallelTrainer`]): allocates the checked plan on `backend` (its context rank's
    /// program) and initialises its tensor-parallel rank's shard of the model.
    fn for_rank(
        mut backend: B,
        planned: PlannedStep,
        checked: CheckedPlan,
        rank: u64,
        checking: std::time::Instant,
    ) -> Result<Self, RuntimeError> {
        let PlannedStep { options, report, plan_s } = planned;
        let parallel = report.plan.provenance.parallel;
        let ranks = parallel.tensor.max(1);
        let global = u32::try_from(rank).unwrap_or(u32::MAX);
        let (context_rank, tensor_rank) = report.plan.rank_coordinates(global);
        let replay = Replay::for_rank(checked, global)?;
        replay.allocate(&mut backend)?;
        let allocated = std::time::Instant::now();
        let model = &options.model;
        // The rank's share of the model and of the sequence, as the op table (and the plan's
        // checker) sees it.
        let shape = ShapeContext::for_ranks(model, &parallel, u64::from(tensor_rank), u64::from(context_rank));
        let context = KernelContext {
            hidden: shape.hidden,
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            kv_replicated: shape.kv_replicated,
            rope_theta: shape.rope_theta,
            norm_eps: shape.norm_eps,
            seq_len: shape.seq_len,
            vocab: shape.vocab,
            loss_scale_tokens: shape.loss_scale_tokens,
            adamw: options.adamw,
            rank: shape.rank,
            ranks,
            context_rank: shape.context_rank,
            context_ranks: shape.context_ranks,
        };
        let rank = shape.rank;
        let tokens = find(&report, TensorRole::Tokens)?;
        let targets = find(&report, TensorRole::Targets)?;
        let loss = find(&report, TensorRole::Loss)?;
        let mut setup = SetupTimes { plan_s, allocate_s: (allocated - checking).as_secs_f64(), initialise_s: 0.0 };
        let mut trainer = Trainer {
            backend,
            replay,
            report,
            context,
            tokens,
            targets,
            loss,
            step: 0,
            setup,
            rank,
            ranks,
            control: None,
        };
        trainer.initialise(options.seed)?;
        setup.initialise_s = allocated.elapsed().as_secs_f64();
        trainer.setup = setup;
        Ok(trainer)
    }

    /// Where [`Trainer::new`]'s time went.
    pub fn setup_times(&self) -> SetupTimes {
        self.setup
    }

    /// Writes every parameter and its optimizer state. A drawing thread (which draws each
    /// parameter on every core) stays one parameter ahead of the uploads, so drawing and
    /// uploading overlap; two pairs of host buffers circulate between them rather than fresh
    /// ones being allocated (and page-faulted) for each parameter.
    fn initialise(&mut self, seed: u64) -> Result<(), RuntimeError> {
        let buffers: Vec<Buffer> = self.replay.plan().buffers.clone();
        let layers = self.report.plan.provenance.model.layers;
        let (rank, ranks) = (self.rank, self.ranks);
        let layout = ShardLayout::of(&self.report.plan.provenance.model, ranks);
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let mut jobs = Vec::new(); // (parameter, its optimizer state)
        for (index, buffer) in buffers.iter().enumerate().filter(|(_, b)| b.kind == BufferKind::Parameter) {
            let state = buffers
                .iter()
                .position(|b| b.kind == BufferKind::OptimizerState && b.role == buffer.role && b.layer == buffer.layer)
                .ok_or(PlanMismatch::NoOptimizerState(*buffer))?;
            jobs.push((index, state));
        }
        let (buffers, jobs) = (&buffers, &jobs);
        std::thread::scope(|scope| {
            // Dropped when this closure returns, early on an upload error too: the drawing
            // thread's next send or receive then fails and it stops.
            let (drawn_sender, drawn) = mpsc::sync_channel::<(Vec<u8>, Vec<u8>)>(1);
            let (spare_sender, spare) = mpsc::channel::<(Vec<u8>, Vec<u8>)>();
            for _ in 0..2 {
                let _ = spare_sender.send((Vec::new(), Vec::new()));
            }
            scope.spawn(move || {
                for &(index, _) in jobs {
                    let Ok((mut bytes, mut state_bytes)) = spare.recv() else { return };
                    let buffer = &buffers[index];
                    let shard = Shard::of(buffer.role, rank, ranks, &layout);
                    draw_parameter_and_state(seed, buffer, layers, shard, threads, &mut bytes, &mut state_bytes);
                    if drawn_sender.send((bytes, state_bytes)).is_err() {
                        return;
                    }
                }
            });
            for &(index, state) in jobs {
                let (bytes, state_bytes) = drawn.recv().map_err(|_| RuntimeError::InitialisationStopped)?;
                self.backend.upload(self.replay.span(BufferId(index as u32)), &bytes)?;
                self.backend.upload(self.replay.span(BufferId(state as u32)), &state_bytes)?;
                let _ = spare_sender.send((bytes, state_bytes));
            }
            Ok(())
        })
    }

    /// One training step on `tokens` with next-token `targets` (`micro_batch * seq_len` each;
    /// on a rank of a tensor-parallel group, its `1/t` of the rows); returns the mean loss.
    ///
    /// With a stop gate ([`Trainer::set_stop_gate`]) a step asked to stop before its update
    /// began ends with [`BackendError::Interrupted`] and leaves the previous step's state (and
    /// [`Trainer::steps_taken`]) as they were; a step is not begun once a stop was asked for.
    pub fn step(&mut self, tokens: &[u32], targets: &[u32]) -> Result<f32, RuntimeError> {
        if let Some(control) = &self.control {
            if control.gate().stop_requested() {
                return Err(BackendError::Interrupted.into());
            }
            control.gate().begin_step();
        }
        self.run_step(tokens, targets)
    }

    /// [`Trainer::step`] without asking or resetting the gate (a tensor-parallel step does both
    /// once for every rank, before any runs, so that the ranks decide alike).
    fn run_step(&mut self, tokens: &[u32], targets: &[u32]) -> Result<f32, RuntimeError> {
        let expected = (self.replay.span(self.tokens).len / 4) as usize;
        if tokens.len() != expected || targets.len() != expected {
            return Err(TokenError::StepLength { expected, tokens: tokens.len(), targets: targets.len() }.into());
        }
        if let Some(bad) = tokens.iter().chain(targets).find(|&&t| u64::from(t) >= self.context.vocab) {
            return Err(TokenError::OutsideVocabulary { token: *bad, vocab: self.context.vocab }.into());
        }
        if let Some(control) = &self.control {
            control.begin_step();
        }
        let to_bytes = |values: &[u32]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        self.backend.upload(self.replay.span(self.tokens), &to_bytes(tokens))?;
        self.backend.upload(self.replay.span(self.targets), &to_bytes(targets))?;
        self.step += 1;
        let mut context = self.context;
        context.adamw.step = self.step;
        context.adamw.lr = self.context.adamw.lr_at(self.step);
        if let Err(error) = self.replay.run(&mut self.backend, &context) {
            // Stopped before any rank began the update: whatever failed (this rank's stop, or a
            // peer's collective aborted by it), the previous step's state is intact. Only a
            // backend that honours the control asks the gate before each update.
            let stopped = self
                .control
                .as_ref()
                .is_some_and(|c| c.honoured() && c.gate().stop_requested() && !c.gate().committed());
            if stopped {
                self.step -= 1;
                return Err(BackendError::Interrupted.into());
            }
            return Err(error);
        }
        let loss = self.backend.download(self.replay.span(self.loss))?;
        let sum = f32::from_le_bytes([loss[0], loss[1], loss[2], loss[3]]);
        Ok(sum / self.context.loss_scale_tokens as f32)
    }

    /// Lets `gate` stop the steps (at an instruction boundary before the update, on a backend
    /// that honours it, else between steps) and count what they run (`crate::control`). Returns
    /// the control the backend reports to; [`StepControl::honoured`] says whether it does.
    pub fn set_stop_gate(&mut self, gate: Arc<StopGate>) -> Arc<StepControl> {
        let plan = self.replay.plan();
        let persistent = |buffer: BufferId| {
            plan.buffers
                .get(buffer.index())
                .is_some_and(|b| matches!(b.kind, BufferKind::Parameter | BufferKind::OptimizerState))
        };
        let commits = self
            .replay
            .program()
            .iter()
            .map(|instruction| match &instruction.action {
                memo_plan_core::plan::Action::Launch(launch) => {
                    launch.args.iter().any(|arg| arg.access.writes() && persistent(arg.region.buffer))
                }
                memo_plan_core::plan::Action::Copy { dst, .. } => persistent(dst.buffer),
                _ => false,
            })
            .collect();
        let control = StepControl::new(gate, commits);
        let honoured = self.backend.control(Some(Arc::clone(&control)));
        control.set_honoured(honoured);
        self.control = Some(Arc::clone(&control));
        control
    }

    /// The control of [`Trainer::set_stop_gate`], if set.
    pub fn step_control(&self) -> Option<&Arc<StepControl>> {
        self.control.as_ref()
    }

    /// What a checked backend has verified so far (`None` when it does not check).
    pub fn checks(&self) -> Option<CheckReport> {
        self.backend.checks()
    }

    /// The instructions of this rank's program, for progress reports.
    pub fn program(&self) -> &[memo_plan_core::plan::Instruction] {
        self.replay.program()
    }

    /// Every parameter's bytes, keyed by (role, layer) and sorted by it: comparable across
    /// strategies, whose plans place them differently.
    pub fn parameters(&mut self) -> Result<Vec<NamedBytes>, RuntimeError> {
        let mut out = Vec::new();
        for (index, buffer) in self.replay.plan().buffers.iter().enumerate() {
            if buffer.kind == BufferKind::Parameter {
                let bytes = self.backend.download(self.replay.span(BufferId(index as u32)))?;
                out.push(((buffer.role, buffer.layer), bytes));
            }
        }
        out.sort_by_key(|entry: &NamedBytes| entry.0);
        Ok(out)
    }

    /// Every buffer of `kind` (e.g. the gradients of the last step), keyed by (role, layer) and
    /// sorted by it, like [`Trainer::parameters`]. Only persistent kinds (parameters, gradients,
    /// optimizer state) hold meaningful bytes between steps.
    pub fn buffers_of_kind(&mut self, kind: BufferKind) -> Result<Vec<NamedBytes>, RuntimeError> {
        let mut out = Vec::new();
        for (index, buffer) in self.replay.plan().buffers.iter().enumerate() {
            if buffer.kind == kind {
                let bytes = self.backend.download(self.replay.span(BufferId(index as u32)))?;
                out.push(((buffer.role, buffer.layer), bytes));
            }
        }
        out.sort_by_key(|entry: &NamedBytes| entry.0);
        Ok(out)
    }

    /// The model's state (parameters and optimizer state) as a checkpoint.
    pub fn checkpoint(&mut self, fingerprint: u64, data_position: u64) -> Result<Checkpoint, RuntimeError> {
        let mut tensors = self.state_tensors()?;
        tensors.sort_by_key(|t| (t.kind, t.role, t.layer, t.rank));
        Ok(Checkpoint { fingerprint, step: self.step, data_position, ranks: 1, tensors })
    }

    /// Every parameter and optimizer state of this rank, untagged (`rank: None`).
    fn state_tensors(&mut self) -> Result<Vec<SavedTensor>, RuntimeError> {
        let mut tensors = Vec::new();
        for (index, buffer) in self.replay.plan().buffers.iter().enumerate() {
            let kind = match buffer.kind {
                BufferKind::Parameter => StateKind::Parameter,
                BufferKind::OptimizerState => StateKind::OptimizerState,
                _ => continue,
            };
            let bytes = self.backend.download(self.replay.span(BufferId(index as u32)))?;
            tensors.push(SavedTensor { kind, role: buffer.role, layer: buffer.layer, rank: None, bytes });
        }
        Ok(tensors)
    }

    /// Restores a checkpoint's state; it must hold exactly this model's tensors.
    pub fn restore(&mut self, checkpoint: &Checkpoint, fingerprint: u64) -> Result<(), RuntimeError> {
        if checkpoint.fingerprint != fingerprint {
            return Err(CheckpointMismatch::OtherModel.into());
        }
        if u64::from(checkpoint.ranks) != self.ranks {
            return Err(CheckpointMismatch::Ranks { saved: checkpoint.ranks, running: self.ranks }.into());
        }
        let used = self.restore_tensors(checkpoint)?;
        if used.len() != checkpoint.tensors.len() {
            return Err(CheckpointMismatch::Extra.into());
        }
        self.step = checkpoint.step;
        Ok(())
    }

    /// Uploads this rank's tensors of `checkpoint` (its own shards and the whole ones); returns
    /// the indices of the tensors it used.
    fn restore_tensors(&mut self, checkpoint: &Checkpoint) -> Result<Vec<usize>, RuntimeError> {
        let buffers = self.replay.plan().buffers.clone();
        let mut used = Vec::new();
        for (index, buffer) in buffers.iter().enumerate() {
            let kind = match buffer.kind {
                BufferKind::Parameter => StateKind::Parameter,
                BufferKind::OptimizerState => StateKind::OptimizerState,
                _ => continue,
            };
            let rank = u32::try_from(self.rank).ok();
            let (at, saved) = checkpoint
                .tensors
                .iter()
                .enumerate()
                .find(|(_, t)| {
                    t.kind == kind
                        && t.role == buffer.role
                        && t.layer == buffer.layer
                        && (t.rank.is_none() || t.rank == rank)
                })
                .ok_or(CheckpointMismatch::Missing(*buffer))?;
            let span = self.replay.span(BufferId(index as u32));
            if saved.bytes.len() as u64 != span.len {
                return Err(
                    CheckpointMismatch::Size { buffer: *buffer, saved: saved.bytes.len(), needed: span.len }.into()
                );
            }
            self.backend.upload(span, &saved.bytes)?;
            used.push(at);
        }
        self.step = checkpoint.step;
        Ok(used)
    }

    /// The measured timeline of the last step, when the backend measures
    /// ([`Backend::timings`]): per plan instruction, its start and end in seconds (instructions
    /// the backend did not time get a zero-length span at 0).
    pub fn last_step_timeline(&mut self) -> Option<memo_plan_core::simulate::Timeline> {
        let spans = self.backend.timings()?;
        let plan = self.replay.plan();
        let mut timeline = memo_plan_core::simulate::Timeline {
            spans: vec![memo_plan_core::simulate::Span { start_s: 0.0, end_s: 0.0 }; plan.instructions.len()],
            step_time_s: 0.0,
            busy_s: [0.0; 3],
            stall_s: [0.0; 3],
            flops_per_s: 0.0,
        };
        let mut flops = 0u64;
        for (instruction, start_s, end_s) in spans {
            let Some(i) = plan.instructions.get(instruction) else { continue };
            timeline.spans[instruction] = memo_plan_core::simulate::Span { start_s, end_s };
            timeline.step_time_s = timeline.step_time_s.max(end_s);
            // The timeline's sums cover the compute and copy streams (the collective stream's
            // spans are in `spans`).
            let s = i.stream.index();
            if let memo_plan_core::plan::Action::Launch(launch) = &i.action {
                flops = flops.saturating_add(launch.flops);
            }
            let sums = match &i.action {
                memo_plan_core::plan::Action::Wait(_) => &mut timeline.stall_s,
                _ => &mut timeline.busy_s,
            };
            if let Some(sum) = sums.get_mut(s) {
                *sum += end_s - start_s;
            }
        }
        timeline.flops_per_s = flops as f64 / timeline.busy_s[0].max(f64::MIN_POSITIVE);
        Some(timeline)
    }

    /// The plan and its report.
    pub fn report(&self) -> &PlanReport {
        &self.report
    }

    /// What the backend holds.
    pub fn memory(&self) -> MemoryReport {
        self.backend.memory()
    }

    /// Steps taken.
    pub fn steps_taken(&self) -> u64 {
        self.step
    }
}

/// Elements one thread draws at a time when initialising a parameter (whole rows of them).
const INITIAL_BLOCK: usize = 1 << 18;

/// One block of a parameter to draw: the `t = 1` tensor's element its first element is (`None`:
/// padding, zero), its bf16 bytes and its state rows.
type InitialBlock<'a> = (Option<usize>, &'a mut [u8], &'a mut [u8]);

/// Writes into `bytes` a parameter's initial bf16 bytes and into `state_bytes` its optimizer
/// state's: per row, master weights (the bf16 values widened to f32), then m and v (zeros). The
/// buffers are resized to fit and every byte is written, whatever they held. On a rank of a
/// tensor-parallel group the values are those of `shard`'s slice of the `t = 1` tensor (drawn
/// from the same generator at the same positions; padding rows are zero). Drawn in blocks of
/// whole rows on `threads` threads: a 1B-parameter model draws 10^9 normals, tens of seconds on
/// one core (on the H200 machine's 16 cores, initialising took 19-20 s when each buffer was
/// drawn on one thread and 6.5-7.5 s drawn in blocks, draw and upload not timed apart;
/// 2026-12-04); the values are those of one generator drawn element after element (each block
/// jumps to its first draw).
fn draw_parameter_and_state(
    seed: u64,
    buffer: &Buffer,
    layers: u32,
    shard: Shard,
    threads: usize,
    bytes: &mut Vec<u8>,
    state_bytes: &mut Vec<u8>,
) {
    let elements = (buffer.rows * buffer.row_bytes / 2) as usize;
    let per_row = ((buffer.row_bytes / 2) as usize).max(1);
    let block_rows = (INITIAL_BLOCK / per_row).max(1);
    let draw = InitialValues::of(seed, buffer, layers);
    // Only a grown tail is zeroed here; `fill` writes every byte of every block.
    bytes.resize(elements * 2, 0);
    state_bytes.resize(elements * 12, 0);
    let mut jobs: Vec<InitialBlock> = Vec::new();
    let (mut values, mut state) = (bytes.as_mut_slice(), state_bytes.as_mut_slice());
    for (rows, first) in shard.runs(buffer.rows, per_row as u64) {
        let mut done = 0;
        while done < rows as usize {
            let n = block_rows.min(rows as usize - done);
            let (value_bytes, state_len) = ((n * per_row * 2).min(values.len()), (n * per_row * 12).min(state.len()));
            let (block, rest) = std::mem::take(&mut values).split_at_mut(value_bytes);
            values = rest;
            let (block_state, rest) = std::mem::take(&mut state).split_at_mut(state_len);
            state = rest;
            jobs.push((first.map(|f| f as usize + done * per_row), block, block_state));
            done += n;
        }
    }
    let run = |(first, values, state): InitialBlock| match first {
        Some(first) => draw.fill(first, per_row, values, state),
        None => {
            values.fill(0);
            state.fill(0);
        }
    };
    let threads = threads.clamp(1, jobs.len().max(1));
    if threads == 1 {
        jobs.into_iter().for_each(run);
    } else {
        let mut shares: Vec<Vec<InitialBlock>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, job) in jobs.drain(..).enumerate() {
            shares[i % threads].push(job);
        }
        std::thread::scope(|scope| {
            for share in shares {
                let run = &run;
                scope.spawn(move || share.into_iter().for_each(run));
            }
        });
    }
}

/// How a parameter's initial values are drawn, from the seed and its (role, layer) alone.
enum InitialValues {
    /// Every element the same (norm scales 1, norm shifts and biases 0).
    Constant(f32),
    /// Normal with mean 0 and standard deviation `std`, by Box-Muller from the uniforms of one
    /// SplitMix64 seeded with `seed` (two draws per element).
    Normal { seed: u64, std: f64 },
}

impl InitialValues {
    fn of(seed: u64, buffer: &Buffer, layers: u32) -> Self {
        use TensorRole as R;
        match buffer.role {
            R::NormScale1 | R::NormScale2 | R::FinalNormScale => return InitialValues::Constant(1.0),
            R::NormShift1 | R::NormShift2 | R::FinalNormShift => return InitialValues::Constant(0.0),
            // The untied classifier is drawn like the embedding: N(0, 0.02).
            R::QueryBias | R::KeyBias | R::ValueBias | R::ProjectionBias | R::Fc1Bias | R::Fc2Bias => {
                return InitialValues::Constant(0.0)
            }
            _ => {}
        }
        let std = match buffer.role {
            R::ProjectionWeight | R::Fc2Weight => 0.02 / (2.0 * f64::from(layers.max(1))).sqrt(),
            _ => 0.02,
        };
        let layer = buffer.layer.map_or(0xFFFF, u64::from);
        InitialValues::Normal { seed: seed ^ (u64::from(buffer.role.code()) << 32) ^ (layer << 48) ^ 0x9E37_79B9, std }
    }

    /// Writes every byte of a block of whole rows (`per_row` elements each) from element `first`
    /// on: the bf16 values into `values`, and the optimizer state's rows into `state` (the f32
    /// master weight = the bf16 value widened, then m = 0 and v = 0).
    fn fill(&self, first: usize, per_row: usize, values: &mut [u8], state: &mut [u8]) {
        state.fill(0);
        let count = values.len() / 2;
        let mut put = |i: usize, value: f32| {
            let rounded = bf16::from_f32(value);
            values[2 * i..2 * i + 2].copy_from_slice(&rounded.to_le_bytes());
            let at = (i / per_row) * per_row * 12 + (i % per_row) * 4;
            state[at..at + 4].copy_from_slice(&rounded.to_f32().to_le_bytes());
        };
        match *self {
            InitialValues::Constant(value) => (0..count).for_each(|i| put(i, value)),
            InitialValues::Normal { seed, std } => {
                let mut rng = SplitMix64::jumped(seed, 2 * first as u64);
                let mut uniform = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                for i in 0..count {
                    // Box-Muller: one normal from two uniforms in (0, 1].
                    let u1 = 1.0 - uniform();
                    let u2 = uniform();
                    put(i, ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * std) as f32);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memo_plan_core::plan::Place;

    #[test]
    fn the_learning_rate_warms_up_linearly() {
        let adamw = AdamW { lr: 8e-4, warmup_steps: 4, ..AdamW::default() };
        let expected = [2e-4, 4e-4, 6e-4, 8e-4, 8e-4];
        for (step, want) in (1..=5).zip(expected) {
            assert!((adamw.lr_at(step) - want).abs() <= 1e-10, "step {step}: {} vs {want}", adamw.lr_at(step));
        }
        assert_eq!(AdamW { warmup_steps: 0, ..adamw }.lr_at(1), 8e-4);
    }

    /// Rank-aware initialisation: every rank's shard is the matching slice of the `t = 1`
    /// tensor (`spec/tensor-parallel.md` §2), padding rows zero, and the optimizer state's master
    /// weights are its values.
    #[test]
    fn every_ranks_shard_is_the_matching_slice_of_the_whole_tensor() {
        let (layers, vocab) = (2, 10);
        for (role, full_rows, full_per_row) in [
            (TensorRole::QueryWeight, 8, 6),
            (TensorRole::Fc1Bias, 1, 12),
            (TensorRole::Fc2Weight, 5, 12),
            (TensorRole::Embedding, vocab, 4),
            (TensorRole::NormScale2, 1, 6),
        ] {
            let buffer = |rows: u64, per_row: u64| Buffer {
                kind: BufferKind::Parameter,
                role,
                layer: Some(1),
                slot: 0,
                rows,
                first_row: 0,
                row_bytes: 2 * per_row,
                place: Place::Device { offset: 0 },
            };
            let whole = buffer(full_rows, full_per_row);
            let (mut full, mut full_state) = (Vec::new(), Vec::new());
            draw_parameter_and_state(3, &whole, layers, Shard::Whole, 2, &mut full, &mut full_state);
            for t in [2u64, 3, 4] {
                let layout = ShardLayout::gpt(vocab);
                let (rows, per_row) = match Shard::of(role, 0, t, &layout) {
                    Shard::Rows { .. } if full_rows % t == 0 => (full_rows / t, full_per_row),
                    Shard::Columns { .. } if full_per_row % t == 0 => (full_rows, full_per_row / t),
                    Shard::VocabRows { .. } => (vocab.div_ceil(t), full_per_row),
                    Shard::Whole => (full_rows, full_per_row),
                    _ => continue,
                };
                let shard_buffer = buffer(rows, per_row);
                let mut shards = Vec::new();
                for rank in 0..t {
                    let (mut bytes, mut state) = (Vec::new(), Vec::new());
                    let shard = Shard::of(role, rank, t, &layout);
                    draw_parameter_and_state(3, &shard_buffer, layers, shard, 3, &mut bytes, &mut state);
                    for (row, row_state) in state.chunks(per_row as usize * 12).enumerate() {
                        for column in 0..per_row as usize {
                            let at = (row * per_row as usize + column) * 2;
                            let value = bf16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32();
                            let master = f32::from_le_bytes(row_state[4 * column..4 * column + 4].try_into().unwrap());
                            assert_eq!(master.to_bits(), value.to_bits(), "{role:?} t {t} rank {rank}");
                        }
                    }
                    if let Shard::VocabRows { .. } = shard {
                        let held = vocab.saturating_sub(rank * rows).min(rows);
                        let padding = &bytes[(held * per_row * 2) as usize..];
                        assert!(padding.iter().all(|&b| b == 0), "{role:?} t {t} rank {rank}: padding is zero");
                    }
                    shards.push(bytes);
                }
                let reassembled = Shard::reassemble(role, &shard_buffer, &layout, 2, &shards).unwrap();
                assert_eq!(reassembled, full, "{role:?} t {t}");
                if !matches!(role, TensorRole::NormScale2 | TensorRole::Fc1Bias) && t > 1 {
                    assert_ne!(shards[0], shards[1], "{role:?} t {t}: ranks hold different slices");
                }
            }
        }
    }

    /// Drawing in blocks on several threads gives the bytes of one generator drawn element by
    /// element (what initialisation did before it was parallel, and what checkpoints hold).
    #[test]
    fn initial_values_drawn_in_blocks_equal_one_by_one() {
        let layers = 3;
        for (role, rows, row_bytes) in [
            (TensorRole::Fc1Weight, 700, 2 * 1000),
            (TensorRole::QueryWeight, 3, 2 * 5),
            (TensorRole::KeyBias, 1, 2 * 9),
        ] {
            let buffer = Buffer {
                kind: BufferKind::Parameter,
                role,
                layer: Some(1),
                slot: 0,
                rows,
                first_row: 0,
                row_bytes,
                place: Place::Device { offset: 0 },
            };
            let drawn = |threads: usize, reused: &mut (Vec<u8>, Vec<u8>)| {
                draw_parameter_and_state(7, &buffer, layers, Shard::Whole, threads, &mut reused.0, &mut reused.1);
                reused.clone()
            };
            let one_thread = drawn(1, &mut (Vec::new(), Vec::new()));
            assert_eq!(drawn(5, &mut (Vec::new(), Vec::new())), one_thread, "{role:?}");
            // Buffers that held other bytes, longer or shorter: every byte is rewritten.
            let (len, state_len) = (one_thread.0.len(), one_thread.1.len());
            for garbage in [1, 2 * len + 3].map(|n| (vec![0xA5u8; n], vec![0x5Au8; n * 6])) {
                let mut reused = garbage;
                assert_eq!(drawn(3, &mut reused), one_thread, "{role:?}, reused buffers");
                assert_eq!((reused.0.len(), reused.1.len()), (len, state_len));
            }
            let elements = (rows * row_bytes / 2) as usize;
            let reference: Vec<f32> = match InitialValues::of(7, &buffer, layers) {
                InitialValues::Constant(value) => vec![value; elements],
                InitialValues::Normal { seed, std } => {
                    let mut rng = SplitMix64::new(seed);
                    let mut uniform = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                    (0..elements)
                        .map(|_| {
                            let u1 = 1.0 - uniform();
                            let u2 = uniform();
                            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * std) as f32
                        })
                        .collect()
                }
            };
            let bytes: Vec<u8> = reference.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect();
            assert_eq!(one_thread.0, bytes, "{role:?}");
            let per_row = (row_bytes / 2) as usize;
            for (row, state) in one_thread.1.chunks(per_row * 12).enumerate() {
                for column in 0..per_row {
                    let master = f32::from_le_bytes(state[4 * column..4 * column + 4].try_into().unwrap());
                    assert_eq!(master, bf16::from_f32(reference[row * per_row + column]).to_f32());
                }
                assert!(state[per_row * 4..].iter().all(|&b| b == 0), "m and v start at zero");
            }
            if role != TensorRole::KeyBias {
                assert!(reference.iter().any(|&v| v != 0.0), "{role:?}: drawn values");
            }
        }
    }
}
