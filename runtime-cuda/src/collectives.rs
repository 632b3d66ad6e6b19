//! The plan's collective launches (`all_gather`, `reduce_scatter`, `all_reduce_*`,
//! `spec/tensor-parallel.md` §3) on the backend's NCCL communicator, and the waits that keep a
//! missing peer from hanging a step (`spec/backends.md`, "Collectives on GPUs").
//!
//! A child module of `backend` (declared there with `#[path]`), so the backend's own file keeps
//! only the hooks: the launch hands a collective op here after bounds-checking its spans,
//! [`Backend::synchronize`](memo_runtime::Backend::synchronize) waits for the collective stream
//! here first, and the drop settles it before the context is synchronised.
//!
//! What is checked before NCCL is called, so that its `unsafe` contract holds: the op's argument
//! count, the byte sizes of the op table's rule (an `all_gather`'s `y` `t` times its `x`, a
//! `reduce_scatter`'s `x` `t` times its `y`, whole elements), and that `x` and `y` are disjoint
//! or in NCCL's in-place layout. Element types come from the op (`Collective::of_op`): bytes
//! for an all-gather, bf16 for a reduce-scatter, bf16 or f32 for the all-reduces; the reduction
//! is NCCL's sum or max.

use crate::error::CudaError;
use crate::error::CudaError::Launch;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{cuStreamQuery, cudaError_enum};
use cudarc::driver::CudaStream;
use memo_plan_core::plan::{Op, Stream};
use memo_runtime::collective::{Collective, Element, Reduction};
use memo_runtime::{Backend, BackendError};

use super::CudaBackend;
use crate::nccl::{self, Communicator, DataType, Nccl, ReduceOp, UniqueId};

/// The backend's communicator, once joined ([`CudaBackend::join`] or [`CudaBackend::attach`]),
/// and why it is gone when it was aborted.
#[derive(Default)]
pub(super) struct Joined {
    comm: Option<Communicator>,
    /// Set when the communicator was aborted (a peer missing past the timeout, an error).
    aborted: Option<String>,
}

impl Joined {
    /// The communicator, or the error a collective launch without one is.
    fn get(&self, op: Op) -> Result<&Communicator, CudaError> {
        match (&self.comm, &self.aborted) {
            (Some(comm), _) => Ok(comm),
            (None, Some(why)) => Err(CudaError::Collective(format!(
                "op `{}`: this backend's NCCL communicator was aborted earlier ({why}); the tensor-parallel group \
                 cannot go on: restart the run",
                op.name()
            ))),
            (None, None) => Err(CudaError::Collective(format!(
                "op `{}` is a collective and this backend has no NCCL communicator: a plan made with tensor \
                 parallelism t > 1 runs on one backend per rank, each joined to the group \
                 (`CudaBackend::join`; `memo train --device cuda --tensor-parallel T`)",
                op.name()
            ))),
        }
    }
}

/// One NCCL call, as the op and its spans' sizes determine it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// `ncclAllGather` of `count` elements.
    AllGather { count: usize, dtype: DataType },
    /// `ncclReduceScatter` to `count` elements.
    ReduceScatter { count: usize, dtype: DataType, op: ReduceOp },
    /// `ncclAllReduce` of `count` elements, in place.
    AllReduce { count: usize, dtype: DataType, op: ReduceOp },
}

fn data_type(element: Element) -> DataType {
    match element {
        Element::Bf16 => DataType::Bf16,
        Element::F32 => DataType::F32,
    }
}

fn reduce_op(reduction: Reduction) -> ReduceOp {
    match reduction {
        Reduction::Sum => ReduceOp::Sum,
        Reduction::Max => ReduceOp::Max,
    }
}

