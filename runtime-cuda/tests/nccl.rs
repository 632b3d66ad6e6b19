//! NCCL through `runtime_cuda::nccl`. Without NCCL every test that needs it prints SKIP (the
//! first test checks the missing-library error instead); without a driver or device likewise.
//! On a GPU with NCCL:
//! - one rank: all-reduce (sum, max), all-gather and reduce-scatter return their input bit for
//!   bit (at t = 1 each is the identity, so the NCCL path equals the path without it);
//! - two ranks on the one GPU, only where NCCL allows it (2.30 or newer and
//!   `NCCL_MULTI_RANK_GPU_ENABLE=1`; SKIP otherwise): each collective against the CPU's result.
//!   The inputs are small integers, exact in bf16 and f32 and in any order of summation, so the
//!   results must be equal, not merely close.
//!
//! Through the backend (`CudaBackend::join`, the plan's collective launches on the collective
//! stream, `spec/backends.md` "Collectives on GPUs"):
//! - without a communicator a collective launch is refused and says how to get one (device only);
//! - at one rank, a t = 1 plan trains bit-identically with NCCL joined and without, and every
//!   collective op launched through the backend returns its input bit for bit, as the CPU's;
//! - two ranks on the one GPU (where NCCL allows it): every collective op launched through two
//!   backends gives the bits two CPU backends in an in-process group give (inputs of magnitude
//!   0.5 to 4, so a sum of two is exact in f32 and both round it to bf16 once).

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;
use memo_plan_core::plan::{Op, Strategy, Stream};
use memo_runtime::data::{TextData, DEFAULT_TEXT};
use memo_runtime::{
    cpu_hardware, AdamW, Backend, Collectives, KernelArg, KernelContext, LocalGroup, Space, Span, TrainOptions, Trainer,
};
use runtime_cpu::CpuBackend;
use runtime_cuda::nccl::{self, Communicator, DataType, Nccl, NcclError, ReduceOp};
use runtime_cuda::CudaBackend;

/// Long enough for NCCL to set up two ranks on one machine.
const JOIN: Duration = Duration::from_secs(60);

fn nccl_or_skip() -> Option<Nccl> {
    match nccl::load() {
        Ok(nccl) => {
            println!("{nccl:?}");
            Some(nccl)
        }
        Err(error) => {
            skip::skip(format!("no usable NCCL: {error}"));
            None
        }
    }
}

fn device_or_skip() -> Option<(CudaBackend, Arc<CudaContext>)> {
    let backend = match CudaBackend::new(0) {
        Ok(backend) => backend,
        Err(error) => {
            skip::skip(format!("no CUDA device: {error}"));
            return None;
        }
    };
    // The primary context of device 0: the one the backend uses.
    let ctx = CudaContext::new(0).expect("the device the backend opened");
    Some((backend, ctx))
}

#[test]
fn loading_nccl_never_panics_and_a_missing_library_says_how_to_fix_it() {
    match nccl::load() {
        Ok(nccl) => skip::skip(format!("NCCL is installed here ({nccl:?}); the missing-library path is not reachable")),
        Err(error @ NcclError::LibraryNotFound { .. }) => {
            let text = error.to_string();
            assert!(text.starts_with("NCCL cannot be loaded; tried "), "{text}");
            assert!(text.contains("libnccl.so.2") && text.contains("MEMO_NCCL_LIBRARY"), "{text}");
            assert!(error.is_unavailable());
        }
        Err(other) => assert!(other.is_unavailable(), "an NCCL that loads but is unusable: {other}"),
    }
}

fn upload<T: cudarc::driver::DeviceRepr>(stream: &Arc<CudaStream>, data: &[T]) -> CudaSlice<T> {
    stream.clone_htod(data).expect("upload")
}

fn bf16_bits(values: &[f32]) -> Vec<u16> {
    values.iter().map(|&v| bf16::from_f32(v).to_bits()).collect()
}

/// A collective and its reduction.
#[derive(Clone, Copy)]
enum Call {
    AllReduce(ReduceOp),
    AllGather,
    ReduceScatter(ReduceOp),
}

