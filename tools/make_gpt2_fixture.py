#!/usr/bin/env python3
"""Generate tests/fixtures/gpt2_tiny.safetensors: a reference for tandem's GPT-2.

A tiny GPT-2 (Hugging Face GPT2LMHeadModel semantics, written out by hand in
PyTorch, independent of tandem's C++ code) is evaluated in float64 on one fixed
random batch.  The file holds the batch, the initial parameters (HF names, HF
layout), the logits, the loss, d(loss)/d(param) for every parameter, and the
parameters after 3 steps of torch.optim.AdamW with global-norm gradient
clipping.  Tensors are stored as F32 (token ids as I32); all hyper-parameters
are in the safetensors "__metadata__".

The F32 values written for the initial parameters are exactly the values the
float64 computation starts from (they are rounded to float32 first), so a C++
engine that loads them sees the same model.

Usage:  python3 tools/make_gpt2_fixture.py [--output PATH]
Needs:  pip install torch   (CPU only; numpy is not required)
The output is deterministic: running twice gives a byte-identical file.
"""

import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------
# hyper-parameters

SEED = 1337
VOCAB_SIZE = 64        # V
CONTEXT_LENGTH = 16    # maxT (rows of wpe)
N_LAYER = 2            # L
N_HEAD = 4             # NH
N_EMBD = 32            # C  (head size hs = C / NH = 8)
BATCH_SIZE = 2         # B
SEQ_LEN = 12           # T  (< maxT on purpose: exercises T < context length)
LN_EPS = 1e-5

LR = 1e-2
BETA1 = 0.9
BETA2 = 0.95
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
MAX_NORM = 1.0         # checked below: below every pre-clip norm, so clipping triggers each step
ADAMW_STEPS = 3

INIT_STD = 0.1         # weights N(0, 0.1), biases N(0, 0.1), LN weight 1 + N(0, 0.1), LN bias N(0, 0.1)

DT = torch.float64


# ----------------------------------------------------------------------------
# parameters (Hugging Face names and layouts; Conv1D weights are [in, out])

def param_specs():
    """(name, shape, kind) in Hugging Face state_dict order. kind: 'w', 'b', 'lnw', 'lnb'."""
    V, maxT, C = VOCAB_SIZE, CONTEXT_LENGTH, N_EMBD
    specs = [("transformer.wte.weight", (V, C), "w"),
             ("transformer.wpe.weight", (maxT, C), "w")]
    for i in range(N_LAYER):
        p = f"transformer.h.{i}."
        specs += [
            (p + "ln_1.weight", (C,), "lnw"),
            (p + "ln_1.bias", (C,), "lnb"),
            (p + "attn.c_attn.weight", (C, 3 * C), "w"),
            (p + "attn.c_attn.bias", (3 * C,), "b"),
            (p + "attn.c_proj.weight", (C, C), "w"),
            (p + "attn.c_proj.bias", (C,), "b"),
            (p + "ln_2.weight", (C,), "lnw"),
            (p + "ln_2.bias", (C,), "lnb"),
            (p + "mlp.c_fc.weight", (C, 4 * C), "w"),
            (p + "mlp.c_fc.bias", (4 * C,), "b"),
            (p + "mlp.c_proj.weight", (4 * C, C), "w"),
            (p + "mlp.c_proj.bias", (C,), "b"),
        ]
    specs += [("transformer.ln_f.weight", (C,), "lnw"),
              ("transformer.ln_f.bias", (C,), "lnb")]
    return specs


def init_params(gen):
    params = {}
    for name, shape, kind in param_specs():
        x = torch.randn(shape, generator=gen, dtype=DT) * INIT_STD
        if kind == "lnw":
            x = x + 1.0
        # round to float32 so the stored F32 values are exactly the starting point
        params[name] = x.to(torch.float32).to(DT).requires_grad_(True)
    return params


# ----------------------------------------------------------------------------
# the model, written out by hand

def layer_norm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)      # biased variance
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    # GPT-2's gelu_new
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def conv1d(x, w, b):
    # Hugging Face Conv1D: y = x @ w + b, w is [in, out]
    return x @ w + b


