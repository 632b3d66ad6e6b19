//! The headline property of the runtime (issue: "the runtime and the trainer"): every strategy
//! trains the same model bit for bit. memo (at several α), full-swap, full-recompute and keep-all
//! give identical losses at every step and identical parameters after 20 steps, at two model
//! sizes; and the backend allocates exactly the plan's arena and host slab.

use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::Strategy;
use memo_runtime::data::{TextData, DEFAULT_TEXT};
use memo_runtime::{cpu_hardware, AdamW, NamedBytes, TrainOptions, Trainer};
use runtime_cpu::CpuBackend;

const STEPS: usize = 20;

fn model(layers: u32, hidden: u64, heads: u64, seq: u64, micro_batch: u64) -> ModelConfig {
    let mut model = ModelConfig::new("test", layers, hidden, heads, seq, micro_batch);
    model.vocab = 256;
    model
}

/// Losses of every step and the final parameters.
fn train(model: &ModelConfig, strategy: Strategy, alpha: Option<f64>) -> (Vec<u32>, Vec<NamedBytes>) {
    let options = TrainOptions {
        model: model.clone(),
        strategy,
        forced_alpha: alpha,
        hardware: cpu_hardware(1 << 30),
        seed: 11,
        adamw: AdamW { lr: 3e-3, ..AdamW::default() },
    };
    let mut trainer = Trainer::new(CpuBackend::new(), &options).unwrap();
    let memory = trainer.memory();
    let totals = trainer.report().plan.totals;
    assert_eq!((memory.device_bytes, memory.host_bytes), (totals.arena_bytes, totals.host_bytes));
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let (tokens, targets) = data.next_batch(model.micro_batch as usize, model.seq_len as usize);
        let loss = trainer.step(&tokens, &targets).unwrap();
        assert!(loss.is_finite());
        losses.push(loss.to_bits());
    }
    (losses, trainer.parameters().unwrap())
}

fn all_strategies_agree(model: &ModelConfig) {
    let (reference_losses, reference_parameters) = train(model, Strategy::KeepAll, None);
    assert!(f32::from_bits(reference_losses[STEPS - 1]) < f32::from_bits(reference_losses[0]), "the loss falls");
    let runs = [
        (Strategy::Memo, Some(0.0)),
        (Strategy::Memo, Some(0.3)),
        (Strategy::Memo, Some(1.0)),
        (Strategy::FullSwap, None),
        (Strategy::FullRecompute, None),
    ];
    for (strategy, alpha) in runs {
        let (losses, parameters) = train(model, strategy, alpha);
        assert_eq!(losses, reference_losses, "{strategy:?} alpha {alpha:?}: losses differ from keep-all");
        assert!(parameters == reference_parameters, "{strategy:?} alpha {alpha:?}: parameters differ from keep-all");
    }
}

#[test]
fn every_strategy_trains_the_same_model_bit_for_bit_small() {
    all_strategies_agree(&model(4, 32, 2, 32, 1));
}

#[test]
fn every_strategy_trains_the_same_model_bit_for_bit_larger() {
    all_strategies_agree(&model(5, 64, 4, 48, 2));
}
