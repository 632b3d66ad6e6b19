//! A host emulation of the steps of every non-attention recipe, to test the recipes end to end on
//! the CPU: each kernel of `elementwise.cu`, `norm.cu`, `loss.cu`, `optim.cu` and `rope.cu` is re-stated in
//! Rust from its source (reading its parameters by the names its declaration gives them, with the
//! same grid-dependent partitions), GEMMs by a column-major reference, `Zero` as a fill. The
//! result is compared with `runtime-cpu`'s ops on the same inputs.
//!
//! What it proves: the recipes hand each kernel the right arguments, offsets, scratch layout and
//! counts, and the kernels' arithmetic (as re-stated) is the CPU's. What it cannot prove: that
//! the CUDA source does what the re-statement says (that needs a GPU: `runtime-cuda/tests/gpu.rs`).

use half::bf16;

use crate::{scratch_bytes, Param, Step, SOURCES, STATUS_WORDS};

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

/// Kernel `name`'s parameters as its source declares them (`const memo_bf16* x`), in order.
/// The declaration is the one definition of their order: the emulation reads each parameter by
/// the name it has there, and `tests.rs` checks each launch's parameter kinds against it.
pub(crate) fn declared_parameters(name: &str) -> Vec<&'static str> {
    let source = SOURCES.iter().find(|s| s.kernels.contains(&name)).unwrap_or_else(|| panic!("{name} in no source"));
    let start = source.text.find(&format!("{name}(")).unwrap_or_else(|| panic!("{name} not defined")) + name.len() + 1;
    let end = start + source.text[start..].find(')').expect("closing parenthesis");
    source.text[start..end].split(',').map(str::trim).collect()
}

