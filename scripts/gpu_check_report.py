#!/usr/bin/env python3
"""Phase 5 of scripts/gpu-check.sh: read the raw outputs under OUT/raw, write OUT/gpu-check.jsonl
(one JSON object per measurement, each with a "kind") and print one table.

Definitions (spec/cost-model.md sections 9 and 10, scripts/README.md):
  step_time_s   the median of `memo train --json`'s step_time_s over the steps after the first
                (the first is the warm-up: kernel compilation, first touches)
  stall_s       the swap stall: the compute stream's measured waiting time in a step
                (compute_wait_s, from the backend's per-instruction timings, median over the timed
                steps): time the kernels sat idle waiting for a copy's event. null when the
                backend does not time its instructions
  vs_keep_all_s step time minus keep-all's at the same length: everything memo or
                full-recompute pays for its memory (recompute and any unhidden swap), measured
                without timings

Exit status: 0 when every correctness executable passed and at least one measurement ran;
1 otherwise (the table is printed either way).
"""

import glob
import json
import os
import re
import sys

STRATEGIES = ("keep-all", "full-recompute", "memo")
GIB = float(1 << 30)


def read(path, default=""):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return default


def json_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def rc_of(raw, name):
    """(exit code, seconds, limit) of a run, or (None, None, None) when it never ran."""
    fields = read(os.path.join(raw, name + ".rc")).split()
    if not fields:
        return None, None, None
    try:
        return int(fields[0]), float(fields[1]), fields[2] if len(fields) > 2 else None
    except ValueError:
        return None, None, None


def status_of(code):
    return {None: "not run", 0: "ok", 2: "bad input", 5: "does not fit", 7: "device unavailable",
            124: "timeout", 137: "killed (timeout)", 127: "missing"}.get(code, f"failed (exit {code})")


def last_error(raw, name):
    lines = [l for l in read(os.path.join(raw, name + ".err")).splitlines() if l.strip()]
    return lines[-1][:240] if lines else None


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def settings(raw):
    out = {}
    for line in read(os.path.join(raw, "settings.txt")).splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


def tests(raw, pattern="test-*.rc"):
    records = []
    for path in sorted(glob.glob(os.path.join(raw, pattern))):
        name = os.path.basename(path)[:-3]
        code, seconds, _ = rc_of(raw, name)
        text = read(os.path.join(raw, name + ".out")) + read(os.path.join(raw, name + ".err"))
        passed = sum(int(n) for n in re.findall(r"test result: \w+\. (\d+) passed", text))
        failed = sum(int(n) for n in re.findall(r"(\d+) failed", " ".join(re.findall(r"test result:.*", text))))
        skipped = len(re.findall(r"^SKIP:", text, re.M))
        failures = re.findall(r"^    (\S+)$", text.split("failures:")[-1], re.M) if failed else []
        records.append({"kind": "test", "name": name, "exit": code, "seconds": seconds, "status": status_of(code),
                        "passed": passed, "failed": failed, "skipped": skipped, "failures": failures[:20]})
    return records


def measurement(raw, name, strategy, seq):
    code, seconds, _ = rc_of(raw, name)
    lines = json_lines(read(os.path.join(raw, name + ".out")))
    steps = [l for l in lines if "step" in l and not l.get("summary")]
    summary = next((l for l in lines if l.get("summary")), {})
    timed = steps[1:] if len(steps) > 1 else steps

    def med(key):
        return median([s.get(key) for s in timed])

    record = {"kind": "measure", "strategy": strategy, "seq_len": seq, "exit": code, "status": status_of(code),
              "seconds": seconds, "steps": len(steps), "timed_steps": len(timed),
              "step_time_s": med("step_time_s"), "tokens_per_s": med("tokens_per_s"), "mfu_6n": med("mfu_6n"),
              "mfu_attention": med("mfu_attention"), "compute_busy_s": med("compute_busy_s"),
              "stall_s": med("compute_wait_s"),
              "device_bytes": (steps[0].get("device_bytes") if steps else summary.get("device_bytes")),
              "host_bytes": (steps[0].get("host_bytes") if steps else summary.get("host_bytes")),
              "alpha": summary.get("alpha"), "machine": summary.get("machine"),
              "peak_flops": summary.get("peak_flops"),
              "loss_first": steps[0].get("loss") if steps else None,
              "loss_last": steps[-1].get("loss") if steps else None,
              "setup_s": summary.get("setup_s"), "time_by_op": time_by_op(raw, name)}
    if code != 0:
        record["error"] = last_error(raw, name)
    return record


