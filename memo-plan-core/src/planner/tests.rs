//! The planner's reports agree with themselves: the remedies' longest sequence is `--max-seq`'s,
//! no causal MFU passes 100% of the peak, and the swap summary says what the plan does.

use alloc::format;
use alloc::string::String;

use super::*;
use crate::model::HARDWARE_PRESETS;

/// 7B's layer on `machine` with `layers` layers at `t = 8`: real shapes, quick plans.
fn request(layers: u32, seq_len: u64, machine: &str, strategy: Strategy) -> PlanRequest {
    let mut model = ModelConfig::preset("7b", seq_len, 1).unwrap();
    model.layers = layers;
    PlanRequest::new(model, Parallelism::new(8, 1), Hardware::preset(machine).unwrap(), strategy)
}

/// The number in "fits at most N tokens", or `None` when no remedy quotes one.
fn quoted_longest(remedies: &[String]) -> Option<u64> {
    let line = remedies.iter().find(|r| r.starts_with("fewer tokens"))?;
    let after = line.split("at most ").nth(1)?;
    after.split(' ').next()?.parse().ok()
}

/// On a GPU too small for any length, the advice once said "plan a shorter sequence" next to
/// "fewer tokens will not do". Now only what may help is offered, with sizes in units.
#[test]
fn remedies_offer_no_shorter_sequence_when_none_fits() {
    let mut r = request(3, 64 << 10, "a800x8", Strategy::Memo);
    r.hardware.device_memory_bytes = 1 << 20;
    let report = plan(&r).unwrap();
    assert!(!report.fits());
    let advice = remedies(&r, &report);
    assert!(advice.iter().any(|x| x.starts_with("fewer tokens will not do")), "{advice:?}");
    assert!(!advice.iter().any(|x| x.contains("shorter sequence")), "{advice:?}");
    let device = advice.iter().find(|x| x.starts_with("device memory")).unwrap();
    // a800x8 has 8 GPUs per node: t = 8 is the most, so no higher t is offered either.
    // Its model state alone is past 1 MiB: no strategy helps either, and the advice says why.
    assert!(device.contains("more than the GPU's 1.00 MiB; the model state alone is"), "{device}");
    assert!(device.ends_with("past the GPU's memory whatever the strategy"), "{device}");
    r.parallel = Parallelism::new(4, 1);
    let report = plan(&r).unwrap();
    let advice = remedies(&r, &report);
    let device = advice.iter().find(|x| x.starts_with("device memory")).unwrap();
    assert!(device.ends_with("try a higher tensor-parallel degree than t = 4"), "{device}");
    assert!(device.contains(" bytes) more"), "the exact shortfall: {device}");
}

/// The remedy of full-swap at 1M tokens once said "at most 4439240 tokens keep the always-swapped
/// tensors in host memory" (a host-only bound on part of the swapped bytes) while `--max-seq` said
/// 558080. Every misfit's quoted longest sequence is now `--max-seq`'s answer on every preset: a
/// multiple of its 1K grid that fits, whose next multiple does not (checked here by planning both,
/// not by rerunning the search; memo-cli's tests compare with `--max-seq` itself).
#[test]
fn remedy_and_max_seq_agree_for_every_strategy_on_every_machine() {
    let mut misfits = 0;
    for machine in HARDWARE_PRESETS.iter().map(|p| p.name) {
        for strategy in Strategy::ALL {
            let r = request(3, 64 << 20, machine, strategy);
            let report = plan(&r).unwrap();
            let remedies = remedies(&r, &report);
            if report.fits() {
                assert!(remedies.is_empty(), "{machine} {strategy:?}: {remedies:?}");
                continue;
            }
            misfits += 1;
            let fits_at = |tokens: u64| {
                plan(&PlanRequest { model: ModelConfig { seq_len: tokens, ..r.model.clone() }, ..r.clone() })
                    .is_ok_and(|p| p.fits())
            };
            match quoted_longest(&remedies) {
                Some(tokens) => {
                    let memory =
                        remedies.iter().filter(|r| r.starts_with("device memory") || r.starts_with("host memory"));
                    assert!(
                        memory.clone().count() > 0 && memory.clone().all(|r| r.contains("a shorter sequence")),
                        "{remedies:?}"
                    );
                    assert_eq!(tokens % 1024, 0, "{machine} {strategy:?}: {remedies:?}");
                    assert!(fits_at(tokens) && !fits_at(tokens + 1024), "{machine} {strategy:?}: {remedies:?}");
                }
                None => {
                    assert!(remedies.iter().any(|r| r.contains("does not fit even 1024 tokens")), "{remedies:?}");
                    // Advice never contradicts itself: no "plan a shorter sequence" beside that.
                    assert!(!remedies.iter().any(|r| r.contains("shorter sequence")), "{remedies:?}");
                    assert!(!fits_at(1024), "{machine} {strategy:?}");
                }
            }
        }
    }
    // 64M tokens misses every machine under most strategies: the test compared something.
    assert!(misfits >= 8, "{misfits}");
}

