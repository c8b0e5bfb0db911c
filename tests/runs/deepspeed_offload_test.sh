#!/usr/bin/env bash
# The DeepSpeed baseline's checks that need no GPU.
#
#   tests/runs/deepspeed_offload_test.sh SOURCE_DIR           # bench/deepspeed_offload_train.py
#   tests/runs/deepspeed_offload_test.sh SOURCE_DIR wheels    # tools/pack_deepspeed_wheels.sh
#
# Without a mode: every argument and config error of bench/deepspeed_offload_train.py exits 2
# with its one-line message; --print-ds-config prints ZeRO-2 and ZeRO-3 configs with the
# optimizer offloaded to pinned host memory; and where the script would start training it
# stops on this machine's lack: no torch, or torch without a CUDA GPU. No network, no torch
# needed.
# `wheels`: tools/pack_deepspeed_wheels.sh makes the wheel set in a temporary folder and it
# passes its own offline-install check, then a second one with this machine's pip. Needs
# PyPI: skips (exit 77, saying why) only where PyPI cannot be reached.
set -euo pipefail
source_dir="$1"
mode="${2:-errors}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
script="$source_dir/bench/deepspeed_offload_train.py"
config="$source_dir/configs/llama2-7b.json"
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_error PHRASE ARGS...: the script exits 2 and its stderr says PHRASE.
expect_error() {
  local phrase="$1"; shift
  local rc=0
  python3 "$script" "$@" > "$work/out" 2> "$work/err" || rc=$?
  if [ "$rc" -ne 2 ]; then
    fail "$* exited $rc, not 2: $(cat "$work/err")"
  elif ! grep -qF -- "$phrase" "$work/err"; then
    fail "$* did not say '$phrase': $(cat "$work/err")"
  else
    echo "ok: $* -> $(head -1 "$work/err")"
  fi
}

if [ "$mode" = wheels ]; then
  if ! python3 -m pip download -q --retries 1 --timeout 10 --no-deps --only-binary=:all: \
       -d "$work/probe" hjson \
       > /dev/null 2>&1; then
    echo "SKIPPED: PyPI is not reachable (pip download hjson failed); the wheel set needs it"
    exit 77
  fi
  start=$SECONDS
  bash "$source_dir/tools/pack_deepspeed_wheels.sh" "$work/wheels" || fail "pack_deepspeed_wheels.sh failed"
  echo "pack_deepspeed_wheels.sh took $((SECONDS - start)) s"
  for pattern in 'deepspeed-0.19.*-py3-none-any.whl' 'hjson-*.whl' 'pydantic-2.*.whl' \
                 'pydantic_core-*-cp312-*manylinux*x86_64*.whl' 'annotated_types-*.whl' \
                 'typing_inspection-*.whl'; do
    count=$(find "$work/wheels" -name "$pattern" | wc -l)
    [ "$count" -eq 1 ] || fail "$count wheels match $pattern, not 1"
  done
  for name in torch numpy transformers; do
    if find "$work/wheels" -iname "$name-*" | grep -q .; then fail "the set carries $name"; fi
  done
  # The same offline install with this machine's own pip, not the script's venv's.
  python3 -m pip install -q --disable-pip-version-check --no-index --no-deps \
    --target "$work/target" --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --only-binary=:all: "$work/wheels"/*.whl \
    || fail "the set does not install offline with $(python3 -m pip --version)"
  [ -f "$work/target/deepspeed/__init__.py" ] || fail "no deepspeed package after the install"
  # A failing step says so and exits non-zero.
  rc=0
  PYTHON=/nonexistent/python3 bash "$source_dir/tools/pack_deepspeed_wheels.sh" "$work/bad" \
    > /dev/null 2> "$work/err" || rc=$?
  if [ "$rc" -eq 0 ] || ! grep -q "venv failed" "$work/err"; then
    fail "a missing python did not fail the pack script with its message (rc $rc)"
  fi
  [ "$failures" -eq 0 ] && echo "the wheel set installs offline" || exit 1
  exit 0
fi

echo '{"model": {"type": "llama"' > "$work/broken.json"
echo '{"model": {"type": "gpt2", "vocab_size": 256}}' > "$work/gpt2.json"
expect_error "does not exist" --config "$work/missing.json"
expect_error "is not JSON" --config "$work/broken.json"
expect_error "this baseline trains a Llama" --config "$work/gpt2.json"
expect_error "--zero-stage 1 is not benchmarked" --config "$config" --zero-stage 1
expect_error "--zero-stage 4 is not benchmarked" --config "$config" --zero-stage 4
expect_error "--steps 0 is not positive" --config "$config" --steps 0
expect_error "--batch 0 is not positive" --config "$config" --batch 0
expect_error "--seq-len -5 is not positive" --config "$config" --seq-len -5
expect_error "--data $work/none.bin: no such file" --config "$config" --data "$work/none.bin"
expect_error "--lr 0.0 is not a positive learning rate" --config "$config" --lr 0

# The DeepSpeed configs: the right stage, the optimizer in pinned host memory, the config's
# AdamW and clipping, bf16.
for stage in 2 3; do
  if python3 "$script" --config "$config" --zero-stage "$stage" --print-ds-config \
       > "$work/ds.json" 2> "$work/err" &&
     python3 - "$work/ds.json" "$stage" << 'EOF'
import json, sys
ds, stage = json.load(open(sys.argv[1])), int(sys.argv[2])
zero = ds["zero_optimization"]
assert zero["stage"] == stage, zero
assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}, zero
assert "offload_param" not in zero, zero
assert zero["sub_group_size"] == 100000000, zero
assert ds["bf16"] == {"enabled": True}, ds
assert ds["gradient_clipping"] == 1.0, ds
assert ds["optimizer"] == {"type": "AdamW", "params": {"lr": 0.0003, "betas": [0.9, 0.95],
                           "eps": 1e-08, "weight_decay": 0.1}}, ds
assert "scheduler" not in ds and "activation_checkpointing" not in ds, ds
assert ds["train_micro_batch_size_per_gpu"] == 1 and ds["gradient_accumulation_steps"] == 1, ds
EOF
  then
    echo "ok: --zero-stage $stage --print-ds-config"
  else
    fail "--zero-stage $stage --print-ds-config: $(cat "$work/err")"
  fi
done

# --lr replaces the config's learning rate and nothing else (the sweep's LR, both sides).
if python3 "$script" --config "$config" --lr 3e-5 --print-ds-config > "$work/ds.json" 2> "$work/err" &&
   python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["optimizer"]["params"]; assert p == {"lr": 3e-5, "betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.1}, p' \
     "$work/ds.json"; then
  echo "ok: --lr 3e-5 --print-ds-config"
else
  fail "--lr 3e-5 --print-ds-config: $(cat "$work/err")"
fi

# Past the checks, the script needs torch and a CUDA GPU: it says which is missing here.
if ! python3 -c "import torch" 2> /dev/null; then
  expect_error "PyTorch is not installed" --config "$config" --steps 1 --warmup 0
elif ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  expect_error "needs a CUDA GPU (DeepSpeed's offload trains on one); none is visible here" \
    --config "$config" --steps 1 --warmup 0
else
  echo "note: this machine has torch and a CUDA GPU; the no-GPU message is not checked"
fi

[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
echo "all deepspeed_offload_train.py checks passed"
