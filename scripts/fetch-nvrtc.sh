#!/usr/bin/env bash
# Fetches NVIDIA's NVRTC and CUDA runtime headers from the Python package registry into
# .cache/nvrtc/ (repository root; gitignored) so that the NVRTC compile test of runtime-cuda
# can compile every kernel for sm_80 and sm_90 on a machine with no GPU and no CUDA install.
# No system change: `pip download --no-deps` then unzip. Idempotent: a complete cache is kept.
#
# Result:  .cache/nvrtc/lib/libnvrtc.so (-> libnvrtc.so.12) and its builtins,
#          .cache/nvrtc/include/ (cuda_runtime headers, among them cuda_bf16.h),
#          .cache/nvrtc/READY (written last: the test trusts the folder only when it exists).
# Exit status: 0 when the cache is ready, 1 when it could not be made (the reason is printed;
# the compile test then prints SKIP with that reason).
set -uo pipefail
cd "$(dirname "$0")/.."
cache=".cache/nvrtc"
# CUDA 12 wheels: the newest 12.x NVRTC still compiles for sm_80 and sm_90.
packages=("nvidia-cuda-nvrtc-cu12" "nvidia-cuda-runtime-cu12")

failed=".cache/nvrtc.failed"  # the last failure's reason, which the compile test prints in its SKIP
fail() {
    echo "fetch-nvrtc: $1" >&2
    mkdir -p .cache && echo "$1" >"$failed"
    rm -rf "$cache"
    exit 1
}

if [[ -f "$cache/READY" ]]; then
    echo "fetch-nvrtc: $cache is ready ($(cat "$cache/READY")); nothing to do"
    exit 0
fi

python=""
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -m pip --version >/dev/null 2>&1; then
        python="$candidate"
        break
    fi
done
if [[ -z "$python" ]]; then
    fail "no python with pip on PATH; install python3-pip to compile-check the kernels"
fi

rm -rf "$cache"
mkdir -p "$cache/wheels" "$cache/unpacked" "$cache/lib"
start=$(date +%s)
if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --python-version 3.11 --dest "$cache/wheels" "${packages[@]}"; then
    fail "pip download of ${packages[*]} failed (no route to the Python package registry?)"
fi
for wheel in "$cache"/wheels/*.whl; do
    "$python" -m zipfile -e "$wheel" "$cache/unpacked" || fail "cannot unzip $wheel"
done

nvrtc_lib="$(find "$cache/unpacked" -path '*cuda_nvrtc/lib*' -name 'libnvrtc.so.*' ! -name '*builtins*' | sort | head -n 1)"
include="$(find "$cache/unpacked" -type d -path '*cuda_runtime/include' | head -n 1)"
if [[ -z "$nvrtc_lib" || -z "$include" || ! -f "$include/cuda_bf16.h" ]]; then
    fail "the wheels lack libnvrtc.so.* or cuda_runtime/include/cuda_bf16.h; layout changed?"
fi
# The library and its builtins side by side in lib/, plus the unversioned names loaders look for.
# Relative links, so the cache survives moving the checkout.
for so in "$(dirname "$nvrtc_lib")"/*.so*; do
    ln -sf "../${so#"$cache"/}" "$cache/lib/$(basename "$so")"
done
ln -sf "$(basename "$nvrtc_lib")" "$cache/lib/libnvrtc.so"
builtins="$(cd "$cache/lib" && ls libnvrtc-builtins.so.* 2>/dev/null | head -n 1)"
[[ -n "$builtins" ]] && ln -sf "$builtins" "$cache/lib/libnvrtc-builtins.so"
ln -sfn "${include#"$cache"/}" "$cache/include"

versions="$(cd "$cache/wheels" && ls *.whl | tr '\n' ' ')"
rm -rf "$cache/wheels"  # unpacked; the names are kept in READY
echo "$versions" >"$cache/READY"
rm -f "$failed"
echo "fetch-nvrtc: ready in $(( $(date +%s) - start )) s: $cache/lib/libnvrtc.so -> $(basename "$nvrtc_lib"), headers in $cache/include"
echo "fetch-nvrtc: wheels: $versions($(du -sh "$cache" | cut -f1) on disk)"
