use super::*;
use crate::model::tests::tiny;
use alloc::format;

const ONE_M: u64 = 1 << 20;

fn seven_b(seq_len: u64) -> (ModelConfig, Parallelism, Hardware) {
    (ModelConfig::preset("7b", seq_len, 1).unwrap(), Parallelism::new(8, 1), Hardware::preset("a800x8").unwrap())
}

#[test]
fn tiny_layer_forward_by_hand() {
    // b 1, s 4, h 8, f 32: QKV 2*4*8*24, projection 2*4*8*8, FC1 = FC2 = 2*4*8*32,
    // attention products 2*1*16*8 each (halved under the mask).
    let full = layer_forward_flops(&tiny(), &Parallelism::single(), AttentionFlops::Full).unwrap();
    assert_eq!(
        full,
        LayerForwardFlops {
            qkv: 1536,
            attention_scores: 256,
            attention_values: 256,
            projection: 512,
            fc1: 2048,
            fc2: 2048
        }
    );
    assert_eq!((full.gemm(), full.attention(), full.total()), (6144, 512, 6656));
    let causal = layer_forward_flops(&tiny(), &Parallelism::single(), AttentionFlops::CausalHalved).unwrap();
    assert_eq!((causal.attention_scores, causal.attention_values, causal.total()), (128, 128, 6400));
    assert_eq!(layer_backward_flops(&tiny(), &Parallelism::single(), AttentionFlops::Full).unwrap(), 13312);
    // t = 2 halves every count exactly.
    let split = layer_forward_flops(&tiny(), &Parallelism::new(2, 1), AttentionFlops::Full).unwrap();
    assert_eq!((split.qkv, split.attention_scores, split.fc2, split.total()), (768, 128, 1024, 3328));
}

#[test]
fn tiny_classifier_step_and_recompute_by_hand() {
    let single = Parallelism::single();
    assert_eq!(classifier_forward_flops(&tiny(), &single).unwrap(), 2 * 4 * 8 * 10);
    // 3 * (2 layers * 6656 + 640) and 3 * (2 * 6400 + 640).
    let full = step_flops(&tiny(), &single, AttentionFlops::Full, 0.5).unwrap();
    assert_eq!(full.model_flops, 41856);
    assert_eq!(full.recompute_flops, 0, "2 layers: both are kept, none recomputes");
    assert_eq!(step_flops(&tiny(), &single, AttentionFlops::CausalHalved, 0.5).unwrap().model_flops, 40320);
    // Tokens [2, 4) of each sequence: QKV 2*2*8*24, projection 2*2*8*8, FC1 2*2*8*32.
    assert_eq!(recompute_flops(&tiny(), &single, 2).unwrap(), 768 + 256 + 1024);
    let mut deeper = tiny();
    deeper.layers = 4;
    deeper.micro_batch = 3;
    let step = step_flops(&deeper, &single, AttentionFlops::Full, 0.5).unwrap();
    assert_eq!(step.recompute_flops, 2 * 3 * 2048, "layers 0 and 1 recompute 2 tokens of 3 sequences");
    assert_eq!(step.hardware_flops, step.model_flops + step.recompute_flops);
    assert_eq!(step_flops(&deeper, &single, AttentionFlops::Full, 1.0).unwrap().recompute_flops, 0);
}

#[test]
fn recomputed_tokens_is_the_suffix_after_alpha_s() {
    assert_eq!(recomputed_tokens(4, 0.5).unwrap(), 2);
    assert_eq!(recomputed_tokens(10, 0.47).unwrap(), 6, "floor(4.7) = 4 swapped");
    assert_eq!(recomputed_tokens(ONE_M, 0.0).unwrap(), ONE_M);
    assert_eq!(recomputed_tokens(ONE_M, 1.0).unwrap(), 0);
    assert_eq!(recomputed_tokens(u64::MAX, 1.0).unwrap(), 0);
    for alpha in [-0.1, 1.1, f64::NAN, f64::INFINITY] {
        assert!(matches!(recomputed_tokens(8, alpha), Err(CostError::BadAlpha { .. })), "{alpha}");
    }
    assert!(format!("{}", recomputed_tokens(8, 2.0).unwrap_err()).contains("from 0 (recompute all) to 1"));
}

