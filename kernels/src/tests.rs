//! Recipe tests on the CPU: every kernel step's parameters against the kernel's C declaration,
//! the GEMM steps executed by a column-major reference GEMM and compared with the CPU backend's
//! ops, and the errors.

use memo_plan_core::plan::shapes::{OpError, OpErrorKind};
use memo_plan_core::plan::{Access, Op};
use memo_runtime::{AdamW, KernelContext};
use runtime_cpu::ops::{self, Arg, ArgData, OpContext};

use crate::{launch_steps, scratch_bytes, status_error, ArgShape, Param, Step, SOURCES};

const H: u64 = 16;
const VOCAB: u64 = 40;
const ROWS: u64 = 12;

fn context() -> KernelContext {
    context_for(H, VOCAB, ROWS)
}

fn context_for(hidden: u64, vocab: u64, rows: u64) -> KernelContext {
    KernelContext {
        hidden,
        heads: 2,
        kv_heads: 0,
        kv_replicated: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len: rows,
        vocab,
        loss_scale_tokens: rows,
        adamw: AdamW { step: 3, ..AdamW::default() },
        rank: 0,
        ranks: 1,
        context_rank: 0,
        context_ranks: 1,
    }
}

fn shape(rows: u64, row_bytes: u64) -> ArgShape {
    ArgShape { first_row: 0, rows, row_bytes }
}

/// Shapes of a valid launch of every non-attention op.
fn valid_launches() -> Vec<(Op, Vec<ArgShape>)> {
    launches(H, VOCAB, ROWS)
}

/// Shapes of a valid launch of every non-attention op: `hidden`, `vocab` and `rows` as given,
/// linear layers of `hidden` -> 24 features.
fn launches(hidden: u64, vocab: u64, rows: u64) -> Vec<(Op, Vec<ArgShape>)> {
    let (h, v, r) = (hidden * 2, vocab * 2, rows);
    vec![
        (Op::Embedding, vec![shape(r, 4), shape(vocab, h), shape(r, h)]),
        (Op::LayerNorm, vec![shape(r, h), shape(1, h), shape(1, h), shape(r, h)]),
        (Op::Linear, vec![shape(r, h), shape(24, h), shape(1, 48), shape(r, 48)]),
        (Op::Gelu, vec![shape(r, h), shape(r, h)]),
        (Op::Add, vec![shape(r, h), shape(r, h), shape(r, h)]),
        (Op::LinearBackwardInput, vec![shape(r, 48), shape(24, h), shape(r, h)]),
        (Op::LinearBackwardInputAccumulate, vec![shape(r, 48), shape(24, h), shape(r, h)]),
        (Op::LinearBackwardWeight, vec![shape(r, h), shape(r, 48), shape(24, h), shape(1, 48)]),
        (Op::GeluBackward, vec![shape(r, h), shape(r, h), shape(r, h)]),
        (Op::LayerNormBackward, vec![shape(r, h), shape(1, h), shape(r, h), shape(r, h), shape(1, h), shape(1, h)]),
        (Op::Classifier, vec![shape(r, h), shape(vocab, h), shape(r, v)]),
        (Op::CrossEntropy, vec![shape(r, v), shape(r, 4), shape(1, 4)]),
        (Op::ClassifierBackwardWeight, vec![shape(r, h), shape(r, v), shape(vocab, h)]),
        (Op::EmbeddingBackward, vec![shape(r, 4), shape(r, h), shape(vocab, h)]),
        (Op::Zero, vec![shape(r, h)]),
        (Op::GradNormSquared, vec![shape(24, h), shape(1, 4)]),
        (Op::AdamW, vec![shape(24, h), shape(24, h), shape(24, hidden * 12), shape(1, 4)]),
        // The Llama family's ops (after the others: tests index the list).
        (Op::RmsNorm, vec![shape(r, h), shape(1, h), shape(r, h)]),
        (Op::RmsNormBackward, vec![shape(r, h), shape(1, h), shape(r, h), shape(r, h), shape(1, h)]),
        (Op::Swiglu, vec![shape(r, 2 * h), shape(r, h)]),
        (Op::SwigluBackward, vec![shape(r, 2 * h), shape(r, h), shape(r, 2 * h)]),
        (Op::LinearBackwardWeightNoBias, vec![shape(r, h), shape(r, 48), shape(24, h)]),
    ]
}

/// Inputs for `op`'s arguments: ids below `vocab`, scalars, AdamW state, or bf16 in [-1, 1).
fn inputs(op: Op, shapes: &[ArgShape], vocab: u64, seed: u64) -> Vec<Vec<u8>> {
    shapes
        .iter()
        .zip(op.signature())
        .enumerate()
        .map(|(i, (s, &(name, _)))| {
            let count = (s.rows * s.row_bytes) as usize;
            let noise = bf16_bytes(count / 2, seed + i as u64);
            match name {
                "tokens" | "targets" => noise
                    .chunks_exact(4)
                    .flat_map(|w| (u32::from_le_bytes([w[0], w[1], w[2], w[3]]) % vocab as u32).to_le_bytes())
                    .collect(),
                "loss" | "sum_squares" => 0.5f32.to_le_bytes().to_vec(),
                "grad_norm_squared" => 4.0f32.to_le_bytes().to_vec(),
                // Master weights, m and v alike positive and small (v must be: it is square-rooted).
                "optimizer_state" => {
                    to_f32(&noise).iter().take(count / 4).flat_map(|&x| (x.abs() * 1e-2).to_le_bytes()).collect()
                }
                _ => noise,
            }
        })
        .collect()
}

