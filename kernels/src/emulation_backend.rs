//! The recipes on real plans: a `Backend` that runs every launch through `launch_steps` and the
//! host emulation of its steps (`emulation.rs`), and attention through `runtime-cpu`'s op (the
//! attention kernels have their own lane-level emulation, `attention_emulation.rs`). A tiny GPT
//! trained with it through `memo_runtime::Trainer` must match the CPU backend. This proves that
//! every launch of the planner's plans (each strategy's row ranges, classifier chunks,
//! recompute ranges) is accepted by the recipes and computes the right thing.
//!
//! Instructions run one at a time in plan order; the interpreter issues them in that order, and
//! the plan is a sequential program whose streams only add overlap.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use memo_plan_core::plan::{Access, EventId, Op, Strategy, Stream};
use memo_runtime::data::{TextData, DEFAULT_TEXT};
use memo_runtime::{
    cpu_hardware, AdamW, Backend, BackendError, KernelArg, KernelContext, MemoryReport, Space, Span, TrainOptions,
    Trainer,
};
use runtime_cpu::ops::{self, Arg, ArgData, OpContext};
use runtime_cpu::CpuBackend;

use crate::{launch_steps, status_error, ArgShape};

#[derive(Default)]
struct EmulatedBackend {
    arena: Vec<u8>,
    host: Vec<u8>,
    /// Launches run through the recipes (shared: the trainer owns the backend).
    launches: Arc<AtomicUsize>,
}

impl EmulatedBackend {
    fn bytes(&mut self, span: Span) -> Result<&mut [u8], BackendError> {
        let memory = match span.space {
            Space::Device => &mut self.arena,
            Space::Host => &mut self.host,
        };
        let size = memory.len() as u64;
        let end = span.offset.checked_add(span.len).filter(|&end| end <= size);
        match end {
            Some(end) => Ok(&mut memory[span.offset as usize..end as usize]),
            None => Err(BackendError::OutOfBounds { span, size }),
        }
    }
}

fn cpu_context(ctx: &KernelContext) -> OpContext {
    OpContext {
        hidden: ctx.hidden as usize,
        heads: ctx.heads as usize,
        kv_heads: ctx.kv_heads as usize,
        kv_replicated: ctx.kv_replicated,
        rope_theta: ctx.rope_theta,
        norm_eps: ctx.norm_eps,
        seq_len: ctx.seq_len as usize,
        vocab: ctx.vocab as usize,
        loss_scale_tokens: ctx.loss_scale_tokens as usize,
        adamw: ctx.adamw,
        context_rank: usize::try_from(ctx.context_rank).unwrap_or(usize::MAX),
        context_ranks: usize::try_from(ctx.context_ranks).unwrap_or(usize::MAX),
    }
}

// Every call runs at once on one thread: no two streams' work ever overlaps in time.
#[allow(unsafe_code)]
impl Backend for EmulatedBackend {
    fn name(&self) -> String {
        "emulated recipes".into()
    }

    fn allocate(&mut self, arena_bytes: u64, host_bytes: u64, _events: u32) -> Result<(), BackendError> {
        self.arena = vec![0; arena_bytes as usize];
        self.host = vec![0; host_bytes as usize];
        Ok(())
    }

    fn upload(&mut self, span: Span, bytes: &[u8]) -> Result<(), BackendError> {
        self.bytes(span)?.copy_from_slice(bytes);
        Ok(())
    }

    fn download(&mut self, span: Span) -> Result<Vec<u8>, BackendError> {
        Ok(self.bytes(span)?.to_vec())
    }

