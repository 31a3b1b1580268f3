#!/bin/sh
# The test command (README, CI): install what is missing, build, run the whole
# suite; then rebuild with AddressSanitizer + UBSan and run the whole suite again.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
jobs=$(nproc)

echo "== build (Release, -Werror) and run all tests"
./scripts/build.sh build
(cd build && ctest --output-on-failure -j "$jobs")

echo "== build (ASan + UBSan) and run the whole suite again"
./scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DK3_SANITIZE=ON
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j "$jobs")
echo "== all tests passed"
