#!/usr/bin/env bash
# Pastes every command of README.md, as written, into a fresh Debian 12 (debootstrap, nothing
# added), as root and as a user with sudo, and says which succeeded and how long each took.
# Run by hand before a release (README, "Development"); needs root, debootstrap and the
# network (deb.debian.org, PyPI). The commands come from the README itself
# (tools/readme_commands.py list), so that the walkthrough cannot drift from it.
#
#   sudo tools/readme_walkthrough.sh [--as root|user|both] [--dir DIR] [--keep] [--timeout S]
#                                    [--from N]
#
#   --as       whose walkthrough (default both, one after the other, each in its own copy)
#   --dir      where the Debian base (made once, reused) and the copies go
#              (default /var/tmp/tandem-walkthrough)
#   --keep     leave each copy behind (else it is removed after its walkthrough)
#   --timeout  seconds any one command may take (default 3600)
#   --from     start at command N, in the copy an earlier --keep run left in DIR/<role> (its
#              clone, packages and build as they were): to go on after a failure without
#              repeating the first commands
#
# Each walkthrough: a copy of the base; the mounts a real system has (proc, sys, dev, a
# tmpfs /dev/shm, which OpenMPI needs), in a mount namespace of their own so they go away with
# it; this repository's committed HEAD cloned to ~/tandem of the role; then the README's
# commands, the role's prerequisite first, each in a login shell in ~/tandem, logged to
# DIR/<role>/logs/NN.log. The user is `dev`, in the sudo group, with sudo installed as a
# fresh Debian with a sudo user has it. sudo asks no password here (NOPASSWD): this script
# has no terminal to type it into.
# Exit status: 0 when every command of every walkthrough exited 0.
set -euo pipefail

role_choice=both
dir=/var/tmp/tandem-walkthrough
keep=0
timeout_s=3600
from=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --as) role_choice=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --from) from=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "readme_walkthrough: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
case $role_choice in
  both) roles=(root user) ;;
  root|user) roles=("$role_choice") ;;
  *) echo "readme_walkthrough: --as takes root, user or both, not '$role_choice'" >&2; exit 2 ;;
esac
[[ $from =~ ^[1-9][0-9]*$ ]] ||
  { echo "readme_walkthrough: --from takes a command number (1 or more), not '$from'" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "readme_walkthrough: needs root (debootstrap, chroot, mount): run it with sudo" >&2; exit 1; }
command -v debootstrap > /dev/null ||
  { echo "readme_walkthrough: debootstrap not found (apt-get install -y debootstrap)" >&2; exit 1; }
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/chroot_with_mounts.sh"
git -C "$repo" diff --quiet HEAD ||
  echo "readme_walkthrough: note: uncommitted changes are not walked through (HEAD is cloned)" >&2

base=$dir/base
if [[ ! -x $base/bin/bash ]]; then
  echo "== debootstrap bookworm into $base (once; a few minutes)"
  rm -rf "$base.partial"
  mkdir -p "$dir"
  debootstrap bookworm "$base.partial" http://deb.debian.org/debian > "$dir/debootstrap.log" 2>&1 ||
    { echo "readme_walkthrough: debootstrap failed; see $dir/debootstrap.log" >&2; exit 1; }
  mv "$base.partial" "$base"
fi

status=0
for role in "${roles[@]}"; do
  system=$dir/$role
  if [[ $role == user ]]; then
    home=/home/dev
    prefix=(su - dev -c)
  else
    home=/root
    prefix=(bash -lc)
  fi
  if ((from > 1)); then
    [[ -d $system$home/tandem ]] || { echo "readme_walkthrough: --from $from needs the copy an" \
      "earlier --keep run left in $system; there is none (run without --from)" >&2; exit 1; }
    echo "== $role: going on in $system from command $from (its clone at $(git -C "$system$home/tandem" log -1 --format=%h))"
  else
    echo "== $role: a fresh copy of the base in $system"
    rm -rf "$system"
    cp -a "$base" "$system"
    mkdir -p "$system/logs"
    # A fresh Debian with a sudo user: sudo installed, the user in its group.
    [[ $role == user ]] && chroot_with_mounts "$system" bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sudo > /dev/null &&
      useradd -m -s /bin/bash -G sudo dev && echo "dev ALL=(ALL) NOPASSWD: ALL" > /etc/sudoers.d/dev-walkthrough'
    git clone -q "$repo" "$system$home/tandem"
    [[ $role == user ]] && chroot_with_mounts "$system" chown -R dev:dev "$home/tandem"
  fi
  mapfile -d '' commands < <(python3 "$repo/tools/readme_commands.py" list --role "$role" "$repo/README.md")
  results=()
  for i in "${!commands[@]}"; do
    ((i + 1 < from)) && continue
    command=${commands[$i]}
    log=$(printf '%s/logs/%02d.log' "$system" "$((i + 1))")
    printf '[%d/%d] %s: %s\n' "$((i + 1))" "${#commands[@]}" "$role" "$command"
    start=$SECONDS
    rc=0
    { echo "\$ $command"; chroot_with_mounts "$system" timeout "$timeout_s" "${prefix[@]}" "cd ~/tandem && $command"; } \
      > "$log" 2>&1 < /dev/null || rc=$?
    took=$((SECONDS - start))
    if [[ $rc == 0 ]]; then verdict=ok; else verdict="FAILED (exit $rc; $log)"; status=1; fi
    printf '      %s in %d s\n' "$verdict" "$took"
    results+=("$(printf '%-4s %5d s  %s' "$([[ $rc == 0 ]] && echo ok || echo FAIL)" "$took" "$command")")
  done
  printf '%s\n' "== $role: ${#commands[@]} commands" "${results[@]}" | tee "$dir/$role-summary.txt"
  # The mounts ended with their namespace; never remove a tree that still has one.
  if [[ $keep == 0 ]] && ! findmnt -rn -o TARGET | grep -q "^$system/"; then rm -rf "$system"; fi
done
exit $status
