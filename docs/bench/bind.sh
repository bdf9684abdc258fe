#!/usr/bin/env bash
# bind.sh [RUNS] — the built-in engine's tokens/s with 2 ranks bound to
# cores of their own (--bind core) vs unbound (--bind none), on this
# machine: RUNS interleaved runs of each (default 5) of the default job
# for 40 steps, each run's median tok/s over steps 11-40 (rank 0's log),
# then the median over the runs. Needs a built gtrain on PATH or GTRAIN.
set -euo pipefail
runs=${1:-5}
gtrain=${GTRAIN:-gtrain}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for i in $(seq "$runs"); do
	for mode in none core; do
		(cd "$work" && "$gtrain" run --nproc-per-node 2 --bind "$mode" --table never \
			--set steps=40 --set log_every=1 --set checkpoint.every=0 2>&1) |
			sed -n 's/^\[rank 0\] step \([0-9]*\)\/.* | \([0-9.]*\) tok\/s$/\1 \2/p' |
			awk '$1 > 10 {print $2}' | median >> "$work/$mode"
		rm -rf "$work/runs"
	done
done
for mode in none core; do
	printf '%s: median %s tok/s over %d runs (per-run medians: %s)\n' "$mode" \
		"$(median < "$work/$mode")" "$runs" "$(tr '\n' ' ' < "$work/$mode")"
done
