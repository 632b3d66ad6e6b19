//! Collectives across the `t` ranks of a tensor-parallel group (`spec/tensor-parallel.md` §3):
//! the [`Collectives`] trait a backend calls to execute a plan's `all_gather`, `reduce_scatter`
//! and `all_reduce_*` launches, the reference reduction every implementation follows
//! ([`reduce`]), and [`LocalGroup`], the in-process implementation the CPU backend uses (one
//! thread per rank).
//!
//! **Determinism.** A reduction converts each rank's elements to f32, combines them in rank order
//! `0, 1, ..., t-1` and rounds once to the element type, so its bits do not depend on which rank
//! arrives first; every rank gets the same bits.
//!
//! **No hang, no panic.** A collective blocks (on a condition variable, never spinning) until
//! every rank of the group has issued it. A rank that fails ([`Collectives::abort`]), leaves (its
//! handle is dropped before the others' call completes), issues another collective or other
//! sizes than the others, or does not arrive within the group's timeout, fails the call on every
//! rank with a [`CollectiveError`] naming the rank, the call and the reason; after that every
//! call of the group fails at once.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use half::bf16;
use memo_plan_core::plan::Op;

/// The element type of a reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Element {
    /// bf16, 2 bytes, little-endian.
    Bf16,
    /// f32, 4 bytes, little-endian.
    F32,
}

impl Element {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Element::Bf16 => 2,
            Element::F32 => 4,
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Element::Bf16 => "bf16",
            Element::F32 => "f32",
        }
    }

    fn load(self, bytes: &[u8]) -> f32 {
        match self {
            Element::Bf16 => f32::from_bits(u32::from(u16::from_le_bytes([bytes[0], bytes[1]])) << 16),
            Element::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        }
    }

    fn store(self, value: f32, bytes: &mut [u8]) {
        match self {
            Element::Bf16 => bytes.copy_from_slice(&bf16::from_f32(value).to_bits().to_le_bytes()),
            Element::F32 => bytes.copy_from_slice(&value.to_le_bytes()),
        }
    }
}

/// How a reduction combines the ranks' elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The sum, in f32, in rank order.
    Sum,
    /// The maximum (a NaN on any rank gives NaN).
    Max,
}

impl Reduction {
    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "sum",
            Reduction::Max => "max",
        }
    }
}

/// One collective call, as every rank of the group must issue it (with the same sizes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Rank `j`'s input becomes bytes `[j*n, (j+1)*n)` of every rank's output (`n` the input's
    /// bytes): any element type.
    AllGather,
    /// The element-wise sum of every rank's `t*n`-byte input; rank `k` gets bytes
    /// `[k*n, (k+1)*n)` of it.
    ReduceScatter(Element),
    /// The element-wise reduction of every rank's buffer, in place on every rank.
    AllReduce(Element, Reduction),
    /// The context-parallel ring's step (`ring_exchange`): rank `k`'s input goes to rank
    /// `k + 1 mod n`, and its output is rank `k - 1 mod n`'s input (any bytes, as sent).
    RingShift,
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Collective::AllGather => f.write_str("all_gather"),
            Collective::ReduceScatter(element) => write!(f, "reduce_scatter ({} sum)", element.name()),
            Collective::AllReduce(element, reduction) => {
                write!(f, "all_reduce ({} {})", element.name(), reduction.name())
            }
            Collective::RingShift => f.write_str("ring shift"),
        }
    }
}

impl Collective {
    /// The collective a plan's op performs, if it is one (`Op::collective_group` says on which
    /// group: `spec/tensor-parallel.md` §3, `spec/context-parallel.md`): `all_gather` of any
    /// bytes, `reduce_scatter` summing bf16, the all-reduces by their names (the data group's
    /// too), `ring_exchange` a ring shift.
    pub fn of_op(op: Op) -> Option<Collective> {
        match op {
            Op::AllGather => Some(Collective::AllGather),
            Op::ReduceScatter => Some(Collective::ReduceScatter(Element::Bf16)),
            Op::AllReduceSumBf16 | Op::DataAllReduceSumBf16 => {
                Some(Collective::AllReduce(Element::Bf16, Reduction::Sum))
            }
            Op::AllReduceSumF32 | Op::DataAllReduceSumF32 => Some(Collective::AllReduce(Element::F32, Reduction::Sum)),
            Op::AllReduceMaxF32 => Some(Collective::AllReduce(Element::F32, Reduction::Max)),
            Op::RingExchange => Some(Collective::RingShift),
            _ => None,
        }
    }

    /// Whether it works in place on one argument (`x`, read and written) rather than reading `x`
    /// and writing `y`.
    pub fn in_place(self) -> bool {
        matches!(self, Collective::AllReduce(..))
    }

    /// Runs the collective on `group`: `input` and `output` for the two-argument ones, `output`
    /// alone (in place) for an all-reduce.
    pub fn run(self, group: &dyn Collectives, input: &[u8], output: &mut [u8]) -> Result<(), CollectiveError> {
        match self {
            Collective::AllGather => group.all_gather(input, output),
            Collective::ReduceScatter(element) => group.reduce_scatter(element, input, output),
            Collective::AllReduce(element, reduction) => group.all_reduce(element, reduction, output),
            Collective::RingShift => {
                let (k, n) = (group.rank(), group.ranks().max(1));
                group.exchange((k + 1) % n, input, (k + n - 1) % n, output)
            }
        }
    }
}

