//! The planner's front door: model + layout + machine + strategy -> a placed [`Plan`] and what it
//! costs (`ARCHITECTURE.md`, "The data path"). Each strategy goes through the same machinery: α (`swap`), the
//! instruction stream (`schedule`), bi-level placement (`bilevel`), the timeline (`simulate`).
//!
//! A plan is made whether or not it fits; [`PlanReport::fits`] says, and [`Misfit`] says by how
//! much and what would make it fit.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::bilevel::{self, PlacementError};
use crate::cost::{self, ContextParallelTime, CostError, Mfu};
use crate::model::{Hardware, Interconnect, ModelConfig, ModelError, Nodes, OptimizerSharding, Parallelism};
use crate::plan::scratch::{NoScratch, ScratchSizer};
use crate::plan::{Action, Op};
use crate::plan::{BufferKind, Plan, Provenance, RankProgram, Strategy, TensorRole};
use crate::schedule::{self, ScheduleError, ScheduleOptions};
use crate::simulate::{self, Timeline};
use crate::swap::{self, AlphaBound, SwapError, SwapFraction, SwapOptions};

mod data_parallel;
pub use data_parallel::DataParallelReport;

/// What to plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRequest {
    /// The model and sequence.
    pub model: ModelConfig,
    /// The parallel layout; the plan is one GPU's.
    pub parallel: Parallelism,
    /// The machine.
    pub hardware: Hardware,
    /// The links between the GPUs of a tensor-parallel group ([`Interconnect::for_hardware`] by
    /// default).
    pub interconnect: Interconnect,
    /// The nodes the `d x t` ranks span and the network between them ([`Nodes::single`] by
    /// default): where each data-parallel collective runs.
    pub nodes: Nodes,
    /// How the data-parallel ranks share the model state (ZeRO 0 by default).
    pub sharding: OptimizerSharding,
    /// How activations are kept.
    pub strategy: Strategy,
    /// For `memo`: use this α instead of solving MEMO's LP.
    pub forced_alpha: Option<f64>,
    /// Node budget of each arena solve.
    pub budget_nodes: u64,
    /// The most memory planning may take, in bytes, as [`estimate`] reckons it: a request over
    /// it is refused before the step is built ([`PlanError::TooLarge`]).
    /// [`DEFAULT_PLAN_MEMORY_LIMIT`] by default.
    pub memory_limit_bytes: u64,
}

impl PlanRequest {
    /// A request with the default node budget and α from the LP.
    pub fn new(model: ModelConfig, parallel: Parallelism, hardware: Hardware, strategy: Strategy) -> Self {
        let interconnect = Interconnect::for_hardware(&hardware);
        let nodes = Nodes::single(&hardware);
        PlanRequest {
            model,
            parallel,
            hardware,
            interconnect,
            nodes,
            sharding: OptimizerSharding::Replicated,
            strategy,
            forced_alpha: None,
            budget_nodes: PLAN_BUDGET_NODES,
            memory_limit_bytes: DEFAULT_PLAN_MEMORY_LIMIT,
        }
    }
}

/// The most memory a plan may take to make by default: 4 GiB (by [`estimate`]: about 27,000
/// layers of 7B under memo at t = 8). A million-token step of a 7B model is some 10,000
/// instructions; a model with tens of thousands of layers is refused up front instead of running
/// for many minutes (`memo plan --plan-memory` raises the limit).
pub const DEFAULT_PLAN_MEMORY_LIMIT: u64 = 4 << 30;

/// Bytes of planner memory per instruction of the step, in [`estimate`]: the instruction itself
/// (its arguments on the heap), its span in the timeline, its lifetimes and its share of the
/// checker's state. Peak resident memory of `memo plan --strategy memo` (7B, 4K tokens, t = 8,
/// everything fitting) was 45 MB at 500 layers and 161 MB at 2,000 (140,232 and 561,732
/// instructions; 58,948 and 235,948 buffers): about 220 bytes per instruction with its share of
/// buffers, here rounded up with room to spare.
pub const PLAN_BYTES_PER_INSTRUCTION: u64 = 384;

/// Bytes of planner memory per buffer of the step, in [`estimate`] (the buffer, its lifetime, its
/// level-1 and level-2 requests, the checker's extents and live ranges).
pub const PLAN_BYTES_PER_BUFFER: u64 = 256;

/// Bytes [`estimate`] adds for the placement's overlap graphs, which stop growing at 40 million
/// pairs (`arena::OVERLAP_PAIR_LIMIT`): keep-all at 500 layers (4,000-odd level-2 requests
/// all overlapping) peaked at 323 MB for 57,066 instructions.
pub const PLAN_GRAPH_BYTES: u64 = 512 << 20;

