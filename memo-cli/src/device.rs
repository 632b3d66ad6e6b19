//! `--device cpu|cuda[:N]|hip[:N]`: opening a backend by name, the machine a GPU plan is made
//! for, and the step's measured throughput (step time, MFU).

use std::path::Path;

use memo_plan_core::model::{Hardware, ModelConfig, Parallelism};
use memo_plan_core::planner;
use memo_plan_core::simulate::Timeline;
use memo_runtime::{cpu_hardware, Backend, BackendError, PlannedStep, RuntimeError, TrainOptions};
use runtime_cpu::CpuBackend;

use crate::exit::{self, Failure};

/// Which kind of backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The CPU reference backend.
    Cpu,
    /// NVIDIA, through `runtime-cuda`.
    Cuda,
    /// AMD, through `runtime-hip`.
    Hip,
}

/// A parsed `--device`: the backend and the device's ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    /// The backend.
    pub kind: Kind,
    /// The device's ordinal (0 for the CPU).
    pub ordinal: usize,
}

/// What `--help` says about `--device` and the machine of a GPU plan.
pub const DEVICE_HELP: &str = "cpu, cuda, cuda:N, hip or hip:N (N: the device's ordinal, default 0)";

/// Parses `cpu`, `cuda`, `cuda:N`, `hip`, `hip:N`.
pub fn parse_device(text: &str) -> Result<Device, String> {
    let text = text.trim();
    let (name, ordinal) = match text.split_once(':') {
        Some((name, number)) => {
            let ordinal = number.trim().parse::<usize>().map_err(|_| format!("{number:?} is not a device ordinal"))?;
            (name.trim(), Some(ordinal))
        }
        None => (text, None),
    };
    let kind = match name.to_ascii_lowercase().as_str() {
        "cpu" => Kind::Cpu,
        "cuda" => Kind::Cuda,
        "hip" => Kind::Hip,
        _ => return Err(format!("expected {DEVICE_HELP}")),
    };
    if kind == Kind::Cpu && ordinal.is_some_and(|n| n != 0) {
        return Err("the cpu backend has one device: use --device cpu".to_string());
    }
    Ok(Device { kind, ordinal: ordinal.unwrap_or(0) })
}

impl Device {
    /// `cpu`, `cuda:0`, ...
    pub fn label(&self) -> String {
        match self.kind {
            Kind::Cpu => "cpu".to_string(),
            Kind::Cuda => format!("cuda:{}", self.ordinal),
            Kind::Hip => format!("hip:{}", self.ordinal),
        }
    }

    /// The machine a plan for this device is made for: `--machine-file`, else `--machine`, else
    /// the default of [`DEFAULT_MACHINES`].
    pub fn machine(&self, preset: Option<&str>, machine_file: Option<&Path>) -> Result<Hardware, Failure> {
        if machine_file.is_some() || preset.is_some() {
            return crate::config::machine(preset.unwrap_or(""), machine_file);
        }
        match self.kind {
            Kind::Cpu => Ok(cpu_hardware(64 << 30)),
            Kind::Cuda => crate::config::machine("h200x1", None),
            Kind::Hip => crate::config::machine("mi300x8", None),
        }
    }

    /// Opens the backend; with `measure`, one that times every instruction (`--timings`,
    /// `--trace`: each backend's `measure`). `cpu` configures the CPU backend (copy throttle,
    /// checked mode); GPU backends take no such options (the caller refuses them first).
    pub fn open(&self, measure: bool, cpu: impl FnOnce() -> CpuBackend) -> Result<AnyBackend, Failure> {
        self.open_with_attention(measure, None, cpu)
    }

