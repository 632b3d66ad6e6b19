//! `memo train --task recall`: the held-out evaluation (`memo_runtime::recall::evaluate`) as a
//! table on stderr or one JSON line on stdout.

use std::io::Write;

use memo_runtime::recall::{self, BucketScore, RecallEvaluation, RECALL_KEYS};
use memo_runtime::{Backend, Trainer};
use serde_json::{json, Value};

use crate::exit::{self, Failure};

/// Evaluates `trainer` after `step` steps on `per_bucket` sequences per distance bucket and
/// reports it: a JSON line on `out` when `json`, else a table on stderr.
pub fn evaluate_and_report<B: Backend>(
    trainer: &mut Trainer<B>,
    seed: u64,
    per_bucket: usize,
    json: bool,
    out: &mut impl Write,
) -> Result<RecallEvaluation, Failure> {
    let step = trainer.steps_taken();
    let evaluation = recall::evaluate(trainer, seed, per_bucket).map_err(|e| {
        Failure::new(crate::device::runtime_exit_code(&e), format!("the recall evaluation failed: {e}"))
    })?;
    if json {
        writeln!(out, "{}", to_json(step, &evaluation))
            .map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write: {e}")))?;
    } else {
        eprint!("{}", table(step, &evaluation));
    }
    Ok(evaluation)
}

fn bucket_json(bucket: &BucketScore) -> Value {
    let mut value = json!({
        "sequences": bucket.sequences, "key_accuracy": bucket.key_accuracy,
        "vocab_accuracy": bucket.vocab_accuracy, "answer_loss": bucket.answer_loss,
        "answer_probability": bucket.answer_probability,
    });
    if let Some((low, high)) = bucket.distances {
        value["min_distance"] = json!(low);
        value["max_distance"] = json!(high);
    }
    value
}

/// The evaluation as one JSON object: `{"eval", "step", "chance", "buckets": [...], "key_removed"}`.
pub fn to_json(step: u64, evaluation: &RecallEvaluation) -> Value {
    json!({
        "eval": true, "step": step, "chance": 1.0 / f64::from(RECALL_KEYS),
        "buckets": evaluation.buckets.iter().map(bucket_json).collect::<Vec<_>>(),
        "key_removed": bucket_json(&evaluation.key_removed),
    })
}

/// The evaluation as a small table, one line per bucket and the control.
pub fn table(step: u64, evaluation: &RecallEvaluation) -> String {
    let mut text = format!(
        "recall evaluation after {step} steps (held-out; chance {:.0}% over {RECALL_KEYS} keys, answer loss ln {RECALL_KEYS} = {:.3}):\n  \
         distance   sequences  key acc  vocab acc  answer loss\n",
        100.0 / f64::from(RECALL_KEYS),
        f64::from(RECALL_KEYS).ln()
    );
    let line = |label: String, b: &BucketScore| {
        format!(
            "  {label:<10} {:>9}  {:>6.1}%  {:>8.1}%  {:>11.3}\n",
            b.sequences,
            100.0 * b.key_accuracy,
            100.0 * b.vocab_accuracy,
            b.answer_loss
        )
    };
    for bucket in &evaluation.buckets {
        let (low, high) = bucket.distances.unwrap_or((0, 0));
        text.push_str(&line(format!("{low}-{high}"), bucket));
    }
    text.push_str(&line("no key".to_string(), &evaluation.key_removed));
    text
}
