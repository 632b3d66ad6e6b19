//! Memory is what the plan says: the CPU backend allocates exactly the plan's arena and host
//! slab, and at a sequence long enough for activations to dominate, memo's arena is below
//! keep-all's by the amount the planner predicts.

use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::Strategy;
use memo_plan_core::planner::{plan, PlanRequest};
use memo_runtime::{cpu_hardware, AdamW, TrainOptions, Trainer};
use runtime_cpu::CpuBackend;

#[test]
fn memo_saves_what_the_planner_predicts() {
    let mut model = ModelConfig::new("test", 8, 64, 4, 2048, 1);
    model.vocab = 256;
    let hardware = cpu_hardware(1 << 30);
    let mut allocated = Vec::new();
    for strategy in [Strategy::KeepAll, Strategy::Memo] {
        let options = TrainOptions {
            model: model.clone(),
            strategy,
            forced_alpha: None,
            hardware: hardware.clone(),
            seed: 1,
            adamw: AdamW::default(),
        };
        let trainer = Trainer::new(CpuBackend::new(), &options).unwrap();
        let predicted = plan(&PlanRequest::new(
            model.clone(),
            memo_plan_core::model::Parallelism::single(),
            hardware.clone(),
            strategy,
        ))
        .unwrap();
        let memory = trainer.memory();
        assert_eq!(memory.device_bytes, predicted.plan.totals.arena_bytes, "{strategy:?}");
        assert_eq!(memory.host_bytes, predicted.plan.totals.host_bytes, "{strategy:?}");
        allocated.push(memory.device_bytes);
    }
    let (keep_all, memo) = (allocated[0], allocated[1]);
    // Eight layers of skeletal tensors against two rounding buffers: well over half saved.
    assert!(memo * 2 < keep_all, "memo {memo} vs keep-all {keep_all}");
}
