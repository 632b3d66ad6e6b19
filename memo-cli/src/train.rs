//! `memo train`: train a GPT through a verified plan on a backend (the CPU reference, CUDA or HIP;
//! opening one by name is `device.rs`).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::Strategy;
use memo_runtime::checkpoint::{fingerprint, Checkpoint};
use memo_runtime::data::TextData;
use memo_runtime::recall::{RecallTask, MIN_RECALL_SEQ_LEN};
use memo_runtime::{AdamW, BackendError, CheckReport, MemoryReport, RuntimeError, StopGate, TrainOptions, Trainer};
use runtime_cpu::CpuBackend;
use serde_json::json;

use crate::config::{parse_rate, parse_tokens};
use crate::device::{parse_device, runtime_failure, AnyBackend, Device, StepFlops};
use crate::exit::{self, Failure};
use crate::human;

mod parallel;
mod progress;

/// What `memo train --help` says it does.
pub const LONG_ABOUT: &str = "\
Train a GPT through a verified plan: the same instruction stream (launches, copies, events on
four streams) that a GPU runs, on the CPU reference backend (real bf16 arithmetic) or on a GPU.
The data is a byte-level tokenisation of --data (default: a public-domain text shipped with memo),
or, with --task recall, a synthetic long-range task scored on held-out sequences per key-to-query
distance.
Every strategy trains the same model bit for bit; only memory use and time differ.
On a GPU the plan is made for --machine-file (what `memo profile` writes), else --machine, else
the default machine (cuda: h200x1, hip: mi300x8); --json adds each step's time and MFU.
A step that runs past 2 s reports its progress on standard error every 10 s (instructions run,
layer and phase; MEMO_PROGRESS_AFTER_MS sets the threshold, 0: every step). Ctrl-C stops the run
at the last consistent state (mid-step before the optimizer update: at the next instruction, with
the previous step's state; during the update: once it ends), saves it atomically in --checkpoint
(else ./memo-train-checkpoint), prints where and the --resume command, and exits 130; a second
Ctrl-C exits at once, saving nothing.";

const EXAMPLES: &str = "\
Examples:
  memo train --device cpu --model tiny --seq 256 --steps 200
  memo train --device cpu --model small --seq 512 --steps 50 --strategy memo --alpha 0.3 --json
  memo train --device cpu --model tiny --seq 256 --steps 1000 --checkpoint run1
  memo train --device cpu --model tiny --seq 256 --steps 1000 --checkpoint run1 --resume
  memo train --device cpu --model tiny --seq 256 --steps 200 --tensor-parallel 2
  memo train --device cpu --model tiny-llama --seq 256 --steps 200 --tensor-parallel 4
  memo train --device cpu --model tiny --seq 256 --micro-batch 4 --steps 2000 --task recall --lr 1e-2 --eval-every 500
  memo train --device cuda --model examples/models/gpt-1b.toml --seq 16K --steps 5 --json
  memo train --device cuda:1 --machine-file h200.toml --model small --seq 4K";

/// The arguments of `memo train`.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("{EXAMPLES}\n\n{}", exit::HELP))]
pub struct TrainArgs {
    /// The backend: cpu, cuda, cuda:N, hip or hip:N (N: the device's ordinal, default 0)
    #[arg(long, default_value = "cpu", value_name = "DEVICE", value_parser = parse_device)]
    device: Device,

    /// The machine the plan is made for (a preset: a800x8, h100x8, h200x1, mi300x8). Default:
    /// h200x1 for cuda, mi300x8 for hip; for cpu a 64 GiB host (10 GB/s copies, 20 GFLOP/s)
    #[arg(long, value_name = "NAME", conflicts_with = "machine_file")]
    machine: Option<String>,

    /// A TOML file with a [machine] table (what `memo profile` writes) to plan for
    #[arg(long, value_name = "FILE")]
    machine_file: Option<PathBuf>,

    /// tiny (GPT, 2 layers, h 64), small (GPT, 4 layers, h 128), tiny-llama and small-llama (the
    /// same sizes, Llama-shaped: 2 K/V heads of 4, SwiGLU, RMSNorm, untied), or a TOML file with a
    /// [model] table
    #[arg(long, default_value = "tiny", value_name = "MODEL")]
    model: String,

    /// Tokens per sequence; K, M and G are binary (K = 1024)
    #[arg(long, default_value = "256", value_name = "TOKENS", value_parser = parse_tokens, allow_negative_numbers = true)]
    seq: u64,

    /// Sequences per step
    #[arg(long, default_value_t = 1, value_name = "B")]
    micro_batch: u64,

    /// Steps to train (in total, counting those a resumed checkpoint already took; at least 1)
    #[arg(long, default_value_t = 100, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    steps: u64,

    /// memo, full-recompute, full-swap or keep-all
    #[arg(long, default_value = "memo", value_name = "NAME", value_parser = parse_strategy)]
    strategy: Strategy,

    /// Force memo's swap fraction (0..1)
    #[arg(long, value_name = "ALPHA")]
    alpha: Option<f64>,

    /// A text file to train on (bytes are tokens)
    #[arg(long, value_name = "FILE", conflicts_with = "task")]
    data: Option<PathBuf>,

    /// Train on a synthetic task instead of text: `recall` (answer a query with the key seen
    /// 1..seq-2 tokens earlier; ends with a held-out accuracy per key-to-query distance)
    #[arg(long, value_name = "TASK", value_parser = ["recall"])]
    task: Option<String>,

    /// recall: also evaluate every N steps (0: only at the end)
    #[arg(long, default_value_t = 0, value_name = "N", requires = "task")]
    eval_every: u64,

    /// recall: held-out sequences per distance bucket and for the no-key control (0: no evaluation)
    #[arg(long, default_value_t = 64, value_name = "N", requires = "task")]
    eval_sequences: usize,

    /// Save a checkpoint in this directory (every --checkpoint-every steps and at the end)
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<PathBuf>,

    /// Steps between checkpoints
    #[arg(long, default_value_t = 50, value_name = "N")]
    checkpoint_every: u64,

    /// Continue from the checkpoint in --checkpoint
    #[arg(long, requires = "checkpoint")]
    resume: bool,

    /// Seeds the parameters
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// AdamW learning rate (not 3e-3: at it the tiny model's loss spiked by up to 7.5 nats in its
    /// first 40 steps, with or without warm-up)
    #[arg(long, default_value_t = 1.5e-3)]
    lr: f32,

    /// Raise the learning rate linearly from lr/N to lr over the first N steps (0: none); wide
    /// models need more (width 2048 diverges in one step at 3e-4 without)
    #[arg(long, value_name = "N", default_value_t = 10)]
    warmup_steps: u64,

    /// Throttle host<->device copies to this rate, with a unit (e.g. 1GB/s, 0.5GiB/s) to exercise swap overlap
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    copy_bandwidth: Option<u64>,

    /// cuda only: how attention runs: cudnn (cuDNN's fused attention; our kernels when cuDNN is
    /// missing, older than 9 or fails to build a plan, with one line saying why), cudnn-deterministic
    /// (its deterministic backward), baseline or pipelined (our kernels). Default:
    /// MEMO_CUDA_ATTENTION, else cudnn
    #[arg(long, value_name = "NAME", value_parser = parse_attention)]
    attention: Option<runtime_cuda::AttentionChoice>,

    /// Write the measured timeline of the last step (four streams) as a Chrome trace-event file
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,

    /// Checked mode: trap any access the executed events do not order (slower; for debugging); the
    /// run ends with what was checked
    #[arg(long, conflicts_with = "copy_bandwidth")]
    checked: bool,

    /// Measure every instruction and add the compute stream's busy and waiting seconds to each
    /// --json line (the CPU backend always can; a GPU backend when it times its streams)
    #[arg(long)]
    timings: bool,

    /// Print one JSON line per step and a final summary instead of the progress line
    #[arg(long)]
    json: bool,

    /// Tensor- and sequence-parallel ranks (spec/tensor-parallel.md): T threads, each with its own
    /// backend and arena; T must divide the heads, the FFN width and the sequence. cpu: T threads
    /// of one host. cuda:N: devices N..N+T-1 of this process joined by NCCL (every op of the step
    /// has a GPU kernel, checked by CPU emulation; not yet run on GPUs). hip: refused (no RCCL
    /// collectives yet)
    #[arg(long, default_value_t = 1, value_name = "T", value_parser = clap::value_parser!(u64).range(1..))]
    tensor_parallel: u64,

    /// Context-parallel ranks C (spec/context-parallel.md: ring attention over balanced sequence
    /// chunks, one program per context rank): C x T ranks; 2 x C x T must divide the sequence.
    /// cpu: C x T threads of one host. cuda and hip: refused (no GPU kernels for the ring's ops
    /// and no NCCL ring yet)
    #[arg(long, alias = "cp", default_value_t = 1, value_name = "C", value_parser = clap::value_parser!(u64).range(1..))]
    context_parallel: u64,
}

fn parse_strategy(text: &str) -> Result<Strategy, String> {
    Strategy::from_name(text.trim()).ok_or_else(|| "expected memo, full-recompute, full-swap or keep-all".to_string())
}

/// Runs `memo train`: options, data, the plan (made once: the fit check and the trainer share
/// it), the backend, the steps, the trace and the summary, each a function below.
pub fn run(args: &TrainArgs) -> Result<(), Failure> {
    let after = crate::progress::after()?;
    let gate = progress::interrupt_gate();
    if args.tensor_parallel > 1 || args.context_parallel > 1 {
        return parallel::run(args, gate, after);
    }
    let model = model(args)?;
    let mut data = data_source(args, &model)?;
    let options = train_options(args, &model)?;
    // Every backend, the CPU's too: the plan is made for `options.hardware`, and one that does
    // not fit it is refused (exit 5) before anything is allocated.
    let planned = crate::device::plan_step(&options)?;
    crate::device::check_fits(&planned)?;
    let (mut backend, open_s) = open_backend(args)?;
    let planned = crate::device::plan_scratch(&mut backend, planned)?;
    let step_flops = StepFlops::of(&model, &options.hardware)?;
    let mut trainer = Trainer::with_plan(backend, planned).map_err(runtime_failure)?;
    let control = trainer.set_stop_gate(Arc::clone(&gate));
    let print = fingerprint(&model, args.seed);
    if args.resume {
        resume(args, &mut trainer, &mut data, print)?;
    }
    let memory = trainer.memory();
    let unigram = data.unigram_entropy();
    let interactive = std::io::stderr().is_terminal() && !args.json;
    if !args.json {
        print_header(args, &model, &trainer, memory, unigram);
    }
    let mut out = std::io::stdout().lock();
    let watch = progress::Progress::start(
        after,
        trainer.program(),
        model.layers,
        Some(control),
        args.device.label(),
        interactive,
    );
    let steps = Steps { args, model: &model, step_flops: &step_flops, memory, print, interactive, gate: &gate };
    let trained = steps.train(&mut trainer, &mut data, &mut out, &watch)?;
    drop(watch);
    if trained.interrupted {
        if interactive {
            eprintln!();
        }
        return Err(progress::interrupted(args, trainer.steps_taken(), trained.first, |dir| {
            save_checkpoint(trainer.checkpoint(print, data.position()), dir)
        }));
    }
    if let Some(path) = &args.trace {
        write_trace(args, &mut trainer, path)?;
    }
    let elapsed = trained.started.elapsed().as_secs_f64() - trained.evaluation_s;
    if matches!(data, Source::Recall(_)) && args.eval_sequences > 0 {
        if interactive {
            eprintln!();
        }
        crate::recall::evaluate_and_report(&mut trainer, args.seed, args.eval_sequences, args.json, &mut out)?;
    }
    let tokens_per_s = (trainer.steps_taken() - trained.first) as f64 * tokens_per_step(&model) / elapsed.max(1e-9);
    let summary = Summary {
        model: &model,
        options: &options,
        step_flops,
        memory,
        open_s,
        unigram,
        tokens_per_s,
        first: trained.first,
    };
    report(args, &mut trainer, &summary, trained.last_loss, interactive, &mut out)
}

/// The model of `--model`, `--seq` and `--micro-batch`, once the options are known to go
/// together (CPU-only options on a GPU, `--alpha` without memo are refused).
fn model(args: &TrainArgs) -> Result<ModelConfig, Failure> {
    crate::device::refuse_cpu_only_options(
        &args.device,
        &[("--checked", args.checked), ("--copy-bandwidth", args.copy_bandwidth.is_some())],
    )?;
    if args.attention.is_some() && args.device.kind != crate::device::Kind::Cuda {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!("--attention chooses CUDA attention; drop it for --device {}", args.device.label()),
        ));
    }
    let model = crate::config::model_arg(&args.model, args.seq, args.micro_batch)?;
    if args.alpha.is_some() && args.strategy != Strategy::Memo {
        return Err(Failure::new(exit::BAD_INPUT, "--alpha applies to --strategy memo only"));
    }
    Ok(model)
}

