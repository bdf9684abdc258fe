#!/usr/bin/env bash
# How long a preempted rank's checkpoint save takes, per model preset
# (BenchmarkSave in engine/train: finiteness check, safetensors file with
# sha256, manifest, fsyncs; one rank, fp32, ZeRO 0: weights and both Adam
# moments). --grace-period must leave room for it. Usage:
#   docs/bench/save.sh [COUNT] [PRESETS]   (default 5 runs; test,tiny,small,gpt2)
# Prints every run and the median seconds per save of each preset.
set -euo pipefail
count=${1:-5}
presets=${2:-test,tiny,small,gpt2}
cd "$(dirname "$0")/../.."
out=$(GTRAIN_BENCH_PRESETS="$presets" go test -run '^$' -bench '^BenchmarkSave$' -benchtime 2x -count "$count" ./engine/train/)
echo "$out"
for p in ${presets//,/ }; do
	echo "$out" | awk -v b="BenchmarkSave/$p" '$1 ~ "^"b"(-[0-9]+)?$" { print $3 }' | sort -n |
		awk -v p="$p" '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%s: median %.3f s per save over %d runs\n", p, m / 1e9, NR }'
done