#[test]
fn every_recipe_run_by_the_emulation_matches_the_cpu() {
    // Small, and large enough for several row chunks per column sum and two embedding tiles.
    for (hidden, vocab, rows) in [(H, VOCAB, ROWS), (2100, 37, 200)] {
        let ctx = context_for(hidden, vocab, rows);
        for (op, shapes) in launches(hidden, vocab, rows) {
            let data = inputs(op, &shapes, vocab, 99);
            let steps = launch_steps(op, &shapes, &ctx).unwrap_or_else(|e| panic!("{e}"));
            let mut emulated = data.clone();
            assert_eq!(crate::emulation::run(&steps, &mut emulated, 5), [0; 4], "{}", op.name());
            let mut cpu = data.clone();
            if let Err(e) = try_run_cpu_with(op, &shapes, &mut cpu, &ctx) {
                // A Llama op the CPU reference does not have yet on this branch:
                // `the_llama_ops_match_an_f64_reference` checks it.
                assert!(matches!(e.kind, OpErrorKind::Unsupported { .. }), "{e}");
                continue;
            }
            for (index, (e, c)) in emulated.iter().zip(&cpu).enumerate() {
                let name = op.signature()[index].0;
                let f32_words = matches!(name, "loss" | "sum_squares" | "grad_norm_squared" | "optimizer_state");
                let (e, c, relative, of_max) = if f32_words {
                    (words(e), words(c), 1e-4, 0.0)
                } else if matches!(name, "tokens" | "targets") {
                    assert_eq!(e, c);
                    continue;
                } else {
                    (to_f32(e), to_f32(c), 2e-2, 1e-3)
                };
                let max = c.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (k, (x, y)) in e.iter().zip(&c).enumerate() {
                    let bound = relative * y.abs() + of_max * max + 1e-6;
                    assert!(
                        (x - y).abs() <= bound,
                        "{} `{name}` [{k}]: {x} vs {y} ({hidden}, {vocab}, {rows})",
                        op.name()
                    );
                }
            }
        }
    }
}

#[test]
fn bad_ids_and_a_nan_norm_are_reported_with_the_instruction() {
    let ctx = context();
    let all = valid_launches();
    for (op, bad_arg, code) in [(Op::Embedding, 0, 1), (Op::EmbeddingBackward, 0, 1), (Op::CrossEntropy, 1, 2)] {
        let shapes = &all.iter().find(|(o, _)| *o == op).expect("a launch").1;
        let mut data = inputs(op, shapes, VOCAB, 3);
        data[bad_arg][8..12].copy_from_slice(&(VOCAB as u32 + 5).to_le_bytes());
        let steps = launch_steps(op, shapes, &ctx).expect("steps");
        let status = crate::emulation::run(&steps, &mut data, 41);
        assert_eq!(status, [code, 41, 2, VOCAB as u32 + 5], "{}", op.name());
        assert!(status_error(status).is_some());
    }
    let shapes = &all.iter().find(|(o, _)| *o == Op::AdamW).expect("adamw").1;
    let mut data = inputs(Op::AdamW, shapes, VOCAB, 3);
    data[3] = f32::INFINITY.to_le_bytes().to_vec();
    let before = data.clone();
    let steps = launch_steps(Op::AdamW, shapes, &ctx).expect("steps");
    let status = crate::emulation::run(&steps, &mut data, 9);
    assert_eq!(status[..2], [3, 9]);
    assert_eq!(data, before, "nothing written");
}

fn words(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
}

/// The C parameter kinds of kernel `name`: 'p' pointer, 'q' u64, 'u' u32, 'f' float.
fn declaration(name: &str) -> Vec<char> {
    crate::emulation::declared_parameters(name)
        .into_iter()
        .map(|p| {
            if p.contains('*') {
                'p'
            } else if p.starts_with("memo_u64") {
                'q'
            } else if p.starts_with("memo_u32") {
                'u'
            } else if p.starts_with("float") {
                'f'
            } else {
                panic!("{name}: parameter `{p}` of an unknown type")
            }
        })
        .collect()
}

fn kind(param: &Param) -> char {
    match param {
        Param::Ptr { .. } | Param::Scratch { .. } | Param::Status => 'p',
        Param::U64(_) => 'q',
        Param::U32(_) | Param::Instruction => 'u',
        Param::F32(_) => 'f',
    }
}

#[test]
fn every_kernel_step_matches_its_declaration_and_limits() {
    for (op, shapes) in valid_launches() {
        let steps = launch_steps(op, &shapes, &context()).unwrap_or_else(|e| panic!("{e}"));
        assert!(!steps.is_empty(), "{}: no steps", op.name());
        let scratch = scratch_bytes(&steps);
        for step in &steps {
            match step {
                Step::Kernel(launch) => {
                    let found: Vec<char> = launch.params.iter().map(kind).collect();
                    assert_eq!(found, declaration(launch.kernel), "{}: {}", op.name(), launch.kernel);
                    assert!(launch.grid.iter().all(|&g| g >= 1) && launch.grid[1] <= 65_535, "{:?}", launch.grid);
                    let threads: u32 = launch.block.iter().product();
                    assert!(threads.is_multiple_of(64) && threads <= 1024, "{}: {threads} threads", launch.kernel);
                    for param in &launch.params {
                        match *param {
                            Param::Ptr { arg, .. } => assert!(arg < shapes.len()),
                            Param::Scratch { byte_offset } => {
                                assert!(byte_offset < scratch && byte_offset.is_multiple_of(256), "{}", launch.kernel)
                            }
                            _ => {}
                        }
                    }
                }
                Step::Gemm(g) => {
                    for operand in [g.a, g.b, g.c] {
                        assert!(operand.arg < shapes.len());
                    }
                    let written = op.signature()[g.c.arg].1;
                    assert!(written.writes(), "{}: the GEMM writes a read-only argument", op.name());
                }
                Step::Zero { arg } => assert!(op.signature()[*arg].1.writes()),
            }
        }
    }
}

