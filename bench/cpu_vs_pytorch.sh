#!/usr/bin/env bash
# Every CPU comparison of tandem with PyTorch in one run (issue 30), each side by side with
# its peer alternating, then one line per item with its ratio and goal:
#
#   training step, GPT-2    bench/gpt2_cpu_vs_pytorch.sh   tandem / torch.compile  (goal 1.2)
#   training step, Llama    bench/llama_cpu_vs_pytorch.sh  tandem / transformers   (goal 1.2)
#   checkpoint save         bench/checkpoint_vs_pytorch.sh torch.save+fsync / tandem (goal 1)
#   checkpoint load, resume                                torch.load / tandem     (goal 1)
#   DeMo step               bench/demo_vs_pytorch.sh       tandem / the reference's ops (goal 4)
#
#   bench/cpu_vs_pytorch.sh [BUILD_DIR] [ROUNDS] [DIR]   (defaults: build, 3, runs/)
#
# DIR is where the checkpoint comparison writes. Each script's own output is shown as it
# runs; the summary repeats their ratio lines. About 15 minutes on 2 cores. Needs python3
# with torch and transformers; a machine otherwise quiet gives the steadiest ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
dir=${3:-runs}
python3 -c "import torch, transformers" 2>/dev/null ||
  { echo "needs python3 with torch and transformers: pip install torch transformers" >&2; exit 2; }
[[ -x $build/tandem ]] || { echo "no $build/tandem: build it first (cmake --build $build)" >&2; exit 2; }
log=$(mktemp)

out=$(mktemp)
trap 'rm -f "$log" "$out"' EXIT
run() {  # tag, title, script, arguments...
  local tag=$1 title=$2
  shift 2
  echo "== $title"
  bash "$@" | tee "$out"
  grep -E 'ratio' "$out" | sed "s/^/$tag /" >>"$log"
}
run "gpt2 " "GPT-2 training step" bench/gpt2_cpu_vs_pytorch.sh "$build" "$rounds"
run "llama" "Llama training step" bench/llama_cpu_vs_pytorch.sh "$build" "$rounds"
run "ckpt " "checkpoint save, load and resume" bench/checkpoint_vs_pytorch.sh "$build" "$((rounds + 2))" "$dir"
run "demo " "DeMo step" bench/demo_vs_pytorch.sh "$build" "$((rounds + 4))"

echo
echo "== summary ($(date -u +%Y-%m-%d), $(nproc) threads; ratios above 1: tandem the faster)"
cat "$log"
