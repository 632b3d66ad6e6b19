//! Checked mode (the runtime twin of the plan checker): no violation on any plan the planner
//! makes, and a deliberately broken plan is caught while it runs.

use memo_plan_core::check::CheckedPlan;
use memo_plan_core::generate::SplitMix64;
use memo_plan_core::model::{ModelConfig, Parallelism};
use memo_plan_core::plan::{Action, EventId, Plan, Strategy, Stream};
use memo_plan_core::planner::{plan, PlanRequest};
use memo_runtime::data::{TextData, DEFAULT_TEXT};
use memo_runtime::{
    cpu_hardware, AdamW, Backend, BackendError, KernelContext, Replay, RuntimeError, TrainOptions, Trainer,
};
use runtime_cpu::CpuBackend;

fn model(layers: u32, hidden: u64, heads: u64, seq: u64, micro_batch: u64) -> ModelConfig {
    let mut model = ModelConfig::new("test", layers, hidden, heads, seq, micro_batch);
    model.vocab = 256;
    model
}

#[test]
fn checked_mode_accepts_every_plan_the_planner_makes() {
    let mut rng = SplitMix64::new(5);
    for case in 0..12 {
        let heads = 1 + rng.below(3);
        let m = model(1 + rng.below(5) as u32, heads * 8, heads, 8 * (1 + rng.below(6)), 1 + rng.below(2));
        let strategy = Strategy::ALL[case % 4];
        let alpha = (strategy == Strategy::Memo).then(|| rng.below(11) as f64 / 10.0);
        let options = TrainOptions {
            model: m.clone(),
            strategy,
            forced_alpha: alpha,
            hardware: cpu_hardware(1 << 30),
            seed: case as u64,
            adamw: AdamW::default(),
        };
        let backend = CpuBackend::checked();
        let mut trainer = Trainer::new(backend, &options).unwrap();
        let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
        for _ in 0..2 {
            let (tokens, targets) = data.next_batch(m.micro_batch as usize, m.seq_len as usize);
            if let Err(e) = trainer.step(&tokens, &targets) {
                panic!("case {case} {strategy:?} {m:?}: {e}");
            }
        }
    }
}

/// The memo plan of a 4-layer model without the compute stream's wait for layer 0's swap-out:
/// layer 2's input is written into rounding buffer 0 while the device-to-host stream may still
/// be copying layer 0's data out of it.
fn plan_without_the_first_swap_out_wait() -> Plan {
    let request =
        PlanRequest::new(model(4, 32, 2, 32, 1), Parallelism::single(), cpu_hardware(1 << 30), Strategy::Memo);
    let mut plan = plan(&request).unwrap().plan;
    let swap_out = plan
        .instructions
        .iter()
        .find_map(|i| match i.action {
            Action::Record(e) if i.stream == Stream::DeviceToHost => Some(e),
            _ => None,
        })
        .unwrap();
    let wait = plan
        .instructions
        .iter()
        .position(|i| i.stream == Stream::Compute && i.action == Action::Wait(swap_out))
        .unwrap();
    plan.instructions.remove(wait);
    plan
}

#[test]
fn checked_mode_catches_a_missing_wait_at_run_time() {
    let plan = plan_without_the_first_swap_out_wait();
    // The static checker refuses it, so no safe code can replay it...
    assert!(CheckedPlan::check(plan.clone()).is_err());
    // ...and checked mode catches it while running, whatever the timing.
    // Safety: it runs only on the checked-mode backend below, which refuses an access the
    // executed events do not order before making it.
    let replay = unsafe { Replay::new_unchecked(plan) }.unwrap();
    let mut backend = CpuBackend::checked();
    replay.allocate(&mut backend).unwrap();
    let context = KernelContext {
        hidden: 32,
        heads: 2,
        kv_heads: 0,
        kv_replicated: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len: 32,
        vocab: 256,
        loss_scale_tokens: 32,
        adamw: AdamW::default(),
        rank: 0,
        ranks: 1,
        context_rank: 0,
        context_ranks: 1,
    };
    match replay.run(&mut backend, &context) {
        Err(RuntimeError::Backend(BackendError::Unordered(message))) => {
            assert!(message.contains("no event"), "{message}");
        }
        other => panic!("expected an unordered access, got {other:?}"),
    }
}

/// An event beyond those allocated is refused when it is enqueued: a wait on it used to fall
/// through, ordering nothing the plan ordered.
#[test]
fn events_that_were_not_allocated_are_refused() {
    let mut backend = CpuBackend::new();
    backend.allocate(1024, 1024, 2).unwrap();
    assert!(backend.record(0, Stream::Compute, EventId(1)).is_ok());
    assert!(backend.wait(1, Stream::DeviceToHost, EventId(1)).is_ok());
    assert!(matches!(backend.record(2, Stream::Compute, EventId(2)), Err(BackendError::Kernel { instruction: 2, .. })));
    assert!(matches!(
        backend.wait(3, Stream::HostToDevice, EventId(7)),
        Err(BackendError::Kernel { instruction: 3, .. })
    ));
    backend.synchronize().unwrap();
}

/// A scratch sizer shaped like a GPU backend's: every attention launch and every squared
/// gradient norm asks some bytes.
#[derive(Debug)]
struct SomeScratch;

impl memo_plan_core::plan::scratch::ScratchSizer for SomeScratch {
    fn scratch_bytes(
        &self,
        op: memo_plan_core::plan::Op,
        args: &[memo_plan_core::plan::shapes::ArgShape],
        _ctx: &memo_plan_core::plan::shapes::ShapeContext,
    ) -> u64 {
        use memo_plan_core::plan::Op;
        match op {
            Op::Attention | Op::AttentionBackward => args.first().map_or(0, |q| q.rows * q.row_bytes),
            Op::GradNormSquared => 300,
            _ => 0,
        }
    }
}

/// A plan made for a GPU backend's scratch sizer runs on the CPU (whose ops need none) in
/// checked mode, the scratch arguments ordered like any other, and trains to the same bits as
/// the plan without them.
#[test]
fn a_plan_with_launch_scratch_trains_the_same_on_the_cpu() {
    let m = model(3, 16, 2, 16, 1);
    let options = TrainOptions {
        model: m.clone(),
        strategy: Strategy::Memo,
        forced_alpha: Some(0.5),
        hardware: cpu_hardware(1 << 30),
        seed: 3,
        adamw: AdamW::default(),
    };
    let with = memo_runtime::PlannedStep::with_scratch(&options, &SomeScratch).unwrap();
    let scratch = with.report().plan.buffers.iter().filter(|b| b.role == memo_plan_core::plan::TensorRole::Scratch);
    assert!(scratch.count() >= 6);
    let mut losses = Vec::new();
    for planned in [with, memo_runtime::PlannedStep::new(&options).unwrap()] {
        let mut trainer = Trainer::with_plan(CpuBackend::checked(), planned).unwrap();
        let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap();
        let mut run = Vec::new();
        for _ in 0..2 {
            let (tokens, targets) = data.next_batch(m.micro_batch as usize, m.seq_len as usize);
            run.push(trainer.step(&tokens, &targets).unwrap().to_bits());
        }
        assert_eq!(trainer.memory().scratch_bytes, 0);
        losses.push(run);
    }
    assert_eq!(losses[0], losses[1]);
}