/// Why a collective failed. Every rank of the group gets one: none hangs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CollectiveError {
    /// The call's buffers do not fit the collective (a plan or backend bug on this rank).
    Shape {
        /// The rank that issued it.
        rank: usize,
        /// The call.
        collective: Collective,
        /// What is wrong.
        problem: String,
    },
    /// The ranks issued different collectives, or different sizes, as their `call`-th.
    Mismatch {
        /// The call's number in the group, from 0.
        call: u64,
        /// What one rank issued.
        first: (usize, Collective, usize),
        /// What another issued: (rank, collective, input bytes).
        second: (usize, Collective, usize),
    },
    /// A rank failed or left; every rank's calls fail from then on.
    RankFailed {
        /// The rank that failed.
        rank: usize,
        /// Its reason.
        reason: String,
    },
    /// The ranks' [`Collectives::exchange`] calls do not pair up (or one rank issued a collective
    /// where another issued an exchange).
    Exchange {
        /// The call's number in the group, from 0.
        call: u64,
        /// What does not match.
        problem: String,
    },
    /// Ranks did not arrive within the group's timeout.
    Timeout {
        /// The call's number in the group, from 0.
        call: u64,
        /// The collective.
        collective: Collective,
        /// The rank that waited.
        rank: usize,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
        /// The timeout.
        waited: Duration,
    },
}

impl fmt::Display for CollectiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CollectiveError::Shape { rank, collective, problem } => {
                write!(f, "rank {rank}: {collective}: {problem} (the plan and the group do not match)")
            }
            CollectiveError::Mismatch { call, first, second } => write!(
                f,
                "collective #{call}: rank {} issued {} of {} bytes but rank {} issued {} of {} bytes: every rank must \
                 issue the same collectives in the same order (replay the same plan on every rank)",
                first.0, first.1, first.2, second.0, second.1, second.2
            ),
            CollectiveError::RankFailed { rank, reason } => {
                write!(f, "rank {rank} of the tensor-parallel group failed: {reason}")
            }
            CollectiveError::Exchange { call, problem } => write!(
                f,
                "exchange #{call}: {problem}: every rank must issue the same exchange, each receiving from the rank \
                 that sends to it as many bytes as it sends (replay the same plan on every rank)"
            ),
            CollectiveError::Timeout { call, collective, rank, missing, waited } => write!(
                f,
                "collective #{call} ({collective}): rank {rank} waited {:.1} s and rank(s) {missing:?} did not \
                 arrive: a rank is stuck or replays another plan",
                waited.as_secs_f64()
            ),
        }
    }
}

impl std::error::Error for CollectiveError {}

/// The collectives of one rank of a tensor-parallel group. A backend holds one and calls it from
/// the stream that runs the plan's collective launches; every rank issues the same calls in the
/// same order. Implementations follow [`reduce`]'s arithmetic.
pub trait Collectives: Send + Sync {
    /// This rank, `0 .. ranks()`.
    fn rank(&self) -> usize;

    /// The group's size `t`.
    fn ranks(&self) -> usize;

    /// `output` (`t` times `input`'s bytes) = every rank's `input`, in rank order.
    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<(), CollectiveError>;

    /// `output` = rows `[k*n, (k+1)*n)` (bytes; `k` this rank, `n` the output's length) of the
    /// sum over ranks of `input` (`t*n` bytes), by [`reduce`].
    fn reduce_scatter(&self, element: Element, input: &[u8], output: &mut [u8]) -> Result<(), CollectiveError>;

    /// `data` = the reduction over ranks of `data`, by [`reduce`], on every rank.
    fn all_reduce(&self, element: Element, reduction: Reduction, data: &mut [u8]) -> Result<(), CollectiveError>;

    /// Point to point, as one call of the whole group (every rank issues it as its next call, like
    /// a collective): sends `send` to rank `send_to` and receives `receive.len()` bytes from rank
    /// `receive_from` into `receive`. A ring shift (each rank sends to `k + 1` and receives from
    /// `k - 1`) is one call, without deadlock whatever the order the ranks arrive in. Ranks whose
    /// pairs do not match (rank `a` sends to `b` but `b` receives from another rank, or the sizes
    /// differ) fail the call on every rank with [`CollectiveError::Exchange`]. No arithmetic: the
    /// bytes arrive as sent.
    fn exchange(
        &self,
        send_to: usize,
        send: &[u8],
        receive_from: usize,
        receive: &mut [u8],
    ) -> Result<(), CollectiveError>;

    /// Marks this rank failed: every rank's pending and later calls return
    /// [`CollectiveError::RankFailed`] with `reason`. Idempotent; the first reason stays.
    fn abort(&self, reason: &str);
}

