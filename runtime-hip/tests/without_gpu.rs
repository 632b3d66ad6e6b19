//! What can be verified on a machine without an AMD GPU, for real:
//! - hiprtc compiles every kernel source (and the portability header) for gfx90a;
//! - a missing library and a missing device return the documented errors.
//!
//! The HIP runtime comes from Debian's ROCm 5.2.3 packages, unpacked by `scripts/fetch-rocm.sh`
//! into `.cache/rocm/lib` (or the folder in `MEMO_ROCM_LIB`) and loaded by explicit path; the
//! tests run the script when the folder is missing. Only when the packages cannot be had do the
//! tests that need them print SKIP with the reason and pass.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::PathBuf;

use memo_kernels::Source;
use memo_runtime::BackendError;
use runtime_hip::safe::module::compile_source;
use runtime_hip::sys::hip::HipLib;
use runtime_hip::sys::hipblas::HipblasLib;
use runtime_hip::sys::hiprtc::HiprtcLib;
use runtime_hip::{compile_check, HipBackend, HipError, LibrarySearch, HIP_ERROR_NO_DEVICE};

/// The unpacked runtime's folder, or why there is none. `scripts/test.sh` (the README's test
/// command) runs `scripts/fetch-rocm.sh` first and says so before it downloads anything; a plain
/// `cargo test` without it SKIPs these checks with that advice rather than download by itself.
fn unpacked_runtime() -> Result<PathBuf, String> {
    static FOUND: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    FOUND.get_or_init(find_runtime).clone()
}

fn find_runtime() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("MEMO_ROCM_LIB") {
        let dir = PathBuf::from(dir);
        // Asked for explicitly: a wrong folder is a failure, not a SKIP.
        assert!(dir.join("libamdhip64.so").exists(), "MEMO_ROCM_LIB={} holds no libamdhip64.so", dir.display());
        return Ok(dir);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join(".cache/rocm/lib");
    if dir.join("libamdhip64.so").exists() {
        return Ok(dir);
    }
    Err(format!(
        "no unpacked HIP runtime at {}: run scripts/fetch-rocm.sh (scripts/test.sh does) to compile-check the \
         kernels with hiprtc",
        dir.display()
    ))
}

macro_rules! runtime_or_skip {
    () => {
        match unpacked_runtime() {
            Ok(dir) => dir,
            Err(reason) => {
                skip::skip(reason);
                return;
            }
        }
    };
}

/// A folder that exists and holds nothing.
fn empty_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memo-runtime-hip-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create an empty temporary folder");
    dir
}

#[test]
fn every_kernel_source_compiles_with_hiprtc_for_gfx90a() {
    let dir = runtime_or_skip!();
    let check = compile_check(&LibrarySearch::only([&dir]), "gfx90a").expect("the unpacked runtime and hiprtc load");
    println!("hiprtc from {} with [{}]", check.hiprtc, check.options.join(" "));
    let mut failures = Vec::new();
    for source in &check.sources {
        match &source.result {
            Ok(bytes) => println!("  kernels/{}: {bytes} bytes of gfx90a code", source.source),
            Err(error) => failures.push(error.to_string()),
        }
    }
    assert_eq!(check.sources.len(), memo_kernels::SOURCES.len());
    // Also every `.cu` file in kernels/ that SOURCES does not list yet (a file one branch adds
    // before another wires it in): what is on disk must compile for AMD too. Each file is
    // compiled once (hiprtc takes seconds per file).
    let search = LibrarySearch::only([&dir]);
    let hip = HipLib::load(&search).expect("the unpacked runtime loads");
    let rtc = HiprtcLib::load(&search, &hip).expect("hiprtc loads");
    let kernels = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kernels");
    let mut unlisted: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .expect("kernels/ exists")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "cu"))
        .filter(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !memo_kernels::SOURCES.iter().any(|s| s.name == name)
        })
        .collect();
    unlisted.sort();
    for path in &unlisted {
        let text = std::fs::read_to_string(path).expect("a kernel source is UTF-8 text");
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?").to_string();
        let name: &'static str = Box::leak(name.into_boxed_str());
        let text: &'static str = Box::leak(text.into_boxed_str());
        match compile_source(&rtc.fns, &Source { name, text, kernels: &[] }, &check.options) {
            Ok(code) => println!("  kernels/{name} (not in SOURCES yet): {} bytes of gfx90a code", code.len()),
            Err(error) => failures.push(error.to_string()),
        }
    }
    let total = check.sources.len() + unlisted.len();
    assert!(failures.is_empty(), "{} of {total} sources failed:\n{}", failures.len(), failures.join("\n\n"));
    if total == 0 {
        println!("  kernels/ has no sources: only the header probe below compiles kernels");
    }
}