#[test]
fn every_listed_kernel_is_defined_once() {
    for source in SOURCES {
        assert!(source.text.contains("#include \"memo_gpu.h\""), "{}", source.name);
        assert!(!source.standalone_text().contains("#include \"memo_gpu.h\""));
        if source.text.contains("##") {
            // Kernels stamped out by a macro (attention.cu): the NVRTC compile test checks that
            // each listed name is compiled.
            continue;
        }
        for kernel in source.kernels {
            let defined = source.text.matches(&format!(" {kernel}(")).count()
                + source.text.matches(&format!("\n{kernel}(")).count();
            assert_eq!(defined, 1, "{}: {kernel}", source.name);
        }
    }
}

/// Deterministic pseudo-random bf16 bytes.
fn bf16_bytes(count: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(count * 2);
    for _ in 0..count {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let x = ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
        out.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
    }
    out
}

fn to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(2).map(|p| half::bf16::from_bits(u16::from_le_bytes([p[0], p[1]])).to_f32()).collect()
}

/// The CPU reference on the same arguments.
fn run_cpu(op: Op, shapes: &[ArgShape], args: &mut [Vec<u8>]) {
    run_cpu_with(op, shapes, args, &context());
}

/// The CPU reference with `ctx`, as rank `ctx.rank` of `ctx.ranks` (`execute_on_rank`, what the
/// tensor-parallel CPU backend runs; rank 0 of 1 is the single-GPU reference).
fn run_cpu_with(op: Op, shapes: &[ArgShape], args: &mut [Vec<u8>], ctx: &KernelContext) {
    try_run_cpu_with(op, shapes, args, ctx).unwrap_or_else(|e| panic!("{e}"));
}

/// [`run_cpu_with`], its error returned.
fn try_run_cpu_with(op: Op, shapes: &[ArgShape], args: &mut [Vec<u8>], ctx: &KernelContext) -> Result<(), OpError> {
    let op_ctx = OpContext {
        hidden: ctx.hidden as usize,
        heads: ctx.heads as usize,
        kv_heads: 0,
        kv_replicated: false,
        rope_theta: ctx.rope_theta,
        norm_eps: ctx.norm_eps,
        seq_len: ctx.seq_len as usize,
        vocab: ctx.vocab as usize,
        loss_scale_tokens: ctx.loss_scale_tokens as usize,
        adamw: ctx.adamw,
        context_rank: 0,
        context_ranks: 1,
    };
    let mut cpu_args: Vec<Arg<'_>> = args
        .iter_mut()
        .zip(shapes)
        .zip(op.signature())
        .map(|((bytes, s), &(_, access))| Arg {
            data: if access == Access::Read { ArgData::Read(bytes) } else { ArgData::Write(bytes) },
            first_row: s.first_row as usize,
            rows: s.rows as usize,
            row_bytes: s.row_bytes as usize,
        })
        .collect();
    let group = ops::Group { rank: ctx.rank as usize, ranks: ctx.ranks as usize };
    ops::execute_on_rank(op, &mut cpu_args, &op_ctx, group, 1)
}

#[test]
fn gemm_recipes_compute_what_the_cpu_ops_compute() {
    let gemm_ops = [
        Op::Linear,
        Op::LinearBackwardInput,
        Op::LinearBackwardInputAccumulate,
        Op::LinearBackwardWeight,
        Op::Classifier,
        Op::ClassifierBackwardWeight,
    ];
    for (op, shapes) in valid_launches().into_iter().filter(|(op, _)| gemm_ops.contains(op)) {
        let inputs: Vec<Vec<u8>> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| bf16_bytes((s.rows * s.row_bytes / 2) as usize, 7 + i as u64))
            .collect();
        let steps = launch_steps(op, &shapes, &context()).unwrap_or_else(|e| panic!("{e}"));
        let mut gpu = inputs.clone();
        crate::emulation::run(&steps, &mut gpu, 0);
        let mut cpu = inputs.clone();
        run_cpu(op, &shapes, &mut cpu);
        for (index, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
            let (g, c) = (to_f32(g), to_f32(c));
            for (e, (x, y)) in g.iter().zip(&c).enumerate() {
                // Same products, same f32 order here: only a bias or accumulation rounding apart.
                assert!((x - y).abs() <= 1e-2 * (1.0 + y.abs()), "{} arg {index} elem {e}: {x} vs {y}", op.name());
            }
        }
    }
}

