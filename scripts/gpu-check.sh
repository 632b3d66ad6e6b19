#!/usr/bin/env bash
# The one prepared GPU check (scripts/README.md). Runs on the GPU machine from gpu-bundle/ (built
# here by scripts/gpu-bundle.sh; no cargo there, no network needed), ordered by value (what a cut
# run loses is the least useful part) and budgeted from the last measured run (the H200,
# 2026-12-04, BENCHMARKS.md "Training on one H200"), 540 s in all, well inside 12 minutes:
#   0  machine (15 s): nvidia-smi summary; the cuDNN found (libcudnn.so.9 from PyTorch's
#      site-packages) and its version (found before phase 0, not timed)
#   1  numerics (120 s): runtime-cuda's GPU-vs-CPU tests (test-gpu: attention on cuDNN in both
#      backward forms, the deterministic form's bits twice, our kernels, every op) with
#      MEMO_REQUIRE_CUDNN=1, then its NCCL tests (test-nccl: the binding, the collective launches
#      at t = 1 and t = 2 on the one GPU, with the wheel's libnccl.so.2 in MEMO_NCCL_LIBRARY and
#      NCCL_MULTI_RANK_GPU_ENABLE=1), then the cuDNN path's outputs against float64 PyTorch
#      (scripts/cudnn_attention_check.py, from the arguments test-gpu dumped)
#   2  tests (75 s): every other bundled test executable once (the backend suite with
#      MEMO_REQUIRE_GPU=cuda, runtime-cuda's lib tests with --nocapture: which cuDNN plans build,
#      the fake-cuDNN and NVRTC tests); attention alone at 16K tokens (TFLOP/s; the one test
#      test-gpu skipped); optional: KERNELS_CHECK=1, a VARIANT's tests
#   3  measurements (190 s): memo profile --device cuda; memo train --device cuda --json --timings
#      on the ~1B GPT (examples/models/gpt-1b.toml) at each of $SEQS for memo, keep-all and
#      full-recompute (each run's stderr says which attention ran)
#   4  capacity (60 s): the planner's --max-seq on the whole GPU; then, with the plan's device
#      memory capped at $CAP: keep-all at its longest there (KA) and one granule past it, memo at
#      KA, memo and full-recompute at $LONG_FACTOR x KA (CAP_LONGEST=1: then at their own longest)
#   5  peer (80 s): scripts/torch_peer.py (store, checkpoint, checkpoint + save_on_cpu) at each of
#      $PEER_SEQS; examples/python/replay_allocator.py with the bundled libmemo_capi.so
#   6  one table on stdout; the raw numbers as JSON lines in $OUT/gpu-check.jsonl
# Each phase has a hard deadline (its budget) and each command its own `timeout`; a phase that
# fails is recorded and the next one runs; every phase's time is printed when it ends. Nothing
# runs twice. Everything is written under ${OUT:-./gpu-check-out}.
#
#   scripts/gpu-check.sh             on the GPU machine
#   scripts/gpu-check.sh --plan      anywhere: the GPU run's phases, budgets, where each budget
#                                    comes from, the commands each would run, and the total
#                                    against 12 minutes (exit 1 when the budgets exceed it); runs
#                                    nothing
#   scripts/gpu-check.sh --dry-run   here: prints the plan (and fails as --plan does), then walks
#                                    the same phases on the CPU backend, a tiny model, tiny lengths
#                                    (exercises the control flow, the parsing, the table)
# Environment overrides: OUT, BUNDLE, MODEL, SEQS, STEPS, CAP, LONG_FACTOR, CAP_LONG_STEPS,
# CAP_TIMEOUT, CAP_LONGEST (1: also memo's and full-recompute's own longest under the cap),
# VARIANT, VARIANT_SEQ, CAP_ATTENTION, RUN_TIMEOUT, PEER_SEQS (PEER_SEQ: one), KERNELS_CHECK (1: also time our attention
# kernels with kernels/attention_gpu_check.py), REPLAY_TIMEOUT, PROFILE_SEQ, PROFILE_REPEATS, LR, WARMUP, PHASE{0..5}_S (each phase's budget in seconds),
# DRY_PHASE_S (the dry run's deadline for every phase on the slow CPU; its budgets stay the GPU's),
# PACK=1 (pack raw/ into raw.tgz and remove it: the device tool brings back at most 8 files).
set -u

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
dry=0
plan=0 # --plan: print the GPU run's phases, budgets and commands; run nothing
case "${1:-}" in
    --dry-run) dry=1 ;;
    --plan) plan=1 ;;
    "") ;;
    *) echo "usage: scripts/gpu-check.sh [--plan | --dry-run]" >&2; exit 2 ;;
