#!/usr/bin/env python3
"""tools/tokenize_bpe.py on records: JSON lines and Parquet, text records, prompt/completion
pairs and chats, and the loss masks it writes beside the shards.

    python3 tests/runs/tokenize_jsonl_test.py SOURCE_DIR

SOURCE_DIR is the repository's root (CTest: add_test(NAME tokenize_jsonl COMMAND python3
tests/runs/tokenize_jsonl_test.py ${CMAKE_SOURCE_DIR}), SKIP_RETURN_CODE 77). Exit 0: every
check passed; 77: skipped, saying why, where python3 lacks tokenizers, jinja2 or pyarrow
(`make test` installs them: the Makefile's pydeps); 1: a check failed (each failure is
printed). The tiktoken check runs only where tiktoken is installed (the encoding is made
from the test's tokenizer: nothing is downloaded).

It trains a tiny byte-level BPE with the tokenizers package (as tokenize_bpe_helper.py
does, with ChatML's and Llama 3's special tokens), writes Qwen2.5's ChatML template and a
Llama-3-style template (Llama 3's, refusing unknown roles) into tokenizer_config.json files,
runs the tool and reads the shards and masks back with struct, and checks: text records
(--json-keys) give the ids of each text with the end-of-text token between them and no
mask (all 1 with --write-mask); pairs are the prompt's ids then the completion's, and the
masked ids decode to exactly each completion and the end-of-text token after it; chats
decode to the template's rendering, and the masked ids to exactly each assistant content
(trimmed by Llama's template) and its end-of-turn token; --val-tokens and --shard-tokens cut
masks with their shards; Parquet gives the same bytes as the same JSON lines; every bad
record is refused naming FILE:LINE (FILE: row N), and a failed run leaves no shard, mask
or temporary file; the mask header is magic 20261128, version 1, the shard's count.
"""

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