#[test]
fn bad_launches_are_errors_that_say_why() {
    let ctx = context();
    let message = |op, shapes: &[ArgShape]| launch_steps(op, shapes, &ctx).expect_err("an error").to_string();
    let m = message(Op::Gelu, &[shape(2, 32)]);
    assert!(m.contains("1 arguments, but the op takes 2"), "{m}");
    let m = message(Op::Linear, &[shape(4, 32), shape(8, 30), shape(1, 16), shape(4, 16)]);
    assert!(m.contains("argument `weight`") && m.contains("32 bytes per row"), "{m}");
    let m = message(Op::Embedding, &[shape(4, 4), shape(VOCAB + 1, 32), shape(4, 32)]);
    assert!(m.contains("vocabulary size"), "{m}");
    let m = message(Op::Attention, &[shape(1, 2); 4]);
    assert!(m.contains("attention") && m.contains("the op takes 5"), "{m}");
    let m = message(Op::AllGather, &[shape(1, 2); 2]);
    assert!(m.contains("multi-GPU"), "{m}");
    // The t > 1 step's own ops have kernels: their shapes are still checked.
    let m = message(Op::LinearNoBias, &[shape(4, 32), shape(8, 30), shape(4, 16)]);
    assert!(m.contains("argument `weight`"), "{m}");
    let m = message(Op::AllReduceSumF32, &[shape(1, 4)]);
    assert!(m.contains("multi-GPU"), "{m}");
    // Without shapes: no op is refused for want of a kernel (what a runner checks before it
    // opens a device); the collectives run on NCCL or RCCL. Context parallelism's ops (codes 34-45,
    // spec/context-parallel.md) have no GPU kernels yet and are refused by name, with the reason.
    for &op in Op::ALL {
        match crate::without_gpu_kernel(op) {
            None => assert!(!op.is_context_parallel(), "{op:?}"),
            Some(e) => {
                assert!(op.is_context_parallel(), "{op:?}: {e}");
                assert!(e.to_string().contains("not yet wired into the GPU backend"), "{e}");
            }
        }
    }
    let mut zero_step = ctx;
    zero_step.adamw.step = 0;
    let adamw = &valid_launches()[16].1;
    let e = launch_steps(Op::AdamW, adamw, &zero_step).expect_err("step 0");
    assert!(e.to_string().contains("adamw.step"), "{e}");
    let mut no_tokens = ctx;
    no_tokens.loss_scale_tokens = 0;
    let ce = &valid_launches()[11].1;
    let e = launch_steps(Op::CrossEntropy, ce, &no_tokens).expect_err("no tokens");
    assert!(e.to_string().contains("loss_scale_tokens"), "{e}");
}

#[test]
fn empty_launches_need_no_kernels_and_empty_sums_are_zero() {
    let ctx = context();
    let steps = launch_steps(Op::Gelu, &[shape(0, 32), shape(0, 32)], &ctx).expect("empty gelu");
    assert!(steps.is_empty());
    let steps =
        launch_steps(Op::LinearBackwardWeight, &[shape(0, 32), shape(0, 48), shape(24, 32), shape(1, 48)], &ctx)
            .expect("empty backward weight");
    assert_eq!(steps, vec![Step::Zero { arg: 2 }, Step::Zero { arg: 3 }]);
}

#[test]
fn status_words_become_messages() {
    assert_eq!(status_error([0, 0, 0, 0]), None);
    let (instruction, message) = status_error([1, 17, 3, 999]).expect("an error");
    assert_eq!(instruction, 17);
    assert!(message.contains("token id 999 in row 3"), "{message}");
    let (_, message) = status_error([3, 5, f32::NAN.to_bits(), 0]).expect("an error");
    assert!(message.contains("NaN") && message.contains("adamw"), "{message}");
}

/// `memo_rope` (rope.cu, the cuDNN attention path's rotation) in its emulation: its step's
/// parameters against the declaration; the rotation against RoPE's definition in f64 (two
/// sequences, so positions restart at each); the inverse, in place, gives the input back.
#[test]
fn the_rope_kernel_rotates_by_the_definition_and_back() {
    use memo_plan_core::plan::shapes::AttentionShape;
    let shape =
        AttentionShape { heads: 3, kv_heads: 3, group: 1, first_query: 0, head_dim: 64, seq_len: 77, sequences: 2 };
    let (rows, width) = (2 * 77, 3 * 64);
    let x = bf16_bytes(rows * width, 5);
    // A base other than 10000 (Llama 3's), so the parameter is seen to reach the rotation.
    let theta = 500_000.0;
    let forward = crate::rope_step(
        Param::Ptr { arg: 0, byte_offset: 0 },
        Param::Ptr { arg: 1, byte_offset: 0 },
        &shape,
        false,
        theta,
    );
    let Step::Kernel(launch) = &forward else { panic!("not a kernel") };
    assert_eq!(launch.params.iter().map(kind).collect::<Vec<_>>(), declaration("memo_rope"));
    assert_eq!(launch.block, [crate::ROPE_THREADS, 1, 1]);
    let mut data = vec![x.clone(), vec![0u8; x.len()]];
    crate::emulation::run(&[forward], &mut data, 0);
    let value =
        |bytes: &[u8], i: usize| f64::from(half::bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32());
    let mut worst = 0.0f64;
    for row in 0..rows {
        let pos = (row % 77) as f64;
        for head in 0..3 {
            for pair in 0..32 {
                let at = row * width + head * 64 + 2 * pair;
                let (a, b) = (value(&x, at), value(&x, at + 1));
                let (sin, cos) = (pos * theta.powf(-2.0 * pair as f64 / 64.0)).sin_cos();
                let want = [a * cos - b * sin, a * sin + b * cos];
                for (k, w) in want.iter().enumerate() {
                    let error = (value(&data[1], at + k) - w).abs();
                    // One bf16 rounding (2^-9 relative) and f32 ulps of the rotation.
                    assert!(error <= w.abs() / 256.0 + 1e-6, "row {row} head {head} pair {pair}: {error}");
                    worst = worst.max(error);
                }
            }
        }
    }
    assert!(worst > 0.0, "the rotation changed nothing");
    // Back, in place.
    let inverse = crate::rope_step(
        Param::Ptr { arg: 1, byte_offset: 0 },
        Param::Ptr { arg: 1, byte_offset: 0 },
        &shape,
        true,
        theta,
    );
    crate::emulation::run(&[inverse], &mut data, 0);
    for i in 0..rows * width {
        let (got, want) = (value(&data[1], i), value(&x, i));
        assert!((got - want).abs() <= 2.0 / 256.0 + 1e-6, "element {i}: {got} after the round trip of {want}");
    }
}

