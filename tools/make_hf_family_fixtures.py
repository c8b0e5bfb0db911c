#!/usr/bin/env python3
"""Generate tests/fixtures/hf_<family>/: Hugging Face checkpoints of five model families
with reference values computed by `transformers` itself.

For each of the families llama3 (Llama with llama3 rotary scaling), qwen2 (q/k/v biases),
qwen3 (per-head q_norm/k_norm, head_dim * heads != hidden, tied head), mistral (explicit
head_dim 12) and smollm2 (Llama, tied head, one key/value head), a tiny random-weight
model is built from the transformers config class (eager attention) and written with
`save_pretrained(safe_serialization=True)`: config.json, model.safetensors (and
generation_config.json), i.e. a checkpoint tandem's loader reads as it would a real one.
Next to them, reference.safetensors holds what transformers computes on it, so tandem's
implementation of each family is checked against the reference implementation, not
against a second hand-written model:

  tokens, targets      I32 [B, T]   random batch; targets are the next tokens
  <param>              F32          every tensor of model.safetensors, same names (HF
                                    state_dict; a tied head has no lm_head.weight)
  logits               F32 [B, T, V] the model converted to float64, eval mode
  loss                 F32 []       F.cross_entropy(logits.view(-1, V), targets.view(-1))
  grad.<param>         F32          d(loss)/d(param) in float64 (a tied head's gradient is
                                    part of grad.model.embed_tokens.weight)
  rope.cos, rope.sin   F32 [T, head_dim] model.model.rotary_emb(x, arange(T)[None]) on the
                                    float32 model
  greedy.prompt        I32 [5]      a prompt, and the 8 tokens model.generate(do_sample=False)
  greedy.continuation  I32 [8]      appends on the float32 model; at every generated position
                                    the float64 top-1 logit leads the top-2 by more than 1e-3
                                    and at least 3 tokens differ (the prompt is redrawn
                                    until so), so an fp32 engine must reproduce the argmax

Tiny sizes (vocabulary 97, 2 layers, MLP width 48, hidden 32 or 48); weights are redrawn
after construction (matrices N(0, 0.15), norm weights 1 + N(0, 0.1), biases N(0, 0.1))
so that logits and gradients are O(1), not the near-uniform logits of the 0.02 init.
Caveat: the "float64" model is transformers' own code run in float64, which still
computes RMSNorm, the attention softmax and the rotary tables in float32 (it casts), so
the references are accurate to about float32 precision there, not to float64's.

Usage:  python3 tools/make_hf_family_fixtures.py [--output-dir tests/fixtures]
                                                 [--family NAME ...]
Needs:  pip install torch transformers safetensors   (CPU is enough)
The output is deterministic: running twice gives byte-identical files (same torch and
transformers versions).
"""

import argparse
import copy
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt2_fixture import read_safetensors, write_safetensors  # noqa: E402

VOCAB_SIZE = 97          # V, odd on purpose
N_LAYER = 2
INTERMEDIATE = 48
MAX_POS = 64             # max_position_embeddings
BATCH_SIZE = 2           # B
SEQ_LEN = 24             # T
PROMPT_LEN = 5           # P
NEW_TOKENS = 8           # G
MIN_MARGIN = 1e-3        # top-1 minus top-2 logit (float64) at every generated position
MIN_DISTINCT = 3         # distinct tokens in the continuation (not one token repeated)
WEIGHT_STD = 0.15        # every weight matrix (embeddings included) ~ N(0, 0.15)
NORM_STD = 0.1           # every norm weight ~ 1 + N(0, 0.1)
BIAS_STD = 0.1           # every bias ~ N(0, 0.1)

COMMON = dict(vocab_size=VOCAB_SIZE, num_hidden_layers=N_LAYER,
              intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POS,
              attn_implementation="eager")

# Llama 3.1's factors (8, 1, 4). original_max_position_embeddings is 32, not 16: with
# head_dim 8 and rope_theta 100 the rotary wavelengths are 2 pi * 100^(i/8) = 6.28, 19.9,
# 62.8, 199; the highest-frequency one is 2 pi whatever head_dim and theta are, so the
# unchanged band (wavelength < original / high_freq_factor) is empty unless
# original / 4 > 2 pi, i.e. original >= 26. With 32: 6.28 < 8 unchanged, 8 <= 19.9 <= 32
# smoothed, 62.8 and 199 > 32 divided by 8; all three bands are used.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def families():
    """name -> (seed, config class name, model class name, config kwargs)."""
    return {
        "llama3": (1001, "LlamaConfig", "LlamaForCausalLM", dict(
            hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            rope_theta=100.0, rope_scaling=dict(LLAMA3_ROPE), tie_word_embeddings=False,
            rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False)),
        "qwen2": (1002, "Qwen2Config", "Qwen2ForCausalLM", dict(
            hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            rope_theta=1000000.0, tie_word_embeddings=False, use_sliding_window=False,
            rms_norm_eps=1e-6)),
        "qwen3": (1003, "Qwen3Config", "Qwen3ForCausalLM", dict(
            hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            tie_word_embeddings=True, attention_bias=False, rope_theta=1000000.0,
            use_sliding_window=False, rms_norm_eps=1e-6)),
        "mistral": (1004, "MistralConfig", "MistralForCausalLM", dict(
            hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
            sliding_window=4096, tie_word_embeddings=False, rope_theta=10000.0,
            rms_norm_eps=1e-6)),
        "smollm2": (1005, "LlamaConfig", "LlamaForCausalLM", dict(
            hidden_size=48, num_attention_heads=3, num_key_value_heads=1,
            tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
            attention_bias=False, mlp_bias=False)),
    }