/// How large a step's plan is, before it is made: [`estimate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanSize {
    /// Instructions of the step (of one program: with `c > 1` each context rank's is as long).
    pub instructions: u64,
    /// Buffers of the step.
    pub buffers: u64,
    /// The memory planning takes, about ([`PLAN_BYTES_PER_INSTRUCTION`] per instruction of
    /// every context rank's program, [`PLAN_BYTES_PER_BUFFER`] per buffer, and
    /// [`PLAN_GRAPH_BYTES`]).
    pub bytes: u64,
}

/// The size of the step a request asks for, from the schedules of two and three of its layers (a
/// step is its embedding and classifier, its first and last layer, and the same instructions for
/// every layer between), without building the whole step: the instructions and buffers are exact
/// when every middle layer adds the same count, as the schedule's do. `alpha_fixed` as [`schedule::alpha_to_fixed`] gives it.
pub fn estimate(
    model: &ModelConfig,
    parallel: &Parallelism,
    strategy: Strategy,
    alpha_fixed: u64,
) -> Result<PlanSize, PlanError> {
    let options = ScheduleOptions { strategy, alpha_fixed };
    let counts = |layers: u32| -> Result<(u64, u64), PlanError> {
        let small = ModelConfig { layers, ..model.clone() };
        let schedule = schedule::build(&small, parallel, &options)?;
        Ok((schedule.instructions.len() as u64, schedule.buffers.len() as u64))
    };
    let (instructions, buffers) = if model.layers <= 3 {
        counts(model.layers)?
    } else {
        // Two layers are the first and the last; the third is a middle one, as every further one.
        let (two, three) = (counts(2)?, counts(3)?);
        let extra = u64::from(model.layers - 2);
        let extend =
            |at_two: u64, at_three: u64| at_two.saturating_add(at_three.saturating_sub(at_two).saturating_mul(extra));
        (extend(two.0, three.0), extend(two.1, three.1))
    };
    // With context parallelism the plan holds one program per context rank
    // (`spec/context-parallel.md`), each as long as the one counted.
    let bytes = instructions
        .saturating_mul(parallel.context.max(1))
        .saturating_mul(PLAN_BYTES_PER_INSTRUCTION)
        .saturating_add(buffers.saturating_mul(PLAN_BYTES_PER_BUFFER))
        .saturating_add(PLAN_GRAPH_BYTES);
    Ok(PlanSize { instructions, buffers, bytes })
}

/// Node budget of each placement problem of a plan. Level-1 and level-2 problems have tens to a
/// few hundred requests; they settle in far fewer nodes, or the greedy placement stands.
pub const PLAN_BUDGET_NODES: u64 = 200_000;

/// Why a plan could not be made.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanError {
    /// The model, layout or machine is invalid.
    Model(ModelError),
    /// α could not be chosen.
    Swap(SwapError),
    /// The schedule could not be built.
    Schedule(ScheduleError),
    /// The placement failed.
    Placement(PlacementError),
    /// The cost model failed.
    Cost(CostError),
    /// A forced α with a strategy that has no α.
    AlphaWithoutMemo {
        /// The strategy asked for.
        strategy: Strategy,
    },
    /// Planning would take more memory than the request allows ([`PlanRequest::memory_limit_bytes`]).
    TooLarge {
        /// The layers of the model.
        layers: u32,
        /// What planning would take.
        size: PlanSize,
        /// The limit.
        limit_bytes: u64,
    },
}

macro_rules! from_error {
    ($($variant:ident($ty:ty)),*) => {
        $(impl From<$ty> for PlanError {
            fn from(error: $ty) -> Self {
                PlanError::$variant(error)
            }
        })*
    };
}
from_error!(Model(ModelError), Swap(SwapError), Schedule(ScheduleError), Placement(PlacementError), Cost(CostError));

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Model(e) => e.fmt(f),
            PlanError::Swap(e) => e.fmt(f),
            PlanError::Schedule(e) => e.fmt(f),
            PlanError::Placement(e) => e.fmt(f),
            PlanError::Cost(e) => e.fmt(f),
            PlanError::AlphaWithoutMemo { strategy } => write!(
                f,
                "a forced alpha applies to the memo strategy only, not {}: drop --alpha or use --strategy memo",
                strategy.name()
            ),
            PlanError::TooLarge { layers, size, limit_bytes } => write!(
                f,
                "planning {layers} layers would take about {} of memory ({} bytes: {} instructions, {} buffers), \
                 over the limit of {} ({limit_bytes} bytes); plan fewer layers, \
                 or raise the limit (memo plan --plan-memory) if this machine has the memory",
                Gib(size.bytes),
                size.bytes,
                size.instructions,
                size.buffers,
                Gib(*limit_bytes)
            ),
        }
    }
}

