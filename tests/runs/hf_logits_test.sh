#!/usr/bin/env bash
# tandem's checkpoints in Hugging Face transformers: a tiny Llama (grouped-query heads,
# untied head), the Llama family's other types (Qwen2's biases, Qwen3's q/k norms and wide
# heads, Mistral's narrow heads and window, Llama 3's scaled rotation) and a tiny GPT-2 are
# trained a few steps, then tools/check_hf_load.py loads
# each checkpoint with AutoModelForCausalLM (no missing or unexpected tensors) and compares
# its logits with `tandem logits` on the same tokens. Then the other way: models that
# transformers made and saved, read by tandem, with transformers' logits. Skips (exit 77, saying why) where no
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

# name|model type|its --set options
variants=(
  "qwen2|qwen2|"
  "qwen3|qwen3|--set model.head_dim=16"
  "mistral|mistral|--set model.head_dim=4 --set model.sliding_window=64"
  "llama3|llama|--set model.rope_theta=100 --set model.rope_scaling.rope_type=llama3 --set model.rope_scaling.factor=8 --set model.rope_scaling.low_freq_factor=1 --set model.rope_scaling.high_freq_factor=4 --set model.rope_scaling.original_max_position_embeddings=16"
)
runs=(llama gpt2)
for variant in "${variants[@]}"; do
  IFS='|' read -r run type options <<< "$variant"
  # shellcheck disable=SC2086  # options are words
  "$tandem" train --config "$source_dir/configs/llama-shakespeare.json" "${common[@]}" \
    --set model.type=$type --set model.hidden_size=32 --set model.num_hidden_layers=2 \
    --set model.intermediate_size=72 $options \
    --set "train.output_dir=$work/$run" > "$work/$run.log" 2>&1 || { cat "$work/$run.log"; exit 1; }
  runs+=("$run")
done

for run in "${runs[@]}"; do
  python3 "$source_dir/tools/check_hf_load.py" "$work/$run/checkpoints/step_00000004" \
    --tandem "$tandem" --seq-len 32 2>&1 | grep -v -i -e warn -e "Loading weights" | tee "$work/$run.check"
  grep -q ": match$" "$work/$run.check" || { echo "FAILED: $run logits differ"; exit 1; }
done
grep -q "loaded LlamaForCausalLM" "$work/llama.check"
grep -q "loaded Qwen2ForCausalLM" "$work/qwen2.check"
grep -q "loaded Qwen3ForCausalLM" "$work/qwen3.check"
grep -q "loaded MistralForCausalLM" "$work/mistral.check"
grep -q "loaded GPT2LMHeadModel" "$work/gpt2.check"

# The other way: models transformers made and saved (its own config.json, for transformers 5
# with rope_parameters; weights large enough for logits of several units, so a wrong
# rotation or a misread tensor shows), read by tandem (`tandem logits` on the directory, as
# train.init_from reads it): a Llama with grouped-query heads, rope_theta 500000 and an
# untied head, sharded; a GPT-2 in one file.
python3 - "$work" <<'PY' 2>&1 | { grep -v -i -e warn -e "Writing model shards" || true; }
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
work = sys.argv[1]
torch.manual_seed(0)
llama = dict(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
             initializer_range=0.2, bos_token_id=None, eos_token_id=None)
LlamaForCausalLM(LlamaConfig(**llama)).save_pretrained(f"{work}/hf_llama", max_shard_size="100KB")
scaled = LlamaConfig(**llama, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                            "original_max_position_embeddings": 64})
LlamaForCausalLM(scaled).save_pretrained(f"{work}/hf_llama_scaled")
GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                           initializer_range=0.2, bos_token_id=None, eos_token_id=None)
                ).save_pretrained(f"{work}/hf_gpt2")
PY
[[ -f $work/hf_llama/model.safetensors.index.json ]] || { echo "FAILED: hf_llama is not sharded"; exit 1; }
for model in hf_llama hf_gpt2; do
  python3 "$source_dir/tools/check_hf_load.py" "$work/$model" --tandem "$tandem" --seq-len 64 2>&1 |
    grep -v -i -e warn -e "Loading weights" | tee "$work/$model.check"
  grep -q ": match$" "$work/$model.check" || { echo "FAILED: $model logits differ"; exit 1; }
done
# A rotary scaling tandem does not compute is refused by name, not read as the plain one.
if "$tandem" logits --checkpoint "$work/hf_llama_scaled" --tokens 1,2,3 \
  --output "$work/scaled.safetensors" 2> "$work/scaled.err"; then
  echo "FAILED: tandem read a Llama with scaled rotary embeddings"
  exit 1
fi
cat "$work/scaled.err"
grep -q "yarn" "$work/scaled.err" || { echo "FAILED: the refusal does not name the scaling"; exit 1; }
echo "PASSED: every model type loads in transformers with tandem's logits, and tandem reads" \
  "transformers' models with transformers' logits"
