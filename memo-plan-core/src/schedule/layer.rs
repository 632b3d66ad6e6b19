//! One layer's program: its parameters, where its skeletal tensors live under each strategy, and
//! the ops of its forward, its recompute and its backward (pre-LN GPT layer, GeLU MLP;
//! `docs/technique.md` section 1).
//!
//! Rows: sequence-sharded tensors (the layer input, norm outputs, the attention residual) have
//! `r = b*s/t` rows of `h` elements; head-sharded ones (q, k, v, attention output, log-sum-exp,
//! FC1 and GeLU outputs) have `R = b*s` rows of `1/t` of their width. With `t > 1`, a norm output
//! is all-gathered before the column-parallel products and row-parallel products are
//! reduce-scattered (Megatron-LM sequence parallelism); with `t = 1` those collectives vanish.
//!
//! The token split: of each token-split tensor, rows `[0, a)` are swapped and rows `[a, rows)`
//! recomputed, with `a = floor(alpha * r)` for sequence-sharded tensors and `t * a` for
//! head-sharded ones (the same tokens of every GPU's shard).

use alloc::vec::Vec;

use super::{Block, Builder, Param, Phase, ScheduleError};
use crate::plan::{BufferId, BufferKind, EventId, Op, Region, Strategy, Stream, TensorRole, TensorRows};

/// Which rows a skeletal tensor has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// `b*s/t` rows of `h` bf16 elements.
    SequenceSharded,
    /// `b*s` rows of a `1/t` slice (head-sharded).
    HeadSharded,
}

/// The eleven skeletal tensors in forward order: role, rows, whether the token split applies.
pub const SKELETAL_ROLES: [(TensorRole, Rows, bool); 11] = [
    (TensorRole::LayerInput, Rows::SequenceSharded, false),
    (TensorRole::InputNormOutput, Rows::SequenceSharded, true),
    (TensorRole::Query, Rows::HeadSharded, true),
    (TensorRole::Key, Rows::HeadSharded, true),
    (TensorRole::Value, Rows::HeadSharded, true),
    (TensorRole::AttentionOutput, Rows::HeadSharded, false),
    (TensorRole::AttentionLogSumExp, Rows::HeadSharded, false),
    (TensorRole::AttentionResidual, Rows::SequenceSharded, true),
    (TensorRole::PostAttentionNormOutput, Rows::SequenceSharded, true),
    (TensorRole::Fc1Output, Rows::HeadSharded, true),
    (TensorRole::GeluOutput, Rows::HeadSharded, true),
];

const X: usize = 0;
const N1: usize = 1;
const Q: usize = 2;
const K: usize = 3;
const V: usize = 4;
const O: usize = 5;
const LSE: usize = 6;
const RES: usize = 7;
const N2: usize = 8;
const F1: usize = 9;
const G: usize = 10;

/// One layer's skeletal tensors, in [`SKELETAL_ROLES`] order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkeletalSet(pub [BufferId; 11]);

impl SkeletalSet {
    /// The layer input.
    pub fn input(&self) -> BufferId {
        self.0[X]
    }
}

/// One layer's parameters.
pub(crate) struct LayerParams {
    norm1_scale: Param,
    norm1_shift: Param,
    /// (weight, bias) of q, k, v.
    qkv: [(Param, Param); 3],
    projection: (Param, Param),
    norm2_scale: Param,
    norm2_shift: Param,
    fc1: (Param, Param),
    fc2: (Param, Param),
}

