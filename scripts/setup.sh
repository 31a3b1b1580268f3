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
# libedit-dev: line editing and history in `k3run chat` (BSD-licensed, Debian's editline);
# libmicrohttpd-dev: the HTTP server of `k3run serve`; curl: the server's tests;
# libopenmpi-dev + openmpi-bin: experts across MPI ranks (`mpirun -n R k3run`; k3 builds without them)
# clang + libomp-dev (its OpenMP): the tree must build warning-free with it too (scripts/test.sh; the
# fuzz targets need it);
# openssl: the TLS test makes its certificate with it; nettle-dev: SHA-256 of downloaded checkpoints
PKGS="gcc clang libomp-dev make cmake pkg-config libzstd-dev libxxhash-dev libarchive-dev libjansson-dev
      libpcre2-dev libedit-dev libmicrohttpd-dev nettle-dev libopenmpi-dev openmpi-bin curl python3 python3-numpy python3-regex python3-xxhash
      zstd bc strace openssl bible-kjv bible-kjv-text"
if [ "${1:-}" = "--train" ]; then
    PKGS="$PKGS python3-torch libopenblas0-pthread"
fi
# optional: the libFuzzer runtime for the fuzz targets; Chromium for the chat page's browser test
# (serve.page). Each is skipped silently when it cannot be installed; its tests say they are skipped.
OPTIONAL="libclang-rt-14-dev chromium"
# node + npm run the server's client tests (the official openai and Anthropic SDKs; playwright-core
# driving Chromium): required, as the tests of the APIs those SDKs speak are (scripts/test.sh)
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
# the optional ones are tried once per build tree (a stamp in build/), not on every run
root="$(cd "$(dirname "$0")/.." && pwd)"
stamp="$root/build/.k3-setup-optional"
optional=""
if [ -n "$missing" ] || [ ! -e "$stamp" ]; then
    for p in $OPTIONAL; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || optional="$optional $p"
    done
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ -n "$missing$optional" ]; then
    echo "k3 setup: installing$missing$optional" >&2
    $SUDO apt-get update -qq >/dev/null
    [ -z "$missing" ] || $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
    for p in $optional; do
        $SUDO apt-get install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 || true
    done
fi
mkdir -p "$root/build" && : > "$stamp"

# the npm packages of tests/serve (package-lock.json pins them), from the npm registry: again when
# one of package.json's is missing or at another version (a package added since the last npm ci)
serve="$root/tests/serve"
serve_deps_ok() {
    [ -e "$serve/node_modules/.package-lock.json" ] && node -e '
        const d = process.argv[1], deps = require(d + "/package.json").dependencies || {};
        for (const [name, version] of Object.entries(deps))
            if (require(d + "/node_modules/" + name + "/package.json").version !== version) process.exit(1);
    ' "$serve" >/dev/null 2>&1
}
if command -v npm >/dev/null 2>&1 && ! serve_deps_ok; then
    echo "k3 setup: npm ci in tests/serve (openai, @anthropic-ai/sdk, playwright-core)" >&2
    (cd "$serve" && npm ci --silent --no-audit --no-fund >/dev/null 2>&1) ||
        { echo "k3 setup: npm ci failed in tests/serve: the SDK tests cannot run" >&2; exit 1; }
fi
exit 0
