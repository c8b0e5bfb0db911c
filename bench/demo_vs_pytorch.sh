#!/usr/bin/env bash
# tandem's DeMo step on the CPU against the reference implementation's torch operations, on
# the same tensors (one GPT-2 small layer, 7.08 M parameters, fp32, one rank), in one run:
# `tandem bench demo` and bench/pytorch_demo_step.py, ROUNDS rounds each, the two sides
# alternating, the median parameters/s of each side. ratio = tandem / reference: the goal of
# issue 30 is 4 (the machines are shared and noisy: one run's ratios, not absolute figures).
#
#   bench/demo_vs_pytorch.sh [BUILD_DIR] [ROUNDS]    (defaults: build, 5)
#
# Both sides use every core (nproc threads). Needs python3 with torch.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
threads=$(nproc)
python3 -c "import torch" 2>/dev/null || { echo "needs python3 with torch: pip install torch" >&2; exit 2; }
[[ -x $build/tandem ]] || { echo "no $build/tandem: build it first (cmake --build $build)" >&2; exit 2; }

source bench/side_by_side.sh

echo "$("$build/tandem" --version) vs torch $(python3 -c 'import torch; print(torch.__version__)'), DeMo step, $threads threads, $rounds rounds"
ours=() theirs=()
for ((r = 0; r < rounds; r++)); do
  ours+=("$("$build/tandem" bench demo --threads "$threads" --repetitions 5 --json | last_field params_per_s)")
  theirs+=("$(python3 bench/pytorch_demo_step.py --threads "$threads" --warmup 2 --steps 5 | last_field params_per_s)")
done
t=$(median "${ours[@]}") p=$(median "${theirs[@]}")
printf 'demo    tandem %6.1f M params/s  reference %6.1f M params/s  (ratio %.2f; goal >= 4)\n' \
  "$(python3 -c "print($t / 1e6)")" "$(python3 -c "print($p / 1e6)")" "$(python3 -c "print($t / $p)")"
echo "        rounds (M params/s): tandem $(printf '%s ' "${ours[@]}" | awk '{for (i = 1; i <= NF; i++) printf "%.0f ", $i / 1e6}');reference $(printf '%s ' "${theirs[@]}" | awk '{for (i = 1; i <= NF; i++) printf "%.0f ", $i / 1e6}')"
