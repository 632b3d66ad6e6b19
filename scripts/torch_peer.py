#!/usr/bin/env python3
"""The PyTorch peer of `memo train`: the same GPT, trained the usual PyTorch ways.

Architecture, as memo's planner and runtimes define it (spec/cost-model.md section 3): a word
embedding; n pre-LN blocks (LayerNorm -> QKV with bias -> rotary positions on q and k ->
scaled_dot_product_attention(is_causal=True) -> projection with bias -> residual; LayerNorm ->
FC1 (4h, bias) -> GeLU -> FC2 (bias) -> residual); a final LayerNorm; the classifier tied to the
embedding; mean cross-entropy. Mixed precision as memo's: bf16 compute (autocast), fp32 master
weights and AdamW state (16 bytes per parameter in all, like memo's 2 + 2 + 12).

Modes (one process runs them in turn, printing one JSON line per mode as soon as it is done):
  store        every activation kept for the backward
  checkpoint   torch.utils.checkpoint (non-reentrant) around every block: only block inputs kept
  offload      checkpoint (reentrant, so that the block inputs are saved tensors) inside
               torch.autograd.graph.save_on_cpu(pin_memory=True): the block inputs (and the few
               other saved tensors) go to pinned host memory and come back for the backward

Each mode: `--warmup` steps, then up to `--steps` timed steps (fewer if `--budget-s` runs out,
at least one); tokens/s over the timed steps; peak memory is torch.cuda.max_memory_allocated over
the timed steps (null on the CPU). An out-of-memory error is reported as status "oom" and the next
mode still runs. Random tokens: the throughput does not depend on them.

    python3 scripts/torch_peer.py --device cuda --model examples/models/gpt-1b.toml --seq 16384
    python3 scripts/torch_peer.py --device cpu --layers 2 --hidden 64 --heads 4 --seq 64
"""

import argparse
import gc
import json
import math
import sys
import time


def read_model_toml(path):
    """The [model] table's integer keys of a memo model file (no tomllib before Python 3.11)."""
    values, table = {}, None
    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("["):
                table = line.strip("[]").strip()
                continue
            if table == "model" and "=" in line:
                key, value = (part.strip() for part in line.split("=", 1))
                try:
                    values[key] = int(value.strip('"'))
                except ValueError:
                    pass
    return values


def parse_args(argv):
    parser = argparse.ArgumentParser(description="PyTorch peer of memo train (store / checkpoint / offload)")
    parser.add_argument("--device", default="cuda", help="cuda or cpu")
    parser.add_argument("--model", help="a memo model TOML ([model] layers, hidden, heads, ffn_hidden, vocab)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn-hidden", type=int, default=None, help="default 4 x hidden")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq", type=int, required=True, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step")
    parser.add_argument("--modes", default="store,checkpoint,offload")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=60.0, help="per mode: stop timing steps after this")
    args = parser.parse_args(argv)
    if args.model:
        table = read_model_toml(args.model)
        for key in ("layers", "hidden", "heads", "vocab"):
            if key in table:
                setattr(args, key, table[key])
        if "ffn_hidden" in table:
            args.ffn_hidden = table["ffn_hidden"]
    if args.ffn_hidden is None:
        args.ffn_hidden = 4 * args.hidden
    if args.hidden % args.heads != 0:
        parser.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    for mode in args.modes.split(","):
        if mode not in ("store", "checkpoint", "offload"):
            parser.error(f"unknown mode {mode!r}: use store, checkpoint, offload")
    return args