/// No plan of any preset machine and strategy reports a causal MFU above 100% of the peak, at short
/// and long sequences (the full convention credits skipped work and may; see spec/cost-model.md).
#[test]
fn no_causal_mfu_passes_the_peak() {
    for machine in HARDWARE_PRESETS.iter().map(|p| p.name) {
        for seq_len in [4 << 10, 256 << 10, 4 << 20] {
            for strategy in Strategy::ALL {
                let report = plan(&request(4, seq_len, machine, strategy)).unwrap();
                let mfu = report.mfu.causal_halved;
                assert!(mfu > 0.0 && mfu <= 1.0, "{machine} {seq_len} {strategy:?}: MFU-c {mfu}");
            }
        }
    }
}

/// A profile of a small layer applied to a large one once gave an MFU of 218739666%: a measured
/// layer time that would run this layer above the peak is refused, naming the fix.
#[test]
fn a_layer_time_faster_than_the_peak_is_refused() {
    let mut r = request(4, 1 << 20, "h200x1", Strategy::Memo);
    r.hardware.measured_layer_forward_s = Some(0.211);
    let error = plan(&r).unwrap_err();
    let text = format!("{error}");
    assert!(text.contains("above peak_flops") && text.contains("another layer shape"), "{text}");
    // A time the peak allows is taken as given.
    r.hardware.measured_layer_forward_s = Some(1.0e4);
    let report = plan(&r).unwrap();
    assert!(report.mfu.causal_halved <= 1.0);
    assert_eq!(report.swap.unwrap().layer_forward_s, 1.0e4);
}

/// `memo show` of a keep-all plan once said "alpha 0.0000 (not bound: everything swapped), 0 rows
/// swapped", and a two-layer memo plan "alpha 1.000" with nothing on host.
#[test]
fn the_swap_summary_says_which_layers_swap() {
    let summary =
        |layers, strategy| plan(&request(layers, 32 << 10, "a800x8", strategy)).unwrap().plan.provenance.swap_summary();
    assert!(summary(4, Strategy::KeepAll).starts_with("nothing swapped or recomputed"));
    assert!(summary(4, Strategy::FullRecompute).starts_with("nothing swapped: every layer keeps its input"));
    let two = summary(2, Strategy::Memo);
    assert!(two.starts_with("nothing swapped: with 2 layer(s)") && two.contains("alpha does not apply"), "{two}");
    let memo = summary(6, Strategy::Memo);
    assert!(memo.contains("layers 0-3 (4 of 6)") && memo.contains("layers 4 and 5 keep theirs"), "{memo}");
    let full = summary(6, Strategy::FullSwap);
    assert!(full.contains("all 4096 rows of each token-split tensor (nothing recomputed)"), "{full}");
    // With c = 2 a rank holds s / c tokens: 32K / 2 / t = 2 is 8192 rows.
    let mut r = request(6, 32 << 10, "a800x8", Strategy::FullSwap);
    r.parallel = Parallelism::new(2, 1).with_context(2);
    let context = plan(&r).unwrap().plan.provenance.swap_summary();
    assert!(context.contains("all 8192 rows of each token-split tensor"), "{context}");
}

