//! The data-parallel side of a plan (`spec/cost-model.md` section 7b): what sharding the model
//! state over the `d` ranks saves on each GPU, and what the gradients' reduction and the
//! parameters' all-gather add to the step.
//!
//! The plan itself is one tensor-parallel group's per-rank program with its whole model state
//! (what the runtimes execute, and what the plan format holds); the data-parallel collectives and
//! the sharding are applied here, on top of it, to its figures. The model state is one request
//! of the arena, live over the whole step (`bilevel`), so an arena placed with the sharded state
//! is the same placement less the bytes sharded away: `device_bytes` subtracts them exactly
//! (up to the 256-byte alignment of each buffer, which this keeps, so it errs high).

use crate::cost::{self, DataParallelTime};
use crate::model::{
    shard_bytes, Interconnect, ModelError, Nodes, OptimizerSharding, Parallelism, BF16_BYTES, FP32_BYTES,
};
use crate::plan::{BufferKind, Plan};

/// What the data-parallel ranks change in one GPU's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DataParallelReport {
    /// How the ranks share the model state.
    pub sharding: OptimizerSharding,
    /// `d`.
    pub ranks: u64,
    /// Whether a data-parallel group spans nodes (its rings cross the network).
    pub across_nodes: bool,
    /// The ring its collectives are timed over.
    pub link: Interconnect,
    /// Bytes of the plan's gradients, parameters and optimizer state on one GPU, whole.
    pub plan_gradient_bytes: u64,
    /// The plan's bf16 parameters.
    pub plan_parameter_bytes: u64,
    /// The plan's fp32 master weights and AdamW moments.
    pub plan_optimizer_bytes: u64,
    /// Optimizer state one GPU keeps: its `ceil(elements / d)` share with ZeRO 1 and 2.
    pub optimizer_bytes: u64,
    /// Gradients one GPU keeps: with ZeRO 2 its share plus the largest gradient buffer, which is
    /// whole until its reduce-scatter (one parameter's, reduced as its backward ends); else all.
    pub gradient_bytes: u64,
    /// The largest gradient buffer of the plan (one parameter's).
    pub largest_gradient_bytes: u64,
    /// Device bytes the sharding takes off the plan's arena.
    pub saved_bytes: u64,
    /// The collectives' seconds, added to the plan's step (not overlapped with it).
    pub time: DataParallelTime,
}

impl DataParallelReport {
    /// The data-parallel figures of `plan` for `parallel` on `nodes`, whose tensor-parallel
    /// collectives run on `node_link`.
    pub fn of(
        plan: &Plan,
        parallel: &Parallelism,
        nodes: &Nodes,
        sharding: OptimizerSharding,
        node_link: &Interconnect,
    ) -> Result<Self, ModelError> {
        let (mut gradients, mut parameters, mut optimizer, mut largest_gradient) = (0u64, 0u64, 0u64, 0u64);
        let overflow = || ModelError::Overflow { what: "model-state bytes" };
        for buffer in &plan.buffers {
            let bytes = buffer.bytes().ok_or_else(overflow)?;
            let sum = match buffer.kind {
                BufferKind::Gradient => {
                    largest_gradient = largest_gradient.max(bytes);
                    &mut gradients
                }
                BufferKind::Parameter => &mut parameters,
                BufferKind::OptimizerState => &mut optimizer,
                _ => continue,
            };
            *sum = sum.checked_add(bytes).ok_or_else(overflow)?;
        }
        // The optimizer state is sharded, and the gradients reduced, over the d x c ranks that
        // hold the same parameters (Megatron-LM's data-parallel x context-parallel group).
        let d = parallel.gradient_ranks().max(1);
        let sharded = d > 1;
        let kept_optimizer = if sharded && sharding.shards_optimizer_state() {
            shard_bytes(optimizer / (3 * FP32_BYTES), d, 3 * FP32_BYTES)?
        } else {
            optimizer
        };
        let kept_gradients = if sharded && sharding.shards_gradients() {
            let share = shard_bytes(gradients / BF16_BYTES, d, BF16_BYTES)?;
            share.saturating_add(largest_gradient).min(gradients)
        } else {
            gradients
        };
        let saved_bytes = (optimizer - kept_optimizer.min(optimizer)).saturating_add(gradients - kept_gradients);
        let link = nodes.data_parallel_link(parallel, node_link);
        Ok(DataParallelReport {
            sharding,
            ranks: d,
            across_nodes: nodes.data_parallel_crosses_nodes(parallel),
            link,
            plan_gradient_bytes: gradients,
            plan_parameter_bytes: parameters,
            plan_optimizer_bytes: optimizer,
            optimizer_bytes: kept_optimizer,
            gradient_bytes: kept_gradients,
            largest_gradient_bytes: largest_gradient,
            saved_bytes,
            time: cost::data_parallel_time(gradients, parameters, d, sharding, &link),
        })
    }
}
