#!/bin/sh
# valgrind memcheck over the tiny end-to-end path (on demand, not in CI):
#   tests/fuzz/valgrind.sh [BUILD_DIR]
# Builds a plain -O1 -g build (default build-valgrind/), makes the tiny demo
# checkpoint as scripts/demo.sh does, and runs under
# valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect:
# k3inspect (checkpoint and pack), k3verify (checkpoint and pack), k3pack, and
# k3run (8 tokens) and k3run --tokenize. Each tool's valgrind log is kept in
# BUILD_DIR/valgrind/. Prints one line per run; exit 1 if any run has an error or leak.
set -eu
cd "$(dirname "$0")/../.."
build=${1:-build-valgrind}
./scripts/setup.sh
dpkg-query -W -f='${Status}' valgrind 2>/dev/null | grep -q "ok installed" || {
    echo "valgrind: installing valgrind" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends valgrind >/dev/null
}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DK3_TESTS=OFF >/dev/null
nice -n 10 cmake --build "$build" -j "${K3_JOBS:-2}" >/dev/null
ck="$build/valgrind/kimi-k3-tiny"
pack="$build/valgrind/kimi-k3-tiny.k3pack"
logs="$build/valgrind"
mkdir -p "$logs"
if [ ! -e "$ck/config.json" ]; then
    /usr/bin/python3 tests/reference/make_checkpoint.py --preset tiny --seed 1 --out "$ck" >/dev/null 2>&1
fi
rm -rf "$pack"
export K3_NO_PROGRESS=1 OMP_NUM_THREADS=2
fail=0
n=0
run() {
    n=$((n + 1))
    log="$logs/$n-$1.log"
    if nice -n 10 valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
           --show-leak-kinds=definite,indirect --log-file="$log" "$build/bin/$@" >"$log.out" 2>&1; then
        rc=0
    else
        rc=$?
    fi
    errs=$(grep -c '^==[0-9]*== [A-Z]' "$log" || true)
    if [ "$rc" -eq 99 ] || [ "$errs" -gt 0 ]; then
        fail=1
        printf '%-60s FAIL (exit %s, see %s)\n' "$*" "$rc" "$log"
    elif [ "$rc" -ne 0 ]; then
        fail=1
        printf '%-60s FAIL (the tool itself exited %s: %s)\n' "$*" "$rc" "$log.out"
    else
        printf '%-60s 0 errors, 0 leaks\n' "$*"
    fi
}
run k3inspect --summary "$ck"
run k3verify --checkpoint "$ck"
run k3pack -q "$ck" -o "$pack"
run k3verify "$pack"
run k3inspect --summary "$pack"
run k3run -m "$pack" -p 'The quick brown fox' -n 8 --threads 2
run k3run --tokenizer "$ck" --tokenize 'Hello world <|end_of_msg|>'
exit $fail
