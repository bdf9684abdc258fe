"""A torch.distributed job that survives a restart on another world size.

Run it under gtrain's elastic membership (or torchrun's elastic agent):

    gtrain run --hostfile hosts --nnodes 2:3 --max-restarts 3 -- \
        python3 examples/ddp_elastic.py --ckpt /shared/ddp-ckpt

It trains a small nn.Linear with DistributedDataParallel on a global batch of
GLOBAL samples per step, whatever the world size: each rank takes its share
of the step's samples (drawn from the step's seed), so the loss of a step
does not depend on how many ranks computed it. Rank 0 saves the model and
the optimizer after every step (atomically, to --ckpt on a file system every
host sees); every attempt resumes from there, as torchrun's elastic agent
leaves resuming to the script. Rank 0 prints "attempt A world W" once and
"step S loss L" for every step.

Test hook: --hold-after S makes the first attempt's ranks (restart count 0)
write HOLD.<rank> next to the checkpoint after step S and then wait to be
stopped, so a test can cut a host off at a known point.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

IN_FEATURES, OUT_FEATURES, GLOBAL = 8, 2, 12


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True, help="checkpoint directory every host sees")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--hold-after", type=int, default=0, metavar="S")
    return p.parse_args()


def batch(step):
    """The step's global batch, the same on every rank and every attempt."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL, IN_FEATURES, generator=g)
    y = torch.randn(GLOBAL, OUT_FEATURES, generator=g)
    return x, y


def load(path, model, opt):
    """The step to start from: the checkpoint's, else 0."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return state["step"]


def save(path, model, opt, step):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def hold(ckpt, rank):
    """Say this rank is at the hold point, then wait to be stopped."""
    with open(os.path.join(ckpt, "HOLD.%d" % rank), "w") as f:
        f.write("held\n")
    while True:
        time.sleep(0.05)


@record
def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if GLOBAL % world:
        raise ValueError("world size %d does not divide the global batch %d" % (world, GLOBAL))
    torch.manual_seed(0)
    model = nn.Linear(IN_FEATURES, OUT_FEATURES)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = os.path.join(args.ckpt, "model.pt")
    start = load(path, model, opt)
    ddp = DDP(model)
    if rank == 0:
        print("attempt %d world %d from step %d" % (restart, world, start), flush=True)
    share = GLOBAL // world
    for step in range(start + 1, args.steps + 1):
        x, y = batch(step)
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP averages the gradients: the global batch's
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            save(path, model, opt, step)
            print("step %d loss %.6f" % (step, total.item() / world), flush=True)
        dist.barrier()  # the checkpoint is on disk before any rank goes on
        if restart == 0 and step == args.hold_after:
            hold(args.ckpt, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
