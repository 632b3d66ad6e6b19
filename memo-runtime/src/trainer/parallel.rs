//! [`ParallelTrainer`]: `t` ranks of a tensor-parallel group, each a [`Trainer`] replaying the
//! same checked plan on its own backend (its own arena), joined by a group of [`Collectives`].
//! Each step runs every rank on a thread of its own; rank `k` trains on rows `[k*r, (k+1)*r)`
//! of the step's tokens and targets (`r = R / t`, `spec/tensor-parallel.md` §1), and every rank
//! computes the same loss (checked bit for bit; rank 0's is returned).
//!
//! A trainer may hold only some ranks of the group (one, in a process of its own, its peers in
//! other processes joined by a group such as `memo-mpi`'s): each held rank is given with its
//! group handle, whose `rank()` says which rank it is. It steps only its ranks (on their rows),
//! and checks only its own ranks' losses against each other: that every rank of the group
//! computes the same loss rests on the plan (`spec/tensor-parallel.md` §4: every rank computes
//! the loss of every gathered row from all-reduced figures, so with the same bits). A checkpoint gathers the other ranks' state through the
//! group (every process gets the same checkpoint; the caller writes it from rank 0 only); a
//! restore restores the held ranks' tensors. Reassembling `t = 1` tensors still needs every rank
//! in the trainer and says so.

use std::sync::Arc;

use memo_plan_core::check::CheckedPlan;
use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::{Buffer, BufferKind, TensorRole};
use memo_plan_core::schedule::{replicated_gradient_rows, ReplicatedPool};

use super::{NamedBytes, PlannedStep, SetupTimes, Shard, ShardLayout, Trainer};
use crate::backend::{Backend, BackendError, CheckReport, MemoryReport};
use crate::checkpoint::{Checkpoint, StateKind};
use crate::collective::Collectives;
use crate::control::{StepControl, StopGate};
use crate::error::{CheckpointMismatch, RuntimeError, TokenError};

/// A model trained with tensor and sequence parallelism over `t` ranks in this process.
pub struct ParallelTrainer<B: Backend + Send> {
    /// The held ranks, in increasing rank order.
    ranks: Vec<Trainer<B>>,
    groups: Vec<Arc<dyn Collectives>>,
    /// The rank in the group of each held trainer.
    ids: Vec<usize>,
    /// The group's size `t`.
    tensor: usize,
}

