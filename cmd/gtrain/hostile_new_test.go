package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hostileNewCases tries the commands and modes added with Slurm, etcd and
// per-node launch, gtrain generate, runs show, hosts detect and topology
// and plan --detect: bad counts and files, hosts and rendezvous endpoints
// that never answer, and interrupts while gtrain waits for them.
func hostileNewCases() []hostile {
	interrupted := `^gtrain: interrupted by SIGINT$`
	var cases []hostile
	add := func(cs ...hostile) { cases = append(cases, cs...) }

	// gtrain generate and runs show (a directory is expected: see
	// hostileCases), hosts detect.
	add(
		hostile{name: "generate threads huge", args: []string{"generate", "nope", "--threads", "100000000"}, code: 2,
			stderr: `^gtrain: generate: --threads 100000000: want 0 \(this machine's CPUs\) to 4096$`},
		hostile{name: "generate threads negative", args: []string{"generate", "nope", "--threads", "-3"}, code: 2, stderr: `--threads -3: want 0`},
		hostile{name: "generate tokens huge", args: []string{"generate", "nope", "--tokens", "100000000"}, code: 2, stderr: `--tokens 100000000: want 1 to`},
		hostile{name: "generate samples huge", args: []string{"generate", "nope", "--num-samples", "100000000"}, code: 2, stderr: `--num-samples 100000000: want 1 to`},
		hostile{name: "runs show metrics a FIFO", args: []string{"runs", "show", "run"}, code: 2, keep: []string{"run"},
			stderr: `^gtrain: runs: run/metrics.jsonl: not a regular file: name a run directory`, setup: runDir("fifo")},
		hostile{name: "runs show metrics a directory", args: []string{"runs", "show", "run"}, code: 2, keep: []string{"run"},
			stderr: `^gtrain: runs: run/metrics.jsonl: not a regular file: name a run directory`, setup: runDir("dir")},
		hostile{name: "runs show metrics /dev/zero", args: []string{"runs", "show", "run"}, code: 2, keep: []string{"run"},
			stderr: `^gtrain: runs: run/metrics.jsonl: not a regular file`, setup: runDir("zero")},
		// The newest checkpoint's manifest (for the layout) is a FIFO.
		hostile{name: "runs show interrupted reading a manifest", args: []string{"runs", "show", "run"}, keep: []string{"run"},
			interrupt: inFIFOOpen, code: 130, stderr: interrupted, setup: runDir("manifest-fifo")},
		hostile{name: "hosts detect argument", args: []string{"hosts", "detect", "x"}, code: 2, stderr: `unexpected argument "x"`},
		hostile{name: "hosts topology timeout negative", args: []string{"hosts", "topology", "--hostfile", "hosts", "--ssh-timeout", "-1s"}, code: 2,
			stderr: `--ssh-timeout -1s: must be positive`},
		hostile{name: "plan detect timeout negative", args: []string{"plan", "--detect", "--hostfile", "hosts", "--model", "gpt2", "--ssh-timeout", "-1s"},
			code: 2, stderr: `^gtrain: plan: --ssh-timeout -1s: must be positive$`},
	)
	// Hosts: Slurm hostlists are bounded; Slurm outside an allocation.
	add(
		hostile{name: "run hosts range huge", args: []string{"run", "--hosts", "node[01-99999]", "--dry-run", "--", "true"}, code: 2,
			stderr: `range 01-99999 has more than 65536 hosts, the most a job may run on$`},
		hostile{name: "run hosts product huge", args: []string{"run", "--hosts", "n[1-300]x[1-300]", "--dry-run", "--", "true"}, code: 2, stderr: `^gtrain: hostfiles: hostlist`},
		hostile{name: "run hosts range overflow", args: []string{"run", "--hosts", "node[1-99999999999999999999]", "--dry-run", "--", "true"}, code: 2,
			stderr: `want a number or lo-hi of up to 18 digits`},
		hostile{name: "run slurm outside an allocation", args: []string{"run", "--hostfile", "slurm", "--", "true"}, code: 2,
			stderr: `^gtrain: hostfiles: not inside a Slurm allocation \(SLURM_JOB_ID and SLURM_JOB_NODELIST are unset\): run gtrain from an sbatch script or salloc`},
	)
	add(hostsNotAnswering()...)
	add(perNodeCases()...)
	return cases
}

