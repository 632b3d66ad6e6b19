//! Threads for the heavy ops, without changing a single bit of their results.
//!
//! Work is cut into chunks whose boundaries depend only on the problem (never on the thread
//! count), each chunk is computed the same way on whichever thread runs it, and no two threads
//! add into the same number. So 1 thread and 16 give identical bytes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// 0: not set, use the machine's parallelism.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the threads [`super::execute`] may use per op (0: the machine's available parallelism,
/// the default). Results do not depend on it.
pub fn set_threads(threads: usize) {
    THREADS.store(threads, Ordering::Relaxed);
}

/// The threads [`super::execute`] uses per op.
pub fn threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// A contiguous run of chunks (the index of its first chunk's run, its elements), taken once.
type Part<'a, T> = Mutex<Option<(usize, &'a mut [T])>>;

/// Calls `f(index, chunk)` for each `chunk_len`-element chunk of `out` (the last may be
/// shorter), on up to `threads` threads, each taking a contiguous run of chunks.
pub(crate) fn for_each_chunk<T, F>(out: &mut [T], chunk_len: usize, threads: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let chunk_len = chunk_len.max(1);
    let chunks = out.len().div_ceil(chunk_len);
    let threads = threads.clamp(1, chunks.max(1));
    if threads == 1 {
        for (index, chunk) in out.chunks_mut(chunk_len).enumerate() {
            f(index, chunk);
        }
        return;
    }
    let per_thread = chunks.div_ceil(threads);
    // Each part sits in a cell so that a part whose thread cannot be created (the job is
    // dropped unrun) is still there to run on this thread: that is not an error.
    let parts: Vec<Part<'_, T>> =
        out.chunks_mut(per_thread * chunk_len).enumerate().map(|part| Mutex::new(Some(part))).collect();
    let run = |cell: &Part<'_, T>| {
        let taken = match cell.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some((part, run)) = taken {
            for (offset, chunk) in run.chunks_mut(chunk_len).enumerate() {
                f(part * per_thread + offset, chunk);
            }
        }
    };
    let run = &run;
    std::thread::scope(|scope| {
        for cell in parts.iter().skip(1) {
            if std::thread::Builder::new().spawn_scoped(scope, move || run(cell)).is_err() {
                run(cell);
            }
        }
        if let Some(first) = parts.first() {
            run(first);
        }
    });
}

/// Computes `f(task)` for `tasks` tasks on up to `threads` threads; results in task order.
pub(crate) fn map_tasks<R, F>(tasks: usize, threads: usize, f: F) -> Vec<R>
where
    R: Send,
    F: Fn(usize) -> R + Sync,
{
    let mut results: Vec<Option<R>> = (0..tasks).map(|_| None).collect();
    for_each_chunk(&mut results, 1, threads, |task, slot| {
        if let Some(first) = slot.first_mut() {
            *first = Some(f(task));
        }
    });
    results.into_iter().flatten().collect()
}
