#!/usr/bin/env bash
# The offload sweep's pieces that run without a GPU: `tandem bench offload` trains a small
# Llama under the device, cpu, interleave and auto schedules on the cpu device (one state
# digest, a predicted update time for each), bench/offload_sweep_summary.py sets its JSON
# beside DeepSpeed results of bench/deepspeed_offload_train.py's format (made up here: no GPU)
# and prints the ratios, and fails on a loss that does not descend or digests that differ;
# bench/gpu_offload_sweep.sh refuses an unknown part.
set -euo pipefail
source_dir="$1"
tandem="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$source_dir"
fail() {
  echo "FAILED: $*"
  exit 1
}

mkdir -p "$work/results"
"$tandem" bench offload --config configs/llama-shakespeare.json \
  --set zero_optimization.sub_group_size=40000 --set device.memory_gb=0.03 \
  --set train_micro_batch_size_per_gpu=4 --set train.seq_len=64 \
  --schedules device,cpu,interleave,auto --steps 3 --warmup 1 --json \
  >"$work/results/tandem-llama-shakespeare.json" 2>"$work/bench.log" ||
  fail "tandem bench offload: $(cat "$work/bench.log")"
python3 - "$work/results/tandem-llama-shakespeare.json" <<'PY' || fail "bench offload's JSON"
import json, sys
r = json.load(open(sys.argv[1]))
runs = {x["schedule"]: x for x in r["runs"]}
assert list(runs) == ["device", "cpu", "interleave", "auto"], list(runs)
assert r["digests_agree"] and len({x["state_digest"] for x in runs.values()}) == 1, r
for x in runs.values():
    assert x["predicted_update_ms"] > 0 and x["update_ms"] > 0, x
    assert len(x["losses"]) == 4 and x["pinned_host_bytes"] >= 0, x
assert runs["cpu"]["host_subgroups"] > 0 and runs["cpu"]["resident_subgroups"] == 0
assert runs["interleave"]["staged_subgroups"] > 0
assert runs["device"]["host_subgroups"] == 0 and runs["device"]["pinned_host_bytes"] < runs["cpu"]["pinned_host_bytes"]
PY

# DeepSpeed's side, as bench/deepspeed_offload_train.py prints it: auto at 2.5x ZeRO-3 and 2x
# ZeRO-Offload's tokens/s.
auto_tokens=$(python3 -c 'import json, sys; print(next(x["tokens_per_s"] for x in json.load(open(sys.argv[1]))["runs"] if x["schedule"] == "auto"))' \
  "$work/results/tandem-llama-shakespeare.json")
for stage in 2 3; do
  python3 - "$work/results/deepspeed-llama-shakespeare-$stage.json" "$stage" "$auto_tokens" <<'PY'
import json, sys
path, stage, auto = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
json.dump({"framework": "deepspeed", "deepspeed": "0.19.0", "zero_stage": stage, "offload": "cpu",
           "mode": "zero%d-offload" % stage, "tokens_per_step": 256, "timed_steps": 2,
           "config": "configs/llama-shakespeare.json", "tokens_per_s": auto / (2.0 if stage == 2 else 2.5),
           "forward_ms": 1.0, "backward_ms": 2.0, "update_ms": 3.0, "peak_gpu_bytes": 1 << 30,
           "pinned_host_bytes": 1 << 31, "losses": [5.5, 5.0, 4.5]}, open(path, "w"))
PY
done
python3 bench/offload_sweep_summary.py "$work/results" >"$work/summary.txt" ||
  fail "the summary of good results failed: $(cat "$work/summary.txt")"
for expected in "tandem own setting / DeepSpeed's best (zero2-offload): 2.00 (goal >= 1.5 on 7B-class: met)" \
  "tandem own setting / DeepSpeed ZeRO-3 offload: 2.50" "tandem cpu / DeepSpeed ZeRO-Offload: " \
  "== llama-shakespeare: 0.00 B parameters, 256 tokens per optimizer step, T 64" \
  "predicted / measured update" "DeepSpeed zero2-offload" "tandem interleave" "5.000 -> 4.500"; do
  grep -qF "$expected" "$work/summary.txt" || fail "the summary lacks '$expected': $(cat "$work/summary.txt")"