impl LayerParams {
    pub fn new(b: &mut Builder, layer: u32) -> Self {
        let (h, f, t) = (b.shape.hidden, b.shape.ffn, b.shape.tensor);
        let l = Some(layer);
        let linear = |b: &mut Builder, weight: TensorRole, bias: TensorRole, out: u64, inp: u64| {
            (b.param(weight, l, out, inp), b.param(bias, l, 1, out))
        };
        LayerParams {
            norm1_scale: b.param(TensorRole::NormScale1, l, 1, h),
            norm1_shift: b.param(TensorRole::NormShift1, l, 1, h),
            qkv: [
                linear(b, TensorRole::QueryWeight, TensorRole::QueryBias, h / t, h),
                linear(b, TensorRole::KeyWeight, TensorRole::KeyBias, h / t, h),
                linear(b, TensorRole::ValueWeight, TensorRole::ValueBias, h / t, h),
            ],
            // Row-parallel: every GPU holds all h outputs over its h/t inputs.
            projection: linear(b, TensorRole::ProjectionWeight, TensorRole::ProjectionBias, h, h / t),
            norm2_scale: b.param(TensorRole::NormScale2, l, 1, h),
            norm2_shift: b.param(TensorRole::NormShift2, l, 1, h),
            fc1: linear(b, TensorRole::Fc1Weight, TensorRole::Fc1Bias, f / t, h),
            fc2: linear(b, TensorRole::Fc2Weight, TensorRole::Fc2Bias, h, f / t),
        }
    }
}

/// What a layer's backward first recomputes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Recompute {
    /// First recomputed row of sequence-sharded tensors.
    pub local_start: u64,
    /// Whether attention reruns too (full recompute).
    pub attention: bool,
}

/// Where every layer's skeletal tensors live, which layers swap, and the swap events.
pub(crate) struct Storage {
    strategy: Strategy,
    forward: Vec<SkeletalSet>,
    backward: Vec<SkeletalSet>,
    /// Per layer: the host slots of its swapped tensors (index in [`SKELETAL_ROLES`], slot).
    host: Vec<Vec<(usize, BufferId)>>,
    /// Rows `[0, swapped)` of sequence-sharded token-split tensors are swapped.
    swapped: u64,
    /// Per layer: the swap-in's completion event, once issued.
    swapped_in: Vec<Option<EventId>>,
}

impl Storage {
    pub fn new(b: &mut Builder, strategy: Strategy, alpha_fixed: u64) -> Self {
        let shape = b.shape;
        let layers = shape.layers as usize;
        let rows_of = |rows: Rows| match rows {
            Rows::SequenceSharded => shape.local_rows,
            Rows::HeadSharded => shape.full_rows,
        };
        let row_bytes = |role: TensorRole, rows: Rows| match (role, rows) {
            (TensorRole::AttentionLogSumExp, _) => shape.lse_row,
            (TensorRole::Fc1Output | TensorRole::GeluOutput, _) => shape.ffn_row,
            (_, Rows::SequenceSharded) => shape.hidden_row,
            (_, Rows::HeadSharded) => shape.head_row,
        };
        // A skeletal set: the input of kind `kind[0]` (or `input`, shared), the rest `kind[1]`.
        let set = |b: &mut Builder,
                   kind: [BufferKind; 2],
                   layer: Option<u32>,
                   slot: u8,
                   block: Option<Block>,
                   input: Option<BufferId>| {
            let ids = SKELETAL_ROLES.map(|(role, rows, _)| match (role, input) {
                (TensorRole::LayerInput, Some(shared)) => shared,
                (TensorRole::LayerInput, None) => {
                    b.buffer_in_slot(kind[0], role, layer, slot, rows_of(rows), row_bytes(role, rows), None)
                }
                _ => b.buffer_in_slot(kind[1], role, layer, slot, rows_of(rows), row_bytes(role, rows), block),
            });
            SkeletalSet(ids)
        };
        let (mut forward, mut backward) = (Vec::with_capacity(layers), Vec::with_capacity(layers));
        let swapped = match strategy {
            Strategy::KeepAll | Strategy::FullRecompute => 0,
            Strategy::FullSwap => shape.local_rows,
            Strategy::Memo => super::swapped_rows(shape.local_rows, alpha_fixed),
        };
        let mut host = Vec::with_capacity(layers);
        match strategy {
            Strategy::KeepAll => {
                for l in 0..shape.layers {
                    let kept = set(b, [BufferKind::Skeletal; 2], Some(l), 0, None, None);
                    forward.push(kept);
                    backward.push(kept);
                }
            }
            Strategy::FullRecompute => {
                for l in 0..shape.layers {
                    let kinds = [BufferKind::Skeletal, BufferKind::Transient];
                    let fwd = set(b, kinds, Some(l), 0, Some(Block { layer: l, phase: Phase::Forward }), None);
                    let input = Some(fwd.input());
                    let bwd = set(b, kinds, Some(l), 0, Some(Block { layer: l, phase: Phase::Backward }), input);
                    forward.push(fwd);
                    backward.push(bwd);
                }
            }
            Strategy::FullSwap | Strategy::Memo => {
                // Two rounding buffers (one when there is one layer).
                let rounding: Vec<SkeletalSet> = (0..shape.layers.min(2) as u8)
                    .map(|slot| set(b, [BufferKind::RoundingBuffer; 2], None, slot, None, None))
                    .collect();
                for l in 0..shape.layers {
                    forward.push(rounding[l as usize % 2]);
                    backward.push(rounding[l as usize % 2]);
                }
            }
        }
        let swaps = matches!(strategy, Strategy::FullSwap | Strategy::Memo);
        for l in 0..shape.layers {
            let mut slots = Vec::new();
            // The last two layers keep their data in the rounding buffers.
            if swaps && l + 2 < shape.layers {
                for (index, (role, rows, split)) in SKELETAL_ROLES.into_iter().enumerate() {
                    let count = if split { swapped * (rows_of(rows) / shape.local_rows) } else { rows_of(rows) };
                    if count > 0 {
                        let slot = b.buffer(BufferKind::HostSlot, role, Some(l), count, row_bytes(role, rows), None);
                        slots.push((index, slot));
                    }
                }
            }
            host.push(slots);
        }
        Storage { strategy, forward, backward, host, swapped, swapped_in: alloc::vec![None; layers] }
    }

