#!/usr/bin/env bash
# The training stall of a checkpoint, synchronous against checkpoint.async,
# for the gpt2 preset on one rank (TestCheckpointStall in engine/train: 13
# steps of 64 tokens, a checkpoint every 4 steps, runs of the two modes
# interleaved), and the memory of the asynchronous snapshot. Usage:
#   docs/bench/ckpt_async.sh [RUNS] [DIR]   (default 3 runs; DIR: where the
#                                            checkpoints go, default a
#                                            temporary directory)
# Prints a markdown table: per mode the median time of a step that saves,
# its stall (that minus the median synchronous step that does not save),
# the median of the other steps (with checkpoint.async they run beside the
# write) and the snapshot's size; then the command, date and machine.
set -euo pipefail
runs=${1:-3}
dir=${2:-}
cd "$(dirname "$0")/../.."
out=$(GTRAIN_BENCH_CKPT_ASYNC="$runs" GTRAIN_BENCH_DIR="$dir" \
	go test -run '^TestCheckpointStall$' -count 1 -timeout 60m -v ./engine/train/)
echo "$out" | grep '^|'
echo
echo "docs/bench/ckpt_async.sh $runs $dir: $(date -u +%F), $(nproc) cores $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(go version | cut -d' ' -f3)"
