#!/usr/bin/env bash
# The ring over TCP's wait without sleeping (GTRAIN_COMM_SPIN_US) and congestion control (GTRAIN_COMM_TCP_CC) A/B:
# gtrain across two network-namespace hosts (1 rank each, TCP only) with
# the knob at each given value, and Open MPI's tcp btl, interleaved round by
# round through docs/bench/collectives_hosts.sh so that all see the same
# load; the order of the values rotates from round to round.
# Usage: docs/bench/tcp_spin.sh [--no-mpi] [rounds] [min-bytes] [max-bytes]
#   rounds defaults to 3, sizes to 65536 .. 16777216 bytes (factor 2).
# Environment:
#   SPINS   the values to compare (default "0 100"): whole microseconds
#           for GTRAIN_COMM_SPIN_US (0: sleep in poll(2) at once), or
#           "default" (unset: comm.DefaultTCPSpinWait); each may end in
#           :CC, a GTRAIN_COMM_TCP_CC for that run ("200:system" is a 200 µs
#           spin on the host's own congestion control, "200:reno" on reno)
#   GTRAIN  gtrain binary (default: go build ./cmd/gtrain into a temp dir)
#   RATE    "none" (default: the bare veth) or a tc rate such as 10gbit
#   ITERS, WARMUP, RUN_TIMEOUT  passed on to collectives_hosts.sh
#   KEEP    a directory to copy the raw results into
# Prints a markdown table on stdout (medians over rounds of each run's
# median µs, and each value's ratio to the first and to Open MPI); progress
# on stderr. Needs root, as collectives_hosts.sh. Exits 1 if a run failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
argv=("$@")

mpi=() pos=()
for a in "$@"; do
	case $a in
	--no-mpi) mpi=(--no-mpi) ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
	-*) echo "tcp_spin.sh: unknown flag $a (see --help)" >&2 && exit 2 ;;
	*) pos+=("$a") ;;
	esac
done
rounds=${pos[0]:-3} min=${pos[1]:-65536} max=${pos[2]:-16777216}
read -r -a spins <<<"${SPINS:-0 100}"
[[ $rounds =~ ^[0-9]+$ ]] && ((rounds >= 1 && rounds <= 100)) ||
	{ echo "tcp_spin.sh: rounds $rounds: want 1 to 100" >&2 && exit 2; }
