//! Tensor and sequence parallelism on the CPU (issue 18, `spec/tensor-parallel.md`): `t` ranks,
//! each a thread with its own CPU backend and arena, joined by an in-process group.

use std::sync::Arc;

use memo_plan_core::check::CheckedPlan;
use memo_plan_core::model::{Architecture, Biases, ModelConfig};
use memo_plan_core::plan::BufferKind;
use memo_plan_core::plan::{Access, Action, EventId, Op, Plan, Strategy, Stream, TensorRole};
use memo_runtime::checkpoint::{Checkpoint, StateKind};
use memo_runtime::collective::{reduce, Element, Reduction};
use memo_runtime::data::{TextData, DEFAULT_TEXT};
use memo_runtime::{
    cpu_hardware, AdamW, Backend, BackendError, Collectives, KernelArg, KernelContext, LocalGroup, LocalRank,
    NamedBytes, ParallelTrainer, PlannedStep, Replay, RuntimeError, Space, Span, TrainOptions, Trainer,
};
use runtime_cpu::CpuBackend;

fn model(layers: u32, hidden: u64, heads: u64, seq: u64, micro_batch: u64) -> ModelConfig {
    let mut model = ModelConfig::new("test", layers, hidden, heads, seq, micro_batch);
    model.vocab = 256;
    model
}

fn options(model: &ModelConfig, strategy: Strategy, alpha: Option<f64>) -> TrainOptions {
    TrainOptions {
        model: model.clone(),
        strategy,
        forced_alpha: alpha,
        hardware: cpu_hardware(1 << 30),
        seed: 11,
        adamw: AdamW { lr: 3e-3, ..AdamW::default() },
    }
}

fn parallel_trainer(options: &TrainOptions, t: u64, checked: bool) -> ParallelTrainer<CpuBackend> {
    let planned = PlannedStep::tensor_parallel(options, t).unwrap();
    let ranks = LocalGroup::ranks(t as usize)
        .into_iter()
        .map(|rank| {
            let group: Arc<dyn Collectives> = Arc::new(rank);
            let backend = if checked { CpuBackend::checked() } else { CpuBackend::new() };
            (backend.with_collectives(Arc::clone(&group)), group)
        })
        .collect();
    ParallelTrainer::with_plan(planned, ranks).unwrap()
}

