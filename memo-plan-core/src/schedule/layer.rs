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
//! The token split: of each sequence-sharded token-split tensor, rows `[0, a)` are swapped and
//! rows `[a, r)` recomputed, `a = floor(alpha * r)`. A head-sharded one holds every rank's rows in
//! token order, rank segment `k` at rows `[k*r, (k+1)*r)`: its rows `k*r + [0, a)` are swapped
//! and `k*r + [a, r)` recomputed, for every `k`, so each row keeps the token it had in the forward
//! (`spec/tensor-parallel.md` section 4).

use alloc::vec::Vec;

use super::{Block, Builder, Param, Phase, ScheduleError};
use crate::model::{Ffn, Norm, BF16_BYTES};
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

/// A norm's parameters: its scale, and its shift under LayerNorm (RMSNorm has none).
#[derive(Clone, Copy)]
pub(crate) struct NormParams {
    scale: Param,
    shift: Option<Param>,
}

impl NormParams {
    /// The norm's replicated vectors, as the architecture's norm kind has them.
    pub fn new(b: &mut Builder, layer: Option<u32>, scale: TensorRole, shift: TensorRole) -> Self {
        let scale = b.norm_param(scale, layer);
        let shift = match b.shape.architecture.norm {
            Norm::LayerNorm => Some(b.norm_param(shift, layer)),
            Norm::RmsNorm => None,
        };
        NormParams { scale, shift }
    }

    /// `y = norm(x)`: `layer_norm` or `rms_norm`.
    pub fn forward(&self, b: &mut Builder, layer: Option<u32>, x: Region, y: Region) {
        let scale = b.all(self.scale.value);
        match self.shift {
            Some(shift) => {
                let shift = b.all(shift.value);
                b.launch(Op::LayerNorm, layer, 0, &[x, scale, shift, y]);
            }
            None => b.launch(Op::RmsNorm, layer, 0, &[x, scale, y]),
        }
    }

    /// The norm's backward from its input `x` and output gradient `dy` into `dx` and the
    /// parameters' gradients.
    pub fn backward(&self, b: &mut Builder, layer: Option<u32>, x: Region, dy: Region, dx: Region) {
        let scale = b.all(self.scale.value);
        match self.shift {
            Some(shift) => {
                let args = [x, scale, dy, dx, self.scale.grad, shift.grad];
                b.launch(Op::LayerNormBackward, layer, 0, &args);
            }
            None => b.launch(Op::RmsNormBackward, layer, 0, &[x, scale, dy, dx, self.scale.grad]),
        }
    }
}

/// A linear layer's weight and, where the architecture has one, its bias.
pub(crate) type Linear = (Param, Option<Param>);

/// One layer's parameters.
pub(crate) struct LayerParams {
    norm1: NormParams,
    /// q, k, v.
    qkv: [Linear; 3],
    projection: Linear,
    norm2: NormParams,
    /// FC1 (SwiGLU: gate and up, one product of `2f/t` outputs per rank).
    fc1: Linear,
    /// FC2 (SwiGLU: down).
    fc2: Linear,
}

