use alloc::vec::Vec;

use super::*;
use crate::model::{Hardware, ModelConfig, Parallelism};
use crate::plan::{Action, BufferKind, Strategy};
use crate::planner::{self, PlanRequest};
use crate::swap::AlphaBound;

fn tiny(layers: u32, seq: u64) -> ModelConfig {
    ModelConfig::new("tiny", layers, 64, 4, seq, 1)
}

fn request(model: ModelConfig, tensor: u64, machine: &str, strategy: Strategy) -> PlanRequest {
    PlanRequest::new(model, Parallelism::new(tensor, 1), Hardware::preset(machine).unwrap(), strategy)
}

/// docs/technique.md section 3: 7B at 1M tokens on 8 A800 (2 TiB host), t = 8.
#[test]
fn seven_b_at_one_million_tokens_matches_the_paper_setting() {
    let model = ModelConfig::preset("7b", 1 << 20, 1).unwrap();
    let set = model.skeletal_set(&Parallelism::new(8, 1)).unwrap();
    let bsh_16 = 16u64 << 30;
    // 16 bsh elements in bf16 per GPU = 16 GiB, plus the log-sum-exp (b * heads * s / t fp32).
    assert_eq!(set.total_bytes, bsh_16 + (1u64 << 20) * 32 / 8 * 4);
    let reports: Vec<_> =
        Strategy::ALL.into_iter().map(|s| planner::plan(&request(model.clone(), 8, "a800x8", s)).unwrap()).collect();
    let by = |s: Strategy| reports.iter().find(|r| r.plan.provenance.strategy == s).unwrap();
    let memo = by(Strategy::Memo);
    assert_eq!(memo.plan.provenance.alpha_bound, AlphaBound::HostMemory);
    assert!((0.46..0.48).contains(&memo.plan.provenance.alpha), "alpha {}", memo.plan.provenance.alpha);
    assert!(memo.fits(), "{:?}", memo.misfit);
    assert!(memo.plan.totals.arena_bytes <= 80 << 30);
    // The two rounding buffers hold one layer's skeletal set each.
    assert_eq!(memo.plan.totals.rounding_buffer_bytes, 2 * set.total_bytes);
    assert!(!by(Strategy::KeepAll).fits());
    let full_swap = by(Strategy::FullSwap);
    assert!(!full_swap.fits());
    assert!(full_swap.misfit.as_ref().unwrap().host_excess_bytes > 0);
}

/// Every launch has its op's arguments, every row range lies inside its buffer, every wait
/// follows its record, and every buffer is touched.
#[test]
fn schedules_are_well_formed_for_every_strategy_and_layout() {
    for strategy in Strategy::ALL {
        for tensor in [1, 2] {
            for alpha in [0, ALPHA_ONE / 3, ALPHA_ONE] {
                let model = tiny(5, 96);
                let options = ScheduleOptions { strategy, alpha_fixed: alpha };
                let schedule = build(&model, &Parallelism::new(tensor, 1), &options).unwrap();
                let mut touched = alloc::vec![false; schedule.buffers.len()];
                let mut recorded = alloc::vec![false; schedule.events as usize];
                let mut check = |region: &Region| {
                    let buffer = schedule.buffers[region.buffer.index()];
                    assert!(region.start <= region.end && region.end <= buffer.rows, "{buffer} {region:?}");
                    touched[region.buffer.index()] = true;
                };
                for instruction in &schedule.instructions {
                    match &instruction.action {
                        Action::Launch(launch) => {
                            assert_eq!(instruction.stream, launch.op.stream());
                            assert_eq!(launch.args.len(), launch.op.signature().len());
                            launch.args.iter().for_each(|a| check(&a.region));
                        }
                        Action::Copy { src, dst, .. } => {
                            check(src);
                            check(dst);
                        }
                        Action::Record(e) => recorded[e.0 as usize] = true,
                        Action::Wait(e) => assert!(recorded[e.0 as usize], "wait before record"),
                    }
                }
                let untouched: Vec<_> = touched.iter().enumerate().filter(|(_, t)| !**t).collect();
                assert!(untouched.is_empty(), "{strategy:?} t={tensor}: untouched {untouched:?}");
            }
        }
    }
}

