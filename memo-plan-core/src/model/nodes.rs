//! Where the `d x c x t` ranks of a job sit, and how its data-parallel ranks share the model state
//! (`spec/cost-model.md` sections 3, 7b and 7c).
//!
//! Ranks are numbered tensor-parallel rank fastest, then context-parallel, then data-parallel
//! (Megatron-LM's order): the `t` ranks of a tensor-parallel group are consecutive, so a group
//! lies inside one node when `t` divides the node's GPUs, and its collectives run over the node's
//! links (NVLink, Infinity Fabric). The `c` ranks of a context-parallel group are `t` apart, in
//! `t c` consecutive GPUs: inside one node when `t c` divides its GPUs, else across nodes. The
//! `d x c` ranks that reduce the gradients together are `t` apart: `gpus_per_node / t` of them
//! in each node, so their ring crosses the network as soon as the job spans more than one node.

use core::fmt;

use super::{add, mul, Hardware, Interconnect, ModelConfig, ModelError, Parallelism, BF16_BYTES, FP32_BYTES};

/// The nodes a job spans and the network that joins them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Nodes {
    /// Nodes of the job (at least 1).
    pub count: u64,
    /// Each GPU's share of the inter-node network: bytes per second per direction and the
    /// latency of one ring step. [`Interconnect::UNKNOWN`] is enough for one node.
    pub network: Interconnect,
}

impl Nodes {
    /// One node: every collective stays on the node's links.
    pub fn single(hardware: &Hardware) -> Self {
        Nodes { count: 1, network: Interconnect::network_for_hardware(hardware) }
    }

    /// Checks that `parallel` fits these nodes of `hardware`:
    /// - a tensor-parallel group fits in one node (`t <= gpus_per_node`);
    /// - on one node the job uses at most its GPUs (`d * c * t <= gpus_per_node`: part of a node
    ///   is allowed); on more, it fills every node (`d * c * t = nodes * gpus_per_node`) and `t`
    ///   divides `gpus_per_node`, so that no tensor-parallel group straddles two nodes;
    /// - on more than one node, `t c` divides `gpus_per_node` or is a multiple of it, so that a
    ///   context-parallel group is either inside one node or made of whole nodes (its ring then
    ///   runs at one speed);
    /// - with `d * c > 1` across nodes the network's bandwidth is known.
    pub fn validate_for(&self, parallel: &Parallelism, hardware: &Hardware) -> Result<(), ModelError> {
        if self.count == 0 {
            return Err(ModelError::Zero { field: "nodes" });
        }
        let (t, d, c, per_node) = (parallel.tensor, parallel.data, parallel.context, hardware.gpus_per_node);
        if t > per_node {
            return Err(ModelError::TensorParallelAboveNode { tensor: t, gpus_per_node: per_node });
        }
        let gpus = parallel.gpus();
        let fits = if self.count == 1 {
            gpus <= per_node
        } else {
            per_node.is_multiple_of(t) && Some(gpus) == self.count.checked_mul(per_node)
        };
        if !fits {
            return Err(ModelError::RanksDoNotFillNodes {
                tensor: t,
                data: d,
                context: c,
                nodes: self.count,
                gpus_per_node: per_node,
            });
        }
        let group = t.saturating_mul(c);
        if self.count > 1 && !per_node.is_multiple_of(group) && !group.is_multiple_of(per_node) {
            return Err(ModelError::ContextGroupStraddlesNodes { tensor: t, context: c, gpus_per_node: per_node });
        }
        if self.data_parallel_crosses_nodes(parallel) && self.network.bytes_per_s == 0 {
            return Err(ModelError::Zero { field: "network_bytes_per_s" });
        }
        Ok(())
    }

    /// Whether the `d x c` ranks that reduce the gradients together (and share the optimizer
    /// state) sit in more than one node.
    pub fn data_parallel_crosses_nodes(&self, parallel: &Parallelism) -> bool {
        self.count > 1 && parallel.gradient_ranks() > 1
    }

    /// Whether the `c` ranks of one context-parallel group sit in more than one node: their `t c`
    /// consecutive GPUs are more than a node's (validated layouts make them whole nodes then).
    pub fn context_parallel_crosses_nodes(&self, parallel: &Parallelism, hardware: &Hardware) -> bool {
        self.count > 1
            && parallel.context > 1
            && parallel.tensor.saturating_mul(parallel.context) > hardware.gpus_per_node
    }

