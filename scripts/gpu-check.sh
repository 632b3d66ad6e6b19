#!/usr/bin/env bash
# The one prepared GPU check (scripts/README.md). Runs on the GPU machine from gpu-bundle/ (built
# here by scripts/gpu-bundle.sh; no cargo there, no network needed), under 6 minutes:
#   0  nvidia-smi summary; memo profile --device cuda (copy bandwidth, one layer's forward)
#   1  correctness: every bundled test executable (the backend suite with MEMO_REQUIRE_GPU=cuda,
#      runtime-cuda's GPU-vs-CPU tests, its NCCL tests with the wheel's libnccl.so.2 named in
#      MEMO_NCCL_LIBRARY and NCCL_MULTI_RANK_GPU_ENABLE=1): pass/fail and their counts
#   2  measurements: memo train --device cuda --json --timings on the ~1B GPT
#      (examples/models/gpt-1b.toml) at each of $SEQS for keep-all, full-recompute and memo
#   3  capacity: the planner's --max-seq on the whole GPU; then, with the plan's device memory
#      capped at $CAP (a smaller GPU, so that the runs fit the lease): keep-all at its longest
#      sequence there (KA) and one granule past it, memo at KA, memo and full-recompute at
#      $LONG_FACTOR x KA, then memo and full-recompute at their own longest (one step each)
#   4  the PyTorch peer (scripts/torch_peer.py): store, checkpoint, checkpoint + save_on_cpu
#   5  one table on stdout; the raw numbers as JSON lines in $OUT/gpu-check.jsonl
# Each phase has a hard deadline and each command its own `timeout`; a phase that fails is
# recorded and the next one runs. Everything is written under ${OUT:-./gpu-check-out}.
#
#   scripts/gpu-check.sh             on the GPU machine
#   scripts/gpu-check.sh --dry-run   here: the same phases on the CPU backend, a tiny model, tiny
#                                    lengths (exercises the control flow, the parsing, the table)
# Environment overrides: OUT, BUNDLE, MODEL, SEQS, STEPS, CAP, LONG_FACTOR, CAP_LONG_STEPS,
# CAP_TIMEOUT, CAP_LONGEST (0: skip memo's and full-recompute's own longest under the cap),
# VARIANT, VARIANT_SEQ, CAP_ATTENTION, RUN_TIMEOUT, PEER_SEQ, PROFILE_SEQ, PROFILE_REPEATS, LR, WARMUP, PHASE{0..4}_S (each phase's deadline in seconds),
# PACK=1 (pack raw/ into raw.tgz and remove it: the device tool brings back at most 8 files).
set -u

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
dry=0
[[ "${1:-}" == "--dry-run" ]] && dry=1
started=$(date +%s)

OUT="${OUT:-./gpu-check-out}"
BUNDLE="${BUNDLE:-gpu-bundle}"
if ((dry)); then
    DEVICE=cpu
    MODEL="${MODEL:-$OUT/raw/dry-model.toml}" # 4 layers, h 128 (written below): memo swaps two
    SEQS="${SEQS:-32 64}"
    STEPS="${STEPS:-3}"
    CAP="${CAP:-48MiB}"                 # keep-all fits 1K tokens of the dry model, memo 3K
    LONG_FACTOR="${LONG_FACTOR:-2}"
    CAP_LONG_STEPS="${CAP_LONG_STEPS:-2}"
    CAP_TIMEOUT="${CAP_TIMEOUT:-60}"
    RUN_TIMEOUT="${RUN_TIMEOUT:-60}"
    PEER_SEQ="${PEER_SEQ:-64}"
    PEER_MODEL=(--layers 4 --hidden 128 --heads 4 --vocab 256)
    LR="${LR:-3e-3}"                    # memo train's default
    WARMUP="${WARMUP:-0}"
    TRAIN_MACHINE=""                    # memo train's CPU description
    PLAN_MACHINE="$OUT/raw/cpu-machine.toml" # the same numbers, for memo plan
    PROFILE_ARGS=(--model "$MODEL" --seq "${PROFILE_SEQ:-256}" --repeats "${PROFILE_REPEATS:-3}" --copy-size 4MiB)
    export -n MEMO_REQUIRE_GPU 2>/dev/null
