# Sourced by the scripts that run commands in a fresh Debian root (fresh_root_make.sh,
# readme_walkthrough.sh):
#
#   chroot_with_mounts ROOT COMMAND [ARG...]
#
# runs COMMAND inside ROOT, as root, with the mounts a real system has (proc, sys, dev, a
# tmpfs /dev/shm, which OpenMPI needs) and this machine's DNS, in a mount namespace of its
# own: the mounts end with it, and none is left behind to keep ROOT from being removed.
chroot_with_mounts() {
  unshare --mount --propagation private bash -c '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    exec chroot "$root" "$@"' chroot_with_mounts "$@"
}
