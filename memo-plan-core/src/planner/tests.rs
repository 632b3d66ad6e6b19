//! The planner's reports agree with themselves: the remedies' longest sequence is `--max-seq`'s,
//! no causal MFU passes 100% of the peak, and the swap summary says what the plan does.

use alloc::format;
use alloc::string::String;

use super::*;
use crate::model::HARDWARE_PRESETS;

/// 7B's layer on `machine` with `layers` layers at `t = 8`: real shapes, quick plans.
fn request(layers: u32, seq_len: u64, machine: &str, strategy: Strategy) -> PlanRequest {
    let mut model = ModelConfig::preset("7b", seq_len, 1).unwrap();
    model.layers = layers;
    PlanRequest::new(model, Parallelism::new(8, 1), Hardware::preset(machine).unwrap(), strategy)
}

/// The number in "fits at most N tokens", or `None` when no remedy quotes one.
fn quoted_longest(remedies: &[String]) -> Option<u64> {
    let line = remedies.iter().find(|r| r.starts_with("fewer tokens"))?;
    let after = line.split("at most ").nth(1)?;
    after.split(' ').next()?.parse().ok()
}

/// On a GPU too small for any length, the advice once said "plan a shorter sequence" next to
/// "fewer tokens will not do". Now only what may help is offered, with sizes in units.
#[test]
fn remedies_offer_no_shorter_sequence_when_none_fits() {
    let mut r = request(3, 64 << 10, "a800x8", Strategy::Memo);
    r.hardware.device_memory_bytes = 1 << 20;
    let report = plan(&r).unwrap();
    assert!(!report.fits());
    let advice = remedies(&r, &report);
    assert!(advice.iter().any(|x| x.starts_with("fewer tokens will not do")), "{advice:?}");
    assert!(!advice.iter().any(|x| x.contains("shorter sequence")), "{advice:?}");
    let device = advice.iter().find(|x| x.starts_with("device memory")).unwrap();
    // a800x8 has 8 GPUs per node: t = 8 is the most, so no higher t is offered either.
    assert!(device.contains("more than the GPU's 1.00 MiB; try another strategy"), "{device}");
    r.parallel = Parallelism::new(4, 1);
    let report = plan(&r).unwrap();
    let advice = remedies(&r, &report);
    let device = advice.iter().find(|x| x.starts_with("device memory")).unwrap();
    assert!(device.ends_with("try a higher tensor-parallel degree than t = 4 or another strategy"), "{device}");
    assert!(device.contains(" bytes) more"), "the exact shortfall: {device}");
}

/// The remedy of full-swap at 1M tokens once said "at most 4439240 tokens keep the always-swapped
/// tensors in host memory" (a host-only bound on part of the swapped bytes) while `--max-seq` said
/// 558080. Every misfit's quoted longest sequence is now `--max-seq`'s answer on every preset: a
/// multiple of its 1K grid that fits, whose next multiple does not (checked here by planning both,
/// not by rerunning the search; memo-cli's tests compare with `--max-seq` itself).
#[test]
fn remedy_and_max_seq_agree_for_every_strategy_on_every_machine() {
    let mut misfits = 0;
    for machine in HARDWARE_PRESETS.iter().map(|p| p.name) {
        for strategy in Strategy::ALL {
            let r = request(3, 64 << 20, machine, strategy);
            let report = plan(&r).unwrap();
            let remedies = remedies(&r, &report);
            if report.fits() {
                assert!(remedies.is_empty(), "{machine} {strategy:?}: {remedies:?}");
                continue;
            }
            misfits += 1;
            let fits_at = |tokens: u64| {
                plan(&PlanRequest { model: ModelConfig { seq_len: tokens, ..r.model.clone() }, ..r.clone() })
                    .is_ok_and(|p| p.fits())
            };
            match quoted_longest(&remedies) {
                Some(tokens) => {
                    let memory =
                        remedies.iter().filter(|r| r.starts_with("device memory") || r.starts_with("host memory"));
                    assert!(
                        memory.clone().count() > 0 && memory.clone().all(|r| r.contains("a shorter sequence")),
                        "{remedies:?}"
                    );
                    assert_eq!(tokens % 1024, 0, "{machine} {strategy:?}: {remedies:?}");
                    assert!(fits_at(tokens) && !fits_at(tokens + 1024), "{machine} {strategy:?}: {remedies:?}");
                }
                None => {
                    assert!(remedies.iter().any(|r| r.contains("does not fit even 1024 tokens")), "{remedies:?}");
                    // Advice never contradicts itself: no "plan a shorter sequence" beside that.
                    assert!(!remedies.iter().any(|r| r.contains("shorter sequence")), "{remedies:?}");
                    assert!(!fits_at(1024), "{machine} {strategy:?}");
                }
            }
        }
    }
    // 64M tokens misses every machine under most strategies: the test compared something.
    assert!(misfits >= 8, "{misfits}");
}

/// No plan of any preset machine and strategy reports a causal MFU above 100% of the peak, at short
/// and long sequences (the full convention credits skipped work and may; see spec/cost-model.md).
#[test]
fn no_causal_mfu_passes_the_peak() {
    for machine in HARDWARE_PRESETS.iter().map(|p| p.name) {
        for seq_len in [4 << 10, 256 << 10, 4 << 20] {
            for strategy in Strategy::ALL {
                let report = plan(&request(4, seq_len, machine, strategy)).unwrap();
                let mfu = report.mfu.causal_halved;
                assert!(mfu > 0.0 && mfu <= 1.0, "{machine} {seq_len} {strategy:?}: MFU-c {mfu}");
            }
        }
    }
}

/// A profile of a small layer applied to a large one once gave an MFU of 218739666%: a measured
/// layer time that would run this layer above the peak is refused, naming the fix.
#[test]
fn a_layer_time_faster_than_the_peak_is_refused() {
    let mut r = request(4, 1 << 20, "h200x1", Strategy::Memo);
    r.hardware.measured_layer_forward_s = Some(0.211);
    let error = plan(&r).unwrap_err();
    let text = format!("{error}");
    assert!(text.contains("above peak_flops") && text.contains("another layer shape"), "{text}");
    // A time the peak allows is taken as given.
    r.hardware.measured_layer_forward_s = Some(1.0e4);
    let report = plan(&r).unwrap();
    assert!(report.mfu.causal_halved <= 1.0);
    assert_eq!(report.swap.unwrap().layer_forward_s, 1.0e4);
}

/// `memo show` of a keep-all plan once said "alpha 0.0000 (not bound: everything swapped), 0 rows
/// swapped", and a two-layer memo plan "alpha 1.000" with nothing on host.
#[test]
fn the_swap_summary_says_which_layers_swap() {
    let summary =
        |layers, strategy| plan(&request(layers, 32 << 10, "a800x8", strategy)).unwrap().plan.provenance.swap_summary();
    assert!(summary(4, Strategy::KeepAll).starts_with("nothing swapped or recomputed"));
    assert!(summary(4, Strategy::FullRecompute).starts_with("nothing swapped: every layer keeps its input"));
    let two = summary(2, Strategy::Memo);
    assert!(two.starts_with("nothing swapped: with 2 layer(s)") && two.contains("alpha does not apply"), "{two}");
    let memo = summary(6, Strategy::Memo);
    assert!(memo.contains("layers 0-3 (4 of 6)") && memo.contains("layers 4 and 5 keep theirs"), "{memo}");
    let full = summary(6, Strategy::FullSwap);
    assert!(full.contains("all 4096 rows of each token-split tensor (nothing recomputed)"), "{full}");
}
