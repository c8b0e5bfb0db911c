#!/usr/bin/env python3
"""Tokenize text files with a byte-level BPE into llm.c token shards for `tandem train`.

    python3 tools/tokenize_bpe.py --tiktoken gpt2 --output-dir data/gpt2 input.txt [more.txt ...]
    python3 tools/tokenize_bpe.py --tokenizer tokenizer.json --output-dir data/mine input.txt

Each input file is one document of UTF-8 text; --eot puts the end-of-text token between
documents. Writes into --output-dir (NAME is --name, default the first input's stem):

    NAME_val_000000.bin     the first --val-tokens tokens (only with --val-tokens N > 0)
    NAME_train_00000k.bin   the rest, --shard-tokens per shard (default: one shard, which is
                            what data.train_path takes)
    tokenizer.json          the vocabulary the ids belong to (Hugging Face format, byte-level
                            BPE; written from tiktoken's ranks, or a copy of --tokenizer), for
                            `tandem sample --tokenizer`

Shards are llm.c's format: 256 little-endian int32 (magic, version, token count, zeros) and
then the tokens, uint16 (magic 20240520, version 1) when the vocabulary has at most 65536
ids, uint32 (magic 20240801, version 7) past that; --dtype forces either. Shards are
written to a temporary file and renamed into place, so a crash leaves no partial shard.

Long inputs are encoded in pieces of about --chunk-bytes, cut only where GPT-2's
pre-tokenizer regex cuts anyway (after a newline that follows a visible character and
precedes one), so the ids are those of the whole text; tokenizers with another
pre-tokenizer encode each document in one piece.

Requirements: Python 3.8+ and the package of the tokenizer used:
    python3 -m pip install tiktoken      # --tiktoken (downloads the encoding once, then caches it)
    python3 -m pip install tokenizers    # --tokenizer
"""

import argparse
import array
import json
import os
import sys
import time

TOOL = "tokenize_bpe"
HEADER_INTS = 256
MAX_SHARD_TOKENS = 2**31 - 1  # the header's count is an int32
DTYPES = {  # name: (magic, version, array typecode, largest id)
    "uint16": (20240520, 1, "H", 2**16 - 1),
    "uint32": (20240801, 7, "I", 2**32 - 1),
}
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>")

# GPT-2's pre-tokenizer regex as its release, Hugging Face's ByteLevel pre-tokenizer and
# tiktoken's versions spell it. Only after these is cutting text into pieces known to keep
# the ids of the whole (see find_cut).
GPT2_PATTERNS = {
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[\p{L}]+| ?[\p{N}]+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
}


class ToolError(Exception):
    """A one-line message for the user: what was wrong and how to fix it."""


def pip_hint(package):
    return f"{sys.executable} -m pip install {package}"


def bytes_to_unicode():
    """GPT-2's table: every byte as a printable character (a space is 'Ġ', a newline 'Ċ')."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def is_byte_level_decoder(decoder):
    if not isinstance(decoder, dict):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    parts = decoder.get("decoders")
    return (decoder.get("type") == "Sequence" and isinstance(parts, list) and bool(parts)
            and all(isinstance(p, dict) and p.get("type") == "ByteLevel" for p in parts))


def gpt2_regex_pre_tokenizer(spec):
    """Whether a tokenizer.json pre-tokenizer splits text exactly as GPT-2's regex does."""
    if not isinstance(spec, dict):
        return False
    if spec.get("type") == "ByteLevel":
        return spec.get("use_regex", True) and not spec.get("add_prefix_space", False)
    parts = spec.get("pretokenizers")
    if spec.get("type") != "Sequence" or not isinstance(parts, list) or len(parts) != 2:
        return False
    split, byte_level = parts
    return (isinstance(split, dict) and split.get("type") == "Split"
            and isinstance(split.get("pattern"), dict)
            and split["pattern"].get("Regex") in GPT2_PATTERNS
            and split.get("behavior") == "Isolated" and not split.get("invert", False)
            and isinstance(byte_level, dict) and byte_level.get("type") == "ByteLevel"
            and not byte_level.get("use_regex", True)
            and not byte_level.get("add_prefix_space", False))


