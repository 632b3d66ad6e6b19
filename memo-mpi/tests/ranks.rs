//! The MPI group across real processes: this test binary runs itself under `mpirun` (the
//! `worker` test does the rank's part when `MEMO_MPI_SCENARIO` is set, and nothing otherwise).
//! Every rank checks its results against `memo_runtime::collective::reduce` (the in-process
//! group's arithmetic) and exits non-zero on any difference. SKIP without mpirun or Open MPI.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::process::Command;
use std::time::Duration;

use memo_mpi::MpiGroup;
use memo_runtime::collective::{reduce, CollectiveError, Element, Reduction};
use memo_runtime::Collectives;

/// `mpirun` with the flags this kind of machine needs: as root (containers), more ranks than
/// cores, and TCP between the processes (the shared-memory transport's single-copy mechanism
/// needs ptrace rights a container usually lacks).
fn mpirun(np: usize) -> Option<Command> {
    if let Err(why) = memo_mpi::probe() {
        skip::skip(format!("no usable Open MPI: {why}"));
        return None;
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        skip::skip("no usable Open MPI: mpirun is not on PATH (apt-get install openmpi-bin)");
        return None;
    }
    let mut command = Command::new("mpirun");
    command
        .args(["--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp"])
        // mpirun's own bound on the whole job: a hang fails the test instead of stalling it.
        .args(["--timeout", "300", "-np", &np.to_string()])
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1");
    Some(command)
}