def build(torch, args, device):
    nn = torch.nn
    functional = torch.nn.functional
    head_dim = args.hidden // args.heads

    def rotary(seq):
        inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inverse)
        return torch.cos(angles), torch.sin(angles)

    def rotate(x, cos, sin):
        # x: (batch, heads, seq, head_dim); pairs (even, odd) rotate by the position's angle.
        even, odd = x[..., 0::2], x[..., 1::2]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(args.hidden)
            self.qkv = nn.Linear(args.hidden, 3 * args.hidden)
            self.proj = nn.Linear(args.hidden, args.hidden)
            self.norm2 = nn.LayerNorm(args.hidden)
            self.fc1 = nn.Linear(args.hidden, args.ffn_hidden)
            self.fc2 = nn.Linear(args.ffn_hidden, args.hidden)

        def forward(self, x, cos, sin):
            batch, seq, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(args.hidden, dim=-1)
            shape = (batch, seq, args.heads, head_dim)
            q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            attention = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, args.hidden))
            return x + self.fc2(functional.gelu(self.fc1(self.norm2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(args.vocab, args.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm = nn.LayerNorm(args.hidden)
            for name, parameter in self.named_parameters():
                if name.endswith("weight") and parameter.dim() == 2:
                    std = 0.02 / math.sqrt(2 * args.layers) if ("proj" in name or "fc2" in name) else 0.02
                    nn.init.normal_(parameter, std=std)

        def forward(self, tokens, targets, mode):
            cos, sin = rotary(tokens.shape[1])
            x = self.embedding(tokens)
            for block in self.blocks:
                if mode == "store":
                    x = block(x, cos, sin)
                else:
                    # offload: the reentrant form keeps each block's input through
                    # save_for_backward, which save_on_cpu's hooks move to the host; the
                    # non-reentrant form would hold it on the device in its recompute closure.
                    x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, use_reentrant=mode == "offload")
            logits = self.norm(x) @ self.embedding.weight.t()
            return functional.cross_entropy(logits.float().reshape(-1, args.vocab), targets.reshape(-1))

    return Gpt().to(device)


def run_mode(torch, args, device, mode):
    """One mode's measurement as a dict (status ok, oom or error)."""
    result = {"peer": "torch", "mode": mode, "seq_len": args.seq, "micro_batch": args.batch,
              "layers": args.layers, "hidden": args.hidden, "device": str(device), "torch": torch.__version__}
    model = optimizer = None
    try:
        model = build(torch, args, device)
        result["parameters"] = sum(p.numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                      fused=device.type == "cuda")
        generator = torch.Generator(device="cpu").manual_seed(0)

        def step():
            tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                if mode == "offload":
                    with torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda"):
                        loss = model(inputs, targets, mode)
                else:
                    loss = model(inputs, targets, mode)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        def synchronize():
            if device.type == "cuda":
                torch.cuda.synchronize()

        for _ in range(args.warmup):
            step()
        synchronize()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times, loss = [], None
        started = time.perf_counter()
        while len(times) < max(args.steps, 1):
            begin = time.perf_counter()
            loss = step()
            synchronize()
            times.append(time.perf_counter() - begin)
            if time.perf_counter() - started > args.budget_s:
                break
        times.sort()
        median = times[len(times) // 2] if len(times) % 2 else (times[len(times) // 2 - 1] + times[len(times) // 2]) / 2
        result.update(status="ok", steps_timed=len(times), step_time_s=median,
                      tokens_per_s=args.batch * args.seq / median, loss=loss.item(),
                      peak_bytes=torch.cuda.max_memory_allocated() if device.type == "cuda" else None)
    except Exception as error:  # noqa: BLE001 - every failure becomes a reported status
        out_of_memory = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
        result["status"] = "oom" if isinstance(error, out_of_memory) or "out of memory" in str(error) else "error"
        result["error"] = " ".join(str(error).split())[:300]
    finally:
        del model, optimizer
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def main(argv):
    args = parse_args(argv)
    try:
        import torch  # noqa: PLC0415 - imported late so --help and bad arguments need no torch
        import torch.utils.checkpoint  # noqa: F401, PLC0415
    except ImportError as error:
        print(json.dumps({"peer": "torch", "status": "unavailable", "error": f"cannot import torch: {error}"}), flush=True)
        return 3
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"peer": "torch", "status": "unavailable", "error": "torch.cuda.is_available() is False"}),
              flush=True)
        return 3
    device = torch.device(args.device)
    for mode in args.modes.split(","):
        print(json.dumps(run_mode(torch, args, device, mode)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