    unsafe fn launch(
        &mut self,
        instruction: usize,
        _stream: Stream,
        op: Op,
        args: &[KernelArg],
        context: &KernelContext,
    ) -> Result<(), BackendError> {
        let failed = |message: String| BackendError::Kernel { instruction, message };
        let mut data: Vec<Vec<u8>> =
            args.iter().map(|a| self.bytes(a.span).map(|b| b.to_vec())).collect::<Result<_, _>>()?;
        if matches!(op, Op::Attention | Op::AttentionBackward) {
            let mut cpu_args: Vec<Arg<'_>> = data
                .iter_mut()
                .zip(args)
                .map(|(bytes, a)| Arg {
                    data: if a.access == Access::Read { ArgData::Read(bytes) } else { ArgData::Write(bytes) },
                    first_row: a.first_row as usize,
                    rows: a.rows as usize,
                    row_bytes: a.row_bytes as usize,
                })
                .collect();
            ops::execute_with_threads(op, &mut cpu_args, &cpu_context(context), 1)
                .map_err(|e| failed(e.to_string()))?;
        } else {
            let shapes: Vec<ArgShape> = args
                .iter()
                .map(|a| ArgShape { first_row: a.first_row, rows: a.rows, row_bytes: a.row_bytes })
                .collect();
            let steps = launch_steps(op, &shapes, context).map_err(|e| failed(e.to_string()))?;
            let status = crate::emulation::run(&steps, &mut data, instruction as u32);
            if let Some((at, message)) = status_error(status) {
                return Err(BackendError::Kernel { instruction: at, message });
            }
            self.launches.fetch_add(1, Ordering::Relaxed);
        }
        for (a, bytes) in args.iter().zip(&data) {
            if a.access.writes() {
                self.bytes(a.span)?.copy_from_slice(bytes);
            }
        }
        Ok(())
    }

    unsafe fn copy(&mut self, _instruction: usize, _stream: Stream, src: Span, dst: Span) -> Result<(), BackendError> {
        let bytes = self.bytes(src)?.to_vec();
        self.bytes(dst)?.copy_from_slice(&bytes);
        Ok(())
    }

    fn record(&mut self, _instruction: usize, _stream: Stream, _event: EventId) -> Result<(), BackendError> {
        Ok(())
    }

    fn wait(&mut self, _instruction: usize, _stream: Stream, _event: EventId) -> Result<(), BackendError> {
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    fn memory(&self) -> MemoryReport {
        MemoryReport { device_bytes: self.arena.len() as u64, host_bytes: self.host.len() as u64, scratch_bytes: 0 }
    }
}

/// Two steps of a tiny GPT: losses and parameters as f32.
fn train<B: Backend>(backend: B, strategy: Strategy, alpha: Option<f64>) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut model = memo_plan_core::model::ModelConfig::new("test", 2, 32, 2, 40, 1);
    model.vocab = 256;
    let options = TrainOptions {
        model,
        strategy,
        forced_alpha: alpha,
        hardware: cpu_hardware(1 << 30),
        seed: 11,
        adamw: AdamW { lr: 3e-3, ..AdamW::default() },
    };
    let mut trainer = Trainer::new(backend, &options).unwrap_or_else(|e| panic!("{strategy:?}: {e}"));
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).expect("text");
    let mut losses = Vec::new();
    for _ in 0..2 {
        let (tokens, targets) = data.next_batch(1, 40);
        losses.push(trainer.step(&tokens, &targets).unwrap_or_else(|e| panic!("{strategy:?}: {e}")));
    }
    let parameters = trainer.parameters().expect("parameters");
    let parameters = parameters
        .iter()
        .map(|(_, bytes)| {
            bytes.chunks_exact(2).map(|p| half::bf16::from_bits(u16::from_le_bytes([p[0], p[1]])).to_f32()).collect()
        })
        .collect();
    (losses, parameters)
}

#[test]
fn every_strategy_trains_through_the_recipes_like_the_cpu() {
    for (strategy, alpha) in [
        (Strategy::KeepAll, None),
        (Strategy::Memo, Some(0.5)),
        (Strategy::FullSwap, None),
        (Strategy::FullRecompute, None),
    ] {
        let (cpu_losses, cpu_parameters) = train(CpuBackend::new(), strategy, alpha);
        let backend = EmulatedBackend::default();
        let launches = backend.launches.clone();
        let (losses, parameters) = train(backend, strategy, alpha);
        assert!(launches.load(Ordering::Relaxed) > 0);
        for (e, c) in losses.iter().zip(&cpu_losses) {
            assert!((e - c).abs() <= 1e-3 * c.abs(), "{strategy:?}: loss {e} vs {c}");
        }
        let (mut elements, mut beyond) = (0usize, 0usize);
        for (e, c) in parameters.iter().zip(&cpu_parameters) {
            for (x, y) in e.iter().zip(c) {
                // AdamW moves an element by about lr per step whatever its gradient's size.
                assert!((x - y).abs() <= 2.0 * 3e-3 * 2.0 + 1e-3, "{strategy:?}: {x} vs {y}");
                elements += 1;
                beyond += usize::from((x - y).abs() > 1e-3);
            }
        }
        assert!(beyond * 100 <= elements, "{strategy:?}: {beyond} of {elements} parameters differ by > 1e-3");
    }
}
