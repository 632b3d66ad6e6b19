//! Dumps the first training step of a training model on the CPU backend, for an outside
//! implementation to repeat and compare (`examples/python/llama_step_compare.py` does it with
//! PyTorch / Hugging Face `transformers`):
//!
//! ```text
//! cargo run --release -p runtime-cpu --example first_step_dump -- [--model tiny-llama] [--seq 32] [--seed 11] --out DIR
//! ```
//!
//! Into `DIR` it writes, as raw little-endian files: every initial parameter
//! (`param.<role>[.<layer>].bf16`, `rows x row_elements` bf16, row-major), the step's tokens and
//! next-token targets (`tokens.u32`, `targets.u32`), and after one `Trainer::step` every gradient
//! (`grad.<role>[.<layer>].bf16`, the same shape as its parameter); and `manifest.json`, which
//! names each file with its role, layer, rows and row elements, and holds the model's
//! configuration and the step's mean loss.
//!
//! Layouts (those of the plan and the kernels, `runtime-cpu/src/ops`): every weight is
//! `out_features x in_features` (like `torch.nn.Linear.weight`); `w1` of SwiGLU is the gate's `f`
//! rows followed by the up projection's `f` rows; `w2` is the down projection (`h x f`);
//! `embedding` and the untied `classifier` are `V x h`; the attention's rotary positions turn
//! interleaved pairs `(2i, 2i + 1)` of each head of `q` and `k`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memo_plan_core::plan::{BufferKind, Strategy, TensorRole};
use memo_runtime::data::{TextData, DEFAULT_TEXT};
use memo_runtime::{cpu_hardware, training_model, AdamW, TrainOptions, Trainer, TRAINING_MODELS};
use runtime_cpu::CpuBackend;

struct Args {
    model: String,
    seq: u64,
    seed: u64,
    out: PathBuf,
}

fn parse() -> Result<Args, String> {
    let mut args = Args { model: "tiny-llama".into(), seq: 32, seed: 11, out: PathBuf::new() };
    let mut out = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => args.model = value()?,
            "--seq" => args.seq = value()?.parse().map_err(|e| format!("--seq: {e}"))?,
            "--seed" => args.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--out" => out = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                return Err("usage: first_step_dump [--model NAME] [--seq N] [--seed S] --out DIR".into());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    args.out = out.ok_or("--out DIR is required")?;
    Ok(args)
}

/// `role` or `role.layer`.
fn key_name(role: TensorRole, layer: Option<u32>) -> String {
    match layer {
        Some(l) => format!("{}.{l}", role.name()),
        None => role.name().to_string(),
    }
}

