#!/bin/sh
# k3run reading its experts in place in the checkpoint (k3pack --experts-in-place, issue 18)
# against the normal pack of the same checkpoint (aim: within 5 %), by bench_pair.sh.
#
#   tests/bench/bench_in_place.sh NORMAL_PACK IN_PLACE_PACK [THREADS] [N_GENERATED] [ROUNDS]
[ $# -ge 2 ] || { sed -n '2,5p' "$0"; exit 2; }
LABELS="normal inplace" SAME_IDS=1 exec "$(dirname "$0")/bench_pair.sh" "$@"
