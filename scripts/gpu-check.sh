#!/usr/bin/env bash
# The one prepared GPU check (scripts/README.md). Runs on the GPU machine from gpu-bundle/ (built
# here by scripts/gpu-bundle.sh; no cargo there, no network needed), under 6 minutes:
#   0  nvidia-smi summary; the cuDNN found (libcudnn.so.9 from PyTorch's site-packages) and its
#      version; memo profile --device cuda (copy bandwidth, one layer's forward)
#   1  correctness: every bundled test executable (the backend suite with MEMO_REQUIRE_GPU=cuda,
#      runtime-cuda's GPU-vs-CPU tests with MEMO_REQUIRE_CUDNN=1: attention on cuDNN in both
#      backward forms and on our kernels against the CPU; its NCCL tests with the wheel's
#      libnccl.so.2 named in MEMO_NCCL_LIBRARY and NCCL_MULTI_RANK_GPU_ENABLE=1: the binding, the
#      backend's collective launches at t = 1 and t = 2 on the one GPU against the CPU's group,
#      a t = 1 plan with NCCL joined against without, about 6 backends of 0.6 s and a few NCCL
#      joins more than before, within the executable's 60 s): pass/fail and
#      their counts; the cuDNN path's outputs against float64 PyTorch
#      (scripts/cudnn_attention_check.py, with PyTorch's own cuDNN SDPA graph logged beside);
#      which cuDNN plans build; attention alone at 16K tokens (TFLOP/s)
#   2  measurements: memo train --device cuda --json --timings on the ~1B GPT
#      (examples/models/gpt-1b.toml) at each of $SEQS for keep-all, full-recompute and memo,
#      attention on cuDNN (the default; each run's stderr says which attention ran)
#   3  capacity: the planner's --max-seq on the whole GPU; then, with the plan's device memory
#      capped at $CAP (a smaller GPU, so that the runs fit the lease): keep-all at its longest
#      sequence there (KA) and one granule past it, memo at KA, memo and full-recompute at
#      $LONG_FACTOR x KA, then memo and full-recompute at their own longest (one step each)
#   4  the PyTorch peer (scripts/torch_peer.py): store, checkpoint, checkpoint + save_on_cpu, at
#      each of $PEER_SEQS; then examples/python/replay_allocator.py (memo's record/replay
#      allocator against PyTorch's caching allocator) with the bundled libmemo_capi.so
#   5  one table on stdout; the raw numbers as JSON lines in $OUT/gpu-check.jsonl
# Each phase has a hard deadline and each command its own `timeout`; a phase that fails is
# recorded and the next one runs. Everything is written under ${OUT:-./gpu-check-out}.
#
#   scripts/gpu-check.sh             on the GPU machine
#   scripts/gpu-check.sh --dry-run   here: the same phases on the CPU backend, a tiny model, tiny
#                                    lengths (exercises the control flow, the parsing, the table)
# Environment overrides: OUT, BUNDLE, MODEL, SEQS, STEPS, CAP, LONG_FACTOR, CAP_LONG_STEPS,
# CAP_TIMEOUT, CAP_LONGEST (0: skip memo's and full-recompute's own longest under the cap),
# VARIANT, VARIANT_SEQ, CAP_ATTENTION, RUN_TIMEOUT, PEER_SEQS (PEER_SEQ: one), KERNELS_CHECK (1: also time our attention
# kernels with kernels/attention_gpu_check.py), REPLAY_TIMEOUT, PROFILE_SEQ, PROFILE_REPEATS, LR, WARMUP, PHASE{0..4}_S (each phase's deadline in seconds),
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
    PEER_SEQS="${PEER_SEQS:-${PEER_SEQ:-64}}"
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
    SEQS="${SEQS:-8192 16384 32768}"   # with cuDNN attention a 32K step is about a second (estimate)
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
    PEER_SEQS="${PEER_SEQS:-${PEER_SEQ:-8192 16384 32768}}"
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
PHASE0_S="${PHASE0_S:-30}"
PHASE1_S="${PHASE1_S:-100}"
PHASE2_S="${PHASE2_S:-90}"
PHASE3_S="${PHASE3_S:-55}"
GRANULE=1024                            # the planner's --max-seq steps
# An attention choice under trial (runtime-cuda's MEMO_CUDA_ATTENTION: cudnn, the default,
# cudnn-deterministic, baseline or pipelined): phase 1 runs the GPU-vs-CPU tests with it, phase
# 2 measures memo with it at $VARIANT_SEQ, and phase 3 uses it (CAP_ATTENTION=auto) when both
# went well and its step was the shorter than cuDNN's. Empty (the default): no trial.
VARIANT="${VARIANT-}"
VARIANT_SEQ="${VARIANT_SEQ:-16384}"
((dry)) && VARIANT_SEQ="${VARIANT_SEQ_DRY:-64}"
CAP_ATTENTION="${CAP_ATTENTION:-auto}"
CAP_MACHINE="$OUT/raw/capped.toml"
PHASE4_S="${PHASE4_S:-80}"
REPLAY_TIMEOUT="${REPLAY_TIMEOUT:-25}"
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
    # cuDNN: cudarc opens libcudnn.so.9 (or libcudnn.so) from the loader's path; PyTorch's CUDA
    # wheels ship it in site-packages/nvidia/cudnn/lib, off the path: put that folder on it.
    cudnn_lib=""
    if ldconfig -p 2>/dev/null | grep -Eq 'libcudnn\.so(\.9)? '; then
        cudnn_lib=$(ldconfig -p | grep -E 'libcudnn\.so(\.9)? ' | head -1 | sed 's/.*=> //')
        echo "libcudnn: found by the loader ($cudnn_lib)" >>"$raw/cuda-libs.txt"
    else
        cudnn_lib=$(ls -1 $(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__) if nvidia.cudnn.__file__ else list(nvidia.cudnn.__path__)[0])' 2>/dev/null)/lib/libcudnn.so.9 \
            $(for s in $site; do echo "$s"/nvidia/cudnn/lib/libcudnn.so.9; done) 2>/dev/null | head -1)
        if [[ -n "$cudnn_lib" ]]; then
            LD_LIBRARY_PATH="$(dirname "$cudnn_lib"):${LD_LIBRARY_PATH:-}"
            echo "libcudnn: $cudnn_lib (its folder put on LD_LIBRARY_PATH)" >>"$raw/cuda-libs.txt"
            # cuDNN opens the cuBLASLt of its own CUDA major (libcublasLt.so.12 for a cu12 wheel):
            # the wheel's sibling nvidia/cublas/lib, last on the path (the GEMMs keep the toolkit's).
            cublas_sibling="$(dirname "$(dirname "$(dirname "$cudnn_lib")")")/cublas/lib"
            if [[ -d "$cublas_sibling" ]]; then
                LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$cublas_sibling"
                echo "libcublasLt for cuDNN: $cublas_sibling appended to LD_LIBRARY_PATH" >>"$raw/cuda-libs.txt"
            fi
        else
            echo "libcudnn: not found (attention runs on our kernels; the backend says so)" >>"$raw/cuda-libs.txt"
        fi
    fi
    export LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"
    cudnn_version=""
    [[ -n "$cudnn_lib" ]] && cudnn_version=$(timeout 20 python3 -c 'import ctypes, sys
v = ctypes.CDLL(sys.argv[1]).cudnnGetVersion()
print("%d.%d.%d" % (v // 10000, v // 100 % 100, v % 100))' "$cudnn_lib" 2>/dev/null)
    echo "cudnn=${cudnn_lib:-none} version=${cudnn_version:-unknown}" >>"$raw/cuda-libs.txt"
    export MEMO_REQUIRE_CUDNN=1         # runtime-cuda's GPU test fails if a cuDNN choice fell back
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
    echo "variant=$VARIANT"; echo "variant_seq=$VARIANT_SEQ"; echo "cudnn=${cudnn_lib:-none} ${cudnn_version:-}"
    echo "peer_seqs=$PEER_SEQS"; echo "lr=$LR"; echo "warmup=$WARMUP"; echo "started=$started"; echo "host=$(hostname)"
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
((dry)) || say "cuDNN: ${cudnn_lib:-not found} (version ${cudnn_version:-unknown})"
run profile "${PROFILE_TIMEOUT:-28}" "$MEMO" profile --device "$DEVICE" "${PROFILE_ARGS[@]}" --out "$raw/machine.toml" --json
end_phase 0 done

# Phase 1: correctness.
begin_phase 1 "$PHASE1_S"
# First, the quickest answer: which cuDNN plans build (every pass, with the plan's token-major
# LSE and with cuDNN's head-major one), i.e. whether cuDNN takes the plan's LSE layout
# (runtime-cuda's lib test, printed).
if [[ -x "$BUNDLE/test-runtime-cuda-lib-runtime_cuda" ]]; then
    run cudnn-plans 30 "$BUNDLE/test-runtime-cuda-lib-runtime_cuda" plans_build_on_a_gpu --nocapture
    grep -hE "^(cuDNN|b=)" "$raw/cudnn-plans.out" >&2
fi
tests=0
for exe in "$BUNDLE"/test-*; do
    [[ -x "$exe" ]] || continue
    tests=$((tests + 1))
    name="$(basename "$exe")"
    MEMO_ATTENTION_DUMP="$raw/attention-dump" run "$name" 60 "$exe" --test-threads=2
    say "$name: exit $(cut -d' ' -f1 "$raw/$name.rc")"
done
((tests == 0)) && say "no test executables in $BUNDLE"
# The cuDNN path (and the other choices the GPU test ran) against float64 PyTorch, from the
# arguments the GPU test dumped; PyTorch's own cuDNN SDPA graph logged beside, for comparison
# with runtime-cuda/tests/golden/attention-*.txt.
if ((dry)); then
    run cudnn-attention-check 10 echo "dry run: no GPU test dumped attention"
else
    run cudnn-attention-check 40 python3 scripts/cudnn_attention_check.py "$raw/attention-dump" \
        --frontend-log "$raw/torch-cudnn-frontend.log"
fi
say "cuDNN attention vs float64 PyTorch: exit $(cut -d' ' -f1 "$raw/cudnn-attention-check.rc")"
# Attention alone at 16K tokens, 16 heads of 128: forward and backward TFLOP/s (the default
# attention, cuDNN), printed by runtime-cuda's GPU test attention_throughput.
if [[ -x "$BUNDLE/test-runtime-cuda-test-gpu" ]]; then
    MEMO_ATTENTION_BENCH=1 run attention-throughput 30 "$BUNDLE/test-runtime-cuda-test-gpu" attention_throughput \
        --exact --nocapture
    grep -h "attention throughput" "$raw/attention-throughput.out" >&2
fi
# Our attention kernels on their own, every path, against float64 PyTorch and timed (optional).
if [[ "${KERNELS_CHECK:-0}" == 1 ]] && ((!dry)); then
    run attention-kernels 60 python3 kernels/attention_gpu_check.py --time
    say "attention kernels: exit $(cut -d' ' -f1 "$raw/attention-kernels.rc")"
fi
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
    cap_attention=cudnn
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
for peer_seq in $PEER_SEQS; do
    name="torch-peer"
    [[ "$peer_seq" == "${PEER_SEQS%% *}" ]] || name="torch-peer-$peer_seq"
    run "$name" 18 python3 scripts/torch_peer.py --device "$DEVICE" "${PEER_MODEL[@]}" --seq "$peer_seq" \
        --warmup 1 --steps 3 --budget-s 6
    say "torch peer at $peer_seq: exit $(cut -d' ' -f1 "$raw/$name.rc")"
    # Ours at the same length, if phase 2 did not measure it.
    case " $SEQS " in
        *" $peer_seq "*) ;;
        *)
            for strategy in keep-all full-recompute memo; do
                train "measure-$strategy-$peer_seq" "$RUN_TIMEOUT" "$TRAIN_MACHINE" "$strategy" "$peer_seq" "$STEPS"
            done
            ;;
    esac
done
# memo's record/replay allocator against PyTorch's caching allocator (never run on a GPU before).
if ((dry)); then
    run replay-allocator 10 echo "dry run: no GPU for examples/python/replay_allocator.py"
elif [[ -f "$BUNDLE/libmemo_capi.so" ]]; then
    run replay-allocator "$REPLAY_TIMEOUT" python3 examples/python/replay_allocator.py --lib "$BUNDLE/libmemo_capi.so" \
        --warmup 1 --record 2 --steps 5 --json "$raw/replay-allocator.json"
else
    echo "127 0 no-libmemo_capi" >"$raw/replay-allocator.rc"
fi
say "replay allocator: exit $(cut -d' ' -f1 "$raw/replay-allocator.rc")"
end_phase 4 done

# Which attention each GPU process ran (runtime-cuda prints one line when it opens the device).
grep -h "^attention: " "$raw"/*.err 2>/dev/null | sort | uniq -c >"$raw/attention-ran.txt"
[[ -s "$raw/attention-ran.txt" ]] && { say "attention ran as:"; cat "$raw/attention-ran.txt" >&2; }
# Phase 5: the table and the JSON lines.
python3 scripts/gpu_check_report.py "$OUT"
status=$?
if [[ "${PACK:-0}" == 1 ]]; then
    tar czf "$OUT/raw.tgz" -C "$OUT" raw && rm -rf "$raw"
fi
say "done in $(($(date +%s) - started)) s; raw outputs in $raw, JSON lines in $OUT/gpu-check.jsonl"
exit $status