esac
started=$(date +%s)

# The dry run first prints the GPU run's plan, and stops when its budgets exceed 12 minutes.
if ((dry)); then
    # The GPU run's defaults: the dry run's own settings (a tiny model, CPU deadlines) are unset.
    clean=()
    for variable in OUT MODEL SEQS STEPS CAP LONG_FACTOR CAP_LONG_STEPS CAP_TIMEOUT CAP_LONGEST VARIANT VARIANT_SEQ \
        CAP_ATTENTION RUN_TIMEOUT PEER_SEQS PEER_SEQ KERNELS_CHECK REPLAY_TIMEOUT PROFILE_SEQ PROFILE_REPEATS \
        PROFILE_TIMEOUT LR WARMUP; do
        clean+=(-u "$variable")
    done
    env "${clean[@]}" bash "${BASH_SOURCE[0]}" --plan >&2 || { echo "gpu-check: the plan does not fit (above)" >&2; exit 1; }
fi

if ((plan)); then
    OUT="$(mktemp -d)"
    trap 'rm -rf "$OUT"' EXIT
else
    OUT="${OUT:-./gpu-check-out}"
fi
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
# Phase budgets (seconds), from the last measured run: the H200 of 2026-12-04 (BENCHMARKS.md,
# "Training on one H200"; its third run: PHASE0_S=35 PHASE1_S=40 PHASE2_S=180 PHASE3_S=10
# PHASE4_S=65 in the order of that day). Where each comes from:
#   0 machine       15: nvidia-smi answered at once that day; its two calls are bounded 10 + 5 s
#                   (the profile that filled that day's 35 s moved to phase 3)
#   1 numerics     120: that day the backend suite and tests/gpu.rs passed within a 40 s phase,
#                   before cuDNN and NCCL; now test-gpu alone (cuDNN plan builds, three choices,
#                   deterministic bits) is bounded 60 s, test-nccl 35 s, the float64 check 25 s
#   2 tests         75: the backend suite 30 s (within that day's 40 s with test-gpu), the lib
#                   tests 20 s, the fake-cuDNN and NVRTC tests 5 s each (no GPU work), attention
#                   alone at 16K 15 s (cuDNN: well under a second a pass; our kernels 2.4 s)
#   3 measurements 190: memo profile 20 s (that day within its 28 s bound); eight of the nine 1B
#                   runs took 180 s with our attention kernels (setup 6.5-7.5 s, then 3 steps of
#                   0.8 s at 8K to 10.2 s at 32K); memo at 32K was cut; cuDNN's attention shortens
#                   every run (not yet measured), so 170 s is left for the nine
#   4 capacity      60: the planner 10 s (that day's phase); the capped runs at 6K and 24K: 7 s
#                   setup + 2-3 steps each, 5.7 s a step at 24K with our kernels (s^2 from 32K)
#   5 peer          80: that day the peer at one length fitted a 65 s phase (bound 18 s a length);
#                   now 3 lengths at 18 s and the replay allocator at 25 s
PHASE0_S="${PHASE0_S:-15}"
PHASE1_S="${PHASE1_S:-120}"
PHASE2_S="${PHASE2_S:-75}"
PHASE3_S="${PHASE3_S:-190}"
PHASE4_S="${PHASE4_S:-60}"
PHASE5_S="${PHASE5_S:-80}"
GPU_MINUTES=12                          # the whole script's ceiling of GPU time
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
REPLAY_TIMEOUT="${REPLAY_TIMEOUT:-25}"
MEMO="$BUNDLE/memo"
raw="$OUT/raw"
rm -rf "$raw"
mkdir -p "$raw" || { echo "gpu-check: cannot create $raw" >&2; exit 1; }
if ((dry)) && [[ "$MODEL" == "$raw/dry-model.toml" ]]; then
    printf '[model]\nlayers = 4\nhidden = 128\nheads = 4\nvocab = 256\n' >"$MODEL"
fi
if ((plan)); then # the plan runs nothing: a machine file with the preset alone
    machine_file() { printf '[machine]\npreset = "h200x1"\ndevice_memory = %s\n' "$1"; }
    machine_file '"137GiB"' >"$raw/h200-here.toml"
elif ((!dry)); then
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

