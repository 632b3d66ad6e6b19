//! [`ParallelTrainer`]: the `c x t` ranks of a step with tensor parallelism `t` and context
//! parallelism `c`, each a [`Trainer`] replaying the checked plan (its context rank's program) on
//! its own backend (its own arena), joined by [`Collectives`]: its tensor-parallel group, and
//! with `c > 1` the ranks that share its tensor-parallel rank (the data group: the ring and the
//! gradients' sums), which its backend holds. Global rank `g = k*t + j` is tensor-parallel rank
//! `j` of context rank `k`. Each step runs every rank on a thread of its own; context rank `k`
//! takes chunks `k` and `2c-1-k` of every sequence (`spec/context-parallel.md` §1), and its
//! tensor-parallel rank `j` rows `[j*r, (j+1)*r)` of those (`r = R / t`,
//! `spec/tensor-parallel.md` §1); every rank computes the same loss (checked bit for bit; rank
//! 0's is returned).
//!
//! A trainer may hold only some ranks (one, in a process of its own, its peers in other
//! processes joined by a group such as `memo-mpi`'s): each held rank is given with its groups,
//! whose ranks say which global rank it is. It steps only its ranks (on their rows), and checks
//! only its own ranks' losses against each other: that every rank computes the same loss rests
//! on the plan (`spec/tensor-parallel.md` §4: every rank computes the loss of every gathered row
//! from all-reduced figures, so with the same bits). A checkpoint gathers the other ranks' state
//! through the tensor-parallel group (`c = 1`; every process gets the same checkpoint, the
//! caller writes it from rank 0 only); a restore restores the held ranks' tensors. Reassembling
//! `t = 1` tensors, and checkpoints with `c > 1`, need every rank in the trainer and say so.

use std::sync::Arc;

use memo_plan_core::check::CheckedPlan;
use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::{Buffer, BufferKind, TensorRole};
use memo_plan_core::schedule::{replicated_gradient_rows, ReplicatedPool};

use super::{NamedBytes, PlannedStep, SetupTimes, Shard, ShardLayout, Trainer};
use crate::backend::{Backend, BackendError, CheckReport, MemoryReport};
use crate::checkpoint::{Checkpoint, StateKind};
use crate::collective::{Collectives, LocalGroup, LocalRank};
use crate::control::{StepControl, StopGate};
use crate::error::{CheckpointMismatch, RuntimeError, TokenError};

/// A model trained with tensor and context parallelism over `c x t` ranks in this process.
pub struct ParallelTrainer<B: Backend + Send> {
    /// The held ranks, in increasing global rank.
    ranks: Vec<Trainer<B>>,
    groups: Vec<RankGroups>,
    /// The global rank `k*t + j` of each held trainer.
    ids: Vec<usize>,
    /// `t`, the tensor-parallel group's size.
    tensor: usize,
    /// `c`, the context-parallel ranks.
    context: usize,
}

/// The groups one rank belongs to, as [`ParallelTrainer::with_plan`] takes them: its
/// tensor-parallel group, and with context parallelism the ranks that share its tensor-parallel
/// rank (the data group, which its backend was built with). A failing rank aborts both, so no
/// rank waits for it.
#[derive(Clone)]
pub struct RankGroups {
    /// The tensor-parallel group: `rank()` is the tensor-parallel rank, `ranks()` is `t`.
    pub tensor: Arc<dyn Collectives>,
    /// The data group with `c > 1`: `rank()` is the context rank, `ranks()` is `c`.
    pub data: Option<Arc<dyn Collectives>>,
}

impl RankGroups {
    /// The global rank these groups make: `k*t + j`, with `j` the tensor-parallel group's rank and
    /// `k` the data group's (0 without one).
    fn global_rank(&self) -> usize {
        let k = self.data.as_ref().map_or(0, |data| data.rank());
        k * self.tensor.ranks() + self.tensor.rank()
    }

    fn abort(&self, reason: &str) {
        self.tensor.abort(reason);
        if let Some(data) = &self.data {
            data.abort(reason);
        }
    }
}

