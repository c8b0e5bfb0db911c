#!/usr/bin/env bash
# The headline measurement (issue 42): Llama models trained by tandem at its own chosen setting
# and at DeepSpeed's placement, and by DeepSpeed at its best (bench/deepspeed_offload_train.py),
# on the same GPU, sequence (2048), bf16, tokens (the bundled text as bytes), tokens per
# optimizer step and learning-rate schedule (WarmupCosineLR: linear warm-up over WARMUP steps
# to LR, cosine to LR x 0.1 at the last step, identical on both sides). One part per device
# command, each sized to at most ~8 minutes (bench/README.md keeps the ordered list, the
# estimates and which parts have run):
#
#   gpu_offload_sweep.sh tandem CONFIG TBS[,TBS...]     tandem bench offload at its own setting:
#                                                       train_batch_size TBS sequences per step,
#                                                       micro-batch, accumulation and recompute
#                                                       "auto", schedule auto (`tandem plan`'s
#                                                       choice is in the log); one process per TBS
#   gpu_offload_sweep.sh tandem-cpu CONFIG TBS[,...]    tandem at DeepSpeed's placement: schedule
#                                                       cpu, the micro-batch, accumulation and
#                                                       recompute of DeepSpeed's best at TBS
#   gpu_offload_sweep.sh deepspeed CONFIG MODE TBS[,...] DeepSpeed in MODE (zero2, zero2-offload,
#                                                       zero3-offload, zero3-twinflow, or best:
#                                                       the mode, micro-batch, accumulation and
#                                                       recompute that fit this machine, per TBS,
#                                                       bench/deepspeed_memory.py), one process,
#                                                       one phase per TBS
#   gpu_offload_sweep.sh probe CONFIG MODE              DeepSpeed's largest micro-batch in MODE
#                                                       (with activation checkpointing if DS_CKPT=1)
#   gpu_offload_sweep.sh schedules CONFIG [SCHEDULES]   tandem's schedules side by side at one
#                                                       micro-batch (the 2026-11-26 part)
#   gpu_offload_sweep.sh digest | budgets [GB...] | versus [GB]   GPT-2 124M checks (unchanged)
#   gpu_offload_sweep.sh summary [DIR...]               the table (bench/offload_sweep_summary.py)
#   gpu_offload_sweep.sh plan                           the ordered part list with estimates
#
# TBS is in sequences of SEQ (default 2048) tokens: 4, 16, 64, 256 are 8K, 32K, 128K, 512K
# tokens per optimizer step. CONFIG: configs/llama-3b.json, configs/llama2-7b.json,
# configs/llama3.1-8b.json, configs/llama2-13b.json. Environment: PAYLOAD (default gpu-payload,
# or a build directory), OUT_DIR (default $OUT, else runs/gpu-offload), STEPS (timed, default
# 20), WARMUP (untimed steps and the learning-rate warm-up, default 5), LR (peak, default 1e-4
# on both sides: at the configs' 3e-4 the 3B and 7B losses spiked on 2026-11-26), MEMORY_GB
# (tandem's device.memory_gb, and DeepSpeed's GPU memory for best; default the GPU's memory
# less 3 GiB), DS_MICRO (DeepSpeed's micro-batch in a named mode, default per model: 4 for
# 3B, 2 for 7B/8B, 1 for 13B, capped at TBS; in best, and tandem-cpu, the largest known to fit
# without recompute, default estimated), DS_CKPT (1: activation checkpointing on DeepSpeed's
# side in a named mode and the probe; default 0),
# DS_RATIO (zero3-twinflow's offload ratio, default 0.5), DS_ARGS (more arguments for the
# DeepSpeed script), PART_SECONDS (a process's limit, default 560). Each part writes
# OUT_DIR/<part>-<model>[-<mode>][-<tbs>].json and .log and prints the summary; it exits
# non-zero when something failed: a run (its JSON then holds "error": how it ended, a kill by
# the out-of-memory killer named as such, and its log's last line; where a DeepSpeed process
# dies in one phase, a new one runs the phases after it), a loss not lower at the end than
# after warm-up, or schedules whose state digests differ.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