/// The rope launch covers every pair with a grid of at most 2^20 blocks.
#[test]
fn the_rope_grid_covers_every_pair() {
    use memo_plan_core::plan::shapes::AttentionShape;
    for (seq_len, sequences) in [(1u64, 1u64), (77, 2), (1 << 20, 1)] {
        let shape =
            AttentionShape { heads: 16, kv_heads: 16, group: 1, first_query: 0, head_dim: 128, seq_len, sequences };
        let Step::Kernel(launch) = crate::rope_step(
            Param::Ptr { arg: 0, byte_offset: 0 },
            Param::Ptr { arg: 0, byte_offset: 0 },
            &shape,
            false,
            10_000.0,
        ) else {
            panic!("not a kernel")
        };
        let pairs = seq_len * sequences * 16 * 64;
        let blocks = u64::from(launch.grid[0]);
        assert!((1..=1 << 20).contains(&blocks));
        assert!(blocks * 256 >= pairs || blocks == 1 << 20, "{blocks} blocks for {pairs} pairs");
    }
}

/// `memo_lse_transpose` (rope.cu) in its emulation: token-major to head-major puts element
/// (sequence, position, head) at ((sequence * heads + head) * seq_len + position), and back
/// gives the input again.
#[test]
fn the_lse_transpose_kernel_moves_each_element_and_back() {
    use memo_plan_core::plan::shapes::AttentionShape;
    let shape =
        AttentionShape { heads: 3, kv_heads: 3, group: 1, first_query: 0, head_dim: 64, seq_len: 5, sequences: 2 };
    let n = 2 * 5 * 3;
    let token_major: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let there = crate::lse_transpose_step(
        Param::Ptr { arg: 0, byte_offset: 0 },
        Param::Ptr { arg: 1, byte_offset: 0 },
        &shape,
        true,
    );
    let Step::Kernel(launch) = &there else { panic!("not a kernel") };
    assert_eq!(launch.params.iter().map(kind).collect::<Vec<_>>(), declaration("memo_lse_transpose"));
    let mut data = vec![token_major.clone(), vec![0u8; n * 4], vec![0u8; n * 4]];
    crate::emulation::run(&[there], &mut data, 0);
    let head_major = words(&data[1]);
    for (seq, pos, head) in [(0, 0, 0), (0, 4, 2), (1, 2, 1), (1, 4, 2)] {
        let token = ((seq * 5 + pos) * 3 + head) as f32;
        assert_eq!(head_major[(seq * 3 + head) * 5 + pos], token, "sequence {seq} position {pos} head {head}");
    }
    let back = crate::lse_transpose_step(
        Param::Ptr { arg: 1, byte_offset: 0 },
        Param::Ptr { arg: 2, byte_offset: 0 },
        &shape,
        false,
    );
    crate::emulation::run(&[back], &mut data, 0);
    assert_eq!(data[2], token_major);
}

/// The largest difference of `emulated` from `cpu` beyond `relative * |cpu| + absolute` (0 when
/// within), and the largest plain difference, element by element.
fn compare(emulated: &[f32], cpu: &[f32], relative: f32, absolute: f32) -> (f32, f32) {
    assert_eq!(emulated.len(), cpu.len());
    let mut beyond = 0f32;
    let mut worst = 0f32;
    for (x, y) in emulated.iter().zip(cpu) {
        let d = if x == y { 0.0 } else { (x - y).abs() };
        assert!(!d.is_nan(), "{x} vs {y}");
        worst = worst.max(d);
        beyond = beyond.max(d - (relative * y.abs() + absolute)).max(0.0);
    }
    (beyond, worst)
}

