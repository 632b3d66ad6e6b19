#!/usr/bin/env bash
# Fetches Debian's ROCm 5.2.3 HIP runtime (with hiprtc) into .cache/rocm/ at the repository root,
# without installing anything on the system: `apt-get download` the packages, `dpkg -x` each into
# .cache/rocm/root, and link .cache/rocm/lib to the unpacked library folder. runtime-hip's tests
# load the runtime from there by explicit path to compile every kernel with hiprtc for gfx90a and
# to test the no-device error (spec/backends.md, HIP).
#
# Idempotent: a complete cache is left as it is. Dependencies the machine lacks (LLVM 15 for
# comgr, libnuma, libelf, libdrm, ...) are fetched into the cache as well.
# When the archive cannot be reached it says so and exits 0: the tests then print SKIP.
set -uo pipefail
cd "$(dirname "$0")/.."

CACHE=.cache/rocm
PACKAGES=(libamdhip64-5 libamd-comgr2 libhsa-runtime64-1 libhsakmt1 libhiprtc-builtins5)
if [ -e "$CACHE/lib/libamdhip64.so" ] && [ -e "$CACHE/complete" ]; then
    echo "fetch-rocm: $CACHE already holds the HIP runtime ($(cat "$CACHE/complete")); nothing to do"
    exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
    echo "fetch-rocm: apt-get/dpkg not available on this machine; the hiprtc compile check will SKIP"
    exit 0
fi

start=$(date +%s)
mkdir -p "$CACHE/debs" "$CACHE/root"
# Their dependencies that this machine lacks (none on a desktop Debian 12, where Mesa already
# brings LLVM 15 and libdrm; a minimal image may lack several) come into the cache too.
wanted=("${PACKAGES[@]}")
for package in $(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances "${PACKAGES[@]}" 2>/dev/null | grep -E '^[a-z0-9]' | sort -u); do
    case " ${PACKAGES[*]} " in *" $package "*) continue ;; esac
    if [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" != "install ok installed" ]; then
        echo "fetch-rocm: this machine lacks $package (a dependency); fetching it into the cache too"
        wanted+=("$package")
    fi
done

# apt-get download writes into the current folder; as root it warns that _apt cannot write there.
if ! (cd "$CACHE/debs" && apt-get download "${wanted[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed'); then
    :
fi
missing=()
for package in "${wanted[@]}"; do
    compgen -G "$CACHE/debs/${package}_*.deb" >/dev/null || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "fetch-rocm: could not download ${missing[*]} from the Debian archive (no network, or no bookworm"
    echo "fetch-rocm: sources in apt); the hiprtc compile check will SKIP. Try: apt-get update"
    exit 0
fi

for deb in "$CACHE"/debs/*.deb; do
    dpkg -x "$deb" "$CACHE/root" || { echo "fetch-rocm: dpkg -x $deb failed"; exit 0; }
done
libdir=$(dirname "$(find "$CACHE/root" -name 'libamdhip64.so.5' | head -1)")
if [ -z "$libdir" ] || [ ! -e "$libdir/libamdhip64.so.5" ]; then
    echo "fetch-rocm: the unpacked packages hold no libamdhip64.so.5; the hiprtc compile check will SKIP"
    exit 0
fi
ln -sfn libamdhip64.so.5 "$libdir/libamdhip64.so"
# Unpacked libraries have no RUNPATH to each other and LD_LIBRARY_PATH cannot change inside a
# running process: runtime-hip loads the libraries listed here first (by full path, retrying in
# passes until their dependencies are met), so that the runtime finds them by soname.
(cd "$libdir" && find . -maxdepth 1 -type f -name 'lib*.so.*' -printf '%f\n' | sort >memo-preload.txt)
ln -sfn "${libdir#"$CACHE"/}" "$CACHE/lib"
version=$(dpkg-deb -f "$CACHE"/debs/libamdhip64-5_*.deb Version)
echo "libamdhip64-5 $version" >"$CACHE/complete"
echo "fetch-rocm: unpacked ${wanted[*]} ($(du -sh "$CACHE/debs" | cut -f1) of packages) into $CACHE/root" \
    "in $(($(date +%s) - start)) s; HIP runtime at $CACHE/lib/libamdhip64.so ($version)"
