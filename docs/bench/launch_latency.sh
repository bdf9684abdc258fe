#!/usr/bin/env bash
# Launch latency: wall time of a whole job, gtrain vs torchrun (--standalone)
# on this machine, interleaved run by run so that both see the same load.
# Usage: docs/bench/launch_latency.sh [runs] [ranks] [job]
#   job "true" (default): every rank is /bin/true (torchrun --no_python)
#   job "ddp": every rank runs examples/ddp_allreduce.py (import torch, gloo
#   process group, an all-reduce and a DDP step)
# Prints the median, min and max of each and the ratio of the medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-15}
ranks=${2:-4}
job=${3:-true}
go build -o bin/gtrain ./cmd/gtrain
# --redirects/--tee work around Debian torch 1.13's crash on Python 3.11 with
# the default (Std.NONE is not iterable there).
torchrun=(/usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node "$ranks" --redirects 1 --tee 1)
gtrain=(./bin/gtrain run --nproc-per-node "$ranks" --table never --)
case $job in
true) torchrun+=(--no_python /bin/true) gtrain+=(/bin/true) ;;
ddp) torchrun+=(examples/ddp_allreduce.py) gtrain+=(/usr/bin/python3 examples/ddp_allreduce.py) ;;
*) echo "job: want true or ddp" >&2; exit 2 ;;
esac

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
awk -v g="$gm" -v t="$tm" -v r="$ranks" -v j="$job" 'BEGIN { printf "ratio     torchrun/gtrain median = %.1fx (%d ranks, job %s)\n", t/g, r, j }'