    /// [`Device::open`] with CUDA attention run as `attention` says (`memo train --attention`;
    /// `None`: as `MEMO_CUDA_ATTENTION` says, cuDNN by default). Other backends ignore it (the
    /// caller refuses it for them first).
    pub fn open_with_attention(
        &self,
        measure: bool,
        attention: Option<runtime_cuda::AttentionChoice>,
        cpu: impl FnOnce() -> CpuBackend,
    ) -> Result<AnyBackend, Failure> {
        fn boxed<B: Backend + 'static>(backend: B, measure: Option<fn(B) -> B>) -> Box<dyn Backend> {
            match measure {
                Some(measure) => Box::new(measure(backend)),
                None => Box::new(backend),
            }
        }
        let opened: Result<Box<dyn Backend>, BackendError> = match self.kind {
            Kind::Cpu => Ok(boxed(cpu(), measure.then_some(CpuBackend::measure))),
            Kind::Cuda => runtime_cuda::CudaBackend::with_attention(self.ordinal, attention)
                .map(|b| boxed(b, measure.then_some(runtime_cuda::CudaBackend::measure))),
            Kind::Hip => runtime_hip::HipBackend::new(self.ordinal)
                .map(|b| boxed(b, measure.then_some(runtime_hip::HipBackend::measure))),
        };
        opened.map_err(|e| unavailable(self, &e))
    }
}

/// The one line of a backend that cannot be opened (exit [`exit::DEVICE_UNAVAILABLE`]).
pub fn unavailable(device: &Device, error: &BackendError) -> Failure {
    Failure::new(exit::DEVICE_UNAVAILABLE, format!("--device {}: {error}", device.label()))
}

/// Any backend, chosen at run time: `Trainer<AnyBackend>` serves every `--device`.
pub type AnyBackend = Box<dyn Backend>;

/// Refuses options only the CPU backend has (`(flag, given)` pairs) on a GPU.
pub fn refuse_cpu_only_options(device: &Device, options: &[(&str, bool)]) -> Result<(), Failure> {
    match options.iter().find(|(_, given)| *given) {
        Some((flag, _)) if device.kind != Kind::Cpu => Err(Failure::new(
            exit::BAD_INPUT,
            format!("{flag} is an option of the cpu backend only; drop it for --device {}", device.label()),
        )),
        _ => Ok(()),
    }
}

/// A runtime error as a failure, with [`runtime_exit_code`]'s code.
pub fn runtime_failure(error: RuntimeError) -> Failure {
    Failure::new(runtime_exit_code(&error), error.to_string())
}

/// The exit code of a runtime error, for every command that trains or replays (the one place
/// they are decided): a backend out of memory does not fit (exit 5), a backend that fails at run
/// time is reported as unavailable (exit 7), a plan of memo's own planner that its checker
/// refuses is a bug (exit 70), the rest is bad input (exit 2).
pub fn runtime_exit_code(error: &RuntimeError) -> u8 {
    match error {
        RuntimeError::Backend(BackendError::OutOfMemory { .. }) => exit::DOES_NOT_FIT,
        RuntimeError::Backend(BackendError::Unavailable(_)) => exit::DEVICE_UNAVAILABLE,
        RuntimeError::Invalid(_) | RuntimeError::RanksDiverged(_) => exit::INTERNAL_ERROR,
        RuntimeError::Rank { error, .. } => runtime_exit_code(error),
        RuntimeError::Backend(BackendError::Interrupted) => exit::INTERRUPTED,
        RuntimeError::Backend(
            BackendError::OutOfBounds { .. }
            | BackendError::Kernel { .. }
            | BackendError::Unordered(_)
            | BackendError::Other(_),
        )
        | RuntimeError::BufferTooLarge { .. }
        | RuntimeError::Planning(_)
        | RuntimeError::Plan(_)
        | RuntimeError::Tokens(_)
        | RuntimeError::Checkpoint(_)
        | RuntimeError::Recall(_)
        | RuntimeError::InitialisationStopped
        | RuntimeError::ModelNotTrainable(_) => exit::BAD_INPUT,
    }
}

/// Plans the step of `options` once, for the fit check and then the trainer.
pub fn plan_step(options: &TrainOptions) -> Result<PlannedStep, Failure> {
    PlannedStep::new(options).map_err(runtime_failure)
}

