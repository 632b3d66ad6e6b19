//! `memo train --tensor-parallel T` with `T > 1`: tensor and sequence parallelism on the CPU, `T`
//! ranks as threads, each with its own CPU backend and arena, joined by an in-process group
//! (`spec/tensor-parallel.md`, `spec/backends.md` "CPU"). The plan is made once for `T` ranks;
//! `--trace` and `--timings` show rank 0's streams.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use memo_plan_core::model::ModelConfig;
use memo_runtime::checkpoint::{fingerprint, Checkpoint};
use memo_runtime::{Collectives, LocalGroup, ParallelTrainer, PlannedStep};
use runtime_cpu::CpuBackend;
use serde_json::json;

use super::TrainArgs;
use crate::device::{check_fits, runtime_failure, Kind};
use crate::exit::{self, Failure};
use crate::human;

/// Refuses what `--tensor-parallel T` cannot do, with the reason and the fix: a GPU (the NCCL
/// path is not there yet), the recall task (its evaluation reads one GPU's logits), and a `T`
/// that does not divide the heads, the FFN width and the sequence.
pub(super) fn refuse(args: &TrainArgs, model: &ModelConfig) -> Result<(), Failure> {
    let t = args.tensor_parallel;
    if args.device.kind != Kind::Cpu {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "--tensor-parallel {t} on --device {}: ranks on GPUs need the NCCL (or RCCL) path, which is not \
                 there yet; use --device cpu (one thread per rank) or --tensor-parallel 1",
                args.device.label()
            ),
        ));
    }
    if args.task.is_some() {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "--task is not supported with --tensor-parallel {t} yet (its evaluation reads the logits of one \
                 GPU); drop it or use --tensor-parallel 1"
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

/// Trains with `--tensor-parallel T` ranks on the CPU: plan once, start the ranks, the steps
/// (progress or `--json` lines), checkpoints of every rank's shards, the summary.
pub(super) fn run(args: &TrainArgs) -> Result<(), Failure> {
    let t = args.tensor_parallel;
    let model = super::model(args)?;
    refuse(args, &model)?;
    let mut data = super::data_source(args, &model)?;
    let options = super::train_options(args, &model)?;
    let planned = PlannedStep::tensor_parallel(&options, t).map_err(runtime_failure)?;
    check_fits(&planned)?;
    let opening = Instant::now();
    let ranks = LocalGroup::ranks(t as usize)
        .into_iter()
        .map(|rank| {
            let group: Arc<dyn Collectives> = Arc::new(rank);
            let backend =
                if args.checked { CpuBackend::checked() } else { CpuBackend::with_copy_bandwidth(args.copy_bandwidth) };
            let backend = if args.trace.is_some() || args.timings { backend.measure() } else { backend };
            (backend.with_collectives(Arc::clone(&group)), group)
        })
        .collect();
    let mut trainer = ParallelTrainer::with_plan(planned, ranks).map_err(runtime_failure)?;
    let open_s = opening.elapsed().as_secs_f64();
    let print = fingerprint(&model, args.seed);
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
        eprintln!("memo train: resumed from the checkpoint in {} at step {}", dir.display(), trainer.steps_taken());
    }
    let memory = trainer.memory();
    let unigram = data.unigram_entropy();
    if !args.json {
        eprintln!(
            "memo train: {} ({} layers, h {}), {} tokens x {}, {} plan, tensor-parallel {t} (CPU threads), per rank: \
             arena {}, host slab {}{}",
            model.name,
            model.layers,
            model.hidden,
            model.seq_len,
            model.micro_batch,
            args.strategy.name(),
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
    while trainer.steps_taken() < args.steps {
        let step_started = Instant::now();
        let (tokens, targets) = data.next_batch(model.micro_batch as usize, model.seq_len as usize);
        last_loss = trainer.step(&tokens, &targets).map_err(runtime_failure)?;
        let step_time_s = step_started.elapsed().as_secs_f64().max(1e-9);
        let tokens_per_s = super::tokens_per_step(&model) / step_time_s;
        let step = trainer.steps_taken();
        if args.json {
            let mut line = json!({"step": step, "loss": last_loss, "tokens_per_s": tokens_per_s, "step_time_s": step_time_s,
                              "tensor_parallel": t, "device_bytes": memory.device_bytes, "host_bytes": memory.host_bytes});
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
                let checkpoint = trainer.checkpoint(print, data.position()).map_err(runtime_failure)?;
                checkpoint.save(dir).map_err(|e| {
                    Failure::new(exit::IO_ERROR, format!("cannot save the checkpoint in {}: {e}", dir.display()))
                })?;
            }
        }
    }
    if let Some(path) = &args.trace {
        write_rank_0_trace(&mut trainer, path)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let tokens_per_s = (trainer.steps_taken() - first) as f64 * super::tokens_per_step(&model) / elapsed.max(1e-9);
    let plan = &trainer.report().plan;
    let setup = trainer.setup_times();
    if args.json {
        let line = json!({
            "summary": true, "steps": trainer.steps_taken(), "final_loss": last_loss, "unigram_entropy": unigram,
            "tokens_per_s": tokens_per_s, "strategy": args.strategy.name(), "tensor_parallel": t,
            "alpha": plan.provenance.alpha, "swaps": plan.provenance.swap_summary(),
            "device_bytes": plan.totals.arena_bytes, "host_bytes": plan.totals.host_bytes, "device": "cpu",
            "setup_s": {"open_backend": open_s, "plan": setup.plan_s, "allocate": setup.allocate_s,
                        "initialise": setup.initialise_s},
        });
        writeln!(out, "{line}").map_err(write_error)?;
    } else {
        eprintln!(
            "done: {} steps, final loss {last_loss:.4}{}, {tokens_per_s:.0} tokens/s",
            trainer.steps_taken(),
            unigram.map(|u| format!(" (unigram entropy {u:.4})")).unwrap_or_default()
        );
    }
    Ok(())
}

/// Writes rank 0's measured timeline of the last step (its four streams) to `--trace`.
fn write_rank_0_trace(trainer: &mut ParallelTrainer<CpuBackend>, path: &std::path::Path) -> Result<(), Failure> {
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
        "measured on the CPU backend, rank 0: each instruction from when its stream thread took it to when it finished",
    );
    crate::checked::write_atomically(path, text.as_bytes())
        .map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write {}: {e}; check the directory", path.display())))
}