/// The NCCL call of `collective` on arguments at `spans` ((address, bytes), the op's signature
/// order: `x` then `y`, or `x` alone for an in-place all-reduce) on rank `rank` of `ranks`; an
/// error names what does not fit. Pure arithmetic, tested without a GPU.
pub(crate) fn call(
    op: Op,
    collective: Collective,
    spans: &[(u64, u64)],
    rank: usize,
    ranks: usize,
) -> Result<Call, CudaError> {
    let name = op.name();
    let expected = if collective.in_place() { 1 } else { 2 };
    if spans.len() != expected {
        return Err(Launch(format!("op `{name}` takes {expected} argument(s) (its signature), got {}", spans.len())));
    }
    let bytes = |len: u64| {
        usize::try_from(len).map_err(|_| Launch(format!("op `{name}`: {len} bytes exceed the address space")))
    };
    let whole = |len: usize, dtype: DataType| {
        if len.is_multiple_of(dtype.bytes()) {
            Ok(len / dtype.bytes())
        } else {
            Err(Launch(format!("op `{name}`: {len} bytes are not whole {dtype:?} elements of {} bytes", dtype.bytes())))
        }
    };
    let t = ranks as u64;
    match collective {
        Collective::AllReduce(element, reduction) => {
            let dtype = data_type(element);
            let count = whole(bytes(spans[0].1)?, dtype)?;
            Ok(Call::AllReduce { count, dtype, op: reduce_op(reduction) })
        }
        Collective::AllGather => {
            let ((x, x_len), (y, y_len)) = (spans[0], spans[1]);
            if x_len.checked_mul(t) != Some(y_len) {
                return Err(Launch(format!(
                    "op `{name}`: y has {y_len} bytes where t = {ranks} times x's {x_len} are gathered"
                )));
            }
            // In place when x is this rank's block of y (NCCL's rule); otherwise disjoint.
            check_overlap(name, (x, x_len), (y, y_len), y + rank as u64 * x_len)?;
            Ok(Call::AllGather { count: bytes(x_len)?, dtype: DataType::U8 })
        }
        Collective::ReduceScatter(element) => {
            let dtype = data_type(element);
            let ((x, x_len), (y, y_len)) = (spans[0], spans[1]);
            if y_len.checked_mul(t) != Some(x_len) {
                return Err(Launch(format!(
                    "op `{name}`: x has {x_len} bytes where t = {ranks} times y's {y_len} are reduced and scattered"
                )));
            }
            check_overlap(name, (y, y_len), (x, x_len), x + rank as u64 * y_len)?;
            Ok(Call::ReduceScatter { count: whole(bytes(y_len)?, dtype)?, dtype, op: ReduceOp::Sum })
        }
        Collective::RingShift => {
            Err(Launch(format!("op `{name}`: the context-parallel ring has no NCCL send/receive on this backend yet")))
        }
    }
}

/// `small` (one rank's block) and `large` (the whole world's) must be disjoint, or `small` must
/// start at `in_place`, the address NCCL's in-place form puts it at.
fn check_overlap(name: &str, small: (u64, u64), large: (u64, u64), in_place: u64) -> Result<(), CudaError> {
    let disjoint = small.0.saturating_add(small.1) <= large.0 || large.0.saturating_add(large.1) <= small.0;
    if disjoint || small.1 == 0 || small.0 == in_place {
        Ok(())
    } else {
        Err(Launch(format!(
            "op `{name}`: x and y overlap other than in NCCL's in-place layout (this rank's block of the larger \
             buffer); the plan is wrong"
        )))
    }
}

/// How long [`settle`] sleeps between polls at most.
const MAX_PAUSE: Duration = Duration::from_millis(10);