    pub fn forward_set(&self, layer: u32) -> SkeletalSet {
        self.forward[layer as usize]
    }

    pub fn backward_set(&self, layer: u32) -> SkeletalSet {
        self.backward[layer as usize]
    }

    pub fn swapped_rows(&self) -> u64 {
        self.swapped
    }

    /// What layer `layer`'s backward recomputes first, if anything.
    pub fn recompute(&self, b: &Builder, layer: u32) -> Option<Recompute> {
        match self.strategy {
            Strategy::KeepAll => None,
            Strategy::FullRecompute => Some(Recompute { local_start: 0, attention: true }),
            Strategy::FullSwap | Strategy::Memo => {
                let swapped_layer = layer + 2 < b.shape.layers;
                (swapped_layer && self.swapped < b.shape.local_rows)
                    .then_some(Recompute { local_start: self.swapped, attention: false })
            }
        }
    }

    /// A new buffer for the gradient of layer `layer`'s output.
    pub fn new_output_gradient(&self, b: &mut Builder, layer: u32) -> BufferId {
        let shape = b.shape;
        b.buffer(
            BufferKind::CrossLayer,
            TensorRole::OutputGradient,
            Some(layer),
            shape.local_rows,
            shape.hidden_row,
            None,
        )
    }

    /// After layer `layer`'s forward: copy its swapped rows to host on the device-to-host stream.
    pub fn swap_out(&self, b: &mut Builder, layer: u32) {
        let slots = &self.host[layer as usize];
        if slots.is_empty() {
            return;
        }
        let set = self.forward[layer as usize];
        let computed = b.record(Stream::Compute);
        b.wait(Stream::DeviceToHost, computed);
        for &(index, slot) in slots {
            let rows = b.rows_of(slot);
            let tensor = TensorRows { layer, role: SKELETAL_ROLES[index].0, start: 0, end: rows };
            b.copy(Stream::DeviceToHost, Region::rows(set.0[index], 0, rows), Region::rows(slot, 0, rows), tensor);
        }
        let done = b.record(Stream::DeviceToHost);
        b.note_swap_out(layer as usize % 2, done);
    }