/// Dumps the first step of training model `model` on `seq` tokens from parameters seeded by
/// `seed` into `out`; returns a one-line summary. (`runtime-cpu/tests/torch_compare.rs` calls it.)
pub fn dump(model: &str, seq: u64, seed: u64, out: &Path) -> Result<String, String> {
    let args = Args { model: model.to_string(), seq, seed, out: out.to_path_buf() };
    let model = training_model(&args.model, args.seq)
        .ok_or_else(|| format!("unknown model {:?} (one of {})", args.model, TRAINING_MODELS.join(", ")))?;
    let options = TrainOptions {
        model: model.clone(),
        strategy: Strategy::KeepAll,
        forced_alpha: None,
        hardware: cpu_hardware(1 << 30),
        seed: args.seed,
        adamw: AdamW { lr: 3e-3, ..AdamW::default() },
    };
    let mut trainer = Trainer::new(CpuBackend::new(), &options).map_err(|e| e.to_string())?;
    let shapes: Vec<_> = trainer
        .report()
        .plan
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::Parameter)
        .map(|b| ((b.role, b.layer), (b.rows, b.row_bytes / 2)))
        .collect();
    let shape_of = |key| shapes.iter().find(|(k, _)| *k == key).map(|(_, s)| *s);
    let parameters = trainer.parameters().map_err(|e| e.to_string())?;
    let mut data = TextData::from_bytes(DEFAULT_TEXT.as_bytes())?;
    let (tokens, targets) = data.next_batch(model.micro_batch as usize, model.seq_len as usize);
    let loss = trainer.step(&tokens, &targets).map_err(|e| e.to_string())?;
    let gradients = trainer.buffers_of_kind(BufferKind::Gradient).map_err(|e| e.to_string())?;

    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let write = |name: &str, bytes: &[u8]| {
        let path = args.out.join(name);
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))
    };
    let u32_bytes = |v: &[u32]| v.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>();
    write("tokens.u32", &u32_bytes(&tokens))?;
    write("targets.u32", &u32_bytes(&targets))?;

    let entries = |kind: &str, list: &[memo_runtime::NamedBytes]| -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for ((role, layer), bytes) in list {
            let (rows, row_elements) = shape_of((*role, *layer))
                .ok_or_else(|| format!("{kind} {} has no parameter of its shape", key_name(*role, *layer)))?;
            if rows * row_elements * 2 != bytes.len() as u64 {
                return Err(format!(
                    "{kind} {}: {} bytes, not {rows} x {row_elements} bf16",
                    key_name(*role, *layer),
                    bytes.len()
                ));
            }
            let file = format!("{kind}.{}.bf16", key_name(*role, *layer));
            write(&file, bytes)?;
            let layer = layer.map_or("null".to_string(), |l| l.to_string());
            out.push(format!(
                "{{\"role\": \"{}\", \"layer\": {layer}, \"rows\": {rows}, \"row_elements\": {row_elements}, \"file\": \"{file}\"}}",
                role.name()
            ));
        }
        Ok(out)
    };
    let params = entries("param", &parameters)?;
    let grads = entries("grad", &gradients)?;

    let a = &model.architecture;
    let mut json = String::new();
    let _ = writeln!(json, "{{");
    let _ = writeln!(json, "  \"model\": \"{}\",", args.model);
    let _ = writeln!(
        json,
        "  \"config\": {{\"layers\": {}, \"hidden\": {}, \"heads\": {}, \"kv_heads\": {}, \"ffn_hidden\": {}, \"vocab\": {}, \
         \"rope_theta\": {:?}, \"norm_eps\": {:?}, \"seq_len\": {}, \"micro_batch\": {}, \"ffn\": \"{}\", \"norm\": \"{}\", \
         \"biases\": \"{}\", \"tied_embeddings\": {}}},",
        model.layers,
        model.hidden,
        model.heads,
        model.kv_heads,
        model.ffn_hidden,
        model.vocab,
        a.rope_theta,
        a.norm_eps,
        model.seq_len,
        model.micro_batch,
        a.ffn.name(),
        a.norm.name(),
        a.biases.name(),
        a.tied_embeddings
    );
    let _ = writeln!(json, "  \"seed\": {},", args.seed);
    let _ = writeln!(json, "  \"loss\": {:?},", f64::from(loss));
    let _ = writeln!(json, "  \"tokens\": \"tokens.u32\",");
    let _ = writeln!(json, "  \"targets\": \"targets.u32\",");
    let _ = writeln!(json, "  \"parameters\": [\n    {}\n  ],", params.join(",\n    "));
    let _ = writeln!(json, "  \"gradients\": [\n    {}\n  ]", grads.join(",\n    "));
    let _ = writeln!(json, "}}");
    write("manifest.json", json.as_bytes())?;
    Ok(format!(
        "{}: {} tokens, seed {}, loss {loss}; {} parameters and {} gradients written to {}",
        args.model,
        tokens.len(),
        args.seed,
        parameters.len(),
        gradients.len(),
        args.out.display()
    ))
}

fn main() -> ExitCode {
    match parse().and_then(|args| dump(&args.model, args.seq, args.seed, &args.out)) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("first_step_dump: {e}");
            ExitCode::FAILURE
        }
    }
}
