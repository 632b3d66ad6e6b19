//! Watching a step run and stopping it early (`memo train`'s progress lines and Ctrl-C).
//!
//! A [`StopGate`] is shared by every rank of a run and by whoever asks to stop (a Ctrl-C
//! handler). A step's state is consistent at two points only: before the first instruction that
//! writes the parameters or the optimizer state (the previous step's state is intact; the step's
//! tokens, activations and gradients are all rewritten by the next step) and after the last. So a
//! stop asked for before any rank has begun the update ends the step at the next instruction
//! boundary, on every rank, with the update not begun; one asked for once the update has begun
//! lets the step finish. [`StopGate::try_commit`] decides which, atomically, for every rank.
//!
//! A [`StepControl`] is one rank's view of the current step: the gate, which of its program's
//! instructions write the persistent state (the commits), and counters of what its streams have
//! run, for progress reports. A backend that honours it ([`crate::Backend::control`]) asks the
//! gate before each instruction; one that does not runs each step to its end (then the trainer
//! stops between steps).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Whether a run should stop, shared by the ranks and the thread that asks (see the module).
#[derive(Debug, Default)]
pub struct StopGate {
    /// A stop was asked for (never cleared: a run stops once).
    requested: AtomicBool,
    /// The current step's update has begun (on some rank): it runs to its end.
    state: Mutex<GateState>,
}

#[derive(Debug, Default, Clone, Copy)]
struct GateState {
    committed: bool,
}

impl StopGate {
    /// A gate with no stop asked for.
    pub fn new() -> Arc<Self> {
        Arc::new(StopGate::default())
    }

    /// Asks the run to stop. Returns `true` when the current step will stop before its update
    /// (or no step is running), `false` when its update has begun and it finishes first.
    pub fn request_stop(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.requested.store(true, Ordering::SeqCst);
        !state.committed
    }

    /// Whether a stop was asked for.
    pub fn stop_requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Whether the step should stop at this instruction boundary: a stop was asked for and the
    /// update has not begun.
    pub fn stopping(&self) -> bool {
        self.stop_requested() && !self.state.lock().unwrap_or_else(|p| p.into_inner()).committed
    }

    /// Called before an instruction that writes the parameters or the optimizer state: `true`
    /// (run it; from now on the step runs to its end) unless a stop was asked for before any rank
    /// began the update (`false`: skip it and stop the step).
    pub fn try_commit(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.committed {
            return true;
        }
        if self.requested.load(Ordering::SeqCst) {
            return false;
        }
        state.committed = true;
        true
    }

    /// Whether the current step's update has begun.
    pub fn committed(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).committed
    }

    /// A new step begins (called once per step, before any rank runs it).
    pub fn begin_step(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).committed = false;
    }
}

/// One rank's view of the running step: the shared gate, its commit instructions, and what its
/// streams have run (see the module).
#[derive(Debug)]
pub struct StepControl {
    gate: Arc<StopGate>,
    /// Per instruction of the rank's program: whether it writes the parameters or the optimizer
    /// state.
    commits: Vec<bool>,
    /// Instructions of the current step finished, on every stream.
    finished: AtomicU64,
    /// 1 + the index of the instruction the compute stream began last (0: none this step).
    compute_at: AtomicUsize,
    /// Whether the backend honours the control (set by the trainer once the backend says so).
    honoured: AtomicBool,
}

impl StepControl {
    /// The control of a program of `commits.len()` instructions, `commits[i]` true where
    /// instruction `i` writes the persistent state.
    pub fn new(gate: Arc<StopGate>, commits: Vec<bool>) -> Arc<Self> {
        Arc::new(StepControl {
            gate,
            commits,
            finished: AtomicU64::new(0),
            compute_at: AtomicUsize::new(0),
            honoured: AtomicBool::new(false),
        })
    }

    /// The gate.
    pub fn gate(&self) -> &Arc<StopGate> {
        &self.gate
    }

    /// A backend, before running plan instruction `instruction`: whether to run it (`false`:
    /// the step is stopping; fail it with [`crate::BackendError::Interrupted`]).
    pub fn may_run(&self, instruction: usize) -> bool {
        if self.commits.get(instruction).copied().unwrap_or(false) {
            self.gate.try_commit()
        } else {
            !self.gate.stopping()
        }
    }

    /// A backend: the compute stream begins plan instruction `instruction`.
    pub fn compute_began(&self, instruction: usize) {
        self.compute_at.store(instruction.saturating_add(1), Ordering::Relaxed);
    }

    /// A backend: a stream finished one of the step's instructions.
    pub fn finished_one(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
    }

    /// Instructions of the current step finished so far, on every stream.
    pub fn finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }

    /// The instruction the compute stream began last this step, if any.
    pub fn compute_instruction(&self) -> Option<usize> {
        self.compute_at.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Instructions in the program.
    pub fn instructions(&self) -> usize {
        self.commits.len()
    }

    /// Whether the backend reports what it runs and stops at instruction boundaries.
    pub fn honoured(&self) -> bool {
        self.honoured.load(Ordering::Relaxed)
    }

    pub(crate) fn set_honoured(&self, honoured: bool) {
        self.honoured.store(honoured, Ordering::Relaxed);
    }

    /// Resets the counters for a new step (the gate is reset once per step by the trainer).
    pub(crate) fn begin_step(&self) {
        self.finished.store(0, Ordering::Relaxed);
        self.compute_at.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_before_the_update_stops_every_rank_and_one_after_it_lets_the_step_finish() {
        let gate = StopGate::new();
        let rank = |commits: Vec<bool>| StepControl::new(Arc::clone(&gate), commits);
        let (zero, one) = (rank(vec![false, true, true]), rank(vec![false, false, true]));
        gate.begin_step();
        assert!(zero.may_run(0) && one.may_run(0));
        assert!(gate.request_stop(), "no update begun: the step stops");
        assert!(!zero.may_run(1) && !one.may_run(1) && !one.may_run(2), "every rank stops, none commits");
        assert!(!gate.committed());

        let gate = StopGate::new();
        let (zero, one) = (
            StepControl::new(Arc::clone(&gate), vec![true, false]),
            StepControl::new(Arc::clone(&gate), vec![false, true]),
        );
        gate.begin_step();
        assert!(zero.may_run(0), "the update begins");
        assert!(!gate.request_stop(), "the update has begun: the step finishes");
        assert!(zero.may_run(1) && one.may_run(0) && one.may_run(1), "every rank finishes the step");
        assert!(gate.stop_requested());
        gate.begin_step();
        assert!(!one.may_run(0) && !one.may_run(1), "the next step does not run");
    }
}