    /// Before layer `layer`'s backward: wait for its swap-in, if it has one.
    pub fn before_backward(&self, b: &mut Builder, layer: u32) {
        if let Some(event) = self.swapped_in[layer as usize] {
            b.wait(Stream::Compute, event);
        }
    }

    /// After layer `layer`'s backward its rounding buffer is free: bring layer `layer - 2`'s
    /// swapped rows back into it on the host-to-device stream.
    pub fn after_backward(&mut self, b: &mut Builder, layer: u32) {
        let Some(target) = layer.checked_sub(2) else { return };
        let slots = &self.host[target as usize];
        if slots.is_empty() {
            return;
        }
        let set = self.backward[target as usize];
        let released = b.record(Stream::Compute);
        b.wait(Stream::HostToDevice, released);
        for &(index, slot) in slots {
            let rows = b.rows_of(slot);
            let tensor = TensorRows { layer: target, role: SKELETAL_ROLES[index].0, start: 0, end: rows };
            b.copy(Stream::HostToDevice, Region::rows(slot, 0, rows), Region::rows(set.0[index], 0, rows), tensor);
        }
        self.swapped_in[target as usize] = Some(b.record(Stream::HostToDevice));
    }
}

/// Layer `layer`'s forward over every row, writing its output into `output`.
pub(crate) fn forward(
    b: &mut Builder,
    layer: u32,
    p: &LayerParams,
    set: &SkeletalSet,
    output: BufferId,
) -> Result<(), ScheduleError> {
    let block = Block { layer, phase: Phase::Forward };
    forward_ops(b, layer, p, set, Recompute { local_start: 0, attention: true }, Some(output), block)
}

/// The recompute before layer `layer`'s backward.
pub(crate) fn recompute(
    b: &mut Builder,
    layer: u32,
    p: &LayerParams,
    set: &SkeletalSet,
    what: Recompute,
) -> Result<(), ScheduleError> {
    forward_ops(b, layer, p, set, what, None, Block { layer, phase: Phase::Backward })
}

/// The forward's ops over rows `[start, rows)` (the whole forward when `start` is 0); attention
/// only if `what.attention`, FC2 and the residual only when there is an `output` to write.
fn forward_ops(
    b: &mut Builder,
    layer: u32,
    p: &LayerParams,
    set: &SkeletalSet,
    what: Recompute,
    output: Option<BufferId>,
    block: Block,
) -> Result<(), ScheduleError> {
    let shape = b.shape;
    let (l, blk) = (Some(layer), Some(block));
    let (r, full) = (shape.local_rows, shape.full_rows);
    let start = what.local_start;
    let full_start = start * shape.tensor;
    let s = set.0;
    let local = |i: usize| Region::rows(s[i], start, r);
    let head = |i: usize| Region::rows(s[i], full_start, full);

    let (scale, shift) = (b.all(p.norm1_scale.value), b.all(p.norm1_shift.value));
    b.launch(Op::LayerNorm, l, 0, &[local(X), scale, shift, local(N1)]);
    let n1 = b.gathered(local(N1), l, blk);
    for (i, (weight, bias)) in [Q, K, V].into_iter().zip(p.qkv) {
        let flops = b.linear_flops(full - full_start, weight.value)?;
        let (w, bi) = (b.all(weight.value), b.all(bias.value));
        b.launch(Op::Linear, l, flops, &[n1, w, bi, head(i)]);
    }
    if what.attention {
        let (q, k, v, o, lse) = (b.all(s[Q]), b.all(s[K]), b.all(s[V]), b.all(s[O]), b.all(s[LSE]));
        b.launch(Op::Attention, l, shape.attention_flops, &[q, k, v, o, lse]);
    }
    let role = if output.is_some() { TensorRole::ProjectionOutput } else { TensorRole::RecomputedProjectionOutput };
    let projected = b.buffer(BufferKind::Transient, role, l, r - start, shape.hidden_row, blk);
    linear_into(b, layer, block, head(O), p.projection, b.all(projected))?;
    let projected = b.all(projected);
    b.launch(Op::Add, l, 0, &[local(X), projected, local(RES)]);
    let (scale, shift) = (b.all(p.norm2_scale.value), b.all(p.norm2_shift.value));
    b.launch(Op::LayerNorm, l, 0, &[local(RES), scale, shift, local(N2)]);
    let n2 = b.gathered(local(N2), l, blk);
    let flops = b.linear_flops(full - full_start, p.fc1.0.value)?;
    let (w, bi) = (b.all(p.fc1.0.value), b.all(p.fc1.1.value));
    b.launch(Op::Linear, l, flops, &[n2, w, bi, head(F1)]);
    b.launch(Op::Gelu, l, 0, &[head(F1), head(G)]);
    if let Some(output) = output {
        let mlp = b.buffer(BufferKind::Transient, TensorRole::Fc2Output, l, r, shape.hidden_row, blk);
        linear_into(b, layer, block, head(G), p.fc2, b.all(mlp))?;
        let (res, mlp, out) = (b.all(s[RES]), b.all(mlp), b.all(output));
        b.launch(Op::Add, l, 0, &[res, mlp, out]);
    }
    Ok(())
}