/// The reference reduction: for each element, the ranks' values (`inputs` in rank order, equal
/// lengths, whole elements) converted to f32 and combined in rank order (a sum starts from rank
/// 0's value, so `t = 1` is the identity), rounded once into `output`.
pub fn reduce(element: Element, reduction: Reduction, inputs: &[&[u8]], output: &mut [u8]) {
    let size = element.bytes();
    for (index, out) in output.chunks_exact_mut(size).enumerate() {
        let at = index * size..(index + 1) * size;
        let mut values = inputs.iter().filter_map(|input| input.get(at.clone())).map(|bytes| element.load(bytes));
        let Some(first) = values.next() else { continue };
        let combined = values.fold(first, |acc, value| match reduction {
            Reduction::Sum => acc + value,
            Reduction::Max if acc.is_nan() || value.is_nan() => f32::NAN,
            Reduction::Max => acc.max(value),
        });
        element.store(combined, out);
    }
}

/// The in-process group: `t` ranks in one process (threads), each with a [`LocalRank`] handle.
pub struct LocalGroup;

/// The default timeout of a [`LocalGroup`]: how long a rank waits for the others in one call.
/// Generous, since a rank waits for its peers' computation between collectives.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

impl LocalGroup {
    /// A group of `ranks` ranks (at least 1) with [`DEFAULT_TIMEOUT`]: handle `k` is rank `k`.
    pub fn ranks(ranks: usize) -> Vec<LocalRank> {
        Self::with_timeout(ranks, DEFAULT_TIMEOUT)
    }

    /// A group of `ranks` ranks (at least 1) whose calls fail after `timeout` without every rank.
    pub fn with_timeout(ranks: usize, timeout: Duration) -> Vec<LocalRank> {
        let ranks = ranks.max(1);
        let group = Arc::new(Group {
            state: Mutex::new(GroupState {
                call: 0,
                arrived: vec![None; ranks],
                result: Arc::new(Vec::new()),
                offsets: Vec::new(),
                failure: None,
                left: vec![false; ranks],
            }),
            changed: Condvar::new(),
            ranks,
            timeout,
        });
        (0..ranks).map(|rank| LocalRank { group: Arc::clone(&group), rank, calls: Mutex::new(0) }).collect()
    }
}

struct Group {
    state: Mutex<GroupState>,
    changed: Condvar,
    ranks: usize,
    timeout: Duration,
}

/// What a rank issued: a collective, or its side of an exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Collective(Collective),
    Exchange { send_to: usize, receive_from: usize },
}

/// One rank's contribution to the call being gathered.
#[derive(Clone)]
struct Arrival {
    call: Call,
    input: Vec<u8>,
    output_len: usize,
}

struct GroupState {
    /// The call being gathered: the number of calls completed.
    call: u64,
    /// Per rank, its contribution to call `call` once it has arrived.
    arrived: Vec<Option<Arrival>>,
    /// The whole result of call `call - 1` (each rank copies its part): for an exchange, what
    /// each rank receives, in rank order.
    result: Arc<Vec<u8>>,
    /// Where rank `k`'s part of an exchange's result starts (empty after a collective).
    offsets: Vec<usize>,
    /// The first failure; every call fails from then on.
    failure: Option<CollectiveError>,
    /// Ranks whose handle was dropped: a call that needs them fails at once.
    left: Vec<bool>,
}

