//! Context parallelism on the CPU (`spec/context-parallel.md`): `c x t` ranks, each a thread with
//! its own CPU backend and arena, joined by in-process groups: each context rank's `t` ranks by a
//! tensor-parallel group, the `c` ranks that share a tensor-parallel rank by a data group (the
//! ring's exchanges and the gradients' sums). The plan is one program per context rank.

use std::sync::Arc;

use memo_plan_core::model::{Architecture, ModelConfig, Parallelism};
use memo_plan_core::plan::scratch::NoScratch;
use memo_plan_core::plan::{BufferKind, Strategy};
use memo_runtime::checkpoint::Checkpoint;
use memo_runtime::data::{TextData, DEFAULT_TEXT};
use memo_runtime::{cpu_hardware, AdamW, NamedBytes, ParallelTrainer, PlannedStep, RankGroups, TrainOptions, Trainer};
use runtime_cpu::CpuBackend;

/// The Llama-shaped training model: 4 query heads over 2 K/V heads, SwiGLU, RMSNorm, untied; 16
/// tokens make `2c` chunks for `c` up to 4 with `t = 2` (`2 c t` divides the sequence).
fn llama_model(seq_len: u64, micro_batch: u64) -> ModelConfig {
    let mut m = ModelConfig::new("test", 2, 32, 4, seq_len, micro_batch);
    m.vocab = 256;
    m.kv_heads = 2;
    m.ffn_hidden = 88;
    m.architecture = Architecture::llama(10_000.0, 1e-5);
    m
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

/// `c x t` CPU ranks of `options`' step: global rank `k*t + j` is tensor-parallel rank `j` of
/// context rank `k`, a member of context rank `k`'s tensor-parallel group and of tensor-parallel
/// rank `j`'s data group.
fn trainer(options: &TrainOptions, t: u64, c: u64) -> ParallelTrainer<CpuBackend> {
    let parallel = Parallelism { tensor: t, ..Parallelism::single() }.with_context(c);
    // The `c x t` ranks are one node's GPUs (the layout rule: a context group inside a node).
    let mut options = options.clone();
    options.hardware.gpus_per_node = c * t;
    let planned = PlannedStep::with_layout(&options, parallel, &NoScratch).unwrap();
    let ranks = RankGroups::local(t as usize, c as usize)
        .into_iter()
        .map(|groups| {
            let backend = CpuBackend::new().with_collectives(Arc::clone(&groups.tensor));
            let data = groups.data.clone().expect("c > 1: a data group");
            (backend.with_data_group(data), groups)
        })
        .collect();
    ParallelTrainer::with_plan(planned, ranks).unwrap()
}

struct Run {
    losses: Vec<u32>,
    parameters: Vec<NamedBytes>,
}

/// Trains `steps` steps of the shipped text on `c x t` CPU ranks; the checkpoint taken after
/// them checks that every rank holding a copy of a tensor holds the same bits.
fn train(m: &ModelConfig, t: u64, c: u64, strategy: Strategy, alpha: Option<f64>, steps: usize) -> Run {
    let mut trainer = trainer(&options(m, strategy, alpha), t, c);
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
    let mut losses = Vec::new();
    for step in 0..steps {
        let (tokens, targets) = data.next_batch(m.micro_batch as usize, m.seq_len as usize);
        let loss =
            trainer.step(&tokens, &targets).unwrap_or_else(|e| panic!("t {t} c {c} {strategy:?} step {step}: {e}"));
        assert!(loss.is_finite());
        losses.push(loss.to_bits());
    }
    trainer.check_replicated().unwrap();
    Run { losses, parameters: trainer.reassembled(BufferKind::Parameter).unwrap() }
}

/// Steps of the strategy comparisons.
const STEPS: usize = 8;

/// At c = 2 and 4, alone and with t = 2, every strategy (keep-all, full-recompute, full-swap,
/// memo at forced alphas 0, 0.5 and 1) trains bit-identically to the others: the same loss at
/// every step and the same parameters; the loss falls; and every context rank holds the same
/// model after the steps (`check_replicated`).
#[test]
fn every_strategy_trains_bit_identically_at_c_2_and_4() {
    let m = llama_model(16, 1);
    for (t, c) in [(1, 2), (1, 4), (2, 2), (2, 4)] {
        let reference = train(&m, t, c, Strategy::KeepAll, None, STEPS);
        let (first, last) = (f32::from_bits(reference.losses[0]), f32::from_bits(reference.losses[STEPS - 1]));
        assert!(last < first - 0.25, "t {t} c {c}: the loss falls ({first} -> {last})");
        for (strategy, alpha) in [
            (Strategy::Memo, Some(0.0)),
            (Strategy::Memo, Some(0.5)),
            (Strategy::Memo, Some(1.0)),
            (Strategy::FullSwap, None),
            (Strategy::FullRecompute, None),
        ] {
            let run = train(&m, t, c, strategy, alpha, STEPS);
            assert_eq!(run.losses, reference.losses, "t {t} c {c} {strategy:?} {alpha:?}: losses differ from keep-all");
            assert!(run.parameters == reference.parameters, "t {t} c {c} {strategy:?} {alpha:?}: parameters differ");
        }
    }
}

/// Relative L2 error of `candidate` against `reference` (bf16 bytes).
fn relative_l2(candidate: &[u8], reference: &[u8]) -> f64 {
    let bf16 = |b: &[u8]| f64::from(f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16));
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (c, r) in candidate.chunks_exact(2).zip(reference.chunks_exact(2)) {
        diff += (bf16(c) - bf16(r)).powi(2);
        norm += bf16(r).powi(2);
    }
    (diff / norm).sqrt()
}

