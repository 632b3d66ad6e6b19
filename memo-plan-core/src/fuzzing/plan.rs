//! Harness for the planner end to end: a random small model, layout, machine and strategy,
//! valid by construction, into [`planner::plan`], and the plan through the independent checker
//! and the byte format.
//!
//! What [`check`] asserts, for every request:
//! - the planner makes a plan (a valid request never gets an error);
//! - [`check_plan`] accepts it, and its totals agree with its report (`device_bytes` is the
//!   arena, the lower bound is at most the arena);
//! - `encode` then `decode` gives an equal plan, which re-encodes to the same bytes; the JSON view
//!   is written;
//! - determinism: planning the same request again gives the same report and the same bytes.
//!
//! The generator ([`request`]) is shared with [`super::plan_mutate`], which corrupts these plans.
//! Beyond the model shapes, it varies what decides α: a forced α for `memo`, a node's host memory
//! cut to a few bytes or KiB (α bound by host capacity, or below 0), a measured layer time (α
//! bound by the copy bandwidth), and the placement's node budget (a small one leaves the greedy
//! placement standing), so every path from α to placement reaches the checker.

use alloc::format;
use alloc::string::String;

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::check::check_plan;
use crate::model::{Architecture, Biases, Ffn, ModelConfig, Norm, Parallelism, HARDWARE_PRESETS};
use crate::plan::{Plan, Strategy};
use crate::planner::{self, PlanReport, PlanRequest, PLAN_BUDGET_NODES};

/// The shape of generated requests. One constant, so a reader sees every limit in one place.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Layers, `1..=max_layers`.
    pub max_layers: u32,
    /// The tensor-parallel degrees `t` a request may use.
    pub tensor_degrees: [u64; 3],
    /// Heads are `t * k` for `k` in `1..=max_heads_per_tensor`.
    pub max_heads_per_tensor: u64,
    /// Hidden is `heads * d` for an even head size `d` in `2..=max_head_size` (RoPE rotates
    /// pairs; the model's validation refuses odd ones).
    pub max_head_size: u64,
    /// The sequence is a multiple of `t` of at most this many tokens.
    pub max_seq_len: u64,
    /// Sequences per micro-batch, `1..=max_micro_batch`.
    pub max_micro_batch: u64,
    /// Vocabulary, `1..=max_vocab`.
    pub max_vocab: u64,
    /// Data-parallel degree, `1..=max_data`.
    pub max_data: u64,
    /// The context-parallel degrees `c` a request may use (1 three times in five).
    pub context_degrees: [u64; 5],
    /// A quarter of the requests get a node budget from `0..=small_budget_max`; the others
    /// [`PLAN_BUDGET_NODES`], the planner's default.
    pub small_budget_max: u64,
}

/// The limits of the plan and plan_mutate harnesses: models of at most a few hundred buffers and
/// instructions, planned in about a millisecond in a release build.
pub const OPTIONS: Options = Options {
    max_layers: 6,
    tensor_degrees: [1, 2, 4],
    max_heads_per_tensor: 4,
    max_head_size: 8,
    max_seq_len: 64,
    max_micro_batch: 2,
    max_vocab: 300,
    max_data: 4,
    context_degrees: [1, 1, 1, 2, 4],
    small_budget_max: 2_000,
};

/// One fuzz case: a valid planning request.
#[derive(Clone, Debug)]
pub struct PlanCase {
    /// What to plan.
    pub request: PlanRequest,
}

impl<'a> Arbitrary<'a> for PlanCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(PlanCase { request: request(u)? })
    }
}

