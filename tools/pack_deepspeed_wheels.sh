#!/usr/bin/env bash
# Makes the wheel set that lets the GPU machine (no package index there) install DeepSpeed
# for bench/deepspeed_offload_train.py, and checks it.
#
#   tools/pack_deepspeed_wheels.sh [DEST]        # DEST defaults to gpu-payload/wheels
#
# Needs PyPI (here, not there) and python3 with venv. What it does:
#   1. downloads the newest DeepSpeed 0.19.x sdist and builds it into a py3-none-any wheel
#      (DS_BUILD_OPS=0: every op, CPU Adam included, is JIT-compiled on the GPU machine).
#      DeepSpeed's setup.py builds without torch (it only warns), so torch is not installed;
#      setuptools and wheel go into a throwaway venv. A wheel of the same version already in
#      DEST is reused instead of rebuilt;
#   2. downloads cp312 manylinux x86-64 wheels of DeepSpeed's requirements that the GPU
#      machine lacks (hjson, pydantic and, through pydantic, pydantic-core, annotated-types,
#      typing-inspection), and of what it has only where the set needs a newer version than
#      it may have (typing-extensions: pydantic 2.14 wants >= 4.16);
#   3. leaves exactly those wheels in DEST (one version of each) and checks them: they
#      install offline for CPython 3.12 on manylinux_2_17 x86-64, and every requirement of
#      every wheel in the set is either in the set (at a version that satisfies it) or on
#      the GPU machine. Prints the wheels, their total size and the command to run there.
# Exits non-zero, saying what failed, if any step does.
set -euo pipefail

dest="${1:-gpu-payload/wheels}"
dest_arg="$dest"
python="${PYTHON:-python3}"
me="pack_deepspeed_wheels.sh"
die() { echo "$me: $*" >&2; exit 1; }

# What the GPU machine already has (Python 3.12.3, torch 2.11 cu130, transformers 5.17 and
# these, as the machine's description lists them; it lacks deepspeed, hjson, pydantic,
# pydantic-core, annotated-types and typing-inspection). typing-extensions' version there is
# not known: torch 2.11's own requirement (>= 4.10.0) is the floor assumed.
GPU_HAS="torch transformers ninja numpy einops msgpack packaging psutil py-cpuinfo tqdm
nvidia-ml-py typing-extensions"
GPU_ASSUMED_VERSIONS="typing-extensions=4.10.0"
PLATFORM_ARGS=(--python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64
               --platform manylinux2014_x86_64 --only-binary=:all:)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest" "$work/stage" "$work/sdist"
dest="$(cd "$dest" && pwd)"

echo "$me: a build venv (setuptools, wheel, packaging)"
"$python" -m venv "$work/venv" || die "$python -m venv failed (Debian: apt-get install python3-venv)"
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q setuptools wheel packaging \
  || die "could not install setuptools/wheel/packaging from PyPI (is PyPI reachable?)"

echo "$me: the newest DeepSpeed 0.19.x sdist"
"${pip[@]}" download -q --no-deps --no-binary=:all: -d "$work/sdist" "deepspeed>=0.19,<0.20" \
  || die "could not download DeepSpeed 0.19.x's sdist from PyPI"
sdist="$(ls "$work/sdist"/deepspeed-*.tar.gz)"
version="$(basename "$sdist" .tar.gz)"; version="${version#deepspeed-}"
wheel="deepspeed-$version-py3-none-any.whl"
if [ -f "$dest/$wheel" ]; then
  echo "$me: reusing $dest/$wheel"
  cp "$dest/$wheel" "$work/stage/"
else
  echo "$me: building $wheel (DS_BUILD_OPS=0, no torch)"
  DS_BUILD_OPS=0 "${pip[@]}" wheel -q --no-deps --no-build-isolation -w "$work/stage" "$sdist" \
    > "$work/build.log" 2>&1 || { tail -20 "$work/build.log" >&2; die "building $wheel failed"; }
  [ -f "$work/stage/$wheel" ] || die "the build did not make $wheel: $(ls "$work/stage")"
fi

# Reads wheels' METADATA: `needs WHEEL...` prints the names among their requirements that
# the GPU machine lacks; `prune DIR` removes wheels of what the GPU machine has unless the
# set needs a newer version than assumed there; `check DIR` checks the set is closed.
cat > "$work/meta.py" << 'EOF'
import os, re, sys, zipfile
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

