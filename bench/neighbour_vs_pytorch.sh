#!/usr/bin/env bash
# tandem's CPU training step beside a neighbour, against PyTorch's (torch.compile) beside the
# same neighbour (issue 44, item 7). A training job shares its machine with data loaders,
# monitoring and other jobs; here the neighbour is one busy loop, bound to the last allowed
# CPU ("pinned", the default) or free to move ("free"). Each round runs every side once
# with the neighbour and once without, the sides alternating, and the medians give:
#
#   with the neighbour    tandem / torch.compile   (goal >= 0.9)
#   quiet                 tandem / torch.compile   (as bench/gpt2_cpu_vs_pytorch.sh)
#   with OLD_TANDEM set   tandem / that binary, quiet and with the neighbour
#                         (an older build: "no worse than before on a quiet machine")
#
#   bench/neighbour_vs_pytorch.sh [BUILD_DIR] [ROUNDS] [OLD_TANDEM]   (defaults: build, 3)
#   NEIGHBOUR=free bench/neighbour_vs_pytorch.sh ...
#
# Sizes: configs/shakespeare-char.json (0.84 M parameters, B 16, T 128) and the same GPT at
# n_layer 6, n_embd 384 (10.8 M). fp32, threads = nproc on both sides. torch.compile's
# first steps compile: they are its warm-up. Needs python3 with torch and a C++ compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
old=${3:-}
mode=${NEIGHBOUR:-pinned}
threads=$(nproc)
python3 -c "import torch" 2>/dev/null || { echo "needs python3 with torch: pip install torch" >&2; exit 2; }
[[ -x $build/tandem ]] || { echo "no $build/tandem: build it first (cmake --build $build)" >&2; exit 2; }
[[ -z $old || -x $old ]] || { echo "OLD_TANDEM '$old' is not an executable" >&2; exit 2; }
[[ $mode == pinned || $mode == free ]] || { echo "NEIGHBOUR must be pinned or free, not '$mode'" >&2; exit 2; }
work=$(mktemp -d)
neighbour_pid=
stop_neighbour() {
  if [[ -n $neighbour_pid ]]; then
    kill "$neighbour_pid" 2>/dev/null || true
    wait "$neighbour_pid" 2>/dev/null || true
    neighbour_pid=
  fi
}
trap 'stop_neighbour; rm -rf "$work"' EXIT

start_neighbour() {
  local cpu
  cpu=$(python3 -c "import os; print(max(os.sched_getaffinity(0)))")
  if [[ $mode == pinned ]]; then
    taskset -c "$cpu" sh -c 'while :; do :; done' &
  else
    sh -c 'while :; do :; done' &
  fi
  neighbour_pid=$!
  sleep 0.2
}

source bench/side_by_side.sh
sized configs/shakespeare-char.json "$work/small.json"
sized configs/shakespeare-char.json "$work/medium.json" model.n_layer=6 model.n_embd=384

tandem_step() {  # binary, config
  "$1" bench step --config "$2" --warmup 3 --steps 10 --json 2>/dev/null | last_field tokens_per_s
}
compiled_step() {  # config
  python3 bench/pytorch_gpt2_train.py --device cpu --config "$1" --precision fp32 \
    --threads "$threads" --compile --warmup 5 --steps 10 2>/dev/null | last_field tokens_per_s
}
ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }

echo "$("$build/tandem" --version) vs torch $(python3 -c 'import torch; print(torch.__version__)'), fp32, $threads threads, $rounds rounds, neighbour: one busy loop ($mode)"
for size in small medium; do
  declare -A runs=()
  for ((r = 0; r < rounds; r++)); do
    for load in quiet neighbour; do
      [[ $load == neighbour ]] && start_neighbour
      runs[tandem_$load]+=" $(tandem_step "$build/tandem" "$work/$size.json")"
      [[ -n $old ]] && runs[old_$load]+=" $(tandem_step "$old" "$work/$size.json")"
      runs[compile_$load]+=" $(compiled_step "$work/$size.json")"
      stop_neighbour
    done
  done
  for load in neighbour quiet; do
    # shellcheck disable=SC2086
    t=$(median ${runs[tandem_$load]}) c=$(median ${runs[compile_$load]})
    printf '%-7s %-9s tandem %7.0f tok/s  torch.compile %7.0f  (ratio %s%s)' "$size" "$load" "$t" "$c" \
      "$(ratio "$t" "$c")" "$([[ $load == neighbour ]] && echo '; goal >= 0.9')"
    if [[ -n $old ]]; then
      # shellcheck disable=SC2086
      o=$(median ${runs[old_$load]})
      printf '  old tandem %7.0f (new / old %s)' "$o" "$(ratio "$t" "$o")"
    fi
    echo
    # shellcheck disable=SC2086
    echo "        rounds: tandem$(printf ' %.0f' ${runs[tandem_$load]}); compile$(printf ' %.0f' ${runs[compile_$load]})$([[ -n $old ]] && printf '; old'; [[ -n $old ]] && printf ' %.0f' ${runs[old_$load]})"
  done
  unset runs
done
