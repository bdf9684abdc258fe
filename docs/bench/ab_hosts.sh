#!/usr/bin/env bash
# A/B of gtrain builds or settings across two network-namespace hosts: one
# rank per host (or PPN) on the bare veth, gtrain alone, through
# collectives_hosts.sh, the variants in alternating order run by run (first
# to last, then last to first), since on this VM whole runs move by up to 2x
# between runs and the first run after another can differ from the second.
# Usage: docs/bench/ab_hosts.sh [runs] [min-bytes] [max-bytes] VARIANT...
#   runs defaults to 6, sizes to 65536 .. 4194304 bytes (factor 2). A
#   VARIANT is one environment assignment for the harness's runs: a build
#   (GTRAIN=/tmp/gtrain-old) or a setting (GTRAIN_COMM_SPIN_US=500); 2 to 8.
# Environment: ITERS, WARMUP, RUN_TIMEOUT, PIN as collectives_hosts.sh;
#   RATE a rate such as 10gbit: the link limited by tc as there, instead of
#   the bare veth (default none); GTRAIN the build of variants that set
#   none; KEEP a directory for the raw results; PPN ranks per host (default
#   1; with more, collectives_hosts.sh's defaults are 20 timed calls after 5
#   warm-up ones: set ITERS and WARMUP).
# Prints markdown on stdout: per collective and size, each variant's median
# over runs of each run's median µs and its ratio to the first variant; then
# the same for each run's all-gather time over the same run's reduce-scatter
# of that size, which takes out what moves a whole run (for a change that
# touches only one of them); then each run's ratio of the first variant to
# each other, by the run's median time and by its mean time: the median
# over runs and, from 6 runs, a 95% interval for it (docs/bench/stats.py),
# else the range. Needs root, as collectives_hosts.sh. Exits 1 if a run
# failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
pos=() variants=()
for a in "$@"; do
	case $a in
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
	*=*) variants+=("$a") ;;
	*) pos+=("$a") ;;
	esac
