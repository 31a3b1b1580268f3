#!/bin/sh
# A fuzzing campaign (on demand; CI only replays the corpora):
#   scripts/fuzz.sh [SECONDS [TARGET...]]     (SECONDS per target, 60 by default; 0: no
#                                              fuzzing, each corpus replayed once for its coverage)
# Builds the libFuzzer targets with clang, ASan and UBSan in build-fuzz/
# (K3_FUZZ_BUILD overrides), then runs each target (all of tests/fuzz/fuzz_*.c by
# default) for SECONDS, one at a time, at nice 10, starting from its corpus
# tests/fuzz/corpus/<name>/. New coverage goes to build-fuzz/fuzz-work/<name>/, never
# into the committed corpus. Every finding (crash-*, leak-*, timeout-*, oom-*) is
# copied into tests/fuzz/corpus/<name>/ as regress_<kind>_<hash>, so the replay
# tests (ctest -L fuzz) fail until it is fixed; rename it to say what it is.
# Prints one line per target: executions, corpus units, libFuzzer's coverage at the end (cov: the
# code edges reached, ft: its features), findings. Exit 1 if any.
set -eu
cd "$(dirname "$0")/.."
secs=${1:-60}
[ $# -gt 0 ] && shift
case $secs in ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS [TARGET...]]" >&2; exit 2;; esac

# clang, the libFuzzer runtime and clang's OpenMP (the runtime is optional in scripts/setup.sh; CI
# compiles the targets with clang when it is there, but runs no campaign), needed here
./scripts/setup.sh
need=""
for p in clang libclang-rt-14-dev libomp-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need="$need $p"
done
if [ -n "$need" ]; then
    echo "fuzz: installing$need" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

targets="$*"
[ -n "$targets" ] || targets=$(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||' | grep -v '^replay$')
build=${K3_FUZZ_BUILD:-build-fuzz}
CC=clang cmake -S . -B "$build" -DK3_FUZZ=ON -DK3_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# only the libFuzzer binaries: they compile the code under test themselves (tests/fuzz/CMakeLists.txt)
for t in $targets; do
    nice -n 10 cmake --build "$build" -j "${K3_JOBS:-2}" --target "fuzz_$t" >/dev/null
done
printf '%-20s %8s %12s %10s %8s %7s %7s  %s\n' target seconds executions exec/s corpus cov ft findings
found=0
for t in $targets; do
    work="$build/fuzz-work/$t"
    art="$build/fuzz-artifacts/$t"
    log="$build/fuzz-logs/$t.log"
    mkdir -p "$work" "$art" "$(dirname "$log")"
    rm -f "$art"/*
    if [ "$secs" -eq 0 ]; then                   # the corpus once: its coverage, nothing new
        run="-runs=0"
    else
        run="-max_total_time=$secs"
    fi
    nice -n 10 "$build/tests/fuzz_$t" "$run" -timeout=20 -rss_limit_mb=2560 \
        -print_final_stats=1 -artifact_prefix="$art/" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || true
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    edges=$(echo "$cov" | awk '{print $2}')
    feats=$(echo "$cov" | awk '{print $4}')
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    units=$(ls "$work" | wc -l)
    findings=""
    for f in "$art"/crash-* "$art"/leak-* "$art"/timeout-* "$art"/oom-*; do
        [ -e "$f" ] || continue
        b=$(basename "$f")
        kind=${b%%-*}
        dest="tests/fuzz/corpus/$t/regress_${kind}_$(sha1sum "$f" | cut -c1-12)"
        cp "$f" "$dest"
        findings="$findings $dest"
        found=1
    done
    printf '%-20s %8s %12s %10s %8s %7s %7s  %s\n' "$t" "$secs" "${execs:-?}" "${rate:-?}" "$units" "${edges:-?}" \
        "${feats:-?}" "${findings:-none}"
    [ -z "$findings" ] || grep -m3 -E 'ERROR|invariant|SUMMARY|disagree|does not' "$log" | sed 's/^/    /' || true
done
exit $found
