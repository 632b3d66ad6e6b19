//! Compiles every kernel source of `memo_kernels::SOURCES` with NVRTC for sm_80 and sm_90, on
//! any machine, once per `AttentionVariant` (its options reach every source, as in
//! the backend): NVRTC comes from `.cache/nvrtc/` (`scripts/fetch-nvrtc.sh`, run by `scripts/test.sh`).
//! Without that folder the test prints SKIP with the reason and passes.

#[path = "../../tests/support/skip.rs"]
mod skip;

use memo_kernels::{compile_options, AttentionVariant, Target, SOURCES};
use runtime_cuda::nvrtc_check::Nvrtc;

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    let folder = match Nvrtc::cache_folder() {
        Ok(folder) => folder,
        Err(why) => {
            skip::skip(format!(
                "run scripts/fetch-nvrtc.sh (scripts/test.sh does) to compile-check the kernels with NVRTC: {why}"
            ));
            return;
        }
    };
    let library = folder.join("lib").join("libnvrtc.so");
    // Safety: the library scripts/fetch-nvrtc.sh unpacked from NVIDIA's NVRTC wheel (it wrote
    // READY after checking the wheel), so it is NVRTC with nvrtc.h's signatures.
    let nvrtc = match unsafe { Nvrtc::load(&library) } {
        Ok(nvrtc) => nvrtc,
        Err(error) => panic!("{error}; delete .cache/nvrtc and rerun scripts/fetch-nvrtc.sh"),
    };
    let version = nvrtc.version().unwrap_or((0, 0));
    println!("NVRTC {}.{} from {}", version.0, version.1, library.display());
    assert!(!SOURCES.is_empty(), "memo_kernels::SOURCES is empty");
    let mut failures = Vec::new();
    // One thread per (architecture, variant, source): NVRTC programs are independent. The
    // variants differ in attention.cu only.
    let jobs: Vec<(u32, AttentionVariant, &memo_kernels::Source)> = [80, 90]
        .iter()
        .flat_map(|&sm| {
            AttentionVariant::ALL.into_iter().flat_map(move |variant| {
                SOURCES
                    .iter()
                    .filter(move |s| variant == AttentionVariant::default() || s.name == "attention.cu")
                    .map(move |s| (sm, variant, s))
            })
        })
        .collect();
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|&(sm, variant, source)| {
                let nvrtc = &nvrtc;
                scope.spawn(move || {
                    let mut options = compile_options(Target::Cuda { sm });
                    options.extend(variant.options());
                    options.push("--ptxas-options=-v".into());
                    nvrtc.compile(source.name, &source.standalone_text(), &options)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(runtime_cuda::CudaError::NvrtcLibrary("a compile thread panicked".into())))
            })
            .collect()
    });
    for (&(sm, variant, source), result) in jobs.iter().zip(results) {
        let sm = format!("{sm} ({} attention)", variant.name());
        match result {
            Ok(compiled) => {
                println!("sm_{sm} {}: {} cubin bytes", source.name, compiled.cubin_bytes);
                for line in compiled.log.lines().filter(|l| l.contains("registers") || l.contains("spill")) {
                    println!("    {}", line.trim());
                }
                // ptxas names every entry it compiles (`Compiling entry function 'name'`).
                for kernel in source.kernels {
                    if !compiled.log.contains(&format!("'{kernel}'")) {
                        failures
                            .push(format!("sm_{sm} {}: lists kernel {kernel}, which was not compiled", source.name));
                    }
                }
                if compiled.cubin_bytes == 0 {
                    failures.push(format!("sm_{sm} {}: empty cubin", source.name));
                }
            }
            Err(error) => failures.push(format!("sm_{sm}: {error}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
