//! Turning a launch's `memo_kernels::Step`s into what HIP and hipBLAS take: device addresses,
//! kernel parameter slots and GEMM calls, with every address checked against the argument it
//! belongs to. Pure arithmetic, no HIP call, so it is tested without a GPU against the real
//! recipes of real plans (`tests` below).

use memo_kernels::{Gemm, KernelLaunch, Param};
use memo_plan_core::plan::Op;
use memo_runtime::{BackendError, KernelArg, Space, Span};

use crate::result::hipblas::GemmCall;
use crate::sys::hipblas::{OP_N, OP_T};

/// Where the backend's memory is: (base address, bytes) of each region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// The device arena.
    pub arena: (u64, u64),
    /// The pinned host slab.
    pub host: (u64, u64),
    /// The launch stream's kernel scratch.
    pub scratch: (u64, u64),
    /// The status words, once allocated.
    pub status: Option<u64>,
}

/// A launch failed before anything was enqueued.
pub fn kernel_error(instruction: usize, op: Op, message: impl std::fmt::Display) -> BackendError {
    BackendError::Kernel { instruction, message: format!("{}: {message}", op.name()) }
}

impl Layout {
    /// Bytes in `space`.
    pub fn size_of(&self, space: Space) -> u64 {
        match space {
            Space::Device => self.arena.1,
            Space::Host => self.host.1,
        }
    }

    /// The address of `span`'s first byte, after checking it lies inside its space.
    pub fn address(&self, span: Span) -> Result<u64, BackendError> {
        let (base, size) = match span.space {
            Space::Device => self.arena,
            Space::Host => self.host,
        };
        match span.offset.checked_add(span.len) {
            Some(end) if end <= size => Ok(base + span.offset),
            _ => Err(BackendError::OutOfBounds { span, size }),
        }
    }

    /// The address of argument `arg` plus `byte_offset`, with `need` bytes from there inside
    /// the argument.
    pub fn operand(
        &self,
        instruction: usize,
        op: Op,
        args: &[KernelArg],
        arg: usize,
        byte_offset: u64,
        need: u64,
    ) -> Result<u64, BackendError> {
        let span =
            args.get(arg).ok_or_else(|| kernel_error(instruction, op, format!("argument {arg} does not exist")))?.span;
        match byte_offset.checked_add(need) {
            Some(end) if end <= span.len => Ok(self.address(span)? + byte_offset),
            _ => Err(kernel_error(
                instruction,
                op,
                format!("bytes [{byte_offset}, +{need}) of argument {arg} lie outside its {} bytes", span.len),
            )),
        }
    }

    /// Each parameter of `launch` in an 8-byte slot (the kernel reads its own width from the
    /// slot's start): what `hipModuleLaunchKernel`'s `kernelParams` point at.
    pub fn kernel_params(
        &self,
        instruction: usize,
        op: Op,
        args: &[KernelArg],
        launch: &KernelLaunch,
    ) -> Result<Vec<[u8; 8]>, BackendError> {
        let mut slots = vec![[0u8; 8]; launch.params.len()];
        for (slot, param) in slots.iter_mut().zip(&launch.params) {
            match *param {
                Param::Ptr { arg, byte_offset } => {
                    *slot = self.operand(instruction, op, args, arg, byte_offset, 0)?.to_ne_bytes();
                }
                Param::Scratch { byte_offset } => {
                    let (base, bytes) = self.scratch;
                    if base == 0 || byte_offset >= bytes || launch.scratch_bytes > bytes {
                        return Err(kernel_error(
                            instruction,
                            op,
                            format!(
                                "kernel `{}` uses scratch bytes [{byte_offset}, {}) but the stream has {bytes}",
                                launch.kernel, launch.scratch_bytes
                            ),
                        ));
                    }
                    *slot = (base + byte_offset).to_ne_bytes();
                }
                Param::Status => {
                    let status = self.status.ok_or_else(|| {
                        kernel_error(instruction, op, "no status words: call allocate before launching")
                    })?;
                    *slot = status.to_ne_bytes();
                }
                Param::Instruction => {
                    let index = u32::try_from(instruction).unwrap_or(u32::MAX);
                    slot[..4].copy_from_slice(&index.to_ne_bytes());
                }
                Param::U32(v) => slot[..4].copy_from_slice(&v.to_ne_bytes()),
                Param::U64(v) => *slot = v.to_ne_bytes(),
                Param::F32(v) => slot[..4].copy_from_slice(&v.to_ne_bytes()),
            }
        }
        Ok(slots)
    }

    /// The hipBLAS call of `gemm`, after checking that A, B and C, with their leading
    /// dimensions, lie inside their arguments (bf16: 2 bytes per element).
    pub fn gemm_call(
        &self,
        instruction: usize,
        op: Op,
        args: &[KernelArg],
        gemm: &Gemm,
    ) -> Result<GemmCall, BackendError> {
        // Stored extents (rows, columns) of A and B, column-major.
        let (a_rows, a_cols) = if gemm.transpose_a { (gemm.k, gemm.m) } else { (gemm.m, gemm.k) };
        let (b_rows, b_cols) = if gemm.transpose_b { (gemm.n, gemm.k) } else { (gemm.k, gemm.n) };
        let extent = |rows: u32, cols: u32, ld: u32, name: &str| -> Result<u64, BackendError> {
            if ld < rows.max(1) {
                return Err(kernel_error(
                    instruction,
                    op,
                    format!("GEMM {name}: leading dimension {ld} < {rows} rows"),
                ));
            }
            Ok(if rows == 0 || cols == 0 { 0 } else { ((u64::from(cols) - 1) * u64::from(ld) + u64::from(rows)) * 2 })
        };
        let a_bytes = extent(a_rows, a_cols, gemm.lda, "A")?;
        let b_bytes = extent(b_rows, b_cols, gemm.ldb, "B")?;
        let c_bytes = extent(gemm.m, gemm.n, gemm.ldc, "C")?;
        let a = self.operand(instruction, op, args, gemm.a.arg, gemm.a.byte_offset, a_bytes)?;
        let b = self.operand(instruction, op, args, gemm.b.arg, gemm.b.byte_offset, b_bytes)?;
        let c = self.operand(instruction, op, args, gemm.c.arg, gemm.c.byte_offset, c_bytes)?;
        let int = |v: u32, name: &str| {
            i32::try_from(v)
                .map_err(|_| kernel_error(instruction, op, format!("GEMM {name} = {v} exceeds hipBLAS's int")))
        };
        Ok(GemmCall {
            op_a: if gemm.transpose_a { OP_T } else { OP_N },
            op_b: if gemm.transpose_b { OP_T } else { OP_N },
            m: int(gemm.m, "m")?,
            n: int(gemm.n, "n")?,
            k: int(gemm.k, "k")?,
            a: a as *const _,
            lda: int(gemm.lda, "lda")?,
            b: b as *const _,
            ldb: int(gemm.ldb, "ldb")?,
            c: c as *mut _,
            ldc: int(gemm.ldc, "ldc")?,
            alpha: gemm.alpha,
            beta: gemm.beta,
        })
    }
}

#[cfg(test)]
mod tests;
