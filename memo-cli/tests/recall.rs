//! The recall task's evaluation, end to end on the CPU backend: the logits it reads are the ones
//! the step's loss is computed from, reading them leaves training bit-identical, and
//! `memo train --task recall` reports the same evaluation for the same seed.

mod common;

use memo_plan_core::plan::Strategy;
use memo_runtime::recall::{self, RecallTask};
use memo_runtime::{cpu_hardware, training_model, AdamW, TrainOptions, Trainer};
use runtime_cpu::CpuBackend;

use common::memo;

fn trainer(seq: u64, micro_batch: u64, strategy: Strategy) -> Trainer<CpuBackend> {
    let mut model = training_model("tiny", seq).unwrap();
    model.micro_batch = micro_batch;
    let options = TrainOptions {
        model,
        strategy,
        forced_alpha: None,
        hardware: cpu_hardware(1 << 30),
        seed: 5,
        adamw: AdamW { lr: 1e-2, ..AdamW::default() },
    };
    Trainer::new(CpuBackend::new(), &options).unwrap()
}

/// The mean cross-entropy computed on the host from the logits read back equals the loss the
/// next step reports for the same tokens (the step computes it before its update), up to the
/// f32 summation order.
#[test]
fn logits_read_back_give_the_step_loss() {
    let (seq, micro_batch) = (32usize, 2usize);
    for strategy in [Strategy::Memo, Strategy::KeepAll] {
        let mut trainer = trainer(seq as u64, micro_batch as u64, strategy);
        let mut task = RecallTask::new(1);
        let (tokens, targets) = task.next_batch(micro_batch, seq);
        trainer.step(&tokens, &targets).unwrap();
        let (tokens, targets) = task.next_batch(micro_batch, seq);
        let logits = trainer.logits(&tokens).unwrap();
        let vocab = 256;
        assert_eq!(logits.len(), seq * micro_batch * vocab);
        let mut sum = 0.0f64;
        for (row, &target) in targets.iter().enumerate() {
            let row_logits = &logits[row * vocab..(row + 1) * vocab];
            let score = recall::score_query(row_logits, target);
            sum -= score.log_probability;
        }
        let host_mean = sum / targets.len() as f64;
        let step_loss = f64::from(trainer.step(&tokens, &targets).unwrap());
        assert!(
            (host_mean - step_loss).abs() < 1e-4 * step_loss.max(1.0),
            "{strategy:?}: mean cross-entropy from the logits {host_mean} against the step's loss {step_loss}"
        );
    }
}

/// Every strategy reads the same logits, bit for bit, after the same training: the forward-only
/// replay works on plans that swap (memo at alpha 0.5, full-swap) and recompute.
#[test]
fn every_strategy_reads_the_same_logits() {
    let logits_after_training = |strategy: Strategy, alpha: Option<f64>| {
        let mut model = memo_plan_core::model::ModelConfig::new("four", 4, 32, 2, 24, 2);
        model.vocab = 256;
        let options = TrainOptions {
            model,
            strategy,
            forced_alpha: alpha,
            hardware: cpu_hardware(1 << 30),
            seed: 3,
            adamw: AdamW { lr: 1e-2, ..AdamW::default() },
        };
        let mut trainer = Trainer::new(CpuBackend::new(), &options).unwrap();
        let mut task = RecallTask::new(4);
        for _ in 0..2 {
            let (tokens, targets) = task.next_batch(2, 24);
            trainer.step(&tokens, &targets).unwrap();
        }
        let host = trainer.report().plan.totals.host_bytes;
        let logits = trainer.logits(&task.next_batch(2, 24).0).unwrap();
        (host, logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
    };
    let (_, reference) = logits_after_training(Strategy::KeepAll, None);
    for (strategy, alpha) in [(Strategy::Memo, Some(0.5)), (Strategy::FullSwap, None), (Strategy::FullRecompute, None)]
    {
        let (host, logits) = logits_after_training(strategy, alpha);
        assert!(strategy == Strategy::FullRecompute || host > 0, "{strategy:?} swaps nothing");
        assert!(logits == reference, "{strategy:?} reads other logits than keep-all");
    }
}

/// An evaluation between steps changes nothing: the losses and parameters after it are the ones
/// of a run without it, bit for bit.
#[test]
fn evaluation_leaves_training_bit_identical() {
    let (seq, micro_batch) = (32usize, 2usize);
    let run = |evaluate: bool| {
        let mut trainer = trainer(seq as u64, micro_batch as u64, Strategy::Memo);
        let mut task = RecallTask::new(2);
        let mut losses = Vec::new();
        for step in 0..3 {
            if evaluate && step == 2 {
                recall::evaluate(&mut trainer, 9, 1).unwrap();
            }
            let (tokens, targets) = task.next_batch(micro_batch, seq);
            losses.push(trainer.step(&tokens, &targets).unwrap().to_bits());
        }
        (losses, trainer.parameters().unwrap(), trainer.steps_taken())
    };
    assert!(run(false) == run(true), "an evaluation changed the training");
}

/// Two runs with the same seed print the same evaluation lines; every bucket and the control
/// report their sequences.
#[test]
fn train_recall_reports_the_same_evaluation_for_the_same_seed() {
    let args = [
        "train",
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--seq",
        "32",
        "--micro-batch",
        "2",
        "--steps",
        "2",
        "--task",
        "recall",
        "--eval-every",
        "1",
        "--eval-sequences",
        "2",
        "--json",
    ];
    let evaluations = || {
        let output = memo(&args, None);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        // The summary reports no unigram entropy for a task that is not a text (it was NaN).
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(!text.contains("NaN") && text.contains("\"unigram_entropy\":null"), "{text}");
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .filter(|line| line.contains("\"eval\""))
            .map(|line| line.to_string())
            .collect::<Vec<_>>()
    };
    let first = evaluations();
    assert_eq!(first.len(), 2, "one evaluation after step 1 and the final one: {first:?}");
    for line in &first {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        let buckets = value["buckets"].as_array().unwrap();
        assert_eq!(buckets.len(), 4, "{line}");
        assert_eq!(buckets[3]["max_distance"], 30, "{line}");
        assert!(buckets.iter().all(|b| b["sequences"] == 2), "{line}");
        assert_eq!(value["key_removed"]["sequences"], 2, "{line}");
    }
    assert_eq!(first, evaluations());
    let short = memo(&["train", "--device", "cpu", "--seq", "2", "--task", "recall"], None);
    assert!(String::from_utf8_lossy(&short.stderr).contains("--seq 3 or more"));
}
