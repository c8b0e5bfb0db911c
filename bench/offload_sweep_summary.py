#!/usr/bin/env python3
"""The table of bench/gpu_offload_sweep.sh: tandem beside DeepSpeed, per model and tokens per
optimizer step.

Reads every *.json in the directories given (one JSON object per line: `tandem bench offload
--json` results, annotated by the sweep with its "sweep" facts, and the lines of
bench/deepspeed_offload_train.py, one per phase) and prints, per model and tokens per step:
each run's tokens/s, model TFLOPS, forward / backward / update ms, peak GPU memory, pinned host
memory, and its loss after warm-up and at the end; tandem's predicted / measured update; and
the ratios the goals are set on: tandem at its own setting against DeepSpeed's best mode
(goal >= 1.5 on 7B-class models), tandem at DeepSpeed's placement (schedule cpu) against
ZeRO-Offload (goal >= 2.0 at 8K and 32K tokens per step).

Model TFLOPS = tokens/s x (6 N + 12 L H_d T) / 1e12: N every parameter (the embedding's
lookup and the head's matmul both counted, as the configs count N), L layers, H_d the
attention width (heads x head_dim), T the sequence; 12 L H_d T is QK^T and AV forward and
backward over the full T x T square (PaLM's appendix B), so the causal half that the flash
kernels skip is counted, and recompute is not. The 6N-only figure is printed beside it.

A DeepSpeed phase that its best setting could not fit on the machine (a line with "not_run",
from bench/deepspeed_memory.py's plan) is shown with the reason and is not a failure.

Exits 1 when a run failed, a loss at its end is not lower than the loss of the first step
after warm-up, or one model's schedules end with different state digests; ratios are
reported, not enforced.

  python3 bench/offload_sweep_summary.py runs/gpu-offload
"""
import json
import pathlib
import sys

GIB = 1 << 30
CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"


def read_results(dirs):
    """(tandem, deepspeed, budgets, versus, problems): tandem and deepspeed are lists of
    result objects; budgets the bench offload objects with memory_gb; versus bench versus's."""
    tandem, deepspeed, budgets, versus, problems = [], [], [], [], []
    for d in dirs:
        for path in sorted(pathlib.Path(d).glob("*.json")):
            lines = [l for l in path.read_text().splitlines() if l.strip()]
            if not lines:
                problems.append(f"{path.name}: empty (the run failed; see {path.stem}.log)")
                continue
            try:
                records = [json.loads(l) for l in lines]
            except ValueError as e:
                problems.append(f"{path.name}: not JSON ({e}); see {path.stem}.log")
                continue
            for r in records:
                if r.get("framework") == "deepspeed":
                    r.setdefault("model", pathlib.Path(r.get("config", path.stem)).stem)
                    deepspeed.append(r)
                elif "error" in r and "runs" not in r:
                    # A part whose process failed (bench/gpu_offload_sweep.sh wrote why).
                    problems.append(f"{path.name}: {r['error']}")
                elif "memory_gb" in r:
                    budgets.append(r)
                elif "changes" in r:
                    versus.append(r)
                elif "probe" in r:
                    pass
                elif "runs" in r:
                    r.setdefault("model", model_of(path.stem))
                    tandem.append(r)
                else:
                    problems.append(f"{path.name}: not a result of gpu_offload_sweep.sh")
    return tandem, deepspeed, budgets, versus, problems


def model_of(stem):
    """tandem-llama-3b -> llama-3b; schedules-llama2-7b -> llama2-7b; tandem-cpu-x-16 -> x."""
    parts = stem.split("-")
    while parts and parts[0] in ("tandem", "cpu", "schedules", "digest"):
        parts = parts[1:]
    if len(parts) > 1 and parts[-1].isdigit():
        parts = parts[:-1]
    return "-".join(parts) or stem