impl RankGroups {
    /// The in-process groups of `c x t` ranks (one process, a thread per rank): entry `k*t + j`
    /// is rank `j` of context rank `k`'s tensor-parallel group and, with `c > 1`, rank `k` of
    /// tensor-parallel rank `j`'s data group; what [`ParallelTrainer::with_plan`] takes, each
    /// beside a backend built with them.
    pub fn local(t: usize, c: usize) -> Vec<RankGroups> {
        let (t, c) = (t.max(1), c.max(1));
        let mut data: Vec<std::vec::IntoIter<LocalRank>> =
            if c > 1 { (0..t).map(|_| LocalGroup::ranks(c).into_iter()).collect() } else { Vec::new() };
        let mut out = Vec::with_capacity(c * t);
        for _ in 0..c {
            for (j, rank) in LocalGroup::ranks(t).into_iter().enumerate() {
                // Context rank `k`'s turn takes the `k`-th rank of each data group.
                let data = data.get_mut(j).and_then(Iterator::next).map(|d| Arc::new(d) as Arc<dyn Collectives>);
                out.push(RankGroups { tensor: Arc::new(rank), data });
            }
        }
        out
    }
}

impl From<Arc<dyn Collectives>> for RankGroups {
    fn from(tensor: Arc<dyn Collectives>) -> Self {
        RankGroups { tensor, data: None }
    }
}

/// Rows of context rank `k` of `c` from a step's `b` sequences of `s` tokens (`rows`, `b*s`
/// long): per sequence, chunk `k` then chunk `2c-1-k` of `2c` equal chunks
/// (`spec/context-parallel.md` §1). With `c = 1`, all of them.
fn context_rows<T: Copy>(rows: &[T], seq_len: usize, k: usize, c: usize) -> Vec<T> {
    if c <= 1 {
        return rows.to_vec();
    }
    let n = seq_len / (2 * c);
    rows.chunks(seq_len.max(1))
        .flat_map(|sequence| {
            [k, 2 * c - 1 - k].into_iter().flat_map(move |chunk| &sequence[chunk * n..(chunk + 1) * n])
        })
        .copied()
        .collect()
}

/// Runs `f(rank, trainer)` on one thread per rank; a rank that fails aborts the group, so no
/// other rank waits for it. The results in rank order.
fn on_every_rank<B, R, F>(
    ranks: &mut [Trainer<B>],
    groups: &[RankGroups],
    ids: &[usize],
    f: F,
) -> Vec<Result<R, RuntimeError>>
where
    B: Backend + Send,
    R: Send,
    F: Fn(usize, &mut Trainer<B>) -> Result<R, RuntimeError> + Sync,
{
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .iter_mut()
            .zip(groups)
            .zip(ids)
            .map(|((trainer, group), &rank)| {
                let spawned =
                    std::thread::Builder::new().name(format!("memo-rank-{rank}")).spawn_scoped(scope, move || {
                        let result = f(rank, trainer);
                        if let Err(error) = &result {
                            group.abort(&error.to_string());
                        }
                        result
                    });
                if spawned.is_err() {
                    group.abort("its thread could not be started");
                }
                spawned
            })
            .collect();
        joined(handles, ids, "thread")
    })
}

/// The results of the ranks' threads in rank order: a thread that could not start or that
/// panicked is that rank's error (`what` names the thread in the message).
fn joined<R>(
    handles: Vec<std::io::Result<std::thread::ScopedJoinHandle<'_, Result<R, RuntimeError>>>>,
    ids: &[usize],
    what: &str,
) -> Vec<Result<R, RuntimeError>> {
    let failed = |message: String| RuntimeError::Backend(crate::BackendError::Other(message));
    handles
        .into_iter()
        .zip(ids)
        .map(|(handle, &rank)| match handle {
            Ok(handle) => handle.join().unwrap_or_else(|_| Err(failed(format!("rank {rank}'s {what} panicked")))),
            Err(error) => Err(failed(format!("cannot start rank {rank}'s thread: {error}"))),
        })
        .collect()
}

