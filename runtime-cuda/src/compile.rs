//! Compiling the kernels at construction: every source of [`memo_kernels::SOURCES`] straight to a
//! CUBIN for the device's compute capability (no PTX JIT in the driver), one thread per source
//! (NVRTC programs are independent), then loaded as modules.
//!
//! cudarc's safe `compile_ptx` yields PTX only and unwraps inside its error path, so this uses
//! its `result` layer and the two CUBIN calls of its `sys` layer.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{result, sys, Ptx};
use memo_kernels::{compile_options, AttentionVariant, Source, Target, SOURCES};

use crate::error::CudaError;

/// A program that is destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // Safety: the program came from create_program and is destroyed exactly once, here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// The program's log (empty when there is none).
fn log(program: &Program) -> String {
    // Safety: the program is live (it is destroyed only when `program` drops).
    match unsafe { result::get_program_log(program.0) } {
        Ok(raw) => {
            let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(_) => String::new(),
    }
}

/// `source` compiled to a CUBIN with `options`; an error carries the log and the options.
pub(crate) fn cubin(source: &Source, options: &[String]) -> Result<Vec<u8>, CudaError> {
    let library = |why: String| CudaError::NvrtcLibrary(why);
    let text = CString::new(source.standalone_text())
        .map_err(|_| library(format!("kernels/{} holds a NUL byte", source.name)))?;
    let name = CString::new(source.name).map_err(|_| library(format!("{} holds a NUL byte", source.name)))?;
    let program = Program(
        result::create_program(&text, Some(&name))
            .map_err(|e| library(format!("cannot create a program of kernels/{}: {e:?}", source.name)))?,
    );
    // Safety: the program is live; the options are plain strings without NUL bytes.
    if let Err(error) = unsafe { result::compile_program(program.0, options) } {
        return Err(CudaError::Nvrtc {
            source: format!("kernels/{}", source.name),
            options: options.to_vec(),
            log: format!("({error:?})\n{}", log(&program)),
        });
    }
    let mut size = 0usize;
    // Safety: the program is live and compiled for a real architecture (sm_XY), so it has a
    // CUBIN; `size` is a live local.
    unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }
        .result()
        .map_err(|e| library(format!("kernels/{}: no CUBIN ({e:?}); options {options:?}", source.name)))?;
    let mut cubin = vec![0u8; size];
    // Safety: `cubin` holds the `size` bytes nvrtcGetCUBINSize reported.
    unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| library(format!("kernels/{}: reading the CUBIN: {e:?}", source.name)))?;
    Ok(cubin)
}

/// Every kernel of every source, compiled for `sm` (attention in `attention`'s variant) and
/// loaded into `ctx`.
pub(crate) fn kernels(
    ctx: &Arc<CudaContext>,
    sm: u32,
    attention: AttentionVariant,
) -> Result<HashMap<&'static str, CudaFunction>, CudaError> {
    let mut options = compile_options(Target::Cuda { sm });
    options.extend(attention.options());
    let cubins: Vec<Result<Vec<u8>, CudaError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = SOURCES.iter().map(|source| scope.spawn(|| cubin(source, &options))).collect();
        handles
            .into_iter()
            .map(|handle| {
                handle.join().unwrap_or_else(|_| Err(CudaError::NvrtcLibrary("a compile thread panicked".into())))
            })
            .collect()
    });
    let mut functions = HashMap::new();
    for (source, cubin) in SOURCES.iter().zip(cubins) {
        let cubin = cubin?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| CudaError::driver(format!("loading kernels/{} (sm_{sm})", source.name), e))?;
        for &kernel in source.kernels {
            let function = module
                .load_function(kernel)
                .map_err(|e| CudaError::driver(format!("kernels/{}: no kernel `{kernel}`", source.name), e))?;
            functions.insert(kernel, function);
        }
    }
    Ok(functions)
}

/// The NVRTC version, for reports.
pub(crate) fn nvrtc_version() -> Option<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // Safety: two live locals, as nvrtcVersion requires; the library was probed present.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (status == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}
