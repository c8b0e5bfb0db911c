#!/usr/bin/env python3
"""Tokenize text, JSON lines or Parquet files with a byte-level BPE into llm.c token shards
for `tandem train`, with a loss mask beside them for prompt/completion pairs and chats.

    python3 tools/tokenize_bpe.py --tiktoken gpt2 --output-dir data/gpt2 input.txt [more.txt ...]
    python3 tools/tokenize_bpe.py --tokenizer tokenizer.json --output-dir data/mine input.txt
    python3 tools/tokenize_bpe.py --tokenizer model/tokenizer.json --output-dir data/sft chats.jsonl
    python3 tools/tokenize_bpe.py --tokenizer tokenizer.json --output-dir data/web \
        --json-keys content --eot part-000.parquet part-001.parquet

Inputs. A file's format is its extension's: .jsonl and .json are JSON lines (one JSON
object a line; blank lines are skipped), .parquet is Parquet (read with pyarrow, a record
batch at a time), anything else is one document of UTF-8 text; --input-format forces one
for every input. Each record of a JSON lines or Parquet file is one document, of one of
three kinds, found per file from the keys of its first record (the columns of a Parquet
file), in this order, unless --record-format forces one:

    chat   "messages": a list of {"role": ..., "content": ...} (--messages-key). Rendered by
           the tokenizer's chat template (the "chat_template" of --tokenizer-config, by
           default the tokenizer_config.json beside --tokenizer, or chat_template.jinja
           beside it; --chat-template FILE overrides both) as transformers'
           apply_chat_template renders it: jinja2's ImmutableSandboxedEnvironment with
           trim_blocks and lstrip_blocks, loop controls, raise_exception, strftime_now and a
           tojson that keeps non-ASCII; messages, add_generation_prompt=False, tools=None and
           the special tokens of tokenizer_config.json (bos_token, eos_token, ...) passed in.
           ({% generation %} blocks render as their body. A template that calls
           strftime_now, as Llama 3.1's does for its system header, makes the shards depend
           on the day they are made.)
    pair   "prompt" and "completion" strings (--prompt-key, --completion-key). The document
           is the prompt followed by the completion, each encoded on its own and the ids
           concatenated, so the boundary between them is exact: the prompt's ids are those
           it has alone, as when a model is given the prompt and generates the completion.
    text   "text" (--json-keys, Megatron-LM's name for it): the string is one document.

Then --eot puts the end-of-text token between documents (never before the first or after
the last), whatever their kinds: between text files, records, and files.

Loss masks. When any input is of pairs or chats (or with --write-mask), every shard X.bin
gets a companion X.mask.bin (the final ".bin" replaced by ".mask.bin"): a header of 256
little-endian int32, [0] magic 20261128, [1] version 1, [2] the token count (equal to
X.bin's), the rest zero; then one uint8 per token, 1 where the loss counts the prediction
of that token from the tokens before it, 0 where it does not (tandem train reads it beside
the shard: src/tandem/data/loss_mask.h). The mask of a token is:

    text file, text record    1
    pair                      0 on the prompt's tokens, 1 on the completion's
    chat                      1 on each assistant message's content as the template writes
                              it (after its `| trim`, say) and on the special token that
                              ends the turn right after it (<|im_end|>, <|eot_id|>, </s>;
                              whitespace before it included), 0 on everything else: system
                              and user turns, the template's headers, text after the turn's
                              end (ChatML's newline), text the template makes of other
                              fields (tool calls, reasoning)
    end-of-text (--eot)       the mask of the document it ends: 1 after a text and after a
                              pair (the completion's end is learned there), 0 after a chat
                              (its end-of-turn tokens already end the answers)

--no-mask-prompt counts every token (1 everywhere, the end-of-text tokens too).

How a chat's mask is found: the chat is rendered as it is, then once for each assistant
message with that message's content replaced by a marker (private-use characters). The
text before and after the marker must be exactly the start and the end of the real
rendering; what lies between them there is the content as the template wrote it. (A
template that writes the content twice, or changes the rest of the chat with it, fails
that check, and the record is refused: --no-mask-prompt takes such chats whole.) The
rendering is then cut at each content's start and at the end of its end-of-turn token,
each piece encoded on its own, and the ids concatenated: the template's text before an
answer is encoded alone, as a prompt is when a model generates the answer, so training sees
the boundary generation starts from. Cuts beside a special token change no id (special
tokens are split out before the pre-tokenizer). With --no-mask-prompt the rendering is
encoded whole.

Errors. A bad record stops the run with FILE:LINE: (Parquet: FILE: row N:, counted from
0), what is wrong and how to fix it: a line that is not UTF-8 or not JSON or not an object,
a missing key, a key of the wrong type (a Parquet null), an empty completion, an empty list
of messages, a message without a string role and content, an unpaired surrogate (a \ud800
escape), a chat the template refuses (raise_exception), a chat whose answers cannot be
found (above). Empty text records are skipped (counted in the summary).

Outputs, in --output-dir (NAME is --name, default the first input's stem):

    NAME_val_000000.bin     the first --val-tokens tokens (only with --val-tokens N > 0)
    NAME_train_00000k.bin   the rest, --shard-tokens per shard (default: one shard, which is
                            what data.train_path takes)
    X.mask.bin              beside each X.bin, as above
    tokenizer.json          the vocabulary the ids belong to (Hugging Face format, byte-level
                            BPE; written from tiktoken's ranks, or a copy of --tokenizer), for
                            `tandem sample --tokenizer`

Shards are llm.c's format: 256 little-endian int32 (magic, version, token count, zeros) and
then the tokens, uint16 (magic 20240520, version 1) when the vocabulary has at most 65536
ids, uint32 (magic 20240801, version 7) past that; --dtype forces either. Every shard and
mask is written to a temporary file (X.bin.tmp-PID) as it fills, and all are renamed into
place only when the whole input has been read, masks before their shards: a failed or
interrupted run leaves no shard and no mask (and removes its temporary files). A shard
written without a mask removes an earlier run's X.mask.bin beside it.

Streaming: files are read a line (a Parquet record batch, a piece of a text file) at a
time, encoded in batches with the library's batch encoding (tokenizers' encode_batch_fast,
tiktoken's encode_ordinary_batch, both on several threads) and written to the shards as
they come: records 2 MiB of text a batch, a text file a piece of --chunk-bytes for each CPU
(up to 16). Memory is bounded by the batch (the library's encodings take about 45 bytes a
byte of text: ~140 MiB resident in all for records) and the longest JSON line, not by the
input or the shards; pyarrow reads a Parquet file a row group at a time, whose size its
writer chose. Long texts (text files, text records) are encoded in pieces of about
--chunk-bytes, cut only where GPT-2's pre-tokenizer regex cuts anyway (after a newline
that follows a visible character and precedes one), so the ids are those of the whole
text; tokenizers with another pre-tokenizer encode each text whole.

Special tokens: --tokenizer's library makes a special token's text in any text the token
(as transformers does); tiktoken encodes text as text (encode_ordinary) and only a chat
template's own text with its special tokens.

At the end it prints the shards, the tokens written and, with masks, the fraction of them
that the masks count.

Requirements: Python 3.8+ and the package of the tokenizer used:
    python3 -m pip install tiktoken      # --tiktoken (downloads the encoding once, then caches it)
    python3 -m pip install tokenizers    # --tokenizer
    python3 -m pip install jinja2        # chats (3.1.6 or newer: the sandbox transformers trusts)
    python3 -m pip install pyarrow       # Parquet inputs
"""
import argparse
import array
import datetime
import json
import os
import re
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
MASK_MAGIC, MASK_VERSION = 20261128, 1  # X.mask.bin (src/tandem/data/loss_mask.h)
INPUT_FORMATS = ("text", "jsonl", "parquet")
RECORD_FORMATS = ("chat", "pair", "text")  # detection tries them in this order
JSONL_EXTENSIONS = (".jsonl", ".json")
# The special tokens of tokenizer_config.json that transformers gives a chat template.
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token", "additional_special_tokens")
# Stands for an assistant message's content while its place in the rendering is found:
# private-use characters, which no template trims or escapes.
MARKER = "\ue000tandem assistant content {}\ue001"

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
        self.special_tokens = sorted(self.enc.special_tokens_set)

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

    def encode_template_batch(self, texts):
        """Text a chat template wrote: its special tokens are the tokens."""
        return self.enc.encode_batch(texts, allowed_special="all")

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
        self.special_tokens = sorted(t.content for t in self.tok.get_added_tokens_decoder().values()
                                     if t.special)
        # encode_batch_fast (tokenizers 0.21+) gives the same ids without computing offsets.
        self._encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)

    def end_of_text(self, wanted):
        names = [wanted] if wanted else [n for n in EOT_NAMES if n in self.vocab]
        if not names or names[0] not in self.vocab:
            raise ToolError(f"--eot: {self.path} has no token {wanted or ' or '.join(EOT_NAMES)}; "
                            f"name its end-of-text token with --eot-token")
        return self.vocab[names[0]]

    def encode_batch(self, texts):
        # No special tokens added around each piece (a post-processor's BOS, say).
        return [e.ids for e in self._encode(texts, add_special_tokens=False)]

    # The library makes a special token's text the token in any text, as transformers does.
    encode_template_batch = encode_batch

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