/// The gradients in a replicated-gradients buffer (`spec/tensor-parallel.md` §4 and §8: the
/// rows [`replicated_gradient_rows`] lists for its pool, in order), each under the (role, layer)
/// of its `t = 1` gradient buffer.
fn split_replicated_gradients(bytes: &[u8], buffer: &Buffer, model: &ModelConfig, tensor: u64) -> Vec<NamedBytes> {
    let pool = match buffer.role {
        TensorRole::ReplicatedBiasGradients => ReplicatedPool::KeyValueBias,
        _ => ReplicatedPool::Hidden,
    };
    let mut at = 0usize;
    let mut out = Vec::new();
    for (_, role, layer, rows) in replicated_gradient_rows(model, tensor).into_iter().filter(|r| r.0 == pool) {
        let len = (rows * buffer.row_bytes) as usize;
        let Some(part) = bytes.get(at..at + len) else { break };
        out.push(((role, layer), part.to_vec()));
        at += len;
    }
    out
}

fn is_interrupted<R>(result: &Result<R, RuntimeError>) -> bool {
    matches!(result, Err(RuntimeError::Backend(BackendError::Interrupted)))
}

/// The first rank's error, tagged with its rank (`ids`: the rank of each result); else every
/// rank's value.
fn first_error<R>(results: Vec<Result<R, RuntimeError>>, ids: &[usize]) -> Result<Vec<R>, RuntimeError> {
    let mut values = Vec::with_capacity(results.len());
    for (result, &rank) in results.into_iter().zip(ids) {
        match result {
            Ok(value) => values.push(value),
            Err(error) => return Err(RuntimeError::Rank { rank: rank as u64, error: Box::new(error) }),
        }
    }
    Ok(values)
}

