#!/usr/bin/env python3
"""Crash safety of checkpoints, tested as storage systems test it: kill training with
SIGKILL at random moments (many of them while a lazy checkpoint is being written), resume,
and check every time that

  - resume picks the newest committed checkpoint (a step_* directory with its manifest)
    and verifies it (the trainer checks every checksum; none may be passed over: SIGKILL
    never damages a committed checkpoint);
  - no half-written checkpoint looks complete: every step_* directory has a manifest
    whose files exist with the sizes it lists;

and that a run resumed after its kills finishes with the same bits as one that was never
interrupted: the final checkpoint's weights and optimizer state, byte for byte. (When a
resumed run reaches the end before its next kill, it is checked and the run starts over.)

Each kill prints its seed; `--seed S --kills 1` replays that kill's timing (the step it
waits for and the delay after it).

With --signals it checks graceful stops instead: SIGINT, SIGTERM and SIGHUP stop the run
at the next step boundary with a checkpoint, and a second SIGINT ends it at once.

usage: checkpoint_crash_test.py TANDEM_BINARY SOURCE_DIR [--kills N] [--seed S] [--signals]
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

STEPS = 100


def write_config(work, source_dir, output_dir, checkpoint_memory_mb=0):
    corpus = os.path.join(work, "data.txt")
    if not os.path.exists(corpus):
        with open(os.path.join(source_dir, "data", "tinyshakespeare.txt"), "rb") as f:
            text = f.read(40000)
        with open(corpus, "wb") as f:
            f.write(text)
    config = {
        "model": {"vocab_size": 256, "context_length": 32, "n_layer": 2, "n_head": 2, "n_embd": 64},
        "data": {"train_path": corpus, "val_fraction": 0.1},
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5}},
        "offload_optimizer": {"schedule": "interleave", "stride": 2},
        "zero_optimization": {"sub_group_size": 20000},
        "train": {"steps": STEPS, "seed": 3, "eval_interval": 0, "checkpoint_interval": 2,
                  "keep_checkpoints": 3, "output_dir": output_dir, "sample_bytes": 0,
                  "checkpoint_memory_mb": checkpoint_memory_mb},
    }
    path = os.path.join(work, os.path.basename(output_dir) + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def committed(run_dir):
    """Step of each committed checkpoint directory (it has its manifest), newest first."""
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    steps = []
    for name in os.listdir(root):
        m = re.fullmatch(r"step_(\d{8})", name)
        if m and os.path.isfile(os.path.join(root, name, "manifest.json")):
            steps.append(int(m.group(1)))
    return sorted(steps, reverse=True)


def staging(run_dir):
    """Names of half-written checkpoint directories (staging, never published)."""
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return set()
    return {name for name in os.listdir(root) if ".tmp-" in name}


def check_looks_complete_only_when_complete(run_dir):
    root = os.path.join(run_dir, "checkpoints")
    for step in committed(run_dir):
        directory = os.path.join(root, "step_%08d" % step)
        with open(os.path.join(directory, "manifest.json")) as f:
            manifest = json.load(f)
        for name, entry in manifest["files"].items():
            path = os.path.join(directory, name)
            if not os.path.isfile(path) or os.path.getsize(path) != entry["bytes"]:
                sys.exit(f"FAIL: {directory} has a manifest but {name} is missing or has the wrong size")


def command(binary, config, run_dir, extra=()):
    cmd = [binary, "train", "--config", config, *extra]
    if committed(run_dir):
        cmd += ["--resume", run_dir]
    return cmd


def check_same_bits(want, run_dir, kills):
    got = final_state(run_dir)
    for name in want:
        if got[name] != want[name]:
            sys.exit(f"FAIL: after {kills} kills, the final {name} differs from the uninterrupted run's")


def final_state(run_dir):
    directory = os.path.join(run_dir, "checkpoints", "step_%08d" % STEPS)
    files = {}
    for name in ("model.safetensors", "optimizer.safetensors"):
        with open(os.path.join(directory, name), "rb") as f:
            files[name] = f.read()
    return files


def wait_for_step(proc, run_dir, target):
    """Until the run has committed a checkpoint of step >= target (or has ended)."""
    while proc.poll() is None:
        newest = committed(run_dir)
        if newest and newest[0] >= target:
            return
        time.sleep(0.002)


def signal_stops(args, work, want):
    """SIGINT, SIGTERM and SIGHUP stop the run at the next step boundary with a checkpoint,
    say how to continue and exit with 128 + the signal; a second SIGINT ends it at once.
    Resumed after each, the run ends with the uninterrupted run's bits."""
    run_dir = os.path.join(work, "signals")
    config = write_config(work, args.source_dir, run_dir)
    plan = [("SIGINT", 1), ("SIGTERM", 1), ("SIGHUP", 1), ("SIGINT", 2)]
    for name, count in plan:
        signum = getattr(signal, name)
        before = committed(run_dir)
        target = (before[0] if before else 0) + 4
        # The options a resume must keep, which the printed command carries over.
        metrics = os.path.join(work, "signals metrics.jsonl")
        extra = ["--metrics", metrics, "--stop-at-step", str(STEPS)]
        proc = subprocess.Popen(command(args.binary, config, run_dir, extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_step(proc, run_dir, target)
        if proc.poll() is not None:
            sys.exit(f"FAIL: the run ended before {name} was sent")
        for i in range(count):
            if i > 0:
                time.sleep(0.005)  # two signals at once would merge into one
            proc.send_signal(signum)
        out, err = proc.communicate()
        check_looks_complete_only_when_complete(run_dir)
        newest = committed(run_dir)
        if count == 1:
            if proc.returncode != 128 + signum:
                sys.exit(f"FAIL: after {name} the exit status is {proc.returncode}, not {128 + signum}:\n{err}")
            m = re.search(r"stopped by (\w+) after step (\d+); checkpoint (\S+)", err)
            if not m or m.group(1) != name or "to continue: " not in err:
                sys.exit(f"FAIL: after {name} the run did not say where it stopped and how to continue:\n{err}")
            carried = [f"--metrics '{metrics}'", f"--stop-at-step {STEPS}", f"--resume {run_dir}"]
            if not all(option in err for option in carried):
                sys.exit(f"FAIL: after {name} the command to continue lacks one of {carried}:\n{err}")
            if not newest or newest[0] != int(m.group(2)):
                sys.exit(f"FAIL: stopped after step {m.group(2)}, but the newest checkpoint is {newest[:1]}")
            print(f"{name}: stopped after step {m.group(2)} with a checkpoint, exit {proc.returncode}")
        else:
            # The second signal ends the process at once, unless the stop was already done.
            if proc.returncode not in (-signum, 128 + signum):
                sys.exit(f"FAIL: after {name} twice the exit status is {proc.returncode}:\n{err}")
            print(f"{name} twice: exit {proc.returncode}; newest committed step {newest[:1]}")
    done = subprocess.run(command(args.binary, config, run_dir), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"FAIL: the resumed run failed:\n{done.stderr}")
    check_same_bits(want, run_dir, len(plan))
    print("PASS: every signal stopped the run with a checkpoint; resumed, it ends with the "
          "uninterrupted run's bits")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("source_dir")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--checkpoint-memory-mb", type=int, default=0,
                        help="train.checkpoint_memory_mb of the killed runs: 1 streams every "
                             "checkpoint through a 1 MiB pool (the model's state is 1.4 MB)")
    parser.add_argument("--signals", action="store_true",
                        help="instead of kills: SIGINT, SIGTERM, SIGHUP and a double SIGINT")
    args = parser.parse_args()
    master = random.Random(args.seed if args.seed is not None else time.time_ns())
    work = tempfile.mkdtemp(prefix="tandem_crash_")
    try:
        # The uninterrupted run: its time calibrates the kill delays, its bits are the goal.
        reference_dir = os.path.join(work, "reference")
        config = write_config(work, args.source_dir, reference_dir)
        started = time.monotonic()
        done = subprocess.run(command(args.binary, config, reference_dir), capture_output=True, text=True)
        run_seconds = time.monotonic() - started
        if done.returncode != 0:
            sys.exit(f"FAIL: the uninterrupted run failed:\n{done.stderr}")
        want = final_state(reference_dir)
        step_seconds = run_seconds / STEPS
        print(f"uninterrupted run: {STEPS} steps in {run_seconds:.2f} s")

        if args.signals:
            signal_stops(args, work, want)
            return
        crashed_dir = os.path.join(work, "crashed")
        config = write_config(work, args.source_dir, crashed_dir, args.checkpoint_memory_mb)
        kills = 0
        attempts = 0
        mid_writes = 0  # kills that left a checkpoint half-written
        rollbacks = 0  # kills of runs resumed from an older checkpoint
        finished_runs = 0  # killed and resumed to the end, each checked against the reference
        while kills < args.kills:
            attempts += 1
            if attempts > 10 * args.kills + 10:
                sys.exit("FAIL: the run kept finishing before its kill; the run is too short")
            seed = args.seed if (args.seed is not None and args.kills == 1) else master.randrange(1 << 31)
            before = committed(crashed_dir)
            staging_before = staging(crashed_dir)
            # The kill follows the run's progress, not the clock (a loaded machine runs
            # it many times slower): once it has committed 1-5 more checkpoints, after a
            # further 0-2 steps' time, so that many kills land while a checkpoint is
            # being written.
            rng = random.Random(seed)
            target = (before[0] if before else 0) + 2 * rng.randint(1, 5)
            extra = rng.uniform(0.0, 2.0 * step_seconds)
            # A third of the kills follow a rollback: the run resumes from an older
            # checkpoint and replaces the newer ones step by step, so that kills land in
            # the renames that move a replaced checkpoint aside.
            rollback = len(before) >= 2 and rng.random() < 1 / 3
            cmd = command(args.binary, config, crashed_dir)
            latest = os.path.join(crashed_dir, "checkpoints", "latest")
            if rollback:
                older = os.path.join(crashed_dir, "checkpoints", "step_%08d" % before[1])
                cmd = [args.binary, "train", "--config", config, "--resume", older]
                replaced = rng.randint(1, 2)  # checkpoints committed before the kill
                latest_mtime = os.stat(latest).st_mtime_ns
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            while proc.poll() is None:
                if rollback:
                    # Progress is `latest` being rewritten (the newer steps still exist).
                    try:
                        mtime = os.stat(latest).st_mtime_ns
                    except FileNotFoundError:
                        mtime = latest_mtime
                    if mtime != latest_mtime:
                        latest_mtime = mtime
                        replaced -= 1
                        if replaced == 0:
                            time.sleep(extra)
                            break
                else:
                    newest = committed(crashed_dir)
                    if newest and newest[0] >= target:
                        time.sleep(extra)
                        break
                time.sleep(0.002)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate()
            if proc.returncode == 0:
                # It finished first: its end must have the uninterrupted run's bits too;
                # then the run starts over, to be killed again.
                check_same_bits(want, crashed_dir, kills)
                finished_runs += 1
                shutil.rmtree(crashed_dir)
                continue
            if proc.returncode != -signal.SIGKILL:
                sys.exit(f"FAIL: the run exited with {proc.returncode} (seed {seed}):\n{err}")
            kills += 1
            rollbacks += rollback
            if before and not rollback:
                # This run resumed: from the newest committed checkpoint, verified, none passed over.
                m = re.search(r"tandem: resumed (\S+) at step (\d+)", err)
                if m and int(m.group(2)) != before[0]:
                    sys.exit(f"FAIL: resumed step {m.group(2)}, the newest committed was {before[0]} (seed {seed})")
                if "passed over" in err:
                    sys.exit(f"FAIL: a committed checkpoint did not verify (seed {seed}):\n{err}")
            check_looks_complete_only_when_complete(crashed_dir)
            after = committed(crashed_dir)
            mid_write = bool(staging(crashed_dir) - staging_before)
            mid_writes += mid_write
            where = (f"after a rollback to step {before[1]}" if rollback else f"at step {target}")
            print(f"kill {kills}/{args.kills}: seed {seed}, {where} + {extra * 1e3:.0f} ms"
                  f"{' (mid-write)' if mid_write else ''}; newest committed step before "
                  f"{before[0] if before else None}, after {after[0] if after else None}", flush=True)

        done = subprocess.run(command(args.binary, config, crashed_dir), capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"FAIL: the resumed run failed:\n{done.stderr}")
        check_same_bits(want, crashed_dir, kills)
        finished_runs += 1
        print(f"PASS: {kills} kills ({mid_writes} of them mid-write, {rollbacks} after a rollback) over {finished_runs} runs, every resume from the newest committed checkpoint, "
              f"the final state bit-identical to the uninterrupted run's")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