QWEN25_TEMPLATE = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
'''

# Llama 3's template (Meta-Llama-3-8B-Instruct), refusing roles other than its three.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
SHARD_MAGIC = {20240520: "H", 20240801: "I"}
MASK_MAGIC, MASK_VERSION = 20261128, 1

PAIRS = [
    {"prompt": "First Citizen:\nBefore we proceed any further, hear me speak.\n",
     "completion": "All:\nSpeak, speak."},
    {"prompt": "Question: what is the city's name?\nAnswer:", "completion": " Rome, my lord."},
    {"prompt": "Ünïcödé prompt, 日本語 ", "completion": "et une réponse — 答え.\n"},
    {"prompt": "Trailing spaces   ", "completion": "   and leading ones"},
    {"prompt": "", "completion": "A completion with an empty prompt."},
]

CHATS = [
    [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello, friend."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who are you?"},
     {"role": "assistant", "content": "A citizen.  "}, {"role": "user", "content": "More?"},
     {"role": "assistant", "content": "\n No more, 日本."}],
    [{"role": "user", "content": "Ünïcödé?\n"},
     {"role": "assistant", "content": " The answer\n\nis here — ça va."}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
     {"role": "user", "content": "and the last word is the user's"}],
]

TEXTS = ["Before we proceed any further, hear me speak.\r\n", "",
         "Ünïcödé and 日本語 text\twith a tab", "Speak, speak.\n\n  \n"]


class Check:
    failures = []

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            print(f"ok     {self.name}")
            return False
        if issubclass(kind, Exception):  # a failed check, or one that broke on the output
            Check.failures.append(self.name)
            what = "" if kind is AssertionError else f"{kind.__name__}: "
            print(f"FAILED {self.name}: {what}{value}")
            return True
        return False


def require(condition, message):
    if not condition:
        raise AssertionError(message)


class Env:
    def __init__(self, source_dir, work):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        self.tool = os.path.join(source_dir, "tools", "tokenize_bpe.py")
        self.helper = os.path.join(source_dir, "tests", "runs", "tokenize_bpe_helper.py")
        self.work = work
        with open(os.path.join(source_dir, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
            play = f.read()[:200000]
        extra = "".join(p["prompt"] + p["completion"] for p in PAIRS) + "".join(TEXTS)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=SPECIAL_TOKENS)
        tok.train_from_iterator([play, extra], trainer=trainer)
        self.tok = tok
        self.ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
        self.dirs = {}
        for name, template, bos in (("qwen", QWEN25_TEMPLATE, None),
                                    ("llama", LLAMA3_TEMPLATE, "<|begin_of_text|>")):
            d = os.path.join(work, name)
            os.makedirs(d)
            tok.save(os.path.join(d, "tokenizer.json"))
            config = {"chat_template": template, "eos_token": "<|im_end|>", "bos_token": bos}
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(config, f)
            self.dirs[name] = d
        self.tokenizer = os.path.join(self.dirs["qwen"], "tokenizer.json")
        self.runs = 0

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def path(self, name):
        return os.path.join(self.work, name)

    def write_jsonl(self, name, records):
        path = self.path(name)
        with open(path, "wb") as f:
            for r in records:
                f.write((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n")
        return path

    def write_parquet(self, name, records, row_group_size=2):
        import pyarrow as pa
        import pyarrow.parquet as pq
        path = self.path(name)
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
        return path

    def run(self, inputs, *options, tokenizer=None, expect=0):
        """Runs the tool into a fresh directory; (directory, stderr)."""
        self.runs += 1
        out = self.path(f"out{self.runs}")
        command = [sys.executable, self.tool, "--tokenizer", tokenizer or self.tokenizer,
                   "--output-dir", out, "--name", "data", *options, *inputs]
        run = subprocess.run(command, capture_output=True, text=True)
        require(run.returncode == expect,
                f"{' '.join(command[1:])}: exit {run.returncode}, not {expect}: {run.stderr}")
        return out, run.stderr


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    require(header[0] in SHARD_MAGIC, f"{path}: magic {header[0]}")
    code = SHARD_MAGIC[header[0]]
    count = header[2]
    require(len(data) == 1024 + count * struct.calcsize(code), f"{path}: length")
    return list(struct.unpack(f"<{count}{code}", data[1024:]))


def read_mask(path, count):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    require(header[:3] == (MASK_MAGIC, MASK_VERSION, count),
            f"{path}: header {header[:3]}, not ({MASK_MAGIC}, {MASK_VERSION}, {count})")
    require(not any(header[3:]), f"{path}: header ints past the third are not zero")
    require(len(data) == 1024 + count, f"{path}: {len(data)} bytes, not 1024 + {count}")
    mask = list(data[1024:])
    require(set(mask) <= {0, 1}, f"{path}: bytes other than 0 and 1")
    return mask


def shards(out, split="train"):
    """The ids and mask (None without a mask file) of every shard of a split, in order."""
    names = sorted(f for f in os.listdir(out) if f.startswith(f"data_{split}_")
                   and f.endswith(".bin") and not f.endswith(".mask.bin"))
    ids, mask, has_mask = [], [], None
    for name in names:
        part = read_shard(os.path.join(out, name))
        mask_path = os.path.join(out, name[:-len(".bin")] + ".mask.bin")
        require(has_mask in (None, os.path.exists(mask_path)), "some shards have masks, not all")
        has_mask = os.path.exists(mask_path)
        ids += part
        if has_mask:
            mask += read_mask(mask_path, len(part))
    return ids, (mask if has_mask else None), len(names)


def runs(ids, mask):
    """[(mask value, ids)] of the maximal runs of equal mask values."""
    out = []
    for i, m in zip(ids, mask):
        if out and out[-1][0] == m:
            out[-1][1].append(i)
        else:
            out.append((m, [i]))
    return out


def leftovers(out):
    return sorted(f for f in os.listdir(out) if ".bin" in f or ".tmp-" in f) \
        if os.path.isdir(out) else []


def render(template, messages, **tokens):
    """The chat as transformers renders it (written here apart from the tool's code)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=False,
                                            **tokens)


def check_text_records(env):
    with Check("text records (--json-keys) are each text's ids, the end-of-text token between"):
        path = env.write_jsonl("texts.jsonl", [{"body": t, "n": 1} for t in TEXTS])
        out, err = env.run([path], "--json-keys", "body", "--eot")
        ids, mask, _ = shards(out)
        eot = env.ids["<|endoftext|>"]
        want = []
        for t in (t for t in TEXTS if t):
            want += ([eot] if want else []) + env.encode(t)
        require(ids == want, "the ids are not the texts' with <|endoftext|> between them")
        require(mask is None, "a mask was written for text records")
        require("1 empty text record skipped" in err, f"the empty record is not reported: {err}")
        out, _ = env.run([path], "--json-keys", "body", "--eot", "--write-mask")
        ids2, mask, _ = shards(out)
        require(ids2 == want and mask == [1] * len(want), "--write-mask: not all 1")
    with Check("a long text record is encoded in pieces with the ids of the whole"):
        with open(os.path.join(os.path.dirname(env.tool), "..", "data", "tinyshakespeare.txt"),
                  encoding="utf-8") as f:
            text = f.read()[:60000]
        path = env.write_jsonl("long.jsonl", [{"text": text}])
        out, _ = env.run([path], "--chunk-bytes", "1000")
        require(shards(out)[0] == env.encode(text), "pieces changed the ids")
    with Check("a text file and text records mix: one document each"):
        text_file = env.path("plain.txt")
        with open(text_file, "w", encoding="utf-8") as f:
            f.write("A plain text file.\n")
        pairs = env.write_jsonl("mixed_pairs.jsonl", PAIRS[:2])
        out, _ = env.run([text_file, pairs], "--eot")
        ids, mask, _ = shards(out)
        head = env.encode("A plain text file.\n") + [env.ids["<|endoftext|>"]]
        require(ids[:len(head)] == head and mask[:len(head)] == [1] * len(head),
                "the text file (and the end-of-text after it) is not all counted")


def pair_ids(env, pairs, eot, mask_prompt=True):
    ids, mask = [], []
    for n, p in enumerate(pairs):
        if n and eot is not None:
            ids.append(eot)
            mask.append(1)
        prompt, completion = env.encode(p["prompt"]), env.encode(p["completion"])
        ids += prompt + completion
        mask += [0 if mask_prompt else 1] * len(prompt) + [1] * len(completion)
    return ids, mask


def check_pairs(env):
    eot = env.ids["<|endoftext|>"]
    path = env.write_jsonl("pairs.jsonl", PAIRS)
    with Check("pairs: the prompt's ids then the completion's, the mask on the completion"):
        out, err = env.run([path], "--eot")
        ids, mask, count = shards(out)
        want_ids, want_mask = pair_ids(env, PAIRS, eot)
        require(count == 1, f"{count} shards")
        require(ids == want_ids, "ids are not each prompt's then each completion's")
        require(mask == want_mask, "the mask is not 0 on prompts, 1 on completions and EOTs")
        counted = [env.decode(r) for m, r in runs(ids, mask) if m == 1]
        completions = [p["completion"] for p in PAIRS]
        want = [c + "<|endoftext|>" for c in completions[:-1]] + [completions[-1]]
        # The fifth prompt is empty, so its completion's run joins the fourth's.
        want = want[:3] + [want[3] + want[4]]
        require(counted == want, f"masked ids decode to {counted}, not {want}")
        uncounted = [env.decode(r) for m, r in runs(ids, mask) if m == 0]
        require(uncounted == [p["prompt"] for p in PAIRS if p["prompt"]], "prompts")
        require(f"{sum(mask):,} of them" in err and "tokens written" in err,
                f"no summary of the counted tokens: {err}")
    with Check("pairs: --no-mask-prompt counts every token, same ids"):
        out, _ = env.run([path], "--eot", "--no-mask-prompt")
        ids, mask, _ = shards(out)
        require(ids == want_ids and mask == [1] * len(ids), "not all 1")
    with Check("pairs: other keys (--prompt-key, --completion-key, --record-format)"):
        other = env.write_jsonl("qa.jsonl", [{"q": p["prompt"], "a": p["completion"],
                                              "text": "ignored"} for p in PAIRS])
        out, _ = env.run([other], "--eot", "--prompt-key", "q", "--completion-key", "a",
                         "--record-format", "pair")
        require(shards(out)[:2] == (want_ids, want_mask), "not the same shard")
    with Check("pairs: --val-tokens and --shard-tokens cut each mask with its shard"):
        out, _ = env.run([path], "--eot", "--val-tokens", "7", "--shard-tokens", "11")
        val_ids, val_mask, _ = shards(out, "val")
        ids, mask, count = shards(out)
        require(len(val_ids) == 7 and count == -(-(len(want_ids) - 7) // 11),
                f"{len(val_ids)} val tokens, {count} train shards")
        require(val_ids + ids == want_ids and val_mask + mask == want_mask,
                "the shards and masks together are not the whole")
    with Check("a shard written without a mask removes an earlier run's mask beside it"):
        out, _ = env.run([path])
        texts = env.write_jsonl("texts2.jsonl", [{"text": "x y z"}])
        command = [sys.executable, env.tool, "--tokenizer", env.tokenizer, "--output-dir", out,
                   "--name", "data", texts]
        run = subprocess.run(command, capture_output=True, text=True)
        require(run.returncode == 0, run.stderr)
        require(not os.path.exists(os.path.join(out, "data_train_000000.mask.bin")),
                "the earlier mask is still there")
        require("removed" in run.stderr, f"no note of the removed mask: {run.stderr}")


def check_chats(env):
    eot = env.ids["<|endoftext|>"]
    path = env.write_jsonl("chats.jsonl", [{"messages": c, "id": i} for i, c in enumerate(CHATS)])
    for name, end, trim in (("qwen", "<|im_end|>", False), ("llama", "<|eot_id|>", True)):
        tokenizer = os.path.join(env.dirs[name], "tokenizer.json")
        template = QWEN25_TEMPLATE if name == "qwen" else LLAMA3_TEMPLATE
        tokens = {"bos_token": "<|begin_of_text|>"} if name == "llama" else {}
        with Check(f"chats, {name}'s template: the ids are its rendering; the masked ids are "
                   f"each assistant content and {end}"):
            out, err = env.run([path], "--eot", tokenizer=tokenizer)
            ids, mask, _ = shards(out)
            rendered = "<|endoftext|>".join(render(template, c, **tokens) for c in CHATS)
            require(env.decode(ids) == rendered, "the ids do not decode to the rendering")
            counted = [env.decode(r) for m, r in runs(ids, mask) if m == 1]
            want = [(m["content"].strip() if trim else m["content"]) + end
                    for c in CHATS for m in c if m["role"] == "assistant"]
            require(counted == want, f"masked ids decode to {counted}, not {want}")
            # Each answer is encoded on its own: its ids are its content's, then the token.
            masked = [r for m, r in runs(ids, mask) if m == 1]
            require(masked == [env.encode(w[:-len(end)]) + [env.ids[end]] for w in want],
                    "an answer's ids are not its content's ids and the end-of-turn token")
            eots = [m for i, m in zip(ids, mask) if i == eot]
            require(eots == [0] * (len(CHATS) - 1), f"end-of-text tokens after chats: {eots}")
            require("4 chats" in err, err)
        with Check(f"chats, {name}'s template: --no-mask-prompt counts all, the same text"):
            out, _ = env.run([path], "--eot", "--no-mask-prompt", tokenizer=tokenizer)
            ids, mask, _ = shards(out)
            require(env.decode(ids) == rendered and mask == [1] * len(ids), "not so")
    with Check("chats: --tokenizer-config and --chat-template name the template"):
        tokenizer = os.path.join(env.work, "bare-tokenizer.json")
        shutil.copy(env.tokenizer, tokenizer)
        out, _ = env.run([path], tokenizer=tokenizer, expect=1)  # no tokenizer_config.json
        a, _ = env.run([path], "--tokenizer-config",
                       os.path.join(env.dirs["qwen"], "tokenizer_config.json"), tokenizer=tokenizer)
        template = env.path("qwen.jinja")
        with open(template, "w") as f:
            f.write(QWEN25_TEMPLATE)
        b, _ = env.run([path], "--chat-template", template, tokenizer=tokenizer)
        require(shards(a) == shards(b), "--chat-template differs from --tokenizer-config")


def check_parquet(env):
    cases = [("texts", [{"text": t} for t in TEXTS], ()),
             ("pairs", PAIRS, ()),
             ("chats", [{"messages": c} for c in CHATS], ())]
    for name, records, options in cases:
        with Check(f"Parquet {name} give the bytes of the same JSON lines"):
            jsonl = env.write_jsonl(f"pq_{name}.jsonl", records)
            parquet = env.write_parquet(f"pq_{name}.parquet", records)
            a, _ = env.run([jsonl], "--eot", "--shard-tokens", "50", *options)
            b, _ = env.run([parquet], "--eot", "--shard-tokens", "50", *options)
            files = sorted(f for f in os.listdir(a) if f.endswith(".bin"))
            require(files == sorted(f for f in os.listdir(b) if f.endswith(".bin")),
                    "other files")
            for f in files:
                with open(os.path.join(a, f), "rb") as x, open(os.path.join(b, f), "rb") as y:
                    require(x.read() == y.read(), f"{f} differs")
    with Check("Parquet: messages whose structs have fields other messages lack"):
        chats = [[{"role": "user", "content": "q", "name": "me"},
                  {"role": "assistant", "content": "a"}]]
        a, _ = env.run([env.write_jsonl("pq_fields.jsonl", [{"messages": c} for c in chats])])
        b, _ = env.run([env.write_parquet("pq_fields.parquet", [{"messages": c} for c in chats])])
        require(shards(a) == shards(b), "a struct's null field changed the rendering")


def check_errors(env):
    pair = json.dumps(PAIRS[0]).encode()
    chat = json.dumps({"messages": CHATS[0]}).encode()
    text = json.dumps({"text": "fine"}).encode()
    cases = [  # (file, lines, line or row named, a phrase of the message, options)
        ("bad_json.jsonl", [text, text, b'{"text": "a",}'], 3, "not JSON", ()),
        ("bad_utf8.jsonl", [text, b'{"text": "caf\xe9"}'], 2, "not UTF-8", ()),
        ("not_object.jsonl", [text, b"[1, 2]"], 2, "not a JSON object", ()),
        ("no_completion.jsonl", [pair, pair, b'{"prompt": "p"}'], 3, 'no "completion" key', ()),
        ("wrong_type.jsonl", [text, b'{"text": 5}'], 2, '"text" is a number, not a string', ()),
        ("empty_completion.jsonl", [pair, b'{"prompt": "p", "completion": ""}'], 2,
         '"completion" is empty', ()),
        ("empty_messages.jsonl", [chat, b'{"messages": []}'], 2, '"messages" is empty', ()),
        ("bad_message.jsonl", [chat, b'{"messages": [{"role": "user", "content": 3}]}'], 2,
         "messages[0].content is a number", ()),
        ("no_role.jsonl", [chat, b'{"messages": [{"content": "x"}]}'], 2,
         'messages[0] has no "role"', ()),
        ("refused_role.jsonl", [chat, chat, json.dumps({"messages": [
            {"role": "user", "content": "q"}, {"role": "robot", "content": "a"}]}).encode()], 3,
         "refuses this chat: Unknown role: robot", ("llama",)),
        ("no_keys.jsonl", [b'{"body": "x"}'], 1, "none of the keys read", ()),
    ]
    for name, lines, line, phrase, options in cases:
        with Check(f"a bad record is refused with FILE:LINE: {name}"):
            path = env.write_jsonl(name, lines)
            tokenizer = (os.path.join(env.dirs["llama"], "tokenizer.json")
                         if "llama" in options else None)
            out, err = env.run([path], expect=1, tokenizer=tokenizer)
            require(f"{path}:{line}: " in err and phrase in err,
                    f"the message does not name {path}:{line} and say {phrase!r}: {err}")
            require(err.count("\n") == 1 and err.startswith("tokenize_bpe: error: "),
                    f"not one line: {err}")
            require(leftovers(out) == [], f"left {leftovers(out)}")
    with Check("a bad Parquet row is refused with FILE: row N:"):
        path = env.write_parquet("bad.parquet", [{"text": "a"}, {"text": "b"}, {"text": "c"},
                                                 {"text": None}])
        out, err = env.run([path], expect=1)
        require(f"{path}: row 3: " in err and '"text" is null' in err, err)
        require(leftovers(out) == [], f"left {leftovers(out)}")
    with Check("a JSON array is refused with the command that makes it JSON lines"):
        path = env.path("array.json")
        with open(path, "w") as f:
            json.dump(PAIRS, f)
        out, err = env.run([path], expect=1)
        require("not JSON lines" in err and "jq -c" in err, err)
    with Check("a run that fails after shards were complete leaves no shard, mask or temp file"):
        good = env.write_jsonl("good.jsonl", PAIRS * 20)
        bad = env.write_jsonl("late_bad.jsonl", [pair, b'{"prompt": "p", "completion": 1}'])
        out, err = env.run([good, bad], "--shard-tokens", "16", "--val-tokens", "5", expect=1)
        require(f"{bad}:2: " in err, err)
        require(leftovers(out) == [], f"left {leftovers(out)}")


def check_tiktoken(env):
    if importlib.util.find_spec("tiktoken") is None:
        print("note   the tiktoken check skipped: python3 cannot import tiktoken")
        return
    with Check("tiktoken (encode_ordinary_batch) gives the shards and masks of tokenizers"):
        plugin = env.path("plugin")
        subprocess.run([sys.executable, env.helper, "tiktoken-plugin", plugin, env.tokenizer],
                       check=True)
        pairs = env.write_jsonl("tt_pairs.jsonl", PAIRS)
        chats = env.write_jsonl("tt_chats.jsonl", [{"messages": c} for c in CHATS])
        a, _ = env.run([pairs, chats], "--eot")
        command = [sys.executable, env.tool, "--tiktoken", "tandem_test_bpe", "--tokenizer-config",
                   os.path.join(env.dirs["qwen"], "tokenizer_config.json"), "--output-dir",
                   env.path("tt_out"), "--name", "data", "--eot", pairs, chats]
        run = subprocess.run(command, capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=plugin))
        require(run.returncode == 0, run.stderr)
        require(shards(a) == shards(env.path("tt_out")), "tiktoken's shards differ")


def main(argv):
    if len(argv) != 2:
        print("usage: tokenize_jsonl_test.py SOURCE_DIR")
        return 2
    for module in ("tokenizers", "jinja2", "pyarrow"):
        try:
            __import__(module)
        except ImportError:
            print(f"SKIPPED: {sys.executable} cannot import {module} "
                  f"({sys.executable} -m pip install {module})")
            return 77
    work = tempfile.mkdtemp(prefix="tokenize_jsonl_test.")
    try:
        env = Env(os.path.abspath(argv[1]), work)
        check_text_records(env)
        check_pairs(env)
        check_chats(env)
        check_parquet(env)
        check_errors(env)
        check_tiktoken(env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if Check.failures:
        print(f"FAILED: {len(Check.failures)} checks: {', '.join(Check.failures)}")
        return 1
    print(f"PASSED: {env.runs} runs of tokenize_bpe.py")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
