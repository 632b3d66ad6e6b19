//! Progress of a long `memo plan` on standard error: lines `memo plan: 3.2 s: ...` once the
//! command has run [`crate::progress::DEFAULT_AFTER`] (2 s), at most one a second, on each change of what it does
//! (strategy, probed length, stage) and every [`HEARTBEAT`] while one stage goes on. Short runs
//! print nothing, so their output is unchanged. `MEMO_PROGRESS_AFTER_MS=0` reports every change
//! from the start (what the tests use: they bound work, never time).
//!
//! The planner tells an observer each stage it enters ([`planner::Progress`]); the command sets
//! what it is doing around that (which strategy, the check, the remedies' search). A thread
//! repeats the current line while a single stage runs long, and is joined when the reporter is
//! dropped, before the command prints its result or its one failure line.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memo_plan_core::planner::{self, Stage};

/// At most one line per this interval.
const LEAST_INTERVAL: Duration = Duration::from_secs(1);

/// The same line again after this long in one stage.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How often the thread looks.
const TICK: Duration = Duration::from_millis(200);

struct State {
    started: Instant,
    after: Duration,
    /// What the command does: `strategy memo (1 of 4)`.
    context: String,
    /// Inside the context: the planner's probe and stage, or the check.
    detail: String,
    last_line: Option<Instant>,
    changed: bool,
    done: bool,
}

impl State {
    /// Prints the current line if the run is past the threshold, the last line is a second old,
    /// and something changed (or the heartbeat is due).
    fn maybe_print(&mut self, now: Instant) {
        let elapsed = now.duration_since(self.started);
        if elapsed < self.after || self.context.is_empty() {
            return;
        }
        let due = match self.last_line {
            None => true,
            Some(last) => {
                let since = now.duration_since(last);
                // A threshold under a second (0 in tests) shortens the interval with it.
                since >= LEAST_INTERVAL.min(self.after) && (self.changed || since >= HEARTBEAT)
            }
        };
        if !due {
            return;
        }
        let detail = if self.detail.is_empty() { String::new() } else { format!(": {}", self.detail) };
        eprintln!("memo plan: {:.1} s: {}{detail}", elapsed.as_secs_f64(), self.context);
        self.last_line = Some(now);
        self.changed = false;
    }
}

/// The progress reporter of one `memo plan` run.
pub struct Reporter {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

fn lock(shared: &(Mutex<State>, Condvar)) -> MutexGuard<'_, State> {
    // A panic elsewhere cannot leave the state half-written in a way that matters here.
    shared.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Reporter {
    /// Starts the clock (and the thread that repeats a long stage's line); lines are printed once
    /// the command has run `after` ([`crate::progress::after`]).
    pub fn start(after: Duration) -> Self {
        let state = State {
            started: Instant::now(),
            after,
            context: String::new(),
            detail: String::new(),
            last_line: None,
            changed: false,
            done: false,
        };
        let shared = Arc::new((Mutex::new(state), Condvar::new()));
        let inner = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("memo-plan-progress".into())
            .spawn(move || {
                let mut state = lock(&inner);
                while !state.done {
                    state.maybe_print(Instant::now());
                    state = match inner.1.wait_timeout(state, TICK) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    };
                }
            })
            // Without the thread, lines still come at each change of stage.
            .ok();
        Reporter { shared, thread }
    }

    /// What the command does now (a new strategy, the check, the remedies).
    pub fn context(&self, context: impl Into<String>) {
        let mut state = lock(&self.shared);
        state.context = context.into();
        state.detail.clear();
        state.changed = true;
        state.maybe_print(Instant::now());
    }

    /// The step inside the context.
    pub fn detail(&self, detail: impl Into<String>) {
        let mut state = lock(&self.shared);
        state.detail = detail.into();
        state.changed = true;
        state.maybe_print(Instant::now());
    }

    /// An observer for the planner: each probe and stage becomes the detail.
    pub fn observer(&self) -> impl FnMut(planner::Progress) + '_ {
        let mut probe: Option<(u32, u64)> = None;
        move |progress| match progress {
            planner::Progress::Probe { seq_len, probe: n, .. } => {
                probe = Some((n, seq_len));
                self.detail(format!("probe {n} at {seq_len} tokens"));
            }
            planner::Progress::Stage { seq_len, stage, instructions, buffers, .. } => {
                let at = match probe {
                    Some((n, _)) => format!("probe {n} at {seq_len} tokens, "),
                    None => String::new(),
                };
                let sizes = match stage {
                    Stage::Placement | Stage::Simulate => {
                        format!(" ({instructions} instructions, {buffers} buffers)")
                    }
                    Stage::Alpha | Stage::Schedule => String::new(),
                };
                self.detail(format!("{at}{}{sizes}", stage.name()));
            }
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        lock(&self.shared).done = true;
        self.shared.1.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
