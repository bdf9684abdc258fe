#!/bin/bash
# The device-side half of the issue-21 feasibility probe (docs/gpu.md):
# what CUDA, cuBLAS and NCCL a GPU machine has and where, then gpuprobe,
# which drives them from Go without cgo. Build gpuprobe first, on a
# machine with Go (the GPU machine has none):
#   (cd docs/gpu/probe && CGO_ENABLED=0 go build -o gpuprobe .)
# then run this on the GPU machine with docs/gpu/probe/gpuprobe carried
# along (it is ignored by git); OUT is where the PTX is written.
set -u
OUT=${OUT:-$(mktemp -d)}
cd "$(dirname "$0")"
echo "== GPU"; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
echo "== nvcc"; nvcc --version | tail -2
echo "== torch"; python3 -c "import torch;print(torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" 2>&1 | tail -1
echo "== loader"; ldconfig -p | grep -E "libcuda\.so|libnccl|libcublas|libcudart" | head
SP=$(python3 -c "import nvidia,os;print(list(nvidia.__path__)[0])" 2>/dev/null)
echo "== python nvidia packages: $SP"; ls "$SP" 2>/dev/null | tr '\n' ' '; echo
find "$SP" /usr/local/cuda*/lib64 /usr/lib/x86_64-linux-gnu -maxdepth 3 \( -name 'libcublas*.so*' -o -name 'libnccl*.so*' -o -name 'libcuda.so*' -o -name 'libcudart.so*' \) 2>/dev/null | head -20
CUBLAS=$(find "$SP" /usr/local/cuda*/lib64 -name 'libcublas.so.*' 2>/dev/null | head -1)
NCCL=$(find "$SP" /usr/local/cuda*/lib64 /usr/lib/x86_64-linux-gnu -name 'libnccl.so.*' 2>/dev/null | head -1)
echo "cublas=$CUBLAS nccl=$NCCL"
echo "== ptx"; time nvcc -ptx -arch=compute_90 vecadd.cu -o "$OUT/vecadd.ptx" && head -c 300 "$OUT/vecadd.ptx" | grep -E "version|target"
export LD_LIBRARY_PATH=$(dirname "$CUBLAS"):$(dirname "$NCCL"):${LD_LIBRARY_PATH:-}
echo "== probe (static-ish Go, CGO_ENABLED=0, purego)"; time timeout 120 ./gpuprobe "$OUT/vecadd.ptx" "$CUBLAS" "$NCCL"
echo "rc=$?"
