#!/usr/bin/env bash
# tandem's checkpoints in Hugging Face transformers: a tiny Llama (grouped-query heads,
# untied head) and a tiny GPT-2 are trained a few steps, then tools/check_hf_load.py loads
# each checkpoint with AutoModelForCausalLM (no missing or unexpected tensors) and compares
# its logits with `tandem logits` on the same tokens. Skips (exit 77, saying why) where no
# Python has torch and transformers: those are PyPI test oracles, gigabytes to install, so
# CI does not carry them.
set -euo pipefail
source_dir="$1"
tandem="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if ! python3 -c "import torch, transformers" 2> /dev/null; then
  echo "SKIPPED: no python3 with torch and transformers (pip install torch transformers)"
  exit 77
fi

head -c 60000 "$source_dir/data/tinyshakespeare.txt" > "$work/data.txt"
common=(--set "data.train_path=$work/data.txt" --set train.steps=4 --set train.eval_interval=0
        --set train.sample_bytes=0 --set train.seq_len=32 --set train_micro_batch_size_per_gpu=2)
"$tandem" train --config "$source_dir/configs/llama-shakespeare.json" "${common[@]}" \
  --set model.hidden_size=32 --set model.num_hidden_layers=2 --set model.intermediate_size=72 \
  --set "train.output_dir=$work/llama" > "$work/llama.log" 2>&1 || { cat "$work/llama.log"; exit 1; }
"$tandem" train --config "$source_dir/configs/shakespeare-char.json" "${common[@]}" \
  --set model.n_embd=32 --set model.n_layer=2 \
  --set "train.output_dir=$work/gpt2" > "$work/gpt2.log" 2>&1 || { cat "$work/gpt2.log"; exit 1; }

for run in llama gpt2; do
  python3 "$source_dir/tools/check_hf_load.py" "$work/$run/checkpoints/step_00000004" \
    --tandem "$tandem" --seq-len 32 2>&1 | grep -v -i -e warn -e "Loading weights" | tee "$work/$run.check"
  grep -q ": match$" "$work/$run.check" || { echo "FAILED: $run logits differ"; exit 1; }
done
grep -q "loaded LlamaForCausalLM" "$work/llama.check"
grep -q "loaded GPT2LMHeadModel" "$work/gpt2.check"
echo "PASSED: both families load in transformers with tandem's logits"
