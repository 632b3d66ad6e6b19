//! cuDNN's backend (graph) API through bindings of our own ([`Api`]: every status a raw `u32`,
//! read as [`CudnnStatus`]; the argument enums of cudarc's `cudnn` sys layer) and a small safe
//! layer (cudarc has no safe wrapper for graphs).
//!
//! - [`Descriptor`] owns one backend descriptor and destroys it on drop; every attribute is set
//!   through a typed setter, and every status is checked and turned into an error that names the
//!   descriptor, the attribute and cuDNN's own last error string.
//! - [`Builder`] is [`GraphBuilder`] on real descriptors; [`Plan`] runs the engine heuristics
//!   (mode A, then the fallback list), tries each engine configuration once, at most
//!   [`MAX_ENGINE_CONFIGS`], until one finalizes, and executes with a variant pack on the
//!   handle's stream.
//! - [`Cudnn`] is the library: loaded once (missing: an error, never a panic), its version read
//!   with `cudnnGetVersion`, one handle (the first failed `cudnnCreate` ends the attempt), the
//!   plans and the refusals cached per (pass, shape) for the run; the per-version rules
//!   ([`stats_layout`], [`mask_fill`], [`refusal`]) decide what cuDNN is asked.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use cudarc::cudnn::sys;
use sys::cudnnBackendAttributeName_t as Attr;
use sys::cudnnBackendAttributeType_t as Type;
use sys::cudnnBackendDescriptorType_t as Kind;

use super::graph::{
    backward_composite, forward_composite, forward_fused, BackwardForm, DataType, GraphBuilder, GraphId, OpId,
    Operation, PointwiseMode, ReduceOp, Shape, StatsLayout, Tensor, Uid, ALIGNMENT,
};
use crate::error::{CudaError, CudnnStatus};

/// The first cuDNN this path uses (the composite graphs as the frontend builds them,
/// `cudnnGetLastErrorString`).
pub(crate) const MIN_VERSION: usize = 9_00_00;
/// The first cuDNN whose fused forward takes a causal mask.
pub(crate) const FUSED_VERSION: usize = 9_21_00;
/// The first cuDNN whose masks may fill with -inf; below it the frontend fills with the lowest
/// finite f32 (`utils/attn_score_modifiers.h`: "older cuDNN version prefers lowest").
pub(crate) const NEG_INF_VERSION: usize = 9_10_00;
/// The first cuDNN whose forward honours the declared strides of the statistics it writes
/// (issue 41's reading of cudnn-frontend 1.23).
pub(crate) const FORWARD_STATS_STRIDES_VERSION: usize = 9_12_00;
/// The first cuDNN to which the frontend hands non-packed (B, H, S, 1) statistics for the
/// backward (below it some backward paths read packed head-major statistics whatever the
/// strides say: the result would be wrong gradients, not an error; issue 41).
pub(crate) const BACKWARD_STATS_STRIDES_VERSION: usize = 9_26_00;
/// The bf16/f16 backward the frontend refuses "due to known bugs" (cuDNN 9.10.0 and 9.10.1).
pub(crate) const BAD_BACKWARD_VERSIONS: [usize; 2] = [9_10_00, 9_10_01];
/// The last cuDNN for which the frontend gives a backward with `s_kv % 128 != 0` a padding mask
/// with sequence-length tensors (its "workaround padding mask"); we refuse such shapes instead.
pub(crate) const PADDED_BACKWARD_LAST_VERSION: usize = 9_15_00;
/// At most this many engine configurations are tried for one graph (heuristics mode A's, then
/// the fallback list's, duplicates skipped).
pub(crate) const MAX_ENGINE_CONFIGS: usize = 12;

/// `9.21.0` from `92100` (cuDNN 9 encodes major * 10000 + minor * 100 + patch); `8.9.7` from
/// `8907` (cuDNN 8 and older: major * 1000 + minor * 100 + patch).
pub(crate) fn version_text(version: usize) -> String {
    if version < 10_000 {
        format!("{}.{}.{}", version / 1000, version / 100 % 10, version % 100)
    } else {
        format!("{}.{}.{}", version / 10_000, version / 100 % 100, version % 100)
    }
}

/// The statistics (LSE) layout `pass` gives cuDNN `version`: head-major (cuDNN's packed
/// (B, H, S, 1), transposed from or to the plan's token-major LSE on every launch) unless the
/// version reads or writes the plan's token-major strides correctly: the forward from
/// [`FORWARD_STATS_STRIDES_VERSION`], the backward from [`BACKWARD_STATS_STRIDES_VERSION`].
pub(crate) fn stats_layout(version: usize, pass: Pass) -> StatsLayout {
    let first = match pass {
        Pass::Forward { .. } => FORWARD_STATS_STRIDES_VERSION,
        Pass::Backward(_) => BACKWARD_STATS_STRIDES_VERSION,
    };
    if version >= first {
        StatsLayout::TokenMajor
    } else {
        StatsLayout::HeadMajor
    }
}

/// The value masked scores take on cuDNN `version`: -inf from [`NEG_INF_VERSION`], else
/// `f32::MIN` (the frontend's `lowest()`).
pub(crate) fn mask_fill(version: usize) -> f32 {
    if version >= NEG_INF_VERSION {
        f32::NEG_INFINITY
    } else {
        f32::MIN
    }
}

/// Why cuDNN `version` must not be asked for `pass` on `shape` (a known-bad version, or a shape
/// the frontend only runs with a workaround we do not build), or nothing.
pub(crate) fn refusal(version: usize, pass: Pass, shape: &Shape) -> Option<String> {
    let Pass::Backward(_) = pass else { return None };
    if BAD_BACKWARD_VERSIONS.contains(&version) {
        return Some(format!(
            "cuDNN {} has a known-bad bf16/f16 attention backward (cudnn-frontend refuses 9.10.0 and 9.10.1; \
             9.10.2 or newer works)",
            version_text(version)
        ));
    }
    if version <= PADDED_BACKWARD_LAST_VERSION && shape.seq % 128 != 0 {
        return Some(format!(
            "cuDNN {} needs a padding mask with sequence-length tensors for a backward whose key length ({}) is \
             not a multiple of 128 (cudnn-frontend's workaround up to 9.15.0, not built here); 9.15.1 or newer \
             runs it",
            version_text(version),
            shape.seq
        ));
    }
    None
}

/// cuDNN's functions as we call them: every status a raw `u32` ([`CudnnStatus`]), never
/// cudarc's `cudnnStatus_t` enum (a status our headers do not list would make that undefined
/// behaviour). Arguments keep cudarc's enums: we only pass values they list.
struct Api {
    create: unsafe extern "C" fn(*mut sys::cudnnHandle_t) -> u32,
    destroy: unsafe extern "C" fn(sys::cudnnHandle_t) -> u32,
    set_stream: unsafe extern "C" fn(sys::cudnnHandle_t, sys::cudaStream_t) -> u32,
    last_error: unsafe extern "C" fn(*mut c_char, usize),
    create_descriptor: unsafe extern "C" fn(Kind, *mut sys::cudnnBackendDescriptor_t) -> u32,
    destroy_descriptor: unsafe extern "C" fn(sys::cudnnBackendDescriptor_t) -> u32,
    set_attribute: unsafe extern "C" fn(sys::cudnnBackendDescriptor_t, Attr, Type, i64, *const c_void) -> u32,
    get_attribute: unsafe extern "C" fn(sys::cudnnBackendDescriptor_t, Attr, Type, i64, *mut i64, *mut c_void) -> u32,
    finalize: unsafe extern "C" fn(sys::cudnnBackendDescriptor_t) -> u32,
    execute:
        unsafe extern "C" fn(sys::cudnnHandle_t, sys::cudnnBackendDescriptor_t, sys::cudnnBackendDescriptor_t) -> u32,
}

