//! The HIP backend on a real AMD GPU, compared against the CPU reference. Each test opens
//! `HipBackend::new(0)` (ROCm found by `ROCM_PATH`, `HIP_PATH`, `/opt/rocm/lib` or the system
//! search) and prints SKIP with the reason when there is no usable library or device.
//!
//! None of these has run on AMD hardware yet (`spec/backends.md, HIP`).

#[path = "../../tests/support/skip.rs"]
mod skip;

use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::{EventId, Strategy, Stream};
use memo_runtime::{cpu_hardware, training_model, AdamW, Backend, BackendError, Space, Span, TrainOptions, Trainer};
use runtime_cpu::CpuBackend;
use runtime_hip::HipBackend;

fn backend_or_skip() -> Option<HipBackend> {
    match HipBackend::new(0) {
        Ok(backend) => Some(backend),
        Err(error @ BackendError::Unavailable(_)) => {
            skip::skip(format!("no HIP device: {error}"));
            None
        }
        Err(other) => panic!("a HIP installation and device are present but the backend failed: {other}"),
    }
}

fn span(space: Space, offset: u64, len: u64) -> Span {
    Span { space, offset, len }
}

#[test]
fn copies_between_arena_and_host_slab_follow_the_plan_events() {
    let Some(mut backend) = backend_or_skip() else {
        return;
    };
    backend.allocate(1 << 16, 1 << 16, 2).expect("allocate");
    assert_eq!(backend.memory().device_bytes, 1 << 16);
    assert_eq!(backend.memory().host_bytes, 1 << 16);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    backend.upload(span(Space::Device, 100, 4096), &data).expect("upload");
    // Swap out, then back in at another place, ordered by events as a plan orders them.
    // Safety: the swap-in reads the slab only after event 0, recorded after the swap-out that
    // writes it; the two device spans are disjoint, and nothing else runs.
    unsafe { backend.copy(0, Stream::DeviceToHost, span(Space::Device, 100, 4096), span(Space::Host, 8, 4096)) }
        .expect("d2h");
    backend.record(1, Stream::DeviceToHost, EventId(0)).expect("record");
    backend.wait(2, Stream::HostToDevice, EventId(0)).expect("wait");
    // Safety: as above.
    unsafe { backend.copy(3, Stream::HostToDevice, span(Space::Host, 8, 4096), span(Space::Device, 20_000, 4096)) }
        .expect("h2d");
    backend.synchronize().expect("synchronize");
    assert_eq!(backend.download(span(Space::Host, 8, 4096)).expect("download host"), data);
    assert_eq!(backend.download(span(Space::Device, 20_000, 4096)).expect("download device"), data);
}

#[test]
fn spans_outside_the_memory_and_waits_before_records_are_refused() {
    let Some(mut backend) = backend_or_skip() else {
        return;
    };
    backend.allocate(4096, 1024, 1).expect("allocate");
    let outside = span(Space::Device, 4000, 200);
    assert_eq!(backend.upload(outside, &[0; 200]), Err(BackendError::OutOfBounds { span: outside, size: 4096 }));
    let host_outside = span(Space::Host, 1000, 100);
    // Safety: no other work is enqueued (and the span is refused before any is).
    let refused = unsafe { backend.copy(0, Stream::DeviceToHost, span(Space::Device, 0, 100), host_outside) };
    assert!(matches!(refused, Err(BackendError::OutOfBounds { size: 1024, .. })));
    assert!(matches!(backend.wait(1, Stream::Compute, EventId(0)), Err(BackendError::Kernel { instruction: 1, .. })));
    assert!(matches!(backend.record(2, Stream::Compute, EventId(5)), Err(BackendError::Kernel { instruction: 2, .. })));
    backend.synchronize().expect("nothing was enqueued wrongly");
}

