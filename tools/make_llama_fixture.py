#!/usr/bin/env python3
"""Generate tests/fixtures/llama_tiny.safetensors: a reference for tandem's Llama.

A tiny Llama (Hugging Face LlamaForCausalLM semantics: RMSNorm, rotary position
embeddings in the rotate-half form, grouped-query attention, SwiGLU MLP, no biases,
an untied LM head), written out by hand in PyTorch independently of tandem's C++
code, is evaluated in float64 on one fixed random batch. Odd sizes on purpose:
vocabulary 61, head size 6, 4 query heads sharing 2 key/value heads, MLP width 40,
sequence 11 of 16 positions. The file holds the batch, the initial parameters (HF
names and layout), the logits, the loss, d(loss)/d(param) for every parameter, the
pre-clip gradient norms and the parameters after 3 steps of torch.optim.AdamW with
global-norm clipping. Tensors are F32 (token ids I32); hyper-parameters are in the
safetensors "__metadata__".

Usage:  python3 tools/make_llama_fixture.py [--output PATH]
Needs:  pip install torch   (CPU is enough; with `transformers` installed the
        hand-written model is also checked against LlamaForCausalLM itself)
The output is deterministic: running twice gives a byte-identical file.
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt2_fixture import (  # noqa: E402
    check_close, check_finite_differences, read_safetensors, write_safetensors)

SEED = 4242
VOCAB_SIZE = 61          # V
CONTEXT_LENGTH = 16      # max_position_embeddings
N_LAYER = 2              # L
N_HEAD = 4               # NH
N_KV_HEAD = 2            # KVH: two query heads per key/value head
N_EMBD = 24              # C (head size HS = 6)
INTERMEDIATE = 40        # I
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
BATCH_SIZE = 2           # B
SEQ_LEN = 11             # T < maxT

LR = 1e-2
BETA1 = 0.9
BETA2 = 0.95
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
MAX_NORM = 1.0
ADAMW_STEPS = 3
INIT_STD = 0.1           # weights N(0, 0.1); RMSNorm weights 1 + N(0, 0.1)

DT = torch.float64
HS = N_EMBD // N_HEAD


def param_specs():
    """(name, shape, kind) in Hugging Face state_dict order; kind 'w' or 'norm'."""
    V, C, I = VOCAB_SIZE, N_EMBD, INTERMEDIATE
    Q, KV = N_HEAD * HS, N_KV_HEAD * HS
    specs = [("model.embed_tokens.weight", (V, C), "w")]
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (C,), "norm"),
            (p + "self_attn.q_proj.weight", (Q, C), "w"),
            (p + "self_attn.k_proj.weight", (KV, C), "w"),
            (p + "self_attn.v_proj.weight", (KV, C), "w"),
            (p + "self_attn.o_proj.weight", (C, Q), "w"),
            (p + "post_attention_layernorm.weight", (C,), "norm"),
            (p + "mlp.gate_proj.weight", (I, C), "w"),
            (p + "mlp.up_proj.weight", (I, C), "w"),
            (p + "mlp.down_proj.weight", (C, I), "w"),
        ]
    specs += [("model.norm.weight", (C,), "norm"), ("lm_head.weight", (V, C), "w")]
    return specs


def init_params(gen):
    params = {}
    for name, shape, kind in param_specs():
        x = torch.randn(shape, generator=gen, dtype=DT) * INIT_STD
        if kind == "norm":
            x = x + 1.0
        params[name] = x.to(torch.float32).to(DT).requires_grad_(True)
    return params


# ----------------------------------------------------------------------------
# the model, written out by hand

def rms_norm(x, w):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + RMS_EPS) * w


def rope_tables(T):
    # angle[t, i] = t / theta^(2i/HS), i < HS/2; cos/sin repeated for both halves. In
    # float32, as Hugging Face's LlamaRotaryEmbedding computes them whatever the model's
    # dtype (and as tandem does): the rest of the model is float64.
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]   # [T, HS/2]
    angles = torch.cat([angles, angles], dim=-1)                                  # [T, HS]
    return angles.cos().to(DT), angles.sin().to(DT)


def rotate(x, cos, sin):
    # x [B, H, T, HS]: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), halves of HS
    x1, x2 = x[..., :HS // 2], x[..., HS // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attention(x, P, p):
    B, T, C = x.shape
    q = (x @ P[p + "self_attn.q_proj.weight"].t()).view(B, T, N_HEAD, HS).transpose(1, 2)
    k = (x @ P[p + "self_attn.k_proj.weight"].t()).view(B, T, N_KV_HEAD, HS).transpose(1, 2)
    v = (x @ P[p + "self_attn.v_proj.weight"].t()).view(B, T, N_KV_HEAD, HS).transpose(1, 2)
    cos, sin = rope_tables(T)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    group = N_HEAD // N_KV_HEAD
    k = k.repeat_interleave(group, dim=1)       # query head h reads key/value head h // group
    v = v.repeat_interleave(group, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, N_HEAD * HS)
    return y @ P[p + "self_attn.o_proj.weight"].t()


def mlp(x, P, p):
    gate = x @ P[p + "mlp.gate_proj.weight"].t()
    up = x @ P[p + "mlp.up_proj.weight"].t()
    return (gate * torch.sigmoid(gate) * up) @ P[p + "mlp.down_proj.weight"].t()


def forward(P, tokens, targets):
    x = P["model.embed_tokens.weight"][tokens]
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        x = x + attention(rms_norm(x, P[p + "input_layernorm.weight"]), P, p)
        x = x + mlp(rms_norm(x, P[p + "post_attention_layernorm.weight"]), P, p)
    logits = rms_norm(x, P["model.norm.weight"]) @ P["lm_head.weight"].t()
    logp = torch.log_softmax(logits, dim=-1)
    loss = -logp.gather(-1, targets.unsqueeze(-1)).mean()
    return logits, loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", default="tests/fixtures/llama_tiny.safetensors")
    args = ap.parse_args()

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)
    B, T, V = BATCH_SIZE, SEQ_LEN, VOCAB_SIZE

    P = init_params(gen)
    names = [n for n, _, _ in param_specs()]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    init = {n: P[n].detach().clone() for n in names}

    logits, loss = forward(P, tokens, targets)
    grads = dict(zip(names, torch.autograd.grad(loss, [P[n] for n in names])))
    print(f"loss = {loss.item():.10f}   (ln V = {math.log(V):.6f})")

    print("self-checks:")
    check_finite_differences(lambda: forward(P, tokens, targets)[1].item(), P, grads, SEED + 1)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=V, hidden_size=N_EMBD, intermediate_size=INTERMEDIATE,
                          num_hidden_layers=N_LAYER, num_attention_heads=N_HEAD,
                          num_key_value_heads=N_KV_HEAD, max_position_embeddings=CONTEXT_LENGTH,
                          rms_norm_eps=RMS_EPS, rope_theta=ROPE_THETA, tie_word_embeddings=False,
                          attention_bias=False, mlp_bias=False)
        cfg._attn_implementation = "eager"
        hf = LlamaForCausalLM(cfg).to(DT).eval()
        missing, unexpected = hf.load_state_dict(init, strict=False)
        assert not missing and not unexpected, (missing, unexpected)
        with torch.no_grad():
            hf_logits = hf(tokens).logits
        # LlamaRMSNorm computes in float32 whatever the model's dtype, so a float64
        # LlamaForCausalLM agrees with this model to float32's precision, not float64's.
        check_close("logits vs transformers.LlamaForCausalLM", logits, hf_logits, tol=2e-6)
    except ImportError:
        print("  --  transformers not installed: skipped the LlamaForCausalLM comparison")

    params = [P[n] for n in names]
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=ADAM_EPS, foreach=False, fused=False)
    norms = []
    for step in range(1, ADAMW_STEPS + 1):
        opt.zero_grad(set_to_none=True)
        _, l = forward(P, tokens, targets)
        l.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        opt.step()
        norms.append(norm.item())
        print(f"adamw step {step}: loss {l.item():.10f}  pre-clip grad norm {norm.item():.10f}")
    assert min(norms) > MAX_NORM, f"clipping must trigger every step: min norm {min(norms)}"

    f32 = lambda t: t.detach().to(torch.float32)  # noqa: E731
    tensors = [("tokens", tokens.to(torch.int32)), ("targets", targets.to(torch.int32))]
    tensors += [(n, f32(init[n])) for n in names]
    tensors += [("logits", f32(logits)), ("loss", f32(loss).reshape(()))]
    tensors += [("grad." + n, f32(grads[n])) for n in names]
    tensors += [("adamw3." + n, f32(P[n])) for n in names]
    tensors += [(f"grad_norm.step{i + 1}", torch.tensor(v, dtype=torch.float32).reshape(()))
                for i, v in enumerate(norms)]
    metadata = {
        "vocab_size": str(VOCAB_SIZE), "max_position_embeddings": str(CONTEXT_LENGTH),
        "num_hidden_layers": str(N_LAYER), "num_attention_heads": str(N_HEAD),
        "num_key_value_heads": str(N_KV_HEAD), "hidden_size": str(N_EMBD),
        "intermediate_size": str(INTERMEDIATE), "rms_norm_eps": repr(RMS_EPS),
        "rope_theta": repr(ROPE_THETA), "tie_word_embeddings": "false",
        "batch_size": str(B), "seq_len": str(T),
        "lr": repr(LR), "beta1": repr(BETA1), "beta2": repr(BETA2), "eps": repr(ADAM_EPS),
        "weight_decay": repr(WEIGHT_DECAY), "max_norm": repr(MAX_NORM),
        "adamw_steps": str(ADAMW_STEPS), "seed": str(SEED), "init_std": repr(INIT_STD),
        "torch_version": torch.__version__.split("+")[0],
        "generator": "tools/make_llama_fixture.py",
        "format": "pt",
    }
    out_dir = os.path.dirname(args.output)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    write_safetensors(args.output, tensors, metadata)
    back, meta = read_safetensors(args.output)
    assert meta == metadata and list(back.keys()) == [n for n, _ in tensors]
    for n, t in tensors:
        assert torch.equal(back[n], t), n
    print(f"wrote {args.output}: {len(tensors)} tensors, {os.path.getsize(args.output)} bytes")


if __name__ == "__main__":
    main()