def flops_per_token(model, params, seq_len):
    """(6N + 12 L H_d T, 6N) from configs/<model>.json's shape, or (6N, 6N) without it."""
    six_n = 6.0 * params
    try:
        m = json.load(open(CONFIGS / f"{model}.json"))["model"]
    except (OSError, ValueError, KeyError):
        return six_n, six_n
    width = m["num_attention_heads"] * m.get("head_dim",
                                             m["hidden_size"] // m["num_attention_heads"])
    return six_n + 12.0 * m["num_hidden_layers"] * width * seq_len, six_n


def losses_check(losses, timed):
    """(loss after warm-up, last loss, ok): the first timed step's loss against the last."""
    if not losses or len(losses) < 2:
        return None, None, False
    first = max(0, len(losses) - timed) if timed else 0
    first = min(first, len(losses) - 2)
    return losses[first], losses[-1], losses[-1] < losses[first]


def gib(n):
    return "%.2f GiB" % (n / GIB) if n else "-"


HEADER = ("%-44s %9s %7s %7s %9s %9s %9s %10s %11s  %s"
          % ("run", "tokens/s", "TFLOPS", "6N TF", "fwd ms", "bwd ms", "update ms",
             "GPU memory", "pinned host", "loss after warm-up -> end"))


def row(name, r, peak, pinned, per_token, problems, where):
    tokens = r.get("tokens_per_s") or 0
    after, last, ok = losses_check(r.get("losses"), r.get("timed_steps"))
    if not ok:
        problems.append(f"{where}: {name}'s loss at its end is not lower than after warm-up "
                        f"({after} -> {last})")
    return ("%-44s %9.0f %7.1f %7.1f %9.1f %9.1f %9.1f %10s %11s  %s"
            % (name, tokens, tokens * per_token[0] / 1e12, tokens * per_token[1] / 1e12,
               r.get("forward_ms") or 0, r.get("backward_ms") or 0, r.get("update_ms") or 0,
               gib(peak), gib(pinned),
               "%.3f -> %.3f" % (after, last) if after is not None else "-"))


def tandem_tokens_per_step(r, run):
    sweep = r.get("sweep") or {}
    if "tokens_per_step" in sweep:
        return sweep["tokens_per_step"]
    micro = run.get("micro_batch") or r.get("batch") or 0
    return micro * (run.get("gradient_accumulation_steps") or 1) * r.get("seq_len", 0)


def tandem_label(r, run):
    kind = (r.get("sweep") or {}).get("kind", "schedules")
    what = "tandem " + run["schedule"]
    if kind == "tandem-cpu":
        what = "tandem cpu (DeepSpeed's placement)"
    elif kind == "tandem":
        what = "tandem own setting (" + run["schedule"] + ")"
    if "micro_batch" in run:
        what += " mb %s x%s" % (run["micro_batch"], run.get("gradient_accumulation_steps", 1))
        if run.get("activation_checkpointing_interval"):
            what += " rc%s" % run["activation_checkpointing_interval"]
    return what, kind


def ds_label(r):
    mode = r.get("mode") or ("zero2-offload" if r.get("zero_stage") == 2 else "zero3-offload")
    what = "DeepSpeed " + mode
    if mode == "zero3-twinflow":
        what += " r%s" % r.get("offload_ratio")
    if "micro_batch" in r:
        what += " mb %s x%s" % (r["micro_batch"], r.get("gradient_accumulation_steps", 1))
    if r.get("activation_checkpointing"):
        what += " ckpt"
    return what, mode


def summarize(tandem, deepspeed, problems):
    groups = {}
    for r in tandem:
        for run in r.get("runs", []):
            key = (r["model"], tandem_tokens_per_step(r, run))
            groups.setdefault(key, {"t": [], "d": [], "digests": []})["t"].append((r, run))
        groups_of_r = {(r["model"], tandem_tokens_per_step(r, run)) for run in r.get("runs", [])}
        for key in groups_of_r:
            groups[key]["digests"].append(r)
    for r in deepspeed:
        tps = r.get("tokens_per_step") or (r.get("batch") or 0) * (r.get("seq_len") or 0)
        groups.setdefault((r["model"], tps), {"t": [], "d": [], "digests": []})["d"].append(r)
    for (model, tps), g in sorted(groups.items()):
        where = f"{model} at {tps} tokens/step"
        params = next((r.get("params") for r, _ in g["t"]), None) or next(
            (r.get("params") for r in g["d"] if r.get("params")), 0)
        seq = next((r.get("seq_len") for r, _ in g["t"]), None) or next(
            (r.get("seq_len") for r in g["d"] if r.get("seq_len")), 0)
        per_token = flops_per_token(model, params or 0, seq or 0)
        print(f"== {model}: {params / 1e9:.2f} B parameters, {tps:,} tokens per optimizer step, "
              f"T {seq}" if params else f"== {model}: {tps:,} tokens per optimizer step")
        print(HEADER)
        best = {}
        for r, run in g["t"]:
            name, kind = tandem_label(r, run)
            if "error" in run:
                print("%-44s not run: %s" % (name, run["error"]))
                continue
            print(row(name, dict(run, timed_steps=r.get("timed_steps")),
                      run.get("device_bytes_in_use") or run.get("device_bytes"),
                      run.get("pinned_host_bytes"), per_token, problems, where))
            slot = {"tandem": "tandem", "tandem-cpu": "tandem-cpu"}.get(kind, "sched-" + run["schedule"])
            best[slot] = max(best.get(slot, 0), run.get("tokens_per_s") or 0)
        for r in g["d"]:
            name, mode = ds_label(r)
            if "not_run" in r:
                # Not a failure: no setting of DeepSpeed's fits this machine (--mode best).
                print("%-44s not run: %s" % (name, r["not_run"]))
                continue
            if "error" in r:
                print("%-44s failed: %s" % (name, r["error"]))
                problems.append(f"{where}: {name} failed")
                continue
            print(row(name, r, r.get("peak_gpu_bytes"), r.get("pinned_host_bytes"), per_token,
                      problems, where))
            best["ds-" + mode] = max(best.get("ds-" + mode, 0), r.get("tokens_per_s") or 0)
        for r, run in g["t"]:
            if "error" not in run and "predicted_update_ms" in run:
                print("  %-40s predicted / measured update: %.1f / %.1f ms = %.3f"
                      % (tandem_label(r, run)[0], run["predicted_update_ms"], run["update_ms"],
                         run.get("predicted_to_measured", 0)))
        for r in g["digests"]:
            if not r.get("digests_agree", True):
                problems.append(f"{where}: tandem's schedules ended with different state digests")
        ds_best = max([(v, k[3:]) for k, v in best.items() if k.startswith("ds-")],
                      default=(0, None))
        own = best.get("tandem") or best.get("sched-auto")
        if own and ds_best[0]:
            ratio = own / ds_best[0]
            print("  tandem own setting / DeepSpeed's best (%s): %.2f (goal >= 1.5 on 7B-class: %s)"
                  % (ds_best[1], ratio, "met" if ratio >= 1.5 else "not met"))
        elif own and any("not_run" in r for r in g["d"]):
            print("  tandem own setting / DeepSpeed's best: no ratio, DeepSpeed cannot train "
                  "this here (not run, above)")
        placement = best.get("tandem-cpu") or best.get("sched-cpu")
        if placement and best.get("ds-zero2-offload"):
            ratio = placement / best["ds-zero2-offload"]
            print("  tandem cpu / DeepSpeed ZeRO-Offload: %.2f (goal >= 2.0 at 8K and 32K: %s)"
                  % (ratio, "met" if ratio >= 2.0 else "not met"))
        if own and best.get("ds-zero3-offload"):
            print("  tandem own setting / DeepSpeed ZeRO-3 offload: %.2f"
                  % (own / best["ds-zero3-offload"]))


def summarize_budgets(budgets, problems):
    print("== GPT-2 124M at device budgets too small for its state")
    print("memory_gb  schedule    tokens/s  update ms  predicted  pred/meas  / cpu tokens/s")
    for b in sorted(budgets, key=lambda b: b["memory_gb"]):
        cpu = next((r["tokens_per_s"] for r in b["runs"]
                    if r["schedule"] == "cpu" and "error" not in r), None)
        for r in b["runs"]:
            if "error" in r:
                print("%9.2f  %-10s not run: %s" % (b["memory_gb"], r["schedule"], r["error"]))
                continue
            print("%9.2f  %-10s %9.0f  %9.1f  %9.1f  %9.3f  %s"
                  % (b["memory_gb"], r["schedule"], r["tokens_per_s"], r["update_ms"],
                     r["predicted_update_ms"], r["predicted_to_measured"],
                     "%.3f" % (r["tokens_per_s"] / cpu) if cpu else "-"))
        if not b.get("digests_agree", True):
            problems.append(f"GPT-2 124M at {b['memory_gb']} GB: the schedules' digests differ")


def summarize_versus(versus, problems):
    print("== What a setting costs or saves (tandem bench versus, one process)")
    print("setting                                    base ms  variant ms  time ratio  tokens/s ratio")
    for v in versus:
        changes = ", ".join(v["changes"])
        print("%-42s %8.1f  %10.1f  %10.3f  %14.3f"
              % (changes, v["base"]["ms"], v["variant"]["ms"], v["ms_ratio"],
                 v["tokens_per_s_ratio"]))
        if not v.get("digests_agree", False):
            problems.append(f"{changes}: the two sides' state digests differ")


def main():
    dirs = sys.argv[1:] or ["runs/gpu-offload"]
    missing = [d for d in dirs if not pathlib.Path(d).is_dir()]
    if missing:
        sys.exit(f"offload_sweep_summary.py: no directory {', '.join(missing)}; give the "
                 "directories bench/gpu_offload_sweep.sh wrote its results into")
    tandem, deepspeed, budgets, versus, problems = read_results(dirs)
    if not (tandem or deepspeed or budgets or versus or problems):
        sys.exit(f"offload_sweep_summary.py: no results in {', '.join(dirs)}")
    summarize(tandem, deepspeed, problems)
    if budgets:
        summarize_budgets(budgets, problems)
    if versus:
        summarize_versus(versus, problems)
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
