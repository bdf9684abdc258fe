"""PyTorch peer of gtrain's engine benchmark: the same GPT-2 (pre-LN,
learned positions, tanh GELU, tied output layer, no dropout), the same batch,
AdamW with weight decay and gradient clipping, on the CPU with a fixed number
of threads. Prints one JSON line: the median step time and tokens/s over the
steps after warm-up.

usage: train_gpt2_torch.py --layers L --heads H --embd C --seq T --vocab V
                           --batch B --steps N --warmup W --threads K
                           [--precision fp32|bf16]

--precision bf16 runs forward (and so backward) under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's CPU mixed precision:
matmuls and linears on bfloat16 (oneDNN where the CPU has AVX-512 BF16),
layer norms, softmax and the loss in float32, float32 parameters and AdamW.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.h))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.embd)
        self.wpe = nn.Embedding(a.seq, a.embd)
        self.h = nn.ModuleList(Block(a.embd, a.heads) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.embd)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name in ("layers", "heads", "embd", "seq", "vocab", "batch", "steps", "warmup", "threads"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    other = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(a.vocab, (a.batch, a.seq))
        y = torch.randint(a.vocab, (a.batch, a.seq))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({"peer": "pytorch " + torch.__version__, "threads": a.threads, "precision": a.precision,
                      "step_ms": med * 1000, "tokens_per_s": a.batch * a.seq / med}))


if __name__ == "__main__":
    main()