def attention(x, P, p):
    B, T, C = x.shape
    NH, hs = N_HEAD, C // N_HEAD
    qkv = conv1d(x, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])   # [B,T,3C]
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    # head h = columns h*hs:(h+1)*hs of each chunk
    q = q.reshape(B, T, NH, hs).transpose(1, 2)                                # [B,NH,T,hs]
    k = k.reshape(B, T, NH, hs).transpose(1, 2)
    v = v.reshape(B, T, NH, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))                   # [B,NH,T,T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf"))
    att = torch.softmax(att, dim=-1)
    y = att @ v                                                                # [B,NH,T,hs]
    y = y.transpose(1, 2).reshape(B, T, C)
    return conv1d(y, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])


def mlp(x, P, p):
    h = gelu_tanh(conv1d(x, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]))
    return conv1d(h, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])


def forward(P, tokens, targets):
    B, T = tokens.shape
    pos = torch.arange(T)
    x = P["transformer.wte.weight"][tokens] + P["transformer.wpe.weight"][pos]
    for i in range(N_LAYER):
        p = f"transformer.h.{i}."
        x = x + attention(layer_norm(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"]), P, p)
        x = x + mlp(layer_norm(x, P[p + "ln_2.weight"], P[p + "ln_2.bias"]), P, p)
    x = layer_norm(x, P["transformer.ln_f.weight"], P["transformer.ln_f.bias"])
    logits = x @ P["transformer.wte.weight"].t()                              # tied LM head
    logp = torch.log_softmax(logits, dim=-1)
    loss = -logp.gather(-1, targets.unsqueeze(-1)).mean()                     # mean over B*T
    return logits, loss


def forward_torch_builtin(P, tokens, targets):
    """Same model from torch's own building blocks (self-check only)."""
    B, T = tokens.shape
    C, NH = N_EMBD, N_HEAD
    x = F.embedding(tokens, P["transformer.wte.weight"]) + F.embedding(torch.arange(T), P["transformer.wpe.weight"])
    for i in range(N_LAYER):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], LN_EPS)
        qkv = F.linear(h, P[p + "attn.c_attn.weight"].t(), P[p + "attn.c_attn.bias"])
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + F.linear(y, P[p + "attn.c_proj.weight"].t(), P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], LN_EPS)
        h = F.gelu(F.linear(h, P[p + "mlp.c_fc.weight"].t(), P[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(h, P[p + "mlp.c_proj.weight"].t(), P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], LN_EPS)
    logits = F.linear(x, P["transformer.wte.weight"])
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
    return logits, loss


# ----------------------------------------------------------------------------
# safetensors, by hand (no numpy, no safetensors package)

_DTYPES = {torch.float32: ("F32", "f", 4), torch.int32: ("I32", "i", 4)}


def _tensor_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    code, fmt, _ = _DTYPES[t.dtype]
    return struct.pack("<%d%s" % (t.numel(), fmt), *t.tolist())


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, tensor) in file order; metadata: dict str->str."""
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, t in tensors:
        code = _DTYPES[t.dtype][0]
        data = _tensor_bytes(t)
        header[name] = {"dtype": code, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)            # pad with spaces to a multiple of 8
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for data in blobs:
            f.write(data)
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    assert n % 8 == 0, "header size not a multiple of 8"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    out = {}
    end_max = 0
    for name, info in header.items():
        a, b = info["data_offsets"]
        end_max = max(end_max, b)
        fmt = {"F32": "f", "I32": "i"}[info["dtype"]]
        dtype = {"F32": torch.float32, "I32": torch.int32}[info["dtype"]]
        count = (b - a) // 4
        assert count == math.prod(info["shape"]), name
        vals = struct.unpack_from("<%d%s" % (count, fmt), data, a)
        out[name] = torch.tensor(vals, dtype=dtype).reshape(info["shape"])
    assert end_max == len(data), "data section size mismatch"
    return out, metadata


# ----------------------------------------------------------------------------

def check_close(what, a, b, tol=1e-10):
    err = (a - b).abs().max().item()
    assert err <= tol, f"self-check failed: {what}: max abs err {err:g} > {tol:g}"
    print(f"  ok  {what:<44s} max abs err {err:.2e}")


def check_finite_differences(loss_of, P, grads, seed):
    """Central finite differences (h = 1e-6, float64) of loss_of() at two random entries of
    every parameter P[name] against the autograd gradient grads[name]; asserts 1e-7."""
    fd_gen = torch.Generator().manual_seed(seed)
    max_err = 0.0
    with torch.no_grad():
        for n in grads:
            flat = P[n].view(-1)
            for idx in torch.randint(0, flat.numel(), (2,), generator=fd_gen).tolist():
                h = 1e-6
                old = flat[idx].item()
                flat[idx] = old + h
                lp = loss_of()
                flat[idx] = old - h
                lm = loss_of()
                flat[idx] = old
                fd = (lp - lm) / (2 * h)
                max_err = max(max_err, abs(fd - grads[n].view(-1)[idx].item()))
    assert max_err < 1e-7, f"finite-difference check failed: {max_err:g}"
    print(f"  ok  {'grads vs central finite differences':<44s} max abs err {max_err:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", default="tests/fixtures/gpt2_tiny.safetensors")
    args = ap.parse_args()

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)       # keep reductions in a fixed order
    gen = torch.Generator().manual_seed(SEED)

    B, T, V = BATCH_SIZE, SEQ_LEN, VOCAB_SIZE
    assert T <= CONTEXT_LENGTH and N_EMBD % N_HEAD == 0

    P = init_params(gen)
    names = [n for n, _, _ in param_specs()]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    init = {n: P[n].detach().clone() for n in names}

    # ---- forward / backward
    logits, loss = forward(P, tokens, targets)
    grads = torch.autograd.grad(loss, [P[n] for n in names])
    grads = dict(zip(names, grads))
    print(f"loss = {loss.item():.10f}   (ln V = {math.log(V):.6f})")

    # ---- self-checks of the hand-written model
    print("self-checks:")
    logits2, loss2 = forward_torch_builtin(P, tokens, targets)
    check_close("logits vs F.sdpa/F.layer_norm/F.gelu model", logits, logits2)
    check_close("loss vs F.cross_entropy model", loss, loss2)
    grads2 = dict(zip(names, torch.autograd.grad(loss2, [P[n] for n in names])))
    check_close("grads vs torch-builtin model", torch.cat([grads[n].flatten() for n in names]),
                torch.cat([grads2[n].flatten() for n in names]))
    check_finite_differences(lambda: forward(P, tokens, targets)[1].item(), P, grads, SEED + 1)
    try:  # optional: compare with Hugging Face itself when it is installed
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=V, n_positions=CONTEXT_LENGTH, n_embd=N_EMBD, n_layer=N_LAYER,
                         n_head=N_HEAD, activation_function="gelu_new", layer_norm_epsilon=LN_EPS,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=None, eos_token_id=None)
        hf = GPT2LMHeadModel(cfg).to(DT).eval()
        sd = {n: init[n] for n in names}
        sd["lm_head.weight"] = init["transformer.wte.weight"]
        missing, _ = hf.load_state_dict(sd, strict=False)
        assert not [m for m in missing if not m.endswith(".attn.bias") and not m.endswith("masked_bias")], missing
        with torch.no_grad():
            out = hf(tokens, labels=None)
        hf_logits = out.logits
        hf_loss = F.cross_entropy(hf_logits.reshape(-1, V), targets.reshape(-1))
        check_close("logits vs transformers.GPT2LMHeadModel", logits, hf_logits)
        check_close("loss vs transformers.GPT2LMHeadModel", loss, hf_loss)
    except ImportError:
        print("  --  transformers not installed: skipped the GPT2LMHeadModel comparison")

    # ---- 3 steps of AdamW with global-norm clipping, on the same batch
    params = [P[n] for n in names]
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    assert len(decay) == 2 + 4 * N_LAYER
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
    check_close("step-1 pre-clip norm == ||grad||", torch.tensor(norms[0], dtype=DT),
                torch.cat([grads[n].flatten() for n in names]).norm())
    assert min(norms) > MAX_NORM, (f"clipping must trigger every step: max_norm {MAX_NORM} "
                                   f">= min pre-clip norm {min(norms)}")
    print(f"max_norm = {MAX_NORM}  (min pre-clip norm {min(norms):.6f}: clipping triggered every step)")
    # self-check: replay the 3 steps with AdamW and clipping written out by hand
    # (the exact formulas an engine must implement to match this fixture)
    Q = {n: init[n].clone().requires_grad_(True) for n in names}
    m = {n: torch.zeros_like(init[n]) for n in names}
    v = {n: torch.zeros_like(init[n]) for n in names}
    for step in range(1, ADAMW_STEPS + 1):
        _, l = forward(Q, tokens, targets)
        g = dict(zip(names, torch.autograd.grad(l, [Q[n] for n in names])))
        gnorm = torch.sqrt(sum((g[n] ** 2).sum() for n in names))
        coef = min(1.0, MAX_NORM / (gnorm.item() + 1e-6))   # torch's clip_grad_norm_ formula
        with torch.no_grad():
            for n in names:
                gi = g[n] * coef
                wd = WEIGHT_DECAY if Q[n].dim() >= 2 else 0.0
                Q[n].mul_(1.0 - LR * wd)                      # decoupled weight decay first
                m[n].mul_(BETA1).add_((1 - BETA1) * gi)
                v[n].mul_(BETA2).add_((1 - BETA2) * gi * gi)
                mhat = m[n] / (1 - BETA1 ** step)
                denom = torch.sqrt(v[n]) / math.sqrt(1 - BETA2 ** step) + ADAM_EPS
                Q[n].sub_(LR * mhat / denom)
    check_close("adamw3 vs hand-written AdamW + clipping", torch.cat([Q[n].detach().flatten() for n in names]),
                torch.cat([P[n].detach().flatten() for n in names]), tol=1e-10)
    with torch.no_grad():
        _, loss_after = forward(P, tokens, targets)
    print(f"loss after {ADAMW_STEPS} steps = {loss_after.item():.10f}")

    # ---- write
    f32 = lambda t: t.detach().to(torch.float32)
    tensors = [("tokens", tokens.to(torch.int32)), ("targets", targets.to(torch.int32))]
    tensors += [(n, f32(init[n])) for n in names]
    tensors += [("logits", f32(logits)), ("loss", f32(loss).reshape(()))]
    tensors += [("grad." + n, f32(grads[n])) for n in names]
    tensors += [("adamw3." + n, f32(P[n])) for n in names]
    tensors += [(f"grad_norm.step{i + 1}", torch.tensor(v, dtype=torch.float32).reshape(()))
                for i, v in enumerate(norms)]
    metadata = {
        "vocab_size": str(VOCAB_SIZE), "context_length": str(CONTEXT_LENGTH),
        "n_layer": str(N_LAYER), "n_head": str(N_HEAD), "n_embd": str(N_EMBD),
        "batch_size": str(B), "seq_len": str(T), "layer_norm_eps": repr(LN_EPS),
        "lr": repr(LR), "beta1": repr(BETA1), "beta2": repr(BETA2), "eps": repr(ADAM_EPS),
        "weight_decay": repr(WEIGHT_DECAY), "max_norm": repr(MAX_NORM),
        "adamw_steps": str(ADAMW_STEPS), "seed": str(SEED), "init_std": repr(INIT_STD),
        "torch_version": torch.__version__,
        "generator": "tools/make_gpt2_fixture.py",
        "format": "pt",
    }
    out_dir = os.path.dirname(args.output)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    write_safetensors(args.output, tensors, metadata)

    # ---- read back and compare
    back, meta = read_safetensors(args.output)
    assert meta == metadata
    assert list(back.keys()) == [n for n, _ in tensors]
    for n, t in tensors:
        assert back[n].dtype == t.dtype and tuple(back[n].shape) == tuple(t.shape), n
        assert torch.equal(back[n], t), n
    assert back["loss"].shape == () and back["tokens"].dtype == torch.int32
    check_close("read-back loss vs float64 loss", back["loss"].to(DT), loss.detach(), tol=1e-6)
    check_close("read-back logits vs float64 logits", back["logits"].to(DT), logits.detach(), tol=1e-5)
    size = os.path.getsize(args.output)
    print(f"wrote {args.output}: {len(tensors)} tensors, {size} bytes")
    assert size < 1 << 20


if __name__ == "__main__":
    sys.exit(main())