/// A row-parallel linear layer from head-sharded `x` into sequence-sharded `dest` (through a
/// partial sum and a reduce-scatter when `t > 1`).
fn linear_into(
    b: &mut Builder,
    layer: u32,
    block: Block,
    x: Region,
    (weight, bias): (Param, Param),
    dest: Region,
) -> Result<(), ScheduleError> {
    let l = Some(layer);
    let partial = b.partial_for(dest, l, Some(block));
    let flops = b.linear_flops(x.end - x.start, weight.value)?;
    let (w, bi) = (b.all(weight.value), b.all(bias.value));
    b.launch(Op::Linear, l, flops, &[x, w, bi, partial]);
    b.scatter(partial, dest, l);
    Ok(())
}

/// Layer `layer`'s backward: from the gradient of its output `d_out` to the gradient of its
/// input, written into `d_in`, and its parameters' gradients.
pub(crate) fn backward(
    b: &mut Builder,
    layer: u32,
    p: &LayerParams,
    set: &SkeletalSet,
    d_out: BufferId,
    d_in: BufferId,
) -> Result<(), ScheduleError> {
    let shape = b.shape;
    let block = Block { layer, phase: Phase::Backward };
    let (l, blk) = (Some(layer), Some(block));
    let (r, full) = (shape.local_rows, shape.full_rows);
    let s = set.0;
    let transient = |b: &mut Builder, role: TensorRole, rows: u64, row_bytes: u64| {
        let id = b.buffer(BufferKind::Transient, role, l, rows, row_bytes, blk);
        b.all(id)
    };

    // MLP: FC2, GeLU, FC1.
    let dy = b.all(d_out);
    let dy_full = b.gathered(dy, l, blk);
    let d_gelu = transient(b, TensorRole::GeluOutputGradient, full, shape.ffn_row);
    backward_input(b, layer, p.fc2.0, dy_full, d_gelu)?;
    backward_weight(b, layer, p.fc2, b.all(s[G]), dy_full)?;
    let d_fc1 = transient(b, TensorRole::Fc1OutputGradient, full, shape.ffn_row);
    let f1 = b.all(s[F1]);
    b.launch(Op::GeluBackward, l, 0, &[f1, d_gelu, d_fc1]);
    let d_norm2 = transient(b, TensorRole::PostAttentionNormOutputGradient, r, shape.hidden_row);
    let partial = b.partial_for(d_norm2, l, blk);
    backward_input(b, layer, p.fc1.0, d_fc1, partial)?;
    b.scatter(partial, d_norm2, l);
    let n2 = b.all(s[N2]);
    let n2 = b.gathered(n2, l, blk);
    backward_weight(b, layer, p.fc1, n2, d_fc1)?;
    let d_res_norm = transient(b, TensorRole::NormInputGradient, r, shape.hidden_row);
    layer_norm_backward(b, layer, b.all(s[RES]), (p.norm2_scale, p.norm2_shift), d_norm2, d_res_norm);
    let d_res = transient(b, TensorRole::AttentionResidualGradient, r, shape.hidden_row);
    b.launch(Op::Add, l, 0, &[dy, d_res_norm, d_res]);

    // Attention: projection, attention, q/k/v.
    let d_res_full = b.gathered(d_res, l, blk);
    let d_attn = transient(b, TensorRole::AttentionOutputGradient, full, shape.head_row);
    backward_input(b, layer, p.projection.0, d_res_full, d_attn)?;
    backward_weight(b, layer, p.projection, b.all(s[O]), d_res_full)?;
    let dq = transient(b, TensorRole::QueryGradient, full, shape.head_row);
    let dk = transient(b, TensorRole::KeyGradient, full, shape.head_row);
    let dv = transient(b, TensorRole::ValueGradient, full, shape.head_row);
    let saved = [Q, K, V, O, LSE].map(|i| b.all(s[i]));
    let attention_backward =
        shape.attention_flops.checked_mul(2).ok_or(ScheduleError::FlopsOverflow { op: "attention backward" })?;
    let args = [saved[0], saved[1], saved[2], saved[3], saved[4], d_attn, dq, dk, dv];
    b.launch(Op::AttentionBackward, l, attention_backward, &args);
    let d_norm1 = transient(b, TensorRole::InputNormOutputGradient, r, shape.hidden_row);
    let partial = b.partial_for(d_norm1, l, blk);
    for (i, (grad, (weight, _))) in [dq, dk, dv].into_iter().zip(p.qkv).enumerate() {
        let op = if i == 0 { Op::LinearBackwardInput } else { Op::LinearBackwardInputAccumulate };
        let flops = b.linear_flops(full, weight.value)?;
        let w = b.all(weight.value);
        b.launch(op, l, flops, &[grad, w, partial]);
    }
    b.scatter(partial, d_norm1, l);
    let n1 = b.all(s[N1]);
    let n1 = b.gathered(n1, l, blk);
    for (grad, linear) in [dq, dk, dv].into_iter().zip(p.qkv) {
        backward_weight(b, layer, linear, n1, grad)?;
    }
    let d_input_norm = transient(b, TensorRole::NormInputGradient, r, shape.hidden_row);
    layer_norm_backward(b, layer, b.all(s[X]), (p.norm1_scale, p.norm1_shift), d_norm1, d_input_norm);
    let d_in = b.all(d_in);
    b.launch(Op::Add, l, 0, &[d_res, d_input_norm, d_in]);
    Ok(())
}

