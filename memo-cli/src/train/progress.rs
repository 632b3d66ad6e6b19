//! What `memo train` says while it runs and when it is stopped: progress lines on standard error
//! for a step that runs past `MEMO_PROGRESS_AFTER_MS` (`crate::progress`, default 2 s), and Ctrl-C: the first stops
//! the run at a consistent state (`memo_runtime::control`) and saves it, a second exits at once.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memo_plan_core::plan::{Action, Instruction, Op};
use memo_runtime::{StepControl, StopGate};

use super::TrainArgs;
use crate::exit::{self, Failure};

/// Then once every this long while it runs.
const INTERVAL: Duration = Duration::from_secs(10);

/// Installs the Ctrl-C handler of `memo train` and returns the gate it asks to stop: the first
/// Ctrl-C asks the run to stop at a consistent state, a second (the first not acted on yet) exits
/// at once with 130, as a plain interrupt would. If the handler cannot be installed, Ctrl-C keeps
/// its default.
pub(super) fn interrupt_gate() -> Arc<StopGate> {
    let gate = StopGate::new();
    let asked = Arc::clone(&gate);
    let seen = AtomicBool::new(false);
    let _ = ctrlc::set_handler(move || {
        if seen.swap(true, Ordering::SeqCst) {
            std::process::exit(i32::from(exit::INTERRUPTED));
        }
        asked.request_stop();
    });
    gate
}

/// Where each instruction of a program is, for progress lines: its layer (1-based) and phase.
struct Places {
    /// Per instruction: its layer, its phase, and the op of the launch it is or follows.
    places: Vec<(Option<u32>, &'static str, &'static str)>,
    layers: u32,
}

impl Places {
    /// Phases by position: the forward until the first backward launch, the backward until the
    /// first AdamW launch, then the optimizer. A copy, record or wait is where the last launch was.
    fn of(program: &[Instruction], layers: u32) -> Self {
        let mut phase = "forward";
        let mut layer = None;
        let mut op = "";
        let places = program
            .iter()
            .map(|instruction| {
                if let Action::Launch(launch) = &instruction.action {
                    if launch.op == Op::AdamW {
                        phase = "optimizer";
                    } else if phase == "forward" && launch.op.name().contains("backward") {
                        phase = "backward";
                    }
                    layer = launch.layer.map(|l| l.saturating_add(1));
                    op = launch.op.name();
                }
                (layer, phase, op)
            })
            .collect();
        Places { places, layers }
    }

    fn describe(&self, instruction: usize) -> String {
        match self.places.get(instruction) {
            Some((Some(layer), phase, op)) => format!("layer {layer} of {}, {phase}: {op}", self.layers),
            Some((None, phase, op)) => format!("{phase}: {op}"),
            None => "starting".to_string(),
        }
    }
}

/// `12,345`.
pub(super) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `41 s`, `12 min 5 s`.
fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s} s")
    } else if s < 3600 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{} h {} min", s / 3600, (s % 3600) / 60)
    }
}

struct Running {
    step: u64,
    started: Instant,
    /// When the next line is due.
    due: Instant,
}

#[derive(Default)]
struct WatchState {
    running: Option<Running>,
    quit: bool,
}

/// What the reporting thread reads.
struct Shared {
    state: Mutex<WatchState>,
    changed: Condvar,
}

/// Reports a running step's progress on standard error once it has run [`after`], then every
/// 10 s, from a thread of its own. A step that ends when a line is due waits for that line, so
/// every step that runs past the threshold reports at least once (with the threshold at 0,
/// every step: what the tests force).
pub(super) struct Progress {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    after: Duration,
}

