//! `memo train --tensor-parallel T` with `T > 1`: tensor and sequence parallelism, `T` ranks as
//! threads, each with its own backend and arena (`spec/tensor-parallel.md`). On the CPU the ranks
//! are joined by an in-process group (`spec/backends.md` "CPU"); on NVIDIA GPUs (`--device
//! cuda[:N]`) rank `k` is device `N + k`, joined by NCCL with one unique id shared in the process
//! (`spec/backends.md` "Collectives on GPUs"). The plan is made once for `T` ranks; `--trace` and
//! `--timings` show rank 0's streams.
//!
//! Under Open MPI's `mpirun` with `--device cpu` (`OMPI_COMM_WORLD_SIZE = T`), each process runs
//! one rank over `memo_mpi::MpiGroup` instead; only rank 0 prints (`spec/backends.md` "CPU ranks
//! across processes").
//!
//! What is refused, before any device is opened: a plan with ops that have no GPU kernel
//! (`memo_kernels::without_gpu_kernel`: none today, the `t > 1` step's split ops have kernels),
//! AMD GPUs (the HIP backend does not launch collectives yet), and under `torchrun` (one rank per
//! process: `ParallelTrainer` runs all ranks in one process) after the variables and
//! `WORLD_SIZE = T` are checked.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memo_plan_core::model::{ModelConfig, Parallelism};
use memo_plan_core::plan::scratch::NoScratch;
use memo_plan_core::plan::{Action, Op};
use memo_runtime::checkpoint::{fingerprint, Checkpoint};
use memo_runtime::collective::{CollectiveError, Element, Reduction};
use memo_runtime::rendezvous::TorchrunEnv;
use memo_runtime::{
    Backend, BackendError, Collectives, ParallelTrainer, PlannedStep, RankGroups, RuntimeError, StopGate,
};
use runtime_cpu::CpuBackend;
use runtime_cuda::CudaBackend;
use serde_json::json;

use super::{save_checkpoint, TrainArgs};
use crate::device::{check_fits, runtime_failure, Kind};
use crate::exit::{self, Failure};
use crate::human;

/// How long the ranks' NCCL join and every later wait for a peer may take in one process (the
/// multi-process default, `memo_runtime::rendezvous::DEFAULT_TIMEOUT`).
const JOIN_TIMEOUT: Duration = memo_runtime::rendezvous::DEFAULT_TIMEOUT;

/// Refuses what `--tensor-parallel T` cannot do, with the reason and the fix: an AMD GPU (the HIP
/// backend does not launch collectives yet), the recall task (its evaluation reads one GPU's
/// logits), and a `T` that does not divide the heads, the FFN width and the sequence.
pub(super) fn refuse(args: &TrainArgs, model: &ModelConfig) -> Result<(), Failure> {
    let (t, c) = (args.tensor_parallel, args.context_parallel);
    if c > 1 && args.device.kind != Kind::Cpu {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "--context-parallel {c} on --device {}: the GPU backends have no kernels for the ring's ops and \
                 no ring exchange between GPUs yet; use --device cpu (C x T threads), or --context-parallel 1",
                args.device.label()
            ),
        ));
    }
    if args.device.kind == Kind::Hip {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "--tensor-parallel {t} on --device {}: the HIP backend does not launch collectives (RCCL) yet; use \
                 --device cpu (one thread per rank), --device cuda, or --tensor-parallel 1",
                args.device.label()
            ),
        ));
    }
    if args.task.is_some() {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "--task is not supported with --tensor-parallel {t} --context-parallel {c} yet (its evaluation \
                 reads the logits of one GPU); drop it or use --tensor-parallel 1 --context-parallel 1"
            ),
        ));
    }
    let sizes = [("attention heads", model.heads), ("FFN width", model.ffn_hidden), ("sequence", model.seq_len)];
    if let Some((what, size)) = sizes.iter().find(|(_, size)| size % t != 0) {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "--tensor-parallel {t} does not divide the model's {what} ({size}): every rank holds 1/T of the \
                 heads, the FFN width and the sequence; choose a T that divides {} heads, FFN width {} and sequence {}",
                model.heads, model.ffn_hidden, model.seq_len
            ),
        ));
    }
    Ok(())
}

