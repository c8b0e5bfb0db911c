#!/usr/bin/env bash
# tools/plot_runs.py on two small metrics files (one rank, and two ranks that sent bytes):
# the three PNGs are written and are PNGs; a missing file and a file that is not metrics
# are one-line errors. Skips (exit 77, saying why) only where no Python has matplotlib;
# `make deps` installs Debian's python3-matplotlib, so CI runs it.
set -euo pipefail
source_dir="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" > /dev/null && "$candidate" -c "import matplotlib" 2> /dev/null; then
    python="$candidate"
    break
  fi
done
if [ -z "$python" ]; then
  echo "SKIPPED: no python3 with matplotlib (pip install matplotlib, or apt-get install python3-matplotlib)"
  exit 77
fi

mkdir -p "$work/adamw" "$work/demo"
for step in 1 2 3 4 5; do
  loss=$(awk "BEGIN { print 4.0 / $step }")
  echo "{\"step\": $step, \"loss\": $loss, \"tokens_per_s\": 1000, \"comm_bytes_sent\": 8000000}" >> "$work/adamw/metrics.jsonl"
  echo "{\"step\": $step, \"loss\": $loss, \"tokens_per_s\": 1100, \"comm_bytes_sent\": 100000}" >> "$work/demo/metrics.jsonl"
done
echo '{"step": 5, "val_loss": 1.1}' >> "$work/adamw/metrics.jsonl"

"$python" "$source_dir/tools/plot_runs.py" "$work/adamw/metrics.jsonl" "DeMo=$work/demo/metrics.jsonl" --out "$work/plots"
for png in loss loss_vs_bytes tokens_per_s; do
  file="$work/plots/$png.png"
  [ -s "$file" ] || { echo "FAILED: $file not written"; exit 1; }
  [ "$(head -c 8 "$file" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || { echo "FAILED: $file is not a PNG"; exit 1; }
done

# Bad input: one line naming the file.
if out=$("$python" "$source_dir/tools/plot_runs.py" "$work/nothing.jsonl" --out "$work/p2" 2>&1); then
  echo "FAILED: a missing file was accepted"; exit 1
fi
echo "$out" | grep -q "nothing.jsonl: no such metrics file" || { echo "FAILED: $out"; exit 1; }
echo "not json" > "$work/bad.jsonl"
if out=$("$python" "$source_dir/tools/plot_runs.py" "$work/bad.jsonl" --out "$work/p3" 2>&1); then
  echo "FAILED: a file that is not metrics was accepted"; exit 1
fi
echo "$out" | grep -q "bad.jsonl:1: not a JSON line" || { echo "FAILED: $out"; exit 1; }
echo "plot_runs: ok"
