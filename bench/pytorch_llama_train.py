#!/usr/bin/env python3
"""The PyTorch Llama baseline: transformers' LlamaForCausalLM trained as people train it.

The model is the one a tandem config describes (its "model" section uses Hugging Face's
LlamaConfig names), so the two sides train the same shapes: grouped-query heads, SwiGLU,
RMSNorm, rotary embeddings, an untied head. SDPA attention, AdamW (fused on a GPU,
foreach on the CPU), gradient clipping at 1, no torch.compile; fp32 on the CPU, bf16
autocast on a GPU. Batch and sequence length default to the config's. Prints tokens/s per
step and, at the end, one JSON object (median tokens/s over the timed steps).

  python3 bench/pytorch_llama_train.py --config configs/llama-shakespeare.json --device cpu
  bench/llama_cpu_vs_pytorch.sh     # tandem and this baseline, alternating, one ratio
"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_gpt2_train import batch_maker, timed_steps  # noqa: E402

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    sys.exit(f"pytorch_llama_train.py needs transformers ({e}); pip install transformers")


def llama_config(model):
    """LlamaConfig of a tandem config's "model" section (Hugging Face's names already)."""
    if model.get("type", "gpt2").lower() != "llama":
        sys.exit(f"the config's model.type is {model.get('type', 'gpt2')!r}; this baseline is a Llama")
    keys = ("vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps",
            "rope_theta", "tie_word_embeddings")
    return LlamaConfig(**{k: model[k] for k in keys if k in model}, bos_token_id=None,
                       eos_token_id=None, attn_implementation="sdpa")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a tandem config with model.type llama")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=0, help="0: the config's micro-batch")
    parser.add_argument("--seq-len", type=int, default=0, help="0: the config's train.seq_len")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="steps not timed")
    parser.add_argument("--data", help="llm.c token shard to train on (default: random tokens)")
    args = parser.parse_args()

    with open(args.config) as f:
        config = json.load(f)
    cfg = llama_config(config["model"])
    B = args.batch or config.get("train_micro_batch_size_per_gpu", 1)
    T = args.seq_len or config.get("train", {}).get("seq_len", cfg.max_position_embeddings)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    device = torch.device(args.device)
    model = LlamaForCausalLM(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), eps=1e-8,
                                  weight_decay=0.1, fused=device.type == "cuda",
                                  foreach=device.type != "cuda")
    batch = batch_maker(args.data, cfg.vocab_size, B, T, device)

    def loss_of(x, y):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                            enabled=device.type == "cuda"):
            logits = model(input_ids=x).logits
        return torch.nn.functional.cross_entropy(logits.float().view(-1, cfg.vocab_size),
                                                 y.view(-1))

    rates, losses = timed_steps(loss_of, model, optimizer, batch, args.warmup, args.steps,
                                device, B * T, log=sys.stderr)
    print(json.dumps({"framework": "pytorch", "model": "LlamaForCausalLM",
                      "torch": torch.__version__, "device": str(device),
                      "threads": torch.get_num_threads(),
                      "params": sum(p.numel() for p in model.parameters()), "batch": B,
                      "seq_len": T, "data": args.data or "random tokens",
                      "tokens_per_s": statistics.median(rates) if rates else None,
                      "losses": [round(v, 4) for v in losses]}))


if __name__ == "__main__":
    main()
