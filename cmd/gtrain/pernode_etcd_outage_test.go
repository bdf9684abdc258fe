package main

import (
	"strings"
	"testing"
	"time"
)

// TestPerNodeEtcdLongOutage: etcd away for 25 s mid-job, under the 30 s
// outage limit of --heartbeat 1s: the job goes on and ends well on both
// nodes. Before etcd's client capped its reconnect backoff, a node could
// see etcd back 10 s late, and 2 of 4 such runs stopped at the limit.
// (TestEtcdReconnectBackoffCapped checks the backoff itself.)
func TestPerNodeEtcdLongOutage(t *testing.T) {
	j := newEtcdJob(t)
	dir := t.TempDir()
	nodes := j.startBoth(t, "etcd-long-outage", dir, rankScript)
	waitRankFiles(t, time.Minute, upFiles(dir)...)
	j.srv.Stop(t)
	time.Sleep(25 * time.Second) // the outage itself
	j.srv.Restart(t)
	goRanks(t, dir)
	for i, n := range nodes {
		if code := n.wait(t, 2*time.Minute); code != 0 {
			t.Errorf("node %d: exit %d after a 25 s etcd outage\n%s\netcd:\n%s", i, code, n.err.String(), j.srv.Log())
		}
		if c := strings.Count(n.out.String(), " of 4 done"); c != 2 {
			t.Errorf("node %d: %d ranks finished, want 2:\n%s", i, c, n.out.String())
		}
	}
}
