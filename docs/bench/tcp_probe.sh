#!/usr/bin/env bash
# One gtrain collective between two network-namespace hosts (1 rank each,
# as collectives_hosts.sh makes them), and what the kernel and the ranks
# did meanwhile: each rank's context switches (GNU time around the rank),
# the TCP counters of each namespace (retransmissions, reordering,
# D-SACKs, recoveries and their undoing), drops at the rate limit and in
# the CPUs' receive backlogs. For finding out why calls are slow, not for
# comparing libraries (collectives_hosts.sh does that).
# Usage: docs/bench/tcp_probe.sh [collective] [bytes] [iters]
#   collective defaults to all_reduce (or all_gather, reduce_scatter), bytes
#   to 1048576, iters (timed calls, after 100 warm-up ones) to 1000.
# Environment:
#   GTRAIN  gtrain binary (default: go build ./cmd/gtrain into a temp dir)
#   RATE    limit both ends of the link with tc tbf at this rate (as
#           collectives_hosts.sh: burst 1mb, latency 10ms); default none
#   PIN     1 (default): host I's processes on CPU I; 0: the kernel places them
# Needs root (namespaces), ip, tc, nstat (iproute2), and /usr/bin/time
# (GNU time) for the context switches. The namespaces are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
log() { printf 'tcp_probe.sh: %s\n' "$*" >&2; }
case ${1:-} in -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;; esac
coll=${1:-all_reduce} bytes=${2:-1048576} iters=${3:-1000}
rate=${RATE:-none} pin=${PIN:-1}
[[ $coll =~ ^(all_reduce|all_gather|reduce_scatter)$ ]] || { log "collective $coll: want all_reduce, all_gather or reduce_scatter" && exit 2; }
[[ $bytes =~ ^[0-9]+$ && $iters =~ ^[0-9]+$ ]] && ((bytes >= 64 && bytes <= 1 << 30 && bytes % 64 == 0 && iters >= 1 && iters <= 100000)) ||
	{ log "want 64 <= bytes <= 1 GiB (a multiple of 64) and 1 <= iters <= 100000" && exit 2; }
[[ $rate == none || $rate =~ ^[0-9]+[kmg]?bit$ ]] || { log "RATE $rate: want e.g. 10gbit, or none" && exit 2; }
[[ $pin == 0 || $pin == 1 ]] || { log "PIN $pin: want 0 or 1" && exit 2; }
((EUID == 0)) || { log "needs root: it creates network namespaces" && exit 2; }
for c in ip tc nstat unshare taskset; do command -v "$c" >/dev/null || { log "needs $c (apt-get install iproute2 util-linux)" && exit 2; }; done
timer=()
[[ -x /usr/bin/time ]] && timer=(/usr/bin/time -f "context switches: voluntary %w, involuntary %c; %e s, user %U s, sys %S s")
[[ ${#timer[@]} -gt 0 ]] || log "no /usr/bin/time (apt-get install time): context switches left out"

tag=gtpr$$ net=10.214.$(($$ % 200 + 20))
ns=("$tag-0" "$tag-1") ip_of=("$net.1" "$net.2")
tmp=$(mktemp -d -t gtrain-tcp-probe.XXXXXX)
cleanup() {
	local i
	for i in 0 1; do ip netns del "${ns[i]}" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
# veth_hosts and tbf (docs/bench/lib.sh): see there.
. docs/bench/lib.sh
trap 'exit 130' INT TERM
veth_hosts "${ns[@]}" "${ns[@]}" "${ip_of[@]}" # each end named as its namespace
for i in 0 1; do
	[[ $rate == none ]] || tbf "${ns[i]}" "${ns[i]}" "$rate"
done
if [[ -z ${GTRAIN:-} ]]; then
	log "building gtrain"
	PATH=$PATH:/usr/local/go/bin go build -o "$tmp/gtrain" ./cmd/gtrain
	GTRAIN=$tmp/gtrain
fi

# nstat counts from here; each namespace its own history (the default file is per user)
for i in 0 1; do NSTAT_HISTORY=$tmp/nstat.$i ip netns exec "${ns[i]}" nstat -n >/dev/null; done
cp /proc/net/softnet_stat "$tmp/softnet.0"
secret=$(head -c 24 /dev/urandom | base64)
pids=()
for i in 0 1; do
	pinned=()
	((pin)) && pinned=(taskset -c $((i % $(nproc))))
	env GTRAIN_RDZV_SECRET="$secret" "${pinned[@]}" ip netns exec "${ns[i]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "h$i" \
		timeout -k 10 600 "$GTRAIN" run --nnodes 2 --node-rank "$i" --rdzv-endpoint "${ip_of[0]}:29400" --rdzv-id "$tag" \
		--local-addr "${ip_of[i]}" --nproc-per-node 1 -- "${timer[@]}" \
		"$GTRAIN" bench collectives --collectives "$coll" --dtype float32 --op sum --min-bytes "$bytes" \
		--max-bytes "$bytes" --iters "$iters" --warmup 100 >"$tmp/out.$i" 2>&1 &
	pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
if ((rc)); then
	log "gtrain failed (exit $rc); its output:"
	cat "$tmp/out.0" "$tmp/out.1" >&2
	exit 1
fi

echo "$coll of $bytes bytes, $iters calls after 100 warm-up ones, link ${rate/none/bare veth}, PIN=$pin"
# all-reduce in place (as collectives_hosts.sh times it), the others out of place
grep -E "^\[[^]]*\] +$bytes " "$tmp/out.0" | sed 's/^\[[^]]*\] *//' |
	awk '{ if ($6 == "n/a") print "time µs (median, min, max):", $(NF-5), $(NF-4), $(NF-3); else print "time µs (median, min, max):", $6, $7, $8 }'
for i in 0 1; do
	grep -h 'context switches' "$tmp/out.$i" | sed "s/^\[[^]]*\] */rank $i: /" || true
done
python3 - "$tmp/softnet.0" <<'PY'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open("/proc/net/softnet_stat")]
for i, (x, y) in enumerate(zip(a, b)):
    d = [int(y[j], 16) - int(x[j], 16) for j in range(3)]
    print(f"cpu{i} backlog: processed {d[0]}, dropped {d[1]}, squeezed {d[2]}")
PY
for i in 0 1; do
	echo "host h$i:"
	[[ $rate == none ]] || ip netns exec "${ns[i]}" tc -s qdisc show dev "${ns[i]}" | grep -o 'dropped [0-9]*' | sed 's/^/  tbf /'
	NSTAT_HISTORY=$tmp/nstat.$i ip netns exec "${ns[i]}" nstat 2>/dev/null |
		grep -E '^(TcpOutSegs|TcpRetransSegs|TcpExtTCPSackRecovery|TcpExtTCPSACKReorder|TcpExtTCPTSReorder|TcpExtTCPFullUndo|TcpExtTCPPartialUndo|TcpExtTCPDSACKUndo|TcpExtTCPDSACKRecvSegs|TcpExtTCPLossProbes|TcpExtTCPTimeouts|TcpExtTCPOFOQueue|TcpExtTCPRcvCollapsed|TcpExtPruneCalled|TcpExtRcvPruned|TcpExtTCPRcvQDrop|TcpExtTCPBacklogCoalesce|TcpExtTCPMemoryPressures|TcpExtTCPToZeroWindowAdv|TcpExtTCPFromZeroWindowAdv|TcpExtTCPWantZeroWindowAdv|TcpExtTCPZeroWindowDrop|TcpExtTCPRcvCoalesce) ' |
		awk '{printf "  %s %s\n", $1, $2}'
done