/// Runs `call` with `count` (the count NCCL takes: per rank for all-gather and reduce-scatter)
/// from a device buffer holding `input` into a zeroed one of `recv_len` elements; returns it.
fn run<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy + Default>(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    call: Call,
    dtype: DataType,
    input: &[T],
    count: usize,
    recv_len: usize,
) -> Vec<T> {
    let world = comm.world_size();
    let (send_needs, recv_needs) = match call {
        Call::AllReduce(_) => (count, count),
        Call::AllGather => (count, count * world),
        Call::ReduceScatter(_) => (count * world, count),
    };
    assert!(input.len() >= send_needs && recv_len >= recv_needs, "the test's buffers are too short");
    assert_eq!(std::mem::size_of::<T>(), dtype.bytes());
    let send = upload(stream, input);
    let mut recv: CudaSlice<T> = stream.alloc_zeros(recv_len).expect("alloc");
    {
        let (s, _s) = send.device_ptr(stream);
        let (r, _r) = recv.device_ptr_mut(stream);
        let st = nccl::stream(stream);
        // Safety: the extents were checked against the two buffers' lengths above; both are
        // distinct device buffers of this communicator's device, alive until the stream is
        // synchronised below, and nothing else uses them.
        let result = unsafe {
            match call {
                Call::AllReduce(op) => comm.all_reduce(s, r, count, dtype, op, st),
                Call::AllGather => comm.all_gather(s, r, count, dtype, st),
                Call::ReduceScatter(op) => comm.reduce_scatter(s, r, count, dtype, op, st),
            }
        };
        result.expect("collective");
    }
    stream.synchronize().expect("synchronize");
    stream.clone_dtoh(&recv).expect("download")
}

#[test]
fn at_one_rank_every_collective_returns_its_input_bit_for_bit() {
    let Some(nccl) = nccl_or_skip() else { return };
    let Some((backend, ctx)) = device_or_skip() else { return };
    let id = nccl.unique_id().expect("unique id");
    let comm = backend.join_collectives(&nccl, &id, 1, 0, JOIN).expect("one rank joins");
    ctx.bind_to_thread().expect("bind");
    let stream = ctx.new_stream().expect("stream");
    let values: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let bits = bf16_bits(&values);
    let n = values.len();
    let sum = run(&comm, &stream, Call::AllReduce(ReduceOp::Sum), DataType::F32, &values, n, n);
    assert_eq!(sum, values);
    let max = run(&comm, &stream, Call::AllReduce(ReduceOp::Max), DataType::Bf16, &bits, n, n);
    assert_eq!(max, bits);
    let gathered = run(&comm, &stream, Call::AllGather, DataType::Bf16, &bits, n, n);
    assert_eq!(gathered, bits);
    let scattered = run(&comm, &stream, Call::ReduceScatter(ReduceOp::Sum), DataType::Bf16, &bits, n, n);
    assert_eq!(scattered, bits);
    let words: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let copied = run(&comm, &stream, Call::AllGather, DataType::U32, &words, n, n);
    assert_eq!(copied, words);
    comm.check().expect("no asynchronous error");
    comm.destroy().expect("destroy");
}

/// One rank's outputs (bf16 as bits).
struct Results {
    sum: Vec<u16>,
    gathered: Vec<u16>,
    scattered: Vec<f32>,
    max: Vec<u16>,
}

