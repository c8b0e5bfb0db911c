#!/usr/bin/env bash
# GPT-2 124M (bf16, B=16, T=1024) on one GPU whose memory budget (device.memory_gb) leaves
# little or no room for the optimizer state: the update schedules side by side at each
# budget, in one run: every subgroup on the CPU (ZeRO-Offload), CPU and GPU interleaved
# (stride 2), and what the performance model picks (auto; its plan is printed first).
# The activations and bf16 model take about 8.96 GiB and the fp32 state 1.39 GiB, so 9.25
# GiB leaves room for the staging buffers only and 9.75 GiB for a few resident subgroups.
#
#   bench/gpu_offload_sweep.sh [PAYLOAD_OR_BUILD_DIR] [OUT_DIR] [BUDGETS_GB...]
#
# PAYLOAD_OR_BUILD_DIR as for bench/gpu_goals.sh. Writes OUT_DIR/offload_sweep.jsonl (one
# `tandem bench step --json` line per budget and schedule, with "memory_gb" added) and
# prints a table.
set -uo pipefail
cd "$(dirname "$0")/.."
from=${1:-gpu-payload}
out=${2:-${OUT:-runs/gpu-offload}}
shift 2 2>/dev/null || shift $#
budgets=("$@")
((${#budgets[@]})) || budgets=(9.25 9.75)
mkdir -p "$out"
if [[ -f $from/tandem-gpu.tar.xz ]]; then
  [[ -x $from/bin/tandem ]] || tar -C "$from" -xJf "$from/tandem-gpu.tar.xz" || exit 1
  bin="$from/bin"
  export LD_LIBRARY_PATH="$from/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  bin="$from"
fi
shard=$(mktemp -d)/tinyshakespeare.bin
"$bin/tandem" tokenize --input data/tinyshakespeare.txt --output "$shard" >&2 || exit 1
common=(--config configs/gpt2-124m.json --set data.train_path="$shard"
  --set zero_optimization.sub_group_size=10000000)
results="$out/offload_sweep.jsonl"
: >"$results"
status=0
for gb in "${budgets[@]}"; do
  echo "== device.memory_gb=$gb: the plan of auto"
  "$bin/tandem" plan "${common[@]}" --set device.memory_gb="$gb" \
    --set offload_optimizer.schedule=auto || status=1
  for schedule in cpu interleave auto; do
    line=$(timeout 120 "$bin/tandem" bench step "${common[@]}" --set device.memory_gb="$gb" \
      --set offload_optimizer.schedule=$schedule --warmup 3 --steps 10 --json) || {
      echo "FAIL: memory_gb $gb, schedule $schedule" >&2
      status=1
      continue
    }
    python3 -c 'import json, sys; r = json.loads(sys.argv[1]); r["memory_gb"] = float(sys.argv[2]); print(json.dumps(r))' \
      "$line" "$gb" >>"$results"
  done
done
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("memory_gb  schedule    tokens/s   ms/step  update ms  / cpu tokens/s")
cpu = {r["memory_gb"]: r["tokens_per_s"] for r in rows if r["schedule"] == "cpu"}
for r in rows:
    base = cpu.get(r["memory_gb"])
    print("%9.2f  %-10s %9.0f  %8.1f  %9.1f  %s" % (r["memory_gb"], r["schedule"], r["tokens_per_s"],
          r["ms"], r["update_ms"], "%.3f" % (r["tokens_per_s"] / base) if base else "-"))
PY
exit $status