#[test]
fn seven_b_at_1m_matches_the_megatron_formula() {
    let (model, parallel, _) = seven_b(ONE_M);
    let (b, s, h) = (1u128, u128::from(ONE_M), 4096u128);
    let gemm = 24 * b * s * h * h / 8;
    let full = layer_forward_flops(&model, &parallel, AttentionFlops::Full).unwrap();
    assert_eq!(full.gemm(), gemm);
    assert_eq!(full.attention(), 4 * b * s * s * h / 8);
    assert_eq!(full.total(), 2_304_576_371_818_496);
    let causal = layer_forward_flops(&model, &parallel, AttentionFlops::CausalHalved).unwrap();
    assert_eq!(causal.total(), 1_178_676_464_975_872);
    // Recompute of all tokens: 16 bsh^2 / t.
    assert_eq!(recompute_flops(&model, &parallel, ONE_M).unwrap(), 16 * b * s * h * h / 8);
}

#[test]
fn attention_is_over_90_percent_past_576k() {
    let (model, parallel, _) = seven_b(576 * 1024);
    let flops = layer_forward_flops(&model, &parallel, AttentionFlops::CausalHalved).unwrap();
    let share = flops.attention() as f64 / flops.total() as f64;
    assert!(share > 0.9, "{share}");
    let (model, parallel, _) = seven_b(32 * 1024);
    let flops = layer_forward_flops(&model, &parallel, AttentionFlops::CausalHalved).unwrap();
    assert!((flops.attention() as f64 / flops.total() as f64) < 0.5);
}

#[test]
fn layer_time_is_flops_over_achieved_or_measured() {
    let (model, parallel, mut hardware) = seven_b(ONE_M);
    let time = layer_forward_time_s(&model, &parallel, &hardware, AttentionFlops::CausalHalved).unwrap();
    let expected = 1_178_676_464_975_872.0 / 187_200_000_000_000.0;
    assert!((time - expected).abs() < 1e-9, "{time}");
    assert!((6.2..6.4).contains(&time), "{time}");
    hardware.measured_layer_forward_s = Some(6.0);
    assert_eq!(layer_forward_time_s(&model, &parallel, &hardware, AttentionFlops::Full).unwrap(), 6.0);
    // 3.5 s would run the layer's 1.18e15 FLOPs at 3.4e14 FLOP/s, above the A800's 3.12e14 peak.
    hardware.measured_layer_forward_s = Some(3.5);
    assert!(matches!(
        layer_forward_time_s(&model, &parallel, &hardware, AttentionFlops::Full),
        Err(CostError::MeasuredAbovePeak { seconds, peak: 312_000_000_000_000, .. }) if seconds == 3.5
    ));
    hardware.measured_layer_forward_s = Some(f64::NAN);
    assert!(matches!(
        layer_forward_time_s(&model, &parallel, &hardware, AttentionFlops::Full),
        Err(CostError::Model(ModelError::BadMeasuredTime { .. }))
    ));
}

#[test]
fn mfu_reports_both_conventions() {
    let (model, parallel, hardware) = seven_b(ONE_M);
    let full = step_flops(&model, &parallel, AttentionFlops::Full, 1.0).unwrap().model_flops;
    // A step time at which the full-attention MFU is exactly 50%.
    let step_time = full as f64 / (0.5 * hardware.peak_flops as f64);
    let mfu = mfu(&model, &parallel, &hardware, step_time).unwrap();
    assert!((mfu.full - 0.5).abs() < 1e-12, "{}", mfu.full);
    assert_eq!(mfu.model_flops_full, full);
    let ratio = mfu.full / mfu.causal_halved;
    assert!((1.8..2.0).contains(&ratio), "conventions differ by about 2x at 1M: {ratio}");
    let text = format!("{mfu}");
    assert!(text.contains("50.0% (attention FLOPs counted in full)"), "{text}");
    assert!(text.contains("(attention FLOPs halved for the causal mask)"), "{text}");
}

