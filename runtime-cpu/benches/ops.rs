//! Throughput of the CPU kernels at a small model's shapes (h 256, s 1024, 4 heads of 64, FFN
//! 1024), one call each, on 1 thread and on all of them.
//!
//! Criterion's "elem/s" is FLOP/s here. Linear: `2 m k n` per call. Attention: the causal
//! FLOPs, `2 * 2 s^2 h / 2` for the forward (QK^T and PV, half the matrix under the mask), twice
//! that for the backward (four products instead of two), the convention of `spec/cost-model.md`
//! halving attention for the mask.
//!
//! Run: `cargo bench -p runtime-cpu --bench ops`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use memo_plan_core::plan::{Access, Op};
use runtime_cpu::ops::{execute_with_threads, threads, AdamW, Arg, ArgData, OpContext};

const H: usize = 256;
const S: usize = 1024;
const HEADS: usize = 4;
const FFN: usize = 4 * H;

/// Deterministic bf16 bytes of values in about [-1, 1].
fn bf16_bytes(elements: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..elements)
        .flat_map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
            half::bf16::from_f32(2.0 * unit - 1.0).to_bits().to_le_bytes()
        })
        .collect()
}

/// A buffer of `rows` rows of `row_bytes` and its shape.
struct Buf {
    data: Vec<u8>,
    rows: usize,
    row_bytes: usize,
}

fn bf16(rows: usize, width: usize, seed: u64) -> Buf {
    Buf { data: bf16_bytes(rows * width, seed), rows, row_bytes: width * 2 }
}

fn zeros(rows: usize, row_bytes: usize) -> Buf {
    Buf { data: vec![0; rows * row_bytes], rows, row_bytes }
}

fn launch(op: Op, bufs: &mut [Buf], ctx: &OpContext, threads: usize) {
    let mut args: Vec<Arg<'_>> = bufs
        .iter_mut()
        .zip(op.signature())
        .map(|(b, &(_, access))| Arg {
            data: if access == Access::Read { ArgData::Read(&b.data) } else { ArgData::Write(&mut b.data) },
            first_row: 0,
            rows: b.rows,
            row_bytes: b.row_bytes,
        })
        .collect();
    if let Err(error) = execute_with_threads(op, &mut args, ctx, threads) {
        panic!("{error}");
    }
}

fn context() -> OpContext {
    let adamw = AdamW::default(); // lr 1e-3, betas (0.9, 0.95), step 1
    OpContext {
        hidden: H,
        heads: HEADS,
        kv_heads: 0,
        kv_replicated: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len: S,
        vocab: 256,
        loss_scale_tokens: S,
        adamw,
        context_rank: 0,
        context_ranks: 1,
    }
}

fn thread_counts() -> Vec<usize> {
    let all = threads();
    if all > 1 {
        vec![1, all]
    } else {
        vec![1]
    }
}

fn linear(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("linear");
    group.sample_size(10);
    for (name, k, n) in [("qkv_256x256", H, H), ("fc1_256x1024", H, FFN), ("fc2_1024x256", FFN, H)] {
        group.throughput(Throughput::Elements((2 * S * k * n) as u64));
        for threads in thread_counts() {
            let mut bufs = [bf16(S, k, 1), bf16(n, k, 2), bf16(1, n, 3), zeros(S, n * 2)];
            group.bench_function(BenchmarkId::new(name, format!("{threads}t")), |b| {
                b.iter(|| launch(Op::Linear, &mut bufs, &ctx, threads))
            });
        }
    }
    group.throughput(Throughput::Elements((2 * S * H * FFN) as u64));
    for threads in thread_counts() {
        let mut bufs = [bf16(S, FFN, 4), bf16(FFN, H, 5), zeros(S, H * 2)];
        group.bench_function(BenchmarkId::new("backward_input_fc1", format!("{threads}t")), |b| {
            b.iter(|| launch(Op::LinearBackwardInput, &mut bufs, &ctx, threads))
        });
        let mut bufs = [bf16(S, H, 6), bf16(S, FFN, 7), zeros(FFN, H * 2), zeros(1, FFN * 2)];
        group.bench_function(BenchmarkId::new("backward_weight_fc1", format!("{threads}t")), |b| {
            b.iter(|| launch(Op::LinearBackwardWeight, &mut bufs, &ctx, threads))
        });
    }
    group.finish();
}

fn attention(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("attention");
    group.sample_size(10);
    let forward_flops = (2 * S * S * H) as u64;
    for threads in thread_counts() {
        let mut fwd = [bf16(S, H, 8), bf16(S, H, 9), bf16(S, H, 10), zeros(S, H * 2), zeros(S, HEADS * 4)];
        group.throughput(Throughput::Elements(forward_flops));
        group.bench_function(BenchmarkId::new("forward_s1024_h256", format!("{threads}t")), |b| {
            b.iter(|| launch(Op::Attention, &mut fwd, &ctx, threads))
        });
        let [q, k, v, out, lse] = fwd;
        let mut bwd = [q, k, v, out, lse, bf16(S, H, 11), zeros(S, H * 2), zeros(S, H * 2), zeros(S, H * 2)];
        group.throughput(Throughput::Elements(2 * forward_flops));
        group.bench_function(BenchmarkId::new("backward_s1024_h256", format!("{threads}t")), |b| {
            b.iter(|| launch(Op::AttentionBackward, &mut bwd, &ctx, threads))
        });
    }
    group.finish();
}

criterion_group!(benches, linear, attention);
criterion_main!(benches);
