//! The marshalling of every launch of real plans, against the real recipes: every step of every
//! launch of the tiny model's plans resolves, every pointer lands inside its argument, every
//! GEMM's operands fit their arguments, every kernel is one the compiled sources define.

use memo_plan_core::model::Parallelism;
use memo_plan_core::plan::{Access, Action, Place, Strategy};
use memo_plan_core::planner::{self, PlanRequest};
use memo_runtime::{cpu_hardware, training_model, AdamW, KernelContext};

use super::*;

const ARENA_BASE: u64 = 1 << 40;
const HOST_BASE: u64 = 1 << 44;
const SCRATCH_BASE: u64 = 1 << 46;
const STATUS: u64 = 1 << 47;

fn arg(space: Space, offset: u64, len: u64) -> KernelArg {
    KernelArg { span: Span { space, offset, len }, first_row: 0, rows: 1, row_bytes: len, access: Access::Read }
}

#[test]
fn every_launch_of_the_tiny_model_marshals_inside_its_arguments() {
    let model = training_model("tiny", 64).expect("tiny");
    let known: Vec<&str> = memo_kernels::SOURCES.iter().flat_map(|s| s.kernels.iter().copied()).collect();
    for strategy in [Strategy::Memo, Strategy::KeepAll, Strategy::FullRecompute, Strategy::FullSwap] {
        let request = PlanRequest::new(model.clone(), Parallelism::single(), cpu_hardware(1 << 30), strategy);
        let plan = planner::plan(&request).expect("the tiny model plans").plan;
        let context = KernelContext {
            hidden: model.hidden,
            heads: model.heads,
            kv_heads: 0,
            kv_replicated: false,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            seq_len: model.seq_len,
            vocab: model.vocab,
            loss_scale_tokens: model.seq_len * model.micro_batch,
            adamw: AdamW::default(),
            rank: 0,
            ranks: 1,
            context_rank: 0,
            context_ranks: 1,
        };
        let mut layout = Layout {
            arena: (ARENA_BASE, plan.totals.arena_bytes),
            host: (HOST_BASE, plan.totals.host_bytes),
            scratch: (SCRATCH_BASE, 0),
            status: Some(STATUS),
        };
        let (mut kernels, mut gemms, mut zeros) = (0, 0, 0);
        for (index, instruction) in plan.instructions.iter().enumerate() {
            let Action::Launch(launch) = &instruction.action else { continue };
            let args: Vec<KernelArg> = launch
                .args
                .iter()
                .map(|a| {
                    let buffer = &plan.buffers[a.region.buffer.index()];
                    let (space, offset) = match buffer.place {
                        Place::Device { offset } => (Space::Device, offset),
                        Place::Host { offset } => (Space::Host, offset),
                    };
                    KernelArg {
                        span: Span {
                            space,
                            offset: offset + a.region.start * buffer.row_bytes,
                            len: (a.region.end - a.region.start) * buffer.row_bytes,
                        },
                        first_row: a.region.start,
                        rows: a.region.end - a.region.start,
                        row_bytes: buffer.row_bytes,
                        access: a.access,
                    }
                })
                .collect();
            let shapes: Vec<memo_kernels::ArgShape> = args
                .iter()
                .map(|a| memo_kernels::ArgShape { first_row: a.first_row, rows: a.rows, row_bytes: a.row_bytes })
                .collect();
            let steps = memo_kernels::launch_steps(launch.op, &shapes, &context)
                .unwrap_or_else(|e| panic!("{strategy:?} instruction {index}: {e}"));
            layout.scratch.1 = layout.scratch.1.max(memo_kernels::scratch_bytes(&steps));
            for step in &steps {
                match step {
                    memo_kernels::Step::Kernel(kernel) => {
                        assert!(
                            known.contains(&kernel.kernel),
                            "{}: kernel `{}` is in no source",
                            launch.op.name(),
                            kernel.kernel
                        );
                        let slots = layout
                            .kernel_params(index, launch.op, &args, kernel)
                            .unwrap_or_else(|e| panic!("{strategy:?}: {e}"));
                        for (slot, param) in slots.iter().zip(&kernel.params) {
                            if let Param::Ptr { arg, .. } = param {
                                let address = u64::from_ne_bytes(*slot);
                                let span = args[*arg].span;
                                let base = if span.space == Space::Device { ARENA_BASE } else { HOST_BASE };
                                assert!(
                                    (base + span.offset..=base + span.offset + span.len).contains(&address),
                                    "{}: a pointer outside argument {arg}",
                                    launch.op.name()
                                );
                            }
                        }
                        kernels += 1;
                    }
                    memo_kernels::Step::Gemm(gemm) => {
                        let call = layout
                            .gemm_call(index, launch.op, &args, gemm)
                            .unwrap_or_else(|e| panic!("{strategy:?}: {e}"));
                        assert!(call.m >= 0 && call.n >= 0 && call.k >= 0);
                        gemms += 1;
                    }
                    memo_kernels::Step::Zero { arg } => {
                        assert!(*arg < args.len());
                        zeros += 1;
                    }
                }
            }
        }
        assert!(kernels > 0 && gemms > 0, "{strategy:?}: {kernels} kernels, {gemms} GEMMs, {zeros} zeros");
    }
}