/// The step planned again with `backend`'s launch scratch (`Backend::scratch_sizer`,
/// `spec/plan-format.md` "Launch scratch") when `planned` lacks some of it (a GPU backend's
/// kernels need scratch; the CPU's need none and keep `planned`), and refused like `check_fits`
/// if it then does not fit. The plan owns every byte the launches use.
pub fn plan_scratch(backend: &mut AnyBackend, planned: PlannedStep) -> Result<PlannedStep, Failure> {
    let tensor = planned.tensor();
    let sizer = backend.scratch_sizer(&planned.options().model, tensor).map_err(|e| runtime_failure(e.into()))?;
    if memo_plan_core::check::check_plan_scratch(&planned.report().plan, &*sizer).is_ok() {
        return Ok(planned);
    }
    let replanned =
        PlannedStep::tensor_parallel_with_scratch(planned.options(), tensor, &*sizer).map_err(runtime_failure)?;
    check_fits(&replanned)?;
    Ok(replanned)
}

/// Refuses, before anything is allocated, a plan that does not fit the machine (exit 5): a GPU
/// would fail to allocate the arena, and a host slab larger than the host would be worse.
pub fn check_fits(planned: &PlannedStep) -> Result<(), Failure> {
    let (options, report) = (planned.options(), planned.report());
    match &report.misfit {
        None => Ok(()),
        Some(_) => Err(Failure::new(
            exit::DOES_NOT_FIT,
            format!(
                "the {} plan of {} tokens does not fit {}: {}",
                options.strategy.name(),
                options.model.seq_len,
                options.hardware.name,
                planner::remedies(&options.plan_request(), report).join("; ")
            ),
        )),
    }
}

/// Adds the compute stream's measured busy and waiting seconds of the last step to a `--json`
/// line (`null` when the backend did not time it).
pub fn add_timings(line: &mut serde_json::Value, timeline: Option<&Timeline>) {
    let (busy, wait) = match timeline {
        Some(t) => (serde_json::json!(t.busy_s[0]), serde_json::json!(t.stall_s[0])),
        None => (serde_json::Value::Null, serde_json::Value::Null),
    };
    line["compute_busy_s"] = busy;
    line["compute_wait_s"] = wait;
}

/// What a `--trace` file says its times are.
pub fn trace_note(device: &Device) -> String {
    match device.kind {
        Kind::Cpu => {
            "measured on the CPU backend: each instruction from when its stream thread took it to when it finished"
                .to_string()
        }
        _ => format!("measured on {}: each instruction as the backend timed it on its stream", device.label()),
    }
}

/// The FLOPs one step's MFU counts (`spec/cost-model.md` "Measured step time and MFU").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepFlops {
    /// `6 * N * tokens`: N the whole model's parameters (the classifier is tied to the word
    /// embedding, so its matrix product is counted through N); no attention FLOPs.
    pub six_n: f64,
    /// The planner's model FLOPs with attention halved for the causal mask (Megatron-LM's formula
    /// with its causal factor): `3 * (n * layer forward + classifier forward)`.
    pub with_attention: f64,
    /// The machine's dense bf16 peak, FLOP/s: the denominator.
    pub peak_flops: f64,
}

impl StepFlops {
    /// The counts of one step of `model` (one GPU, no tensor parallelism) on `hardware`.
    pub fn of(model: &ModelConfig, hardware: &Hardware) -> Result<Self, Failure> {
        let bad = |e: String| Failure::new(exit::BAD_INPUT, format!("cannot count the model's FLOPs: {e}"));
        // N: the parameters whose products a token goes through. An untied model's input embedding
        // is a lookup, not a product, so it is left out (a tied one's table is the classifier).
        let lookup = if model.architecture.tied_embeddings { 0 } else { model.vocab.saturating_mul(model.hidden) };
        let parameters = model.parameter_count().map_err(|e| bad(e.to_string()))?.saturating_sub(lookup);
        let tokens = model.seq_len.saturating_mul(model.micro_batch);
        let flops = memo_plan_core::cost::step_flops(
            model,
            &Parallelism::single(),
            memo_plan_core::cost::AttentionFlops::CausalHalved,
            1.0,
        )
        .map_err(|e| bad(e.to_string()))?;
        Ok(StepFlops {
            six_n: 6.0 * parameters as f64 * tokens as f64,
            with_attention: flops.model_flops as f64,
            peak_flops: hardware.peak_flops as f64,
        })
    }

