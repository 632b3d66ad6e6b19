//! An interpreter of recorded graphs in f64 (tests only): every tensor is memory addressed by
//! its own dims and strides, so strided views, transposes by strides and reshapes mean what
//! they mean to cuDNN; element types are ignored (everything is f64), so the graphs'
//! mathematics is checked, not their roundings.

use std::collections::HashMap;

use super::graph::{GraphId, OpId, Operation, PointwiseMode, ReduceOp, Tensor, Uid};
use super::record::Recorder;

/// Memory of the non-virtual tensors by uid (inputs read, outputs written); by-value scalars are
/// one element.
pub type Bindings = HashMap<Uid, Vec<f64>>;

/// Elements a tensor's memory spans.
fn span(t: &Tensor) -> usize {
    if t.dims.iter().any(|&d| d <= 0) {
        return 0;
    }
    1 + t.dims.iter().zip(t.strides).map(|(&d, s)| ((d - 1) * s) as usize).sum::<usize>()
}

fn offset(t: &Tensor, index: [usize; 4]) -> usize {
    index.iter().zip(t.strides).map(|(&i, s)| i * s as usize).sum()
}

/// Every index of `dims`, in row-major order.
fn indices(dims: [i64; 4]) -> impl Iterator<Item = [usize; 4]> {
    let d = dims.map(|x| x.max(0) as usize);
    (0..d[0]).flat_map(move |a| {
        (0..d[1]).flat_map(move |b| (0..d[2]).flat_map(move |c| (0..d[3]).map(move |e| [a, b, c, e])))
    })
}

/// Whether distinct indices of `t` have distinct offsets (strides describe a memory layout).
fn injective(t: &Tensor) -> bool {
    let mut axes: Vec<(i64, i64)> =
        t.dims.iter().zip(t.strides).filter(|(&d, _)| d > 1).map(|(&d, s)| (s, d)).collect();
    axes.sort_unstable();
    let mut extent = 1;
    for (stride, dim) in axes {
        if stride < extent {
            return false;
        }
        extent = stride * dim;
    }
    true
}

/// Runs graph `graph` of `recording`. Virtual tensors live in the interpreter; non-virtual ones
/// in `bound` (outputs must be bound too, with their memory's size).
pub fn run(recording: &Recorder, graph: GraphId, bound: &mut Bindings) -> Result<(), String> {
    let mut machine = Machine {
        tensors: recording.tensors().into_iter().map(|t| (t.uid, t)).collect(),
        operations: recording.operations(),
        recording,
        virtuals: HashMap::new(),
        bound,
    };
    let ops = recording.graph(graph).ok_or("no such graph")?.to_vec();
    for op in ops {
        machine.execute(op)?;
    }
    Ok(())
}

struct Machine<'a> {
    tensors: HashMap<Uid, Tensor>,
    operations: Vec<Operation>,
    recording: &'a Recorder,
    virtuals: HashMap<Uid, Vec<f64>>,
    bound: &'a mut Bindings,
}

