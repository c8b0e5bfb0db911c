#!/usr/bin/env python3
"""Loads a tandem checkpoint (or any Hugging Face model directory) with transformers and checks it.

Shows that tandem's checkpoint directory is a valid Hugging Face model directory
(GPT2LMHeadModel or LlamaForCausalLM, whichever its config.json names): every tensor
loads, with no missing or unexpected keys. Then, optionally:

  --tandem BUILD/tandem   runs `tandem logits` on the same checkpoint and a seeded random
                          token sequence and compares the logits with the Hugging Face
                          model's (fp32 both; exits 1 beyond --tolerance)
  --text FILE             the loss of the loaded model on the file's last 10%, byte-level
                          (for the byte-level demo, about tandem's val_loss)

  pip install torch transformers
  python3 tools/check_hf_load.py runs/shakespeare-char/checkpoints/step_00002000 \\
      --tandem build/tandem --text data/tinyshakespeare.txt
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:  # the message says what to install
    print(f"check_hf_load.py needs torch and transformers ({e}); "
          "pip install torch transformers", file=sys.stderr)
    sys.exit(2)

# Buffers and tied weights transformers reports as missing though nothing is lost.
IGNORED_MISSING = ("attn.bias", "attn.masked_bias", "lm_head.weight")


def read_safetensors(path):
    """{name: tensor} of an F32/I32 safetensors file, parsed by hand."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        fmt, dtype = {"F32": ("f", torch.float32), "I32": ("i", torch.int32)}[info["dtype"]]
        values = struct.unpack_from("<%d%s" % ((b - a) // 4, fmt), raw, 8 + n + a)
        out[name] = torch.tensor(values, dtype=dtype).reshape(info["shape"])
    return out


def compare_logits(model, args):
    config = model.config
    T = min(args.seq_len, getattr(config, "max_position_embeddings", None) or config.n_positions)
    gen = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, config.vocab_size, (T,), generator=gen)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.safetensors")
        cmd = [args.tandem, "logits", "--checkpoint", args.checkpoint,
               "--tokens", ",".join(str(t) for t in tokens.tolist()), "--output", out]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"tandem logits failed: {done.stderr.strip()}", file=sys.stderr)
            return False
        theirs = read_safetensors(out)
    assert theirs["tokens"].flatten().tolist() == tokens.tolist()
    with torch.no_grad():
        ours = model(tokens.unsqueeze(0)).logits.to(torch.float32)
    tandem = theirs["logits"]
    scale = ours.abs().max().item()
    err = (ours - tandem).abs().max().item()
    ok = err <= args.tolerance * max(scale, 1.0)
    print(f"logits on {T} tokens: max |transformers - tandem| = {err:.3e} "
          f"(largest logit {scale:.3f}, tolerance {args.tolerance:g} relative): "
          f"{'match' if ok else 'MISMATCH'}")
    return ok


def text_loss(model, args):
    data = open(args.text, "rb").read()
    val = torch.tensor(list(data[int(len(data) * 0.9):]), dtype=torch.long)
    T = args.seq_len
    losses = []
    with torch.no_grad():
        for b in range(args.batches):
            chunk = val[b * T: b * T + T + 1]
            if len(chunk) < T + 1:
                break
            logits = model(chunk[:-1].unsqueeze(0)).logits[0]
            losses.append(torch.nn.functional.cross_entropy(logits, chunk[1:]).item())
    mean = sum(losses) / len(losses)
    print(f"loss on {len(losses)} sequences of {T} bytes: {mean:.4f} nats/byte "
          f"(uniform: {math.log(256):.4f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a tandem checkpoint directory (step_XXXXXXXX) or any "
                        "Hugging Face model directory")
    parser.add_argument("--tandem", help="the tandem binary: compare its logits with transformers'")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest logit difference, relative to the largest logit")
    parser.add_argument("--text", help="a text file to evaluate on (its last 10%%, byte-level)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()

    # tandem's checkpoints are fp32 and say so in config.json (torch_dtype).
    model, info = AutoModelForCausalLM.from_pretrained(args.checkpoint, output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.endswith(IGNORED_MISSING)]
    if missing or info["unexpected_keys"] or info["mismatched_keys"]:
        print(f"load problems: {info}", file=sys.stderr)
        return 1
    model.eval()
    print(f"loaded {type(model).__name__}: {sum(p.numel() for p in model.parameters())} "
          f"parameters from {args.checkpoint}")
    if args.tandem and not compare_logits(model, args):
        return 1
    if args.text:
        text_loss(model, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