/// The `torchrun` variables, when `WORLD_SIZE` is set: read and checked (a malformed one, or a
/// `WORLD_SIZE` other than `T`, is an error naming it).
fn torchrun(args: &TrainArgs) -> Result<Option<TorchrunEnv>, Failure> {
    if std::env::var_os("WORLD_SIZE").is_none() {
        return Ok(None);
    }
    let t = args.tensor_parallel;
    let env = TorchrunEnv::from_env().map_err(|e| {
        Failure::new(exit::BAD_INPUT, format!("--tensor-parallel {t} under torchrun (WORLD_SIZE is set): {e}"))
    })?;
    if env.world_size as u64 != t {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "--tensor-parallel {t} but WORLD_SIZE is {}: each process is one rank of the tensor-parallel group, \
                 so start T = {t} processes (torchrun --nproc-per-node {t}) or pass --tensor-parallel {}",
                env.world_size, env.world_size
            ),
        ));
    }
    Ok(Some(env))
}

/// Under Open MPI's mpirun (`OMPI_COMM_WORLD_SIZE` set) with CPU ranks: the job's variables,
/// checked (`OMPI_COMM_WORLD_SIZE` must be `T`), and what does not work across processes yet
/// refused. Under torchrun without mpirun: refused (no CPU transport under torchrun).
fn mpirun(args: &TrainArgs) -> Result<Option<memo_mpi::MpiEnv>, Failure> {
    let t = args.tensor_parallel;
    let env = memo_mpi::MpiEnv::from_env()
        .map_err(|e| Failure::new(exit::BAD_INPUT, format!("--tensor-parallel {t} under mpirun: {e}")))?;
    let Some(env) = env else {
        if std::env::var_os("WORLD_SIZE").is_some() {
            return Err(Failure::new(
                exit::BAD_INPUT,
                format!(
                    "--tensor-parallel {t} --device cpu under torchrun (WORLD_SIZE is set): CPU ranks in separate \
                     processes talk over Open MPI, not torchrun; launch them with `mpirun -np {t} memo train ...`, or \
                     run memo train once without a launcher (the ranks become threads)"
                ),
            ));
        }
        return Ok(None);
    };
    let fail = |message: String| {
        Err(Failure::new(
            exit::BAD_INPUT,
            format!("rank {} of {}: --tensor-parallel {t} under mpirun: {message}", env.rank, env.size),
        ))
    };
    if args.context_parallel > 1 {
        return fail(format!(
            "--context-parallel {} under mpirun: one context-parallel rank per process is not there yet (the ring \
             runs between threads of one process); run memo train once, without mpirun: the {} ranks become threads",
            args.context_parallel,
            args.context_parallel * t
        ));
    }
    if env.size as u64 != t {
        return fail(format!(
            "the job has {} processes: each process is one rank, so start mpirun -np {t} or pass --tensor-parallel {}",
            env.size, env.size
        ));
    }
    if args.trace.is_some() {
        return fail(
            "--trace is not supported across processes yet; run the ranks as threads of one process (no mpirun) for \
             a trace"
                .into(),
        );
    }
    Ok(Some(env))
}

