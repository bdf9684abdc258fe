#!/usr/bin/env bash
# The training stall of a checkpoint, synchronous against checkpoint.async,
# for the gpt2 preset on one rank (TestCheckpointStall in engine/train: 13
# steps of 64 tokens, a checkpoint every 4 steps, runs of the two modes
# interleaved), and the memory of the asynchronous snapshot. Usage:
#   docs/bench/ckpt_async.sh [RUNS] [DIR] [THREADS]
# (default 3 runs; DIR: where the checkpoints go, default a temporary
# directory; THREADS: the trainer's compute threads, default every core)
# Prints a markdown table: per mode the median time the training thread
# spends on a checkpoint (the stall), for checkpoint.async also the steps
# that ran beside the write and the time they lost to it per checkpoint
# (over the synchronous runs' median step), and the snapshot's size; then
# the load average, command, date and machine.
set -euo pipefail
runs=${1:-3}
load0=$(cut -d' ' -f1-3 /proc/loadavg)
dir=${2:-}
threads=${3:-0}
cd "$(dirname "$0")/../.."
out=$(GTRAIN_BENCH_CKPT_ASYNC="$runs" GTRAIN_BENCH_DIR="$dir" GTRAIN_BENCH_THREADS="$threads" \
	go test -run '^TestCheckpointStall$' -count 1 -timeout 60m -v ./engine/train/)
echo "$out" | grep -e '^|' -e '^A step'
echo
echo "load average at the start $load0, at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo "docs/bench/ckpt_async.sh $runs '$dir' $threads: $(date -u +%F), $(nproc) cores $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(go version | cut -d' ' -f3)"