/// A valid request within [`OPTIONS`]: every field the model, layout and machine validate is in
/// range, `t` divides the heads, the FFN width and the sequence, and the hidden size is a
/// multiple of the heads.
pub fn request(u: &mut Unstructured<'_>) -> Result<PlanRequest> {
    let tensor = *u.choose(&OPTIONS.tensor_degrees)?;
    let heads = tensor * u.int_in_range(1..=OPTIONS.max_heads_per_tensor)?;
    let hidden = heads * 2 * u.int_in_range(1..=OPTIONS.max_head_size / 2)?;
    let seq_len = tensor * u.int_in_range(1..=OPTIONS.max_seq_len / tensor)?;
    let layers = u.int_in_range(1..=OPTIONS.max_layers)?;
    let micro_batch = u.int_in_range(1..=OPTIONS.max_micro_batch)?;
    let mut model = ModelConfig::new("fuzz", layers, hidden, heads, seq_len, micro_batch);
    model.vocab = u.int_in_range(1..=OPTIONS.max_vocab)?;
    if u.ratio(1, 4)? {
        // Any FFN width `t` divides, not only 4h.
        model.ffn_hidden = tensor * u.int_in_range(1..=32)?;
    }
    if u.ratio(1, 2)? {
        // The Llama family's shapes: K/V heads dividing the heads and either dividing t or
        // divided by it (the replicated case), every FFN and norm kind, biases, tying.
        let kv: alloc::vec::Vec<u64> =
            (1..=heads).filter(|&g| heads % g == 0 && (g % tensor == 0 || tensor % g == 0)).collect();
        model.kv_heads = *u.choose(&kv)?;
        let ffn = *u.choose(&Ffn::ALL)?;
        let biases = *u.choose(&Biases::ALL)?;
        // SwiGLU with FFN biases is refused by validation: draw the others.
        let biases = if ffn == Ffn::SwiGlu && biases == Biases::All { Biases::QkvOnly } else { biases };
        model.architecture = Architecture {
            ffn,
            norm: *u.choose(&Norm::ALL)?,
            biases,
            tied_embeddings: u.arbitrary()?,
            ..Architecture::GPT
        };
    }
    let mut hardware = u.choose(HARDWARE_PRESETS)?.hardware();
    // Context parallelism where the machine has the links its ring needs (the node's, and the
    // network's for a group larger than a node): c ranks of two chunks each, so the sequence is
    // rounded up to a multiple of 2 c t.
    let context = *u.choose(&OPTIONS.context_degrees)?;
    let has_links = crate::model::Interconnect::for_hardware(&hardware).bytes_per_s > 0
        && crate::model::Interconnect::network_for_hardware(&hardware).bytes_per_s > 0;
    let context = if has_links { context } else { 1 };
    if context > 1 {
        model.seq_len = model.seq_len.next_multiple_of(2 * context * tensor);
    }
    // A layout the machine holds (`Nodes::validate_for`): the d x c x t ranks on part of one
    // node, or filling whole nodes, a c x t group inside one node or made of whole nodes; one
    // group alone wherever it is.
    let group = context * tensor;
    let (gpus_per_node, data) = (hardware.gpus_per_node, u.int_in_range(1..=OPTIONS.max_data)?);
    let (data, node_count) = if data * group <= gpus_per_node {
        (data, 1)
    } else if gpus_per_node % group == 0 {
        let per_node = gpus_per_node / group;
        let node_count = data.div_ceil(per_node);
        (node_count * per_node, node_count)
    } else if group % gpus_per_node == 0 && gpus_per_node % tensor == 0 {
        (data, data * group / gpus_per_node)
    } else {
        (1, 1)
    };
    // Where none of these holds the c x t group (it neither divides a node nor fills whole
    // ones), c = 1 on one node does.
    let parallel = Parallelism::new(tensor, data).with_context(context);
    let (parallel, node_count) = if context > 1 && data * group > gpus_per_node * node_count {
        (Parallelism::new(tensor, 1), 1)
    } else {
        (parallel, node_count)
    };
    if u.ratio(1, 4)? {
        // Little or no host memory: α bound by host capacity, or below 0 (input and attention
        // output are swapped all the same), and plans that miss the host.
        hardware.host_memory_per_node_bytes = u.int_in_range(0..=1u64 << 20)?;
    }
    if u.ratio(1, 8)? {
        // A measured layer time from just above the fastest the peak allows (α bound by the copy
        // bandwidth) to a thousand times that; shorter is an error of its own (MeasuredAbovePeak).
        let layer_flops =
            crate::cost::layer_forward_flops(&model, &parallel, crate::cost::AttentionFlops::CausalHalved)
                .map_or(1, |f| f.total());
        let fastest_s = (layer_flops as f64 / hardware.peak_flops as f64).max(1e-9);
        hardware.measured_layer_forward_s = Some(fastest_s * f64::from(u.int_in_range(1_001..=1_000_000u32)?) / 1e3);
    }
    let strategy = *u.choose(&Strategy::ALL)?;
    let forced_alpha = if strategy == Strategy::Memo && u.arbitrary()? {
        Some(match u.int_in_range(0..=3u8)? {
            0 => 0.0,
            1 => 1.0,
            _ => f64::from(u.int_in_range(0..=1_000_000u32)?) / 1e6,
        })
    } else {
        None
    };
    let budget_nodes = if u.ratio(1, 4)? { u.int_in_range(0..=OPTIONS.small_budget_max)? } else { PLAN_BUDGET_NODES };
    let mut interconnect = crate::model::Interconnect::for_hardware(&hardware);
    if u.ratio(1, 8)? {
        // Any link: from 1 byte/s (collectives dominate the step) up, any latency to a second.
        interconnect = crate::model::Interconnect {
            bytes_per_s: u.int_in_range(1..=u64::MAX)?,
            latency_ns: u.int_in_range(0..=1_000_000_000)?,
        };
    }
    let nodes = crate::model::Nodes { count: node_count, ..crate::model::Nodes::single(&hardware) };
    let sharding = *u.choose(&crate::model::OptimizerSharding::ALL)?;
    Ok(PlanRequest {
        model,
        parallel,
        hardware,
        interconnect,
        nodes,
        sharding,
        strategy,
        forced_alpha,
        budget_nodes,
        memory_limit_bytes: crate::planner::DEFAULT_PLAN_MEMORY_LIMIT,
    })
}