/// The library, loaded once per process and kept loaded (the functions of [`Api`] point into it).
struct Library {
    library: libloading::Library,
    version: usize,
}

/// The file names tried, in order (the dynamic linker's search: `LD_LIBRARY_PATH`, the cache).
const LIBRARY_NAMES: [&str; 2] = ["libcudnn.so.9", "libcudnn.so"];

fn library() -> Result<&'static Library, CudaError> {
    static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();
    let loaded = LIBRARY.get_or_init(|| {
        let mut failures = Vec::new();
        for name in LIBRARY_NAMES {
            // Safety: loading cuDNN runs its initialisers, which have no preconditions on us;
            // the library stays loaded for the process (a static).
            match unsafe { libloading::Library::new(name) } {
                Ok(library) => {
                    // Safety: `size_t cudnnGetVersion(void)` in every cuDNN.
                    let get = unsafe { library.get::<unsafe extern "C" fn() -> usize>(b"cudnnGetVersion\0") }
                        .map_err(|e| format!("{name} has no cudnnGetVersion: {e}"))?;
                    // Safety: the signature above; no arguments.
                    let version = unsafe { get() };
                    return Ok(Library { library, version });
                }
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        Err(format!(
            "cuDNN (libcudnn.so.9) cannot be loaded: install it or put its folder (PyTorch's \
             site-packages/nvidia/cudnn/lib) on LD_LIBRARY_PATH ({})",
            failures.first().map_or("", String::as_str)
        ))
    });
    loaded.as_ref().map_err(|why| CudaError::CudnnUnavailable(why.clone()))
}

/// The functions of [`Api`], resolved once (after the version was found to be at least
/// [`MIN_VERSION`], so every one of them exists).
fn api() -> Result<&'static Api, CudaError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    let library = library()?;
    let resolved = API.get_or_init(|| {
        fn get<T: Copy>(library: &libloading::Library, name: &str) -> Result<T, String> {
            let symbol = format!("{name}\0");
            // Safety: every call site names the C signature of `name` in cuDNN 9's headers
            // (statuses as u32, the enums of cudarc's sys layer for the enum arguments); the
            // library stays loaded for the process.
            unsafe { library.get::<T>(symbol.as_bytes()) }.map(|s| *s).map_err(|e| format!("lacks {name}: {e}"))
        }
        let l = &library.library;
        Ok(Api {
            create: get(l, "cudnnCreate")?,
            destroy: get(l, "cudnnDestroy")?,
            set_stream: get(l, "cudnnSetStream")?,
            last_error: get(l, "cudnnGetLastErrorString")?,
            create_descriptor: get(l, "cudnnBackendCreateDescriptor")?,
            destroy_descriptor: get(l, "cudnnBackendDestroyDescriptor")?,
            set_attribute: get(l, "cudnnBackendSetAttribute")?,
            get_attribute: get(l, "cudnnBackendGetAttribute")?,
            finalize: get(l, "cudnnBackendFinalize")?,
            execute: get(l, "cudnnBackendExecute")?,
        })
    });
    resolved
        .as_ref()
        .map_err(|why| CudaError::CudnnUnavailable(format!("cuDNN {}: {why}", version_text(library.version))))
}

/// cuDNN's last error message (cuDNN 9 keeps one per thread), or nothing.
fn last_error() -> String {
    let Ok(api) = api() else { return String::new() };
    let mut buffer = [0 as c_char; 512];
    // Safety: the buffer holds 512 chars and cuDNN writes at most `max_size` including the
    // terminating zero.
    unsafe { (api.last_error)(buffer.as_mut_ptr(), buffer.len()) };
    buffer[buffer.len() - 1] = 0;
    // Safety: zero-terminated within the buffer (the last byte is zero).
    unsafe { std::ffi::CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().trim().to_string()
}

/// `status` of `call` as a result, the error naming `what`.
fn check(status: u32, call: &'static str, what: impl FnOnce() -> String) -> Result<(), CudaError> {
    let status = CudnnStatus(status);
    if status == CudnnStatus::SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Cudnn { call, what: what(), status, message: last_error() })
    }
}

/// One backend descriptor, destroyed on drop.
pub(crate) struct Descriptor {
    raw: sys::cudnnBackendDescriptor_t,
    /// What it is, for errors (the descriptor type and, for tensors, the tensor's name).
    name: String,
}

impl Descriptor {
    fn new(kind: Kind, name: impl Into<String>) -> Result<Self, CudaError> {
        let api = api()?;
        let name = name.into();
        let mut raw: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // Safety: `raw` is a valid out-pointer; `kind` a descriptor type of the loaded library's
        // header version (the sys layer's enum).
        let status = unsafe { (api.create_descriptor)(kind, &mut raw) };
        check(status, "cudnnBackendCreateDescriptor", || format!("{kind:?} ({name})"))?;
        Ok(Descriptor { raw, name })
    }

    /// Sets `attr` to `values` of attribute type `ty`.
    ///
    /// # Safety
    /// `T` must be the C type cuDNN reads for `ty` (i64 for INT64, the enum for its enum types,
    /// `bool` for BOOLEAN, f32 for FLOAT, a descriptor or handle pointer, a `void*`).
    unsafe fn set<T>(&self, attr: Attr, ty: Type, values: &[T]) -> Result<(), CudaError> {
        let api = api()?;
        let count = i64::try_from(values.len()).map_err(|_| CudaError::Graph("too many attribute values".into()))?;
        // Safety: `values` is `count` valid elements of the type `ty` names (this function's
        // contract); cuDNN copies them before returning.
        let status = unsafe { (api.set_attribute)(self.raw, attr, ty, count, values.as_ptr().cast()) };
        check(status, "cudnnBackendSetAttribute", || format!("{} ({attr:?})", self.name))
    }

    fn set_i64(&self, attr: Attr, values: &[i64]) -> Result<(), CudaError> {
        // Safety: INT64 is read as i64.
        unsafe { self.set(attr, Type::CUDNN_TYPE_INT64, values) }
    }

    fn set_f32(&self, attr: Attr, value: f32) -> Result<(), CudaError> {
        // Safety: FLOAT is read as f32.
        unsafe { self.set(attr, Type::CUDNN_TYPE_FLOAT, &[value]) }
    }

    fn set_bool(&self, attr: Attr, value: bool) -> Result<(), CudaError> {
        // Safety: BOOLEAN is read as a C `bool` (one byte), which Rust's `bool` is.
        unsafe { self.set(attr, Type::CUDNN_TYPE_BOOLEAN, &[value]) }
    }

    fn set_data_type(&self, attr: Attr, dtype: DataType) -> Result<(), CudaError> {
        let value = match dtype {
            DataType::Bf16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
            DataType::F32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            DataType::I32 => sys::cudnnDataType_t::CUDNN_DATA_INT32,
            DataType::Bool => sys::cudnnDataType_t::CUDNN_DATA_BOOLEAN,
        };
        // Safety: DATA_TYPE is read as cudnnDataType_t.
        unsafe { self.set(attr, Type::CUDNN_TYPE_DATA_TYPE, &[value]) }
    }

    fn set_pointwise_mode(&self, attr: Attr, mode: PointwiseMode) -> Result<(), CudaError> {
        use sys::cudnnPointwiseMode_t as M;
        let value = match mode {
            PointwiseMode::Add => M::CUDNN_POINTWISE_ADD,
            PointwiseMode::Sub => M::CUDNN_POINTWISE_SUB,
            PointwiseMode::Mul => M::CUDNN_POINTWISE_MUL,
            PointwiseMode::Div => M::CUDNN_POINTWISE_DIV,
            PointwiseMode::Exp => M::CUDNN_POINTWISE_EXP,
            PointwiseMode::Log => M::CUDNN_POINTWISE_LOG,
            PointwiseMode::CmpGe => M::CUDNN_POINTWISE_CMP_GE,
            PointwiseMode::BinarySelect => M::CUDNN_POINTWISE_BINARY_SELECT,
            PointwiseMode::Identity => M::CUDNN_POINTWISE_IDENTITY,
            PointwiseMode::GenIndex => M::CUDNN_POINTWISE_GEN_INDEX,
        };
        // Safety: POINTWISE_MODE is read as cudnnPointwiseMode_t.
        unsafe { self.set(attr, Type::CUDNN_TYPE_POINTWISE_MODE, &[value]) }
    }