impl<B: Backend + Send> ParallelTrainer<B> {
    /// Checks the planned step's plan once and starts one rank per backend. Each backend comes
    /// with its groups ([`RankGroups`]: its tensor-parallel group, where it is rank `j` of `t`;
    /// with `c > 1` also the data group its backend runs the ring on, where it is rank `k` of
    /// `c`), which say its global rank `g = k*t + j`: every rank of the step, or some of them
    /// when the others run elsewhere. Each allocates the plan (its context rank's program) and
    /// initialises its shard of the model (on its own thread).
    pub fn with_plan<G: Into<RankGroups>>(planned: PlannedStep, ranks: Vec<(B, G)>) -> Result<Self, RuntimeError> {
        let tensor = planned.tensor().max(1) as usize;
        let context = planned.report.plan.provenance.parallel.context.max(1) as usize;
        let all = tensor * context;
        let checking = std::time::Instant::now();
        let refuse = |message: String| Err(RuntimeError::Backend(crate::BackendError::Other(message)));
        if ranks.is_empty() || ranks.len() > all {
            return refuse(format!(
                "the step is planned for {tensor} tensor-parallel x {context} context-parallel rank(s) but {} \
                 backend(s) were given: give one per rank this process runs (1 to {all})",
                ranks.len()
            ));
        }
        let mut ranks: Vec<(B, RankGroups)> =
            ranks.into_iter().map(|(backend, groups)| (backend, groups.into())).collect();
        for (_, groups) in &ranks {
            let (j, t) = (groups.tensor.rank(), groups.tensor.ranks());
            if t != tensor || j >= tensor {
                return refuse(format!(
                    "a backend is rank {j} of a tensor-parallel group of {t}: the step is planned for a group of \
                     {tensor}"
                ));
            }
            let data = groups.data.as_ref().map(|d| (d.rank(), d.ranks()));
            if context > 1 && !data.is_some_and(|(k, c)| c == context && k < context) {
                return refuse(format!(
                    "tensor-parallel rank {j} is in data group {data:?} (rank, ranks): with context parallelism \
                     {context} each rank is one of the {context} ranks that share its tensor-parallel rank"
                ));
            }
        }
        ranks.sort_by_key(|(_, groups)| groups.global_rank());
        if let Some(pair) = ranks.windows(2).find(|pair| pair[0].1.global_rank() == pair[1].1.global_rank()) {
            return refuse(format!(
                "two backends are rank {} of the step: give each rank once",
                pair[0].1.global_rank()
            ));
        }
        let ids: Vec<usize> = ranks.iter().map(|(_, groups)| groups.global_rank()).collect();
        let checked = CheckedPlan::check(planned.report.plan.clone()).map_err(RuntimeError::Invalid)?;
        let groups: Vec<RankGroups> = ranks.iter().map(|(_, g)| g.clone()).collect();
        let started: Vec<Result<Trainer<B>, RuntimeError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ranks
                .into_iter()
                .zip(&ids)
                .map(|((backend, _), &rank)| {
                    let (planned, checked) = (planned.clone(), checked.clone());
                    std::thread::Builder::new().name(format!("memo-rank-{rank}")).spawn_scoped(scope, move || {
                        Trainer::for_rank(backend, planned, checked, rank as u64, checking)
                    })
                })
                .collect();
            joined(handles, &ids, "setup thread")
        });
        let ranks = first_error(started, &ids)?;
        Ok(ParallelTrainer { ranks, groups, ids, tensor, context })
    }

    /// The tensor-parallel group's size `t`.
    pub fn tensor(&self) -> usize {
        self.tensor
    }

    /// Context-parallel ranks, `c`.
    pub fn context(&self) -> usize {
        self.context
    }

    /// The global ranks this trainer runs, in increasing order (`0..c*t` when it holds every
    /// rank).
    pub fn held_ranks(&self) -> &[usize] {
        &self.ids
    }

    /// Refuses `what` unless this trainer holds every rank of the step.
    fn every_rank_held(&self, what: &str) -> Result<(), RuntimeError> {
        if self.ids.len() == self.tensor * self.context {
            return Ok(());
        }
        Err(RuntimeError::Backend(crate::BackendError::Other(format!(
            "{what} needs every rank's state, and this trainer runs rank(s) {:?} of {}: gathering state across \
             processes is implemented for tensor parallelism alone (c = 1); run the ranks as threads of one process",
            self.ids,
            self.tensor * self.context
        ))))
    }

    /// One training step on the whole micro-batch's `tokens` and `targets` (`micro_batch *
    /// seq_len` each): rank `k` takes rows `[k*r, (k+1)*r)`. Returns the mean loss, which every
    /// rank must have computed bit for bit alike.
    ///
    /// Tokens the model does not take are refused before any rank starts. A step that fails on
    /// a rank aborts the group: the group stays failed, so every later step fails too (restore
    /// the last checkpoint into a new trainer to go on).
    pub fn step(&mut self, tokens: &[u32], targets: &[u32]) -> Result<f32, RuntimeError> {
        let (t, c) = (self.tensor, self.context);
        let context = self.ranks[0].context;
        let expected = context.loss_scale_tokens as usize;
        if tokens.len() != expected || targets.len() != expected {
            return Err(TokenError::StepLength { expected, tokens: tokens.len(), targets: targets.len() }.into());
        }
        if let Some(bad) = tokens.iter().chain(targets).find(|&&t| u64::from(t) >= context.vocab) {
            return Err(TokenError::OutsideVocabulary { token: *bad, vocab: context.vocab }.into());
        }
        // Each context rank's rows, then each tensor-parallel rank's share of them.
        let seq_len = self.ranks[0].report.plan.provenance.model.seq_len as usize;
        let rows: Vec<(Vec<u32>, Vec<u32>)> =
            (0..c).map(|k| (context_rows(tokens, seq_len, k, c), context_rows(targets, seq_len, k, c))).collect();
        let r = expected / (c * t).max(1);
        // One gate for every rank: asked and reset once, before any rank runs.
        if let Some(control) = &self.ranks[0].control {
            if control.gate().stop_requested() {
                return Err(BackendError::Interrupted.into());
            }
            control.gate().begin_step();
        }
        let results = on_every_rank(&mut self.ranks, &self.groups, &self.ids, |g, trainer| {
            let ((tokens, targets), j) = (&rows[g / t], g % t);
            trainer.run_step(&tokens[j * r..(j + 1) * r], &targets[j * r..(j + 1) * r])
        });
        // Stopped before any rank began the update: every rank kept the previous step's state.
        if results.iter().any(is_interrupted) {
            if results.iter().any(Result::is_ok) {
                return Err(RuntimeError::RanksDiverged(
                    "a rank finished a step that another rank stopped before its update".into(),
                ));
            }
            return Err(BackendError::Interrupted.into());
        }
        let losses = first_error(results, &self.ids)?;
        if let Some((i, loss)) = losses.iter().enumerate().find(|(_, l)| l.to_bits() != losses[0].to_bits()) {
            return Err(RuntimeError::RanksDiverged(format!(
                "rank {}'s loss {loss} differs from rank {}'s {}",
                self.ids[i], self.ids[0], losses[0]
            )));
        }
        Ok(losses[0])
    }

    /// Lets `gate` stop the steps of every rank consistently (`crate::control`): one control per
    /// rank, in rank order.
    pub fn set_stop_gate(&mut self, gate: Arc<StopGate>) -> Vec<Arc<StepControl>> {
        self.ranks.iter_mut().map(|trainer| trainer.set_stop_gate(Arc::clone(&gate))).collect()
    }

    /// What the ranks' checked backends have verified so far, summed (`None` when they do not
    /// check).
    pub fn checks(&self) -> Option<CheckReport> {
        self.ranks.iter().map(Trainer::checks).try_fold(CheckReport::default(), |sum, checks| {
            checks.map(|c| CheckReport {
                instructions: sum.instructions + c.instructions,
                spans: sum.spans + c.spans,
                waits: sum.waits + c.waits,
            })
        })
    }

    /// Global rank `rank`'s trainer (its plan, its buffers, its backend), if this trainer runs it.
    pub fn rank(&mut self, rank: usize) -> Option<&mut Trainer<B>> {
        let at = self.ids.iter().position(|&id| id == rank)?;
        self.ranks.get_mut(at)
    }

    /// Every buffer of `kind` of every rank (`[rank][(role, layer), bytes]`, as
    /// [`Trainer::buffers_of_kind`]).
    pub fn buffers_of_kind(&mut self, kind: BufferKind) -> Result<Vec<Vec<NamedBytes>>, RuntimeError> {
        self.ranks.iter_mut().map(|trainer| trainer.buffers_of_kind(kind)).collect()
    }

    /// The `t = 1` tensors of every parameter-shaped buffer of `kind` (parameters, their
    /// gradients), reassembled from every rank's shard ([`Shard::reassemble`]; a replicated one
    /// is rank 0's). Buffers that have no `t = 1` counterpart shape (a gradient buffer only
    /// `t > 1` plans have) are left out.
    pub fn reassembled(&mut self, kind: BufferKind) -> Result<Vec<NamedBytes>, RuntimeError> {
        if !matches!(kind, BufferKind::Parameter | BufferKind::Gradient) {
            return Err(RuntimeError::Backend(crate::BackendError::Other(format!(
                "reassembled: {} buffers have no t = 1 layout of bf16 elements; ask for parameters or gradients",
                kind.name()
            ))));
        }
        self.every_rank_held("reassembling the t = 1 tensors")?;
        let mut per_rank = self.buffers_of_kind(kind)?;
        // Context rank 0's tensor-parallel ranks: every context rank holds the same model.
        per_rank.truncate(self.tensor);
        let plan = self.ranks[0].replay.plan().clone();
        let model = &plan.provenance.model;
        let layout = ShardLayout::of(model, self.tensor as u64);
        let mut out = Vec::new();
        for (i, ((role, layer), _)) in per_rank[0].iter().enumerate() {
            let Some(buffer) = plan.buffers.iter().find(|b| b.kind == kind && b.role == *role && b.layer == *layer)
            else {
                continue;
            };
            if matches!(role, TensorRole::ReplicatedGradients | TensorRole::ReplicatedBiasGradients) {
                let t = self.tensor as u64;
                out.extend(split_replicated_gradients(&per_rank[0][i].1, buffer, model, t));
                continue;
            }
            let shards: Vec<Vec<u8>> = per_rank.iter().map(|rank| rank[i].1.clone()).collect();
            if let Some(whole) = Shard::reassemble(*role, buffer, &layout, 2, &shards) {
                out.push(((*role, *layer), whole));
            }
        }
        out.sort_by_key(|entry: &NamedBytes| entry.0);
        Ok(out)
    }

    /// Checks that every replicated parameter (and its optimizer state) is bit-identical on every
    /// rank; the first that is not is a [`RuntimeError::RanksDiverged`].
    pub fn check_replicated(&mut self) -> Result<(), RuntimeError> {
        self.checkpoint(0, 0).map(|_| ())
    }

    /// Every rank's state as one checkpoint: each sharded tensor per tensor-parallel rank (tagged
    /// with it), each replicated one once, after checking that every rank holding a copy (the
    /// tensor-parallel ranks of a replicated tensor; the context ranks of any tensor) holds the
    /// same bits. With `c > 1` the checkpoint is the `c = 1` one of `t` ranks: the context ranks
    /// hold the same model.
    pub fn checkpoint(&mut self, fingerprint: u64, data_position: u64) -> Result<Checkpoint, RuntimeError> {
        let t = self.tensor as u64;
        let layout = ShardLayout::of(&self.ranks[0].report.plan.provenance.model, t);
        let step = self.ranks[0].step;
        let mut tensors = Vec::new();
        let per_rank = self.every_rank_state()?;
        for (g, rank_tensors) in per_rank.iter().enumerate() {
            let j = g as u64 % t;
            for tensor in rank_tensors {
                let whole = Shard::of(tensor.role, j, t, &layout).is_whole();
                // The ranks that must hold these bits: every rank for a whole tensor, else the
                // ranks with this tensor-parallel rank. The first of them saves it.
                let holders = || per_rank.iter().enumerate().filter(move |(h, _)| whole || *h as u64 % t == j);
                if holders().next().map(|(h, _)| h) != Some(g) {
                    continue;
                }
                for (other, theirs) in holders().skip(1) {
                    let same =
                        theirs.iter().find(|x| (x.kind, x.role, x.layer) == (tensor.kind, tensor.role, tensor.layer));
                    if same.map(|x| &x.bytes) != Some(&tensor.bytes) {
                        let what = match tensor.kind {
                            StateKind::Parameter => "parameter",
                            StateKind::OptimizerState => "optimizer state",
                        };
                        return Err(RuntimeError::RanksDiverged(format!(
                            "the {what} {} of layer {:?} differs between rank {g} and rank {other}",
                            tensor.role.name(),
                            tensor.layer
                        )));
                    }
                }
                let rank = if whole { None } else { Some(j as u32) };
                tensors.push(super::SavedTensor { rank, ..tensor.clone() });
            }
        }
        tensors.sort_by_key(|t| (t.kind, t.role, t.layer, t.rank));
        Ok(Checkpoint { fingerprint, step, data_position, ranks: t as u32, tensors })
    }

    /// Every rank's state tensors, in rank order: this trainer's own, and, when other ranks run
    /// elsewhere, theirs gathered through the group (a collective: every rank's process calls
    /// this at the same point). Each rank's tensors travel encoded as a checkpoint of their own;
    /// the sizes differ between ranks, so the lengths are gathered first and the bytes padded to
    /// the longest.
    fn every_rank_state(&mut self) -> Result<Vec<Vec<super::SavedTensor>>, RuntimeError> {
        let own: Vec<Vec<super::SavedTensor>> =
            self.ranks.iter_mut().map(Trainer::state_tensors).collect::<Result<_, _>>()?;
        if self.ids.len() == self.tensor * self.context {
            return Ok(own);
        }
        if self.context > 1 {
            self.every_rank_held("a checkpoint with context parallelism")?;
        }
        let ranks = self.tensor as u32;
        let encoded: Vec<Vec<u8>> = own
            .into_iter()
            .map(|tensors| Checkpoint { fingerprint: 0, step: 0, data_position: 0, ranks, tensors }.encode())
            .collect();
        let t = self.tensor;
        let (trainers, groups, ids) = (&mut self.ranks, &self.groups, &self.ids);
        let gathered = on_every_rank(trainers, groups, ids, |k, _| {
            let at = ids.iter().position(|&id| id == k).unwrap_or(0);
            let (group, mine) = (&groups[at].tensor, &encoded[at]);
            let failed = |e: crate::collective::CollectiveError| {
                RuntimeError::Backend(BackendError::Other(format!("gathering the checkpoint: {e}")))
            };
            let mut lengths = vec![0u8; 8 * t];
            group.all_gather(&(mine.len() as u64).to_le_bytes(), &mut lengths).map_err(failed)?;
            let lengths: Vec<usize> =
                lengths.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as usize).collect();
            let longest = lengths.iter().copied().max().unwrap_or(0);
            let mut padded = mine.clone();
            padded.resize(longest, 0);
            let mut all = vec![0u8; longest * t];
            group.all_gather(&padded, &mut all).map_err(failed)?;
            (0..t)
                .map(|j| {
                    let bytes = &all[j * longest..j * longest + lengths[j].min(longest)];
                    Checkpoint::decode(bytes).map(|c| c.tensors).map_err(|e| {
                        RuntimeError::Backend(BackendError::Other(format!("rank {j}'s state did not decode: {e}")))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        });
        let mut every = first_error(gathered, &self.ids)?;
        Ok(every.swap_remove(0))
    }

    /// Restores a checkpoint of as many ranks: each rank its own shards and the replicated
    /// tensors.
    pub fn restore(&mut self, checkpoint: &Checkpoint, fingerprint: u64) -> Result<(), RuntimeError> {
        if checkpoint.fingerprint != fingerprint {
            return Err(CheckpointMismatch::OtherModel.into());
        }
        let t = self.tensor as u64;
        if u64::from(checkpoint.ranks) != t {
            return Err(CheckpointMismatch::Ranks { saved: checkpoint.ranks, running: t }.into());
        }
        let mut used = vec![false; checkpoint.tensors.len()];
        for (&rank, trainer) in self.ids.iter().zip(self.ranks.iter_mut()) {
            let indices = trainer
                .restore_tensors(checkpoint)
                .map_err(|e| RuntimeError::Rank { rank: rank as u64, error: Box::new(e) })?;
            indices.into_iter().for_each(|i| used[i] = true);
        }
        // Shards of tensor-parallel ranks that run elsewhere are theirs to restore.
        let held = |j: u32| self.ids.iter().any(|&g| (g % self.tensor) as u32 == j);
        let elsewhere = |i: usize| checkpoint.tensors[i].rank.is_some_and(|j| !held(j));
        if used.iter().enumerate().any(|(i, u)| !u && !elsewhere(i)) {
            return Err(CheckpointMismatch::Extra.into());
        }
        Ok(())
    }

    /// Steps taken.
    pub fn steps_taken(&self) -> u64 {
        self.ranks[0].step
    }

    /// What each rank's backend holds (they are equal: the same plan).
    pub fn memory(&self) -> MemoryReport {
        self.ranks[0].memory()
    }

    /// Rank 0's setup times (every rank set up at once, on its own thread).
    pub fn setup_times(&self) -> SetupTimes {
        self.ranks[0].setup
    }

    /// The plan every rank replays, and its report.
    pub fn report(&self) -> &memo_plan_core::planner::PlanReport {
        &self.ranks[0].report
    }
}
