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
# Also: each mode's DeepSpeed config (zero2 with torch's fused AdamW, ZeRO-Offload, ZeRO-3
# offload, Twin-Flow's ratio), the batch and accumulation arithmetic, and the learning rate of
# every step against tandem's WarmupCosineLR formula.
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
expect_error "--zero-stage 2 and --mode zero3-offload disagree" --config "$config" --zero-stage 2 --mode zero3-offload
expect_error "--steps 0 is not positive" --config "$config" --steps 0
expect_error "--micro-batch 0 is not positive" --config "$config" --batch 0
expect_error "--seq-len -5 is not positive" --config "$config" --seq-len -5
expect_error "--data $work/none.bin: no such file" --config "$config" --data "$work/none.bin"
expect_error "--lr 0.0 is not a positive learning rate" --config "$config" --lr 0
expect_error "--train-batch-size 6 is not a multiple of the micro-batch 4" --config "$config" --train-batch-size 6 --micro-batch 4
expect_error "--train-batch-size 16 is not --micro-batch 2 x --grad-accum 4" --config "$config" --train-batch-size 16 --micro-batch 2 --grad-accum 4
expect_error "is not a number or a comma list" --config "$config" --train-batch-size 4,x
expect_error "--offload-ratio is zero3-twinflow's" --config "$config" --mode zero2-offload --offload-ratio 0.3
expect_error "--offload-ratio 1.5 is not in [0, 1]" --config "$config" --mode zero3-twinflow --offload-ratio 1.5
expect_error "--pinned exact needs a GPU" --config "$config" --device cpu --pinned exact

# The DeepSpeed config of each mode (python3 - MODE EXTRA-ARGS... checks the printed config).
check_mode() {
  local mode="$1" checks="$2"
  shift 2
  if python3 "$script" --config "$config" --mode "$mode" "$@" --print-ds-config \
       > "$work/ds.json" 2> "$work/err" &&
     python3 -c "import json, sys
ds = json.load(open(sys.argv[1])); zero = ds['zero_optimization']
assert ds['bf16'] == {'enabled': True} and ds['gradient_clipping'] == 1.0, ds
p = ds['optimizer']['params']
assert ds['optimizer']['type'] == 'AdamW' and p['lr'] == 0.0003 and p['betas'] == [0.9, 0.95], ds
assert p['eps'] == 1e-08 and p['weight_decay'] == 0.1, ds
assert 'scheduler' not in ds and 'activation_checkpointing' not in ds, ds
assert ds['train_batch_size'] == ds['train_micro_batch_size_per_gpu'] * ds['gradient_accumulation_steps'], ds
$checks" "$work/ds.json"; then
    echo "ok: --mode $mode $* --print-ds-config"
  else
    fail "--mode $mode $* --print-ds-config: $(cat "$work/err")"
  fi
}
check_mode zero2-offload "assert zero['stage'] == 2 and zero['offload_optimizer'] == {'device': 'cpu', 'pin_memory': True}, zero
assert 'sub_group_size' not in zero and zero['reduce_bucket_size'] == 500000000, zero
assert ds['train_micro_batch_size_per_gpu'] == 1 and ds['gradient_accumulation_steps'] == 1, ds"
check_mode zero2-offload "assert ds['train_batch_size'] == 64 and ds['train_micro_batch_size_per_gpu'] == 2, ds
assert ds['gradient_accumulation_steps'] == 32 and zero['reduce_bucket_size'] == 200000000, zero" \
  --train-batch-size 64,256 --micro-batch 2 --reduce-bucket-size 2e8
check_mode zero2-offload "assert zero['offload_optimizer']['pin_memory'] is False, zero" --pinned off
check_mode zero2 "assert zero['stage'] == 2 and 'offload_optimizer' not in zero, zero
assert p['torch_adam'] is True and p['fused'] is True, p"
check_mode zero2 "assert 'torch_adam' not in p and 'fused' not in p, p" --gpu-adam deepspeed-fused
check_mode zero3-offload "assert zero['stage'] == 3 and zero['offload_optimizer'] == {'device': 'cpu', 'pin_memory': True}, zero
assert zero['sub_group_size'] == 100000000 and zero['stage3_param_persistence_threshold'] == 10**10, zero
assert 'offload_param' not in zero, zero"
check_mode zero3-twinflow "assert zero['stage'] == 3 and zero['offload_optimizer']['ratio'] == 0.3, zero" \
  --offload-ratio 0.3
check_mode zero3-offload "assert zero['stage'] == 3 and 'ratio' not in zero['offload_optimizer'], zero" \
  --zero-stage 3
check_mode zero2-offload "assert ds['wall_clock_breakdown'] is True, ds" --wall-clock-breakdown