def is_visible(ch):
    return "!" <= ch <= "~"


def split_text(text, chunk_chars):
    """A long string in pieces of about chunk_chars, cut only where find_cut cuts bytes (a
    newline between two visible ASCII characters), so the pieces' ids are the whole's."""
    pieces, start, n = [], 0, len(text)
    while n - start > chunk_chars:
        cut = -1
        i = text.rfind("\n", start + 1, start + chunk_chars)
        while i > start:  # the last cut in the piece's span ...
            if i + 1 < n and is_visible(text[i - 1]) and is_visible(text[i + 1]):
                cut = i + 1
                break
            i = text.rfind("\n", start + 1, i)
        if cut < 0:  # ... else the first one after it
            i = text.find("\n", start + chunk_chars)
            while i >= 0:
                if i + 1 < n and is_visible(text[i - 1]) and is_visible(text[i + 1]):
                    cut = i + 1
                    break
                i = text.find("\n", i + 1)
        if cut < 0:
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


MISSING = object()
RECORD_BATCH_BYTES = 2 << 20  # characters of records' text encoded at a time


def type_name(value):
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def quoted(key):
    return json.dumps(key, ensure_ascii=False)


def parse_json_line(path, number, line):
    """A line of a JSON lines file as a dict, or a ToolError naming FILE:LINE."""
    where = f"{path}:{number}"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ToolError(f"{where}: not UTF-8 (byte 0x{line[e.start]:02x} at byte {e.start + 1} "
                        f"of the line); convert the file first, e.g. iconv -f latin1 -t utf-8")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ToolError(f"{where}: not JSON ({e.msg} at column {e.colno}); each line of a JSON "
                        f"lines file is one JSON object, such as {{\"text\": \"...\"}}")
    if not isinstance(record, dict):
        raise ToolError(f"{where}: {type_name(record)}, not a JSON object; each line of a JSON "
                        f"lines file is one object, such as {{\"text\": \"...\"}}")
    return record


