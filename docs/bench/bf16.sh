#!/usr/bin/env bash
# bf16 vs fp32 training throughput of gtrain's engine (precision: bf16 runs
# the matmuls on bfloat16 operands, AVX-512 BF16 where the CPU has it), and
# optionally PyTorch's CPU mixed precision (torch.autocast to bfloat16) on
# the same model: the small and gpt2 presets, one standalone worker each,
# fp32 and bf16 interleaved run by run so that both see the same load.
# Usage: docs/bench/bf16.sh [--torch] [--write] [runs] [threads]
#   runs defaults to 3, threads to 2. --torch adds PyTorch fp32 and
#   autocast-bf16 runs of docs/bench/peers/train_gpt2_torch.py (install
#   torch and OpenBLAS with docs/bench/train.sh --install first). --write
#   also puts the table into docs/benchmarks.md, between its bf16:begin/end
#   markers.
# Environment:
#   GTRAIN        gtrain binary (default: go build ./cmd/gtrain into a temp dir)
#   TORCH_PYTHON  a python with torch (default /usr/bin/python3)
#   STEPS         timed steps per run (default 10; 3 for gpt2); 3 warm-up steps first
#   MODELS        the models to run (default "small gpt2")
# Prints a markdown table on stdout: per model the median over runs of each
# run's median step time as tokens/s, the bf16/fp32 ratio, and the largest
# relative difference between the two runs' losses at the same step (same
# seed and data; the first run's).
set -euo pipefail
cd "$(dirname "$0")/../.."
argv=("$@")
torch=0 write=0 pos=()
for a in "$@"; do
	case $a in
	--torch) torch=1 ;;
	--write) write=1 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
	-*) echo "bf16.sh: unknown flag $a (see --help)" >&2 && exit 2 ;;
	*) pos+=("$a") ;;
	esac
done
runs=${pos[0]:-3} threads=${pos[1]:-2}
torch_py=${TORCH_PYTHON:-/usr/bin/python3}
for v in "$runs" "$threads"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || { echo "bf16.sh: not a positive number: $v" >&2 && exit 2; }
done
log() { printf 'bf16.sh: %s\n' "$*" >&2; }
py=$(command -v python3)
if ((torch)); then
	"$torch_py" -c 'import torch' 2>/dev/null || { log "$torch_py has no torch (docs/bench/train.sh --install)"; exit 1; }
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gtrain=${GTRAIN:-}
if [[ -z $gtrain ]]; then
	log "building gtrain"
	go build -o "$tmp/gtrain" ./cmd/gtrain
	gtrain=$tmp/gtrain
fi