/// Bytes in GiB with one decimal, for messages.
struct Gib(u64);

impl fmt::Display for Gib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tenths = (u128::from(self.0) * 10 + (1 << 29)) >> 30;
        write!(f, "{}.{} GiB", tenths / 10, tenths % 10)
    }
}

impl core::error::Error for PlanError {}

/// A plan and what it costs.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanReport {
    /// The plan.
    pub plan: Plan,
    /// α and the constraint that bound it (`memo` and `full-swap`).
    pub swap: Option<SwapFraction>,
    /// The simulated step.
    pub timeline: Timeline,
    /// MFU of the simulated step, both attention conventions.
    pub mfu: Mfu,
    /// Distinct level-1 placement problems solved.
    pub level1_problems: u32,
    /// `None` when the plan fits the device and the host; else by how much it does not.
    pub misfit: Option<Misfit>,
    /// The data-parallel ranks' sharding of the model state and their collectives.
    pub data_parallel: DataParallelReport,
    /// The context-parallel ring attention's transfers and what of them the attention does not
    /// hide (all zero for `c = 1`).
    pub context_parallel: ContextParallelTime,
}

impl PlanReport {
    /// Whether the plan fits the GPU's memory and the host memory of its share of the node.
    pub fn fits(&self) -> bool {
        self.misfit.is_none()
    }

    /// Bytes of device memory each GPU uses: the plan's one arena, less the model state the
    /// data-parallel ranks shard away ([`DataParallelReport::saved_bytes`]).
    pub fn device_bytes(&self) -> u64 {
        self.plan.totals.arena_bytes.saturating_sub(self.data_parallel.saved_bytes)
    }

    /// The live-bytes lower bound of the arena, less the sharded-away model state (live over the
    /// whole step, so it is in the bound in full).
    pub fn arena_lower_bound_bytes(&self) -> u64 {
        self.plan.totals.arena_lower_bound_bytes.saturating_sub(self.data_parallel.saved_bytes)
    }

    /// Parameters, gradients and optimizer state each GPU holds after the sharding.
    pub fn model_state_bytes(&self) -> u64 {
        self.plan.totals.parameter_bytes.saturating_sub(self.data_parallel.saved_bytes)
    }

    /// The estimated step: the plan's timeline, the ring attention's exposed transfers and the
    /// data-parallel collectives after it.
    pub fn step_time_s(&self) -> f64 {
        self.timeline.step_time_s + self.context_parallel.exposed_s() + self.data_parallel.time.total_s()
    }
}

/// How a plan misses the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Misfit {
    /// Device bytes above the GPU's memory (0 if the arena fits).
    pub device_excess_bytes: u64,
    /// Host bytes above this GPU's share of host memory (0 if the swapped data fits).
    pub host_excess_bytes: u64,
}

/// A stage of making one plan, in the order [`plan_observed`] enters them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// α from MEMO's LP (`memo`, `full-swap`) and the checks of the request.
    Alpha,
    /// The instruction stream (`schedule`).
    Schedule,
    /// Bi-level placement (`bilevel`).
    Placement,
    /// The timeline (`simulate`).
    Simulate,
}

impl Stage {
    /// The stage's name in progress reports.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Alpha => "alpha",
            Stage::Schedule => "schedule",
            Stage::Placement => "placement",
            Stage::Simulate => "simulate",
        }
    }
}

/// What the planner is about to do, for a caller that reports progress (a `no_std` observer:
/// any `FnMut(Progress)`). Cheap to make; the planner calls the observer a few times per plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Planning `strategy` at `seq_len` tokens, entering `stage`. `instructions` and `buffers`:
    /// the schedule's sizes once it is built (0 before).
    Stage {
        /// The strategy planned.
        strategy: Strategy,
        /// Its sequence length.
        seq_len: u64,
        /// The stage entered.
        stage: Stage,
        /// Instructions of the schedule (0 until it is built).
        instructions: usize,
        /// Buffers of the schedule (0 until it is built).
        buffers: usize,
    },
    /// A longest-sequence search ([`max_seq_observed`]) is about to plan `seq_len` tokens, its
    /// `probe`-th plan (from 1).
    Probe {
        /// The strategy searched.
        strategy: Strategy,
        /// The length probed.
        seq_len: u64,
        /// Plans made by this search so far, this one included.
        probe: u32,
    },
}

/// Plans one strategy for a backend whose kernels need no scratch ([`NoScratch`]).
pub fn plan(request: &PlanRequest) -> Result<PlanReport, PlanError> {
    plan_with(request, &NoScratch, &mut |_| {})
}

/// [`plan`], telling `observe` each stage it enters.
pub fn plan_observed(request: &PlanRequest, observe: &mut dyn FnMut(Progress)) -> Result<PlanReport, PlanError> {
    plan_with(request, &NoScratch, observe)
}