/// Rank `rank()` of a [`LocalGroup`]. Dropping it while other ranks wait for it fails their call.
pub struct LocalRank {
    group: Arc<Group>,
    rank: usize,
    /// Calls this rank completed (its next call's number).
    calls: Mutex<u64>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LocalRank {
    fn fail(&self, state: &mut GroupState, error: CollectiveError) -> CollectiveError {
        let first = state.failure.get_or_insert(error).clone();
        self.group.changed.notify_all();
        first
    }

    /// Issues `collective` with `input`; returns the whole result (every rank's share).
    fn call(&self, collective: Collective, input: &[u8], output_len: usize) -> Result<Arc<Vec<u8>>, CollectiveError> {
        self.issue(Call::Collective(collective), input, output_len).map(|(result, _)| result)
    }

    /// Issues `issued` with `input`; returns the whole result and the exchange's offsets.
    fn issue(
        &self,
        issued: Call,
        input: &[u8],
        output_len: usize,
    ) -> Result<(Arc<Vec<u8>>, Vec<usize>), CollectiveError> {
        let group = &*self.group;
        let mut calls = lock(&self.calls);
        let mut state = lock(&group.state);
        if let Some(failure) = &state.failure {
            return Err(failure.clone());
        }
        let call = *calls;
        if state.call != call {
            let reason = format!("rank {} is at collective #{call} while the group is at #{}", self.rank, state.call);
            return Err(self.fail(&mut state, CollectiveError::RankFailed { rank: self.rank, reason }));
        }
        match issued {
            Call::Collective(collective) => {
                if let Some(shape) = shape_problem(collective, input.len(), output_len, group.ranks) {
                    let error = CollectiveError::Shape { rank: self.rank, collective, problem: shape };
                    return Err(self.fail(&mut state, error));
                }
            }
            Call::Exchange { send_to, receive_from } => {
                if send_to >= group.ranks || receive_from >= group.ranks {
                    let problem = format!(
                        "rank {} sends to rank {send_to} and receives from rank {receive_from} in a group of {}",
                        self.rank, group.ranks
                    );
                    return Err(self.fail(&mut state, CollectiveError::Exchange { call, problem }));
                }
            }
        }
        if let Some((other, theirs)) = state.arrived.iter().enumerate().find_map(|(r, a)| a.as_ref().map(|a| (r, a))) {
            let error = match (theirs.call, issued) {
                (Call::Collective(first), Call::Collective(second))
                    if first != second || theirs.input.len() != input.len() || theirs.output_len != output_len =>
                {
                    Some(CollectiveError::Mismatch {
                        call,
                        first: (other, first, theirs.input.len()),
                        second: (self.rank, second, input.len()),
                    })
                }
                (Call::Collective(c), Call::Exchange { .. }) | (Call::Exchange { .. }, Call::Collective(c)) => {
                    let (exchanging, collecting) =
                        if matches!(issued, Call::Exchange { .. }) { (self.rank, other) } else { (other, self.rank) };
                    let problem = format!("rank {exchanging} issued an exchange but rank {collecting} issued {c}");
                    Some(CollectiveError::Exchange { call, problem })
                }
                _ => None,
            };
            if let Some(error) = error {
                return Err(self.fail(&mut state, error));
            }
        }
        if let Some(gone) = state.left.iter().position(|&left| left) {
            let reason = format!("it left the group (its thread ended) before collective #{call}");
            return Err(self.fail(&mut state, CollectiveError::RankFailed { rank: gone, reason }));
        }
        state.arrived[self.rank] = Some(Arrival { call: issued, input: input.to_vec(), output_len });
        if state.arrived.iter().all(Option::is_some) {
            let arrivals: Vec<Arrival> = state.arrived.iter_mut().filter_map(Option::take).collect();
            match issued {
                Call::Collective(collective) => {
                    state.result = Arc::new(combine(collective, &arrivals));
                    state.offsets = Vec::new();
                }
                Call::Exchange { .. } => match pair_up(&arrivals) {
                    Ok((result, offsets)) => {
                        state.result = Arc::new(result);
                        state.offsets = offsets;
                    }
                    Err(problem) => return Err(self.fail(&mut state, CollectiveError::Exchange { call, problem })),
                },
            }
            state.call += 1;
            group.changed.notify_all();
        } else {
            let deadline = Instant::now() + group.timeout;
            while state.call == call && state.failure.is_none() {
                let now = Instant::now();
                if now >= deadline {
                    let missing: Vec<usize> = (0..group.ranks).filter(|&r| state.arrived[r].is_none()).collect();
                    let waited = group.timeout;
                    let error = match issued {
                        Call::Collective(collective) => {
                            CollectiveError::Timeout { call, collective, rank: self.rank, missing, waited }
                        }
                        Call::Exchange { .. } => CollectiveError::Exchange {
                            call,
                            problem: format!(
                                "rank {} waited {:.1} s and rank(s) {missing:?} did not arrive",
                                self.rank,
                                waited.as_secs_f64()
                            ),
                        },
                    };
                    return Err(self.fail(&mut state, error));
                }
                state = group.changed.wait_timeout(state, deadline - now).map_or_else(|p| p.into_inner().0, |r| r.0);
            }
            if state.call == call {
                // Woken by a failure before the call completed.
                return Err(state.failure.clone().unwrap_or_else(|| CollectiveError::RankFailed {
                    rank: self.rank,
                    reason: "the group stopped".into(),
                }));
            }
        }
        // The result stays until the next call completes, which needs this rank.
        *calls += 1;
        Ok((Arc::clone(&state.result), state.offsets.clone()))
    }
}

/// An exchange's result from every rank's side: what each rank receives, in rank order, and
/// where each rank's part starts; or what does not pair up (the same words on every rank).
fn pair_up(arrivals: &[Arrival]) -> Result<(Vec<u8>, Vec<usize>), String> {
    let mut result = Vec::new();
    let mut offsets = Vec::with_capacity(arrivals.len());
    for (k, arrival) in arrivals.iter().enumerate() {
        let Call::Exchange { receive_from, .. } = arrival.call else {
            return Err(format!("rank {k} issued a collective where the others issued an exchange"));
        };
        let sender = &arrivals[receive_from];
        match sender.call {
            Call::Exchange { send_to, .. } if send_to == k => {}
            Call::Exchange { send_to, .. } => {
                return Err(format!("rank {k} receives from rank {receive_from}, which sends to rank {send_to}"));
            }
            Call::Collective(_) => return Err(format!("rank {receive_from} issued a collective, not an exchange")),
        }
        if sender.input.len() != arrival.output_len {
            return Err(format!(
                "rank {receive_from} sends {} bytes to rank {k}, which receives {}",
                sender.input.len(),
                arrival.output_len
            ));
        }
        offsets.push(result.len());
        result.extend_from_slice(&sender.input);
    }
    Ok((result, offsets))
}

/// What is wrong with a call's sizes, if anything: `input` and `output` bytes of one rank of
/// `ranks`. Every implementation of [`Collectives`] checks its calls so (this group, and
/// `memo-mpi`'s across processes), so the same call fails with the same words everywhere.
pub fn shape_problem(collective: Collective, input: usize, output: usize, ranks: usize) -> Option<String> {
    let (element, expected_output) = match collective {
        Collective::AllGather => (1, input.checked_mul(ranks)),
        Collective::ReduceScatter(element) => {
            if !input.is_multiple_of(ranks) {
                return Some(format!("an input of {input} bytes does not split into {ranks} equal shares"));
            }
            (element.bytes(), Some(input / ranks))
        }
        Collective::AllReduce(element, _) => (element.bytes(), Some(input)),
        // `Collective::run` makes a ring shift an `exchange`; it never arrives as a call.
        Collective::RingShift => return Some("a ring shift is an exchange, not a collective call".into()),
    };
    if expected_output != Some(output) {
        return Some(format!(
            "an input of {input} bytes over {ranks} ranks needs an output of {expected_output:?} bytes, not {output}"
        ));
    }
    if !input.is_multiple_of(element) || !output.is_multiple_of(element) {
        return Some(format!("{input} and {output} bytes are not whole elements of {element} bytes"));
    }
    None
}

/// The whole result of a call from every rank's contribution, in rank order.
fn combine(collective: Collective, arrivals: &[Arrival]) -> Vec<u8> {
    match collective {
        Collective::AllGather => arrivals.iter().flat_map(|a| a.input.iter().copied()).collect(),
        Collective::ReduceScatter(element) => {
            let inputs: Vec<&[u8]> = arrivals.iter().map(|a| a.input.as_slice()).collect();
            let mut out = vec![0u8; inputs.first().map_or(0, |i| i.len())];
            reduce(element, Reduction::Sum, &inputs, &mut out);
            out
        }
        Collective::AllReduce(element, reduction) => {
            let inputs: Vec<&[u8]> = arrivals.iter().map(|a| a.input.as_slice()).collect();
            let mut out = vec![0u8; inputs.first().map_or(0, |i| i.len())];
            reduce(element, reduction, &inputs, &mut out);
            out
        }
        // Refused by `shape_problem` before any call combines.
        Collective::RingShift => Vec::new(),
    }
}

impl Collectives for LocalRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.group.ranks
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<(), CollectiveError> {
        let result = self.call(Collective::AllGather, input, output.len())?;
        output.copy_from_slice(&result[..output.len()]);
        Ok(())
    }

