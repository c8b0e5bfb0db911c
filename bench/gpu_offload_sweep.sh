#!/usr/bin/env bash
# The headline measurement: Llama models whose training state exceeds the GPU, trained by
# tandem (its update schedules) and by DeepSpeed (ZeRO-Offload and ZeRO-3 with optimizer
# offload) on the same GPU, shapes, tokens and precision (bf16, sequence 2048, activation
# checkpointing off on both sides). One part per call, each within one 10-minute device
# command (model construction and DeepSpeed's CPU Adam build included):
#
#   bench/gpu_offload_sweep.sh tandem CONFIG [SCHEDULES]   tandem bench offload: SCHEDULES
#                                                          (default cpu,interleave,auto) side by
#                                                          side in one process, one state digest
#   bench/gpu_offload_sweep.sh deepspeed CONFIG STAGE      bench/deepspeed_offload_train.py,
#                                                          STAGE 2 (ZeRO-Offload) or 3
#   bench/gpu_offload_sweep.sh digest                      the same bits with the state on the GPU
#                                                          and offloaded (configs/llama-124m.json:
#                                                          device, cpu, interleave, auto)
#   bench/gpu_offload_sweep.sh budgets [GB...]             GPT-2 124M at device budgets too small
#                                                          for its state (the first sweep, 2026-11-24)
#   bench/gpu_offload_sweep.sh versus [GB]                 GPT-2 124M: the update overlapped with the
#                                                          next forward or not (cpu schedule at GB,
#                                                          default 9.25), and activation recompute
#                                                          or not (state on the GPU): tandem bench
#                                                          versus, a ratio each
#   bench/gpu_offload_sweep.sh summary [DIR...]            the table of every part's results found
#                                                          in DIR (default $OUT_DIR), tandem beside
#                                                          DeepSpeed, with the ratios
#
# CONFIG is configs/llama-3b.json (3.02 B) or configs/llama2-7b.json (6.74 B). Environment:
# PAYLOAD (default gpu-payload: what tools/pack_gpu_payload.sh made, with wheels/ for
# DeepSpeed; or a build directory), OUT_DIR (default $OUT, else runs/gpu-offload), BATCH
# (micro-batch, the same on both sides; default 4 for llama-3b, 2 for llama2-7b, else the
# config's: tandem's plan fits them on an 80 GB GPU with its state offloaded, and DeepSpeed's
# activations, without checkpointing, about 1.5x tandem's, fit beside its bf16 weights;
# BATCH=1 if DeepSpeed runs out of memory), MEMORY_GB (tandem's device.memory_gb, default 76:
# an H100's 79 GiB less room for the CUDA context and cuBLAS), STEPS (timed, default 5),
# WARMUP (default 2), LR (the constant learning rate of both sides; default the config's:
# at 3e-4 with no warm-up the 3B and 7B losses spike in their first steps, in both
# frameworks), PART_SECONDS (a part's run, default 560). Each part writes
# OUT_DIR/<part>-<model>[-<stage>].json and .log (two files: at most 8 come back from the
# GPU machine) and prints a summary; it exits non-zero when something failed: a run (its
# JSON then holds "error": how it ended, a kill by the out-of-memory killer named as such,
# and its log's last line), a loss that does not descend, or schedules whose state digests
# differ.
set -uo pipefail
cd "$(dirname "$0")/.."

