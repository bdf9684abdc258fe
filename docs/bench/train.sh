#!/usr/bin/env bash
# Training throughput: gtrain's built-in engine vs PyTorch on this CPU: the
# same GPT-2 shape, micro-batch, optimizer (AdamW, weight decay, clipping)
# and thread count, interleaved run by run so that both see the same load.
# Usage: docs/bench/train.sh [--install] [--write] [runs] [threads]
#   runs defaults to 5, threads to 2. --install first runs apt-get install
#   python3-torch libopenblas0-pthread (Debian's torch calls the generic
#   libblas.so.3; OpenBLAS behind it is the fast BLAS Debian offers).
#   --write also puts the table into docs/benchmarks.md, between its
#   train:begin/end markers.
# Environment:
#   GTRAIN        gtrain binary (default: go build ./cmd/gtrain into a temp dir)
#   TORCH_PYTHON  a python with torch (default /usr/bin/python3)
#   STEPS         timed steps per run (default 20; 5 for gpt2); 3 warm-up steps first
# Prints a markdown table on stdout: per model the median over runs of each
# run's median step time, tokens/s and gtrain's speed-up over PyTorch.
set -euo pipefail
cd "$(dirname "$0")/../.."
argv=("$@")
install=0 write=0 pos=()
for a in "$@"; do
	case $a in
	--install) install=1 ;;
	--write) write=1 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
	-*) echo "train.sh: unknown flag $a (see --help)" >&2 && exit 2 ;;
	*) pos+=("$a") ;;
	esac
done
runs=${pos[0]:-5} threads=${pos[1]:-2}
torch_py=${TORCH_PYTHON:-/usr/bin/python3}
for v in "$runs" "$threads"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || { echo "train.sh: not a positive number: $v" >&2 && exit 2; }
done
log() { printf 'train.sh: %s\n' "$*" >&2; }
py=$(command -v python3)

if ((install)); then
	sudo=()
	((EUID == 0)) || sudo=(sudo)
	"${sudo[@]}" apt-get update
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch libopenblas0-pthread
fi
"$torch_py" -c 'import torch' 2>/dev/null || { log "$torch_py has no torch (use --install)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gtrain=${GTRAIN:-}
if [[ -z $gtrain ]]; then
	log "building gtrain"
	go build -o "$tmp/gtrain" ./cmd/gtrain
	gtrain=$tmp/gtrain
fi

# name layers heads embd seq vocab micro-batch steps
configs=(
	"tiny 4 4 128 128 257 16 ${STEPS:-20}"
	"small 6 6 384 256 257 8 ${STEPS:-20}"
	"gpt2-124M 12 12 768 256 50257 4 ${STEPS:-5}"
)

# median FILE FIELD [SKIP]: the median of a JSON-lines field after SKIP lines.
median() {
	"$py" -c 'import json,statistics,sys
v=[json.loads(l)[sys.argv[2]] for l in open(sys.argv[1]).read().split("\n")[int(sys.argv[3]):] if l.strip()]
print(statistics.median(v) if v else "nan")' "$1" "$2" "${3:-0}"
}

run_gtrain() { # name L H C T V B steps run
	local out=$tmp/g-$1-$9.jsonl
	GTRAIN_STATUS_FD=3 "$gtrain" worker --set model.layers="$2" --set model.heads="$3" --set model.embd="$4" \
		--set model.seq="$5" --set model.vocab="$6" --set batch.micro_batch="$7" --set batch.seq="$5" \
		--set steps=$(($8 + 3)) --set data.synthetic=$((($7 * $5 + 1) * 64)) --set eval.every=0 \
		--set log_every=0 --set checkpoint.dir="$tmp/ckpt-$1-$9" --set checkpoint.every=0 \
		--set threads="$threads" 3>"$out" >/dev/null
	rm -rf "$tmp/ckpt-$1-$9"
	median "$out" step_ms 3
}

run_torch() { # name L H C T V B steps run
	local out=$tmp/t-$1-$9.jsonl
	OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$torch_py" docs/bench/peers/train_gpt2_torch.py \
		--layers "$2" --heads "$3" --embd "$4" --seq "$5" --vocab "$6" --batch "$7" \
		--steps "$8" --warmup 3 --threads "$threads" >"$out"
	median "$out" step_ms
}

declare -A g t
for ((r = 1; r <= runs; r++)); do
	for c in "${configs[@]}"; do
		read -r name L H C T V B S <<<"$c"
		log "run $r/$runs: $name"
		g[$name]+="$(run_gtrain "$name" "$L" "$H" "$C" "$T" "$V" "$B" "$S" "$r") "
		t[$name]+="$(run_torch "$name" "$L" "$H" "$C" "$T" "$V" "$B" "$S" "$r") "
	done
done

table=$(
	echo "| model | layers × hidden, seq, vocab | micro-batch | gtrain ms/step | gtrain tok/s | PyTorch ms/step | PyTorch tok/s | gtrain speed-up |"
	echo "|---|---|---:|---:|---:|---:|---:|---:|"
	for c in "${configs[@]}"; do
		read -r name L H C T V B S <<<"$c"
		"$py" - "$name" "$L" "$C" "$T" "$V" "$B" "${g[$name]}" "${t[$name]}" <<'PY'
import statistics, sys
name, L, C, T, V, B, gs, ts = sys.argv[1:]
g = statistics.median(float(x) for x in gs.split())
t = statistics.median(float(x) for x in ts.split())
tok = int(B) * int(T)
print(f"| {name} | {L} × {C}, {T}, {V} | {B} | {g:.1f} | {tok / g * 1000:,.0f} | {t:.1f} | {tok / t * 1000:,.0f} | {t / g:.2f}x |")
PY
	done
	echo
	echo "Median over $runs interleaved runs of each run's median step time (3 warm-up steps dropped); $threads threads each."
	echo "\`docs/bench/train.sh ${argv[*]}\` on $(date -u +%Y-%m-%d), $(nproc) cores $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs),"
	echo "$("$gtrain" version), $("$torch_py" -c 'import torch; print("torch", torch.__version__)'), libblas.so.3 → $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo '?')."
)
echo "$table"
if ((write)); then
	printf '%s\n' "$table" >"$tmp/table.md"
	"$py" docs/bench/write_section.py train "$tmp/table.md" docs/benchmarks.md
	log "wrote docs/benchmarks.md"
fi
