package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gtrain/gtrain/internal/etcdtest"
	"github.com/gtrain/gtrain/internal/netns"
)

// Per-node mode over a real etcd across network-namespace hosts: each of
// hosts h0 and h1 runs one node's `gtrain run`, and etcd runs on a third
// host, h2, as it would on a machine of its own; the nodes reach it over
// the bridge.

// etcdJob is a 2-node etcd job's hosts and its etcd.
type etcdJob struct {
	c   *netns.Cluster
	srv *etcdtest.Server
}

// etcdHost is the host of the cluster that runs etcd.
const etcdHost = 2

// newEtcdJob makes 3 netns hosts and starts etcd on h2, listening on its
// address. Without namespaces or etcd the test skips, or fails where they
// are promised (GTRAIN_REQUIRE_NETNS, GTRAIN_REQUIRE_ETCD: make test sets
// both).
func newEtcdJob(t *testing.T) *etcdJob {
	t.Helper()
	c := netns.New(t, 3)
	srv := etcdtest.StartWith(t, etcdtest.Options{Addr: c.Hosts[etcdHost].IP,
		Command: func(name string, args ...string) *exec.Cmd { return c.Exec(t.Context(), etcdHost, name, args...) }})
	return &etcdJob{c: c, srv: srv}
}

// args are the flags of node i (0 or 1) of the job id, whose ranks run
// script with OUT=out.
func (j *etcdJob) args(id string, i int, out string, script string) []string {
	return []string{"run", "--nnodes", "2", "--node-rank", "auto", "--rdzv-backend", "etcd",
		"--rdzv-endpoint", j.srv.Endpoint, "--rdzv-id", id, "--local-addr", j.c.Hosts[i].IP,
		"--nproc-per-node", "2", "--table", "never", "--heartbeat", "1s", "--grace-period", "3s",
		"--join-timeout", "60s", "--env", "OUT=" + out, "--", "sh", "-c", script}
}

// start starts node i of the job id on its host.
func (j *etcdJob) start(t *testing.T, i int, secret, id, out, script string) *node {
	t.Helper()
	return startNode(t, j.c, i, secret, j.args(id, i, out, script)...)
}

// waitRankFiles waits until every file exists, or fails after within (a
// backstop: ranks write them when they run).
func waitRankFiles(t *testing.T, within time.Duration, files ...string) {
	t.Helper()
	if len(files) == 0 {
		t.Fatal("waitRankFiles: no files to wait for")
	}
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

// rankScript marks the rank up with its host's name, then waits for
// $OUT/go.
const rankScript = `hostname > "$OUT/up.$RANK.tmp" && mv "$OUT/up.$RANK.tmp" "$OUT/up.$RANK"; ` +
	`while [ ! -e "$OUT/go" ]; do sleep 0.1; done; echo "rank $RANK of $WORLD_SIZE done"`

// checkRanksOnHosts checks that ranks 0 and 1 ran on h0 and ranks 2 and 3
// on h1: node ranks follow the names (the addresses), and each node runs
// its own ranks.
func checkRanksOnHosts(t *testing.T, c *netns.Cluster, dir string) {
	t.Helper()
	for r, f := range upFiles(dir) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.TrimSpace(string(b)), c.Hosts[r/2].Name; got != want {
			t.Errorf("rank %d ran on host %q, want %s", r, got, want)
		}
	}
}

// goRanks lets the ranks of rankScript finish.
func goRanks(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPerNodeEtcdJob: 2 nodes on their own hosts meet in etcd on a third
// and run one job of 4 ranks, 2 on each host, that ends well on both; the
// ranks' store is that etcd.
func TestPerNodeEtcdJob(t *testing.T) {
	j := newEtcdJob(t)
	dir := t.TempDir()
	script := `env > "$OUT/env.$RANK.tmp" && mv "$OUT/env.$RANK.tmp" "$OUT/env.$RANK"; ` + rankScript
	nodes := []*node{j.start(t, 0, testSecret, "etcd-job", dir, script), j.start(t, 1, testSecret, "etcd-job", dir, script)}
	waitRankFiles(t, time.Minute, upFiles(dir)...)
	goRanks(t, dir)
	for i, n := range nodes {
		if code := n.wait(t, 2*time.Minute); code != 0 {
			t.Fatalf("node %d: exit %d\n%s\netcd:\n%s", i, code, n.err.String(), j.srv.Log())
		}
		if !strings.Contains(n.err.String(), "is node "+strconv.Itoa(i)+" of 2 (4 ranks in all") {
			t.Errorf("node %d's stderr does not say it is node %d of 2:\n%s", i, i, n.err.String())
		}
		if c := strings.Count(n.out.String(), " of 4 done"); c != 2 {
			t.Errorf("node %d: %d ranks finished, want 2:\n%s", i, c, n.out.String())
		}
	}
	checkRanksOnHosts(t, j.c, dir)
	for r := range 4 {
		env := readEnvFile(t, filepath.Join(dir, "env."+strconv.Itoa(r)))
		want := map[string]string{"RANK": strconv.Itoa(r), "GROUP_RANK": strconv.Itoa(r / 2), "WORLD_SIZE": "4",
			"MASTER_ADDR": j.c.Hosts[0].IP, "GTRAIN_STORE_ADDR": "etcd://" + j.srv.Endpoint + "/gtrain/etcd-job/0"}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", r, k, env[k], v)
			}
		}
	}
}