#[test]
fn addresses_outside_the_memory_or_an_argument_are_refused() {
    let layout = Layout { arena: (ARENA_BASE, 1000), host: (HOST_BASE, 100), scratch: (0, 0), status: None };
    let outside = Span { space: Space::Host, offset: 90, len: 20 };
    assert_eq!(layout.address(outside), Err(BackendError::OutOfBounds { span: outside, size: 100 }));
    assert_eq!(layout.address(Span { space: Space::Device, offset: 10, len: 990 }), Ok(ARENA_BASE + 10));
    let args = [arg(Space::Device, 100, 64)];
    assert_eq!(layout.operand(3, Op::Add, &args, 0, 32, 32), Ok(ARENA_BASE + 132));
    assert!(matches!(layout.operand(3, Op::Add, &args, 0, 33, 32), Err(BackendError::Kernel { instruction: 3, .. })));
    assert!(matches!(layout.operand(3, Op::Add, &args, 1, 0, 0), Err(BackendError::Kernel { instruction: 3, .. })));
}

#[test]
fn scratch_and_status_parameters_need_their_memory() {
    let args = [arg(Space::Device, 0, 64)];
    let launch = |params: Vec<Param>, scratch_bytes: u64| KernelLaunch {
        kernel: "k",
        grid: [1, 1, 1],
        block: [64, 1, 1],
        shared_bytes: 0,
        params,
        scratch_bytes,
    };
    let none = Layout { arena: (ARENA_BASE, 64), host: (HOST_BASE, 0), scratch: (0, 0), status: None };
    assert!(none.kernel_params(0, Op::Add, &args, &launch(vec![Param::Status], 0)).is_err());
    assert!(none.kernel_params(0, Op::Add, &args, &launch(vec![Param::Scratch { byte_offset: 0 }], 256)).is_err());
    let some = Layout { scratch: (SCRATCH_BASE, 256), status: Some(STATUS), ..none };
    let slots = some
        .kernel_params(
            7,
            Op::Add,
            &args,
            &launch(
                vec![
                    Param::Scratch { byte_offset: 0 },
                    Param::Status,
                    Param::Instruction,
                    Param::U32(5),
                    Param::F32(0.5),
                ],
                256,
            ),
        )
        .expect("all resolve");
    assert_eq!(u64::from_ne_bytes(slots[0]), SCRATCH_BASE);
    assert_eq!(u64::from_ne_bytes(slots[1]), STATUS);
    assert_eq!(u32::from_ne_bytes([slots[2][0], slots[2][1], slots[2][2], slots[2][3]]), 7);
    assert_eq!(u32::from_ne_bytes([slots[3][0], slots[3][1], slots[3][2], slots[3][3]]), 5);
    assert_eq!(f32::from_ne_bytes([slots[4][0], slots[4][1], slots[4][2], slots[4][3]]), 0.5);
    assert!(some.kernel_params(0, Op::Add, &args, &launch(vec![Param::Scratch { byte_offset: 0 }], 512)).is_err());
}

#[test]
fn a_gemm_whose_operands_overrun_their_arguments_is_refused() {
    // C = A B with A 4x3, B 3x2, C 4x2, bf16: 24, 12 and 16 bytes.
    let layout = Layout { arena: (ARENA_BASE, 1 << 20), host: (0, 0), scratch: (0, 0), status: None };
    let args = [arg(Space::Device, 0, 24), arg(Space::Device, 1024, 12), arg(Space::Device, 2048, 16)];
    let operand = |arg| memo_kernels::Operand { arg, byte_offset: 0 };
    let gemm = Gemm {
        transpose_a: false,
        transpose_b: false,
        m: 4,
        n: 2,
        k: 3,
        a: operand(0),
        lda: 4,
        b: operand(1),
        ldb: 3,
        c: operand(2),
        ldc: 4,
        alpha: 1.0,
        beta: 0.0,
    };
    let call = layout.gemm_call(0, Op::Add, &args, &gemm).expect("fits exactly");
    assert_eq!((call.op_a, call.op_b, call.m, call.n, call.k), (OP_N, OP_N, 4, 2, 3));
    assert_eq!(call.c as u64, ARENA_BASE + 2048);
    // The same A read transposed (3x4 stored, lda 3) also fits its 24 bytes.
    let transposed = Gemm { transpose_a: true, lda: 3, ..gemm };
    assert_eq!(layout.gemm_call(0, Op::Add, &args, &transposed).expect("fits").op_a, OP_T);
    // A leading dimension below the rows, or one more column than the bytes hold, is refused.
    assert!(layout.gemm_call(0, Op::Add, &args, &Gemm { lda: 3, ..gemm }).is_err());
    assert!(layout.gemm_call(0, Op::Add, &args, &Gemm { n: 3, ..gemm }).is_err());
}
