#!/usr/bin/env bash
# All-reduce: gtrain vs Open MPI vs PyTorch gloo, 2 ranks on this machine,
# interleaved run by run so that all three see the same load.
# Usage: docs/bench/collectives.sh [--install] [--write] [--no-gtrain] [--no-mpi]
#                                  [--no-gloo] [runs] [min-bytes] [max-bytes]
#   runs defaults to 5, sizes to 4096 .. 268435456 bytes (factor 2); float32,
#   sum, in place. --install first runs apt-get install openmpi-bin
#   libopenmpi-dev python3-torch; otherwise a library that is not installed
#   is skipped with a message. --write also puts the table into
#   docs/benchmarks.md, between its collectives:begin/end markers.
# Environment:
#   GTRAIN        gtrain binary (default: go build ./cmd/gtrain into a temp dir)
#   ITERS         timed iterations per size (default clamp(2^29/size, 20, 1000))
#   WARMUP        warm-up iterations per size (default 5)
#   OMPI_COPY     btl_vader_single_copy_mechanism values to run Open MPI with;
#                 the faster per size is reported (default "none cma")
#   TORCH_PYTHON  a python with torch (default /usr/bin/python3)
#   RUN_TIMEOUT   seconds before one run of one library is killed (default 900)
#   KEEP          a directory to copy the raw JSON results into
# Prints a markdown table on stdout (median over runs of each run's median
# time per size) and progress on stderr. Exits 1 if any run failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
argv=("$@")
gtrain_env=${GTRAIN:-}

install=0 write=0 want_gtrain=1 want_mpi=1 want_gloo=1 pos=()
for a in "$@"; do
	case $a in
	--install) install=1 ;;
	--write) write=1 ;;
	--no-gtrain) want_gtrain=0 ;;
	--no-mpi) want_mpi=0 ;;
	--no-gloo) want_gloo=0 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
	-*) echo "collectives.sh: unknown flag $a (see --help)" >&2 && exit 2 ;;
	*) pos+=("$a") ;;
	esac
done
runs=${pos[0]:-5} min=${pos[1]:-4096} max=${pos[2]:-268435456}
iters_env=${ITERS:-} warmup=${WARMUP:-5} ompi_copy=${OMPI_COPY:-none cma}
torch_py=${TORCH_PYTHON:-/usr/bin/python3} run_timeout=${RUN_TIMEOUT:-900}
for v in "$runs" "$min" "$max" "$warmup" "$run_timeout" ${iters_env:+"$iters_env"}; do
	[[ $v =~ ^[0-9]+$ ]] || { echo "collectives.sh: not a number: $v" >&2 && exit 2; }
done
((runs >= 1 && min >= 4 && min % 4 == 0 && max >= min)) ||
	{ echo "collectives.sh: want runs >= 1 and 4 <= min-bytes <= max-bytes, min a multiple of 4" >&2 && exit 2; }
py=$(command -v python3) # any python3 for the JSON; the peer needs $torch_py

log() { printf 'collectives.sh: %s\n' "$*" >&2; }

if ((install)); then
	sudo=()
	((EUID == 0)) || sudo=(sudo)
	"${sudo[@]}" apt-get update
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev python3-torch
fi

