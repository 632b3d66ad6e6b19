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
    if let Err(why) = memo_mpi::probe() {
        skip::skip(format!("no usable Open MPI: {why}"));
        return None;
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        skip::skip("no usable Open MPI: mpirun is not on PATH (apt-get install openmpi-bin)");
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
fn a_job_of_another_size_and_checkpoints_across_processes_are_refused() {
    let Some(output) = mpirun(2, &ARGS) else { return };
    assert_ne!(code(&output), 0);
    let text = stderr(&output);
    assert!(text.contains("the job has 2 processes") && text.contains("mpirun -np 4"), "{text}");
    let mut args = ARGS.to_vec();
    args.extend(["--checkpoint", env!("CARGO_TARGET_TMPDIR")]);
    let Some(output) = mpirun(4, &args) else { return };
    assert_ne!(code(&output), 0);
    assert!(stderr(&output).contains("not supported across processes yet"), "{}", stderr(&output));
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
