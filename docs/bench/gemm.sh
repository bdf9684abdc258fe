#!/usr/bin/env bash
# float32 matrix multiply: gtrain's kernels.Sgemm vs OpenBLAS's cblas_sgemm on
# the model's shapes, 1 and 2 threads, interleaved call site by call site so
# that both see the same load.
# Usage: docs/bench/gemm.sh [--install] [--write] [runs]
#   runs defaults to 5. Per run, for every shape and thread count, it runs
#   gtrain's BenchmarkSgemm (engine/kernels) and the OpenBLAS peer
#   (peers/sgemm_openblas.c) one after the other, alternating which goes
#   first, and prints a markdown table of the median GFLOP/s over runs.
#   --install first runs apt-get install libopenblas-dev (the peer's library;
#   gtrain needs none). --write also puts the table into docs/benchmarks.md,
#   between its gemm:begin/end markers.
# Environment:
#   SHAPES       space-separated shapes, named as the sub-benchmarks are:
#                <op(A)><op(B)>_<m>x<n>x<k>[_ld<lda>,<ldb>,<ldc>] (default: the
#                list in engine/kernels/gemm_bench_test.go, with its comments)
#   THREADS      thread counts (default "1 2"; "1" with LEVEL)
#   LEVEL        go, avx2 or avx512: gtrain's kernels of that level, one thread
#                (BenchmarkSgemmLevel), instead of the best this CPU has
#   BENCHTIME    time per measurement, as go test -benchtime (default 0.3s)
#   RUN_TIMEOUT  seconds before one measurement is killed (default 300)
#   KEEP         a directory to copy the raw results into
# Prints the table on stdout and progress on stderr. Exits 1 if any
# measurement failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
argv=("$@")

install=0 write=0 pos=()
for a in "$@"; do
	case $a in
	--install) install=1 ;;
	--write) write=1 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
	-*) echo "gemm.sh: unknown flag $a (see --help)" >&2 && exit 2 ;;
	*) pos+=("$a") ;;
	esac
done
level=${LEVEL:-}
[[ -z $level || $level =~ ^(go|avx2|avx512)$ ]] || { echo "gemm.sh: LEVEL wants go, avx2 or avx512" >&2 && exit 2; }
[[ -z $level ]] && threads=${THREADS:-1 2} || threads=${THREADS:-1}
[[ -z $level || $threads == 1 ]] || { echo "gemm.sh: LEVEL runs one thread only (THREADS=1)" >&2 && exit 2; }
runs=${pos[0]:-5} benchtime=${BENCHTIME:-0.3s} run_timeout=${RUN_TIMEOUT:-300}
[[ $runs =~ ^[1-9][0-9]*$ && $run_timeout =~ ^[0-9]+$ ]] || { echo "gemm.sh: runs and RUN_TIMEOUT must be numbers" >&2 && exit 2; }
[[ $benchtime =~ ^[0-9.]+s$ ]] || { echo "gemm.sh: BENCHTIME wants seconds, like 0.3s" >&2 && exit 2; }
for t in $threads; do [[ $t =~ ^[1-9][0-9]*$ ]] || { echo "gemm.sh: bad thread count $t" >&2 && exit 2; }; done
py=$(command -v python3)

log() { printf 'gemm.sh: %s\n' "$*" >&2; }

if ((install)); then
	sudo=()
	((EUID == 0)) || sudo=(sudo)
	"${sudo[@]}" apt-get update
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y libopenblas-dev
fi

# Shapes and what they are, from the benchmark's own list unless SHAPES.
bench_file=engine/kernels/gemm_bench_test.go
declare -A label=()
shapes=()
if [[ -n ${SHAPES:-} ]]; then
	read -r -a shapes <<<"$SHAPES"
else
	while IFS='|' read -r s l; do
		shapes+=("$s") && label[$s]=$l
	done < <(sed -n 's/^[[:space:]]*"\([NT][NT]_[0-9x_ld,]*\)",[[:space:]]*\/\/ \(.*\)$/\1|\2/p' "$bench_file")