# Every library run is started in a session of its own (setsid) under
# timeout; signalling the session ends it and whatever it forked (mpirun puts
# each rank in a process group of its own, but they stay in its session). The
# trap signals the sessions still listed, on any exit.
tmp=$(mktemp -d -t gtrain-collectives.XXXXXX)
sids=()
# kill_session, start and finish (docs/bench/lib.sh): see there.
. docs/bench/lib.sh
# shellcheck disable=SC2317 # invoked by the trap
cleanup() {
	local rc=$? p
	trap - EXIT INT TERM
	for p in "${sids[@]}"; do kill_session TERM "$p"; done
	if ((${#sids[@]})); then
		sleep 1
		for p in "${sids[@]}"; do kill_session KILL "$p"; done
	fi
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

failed=0
# report NAME RC ERRFILE: say that a run failed and show the end of its stderr.
report() {
	failed=1
	log "$1 failed (exit $2); last lines of its stderr:"
	tail -n 15 "$3" | sed 's/^/    /' >&2
}

# --- what is there -----------------------------------------------------------
gtrain_ver=
if ((want_gtrain)); then
	if [[ -z ${GTRAIN:-} ]]; then
		PATH=$PATH:/usr/local/go/bin
		if command -v go >/dev/null; then
			log "building gtrain"
			if go build -o "$tmp/gtrain" ./cmd/gtrain 2>"$tmp/build.err"; then
				GTRAIN=$tmp/gtrain
				gtrain_ver="gtrain $(git -C "$repo" describe --always --dirty 2>/dev/null || echo '(no git)')"
			else
				report "skipping gtrain: go build ./cmd/gtrain" 1 "$tmp/build.err"
				want_gtrain=0
			fi
		else
			log "skipping gtrain: no go toolchain (set GTRAIN to a gtrain binary)"
			want_gtrain=0
		fi
	else
		gtrain_ver="gtrain $GTRAIN"
	fi
	if ((want_gtrain)) && ! "$GTRAIN" bench collectives --help >/dev/null 2>&1; then
		log "skipping gtrain: '$GTRAIN bench collectives' does not exist in this build"
		want_gtrain=0
	fi
fi
mpi_ver=
if ((want_mpi)); then
	if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
		mpicc -O2 -o "$tmp/allreduce_mpi" docs/bench/peers/allreduce_mpi.c
		mpi_ver=$(mpirun --version 2>/dev/null | head -n 1 | sed 's/^mpirun (\(.*\)) /\1 /')
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
((want_gtrain + want_mpi + want_gloo)) || { log "nothing to run" && exit 1; }

# --- the runs ----------------------------------------------------------------
iters_for() { # the same default as the peers': clamp(2^29/size, 20, 1000)
	local n=$(((1 << 29) / $1))
	((n < 20)) && n=20
	((n > 1000)) && n=1000
	echo $((${iters_env:-$n}))
}
# gtrain takes one --iters per call: call it once per run of sizes with the
# same iteration count (bands are "min max iters").
bands=() s=$min
while ((s <= max)); do
	n=$(iters_for "$s")
	if ((${#bands[@]})) && [[ ${bands[-1]##* } == "$n" ]]; then
		read -r b0 _ _ <<<"${bands[-1]}"
		bands[-1]="$b0 $s $n"
	else
		bands+=("$s $s $n")
	fi
	s=$((s * 2))
done

res=$tmp/res
mkdir -p "$res"
peer_iters=()
[[ -n $iters_env ]] && peer_iters=("$iters_env" "$warmup")
[[ -z $iters_env && $warmup != 5 ]] && peer_iters=(0 "$warmup")
# shellcheck disable=SC2054 # the commas belong to --mca btl
mpirun_base=(mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to none --mca btl self,vader)

run_gtrain() { # RUN
	local b lo hi n rc
	for b in "${bands[@]}"; do
		read -r lo hi n <<<"$b"
		start "$res/gtrain.$1.$lo.json" "$tmp/gtrain.err" "$GTRAIN" bench collectives \
			--nproc-per-node 2 --collectives all_reduce --dtype float32 --op sum \
			--min-bytes "$lo" --max-bytes "$hi" --step-factor 2 --iters "$n" --warmup "$warmup" --output json
		rc=0 && finish "$started" || rc=$?
		((rc == 0)) || { report "gtrain run $1 ($lo..$hi bytes)" "$rc" "$tmp/gtrain.err" && rm -f "$res/gtrain.$1.$lo.json"; }
	done
}

run_mpi() { # RUN COPY
	local rc=0
	start "$res/ompi-$2.$1.json" "$tmp/mpi.err" "${mpirun_base[@]}" \
		--mca btl_vader_single_copy_mechanism "$2" "$tmp/allreduce_mpi" "$min" "$max" ${peer_iters[@]+"${peer_iters[@]}"}
	finish "$started" || rc=$?
	((rc == 0)) || { report "Open MPI ($2) run $1" "$rc" "$tmp/mpi.err" && rm -f "$res/ompi-$2.$1.json"; }
}

run_gloo() { # RUN
	local r pids=() rc=0 args=("$min" "$max")
	((${#peer_iters[@]})) && args+=(--iters "${peer_iters[0]}" --warmup "${peer_iters[1]}")
	# A file store instead of MASTER_PORT: no port to pick or collide with.
	args+=(--init-method "file://$tmp/gloo-store.$1")
	for r in 1 0; do
		start "$([[ $r == 0 ]] && echo "$res/gloo.$1.json" || echo /dev/null)" "$tmp/gloo.$r.err" \
			env RANK=$r WORLD_SIZE=2 GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 \
			"$torch_py" docs/bench/peers/allreduce_gloo.py "${args[@]}"
		pids+=("$started")
	done
	# If one rank dies the other blocks in gloo until its timeout: finish
	# ends both.
	finish "${pids[@]}" || rc=$?
	((rc == 0)) || { report "gloo run $1" "$rc" "$tmp/gloo.0.err" && rm -f "$res/gloo.$1.json"; }
}

t0=$SECONDS
for ((run = 1; run <= runs; run++)); do
	log "run $run of $runs ($((SECONDS - t0)) s so far)"
	((want_gtrain)) && run_gtrain "$run"
	if ((want_mpi)); then
		for c in $ompi_copy; do run_mpi "$run" "$c"; done
	fi
	((want_gloo)) && run_gloo "$run"
done
log "done in $((SECONDS - t0)) s"
if [[ -n ${KEEP:-} ]]; then mkdir -p "$KEEP" && cp "$res"/*.json "$KEEP"/; fi

# --- the table ---------------------------------------------------------------
cmd=docs/bench/collectives.sh
((${#argv[@]})) && cmd+=" ${argv[*]}"
for v in ITERS WARMUP OMPI_COPY TORCH_PYTHON; do [[ -n ${!v:-} ]] && cmd="$v='${!v}' $cmd"; done
[[ -n $gtrain_env ]] && cmd="GTRAIN='$gtrain_env' $cmd"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
versions=()
[[ -n $gtrain_ver ]] && ((want_gtrain)) && versions+=("$gtrain_ver")
((want_mpi)) && versions+=("$mpi_ver (${mpirun_base[*]:1} --mca btl_vader_single_copy_mechanism {${ompi_copy// /,}}, faster per size)")
((want_gloo)) && versions+=("$gloo_ver (GLOO_SOCKET_IFNAME=lo)")
info=$(printf '%s; ' "${versions[@]}")
{
"$py" - "$res" "$min" "$max" "$ompi_copy" <<'PY' || failed=1
import glob, json, os, statistics, sys

res, lo, hi, copies = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
times, wrong, world = {}, {}, 2  # times[peer][size][run] = per-run median µs


def add(peer, run, size, t_us, bad):
    times.setdefault(peer, {}).setdefault(size, {})[run] = t_us
    wrong[(peer, size)] = wrong.get((peer, size), 0) + bad


def load(path, peer, run):
    global world
    text = open(path).read()
    if peer == "gtrain":
        doc = json.loads(text)
        world = doc.get("world_size", world)
        for r in doc["results"]:
            if r["collective"] == "all_reduce":
                ip = r["in_place"]
                add(peer, run, r["size_bytes"], ip["time_us"]["median"], ip.get("wrong", 0))
        return
    for line in text.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            add(peer, run, r["size_bytes"], r["time_us"]["median"], r.get("wrong", 0))


bad = 0
for path in sorted(glob.glob(os.path.join(res, "*.json"))):
    peer, run = os.path.basename(path).split(".")[:2]
    try:
        load(path, peer, run)
    except (ValueError, KeyError, TypeError) as e:
        bad = 1
        print(f"collectives.sh: {peer} run {run}: unreadable result ({type(e).__name__}: {e}); left out",
              file=sys.stderr)


def med(peer, size):
    runs = times.get(peer, {}).get(size)
    return statistics.median(runs.values()) if runs else None


def busbw(size, t):
    return size / (t * 1e-6) / 1e9 * 2 * (world - 1) / world


def size_name(n):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def f_time(peer, t, size):
    if t is None:
        return "–"
    s = f"{t:.1f}" if t < 1000 else f"{t:,.0f}"
    return s + (" WRONG" if wrong.get((peer, size)) else "")


def f_bw(size, t):
    return "–" if t is None else f"{busbw(size, t):.2f}"


def f_ratio(a, b):
    return "–" if a is None or b is None else f"{a / b:.2f}x"


nruns = {p: len({r for s in v.values() for r in s}) for p, v in times.items()}
spread = {}  # column -> [(max/min of per-run medians, size)], to show how noisy a run was
print("| size | gtrain time µs | busbw GB/s | Open MPI time µs | busbw | gloo time µs | busbw "
      "| gtrain busbw / OMPI | gtrain busbw / gloo | gtrain time / OMPI time | OMPI copy "
      "| gtrain busbw / OMPI default (cma) |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
size = lo
while size <= hi:
    g, gl = med("gtrain", size), med("gloo", size)
    o, oc = None, "–"
    for c in copies:
        t = med("ompi-" + c, size)
        if t is not None and (o is None or t < o):
            o, oc = t, c
    for col, peer in (("gtrain", "gtrain"), ("Open MPI", "ompi-" + oc), ("gloo", "gloo")):
        runs = list(times.get(peer, {}).get(size, {}).values())
        if len(runs) > 1:
            spread.setdefault(col, []).append((max(runs) / min(runs), size))
    print(f"| {size_name(size)} | {f_time('gtrain', g, size)} | {f_bw(size, g)} "
          f"| {f_time('ompi-' + oc, o, size)} | {f_bw(size, o)} | {f_time('gloo', gl, size)} | {f_bw(size, gl)} "
          f"| {f_ratio(o, g)} | {f_ratio(gl, g)} | {f_ratio(g, o)} | {oc} | {f_ratio(med('ompi-cma', size), g)} |")
    size *= 2
print()
print("Medians over runs of each run's median time; runs per library: "
      + (", ".join(f"{p} {n}" for p, n in sorted(nruns.items())) or "none")
      + f". busbw = size/time * 2(p-1)/p, p = {world}; float32 sum all-reduce, in place.")
if spread:
    print("Run-to-run spread, max/min of the per-run medians: " + "; ".join(
        f"{col} median {statistics.median(r for r, _ in v):.2f}x, worst {max(v)[0]:.2f}x at {size_name(max(v)[1])}"
        for col, v in spread.items()) + ".")
sys.exit(bad)
PY
# shellcheck disable=SC2016 # the backquotes are markdown
printf '\nReproduce: `%s` — %s, nproc %s, %s; %s\n' "$cmd" "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc)" "$cpu" "${info%; }"
} >"$tmp/table.md"
cat "$tmp/table.md"

if ((write)); then
	"$py" docs/bench/write_section.py collectives "$tmp/table.md" docs/benchmarks.md &&
		log "wrote the table into docs/benchmarks.md" || failed=1
fi
exit "$failed"