impl Progress {
    /// Starts the reporting thread for steps of `program` (rank 0's) on a model of `layers`
    /// layers, counted by `control` (`None`, or one its backend does not honour: the line says
    /// how long the step has run only). `interactive`: overwrite one line of a terminal.
    pub(super) fn start(
        after: Duration,
        program: &[Instruction],
        layers: u32,
        control: Option<Arc<StepControl>>,
        backend: String,
        interactive: bool,
    ) -> Self {
        let shared = Arc::new(Shared { state: Mutex::new(WatchState::default()), changed: Condvar::new() });
        let places = Places::of(program, layers);
        let total = program.len() as u64;
        let reporter = Arc::clone(&shared);
        let line = move |step: u64, running_for: Duration| {
            let what = match control.as_ref().filter(|c| c.honoured()) {
                Some(control) => format!(
                    "{}/{} instructions ({})",
                    thousands(control.finished().min(total)),
                    thousands(total),
                    control.compute_instruction().map_or_else(|| "starting".to_string(), |i| places.describe(i))
                ),
                None => format!("running (the {backend} backend does not report inside a step)"),
            };
            let stopping = match &control {
                Some(control) if control.gate().stop_requested() => {
                    if control.honoured() && !control.gate().committed() {
                        "; Ctrl-C: stopping after this instruction (again: exit at once, saving nothing)"
                    } else {
                        "; Ctrl-C: stopping after this step (again: exit at once, saving nothing)"
                    }
                }
                _ => "",
            };
            format!("memo train: step {step}: {what}, {}{stopping}", elapsed(running_for))
        };
        let thread = std::thread::Builder::new()
            .name("memo-progress".into())
            .spawn(move || {
                let mut state = reporter.state.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if state.quit {
                        return;
                    }
                    let now = Instant::now();
                    let wait = match state.running.as_mut() {
                        None => None,
                        Some(running) if now >= running.due => {
                            let text = line(running.step, now - running.started);
                            // A failing stderr has nowhere to be reported.
                            let mut stderr = std::io::stderr().lock();
                            let _ =
                                if interactive { write!(stderr, "\r{text}\x1b[K") } else { writeln!(stderr, "{text}") };
                            running.due = now + INTERVAL;
                            reporter.changed.notify_all();
                            continue;
                        }
                        Some(running) => Some(running.due - now),
                    };
                    state = match wait {
                        None => reporter.changed.wait(state).unwrap_or_else(|p| p.into_inner()),
                        Some(wait) => reporter.changed.wait_timeout(state, wait).unwrap_or_else(|p| p.into_inner()).0,
                    };
                }
            })
            .ok();
        if thread.is_none() {
            // No reporting thread: no step may wait for a line.
            shared.state.lock().unwrap_or_else(|p| p.into_inner()).quit = true;
        }
        Progress { shared, thread, after }
    }

    /// Step `step` begins.
    pub(super) fn begin(&self, step: u64) {
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        state.running = Some(Running { step, started, due: started + self.after });
        self.shared.changed.notify_all();
    }

    /// The step ends; a line that is due is printed first.
    pub(super) fn end(&self) {
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        while !state.quit && state.running.as_ref().is_some_and(|r| Instant::now() >= r.due) {
            self.shared.changed.notify_all();
            state = self.shared.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.running = None;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner()).quit = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where the checkpoint of an interrupted run goes: `--checkpoint`, else the first of
/// `memo-train-checkpoint`, `memo-train-checkpoint-2`, ... in the current directory that holds
/// no checkpoint yet (never over another run's).
fn interrupted_dir(args: &TrainArgs) -> Result<PathBuf, Failure> {
    if let Some(dir) = &args.checkpoint {
        return Ok(dir.clone());
    }
    (1..=1000)
        .map(|n| match n {
            1 => PathBuf::from("memo-train-checkpoint"),
            n => PathBuf::from(format!("memo-train-checkpoint-{n}")),
        })
        .find(|dir| !dir.join(memo_runtime::checkpoint::FILE_NAME).exists())
        .ok_or_else(|| {
            Failure::new(
                exit::IO_ERROR,
                "interrupted: memo-train-checkpoint .. memo-train-checkpoint-1000 all hold checkpoints; nothing saved \
                 (give --checkpoint DIR to choose where an interrupted run saves)",
            )
        })
}

/// A word for a shell: as it is when it is plain, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':' | '=' | ',' | '+'));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The command that continues the run: this one's arguments, with `--checkpoint dir` and
/// `--resume` added where missing.
fn resume_command(arguments: &[OsString], dir: &Path) -> String {
    let words: Vec<String> = arguments.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let has = |flag: &str| words.iter().any(|w| w == flag || w.starts_with(&format!("{flag}=")));
    let mut command = vec!["memo".to_string()];
    command.extend(words.iter().map(|w| shell_word(w)));
    if !has("--checkpoint") {
        command.push("--checkpoint".into());
        command.push(shell_word(&dir.to_string_lossy()));
    }
    if !has("--resume") {
        command.push("--resume".into());
    }
    command.join(" ")
}

/// The end of a run stopped by Ctrl-C after `taken` steps (`first` of them before this run):
/// saves the state with `save` (when this run took a step) and returns the one-line failure,
/// exit 130, that says where it is and how to go on.
pub(super) fn interrupted(
    args: &TrainArgs,
    taken: u64,
    first: u64,
    save: impl FnOnce(&Path) -> Result<(), Failure>,
) -> Failure {
    let arguments: Vec<OsString> = std::env::args_os().skip(1).collect();
    if taken == first {
        let what = match (&args.checkpoint, args.resume) {
            (Some(dir), true) => format!(
                "the checkpoint in {} still holds step {first}; continue with: {}",
                dir.display(),
                resume_command(&arguments, dir)
            ),
            _ => "nothing to save; start again with the same command".to_string(),
        };
        return Failure::new(
            exit::INTERRUPTED,
            format!("interrupted (Ctrl-C) before step {} completed (its update had not begun): {what}", first + 1),
        );
    }
    let dir = match interrupted_dir(args) {
        Ok(dir) => dir,
        Err(failure) => return failure,
    };
    if let Err(failure) = save(&dir) {
        return failure;
    }
    Failure::new(
        exit::INTERRUPTED,
        format!(
            "interrupted (Ctrl-C): the state after step {taken} is saved in {}; it resumes from step {taken} with: {}",
            dir.join(memo_runtime::checkpoint::FILE_NAME).display(),
            resume_command(&arguments, &dir)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_commands_add_what_is_missing_and_quote_what_a_shell_would_split() {
        let args = |words: &[&str]| words.iter().map(OsString::from).collect::<Vec<_>>();
        let dir = Path::new("memo-train-checkpoint");
        assert_eq!(
            resume_command(&args(&["train", "--steps", "40"]), dir),
            "memo train --steps 40 --checkpoint memo-train-checkpoint --resume"
        );
        assert_eq!(
            resume_command(&args(&["train", "--checkpoint=run 1", "--resume"]), dir),
            "memo train '--checkpoint=run 1' --resume"
        );
        assert_eq!(
            resume_command(&args(&["train", "--data", "it's.txt"]), dir).split(' ').nth(3),
            Some("'it'\\''s.txt'")
        );
    }

    #[test]
    fn numbers_and_durations_read_as_people_write_them() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(3412), "3,412");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(elapsed(Duration::from_secs(41)), "41 s");
        assert_eq!(elapsed(Duration::from_secs(725)), "12 min 5 s");
    }
}
