//! The CUDA backend's launch scratch as the planner asks for it (`spec/plan-format.md`, "Launch
//! scratch"; `spec/backends.md`): the recipes' partial sums for every launch
//! ([`memo_kernels::RecipeScratch`], a pure function of the shapes), and for the attention
//! launches on the cuDNN path what [`crate::CudaBackend::attention_scratch`] answered before
//! planning for their geometry (rotated q and k, dQ accumulator, softmax sums, statistics and the
//! cuDNN plan's workspace). A plan made with it owns every byte the launches use, so
//! `MemoryReport::scratch_bytes` stays 0.

use memo_kernels::{attention_shape, kernel_context, ArgShape, RecipeScratch};
use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::scratch::ScratchSizer;
use memo_plan_core::plan::shapes::{AttentionShape, ShapeContext};
use memo_plan_core::plan::Op;

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
    /// (op, rank with another shape context): what [`crate::CudaBackend::cuda_scratch_sizer`] asks
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

/// Where one launch's scratch comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// It needs none.
    None,
    /// The plan's: its argument past the signature (address, bytes).
    Plan(u64, u64),
    /// The stream's scratch memory, grown on demand outside the arena (a plan made without
    /// [`CudaScratch`]): what `MemoryReport::scratch_bytes` counts.
    Stream,
}

/// The scratch of a launch of `op` over `spans` (the signature's arguments, then maybe its
/// scratch) whose kernels need `needed` bytes; `Err` (the message) when the plan's is smaller.
pub(crate) fn source(op: Op, spans: &[(u64, u64)], needed: u64) -> Result<Source, String> {
    if needed == 0 {
        return Ok(Source::None);
    }
    match spans.get(op.signature().len()) {
        Some(&(base, len)) if len >= needed => Ok(Source::Plan(base, len)),
        Some(&(_, len)) => Err(format!(
            "op `{}`: the plan gives {len} bytes of scratch, the kernels need {needed} (the plan was made for \
             another backend's scratch sizer)",
            op.name()
        )),
        None => Ok(Source::Stream),
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
    use memo_plan_core::plan::scratch::signature_shapes;
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
            // The backend's choice for every launch: the plan's scratch, never the stream's, so
            // nothing grows outside the arena (`scratch_device_bytes` 0). The launch's spans as
            // arena offsets, its needs as the sizer's (what the kernels and cuDNN ask).
            let ctx = ShapeContext::for_model(&plan.provenance.model, 0, tensor);
            let (mut from_plan, mut outside) = (0, 0);
            for instruction in &plan.instructions {
                let Action::Launch(launch) = &instruction.action else { continue };
                let span = |a: &memo_plan_core::plan::Arg| {
                    let b = plan.buffers[a.region.buffer.index()];
                    let memo_plan_core::plan::Place::Device { offset } = b.place else { unreachable!() };
                    (offset + a.region.start * b.row_bytes, (a.region.end - a.region.start) * b.row_bytes)
                };
                let spans: Vec<(u64, u64)> = launch.args.iter().map(span).collect();
                let shapes = signature_shapes(&plan, launch).expect("a checked plan's arguments are in it");
                match source(launch.op, &spans, sizer.scratch_bytes(launch.op, &shapes, &ctx)).unwrap() {
                    Source::Plan(..) => from_plan += 1,
                    Source::Stream => outside += 1,
                    Source::None => {}
                }
            }
            assert!(from_plan > 0 && outside == 0, "{from_plan} from the plan, {outside} outside");
            // A plan made without the sizer: the same launches grow the stream's scratch.
            let bare = memo_plan_core::planner::plan(&request).unwrap().plan;
            let without = bare.instructions.iter().filter_map(|i| match &i.action {
                Action::Launch(l) => Some(l),
                _ => None,
            });
            assert!(without.clone().all(|l| l.scratch().is_none()));
            assert_eq!(source(Op::Attention, &[(0, 8); 5], 64), Ok(Source::Stream));
            assert!(source(Op::Attention, &[(0, 8); 6], 64).is_err());
            assert_eq!(
                source(Op::Attention, &[(0, 8), (0, 8), (0, 8), (0, 8), (0, 8), (512, 64)], 64),
                Ok(Source::Plan(512, 64))
            );

            // The recipes' sizer alone leaves cuDNN's attention scratch out: refused.
            let recipes_only = plan_with_scratch(&request, &RecipeScratch).unwrap().plan;
            let refused = check_plan_scratch(&recipes_only, &sizer).unwrap_err();
            assert!(refused.iter().all(|v| v.innermost().name() == "scratch_too_small"));
        }
    }
}
