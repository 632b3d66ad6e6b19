#!/usr/bin/env python3
"""Compare memo's first training step of a Llama-shaped model with PyTorch's.

memo's CPU backend trains `tiny-llama` (2 layers, hidden 64, 4 query heads, 2 K/V heads, SwiGLU of
width 176, RMSNorm, no biases, untied classifier, vocabulary 256) in bf16 storage with f32
accumulation. `runtime-cpu/examples/first_step_dump.rs` writes its initial parameters, the tokens
and next-token targets of its first step, the step's loss and every gradient. This script loads
the same parameters into Hugging Face `transformers.LlamaForCausalLM` in float64 (or, where
`transformers` is not installed but torch is, into the compact float64 implementation of the same
architecture below), runs the forward and backward on the same tokens, and compares the loss and
every gradient.

Usage (from the repository root):

    python3 examples/python/llama_step_compare.py --run            # dumps with cargo, then compares
    python3 examples/python/llama_step_compare.py DUMP_DIR         # compares an existing dump
        [--model tiny-llama] [--seq 32] [--seed 11]  (for --run)
        [--impl auto|hf|torch] [--tolerance X]

Exit status: 0 when the loss and every gradient are within the tolerance, 1 when one is not, 2 on
a usage or dump error; 0 with one line `SKIP: <reason>` when torch is not installed.

Conventions (checked against memo's kernels, runtime-cpu/src/ops):
  - every weight is `out_features x in_features`, like torch.nn.Linear.weight;
  - `w1` (SwiGLU) is the gate's f rows followed by the up projection's f rows (one product whose
    output row is [gate | up]); `w2` is the down projection (h x f);
  - `embedding` is embed_tokens, the untied `classifier` is lm_head (both V x h);
  - norm1/norm2/final norm scales are input_layernorm/post_attention_layernorm/norm;
  - query head i attends with K/V head i // (heads / kv_heads), as transformers' repeat_kv;
  - scores are scaled by 1/sqrt(head_dim); the loss is the mean cross-entropy over the tokens, and
    the gradients are those of that mean;
  - RoPE: memo turns interleaved pairs (2i, 2i+1) of each head by pos * theta^(-2i/d) (Meta's
    convention); transformers turns pairs (i, i + d/2) (rotate_half). The two agree when each
    head's rows of q_proj and k_proj are permuted: transformers' row j < d/2 is memo's row 2j, row
    j >= d/2 is memo's row 2(j - d/2) + 1 (the attention scores are unchanged, since q and k are
    permuted alike). The gradients are permuted back before the comparison.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

# The tolerance. memo's step stores every activation, every gradient and every weight in bf16
# (8 significant bits: unit roundoff u = 2^-8 relative, half an ulp, taking the unit of the
# project's tensor-parallel bound) and accumulates every sum in f32 (2^-24: negligible). The
# reference here is float64 (transformers' RMSNorm and rotary tables pass through float32: still
# 2^-24, negligible). The bf16 weights are loaded exactly, so the whole difference is the
# roundings of memo's step: each stored tensor on the path from the loss to a gradient carries a
# relative error up to u, and the errors are independent, so they add in quadrature through the
# about a dozen roundings of a backward pass through two layers; the rounding of the gradient
# itself alone gives a relative L2 of about u/sqrt(3). A relative L2 within 4u = 2^-6 per
# gradient tensor (the bound `spec/tensor-parallel.md` section 7 uses between two bf16 steps),
# times a safety factor of 2 for the chains of roundings, gives 2^-5; the loss, one f32 sum of
# per-token f32 log-sum-exps of bf16 logits, is held to 4u = 2^-6.
UNIT_ROUNDOFF = 2.0**-8
GRADIENT_TOLERANCE = 8 * UNIT_ROUNDOFF
LOSS_TOLERANCE = 4 * UNIT_ROUNDOFF

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump", nargs="?", help="directory written by the first_step_dump example")
    p.add_argument("--run", action="store_true", help="run the example with cargo first (into DUMP or a temporary dir)")
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--impl", choices=("auto", "hf", "torch"), default="auto",
                   help="hf: transformers.LlamaForCausalLM; torch: the compact implementation; auto: hf if installed")
    p.add_argument("--tolerance", type=float, default=GRADIENT_TOLERANCE,
                   help=f"relative L2 bound per gradient (default 2^-5 = {GRADIENT_TOLERANCE})")
    args = p.parse_args(argv)
    if not args.run and not args.dump:
        p.error("give a dump directory, or --run")
    return args


def run_dump(args, out):
    cmd = ["cargo", "run", "--release", "-q", "-p", "runtime-cpu", "--example", "first_step_dump", "--",
           "--model", args.model, "--seq", str(args.seq), "--seed", str(args.seed), "--out", out]
    print("running:", " ".join(cmd), flush=True)
    try:
        done = subprocess.run(cmd, cwd=REPO)
    except FileNotFoundError:
        fail("cargo not found: build and run the first_step_dump example by hand and pass its directory")
    if done.returncode != 0:
        fail(f"the first_step_dump example failed (exit {done.returncode})")


def fail(message, code=2):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def read_bf16(torch, path, rows, cols):
    """A raw little-endian bf16 file as a float64 tensor (exact: bf16 -> f32 is a shift)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != 2 * rows * cols:
        fail(f"{path}: {len(data)} bytes, not {rows} x {cols} bf16")
    bits = torch.frombuffer(bytearray(data), dtype=torch.int16).to(torch.int32)
    if sys.byteorder != "little":
        bits = ((bits & 0xFF) << 8) | ((bits >> 8) & 0xFF)
    f32 = ((bits & 0xFFFF) << 16).view(torch.float32)
    return f32.to(torch.float64).reshape(rows, cols)