    fn set_descriptors(&self, attr: Attr, descriptors: &[&Descriptor]) -> Result<(), CudaError> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = descriptors.iter().map(|d| d.raw).collect();
        // Safety: BACKEND_DESCRIPTOR is read as cudnnBackendDescriptor_t, each a live descriptor.
        unsafe { self.set(attr, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw) }
    }

    fn set_handle(&self, attr: Attr, handle: sys::cudnnHandle_t) -> Result<(), CudaError> {
        // Safety: HANDLE is read as cudnnHandle_t, a live handle.
        unsafe { self.set(attr, Type::CUDNN_TYPE_HANDLE, &[handle]) }
    }

    fn finalize(&self) -> Result<(), CudaError> {
        let api = api()?;
        // Safety: a live descriptor.
        check(unsafe { (api.finalize)(self.raw) }, "cudnnBackendFinalize", || self.name.clone())
    }

    /// Reads up to `out.len()` values of `attr` (attribute type `ty`) into `out`; returns how
    /// many cuDNN has (which may be more than it wrote). With an empty `out`: only the count.
    ///
    /// # Safety
    /// `T` must be the C type cuDNN writes for `ty`, as for [`Descriptor::set`]; for
    /// BACKEND_DESCRIPTOR, live descriptors of the type the attribute holds.
    unsafe fn get<T>(&self, attr: Attr, ty: Type, out: &mut [T]) -> Result<usize, CudaError> {
        let api = api()?;
        let requested = i64::try_from(out.len()).map_err(|_| CudaError::Graph("too many attribute values".into()))?;
        let mut count = 0i64;
        let pointer = if out.is_empty() { std::ptr::null_mut() } else { out.as_mut_ptr().cast() };
        // Safety: `out` holds `requested` elements of the type `ty` names (this function's
        // contract), or none and a null pointer (a count query); `count` is a live local.
        let status = unsafe { (api.get_attribute)(self.raw, attr, ty, requested, &mut count, pointer) };
        check(status, "cudnnBackendGetAttribute", || format!("{} ({attr:?})", self.name))?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    fn get_i64(&self, attr: Attr) -> Result<i64, CudaError> {
        let mut value = [0i64];
        // Safety: INT64 is written as i64.
        unsafe { self.get(attr, Type::CUDNN_TYPE_INT64, &mut value) }?;
        Ok(value[0])
    }
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // Safety: `raw` was created by cudnnBackendCreateDescriptor (so the library is
            // loaded) and is destroyed once; a failure has nowhere to go.
            let _ = unsafe { (api.destroy_descriptor)(self.raw) };
        }
    }
}

/// [`GraphBuilder`] on cuDNN descriptors. Keeps every descriptor it made alive (operations refer
/// to tensors and to their mode descriptors; plans to graphs).
pub(crate) struct Builder {
    handle: sys::cudnnHandle_t,
    tensors: HashMap<Uid, (Tensor, Descriptor)>,
    /// Mode descriptors (pointwise, matmul, reduction) the operations refer to.
    modes: Vec<Descriptor>,
    operations: Vec<Descriptor>,
    graphs: Vec<Descriptor>,
}

impl Builder {
    fn new(handle: sys::cudnnHandle_t) -> Self {
        Builder { handle, tensors: HashMap::new(), modes: Vec::new(), operations: Vec::new(), graphs: Vec::new() }
    }

    fn tensor_descriptor(&self, uid: Uid) -> Result<&Descriptor, CudaError> {
        self.tensors
            .get(&uid)
            .map(|(_, d)| d)
            .ok_or_else(|| CudaError::Graph(format!("tensor {uid} used before it is declared")))
    }

    /// Sets each (attribute, tensor uid) of `op`.
    fn set_tensors(&self, op: &Descriptor, tensors: &[(Attr, Uid)]) -> Result<(), CudaError> {
        for &(attr, uid) in tensors {
            op.set_descriptors(attr, &[self.tensor_descriptor(uid)?])?;
        }
        Ok(())
    }

    fn mode(
        &mut self,
        kind: Kind,
        name: &str,
        set: impl FnOnce(&Descriptor) -> Result<(), CudaError>,
    ) -> Result<usize, CudaError> {
        let descriptor = Descriptor::new(kind, name)?;
        set(&descriptor)?;
        descriptor.finalize()?;
        self.modes.push(descriptor);
        Ok(self.modes.len() - 1)
    }

    /// The non-virtual tensors (the variant pack's uids), by value or in memory.
    fn pack_tensors(&self) -> Vec<Tensor> {
        let mut tensors: Vec<Tensor> = self.tensors.values().map(|(t, _)| *t).filter(|t| !t.is_virtual).collect();
        tensors.sort_by_key(|t| t.uid);
        tensors
    }
}

impl GraphBuilder for Builder {
    type Error = CudaError;

