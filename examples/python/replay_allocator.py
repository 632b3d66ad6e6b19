#!/usr/bin/env python3
"""Train a small GPT three ways and compare GPU memory and step time.

  1. PyTorch's caching allocator (the default);
  2. the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
  3. memo's record/replay allocator (libmemo_capi.so, loaded through
     torch.cuda.memory.CUDAPluggableAllocator): record a few iterations, place the last one's
     requests in one arena with memo's planner, then replay the planned addresses.

Usage, on a machine with an NVIDIA GPU and PyTorch built with CUDA (from the repository root):

    cargo build --release -p memo-capi
    python3 examples/python/replay_allocator.py --lib target/release/libmemo_capi.so

    model/run options (defaults in brackets): --layers [6] --hidden [768] --heads [12]
    --seq [2048] --batch [8] --vocab [50257] --warmup [2] --record [2] --steps [20]
    --trace-dir DIR (memo mode writes each recorded iteration's trace there) --json FILE
    --no-blocks (memo mode: plan the iteration flat instead of marking each layer's forward as a
    block with memo_block_begin/memo_block_end, which makes the plan bi-level)

It prints, per allocator: peak reserved (bytes taken from the device by the allocator), peak
allocated (bytes of live tensors), their ratio (1.0 = no fragmentation), the device memory the
driver saw in use, and the median step time; for memo also the planned arena, its lower bound,
and how many requests were replayed, fell back, or were unplanned (tensors that outlive an
iteration come from cudaMalloc).

Each allocator runs in its own fresh process: the driver re-runs this script with --mode. That is
required, not a convenience: PyTorch reads PYTORCH_CUDA_ALLOC_CONF when CUDA initialises, and a
CUDAPluggableAllocator can only be installed before the first CUDA allocation (before CUDA is
initialised at all), so one process cannot try two allocators.

Without a GPU (no torch needed), check the ctypes bindings and one record/plan/replay cycle on the
library's host backend:

    python3 examples/python/replay_allocator.py --host-selftest --lib target/debug/libmemo_capi.so

Notes: memo's "allocated" counts requested bytes, PyTorch's counts blocks rounded to 512 bytes.
Training keeps gradients allocated (zero_grad(set_to_none=False)) and lets no tensor outlive a
step, so that every iteration makes the same requests: the plan covers them all.
"""

import argparse
import ctypes
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time

MODES = ("default", "expandable", "memo")
LABELS = {
    "default": "caching allocator (default)",
    "expandable": "caching, expandable_segments",
    "memo": "memo record/replay",
}
MEMO_NO_CAPACITY = 2**64 - 1
MEMO_BACKEND_HOST = 1
MEMO_MODE_REPLAY = 2


# ---------------------------------------------------------------------------------------------
# ctypes bindings of memo.h (the parts used here)


class MemoPlaceOptions(ctypes.Structure):
    _fields_ = [("capacity", ctypes.c_uint64), ("alignment", ctypes.c_uint64), ("budget_nodes", ctypes.c_uint64)]


class MemoPlacementSummary(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("buffers", "steps", "peak", "lower_bound", "greedy_peak", "nodes")] + [
        ("optimal", ctypes.c_uint32),
        ("budget_exhausted", ctypes.c_uint32),
    ]


STATS_U64 = (
    "iterations recorded_iterations requests replayed replayed_bytes unplanned unplanned_bytes fallbacks "
    "fallback_bytes fallback_size_mismatch fallback_beyond_plan fallback_overlap fallback_other_device "
    "unknown_frees device_errors arena_bytes plan_peak plan_lower_bound device_bytes_live device_bytes_peak "
    "requested_bytes_live requested_bytes_peak"
).split()


class MemoAllocatorStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in STATS_U64] + [
        ("mode", ctypes.c_uint32),
        ("arena_device", ctypes.c_int32),
        ("plan_ready", ctypes.c_uint32),
        ("plan_optimal", ctypes.c_uint32),
        ("plan_block_instances", ctypes.c_uint64),
        ("plan_level1_problems", ctypes.c_uint64),
    ]

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_}


