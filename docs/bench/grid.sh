#!/usr/bin/env bash
# 3D layouts of the built-in engine against the planner's prediction: the
# `small` preset (6 layers × 384 hidden, seq 256, vocab 257) trained with
# gtrain run on this machine at 1 rank, DP2, TP2, PP2 and the 4-rank layouts
# tp2·pp2, tp2·dp2, pp2·dp2 and dp4 (more ranks than cores on a 2-core
# machine: reported as oversubscribed), each measured RUNS times,
# interleaved run by run, medians; beside each, what the planner predicts
# for the same layout as `gtrain run --auto` predicts it (the same problem
# and CPU description: engine/train.PredictLayout on MeasureCPU, through
# docs/bench/gridpredict).
# Usage: docs/bench/grid.sh [--write] [runs]
#   runs defaults to 3. --write also puts the table into docs/benchmarks.md
#   between its grid:begin/end markers.
# Environment:
#   GTRAIN       gtrain binary (default: go build ./cmd/gtrain into a temp dir)
#   GRIDPREDICT  docs/bench/gridpredict binary (default: go build it likewise)
#   BATCH        global batch, sequences per step (default 8)
#   MICRO        micro-batch, sequences (default 2); grad_accum = BATCH / (MICRO × dp)
#   STEPS        timed steps per run (default 5), after WARMUP (default 2)
#   LAYOUTS      some of: 1 dp2 tp2 pp2 tp2pp2 tp2dp2 pp2dp2 dp4 (default all)
#   RUN_TIMEOUT  seconds before one run is killed (default 600)
#   KEEP         a directory to copy the raw results into
#   NICE         run gtrain under `nice -n NICE` (e.g. -10, as root: on a
#                machine shared with other work, the runs are then disturbed
#                less; the table says so)
# Every rank runs with the engine's default threads (this host's cores / its
# ranks, at least 1), as run --auto leaves them. A step's time is its
# slowest rank's step_ms (status records); a run's figure is the median
# over its timed steps; the table gives the median over runs, and the
# fastest single step of all runs (on a shared machine, the one least
# disturbed by other processes: what the planner's prediction is for, a
# machine to itself). Memory per
# rank is the largest total any rank reports (its status record's memory:
# parameters, gradients, optimizer state, activations, buffers) against the
# planner's most loaded rank. Prints a markdown table on stdout and
# progress on stderr; a failed run is reported and the script exits 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
argv=("$@")

write=0 pos=()
for a in "$@"; do
	case $a in
	--write) write=1 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
	-*) echo "grid.sh: unknown flag $a (see --help)" >&2 && exit 2 ;;
	*) pos+=("$a") ;;
	esac