/// Plans one strategy; every launch for which `scratch` (the backend's, asked before planning)
/// wants bytes gets a scratch transient of that size as its trailing argument
/// ([`schedule::add_scratch`]), placed with the other buffers.
pub fn plan_with_scratch(request: &PlanRequest, scratch: &dyn ScratchSizer) -> Result<PlanReport, PlanError> {
    plan_with(request, scratch, &mut |_| {})
}

/// The planner: [`plan_with_scratch`] telling `observe` each stage it enters.
pub fn plan_with(
    request: &PlanRequest,
    scratch: &dyn ScratchSizer,
    observe: &mut dyn FnMut(Progress),
) -> Result<PlanReport, PlanError> {
    let PlanRequest {
        model,
        parallel,
        hardware,
        interconnect,
        nodes,
        sharding,
        strategy,
        forced_alpha,
        budget_nodes,
        memory_limit_bytes,
    } = request;
    let mut stage = |stage: Stage, instructions: usize, buffers: usize| {
        observe(Progress::Stage { strategy: *strategy, seq_len: model.seq_len, stage, instructions, buffers })
    };
    stage(Stage::Alpha, 0, 0);
    model.validate()?;
    parallel.validate_for(model)?;
    hardware.validate()?;
    // The ring of c > 1 context-parallel ranks needs the node's links as much as t > 1 does.
    interconnect.validate_for(parallel.tensor.max(parallel.context))?;
    // One tensor-parallel group sits wherever its caller puts it (the CPU trainer's ranks are
    // threads of one host); `memo plan` holds a single group to a node itself.
    if parallel.data > 1 || parallel.context > 1 || nodes.count != 1 {
        nodes.validate_for(parallel, hardware)?;
    }
    let swap = match strategy {
        Strategy::Memo => Some(swap::swap_fraction(
            model,
            parallel,
            hardware,
            &SwapOptions { forced_alpha: *forced_alpha, ..SwapOptions::default() },
        )?),
        _ if forced_alpha.is_some() => return Err(PlanError::AlphaWithoutMemo { strategy: *strategy }),
        Strategy::FullSwap => Some(swap::swap_fraction(model, parallel, hardware, &SwapOptions::full_swap())?),
        Strategy::KeepAll | Strategy::FullRecompute => None,
    };
    let (alpha, alpha_bound) = swap.map_or((0.0, AlphaBound::None), |s| (s.alpha, s.bound));
    let alpha_fixed = schedule::alpha_to_fixed(alpha);
    // Refused before the step is built, when building it would take too much memory.
    let size = estimate(model, parallel, *strategy, alpha_fixed)?;
    if size.bytes > *memory_limit_bytes {
        return Err(PlanError::TooLarge { layers: model.layers, size, limit_bytes: *memory_limit_bytes });
    }
    stage(Stage::Schedule, 0, 0);
    let options = ScheduleOptions { strategy: *strategy, alpha_fixed };
    let mut schedule = schedule::build(model, parallel, &options)?;
    schedule::add_scratch(&mut schedule, model, parallel, scratch)?;
    // Context parallelism: one program per context rank (`spec/context-parallel.md`). They
    // differ only in the ring attention's row ranges, so they touch the same buffers at the same
    // instructions and one placement (context rank 0's lifetimes) serves them all; a difference
    // in anything else is a planner bug, refused here rather than placed wrongly.
    let mut rank_programs = Vec::new();
    for context_rank in 1..parallel.context.max(1) {
        let mut other = schedule::build_for_context_rank(model, parallel, &options, context_rank)?;
        schedule::add_scratch(&mut other, model, parallel, scratch)?;
        if other.buffers != schedule.buffers || other.blocks != schedule.blocks || other.events != schedule.events {
            return Err(PlanError::Schedule(ScheduleError::ContextRanksDiffer { context_rank }));
        }
        let rank = context_rank.saturating_mul(parallel.tensor.max(1));
        let rank = u32::try_from(rank).map_err(|_| ModelError::Overflow { what: "global rank" })?;
        rank_programs.push(RankProgram { rank, instructions: other.instructions });
    }
    stage(Stage::Placement, schedule.instructions.len(), schedule.buffers.len());
    let placement = bilevel::place(&schedule, *budget_nodes)?;
    let plan = Plan {
        provenance: Provenance {
            model: model.clone(),
            parallel: *parallel,
            hardware: hardware.clone(),
            interconnect: *interconnect,
            strategy: *strategy,
            alpha,
            alpha_bound,
            swapped_rows: schedule.swapped_rows,
            level1_forward: placement.level1_forward,
            level1_backward: placement.level1_backward,
            level2: placement.level2,
        },
        buffers: placement.buffers,
        events: schedule.events,
        instructions: schedule.instructions,
        rank_programs,
        totals: placement.totals,
    };
    stage(Stage::Simulate, plan.instructions.len(), plan.buffers.len());
    let timeline = simulate::simulate(&plan)?;
    let data_parallel = DataParallelReport::of(&plan, parallel, nodes, *sharding, interconnect)?;
    let ring_link = nodes.context_parallel_link(parallel, hardware, interconnect);
    // Every attention of the plan runs the ring: the forward once per layer and again per layer
    // that full recompute reruns (each starts with `attention_ring_init`), the backward once per
    // layer (each ends with one `to_bf16` of `dq_acc`). With c = 1 there are none, and the time is 0.
    let launches = |wanted: &dyn Fn(&crate::plan::Launch) -> bool| {
        let count = plan.instructions.iter().filter(|i| matches!(&i.action, Action::Launch(l) if wanted(l))).count();
        count as u64
    };
    let dq_acc = |l: &crate::plan::Launch| {
        l.args.first().and_then(|a| plan.buffer(a.region.buffer)).map(|b| b.role)
            == Some(crate::plan::TensorRole::QueryGradientAccumulator)
    };
    let context_parallel = cost::context_parallel_time(
        model,
        parallel,
        hardware,
        &ring_link,
        launches(&|l| l.op == Op::AttentionRingInit),
        launches(&|l| l.op == Op::ToBf16 && dq_acc(l)),
    )?;
    let step_time_s = timeline.step_time_s + context_parallel.exposed_s() + data_parallel.time.total_s();
    let mfu = cost::mfu(model, parallel, hardware, step_time_s.max(f64::MIN_POSITIVE))?;
    let device_bytes = plan.totals.arena_bytes.saturating_sub(data_parallel.saved_bytes);
    let device_excess_bytes = device_bytes.saturating_sub(hardware.device_memory_bytes);
    let host_excess_bytes = plan.totals.host_bytes.saturating_sub(hardware.host_memory_per_gpu_bytes());
    let misfit =
        (device_excess_bytes > 0 || host_excess_bytes > 0).then_some(Misfit { device_excess_bytes, host_excess_bytes });
    Ok(PlanReport {
        plan,
        swap,
        timeline,
        mfu,
        level1_problems: placement.level1_problems,
        misfit,
        data_parallel,
        context_parallel,
    })
}

