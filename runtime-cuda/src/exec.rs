//! Executing one [`Step`] of a launch recipe on a stream: a kernel by name with its parameters
//! turned into device addresses and scalars, a cuBLAS GEMM (bf16 in and out, f32 compute), or an
//! async memset. Nothing here knows an op: `memo_kernels::launch_steps` decided everything.

use crate::error::CudaError;
use crate::error::CudaError::Launch;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use memo_kernels::{Gemm, KernelLaunch, Operand, Param, Step};

/// A launch's arguments and the backend's memory, as device addresses.
pub(crate) struct Resolved<'a> {
    /// Each argument's (first byte's address, bytes), in signature order; bounds already checked.
    pub args: &'a [(CdevicePtr, u64)],
    /// The stream's scratch memory and the bytes the recipe uses of it (`None`: it uses none).
    pub scratch: Option<(CdevicePtr, u64)>,
    /// The status words.
    pub status: CdevicePtr,
    /// The plan instruction (for the status words).
    pub instruction: u32,
}

/// A device address.
pub(crate) type CdevicePtr = CUdeviceptr;

/// One kernel argument's value.
enum Value {
    U64(u64),
    U32(u32),
    F32(f32),
}

impl Resolved<'_> {
    /// The address `byte_offset` bytes into argument `arg`, with `bytes` bytes after it.
    fn pointer(&self, arg: usize, byte_offset: u64, bytes: u64) -> Result<CdevicePtr, CudaError> {
        let &(base, len) =
            self.args.get(arg).ok_or_else(|| Launch(format!("the recipe names argument {arg}, which is missing")))?;
        match byte_offset.checked_add(bytes) {
            Some(end) if end <= len => Ok(base + byte_offset),
            _ => Err(Launch(format!(
                "the recipe reaches bytes [{byte_offset}, +{bytes}) of argument {arg}, which has {len}"
            ))),
        }
    }

    fn value(&self, param: &Param) -> Result<Value, CudaError> {
        Ok(match *param {
            // A kernel pointer may be one past the end only when nothing is read: bounds of the
            // pointed-to extent are the kernel's contract with the recipe, checked in its tests.
            Param::Ptr { arg, byte_offset } => Value::U64(self.pointer(arg, byte_offset, 0)?),
            Param::Scratch { byte_offset } => match self.scratch {
                Some((base, bytes)) if byte_offset < bytes => Value::U64(base + byte_offset),
                _ => return Err(Launch(format!("scratch offset {byte_offset} outside the recipe's scratch"))),
            },
            Param::Status => Value::U64(self.status),
            Param::Instruction => Value::U32(self.instruction),
            Param::U32(v) => Value::U32(v),
            Param::U64(v) => Value::U64(v),
            Param::F32(v) => Value::F32(v),
        })
    }
}

/// Runs `step` on `stream` (`blas` is the stream's cuBLAS handle).
pub(crate) fn run_step(
    step: &Step,
    resolved: &Resolved<'_>,
    functions: &HashMap<&'static str, CudaFunction>,
    stream: &Arc<CudaStream>,
    blas: &CudaBlas,
) -> Result<(), CudaError> {
    match step {
        Step::Kernel(launch) => kernel(launch, resolved, functions, stream),
        Step::Gemm(gemm) => run_gemm(gemm, resolved, blas),
        Step::Zero { arg } => {
            let &(address, len) =
                resolved.args.get(*arg).ok_or_else(|| Launch(format!("no argument {arg} to zero")))?;
            let len = usize::try_from(len).map_err(|_| Launch("a zero of more than usize bytes".into()))?;
            if len == 0 {
                return Ok(());
            }
            // Safety: `address` starts `len` bytes of the arena (the backend checked the span),
            // and the plan orders this write against every other access of them (the contract of
            // the unsafe `Backend::launch` this serves).
            unsafe { cudarc::driver::result::memset_d8_async(address, 0, len, stream.cu_stream()) }
                .map_err(|e| CudaError::driver("zero", e))
        }
    }
}

