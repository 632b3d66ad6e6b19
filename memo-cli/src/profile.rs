//! `memo profile`: measure a device through the `Backend` trait (copy bandwidth each way, one
//! layer's forward time, attention's and one GEMM's FLOP/s) and write a `[machine]` TOML that
//! `--machine-file` reads (the cost model times attention launches and matrix products at the
//! measured kernel rates).
//!
//! The layer time is measured by difference: the keep-all plan of the model cut to `2` and to `4`
//! layers trains steps on the device, and `(median step(4) - median step(2)) / 2 / 3` is one
//! layer's forward. Why this way: it runs through the `Backend` trait alone, so it works on every
//! backend whether or not it times single instructions ([`memo_runtime::Backend::timings`] is
//! optional); the difference cancels what does not grow with layers (the embedding, the
//! classifier and loss, the token upload, the step's synchronisation); and the division by 3 is
//! the cost model's own assumption that a layer's backward costs twice its forward
//! (`spec/cost-model.md` §5). What it measures is therefore a third of one layer's forward,
//! backward and AdamW update at this sequence length (AdamW's share is small at long sequences).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use memo_plan_core::cost::{layer_forward_flops, AttentionFlops};
use memo_plan_core::model::{Hardware, ModelConfig, Parallelism};
use memo_plan_core::plan::Op;
use memo_plan_core::plan::{EventId, Strategy, Stream};
use memo_runtime::data::TextData;
use memo_runtime::{AdamW, Backend, KernelArg, KernelContext, Space, Span, TrainOptions, Trainer};
use runtime_cpu::CpuBackend;
use serde_json::json;

use crate::config::{parse_bytes, parse_tokens};
use crate::device::{parse_device, runtime_failure, AnyBackend, Device, Kind};
use crate::exit::{self, Failure};
use crate::human;

/// What `memo profile --help` says it does.
pub const LONG_ABOUT: &str = "\
Measure a device through the same Backend interface a plan runs on, and write the [machine] TOML
that `memo plan --machine-file` and `memo train --machine-file` read:
  d2h, h2d         the median of --repeats copies of --copy-size bytes between the device arena
                   and the pinned host slab, on the plan's copy streams;
  layer_forward_s  one layer's forward at --seq tokens: the keep-all plan of the model cut to 2
                   and to 4 layers trains steps on the device; a third of the per-layer
                   difference of their median step times (a layer's backward costs twice its
                   forward, as the cost model assumes);
  achieved_flops   that layer's forward FLOPs (attention halved for the causal mask) over it.
  attention_forward_flops, attention_backward_flops, gemm_flops
                   attention's forward and backward FLOP/s (causal FLOPs; the backward's are 5/2
                   of the forward's) and one GEMM's (the layer's first FFN product) at the
                   profiled shape, the median of --repeats launches each through the backend (on
                   CUDA the attention that MEMO_CUDA_ATTENTION picks, cuDNN by default); a plan
                   times its attention launches and matrix products at them, other launches at
                   achieved_flops.
The other fields (device and host memory, peak FLOP/s) come from --machine (default: h200x1 for
cuda, mi300x8 for hip, a 64 GiB host for cpu). The file gives the measured rate, achieved_flops:
a plan for any model and sequence times its layers at that rate (the profiled shape gets the
measured layer_forward_s back exactly). layer_forward_s itself is written as a comment: it holds
for the profiled shape only. Profile at the shape you plan for the most faithful rate.";

const EXAMPLES: &str = "\
Examples:
  memo profile --device cuda --model examples/models/gpt-1b.toml --seq 16K --out h200.toml
  memo profile --device cpu --model tiny --seq 256 --out cpu.toml
  memo plan --model 7b --seq 128K --machine-file h200.toml";

/// The arguments of `memo profile`.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("{EXAMPLES}\n\n{}", exit::HELP))]
pub struct ProfileArgs {
    /// The backend: cpu, cuda, cuda:N, hip or hip:N (N: the device's ordinal, default 0)
    #[arg(long, value_name = "DEVICE", value_parser = parse_device)]
    device: Device,

    /// tiny, small, tiny-llama, small-llama, or a TOML file with a [model] table (its layer shape is what is timed)
    #[arg(long, default_value = "tiny", value_name = "MODEL")]
    model: String,

    /// Tokens per sequence of the timed steps; K, M and G are binary (K = 1024)
    #[arg(long, default_value = "256", value_name = "TOKENS", value_parser = parse_tokens, allow_negative_numbers = true)]
    seq: u64,

    /// The machine preset whose other fields the file keeps (a800x8, h100x8, h200x1, mi300x8)
    #[arg(long, value_name = "NAME")]
    machine: Option<String>,

    /// Bytes of each bandwidth copy (default: 512MiB on a GPU, 64MiB on the CPU)
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    copy_size: Option<u64>,

    /// Timed copies and timed steps of each kind (after one warm-up each); the median is kept
    #[arg(long, default_value_t = 5, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    repeats: u32,

    /// Write the [machine] TOML here (atomically); without it, print it on standard output
    #[arg(long, short = 'o', value_name = "FILE")]
    out: Option<PathBuf>,

    /// Print the measurements as one JSON object on standard output (with --out)
    #[arg(long, requires = "out")]
    json: bool,
}

/// What was measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Device-to-host bytes per second (median).
    pub d2h_bytes_per_s: f64,
    /// Host-to-device bytes per second (median).
    pub h2d_bytes_per_s: f64,
    /// One layer's forward, seconds.
    pub layer_forward_s: f64,
    /// Median step times of the 2- and 4-layer models, seconds.
    pub step_s: [f64; 2],
}

