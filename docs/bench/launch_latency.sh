#!/usr/bin/env bash
# Launch latency: wall time of a whole job whose ranks do nothing
# (/bin/true), gtrain vs torchrun (--standalone, --no_python) on this machine,
# interleaved run by run so that both see the same machine load.
# Usage: docs/bench/launch_latency.sh [runs] [ranks]   (defaults: 15 runs, 4 ranks)
# Prints the median, min and max of each and the ratio of the medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-15}
ranks=${2:-4}
go build -o bin/gtrain ./cmd/gtrain
torchrun=(/usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node "$ranks"
	--redirects 1 --tee 1 --no_python /bin/true)
gtrain=(./bin/gtrain run --nproc-per-node "$ranks" --table never -- /bin/true)

# ms runs a command once and prints its wall time in milliseconds.
ms() {
	local t0 t1
	t0=$(date +%s%N)
	"$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }
	t1=$(date +%s%N)
	echo $(((t1 - t0) / 1000000))
}

stats() { # name, then samples: median min max
	local name=$1; shift
	printf '%s\n' "$@" | sort -n | awk -v n="$name" '{a[NR]=$1} END {
		m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2
		printf "%-9s median %6.0f ms  min %6d ms  max %6d ms  (%d runs)\n", n, m, a[1], a[NR], NR }'
}

g=() t=()
"${gtrain[@]}" >/dev/null 2>&1 # warm the page cache for both
"${torchrun[@]}" >/dev/null 2>&1
for ((i = 0; i < runs; i++)); do
	g+=("$(ms "${gtrain[@]}")")
	t+=("$(ms "${torchrun[@]}")")
done
stats gtrain "${g[@]}"
stats torchrun "${t[@]}"
gm=$(printf '%s\n' "${g[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}')
tm=$(printf '%s\n' "${t[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}')
awk -v g="$gm" -v t="$tm" -v r="$ranks" 'BEGIN { printf "ratio     torchrun/gtrain median = %.1fx (%d ranks of /bin/true)\n", t/g, r }'