/// Every macro and function of `memo_gpu.h`, used the way the kernels use them.
const HEADER_PROBE: &str = r#"
#include "memo_gpu.h"
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256) memo_header_probe(const memo_bf16* x, memo_bf16* y,
                                                                      float* sums, memo_u32 n, memo_u64 stride) {
    memo_u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? memo_bf16_to_f32(x[i]) : 0.0f;
    float total = memo_warp_sum(v);
    float largest = memo_warp_max(v);
    if (i < n) {
        y[i] = memo_f32_to_bf16(v * 2.0f + largest);
    }
    if (threadIdx.x % MEMO_WARP_SIZE == 0) {
        sums[(i / MEMO_WARP_SIZE) * stride] = total;
    }
}
"#;

#[test]
fn the_portability_header_compiles_with_hiprtc_for_gfx90a() {
    let dir = runtime_or_skip!();
    let search = LibrarySearch::only([&dir]);
    let hip = HipLib::load(&search).expect("the unpacked runtime loads");
    let rtc = HiprtcLib::load(&search, &hip).expect("hiprtc loads");
    let source = Source { name: "header_probe.cu", text: HEADER_PROBE, kernels: &["memo_header_probe"] };
    let options = memo_kernels::compile_options(memo_kernels::Target::Hip { gfx: "gfx90a" });
    let code = compile_source(&rtc.fns, &source, &options).unwrap_or_else(|e| panic!("{e}"));
    // An AMDGPU code object is an ELF file.
    assert_eq!(&code[..4], b"\x7fELF", "hiprtc returned {} bytes that are not an ELF code object", code.len());
    runtime_hip::kernels_present(&source, &code).expect("the probe kernel is in its code object");
    let misspelt = Source { kernels: &["memo_header_probe", "memo_header_prob"], ..source };
    let error = runtime_hip::kernels_present(&misspelt, &code).expect_err("a kernel that is not there");
    assert!(error.to_string().contains("no kernel named memo_header_prob "), "{error}");
}