fn kernel(
    launch: &KernelLaunch,
    resolved: &Resolved<'_>,
    functions: &HashMap<&'static str, CudaFunction>,
    stream: &Arc<CudaStream>,
) -> Result<(), CudaError> {
    let function = functions.get(launch.kernel).ok_or_else(|| {
        Launch(format!("kernel `{}` was not compiled (it is in no memo_kernels::SOURCES entry)", launch.kernel))
    })?;
    let values: Vec<Value> = launch.params.iter().map(|p| resolved.value(p)).collect::<Result<_, _>>()?;
    let mut builder = stream.launch_builder(function);
    for value in &values {
        match value {
            Value::U64(v) => builder.arg(v),
            Value::U32(v) => builder.arg(v),
            Value::F32(v) => builder.arg(v),
        };
    }
    let config = LaunchConfig {
        grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
        block_dim: (launch.block[0], launch.block[1], launch.block[2]),
        shared_mem_bytes: launch.shared_bytes,
    };
    // Safety: the parameters match the kernel's C declaration in count, order and type (the
    // recipes' tests check every kernel step against its source); every pointer is inside the
    // arena, the scratch or the status words, with the extents the recipe's shape checks
    // proved; the plan orders the accesses across streams (the contract of the unsafe
    // `Backend::launch` this serves). `values` outlives the launch call.
    unsafe { builder.launch(config) }
        .map(|_| ())
        .map_err(|e| CudaError::driver(format!("kernel `{}`", launch.kernel), e))
}

/// Bytes a column-major bf16 matrix of `rows x cols` with leading dimension `ld` spans.
fn extent(rows: u32, cols: u32, ld: u32) -> u64 {
    if rows == 0 || cols == 0 {
        return 0;
    }
    ((u64::from(cols) - 1) * u64::from(ld) + u64::from(rows)) * 2
}

fn operand_pointer(
    resolved: &Resolved<'_>,
    operand: Operand,
    rows: u32,
    cols: u32,
    ld: u32,
) -> Result<CdevicePtr, CudaError> {
    if ld < rows.max(1) {
        return Err(Launch(format!("leading dimension {ld} below the {rows} rows of a GEMM operand")));
    }
    resolved.pointer(operand.arg, operand.byte_offset, extent(rows, cols, ld))
}

fn run_gemm(gemm: &Gemm, resolved: &Resolved<'_>, blas: &CudaBlas) -> Result<(), CudaError> {
    // Stored shapes (column-major): A is m x k, or k x m when transposed; B is k x n, or n x k.
    let (a_rows, a_cols) = if gemm.transpose_a { (gemm.k, gemm.m) } else { (gemm.m, gemm.k) };
    let (b_rows, b_cols) = if gemm.transpose_b { (gemm.n, gemm.k) } else { (gemm.k, gemm.n) };
    let a = operand_pointer(resolved, gemm.a, a_rows, a_cols, gemm.lda)?;
    let b = operand_pointer(resolved, gemm.b, b_rows, b_cols, gemm.ldb)?;
    let c = operand_pointer(resolved, gemm.c, gemm.m, gemm.n, gemm.ldc)?;
    let int = |v: u32| i32::try_from(v).map_err(|_| Launch(format!("GEMM dimension {v} above 2^31")));
    let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
    let (alpha, beta) = (gemm.alpha, gemm.beta);
    // Safety: `blas` is bound to the launch's stream; A, B and C lie inside their arguments for
    // the extents their dimensions and leading dimensions imply (checked above); alpha and beta
    // are f32 on the host, as CUBLAS_COMPUTE_32F with the default (host) pointer mode expects.
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            op(gemm.transpose_a),
            op(gemm.transpose_b),
            int(gemm.m)?,
            int(gemm.n)?,
            int(gemm.k)?,
            (&alpha as *const f32).cast::<c_void>(),
            a as *const c_void,
            cudaDataType_t::CUDA_R_16BF,
            int(gemm.lda)?,
            b as *const c_void,
            cudaDataType_t::CUDA_R_16BF,
            int(gemm.ldb)?,
            (&beta as *const f32).cast::<c_void>(),
            c as *mut c_void,
            cudaDataType_t::CUDA_R_16BF,
            int(gemm.ldc)?,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| CudaError::Cublas { what: format!("GEMM {}x{}x{}", gemm.m, gemm.n, gemm.k), status: format!("{e:?}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_operand_extents_and_bounds() {
        assert_eq!(extent(4, 3, 4), 24);
        assert_eq!(extent(4, 3, 6), ((2 * 6) + 4) * 2);
        assert_eq!(extent(0, 3, 6), 0);
        let args = [(1000u64, 24u64)];
        let resolved = Resolved { args: &args, scratch: None, status: 0, instruction: 0 };
        assert!(operand_pointer(&resolved, Operand { arg: 0, byte_offset: 0 }, 4, 3, 4).is_ok());
        assert!(operand_pointer(&resolved, Operand { arg: 0, byte_offset: 2 }, 4, 3, 4).is_err());
        assert!(operand_pointer(&resolved, Operand { arg: 0, byte_offset: 0 }, 4, 3, 3).is_err());
        assert!(operand_pointer(&resolved, Operand { arg: 1, byte_offset: 0 }, 1, 1, 1).is_err());
    }
}