# --lr replaces the config's learning rate and nothing else (the sweep's LR, both sides).
if python3 "$script" --config "$config" --lr 3e-5 --print-ds-config > "$work/ds.json" 2> "$work/err" &&
   python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["optimizer"]["params"]; assert p == {"lr": 3e-5, "betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.1}, p' \
     "$work/ds.json"; then
  echo "ok: --lr 3e-5 --print-ds-config"
else
  fail "--lr 3e-5 --print-ds-config: $(cat "$work/err")"
fi

# The learning rate: tandem's WarmupCosineLR (src/tandem/optim/lr_schedule.cc) step by step:
# warm-up 4 steps to 3e-4, cosine over the next 6 to 3e-5 (cos_min_ratio 0.1).
if python3 "$script" --config "$config" --lr 3e-4 --warmup 4 --steps 6 --print-lr-schedule \
     > "$work/lr.json" 2> "$work/err" &&
   python3 -c 'import json, math, sys
lrs = json.load(open(sys.argv[1]))
want = [3e-4 * (s + 1) / 4 for s in range(4)] + [3e-5 + 0.5 * (1 + math.cos(math.pi * (s - 4) / 6)) * 2.7e-4 for s in range(4, 10)]
assert len(lrs) == 10 and all(abs(a - b) < 1e-15 for a, b in zip(lrs, want)), (lrs, want)
assert lrs[3] == 3e-4 and abs(lrs[4] - 3e-4) < 1e-15 and lrs[-1] > 3e-5' "$work/lr.json"; then
  echo "ok: --print-lr-schedule is tandem's WarmupCosineLR"
else
  fail "--print-lr-schedule: $(cat "$work/err" "$work/lr.json")"
fi

# Per-phase micro-batches and activation checkpointing: the first phase's go into the config.
check_mode zero2-offload "assert ds['train_micro_batch_size_per_gpu'] == 2 and ds['gradient_accumulation_steps'] == 2, ds" \
  --train-batch-size 4,16 --micro-batch 2,16 --activation-checkpointing 0,1
expect_error "--micro-batch gives 2 values for 3 train batch sizes" --config "$config" \
  --train-batch-size 4,16,64 --micro-batch 2,4
expect_error "--activation-checkpointing 0,2: give nothing (every phase) or one 0 or 1 per phase" \
  --config "$config" --train-batch-size 4,16 --activation-checkpointing 0,2
expect_error "--train-batch-size 16 is not a multiple of the micro-batch 3" --config "$config" \
  --train-batch-size 4,16 --micro-batch 2,3
expect_error "--mode best chooses the accumulation and activation checkpointing itself" \
  --config "$config" --mode best --activation-checkpointing --gpu-memory-gb 76
expect_error "--mode best takes one --micro-batch" --config "$config" --mode best \
  --train-batch-size 4,16 --micro-batch 2,4 --gpu-memory-gb 76

# --mode best (bench/deepspeed_memory.py): python3 - ARGS... checks the plan of the 7B shape
# at 8K, 32K, 128K and 512K tokens per step on a machine of GPU and host memory given in GiB.
check_plan() {
  local checks="$1"
  shift
  if python3 "$script" --mode best --seq-len 2048 --print-plan "$@" > "$work/plan.json" \
       2> "$work/err" &&
     python3 -c "import json, sys
plan = json.load(open(sys.argv[1])); mode = plan['mode']
ph = {p['train_batch_size']: (p['micro_batch'], p['gradient_accumulation_steps'],
                              p['activation_checkpointing'], p.get('not_run', '')) for p in plan['phases']}
$checks" "$work/plan.json"; then
    echo "ok: --mode best $* --print-plan"
  else
    fail "--mode best $* --print-plan: $(cat "$work/err" "$work/plan.json")"
  fi
}
# An H100 box (76 GiB for DeepSpeed, 123 GiB of host available): ZeRO-Offload's 7B state takes
# 115 GiB of host memory, 128 with accumulation's buffer, so each step is one micro-batch.
check_plan "assert mode == 'zero2-offload' and plan['offload_ratio'] == 1.0, plan
assert ph[4] == (4, 1, False, '') and ph[16] == (16, 1, True, ''), ph" \
  --config "$config" --train-batch-size 4,16 --gpu-memory-gb 76 --host-memory-gb 123
# 128K tokens need accumulation there, which ZeRO-Offload's host memory does not allow:
# Twin-Flow (ZeRO-3, its accumulation in the gradients it holds anyway) at the ratio with the
# fewest micro-batches; with 128K in the same process, every phase takes that mode.
check_plan "assert mode == 'zero3-twinflow' and plan['offload_ratio'] == 0.75, plan
assert ph[64] == (16, 4, True, ''), ph" --config "$config" --train-batch-size 64 \
  --gpu-memory-gb 76 --host-memory-gb 123
check_plan "assert mode == 'zero3-twinflow' and not any(p[3] for p in ph.values()), plan
assert ph[4] == (4, 1, True, '') and ph[256] == (16, 16, True, ''), ph" --config "$config" \
  --train-batch-size 4,16,64,256 --gpu-memory-gb 76 --host-memory-gb 123
# An H200 box: 64 checkpointed sequences fit the GPU, so ZeRO-Offload runs 128K in one.
check_plan "assert mode == 'zero2-offload' and ph[64] == (64, 1, True, ''), ph" --config "$config" \
  --train-batch-size 64 --gpu-memory-gb 136 --host-memory-gb 125
# Host memory for accumulation: one checkpointed micro-batch where it holds the whole batch,
# else the largest micro-batch, checkpointed where that makes it larger (fewer round trips of
# every gradient to the host).
check_plan "assert mode == 'zero2-offload' and ph[16] == (16, 1, True, '') and ph[256] == (32, 8, True, ''), ph" \
  --config "$config" --train-batch-size 16,256 --gpu-memory-gb 76 --host-memory-gb 256
# A probe's answer (--micro-batch) replaces the estimate of the largest plain micro-batch.
check_plan "assert ph[4] == (4, 1, False, ''), ph" --config "$config" --train-batch-size 4 \
  --gpu-memory-gb 76 --host-memory-gb 256
check_plan "assert ph[4] == (4, 1, True, ''), ph" --config "$config" --train-batch-size 4 \
  --micro-batch 2 --gpu-memory-gb 76 --host-memory-gb 256
# The 3B model's state fits an H100 with ZeRO-2 and no offload; its accumulation is on the GPU.
check_plan "assert mode == 'zero2' and ph[16] == (1, 16, False, ''), plan" \
  --config "$source_dir/configs/llama-3b.json" --train-batch-size 16 --gpu-memory-gb 76 --host-memory-gb 123
# Llama 3.1 8B's ZeRO-Offload state (137.5 GiB) does not fit 123 GiB; Twin-Flow's does.
check_plan "assert mode == 'zero3-twinflow' and 0 < plan['offload_ratio'] < 1, plan
assert not any(p[3] for p in ph.values()) and ph[4][2], ph" \
  --config "$source_dir/configs/llama3.1-8b.json" --train-batch-size 4,16 --gpu-memory-gb 76 --host-memory-gb 123
# Llama-2 13B fits neither mode at any ratio; the script then prints why for every phase and
# builds nothing (no torch needed).
check_plan "assert all('even without accumulation' in p[3] for p in ph.values()), ph" \
  --config "$source_dir/configs/llama2-13b.json" --train-batch-size 4,16 --gpu-memory-gb 76 --host-memory-gb 123
if python3 "$script" --config "$source_dir/configs/llama2-13b.json" --mode best \
     --train-batch-size 4,16 --gpu-memory-gb 76 --host-memory-gb 123 > "$work/lines.json" \
     2> "$work/err" &&
   python3 -c 'import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["train_batch_size"] for l in lines] == [4, 16], lines
assert all(l["framework"] == "deepspeed" and "220.4 GiB" in l["not_run"] for l in lines), lines
assert lines[0]["tokens_per_step"] == 8192 and lines[0]["params"] == 13015864320, lines' "$work/lines.json" &&
   grep -qF "best: 4 sequences: not run" "$work/err"; then
  echo "ok: a plan with nothing to run prints why, one line per phase"
else
  fail "a plan with nothing to run: $(cat "$work/err" "$work/lines.json")"
fi
expect_error "--mode best chooses Twin-Flow's --offload-ratio itself" --config "$config" \
  --mode best --offload-ratio 0.5 --gpu-memory-gb 76
# The GPU estimate reproduces the one measurement it is fitted to: 3B, ZeRO-Offload,
# micro-batch 4 of 2048 tokens, no checkpointing, 37.49 GiB peak on the H100 (2026-11-26).
if python3 -c "import json, sys
sys.path.insert(0, sys.argv[1] + '/bench')
import deepspeed_memory as dm
shape = dm.llama_shape(json.load(open(sys.argv[1] + '/configs/llama-3b.json'))['model'])
assert shape['params'] == 3015355392, shape
est = dm.gpu_bytes('zero2-offload', shape, 4 * 2048, False) / dm.GIB
assert abs(est / 37.49 - 1) < 0.01, est
assert dm.host_bytes('zero3-offload', shape, True) == 20 * shape['params'] + dm.PROCESS_HOST_BYTES
assert dm.host_bytes('zero2-offload', shape, True) - dm.host_bytes('zero2-offload', shape, False) == 2 * shape['params']" "$source_dir"; then
  echo "ok: the GPU estimate gives the 3B run's measured peak"
else
  fail "the GPU estimate no longer gives the 3B run's 37.49 GiB"
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
