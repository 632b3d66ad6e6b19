#!/usr/bin/env bash
# The README's test command: every test of the workspace, and every check that can run on this
# machine. Says first what it will download (once, into .cache/, gitignored), and ends with the
# list of what was skipped and why: a passing test's output is otherwise hidden by the harness.
#
#   scripts/test.sh [extra cargo test arguments]
#   MEMO_TEST_OFFLINE=1 scripts/test.sh   # no downloads; the kernel compile checks then SKIP
#
# Exit status: cargo test's.
set -uo pipefail
cd "$(dirname "$0")/.."

features="memo-plan-core/mip,memo-plan-core/fuzzing,runtime-cpu/fuzzing"

if [[ -n "${MEMO_TEST_OFFLINE:-}" ]]; then
    echo "== scripts/test.sh: MEMO_TEST_OFFLINE is set: nothing is downloaded"
else
    echo "== scripts/test.sh: before the tests, once (kept in .cache/, gitignored; nothing is installed):"
    echo "   - NVIDIA's NVRTC and CUDA runtime headers, two wheels from PyPI (93 MB; 227 MB unpacked),"
    echo "     for the NVRTC compile check of every kernel (scripts/fetch-nvrtc.sh)"
    echo "   - Debian's ROCm 5.2 HIP runtime and hiprtc with the dependencies this machine lacks"
    echo "     (18 MB of packages; 95 MB unpacked), for the hiprtc compile check (scripts/fetch-rocm.sh)"
    echo "   MEMO_TEST_OFFLINE=1 skips both; a failed download only makes its check SKIP."
    scripts/fetch-nvrtc.sh || echo "== NVRTC not fetched (reason above): its compile check will SKIP"
    scripts/fetch-rocm.sh || echo "== ROCm not fetched (reason above): its compile check will SKIP"
fi

skip_log="$(mktemp "${TMPDIR:-/tmp}/memo-skipped.XXXXXX")"
trap 'rm -f "$skip_log"' EXIT
# --no-fail-fast: every test binary runs, so the list of skips below is whole even when one fails.
echo "== cargo test --workspace --no-fail-fast --features $features $*"
MEMO_SKIP_LOG="$skip_log" cargo test --workspace --no-fail-fast --features "$features" "$@"
status=$?

echo
if [[ -s "$skip_log" ]]; then
    echo "== skipped on this machine ($(wc -l <"$skip_log") checks), one line per reason (count, a first test, why):"
    # "SKIP crate::test: why" -> one line per reason with its count and a first test. Tests that
    # skip for one cause say it in the same words (tests/support/skip.rs), so each cause is one line.
    sed 's/^SKIP \([^ ]*\): /\1\t/' "$skip_log" | sort -t$'\t' -k2,2 -k1,1 |
        awk -F'\t' '{ n[$2]++; if (!($2 in first)) { first[$2] = $1; order[++k] = $2 } }
            END { for (i = 1; i <= k; i++) { r = order[i];
                printf "   %3d x [%s] %s\n", n[r], first[r], r } }'
else
    echo "== nothing was skipped"
fi
exit $status
