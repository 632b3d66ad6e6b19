//! cuDNN's backend (graph) API through cudarc's `cudnn` sys layer: a small safe layer of our own
//! (cudarc has no safe wrapper for graphs).
//!
//! - [`Descriptor`] owns one backend descriptor and destroys it on drop; every attribute is set
//!   through a typed setter, and every status is checked and turned into an error that names the
//!   descriptor, the attribute and cuDNN's own last error string.
//! - [`Builder`] is [`GraphBuilder`] on real descriptors; [`Plan`] runs the engine heuristics
//!   (mode A), tries the engine configurations in order until one finalizes, and executes with a
//!   variant pack on the handle's stream.
//! - [`Cudnn`] is the library: probed before any cudarc cudnn call (cudarc panics when the
//!   library is missing), its version read with `cudnnGetVersion`, one handle (the first failed
//!   `cudnnCreate` ends the attempt), the plans cached per shape for the run.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cudnn::sys;
use sys::cudnnBackendAttributeName_t as Attr;
use sys::cudnnBackendAttributeType_t as Type;
use sys::cudnnBackendDescriptorType_t as Kind;

use super::graph::{
    backward_composite, forward_composite, forward_fused, BackwardForm, DataType, GraphBuilder, GraphId, OpId,
    Operation, PointwiseMode, ReduceOp, Shape, Tensor, Uid, ALIGNMENT,
};

/// The first cuDNN this path uses (the composite graphs as the frontend builds them, `-inf` masks,
/// `cudnnGetLastErrorString`).
pub(crate) const MIN_VERSION: usize = 9_00_00;
/// The first cuDNN whose fused forward takes a causal mask.
pub(crate) const FUSED_VERSION: usize = 9_21_00;

/// `9.21.0` from `92100` (cuDNN 9 encodes major * 10000 + minor * 100 + patch); `8.9.7` from
/// `8907` (cuDNN 8 and older: major * 1000 + minor * 100 + patch).
pub(crate) fn version_text(version: usize) -> String {
    if version < 10_000 {
        format!("{}.{}.{}", version / 1000, version / 100 % 10, version % 100)
    } else {
        format!("{}.{}.{}", version / 10_000, version / 100 % 100, version % 100)
    }
}

/// cuDNN's last error message (cuDNN 9 keeps one per thread), or nothing.
fn last_error() -> String {
    let mut buffer = [0 as std::ffi::c_char; 512];
    // Safety: the buffer holds 512 chars and cuDNN writes at most `max_size` including the
    // terminating zero; the function exists from cuDNN 9.0, and no descriptor is touched before
    // `Cudnn::open` has checked the version is at least MIN_VERSION.
    unsafe { sys::cudnnGetLastErrorString(buffer.as_mut_ptr(), buffer.len()) };
    // Safety: cuDNN zero-terminates within the buffer (and the last byte was zero already).
    let text = unsafe { std::ffi::CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().trim().to_string();
    if text.is_empty() {
        String::new()
    } else {
        format!(" ({text})")
    }
}

/// `status` as a result, the error naming `what`.
fn check(status: sys::cudnnStatus_t, what: impl FnOnce() -> String) -> Result<(), String> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("cuDNN: {}: {status:?}{}", what(), last_error()))
    }
}

/// One backend descriptor, destroyed on drop.
pub(crate) struct Descriptor {
    raw: sys::cudnnBackendDescriptor_t,
    /// What it is, for errors (the descriptor type and, for tensors, the tensor's name).
    name: String,
}

