#!/usr/bin/env python3
"""How fast tools/tokenize_bpe.py tokenizes JSON lines, against the tokenizer library alone.

    python3 bench/tokenize_jsonl_bench.py [--mb 100] [--small-mb 25] [--rounds 2]
                                          [--kind text|pair] [--vocab 2048] [--keep DIR]

Makes, in a temporary directory (--keep DIR: there, and kept), a byte-level BPE of --vocab
ids trained by the tokenizers package on data/tinyshakespeare.txt (as
tests/runs/tokenize_bpe_helper.py trains one), and a JSON lines file of about --mb MB:
records {"text": ...} of slices of the play (200 to 4,000 characters from random places,
seeded), or with --kind pair {"prompt": ..., "completion": ...} of the same slices cut at a
newline. Then, in alternating rounds (--rounds, the best of each side reported; the machine
may be shared):

  tool      tokenize_bpe.py --tokenizer ... --quiet on the file, in a child process, timed
            from start to exit (reading, JSON parsing, encoding, writing the shard and, for
            pairs, its mask): its peak resident memory is the child's ru_maxrss (os.wait4);
  library   the same texts, already in memory, through Tokenizer.encode_batch (and
            encode_batch_fast, which the tool uses where it exists) in batches of 2 MiB of
            text as the tool makes them (--library-batch-mb to try others), .ids taken from
            each encoding; only the calls are timed.

MB/s is of the records' text (UTF-8 bytes, the JSON's keys and escapes not counted) per
second, for both sides. For text records the tool's shard is checked to hold exactly the
library's ids. The tool runs once more on a --small-mb file: peak memory at both sizes
shows whether it grows with the input (the goal: bounded by the batch and shard, not the
input). Needs the tokenizers package.
"""

import argparse
import array
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "tokenize_bpe.py")
BATCH_BYTES = 2 << 20  # tokenize_bpe.py's RECORD_BATCH_BYTES: the records' text per batch


def train_tokenizer(path, vocab, text):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator([text], trainer=trainer)
    tok.save(path)
    return tok