/// Where the tokens come from: `--data` (or the shipped text), or the `--task recall` generator.
fn data_source(args: &TrainArgs, model: &ModelConfig) -> Result<Source, Failure> {
    let text = match &args.data {
        Some(path) => std::fs::read(path).map_err(|e| {
            Failure::new(exit::IO_ERROR, format!("cannot read {}: {e}; check the path", path.display()))
        })?,
        None => memo_runtime::data::DEFAULT_TEXT.as_bytes().to_vec(),
    };
    if args.task.is_some() && (model.seq_len as usize) < MIN_RECALL_SEQ_LEN {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "--task recall: --seq {} holds no mark, key and query; use --seq {MIN_RECALL_SEQ_LEN} or more",
                model.seq_len
            ),
        ));
    }
    Ok(match args.task.as_deref() {
        Some(_) => Source::Recall(RecallTask::new(args.seed)),
        None => Source::Text(TextData::from_bytes(&text).map_err(|e| Failure::new(exit::BAD_INPUT, e))?),
    })
}

/// What the trainer is asked for: the model, the strategy, the machine the plan is made for,
/// the seed and the optimizer.
fn train_options(args: &TrainArgs, model: &ModelConfig) -> Result<TrainOptions, Failure> {
    Ok(TrainOptions {
        model: model.clone(),
        strategy: args.strategy,
        forced_alpha: args.alpha,
        hardware: args.device.machine(args.machine.as_deref(), args.machine_file.as_deref())?,
        seed: args.seed,
        adamw: AdamW { lr: args.lr, warmup_steps: args.warmup_steps, ..AdamW::default() },
    })
}