done

# tandem bench versus (the sweep's `versus` part): the overlapped update against waiting for it,
# in one process, with one digest; the summary shows its ratio.
"$tandem" bench versus --config configs/llama-shakespeare.json \
  --set zero_optimization.sub_group_size=40000 --set offload_optimizer.schedule=cpu \
  --set train_micro_batch_size_per_gpu=4 --set train.seq_len=64 \
  --set offload_optimizer.overlap_forward=false --versus offload_optimizer.overlap_forward=true \
  --rounds 2 --steps 2 --warmup 1 --json \
  >"$work/results/versus-llama-shakespeare.json" 2>"$work/versus.log" ||
  fail "tandem bench versus: $(cat "$work/versus.log")"
python3 - "$work/results/versus-llama-shakespeare.json" <<'PY' || fail "bench versus's JSON"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["changes"] == ["offload_optimizer.overlap_forward=true"], r
assert r["digests_agree"] and r["base"]["state_digest"] == r["variant"]["state_digest"], r
assert r["rounds"] == 2 and r["ms_ratio"] > 0 and r["tokens_per_s_ratio"] > 0, r
assert r["variant"]["update_ms"] >= r["variant"]["update_exposed_ms"] > 0, r
PY
python3 bench/offload_sweep_summary.py "$work/results" >"$work/summary.txt" ||
  fail "the summary with bench versus's result failed: $(cat "$work/summary.txt")"
grep -qF "offload_optimizer.overlap_forward=true" "$work/summary.txt" ||
  fail "the summary lacks bench versus's row: $(cat "$work/summary.txt")"
if "$tandem" bench versus --config configs/llama-shakespeare.json --versus nonsense=1 \
  >"$work/out.txt" 2>&1; then
  fail "bench versus ran with an unknown key"
fi
grep -qF "nonsense" "$work/out.txt" || fail "unclear refusal: $(cat "$work/out.txt")"

# A loss that does not descend, and schedules that disagree, fail the summary.
python3 - "$work/results/deepspeed-llama-shakespeare-3.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); r["losses"] = [9.0, 5.0, 5.1]; json.dump(r, open(sys.argv[1], "w"))
PY
if python3 bench/offload_sweep_summary.py "$work/results" >"$work/summary.txt"; then
  fail "a DeepSpeed loss that rises after warm-up passed"
fi
grep -qF "FAIL: llama-shakespeare at 256 tokens/step: DeepSpeed zero3-offload's loss at its end is not lower than after warm-up (5.0 -> 5.1)" "$work/summary.txt" ||
  fail "no reason given: $(cat "$work/summary.txt")"
rm "$work/results/deepspeed-llama-shakespeare-3.json"
python3 - "$work/results/tandem-llama-shakespeare.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); r["runs"][1]["state_digest"] = "0"; r["digests_agree"] = False
json.dump(r, open(sys.argv[1], "w"))
PY
if python3 bench/offload_sweep_summary.py "$work/results" >"$work/summary.txt"; then
  fail "digests that differ passed"
fi
grep -qF "tandem's schedules ended with different state digests" "$work/summary.txt" || fail "no reason given: $(cat "$work/summary.txt")"

# Bad input: a clear refusal.
if "$tandem" bench offload --config configs/llama-shakespeare.json --set device.memory_gb=0.001 \
  --schedules cpu,interleave >"$work/out.txt" 2>&1; then
  fail "bench offload succeeded with no schedule that fits"
fi
grep -qF "no schedule fits the device" "$work/out.txt" || fail "unclear refusal: $(cat "$work/out.txt")"
if bash bench/gpu_offload_sweep.sh nonsense >"$work/out.txt" 2>&1; then fail "an unknown part ran"; fi
grep -qF "unknown part 'nonsense'" "$work/out.txt" || fail "unclear refusal: $(cat "$work/out.txt")"
if python3 bench/offload_sweep_summary.py "$work/nowhere" >"$work/out.txt" 2>&1; then
  fail "a missing directory was accepted"
fi
grep -qF "no directory" "$work/out.txt" || fail "unclear refusal: $(cat "$work/out.txt")"