/// The longest sequence a strategy fits, found by bisection over multiples of `granularity`
/// tokens (itself a multiple of `t`), with the plan at that length.
#[derive(Clone, Debug, PartialEq)]
pub struct MaxSequence {
    /// The strategy.
    pub strategy: Strategy,
    /// The longest fitting sequence, `None` when not even `granularity` tokens fit.
    pub seq_len: Option<u64>,
    /// Plans made during the search.
    pub plans_made: u32,
    /// The plan at `seq_len`.
    pub report: Option<PlanReport>,
    /// What stops the next length of the grid, when the search found one that does not fit.
    pub limit: Option<SequenceLimit>,
}

/// Why the shortest length past the longest fitting one does not fit: by how much, in which
/// memory, and the tensors that hold the most of it.
#[derive(Clone, Debug, PartialEq)]
pub struct SequenceLimit {
    /// The length that does not fit.
    pub seq_len: u64,
    /// By how much, on the device and on the host (`None`: the length could not even be planned,
    /// a size past 64 bits).
    pub misfit: Option<Misfit>,
    /// On the device: the skeletal tensor (by role, summed over the layers and rounding
    /// buffers) that holds the most bytes, and those bytes.
    pub device_kept: Option<(TensorRole, u64)>,
    /// On the device: the largest single buffer outside the model state (its role and bytes).
    pub device_largest: Option<(TensorRole, u64)>,
    /// On the host: the swapped tensor (by role, summed over the layers) that holds the most.
    pub host_kept: Option<(TensorRole, u64)>,
    /// The model state one GPU holds (after any sharding over the data-parallel ranks): what no
    /// shorter sequence frees, and past the device's memory alone when nothing fits.
    pub model_state_bytes: Option<u64>,
}

