"""A small, real torch.distributed job that checks its own results.

Run it under torchrun or gtrain; it needs nothing else:

    gtrain run --nproc-per-node 4 -- python3 examples/ddp_allreduce.py
    torchrun --standalone --nproc_per_node 4 examples/ddp_allreduce.py

Every rank
  1. checks that the launcher's variables (RANK, WORLD_SIZE, ...) agree with
     what the process group reports,
  2. all-reduces rank+1 and checks the sum is n(n+1)/2,
  3. takes one DistributedDataParallel step on an nn.Linear, each rank with
     its own data, and checks that its parameters equal both every other
     rank's and a single-process reference step on all ranks' data,
and prints one "ok" line. Any mismatch raises, so the rank exits non-zero;
@record puts the error in TORCHELASTIC_ERROR_FILE for the launcher to report.

Test hooks: --dump-env PREFIX writes the rank's environment to
PREFIX.<rank>.json; --fail-rank N makes rank N raise ValueError("boom") right
after joining the group while the others sit in a long step, so the launcher
has to tear them down.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

IN_FEATURES, OUT_FEATURES, BATCH = 8, 2, 4
LR = 0.1


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-env", metavar="PREFIX",
                   help="write this rank's os.environ as JSON to PREFIX.<rank>.json")
    p.add_argument("--fail-rank", type=int, metavar="N",
                   help="rank N raises ValueError('boom') after init; the others hang")
    return p.parse_args()


def check(cond, what):
    """Raise (and so fail the rank) when a check does not hold."""
    if not cond:
        raise AssertionError(what)


def send_status(rec):
    """Send a status record to gtrain's status channel, when there is one.

    gtrain gives the fd's number in GTRAIN_STATUS_FD; it reads one JSON object
    per line. Under torchrun the variable is unset and this does nothing.
    """
    fd = os.environ.get("GTRAIN_STATUS_FD")
    if fd:
        os.write(int(fd), (json.dumps(rec) + "\n").encode())


def batch(rank):
    """This rank's training data: different on every rank, same on every run."""
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(BATCH, IN_FEATURES, generator=g), torch.randn(BATCH, OUT_FEATURES, generator=g)


def new_model(seed):
    torch.manual_seed(seed)
    return nn.Linear(IN_FEATURES, OUT_FEATURES)


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def check_env(rank, world):
    """The launcher's variables must agree with the process group."""
    env = os.environ
    check(int(env["RANK"]) == rank, f"RANK={env['RANK']} but the group says rank {rank}")
    check(int(env["WORLD_SIZE"]) == world, f"WORLD_SIZE={env['WORLD_SIZE']} but the group has {world}")
    local, local_world = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    check(0 <= local < local_world <= world, f"LOCAL_RANK={local} LOCAL_WORLD_SIZE={local_world} WORLD_SIZE={world}")


def check_all_reduce(rank, world):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    want = world * (world + 1) / 2
    check(t.item() == want, f"all_reduce of rank+1 gave {t.item()}, want {want}")
    return t.item()


def ddp_step(rank, world):
    """One DDP step; returns the loss. Checks the result on every rank."""
    # A different seed per rank: DDP must broadcast rank 0's initial weights.
    model = DDP(new_model(seed=rank))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = batch(rank)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()  # DDP averages the gradients over the ranks here
    opt.step()
    mine = flat_params(model.module)

    # Every rank must now hold the same parameters ...
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    for r, theirs in enumerate(gathered):
        check(torch.equal(theirs, mine), f"parameters differ between rank {rank} and rank {r}")

    # ... and they must be those of one plain step on the mean loss over all
    # ranks' data, starting from rank 0's weights.
    ref = new_model(seed=0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    losses = [nn.functional.mse_loss(ref(x), y) for x, y in map(batch, range(world))]
    (sum(losses) / world).backward()
    ref_opt.step()
    check(torch.allclose(mine, flat_params(ref), atol=1e-6),
          f"DDP parameters differ from the reference step by {(mine - flat_params(ref)).abs().max().item()}")
    return loss.item()


@record
def main():
    args = parse_args()
    if args.dump_env:
        # Before anything else, so the dump shows what the launcher gave us.
        with open(f"{args.dump_env}.{os.environ['RANK']}.json", "w") as f:
            json.dump(dict(os.environ), f, indent=1, sort_keys=True)

    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()

    if args.fail_rank is not None:
        if rank == args.fail_rank:
            raise ValueError("boom")
        time.sleep(600)  # a long step: only the launcher's teardown ends it

    check_env(rank, world)
    total = check_all_reduce(rank, world)
    loss = ddp_step(rank, world)
    send_status({"step": 1, "loss": loss})
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}/{world}: ok: all_reduce={total:g} ddp_loss={loss:.6f} params in sync", flush=True)


if __name__ == "__main__":
    sys.exit(main())