/// `--attention`'s value.
fn parse_attention(name: &str) -> Result<runtime_cuda::AttentionChoice, String> {
    runtime_cuda::AttentionChoice::parse(name)
}

/// Opens `--device` (measuring for `--trace` and `--timings`; the CPU backend in checked mode or
/// with its copies throttled) and the seconds that took.
fn open_backend(args: &TrainArgs) -> Result<(AnyBackend, f64), Failure> {
    let opening = Instant::now();
    let backend = args.device.open_with_attention(args.trace.is_some() || args.timings, args.attention, || {
        if args.checked {
            CpuBackend::checked()
        } else {
            CpuBackend::with_copy_bandwidth(args.copy_bandwidth)
        }
    })?;
    Ok((backend, opening.elapsed().as_secs_f64()))
}

/// Restores the checkpoint in `--checkpoint` and moves the data to where it stopped; refuses one
/// that already holds `--steps` steps.
fn resume(args: &TrainArgs, trainer: &mut Trainer<AnyBackend>, data: &mut Source, print: u64) -> Result<(), Failure> {
    let dir = args.checkpoint.as_deref().unwrap_or(std::path::Path::new("."));
    let checkpoint = Checkpoint::load(dir).map_err(|e| Failure::new(exit::BAD_INPUT, e))?;
    trainer.restore(&checkpoint, print).map_err(runtime_failure)?;
    data.seek(checkpoint.data_position);
    let resumed_at = trainer.steps_taken();
    if resumed_at >= args.steps {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "--steps {}: the checkpoint in {} already holds {resumed_at} steps; give --steps above \
                 {resumed_at} to train on",
                args.steps,
                dir.display()
            ),
        ));
    }
    eprintln!("memo train: resumed from the checkpoint in {} at step {resumed_at}", dir.display());
    Ok(())
}