// hostsNotAnswering: a host whose sshd accepts and never answers fails
// after --ssh-timeout, and an interrupt ends the wait at once; a host
// that refuses fails at once, with one line.
func hostsNotAnswering() []hostile {
	slow, dead := sshHost("silent"), sshHost("closed")
	ssh := []string{"--hostfile", "slowhost", "--ssh-config", "ssh_config", "--ssh-timeout", "50s"}
	keep := []string{"slowhost", "ssh_config"}
	stopped := `^gtrain: (interrupted by SIGINT|ssh: slowhost: ssh handshake with \S+: interrupted by SIGINT)$`
	var cases []hostile
	for _, cmd := range []struct{ pre, post []string }{
		{[]string{"hosts", "check"}, nil},
		{[]string{"hosts", "topology"}, nil},
		{[]string{"hosts", "topology", "--matrix"}, nil},
		{[]string{"hosts", "topology", "-o", "json"}, nil},
		{[]string{"plan", "--detect", "--model", "gpt2"}, nil},
		{[]string{"run"}, []string{"--", "true"}},
	} {
		cases = append(cases, hostile{name: strings.Join(cmd.pre, " ") + " interrupted waiting for a silent host",
			args: slices.Concat(cmd.pre, ssh, cmd.post), keep: keep, interrupt: "setup", code: 130, stderr: stopped, setup: slow})
	}
	cases = append(cases,
		hostile{name: "hosts topology host refuses", args: []string{"hosts", "topology", "--hostfile", "slowhost", "--ssh-config", "ssh_config"}, keep: keep,
			code: 1, stderr: `^gtrain: hosts topology: .*slowhost: connect to 127\.0\.0\.1:\d+: .*connection refused \(refused: is sshd running on that port\?\)$`, setup: dead},
		hostile{name: "plan detect host refuses", args: []string{"plan", "--detect", "--model", "gpt2", "--hostfile", "slowhost", "--ssh-config", "ssh_config"}, keep: keep,
			code: 1, stderr: `^gtrain: ssh: slowhost: connect to 127\.0\.0\.1:\d+: .*connection refused \(refused: is sshd running on that port\?\)$`, setup: dead},
		hostile{name: "plan detect host silent", args: []string{"plan", "--detect", "--model", "gpt2", "--hostfile", "slowhost", "--ssh-config", "ssh_config", "--ssh-timeout", "1s"},
			keep: keep, code: 1, stderr: `^gtrain: ssh: slowhost: ssh handshake with \S+: .*timeout \(timed out: is the host up and reachable from here\?\)$`, setup: slow},
	)
	return cases
}