// TestPerNodeEtcdLauncherKilled: SIGKILL of one node's gtrain run tears
// down the other node within a bound, which exits 1 naming the node.
func TestPerNodeEtcdLauncherKilled(t *testing.T) {
	j := newEtcdJob(t)
	dir := t.TempDir()
	n0 := j.start(t, 0, testSecret, "etcd-kill", dir, rankScript)
	n1 := j.start(t, 1, testSecret, "etcd-kill", dir, rankScript)
	waitRankFiles(t, time.Minute, upFiles(dir)...)
	checkRanksOnHosts(t, j.c, dir)
	if err := n1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code := n0.wait(t, time.Minute)
	took := time.Since(start)
	n1.wait(t, time.Minute)
	if want := "node " + j.c.Hosts[1].IP + ": its gtrain run sent no heartbeat"; code != 1 || !strings.Contains(n0.err.String(), want) {
		t.Errorf("node 0: exit %d, want 1 and a message naming node %s (%q):\n%s", code, j.c.Hosts[1].IP, want, n0.err.String())
	}
	// 5 missed beats of 1 s, the 3 s grace period, and slack for a loaded machine.
	if took > 30*time.Second {
		t.Errorf("node 0 took %v to stop after node 1's launcher was killed: want under 30s", took)
	}
}

// TestPerNodeEtcdWrongSecret: a node whose secret is not the job's is
// refused by the values the job signed, saying so.
func TestPerNodeEtcdWrongSecret(t *testing.T) {
	j := newEtcdJob(t)
	dir := t.TempDir()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{j.srv.Endpoint}, DialTimeout: 10 * time.Second})
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
	n0 := j.start(t, 0, testSecret, "etcd-secret", dir, "true")
	if resp, err := cli.Get(ctx, key); err != nil || len(resp.Kvs) == 0 {
		<-w
	}
	wrong := j.start(t, 1, "another-secret-of-16+bytes", "etcd-secret", dir, "true")
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
	j := newEtcdJob(t)
	dir := t.TempDir()
	n0 := j.start(t, 0, testSecret, "etcd-restart", dir, rankScript)
	n1 := j.start(t, 1, testSecret, "etcd-restart", dir, rankScript)
	waitRankFiles(t, time.Minute, upFiles(dir)...)
	checkRanksOnHosts(t, j.c, dir)
	j.srv.Stop(t)
	time.Sleep(6 * time.Second) // the outage itself: longer than 5 missed beats
	j.srv.Restart(t)
	goRanks(t, dir)
	for i, n := range []*node{n0, n1} {
		if code := n.wait(t, 2*time.Minute); code != 0 {
			t.Errorf("node %d: exit %d after etcd restarted\n%s\netcd:\n%s", i, code, n.err.String(), j.srv.Log())
		}
	}
	for i, n := range []*node{n0, n1} {
		if c := strings.Count(n.out.String(), " of 4 done"); c != 2 {
			t.Errorf("node %d: %d ranks finished, want 2:\n%s", i, c, n.out.String())
		}
	}
}

// TestPerNodeEtcdGone: etcd stopped for good mid-job. Once the ranks have
// finished, each node would wait for the other's end, which only etcd can
// tell; instead both stop within a bound (the store's outage limit, 30 s
// at 1 s heartbeats, the 10 s bound on recording the end, and slack),
// exit 1 and say that etcd, by its endpoint, did not answer and what to
// do. They hung until killed before.
func TestPerNodeEtcdGone(t *testing.T) {
	j := newEtcdJob(t)
	dir := t.TempDir()
	n0 := j.start(t, 0, testSecret, "etcd-gone", dir, rankScript)
	n1 := j.start(t, 1, testSecret, "etcd-gone", dir, rankScript)
	waitRankFiles(t, time.Minute, upFiles(dir)...)
	j.srv.Stop(t)
	start := time.Now()
	goRanks(t, dir)
	want := "etcd at " + j.srv.Endpoint + " has not answered for "
	for i, n := range []*node{n0, n1} {
		code := n.wait(t, 2*time.Minute)
		if s := n.err.String(); code != 1 || !strings.Contains(s, want) || !strings.Contains(s, "check that etcd runs there") {
			t.Errorf("node %d: exit %d, want 1 and a message saying %q and what to check:\n%s", i, code, want, s)
		}
		if c := strings.Count(n.out.String(), " of 4 done"); c != 2 {
			t.Errorf("node %d: %d ranks finished, want 2 (they need no etcd):\n%s", i, c, n.out.String())
		}
	}
	if took := time.Since(start); took > 90*time.Second {
		t.Errorf("the nodes took %v to stop after etcd went away: want under 90s", took)
	}
}
