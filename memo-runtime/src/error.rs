//! [`RuntimeError`]: why replaying a plan or training failed, one typed variant per cause, so
//! that a caller (the `memo` command line) can decide what each means (its exit code) without
//! reading messages. Every variant's text says what went wrong and, where there is one, the fix.

use std::fmt;

use memo_plan_core::check::PlanViolation;
use memo_plan_core::plan::{Buffer, TensorRole};
use memo_plan_core::planner::PlanError;

use crate::backend::BackendError;

/// Why a plan cannot be replayed or a model trained.
#[derive(Debug)]
pub enum RuntimeError {
    /// The plan violates the rules (`spec/validity.md`): what
    /// [`memo_plan_core::check::CheckedPlan::check`] found.
    Invalid(Vec<PlanViolation>),
    /// A buffer's bytes do not fit in 64 bits.
    BufferTooLarge {
        /// Its index.
        buffer: usize,
    },
    /// The backend failed.
    Backend(BackendError),
    /// The planner could not plan the training step.
    Planning(PlanError),
    /// The plan lacks something the trainer needs of it.
    Plan(PlanMismatch),
    /// Tokens handed to a step or to the logits that the model does not take.
    Tokens(TokenError),
    /// A checkpoint that does not match the model being trained.
    Checkpoint(CheckpointMismatch),
    /// The recall task could not make an evaluation sequence (its own message).
    Recall(String),
    /// The thread drawing the initial parameters stopped before it drew them all.
    InitialisationStopped,
    /// Rank `rank` of a tensor-parallel group failed (the other ranks' errors follow from it or
    /// are the same).
    Rank {
        /// The rank.
        rank: u64,
        /// Its error.
        error: Box<RuntimeError>,
    },
    /// The ranks of a tensor-parallel group disagree where they must hold the same bits (the
    /// loss, a replicated parameter): a bug in the plan or a backend.
    RanksDiverged(String),
    /// The model has something the kernels do not compute (Llama 3.1's rope rescaling): it can
    /// be planned, not trained.
    ModelNotTrainable(String),
}

/// What the trainer needs of a plan and did not find.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanMismatch {
    /// No model-wide buffer of this role (tokens, targets, loss).
    NoBuffer(TensorRole),
    /// A parameter without its optimizer state.
    NoOptimizerState(Buffer),
    /// A classifier launch without its input or logits argument.
    ClassifierWithoutArguments {
        /// The launch's instruction.
        instruction: usize,
    },
    /// A classifier that does not map rows of the final norm's output to rows of logits.
    ClassifierNotSingleGpu {
        /// The launch's instruction.
        instruction: usize,
        /// The vocabulary a logits row should hold.
        vocab: u64,
    },
    /// A classifier writing logits rows past the step's token rows.
    ClassifierRowsOutside {
        /// The launch's instruction.
        instruction: usize,
        /// First row written.
        start: usize,
        /// One past the last row written.
        end: usize,
        /// The step's token rows.
        rows: usize,
    },
    /// A token row no classifier launch covers.
    UncoveredTokenRow {
        /// The row.
        row: usize,
    },
    /// Fewer logits than a row needs.
    LogitsTooShort {
        /// Logits held.
        values: usize,
        /// The row.
        row: usize,
    },
}

/// Tokens the model does not take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenError {
    /// A step's tokens or targets are not `micro_batch * seq_len` each.
    StepLength {
        /// Tokens (and targets) a step takes.
        expected: usize,
        /// Tokens given.
        tokens: usize,
        /// Targets given.
        targets: usize,
    },
    /// The logits' tokens are not `micro_batch * seq_len`.
    LogitsLength {
        /// Tokens the logits take.
        expected: usize,
        /// Tokens given.
        tokens: usize,
    },
    /// A token at or past the vocabulary's size.
    OutsideVocabulary {
        /// The token.
        token: u32,
        /// The vocabulary's size.
        vocab: u64,
    },
}

