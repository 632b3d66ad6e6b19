//! The CUDA backend against the CPU reference. Without a driver or a device every test here
//! prints `SKIP: <why>` and passes; on a GPU machine:
//! - every op (attention included) runs on the same random inputs on `runtime_cpu` (its `ops`) and
//!   on `CudaBackend`, and the outputs agree within the bounds of [`close`];
//! - bad input (a token outside the vocabulary, a NaN gradient norm) fails at synchronize with
//!   the instruction, and AdamW leaves the parameter untouched;
//! - a tiny GPT trains three steps on both backends through `memo_runtime::Trainer` (keep-all and
//!   MEMO with swaps), losses and parameters within [`TRAIN_LOSS_RELATIVE`] and
//!   [`PARAMETER_ABSOLUTE`].
//!
//! Tolerances (why): bf16 outputs may differ by the f32 summation order (cuBLAS, block
//! reductions) and by `tanhf`/`expf` ulps before the one bf16 rounding, so one bf16 ulp (2^-8
//! relative) is expected and 2e-2 relative plus 1e-3 of the tensor's largest magnitude is
//! allowed (the absolute part covers values near zero after cancellation). f32 scalars (loss,
//! sum of squares) and the f32 optimizer state: 1e-4 relative plus 1e-6. Attention's lse:
//! 1e-3 relative plus 2^-8 of the largest (the kernels round the rotated q and k to bf16, 2^-9
//! each, so a score moves by up to about 2^-8 of the largest score, and the lse with it; the CPU
//! keeps them f32: on the H200, 2026-12-04, 8.3e-4 on an lse of 0.81 when the largest was 4.3);
//! its backward's gradients: 5e-2 relative plus 5e-3 of the largest (its
//! tensor-core path rounds probabilities to bf16 before the products).

#[path = "../../tests/support/skip.rs"]
mod skip;

use memo_plan_core::plan::{Access, EventId, Op, Strategy};
use memo_runtime::data::{TextData, DEFAULT_TEXT};
use memo_runtime::{
    cpu_hardware, AdamW, Backend, BackendError, KernelArg, KernelContext, Space, Span, TrainOptions, Trainer,
};
use runtime_cpu::ops::{self, Arg, ArgData, OpContext};
use runtime_cpu::CpuBackend;
use runtime_cuda::CudaBackend;

/// Relative bound on bf16 outputs.
const BF16_RELATIVE: f32 = 2e-2;
/// Absolute bound on bf16 outputs, as a fraction of the tensor's largest magnitude.
const BF16_OF_MAX: f32 = 1e-3;
/// Relative bound on f32 values.
const F32_RELATIVE: f32 = 1e-4;
/// Attention's log-sum-exp (f32 from bf16 tensor-core scores), relative.
const LSE_RELATIVE: f32 = 1e-3;
/// Attention's log-sum-exp, of the largest magnitude: rounding the rotated q and k to bf16.
const LSE_OF_MAX: f32 = 1.0 / 256.0;
/// Attention backward's bf16 gradients, relative and of the largest magnitude: its kernels
/// round the probabilities and their gradients to bf16 for the tensor cores.
const ATTENTION_BACKWARD_RELATIVE: f32 = 5e-2;
/// See [`ATTENTION_BACKWARD_RELATIVE`].
const ATTENTION_BACKWARD_OF_MAX: f32 = 5e-3;
/// Loss after three training steps, relative.
const TRAIN_LOSS_RELATIVE: f32 = 2e-2;
/// Parameters after three steps: AdamW moves each element by about lr per step whatever the
/// gradient's size, so an element whose gradient is near zero may move the other way on the
/// GPU: allow 2 * lr * steps on any element, and at most 5% of elements beyond 1e-3.
const PARAMETER_ABSOLUTE: f32 = 2.0 * 3e-3 * 3.0 + 1e-3;

fn device() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(backend) => {
            println!("{}", backend.describe());
            Some(backend)
        }
        Err(error) => {
            skip::skip(format!("no CUDA device: {error}"));
            None
        }
    }
}

/// The backend can move to another thread (it makes its context current in every call).
#[test]
fn the_backend_is_send() {
    fn send<T: Send>() {}
    send::<CudaBackend>();
}

#[test]
fn without_a_driver_the_backend_is_unavailable_and_says_libcuda() {
    // Safety: only tries to dlopen the driver library under its usual names.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        skip::skip("a CUDA driver library is present here; the no-driver path is not reachable");
        return;
    }
    match CudaBackend::new(0) {
        Err(BackendError::Unavailable(message)) => assert!(message.contains("libcuda"), "{message}"),
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("a backend without a driver"),
    }
}