def time_by_op(raw, name):
    """The compute stream's time in the last step of run `name` (its --trace file), by op and
    category (forward, backward, recompute, step; waits as `wait`), largest first: where the
    step's time goes. Empty when there is no trace."""
    try:
        with open(os.path.join(raw, name + ".trace.json"), encoding="utf-8") as handle:
            events = json.load(handle).get("traceEvents", [])
    except (OSError, ValueError, AttributeError):
        return []
    totals = {}
    for e in events:
        if e.get("ph") != "X" or e.get("tid") != 0:
            continue
        key = "wait" if e.get("cat") == "wait" else f"{e.get('args', {}).get('op', e.get('name'))} ({e.get('cat')})"
        count, seconds = totals.get(key, (0, 0.0))
        totals[key] = (count + 1, seconds + float(e.get("dur", 0.0)) / 1e6)
    return sorted(([k, c, s] for k, (c, s) in totals.items()), key=lambda row: -row[2])


def measurements(raw):
    records = []
    for path in sorted(glob.glob(os.path.join(raw, "measure-*.rc"))):
        name = os.path.basename(path)[:-3]
        match = re.match(r"measure-(.+)-(\d+)$", name)
        if match:
            records.append(measurement(raw, name, match.group(1), int(match.group(2))))
    records.sort(key=lambda r: (r["seq_len"], STRATEGIES.index(r["strategy"]) if r["strategy"] in STRATEGIES else 9))
    with_keep_all(records)
    return records


def with_keep_all(records):
    """Sets each record's vs_keep_all_s: its step time minus keep-all's at the same length."""
    keep_all = {r["seq_len"]: r["step_time_s"] for r in records if r["strategy"] == "keep-all"}
    for record in records:
        base = keep_all.get(record["seq_len"])
        mine = record["step_time_s"]
        record["vs_keep_all_s"] = mine - base if (base is not None and mine is not None) else None


def attention_kernels(raw):
    """kernels/attention_gpu_check.py --time: each path's verdict and its timings."""
    code, seconds, _ = rc_of(raw, "attention-kernels")
    text = read(os.path.join(raw, "attention-kernels.out"))
    paths, current = {}, None
    for line in text.splitlines():
        match = re.match(r"(\w+) path:$", line.strip())
        if match:
            current = paths.setdefault(match.group(1), {"failed_shapes": 0, "timings": []})
        elif current is not None and "<-- FAIL" in line:
            current["failed_shapes"] += 1
        match = re.search(r"d=(\d+) s=(\d+) heads=(\d+) (forward|backward): ([\d.]+) ms, (\d+) TFLOP/s", line)
        if match and current is not None:
            current["timings"].append({"head_dim": int(match.group(1)), "seq_len": int(match.group(2)),
                                       "heads": int(match.group(3)), "pass": match.group(4),
                                       "ms": float(match.group(5)), "tflops": int(match.group(6))})
    return {"kind": "attention_kernels", "exit": code, "status": status_of(code), "seconds": seconds,
            "all_ok": "ALL OK" in text, "paths": paths,
            "error": None if code == 0 else last_error(raw, "attention-kernels")}


