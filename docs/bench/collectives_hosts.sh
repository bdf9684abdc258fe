#!/usr/bin/env bash
# Collectives across hosts: gtrain vs Open MPI over TCP vs PyTorch gloo, on two
# "hosts" made of network namespaces joined by a veth pair, 1 and 2 ranks per
# host, on the bare link and on one limited by tc to resemble a real NIC;
# all three interleaved run by run so that they see the same load.
# Usage: docs/bench/collectives_hosts.sh [--install] [--write] [--no-mpi]
#                                        [--no-gloo] [runs] [min-bytes] [max-bytes]
#   runs defaults to 3, sizes to 65536 .. 67108864 bytes (factor 2); float32
#   sum all-reduce (in place), reduce-scatter and all-gather (out of place); a
#   size is the whole buffer (the reduce-scatter input, the all-gather
#   output). --install first runs apt-get install openmpi-bin libopenmpi-dev
#   python3-torch iproute2; otherwise a peer that is not installed is skipped
#   with a message. --write also puts the tables into docs/benchmarks.md,
#   between its collectives-hosts:begin/end markers. Needs root (namespaces).
# Environment:
#   GTRAIN        gtrain binary (default: go build ./cmd/gtrain into a temp dir)
#   RATE          the limited link's rate, for tc's tbf on both ends (default
#                 10gbit); "none" runs the bare link only
#   BARE          0: leave out the bare link (runs the limited one only;
#                 default 1)
#   PPN           ranks per host to run (default "1 2")
#   ITERS         timed iterations per size (default 100 with 1 rank per host,
#                 20 with more: on 2 cores Open MPI's oversubscribed ranks
#                 take up to 0.4 s a call)
#   WARMUP        warm-up iterations per size (default 100 with 1 rank per
#                 host, 5 with more: the first tens of calls on fresh
#                 connections are warm-up, docs/benchmarks.md)
#   TORCH_PYTHON  a python with torch (default /usr/bin/python3)
#   RUN_TIMEOUT   seconds before one run of one library is killed (default 900)
#   KEEP          a directory to copy the raw results into
#   PIN           1: every process of host I runs on CPU I (taskset), as on
#                 real hosts, whose cores are their own; default 0 (the
#                 kernel places them, and both hosts share every core)
# How each library reaches both namespaces: gtrain runs once per host in
# per-node mode (gtrain run --nnodes 2 --node-rank I, the rendezvous on host
# 0), the ranks of a host sharing memory; mpirun runs on host 0 and starts its
# daemon on host 1 through an rsh agent that is `ip netns exec` (btl
# self,tcp, and vader within a host with 2 ranks, as gtrain's shared memory);
# gloo's ranks start in their namespaces, meeting over tcp:// on host 0.
# Every process of a host runs in a UTS namespace of its own (hostname h0,
# h1), so that no library takes the two for one machine.
# Prints markdown tables on stdout and progress on stderr. Exits 1 if any run
# failed. The namespaces and everything in them are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
argv=("$@")

install=0 write=0 want_mpi=1 want_gloo=1 pos=()
for a in "$@"; do
	case $a in
	--install) install=1 ;;
	--write) write=1 ;;
	--no-mpi) want_mpi=0 ;;
	--no-gloo) want_gloo=0 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
	-*) echo "collectives_hosts.sh: unknown flag $a (see --help)" >&2 && exit 2 ;;
	*) pos+=("$a") ;;
	esac
done
runs=${pos[0]:-3} min=${pos[1]:-65536} max=${pos[2]:-67108864}
rate=${RATE:-10gbit} ppns=${PPN:-1 2} iters=${ITERS:-20} warmup=${WARMUP:-5}
# iterations PPN: set iters and warmup for runs with PPN ranks per host.
iterations() {
	iters=${ITERS:-$(($1 == 1 ? 100 : 20))} warmup=${WARMUP:-$(($1 == 1 ? 100 : 5))}
}
pin=${PIN:-0}
[[ $pin == 0 || $pin == 1 ]] || { echo "collectives_hosts.sh: PIN $pin: want 0 or 1" >&2 && exit 2; }
# pinned[I]: the prefix that runs a command on host I's CPU (empty unless PIN=1).
pinned=("" "")
((pin)) && pinned=("taskset -c 0" "taskset -c $(($(nproc) > 1 ? 1 : 0))")
torch_py=${TORCH_PYTHON:-/usr/bin/python3} run_timeout=${RUN_TIMEOUT:-900}
for v in "$runs" "$min" "$max" "$warmup" "$run_timeout" $ppns "$iters"; do
	[[ $v =~ ^[0-9]+$ ]] || { echo "collectives_hosts.sh: not a number: $v" >&2 && exit 2; }