/// Rates of single ops at the profiled shape, written as the machine file's
/// `attention_forward_flops`, `attention_backward_flops` and `gemm_flops`: the cost model times
/// attention launches and matrix products at them (`spec/cost-model.md` section 7).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpRates {
    /// Attention forward, FLOP/s (causal FLOPs: 4 s^2/2 h).
    pub attention_forward_flops: f64,
    /// Attention backward, FLOP/s (the FLOPs it executes: 5/2 of the forward's,
    /// [`memo_plan_core::cost::attention_backward_executed_flops`]).
    pub attention_backward_flops: f64,
    /// The layer's first FFN matrix product (`linear`, s x hidden -> s x ffn_hidden), FLOP/s.
    pub gemm_flops: f64,
}

/// The layer counts whose step times are differenced.
const LAYERS: [u32; 2] = [2, 4];

/// Runs `memo profile`.
pub fn run(args: &ProfileArgs) -> Result<(), Failure> {
    let model = crate::config::model_arg(&args.model, args.seq, 1)?;
    let base = args.device.machine(args.machine.as_deref(), None)?;
    let copy_bytes = args.copy_size.unwrap_or(if args.device.kind == Kind::Cpu { 64 << 20 } else { 512 << 20 });
    if copy_bytes == 0 {
        return Err(Failure::new(exit::BAD_INPUT, "--copy-size must be at least 1 byte"));
    }
    let repeats = args.repeats as usize;
    // Open the device first: one that cannot be opened is one line, before anything else is said.
    let backend = args.device.open(false, CpuBackend::new)?;
    eprintln!(
        "memo profile: {} copies of {} each way on {}, then steps of {} at {} tokens with {} and {} layers",
        repeats,
        human::binary_units(copy_bytes),
        args.device.label(),
        model.name,
        model.seq_len,
        LAYERS[0],
        LAYERS[1]
    );
    let (d2h, h2d) = bandwidth(backend, &args.device, copy_bytes, repeats)?;
    let mut step_s = [0.0; 2];
    for (slot, layers) in step_s.iter_mut().zip(LAYERS) {
        *slot = median_step_s(&args.device, &model, layers, &base, repeats)?;
    }
    let per_layer = (step_s[1] - step_s[0]) / f64::from(LAYERS[1] - LAYERS[0]);
    if !(per_layer.is_finite() && per_layer > 0.0) {
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "the {}-layer step ({:.6} s) was not slower than the {}-layer step ({:.6} s): the layer is too \
                 small to time; profile at a longer --seq or with more --repeats",
                LAYERS[1], step_s[1], LAYERS[0], step_s[0]
            ),
        ));
    }
    let profile = Profile { d2h_bytes_per_s: d2h, h2d_bytes_per_s: h2d, layer_forward_s: per_layer / 3.0, step_s };
    let rates = op_rates(&args.device, &model, repeats)?;
    let text = machine_toml(&args.device, &args.model, &model, &base, &profile, &rates, copy_bytes, repeats)?;
    let mut out = std::io::stdout().lock();
    let write_failed = |e: std::io::Error| Failure::new(exit::IO_ERROR, format!("cannot write: {e}"));
    match &args.out {
        Some(path) => {
            crate::checked::write_atomically(path, text.as_bytes()).map_err(|e| {
                Failure::new(exit::IO_ERROR, format!("cannot write {}: {e}; check the directory", path.display()))
            })?;
            if args.json {
                let line = json!({"device": args.device.label(), "model": model.name, "seq_len": model.seq_len,
                    "d2h_bytes_per_s": d2h, "h2d_bytes_per_s": h2d, "layer_forward_s": profile.layer_forward_s,
                    "step_s_2_layers": step_s[0], "step_s_4_layers": step_s[1], "copy_bytes": copy_bytes,
                    "attention_forward_flops": rates.attention_forward_flops,
                    "attention_backward_flops": rates.attention_backward_flops, "gemm_flops": rates.gemm_flops,
                    "repeats": repeats, "out": path.display().to_string()});
                writeln!(out, "{line}").map_err(write_failed)?;
            } else {
                eprintln!(
                    "d2h {:.2} GB/s, h2d {:.2} GB/s, layer forward {:.6} s, attention {:.3e}/{:.3e} FLOP/s \
                     (forward/backward), GEMM {:.3e} FLOP/s; wrote {}",
                    d2h / 1e9,
                    h2d / 1e9,
                    profile.layer_forward_s,
                    rates.attention_forward_flops,
                    rates.attention_backward_flops,
                    rates.gemm_flops,
                    path.display()
                );
            }
        }
        None => out.write_all(text.as_bytes()).map_err(write_failed)?,
    }
    Ok(())
}