    fn reduce_scatter(&self, element: Element, input: &[u8], output: &mut [u8]) -> Result<(), CollectiveError> {
        let result = self.call(Collective::ReduceScatter(element), input, output.len())?;
        let start = self.rank * output.len();
        output.copy_from_slice(&result[start..start + output.len()]);
        Ok(())
    }

    fn all_reduce(&self, element: Element, reduction: Reduction, data: &mut [u8]) -> Result<(), CollectiveError> {
        let result = self.call(Collective::AllReduce(element, reduction), data, data.len())?;
        data.copy_from_slice(&result[..data.len()]);
        Ok(())
    }

    fn exchange(
        &self,
        send_to: usize,
        send: &[u8],
        receive_from: usize,
        receive: &mut [u8],
    ) -> Result<(), CollectiveError> {
        let (result, offsets) = self.issue(Call::Exchange { send_to, receive_from }, send, receive.len())?;
        let start = offsets.get(self.rank).copied().unwrap_or(0);
        match result.get(start..start + receive.len()) {
            Some(part) => receive.copy_from_slice(part),
            None => {
                return Err(CollectiveError::Exchange { call: 0, problem: "the exchange's result is short".into() });
            }
        }
        Ok(())
    }

    fn abort(&self, reason: &str) {
        let mut state = lock(&self.group.state);
        self.fail(&mut state, CollectiveError::RankFailed { rank: self.rank, reason: reason.to_string() });
    }
}

impl Drop for LocalRank {
    /// A rank that goes away while others wait for it (its thread ended early) fails their call;
    /// one that leaves after the group's last call changes nothing.
    fn drop(&mut self) {
        let mut state = lock(&self.group.state);
        state.left[self.rank] = true;
        let waiting = state.arrived.iter().any(Option::is_some);
        if waiting && state.failure.is_none() {
            let call = state.call;
            let reason = format!("it left the group (its thread ended) before collective #{call}");
            self.fail(&mut state, CollectiveError::RankFailed { rank: self.rank, reason });
        }
    }
}