/// The first step's tolerance against `c = 1`, in relative L2: four bf16 unit roundoffs
/// (`spec/context-parallel.md` §6, "Agreement with c = 1"). The step differs from `c = 1` by
/// roundings only: `rotary` rounds the rotated q and k to bf16 once (one roundoff of each score's
/// operands), the ring's output is rounded once from its f32 accumulator as `attention`'s is, the
/// travelling dK/dV accumulators are f32 and rounded once, and each weight gradient is a bf16
/// partial sum per context rank (one roundoff) added in f32 and rounded once more (a second). Each
/// of these is at most one roundoff `u = 2^-8` of the value it rounds; through the backward's
/// products they add, so the gradients sit within a few `u` of `c = 1`'s: `4u` covers the two
/// of the reduction and two of the attention's inputs and outputs.
const TOLERANCE: f64 = 4.0 / 256.0;

/// The first step at c = 2 and 4 (and with t = 2) against one rank from the same weights and
/// tokens: the loss within `TOLERANCE` relative, every gradient (reassembled to its `c = 1, t =
/// 1` shape) within `TOLERANCE` in relative L2; they are not bit-identical (the rotary rounding
/// and the per-rank partial sums), so the comparison can fail. The errors are printed
/// (`--nocapture`).
#[test]
fn the_first_step_agrees_with_c_1_within_the_derived_bound() {
    for m in [llama_model(16, 1), llama_model(16, 2)] {
        let opts = options(&m, Strategy::Memo, Some(0.5));
        let mut single = Trainer::new(CpuBackend::new(), &opts).unwrap();
        let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
        let (tokens, targets) = data.next_batch(m.micro_batch as usize, m.seq_len as usize);
        let loss_1 = single.step(&tokens, &targets).unwrap();
        let gradients_1 = single.buffers_of_kind(BufferKind::Gradient).unwrap();
        for (t, c) in [(1, 2), (1, 4), (2, 2), (2, 4)] {
            let mut trainer = trainer(&opts, t, c);
            let loss = trainer.step(&tokens, &targets).unwrap();
            let gradients = trainer.reassembled(BufferKind::Gradient).unwrap();
            let loss_error = f64::from((loss - loss_1).abs() / loss_1.abs());
            assert!(loss_error <= TOLERANCE, "t {t} c {c}: loss {loss} against {loss_1} at c = 1");
            let keys = |g: &[NamedBytes]| g.iter().map(|e| e.0).collect::<Vec<_>>();
            assert_eq!(keys(&gradients), keys(&gradients_1), "t {t} c {c}: every c = 1 gradient, reassembled");
            let mut worst = 0.0f64;
            for ((key, reference), (_, candidate)) in gradients_1.iter().zip(&gradients) {
                let error = relative_l2(candidate, reference);
                assert!(error <= TOLERANCE, "t {t} c {c} {key:?}: relative L2 error {error:.3e} against c = 1");
                worst = worst.max(error);
            }
            assert!(worst > 0.0, "t {t} c {c}: every gradient bit-identical to c = 1: the test compares nothing");
            eprintln!(
                "{} x {} tokens, t {t} c {c}: loss relative error {loss_error:.2e}; worst gradient relative L2 {worst:.2e}",
                m.micro_batch, m.seq_len
            );
        }
    }
}

/// A checkpoint of a `c x t` run (the `c = 1` checkpoint of `t` ranks: every context rank holds
/// the same model), saved and restored into fresh ranks, continues bit-identically.
#[test]
fn resuming_context_parallel_ranks_is_bit_identical() {
    let m = llama_model(16, 1);
    let opts = options(&m, Strategy::Memo, Some(0.5));
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
    let batches: Vec<_> = (0..5).map(|_| data.next_batch(1, 16)).collect();
    for (t, c) in [(1, 2), (2, 2)] {
        let mut straight = trainer(&opts, t, c);
        let mut checkpoint = None;
        for (step, (tokens, targets)) in batches.iter().enumerate() {
            straight.step(tokens, targets).unwrap();
            if step == 2 {
                checkpoint = Some(straight.checkpoint(7, 0).unwrap().encode());
            }
        }
        let checkpoint = Checkpoint::decode(&checkpoint.unwrap()).unwrap();
        assert_eq!(u64::from(checkpoint.ranks), t, "one shard per tensor-parallel rank");
        let mut resumed = trainer(&opts, t, c);
        resumed.restore(&checkpoint, 7).unwrap();
        for (tokens, targets) in &batches[3..] {
            resumed.step(tokens, targets).unwrap();
        }
        assert!(
            resumed.checkpoint(7, 0).unwrap() == straight.checkpoint(7, 0).unwrap(),
            "t {t} c {c}: the resumed run differs"
        );
    }
}