else
    DEVICE=cuda
    MODEL="${MODEL:-examples/models/gpt-1b.toml}"
    SEQS="${SEQS:-16384}"               # 8192 and 32768 measured 2026-12-04 (BENCHMARKS.md)
    STEPS="${STEPS:-3}"                 # the first is the warm-up: its time is not used
    # 24 GiB leaves the 1B model ~9 GiB beside its 15 GiB of weights and optimizer state: the
    # planner's longest there are keep-all 6K, memo 56K, full-recompute 57K tokens, so the 4x runs
    # (24K) take seconds a step, and memo's longest one step about 35 s (an estimate from the attention
    # kernels of 2026-12-04: 10.2 s a step at 32K, growing as s^2). At 40 GiB they would be 19K and 76K.
    CAP="${CAP:-24GiB}"
    LONG_FACTOR="${LONG_FACTOR:-4}"
    CAP_LONG_STEPS="${CAP_LONG_STEPS:-2}"
    CAP_TIMEOUT="${CAP_TIMEOUT:-60}"
    RUN_TIMEOUT="${RUN_TIMEOUT:-60}"
    PEER_SEQ="${PEER_SEQ:-16384}"
    PEER_MODEL=(--model "$MODEL")
    LR="${LR:-3e-4}"                    # the PyTorch peer's: 3e-3 (memo's default) diverges on 1B
    WARMUP="${WARMUP:-100}"             # and so does 3e-4 without a warm-up (loss 5.5 -> 13.5 in 3 steps)
    # h200x1 with this machine's memory (written below): the preset's 256 GiB of host memory is
    # more than the lent machine has, and a pinned slab past it must not be tried.
    TRAIN_MACHINE="$OUT/raw/h200-here.toml"
    PLAN_MACHINE="$TRAIN_MACHINE"
    PROFILE_ARGS=(--model "$MODEL" --seq "${PROFILE_SEQ:-8192}" --repeats "${PROFILE_REPEATS:-3}")
    export MEMO_REQUIRE_GPU=cuda        # a backend suite that cannot open the GPU fails
fi
PHASE0_S="${PHASE0_S:-35}"
PHASE1_S="${PHASE1_S:-70}"
PHASE2_S="${PHASE2_S:-70}"
PHASE3_S="${PHASE3_S:-130}"
GRANULE=1024                            # the planner's --max-seq steps
# The attention kernels' variant under trial (runtime-cuda's MEMO_CUDA_ATTENTION; the default is
# "baseline"): phase 1 runs the GPU-vs-CPU tests with it, phase 2 measures memo with it at
# $VARIANT_SEQ, and phase 3 uses it (CAP_ATTENTION=auto) when both went well and its step was
# the shorter. Empty: no trial.
VARIANT="${VARIANT-pipelined}"
VARIANT_SEQ="${VARIANT_SEQ:-16384}"
((dry)) && VARIANT_SEQ="${VARIANT_SEQ_DRY:-64}"
CAP_ATTENTION="${CAP_ATTENTION:-auto}"
CAP_MACHINE="$OUT/raw/capped.toml"
PHASE4_S="${PHASE4_S:-65}"
MEMO="$BUNDLE/memo"
raw="$OUT/raw"
rm -rf "$raw"
mkdir -p "$raw" || { echo "gpu-check: cannot create $raw" >&2; exit 1; }
if ((dry)) && [[ "$MODEL" == "$raw/dry-model.toml" ]]; then
    printf '[model]\nlayers = 4\nhidden = 128\nheads = 4\nvocab = 256\n' >"$MODEL"