part=${1:-}
[[ -n $part ]] || {
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
shift
payload=${PAYLOAD:-gpu-payload}
out=${OUT_DIR:-${OUT:-runs/gpu-offload}}
steps=${STEPS:-5}
warmup=${WARMUP:-2}
mkdir -p "$out"

# The tandem binary: unpacked from the payload, or a build directory's.
tandem_binary() {
  if [[ -f $payload/tandem-gpu.tar.xz ]]; then
    [[ -x $payload/bin/tandem ]] || tar -C "$payload" -xJf "$payload/tandem-gpu.tar.xz" || return 1
    export LD_LIBRARY_PATH="$payload/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "$payload/bin/tandem"
  elif [[ -x $payload/tandem ]]; then
    echo "$payload/tandem"
  else
    echo "gpu_offload_sweep: no tandem in $payload: run tools/pack_gpu_payload.sh here, carry" \
      "gpu-payload, or set PAYLOAD to a build directory" >&2
    return 1
  fi
}

# The token shard both sides train on: the bundled text as bytes (ids < 256, valid in any
# vocabulary here), written by tandem itself.
shard_of() {
  local dir
  dir=$(mktemp -d)
  "$1" tokenize --input data/tinyshakespeare.txt --output "$dir/tinyshakespeare.bin" >&2 &&
    echo "$dir/tinyshakespeare.bin"
}

model_name() { basename "${1%.json}"; }

# Why a part's process failed, in one line: exit status RC after RAN of its CAP seconds, the
# last line of LOG, and the kernel's out-of-memory report where it can be read.
failure_reason() {
  local rc=$1 ran=$2 cap=$3 log=$4 what last oom
  if ((rc == 124 || (rc == 137 && ran >= cap))); then
    what="ran past its ${cap} s limit (PART_SECONDS)"
  elif ((rc == 137)); then
    what="killed by SIGKILL after ${ran} s, inside its ${cap} s limit: most likely the"
    what+=" kernel's out-of-memory killer (host memory)"
  elif ((rc > 128)); then
    what="killed by signal $((rc - 128)) after ${ran} s"
  else
    what="exited $rc after ${ran} s"
  fi
  oom=$(dmesg 2>/dev/null | grep -iE "out of memory|oom-kill" | tail -n 1 | cut -c1-200)
  last=$(grep -v '^[[:space:]]*$' "$log" 2>/dev/null | tail -n 1 | cut -c1-300)
  echo "$what${oom:+; kernel: $oom}; its log's last line: ${last:-none}"
}

# Replaces a failed part's JSON with {"error": ...} (and the keys FIELDS=VALUES that say what
# it was), so that the summary names the failure beside the other results.
record_failure() {
  local json=$1 reason=$2
  shift 2
  python3 -c 'import json, sys
r = dict(a.split("=", 1) for a in sys.argv[2:])
if "zero_stage" in r: r["zero_stage"] = int(r["zero_stage"])
r["error"] = sys.argv[1]
print(json.dumps(r))' "$reason" "$@" >"$json"
}

# The start of a part that runs tandem on GPT-2 124M: $bin, $shard, the part's $name, its
# empty $out/$name.json and .log, and status 0.
begin_gpt2_part() {
  name=$1
  bin=$(tandem_binary) || return 1
  shard=$(shard_of "$bin") || return 1
  : >"$out/$name.json"
  : >"$out/$name.log"
  status=0
}

# The micro-batch both sides train with (see the top).
batch_for() {
  if [[ -n ${BATCH:-} ]]; then
    echo "$BATCH"
  else
    case $(model_name "$1") in
    llama-3b) echo 4 ;;
    llama2-7b) echo 2 ;;
    esac
  fi
}

# The overrides that make tandem's runs the ones DeepSpeed's script makes: one micro-batch per
# step, a constant learning rate (no warm-up, no decay), the shard.
tandem_sets() {
  local shard=$1 batch=$2
  echo --set data.train_path="$shard" --set gradient_accumulation_steps=1 \
    --set scheduler.params.warmup_num_steps=0 --set scheduler.params.cos_min_ratio=1 \
    --set device.memory_gb="${MEMORY_GB:-76}" ${batch:+--set train_micro_batch_size_per_gpu=$batch} \
    ${LR:+--set optimizer.params.lr=$LR}
}

case $part in
tandem | digest)
  if [[ $part == digest ]]; then
    config=configs/llama-124m.json
    schedules=device,cpu,interleave,auto
    # Small subgroups, so that interleave and auto stage several of them.
    extra=(--set zero_optimization.sub_group_size=20000000)
  else
    config=${1:?"usage: $0 tandem CONFIG [SCHEDULES]"}
    schedules=${2:-cpu,interleave,auto}
    extra=()
  fi
  [[ -f $config ]] || {
    echo "gpu_offload_sweep: no config $config" >&2
    exit 2
  }
  name="$part-$(model_name "$config")"
  bin=$(tandem_binary) || exit 1
  shard=$(shard_of "$bin") || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2
  # The plan auto makes on this machine, from the rates it measures here.
  # shellcheck disable=SC2046
  "$bin" plan --config "$config" $(tandem_sets "$shard" "$(batch_for "$config")") "${extra[@]}" \
    --set offload_optimizer.schedule=auto 2>&1 | tee "$out/$name.log"
  started=$SECONDS
  # shellcheck disable=SC2046
  timeout --kill-after=10 "${PART_SECONDS:-560}" "$bin" bench offload --config "$config" \
    $(tandem_sets "$shard" "$(batch_for "$config")") "${extra[@]}" --schedules "$schedules" \
    --steps "$steps" \
    --warmup "$warmup" --json >"$out/$name.json" 2>>"$out/$name.log"
  status=$?
  if ((status != 0)) && [[ ! -s $out/$name.json ]]; then
    record_failure "$out/$name.json" "tandem bench offload: $(failure_reason "$status" \
      $((SECONDS - started)) "${PART_SECONDS:-560}" "$out/$name.log")" part="$name" config="$config"
  fi
  ;;