/// How a checkpoint differs from the model it is restored into.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckpointMismatch {
    /// Saved for another model, sequence length, micro-batch or seed (its fingerprint differs).
    OtherModel,
    /// It lacks this buffer's tensor.
    Missing(Buffer),
    /// Its tensor of this buffer has another size.
    Size {
        /// The buffer.
        buffer: Buffer,
        /// Bytes saved.
        saved: usize,
        /// Bytes the model needs.
        needed: u64,
    },
    /// It holds tensors this model does not have.
    Extra,
    /// Saved from another number of tensor-parallel ranks.
    Ranks {
        /// Ranks it holds.
        saved: u32,
        /// Ranks of this run.
        running: u64,
    },
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Invalid(violations) => {
                write!(f, "the plan violates {} rule(s); first: ", violations.len())?;
                match violations.first() {
                    Some(v) => v.fmt(f),
                    None => Ok(()),
                }
            }
            RuntimeError::BufferTooLarge { buffer } => write!(f, "buffer #{buffer} is larger than 2^64 bytes"),
            RuntimeError::Backend(error) => error.fmt(f),
            RuntimeError::Planning(error) => write!(f, "planning failed: {error}"),
            RuntimeError::Plan(mismatch) => mismatch.fmt(f),
            RuntimeError::Tokens(error) => error.fmt(f),
            RuntimeError::Checkpoint(mismatch) => mismatch.fmt(f),
            RuntimeError::Recall(message) => f.write_str(message),
            RuntimeError::InitialisationStopped => f.write_str("the thread drawing the initial parameters stopped"),
            RuntimeError::Rank { rank, error } => write!(f, "rank {rank}: {error}"),
            RuntimeError::RanksDiverged(what) => {
                write!(f, "the tensor-parallel ranks diverged: {what} (a bug: please report it with the command)")
            }
            RuntimeError::ModelNotTrainable(what) => write!(f, "the model cannot be trained yet: {what}"),
        }
    }
}

impl fmt::Display for PlanMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanMismatch::NoBuffer(role) => write!(f, "the plan has no {} buffer", role.name()),
            PlanMismatch::NoOptimizerState(buffer) => write!(f, "no optimizer state for {buffer}"),
            PlanMismatch::ClassifierWithoutArguments { instruction } => {
                write!(f, "instruction {instruction}: a classifier without its arguments")
            }
            PlanMismatch::ClassifierNotSingleGpu { instruction, vocab } => write!(
                f,
                "instruction {instruction}: the classifier does not map rows of the final norm's output to rows of \
                 {vocab} logits (a tensor-parallel plan?): reading logits needs a single-GPU plan"
            ),
            PlanMismatch::ClassifierRowsOutside { instruction, start, end, rows } => write!(
                f,
                "instruction {instruction}: the classifier writes rows {start}..{end} outside the {rows} token rows"
            ),
            PlanMismatch::UncoveredTokenRow { row } => {
                write!(f, "no classifier launch of the plan covers token row {row}")
            }
            PlanMismatch::LogitsTooShort { values, row } => {
                write!(f, "the logits hold {values} values, fewer than row {row} needs")
            }
        }
    }
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::StepLength { expected, tokens, targets } => {
                write!(f, "a step takes {expected} tokens and {expected} targets, got {tokens} and {targets}")
            }
            TokenError::LogitsLength { expected, tokens } => {
                write!(f, "the logits of a step take {expected} tokens (micro-batch x sequence), got {tokens}")
            }
            TokenError::OutsideVocabulary { token, vocab } => {
                write!(f, "token {token} is outside the vocabulary of {vocab}")
            }
        }
    }
}

impl fmt::Display for CheckpointMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointMismatch::OtherModel => f.write_str(
                "the checkpoint belongs to another model, sequence length, micro-batch or seed: resume with the same \
                 settings, or start a new --checkpoint directory",
            ),
            CheckpointMismatch::Missing(buffer) => write!(f, "the checkpoint has no {buffer}"),
            CheckpointMismatch::Size { buffer, saved, needed } => {
                write!(f, "the checkpoint's {buffer} has {saved} bytes, the model needs {needed}")
            }
            CheckpointMismatch::Extra => f.write_str("the checkpoint holds tensors this model does not have"),
            CheckpointMismatch::Ranks { saved, running } => write!(
                f,
                "the checkpoint holds the shards of {saved} tensor-parallel rank(s), this run has {running}: resume \
                 with --tensor-parallel {saved}, or start a new --checkpoint directory"
            ),
        }
    }
}

impl std::error::Error for RuntimeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuntimeError::Backend(error) => Some(error),
            RuntimeError::Planning(error) => Some(error),
            _ => None,
        }
    }
}

impl From<BackendError> for RuntimeError {
    fn from(error: BackendError) -> Self {
        RuntimeError::Backend(error)
    }
}

impl From<PlanError> for RuntimeError {
    fn from(error: PlanError) -> Self {
        RuntimeError::Planning(error)
    }
}

impl From<PlanMismatch> for RuntimeError {
    fn from(mismatch: PlanMismatch) -> Self {
        RuntimeError::Plan(mismatch)
    }
}

impl From<TokenError> for RuntimeError {
    fn from(error: TokenError) -> Self {
        RuntimeError::Tokens(error)
    }
}

impl From<CheckpointMismatch> for RuntimeError {
    fn from(mismatch: CheckpointMismatch) -> Self {
        RuntimeError::Checkpoint(mismatch)
    }
}
