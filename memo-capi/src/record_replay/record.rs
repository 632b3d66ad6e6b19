//! Record mode's bookkeeping: the requests of the current iteration, and each finished
//! iteration's trace in MEMO's text form (`spec/trace-format.md`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use super::blocks::{begin_line, end_line, MARKER};
use crate::status::{CapiError, MemoStatus};

/// One recorded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    Malloc {
        id: u64,
        size: u64,
    },
    Free {
        id: u64,
        size: u64,
    },
    /// A free of a buffer allocated in an earlier iteration or before recording began: it has no
    /// `malloc` in this iteration's trace, so it is written as a comment.
    Foreign {
        size: u64,
    },
    /// `memo_block_begin(key)`: a marker comment (`super::blocks`).
    BlockBegin {
        key: i64,
    },
    /// `memo_block_end()` of the block opened with `key`.
    BlockEnd {
        key: i64,
    },
}

/// A buffer allocated while recording, not freed yet.
#[derive(Clone, Copy, Debug)]
struct Recorded {
    iteration: u64,
    id: u64,
    /// The size its `malloc` asked for (its `free` repeats it, as the text form requires).
    size: u64,
}

/// The recorder.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// The device being recorded: the device of the first request (others are not recorded).
    pub(crate) device: Option<i32>,
    /// Where each finished iteration's trace is written, if anywhere.
    trace_dir: Option<PathBuf>,
    /// The number of the current iteration (iterations finished since recording began).
    iteration: u64,
    /// The current iteration's requests and block markers; ids count from 0 in each iteration.
    requests: Vec<Request>,
    next_id: u64,
    /// Address -> the buffer recorded there, for buffers allocated while recording.
    live: BTreeMap<usize, Recorded>,
    /// The trace of the last finished iteration.
    pub(crate) last_trace: Option<String>,
    /// The key of the block opened by `block_begin` and not ended yet.
    open_block: Option<i64>,
}

impl Recorder {
    /// A recorder that starts at iteration 0 and writes traces to `trace_dir` if given.
    pub(crate) fn new(trace_dir: Option<PathBuf>) -> Recorder {
        Recorder { trace_dir, ..Recorder::default() }
    }

    /// Iterations finished since recording began.
    pub(crate) fn finished_iterations(&self) -> u64 {
        self.iteration
    }

    /// Whether requests on `device` are recorded (the first device seen is the one recorded).
    pub(crate) fn records_device(&mut self, device: i32) -> bool {
        *self.device.get_or_insert(device) == device
    }

    /// Records `malloc` of `size` bytes, given at `address`.
    pub(crate) fn malloc(&mut self, address: usize, size: u64) {
        let id = self.next_id;
        self.next_id += 1;
        self.requests.push(Request::Malloc { id, size });
        self.live.insert(address, Recorded { iteration: self.iteration, id, size });
    }

    /// Records the free of `address` (`size` bytes, as the caller says) when `recording`; forgets
    /// the address either way, so that a later buffer at the same address is not mistaken for it.
    pub(crate) fn free(&mut self, address: usize, size: u64, recording: bool) {
        let recorded = self.live.remove(&address);
        if !recording {
            return;
        }
        match recorded {
            Some(r) if r.iteration == self.iteration => self.requests.push(Request::Free { id: r.id, size: r.size }),
            _ => self.requests.push(Request::Foreign { size }),
        }
    }

    /// Opens block `key`: the requests until [`block_end`](Self::block_end) are one instance of
    /// it. Refused while another block is open (blocks do not nest).
    pub(crate) fn block_begin(&mut self, key: i64) -> Result<(), CapiError> {
        if let Some(open) = self.open_block {
            return Err(CapiError::new(
                MemoStatus::InvalidState,
                format!("block {open} is still open: end it before beginning block {key} (blocks do not nest)"),
            ));
        }
        self.open_block = Some(key);
        self.requests.push(Request::BlockBegin { key });
        Ok(())
    }

    /// Closes the open block. Refused when none is open.
    pub(crate) fn block_end(&mut self) -> Result<(), CapiError> {
        let Some(key) = self.open_block.take() else {
            return Err(CapiError::new(
                MemoStatus::InvalidState,
                "no block is open in this iteration: call memo_block_begin first",
            ));
        };
        self.requests.push(Request::BlockEnd { key });
        Ok(())
    }

    /// Ends the current iteration: closes a block still open (at the iteration's end), renders its trace, keeps it as the last one and writes it to
    /// `<trace_dir>/iteration-NNNN.trace` if a directory was given. The trace is kept even when
    /// writing fails (the error says where).
    pub(crate) fn end_iteration(&mut self) -> Result<(), CapiError> {
        if self.open_block.is_some() {
            self.block_end()?;
        }
        let text = self.render();
        let number = self.iteration;
        self.iteration += 1;
        self.requests.clear();
        self.next_id = 0;
        let written = match &self.trace_dir {
            Some(dir) => {
                let path = dir.join(format!("iteration-{number:04}.trace"));
                std::fs::write(&path, &text).map_err(|e| {
                    CapiError::new(
                        MemoStatus::Io,
                        format!("cannot write the trace of iteration {number} to {}: {e}", path.display()),
                    )
                })
            }
            None => Ok(()),
        };
        self.last_trace = Some(text);
        written
    }

    /// The current iteration's requests in MEMO's text form.
    fn render(&self) -> String {
        let count = |f: fn(&Request) -> bool| self.requests.iter().filter(|r| f(r)).count();
        let mallocs = count(|r| matches!(r, Request::Malloc { .. }));
        let frees = count(|r| matches!(r, Request::Free { .. }));
        let foreign = count(|r| matches!(r, Request::Foreign { .. }));
        let blocks = count(|r| matches!(r, Request::BlockBegin { .. }));
        let still_live = self.live.values().filter(|r| r.iteration == self.iteration).count();
        let mut text = String::with_capacity(24 * self.requests.len() + 400);
        let device = self.device.map_or_else(|| "-".to_string(), |d| d.to_string());
        // Writing to a String cannot fail.
        let _ = writeln!(
            text,
            "# memo-capi record/replay allocator: iteration {} on device {device} (format: spec/trace-format.md)\n\
             # {mallocs} mallocs, {frees} frees; {still_live} buffers never freed in this iteration (they live to its end);\n\
             # {foreign} frees of buffers from earlier iterations or from before recording, as comments;\n\
             # {blocks} blocks marked (`# {MARKER} begin <key>` ... `# {MARKER} end <key>`: bi-level planning)",
            self.iteration
        );
        for request in &self.requests {
            let _ = match *request {
                Request::Malloc { id, size } => writeln!(text, "malloc {id} {size}"),
                Request::Free { id, size } => writeln!(text, "free {id} {size}"),
                Request::Foreign { size } => writeln!(text, "# free of an earlier buffer: {size} bytes"),
                Request::BlockBegin { key } => writeln!(text, "{}", begin_line(key)),
                Request::BlockEnd { key } => writeln!(text, "{}", end_line(key)),
            };
        }
        text
    }
}