/// `memo plan --layers 1000` took 4.4 s where 200 layers took 0.26 s: the checker compared the
/// model state (live over the whole step, a few buffers per layer) with every buffer that started
/// after it, quadratic in layers. The checker's work, counted (never timed), now doubles with the
/// layers, as do the plan's instructions and buffers, for every strategy.
#[test]
fn planning_work_grows_linearly_in_layers() {
    for strategy in Strategy::ALL {
        let work = |layers: u32| {
            let report = plan(&request(layers, 4 << 10, "h200x8", strategy)).unwrap();
            let (result, work) = crate::check::plan::check_plan_counted(&report.plan);
            assert!(result.is_ok(), "{strategy:?} at {layers} layers: {result:?}");
            (report.plan.instructions.len() as f64, report.plan.buffers.len() as f64, work as f64)
        };
        let (small, large) = (work(16), work(32));
        let ratios = [large.0 / small.0, large.1 / small.1, large.2 / small.2];
        for (what, ratio) in ["instructions", "buffers", "checker work"].into_iter().zip(ratios) {
            assert!((1.5..=2.2).contains(&ratio), "{strategy:?}: {what} x{ratio:.2} from 16 to 32 layers");
        }
    }
}

/// The estimate a request is refused by counts the step's instructions and buffers exactly, for
/// every strategy, without building the step.
#[test]
fn the_size_estimate_counts_the_step_exactly() {
    for strategy in Strategy::ALL {
        for layers in [1, 2, 3, 4, 7] {
            let r = request(layers, 64 << 10, "h200x8", strategy);
            let report = plan(&r).unwrap();
            let alpha_fixed = schedule::alpha_to_fixed(report.plan.provenance.alpha);
            let size = estimate(&r.model, &r.parallel, strategy, alpha_fixed).unwrap();
            assert_eq!(size.instructions, report.plan.instructions.len() as u64, "{strategy:?} {layers}");
            assert_eq!(size.buffers, report.plan.buffers.len() as u64, "{strategy:?} {layers}");
            assert_eq!(
                size.bytes,
                size.instructions * PLAN_BYTES_PER_INSTRUCTION
                    + size.buffers * PLAN_BYTES_PER_BUFFER
                    + PLAN_GRAPH_BYTES
            );
        }
    }
    // With c = 2 the counts are one program's, exact, and the bytes hold both programs.
    for layers in [2, 4] {
        let mut r = request(layers, 64 << 10, "h200x8", Strategy::Memo);
        r.parallel = Parallelism::new(1, 1).with_context(2);
        let report = plan(&r).unwrap();
        let alpha_fixed = schedule::alpha_to_fixed(report.plan.provenance.alpha);
        let size = estimate(&r.model, &r.parallel, Strategy::Memo, alpha_fixed).unwrap();
        assert_eq!(size.instructions, report.plan.instructions.len() as u64, "c = 2, {layers} layers");
        assert_eq!(size.instructions, report.plan.rank_programs[0].instructions.len() as u64);
        assert_eq!(size.buffers, report.plan.buffers.len() as u64);
        let bytes = 2 * size.instructions * PLAN_BYTES_PER_INSTRUCTION + size.buffers * PLAN_BYTES_PER_BUFFER;
        assert_eq!(size.bytes, bytes + PLAN_GRAPH_BYTES);
    }
}