impl SequenceLimit {
    fn of(seq_len: u64, report: Option<&PlanReport>) -> Self {
        let Some(report) = report else {
            return SequenceLimit {
                seq_len,
                misfit: None,
                device_kept: None,
                device_largest: None,
                host_kept: None,
                model_state_bytes: None,
            };
        };
        let buffers = &report.plan.buffers;
        let bytes = |b: &crate::plan::Buffer| b.rows.saturating_mul(b.row_bytes);
        // The role with the most bytes among `kinds`, summed.
        let most = |kinds: &[BufferKind]| {
            let mut sums: Vec<(TensorRole, u64)> = Vec::new();
            for b in buffers.iter().filter(|b| kinds.contains(&b.kind)) {
                match sums.iter_mut().find(|(role, _)| *role == b.role) {
                    Some((_, sum)) => *sum = sum.saturating_add(bytes(b)),
                    None => sums.push((b.role, bytes(b))),
                }
            }
            sums.into_iter().max_by_key(|&(role, sum)| (sum, core::cmp::Reverse(role)))
        };
        let state = [BufferKind::Parameter, BufferKind::Gradient, BufferKind::OptimizerState, BufferKind::HostSlot];
        let device_largest = buffers
            .iter()
            .filter(|b| !state.contains(&b.kind))
            .map(|b| (b.role, bytes(b)))
            .max_by_key(|&(role, size)| (size, core::cmp::Reverse(role)));
        SequenceLimit {
            seq_len,
            misfit: report.misfit.clone(),
            device_kept: most(&[BufferKind::Skeletal, BufferKind::RoundingBuffer]),
            device_largest,
            host_kept: most(&[BufferKind::HostSlot]),
            model_state_bytes: Some(report.model_state_bytes()),
        }
    }
}

/// Finds the longest sequence `request.strategy` fits, searching multiples of `granularity` up to
/// `limit` tokens. Assumes fitting is monotone in the sequence length (memory grows with it). An
/// error planning `granularity` tokens is returned; at longer lengths one counts as "does not fit".
pub fn max_seq(request: &PlanRequest, granularity: u64, limit: u64) -> Result<MaxSequence, PlanError> {
    max_seq_observed(request, granularity, limit, &mut |_| {})
}

/// [`max_seq`], telling `observe` each length it probes and each stage of its plans.
pub fn max_seq_observed(
    request: &PlanRequest,
    granularity: u64,
    limit: u64,
    observe: &mut dyn FnMut(Progress),
) -> Result<MaxSequence, PlanError> {
    let step = granularity.max(1);
    let mut attempt = request.clone();
    let mut made = 0u32;
    // Ok(fitting plan), or Err(the plan that does not fit, if it could be made).
    let mut try_len = |tokens: u64| -> Result<Result<PlanReport, Option<PlanReport>>, PlanError> {
        attempt.model.seq_len = tokens;
        made += 1;
        observe(Progress::Probe { strategy: attempt.strategy, seq_len: tokens, probe: made });
        match plan_observed(&attempt, observe) {
            Ok(report) if report.fits() => Ok(Ok(report)),
            Ok(report) => Ok(Err(Some(report))),
            // Only the length changed since the shortest one planned: a length too long to plan
            // (a size or FLOP count past 64 bits) does not fit either.
            Err(_) if tokens > step => Ok(Err(None)),
            Err(error) => Err(error),
        }
    };
    // The shortest length plans (or its error is the request's own), so later errors are lengths'.
    let (mut best, mut stop) = match try_len(step)? {
        Ok(report) => (Some(report), None),
        Err(report) => (None, Some(SequenceLimit::of(step, report.as_ref()))),
    };
    // Invariant: lo * step fits (or lo = 0), hi * step does not (or hi = limit / step + 1).
    let (mut lo, mut hi) = if best.is_some() { (1u64, limit / step + 1) } else { (0, 1) };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match try_len(mid * step)? {
            Ok(report) => {
                lo = mid;
                best = Some(report);
            }
            Err(report) => {
                hi = mid;
                stop = Some(SequenceLimit::of(mid * step, report.as_ref()));
            }
        }
    }
    Ok(MaxSequence {
        strategy: request.strategy,
        seq_len: (lo > 0).then_some(lo * step),
        plans_made: made,
        report: best,
        limit: stop,
    })
}

/// Plans every strategy for the same request (its `strategy` is ignored).
pub fn plan_all(request: &PlanRequest) -> Result<Vec<PlanReport>, PlanError> {
    Strategy::ALL
        .into_iter()
        .map(|strategy| plan(&PlanRequest { strategy, forced_alpha: None, ..request.clone() }))
        .collect()
}

/// The longest sequence [`longest_sequence`] searches up to: 64M tokens.
pub const MAX_SEQ_LIMIT: u64 = 64 << 20;

/// The step of the longest-sequence search for a layout whose sequences are multiples of
/// `multiple` ([`Parallelism::seq_len_multiple`]: `t`, or `2 c t` with context parallelism): 1K
/// tokens, or `1024 * multiple` when `multiple` does not divide 1024 (saturating).
pub fn max_seq_granularity(multiple: u64) -> u64 {
    let multiple = multiple.max(1);
    if 1024 % multiple == 0 {
        1024
    } else {
        multiple.saturating_mul(1024)
    }
}