# A part whose process dies leaves a JSON that says how, and the summary names it: a tandem
# killed by SIGKILL inside its limit (as the out-of-memory killer does), a run past
# PART_SECONDS, and a DeepSpeed run that failed, beside the other results.
mkdir -p "$work/fake" "$work/killed"
cat >"$work/fake/tandem" <<'SH'
#!/usr/bin/env bash
case $1 in
tokenize) : >"$5" ;;
plan) echo "a plan" ;;
bench) echo "building the model" >&2; [[ ${FAKE_SLEEP:-0} == 0 ]] && kill -9 $$; sleep "$FAKE_SLEEP" ;;
esac
SH
chmod +x "$work/fake/tandem"
if PAYLOAD="$work/fake" OUT_DIR="$work/killed" MEMORY_GB=1 bash bench/gpu_offload_sweep.sh tandem \
  configs/llama-shakespeare.json 4 >"$work/out.txt" 2>&1; then
  fail "a killed tandem part passed: $(cat "$work/out.txt")"
fi
python3 - "$work/killed/tandem-llama-shakespeare-4.json" <<'PY' || fail "the killed part's JSON: $(cat "$work/killed/tandem-llama-shakespeare-4.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["part"] == "tandem-llama-shakespeare-4" and r["config"] == "configs/llama-shakespeare.json", r
assert r["train_batch_size"] == "4" and r["kind"] == "tandem", r
assert "killed by SIGKILL after" in r["error"] and "out-of-memory killer" in r["error"], r
assert r["error"].endswith("its log's last line: building the model"), r
PY
grep -qF "FAIL: tandem-llama-shakespeare-4.json: tandem bench offload: killed by SIGKILL" \
  "$work/out.txt" || fail "the summary does not name the kill: $(cat "$work/out.txt")"
if FAKE_SLEEP=30 PART_SECONDS=1 PAYLOAD="$work/fake" OUT_DIR="$work/killed" MEMORY_GB=1 \
  bash bench/gpu_offload_sweep.sh tandem configs/llama-shakespeare.json 4 >"$work/out.txt" 2>&1; then
  fail "a part past its limit passed"
fi
grep -qF "ran past its 1 s limit (PART_SECONDS)" "$work/killed/tandem-llama-shakespeare-4.json" ||
  fail "the timed-out part's JSON: $(cat "$work/killed/tandem-llama-shakespeare-4.json")"
echo '{"framework": "deepspeed", "zero_stage": 2, "config": "configs/llama-shakespeare.json", "error": "killed by SIGKILL after 99 s"}' \
  >"$work/results/deepspeed-llama-shakespeare-2.json"
if python3 bench/offload_sweep_summary.py "$work/results" >"$work/summary.txt"; then
  fail "a failed DeepSpeed run passed"
fi
grep -qE "^DeepSpeed zero2-offload +failed: killed by SIGKILL after 99 s$" "$work/summary.txt" &&
  grep -qF "DeepSpeed zero2-offload failed" "$work/summary.txt" ||
  fail "the summary does not show the failed DeepSpeed run: $(cat "$work/summary.txt")"