/// `memo plan --layers 100000 --hidden 65536` ran for 10+ minutes at 4.2 GB, silently. A step
/// that would take more than the limit to plan is refused before it is built, naming the memory
/// it would take and how to proceed; a raised limit lets a small step through.
#[test]
fn a_step_too_large_to_plan_is_refused_with_the_memory_it_needs() {
    let mut r = request(100_000, 4 << 10, "h200x8", Strategy::Memo);
    r.model.hidden = 65536;
    r.model.ffn_hidden = 4 * 65536;
    match plan(&r) {
        Err(PlanError::TooLarge { layers, size, limit_bytes }) => {
            assert_eq!((layers, limit_bytes), (100_000, DEFAULT_PLAN_MEMORY_LIMIT));
            assert!(size.bytes > limit_bytes && size.instructions > 10_000_000, "{size:?}");
            let message = format!("{}", plan(&r).unwrap_err());
            for part in [&format!("({} bytes", size.bytes), "GiB", "--plan-memory", "fewer layers"] {
                assert!(message.contains(part), "{part}: {message}");
            }
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // The same bound, just under a small step's estimate, refuses it; at the estimate it plans.
    let small = request(4, 4 << 10, "h200x8", Strategy::Memo);
    let report = plan(&small).unwrap();
    let size =
        estimate(&small.model, &small.parallel, Strategy::Memo, schedule::alpha_to_fixed(report.plan.provenance.alpha))
            .unwrap();
    assert!(matches!(
        plan(&PlanRequest { memory_limit_bytes: size.bytes - 1, ..small.clone() }),
        Err(PlanError::TooLarge { .. })
    ));
    assert!(plan(&PlanRequest { memory_limit_bytes: size.bytes, ..small }).is_ok());
}

/// The observer hears each stage of each plan in order, with the schedule's sizes once it is
/// built, and each length a search probes before its plan's stages.
#[test]
fn the_observer_hears_every_stage_and_probe() {
    let r = request(3, 64 << 10, "h200x8", Strategy::Memo);
    let mut heard = Vec::new();
    let report = plan_observed(&r, &mut |p| heard.push(p)).unwrap();
    let stages: Vec<Stage> = heard
        .iter()
        .map(|p| match *p {
            Progress::Stage { stage, strategy, seq_len, .. } => {
                assert_eq!((strategy, seq_len), (Strategy::Memo, 64 << 10));
                stage
            }
            Progress::Probe { .. } => panic!("a plan probes nothing: {p:?}"),
        })
        .collect();
    assert_eq!(stages, [Stage::Alpha, Stage::Schedule, Stage::Placement, Stage::Simulate]);
    let Progress::Stage { instructions, buffers, .. } = heard[2] else { unreachable!() };
    assert_eq!((instructions, buffers), (report.plan.instructions.len(), report.plan.buffers.len()));

    let mut heard = Vec::new();
    let found = longest_sequence_observed(&r, &mut |p| heard.push(p)).unwrap();
    let probes: Vec<(u32, u64)> = heard
        .iter()
        .filter_map(|p| match *p {
            Progress::Probe { probe, seq_len, .. } => Some((probe, seq_len)),
            Progress::Stage { .. } => None,
        })
        .collect();
    assert_eq!(probes.len() as u32, found.plans_made);
    assert!(probes.iter().enumerate().all(|(k, &(probe, _))| probe as usize == k + 1), "{probes:?}");
    // Each probe is followed by its plan's stages at its length.
    for window in heard.windows(2) {
        if let [Progress::Probe { seq_len, .. }, next] = window {
            assert!(
                matches!(next, Progress::Stage { stage: Stage::Alpha, seq_len: s, .. } if s == seq_len),
                "{window:?}"
            );
        }
    }
}

/// The same plan under the three ZeRO stages on 4 nodes (d = 4): the arena is the same, each GPU's
/// device bytes drop by the optimizer state (and, with ZeRO 2, the gradients) sharded away, as
/// summed from the plan's own buffers, and the step grows by the data-parallel collectives.
#[test]
fn sharding_over_data_parallel_ranks_takes_the_sharded_state_off_the_arena() {
    use crate::model::{Nodes, OptimizerSharding};
    let mut r = request(3, 8 << 10, "h100x8", Strategy::Memo);
    r.parallel = Parallelism::new(8, 4);
    r.nodes = Nodes { count: 4, ..r.nodes };
    let sum = |report: &PlanReport, kind: BufferKind| -> u64 {
        report.plan.buffers.iter().filter(|b| b.kind == kind).map(|b| b.bytes().unwrap()).sum()
    };
    let zero0 = plan(&PlanRequest { sharding: OptimizerSharding::Replicated, ..r.clone() }).unwrap();
    let zero1 = plan(&PlanRequest { sharding: OptimizerSharding::OptimizerState, ..r.clone() }).unwrap();
    let zero2 = plan(&PlanRequest { sharding: OptimizerSharding::OptimizerStateAndGradients, ..r.clone() }).unwrap();
    assert_eq!(zero0.plan, zero1.plan, "the plan file is one group's program, whatever the sharding");
    assert_eq!(zero0.device_bytes(), zero0.plan.totals.arena_bytes);
    let optimizer = sum(&zero1, BufferKind::OptimizerState);
    let gradients = sum(&zero1, BufferKind::Gradient);
    let largest = zero1.plan.buffers.iter().filter(|b| b.kind == BufferKind::Gradient).map(|b| b.bytes().unwrap());
    let largest = largest.max().unwrap();
    let optimizer_share = (optimizer / 12).div_ceil(4) * 12;
    assert_eq!(zero1.data_parallel.saved_bytes, optimizer - optimizer_share);
    assert_eq!(zero1.device_bytes(), zero1.plan.totals.arena_bytes - (optimizer - optimizer_share));
    let gradient_share = (gradients / 2).div_ceil(4) * 2 + largest;
    assert_eq!(zero2.data_parallel.saved_bytes, optimizer - optimizer_share + gradients - gradient_share);
    assert_eq!(zero2.model_state_bytes(), zero2.plan.totals.parameter_bytes - zero2.data_parallel.saved_bytes);
    // Across nodes the collectives run on the network's 50 GB/s: ZeRO 0's all-reduce moves the
    // bytes of ZeRO 1's reduce-scatter and all-gather together.
    let dp = &zero1.data_parallel;
    assert!(dp.across_nodes);
    assert_eq!(dp.link.bytes_per_s, 50_000_000_000);
    let parameters = sum(&zero1, BufferKind::Parameter);
    let expected = 3.0 * ((gradients as f64 / 4.0 + parameters.div_ceil(4) as f64) / 50e9 + 2.0 * 8e-6);
    assert!((dp.time.total_s() - expected).abs() < 1e-9, "{} vs {expected}", dp.time.total_s());
    assert!((zero1.step_time_s() - zero1.timeline.step_time_s - expected).abs() < 1e-9);
    assert!(zero0.data_parallel.time.reduce_gradients_s > 0.0);
    // One node of 8 with t = 2, d = 4: the ring stays on NVLink.
    let mut inside = r.clone();
    inside.parallel = Parallelism::new(2, 4);
    inside.nodes = Nodes { count: 1, ..r.nodes };
    inside.sharding = OptimizerSharding::OptimizerState;
    let report = plan(&inside).unwrap();
    assert!(!report.data_parallel.across_nodes);
    assert_eq!(report.data_parallel.link, inside.interconnect);
}

/// Llama-3.1-70B at t = 8 on one node of 8x H100 does not fit even 1K tokens (its model state
/// alone is past 80 GiB); the remedies offer more nodes with ZeRO 1, and with d = 4 (4 nodes) at
/// ZeRO 0 they offer --zero 1 itself, which then fits. At d = 2, ZeRO 1 saves too little (6 of
/// the 16 bytes per parameter against a 53 GiB excess), so it is not offered.
#[test]
fn the_remedies_offer_sharding_where_it_covers_the_excess() {
    use crate::model::{Nodes, OptimizerSharding};
    let model = ModelConfig::preset("llama3.1-70b", 1024, 1).unwrap();
    let r = PlanRequest::new(model, Parallelism::new(8, 1), Hardware::preset("h100x8").unwrap(), Strategy::Memo);
    let report = plan(&r).unwrap();
    assert!(!report.fits());
    let advice = remedies(&r, &report);
    let device = advice.iter().find(|x| x.starts_with("device memory")).unwrap();
    assert!(device.contains("more nodes with --zero 1"), "{device}");
    assert!(advice.iter().any(|x| x.starts_with("fewer tokens will not do")), "{advice:?}");
    let on =
        |d: u64| PlanRequest { parallel: Parallelism::new(8, d), nodes: Nodes { count: d, ..r.nodes }, ..r.clone() };
    let (two, four) = (on(2), on(4));
    let report = plan(&two).unwrap();
    let device = remedies(&two, &report).into_iter().find(|x| x.starts_with("device memory")).unwrap();
    assert!(!device.contains("--zero 1 (shards"), "{device}");
    let report = plan(&four).unwrap();
    assert!(!report.fits());
    let device = remedies(&four, &report).into_iter().find(|x| x.starts_with("device memory")).unwrap();
    assert!(device.contains("--zero 1 (shards the optimizer state over the d = 4"), "{device}");
    let sharded = plan(&PlanRequest { sharding: OptimizerSharding::OptimizerState, ..four }).unwrap();
    assert!(sharded.fits(), "{:?}", sharded.misfit);
}

/// A context-parallel rank's plan is its s / c tokens' program with the ring attention in it
/// (`spec/context-parallel.md`): no `attention` launch, the ring's transients (c = 2: one K and
/// one V ring buffer of the rank's rows per ring, the f32 accumulators), one program per context
/// rank; the step adds the ring's exposed seconds; ZeRO shards over d x c; and it fits where
/// c = 1 does not.
#[test]
fn context_parallel_plans_hold_the_ranks_tokens_and_the_ring_buffers() {
    use crate::model::{Nodes, OptimizerSharding};
    use crate::plan::{Action, Op};
    let seq = 32 << 10;
    let base = request(3, seq, "h100x8", Strategy::Memo);
    let mut r = base.clone();
    r.parallel = Parallelism::new(4, 1).with_context(2);
    r.sharding = OptimizerSharding::OptimizerState;
    let report = plan(&r).unwrap();
    let kv = cost::ring_kv_bytes(&r.model, &r.parallel).unwrap();
    let head_dim = r.model.hidden / r.model.heads;
    assert_eq!(kv, 2 * (seq / 2) * (r.model.kv_heads / 4) * head_dim * 2, "K and V of the rank's s / c tokens");
    let bytes_of = |role: TensorRole| {
        let found: Vec<u64> =
            report.plan.buffers.iter().filter(|b| b.role == role).map(|b| b.bytes().unwrap()).collect();
        found
    };
    // Per layer: one forward ring and one backward ring (memo recomputes no attention), each with
    // one K and one V ring buffer at c = 2; the backward's two travelling f32 dK accumulators.
    assert_eq!(bytes_of(TensorRole::RingKey), alloc::vec![kv / 2; 6]);
    assert_eq!(bytes_of(TensorRole::KeyGradientAccumulator), alloc::vec![kv; 6]);
    let count = |op: Op| {
        let launches = report.plan.instructions.iter().filter(|i| matches!(&i.action, Action::Launch(l) if l.op == op));
        launches.count()
    };
    assert_eq!((count(Op::Attention), count(Op::AttentionBackward)), (0, 0));
    assert_eq!((count(Op::AttentionRingInit), count(Op::ToBf16)), (3, 9));
    // Forward: one exchange of K and V per ring; backward: one of K and V, two of dK and dV.
    assert_eq!(count(Op::RingExchange), 3 * 2 + 3 * 6);
    // One program per context rank: context rank 1's at global rank 1 * t.
    assert_eq!(report.plan.rank_programs.len(), 1);
    assert_eq!(report.plan.rank_programs[0].rank, 4);
    assert_eq!(report.plan.provenance.parallel.context, 2);
    // The rank's rows: the layer input holds b s / (c t) rows of h.
    let input = report.plan.buffers.iter().find(|b| b.role == TensorRole::LayerInput).unwrap();
    assert_eq!(input.rows, seq / 2 / 4);
    // ZeRO 1 over d x c = 2 ranks.
    assert_eq!(report.data_parallel.ranks, 2);
    assert!(report.data_parallel.saved_bytes > 0);
    // Inside one node on NVLink; the step is the timeline, the ring's exposed part and the
    // data-parallel collectives.
    let exposed = report.context_parallel.exposed_s();
    let expected = report.timeline.step_time_s + exposed + report.data_parallel.time.total_s();
    assert!((report.step_time_s() - expected).abs() < 1e-12);
    // On two nodes with the network 1000 times slower than it is, the ring is exposed.
    let mut far = r.clone();
    far.parallel = Parallelism::new(8, 1).with_context(2);
    far.nodes = Nodes { count: 2, network: Interconnect { bytes_per_s: 50_000_000, latency_ns: 8_000 } };
    let slow = plan(&far).unwrap();
    assert!(slow.context_parallel.exposed_s() > 0.0);
    assert!(slow.step_time_s() > slow.timeline.step_time_s + slow.context_parallel.exposed_s() - 1e-12);
    // Full recompute reruns attention, and with it the ring, in the layers it recomputes.
    let rerun = plan(&PlanRequest { strategy: Strategy::FullRecompute, ..far.clone() }).unwrap();
    assert!(rerun.context_parallel.forward_exposed_s > slow.context_parallel.forward_exposed_s);
    assert_eq!(rerun.context_parallel.backward_exposed_s, slow.context_parallel.backward_exposed_s);
    // A layout that does not fit its nodes is refused before planning.
    let mut bad = r.clone();
    bad.parallel = Parallelism::new(8, 1).with_context(2);
    assert!(matches!(plan(&bad), Err(PlanError::Model(ModelError::RanksDoNotFillNodes { context: 2, .. }))));
}

/// c > 1 ranks pass K/V over the node's links: without a known link the ring cannot be timed, so
/// the request is refused (as t > 1 is), naming the field and the flag, never timed as free.
#[test]
fn a_context_parallel_ring_without_a_known_link_is_refused() {
    let mut r = request(2, 4096, "h100x8", Strategy::Memo);
    r.parallel = Parallelism::new(1, 1).with_context(2);
    r.interconnect = Interconnect::UNKNOWN;
    let error = plan(&r).unwrap_err();
    assert_eq!(error, PlanError::Model(ModelError::Zero { field: "interconnect_bytes_per_s" }));
    let message = format!("{error}");
    assert!(message.contains("c > 1") && message.contains("--interconnect-bandwidth"), "{message}");
    r.parallel = Parallelism::new(1, 1);
    assert!(plan(&r).is_ok(), "one GPU needs no link");
}

/// Past one node's memory the remedies offer the least context parallelism that fits, turning
/// data-parallel ranks into context-parallel ones where d allows; and that offer plans and fits.
#[test]
fn the_remedies_offer_context_parallelism_that_fits() {
    use crate::model::Nodes;
    let mut r = request(3, 4 << 20, "h100x8", Strategy::Memo);
    r.parallel = Parallelism::new(8, 2);
    r.nodes = Nodes { count: 2, ..r.nodes };
    let report = plan(&r).unwrap();
    assert!(!report.fits());
    let remedies = remedies(&r, &report);
    let line = remedies.iter().find(|l| l.starts_with("device memory")).unwrap();
    let offer = line.split("context parallelism (").nth(1).unwrap_or_else(|| panic!("{line}"));
    let numbers: Vec<u64> = offer
        .split(|ch: char| !ch.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .take(3)
        .map(|w| w.parse().unwrap())
        .collect();
    let (c, d, count) = (numbers[0], numbers[1], numbers[2]);
    let offered = PlanRequest {
        parallel: Parallelism::new(8, d).with_context(c),
        nodes: Nodes { count, ..r.nodes },
        ..r.clone()
    };
    assert!(plan(&offered).unwrap().fits(), "{line}");
    // The least: half that c does not fit.
    if c > 2 {
        let half = PlanRequest { parallel: Parallelism::new(8, d * 2).with_context(c / 2), ..offered.clone() };
        assert!(!plan(&half).map(|p| p.fits()).unwrap_or(false), "{line}");
    }
}

/// Plans with c = 2 and c = 4 (with t = 1 and t = 2) for every strategy pass the checker: every
/// context rank's program, the cross-rank rule and the ring's pairs; and they encode and decode
/// back to themselves.
#[test]
fn context_parallel_plans_pass_the_checker_for_every_strategy() {
    use crate::check::check_plan;
    use crate::plan::{Action, Op, Plan};
    for (t, c) in [(1, 2), (1, 4), (2, 2), (2, 4)] {
        for strategy in Strategy::ALL {
            let mut r = request(4, 1024, "h100x8", strategy);
            r.model = ModelConfig::new("tiny", 4, 64, 4, 1024, 2);
            r.parallel = Parallelism::new(t, 1).with_context(c);
            let report = plan(&r).unwrap_or_else(|e| panic!("t {t} c {c} {}: {e}", strategy.name()));
            let p = &report.plan;
            if let Err(violations) = check_plan(p) {
                panic!("t {t} c {c} {}: {} violations, first: {}", strategy.name(), violations.len(), violations[0]);
            }
            assert_eq!(p.rank_programs.len() as u64, c - 1);
            let exchanges = |program: &[crate::plan::Instruction]| {
                program.iter().filter(|i| matches!(&i.action, Action::Launch(l) if l.op == Op::RingExchange)).count()
            };
            // Forward c - 1 exchanges of K and V; backward c - 1 of K and V and c of dK and dV.
            let rings = (p.provenance.model.layers as usize, if strategy == Strategy::FullRecompute { 2 } else { 1 });
            let per_layer = rings.1 * 2 * (c as usize - 1) + 2 * (c as usize - 1) + 2 * c as usize;
            assert_eq!(exchanges(&p.instructions), rings.0 * per_layer, "t {t} c {c} {}", strategy.name());
            // Context ranks' programs differ (their blocks' rows), and only there.
            let other = &p.rank_programs[0].instructions;
            assert_eq!(other.len(), p.instructions.len());
            assert_ne!(other, &p.instructions);
            for (mine, theirs) in p.instructions.iter().zip(other) {
                if mine != theirs {
                    let Action::Launch(l) = &mine.action else { panic!("{mine:?}") };
                    assert!(matches!(l.op, Op::AttentionBlock | Op::AttentionBlockBackward), "{:?}", l.op);
                }
            }
            // Every gradient and the loss summed over the data group once, before the norm.
            let position =
                |op: Op| p.instructions.iter().position(|i| matches!(&i.action, Action::Launch(l) if l.op == op));
            let reduced: Vec<crate::plan::BufferId> = p
                .instructions
                .iter()
                .filter_map(|i| match &i.action {
                    Action::Launch(l) if l.op == Op::DataAllReduceSumBf16 => Some(l.args[0].region.buffer),
                    _ => None,
                })
                .collect();
            let gradients = p.buffers.iter().filter(|b| b.kind == crate::plan::BufferKind::Gradient).count();
            assert_eq!(reduced.len(), gradients);
            assert!(position(Op::DataAllReduceSumF32).unwrap() < position(Op::GradNormSquared).unwrap());
            let decoded = Plan::decode(&p.encode()).unwrap();
            assert_eq!(&decoded, p);
        }
    }
}

/// The ring's blocks at c = 2 (`spec/context-parallel.md`, "The ring"): at step 1 context rank 0
/// holds rank 1's K/V (a later source: its second chunk's queries attend all of it) and rank 1
/// holds rank 0's (an earlier one: all its queries attend its first chunk); the diagonal blocks
/// of step 0 are causal on both.
#[test]
fn the_ring_blocks_follow_the_load_balanced_chunks() {
    use crate::plan::{Action, Op};
    let mut r = request(2, 64, "h100x8", Strategy::KeepAll);
    r.model = ModelConfig::new("tiny", 2, 64, 4, 64, 1);
    r.parallel = Parallelism::new(1, 1).with_context(2);
    let report = plan(&r).unwrap();
    // Per rank: the forward blocks of layer 0 as (op, q rows, k rows).
    type Block = (Op, (u64, u64), (u64, u64));
    let blocks = |program: &[crate::plan::Instruction]| {
        let found: Vec<Block> = program
            .iter()
            .filter_map(|i| match &i.action {
                Action::Launch(l)
                    if l.layer == Some(0) && matches!(l.op, Op::AttentionBlock | Op::AttentionBlockCausal) =>
                {
                    let (q, k) = (l.args[0].region, l.args[1].region);
                    Some((l.op, (q.start, q.end), (k.start, k.end)))
                }
                _ => None,
            })
            .collect();
        found
    };
    let (causal, full) = (Op::AttentionBlockCausal, Op::AttentionBlock);
    // s / c = 32 rows per rank, chunks of 16.
    let step0 = [(causal, (0, 16), (0, 16)), (full, (16, 32), (0, 16)), (causal, (16, 32), (16, 32))];
    let mut rank0 = step0.to_vec();
    rank0.push((full, (16, 32), (0, 32)));
    let mut rank1 = step0.to_vec();
    rank1.push((full, (0, 32), (0, 16)));
    assert_eq!(blocks(&report.plan.instructions), rank0);
    assert_eq!(blocks(report.plan.program(1)), rank1);
}
