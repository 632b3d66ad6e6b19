//! `memo train --device cpu --tensor-parallel T` as `T` processes under Open MPI's `mpirun`, one
//! rank each (`memo-mpi`): the same losses, bit for bit, as the `T` ranks as threads of one
//! process. SKIP without mpirun or Open MPI's library.

mod common;

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::process::{Command, Output};

use common::{code, memo, stderr};

const ARGS: [&str; 11] =
    ["train", "--device", "cpu", "--model", "tiny", "--seq", "32", "--steps", "3", "--tensor-parallel", "4"];

/// `mpirun -np {np} memo ...` with what this kind of machine needs: root (containers),
/// more ranks than cores, TCP between processes (the shared-memory transport's single-copy
/// mechanism needs ptrace rights containers lack), and mpirun's own bound on the job.
fn mpirun(np: usize, args: &[&str]) -> Option<Output> {
    if !usable() {
        return None;
    }
    let output = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp", "--timeout", "300"])
        .args(["-np", &np.to_string(), env!("CARGO_BIN_EXE_memo")])
        .args(args)
        .env("MEMO_COLLECTIVE_TIMEOUT", "60")
        .output()
        .expect("mpirun runs");
    Some(output)
}

/// Whether Open MPI's library and mpirun are here; else a SKIP line naming the cause.
fn usable() -> bool {
    if let Err(why) = memo_mpi::probe() {
        skip::skip(format!("no usable Open MPI: {why}"));
        return false;
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        skip::skip("no usable Open MPI: mpirun is not on PATH (apt-get install openmpi-bin)");
        return false;
    }
    true
}

/// The `loss` of each step line and the summary's `final_loss`, as printed (their decimal
/// text: equal text is equal f32 bits, since serde prints the shortest round-trip form).
fn losses(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            value.get("loss").or_else(|| value.get("final_loss")).map(ToString::to_string).unwrap_or_default()
        })
        .collect()
}

#[test]
fn four_processes_print_the_losses_of_four_threads_bit_for_bit() {
    let mut args = ARGS.to_vec();
    args.push("--json");
    let Some(processes) = mpirun(4, &args) else { return };
    assert_eq!(code(&processes), 0, "{}", stderr(&processes));
    let threads = memo(&args, None);
    assert_eq!(code(&threads), 0, "{}", stderr(&threads));
    // Only rank 0 prints: 3 step lines and a summary.
    assert_eq!(losses(&processes).len(), 4, "{}", String::from_utf8_lossy(&processes.stdout));
    assert_eq!(losses(&processes), losses(&threads));
}

#[test]
fn a_job_of_another_size_and_a_trace_across_processes_are_refused() {
    let Some(output) = mpirun(2, &ARGS) else { return };
    assert_ne!(code(&output), 0);
    let text = stderr(&output);
    assert!(text.contains("the job has 2 processes") && text.contains("mpirun -np 4"), "{text}");
    let mut args = ARGS.to_vec();
    args.extend(["--trace", "trace.json"]);
    let Some(output) = mpirun(4, &args) else { return };
    assert_ne!(code(&output), 0);
    assert!(stderr(&output).contains("not supported across processes yet"), "{}", stderr(&output));
    // Context parallelism: the ring runs between threads of one process.
    let mut args = ARGS[..9].to_vec();
    args.extend(["--context-parallel", "2", "--tensor-parallel", "2"]);
    let Some(output) = mpirun(4, &args) else { return };
    assert_ne!(code(&output), 0);
    assert!(stderr(&output).contains("--context-parallel 2 under mpirun"), "{}", stderr(&output));
}

fn fresh_dir(name: &str) -> String {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("memo-mpirun-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir.to_string_lossy().into_owned()
}

fn checkpoint(dir: &str) -> Vec<u8> {
    std::fs::read(std::path::Path::new(dir).join("checkpoint.memo")).unwrap()
}

/// The checkpoint file of 4 processes (rank 0 gathers every rank's state and writes it) is the
/// threaded run's, byte for byte; and resuming under mpirun continues bit-identically.
#[test]
fn four_processes_write_the_threaded_checkpoint_and_resume_bit_identically() {
    let (threads, processes, split) = (fresh_dir("threads"), fresh_dir("processes"), fresh_dir("split"));
    let with = |steps: &'static str, dir: &str| {
        let mut args = ARGS.to_vec();
        args[8] = steps;
        let mut args: Vec<String> = args.into_iter().map(String::from).collect();
        args.extend(["--checkpoint".to_string(), dir.to_string(), "--checkpoint-every".to_string(), "2".to_string()]);
        args
    };
    let straight = with("4", &processes);
    let Some(output) = mpirun(4, &straight.iter().map(String::as_str).collect::<Vec<_>>()) else { return };
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let threaded = with("4", &threads);
    let output = memo(&threaded.iter().map(String::as_str).collect::<Vec<_>>(), None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert!(checkpoint(&processes) == checkpoint(&threads), "the checkpoints differ");
    // 2 steps, then resume to 4, all under mpirun.
    let first = with("2", &split);
    let output = mpirun(4, &first.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let mut resumed = with("4", &split);
    resumed.push("--resume".into());
    let output = mpirun(4, &resumed.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert!(checkpoint(&split) == checkpoint(&threads), "the resumed checkpoint differs");
}

/// Under torchrun's variables, CPU ranks are refused with the launcher to use (no MPI needed).
#[test]
fn cpu_ranks_under_torchrun_are_refused_naming_mpirun() {
    let output = Command::new(env!("CARGO_BIN_EXE_memo"))
        .args(ARGS)
        .env("WORLD_SIZE", "4")
        .env("RANK", "0")
        .env_remove("OMPI_COMM_WORLD_SIZE")
        .output()
        .unwrap();
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("mpirun -np 4 memo train"), "{}", stderr(&output));
}

/// A rank killed in the middle of training ends the job with an error instead of a hang: the
/// others' waits are bounded (`MEMO_COLLECTIVE_TIMEOUT`) and mpirun ends the job when a process
/// dies; mpirun's `--timeout` bounds the whole test.
#[test]
fn a_killed_rank_ends_the_job_with_an_error() {
    use std::io::BufRead;
    if !usable() {
        return;
    }
    let mut args = ARGS.to_vec();
    args[8] = "100000";
    args.push("--json");
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp", "--timeout", "300"])
        .args(["-np", "4", env!("CARGO_BIN_EXE_memo")])
        .args(&args)
        .env("MEMO_COLLECTIVE_TIMEOUT", "20")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    // Training has begun once rank 0 printed a step.
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().is_some_and(|l| l.is_ok_and(|l| l.contains("\"step\""))));
    // mpirun's children are the ranks' processes: kill the last one.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).unwrap_or_default();
    let victim = children.split_whitespace().last().expect("mpirun has children").to_string();
    let killed = Command::new("kill").args(["-9", &victim]).status().unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(!status.success(), "the job ended cleanly after a rank was killed");
}
