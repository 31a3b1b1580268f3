#!/bin/sh
# The test command (README, CI): install what is missing, build, run the whole
# suite; then rebuild with AddressSanitizer + UBSan and run the whole suite again.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
jobs=$(nproc)
# ctest runs $jobs tests at once, and each k3run in them starts one OpenMP thread per core: idle
# libgomp threads that spin (its default) then take the cores the working ones need. With the
# threads sleeping instead, run.chat under ASan beside run.spec took 75 s instead of 407 s (results
# do not depend on it: every product is bit for bit the same at any thread count or schedule).
export OMP_WAIT_POLICY=passive
# the tests of the APIs against their official SDKs fail here instead of skipping (servelib.need)
export K3_REQUIRE_CLIENTS=1

echo "== build (Release, -Werror) and run all tests"
./scripts/build.sh build
(cd build && ctest --output-on-failure -j "$jobs")

echo "== build with clang (-Werror; at -O0: its warnings are the point, the tests ran on gcc's build)"
CC=clang ./scripts/build.sh build-clang -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG=-O0
# and the libFuzzer targets, wherever their runtime is installed (setup.sh tries it), so a change
# that breaks one is caught here, not at the next campaign (scripts/fuzz.sh)
if dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "ok installed"; then
    echo "== the libFuzzer targets (clang, -O0)"
    CC=clang cmake -S . -B build-fuzz-ci -DK3_WERROR=ON -DK3_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
        -DCMAKE_C_FLAGS_DEBUG=-O0 >/dev/null
    cmake --build build-fuzz-ci -j "$jobs" --target fuzz_targets >/dev/null
fi

echo "== build (ASan + UBSan, without MPI) and run the whole suite again"
# without MPI: the second build is also k3 as it builds where Open MPI is not installed
./scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DK3_SANITIZE=ON -DK3_MPI=OFF
# Not again under the sanitizers: the tests of the NumPy reference alone (label python: no k3 code
# runs in them) and the heavy repeats (label heavy: the small preset's or a full-size geometry's run
# of code paths that lighter tests of the same suite drive under the sanitizers too), which keeps the
# whole command well within CI's 25 minutes.
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j "$jobs" -LE 'python|heavy')
echo "== all tests passed"
