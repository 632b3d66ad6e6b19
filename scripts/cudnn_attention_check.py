#!/usr/bin/env python3
"""The CUDA backend's attention (cuDNN path, and whatever else ran) against a float64 PyTorch
reference, from the arguments runtime-cuda's GPU test wrote with MEMO_ATTENTION_DUMP=DIR
(runtime-cuda/tests/gpu.rs, attention_matches_the_cpu_reference_under_every_choice).

    python3 scripts/cudnn_attention_check.py DIR [--frontend-log FILE]

For each launch in DIR/cases.txt: the reference is causal attention of RoPE(q), RoPE(k), v
(base 10000, pairs (2i, 2i+1), scale 1/sqrt(d)) in float64, its natural-log LSE, and, for the
backward, autograd's gradients with respect to q, k, v for the launch's dout. Bounds as
spec/backends.md states them: out within 2e-2 relative + 1e-3 of the largest, lse 1e-3 + 2^-8,
gradients 5e-2 + 5e-3. Prints one line per launch and tensor (max error, the bound's worst
margin); exit 1 when any is out of bounds.

--frontend-log FILE: first runs one PyTorch SDPA call (bf16, causal, head dim 128, 1K tokens,
forward and backward) with cuDNN's frontend logging to FILE (CUDNN_FRONTEND_LOG_INFO=1), the
graph PyTorch's own cuDNN attention builds, to compare with runtime-cuda's golden recordings.
"""
import argparse
import os
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--frontend-log")
    args = parser.parse_args()
    if args.frontend_log:
        os.environ["CUDNN_FRONTEND_LOG_INFO"] = "1"
        os.environ["CUDNN_FRONTEND_LOG_FILE"] = args.frontend_log
    import numpy as np
    import torch

    if args.frontend_log and torch.cuda.is_available():
        try:
            print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
            from torch.nn.attention import SDPBackend, sdpa_kernel

            q = torch.randn(1, 16, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
                out.sum().backward()
            torch.cuda.synchronize()
            print(f"PyTorch cuDNN SDPA ran; frontend log in {args.frontend_log}")
        except Exception as error:  # the log is a help, not a check
            print(f"PyTorch cuDNN SDPA did not run: {error}")

    def bf16(path, shape):
        bits = np.fromfile(path, dtype=np.uint16).astype(np.uint32) << 16
        return torch.from_numpy(bits.view(np.float32).astype(np.float64)).reshape(shape)

    def f32(path, shape):
        return torch.from_numpy(np.fromfile(path, dtype=np.float32).astype(np.float64)).reshape(shape)

    def rope(x, seq_len):  # x: (rows, heads, d)
        rows, _, d = x.shape
        pos = (torch.arange(rows, dtype=torch.float64) % seq_len)[:, None]
        inv = 10000.0 ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
        angle = pos * inv[None, :]
        c, s = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    def attention(q, k, v, seq_len):  # (rows, heads, d) each, rows = sequences * seq_len
        rows, heads, d = q.shape
        seqs = rows // seq_len
        shape = (seqs, seq_len, heads, d)
        qr, kr = rope(q, seq_len).reshape(shape), rope(k, seq_len).reshape(shape)
        vr = v.reshape(shape)
        scores = torch.einsum("bihd,bjhd->bhij", qr, kr) / d**0.5
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # (b, h, i)
        out = torch.einsum("bhij,bjhd->bihd", torch.softmax(scores, dim=-1), vr)
        return out.reshape(rows, heads, d), lse.permute(0, 2, 1).reshape(rows, heads)

    def verdict(name, got, want, relative, of_max):
        largest = want.abs().max().item()
        bound = relative * want.abs() + of_max * largest + 1e-6
        error = (got - want).abs()
        worst = (error / bound).max().item()
        ok = bool(torch.isfinite(got).all()) and worst <= 1.0
        print(f"  {name}: max |error| {error.max().item():.3e} (largest {largest:.3f}), "
              f"{worst:.2f} of the bound{'' if ok else '  OUT OF BOUNDS'}")
        return ok

    cases = os.path.join(args.dir, "cases.txt")
    if not os.path.exists(cases):
        print(f"no {cases}: the GPU test did not dump (MEMO_ATTENTION_DUMP) or did not run")
        return 1
    failures = 0
    for line in open(cases):
        stem, op, rows, row_bytes, heads, seq_len = line.split()
        rows, row_bytes, heads, seq_len = int(rows), int(row_bytes), int(heads), int(seq_len)
        d = row_bytes // 2 // heads
        shape = (rows, heads, d)
        path = lambda name: os.path.join(args.dir, f"{stem}-{name}.bin")
        print(f"{stem}: {rows} rows, {heads} heads of {d}, {seq_len} tokens per sequence")
        q, k, v = bf16(path("q"), shape), bf16(path("k"), shape), bf16(path("v"), shape)
        if op == "attention":
            out, lse = attention(q, k, v, seq_len)
            failures += not verdict("out", bf16(path("out"), shape), out, 2e-2, 1e-3)
            failures += not verdict("lse", f32(path("lse"), (rows, heads)), lse, 1e-3, 2.0**-8)
        else:
            q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
            out, _ = attention(q, k, v, seq_len)
            out.backward(bf16(path("dout"), shape))
            for name, want in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
                failures += not verdict(name, bf16(path(name), shape), want, 5e-2, 5e-3)
    print(f"cudnn_attention_check: {failures} tensors out of bounds")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