fi
if ((!dry)); then
    # Host: three quarters of MemTotal. Device: memory.total less 3 GiB (context, library
    # workspaces); the preset's 140 GiB if nvidia-smi does not answer.
    host_kib=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo 2>/dev/null)
    device_mib=$(timeout 10 nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc 0-9)
    machine_file() { # device_memory (TOML value; empty: the preset's)
        printf '# h200x1 with the memory of %s (scripts/gpu-check.sh)\n[machine]\npreset = "h200x1"\n' "$(hostname)"
        [[ -n "$host_kib" ]] && printf 'host_memory_per_node = %d\n' $((host_kib * 1024 / 4 * 3))
        [[ -n "$1" ]] && printf 'device_memory = %s\n' "$1"
    }
    machine_file "${device_mib:+$(((device_mib - 3072) * 1048576))}" >"$raw/h200-here.toml"
    # The CUDA libraries: cudarc (built for CUDA 12.8) opens `libnvrtc.so`, `libcublas.so` or
    # their `.so.12` names from the loader's path. The machine's toolkit may be CUDA 13 (`.so.13`
    # only), or the libraries may sit in PyTorch's site-packages, off the path. For each library
    # the loader cannot find by those names, link the newest copy found as the unversioned name
    # in $raw/cuda-libs, and put that folder and the copy's own folder (NVRTC opens its
    # builtins library from there) on LD_LIBRARY_PATH. The choices land in cuda-libs.txt.
    libs="$raw/cuda-libs"
    mkdir -p "$libs"
    site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
    for name in nvrtc cublas cublasLt; do
        if ldconfig -p 2>/dev/null | grep -Eq "lib$name\.so(\.12)? "; then
            echo "lib$name: found by the loader" >>"$raw/cuda-libs.txt"
            continue
        fi
        found=$(ls -1 /usr/local/cuda*/lib64/lib"$name".so.* /usr/local/cuda*/targets/*/lib/lib"$name".so.* \
            $(for s in $site; do echo "$s"/nvidia/*/lib/lib"$name".so.*; done) 2>/dev/null |
            grep -E "lib$name\.so\.[0-9]+$" | sort -V | tail -1)
        if [[ -n "$found" ]]; then
            ln -sf "$found" "$libs/lib$name.so"
            LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
            echo "lib$name: linked $found" >>"$raw/cuda-libs.txt"
        else
            echo "lib$name: not found (the backend will say so)" >>"$raw/cuda-libs.txt"
        fi
    done
    export LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"
    # NCCL for runtime-cuda's tests/nccl.rs: NVIDIA's wheel puts libnccl.so.2 in site-packages,
    # off the loader's path; name it in MEMO_NCCL_LIBRARY (unless set or on the path), and let
    # two ranks share the one GPU where NCCL 2.30+ allows it (the test SKIPs on older NCCL).
    if [[ -z "${MEMO_NCCL_LIBRARY:-}" ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
        for s in $site; do
            if [[ -f "$s/nvidia/nccl/lib/libnccl.so.2" ]]; then
                export MEMO_NCCL_LIBRARY="$s/nvidia/nccl/lib/libnccl.so.2"
                break
            fi
        done
    fi
    echo "libnccl: ${MEMO_NCCL_LIBRARY:-by name, through the dynamic linker}" >>"$raw/cuda-libs.txt"
    export NCCL_MULTI_RANK_GPU_ENABLE="${NCCL_MULTI_RANK_GPU_ENABLE:-1}"
fi
if ((dry)); then # memo_runtime::cpu_hardware(64 GiB), as a machine file
    machine_file() { # device_memory (TOML value)
        printf '[machine]\ndevice_memory = %s\nhost_memory_per_node = "64GiB"\nd2h = "10GB/s"\nh2d = "10GB/s"\npeak_flops = "20G"\nachieved_flops = "20G"\n' "$1"
    }
    machine_file '"64GiB"' >"$raw/cpu-machine.toml"
fi
machine_file "\"$CAP\"" >"$CAP_MACHINE"
{
    echo "dry_run=$dry"; echo "device=$DEVICE"; echo "model=$MODEL"; echo "seqs=$SEQS"; echo "steps=$STEPS"
    echo "cap=$CAP"; echo "long_factor=$LONG_FACTOR"; echo "cap_long_steps=$CAP_LONG_STEPS"; echo "cap_timeout=$CAP_TIMEOUT"
    echo "variant=$VARIANT"; echo "variant_seq=$VARIANT_SEQ"
    echo "peer_seq=$PEER_SEQ"; echo "lr=$LR"; echo "warmup=$WARMUP"; echo "started=$started"; echo "host=$(hostname)"
    echo "bundle_commit=$(sed -n 's/^# commit //p' "$BUNDLE/MANIFEST" 2>/dev/null)"
} >"$raw/settings.txt"

say() { printf '[gpu-check %4ds] %s\n' "$(($(date +%s) - started))" "$*" >&2; }
phase_deadline=0
begin_phase() { # number, seconds
    phase_deadline=$(($(date +%s) + $2))
    say "phase $1 (at most $2 s)"
    echo "started $(date +%s)" >"$raw/phase-$1.status"
}
end_phase() { echo "ended $(date +%s) $2" >>"$raw/phase-$1.status"; }
# run NAME SECONDS COMMAND...: stdout to $raw/NAME.out, stderr to .err, exit code and seconds to
# .rc, bounded by SECONDS and by the phase's deadline (exit 124 when cut).
run() {
    local name="$1" limit="$2"
    shift 2
    local left=$((phase_deadline - $(date +%s)))
    ((left < limit)) && limit=$left
    if ((limit < 1)); then
        echo "124 0 phase-deadline" >"$raw/$name.rc"
        return 124
    fi
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >"$raw/$name.out" 2>"$raw/$name.err"
    rc=$?
    t1=$(date +%s.%N)
    echo "$rc $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }') $limit" >"$raw/$name.rc"
    return $rc
}

# train NAME SECONDS MACHINE_FILE ('' = the device's default machine) STRATEGY SEQ STEPS [ARGS...]:
# memo train with the flags every run shares, through `run`.
train() {
    local name="$1" limit="$2" machine="$3" strategy="$4" seq="$5" steps="$6"
    shift 6
    run "$name" "$limit" "$MEMO" train --device "$DEVICE" ${machine:+--machine-file "$machine"} --model "$MODEL" \
        --seq "$seq" --strategy "$strategy" --steps "$steps" --lr "$LR" --warmup-steps "$WARMUP" --json --timings "$@"
    local rc=$?
    say "$name: exit $rc"
    return $rc
}

if [[ ! -x "$MEMO" ]]; then
    say "no $MEMO: build the bundle first (scripts/gpu-bundle.sh) and carry gpu-bundle/"
    echo "127 0 no-bundle" >"$raw/memo-missing.rc"
fi

# Phase 0: the machine.
begin_phase 0 "$PHASE0_S"
if ((dry)); then
    run nvidia-smi 10 echo "dry run: no nvidia-smi (CPU backend)"
else
    run nvidia-smi 15 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm,power.limit \
        --format=csv
    run nvidia-smi-full 10 nvidia-smi
fi
run profile "${PROFILE_TIMEOUT:-40}" "$MEMO" profile --device "$DEVICE" "${PROFILE_ARGS[@]}" --out "$raw/machine.toml" --json
end_phase 0 done

# Phase 1: correctness.
begin_phase 1 "$PHASE1_S"
tests=0
for exe in "$BUNDLE"/test-*; do
    [[ -x "$exe" ]] || continue
    tests=$((tests + 1))
    name="$(basename "$exe")"
    run "$name" 60 "$exe" --test-threads=2
    say "$name: exit $(cut -d' ' -f1 "$raw/$name.rc")"
done
((tests == 0)) && say "no test executables in $BUNDLE"
# The attention kernels on their own, every path (baseline tensor, pipelined, scalar) against a
# float64 PyTorch reference, and their forward and backward TFLOP/s at 16K tokens.
if ((dry)); then
    run attention-kernels 10 echo "dry run: no GPU for kernels/attention_gpu_check.py"
else
    run attention-kernels 60 python3 kernels/attention_gpu_check.py --time
fi
say "attention kernels: exit $(cut -d' ' -f1 "$raw/attention-kernels.rc")"
# The variant under trial: the GPU-vs-CPU tests again with its kernels.
variant_ok=0
if [[ -n "$VARIANT" ]]; then
    variant_ok=1
    for exe in "$BUNDLE"/test-memo-tests-backends "$BUNDLE"/test-runtime-cuda-test-gpu; do
        # Missing: the trial fails on the GPU; the dry run has no test executables and goes on.
        [[ -x "$exe" ]] || { ((dry)) || variant_ok=0; continue; }
        name="variant-$VARIANT-$(basename "$exe")"
        MEMO_CUDA_ATTENTION="$VARIANT" run "$name" 60 "$exe" --test-threads=2 || variant_ok=0
        say "$name: exit $(cut -d' ' -f1 "$raw/$name.rc")"
    done
fi
end_phase 1 "executables=$tests"

# Phase 2: measurements.
begin_phase 2 "$PHASE2_S"
for seq in $SEQS; do
    # memo first: it is the point, and the phase's deadline may cut the last run short.
    for strategy in memo keep-all full-recompute; do
        name="measure-$strategy-$seq"
        train "$name" "$RUN_TIMEOUT" "$TRAIN_MACHINE" "$strategy" "$seq" "$STEPS" --trace "$raw/$name.trace.json"
    done
done
# The variant under trial, if its tests passed: memo at $VARIANT_SEQ (the same as above otherwise).
if ((variant_ok)); then
    name="variant-$VARIANT-measure-memo-$VARIANT_SEQ"
    MEMO_CUDA_ATTENTION="$VARIANT" train "$name" "$RUN_TIMEOUT" "$TRAIN_MACHINE" memo "$VARIANT_SEQ" "$STEPS" \
        --trace "$raw/$name.trace.json"
fi
end_phase 2 done

# Phase 3: capacity. The planner's longest sequences on the whole GPU (maxseq-plan), then the
# same GPU with the plan's device memory capped at $CAP (cap-plan; a smaller GPU, so that every
# run below fits the lease): keep-all at its longest sequence under the cap (KA) and one granule
# past it (refused: does not fit), memo at KA (its step time against keep-all's), memo and
# full-recompute at $LONG_FACTOR x KA, then, while the phase lasts, memo and full-recompute at
# their own longest sequences under the cap (one step each).
begin_phase 3 "$PHASE3_S"
run maxseq-plan 20 "$MEMO" plan --config "$MODEL" ${PLAN_MACHINE:+--machine-file "$PLAN_MACHINE"} --max-seq --json
run cap-plan 20 "$MEMO" plan --config "$MODEL" --machine-file "$CAP_MACHINE" --max-seq --json
planned() { # strategy -> the planner's longest sequence under the cap; nothing when none fits
    python3 scripts/gpu_check_report.py --longest "$raw" cap-plan "$1" 2>/dev/null
}
# The capped runs' attention: the variant under trial when its tests passed and its step at
# $VARIANT_SEQ was shorter than the baseline's (CAP_ATTENTION=auto), else the one named.
cap_attention="$CAP_ATTENTION"
if [[ "$cap_attention" == auto ]]; then
    cap_attention=baseline
    if ((variant_ok)) && python3 scripts/gpu_check_report.py --shorter "$raw" \
        "variant-$VARIANT-measure-memo-$VARIANT_SEQ" "measure-memo-$VARIANT_SEQ" 2>/dev/null; then
        cap_attention="$VARIANT"
    fi
fi
echo "cap_attention=$cap_attention" >>"$raw/settings.txt"
say "capped runs with $cap_attention attention"
cap_train() { # strategy seq steps
    MEMO_CUDA_ATTENTION="$cap_attention" train "cap-$1-$2" "$CAP_TIMEOUT" "$CAP_MACHINE" "$1" "$2" "$3"
}
keep_all_longest=$(planned keep-all)
if [[ -n "$keep_all_longest" ]]; then
    long=$((keep_all_longest * LONG_FACTOR))
    cap_train keep-all "$keep_all_longest" "$STEPS"
    cap_train memo "$keep_all_longest" "$STEPS"
    cap_train keep-all $((keep_all_longest + GRANULE)) 1
    cap_train memo "$long" "$CAP_LONG_STEPS"
    cap_train full-recompute "$long" "$CAP_LONG_STEPS"
    if [[ "${CAP_LONGEST:-1}" == 1 ]]; then
        for strategy in memo full-recompute; do
            longest=$(planned "$strategy")
            [[ -n "$longest" ]] && ((longest > long)) && cap_train "$strategy" "$longest" 1
        done
    fi
else
    say "keep-all fits no sequence under the $CAP cap (raw/cap-plan.*): raise CAP"
fi
end_phase 3 done

# Phase 4: the PyTorch peer.
begin_phase 4 "$PHASE4_S"
run torch-peer "$PHASE4_S" python3 scripts/torch_peer.py --device "$DEVICE" "${PEER_MODEL[@]}" --seq "$PEER_SEQ" \
    --warmup 1 --steps 3 --budget-s 12
say "torch peer: exit $(cut -d' ' -f1 "$raw/torch-peer.rc")"
# Ours at the same length, if phase 2 did not measure it.
case " $SEQS " in
    *" $PEER_SEQ "*) ;;
    *)
        for strategy in keep-all full-recompute memo; do
            train "measure-$strategy-$PEER_SEQ" "$RUN_TIMEOUT" "$TRAIN_MACHINE" "$strategy" "$PEER_SEQ" "$STEPS"
        done
        ;;
esac
end_phase 4 done

# Phase 5: the table and the JSON lines.
python3 scripts/gpu_check_report.py "$OUT"
status=$?
if [[ "${PACK:-0}" == 1 ]]; then
    tar czf "$OUT/raw.tgz" -C "$OUT" raw && rm -rf "$raw"
fi
say "done in $(($(date +%s) - started)) s; raw outputs in $raw, JSON lines in $OUT/gpu-check.jsonl"
exit $status