part=${1:-}
[[ -n $part ]] || {
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
shift
payload=${PAYLOAD:-gpu-payload}
out=${OUT_DIR:-${OUT:-runs/gpu-offload}}
steps=${STEPS:-20}
warmup=${WARMUP:-5}
lr=${LR:-1e-4}
seq=${SEQ:-2048}
cap=${PART_SECONDS:-560}
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
for key in ("zero_stage", "tokens_per_step"):
    if key in r: r[key] = int(r[key])
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

# tandem's device.memory_gb: MEMORY_GB, else the GPU's memory less 3 GiB (the CUDA context and
# cuBLAS), else 76 (an H100's 79 GiB).
memory_gb() {
  if [[ -n ${MEMORY_GB:-} ]]; then
    echo "$MEMORY_GB"
    return
  fi
  local mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  if [[ $mib =~ ^[0-9]+$ ]]; then
    python3 -c "print(round($mib / 1024 - 3, 1))"
  else
    echo 76
  fi
}

# DeepSpeed's micro-batch for CONFIG at TBS: DS_MICRO, else the model's default, at most TBS.
ds_micro() {
  local m=${DS_MICRO:-}
  if [[ -z $m ]]; then
    case $(model_name "$1") in
    llama-3b) m=4 ;;
    llama2-13b) m=1 ;;
    *) m=2 ;;
    esac
  fi
  ((m > $2)) && m=$2
  echo "$m"
}

# DeepSpeed's best setting at TBS sequences per step on this machine (bench/deepspeed_memory.py,
# through the DeepSpeed script's --print-plan): "MODE MICRO ACCUMULATION CHECKPOINTING(0/1)".
ds_best_setting() {
  python3 bench/deepspeed_offload_train.py --config "$1" --mode best --train-batch-size "$2" \
    --seq-len "$seq" --gpu-memory-gb "$(memory_gb)" ${DS_MICRO:+--micro-batch "$DS_MICRO"} \
    --print-plan | python3 -c 'import json, sys
plan = json.load(sys.stdin); p = plan["phases"][0]
print(plan["mode"], p["micro_batch"], p["gradient_accumulation_steps"], int(p["activation_checkpointing"]))'
}

# TBS list -> one per line, each checked.
tbs_list() {
  local v
  for v in ${1//,/ }; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || {
      echo "gpu_offload_sweep: '$v' is not a train batch size (sequences per step)" >&2
      return 1
    }
    echo "$v"
  done
}

# The overrides every tandem run of the sweep shares: the shard, the sequence, the learning
# rate and its schedule (the same as DeepSpeed's: WarmupCosineLR over WARMUP steps to LR, then
# cosine to LR x 0.1 at the run's last step, STEPS + WARMUP), the device budget.
tandem_common_sets() {
  echo --set data.train_path="$1" --set train.seq_len="$seq" --set optimizer.params.lr="$lr" \
    --set scheduler.params.warmup_num_steps="$warmup" --set scheduler.params.cos_min_ratio=0.1 \
    --set device.memory_gb="$(memory_gb)"
}

# tandem's own setting at TBS sequences per step, if this tandem has the auto keys (tandem plan
# accepts them); else the fixed setting of 2026-11-26 (the model's micro-batch, no recompute)
# with the accumulation that makes TBS, saying so.
tandem_auto_sets() {
  local config=$1 shard=$2 tbs=$3 m
  sets=(--set train_batch_size="$tbs" --set train_micro_batch_size_per_gpu=auto
    --set gradient_accumulation_steps=auto --set activation_checkpointing.interval=auto
    --set offload_optimizer.schedule=auto)
  # shellcheck disable=SC2046
  if "$bin" plan --config "$config" $(tandem_common_sets "$shard") "${sets[@]}" >/dev/null 2>&1; then
    setting=auto
  else
    m=$(DS_MICRO='' ds_micro "$config" "$tbs")
    setting="fixed: micro-batch $m, accumulation $((tbs / m)), no recompute (this tandem refuses the auto keys)"
    sets=(--set train_micro_batch_size_per_gpu="$m" --set gradient_accumulation_steps=$((tbs / m))
      --set activation_checkpointing.interval=0 --set offload_optimizer.schedule=auto)
  fi
}