#[test]
fn mfu_rejects_bad_step_times_and_machines() {
    let (model, parallel, mut hardware) = seven_b(ONE_M);
    for seconds in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(mfu(&model, &parallel, &hardware, seconds), Err(CostError::BadStepTime { .. })), "{seconds}");
    }
    assert!(format!("{}", CostError::BadStepTime { seconds: 0.0 }).contains("finite number of seconds above 0"));
    hardware.peak_flops = 0;
    assert_eq!(mfu(&model, &parallel, &hardware, 1.0), Err(CostError::Model(ModelError::Zero { field: "peak_flops" })));
}

#[test]
fn invalid_models_are_errors_in_every_entry_point() {
    let mut model = tiny();
    model.layers = 0;
    let single = Parallelism::single();
    let zero = CostError::Model(ModelError::Zero { field: "layers" });
    assert_eq!(layer_forward_flops(&model, &single, AttentionFlops::Full), Err(zero.clone()));
    assert_eq!(layer_backward_flops(&model, &single, AttentionFlops::Full), Err(zero.clone()));
    assert_eq!(recompute_flops(&model, &single, 1), Err(zero.clone()));
    assert_eq!(classifier_forward_flops(&model, &single), Err(zero.clone()));
    assert_eq!(step_flops(&model, &single, AttentionFlops::Full, 0.0), Err(zero.clone()));
    let hardware = Hardware::preset("h200x1").unwrap();
    assert_eq!(layer_forward_time_s(&model, &single, &hardware, AttentionFlops::Full), Err(zero.clone()));
    assert_eq!(mfu(&model, &single, &hardware, 1.0), Err(zero));
    let e = layer_forward_flops(&tiny(), &Parallelism::new(3, 1), AttentionFlops::Full).unwrap_err();
    assert_eq!(e, CostError::Model(ModelError::NotDivisibleByTensorParallel { field: "heads", value: 2, tensor: 3 }));
    assert!(format!("{e}").contains("tensor-parallel degree t = 3"));
}

#[test]
fn huge_sequences_overflow_into_errors() {
    let model = ModelConfig::new("long", 1, 8, 2, 1 << 62, 1);
    let single = Parallelism::single();
    let overflow = |r: Result<u128, CostError>| matches!(r, Err(CostError::Model(ModelError::Overflow { .. })));
    assert!(overflow(layer_forward_flops(&model, &single, AttentionFlops::Full).map(|f| f.total())));
    assert!(overflow(step_flops(&model, &single, AttentionFlops::CausalHalved, 0.5).map(|f| f.model_flops)));
    let model = ModelConfig::new("wide", u32::MAX, 1 << 40, 1, 1 << 30, u64::MAX);
    assert!(overflow(recompute_flops(&model, &single, u64::MAX)));
    assert!(overflow(classifier_forward_flops(&model, &single)));
    let model = ModelConfig::new("deep", u32::MAX, 1 << 20, 1, 1 << 40, 1 << 10);
    assert!(overflow(step_flops(&model, &single, AttentionFlops::Full, 0.0).map(|f| f.hardware_flops)));
}

/// Ring times (`spec/tensor-parallel.md` section 5): an all-gather of `x` bytes per rank sends
/// `t - 1` shares of `x`; a reduce-scatter's share is `x / t`; an all-reduce is both; nothing at
/// `t = 1`, for non-collectives, or without a bandwidth.
#[test]
fn collectives_take_ring_time() {
    use crate::model::Interconnect;
    use crate::plan::Op;
    let link = Interconnect { bytes_per_s: 100, latency_ns: 1_000_000_000 };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(close(collective_time_s(Op::AllGather, 1000, 4, &link), 3.0 * (10.0 + 1.0)));
    assert!(close(collective_time_s(Op::ReduceScatter, 4000, 4, &link), 3.0 * (10.0 + 1.0)));
    assert!(close(collective_time_s(Op::AllReduceSumF32, 4000, 4, &link), 2.0 * 3.0 * (10.0 + 1.0)));
    assert!(close(collective_time_s(Op::AllReduceMaxF32, 400, 2, &link), 2.0 * (2.0 + 1.0)));
    assert_eq!(collective_time_s(Op::AllGather, 1000, 1, &link), 0.0);
    assert_eq!(collective_time_s(Op::Linear, 1000, 4, &link), 0.0);
    assert_eq!(collective_time_s(Op::AllGather, 1000, 4, &Interconnect::UNKNOWN), 0.0);
}

