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

/// Runs `collective(send, recv, stream)` with `send` holding `input` and `recv` `recv_len`
/// zeroed elements; returns `recv`.
fn run<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy + Default>(
    stream: &Arc<CudaStream>,
    input: &[T],
    recv_len: usize,
    collective: impl FnOnce(u64, u64, *mut std::ffi::c_void) -> Result<(), NcclError>,
) -> Vec<T> {
    let send = upload(stream, input);
    let mut recv: CudaSlice<T> = stream.alloc_zeros(recv_len).expect("alloc");
    {
        let (send_ptr, _s) = send.device_ptr(stream);
        let (recv_ptr, _r) = recv.device_ptr_mut(stream);
        collective(send_ptr, recv_ptr, nccl::stream(stream)).expect("collective");
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
    // Safety (every call below): `run` hands addresses of `n`-element device buffers of this
    // device, live until it synchronizes the stream; at one rank every extent is `n` elements.
    let sum =
        run(&stream, &values, n, |s, r, st| unsafe { comm.all_reduce(s, r, n, DataType::F32, ReduceOp::Sum, st) });
    assert_eq!(sum, values);
    let max = run(&stream, &bits, n, |s, r, st| unsafe { comm.all_reduce(s, r, n, DataType::Bf16, ReduceOp::Max, st) });
    assert_eq!(max, bits);
    let gathered = run(&stream, &bits, n, |s, r, st| unsafe { comm.all_gather(s, r, n, DataType::Bf16, st) });
    assert_eq!(gathered, bits);
    let scattered =
        run(&stream, &bits, n, |s, r, st| unsafe { comm.reduce_scatter(s, r, n, DataType::Bf16, ReduceOp::Sum, st) });
    assert_eq!(scattered, bits);
    let words: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let copied = run(&stream, &words, n, |s, r, st| unsafe { comm.all_gather(s, r, n, DataType::U32, st) });
    assert_eq!(copied, words);
    comm.check().expect("no asynchronous error");
    comm.destroy().expect("destroy");
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
    let results: Vec<(Vec<u16>, Vec<u16>, Vec<f32>, Vec<u16>)> = std::thread::scope(|scope| {
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
                    // Safety (each call): device buffers of the lengths given to `run`, which are the
                    // extents each collective reads and writes at two ranks.
                    let sum = run(&stream, &bits, 2 * N, |s, r, st| unsafe {
                        comm.all_reduce(s, r, 2 * N, DataType::Bf16, ReduceOp::Sum, st)
                    });
                    let gathered = run(&stream, &bits[..N], 2 * N, |s, r, st| unsafe {
                        comm.all_gather(s, r, N, DataType::Bf16, st)
                    });
                    let scattered = run(&stream, &mine, N, |s, r, st| unsafe {
                        comm.reduce_scatter(s, r, N, DataType::F32, ReduceOp::Sum, st)
                    });
                    let max = run(&stream, &bits, 2 * N, |s, r, st| unsafe {
                        comm.all_reduce(s, r, 2 * N, DataType::Bf16, ReduceOp::Max, st)
                    });
                    comm.check().expect("no asynchronous error");
                    comm.destroy().expect("destroy");
                    (sum, gathered, scattered, max)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let (a, b) = (input(0, 2 * N), input(1, 2 * N));
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let max: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect();
    let gathered: Vec<f32> = a[..N].iter().chain(&b[..N]).copied().collect();
    for (rank, (got_sum, got_gathered, got_scattered, got_max)) in results.iter().enumerate() {
        assert_eq!(got_sum, &bf16_bits(&sum), "rank {rank}: all-reduce sum");
        assert_eq!(got_gathered, &bf16_bits(&gathered), "rank {rank}: all-gather (rank-major)");
        assert_eq!(got_scattered[..], sum[rank * N..(rank + 1) * N], "rank {rank}: reduce-scatter, block {rank}");
        assert_eq!(got_max, &bf16_bits(&max), "rank {rank}: all-reduce max");
    }
}