# name preset layers heads embd seq vocab micro-batch steps
all=(
	"small small 6 6 384 256 257 8 ${STEPS:-10}"
	"gpt2 gpt2 12 12 768 1024 50257 1 ${STEPS:-3}"
)
configs=()
for m in ${MODELS:-small gpt2}; do
	n=${#configs[@]}
	for c in "${all[@]}"; do
		[[ ${c%% *} == "$m" ]] && configs+=("$c")
	done
	((${#configs[@]} > n)) || { echo "bf16.sh: unknown model $m in MODELS (want small, gpt2)" >&2 && exit 2; }
done

# median FILE FIELD [SKIP]: the median of a JSON-lines field after SKIP lines.
median() {
	"$py" -c 'import json,statistics,sys
v=[json.loads(l)[sys.argv[2]] for l in open(sys.argv[1]).read().split("\n")[int(sys.argv[3]):] if l.strip()]
print(statistics.median(v) if v else "nan")' "$1" "$2" "${3:-0}"
}

run_gtrain() { # name preset B T steps precision run
	local out=$tmp/g-$1-$6-$7.jsonl
	GTRAIN_STATUS_FD=3 "$gtrain" worker --set model.preset="$2" --set batch.micro_batch="$3" --set batch.seq="$4" \
		--set steps=$(($5 + 3)) --set data.synthetic=$((($3 * $4 + 1) * 64)) --set eval.every=0 \
		--set log_every=0 --set checkpoint.dir="$tmp/ckpt-$1-$7" --set checkpoint.every=0 \
		--set threads="$threads" --set precision="$6" 3>"$out" >/dev/null
	rm -rf "$tmp/ckpt-$1-$7"
	median "$out" step_ms 3
}

run_torch() { # name L H C T V B steps precision run
	local out=$tmp/t-$1-$9-${10}.jsonl
	OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$torch_py" docs/bench/peers/train_gpt2_torch.py \
		--layers "$2" --heads "$3" --embd "$4" --seq "$5" --vocab "$6" --batch "$7" \
		--steps "$8" --warmup 3 --threads "$threads" --precision "$9" >"$out"
	median "$out" step_ms
}

declare -A ms
for ((r = 1; r <= runs; r++)); do
	for c in "${configs[@]}"; do
		read -r name preset L H C T V B S <<<"$c"
		for prec in fp32 bf16; do
			log "run $r/$runs: $name gtrain $prec"
			ms[$name-g-$prec]+="$(run_gtrain "$name" "$preset" "$B" "$T" "$S" "$prec" "$r") "
			if ((torch)); then
				log "run $r/$runs: $name pytorch $prec"
				ms[$name-t-$prec]+="$(run_torch "$name" "$L" "$H" "$C" "$T" "$V" "$B" "$S" "$prec" "$r") "
			fi
		done
	done
done

table=$(
	head="| model | micro-batch × seq | gtrain fp32 tok/s | gtrain bf16 tok/s | bf16 / fp32 | largest loss difference |"
	rule="|---|---:|---:|---:|---:|---:|"
	if ((torch)); then
		head+=" PyTorch fp32 tok/s | PyTorch autocast-bf16 tok/s | PyTorch bf16 / fp32 | gtrain bf16 / PyTorch bf16 |"
		rule+="---:|---:|---:|---:|"
	fi
	echo "$head"
	echo "$rule"
	for c in "${configs[@]}"; do
		read -r name preset L H C T V B S <<<"$c"
		"$py" - "$name" "$B" "$T" "$tmp/g-$name-fp32-1.jsonl" "$tmp/g-$name-bf16-1.jsonl" \
			"${ms[$name-g-fp32]}" "${ms[$name-g-bf16]}" "${ms[$name-t-fp32]:-}" "${ms[$name-t-bf16]:-}" <<'PY'
import json, statistics, sys
name, B, T, f32log, bf16log, gf, gb, tf, tb = sys.argv[1:]
tok = int(B) * int(T)
rate = lambda s: tok / statistics.median(float(x) for x in s.split()) * 1000
loss = lambda f: [json.loads(l)["loss"] for l in open(f) if l.strip()]
diff = max(abs(b - a) / abs(a) for a, b in zip(loss(f32log), loss(bf16log)))
row = f"| {name} | {B} × {T} | {rate(gf):,.0f} | {rate(gb):,.0f} | {rate(gb) / rate(gf):.2f}x | {diff:.1e} |"
if tf.strip():
    row += f" {rate(tf):,.0f} | {rate(tb):,.0f} | {rate(tb) / rate(tf):.2f}x | {rate(gb) / rate(tb):.2f}x |"
print(row)
PY
	done
	echo
	echo "Median over $runs interleaved runs of each run's median step time (3 warm-up steps dropped); $threads threads each."
	echo "\`MODELS=\"${MODELS:-small gpt2}\" docs/bench/bf16.sh ${argv[*]}\` on $(date -u +%Y-%m-%d), $(nproc) cores $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
	echo "(avx512_bf16: $(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no)), $("$gtrain" version)$( ((torch)) && echo ", $("$torch_py" -c 'import torch; print("torch", torch.__version__)')")."
)
echo "$table"
if ((write)); then
	printf '%s\n' "$table" >"$tmp/table.md"
	"$py" docs/bench/write_section.py bf16 "$tmp/table.md" docs/benchmarks.md
	log "wrote docs/benchmarks.md"
fi
