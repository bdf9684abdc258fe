// Package fanoutbench measures how the SSH launcher's start-up and teardown
// grow with the number of hosts: `gtrain run --hostfile` against N real
// hosts (network namespaces with one OpenSSH sshd each, internal/netns),
// timed from the launcher's own JSON events.
//
// It is a benchmark, not a test: its only file is built with the
// fanoutbench tag, which `make test` does not set. Run it with `make
// bench-fanout` or docs/bench/fanout.sh (as root); results and the
// extrapolation to 1,000 and 10,000 hosts are in docs/benchmarks.md.
package fanoutbench