/// A parameter's name: the last word of its declaration.
fn parameter_name(declaration: &'static str) -> &'static str {
    declaration.rsplit(|c: char| c.is_whitespace() || c == '*').next().unwrap_or(declaration)
}

/// One launch's parameter values, by their names in the kernel's declaration.
struct Params<'a> {
    kernel: &'a str,
    values: Vec<(&'static str, Value)>,
}

impl Params<'_> {
    fn get(&self, name: &str) -> Value {
        let found = self.values.iter().find(|(declared, _)| *declared == name);
        found.map(|&(_, value)| value).unwrap_or_else(|| panic!("{} has no parameter `{name}`", self.kernel))
    }

    fn int(&self, name: &str) -> usize {
        int(self.get(name))
    }

    fn float(&self, name: &str) -> f32 {
        float(self.get(name))
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
fn statistics(m: &mut Machine<'_>, x: Value, row: usize, width: usize, eps: f32) -> (f32, f32) {
    let values: Vec<f32> = (0..width).map(|j| m.bf16(x, row * width + j)).collect();
    let mean = values.iter().sum::<f32>() / width as f32;
    let variance = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width as f32;
    (mean, 1.0 / (variance + eps).sqrt())
}

/// `memo_row_rstd` (norm.cu): 1 / sqrt(mean(x^2) + eps) of row `row` of `x`.
fn rms_rstd(m: &mut Machine<'_>, x: Value, row: usize, width: usize, eps: f32) -> f32 {
    let squares: f32 = (0..width).map(|j| m.bf16(x, row * width + j)).map(|v| v * v).sum();
    1.0 / (squares / width as f32 + eps).sqrt()
}

/// `memo_rope_cos_sin` (rope.cu): the angle reduced modulo 2 pi in f64, sin and cos in f32.
pub(crate) fn rope_cos_sin(pos: u32, inv_freq: f64) -> (f32, f32) {
    // 2 pi as the source's double pair: TAU and the remainder below its last bit.
    let (hi, lo) = (std::f64::consts::TAU, 2.449_293_598_294_706_4e-16_f64);
    let angle = f64::from(pos) * inv_freq;
    let turns = (angle * (1.0 / std::f64::consts::TAU)).round_ties_even();
    let reduced = (-turns).mul_add(lo, (-turns).mul_add(hi, angle));
    let (sn, c) = (reduced as f32).sin_cos();
    (c, sn)
}

/// Runs one kernel launch.
fn kernel(m: &mut Machine<'_>, name: &str, grid: [u32; 3], p: &Params) {
    match name {
        "memo_embedding_forward" => {
            let (rows, width, vocab) = (p.int("rows"), p.int("width"), p.int("vocab"));
            for row in 0..rows {
                let id = m.u32(p.get("tokens"), row) as usize;
                for j in 0..width {
                    let value = if id < vocab { m.bf16(p.get("embedding"), id * width + j) } else { 0.0 };
                    m.set_bf16(p.get("out"), row * width + j, value);
                }
                if id >= vocab {
                    m.report(1, p.int("instruction") as u64, row as u64, id as u64);
                }
            }
        }
        "memo_embedding_backward" => {
            let (rows, width, vocab) = (p.int("rows"), p.int("width"), p.int("vocab"));
            let ids: Vec<usize> = (0..rows).map(|r| m.u32(p.get("tokens"), r) as usize).collect();
            for (row, &id) in ids.iter().enumerate() {
                if id >= vocab {
                    m.report(1, p.int("instruction") as u64, row as u64, id as u64);
                }
            }
            assert!(grid[1] as usize * 2048 >= width, "column tiles cover the row");
            for v in 0..vocab {
                for j in 0..width {
                    let mut sum = m.bf16(p.get("dembedding"), v * width + j);
                    for (row, _) in ids.iter().enumerate().filter(|(_, &id)| id == v) {
                        sum += m.bf16(p.get("dout"), row * width + j);
                    }
                    m.set_bf16(p.get("dembedding"), v * width + j, sum);
                }
            }
        }
        "memo_gelu_forward" => {
            for i in 0..p.int("n") {
                let x = m.bf16(p.get("x"), i);
                m.set_bf16(p.get("y"), i, gelu(x));
            }
        }
        "memo_gelu_backward" => {
            for i in 0..p.int("n") {
                let (x, dy) = (m.bf16(p.get("x"), i), m.bf16(p.get("dy"), i));
                m.set_bf16(p.get("dx"), i, dy * gelu_derivative(x));
            }
        }
        "memo_add" => {
            for i in 0..p.int("n") {
                let sum = m.bf16(p.get("a"), i) + m.bf16(p.get("b"), i);
                m.set_bf16(p.get("y"), i, sum);
            }
        }
        "memo_broadcast_row" => {
            let (rows, width) = (p.int("rows"), p.int("width"));
            for i in 0..rows * width {
                let value = m.bf16(p.get("row"), i % width);
                m.set_bf16(p.get("y"), i, value);
            }
        }
        "memo_add_bias" => {
            let (rows, width) = (p.int("rows"), p.int("width"));
            for i in 0..rows * width {
                let sum = m.bf16(p.get("y"), i) + m.bf16(p.get("bias"), i % width);
                m.set_bf16(p.get("y"), i, sum);
            }
        }
        "memo_column_sum_partial" => {
            let (rows, width, per_chunk) = (p.int("rows"), p.int("width"), p.int("rows_per_chunk"));
            assert!(grid[0] as usize * 256 >= width, "column blocks cover the row");
            for chunk in 0..grid[1] as usize {
                for j in 0..width {
                    let begin = chunk * per_chunk;
                    let sum: f32 =
                        (begin..(begin + per_chunk).min(rows)).map(|r| m.bf16(p.get("src"), r * width + j)).sum();
                    m.set_f32(p.get("partial"), chunk * width + j, sum);
                }
            }
        }
        "memo_column_sum_finish" => {
            let (chunks, width) = (p.int("chunks"), p.int("width"));
            for j in 0..width {
                let sum: f32 = (0..chunks).map(|k| m.f32(p.get("partial"), k * width + j)).sum();
                m.set_bf16(p.get("dst"), j, sum);
            }
        }
        "memo_layer_norm_forward" => {
            let (rows, width) = (p.int("rows"), p.int("width"));
            for row in 0..rows {
                let (mean, rstd) = statistics(m, p.get("x"), row, width, p.float("eps"));
                for j in 0..width {
                    let v = (m.bf16(p.get("x"), row * width + j) - mean) * rstd;
                    let y = v * m.bf16(p.get("scale"), j) + m.bf16(p.get("shift"), j);
                    m.set_bf16(p.get("y"), row * width + j, y);
                }
            }
        }
        "memo_layer_norm_backward_rows" => {
            let (rows, width) = (p.int("rows"), p.int("width"));
            for row in 0..rows {
                let (mean, rstd) = statistics(m, p.get("x"), row, width, p.float("eps"));
                let mut xhat = vec![0f32; width];
                let mut g = vec![0f32; width];
                for j in 0..width {
                    xhat[j] = (m.bf16(p.get("x"), row * width + j) - mean) * rstd;
                    g[j] = m.bf16(p.get("dy"), row * width + j) * m.bf16(p.get("scale"), j);
                }
                let mean_g = g.iter().sum::<f32>() / width as f32;
                let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f32>() / width as f32;
                for j in 0..width {
                    m.set_bf16(p.get("dx"), row * width + j, rstd * (g[j] - mean_g - xhat[j] * mean_gx));
                }
                m.set_f32(p.get("stats"), 2 * row, mean);
                m.set_f32(p.get("stats"), 2 * row + 1, rstd);
            }
        }
        "memo_layer_norm_backward_params" => {
            let (rows, width, per_chunk) = (p.int("rows"), p.int("width"), p.int("rows_per_chunk"));
            let chunks = grid[1] as usize;
            for chunk in 0..chunks {
                for j in 0..width {
                    let (mut ds, mut dsh) = (0f32, 0f32);
                    for r in chunk * per_chunk..((chunk + 1) * per_chunk).min(rows) {
                        let d = m.bf16(p.get("dy"), r * width + j);
                        let xhat = (m.bf16(p.get("x"), r * width + j) - m.f32(p.get("stats"), 2 * r))
                            * m.f32(p.get("stats"), 2 * r + 1);
                        ds += d * xhat;
                        dsh += d;
                    }
                    m.set_f32(p.get("partial"), chunk * width + j, ds);
                    m.set_f32(p.get("partial"), (chunks + chunk) * width + j, dsh);
                }
            }
        }
        "memo_rms_norm_forward" => {
            let (rows, width) = (p.int("rows"), p.int("width"));
            for row in 0..rows {
                let rstd = rms_rstd(m, p.get("x"), row, width, p.float("eps"));
                for j in 0..width {
                    let y = m.bf16(p.get("x"), row * width + j) * rstd * m.bf16(p.get("scale"), j);
                    m.set_bf16(p.get("y"), row * width + j, y);
                }
            }
        }
        "memo_rms_norm_backward_rows" => {
            let (rows, width) = (p.int("rows"), p.int("width"));
            for row in 0..rows {
                let rstd = rms_rstd(m, p.get("x"), row, width, p.float("eps"));
                let mut xhat = vec![0f32; width];
                let mut g = vec![0f32; width];
                for j in 0..width {
                    xhat[j] = m.bf16(p.get("x"), row * width + j) * rstd;
                    g[j] = m.bf16(p.get("dy"), row * width + j) * m.bf16(p.get("scale"), j);
                }
                let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f32>() / width as f32;
                for j in 0..width {
                    m.set_bf16(p.get("dx"), row * width + j, rstd * (g[j] - xhat[j] * mean_gx));
                }
                m.set_f32(p.get("stats"), row, rstd);
            }
        }
        "memo_rms_norm_backward_params" => {
            let (rows, width, per_chunk) = (p.int("rows"), p.int("width"), p.int("rows_per_chunk"));
            assert!(grid[0] as usize * 256 >= width, "column blocks cover the row");
            for chunk in 0..grid[1] as usize {
                for j in 0..width {
                    let mut ds = 0f32;
                    for r in chunk * per_chunk..((chunk + 1) * per_chunk).min(rows) {
                        let xhat = m.bf16(p.get("x"), r * width + j) * m.f32(p.get("stats"), r);
                        ds += m.bf16(p.get("dy"), r * width + j) * xhat;
                    }
                    m.set_f32(p.get("partial"), chunk * width + j, ds);
                }
            }
        }
        "memo_swiglu_forward" | "memo_swiglu_backward" => {
            let (rows, width) = (p.int("rows"), p.int("width"));
            for i in 0..rows * width {
                let (row, j) = (i / width, i % width);
                let g = m.bf16(p.get("x"), row * 2 * width + j);
                let u = m.bf16(p.get("x"), row * 2 * width + width + j);
                if name == "memo_swiglu_forward" {
                    m.set_bf16(p.get("y"), i, g / (1.0 + (-g).exp()) * u);
                } else {
                    let d = m.bf16(p.get("dy"), i);
                    let s = 1.0 / (1.0 + (-g).exp());
                    m.set_bf16(p.get("dx"), row * 2 * width + j, d * u * s * (1.0 + g * (1.0 - s)));
                    m.set_bf16(p.get("dx"), row * 2 * width + width + j, d * (g / (1.0 + (-g).exp())));
                }
            }
        }
        "memo_cross_entropy" => {
            let (rows, vocab, tokens) = (p.int("rows"), p.int("vocab"), p.float("tokens"));
            for row in 0..rows {
                let target = m.u32(p.get("targets"), row) as usize;
                if target >= vocab {
                    m.report(2, p.int("instruction") as u64, row as u64, target as u64);
                    m.set_f32(p.get("row_loss"), row, 0.0);
                    continue;
                }
                let logits: Vec<f32> = (0..vocab).map(|j| m.bf16(p.get("logits"), row * vocab + j)).collect();
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = logits.iter().map(|l| (l - max).exp()).sum();
                m.set_f32(p.get("row_loss"), row, max + z.ln() - logits[target]);
                for (j, l) in logits.iter().enumerate() {
                    let q = (l - max).exp() / z;
                    m.set_bf16(
                        p.get("logits"),
                        row * vocab + j,
                        if j == target { (q - 1.0) / tokens } else { q / tokens },
                    );
                }
            }
        }
        "memo_cross_entropy_max" => {
            let (rows, width, valid) = (p.int("rows"), p.int("width"), p.int("valid"));
            for row in 0..rows {
                let max =
                    (0..valid).map(|j| m.bf16(p.get("logits"), row * width + j)).fold(f32::NEG_INFINITY, f32::max);
                m.set_f32(p.get("max"), row, max);
            }
        }
        "memo_cross_entropy_sums" => {
            let (rows, width, valid, offset, vocab) =
                (p.int("rows"), p.int("width"), p.int("valid"), p.int("offset"), p.int("vocab"));
            for row in 0..rows {
                let target = m.u32(p.get("targets"), row) as usize;
                if target >= vocab {
                    m.report(2, p.int("instruction") as u64, row as u64, target as u64);
                    m.set_f32(p.get("sums"), 2 * row, 0.0);
                    m.set_f32(p.get("sums"), 2 * row + 1, 0.0);
                    continue;
                }
                let max = m.f32(p.get("max"), row);
                let z: f32 = (0..valid).map(|j| (m.bf16(p.get("logits"), row * width + j) - max).exp()).sum();
                let local = target.checked_sub(offset).filter(|&c| c < valid);
                let target_logit = local.map_or(0.0, |c| m.bf16(p.get("logits"), row * width + c));
                m.set_f32(p.get("sums"), 2 * row, z);
                m.set_f32(p.get("sums"), 2 * row + 1, target_logit);
            }
        }
        "memo_cross_entropy_finish" => {
            let (rows, width, valid, offset, vocab) =
                (p.int("rows"), p.int("width"), p.int("valid"), p.int("offset"), p.int("vocab"));
            let tokens = p.float("tokens");
            for row in 0..rows {
                let target = m.u32(p.get("targets"), row) as usize;
                if target >= vocab {
                    m.report(2, p.int("instruction") as u64, row as u64, target as u64);
                    m.set_f32(p.get("row_loss"), row, 0.0);
                    continue;
                }
                let (max, z, target_logit) =
                    (m.f32(p.get("max"), row), m.f32(p.get("sums"), 2 * row), m.f32(p.get("sums"), 2 * row + 1));
                m.set_f32(p.get("row_loss"), row, max + z.ln() - target_logit);
                let local = target.checked_sub(offset).filter(|&c| c < valid);
                for j in 0..width {
                    let g = if j < valid {
                        let q = (m.bf16(p.get("logits"), row * width + j) - max).exp() / z;
                        if Some(j) == local {
                            (q - 1.0) / tokens
                        } else {
                            q / tokens
                        }
                    } else {
                        0.0
                    };
                    m.set_bf16(p.get("logits"), row * width + j, g);
                }
            }
        }
        "memo_sum_into_scalar" => {
            let total: f32 = (0..p.int("count")).map(|i| m.f32(p.get("values"), i)).sum();
            let old = m.f32(p.get("scalar"), 0);
            m.set_f32(p.get("scalar"), 0, old + total);
        }
        "memo_sum_squares_partial" => {
            let (n, blocks) = (p.int("n"), grid[0] as usize);
            for block in 0..blocks {
                let mut sum = 0f32;
                for i in (0..n).filter(|i| (i / 256) % blocks == block) {
                    let g = m.bf16(p.get("grad"), i);
                    sum += g * g;
                }
                m.set_f32(p.get("partial"), block, sum);
            }
        }
        "memo_adamw" => {
            let norm_squared = m.f32(p.get("norm_squared"), 0);
            if !norm_squared.is_finite() {
                m.report(3, p.int("instruction") as u64, u64::from(norm_squared.to_bits()), 0);
                return;
            }
            let (rows, width) = (p.int("rows"), p.int("width"));
            let [beta1, beta2, eps, max_norm, step_size, decay, c2] =
                ["beta1", "beta2", "eps", "max_grad_norm", "step_size", "decay", "correction2_sqrt"]
                    .map(|n| p.float(n));
            let norm = norm_squared.sqrt();
            let clip = if max_norm > 0.0 && norm > max_norm { max_norm / norm } else { 1.0 };
            for i in 0..rows * width {
                let (row, col) = (i / width, i % width);
                let base = row * 3 * width;
                let g = m.bf16(p.get("grad"), i) * clip;
                let mut w = m.f32(p.get("state"), base + col) * decay;
                let first = beta1 * m.f32(p.get("state"), base + width + col) + (1.0 - beta1) * g;
                let second = beta2 * m.f32(p.get("state"), base + 2 * width + col) + (1.0 - beta2) * g * g;
                w -= step_size * first / (second.sqrt() / c2 + eps);
                m.set_f32(p.get("state"), base + col, w);
                m.set_f32(p.get("state"), base + width + col, first);
                m.set_f32(p.get("state"), base + 2 * width + col, second);
                m.set_bf16(p.get("parameter"), i, w);
            }
        }
        "memo_rope" => {
            let (rows, heads, head_dim, seq_len) = (p.int("rows"), p.int("heads"), p.int("head_dim"), p.int("seq_len"));
            let inverse = p.int("inverse") != 0;
            let theta = f64::from_bits(p.int("theta_bits") as u64);
            let half = head_dim / 2;
            for i in 0..rows * heads * half {
                let pair = i % half;
                let row_head = i / half;
                let pos = (row_head / heads) % seq_len;
                let inv_freq = theta.powf(-2.0 * pair as f64 / head_dim as f64);
                let (c, sn) = rope_cos_sin(pos as u32, inv_freq);
                let sn = if inverse { -sn } else { sn };
                let at = row_head * head_dim + 2 * pair;
                let (a, b) = (m.bf16(p.get("x"), at), m.bf16(p.get("x"), at + 1));
                m.set_bf16(p.get("y"), at, a * c - b * sn);
                m.set_bf16(p.get("y"), at + 1, a * sn + b * c);
            }
        }
        "memo_lse_transpose" => {
            let (sequences, seq_len, heads) = (p.int("sequences"), p.int("seq_len"), p.int("heads"));
            let to_head_major = p.int("to_head_major") != 0;
            for i in 0..sequences * seq_len * heads {
                let (head, row) = (i % heads, i / heads);
                let (pos, seq) = (row % seq_len, row / seq_len);
                let j = (seq * heads + head) * seq_len + pos;
                if to_head_major {
                    let value = m.f32(p.get("x"), i);
                    m.set_f32(p.get("y"), j, value);
                } else {
                    let value = m.f32(p.get("x"), j);
                    m.set_f32(p.get("y"), i, value);
                }
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
                let names = declared_parameters(launch.kernel).into_iter().map(parameter_name);
                let params = Params { kernel: launch.kernel, values: names.zip(values).collect() };
                kernel(&mut m, launch.kernel, launch.grid, &params);
            }
        }
    }
    m.status
}