def make_jsonl(path, mb, kind, text, seed):
    """Writes records until the file holds mb MB; returns the texts' UTF-8 bytes."""
    rng = random.Random(seed)
    target, size, text_bytes = mb * 1_000_000, 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            n = rng.randint(200, 4000)
            start = rng.randrange(0, len(text) - n)
            piece = text[start:start + n]
            if kind == "pair":
                cut = piece.find("\n", len(piece) // 2) + 1 or len(piece) // 2
                record = {"prompt": piece[:cut], "completion": piece[cut:] or "."}
                text_bytes += len((record["prompt"] + record["completion"]).encode("utf-8"))
            else:
                record = {"text": piece}
                text_bytes += len(piece.encode("utf-8"))
            line = json.dumps(record, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode("utf-8"))
    return text_bytes


# Starts the tool and prints its exit status and ru_maxrss. Linux carries the peak of the
# memory a process had before exec into its ru_maxrss, and posix_spawn (like vfork) runs
# the child in its parent's memory until exec: started from this benchmark, which holds the
# texts, the tool would be charged for them. This small launcher's own peak (VmHWM, which
# exec resets) is printed too: the floor of the figure.
LAUNCHER = """
import os, sys
pid = os.posix_spawn(sys.executable, [sys.executable] + sys.argv[1:], os.environ)
_, status, usage = os.wait4(pid, 0)
with open("/proc/self/status") as f:  # VmHWM: this process's own peak since its exec
    own = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, own)
"""


def run_tool(tokenizer, jsonl, out):
    """Seconds, the tool's peak resident bytes, and the launcher's (the floor of that)."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", LAUNCHER, TOOL, "--tokenizer", tokenizer,
                          "--output-dir", out, "--quiet", jsonl], capture_output=True)
    seconds = time.perf_counter() - start
    try:
        status, peak, floor = map(int, run.stdout.split())
    except ValueError:
        status = -1
    if run.returncode != 0 or status != 0:
        sys.exit(f"tokenize_jsonl_bench: the tool failed: {run.stderr.decode(errors='replace')}")
    return seconds, peak * 1024, floor * 1024  # ru_maxrss is KiB on Linux


def batches(texts, batch_bytes):
    batch, size = [], 0
    for t in texts:
        batch.append(t)
        size += len(t)
        if size >= batch_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def run_library(tok, texts, method, batch_bytes):
    encode = getattr(tok, method)
    digest, tokens = hashlib.sha256(), 0
    seconds = 0.0
    for batch in batches(texts, batch_bytes):
        start = time.perf_counter()
        ids = [e.ids for e in encode(batch, add_special_tokens=False)]
        seconds += time.perf_counter() - start
        for one in ids:
            digest.update(array.array("H", one).tobytes())
            tokens += len(one)
    return seconds, digest.hexdigest(), tokens


def shard_digest(out, name):
    path = os.path.join(out, f"{name}_train_000000.bin")
    with open(path, "rb") as f:
        f.seek(1024)
        return hashlib.sha256(f.read()).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="JSON lines MB (default 100)")
    parser.add_argument("--small-mb", type=float, default=25.0,
                        help="a second, smaller input for the memory comparison (0: none)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kind", choices=("text", "pair"), default="text")
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--library-batch-mb", type=float, default=BATCH_BYTES / 2**20,
                        help="MiB of text per encode_batch call of the library side (default "
                             "2, the tool's)")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it")
    args = parser.parse_args()
    try:
        import tokenizers
    except ImportError:
        sys.exit(f"tokenize_jsonl_bench: needs tokenizers: {sys.executable} -m pip install "
                 f"tokenizers")
    work = args.keep or tempfile.mkdtemp(prefix="tokenize_jsonl_bench.")
    os.makedirs(work, exist_ok=True)
    try:
        with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
            play = f.read()
        tokenizer = os.path.join(work, "tokenizer.json")
        tok = train_tokenizer(tokenizer, args.vocab, play)
        jsonl = os.path.join(work, "data.jsonl")
        text_bytes = make_jsonl(jsonl, args.mb, args.kind, play, args.seed)
        file_bytes = os.path.getsize(jsonl)
        texts = []
        with open(jsonl, encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                texts.append(record["text"] if args.kind == "text"
                             else record["prompt"] + record["completion"])
        out = os.path.join(work, "out")
        has_fast = hasattr(tok, "encode_batch_fast")
        tool_s, lib_s, fast_s, peak, floor = [], [], [], 0, 0
        for r in range(args.rounds):
            seconds, rss, floor = run_tool(tokenizer, jsonl, out)
            tool_s.append(seconds)
            peak = max(peak, rss)
            batch_bytes = int(args.library_batch_mb * 2**20)
            seconds, digest, tokens = run_library(tok, texts, "encode_batch", batch_bytes)
            lib_s.append(seconds)
            if has_fast:
                fast_s.append(run_library(tok, texts, "encode_batch_fast", batch_bytes)[0])
            print(f"round {r + 1}: tool {tool_s[-1]:.2f} s, encode_batch {lib_s[-1]:.2f} s"
                  + (f", encode_batch_fast {fast_s[-1]:.2f} s" if has_fast else ""), flush=True)
        if args.kind == "text":
            same = shard_digest(out, "data") == digest
            print(f"the tool's shard holds the library's {tokens:,} ids: "
                  f"{'yes' if same else 'NO'}")
            if not same:
                sys.exit(1)
        mb = text_bytes / 1e6
        tool, lib = mb / min(tool_s), mb / min(lib_s)
        print(f"input: {file_bytes / 1e6:.1f} MB of JSON lines ({args.kind} records), "
              f"{mb:.1f} MB of text, {tokens:,} tokens, vocabulary {args.vocab}, "
              f"{os.cpu_count()} CPUs, tokenizers {tokenizers.__version__}")
        print(f"tool (tokenize_bpe.py, the whole run): {tool:.2f} MB/s")
        print(f"library encode_batch (text in memory, {args.library_batch_mb:g} MiB batches): "
              f"{lib:.2f} MB/s; tool / library = {tool / lib:.2f}")
        if has_fast:
            fast = mb / min(fast_s)
            print(f"library encode_batch_fast (the same): {fast:.2f} MB/s; tool / library = "
                  f"{tool / fast:.2f}")
        print(f"tool peak resident memory: {peak / 2**20:.0f} MiB for {file_bytes / 2**20:.0f} "
              f"MiB of input (ru_maxrss; its launcher's own: {floor / 2**20:.0f} MiB)")
        if args.small_mb > 0:
            small = os.path.join(work, "small.jsonl")
            make_jsonl(small, args.small_mb, args.kind, play, args.seed + 1)
            _, small_peak, _ = run_tool(tokenizer, small, os.path.join(work, "out-small"))
            print(f"tool peak resident memory: {small_peak / 2**20:.0f} MiB for "
                  f"{os.path.getsize(small) / 2**20:.0f} MiB of input")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