/// The paper's setting at t = 8: the collective stream's busy time is the sum of its collectives'
/// ring times, it is part of the step (compute waits for every collective), and a faster link
/// shortens the step by exactly the collectives' saving.
#[test]
fn the_paper_settings_step_includes_its_collectives() {
    use crate::model::Interconnect;
    use crate::plan::{Action, Strategy, Stream};
    use crate::planner::{plan, PlanRequest};
    let model = ModelConfig::preset("7b", 1 << 20, 1).unwrap();
    let request =
        PlanRequest::new(model, Parallelism::new(8, 1), Hardware::preset("a800x8").unwrap(), Strategy::FullSwap);
    let report = plan(&request).unwrap();
    let (plan_, timeline) = (&report.plan, &report.timeline);
    let mut expected = 0.0;
    for instruction in plan_.instructions.iter().filter(|i| i.stream == Stream::Collective) {
        let Action::Launch(launch) = &instruction.action else { continue };
        let arg = launch.args[0].region;
        let bytes = (arg.end - arg.start) * plan_.buffers[arg.buffer.index()].row_bytes;
        expected += collective_time_s(launch.op, bytes, 8, &plan_.provenance.interconnect);
    }
    let busy = timeline.stream_busy_s(plan_, Stream::Collective);
    assert!(busy > 1.0 && (busy - expected).abs() < 1e-6 * expected, "{busy} vs {expected}");
    let faster =
        plan(&PlanRequest { interconnect: Interconnect { bytes_per_s: u64::MAX, latency_ns: 0 }, ..request }).unwrap();
    let saved = report.timeline.step_time_s - faster.timeline.step_time_s;
    let collectives_saved = busy - faster.timeline.stream_busy_s(&faster.plan, Stream::Collective);
    // Full swap at this α hides its copies: the step is compute plus the collectives it waits for.
    assert!((saved - collectives_saved).abs() < 1e-6 * report.timeline.step_time_s, "{saved} vs {collectives_saved}");
}