def variant_trial(raw, config, measured):
    """The attention variant under trial (phases 1 and 2): its test runs, its memo measurement
    and the baseline's at the same length; None when no variant was tried."""
    name = config.get("variant")
    if not name:
        return None
    seq = int(config.get("variant_seq", "0") or 0)
    test_records = tests(raw, f"variant-{name}-test-*.rc")
    run_name = f"variant-{name}-measure-memo-{seq}"
    mine = measurement(raw, run_name, "memo", seq) if rc_of(raw, run_name)[0] is not None else None
    base = next((r for r in measured if r["strategy"] == "memo" and r["seq_len"] == seq), None)
    ratio = (mine["step_time_s"] / base["step_time_s"]
             if mine and base and mine["step_time_s"] and base["step_time_s"] else None)
    return {"kind": "variant", "variant": name, "seq_len": seq, "tests": test_records,
            "tests_passed": bool(test_records) and all(t["exit"] == 0 for t in test_records),
            "measure": mine, "baseline_step_time_s": base["step_time_s"] if base else None,
            "step_over_baseline": ratio, "capped_runs_used": config.get("cap_attention")}


def planner_longest(raw, name):
    """{strategy: the planner's longest sequence} from `memo plan --max-seq --json` in NAME.out."""
    planned = {}
    for line in json_lines(read(os.path.join(raw, name + ".out"))):
        for entry in line.get("max_seq", []):
            planned[entry.get("strategy")] = entry.get("max_seq_len")
    return planned


def capacity(raw, config):
    """Phase 3: the `cap-STRATEGY-SEQ` runs under the device-memory cap, one `max_seq` record per
    strategy (the planner's longest on the whole GPU and under the cap; the longest trained under
    the cap and the first refusal above it) and one `capacity` record with the issue's three
    comparisons, each null when its runs are missing."""
    whole, capped = planner_longest(raw, "maxseq-plan"), planner_longest(raw, "cap-plan")
    runs = []
    for path in sorted(glob.glob(os.path.join(raw, "cap-*.rc"))):
        name = os.path.basename(path)[:-3]
        match = re.match(r"cap-(.+)-(\d+)$", name)
        if match:
            run = measurement(raw, name, match.group(1), int(match.group(2)))
            run["kind"] = "capacity_run"
            runs.append(run)
    runs.sort(key=lambda r: (r["seq_len"], STRATEGIES.index(r["strategy"]) if r["strategy"] in STRATEGIES else 9))
    with_keep_all(runs)

    def run_of(strategy, seq):
        return next((r for r in runs if r["strategy"] == strategy and r["seq_len"] == seq), None)

    def step(strategy, seq):
        r = run_of(strategy, seq)
        return r["step_time_s"] if r and r["exit"] == 0 else None

    longest = []
    for strategy in STRATEGIES:
        mine = [r for r in runs if r["strategy"] == strategy]
        trained = max((r["seq_len"] for r in mine if r["exit"] == 0), default=None)
        refused = [r for r in mine if r["exit"] != 0 and (trained is None or r["seq_len"] > trained)]
        longest.append({"kind": "max_seq", "strategy": strategy, "planner_max_seq": whole.get(strategy),
                        "planner_max_seq_capped": capped.get(strategy), "trained_max_seq_capped": trained,
                        "first_failure_capped": ({"seq_len": refused[0]["seq_len"], "status": refused[0]["status"],
                                                  "error": refused[0].get("error")} if refused else None)})

    keep_all = capped.get("keep-all")
    factor = int(config.get("long_factor", "4") or 4)
    long_seq = keep_all * factor if keep_all else None
    ka, memo_ka = step("keep-all", keep_all), step("memo", keep_all)
    memo_long, fr_long = step("memo", long_seq), step("full-recompute", long_seq)
    past = run_of("keep-all", keep_all + 1024) if keep_all else None
    memo_trained = max((r["seq_len"] for r in runs if r["strategy"] == "memo" and r["exit"] == 0), default=None)
    keep_all_trained = next((l["trained_max_seq_capped"] for l in longest if l["strategy"] == "keep-all"), None)
    record = {"kind": "capacity", "cap": config.get("cap"), "keep_all_longest": keep_all, "long_factor": factor,
              "long_seq": long_seq,
              "memo_vs_keep_all": (memo_ka / ka - 1.0) if (ka and memo_ka) else None,
              "keep_all_one_granule_past": past["status"] if past else None,
              "memo_trains_long": (run_of("memo", long_seq) or {}).get("status") if long_seq else None,
              "memo_long_step_s": memo_long, "full_recompute_long_step_s": fr_long,
              "memo_over_keep_all_trained": (memo_trained / keep_all_trained)
              if (memo_trained and keep_all_trained) else None}
    record["memo_within_10pct"] = record["memo_vs_keep_all"] <= 0.10 if record["memo_vs_keep_all"] is not None else None
    record["memo_faster_than_full_recompute"] = memo_long < fr_long if (memo_long and fr_long) else None
    return runs, longest, record