    /// `(mfu_6n, mfu_attention)` of a step that took `step_time_s`.
    pub fn mfu(&self, step_time_s: f64) -> (f64, f64) {
        let capacity = step_time_s.max(f64::MIN_POSITIVE) * self.peak_flops;
        (self.six_n / capacity, self.with_attention / capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse() {
        assert_eq!(parse_device("cpu"), Ok(Device { kind: Kind::Cpu, ordinal: 0 }));
        assert_eq!(parse_device("cuda"), Ok(Device { kind: Kind::Cuda, ordinal: 0 }));
        assert_eq!(parse_device("cuda:3"), Ok(Device { kind: Kind::Cuda, ordinal: 3 }));
        assert_eq!(parse_device("HIP:1"), Ok(Device { kind: Kind::Hip, ordinal: 1 }));
        assert!(parse_device("tpu").unwrap_err().contains("cuda:N"));
        assert!(parse_device("cuda:x").is_err());
        assert!(parse_device("cpu:1").is_err());
    }

    #[test]
    fn unavailable_gpus_are_one_line_with_their_own_exit_code() {
        for name in ["cuda", "hip:1"] {
            let device = parse_device(name).unwrap();
            let Err(failure) = device.open(false, CpuBackend::new) else { panic!("{name} opened: no GPU here") };
            assert_eq!(failure.code(), exit::DEVICE_UNAVAILABLE);
            assert!(failure.message().starts_with(&format!("--device {}", device.label())), "{}", failure.message());
        }
    }

    /// Runtime errors keep their type to here, and each kind has its exit code.
    #[test]
    fn runtime_errors_map_to_their_exit_codes() {
        use memo_runtime::{CheckpointMismatch, TokenError};
        let out_of_memory = RuntimeError::Backend(BackendError::OutOfMemory { what: "device arena", bytes: 1 });
        assert_eq!(runtime_exit_code(&out_of_memory), exit::DOES_NOT_FIT);
        let unavailable = RuntimeError::Backend(BackendError::Unavailable("no driver".into()));
        assert_eq!(runtime_exit_code(&unavailable), exit::DEVICE_UNAVAILABLE);
        assert_eq!(runtime_exit_code(&RuntimeError::Invalid(Vec::new())), exit::INTERNAL_ERROR);
        let failure = runtime_failure(RuntimeError::Checkpoint(CheckpointMismatch::OtherModel));
        assert_eq!(failure.code(), exit::BAD_INPUT);
        assert!(failure.message().starts_with("the checkpoint belongs to another model"), "{}", failure.message());
        let tokens = RuntimeError::Tokens(TokenError::OutsideVocabulary { token: 300, vocab: 256 });
        assert_eq!(runtime_failure(tokens).message(), "token 300 is outside the vocabulary of 256");
    }

    /// 6N and the attention count agree up to the biases, norms and attention terms: on the tiny
    /// model at 64 tokens attention is small, so the two MFUs are within 10%.
    #[test]
    fn the_two_mfus_differ_by_attention() {
        let model = memo_runtime::training_model("tiny", 64).unwrap();
        let flops = StepFlops::of(&model, &cpu_hardware(1 << 30)).unwrap();
        let (six_n, attention) = flops.mfu(1.0);
        assert!(attention > 0.0 && six_n > 0.0);
        assert!((attention / six_n - 1.0).abs() < 0.1, "{six_n} vs {attention}");
        // At a long sequence, attention dominates.
        let long = memo_runtime::training_model("tiny", 1 << 16).unwrap();
        let flops = StepFlops::of(&long, &cpu_hardware(1 << 30)).unwrap();
        assert!(flops.with_attention > 2.0 * flops.six_n);
    }
}