class Memo:
    """The library, loaded with ctypes. A process that also loads it through PyTorch's
    CUDAPluggableAllocator with the same path shares one copy (and one allocator)."""

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(os.path.abspath(path))
        status = ctypes.c_int32
        lib.memo_last_error.restype = ctypes.c_char_p
        lib.memo_status_name.restype = ctypes.c_char_p
        lib.memo_status_name.argtypes = [ctypes.c_int32]
        lib.memo_alloc.restype = ctypes.c_void_p
        lib.memo_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.memo_free.restype = None
        lib.memo_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        for name, args in {
            "memo_iteration_end": [],
            "memo_block_begin": [ctypes.c_int64],
            "memo_block_end": [],
            "memo_allocator_select_backend": [ctypes.c_uint32],
            "memo_allocator_record": [ctypes.c_char_p],
            "memo_allocator_plan": [ctypes.POINTER(MemoPlaceOptions)],
            "memo_allocator_replay": [ctypes.c_int],
            "memo_allocator_stats": [ctypes.POINTER(MemoAllocatorStats)],
            "memo_allocator_reset_stats": [],
            "memo_allocator_release_arena": [],
            "memo_trace_parse": [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)],
            "memo_trace_free": [ctypes.c_void_p],
            "memo_place": [ctypes.c_void_p, ctypes.POINTER(MemoPlaceOptions), ctypes.POINTER(ctypes.c_void_p)],
            "memo_placement_summary": [ctypes.c_void_p, ctypes.POINTER(MemoPlacementSummary)],
            "memo_placement_free": [ctypes.c_void_p],
        }.items():
            function = getattr(lib, name)
            function.restype = status
            function.argtypes = args

    def check(self, status, what):
        if status != 0:
            name = self.lib.memo_status_name(status).decode()
            raise RuntimeError(f"{what}: {name}: {self.lib.memo_last_error().decode()}")

    def call(self, name, *args):
        self.check(getattr(self.lib, name)(*args), name)

    def stats(self):
        stats = MemoAllocatorStats()
        self.call("memo_allocator_stats", ctypes.byref(stats))
        return stats.as_dict()

    def place_text(self, text):
        trace = ctypes.c_void_p()
        self.call("memo_trace_parse", text, len(text), ctypes.byref(trace))
        placement = ctypes.c_void_p()
        try:
            self.call("memo_place", trace, None, ctypes.byref(placement))
            summary = MemoPlacementSummary()
            self.call("memo_placement_summary", placement, ctypes.byref(summary))
            return {name: getattr(summary, name) for name, _ in summary._fields_}
        finally:
            self.lib.memo_placement_free(placement)
            self.lib.memo_trace_free(trace)


# ---------------------------------------------------------------------------------------------
# The small GPT (pre-LN, GeLU MLP, causal attention), defined inside the worker (torch imported
# only there)


