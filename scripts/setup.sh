#!/bin/sh
# Install the Debian packages k3 needs to build and test. Idempotent: silent and
# quick when everything is already present. Nothing is fetched from anywhere but
# the Debian archive configured on this machine.
#   scripts/setup.sh           build, test, demo
#   scripts/setup.sh --train   also what retraining the demo model needs (tests/train):
#                              torch, and OpenBLAS (Debian's torch on the reference BLAS
#                              multiplies at 3 GFLOP/s instead of 43 here)
set -eu

# build: compiler, cmake, pkg-config; libraries; test reference (python3 + numpy + regex);
# strace: the k3pack kill tests stop it at exact system calls (pack_resume, pack_faults);
# bible-kjv-text + its reader bible-kjv: the demo model's training and held-out text;
# libedit-dev: line editing and history in `k3run chat` (BSD-licensed, Debian's editline)
PKGS="gcc make cmake pkg-config libzstd-dev libxxhash-dev libarchive-dev libjansson-dev
      libpcre2-dev libedit-dev python3 python3-numpy python3-regex python3-xxhash zstd bc strace
      bible-kjv bible-kjv-text"
if [ "${1:-}" = "--train" ]; then
    PKGS="$PKGS python3-torch libopenblas0-pthread"
fi
# optional: clang + libFuzzer runtime for the fuzz target (skipped silently if unavailable)
OPTIONAL="clang libclang-rt-14-dev"

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "k3 setup: installing$missing" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
for p in $OPTIONAL; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
        $SUDO apt-get install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 || true
done