fn train(backend: impl Backend, model: &ModelConfig, strategy: Strategy, steps: usize) -> Vec<f32> {
    let options = TrainOptions {
        model: model.clone(),
        strategy,
        forced_alpha: None,
        hardware: cpu_hardware(1 << 30),
        seed: 7,
        adamw: AdamW::default(),
    };
    let mut trainer = Trainer::new(backend, &options).unwrap_or_else(|e| panic!("{strategy:?}: {e}"));
    let tokens_per_step = (model.seq_len * model.micro_batch) as usize;
    let text: Vec<u32> = b"the same verified plan runs on the cpu and on an amd gpu. "
        .iter()
        .map(|&b| u32::from(b))
        .cycle()
        .take(tokens_per_step * (steps + 1) + 1)
        .collect();
    let losses = (0..steps)
        .map(|step| {
            let start = step * tokens_per_step;
            trainer
                .step(&text[start..start + tokens_per_step], &text[start + 1..start + 1 + tokens_per_step])
                .unwrap_or_else(|e| panic!("{strategy:?} step {step}: {e}"))
        })
        .collect();
    let totals = &trainer.report().plan.totals;
    let memory = trainer.memory();
    assert_eq!(memory.device_bytes, totals.arena_bytes, "the arena is the plan's");
    assert_eq!(memory.host_bytes, totals.host_bytes, "the host slab is the plan's");
    losses
}

#[test]
fn the_tiny_model_trains_like_on_the_cpu_within_bf16_tolerance() {
    if backend_or_skip().is_none() {
        return;
    }
    let model = training_model("tiny", 64).expect("the tiny model");
    for strategy in [Strategy::Memo, Strategy::KeepAll] {
        let cpu = train(CpuBackend::new(), &model, strategy, 3);
        let hip = HipBackend::new(0).expect("opened above");
        let gpu = train(hip, &model, strategy, 3);
        for (step, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
            // bf16 storage, different summation orders: a few parts in a thousand.
            let tolerance = 2e-2 * c.abs().max(1.0);
            assert!((c - g).abs() <= tolerance, "{strategy:?} step {step}: cpu loss {c}, hip loss {g}");
        }
    }
}

#[test]
fn measuring_times_every_copy_of_the_step() {
    let Some(backend) = backend_or_skip() else {
        return;
    };
    let mut backend = backend.measure();
    backend.allocate(1 << 20, 1 << 20, 1).expect("allocate");
    // Safety: the swap-in reads the slab and writes the arena only after event 0, recorded after
    // the swap-out that read the arena and wrote the slab; nothing else runs.
    unsafe { backend.copy(0, Stream::DeviceToHost, span(Space::Device, 0, 1 << 20), span(Space::Host, 0, 1 << 20)) }
        .expect("d2h");
    backend.record(1, Stream::DeviceToHost, EventId(0)).expect("record");
    backend.wait(2, Stream::HostToDevice, EventId(0)).expect("wait");
    // Safety: as above.
    unsafe { backend.copy(3, Stream::HostToDevice, span(Space::Host, 0, 1 << 20), span(Space::Device, 0, 1 << 20)) }
        .expect("h2d");
    backend.synchronize().expect("synchronize");
    let timings = backend.timings().expect("measuring");
    assert_eq!(timings.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 3]);
    assert_eq!(timings[0].1, 0.0, "the step starts at its earliest start");
    assert!(timings.iter().all(|&(_, start, end)| start <= end));
    assert!(timings[1].1 >= timings[0].2, "the h2d copy waited for the d2h copy's event");
}

#[test]
fn rccl_joins_at_one_rank_on_the_backends_device() {
    let Some(backend) = backend_or_skip() else {
        return;
    };
    let rccl = match runtime_hip::rccl::load(&runtime_hip::LibrarySearch::from_env()) {
        Ok(rccl) => rccl,
        Err(error) => {
            skip::skip(format!("no usable RCCL: {error}"));
            return;
        }
    };
    let id = rccl.unique_id().expect("unique id");
    let comm = backend.join_collectives(&rccl, &id, 1, 0, std::time::Duration::from_secs(60)).expect("one rank joins");
    assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    comm.check().expect("no asynchronous error");
    comm.destroy().expect("destroy");
}