/// What an argument holds.
#[derive(Clone, Copy)]
enum Fill {
    /// bf16 in [-scale, scale).
    Bf16(f32),
    /// u32 ids below the bound.
    Ids(u32),
    /// One f32.
    Scalar(f32),
    /// f32 values (written by the op: only compared).
    F32,
    /// AdamW state rows of this many elements: master in [-0.1, 0.1), m small, v positive.
    State(usize),
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn fill(rows: u64, row_bytes: u64, how: Fill, rng: &mut Rng) -> Vec<u8> {
    let bytes = (rows * row_bytes) as usize;
    let mut out = Vec::with_capacity(bytes);
    match how {
        Fill::Bf16(scale) => {
            for _ in 0..bytes / 2 {
                let x = (rng.next() * 2.0 - 1.0) * scale;
                out.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
            }
        }
        Fill::Ids(bound) => {
            for _ in 0..bytes / 4 {
                out.extend_from_slice(&(((rng.next() * bound as f32) as u32).min(bound - 1)).to_le_bytes());
            }
        }
        Fill::Scalar(value) => out.extend_from_slice(&value.to_le_bytes()),
        Fill::F32 => {
            for _ in 0..bytes / 4 {
                out.extend_from_slice(&rng.next().to_le_bytes());
            }
        }
        Fill::State(e) => {
            for _ in 0..rows {
                let parts = [(0.2, -0.1), (0.02, -0.01), (1e-4, 0.0)];
                for (scale, shift) in parts {
                    for _ in 0..e {
                        out.extend_from_slice(&(rng.next() * scale + shift).to_le_bytes());
                    }
                }
            }
        }
    }
    out
}

/// An op and its arguments' (rows, bytes per row, contents).
type Case = (Op, Vec<(u64, u64, Fill)>);

const H: u64 = 96;
const VOCAB: u64 = 300;
const ROWS: u64 = 130;
const FF: u64 = 200;

fn context() -> KernelContext {
    KernelContext {
        hidden: H,
        heads: 2,
        kv_heads: 0,
        kv_replicated: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len: ROWS,
        vocab: VOCAB,
        loss_scale_tokens: ROWS,
        adamw: AdamW { step: 3, ..AdamW::default() },
        rank: 0,
        ranks: 1,
        context_rank: 0,
        context_ranks: 1,
    }
}

/// Attention's context: two sequences of 65 rows (a partial last tile of 64), 2 heads of 64.
fn attention_context() -> KernelContext {
    KernelContext { hidden: 128, heads: 2, seq_len: 65, ..context() }
}

/// The attention ops on [`attention_context`].
fn attention_cases() -> Vec<Case> {
    let (r, w, lse) = (130, 256, 8);
    let b = Fill::Bf16(1.0);
    vec![
        (Op::Attention, vec![(r, w, b), (r, w, b), (r, w, b), (r, w, b), (r, lse, Fill::F32)]),
        (
            Op::AttentionBackward,
            vec![
                (r, w, b),
                (r, w, b),
                (r, w, b),
                (r, w, b),
                (r, lse, Fill::F32),
                (r, w, b),
                (r, w, b),
                (r, w, b),
                (r, w, b),
            ],
        ),
    ]
}

/// Every other op with a GPU recipe: (op, [(rows, row_bytes, fill)]).
fn cases() -> Vec<Case> {
    let (h, v, r, f) = (H * 2, VOCAB * 2, ROWS, FF * 2);
    let b = Fill::Bf16(1.0);
    let ids = Fill::Ids(VOCAB as u32);
    vec![
        (Op::Embedding, vec![(r, 4, ids), (VOCAB, h, b), (r, h, b)]),
        (Op::LayerNorm, vec![(r, h, Fill::Bf16(3.0)), (1, h, b), (1, h, b), (r, h, b)]),
        (Op::Linear, vec![(r, h, b), (FF, h, Fill::Bf16(0.1)), (1, f, b), (r, f, b)]),
        (Op::Gelu, vec![(r, f, Fill::Bf16(4.0)), (r, f, b)]),
        (Op::Add, vec![(r, h, b), (r, h, b), (r, h, b)]),
        (Op::LinearBackwardInput, vec![(r, f, b), (FF, h, Fill::Bf16(0.1)), (r, h, b)]),
        (Op::LinearBackwardInputAccumulate, vec![(r, f, b), (FF, h, Fill::Bf16(0.1)), (r, h, b)]),
        (Op::LinearBackwardWeight, vec![(r, h, b), (r, f, b), (FF, h, b), (1, f, b)]),
        (Op::GeluBackward, vec![(r, f, Fill::Bf16(4.0)), (r, f, b), (r, f, b)]),
        (Op::LayerNormBackward, vec![(r, h, Fill::Bf16(3.0)), (1, h, b), (r, h, b), (r, h, b), (1, h, b), (1, h, b)]),
        (Op::Classifier, vec![(r, h, b), (VOCAB, h, Fill::Bf16(0.1)), (r, v, b)]),
        (Op::CrossEntropy, vec![(r, v, Fill::Bf16(5.0)), (r, 4, ids), (1, 4, Fill::Scalar(0.5))]),
        (Op::ClassifierBackwardWeight, vec![(r, h, b), (r, v, Fill::Bf16(0.01)), (VOCAB, h, b)]),
        (Op::EmbeddingBackward, vec![(r, 4, Fill::Ids(7)), (r, h, b), (VOCAB, h, b)]),
        (Op::Zero, vec![(r, h, b)]),
        (Op::GradNormSquared, vec![(FF, h, b), (1, 4, Fill::Scalar(0.25))]),
        (
            Op::AdamW,
            vec![
                (FF, h, Fill::Bf16(0.1)),
                (FF, h, b),
                (FF, H * 12, Fill::State(H as usize)),
                (1, 4, Fill::Scalar(4.0)),
            ],
        ),
    ]
}

fn cpu_context(ctx: &KernelContext) -> OpContext {
    OpContext {
        hidden: ctx.hidden as usize,
        heads: ctx.heads as usize,
        kv_heads: ctx.kv_heads as usize,
        kv_replicated: ctx.kv_replicated,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len: ctx.seq_len as usize,
        vocab: ctx.vocab as usize,
        loss_scale_tokens: ctx.loss_scale_tokens as usize,
        adamw: ctx.adamw,
        context_rank: usize::try_from(ctx.context_rank).unwrap_or(usize::MAX),
        context_ranks: usize::try_from(ctx.context_ranks).unwrap_or(usize::MAX),
    }
}

fn run_cpu(op: Op, shapes: &[(u64, u64, Fill)], data: &mut [Vec<u8>], ctx: &KernelContext) -> Result<(), String> {
    let mut args: Vec<Arg<'_>> = data
        .iter_mut()
        .zip(shapes)
        .zip(op.signature())
        .map(|((bytes, &(rows, row_bytes, _)), &(_, access))| Arg {
            data: if access == Access::Read { ArgData::Read(bytes) } else { ArgData::Write(bytes) },
            first_row: 0,
            rows: rows as usize,
            row_bytes: row_bytes as usize,
        })
        .collect();
    let group = ops::Group { rank: ctx.rank as usize, ranks: ctx.ranks.max(1) as usize };
    ops::execute_on_rank(op, &mut args, &cpu_context(ctx), group, 1).map_err(|e| e.to_string())
}

/// Places the arguments 256-aligned in a fresh arena, uploads them, launches `op` as instruction
/// 7 on the compute stream, synchronizes, and downloads them.
fn run_gpu(
    gpu: &mut CudaBackend,
    op: Op,
    shapes: &[(u64, u64, Fill)],
    data: &[Vec<u8>],
    ctx: &KernelContext,
) -> Result<Vec<Vec<u8>>, BackendError> {
    let mut offset = 0u64;
    let mut args = Vec::new();
    for (&(rows, row_bytes, _), &(_, access)) in shapes.iter().zip(op.signature()) {
        let span = Span { space: Space::Device, offset, len: rows * row_bytes };
        args.push(KernelArg { span, first_row: 0, rows, row_bytes, access });
        offset += (rows * row_bytes).div_ceil(256) * 256 + 256;
    }
    gpu.allocate(offset, 4096, 2)?;
    for (arg, bytes) in args.iter().zip(data) {
        gpu.upload(arg.span, bytes)?;
    }
    // Safety: the only work enqueued since `allocate`, on one stream; nothing else runs until
    // `synchronize` below.
    unsafe { gpu.launch(7, memo_plan_core::plan::Stream::Compute, op, &args, ctx) }?;
    gpu.synchronize()?;
    args.iter().map(|arg| gpu.download(arg.span)).collect()
}

fn bf16s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(2).map(|p| half::bf16::from_bits(u16::from_le_bytes([p[0], p[1]])).to_f32()).collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
}