# Adds the sweep's facts to a tandem JSON: model, train batch, tokens per step, the setting.
annotate() {
  python3 - "$@" <<'PY'
import json, sys
path, model, tbs, seq, kind, setting = sys.argv[1:7]
r = json.load(open(path))
r["model"] = model
r["sweep"] = {"train_batch_size": int(tbs), "tokens_per_step": int(tbs) * int(seq),
              "kind": kind, "setting": setting, "sets": sys.argv[7:]}
json.dump(r, open(path, "w"))
PY
}

# One tandem bench offload run: $1 part kind (tandem, tandem-cpu), $2 config, $3 tbs, the rest
# its overrides. Writes $out/<kind>-<model>-<tbs>.json and .log.
tandem_run() {
  local kind=$1 config=$2 tbs=$3 schedules name started rc
  shift 3
  schedules=auto
  [[ $kind == tandem-cpu ]] && schedules=cpu
  name="$kind-$(model_name "$config")-$tbs"
  : >"$out/$name.log"
  # shellcheck disable=SC2046
  "$bin" plan --config "$config" $(tandem_common_sets "$shard") "$@" 2>&1 | tee -a "$out/$name.log"
  started=$SECONDS
  # shellcheck disable=SC2046
  timeout --kill-after=10 "$cap" "$bin" bench offload --config "$config" \
    $(tandem_common_sets "$shard") "$@" --schedules "$schedules" --steps "$steps" \
    --warmup "$warmup" --json >"$out/$name.json" 2>>"$out/$name.log"
  rc=$?
  if ((rc != 0)) && [[ ! -s $out/$name.json ]]; then
    record_failure "$out/$name.json" "tandem bench offload: $(failure_reason "$rc" \
      $((SECONDS - started)) "$cap" "$out/$name.log")" part="$name" config="$config" \
      train_batch_size="$tbs" kind="$kind"
  else
    annotate "$out/$name.json" "$(model_name "$config")" "$tbs" "$seq" "$kind" "$setting" "$@"
  fi
  return "$rc"
}