impl fmt::Debug for LocalRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalRank {{ rank: {}, ranks: {} }}", self.rank, self.group.ranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every collective op of the plan, of any group, maps to a call, and nothing else does.
    #[test]
    fn every_collective_op_has_its_call() {
        for &op in Op::ALL {
            assert_eq!(Collective::of_op(op).is_some(), op.collective_group().is_some(), "{op:?}");
        }
        assert_eq!(Collective::of_op(Op::RingExchange), Some(Collective::RingShift));
        assert!(Collective::of_op(Op::AllReduceSumF32).is_some_and(Collective::in_place));
        assert!(!Collective::AllGather.in_place());
    }

    fn bf16_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes()).collect()
    }

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Rank `rank`'s input of `elements` elements: values whose sums round differently in other
    /// orders (large and small magnitudes, both signs).
    fn input(element: Element, rank: usize, elements: usize) -> Vec<u8> {
        let values: Vec<f32> = (0..elements)
            .map(|i| {
                let x = ((rank * 7 + i * 13) % 11) as f32 - 5.0;
                x * [1.0, 3.0e-3, 257.0, -1.0e-5][(rank + i) % 4]
            })
            .collect();
        match element {
            Element::Bf16 => bf16_bytes(&values),
            Element::F32 => f32_bytes(&values),
        }
    }

    /// Runs `f(rank handle)` on one thread per rank, spawned in `order`; results in rank order.
    fn on_ranks<R: Send>(ranks: Vec<LocalRank>, order: &[usize], f: impl Fn(&LocalRank) -> R + Sync) -> Vec<R> {
        let mut slots: Vec<Option<R>> = (0..ranks.len()).map(|_| None).collect();
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for &r in order {
                let (rank, f) = (&ranks[r], &f);
                handles.push((r, scope.spawn(move || f(rank))));
            }
            for (r, handle) in handles {
                slots[r] = Some(handle.join().expect("a rank's thread panicked"));
            }
        });
        slots.into_iter().map(|s| s.expect("every rank ran")).collect()
    }

    fn orders(t: usize) -> Vec<Vec<usize>> {
        vec![(0..t).collect(), (0..t).rev().collect(), (0..t).map(|i| (i + t / 2) % t).collect()]
    }

    #[test]
    fn the_reference_sums_in_rank_order_and_rounds_once() {
        // 1 + 2^-8 is not a bf16 (8 significand bits), so rounding between additions loses it:
        // rank order in f32 with one rounding gives 1 + 2^-7 from 1, 2^-8 and 2^-8...
        let inputs = [bf16_bytes(&[1.0]), bf16_bytes(&[2f32.powi(-8)]), bf16_bytes(&[2f32.powi(-8)])];
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = vec![0u8; 2];
        reduce(Element::Bf16, Reduction::Sum, &refs, &mut out);
        assert_eq!(out, bf16_bytes(&[1.0 + 2f32.powi(-7)]));
        // ...where rounding after each addition would give 1 (ties to even), twice.
        assert_ne!(out, bf16_bytes(&[1.0]));
        // f32: (2^24 + 1) + 1 in rank order is 2^24 (each addition rounds in f32); 1 + 1 + 2^24
        // would be 2^24 + 2: the order is part of the contract.
        let inputs = [f32_bytes(&[16_777_216.0]), f32_bytes(&[1.0]), f32_bytes(&[1.0])];
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = vec![0u8; 4];
        reduce(Element::F32, Reduction::Sum, &refs, &mut out);
        assert_eq!(out, f32_bytes(&[16_777_216.0]));
        // Max, with a NaN on one rank.
        let inputs = [f32_bytes(&[1.0, -3.0]), f32_bytes(&[f32::NAN, -2.0])];
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = vec![0u8; 8];
        reduce(Element::F32, Reduction::Max, &refs, &mut out);
        assert!(f32::from_le_bytes(out[..4].try_into().unwrap()).is_nan());
        assert_eq!(f32::from_le_bytes(out[4..].try_into().unwrap()), -2.0);
        // One rank: the identity, -0.0 included.
        let zero = f32_bytes(&[-0.0]);
        let mut out = vec![0u8; 4];
        reduce(Element::F32, Reduction::Sum, &[&zero], &mut out);
        assert_eq!(out, zero);
    }

    #[test]
    fn every_collective_matches_the_reference_on_1_to_4_ranks_whatever_the_arrival_order() {
        for t in 1..=4 {
            for element in [Element::Bf16, Element::F32] {
                for elements in [1, 3, 5, 64] {
                    for order in orders(t) {
                        let ebytes = element.bytes();
                        // all_gather: rank j's bytes land at [j*n, (j+1)*n).
                        let gathered = on_ranks(LocalGroup::ranks(t), &order, |rank| {
                            let x = input(element, rank.rank(), elements);
                            let mut y = vec![0xAA; t * x.len()];
                            rank.all_gather(&x, &mut y).map(|()| y)
                        });
                        let expected: Vec<u8> = (0..t).flat_map(|j| input(element, j, elements)).collect();
                        for (k, y) in gathered.into_iter().enumerate() {
                            assert_eq!(y.unwrap(), expected, "all_gather t {t} rank {k} {element:?} {elements}");
                        }
                        // reduce_scatter: the sum of t*n-byte inputs, rank k's share.
                        let scattered = on_ranks(LocalGroup::ranks(t), &order, |rank| {
                            let x = input(element, rank.rank(), elements * t);
                            let mut y = vec![0xAA; elements * ebytes];
                            rank.reduce_scatter(element, &x, &mut y).map(|()| y)
                        });
                        let inputs: Vec<Vec<u8>> = (0..t).map(|j| input(element, j, elements * t)).collect();
                        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                        let mut sum = vec![0u8; elements * t * ebytes];
                        reduce(element, Reduction::Sum, &refs, &mut sum);
                        for (k, y) in scattered.into_iter().enumerate() {
                            let share = &sum[k * elements * ebytes..(k + 1) * elements * ebytes];
                            assert_eq!(y.unwrap(), share, "reduce_scatter t {t} rank {k} {element:?} {elements}");
                        }
                        // all_reduce, sum and max: every rank the same bits, the reference's.
                        for reduction in [Reduction::Sum, Reduction::Max] {
                            let reduced = on_ranks(LocalGroup::ranks(t), &order, |rank| {
                                let mut x = input(element, rank.rank(), elements);
                                rank.all_reduce(element, reduction, &mut x).map(|()| x)
                            });
                            let inputs: Vec<Vec<u8>> = (0..t).map(|j| input(element, j, elements)).collect();
                            let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                            let mut want = vec![0u8; elements * ebytes];
                            reduce(element, reduction, &refs, &mut want);
                            for (k, y) in reduced.into_iter().enumerate() {
                                assert_eq!(y.unwrap(), want, "all_reduce {reduction:?} t {t} rank {k} {element:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn calls_follow_each_other_in_order() {
        // Many calls in a row on every rank: each returns its own call's result.
        let results = on_ranks(LocalGroup::ranks(3), &[2, 0, 1], |rank| {
            (0..50u32)
                .map(|call| {
                    let mut x = f32_bytes(&[(call * 10 + rank.rank() as u32) as f32]);
                    rank.all_reduce(Element::F32, Reduction::Max, &mut x).map(|()| x)
                })
                .collect::<Result<Vec<_>, _>>()
        });
        for r in results {
            let r = r.unwrap();
            for (call, x) in r.iter().enumerate() {
                assert_eq!(*x, f32_bytes(&[(call * 10 + 2) as f32]));
            }
        }
    }

    #[test]
    fn a_failed_rank_fails_every_other_rank_instead_of_hanging() {
        for t in 2..=4 {
            let failing = t - 1;
            let results = on_ranks(LocalGroup::ranks(t), &(0..t).collect::<Vec<_>>(), |rank| {
                if rank.rank() == failing {
                    rank.abort("its kernel failed");
                    return Err(CollectiveError::RankFailed { rank: failing, reason: "self".into() });
                }
                let mut x = bf16_bytes(&[1.0, 2.0, 3.0]);
                rank.all_reduce(Element::Bf16, Reduction::Sum, &mut x)
            });
            for (k, result) in results.into_iter().enumerate().filter(|&(k, _)| k != failing) {
                let error = result.unwrap_err();
                assert_eq!(
                    error,
                    CollectiveError::RankFailed { rank: failing, reason: "its kernel failed".into() },
                    "t {t} rank {k}"
                );
                assert!(error.to_string().contains(&format!("rank {failing}")), "{error}");
            }
        }
        // A rank whose handle is dropped (its thread ended) while the others wait.
        let mut ranks = LocalGroup::ranks(3);
        let gone = ranks.pop().unwrap();
        let results = std::thread::scope(|scope| {
            let waiting: Vec<_> = ranks
                .iter()
                .map(|rank| {
                    scope.spawn(move || {
                        let x = [1u8, 2];
                        let mut y = [0u8; 6];
                        rank.all_gather(&x, &mut y)
                    })
                })
                .collect();
            drop(gone);
            waiting.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        for result in results {
            assert!(matches!(result, Err(CollectiveError::RankFailed { rank: 2, .. })), "{result:?}");
        }
        // And every later call fails at once.
        assert!(matches!(ranks[0].all_gather(&[1], &mut [0; 3]), Err(CollectiveError::RankFailed { rank: 2, .. })));
    }

    #[test]
    fn a_rank_that_never_arrives_times_out_every_waiting_rank() {
        let ranks = LocalGroup::with_timeout(3, Duration::from_millis(50));
        let results = on_ranks(ranks, &[0, 1, 2], |rank| {
            if rank.rank() == 1 {
                return Ok(()); // never calls
            }
            let mut x = f32_bytes(&[1.0]);
            rank.all_reduce(Element::F32, Reduction::Sum, &mut x)
        });
        for k in [0, 2] {
            match &results[k] {
                Err(CollectiveError::Timeout { call: 0, missing, .. }) => assert!(missing.contains(&1), "{missing:?}"),
                other => panic!("rank {k}: {other:?}"),
            }
        }
    }

    #[test]
    fn ranks_that_issue_different_collectives_or_sizes_are_refused() {
        let results = on_ranks(LocalGroup::ranks(2), &[0, 1], |rank| {
            let mut x = f32_bytes(&[1.0, 2.0]);
            if rank.rank() == 0 {
                rank.all_reduce(Element::F32, Reduction::Sum, &mut x)
            } else {
                rank.all_reduce(Element::F32, Reduction::Max, &mut x)
            }
        });
        for result in &results {
            assert!(matches!(result, Err(CollectiveError::Mismatch { call: 0, .. })), "{result:?}");
        }
        let results = on_ranks(LocalGroup::ranks(2), &[1, 0], |rank| {
            let x = vec![0u8; 2 + 2 * rank.rank()];
            let mut y = vec![0u8; 2 * x.len()];
            rank.all_gather(&x, &mut y)
        });
        for result in &results {
            assert!(matches!(result, Err(CollectiveError::Mismatch { .. })), "{result:?}");
        }
        // Sizes that do not fit the collective: refused on the rank, and the group fails.
        let ranks = LocalGroup::ranks(2);
        let error = ranks[0].reduce_scatter(Element::Bf16, &[0; 6], &mut [0; 2]).unwrap_err();
        assert!(matches!(error, CollectiveError::Shape { rank: 0, .. }), "{error}");
        assert!(ranks[1].all_gather(&[0; 2], &mut [0; 4]).is_err());
        let ranks = LocalGroup::ranks(3);
        assert!(matches!(ranks[0].all_gather(&[0; 2], &mut [0; 4]), Err(CollectiveError::Shape { .. })));
        let ranks = LocalGroup::ranks(1);
        assert!(matches!(
            ranks[0].all_reduce(Element::Bf16, Reduction::Sum, &mut [0; 3]),
            Err(CollectiveError::Shape { .. })
        ));
    }

    #[test]
    fn an_exchange_shifts_a_ring_on_1_to_4_ranks_whatever_the_arrival_order() {
        for t in 1..=4 {
            for order in orders(t) {
                let received = on_ranks(LocalGroup::ranks(t), &order, |rank| {
                    let k = rank.rank();
                    // Rank k sends k+1 copies of its number; rank k+1 receives them.
                    let send = vec![k as u8; k + 1];
                    let from = (k + t - 1) % t;
                    let mut receive = vec![0xAA; from + 1];
                    rank.exchange((k + 1) % t, &send, from, &mut receive).map(|()| receive)
                });
                for (k, bytes) in received.into_iter().enumerate() {
                    let from = (k + t - 1) % t;
                    assert_eq!(bytes.unwrap(), vec![from as u8; from + 1], "t {t} rank {k} order {order:?}");
                }
            }
        }
        // Exchanges and collectives follow each other in order.
        let results = on_ranks(LocalGroup::ranks(2), &[1, 0], |rank| {
            let mut received = [0u8; 1];
            rank.exchange(1 - rank.rank(), &[rank.rank() as u8], 1 - rank.rank(), &mut received)?;
            let mut x = f32_bytes(&[f32::from(received[0])]);
            rank.all_reduce(Element::F32, Reduction::Sum, &mut x).map(|()| x)
        });
        for result in results {
            assert_eq!(result.unwrap(), f32_bytes(&[1.0]));
        }
    }

    #[test]
    fn exchanges_that_do_not_pair_up_fail_on_every_rank() {
        for t in 2..=4 {
            // Rank 0 expects one byte more than its sender sends.
            let results = on_ranks(LocalGroup::ranks(t), &(0..t).rev().collect::<Vec<_>>(), |rank| {
                let k = rank.rank();
                let mut receive = vec![0u8; if k == 0 { 3 } else { 2 }];
                rank.exchange((k + 1) % t, &[1, 2], (k + t - 1) % t, &mut receive)
            });
            for (k, result) in results.iter().enumerate() {
                match result {
                    Err(CollectiveError::Exchange { call: 0, problem }) => {
                        assert!(
                            problem.contains("sends 2 bytes to rank 0, which receives 3"),
                            "t {t} rank {k}: {problem}"
                        )
                    }
                    other => panic!("t {t} rank {k}: {other:?}"),
                }
            }
            // Rank 1 receives from itself while rank 0 sends to it.
            let results = on_ranks(LocalGroup::ranks(t), &(0..t).collect::<Vec<_>>(), |rank| {
                let k = rank.rank();
                let from = if k == 1 { 1 } else { (k + t - 1) % t };
                rank.exchange((k + 1) % t, &[0], from, &mut [0])
            });
            for result in &results {
                assert!(matches!(result, Err(CollectiveError::Exchange { .. })), "t {t}: {result:?}");
            }
            // An exchange against a collective; a peer out of the group.
            let results = on_ranks(LocalGroup::ranks(t), &(0..t).collect::<Vec<_>>(), |rank| {
                if rank.rank() == 0 {
                    rank.all_gather(&[0], &mut vec![0; t])
                } else {
                    rank.exchange(0, &[0], 0, &mut [0])
                }
            });
            for result in &results {
                assert!(matches!(result, Err(CollectiveError::Exchange { .. })), "t {t}: {result:?}");
            }
            let ranks = LocalGroup::ranks(t);
            assert!(matches!(ranks[0].exchange(t, &[0], 0, &mut [0]), Err(CollectiveError::Exchange { .. })));
        }
    }

    #[test]
    fn an_aborted_peer_fails_every_exchange() {
        for t in 2..=4 {
            let results = on_ranks(LocalGroup::ranks(t), &(0..t).collect::<Vec<_>>(), |rank| {
                let k = rank.rank();
                if k == 1 {
                    rank.abort("its kernel failed");
                    return Ok(());
                }
                rank.exchange((k + 1) % t, &[1], (k + t - 1) % t, &mut [0])
            });
            for (k, result) in results.into_iter().enumerate().filter(|&(k, _)| k != 1) {
                assert_eq!(
                    result,
                    Err(CollectiveError::RankFailed { rank: 1, reason: "its kernel failed".into() }),
                    "t {t} rank {k}"
                );
            }
        }
    }
}