class TiktokenSource:
    """A tiktoken encoding (--tiktoken NAME)."""

    def __init__(self, name):
        try:
            import tiktoken
        except ImportError:
            raise ToolError(f"--tiktoken needs the tiktoken package: {pip_hint('tiktoken')}")
        if name not in tiktoken.list_encoding_names():
            raise ToolError(f"--tiktoken {name}: tiktoken has no such encoding (it has "
                            f"{', '.join(tiktoken.list_encoding_names())})")
        try:
            self.enc = tiktoken.get_encoding(name)
        except Exception as e:  # a download that failed, a bad cache file
            reason = str(e).splitlines()[0] if str(e) else ""
            raise ToolError(
                f"--tiktoken {name}: tiktoken could not load the encoding "
                f"({type(e).__name__}: {reason[:200]}). tiktoken downloads its encoding files "
                f"on first use and caches them (TIKTOKEN_CACHE_DIR): run once where the "
                f"internet is reachable, or use --tokenizer with a tokenizer.json (GPT-2's is "
                f"in Hugging Face's openai-community/gpt2)")
        self.description = f"tiktoken {name}"
        self.vocab_size = self.enc.n_vocab
        self.chunkable = getattr(self.enc, "_pat_str", None) in GPT2_PATTERNS

    def end_of_text(self, wanted):
        names = [wanted] if wanted else [n for n in EOT_NAMES if n in self.enc.special_tokens_set]
        if not names or names[0] not in self.enc.special_tokens_set:
            raise ToolError(
                f"--eot: {self.description} has no special token "
                f"{wanted or ' or '.join(EOT_NAMES)} (it has "
                f"{', '.join(sorted(self.enc.special_tokens_set)) or 'none'}); name one with "
                f"--eot-token")
        return self.enc.encode_single_token(names[0])

    def encode_batch(self, texts):
        # Ordinary: text that happens to spell "<|endoftext|>" is text, not the special token.
        return self.enc.encode_ordinary_batch(texts)

    def tokenizer_json(self):
        """The encoding as a Hugging Face tokenizer.json (byte-level BPE), as text."""
        spell_byte = bytes_to_unicode()

        def spell(token):
            return "".join(spell_byte[b] for b in token)

        specials = {s: self.enc.encode_single_token(s) for s in self.enc.special_tokens_set}
        special_ids = set(specials.values())
        ranks = {}
        for i in range(self.enc.n_vocab):
            if i in special_ids:
                continue
            try:
                ranks[self.enc.decode_single_token_bytes(i)] = i
            except (KeyError, ValueError):
                continue  # an id no token has (cl100k_base has such holes)
        merges = []
        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            if len(token) == 1:
                continue
            parts = bpe_parts(ranks, token, rank)
            if len(parts) != 2:
                raise ToolError(f"{self.description}: token {rank} ({token!r}) is not the "
                                f"merge of two tokens of lower rank, so it cannot be written "
                                f"as BPE merges")
            merges.append(f"{spell(parts[0])} {spell(parts[1])}")
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": False}
        tokenizer = {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True}
                for s, i in sorted(specials.items(), key=lambda item: item[1])],
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": self.enc._pat_str},
                 "behavior": "Isolated", "invert": False},
                byte_level]},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False,
                      # tiktoken takes a piece that is a token whole before merging.
                      "ignore_merges": True,
                      "vocab": {spell(t): i for t, i in sorted(ranks.items(),
                                                               key=lambda item: item[1])},
                      "merges": merges},
        }
        return json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n"


def bpe_parts(ranks, token, max_rank):
    """The pieces tiktoken's BPE makes of `token` with the merges below max_rank: two for
    any token that a merge created (transformers' TikTokenConverter recovers merges so)."""
    parts = [bytes([b]) for b in token]
    while True:
        best, best_rank = None, None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):
                best, best_rank = i, rank
        if best_rank is None or best_rank >= max_rank:
            return parts
        parts[best:best + 2] = [parts[best] + parts[best + 1]]