def build_model(seed, config_cls, model_cls, kwargs):
    import transformers
    cfg = getattr(transformers, config_cls)(**COMMON, **kwargs)
    model = getattr(transformers, model_cls)(cfg)
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():      # a tied head appears once
            x = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + NORM_STD * x)
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * x)
            else:
                assert p.dim() == 2, name
                p.copy_(WEIGHT_STD * x)
    return model.eval(), gen


def head_dim_of(cfg):
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def check_llama3_bands(cfg):
    """Prints which llama3 band each rotary frequency falls in; asserts all three are used."""
    rp = getattr(cfg, "rope_parameters", None) or cfg.rope_scaling
    hd = head_dim_of(cfg)
    base = rp.get("rope_theta", getattr(cfg, "rope_theta", None))
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    old = rp["original_max_position_embeddings"]
    lo_wl, hi_wl = old / rp["low_freq_factor"], old / rp["high_freq_factor"]
    bands = []
    for f in inv.tolist():
        wl = 2 * math.pi / f
        bands.append("high (unchanged)" if wl < hi_wl else
                     "low (/factor)" if wl > lo_wl else "medium (smoothed)")
    print(f"  llama3 bands: wavelength < {hi_wl} unchanged, > {lo_wl} divided by "
          f"{rp['factor']}, between smoothed")
    for f, b in zip(inv.tolist(), bands):
        print(f"    inv_freq {f:.6f}  wavelength {2 * math.pi / f:9.3f}  {b}")
    assert len(set(bands)) == 3, f"not all three llama3 bands are used: {bands}"


def greedy(model32, model64, cfg, seed):
    """Draws prompts until the float64 top-1/top-2 margins all exceed MIN_MARGIN and the
    continuation holds MIN_DISTINCT different tokens (a repeated token tests less)."""
    from transformers import GenerationConfig
    V = cfg.vocab_size
    for attempt in range(100):
        g = torch.Generator().manual_seed(seed * 1000 + attempt)
        prompt = torch.randint(0, V, (PROMPT_LEN,), generator=g, dtype=torch.int64)
        # No token ends generation: eos_token_id None, so exactly NEW_TOKENS are appended.
        gc = GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=None, do_sample=False,
                              num_beams=1, eos_token_id=None, bos_token_id=None,
                              pad_token_id=0, use_cache=True)
        with torch.no_grad():
            out = model32.generate(prompt[None], attention_mask=torch.ones(1, PROMPT_LEN,
                                   dtype=torch.int64), generation_config=gc)
        assert out.shape == (1, PROMPT_LEN + NEW_TOKENS), out.shape
        assert torch.equal(out[0, :PROMPT_LEN], prompt)
        cont = out[0, PROMPT_LEN:]
        with torch.no_grad():
            lg64 = model64(input_ids=out[:, :-1]).logits[0, PROMPT_LEN - 1:]   # [G, V]
            lg32 = model32(input_ids=out[:, :-1]).logits[0, PROMPT_LEN - 1:]
        top = lg64.topk(2, dim=-1)
        margins = top.values[:, 0] - top.values[:, 1]
        ok = (torch.equal(top.indices[:, 0], cont) and torch.equal(lg32.argmax(-1), cont)
              and margins.min().item() > MIN_MARGIN and len(set(cont.tolist())) >= MIN_DISTINCT)
        print(f"  greedy prompt seed {seed * 1000 + attempt}: prompt {prompt.tolist()} -> "
              f"{cont.tolist()}, min margin {margins.min().item():.4f}"
              + ("" if ok else "  (rejected)"))
        if ok:
            return prompt, cont, seed * 1000 + attempt
    raise AssertionError("no prompt with every greedy margin above %g and %d distinct tokens"
                         % (MIN_MARGIN, MIN_DISTINCT))


