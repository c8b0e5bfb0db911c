#!/usr/bin/env bash
# `tandem bench demo --json` gives the fields bench/demo_vs_pytorch.sh reads (a step's
# parameters per second over the bench's 7,084,800 parameters, the DCT against sgemm), and
# bench/pytorch_demo_step.py refuses bad input before it needs torch.
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

"$tandem" bench demo --threads 1 --repetitions 1 --json >"$work/demo.json" 2>"$work/err" ||
  fail "bench demo: $(cat "$work/err")"
python3 - "$work/demo.json" <<'PY' || fail "its JSON: $(cat "$work/demo.json")"
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert r["params"] == 7084800, r
assert r["step_seconds"] > 0 and abs(r["params_per_s"] * r["step_seconds"] - r["params"]) < 1, r
assert r["dct_gflop_per_s"] > 0 and r["sgemm_gflop_per_s"] > 0, r
assert abs(r["dct_to_sgemm"] - r["dct_gflop_per_s"] / r["sgemm_gflop_per_s"]) < 1e-9, r
PY

expect_refusal() {  # expected text, arguments...
  local expected=$1
  shift
  if python3 bench/pytorch_demo_step.py "$@" >"$work/out.txt" 2>&1; then
    fail "pytorch_demo_step.py $* succeeded"
  fi
  grep -qF -- "$expected" "$work/out.txt" || fail "pytorch_demo_step.py $*: $(cat "$work/out.txt")"
}
expect_refusal "--steps >= 1" --steps 0
expect_refusal "--threads >= 0" --threads -1
expect_refusal "--topk and --chunk must be at least 1" --topk 0
echo "PASSED"