    fn tensor(&mut self, t: &Tensor) -> Result<(), CudaError> {
        if self.tensors.contains_key(&t.uid) {
            return Err(CudaError::Graph(format!("tensor uid {} ({}) declared twice", t.uid, t.name)));
        }
        let d = Descriptor::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR, format!("tensor {} ({})", t.uid, t.name))?;
        d.set_data_type(Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, t.dtype)?;
        d.set_i64(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, &t.dims)?;
        d.set_i64(Attr::CUDNN_ATTR_TENSOR_STRIDES, &t.strides)?;
        d.set_i64(Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[t.uid])?;
        d.set_i64(Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[ALIGNMENT])?;
        if t.is_virtual {
            d.set_bool(Attr::CUDNN_ATTR_TENSOR_IS_VIRTUAL, true)?;
        }
        if t.by_value {
            d.set_bool(Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE, true)?;
        }
        d.finalize()?;
        self.tensors.insert(t.uid, (*t, d));
        Ok(())
    }

    fn operation(&mut self, op: &Operation) -> Result<OpId, CudaError> {
        let index = self.operations.len();
        let descriptor = match *op {
            Operation::Pointwise { mode, x, b, t, y, axis, precision } => {
                let pw =
                    self.mode(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &format!("pointwise {}", mode.name()), |d| {
                        d.set_pointwise_mode(Attr::CUDNN_ATTR_POINTWISE_MODE, mode)?;
                        d.set_data_type(Attr::CUDNN_ATTR_POINTWISE_MATH_PREC, precision)?;
                        if let Some(axis) = axis {
                            d.set_i64(Attr::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
                        }
                        Ok(())
                    })?;
                let d = Descriptor::new(
                    Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                    format!("operation {index} (pointwise {})", mode.name()),
                )?;
                d.set_descriptors(Attr::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&self.modes[pw]])?;
                self.set_tensors(&d, &[(Attr::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)])?;
                if let Some(b) = b {
                    self.set_tensors(&d, &[(Attr::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b)])?;
                }
                if let Some(t) = t {
                    self.set_tensors(&d, &[(Attr::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t)])?;
                }
                self.set_tensors(&d, &[(Attr::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)])?;
                d.set_f32(Attr::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1.0)?;
                d.set_f32(Attr::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1.0)?;
                d
            }
            Operation::Matmul { a, b, c } => {
                let mm = self.mode(Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul", |d| {
                    d.set_data_type(Attr::CUDNN_ATTR_MATMUL_COMP_TYPE, DataType::F32)
                })?;
                let d = Descriptor::new(
                    Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
                    format!("operation {index} (matmul)"),
                )?;
                self.set_tensors(
                    &d,
                    &[
                        (Attr::CUDNN_ATTR_OPERATION_MATMUL_ADESC, a),
                        (Attr::CUDNN_ATTR_OPERATION_MATMUL_BDESC, b),
                        (Attr::CUDNN_ATTR_OPERATION_MATMUL_CDESC, c),
                    ],
                )?;
                d.set_descriptors(Attr::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&self.modes[mm]])?;
                d
            }
            Operation::Reduction { op: reduce, x, y } => {
                let red = self.mode(Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction", |d| {
                    d.set_data_type(Attr::CUDNN_ATTR_REDUCTION_COMP_TYPE, DataType::F32)?;
                    let value = match reduce {
                        ReduceOp::Max => sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX,
                        ReduceOp::Add => sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD,
                    };
                    // Safety: REDUCTION_OPERATOR_TYPE is read as cudnnReduceTensorOp_t.
                    unsafe {
                        d.set(Attr::CUDNN_ATTR_REDUCTION_OPERATOR, Type::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &[value])
                    }
                })?;
                let d = Descriptor::new(
                    Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                    format!("operation {index} (reduction)"),
                )?;
                d.set_descriptors(Attr::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&self.modes[red]])?;
                self.set_tensors(
                    &d,
                    &[(Attr::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x), (Attr::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)],
                )?;
                d
            }
            Operation::Reshape { x, y } => {
                let d = Descriptor::new(
                    Kind::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
                    format!("operation {index} (reshape)"),
                )?;
                self.set_tensors(
                    &d,
                    &[(Attr::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x), (Attr::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y)],
                )?;
                d
            }
            Operation::DiagonalBandMask { x, fill, y } => {
                let d = Descriptor::new(
                    Kind::CUDNN_BACKEND_OPERATION_DIAGONAL_BAND_MASK_DESCRIPTOR,
                    format!("operation {index} (diagonal band mask)"),
                )?;
                self.set_tensors(
                    &d,
                    &[
                        (Attr::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_XDESC, x),
                        (Attr::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_BDESC, fill),
                        (Attr::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_YDESC, y),
                    ],
                )?;
                d.set_pointwise_mode(
                    Attr::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_COMPARISON_MODE,
                    PointwiseMode::CmpGe,
                )?;
                d
            }
            Operation::Softmax { x, y, stats } => {
                let d = Descriptor::new(
                    Kind::CUDNN_BACKEND_OPERATION_SOFTMAX_DESCRIPTOR,
                    format!("operation {index} (softmax)"),
                )?;
                self.set_tensors(
                    &d,
                    &[
                        (Attr::CUDNN_ATTR_OPERATION_SOFTMAX_XDESC, x),
                        (Attr::CUDNN_ATTR_OPERATION_SOFTMAX_YDESC, y),
                        (Attr::CUDNN_ATTR_OPERATION_SOFTMAX_STATS_DESC, stats),
                    ],
                )?;
                d
            }
            Operation::SdpaForward { q, k, v, o, scale, softmax, mask, mask_input, mask_output } => {
                let d = Descriptor::new(
                    Kind::CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR,
                    format!("operation {index} (SDPA forward)"),
                )?;
                self.set_tensors(
                    &d,
                    &[
                        (Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q),
                        (Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k),
                        (Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v),
                        (Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o),
                        (Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale),
                    ],
                )?;
                let softmax = self
                    .operations
                    .get(softmax.0)
                    .ok_or_else(|| CudaError::Graph("SDPA forward: no such softmax operation".into()))?;
                d.set_descriptors(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_SOFTMAX_DESC, &[softmax])?;
                let mask = self
                    .graphs
                    .get(mask.0)
                    .ok_or_else(|| CudaError::Graph("SDPA forward: no such mask subgraph".into()))?;
                d.set_descriptors(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH, &[mask])?;
                d.set_i64(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH_INPUT_UID, &[mask_input])?;
                d.set_i64(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH_OUTPUT_UID, &[mask_output])?;
                d
            }
        };
        descriptor.finalize()?;
        self.operations.push(descriptor);
        Ok(OpId(index))
    }

    fn graph(&mut self, ops: &[OpId], main: bool) -> Result<GraphId, CudaError> {
        let index = self.graphs.len();
        let kind = if main { "graph" } else { "subgraph" };
        let d = Descriptor::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, format!("operation {kind} {index}"))?;
        let members: Vec<&Descriptor> = ops
            .iter()
            .map(|o| self.operations.get(o.0).ok_or_else(|| CudaError::Graph("graph of an unknown operation".into())))
            .collect::<Result<_, _>>()?;
        d.set_descriptors(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &members)?;
        if main {
            d.set_handle(Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, self.handle)?;
        }
        d.finalize()?;
        self.graphs.push(d);
        Ok(GraphId(index))
    }
}

/// One attention graph ready to run: its descriptors, the execution plan of the first engine
/// configuration that finalized, and that plan's workspace.
pub(crate) struct Plan {
    /// The graph's descriptors (kept alive for the plan).
    builder: Builder,
    plan: Descriptor,
    /// The engine configuration's index among those tried (duplicates skipped).
    pub engine: usize,
    /// Bytes of workspace the plan needs.
    pub workspace: u64,
}

/// Which graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pass {
    /// The forward, fused (true) or composite.
    Forward { fused: bool },
    /// The backward in a form.
    Backward(BackwardForm),
}

/// The engine configurations the heuristics in `mode` rank for `graph`, best first.
fn engine_configs(graph: &Descriptor, mode: sys::cudnnBackendHeurMode_t) -> Result<Vec<Descriptor>, CudaError> {
    let heuristics =
        Descriptor::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, format!("engine heuristics ({mode:?})"))?;
    heuristics.set_descriptors(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?;
    // Safety: HEUR_MODE is read as cudnnBackendHeurMode_t.
    unsafe { heuristics.set(Attr::CUDNN_ATTR_ENGINEHEUR_MODE, Type::CUDNN_TYPE_HEUR_MODE, &[mode]) }?;
    heuristics.finalize()?;
    let results = Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS;
    let descriptor = Type::CUDNN_TYPE_BACKEND_DESCRIPTOR;
    // Safety: a count query (no elements requested, a null array).
    let count = unsafe { heuristics.get::<sys::cudnnBackendDescriptor_t>(results, descriptor, &mut []) }?;
    if count == 0 {
        return Err(CudaError::CudnnRefused {
            what: heuristics.name.clone(),
            reason: "the heuristics found no engine for this graph".into(),
        });
    }
    let configs: Vec<Descriptor> = (0..count)
        .map(|i| {
            Descriptor::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, format!("engine configuration {i} ({mode:?})"))
        })
        .collect::<Result<_, _>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = configs.iter().map(|c| c.raw).collect();
    // Safety: `raw` holds `count` created engine-configuration descriptors for cuDNN to fill.
    let returned = unsafe { heuristics.get(results, descriptor, &mut raw) }?;
    let mut configs = configs;
    configs.truncate(returned);
    Ok(configs)
}

/// What identifies an engine configuration: its engine's global index and its knob choices
/// (type, value), as cuDNN reports them. Mode A's list and the fallback list overlap; two
/// configurations with the same key are the same kernel with the same settings.
fn config_key(config: &Descriptor) -> Result<(i64, Vec<(i32, i64)>), CudaError> {
    let engine = Descriptor::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR, format!("engine of {}", config.name))?;
    let descriptor = Type::CUDNN_TYPE_BACKEND_DESCRIPTOR;
    // Safety: one created engine descriptor for cuDNN to fill.
    unsafe { config.get(Attr::CUDNN_ATTR_ENGINECFG_ENGINE, descriptor, &mut [engine.raw]) }?;
    let index = engine.get_i64(Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
    let choices = Attr::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES;
    // As the frontend reads them: an array of created knob-choice descriptors at least as long
    // as the knob types cuDNN has (under 64), which cuDNN fills as far as it has choices.
    let count = 64;
    let knobs: Vec<Descriptor> = (0..count)
        .map(|i| Descriptor::new(Kind::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, format!("knob choice {i}")))
        .collect::<Result<_, _>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = knobs.iter().map(|k| k.raw).collect();
    // Safety: `raw` holds `count` created knob-choice descriptors for cuDNN to fill.
    let returned = unsafe { config.get(choices, descriptor, &mut raw) }?.min(count);
    let mut key = Vec::with_capacity(returned);
    for knob in &knobs[..returned] {
        // The knob's type is an enum in C: read as a plain i32, so that a type our headers do
        // not list is a number, not undefined behaviour.
        let mut kind = [0i32];
        // Safety: KNOB_TYPE is a C enum, an int.
        unsafe { knob.get(Attr::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, Type::CUDNN_TYPE_KNOB_TYPE, &mut kind) }?;
        key.push((kind[0], knob.get_i64(Attr::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)?));
    }
    key.sort_unstable();
    Ok((index, key))
}