/// Whether `gpu` is within the bounds of `cpu` (see the file's docs); the first offender.
fn close(gpu: &[f32], cpu: &[f32], relative: f32, of_max: f32) -> Result<(), String> {
    let max = cpu.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (index, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        let bound = relative * c.abs() + of_max * max + 1e-6;
        // NaN on either side fails too.
        let within = (g - c).abs() <= bound;
        if !within {
            return Err(format!("element {index}: gpu {g} vs cpu {c} (bound {bound}, largest {max})"));
        }
    }
    Ok(())
}

#[test]
fn every_op_matches_the_cpu_reference() {
    let Some(mut gpu) = device() else { return };
    println!("device: {} (sm_{})", gpu.name(), gpu.compute_capability());
    let mut failures = Vec::new();
    let all = cases()
        .into_iter()
        .map(|c| (c, context()))
        .chain(attention_cases().into_iter().map(|c| (c, attention_context())));
    for (case, ((op, shapes), ctx)) in all.enumerate() {
        let mut rng = Rng(0x5eed_0000 + case as u64 * 7919);
        let mut inputs: Vec<Vec<u8>> = shapes.iter().map(|&(rows, rb, how)| fill(rows, rb, how, &mut rng)).collect();
        if op == Op::AttentionBackward {
            // The backward reads the forward's out and lse: make them consistent with q, k, v.
            let forward_shapes = &shapes[..5];
            let mut forward: Vec<Vec<u8>> = inputs[..5].to_vec();
            run_cpu(Op::Attention, forward_shapes, &mut forward, &ctx).expect("the CPU attention forward");
            inputs[3] = forward[3].clone();
            inputs[4] = forward[4].clone();
        }
        let (relative, of_max) = if op == Op::AttentionBackward {
            // Tensor-core attention rounds P and dS to bf16 before its products.
            (ATTENTION_BACKWARD_RELATIVE, ATTENTION_BACKWARD_OF_MAX)
        } else {
            (BF16_RELATIVE, BF16_OF_MAX)
        };
        let mut cpu = inputs.clone();
        if let Err(error) = run_cpu(op, &shapes, &mut cpu, &ctx) {
            panic!("{}: the CPU reference failed: {error}", op.name());
        }
        let gpu_out = match run_gpu(&mut gpu, op, &shapes, &inputs, &ctx) {
            Ok(out) => out,
            Err(error) => {
                failures.push(format!("{}: {error}", op.name()));
                continue;
            }
        };
        for (index, ((&(_, _, how), g), c)) in shapes.iter().zip(&gpu_out).zip(&cpu).enumerate() {
            let name = op.signature()[index].0;
            let verdict = match how {
                Fill::Bf16(_) => close(&bf16s(g), &bf16s(c), relative, of_max),
                Fill::Scalar(_) | Fill::State(_) => close(&f32s(g), &f32s(c), F32_RELATIVE, 0.0),
                Fill::F32 => close(&f32s(g), &f32s(c), LSE_RELATIVE, LSE_OF_MAX),
                Fill::Ids(_) => (g == c).then_some(()).ok_or_else(|| "ids changed".to_string()),
            };
            match verdict {
                Ok(()) => {}
                Err(why) => failures.push(format!("{} `{name}`: {why}", op.name())),
            }
        }
        println!("{}: compared {} arguments", op.name(), shapes.len());
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn bad_input_fails_at_synchronize_and_adamw_writes_nothing() {
    let Some(mut gpu) = device() else { return };
    let ctx = context();
    // A token id equal to the vocabulary size.
    let (op, shapes) = cases().swap_remove(0);
    let mut rng = Rng(3);
    let mut inputs: Vec<Vec<u8>> = shapes.iter().map(|&(rows, rb, how)| fill(rows, rb, how, &mut rng)).collect();
    inputs[0][8..12].copy_from_slice(&(VOCAB as u32).to_le_bytes());
    match run_gpu(&mut gpu, op, &shapes, &inputs, &ctx) {
        Err(BackendError::Kernel { instruction: 7, message }) => {
            assert!(message.contains(&format!("token id {VOCAB} in row 2")), "{message}")
        }
        other => panic!("expected a kernel error at instruction 7, got {:?}", other.map(|_| ())),
    }
    // The status words were cleared: a good launch now succeeds.
    inputs[0][8..12].copy_from_slice(&0u32.to_le_bytes());
    run_gpu(&mut gpu, op, &shapes, &inputs, &ctx).expect("a good launch after a failed one");
    // AdamW with a NaN gradient norm.
    let (op, shapes) = cases().pop().expect("adamw");
    let mut inputs: Vec<Vec<u8>> = shapes.iter().map(|&(rows, rb, how)| fill(rows, rb, how, &mut rng)).collect();
    inputs[3] = f32::NAN.to_le_bytes().to_vec();
    let before = inputs[0].clone();
    match run_gpu(&mut gpu, op, &shapes, &inputs, &ctx) {
        Err(BackendError::Kernel { instruction: 7, message }) => assert!(message.contains("NaN"), "{message}"),
        other => panic!("expected a kernel error, got {:?}", other.map(|_| ())),
    }
    let span = Span { space: Space::Device, offset: 0, len: before.len() as u64 };
    assert_eq!(gpu.download(span).expect("download"), before, "adamw changed the parameter despite a NaN norm");
}

#[test]
fn spans_outside_the_memory_and_unknown_events_are_errors() {
    let Some(mut gpu) = device() else { return };
    gpu.allocate(1024, 512, 1).expect("allocate");
    let outside = Span { space: Space::Device, offset: 1000, len: 100 };
    assert!(matches!(gpu.download(outside), Err(BackendError::OutOfBounds { size: 1024, .. })));
    let host = Span { space: Space::Host, offset: 0, len: 512 };
    let device = Span { space: Space::Device, offset: 512, len: 512 };
    gpu.upload(host, &[7u8; 512]).expect("upload to the slab");
    // Safety: the only copy, and no other work touches its spans before `synchronize`.
    unsafe { gpu.copy(0, memo_plan_core::plan::Stream::HostToDevice, host, device) }.expect("copy");
    gpu.record(1, memo_plan_core::plan::Stream::HostToDevice, EventId(0)).expect("record");
    gpu.wait(2, memo_plan_core::plan::Stream::Compute, EventId(0)).expect("wait");
    assert!(gpu.wait(3, memo_plan_core::plan::Stream::Compute, EventId(1)).is_err());
    gpu.synchronize().expect("synchronize");
    assert_eq!(gpu.download(device).expect("download"), vec![7u8; 512]);
    assert_eq!(gpu.memory().device_bytes, 1024);
}

/// Three steps of a tiny GPT: (losses, parameters as f32).
fn train<B: Backend>(backend: B, strategy: Strategy, alpha: Option<f64>) -> Result<(Vec<f32>, Vec<Vec<f32>>), String> {
    let mut model = memo_plan_core::model::ModelConfig::new("test", 2, 64, 4, 32, 1);
    model.vocab = 256;
    let options = TrainOptions {
        model: model.clone(),
        strategy,
        forced_alpha: alpha,
        hardware: cpu_hardware(1 << 30),
        seed: 11,
        adamw: AdamW { lr: 3e-3, ..AdamW::default() },
    };
    let mut trainer = Trainer::new(backend, &options).map_err(|e| e.to_string())?;
    let totals = trainer.report().plan.totals;
    let memory = trainer.memory();
    assert_eq!((memory.device_bytes, memory.host_bytes), (totals.arena_bytes, totals.host_bytes));
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).map_err(|e| e.to_string())?;
    let mut losses = Vec::new();
    for _ in 0..3 {
        let (tokens, targets) = data.next_batch(1, 32);
        losses.push(trainer.step(&tokens, &targets).map_err(|e| e.to_string())?);
    }
    let parameters = trainer.parameters().map_err(|e| e.to_string())?;
    Ok((losses, parameters.iter().map(|(_, bytes)| bf16s(bytes)).collect()))
}

#[test]
fn a_tiny_model_trains_like_on_the_cpu() {
    let Some(_) = device() else { return };
    for (strategy, alpha) in [(Strategy::KeepAll, None), (Strategy::Memo, Some(0.5))] {
        let (cpu_losses, cpu_parameters) = train(CpuBackend::new(), strategy, alpha).expect("the CPU trains");
        let gpu = CudaBackend::new(0).expect("the device opened above");
        let (gpu_losses, gpu_parameters) = match train(gpu, strategy, alpha) {
            Ok(result) => result,
            Err(error) => panic!("{strategy:?}: the GPU failed: {error}"),
        };
        println!("{strategy:?}: cpu losses {cpu_losses:?}, gpu losses {gpu_losses:?}");
        for (g, c) in gpu_losses.iter().zip(&cpu_losses) {
            assert!(g.is_finite() && (g - c).abs() <= TRAIN_LOSS_RELATIVE * c.abs(), "{strategy:?}: loss {g} vs {c}");
        }
        let (mut elements, mut beyond) = (0usize, 0usize);
        for (g, c) in gpu_parameters.iter().zip(&cpu_parameters) {
            for (x, y) in g.iter().zip(c) {
                let difference = (x - y).abs();
                assert!(difference <= PARAMETER_ABSOLUTE, "{strategy:?}: a parameter moved {difference}: {x} vs {y}");
                elements += 1;
                beyond += usize::from(difference > 1e-3);
            }
        }
        assert!(beyond * 20 <= elements, "{strategy:?}: {beyond} of {elements} parameters differ by more than 1e-3");
    }
}

#[test]
fn a_measured_step_has_a_timeline() {
    let Some(gpu) = device() else { return };
    let mut model = memo_plan_core::model::ModelConfig::new("test", 2, 64, 4, 32, 1);
    model.vocab = 256;
    let options = TrainOptions {
        model,
        strategy: Strategy::Memo,
        forced_alpha: Some(0.5),
        hardware: cpu_hardware(1 << 30),
        seed: 5,
        adamw: AdamW::default(),
    };
    let mut trainer = Trainer::new(gpu.measure(), &options).expect("a trainer on the GPU");
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).expect("text");
    let (tokens, targets) = data.next_batch(1, 32);
    trainer.step(&tokens, &targets).expect("a step");
    let timeline = trainer.last_step_timeline().expect("measured");
    assert!(timeline.step_time_s > 0.0 && timeline.busy_s[0] > 0.0, "{:?}", (timeline.step_time_s, timeline.busy_s));
    assert!(timeline.spans.iter().all(|s| s.start_s >= 0.0 && s.end_s >= s.start_s));
    println!(
        "measured step: {:.3} ms; busy compute {:.3} ms, d2h {:.3} ms, h2d {:.3} ms",
        timeline.step_time_s * 1e3,
        timeline.busy_s[0] * 1e3,
        timeline.busy_s[1] * 1e3,
        timeline.busy_s[2] * 1e3
    );
}

