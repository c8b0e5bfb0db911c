#!/usr/bin/env python3
"""Loads a tandem checkpoint with Hugging Face transformers and evaluates it.

Shows that tandem's checkpoint directory is a valid GPT-2 checkpoint: every tensor
loads (no missing or unexpected keys), and the loss of the loaded model on the text
is what tandem reported (for the byte-level demo, about its val_loss).

  pip install torch transformers
  python3 tools/check_hf_load.py runs/shakespeare-char/checkpoints/step_00002000 \
      --text data/tinyshakespeare.txt
"""
import argparse
import math
import sys

import torch
from transformers import GPT2LMHeadModel


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a tandem checkpoint directory (step_XXXXXXXX)")
    parser.add_argument("--text", help="a text file to evaluate on (its last 10%%, byte-level)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()

    model, info = GPT2LMHeadModel.from_pretrained(args.checkpoint, output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.endswith(("attn.bias", "attn.masked_bias", "lm_head.weight"))]
    if missing or info["unexpected_keys"] or info["mismatched_keys"]:
        print(f"load problems: {info}", file=sys.stderr)
        return 1
    model.eval()
    print(f"loaded {sum(p.numel() for p in model.parameters())} parameters from {args.checkpoint}")
    if not args.text:
        return 0
    data = open(args.text, "rb").read()
    val = torch.tensor(list(data[int(len(data) * 0.9):]), dtype=torch.long)
    T = args.seq_len
    losses = []
    with torch.no_grad():
        for b in range(args.batches):
            chunk = val[b * T: b * T + T + 1]
            if len(chunk) < T + 1:
                break
            out = model(chunk[:-1].unsqueeze(0))
            logits = out.logits[0]
            losses.append(torch.nn.functional.cross_entropy(logits, chunk[1:]).item())
    mean = sum(losses) / len(losses)
    print(f"loss on {len(losses)} sequences of {T} bytes: {mean:.4f} nats/byte (uniform: {math.log(256):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