def peers(raw, seqs):
    """The peer's runs: `torch-peer` at the first of `seqs`, `torch-peer-N` at the others."""
    records = []
    for path in sorted(glob.glob(os.path.join(raw, "torch-peer*.rc"))):
        name = os.path.basename(path)[:-3]
        suffix = name[len("torch-peer-"):]
        seq = int(suffix) if suffix.isdigit() else (seqs[0] if seqs else 0)
        code, seconds, _ = rc_of(raw, name)
        found = False
        for line in json_lines(read(os.path.join(raw, f"{name}.out"))):
            line["kind"] = "peer"
            line["peer_seq"] = seq
            records.append(line)
            found = True
        if not found:
            records.append({"kind": "peer", "peer_seq": seq, "status": status_of(code), "exit": code,
                            "error": last_error(raw, name)})
    return records


def cudnn_attention(raw, config):
    """The cuDNN attention path: the library found, which attention each process ran, the check
    against float64 PyTorch, attention alone's TFLOP/s, and the replay allocator's run."""
    check_code = rc_of(raw, "cudnn-attention-check")[0]
    check = read(os.path.join(raw, "cudnn-attention-check.out"))
    throughput = [line.strip() for line in read(os.path.join(raw, "attention-throughput.out")).splitlines()
                  if "attention throughput" in line]
    ran = [line.strip() for line in read(os.path.join(raw, "attention-ran.txt")).splitlines() if line.strip()]
    replay_code = rc_of(raw, "replay-allocator")[0]
    # Printed by runtime-cuda's lib tests (run once, with --nocapture, in phase 2).
    plans = [line.strip() for line in read(os.path.join(raw, "test-runtime-cuda-lib-runtime_cuda.out")).splitlines()
             if line.startswith("cuDNN") or line.startswith("b=")]
    return {"kind": "cudnn_attention", "cudnn": config.get("cudnn"), "attention_ran": ran, "plans": plans,
            "check_exit": check_code, "check_status": status_of(check_code),
            "check_lines": [l for l in check.splitlines() if "|error|" in l or l.startswith("cudnn_attention_check")],
            "throughput": throughput, "replay_allocator_exit": replay_code,
            "replay_allocator": read(os.path.join(raw, "replay-allocator.out")).strip().splitlines()[-12:]}


def phases(raw):
    out = []
    for path in sorted(glob.glob(os.path.join(raw, "phase-*.status"))):
        lines = read(path).split("\n")
        start = next((int(l.split()[1]) for l in lines if l.startswith("started")), None)
        end_line = next((l for l in lines if l.startswith("ended")), None)
        end = int(end_line.split()[1]) if end_line else None
        out.append({"kind": "phase", "phase": int(re.findall(r"\d+", os.path.basename(path))[0]),
                    "seconds": end - start if (start is not None and end is not None) else None,
                    "finished": end_line is not None})
    return out