done
for v in $ppns; do ((v >= 1 && v <= 8)) || { echo "collectives_hosts.sh: PPN $v: want 1 to 8 ranks per host" >&2 && exit 2; }; done
((runs >= 1 && runs <= 100 && iters >= 1 && iters <= 100000 && min >= 64 && min % 64 == 0 && max >= min && max <= 1 << 30)) ||
	{ echo "collectives_hosts.sh: want 1 <= runs <= 100, 1 <= ITERS <= 100000 and 64 <= min-bytes <= max-bytes <= 1 GiB, min a multiple of 64" >&2 && exit 2; }
[[ $rate == none || $rate =~ ^[0-9]+[kmg]?bit$ ]] || { echo "collectives_hosts.sh: RATE $rate: want e.g. 10gbit, or none" >&2 && exit 2; }
bare=${BARE:-1}
[[ $bare == 1 || ($bare == 0 && $rate != none) ]] || { echo "collectives_hosts.sh: BARE $bare: want 1, or 0 with a RATE" >&2 && exit 2; }
py=$(command -v python3)

log() { printf 'collectives_hosts.sh: %s\n' "$*" >&2; }

((EUID == 0)) || { log "needs root: it creates network namespaces (run it with sudo)" && exit 2; }
if ((install)); then
	DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev python3-torch iproute2
fi
for c in ip tc unshare setsid timeout; do
	command -v "$c" >/dev/null || { log "needs $c (apt-get install iproute2 util-linux coreutils)" && exit 2; }
done