/// A machine with measured kernel rates: every attention launch of the plan takes its FLOPs over
/// the measured attention rate (the backward its executed 5/2 of the forward's FLOPs over the
/// backward rate), every matrix product its FLOPs over the GEMM rate, exactly; the step changes
/// from the preset's, and halving the GEMM rate adds exactly the step's GEMM FLOPs over the new
/// rate minus over the old (keep-all at t = 1: the step is the compute stream's launches).
#[test]
fn measured_rates_time_attention_and_gemm_launches() {
    use crate::model::MeasuredRates;
    use crate::plan::{Action, Op, Strategy, Stream};
    use crate::planner::{plan, PlanRequest};
    let mut model = ModelConfig::preset("7b", 8192, 1).unwrap();
    model.layers = 4;
    let parallel = Parallelism::single();
    let preset = Hardware::preset("h200x1").unwrap();
    let (forward, backward, gemm) = (45_000_000_000_000u64, 27_500_000_000_000u64, 600_000_000_000_000u64);
    let mut measured = preset.clone();
    measured.measured_rates = MeasuredRates {
        attention_forward_flops: Some(forward),
        attention_backward_flops: Some(backward),
        gemm_flops: Some(gemm),
    };
    let layer = layer_forward_flops(&model, &parallel, AttentionFlops::CausalHalved).unwrap();
    let report = plan(&PlanRequest::new(model.clone(), parallel, measured.clone(), Strategy::KeepAll)).unwrap();
    let (mut attention_launches, mut backward_launches, mut gemm_flops) = (0, 0, 0u128);
    // A span is `end - start` of the stream's clock: the launch's time up to the clock's rounding.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
    for (instruction, span) in report.plan.instructions.iter().zip(&report.timeline.spans) {
        let Action::Launch(launch) = &instruction.action else { continue };
        let seconds = span.end_s - span.start_s;
        match launch.op {
            Op::Attention => {
                assert_eq!(u128::from(launch.flops), layer.attention());
                assert!(close(seconds, layer.attention() as f64 / forward as f64), "{seconds}");
                attention_launches += 1;
            }
            Op::AttentionBackward => {
                // The backward executes 5/2 of the forward's FLOPs: 5 s x s products against 2.
                assert!(close(seconds, (layer.attention() * 5 / 2) as f64 / backward as f64), "{seconds}");
                backward_launches += 1;
            }
            _ if launch.flops > 0 => {
                assert!(close(seconds, launch.flops as f64 / gemm as f64), "{}", launch.op.name());
                gemm_flops += u128::from(launch.flops);
            }
            _ => assert_eq!(seconds, 0.0, "{}", launch.op.name()),
        }
    }
    assert_eq!((attention_launches, backward_launches), (4, 4));
    // Keep-all recomputes nothing: the GEMM FLOPs are the model's less its attention.
    let step = step_flops(&model, &parallel, AttentionFlops::CausalHalved, 1.0).unwrap();
    assert_eq!(gemm_flops, step.model_flops - 3 * 4 * layer.attention());
    let by_formula = 4.0 * (layer.attention() as f64 / forward as f64)
        + 4.0 * ((layer.attention() * 5 / 2) as f64 / backward as f64)
        + gemm_flops as f64 / gemm as f64;
    let busy = report.timeline.busy_s[Stream::Compute.index()];
    assert!((busy - by_formula).abs() <= 1e-12 * by_formula, "{busy} vs {by_formula}");
    assert_eq!(report.timeline.step_time_s, busy);
    let at_preset = plan(&PlanRequest::new(model.clone(), parallel, preset.clone(), Strategy::KeepAll)).unwrap();
    assert!(at_preset.timeline.step_time_s < report.timeline.step_time_s / 2.0);
    // Half the GEMM rate: the GEMMs take twice as long, nothing else changes.
    let mut slower = measured.clone();
    slower.measured_rates.gemm_flops = Some(gemm / 2);
    let halved = plan(&PlanRequest::new(model.clone(), parallel, slower, Strategy::KeepAll)).unwrap();
    let added = halved.timeline.step_time_s - report.timeline.step_time_s;
    let expected = gemm_flops as f64 / (gemm / 2) as f64 - gemm_flops as f64 / gemm as f64;
    assert!((added - expected).abs() <= 1e-9 * expected, "{added} vs {expected}");
    // T_layer (the swap fraction's) follows the same rates.
    let t_layer = layer_forward_time_s(&model, &parallel, &measured, AttentionFlops::CausalHalved).unwrap();
    assert_eq!(t_layer, layer.gemm() as f64 / gemm as f64 + layer.attention() as f64 / forward as f64);
    // Only the GEMM rate: attention launches stay at achieved_flops.
    let mut gemm_only = preset.clone();
    gemm_only.measured_rates.gemm_flops = Some(gemm);
    let rates = LaunchRates::of(&model, &parallel, &gemm_only).unwrap();
    assert_eq!(rates.launch_time_s(Op::Attention, 1000), 1000.0 / preset.achieved_flops as f64);
    assert_eq!(rates.launch_time_s(Op::AttentionBackward, 1000), 1000.0 / preset.achieved_flops as f64);
    assert_eq!(rates.launch_time_s(Op::LinearBackwardWeight, 1000), 1000.0 / gemm as f64);
}

/// A measured kernel rate of 0 or above the peak is refused, naming its key.
#[test]
fn measured_rates_above_peak_or_zero_are_refused() {
    let mut hardware = Hardware::preset("h200x1").unwrap();
    hardware.measured_rates.attention_backward_flops = Some(hardware.peak_flops + 1);
    let error = hardware.validate().unwrap_err();
    assert_eq!(
        error,
        ModelError::MeasuredRateAbovePeak {
            field: "attention_backward_flops",
            rate: hardware.peak_flops + 1,
            peak: hardware.peak_flops
        }
    );
    assert!(format!("{error}").contains("attention_backward_flops"));
    hardware.measured_rates.attention_backward_flops = None;
    hardware.measured_rates.gemm_flops = Some(0);
    assert_eq!(hardware.validate().unwrap_err(), ModelError::Zero { field: "gemm_flops" });
}