/// The longest sequence `request.strategy` fits, on the grid every caller uses
/// ([`max_seq_granularity`] up to [`MAX_SEQ_LIMIT`]): what `memo plan --max-seq` prints and what
/// the remedies of a misfit quote, from this one computation.
pub fn longest_sequence(request: &PlanRequest) -> Result<MaxSequence, PlanError> {
    longest_sequence_observed(request, &mut |_| {})
}

/// [`longest_sequence`], telling `observe` each length it probes and each stage of its plans.
pub fn longest_sequence_observed(
    request: &PlanRequest,
    observe: &mut dyn FnMut(Progress),
) -> Result<MaxSequence, PlanError> {
    max_seq_observed(request, max_seq_granularity(request.parallel.seq_len_multiple()), MAX_SEQ_LIMIT, observe)
}

/// What would make a misfit fit, in words, for messages. `request` is the request `report` was
/// planned from; the "fewer tokens" remedy is [`longest_sequence`]'s answer (the search on the
/// same grid, below the request's length), so it agrees with `--max-seq`. It plans a dozen times
/// or so: call this once per report.
pub fn remedies(request: &PlanRequest, report: &PlanReport) -> Vec<String> {
    remedies_observed(request, report, &mut |_| {})
}

/// [`remedies`], telling `observe` each length its search probes and each stage of its plans.
pub fn remedies_observed(request: &PlanRequest, report: &PlanReport, observe: &mut dyn FnMut(Progress)) -> Vec<String> {
    use alloc::format;
    let mut out = Vec::new();
    let Some(misfit) = &report.misfit else { return out };
    let p = &report.plan.provenance;
    let granularity = max_seq_granularity(p.parallel.seq_len_multiple());
    // The request misses at its own length, so (fitting being monotone in the length, as the
    // search assumes) the answer lies below it: searching only there gives the same answer as
    // the whole grid in fewer plans (10 instead of 16 at 1M tokens).
    let below = request.model.seq_len.div_ceil(granularity).saturating_sub(1).saturating_mul(granularity);
    let longest = max_seq_observed(request, granularity, below.min(MAX_SEQ_LIMIT), observe);
    // The other remedies suggest a shorter sequence only where one fits: advice never says "plan a
    // shorter sequence" beside "fewer tokens will not do".
    let shorter = matches!(longest, Ok(MaxSequence { seq_len: Some(_), .. }));
    // Likewise a higher t only where the node has more GPUs (a group spans one node).
    let t = format!("a higher tensor-parallel degree than t = {}", p.parallel.tensor);
    let higher_t = (p.parallel.tensor < p.hardware.gpus_per_node).then_some(t.as_str());
    // Sharding the model state is offered only where it can cover the excess: a further ZeRO
    // stage over the data-parallel ranks there are, or more ranks (nodes) to shard it over (at
    // most all of the shardable state, as d grows).
    let dp = &report.data_parallel;
    // The sharding group: d, or d x c with context parallelism (DataParallelReport::ranks).
    let (d, stage) = (dp.ranks, request.sharding.stage());
    let group = if p.parallel.context > 1 {
        format!("d x c = {d} data-parallel x context-parallel ranks")
    } else {
        format!("d = {d} data-parallel ranks")
    };
    let excess = misfit.device_excess_bytes;
    let gradients_share = dp.plan_gradient_bytes.div_ceil(d.max(1)).saturating_add(dp.largest_gradient_bytes);
    let next_saves = match stage {
        0 => dp.plan_optimizer_bytes.saturating_sub(dp.plan_optimizer_bytes.div_ceil(d.max(1))),
        1 => dp.plan_gradient_bytes.saturating_sub(gradients_share),
        _ => 0,
    };
    let next_stage = format!(
        "--zero {} (shards the {} over the {group})",
        stage + 1,
        if stage == 0 { "optimizer state" } else { "gradients too" }
    );
    let zero = (d > 1 && stage < 2 && next_saves >= excess).then_some(next_stage.as_str());
    let nodes_save = match stage {
        0 => dp.plan_optimizer_bytes,
        1 => dp.optimizer_bytes,
        _ => dp.optimizer_bytes.saturating_add(dp.gradient_bytes.saturating_sub(dp.largest_gradient_bytes)),
    };
    let more_nodes = if stage == 0 {
        "more nodes with --zero 1 (each data-parallel rank holds 1/d of the optimizer state)"
    } else {
        "more nodes (--nodes: more data-parallel ranks to shard the model state over)"
    };
    let more_nodes = (nodes_save >= excess).then_some(more_nodes);
    // Context parallelism 2, 4 or 8 times wider: the data-parallel ranks turned into
    // context-parallel ones where d allows (the same GPUs, or fewer), else that many times the
    // GPUs on the nodes they need. The least that fits is offered, and only where that plan, made here, fits.
    let more_context = [2u64, 4, 8].into_iter().find_map(|factor| {
        let context = p.parallel.context.saturating_mul(factor);
        let d = p.parallel.data;
        // d ranks become d / factor (all of them, down to one, when d is below the factor).
        let data = if d.is_multiple_of(factor) || d < factor { (d / factor).max(1) } else { d };
        let parallel = Parallelism { context, data, ..p.parallel };
        let (gpus, per_node) = (parallel.gpus(), p.hardware.gpus_per_node.max(1));
        let count = if gpus <= per_node { 1 } else { gpus.div_ceil(per_node) };
        let candidate =
            PlanRequest { parallel, nodes: Nodes { count, ..request.nodes }, forced_alpha: None, ..request.clone() };
        let fits = plan_with(&candidate, &NoScratch, observe).is_ok_and(|r| r.fits());
        fits.then(|| format!("context parallelism (--cp {context} --dp {data} --nodes {count}: {gpus} GPUs)"))
    });
    // Every strategy holds the same model state: when it alone is past the device, no strategy fits.
    let other_strategy = (report.model_state_bytes() < p.hardware.device_memory_bytes).then_some("another strategy");
    if misfit.device_excess_bytes > 0 {
        let options = [
            shorter.then_some("a shorter sequence"),
            higher_t,
            zero,
            more_nodes,
            more_context.as_deref(),
            other_strategy,
        ];
        let mut line = format!(
            "device memory: {} needs {}, {} more than the GPU's {}",
            if report.data_parallel.saved_bytes > 0 { "the arena with the sharded model state" } else { "the arena" },
            binary_units(report.device_bytes()),
            units_and_bytes(misfit.device_excess_bytes),
            binary_units(p.hardware.device_memory_bytes),
        );
        if other_strategy.is_none() {
            line.push_str(&format!(
                "; the model state alone is {} per GPU, past the GPU's memory whatever the strategy",
                binary_units(report.model_state_bytes())
            ));
        }
        let options = one_of(&options);
        if !options.is_empty() {
            line.push_str(&format!("; try {options}"));
        }
        out.push(line);
    }
    if misfit.host_excess_bytes > 0 {
        let options = [
            shorter.then_some("a shorter sequence"),
            Some("more host memory"),
            higher_t,
            more_context.as_deref(),
            (p.strategy != Strategy::Memo).then_some("memo (which swaps only what fits)"),
        ];
        out.push(format!(
            "host memory: the swapped activations need {} per GPU, {} more than its share ({}) of the node's {}; \
             try {}",
            binary_units(report.plan.totals.host_bytes),
            units_and_bytes(misfit.host_excess_bytes),
            binary_units(p.hardware.host_memory_per_gpu_bytes()),
            binary_units(p.hardware.host_memory_per_node_bytes),
            one_of(&options)
        ));
    }
    match longest {
        Ok(MaxSequence { seq_len: Some(tokens), .. }) => out.push(format!(
            "fewer tokens: {} fits at most {tokens} tokens here (multiples of {granularity}; `--max-seq` searches the same)",
            p.strategy.name()
        )),
        Ok(MaxSequence { seq_len: None, .. }) => out.push(format!(
            "fewer tokens will not do: {} does not fit even {granularity} tokens here",
            p.strategy.name()
        )),
        // The request planned once already; a failure at another length has nothing to add.
        Err(_) => {}
    }
    out
}