say() { ((plan)) || printf '[gpu-check %4ds] %s\n' "$(($(date +%s) - started))" "$*" >&2; }
phase_deadline=0
phase_started=0
phase_budget=0
budget_total=0
# Every phase's budget is the deadline on the GPU; the dry run gives each DRY_PHASE_S on the slow
# CPU instead (its budgets, printed by the plan, stay the GPU's).
begin_phase() { # number, name, seconds, where the budget comes from
    phase_budget=$3
    budget_total=$((budget_total + $3))
    local deadline=$3
    ((dry)) && deadline="${DRY_PHASE_S:-300}"
    phase_started=$(date +%s)
    phase_deadline=$((phase_started + deadline))
    if ((plan)); then
        printf 'phase %d %s: budget %d s (%s)\n' "$1" "$2" "$3" "$4"
    else
        say "phase $1 $2 (budget $3 s, deadline $deadline s)"
    fi
    echo "started $phase_started" >"$raw/phase-$1.status"
}
end_phase() { # number, note
    echo "ended $(date +%s) $2" >>"$raw/phase-$1.status"
    say "phase $1 took $(($(date +%s) - phase_started)) s of its $phase_budget s budget"
}
# run NAME SECONDS COMMAND...: stdout to $raw/NAME.out, stderr to .err, exit code and seconds to
# .rc, bounded by SECONDS and by the phase's deadline (exit 124 when cut). Under --plan: prints
# the command and its bound, runs nothing (exit 0).
run() {
    local name="$1" limit="$2"
    shift 2
    if ((plan)); then
        local text="$*"
        printf '  %3d s  %s\n' "$limit" "${text//$OUT/\$OUT}"
        echo "0 0 $limit" >"$raw/$name.rc"
        return 0
    fi
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
exit_of() { cut -d' ' -f1 "$raw/$1.rc" 2>/dev/null; }

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

# The bundle's test executables (gpu-bundle.sh names them); the plan lists the names a bundle has
# when none is here.
executables=()
for exe in "$BUNDLE"/test-*; do
    [[ -x "$exe" ]] && executables+=("$exe")
done
if ((plan)) && ((${#executables[@]} == 0)); then
    for name in test-runtime-cuda-test-gpu test-runtime-cuda-test-nccl test-memo-tests-backends \
        test-runtime-cuda-lib-runtime_cuda test-runtime-cuda-test-cudnn_fake test-runtime-cuda-test-nvrtc_compile; do
        executables+=("$BUNDLE/$name")
    done
fi
has() { [[ " ${executables[*]} " == *" $BUNDLE/$1 "* ]]; }
# Runs bundled test executable NAME (bound SECONDS, more arguments after) once, and says how it went.
test_exe() {
    local name="$1" limit="$2"
    shift 2
    run "$name" "$limit" "$BUNDLE/$name" --test-threads=2 "$@"
    say "$name: exit $(exit_of "$name")"
}

if ((!plan)) && [[ ! -x "$MEMO" ]]; then
    say "no $MEMO: build the bundle first (scripts/gpu-bundle.sh) and carry gpu-bundle/"
    echo "127 0 no-bundle" >"$raw/memo-missing.rc"
fi
((plan)) && printf 'gpu-check plan: the GPU run (budgets in seconds; each command with its own bound)\n'

# Phase 0: the machine.
begin_phase 0 machine "$PHASE0_S" "nvidia-smi answered at once on 2026-12-04; two calls bounded 10 + 5 s"
if ((dry)); then
    run nvidia-smi 10 echo "dry run: no nvidia-smi (CPU backend)"
else
    run nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm,power.limit \
        --format=csv
    run nvidia-smi-full 5 nvidia-smi
fi
((dry || plan)) || say "cuDNN: ${cudnn_lib:-not found} (version ${cudnn_version:-unknown})"
end_phase 0 done

# Phase 1: numerics, first: runtime-cuda's GPU-vs-CPU tests (cuDNN in both backward forms, the
# deterministic bits, our kernels; attention alone at 16K waits for phase 2), its NCCL tests, and
# the cuDNN path against float64 PyTorch from the arguments test-gpu dumped (PyTorch's own cuDNN
# SDPA graph logged beside, for runtime-cuda/tests/golden/attention-*.txt).
begin_phase 1 numerics "$PHASE1_S" \
    "2026-12-04: the backend suite and tests/gpu.rs passed within a 40 s phase, before cuDNN and NCCL; bounds 60 + 35 + 25 s"
tests=0
if has test-runtime-cuda-test-gpu; then
    tests=$((tests + 1))
    MEMO_ATTENTION_DUMP="$raw/attention-dump" test_exe test-runtime-cuda-test-gpu 60 --skip attention_throughput
fi
if has test-runtime-cuda-test-nccl; then
    tests=$((tests + 1))
    test_exe test-runtime-cuda-test-nccl 35
fi
if ((dry)); then
    run cudnn-attention-check 10 echo "dry run: no GPU test dumped attention"
else
    run cudnn-attention-check 25 python3 scripts/cudnn_attention_check.py "$raw/attention-dump" \
        --frontend-log "$raw/torch-cudnn-frontend.log"
fi
say "cuDNN attention vs float64 PyTorch: exit $(exit_of cudnn-attention-check)"
end_phase 1 "executables=$tests"

# Phase 2: every other test executable, once (runtime-cuda's lib tests print which cuDNN plans
# build, with the LSE layout chosen for this cuDNN); attention alone at 16K tokens, 16 heads of
# 128 (TFLOP/s, the default attention: the one test phase 1 skipped); optional extras.
begin_phase 2 tests "$PHASE2_S" \
    "the backend suite passed within 2026-12-04's 40 s phase; bounds 30 + 20 + 5 + 5 s, attention alone 15 s"
for exe in "${executables[@]}"; do
    name="$(basename "$exe")"
    case "$name" in
        test-runtime-cuda-test-gpu | test-runtime-cuda-test-nccl) continue ;; # phase 1
        test-memo-tests-backends) bound=30 ;;
        test-runtime-cuda-lib-runtime_cuda) bound=20 ;;
        *) bound=5 ;;
    esac
    tests=$((tests + 1))
    if [[ "$name" == test-runtime-cuda-lib-runtime_cuda ]]; then
        test_exe "$name" "$bound" --nocapture
        ((plan)) || grep -hE "^(cuDNN|b=)" "$raw/$name.out" >&2
    else
        test_exe "$name" "$bound"
    fi