fi
((${#shapes[@]})) || { log "no shapes (SHAPES empty, or none found in $bench_file)" && exit 2; }

tmp=$(mktemp -d -t gtrain-gemm.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# --- build both --------------------------------------------------------------
PATH=$PATH:/usr/local/go/bin
log "building gtrain's benchmark (go test -c ./engine/kernels)"
go test -c -o "$tmp/kernels.test" ./engine/kernels
gtrain_ver="gtrain $(git describe --always --dirty 2>/dev/null || echo '(no git)'), $(go version | cut -d' ' -f3)"
if ! cc -O2 -o "$tmp/sgemm_openblas" docs/bench/peers/sgemm_openblas.c -lopenblas 2>"$tmp/cc.err"; then
	log "cannot build the OpenBLAS peer (apt-get install libopenblas-dev, or --install):"
	sed 's/^/    /' "$tmp/cc.err" >&2
	exit 1
fi
blas_ver=$("$tmp/sgemm_openblas" -threads 1 -benchtime 0.01 NN_8x8x8 2>&1 >/dev/null | sed -n 's/^sgemm_openblas: //p')

# --- the runs ----------------------------------------------------------------
res=$tmp/res
mkdir -p "$res"
failed=0
# one LIB RUN SHAPE THREADS: measure once and append "lib run shape threads
# gflops" to $res/all, or report the failure.
one() {
	local out=$tmp/out err=$tmp/err rc=0 g
	if [[ $1 == gtrain ]]; then
		local bench="^BenchmarkSgemm\$/^$3\$/^t$4\$"
		[[ -n $level ]] && bench="^BenchmarkSgemmLevel\$/^$3\$/^$level\$"
		GTRAIN_SGEMM_SHAPES=$3 timeout -k 10 "$run_timeout" "$tmp/kernels.test" -test.run '^$' \
			-test.bench "$bench" -test.benchtime "$benchtime" >"$out" 2>"$err" || rc=$?
		g=$(sed -n 's/.*[[:space:]]\([0-9.]*\) GFLOP\/s.*/\1/p' "$out" | head -n 1)
	else
		timeout -k 10 "$run_timeout" "$tmp/sgemm_openblas" -threads "$4" -benchtime "${benchtime%s}" "$3" \
			>"$out" 2>"$err" || rc=$?
		g=$(sed -n 's/.*"gflops":\([0-9.]*\).*/\1/p' "$out" | head -n 1)
	fi
	if ((rc != 0)) || [[ -z $g ]]; then
		failed=1
		log "$1 $3 threads $4 failed (exit $rc); last lines:"
		tail -n 8 "$out" "$err" | sed 's/^/    /' >&2
		return
	fi
	echo "$1 $2 $3 $4 $g" >>"$res/all"
}

t0=$SECONDS
for ((run = 1; run <= runs; run++)); do
	log "run $run of $runs ($((SECONDS - t0)) s so far)"
	for s in "${shapes[@]}"; do
		for t in $threads; do
			if ((run % 2)); then
				one gtrain "$run" "$s" "$t" && one openblas "$run" "$s" "$t"
			else
				one openblas "$run" "$s" "$t" && one gtrain "$run" "$s" "$t"
			fi
		done
	done
done
log "done in $((SECONDS - t0)) s"
if [[ -n ${KEEP:-} ]]; then mkdir -p "$KEEP" && cp "$res/all" "$KEEP/gemm-results.txt"; fi

# --- the table ---------------------------------------------------------------
cmd=docs/bench/gemm.sh
((${#argv[@]})) && cmd+=" ${argv[*]}"
for v in SHAPES THREADS BENCHTIME LEVEL; do [[ -n ${!v:-} ]] && cmd="$v='${!v}' $cmd"; done
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
labels=$tmp/labels
for s in "${shapes[@]}"; do printf '%s|%s\n' "$s" "${label[$s]:-}"; done >"$labels"
touch "$res/all"
{
"$py" - "$res/all" "$labels" "$threads" "$level" <<'PY' || failed=1
import math, statistics, sys

results, labels_file, threads = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split()]
name = f"gtrain {sys.argv[4]}" if sys.argv[4] else "gtrain"
shapes = [line.rstrip("\n").split("|", 1) for line in open(labels_file)]
g = {}  # g[(lib, shape, threads)] = [GFLOP/s per run]
for line in open(results):
    lib, run, shape, t, v = line.split()
    g.setdefault((lib, shape, int(t)), []).append(float(v))


def med(lib, s, t):
    v = g.get((lib, s, t))
    return statistics.median(v) if v else None


def f(x):
    return "–" if x is None else f"{x:.1f}"


head = "| shape (m×n×k) | use |"
rule = "|---|---|"
for t in threads:
    head += f" {name} t{t} | OpenBLAS t{t} | ratio t{t} |"
    rule += "---:|---:|---:|"
print(head)
print(rule)
ratios = {t: [] for t in threads}
for s, label in shapes:
    row = f"| `{s}` | {label} |"
    for t in threads:
        a, b = med("gtrain", s, t), med("openblas", s, t)
        r = None if a is None or b is None else a / b
        if r is not None:
            ratios[t].append((r, s))
        row += f" {f(a)} | {f(b)} | {'–' if r is None else f'{r:.2f}x'} |"
    print(row)
print()
nruns = max((len(v) for v in g.values()), default=0)
print(f"GFLOP/s = 2·m·n·k / time per call; medians over {nruns} interleaved runs; ratio = gtrain / OpenBLAS.")
for t in threads:
    if ratios[t]:
        lo = min(ratios[t])
        gm = math.exp(statistics.mean(math.log(r) for r, _ in ratios[t]))
        print(f"Threads {t}: lowest ratio {lo[0]:.2f}x (`{lo[1]}`), geometric mean {gm:.2f}x.")
spread = {}
for (lib, s, t), v in g.items():
    if len(v) > 1 and min(v) > 0:
        spread.setdefault(lib, []).append((max(v) / min(v), s, t))
if spread:
    print("Run-to-run spread, max/min: " + "; ".join(
        f"{lib} median {statistics.median(r for r, _, _ in v):.2f}x, worst {max(v)[0]:.2f}x at `{max(v)[1]}` t{max(v)[2]}"
        for lib, v in sorted(spread.items())) + ".")
PY
# shellcheck disable=SC2016 # the backquotes are markdown
printf '\nReproduce: `%s` — %s, nproc %s, %s; %s; %s (cblas_sgemm, openblas_set_num_threads)\n' \
	"$cmd" "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc)" "$cpu" "$gtrain_ver" "$blas_ver"
} >"$tmp/table.md"
cat "$tmp/table.md"

if ((write)); then
	"$py" docs/bench/write_section.py gemm "$tmp/table.md" docs/benchmarks.md &&
		log "wrote the table into docs/benchmarks.md" || failed=1
fi
exit "$failed"
