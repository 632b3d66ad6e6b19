//! A host emulation of the steps of every non-attention recipe, to test the recipes end to end on
//! the CPU: each kernel of `elementwise.cu`, `norm.cu`, `loss.cu` and `optim.cu` is re-stated in
//! Rust from its source (reading its parameters by position, as the kernel does, with the same
//! grid-dependent partitions), GEMMs by a column-major reference, `Zero` as a fill. The result is
//! compared with `runtime-cpu`'s ops on the same inputs.
//!
//! What it proves: the recipes hand each kernel the right arguments, offsets, scratch layout and
//! counts, and the kernels' arithmetic (as re-stated) is the CPU's. What it cannot prove: that
//! the CUDA source does what the re-statement says (that needs a GPU: `runtime-cuda/tests/gpu.rs`).

use half::bf16;

use crate::{scratch_bytes, Param, Step, STATUS_WORDS};

/// Where a pointer parameter points.
#[derive(Clone, Copy, Debug)]
enum Memory {
    Arg(usize),
    Scratch,
    Status,
}

/// A parameter's value.
#[derive(Clone, Copy, Debug)]
enum Value {
    Pointer(Memory, usize),
    Int(u64),
    Float(f32),
}

/// The arguments, the scratch and the status words of one launch.
pub(crate) struct Machine<'a> {
    pub args: &'a mut [Vec<u8>],
    scratch: Vec<u8>,
    pub status: [u32; STATUS_WORDS],
}

impl Machine<'_> {
    fn region(&mut self, memory: Memory) -> &mut Vec<u8> {
        match memory {
            Memory::Arg(index) => &mut self.args[index],
            Memory::Scratch => &mut self.scratch,
            Memory::Status => unreachable!("the status words are accessed through `report`"),
        }
    }

    fn word(&mut self, value: Value, index: usize) -> [u8; 4] {
        let Value::Pointer(memory, offset) = value else { panic!("{value:?} is not a pointer") };
        let bytes = self.region(memory);
        let at = offset + 4 * index;
        [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]
    }

    fn f32(&mut self, value: Value, index: usize) -> f32 {
        f32::from_le_bytes(self.word(value, index))
    }

    fn u32(&mut self, value: Value, index: usize) -> u32 {
        u32::from_le_bytes(self.word(value, index))
    }

    fn set_f32(&mut self, value: Value, index: usize, x: f32) {
        let Value::Pointer(memory, offset) = value else { panic!("{value:?} is not a pointer") };
        let at = offset + 4 * index;
        self.region(memory)[at..at + 4].copy_from_slice(&x.to_le_bytes());
    }

    fn bf16(&mut self, value: Value, index: usize) -> f32 {
        let Value::Pointer(memory, offset) = value else { panic!("{value:?} is not a pointer") };
        let bytes = self.region(memory);
        let at = offset + 2 * index;
        bf16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
    }

    fn set_bf16(&mut self, value: Value, index: usize, x: f32) {
        let Value::Pointer(memory, offset) = value else { panic!("{value:?} is not a pointer") };
        let at = offset + 2 * index;
        self.region(memory)[at..at + 2].copy_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes());
    }

    /// `memo_report`: the first report wins.
    fn report(&mut self, code: u32, instruction: u64, a: u64, b: u64) {
        if self.status[0] == 0 {
            self.status = [code, instruction as u32, a as u32, b as u32];
        }
    }
}

fn int(value: Value) -> usize {
    match value {
        Value::Int(v) => v as usize,
        other => panic!("{other:?} is not an integer"),
    }
}

fn float(value: Value) -> f32 {
    match value {
        Value::Float(v) => v,
        other => panic!("{other:?} is not a float"),
    }
}

