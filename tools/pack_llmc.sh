#!/usr/bin/env bash
# Copies the source of llm.c's GPT-2 trainer (karpathy/llm.c: train_gpt2.cu, llmc/, its
# Makefile and LICENSE) at one pinned commit into DEST, so that bench/gpu_goals.sh can
# build train_gpt2cu on the GPU machine (which has nvcc but no network) and measure it on
# the same tokens as tandem. llm.c's code is never committed here: it is copied from a local
# mirror of the repository each time the payload is packed.
#
#   tools/pack_llmc.sh [DEST]          (default: gpu-payload/llmc)
#
# The mirror is a bare git directory: LLMC_MIRROR if set, else the first
# /work/.mirror/karpathy+llm.c*/repo (what the agents' `fetch github:karpathy/llm.c` makes),
# else ../llm.c/.git or a `git clone --bare https://github.com/karpathy/llm.c` anywhere,
# named by LLMC_MIRROR. Writes DEST/COMMIT (the pinned sha) and DEST/PATCHES (the one change
# made for CUDA 13, below) beside the files. Exits 2, saying how to get a mirror, when there
# is none (tools/pack_gpu_payload.sh then goes on without llm.c), and 1 on any other failure
# (a mirror without the pinned commit, a patch that no longer applies).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# The newest commit of llm.c's master when this was pinned (2025-05-10, "Merge pull request
# #801 from ngc92/ngc92/fix-test"). A pinned commit keeps the comparison the same from run
# to run; move it on deliberately (and re-run bench/gpu_goals.sh) rather than by accident.
llmc_commit=f1e2ace651495b74ae22d45d1723443fd00ecd3a
# What building train_gpt2cu needs (train_gpt2.cu includes llmc/ only; dev/unistd.h is
# Windows' glob), and the licence (MIT) that must travel with the copy.
llmc_paths=(train_gpt2.cu llmc Makefile LICENSE)

dest=${1:-gpu-payload/llmc}

mirror=${LLMC_MIRROR:-}
if [[ -z $mirror ]]; then
  for candidate in /work/.mirror/karpathy+llm.c*/repo /work/.mirror/karpathy+llm.c* ../llm.c/.git; do
    if git --git-dir="$candidate" rev-parse --git-dir >/dev/null 2>&1; then
      mirror=$candidate
      break
    fi
  done
fi
how_to_get="get one with \`git clone --bare https://github.com/karpathy/llm.c /somewhere/llm.c.git\`"
how_to_get+=" and point LLMC_MIRROR at it"
if [[ -z $mirror ]]; then
  echo "pack_llmc: no llm.c mirror found (LLMC_MIRROR unset, nothing in /work/.mirror/karpathy+llm.c*);" \
    "$how_to_get" >&2
  exit 2
fi
if ! git --git-dir="$mirror" rev-parse --git-dir >/dev/null 2>&1; then
  echo "pack_llmc: LLMC_MIRROR=$mirror is not a git directory; $how_to_get" >&2
  exit 1
fi
if ! git --git-dir="$mirror" cat-file -e "$llmc_commit^{commit}" 2>/dev/null; then
  echo "pack_llmc: the llm.c mirror $mirror lacks the pinned commit $llmc_commit;" \
    "update it (git --git-dir=$mirror fetch origin) or $how_to_get" >&2
  exit 1
fi

# A fresh copy each time: files of an older pin must not linger beside the new ones.
rm -rf "$dest"
mkdir -p "$dest"
if ! git --git-dir="$mirror" archive "$llmc_commit" "${llmc_paths[@]}" | tar -x -C "$dest"; then
  echo "pack_llmc: git archive of ${llmc_paths[*]} at $llmc_commit from $mirror failed" \
    "(a path renamed upstream? see git --git-dir=$mirror ls-tree $llmc_commit)" >&2
  rm -rf "$dest"
  exit 1
fi
# llm.c at this commit does not compile with CUDA 13 (the GPU machine's): cudaMemAdvise
# takes a cudaMemLocation there, not a device id. The one call (the fallback to managed
# memory when cudaMalloc runs out, never taken at GPT-2 124M on an H100) gets the CUDA 13
# form, CUDA 12's kept behind CUDART_VERSION; nothing else is changed. PATCHES lists it.
if ! command -v patch >/dev/null; then
  echo "pack_llmc: the patch program is missing (apt-get install patch)" >&2
  exit 1
fi
if ! patch -p1 -d "$dest" --forward --quiet <<'DIFF'; then
--- a/llmc/cuda_utils.cuh
+++ b/llmc/cuda_utils.cuh
@@ -217,7 +217,14 @@
         // if we OOM, fallback to a managed allocation. slower but at least won't crash.
         cudaGetLastError(); // reset the error before the next API call
         cudaCheck_(cudaMallocManaged(out, bytes), file, line);
+#if CUDART_VERSION >= 13000
+        // CUDA 13 takes a cudaMemLocation where CUDA 12 took a device id
+        cudaMemLocation host_location = {};
+        host_location.type = cudaMemLocationTypeHost;
+        cudaCheck_(cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, host_location), file, line);
+#else
         cudaCheck_(cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), file, line);
+#endif
         return 1;
     } else {
         cudaCheck_(err, file, line);
DIFF
  echo "pack_llmc: the CUDA 13 patch of llmc/cuda_utils.cuh no longer applies at $llmc_commit;" \
    "re-make it against the new commit (or drop it if upstream fixed cudaMemAdvise)" >&2
  rm -rf "$dest"
  exit 1
fi
echo "cuda13-memadvise: llmc/cuda_utils.cuh, cudaMemAdvise with a cudaMemLocation (tools/pack_llmc.sh)" \
  >"$dest/PATCHES"
echo "$llmc_commit" >"$dest/COMMIT"
echo "pack_llmc: llm.c $llmc_commit (${llmc_paths[*]}) from $mirror into $dest:" \
  "$(du -sb "$dest" | cut -f1) bytes"
