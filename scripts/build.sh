#!/bin/sh
# Configure and build k3 into DIR (default build/). Extra arguments go to cmake.
# Usage: scripts/build.sh [DIR] [-DOPTION=VALUE ...]
set -eu
cd "$(dirname "$0")/.."
dir=${1:-build}
[ $# -gt 0 ] && shift
cmake -S . -B "$dir" -DK3_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j "$(nproc)" >/dev/null || cmake --build "$dir" -j 1