# A DeepSpeed process that dies in a phase (here killed by SIGKILL in its second of three, as
# a phase out of memory ends it): the first phase keeps its line, the second gets one that says
# how, and a new process runs the third. A python3 in front of the real one stands in for the
# DeepSpeed script and for an installed DeepSpeed. It dies as if in the middle of torch's build of
# the cpu_adam op, leaving the build's lock file, on which a real second process would wait to
# the end of the part: the sweep removes it.
mkdir -p "$work/fakepy" "$work/dsdied"
real_python=$(command -v python3)
cat >"$work/fakepy/python3" <<SH
#!/usr/bin/env bash
if [[ \${1:-} == -c && \${2:-} == "import deepspeed" ]]; then exit 0; fi
if [[ \${1:-} == */deepspeed_offload_train.py ]]; then
  args=" \$* "; tbs=\${args##* --train-batch-size }; tbs=\${tbs%% *}
  echo "phases \$tbs" >&2
  lock=\$TORCH_EXTENSIONS_DIR/cpu_adam/lock
  [[ -e \$lock ]] && { echo "waits on \$lock" >&2; exit 3; }
  for t in \${tbs//,/ }; do
    [[ \$t == 8 ]] && { mkdir -p "\${lock%/lock}" && touch "\$lock" && kill -9 \$\$; }
    echo "{\"framework\": \"deepspeed\", \"mode\": \"zero2-offload\", \"config\": \"configs/llama-shakespeare.json\", \"train_batch_size\": \$t, \"tokens_per_step\": \$((t * 64)), \"micro_batch\": \$t, \"timed_steps\": 2, \"tokens_per_s\": 1000.0, \"losses\": [5.0, 4.0, 3.0]}"
  done
  exit 0
fi
exec "$real_python" "\$@"
SH
chmod +x "$work/fakepy/python3"
if PATH="$work/fakepy:$PATH" PAYLOAD="$(dirname "$tandem")" OUT_DIR="$work/dsdied" SEQ=64 MEMORY_GB=1 \
  TORCH_EXTENSIONS_DIR="$work/extensions" bash bench/gpu_offload_sweep.sh deepspeed \
  configs/llama-shakespeare.json zero2-offload 4,8,16 >"$work/out.txt" 2>&1; then
  fail "a DeepSpeed part whose process died passed: $(cat "$work/out.txt")"
fi
python3 - "$work/dsdied/deepspeed-llama-shakespeare-zero2-offload-4-8-16.json" <<'PY' ||
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["train_batch_size"] for l in lines] == [4, "8", 16], lines
assert "killed by SIGKILL" in lines[1]["error"] and lines[1]["tokens_per_step"] == 512, lines[1]
assert "error" not in lines[0] and "error" not in lines[2], lines
PY
  fail "the lines of a DeepSpeed part that died: $(cat "$work/dsdied"/*.json "$work/out.txt")"
grep -qF "a new DeepSpeed process for the phases after it: 16" "$work/out.txt" ||
  fail "no second process: $(cat "$work/out.txt")"
grep -qF "phases 16" "$work/dsdied/deepspeed-llama-shakespeare-zero2-offload-4-8-16.log" ||
  fail "the second process did not run phase 16 alone"
grep -qE "^DeepSpeed best +failed|^DeepSpeed zero2-offload +failed: killed by SIGKILL" "$work/out.txt" ||
  fail "the summary does not show the phase that died: $(cat "$work/out.txt")"

# The sweep's own-setting part end to end on the cpu device (tandem bench offload with
# train_batch_size and the auto keys, or the fixed fallback), annotated with tokens per step,
# and its LR schedule the same as the DeepSpeed script's: the lrs of `tandem train --metrics`
# against deepspeed_offload_train.py --print-lr-schedule.
PAYLOAD="$(dirname "$tandem")" OUT_DIR="$work/sweep" SEQ=64 STEPS=3 WARMUP=2 LR=2e-3 MEMORY_GB=1 \
  bash bench/gpu_offload_sweep.sh tandem configs/llama-shakespeare.json 4,8 >"$work/out.txt" 2>&1 ||
  fail "the tandem part: $(cat "$work/out.txt")"
python3 - "$work/sweep" <<'PY' || fail "the tandem part's JSON"
import json, sys
for tbs in (4, 8):
    r = json.load(open(f"{sys.argv[1]}/tandem-llama-shakespeare-{tbs}.json"))
    assert r["sweep"]["tokens_per_step"] == tbs * 64 and r["sweep"]["kind"] == "tandem", r["sweep"]
    assert len(r["runs"]) == 1 and len(r["runs"][0]["losses"]) == 5, r
PY
grep -qF "512 tokens per optimizer step" "$work/out.txt" || fail "no 512-token group: $(cat "$work/out.txt")"
"$tandem" train --config configs/llama-shakespeare.json --set train.steps=8 \
  --set scheduler.params.warmup_num_steps=3 --set scheduler.params.cos_min_ratio=0.1 \
  --set optimizer.params.lr=2e-3 --set train.eval_interval=0 --set train.sample_bytes=0 \
  --set train.checkpoint_interval=0 --set train.seq_len=32 --set train_micro_batch_size_per_gpu=2 \
  --set train.output_dir="$work/lr-run" --metrics "$work/metrics.jsonl" >"$work/train.log" 2>&1 ||
  fail "tandem train: $(cat "$work/train.log")"
python3 bench/deepspeed_offload_train.py --config configs/llama-shakespeare.json --lr 2e-3 \
  --warmup 3 --steps 5 --cos-min-ratio 0.1 --print-lr-schedule >"$work/ds-lr.json" ||
  fail "--print-lr-schedule failed"
python3 - "$work/metrics.jsonl" "$work/ds-lr.json" <<'PY' || fail "the two schedules differ"
import json, sys
ours = [json.loads(l)["lr"] for l in open(sys.argv[1]) if '"lr"' in l]
theirs = json.load(open(sys.argv[2]))
assert len(ours) == 8 == len(theirs), (ours, theirs)
assert all(abs(a - b) <= 1e-12 * max(a, b) for a, b in zip(ours, theirs)), (ours, theirs)
PY
# tandem at DeepSpeed's placement takes the micro-batch, accumulation and recompute of
# DeepSpeed's best setting on the same machine (bench/deepspeed_memory.py's plan).
PAYLOAD="$(dirname "$tandem")" OUT_DIR="$work/placement" SEQ=64 STEPS=2 WARMUP=1 LR=2e-3 \
  MEMORY_GB=1 bash bench/gpu_offload_sweep.sh tandem-cpu configs/llama-shakespeare.json 8 \
  >"$work/out.txt" 2>&1 || fail "the tandem-cpu part: $(cat "$work/out.txt")"
want=$(python3 bench/deepspeed_offload_train.py --config configs/llama-shakespeare.json \
  --mode best --train-batch-size 8 --seq-len 64 --gpu-memory-gb 1 --print-plan)
python3 - "$work/placement/tandem-cpu-llama-shakespeare-8.json" "$want" <<'PY' ||
import json, sys
r = json.load(open(sys.argv[1])); p = json.loads(sys.argv[2])["phases"][0]
setting = r["sweep"]["setting"]
assert setting.startswith("DeepSpeed's placement: schedule cpu, the setting of DeepSpeed's best"), setting
assert f"micro-batch {p['micro_batch']}, accumulation {p['gradient_accumulation_steps']}" in setting, (setting, p)
assert r["runs"][0]["schedule"] == "cpu", r["runs"]
PY
  fail "the tandem-cpu part's setting is not DeepSpeed's best: $(cat "$work/out.txt")"

# A DeepSpeed phase that no setting fits on the machine is shown with its reason, not failed.
mkdir -p "$work/notrun"
cp "$work/sweep/tandem-llama-shakespeare-4.json" "$work/notrun/"
python3 - "$work/notrun/deepspeed-llama-shakespeare-best-4.json" <<'PY'
import json, sys
json.dump({"framework": "deepspeed", "mode": "zero2-offload", "zero_stage": 2,
           "config": "configs/llama-shakespeare.json", "train_batch_size": 4, "micro_batch": 4,
           "gradient_accumulation_steps": 1, "activation_checkpointing": False,
           "tokens_per_step": 256, "seq_len": 64,
           "not_run": "zero2-offload needs about 9.0 GiB of host memory"}, open(sys.argv[1], "w"))
PY
python3 bench/offload_sweep_summary.py "$work/notrun" >"$work/summary.txt" ||
  fail "a DeepSpeed phase not run failed the summary: $(cat "$work/summary.txt")"
for expected in "not run: zero2-offload needs about 9.0 GiB of host memory" \
  "tandem own setting / DeepSpeed's best: no ratio, DeepSpeed cannot train this here"; do
  grep -qF "$expected" "$work/summary.txt" || fail "the summary lacks '$expected': $(cat "$work/summary.txt")"
done

bash bench/gpu_offload_sweep.sh plan | grep -qF "deepspeed configs/llama2-7b.json best 4,16" ||
  fail "the plan lacks the 7B DeepSpeed part"
if bash bench/gpu_offload_sweep.sh tandem configs/llama-shakespeare.json 4,x >"$work/out.txt" 2>&1; then
  fail "a bad train batch size ran"
fi
grep -qF "'x' is not a train batch size" "$work/out.txt" || fail "unclear refusal: $(cat "$work/out.txt")"
echo "PASSED"
