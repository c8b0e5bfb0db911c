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

# A copy of the config with `key=value` overrides (dotted keys), for both sides.
sized() {
  local out=$1
  shift
  python3 - "$out" "$@" <<'PY'
import json, sys
config = json.load(open("configs/llama-shakespeare.json"))
for item in sys.argv[2:]:
    key, value = item.split("=", 1)
    *path, last = key.split(".")
    node = config
    for part in path:
        node = node.setdefault(part, {})
    node[last] = json.loads(value)
json.dump(config, open(sys.argv[1], "w"))
PY
}
sized "$work/small.json"
sized "$work/medium.json" model.hidden_size=384 model.intermediate_size=1024 \
  model.num_hidden_layers=6 model.num_attention_heads=6 model.num_key_value_heads=2 \
  model.max_position_embeddings=256 train.seq_len=256 train_micro_batch_size_per_gpu=8

tokens_per_s() { python3 -c "import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['tokens_per_s'])"; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "$("$build/tandem" --version) vs $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'), $threads threads"
for size in small medium; do
  ours=() theirs=()
  for ((r = 0; r < rounds; r++)); do
    ours+=("$("$build/tandem" bench step --config "$work/$size.json" --warmup 3 --steps 8 --json 2>/dev/null | tokens_per_s)")
    theirs+=("$(python3 bench/pytorch_llama_train.py --config "$work/$size.json" --threads "$threads" --warmup 3 --steps 8 2>/dev/null | tokens_per_s)")
  done
  t=$(median "${ours[@]}") p=$(median "${theirs[@]}")
  printf '%-7s tandem %8.0f tok/s (%s)  PyTorch %8.0f tok/s (%s)  ratio %.3f\n' "$size" "$t" \
    "${ours[*]%.*}" "$p" "${theirs[*]%.*}" "$(python3 -c "print($t / $p)")"
done