class JsonlInput:
    """A JSON lines file: one JSON object a line; blank lines are skipped."""

    format = "jsonl"

    def __init__(self, path):
        self.path = path

    def where(self, number):
        return f"{self.path}:{number}"

    def first_record(self):
        """(line number, record) of the first non-blank line, or None."""
        with open(self.path, "rb") as f:
            for number, line in enumerate(f, 1):
                if number == 1:
                    line = line[3:] if line.startswith(b"\xef\xbb\xbf") else line
                    if line.lstrip().startswith(b"["):
                        raise ToolError(
                            f"{self.path}: a JSON array, not JSON lines (one object a line); "
                            f"convert it, e.g. jq -c '.[]' {self.path} > "
                            f"{os.path.splitext(self.path)[0]}.jsonl")
                if line.strip():
                    return number, parse_json_line(self.path, number, line)
        return None

    def keys(self):
        first = self.first_record()
        return None if first is None else (first[0], list(first[1]))

    def records(self, columns, batch_bytes):
        """(line number, bytes read up to it, record) for each non-blank line."""
        with open(self.path, "rb") as f:
            done = 0
            for number, line in enumerate(f, 1):
                done += len(line)
                if number == 1 and line.startswith(b"\xef\xbb\xbf"):
                    line = line[3:]
                if not line.strip():
                    continue
                yield number, done, parse_json_line(self.path, number, line)


