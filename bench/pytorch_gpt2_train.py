#!/usr/bin/env python3
"""A plain PyTorch GPT-2 training loop: the baseline tandem's GPU step is measured against.

What the CUDA backend issue asks to compare with: bf16 autocast,
F.scaled_dot_product_attention, fused AdamW, no torch.compile. GPT-2 124M with
B=16, T=1024 by default. Prints tokens/s per step and, at the end, one JSON object
(median tokens/s over the timed steps).

With --data it trains on an llm.c token shard (the format `tandem tokenize` writes, which
tandem's own run reads too), taking consecutive windows of T+1 tokens, so that both sides
of the comparison see the same tokens; without it, on uniformly random tokens.

  python3 bench/pytorch_gpt2_train.py --device cuda --data run/tokens.bin   # GPT-2 124M
  python3 bench/pytorch_gpt2_train.py --device cpu --model tiny --steps 3   # smoke test

On the CPU (tandem's CPU step is fp32), --config takes the model's shape, the micro-batch and
the sequence length from a tandem GPT-2 config, --precision fp32 (the CPU's default) trains
without autocast, --threads sets torch's threads, and --compile runs the model through
torch.compile (the first steps compile: give --warmup enough of them):

  python3 bench/pytorch_gpt2_train.py --device cpu --config configs/shakespeare-char.json \
      --threads 2 --compile --warmup 5 --steps 10
"""
import argparse
import json
import math
import array
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {
    # vocab padded to 50304 as llm.c and nanoGPT do
    "124M": dict(vocab_size=50304, context_length=1024, n_layer=12, n_head=12, n_embd=768),
    "tiny": dict(vocab_size=256, context_length=64, n_layer=2, n_head=2, n_embd=64),
}


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab_size, context_length, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(context_length, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def config_shape(path):
    """(model shape, micro-batch, sequence length) of a tandem GPT-2 config, or exit saying why."""
    try:
        config = json.load(open(path))
        model = config["model"]
        if str(model.get("type", "gpt2")).lower() != "gpt2":
            sys.exit(f"{path}: model.type is {model['type']!r}; this baseline trains a GPT-2 "
                     "(bench/pytorch_llama_train.py trains a Llama)")
        shape = {k: int(model[k]) for k in ("vocab_size", "context_length", "n_layer", "n_head",
                                            "n_embd")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"{path}: not a tandem GPT-2 config ({e!r}); pass one such as "
                 "configs/shakespeare-char.json")
    batch = int(config.get("train_micro_batch_size_per_gpu", 1))
    seq_len = int(config.get("train", {}).get("seq_len", shape["context_length"]))
    return shape, batch, seq_len


SHARD_FORMATS = {20240520: (1, "H"), 20240801: (7, "I")}  # magic: version, array typecode


def read_token_shard(path):
    """An llm.c shard: 256 little-endian int32 (magic, version, token count), then tokens."""
    with open(path, "rb") as f:
        header = array.array("i", f.read(256 * 4))
        body = f.read()
    if sys.byteorder != "little":
        header.byteswap()
    if len(header) != 256 or header[0] not in SHARD_FORMATS:
        sys.exit(f"{path}: not an llm.c token shard (bad header); write one with "
                 "`tandem tokenize --input TEXT --output FILE.bin`")
    version, typecode = SHARD_FORMATS[header[0]]
    if header[1] != version:
        sys.exit(f"{path}: version {header[1]} does not match its magic (expected {version})")
    tokens = array.array(typecode)
    if len(body) % tokens.itemsize:
        sys.exit(f"{path}: the body is not a whole number of tokens")
    tokens.frombytes(body)
    if sys.byteorder != "little":
        tokens.byteswap()
    if len(tokens) != header[2]:
        sys.exit(f"{path}: the header says {header[2]} tokens, the file holds {len(tokens)}")
    return tokens


def batch_maker(data, vocab_size, B, T, device):
    """batch(step) -> (inputs, targets) [B, T] on `device`: consecutive windows of B (T + 1)
    tokens of the llm.c shard `data`, or uniformly random tokens without one."""
    window = B * (T + 1)
    if data:
        tokens = torch.tensor(list(read_token_shard(data)), dtype=torch.int64)
        if tokens.numel() < window:
            sys.exit(f"{data}: {tokens.numel()} tokens, fewer than one batch of {window}")
        if int(tokens.max()) >= vocab_size:
            sys.exit(f"{data}: token {int(tokens.max())} is outside the vocabulary of {vocab_size}")

    def batch(step):
        if not data:
            chunk = torch.randint(0, vocab_size, (B, T + 1))
        else:
            start = (step * window) % (tokens.numel() - window + 1)
            chunk = tokens[start:start + window].view(B, T + 1)
        chunk = chunk.to(device)
        return chunk[:, :-1], chunk[:, 1:].contiguous()
    return batch


def timed_steps(loss_of, model, optimizer, batch, warmup, steps, device, tokens_per_step,
                log=sys.stdout):
    """warmup + steps training steps (loss_of(x, y), backward, clipping at 1, the optimizer),
    each timed to the device's completion and logged; returns the timed steps' tokens/s and
    every step's loss."""
    rates, losses = [], []
    for step in range(warmup + steps):
        x, y = batch(step)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = loss_of(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            rates.append(tokens_per_step / elapsed)
        losses.append(loss.item())
        print(f"step {step + 1}: loss {loss.item():.4f}, {elapsed * 1e3:.1f} ms, "
              f"{tokens_per_step / elapsed:.0f} tok/s", file=log)
    return rates, losses


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="124M", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=0, help="0: the model's context length")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps not timed")
    parser.add_argument("--data", help="llm.c token shard to train on (default: random tokens)")
    parser.add_argument("--config", help="a tandem GPT-2 config: its model shape, micro-batch "
                        "and sequence length (instead of --model, --batch and --seq-len)")
    parser.add_argument("--precision", choices=["bf16", "fp32"],
                        help="bf16 autocast, or fp32 throughout (default: bf16 on a GPU, fp32 "
                             "on the CPU)")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's)")
    parser.add_argument("--compile", action="store_true", help="the model through torch.compile")
    args = parser.parse_args()

    torch.manual_seed(1337)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = MODELS[args.model]
    if args.config:
        cfg, args.batch, args.seq_len = config_shape(args.config)
    T = args.seq_len or cfg["context_length"]
    device = torch.device(args.device)
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    model = GPT(**cfg).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    batch = batch_maker(args.data, cfg["vocab_size"], args.batch, T, device)

    forward = torch.compile(model) if args.compile else model

    def loss_of(x, y):
        if precision == "fp32":
            return forward(x, y)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            return forward(x, y)

    rates, losses = timed_steps(loss_of, model, optimizer, batch, args.warmup, args.steps,
                                device, args.batch * T)
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"framework": "pytorch", "torch": torch.__version__, "device": str(device),
                      "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
                      "model": args.config or args.model, "params": params, "batch": args.batch,
                      "seq_len": T, "precision": precision, "compiled": args.compile,
                      "threads": torch.get_num_threads(),
                      "data": args.data or "random tokens",
                      "tokens_per_s": statistics.median(rates) if rates else None,
                      "losses": [round(l, 4) for l in losses]}))


if __name__ == "__main__":
    main()