def fmt(value, spec, scale=1.0, none="-"):
    if value is None:
        return none
    value = value / scale
    return format(int(round(value)) if spec.endswith("d") else value, spec)


def row(r):
    """One line of a measurement table (the header is `main`'s)."""
    return (f"  {r['strategy']:<15}{r['seq_len']:>9}{fmt(r['step_time_s'], '.3f'):>10}{fmt(r['tokens_per_s'], '.0f'):>11}"
            f"{fmt(r['mfu_6n'], '.1%'):>8}{fmt(r['mfu_attention'], '.1%'):>8}{fmt(r['device_bytes'], '.2f', GIB):>9}"
            f"{fmt(r['host_bytes'], '.2f', GIB):>9}{fmt(r['stall_s'], '.3f'):>9}{fmt(r.get('vs_keep_all_s'), '+.3f'):>12}"
            f"  {r['status']}" + (f": {r['error']}" if r.get("error") else ""))


def verdict_word(holds):
    return {True: "holds", False: "DOES NOT HOLD", None: "not measured"}[holds]


def main(out_dir):
    raw = os.path.join(out_dir, "raw")
    config = settings(raw)
    smi = read(os.path.join(raw, "nvidia-smi.out")).strip()
    profile = (json_lines(read(os.path.join(raw, "profile.out"))) or [{}])[0]
    profile_code = rc_of(raw, "profile")[0]
    test_records = tests(raw)
    measured = measurements(raw)
    capped_runs, longest, verdict = capacity(raw, config)
    variant = variant_trial(raw, config, measured)
    kernels = attention_kernels(raw)
    peer_seqs = [int(x) for x in (config.get("peer_seqs") or config.get("peer_seq") or "").split() if x.isdigit()]
    peer = peers(raw, peer_seqs)
    cudnn = cudnn_attention(raw, config)
    phase_records = phases(raw)

    records = [{"kind": "settings", **config, "nvidia_smi": smi},
               {"kind": "profile", "exit": profile_code, "status": status_of(profile_code),
                "error": None if profile_code == 0 else last_error(raw, "profile"), **profile}]
    records += test_records + [kernels, cudnn] + measured + ([variant] if variant else []) + capped_runs + longest
    records += [verdict]
    records += peer + phase_records
    with open(os.path.join(out_dir, "gpu-check.jsonl"), "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")

    p = print
    p(f"== GPU check: device {config.get('device', '?')}, model {config.get('model', '?')}, "
      f"bundle {config.get('bundle_commit') or '?'}{' (DRY RUN on the CPU backend)' if config.get('dry_run') == '1' else ''}")
    if smi:
        p("   " + smi.replace("\n", "\n   "))
    else:
        p(f"   nvidia-smi: {status_of(rc_of(raw, 'nvidia-smi')[0])}")
    if profile_code == 0 and profile:
        p(f"profile: d2h {fmt(profile.get('d2h_bytes_per_s'), '.2f', 1e9)} GB/s, "
          f"h2d {fmt(profile.get('h2d_bytes_per_s'), '.2f', 1e9)} GB/s, one layer's forward "
          f"{fmt(profile.get('layer_forward_s'), '.3f', 1e-3)} ms at {profile.get('seq_len')} tokens")
    else:
        p(f"profile: {status_of(profile_code)} {last_error(raw, 'profile') or ''}")
    p("\ncorrectness (bundled test executables):")
    for t in test_records:
        p(f"  {t['name']:<44} {t['status']:<18} {t['passed']} passed, {t['failed']} failed, {t['skipped']} SKIP"
          + (f"  failing: {', '.join(t['failures'])}" if t["failures"] else ""))
    if not test_records:
        p("  none ran")

    p(f"\ncuDNN: {cudnn['cudnn'] or 'not looked for'}; attention ran as:")
    for line in cudnn["attention_ran"] or ["(no GPU process said)"]:
        p(f"  {line}")
    for line in cudnn["plans"]:
        p(f"  plan {line}")
    p(f"cuDNN path vs float64 PyTorch (scripts/cudnn_attention_check.py): {cudnn['check_status']}")
    for line in cudnn["check_lines"][-4:]:
        p(f"  {line}")
    for line in cudnn["throughput"]:
        p(f"  {line}")
    p(f"replay allocator (examples/python/replay_allocator.py): exit {cudnn['replay_allocator_exit']}")
    for line in cudnn["replay_allocator"]:
        p(f"  {line}")
    p(f"\nattention kernels alone (kernels/attention_gpu_check.py --time): {kernels['status']}"
      + (", every path within bounds" if kernels["all_ok"] else "")
      + (f": {kernels['error']}" if kernels.get("error") else ""))
    for name, path in kernels["paths"].items():
        timed = ", ".join(f"d={t['head_dim']} {t['pass']} {t['ms']:.2f} ms {t['tflops']} TFLOP/s" for t in path["timings"])
        p(f"  {name:<10} {path['failed_shapes']} shapes failed" + (f"; at 16K tokens, 16 heads: {timed}" if timed else ""))

    p("\nmeasurements (memo train --json; step = median after the warm-up step; stall = compute-stream waits):")
    header = (f"  {'strategy':<15}{'seq':>9}{'step s':>10}{'tok/s':>11}{'MFU-6N':>8}{'MFU-att':>8}"
              f"{'dev GiB':>9}{'host GiB':>9}{'stall s':>9}{'vs keep-all':>12}  status")
    p(header)
    for r in measured:
        p(row(r))

    for r in measured:
        setup = r.get("setup_s") or {}
        if setup:
            p(f"  setup of {r['strategy']} at {r['seq_len']}: "
              + ", ".join(f"{k} {fmt(setup.get(k), '.2f')} s" for k in ("open_backend", "plan", "allocate", "initialise")))
    for r in measured:
        if r.get("time_by_op"):
            total = sum(row[2] for row in r["time_by_op"])
            p(f"  compute stream of {r['strategy']} at {r['seq_len']} (last step, {total:.3f} s timed): "
              + ", ".join(f"{op} x{count} {seconds:.3f}" for op, count, seconds in r["time_by_op"][:10]))

    if variant:
        p(f"\nattention variant {variant['variant']} (MEMO_CUDA_ATTENTION), against the baseline kernels:")
        for t in variant["tests"]:
            p(f"  {t['name']:<44} {t['status']:<18} {t['passed']} passed, {t['failed']} failed, {t['skipped']} SKIP"
              + (f"  failing: {', '.join(t['failures'])}" if t["failures"] else ""))
        if not variant["tests"]:
            p("  no test executables ran")
        if variant["measure"]:
            p(header)
            p(row(variant["measure"]))
        p(f"  memo at {variant['seq_len']}: step {fmt(variant['measure'] and variant['measure']['step_time_s'], '.3f')} s "
          f"with {variant['variant']}, {fmt(variant['baseline_step_time_s'], '.3f')} s with the baseline "
          f"({fmt(variant['step_over_baseline'], '.2f')}x); the capped runs used {variant['capped_runs_used'] or '?'}")
        for r in [variant["measure"]] if variant["measure"] and variant["measure"].get("time_by_op") else []:
            total = sum(x[2] for x in r["time_by_op"])
            p(f"  compute stream with {variant['variant']} (last step, {total:.3f} s timed): "
              + ", ".join(f"{op} x{count} {seconds:.3f}" for op, count, seconds in r["time_by_op"][:6]))

    cap = config.get("cap", "?")
    p(f"\ncapacity: the planner's longest sequence on the whole GPU, and the same GPU with the plan's device "
      f"memory capped at {cap}:")
    p(f"  {'strategy':<15}{'whole GPU':>11}{'capped':>10}{'trained':>10}  first refusal above it (capped)")
    for r in longest:
        failure = r["first_failure_capped"]
        why = f"{failure['seq_len']}: {failure['status']}" if failure else "-"
        p(f"  {r['strategy']:<15}{fmt(r['planner_max_seq'], 'd'):>11}{fmt(r['planner_max_seq_capped'], 'd'):>10}"
          f"{fmt(r['trained_max_seq_capped'], 'd'):>10}  {why}")
    p(header)
    for r in capped_runs:
        p(row(r))
    v = verdict
    ka = v["keep_all_longest"]
    p(f"  memo at keep-all's longest ({fmt(ka, 'd')}): step {fmt(v['memo_vs_keep_all'], '+.1%')} against "
      f"keep-all's (the issue asks within 10%): {verdict_word(v['memo_within_10pct'])}")
    p(f"  keep-all one granule longer ({fmt(ka + 1024 if ka else None, 'd')}): {v['keep_all_one_granule_past'] or 'not run'}")
    p(f"  memo at {v['long_factor']}x keep-all's longest ({fmt(v['long_seq'], 'd')}): {v['memo_trains_long'] or 'not run'}; "
      f"step {fmt(v['memo_long_step_s'], '.3f')} s against full-recompute's {fmt(v['full_recompute_long_step_s'], '.3f')} s: "
      f"memo faster {verdict_word(v['memo_faster_than_full_recompute'])}")
    p(f"  longest memo trained over longest keep-all trained: {fmt(v['memo_over_keep_all_trained'], '.1f')}x")

    for peer_seq in peer_seqs or [0]:
        p(f"\npeer at {peer_seq} tokens (tokens/s, peak device memory):")
        for r in peer:
            if r.get("peer_seq") != peer_seq:
                continue
            if r.get("mode"):
                p(f"  torch {r['mode']:<14}{fmt(r.get('tokens_per_s'), '.0f'):>11} tok/s"
                  f"{fmt(r.get('peak_bytes'), '.2f', GIB):>9} GiB  {r.get('status')}"
                  + (f": {r['error']}" if r.get("error") else ""))
            else:
                p(f"  torch: {r.get('status')}" + (f": {r['error']}" if r.get("error") else ""))
        for r in measured:
            if r["seq_len"] == peer_seq:
                p(f"  memo  {r['strategy']:<14}{fmt(r['tokens_per_s'], '.0f'):>11} tok/s"
                  f"{fmt(r['device_bytes'], '.2f', GIB):>9} GiB  {r['status']}")

    p("\nphases: " + ", ".join(f"{r['phase']}: {fmt(r['seconds'], 'd')} s{'' if r['finished'] else ' (unfinished)'}"
                             for r in phase_records))
    ok = bool(test_records) and all(t["exit"] == 0 for t in test_records) and any(r["exit"] == 0 for r in measured)
    return 0 if ok else 1


def shorter(raw, name, than):
    """Whether run `name`'s step time (as the table computes it) is below run `than`'s."""
    mine, base = (measurement(raw, n, "", 0)["step_time_s"] for n in (name, than))
    return mine is not None and base is not None and mine < base


if __name__ == "__main__":
    # Two questions gpu-check.sh asks during its run, answered as the report computes them:
    if len(sys.argv) == 5 and sys.argv[1] == "--shorter":
        # exit 0 when run RUN's step time is below run THAN_RUN's (the capped runs' attention)
        sys.exit(0 if shorter(sys.argv[2], sys.argv[3], sys.argv[4]) else 1)
    if len(sys.argv) == 5 and sys.argv[1] == "--longest":
        # the planner's longest sequence of STRATEGY in run PLAN's --max-seq output (none: nothing)
        longest = planner_longest(sys.argv[2], sys.argv[3]).get(sys.argv[4])
        print(longest if longest else "")
        sys.exit(0)
    if len(sys.argv) != 2:
        print("usage: gpu_check_report.py OUT_DIR | --shorter RAW_DIR RUN THAN_RUN | --longest RAW_DIR PLAN STRATEGY",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
