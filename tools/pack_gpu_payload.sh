#!/usr/bin/env bash
# Packs what the GPU machine needs to run tandem's GPU validation (bench/gpu_goals.sh) into
# one small archive, because that machine has no package registries and none of tandem's
# build dependencies, and at most 64 MiB may travel to it (the working tree plus what is
# carried). The archive holds:
#   bin/  tandem and the GPU test binaries, stripped, built for sm_90 (H100/H200) only;
#   lib/  the shared libraries they load that the GPU machine lacks (OpenBLAS, gfortran,
#         quadmath, gomp, xxHash). Left out: the C/C++ runtime (the GPU machine's is newer
#         than this Debian 12's), the driver, and the CUDA libraries (cuBLASLt, and NCCL,
#         which only test_nccl loads, at run time): the GPU machine has CUDA 13 itself, and
#         bench/gpu_goals.sh puts its toolkit's or PyTorch's copy on LD_LIBRARY_PATH.
# Beside the archive, in DEST:
#   llmc/    llm.c's GPT-2 trainer source at a pinned commit (tools/pack_llmc.sh, from a
#            local mirror of karpathy/llm.c), which bench/gpu_goals.sh builds and runs as
#            the comparison; skipped with a note where there is no mirror (CI);
#   wheels/  the DeepSpeed wheel set, made by tools/pack_deepspeed_wheels.sh where that
#            script exists (not with TANDEM_PACK_NO_BUILD=1).
# It prints the archive's size, the working tree's, llmc/'s and wheels/' (llmc/ as a fixed
# estimate where it was not packed, so the check counts what a real payload carries), and
# their sum against the limit, and fails when the sum is over it.
#
#   tools/pack_gpu_payload.sh [BUILD_DIR] [DEST]     (defaults: build-gpu, gpu-payload)
#
# BUILD_DIR is configured (Release, CUDA architecture 90, no Google Benchmark programs) if
# it has no CMakeCache.txt yet, and the binaries are built in it. DEST is ignored by git:
# carry it (run's `carry: ["gpu-payload"]`), then on the GPU machine run
# `bench/gpu_goals.sh gpu-payload`.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
dest=${2:-gpu-payload}
limit_bytes=$((64 * 1024 * 1024))
binaries=(tandem test_cuda_device test_cuda_backend test_update_engine test_nccl test_data_parallel_gpu
  test_one_rank_device_communicator test_demo_cuda test_demo_rule test_step_plan_gpu)

# TANDEM_PACK_NO_BUILD=1: pack what BUILD_DIR holds, building nothing (the size test does).
if [[ ${TANDEM_PACK_NO_BUILD:-0} != 1 && ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTANDEM_BUILD_BENCH=OFF
fi
if ! compgen -G "$build/CMakeFiles/*/CMakeCUDACompiler.cmake" >/dev/null; then
  echo "pack_gpu_payload: $build was configured without CUDA (no nvcc found); install the CUDA" \
    "toolkit, or configure it with -DCMAKE_CUDA_COMPILER=/path/to/nvcc" >&2
  exit 1
fi
if [[ ${TANDEM_PACK_NO_BUILD:-0} != 1 ]]; then
  cmake --build "$build" -j "$(nproc)" --target "${binaries[@]}"
fi

# llm.c's source (a third of a MiB): packed wherever a mirror of llm.c is found. Without one
# (CI, which cannot reach GitHub) the step is skipped with a note, and the size check below
# counts llmc_estimate_bytes instead: 325,551 bytes measured at the pinned commit (sources,
# LICENSE, COMMIT, PATCHES), rounded up to 512 KiB.
llmc_estimate_bytes=$((512 * 1024))
llmc_rc=0
bash tools/pack_llmc.sh "$dest/llmc" || llmc_rc=$?
if ((llmc_rc == 2)); then
  if [[ ${TANDEM_PACK_NO_BUILD:-0} == 1 ]]; then
    echo "pack_gpu_payload: note: no llm.c mirror, so no llm.c source packed (counted as" \
      "$llmc_estimate_bytes bytes below)" >&2
  elif [[ -f $dest/llmc/COMMIT ]]; then
    echo "pack_gpu_payload: WARNING: no llm.c mirror: keeping the llm.c copy already in" \
      "$dest/llmc (commit $(cat "$dest/llmc/COMMIT"))" >&2
  else
    echo "pack_gpu_payload: WARNING: no llm.c mirror: this payload has no llm.c, and" \
      "bench/gpu_goals.sh will report the llm.c comparison as FAIL (see the message above)" >&2
  fi
elif ((llmc_rc != 0)); then
  exit "$llmc_rc"
fi
# The DeepSpeed wheels, made by their own script where it exists (it builds, so not with
# TANDEM_PACK_NO_BUILD=1; what an earlier run left in $dest/wheels is still counted).
if [[ ${TANDEM_PACK_NO_BUILD:-0} != 1 && -f tools/pack_deepspeed_wheels.sh ]]; then
  bash tools/pack_deepspeed_wheels.sh "$dest/wheels"
fi

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/bin" "$staging/lib"
for binary in "${binaries[@]}"; do
  strip -o "$staging/bin/$binary" "$build/$binary"
done
# Every library the binaries load, except what the GPU machine has (see the top).
for binary in "${binaries[@]}"; do
  ldd "$build/$binary" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux*) continue ;;
    libstdc++.so* | libgcc_s.so*) continue ;;
    libcuda.so* | libnvidia*) continue ;;
    libcublas* | libcudart* | libnccl* | libcudnn*) continue ;;
  esac
  cp -L "$lib" "$staging/lib/"
  strip --strip-unneeded "$staging/lib/$(basename "$lib")" 2>/dev/null || true