impl LayerParams {
    pub fn new(b: &mut Builder, layer: u32) -> Self {
        let shape = b.shape;
        let (h, t) = (shape.hidden, shape.tensor);
        let biases = shape.architecture.biases;
        let l = Some(layer);
        // Column-parallel: this GPU's output rows of the weight and of the bias.
        let linear = |b: &mut Builder, weight: TensorRole, bias: TensorRole, out: u64, with_bias: bool| {
            (b.param(weight, l, out, h), with_bias.then(|| b.param(bias, l, 1, out)))
        };
        // Row-parallel: every GPU holds all h outputs over its inputs, and the whole bias.
        let row_parallel = |b: &mut Builder, weight: TensorRole, bias: TensorRole, inp: u64, with_bias: bool| {
            (b.param(weight, l, h, inp), with_bias.then(|| b.replicated_param(bias, l, 1, h)))
        };
        // K and V: a column-parallel share of the heads, or (t > kv_heads) every head on every
        // rank, their gradients summed over the ranks (spec/tensor-parallel.md section 8).
        let key_value = |b: &mut Builder, weight: TensorRole, bias: TensorRole| {
            if shape.kv_replicated {
                let kv = shape.kv_width;
                (
                    b.replicated_rows_param(weight, l, kv, h),
                    biases.qkv().then(|| b.replicated_rows_param(bias, l, 1, kv)),
                )
            } else {
                linear(b, weight, bias, shape.kv_width, biases.qkv())
            }
        };
        let fc1_out = shape.fc1_row / BF16_BYTES;
        LayerParams {
            norm1: NormParams::new(b, l, TensorRole::NormScale1, TensorRole::NormShift1),
            qkv: [
                linear(b, TensorRole::QueryWeight, TensorRole::QueryBias, h / t, biases.qkv()),
                key_value(b, TensorRole::KeyWeight, TensorRole::KeyBias),
                key_value(b, TensorRole::ValueWeight, TensorRole::ValueBias),
            ],
            projection: row_parallel(
                b,
                TensorRole::ProjectionWeight,
                TensorRole::ProjectionBias,
                h / t,
                biases.output_and_ffn(),
            ),
            norm2: NormParams::new(b, l, TensorRole::NormScale2, TensorRole::NormShift2),
            fc1: linear(b, TensorRole::Fc1Weight, TensorRole::Fc1Bias, fc1_out, biases.output_and_ffn()),
            fc2: row_parallel(b, TensorRole::Fc2Weight, TensorRole::Fc2Bias, shape.ffn / t, biases.output_and_ffn()),
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
            (TensorRole::Key | TensorRole::Value, _) => shape.kv_row,
            (TensorRole::Fc1Output, _) => shape.fc1_row,
            (TensorRole::GeluOutput, _) => shape.ffn_row,
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
                    // One slot per run of swapped rows: a sequence-sharded tensor swaps rows
                    // [0, a); a head-sharded one rows k*r + [0, a) of every rank segment k (all
                    // rows, one run, when a = r), so each row keeps its token.
                    for (first, end) in swapped_runs(&shape, rows, split, swapped) {
                        let slot =
                            b.buffer(BufferKind::HostSlot, role, Some(l), end - first, row_bytes(role, rows), None);
                        b.set_first_row(slot, first);
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
            let (first, rows) = (b.first_row_of(slot), b.rows_of(slot));
            let tensor = TensorRows { layer, role: SKELETAL_ROLES[index].0, start: first, end: first + rows };
            let device = Region::rows(set.0[index], first, first + rows);
            b.copy(Stream::DeviceToHost, device, Region::rows(slot, 0, rows), tensor);
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
            let (first, rows) = (b.first_row_of(slot), b.rows_of(slot));
            let tensor = TensorRows { layer: target, role: SKELETAL_ROLES[index].0, start: first, end: first + rows };
            let device = Region::rows(set.0[index], first, first + rows);
            b.copy(Stream::HostToDevice, Region::rows(slot, 0, rows), device, tensor);
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

/// The forward's ops over the rows not swapped (the whole forward when `what.local_start` is 0);
/// attention only if `what.attention`, FC2 and the residual only when there is an `output` to
/// write.
///
/// Rows: sequence-sharded tensors `[a, r)`; head-sharded ones hold every rank's rows in token
/// order, so their recomputed rows are the rank segments `k*r + [a, r)` for every `k`
/// ([`head_segments`]), written one launch per segment from the matching share of the gathered
/// input (`spec/tensor-parallel.md` section 4). With `t = 1` or `a = 0` that is one launch.
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
    let r = shape.local_rows;
    let start = what.local_start;
    let s = set.0;
    let local = |i: usize| Region::rows(s[i], start, r);
    let segments = |i: usize| head_segments(&shape, s[i], start);

    p.norm1.forward(b, l, local(X), local(N1));
    let n1 = b.gathered(local(N1), l, blk);
    for (i, linear) in [Q, K, V].into_iter().zip(p.qkv) {
        for (x, y) in shares(n1, &segments(i)) {
            column_parallel(b, layer, linear, x, y)?;
        }
    }
    if shape.context > 1 {
        // Context parallelism: the ring carries rotated keys, so rotary moves out of attention
        // to right after the projections (and the swap-out copies rotated rows).
        for i in [Q, K] {
            super::ring::rotary(b, layer, &segments(i));
        }
    }
    if what.attention {
        let (q, k, v, o, lse) = (b.all(s[Q]), b.all(s[K]), b.all(s[V]), b.all(s[O]), b.all(s[LSE]));
        if shape.context > 1 {
            super::ring::forward(b, layer, block, [q, k, v, o, lse])?;
        } else {
            b.launch(Op::Attention, l, shape.attention_flops, &[q, k, v, o, lse]);
        }
    }
    let role = if output.is_some() { TensorRole::ProjectionOutput } else { TensorRole::RecomputedProjectionOutput };
    let projected = b.buffer(BufferKind::Transient, role, l, r - start, shape.hidden_row, blk);
    let projected = b.all(projected);
    b.row_parallel(l, blk, &segments(O), p.projection, projected)?;
    b.launch(Op::Add, l, 0, &[local(X), projected, local(RES)]);
    p.norm2.forward(b, l, local(RES), local(N2));
    let n2 = b.gathered(local(N2), l, blk);
    for (x, y) in shares(n2, &segments(F1)) {
        column_parallel(b, layer, p.fc1, x, y)?;
    }
    let activation = activation_op(&shape, false);
    for (f1, g) in segments(F1).into_iter().zip(segments(G)) {
        b.launch(activation, l, 0, &[f1, g]);
    }
    if let Some(output) = output {
        let mlp = b.buffer(BufferKind::Transient, TensorRole::Fc2Output, l, r, shape.hidden_row, blk);
        let mlp = b.all(mlp);
        b.row_parallel(l, blk, &segments(G), p.fc2, mlp)?;
        let (res, out) = (b.all(s[RES]), b.all(output));
        b.launch(Op::Add, l, 0, &[res, mlp, out]);
    }
    Ok(())
}

/// A column-parallel product `y = x W^T (+ bias)`: `linear`, or `linear_no_bias` without a bias.
fn column_parallel(
    b: &mut Builder,
    layer: u32,
    (weight, bias): Linear,
    x: Region,
    y: Region,
) -> Result<(), ScheduleError> {
    let flops = b.linear_flops(y.end - y.start, weight.value)?;
    let w = b.all(weight.value);
    match bias {
        Some(bias) => {
            let bias = b.all(bias.value);
            b.launch(Op::Linear, Some(layer), flops, &[x, w, bias, y]);
        }
        None => b.launch(Op::LinearNoBias, Some(layer), flops, &[x, w, y]),
    }
    Ok(())
}

/// The FFN's activation (`gelu` or `swiglu`), or its backward.
fn activation_op(shape: &super::Shape, backward: bool) -> Op {
    match (shape.architecture.ffn, backward) {
        (Ffn::Gelu, false) => Op::Gelu,
        (Ffn::Gelu, true) => Op::GeluBackward,
        (Ffn::SwiGlu, false) => Op::Swiglu,
        (Ffn::SwiGlu, true) => Op::SwigluBackward,
    }
}

/// The rows of head-sharded tensor `buffer` that hold the tokens of sequence-sharded rows
/// `[start, r)` of every rank: the segments `k*r + [start, r)`, `k` in rank order, or one region
/// `[0, R)` when `start` is 0 (the segments then meet).
pub(crate) fn head_segments(shape: &super::Shape, buffer: BufferId, start: u64) -> Vec<Region> {
    let r = shape.local_rows;
    if start == 0 || shape.tensor == 1 {
        return alloc::vec![Region::rows(buffer, start * shape.tensor, shape.full_rows)];
    }
    (0..shape.tensor).map(|k| Region::rows(buffer, k * r + start, (k + 1) * r)).collect()
}

/// Rows `[first, end)` of each run of swapped rows of a skeletal tensor (`a = swapped` rows of
/// each sequence-sharded shard): `[0, rows)` for a tensor swapped whole, `[0, a)` for a
/// sequence-sharded token-split one, `k*r + [0, a)` for every rank segment `k` of a head-sharded
/// one (one run `[0, R)` when `a = r`). Empty runs are left out.
pub(crate) fn swapped_runs(shape: &super::Shape, rows: Rows, split: bool, swapped: u64) -> Vec<(u64, u64)> {
    let r = shape.local_rows;
    let runs = match (split, rows) {
        (false, Rows::SequenceSharded) => alloc::vec![(0, r)],
        (false, Rows::HeadSharded) => alloc::vec![(0, shape.full_rows)],
        (true, Rows::SequenceSharded) => alloc::vec![(0, swapped)],
        (true, Rows::HeadSharded) if swapped >= r || shape.tensor == 1 => {
            alloc::vec![(0, swapped.min(r) * shape.tensor)]
        }
        (true, Rows::HeadSharded) => (0..shape.tensor).map(|k| (k * r, k * r + swapped)).collect(),
    };
    runs.into_iter().filter(|(first, end)| end > first).collect()
}

/// Pairs each head-sharded segment with its share of the gathered input `x` (the segments' rows
/// back to back, rank-major, as the all-gather lays them out).
fn shares(x: Region, segments: &[Region]) -> Vec<(Region, Region)> {
    let mut at = x.start;
    segments
        .iter()
        .map(|&y| {
            let rows = y.end - y.start;
            let share = Region::rows(x.buffer, at, at + rows);
            at += rows;
            (share, y)
        })
        .collect()
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
    let d_fc1 = transient(b, TensorRole::Fc1OutputGradient, full, shape.fc1_row);
    let f1 = b.all(s[F1]);
    b.launch(activation_op(&shape, true), l, 0, &[f1, d_gelu, d_fc1]);
    let d_norm2 = transient(b, TensorRole::PostAttentionNormOutputGradient, r, shape.hidden_row);
    let partial = b.partial_for(d_norm2, l, blk);
    backward_input(b, layer, p.fc1.0, d_fc1, partial)?;
    b.scatter(partial, d_norm2, l);
    let n2 = b.all(s[N2]);
    let n2 = b.gathered(n2, l, blk);
    backward_weight(b, layer, p.fc1, n2, d_fc1)?;
    let d_res_norm = transient(b, TensorRole::NormInputGradient, r, shape.hidden_row);
    let res = b.all(s[RES]);
    p.norm2.backward(b, l, res, d_norm2, d_res_norm);
    let d_res = transient(b, TensorRole::AttentionResidualGradient, r, shape.hidden_row);
    b.launch(Op::Add, l, 0, &[dy, d_res_norm, d_res]);

    // Attention: projection, attention, q/k/v.
    let d_res_full = b.gathered(d_res, l, blk);
    let d_attn = transient(b, TensorRole::AttentionOutputGradient, full, shape.head_row);
    backward_input(b, layer, p.projection.0, d_res_full, d_attn)?;
    backward_weight(b, layer, p.projection, b.all(s[O]), d_res_full)?;
    let dq = transient(b, TensorRole::QueryGradient, full, shape.head_row);
    let dk = transient(b, TensorRole::KeyGradient, full, shape.kv_row);
    let dv = transient(b, TensorRole::ValueGradient, full, shape.kv_row);
    let saved = [Q, K, V, O, LSE].map(|i| b.all(s[i]));
    let attention_backward =
        shape.attention_flops.checked_mul(2).ok_or(ScheduleError::FlopsOverflow { op: "attention backward" })?;
    let args = [saved[0], saved[1], saved[2], saved[3], saved[4], d_attn, dq, dk, dv];
    if shape.context > 1 {
        super::ring::backward(b, layer, block, args)?;
    } else {
        b.launch(Op::AttentionBackward, l, attention_backward, &args);
    }
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
    let x = b.all(s[X]);
    p.norm1.backward(b, l, x, d_norm1, d_input_norm);
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

/// A linear layer's weight (and bias) gradients from its input `x` and output gradient `dy`.
fn backward_weight(
    b: &mut Builder,
    layer: u32,
    (weight, bias): Linear,
    x: Region,
    dy: Region,
) -> Result<(), ScheduleError> {
    let flops = b.linear_flops(dy.end - dy.start, weight.value)?;
    match bias {
        Some(bias) => b.launch(Op::LinearBackwardWeight, Some(layer), flops, &[x, dy, weight.grad, bias.grad]),
        None => b.launch(Op::LinearBackwardWeightNoBias, Some(layer), flops, &[x, dy, weight.grad]),
    }
    Ok(())
}