# --- the hosts ----------------------------------------------------------------
# Two namespaces, one veth pair between them and nothing else: no route to
# the machine or beyond, so the subnet cannot collide with anything.
tag=gtbh$$
ns=("$tag-0" "$tag-1") dev=("$tag-0" "$tag-1")
net=10.213.$(($$ % 200 + 20))
ip_of=("$net.1" "$net.2")
tmp=$(mktemp -d -t gtrain-collectives-hosts.XXXXXX)
sids=()
# kill_session, start, finish, veth_hosts and tbf (docs/bench/lib.sh): see there.
. docs/bench/lib.sh
# shellcheck disable=SC2317 # invoked by the trap
cleanup() {
	local rc=$? p n
	trap - EXIT INT TERM
	for p in "${sids[@]}"; do kill_session KILL "$p"; done
	for n in "${ns[@]}"; do
		if ip netns list | grep -qw "$n"; then
			for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
			ip netns del "$n" 2>/dev/null || log "could not delete namespace $n: delete it with ip netns del $n"
		fi
	done
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

veth_hosts "${ns[@]}" "${dev[@]}" "${ip_of[@]}"
# What a frame of the link carries, for the tables' "of the link" column:
# the MTU, and whether TCP adds its 12-byte timestamp option to every
# segment (a namespace's own setting; on by default).
mtu=$(ip netns exec "${ns[0]}" cat "/sys/class/net/${dev[0]}/mtu")
tstamps=$(ip netns exec "${ns[0]}" sysctl -n net.ipv4.tcp_timestamps)

# on I CMD...: run CMD on host I (its namespace, its own hostname hI).
on() {
	local i=$1
	shift
	ip netns exec "${ns[i]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "h$i" "$@"
}

# limit RATE|none: set or remove the rate limit on both ends of the link.
limit() {
	local i
	for i in 0 1; do
		ip netns exec "${ns[i]}" tc qdisc del dev "${dev[i]}" root 2>/dev/null || true
		[[ $1 == none ]] || tbf "${ns[i]}" "${dev[i]}" "$1"
	done
}

failed=0
report() { # NAME RC ERRFILE
	failed=1
	log "$1 failed (exit $2); last lines of its stderr:"
	tail -n 15 "$3" | sed 's/^/    /' >&2
}

# --- what is there -------------------------------------------------------------
gtrain_ver=
if [[ -z ${GTRAIN:-} ]]; then
	PATH=$PATH:/usr/local/go/bin
	log "building gtrain"
	go build -o "$tmp/gtrain" ./cmd/gtrain
	GTRAIN=$tmp/gtrain
	gtrain_ver="gtrain $(git -C "$repo" describe --always --dirty 2>/dev/null || echo '(no git)')"
else
	gtrain_ver="gtrain $GTRAIN"
fi
mpi_ver=
if ((want_mpi)); then
	if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
		mpicc -O2 -o "$tmp/collectives_mpi" docs/bench/peers/collectives_mpi.c
		mpi_ver=$(mpirun --version 2>/dev/null | head -n 1 | sed 's/^mpirun (\(.*\)) /\1 /')
		# mpirun's rsh agent: "run CMD on HOST" is: run it on that host.
		cat >"$tmp/nsrsh" <<EOF
#!/bin/sh
host=\$1
shift
i=0
[ "\$host" = "${ip_of[1]}" ] && i=1
exec ${pinned[1]:+taskset -c \$((\$i % $(nproc)))} ip netns exec "$tag-\$i" unshare --uts sh -c "hostname h\$i && \$*"
EOF
		chmod +x "$tmp/nsrsh"
	else
		log "skipping Open MPI: mpicc/mpirun not found (apt-get install openmpi-bin libopenmpi-dev, or --install)"
		want_mpi=0
	fi
fi
gloo_ver=
if ((want_gloo)); then
	if gloo_ver=$("$torch_py" -c 'import sys, torch, torch.distributed as d
assert d.is_available() and d.is_gloo_available()
print("torch %s gloo, Python %d.%d" % (torch.__version__, *sys.version_info[:2]))' 2>/dev/null); then
		:
	else
		log "skipping gloo: $torch_py cannot import torch with gloo (apt-get install python3-torch, or --install)"
		want_gloo=0
	fi
fi

# --- the runs --------------------------------------------------------------------
res=$tmp/res
mkdir -p "$res"
# Below the kernel's ephemeral ports (32768 up), which a connection made
# in a namespace may hold: gloo's store once failed to bind one.
port=$((20000 + $$ % 10000))
secret=$(head -c 24 /dev/urandom | base64)

run_gtrain() { # NAME PPN RUN
	local i pids=() rc=0
	port=$((port + 1))
	for i in 0 1; do
		start "$res/$1.gtrain.$3.node$i" "$tmp/gtrain.$i.err" env GTRAIN_RDZV_SECRET="$secret" \
			${pinned[i]} ip netns exec "${ns[i]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "h$i" \
			"$GTRAIN" run --nnodes 2 --node-rank "$i" --rdzv-endpoint "${ip_of[0]}:$port" \
			--rdzv-id "$tag-$1-$3" --local-addr "${ip_of[i]}" --nproc-per-node "$2" -- \
			"$GTRAIN" bench collectives --collectives all_reduce,reduce_scatter,all_gather \
			--dtype float32 --op sum --min-bytes "$min" --max-bytes "$max" --iters "$iters" \
			--warmup "$warmup" --output json
		pids+=("$started")
	done
	wait_report "$res/$1.gtrain.$3.node0" "${pids[@]}"
	finish "${pids[@]}" || rc=$?
	((rc == 0 || ended)) || report "gtrain $1 run $3" "$rc" "$tmp/gtrain.0.err"
}

# wait_report FILE PID...: wait for the per-node launchers; once FILE holds
# rank 0's whole report (the JSON document's last line), give them 10 s more
# to exit, then end them and set ended. A backstop from before per-node mode
# was finished, when launchers were seen staying in their attempt loop after
# their ranks had exited (the zombie seen then is the exited agent, which the
# launcher reaps only once the attempt ends). Issue 18 found no such hang in
# 380 per-node jobs of the finished code (50 of them this script's), only one
# while etcd is gone for good, which now ends in a bounded error; a launcher
# legitimately takes up to two heartbeats (10 s at the default 5 s) to exit.
wait_report() {
	local file=$1 p alive deadline=
	shift
	ended=0
	while :; do
		alive=0
		for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
		((alive)) || return 0
		[[ -z $deadline ]] && grep -q '^\[[^]]*\] }$' "$file" && deadline=$((SECONDS + 10))
		if [[ -n $deadline ]] && ((SECONDS >= deadline)); then
			log "gtrain run stayed 10 s after its ranks' report was complete: ending it"
			for p in "$@"; do kill_session KILL "$p"; done
			ended=1
			return 0
		fi
		sleep 1
	done
}

run_mpi() { # NAME PPN RUN
	local rc=0 btl=self,tcp
	((${2} > 1)) && btl=self,vader,tcp
	# shellcheck disable=SC2054 # the commas belong to the options
	start "$res/$1.ompi.$3.jsonl" "$tmp/mpi.err" \
		${pinned[0]} ip netns exec "${ns[0]}" unshare --uts sh -c 'hostname h0 && exec "$@"' sh \
		mpirun --allow-run-as-root --oversubscribe --bind-to none \
		--host "${ip_of[0]}:$2,${ip_of[1]}:$2" -np $((2 * $2)) \
		--mca plm_rsh_agent "$tmp/nsrsh" --mca btl "$btl" \
		--mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
		"$tmp/collectives_mpi" "$min" "$max" "$iters" "$warmup"
	finish "$started" || rc=$?
	((rc == 0)) || report "Open MPI $1 run $3" "$rc" "$tmp/mpi.err"
}

run_gloo() { # NAME PPN RUN
	local r host pids=() rc=0 world=$((2 * $2))
	port=$((port + 1))
	for ((r = world - 1; r >= 0; r--)); do
		host=$((r / $2))
		start "$([[ $r == 0 ]] && echo "$res/$1.gloo.$3.jsonl" || echo /dev/null)" "$tmp/gloo.$r.err" \
			env RANK=$r WORLD_SIZE=$world GLOO_SOCKET_IFNAME="${dev[host]}" OMP_NUM_THREADS=1 \
			${pinned[host]} ip netns exec "${ns[host]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "h$host" \
			"$torch_py" docs/bench/peers/collectives_gloo.py "$min" "$max" --iters "$iters" \
			--warmup "$warmup" --init-method "tcp://${ip_of[0]}:$port"
		pids+=("$started")
	done
	finish "${pids[@]}" || rc=$?
	((rc == 0)) || report "gloo $1 run $3" "$rc" "$tmp/gloo.0.err"
}

links=()
((bare)) && links+=(none)
[[ $rate != none ]] && links+=("$rate")
t0=$SECONDS
for link in "${links[@]}"; do
	limit "$link"
	for ppn in $ppns; do
		iterations "$ppn"
		name=$([[ $link == none ]] && echo veth || echo "$link").x$ppn
		for ((run = 1; run <= runs; run++)); do
			log "$name: run $run of $runs ($((SECONDS - t0)) s so far; load $(cut -d' ' -f1-3 /proc/loadavg))"
			# The libraries in turn, reversed every other run: on a VM whose
			# speed drifts over minutes none is always first or last.
			order=(gtrain mpi gloo)
			((run % 2)) || order=(gloo mpi gtrain)
			for lib in "${order[@]}"; do
				case $lib in
				gtrain) run_gtrain "$name" "$ppn" "$run" ;;
				mpi) ((want_mpi)) && run_mpi "$name" "$ppn" "$run" ;;
				gloo) ((want_gloo)) && run_gloo "$name" "$ppn" "$run" ;;
				esac
			done
		done
	done
