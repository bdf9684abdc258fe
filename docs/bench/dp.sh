#!/usr/bin/env bash
# Data-parallel training: gtrain's engine at 1 rank and at N ranks with ZeRO
# stages 0-3 against PyTorch's single process, DDP and DDP with
# ZeroRedundancyOptimizer, on one GPT-2 config, interleaved run by run so that
# all of them see the same load.
# Usage: docs/bench/dp.sh [--install] [--write] [runs]
#   runs defaults to 5. --install first runs apt-get install python3-torch
#   libopenblas0-pthread. --write also puts the table into docs/benchmarks.md
#   between its dp:begin/end markers, only if the file has them.
# Environment:
#   GTRAIN        gtrain binary (default: go build ./cmd/gtrain into a temp dir)
#   TORCH_PYTHON  a python with torch (default /usr/bin/python3)
#   MODEL         "layers heads embd seq vocab" (default "6 6 384 256 257",
#                 train.sh's small)
#   BATCH         global micro-batch, sequences per step over all ranks (default 8)
#   NPROC         ranks of the data-parallel modes (default 2)
#   THREADS       compute threads in total, split evenly among ranks (default 2)
#   STEPS         timed steps per run (default 20), after WARMUP (default 3)
#   MODES         modes to run, a subset of: g1rank gz0 gz1 gz2 gz3 tsingle tddp
#                 tzero1 (default all; see below)
#   RUN_TIMEOUT   seconds before one run of one mode is killed (default 900)
#   KEEP          a directory to copy the raw results into
# Modes: g1rank = gtrain, 1 rank (the scaling baseline); gz0..gz3 = gtrain,
# NPROC ranks, parallel.dp=NPROC, zero_stage 0..3; tsingle = PyTorch, one
# process; tddp = DistributedDataParallel; tzero1 = DDP +
# ZeroRedundancyOptimizer(AdamW). Counterparts: g1rank <-> tsingle, stage 0
# <-> DDP, stage 1 <-> ZeroRedundancyOptimizer; stages 2 and 3 have none here
# (FSDP in torch 1.13 is CUDA-only; see peers/train_gpt2_ddp_torch.py).
# What is the same: the model (peers/train_gpt2_torch.py's GPT-2 and gtrain's
# matching one), tokens per step (BATCH x seq, split evenly over the ranks),
# the threads in total (THREADS; per rank THREADS/ranks, via `threads` and
# torch.set_num_threads + OMP/OPENBLAS_NUM_THREADS), AdamW (betas 0.9/0.95,
# weight decay 0.1 on matrices and embeddings) with clipping at norm 1,
# float32, WARMUP + STEPS steps, synthetic tokens. What differs, and is the
# point: gtrain's ranks talk over its shared-memory transport, PyTorch's over
# gloo (TCP on loopback); each side's own kernels; gtrain's learning rate
# follows its warm-up schedule (no effect on step time). A step's time is the
# slowest rank's: gtrain's from its per-rank status records (step_ms), PyTorch's
# from perf_counter around zero_grad..optimizer step on every rank. A run's
# figure is the median over the timed steps; the table gives the median over
# runs, tokens/s = global tokens per step / that time.
# Prints a markdown table on stdout and progress on stderr. A mode that fails
# is reported with its error and shown as "failed"; the script then exits 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
argv=("$@")

install=0 write=0 pos=()
for a in "$@"; do
	case $a in
	--install) install=1 ;;
	--write) write=1 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
	-*) echo "dp.sh: unknown flag $a (see --help)" >&2 && exit 2 ;;
	*) pos+=("$a") ;;
	esac
