# Shared by the benchmark scripts that run each library's processes in
# sessions of their own (collectives.sh, collectives_hosts.sh,
# compression.sh), quiet_run of the A/B scripts over collectives_hosts.sh
# (ab_hosts.sh, tcp_spin.sh), and the two namespace "hosts" of the scripts
# across hosts (veth_hosts, tbf: collectives_hosts.sh,
# compression.sh, tcp_probe.sh). Source it once the script has set
# run_timeout (seconds before one run is killed) and sids=() (the sessions
# still to end on exit), where it uses start and finish.

# kill_session SIG SID: send SIG to every process of session SID.
kill_session() { pkill "-$1" -s "$2" 2>/dev/null || kill "-$1" -- "-$2" 2>/dev/null || true; }

# start OUT ERR CMD...: run CMD in the background in a session of its own,
# killed after run_timeout; its pid (and session) in started.
start() {
	local out=$1 err=$2
	shift 2
	setsid timeout -k 10 "$run_timeout" "$@" </dev/null >"$out" 2>"$err" &
	started=$!
	sids+=("$started")
}

# finish PID...: wait for started commands (ending all when one fails), kill
# what is left of their sessions. Returns the first failure's status.
finish() {
	local rc=0 s p q keep=() left=("$@") got
	# In the order they end (wait -n), so that one failing ends the others
	# at once: waiting in start order once left a gloo rank waiting out its
	# timeout for a peer that had failed to start.
	while ((${#left[@]})); do
		got= s=0
		wait -n -p got "${left[@]}" 2>/dev/null || s=$?
		if [[ -z ${got:-} ]]; then
			# bash has reported the rest killed by a signal ("Killed" on
			# stderr) and dropped them: they can no longer be waited for
			# (wait says "no such job" and leaves got unset). This is how
			# it ends once a caller has ended a finished run's sessions
			# itself (compression.sh); it counts as a failure, which such
			# a caller overrides.
			((rc)) || rc=$((s ? s : 1))
			break
		fi
		if ((s && !rc)); then
			rc=$s
			for q in "$@"; do kill_session TERM "$q"; done
		fi
		keep=()
		for p in "${left[@]}"; do [[ $p == "$got" ]] || keep+=("$p"); done
		left=(${keep[@]+"${keep[@]}"})
	done
	keep=()
	for p in "$@"; do kill_session KILL "$p"; done
	for p in "${sids[@]}"; do [[ " $* " == *" $p "* ]] || keep+=("$p"); done
	sids=(${keep[@]+"${keep[@]}"})
	return "$rc"
}

# quiet_run ERR CMD...: run CMD, its output dropped and its stderr in ERR;
# if it fails, set failed=1 and show the end of ERR on stderr.
quiet_run() {
	local err=$1
	shift
	"$@" >/dev/null 2>"$err" && return
	failed=1
	printf '%s: the run failed; last lines of its stderr:\n' "${0##*/}" >&2
	tail -n 15 "$err" | sed 's/^/    /' >&2
}

# veth_hosts NS0 NS1 DEV0 DEV1 IP0 IP1: two "hosts", network namespaces NS0
# and NS1 joined by a veth pair (DEV0 in NS0, DEV1 in NS1) and nothing else:
# no route to the machine or beyond, so the subnet cannot collide with
# anything. Each end has its address (/24) and is up, and so is each lo.
veth_hosts() {
	local n=("$1" "$2") d=("$3" "$4") a=("$5" "$6") i
	ip netns add "${n[0]}"
	ip netns add "${n[1]}"
	ip link add "${d[0]}" netns "${n[0]}" type veth peer name "${d[1]}" netns "${n[1]}"
	for i in 0 1; do
		ip -n "${n[i]}" addr add "${a[i]}/24" dev "${d[i]}"
		ip -n "${n[i]}" link set lo up
		ip -n "${n[i]}" link set "${d[i]}" up
	done
}

# tbf NS DEV RATE: limit what DEV in namespace NS sends to RATE (such as
# 10gbit) with tc's token bucket, as every benchmark over two hosts does:
# a 1 MB burst, packets queued for up to 10 ms.
tbf() {
	ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$3" burst 1mb latency 10ms
}