def build_model(torch, args, memo=None):
    """The GPT. With `memo`, each block's forward is marked as one instance of block 0, so that
    memo plans the recorded iteration bi-level (each block's own tensors placed once)."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h = args.hidden
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            if memo is None:
                return self.block(x)
            memo.call("memo_block_begin", 0)
            try:
                return self.block(x)
            finally:
                memo.call("memo_block_end")

        def block(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
            q, k, v = (t.view(b, s, args.heads, h // args.heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(args.vocab, args.hidden)
            self.positions = nn.Embedding(args.seq, args.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.ln = nn.LayerNorm(args.hidden)
            self.head = nn.Linear(args.hidden, args.vocab, bias=False)

        def forward(self, idx):
            x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return GPT()


def worker(args):
    """One allocator, one process. Prints one line `RESULT <json>` at the end."""
    memo = None
    if args.mode == "memo":
        memo = Memo(args.lib)
        import torch

        # Before anything else touches CUDA: the allocator cannot change after initialisation.
        allocator = torch.cuda.memory.CUDAPluggableAllocator(os.path.abspath(args.lib), "memo_alloc", "memo_free")
        torch.cuda.memory.change_current_allocator(allocator)
    else:
        import torch
    F = torch.nn.functional
    device = torch.device("cuda")
    free, total = torch.cuda.mem_get_info()
    baseline_used = total - free

    torch.manual_seed(0)
    model = build_model(torch, args, memo if args.blocks else None).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    del tokens

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(inputs)
            loss = F.cross_entropy(logits.view(-1, args.vocab).float(), targets.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        value = loss.item()
        del logits, loss
        torch.cuda.synchronize()
        if memo is not None:
            memo.call("memo_iteration_end")
        return value

    # Warm-up: the first steps allocate what lives for the whole run (gradients, optimizer state,
    # library workspaces); memo passes them through to cudaMalloc.
    for _ in range(args.warmup):
        step()
    if memo is not None:
        trace_dir = args.trace_dir.encode() if args.trace_dir else None
        memo.call("memo_allocator_record", trace_dir)
        for _ in range(args.record):
            step()
        started = time.perf_counter()
        memo.call("memo_allocator_plan", None)
        plan_seconds = time.perf_counter() - started
        memo.call("memo_allocator_replay", torch.cuda.current_device())
        memo.call("memo_allocator_reset_stats")
    else:
        torch.cuda.reset_peak_memory_stats()

    times, losses, peak_used = [], [], 0
    for _ in range(args.steps):
        started = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - started)
        free, total = torch.cuda.mem_get_info()
        peak_used = max(peak_used, total - free - baseline_used)

    result = {"mode": args.mode, "median_step_ms": 1000 * statistics.median(times), "losses": losses, "device_used": peak_used}
    if memo is not None:
        stats = memo.stats()
        result.update(reserved=stats["device_bytes_peak"], allocated=stats["requested_bytes_peak"], memo=stats, plan_seconds=plan_seconds)
    else:
        result.update(reserved=torch.cuda.max_memory_reserved(), allocated=torch.cuda.max_memory_allocated())
    print("RESULT " + json.dumps(result), flush=True)


def refuse(message):
    """One line on standard error and exit status 2: what is missing and what to do instead."""
    print(f"replay_allocator.py: {message}", file=sys.stderr)
    return 2


def missing_for_the_comparison():
    """Why the GPU comparison cannot run here (None when it can): PyTorch with CUDA and a GPU."""
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed"
    import torch

    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA GPU"
    return None


def driver(args):
    """Runs each allocator in a fresh process and prints the comparison."""
    missing = missing_for_the_comparison()
    if missing:
        return refuse(f"{missing}: the comparison needs PyTorch with CUDA and an NVIDIA GPU (without them, --host-selftest checks the bindings)")
    results = []
    for mode in MODES:
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if mode == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        command = [sys.executable, os.path.abspath(__file__), "--mode", mode] + forwarded(args)
        print(f"== {LABELS[mode]}: {' '.join(command)}", flush=True)
        run = subprocess.run(command, env=env, capture_output=True, text=True)
        lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
        if run.returncode != 0 or not lines:
            print(f"   failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}", flush=True)
            continue
        results.append(json.loads(lines[-1][len("RESULT "):]))
    if results:
        print_table(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"config": vars(args), "results": results}, out, indent=2)
    return 0 if len(results) == len(MODES) else 1


def forwarded(args):
    flags = []
    for name in ("lib", "layers", "hidden", "heads", "seq", "batch", "vocab", "warmup", "record", "steps", "trace_dir"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    if not args.blocks:
        flags.append("--no-blocks")
    return flags


def gib(n):
    return f"{n / 2**30:8.3f} GiB"


def print_table(results):
    print()
    print(f"{'allocator':32} {'peak reserved':>14} {'peak allocated':>15} {'ratio':>6} {'device used':>13} {'step (median)':>14}")
    for r in results:
        ratio = r["reserved"] / r["allocated"] if r["allocated"] else float("nan")
        print(f"{LABELS[r['mode']]:32} {gib(r['reserved']):>14} {gib(r['allocated']):>15} {ratio:6.3f} {gib(r['device_used']):>13} {r['median_step_ms']:11.1f} ms")
    for r in results:
        if r["mode"] == "memo":
            m = r["memo"]
            print(
                f"\nmemo: arena {gib(m['arena_bytes']).strip()} (lower bound {gib(m['plan_lower_bound']).strip()}, "
                f"{'proven optimal' if m['plan_optimal'] else 'not proven optimal'}, planned in {r['plan_seconds']:.2f} s, "
                f"{m['plan_block_instances']} blocks bi-level over {m['plan_level1_problems']} level-1 problems); "
                f"over {m['iterations']} steps: {m['replayed']} requests replayed, {m['fallbacks']} fell back "
                f"(size {m['fallback_size_mismatch']}, past the plan {m['fallback_beyond_plan']}, overlap {m['fallback_overlap']}, "
                f"other device {m['fallback_other_device']}), {m['unplanned']} unplanned, {m['device_errors']} device errors"
            )
    losses = {r["mode"]: r["losses"][-1] for r in results}
    print("last losses:", ", ".join(f"{mode} {loss:.4f}" for mode, loss in losses.items()))


# ---------------------------------------------------------------------------------------------
# Host self-test: no GPU, no torch


def header_struct_fields(header_path, struct):
    text = open(header_path).read()
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (struct, struct), text, re.S).group(1)
    return [line.split()[-1].rstrip(";") for line in body.splitlines() if line.strip() and not line.strip().startswith("//")]


def host_selftest(args):
    memo = Memo(args.lib)
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "memo-capi", "include", "memo.h")
    for struct in (MemoAllocatorStats, MemoPlacementSummary, MemoPlaceOptions):
        fields = [name for name, _ in struct._fields_]
        assert fields == header_struct_fields(header, struct.__name__), f"{struct.__name__} differs from memo.h"
    assert ctypes.sizeof(MemoAllocatorStats) == 24 * 8 + 4 * 4

    layer = open(os.path.join(os.path.dirname(header), "..", "..", "examples", "traces", "memo-layer.trace"), "rb").read()
    summary = memo.place_text(layer)
    assert (summary["peak"], summary["lower_bound"], summary["optimal"]) == (2432000000, 2432000000, 1), summary

    memo.call("memo_allocator_select_backend", MEMO_BACKEND_HOST)
    sizes = [4096, 1000, 8192, 300]

    def iteration(sizes):
        pointers = [memo.lib.memo_alloc(size, 0, None) for size in sizes]
        assert all(pointers), memo.lib.memo_last_error()
        for pointer, size in reversed(list(zip(pointers, sizes))):
            memo.lib.memo_free(pointer, size, 0, None)
        memo.call("memo_iteration_end")
        return pointers

    memo.call("memo_allocator_record", None)
    memo.call("memo_block_begin", 3)
    iteration(sizes)  # ends the iteration, which closes the block
    memo.call("memo_allocator_plan", None)
    assert (memo.stats()["plan_block_instances"], memo.stats()["plan_level1_problems"]) == (1, 1)
    memo.call("memo_allocator_replay", 0)
    memo.call("memo_allocator_reset_stats")
    first, second = iteration(sizes), iteration(sizes)
    assert first == second, "replay gives the same addresses every iteration"
    iteration([4096, 1000, 8000, 300])
    stats = memo.stats()
    assert stats["mode"] == MEMO_MODE_REPLAY
    assert (stats["replayed"], stats["fallbacks"], stats["fallback_size_mismatch"]) == (11, 1, 1), stats
    assert (stats["arena_bytes"], stats["plan_lower_bound"], stats["requested_bytes_live"]) == (13824, 13824, 0), stats
    memo.call("memo_allocator_release_arena")
    print(f"host selftest ok: memo-layer peak {summary['peak'] // 10**6} MB; replayed {stats['replayed']}, fell back {stats['fallbacks']}, arena {stats['arena_bytes']} bytes")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="path of libmemo_capi.so")
    parser.add_argument("--mode", choices=MODES, help="run one allocator in this process (the driver sets this)")
    parser.add_argument("--host-selftest", action="store_true", help="check the bindings on the host backend; no GPU or torch")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--warmup", type=int, default=2, help="steps before measuring (memo records after these)")
    parser.add_argument("--record", type=int, default=2, help="memo: iterations recorded; the last is planned")
    parser.add_argument("--steps", type=int, default=20, help="measured steps")
    parser.add_argument("--trace-dir", help="memo: write each recorded iteration's trace here")
    parser.add_argument("--no-blocks", dest="blocks", action="store_false", help="memo: do not mark each layer's forward as a block (plan the iteration flat)")
    parser.add_argument("--json", help="driver: write all results to this file")
    args = parser.parse_args()
    if not os.path.isfile(args.lib):
        return refuse(f"no library at {args.lib}: build it with `cargo build --release -p memo-capi` (or pass its path with --lib)")
    if args.host_selftest:
        return host_selftest(args)
    if args.mode:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