fn gelu(x: f32) -> f32 {
    let u = 0.797_884_6 * (x + 0.044_715 * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

fn gelu_derivative(x: f32) -> f32 {
    let u = 0.797_884_6 * (x + 0.044_715 * x * x * x);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.797_884_6 * (1.0 + 3.0 * 0.044_715 * x * x)
}

/// (mean, rstd) of row `row` of `x` (width elements).
fn statistics(m: &mut Machine<'_>, x: Value, row: usize, width: usize) -> (f32, f32) {
    let values: Vec<f32> = (0..width).map(|j| m.bf16(x, row * width + j)).collect();
    let mean = values.iter().sum::<f32>() / width as f32;
    let variance = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width as f32;
    (mean, 1.0 / (variance + 1e-5).sqrt())
}

/// Runs one kernel launch.
fn kernel(m: &mut Machine<'_>, name: &str, grid: [u32; 3], p: &[Value]) {
    match name {
        "memo_embedding_forward" => {
            let (rows, width, vocab) = (int(p[3]), int(p[4]), int(p[5]));
            for row in 0..rows {
                let id = m.u32(p[0], row) as usize;
                for j in 0..width {
                    let value = if id < vocab { m.bf16(p[1], id * width + j) } else { 0.0 };
                    m.set_bf16(p[2], row * width + j, value);
                }
                if id >= vocab {
                    m.report(1, int(p[7]) as u64, row as u64, id as u64);
                }
            }
        }
        "memo_embedding_backward" => {
            let (rows, width, vocab) = (int(p[3]), int(p[4]), int(p[5]));
            let ids: Vec<usize> = (0..rows).map(|r| m.u32(p[0], r) as usize).collect();
            for (row, &id) in ids.iter().enumerate() {
                if id >= vocab {
                    m.report(1, int(p[7]) as u64, row as u64, id as u64);
                }
            }
            assert!(grid[1] as usize * 2048 >= width, "column tiles cover the row");
            for v in 0..vocab {
                for j in 0..width {
                    let mut sum = m.bf16(p[2], v * width + j);
                    for (row, _) in ids.iter().enumerate().filter(|(_, &id)| id == v) {
                        sum += m.bf16(p[1], row * width + j);
                    }
                    m.set_bf16(p[2], v * width + j, sum);
                }
            }
        }
        "memo_gelu_forward" => {
            for i in 0..int(p[2]) {
                let x = m.bf16(p[0], i);
                m.set_bf16(p[1], i, gelu(x));
            }
        }
        "memo_gelu_backward" => {
            for i in 0..int(p[3]) {
                let (x, dy) = (m.bf16(p[0], i), m.bf16(p[1], i));
                m.set_bf16(p[2], i, dy * gelu_derivative(x));
            }
        }
        "memo_add" => {
            for i in 0..int(p[3]) {
                let sum = m.bf16(p[0], i) + m.bf16(p[1], i);
                m.set_bf16(p[2], i, sum);
            }
        }
        "memo_broadcast_row" => {
            let (rows, width) = (int(p[2]), int(p[3]));
            for i in 0..rows * width {
                let value = m.bf16(p[0], i % width);
                m.set_bf16(p[1], i, value);
            }
        }
        "memo_column_sum_partial" => {
            let (rows, width, per_chunk) = (int(p[2]), int(p[3]), int(p[4]));
            assert!(grid[0] as usize * 256 >= width, "column blocks cover the row");
            for chunk in 0..grid[1] as usize {
                for j in 0..width {
                    let begin = chunk * per_chunk;
                    let sum: f32 = (begin..(begin + per_chunk).min(rows)).map(|r| m.bf16(p[0], r * width + j)).sum();
                    m.set_f32(p[1], chunk * width + j, sum);
                }
            }
        }
        "memo_column_sum_finish" => {
            let (chunks, width) = (int(p[2]), int(p[3]));
            for j in 0..width {
                let sum: f32 = (0..chunks).map(|k| m.f32(p[0], k * width + j)).sum();
                m.set_bf16(p[1], j, sum);
            }
        }
        "memo_layer_norm_forward" => {
            let (rows, width) = (int(p[4]), int(p[5]));
            for row in 0..rows {
                let (mean, rstd) = statistics(m, p[0], row, width);
                for j in 0..width {
                    let v = (m.bf16(p[0], row * width + j) - mean) * rstd;
                    let y = v * m.bf16(p[1], j) + m.bf16(p[2], j);
                    m.set_bf16(p[3], row * width + j, y);
                }
            }
        }
        "memo_layer_norm_backward_rows" => {
            let (rows, width) = (int(p[5]), int(p[6]));
            for row in 0..rows {
                let (mean, rstd) = statistics(m, p[0], row, width);
                let mut xhat = vec![0f32; width];
                let mut g = vec![0f32; width];
                for j in 0..width {
                    xhat[j] = (m.bf16(p[0], row * width + j) - mean) * rstd;
                    g[j] = m.bf16(p[2], row * width + j) * m.bf16(p[1], j);
                }
                let mean_g = g.iter().sum::<f32>() / width as f32;
                let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f32>() / width as f32;
                for j in 0..width {
                    m.set_bf16(p[3], row * width + j, rstd * (g[j] - mean_g - xhat[j] * mean_gx));
                }
                m.set_f32(p[4], 2 * row, mean);
                m.set_f32(p[4], 2 * row + 1, rstd);
            }
        }
        "memo_layer_norm_backward_params" => {
            let (rows, width, per_chunk) = (int(p[4]), int(p[5]), int(p[6]));
            let chunks = grid[1] as usize;
            for chunk in 0..chunks {
                for j in 0..width {
                    let (mut ds, mut dsh) = (0f32, 0f32);
                    for r in chunk * per_chunk..((chunk + 1) * per_chunk).min(rows) {
                        let d = m.bf16(p[1], r * width + j);
                        let xhat = (m.bf16(p[0], r * width + j) - m.f32(p[2], 2 * r)) * m.f32(p[2], 2 * r + 1);
                        ds += d * xhat;
                        dsh += d;
                    }
                    m.set_f32(p[3], chunk * width + j, ds);
                    m.set_f32(p[3], (chunks + chunk) * width + j, dsh);
                }
            }
        }
        "memo_cross_entropy" => {
            let (rows, vocab, tokens) = (int(p[3]), int(p[4]), float(p[5]));
            for row in 0..rows {
                let target = m.u32(p[1], row) as usize;
                if target >= vocab {
                    m.report(2, int(p[7]) as u64, row as u64, target as u64);
                    m.set_f32(p[2], row, 0.0);
                    continue;
                }
                let logits: Vec<f32> = (0..vocab).map(|j| m.bf16(p[0], row * vocab + j)).collect();
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = logits.iter().map(|l| (l - max).exp()).sum();
                m.set_f32(p[2], row, max + z.ln() - logits[target]);
                for (j, l) in logits.iter().enumerate() {
                    let q = (l - max).exp() / z;
                    m.set_bf16(p[0], row * vocab + j, if j == target { (q - 1.0) / tokens } else { q / tokens });
                }
            }
        }
        "memo_sum_into_scalar" => {
            let total: f32 = (0..int(p[1])).map(|i| m.f32(p[0], i)).sum();
            let old = m.f32(p[2], 0);
            m.set_f32(p[2], 0, old + total);
        }
        "memo_sum_squares_partial" => {
            let (n, blocks) = (int(p[1]), grid[0] as usize);
            for block in 0..blocks {
                let mut sum = 0f32;
                for i in (0..n).filter(|i| (i / 256) % blocks == block) {
                    let g = m.bf16(p[0], i);
                    sum += g * g;
                }
                m.set_f32(p[2], block, sum);
            }
        }
        "memo_adamw" => {
            let norm_squared = m.f32(p[3], 0);
            if !norm_squared.is_finite() {
                m.report(3, int(p[14]) as u64, u64::from(norm_squared.to_bits()), 0);
                return;
            }
            let (rows, width) = (int(p[4]), int(p[5]));
            let [beta1, beta2, eps, max_norm, step_size, decay, c2] = [6, 7, 8, 9, 10, 11, 12].map(|i| float(p[i]));
            let norm = norm_squared.sqrt();
            let clip = if max_norm > 0.0 && norm > max_norm { max_norm / norm } else { 1.0 };
            for i in 0..rows * width {
                let (row, col) = (i / width, i % width);
                let base = row * 3 * width;
                let g = m.bf16(p[1], i) * clip;
                let mut w = m.f32(p[2], base + col) * decay;
                let first = beta1 * m.f32(p[2], base + width + col) + (1.0 - beta1) * g;
                let second = beta2 * m.f32(p[2], base + 2 * width + col) + (1.0 - beta2) * g * g;
                w -= step_size * first / (second.sqrt() / c2 + eps);
                m.set_f32(p[2], base + col, w);
                m.set_f32(p[2], base + width + col, first);
                m.set_f32(p[2], base + 2 * width + col, second);
                m.set_bf16(p[0], i, w);
            }
        }
        other => panic!("kernel {other} is not emulated"),
    }
}

/// Runs `steps` on the arguments as instruction `instruction`; the status words after.
pub(crate) fn run(steps: &[Step], args: &mut [Vec<u8>], instruction: u32) -> [u32; STATUS_WORDS] {
    let scratch = vec![0u8; scratch_bytes(steps) as usize];
    let mut m = Machine { args, scratch, status: [0; STATUS_WORDS] };
    for step in steps {
        match step {
            Step::Zero { arg } => m.args[*arg].fill(0),
            Step::Gemm(g) => {
                let a_at = |m: &mut Machine<'_>, i: usize, p: usize| {
                    let index = if g.transpose_a { p + i * g.lda as usize } else { i + p * g.lda as usize };
                    m.bf16(Value::Pointer(Memory::Arg(g.a.arg), g.a.byte_offset as usize), index)
                };
                let b_at = |m: &mut Machine<'_>, p: usize, j: usize| {
                    let index = if g.transpose_b { j + p * g.ldb as usize } else { p + j * g.ldb as usize };
                    m.bf16(Value::Pointer(Memory::Arg(g.b.arg), g.b.byte_offset as usize), index)
                };
                let c = Value::Pointer(Memory::Arg(g.c.arg), g.c.byte_offset as usize);
                for j in 0..g.n as usize {
                    for i in 0..g.m as usize {
                        let mut sum = 0f32;
                        for p in 0..g.k as usize {
                            sum += a_at(&mut m, i, p) * b_at(&mut m, p, j);
                        }
                        let at = i + j * g.ldc as usize;
                        let old = if g.beta == 0.0 { 0.0 } else { m.bf16(c, at) };
                        m.set_bf16(c, at, g.alpha * sum + g.beta * old);
                    }
                }
            }
            Step::Kernel(launch) => {
                let values: Vec<Value> = launch
                    .params
                    .iter()
                    .map(|param| match *param {
                        Param::Ptr { arg, byte_offset } => Value::Pointer(Memory::Arg(arg), byte_offset as usize),
                        Param::Scratch { byte_offset } => Value::Pointer(Memory::Scratch, byte_offset as usize),
                        Param::Status => Value::Pointer(Memory::Status, 0),
                        Param::Instruction => Value::Int(u64::from(instruction)),
                        Param::U32(v) => Value::Int(u64::from(v)),
                        Param::U64(v) => Value::Int(v),
                        Param::F32(v) => Value::Float(v),
                    })
                    .collect();
                kernel(&mut m, launch.kernel, launch.grid, &values);
            }
        }
    }
    m.status
}