/// The execution plan of one engine configuration, finalized, and its workspace bytes.
fn execution_plan(
    handle: sys::cudnnHandle_t,
    config: &Descriptor,
    engine: usize,
) -> Result<(Descriptor, u64), CudaError> {
    let plan = Descriptor::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, format!("execution plan {engine}"))?;
    plan.set_handle(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
    plan.set_descriptors(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
    plan.finalize()?;
    let workspace = plan.get_i64(Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
    Ok((plan, u64::try_from(workspace).unwrap_or(0)))
}

impl Plan {
    /// Builds `pass` for `shape`: the graph, the heuristics (mode A, then the fallback list),
    /// then execution plans of the engine configurations in order until one finalizes: each
    /// configuration once (the two lists overlap; a configuration whose key cannot be read is
    /// tried as it is), at most [`MAX_ENGINE_CONFIGS`] in all.
    fn build(handle: sys::cudnnHandle_t, pass: Pass, shape: &Shape) -> Result<Plan, CudaError> {
        let mut builder = Builder::new(handle);
        let graph = match pass {
            Pass::Forward { fused: true } => forward_fused(&mut builder, shape)?,
            Pass::Forward { fused: false } => forward_composite(&mut builder, shape)?,
            Pass::Backward(form) => backward_composite(&mut builder, shape, form)?,
        };
        let graph = builder.graphs.get(graph.0).ok_or_else(|| CudaError::Graph("the main graph is missing".into()))?;
        let mut failures = Vec::new();
        let (mut tried, mut duplicates) = (0usize, 0usize);
        let mut seen = HashSet::new();
        'modes: for mode in
            [sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A, sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK]
        {
            let configs = match engine_configs(graph, mode) {
                Ok(configs) => configs,
                Err(why) => {
                    failures.push(why);
                    continue;
                }
            };
            for config in &configs {
                if tried == MAX_ENGINE_CONFIGS {
                    break 'modes;
                }
                if let Ok(key) = config_key(config) {
                    if !seen.insert(key) {
                        duplicates += 1;
                        continue;
                    }
                }
                let engine = tried;
                tried += 1;
                match execution_plan(handle, config, engine) {
                    Ok((plan, workspace)) => return Ok(Plan { builder, plan, engine, workspace }),
                    Err(why) => failures.push(why),
                }
            }
        }
        Err(CudaError::CudnnRefused {
            what: format!("{pass:?} on {shape:?}"),
            reason: format!(
                "none of the {tried} engine configurations tried (heuristics mode A, then the fallback list; \
                 {duplicates} duplicates skipped; at most {MAX_ENGINE_CONFIGS}) finalized a plan; the first \
                 failure: {}",
                failures.first().map_or("none returned".to_string(), ToString::to_string)
            ),
        })
    }

    /// Runs the plan on the handle's stream: `pointers` are the device addresses of the
    /// non-virtual tensors in memory by uid; `scale` the by-value scale, `fill` the masked
    /// scores' value ([`mask_fill`]).
    ///
    /// # Safety
    /// Every pointer must address device memory of the extent its tensor's dims and strides
    /// span, `workspace` at least [`Plan::workspace`] bytes, all ordered against other users on
    /// the handle's stream.
    pub(crate) unsafe fn execute(
        &self,
        handle: sys::cudnnHandle_t,
        pointers: &[(Uid, u64)],
        workspace: u64,
        scale: f32,
        fill: f32,
    ) -> Result<(), CudaError> {
        let api = api()?;
        // The by-value scalars live on this frame until cudnnBackendExecute returns.
        let scalars: [(Uid, f32); 3] =
            [(super::graph::uid::SCALE, scale), (super::graph::uid::NEG_INF, fill), (super::graph::uid::ONE, 1.0)];
        let mut uids = Vec::new();
        let mut data: Vec<*mut c_void> = Vec::new();
        for tensor in self.builder.pack_tensors() {
            let pointer = if tensor.by_value {
                scalars.iter().find(|(u, _)| *u == tensor.uid).map(|(_, v)| (v as *const f32).cast_mut().cast())
            } else {
                pointers.iter().find(|(u, _)| *u == tensor.uid).map(|&(_, p)| p as *mut c_void)
            };
            let pointer = pointer
                .ok_or_else(|| CudaError::Graph(format!("no memory for tensor {} ({})", tensor.uid, tensor.name)))?;
            uids.push(tensor.uid);
            data.push(pointer);
        }
        let pack = Descriptor::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack")?;
        pack.set_i64(Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &uids)?;
        // Safety: VOID_PTR is read as void*; the pointers are this function's contract.
        unsafe { pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, Type::CUDNN_TYPE_VOID_PTR, &data) }?;
        let workspace = workspace as *mut c_void;
        // Safety: as above.
        unsafe { pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, Type::CUDNN_TYPE_VOID_PTR, &[workspace]) }?;
        pack.finalize()?;
        // Safety: a finalized plan and pack of this handle; the memory is this function's contract.
        check(unsafe { (api.execute)(handle, self.plan.raw, pack.raw) }, "cudnnBackendExecute", || {
            format!("the plan of engine configuration {}", self.engine)
        })
    }
}

/// The cuDNN library, one handle bound to the compute stream, the plans built so far and the
/// (pass, shape) pairs refused so far (each asked of cuDNN once).
pub(crate) struct Cudnn {
    handle: sys::cudnnHandle_t,
    /// `cudnnGetVersion()`, e.g. 92100.
    pub version: usize,
    /// Whether the forward is the fused SDPA operation (cuDNN >= 9.21).
    pub fused: bool,
    plans: HashMap<(Pass, Shape), Plan>,
    refused: HashMap<(Pass, Shape), CudaError>,
    /// Whether the head-major fallback for a refused token-major LSE was announced.
    head_major_noted: bool,
}

impl Cudnn {
    /// Loads cuDNN and creates a handle on `stream`; the error says why not, in one line: the
    /// library missing, too old, or `cudnnCreate` failing (no device). cudarc's cudnn module is
    /// never called: every function goes through [`Api`], statuses read as integers.
    pub(crate) fn open(stream: sys::cudaStream_t) -> Result<Self, CudaError> {
        let version = library()?.version;
        if version < MIN_VERSION {
            return Err(CudaError::CudnnUnavailable(format!(
                "cuDNN {} is too old: the attention graphs need cuDNN 9 or newer",
                version_text(version)
            )));
        }
        let api = api()?;
        let mut handle: sys::cudnnHandle_t = std::ptr::null_mut();
        // Safety: `handle` is a valid out-pointer; the library is cuDNN 9.
        let status = CudnnStatus(unsafe { (api.create)(&mut handle) });
        if status != CudnnStatus::SUCCESS {
            return Err(CudaError::CudnnUnavailable(format!(
                "cuDNN {}: cudnnCreate failed: {status}",
                version_text(version)
            )));
        }
        // Safety: a live handle and a live stream of the current context.
        let status = CudnnStatus(unsafe { (api.set_stream)(handle, stream) });
        if status != CudnnStatus::SUCCESS {
            // Safety: the handle was created above and is not used again.
            let _ = unsafe { (api.destroy)(handle) };
            return Err(CudaError::CudnnUnavailable(format!(
                "cuDNN {}: cudnnSetStream failed: {status}",
                version_text(version)
            )));
        }
        Ok(Cudnn {
            handle,
            version,
            fused: version >= FUSED_VERSION,
            plans: HashMap::new(),
            refused: HashMap::new(),
            head_major_noted: false,
        })
    }

