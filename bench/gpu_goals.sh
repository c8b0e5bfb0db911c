#!/usr/bin/env bash
# The whole GPU validation in one command, on one GPU, in one run (so the figures compare
# like with like): the GPU, the libraries every binary loads, the GPU tests (the NCCL
# communicator's at world size 1 among them), compute-sanitizer (racecheck and memcheck) on
# the kernel tests, then the three goals: pinned copies against plain cudaMemcpyAsync,
# device AdamW against a device-to-device copy, and GPT-2 124M training tokens/s against
# llm.c (built here from the source tools/pack_llmc.sh put in the payload, at a pinned
# commit) and the PyTorch baseline, all three on the same tokens (with their loss curves);
# and GPT-2 124M with its optimizer state offloaded: updated by the CPU, and by the CPU and
# the GPU in tandem.
#
#   bench/gpu_goals.sh [PAYLOAD_OR_BUILD_DIR] [OUT_DIR]   (defaults: gpu-payload, $OUT or
#                                                          runs/gpu-goals)
#
# PAYLOAD_OR_BUILD_DIR is what tools/pack_gpu_payload.sh made (its tandem-gpu.tar.xz is
# unpacked there), or a build directory with the binaries in it (a machine that built
# tandem itself). Run from the repository root. Writes four files into OUT_DIR (at most 8
# come back from the GPU machine): summary.txt (everything that matters, also printed at
# the end), tests.log (the tests' output and the benchmarks' messages), sanitizer.log, and
# results.json (every benchmark's JSON, by name: pcie, adamw_cuda, demo, step_tandem,
# step_llmc, step_llama, step_schedules, checkpoint, step_pytorch). Exits non-zero if
# anything failed. llm.c's source is taken from PAYLOAD_OR_BUILD_DIR/llmc (LLMC_SRC names
# another place); its build output and training log go to tests.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

from=${1:-gpu-payload}
out=${2:-${OUT:-runs/gpu-goals}}
mkdir -p "$out"
summary="$out/summary.txt"
# The benchmarks' JSON, gathered into results.json at the end: at most 8 files come back
# from the GPU machine, so the run writes four.
res=$(mktemp -d)
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
step() { echo "== $*" >&2; }
# The whole run fits one device call (10 minutes): GPU_GOALS_BUDGET seconds (default 560)
# are shared out so that a slow or hung step leaves each later step at least the time
# reserved for it. limited CAP RESERVE command...: runs command for at most CAP seconds,
# less if the budget minus RESERVE (what the later steps need) is smaller. Each step's
# RESERVE is what the steps after it need at the least; llm.c's build and run (about 30 s:
# the build took 7 s on 2 cores, its 13 steps and start-up some 20 s) added 40 s to the
# reserves of every step before it, so the tests and sanitizer, which finish well inside
# their caps, give up 40 s of slack rather than the comparison being squeezed out.
budget=${GPU_GOALS_BUDGET:-560}
limited() {
  local cap=$1 reserve=$2
  shift 2
  local left=$((budget - SECONDS - reserve))
  ((left < cap)) && cap=$left
  ((cap < 10)) && cap=10
  timeout --kill-after=5 "$cap" "$@"
}

if [[ -f $from/tandem-gpu.tar.xz ]]; then
  tar -C "$from" -xJf "$from/tandem-gpu.tar.xz" || {
    note "FAIL: cannot unpack $from/tandem-gpu.tar.xz"
    exit 1
  }
  bin="$from/bin"
  export LD_LIBRARY_PATH="$from/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  sed 's/^/payload: /' "$from/MANIFEST" | tee -a "$summary"
else
  bin="$from"
fi
# What tools/pack_gpu_payload.sh packs, and what this run needs.
binaries=(tandem test_cuda_device test_cuda_backend test_update_engine test_nccl
  test_data_parallel_gpu test_one_rank_device_communicator test_demo_cuda test_demo_rule
  test_step_plan_gpu)
