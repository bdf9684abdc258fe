#!/usr/bin/env bash
# SSH fan-out: start-up and teardown of `gtrain run --hostfile` against N
# real hosts (network namespaces, one OpenSSH sshd each: internal/netns),
# one rank per host, timed from the launcher's JSON events.
# Usage: docs/bench/fanout.sh [runs] [host counts]
#   runs (default 3): runs of each kind per host count, interleaved
#   host counts (default 1,4,16,32,64): comma-separated, 1 to 200; 128
#   takes some 13 minutes a run on a 2-core machine
# Needs root, iproute2 and openssh-server/-client (make deps). Every
# namespace and sshd is removed when a host count is done, also on failure
# (and a killed run's leftovers by the next one). Prints a markdown table
# of medians; docs/benchmarks.md ("SSH fan-out") explains the columns.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-3}
hosts=${2:-1,4,16,32,64}
if [ "$(id -u)" != 0 ]; then
	echo "fanout.sh: network namespaces need root: run it with sudo -E" >&2
	exit 2
fi
# pyenv's rehash (run by root's .bashrc in every SSH session here) locks
# ~/.pyenv/shims/.pyenv-shim; a rehash killed mid-way (a run's cleanup
# kills everything in its namespaces) leaves it, and every later shell
# then waits 60 s for it, which times the hosts out.
lock=${PYENV_ROOT:-$HOME/.pyenv}/shims/.pyenv-shim
if [ -e "$lock" ] && ! pgrep -f pyenv-rehash >/dev/null; then
	echo "fanout.sh: $lock exists but no pyenv rehash runs: a stale lock that makes every shell wait 60 s; remove it first" >&2
	exit 2
fi
echo "# docs/bench/fanout.sh $runs $hosts: $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(ssh -V 2>&1), load $(cut -d' ' -f1-3 /proc/loadavg)"
# The machine's limits for many hosts: open files, ephemeral ports.
echo "# ulimit -n $(ulimit -n) (hard $(ulimit -Hn)); ip_local_port_range $(cat /proc/sys/net/ipv4/ip_local_port_range | xargs)"
FANOUT_RUNS=$runs FANOUT_HOSTS=$hosts GTRAIN_REQUIRE_NETNS=1 \
	go test -tags fanoutbench -run '^TestFanout$' -count=1 -v -timeout 120m ./internal/fanoutbench
