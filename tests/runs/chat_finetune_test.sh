#!/usr/bin/env bash
# The fine-tune of the README, end to end on the bundled data: tools/make_tiny_chat_model.py
# makes a tiny random Qwen3 with a ChatML tokenizer and chats from Tiny Shakespeare;
# tools/tokenize_bpe.py tokenizes the chats through the chat template with the loss mask on
# the answers; tandem trains from the model directory (configs/tiny-chat-finetune.json, no
# model section) and the loss on the answers falls; the checkpoint carries the tokenizer;
# tools/chat.py asks it through the template. Skips (exit 77, saying why) where python3
# lacks tokenizers or jinja2 (`make test` installs both: the Makefile's pydeps).
set -euo pipefail
source_dir="$1"
tandem="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for module in tokenizers jinja2; do
  if ! python3 -c "import $module" 2> /dev/null; then
    echo "SKIPPED: python3 cannot import $module (python3 -m pip install $module)"
    exit 77
  fi
done

python3 "$source_dir/tools/make_tiny_chat_model.py" --output "$work/tiny-chat"
python3 "$source_dir/tools/tokenize_bpe.py" --tokenizer "$work/tiny-chat/model/tokenizer.json" \
  --output-dir "$work/tiny-chat/data" --name chats "$work/tiny-chat/chats.jsonl"
shard="$work/tiny-chat/data/chats_train_000000.bin"
[[ -f $shard && -f ${shard%.bin}.mask.bin ]] || { echo "FAILED: no shard and mask"; ls -R "$work"; exit 1; }

"$tandem" train --config "$source_dir/configs/tiny-chat-finetune.json" \
  --set "train.init_from=$work/tiny-chat/model" --set "data.train_path=$shard" \
  --set "train.output_dir=$work/run" --set train.steps=200 --set train.eval_interval=0 \
  --set train.checkpoint_interval=200 --metrics "$work/metrics.jsonl" > "$work/train.log" 2>&1 ||
  { cat "$work/train.log"; exit 1; }
python3 - "$work/metrics.jsonl" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "counted_targets" in r]
assert steps, "no step record has counted_targets: was the loss mask read?"
tokens = 8 * 128
assert all(0 < r["counted_targets"] < tokens for r in steps), [r["counted_targets"] for r in steps]
first, last = steps[0]["loss"], sum(r["loss"] for r in steps[-10:]) / 10
print(f"loss on the answers {first:.3f} -> {last:.3f}; "
      f"{steps[0]['counted_targets']} of {tokens} targets counted in the first step")
assert last < first - 1.0, "the loss on the answers did not fall"
PY
checkpoint="$work/run/checkpoints/step_00000200"
for file in tokenizer.json tokenizer_config.json special_tokens_map.json; do
  cmp "$work/tiny-chat/model/$file" "$checkpoint/$file" || { echo "FAILED: $file not carried"; exit 1; }
done
reply=$(python3 "$source_dir/tools/chat.py" --checkpoint "$work/run" --tandem "$tandem" \
  --tokens 24 "First Citizen:
Before we proceed any further, hear me speak.")
echo "reply: $reply"
# The answers it learned are speeches: a speaker's name and a colon, then lines.
[[ $reply == *[[:alpha:]]*:* ]] || { echo "FAILED: the reply is not a speech"; exit 1; }
echo "PASSED: fine-tuned on the answers from a transformers-style model directory, and it answers"