/// Refuses a plan that launches an op with no GPU kernel yet (`memo_kernels::without_gpu_kernel`),
/// naming every such op, before any device is opened: a GPU step must not half-run.
fn refuse_ops_without_gpu_kernel(args: &TrainArgs, planned: &PlannedStep) -> Result<(), Failure> {
    let plan = &planned.report().plan;
    let mut missing: Vec<Op> = Vec::new();
    let programs =
        std::iter::once(&plan.instructions[..]).chain(plan.rank_programs.iter().map(|p| &p.instructions[..]));
    for instruction in programs.flatten() {
        if let Action::Launch(launch) = &instruction.action {
            if memo_kernels::without_gpu_kernel(launch.op).is_some() && !missing.contains(&launch.op) {
                missing.push(launch.op);
            }
        }
    }
    let Some(reason) = missing.first().and_then(|&op| memo_kernels::without_gpu_kernel(op)) else {
        return Ok(());
    };
    let names: Vec<&str> = missing.iter().map(|op| op.name()).collect();
    Err(Failure::new(
        exit::BAD_INPUT,
        format!(
            "--tensor-parallel {} on --device {}: the plan launches {} op(s) with no GPU kernel yet ({}): {reason}. \
             Nothing was run. Use --device cpu for T > 1 (one thread per rank), or --tensor-parallel 1 on the GPU",
            args.tensor_parallel,
            args.device.label(),
            names.len(),
            names.join(", ")
        ),
    ))
}

/// One GPU rank's place in the group, for `ParallelTrainer` (its rank, and an abort that only
/// keeps the reason): the collectives themselves run inside the backend, on NCCL, on device
/// memory. A failed rank's peers do not hang: their backends wait for a collective at most the
/// communicator's timeout, then abort it.
struct DeviceRank {
    rank: usize,
    ranks: usize,
    aborted: Mutex<Option<String>>,
}

impl DeviceRank {
    fn host_call(&self) -> CollectiveError {
        CollectiveError::RankFailed {
            rank: self.rank,
            reason: "a GPU rank's collectives run in its backend, on NCCL and device memory, not on host bytes".into(),
        }
    }
}

impl Collectives for DeviceRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn all_gather(&self, _input: &[u8], _output: &mut [u8]) -> Result<(), CollectiveError> {
        Err(self.host_call())
    }

    fn reduce_scatter(&self, _element: Element, _input: &[u8], _output: &mut [u8]) -> Result<(), CollectiveError> {
        Err(self.host_call())
    }

    fn all_reduce(&self, _element: Element, _reduction: Reduction, _data: &mut [u8]) -> Result<(), CollectiveError> {
        Err(self.host_call())
    }

    fn exchange(
        &self,
        _send_to: usize,
        _send: &[u8],
        _receive_from: usize,
        _receive: &mut [u8],
    ) -> Result<(), CollectiveError> {
        Err(self.host_call())
    }

    fn abort(&self, reason: &str) {
        if let Ok(mut aborted) = self.aborted.lock() {
            aborted.get_or_insert_with(|| reason.to_string());
        }
    }
}

/// One rank as `ParallelTrainer::with_plan` takes it: its backend and its place in the group.
type Rank<B> = (B, Arc<dyn Collectives>);

