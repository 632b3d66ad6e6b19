//! [`BlasHandle`]: a hipBLAS handle bound to a stream, with the `GemmEx` convention of the
//! installed hipBLAS (`sys::hipblas` explains the two), destroyed on drop.

use std::ffi::c_void;

use super::memory::DeviceBuffer;
use super::stream::Stream;
use super::Device;
use crate::error::HipError;
use crate::result;
use crate::result::hipblas::{GemmCall, GemmTypes};
use crate::sys::hip::{MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE};
use crate::sys::hipblas::{
    GemmExFn, HipblasFns, HipblasLib, COMPUTE_32F, HIP_R_16BF, LEGACY_R_16B, LEGACY_R_32F, OP_N,
};
use crate::sys::HipblasHandle;

/// Which `GemmEx` function and type values this hipBLAS takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmConvention {
    /// hipBLAS 2.x: `hipblasGemmEx_v2` with `hipDataType` / `hipblasComputeType_t`.
    V2Symbol,
    /// hipBLAS before 2.0: `hipblasGemmEx` with `hipblasDatatype_t`.
    Legacy,
    /// hipBLAS 3.x: `hipblasGemmEx` with `hipDataType` / `hipblasComputeType_t`.
    Unified,
}

impl GemmConvention {
    /// The type values for bf16 matrices and fp32 compute.
    pub fn types(self) -> GemmTypes {
        match self {
            GemmConvention::Legacy => GemmTypes { matrix: LEGACY_R_16B, compute: LEGACY_R_32F },
            GemmConvention::V2Symbol | GemmConvention::Unified => {
                GemmTypes { matrix: HIP_R_16BF, compute: COMPUTE_32F }
            }
        }
    }
}

/// A hipBLAS handle.
pub struct BlasHandle {
    device: Device,
    fns: HipblasFns,
    gemm_ex_v2: Option<GemmExFn>,
    raw: HipblasHandle,
    convention: GemmConvention,
    origin: String,
}

// Safety: hipBLAS handles may be used from any thread, one at a time (`&mut self` for use).
unsafe impl Send for BlasHandle {}

impl BlasHandle {
    /// Creates a handle on `stream` and finds the `GemmEx` convention: `_v2` when exported,
    /// otherwise the legacy and the unified conventions in turn, each tried on a 1x1x1 GEMM
    /// (1 x 2 = 2 in bf16) whose result is read back and checked.
    pub fn new(device: &Device, lib: &HipblasLib, stream: &Stream) -> Result<Self, HipError> {
        let raw = result::hipblas::create(&lib.fns)?;
        let mut handle = BlasHandle {
            device: device.clone(),
            fns: lib.fns,
            gemm_ex_v2: lib.gemm_ex_v2,
            raw,
            convention: GemmConvention::Legacy,
            origin: lib.origin.clone(),
        };
        handle.set_stream(stream)?;
        let candidates: &[GemmConvention] = if lib.gemm_ex_v2.is_some() {
            &[GemmConvention::V2Symbol]
        } else {
            &[GemmConvention::Legacy, GemmConvention::Unified]
        };
        let mut failures = Vec::new();
        for &candidate in candidates {
            handle.convention = candidate;
            match handle.probe(stream) {
                Ok(()) => return Ok(handle),
                Err(error) => failures.push(format!("{candidate:?}: {error}")),
            }
        }
        Err(HipError::Unsupported(format!(
            "{}: no GemmEx convention computed a 1x1x1 bf16 GEMM correctly ({}); this hipBLAS is not supported",
            handle.origin,
            failures.join("; ")
        )))
    }

    /// The convention in use.
    pub fn convention(&self) -> GemmConvention {
        self.convention
    }

    /// Makes later GEMMs run on `stream`.
    pub fn set_stream(&mut self, stream: &Stream) -> Result<(), HipError> {
        // Safety: both live.
        unsafe { result::hipblas::set_stream(&self.fns, self.raw, stream.raw()) }
    }

    /// Enqueues `call` (bf16 A, B, C; fp32 compute) on the handle's stream.
    ///
    /// # Safety
    /// As `result::hipblas::gemm_ex`.
    pub unsafe fn gemm(&mut self, call: &GemmCall) -> Result<(), HipError> {
        let (function, name) = match (self.convention, self.gemm_ex_v2) {
            (GemmConvention::V2Symbol, Some(v2)) => (v2, "hipblasGemmEx_v2"),
            _ => (self.fns.hipblasGemmEx, "hipblasGemmEx"),
        };
        // Safety: the caller's contract.
        unsafe { result::hipblas::gemm_ex(function, name, self.raw, self.convention.types(), call) }
    }

    fn probe(&mut self, stream: &Stream) -> Result<(), HipError> {
        let hip = *self.device.hip();
        // bf16 1.0, 2.0 and a C to be overwritten.
        let input: [u16; 3] = [0x3f80, 0x4000, 0xffff];
        let buffer = DeviceBuffer::new(&self.device, 6)?;
        let base = buffer.base() as *mut u8;
        // Safety: 6 bytes of device memory we own, copied from a 6-byte host array.
        unsafe { result::memory::copy(&hip, base.cast(), input.as_ptr().cast(), 6, MEMCPY_HOST_TO_DEVICE)? };
        let call = GemmCall {
            op_a: OP_N,
            op_b: OP_N,
            m: 1,
            n: 1,
            k: 1,
            a: base.cast::<c_void>(),
            lda: 1,
            // Safety (of the offsets): within the 6 bytes.
            b: base.wrapping_add(2).cast::<c_void>(),
            ldb: 1,
            c: base.wrapping_add(4).cast::<c_void>(),
            ldc: 1,
            alpha: 1.0,
            beta: 0.0,
        };
        // Safety: A, B, C are 1x1 bf16 in the buffer above, which outlives the synchronize below.
        unsafe { self.gemm(&call)? };
        stream.synchronize()?;
        let mut output = [0u16; 3];
        // Safety: as the upload, the other way.
        unsafe {
            result::memory::copy(&hip, output.as_mut_ptr().cast(), base.cast_const().cast(), 6, MEMCPY_DEVICE_TO_HOST)?
        };
        if output[2] != 0x4000 {
            return Err(HipError::Unsupported(format!(
                "the probe GEMM returned bf16 bits {:#06x}, expected 0x4000 (2.0)",
                output[2]
            )));
        }
        Ok(())
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // Safety: created in `new`, destroyed once, here.
        if let Err(error) = unsafe { result::hipblas::destroy(&self.fns, self.raw) } {
            self.device.defer(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_convention_passes_bf16_matrices_and_fp32_compute_in_its_own_enum() {
        assert_eq!(GemmConvention::Legacy.types(), GemmTypes { matrix: 168, compute: 151 });
        assert_eq!(GemmConvention::V2Symbol.types(), GemmTypes { matrix: 14, compute: 2 });
        assert_eq!(GemmConvention::Unified.types(), GemmConvention::V2Symbol.types());
    }
}
