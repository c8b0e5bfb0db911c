#!/usr/bin/env python3
"""The commands of README.md, taken from the README itself so that they cannot drift.

A fenced block marked ```sh holds commands to paste as written; a ```text block holding
`build/tandem` holds a synopsis (placeholders in capitals, options in brackets), checked
but never run. A line continued with a backslash is one command. A command whose comment
says `# as root` is pasted only as root, `# as a user` only as a user with sudo; those are
the prerequisites, pasted before the rest.

  tools/readme_commands.py list [--role root|user] [README]
      the commands to paste, in order, separated by NUL bytes (tools/readme_walkthrough.sh)
  tools/readme_commands.py check --tandem build/tandem [README]
      without running them: every file they name exists, every `make` target is one of the
      Makefile's, every option of `build/tandem` and of the repository's scripts is one they
      take, and every `--set` config key (with its value) is accepted by `tandem plan`.
      Prints a line per command; exits 1 naming each problem (the CTest readme_commands_parse).
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLE_COMMENT = {"root": "# as root", "user": "# as a user"}


def blocks(readme):
    """(info string, [lines]) of each fenced block."""
    out, info, lines = [], None, []
    for line in open(readme, encoding="utf-8"):
        line = line.rstrip("\n")
        fence = re.match(r"^```(\S*)\s*$", line)
        if fence and info is None:
            info, lines = fence.group(1), []
        elif line.startswith("```") and info is not None:
            out.append((info, lines))
            info = None
        elif info is not None:
            lines.append(line)
    if info is not None:
        sys.exit(f"{readme}: a ``` block is not closed")
    return out


def commands(lines):
    """Backslash-continued lines joined; comment-only and empty lines dropped."""
    out, pending = [], ""
    for line in lines:
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        text = pending.strip()
        pending = ""
        if text and not text.startswith("#"):
            out.append(text)
    return out


def role_of(command):
    for role, comment in ROLE_COMMENT.items():
        if comment in command:
            return role
    return None


def runnable(readme, role):
    first, rest = [], []
    for info, lines in blocks(readme):
        if info != "sh":
            continue
        for command in commands(lines):
            who = role_of(command)
            if who is None:
                rest.append(command)
            elif who == role:
                first.append(command)
    return first + rest


def synopses(readme):
    return [c for info, lines in blocks(readme) if info == "text" for c in commands(lines)
            if "build/tandem" in c]


# --- check ---------------------------------------------------------------------------------

def words(command):
    try:
        return shlex.split(command, comments=True)
    except ValueError as e:
        return [f"<unparsable: {e}>"]


def tandem_help(tandem, subcommand, cache={}):
    if subcommand not in cache:
        run = subprocess.run([tandem, *subcommand, "--help"], capture_output=True, text=True)
        cache[subcommand] = run.stdout if run.returncode == 0 else None
    return cache[subcommand]


def make_targets():
    text = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def option_names(tokens):
    """--flag and --flag=value options among tokens, bracketed synopsis options included."""
    names = []
    for t in tokens:
        for m in re.finditer(r"(?<![\w-])(--[a-z][a-z0-9-]*)", t):
            names.append(m.group(1))
    return names


def check_command(command, tandem, synopsis):
    problems = []
    tokens = words(command)
    if tokens and tokens[0].startswith("<unparsable"):
        return [tokens[0]]
    # Files of the repository that the command reads.
    for t in tokens:
        for path in re.findall(r"(?:^|=)((?:configs|tools|data|bench|docs)/[\w./-]+)", t):
            if not os.path.exists(os.path.join(ROOT, path)):
                problems.append(f"names {path}, which is not in the repository")
    if tokens[:1] == ["make"]:
        for target in tokens[1:]:
            if not target.startswith("-") and "=" not in target and target not in make_targets():
                problems.append(f"make target '{target}' is not in the Makefile")
    for i, t in enumerate(tokens):
        if t.startswith("tools/") or t.startswith("bench/"):
            script = os.path.join(ROOT, t)
            if os.path.isfile(script):
                source = open(script, encoding="utf-8").read()
                for name in option_names(tokens[i + 1:]):
                    if name not in source:
                        problems.append(f"{t} takes no option {name}")
            break
    if "build/tandem" not in tokens:
        return problems
    at = tokens.index("build/tandem")
    args = tokens[at + 1:]
    subcommand = tuple(args[:2]) if args[:1] == ["bench"] else tuple(args[:1])
    help_text = tandem_help(tandem, subcommand)
    if help_text is None:
        return problems + [f"`tandem {' '.join(subcommand)}` is not a subcommand"]
    for name in option_names(args[len(subcommand):]):
        if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", help_text):
            problems.append(f"`tandem {' '.join(subcommand)}` has no option {name}")
    if synopsis:
        return problems
    # Config keys and values: `tandem plan` reads them as train would, without training.
    sets, config = [], None
    for i, t in enumerate(args):
        if t == "--set" and i + 1 < len(args):
            sets += ["--set", args[i + 1]]
        if t == "--config" and i + 1 < len(args):
            config = args[i + 1]
    if subcommand in {("train",), ("plan",), ("bench", "step")} and config:
        run = subprocess.run([tandem, "plan", "--config", config, *sets, *stand_in(config, sets)],
                             capture_output=True, text=True, cwd=ROOT)
        if run.returncode != 0:
            last = (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:]
            problems.append(f"`tandem plan` refuses its config and --set keys: {' '.join(last)}")
    return problems


def stand_in(config, sets):
    """For a fine-tune whose model is its train.init_from's (no model section) and whose
    model directory an earlier README command makes: a transformers-made directory of the
    repository in its place (its context as the sequence), so `tandem plan` can read it."""
    try:
        raw = json.load(open(os.path.join(ROOT, config), encoding="utf-8"))
    except (OSError, ValueError):
        return []
    init_from = raw.get("train", {}).get("init_from")
    for i, t in enumerate(sets):
        if t == "--set" and i + 1 < len(sets) and sets[i + 1].startswith("train.init_from="):
            init_from = sets[i + 1].split("=", 1)[1]
    if "model" in raw or not init_from or os.path.exists(os.path.join(ROOT, init_from)):
        return []
    return ["--set", "train.init_from=tests/fixtures/hf_qwen3", "--set", "train.seq_len=0"]


def check(readme, tandem):
    checked, failed = 0, 0
    everything = [(c, False) for c in runnable(readme, "root") + runnable(readme, "user")]
    everything += [(c, True) for c in synopses(readme)]
    seen = set()
    for command, synopsis in everything:
        if command in seen:
            continue
        seen.add(command)
        checked += 1
        problems = check_command(command, tandem, synopsis)
        print(("FAIL  " if problems else "ok    ") + command)
        for p in problems:
            print(f"      {p}")
        failed += bool(problems)
    if checked == 0:
        print(f"{readme}: no commands found (are the blocks still marked ```sh?)")
        return 1
    print(f"{checked} README commands checked, {failed} with problems")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    listing = sub.add_parser("list", help="the commands to paste, NUL-separated")
    listing.add_argument("--role", choices=["root", "user"], default="root")
    listing.add_argument("readme", nargs="?", default=os.path.join(ROOT, "README.md"))
    checking = sub.add_parser("check", help="every file, target, option and key named exists")
    checking.add_argument("--tandem", required=True, help="the built tandem binary")
    checking.add_argument("readme", nargs="?", default=os.path.join(ROOT, "README.md"))
    a = parser.parse_args()
    if a.what == "list":
        sys.stdout.write("".join(c + "\0" for c in runnable(a.readme, a.role)))
        return 0
    if not os.access(a.tandem, os.X_OK):
        print(f"readme_commands: no executable {a.tandem}; build it first (make build)")
        return 1
    return check(a.readme, os.path.abspath(a.tandem))


if __name__ == "__main__":
    sys.exit(main())
