//! Golden plans: canonical requests whose encoded plans are compared byte for byte with files in
//! `tests/golden/`. Same input, same bytes, on every platform. After an intended change to the
//! planner or the format, regenerate them with
//! `MEMO_BLESS=1 cargo test -p memo-tests --test golden_plans` and review the diff of
//! `tests/golden/README.md`, which lists each file's size, arena and checksum.

use memo_plan_core::check::check_plan;
use memo_plan_core::model::{Architecture, Hardware, ModelConfig, Parallelism};
use memo_plan_core::plan::{Plan, Strategy};
use memo_plan_core::planner::{plan, PlanRequest};

/// (file stem, model, seq, t, machine, strategy).
fn cases() -> Vec<(String, PlanRequest)> {
    let mut out = Vec::new();
    for strategy in Strategy::ALL {
        let model = ModelConfig::new("tiny", 4, 64, 4, 256, 1);
        let request = PlanRequest::new(model, Parallelism::single(), Hardware::preset("h200x1").unwrap(), strategy);
        out.push((format!("tiny-4l-256-t1-{}", strategy.name()), request));
    }
    let model = ModelConfig::new("tiny", 3, 64, 4, 128, 2);
    let request = PlanRequest::new(model, Parallelism::new(2, 1), Hardware::preset("mi300x8").unwrap(), Strategy::Memo);
    out.push(("tiny-3l-128x2-t2-memo".to_string(), request));
    // The Llama family: 4 query and 2 K/V heads at t = 4 (K/V replicated), SwiGLU, RMSNorm,
    // no biases, an untied classifier.
    let mut model = ModelConfig::new("tiny-llama", 3, 64, 4, 128, 1);
    (model.kv_heads, model.ffn_hidden, model.vocab) = (2, 176, 256);
    model.architecture = Architecture::llama(10_000.0, 1e-5);
    let request = PlanRequest::new(model, Parallelism::new(4, 1), Hardware::preset("mi300x8").unwrap(), Strategy::Memo);
    out.push(("tiny-llama-3l-128-t4-memo".to_string(), request));
    // Context parallelism (plan format 6, spec/context-parallel.md): c = 2 context ranks of t = 2,
    // the ring attention in both programs.
    let model = ModelConfig::new("tiny", 3, 64, 4, 256, 2);
    let parallel = Parallelism::new(2, 1).with_context(2);
    let request = PlanRequest::new(model, parallel, Hardware::preset("h100x8").unwrap(), Strategy::Memo);
    out.push(("tiny-3l-256x2-t2-c2-memo".to_string(), request));
    let model = ModelConfig::preset("7b", 1 << 20, 1).unwrap();
    let request = PlanRequest::new(model, Parallelism::new(8, 1), Hardware::preset("a800x8").unwrap(), Strategy::Memo);
    out.push(("7b-1m-t8-a800x8-memo".to_string(), request));
    out
}

fn golden_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

#[test]
fn plans_match_their_golden_bytes() {
    let bless = std::env::var_os("MEMO_BLESS").is_some();
    let mut index = String::from(
        "# Golden plans\n\nWritten by `MEMO_BLESS=1 cargo test -p memo-tests --test golden_plans`.\n\n\
         | file | bytes | arena bytes | host bytes | CRC-32 of the file |\n|---|---|---|---|---|\n",
    );
    for (stem, request) in cases() {
        let report = plan(&request).unwrap();
        check_plan(&report.plan).unwrap_or_else(|v| panic!("{stem}: {}", v[0]));
        let bytes = report.plan.encode();
        // Planning twice gives the same bytes.
        assert_eq!(plan(&request).unwrap().plan.encode(), bytes, "{stem}: not deterministic");
        let path = golden_dir().join(format!("{stem}.memo"));
        let t = report.plan.totals;
        index.push_str(&format!(
            "| {stem}.memo | {} | {} | {} | {:08x} |\n",
            bytes.len(),
            t.arena_bytes,
            t.host_bytes,
            crc32(&bytes)
        ));
        if bless {
            std::fs::write(&path, &bytes).unwrap();
            continue;
        }
        let golden =
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; create it with MEMO_BLESS=1", path.display()));
        assert!(
            golden == bytes,
            "{stem}: the plan differs from {} (regenerate with MEMO_BLESS=1 if intended)",
            path.display()
        );
        // The golden file decodes to the same plan.
        let decoded = Plan::decode(&golden).unwrap();
        assert_eq!(decoded, report.plan, "{stem}");
    }
    let readme = golden_dir().join("README.md");
    if bless {
        std::fs::write(readme, index).unwrap();
    } else {
        assert_eq!(std::fs::read_to_string(readme).unwrap(), index, "tests/golden/README.md is stale");
    }
}

/// A bitwise CRC-32 (IEEE), for the index only: the plan format's own checksum is inside it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}