done
runs=${pos[0]:-6} min=${pos[1]:-65536} max=${pos[2]:-4194304}
rate=${RATE:-none}
[[ $rate == none || $rate =~ ^[0-9]+[kmg]?bit$ ]] || { printf 'ab_hosts.sh: RATE %s: want e.g. 10gbit, or none\n' "$rate" >&2 && exit 2; }
ppn=${PPN:-1}
[[ $ppn =~ ^[1-8]$ ]] || { printf 'ab_hosts.sh: PPN %s: want 1 to 8 ranks per host\n' "$ppn" >&2 && exit 2; }
setup=$([[ $rate == none ]] && echo veth || echo "$rate").x$ppn
log() { printf 'ab_hosts.sh: %s\n' "$*" >&2; }
# quiet_run (docs/bench/lib.sh): see there.
. docs/bench/lib.sh
[[ $runs =~ ^[0-9]+$ ]] && ((runs >= 1 && runs <= 100)) || { log "runs $runs: want 1 to 100" && exit 2; }
((${#variants[@]} >= 2 && ${#variants[@]} <= 8)) || { log "want 2 to 8 variants such as GTRAIN=/tmp/gtrain-old (see --help)" && exit 2; }
for v in "${variants[@]}"; do
	[[ $v =~ ^[A-Z_][A-Z0-9_]*=.+$ ]] || { log "variant $v: want NAME=VALUE, e.g. GTRAIN_COMM_SPIN_US=500" && exit 2; }
done
((EUID == 0)) || { log "needs root: collectives_hosts.sh creates network namespaces" && exit 2; }

tmp=$(mktemp -d -t gtrain-ab-hosts.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# A build for the variants that name none (all may: GTRAIN=... each).
own=0
for v in "${variants[@]}"; do [[ $v == GTRAIN=* ]] || own=1; done
if [[ -z ${GTRAIN:-} ]] && ((own)); then
	log "building gtrain"
	PATH=$PATH:/usr/local/go/bin go build -o "$tmp/gtrain" ./cmd/gtrain
	export GTRAIN=$tmp/gtrain
fi

failed=0 n=${#variants[@]}
for ((r = 1; r <= runs; r++)); do
	for ((k = 0; k < n; k++)); do
		i=$((r % 2 ? k : n - 1 - k))
		log "run $r of $runs: ${variants[i]} (load $(cut -d' ' -f1-3 /proc/loadavg))"
		quiet_run "$tmp/run.err" env "${variants[i]}" PPN="$ppn" RATE="$rate" BARE=$([[ $rate == none ]] && echo 1 || echo 0) KEEP="$tmp/res/$i/$r" \
			docs/bench/collectives_hosts.sh --no-gloo --no-mpi 1 "$min" "$max"
	done
done
[[ -n ${KEEP:-} ]] && mkdir -p "$KEEP" && cp -r "$tmp/res/." "$KEEP"/

python3 - "$tmp/res" "$setup" "${variants[@]}" <<'PY' || failed=1
import glob, json, os, re, statistics, sys

sys.dont_write_bytecode = True  # no __pycache__ in the tree
sys.path.insert(0, "docs/bench")
from stats import median_ci

res, setup, variants = sys.argv[1], sys.argv[2], sys.argv[3:]
prefix = re.compile(r"^\[[^\]]*\] ?")
t = {}  # (variant, run, coll, size) -> the run's median µs
tm = {}  # the same for the run's mean µs
for path in glob.glob(os.path.join(res, "*", "*", setup + ".gtrain.1.node0")):
    i, run = (int(x) for x in path.split(os.sep)[-3:-1])
    try:
        doc = json.loads("\n".join(prefix.sub("", l) for l in open(path).read().splitlines()))
        for x in doc["results"]:
            m = x["in_place"] if x["collective"] == "all_reduce" else x["out_of_place"]
            t[(i, run, x["collective"], x["size_bytes"])] = m["time_us"]["median"]
            tm[(i, run, x["collective"], x["size_bytes"])] = m["time_us"]["mean"]
    except (ValueError, KeyError, TypeError) as e:
        print(f"ab_hosts.sh: {path}: unreadable ({type(e).__name__}: {e}); left out", file=sys.stderr)


def size_name(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def table(title, cell):
    cases = sorted({(k[2], k[3]) for k in t})
    print(f"**{title}**\n")
    print("| collective | size | " + " | ".join(variants) + " | " + " | ".join(f"{v} / {variants[0]}" for v in variants[1:]) + " |")
    print("|---|---:|" + "---:|" * (2 * len(variants) - 1))
    for c, s in cases:
        meds = []
        for i in range(len(variants)):
            vals = [v for v in (cell(i, r, c, s) for r in {k[1] for k in t if k[0] == i}) if v is not None]
            meds.append(statistics.median(vals) if vals else None)
        if all(m is None for m in meds):
            continue
        f = lambda m: "–" if m is None else f"{m:,.2f}" if m < 10 else f"{m:,.1f}"
        ratio = lambda m: "–" if m is None or meds[0] is None else f"{meds[0] / m:.2f}x"
        print(f"| {c} | {size_name(s)} | " + " | ".join(f(m) for m in meds) + " | " + " | ".join(ratio(m) for m in meds[1:]) + " |")
    print()


table("median µs over runs (ratio: first over each; above 1 is faster)", lambda i, r, c, s: t.get((i, r, c, s)))


def per_rs(i, r, c, s):
    a, b = t.get((i, r, c, s)), t.get((i, r, "reduce_scatter", s))
    return None if c != "all_gather" or a is None or not b else a / b


table("each run's all-gather over the same run's reduce-scatter, median over runs", per_rs)

# The variants of one run ran back to back: what moves the machine for
# minutes moves them together, so each run's ratio is the fairest.
for what, d in (("median", t), ("mean", tm)):
    print(f"**each run's first variant over the same run's other variant, by the run's {what} time (above 1 is "
          "faster): median over runs, and its 95% interval (CI) from 6 runs, else the range**\n")
    print("| collective | size | " + " | ".join(f"{v} / {variants[0]}" for v in variants[1:]) + " |")
    print("|---|---:|" + "---:|" * (len(variants) - 1))
    for c, s in sorted({(k[2], k[3]) for k in d}):
        cells = []
        for i in range(1, len(variants)):
            rs = [d[(0, r, c, s)] / d[(i, r, c, s)] for r in {k[1] for k in d} if (0, r, c, s) in d and d.get((i, r, c, s))]
            if rs:
                m, a, b, ci = median_ci(rs)
                cells.append(f"{m:.2f}x ({'CI ' if ci else ''}{a:.2f}-{b:.2f})")
            else:
                cells.append("–")
        print(f"| {c} | {size_name(s)} | " + " | ".join(cells) + " |")
    print()
PY
printf 'Reproduce: `%sdocs/bench/ab_hosts.sh %s %s %s %s` — %s, nproc %s, load %s\n' \
	"$( [[ -n ${ITERS:-} ]] && printf "ITERS=%s " "$ITERS")$( [[ -n ${WARMUP:-} ]] && printf "WARMUP=%s " "$WARMUP")$( [[ -n ${PIN:-} ]] && printf "PIN=%s " "$PIN")$( [[ $rate != none ]] && printf "RATE=%s " "$rate")$( ((ppn > 1)) && printf "PPN=%s " "$ppn")" \
	"$runs" "$min" "$max" "${variants[*]}" "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
exit "$failed"