// perNodeCases: per-node gtrain run (--nnodes, --node-rank) while it
// waits for the other nodes or for its rendezvous, over the c10d
// rendezvous and etcd, and its job secret file.
func perNodeCases() []hostile {
	node := func(rank, secret string, extra ...string) []string {
		return append([]string{"run", "--nnodes", "2", "--node-rank", rank, "--rdzv-id", "job", "--rdzv-secret-file", secret}, extra...)
	}
	keep := []string{"secret"}
	var cases []hostile
	for _, rank := range []string{"0", "auto"} {
		cases = append(cases, hostile{name: "per-node rank " + rank + " interrupted waiting for the other node", keep: keep,
			// The case waits for an established connection to the
			// endpoint, which the kernel reports at the TCP handshake,
			// before the store's own authentication: the interrupt can
			// land there, in the dial, or in round 0 (the usual case).
			interrupt: "setup", code: 130, stderr: `^gtrain: launch: (round 0|rendezvous) at 127\.0\.0\.1:\d+: interrupted by SIGINT$`,
			setup: func(t *testing.T, dir string) ([]string, <-chan struct{}) {
				writeSecret(t, dir)
				port := freePort(t)
				args := node(rank, "secret", "--rdzv-endpoint", "127.0.0.1:"+port, "--", "sleep", "300")
				return args, established(t, port)
			}})
	}
	silentEndpoint := func(extra ...string) func(*testing.T, string) ([]string, <-chan struct{}) {
		return func(t *testing.T, dir string) ([]string, <-chan struct{}) {
			writeSecret(t, dir)
			addr, accepted := silentListener(t)
			return append(node("1", "secret", "--rdzv-endpoint", addr), append(extra, "--", "sleep", "300")...), accepted
		}
	}
	cases = append(cases,
		// Another program holds the endpoint's port: this node dials it.
		// The interrupt is the whole story (it said "no node hosts it
		// after 1m0s" before it, which was not so).
		hostile{name: "per-node interrupted dialling a silent rendezvous", keep: keep, interrupt: "setup", code: 130,
			stderr: `^gtrain: launch: rendezvous at 127\.0\.0\.1:\d+: interrupted by SIGINT$`, setup: silentEndpoint()},
		hostile{name: "per-node etcd interrupted connecting", keep: keep, interrupt: "setup", code: 130,
			stderr: `^gtrain: launch: rendezvous: etcd 127\.0\.0\.1:\d+: interrupted by SIGINT$`, setup: silentEndpoint("--rdzv-backend", "etcd")},
		// After etcd's dial timeout, 10 s.
		hostile{name: "per-node etcd not answering", keep: keep, code: 1,
			stderr: `^gtrain: launch: rendezvous: etcd 127\.0\.0\.1:\d+: connect: context deadline exceeded \(is etcd running there`, setup: silentEndpoint("--rdzv-backend", "etcd")},
		hostile{name: "run etcd not answering", code: 1,
			stderr: `^gtrain: launch: rendezvous: etcd 127\.0\.0\.1:\d+: connect: context deadline exceeded \(is etcd running there`,
			setup: func(t *testing.T, dir string) ([]string, <-chan struct{}) {
				addr, _ := silentListener(t)
				return []string{"run", "--rdzv-backend", "etcd", "--rdzv-endpoint", addr, "--", "true"}, nil
			}},
		hostile{name: "run etcd interrupted connecting", interrupt: "setup", code: 130,
			stderr: `^gtrain: launch: rendezvous: etcd 127\.0\.0\.1:\d+: interrupted by SIGINT$`,
			setup: func(t *testing.T, dir string) ([]string, <-chan struct{}) {
				addr, accepted := silentListener(t)
				return []string{"run", "--nproc-per-node", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", addr, "--", "sleep", "300"}, accepted
			}},
	)
	// The job secret file.
	secret := func(file string) []string {
		return node("0", file, "--rdzv-endpoint", "127.0.0.1:1", "--", "true")
	}
	cases = append(cases,
		hostile{name: "per-node secret FIFO", args: secret("fifo"), interrupt: inFIFOOpen, code: 130, stderr: `^gtrain: interrupted by SIGINT$`},
		hostile{name: "per-node secret silent stdin", args: secret("/dev/stdin"), stdin: "silent", interrupt: inPipeRead, code: 130,
			stderr: `^gtrain: interrupted by SIGINT$`},
		hostile{name: "per-node secret huge", args: secret("big"), code: 2, stderr: `--rdzv-secret-file: big: larger than 4 KiB, the limit`},
		hostile{name: "per-node secret /dev/zero", args: secret("/dev/zero"), code: 2, stderr: `/dev/zero: larger than 4 KiB, the limit`},
		hostile{name: "per-node secret directory", args: secret("adir"), code: 2, stderr: `--rdzv-secret-file: adir: is a directory$`},
		hostile{name: "per-node secret missing", args: secret("nope"), code: 2, stderr: `--rdzv-secret-file: nope: no such file`},
	)
	return cases
}

// runDir makes a run directory "run" with a metrics file that is kind:
// "fifo", "dir", "zero" (a link to /dev/zero), or, with "manifest-fifo", a
// good metrics file and a step directory whose manifest is a FIFO.
func runDir(kind string) func(*testing.T, string) ([]string, <-chan struct{}) {
	return func(t *testing.T, dir string) ([]string, <-chan struct{}) {
		run := filepath.Join(dir, "run")
		metrics := filepath.Join(run, "metrics.jsonl")
		var err error
		if err = os.Mkdir(run, 0o755); err == nil {
			switch kind {
			case "fifo":
				err = syscall.Mkfifo(metrics, 0o600)
			case "dir":
				err = os.Mkdir(metrics, 0o755)
			case "zero":
				err = os.Symlink("/dev/zero", metrics)
			case "manifest-fifo":
				step := filepath.Join(run, "step-00000001")
				line := `{"step":1,"steps":1,"loss":5.5,"time":1,"step_ms":10}` + "\n"
				if err = os.WriteFile(metrics, []byte(line), 0o644); err == nil {
					if err = os.Mkdir(step, 0o755); err == nil {
						err = syscall.Mkfifo(filepath.Join(step, "manifest.json"), 0o600)
					}
				}
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil, nil
	}
}

// sshHost writes a hostfile "slowhost" and an ssh_config that sends it to
// a loopback port that is "silent" (accepts and never answers, as a hung
// host's sshd) or "closed"; setup's channel closes once gtrain has
// connected and sent its SSH version.
// A loopback name would be this machine, reached without SSH.
func sshHost(kind string) func(*testing.T, string) ([]string, <-chan struct{}) {
	return func(t *testing.T, dir string) ([]string, <-chan struct{}) {
		addr, accepted := silentListener(t)
		if kind == "closed" {
			addr, accepted = closedAddr(t), nil
		}
		_, port, _ := net.SplitHostPort(addr)
		conf := fmt.Sprintf("Host slowhost\n  HostName 127.0.0.1\n  Port %s\n", port)
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		must(os.WriteFile(filepath.Join(dir, "ssh_config"), []byte(conf), 0o644))
		must(os.WriteFile(filepath.Join(dir, "slowhost"), []byte("slowhost slots=1\n"), 0o644))
		return nil, accepted
	}
}

// silentListener listens on a loopback port, accepts connections and never
// writes to them; spoken closes once a client has sent its first byte
// (SSH's version, the rendezvous' hello and gRPC's preface come first):
// it has connected and waits for an answer.
func silentListener(t *testing.T) (addr string, spoken <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{})
	var once sync.Once
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() {
				if _, err := c.Read(make([]byte, 1)); err == nil {
					once.Do(func() { close(ch) })
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String(), ch
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// freePort is a TCP port free a moment ago.
func freePort(t *testing.T) string {
	_, port, _ := net.SplitHostPort(closedAddr(t))
	return port
}

// established closes its channel once a TCP connection to port is
// established on this machine (in /proc/net/tcp or tcp6): a per-node node
// hosting the rendezvous has connected to it, to join the round.
func established(t *testing.T, port string) <-chan struct{} {
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(":%04X", p)
	ch := make(chan struct{})
	go func() {
		for {
			for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
				if connectedTo(f, want) {
					close(ch)
					return
				}
			}
			select {
			case <-t.Context().Done():
				return
			case <-time.After(10 * time.Millisecond): // polling /proc
			}
		}
	}()
	return ch
}

// connectedTo reports whether the socket table file lists an established
// connection (state 01) whose remote address ends in port (":HHHH").
func connectedTo(file, port string) bool {
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 3 && strings.HasSuffix(fields[2], port) && fields[3] == "01" {
			return true
		}
	}
	return false
}

// writeSecret writes the job secret file "secret" per-node mode needs.
func writeSecret(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("hostile-test-job-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}