/// Median device-to-host and host-to-device bytes per second of `repeats` copies of `bytes`,
/// each enqueued on its copy stream with an event recorded after it, then synchronised. The
/// copied bytes are checked once each way (a fast copy that copies nothing is no measurement).
fn bandwidth(mut backend: AnyBackend, device: &Device, bytes: u64, repeats: usize) -> Result<(f64, f64), Failure> {
    let failed = |e: memo_runtime::BackendError| runtime_failure(e.into());
    backend.allocate(bytes, bytes, 2).map_err(failed)?;
    let len = usize::try_from(bytes)
        .map_err(|_| Failure::new(exit::BAD_INPUT, "--copy-size is larger than this machine's address space"))?;
    let pattern: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(31) >> 3) as u8).collect();
    let arena = Span { space: Space::Device, offset: 0, len: bytes };
    let slab = Span { space: Space::Host, offset: 0, len: bytes };
    backend.upload(arena, &pattern).map_err(failed)?;
    backend.upload(slab, &vec![0u8; len]).map_err(failed)?;
    let mut rates = [Vec::new(), Vec::new()];
    let directions = [(Stream::DeviceToHost, arena, slab), (Stream::HostToDevice, slab, arena)];
    for (index, (stream, src, dst)) in directions.into_iter().enumerate() {
        for repeat in 0..=repeats {
            let started = Instant::now();
            // Safety: one copy at a time: each is followed by `synchronize` before the next, and
            // nothing else is enqueued, so no other work touches its bytes while it runs.
            unsafe { backend.copy(0, stream, src, dst) }.map_err(failed)?;
            backend.record(1, stream, EventId(index as u32)).map_err(failed)?;
            backend.synchronize().map_err(failed)?;
            let seconds = started.elapsed().as_secs_f64();
            if repeat > 0 {
                rates[index].push(bytes as f64 / seconds.max(1e-9));
            }
        }
        let copied = backend.download(dst).map_err(failed)?;
        if copied != pattern {
            return Err(Failure::new(
                exit::INTERNAL_ERROR,
                format!(
                    "the {} backend's {} copy did not copy the bytes (a backend bug)",
                    device.label(),
                    stream.name()
                ),
            ));
        }
    }
    Ok((median(&mut rates[0]), median(&mut rates[1])))
}

/// The median step time of `model` cut to `layers` layers, keep-all, on a fresh backend.
fn median_step_s(
    device: &Device,
    model: &ModelConfig,
    layers: u32,
    machine: &Hardware,
    repeats: usize,
) -> Result<f64, Failure> {
    let mut model = model.clone();
    model.layers = layers;
    let options = TrainOptions {
        model: model.clone(),
        strategy: Strategy::KeepAll,
        forced_alpha: None,
        hardware: machine.clone(),
        seed: 0,
        adamw: AdamW::default(),
    };
    // On every backend, as `memo train`: a misfit says how much is over (profile at a shorter --seq).
    let planned = crate::device::plan_step(&options)?;
    crate::device::check_fits(&planned)?;
    let backend = device.open(false, CpuBackend::new)?;
    let mut trainer = Trainer::with_plan(backend, planned).map_err(runtime_failure)?;
    let mut data = TextData::from_bytes(memo_runtime::data::DEFAULT_TEXT.as_bytes())
        .map_err(|e| Failure::new(exit::INTERNAL_ERROR, format!("the shipped text: {e}")))?;
    let mut times = Vec::with_capacity(repeats);
    for repeat in 0..=repeats {
        let (tokens, targets) = data.next_batch(model.micro_batch as usize, model.seq_len as usize);
        let started = Instant::now();
        let loss = trainer.step(&tokens, &targets).map_err(runtime_failure)?;
        let seconds = started.elapsed().as_secs_f64();
        if !loss.is_finite() {
            return Err(Failure::new(
                exit::INTERNAL_ERROR,
                format!("the {layers}-layer step's loss is {loss} on {}: the backend computes wrong", device.label()),
            ));
        }
        if repeat > 0 {
            times.push(seconds);
        }
    }
    Ok(median(&mut times))
}