/// The data-parallel collectives (`spec/cost-model.md` section 7b): ZeRO 0 all-reduces the
/// gradients; ZeRO 1 and 2 reduce-scatter them and all-gather the parameters, the same bytes on
/// the wire; nothing at d = 1.
#[test]
fn data_parallel_collectives_take_ring_time_over_their_link() {
    use crate::model::{Interconnect, OptimizerSharding};
    let link = Interconnect { bytes_per_s: 100, latency_ns: 1_000_000_000 };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // 4 ranks, 4000 bytes of gradients and 2000 of parameters: a share is 1000 and 500 bytes.
    let zero0 = data_parallel_time(4000, 2000, 4, OptimizerSharding::Replicated, &link);
    assert!(close(zero0.reduce_gradients_s, 2.0 * 3.0 * (10.0 + 1.0)));
    assert_eq!(zero0.gather_parameters_s, 0.0);
    for sharding in [OptimizerSharding::OptimizerState, OptimizerSharding::OptimizerStateAndGradients] {
        let t = data_parallel_time(4000, 2000, 4, sharding, &link);
        assert!(close(t.reduce_gradients_s, 3.0 * (10.0 + 1.0)));
        assert!(close(t.gather_parameters_s, 3.0 * (5.0 + 1.0)));
        assert!(close(t.total_s(), t.reduce_gradients_s + t.gather_parameters_s));
    }
    assert_eq!(data_parallel_time(4000, 2000, 1, OptimizerSharding::OptimizerState, &link).total_s(), 0.0);
    // The same bytes over the network of a ring across nodes take longer than over NVLink.
    let h = Hardware::preset("h100x8").unwrap();
    let (nvlink, network) = (Interconnect::for_hardware(&h), Interconnect::network_for_hardware(&h));
    let gib = 1u64 << 30;
    let inside = data_parallel_time(gib, gib, 8, OptimizerSharding::OptimizerState, &nvlink);
    let across = data_parallel_time(gib, gib, 8, OptimizerSharding::OptimizerState, &network);
    assert!(across.total_s() > inside.total_s() * (nvlink.bytes_per_s / network.bytes_per_s) as f64 * 0.9);
}

/// Context parallelism (`spec/cost-model.md` section 7c): each of the c ranks does 1/c of every
/// FLOP of the step, attention included (the balanced chunks give every rank the same causal
/// share), so per-GPU FLOPs at (t, c) are those at (t, 1) over c, exactly, for both attention
/// conventions and the recompute.
#[test]
fn context_parallel_ranks_share_every_flop_by_c() {
    let model = ModelConfig::preset("llama3.1-8b", 128 << 10, 1).unwrap();
    let one = Parallelism::new(8, 1);
    for c in [2u64, 4] {
        let cp = one.with_context(c);
        for attention in [AttentionFlops::CausalHalved, AttentionFlops::Full] {
            let whole = layer_forward_flops(&model, &one, attention).unwrap();
            let shared = layer_forward_flops(&model, &cp, attention).unwrap();
            assert_eq!(shared.attention() * u128::from(c), whole.attention(), "c = {c}, {attention:?}");
            assert_eq!(shared.gemm() * u128::from(c), whole.gemm(), "c = {c}");
            // Not the attention of a sequence of s / c tokens, which would be c times less again.
            let short = ModelConfig { seq_len: model.seq_len / c, ..model.clone() };
            let local = layer_forward_flops(&short, &one, attention).unwrap();
            assert_eq!(shared.attention(), local.attention() * u128::from(c));
            let step = step_flops(&model, &one, attention, 0.25).unwrap();
            let step_cp = step_flops(&model, &cp, attention, 0.25).unwrap();
            assert_eq!(step_cp.model_flops * u128::from(c), step.model_flops);
        }
        assert_eq!(
            classifier_forward_flops(&model, &cp).unwrap() * u128::from(c),
            classifier_forward_flops(&model, &one).unwrap()
        );
    }
}