def read_u32(torch, path):
    with open(path, "rb") as f:
        data = f.read()
    values = [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]
    return torch.tensor(values, dtype=torch.long)


def rope_permutation(head_dim):
    """perm[j] = memo's row (within a head) that is transformers' row j."""
    half = head_dim // 2
    return [2 * j if j < half else 2 * (j - half) + 1 for j in range(head_dim)]


def rows_to_hf(torch, w, heads, head_dim):
    perm = torch.tensor(rope_permutation(head_dim))
    return w.reshape(heads, head_dim, -1)[:, perm, :].reshape(heads * head_dim, -1)


def rows_from_hf(torch, w, heads, head_dim):
    perm = torch.tensor(rope_permutation(head_dim))
    out = torch.empty_like(w.reshape(heads, head_dim, -1))
    out[:, perm, :] = w.reshape(heads, head_dim, -1)
    return out.reshape(heads * head_dim, -1)


def to_hf(torch, cfg, tensors):
    """memo's tensors {(role, layer): float64} as a LlamaForCausalLM state dict, and back."""
    d = cfg["hidden"] // cfg["heads"]
    f = cfg["ffn_hidden"]
    sd = {
        "model.embed_tokens.weight": tensors[("embedding", None)],
        "model.norm.weight": tensors[("final_norm_scale", None)].reshape(-1),
        "lm_head.weight": tensors[("classifier", None)],
    }
    for l in range(cfg["layers"]):
        p = f"model.layers.{l}."
        w1 = tensors[("w1", l)]
        sd.update({
            p + "input_layernorm.weight": tensors[("norm1_scale", l)].reshape(-1),
            p + "self_attn.q_proj.weight": rows_to_hf(torch, tensors[("wq", l)], cfg["heads"], d),
            p + "self_attn.k_proj.weight": rows_to_hf(torch, tensors[("wk", l)], cfg["kv_heads"], d),
            p + "self_attn.v_proj.weight": tensors[("wv", l)],
            p + "self_attn.o_proj.weight": tensors[("wo", l)],
            p + "post_attention_layernorm.weight": tensors[("norm2_scale", l)].reshape(-1),
            p + "mlp.gate_proj.weight": w1[:f],
            p + "mlp.up_proj.weight": w1[f:],
            p + "mlp.down_proj.weight": tensors[("w2", l)],
        })
    return sd


def from_hf(torch, cfg, grads):
    """Gradients keyed by the state dict's names, as memo's {(role, layer): tensor}."""
    d = cfg["hidden"] // cfg["heads"]
    out = {
        ("embedding", None): grads["model.embed_tokens.weight"],
        ("final_norm_scale", None): grads["model.norm.weight"].reshape(1, -1),
        ("classifier", None): grads["lm_head.weight"],
    }
    for l in range(cfg["layers"]):
        p = f"model.layers.{l}."
        out.update({
            ("norm1_scale", l): grads[p + "input_layernorm.weight"].reshape(1, -1),
            ("wq", l): rows_from_hf(torch, grads[p + "self_attn.q_proj.weight"], cfg["heads"], d),
            ("wk", l): rows_from_hf(torch, grads[p + "self_attn.k_proj.weight"], cfg["kv_heads"], d),
            ("wv", l): grads[p + "self_attn.v_proj.weight"],
            ("wo", l): grads[p + "self_attn.o_proj.weight"],
            ("norm2_scale", l): grads[p + "post_attention_layernorm.weight"].reshape(1, -1),
            ("w1", l): torch.cat([grads[p + "mlp.gate_proj.weight"], grads[p + "mlp.up_proj.weight"]]),
            ("w2", l): grads[p + "mlp.down_proj.weight"],
        })
    return out