done
((tests == 0)) && say "no test executables in $BUNDLE"
if has test-runtime-cuda-test-gpu; then
    MEMO_ATTENTION_BENCH=1 run attention-throughput 15 "$BUNDLE/test-runtime-cuda-test-gpu" attention_throughput \
        --exact --nocapture
    ((plan)) || grep -h "attention throughput" "$raw/attention-throughput.out" >&2
fi
# Our attention kernels on their own, every path, against float64 PyTorch and timed (optional).
if [[ "${KERNELS_CHECK:-0}" == 1 ]] && ((!dry)); then
    run attention-kernels 60 python3 kernels/attention_gpu_check.py --time
    say "attention kernels: exit $(exit_of attention-kernels)"
fi
# The variant under trial: the GPU-vs-CPU tests again with its kernels (another attention choice).
variant_ok=0
if [[ -n "$VARIANT" ]]; then
    variant_ok=1
    for name in test-memo-tests-backends test-runtime-cuda-test-gpu; do
        # Missing: the trial fails on the GPU; the dry run has no test executables and goes on.
        has "$name" || { ((dry)) || variant_ok=0; continue; }
        MEMO_CUDA_ATTENTION="$VARIANT" run "variant-$VARIANT-$name" 60 "$BUNDLE/$name" --test-threads=2 \
            --skip attention_throughput || variant_ok=0
        say "variant-$VARIANT-$name: exit $(exit_of "variant-$VARIANT-$name")"
    done
fi
end_phase 2 "executables=$tests"

# Phase 3: measurements.
begin_phase 3 measurements "$PHASE3_S" \
    "2026-12-04: eight of these nine 1B runs took 180 s with our attention kernels (memo at 32K cut); profile 20 s"
run profile "${PROFILE_TIMEOUT:-20}" "$MEMO" profile --device "$DEVICE" "${PROFILE_ARGS[@]}" --out "$raw/machine.toml" --json
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
end_phase 3 done

# Phase 4: capacity. The planner's longest sequences on the whole GPU (maxseq-plan), then the
# same GPU with the plan's device memory capped at $CAP (cap-plan; a smaller GPU, so that every
# run below fits the lease): keep-all at its longest sequence under the cap (KA) and one granule
# past it (refused: does not fit), memo at KA (its step time against keep-all's), memo and
# full-recompute at $LONG_FACTOR x KA, then, with CAP_LONGEST=1 and while the phase lasts, memo
# and full-recompute at their own longest sequences under the cap (one step each).
begin_phase 4 capacity "$PHASE4_S" \
    "2026-12-04: the planner within a 10 s phase; capped runs at 6K and 24K: ~7 s setup + 2-3 steps each (estimates)"
