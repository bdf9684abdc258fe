"""One NCCL all-reduce on this rank's GPU, for docs/gpu/launch/check.sh.

Run under a launcher (gtrain run, torchrun): prints the part of the
environment a rank places itself by, then joins the NCCL process group,
all-reduces a tensor of rank+1 and prints the sum, which is
WORLD_SIZE*(WORLD_SIZE+1)/2 when every rank took part.
"""
import os
import time

import torch
import torch.distributed as dist

KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"]


def main():
    print({k: os.environ.get(k) for k in KEYS}, flush=True)
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    start = time.time()
    dist.init_process_group("nccl")
    x = torch.full((1 << 20,), float(dist.get_rank() + 1), device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    n = dist.get_world_size()
    print(f"rank {dist.get_rank()} of {n} device {torch.cuda.get_device_name(local)} "
          f"count {torch.cuda.device_count()} sum {x[0].item()} (want {n * (n + 1) / 2}) "
          f"init+allreduce s {time.time() - start:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
