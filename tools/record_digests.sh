#!/usr/bin/env bash
# Prints the final state digest of a fixed set of short training runs, one line each:
# the update schedules, the ZeRO stages over 2 MPI ranks, DeMo over 2 ranks, and the demo
# config cut to a few hundred steps. A refactor that promises "no numeric change"
# (issue 27) records these before and compares after:
#
#   tools/record_digests.sh > /tmp/before.txt     # on the old tree
#   tools/record_digests.sh > /tmp/after.txt      # on the new one
#   diff /tmp/before.txt /tmp/after.txt           # must print nothing
#
# The digest is tandem's own (the XXH3 of every rank's fp32 master weights and optimizer
# state, in rank order: the last record of --metrics). Matrix products go through OpenBLAS,
# whose kernels depend on the CPU, so compare digests made on the same machine.
#
# Usage: tools/record_digests.sh [BUILD_DIR]   (default build; about 3 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tandem="$build/tandem"
[ -x "$tandem" ] || { echo "record_digests: no $tandem; build first (make build)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run NAME RANKS CONFIG [--set ...]: trains into a fresh directory, prints "NAME DIGEST".
run() {
  local name=$1 ranks=$2 config=$3
  shift 3
  local dir="$work/$name"
  local launch=()
  [ "$ranks" -gt 1 ] && launch=(mpirun --allow-run-as-root --oversubscribe -np "$ranks")
  if ! "${launch[@]}" "$tandem" train --config "$config" --metrics "$dir/metrics.jsonl" \
    --set "train.output_dir=$dir" --set train.sample_bytes=0 "$@" >"$dir.log" 2>&1; then
    echo "record_digests: $name failed; its output:" >&2
    cat "$dir.log" >&2
    exit 1
  fi
  local digest
  digest=$(python3 -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1])][-1]["state_digest"])' "$dir/metrics.jsonl")
  echo "$name $digest"
}

adamw=configs/shakespeare-char.json
short=(--set train.steps=30 --set train.eval_interval=10 --set train.checkpoint_interval=0)
for schedule in device cpu interleave auto; do
  run "schedule-$schedule" 1 "$adamw" "${short[@]}" --set "offload_optimizer.schedule=$schedule"
done
for stage in 0 1 2 3; do
  run "zero$stage-2ranks" 2 "$adamw" "${short[@]}" --set "zero_optimization.stage=$stage"
done
run "zero2-1rank-2micro" 1 "$adamw" "${short[@]}" --set zero_optimization.stage=2 \
  --set gradient_accumulation_steps=2
run "demo-2ranks" 2 configs/shakespeare-char-demo.json "${short[@]}"
run "llama-1rank" 1 configs/llama-shakespeare.json "${short[@]}"
run "shakespeare-char-300" 1 "$adamw" --set train.steps=300 --set train.checkpoint_interval=0
