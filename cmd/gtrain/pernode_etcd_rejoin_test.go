package main

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitEtcdKey waits until etcd at endpoint has key, polling (a backstop
// of a minute).
func waitEtcdKey(t *testing.T, endpoint, key string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for {
		resp, err := cli.Get(ctx, key, clientv3.WithCountOnly())
		if err == nil && resp.Count > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("etcd at %s: no key %s within a minute (%v)", endpoint, key, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestPerNodeEtcdRejoin: node 0 of a 2-node job over etcd is killed
// (SIGKILL) while its round is forming (it joined; node 1 is not started
// yet), and started again at once with the same command, as Kubernetes
// starts a pod again under its name: it joins the same round, where its
// old entry still is, then node 1 joins, and the job runs its 4 ranks on
// both hosts and ends well. The restarted node failed with "two nodes
// named <h0> joined the job".
func TestPerNodeEtcdRejoin(t *testing.T) {
	j := newEtcdJob(t)
	dir := t.TempDir()
	const id = "etcd-rejoin"
	entry := func(k int) string { return "/gtrain/" + id + "/nodes/kv/pernode/0/member/" + strconv.Itoa(k) }
	old := j.start(t, 0, testSecret, id, dir, rankScript)
	waitEtcdKey(t, j.srv.Endpoint, entry(1))
	if err := old.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	old.wait(t, time.Minute)
	again := j.start(t, 0, testSecret, id, dir, rankScript)
	waitEtcdKey(t, j.srv.Endpoint, entry(2))
	n1 := j.start(t, 1, testSecret, id, dir, rankScript)
	waitRankFiles(t, time.Minute, upFiles(dir)...)
	checkRanksOnHosts(t, j.c, dir)
	goRanks(t, dir)
	j.waitAll(t, []*node{again, n1}, 0, "after node 0 was killed mid-join and started again")
	for i, n := range []*node{again, n1} {
		if !strings.Contains(n.err.String(), "is node "+strconv.Itoa(i)+" of 2 (4 ranks in all, attempt 0)") {
			t.Errorf("node %d does not say it is node %d of 2 in the round it joined:\n%s", i, i, n.err.String())
		}
		if c := strings.Count(n.out.String(), " of 4 done"); c != 2 {
			t.Errorf("node %d: %d ranks finished, want 2:\n%s", i, c, n.out.String())
		}
	}
}

// TestPerNodeEtcdSameNameLive: a second node 0, started while the first
// still runs (same host, same --local-addr), takes the first's place in
// the forming round; the first stops (exit 1), saying that a later node
// of its name took its place and what to do, and starts no rank, and it
// does not end the job: the second and node 1 run it to its end, which
// is theirs (a node started after it finds it finished). Two live nodes
// of one name never both run.
func TestPerNodeEtcdSameNameLive(t *testing.T) {
	j := newEtcdJob(t)
	dir := t.TempDir()
	const id = "etcd-same-name"
	entry := func(k int) string { return "/gtrain/" + id + "/nodes/kv/pernode/0/member/" + strconv.Itoa(k) }
	first := j.start(t, 0, testSecret, id, dir, rankScript)
	waitEtcdKey(t, j.srv.Endpoint, entry(1))
	second := j.start(t, 0, testSecret, id, dir, rankScript)
	waitEtcdKey(t, j.srv.Endpoint, entry(2))
	n1 := j.start(t, 1, testSecret, id, dir, rankScript)
	code := first.wait(t, 2*time.Minute)
	want := "a later node of the same name took this node's place (node " + j.c.Hosts[0].IP + " joined again): if that is another node, not this one started again, give each node its own --local-addr"
	if code != 1 || !strings.Contains(first.err.String(), want) {
		t.Errorf("the first node 0: exit %d, want 1 and %q:\n%s", code, want, first.err.String())
	}
	waitRankFiles(t, time.Minute, upFiles(dir)...)
	checkRanksOnHosts(t, j.c, dir)
	goRanks(t, dir)
	j.waitAll(t, []*node{second, n1}, 0, "with the first node 0 replaced")
	if c := strings.Count(first.out.String(), " of 4 done"); c != 0 {
		t.Errorf("the replaced node ran %d ranks:\n%s", c, first.out.String())
	}
	// The job's end is the others' (it finished), not the replaced node's
	// failure: node 0 started again finds the job done and runs nothing.
	again := j.start(t, 0, testSecret, id, t.TempDir(), rankScript)
	if code := again.wait(t, 2*time.Minute); code != 0 || !strings.Contains(again.err.String(), "ended already: it finished on the other nodes") {
		t.Errorf("node 0 started after the job: exit %d, want 0 and that the job finished:\n%s", code, again.err.String())
	}
}