/// The first lines on stderr: the model, the plan, what is allocated, what swaps.
fn print_header(
    args: &TrainArgs,
    model: &ModelConfig,
    trainer: &Trainer<AnyBackend>,
    memory: MemoryReport,
    unigram: Option<f64>,
) {
    eprintln!(
        "memo train: {} ({} layers, h {}), {} tokens x {}, {} plan, arena {}, host slab {}{}\n  {}",
        model.name,
        model.layers,
        model.hidden,
        model.seq_len,
        model.micro_batch,
        args.strategy.name(),
        human::binary_units(memory.device_bytes),
        human::binary_units(memory.host_bytes),
        unigram.map(|u| format!("; unigram entropy of the data {u:.3} nats")).unwrap_or_default(),
        trainer.report().plan.provenance.swap_summary()
    );
}

fn tokens_per_step(model: &ModelConfig) -> f64 {
    (model.seq_len * model.micro_batch) as f64
}

/// What the steps leave for the summary.
struct Trained {
    /// When the first step started.
    started: Instant,
    /// Steps taken before (a resumed checkpoint's).
    first: u64,
    last_loss: f32,
    /// Seconds spent evaluating between steps: not training, so left out of tokens/s.
    evaluation_s: f64,
    /// Ctrl-C stopped the run (at the state after the steps taken).
    interrupted: bool,
}