done
{
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    source_version="$(git rev-parse --short HEAD)$(git diff --quiet || echo '+uncommitted')"
  else
    source_version="a tree without git history"
  fi
  echo "tandem GPU payload, made $(date -u +%Y-%m-%dT%H:%MZ) from $source_version"
  echo "built on: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  arch=$(grep -h "^CMAKE_CUDA_ARCHITECTURES" "$build/CMakeCache.txt" | cut -d= -f2 || true)
  echo "CUDA architectures: ${arch:-the CMakeLists.txt default (80 90)}"
  echo "binaries: ${binaries[*]}"
  echo "libraries: $(cd "$staging/lib" && ls | tr '\n' ' ')"
  if [[ -f $dest/llmc/COMMIT ]]; then
    echo "llm.c: $(cat "$dest/llmc/COMMIT") (llmc/, patched: $(cut -d: -f1 "$dest/llmc/PATCHES" 2>/dev/null | paste -sd " "))"
  else
    echo "llm.c: not packed (no mirror of karpathy/llm.c; see tools/pack_llmc.sh)"
  fi
} >"$staging/MANIFEST"

mkdir -p "$dest"
# Only the archive travels: what an earlier unpacking left there would travel too.
rm -rf "$dest"/tandem-gpu.tar.xz "$dest"/MANIFEST "$dest"/bin "$dest"/lib
tar -C "$staging" -cf - MANIFEST bin lib | xz -6 -T "$(nproc)" >"$dest/tandem-gpu.tar.xz"

listed=$(tar -tJf "$dest/tandem-gpu.tar.xz" | grep -c '^bin/.')
if ((listed != ${#binaries[@]})); then
  echo "pack_gpu_payload: $dest/tandem-gpu.tar.xz lists $listed binaries, not ${#binaries[@]}" >&2
  exit 1
fi
payload=$(stat -c %s "$dest/tandem-gpu.tar.xz")
# What else travels: tracked files and untracked ones git does not ignore (without git:
# everything but build directories, an overestimate).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
else
  tree=$(du -sb --exclude='./build*' --exclude="./$dest" . | cut -f1)
fi
# What travels beside the archive: llmc/ and wheels/ (each, where it was not made, its
# estimate).
if [[ -d $dest/llmc ]]; then
  llmc_bytes=$(du -sb "$dest/llmc" | cut -f1)
  llmc_what="llmc/"
else
  llmc_bytes=$llmc_estimate_bytes
  llmc_what="llmc/ (not packed; estimated)"
fi
# The wheel set where it was made; else (CI's size check, which builds nothing) its
# estimate: 5,056,305 bytes measured for DeepSpeed 0.19.8 and its six dependencies
# (tools/pack_deepspeed_wheels.sh), rounded up to 6 MiB.
wheels_estimate_bytes=$((6 * 1024 * 1024))
if compgen -G "$dest/wheels/*.whl" >/dev/null; then
  wheels_bytes=$(du -sb "$dest/wheels" | cut -f1)
  wheels_what="wheels/"
else
  wheels_bytes=$wheels_estimate_bytes
  wheels_what="wheels/ (not made; estimated)"
fi
total=$((payload + tree + llmc_bytes + wheels_bytes))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
cat "$staging/MANIFEST"
echo "unpacked: $(mib "$(du -sb "$staging" | cut -f1)")"
echo "payload $dest/tandem-gpu.tar.xz: $(mib "$payload"); working tree: $(mib "$tree");" \
  "$llmc_what: $(mib "$llmc_bytes"); $wheels_what: $(mib "$wheels_bytes");" \
  "together $(mib "$total") of the $(mib "$limit_bytes") that may travel"
if ((total > limit_bytes)); then
  echo "pack_gpu_payload: over the limit by $(mib $((total - limit_bytes))); leave a binary out," \
    "build for fewer CUDA architectures, or carry fewer wheels" >&2
  exit 1
fi
