//! hipBLAS: handles, streams, `GemmEx`.

use std::ffi::c_void;

use crate::error::{blas_status_message, HipError};
use crate::sys::hipblas::{GemmExFn, HipblasFns, HipblasStatus, GEMM_DEFAULT};
use crate::sys::{HipStream, HipblasHandle};

/// `Ok` for `HIPBLAS_STATUS_SUCCESS`, else the error of `call`.
pub fn check(call: &'static str, status: HipblasStatus) -> Result<(), HipError> {
    if status == 0 {
        Ok(())
    } else {
        Err(HipError::Blas { call, status, message: blas_status_message(status).to_string() })
    }
}

/// `hipblasCreate`.
pub fn create(blas: &HipblasFns) -> Result<HipblasHandle, HipError> {
    let mut handle = std::ptr::null_mut();
    // Safety: valid out-pointer.
    check("hipblasCreate", unsafe { (blas.hipblasCreate)(&mut handle) })?;
    Ok(handle)
}

/// `hipblasDestroy`.
///
/// # Safety
/// `handle` came from [`create`] and is not used afterwards.
pub unsafe fn destroy(blas: &HipblasFns, handle: HipblasHandle) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check("hipblasDestroy", unsafe { (blas.hipblasDestroy)(handle) })
}

/// `hipblasSetStream`.
///
/// # Safety
/// `handle` and `stream` are live.
pub unsafe fn set_stream(blas: &HipblasFns, handle: HipblasHandle, stream: HipStream) -> Result<(), HipError> {
    // Safety: the caller's contract.
    check("hipblasSetStream", unsafe { (blas.hipblasSetStream)(handle, stream) })
}

/// The type arguments of one `GemmEx` convention (see `sys::hipblas`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTypes {
    /// A, B and C's type.
    pub matrix: i32,
    /// The compute type.
    pub compute: i32,
}

/// A column-major GEMM's shape and operands, alpha and beta on the host (fp32).
#[derive(Clone, Copy, Debug)]
pub struct GemmCall {
    /// `HIPBLAS_OP_N` / `HIPBLAS_OP_T` for A.
    pub op_a: i32,
    /// ... for B.
    pub op_b: i32,
    /// Rows of op(A) and C.
    pub m: i32,
    /// Columns of op(B) and C.
    pub n: i32,
    /// Inner dimension.
    pub k: i32,
    /// A (device).
    pub a: *const c_void,
    /// Leading dimension of A.
    pub lda: i32,
    /// B (device).
    pub b: *const c_void,
    /// Leading dimension of B.
    pub ldb: i32,
    /// C (device).
    pub c: *mut c_void,
    /// Leading dimension of C.
    pub ldc: i32,
    /// alpha.
    pub alpha: f32,
    /// beta.
    pub beta: f32,
}

/// `hipblasGemmEx` (or its `_v2` twin, whichever `function` is) with `types`.
///
/// # Safety
/// `handle` is live and bound to a live stream; A, B and C are device memory of the extents the
/// shape and leading dimensions imply, valid until the GEMM completes on that stream.
pub unsafe fn gemm_ex(
    function: GemmExFn,
    call_name: &'static str,
    handle: HipblasHandle,
    types: GemmTypes,
    call: &GemmCall,
) -> Result<(), HipError> {
    let alpha = call.alpha;
    let beta = call.beta;
    // Safety: the caller's contract; alpha and beta live on this stack frame for the call
    // (hipBLAS reads host scalars before returning in the default host pointer mode).
    check(call_name, unsafe {
        function(
            handle,
            call.op_a,
            call.op_b,
            call.m,
            call.n,
            call.k,
            (&alpha as *const f32).cast(),
            call.a,
            types.matrix,
            call.lda,
            call.b,
            types.matrix,
            call.ldb,
            (&beta as *const f32).cast(),
            call.c,
            types.matrix,
            call.ldc,
            types.compute,
            GEMM_DEFAULT,
        )
    })
}