/// Emulates `op`'s recipe on `data` as the context's rank, runs the CPU reference on a copy, and
/// checks every argument: bf16 within a bf16 rounding (2^-8 relative) plus 1e-3 of the largest,
/// f32 within 1e-4 relative. Returns the emulated arguments and the largest difference.
fn emulated_matches_cpu_on_rank(
    op: Op,
    shapes: &[ArgShape],
    data: &[Vec<u8>],
    ctx: &KernelContext,
) -> (Vec<Vec<u8>>, f32) {
    let steps = launch_steps(op, shapes, ctx).unwrap_or_else(|e| panic!("{} rank {}: {e}", op.name(), ctx.rank));
    let mut emulated = data.to_vec();
    assert_eq!(crate::emulation::run(&steps, &mut emulated, 5), [0; 4], "{}", op.name());
    let mut cpu = data.to_vec();
    run_cpu_with(op, shapes, &mut cpu, ctx);
    let mut worst = 0f32;
    for (index, (e, c)) in emulated.iter().zip(&cpu).enumerate() {
        let name = op.signature()[index].0;
        let f32_words = matches!(name, "loss" | "max" | "sums");
        let (e, c, relative, of_max) = if f32_words {
            (words(e), words(c), 1e-4, 0.0)
        } else if matches!(name, "tokens" | "targets") {
            assert_eq!(e, c);
            continue;
        } else {
            (to_f32(e), to_f32(c), 1.0 / 256.0, 1e-3)
        };
        let largest = c.iter().filter(|x| x.is_finite()).fold(0f32, |m, x| m.max(x.abs()));
        // -inf maxima (a rank of padding only) must agree exactly.
        for (x, y) in e.iter().zip(&c) {
            if y.is_infinite() {
                assert_eq!(x, y, "{} `{name}` rank {}", op.name(), ctx.rank);
            }
        }
        let (finite_e, finite_c): (Vec<f32>, Vec<f32>) =
            e.iter().zip(&c).filter(|(_, y)| y.is_finite()).map(|(x, y)| (*x, *y)).unzip();
        let (beyond, w) = compare(&finite_e, &finite_c, relative, of_max * largest + 1e-6);
        assert_eq!(beyond, 0.0, "{} `{name}` rank {} of {}: {w} apart", op.name(), ctx.rank, ctx.ranks);
        worst = worst.max(w);
    }
    (emulated, worst)
}

/// The ops of the tensor-parallel step (`t > 1`) and the vocabulary-sharded ones, as rank `k`
/// of `t = 2` and 3, with vocabularies not divisible by `t` (37, and 4 at `t = 3`: a rank of
/// padding only) and one that is (40): each
/// recipe, emulated, against the CPU reference run as the same rank. The shard shapes are
/// accepted (the recipes check them with the context's rank and ranks).
#[test]
fn the_t_greater_than_one_ops_run_as_a_rank_and_match_the_cpu() {
    let mut worst = 0f32;
    for (vocab, ranks) in [(37u64, 2u64), (40, 2), (37, 3), (4, 3)] {
        let shard = vocab.div_ceil(ranks);
        let (rows, h) = (ROWS, H * 2);
        for rank in 0..ranks {
            let mut ctx = context_for(H, vocab, rows);
            ctx.rank = rank;
            ctx.ranks = ranks;
            let launches = [
                (Op::Embedding, vec![shape(rows, 4), shape(shard * ranks, h), shape(rows, h)]),
                (Op::EmbeddingBackward, vec![shape(rows, 4), shape(rows, h), shape(shard * ranks, h)]),
                (Op::Classifier, vec![shape(rows, h), shape(shard, h), shape(rows, shard * 2)]),
                (Op::ClassifierBackwardWeight, vec![shape(rows, h), shape(rows, shard * 2), shape(shard, h)]),
                (Op::LinearNoBias, vec![shape(rows, h), shape(24, h), shape(rows, 48)]),
                (Op::AddBias, vec![shape(1, 48), shape(rows, 48)]),
                (Op::CrossEntropyMax, vec![shape(rows, shard * 2), shape(rows, 4)]),
            ];
            for (op, shapes) in launches {
                let data = inputs(op, &shapes, vocab, 17 + rank);
                let (out, w) = emulated_matches_cpu_on_rank(op, &shapes, &data, &ctx);
                assert_ne!(out, data, "{} rank {rank}: nothing written", op.name());
                worst = worst.max(w);
            }
        }
    }
    // The same f32 sums in the same order: the emulation agrees with the CPU to the bit here.
    assert!(worst <= 1e-2, "{worst}");
}

