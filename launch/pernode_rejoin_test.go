package launch

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/rendezvous"
)

// A node started again under its name in the round it was killed in
// takes its old entry's place (pernode_meet.go), over the c10d store of
// a real rendezvous server on loopback.

// meetSecret is the job secret of these tests.
var meetSecret = []byte("rejoin-test-secret-0123456789")

// meetStore serves a job's store on loopback until the test ends.
func meetStore(t *testing.T) string {
	t.Helper()
	srv, err := rendezvous.Listen(rendezvous.Config{Addr: "127.0.0.1:0", Secret: meetSecret})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(t.Context()) }()
	t.Cleanup(func() { srv.Close() })
	return srv.Addr().String()
}

// meeting is one node's meetRound in progress.
type meeting struct {
	cancel context.CancelFunc
	done   chan struct{}
	ms     []nodeInfo
	rank   int
	err    error
}

// meet starts node name (at address addr) joining round 0 of a job of
// nodes nodes in the store at endpoint, with its own connection.
func meet(t *testing.T, endpoint, name, addr string, nodes int) *meeting {
	t.Helper()
	return meetElastic(t, endpoint, name, addr, nodes, nodes)
}

// meetElastic is meet for a job of lo to hi nodes (--nnodes lo:hi).
func meetElastic(t *testing.T, endpoint, name, addr string, lo, hi int) *meeting {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	c, err := rendezvous.Dial(ctx, endpoint, meetSecret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	pn := &perNode{store: c, endpoint: endpoint, min: lo, max: hi}
	m := &meeting{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		m.ms, m.rank, m.err = pn.meetRound(ctx, 0, nodeInfo{Name: name, Addr: addr, Rank: -1}, 2*time.Minute)
	}()
	return m
}

// joined waits until round 0 has its k-th entry, as a store's client.
func joined(t *testing.T, endpoint string, k int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a backstop
	defer cancel()
	c, err := rendezvous.Dial(ctx, endpoint, meetSecret)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Get(ctx, roundKey(0, "member/"+strconv.Itoa(k))); err != nil {
		t.Fatalf("round 0's entry %d: %v", k, err)
	}
}

// wait waits for m's meetRound to return (a backstop of a minute).
func (m *meeting) wait(t *testing.T) {
	t.Helper()
	select {
	case <-m.done:
	case <-time.After(time.Minute):
		t.Fatal("meetRound did not return within a minute")
	}
}

// checkMet fails t unless m met the round of nodes a (the entry at
// address want) and b, in that order.
func checkMet(t *testing.T, who string, m *meeting, wantA string) {
	t.Helper()
	if m.err != nil {
		t.Fatalf("%s: %v", who, m.err)
	}
	if len(m.ms) != 2 || m.ms[0].Name != "a" || m.ms[1].Name != "b" || m.ms[0].Addr != wantA {
		t.Errorf("%s met %+v, want node a (address %s) and node b", who, m.ms, wantA)
	}
}

// TestPerNodeRejoinRound: node a joins a round of 2 and is gone (its
// meetRound stopped, as a SIGKILL stops it: its entry stays); started
// again, it joins the same round, then node b: the round closes with a
// (its new entry) and b, and both meet it. It closed at once with a's two
// entries, failing "two nodes named a joined the job".
func TestPerNodeRejoinRound(t *testing.T) {
	endpoint := meetStore(t)
	old := meet(t, endpoint, "a", "old", 2)
	joined(t, endpoint, 1)
	old.cancel()
	old.wait(t)
	again := meet(t, endpoint, "a", "new", 2)
	joined(t, endpoint, 2)
	b := meet(t, endpoint, "b", "b", 2)
	again.wait(t)
	b.wait(t)
	checkMet(t, "node a started again", again, "new")
	checkMet(t, "node b", b, "new")
	if again.rank != 0 || b.rank != 1 {
		t.Errorf("ranks %d and %d, want 0 for a and 1 for b", again.rank, b.rank)
	}
}

// TestPerNodeRejoinRoundLive: two live nodes named a: the later takes the
// earlier's place, and the earlier, still running, stops saying so (an
// errReplaced, naming --local-addr) instead of meeting the round: the
// round runs one node a, never two.
func TestPerNodeRejoinRoundLive(t *testing.T) {
	endpoint := meetStore(t)
	first := meet(t, endpoint, "a", "first", 2)
	joined(t, endpoint, 1)
	second := meet(t, endpoint, "a", "second", 2)
	joined(t, endpoint, 2)
	b := meet(t, endpoint, "b", "b", 2)
	for _, m := range []*meeting{first, second, b} {
		m.wait(t)
	}
	checkMet(t, "the second node a", second, "second")
	checkMet(t, "node b", b, "second")
	if !errors.Is(first.err, errReplaced) || !strings.Contains(first.err.Error(), "give each node its own --local-addr") || first.ms != nil {
		t.Errorf("the first node a: members %+v, %v; want it replaced, saying so", first.ms, first.err)
	}
}

// TestPerNodeRejoinRoundElastic: --nnodes 2:3, node a gone and started
// again, then node b: the round counts 2 nodes (not 3 entries), so it
// neither closes as full nor starts its last call before b joined, and
// closes at the last call with a's new entry and b. It closed with a's
// two entries, or a's two and b's, both "two nodes named a".
func TestPerNodeRejoinRoundElastic(t *testing.T) {
	defer func(d time.Duration) { lastCall = d }(lastCall)
	lastCall = 300 * time.Millisecond // only ever starts once b has joined
	endpoint := meetStore(t)
	old := meetElastic(t, endpoint, "a", "old", 2, 3)
	joined(t, endpoint, 1)
	old.cancel()
	old.wait(t)
	again := meetElastic(t, endpoint, "a", "new", 2, 3)
	joined(t, endpoint, 2)
	b := meetElastic(t, endpoint, "b", "b", 2, 3)
	again.wait(t)
	b.wait(t)
	checkMet(t, "node a started again", again, "new")
	checkMet(t, "node b", b, "new")
}
