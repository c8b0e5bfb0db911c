#!/usr/bin/env python3
"""Generate tests/fixtures/hf_qwen2/masked_reference.safetensors: the loss mask's reference.

transformers' Qwen2 fixture model (tests/fixtures/hf_qwen2, made by
make_hf_family_fixtures.py) on its reference batch with some targets masked out as
PyTorch's ignore_index (-100): positions 0..9 of the first sequence (a prompt) and all
but the last 4 of the second (an answer at its end), evaluated in float64. PyTorch's cross_entropy(ignore_index=-100) averages over the counted targets
only; tandem's kIgnoredTarget must give the same loss and the same gradients. The file
holds `targets` (I32 [B, T], -100 where masked), `loss` (F32 []) and `grad.<name>` for
every parameter.

Usage:  python3 tools/make_masked_loss_fixture.py
Needs:  pip install torch transformers safetensors
The output is deterministic.
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt2_fixture import write_safetensors  # noqa: E402


def main():
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    fixture = os.path.join(root, "tests", "fixtures", "hf_qwen2")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    reference = load_file(os.path.join(fixture, "reference.safetensors"))
    tokens, targets = reference["tokens"].long(), reference["targets"].long().clone()
    B, T = tokens.shape
    targets[0, :10] = -100  # a prompt at the start of the first sequence
    targets[1, :T - 4] = -100  # only an answer at the end of the second
    model = AutoModelForCausalLM.from_pretrained(fixture, attn_implementation="eager")
    model = model.to(torch.float64).eval()
    logits = model(tokens).logits
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
    loss.backward()
    tensors = {"targets": targets.to(torch.int32), "loss": loss.detach().float().reshape(())}
    for name, p in model.named_parameters():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        tensors["grad." + name] = p.grad.detach().float()
    counted = int((targets != -100).sum())
    print(f"loss {loss.item():.6f} over {counted} of {B * T} targets")
    write_safetensors(os.path.join(fixture, "masked_reference.safetensors"),
                      list(tensors.items()), {"batch_size": str(B), "seq_len": str(T), "counted_targets": str(counted)})


if __name__ == "__main__":
    main()
