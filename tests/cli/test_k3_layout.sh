#!/bin/sh
# The full-size Kimi K3 layout: k3_mklayout writes the real tensor list of
# tests/data/kimi-k3-config.json (language_model. prefix, MXFP4 experts, plus a
# few vision tensors) into <= 5 GB sparse shards with an index; k3inspect must
# open it in seconds and report the real totals, which check_k3_layout.py
# recomputes independently from the config.
# Environment (set by ctest): K3INSPECT K3_MKLAYOUT K3_TEST_DATA K3_TEST_TOOLS K3_TEST_TMP PYTHON
set -u
T="$K3_TEST_TMP/k3_layout"
rm -rf "$T" && mkdir -p "$T" || exit 1
cfg="$K3_TEST_DATA/kimi-k3-config.json"
now() { date +%s.%N; }

t0=$(now)
"$K3_MKLAYOUT" "$cfg" "$T/ckpt" || exit 1
t1=$(now)
"$K3INSPECT" -v --summary "$T/ckpt" >"$T/summary.txt" 2>"$T/summary.err" || { cat "$T/summary.err"; exit 1; }
t2=$(now)
"$K3INSPECT" --summary --json "$T/ckpt" >"$T/summary.json" || exit 1
t3=$(now)
"$K3INSPECT" --json "$T/ckpt" >"$T/list.json" || exit 1
t4=$(now)
"$K3INSPECT" "$T/ckpt" >"$T/list.txt" || exit 1
t5=$(now)

cat "$T/summary.err"
sed -n '/^By kind:/,$p' "$T/summary.txt"
echo "timings (s): k3_mklayout $(echo "$t1 - $t0" | bc), --summary $(echo "$t2 - $t1" | bc)," \
     "--summary --json $(echo "$t3 - $t2" | bc), --json $(echo "$t4 - $t3" | bc), list $(echo "$t5 - $t4" | bc)"
"$PYTHON" "$K3_TEST_TOOLS/check_k3_layout.py" "$cfg" "$T/summary.json" "$T/list.json" "$T/list.txt" "$T/ckpt"
rc=$?
[ $rc -eq 0 ] && rm -rf "$T"
exit $rc