class ParquetInput:
    """A Parquet file, read with pyarrow a record batch at a time; the columns are the keys."""

    format = "parquet"

    def __init__(self, path):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ToolError(f"{path}: Parquet inputs need the pyarrow package: "
                            f"{pip_hint('pyarrow')}")
        self.path = path
        try:
            self.file = pq.ParquetFile(path)
        except Exception as e:
            raise ToolError(f"{path}: pyarrow cannot read it as Parquet ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}); --input-format "
                            f"text reads a file named .parquet as text")
        self.schema = self.file.schema_arrow
        self.rows = self.file.metadata.num_rows

    def where(self, number):
        return f"{self.path}: row {number}"

    def keys(self):
        return None if self.rows == 0 else (0, list(self.schema.names))

    def check_strings(self, columns):
        import pyarrow.types as pt
        for name in columns:
            kind = self.schema.field(name).type
            if not (pt.is_string(kind) or pt.is_large_string(kind)
                    or getattr(pt, "is_string_view", lambda _: False)(kind)):
                raise ToolError(f"{self.path}: column {quoted(name)} holds {kind}, not strings")

    def records(self, columns, batch_bytes):
        """(row, bytes read up to it (estimated from the rows), record) for each row. A
        struct's null fields (a message without tool_calls) are left out, as JSON lines
        would have them."""
        size = os.path.getsize(self.path)
        data_bytes = sum(self.file.metadata.row_group(i).total_byte_size
                         for i in range(self.file.metadata.num_row_groups))
        rows = max(1, min(65536, batch_bytes * max(self.rows, 1) // max(data_bytes, 1)))
        row = 0
        for batch in self.file.iter_batches(batch_size=rows, columns=columns):
            values = [batch.column(i).to_pylist() for i in range(len(columns))]
            for record_values in zip(*values):
                record = dict(zip(columns, record_values))
                for key, value in record.items():
                    if isinstance(value, list):
                        record[key] = [{k: v for k, v in m.items() if v is not None}
                                       if isinstance(m, dict) else m for m in value]
                yield row, size * (row + 1) // self.rows, record
                row += 1


def open_input(path, forced):
    fmt = forced
    if fmt == "auto":
        ext = os.path.splitext(path)[1].lower()
        fmt = "jsonl" if ext in JSONL_EXTENSIONS else "parquet" if ext == ".parquet" else "text"
    if fmt == "jsonl":
        return JsonlInput(path)
    if fmt == "parquet":
        return ParquetInput(path)
    return None  # a text document


class ChatTemplate:
    """A tokenizer's chat template, rendered as transformers' apply_chat_template does."""

    def __init__(self, config_path, template_path, source):
        try:
            import jinja2
            import jinja2.ext
            import jinja2.sandbox
        except ImportError:
            raise ToolError(f"chat records need the jinja2 package: {pip_hint('jinja2')}")
        version = tuple(int(p) for p in re.findall(r"\d+", jinja2.__version__)[:3])
        if version < (3, 1, 6):
            raise ToolError(f"jinja2 {jinja2.__version__} is older than 3.1.6, whose sandbox "
                            f"chat templates (untrusted code) need: {pip_hint('-U jinja2')}")
        self.jinja2 = jinja2
        config = {}
        if config_path is not None:
            if not os.path.isfile(config_path):
                raise ToolError(f"{config_path}: no such file; chat records are rendered with "
                                f"the tokenizer's chat template, read from its "
                                f"tokenizer_config.json: name it with --tokenizer-config (or "
                                f"give the template with --chat-template FILE)")
            try:
                with open(config_path, "rb") as f:
                    config = json.loads(f.read().decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ToolError(f"{config_path}: not JSON ({e}); --tokenizer-config takes a "
                                f"tokenizer_config.json")
            if not isinstance(config, dict):
                raise ToolError(f"{config_path}: not a JSON object; --tokenizer-config takes a "
                                f"tokenizer_config.json")
        template, self.origin = None, config_path
        if template_path is not None:
            template, self.origin = self._read(template_path), template_path
        else:
            template = config.get("chat_template")
            if isinstance(template, list):  # named templates: transformers takes "default"
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
                if "default" not in named:
                    raise ToolError(f"{config_path}: its chat templates are named "
                                    f"{', '.join(map(str, named))}, none \"default\"; give the "
                                    f"one to use with --chat-template FILE")
                template = named["default"]
            beside = os.path.join(os.path.dirname(config_path or "."), "chat_template.jinja")
            if template is None and os.path.isfile(beside):
                template, self.origin = self._read(beside), beside
            if template is None:
                raise ToolError(f"{config_path}: no chat_template (and no chat_template.jinja "
                                f"beside it), which chat records need; give one with "
                                f"--chat-template FILE or --tokenizer-config PATH")
            if not isinstance(template, str):
                raise ToolError(f"{config_path}: chat_template is {type_name(template)}, not a "
                                f"string")
        self.kwargs = {}
        for key in SPECIAL_TOKEN_KEYS:
            value = config.get(key)
            if isinstance(value, dict):  # {"content": "<s>", "__type": "AddedToken", ...}
                value = value.get("content")
            if isinstance(value, list):
                value = [v.get("content") if isinstance(v, dict) else v for v in value]
            if value is not None:
                self.kwargs[key] = value

        class GenerationTag(jinja2.ext.Extension):
            """{% generation %}...{% endgeneration %}, which transformers' templates may
            hold to mark answers: rendered as its body."""
            tags = {"generation"}

            def parse(self, parser):
                next(parser.stream)
                return parser.parse_statements(("name:endgeneration",), drop_needle=True)

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        def strftime_now(format):
            return datetime.datetime.now().strftime(format)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True,
            extensions=[GenerationTag, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            self.template = env.from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise ToolError(f"{self.origin}: the chat template does not parse (template line "
                            f"{e.lineno}: {e.message})")
        specials = sorted(source.special_tokens, key=len, reverse=True)
        self.end_of_turn = (re.compile(r"\s*(?:" + "|".join(map(re.escape, specials)) + ")")
                            if specials else None)
        self.turns_without_end = 0

    @staticmethod
    def _read(path):
        try:
            with open(path, "rb") as f:
                return f.read().decode("utf-8")
        except FileNotFoundError:
            raise ToolError(f"{path}: no such chat template file")
        except UnicodeDecodeError:
            raise ToolError(f"{path}: the chat template is not UTF-8")

    def render(self, messages, where, add_generation_prompt=False):
        try:
            return self.template.render(messages=messages, tools=None, documents=None,
                                        add_generation_prompt=add_generation_prompt,
                                        **self.kwargs)
        except self.jinja2.TemplateError as e:  # raise_exception, an undefined name
            reason = (str(e).splitlines() or [type(e).__name__])[0]
            raise ToolError(f"{where}: the chat template of {self.origin} refuses this chat: "
                            f"{reason}; fix the record (or remove it)")
        except Exception as e:
            reason = (str(e).splitlines() or [""])[0]
            raise ToolError(f"{where}: the chat template of {self.origin} fails on this chat "
                            f"({type(e).__name__}: {reason}); fix the record (or remove it)")

    def segments(self, messages, where, mask_prompt):
        """The rendered chat as (text, mask, is template text) pieces, and its end-of-text
        mask. See the module's docstring: a marker stands for each assistant content in
        turn, and the rendering around it must be the real one's start and end."""
        full = self.render(messages, where)
        if not mask_prompt:
            return [(full, 1, True)], 1
        pieces, pos = [], 0
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            marker = MARKER.format(i)
            marked = self.render(messages[:i] + [dict(message, content=marker)]
                                 + messages[i + 1:], where)
            at = marked.find(marker)
            before, after = marked[:at], marked[at + len(marker):]
            start, end = len(before), len(full) - len(after)
            if (at < 0 or marker in after or not pos <= start <= end
                    or not full.startswith(before) or not full.endswith(after)):
                raise ToolError(
                    f"{where}: cannot find where the chat template of {self.origin} writes "
                    f"messages[{i}]'s content (it writes it other than once, or writes the "
                    f"rest of the chat differently with another content), so it cannot be "
                    f"masked; --no-mask-prompt counts every token of the chats")
            match = self.end_of_turn.match(full, end) if self.end_of_turn else None
            if match is None:
                self.turns_without_end += 1
            turn_end = match.end() if match else end
            pieces += [(full[pos:start], 0, True), (full[start:end], 1, False),
                       (full[end:turn_end], 1, True)]
            pos = turn_end
        pieces.append((full[pos:], 0, True))
        return [p for p in pieces if p[0]], 0


class Documents:
    """Turns records into documents: ([(text, mask, is template text)], end-of-text mask)."""

    def __init__(self, args, source, chat_template):
        self.args, self.source, self.chat_template = args, source, chat_template
        self.mask_prompt = args.mask_prompt
        self.chunk = args.chunk_bytes if source.chunkable else None

    def columns(self, kind):
        a = self.args
        return {"text": [a.json_keys], "pair": [a.prompt_key, a.completion_key],
                "chat": [a.messages_key]}[kind]

    def detect(self, keys, where):
        a = self.args
        if a.messages_key in keys:
            return "chat"
        if a.prompt_key in keys and a.completion_key in keys:
            return "pair"
        if a.json_keys in keys:
            return "text"
        raise ToolError(
            f"{where}: the first record has none of the keys read: {quoted(a.messages_key)} "
            f"(chats), {quoted(a.prompt_key)} and {quoted(a.completion_key)} (prompt/completion "
            f"pairs), {quoted(a.json_keys)} (text); it has "
            f"{', '.join(map(quoted, keys)) or 'none'}. Name its keys with --messages-key, "
            f"--prompt-key and --completion-key, or --json-keys")

    @staticmethod
    def string(record, key, where, what):
        value = record.get(key, MISSING)
        if value is MISSING:
            raise ToolError(f"{where}: no {quoted(key)} key (the record has "
                            f"{', '.join(map(quoted, record)) or 'none'}); {what}")
        if not isinstance(value, str):
            raise ToolError(f"{where}: {quoted(key)} is {type_name(value)}, not a string")
        return value

    def text(self, record, where):
        text = self.string(record, self.args.json_keys, where,
                           "name the text's key with --json-keys")
        if not text:
            return None
        if self.chunk is not None and len(text) > self.chunk:
            return [(piece, 1, False) for piece in split_text(text, self.chunk)], 1
        return [(text, 1, False)], 1

    def pair(self, record, where):
        what = "pair records have a prompt and a completion (--prompt-key, --completion-key)"
        prompt = self.string(record, self.args.prompt_key, where, what)
        completion = self.string(record, self.args.completion_key, where, what)
        if not completion:
            raise ToolError(f"{where}: {quoted(self.args.completion_key)} is empty; a pair "
                            f"needs a completion to learn (remove the record)")
        return [(prompt, 0 if self.mask_prompt else 1, False), (completion, 1, False)], 1

    def chat(self, record, where):
        key = self.args.messages_key
        messages = record.get(key, MISSING)
        if messages is MISSING:
            raise ToolError(f"{where}: no {quoted(key)} key (the record has "
                            f"{', '.join(map(quoted, record)) or 'none'}); chat records hold a "
                            f"list of messages (--messages-key)")
        if not isinstance(messages, list):
            raise ToolError(f"{where}: {quoted(key)} is {type_name(messages)}, not a list of "
                            f"{{\"role\": ..., \"content\": ...}} messages")
        if not messages:
            raise ToolError(f"{where}: {quoted(key)} is empty; a chat needs messages (remove "
                            f"the record)")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise ToolError(f"{where}: {key}[{i}] is {type_name(message)}, not a "
                                f"{{\"role\": ..., \"content\": ...}} object")
            for field in ("role", "content"):
                value = message.get(field, MISSING)
                if value is MISSING:
                    raise ToolError(f"{where}: {key}[{i}] has no {quoted(field)}; each message "
                                    f"is {{\"role\": ..., \"content\": ...}}")
                if not isinstance(value, str):
                    hint = (" (content parts are not read: join their text into one string)"
                            if isinstance(value, list) else "")
                    raise ToolError(f"{where}: {key}[{i}].{field} is {type_name(value)}, not a "
                                    f"string{hint}")
        return self.chat_template.segments(messages, where, self.mask_prompt)


class TokenStream:
    """Documents, encoded a batch at a time, into the writer, with --eot between them."""

    MASK_BYTES = (b"\x00", b"\x01")

    def __init__(self, source, writer, eot):
        self.source, self.writer, self.eot = source, writer, eot
        self.documents = 0
        self.eot_mask = 1
        self.one_call = source.encode_template_batch == source.encode_batch

    def start_document(self, eot_mask):
        """Before a document written by pieces (a text file)."""
        if self.eot is not None and self.documents > 0:
            self.writer.add([self.eot], self.MASK_BYTES[self.eot_mask])
        self.documents += 1
        self.eot_mask = eot_mask

    def encode(self, docs, input_):
        """docs: (segments, end-of-text mask, record number, whether a new document (not
        the rest of the one before)) of one input."""
        texts = [[], []]  # ordinary text, template text
        for segments, _, _, _ in docs:
            for text, _, template in segments:
                texts[template and not self.one_call].append(text)
        try:
            encoded = [iter(self.source.encode_batch(texts[0]) if texts[0] else ()),
                       iter(self.source.encode_template_batch(texts[1]) if texts[1] else ())]
        except Exception as e:
            self._unencodable(docs, input_, e)
            raise
        with_mask = self.writer.with_mask
        ids, mask, ones = [], bytearray(), self.MASK_BYTES
        for segments, eot_mask, _, new in docs:
            if new:
                if self.eot is not None and self.documents > 0:
                    ids.append(self.eot)
                    mask += ones[self.eot_mask]
                self.documents += 1
                self.eot_mask = eot_mask
            for text, m, template in segments:
                piece = next(encoded[template and not self.one_call])
                ids += piece
                if with_mask:
                    mask += ones[m] * len(piece)
        self.writer.add(ids, mask if with_mask else None)

    @staticmethod
    def _unencodable(docs, input_, error):
        """A text the library refused: an unpaired surrogate (a \\ud800 escape in JSON)."""
        for segments, _, number, _ in docs:
            for text, _, _ in segments:
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ToolError(f"{input_.where(number)}: a string holds an unpaired "
                                    f"surrogate ({text[e.start]!a}), which is not text; fix the "
                                    f"record")


class ShardWriter:
    """Writes the token stream (and its loss mask) into the val shard, then train shards.
    Each shard and mask goes to a temporary file as it fills; finish() renames them all
    into place, so the shards appear only once the whole input is read."""

    def __init__(self, directory, name, dtype, shard_tokens, val_tokens, with_mask):
        self.directory, self.name, self.dtype = directory, name, dtype
        self.magic, self.version, self.typecode, self.max_id = DTYPES[dtype]
        self.shard_tokens = shard_tokens
        self.with_mask = with_mask
        self.split = "val" if val_tokens > 0 else "train"
        self.capacity = val_tokens if val_tokens > 0 else shard_tokens
        self.index = 0
        self.file = self.mask_file = None
        self.count = self.shard_counted = 0
        self.closed = []  # (temp, path, mask temp or None, mask path, tokens, counted)
        self.removed_masks = []
        self.total = self.counted = 0

    def add(self, ids, mask=None):
        """ids and, with masks, their mask (bytes of 0 and 1; None: all 1)."""
        if self.with_mask:
            if mask is None:
                mask = b"\x01" * len(ids)
            assert len(mask) == len(ids)
        pos = 0
        while pos < len(ids):
            if self.file is None:
                self._open()
            end = pos + self.capacity - self.count
            take = ids if pos == 0 and end >= len(ids) else ids[pos:end]
            try:
                values = array.array(self.typecode, take)
            except OverflowError:
                bad = max(take)
                raise ToolError(f"token id {bad} does not fit a {self.dtype} shard (ids up to "
                                f"{self.max_id}); use --dtype uint32 (or auto)")
            if sys.byteorder == "big":
                values.byteswap()
            self.file.write(values.tobytes())
            if self.with_mask:
                part = mask if take is ids else mask[pos:end]
                self.mask_file.write(part)
                counted = part.count(1)
                self.shard_counted += counted
                self.counted += counted
            self.count += len(take)
            self.total += len(take)
            pos += len(take)
            if self.count == self.capacity:
                self._close()

    def _open(self):
        self.path = os.path.join(self.directory,
                                 f"{self.name}_{self.split}_{self.index:06d}.bin")
        self.temp_path = f"{self.path}.tmp-{os.getpid()}"
        self.mask_path = mask_path_for(self.path)
        self.mask_temp = f"{self.mask_path}.tmp-{os.getpid()}" if self.with_mask else None
        self.file = open(self.temp_path, "wb")
        self.file.write(bytes(4 * HEADER_INTS))  # the header, once the count is known
        if self.with_mask:
            self.mask_file = open(self.mask_temp, "wb")
            self.mask_file.write(bytes(4 * HEADER_INTS))
        self.count = self.shard_counted = 0

    def _close(self):
        for f, magic, version in ((self.file, self.magic, self.version),
                                  (self.mask_file, MASK_MAGIC, MASK_VERSION)):
            if f is None:
                continue
            header = array.array("i", [magic, version, self.count] + [0] * (HEADER_INTS - 3))
            if sys.byteorder == "big":
                header.byteswap()
            f.seek(0)
            f.write(header.tobytes())
            f.flush()
            os.fsync(f.fileno())
            f.close()
        self.file = self.mask_file = None
        self.closed.append((self.temp_path, self.path, self.mask_temp, self.mask_path,
                            self.count, self.shard_counted))
        self.index += 1
        if self.split == "val":
            self.split, self.capacity = "train", self.shard_tokens

    def finish(self):
        """Renames every shard (each mask first) into place; [(path, tokens, mask path or
        None, tokens the mask counts)]."""
        if self.file is not None:
            self._close()
        written = []
        for temp, path, mask_temp, mask_path, count, counted in self.closed:
            if mask_temp is not None:
                os.replace(mask_temp, mask_path)
            elif os.path.lexists(mask_path):  # an earlier run's, which would be read with it
                os.remove(mask_path)
                self.removed_masks.append(mask_path)
            os.replace(temp, path)
            written.append((path, count, mask_temp and mask_path, counted))
        self.closed = []
        sync_directory(self.directory)
        return written

    def abort(self):
        for f in (self.file, self.mask_file):
            if f is not None:
                f.close()
        temps = [(t, m) for t, _, m, _, _, _ in self.closed]
        if self.file is not None:
            temps.append((self.temp_path, self.mask_temp))
        self.file = self.mask_file = None
        self.closed = []
        for temp in (t for pair in temps for t in pair if t is not None):
            try:
                os.remove(temp)
            except FileNotFoundError:
                pass


def mask_path_for(shard_path):
    """X.bin -> X.mask.bin (src/tandem/data/loss_mask.h's loss_mask_path_for)."""
    return (shard_path[:-len(".bin")] if shard_path.endswith(".bin") else shard_path) + ".mask.bin"


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
        description="Tokenize text, JSON lines or Parquet files with a byte-level BPE (GPT-2's "
                    "via tiktoken, or a Hugging Face tokenizer.json) into llm.c token shards for "
                    "tandem train, with a loss mask beside them for prompt/completion pairs and "
                    "chats.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tiktoken", metavar="ENCODING",
                        help="a tiktoken encoding, e.g. gpt2 (needs: pip install tiktoken)")
    source.add_argument("--tokenizer", metavar="PATH",
                        help="a byte-level BPE tokenizer.json (needs: pip install tokenizers)")
    parser.add_argument("inputs", nargs="+", metavar="FILE",
                        help="UTF-8 text files (one document each), JSON lines (.jsonl, .json) "
                             "or Parquet (.parquet) files of records (one document each)")
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
    records = parser.add_argument_group("records (JSON lines and Parquet inputs)")
    records.add_argument("--input-format", choices=("auto",) + INPUT_FORMATS, default="auto",
                         help="read every input as this format (default auto: .jsonl and .json "
                              "are JSON lines, .parquet is Parquet, anything else text)")
    records.add_argument("--record-format", choices=("auto",) + RECORD_FORMATS, default="auto",
                         help="read every record as this kind (default auto: each file's kind "
                              "from its first record's keys: chat, else pair, else text)")
    records.add_argument("--json-keys", default="text", metavar="KEY",
                         help="the key of a text record's string (default text)")
    records.add_argument("--prompt-key", default="prompt", metavar="KEY",
                         help="the key of a pair's prompt (default prompt)")
    records.add_argument("--completion-key", default="completion", metavar="KEY",
                         help="the key of a pair's completion (default completion)")
    records.add_argument("--messages-key", default="messages", metavar="KEY",
                         help="the key of a chat's list of {role, content} (default messages)")
    records.add_argument("--tokenizer-config", metavar="PATH",
                         help="the tokenizer_config.json whose chat_template (and special tokens) "
                              "render chats (default: the one beside --tokenizer)")
    records.add_argument("--chat-template", metavar="FILE",
                         help="a jinja chat template file to use instead of tokenizer_config.json's")
    mask = records.add_mutually_exclusive_group()
    mask.add_argument("--mask-prompt", dest="mask_prompt", action="store_true", default=True,
                      help="the loss mask counts only completions and assistant contents "
                           "(the default)")
    mask.add_argument("--no-mask-prompt", dest="mask_prompt", action="store_false",
                      help="the loss mask counts every token")
    records.add_argument("--write-mask", action="store_true",
                         help="write X.mask.bin beside each shard even when no input is of pairs "
                              "or chats (all 1 for text)")
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


def plan_inputs(args, documents):
    """[(path, JsonlInput/ParquetInput or None for text, record kind or None)] for the
    inputs, reading each record file's first record (or columns) to find its kind."""
    plans = []
    for path in args.inputs:
        input_ = open_input(path, args.input_format)
        kind = None
        if input_ is not None:
            keys = input_.keys()
            if keys is None:
                print(f"{TOOL}: note: {path} holds no records; skipped", file=sys.stderr)
                continue
            kind = (args.record_format if args.record_format != "auto"
                    else documents.detect(keys[1], input_.where(keys[0])))
            if input_.format == "parquet":
                columns = documents.columns(kind)
                missing = [c for c in columns if c not in keys[1]]
                if missing:
                    raise ToolError(f"{path}: no column {quoted(missing[0])} for {kind} "
                                    f"records (it has {', '.join(map(quoted, keys[1]))})")
                if kind != "chat":
                    input_.check_strings(columns)
        plans.append((path, input_, kind))
    return plans


def tokenize(args):
    for path in args.inputs:
        if not os.path.isfile(path):
            raise ToolError(f"{path}: no such input file" if not os.path.exists(path)
                            else f"{path}: not a file (inputs are text, JSON lines or Parquet "
                                 f"files)")
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

    documents = Documents(args, source, None)
    plans = plan_inputs(args, documents)
    kinds = {kind for _, _, kind in plans}
    if "chat" in kinds:
        config = args.tokenizer_config
        if config is None and args.tokenizer:
            config = os.path.join(os.path.dirname(args.tokenizer), "tokenizer_config.json")
            if args.chat_template is not None and not os.path.isfile(config):
                config = None  # the template alone, without special tokens to give it
        if config is None and args.chat_template is None:
            raise ToolError("chat records need the tokenizer's chat template: with --tiktoken "
                            "name a tokenizer_config.json with --tokenizer-config (or a template "
                            "with --chat-template FILE)")
        documents.chat_template = ChatTemplate(config, args.chat_template, source)
    with_mask = args.write_mask or bool(kinds & {"pair", "chat"})

    name = args.name or os.path.splitext(os.path.basename(args.inputs[0]))[0]
    os.makedirs(args.output_dir, exist_ok=True)
    earlier = {f for f in os.listdir(args.output_dir)
               if f.startswith(f"{name}_") and f.endswith(".bin")}

    total_bytes = sum(os.path.getsize(p) for p in args.inputs)
    progress = Progress(total_bytes, args.quiet)
    writer = ShardWriter(args.output_dir, name, dtype, args.shard_tokens, args.val_tokens,
                         with_mask)
    stream = TokenStream(source, writer, eot)
    # Text is encoded a batch at a time: both libraries encode a batch on several threads.
    # A text file's batch is a piece (--chunk-bytes) for each thread; records are encoded
    # RECORD_BATCH_BYTES at a time. The library's encodings of a batch take about 45 bytes
    # a byte of text (tokenizers: ids, offsets and token strings), the peak memory.
    batch_bytes = max(args.chunk_bytes, 1 << 20) * min(16, os.cpu_count() or 1)
    record_batch = RECORD_BATCH_BYTES
    done_bytes = 0
    counts = {"text file": 0, "text": 0, "pair": 0, "chat": 0, "empty text": 0}
    try:
        for path, input_, kind in plans:
            if input_ is None:
                done_bytes = tokenize_text_file(path, args, source, stream, writer, progress,
                                                done_bytes, batch_bytes)
                counts["text file"] += os.path.getsize(path) > 0
                continue
            make = {"text": documents.text, "pair": documents.pair, "chat": documents.chat}[kind]
            batch, batch_chars, file_start, done = [], 0, done_bytes, 0
            for number, done, record in input_.records(documents.columns(kind), record_batch):
                document = make(record, Where(input_, number))
                if document is None:
                    counts["empty text"] += 1
                    continue
                counts[kind] += 1
                segments, eot_mask = document
                new = True
                for group in segment_groups(segments, record_batch):
                    batch.append((group, eot_mask, number, new))
                    batch_chars += sum(len(s[0]) for s in group)
                    new = False
                    if batch_chars >= record_batch:
                        stream.encode(batch, input_)
                        batch, batch_chars = [], 0
                        progress.update(file_start + done, writer.total)
            if batch:
                stream.encode(batch, input_)
            done_bytes = file_start + os.path.getsize(path)
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
        raise
    progress.update(done_bytes, writer.total, final=True)

    tokenizer_path = os.path.join(args.output_dir, "tokenizer.json")
    if not (args.tokenizer and os.path.exists(tokenizer_path)
            and os.path.samefile(args.tokenizer, tokenizer_path)):
        write_atomic(tokenizer_path, source.tokenizer_json())
    sync_directory(args.output_dir)

    if not args.quiet:
        for path, count, mask_path, counted in written:
            line = f"{TOOL}: wrote {path}: {count:,} tokens ({dtype})"
            if mask_path:
                line += f"; {os.path.basename(mask_path)}: the loss counts {counted:,}"
            print(line, file=sys.stderr)
        for path in writer.removed_masks:
            print(f"{TOOL}: note: removed {path}, an earlier run's mask of a shard this run "
                  f"replaced without one", file=sys.stderr)
        print(f"{TOOL}: wrote {tokenizer_path} ({source.description}, {source.vocab_size} ids)",
              file=sys.stderr)
        labels = {"text file": "text file", "text": "text record", "pair": "pair",
                  "chat": "chat"}
        made = [plural(counts[k], labels[k]) for k in labels if counts[k]]
        print(f"{TOOL}: {plural(stream.documents, 'document')} ({', '.join(made)})"
              + (f"; {plural(counts['empty text'], 'empty text record')} skipped"
                 if counts["empty text"] else ""), file=sys.stderr)
        chat_template = documents.chat_template
        if chat_template is not None and chat_template.turns_without_end:
            print(f"{TOOL}: note: in {chat_template.turns_without_end:,} assistant turns the "
                  f"chat template wrote no special token right after the content, so the mask "
                  f"counts the content alone there (no end-of-turn token is learned)",
                  file=sys.stderr)
        stale = sorted(earlier - {os.path.basename(p) for w in written
                                  for p in (w[0], w[2]) if p})
        for f in stale:
            print(f"{TOOL}: note: {os.path.join(args.output_dir, f)} is from an earlier run; "
                  f"remove it if it is not yours", file=sys.stderr)
        train = [w[0] for w in written if "_train_" in os.path.basename(w[0])]
        val = [w[0] for w in written if "_val_" in os.path.basename(w[0])]
        if len(train) > 1:
            print(f"{TOOL}: note: data.train_path takes one shard; these are {len(train)} "
                  f"(--shard-tokens)", file=sys.stderr)
        keys = f"--set data.train_path={train[0]} --set model.vocab_size={source.vocab_size}"
        if val:
            keys += f" --set data.val_path={val[0]}"
        print(f"{TOOL}: train on them with: tandem train --config FILE {keys}"
              + (" (it reads each X.mask.bin beside its shard)" if with_mask else ""),
              file=sys.stderr)
        total = sum(w[1] for w in written)
        if with_mask:
            counted = sum(w[3] for w in written)
            print(f"{TOOL}: {total:,} tokens written; the loss masks count {counted:,} of them "
                  f"({100.0 * counted / total:.1f}%)", file=sys.stderr)
        else:
            print(f"{TOOL}: {total:,} tokens written (no loss mask: every token counts)",
                  file=sys.stderr)
    return written


def segment_groups(segments, size):
    """A document's segments in groups of about `size` characters (one group, mostly), so
    that a long record (a book) is encoded a batch at a time too."""
    if len(segments) == 1 or sum(len(s[0]) for s in segments) <= size:
        return [segments]
    groups, group, chars = [], [], 0
    for segment in segments:
        group.append(segment)
        chars += len(segment[0])
        if chars >= size:
            groups.append(group)
            group, chars = [], 0
    return groups + [group] if group else groups


def plural(count, noun):
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


class Where:
    """FILE:LINE (FILE: row N) of a record, made into text only when an error names it."""

    __slots__ = ("input", "number")

    def __init__(self, input_, number):
        self.input, self.number = input_, number

    def __str__(self):
        return self.input.where(self.number)

    def __format__(self, spec):
        return format(str(self), spec)


def tokenize_text_file(path, args, source, stream, writer, progress, done_bytes, batch_bytes):
    """One text file, one document, encoded in pieces (read_pieces); the bytes done after it."""
    if os.path.getsize(path) == 0:
        print(f"{TOOL}: note: {path} is empty; skipped", file=sys.stderr)
        return done_bytes
    stream.start_document(1)
    batch, batch_size = [], 0
    for offset, piece in read_pieces(path, args.chunk_bytes, source.chunkable):
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
    return done_bytes


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
        print(f"{TOOL}: interrupted; no shard or mask was written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