#[test]
fn two_ranks_on_one_gpu_compute_what_the_cpu_computes() {
    let Some(nccl) = nccl_or_skip() else { return };
    if !nccl.supports_multi_rank_per_gpu() {
        skip::skip(format!(
            "{nccl:?} does not accept two ranks on one GPU here (needs NCCL 2.30 or newer and \
             NCCL_MULTI_RANK_GPU_ENABLE=1 in the environment)"
        ));
        return;
    }
    let Some((_backend, ctx)) = device_or_skip() else { return };
    let id = nccl.unique_id().expect("unique id");
    const N: usize = 512; // elements per rank's block
                          // Rank r's input: small integers, exact in bf16 and in any summation order.
    let input =
        |rank: usize, len: usize| -> Vec<f32> { (0..len).map(|i| ((i * 7 + rank * 13) % 31) as f32 - 15.0).collect() };
    let results: Vec<Results> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let ctx = ctx.clone();
                let nccl = &nccl;
                let id = &id;
                scope.spawn(move || {
                    ctx.bind_to_thread().expect("bind");
                    let comm = Communicator::init(nccl, id, 2, rank, JOIN).expect("joins");
                    let stream = ctx.new_stream().expect("stream");
                    let mine = input(rank, 2 * N);
                    let bits = bf16_bits(&mine);
                    let sum = run(&comm, &stream, Call::AllReduce(ReduceOp::Sum), DataType::Bf16, &bits, 2 * N, 2 * N);
                    let gathered = run(&comm, &stream, Call::AllGather, DataType::Bf16, &bits[..N], N, 2 * N);
                    let scattered = run(&comm, &stream, Call::ReduceScatter(ReduceOp::Sum), DataType::F32, &mine, N, N);
                    let max = run(&comm, &stream, Call::AllReduce(ReduceOp::Max), DataType::Bf16, &bits, 2 * N, 2 * N);
                    comm.check().expect("no asynchronous error");
                    comm.destroy().expect("destroy");
                    Results { sum, gathered, scattered, max }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let (a, b) = (input(0, 2 * N), input(1, 2 * N));
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let max: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect();
    let gathered: Vec<f32> = a[..N].iter().chain(&b[..N]).copied().collect();
    for (rank, got) in results.iter().enumerate() {
        assert_eq!(got.sum, bf16_bits(&sum), "rank {rank}: all-reduce sum");
        assert_eq!(got.gathered, bf16_bits(&gathered), "rank {rank}: all-gather (rank-major)");
        assert_eq!(got.scattered[..], sum[rank * N..(rank + 1) * N], "rank {rank}: reduce-scatter, block {rank}");
        assert_eq!(got.max, bf16_bits(&max), "rank {rank}: all-reduce max");
    }
}

/// The collective ops a plan launches, with each argument's rows (of [`ROW_BYTES`]) at `t`
/// ranks, in signature order.
fn collective_launches(t: u64) -> Vec<(Op, Vec<u64>)> {
    vec![
        (Op::AllGather, vec![5, 5 * t]),
        (Op::ReduceScatter, vec![3 * t, 3]),
        (Op::AllReduceSumBf16, vec![7]),
        (Op::AllReduceSumF32, vec![7]),
        (Op::AllReduceMaxF32, vec![7]),
    ]
}

const ROW_BYTES: u64 = 64;

/// Rank `rank`'s input bytes for argument `index` of `op` (`rows` rows): values of magnitude
/// 0.5 to 4 with either sign, bf16 or f32 as the op's element type; outputs start zeroed.
fn input(op: Op, index: usize, rows: u64, rank: usize) -> Vec<u8> {
    let len = (rows * ROW_BYTES) as usize;
    if matches!(op, Op::AllGather | Op::ReduceScatter) && index == 1 {
        return vec![0; len]; // y, written whole
    }
    let seed = (rank as u32 + 1).wrapping_mul(0x85eb_ca6b) ^ (index as u32 + 7).wrapping_mul(0xc2b2_ae35);
    let mut state = 0x9e37_79b9_u32 ^ seed ^ op.name().len() as u32;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let magnitude = 0.5 + 3.5 * (state >> 8) as f32 / (1u32 << 24) as f32;
        if state & 1 == 0 {
            magnitude
        } else {
            -magnitude
        }
    };
    let f32_op = matches!(op, Op::AllReduceSumF32 | Op::AllReduceMaxF32);
    if f32_op {
        (0..len / 4).flat_map(|_| next().to_le_bytes()).collect()
    } else {
        (0..len / 2).flat_map(|_| bf16::from_f32(next()).to_bits().to_le_bytes()).collect()
    }
}

/// Lays out every argument of [`collective_launches`] 256-aligned in one arena, uploads rank
/// `rank`'s inputs, launches the ops in order on the collective stream, synchronizes and
/// downloads every argument (op by op, in signature order).
fn launch_collectives<B: Backend>(backend: &mut B, rank: usize, t: usize) -> Result<Vec<Vec<u8>>, String> {
    let launches = collective_launches(t as u64);
    let mut offset = 0u64;
    let mut placed = Vec::new();
    for (op, rows) in &launches {
        let args: Vec<KernelArg> = rows
            .iter()
            .zip(op.signature())
            .map(|(&rows, &(_, access))| {
                let span = Span { space: Space::Device, offset, len: rows * ROW_BYTES };
                offset += (rows * ROW_BYTES).div_ceil(256) * 256 + 256;
                KernelArg { span, first_row: 0, rows, row_bytes: ROW_BYTES, access }
            })
            .collect();
        placed.push((*op, args));
    }
    backend.allocate(offset, 4096, 2).map_err(|e| e.to_string())?;
    for (op, args) in &placed {
        for (index, arg) in args.iter().enumerate() {
            backend.upload(arg.span, &input(*op, index, arg.rows, rank)).map_err(|e| e.to_string())?;
        }
    }
    let context = KernelContext {
        hidden: 32,
        heads: 2,
        kv_heads: 0,
        kv_replicated: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        seq_len: 8,
        vocab: 256,
        loss_scale_tokens: 8,
        adamw: AdamW::default(),
        rank: rank as u64,
        ranks: t as u64,
        context_rank: 0,
        context_ranks: 1,
    };
    for (instruction, (op, args)) in placed.iter().enumerate() {
        // Safety: the ops' spans are disjoint and only these launches, in order on one stream,
        // touch them before `synchronize`.
        unsafe { backend.launch(instruction, Stream::Collective, *op, args, &context) }
            .map_err(|e| format!("{}: {e}", op.name()))?;
    }
    backend.synchronize().map_err(|e| e.to_string())?;
    placed.iter().flat_map(|(_, args)| args).map(|arg| backend.download(arg.span).map_err(|e| e.to_string())).collect()
}

/// [`launch_collectives`] on `t` CPU backends of an in-process group, one thread each.
fn cpu_collectives(t: usize) -> Vec<Vec<Vec<u8>>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = LocalGroup::ranks(t)
            .into_iter()
            .enumerate()
            .map(|(rank, group)| {
                scope.spawn(move || {
                    let group: Arc<dyn Collectives> = Arc::new(group);
                    let mut cpu = CpuBackend::new().with_collectives(group);
                    launch_collectives(&mut cpu, rank, t).expect("the CPU runs the collectives")
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("CPU rank thread")).collect()
    })
}

/// [`launch_collectives`] on `t` CUDA backends of device 0 joined to one communicator, one
/// thread each.
fn gpu_collectives(nccl: &Nccl, t: usize) -> Vec<Vec<Vec<u8>>> {
    let id = nccl.unique_id().expect("unique id");
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..t)
            .map(|rank| {
                let id = &id;
                scope.spawn(move || -> Result<Vec<Vec<u8>>, String> {
                    let mut gpu = CudaBackend::new(0).map_err(|e| e.to_string())?;
                    gpu.join(nccl, id, t, rank, JOIN).map_err(|e| e.to_string())?;
                    assert_eq!(gpu.group(), Some((rank, t)));
                    launch_collectives(&mut gpu, rank, t)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| h.join().expect("GPU rank thread").unwrap_or_else(|e| panic!("GPU rank {rank}: {e}")))
            .collect()
    })
}

fn compare_collectives(gpu: &[Vec<Vec<u8>>], cpu: &[Vec<Vec<u8>>], t: usize) {
    let names: Vec<String> = collective_launches(t as u64)
        .iter()
        .flat_map(|(op, rows)| (0..rows.len()).map(move |i| format!("{} {}", op.name(), op.signature()[i].0)))
        .collect();
    for (rank, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        for ((g, c), name) in g.iter().zip(c).zip(&names) {
            assert!(g == c, "rank {rank} of {t}: {name}: the GPU's bytes differ from the CPU's");
        }
    }
}

/// The CPU half of the comparisons above runs everywhere (so a GPU session finds the harness
/// working): at t = 1 every output is its input, at t = 2 the all-gather is rank-major and the
/// reductions are the reference's (`memo_runtime::collective::reduce`, through the group).
#[test]
fn the_cpu_half_of_the_collective_comparison_runs_here() {
    let inputs = |rank: usize, t: u64| -> Vec<Vec<u8>> {
        collective_launches(t)
            .iter()
            .flat_map(|(op, rows)| rows.iter().enumerate().map(|(i, &r)| input(*op, i, r, rank)).collect::<Vec<_>>())
            .collect()
    };
    let one = cpu_collectives(1);
    let x = inputs(0, 1);
    assert_eq!(one[0][1], x[0], "all_gather at t = 1");
    assert_eq!(one[0][3], x[2], "reduce_scatter at t = 1");
    assert_eq!(one[0][4..], x[4..], "all-reduces at t = 1");
    let two = cpu_collectives(2);
    let (a, b) = (inputs(0, 2), inputs(1, 2));
    let gathered: Vec<u8> = a[0].iter().chain(&b[0]).copied().collect();
    for (rank, got) in two.iter().enumerate() {
        assert_eq!(got[1], gathered, "rank {rank}: all_gather, rank-major");
        let max: Vec<u8> = a[6]
            .chunks_exact(4)
            .zip(b[6].chunks_exact(4))
            .flat_map(|(p, q)| {
                let (p, q) = (f32::from_le_bytes(p.try_into().unwrap()), f32::from_le_bytes(q.try_into().unwrap()));
                p.max(q).to_le_bytes()
            })
            .collect();
        assert_eq!(got[6], max, "rank {rank}: all_reduce_max_f32");
    }
    assert_eq!(two[0][4..], two[1][4..], "the all-reduces give every rank the same bits");
    assert_ne!(two[0][3], two[1][3], "reduce_scatter: each rank its own block");
}

#[test]
fn a_collective_launch_without_a_communicator_says_how_to_get_one() {
    let Some((mut backend, _ctx)) = device_or_skip() else { return };
    let error = launch_collectives(&mut backend, 0, 1).unwrap_err();
    assert!(error.contains("all_gather") && error.contains("no NCCL communicator"), "{error}");
}

#[test]
fn at_one_rank_every_collective_launch_is_the_identity_as_on_the_cpu() {
    let Some(nccl) = nccl_or_skip() else { return };
    let Some(_) = device_or_skip() else { return };
    let gpu = gpu_collectives(&nccl, 1);
    let cpu = cpu_collectives(1);
    compare_collectives(&gpu, &cpu, 1);
    // And the identity: every output is its input (an all-gather's y its x).
    let inputs: Vec<Vec<u8>> = collective_launches(1)
        .iter()
        .flat_map(|(op, rows)| rows.iter().enumerate().map(|(i, &r)| input(*op, i, r, 0)).collect::<Vec<_>>())
        .collect();
    assert_eq!(gpu[0][1], inputs[0], "all_gather at t = 1");
    assert_eq!(gpu[0][3], inputs[2], "reduce_scatter at t = 1");
    assert_eq!(gpu[0][4..], inputs[4..], "all-reduces at t = 1");
}

#[test]
fn two_ranks_on_one_gpu_launch_every_collective_as_the_cpu_does() {
    let Some(nccl) = nccl_or_skip() else { return };
    if !nccl.supports_multi_rank_per_gpu() {
        skip::skip(format!(
            "{nccl:?} does not accept two ranks on one GPU here (needs NCCL 2.30 or newer and \
             NCCL_MULTI_RANK_GPU_ENABLE=1 in the environment)"
        ));
        return;
    }
    let Some(_) = device_or_skip() else { return };
    let gpu = gpu_collectives(&nccl, 2);
    let cpu = cpu_collectives(2);
    compare_collectives(&gpu, &cpu, 2);
}

/// Three steps of a tiny GPT at t = 1 on `backend`: the losses and the parameters' bytes.
fn train_tiny(backend: CudaBackend) -> (Vec<f32>, Vec<Vec<u8>>) {
    let mut model = memo_plan_core::model::ModelConfig::new("test", 2, 64, 4, 32, 1);
    model.vocab = 256;
    let options = TrainOptions {
        model,
        strategy: Strategy::Memo,
        forced_alpha: Some(0.5),
        hardware: cpu_hardware(1 << 30),
        seed: 11,
        adamw: AdamW { lr: 3e-3, ..AdamW::default() },
    };
    let mut trainer = Trainer::new(backend, &options).expect("a trainer on the GPU");
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes()).expect("the shipped text");
    let losses = (0..3)
        .map(|_| {
            let (tokens, targets) = data.next_batch(1, 32);
            trainer.step(&tokens, &targets).expect("a step")
        })
        .collect();
    let parameters = trainer.parameters().expect("parameters").into_iter().map(|(_, bytes)| bytes).collect();
    (losses, parameters)
}

#[test]
fn a_t_1_plan_trains_bit_identically_with_nccl_joined_and_without() {
    let Some(nccl) = nccl_or_skip() else { return };
    let Some((plain, _ctx)) = device_or_skip() else { return };
    let (losses, parameters) = train_tiny(plain);
    let mut joined = CudaBackend::new(0).expect("the device opened above");
    joined.join(&nccl, &nccl.unique_id().expect("unique id"), 1, 0, JOIN).expect("one rank joins");
    let (joined_losses, joined_parameters) = train_tiny(joined);
    assert_eq!(
        joined_losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        "losses with NCCL joined {joined_losses:?}, without {losses:?}"
    );
    assert!(joined_parameters == parameters, "the parameters after three steps differ with NCCL joined");
}