done
((${#pos[@]} <= 1)) || { echo "grid.sh: one positional argument at most: runs (see --help)" >&2 && exit 2; }
runs=${pos[0]:-3}
B=${BATCH:-8} mb=${MICRO:-2} steps=${STEPS:-5} warmup=${WARMUP:-2} run_timeout=${RUN_TIMEOUT:-600}
die() { echo "grid.sh: $*" >&2 && exit 2; }
for v in "$runs" "$B" "$mb" "$steps" "$run_timeout"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || die "not a positive number: $v"
done
[[ $warmup =~ ^[0-9]+$ ]] || die "WARMUP: not a number: $warmup"
nice=()
if [[ -n ${NICE:-} ]]; then
	[[ $NICE =~ ^-?[0-9]+$ ]] || die "NICE: not a number: $NICE"
	nice=(nice -n "$NICE")
fi
((runs <= 100 && steps <= 1000 && warmup <= 1000 && B <= 4096)) || die "runs ≤ 100, STEPS and WARMUP ≤ 1000, BATCH ≤ 4096"
# layout name: ranks tp pp
declare -A shape=([1]="1 1 1" [dp2]="2 1 1" [tp2]="2 2 1" [pp2]="2 1 2"
	[tp2pp2]="4 2 2" [tp2dp2]="4 2 1" [pp2dp2]="4 1 2" [dp4]="4 1 1")
all="1 dp2 tp2 pp2 tp2pp2 tp2dp2 pp2dp2 dp4"
layouts=${LAYOUTS:-$all}
for l in $layouts; do
	[[ -n ${shape[$l]:-} ]] || die "LAYOUTS: unknown layout $l (want some of: $all)"
	read -r n tp pp <<<"${shape[$l]}"
	dp=$((n / (tp * pp)))
	((B % (mb * dp) == 0)) || die "BATCH $B must divide by MICRO $mb × dp $dp (layout $l)"
done
log() { printf 'grid.sh: %s\n' "$*" >&2; }
py=$(command -v python3) || die "python3 is needed to read the results"

# Every run is started in a session of its own (setsid) under timeout, so
# that a hung run (a rank blocked in a collective whose peer died) is ended
# with everything it forked; the trap signals the sessions still listed.
tmp=$(mktemp -d -t gtrain-grid.XXXXXX)
sids=()
kill_session() { # SIGNAL SID
	pkill "-$1" -s "$2" 2>/dev/null || kill "-$1" -- "-$2" 2>/dev/null || true
}
# shellcheck disable=SC2317 # invoked by the trap
cleanup() {
	local rc=$? p
	trap - EXIT INT TERM
	for p in "${sids[@]}"; do kill_session TERM "$p"; done
	if ((${#sids[@]})); then
		sleep 1
		for p in "${sids[@]}"; do kill_session KILL "$p"; done
	fi
	if [[ -n ${KEEP:-} ]]; then
		mkdir -p "$KEEP"
		cp "$tmp"/*.json* "$tmp"/*.err "$KEEP"/ 2>/dev/null || true
	fi
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# run_session OUT ERR CMD...: run CMD in a new session under timeout, wait
# for it, then kill whatever is left of the session (an orphaned rank).
run_session() {
	local out=$1 err=$2 rc=0 keep=() p pid
	shift 2
	setsid timeout -k 10 "$run_timeout" "$@" </dev/null >"$out" 2>"$err" &
	pid=$!
	sids+=("$pid")
	wait "$pid" || rc=$?
	kill_session KILL "$pid"
	for p in "${sids[@]}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
	sids=(${keep[@]+"${keep[@]}"})
	return "$rc"
}

gtrain=${GTRAIN:-}
if [[ -z $gtrain ]]; then
	log "building gtrain"
	go build -o "$tmp/gtrain" ./cmd/gtrain
	gtrain=$tmp/gtrain
fi
gtrain=$(realpath "$gtrain")
gridpredict=${GRIDPREDICT:-}
if [[ -z $gridpredict ]]; then
	log "building gridpredict"
	go build -o "$tmp/gridpredict" ./docs/bench/gridpredict
	gridpredict=$tmp/gridpredict
fi

results=$tmp/results.jsonl # one line per layout per run, or per prediction
failed=0

# predict LAYOUT...: the planner's figures for each LAYOUT, as run --auto
# predicts them, on one measurement of this host.
predict() {
	local l n tp pp args=()
	for l in "$@"; do
		read -r n tp pp <<<"${shape[$l]}"
		args+=("$n,$tp,$pp,$((B / (mb * (n / (tp * pp)))))")
	done
	if ! "$gridpredict" -micro-batch "$mb" "${args[@]}" >"$tmp/predict.jsonl" 2>"$tmp/predict.err"; then
		log "gridpredict failed: $(cat "$tmp/predict.err")"
		failed=1
		return
	fi
	"$py" - "$tmp/predict.jsonl" "$@" >>"$results" <<'PY'
import json, sys
for line, layout in zip(open(sys.argv[1]), sys.argv[2:]):
    d = json.loads(line)
    d.update(layout=layout, kind="predict")
    print(json.dumps(d))
PY
}

# measure LAYOUT RUN: one gtrain run of LAYOUT; appends its median step,
# tokens/s and largest memory per rank. No eval, no log lines; the
# end-of-run checkpoint cannot be switched off, so it goes to a scratch
# directory (after the timed steps).
measure() {
	local l=$1 run=$2 n tp pp dp rc=0 ev=$tmp/$1.$2.events.jsonl err=$tmp/$1.$2.err ck=$tmp/ck-$1-$2
	read -r n tp pp <<<"${shape[$l]}"
	dp=$((n / (tp * pp)))
	# env -C: run in the scratch directory, so no ./gtrain.yaml of the
	# repository is read and nothing is left behind.
	run_session "$ev" "$err" "${nice[@]}" env -C "$tmp" "$gtrain" run --nproc-per-node "$n" --output json --table never \
		--set model.preset=small --set batch.micro_batch="$mb" --set batch.grad_accum=$((B / (mb * dp))) \
		--set parallel.tp="$tp" --set parallel.pp="$pp" --set steps=$((warmup + steps)) \
		--set data.synthetic=$(((B * 256 + 1) * 64)) --set eval.every=0 --set log_every=0 \
		--set checkpoint.dir="$ck" --set checkpoint.every=0 || rc=$?
	rm -rf "$ck"
	if ((rc)); then
		log "$l run $run failed (exit $rc); the end of its output:"
		tail -n 12 "$err" | sed 's/^/    /' >&2
		failed=1
		return
	fi
	if ! "$py" - "$ev" "$l" "$run" "$n" "$warmup" "$steps" >>"$results" 2>>"$err" <<'PY'; then
import json, statistics, sys
path, layout, run, n, warmup, steps = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
per_step, ranks, mem = {}, set(), {}
for line in open(path):
    e = json.loads(line)
    if e.get("type") != "status":
        continue
    s = e["status"]
    ranks.add(e["rank"])
    per_step[s["step"]] = max(per_step.get(s["step"], 0), s["step_ms"])
    m = s.get("memory") or {}
    if m.get("total", 0) >= mem.get("total", 0):
        mem = m
timed = [per_step[k] for k in sorted(per_step) if k > warmup]
if len(ranks) != n or len(timed) != steps:
    sys.exit(f"{layout}: status records from {len(ranks)} of {n} ranks, {len(timed)} of {steps} timed steps")
print(json.dumps({"kind": "measure", "layout": layout, "run": run, "step_ms": statistics.median(timed),
                  "memory": mem, "steps_ms": timed}))
PY
		log "$l run $run: exit 0 but unusable output: $(tail -n 1 "$err")"
		failed=1
	fi
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
read -ra order <<<"$layouts"
predict "${order[@]}"
for ((r = 1; r <= runs; r++)); do
	seq_layouts=("${order[@]}")
	((r % 2)) || mapfile -t seq_layouts < <(printf '%s\n' "${order[@]}" | tac)
	for l in "${seq_layouts[@]}"; do
		log "run $r/$runs: $l"
		measure "$l" "$r"
	done
done

table=$("$py" - "$results" "$B" "$mb" "$runs" "$warmup" "$steps" "$(nproc)" "$layouts" "${NICE:-}" <<'PY'
import json, statistics, sys
path, B, mb, runs, warmup, steps, cores = sys.argv[1], *map(int, sys.argv[2:8])
layouts, nice = sys.argv[8].split(), sys.argv[9]
names = {"1": "1 rank", "dp2": "DP2", "tp2": "TP2", "pp2": "PP2", "tp2pp2": "TP2·PP2",
         "tp2dp2": "TP2·DP2", "pp2dp2": "PP2·DP2", "dp4": "DP4"}
ranks = {"1": 1, "dp2": 2, "tp2": 2, "pp2": 2, "tp2pp2": 4, "tp2dp2": 4, "pp2dp2": 4, "dp4": 4}
dps = {"1": 1, "dp2": 2, "tp2": 1, "pp2": 1, "tp2pp2": 1, "tp2dp2": 2, "pp2dp2": 2, "dp4": 4}
pred, meas = {}, {}
for line in open(path):
    d = json.loads(line)
    if d["kind"] == "predict":
        pred[d["layout"]] = d
    else:
        meas.setdefault(d["layout"], []).append(d)
tokens = B * 256
MiB = 2**20
print("| layout | ranks | micro-batch × accumulation | ms/step | fastest step | predicted | predicted / measured | predicted / fastest | tokens/s | predicted | memory MiB per rank | predicted | predicted / measured |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
spread, parts = [], []
for l in layouts:
    k, p, m = ranks[l], pred.get(l), meas.get(l, [])
    over = f"{k}, oversubscribed ({k} ranks on {cores} cores)" if k > cores else f"{k}"
    acc = f"{mb} × {B // (mb * dps[l])}"
    cells = ["–"] * 10
    if m:
        v = [d["step_ms"] for d in m]
        ms, best = statistics.median(v), min(min(d["steps_ms"]) for d in m)
        mem = max(d["memory"].get("total", 0) for d in m) / MiB
        cells[0], cells[1], cells[5], cells[7] = f"{ms:.0f}", f"{best:.0f}", f"{tokens / ms * 1000:,.0f}", f"{mem:.0f}"
        if len(v) > 1:
            spread.append(f"{names[l]} {max(v) / min(v):.2f}x")
    if p:
        pm = p["memory"]["total"] / MiB
        cells[2], cells[6], cells[8] = f"{p['step_ms']:.0f}", f"{p['tokens_per_s']:,.0f}", f"{pm:.0f}"
        q = p["parts"]
        parts.append(f"{names[l]}: compute {q['compute_ms']:.0f} (memory-bound {q['memory_bound_ms']:.0f}), bubble {q['bubble_ms']:.0f}, "
                     f"TP {q['tp_ms']:.0f}, PP {q['pp_exposed_ms']:.1f}, DP {q['dp_exposed_ms']:.1f}, optimizer {q['optimizer_ms']:.0f}")
    if m and p:
        cells[3], cells[4] = f"{p['step_ms'] / ms:.2f}", f"{p['step_ms'] / best:.2f}"
        cells[9] = f"{pm / mem:.2f}" if mem else "–"
    if not m and l in pred:
        cells[0] = "failed"
    print(f"| {names[l]} | {over} | {acc} | " + " | ".join(cells) + " |")
print()
print(f"Global batch {B} sequences × 256 tokens = {tokens:,} tokens per step, float32, ZeRO 0, default threads "
      f"(cores / ranks, at least 1). Measured: median over {runs} interleaved runs of each run's median step "
      f"({warmup} warm-up + {steps} timed steps; a step lasts as long as its slowest rank); fastest step: the "
      "shortest of all timed steps of all runs (the least disturbed by other processes); memory: the largest total "
      "a rank reports in its status records. Predicted: the planner on the CPU description run --auto measures "
      "(engine/train.PredictLayout), memory of its most loaded rank." + (f" gtrain ran under nice -n {nice}." if nice else ""))
any_p = next(iter(pred.values()), None)
if any_p:
    c = any_p["cpu"]
    print(f"CPU description measured at the start: GEMM {c['gemm_flops_per_core'] / 1e9:.0f} GFLOP/s per core, memory-bound kernels "
          f"{c['kernel_bytes_per_s_per_core'] / 1e9:.1f} GB/s per core; shared memory {c['shm_bytes_per_s'] / 1e9:.0f} GB/s, "
          f"TCP {c['tcp_bytes_per_s'] / 1e9:.1f} GB/s (planner.DefaultCPUSpeed).")
if parts:
    print("Predicted parts of a step, ms: " + "; ".join(parts) + ".")
if spread:
    print("Run-to-run spread, max/min of the per-run medians: " + "; ".join(spread) + ".")
PY
)
table+=$'\n'"Load average (1, 5, 15 min) at the start: $load_start; at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
envs=""
for v in NICE BATCH MICRO STEPS WARMUP LAYOUTS; do
	[[ -z ${!v:-} ]] || { [[ ${!v} == *" "* ]] && envs+="$v=\"${!v}\" " || envs+="$v=${!v} "; }
done
table+=$'\n'"\`${envs}docs/bench/grid.sh ${argv[*]}\` on $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $("$gtrain" version 2>/dev/null || echo "gtrain ?")."
echo "$table"

if ((write)); then
	printf '%s\n' "$table" >"$tmp/table.md"
	"$py" docs/bench/write_section.py grid "$tmp/table.md" docs/benchmarks.md &&
		log "wrote docs/benchmarks.md" || failed=1
fi
if ((failed)); then
	log "some runs failed (see above)"
	exit 1
fi