# DeepSpeed's wheels (tools/pack_deepspeed_wheels.sh) where it is not installed: the GPU
# machine has no package index.
install_deepspeed() {
  python3 -c 'import deepspeed' 2>/dev/null && return 0
  compgen -G "$payload/wheels/*.whl" >/dev/null || {
    echo "gpu_offload_sweep: DeepSpeed is not installed and $payload/wheels holds no wheels:" \
      "run tools/pack_deepspeed_wheels.sh here and carry gpu-payload" >&2
    return 1
  }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/deepspeed-site "$payload"/wheels/*.whl || return 1
  export PYTHONPATH=/tmp/deepspeed-site${PYTHONPATH:+:$PYTHONPATH}
}

config_arg() {
  [[ -f ${1:-} ]] || {
    echo "gpu_offload_sweep: no config '${1:-}'" >&2
    exit 2
  }
}

status=0
case $part in
tandem | tandem-cpu)
  config=${1:-}
  config_arg "$config"
  tbs_all=$(tbs_list "${2:?"usage: $0 $part CONFIG TBS[,TBS...]"}") || exit 2
  bin=$(tandem_binary) || exit 1
  shard=$(shard_of "$bin") || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2
  for tbs in $tbs_all; do
    if [[ $part == tandem ]]; then
      tandem_auto_sets "$config" "$shard" "$tbs"
    else
      read -r ds_mode m accumulation ckpt < <(ds_best_setting "$config" "$tbs") || {
        echo "gpu_offload_sweep: DeepSpeed's best setting at $tbs sequences could not be planned" >&2
        exit 1
      }
      setting="DeepSpeed's placement: schedule cpu, the setting of DeepSpeed's best ($ds_mode):"
      setting+=" micro-batch $m, accumulation $accumulation, recompute $ckpt"
      sets=(--set train_micro_batch_size_per_gpu="$m" --set gradient_accumulation_steps="$accumulation"
        --set activation_checkpointing.interval="$ckpt")
    fi
    tandem_run "$part" "$config" "$tbs" "${sets[@]}" || status=1
  done
  ;;
deepspeed | probe)
  config=${1:-}
  config_arg "$config"
  mode=${2:?"usage: $0 $part CONFIG MODE${part/probe/}${part/deepspeed/ TBS[,TBS...]}"}
  what=(--gpu-memory-gb "$(memory_gb)")
  if [[ $part == deepspeed ]]; then
    tbs_all=$(tbs_list "${3:?"usage: $0 deepspeed CONFIG MODE TBS[,TBS...]"}") || exit 2
    tbs_csv=$(echo $tbs_all | tr ' ' ,)
    name="deepspeed-$(model_name "$config")-$mode-${tbs_csv//,/-}"
    what+=(--steps "$steps" --warmup "$warmup")
    if [[ $mode == best ]]; then
      # The script plans each TBS (its log says how); DS_MICRO is then the largest micro-batch
      # known to fit without recompute.
      [[ -n ${DS_MICRO:-} ]] && what+=(--micro-batch "$DS_MICRO")
    else
      what+=(--micro-batch "$(ds_micro "$config" "$(echo "$tbs_all" | sort -n | head -n 1)")")
      [[ ${DS_CKPT:-0} == 1 ]] && what+=(--activation-checkpointing)
    fi
  else
    name="probe-$(model_name "$config")-$mode"
    tbs_csv=${PROBE_MAX:-64}
    what+=(--find-largest-micro-batch)
    [[ ${DS_CKPT:-0} == 1 ]] && what+=(--activation-checkpointing)
  fi
  [[ $mode == zero3-twinflow ]] && what+=(--offload-ratio "${DS_RATIO:-0.5}")
  bin=$(tandem_binary) || exit 1
  shard=$(shard_of "$bin") || exit 1
  install_deepspeed || exit 1
  : >"$out/$name.json"
  : >"$out/$name.log"
  started=$SECONDS
  remaining=$tbs_csv
  # One process for all phases; where it dies (a phase out of GPU memory kills the process, as
  # can the out-of-memory killer), its finished phases keep their lines, the phase it died in
  # gets a line that says how, and a new process runs the phases after it while the part has
  # at least a minute left of PART_SECONDS.
  while [[ -n $remaining ]]; do
    left=$((cap - (SECONDS - started)))
    # A DeepSpeed process killed while torch built its cpu_adam op leaves the build's lock file,
    # and the next one would wait on it to the end of the part; here no other process builds.
    rm -f "${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions_deepspeed}"/cpu_adam*/lock
    lines_before=$(grep -c . "$out/$name.json")
    attempt_started=$SECONDS
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout --kill-after=10 "$left" python3 bench/deepspeed_offload_train.py \
      --config "$config" --mode "$mode" --data "$shard" --seq-len "$seq" --lr "$lr" \
      --cos-min-ratio 0.1 --train-batch-size "$remaining" "${what[@]}" ${DS_ARGS:-} \
      2>>"$out/$name.log" >>"$out/$name.json"
    rc=$?
    ((rc == 0)) && break
    status=$rc
    # The phase it died in: the first of $remaining without a line.
    IFS=, read -r -a phases_left <<<"$remaining"
    done_now=$(($(grep -c . "$out/$name.json") - lines_before))
    failed=${phases_left[$done_now]:-${phases_left[-1]}}
    record_failure "$out/$name.json.err" "$(failure_reason "$rc" $((SECONDS - attempt_started)) \
      "$left" "$out/$name.log")" framework=deepspeed mode="$mode" config="$config" \
      train_batch_size="$failed" tokens_per_step=$((failed * seq))
    cat "$out/$name.json.err" >>"$out/$name.json"
    rm -f "$out/$name.json.err"
    remaining=$(IFS=,; echo "${phases_left[*]:$((done_now + 1))}")
    if [[ -n $remaining && $part == deepspeed ]] && ((cap - (SECONDS - started) >= 60)); then
      echo "gpu_offload_sweep: a new DeepSpeed process for the phases after it: $remaining" |
        tee -a "$out/$name.log" >&2
    else
      remaining=
    fi
  done
  ;;
schedules | digest)
  if [[ $part == digest ]]; then
    config=configs/llama-124m.json
    schedules=device,cpu,interleave,auto
    # Small subgroups, so that interleave and auto stage several of them.
    extra=(--set zero_optimization.sub_group_size=20000000)
  else
    config=${1:-}
    config_arg "$config"
    schedules=${2:-cpu,interleave,auto}
    extra=(--set train_micro_batch_size_per_gpu="$(DS_MICRO='' ds_micro "$config" 64)"
      --set gradient_accumulation_steps=1)
  fi
  name="$part-$(model_name "$config")"
  bin=$(tandem_binary) || exit 1
  shard=$(shard_of "$bin") || exit 1
  # shellcheck disable=SC2046
  "$bin" plan --config "$config" $(tandem_common_sets "$shard") "${extra[@]}" \
    --set offload_optimizer.schedule=auto 2>&1 | tee "$out/$name.log"
  started=$SECONDS
  # shellcheck disable=SC2046
  timeout --kill-after=10 "$cap" "$bin" bench offload --config "$config" \
    $(tandem_common_sets "$shard") "${extra[@]}" --schedules "$schedules" --steps "$steps" \
    --warmup "$warmup" --json >"$out/$name.json" 2>>"$out/$name.log"
  status=$?
  if ((status != 0)) && [[ ! -s $out/$name.json ]]; then
    record_failure "$out/$name.json" "tandem bench offload: $(failure_reason "$status" \
      $((SECONDS - started)) "$cap" "$out/$name.log")" part="$name" config="$config"
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
plan)
  # The ordered parts (bench/README.md's table has the same list with what has run).
  sed -n '/^# PLAN$/,/^# END PLAN$/p' "$0" | sed '1d; $d; s/^# //'
  exit 0
  ;;