/// The compute stream waits for a rounding buffer's swap-out before its next occupant is
/// written, and the swap-in waits for the backward that last read it.
#[test]
fn memo_waits_for_swap_out_before_reusing_a_rounding_buffer() {
    let model = tiny(6, 64);
    let options = ScheduleOptions { strategy: Strategy::Memo, alpha_fixed: ALPHA_ONE / 2 };
    let schedule = build(&model, &Parallelism::single(), &options).unwrap();
    let records_on = |stream: Stream| {
        schedule
            .instructions
            .iter()
            .filter_map(|i| match i.action {
                Action::Record(e) if i.stream == stream => Some(e),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let compute_waits: Vec<EventId> = schedule
        .instructions
        .iter()
        .filter_map(|i| match i.action {
            Action::Wait(e) if i.stream == Stream::Compute => Some(e),
            _ => None,
        })
        .collect();
    // Layers 0..3 swap (the last two never do): four swap-outs, each waited for by compute
    // before layer l+2 is written, and four swap-ins, each waited for before the backward.
    let swap_outs = records_on(Stream::DeviceToHost);
    let swap_ins = records_on(Stream::HostToDevice);
    assert_eq!(swap_outs.len(), 4);
    assert_eq!(swap_ins.len(), 4);
    for event in swap_outs.iter().chain(&swap_ins) {
        assert!(compute_waits.contains(event), "event {event:?} is never waited for by compute");
    }
    // Half the rows of each token-split tensor are swapped, the rest recomputed.
    assert_eq!(schedule.swapped_rows, 32);
    let recompute_rows: Vec<_> =
        schedule.buffers.iter().filter(|b| b.role == TensorRole::RecomputedProjectionOutput).map(|b| b.rows).collect();
    assert_eq!(recompute_rows, [32; 4]);
}

#[test]
fn the_same_request_gives_the_same_plan() {
    for strategy in Strategy::ALL {
        let r = request(tiny(4, 128), 2, "h100x8", strategy);
        assert_eq!(planner::plan(&r).unwrap().plan, planner::plan(&r).unwrap().plan);
    }
}

/// The two placement levels reach their lower bounds for every preset model at 32K, 256K and
/// 1M tokens (t = 8, where every preset's heads divide).
#[test]
fn both_levels_reach_their_lower_bound_for_every_preset() {
    for name in ["7b", "13b", "30b", "65b"] {
        for seq in [32u64 << 10, 256 << 10, 1 << 20] {
            for strategy in [Strategy::Memo, Strategy::FullRecompute, Strategy::FullSwap] {
                let model = ModelConfig::preset(name, seq, 1).unwrap();
                let report = planner::plan(&request(model, 8, "a800x8", strategy)).unwrap();
                let p = &report.plan.provenance;
                for level in [p.level1_forward, p.level1_backward, p.level2] {
                    assert_eq!(level.peak_bytes, level.lower_bound_bytes, "{name} {seq} {strategy:?} {level:?}");
                }
                // The whole arena is at the step's live-bytes bound but for the 256-byte padding of
                // buffers whose size is not a multiple of it (the scalars, small biases).
                let t = report.plan.totals;
                assert!(t.arena_bytes >= t.arena_lower_bound_bytes);
                assert!(t.arena_bytes - t.arena_lower_bound_bytes < padding(&report.plan), "{name} {seq} {strategy:?}");
            }
        }
    }
}

/// Bytes lost to rounding device buffers up to the placement alignment.
fn padding(plan: &crate::plan::Plan) -> u64 {
    let align = crate::bilevel::ALIGNMENT;
    plan.buffers.iter().map(|b| b.bytes().unwrap().div_ceil(align) * align - b.bytes().unwrap()).sum::<u64>() + 1
}

/// Keep-all's arena is above the whole step's live-bytes bound by less than 0.5%: each level-1
/// block reserves its peak over its whole span (the price of reusing one layer's offsets).
#[test]
fn keep_all_pays_only_the_block_reservation() {
    let model = ModelConfig::preset("7b", 256 << 10, 1).unwrap();
    let report = planner::plan(&request(model, 8, "a800x8", Strategy::KeepAll)).unwrap();
    let p = &report.plan.provenance;
    for level in [p.level1_forward, p.level1_backward, p.level2] {
        assert_eq!(level.peak_bytes, level.lower_bound_bytes);
    }
    let t = report.plan.totals;
    assert!(t.arena_bytes > t.arena_lower_bound_bytes);
    assert!((t.arena_bytes - t.arena_lower_bound_bytes) * 200 < t.arena_lower_bound_bytes);
}

/// docs/technique.md section 3 and the issue: memo fits a longer sequence than full recompute, which
/// fits a longer one than keep-all (7B, 8 A800, t = 8).
#[test]
fn max_sequence_orders_memo_above_full_recompute_above_keep_all() {
    let model = ModelConfig::preset("7b", 1024, 1).unwrap();
    let longest = |strategy| {
        let r = request(model.clone(), 8, "a800x8", strategy);
        planner::max_seq(&r, 64 << 10, 8 << 20).unwrap().seq_len.unwrap_or(0)
    };
    let (memo, recompute, keep) =
        (longest(Strategy::Memo), longest(Strategy::FullRecompute), longest(Strategy::KeepAll));
    assert!(memo > recompute && recompute > keep && keep > 0, "{memo} {recompute} {keep}");
}

#[test]
fn host_slots_hold_what_the_swap_fraction_says() {
    let model = tiny(6, 256);
    let alpha_fixed = ALPHA_ONE / 4;
    let schedule =
        build(&model, &Parallelism::single(), &ScheduleOptions { strategy: Strategy::Memo, alpha_fixed }).unwrap();
    let set = model.skeletal_set(&Parallelism::single()).unwrap();
    let host: u64 =
        schedule.buffers.iter().filter(|b| b.kind == BufferKind::HostSlot).map(|b| b.bytes().unwrap()).sum();
    // Four swapped layers: always-swapped tensors whole, a quarter of the token-split ones.
    assert_eq!(host, 4 * (set.always_swapped_bytes() + set.others_bytes / 4));
}

#[test]
fn a_forced_alpha_needs_the_memo_strategy() {
    let mut r = request(tiny(4, 64), 1, "a800x8", Strategy::KeepAll);
    r.forced_alpha = Some(0.5);
    assert!(matches!(planner::plan(&r), Err(planner::PlanError::AlphaWithoutMemo { .. })));
}

/// The independent checker accepts every plan the planner makes: random small models, layouts,
/// machines, strategies and swap fractions.
#[test]
fn the_checker_accepts_every_plan_the_planner_makes() {
    let mut rng = crate::generate::SplitMix64::new(7);
    let machines = ["a800x8", "h100x8", "h200x1", "mi300x8"];
    for case in 0..120 {
        let tensor = [1u64, 2, 4][rng.below(3) as usize];
        let heads = tensor * (1 + rng.below(3));
        let hidden = heads * 8 * (1 + rng.below(3));
        let seq = tensor * (1 + rng.below(40));
        let layers = 1 + rng.below(6) as u32;
        let mut model = ModelConfig::new("random", layers, hidden, heads, seq, 1 + rng.below(2));
        model.vocab = 1 + rng.below(300);
        let strategy = Strategy::ALL[case % 4];
        let mut r = request(model, tensor, machines[rng.below(4) as usize], strategy);
        if strategy == Strategy::Memo && rng.below(2) == 0 {
            r.forced_alpha = Some(rng.below(101) as f64 / 100.0);
        }
        let report = planner::plan(&r).unwrap_or_else(|e| panic!("case {case} {r:?}: {e}"));
        if let Err(violations) = crate::check::check_plan(&report.plan) {
            panic!("case {case} {r:?}: {} violations, first {}", violations.len(), violations[0]);
        }
    }
}

/// The paper's setting passes the checker under every strategy.
#[test]
fn the_checker_accepts_the_paper_setting() {
    for strategy in Strategy::ALL {
        let model = ModelConfig::preset("7b", 1 << 20, 1).unwrap();
        let report = planner::plan(&request(model, 8, "a800x8", strategy)).unwrap();
        assert_eq!(crate::check::check_plan(&report.plan), Ok(()), "{strategy:?}");
    }
}

/// Every launch of a schedule passes the op table's shape rules (`plan::shapes`, which every
/// backend checks before it runs a launch) on every rank of the group (`t` = 1, 2, 4, with a
/// vocabulary `t` does not divide), and each matrix product's FLOPs in the plan are the op
/// table's count for its shapes.
#[test]
fn every_launch_passes_the_op_tables_shape_rules_with_its_flops() {
    for (strategy, tensor) in Strategy::ALL.into_iter().flat_map(|s| [(s, 1u64), (s, 2), (s, 4)]) {
        for rank in 0..tensor {
            let mut model = tiny(3, 96);
            model.vocab = 101;
            let options = ScheduleOptions { strategy, alpha_fixed: ALPHA_ONE / 3 };
            let schedule = build(&model, &Parallelism::new(tensor, 1), &options).unwrap();
            let (_, products) = check_launch_shapes(&model, tensor, rank, &schedule);
            assert!(products > 10, "{products} matrix products ({}, t = {tensor})", strategy.name());
        }
    }
}

/// With `t > 1`, every row of a head-sharded token-split tensor that the backward reads holds the
/// token it held in the forward: its swapped rows are `k*r + [0, a)` (one host slot each, whose
/// copies name those rows) and its recomputed rows `k*r + [a, r)`, each written from share `k`
/// of the gathered input (the rows rank `k` holds); together they cover every row once.
#[test]
fn head_sharded_rows_keep_their_tokens_at_t_above_1() {
    use crate::plan::Launch;
    for tensor in [2u64, 4] {
        let model = tiny(5, 96);
        let alpha_fixed = ALPHA_ONE / 3;
        let schedule =
            build(&model, &Parallelism::new(tensor, 1), &ScheduleOptions { strategy: Strategy::Memo, alpha_fixed })
                .unwrap();
        let r = 96 / tensor;
        let a = swapped_rows(r, alpha_fixed);
        assert!(0 < a && a < r);
        for role in
            [TensorRole::Query, TensorRole::Key, TensorRole::Value, TensorRole::Fc1Output, TensorRole::GeluOutput]
        {
            // Layer 0's host slots of this tensor: one per rank segment.
            let mut slots: Vec<(u64, u64)> = schedule
                .buffers
                .iter()
                .filter(|b| b.kind == BufferKind::HostSlot && b.role == role && b.layer == Some(0))
                .map(|b| (b.first_row, b.rows))
                .collect();
            slots.sort_unstable();
            let expected: Vec<(u64, u64)> = (0..tensor).map(|k| (k * r, a)).collect();
            assert_eq!(slots, expected, "t = {tensor} {role:?}");
            // The recompute of layer 0 writes the other rows of every segment, once each.
            let rounding = schedule
                .buffers
                .iter()
                .position(|b| b.kind == BufferKind::RoundingBuffer && b.role == role && b.slot == 0)
                .unwrap();
            let backward_start = schedule
                .instructions
                .iter()
                .position(|i| matches!(&i.action, Action::Launch(Launch { op: Op::LayerNormBackward, .. })))
                .unwrap();
            let mut written: Vec<(u64, u64)> = Vec::new();
            let mut layer0_recompute = Vec::new();
            for (index, instruction) in schedule.instructions.iter().enumerate().skip(backward_start) {
                let Action::Launch(launch) = &instruction.action else { continue };
                if launch.layer != Some(0) || !matches!(launch.op, Op::Linear | Op::Gelu) {
                    continue;
                }
                let out = launch.args.last().unwrap().region;
                if out.buffer.index() == rounding {
                    written.push((out.start, out.end));
                    layer0_recompute.push((index, launch.args[0].region));
                }
            }
            written.sort_unstable();
            let expected: Vec<(u64, u64)> = (0..tensor).map(|k| (k * r + a, (k + 1) * r)).collect();
            assert_eq!(written, expected, "t = {tensor} {role:?}: recomputed rows");
            // The linear layers read share k of the gathered input for segment k.
            if role != TensorRole::GeluOutput {
                for (k, (_, input)) in layer0_recompute.iter().enumerate() {
                    let share = r - a;
                    assert_eq!((input.start, input.end), (k as u64 * share, (k as u64 + 1) * share), "{role:?}");
                }
            }
        }
    }
}

/// With `t > 1` the row-parallel products write a bias-free partial sum, reduce-scatter it, and
/// add the bias once after; every collective runs on the collective stream between a compute
/// Record it waits for and a Record compute waits for. With `t = 1` there is no collective and no
/// split op.
#[test]
fn t_above_1_adds_the_bias_after_the_reduce_scatter_and_brackets_collectives() {
    for strategy in Strategy::ALL {
        let model = tiny(4, 64);
        let options = ScheduleOptions { strategy, alpha_fixed: ALPHA_ONE / 2 };
        let single = build(&model, &Parallelism::single(), &options).unwrap();
        let split_ops =
            [Op::LinearNoBias, Op::AddBias, Op::CrossEntropyMax, Op::CrossEntropySums, Op::CrossEntropyFinish];
        for i in &single.instructions {
            assert_ne!(i.stream, Stream::Collective);
            if let Action::Launch(l) = &i.action {
                assert!(!l.op.is_collective() && !split_ops.contains(&l.op), "{:?} at t = 1", l.op);
            }
        }
        let schedule = build(&model, &Parallelism::new(2, 1), &options).unwrap();
        let ins = &schedule.instructions;
        let mut adds = 0;
        for (index, i) in ins.iter().enumerate() {
            let Action::Launch(l) = &i.action else { continue };
            if l.op == Op::Linear {
                let out = schedule.buffers[l.args[3].region.buffer.index()];
                assert_ne!(out.role, TensorRole::PartialSum, "a biased linear into a partial sum");
            }
            if l.op.is_collective() {
                assert_eq!(i.stream, Stream::Collective);
                let (Action::Record(before), Action::Wait(waited)) = (&ins[index - 2].action, &ins[index - 1].action)
                else {
                    panic!("collective {index} is not after a record and a wait")
                };
                assert_eq!(
                    (ins[index - 2].stream, ins[index - 1].stream, before),
                    (Stream::Compute, Stream::Collective, waited)
                );
                let (Action::Record(after), Action::Wait(resumed)) = (&ins[index + 1].action, &ins[index + 2].action)
                else {
                    panic!("collective {index} is not before a record and a wait")
                };
                assert_eq!(
                    (ins[index + 1].stream, ins[index + 2].stream, after),
                    (Stream::Collective, Stream::Compute, resumed)
                );
            }
            if l.op == Op::AddBias {
                // The reduce-scatter into the same rows is the launch before (its events between).
                let Action::Launch(scatter) = &ins[index - 3].action else { panic!("no launch before add_bias") };
                assert_eq!(scatter.op, Op::ReduceScatter);
                assert_eq!(scatter.args[1].region, l.args[1].region);
                let bias = schedule.buffers[l.args[0].region.buffer.index()];
                assert!(matches!(bias.role, TensorRole::ProjectionBias | TensorRole::Fc2Bias), "{bias}");
                adds += 1;
            }
        }
        // Per layer: the projection and FC2 in the forward, the projection again in a recompute.
        assert!(adds >= 2 * 4, "{strategy:?}: {adds} bias adds");
    }
}

/// A tiny Llama-shaped model: 3 layers, h 96, 4 query heads and 2 key/value heads of 24, SwiGLU
/// of 160, RMSNorm, no biases, untied classifier, a vocabulary of 101 (which 2 and 4 do not
/// divide), 96 tokens.
fn tiny_llama() -> ModelConfig {
    let mut model = ModelConfig::new("tiny-llama", 3, 96, 4, 96, 1);
    model.kv_heads = 2;
    model.ffn_hidden = 160;
    model.vocab = 101;
    model.architecture = crate::model::Architecture::llama(10_000.0, 1e-5);
    model
}

/// What every launch of `schedule` must pass for `model` at `t` on `rank`: the op table's shape
/// rules with the context a backend gives it (this rank's query heads, the key/value heads its K
/// and V hold, whether they are replicated, the model's rotary base and epsilon), each matrix
/// product's FLOPs the op table's count; returns the ops used and the matrix products.
fn check_launch_shapes(model: &ModelConfig, tensor: u64, rank: u64, schedule: &Schedule) -> (Vec<Op>, usize) {
    use crate::plan::shapes::{self, ArgShape, ShapeContext};
    let ctx = ShapeContext::for_model(model, rank, tensor);
    let (mut ops, mut products) = (Vec::new(), 0);
    for instruction in &schedule.instructions {
        let Action::Launch(launch) = &instruction.action else { continue };
        let args: Vec<ArgShape> = launch
            .args
            .iter()
            .map(|arg| {
                let buffer = schedule.buffers[arg.region.buffer.index()];
                ArgShape {
                    first_row: arg.region.start,
                    rows: arg.region.end - arg.region.start,
                    row_bytes: buffer.row_bytes,
                }
            })
            .collect();
        let shape = shapes::check(launch.op, &args, &ctx)
            .unwrap_or_else(|e| panic!("{} ({}, t = {tensor}, rank {rank}): {e}", launch.op.name(), model.name));
        if shape.matmul_flops() > 0 {
            assert_eq!(launch.flops, shape.matmul_flops(), "{}", launch.op.name());
            products += 1;
        }
        if !ops.contains(&launch.op) {
            ops.push(launch.op);
        }
    }
    (ops, products)
}

/// The Llama family's layer in the schedule: at t = 1, 2 and 4 (t = 4 > kv_heads = 2: K and V
/// replicated) under every strategy, the schedule builds, every launch passes the op table's
/// shape rules on every rank, its ops are RMSNorm, SwiGLU and bias-free products (no LayerNorm,
/// GeLU or biased linear), the untied classifier is a parameter of its own, and the planner's
/// plan passes the checker.
#[test]
fn llama_schedules_use_its_ops_and_pass_the_shape_rules_and_the_checker() {
    let model = tiny_llama();
    for strategy in Strategy::ALL {
        for tensor in [1u64, 2, 4] {
            let options = ScheduleOptions { strategy, alpha_fixed: ALPHA_ONE / 3 };
            let schedule = build(&model, &Parallelism::new(tensor, 1), &options)
                .unwrap_or_else(|e| panic!("{strategy:?} t = {tensor}: {e}"));
            let mut ops = Vec::new();
            for rank in 0..tensor {
                ops = check_launch_shapes(&model, tensor, rank, &schedule).0;
            }
            for op in [Op::RmsNorm, Op::RmsNormBackward, Op::Swiglu, Op::SwigluBackward, Op::LinearNoBias] {
                assert!(ops.contains(&op), "{strategy:?} t = {tensor}: no {op:?}");
            }
            assert!(ops.contains(&Op::LinearBackwardWeightNoBias), "{strategy:?} t = {tensor}");
            for op in [Op::LayerNorm, Op::LayerNormBackward, Op::Gelu, Op::GeluBackward, Op::Linear, Op::AddBias] {
                assert!(!ops.contains(&op), "{strategy:?} t = {tensor}: {op:?} in a Llama schedule");
            }
            assert!(!ops.contains(&Op::LinearBackwardWeight), "{strategy:?} t = {tensor}: a bias gradient");
            let classifier: Vec<_> = schedule
                .buffers
                .iter()
                .filter(|b| b.role == TensorRole::ClassifierWeight && b.kind == BufferKind::Parameter)
                .collect();
            assert_eq!(classifier.len(), 1, "{strategy:?} t = {tensor}");
            assert_eq!((classifier[0].rows, classifier[0].row_bytes), (101u64.div_ceil(tensor), 96 * 2));
            for role in [TensorRole::QueryBias, TensorRole::KeyBias, TensorRole::NormShift1, TensorRole::FinalNormShift]
            {
                assert!(schedule.buffers.iter().all(|b| b.role != role), "{strategy:?} t = {tensor}: {role:?}");
            }
            let report = planner::plan(&request(model.clone(), tensor, "h100x8", strategy))
                .unwrap_or_else(|e| panic!("{strategy:?} t = {tensor}: {e}"));
            if let Err(violations) = crate::check::check_plan(&report.plan) {
                panic!("{strategy:?} t = {tensor}: {} violations, first {}", violations.len(), violations[0]);
            }
        }
    }
}

/// A Qwen2-shaped variant (biases on Q, K and V only) at t = 4 > kv_heads = 2: the replicated K
/// and V biases' gradients are rows of one `ReplicatedBiasGradients` buffer that one all-reduce
/// sums over the ranks; the shape rules and the checker pass.
#[test]
fn qwen_replicated_kv_biases_are_all_reduced_once() {
    let mut model = tiny_llama();
    model.name = "tiny-qwen".into();
    model.architecture.biases = crate::model::Biases::QkvOnly;
    let tensor = 4;
    assert!(model.kv_replicated(tensor));
    for strategy in Strategy::ALL {
        let options = ScheduleOptions { strategy, alpha_fixed: ALPHA_ONE / 3 };
        let schedule = build(&model, &Parallelism::new(tensor, 1), &options).unwrap();
        for rank in 0..tensor {
            check_launch_shapes(&model, tensor, rank, &schedule);
        }
        let replicated: Vec<usize> = schedule
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.role == TensorRole::ReplicatedBiasGradients)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(replicated.len(), 1, "{strategy:?}");
        let buffer = schedule.buffers[replicated[0]];
        // K's and V's bias of each layer, a row of all kv_heads * head_dim = 48 elements each.
        assert_eq!((buffer.kind, buffer.rows, buffer.row_bytes), (BufferKind::Gradient, 3 * 2, 48 * 2));
        let reduces: Vec<_> = schedule
            .instructions
            .iter()
            .filter_map(|i| match &i.action {
                Action::Launch(l) if l.args.iter().any(|a| a.region.buffer.index() == replicated[0]) => Some(l),
                _ => None,
            })
            .filter(|l| l.op == Op::AllReduceSumBf16)
            .collect();
        assert_eq!(reduces.len(), 1, "{strategy:?}");
        assert_eq!((reduces[0].args[0].region.start, reduces[0].args[0].region.end), (0, 6));
        // The Q bias is sharded (a gradient of its own); K's and V's are replicated parameters.
        for role in [TensorRole::QueryBias, TensorRole::KeyBias, TensorRole::ValueBias] {
            assert!(schedule.buffers.iter().any(|b| b.role == role && b.kind == BufferKind::Parameter), "{role:?}");
        }
        let report = planner::plan(&request(model.clone(), tensor, "h100x8", strategy)).unwrap();
        if let Err(violations) = crate::check::check_plan(&report.plan) {
            panic!("{strategy:?}: {} violations, first {}", violations.len(), violations[0]);
        }
    }
}