    /// The ring the context-parallel ranks pass K/V over: the node's links when the group is
    /// inside one node; across nodes, as for the data-parallel ring, the slower bandwidth and the
    /// longer latency of the node's links and the network.
    pub fn context_parallel_link(
        &self,
        parallel: &Parallelism,
        hardware: &Hardware,
        node_link: &Interconnect,
    ) -> Interconnect {
        if self.context_parallel_crosses_nodes(parallel, hardware) {
            slowest_of(node_link, &self.network)
        } else {
            *node_link
        }
    }

    /// The ring a data-parallel collective runs over: the node's links inside one node; across
    /// nodes a ring alternates node links and network links, and every ring step waits for the
    /// slowest link, so it is the slower bandwidth and the longer latency of the two.
    pub fn data_parallel_link(&self, parallel: &Parallelism, node_link: &Interconnect) -> Interconnect {
        if !self.data_parallel_crosses_nodes(parallel) {
            return *node_link;
        }
        slowest_of(node_link, &self.network)
    }
}

/// A ring over the node's links and the network: every step waits for the slowest link.
fn slowest_of(node_link: &Interconnect, network: &Interconnect) -> Interconnect {
    let slowest = |a: u64, b: u64| if a == 0 { b } else { a.min(b) };
    Interconnect {
        bytes_per_s: slowest(node_link.bytes_per_s, network.bytes_per_s),
        latency_ns: node_link.latency_ns.max(network.latency_ns),
    }
}

/// How the data-parallel ranks share the model state: the stages of ZeRO (Rajbhandari et al.,
/// 2020). Stage 1 is Megatron-LM's distributed optimizer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OptimizerSharding {
    /// Stage 0: every data-parallel rank holds all of its tensor-parallel shard's state; the
    /// gradients are all-reduced.
    #[default]
    Replicated,
    /// Stage 1: each of the `d` ranks holds `1/d` of the fp32 master weights and AdamW moments;
    /// the gradients are reduce-scattered, each rank updates its part, and the bf16 parameters
    /// are all-gathered.
    OptimizerState,
    /// Stage 2: stage 1, and each rank keeps only its `1/d` of the reduced gradients.
    OptimizerStateAndGradients,
}

impl OptimizerSharding {
    /// Every stage, in order.
    pub const ALL: [OptimizerSharding; 3] = [
        OptimizerSharding::Replicated,
        OptimizerSharding::OptimizerState,
        OptimizerSharding::OptimizerStateAndGradients,
    ];

    /// The ZeRO stage: 0, 1 or 2.
    pub fn stage(self) -> u8 {
        match self {
            OptimizerSharding::Replicated => 0,
            OptimizerSharding::OptimizerState => 1,
            OptimizerSharding::OptimizerStateAndGradients => 2,
        }
    }

    /// The sharding of ZeRO stage `stage` (0, 1 or 2).
    pub fn from_stage(stage: u8) -> Option<Self> {
        OptimizerSharding::ALL.into_iter().find(|s| s.stage() == stage)
    }

    /// Whether the optimizer state is divided over the data-parallel ranks.
    pub fn shards_optimizer_state(self) -> bool {
        self != OptimizerSharding::Replicated
    }

    /// Whether the gradients are divided over the data-parallel ranks.
    pub fn shards_gradients(self) -> bool {
        self == OptimizerSharding::OptimizerStateAndGradients
    }
}

impl fmt::Display for OptimizerSharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // `d` here is the sharding group: d x c with context parallelism (the header that
            // prints this names the group).
            OptimizerSharding::Replicated => f.write_str("ZeRO 0 (model state replicated over the group)"),
            OptimizerSharding::OptimizerState => f.write_str("ZeRO 1 (optimizer state sharded over the group)"),
            OptimizerSharding::OptimizerStateAndGradients => {
                f.write_str("ZeRO 2 (optimizer state and gradients sharded over the group)")
            }
        }
    }
}

/// `ceil(elements / d)` elements of `bytes_per_element` each: one data-parallel rank's share
/// of a sharded state (the flat buffer is padded to a multiple of `d`, as Megatron-LM pads it).
pub fn shard_bytes(elements: u64, data: u64, bytes_per_element: u64) -> Result<u64, ModelError> {
    mul(elements.div_ceil(data.max(1)), bytes_per_element, "sharded model-state bytes")
}