/// Attention (forward, backward) and one GEMM at the model's shape for `model.seq_len` tokens of
/// one sequence, each launched on a fresh backend's compute stream: one warm-up, then `repeats`
/// launches each followed by `synchronize`; the median time gives the rate. Inputs are the
/// arena's zeros (the time does not depend on the values). One more backend is opened for it.
fn op_rates(device: &Device, model: &ModelConfig, repeats: usize) -> Result<OpRates, Failure> {
    let failed = |e: memo_runtime::BackendError| runtime_failure(e.into());
    let (s, h, heads, ffn) = (model.seq_len, model.hidden, model.heads, model.ffn_hidden);
    let context = KernelContext {
        hidden: h,
        heads,
        kv_heads: model.kv_heads,
        kv_replicated: false,
        rope_theta: model.architecture.rope_theta,
        norm_eps: model.architecture.norm_eps,
        seq_len: s,
        vocab: model.vocab,
        loss_scale_tokens: s,
        adamw: AdamW::default(),
        // One GPU: the profile measures single-device rates.
        rank: 0,
        ranks: 1,
        context_rank: 0,
        context_ranks: 1,
    };
    let attention_flops = 4.0 * (s as f64) * (s as f64) / 2.0 * h as f64;
    let (row, lse) = (h * 2, heads * 4);
    // K and V: the model's key/value heads (fewer than the query heads with grouped-query attention).
    let kv = model.kv_heads * model.head_dim() * 2;
    // (op, each argument's (rows, row bytes), FLOPs of one launch)
    let launches = [
        (Op::Attention, vec![(s, row), (s, kv), (s, kv), (s, row), (s, lse)], attention_flops),
        (
            Op::AttentionBackward,
            vec![(s, row), (s, kv), (s, kv), (s, row), (s, lse), (s, row), (s, row), (s, kv), (s, kv)],
            memo_plan_core::cost::attention_backward_executed_flops(attention_flops),
        ),
        (Op::Linear, vec![(s, row), (ffn, row), (1, ffn * 2), (s, ffn * 2)], 2.0 * (s * h * ffn) as f64),
    ];
    // One backend (opening compiles the kernels), one arena for the largest launch.
    let mut planned = Vec::with_capacity(launches.len());
    let mut arena = 0u64;
    for (op, shapes, flops) in launches {
        let mut args = Vec::with_capacity(shapes.len());
        let mut offset = 0u64;
        for (&(rows, row_bytes), &(_, access)) in shapes.iter().zip(op.signature()) {
            let len = rows.saturating_mul(row_bytes);
            args.push(KernelArg {
                span: Span { space: Space::Device, offset, len },
                first_row: 0,
                rows,
                row_bytes,
                access,
            });
            offset = offset.saturating_add(len.div_ceil(256).saturating_mul(256));
        }
        arena = arena.max(offset);
        planned.push((op, args, flops));
    }
    let mut backend = device.open(false, CpuBackend::new)?;
    backend.allocate(arena, 0, 0).map_err(failed)?;
    let mut rates = [0.0f64; 3];
    for (slot, (op, args, flops)) in rates.iter_mut().zip(planned) {
        let mut times = Vec::with_capacity(repeats);
        for repeat in 0..=repeats {
            let started = Instant::now();
            // Safety: one launch at a time on one stream, each followed by `synchronize`; its
            // arguments are disjoint spans of the arena allocated above.
            unsafe { backend.launch(0, Stream::Compute, op, &args, &context) }.map_err(failed)?;
            backend.synchronize().map_err(failed)?;
            if repeat > 0 {
                times.push(started.elapsed().as_secs_f64());
            }
        }
        *slot = flops / median(&mut times).max(1e-12);
    }
    Ok(OpRates { attention_forward_flops: rates[0], attention_backward_flops: rates[1], gemm_flops: rates[2] })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The `[machine]` TOML: the base machine with the measured fields, every field written out.
#[allow(clippy::too_many_arguments)]
fn machine_toml(
    device: &Device,
    model_arg: &str,
    model: &ModelConfig,
    base: &Hardware,
    profile: &Profile,
    rates: &OpRates,
    copy_bytes: u64,
    repeats: usize,
) -> Result<String, Failure> {
    let layer_flops = layer_forward_flops(model, &Parallelism::single(), AttentionFlops::CausalHalved)
        .map_err(|e| Failure::new(exit::BAD_INPUT, format!("cannot count the layer's FLOPs: {e}")))?
        .total();
    let achieved = (layer_flops as f64 / profile.layer_forward_s).round().max(1.0) as u64;
    let rate = |r: f64| (r.round().max(1.0)) as u64;
    let kernels = [rates.attention_forward_flops, rates.attention_backward_flops, rates.gemm_flops].map(rate);
    // A device faster than its description's peak (the CPU's nominal figure) raises the peak:
    // the planner refuses achieved or a measured kernel rate above peak.
    let peak = kernels.into_iter().fold(base.peak_flops.max(achieved), u64::max);
    let preset = if memo_plan_core::model::HARDWARE_PRESETS.iter().any(|p| p.name == base.name) {
        format!("preset = {:?}\n", base.name)
    } else {
        String::new()
    };
    let text = format!(
        "# Written by `memo profile --device {device} --model {model_name} --seq {seq}`.\n\
         # d2h, h2d: the median of {repeats} copies of {copy_bytes} bytes each way between the arena and the\n\
         # pinned host slab, through the Backend trait. layer_forward_s: a third of the per-layer\n\
         # difference of the median step times of the keep-all plan at {l0} and {l1} layers\n\
         # ({s0:.6} s and {s1:.6} s), left as a comment below: it holds for this layer shape at\n\
         # {seq} tokens x {b} only. achieved_flops is the same measurement as a rate (the layer's\n\
         # forward FLOPs, attention halved, over layer_forward_s): plans of any model and sequence\n\
         # time their layers at it. Memory and peak_flops are from {base_name}{raised}.\n\
         [machine]\n\
         {preset}\
         device_memory = {device_memory}\n\
         host_memory_per_node = {host}\n\
         gpus_per_node = {gpus}\n\
         d2h = \"{d2h}\"\n\
         h2d = \"{h2d}\"\n\
         gpus_sharing_uplink = {sharing}\n\
         peak_flops = \"{peak}\"\n\
         achieved_flops = \"{achieved}\"\n\
         # layer_forward_s = {layer:e}\n\
         # Single ops at {seq} tokens of one sequence (the median of {repeats} launches, wall clock around\n\
         # launch and synchronize): attention (causal FLOPs; the backward's are 5/2 of the forward's) and\n\
         # one linear {h} -> {ffn}. The cost model times attention launches and matrix products at these\n\
         # rates, other launches at achieved_flops (spec/cost-model.md section 7).\n\
         attention_forward_flops = \"{attention_forward}\"\n\
         attention_backward_flops = \"{attention_backward}\"\n\
         gemm_flops = \"{gemm}\"\n",
        device = device.label(),
        model_name = model_arg,
        seq = model.seq_len,
        b = model.micro_batch,
        l0 = LAYERS[0],
        l1 = LAYERS[1],
        s0 = profile.step_s[0],
        s1 = profile.step_s[1],
        base_name = base.name,
        raised = if peak > base.peak_flops { " (peak raised to the fastest measured rate)" } else { "" },
        h = model.hidden,
        ffn = model.ffn_hidden,
        attention_forward = crate::units::exact_decimal(kernels[0], "FLOP/s"),
        attention_backward = crate::units::exact_decimal(kernels[1], "FLOP/s"),
        gemm = crate::units::exact_decimal(kernels[2], "FLOP/s"),
        device_memory = base.device_memory_bytes,
        host = base.host_memory_per_node_bytes,
        gpus = base.gpus_per_node,
        d2h = crate::units::exact_decimal(rate(profile.d2h_bytes_per_s), "B/s"),
        h2d = crate::units::exact_decimal(rate(profile.h2d_bytes_per_s), "B/s"),
        peak = crate::units::exact_decimal(peak, "FLOP/s"),
        achieved = crate::units::exact_decimal(achieved, "FLOP/s"),
        sharing = base.gpus_sharing_uplink,
        layer = profile.layer_forward_s,
    );
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