    /// The plan of `pass` for `shape` exactly as given (its statistics layout included), built
    /// on first use and cached for the run; a refusal (a version rule of [`refusal`], or no
    /// engine configuration finalizing) is cached too, so that cuDNN is asked once per pair.
    pub(crate) fn plan(&mut self, pass: Pass, shape: &Shape) -> Result<&Plan, CudaError> {
        let key = (pass, *shape);
        if !self.plans.contains_key(&key) {
            if let Some(refused) = self.refused.get(&key) {
                return Err(refused.clone());
            }
            let built = match refusal(self.version, pass, shape) {
                Some(reason) => Err(CudaError::CudnnRefused { what: format!("{pass:?} on {shape:?}"), reason }),
                None => Plan::build(self.handle, pass, shape),
            };
            match built {
                Ok(plan) => {
                    self.plans.insert(key, plan);
                }
                Err(why) => {
                    self.refused.insert(key, why.clone());
                    return Err(why);
                }
            }
        }
        self.plans.get(&key).ok_or_else(|| CudaError::Graph("the plan vanished".into()))
    }

    /// The plan of `pass` for `shape` with the statistics layout this version reads correctly
    /// ([`stats_layout`]): token-major (the plan's LSE itself) where it does, else head-major
    /// (the backend transposes from or to the plan's LSE). Token-major refused: head-major
    /// (one line, once). Returns the plan and the shape it was built for.
    pub(crate) fn plan_for(&mut self, pass: Pass, shape: &Shape) -> Result<(&Plan, Shape), CudaError> {
        let wanted = Shape { stats: stats_layout(self.version, pass), ..*shape };
        let chosen = match self.plan(pass, &wanted) {
            Ok(_) => wanted,
            Err(why) if wanted.stats == StatsLayout::TokenMajor => {
                let head_major = Shape { stats: StatsLayout::HeadMajor, ..*shape };
                self.plan(pass, &head_major)?;
                if !self.head_major_noted {
                    self.head_major_noted = true;
                    eprintln!(
                        "attention: cuDNN {} refused the plan's token-major LSE ({why}); its head-major layout runs \
                         instead, transposed on every launch",
                        version_text(self.version)
                    );
                }
                head_major
            }
            Err(why) => return Err(why),
        };
        let plan = self.plan(pass, &chosen)?;
        Ok((plan, chosen))
    }

    /// The masked scores' value for this version ([`mask_fill`]).
    pub(crate) fn mask_fill(&self) -> f32 {
        mask_fill(self.version)
    }

    /// Binds the handle to `stream` (the launch's).
    pub(crate) fn set_stream(&mut self, stream: sys::cudaStream_t) -> Result<(), CudaError> {
        let api = api()?;
        // Safety: a live handle and a live stream of the handle's context.
        check(unsafe { (api.set_stream)(self.handle, stream) }, "cudnnSetStream", || {
            "the handle, binding it to the launch's stream".into()
        })
    }

    /// The handle (for [`Plan::execute`]).
    pub(crate) fn handle(&self) -> sys::cudnnHandle_t {
        self.handle
    }
}

// Safety: the handle and the descriptors are host objects of cuDNN that may be used from any
// thread, one thread at a time (cuDNN's rule for handles); `Cudnn` is owned by one backend and
// used only through `&mut` (no sharing), and the backend makes its CUDA context current on the
// calling thread before every use.
unsafe impl Send for Cudnn {}

