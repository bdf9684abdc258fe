#!/usr/bin/python3
"""collectives_gloo: float32 SUM all-reduce (in place) and all-gather with
PyTorch's gloo backend, the gloo peer of docs/bench/collectives_hosts.sh.

Usage (RANK, WORLD_SIZE and GLOO_SOCKET_IFNAME set):
    collectives_gloo.py MIN_BYTES MAX_BYTES --init-method tcp://HOST:PORT
                        [--iters N] [--warmup W]

A size is the whole buffer, as gtrain bench collectives counts it (the
all-gather output; each rank's block is size/P). Sizes go by a factor of 2.
--iters 0 (default) means clamp(2^29 / size, 20, 1000). gloo has no
reduce-scatter in the torch of Debian 12 (1.13), so there is none here.

Timing as allreduce_gloo.py: each iteration on its own after one barrier,
its time the maximum over ranks. Rank 0 prints one JSON line per collective
and size; busbw = algbw * 2(p-1)/p for all-reduce, algbw * (p-1)/p for
all-gather (nccl-tests).
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


def setup(coll, count, rank, world):
    """Returns (run, wrong): one call of the collective, and how many
    elements of its result differ from the exact one."""
    if coll == "all_reduce":
        buf = ((torch.arange(count) + rank) % 7).float()
        want = sum(((torch.arange(count) + r) % 7).float() for r in range(world))
        return (lambda: dist.all_reduce(buf)), (lambda: int((buf != want).sum()))
    block = count // world
    mine = torch.full((block,), float(rank + 1))
    outs = [torch.zeros(block) for _ in range(world)]
    return (lambda: dist.all_gather(outs, mine)), (
        lambda: sum(int((o != r + 1).sum()) for r, o in enumerate(outs)))


def bench(coll, nbytes, iters, warmup, rank, world):
    run, wrong = setup(coll, nbytes // 4, rank, world)
    run()
    bad = torch.tensor([wrong()], dtype=torch.int64)
    dist.all_reduce(bad)
    for _ in range(warmup):
        run()
    times = torch.empty(iters, dtype=torch.float64)
    dist.barrier()
    for i in range(iters):
        t0 = time.perf_counter()
        run()
        times[i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if rank != 0:
        return
    t = times.sort().values
    med = float(t.median()) if iters % 2 else float(t[iters // 2 - 1] + t[iters // 2]) / 2
    algbw = nbytes / med / 1e9
    factor = (2 if coll == "all_reduce" else 1) * (world - 1) / world
    print(json.dumps({
        "collective": coll, "size_bytes": nbytes, "count": nbytes // 4, "iters": iters,
        "time_us": {"median": round(med * 1e6, 3), "mean": round(float(t.double().mean()) * 1e6, 3),
                    "min": round(float(t[0]) * 1e6, 3),
                    "max": round(float(t[-1]) * 1e6, 3)},
        "algbw_gbps": round(algbw, 4), "busbw_gbps": round(algbw * factor, 4),
        "wrong": int(bad),
    }), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("min_bytes", type=int)
    p.add_argument("max_bytes", type=int)
    p.add_argument("--iters", type=int, default=0, help="0: scale with size")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--init-method", required=True)
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if (a.min_bytes < 4 * world or a.min_bytes % (4 * world) or a.max_bytes < a.min_bytes
            or not 0 <= a.iters <= 10**6 or not 0 <= a.warmup <= 10**6):
        p.error("bad sizes or counts (sizes: multiples of 4 x ranks)")
    dist.init_process_group("gloo", init_method=a.init_method, rank=rank, world_size=world)
    for coll in ("all_reduce", "all_gather"):
        nbytes = a.min_bytes
        while nbytes <= a.max_bytes:
            bench(coll, nbytes, a.iters or auto_iters(nbytes), a.warmup, rank, world)
            nbytes *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