def make_family(family, spec, out_root):
    import transformers
    seed, config_cls, model_cls, kwargs = spec
    print(f"== {family}: {config_cls} / {model_cls}, seed {seed}")
    torch.manual_seed(seed)
    model, gen = build_model(seed, config_cls, model_cls, kwargs)
    cfg = model.config
    B, T, V = BATCH_SIZE, SEQ_LEN, cfg.vocab_size
    assert cfg.max_position_embeddings >= 32
    hd = head_dim_of(cfg)
    tied = bool(cfg.tie_word_embeddings)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied

    out_dir = os.path.join(out_root, f"hf_{family}")
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "config.json")) as f:
        cj = json.load(f)
    keys = ["model_type", "architectures", "hidden_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "attention_bias", "sliding_window",
            "use_sliding_window", "tie_word_embeddings", "rope_theta", "rope_scaling",
            "rope_parameters", "rms_norm_eps"]
    for k in keys:
        if k in cj:
            print(f"  config.json {k}: {json.dumps(cj[k])}")
    if family == "llama3":
        check_llama3_bands(cfg)

    # The names save_pretrained wrote are the parameter names (a tied head once).
    from safetensors.torch import load_file
    saved = load_file(os.path.join(out_dir, "model.safetensors"))
    names = [n for n, _ in model.named_parameters()]
    assert sorted(saved) == sorted(names), (sorted(saved), sorted(names))
    for n, p in model.named_parameters():
        assert saved[n].dtype == torch.float32 and torch.equal(saved[n], p.detach()), n

    seq = torch.randint(0, V, (B, T + 1), generator=gen, dtype=torch.int64)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()

    # Rotary tables from the model's own module, float32.
    with torch.no_grad():
        x = torch.zeros(1, T, hd, dtype=torch.float32)
        cos, sin = model.model.rotary_emb(x, torch.arange(T)[None])
    assert cos.dtype == torch.float32 and cos.shape == (1, T, hd), (cos.dtype, cos.shape)
    cos, sin = cos[0].contiguous(), sin[0].contiguous()

    # Logits, loss and gradients in float64.
    model64 = copy.deepcopy(model).to(torch.float64).eval()
    assert (model64.lm_head.weight is model64.model.embed_tokens.weight) == tied
    logits = model64(input_ids=tokens).logits
    assert logits.dtype == torch.float64 and logits.shape == (B, T, V)
    loss = F.cross_entropy(logits.view(-1, V), targets.view(-1))
    loss.backward()
    P64 = dict(model64.named_parameters())
    grads = {n: P64[n].grad.detach().clone() for n in names}
    with torch.no_grad():
        cos64, _ = model64.model.rotary_emb(x.double(), torch.arange(T)[None])
        logits32 = model(input_ids=tokens).logits
    assert torch.equal(cos64[0].float(), cos), "float64 model uses other rotary tables"
    print(f"  loss {loss.item():.8f} (ln V = {math.log(V):.6f}), max |logit| "
          f"{logits.abs().max().item():.6f}, max |logit64 - logit32| "
          f"{(logits - logits32.double()).abs().max().item():.2e}")
    print(f"  rope: head_dim {hd}, cos[1, :] = "
          + " ".join(f"{v:.5f}" for v in cos[1].tolist()))
    for n in names:
        assert torch.isfinite(grads[n]).all(), n
        gmax = grads[n].abs().max().item()
        assert gmax > 1e-8, f"{family}: gradient of {n} is zero everywhere ({gmax})"
    gmin = min(names, key=lambda n: grads[n].abs().max().item())
    print(f"  smallest max|grad| over parameters: {gmin} "
          f"{grads[gmin].abs().max().item():.3e}")

    prompt, cont, prompt_seed = greedy(model, model64, cfg, seed)

    f32 = lambda t: t.detach().to(torch.float32).contiguous()  # noqa: E731
    tensors = [("tokens", tokens.to(torch.int32)), ("targets", targets.to(torch.int32))]
    tensors += [(n, f32(saved[n])) for n in names]
    tensors += [("logits", f32(logits)), ("loss", f32(loss).reshape(()))]
    tensors += [("grad." + n, f32(grads[n])) for n in names]
    tensors += [("rope.cos", f32(cos)), ("rope.sin", f32(sin))]
    tensors += [("greedy.prompt", prompt.to(torch.int32)),
                ("greedy.continuation", cont.to(torch.int32))]
    for n, t in tensors:
        if t.is_floating_point():
            assert torch.isfinite(t).all(), f"{family}: {n} not finite"
    metadata = {
        "family": family, "batch_size": str(B), "seq_len": str(T),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "config_class": config_cls, "model_class": model_cls, "seed": str(seed),
        "greedy_prompt_seed": str(prompt_seed), "greedy_min_margin": repr(MIN_MARGIN),
        "generator": "tools/make_hf_family_fixtures.py", "format": "pt",
    }
    path = os.path.join(out_dir, "reference.safetensors")
    write_safetensors(path, tensors, metadata)
    back, meta = read_safetensors(path)
    assert meta == metadata and list(back.keys()) == [n for n, _ in tensors]
    for n, t in tensors:
        assert torch.equal(back[n], t), n
    files = sorted(os.listdir(out_dir))
    print(f"  wrote {out_dir}: " + ", ".join(
        f"{f} ({os.path.getsize(os.path.join(out_dir, f))} bytes)" for f in files))
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output-dir", default="tests/fixtures")
    ap.add_argument("--family", action="append", choices=sorted(families()),
                    help="only this family (repeatable); all five by default")
    args = ap.parse_args()

    import transformers
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    fams = families()
    for family in args.family or list(fams):
        make_family(family, fams[family], args.output_dir)


if __name__ == "__main__":
    main()