/// What the training steps report with.
struct Steps<'a> {
    args: &'a TrainArgs,
    model: &'a ModelConfig,
    step_flops: &'a StepFlops,
    /// What the backend holds (each `--json` line says it).
    memory: MemoryReport,
    /// The checkpoints' fingerprint of the model.
    print: u64,
    /// Progress overwrites one line of a terminal.
    interactive: bool,
    /// Asked to stop by Ctrl-C.
    gate: &'a StopGate,
}

impl Steps<'_> {
    /// Trains up to `--steps`: per step a progress or `--json` line, checkpoints every
    /// `--checkpoint-every` steps and at the end, and the recall evaluation every `--eval-every`.
    fn train(
        &self,
        trainer: &mut Trainer<AnyBackend>,
        data: &mut Source,
        out: &mut impl Write,
        watch: &progress::Progress,
    ) -> Result<Trained, Failure> {
        let Steps { args, model, step_flops, memory, print, interactive, gate } = *self;
        let started = Instant::now();
        let first = trainer.steps_taken();
        let mut last_loss = f32::NAN;
        let mut evaluation_s = 0.0;
        while trainer.steps_taken() < args.steps {
            if gate.stop_requested() {
                return Ok(Trained { started, first, last_loss, evaluation_s, interrupted: true });
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
                    // Stopped before its update: the state is the previous step's, and so is the data.
                    data.seek(position);
                    return Ok(Trained { started, first, last_loss, evaluation_s, interrupted: true });
                }
                Err(error) => return Err(runtime_failure(error)),
            };
            let step_time_s = step_started.elapsed().as_secs_f64().max(1e-9);
            let tokens_per_s = tokens_per_step(model) / step_time_s;
            let step = trainer.steps_taken();
            if args.json {
                let mut line = json!({"step": step, "loss": last_loss, "tokens_per_s": tokens_per_s,
                              "device_bytes": memory.device_bytes, "host_bytes": memory.host_bytes});
                let (mfu_6n, mfu_attention) = step_flops.mfu(step_time_s);
                line["step_time_s"] = json!(step_time_s);
                line["mfu_6n"] = json!(mfu_6n);
                line["mfu_attention"] = json!(mfu_attention);
                if args.timings {
                    crate::device::add_timings(&mut line, trainer.last_step_timeline().as_ref());
                }
                writeln!(out, "{line}").map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write: {e}")))?;
            } else if interactive {
                eprint!("\rstep {step}/{} loss {last_loss:.4} {tokens_per_s:.0} tokens/s\x1b[K", args.steps);
            } else if step.is_multiple_of(10) || step == args.steps {
                eprintln!("step {step}/{} loss {last_loss:.4} {tokens_per_s:.0} tokens/s", args.steps);
            }
            if let Some(dir) = &args.checkpoint {
                if step.is_multiple_of(args.checkpoint_every.max(1)) || step == args.steps {
                    save_checkpoint(trainer.checkpoint(print, data.position()), dir)?;
                }
            }
            // The evaluation replays the forward only; the final one follows the trace, which must
            // show a training step.
            let evaluate_now = args.eval_every > 0 && step.is_multiple_of(args.eval_every) && step < args.steps;
            if matches!(data, Source::Recall(_)) && evaluate_now && args.eval_sequences > 0 {
                if interactive {
                    eprintln!();
                }
                let evaluation_started = Instant::now();
                let evaluated =
                    crate::recall::evaluate_and_report(trainer, args.seed, args.eval_sequences, args.json, out);
                match evaluated {
                    // Ctrl-C stopped the evaluation: the state after the step is intact.
                    Err(_) if gate.stop_requested() => {
                        return Ok(Trained { started, first, last_loss, evaluation_s, interrupted: true })
                    }
                    result => {
                        result?;
                    }
                }
                evaluation_s += evaluation_started.elapsed().as_secs_f64();
            }
        }
        Ok(Trained { started, first, last_loss, evaluation_s, interrupted: false })
    }
}

