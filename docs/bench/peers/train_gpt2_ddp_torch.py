#!/usr/bin/python3
"""PyTorch peer of docs/bench/dp.sh: the GPT-2 of train_gpt2_torch.py (imported
from it, not copied) trained data-parallel on the CPU, so that gtrain's
data-parallel engine and its ZeRO stages can be compared with what PyTorch
offers on the same machine.

usage: train_gpt2_ddp_torch.py --mode single|ddp|zero1 --nproc N
           --layers L --heads H --embd C --seq T --vocab V
           --batch B --steps S --warmup W --threads K [--init-dir DIR]

  --batch    the GLOBAL micro-batch (sequences per step over all ranks);
             each rank gets B / N sequences, so every mode does the same
             tokens per step.
  --threads  the TOTAL compute threads; each rank gets K / N
             (torch.set_num_threads, and OMP_NUM_THREADS and
             OPENBLAS_NUM_THREADS in its environment before torch loads).

Modes:
  single  one process, no process group, no DDP: the scaling baseline (the
          same loop as train_gpt2_torch.py).
  ddp     DistributedDataParallel, gloo, default bucket_cap_mb (25):
          gradients averaged by all-reduce during backward. The counterpart
          of gtrain's ZeRO stage 0 (plain data parallelism).
  zero1   DDP plus torch.distributed.optim.ZeroRedundancyOptimizer wrapping
          AdamW: each rank keeps and updates the AdamW moments of its share of
          the parameters, then the updated parameters are broadcast. PyTorch's
          ZeRO-1, the counterpart of gtrain's stage 1. The plain form: torch
          1.13 also has overlap_with_ddp=True, which needs a DDP comm hook
          (hook_with_zero_step) and changes the first steps' semantics; not
          used. parameters_as_bucket_view is left at its default (False).

Stage 2/3 have no PyTorch counterpart here: FSDP (SHARD_GRAD_OP, FULL_SHARD)
exists in torch 1.13 but (a) Debian's build cannot even import it under
Python 3.11 (a dataclass with a mutable default in
torch/distributed/_shard/sharded_tensor/metadata.py), and (b) once that is
worked around, FSDP 1.13 is CUDA-only: the constructor asserts "Torch not
compiled with CUDA enabled" and _lazy_init raises "FSDP does not support CPU
only execution". CPU FSDP arrived in later releases.

The processes are started with torch.multiprocessing (spawn), even for
`single`, so that every mode gets its thread settings the same way; they
rendezvous through a file store in --init-dir (no port to pick or collide
with) over gloo on loopback (GLOO_SOCKET_IFNAME=lo).

Every rank times each step (zero_grad, forward, backward with DDP's
all-reduce, clipping, optimizer step with ZeRO's broadcast) with
perf_counter; a step's time is the slowest rank's. Rank 0 prints one JSON
line: the median step time over the steps after warm-up, global tokens/s,
every timed step, and the bytes of training state per rank (parameters,
gradients, AdamW moments held by that rank; DDP's gradient buckets not
counted).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

# The model is train_gpt2_torch.py's, imported so the two peers cannot drift.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from train_gpt2_torch import GPT  # noqa: E402

MODES = ("single", "ddp", "zero1")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--nproc", type=int, default=1)
    for name in ("layers", "heads", "embd", "seq", "vocab", "batch", "steps", "warmup", "threads"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--init-dir", default="", help="directory for the file store (default: a temporary one)")
    a = p.parse_args()
    for name in ("nproc", "layers", "heads", "embd", "seq", "vocab", "batch", "steps", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    if a.warmup < 0:
        p.error("--warmup must not be negative")
    if a.mode == "single" and a.nproc != 1:
        p.error("--mode single runs one process: --nproc 1")
    if a.mode != "single" and a.nproc < 2:
        p.error(f"--mode {a.mode} needs --nproc of at least 2")
    if a.batch % a.nproc or a.threads % a.nproc:
        p.error(f"--batch {a.batch} and --threads {a.threads} must both divide by --nproc {a.nproc}")
    if a.embd % a.heads:
        p.error("--embd must divide by --heads")
    return a


def make_optimizer(a, model, params):
    """AdamW as train_gpt2_torch.py sets it up (betas 0.9/0.95, weight decay
    0.1 on matrices and embeddings only), or ZeroRedundancyOptimizer around
    exactly that AdamW."""
    decay = [q for q in params if q.dim() >= 2]
    other = [q for q in params if q.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    kw = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    if a.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **kw)
    return torch.optim.AdamW(groups, **kw)


def state_bytes(params, opt):
    """Bytes of parameters, gradients and the optimizer moments this rank
    holds (ZeroRedundancyOptimizer: only its shard's, in opt.optim)."""
    n = sum(q.numel() for q in params) + sum(q.grad.numel() for q in params if q.grad is not None)
    inner = getattr(opt, "optim", opt)
    for st in inner.state.values():
        n += sum(v.numel() for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
    return 4 * n


def worker(rank, a, store):
    per_rank = a.batch // a.nproc
    torch.set_num_threads(a.threads // a.nproc)
    distributed = a.mode != "single"
    if distributed:
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=a.nproc)
    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    model = GPT(a)
    params = list(model.parameters())
    net = DDP(model) if distributed else model  # default bucket_cap_mb=25
    opt = make_optimizer(a, model, params)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch
    times, loss = [], float("nan")
    for step in range(a.warmup + a.steps):
        x = torch.randint(a.vocab, (per_rank, a.seq), generator=gen)
        y = torch.randint(a.vocab, (per_rank, a.seq), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = net(x, y)
        out.backward()
        # After DDP's backward every rank holds the full averaged gradients,
        # so clipping by the global norm is local and the same on every rank,
        # with or without ZeroRedundancyOptimizer.
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
        loss = out.item()
    state = state_bytes(params, opt)
    if distributed:
        # A step lasts as long as its slowest rank: gather every rank's times.
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times = t.tolist()
        s = torch.tensor([state], dtype=torch.float64)
        dist.all_reduce(s, op=dist.ReduceOp.MAX)
        state = int(s.item())
    if rank == 0:
        med = statistics.median(times)
        print(json.dumps({
            "peer": "pytorch " + torch.__version__, "mode": a.mode, "nproc": a.nproc,
            "threads_per_rank": a.threads // a.nproc, "micro_batch_per_rank": per_rank,
            "step_ms": med * 1000, "tokens_per_s": a.batch * a.seq / med,
            "steps_ms": [round(v * 1000, 3) for v in times], "state_bytes_per_rank": state,
            "final_loss": loss,
        }), flush=True)
    if distributed:
        dist.destroy_process_group()


def main():
    a = parse()
    # Children are fresh interpreters (spawn): the environment set here is
    # the one their OpenMP and OpenBLAS read when torch loads.
    per = str(a.threads // a.nproc)
    os.environ.update(OMP_NUM_THREADS=per, OPENBLAS_NUM_THREADS=per, GLOO_SOCKET_IFNAME="lo")
    with tempfile.TemporaryDirectory(prefix="ddp-store-", dir=a.init_dir or None) as d:
        mp.spawn(worker, args=(a, os.path.join(d, "store")), nprocs=a.nproc, join=True)


if __name__ == "__main__":
    main()
