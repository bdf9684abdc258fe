# Shared by the benchmark scripts that run each library's processes in
# sessions of their own (collectives.sh, collectives_hosts.sh,
# compression.sh), and quiet_run of the A/B scripts over
# collectives_hosts.sh (ab_hosts.sh, tcp_spin.sh). Source it once the
# script has set run_timeout (seconds before one run is killed) and sids=()
# (the sessions still to end on exit), where it uses start and finish.

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