deepspeed)
  config=${1:?"usage: $0 deepspeed CONFIG STAGE"}
  stage=${2:?"usage: $0 deepspeed CONFIG STAGE (2: ZeRO-Offload, 3: ZeRO-3 with optimizer offload)"}
  name="deepspeed-$(model_name "$config")-$stage"
  bin=$(tandem_binary) || exit 1
  shard=$(shard_of "$bin") || exit 1
  # DeepSpeed and its missing dependencies travel as wheels (tools/pack_deepspeed_wheels.sh):
  # this machine has no package index.
  if ! python3 -c 'import deepspeed' 2>/dev/null; then
    compgen -G "$payload/wheels/*.whl" >/dev/null || {
      echo "gpu_offload_sweep: DeepSpeed is not installed and $payload/wheels holds no wheels:" \
        "run tools/pack_deepspeed_wheels.sh here and carry gpu-payload" >&2
      exit 1
    }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/deepspeed-site "$payload"/wheels/*.whl || exit 1
    export PYTHONPATH=/tmp/deepspeed-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  batch=$(batch_for "$config")
  started=$SECONDS
  PYTHONUNBUFFERED=1 timeout --kill-after=10 "${PART_SECONDS:-560}" python3 \
    bench/deepspeed_offload_train.py --config "$config" --zero-stage "$stage" --data "$shard" \
    --steps "$steps" --warmup "$warmup" ${batch:+--batch "$batch"} ${LR:+--lr "$LR"} \
    2>"$out/$name.log" | tail -n 1 >"$out/$name.json"
  status=${PIPESTATUS[0]}
  if ((status != 0)); then
    record_failure "$out/$name.json" "$(failure_reason "$status" $((SECONDS - started)) \
      "${PART_SECONDS:-560}" "$out/$name.log")" framework=deepspeed zero_stage="$stage" \
      config="$config"
  fi
  ;;
budgets)
  # GPT-2 124M (bf16, B 16, T 1024) whose 1.39 GiB of fp32 state does not fit beside its
  # 8.96 GiB of activations and bf16 model: 9.25 GiB leaves room for staging buffers only,
  # 9.75 GiB for a few resident subgroups.
  budgets=("$@")
  ((${#budgets[@]})) || budgets=(9.25 9.75)
  begin_gpt2_part budgets-gpt2-124m || exit 1
  for gb in "${budgets[@]}"; do
    timeout --kill-after=10 240 "$bin" bench offload --config configs/gpt2-124m.json \
      --set data.train_path="$shard" --set zero_optimization.sub_group_size=10000000 \
      --set device.memory_gb="$gb" --schedules cpu,interleave,auto --steps 10 --warmup 3 --json \
      2>>"$out/$name.log" |
      python3 -c 'import json, sys; r = json.load(sys.stdin); r["memory_gb"] = float(sys.argv[1]); print(json.dumps(r))' \
        "$gb" >>"$out/$name.json" || status=1
  done
  ;;
versus)
  gb=${1:-9.25}
  begin_gpt2_part versus-gpt2-124m || exit 1
  common=(--config configs/gpt2-124m.json --set data.train_path="$shard" --rounds 2 --steps 10
    --warmup 3 --json)
  timeout --kill-after=10 240 "$bin" bench versus "${common[@]}" \
    --set zero_optimization.sub_group_size=10000000 --set device.memory_gb="$gb" \
    --set offload_optimizer.schedule=cpu --set offload_optimizer.overlap_forward=false \
    --versus offload_optimizer.overlap_forward=true 2>>"$out/$name.log" >>"$out/$name.json" ||
    status=1
  timeout --kill-after=10 240 "$bin" bench versus "${common[@]}" \
    --versus activation_checkpointing.interval=1 2>>"$out/$name.log" >>"$out/$name.json" ||
    status=1
  ;;
summary) ;;
*)
  echo "gpu_offload_sweep: unknown part '$part' (tandem, deepspeed, digest, budgets, versus or summary)" >&2
  exit 2
  ;;
esac

# The summary: every result in the given directories (or this part's), tandem beside DeepSpeed.
dirs=("$out")
if [[ $part == summary && $# -gt 0 ]]; then dirs=("$@"); fi
python3 bench/offload_sweep_summary.py "${dirs[@]}" || status=1
exit "${status:-0}"
