//! hipBLAS: its function table, and the two type conventions of `hipblasGemmEx`.
//!
//! Where the values come from (public ROCm headers, read with the project's search tool):
//! - `hipblasOperation_t` (`HIPBLAS_OP_N` 111, `HIPBLAS_OP_T` 112), `hipblasGemmAlgo_t`
//!   (`HIPBLAS_GEMM_DEFAULT` 160) and the legacy `hipblasDatatype_t` (`HIPBLAS_R_32F` 151,
//!   `HIPBLAS_R_16B` 168): `ROCm/hipBLAS` `library/include/hipblas.h` (hipBLAS 0.x-2.x).
//! - `hipblasComputeType_t` (`HIPBLAS_COMPUTE_32F` 2): `hipblas-common.h` (hipBLAS 2.x and
//!   3.x share it).
//! - `hipDataType` (`HIP_R_32F` 0, `HIP_R_16BF` 14): HIP's `library_types.h`.
//!
//! The conventions: hipBLAS before 2.0 (ROCm 5.x) has only `hipblasGemmEx` taking
//! `hipblasDatatype_t` for the matrix and compute types. hipBLAS 2.x (ROCm 6.x) keeps that
//! function and adds `hipblasGemmEx_v2` taking `hipDataType` and `hipblasComputeType_t`. hipBLAS
//! 3.0 (ROCm 7) removed `hipblasDatatype_t`: `hipblasGemmEx` itself takes the new types. The two
//! enum ranges do not overlap (150-169 against 0-33 and 0-10), so a call with the wrong
//! convention is refused (`HIPBLAS_STATUS_INVALID_ENUM` / `NOT_SUPPORTED`), never misread:
//! the backend picks `_v2` when exported, and otherwise probes both conventions with a 1x1x1
//! GEMM whose result it checks (`safe::blas`).

use std::ffi::{c_int, c_void};

use super::hip::table;
use super::{HipStream, HipblasHandle, LibrarySearch, Loaded};
use crate::error::HipError;

/// File names of hipBLAS, newest first after the unversioned development link.
pub const NAMES: &[&str] =
    &["libhipblas.so", "libhipblas.so.3", "libhipblas.so.2", "libhipblas.so.1", "libhipblas.so.0"];

/// `hipblasStatus_t`.
pub type HipblasStatus = c_int;

/// `HIPBLAS_OP_N`.
pub const OP_N: c_int = 111;
/// `HIPBLAS_OP_T`.
pub const OP_T: c_int = 112;
/// `HIPBLAS_GEMM_DEFAULT`.
pub const GEMM_DEFAULT: c_int = 160;
/// Legacy `hipblasDatatype_t` `HIPBLAS_R_32F`.
pub const LEGACY_R_32F: c_int = 151;
/// Legacy `hipblasDatatype_t` `HIPBLAS_R_16B` (bf16).
pub const LEGACY_R_16B: c_int = 168;
/// `hipDataType` `HIP_R_16BF`.
pub const HIP_R_16BF: c_int = 14;
/// `hipblasComputeType_t` `HIPBLAS_COMPUTE_32F`.
pub const COMPUTE_32F: c_int = 2;

/// `hipblasGemmEx` and its `_v2` twin: both take plain C enums (`int`) for the types; only the
/// values differ between the conventions.
pub type GemmExFn = unsafe extern "C" fn(
    HipblasHandle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
) -> HipblasStatus;

/// `hipblasGemmStridedBatchedEx` and its `_v2` twin (strides are `hipblasStride`, `int64_t`).
pub type GemmStridedBatchedExFn = unsafe extern "C" fn(
    HipblasHandle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    i64,
    *const c_void,
    c_int,
    c_int,
    i64,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    i64,
    c_int,
    c_int,
    c_int,
) -> HipblasStatus;

/// hipBLAS's functions, resolved once.
#[derive(Clone, Copy)]
#[allow(missing_docs, non_snake_case)] // each field is the C function of the same name
pub struct HipblasFns {
    pub hipblasCreate: unsafe extern "C" fn(*mut HipblasHandle) -> HipblasStatus,
    pub hipblasDestroy: unsafe extern "C" fn(HipblasHandle) -> HipblasStatus,
    pub hipblasSetStream: unsafe extern "C" fn(HipblasHandle, HipStream) -> HipblasStatus,
    pub hipblasGemmEx: GemmExFn,
}

/// The loaded hipBLAS.
pub struct HipblasLib {
    /// Where it was loaded from.
    pub origin: String,
    /// Its required functions.
    pub fns: HipblasFns,
    /// `hipblasGemmEx_v2` (hipBLAS 2.x only).
    pub gemm_ex_v2: Option<GemmExFn>,
    /// `hipblasGemmStridedBatchedEx`, when exported.
    pub gemm_strided_batched_ex: Option<GemmStridedBatchedExFn>,
    /// `hipblasGemmStridedBatchedEx_v2` (hipBLAS 2.x only).
    pub gemm_strided_batched_ex_v2: Option<GemmStridedBatchedExFn>,
}

impl HipblasLib {
    /// Finds and loads hipBLAS.
    pub fn load(search: &LibrarySearch) -> Result<HipblasLib, HipError> {
        let loaded: Loaded = super::load("libhipblas", NAMES, search)?;
        let fns = table!(loaded, HipblasFns { hipblasCreate, hipblasDestroy, hipblasSetStream, hipblasGemmEx });
        // Safety: the types are the C declarations (`GemmExFn`, `GemmStridedBatchedExFn`).
        let (gemm_ex_v2, gemm_strided_batched_ex, gemm_strided_batched_ex_v2) = unsafe {
            (
                super::resolve_optional::<GemmExFn>(&loaded, "hipblasGemmEx_v2"),
                super::resolve_optional::<GemmStridedBatchedExFn>(&loaded, "hipblasGemmStridedBatchedEx"),
                super::resolve_optional::<GemmStridedBatchedExFn>(&loaded, "hipblasGemmStridedBatchedEx_v2"),
            )
        };
        Ok(HipblasLib { origin: loaded.origin, fns, gemm_ex_v2, gemm_strided_batched_ex, gemm_strided_batched_ex_v2 })
    }
}
