# gtrain: two commands do everything on a fresh Debian machine (run as root,
# or with sudo available):
#   make demo   build gtrain and run the built-in default job (a tiny GPT, ~30 s)
#   make test   install what the tests need, then run the whole suite
SHELL := /bin/bash
GO ?= go
PYTHON ?= /usr/bin/python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# go-nvml's cgo code (launch/detect) calls NVML functions NVIDIA marks
# deprecated; gcc's warnings about them say nothing about gtrain.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: build demo demo-ddp test test-busy deps vet fuzz bench-collectives bench-collectives-hosts bench-gemm bench-train bench-dp bench-grid bench-plan bench-ckpt-async bench-bf16

build:
	$(GO) build -o bin/gtrain ./cmd/gtrain

# Debian's PyTorch (1.13, CPU) is the real peer of the launcher tests; the
# multi-host tests run real OpenSSH servers in network namespaces (iproute2),
# and the Slurm tests a real Slurm (slurm-wlm: slurmctld, slurmd, the
# clients; munge) on them (internal/slurmtest).
deps:
	@if ! $(PYTHON) -c 'import torch.distributed' 2>/dev/null || ! [ -x /usr/sbin/sshd ] || \
		! command -v ssh >/dev/null || ! command -v ip >/dev/null || \
		! [ -x /usr/sbin/slurmctld ] || ! [ -x /usr/sbin/slurmd ] || ! [ -x /usr/sbin/munged ] || \
		! command -v sbatch >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
			python3-torch openssh-server openssh-client iproute2 slurm-wlm munge; \
	fi
	@# A real Prometheus scrapes `gtrain run --metrics-addr`; protoc and
	@# Python's protobuf read TensorBoard event files back (internal/tfevents).
	@if ! command -v prometheus >/dev/null || ! command -v protoc >/dev/null || \
		! /usr/bin/python3 -c 'import google.protobuf' 2>/dev/null; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
			prometheus protobuf-compiler python3-protobuf; \
	fi
	@# The etcd rendezvous tests start a real etcd (internal/etcdtest).
	@if ! command -v etcd >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends etcd-server; \
	fi

demo: build
	./bin/gtrain run

demo-ddp: deps build
	./bin/gtrain run --nproc-per-node 4 -- $(PYTHON) examples/ddp_allreduce.py

vet:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags purego ./engine/comm ./engine/kernels
	GOARCH=arm64 $(GO) vet ./engine/kernels

# A short coverage-guided run of each parser fuzzer on top of the kept corpus.
# Budgets are counts of executions (about 10 s each on a quiet 2-core
# machine), not durations: Go 1.26's fuzz coordinator can fail a target with
# a bare "context deadline exceeded" when a -fuzztime duration expires while
# a starved worker is mid-call (golang/go#75804, fixed in Go 1.27), which a
# busy machine hit. A count has no deadline to race; a real finding still
# fails and writes its input to testdata/fuzz.
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=250000x ./hostfiles
	$(GO) test -run='^$$' -fuzz='^FuzzSelect$$' -fuzztime=300000x ./hostfiles
	$(GO) test -run='^$$' -fuzz='^FuzzExpandHostlist$$' -fuzztime=300000x ./hostfiles
	$(GO) test -run='^$$' -fuzz='^FuzzExpandTasksPerNode$$' -fuzztime=200000x ./hostfiles
	$(GO) test -run='^$$' -fuzz='^FuzzDecode$$' -fuzztime=600000x ./rendezvous
	$(GO) test -run='^$$' -fuzz='^FuzzParseEtcdEndpoint$$' -fuzztime=100000x ./rendezvous
	$(GO) test -run='^$$' -fuzz='^FuzzOpen$$' -fuzztime=20000x ./engine/data
	$(GO) test -run='^$$' -fuzz='^FuzzReadMeta$$' -fuzztime=15000x ./engine/data
	$(GO) test -run='^$$' -fuzz='^FuzzEncodeBytes$$' -fuzztime=300000x ./engine/data
	$(GO) test -run='^$$' -fuzz='^FuzzReadHeader$$' -fuzztime=800000x ./engine/ckpt
	$(GO) test -run='^$$' -fuzz='^FuzzParseLink$$' -fuzztime=250000x ./planner
	$(GO) test -run='^$$' -fuzz='^FuzzParseTopology$$' -fuzztime=400000x ./planner
	$(GO) test -run='^$$' -fuzz='^FuzzParseCount$$' -fuzztime=50000x ./planner