((${#spins[@]} >= 1 && ${#spins[@]} <= 8)) || { echo "tcp_spin.sh: SPINS: want 1 to 8 values" >&2 && exit 2; }
for s in "${spins[@]}"; do
	[[ $s =~ ^(default|[0-9]{1,5})(:[a-z0-9_-]{1,15})?$ ]] ||
		{ echo "tcp_spin.sh: SPINS value $s: want whole microseconds or default, then :CC if any" >&2 && exit 2; }
done
log() { printf 'tcp_spin.sh: %s\n' "$*" >&2; }
# quiet_run (docs/bench/lib.sh): see there.
. docs/bench/lib.sh
((EUID == 0)) || { log "needs root: collectives_hosts.sh creates network namespaces (run it with sudo)" && exit 2; }

tmp=$(mktemp -d -t gtrain-tcp-spin.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
ver=${GTRAIN:-}
if [[ -z ${GTRAIN:-} ]]; then
	PATH=$PATH:/usr/local/go/bin
	log "building gtrain"
	go build -o "$tmp/gtrain" ./cmd/gtrain
	GTRAIN=$tmp/gtrain
	ver=$(git describe --always --dirty 2>/dev/null || echo '(no git)')
fi
export GTRAIN PPN=1 RATE=${RATE:-none}

failed=0 n=${#spins[@]}
for ((r = 1; r <= rounds; r++)); do
	for ((k = 0; k < n; k++)); do
		i=$(((k + r - 1) % n)) s=${spins[i]}
		# Open MPI once a round, with the first value run in it.
		peer=(--no-mpi)
		((k == 0)) && peer=(${mpi[@]+"${mpi[@]}"})
		log "round $r of $rounds: $s (load $(cut -d' ' -f1-3 /proc/loadavg))"
		sp=${s%%:*} cc=
		[[ $s == *:* ]] && cc=${s#*:}
		if [[ $sp == default ]]; then
			run=(env -u GTRAIN_COMM_SPIN_US)
		else
			run=(env GTRAIN_COMM_SPIN_US="$sp")
		fi
		if [[ -n $cc ]]; then
			run+=(GTRAIN_COMM_TCP_CC="$cc")
		else
			run=(env -u GTRAIN_COMM_TCP_CC "${run[@]:1}")
		fi
		quiet_run "$tmp/run.err" "${run[@]}" KEEP="$tmp/res/$i/$r" \
			docs/bench/collectives_hosts.sh --no-gloo ${peer[@]+"${peer[@]}"} 1 "$min" "$max"
	done
done
[[ -n ${KEEP:-} ]] && mkdir -p "$KEEP" && cp -r "$tmp/res/." "$KEEP"/

python3 - "$tmp/res" "$min" "$max" "${spins[@]}" <<'PY' || failed=1
import glob, json, os, re, statistics, sys

res, lo, hi, spins = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
prefix = re.compile(r"^\[[^\]]*\] ?")
times = {}  # (variant, coll, size) -> [per-run median µs]; variant: a spins index or "ompi"


def add(v, coll, size, t):
    times.setdefault((v, coll, size), []).append(t)


for path in glob.glob(os.path.join(res, "*", "*", "*")):
    i, name = int(path.split(os.sep)[-3]), os.path.basename(path)
    text = open(path).read()
    try:
        if name.endswith(".node0"):
            doc = json.loads("\n".join(prefix.sub("", l) for l in text.splitlines()))
            for r in doc["results"]:
                t = r["in_place"] if r["collective"] == "all_reduce" else r["out_of_place"]
                add(i, r["collective"], r["size_bytes"], t["time_us"]["median"])
        elif name.endswith(".jsonl"):
            for l in text.splitlines():
                if l.startswith("{"):
                    r = json.loads(l)
                    add("ompi", r["collective"], r["size_bytes"], r["time_us"]["median"])
    except (ValueError, KeyError, TypeError) as e:
        print(f"tcp_spin.sh: {path}: unreadable result ({type(e).__name__}: {e}); left out", file=sys.stderr)


def med(v, coll, size):
    ts = times.get((v, coll, size))
    return statistics.median(ts) if ts else None


def size_name(n):
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def us(t):
    return "–" if t is None else (f"{t:.1f}" if t < 1000 else f"{t:,.0f}")


def ratio(a, b):  # how many times faster b is than a
    return "–" if a is None or b is None else f"{a / b:.2f}x"


label = lambda s: f"spin {s}"
head = ["collective", "size"] + [f"{label(s)} µs" for s in spins] + ["Open MPI µs"]
head += [f"{label(s)} / {label(spins[0])}" for s in spins[1:]] + [f"{label(s)} / OMPI" for s in spins]
print("| " + " | ".join(head) + " |")
print("|---|" + "---:|" * (len(head) - 1))
for coll in ("all_reduce", "reduce_scatter", "all_gather"):
    size = lo
    while size <= hi:
        t = [med(i, coll, size) for i in range(len(spins))]
        o = med("ompi", coll, size)
        cells = [coll, size_name(size)] + [us(x) for x in t] + [us(o)]
        cells += [ratio(t[0], x) for x in t[1:]] + [ratio(o, x) for x in t]
        print("| " + " | ".join(cells) + " |")
        size *= 2
rounds = {i: len(times.get((i, "all_gather", lo), [])) for i in range(len(spins))}
print()
print("Medians over rounds of each run's median time (the slowest rank's per iteration), µs; "
      "a ratio above 1 is faster than what it is compared with. Rounds: "
      + ", ".join(f"{label(s)} {rounds[i]}" for i, s in enumerate(spins))
      + f", Open MPI {len(times.get(('ompi', 'all_gather', lo), []))}.")
PY
# shellcheck disable=SC2016 # the backquotes are markdown
printf '\nReproduce: `SPINS=%q RATE=%s docs/bench/tcp_spin.sh %s` — %s, nproc %s, load %s; gtrain %s\n' \
	"${spins[*]}" "$RATE" "${argv[*]}" "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc)" \
	"$(cut -d' ' -f1-3 /proc/loadavg)" "$ver"
exit "$failed"
