//! A [`GraphBuilder`] that records what it is asked to build, in order, and writes it as text
//! (one line per descriptor): the golden files `runtime-cuda/tests/golden/attention-*.txt` are
//! these texts, and the interpreter of the tests runs the recorded operations.

use std::convert::Infallible;
use std::fmt::Write;

use super::graph::{GraphBuilder, GraphId, OpId, Operation, ReduceOp, Tensor, ALIGNMENT};

/// One descriptor built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A tensor descriptor.
    Tensor(Tensor),
    /// An operation descriptor (its [`OpId`] is its index among the operations).
    Operation(Operation),
    /// An operation graph (its [`GraphId`] is its index among the graphs).
    Graph {
        /// Its operations.
        ops: Vec<OpId>,
        /// Executed (true) or a subgraph.
        main: bool,
    },
}

/// Records every descriptor built through it.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    /// The descriptors, in order.
    pub events: Vec<Event>,
    operations: usize,
    graphs: usize,
}

impl Recorder {
    /// The operations, indexed by [`OpId`].
    pub fn operations(&self) -> Vec<Operation> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Operation(op) => Some(*op),
                _ => None,
            })
            .collect()
    }

    /// The tensors declared, in order.
    pub fn tensors(&self) -> Vec<Tensor> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Tensor(t) => Some(*t),
                _ => None,
            })
            .collect()
    }

    /// The operations of graph `id`.
    pub fn graph(&self, id: GraphId) -> Option<&[OpId]> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Graph { ops, .. } => Some(ops.as_slice()),
                _ => None,
            })
            .nth(id.0)
    }

    /// The recording as text, one descriptor a line.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let (mut op_index, mut graph_index) = (0, 0);
        for event in &self.events {
            match event {
                Event::Tensor(t) => {
                    let kind = if t.by_value {
                        " by_value"
                    } else if t.is_virtual {
                        " virtual"
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        out,
                        "tensor {} {} {} dims={:?} strides={:?} align={ALIGNMENT}{kind}",
                        t.uid,
                        t.name,
                        t.dtype.name(),
                        t.dims,
                        t.strides
                    );
                }
                Event::Operation(op) => {
                    let _ = writeln!(out, "op {op_index} {}", describe(op));
                    op_index += 1;
                }
                Event::Graph { ops, main } => {
                    let ids: Vec<usize> = ops.iter().map(|o| o.0).collect();
                    let kind = if *main { "main" } else { "subgraph" };
                    let _ = writeln!(out, "graph {graph_index} {kind} ops={ids:?}");
                    graph_index += 1;
                }
            }
        }
        out
    }
}

/// One operation's line (after its index).
fn describe(op: &Operation) -> String {
    match *op {
        Operation::Pointwise { mode, x, b, t, y, axis, precision } => {
            let mut line = format!("pointwise {} x={x}", mode.name());
            if let Some(b) = b {
                let _ = write!(line, " b={b}");
            }
            if let Some(t) = t {
                let _ = write!(line, " t={t}");
            }
            let _ = write!(line, " y={y}");
            if let Some(axis) = axis {
                let _ = write!(line, " axis={axis}");
            }
            let _ = write!(line, " precision={}", precision.name());
            line
        }
        Operation::Matmul { a, b, c } => format!("matmul a={a} b={b} c={c} compute=f32"),
        Operation::Reduction { op, x, y } => {
            let name = match op {
                ReduceOp::Max => "max",
                ReduceOp::Add => "add",
            };
            format!("reduction {name} x={x} y={y} compute=f32")
        }
        Operation::Reshape { x, y } => format!("reshape x={x} y={y}"),
        Operation::DiagonalBandMask { x, fill, y } => {
            format!("diagonal_band_mask x={x} fill={fill} y={y} comparison=cmp_ge right_bound=0")
        }
        Operation::Softmax { x, y, stats } => format!("softmax x={x} y={y} stats={stats}"),
        Operation::SdpaForward { q, k, v, o, scale, softmax, mask, mask_input, mask_output } => format!(
            "sdpa_fwd q={q} k={k} v={v} o={o} scale={scale} softmax=op{} subgraph=graph{} subgraph_input={mask_input} \
             subgraph_output={mask_output}",
            softmax.0, mask.0
        ),
    }
}

impl GraphBuilder for Recorder {
    type Error = Infallible;

    fn tensor(&mut self, tensor: &Tensor) -> Result<(), Infallible> {
        self.events.push(Event::Tensor(*tensor));
        Ok(())
    }

    fn operation(&mut self, op: &Operation) -> Result<OpId, Infallible> {
        self.events.push(Event::Operation(*op));
        self.operations += 1;
        Ok(OpId(self.operations - 1))
    }

    fn graph(&mut self, ops: &[OpId], main: bool) -> Result<GraphId, Infallible> {
        self.events.push(Event::Graph { ops: ops.to_vec(), main });
        self.graphs += 1;
        Ok(GraphId(self.graphs - 1))
    }
}