test: export GTRAIN_REQUIRE_ETCD = 1
test: export GTRAIN_REQUIRE_PROMETHEUS = 1
test: export GTRAIN_REQUIRE_PROTOBUF = 1
# -timeout: engine/train and cmd/gtrain take about 5 minutes each under
# -race on a quiet 2-core machine, twice that with both cores loaded, which
# is go test's default limit.
test: deps vet
	GTRAIN_REQUIRE_TORCH=1 GTRAIN_REQUIRE_NETNS=1 GTRAIN_REQUIRE_SLURM=1 $(GO) test -race -count=1 -timeout 25m ./...
	$(GO) test -count=1 -tags purego ./engine/kernels
	$(PYTHON) -B docs/bench/stats.py
	$(MAKE) fuzz

# The suite on a busy machine: `make test` N times (default 3) with every
# core taken by a busy loop and 2 GiB held by a memory hog; prints each run's
# wall time and stops at the first failure.
test-busy:
	bash .ci/busy-test $(or $(N),3)

# gtrain's all-reduce against Open MPI and PyTorch gloo on this machine,
# interleaved, 5 runs, rewriting docs/benchmarks.md's table (installs
# openmpi-bin, libopenmpi-dev, python3-torch).
bench-collectives: build
	GTRAIN=$(CURDIR)/bin/gtrain bash docs/bench/collectives.sh --install --write 5

# All-reduce, reduce-scatter and all-gather across two network-namespace hosts
# (veth, bare and limited to 10gbit by tc), 1 and 2 ranks per host, against
# Open MPI over TCP and gloo; 3 runs, rewrites docs/benchmarks.md's tables.
# Needs root; installs openmpi-bin, libopenmpi-dev, python3-torch, iproute2.
bench-collectives-hosts: build
	GTRAIN=$(CURDIR)/bin/gtrain bash docs/bench/collectives_hosts.sh --install --write 3

# GEMM GFLOP/s against OpenBLAS (installs libopenblas-dev for the peer).
bench-gemm:
	bash docs/bench/gemm.sh --install

# Training tokens/s of the engine against PyTorch, same model and batch.
bench-train: build
	GTRAIN=$(CURDIR)/bin/gtrain bash docs/bench/train.sh --install --write 5

# Training tokens/s with precision bf16 (matmuls on bfloat16, AVX-512 BF16)
# against fp32 on the small and gpt2 presets, and PyTorch's autocast-bf16
# on the same model, 3 interleaved runs (needs deps' torch; OpenBLAS for
# PyTorch's fp32 comes with bench-train's --install).
bench-bf16: deps build
	GTRAIN=$(CURDIR)/bin/gtrain bash docs/bench/bf16.sh --torch --write 3

# Data-parallel tokens/s of the engine (1 rank; 2 ranks at ZeRO 0-3) against
# PyTorch's single process, DDP and DDP + ZeroRedundancyOptimizer over gloo.
bench-dp: build
	GTRAIN=$(CURDIR)/bin/gtrain bash docs/bench/dp.sh --install --write 5

# The small preset on 1 rank, DP2, TP2, PP2 and the 4-rank layouts, measured
# (3 interleaved runs, medians) beside the planner's prediction for each.
bench-grid: build
	GTRAIN=$(CURDIR)/bin/gtrain bash docs/bench/grid.sh --write 3

# Planner search time: the 1T model on 3072 GPUs, 5 runs, medians.
bench-plan:
	bash docs/bench/plan.sh 5

# The training stall of a gpt2 checkpoint, synchronous vs checkpoint.async
# (3 interleaved runs of each, medians), and the snapshot's memory.
bench-ckpt-async:
	bash docs/bench/ckpt_async.sh 3

# Gradient compression (parallel.grad_compression none, int8, powersgd:4):
# bytes on the wire, step time and loss on one host and across two
# network-namespace hosts whose link tc limits to 100mbit (root for the
# hosts), 3 interleaved runs, medians.
.PHONY: bench-compression
bench-compression: build
	GTRAIN=$(CURDIR)/bin/gtrain bash docs/bench/compression.sh --write 3

# SSH fan-out: start-up and teardown against 1..64 network-namespace hosts
# (one sshd each), 3 interleaved runs per count, medians (root; deps'
# openssh-server and iproute2). FANOUT_HOSTS=1,4,16,32 picks the counts.
FANOUT_HOSTS ?= 1,4,16,32,64
.PHONY: bench-fanout
bench-fanout: deps
	bash docs/bench/fanout.sh 3 $(FANOUT_HOSTS)
