#!/usr/bin/python3
"""allreduce_gloo: in-place float32 SUM all-reduce with PyTorch's gloo backend,
the gloo peer of docs/bench/collectives.sh.

Usage (under torchrun, or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set):
    allreduce_gloo.py MIN_BYTES MAX_BYTES [--iters N] [--warmup W]
                      [--init-method URL]

Sizes go from MIN_BYTES to MAX_BYTES by a factor of 2. --iters 0 (default)
means clamp(2^29 / size, 20, 1000): enough samples for a steady median at
small sizes, no more than a few seconds at the largest.

Each iteration is timed on its own, back to back after one barrier, as gtrain
bench collectives does, and an iteration's time is the maximum over ranks, found with
a final all_reduce(MAX) of the per-iteration times. Rank 0 prints one JSON line
per size; algbw = size / median time and busbw = algbw * 2(p-1)/p, as in
nccl-tests.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def auto_iters(nbytes):
    return min(max((1 << 29) // nbytes, 20), 1000)


def pattern(rank):
    # Small integers keep the sums exact, so a wrong result is visible; a
    # period of 7 lets a buffer be built by repeat (memcpy speed) even at
    # 256 MiB.
    return ((torch.arange(7) + rank) % 7).float()


def filled(count, block):
    return block.repeat((count + 6) // 7)[:count].clone()


def wrong_elements(buf, world):
    want = filled(buf.numel(), sum(pattern(r) for r in range(world)))
    return int((buf != want).sum())


def bench_size(nbytes, iters, warmup, rank, world):
    count = nbytes // 4
    buf = filled(count, pattern(rank))
    dist.all_reduce(buf)
    wrong = torch.tensor([wrong_elements(buf, world)], dtype=torch.int64)
    dist.all_reduce(wrong)
    for _ in range(warmup):
        dist.all_reduce(buf)
    times = torch.empty(iters, dtype=torch.float64)
    dist.barrier()
    for i in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        times[i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if rank != 0:
        return
    t = times.sort().values
    med = float(t.median()) if iters % 2 else float(t[iters // 2 - 1] + t[iters // 2]) / 2
    algbw = nbytes / med / 1e9
    print(json.dumps({
        "size_bytes": nbytes, "count": count, "iters": iters,
        "time_us": {"median": round(med * 1e6, 3), "min": round(float(t[0]) * 1e6, 3),
                    "max": round(float(t[-1]) * 1e6, 3)},
        "algbw_gbps": round(algbw, 4),
        "busbw_gbps": round(algbw * 2 * (world - 1) / world, 4),
        "wrong": int(wrong),
    }), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("min_bytes", type=int)
    p.add_argument("max_bytes", type=int)
    p.add_argument("--iters", type=int, default=0, help="0: scale with size")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--init-method", default="env://",
                   help="e.g. file:///tmp/x (then RANK and WORLD_SIZE come from env)")
    a = p.parse_args()
    if a.min_bytes < 4 or a.max_bytes < a.min_bytes or a.iters < 0 or a.warmup < 0:
        p.error("bad sizes or counts")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=a.init_method, rank=rank, world_size=world)
    nbytes = a.min_bytes
    while nbytes <= a.max_bytes:
        bench_size(nbytes, a.iters or auto_iters(nbytes), a.warmup, rank, world)
        nbytes *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