/// Runs `scenario` on `np` ranks; returns (exit status success, stdout + stderr).
fn run(np: usize, scenario: &str) -> Option<(bool, String)> {
    let mut command = mpirun(np)?;
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = command
        .arg(exe)
        .args(["--exact", "worker", "--nocapture", "--test-threads", "1"])
        .env("MEMO_MPI_SCENARIO", scenario)
        .env("MEMO_COLLECTIVE_TIMEOUT", "30")
        .output()
        .expect("mpirun runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    Some((output.status.success(), text))
}

fn input(element: Element, rank: usize, elements: usize) -> Vec<u8> {
    (0..elements)
        .flat_map(|i| {
            let x = (((rank * 7 + i * 13) % 11) as f32 - 5.0) * [1.0, 3.0e-3, 257.0, -1.0e-5][(rank + i) % 4];
            match element {
                Element::Bf16 => half_bits(x).to_vec(),
                Element::F32 => x.to_le_bytes().to_vec(),
            }
        })
        .collect()
}

/// bf16 by truncation: any bits will do as inputs.
fn half_bits(x: f32) -> [u8; 2] {
    ((x.to_bits() >> 16) as u16).to_le_bytes()
}

/// One rank's part: every collective against the reference, a ring exchange, then the scenario.
fn rank_part(scenario: &str) -> Result<(), String> {
    let group = MpiGroup::init().map_err(|e| e.to_string())?;
    let (k, t) = (group.rank(), group.ranks());
    for element in [Element::Bf16, Element::F32] {
        for elements in [1, 5, 64] {
            let x = input(element, k, elements);
            let mut y = vec![0u8; t * x.len()];
            group.all_gather(&x, &mut y).map_err(|e| e.to_string())?;
            let want: Vec<u8> = (0..t).flat_map(|j| input(element, j, elements)).collect();
            if y != want {
                return Err(format!("rank {k}: all_gather differs"));
            }
            let x = input(element, k, elements * t);
            let n = elements * element.bytes();
            let mut y = vec![0u8; n];
            group.reduce_scatter(element, &x, &mut y).map_err(|e| e.to_string())?;
            let inputs: Vec<Vec<u8>> = (0..t).map(|j| input(element, j, elements * t)).collect();
            let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let mut sum = vec![0u8; x.len()];
            reduce(element, Reduction::Sum, &refs, &mut sum);
            if y != sum[k * n..(k + 1) * n] {
                return Err(format!("rank {k}: reduce_scatter differs from the reference"));
            }
            for reduction in [Reduction::Sum, Reduction::Max] {
                let mut x = input(element, k, elements);
                group.all_reduce(element, reduction, &mut x).map_err(|e| e.to_string())?;
                let inputs: Vec<Vec<u8>> = (0..t).map(|j| input(element, j, elements)).collect();
                let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                let mut want = vec![0u8; x.len()];
                reduce(element, reduction, &refs, &mut want);
                if x != want {
                    return Err(format!("rank {k}: all_reduce {reduction:?} differs from the reference"));
                }
            }
        }
    }
    let from = (k + t - 1) % t;
    let mut received = vec![0u8; from + 1];
    group.exchange((k + 1) % t, &vec![k as u8; k + 1], from, &mut received).map_err(|e| e.to_string())?;
    if received != vec![from as u8; from + 1] {
        return Err(format!("rank {k}: the ring exchange received {received:?}"));
    }
    match scenario {
        "clean" => {}
        "mismatch" => {
            // Rank 0 expects one byte more than its sender sends: every rank fails alike.
            let mut receive = vec![0u8; if k == 0 { 3 } else { 2 }];
            match group.exchange((k + 1) % t, &[1, 2], from, &mut receive) {
                Err(CollectiveError::Exchange { problem, .. }) if problem.contains("which receives 3") => {}
                other => return Err(format!("rank {k}: a mismatched exchange gave {other:?}")),
            }
            // And every later call fails at once.
            if group.all_reduce(Element::F32, Reduction::Sum, &mut [0; 4]).is_ok() {
                return Err(format!("rank {k}: a call after the failure succeeded"));
            }
        }
        "abort" => {
            if k == 1 {
                group.abort("its kernel failed");
                return Ok(());
            }
            let mut x = vec![0u8; 4];
            match group.all_reduce(Element::F32, Reduction::Sum, &mut x) {
                Err(CollectiveError::RankFailed { rank: 1, reason }) if reason == "its kernel failed" => {}
                other => return Err(format!("rank {k}: after rank 1 aborted: {other:?}")),
            }
        }
        other => return Err(format!("unknown scenario {other}")),
    }
    // A mismatch fails before any payload moves: nothing is pending, so MPI ends cleanly.
    group.finish().map_err(|e| e.to_string())?;
    println!("rank {k} of {t}: {scenario} passed");
    Ok(())
}

/// The rank's part, only when run by `mpirun` from the tests below.
#[test]
fn worker() {
    let Ok(scenario) = std::env::var("MEMO_MPI_SCENARIO") else { return };
    if let Err(error) = rank_part(&scenario) {
        eprintln!("FAILED: {error}");
        std::process::exit(3);
    }
    // Skip the harness's exit (it would run nothing more) but keep the exit code 0 when a failed
    // group cannot finalise: exit now, as `memo train` does.
    std::process::exit(0);
}

/// Whether it ran (false after a SKIP line).
fn assert_passes(np: usize, scenario: &str) -> bool {
    let Some((ok, text)) = run(np, scenario) else { return false };
    assert!(ok, "mpirun -np {np} ({scenario}) failed:\n{text}");
    let passed = text.matches(&format!(": {scenario} passed")).count();
    assert_eq!(passed, np, "not every rank passed:\n{text}");
    true
}

#[test]
fn every_collective_and_a_ring_exchange_match_the_reference_on_1_to_4_processes() {
    for np in 1..=4 {
        if !assert_passes(np, "clean") {
            return;
        }
    }
}

#[test]
fn a_mismatched_exchange_fails_on_every_process() {
    let _ = assert_passes(3, "mismatch");
}

// Ignored: the aborting rank and its peers (whose collective stays pending) end without
// MPI_Finalize, and mpirun then kills the others, which may not have printed their line yet (a
// race in the test's check, not in the group: run with `-- --ignored` to see every rank's line).
#[test]
#[ignore = "racy check: mpirun kills the ranks when the first ends without MPI_Finalize"]
fn an_aborting_process_fails_the_others_naming_it() {
    let _ = assert_passes(3, "abort");
}

#[test]
fn the_timeout_variable_is_read() {
    // Not a timing: only the parsing.
    std::env::set_var("MEMO_COLLECTIVE_TIMEOUT", "2.5");
    assert_eq!(memo_mpi::timeout_from_env(), Ok(Duration::from_secs_f64(2.5)));
    std::env::set_var("MEMO_COLLECTIVE_TIMEOUT", "soon");
    assert!(memo_mpi::timeout_from_env().unwrap_err().0.contains("positive number of seconds"));
    std::env::remove_var("MEMO_COLLECTIVE_TIMEOUT");
}