summary) ;;
*)
  echo "gpu_offload_sweep: unknown part '$part' (tandem, tandem-cpu, deepspeed, probe, schedules," \
    "digest, budgets, versus, summary or plan)" >&2
  exit 2
  ;;
esac

# The summary: every result in the given directories (or this part's), tandem beside DeepSpeed.
dirs=("$out")
if [[ $part == summary && $# -gt 0 ]]; then dirs=("$@"); fi
python3 bench/offload_sweep_summary.py "${dirs[@]}" || status=1
exit "$status"

# PLAN
# part  command (after `export OUT_DIR=$OUT`)                                      est. s
# 1     bash bench/gpu_offload_sweep.sh tandem configs/llama2-7b.json 4,16                  330
# 2     bash bench/gpu_offload_sweep.sh deepspeed configs/llama2-7b.json best 4,16          450
# 3     bash bench/gpu_offload_sweep.sh tandem-cpu configs/llama2-7b.json 4,16              400
# 4     STEPS=8 WARMUP=2 bash bench/gpu_offload_sweep.sh tandem configs/llama2-7b.json 64   330
# 5     STEPS=6 WARMUP=2 bash bench/gpu_offload_sweep.sh deepspeed configs/llama2-7b.json best 64  470 (H100: 30, not run)
# 6     bash bench/gpu_offload_sweep.sh tandem configs/llama-3b.json 4,16                  200
# 7     bash bench/gpu_offload_sweep.sh deepspeed configs/llama-3b.json best 4,16          300
# 8     bash bench/gpu_offload_sweep.sh probe configs/llama2-7b.json zero3-twinflow        200
# 9     DS_RATIO=0.5 bash bench/gpu_offload_sweep.sh deepspeed configs/llama2-7b.json zero3-twinflow 4,16  450
# 10    STEPS=8 WARMUP=2 bash bench/gpu_offload_sweep.sh tandem configs/llama-3b.json 64,256   420
# 11    STEPS=6 WARMUP=2 bash bench/gpu_offload_sweep.sh deepspeed configs/llama-3b.json best 64  300
# 12    STEPS=3 WARMUP=2 bash bench/gpu_offload_sweep.sh tandem configs/llama2-7b.json 256  480
# 13    bash bench/gpu_offload_sweep.sh tandem configs/llama3.1-8b.json 4,16               360
# 14    STEPS=12 WARMUP=3 bash bench/gpu_offload_sweep.sh deepspeed configs/llama3.1-8b.json best 4,16  450
# 15    STEPS=30 WARMUP=5 bash bench/gpu_offload_sweep.sh tandem configs/llama2-13b.json 4 (H200)  400
# 16    STEPS=5 WARMUP=2 bash bench/gpu_offload_sweep.sh deepspeed configs/llama2-13b.json zero2-offload 4 (H200)  400
# END PLAN