/// Attention on every choice of `MEMO_CUDA_ATTENTION` (cuDNN in both backward forms, our
/// baseline kernels) against the CPU reference, on two sequences of 65 tokens, 2 heads of 64 and
/// one of 200 tokens, 2 heads of 128, within the attention bounds above (spec/backends.md gives
/// the same for each choice: cuDNN too rounds the rotated q and k and P to bf16); the
/// deterministic backward twice gives the same bits. With `MEMO_REQUIRE_CUDNN=1` (set by
/// scripts/gpu-check.sh) a cuDNN choice that fell back to our kernels fails instead of passing.
/// With `MEMO_ATTENTION_DUMP=DIR` every launch's arguments after the GPU ran are written to DIR
/// (`<choice>-<op>-s<seq>-<argument>.bin`, raw little-endian bf16 or f32, one `cases.txt` line
/// per launch: name, op, rows, row bytes, heads, tokens per sequence), for
/// scripts/cudnn_attention_check.py to compare with a float64 PyTorch reference.
#[test]
fn attention_matches_the_cpu_reference_under_every_choice() {
    use runtime_cuda::AttentionChoice;
    if let Err(error) = CudaBackend::new(0) {
        skip::skip(format!("no CUDA device: {error}"));
        return;
    }
    let require_cudnn = std::env::var_os("MEMO_REQUIRE_CUDNN").is_some();
    let wide = KernelContext { hidden: 256, heads: 2, seq_len: 200, ..context() };
    let mut failures = Vec::new();
    for choice in ["cudnn", "cudnn-deterministic", "baseline"] {
        let choice = AttentionChoice::parse(choice).expect("a choice");
        let mut gpu = CudaBackend::with_attention(0, Some(choice)).expect("the device opened once already");
        println!("{}: {}", choice.name(), gpu.describe());
        let mut cases: Vec<(Case, KernelContext)> =
            attention_cases().into_iter().map(|c| (c, attention_context())).collect();
        let b = Fill::Bf16(1.0);
        let (r, w) = (200, 512);
        cases.push(((Op::Attention, vec![(r, w, b), (r, w, b), (r, w, b), (r, w, b), (r, 8, Fill::F32)]), wide));
        cases.push((
            (
                Op::AttentionBackward,
                vec![
                    (r, w, b),
                    (r, w, b),
                    (r, w, b),
                    (r, w, b),
                    (r, 8, Fill::F32),
                    (r, w, b),
                    (r, w, b),
                    (r, w, b),
                    (r, w, b),
                ],
            ),
            wide,
        ));
        if matches!(choice, AttentionChoice::Cudnn { .. }) {
            // Grouped K/V on cuDNN (our kernels run multi-head attention only): 4 query heads of
            // 64 on 2 K/V heads; K/V replicated at t = 4 (2 K/V heads, 2 query heads a rank),
            // rank 2 reading K/V head 1 of each row, its dk and dv head 0 zero.
            let grouped = KernelContext { hidden: 256, heads: 4, kv_heads: 2, seq_len: 200, ..context() };
            let replicated = KernelContext {
                hidden: 128,
                heads: 2,
                kv_heads: 2,
                kv_replicated: true,
                seq_len: 200,
                rank: 2,
                ranks: 4,
                ..context()
            };
            for ctx in [grouped, replicated] {
                let (q, k, lse) = ((r, ctx.heads * 128, b), (r, ctx.kv_heads * 128, b), (r, ctx.heads * 4, Fill::F32));
                cases.push(((Op::Attention, vec![q, k, k, q, lse]), ctx));
                cases.push(((Op::AttentionBackward, vec![q, k, k, q, lse, q, q, k, k]), ctx));
            }
        }
        for (case, ((op, shapes), ctx)) in cases.into_iter().enumerate() {
            let mut rng = Rng(0xa77e_0000 + case as u64);
            let mut inputs: Vec<Vec<u8>> =
                shapes.iter().map(|&(rows, rb, how)| fill(rows, rb, how, &mut rng)).collect();
            if op == Op::AttentionBackward {
                let mut forward: Vec<Vec<u8>> = inputs[..5].to_vec();
                run_cpu(Op::Attention, &shapes[..5], &mut forward, &ctx).expect("the CPU attention forward");
                inputs[3] = forward[3].clone();
                inputs[4] = forward[4].clone();
            }
            let mut cpu = inputs.clone();
            run_cpu(op, &shapes, &mut cpu, &ctx).expect("the CPU reference");
            let label = format!(
                "{} {} s={} heads={} kv_heads={} rank {} of {}",
                choice.name(),
                op.name(),
                ctx.seq_len,
                ctx.heads,
                ctx.kv_heads,
                ctx.rank,
                ctx.ranks
            );
            let dump = std::env::var_os("MEMO_ATTENTION_DUMP").map(std::path::PathBuf::from);
            let out = match run_gpu(&mut gpu, op, &shapes, &inputs, &ctx) {
                Ok(out) => out,
                Err(error) => {
                    failures.push(format!("{label}: {error}"));
                    continue;
                }
            };
            if let Some(dir) = &dump {
                let mut stem = format!("{}-{}-s{}", choice.name(), op.name(), ctx.seq_len);
                if ctx.kv_heads != 0 {
                    stem = format!("{stem}-kv{}-rank{}", ctx.kv_heads, ctx.rank);
                }
                let written = std::fs::create_dir_all(dir).and_then(|()| {
                    for (index, bytes) in out.iter().enumerate() {
                        std::fs::write(dir.join(format!("{stem}-{}.bin", op.signature()[index].0)), bytes)?;
                    }
                    let line =
                        format!("{stem} {} {} {} {} {}\n", op.name(), shapes[0].0, shapes[0].1, ctx.heads, ctx.seq_len);
                    use std::io::Write;
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(dir.join("cases.txt"))?
                        .write_all(line.as_bytes())
                });
                if let Err(error) = written {
                    failures.push(format!("{label}: writing MEMO_ATTENTION_DUMP: {error}"));
                }
            }
            let (relative, of_max) = if op == Op::AttentionBackward {
                (ATTENTION_BACKWARD_RELATIVE, ATTENTION_BACKWARD_OF_MAX)
            } else {
                (BF16_RELATIVE, BF16_OF_MAX)
            };
            for (index, ((&(_, _, how), g), c)) in shapes.iter().zip(&out).zip(&cpu).enumerate() {
                let verdict = match how {
                    Fill::F32 => close(&f32s(g), &f32s(c), LSE_RELATIVE, LSE_OF_MAX),
                    _ => close(&bf16s(g), &bf16s(c), relative, of_max),
                };
                if let Err(why) = verdict {
                    failures.push(format!("{label} `{}`: {why}", op.signature()[index].0));
                }
            }
            if choice == (AttentionChoice::Cudnn { deterministic: true }) && op == Op::AttentionBackward {
                match run_gpu(&mut gpu, op, &shapes, &inputs, &ctx) {
                    Ok(again) if again == out => {}
                    Ok(_) => {
                        failures.push(format!("{label}: the deterministic backward gave other bits the second time"))
                    }
                    Err(error) => failures.push(format!("{label} (again): {error}")),
                }
            }
            println!("{label}: compared");
        }
        // What ran: a cuDNN version rule may have sent some launches to our kernels (the line
        // says which and why; spec/backends.md's table), which MEMO_REQUIRE_CUDNN accepts.
        println!("{}: attention ran as: {}", choice.name(), gpu.attention());
        if require_cudnn && matches!(choice, AttentionChoice::Cudnn { .. }) && !gpu.attention().starts_with("cuDNN") {
            failures.push(format!(
                "{}: MEMO_REQUIRE_CUDNN is set but attention ran as: {}",
                choice.name(),
                gpu.attention()
            ));
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// Attention's throughput on the device (`MEMO_ATTENTION_BENCH=1`, set by scripts/gpu-check.sh;
/// otherwise SKIP): forward and backward at 16K tokens, 16 heads of 128, under the attention
/// `MEMO_CUDA_ATTENTION` names (cuDNN by default), timed by the backend's own events
/// (`measure`) over 3 launches after one warm-up, printed as TFLOP/s with causal FLOPs (forward
/// 2 * 2 * s^2/2 * h * d, backward 2.5 times that). Prints, asserts nothing about speed.
#[test]
fn attention_throughput() {
    if std::env::var_os("MEMO_ATTENTION_BENCH").is_none() {
        skip::skip("MEMO_ATTENTION_BENCH is not set (scripts/gpu-check.sh sets it)");
        return;
    }
    let Some(gpu) = device() else { return };
    let mut gpu = gpu.measure();
    let (s, heads, d) = (16384u64, 16u64, 128u64);
    let ctx = KernelContext { hidden: heads * d, heads, seq_len: s, ..context() };
    let (w, lse) = (heads * d * 2, heads * 4);
    let shapes_f: Vec<(u64, u64)> = vec![(s, w), (s, w), (s, w), (s, w), (s, lse)];
    let shapes_b: Vec<(u64, u64)> = vec![(s, w), (s, w), (s, w), (s, w), (s, lse), (s, w), (s, w), (s, w), (s, w)];
    let mut offset = 0u64;
    let mut spans = Vec::new();
    for &(rows, row_bytes) in &shapes_b {
        spans.push((Span { space: Space::Device, offset, len: rows * row_bytes }, rows, row_bytes));
        offset += (rows * row_bytes).div_ceil(256) * 256;
    }
    gpu.allocate(offset, 4096, 1).expect("allocate");
    let mut rng = Rng(11);
    for (index, &(span, rows, row_bytes)) in spans.iter().enumerate() {
        let how = if index == 4 { Fill::F32 } else { Fill::Bf16(1.0) };
        gpu.upload(span, &fill(rows, row_bytes, how, &mut rng)).expect("upload");
    }
    let args = |op: Op, shapes: &[(u64, u64)]| -> Vec<KernelArg> {
        shapes
            .iter()
            .zip(&spans)
            .zip(op.signature())
            .map(|((&(rows, row_bytes), &(span, _, _)), &(_, access))| KernelArg {
                span,
                first_row: 0,
                rows,
                row_bytes,
                access,
            })
            .collect()
    };
    let (forward, backward) = (args(Op::Attention, &shapes_f), args(Op::AttentionBackward, &shapes_b));
    let flops_forward = 2.0 * 2.0 * (s * s / 2) as f64 * (heads * d) as f64;
    for (op, launch_args, flops) in
        [(Op::Attention, &forward, flops_forward), (Op::AttentionBackward, &backward, 2.5 * flops_forward)]
    {
        let mut seconds = Vec::new();
        for round in 0..4 {
            // Safety: one launch at a time on one stream, synchronized before the next.
            unsafe { gpu.launch(round, memo_plan_core::plan::Stream::Compute, op, launch_args, &ctx) }.expect("launch");
            gpu.synchronize().expect("synchronize");
            if let Some(timings) = gpu.timings() {
                if round > 0 {
                    seconds.extend(timings.iter().map(|&(_, start, end)| end - start));
                }
            }
        }
        let best = seconds.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "attention throughput: {} s={s} heads={heads} d={d} [{}]: best {:.3} ms, {:.0} TFLOP/s (causal)",
            op.name(),
            gpu.attention(),
            best * 1e3,
            flops / best / 1e12
        );
    }
}
