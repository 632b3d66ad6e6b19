#!/usr/bin/env python3
"""Device check of kernels/attention.cu on an NVIDIA GPU, independent of runtime-cuda.

Compiles attention.cu with NVRTC (as runtime-cuda does: memo_gpu.h as a named header, the options
of memo_kernels::compile_options), launches its kernels with the grids of kernels/src/attention.rs
through the driver API (ctypes), and compares out, lse, dq, dk, dv with a float64 PyTorch
reference of runtime-cpu's arithmetic (RoPE base 10000 on pairs (2i, 2i+1) inside the op, causal
within each sequence, scale 1/sqrt(D); gradients of the un-rotated q, k). Outputs are prefilled
with NaN, so an element a kernel fails to write shows up as non-finite.

    python3 kernels/attention_gpu_check.py                 # tensor, pipelined, scalar paths
    python3 kernels/attention_gpu_check.py --compile-only  # NVRTC only (no torch, no GPU)
    python3 kernels/attention_gpu_check.py --time          # also time s = 16384, 16 heads
                                                           # (tensor and pipelined paths)

The paths: "tensor" is the baseline tensor-core variant, "pipelined" the same with
-DMEMO_ATTN_PIPELINED=1 (memo_kernels::AttentionVariant::Pipelined), "scalar" the fp32 path
(-DMEMO_ATTN_SCALAR=1, what HIP runs).

Exit status 0 when every comparison is within bounds. Needs torch (for the reference and memory)
and libcuda; finds libnvrtc in torch's wheel, /usr/local/cuda, or MEMO_NVRTC (a file path).
"""
import ctypes
import glob
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HEAD_DIMS = [16, 32, 64, 128]
OWNER_ROWS, THREADS = 64, 128
# Path name -> the NVRTC options it adds.
PATHS = {"tensor": [], "pipelined": ["-DMEMO_ATTN_PIPELINED=1"], "scalar": ["-DMEMO_ATTN_SCALAR=1"]}


