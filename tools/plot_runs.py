#!/usr/bin/env python3
"""Plot tandem training runs from their metrics files (tandem train --metrics FILE).

    python3 tools/plot_runs.py RUN [RUN ...] [--out DIR]

RUN is a metrics.jsonl path, or LABEL=PATH to name its line in the legends (default: the
file's parent directory). Writes into DIR (default: plots/):

    loss.png            training loss against steps (validation loss as markers)
    loss_vs_bytes.png   training loss against the bytes each rank has sent so far (the
                        communication a run paid for its loss: DeMo against all-reduce);
                        skipped, saying so, when no run sent anything (one rank)
    tokens_per_s.png    throughput against steps

Needs matplotlib (pip install matplotlib, or Debian's python3-matplotlib); nothing else.
"""

import argparse
import json
import os
import sys


def read_run(spec):
    """(label, records) of one RUN argument; exits with a one-line error when unreadable."""
    label, path = (spec.split("=", 1) if "=" in spec and not os.path.exists(spec)
                   else (None, spec))
    if not os.path.isfile(path):
        sys.exit(f"plot_runs: {path}: no such metrics file (pass the --metrics FILE of a "
                 f"tandem train run)")
    steps, vals = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_runs: {path}:{number}: not a JSON line ({e.msg}); is this a "
                         f"tandem metrics file?")
            if "loss" in record and "step" in record:
                steps.append(record)
            elif "val_loss" in record:
                vals.append(record)
    if not steps:
        sys.exit(f"plot_runs: {path}: no training steps in it (a metrics file has one JSON "
                 f"record per step with \"step\" and \"loss\")")
    if label is None:
        label = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    return label, steps, vals


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="metrics.jsonl or LABEL=PATH")
    parser.add_argument("--out", default="plots", help="directory for the PNGs (default plots/)")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_runs: matplotlib is missing; pip install matplotlib (or apt-get install "
                 "python3-matplotlib)")
    runs = [read_run(spec) for spec in args.runs]
    os.makedirs(args.out, exist_ok=True)
    written = []

    def save(fig, name):
        path = os.path.join(args.out, name)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, steps, vals in runs:
        line, = ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], label=label,
                        linewidth=1.2)
        if vals:
            ax.plot([r["step"] for r in vals], [r["val_loss"] for r in vals], "o",
                    color=line.get_color(), markersize=4, label=f"{label} (validation)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("Loss")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "loss.png")

    if any(sum(r.get("comm_bytes_sent", 0) for r in steps) > 0 for _, steps, _ in runs):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, steps, _ in runs:
            sent, xs, ys = 0, [], []
            for r in steps:
                sent += r.get("comm_bytes_sent", 0)
                if sent > 0:  # a log axis: steps before the first byte are left out
                    xs.append(sent / 2**20)
                    ys.append(r["loss"])
            if not xs:
                print(f"plot_runs: {label} sent no bytes: not in loss_vs_bytes.png",
                      file=sys.stderr)
                continue
            ax.plot(xs, ys, label=label, linewidth=1.2)
        ax.set_xscale("log")
        ax.set_xlabel("MiB sent per rank so far")
        ax.set_ylabel("loss (nats per token)")
        ax.set_title("Loss against communication")
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, "loss_vs_bytes.png")
    else:
        print("plot_runs: no run sent any bytes (one rank): loss_vs_bytes.png not written",
              file=sys.stderr)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, steps, _ in runs:
        ax.plot([r["step"] for r in steps], [r["tokens_per_s"] for r in steps], label=label,
                linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s (global batch)")
    ax.set_title("Throughput")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "tokens_per_s.png")

    for path in written:
        print(path)


if __name__ == "__main__":
    main()