impl Drop for Cudnn {
    fn drop(&mut self) {
        // The plans hold descriptors of this handle: destroy them first.
        self.plans.clear();
        if let Ok(api) = api() {
            // Safety: created by cudnnCreate in `open`, destroyed once.
            let _ = unsafe { (api.destroy)(self.handle) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-version rules, one row per cuDNN version that matters: the statistics layout
    /// each pass gives cuDNN, the mask's fill value, and which backward shapes are refused.
    #[test]
    fn the_lse_layout_mask_and_refusals_per_version() {
        use StatsLayout::{HeadMajor as H, TokenMajor as T};
        let forward = Pass::Forward { fused: false };
        let backward = Pass::Backward(BackwardForm::Accumulate);
        let aligned = Shape::plan(1, 2, 256, 64);
        let ragged = Shape::plan(1, 2, 200, 64);
        // version, forward LSE, backward LSE, -inf fill, backward refused at s = 256, at s = 200
        let table: [(usize, StatsLayout, StatsLayout, bool, bool, bool); 11] = [
            (9_00_00, H, H, false, false, true),
            (9_09_00, H, H, false, false, true),
            (9_10_00, H, H, true, true, true),
            (9_10_01, H, H, true, true, true),
            (9_10_02, H, H, true, false, true),
            (9_11_00, H, H, true, false, true),
            (9_12_00, T, H, true, false, true),
            (9_15_00, T, H, true, false, true),
            (9_15_01, T, H, true, false, false),
            (9_21_00, T, H, true, false, false),
            (9_26_00, T, T, true, false, false),
        ];
        for (version, fwd, bwd, neg_inf, refused_aligned, refused_ragged) in table {
            let v = version_text(version);
            assert_eq!(stats_layout(version, forward), fwd, "{v}");
            assert_eq!(stats_layout(version, Pass::Forward { fused: true }), fwd, "{v}");
            assert_eq!(stats_layout(version, backward), bwd, "{v}");
            assert_eq!(stats_layout(version, Pass::Backward(BackwardForm::Deterministic)), bwd, "{v}");
            assert_eq!(mask_fill(version), if neg_inf { f32::NEG_INFINITY } else { f32::MIN }, "{v}");
            assert_eq!(refusal(version, backward, &aligned).is_some(), refused_aligned, "{v}");
            assert_eq!(refusal(version, backward, &ragged).is_some(), refused_ragged, "{v}");
            assert_eq!(refusal(version, forward, &ragged), None, "{v}: the forward is never refused");
        }
        let bad = refusal(9_10_01, backward, &aligned).unwrap();
        assert!(bad.contains("9.10.1") && bad.contains("known-bad"), "{bad}");
        let padded = refusal(9_14_00, backward, &ragged).unwrap();
        assert!(padded.contains("(200)") && padded.contains("multiple of 128"), "{padded}");
    }

    const FAKE_CHILD: &str = "MEMO_FAKE_CUDNN_PLANS";

    /// A fake `libcudnn.so.9` reporting `version` in `dir`: descriptors are plain records; the
    /// statistics tensor (uid 5) refuses to finalize with token-major strides (status 3004);
    /// the heuristics return the engines listed in `FAKE_CUDNN_ENGINES_A` (mode A) and
    /// `FAKE_CUDNN_ENGINES_F` (the fallback list), comma-separated; only the execution plan of
    /// engine `FAKE_CUDNN_GOOD` finalizes. Every statistics tensor, heuristics query and plan
    /// finalized is appended to the file in `FAKE_CUDNN_LOG`. The constants come from cudarc's
    /// sys layer, so the fake speaks the same enum values as the code under test.
    fn fake_library(dir: &std::path::Path, version: usize) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let source = format!(
            r#"#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct {{ int kind; long long uid, dims[4], strides[4], engine; int mode; }} desc;
static void note(const char *what, long long value) {{
    const char *path = getenv("FAKE_CUDNN_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) {{ fprintf(f, "%s %lld\n", what, value); fclose(f); }}
}}
static int list(const char *variable, long long *out) {{
    const char *text = getenv(variable);
    int n = 0;
    while (text && *text && n < 64) {{
        char *end;
        out[n++] = strtoll(text, &end, 10);
        text = *end == ',' ? end + 1 : end;
        if (end == text && *end != ',') break;
    }}
    return n;
}}
size_t cudnnGetVersion(void) {{ return {version}; }}
int cudnnCreate(void **h) {{ *h = malloc(8); return 0; }}
int cudnnDestroy(void *h) {{ free(h); return 0; }}
int cudnnSetStream(void *h, void *s) {{ (void)h; (void)s; return 0; }}
void cudnnGetLastErrorString(char *m, size_t n) {{ snprintf(m, n, "the fake says no"); }}
int cudnnBackendCreateDescriptor(int kind, void **out) {{
    desc *d = calloc(1, sizeof *d); d->kind = kind; d->engine = -1; *out = d; return 0;
}}
int cudnnBackendDestroyDescriptor(void *d) {{ free(d); return 0; }}
int cudnnBackendSetAttribute(void *p, int attr, int type, long long count, const void *v) {{
    desc *d = p; (void)type;
    if (attr == {uid}) d->uid = *(const long long *)v;
    else if (attr == {dims} && count == 4) memcpy(d->dims, v, sizeof d->dims);
    else if (attr == {strides} && count == 4) memcpy(d->strides, v, sizeof d->strides);
    else if (attr == {heur_mode}) d->mode = *(const int *)v;
    else if (attr == {plan_config}) d->engine = (*(desc *const *)v)->engine;
    return 0;
}}
int cudnnBackendGetAttribute(void *p, int attr, int type, long long requested, long long *count, void *out) {{
    desc *d = p; (void)type;
    if (attr == {results}) {{
        long long engines[64];
        int n = list(d->mode == {mode_a} ? "FAKE_CUDNN_ENGINES_A" : "FAKE_CUDNN_ENGINES_F", engines);
        if (requested == 0) {{ *count = n; return 0; }}
        int i = 0;
        for (; i < n && i < requested; i++) ((desc **)out)[i]->engine = engines[i];
        *count = i;
        return 0;
    }}
    *count = 0;
    if (attr == {config_engine} && requested > 0) {{ ((desc **)out)[0]->engine = d->engine; *count = 1; }}
    else if (attr == {global_index} && requested > 0) {{ *(long long *)out = d->engine; *count = 1; }}
    else if (attr == {workspace} && requested > 0) {{ *(long long *)out = 4096; *count = 1; }}
    return 0;
}}
int cudnnBackendFinalize(void *p) {{
    desc *d = p;
    if (d->kind == {tensor} && d->uid == 5) {{
        int token_major = d->strides[1] == 1 && d->dims[1] > 1;
        note(token_major ? "stats-token-major" : "stats-head-major", 0);
        return token_major ? 3004 : 0;
    }}
    if (d->kind == {heuristics}) note("heuristics", d->mode);
    if (d->kind == {plan}) {{
        note("plan", d->engine);
        const char *good = getenv("FAKE_CUDNN_GOOD");
        return good && atoll(good) == d->engine ? 0 : 3000;
    }}
    return 0;
}}
int cudnnBackendExecute(void *h, void *p, void *v) {{ (void)h; (void)p; (void)v; return 0; }}
"#,
            uid = Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID as u32,
            dims = Attr::CUDNN_ATTR_TENSOR_DIMENSIONS as u32,
            strides = Attr::CUDNN_ATTR_TENSOR_STRIDES as u32,
            heur_mode = Attr::CUDNN_ATTR_ENGINEHEUR_MODE as u32,
            plan_config = Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG as u32,
            results = Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS as u32,
            mode_a = sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A as u32,
            config_engine = Attr::CUDNN_ATTR_ENGINECFG_ENGINE as u32,
            global_index = Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX as u32,
            workspace = Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE as u32,
            tensor = Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR as u32,
            heuristics = Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR as u32,
            plan = Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR as u32,
        );
        let path = dir.join("fake_cudnn.c");
        std::fs::write(&path, source).map_err(|e| e.to_string())?;
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(dir.join("libcudnn.so.9"))
            .arg(&path)
            .status()
            .map_err(|e| format!("cc: {e}"))?;
        if !status.success() {
            return Err(format!("cc failed: {status}"));
        }
        Ok(())
    }

    /// Runs in the child process only (the fake loaded through `LD_LIBRARY_PATH`): asks for the
    /// plans `MEMO_FAKE_CUDNN_PLANS` names, three times each, and prints one line per answer.
    #[test]
    fn fake_child() {
        let Ok(case) = std::env::var(FAKE_CHILD) else { return };
        let mut cudnn = Cudnn::open(std::ptr::null_mut()).expect("the fake opens");
        let backward = Pass::Backward(BackwardForm::Accumulate);
        let forward = Pass::Forward { fused: false };
        let asks: Vec<(Pass, Shape)> = match case.as_str() {
            "layouts" => vec![(backward, Shape::plan(1, 2, 256, 64)), (forward, Shape::plan(1, 2, 256, 64))],
            "gates" => vec![(backward, Shape::plan(1, 2, 256, 64)), (backward, Shape::plan(1, 2, 200, 64))],
            _ => vec![(forward, Shape::plan(1, 2, 256, 64))],
        };
        for (pass, shape) in asks {
            for _ in 0..3 {
                match cudnn.plan_for(pass, &shape) {
                    Ok((plan, built)) => println!(
                        "FAKE {pass:?} s={} built {:?} engine {} workspace {}",
                        shape.seq, built.stats, plan.engine, plan.workspace
                    ),
                    Err(why) => println!("FAKE {pass:?} s={} refused: {why}", shape.seq),
                }
            }
        }
    }

    /// One fake per case, in a child process each; returns the child's `FAKE` lines and the log.
    fn run_fake(version: usize, case: &str, engines: (&str, &str, &str)) -> Option<(Vec<String>, Vec<String>)> {
        if std::process::Command::new("cc").arg("--version").output().is_err() {
            let test = std::thread::current().name().unwrap_or("a fake-cuDNN test").to_string();
            println!("SKIP runtime_cuda::{test}: no C compiler (cc) to build the fake cuDNN libraries");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("memo-fake-cudnn-{}-{case}-{version}", std::process::id()));
        fake_library(&dir, version).expect("the fake builds");
        let log = dir.join("calls.log");
        let _ = std::fs::remove_file(&log);
        let output = std::process::Command::new(std::env::current_exe().expect("the test executable"))
            .args(["--exact", "attention::cudnn::tests::fake_child", "--nocapture", "--test-threads=1"])
            .env(FAKE_CHILD, case)
            .env("LD_LIBRARY_PATH", &dir)
            .env("FAKE_CUDNN_LOG", &log)
            .env("FAKE_CUDNN_ENGINES_A", engines.0)
            .env("FAKE_CUDNN_ENGINES_F", engines.1)
            .env("FAKE_CUDNN_GOOD", engines.2)
            .output()
            .expect("the child runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        let lines = stdout.lines().filter_map(|l| l.find("FAKE ").map(|at| l[at..].to_string())).collect();
        let calls = std::fs::read_to_string(&log).unwrap_or_default().lines().map(str::to_string).collect();
        let _ = std::fs::remove_dir_all(&dir);
        Some((lines, calls))
    }

    /// Against a fake cuDNN 9.26 that refuses token-major statistics: each pass asks for the
    /// token-major LSE once (the layout 9.26 reads correctly), is refused once, and builds the
    /// head-major plan once, however often it is asked; the engine configurations are tried
    /// once each (mode A lists 0, 1, 2, the fallback 2, 1, 3; only 3 finalizes: four plans, not
    /// six).
    #[test]
    fn a_refused_plan_is_asked_of_cudnn_once() {
        if std::env::var_os(FAKE_CHILD).is_some() {
            return;
        }
        let Some((lines, calls)) = run_fake(9_26_00, "layouts", ("0,1,2", "2,1,3", "3")) else { return };
        assert_eq!(lines.len(), 6, "{lines:?}");
        for line in &lines {
            assert!(line.contains("built HeadMajor engine 3 workspace 4096"), "{lines:?}");
        }
        let count = |what: &str| calls.iter().filter(|c| c.starts_with(what)).count();
        assert_eq!(count("stats-token-major"), 2, "one refusal per pass: {calls:?}");
        assert_eq!(count("stats-head-major"), 2, "{calls:?}");
        assert_eq!(count("heuristics"), 4, "{calls:?}");
        let plans: Vec<&String> = calls.iter().filter(|c| c.starts_with("plan")).collect();
        assert_eq!(plans, ["plan 0", "plan 1", "plan 2", "plan 3"].repeat(2), "{calls:?}");
    }

    /// At most [`MAX_ENGINE_CONFIGS`] configurations are tried, and a plan no configuration
    /// finalizes is refused once (cached), its error naming the count.
    #[test]
    fn engine_configurations_are_bounded_and_a_failure_is_cached() {
        if std::env::var_os(FAKE_CHILD).is_some() {
            return;
        }
        let many = (0..30).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let Some((lines, calls)) = run_fake(9_11_00, "forward", (&many, "", "-1")) else { return };
        assert_eq!(lines.len(), 3, "{lines:?}");
        for line in &lines {
            assert!(line.contains(&format!("none of the {MAX_ENGINE_CONFIGS} engine configurations")), "{line}");
        }
        assert_eq!(calls.iter().filter(|c| c.starts_with("plan")).count(), MAX_ENGINE_CONFIGS, "{calls:?}");
        // 9.11: the forward asks for head-major statistics straight away.
        assert!(calls.iter().all(|c| c != "stats-token-major 0"), "{calls:?}");
    }

    /// The version gates against fakes: 9.10.1's backward is refused without asking cuDNN;
    /// 9.15.0's backward is refused at s = 200 (not a multiple of 128) and built at s = 256.
    #[test]
    fn known_bad_versions_and_shapes_are_refused_without_asking_cudnn() {
        if std::env::var_os(FAKE_CHILD).is_some() {
            return;
        }
        let Some((lines, calls)) = run_fake(9_10_01, "gates", ("0", "", "0")) else { return };
        assert_eq!(lines.len(), 6, "{lines:?}");
        assert!(lines.iter().all(|l| l.contains("refused") && l.contains("known-bad")), "{lines:?}");
        assert!(calls.is_empty(), "cuDNN was asked: {calls:?}");
        let Some((lines, _)) = run_fake(9_15_00, "gates", ("0", "", "0")) else { return };
        assert!(lines[..3].iter().all(|l| l.contains("s=256 built HeadMajor")), "{lines:?}");
        assert!(lines[3..].iter().all(|l| l.contains("s=200 refused") && l.contains("multiple of 128")), "{lines:?}");
    }

    #[test]
    fn versions_read_as_cudnn_writes_them() {
        assert_eq!(version_text(92100), "9.21.0");
        assert_eq!(version_text(90501), "9.5.1");
        assert_eq!(version_text(8907), "8.9.7");
        const { assert!(MIN_VERSION < FUSED_VERSION) };
    }

    /// Without cuDNN (this machine in CI) or without a device (cudnnCreate fails), opening is
    /// one line saying why, never a panic; with both it opens.
    #[test]
    fn opening_says_why_not_in_one_line() {
        match Cudnn::open(std::ptr::null_mut()) {
            Ok(cudnn) => println!("cuDNN {} opened (fused forward: {})", version_text(cudnn.version), cudnn.fused),
            Err(why) => {
                let why = why.to_string();
                println!("{why}");
                assert!(why.contains("cuDNN") && !why.contains('\n'), "{why}");
            }
        }
    }

    /// On a GPU with cuDNN (scripts/gpu-check.sh; elsewhere SKIP, or a failure when
    /// `MEMO_REQUIRE_CUDNN` is set): the plan of every pass, with the plan's token-major
    /// statistics and with cuDNN's head-major ones, at 16K tokens x 16 heads of 128 and at 200
    /// tokens x 2 heads of 64 (two sequences), the same with grouped K/V (4 and 2 K/V heads),
    /// and one replicated K/V head read from rows of two, each printed with its engine and
    /// workspace or why it did not build; first the layout this version is given per pass
    /// ([`stats_layout`]). Asserts that the composite forward and the backward build in one of
    /// the layouts for each shape the version does not refuse ([`refusal`]): else the cuDNN
    /// path cannot run at all.
    #[test]
    fn plans_build_on_a_gpu_for_every_pass_and_statistics_layout() {
        let mut cudnn = match Cudnn::open(std::ptr::null_mut()) {
            Ok(cudnn) => cudnn,
            Err(why) => {
                assert!(std::env::var_os("MEMO_REQUIRE_CUDNN").is_none(), "MEMO_REQUIRE_CUDNN is set: {why}");
                println!("SKIP plans_build_on_a_gpu_for_every_pass_and_statistics_layout: {why}");
                return;
            }
        };
        println!(
            "cuDNN {} (fused forward: {}; LSE given to cuDNN: forward {:?}, backward {:?}; mask fill {})",
            version_text(cudnn.version),
            cudnn.fused,
            stats_layout(cudnn.version, Pass::Forward { fused: false }),
            stats_layout(cudnn.version, Pass::Backward(BackwardForm::Accumulate)),
            cudnn.mask_fill()
        );
        let mut passes = vec![
            Pass::Forward { fused: false },
            Pass::Backward(BackwardForm::Accumulate),
            Pass::Backward(BackwardForm::Deterministic),
        ];
        if cudnn.fused {
            passes.insert(0, Pass::Forward { fused: true });
        }
        let mut unusable = Vec::new();
        // Multi-head; grouped-query (4 K/V heads for 16, 2 for 4: cuDNN's h_kv); K/V replicated
        // (one K/V head read from rows of 2, at the offset the backend adds to the pointers).
        let replicated = Shape { kv_row: 2 * 64, ..Shape::grouped(2, 4, 1, 200, 64) };
        let shapes = [
            Shape::plan(1, 16, 16384, 128),
            Shape::plan(2, 2, 200, 64),
            Shape::grouped(1, 16, 4, 16384, 128),
            Shape::grouped(2, 4, 2, 200, 64),
            replicated,
        ];
        for base in shapes {
            let (b, h, s, d) = (base.batch, base.heads, base.seq, base.head_dim);
            let (b, h) = (format!("{b}"), format!("{h} kv_heads={} kv_row={}", base.kv_heads, base.kv_row));
            for pass in &passes {
                let mut built = false;
                for stats in [StatsLayout::TokenMajor, StatsLayout::HeadMajor] {
                    let shape = Shape { stats, ..base };
                    match cudnn.plan(*pass, &shape) {
                        Ok(plan) => {
                            built = true;
                            println!(
                                "b={b} h={h} s={s} d={d} {pass:?} {stats:?}: engine configuration {}, workspace {} bytes",
                                plan.engine, plan.workspace
                            );
                        }
                        Err(why) => println!("b={b} h={h} s={s} d={d} {pass:?} {stats:?}: NOT BUILT: {why}"),
                    }
                }
                // A pass this version refuses for this shape (refusal(): known-bad, or the
                // padding workaround) runs on our kernels by design.
                if !built
                    && refusal(cudnn.version, *pass, &base).is_none()
                    && !matches!(pass, Pass::Forward { fused: true } | Pass::Backward(BackwardForm::Deterministic))
                {
                    unusable.push(format!("b={b} h={h} s={s} d={d} {pass:?}"));
                }
            }
        }
        assert!(unusable.is_empty(), "no statistics layout builds: {unusable:?}");
    }
}