for binary in "${binaries[@]}"; do
  [[ -x $bin/$binary ]] || {
    note "FAIL: $bin/$binary is missing (run tools/pack_gpu_payload.sh first)"
    exit 1
  }
done
# The test binaries find data/ and configs/ from here (tests/support/test_util.h: source_dir()).
export TANDEM_SOURCE_DIR=$PWD TANDEM_BINARY=$PWD/$bin/tandem

# CUDA 13's own libraries (cuBLASLt) come from this machine: the toolkit's, else PyTorch's.
cuda_libs=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null); do
  if compgen -G "$dir/libcublasLt.so.13*" >/dev/null; then
    cuda_libs=$dir
    break
  fi
done
if [[ -n $cuda_libs ]]; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cuda_libs"
  note "cuBLASLt from: $cuda_libs"
else
  note "WARNING: no libcublasLt.so.13 found in the CUDA toolkit or PyTorch's nvidia packages"
fi
# NCCL (loaded at run time by the nccl communicator, test_nccl here): the system's, else
# the toolkit's, else PyTorch's nvidia/nccl/lib.
nccl_lib=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / { print $NF; exit }')
if [[ -z $nccl_lib ]]; then
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null); do
    if [[ -e $dir/libnccl.so.2 ]]; then
      export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir"
      nccl_lib=$dir/libnccl.so.2
      break
    fi
  done
fi
note "NCCL from: ${nccl_lib:-nowhere (no libnccl.so.2: the NCCL tests will fail)}"

step "GPU"
note "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1)"
nvidia-smi >&2

step "libraries"
for binary in "${binaries[@]}"; do
  missing=$(ldd "$bin/$binary" 2>&1 | grep 'not found')
  if [[ -n $missing ]]; then
    note "FAIL: $binary cannot load: $(echo "$missing" | awk '{ print $1 }' | tr '\n' ' ')"
    status=1
  fi
  ldd "$bin/$binary" >&2
done

step "GPU tests"
: >"$out/tests.log"
run_tests() {  # name, cap seconds, binary, gtest args...
  local name=$1 cap=$2 binary=$3
  shift 3
  local log
  log=$(limited "$cap" 370 "$bin/$binary" "$@" 2>&1)
  local rc=$?
  echo "$log" >>"$out/tests.log"
  local passed failed skipped
  # gtest names a failed or skipped test twice (as it ends, and in the closing list).
  passed=$(grep -E '^\[       OK \] [A-Za-z]' <<<"$log" | awk '{ print $4 }' | sort -u | wc -l)
  failed=$(grep -E '^\[  FAILED  \] [A-Za-z]' <<<"$log" | awk '{ print $4 }' | sort -u | wc -l)
  skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z]' <<<"$log" | awk '{ print $4 }' | sort -u | wc -l)
  note "tests $name: $passed passed, $failed failed, $skipped skipped (exit $rc)"
  grep -E '^\[  (FAILED|SKIPPED) \] [A-Za-z]' <<<"$log" | awk '{ print "  " $2, $4 }' | sort -u |
    tee -a "$summary"
  ((rc == 0 && passed > 0 && skipped == 0)) || status=1
}
run_tests cuda_device 60 test_cuda_device
run_tests cuda_backend 180 test_cuda_backend
run_tests update_engine_cuda 60 test_update_engine --gtest_filter='*Cuda*'
# World size 1 through NCCL (NcclOnSeveralGpus needs 2 GPUs, and this machine has one).
run_tests nccl 60 test_nccl --gtest_filter='NcclOnOneGpu.*'
# Every ZeRO stage at world size 1 on the GPU (two ranks need two GPUs).
run_tests data_parallel_gpu 90 test_data_parallel_gpu --gtest_filter='*OnOneRank*'
run_tests one_rank_device_communicator 30 test_one_rank_device_communicator
# DeMo's CUDA kernels against the CPU's bits, alone and under every offload schedule.
run_tests demo_cuda 60 test_demo_cuda
run_tests demo_rule_cuda 60 test_demo_rule --gtest_filter='DemoRuleCuda.*'
# The step planner's calibration on the GPU, its plan, and an "auto" run with its choice.
run_tests step_plan_gpu 60 test_step_plan_gpu