impl ModelConfig {
    /// Bytes of model state on one GPU with the data-parallel ranks sharing it by `sharding`:
    /// [`ModelConfig::model_state_bytes`] with the optimizer state (stage 1) and the gradients
    /// (stage 2) cut to one rank's `ceil(P / (d c))` elements (the sharding group is the
    /// data-parallel x context-parallel ranks, [`Parallelism::gradient_ranks`]).
    pub fn sharded_model_state_bytes(
        &self,
        parallel: &Parallelism,
        sharding: OptimizerSharding,
    ) -> Result<super::ModelStateBytes, ModelError> {
        let mut state = self.model_state_bytes(parallel)?;
        let (per_gpu, d) = (state.parameters_per_gpu, parallel.gradient_ranks());
        if sharding.shards_optimizer_state() {
            state.optimizer = shard_bytes(per_gpu, d, 3 * FP32_BYTES)?;
        }
        if sharding.shards_gradients() {
            state.gradients = shard_bytes(per_gpu, d, BF16_BYTES)?;
        }
        const WHAT: &str = "model-state bytes";
        state.total = add(add(state.parameters, state.gradients, WHAT)?, state.optimizer, WHAT)?;
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::ToString;

    fn h100x8() -> Hardware {
        Hardware::preset("h100x8").unwrap()
    }

    fn nodes(count: u64) -> Nodes {
        Nodes { count, ..Nodes::single(&h100x8()) }
    }

    /// Llama-3.1-70B at t = 8 (= its K/V heads: nothing replicated) holds `P = ceil(N / 8)`
    /// parameters per GPU; ZeRO 1 cuts the 12 bytes of optimizer state per parameter to the
    /// rank's `ceil(P / d)`, ZeRO 2 the 2 bytes of gradient too; the bf16 parameters stay whole.
    #[test]
    fn llama_70b_model_state_shards_by_d() {
        let model = ModelConfig::preset("llama3.1-70b", 1024, 1).unwrap();
        let count = model.parameter_count().unwrap();
        assert_eq!(count, 70_553_706_496, "the published count");
        let p = count.div_ceil(8);
        for d in [1u64, 2, 4, 8, 64] {
            let parallel = Parallelism::new(8, d);
            let share = p.div_ceil(d);
            let zero0 = model.sharded_model_state_bytes(&parallel, OptimizerSharding::Replicated).unwrap();
            assert_eq!(zero0, model.model_state_bytes(&parallel).unwrap());
            assert_eq!(zero0.total, 16 * p);
            let zero1 = model.sharded_model_state_bytes(&parallel, OptimizerSharding::OptimizerState).unwrap();
            assert_eq!((zero1.parameters, zero1.gradients, zero1.optimizer), (2 * p, 2 * p, 12 * share), "d = {d}");
            assert_eq!(zero1.total, 4 * p + 12 * share);
            let zero2 =
                model.sharded_model_state_bytes(&parallel, OptimizerSharding::OptimizerStateAndGradients).unwrap();
            assert_eq!((zero2.parameters, zero2.gradients, zero2.optimizer), (2 * p, 2 * share, 12 * share));
            assert_eq!(zero2.total, 2 * p + 14 * share);
        }
        // The figure: one node at t = 8 without sharding holds over 80 GiB of model state
        // alone (16 bytes x 8.8e9 parameters = 131 GiB); ZeRO 1 over 8 nodes brings it to 5.5 bytes
        // per parameter.
        let one_node = model.sharded_model_state_bytes(&Parallelism::new(8, 1), OptimizerSharding::Replicated);
        assert!(one_node.unwrap().total > 80 << 30);
        let eight = model.sharded_model_state_bytes(&Parallelism::new(8, 8), OptimizerSharding::OptimizerState);
        assert_eq!(eight.unwrap().total, 4 * p + 12 * p.div_ceil(8));
    }

    #[test]
    fn zero_stages_round_trip_and_refuse_others() {
        for sharding in OptimizerSharding::ALL {
            assert_eq!(OptimizerSharding::from_stage(sharding.stage()), Some(sharding));
        }
        assert_eq!(OptimizerSharding::from_stage(3), None);
        assert_eq!(OptimizerSharding::default(), OptimizerSharding::Replicated);
    }

    /// A group of t stays in a node; one node may be used in part; more than one node is filled,
    /// with t dividing each node's GPUs; every refusal names the numbers.
    #[test]
    fn layouts_fill_their_nodes_or_are_refused_with_the_numbers() {
        let h = h100x8();
        let ok = |n: u64, t: u64, d: u64| nodes(n).validate_for(&Parallelism::new(t, d), &h);
        for (n, t, d) in [(1, 8, 1), (1, 2, 1), (1, 2, 3), (1, 1, 8), (2, 8, 2), (4, 8, 4), (8, 4, 16), (3, 1, 24)] {
            assert_eq!(ok(n, t, d), Ok(()), "{n} nodes, t = {t}, d = {d}");
        }
        assert_eq!(ok(1, 16, 1), Err(ModelError::TensorParallelAboveNode { tensor: 16, gpus_per_node: 8 }));
        let message = ok(1, 16, 1).unwrap_err().to_string();
        assert!(message.contains("t = 16") && message.contains("a node has 8") && message.contains("t = 8 or less"));
        let short = ok(4, 8, 2).unwrap_err();
        assert_eq!(
            short,
            ModelError::RanksDoNotFillNodes { tensor: 8, data: 2, context: 1, nodes: 4, gpus_per_node: 8 }
        );
        let message = short.to_string();
        for words in ["d x t = 2 x 8 = 16 GPUs", "4 node(s) of 8 GPUs (32 GPUs)", "use d = 4", "or 2 node(s)"] {
            assert!(message.contains(words), "{message:?} lacks {words:?}");
        }
        assert!(ok(1, 8, 2).unwrap_err().to_string().contains("use d = 1"));
        // t = 3 on two nodes of 8: a group would straddle them.
        let message = ok(2, 3, 5).unwrap_err().to_string();
        assert!(message.contains("t = 3 does not divide the 8 GPUs"), "{message}");
        assert_eq!(nodes(0).validate_for(&Parallelism::new(8, 1), &h), Err(ModelError::Zero { field: "nodes" }));
        // Across nodes the network must be known; on one node it need not be.
        let blind = Nodes { count: 2, network: Interconnect::UNKNOWN };
        let error = blind.validate_for(&Parallelism::new(8, 2), &h).unwrap_err();
        assert_eq!(error, ModelError::Zero { field: "network_bytes_per_s" });
        assert!(format!("{error}").contains("--network-bandwidth"));
        let one = Nodes { count: 1, network: Interconnect::UNKNOWN };
        assert_eq!(one.validate_for(&Parallelism::new(2, 4), &h), Ok(()));
    }

    /// Inside a node a data-parallel ring runs on the node's links; across nodes every step waits
    /// for the slowest link: the network's bandwidth, the longer latency.
    #[test]
    fn data_parallel_rings_run_where_their_ranks_sit() {
        let h = h100x8();
        let nvlink = Interconnect::for_hardware(&h);
        let network = Interconnect::network_for_hardware(&h);
        assert_eq!(network, Interconnect { bytes_per_s: 50_000_000_000, latency_ns: 8_000 }, "400 Gb/s per GPU");
        assert!(nvlink.bytes_per_s > network.bytes_per_s);
        let inside = Parallelism::new(2, 4);
        assert!(!nodes(1).data_parallel_crosses_nodes(&inside));
        assert_eq!(nodes(1).data_parallel_link(&inside, &nvlink), nvlink);
        let across = Parallelism::new(8, 4);
        assert!(nodes(4).data_parallel_crosses_nodes(&across));
        assert_eq!(
            nodes(4).data_parallel_link(&across, &nvlink),
            Interconnect { bytes_per_s: network.bytes_per_s, latency_ns: nvlink.latency_ns.max(network.latency_ns) }
        );
        // A network faster than the node's links (an odd machine file) leaves the node's as the
        // slowest.
        let fast = Nodes { count: 4, network: Interconnect { bytes_per_s: u64::MAX, latency_ns: 0 } };
        assert_eq!(fast.data_parallel_link(&across, &nvlink), nvlink);
        // d = 1 has no data-parallel ring, whatever the nodes.
        assert!(!nodes(4).data_parallel_crosses_nodes(&Parallelism::new(8, 1)));
        // Every preset with more than one GPU per node has a network.
        for preset in crate::model::HARDWARE_PRESETS {
            let network = Interconnect::network_for_hardware(&preset.hardware());
            assert!(network.bytes_per_s > 0, "{}", preset.name.to_string());
        }
    }

    /// GPUs = d x c x t: c ranks of a sequence may span nodes, t may not; a c x t group sits in a
    /// node or fills whole nodes; every refusal names the numbers and the fix.
    #[test]
    fn context_parallel_layouts_and_their_refusals() {
        let h = h100x8();
        let ok = |n: u64, t: u64, c: u64, d: u64| nodes(n).validate_for(&Parallelism::new(t, d).with_context(c), &h);
        for (n, t, c, d) in
            [(1, 4, 2, 1), (1, 2, 2, 2), (2, 8, 2, 1), (8, 8, 8, 1), (4, 8, 4, 1), (4, 4, 2, 4), (2, 1, 16, 1)]
        {
            assert_eq!(ok(n, t, c, d), Ok(()), "{n} nodes, t = {t}, c = {c}, d = {d}");
        }
        // One node of 8 cannot hold t = 8, c = 2.
        let error = ok(1, 8, 2, 1).unwrap_err();
        assert_eq!(
            error,
            ModelError::RanksDoNotFillNodes { tensor: 8, data: 1, context: 2, nodes: 1, gpus_per_node: 8 }
        );
        let message = error.to_string();
        for words in ["d x c x t = 1 x 2 x 8 = 16 GPUs", "1 node(s) of 8 GPUs", "use 2 node(s) or more, or a smaller c"]
        {
            assert!(message.contains(words), "{message:?} lacks {words:?}");
        }
        // Four nodes at t = 8, c = 2 leave d = 2 to fill them.
        let message = ok(4, 8, 2, 1).unwrap_err().to_string();
        assert!(message.contains("use d = 2"), "{message}");
        // t = 2, c = 3 on nodes of 8: a group of 6 would straddle two nodes.
        let error = ok(3, 2, 3, 4).unwrap_err();
        assert_eq!(error, ModelError::ContextGroupStraddlesNodes { tensor: 2, context: 3, gpus_per_node: 8 });
        assert!(error.to_string().contains("c x t = 3 x 2 = 6 GPUs"), "{error}");
        assert_eq!(
            nodes(1).validate_for(&Parallelism::new(1, 1).with_context(0), &h),
            Ok(()),
            "the nodes check the GPUs; c = 0 is the layout's own check"
        );
        let model = ModelConfig::preset("llama3.1-8b", 1 << 16, 1).unwrap();
        assert_eq!(
            Parallelism::new(8, 1).with_context(0).validate_for(&model),
            Err(ModelError::Zero { field: "context" })
        );
        // c ranks across nodes need the network, as d ranks do.
        let blind = Nodes { count: 2, network: Interconnect::UNKNOWN };
        assert_eq!(
            blind.validate_for(&Parallelism::new(8, 1).with_context(2), &h),
            Err(ModelError::Zero { field: "network_bytes_per_s" })
        );
    }

    /// The ring runs on the node's links while the c x t GPUs of a sequence fit one node, and on
    /// the network (the slowest link) once they span nodes; the ZeRO group is d x c.
    #[test]
    fn context_parallel_rings_run_where_their_ranks_sit() {
        let h = h100x8();
        let nvlink = Interconnect::for_hardware(&h);
        let network = Interconnect::network_for_hardware(&h);
        let inside = Parallelism::new(4, 2).with_context(2);
        assert!(!nodes(2).context_parallel_crosses_nodes(&inside, &h));
        assert_eq!(nodes(2).context_parallel_link(&inside, &h, &nvlink), nvlink);
        assert!(nodes(2).data_parallel_crosses_nodes(&inside), "d x c = 4 ranks over two nodes");
        let across = Parallelism::new(8, 1).with_context(4);
        assert!(nodes(4).context_parallel_crosses_nodes(&across, &h));
        assert_eq!(
            nodes(4).context_parallel_link(&across, &h, &nvlink),
            Interconnect { bytes_per_s: network.bytes_per_s, latency_ns: nvlink.latency_ns.max(network.latency_ns) }
        );
        assert!(nodes(4).data_parallel_crosses_nodes(&across), "d = 1 but c = 4: the gradients reduce over 4");
        assert_eq!(across.gradient_ranks(), 4);
        // ZeRO 1 shards over d x c: at d = 1, c = 8 as at d = 8, c = 1.
        let model = ModelConfig::preset("llama3.1-70b", 1 << 16, 1).unwrap();
        let by_c =
            model.sharded_model_state_bytes(&Parallelism::new(8, 1).with_context(8), OptimizerSharding::OptimizerState);
        let by_d = model.sharded_model_state_bytes(&Parallelism::new(8, 8), OptimizerSharding::OptimizerState);
        assert_eq!(by_c, by_d);
        let p = model.parameter_count().unwrap().div_ceil(8);
        assert_eq!(by_c.unwrap().optimizer, 12 * p.div_ceil(8));
    }
}
