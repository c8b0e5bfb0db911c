#!/usr/bin/env python3
"""What tests/runs/test_tokenize_bpe.cc asks of the tokenizer libraries themselves.

    tokenize_bpe_helper.py train OUT_JSON VOCAB_SIZE TEXT_FILE...
        trains a byte-level BPE (GPT-2's pre-tokenizer, <|endoftext|> as id 0) on the files
    tokenize_bpe_helper.py wordlevel OUT_JSON
        writes a tokenizer.json that is not byte-level BPE
    tokenize_bpe_helper.py encode OUT_JSON TOKENIZER_JSON TEXT_FILE...
        {"whole": ids of each file's text, "by_line": the same encoded line by line,
         "vocab_size": the tokenizer's}
    tokenize_bpe_helper.py tiktoken-plugin DIR TOKENIZER_JSON
        writes DIR/tiktoken_ext/tandem_test_bpe.py: the tokenizer's vocabulary as a tiktoken
        encoding "tandem_test_bpe" (GPT-2's regex), so tiktoken needs no download
    tokenize_bpe_helper.py tiktoken-encode OUT_JSON ENCODING TEXT_FILE...
        {"whole": tiktoken's ids of each file's text}

Needs the tokenizers package (tiktoken for the tiktoken commands); text is read as bytes
and decoded as UTF-8, so "\\r\\n" stays what it is.
"""

import json
import os
import sys


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def train(out, vocab_size, files):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator([read_text(f) for f in files], trainer=trainer)
    tok.save(out)


def wordlevel(out):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["to be or not to be"],
                            trainer=trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(out)


def encode(out, tokenizer_json, files):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)

    def ids(text):
        return tok.encode(text, add_special_tokens=False).ids

    texts = [read_text(f) for f in files]
    whole = [ids(t) for t in texts]
    by_line = [[i for line in t.splitlines(keepends=True) for i in ids(line)] for t in texts]
    with open(out, "w") as f:
        json.dump({"whole": whole, "by_line": by_line,
                   "vocab_size": tok.get_vocab_size(with_added_tokens=True)}, f)


PLUGIN = '''import json

TOKENIZER = %r
GPT2_PATTERN = %r


def tandem_test_bpe():
    with open(TOKENIZER, encoding="utf-8") as f:
        spec = json.load(f)
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\\xa1"), ord("\\xac") + 1))
          + list(range(ord("\\xae"), ord("\\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
    ranks = {bytes(byte_of[ch] for ch in token): i
             for token, i in spec["model"]["vocab"].items() if token not in specials}
    return {"name": "tandem_test_bpe", "pat_str": GPT2_PATTERN, "mergeable_ranks": ranks,
            "special_tokens": specials}


ENCODING_CONSTRUCTORS = {"tandem_test_bpe": tandem_test_bpe}
'''

# tiktoken's own spelling of GPT-2's regex (tiktoken_ext/openai_public.py, r50k_pat_str).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def tiktoken_plugin(directory, tokenizer_json):
    os.makedirs(os.path.join(directory, "tiktoken_ext"), exist_ok=True)
    with open(os.path.join(directory, "tiktoken_ext", "tandem_test_bpe.py"), "w") as f:
        f.write(PLUGIN % (os.path.abspath(tokenizer_json), GPT2_PATTERN))


def tiktoken_encode(out, name, files):
    import tiktoken
    enc = tiktoken.get_encoding(name)
    with open(out, "w") as f:
        json.dump({"whole": [enc.encode_ordinary(read_text(p)) for p in files]}, f)


def main(argv):
    command, args = argv[0], argv[1:]
    if command == "train":
        train(args[0], args[1], args[2:])
    elif command == "wordlevel":
        wordlevel(args[0])
    elif command == "encode":
        encode(args[0], args[1], args[2:])
    elif command == "tiktoken-plugin":
        tiktoken_plugin(args[0], args[1])
    elif command == "tiktoken-encode":
        tiktoken_encode(args[0], args[1], args[2:])
    else:
        sys.exit(f"tokenize_bpe_helper.py: unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