/// A short description of a request for panic messages (the `Debug` form is long).
pub fn describe(request: &PlanRequest) -> String {
    let m = &request.model;
    format!(
        "{} layers, h {}, heads {}, ffn {}, vocab {}, s {}, b {}, t {}, c {}, d {}, {} node(s), ZeRO {}, {} (host {} B{}), \
         {}{}, budget {}",
        m.layers,
        m.hidden,
        m.heads,
        m.ffn_hidden,
        m.vocab,
        m.seq_len,
        m.micro_batch,
        request.parallel.tensor,
        request.parallel.context,
        request.parallel.data,
        request.nodes.count,
        request.sharding.stage(),
        request.hardware.name,
        request.hardware.host_memory_per_node_bytes,
        request.hardware.measured_layer_forward_s.map(|s| format!(", layer {s} s")).unwrap_or_default(),
        request.strategy.name(),
        request.forced_alpha.map(|a| format!(" alpha {a}")).unwrap_or_default(),
        request.budget_nodes,
    )
}

/// Plans `request` and asserts that the checker accepts the plan; the plan and its report.
pub fn checked_plan(request: &PlanRequest) -> PlanReport {
    let report = planner::plan(request).unwrap_or_else(|e| panic!("a valid request fails: {e}\n{}", describe(request)));
    if let Err(violations) = check_plan(&report.plan) {
        let first: String = violations.iter().take(5).map(|v| format!("\n  {v}")).collect();
        panic!("the checker rejects a planner plan ({} violations):{first}\n{}", violations.len(), describe(request));
    }
    report
}

/// Checks one case (see the module docs); panics on the first violated invariant.
pub fn check(case: PlanCase) {
    let request = &case.request;
    let report = checked_plan(request);
    let plan = &report.plan;
    // The data-parallel sharding takes only model state off the arena, and only at ZeRO 1 or 2
    // with d > 1; the step only grows by the data-parallel collectives.
    let saved = report.data_parallel.saved_bytes;
    assert_eq!(report.device_bytes(), plan.totals.arena_bytes - saved, "{}", describe(request));
    assert!(saved <= plan.totals.parameter_bytes, "{}", describe(request));
    if request.parallel.gradient_ranks() == 1 || !request.sharding.shards_optimizer_state() {
        assert_eq!(saved, 0, "{}", describe(request));
    }
    // The ring's exposed seconds are never negative, and none without a ring.
    let exposed = report.context_parallel.exposed_s();
    assert!(exposed >= 0.0 && (request.parallel.context > 1 || exposed == 0.0), "{}", describe(request));
    // With c > 1 the plan holds one program per context rank (plan format 6), which must
    // round-trip like the rest.
    assert_eq!(plan.rank_programs.len() as u64, request.parallel.context - 1, "{}", describe(request));
    assert!(report.step_time_s() >= report.timeline.step_time_s, "{}", describe(request));
    assert!(plan.totals.arena_lower_bound_bytes <= plan.totals.arena_bytes, "{}", describe(request));
    assert_eq!(plan.provenance.strategy, request.strategy);

    let bytes = plan.encode();
    let decoded =
        Plan::decode(&bytes).unwrap_or_else(|e| panic!("a planner plan does not decode: {e}\n{}", describe(request)));
    assert!(decoded == *plan, "decode(encode(plan)) differs from the plan\n{}", describe(request));
    assert!(decoded.encode() == bytes, "the decoded plan re-encodes to other bytes\n{}", describe(request));
    assert!(plan.to_json().starts_with('{'));

    let again = planner::plan(request).unwrap_or_else(|e| panic!("planning again fails: {e}\n{}", describe(request)));
    assert!(again == report, "planning twice gives different reports\n{}", describe(request));
    assert!(again.plan.encode() == bytes, "planning twice gives different bytes\n{}", describe(request));
}