run maxseq-plan 10 "$MEMO" plan --config "$MODEL" ${PLAN_MACHINE:+--machine-file "$PLAN_MACHINE"} --max-seq --json
run cap-plan 10 "$MEMO" plan --config "$MODEL" --machine-file "$CAP_MACHINE" --max-seq --json
planned() { # strategy -> the planner's longest sequence under the cap; nothing when none fits
    if ((plan)); then # the planner's answer for 24 GiB (BENCHMARKS.md, "Capacity under a device-memory cap")
        case "$1" in keep-all) echo 6144 ;; memo) echo 57344 ;; full-recompute) echo 58368 ;; esac
        return
    fi
    python3 scripts/gpu_check_report.py --longest "$raw" cap-plan "$1" 2>/dev/null
}
# The capped runs' attention: the variant under trial when its tests passed and its step at
# $VARIANT_SEQ was shorter than the baseline's (CAP_ATTENTION=auto), else the one named.
cap_attention="$CAP_ATTENTION"
if [[ "$cap_attention" == auto ]]; then
    cap_attention=cudnn
    if ((variant_ok)) && ((!plan)) && python3 scripts/gpu_check_report.py --shorter "$raw" \
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
    if [[ "${CAP_LONGEST:-0}" == 1 ]]; then
        for strategy in memo full-recompute; do
            longest=$(planned "$strategy")
            [[ -n "$longest" ]] && ((longest > long)) && cap_train "$strategy" "$longest" 1
        done
    fi
else
    say "keep-all fits no sequence under the $CAP cap (raw/cap-plan.*): raise CAP"
fi
end_phase 4 done

# Phase 5: the PyTorch peer.
begin_phase 5 peer "$PHASE5_S" \
    "2026-12-04: the peer at one length fitted a 65 s phase (18 s bound); 18 s a length, replay allocator 25 s"
for peer_seq in $PEER_SEQS; do
    name="torch-peer"
    [[ "$peer_seq" == "${PEER_SEQS%% *}" ]] || name="torch-peer-$peer_seq"
    run "$name" 18 python3 scripts/torch_peer.py --device "$DEVICE" "${PEER_MODEL[@]}" --seq "$peer_seq" \
        --warmup 1 --steps 3 --budget-s 6
    say "torch peer at $peer_seq: exit $(exit_of "$name")"
    # Ours at the same length, if phase 3 did not measure it.
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
elif ((plan)) || [[ -f "$BUNDLE/libmemo_capi.so" ]]; then
    run replay-allocator "$REPLAY_TIMEOUT" python3 examples/python/replay_allocator.py --lib "$BUNDLE/libmemo_capi.so" \
        --warmup 1 --record 2 --steps 5 --json "$raw/replay-allocator.json"
else
    echo "127 0 no-libmemo_capi" >"$raw/replay-allocator.rc"
fi
say "replay allocator: exit $(exit_of replay-allocator)"
end_phase 5 done

if ((plan)); then
    limit=$((GPU_MINUTES * 60))
    if ((budget_total <= limit)); then
        printf 'total: %d s of %d s (%d minutes): fits, %d s to spare\n' "$budget_total" "$limit" "$GPU_MINUTES" \
            $((limit - budget_total))
        exit 0
    fi
    printf 'total: %d s of %d s (%d minutes): DOES NOT FIT, %d s over\n' "$budget_total" "$limit" "$GPU_MINUTES" \
        $((budget_total - limit))
    exit 1
fi

# Which attention each GPU process ran (runtime-cuda prints one line when it opens the device).
grep -h "^attention: " "$raw"/*.err 2>/dev/null | sort | uniq -c >"$raw/attention-ran.txt"
[[ -s "$raw/attention-ran.txt" ]] && { say "attention ran as:"; cat "$raw/attention-ran.txt" >&2; }
# Phase 6: the table and the JSON lines.
python3 scripts/gpu_check_report.py "$OUT"
status=$?
if [[ "${PACK:-0}" == 1 ]]; then
    tar czf "$OUT/raw.tgz" -C "$OUT" raw && rm -rf "$raw"
fi
say "done in $(($(date +%s) - started)) s; raw outputs in $raw, JSON lines in $OUT/gpu-check.jsonl"
exit $status
