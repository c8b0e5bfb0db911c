#!/usr/bin/env bash
# `tandem bench checkpoint-io` on the demo model: two rounds of save, load and resume into
# an update engine (each round trip checked bit for bit inside), a JSON with the fields bench/checkpoint_vs_pytorch.sh
# reads, nothing left behind in --dir; a --dir that is not a directory refused by name; and
# bench/pytorch_checkpoint_io.py's refusals of bad input, which come before it needs torch.
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

mkdir -p "$work/disk"
"$tandem" bench checkpoint-io --config configs/shakespeare-char.json --dir "$work/disk" \
  --rounds 2 --json >"$work/io.json" 2>"$work/err" || fail "bench checkpoint-io: $(cat "$work/err")"
python3 - "$work/io.json" "$work/disk" <<'PY' || fail "its JSON: $(cat "$work/io.json")"
import json, math, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert r["rounds"] == 2 and all(len(r[k]) == 2 for k in ("save_ms", "load_ms", "resume_ms")), r
assert all(r[k] > 0 for k in ("save_ms_median", "load_ms_median", "resume_ms_median")), r
# params, exp_avg and exp_avg_sq as fp32, and a checkpoint a little larger (headers, JSON).
assert r["array_bytes"] == 3 * 4 * r["params"], r
assert r["array_bytes"] < r["checkpoint_bytes"] < r["array_bytes"] + (1 << 20), r
assert r["optimizer_arrays"] == ["exp_avg", "exp_avg_sq"], r
assert r["tensors"], r
numel = sum(math.prod(shape) for _, shape in r["tensors"])
assert numel == r["params"], (numel, r["params"])
assert r["dir"] == sys.argv[2], r
PY
[[ -z $(ls -A "$work/disk") ]] || fail "bench checkpoint-io left files in --dir: $(ls -A "$work/disk")"

if "$tandem" bench checkpoint-io --config configs/shakespeare-char.json --dir "$work/none" \
  >"$work/out.txt" 2>&1; then
  fail "a --dir that does not exist was accepted"
fi
grep -qF -- "--dir $work/none is not a directory" "$work/out.txt" || fail "unclear refusal: $(cat "$work/out.txt")"

expect_refusal() {  # expected text, arguments...
  local expected=$1
  shift
  if python3 bench/pytorch_checkpoint_io.py "$@" >"$work/out.txt" 2>&1; then
    fail "pytorch_checkpoint_io.py $* succeeded"
  fi
  grep -qF -- "$expected" "$work/out.txt" || fail "pytorch_checkpoint_io.py $*: $(cat "$work/out.txt")"
}
expect_refusal "--dir $work/none is not a directory" --shapes "$work/io.json" --dir "$work/none"
expect_refusal "--rounds 0 is not positive" --shapes "$work/io.json" --dir "$work/disk" --rounds 0
echo '{"no": 1}' >"$work/bad.json"
expect_refusal "not the JSON of \`tandem bench checkpoint-io --json\`" --shapes "$work/bad.json" \
  --dir "$work/disk"
echo "PASSED"
