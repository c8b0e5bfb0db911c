#!/usr/bin/env bash
# DeMo against data-parallel AdamW on the same global batch and steps (issue 11's training
# goal): configs/shakespeare-char-demo.json on RANKS MPI ranks, once with AdamW (gradients
# all-reduced) and once per DeMo learning rate, then a table of final validation losses and
# bytes sent per rank per step, and the plots of tools/plot_runs.py.
#
#   tools/demo_vs_adamw.sh [OUT_DIR] [--ranks N] [--steps N] [--adamw-lr LR] [--demo-lrs "LR ..."]
#                          [--set KEY=VALUE ...]
#
# Defaults: runs/demo-vs-adamw, 4 ranks, the config's steps, AdamW lr 2e-3 (the tuned lr of
# configs/shakespeare-char.json), DeMo lrs "3e-4 1e-3 3e-3" with the config's other DeMo
# settings (bf16 values). Needs a built tandem (make build)
# and mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."

out=runs/demo-vs-adamw
ranks=4
steps=""
adamw_lr=2e-3
demo_lrs="3e-4 1e-3 3e-3"
extra=()
if [[ $# -gt 0 && $1 != --* ]]; then out=$1; shift; fi
while [[ $# -gt 0 ]]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --adamw-lr) adamw_lr=$2; shift 2 ;;
    --demo-lrs) demo_lrs=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    *) echo "demo_vs_adamw: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
tandem=${TANDEM:-build/tandem}
[[ -x $tandem ]] || { echo "demo_vs_adamw: no $tandem; build it first (make build)" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "demo_vs_adamw: mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; }
[[ -n $steps ]] && extra+=(--set "train.steps=$steps")
mkdir -p "$out"

run() {  # NAME --set OVERRIDE
  local name=$1 override=$3
  echo "== $name: $override" >&2
  rm -rf "${out:?}/$name" "$out/$name.jsonl"
  mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$tandem" train \
    --config configs/shakespeare-char-demo.json --set "$override" \
    --set "train.output_dir=$out/$name" --set train.sample_bytes=0 "${extra[@]}" \
    --metrics "$out/$name.jsonl" 2>&1 | grep -E "^tandem: [0-9]+ steps|error" >&2
}

run adamw --set "optimizer={\"type\": \"AdamW\", \"params\": {\"lr\": $adamw_lr, \"betas\": [0.9, 0.99], \"weight_decay\": 0.1}}"
runs=("AdamW lr $adamw_lr=$out/adamw.jsonl")
for lr in $demo_lrs; do
  run "demo-$lr" --set "optimizer.params.lr=$lr"
  runs+=("DeMo lr $lr=$out/demo-$lr.jsonl")
done

python3 - "$out" "${runs[@]}" <<'PY'
import json, sys
out, runs = sys.argv[1], sys.argv[2:]
rows = []
for spec in runs:
    label, path = spec.split("=", 1)
    steps = [json.loads(l) for l in open(path) if '"loss"' in l]
    vals = [json.loads(l)["val_loss"] for l in open(path) if '"val_loss"' in l]
    sent = sum(s["comm_bytes_sent"] for s in steps) / len(steps)
    rows.append((label, vals[-1], sent, steps[-1].get("ring_allreduce_bytes", 0),
                 sum(s["ms"] for s in steps) / len(steps)))
base = rows[0][1]
lines = ["| run | final val loss | vs AdamW | bytes sent per rank per step | fewer than AdamW's | ms/step |",
         "|---|---|---|---|---|---|"]
for label, val, sent, ring, ms in rows:
    lines.append(f"| {label} | {val:.4f} | {100 * (val / base - 1):+.1f}% | {sent:,.0f} | "
                 f"{rows[0][2] / sent:.1f}x | {ms:.0f} |")
table = "\n".join(lines)
print(table)
open(f"{out}/table.md", "w").write(table + "\n")
PY
/usr/bin/python3 tools/plot_runs.py "${runs[@]}" --out "$out/plots"
