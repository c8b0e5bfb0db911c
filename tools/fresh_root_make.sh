#!/usr/bin/env bash
# `make -j2`, then `make demo`, as root in a fresh Debian 12 root (debootstrap, minbase: what
# a container image has) where none of tandem's packages is installed yet: the Makefile's
# deps must install them before CMake configures, whatever -j, and nothing a failed step
# leaves in build/ may stop the next make (issue 44, item 1). Run by hand, not by CI: it
# needs root, debootstrap and the network (deb.debian.org), and takes 15-30 minutes on 2
# cores (a full build of tandem and its tests, then the demo's training).
#
#   sudo tools/fresh_root_make.sh [--makefile-from REV] [--preinstall "PKG ..."] [--dir DIR]
#                                 [--keep] [--timeout S]
#
#   --makefile-from  the Makefile of git revision REV instead of HEAD's, the rest of the tree
#                    still HEAD's (f50a403, say: the Makefile before the fix, to see it fail)
#   --preinstall     Debian packages installed in the root before the two makes, beside git
#                    and make (e.g. "cmake g++": a machine that has a compiler and CMake but
#                    not tandem's libraries)
#   --dir            where the cached base (a tarball, made once) and the root go
#                    (default /var/tmp/tandem-fresh-root)
#   --keep           leave the root behind (else it is removed at the end)
#   --timeout        seconds either make may take (default 3600)
#
# The root: the cached debootstrap base, unpacked afresh; the mounts a real system has (proc,
# sys, dev, a tmpfs /dev/shm, which OpenMPI needs), in a mount namespace of their own so they
# go away with it; README's prerequisite (`apt-get install -y git make`, as root) and nothing
# else; this repository's committed HEAD (`git archive`, uncommitted changes are not seen) in
# /root/tandem. Then `make -j2` and `make demo` there, each logged to DIR/logs/.
# PASS (exit 0): both exited 0 and the demo printed its last step's training loss.
# FAIL (exit 1): otherwise, with the failing log's last lines.
set -euo pipefail

makefile_rev=
preinstall=
dir=/var/tmp/tandem-fresh-root
keep=0
timeout_s=3600
while [[ $# -gt 0 ]]; do
  case $1 in
    --makefile-from) makefile_rev=$2; shift 2 ;;
    --preinstall) preinstall=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --timeout) timeout_s=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh_root_make: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "fresh_root_make: needs root (debootstrap, chroot, mount): run it with sudo" >&2; exit 2; }
if ! command -v debootstrap > /dev/null; then
  echo "== installing debootstrap"
  apt-get install -y -qq debootstrap > /dev/null
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/chroot_with_mounts.sh"
git -C "$repo" diff --quiet HEAD -- ||
  echo "fresh_root_make: note: uncommitted changes are not tested (HEAD is copied)" >&2
if [[ -n $makefile_rev ]]; then
  git -C "$repo" cat-file -e "$makefile_rev:Makefile" 2> /dev/null ||
    { echo "fresh_root_make: no Makefile at revision '$makefile_rev'" >&2; exit 2; }
fi

mkdir -p "$dir"
base=$dir/bookworm-minbase.tar
if [[ ! -s $base ]]; then
  echo "== debootstrap bookworm (minbase) into a tarball $base (once; a minute or two)"
  rm -rf "$dir/base.partial"
  debootstrap --variant=minbase bookworm "$dir/base.partial" http://deb.debian.org/debian \
    > "$dir/debootstrap.log" 2>&1 ||
    { echo "fresh_root_make: debootstrap failed; see $dir/debootstrap.log" >&2; exit 2; }
  tar -C "$dir/base.partial" -cf "$base.partial" .
  mv "$base.partial" "$base"
  rm -rf "$dir/base.partial"
fi

root=$dir/root
logs=$dir/logs
# On the way out, end what still runs in the root (an interrupted make: `timeout` puts it in
# a process group of its own, which Ctrl-C does not reach), by id, only processes whose root
# is this one. The mounts end with their namespace; never remove a tree that still has one.
cleanup() {
  local p
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/root" 2> /dev/null) == "$root" ]] && kill "${p#/proc/}" 2> /dev/null
  done
  if [[ $keep == 0 && -d $root ]] && ! findmnt -rn -o TARGET | grep -q "^$root/"; then rm -rf "$root"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$root" "$logs"
mkdir -p "$root" "$logs"
tar -C "$root" -xf "$base"

# Runs the shell command $1 in the root, as root, in /root/tandem once that exists, with the
# system's mounts in a mount namespace that takes them away when it ends, and a clean
# environment (nothing of this machine's: no CUDA, no PATH of its own).
in_root() {
  chroot_with_mounts "$root" env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /root/tandem 2> /dev/null || cd /root; $1"
}

echo "== the root: $root (logs in $logs)"
# README's prerequisite on a minimal Debian, as root (apt-get update first: the package lists
# debootstrap left may be older than the mirror).
in_root "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git make $preinstall" \
  > "$logs/00-prerequisite.log" 2>&1 ||
  { echo "fresh_root_make: installing git make $preinstall failed; see $logs/00-prerequisite.log" >&2; exit 2; }
mkdir -p "$root/root/tandem"
git -C "$repo" archive HEAD | tar -x -C "$root/root/tandem"
if [[ -n $makefile_rev ]]; then
  git -C "$repo" show "$makefile_rev:Makefile" > "$root/root/tandem/Makefile"
fi
echo "== tree: HEAD $(git -C "$repo" log -1 --format=%h), Makefile of ${makefile_rev:-HEAD};" \
  "preinstalled: git make${preinstall:+ $preinstall}"

status=0
results=()
n=0
for command in "make -j2" "make demo"; do
  n=$((n + 1))
  log=$logs/0$n-${command// /_}.log
  echo "[$n/2] $command"
  start=$SECONDS
  rc=0
  in_root "timeout $timeout_s $command" > "$log" 2>&1 < /dev/null || rc=$?
  took=$((SECONDS - start))
  verdict=ok
  if [[ $rc != 0 ]]; then
    verdict="FAILED (exit $rc)"
  elif [[ $command == "make demo" ]] &&
    ! grep -Eq '^step +([0-9]+)/\1 \| loss [0-9]+\.[0-9]+ ' "$log"; then
    verdict="FAILED (exit 0, but no training loss of the last step in its output)"
  fi
  printf '      %s in %d s\n' "$verdict" "$took"
  if [[ $verdict != ok ]]; then
    status=1
    echo "      last lines of $log:"
    tail -n 15 "$log" | sed 's/^/        | /'
  elif [[ $command == "make demo" ]]; then
    grep -E '^step +([0-9]+)/\1 \| loss ' "$log" | tail -n 1 | sed 's/^/      /'
  fi
  results+=("$(printf '%-4s %5d s  %s' "$([[ $verdict == ok ]] && echo ok || echo FAIL)" "$took" "$command")")
done
printf '%s\n' "== Makefile of ${makefile_rev:-HEAD}, preinstalled: git make${preinstall:+ $preinstall}" "${results[@]}"
if [[ $status == 0 ]]; then echo "PASS"; else echo "FAIL"; fi
exit $status