/// Waits until `stream` has run everything enqueued on it, polling (`cuStreamQuery`) and
/// checking `comm` for an asynchronous error meanwhile, at most `comm.timeout()`: a peer that
/// never issues its collective would otherwise block the stream, and every stream waiting on
/// it, for ever. `Err` (with why) when the stream fails, the communicator reports an error, or
/// the timeout passes; the caller then aborts the communicator, which ends its kernels.
fn settle(stream: &CudaStream, comm: &Communicator) -> Result<(), CudaError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(20);
    loop {
        // Safety: a live stream of this backend's context, which the caller made current.
        let state = unsafe { cuStreamQuery(stream.cu_stream()) };
        match state {
            cudaError_enum::CUDA_SUCCESS => return comm.check().map_err(CudaError::Nccl),
            cudaError_enum::CUDA_ERROR_NOT_READY => {}
            error => return Err(CudaError::driver("the collective stream", format!("{error:?}"))),
        }
        comm.check().map_err(CudaError::Nccl)?;
        if start.elapsed() >= comm.timeout() {
            return Err(CudaError::Collective(format!(
                "rank {} of {}: the collective stream did not finish within {:?}: a peer rank never issued the \
                 same collective (it failed or stopped); NCCL's wait was aborted",
                comm.rank(),
                comm.world_size(),
                comm.timeout()
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

impl CudaBackend {
    /// Joins the NCCL communicator of `id` as `rank` of `world_size` on this backend's device
    /// ([`CudaBackend::join_collectives`]) and keeps it: the plan's collective launches then run
    /// on it, on the stream the plan names ([`Stream::Collective`]). Every rank calls this on
    /// its own backend, each on its own thread or process, within `timeout` of each other.
    pub fn join(
        &mut self,
        nccl: &Nccl,
        id: &UniqueId,
        world_size: usize,
        rank: usize,
        timeout: Duration,
    ) -> Result<(), BackendError> {
        let comm = self.join_collectives(nccl, id, world_size, rank, timeout)?;
        self.attach(comm);
        Ok(())
    }

    /// Keeps `comm`, a communicator joined on this backend's device (by
    /// [`CudaBackend::join_collectives`], or `Communicator::from_torchrun` with this backend's
    /// context current), for the plan's collective launches. A communicator held before is
    /// finalized and dropped. It is dropped before the backend's memory.
    pub fn attach(&mut self, comm: Communicator) {
        self.collectives = Joined { comm: Some(comm), aborted: None };
    }

    /// The communicator's rank and world size, when one is joined.
    pub fn group(&self) -> Option<(usize, usize)> {
        self.collectives.comm.as_ref().map(|c| (c.rank(), c.world_size()))
    }

    /// Runs collective `op` (bounds already checked: `spans` are `(address, bytes)` inside the
    /// arena) on `stream` through the communicator.
    ///
    /// # Safety
    /// As [`memo_runtime::Backend::launch`]: the plan's events order every access of the spans.
    pub(super) unsafe fn launch_collective(
        &mut self,
        instruction: usize,
        stream: Stream,
        op: Op,
        collective: Collective,
        spans: &[(u64, u64)],
    ) -> Result<(), BackendError> {
        let kernel_error = |error: CudaError| error.at(instruction);
        let comm = self.collectives.get(op).map_err(kernel_error)?;
        let call = call(op, collective, spans, comm.rank(), comm.world_size()).map_err(kernel_error)?;
        let raw_stream = nccl::stream(&self.streams[stream.index()]);
        let start = self.mark(stream)?;
        let comm = self.collectives.get(op).map_err(kernel_error)?;
        // Safety: every span lies inside the arena (checked by the caller), the sizes are the
        // ones `call` derived and checked (y = t * x for an all-gather, x = t * y for a
        // reduce-scatter, whole elements), x and y are disjoint or in NCCL's in-place layout, the
        // stream is a live stream of the device the communicator was joined on, and the plan's
        // events keep every other access of these bytes off until the stream has passed the call.
        let result = unsafe {
            match call {
                Call::AllGather { count, dtype } => comm.all_gather(spans[0].0, spans[1].0, count, dtype, raw_stream),
                Call::ReduceScatter { count, dtype, op } => {
                    comm.reduce_scatter(spans[0].0, spans[1].0, count, dtype, op, raw_stream)
                }
                Call::AllReduce { count, dtype, op } => {
                    comm.all_reduce(spans[0].0, spans[0].0, count, dtype, op, raw_stream)
                }
            }
        };
        if let Err(error) = result {
            return Err(self.abort(instruction, op, CudaError::Nccl(error)));
        }
        let end = self.mark(stream)?;
        self.note(instruction, start, end);
        Ok(())
    }

    /// Waits for the collective stream (bounded by the communicator's timeout) and checks the
    /// communicator for an asynchronous error: the first half of `synchronize` when a
    /// communicator is joined (nothing otherwise). On any failure the communicator is aborted,
    /// which also releases the streams that wait on the collective stream.
    pub(super) fn settle_collectives(&mut self) -> Result<(), BackendError> {
        let Some(comm) = self.collectives.comm.as_ref() else {
            return Ok(());
        };
        let stream = &self.streams[Stream::Collective.index()];
        match settle(stream, comm) {
            Ok(()) => Ok(()),
            Err(why) => {
                self.drop_communicator(&why.to_string());
                // The backend's name in front of what its own words do not say.
                let name = self.name();
                let why = match why {
                    CudaError::Collective(message) => CudaError::Collective(format!("{name}: {message}")),
                    CudaError::Driver { what, error } => CudaError::Driver { what: format!("{name}: {what}"), error },
                    other => other,
                };
                Err(BackendError::from(why))
            }
        }
    }

    /// Called first by the backend's drop: settles the collective stream (aborting the
    /// communicator past its timeout) and finalizes the communicator while the context lives.
    pub(super) fn release_collectives(&mut self) {
        if self.collectives.comm.is_some() {
            let _ = self.settle_collectives();
        }
        self.collectives.comm = None;
    }

    /// Aborts the communicator after `op` failed with `why`, and the launch error saying so.
    fn abort(&mut self, instruction: usize, op: Op, why: CudaError) -> BackendError {
        let why = why.to_string();
        self.drop_communicator(&why);
        BackendError::Kernel { instruction, message: format!("op `{}`: {why}", op.name()) }
    }

    fn drop_communicator(&mut self, why: &str) {
        if let Some(comm) = self.collectives.comm.take() {
            comm.abort();
        }
        self.collectives.aborted = Some(why.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BF16_SUM: Collective = Collective::ReduceScatter(Element::Bf16);

    #[test]
    fn all_reduces_take_their_type_and_reduction_from_the_op() {
        let cases = [
            (Op::AllReduceSumBf16, 64, 32, DataType::Bf16, ReduceOp::Sum),
            (Op::AllReduceSumF32, 64, 16, DataType::F32, ReduceOp::Sum),
            (Op::AllReduceMaxF32, 64, 16, DataType::F32, ReduceOp::Max),
        ];
        for (op, bytes, count, dtype, reduce) in cases {
            let collective = Collective::of_op(op).unwrap();
            assert_eq!(
                call(op, collective, &[(4096, bytes)], 1, 2),
                Ok(Call::AllReduce { count, dtype, op: reduce }),
                "{op:?}"
            );
        }
        let error = call(Op::AllReduceSumF32, Collective::of_op(Op::AllReduceSumF32).unwrap(), &[(0, 6)], 0, 2)
            .unwrap_err()
            .to_string();
        assert!(error.contains("not whole F32 elements"), "{error}");
    }

    #[test]
    fn all_gather_moves_bytes_and_needs_t_times_x_in_y() {
        let gather = Collective::AllGather;
        assert_eq!(
            call(Op::AllGather, gather, &[(0, 6), (1000, 12)], 0, 2),
            Ok(Call::AllGather { count: 6, dtype: DataType::U8 })
        );
        let error = call(Op::AllGather, gather, &[(0, 6), (1000, 13)], 0, 2).unwrap_err().to_string();
        assert!(error.contains("y has 13 bytes where t = 2 times x's 6"), "{error}");
        // In place: x is rank 1's block of y.
        assert!(call(Op::AllGather, gather, &[(1006, 6), (1000, 12)], 1, 2).is_ok());
        let error = call(Op::AllGather, gather, &[(1002, 6), (1000, 12)], 1, 2).unwrap_err().to_string();
        assert!(error.contains("overlap"), "{error}");
        let error = call(Op::AllGather, gather, &[(0, 6)], 0, 2).unwrap_err().to_string();
        assert!(error.contains("takes 2 argument(s)"), "{error}");
    }

    #[test]
    fn reduce_scatter_sums_bf16_and_needs_t_times_y_in_x() {
        assert_eq!(
            call(Op::ReduceScatter, BF16_SUM, &[(0, 32), (1000, 8)], 3, 4),
            Ok(Call::ReduceScatter { count: 4, dtype: DataType::Bf16, op: ReduceOp::Sum })
        );
        let error = call(Op::ReduceScatter, BF16_SUM, &[(0, 30), (1000, 8)], 0, 4).unwrap_err().to_string();
        assert!(error.contains("x has 30 bytes where t = 4 times y's 8"), "{error}");
        let error = call(Op::ReduceScatter, BF16_SUM, &[(0, 6), (1000, 3)], 0, 2).unwrap_err().to_string();
        assert!(error.contains("not whole Bf16"), "{error}");
        // In place: y is rank 2's block of x; anything else that overlaps is refused.
        assert!(call(Op::ReduceScatter, BF16_SUM, &[(0, 32), (16, 8)], 2, 4).is_ok());
        assert!(call(Op::ReduceScatter, BF16_SUM, &[(0, 32), (4, 8)], 2, 4)
            .unwrap_err()
            .to_string()
            .contains("overlap"));
    }

    #[test]
    fn without_a_communicator_a_collective_says_how_to_get_one() {
        let joined = Joined::default();
        let error = joined.get(Op::AllGather).unwrap_err().to_string();
        assert!(error.contains("no NCCL communicator") && error.contains("--tensor-parallel"), "{error}");
        let aborted = Joined { comm: None, aborted: Some("peer gone".into()) };
        assert!(aborted.get(Op::AllGather).unwrap_err().to_string().contains("aborted earlier (peer gone)"));
    }
}
