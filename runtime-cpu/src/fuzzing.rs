//! The `execute` fuzz harness (feature `fuzzing`; the cargo-fuzz target in `fuzz/` is a thin
//! call into [`check`]): a random small model and strategy, planned, run for two steps on the
//! checked CPU backend (which traps any access the events do not order), must match keep-all
//! bit for bit.

use arbitrary::Arbitrary;
use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::Strategy;
use memo_runtime::{cpu_hardware, AdamW, NamedBytes, TrainOptions, Trainer};

use crate::CpuBackend;

/// A random small training setup, valid by construction.
#[derive(Arbitrary, Clone, Debug)]
pub struct ExecuteCase {
    layers: u8,
    heads: u8,
    head_dim: u8,
    seq: u8,
    micro_batch: u8,
    strategy: u8,
    alpha_percent: u8,
    seed: u64,
    tokens: Vec<u8>,
}

impl ExecuteCase {
    fn model(&self) -> ModelConfig {
        let heads = 1 + u64::from(self.heads % 3);
        let head_dim = 2 * (1 + u64::from(self.head_dim % 4));
        let mut model = ModelConfig::new(
            "fuzz",
            1 + u32::from(self.layers % 5),
            heads * head_dim,
            heads,
            1 + u64::from(self.seq % 24),
            1 + u64::from(self.micro_batch % 2),
        );
        model.vocab = 256;
        model
    }
}

fn run(case: &ExecuteCase, strategy: Strategy, alpha: Option<f64>) -> (Vec<u32>, Vec<NamedBytes>) {
    let model = case.model();
    let options = TrainOptions {
        model: model.clone(),
        strategy,
        forced_alpha: alpha,
        hardware: cpu_hardware(1 << 30),
        seed: case.seed,
        adamw: AdamW::default(),
    };
    let mut trainer = Trainer::new(CpuBackend::checked(), &options).expect("a small model plans and allocates");
    let tokens_per_step = (model.seq_len * model.micro_batch) as usize;
    let source: Vec<u32> = if case.tokens.is_empty() {
        vec![0; tokens_per_step + 1]
    } else {
        case.tokens.iter().map(|&b| u32::from(b)).cycle().take(tokens_per_step * 2 + 1).collect()
    };
    let mut losses = Vec::new();
    for step in 0..2 {
        let start = (step * tokens_per_step) % (source.len() - tokens_per_step);
        let tokens = &source[start..start + tokens_per_step];
        let targets = &source[start + 1..start + 1 + tokens_per_step];
        let loss = trainer.step(tokens, targets).unwrap_or_else(|e| panic!("{strategy:?}: {e}"));
        losses.push(loss.to_bits());
    }
    (losses, trainer.parameters().expect("parameters download"))
}

/// Runs the case under its strategy and under keep-all; both must succeed in checked mode and
/// agree bit for bit.
pub fn check(case: ExecuteCase) {
    let strategy = Strategy::ALL[usize::from(case.strategy % 4)];
    let alpha = (strategy == Strategy::Memo).then_some(f64::from(case.alpha_percent % 101) / 100.0);
    let reference = run(&case, Strategy::KeepAll, None);
    let result = run(&case, strategy, alpha);
    assert!(result == reference, "{strategy:?} alpha {alpha:?} differs from keep-all on {case:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// About a second of generated cases.
    #[test]
    fn execute_smoke() {
        let started = std::time::Instant::now();
        let mut rng = memo_plan_core::generate::SplitMix64::new(9);
        let mut cases = 0;
        while started.elapsed().as_millis() < 1000 || cases < 4 {
            let bytes: Vec<u8> = (0..64).map(|_| rng.next_u64() as u8).collect();
            let case = ExecuteCase::arbitrary(&mut arbitrary::Unstructured::new(&bytes)).unwrap();
            check(case);
            cases += 1;
        }
    }
}