def hf_model(torch, transformers, cfg):
    """transformers.LlamaForCausalLM for the dump's configuration, in float64."""
    common = dict(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn_hidden"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv_heads"], hidden_act="silu",
        max_position_embeddings=max(cfg["seq_len"], 2048), rms_norm_eps=cfg["norm_eps"],
        attention_bias=False, mlp_bias=False, tie_word_embeddings=False, attention_dropout=0.0,
    )
    try:  # transformers 5: rope_parameters; 4.x: rope_theta
        config = transformers.LlamaConfig(
            **common, rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]})
    except (TypeError, ValueError):
        config = transformers.LlamaConfig(**common, rope_theta=cfg["rope_theta"])
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).to(torch.float64)
    # The configuration took: the rotary frequencies are theta^(-2i/d).
    d = cfg["hidden"] // cfg["heads"]
    expected = torch.tensor([cfg["rope_theta"] ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float64)
    inv_freq = model.model.rotary_emb.inv_freq.to(torch.float64)
    if inv_freq.shape != expected.shape or not torch.allclose(inv_freq, expected, rtol=1e-6, atol=0):
        fail(f"LlamaForCausalLM's rotary frequencies are not theta^(-2i/d) for theta {cfg['rope_theta']}")
    return model


class CompactLlama:
    """The same architecture in plain PyTorch (float64), on the same state dict as transformers'
    LlamaForCausalLM: RMSNorm, grouped-query causal attention with rotate_half RoPE, SwiGLU, an
    untied classifier. For machines with torch but without transformers."""

    def __init__(self, torch, cfg, state):
        self.torch, self.cfg = torch, cfg
        self.params = {k: v.clone().requires_grad_(True) for k, v in state.items()}

    def named_parameters(self):
        return self.params.items()

    def logits(self, ids):
        torch, cfg, P = self.torch, self.cfg, self.params
        h, heads, kv = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
        d, s, eps = h // heads, ids.shape[0], cfg["norm_eps"]

        def rms(x, w):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

        pos = torch.arange(s, dtype=torch.float64)[:, None]
        inv = torch.tensor([cfg["rope_theta"] ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float64)
        angles = torch.cat([pos * inv, pos * inv], dim=-1)  # s x d, pair (i, i + d/2)
        cos, sin = angles.cos(), angles.sin()

        def rope(x):  # heads x s x d
            x1, x2 = x[..., : d // 2], x[..., d // 2:]
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin

        mask = torch.full((s, s), float("-inf"), dtype=torch.float64).triu(1)
        x = P["model.embed_tokens.weight"][ids]
        for l in range(cfg["layers"]):
            p = f"model.layers.{l}."
            a = rms(x, P[p + "input_layernorm.weight"])
            q = rope((a @ P[p + "self_attn.q_proj.weight"].T).reshape(s, heads, d).transpose(0, 1))
            k = rope((a @ P[p + "self_attn.k_proj.weight"].T).reshape(s, kv, d).transpose(0, 1))
            v = (a @ P[p + "self_attn.v_proj.weight"].T).reshape(s, kv, d).transpose(0, 1)
            k, v = k.repeat_interleave(heads // kv, dim=0), v.repeat_interleave(heads // kv, dim=0)
            scores = q @ k.transpose(1, 2) / math.sqrt(d) + mask
            o = (scores.softmax(-1) @ v).transpose(0, 1).reshape(s, h)
            x = x + o @ P[p + "self_attn.o_proj.weight"].T
            m = rms(x, P[p + "post_attention_layernorm.weight"])
            g = torch.nn.functional.silu(m @ P[p + "mlp.gate_proj.weight"].T) * (m @ P[p + "mlp.up_proj.weight"].T)
            x = x + g @ P[p + "mlp.down_proj.weight"].T
        return rms(x, P["model.norm.weight"]) @ P["lm_head.weight"].T


def main(argv):
    args = parse_args(argv)
    try:
        import torch
    except (ImportError, OSError) as e:  # OSError: a torch whose shared libraries do not load
        print(f"SKIP: torch is not installed or does not load ({e})")
        return 0
    transformers = None
    if args.impl != "torch":
        try:
            import transformers
            import transformers.models.llama  # noqa: F401
        except (ImportError, OSError) as e:
            if args.impl == "hf":
                print(f"SKIP: transformers is not installed ({e})")
                return 0
            print(f"note: transformers is not installed ({e}); using the compact PyTorch implementation")
            transformers = None

    if args.run:
        if args.dump:
            run_dump(args, args.dump)
            dump = args.dump
        else:
            tmp = tempfile.TemporaryDirectory(prefix="llama-step-")
            dump = tmp.name
            run_dump(args, dump)
    else:
        dump = args.dump
    manifest_path = os.path.join(dump, "manifest.json")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{manifest_path}: {e}")
    cfg = manifest["config"]
    shape = (cfg.get("ffn"), cfg.get("norm"), cfg.get("biases"), cfg.get("tied_embeddings"), cfg.get("micro_batch", 1))
    if shape != ("swiglu", "rmsnorm", "none", False, 1):
        fail(f"{manifest['model']} is not a Llama-shaped model of one sequence (ffn, norm, biases, tied, micro batch: {shape})")

    def load(entries):
        return {(e["role"], e["layer"]): read_bf16(torch, os.path.join(dump, e["file"]), e["rows"], e["row_elements"])
                for e in entries}

    params, ours = load(manifest["parameters"]), load(manifest["gradients"])
    tokens = read_u32(torch, os.path.join(dump, manifest["tokens"]))
    targets = read_u32(torch, os.path.join(dump, manifest["targets"]))
    state = to_hf(torch, cfg, params)

    torch.manual_seed(0)
    if transformers is not None:
        model = hf_model(torch, transformers, cfg)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            fail(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
        model.train()
        # HF would shift `labels` itself; the loss is computed here against memo's next-token
        # targets instead, so that each logit row meets exactly the target memo used.
        logits = model(input_ids=tokens[None, :]).logits[0]
        named = dict(model.named_parameters())
        impl = f"transformers {transformers.__version__} LlamaForCausalLM (eager attention), float64"
    else:
        model = CompactLlama(torch, cfg, state)
        logits = model.logits(tokens)
        named = dict(model.named_parameters())
        impl = "compact PyTorch Llama, float64"
    loss = torch.nn.functional.cross_entropy(logits, targets)
    loss.backward()
    theirs = from_hf(torch, cfg, {k: p.grad for k, p in named.items()})

    print(f"{manifest['model']}: {len(tokens)} tokens, seed {manifest.get('seed')}; reference: {impl}; torch {torch.__version__}")
    ok = True
    loss_error = abs(manifest["loss"] - loss.item()) / abs(loss.item())
    verdict = "ok" if loss_error <= LOSS_TOLERANCE else "FAIL"
    ok &= verdict == "ok"
    print(f"loss: memo {manifest['loss']:.6f}, reference {loss.item():.6f}, relative error {loss_error:.2e} "
          f"(bound {LOSS_TOLERANCE:.2e}) {verdict}")
    print(f"{'gradient':<22} {'shape':>10} {'rel. L2':>10} {'max |diff|':>11} {'ref. norm':>10}")
    worst = (0.0, None)
    if set(ours) != set(theirs):
        fail(f"gradients differ in name: memo {sorted(map(str, ours))}, reference {sorted(map(str, theirs))}", 1)
    for key in sorted(ours, key=lambda k: (k[1] if k[1] is not None else -1, k[0])):
        mine, ref = ours[key], theirs[key].detach()
        if mine.shape != ref.shape:
            fail(f"{key}: memo's gradient is {tuple(mine.shape)}, the reference's {tuple(ref.shape)}", 1)
        norm = ref.norm().item()
        err = (mine - ref).norm().item() / norm if norm > 0 else (mine - ref).norm().item()
        verdict = "ok" if err <= args.tolerance else "FAIL"
        ok &= verdict == "ok"
        worst = max(worst, (err, key), key=lambda w: w[0])
        name = key[0] if key[1] is None else f"{key[0]}.{key[1]}"
        print(f"{name:<22} {'x'.join(map(str, mine.shape)):>10} {err:>10.2e} {(mine - ref).abs().max().item():>11.2e} "
              f"{norm:>10.3e} {verdict}")
    print(f"worst gradient relative L2 {worst[0]:.2e} ({worst[1][0]}"
          f"{'' if worst[1][1] is None else '.' + str(worst[1][1])}), bound {args.tolerance:.2e}: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