/// The split cross-entropy over `t` ranks, each rank's three launches emulated and checked
/// against the CPU reference as that rank, the maxima and sums combined across ranks as the
/// all-reduces do (`V = 4`, `t = 3`: the last rank holds padding only): the loss equals the one-rank `cross_entropy` of the whole logits, and each
/// rank's gradient columns are the one-rank gradient's columns at the rank's vocabulary offset
/// (padding columns 0).
#[test]
fn the_split_cross_entropy_over_ranks_is_the_whole_cross_entropy() {
    for (vocab, ranks) in [(37u64, 2u64), (40, 2), (37, 3), (37, 1), (4, 3)] {
        let shard = vocab.div_ceil(ranks);
        let rows = ROWS;
        let whole_logits = bf16_bytes((rows * vocab) as usize, 23);
        let targets: Vec<u8> = (0..rows).flat_map(|r| ((r * 7 + 3) as u32 % vocab as u32).to_le_bytes()).collect();
        // Rank k's logits: the whole logits' columns [k V', (k + 1) V'), padding past V.
        let shard_logits = |k: u64| -> Vec<u8> {
            let mut out = vec![0u8; (rows * shard * 2) as usize];
            for r in 0..rows {
                for c in 0..shard {
                    let column = k * shard + c;
                    if column < vocab {
                        let from = ((r * vocab + column) * 2) as usize;
                        let to = ((r * shard + c) * 2) as usize;
                        out[to..to + 2].copy_from_slice(&whole_logits[from..from + 2]);
                    } else {
                        // Padding: a large value that must not count.
                        let to = ((r * shard + c) * 2) as usize;
                        out[to..to + 2].copy_from_slice(&half::bf16::from_f32(50.0).to_bits().to_le_bytes());
                    }
                }
            }
            out
        };
        let context = |k: u64| {
            let mut ctx = context_for(H, vocab, rows);
            ctx.rank = k;
            ctx.ranks = ranks;
            ctx
        };
        let logits_shape = shape(rows, shard * 2);
        // Maxima, combined by max (all_reduce_max_f32).
        let mut max = vec![f32::NEG_INFINITY; rows as usize];
        for k in 0..ranks {
            let data = vec![shard_logits(k), vec![0u8; (rows * 4) as usize]];
            let (out, _) =
                emulated_matches_cpu_on_rank(Op::CrossEntropyMax, &[logits_shape, shape(rows, 4)], &data, &context(k));
            for (m, x) in max.iter_mut().zip(words(&out[1])) {
                *m = m.max(x);
            }
        }
        let max_bytes: Vec<u8> = max.iter().flat_map(|m| m.to_le_bytes()).collect();
        // Sums, combined by addition (all_reduce_sum_f32).
        let mut sums = vec![0f32; 2 * rows as usize];
        let sums_shapes = [logits_shape, shape(rows, 4), shape(rows, 4), shape(rows, 8)];
        for k in 0..ranks {
            let data = vec![shard_logits(k), targets.clone(), max_bytes.clone(), vec![0u8; (rows * 8) as usize]];
            let (out, _) = emulated_matches_cpu_on_rank(Op::CrossEntropySums, &sums_shapes, &data, &context(k));
            for (s, x) in sums.iter_mut().zip(words(&out[3])) {
                *s += x;
            }
        }
        let sums_bytes: Vec<u8> = sums.iter().flat_map(|s| s.to_le_bytes()).collect();
        // The whole cross-entropy, one rank.
        let mut whole = vec![whole_logits.clone(), targets.clone(), 0f32.to_le_bytes().to_vec()];
        let whole_shapes = [shape(rows, vocab * 2), shape(rows, 4), shape(1, 4)];
        run_cpu_with(Op::CrossEntropy, &whole_shapes, &mut whole, &context_for(H, vocab, rows));
        let whole_loss = words(&whole[2])[0];
        let whole_grad = to_f32(&whole[0]);
        let finish_shapes = [logits_shape, shape(rows, 4), shape(rows, 4), shape(rows, 8), shape(1, 4)];
        for k in 0..ranks {
            let data = vec![
                shard_logits(k),
                targets.clone(),
                max_bytes.clone(),
                sums_bytes.clone(),
                0f32.to_le_bytes().to_vec(),
            ];
            let (out, _) = emulated_matches_cpu_on_rank(Op::CrossEntropyFinish, &finish_shapes, &data, &context(k));
            // Every rank adds the whole loss (its rows' sums are the combined ones).
            let loss = words(&out[4])[0];
            assert!((loss - whole_loss).abs() <= 1e-4 * whole_loss.abs(), "rank {k}: loss {loss} vs {whole_loss}");
            let grad = to_f32(&out[0]);
            for r in 0..rows {
                for c in 0..shard {
                    let got = grad[(r * shard + c) as usize];
                    let column = k * shard + c;
                    let want = if column < vocab { whole_grad[(r * vocab + column) as usize] } else { 0.0 };
                    assert!(
                        (got - want).abs() <= want.abs() / 128.0 + 1e-6,
                        "V {vocab} t {ranks} rank {k} row {r} column {c}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// A target at or past the vocabulary is reported by the split cross-entropy's kernels, with the
/// instruction, as the whole one's is.
#[test]
fn the_split_cross_entropy_reports_a_bad_target() {
    let mut ctx = context_for(H, 37, ROWS);
    ctx.rank = 1;
    ctx.ranks = 2;
    let shard = 19;
    let logits = shape(ROWS, shard * 2);
    for (op, shapes) in [
        (Op::CrossEntropySums, vec![logits, shape(ROWS, 4), shape(ROWS, 4), shape(ROWS, 8)]),
        (Op::CrossEntropyFinish, vec![logits, shape(ROWS, 4), shape(ROWS, 4), shape(ROWS, 8), shape(1, 4)]),
    ] {
        let mut data = inputs(op, &shapes, 37, 3);
        // 37 is a column of this rank's padding: still out of the vocabulary.
        data[1][8..12].copy_from_slice(&37u32.to_le_bytes());
        let steps = launch_steps(op, &shapes, &ctx).expect("steps");
        let status = crate::emulation::run(&steps, &mut data, 41);
        assert_eq!(status, [2, 41, 2, 37], "{}", op.name());
    }
}

/// The f64 values of bf16 bytes.
fn to_f64(bytes: &[u8]) -> Vec<f64> {
    to_f32(bytes).into_iter().map(f64::from).collect()
}

/// What `op` (rms_norm, rms_norm_backward, swiglu, swiglu_backward,
/// linear_backward_weight_no_bias) writes, in f64 from the definitions: (argument, values).
fn llama_reference(op: Op, shapes: &[ArgShape], data: &[Vec<u8>], eps: f64) -> Vec<(usize, Vec<f64>)> {
    let rows = shapes[0].rows as usize;
    let sigmoid = |g: f64| 1.0 / (1.0 + (-g).exp());
    match op {
        Op::RmsNorm | Op::RmsNormBackward => {
            let (x, scale) = (to_f64(&data[0]), to_f64(&data[1]));
            let h = scale.len();
            let rstd: Vec<f64> = (0..rows)
                .map(|r| 1.0 / (x[r * h..(r + 1) * h].iter().map(|v| v * v).sum::<f64>() / h as f64 + eps).sqrt())
                .collect();
            if op == Op::RmsNorm {
                let y = (0..rows * h).map(|i| x[i] * rstd[i / h] * scale[i % h]).collect();
                return vec![(2, y)];
            }
            let dy = to_f64(&data[2]);
            let mut dx = vec![0f64; rows * h];
            let mut dscale = vec![0f64; h];
            for (r, &rstd) in rstd.iter().enumerate() {
                let at = |j: usize| r * h + j;
                let mean_gx = (0..h).map(|j| dy[at(j)] * scale[j] * x[at(j)] * rstd).sum::<f64>() / h as f64;
                for j in 0..h {
                    let xhat = x[at(j)] * rstd;
                    dx[at(j)] = rstd * (dy[at(j)] * scale[j] - xhat * mean_gx);
                    dscale[j] += dy[at(j)] * xhat;
                }
            }
            vec![(3, dx), (4, dscale)]
        }
        Op::Swiglu | Op::SwigluBackward => {
            let x = to_f64(&data[0]);
            let w = x.len() / rows / 2;
            let (gate, up) = (|r: usize, j: usize| x[r * 2 * w + j], |r: usize, j: usize| x[r * 2 * w + w + j]);
            if op == Op::Swiglu {
                let y = (0..rows * w).map(|i| gate(i / w, i % w) * sigmoid(gate(i / w, i % w)) * up(i / w, i % w));
                return vec![(1, y.collect())];
            }
            let dy = to_f64(&data[1]);
            let mut dx = vec![0f64; rows * 2 * w];
            for r in 0..rows {
                for j in 0..w {
                    let (g, u, d) = (gate(r, j), up(r, j), dy[r * w + j]);
                    let s = sigmoid(g);
                    dx[r * 2 * w + j] = d * u * s * (1.0 + g * (1.0 - s));
                    dx[r * 2 * w + w + j] = d * g * s;
                }
            }
            vec![(2, dx)]
        }
        Op::LinearBackwardWeightNoBias => {
            let (x, dy) = (to_f64(&data[0]), to_f64(&data[1]));
            let (k, n) = (x.len() / rows, dy.len() / rows);
            let dw = (0..n * k).map(|i| (0..rows).map(|r| dy[r * n + i / k] * x[r * k + i % k]).sum()).collect();
            vec![(2, dw)]
        }
        other => panic!("{other:?} has no f64 reference here"),
    }
}

/// The Llama family's ops (RMS norm, SwiGLU, the weight gradient without bias), each recipe run by
/// the emulation, against f64 references of their definitions: bf16 outputs within a bf16
/// rounding of each value plus 1e-3 of the largest; an eps other than GPT's reaches the kernels.
#[test]
fn the_llama_ops_match_an_f64_reference() {
    let llama = [Op::RmsNorm, Op::RmsNormBackward, Op::Swiglu, Op::SwigluBackward, Op::LinearBackwardWeightNoBias];
    for (hidden, rows, eps) in [(H, ROWS, 1e-5), (2100, 200, 1e-6), (H, ROWS, 0.5)] {
        let mut ctx = context_for(hidden, VOCAB, rows);
        ctx.norm_eps = eps;
        for (op, shapes) in launches(hidden, VOCAB, rows).into_iter().filter(|(op, _)| llama.contains(op)) {
            let data = inputs(op, &shapes, VOCAB, 31);
            let steps = launch_steps(op, &shapes, &ctx).unwrap_or_else(|e| panic!("{e}"));
            let mut emulated = data.clone();
            assert_eq!(crate::emulation::run(&steps, &mut emulated, 5), [0; 4], "{}", op.name());
            for (arg, want) in llama_reference(op, &shapes, &data, eps) {
                let got = to_f64(&emulated[arg]);
                assert_eq!(got.len(), want.len(), "{}", op.name());
                let largest = want.iter().fold(0f64, |m, x| m.max(x.abs()));
                assert!(largest > 0.0, "{}: all zero", op.name());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let bound = w.abs() / 256.0 + 1e-3 * largest + 1e-6;
                    assert!(
                        (g - w).abs() <= bound,
                        "{} arg {arg} [{i}]: {g} vs {w} (h {hidden}, eps {eps})",
                        op.name()
                    );
                }
            }
        }
    }
}

/// The RMS norm's backward zeroes dscale for no rows; the weight gradient without bias zeroes
/// dweight; neither runs a kernel.
#[test]
fn empty_llama_backward_launches_zero_their_sums() {
    let ctx = context();
    let steps = launch_steps(
        Op::RmsNormBackward,
        &[shape(0, 32), shape(1, 32), shape(0, 32), shape(0, 32), shape(1, 32)],
        &ctx,
    )
    .expect("empty rms_norm_backward");
    assert_eq!(steps, vec![Step::Zero { arg: 4 }]);
    let steps = launch_steps(Op::LinearBackwardWeightNoBias, &[shape(0, 32), shape(0, 48), shape(24, 32)], &ctx)
        .expect("empty backward weight");
    assert_eq!(steps, vec![Step::Zero { arg: 2 }]);
}
