//! Tests of the CPU kernels, in rings:
//! - `forward`: each op against a naive f64 reference (`reference`) on bf16-representable data;
//! - `gradients`: each backward against central finite differences of the f64 reference;
//! - `invariance`: row-wise ops give the same bytes on any row range and thread count, and every
//!   op gives the same bytes twice;
//! - `errors`: bad launches give errors that name the op and argument, random launches never
//!   panic;
//! - `ring`: the context-parallel ring attention kernels, a ring simulated by hand against
//!   `attention` over the whole sequence.

use memo_plan_core::plan::{Access, Op};

use super::tensor::round_bf16;
use super::{execute_with_threads, AdamW, Arg, ArgData, OpContext, OpError};

mod errors;
mod forward;
mod gradients;
mod invariance;
mod reference;
mod ring;
mod tensor_parallel;

/// splitmix64: the same numbers on every platform.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`.
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in `[-scale, scale)`, rounded to bf16 (so the f64 reference sees the op's input).
    pub(super) fn bf16(&mut self, scale: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        round_bf16((2.0 * unit - 1.0) * scale)
    }

    pub(super) fn bf16_vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.bf16(scale)).collect()
    }
}

/// A tensor for tests: some rows of a buffer.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct T {
    pub data: Vec<u8>,
    pub rows: usize,
    pub row_bytes: usize,
    pub first_row: usize,
}

impl T {
    /// bf16 values in `rows` rows.
    pub(super) fn bf16(values: &[f32], rows: usize) -> T {
        let data: Vec<u8> = values.iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect();
        let row_bytes = data.len().checked_div(rows).unwrap_or(0);
        T { data, rows, row_bytes, first_row: 0 }
    }

    /// f32 values in `rows` rows.
    pub(super) fn f32s(values: &[f32], rows: usize) -> T {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let row_bytes = data.len().checked_div(rows).unwrap_or(0);
        T { data, rows, row_bytes, first_row: 0 }
    }

    /// One u32 per row.
    pub(super) fn ids(ids: &[u32]) -> T {
        T { data: ids.iter().flat_map(|v| v.to_le_bytes()).collect(), rows: ids.len(), row_bytes: 4, first_row: 0 }
    }

    pub(super) fn zeros(rows: usize, row_bytes: usize) -> T {
        T { data: vec![0; rows * row_bytes], rows, row_bytes, first_row: 0 }
    }

    /// Rows `[a, b)` of this tensor, as a launch over those rows would see them.
    pub(super) fn slice(&self, a: usize, b: usize) -> T {
        T {
            data: self.data[a * self.row_bytes..b * self.row_bytes].to_vec(),
            rows: b - a,
            row_bytes: self.row_bytes,
            first_row: self.first_row + a,
        }
    }

    pub(super) fn values(&self) -> Vec<f32> {
        self.data.chunks_exact(2).map(|p| half::bf16::from_bits(u16::from_le_bytes([p[0], p[1]])).to_f32()).collect()
    }

    pub(super) fn f32_values(&self) -> Vec<f32> {
        self.data.chunks_exact(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
    }
}

/// `tensors` (signature order) as a launch's arguments: read ones as `Read`, the others `Write`.
pub(super) fn args_of(op: Op, tensors: &mut [T]) -> Vec<Arg<'_>> {
    let signature = op.signature();
    tensors
        .iter_mut()
        .enumerate()
        .map(|(i, t)| {
            let data = match signature.get(i).map(|s| s.1) {
                Some(Access::Read) => ArgData::Read(&t.data),
                _ => ArgData::Write(&mut t.data),
            };
            Arg { data, first_row: t.first_row, rows: t.rows, row_bytes: t.row_bytes }
        })
        .collect()
}

/// Runs `op` on `tensors` (signature order) with `threads` threads.
pub(super) fn run_threads(op: Op, ctx: &OpContext, tensors: &mut [T], threads: usize) -> Result<(), OpError> {
    execute_with_threads(op, &mut args_of(op, tensors), ctx, threads)
}

/// Runs `op` on one thread; panics (the test fails) on an error.
pub(super) fn run(op: Op, ctx: &OpContext, tensors: &mut [T]) {
    if let Err(error) = run_threads(op, ctx, tensors, 1) {
        panic!("{error}");
    }
}

/// A context for a model of `hidden` features, `heads` heads, sequences of `seq_len` rows and
/// `vocab` tokens, with `loss_scale_tokens` 1 and AdamW's defaults (lr 1e-3, step 1).
pub(super) fn context(hidden: usize, heads: usize, seq_len: usize, vocab: usize) -> OpContext {
    OpContext {
        hidden,
        heads,
        kv_heads: 0,
        kv_replicated: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len,
        vocab,
        loss_scale_tokens: 1,
        adamw: AdamW::default(),
        context_rank: 0,
        context_ranks: 1,
    }
}

/// Widens to f64.
pub(super) fn f64s(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

/// Checks `got` against `want`: each element within `rel * |want| + abs * max|want|`. Returns
/// the largest error as a fraction of `max|want|` (tests print it).
pub(super) fn assert_close(what: &str, got: &[f32], want: &[f64], rel: f64, abs: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs())).max(1e-30);
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let error = (f64::from(g) - w).abs();
        assert!(
            error <= rel * w.abs() + abs * scale,
            "{what}[{i}]: got {g}, want {w} (error {error:e}, allowed {:e}; max |want| {scale:e})",
            rel * w.abs() + abs * scale
        );
        worst = worst.max(error / scale);
    }
    eprintln!("{what}: largest error {worst:.2e} of max |want| {scale:.3e}");
    worst
}