/// A byte count in the largest binary unit that keeps it at or above 1, to two decimals (rounded
/// half up; integer arithmetic, so every platform prints the same): `1.88 GiB`; `512 B` below 1 KiB.
pub fn binary_units(count: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if count < 1024 {
        return alloc::format!("{count} B");
    }
    let mut unit = 0;
    while unit + 1 < UNITS.len() && count >> (10 * (unit + 1)) > 0 {
        unit += 1;
    }
    let scale = 1u128 << (10 * unit);
    let hundredths = (u128::from(count) * 100 + scale / 2) / scale;
    alloc::format!("{}.{:02} {}", hundredths / 100, hundredths % 100, UNITS[unit])
}

/// The given options as alternatives: `a, b or c`.
fn one_of(options: &[Option<&str>]) -> String {
    let given: Vec<&str> = options.iter().flatten().copied().collect();
    match given.split_last() {
        Some((last, [])) => String::from(*last),
        Some((last, rest)) => alloc::format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// `1.88 GiB (2013265920 bytes)`: the rounded figure and the exact count, for a shortfall that a
/// user may want to add exactly; `512 bytes` below 1 KiB.
fn units_and_bytes(count: u64) -> String {
    if count < 1024 {
        alloc::format!("{count} bytes")
    } else {
        alloc::format!("{} ({count} bytes)", binary_units(count))
    }
}

#[cfg(test)]
mod tests;
