//! NCCL through `runtime_cuda::nccl`. Without NCCL every test that needs it prints SKIP (the
//! first test checks the missing-library error instead); without a driver or device likewise.
//! On a GPU with NCCL:
//! - one rank: all-reduce (sum, max), all-gather and reduce-scatter return their input bit for
//!   bit (at t = 1 each is the identity, so the NCCL path equals the path without it);
//! - two ranks on the one GPU, only where NCCL allows it (2.30 or newer and
//!   `NCCL_MULTI_RANK_GPU_ENABLE=1`; SKIP otherwise): each collective against the CPU's result.
//!   The inputs are small integers, exact in bf16 and f32 and in any order of summation, so the
//!   results must be equal, not merely close.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;
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
