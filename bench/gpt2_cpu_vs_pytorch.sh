#!/usr/bin/env bash
# tandem's GPT-2 training step on the CPU (fp32) against PyTorch's, eager and through
# torch.compile (bench/pytorch_gpt2_train.py --config: the same shapes, batch and sequence
# length, fp32, the same threads), in one run: each size runs ROUNDS times, the three sides
# alternating, and the ratios of the median tokens/s are printed (the machines are shared and
# noisy: one run's ratios, not absolute figures). The goal of issue 30: tandem at 1.2x
# torch.compile's tokens/s.
#
#   bench/gpt2_cpu_vs_pytorch.sh [BUILD_DIR] [ROUNDS]    (defaults: build, 3)
#
# Sizes: configs/shakespeare-char.json as it is (0.84 M parameters, B 16, T 128), and the
# same GPT at n_layer 6, n_embd 384 (10.8 M parameters). torch.compile's first steps compile
# (tens of seconds on 2 cores): they are its warm-up, left out of the median. Needs python3
# with torch and a C++ compiler (torch.compile's CPU backend builds C++).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
threads=$(nproc)
python3 -c "import torch" 2>/dev/null || { echo "needs python3 with torch: pip install torch" >&2; exit 2; }
[[ -x $build/tandem ]] || { echo "no $build/tandem: build it first (cmake --build $build)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

source bench/side_by_side.sh
sized configs/shakespeare-char.json "$work/small.json"
sized configs/shakespeare-char.json "$work/medium.json" model.n_layer=6 model.n_embd=384

pytorch() {  # config, extra arguments...
  local config=$1
  shift
  python3 bench/pytorch_gpt2_train.py --device cpu --config "$config" --precision fp32 \
    --threads "$threads" "$@" 2>/dev/null | last_field tokens_per_s
}

echo "$("$build/tandem" --version) vs torch $(python3 -c 'import torch; print(torch.__version__)'), fp32, $threads threads, $rounds rounds"
for size in small medium; do
  ours=() eager=() compiled=()
  for ((r = 0; r < rounds; r++)); do
    ours+=("$("$build/tandem" bench step --config "$work/$size.json" --warmup 3 --steps 10 --json 2>/dev/null | last_field tokens_per_s)")
    eager+=("$(pytorch "$work/$size.json" --warmup 3 --steps 10)")
    compiled+=("$(pytorch "$work/$size.json" --compile --warmup 5 --steps 10)")
  done
  t=$(median "${ours[@]}") e=$(median "${eager[@]}") c=$(median "${compiled[@]}")
  printf '%-7s tandem %8.0f tok/s  eager %8.0f (ratio %.3f)  torch.compile %8.0f (ratio %.3f; goal >= 1.2)\n' \
    "$size" "$t" "$e" "$(python3 -c "print($t / $e)")" "$c" "$(python3 -c "print($t / $c)")"
  echo "        rounds: tandem ${ours[*]%.*}; eager ${eager[*]%.*}; compile ${compiled[*]%.*}"
done
