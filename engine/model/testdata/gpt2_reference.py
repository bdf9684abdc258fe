"""An independent GPT-2 in PyTorch, written the way Hugging Face's
modeling_gpt2 computes it (Conv1D weights stored input x output, pre-LN
blocks, tanh GELU, tied output layer), for the engine's equivalence test.

usage: gpt2_reference.py IN.safetensors OUT.safetensors

IN holds the model's parameters under their Hugging Face names plus the
tensors "x" and "y" (token ids stored as float32) and metadata "layers" and
"heads". OUT receives the gradient of the mean cross-entropy loss for every
parameter (same names) and the loss as metadata "loss". The computation runs
in float64 so that the reference error is far below float32's.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        if e["dtype"] != "F32":
            raise SystemExit(f"{path}: {name}: dtype {e['dtype']}, want F32")
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(buf[base + b : base + end]), dtype=torch.float32)
        out[name] = t.reshape(e["shape"])
    return out, meta


def write_safetensors(path, tensors, meta):
    header = {"__metadata__": meta}
    blobs, off = [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def gpt2_loss(p, x, y, layers, heads):
    B, T = x.shape
    wte = p["transformer.wte.weight"]
    C = wte.shape[1]
    h = wte[x] + p["transformer.wpe.weight"][:T]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(layers):
        pre = f"transformer.h.{l}."
        a = F.layer_norm(h, (C,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps=1e-5)
        qkv = a @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // heads)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + o @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        a = F.layer_norm(h, (C,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps=1e-5)
        m = F.gelu(a @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"], approximate="tanh")
        h = h + m @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps=1e-5)
    logits = h @ wte.t()
    return F.cross_entropy(logits.reshape(B * T, -1), y.reshape(-1))


def main():
    tensors, meta = read_safetensors(sys.argv[1])
    x = tensors.pop("x").to(torch.int64)
    y = tensors.pop("y").to(torch.int64)
    params = {k: v.to(torch.float64).requires_grad_(True) for k, v in tensors.items()}
    loss = gpt2_loss(params, x, y, int(meta["layers"]), int(meta["heads"]))
    loss.backward()
    grads = {k: v.grad for k, v in params.items()}
    write_safetensors(sys.argv[2], grads, {"loss": repr(loss.item())})


if __name__ == "__main__":
    main()
