# gtrain: two commands do everything on a fresh Debian machine (run as root,
# or with sudo available):
#   make demo   build gtrain and launch the example PyTorch DDP job on 4 local ranks
#   make test   install what the tests need, then run the whole suite
SHELL := /bin/bash
GO ?= go
PYTHON ?= /usr/bin/python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: build demo test deps vet fuzz bench-collectives

build:
	$(GO) build -o bin/gtrain ./cmd/gtrain

# Debian's PyTorch (1.13, CPU) is the real peer of the launcher tests; the
# multi-host tests run real OpenSSH servers in network namespaces (iproute2).
deps:
	@if ! $(PYTHON) -c 'import torch.distributed' 2>/dev/null || ! [ -x /usr/sbin/sshd ] || \
		! command -v ssh >/dev/null || ! command -v ip >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
			python3-torch openssh-server openssh-client iproute2; \
	fi

demo: deps build
	./bin/gtrain run --nproc-per-node 4 -- $(PYTHON) examples/ddp_allreduce.py

vet:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags purego ./engine/comm

# A short coverage-guided run of each parser fuzzer on top of the kept corpus.
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=15s ./hostfiles
	$(GO) test -run='^$$' -fuzz='^FuzzSelect$$' -fuzztime=15s ./hostfiles
	$(GO) test -run='^$$' -fuzz='^FuzzDecode$$' -fuzztime=15s ./rendezvous

test: deps vet
	GTRAIN_REQUIRE_TORCH=1 GTRAIN_REQUIRE_NETNS=1 $(GO) test -race -count=1 ./...
	$(MAKE) fuzz

# gtrain's all-reduce against Open MPI and PyTorch gloo on this machine,
# interleaved, 5 runs (installs openmpi-bin, libopenmpi-dev, python3-torch).
bench-collectives: build
	GTRAIN=$(CURDIR)/bin/gtrain bash docs/bench/collectives.sh --install 5