done
log "done in $((SECONDS - t0)) s"
if [[ -n ${KEEP:-} ]]; then mkdir -p "$KEEP" && cp "$res"/* "$KEEP"/; fi

# --- the tables --------------------------------------------------------------------
cmd=docs/bench/collectives_hosts.sh
((${#argv[@]})) && cmd+=" ${argv[*]}"
for v in RATE BARE PPN ITERS WARMUP PIN TORCH_PYTHON; do [[ -n ${!v:-} ]] && cmd="$v='${!v}' $cmd"; done
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
versions=("$gtrain_ver (gtrain run per node, rendezvous on h0)")
((want_mpi)) && versions+=("$mpi_ver (mpirun on h0, plm_rsh_agent ip netns exec, --bind-to none, btl self,tcp; self,vader,tcp with 2 ranks per host; btl_tcp_if_include the veth)")
((want_gloo)) && versions+=("$gloo_ver (GLOO_SOCKET_IFNAME the veth)")
info=$(printf '%s; ' "${versions[@]}")
{
"$py" - "$res" "$min" "$max" "$rate" "$mtu" "$tstamps" <<'PY' || failed=1
import glob, json, os, re, statistics, sys

sys.dont_write_bytecode = True  # no __pycache__ in the tree
sys.path.insert(0, "docs/bench")
from stats import median_ci

res, lo, hi, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mtu, tstamps = int(sys.argv[5]), sys.argv[6] != "0"
times, wrong = {}, {}  # times[(setup, coll, size, peer)][run] = per-run median µs
means = {}  # the same for the per-run mean µs, where the library reports it
prefix = re.compile(r"^\[[^\]]*\] ?")


def add(setup, peer, run, coll, size, stats, bad):
    times.setdefault((setup, coll, size, peer), {})[run] = stats["median"]
    if "mean" in stats:
        means.setdefault((setup, coll, size, peer), {})[run] = stats["mean"]
    wrong[(setup, coll, size, peer)] = wrong.get((setup, coll, size, peer), 0) + bad


for path in sorted(glob.glob(os.path.join(res, "*"))):
    m = re.match(r"^(.*)\.(gtrain|ompi|gloo)\.(\d+)\.(node0|node1|jsonl)$", os.path.basename(path))
    if not m or m.group(4) == "node1":
        continue
    setup, peer, run = m.group(1), m.group(2), m.group(3)
    text = open(path).read()
    try:
        if peer == "gtrain":
            doc = json.loads("\n".join(prefix.sub("", l) for l in text.splitlines()))
            for r in doc["results"]:
                t = r["in_place"] if r["collective"] == "all_reduce" else r["out_of_place"]
                add(setup, peer, run, r["collective"], r["size_bytes"], t["time_us"], t.get("wrong", 0))
        else:
            for l in text.splitlines():
                if l.startswith("{"):
                    r = json.loads(l)
                    add(setup, peer, run, r["collective"], r["size_bytes"], r["time_us"], r.get("wrong", 0))
    except (ValueError, KeyError, TypeError) as e:
        print(f"collectives_hosts.sh: {peer} {setup} run {run}: unreadable result ({type(e).__name__}: {e}); left out",
              file=sys.stderr)


def med(setup, coll, size, peer, of=times):
    runs = of.get((setup, coll, size, peer))
    return statistics.median(runs.values()) if runs else None


def ratios(setup, coll, size, of=times):
    """Each run's Open MPI time over the same run's gtrain time: what moves
    a whole run (this VM's speed drifts over minutes) moves both."""
    g, o = of.get((setup, coll, size, "gtrain"), {}), of.get((setup, coll, size, "ompi"), {})
    return [o[r] / g[r] for r in g if r in o and g[r] > 0]


def paired(setup, coll, size, of=times):
    rs = ratios(setup, coll, size, of)
    if not rs:
        return "–"
    m, a, b, ci = median_ci(rs)
    return f"{m:.2f}x ({'CI ' if ci else ''}{a:.2f}-{b:.2f})"


def verdict(setup, coll, size):
    """ahead, level or behind: where the confidence interval of the per-run
    ratio of mean times (of median times where a peer reports no mean) lies
    against 1; None below 6 runs."""
    rs = ratios(setup, coll, size, means) or ratios(setup, coll, size)
    if len(rs) < 6:
        return None
    _, a, b, _ = median_ci(rs)
    return "ahead" if a > 1 else "behind" if b < 1 else "level"


def link_payload(setup):
    """Bytes a second of payload that the tc-limited link can carry: tbf
    counts every frame with its Ethernet header, and each carries at most
    MTU - 40 (IP and TCP headers) - 12 (timestamps) bytes of a stream.
    None for the bare link, or a rate this cannot read."""
    m = re.fullmatch(r"(\d+)([kmg]?)bit", setup.split(".x")[0])
    if not m:
        return None
    bits = int(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return bits / 8 * (mtu - 40 - (12 if tstamps else 0)) / (mtu + 14)


def link_share(setup, coll, size, peer, p, ceiling):
    """peer's busbw by the median over runs of its mean time, as a share of
    the link's payload rate (ceiling, bytes a second)."""
    m = med(setup, coll, size, peer, means)
    return "–" if m is None else f"{busbw(coll, size, m, p) * 1e9 / ceiling:.1%}"


def size_name(n):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def f_time(t, bad):
    if t is None:
        return "–"
    return (f"{t:.1f}" if t < 1000 else f"{t:,.0f}") + (" WRONG" if bad else "")


def busbw(coll, size, t, p):
    return size / (t * 1e-6) / 1e9 * (2 if coll == "all_reduce" else 1) * (p - 1) / p


setups = sorted({k[0] for k in times}, key=lambda s: (s.split(".x")[0] != "veth", s))
for setup in setups:
    p = 2 * int(setup.rsplit(".x", 1)[1])
    link = "veth, no limit" if setup.startswith("veth") else f"veth limited to {setup.split('.x')[0]} (tc tbf)"
    nruns = {peer: len({r for k, v in times.items() if k[0] == setup and k[3] == peer for r in v})
             for peer in ("gtrain", "ompi", "gloo")}
    print(f"**2 hosts × {p // 2} rank{'s' if p > 2 else ''}, {link}** (runs: "
          + ", ".join(f"{k} {v}" for k, v in nruns.items() if v) + ")")
    print()
    ceiling = link_payload(setup) if p == 2 else None
    print("| collective | size | gtrain µs | busbw GB/s | Open MPI µs | busbw | gloo µs | busbw "
          "| gtrain / OMPI (busbw) | per run: median (range) | mean time: OMPI / gtrain "
          "| mean time per run: median (range) | of the link: gtrain, OMPI | gtrain / gloo |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    tally = {}
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        size = lo
        while size <= hi:
            t = {peer: med(setup, coll, size, peer) for peer in ("gtrain", "ompi", "gloo")}
            cells = []
            for peer in ("gtrain", "ompi", "gloo"):
                cells.append(f_time(t[peer], wrong.get((setup, coll, size, peer))))
                cells.append("–" if t[peer] is None else f"{busbw(coll, size, t[peer], p):.2f}")
            ratio = lambda a, b: "–" if a is None or b is None else f"{a / b:.2f}x"
            link = "–"
            if ceiling:
                link = ", ".join(link_share(setup, coll, size, peer, p, ceiling) for peer in ("gtrain", "ompi"))
            print(f"| {coll} | {size_name(size)} | " + " | ".join(cells)
                  + f" | {ratio(t['ompi'], t['gtrain'])} | {paired(setup, coll, size)}"
                  + f" | {ratio(med(setup, coll, size, 'ompi', means), med(setup, coll, size, 'gtrain', means))}"
                  + f" | {paired(setup, coll, size, means)} | {link}"
                  + f" | {ratio(t['gloo'], t['gtrain'])} |")
            v = verdict(setup, coll, size)
            if v:
                tally.setdefault(v, []).append(f"{coll} {size_name(size)}")
            size *= 2
    print()
    if tally:
        print("Against Open MPI, by the 95% interval of the per-run ratio of mean times: "
              + "; ".join(f"{v} at {len(tally[v])} of {sum(map(len, tally.values()))} sizes"
                          + ("" if v == "ahead" else f" ({', '.join(tally[v])})")
                          for v in ("ahead", "level", "behind") if v in tally) + ".")
        print()
print("Medians over runs of each run's median time (the slowest rank's per iteration). "
      "busbw = size/time · 2(p−1)/p for all-reduce, · (p−1)/p for reduce-scatter and all-gather; "
      "a size is the whole buffer. Per run: each run's Open MPI time over its gtrain time, the median "
      "and range over runs (the libraries run in turn, the order reversed every other run). "
      "Mean time: the median over runs of each run's mean time per call (nccl-tests' statistic), Open MPI's "
      "over gtrain's: on the rate-limited link, where bursts may beat the rate, the median favours "
      "the library whose few slow calls pay for many fast ones. "
      "Mean time per run: each run's Open MPI mean time per call over its gtrain one. "
      "From 6 runs up, \"CI\" marks a distribution-free interval of at least 95% for the median "
      "(sign-test order statistics) in place of the range; a size is ahead or behind where that interval "
      "of the mean times lies above or below 1, level where it holds 1. "
      "Of the link (1 rank per host on a limited link): busbw from the median over runs of each run's mean time, "
      f"over the payload a TCP stream can carry at that rate (frames of MTU {mtu}, each counted by tbf with its "
      f"14-byte Ethernet header and carrying MTU − {52 if tstamps else 40} bytes of payload). "
      "gloo has no reduce-scatter in this torch (–).")
PY
# shellcheck disable=SC2016 # the backquotes are markdown
printf '\nReproduce: `%s` — %s, nproc %s, %s, load %s; %s\n' "$cmd" "$(date -u +%Y-%m-%dT%H:%MZ)" \
	"$(nproc)" "$cpu" "$(cut -d' ' -f1-3 /proc/loadavg)" "${info%; }"
} >"$tmp/table.md"
cat "$tmp/table.md"

if ((write)); then
	"$py" docs/bench/write_section.py collectives-hosts "$tmp/table.md" docs/benchmarks.md &&
		log "wrote the tables into docs/benchmarks.md" || failed=1
fi
exit "$failed"
