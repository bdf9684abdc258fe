#!/bin/bash
# gtrain's launcher on a real GPU machine: what detection, the planner and
# `gtrain run` make of it, a PyTorch NCCL job under gtrain, and the ranks'
# environment under gtrain beside that under the machine's own torchrun.
# Usage (on the GPU machine, from the repository root):
#   GTRAIN=path/to/gtrain bash docs/gpu/launch/check.sh [OUTDIR]
# OUTDIR (default $OUT, else a temp dir) receives log.txt and topo.json.
# Needs python3 with torch (CUDA) and nvidia-smi. See docs/gpu.md.
set -u
R=$PWD G=${GTRAIN:?set GTRAIN to a gtrain binary} O=${1:-${OUT:-$(mktemp -d)}}
H=$R/docs/gpu/launch PY=$(command -v python3) D=$(mktemp -d)
s() { echo; echo "== $*"; timeout 120 "$@"; echo "rc=$?"; }
cd "$D" || exit 1
{
	s nvidia-smi -L
	s nvidia-smi topo -m
	s "$G" hosts detect
	s "$G" hosts topology
	s "$G" hosts topology --matrix
	timeout 60 "$G" hosts topology -o json >"$O/topo.json"
	echo "topology -o json rc=$?"
	s "$G" plan --model gpt2 --topology "$O/topo.json"
	s "$G" run --dry-run --nproc-per-node gpu --bind gpu -- true
	s "$G" run --nproc-per-node gpu -- "$PY" "$H/ddp_nccl.py"
	s "$G" run --nproc-per-node gpu --bind gpu -- "$PY" "$H/ddp_nccl.py"
	echo; echo "== torch"; "$PY" -c 'import torch; print(torch.__version__)'
	T=$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
	grep -n 'NCCL_ASYNC\|SIGNALS_TO_HANDLE' "$T/distributed/elastic/agent/server/local_elastic_agent.py" "$T/distributed/run.py"
	# The same 2-rank gloo job under torchrun and gtrain, from one clean
	# parent environment; then what each launcher added, side by side.
	clean=(env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 TMPDIR="$D")
	s "${clean[@]}" "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 "$R/examples/ddp_allreduce.py" --dump-env "$D/torchrun"
	s "${clean[@]}" "$G" run --nproc-per-node 2 -- "$PY" "$R/examples/ddp_allreduce.py" --dump-env "$D/gtrain"
	"$PY" - "$D" "$PATH" "$HOME" <<'PY'
import json, sys
d, parent = sys.argv[1], {"PATH": sys.argv[2], "HOME": sys.argv[3], "LANG": "C.UTF-8", "TMPDIR": sys.argv[1]}
for r in (0, 1):
    t, g = ({k: v for k, v in json.load(open(f"{d}/{n}.{r}.json")).items() if parent.get(k) != v} for n in ("torchrun", "gtrain"))
    print(f"rank {r}: torchrun only: {sorted(set(t) - set(g))}; gtrain only: {sorted(set(g) - set(t))}")
    print(f"rank {r}: different values: " + json.dumps({k: [t[k], g[k]] for k in sorted(set(t) & set(g)) if t[k] != g[k]}))
PY
} >"$O/log.txt" 2>&1
cat "$O/log.txt"