/// The K/V one GPU passes per ring step are its rank's s / c tokens of the K/V heads it holds
/// (GQA: kv_heads / t of them, or all of them when t > kv_heads replicates them), K and V, bf16.
#[test]
fn ring_kv_bytes_follow_the_gqa_shapes() {
    let model = ModelConfig::preset("llama3.1-70b", 1 << 20, 1).unwrap();
    let head_dim = model.hidden / model.heads;
    for (t, c) in [(8u64, 2u64), (8, 4), (4, 8), (1, 2)] {
        let parallel = Parallelism::new(t, 1).with_context(c);
        let heads = if t > model.kv_heads { model.kv_heads } else { model.kv_heads / t };
        let expected = 2 * (model.seq_len / c) * heads * head_dim * BF16_BYTES_FOR_TESTS;
        assert_eq!(ring_kv_bytes(&model, &parallel).unwrap(), expected, "t = {t}, c = {c}");
    }
    // t = 16 > kv_heads = 8: every rank holds all 8 heads, as t = 8 holds 1.
    let wide = ModelConfig::preset("llama3.1-8b", 1 << 16, 1).unwrap();
    let replicated = ring_kv_bytes(&wide, &Parallelism::new(16, 1).with_context(2)).unwrap();
    assert_eq!(replicated, 2 * (wide.seq_len / 2) * wide.kv_heads * (wide.hidden / wide.heads) * 2);
}

const BF16_BYTES_FOR_TESTS: u64 = crate::model::BF16_BYTES;

/// A ring step's transfer hides under the attention of the chunk in hand; only the excess is
/// exposed, c - 1 times per layer, and the backward moves twice the bytes. Inside a node (NVLink)
/// at 1M tokens the attention hides it all; a slow link exposes it, by the formula.
#[test]
fn ring_transfers_are_exposed_only_past_the_chunk_attention() {
    let hardware = Hardware::preset("h100x8").unwrap();
    let model = ModelConfig::preset("llama3.1-8b", 1 << 20, 1).unwrap();
    let parallel = Parallelism::new(8, 1).with_context(4);
    let nvlink = Interconnect::for_hardware(&hardware);
    let n = u64::from(model.layers);
    let fast = context_parallel_time(&model, &parallel, &hardware, &nvlink, n, n).unwrap();
    let kv = ring_kv_bytes(&model, &parallel).unwrap();
    assert_eq!(fast.kv_bytes, kv);
    let step = |bytes: u64, link: &Interconnect| bytes as f64 / link.bytes_per_s as f64 + link.latency_ns as f64 * 1e-9;
    assert!((fast.forward_transfer_s - step(kv, &nvlink)).abs() < 1e-12);
    assert!((fast.backward_transfer_s - step(2 * kv, &nvlink)).abs() < 1e-12);
    let rates = LaunchRates::of(&model, &parallel, &hardware).unwrap();
    let attention = layer_forward_flops(&model, &parallel, AttentionFlops::CausalHalved).unwrap().attention() as u64;
    assert!((fast.forward_chunk_s - rates.launch_time_s(Op::Attention, attention) / 4.0).abs() < 1e-12);
    assert!(fast.forward_chunk_s > fast.forward_transfer_s, "1M tokens: attention hides the ring");
    assert_eq!(fast.exposed_s(), 0.0);
    // A link 1000 times slower: exposed = n (c - 1) (transfer - chunk), each direction.
    let slow = Interconnect { bytes_per_s: nvlink.bytes_per_s / 1000, latency_ns: 10_000 };
    let exposed = context_parallel_time(&model, &parallel, &hardware, &slow, n, n).unwrap();
    // Full recompute reruns each attention forward: twice the forward launches, twice the exposure.
    let rerun = context_parallel_time(&model, &parallel, &hardware, &slow, 2 * n, n).unwrap();
    assert!((rerun.forward_exposed_s - 2.0 * exposed.forward_exposed_s).abs() < 1e-9 * rerun.forward_exposed_s);
    assert_eq!(rerun.backward_exposed_s, exposed.backward_exposed_s);
    let n = n as f64;
    let forward = n * 3.0 * (step(kv, &slow) - exposed.forward_chunk_s).max(0.0);
    let backward = n * 3.0 * (step(2 * kv, &slow) - exposed.backward_chunk_s).max(0.0);
    assert!(forward > 0.0 && backward > 0.0);
    assert!((exposed.forward_exposed_s - forward).abs() < 1e-9 * forward);
    assert!((exposed.backward_exposed_s - backward).abs() < 1e-9 * backward);
    // c = 1: no ring.
    let none = context_parallel_time(&model, &Parallelism::new(8, 1), &hardware, &slow, n as u64, n as u64).unwrap();
    assert_eq!(none, ContextParallelTime::default());
}