/// Saves a trainer's state, as its `checkpoint` gave it, in `dir` (atomically: `Checkpoint::save`);
/// the one-process and the tensor-parallel trainers both save through here.
pub(crate) fn save_checkpoint(
    checkpoint: Result<memo_runtime::checkpoint::Checkpoint, memo_runtime::RuntimeError>,
    dir: &std::path::Path,
) -> Result<(), Failure> {
    checkpoint
        .map_err(runtime_failure)?
        .save(dir)
        .map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot save the checkpoint in {}: {e}", dir.display())))
}

/// What `--checked` verified, for the last lines: `None` without `--checked`.
fn checked_line(args: &TrainArgs, checks: Option<CheckReport>, steps: u64) -> Option<(String, serde_json::Value)> {
    if !args.checked {
        return None;
    }
    let checks = checks.unwrap_or_default();
    let text = format!(
        "checked: {} launches and copies ({} byte ranges) and {} waits of {steps} step(s) verified against the \
         executed events: 0 unordered accesses",
        progress::thousands(checks.instructions),
        progress::thousands(checks.spans),
        progress::thousands(checks.waits)
    );
    let value = json!({"instructions": checks.instructions, "byte_ranges": checks.spans, "waits": checks.waits,
                       "steps": steps, "violations": 0});
    Some((text, value))
}

/// Writes the measured timeline of the last step to `--trace` as a Chrome trace-event file.
fn write_trace(args: &TrainArgs, trainer: &mut Trainer<AnyBackend>, path: &std::path::Path) -> Result<(), Failure> {
    let timeline = trainer.last_step_timeline().ok_or_else(|| {
        Failure::new(
            exit::BAD_INPUT,
            format!(
                "--trace: no step ran (the checkpoint already holds --steps steps: raise --steps), or the {} \
                 backend does not time its instructions",
                args.device.label()
            ),
        )
    })?;
    let name = format!("step {}", trainer.steps_taken());
    let text = crate::picture::chrome_trace::trace_of(
        &trainer.report().plan,
        &name,
        &timeline,
        "memo train --trace",
        &crate::device::trace_note(&args.device),
    );
    crate::checked::write_atomically(path, text.as_bytes())
        .map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write {}: {e}; check the directory", path.display())))
}

