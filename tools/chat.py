#!/usr/bin/env python3
"""Ask a checkpoint a question through its chat template: the reply `tandem sample` gives.

    python3 tools/chat.py --checkpoint runs/tiny-chat-finetune "Speak, speak."

The checkpoint (a tandem checkpoint of a run from train.init_from, which carries the model's
tokenizer.json and tokenizer_config.json, or any directory with both beside a tandem
checkpoint named by --tokenizer-dir) renders the conversation with its own chat_template
(jinja2, as transformers' apply_chat_template does, with the generation prompt), encodes it
with its tokenizer, and `tandem sample --checkpoint ... --prompt-tokens ...` continues it;
the reply is printed up to the template's end-of-turn token (the tokenizer config's
eos_token). --temperature 0 (the default) is greedy.

Needs the tokenizers and jinja2 packages (python3 -m pip install tokenizers jinja2).
"""

import argparse
import json
import os
import subprocess
import sys


class ToolError(Exception):
    """A one-line message for the user: what was wrong and how to fix it."""


def load_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ToolError(f"{path}: no {what}; the checkpoint of a run from train.init_from "
                        f"carries the model's (or name a directory with --tokenizer-dir)")
    except json.JSONDecodeError as e:
        raise ToolError(f"{path}: not JSON ({e})")


def render(config, messages):
    try:
        import jinja2.sandbox
    except ImportError:
        raise ToolError(f"needs jinja2: {sys.executable} -m pip install jinja2")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise ToolError("tokenizer_config.json has no chat_template")

    def raise_exception(message):
        raise ToolError(f"the chat template refused the conversation: {message}")

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            **special)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message", help="what the user says")
    parser.add_argument("--checkpoint", required=True,
                        help="a checkpoint dir, a checkpoints dir or a run dir")
    parser.add_argument("--tokenizer-dir", help="where tokenizer.json and tokenizer_config.json "
                        "are (default: the checkpoint's newest checkpoint directory)")
    parser.add_argument("--system", help="a system message first")
    parser.add_argument("--tokens", type=int, default=64, help="tokens to generate at most")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tandem", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "build", "tandem"))
    args = parser.parse_args()
    try:
        tokenizer_dir = args.tokenizer_dir or newest_checkpoint(args.checkpoint)
        config = load_json(os.path.join(tokenizer_dir, "tokenizer_config.json"),
                           "tokenizer_config.json")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ToolError(f"needs tokenizers: {sys.executable} -m pip install tokenizers")
        tokenizer_json = os.path.join(tokenizer_dir, "tokenizer.json")
        if not os.path.exists(tokenizer_json):
            raise ToolError(f"{tokenizer_json}: no tokenizer.json")
        tok = Tokenizer.from_file(tokenizer_json)
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.message}]
        prompt = render(config, messages)
        ids = tok.encode(prompt, add_special_tokens=False).ids
        command = [args.tandem, "sample", "--checkpoint", args.checkpoint, "--prompt-tokens",
                   ",".join(map(str, ids)), "--tokens", str(args.tokens), "--temperature",
                   str(args.temperature), "--seed", str(args.seed)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise ToolError(f"tandem sample failed: {done.stderr.strip()}")
        reply = [int(x) for x in done.stdout.split()]
        end = config.get("eos_token")
        end_id = tok.token_to_id(end) if isinstance(end, str) else None
        if end_id is not None and end_id in reply:
            reply = reply[:reply.index(end_id)]
        print(tok.decode(reply, skip_special_tokens=False))
    except ToolError as e:
        print(f"chat.py: {e}", file=sys.stderr)
        sys.exit(1)


def newest_checkpoint(path):
    """The checkpoint directory a checkpoint, checkpoints or run directory names (as tandem
    sample resolves it: manifest.json, latest, checkpoints/latest)."""
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    for latest in (os.path.join(path, "latest"), os.path.join(path, "checkpoints", "latest")):
        if os.path.exists(latest):
            with open(latest, encoding="utf-8") as f:
                return os.path.join(os.path.dirname(latest), f.read().strip())
    raise ToolError(f"{path}: not a checkpoint (no manifest.json, latest or checkpoints/latest)")


if __name__ == "__main__":
    main()
