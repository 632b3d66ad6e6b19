//! The CUDA backend's launch scratch as the planner asks for it (`spec/plan-format.md`, "Launch
//! scratch"; `spec/backends.md`): the recipes' partial sums for every launch
//! ([`memo_kernels::RecipeScratch`], a pure function of the shapes), and for the attention
//! launches on the cuDNN path what [`crate::CudaBackend::attention_scratch`] answered before
//! planning for their geometry (rotated q and k, dQ accumulator, softmax sums, statistics and the
//! cuDNN plan's workspace). A plan made with it owns every byte the launches use, so
//! `MemoryReport::scratch_bytes` stays 0.

use memo_kernels::{attention_shape, ArgShape, RecipeScratch};
use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::scratch::ScratchSizer;
use memo_plan_core::plan::shapes::{AttentionShape, ShapeContext};
use memo_plan_core::plan::Op;
use memo_runtime::{AdamW, KernelContext};

/// The CUDA backend's [`ScratchSizer`]: [`RecipeScratch`], and the cuDNN attention launches'
/// bytes by (op, geometry), the larger of the two.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaScratch {
    /// (op, geometry, bytes) of the attention launches cuDNN runs.
    attention: Vec<(Op, AttentionShape, u64)>,
}

impl CudaScratch {
    /// A sizer whose cuDNN attention launches of `op` and `geometry` need `bytes`, besides the
    /// recipes' scratch.
    pub fn with_attention(mut self, op: Op, geometry: AttentionShape, bytes: u64) -> Self {
        self.attention.retain(|(o, g, _)| (*o, *g) != (op, geometry));
        self.attention.push((op, geometry, bytes));
        self
    }

    /// The attention launches' geometries of `model` at `tensor`-way parallelism, one per
    /// (op, rank with another shape context): what [`crate::CudaBackend::scratch_sizer`] asks
    /// cuDNN about. Attention runs over whole sequences of the step's head-sharded rows.
    pub fn attention_geometries(model: &ModelConfig, tensor: u64) -> Vec<(Op, AttentionShape)> {
        let ranks = tensor.max(1);
        let mut out: Vec<(Op, AttentionShape)> = Vec::new();
        for rank in 0..ranks {
            let ctx = ShapeContext::for_model(model, rank, ranks);
            let rows = model.micro_batch.saturating_mul(model.seq_len);
            let d = model.head_dim();
            let row = |heads: u64, bytes: u64| ArgShape {
                first_row: 0,
                rows,
                row_bytes: heads.saturating_mul(d).saturating_mul(bytes),
            };
            let (q, kv, lse) = (
                row(ctx.heads, 2),
                row(ctx.kv_heads_in_tensor(), 2),
                ArgShape { first_row: 0, rows, row_bytes: ctx.heads.saturating_mul(4) },
            );
            let forward = [q, kv, kv, q, lse];
            let backward = [q, kv, kv, q, lse, q, q, kv, kv];
            let context = kernel_context(&ctx);
            for (op, args) in [(Op::Attention, &forward[..]), (Op::AttentionBackward, &backward[..])] {
                if let Ok(geometry) = attention_shape(op, args, &context) {
                    if !out.contains(&(op, geometry)) {
                        out.push((op, geometry));
                    }
                }
            }
        }
        out
    }
}

/// The kernels' context for a shape context (the optimizer's settings do not size scratch).
fn kernel_context(ctx: &ShapeContext) -> KernelContext {
    KernelContext {
        hidden: ctx.hidden,
        heads: ctx.heads,
        kv_heads: ctx.kv_heads,
        kv_replicated: ctx.kv_replicated,
        rope_theta: ctx.rope_theta,
        norm_eps: ctx.norm_eps,
        seq_len: ctx.seq_len,
        vocab: ctx.vocab,
        loss_scale_tokens: ctx.loss_scale_tokens,
        adamw: AdamW { step: ctx.adamw_step, ..AdamW::default() },
        rank: ctx.rank,
        ranks: ctx.ranks,
    }
}

impl ScratchSizer for CudaScratch {
    fn scratch_bytes(&self, op: Op, args: &[ArgShape], ctx: &ShapeContext) -> u64 {
        let recipes = RecipeScratch.scratch_bytes(op, args, ctx);
        if !matches!(op, Op::Attention | Op::AttentionBackward) || self.attention.is_empty() {
            return recipes;
        }
        let cudnn = attention_shape(op, args, &kernel_context(ctx))
            .ok()
            .and_then(|geometry| self.attention.iter().find(|(o, g, _)| (*o, *g) == (op, geometry)))
            .map_or(0, |&(_, _, bytes)| bytes);
        recipes.max(cudnn)
    }
}

#[cfg(test)]
mod tests {
    use memo_plan_core::check::check_plan_scratch;
    use memo_plan_core::model::{Hardware, Parallelism};
    use memo_plan_core::plan::{Action, Strategy, TensorRole};
    use memo_plan_core::planner::{plan_with_scratch, PlanRequest};

    use super::*;
    use crate::attention::scratch;

    /// A CUDA plan with cuDNN attention sized as `attention::scratch` sizes it (a 1 MiB
    /// workspace standing in for the one cuDNN reports): every attention launch and every
    /// launch whose recipe uses scratch has it in the plan, so nothing is left outside the
    /// arena, and the checker held to the same sizer accepts it.
    #[test]
    fn a_cuda_plan_carries_every_launch_scratch() {
        for (tensor, strategy) in [(1, Strategy::Memo), (2, Strategy::KeepAll), (1, Strategy::FullRecompute)] {
            let model = ModelConfig::new("tiny", 2, 64, 4, 128, 1);
            let mut sizer = CudaScratch::default();
            let geometries = CudaScratch::attention_geometries(&model, tensor);
            assert!(geometries.len() >= 2);
            for (op, geometry) in geometries {
                let bytes = scratch(op, &geometry, false, true, 1 << 20).layout().1;
                sizer = sizer.with_attention(op, geometry, bytes);
            }
            let request =
                PlanRequest::new(model, Parallelism::new(tensor, 1), Hardware::preset("h200x1").unwrap(), strategy);
            let plan = plan_with_scratch(&request, &sizer).unwrap().plan;
            assert_eq!(check_plan_scratch(&plan, &sizer), Ok(()));
            for instruction in &plan.instructions {
                let Action::Launch(launch) = &instruction.action else { continue };
                if matches!(launch.op, Op::Attention | Op::AttentionBackward) {
                    let arg = launch.scratch().expect("attention has its scratch");
                    let buffer = plan.buffers[arg.region.buffer.index()];
                    assert_eq!(buffer.role, TensorRole::Scratch);
                    assert!(buffer.bytes().unwrap() >= 1 << 20);
                }
            }
            // The recipes' sizer alone leaves cuDNN's attention scratch out: refused.
            let recipes_only = plan_with_scratch(&request, &RecipeScratch).unwrap().plan;
            let refused = check_plan_scratch(&recipes_only, &sizer).unwrap_err();
            assert!(refused.iter().all(|v| v.innermost().name() == "scratch_too_small"));
        }
    }
}