impl Descriptor {
    fn new(kind: Kind, name: impl Into<String>) -> Result<Self, String> {
        let name = name.into();
        let mut raw: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // Safety: `raw` is a valid out-pointer; `kind` a descriptor type of the loaded library's
        // header version (the sys layer's enum).
        check(unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut raw) }, || format!("creating {kind:?} ({name})"))?;
        Ok(Descriptor { raw, name })
    }

    /// Sets `attr` to `values` of attribute type `ty`.
    ///
    /// # Safety
    /// `T` must be the C type cuDNN reads for `ty` (i64 for INT64, the enum for its enum types,
    /// `bool` for BOOLEAN, f32 for FLOAT, a descriptor or handle pointer, a `void*`).
    unsafe fn set<T>(&self, attr: Attr, ty: Type, values: &[T]) -> Result<(), String> {
        let count = i64::try_from(values.len()).map_err(|_| "too many attribute values".to_string())?;
        // Safety: `values` is `count` valid elements of the type `ty` names (this function's
        // contract); cuDNN copies them before returning.
        let status = unsafe { sys::cudnnBackendSetAttribute(self.raw, attr, ty, count, values.as_ptr().cast()) };
        check(status, || format!("setting {attr:?} of {}", self.name))
    }

    fn set_i64(&self, attr: Attr, values: &[i64]) -> Result<(), String> {
        // Safety: INT64 is read as i64.
        unsafe { self.set(attr, Type::CUDNN_TYPE_INT64, values) }
    }

    fn set_f32(&self, attr: Attr, value: f32) -> Result<(), String> {
        // Safety: FLOAT is read as f32.
        unsafe { self.set(attr, Type::CUDNN_TYPE_FLOAT, &[value]) }
    }

    fn set_bool(&self, attr: Attr, value: bool) -> Result<(), String> {
        // Safety: BOOLEAN is read as a C `bool` (one byte), which Rust's `bool` is.
        unsafe { self.set(attr, Type::CUDNN_TYPE_BOOLEAN, &[value]) }
    }

    fn set_data_type(&self, attr: Attr, dtype: DataType) -> Result<(), String> {
        let value = match dtype {
            DataType::Bf16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
            DataType::F32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            DataType::I32 => sys::cudnnDataType_t::CUDNN_DATA_INT32,
            DataType::Bool => sys::cudnnDataType_t::CUDNN_DATA_BOOLEAN,
        };
        // Safety: DATA_TYPE is read as cudnnDataType_t.
        unsafe { self.set(attr, Type::CUDNN_TYPE_DATA_TYPE, &[value]) }
    }

    fn set_pointwise_mode(&self, attr: Attr, mode: PointwiseMode) -> Result<(), String> {
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

    fn set_descriptors(&self, attr: Attr, descriptors: &[&Descriptor]) -> Result<(), String> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = descriptors.iter().map(|d| d.raw).collect();
        // Safety: BACKEND_DESCRIPTOR is read as cudnnBackendDescriptor_t, each a live descriptor.
        unsafe { self.set(attr, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw) }
    }

    fn set_handle(&self, attr: Attr, handle: sys::cudnnHandle_t) -> Result<(), String> {
        // Safety: HANDLE is read as cudnnHandle_t, a live handle.
        unsafe { self.set(attr, Type::CUDNN_TYPE_HANDLE, &[handle]) }
    }

    fn finalize(&self) -> Result<(), String> {
        // Safety: a live descriptor.
        check(unsafe { sys::cudnnBackendFinalize(self.raw) }, || format!("finalizing {}", self.name))
    }

    fn get_i64(&self, attr: Attr) -> Result<i64, String> {
        let (mut value, mut count) = (0i64, 0i64);
        // Safety: one i64 requested into `value`; `count` is a valid out-pointer.
        let status = unsafe {
            sys::cudnnBackendGetAttribute(
                self.raw,
                attr,
                Type::CUDNN_TYPE_INT64,
                1,
                &mut count,
                (&mut value as *mut i64).cast(),
            )
        };
        check(status, || format!("reading {attr:?} of {}", self.name))?;
        Ok(value)
    }
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // Safety: `raw` was created by cudnnBackendCreateDescriptor and is destroyed once; a
        // failure has nowhere to go.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.raw) };
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

    fn tensor_descriptor(&self, uid: Uid) -> Result<&Descriptor, String> {
        self.tensors.get(&uid).map(|(_, d)| d).ok_or_else(|| format!("tensor {uid} used before it is declared"))
    }

    /// Sets each (attribute, tensor uid) of `op`.
    fn set_tensors(&self, op: &Descriptor, tensors: &[(Attr, Uid)]) -> Result<(), String> {
        for &(attr, uid) in tensors {
            op.set_descriptors(attr, &[self.tensor_descriptor(uid)?])?;
        }
        Ok(())
    }

    fn mode(
        &mut self,
        kind: Kind,
        name: &str,
        set: impl FnOnce(&Descriptor) -> Result<(), String>,
    ) -> Result<usize, String> {
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
    type Error = String;

    fn tensor(&mut self, t: &Tensor) -> Result<(), String> {
        if self.tensors.contains_key(&t.uid) {
            return Err(format!("tensor uid {} ({}) declared twice", t.uid, t.name));
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

    fn operation(&mut self, op: &Operation) -> Result<OpId, String> {
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
                let softmax = self.operations.get(softmax.0).ok_or("SDPA forward: no such softmax operation")?;
                d.set_descriptors(Attr::CUDNN_ATTR_OPERATION_SDPA_FWD_SOFTMAX_DESC, &[softmax])?;
                let mask = self.graphs.get(mask.0).ok_or("SDPA forward: no such mask subgraph")?;
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

    fn graph(&mut self, ops: &[OpId], main: bool) -> Result<GraphId, String> {
        let index = self.graphs.len();
        let kind = if main { "graph" } else { "subgraph" };
        let d = Descriptor::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, format!("operation {kind} {index}"))?;
        let members: Vec<&Descriptor> = ops
            .iter()
            .map(|o| self.operations.get(o.0).ok_or("graph of an unknown operation"))
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
    /// The engine configuration's index in the heuristics' order.
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
fn engine_configs(graph: &Descriptor, mode: sys::cudnnBackendHeurMode_t) -> Result<Vec<Descriptor>, String> {
    let heuristics =
        Descriptor::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, format!("engine heuristics ({mode:?})"))?;
    heuristics.set_descriptors(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?;
    // Safety: HEUR_MODE is read as cudnnBackendHeurMode_t.
    unsafe { heuristics.set(Attr::CUDNN_ATTR_ENGINEHEUR_MODE, Type::CUDNN_TYPE_HEUR_MODE, &[mode]) }?;
    heuristics.finalize()?;
    let mut count = 0i64;
    // Safety: a count query (no elements requested, a null array).
    let status = unsafe {
        sys::cudnnBackendGetAttribute(
            heuristics.raw,
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            std::ptr::null_mut(),
        )
    };
    check(status, || format!("counting the results of {}", heuristics.name))?;
    if count <= 0 {
        return Err(format!("cuDNN: {} found no engine for this graph", heuristics.name));
    }
    let configs: Vec<Descriptor> = (0..count)
        .map(|i| {
            Descriptor::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, format!("engine configuration {i} ({mode:?})"))
        })
        .collect::<Result<_, _>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = configs.iter().map(|c| c.raw).collect();
    let mut returned = 0i64;
    // Safety: `raw` holds `count` created engine-configuration descriptors for cuDNN to fill.
    let status = unsafe {
        sys::cudnnBackendGetAttribute(
            heuristics.raw,
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count,
            &mut returned,
            raw.as_mut_ptr().cast(),
        )
    };
    check(status, || format!("reading the results of {}", heuristics.name))?;
    let mut configs = configs;
    configs.truncate(usize::try_from(returned).unwrap_or(0));
    Ok(configs)
}

/// The execution plan of one engine configuration, finalized, and its workspace bytes.
fn execution_plan(handle: sys::cudnnHandle_t, config: &Descriptor, engine: usize) -> Result<(Descriptor, u64), String> {
    let plan = Descriptor::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, format!("execution plan {engine}"))?;
    plan.set_handle(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
    plan.set_descriptors(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
    plan.finalize()?;
    let workspace = plan.get_i64(Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
    Ok((plan, u64::try_from(workspace).unwrap_or(0)))
}

impl Plan {
    /// Builds `pass` for `shape`: the graph, the heuristics (mode A), then execution plans of the
    /// engine configurations in order until one finalizes.
    fn build(handle: sys::cudnnHandle_t, pass: Pass, shape: &Shape) -> Result<Plan, String> {
        let mut builder = Builder::new(handle);
        let graph = match pass {
            Pass::Forward { fused: true } => forward_fused(&mut builder, shape)?,
            Pass::Forward { fused: false } => forward_composite(&mut builder, shape)?,
            Pass::Backward(form) => backward_composite(&mut builder, shape, form)?,
        };
        let graph = builder.graphs.get(graph.0).ok_or("the main graph is missing")?;
        // Mode A's ranking first (the frontend's samples), then cuDNN's fallback list.
        let mut failures = Vec::new();
        let mut tried = 0usize;
        for mode in
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
                let engine = tried;
                tried += 1;
                match execution_plan(handle, config, engine) {
                    Ok((plan, workspace)) => return Ok(Plan { builder, plan, engine, workspace }),
                    Err(why) => failures.push(why),
                }
            }
        }
        Err(format!(
            "cuDNN: none of the {tried} engine configurations (heuristics mode A, then the fallback list) finalized a \
             plan; the first failure: {}",
            failures.first().map_or("none returned", String::as_str)
        ))
    }
    /// Runs the plan on the handle's stream: `pointers` are the device addresses of the
    /// non-virtual tensors in memory by uid; `scale` the by-value scale.
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
    ) -> Result<(), String> {
        // The by-value scalars live on this frame until cudnnBackendExecute returns.
        let scalars: [(Uid, f32); 3] = [
            (super::graph::uid::SCALE, scale),
            (super::graph::uid::NEG_INF, f32::NEG_INFINITY),
            (super::graph::uid::ONE, 1.0),
        ];
        let mut uids = Vec::new();
        let mut data: Vec<*mut c_void> = Vec::new();
        for tensor in self.builder.pack_tensors() {
            let pointer = if tensor.by_value {
                scalars.iter().find(|(u, _)| *u == tensor.uid).map(|(_, v)| (v as *const f32).cast_mut().cast())
            } else {
                pointers.iter().find(|(u, _)| *u == tensor.uid).map(|&(_, p)| p as *mut c_void)
            };
            let pointer = pointer.ok_or_else(|| format!("no memory for tensor {} ({})", tensor.uid, tensor.name))?;
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
        check(unsafe { sys::cudnnBackendExecute(handle, self.plan.raw, pack.raw) }, || {
            format!("executing the plan (engine configuration {})", self.engine)
        })
    }
}

/// The cuDNN library, one handle bound to the compute stream, and the plans built so far.
pub(crate) struct Cudnn {
    handle: sys::cudnnHandle_t,
    /// `cudnnGetVersion()`, e.g. 92100.
    pub version: usize,
    /// Whether the forward is the fused SDPA operation (cuDNN >= 9.21).
    pub fused: bool,
    plans: HashMap<(Pass, Shape), Plan>,
}

impl Cudnn {
    /// Loads cuDNN and creates a handle on `stream`; the error says why not, in one line: the
    /// library missing, too old, or `cudnnCreate` failing (no device). Nothing of cudarc's cudnn
    /// module is called before the library is known to load.
    pub(crate) fn open(stream: sys::cudaStream_t) -> Result<Self, String> {
        // Safety: only tries to dlopen the library under its candidate names and closes it.
        if !unsafe { sys::is_culib_present() } {
            return Err("cuDNN (libcudnn.so.9) cannot be loaded: install it or put its folder (PyTorch's \
                        site-packages/nvidia/cudnn/lib) on LD_LIBRARY_PATH"
                .into());
        }
        // Safety: the library loads (checked above); cudnnGetVersion takes nothing and exists in
        // every cuDNN.
        let version = unsafe { sys::cudnnGetVersion() };
        if version < MIN_VERSION {
            return Err(format!(
                "cuDNN {} is too old: the attention graphs need cuDNN 9 or newer",
                version_text(version)
            ));
        }
        let mut handle: sys::cudnnHandle_t = std::ptr::null_mut();
        // Safety: `handle` is a valid out-pointer; the library is cuDNN 9.
        let status = unsafe { sys::cudnnCreate(&mut handle) };
        if status != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
            return Err(format!("cuDNN {}: cudnnCreate failed: {status:?}", version_text(version)));
        }
        // Safety: a live handle and a live stream of the current context.
        let status = unsafe { sys::cudnnSetStream(handle, stream) };
        if status != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
            // Safety: the handle was created above and is not used again.
            let _ = unsafe { sys::cudnnDestroy(handle) };
            return Err(format!("cuDNN {}: cudnnSetStream failed: {status:?}", version_text(version)));
        }
        Ok(Cudnn { handle, version, fused: version >= FUSED_VERSION, plans: HashMap::new() })
    }

    /// The plan of `pass` for `shape`, built on first use and cached for the run.
    pub(crate) fn plan(&mut self, pass: Pass, shape: &Shape) -> Result<&Plan, String> {
        if !self.plans.contains_key(&(pass, *shape)) {
            let plan = Plan::build(self.handle, pass, shape)?;
            self.plans.insert((pass, *shape), plan);
        }
        self.plans.get(&(pass, *shape)).ok_or_else(|| "the plan vanished".into())
    }

    /// Binds the handle to `stream` (the launch's).
    pub(crate) fn set_stream(&mut self, stream: sys::cudaStream_t) -> Result<(), String> {
        // Safety: a live handle and a live stream of the handle's context.
        check(unsafe { sys::cudnnSetStream(self.handle, stream) }, || {
            "binding the handle to the launch's stream".into()
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
        // Safety: created by cudnnCreate in `open`, destroyed once.
        let _ = unsafe { sys::cudnnDestroy(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                println!("{why}");
                assert!(why.contains("cuDNN") && !why.contains('\n'), "{why}");
            }
        }
    }

    /// On a GPU with cuDNN (scripts/gpu-check.sh; elsewhere SKIP, or a failure when
    /// `MEMO_REQUIRE_CUDNN` is set): the plan of every pass, with the plan's token-major
    /// statistics and with cuDNN's head-major ones, at 16K tokens x 16 heads of 128 and at 200
    /// tokens x 2 heads of 64 (two sequences), the same with grouped K/V (4 and 2 K/V heads),
    /// and one replicated K/V head read from rows of two, each printed with its engine and workspace or why
    /// it did not build. Whether cuDNN takes the plan's LSE layout is the question this answers
    /// (issue 17, item 2). Asserts that the composite forward and the backward build in one of
    /// the layouts for each shape: else the cuDNN path cannot run at all.
    #[test]
    fn plans_build_on_a_gpu_for_every_pass_and_statistics_layout() {
        use crate::attention::graph::StatsLayout;
        let mut cudnn = match Cudnn::open(std::ptr::null_mut()) {
            Ok(cudnn) => cudnn,
            Err(why) => {
                assert!(std::env::var_os("MEMO_REQUIRE_CUDNN").is_none(), "MEMO_REQUIRE_CUDNN is set: {why}");
                println!("SKIP plans_build_on_a_gpu_for_every_pass_and_statistics_layout: {why}");
                return;
            }
        };
        println!("cuDNN {} (fused forward: {})", version_text(cudnn.version), cudnn.fused);
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
                if !built
                    && !matches!(pass, Pass::Forward { fused: true } | Pass::Backward(BackwardForm::Deterministic))
                {
                    unusable.push(format!("b={b} h={h} s={s} d={d} {pass:?}"));
                }
            }
        }
        assert!(unusable.is_empty(), "no statistics layout builds: {unusable:?}");
    }
}