/// What the final summary reports besides the trainer's own state.
struct Summary<'a> {
    model: &'a ModelConfig,
    options: &'a TrainOptions,
    step_flops: StepFlops,
    /// What the backend held when training started.
    memory: MemoryReport,
    /// Seconds opening the backend took.
    open_s: f64,
    unigram: Option<f64>,
    /// Training tokens per second over the steps of this run.
    tokens_per_s: f64,
    /// Steps taken before this run (a resumed checkpoint's).
    first: u64,
}

/// The last word: a JSON summary line with `--json`, else a `done:` line on stderr.
fn report(
    args: &TrainArgs,
    trainer: &mut Trainer<AnyBackend>,
    summary: &Summary<'_>,
    last_loss: f32,
    interactive: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let Summary { model, options, step_flops, memory, open_s, unigram, tokens_per_s, .. } = *summary;
    let parameters = model.parameter_count().map_err(|e| Failure::new(exit::BAD_INPUT, e.to_string()))?;
    let plan = &trainer.report().plan;
    let (totals, alpha, swaps) = (plan.totals, plan.provenance.alpha, plan.provenance.swap_summary());
    let setup = trainer.setup_times();
    let line = json!({
        "summary": true, "steps": trainer.steps_taken(), "parameters": parameters, "final_loss": last_loss, "unigram_entropy": unigram,
        "tokens_per_s": tokens_per_s, "strategy": args.strategy.name(),
        "task": args.task.as_deref().unwrap_or("text"),
        "alpha": alpha, "swaps": swaps, "device_bytes": totals.arena_bytes, "host_bytes": totals.host_bytes,
        "device": args.device.label(), "machine": options.hardware.name, "peak_flops": step_flops.peak_flops,
        "allocated_device_bytes": memory.device_bytes, "allocated_host_bytes": memory.host_bytes,
        "scratch_device_bytes": trainer.memory().scratch_bytes,
        "setup_s": {"open_backend": open_s, "plan": setup.plan_s, "allocate": setup.allocate_s,
                    "initialise": setup.initialise_s},
    });
    let checked = checked_line(args, trainer.checks(), trainer.steps_taken() - summary.first);
    let mut line = line;
    if let Some((_, value)) = &checked {
        line["checked"] = value.clone();
    }
    if args.json {
        writeln!(out, "{line}").map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write: {e}")))?;
    } else {
        if interactive {
            eprintln!();
        }
        if let Some((text, _)) = &checked {
            eprintln!("{text}");
        }
        eprintln!(
            "done: {} steps, final loss {last_loss:.4}{}, {:.0} tokens/s",
            trainer.steps_taken(),
            unigram.map(|u| format!(" (unigram entropy {u:.4})")).unwrap_or_default(),
            line["tokens_per_s"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}

/// Where the tokens come from.
enum Source {
    Text(TextData),
    Recall(RecallTask),
}

impl Source {
    fn next_batch(&mut self, sequences: usize, seq_len: usize) -> (Vec<u32>, Vec<u32>) {
        match self {
            Source::Text(text) => text.next_batch(sequences, seq_len),
            Source::Recall(task) => task.next_batch(sequences, seq_len),
        }
    }

    fn position(&self) -> u64 {
        match self {
            Source::Text(text) => text.position(),
            Source::Recall(task) => task.position(),
        }
    }

    fn seek(&mut self, position: u64) {
        match self {
            Source::Text(text) => text.seek(position),
            Source::Recall(task) => task.seek(position),
        }
    }

    /// A unigram entropy is a property of a text; the recall task has none to report.
    fn unigram_entropy(&self) -> Option<f64> {
        match self {
            Source::Text(text) => Some(text.unigram_entropy()),
            Source::Recall(_) => None,
        }
    }
}