/// Runs `f(rank, backend)` for every rank of a group of `t` CPU backends (checked mode when
/// asked), each on its own thread with `arena` bytes allocated; results in rank order.
fn on_backends<R: Send>(t: usize, checked: bool, arena: u64, f: impl Fn(usize, &mut CpuBackend) -> R + Sync) -> Vec<R> {
    let backends: Vec<CpuBackend> = LocalGroup::ranks(t)
        .into_iter()
        .map(|rank| {
            let backend = if checked { CpuBackend::checked() } else { CpuBackend::new() };
            let mut backend = backend.with_collectives(Arc::new(rank));
            backend.allocate(arena, 0, 4).unwrap();
            backend
        })
        .collect();
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> =
            backends.into_iter().enumerate().map(|(k, mut b)| scope.spawn(move || f(k, &mut b))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn arg(offset: u64, rows: u64, row_bytes: u64, access: Access) -> KernelArg {
    KernelArg {
        span: Span { space: Space::Device, offset, len: rows * row_bytes },
        first_row: 0,
        rows,
        row_bytes,
        access,
    }
}

fn context(t: usize) -> KernelContext {
    KernelContext {
        hidden: 3,
        heads: 1,
        kv_heads: 0,
        kv_replicated: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len: 4,
        vocab: 256,
        loss_scale_tokens: 4 * t as u64,
        adamw: AdamW::default(),
        rank: 0,
        ranks: 1,
        context_rank: 0,
        context_ranks: 1,
    }
}

fn bf16_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(|v| half::bf16::from_f32(v).to_le_bytes()).collect()
}

/// The backend's all_gather and reduce_scatter launches give the group's results (rank order,
/// f32 sums rounded once) on 1 to 4 ranks, with odd row widths, in plain and checked mode.
#[test]
fn the_backend_runs_a_plans_collectives_on_its_group() {
    let (rows, width) = (3u64, 5u64); // r = 3 rows of 5 bf16 elements each
    let row_bytes = 2 * width;
    for t in 1..=4usize {
        for checked in [false, true] {
            let local = rows * row_bytes;
            let whole = t as u64 * local;
            // Arena: x (local) | gathered (whole) | partial (whole) | scattered (local).
            let results = on_backends(t, checked, 2 * local + 2 * whole, |k, backend| {
                let x: Vec<f32> = (0..rows * width).map(|i| (k as u64 * 100 + i) as f32 * 0.37).collect();
                let partial: Vec<f32> =
                    (0..t as u64 * rows * width).map(|i| ((i * 7 + k as u64 * 3) % 13) as f32 * 0.11 + 1.0).collect();
                backend.upload(Span { space: Space::Device, offset: 0, len: local }, &bf16_bytes(x)).unwrap();
                backend
                    .upload(Span { space: Space::Device, offset: local + whole, len: whole }, &bf16_bytes(partial))
                    .unwrap();
                let gather =
                    [arg(0, rows, row_bytes, Access::Read), arg(local, t as u64 * rows, row_bytes, Access::Write)];
                let scatter = [
                    arg(local + whole, t as u64 * rows, row_bytes, Access::Read),
                    arg(local + 2 * whole, rows, row_bytes, Access::Write),
                ];
                // Safety: one stream; the two launches touch disjoint spans and nothing else runs.
                unsafe {
                    backend.launch(0, Stream::Collective, Op::AllGather, &gather, &context(t)).unwrap();
                    backend.launch(1, Stream::Collective, Op::ReduceScatter, &scatter, &context(t)).unwrap();
                }
                backend.synchronize().unwrap();
                let gathered = backend.download(Span { space: Space::Device, offset: local, len: whole }).unwrap();
                let scattered =
                    backend.download(Span { space: Space::Device, offset: local + 2 * whole, len: local }).unwrap();
                (gathered, scattered)
            });
            let xs: Vec<Vec<u8>> =
                (0..t).map(|k| bf16_bytes((0..rows * width).map(|i| (k as u64 * 100 + i) as f32 * 0.37))).collect();
            let partials: Vec<Vec<u8>> = (0..t)
                .map(|k| {
                    bf16_bytes((0..t as u64 * rows * width).map(|i| ((i * 7 + k as u64 * 3) % 13) as f32 * 0.11 + 1.0))
                })
                .collect();
            let refs: Vec<&[u8]> = partials.iter().map(Vec::as_slice).collect();
            let mut sum = vec![0u8; (t as u64 * local) as usize];
            reduce(Element::Bf16, Reduction::Sum, &refs, &mut sum);
            for (k, (gathered, scattered)) in results.into_iter().enumerate() {
                assert_eq!(gathered, xs.concat(), "t {t} rank {k} checked {checked}: all_gather");
                let share = &sum[k * local as usize..(k + 1) * local as usize];
                assert_eq!(scattered, share, "t {t} rank {k} checked {checked}: reduce_scatter");
            }
        }
    }
}

/// The all-reduce launches (in place, on the collective stream) give every rank the group's
/// reduction: bf16 sums, f32 sums and f32 maxima, on 1 to 4 ranks, an odd number of elements.
#[test]
fn the_backend_runs_the_all_reduces_in_place() {
    let elements = 7u64;
    for t in 1..=4usize {
        let value = |k: usize, i: u64| ((k as u64 * 5 + i * 3) % 7) as f32 * 0.3 - 1.0 + k as f32 * 1e-3;
        let results = on_backends(t, true, 4096, |k, backend| {
            let f32_bytes = |v: Vec<f32>| v.into_iter().flat_map(f32::to_le_bytes).collect::<Vec<u8>>();
            backend
                .upload(
                    Span { space: Space::Device, offset: 0, len: 2 * elements },
                    &bf16_bytes((0..elements).map(|i| value(k, i))),
                )
                .unwrap();
            let words = f32_bytes((0..elements).map(|i| value(k, i)).collect());
            backend.upload(Span { space: Space::Device, offset: 256, len: 4 * elements }, &words).unwrap();
            backend.upload(Span { space: Space::Device, offset: 512, len: 4 * elements }, &words).unwrap();
            // Safety: one stream, disjoint spans, nothing else runs.
            unsafe {
                for (i, (op, offset, size)) in
                    [(Op::AllReduceSumBf16, 0, 2), (Op::AllReduceSumF32, 256, 4), (Op::AllReduceMaxF32, 512, 4)]
                        .into_iter()
                        .enumerate()
                {
                    let x = [arg(offset, 1, size * elements, Access::ReadWrite)];
                    backend.launch(i, Stream::Collective, op, &x, &context(t)).unwrap();
                }
            }
            backend.synchronize().unwrap();
            [(0, 2), (256, 4), (512, 4)].map(|(offset, size)| {
                backend.download(Span { space: Space::Device, offset, len: size * elements }).unwrap()
            })
        });
        let inputs = |element: Element| -> Vec<Vec<u8>> {
            (0..t)
                .map(|k| match element {
                    Element::Bf16 => bf16_bytes((0..elements).map(|i| value(k, i))),
                    Element::F32 => (0..elements).flat_map(|i| value(k, i).to_le_bytes()).collect(),
                })
                .collect()
        };
        let expected =
            [(Element::Bf16, Reduction::Sum), (Element::F32, Reduction::Sum), (Element::F32, Reduction::Max)].map(
                |(element, reduction)| {
                    let inputs = inputs(element);
                    let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                    let mut out = vec![0u8; element.bytes() * elements as usize];
                    reduce(element, reduction, &refs, &mut out);
                    out
                },
            );
        for (k, result) in results.into_iter().enumerate() {
            assert_eq!(result, expected, "t {t} rank {k}");
        }
    }
}

/// A rank whose kernel fails aborts the group: the other ranks' collectives fail with its
/// reason instead of waiting for it, and no rank hangs.
#[test]
fn a_failing_rank_fails_the_others_collectives() {
    let results = on_backends(3, false, 4096, |k, backend| {
        let gather = [arg(0, 1, 8, Access::Read), arg(64, 3, 8, Access::Write)];
        // Safety: one stream, disjoint spans, nothing else runs.
        unsafe {
            if k == 1 {
                // An embedding whose table is not the vocabulary: the kernel fails.
                let bad = [arg(0, 1, 4, Access::Read), arg(256, 2, 8, Access::Read), arg(512, 1, 8, Access::Write)];
                backend.launch(0, Stream::Compute, Op::Embedding, &bad, &context(3)).unwrap();
            }
            // The collective waits for the compute stream, as a plan's do: without it, rank 1's
            // all-gather could complete with the others' before its embedding fails.
            backend.record(1, Stream::Compute, EventId(0)).unwrap();
            backend.wait(2, Stream::Collective, EventId(0)).unwrap();
            backend.launch(3, Stream::Collective, Op::AllGather, &gather, &context(3)).unwrap();
        }
        backend.synchronize()
    });
    let own = results[1].as_ref().unwrap_err().to_string();
    assert!(own.contains("embedding"), "{own}");
    for k in [0, 2] {
        let error = results[k].as_ref().unwrap_err().to_string();
        assert!(error.contains("rank 1") && error.contains("embedding"), "rank {k}: {error}");
    }
}

/// Without a group, a collective is refused (a single GPU), as before.
#[test]
fn without_a_group_a_collective_is_refused() {
    let mut backend = CpuBackend::new();
    backend.allocate(1024, 0, 1).unwrap();
    let gather = [arg(0, 1, 8, Access::Read), arg(64, 2, 8, Access::Write)];
    // Safety: one stream, disjoint spans, nothing else runs.
    unsafe { backend.launch(0, Stream::Compute, Op::AllGather, &gather, &context(2)).unwrap() };
    let error = backend.synchronize().unwrap_err().to_string();
    assert!(error.contains("all_gather"), "{error}");
}

/// bf16's unit roundoff (8 significant bits): a rounding moves a value by at most `U` of it.
const U: f64 = 1.0 / 256.0;
/// f32's unit roundoff.
const U32: f64 = 1.0 / 16_777_216.0;

/// Pseudo-random bf16 values in [-scale, scale).
fn random_bf16(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = memo_plan_core::generate::SplitMix64::new(seed);
    (0..n)
        .map(|_| {
            half::bf16::from_f32(((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale).to_f32()
        })
        .collect()
}

fn bf16_of(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(2).map(|p| half::bf16::from_le_bytes([p[0], p[1]]).to_f32()).collect()
}

/// Runs one CPU op on byte buffers (`(bytes, rows)` per argument, in signature order).
fn op(op: Op, args: &mut [(Vec<u8>, usize)], threads: usize) {
    let ctx = runtime_cpu::ops::OpContext {
        hidden: 1,
        heads: 1,
        kv_heads: 0,
        kv_replicated: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len: 1,
        vocab: 1,
        loss_scale_tokens: 1,
        adamw: AdamW::default(),
        context_rank: 0,
        context_ranks: 1,
    };
    let signature = op.signature();
    let mut kernel_args: Vec<runtime_cpu::ops::Arg<'_>> = args
        .iter_mut()
        .zip(signature)
        .map(|((bytes, rows), (_, access))| {
            let row_bytes = bytes.len() / *rows;
            let data = if *access == Access::Read {
                runtime_cpu::ops::ArgData::Read(bytes.as_slice())
            } else {
                runtime_cpu::ops::ArgData::Write(bytes.as_mut_slice())
            };
            runtime_cpu::ops::Arg { data, first_row: 0, rows: *rows, row_bytes }
        })
        .collect();
    runtime_cpu::ops::execute_with_threads(op, &mut kernel_args, &ctx, threads).unwrap();
}

/// The per-op bound of `spec/tensor-parallel.md` §6 for a row-parallel product, measured: `y = x
/// W^T + b` at `t = 1` (one f32 sum over the `n` inputs, plus the bias, rounded once) against `t`
/// ranks (each a bias-free partial over its `n/t` inputs rounded to bf16, the partials summed in
/// f32 in rank order and rounded, then the bias added and rounded):
/// `|y_t - y_1| <= 2u|y + b| + u|y| + u sum_k |P_k| + 2 n u32 A`, `A = sum_j |x_j w_j|`, `u =
/// 2^-8`, `u32 = 2^-24`, to first order in `u` (the test adds 4u of slack for the second order).
/// The backward reductions (`dx = dy W` of the column-parallel products, the norms' parameter
/// gradients) have the same form without the bias's rounding.
#[test]
fn row_parallel_products_are_within_the_derived_bound() {
    let (rows, n, out) = (24usize, 96usize, 40usize);
    for t in [2usize, 3, 4] {
        let mut worst = 0.0f64;
        let mut differing = 0usize;
        for seed in 0..4u64 {
            let x = random_bf16(seed, rows * n, 2.0);
            let w = random_bf16(seed + 100, out * n, 0.1);
            let b = random_bf16(seed + 200, out, 0.5);
            // t = 1.
            let mut args = [
                (bf16_bytes(x.clone()), rows),
                (bf16_bytes(w.clone()), out),
                (bf16_bytes(b.clone()), 1),
                (vec![0; rows * out * 2], rows),
            ];
            op(Op::Linear, &mut args, 2);
            let y1 = bf16_of(&args[3].0);
            // t ranks: bias-free partials over input columns [k n/t, (k+1) n/t).
            let share = n / t;
            let partials: Vec<Vec<u8>> = (0..t)
                .map(|k| {
                    let cols = |m: &[f32], r: usize| -> Vec<f32> {
                        (0..r).flat_map(|i| m[i * n + k * share..i * n + (k + 1) * share].to_vec()).collect()
                    };
                    let mut args = [
                        (bf16_bytes(cols(&x, rows)), rows),
                        (bf16_bytes(cols(&w, out)), out),
                        (bf16_bytes(vec![0.0; out]), 1),
                        (vec![0; rows * out * 2], rows),
                    ];
                    op(Op::Linear, &mut args, 1);
                    std::mem::take(&mut args[3].0)
                })
                .collect();
            let refs: Vec<&[u8]> = partials.iter().map(Vec::as_slice).collect();
            let mut z = vec![0u8; rows * out * 2];
            reduce(Element::Bf16, Reduction::Sum, &refs, &mut z);
            let z = bf16_of(&z);
            for i in 0..rows {
                for o in 0..out {
                    let yt = f64::from(half::bf16::from_f32(z[i * out + o] + b[o]).to_f32());
                    let (mut y, mut a, mut p_sum) = (0.0f64, 0.0f64, 0.0f64);
                    for k in 0..t {
                        let p: f64 = (k * share..(k + 1) * share)
                            .map(|j| f64::from(x[i * n + j]) * f64::from(w[o * n + j]))
                            .sum();
                        p_sum += p.abs();
                        y += p;
                    }
                    for j in 0..n {
                        a += (f64::from(x[i * n + j]) * f64::from(w[o * n + j])).abs();
                    }
                    let bound =
                        (2.0 * U * (y + f64::from(b[o])).abs() + U * y.abs() + U * p_sum + 2.0 * n as f64 * U32 * a)
                            * (1.0 + 4.0 * U);
                    let error = (yt - f64::from(y1[i * out + o])).abs();
                    assert!(
                        error <= bound,
                        "t {t} seed {seed} [{i}, {o}]: |{yt} - {}| = {error:e} > {bound:e}",
                        y1[i * out + o]
                    );
                    worst = worst.max(error / bound);
                    differing += usize::from(error > 0.0);
                }
            }
        }
        // The bound is not vacuous: t ranks do differ from t = 1, and use part of it.
        assert!(differing > 0, "t {t}: no element differs from t = 1");
        eprintln!("t {t}: {differing} elements differ; the worst used {:.0}% of the bound", 100.0 * worst);
    }
}

/// Per step its loss (bits), then the `t = 1` tensors of the parameters reassembled from the
/// ranks' shards.
struct Run {
    losses: Vec<u32>,
    parameters: Vec<NamedBytes>,
}

/// Trains `steps` steps of the shipped text on `t` CPU ranks; checks after the steps that every
/// replicated parameter and its optimizer state is bit-identical on every rank.
fn train_parallel(model: &ModelConfig, t: u64, strategy: Strategy, alpha: Option<f64>, steps: usize) -> Run {
    let mut trainer = parallel_trainer(&options(model, strategy, alpha), t, false);
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
    let mut losses = Vec::new();
    for step in 0..steps {
        let (tokens, targets) = data.next_batch(model.micro_batch as usize, model.seq_len as usize);
        let loss = trainer.step(&tokens, &targets).unwrap_or_else(|e| panic!("t {t} {strategy:?} step {step}: {e}"));
        assert!(loss.is_finite());
        losses.push(loss.to_bits());
    }
    trainer.check_replicated().unwrap();
    Run { losses, parameters: trainer.reassembled(BufferKind::Parameter).unwrap() }
}

/// One rank of a group is the single-GPU trainer: the same losses and parameters bit for bit.
#[test]
fn one_rank_trains_as_the_single_gpu_trainer() {
    let m = model(2, 32, 4, 16, 1);
    let run = train_parallel(&m, 1, Strategy::Memo, Some(0.5), 4);
    let mut single = Trainer::new(CpuBackend::new(), &options(&m, Strategy::Memo, Some(0.5))).unwrap();
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
    for (step, loss) in run.losses.iter().enumerate() {
        let (tokens, targets) = data.next_batch(1, 16);
        assert_eq!(single.step(&tokens, &targets).unwrap().to_bits(), *loss, "step {step}");
    }
    assert!(single.parameters().unwrap() == run.parameters);
}

/// A checkpoint of every rank's state, saved and restored into a fresh group, continues
/// bit-identically; one saved from another number of ranks is refused with the fix.
fn resume_is_bit_identical(m: &ModelConfig, t: u64) {
    let opts = options(m, Strategy::Memo, Some(0.5));
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
    let batches: Vec<_> = (0..5).map(|_| data.next_batch(m.micro_batch as usize, m.seq_len as usize)).collect();
    let mut straight = parallel_trainer(&opts, t, false);
    let mut checkpoint = None;
    for (step, (tokens, targets)) in batches.iter().enumerate() {
        straight.step(tokens, targets).unwrap();
        if step == 2 {
            checkpoint = Some(straight.checkpoint(7, 0).unwrap());
        }
    }
    let checkpoint = checkpoint.unwrap();
    assert_eq!(checkpoint.ranks as u64, t);
    let bytes = checkpoint.encode();
    let mut resumed = parallel_trainer(&opts, t, false);
    resumed.restore(&Checkpoint::decode(&bytes).unwrap(), 7).unwrap();
    assert_eq!(resumed.steps_taken(), 3);
    for (tokens, targets) in &batches[3..] {
        resumed.step(tokens, targets).unwrap();
    }
    assert!(resumed.checkpoint(7, 0).unwrap() == straight.checkpoint(7, 0).unwrap(), "t {t}: the resumed run differs");
    let other = if t == 1 { 2 } else { 1 };
    let foreign = Checkpoint { ranks: other as u32, ..checkpoint.clone() };
    let error = resumed.restore(&foreign, 7).unwrap_err().to_string();
    assert!(error.contains(&format!("--tensor-parallel {other}")), "{error}");
}

#[test]
fn resuming_one_rank_is_bit_identical() {
    resume_is_bit_identical(&model(2, 32, 4, 16, 1), 1);
}

/// Replays instructions `range` of `plan` (unchecked) on `t` checked-mode CPU ranks of one group,
/// zeroed memory; each rank's result.
fn replay_checked_unchecked_plan(plan: &Plan, t: u64, range: std::ops::Range<usize>) -> Vec<Result<(), RuntimeError>> {
    let m = &plan.provenance.model;
    on_backends_with(t as usize, |k, backend| {
        // Safety: every rank runs on a checked-mode backend, which refuses an access the
        // executed events do not order before making it (`Replay::new_unchecked`'s contract).
        let replay = unsafe { Replay::new_unchecked(plan.clone()) }.unwrap();
        replay.allocate(backend).unwrap();
        let context = KernelContext {
            hidden: m.hidden,
            heads: m.heads / t,
            kv_heads: 0,
            kv_replicated: false,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            seq_len: m.seq_len,
            vocab: m.vocab,
            loss_scale_tokens: m.seq_len * m.micro_batch,
            adamw: AdamW::default(),
            rank: k as u64,
            ranks: t,
            context_rank: 0,
            context_ranks: 1,
        };
        replay.run_range(backend, &context, range.clone())
    })
}

/// Like [`on_backends`] but the caller allocates (checked mode, in a group).
fn on_backends_with<R: Send>(t: usize, f: impl Fn(usize, &mut CpuBackend) -> R + Sync) -> Vec<R> {
    let backends: Vec<CpuBackend> =
        LocalGroup::ranks(t).into_iter().map(|rank| CpuBackend::checked().with_collectives(Arc::new(rank))).collect();
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> =
            backends.into_iter().enumerate().map(|(k, mut b)| scope.spawn(move || f(k, &mut b))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Where the first collective of `plan` is read: (the compute stream's wait for its completion,
/// the first compute launch after it that reads the collective's output, the first instruction
/// to replay: past any embedding lookup before the collective).
fn first_collective_read(plan: &Plan) -> (usize, usize, usize) {
    let instructions = &plan.instructions;
    let (at, output) = instructions
        .iter()
        .enumerate()
        .find_map(|(i, ins)| match &ins.action {
            Action::Launch(l) if l.op.is_collective() => Some((i, l.args.last().unwrap().region.buffer)),
            _ => None,
        })
        .expect("a t > 1 plan has collectives");
    let done = instructions[at..]
        .iter()
        .find_map(|ins| match ins.action {
            Action::Record(e) if ins.stream == Stream::Collective => Some(e),
            _ => None,
        })
        .unwrap();
    let wait = at
        + instructions[at..]
            .iter()
            .position(|ins| ins.stream == Stream::Compute && ins.action == Action::Wait(done))
            .expect("the compute stream waits for the collective");
    let reader = wait
        + instructions[wait..]
            .iter()
            .position(|ins| match &ins.action {
                Action::Launch(l) => {
                    ins.stream == Stream::Compute
                        && l.args.iter().any(|a| a.region.buffer == output && a.access.reads())
                }
                _ => false,
            })
            .expect("the compute stream reads the collective's output");
    let start = instructions[..at]
        .iter()
        .rposition(|ins| matches!(&ins.action, Action::Launch(l) if l.op == Op::Embedding))
        .map_or(0, |i| i + 1);
    (wait, reader, start)
}

/// `--checked` traps a plan whose compute stream no longer waits for a collective before reading
/// its output: the checker refuses the plan, and replayed anyway (`Replay::new_unchecked`) on
/// checked-mode ranks, the read is trapped on a rank (whatever the threads' timing) and every
/// other rank fails instead of hanging. The same instructions with the wait pass.
#[test]
fn checked_mode_traps_a_collectives_missing_wait() {
    for t in [2u64, 4] {
        let m = model(2, 32, 4, 16, 1);
        let planned = PlannedStep::tensor_parallel(&options(&m, Strategy::Memo, Some(0.5)), t).unwrap();
        let plan = planned.report().plan.clone();
        let (wait, reader, start) = first_collective_read(&plan);
        for result in replay_checked_unchecked_plan(&plan, t, start..reader + 1) {
            result.unwrap();
        }
        let mut broken = plan.clone();
        broken.instructions.remove(wait);
        assert!(CheckedPlan::check(broken.clone()).is_err(), "the checker refuses the plan without the wait");
        let results = replay_checked_unchecked_plan(&broken, t, start..reader);
        let messages: Vec<String> = results.iter().map(|r| r.as_ref().unwrap_err().to_string()).collect();
        assert!(
            results.iter().any(|r| matches!(r, Err(RuntimeError::Backend(BackendError::Unordered(_))))),
            "t {t}: no rank trapped the unordered read: {messages:?}"
        );
        for message in &messages {
            assert!(
                message.contains("no event orders them") || message.contains("with no event ordering them"),
                "t {t}: {message}"
            );
        }
    }
}

/// Steps of the strategy comparisons (the "after 20 steps").
const STEPS: usize = 20;

/// The training model of the t > 1 tests: 4 heads, FFN width 128 and 16 tokens divide by 2 and 4.
fn tp_model() -> ModelConfig {
    model(2, 32, 4, 16, 1)
}

/// The Llama-shaped training model of the t > 1 tests: 4 query heads and 2 K/V heads (t = 2
/// splits them, t = 4 replicates them), SwiGLU of width 88 (22 per rank at t = 4), RMSNorm, no
/// biases, an untied classifier.
fn llama_model() -> ModelConfig {
    let mut m = tp_model();
    m.kv_heads = 2;
    m.ffn_hidden = 88;
    m.architecture = Architecture::llama(10_000.0, 1e-5);
    m
}

/// The same Llama-shaped model with Qwen2's Q/K/V biases (at t = 4 their replicated K/V biases'
/// gradients have a buffer of their own).
fn qwen_model() -> ModelConfig {
    let mut m = llama_model();
    m.architecture.biases = Biases::QkvOnly;
    m
}

/// At t = 2 and t = 4, every strategy (keep-all, full-recompute, full-swap, memo at three forced
/// alphas) trains bit-identically to the others at the same t over 20 steps: the same loss at
/// every step and the same parameters; a rerun gives the same bits; and after the 20 steps every
/// replicated parameter (layer norms, row-parallel biases) and its optimizer state is
/// bit-identical on every rank (`train_parallel` checks it, failing with `RanksDiverged`).
#[test]
fn every_strategy_trains_bit_identically_at_t_2_and_4() {
    every_strategy_trains_bit_identically(&tp_model(), &[2, 4]);
}

/// The same for the Llama-shaped model at t = 1, 2 (K/V heads split) and 4 (replicated).
#[test]
fn every_strategy_trains_the_llama_shaped_model_bit_identically_at_t_1_2_and_4() {
    every_strategy_trains_bit_identically(&llama_model(), &[1, 2, 4]);
}

fn every_strategy_trains_bit_identically(m: &ModelConfig, ts: &[u64]) {
    for &t in ts {
        let reference = train_parallel(m, t, Strategy::KeepAll, None, STEPS);
        let (first, last) = (f32::from_bits(reference.losses[0]), f32::from_bits(reference.losses[STEPS - 1]));
        assert!(last < first - 1.0, "t {t}: the loss falls ({first} -> {last})");
        for (strategy, alpha) in [
            (Strategy::Memo, Some(0.0)),
            (Strategy::Memo, Some(0.5)),
            (Strategy::Memo, Some(1.0)),
            (Strategy::FullSwap, None),
            (Strategy::FullRecompute, None),
        ] {
            let run = train_parallel(m, t, strategy, alpha, STEPS);
            assert_eq!(run.losses, reference.losses, "t {t} {strategy:?} alpha {alpha:?}: losses differ from keep-all");
            assert!(run.parameters == reference.parameters, "t {t} {strategy:?} alpha {alpha:?}: parameters differ");
        }
        let rerun = train_parallel(m, t, Strategy::KeepAll, None, STEPS);
        assert_eq!(rerun.losses, reference.losses, "t {t}: a rerun differs");
        assert!(rerun.parameters == reference.parameters, "t {t}: a rerun's parameters differ");
    }
}

/// Relative L2 error of `candidate` against `reference` (bf16 bytes).
fn relative_l2(candidate: &[u8], reference: &[u8]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (c, r) in bf16_of(candidate).iter().zip(bf16_of(reference)) {
        diff += (f64::from(*c) - f64::from(r)).powi(2);
        norm += f64::from(r).powi(2);
    }
    (diff / norm).sqrt()
}

/// `spec/tensor-parallel.md` §7: the step's tolerance against t = 1, four bf16 unit roundoffs.
const TOLERANCE: f64 = 4.0 / 256.0;

/// The first step at t = 2 and t = 4 against t = 1 from the same weights (each rank's shard is
/// the slice of the t = 1 tensor) and the same tokens: the loss within 2^-6 relative and every
/// gradient tensor, reassembled from the ranks' shards into its t = 1 shape, within 2^-6 in
/// relative L2. They are not bit-identical (the partial sums are rounded before the reductions),
/// so the comparison can fail. The measured errors are printed (`--nocapture`) and recorded in
/// the spec.
#[test]
fn the_first_step_agrees_with_t_1_within_the_derived_bound() {
    // One sequence of 16, and two of 8 (a rank's rows then cross a sequence boundary at t = 4);
    // the Llama- and Qwen2-shaped models (t = 4 replicates their K/V heads).
    let mut two_sequences = llama_model();
    (two_sequences.seq_len, two_sequences.micro_batch) = (8, 2);
    for m in [tp_model(), model(2, 32, 4, 8, 2), llama_model(), two_sequences, qwen_model()] {
        first_step_agrees_with_t_1(&m);
    }
}

fn first_step_agrees_with_t_1(m: &ModelConfig) {
    let opts = options(m, Strategy::Memo, Some(0.5));
    let mut single = Trainer::new(CpuBackend::new(), &opts).unwrap();
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
    let (tokens, targets) = data.next_batch(m.micro_batch as usize, m.seq_len as usize);
    let loss_1 = single.step(&tokens, &targets).unwrap();
    let gradients_1 = single.buffers_of_kind(BufferKind::Gradient).unwrap();
    for t in [2, 4] {
        let mut trainer = parallel_trainer(&opts, t, false);
        let loss = trainer.step(&tokens, &targets).unwrap();
        let gradients = trainer.reassembled(BufferKind::Gradient).unwrap();
        let loss_error = f64::from((loss - loss_1).abs() / loss_1.abs());
        assert!(loss_error <= TOLERANCE, "t {t}: loss {loss} against {loss_1} at t = 1");
        let keys = |g: &[NamedBytes]| g.iter().map(|e| e.0).collect::<Vec<_>>();
        assert_eq!(keys(&gradients), keys(&gradients_1), "t {t}: every t = 1 gradient, reassembled");
        let (mut worst, mut worst_key, mut identical) = (0.0f64, None, 0);
        for ((key, reference), (_, candidate)) in gradients_1.iter().zip(&gradients) {
            assert_eq!(candidate.len(), reference.len(), "t {t} {key:?}");
            let error = relative_l2(candidate, reference);
            assert!(error <= TOLERANCE, "t {t} {key:?}: relative L2 error {error:.3e} against t = 1");
            identical += usize::from(candidate == reference);
            if error > worst {
                (worst, worst_key) = (error, Some(*key));
            }
        }
        assert!(
            identical < gradients.len(),
            "t {t}: every gradient is bit-identical to t = 1: the test compares nothing"
        );
        eprintln!(
            "{} x {} tokens, t {t}: loss relative error {loss_error:.2e}; worst gradient relative L2 {worst:.2e} ({worst_key:?}); \
             {identical} of {} gradient tensors bit-identical",
            m.micro_batch,
            m.seq_len,
            gradients.len()
        );
    }
}

/// A replicated parameter that differs between ranks is reported, naming it, rather than one
/// rank's copy being saved silently (here rank 1 restored another copy of a norm scale).
#[test]
fn a_replicated_parameter_that_differs_between_ranks_is_reported() {
    let m = tp_model();
    let mut trainer = parallel_trainer(&options(&m, Strategy::KeepAll, None), 2, false);
    let mut checkpoint = trainer.checkpoint(7, 0).unwrap();
    let at = checkpoint
        .tensors
        .iter()
        .position(|t| t.role == TensorRole::NormScale2 && t.layer == Some(1) && t.kind == StateKind::Parameter)
        .unwrap();
    assert_eq!(checkpoint.tensors[at].rank, None, "a replicated tensor is saved once");
    let mut other = checkpoint.tensors[at].clone();
    other.rank = Some(1);
    other.bytes[0] ^= 1;
    checkpoint.tensors.insert(0, other);
    trainer.restore(&checkpoint, 7).unwrap();
    let error = trainer.check_replicated().unwrap_err().to_string();
    assert!(error.contains("norm") && error.contains("rank 1"), "{error}");
}

#[test]
fn resuming_two_and_four_ranks_is_bit_identical() {
    resume_is_bit_identical(&tp_model(), 2);
    resume_is_bit_identical(&tp_model(), 4);
    resume_is_bit_identical(&qwen_model(), 2);
    resume_is_bit_identical(&qwen_model(), 4);
}

/// Tokens outside the vocabulary are refused before any rank starts, so the group survives and
/// the next step trains; a step of another length is refused too.
#[test]
fn bad_tokens_are_refused_without_failing_the_group() {
    let m = tp_model();
    let mut trainer = parallel_trainer(&options(&m, Strategy::KeepAll, None), 2, false);
    let (tokens, targets) = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap().next_batch(1, 16);
    let mut bad = tokens.clone();
    bad[9] = 300; // on rank 1's rows
    let error = trainer.step(&bad, &targets).unwrap_err().to_string();
    assert!(error.contains("300"), "{error}");
    let error = trainer.step(&tokens[1..], &targets[1..]).unwrap_err().to_string();
    assert!(error.contains("16 tokens"), "{error}");
    assert!(trainer.step(&tokens, &targets).unwrap().is_finite());
    assert_eq!(trainer.steps_taken(), 1);
}

/// A backend of rank `group`'s, with its handle: one rank as `ParallelTrainer::with_plan` takes it.
fn held_rank(group: LocalRank) -> (CpuBackend, Arc<dyn Collectives>) {
    let group: Arc<dyn Collectives> = Arc::new(group);
    (CpuBackend::new().with_collectives(Arc::clone(&group)), group)
}

/// Two trainers holding one rank each (as two processes would, here on two threads joined by
/// an in-process group) take the losses of one trainer holding both, bit for bit, and make
/// its checkpoint, byte for byte.
#[test]
fn trainers_holding_one_rank_each_equal_one_holding_every_rank() {
    let options = options(&model(2, 64, 4, 32, 2), Strategy::FullSwap, None);
    let t = 2;
    let steps = 3;
    let tokens: Vec<u32> = (0..64u32).map(|i| (i * 37 + 5) % 256).collect();
    let targets: Vec<u32> = (0..64u32).map(|i| (i * 11 + 3) % 256).collect();
    let planned = PlannedStep::tensor_parallel(&options, t).unwrap();
    let mut whole =
        ParallelTrainer::with_plan(planned.clone(), LocalGroup::ranks(2).into_iter().map(held_rank).collect()).unwrap();
    let want: Vec<u32> = (0..steps).map(|_| whole.step(&tokens, &targets).unwrap().to_bits()).collect();
    // Given in the wrong order on purpose: the handles say which rank each is.
    let mut groups = LocalGroup::ranks(2);
    let second = groups.pop().unwrap();
    let first = groups.pop().unwrap();
    let got: Vec<(Vec<u32>, Vec<u8>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = [second, first]
            .into_iter()
            .map(|group| {
                let planned = planned.clone();
                let (tokens, targets) = (&tokens, &targets);
                scope.spawn(move || {
                    let mut trainer = ParallelTrainer::with_plan(planned, vec![held_rank(group)]).unwrap();
                    assert_eq!(trainer.tensor(), 2);
                    let losses: Vec<u32> =
                        (0..steps).map(|_| trainer.step(tokens, targets).unwrap().to_bits()).collect();
                    // The checkpoint gathers the other rank's state through the group.
                    (losses, trainer.checkpoint(7, 9).unwrap().encode())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let saved = whole.checkpoint(7, 9).unwrap().encode();
    assert!(got == vec![(want.clone(), saved.clone()), (want, saved)], "the losses or checkpoints differ");
}

#[test]
fn a_rank_given_twice_or_outside_the_group_is_refused() {
    let planned = PlannedStep::tensor_parallel(&options(&model(2, 64, 4, 32, 2), Strategy::FullSwap, None), 2).unwrap();
    let mut a = LocalGroup::ranks(2);
    let mut b = LocalGroup::ranks(2);
    let twice = vec![held_rank(a.remove(0)), held_rank(b.remove(0))];
    let Err(error) = ParallelTrainer::with_plan(planned.clone(), twice) else { panic!("accepted") };
    assert!(error.to_string().contains("two backends are rank 0"), "{error}");
    let Err(error) = ParallelTrainer::with_plan(planned, vec![held_rank(LocalGroup::ranks(3).remove(0))]) else {
        panic!("accepted")
    };
    assert!(error.to_string().contains("group of 3"), "{error}");
}