/// Runs `f(rank, trainer)` on one thread per rank; a rank that fails aborts the group, so no
/// other rank waits for it. The results in rank order.
fn on_every_rank<B, R, F>(
    ranks: &mut [Trainer<B>],
    groups: &[Arc<dyn Collectives>],
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
    /// Checks the planned step's plan once and starts one rank per backend: each backend is
    /// built as a member of its group handle, whose `rank()` says which rank it is (every rank of
    /// the group, or some of them when the others run elsewhere); each allocates the plan and
    /// initialises its shard of the model (on its own thread).
    pub fn with_plan(planned: PlannedStep, mut ranks: Vec<(B, Arc<dyn Collectives>)>) -> Result<Self, RuntimeError> {
        let tensor = planned.tensor().max(1);
        let checking = std::time::Instant::now();
        let refuse = |message: String| Err(RuntimeError::Backend(crate::BackendError::Other(message)));
        if ranks.is_empty() || ranks.len() as u64 > tensor {
            return refuse(format!(
                "the step is planned for {tensor} tensor-parallel rank(s) but {} backend(s) were given: give one per \
                 rank this process runs (1 to {tensor})",
                ranks.len()
            ));
        }
        if let Some((_, group)) = ranks.iter().find(|(_, g)| g.ranks() as u64 != tensor || g.rank() as u64 >= tensor) {
            return refuse(format!(
                "a backend is rank {} of a group of {}: the step is planned for a group of {tensor}",
                group.rank(),
                group.ranks()
            ));
        }
        ranks.sort_by_key(|(_, g)| g.rank());
        if let Some(pair) = ranks.windows(2).find(|pair| pair[0].1.rank() == pair[1].1.rank()) {
            return refuse(format!("two backends are rank {} of the group: give each rank once", pair[0].1.rank()));
        }
        let ids: Vec<usize> = ranks.iter().map(|(_, g)| g.rank()).collect();
        let checked = CheckedPlan::check(planned.report.plan.clone()).map_err(RuntimeError::Invalid)?;
        let groups: Vec<Arc<dyn Collectives>> = ranks.iter().map(|(_, g)| Arc::clone(g)).collect();
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
        Ok(ParallelTrainer { ranks, groups, ids, tensor: tensor as usize })
    }

    /// The group's size `t`.
    pub fn tensor(&self) -> usize {
        self.tensor
    }

    /// The ranks this trainer runs, in increasing order (`0..t` when it holds every rank).
    pub fn held_ranks(&self) -> &[usize] {
        &self.ids
    }

    /// Refuses `what` unless this trainer holds every rank of the group.
    fn every_rank_held(&self, what: &str) -> Result<(), RuntimeError> {
        if self.ids.len() == self.tensor {
            return Ok(());
        }
        Err(RuntimeError::Backend(crate::BackendError::Other(format!(
            "{what} needs every rank's state, and this trainer runs rank(s) {:?} of {}: gathering state across \
             processes is not implemented yet; run the ranks as threads of one process",
            self.ids, self.tensor
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
        let t = self.tensor;
        let context = self.ranks[0].context;
        let expected = context.loss_scale_tokens as usize;
        if tokens.len() != expected || targets.len() != expected {
            return Err(TokenError::StepLength { expected, tokens: tokens.len(), targets: targets.len() }.into());
        }
        if let Some(bad) = tokens.iter().chain(targets).find(|&&t| u64::from(t) >= context.vocab) {
            return Err(TokenError::OutsideVocabulary { token: *bad, vocab: context.vocab }.into());
        }
        let r = expected / t.max(1);
        // One gate for every rank: asked and reset once, before any rank runs.
        if let Some(control) = &self.ranks[0].control {
            if control.gate().stop_requested() {
                return Err(BackendError::Interrupted.into());
            }
            control.gate().begin_step();
        }
        let results = on_every_rank(&mut self.ranks, &self.groups, &self.ids, |k, trainer| {
            trainer.run_step(&tokens[k * r..(k + 1) * r], &targets[k * r..(k + 1) * r])
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

    /// Rank `rank`'s trainer (its plan, its buffers, its backend), if this trainer runs it.
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
        let per_rank = self.buffers_of_kind(kind)?;
        let plan = self.ranks[0].replay.plan().clone();
        let model = &plan.provenance.model;
        let layout = ShardLayout::of(model, self.ranks.len() as u64);
        let mut out = Vec::new();
        for (i, ((role, layer), _)) in per_rank[0].iter().enumerate() {
            let Some(buffer) = plan.buffers.iter().find(|b| b.kind == kind && b.role == *role && b.layer == *layer)
            else {
                continue;
            };
            if matches!(role, TensorRole::ReplicatedGradients | TensorRole::ReplicatedBiasGradients) {
                let t = self.ranks.len() as u64;
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

    /// Every rank's state as one checkpoint: each sharded tensor per rank (tagged with it), each
    /// replicated one once, after checking it is bit-identical on every rank.
    pub fn checkpoint(&mut self, fingerprint: u64, data_position: u64) -> Result<Checkpoint, RuntimeError> {
        let t = self.tensor as u64;
        let layout = ShardLayout::of(&self.ranks[0].report.plan.provenance.model, t);
        let step = self.ranks[0].step;
        let mut tensors = Vec::new();
        let per_rank = self.every_rank_state()?;
        for (rank, rank_tensors) in per_rank.iter().enumerate() {
            for tensor in rank_tensors {
                if !Shard::of(tensor.role, rank as u64, t, &layout).is_whole() {
                    tensors.push(super::SavedTensor { rank: Some(rank as u32), ..tensor.clone() });
                } else if rank == 0 {
                    for (other, theirs) in per_rank.iter().enumerate().skip(1) {
                        let same = theirs
                            .iter()
                            .find(|x| (x.kind, x.role, x.layer) == (tensor.kind, tensor.role, tensor.layer));
                        if same.map(|x| &x.bytes) != Some(&tensor.bytes) {
                            let what = match tensor.kind {
                                StateKind::Parameter => "parameter",
                                StateKind::OptimizerState => "optimizer state",
                            };
                            return Err(RuntimeError::RanksDiverged(format!(
                                "the replicated {what} {} of layer {:?} differs between rank 0 and rank {other}",
                                tensor.role.name(),
                                tensor.layer
                            )));
                        }
                    }
                    tensors.push(tensor.clone());
                }
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
        if self.ids.len() == self.tensor {
            return Ok(own);
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
            let (group, mine) = (&groups[at], &encoded[at]);
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
        // Shards of ranks that run elsewhere are theirs to restore.
        let elsewhere = |i: usize| checkpoint.tensors[i].rank.is_some_and(|r| !self.ids.contains(&(r as usize)));
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
