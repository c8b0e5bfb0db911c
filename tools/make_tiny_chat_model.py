#!/usr/bin/env python3
"""Make a tiny chat model to fine-tune: a Hugging Face model directory of a Qwen3 with
random weights, its byte-level BPE tokenizer with a ChatML chat template, and chats made
from the bundled Tiny Shakespeare, so that the README's fine-tuning commands run as pasted
on any machine (no download, no torch).

    python3 tools/make_tiny_chat_model.py --output runs/tiny-chat

writes into --output:

    model/config.json, model/model.safetensors   a Qwen3ForCausalLM (transformers loads it):
        2 layers, hidden 64, 4 query heads on 2 key/value heads of head_dim 16 (q/k norms),
        SwiGLU of 192, a tied head, vocabulary 1024; weights N(0, 0.02), norms 1
    model/tokenizer.json          a byte-level BPE (GPT-2's pre-tokenizer) trained here on
                                  data/tinyshakespeare.txt, with <|endoftext|>,
                                  <|im_start|> and <|im_end|>
    model/tokenizer_config.json   the ChatML chat_template (Qwen's), eos <|im_end|>
    model/special_tokens_map.json
    chats.jsonl                   {"messages": [user: a speech of the play, assistant: the
                                  speech that answers it]} for each pair of speeches

Deterministic (--seed). Needs the tokenizers package (python3 -m pip install tokenizers).
"""

import argparse
import array
import json
import math
import os
import random
import struct
import sys

VOCAB_SIZE = 1024
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 192
CONTEXT = 256
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def root():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def train_tokenizer(text, out_dir):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        sys.exit("make_tiny_chat_model: needs the tokenizers package: "
                 f"{sys.executable} -m pip install tokenizers")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIAL_TOKENS)
    tok.train_from_iterator([text], trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
              "bos_token": None, "model_max_length": CONTEXT, **special}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return tok


def hf_config(tok):
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "vocab_size": VOCAB_SIZE, "max_position_embeddings": CONTEXT,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
            "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
            "sliding_window": None, "max_window_layers": LAYERS, "tie_word_embeddings": True,
            "initializer_range": 0.02, "torch_dtype": "float32",
            "bos_token_id": None, "eos_token_id": tok.token_to_id("<|im_end|>"),
            "pad_token_id": tok.token_to_id("<|endoftext|>")}


def tensors():
    """(name, shape, kind) in Hugging Face's order; kind "w" (a matrix) or "norm"."""
    C, Q, KV, I = HIDDEN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, INTERMEDIATE
    out = [("model.embed_tokens.weight", (VOCAB_SIZE, C), "w")]
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (C,), "norm"),
                (p + "self_attn.q_proj.weight", (Q, C), "w"),
                (p + "self_attn.k_proj.weight", (KV, C), "w"),
                (p + "self_attn.v_proj.weight", (KV, C), "w"),
                (p + "self_attn.q_norm.weight", (HEAD_DIM,), "norm"),
                (p + "self_attn.k_norm.weight", (HEAD_DIM,), "norm"),
                (p + "self_attn.o_proj.weight", (C, Q), "w"),
                (p + "post_attention_layernorm.weight", (C,), "norm"),
                (p + "mlp.gate_proj.weight", (I, C), "w"),
                (p + "mlp.up_proj.weight", (I, C), "w"),
                (p + "mlp.down_proj.weight", (C, I), "w")]
    return out + [("model.norm.weight", (C,), "norm")]


def write_weights(path, seed):
    """model.safetensors: F32 little-endian, header with dtype, shape and offsets."""
    rng = random.Random(seed)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape, kind in tensors():
        n = math.prod(shape)
        values = array.array("f", [1.0] * n if kind == "norm"
                             else [rng.gauss(0.0, 0.02) for _ in range(n)])
        if sys.byteorder != "little":
            values.byteswap()
        data = values.tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for data in blobs:
            f.write(data)
    os.replace(tmp, path)


def write_chats(text, path):
    """A speech (the speaker's name and lines) and the speech that answers it, for each pair
    of consecutive speeches."""
    speeches = [block.strip() for block in text.split("\n\n") if block.strip()]
    count = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for user, assistant in zip(speeches[0::2], speeches[1::2]):
            record = {"messages": [{"role": "user", "content": user},
                                   {"role": "assistant", "content": assistant}]}
            f.write(json.dumps(record) + "\n")
            count += 1
    os.replace(path + ".tmp", path)
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="directory to write into")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--text", default=os.path.join(root(), "data", "tinyshakespeare.txt"))
    args = parser.parse_args()
    model_dir = os.path.join(args.output, "model")
    os.makedirs(model_dir, exist_ok=True)
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    tok = train_tokenizer(text, model_dir)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(hf_config(tok), f, indent=2)
    write_weights(os.path.join(model_dir, "model.safetensors"), args.seed)
    chats = write_chats(text, os.path.join(args.output, "chats.jsonl"))
    print(f"make_tiny_chat_model: {model_dir} (a Qwen3 of "
          f"{sum(math.prod(shape) for _, shape, _ in tensors()):,} parameters, "
          f"tokenizer of {tok.get_vocab_size()} ids) and {chats} chats in "
          f"{os.path.join(args.output, 'chats.jsonl')}")


if __name__ == "__main__":
    main()