def find_nvrtc():
    candidates = [os.environ.get("MEMO_NVRTC", "")]
    try:
        import nvidia  # torch's CUDA wheels ship NVRTC (nvidia/cuda_nvrtc/lib or nvidia/cu13/lib)

        for base in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(base, "**", "libnvrtc.so*"), recursive=True))
    except ImportError:
        pass
    try:
        import torch

        candidates += sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libnvrtc*.so*")))
    except ImportError:
        pass
    candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"), reverse=True)
    candidates += glob.glob(os.path.join(HERE, "..", ".cache", "nvrtc", "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))
    candidates += ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    for path in candidates:
        if not path or "builtins" in path or "alt" in os.path.basename(path):
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError:
            continue
    sys.exit("libnvrtc not found: set MEMO_NVRTC to its path")


def compile_cubin(sm, path_name):
    nvrtc, path = find_nvrtc()
    src = open(os.path.join(HERE, "attention.cu"), "rb").read()
    header = open(os.path.join(HERE, "memo_gpu.h"), "rb").read()
    prog = ctypes.c_void_p()
    headers = (ctypes.c_char_p * 1)(header)
    names = (ctypes.c_char_p * 1)(b"memo_gpu.h")
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"attention.cu", 1, headers, names) == 0
    options = [f"--gpu-architecture=sm_{sm}", "-std=c++17", "-DMEMO_CUDA=1", "-Xptxas=-v"] + PATHS[path_name]
    array = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    rc = nvrtc.nvrtcCompileProgram(prog, len(options), array)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(f"NVRTC ({path}) failed with {rc}, options {options}:\n{log.value.decode()}")
    spills = [line for line in log.value.decode().splitlines() if "spill" in line and not line.strip().startswith("0 bytes")]
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    assert nvrtc.nvrtcGetCUBIN(prog, cubin) == 0
    print(f"compiled sm_{sm} {path_name} path with {path}: {size.value} bytes")
    return cubin.raw, log.value.decode()


class Driver:
    """The few driver API calls needed, on torch's primary context."""

    def __init__(self):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.check(self.cuda.cuInit(0), "cuInit")
        device, context = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        self.check(self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        self.check(self.cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # COMPUTE_CAPABILITY_MAJOR
        self.cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)
        self.sm = major.value * 10 + minor.value

    def check(self, rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            self.cuda.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")

    def load(self, cubin):
        module = ctypes.c_void_p()
        self.check(self.cuda.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        return module

    def launch(self, module, name, grid, params):
        function = ctypes.c_void_p()
        self.check(self.cuda.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), name)
        holders = []
        for kind, value in params:
            holders.append({"ptr": ctypes.c_uint64, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "f32": ctypes.c_float}[kind](value))
        pointers = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        rc = self.cuda.cuLaunchKernel(function, *grid, THREADS, 1, 1, 0, None, pointers, None)
        self.check(rc, f"cuLaunchKernel {name} grid {grid}")


def kernel_tail(s, heads, scale):
    """The scalar parameters after the pointers (kernels/src/attention.rs): s, heads, kv_heads,
    group, first_query (multi-head attention: heads, 1, 0), scale, RoPE's base 10000 as f64 bits."""
    theta_bits = struct.unpack("<Q", struct.pack("<d", 10000.0))[0]
    return [("u32", s), ("u32", heads), ("u32", heads), ("u32", 1), ("u32", 0), ("f32", scale), ("u64", theta_bits)]


def reference(torch, q, k, v, dout, b, s, heads, d):
    """runtime-cpu's attention in float64 (cos/sin rounded to f32 as the CPU does)."""

    def split(x):
        return x.double().view(b, s, heads, d).permute(0, 2, 1, 3).contiguous()

    device = q.device
    inv = 10000.0 ** (-2.0 * torch.arange(d // 2, dtype=torch.float64, device=device) / d)
    angle = torch.arange(s, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    cos, sin = torch.cos(angle).float().double(), torch.sin(angle).float().double()

    def rotate(x):
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)

    qf, kf, vf = (split(x).requires_grad_() for x in (q, k, v))
    scores = rotate(qf) @ rotate(kf).transpose(-1, -2) * (1.0 / math.sqrt(d))
    causal = torch.ones(s, s, dtype=torch.bool, device=device).triu(1)
    scores = scores.masked_fill(causal, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[..., None]) @ vf
    out.backward(split(dout))

    def join(x):
        return x.permute(0, 2, 1, 3).reshape(b * s, heads * d)

    return join(out.detach()), lse.detach().permute(0, 2, 1).reshape(b * s, heads), join(qf.grad), join(kf.grad), join(vf.grad)


def errors(torch, found, expected, absolute):
    """(largest error, relative to the largest expected value unless `absolute`; relative rms
    error; count of non-finite values found)."""
    found, expected = found.double(), expected.double()
    bad = int((~torch.isfinite(found)).sum())
    if bad:
        return float("inf"), float("inf"), bad
    worst = (found - expected).abs().max().item()
    if not absolute:
        worst /= max(expected.abs().max().item(), 1e-3)  # with one key, dq and dk are 0
    rms = math.sqrt(((found - expected) ** 2).sum().item() / max((expected**2).sum().item(), 1e-6))
    return worst, rms, 0


def run(driver, module, torch, b, s, heads, d, seed):
    """One shape: launches the three kernels and compares; returns True when within bounds."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    rows, width = b * s, heads * d

    def uniform(amplitude):
        return ((torch.rand(rows, width, generator=generator, device="cuda") * 2 - 1) * amplitude).bfloat16()

    q, k, v, dout = uniform(2.0), uniform(2.0), uniform(1.0), uniform(1.0)
    nan = float("nan")
    out = torch.full((rows, width), nan, dtype=torch.bfloat16, device="cuda")
    lse = torch.full((rows, heads), nan, dtype=torch.float32, device="cuda")
    dq, dk, dv = (torch.full((rows, width), nan, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    grid = ((s + OWNER_ROWS - 1) // OWNER_ROWS, heads, b)
    scale = 1.0 / math.sqrt(d)
    tail = kernel_tail(s, heads, scale)
    driver.launch(module, f"memo_attention_forward_d{d}", grid, [("ptr", x.data_ptr()) for x in (q, k, v, out, lse)] + tail)
    torch.cuda.synchronize()
    # The backward takes the kernel's own out and lse, as a training step would.
    pointers = [("ptr", x.data_ptr()) for x in (q, k, v, out, lse, dout, dq, dk, dv)]
    driver.launch(module, f"memo_attention_backward_dkdv_d{d}", grid, pointers + tail)
    driver.launch(module, f"memo_attention_backward_dq_d{d}", grid, pointers + tail)
    torch.cuda.synchronize()
    ref = reference(torch, q, k, v, dout, b, s, heads, d)
    ok = True
    line = f"  b={b} s={s} heads={heads} d={d}:"
    for name, found, expected, bound in zip(
        ["out", "lse", "dq", "dk", "dv"], [out, lse, dq, dk, dv], ref, [(3e-2, 1e-2), (3e-2, 1e-2), (6e-2, 2e-2), (6e-2, 2e-2), (6e-2, 2e-2)]
    ):
        worst, rms, bad = errors(torch, found, expected, absolute=name == "lse")
        line += f" {name} max {worst:.1e} rms {rms:.1e}" + (f" ({bad} non-finite)" if bad else "")
        ok &= worst < bound[0] and rms < bound[1]
    print(line + ("" if ok else "   <-- FAIL"))
    return ok


def timing(driver, module, torch, d):
    b, s, heads = 1, 16384, 16
    rows, width = b * s, heads * d
    q, k, v, dout = (torch.randn(rows, width, device="cuda").bfloat16() for _ in range(4))
    out = torch.empty_like(q)
    lse = torch.empty(rows, heads, device="cuda")
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    grid = ((s + OWNER_ROWS - 1) // OWNER_ROWS, heads, b)
    tail = kernel_tail(s, heads, 1.0 / math.sqrt(d))
    pointers = [("ptr", x.data_ptr()) for x in (q, k, v, out, lse, dout, dq, dk, dv)]
    fwd = lambda: driver.launch(module, f"memo_attention_forward_d{d}", grid, pointers[:5] + tail)
    bwd = lambda: (
        driver.launch(module, f"memo_attention_backward_dkdv_d{d}", grid, pointers + tail),
        driver.launch(module, f"memo_attention_backward_dq_d{d}", grid, pointers + tail),
    )
    flops = 2 * 2 * b * heads * d * s * s / 2  # causal: half of QK^T and PV
    for name, fn, factor in [("forward", fwd, 1.0), ("backward", bwd, 2.5)]:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / 5
        print(f"  d={d} s={s} heads={heads} {name}: {ms:.2f} ms, {factor * flops / ms / 1e9:.0f} TFLOP/s")


def main():
    args = sys.argv[1:]
    if "--compile-only" in args:
        for sm in (80, 90):
            for path_name in PATHS:
                compile_cubin(sm, path_name)
        return 0
    import torch

    torch.cuda.init()
    driver = Driver()
    shapes = [(3, 1, 2), (2, 65, 2), (1, 100, 3), (2, 128, 1), (1, 1000, 2), (2, 2048, 2)]
    all_ok = True
    for path_name in PATHS:
        cubin, _ = compile_cubin(driver.sm, path_name)
        module = driver.load(cubin)
        print(f"{path_name} path:")
        path_ok = True
        for d in HEAD_DIMS:
            for index, (b, s, heads) in enumerate(shapes):
                path_ok &= run(driver, module, torch, b, s, heads, d, seed=1000 * d + index)
        all_ok &= path_ok
        # A path that computes wrong values is not timed: its time would mean nothing.
        if "--time" in args and path_name != "scalar" and path_ok:
            for d in (64, 128):
                timing(driver, module, torch, d)
    print("ALL OK" if all_ok else "SOME CHECKS FAILED")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
