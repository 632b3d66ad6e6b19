#!/usr/bin/env bash
# Builds, here, in release, everything the GPU machine runs (it has no Rust toolchain):
#   memo                          the CLI (memo train --device cuda, memo profile)
#   test-memo-tests-backends      the backend suite of tests/tests/backends.rs
#   test-runtime-cuda-*           every test executable of runtime-cuda (its lib and tests/)
#   libmemo_capi.so               the C ABI, for examples/python/replay_allocator.py
# and copies them, stripped, into gpu-bundle/ (gitignored) with a MANIFEST (name, bytes, sha256,
# where it came from, the commit). Prints the total size, which must stay well under the 64 MiB
# that travels with the working tree. Usage: scripts/gpu-bundle.sh [--out DIR]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/gpu-bundle"
if [[ "${1:-}" == "--out" && -n "${2:-}" ]]; then out="$2"; fi
limit=$((48 * 1024 * 1024)) # refuse past 48 MiB: leaves room under the 64 MiB carry limit

cd "$root"
command -v jq >/dev/null || { echo "gpu-bundle: jq is needed to read cargo's JSON" >&2; exit 1; }
command -v strip >/dev/null || { echo "gpu-bundle: strip (binutils) is needed" >&2; exit 1; }

echo "gpu-bundle: cargo build --release -p memo-cli" >&2
cargo build --release -p memo-cli >&2
echo "gpu-bundle: cargo build --release -p memo-capi" >&2
cargo build --release -p memo-capi >&2
echo "gpu-bundle: cargo test --release --no-run -p memo-tests -p runtime-cuda" >&2
artifacts="$(cargo test --release --no-run --message-format=json -p memo-tests -p runtime-cuda)"

rm -rf "$out.tmp"
mkdir -p "$out.tmp"
copy() { # source, name
    cp "$1" "$out.tmp/$2"
    strip --strip-debug "$out.tmp/$2"
    chmod +x "$out.tmp/$2"
    printf '%s\t%s\t%s\t%s\n' "$2" "$(stat -c %s "$out.tmp/$2")" "$(sha256sum "$out.tmp/$2" | cut -d' ' -f1)" \
        "${1#"$root"/}" >>"$out.tmp/MANIFEST.body"
}
copy "$root/target/release/memo" memo
copy "$root/target/release/libmemo_capi.so" libmemo_capi.so
# One line per test executable: the crate's directory, target kind, target name, path.
while IFS=$'\t' read -r dir kind name path; do
    case "$dir/$name" in
        tests/backends) copy "$path" "test-memo-tests-backends" ;;
        runtime-cuda/*) copy "$path" "test-runtime-cuda-$kind-$name" ;;
    esac
done < <(jq -r 'select(.reason == "compiler-artifact" and .executable != null)
    | [(.manifest_path | split("/") | .[-2]), .target.kind[0], .target.name, .executable] | @tsv' <<<"$artifacts")

if ! grep -q '^test-memo-tests-backends' "$out.tmp/MANIFEST.body"; then
    echo "gpu-bundle: cargo listed no memo-tests backends executable" >&2
    exit 1
fi
{
    echo "# gpu-bundle: built by scripts/gpu-bundle.sh"
    echo "# commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!gpu-bundle' || echo ' (with uncommitted changes)')"
    echo "# built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(rustc --version)"
    printf '# name\tbytes\tsha256\tfrom\n'
    cat "$out.tmp/MANIFEST.body"
} >"$out.tmp/MANIFEST"
rm "$out.tmp/MANIFEST.body"
rm -rf "$out"
mv "$out.tmp" "$out"

total=$(du -cb "$out"/* | tail -1 | cut -f1)
cat "$out/MANIFEST" >&2
awk -v n="$(($(ls "$out" | wc -l) - 1))" -v t="$total" -v d="$out" \
    'BEGIN { printf "gpu-bundle: %d executables, %.1f MiB in %s\n", n, t / 1048576, d }'
if ((total > limit)); then
    echo "gpu-bundle: $total bytes is over the $limit-byte budget (64 MiB travel with the tree)" >&2
    exit 1
fi