done
((${#pos[@]} <= 1)) || { echo "dp.sh: one positional argument at most: runs (see --help)" >&2 && exit 2; }
runs=${pos[0]:-5}
torch_py=${TORCH_PYTHON:-/usr/bin/python3}
read -r L H C T V extra <<<"${MODEL:-6 6 384 256 257}"
B=${BATCH:-8} nproc=${NPROC:-2} threads=${THREADS:-2} steps=${STEPS:-20} warmup=${WARMUP:-3}
run_timeout=${RUN_TIMEOUT:-900}
die() { echo "dp.sh: $*" >&2 && exit 2; }
[[ -z ${extra:-} && -n ${V:-} ]] || die "MODEL must be five numbers: layers heads embd seq vocab"
for v in "$runs" "$L" "$H" "$C" "$T" "$V" "$B" "$nproc" "$threads" "$steps" "$run_timeout"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || die "not a positive number: $v"
done
[[ $warmup =~ ^[0-9]+$ ]] || die "WARMUP: not a number: $warmup"
((nproc >= 2)) || die "NPROC $nproc: the data-parallel modes need at least 2 ranks"
((B % nproc == 0 && threads % nproc == 0)) || die "BATCH $B and THREADS $threads must both divide by NPROC $nproc (the same work and threads per rank)"
((C % H == 0)) || die "MODEL: embd $C must divide by heads $H"
all_modes="g1rank gz0 gz1 gz2 gz3 tsingle tddp tzero1"
modes=${MODES:-$all_modes}
for m in $modes; do [[ " $all_modes " == *" $m "* ]] || die "MODES: unknown mode $m (want some of: $all_modes)"; done
log() { printf 'dp.sh: %s\n' "$*" >&2; }
py=$(command -v python3 || echo "$torch_py") # any python 3 reads the results

if ((install)); then
	sudo=()
	((EUID == 0)) || sudo=(sudo)
	"${sudo[@]}" apt-get update
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch libopenblas0-pthread
fi
"$torch_py" -c 'import torch, torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
	{ log "$torch_py has no torch with gloo (use --install)"; exit 1; }

# Every run is started in a session of its own (setsid) under timeout, so
# that a hung or half-dead distributed run (a rank blocked in a collective
# whose peer died) is ended with everything it forked; the trap signals the
# sessions still listed on any exit.
tmp=$(mktemp -d -t gtrain-dp.XXXXXX)
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

results=$tmp/results.jsonl # one line per mode per run: {"mode","run","step_ms",...} or {"mode","run","failed"}
failed=0

# record MODE RUN JSON-OR-EMPTY REASON: append a run's result, or its failure.
record() {
	if [[ -n $3 ]]; then
		printf '%s\n' "$3" >>"$results"
	else
		failed=1
		"$py" -c 'import json,sys; print(json.dumps({"mode":sys.argv[1],"run":int(sys.argv[2]),"failed":sys.argv[3]}))' "$1" "$2" "$4" >>"$results"
	fi
}

# fail MODE RUN RC-OR-REASON ERRFILE [EVENTS]: say that a run failed and why: the end
# of its stderr, and for gtrain the ranks' own stderr lines and exit reports
# from the JSON events.
fail() {
	local why=$3
	[[ $3 != [0-9]* ]] || why="exit $3"
	[[ $3 != 124 ]] || why="timed out after RUN_TIMEOUT=$run_timeout s"
	log "$1 run $2 failed ($why); last lines of its output:"
	{
		tail -n 12 "$4"
		[[ -z ${5:-} || ! -s ${5:-} ]] || "$py" - "$5" <<'PY'
import json, sys
lines = []
for l in open(sys.argv[1]):
    try:
        e = json.loads(l)
    except ValueError:
        continue
    if e.get("type") == "log" and e.get("stream") == "stderr":
        lines.append(f"[rank {e.get('rank')}] {e.get('line', '')}")
    elif e.get("type") in ("rank_exited", "error", "job_exited") and (e.get("code") or e.get("message")):
        lines.append(f"{e['type']} rank {e.get('rank')}: code {e.get('code', 0)} {e.get('message', '')}")
print("\n".join(lines[-12:]))
PY
	} | sed 's/^/    /' >&2
	record "$1" "$2" "" "$why"
}

# run_gtrain MODE RUN RANKS STAGE: `gtrain run` of the built-in engine with
# RANKS ranks (parallel.dp = RANKS) and ZeRO stage STAGE; micro_batch and
# threads are per rank. No eval and no log lines; the end-of-run checkpoint
# cannot be switched off, so it goes to a scratch directory (after the timed
# steps). The status records of every rank come back as `status` events of
# --output json; a step's time is the slowest rank's step_ms.
run_gtrain() {
	local mode=$1 run=$2 n=$3 stage=$4 rc=0 res
	local ev=$tmp/$tag.$run.events.jsonl err=$tmp/$tag.$run.err ck=$tmp/ck-$tag-$run
	# env -C: run in the scratch directory, so no ./gtrain.yaml of the
	# repository is read and nothing is left behind.
	run_session "$ev" "$err" env -C "$tmp" "$gtrain" run --nproc-per-node "$n" --output json --table never \
		--set model.layers="$L" --set model.heads="$H" --set model.embd="$C" --set model.seq="$T" \
		--set model.vocab="$V" --set batch.micro_batch=$((B / n)) --set batch.seq="$T" \
		--set batch.grad_accum=1 --set steps=$((warmup + steps)) \
		--set data.synthetic=$(((B * T + 1) * 64)) --set eval.every=0 --set log_every=0 \
		--set checkpoint.dir="$ck" --set checkpoint.every=0 --set threads=$((threads / n)) \
		--set parallel.dp="$n" --set parallel.zero_stage="$stage" || rc=$?
	rm -rf "$ck"
	if ((rc)); then
		fail "$mode" "$run" "$rc" "$err" "$ev"
		return
	fi
	if ! res=$("$py" - "$ev" "$mode" "$run" "$n" "$warmup" "$steps" "$B" "$T" 2>>"$err" <<'PY'
import json, statistics, sys
path, mode, run, n, warmup, steps, B, T = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
per_step, ranks, state = {}, set(), 0
for line in open(path):
    e = json.loads(line)
    if e.get("type") != "status":
        continue
    s = e["status"]
    ranks.add(e["rank"])
    per_step[s["step"]] = max(per_step.get(s["step"], 0), s["step_ms"])
    m = s.get("memory") or {}
    state = max(state, m.get("params", 0) + m.get("grads", 0) + m.get("optimizer", 0))
timed = [per_step[k] for k in sorted(per_step) if k > warmup]
if len(ranks) != n or len(timed) != steps:
    sys.exit(f"{mode}: status records from {len(ranks)} of {n} ranks, {len(timed)} of {steps} timed steps")
med = statistics.median(timed)
print(json.dumps({"mode": mode, "run": run, "step_ms": med, "tokens_per_s": B * T / med * 1000,
                  "state_bytes_per_rank": state, "steps_ms": timed}))
PY
	); then
		fail "$mode" "$run" "exit 0 but unusable output" "$err"
		return
	fi
	record "$mode" "$run" "$res"
}

# run_torch MODE RUN PEER-MODE RANKS: the PyTorch peer; it spawns its ranks
# and prints one JSON line (rank 0).
run_torch() {
	local mode=$1 run=$2 out=$tmp/$tag.$2.json err=$tmp/$tag.$2.err rc=0 res
	run_session "$out" "$err" env OMP_NUM_THREADS=$((threads / $4)) OPENBLAS_NUM_THREADS=$((threads / $4)) \
		GLOO_SOCKET_IFNAME=lo "$torch_py" docs/bench/peers/train_gpt2_ddp_torch.py --mode "$3" --nproc "$4" \
		--layers "$L" --heads "$H" --embd "$C" --seq "$T" --vocab "$V" --batch "$B" \
		--steps "$steps" --warmup "$warmup" --threads "$threads" --init-dir "$tmp" || rc=$?
	if ((rc)); then
		fail "$mode" "$run" "$rc" "$err"
		return
	fi
	if ! res=$("$py" -c 'import json,sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
d.update(mode=sys.argv[2], run=int(sys.argv[3]))
print(json.dumps(d))' "$out" "$mode" "$run" 2>>"$err"); then
		fail "$mode" "$run" "exit 0 but unusable output" "$err"
		return
	fi
	record "$mode" "$run" "$res"
}

# run_mode MODE RUN: one run of one mode (a MODES key, also its files' tag
# in $tmp); the long names are the rows of the table below.
run_mode() {
	tag=$1
	case $1 in
	g1rank) run_gtrain "gtrain 1 rank" "$2" 1 0 ;;
	gz[0-3]) run_gtrain "gtrain $nproc ranks, ZeRO ${1#gz}" "$2" "$nproc" "${1#gz}" ;;
	tsingle) run_torch "PyTorch 1 process" "$2" single 1 ;;
	tddp) run_torch "PyTorch DDP $nproc ranks" "$2" ddp "$nproc" ;;
	tzero1) run_torch "PyTorch DDP + ZeroRedundancyOptimizer $nproc ranks" "$2" zero1 "$nproc" ;;
	esac
}