class HuggingFaceSource:
    """A Hugging Face tokenizer.json (--tokenizer PATH), byte-level BPE only."""

    def __init__(self, path):
        if not os.path.isfile(path):
            raise ToolError(f"{path}: no such tokenizer file (--tokenizer takes a Hugging Face "
                            f"tokenizer.json)")
        with open(path, "rb") as f:
            self.json_bytes = f.read()
        try:
            spec = json.loads(self.json_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ToolError(f"{path}: not JSON ({e}); --tokenizer takes a Hugging Face "
                            f"tokenizer.json")
        needed = ("tandem needs a byte-level BPE tokenizer (model type BPE with a ByteLevel "
                  "decoder, as GPT-2's), which is what its decoder reads")
        model = spec.get("model") if isinstance(spec, dict) else None
        if not isinstance(model, dict):
            raise ToolError(f"{path}: no \"model\" object, so not a Hugging Face "
                            f"tokenizer.json; {needed}")
        model_type = model.get("type", "BPE" if "merges" in model else None)
        if model_type != "BPE":
            raise ToolError(f"{path}: the model is {model_type or 'untyped'}, not BPE; {needed}")
        decoder = spec.get("decoder")
        if not is_byte_level_decoder(decoder):
            what = decoder.get("type") if isinstance(decoder, dict) else "missing"
            raise ToolError(f"{path}: the decoder is {what}, not ByteLevel (a SentencePiece-"
                            f"style tokenizer?); {needed}")
        try:
            import tokenizers
        except ImportError:
            raise ToolError(f"--tokenizer needs the tokenizers package: {pip_hint('tokenizers')}")
        try:
            self.tok = tokenizers.Tokenizer.from_str(self.json_bytes.decode("utf-8"))
        except Exception as e:
            raise ToolError(f"{path}: the tokenizers package cannot load it ({e})")
        self.path = path
        self.description = path
        self.vocab = self.tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(self.vocab.values()) + 1
        self.chunkable = (spec.get("normalizer") is None
                          and gpt2_regex_pre_tokenizer(spec.get("pre_tokenizer")))

    def end_of_text(self, wanted):
        names = [wanted] if wanted else [n for n in EOT_NAMES if n in self.vocab]
        if not names or names[0] not in self.vocab:
            raise ToolError(f"--eot: {self.path} has no token {wanted or ' or '.join(EOT_NAMES)}; "
                            f"name its end-of-text token with --eot-token")
        return self.vocab[names[0]]

    def encode_batch(self, texts):
        # No special tokens added around each piece (a post-processor's BOS, say).
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def tokenizer_json(self):
        return self.json_bytes


VISIBLE_ASCII = range(0x21, 0x7F)


def find_cut(data, lo):
    """The last index c where data[c-2:c+1] is (visible, newline, visible), with the newline
    at lo or later; -1 if there is none.

    GPT-2's regex ends a piece at such a newline in the whole text and in the text cut
    there alike: no alternative matches a newline together with a visible character, and
    a newline alone after a visible one is the same single piece whether or not the text
    goes on (runs of whitespace are what its lookahead splits differently, so a cut never
    touches one; nor a non-ASCII character, which may be Unicode whitespace).
    """
    lo = max(lo, 1)
    i = data.rfind(b"\n", lo)
    while i >= lo:
        if i + 1 < len(data) and data[i - 1] in VISIBLE_ASCII and data[i + 1] in VISIBLE_ASCII:
            return i + 1
        i = data.rfind(b"\n", lo, i)
    return -1


def read_pieces(path, chunk_bytes, chunkable):
    """(offset, bytes) pieces of a file: about chunk_bytes each where cuts are allowed and
    found (find_cut), else the whole file in one."""
    with open(path, "rb") as f:
        if not chunkable:
            yield 0, f.read()
            return
        pending, offset, searched = bytearray(), 0, 0
        while True:
            block = f.read(chunk_bytes)
            if not block:
                if pending:
                    yield offset, bytes(pending)
                return
            pending += block
            if len(pending) < chunk_bytes:
                continue
            # Only the new bytes (and the two before them) can hold a cut not seen before.
            cut = find_cut(pending, searched - 2)
            searched = len(pending)
            if cut > 0:
                yield offset, bytes(pending[:cut])
                offset += cut
                del pending[:cut]
                searched = len(pending)


class ShardWriter:
    """Writes the token stream into the val shard, then train shards, each atomically."""

    def __init__(self, directory, name, dtype, shard_tokens, val_tokens):
        self.directory, self.name, self.dtype = directory, name, dtype
        self.magic, self.version, self.typecode, self.max_id = DTYPES[dtype]
        self.shard_tokens = shard_tokens
        self.split = "val" if val_tokens > 0 else "train"
        self.capacity = val_tokens if val_tokens > 0 else shard_tokens
        self.index = 0
        self.file = None
        self.temp_path = self.path = None
        self.count = 0
        self.written = []  # (path, tokens)
        self.total = 0

    def add(self, ids):
        pos = 0
        while pos < len(ids):
            if self.file is None:
                self._open()
            take = ids[pos:pos + self.capacity - self.count]
            try:
                values = array.array(self.typecode, take)
            except OverflowError:
                bad = max(take)
                raise ToolError(f"token id {bad} does not fit a {self.dtype} shard (ids up to "
                                f"{self.max_id}); use --dtype uint32 (or auto)")
            if sys.byteorder == "big":
                values.byteswap()
            self.file.write(values.tobytes())
            self.count += len(take)
            self.total += len(take)
            pos += len(take)
            if self.count == self.capacity:
                self._close()

    def _open(self):
        self.path = os.path.join(self.directory,
                                 f"{self.name}_{self.split}_{self.index:06d}.bin")
        self.temp_path = f"{self.path}.tmp-{os.getpid()}"
        self.file = open(self.temp_path, "wb")
        self.file.write(bytes(4 * HEADER_INTS))  # the header, once the count is known
        self.count = 0

    def _close(self):
        header = array.array("i", [self.magic, self.version, self.count]
                             + [0] * (HEADER_INTS - 3))
        if sys.byteorder == "big":
            header.byteswap()
        self.file.seek(0)
        self.file.write(header.tobytes())
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.file = None
        os.replace(self.temp_path, self.path)
        self.written.append((self.path, self.count))
        self.index += 1
        if self.split == "val":
            self.split, self.capacity = "train", self.shard_tokens

    def finish(self):
        if self.file is not None:
            self._close()
        sync_directory(self.directory)
        return self.written

    def abort(self):
        if self.file is not None:
            self.file.close()
            self.file = None
            os.remove(self.temp_path)


def sync_directory(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, data):
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


class Progress:
    """A line on stderr: rewritten in place on a terminal, every 10 s in a log."""

    def __init__(self, total_bytes, quiet):
        self.total_bytes, self.quiet = total_bytes, quiet
        self.tty = sys.stderr.isatty()
        self.start = self.last = time.monotonic()

    def update(self, done_bytes, tokens, final=False):
        now = time.monotonic()
        if self.quiet or (not final and now - self.last < (0.5 if self.tty else 10.0)):
            return
        self.last = now
        mib = 1 << 20
        rate = done_bytes / mib / max(now - self.start, 1e-9)
        line = (f"{TOOL}: {done_bytes / mib:.1f} of {self.total_bytes / mib:.1f} MiB "
                f"({100.0 * done_bytes / max(self.total_bytes, 1):.0f}%), {tokens:,} tokens, "
                f"{rate:.1f} MiB/s")
        if self.tty:
            print(f"\r{line}\033[K", end="\n" if final else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="tokenize_bpe.py",
        description="Tokenize text files with a byte-level BPE (GPT-2's via tiktoken, or a "
                    "Hugging Face tokenizer.json) into llm.c token shards for tandem train.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tiktoken", metavar="ENCODING",
                        help="a tiktoken encoding, e.g. gpt2 (needs: pip install tiktoken)")
    source.add_argument("--tokenizer", metavar="PATH",
                        help="a byte-level BPE tokenizer.json (needs: pip install tokenizers)")
    parser.add_argument("inputs", nargs="+", metavar="TEXT_FILE",
                        help="UTF-8 text files, one document each")
    parser.add_argument("--output-dir", required=True, help="directory for the shards")
    parser.add_argument("--name", help="shard name prefix (default: the first input's stem)")
    parser.add_argument("--dtype", choices=["auto", "uint16", "uint32"], default="auto",
                        help="token type: uint16 for vocabularies up to 65536 ids, else uint32 "
                             "(default auto)")
    parser.add_argument("--shard-tokens", type=int, default=MAX_SHARD_TOKENS,
                        help="tokens per train shard (default: all in one, up to 2^31-1)")
    parser.add_argument("--val-tokens", type=int, default=0,
                        help="the first N tokens go to NAME_val_000000.bin (default 0: none)")
    parser.add_argument("--eot", action="store_true",
                        help="put the end-of-text token between documents")
    parser.add_argument("--eot-token", metavar="TEXT",
                        help=f"the end-of-text token for --eot (default: the first of "
                             f"{', '.join(EOT_NAMES)} the tokenizer has)")
    parser.add_argument("--chunk-bytes", type=int, default=1 << 20,
                        help="bytes of text encoded at a time (default 1 MiB)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    if not 1 <= args.shard_tokens <= MAX_SHARD_TOKENS:
        parser.error(f"--shard-tokens {args.shard_tokens}: must be in 1..{MAX_SHARD_TOKENS} "
                     f"(a shard's token count is an int32)")
    if not 0 <= args.val_tokens <= MAX_SHARD_TOKENS:
        parser.error(f"--val-tokens {args.val_tokens}: must be in 0..{MAX_SHARD_TOKENS}")
    if args.chunk_bytes < 1:
        parser.error(f"--chunk-bytes {args.chunk_bytes}: must be at least 1")
    if args.eot_token and not args.eot:
        parser.error("--eot-token names the token --eot inserts; add --eot")
    return args


def tokenize(args):
    for path in args.inputs:
        if not os.path.isfile(path):
            raise ToolError(f"{path}: no such input file" if not os.path.exists(path)
                            else f"{path}: not a file (inputs are text files)")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise ToolError(f"--output-dir {args.output_dir}: exists and is not a directory")
    source = TiktokenSource(args.tiktoken) if args.tiktoken else HuggingFaceSource(args.tokenizer)
    dtype = args.dtype
    if dtype == "auto":
        dtype = "uint16" if source.vocab_size <= 2**16 else "uint32"
    elif dtype == "uint16" and source.vocab_size > 2**16:
        raise ToolError(f"--dtype uint16: {source.description} has {source.vocab_size} ids, "
                        f"more than a uint16 shard holds (65536); use --dtype uint32 (or auto)")
    eot = source.end_of_text(args.eot_token) if args.eot else None
    name = args.name or os.path.splitext(os.path.basename(args.inputs[0]))[0]
    os.makedirs(args.output_dir, exist_ok=True)
    earlier = {f for f in os.listdir(args.output_dir)
               if f.startswith(f"{name}_") and f.endswith(".bin")}

    total_bytes = sum(os.path.getsize(p) for p in args.inputs)
    progress = Progress(total_bytes, args.quiet)
    writer = ShardWriter(args.output_dir, name, dtype, args.shard_tokens, args.val_tokens)
    # Pieces are encoded a batch at a time: both libraries encode a batch on several threads.
    batch_bytes = max(args.chunk_bytes, 1 << 20) * 16
    done_bytes, documents = 0, 0
    try:
        for path in args.inputs:
            if os.path.getsize(path) == 0:
                print(f"{TOOL}: note: {path} is empty; skipped", file=sys.stderr)
                continue
            if eot is not None and documents > 0:
                writer.add([eot])
            documents += 1
            batch, batch_size = [], 0
            pieces = read_pieces(path, args.chunk_bytes, source.chunkable)
            for offset, piece in pieces:
                try:
                    batch.append(piece.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise ToolError(f"{path}: not UTF-8 text (byte 0x{piece[e.start]:02x} at "
                                    f"offset {offset + e.start}); convert it first, e.g. "
                                    f"iconv -f latin1 -t utf-8")
                batch_size += len(piece)
                if batch_size >= batch_bytes:
                    for ids in source.encode_batch(batch):
                        writer.add(ids)
                    done_bytes += batch_size
                    batch, batch_size = [], 0
                    progress.update(done_bytes, writer.total)
            for ids in source.encode_batch(batch):
                writer.add(ids)
            done_bytes += batch_size
            progress.update(done_bytes, writer.total)
        if writer.total == 0:
            raise ToolError("the inputs hold no text; nothing to tokenize")
        if writer.total <= args.val_tokens:
            raise ToolError(f"all {writer.total} tokens went to the validation split "
                            f"(--val-tokens {args.val_tokens}); lower --val-tokens to leave some "
                            f"for training")
        written = writer.finish()
    except BaseException:
        writer.abort()
        for path, _ in writer.written:
            os.remove(path)
        raise
    progress.update(done_bytes, writer.total, final=True)

    tokenizer_path = os.path.join(args.output_dir, "tokenizer.json")
    if not (args.tokenizer and os.path.exists(tokenizer_path)
            and os.path.samefile(args.tokenizer, tokenizer_path)):
        write_atomic(tokenizer_path, source.tokenizer_json())
    sync_directory(args.output_dir)

    if not args.quiet:
        for path, count in written:
            print(f"{TOOL}: wrote {path}: {count:,} tokens ({dtype})", file=sys.stderr)
        print(f"{TOOL}: wrote {tokenizer_path} ({source.description}, {source.vocab_size} ids)",
              file=sys.stderr)
        stale = sorted(earlier - {os.path.basename(p) for p, _ in written})
        for f in stale:
            print(f"{TOOL}: note: {os.path.join(args.output_dir, f)} is from an earlier run; "
                  f"remove it if it is not yours", file=sys.stderr)
        train = [p for p, _ in written if "_train_" in os.path.basename(p)]
        val = [p for p, _ in written if "_val_" in os.path.basename(p)]
        if len(train) > 1:
            print(f"{TOOL}: note: data.train_path takes one shard; these are {len(train)} "
                  f"(--shard-tokens)", file=sys.stderr)
        keys = f"--set data.train_path={train[0]} --set model.vocab_size={source.vocab_size}"
        if val:
            keys += f" --set data.val_path={val[0]}"
        print(f"{TOOL}: train on them with: tandem train --config FILE {keys}", file=sys.stderr)
    return written


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        tokenize(args)
    except ToolError as e:
        print(f"{TOOL}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{TOOL}: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{TOOL}: interrupted; no shard was left half-written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
