#!/usr/bin/env python3
"""Ask a checkpoint a question through its chat template: the reply `tandem sample` gives.

    python3 tools/chat.py --checkpoint runs/tiny-chat-finetune "Speak, speak."

The checkpoint (a tandem checkpoint of a run from train.init_from, which carries the model's
tokenizer.json and tokenizer_config.json, or any directory with both beside a tandem
checkpoint named by --tokenizer-dir) renders the conversation with its own chat_template
(tokenize_bpe.py's ChatTemplate: jinja2, as transformers' apply_chat_template does, with
the generation prompt), encodes it with its tokenizer, and `tandem sample --checkpoint ... --prompt-tokens ...` continues it;
the reply is printed up to the template's end-of-turn token (the tokenizer config's
eos_token). --temperature 0 (the default) is greedy.

Needs the tokenizers and jinja2 packages (python3 -m pip install tokenizers jinja2).
"""

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenize_bpe import ChatTemplate, HuggingFaceSource, ToolError  # noqa: E402


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
        config_path = os.path.join(tokenizer_dir, "tokenizer_config.json")
        source = HuggingFaceSource(os.path.join(tokenizer_dir, "tokenizer.json"))
        template = ChatTemplate(config_path, None, source)
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.message}]
        prompt = template.render(messages, "the message", add_generation_prompt=True)
        ids = source.tok.encode(prompt, add_special_tokens=False).ids
        command = [args.tandem, "sample", "--checkpoint", args.checkpoint, "--prompt-tokens",
                   ",".join(map(str, ids)), "--tokens", str(args.tokens), "--temperature",
                   str(args.temperature), "--seed", str(args.seed)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise ToolError(f"tandem sample failed: {done.stderr.strip()}")
        reply = [int(x) for x in done.stdout.split()]
        end = template.kwargs.get("eos_token")  # the end of a turn
        end_id = source.tok.token_to_id(end) if isinstance(end, str) else None
        if end_id is not None and end_id in reply:
            reply = reply[:reply.index(end_id)]
        print(source.tok.decode(reply, skip_special_tokens=False))
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