impl Machine<'_> {
    fn tensor(&self, uid: Uid) -> Result<Tensor, String> {
        self.tensors.get(&uid).copied().ok_or_else(|| format!("tensor {uid} used but never declared"))
    }

    fn memory(&self, uid: Uid) -> Result<&Vec<f64>, String> {
        let t = self.tensor(uid)?;
        let memory = if t.is_virtual { self.virtuals.get(&uid) } else { self.bound.get(&uid) };
        let memory = memory.ok_or_else(|| format!("tensor {uid} ({}) read before it is written or bound", t.name))?;
        if memory.len() < span(&t) {
            return Err(format!(
                "tensor {uid} ({}) has {} elements of memory, its strides span {}",
                t.name,
                memory.len(),
                span(&t)
            ));
        }
        Ok(memory)
    }

    /// `uid` broadcast to `dims`, row-major (one lookup of its memory, then strided reads).
    fn gather(&self, uid: Uid, dims: [i64; 4]) -> Result<Vec<f64>, String> {
        self.gather_as(uid, dims, false)
    }

    /// [`Machine::gather`], and when `grouped` (a matmul's or the fused operation's operands) a
    /// batch dim (0 or 1) of `have` that divides the wanted `want` is read in groups: index `i`
    /// reads `i / (want / have)` (grouped-query attention: query head `i` reads K/V head
    /// `i / (h_q / h_kv)`).
    fn gather_as(&self, uid: Uid, dims: [i64; 4], grouped: bool) -> Result<Vec<f64>, String> {
        let t = self.tensor(uid)?;
        let mut divisors = [1usize; 4];
        for (axis, (&have, &want)) in t.dims.iter().zip(&dims).enumerate() {
            if have == 1 {
                divisors[axis] = usize::MAX;
            } else if grouped && axis < 2 && have > 0 && want % have == 0 {
                divisors[axis] = (want / have) as usize;
            } else if have != want {
                return Err(format!("tensor {uid} ({}) dim {axis} is {have}, not 1 or {want}", t.name));
            }
        }
        let memory = self.memory(uid)?;
        Ok(indices(dims)
            .map(|index| {
                let mut at = [0usize; 4];
                for axis in 0..4 {
                    at[axis] = index[axis].checked_div(divisors[axis]).unwrap_or(0);
                }
                memory[offset(&t, at)]
            })
            .collect())
    }

    /// Writes `values` (row-major over `uid`'s dims) into `uid`'s memory.
    fn write(&mut self, uid: Uid, values: Vec<f64>) -> Result<(), String> {
        let t = self.tensor(uid)?;
        if t.by_value {
            return Err(format!("tensor {uid} ({}) is a by-value scalar and cannot be written", t.name));
        }
        if !injective(&t) {
            return Err(format!("tensor {uid} ({}): strides {:?} overlap for dims {:?}", t.name, t.strides, t.dims));
        }
        let memory = if t.is_virtual {
            self.virtuals.entry(uid).or_insert_with(|| vec![f64::NAN; span(&t)])
        } else {
            self.bound.get_mut(&uid).ok_or_else(|| format!("output {uid} ({}) is not bound", t.name))?
        };
        if memory.len() < span(&t) {
            return Err(format!(
                "output {uid} ({}) has {} elements of memory, needs {}",
                t.name,
                memory.len(),
                span(&t)
            ));
        }
        for (index, value) in indices(t.dims).zip(values) {
            memory[offset(&t, index)] = value;
        }
        Ok(())
    }

    fn execute(&mut self, id: OpId) -> Result<(), String> {
        let op = *self.operations.get(id.0).ok_or_else(|| format!("no operation {}", id.0))?;
        match op {
            Operation::Pointwise { mode, x, b, t, y, axis, .. } => {
                let dims = self.tensor(y)?.dims;
                let input = |uid: Option<Uid>| -> Result<Vec<f64>, String> {
                    self.gather(uid.ok_or_else(|| format!("{} needs another input", mode.name()))?, dims)
                };
                let values: Vec<f64> = match mode {
                    PointwiseMode::GenIndex => {
                        let axis = axis.ok_or("gen_index without an axis")?;
                        let axis = usize::try_from(axis).ok().filter(|&a| a < 4).ok_or("gen_index axis beyond 3")?;
                        indices(dims).map(|index| index[axis] as f64).collect()
                    }
                    PointwiseMode::Exp => input(Some(x))?.iter().map(|v| v.exp()).collect(),
                    PointwiseMode::Log => input(Some(x))?.iter().map(|v| v.ln()).collect(),
                    PointwiseMode::Identity => input(Some(x))?,
                    PointwiseMode::BinarySelect => {
                        let (vx, vb, vt) = (input(Some(x))?, input(b)?, input(t)?);
                        vx.iter().zip(vb).zip(vt).map(|((&x, b), t)| if t != 0.0 { x } else { b }).collect()
                    }
                    binary => {
                        let (vx, vb) = (input(Some(x))?, input(b)?);
                        let f: fn(f64, f64) -> f64 = match binary {
                            PointwiseMode::Add => |x, b| x + b,
                            PointwiseMode::Sub => |x, b| x - b,
                            PointwiseMode::Mul => |x, b| x * b,
                            PointwiseMode::Div => |x, b| x / b,
                            _ => |x, b| f64::from(u8::from(x >= b)),
                        };
                        vx.iter().zip(vb).map(|(&x, b)| f(x, b)).collect()
                    }
                };
                self.write(y, values)
            }
            Operation::Matmul { a, b, c } => {
                let (ta, tb, tc) = (self.tensor(a)?, self.tensor(b)?, self.tensor(c)?);
                let (m, k, n) = (tc.dims[2], ta.dims[3], tc.dims[3]);
                if ta.dims[2] != m || tb.dims[2] != k || tb.dims[3] != n {
                    return Err(format!("matmul {:?} x {:?} -> {:?}", ta.dims, tb.dims, tc.dims));
                }
                let (ga, gb) = (
                    self.gather_as(a, [tc.dims[0], tc.dims[1], m, k], true)?,
                    self.gather_as(b, [tc.dims[0], tc.dims[1], k, n], true)?,
                );
                let (m, k, n) = (m as usize, k as usize, n as usize);
                let mut values = Vec::new();
                for index in indices(tc.dims) {
                    let batch = (index[0] * tc.dims[1] as usize + index[1]) * m;
                    let row = &ga[(batch + index[2]) * k..(batch + index[2] + 1) * k];
                    let column = (batch / m) * k * n + index[3];
                    values.push(row.iter().enumerate().map(|(kk, &x)| x * gb[column + kk * n]).sum());
                }
                self.write(c, values)
            }
            Operation::Reduction { op, x, y } => {
                let (tx, ty) = (self.tensor(x)?, self.tensor(y)?);
                // An output dim of 1 sums the axis; one that divides the input's sums groups of
                // consecutive indices (the frontend's per-group dK and dV: query heads
                // `g * j .. g * (j + 1)` into K/V head `j`); equal dims are kept.
                for axis in 0..4 {
                    if ty.dims[axis] <= 0 || tx.dims[axis] % ty.dims[axis] != 0 {
                        return Err(format!("reduction {:?} -> {:?}", tx.dims, ty.dims));
                    }
                }
                let start = match op {
                    ReduceOp::Max => f64::NEG_INFINITY,
                    ReduceOp::Add => 0.0,
                };
                let mut out: Vec<f64> = indices(ty.dims).map(|_| start).collect();
                let ydims = ty.dims.map(|d| d as usize);
                let groups: Vec<usize> = (0..4).map(|axis| (tx.dims[axis] / ty.dims[axis]) as usize).collect();
                let vx = self.gather(x, tx.dims)?;
                for (index, v) in indices(tx.dims).zip(vx) {
                    let mut at = 0;
                    for axis in 0..4 {
                        at = at * ydims[axis] + index[axis] / groups[axis];
                    }
                    out[at] = match op {
                        ReduceOp::Max => out[at].max(v),
                        ReduceOp::Add => out[at] + v,
                    };
                }
                self.write(y, out)
            }
            Operation::Reshape { x, y } => {
                let ty = self.tensor(y)?;
                let memory = self.memory(x)?.clone();
                if memory.len() < span(&ty) {
                    return Err(format!("reshape into {} elements from {}", span(&ty), memory.len()));
                }
                if !ty.is_virtual {
                    return Err("reshape into a non-virtual tensor".into());
                }
                self.virtuals.insert(y, memory);
                Ok(())
            }
            Operation::DiagonalBandMask { x, fill, y } => {
                let dims = self.tensor(y)?.dims;
                let (vx, vf) = (self.gather(x, dims)?, self.gather(fill, dims)?);
                let values =
                    indices(dims).zip(vx.into_iter().zip(vf)).map(|(i, (x, f))| if i[2] >= i[3] { x } else { f });
                self.write(y, values.collect())
            }
            Operation::Softmax { x, y, stats } => {
                let tx = self.tensor(x)?;
                let dims = tx.dims;
                let cols = dims[3] as usize;
                let (mut probabilities, mut lse) = (Vec::new(), Vec::new());
                let vx = self.gather(x, dims)?;
                for row in vx.chunks_exact(cols.max(1)) {
                    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
                    probabilities.extend(row.iter().map(|v| (v - max).exp() / sum));
                    lse.push(max + sum.ln());
                }
                self.write(y, probabilities)?;
                self.write(stats, lse)
            }
            Operation::SdpaForward { q, k, v, o, scale, softmax, mask, mask_input, mask_output } => {
                let Operation::Softmax { x: softmax_x, y: softmax_y, .. } =
                    *self.operations.get(softmax.0).ok_or("sdpa_fwd: no softmax operation")?
                else {
                    return Err("sdpa_fwd: its softmax is another operation".into());
                };
                let (tq, to) = (self.tensor(q)?, self.tensor(o)?);
                let dims = self.tensor(mask_input)?.dims;
                let (rows, d) = (dims[2] as usize, tq.dims[3] as usize);
                let s = self.gather(scale, [1; 4])?.first().copied().ok_or("sdpa_fwd: no scale")?;
                let (vq, vk, vv) =
                    (self.gather(q, tq.dims)?, self.gather_as(k, tq.dims, true)?, self.gather_as(v, to.dims, true)?);
                let mut scores = Vec::new();
                for index in indices(dims) {
                    let head = (index[0] * dims[1] as usize + index[1]) * rows;
                    let (qi, kj) = ((head + index[2]) * d, (head + index[3]) * d);
                    scores.push(s * (0..d).map(|c| vq[qi + c] * vk[kj + c]).sum::<f64>());
                }
                self.write(mask_input, scores)?;
                for op in self.recording.graph(mask).ok_or("sdpa_fwd: no mask subgraph")?.to_vec() {
                    self.execute(op)?;
                }
                let masked = self.memory(mask_output)?.clone();
                self.virtuals.insert(softmax_x, masked);
                self.execute(softmax)?;
                let p = self.gather(softmax_y, dims)?;
                let mut out = Vec::new();
                for index in indices(to.dims) {
                    let head = (index[0] * dims[1] as usize + index[1]) * rows;
                    let pi = (head + index[2]) * rows;
                    out.push((0..rows).map(|j| p[pi + j] * vv[(head + j) * d + index[3]]).sum::<f64>());
                }
                self.write(o, out)
            }
        }
    }
}