# Markers evaluated as on the GPU machine: CPython 3.12 on x86-64 Linux, no extras.
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "extra": ""}
gpu_has = {canonicalize_name(n) for n in os.environ["GPU_HAS"].split()}
assumed = {canonicalize_name(k): Version(v) for k, v in
           (item.split("=") for item in os.environ["GPU_ASSUMED_VERSIONS"].split())}


def requirements(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = z.read(name).decode()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
            if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(ENV)]


def wheels(d):
    return {parse_wheel_filename(f)[0]: (parse_wheel_filename(f)[1], os.path.join(d, f))
            for f in sorted(os.listdir(d)) if f.endswith(".whl")}


def needs(paths):
    for path in paths:
        for r in requirements(path):
            if canonicalize_name(r.name) not in gpu_has:
                print(r.name)


def needed_from_set(name, in_set):
    """Whether some wheel of the set that the GPU machine lacks requires `name` at a version
    the GPU machine may not have."""
    floor = assumed.get(name)
    for other, (_, path) in in_set.items():
        if other in gpu_has:
            continue
        for r in requirements(path):
            if canonicalize_name(r.name) == name and (floor is None or
                                                      not r.specifier.contains(floor, prereleases=True)):
                return f"{other} requires {r}, the GPU machine may have {floor}"
    return None


def prune(d):
    in_set = wheels(d)
    for name, (version, path) in in_set.items():
        if name in gpu_has:
            why = needed_from_set(name, in_set) if name in assumed else None
            if why:
                print(f"keeping {os.path.basename(path)}: {why}")
            else:
                os.remove(path)


def check(d):
    files = [f for f in os.listdir(d) if f.endswith(".whl")]
    names = [parse_wheel_filename(f)[0] for f in files]
    dupes = sorted({n for n in names if names.count(n) > 1})
    problems = [f"more than one version of {n}" for n in dupes]
    in_set = wheels(d)
    if "deepspeed" not in in_set:
        problems.append("no deepspeed wheel")
    for name, (version, path) in in_set.items():
        for r in requirements(path):
            dep = canonicalize_name(r.name)
            if dep in in_set:
                if not r.specifier.contains(in_set[dep][0], prereleases=True):
                    problems.append(f"{name} requires {r}; the set has {dep} {in_set[dep][0]}")
            elif dep in gpu_has:
                if dep in assumed and not r.specifier.contains(assumed[dep], prereleases=True):
                    problems.append(f"{name} requires {r}; the GPU machine may have only "
                                    f"{assumed[dep]} and the set has none")
            else:
                problems.append(f"{name} requires {r}: neither in the set nor on the GPU machine")
    for p in problems:
        print(f"pack_deepspeed_wheels.sh: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


{"needs": lambda: needs(sys.argv[2:]), "prune": lambda: prune(sys.argv[2]),
 "check": lambda: check(sys.argv[2])}[sys.argv[1]]()
EOF
export GPU_HAS GPU_ASSUMED_VERSIONS
meta=("$work/venv/bin/python" "$work/meta.py")

mapfile -t missing < <("${meta[@]}" needs "$work/stage/$wheel")
[ "${#missing[@]}" -gt 0 ] || die "DeepSpeed $version requires nothing the GPU machine lacks? (check GPU_HAS)"
echo "$me: DeepSpeed $version's requirements the GPU machine lacks: ${missing[*]}"
"${pip[@]}" download -q "${PLATFORM_ARGS[@]}" -d "$work/stage" "${missing[@]}" \
  || die "could not download cp312 manylinux wheels of ${missing[*]} (and their requirements)"
"${meta[@]}" prune "$work/stage"

# DEST holds exactly the set: wheels left from an older run go.
find "$dest" -maxdepth 1 -name '*.whl' -delete
cp "$work/stage"/*.whl "$dest/"

echo "$me: checking the set installs offline for CPython 3.12 manylinux x86-64"
"${pip[@]}" install -q --no-index --no-deps --target "$work/target" --python-version 3.12 \
  --implementation cp --platform manylinux_2_17_x86_64 --only-binary=:all: "$dest"/*.whl \
  || die "the wheels in $dest do not install offline for CPython 3.12 manylinux_2_17 x86-64"
"${meta[@]}" check "$dest" \
  || die "the set in $dest leaves a requirement unmet (above)"

echo "$me: $dest holds DeepSpeed $version and what it needs beyond the GPU machine's packages:"
( cd "$dest" && ls -l -- *.whl | awk '{ printf "  %10d  %s\n", $5, $9; total += $5 }
  END { printf "  %10d  total (%.1f MiB)\n", total, total / 1048576 }' )
echo "$me: on the GPU machine (no index): PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --find-links $dest_arg deepspeed"