step "compute-sanitizer"
: >"$out/sanitizer.log"
# Small shapes only: every kernel (flash attention included), fp32 and bf16.
kernel_tests='CudaBackend.Every*Kernel*:CudaBackend.Bf16Matmul*:CudaBackend.FlashAttention*'
if command -v compute-sanitizer >/dev/null; then
  for tool in racecheck memcheck; do
    limited 120 260 compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$bin/test_cuda_backend" --gtest_filter="$kernel_tests" >>"$out/sanitizer.log" 2>&1
    rc=$?
    errors=$(grep -E '^========= (ERROR SUMMARY|RACECHECK SUMMARY)' "$out/sanitizer.log" | tail -1)
    note "compute-sanitizer $tool: exit $rc, ${errors:-no summary line}"
    ((rc == 0)) || status=1
  done
else
  note "FAIL: compute-sanitizer not found"
  status=1
fi

step "pinned host <-> device copies"
# Their messages (stderr) go to tests.log beside the tests' output.
limited 45 215 "$bin/tandem" bench pcie --json >"$res/pcie.json" 2>>"$out/tests.log" || status=1

step "device AdamW vs device-to-device copy"
limited 45 170 "$bin/tandem" bench adamw --device cuda --params 1e8 --json >"$res/adamw_cuda.json" \
  2>>"$out/tests.log" || status=1

step "DeMo step: CPU and GPU"
limited 60 140 "$bin/tandem" bench demo --json >"$res/demo.json" 2>>"$out/tests.log" || status=1

# Both sides of the throughput comparison train on the same token shard.
shard=$(mktemp -d)/tinyshakespeare.bin
"$bin/tandem" tokenize --input data/tinyshakespeare.txt --output "$shard" >&2 || status=1

step "GPT-2 124M, B=16, T=1024, bf16: tandem"
# The baseline's constant learning rate (no warm-up, no decay), so that the two loss curves
# can be set side by side (their batches differ: tandem samples windows, the baseline reads
# them in order).
constant_lr=(--set scheduler.params.warmup_num_steps=0 --set scheduler.params.cos_min_ratio=1)
limited 120 140 "$bin/tandem" bench step --config configs/gpt2-124m.json \
  --set data.train_path="$shard" "${constant_lr[@]}" --warmup 3 --steps 10 --json \
  >"$res/step_tandem.json" 2>>"$out/tests.log" || status=1

