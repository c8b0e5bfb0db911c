#!/usr/bin/env bash
# Copies the shared libraries tandem's binaries load, other than the C runtime, into
# BUILD_DIR/device-libs, so that a build made here runs on a machine that cannot
# install packages (the GPU machine): carry BUILD_DIR with it and bench/gpu_goals.sh
# puts device-libs on LD_LIBRARY_PATH. The CUDA runtime is linked statically; the
# driver (libcuda) always comes from the GPU machine itself.
#
#   tools/pack_device_libs.sh [BUILD_DIR]     (default: build)
set -euo pipefail
build=${1:-build}
dest="$build/device-libs"
mkdir -p "$dest"
for binary in "$build"/tandem "$build"/test_*; do
  [[ -x $binary && -f $binary ]] || continue
  ldd "$binary" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux*) continue ;;
    libcuda.so* | libnvidia*) continue ;;  # the driver belongs to the GPU machine
  esac
  cp -L "$lib" "$dest/"
done
du -sh "$dest"
ls "$dest"
