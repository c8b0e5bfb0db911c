#!/usr/bin/env bash
# Every command block of README.md still parses (issue 29): tools/readme_commands.py check
# finds every file, make target, option and config key the README's commands name, and it
# does fail, naming the problem, on a README with one wrong name of each kind.
#   readme_commands_test.sh SOURCE_DIR TANDEM
set -euo pipefail
src=$1 tandem=$2
cd "$src"
python3 tools/readme_commands.py check --tandem "$tandem" README.md

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cat > "$scratch/README.md" <<'MD'
```sh
make demoo
build/tandem train --config configs/shakespeare-char.json --set train.stepz=3 --metric x
build/tandem plan --config configs/nope.json
tools/demo_vs_adamw.sh --rankz 2
```
```text
build/tandem sample --checkpoint DIR [--promptx TEXT]
```
MD
if python3 tools/readme_commands.py check --tandem "$tandem" "$scratch/README.md" > "$scratch/out" 2>&1; then
  cat "$scratch/out"; echo "FAIL: a README with wrong names passed the check"; exit 1
fi
for want in "make target 'demoo'" "has no option --metric" "unknown key 'train.stepz'" \
            "configs/nope.json, which is not in the repository" "takes no option --rankz" \
            "has no option --promptx" "5 README commands checked, 5 with problems"; do
  grep -qF "$want" "$scratch/out" || { cat "$scratch/out"; echo "FAIL: the check did not say: $want"; exit 1; }
done
# The walkthrough's lists: each role pastes its own prerequisite first, then the same rest.
root_first=$(python3 tools/readme_commands.py list --role root | tr '\0' '\n' | head -1)
user_first=$(python3 tools/readme_commands.py list --role user | tr '\0' '\n' | head -1)
[[ $root_first == "apt-get install"* && $user_first == "sudo apt-get install"* ]] ||
  { echo "FAIL: the roles' first commands are '$root_first' and '$user_first'"; exit 1; }
echo "readme_commands: ok"
