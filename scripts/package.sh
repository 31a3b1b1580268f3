#!/bin/sh
# Build k3's Debian package (README "Install"): a Release build without Open MPI in DIR (default
# build-deb/; k3 built without MPI refuses to run under mpirun, so the package does not pull Open
# MPI in), then `cpack -G DEB`, whose dependencies dpkg-shlibdeps computes from the binaries.
# Prints the package's path. Install it with: apt-get install ./k3_VERSION_ARCH.deb
#   scripts/package.sh [DIR]
set -eu
cd "$(dirname "$0")/.."
dir=${1:-build-deb}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DK3_MPI=OFF -DK3_TESTS=OFF -DK3_WERROR=ON >/dev/null
cmake --build "$dir" -j "$(nproc)" >/dev/null
(cd "$dir" && cpack -G DEB >/dev/null)
ls "$dir"/k3_*.deb
