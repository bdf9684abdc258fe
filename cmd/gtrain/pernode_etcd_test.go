package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gtrain/gtrain/internal/etcdtest"
)

// Per-node mode over a real etcd: two "nodes" on this machine, named
// 127.0.0.1 and 127.0.0.2 (both loopback), each its own gtrain run.

// etcdNodeArgs are the flags of node i (0 or 1) of a 2-node etcd job.
func etcdNodeArgs(srv *etcdtest.Server, id string, i int, out string, script string) []string {
	return []string{"run", "--nnodes", "2", "--node-rank", "auto", "--rdzv-backend", "etcd",
		"--rdzv-endpoint", srv.Endpoint, "--rdzv-id", id, "--local-addr", "127.0.0." + strconv.Itoa(i+1),
		"--nproc-per-node", "2", "--table", "never", "--heartbeat", "1s", "--grace-period", "3s",
		"--join-timeout", "60s", "--env", "OUT=" + out, "--", "sh", "-c", script}
}

// waitRankFiles waits until every file exists, or fails after within (a
// backstop: ranks write them when they run).
func waitRankFiles(t *testing.T, within time.Duration, files ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, f := range files {
		for {
			if _, err := os.Stat(f); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not written within %v", f, within)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// upFiles are the files the ranks of a 2-node job write when they run.
func upFiles(dir string) []string {
	var fs []string
	for r := range 4 {
		fs = append(fs, filepath.Join(dir, "up."+strconv.Itoa(r)))
	}
	return fs
}

// rankScript marks the rank up, then waits for $OUT/go.
const rankScript = `touch "$OUT/up.$RANK"; while [ ! -e "$OUT/go" ]; do sleep 0.1; done; echo "rank $RANK of $WORLD_SIZE done"`

// TestPerNodeEtcdLauncherKilled: SIGKILL of one node's gtrain run tears
// down the other node within a bound, which exits 1 naming the node.
func TestPerNodeEtcdLauncherKilled(t *testing.T) {
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	n0 := startNode(t, nil, 0, testSecret, etcdNodeArgs(srv, "etcd-kill", 0, dir, rankScript)...)
	n1 := startNode(t, nil, 1, testSecret, etcdNodeArgs(srv, "etcd-kill", 1, dir, rankScript)...)
	waitRankFiles(t, time.Minute, upFiles(dir)...)
	if err := n1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code := n0.wait(t, time.Minute)
	took := time.Since(start)
	n1.wait(t, time.Minute)
	if code != 1 || !strings.Contains(n0.err.String(), "node 127.0.0.2: its gtrain run sent no heartbeat") {
		t.Errorf("node 0: exit %d, want 1 and a message naming node 127.0.0.2:\n%s", code, n0.err.String())
	}
	// 5 missed beats of 1 s, the 3 s grace period, and slack for a loaded machine.
	if took > 30*time.Second {
		t.Errorf("node 0 took %v to stop after node 1's launcher was killed: want under 30s", took)
	}
}

// TestPerNodeEtcdWrongSecret: a node whose secret is not the job's is
// refused by the values the job signed, saying so.
func TestPerNodeEtcdWrongSecret(t *testing.T) {
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// Node 0 joins first (its count key is there) so that the job's
	// values are signed with its secret.
	key := "/gtrain/etcd-secret/nodes/kv/pernode/0/count"
	w := cli.Watch(ctx, key)
	n0 := startNode(t, nil, 0, testSecret, etcdNodeArgs(srv, "etcd-secret", 0, dir, "true")...)
	if resp, err := cli.Get(ctx, key); err != nil || len(resp.Kvs) == 0 {
		<-w
	}
	wrong := startNode(t, nil, 1, "another-secret-of-16+bytes", etcdNodeArgs(srv, "etcd-secret", 1, dir, "true")...)
	if code := wrong.wait(t, time.Minute); code == 0 || !strings.Contains(wrong.err.String(), "every node must have the same --rdzv-secret-file") {
		t.Errorf("node with a wrong secret: exit %d, want it refused naming the secret:\n%s", code, wrong.err.String())
	}
	_ = n0.cmd.Process.Kill()
	n0.wait(t, time.Minute)
}

// TestPerNodeEtcdRestart: etcd stopped for longer than the nodes' silence
// limit and started again on its data, mid-job: the job goes on and ends
// well on both nodes.
func TestPerNodeEtcdRestart(t *testing.T) {
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	n0 := startNode(t, nil, 0, testSecret, etcdNodeArgs(srv, "etcd-restart", 0, dir, rankScript)...)
	n1 := startNode(t, nil, 1, testSecret, etcdNodeArgs(srv, "etcd-restart", 1, dir, rankScript)...)
	waitRankFiles(t, time.Minute, upFiles(dir)...)
	srv.Stop(t)
	time.Sleep(6 * time.Second) // the outage itself: longer than 5 missed beats
	srv.Restart(t)
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, n := range []*node{n0, n1} {
		if code := n.wait(t, 2*time.Minute); code != 0 {
			t.Errorf("node %d: exit %d after etcd restarted\n%s\netcd:\n%s", i, code, n.err.String(), srv.Log())
		}
	}
	for i, n := range []*node{n0, n1} {
		if c := strings.Count(n.out.String(), " of 4 done"); c != 2 {
			t.Errorf("node %d: %d ranks finished, want 2:\n%s", i, c, n.out.String())
		}
	}
}
