#!/usr/bin/env bash
# tandem's Llama training step on the CPU against PyTorch's (transformers' LlamaForCausalLM,
# bench/pytorch_llama_train.py) on the same shapes, the same threads, in one run: each size
# runs ROUNDS times, the two sides alternating, and the ratio of the median tokens/s is
# printed (the machines are shared and noisy: one run's ratio, not absolute figures).
#
#   bench/llama_cpu_vs_pytorch.sh [BUILD_DIR] [ROUNDS]    (defaults: build, 3)
#
# Sizes: configs/llama-shakespeare.json as it is (0.8 M parameters, B 16, T 128), and a
# 10 M-parameter Llama of the same family (C 384, 6 layers, 6 query heads on 2 key/value
# heads, SwiGLU 1024, B 8, T 256). Needs python3 with torch and transformers.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
threads=$(nproc)
python3 -c "import torch, transformers" 2>/dev/null ||
  { echo "needs python3 with torch and transformers: pip install torch transformers" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

source bench/side_by_side.sh
sized configs/llama-shakespeare.json "$work/small.json"
sized configs/llama-shakespeare.json "$work/medium.json" model.hidden_size=384 model.intermediate_size=1024 \
  model.num_hidden_layers=6 model.num_attention_heads=6 model.num_key_value_heads=2 \
  model.max_position_embeddings=256 train.seq_len=256 train_micro_batch_size_per_gpu=8

echo "$("$build/tandem" --version) vs $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'), $threads threads"
for size in small medium; do
  ours=() theirs=()
  for ((r = 0; r < rounds; r++)); do
    ours+=("$("$build/tandem" bench step --config "$work/$size.json" --warmup 3 --steps 8 --json 2>/dev/null | last_field tokens_per_s)")
    theirs+=("$(python3 bench/pytorch_llama_train.py --config "$work/$size.json" --threads "$threads" --warmup 3 --steps 8 2>/dev/null | last_field tokens_per_s)")
  done
  t=$(median "${ours[@]}") p=$(median "${theirs[@]}")
  printf '%-7s tandem %8.0f tok/s (%s)  PyTorch %8.0f tok/s (%s)  ratio %.3f\n' "$size" "$t" \
    "${ours[*]%.*}" "$p" "${theirs[*]%.*}" "$(python3 -c "print($t / $p)")"
done
