#!/usr/bin/env python3
"""The table of bench/gpu_offload_sweep.sh: tandem's schedules beside DeepSpeed, per model.

Reads every *.json in the directories given (the parts' results: `tandem bench offload
--json` objects, one per line for the budgets part, and bench/deepspeed_offload_train.py's
JSON line) and prints, per model: tokens/s, forward / backward / update ms, peak GPU memory,
pinned host memory and the first 10 losses of each run; tandem's predicted / measured update
time per schedule; the ratios the issue sets goals for (tandem auto against DeepSpeed
ZeRO-3 offload and ZeRO-Offload, auto against the fastest fixed schedule) and whether the
state digests agree. Exits 1 when a run failed, a loss does not descend, or the digests of
one model's schedules differ; the ratios are reported, not enforced.

  python3 bench/offload_sweep_summary.py runs/gpu-offload
"""
import json
import pathlib
import sys

GIB = 1 << 30


def read_results(dirs):
    """(tandem, deepspeed, budgets, versus, problems): tandem {model: bench offload JSON},
    deepspeed {model: {stage: JSON}}, budgets [bench offload JSON with memory_gb], versus
    [bench versus JSON]."""
    tandem, deepspeed, budgets, problems = {}, {}, [], []
    versus = []
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
                if "error" in r and r.get("framework") != "deepspeed" and "runs" not in r:
                    # A part whose process failed (bench/gpu_offload_sweep.sh wrote why).
                    problems.append(f"{path.name}: {r['error']}")
                elif r.get("framework") == "deepspeed":
                    model = pathlib.Path(r.get("config", path.stem)).stem
                    deepspeed.setdefault(model, {})[int(r["zero_stage"])] = r
                elif "memory_gb" in r:
                    budgets.append(r)
                elif "changes" in r:
                    versus.append(r)
                elif "runs" in r:
                    tandem[r.get("model") or model_of(path.stem)] = r
                else:
                    problems.append(f"{path.name}: not a result of gpu_offload_sweep.sh")
    return tandem, deepspeed, budgets, versus, problems


def model_of(stem):
    """tandem-llama-3b -> llama-3b; digest-llama-124m -> llama-124m."""
    return stem.split("-", 1)[1] if "-" in stem else stem


def losses_text(losses):
    return " ".join("%.3f" % l for l in (losses or [])[:10])


def descends(losses):
    return bool(losses) and len(losses) >= 2 and losses[-1] < losses[0]


def gib(n):
    return "%.2f GiB" % (n / GIB) if n else "-"


def row(name, r, peak, pinned):
    return ("%-24s %9.0f %9.1f %9.1f %9.1f %10s %12s   %s"
            % (name, r.get("tokens_per_s") or 0, r.get("forward_ms") or 0,
               r.get("backward_ms") or 0, r.get("update_ms") or 0, gib(peak), gib(pinned),
               losses_text(r.get("losses"))))


def summarize_model(model, ours, theirs, problems):
    print(f"== {model}" + (f": {ours['params'] / 1e9:.2f} B parameters, B {ours['batch']},"
                           f" T {ours['seq_len']}, {ours['device']} device" if ours else ""))
    print("%-24s %9s %9s %9s %9s %10s %12s   %s" % ("run", "tokens/s", "fwd ms", "bwd ms",
                                                   "update ms", "GPU memory", "pinned host",
                                                   "first 10 losses"))
    tokens = {}
    for run in (ours or {}).get("runs", []):
        name = "tandem " + run["schedule"]
        if "error" in run:
            print("%-24s not run: %s" % (name, run["error"]))
            continue
        print(row(name, run, run.get("device_bytes_in_use") or run.get("device_bytes"),
                  run.get("pinned_host_bytes")))
        tokens[run["schedule"]] = run["tokens_per_s"]
        if not descends(run.get("losses")):
            problems.append(f"{model}: tandem {run['schedule']}'s loss does not descend")
    for stage, r in sorted((theirs or {}).items()):
        name = "DeepSpeed " + ("ZeRO-Offload" if stage == 2 else "ZeRO-3 offload")
        if "error" in r:
            print("%-24s failed: %s" % (name, r["error"]))
            problems.append(f"{model}: {name} failed")
            continue
        print(row(name, r, r.get("peak_gpu_bytes"), r.get("pinned_host_bytes")))
        tokens[f"ds{stage}"] = r.get("tokens_per_s")
        if not descends(r.get("losses")):
            problems.append(f"{model}: {name}'s loss does not descend")
    if ours:
        for run in ours.get("runs", []):
            if "error" not in run:
                print("  tandem %-10s predicted / measured update: %.1f / %.1f ms = %.3f (goal"
                      " within 0.8-1.2); plan: %d host, %d resident, %d staged"
                      % (run["schedule"], run["predicted_update_ms"], run["update_ms"],
                         run["predicted_to_measured"], run["host_subgroups"],
                         run["resident_subgroups"], run["staged_subgroups"]))
        if not ours.get("digests_agree", True):
            problems.append(f"{model}: tandem's schedules ended with different state digests")
        digests = {run.get("state_digest") for run in ours.get("runs", []) if "error" not in run}
        print("  state digests: %s" % ("one for every schedule (%s)" % digests.pop()
                                        if len(digests) == 1 else "DIFFER: %s" % sorted(digests)))
        if ours.get("auto_to_best_fixed_update"):
            print("  auto's update / the fastest fixed schedule's: %.3f (goal <= 1.05)"
                  % ours["auto_to_best_fixed_update"])
    auto = tokens.get("auto")
    for key, name, goal in (("ds3", "ZeRO-3 offload", 2.5), ("ds2", "ZeRO-Offload", 2.0)):
        if auto and tokens.get(key):
            ratio = auto / tokens[key]
            print("  tandem auto / DeepSpeed %s tokens/s: %.2f (goal >= %.1f: %s)"
                  % (name, ratio, goal, "met" if ratio >= goal else "not met"))


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
    for model in sorted(set(tandem) | set(deepspeed)):
        summarize_model(model, tandem.get(model), deepspeed.get(model), problems)
    if budgets:
        summarize_budgets(budgets, problems)
    if versus:
        summarize_versus(versus, problems)
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
