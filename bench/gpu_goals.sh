#!/usr/bin/env bash
# Every GPU goal of the CUDA backend in one command, on one GPU, in one run (so the
# figures compare like with like): the GPU tests, pinned copies, device AdamW against a
# device-to-device copy, and GPT-2 124M training tokens/s against the PyTorch baseline.
#
#   bench/gpu_goals.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, $OUT or runs/gpu-goals)
#
# BUILD_DIR holds a Release build with CUDA (make build). Shared libraries the GPU
# machine lacks can be put in BUILD_DIR/device-libs (tools/pack_device_libs.sh does).
# Prints a summary; every raw result stays in OUT_DIR.
set -uo pipefail

build=${1:-build}
out=${2:-${OUT:-runs/gpu-goals}}
mkdir -p "$out"
if [[ -d $build/device-libs ]]; then
  export LD_LIBRARY_PATH="$build/device-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
status=0
step() { echo "== $*" >&2; }

step "GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

step "GPU tests"
for test in test_cuda_device test_cuda_backend; do
  "$build/$test" 2>&1 | tee "$out/$test.txt" | grep -E '^\[ +(OK|FAILED|SKIPPED) ' || status=1
done
"$build/test_update_engine" --gtest_filter='*Cuda*' 2>&1 | tee "$out/test_update_engine_cuda.txt" |
  grep -E '^\[ +(OK|FAILED|SKIPPED) ' || status=1

step "pinned host <-> device copies"
"$build/tandem" bench pcie --json | tee "$out/pcie.json" || status=1

step "device AdamW vs device-to-device copy"
"$build/tandem" bench adamw --device cuda --params 1e8 --json | tee "$out/adamw_cuda.json" ||
  status=1

step "GPT-2 124M, B=16, T=1024, bf16: tandem"
"$build/tandem" bench step --config configs/gpt2-124m.json --warmup 3 --steps 10 --json |
  tee "$out/step_tandem.json" || status=1

step "GPT-2 124M, B=16, T=1024, bf16: PyTorch baseline"
python3 bench/pytorch_gpt2_train.py --device cuda --warmup 3 --steps 10 |
  tail -n 1 | tee "$out/step_pytorch.json" || status=1

step "summary"
python3 - "$out" <<'PY' || status=1
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text().strip().splitlines()[-1])
    except Exception as e:  # a failed step above already said why
        return {"error": str(e)}
pcie, adamw = load("pcie.json"), load("adamw_cuda.json")
ours, torch = load("step_tandem.json"), load("step_pytorch.json")
print("pinned copies GB/s: h2d %s, d2h %s, both %s" % (
    pcie.get("h2d_gb_per_s"), pcie.get("d2h_gb_per_s"), pcie.get("both_gb_per_s")))
print("  vs plain cudaMemcpyAsync: h2d ratio %s, d2h ratio %s (goal >= 0.85)" % (
    pcie.get("h2d_ratio"), pcie.get("d2h_ratio")))
print("device AdamW: %s GB/s, device copy %s GB/s, ratio %s (goal >= 0.85)" % (
    adamw.get("gb_per_s"), adamw.get("copy_gb_per_s"), adamw.get("ratio")))
t, p = ours.get("tokens_per_s"), torch.get("tokens_per_s")
ratio = t / p if t and p else None
print("GPT-2 124M tokens/s: tandem %s, PyTorch %s, ratio %s (goal >= 1)" % (t, p, ratio))
PY
exit $status