#[test]
fn a_compile_error_carries_the_file_line_and_options() {
    let dir = runtime_or_skip!();
    let search = LibrarySearch::only([&dir]);
    let hip = HipLib::load(&search).expect("the unpacked runtime loads");
    let rtc = HiprtcLib::load(&search, &hip).expect("hiprtc loads");
    let broken =
        "#include \"memo_gpu.h\"\nextern \"C\" __global__ void broken(float* x) {\n  x[0] = undeclared_name;\n}\n";
    let source = Source { name: "broken.cu", text: broken, kernels: &["broken"] };
    let options = memo_kernels::compile_options(memo_kernels::Target::Hip { gfx: "gfx90a" });
    match compile_source(&rtc.fns, &source, &options) {
        Err(error @ HipError::Compile { .. }) => {
            let text = error.to_string();
            assert!(text.contains("kernels/broken.cu"), "{text}");
            assert!(text.contains(":3:"), "the log should point at line 3: {text}");
            assert!(text.contains("undeclared_name"), "{text}");
            assert!(text.contains("--offload-arch=gfx90a"), "{text}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn no_library_is_library_not_found_naming_libamdhip64_and_what_was_tried() {
    let empty = empty_dir("no-library");
    match HipBackend::open(0, &LibrarySearch::only([&empty])) {
        Err(HipError::LibraryNotFound { library, tried }) => {
            assert_eq!(library, "libamdhip64");
            assert_eq!(tried.len(), 1, "{tried:?}");
            assert!(tried[0].contains(&empty.display().to_string()), "{tried:?}");
        }
        Err(other) => panic!("expected LibraryNotFound, got {other}"),
        Ok(_) => panic!("a backend opened from an empty folder"),
    }
    // Through the Backend-facing constructor: Unavailable, with how to fix it.
    match HipBackend::with_library_search(0, &LibrarySearch::only([&empty])) {
        Err(BackendError::Unavailable(message)) => {
            assert!(message.contains("libamdhip64 not found"), "{message}");
            assert!(message.contains("ROCM_PATH"), "{message}");
        }
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("a backend opened from an empty folder"),
    }
    // No folder at all: says the search path is empty.
    match HipBackend::open(0, &LibrarySearch::only(Vec::<PathBuf>::new())) {
        Err(error @ HipError::LibraryNotFound { .. }) => {
            assert!(error.to_string().contains("the search path is empty"), "{error}")
        }
        Err(other) => panic!("expected LibraryNotFound, got {other}"),
        Ok(_) => panic!("a backend opened from no folder"),
    }
    let _ = std::fs::remove_dir_all(&empty);
}

#[test]
fn the_unpacked_runtime_without_a_gpu_is_no_device() {
    let dir = runtime_or_skip!();
    // The same process also searched an empty folder (above, maybe concurrently): the search is
    // per call, nothing global decides.
    let empty = empty_dir("no-device");
    assert!(matches!(
        HipBackend::open(0, &LibrarySearch::only([&empty])),
        Err(HipError::LibraryNotFound { library: "libamdhip64", .. })
    ));
    let _ = std::fs::remove_dir_all(&empty);
    match HipBackend::open(0, &LibrarySearch::only([&dir])) {
        Err(HipError::NoDevice { call, code, message }) => {
            assert_eq!(call, "hipGetDeviceCount");
            assert_eq!(code, HIP_ERROR_NO_DEVICE);
            assert_eq!(message, "hipErrorNoDevice");
        }
        Err(other) => panic!("expected NoDevice, got {other}"),
        Ok(_) => {
            skip::skip("this machine has an AMD GPU");
            return;
        }
    }
    match HipBackend::with_library_search(0, &LibrarySearch::only([&dir])) {
        Err(BackendError::Unavailable(message)) => {
            assert!(message.starts_with("no AMD GPU"), "{message}");
            assert!(message.contains("100 (hipErrorNoDevice)"), "{message}");
        }
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("opened a device the previous call did not see"),
    }
}

#[test]
fn hiprtc_falls_back_to_the_hip_runtime_itself_on_rocm_5() {
    let dir = runtime_or_skip!();
    let search = LibrarySearch::only([&dir]);
    let hip = HipLib::load(&search).expect("the unpacked runtime loads");
    assert!(!dir.join("libhiprtc.so").exists(), "Debian's ROCm 5.2 has no separate libhiprtc");
    let rtc = HiprtcLib::load(&search, &hip).expect("hiprtc is exported by libamdhip64.so.5");
    assert_eq!(rtc.origin, hip.loaded.origin);
}

#[test]
fn missing_hipblas_is_library_not_found_saying_every_plan_needs_it() {
    let dir = runtime_or_skip!();
    match HipblasLib::load(&LibrarySearch::only([&dir])) {
        Err(error @ HipError::LibraryNotFound { library: "libhipblas", .. }) => {
            let text = error.to_string();
            assert!(text.contains("hipBLAS"), "{text}");
            assert!(text.contains("GEMMs"), "{text}");
        }
        Err(other) => panic!("expected LibraryNotFound for libhipblas, got {other}"),
        Ok(lib) => skip::skip(format!("hipBLAS found at {}", lib.origin)),
    }
}

#[test]
fn without_rccl_the_error_names_every_file_tried_and_the_variable() {
    if std::env::var_os(runtime_hip::rccl::RCCL.variable).is_some() {
        skip::skip("MEMO_RCCL_LIBRARY is set here: the folder search does not run");
        return;
    }
    let dir = empty_dir("no-rccl");
    let error = runtime_hip::rccl::load(&LibrarySearch::only([&dir])).expect_err("an empty folder has no RCCL");
    assert_eq!(
        error,
        runtime_hip::rccl::NcclError::LibraryNotFound {
            flavour: runtime_hip::rccl::RCCL,
            tried: vec![format!("{}/{{librccl.so.1,librccl.so}} (no such file)", dir.display())],
        }
    );
    let text = BackendError::from(error).to_string();
    assert!(text.contains("RCCL cannot be loaded") && text.contains("MEMO_RCCL_LIBRARY"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