/// `len` bytes of a SplitMix64 stream seeded with `seed`: the seed corpora's inputs.
#[cfg(test)]
pub(crate) fn seed_bytes(seed: u64, len: usize) -> alloc::vec::Vec<u8> {
    let mut rng = crate::generate::SplitMix64::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{run_corpus, smoke};
    use crate::model::Hardware;

    /// About a second of generated requests in a debug build.
    #[test]
    fn smoke_test() {
        smoke(0x706c_616e, 120, 64, check);
    }

    #[test]
    fn the_committed_corpus_passes() {
        run_corpus("plan", check);
    }

    /// Writes the seed corpus: for each strategy, the first SplitMix64 byte string (seed 1, 2,
    /// ...; 48 bytes) whose request uses it and has at least three layers, named after it.
    #[test]
    #[ignore = "writes fuzz/corpus/plan/; run by hand after a change to the generator"]
    fn write_seed_corpus() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/plan");
        std::fs::create_dir_all(&folder).unwrap();
        for strategy in Strategy::ALL {
            let bytes = (1..)
                .map(|seed| seed_bytes(seed, 48))
                .find(|bytes| {
                    let r = PlanCase::arbitrary_take_rest(Unstructured::new(bytes)).unwrap().request;
                    r.strategy == strategy && r.model.layers >= 3
                })
                .unwrap();
            std::fs::write(folder.join(strategy.name()), bytes).unwrap();
        }
    }

    /// The generator reaches every strategy and tensor-parallel degree, forced and solved α, both
    /// kinds of node budget, every ZeRO stage, one node and several, within the smoke test's inputs.
    #[test]
    fn the_generator_covers_its_ranges() {
        let seen = core::cell::RefCell::new(std::collections::BTreeSet::new());
        smoke(0x706c_616e, 120, 64, |case: PlanCase| {
            let r = &case.request;
            let mut seen = seen.borrow_mut();
            seen.insert(format!("strategy {}", r.strategy.name()));
            seen.insert(format!("t {}", r.parallel.tensor));
            seen.insert(format!("forced {}", r.forced_alpha.is_some()));
            seen.insert(format!("default budget {}", r.budget_nodes == PLAN_BUDGET_NODES));
            seen.insert(format!("layers {}", r.model.layers.min(3)));
            seen.insert(format!("zero {}", r.sharding.stage()));
            seen.insert(format!("nodes > 1 {}", r.nodes.count > 1));
            seen.insert(format!("d > 1 on one node {}", r.nodes.count == 1 && r.parallel.data > 1));
            seen.insert(format!("c {}", r.parallel.context));
            seen.insert(format!(
                "c across nodes {}",
                r.parallel.context * r.parallel.tensor > r.hardware.gpus_per_node
            ));
        });
        for want in [
            "strategy memo",
            "strategy keep-all",
            "strategy full-swap",
            "strategy full-recompute",
            "t 1",
            "t 2",
            "t 4",
            "forced true",
            "forced false",
            "default budget true",
            "default budget false",
            "layers 1",
            "layers 2",
            "layers 3",
            "zero 0",
            "zero 1",
            "zero 2",
            "nodes > 1 true",
            "nodes > 1 false",
            "d > 1 on one node true",
            "c 1",
            "c 2",
            "c 4",
            "c across nodes true",
        ] {
            let seen = seen.borrow();
            assert!(seen.contains(want), "the smoke inputs never give {want}: {seen:?}");
        }
    }

    /// The smallest model the generator can make (one layer, one head of size 1, one token, a
    /// vocabulary of one) plans and passes under every strategy.
    #[test]
    fn the_smallest_request_plans() {
        for strategy in Strategy::ALL {
            let mut model = ModelConfig::new("fuzz", 1, 2, 1, 1, 1);
            model.vocab = 1;
            let hardware = Hardware::preset("a800x8").unwrap();
            check(PlanCase { request: PlanRequest::new(model, Parallelism::single(), hardware, strategy) });
        }
    }
}
