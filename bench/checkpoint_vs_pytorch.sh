#!/usr/bin/env bash
# tandem's checkpoint I/O against PyTorch's on the same arrays, in the same directory, in one
# run: `tandem bench checkpoint-io` (a run's synchronous save: files, checksums, fsync,
# renames; the read into arrays, checksums verified; and a resume's stream of the files into
# a new update engine) and bench/pytorch_checkpoint_io.py (torch.save of {"model",
# "optimizer"} + flush + fsync; torch.load, which both reads are set against), ROUNDS rounds
# each, the two sides alternating, the median of each side. ratio = PyTorch ms / tandem ms: above 1,
# tandem is the faster (the machines are shared and noisy: one run's ratios, not absolute
# figures).
#
#   bench/checkpoint_vs_pytorch.sh [BUILD_DIR] [ROUNDS] [DIR]   (defaults: build, 5, runs/)
#
# DIR: where both sides write (an existing directory on the disk to measure). Sizes:
# configs/shakespeare-char.json (0.84 M parameters) and the same GPT at n_layer 6, n_embd 384
# (10.8 M parameters, a 130 MB checkpoint). Needs python3 with torch.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
dir=${3:-runs}
python3 -c "import torch" 2>/dev/null || { echo "needs python3 with torch: pip install torch" >&2; exit 2; }
[[ -x $build/tandem ]] || { echo "no $build/tandem: build it first (cmake --build $build)" >&2; exit 2; }
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

source bench/side_by_side.sh
field() { last_field "$2" <"$1"; }

echo "$("$build/tandem" --version) vs torch $(python3 -c 'import torch; print(torch.__version__, torch.get_num_threads(), "threads")'), in $dir, $rounds rounds"
declare -A sets=([0.84M]="" [10.8M]="--set model.n_layer=6 --set model.n_embd=384")
for size in 0.84M 10.8M; do
  ours_save=() ours_load=() ours_resume=() theirs_save=() theirs_load=()
  for ((r = 0; r < rounds; r++)); do
    # shellcheck disable=SC2086
    "$build/tandem" bench checkpoint-io --config configs/shakespeare-char.json ${sets[$size]} \
      --dir "$dir" --rounds 1 --json >"$work/tandem.json"
    python3 bench/pytorch_checkpoint_io.py --shapes "$work/tandem.json" --dir "$dir" --rounds 1 \
      >"$work/torch.json"
    ours_save+=("$(field "$work/tandem.json" save_ms_median)")
    ours_load+=("$(field "$work/tandem.json" load_ms_median)")
    ours_resume+=("$(field "$work/tandem.json" resume_ms_median)")
    theirs_save+=("$(field "$work/torch.json" save_ms_median)")
    theirs_load+=("$(field "$work/torch.json" load_ms_median)")
  done
  mb_ours=$(python3 -c "print(round($(field "$work/tandem.json" checkpoint_bytes) / 1e6, 1))")
  mb_theirs=$(python3 -c "print(round($(field "$work/torch.json" checkpoint_bytes) / 1e6, 1))")
  for what in save load resume; do
    ours_name="ours_$what[@]" theirs_name="theirs_${what/resume/load}[@]"
    t=$(median "${!ours_name}") p=$(median "${!theirs_name}")
    printf '%-6s %-6s tandem %8.1f ms (%s MB)  PyTorch %8.1f ms (%s MB)  ratio %.3f\n' "$size" \
      "$what" "$t" "$mb_ours" "$p" "$mb_theirs" "$(python3 -c "print($p / $t)")"
  done
done