/// A linear layer's input gradient: `dx = dy W`.
fn backward_input(b: &mut Builder, layer: u32, weight: Param, dy: Region, dx: Region) -> Result<(), ScheduleError> {
    let flops = b.linear_flops(dy.end - dy.start, weight.value)?;
    let w = b.all(weight.value);
    b.launch(Op::LinearBackwardInput, Some(layer), flops, &[dy, w, dx]);
    Ok(())
}

/// A linear layer's weight and bias gradients from its input `x` and output gradient `dy`.
fn backward_weight(
    b: &mut Builder,
    layer: u32,
    (weight, bias): (Param, Param),
    x: Region,
    dy: Region,
) -> Result<(), ScheduleError> {
    let flops = b.linear_flops(dy.end - dy.start, weight.value)?;
    let (dw, db) = (b.all(weight.grad), b.all(bias.grad));
    b.launch(Op::LinearBackwardWeight, Some(layer), flops, &[x, dy, dw, db]);
    Ok(())
}

fn layer_norm_backward(b: &mut Builder, layer: u32, x: Region, (scale, shift): (Param, Param), dy: Region, dx: Region) {
    let (s, ds, dsh) = (b.all(scale.value), b.all(scale.grad), b.all(shift.grad));
    b.launch(Op::LayerNormBackward, Some(layer), 0, &[x, s, dy, dx, ds, dsh]);
}