# Counterparts sit next to each other, and every other run goes in reverse
# order, so no mode always runs first or right after the same one.
read -ra order <<<"$(for m in g1rank tsingle gz0 tddp gz1 tzero1 gz2 gz3; do [[ " $modes " == *" $m "* ]] && printf '%s ' "$m"; done)"
for ((r = 1; r <= runs; r++)); do
	seq_modes=("${order[@]}")
	((r % 2)) || mapfile -t seq_modes < <(printf '%s\n' "${order[@]}" | tac)
	for m in "${seq_modes[@]}"; do
		log "run $r/$runs: $m"
		run_mode "$m" "$r"
	done
done

gtrain_ver=$("$gtrain" version 2>/dev/null || echo "gtrain ?")
torch_ver=$("$torch_py" -c 'import sys, torch; print("torch %s (gloo), Python %d.%d" % (torch.__version__, *sys.version_info[:2]))')
table=$("$py" - "$results" "$nproc" "$B" "$T" "$runs" "$threads" "$warmup" "$steps" <<'PY'
import json, statistics, sys
path, n, B, T, runs, threads, warmup, steps = sys.argv[1], *map(int, sys.argv[2:])
res = {}  # mode -> its runs' results, failed ones included
for line in open(path):
    d = json.loads(line)
    res.setdefault(d["mode"], []).append(d)
g1, ts = "gtrain 1 rank", "PyTorch 1 process"
ddp, z1 = f"PyTorch DDP {n} ranks", f"PyTorch DDP + ZeroRedundancyOptimizer {n} ranks"
no_peer = "none: FSDP {} is CUDA-only in torch 1.13"
rows = [  # mode, ranks, PyTorch counterpart (or why none), the same library's 1-rank baseline
    (g1, 1, ts, None),
    (f"gtrain {n} ranks, ZeRO 0", n, ddp, g1),
    (f"gtrain {n} ranks, ZeRO 1", n, z1, g1),
    (f"gtrain {n} ranks, ZeRO 2", n, no_peer.format("SHARD_GRAD_OP"), g1),
    (f"gtrain {n} ranks, ZeRO 3", n, no_peer.format("FULL_SHARD"), g1),
    (ts, 1, None, None),
    (ddp, n, None, ts),
    (z1, n, None, ts),
]

def ok(mode):
    return [d for d in res.get(mode, []) if "failed" not in d]

def tok(mode):
    """Global tokens/s from the median over runs of the run's median step time."""
    v = [d["step_ms"] for d in ok(mode)]
    return B * T / statistics.median(v) * 1000 if v else None

def tok_cell(mode):
    if mode not in res:
        return "not run"
    t = tok(mode)
    return f"{t:,.0f}" if t else "failed"

print(f"| mode | ranks | micro-batch per rank | ms/step | tokens/s | state MiB per rank | PyTorch counterpart | its tokens/s | gtrain / counterpart | scaling 1→{n} ranks |")
print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
spread = []
for mode, k, peer, base in rows:
    if mode not in res:
        continue  # left out by MODES
    good, name = ok(mode), mode
    if good and len(good) < len(res[mode]):
        name += f" ({len(res[mode]) - len(good)} of {len(res[mode])} runs failed)"
    peer_cells = ["–", "–", "–"] if peer is None else [peer, "–", "–"]
    if not good:
        print(f"| {name} | {k} | {B // k} | failed | failed | – | {' | '.join(peer_cells)} | – |")
        continue
    v = [d["step_ms"] for d in good]
    t = tok(mode)
    state = statistics.median(d.get("state_bytes_per_rank", 0) for d in good) / 2**20
    if peer in res:
        pt = tok(peer)
        peer_cells[1:] = [tok_cell(peer), f"{t / pt:.2f}x" if pt else "–"]
    bt = tok(base) if base else None
    scale = f"{t / (k * bt):.0%}" if bt else "–"
    print(f"| {name} | {k} | {B // k} | {statistics.median(v):.1f} | {t:,.0f} | {state:.0f} | {' | '.join(peer_cells)} | {scale} |")
    if len(v) > 1:
        spread.append(f"{mode} {max(v) / min(v):.2f}x")
print()
print(f"Global micro-batch {B} × seq {T} = {B * T:,} tokens per step, split evenly over the ranks; {threads} threads in total "
      f"({threads // n} per rank at {n} ranks); AdamW, clipping at 1, float32. Median over {runs} interleaved runs of "
      f"each run's median step time ({warmup} warm-up + {steps} timed steps; a step lasts as long as its slowest rank); "
      "tokens/s = tokens per step / that time.")
print("State = parameters + gradients + AdamW moments one rank holds (gtrain: its status record's memory; "
      f"PyTorch: the tensors, DDP's gradient buckets not counted). Scaling = tokens/s at {n} ranks / "
      f"({n} × tokens/s at 1 rank of the same library).")
if spread:
    print("Run-to-run spread, max/min of the per-run medians: " + "; ".join(spread) + ".")
PY
)
table+=$'\n'"\`docs/bench/dp.sh ${argv[*]}\` on $(date -u +%Y-%m-%dT%H:%MZ), MODEL=\"$L $H $C $T $V\" BATCH=$B NPROC=$nproc THREADS=$threads,"
table+=$'\n'"$(nproc) cores $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $gtrain_ver; $torch_ver, libblas.so.3 → $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo '?')."
echo "$table"

if ((write)); then
	printf '%s\n' "$table" >"$tmp/table.md"
	"$py" docs/bench/write_section.py dp "$tmp/table.md" docs/benchmarks.md &&
		log "wrote docs/benchmarks.md" || failed=1
fi
if ((failed)); then
	log "some runs failed (see above)"
	exit 1
fi