/// Opens devices `N..N+T` (`--device cuda:N`), one CUDA backend each, and joins them to one NCCL
/// communicator (one unique id, each rank joining on a thread of its own, within
/// [`JOIN_TIMEOUT`]). Every backend is opened before any joins, so a missing device is its own
/// error, not a join that times out.
fn cuda_ranks(args: &TrainArgs) -> Result<Vec<Rank<CudaBackend>>, Failure> {
    let t = args.tensor_parallel as usize;
    let label = format!("--device {} --tensor-parallel {t}", args.device.label());
    let nccl =
        runtime_cuda::nccl::load().map_err(|e| Failure::new(exit::DEVICE_UNAVAILABLE, format!("{label}: {e}")))?;
    let measure = args.trace.is_some() || args.timings;
    let mut backends = Vec::with_capacity(t);
    for k in 0..t {
        let device = crate::device::Device { ordinal: args.device.ordinal + k, ..args.device };
        let backend = CudaBackend::new(device.ordinal).map_err(|e| crate::device::unavailable(&device, &e))?;
        backends.push(if measure { backend.measure() } else { backend });
    }
    let id = nccl.unique_id().map_err(|e| Failure::new(exit::DEVICE_UNAVAILABLE, format!("{label}: {e}")))?;
    let joined: Vec<Result<CudaBackend, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = backends
            .into_iter()
            .enumerate()
            .map(|(k, mut backend)| {
                let (nccl, id) = (&nccl, &id);
                std::thread::Builder::new().name(format!("memo-join-{k}")).spawn_scoped(scope, move || {
                    backend.join(nccl, id, t, k, JOIN_TIMEOUT).map(|()| backend).map_err(|e| format!("rank {k}: {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(k, handle)| match handle {
                Ok(handle) => handle.join().unwrap_or_else(|_| Err(format!("rank {k}: its thread panicked"))),
                Err(e) => Err(format!("rank {k}: cannot start its thread: {e}")),
            })
            .collect()
    });
    let mut ranks = Vec::with_capacity(t);
    for (k, backend) in joined.into_iter().enumerate() {
        let backend = backend.map_err(|e| Failure::new(exit::DEVICE_UNAVAILABLE, format!("{label}: NCCL: {e}")))?;
        let group: Arc<dyn Collectives> = Arc::new(DeviceRank { rank: k, ranks: t, aborted: Mutex::new(None) });
        ranks.push((backend, group));
    }
    Ok(ranks)
}

/// Trains with `--tensor-parallel T` ranks: plan once, refuse what cannot run, start the ranks
/// (CPU threads, or CUDA devices joined by NCCL), then [`train`].
pub(super) fn run(args: &TrainArgs, gate: Arc<StopGate>, after: Duration) -> Result<(), Failure> {
    let watching = Watching { gate, after, across: None, leader: true };
    let t = args.tensor_parallel;
    let model = super::model(args)?;
    refuse(args, &model)?;
    let torchrun = if args.device.kind == Kind::Cuda { torchrun(args)? } else { None };
    let mpirun = if args.device.kind == Kind::Cuda { None } else { mpirun(args)? };
    let data = super::data_source(args, &model)?;
    let mut options = super::train_options(args, &model)?;
    let c = args.context_parallel;
    if args.device.kind == Kind::Cpu {
        // CPU ranks are threads of this host: one node holds all c x t of them.
        options.hardware.gpus_per_node = options.hardware.gpus_per_node.max(c * t);
    }
    let parallel = Parallelism { tensor: t, ..Parallelism::single() }.with_context(c);
    let planned = PlannedStep::with_layout(&options, parallel, &NoScratch).map_err(runtime_failure)?;
    if args.device.kind == Kind::Cuda {
        refuse_ops_without_gpu_kernel(args, &planned)?;
    }
    check_fits(&planned)?;
    let opening = Instant::now();
    match args.device.kind {
        Kind::Cuda => {
            if let Some(env) = torchrun {
                return Err(Failure::new(
                    exit::BAD_INPUT,
                    format!(
                        "--tensor-parallel {t} under torchrun (rank {} of {}): one rank per process is not there yet \
                         (the trainer runs every rank of the group in one process); run memo train once, without \
                         torchrun: the ranks become threads on devices {}..{}",
                        env.rank,
                        env.world_size,
                        args.device.ordinal,
                        args.device.ordinal + t as usize - 1
                    ),
                ));
            }
            let ranks = cuda_ranks(args)?;
            let trainer = ParallelTrainer::with_plan(planned, ranks).map_err(runtime_failure)?;
            train(args, &model, data, trainer, opening.elapsed().as_secs_f64(), "NVIDIA GPUs, NCCL", watching)
        }
        _ => {
            if let Some(env) = mpirun {
                return train_one_process(args, &model, data, planned, &env, (opening, watching));
            }
            let ranks = RankGroups::local(t as usize, c as usize)
                .into_iter()
                .map(|groups| {
                    let backend = if args.checked {
                        CpuBackend::checked()
                    } else {
                        CpuBackend::with_copy_bandwidth(args.copy_bandwidth)
                    };
                    let backend = if args.trace.is_some() || args.timings { backend.measure() } else { backend };
                    let backend = backend.with_collectives(Arc::clone(&groups.tensor));
                    let backend = match &groups.data {
                        Some(data) => backend.with_data_group(Arc::clone(data)),
                        None => backend,
                    };
                    (backend, groups)
                })
                .collect();
            let trainer = ParallelTrainer::with_plan(planned, ranks).map_err(runtime_failure)?;
            train(args, &model, data, trainer, opening.elapsed().as_secs_f64(), "CPU threads", watching)
        }
    }
}

/// One CPU rank of `--tensor-parallel T` in this process, under mpirun (`env`): its peers are the
/// other processes, joined by Open MPI (`memo-mpi`); rank 0 prints and writes, every rank's
/// failure is prefixed with its rank.
fn train_one_process(
    args: &TrainArgs,
    model: &ModelConfig,
    data: super::Source,
    planned: PlannedStep,
    env: &memo_mpi::MpiEnv,
    (opening, watching): (Instant, Watching),
) -> Result<(), Failure> {
    let t = args.tensor_parallel;
    let prefix = |f: Failure| f.prefixed(&format!("rank {} of {}: ", env.rank, env.size));
    let group = memo_mpi::MpiGroup::init()
        .map_err(|e| Failure::new(exit::DEVICE_UNAVAILABLE, format!("--tensor-parallel {t} under mpirun: {e}")))
        .map_err(prefix)?;
    let group = Arc::new(group);
    let handle: Arc<dyn Collectives> = group.clone();
    let backend =
        if args.checked { CpuBackend::checked() } else { CpuBackend::with_copy_bandwidth(args.copy_bandwidth) };
    let backend = if args.timings { backend.measure() } else { backend };
    let ranks = vec![(backend.with_collectives(Arc::clone(&handle)), Arc::clone(&handle))];
    let trainer = ParallelTrainer::with_plan(planned, ranks).map_err(runtime_failure).map_err(prefix)?;
    let watching = Watching { across: Some(handle), leader: env.rank == 0, ..watching };
    let how = "CPU processes, Open MPI";
    train(args, model, data, trainer, opening.elapsed().as_secs_f64(), how, watching).map_err(prefix)?;
    // Every call completed: end MPI cleanly (after a failure the process exits with its error
    // instead, and mpirun ends the job).
    match Arc::try_unwrap(group) {
        Ok(group) => group.finish().map_err(|e| Failure::new(exit::DEVICE_UNAVAILABLE, e.to_string())).map_err(prefix),
        Err(_) => Ok(()),
    }
}

/// Ctrl-C's gate and when a running step reports its progress; under mpirun, the group across
/// processes that agrees on stopping, and whether this process prints (rank 0 only).
struct Watching {
    gate: Arc<StopGate>,
    after: Duration,
    across: Option<Arc<dyn Collectives>>,
    leader: bool,
}

impl Watching {
    /// Whether to stop before the next step. Across processes every rank decides alike: the
    /// stop requests are all-reduced with max, so no process stops alone.
    fn stop(&self) -> Result<bool, Failure> {
        let here = self.gate.stop_requested();
        let Some(group) = &self.across else { return Ok(here) };
        let mut flag = (if here { 1.0f32 } else { 0.0 }).to_le_bytes();
        group.all_reduce(Element::F32, Reduction::Max, &mut flag).map_err(|e| {
            Failure::new(exit::DEVICE_UNAVAILABLE, format!("agreeing on Ctrl-C across the processes: {e}"))
        })?;
        Ok(f32::from_le_bytes(flag) > 0.0)
    }
}

/// The steps (progress or `--json` lines), checkpoints of every rank's shards, the trace and the
/// summary, on started ranks (`how`: where they run, for the header).
fn train<B: Backend + Send>(
    args: &TrainArgs,
    model: &ModelConfig,
    mut data: super::Source,
    mut trainer: ParallelTrainer<B>,
    open_s: f64,
    how: &str,
    watching: Watching,
) -> Result<(), Failure> {
    let (t, c) = (args.tensor_parallel, args.context_parallel);
    let model = model.clone();
    let print = fingerprint(&model, args.seed);
    // Across processes a stop is decided between steps only (`Watching::stop`): a step stopped
    // inside one process but not another would leave the ranks apart.
    let controls =
        if watching.across.is_some() { Vec::new() } else { trainer.set_stop_gate(Arc::clone(&watching.gate)) };
    let leader = watching.leader;
    if args.resume {
        let dir = args.checkpoint.as_deref().unwrap_or(std::path::Path::new("."));
        let checkpoint = Checkpoint::load(dir).map_err(|e| Failure::new(exit::BAD_INPUT, e))?;
        trainer.restore(&checkpoint, print).map_err(runtime_failure)?;
        data.seek(checkpoint.data_position);
        if trainer.steps_taken() >= args.steps {
            return Err(Failure::new(
                exit::BAD_INPUT,
                format!(
                    "--steps {}: the checkpoint in {} already holds {} steps; give --steps above it to train on",
                    args.steps,
                    dir.display(),
                    trainer.steps_taken()
                ),
            ));
        }
        if leader {
            eprintln!("memo train: resumed from the checkpoint in {} at step {}", dir.display(), trainer.steps_taken());
        }
    }
    let memory = trainer.memory();
    let unigram = data.unigram_entropy();
    if !args.json && leader {
        eprintln!(
            "memo train: {} ({} layers, h {}), {} tokens x {}, {} plan, tensor-parallel {t}{} ({how}), per rank: \
             arena {}, host slab {}{}",
            model.name,
            model.layers,
            model.hidden,
            model.seq_len,
            model.micro_batch,
            args.strategy.name(),
            if c > 1 { format!(" x context-parallel {c}") } else { String::new() },
            human::binary_units(memory.device_bytes),
            human::binary_units(memory.host_bytes),
            unigram.map(|u| format!("; unigram entropy of the data {u:.3} nats")).unwrap_or_default(),
        );
    }
    let mut out = std::io::stdout().lock();
    let write_error = |e: std::io::Error| Failure::new(exit::IO_ERROR, format!("cannot write: {e}"));
    let started = Instant::now();
    let first = trainer.steps_taken();
    let mut last_loss = f32::NAN;
    let program = trainer.rank(0).map(|rank| rank.program().to_vec()).unwrap_or_default();
    let watch = super::progress::Progress::start(
        watching.after,
        &program,
        model.layers,
        controls.first().cloned(),
        args.device.label(),
        false,
    );
    let mut interrupted = false;
    while trainer.steps_taken() < args.steps {
        if watching.stop()? {
            interrupted = true;
            break;
        }
        let step_started = Instant::now();
        let position = data.position();
        let (tokens, targets) = data.next_batch(model.micro_batch as usize, model.seq_len as usize);
        watch.begin(trainer.steps_taken() + 1);
        let result = trainer.step(&tokens, &targets);
        watch.end();
        last_loss = match result {
            Ok(loss) => loss,
            Err(RuntimeError::Backend(BackendError::Interrupted)) => {
                // Stopped on every rank before the update: the previous step's state and data.
                data.seek(position);
                interrupted = true;
                break;
            }
            Err(error) => return Err(runtime_failure(error)),
        };
        let step_time_s = step_started.elapsed().as_secs_f64().max(1e-9);
        let tokens_per_s = super::tokens_per_step(&model) / step_time_s;
        let step = trainer.steps_taken();
        if !leader {
        } else if args.json {
            let mut line = json!({"step": step, "loss": last_loss, "tokens_per_s": tokens_per_s, "step_time_s": step_time_s,
                              "tensor_parallel": t, "context_parallel": c, "device_bytes": memory.device_bytes, "host_bytes": memory.host_bytes});
            if args.timings {
                // Rank 0's streams (every rank runs the same program).
                let timeline = trainer.rank(0).and_then(memo_runtime::Trainer::last_step_timeline);
                crate::device::add_timings(&mut line, timeline.as_ref());
            }
            writeln!(out, "{line}").map_err(write_error)?;
        } else if step.is_multiple_of(10) || step == args.steps {
            eprintln!("step {step}/{} loss {last_loss:.4} {tokens_per_s:.0} tokens/s", args.steps);
        }
        if let Some(dir) = &args.checkpoint {
            if step.is_multiple_of(args.checkpoint_every.max(1)) || step == args.steps {
                save_from_leader(leader, trainer.checkpoint(print, data.position()), dir)?;
            }
        }
    }
    drop(watch);
    if interrupted {
        return Err(super::progress::interrupted(args, trainer.steps_taken(), first, |dir| {
            save_from_leader(leader, trainer.checkpoint(print, data.position()), dir)
        }));
    }
    if let Some(path) = &args.trace {
        write_rank_0_trace(&mut trainer, path, how)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let tokens_per_s = (trainer.steps_taken() - first) as f64 * super::tokens_per_step(&model) / elapsed.max(1e-9);
    let checked = super::checked_line(args, trainer.checks(), trainer.steps_taken() - first);
    let plan = &trainer.report().plan;
    let setup = trainer.setup_times();
    if !leader {
    } else if args.json {
        let mut line = json!({
            "summary": true, "steps": trainer.steps_taken(), "final_loss": last_loss, "unigram_entropy": unigram,
            "tokens_per_s": tokens_per_s, "strategy": args.strategy.name(), "tensor_parallel": t, "context_parallel": c,
            "alpha": plan.provenance.alpha, "swaps": plan.provenance.swap_summary(),
            "device_bytes": plan.totals.arena_bytes, "host_bytes": plan.totals.host_bytes, "device": args.device.label(),
            "setup_s": {"open_backend": open_s, "plan": setup.plan_s, "allocate": setup.allocate_s,
                        "initialise": setup.initialise_s},
        });
        if let Some((_, value)) = checked {
            line["checked"] = value;
        }
        writeln!(out, "{line}").map_err(write_error)?;
    } else {
        if let Some((text, _)) = checked {
            eprintln!("{text}");
        }
        eprintln!(
            "done: {} steps, final loss {last_loss:.4}{}, {tokens_per_s:.0} tokens/s",
            trainer.steps_taken(),
            unigram.map(|u| format!(" (unigram entropy {u:.4})")).unwrap_or_default()
        );
    }
    Ok(())
}

/// Saves a checkpoint from rank 0's process only (every process gathers it, since the gather is
/// a collective; one file is written, the one the threaded run writes); a failure to gather is
/// every process's error.
fn save_from_leader(
    leader: bool,
    checkpoint: Result<Checkpoint, RuntimeError>,
    dir: &std::path::Path,
) -> Result<(), Failure> {
    if leader {
        return save_checkpoint(checkpoint, dir);
    }
    checkpoint.map(|_| ()).map_err(runtime_failure)
}

/// Writes rank 0's measured timeline of the last step (its four streams) to `--trace`.
fn write_rank_0_trace<B: Backend + Send>(
    trainer: &mut ParallelTrainer<B>,
    path: &std::path::Path,
    how: &str,
) -> Result<(), Failure> {
    let steps = trainer.steps_taken();
    let timeline = trainer.rank(0).and_then(memo_runtime::Trainer::last_step_timeline).ok_or_else(|| {
        Failure::new(
            exit::BAD_INPUT,
            "--trace: no step ran (the checkpoint already holds --steps steps: raise --steps)",
        )
    })?;
    let text = crate::picture::chrome_trace::trace_of(
        &trainer.report().plan,
        &format!("step {steps}, rank 0"),
        &timeline,
        "memo train --trace",
        &format!("measured on rank 0 ({how}): each instruction from when its stream took it to when it finished"),
    );
    crate::checked::write_atomically(path, text.as_bytes())
        .map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write {}: {e}; check the directory", path.display())))
}