step "GPT-2 124M, B=16, T=1024, bf16: llm.c"
# llm.c (karpathy/llm.c's train_gpt2cu, the source that tools/pack_llmc.sh put in the payload
# at a pinned commit) built here and trained on the same shard: tandem's shard is llm.c's
# own format (magic 20240520, version 1, uint16 tokens), and its byte-level ids (< 256) are
# valid ids of GPT-2's 50257-token vocabulary. GPT-2 124M from scratch (-e d12), B 16, T
# 1024, 13 steps (the first 3 left out of the median, as tandem's --warmup 3), the same
# AdamW as the others (lr 6e-4 constant, no warm-up, no decay; weight decay 0.1; clipping
# at 1 and betas 0.9/0.95 are llm.c's fixed values), no sampling, no checkpoints, one
# validation batch (llm.c always validates at step 0 and after the last step; outside its
# per-step timing). -r 0: no recomputation of GELU in backward, as llm.c's own GPT-2 124M
# script runs it. Built without cuDNN (its flash attention needs the cudnn-frontend headers,
# which the GPU machine lacks) and without NCCL/MPI (one GPU): llm.c's own attention kernels.
llmc_src=${LLMC_SRC:-$from/llmc}
llmc_run() {  # writes $res/step_llmc.json, or returns 1 with the reason on stdout
  local commit nvcc candidate cc work t0 build_s nvml_link=() cublas_link=() cublas_inc=()
  if [[ ! -f $llmc_src/train_gpt2.cu || ! -f $llmc_src/COMMIT ]]; then
    echo "no llm.c source in $llmc_src (pack it: tools/pack_llmc.sh $llmc_src, which needs an" \
      "llm.c mirror, or run tools/pack_gpu_payload.sh with one; LLMC_SRC names another place)"
    return 1
  fi
  commit=$(cat "$llmc_src/COMMIT")
  nvcc=$(command -v nvcc)
  for candidate in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    [[ -z $nvcc && -x $candidate ]] && nvcc=$candidate
  done
  if [[ -z $nvcc ]]; then
    echo "no nvcc on PATH or in /usr/local/cuda*/bin: llm.c is built from source here"
    return 1
  fi
  # The GPU's own architecture (H100 and H200: 90), as llm.c's Makefile asks nvidia-smi.
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [[ $cc =~ ^[0-9]+$ ]] || cc=90
  # cuBLAS(Lt) from where the CUDA libraries were found above; a directory with only the
  # versioned names (PyTorch's nvidia/cublas/lib) is linked by file name.
  if [[ -n $cuda_libs ]]; then
    cublas_link=(-L"$cuda_libs")
    if [[ -e $cuda_libs/libcublas.so && -e $cuda_libs/libcublasLt.so ]]; then
      cublas_link+=(-lcublas -lcublasLt)
    else
      cublas_link+=(-l:libcublas.so.13 -l:libcublasLt.so.13)
    fi
    # Headers from beside those libraries when nvcc's toolkit has none (PyTorch's wheels).
    if [[ ! -f $(dirname "$nvcc")/../include/cublas_v2.h && -f $cuda_libs/../include/cublas_v2.h ]]; then
      cublas_inc=(-I"$cuda_libs/../include")
    fi
  else
    cublas_link=(-lcublas -lcublasLt)
  fi
  work=$(mktemp -d)
  # llm.c uses NVML (llmc/mfu.h) whenever nvcc finds nvml.h, and then needs libnvidia-ml at
  # link time: the toolkit's stub, else the driver's own libnvidia-ml.so.1. (Its Makefile
  # always links -lnvidia-ml, which fails where the toolkit has no stub: hence nvcc here.)
  printf '#include <nvml.h>\nint main() { return 0; }\n' >"$work/nvml_probe.cu"
  if "$nvcc" -E "$work/nvml_probe.cu" -o /dev/null >/dev/null 2>&1; then
    local stub lib
    for stub in "$(dirname "$nvcc")"/../lib64/stubs "$(dirname "$nvcc")"/../targets/*/lib/stubs; do
      [[ -e $stub/libnvidia-ml.so ]] && nvml_link=(-L"$stub" -lnvidia-ml) && break
    done
    if ((${#nvml_link[@]} == 0)); then
      lib=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 / { print $NF; exit }')
      [[ -n $lib ]] && nvml_link=(-L"$(dirname "$lib")" -l:libnvidia-ml.so.1)
    fi
  fi
  # llm.c's Makefile line for train_gpt2cu with PRECISION=BF16, USE_CUDNN=0, NO_MULTI_GPU=1,
  # NO_USE_MPI=1, GPU_COMPUTE_CAPABILITY=$cc (measured on 2 cores: 7 s).
  t0=$(date +%s.%N)
  if ! (cd "$llmc_src" && limited 120 130 "$nvcc" --threads=0 --use_fast_math -std=c++17 -O3 \
    --generate-code "arch=compute_$cc,code=[compute_$cc,sm_$cc]" -DENABLE_BF16 "${cublas_inc[@]}" \
    train_gpt2.cu "${cublas_link[@]}" "${nvml_link[@]}" -o "$work/train_gpt2cu") >>"$out/tests.log" 2>&1; then
    echo "the build of $commit with $nvcc failed or ran out of time (its errors are in tests.log)"
    return 1
  fi
  build_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "llm.c $commit built in $build_s s" >&2
  # Run in an empty directory: llm.c looks for gpt2_tokenizer.bin and HellaSwag by relative
  # path and goes on without them.
  (cd "$work" && limited 60 100 ./train_gpt2cu -i "$shard" -j "$shard" -e d12 -b 16 -t 1024 \
    -x 13 -l 6e-4 -u 0 -k constant -q 1.0 -c 0.1 -r 0 -v 100000 -m 1 -s 0 -n 0 -h 0) \
    >"$work/train.log" 2>&1
  local rc=$?
  tee -a "$out/tests.log" <"$work/train.log" >&2
  python3 - "$work/train.log" "$commit" "$build_s" "$rc" >"$res/step_llmc.json" <<'PY' || {
# llm.c's line per step (train_gpt2.cu):
#   step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s
# Its tok/s is a moving average; the rate of each step is B*T over that step's ms (cudaEvent
# around forward, backward and update), and the median over steps 4 to 13 is the figure, as
# tandem and PyTorch report theirs.
import json, re, statistics, sys
log, commit, build_s, rc = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
B, T, warmup = 16, 1024, 3
step = re.compile(r"^step\s+(\d+)/(\d+) \| loss (\S+) \(.*?\| norm (\S+) \(.*?\| lr (\S+) \| "
                  r"([\d.]+) ms \| (-?[\d.]+)% \w+ MFU \| (\d+) tok/s")
steps = [m for m in map(step.match, open(log, errors="replace")) if m]
ms = [float(m[6]) for m in steps]
rates = [B * T * 1000.0 / t for t in ms[warmup:] if t > 0]
if rc != 0 or len(steps) < warmup + 1:
    tail = [l.strip() for l in open(log, errors="replace") if l.strip()][-3:]
    print("exited %d after %d steps: %s" % (rc, len(steps), " / ".join(tail)))
    sys.exit(1)
print(json.dumps({"framework": "llm.c", "commit": commit, "build_s": build_s,
                  "tokens_per_s": round(statistics.median(rates)), "step_ms": ms,
                  "losses": [float(m[3]) for m in steps], "mfu_percent": float(steps[-1][7]),
                  "ema_tok_s_reported": int(steps[-1][8]), "batch": B, "seq_len": T,
                  "warmup": warmup, "steps": len(steps) - warmup}))
PY
    # The reason (what python printed) instead of a JSON result.
    cat "$res/step_llmc.json"
    [[ -s $res/step_llmc.json ]] || echo "its output did not parse (python's error above)"
    return 1
  }
}
# A failure is a result too: its reason, in step_llmc.json, is the summary's FAIL line, and
# the run goes on.
if ! reason=$(llmc_run); then
  echo "llm.c: $reason" >&2
  python3 -c 'import json, sys; print(json.dumps({"framework": "llm.c", "error": "llm.c: " + " ".join(sys.argv[1].split())[:400]}))' \
    "$reason" >"$res/step_llmc.json"
  status=1
fi

step "Llama of GPT-2 124M's width (152M, 12 query heads on 4), B=16, T=1024, bf16: tandem"
# Llama's kernels (RMSNorm, RoPE, SwiGLU, grouped-query flash attention) at a real size.
limited 45 100 "$bin/tandem" bench step --config configs/llama-124m.json \
  --set data.train_path="$shard" "${constant_lr[@]}" --warmup 3 --steps 10 --json \
  >"$res/step_llama.json" 2>>"$out/tests.log" || status=1

step "GPT-2 124M: the state on the GPU, the update on the CPU, and CPU and GPU in tandem"
# One process (tandem bench offload), 13 subgroups of 1e7 parameters: the state on the GPU
# (device), in pinned host memory updated by the CPU (cpu, ZeRO-Offload's placement),
# interleaved with GPU updates (stride 2), or as the performance model decides (auto); one
# state digest for all four (the state on the GPU and offloaded give the same bits), and each
# schedule's predicted update time beside its measured one.
limited 180 60 "$bin/tandem" bench offload --config configs/gpt2-124m.json \
  --set data.train_path="$shard" "${constant_lr[@]}" --set zero_optimization.sub_group_size=10000000 \
  --schedules device,cpu,interleave,auto --warmup 3 --steps 10 --json \
  >"$res/step_schedules.json" 2>>"$out/tests.log" || status=1

step "GPT-2 124M checkpoints: synchronous, lazy, streamed through a bounded pool"
# 1.5 GB per checkpoint; a checkpoint every 20 steps (the last one, synchronous in both
# modes, left out), so that a lazy flush has time to finish before the next. The streamed
# mode's pool is an eighth of the state (187 MiB).
limited 210 5 "$bin/tandem" bench checkpoint --config configs/gpt2-124m.json \
  --set data.train_path="$shard" --steps 45 --interval 20 --json \
  >"$res/checkpoint.json" 2>>"$out/tests.log" || status=1

step "GPT-2 124M, B=16, T=1024, bf16: PyTorch baseline"
PYTHONUNBUFFERED=1 limited 120 5 python3 bench/pytorch_gpt2_train.py --device cuda \
  --data "$shard" --warmup 3 --steps 10 2>>"$out/tests.log" | tee -a "$out/tests.log" |
  tail -n 1 >"$res/step_pytorch.json" || status=1

step "summary"
python3 - "$res" "$out" <<'PY' | tee -a "$summary" || status=1
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
# Every result file, parsed where it parses, as results.json.
gathered = {}
for f in sorted(out.iterdir()):
    text = f.read_text()
    try:
        gathered[f.stem] = [json.loads(l) for l in text.splitlines() if l.strip()]
    except ValueError:
        gathered[f.stem] = text
(pathlib.Path(sys.argv[2]) / "results.json").write_text(json.dumps(gathered, indent=1))
def load(name):
    try:
        return json.loads((out / name).read_text().strip().splitlines()[-1])
    except Exception as e:  # the step above failed and said why, in tests.log
        return {"error": f"{name}: no result ({e}); see tests.log"}
pcie, adamw, demo = load("pcie.json"), load("adamw_cuda.json"), load("demo.json")
ckpt = load("checkpoint.json")
ours, torch = load("step_tandem.json"), load("step_pytorch.json")
llmc = load("step_llmc.json")
llama = load("step_llama.json")
offload = load("step_schedules.json")
schedules = [r for r in offload.get("runs", []) if "error" not in r]
for r in (pcie, adamw, demo, ours, llmc, llama, torch, ckpt, offload):
    if "error" in r:
        print("FAIL:", r["error"])
print("pinned copies GB/s: h2d %s, d2h %s, both %s" % (
    pcie.get("h2d_gb_per_s"), pcie.get("d2h_gb_per_s"), pcie.get("both_gb_per_s")))
print("  / plain cudaMemcpyAsync: h2d %s, d2h %s (goal >= 0.85)" % (
    pcie.get("h2d_ratio"), pcie.get("d2h_ratio")))
print("device AdamW: %s GB/s; device copy %s GB/s; ratio %s (goal >= 0.85)" % (
    adamw.get("gb_per_s"), adamw.get("copy_gb_per_s"), adamw.get("ratio")))
gpu = demo.get("gpu") or {}
print("DeMo step: CPU %s M params/s (%s threads, DCT/sgemm %s); GPU %s M params/s = %sx the CPU"
      % (round(demo.get("params_per_s", 0) / 1e6, 1), demo.get("threads"),
         demo.get("dct_to_sgemm"), round(gpu.get("params_per_s", 0) / 1e6, 1),
         gpu.get("gpu_to_cpu")))
if demo and "error" not in demo and not gpu:
    print("FAIL: tandem bench demo found no GPU")
for mode in ("synchronous", "lazy", "streamed"):
    m = ckpt.get(mode) or {}
    print("checkpoint %s: step %s ms, stall %s ms (max %s), flush %s ms, stall/step %s, flush fits %s%s"
          % (mode, m.get("step_ms"), m.get("stall_ms_mean"), m.get("stall_ms_max"),
             m.get("flush_ms_mean"), m.get("stall_per_step"), m.get("flush_fits"),
             " (goal <= 0.05 where the flush fits)" if mode == "lazy" else
             " (pool %s bytes)" % m.get("pool_bytes") if mode == "streamed" else ""))
t, p, c = ours.get("tokens_per_s"), torch.get("tokens_per_s"), llmc.get("tokens_per_s")
ratio = lambda a, b: "%.3f" % (a / b) if a and b else None
print("GPT-2 124M tokens/s: tandem %s, llm.c %s, PyTorch %s; tandem/llm.c %s (goal >= 1.0),"
      " tandem/PyTorch %s (goal >= 1)" % (t, c, p, ratio(t, c), ratio(t, p)))
print("  tandem fwd %s, bwd %s, update %s ms; llm.c %s (no cuDNN), built in %s s, median step %s ms"
      % (ours.get("forward_ms"), ours.get("backward_ms"), ours.get("update_ms"),
         (llmc.get("commit") or "?")[:12], llmc.get("build_s"),
         "%.1f" % (16 * 1024 * 1000 / c) if c else None))
fmt = lambda losses: " ".join("%.2f" % l for l in losses or [])
print("  losses, tandem:  ", fmt(ours.get("losses")))
print("  losses, llm.c:   ", fmt(llmc.get("losses")))
print("  losses, PyTorch: ", fmt(torch.get("losses")))
if ours.get("losses") and torch.get("losses"):
    a, b = ours["losses"][-1], torch["losses"][-1]
    # Different batches, same model and learning rate: the curves must descend alike.
    if not (a < 0.6 * ours["losses"][0] and a < 1.15 * b):
        print("FAIL: tandem's last loss %.3f does not descend like the baseline's %.3f" % (a, b))
lt = llama.get("tokens_per_s")
print("Llama 152M (GQA 12/4) tokens/s: %s (fwd %s, bwd %s, update %s ms); / GPT-2 124M's %s"
      % (lt, llama.get("forward_ms"), llama.get("backward_ms"), llama.get("update_ms"),
         "%.3f" % (lt / t) if lt and t else None))
print("  losses, Llama:   ", fmt(llama.get("losses")))
if llama.get("losses") and not llama["losses"][-1] < llama["losses"][0]:
    print("FAIL: the Llama's loss does not descend: %s" % fmt(llama["losses"]))
device = next((r for r in schedules if r["schedule"] == "device"), {})
for r in offload.get("runs", []):
    if "error" in r:
        print("FAIL: schedule %s did not run: %s" % (r["schedule"], r["error"]))
        continue
    print("schedule %-10s tokens/s %.0f, update %.1f ms, predicted %.1f ms (pred/meas %.3f);"
          " / device tokens/s %s; plan %d host, %d resident, %d staged"
          % (r["schedule"], r["tokens_per_s"], r["update_ms"], r["predicted_update_ms"],
             r["predicted_to_measured"],
             "%.3f" % (r["tokens_per_s"] / device["tokens_per_s"]) if device else None,
             r["host_subgroups"], r["resident_subgroups"], r["staged_subgroups"]))
if schedules:
    print("  state digests: %s" % ("one for the state on the GPU and every offloaded schedule (%s)"
                                   % schedules[0]["state_digest"] if offload.get("digests_agree")
                                   else "DIFFER"))
    if not offload.get("digests_agree"):
        print("FAIL: the schedules ended with different state digests")
    print("  auto's update / the fastest fixed schedule's: %.3f (goal <= 1.05)"
          % offload.get("auto_to_best_fixed_update", 0))
PY
note "gpu_goals: $([[ $status == 0 ]] && echo 'everything passed' || echo 'SOMETHING FAILED (see above)') in ${SECONDS} s"
exit $status
