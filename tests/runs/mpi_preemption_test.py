#!/usr/bin/env python3
"""Preemption under mpirun: SIGTERM to mpirun (what Slurm and most schedulers send on
preemption or at a time limit) reaches the ranks through OpenMPI, which sends them SIGTERM
odls_base_sigkill_timeout seconds later and SIGKILL as long again after that. Given that time
(the README says how), two ranks stop after a step with a checkpoint of it, and rank 0 says
where it stopped and how to go on: with mpirun's own options, the grace period's included.

  python3 tests/runs/mpi_preemption_test.py BUILD/tandem SOURCE_DIR
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_crash_test import committed, write_config  # noqa: E402

STEPS_BEFORE_SIGNAL = 5


def main():
    binary, source_dir = sys.argv[1], sys.argv[2]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("FAIL: no mpirun (make deps installs OpenMPI)")
    work = tempfile.mkdtemp(prefix="tandem_preempt_")
    try:
        run_dir = os.path.join(work, "run")
        config = write_config(work, source_dir, run_dir)
        metrics = os.path.join(work, "metrics.jsonl")
        # Checkpoints far apart: the one the signal asks for is the run's only one. 10 s from
        # OpenMPI's SIGTERM to its SIGKILL are plenty for this model's (mpirun waits out about
        # twice that from the signal, even once the ranks have ended).
        command = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                   "--mca", "odls_base_sigkill_timeout", "10",
                   binary, "train", "--config", config, "--metrics", metrics,
                   "--set", "train.steps=100000", "--set", "train.checkpoint_interval=100000"]
        # Output to a file, not a pipe nobody reads while the run trains (a full pipe would
        # stall it).
        log_path = os.path.join(work, "log.txt")
        log = open(log_path, "w")
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)

        def output():
            log.flush()
            with open(log_path) as f:
                return f.read()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(metrics):
                with open(metrics) as f:
                    steps = sum(1 for line in f if '"loss"' in line)
                if steps >= STEPS_BEFORE_SIGNAL:
                    break
            time.sleep(0.05)
        if proc.poll() is not None:
            sys.exit(f"FAIL: the run ended before the signal:\n{output()}")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            sys.exit(f"FAIL: mpirun did not end within 120 s of SIGTERM:\n{output()}")
        err = output()
        m = re.search(r"stopped by SIGTERM after step (\d+); checkpoint (\S+)", err)
        if not m or "to continue: " not in err:
            sys.exit(f"FAIL: the ranks did not say where they stopped and how to go on "
                     f"(exit {proc.returncode}):\n{err}")
        # The command to continue launches as this run was launched, pasteable as printed:
        # mpirun with all its options, the grace period's included (without it a continued
        # job's ranks get 1 s to save), and nothing mpirun adds for its own use.
        go_on = re.search(r"to continue: (.*)", err).group(1)
        launcher = command[:command.index(binary)]
        words = shlex.split(go_on)
        if words[:len(launcher)] != launcher or words[len(launcher):len(launcher) + 2] != [
                binary, "train"]:
            sys.exit(f"FAIL: the command to continue does not start 2 ranks of {binary} as "
                     f"{' '.join(launcher)} did: {go_on}")
        newest = committed(run_dir)
        if not newest or newest[0] != int(m.group(1)):
            sys.exit(f"FAIL: stopped after step {m.group(1)}, but the committed checkpoints are "
                     f"{newest}")
        print(f"PASS: SIGTERM to mpirun: both ranks stopped after step {m.group(1)} with a "
              f"checkpoint of it (mpirun exit {proc.returncode})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
