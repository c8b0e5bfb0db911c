# Helpers for the scripts that set tandem beside PyTorch (bench/*_vs_pytorch.sh), sourced by
# them: a config with overrides for both sides, a field of a side's last JSON line, a median.

# sized BASE OUT key=value...: a copy of config BASE with dotted-key overrides (JSON values).
sized() {
  local base=$1 out=$2
  shift 2
  python3 - "$base" "$out" "$@" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
for item in sys.argv[3:]:
    key, value = item.split("=", 1)
    *path, last = key.split(".")
    node = config
    for part in path:
        node = node.setdefault(part, {})
    node[last] = json.loads(value)
json.dump(config, open(sys.argv[2], "w"))
PY
}

# last_field KEY: KEY of the last JSON line on stdin (a benchmark's result).
last_field() {
  python3 -c "import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])" "$1"
}

# median VALUES...: their median (of an even count, the mean of the middle two).
median() {
  printf '%s\n' "$@" | sort -g |
    awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
