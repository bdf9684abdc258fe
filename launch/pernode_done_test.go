package launch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/rendezvous"
)

// memStore is a job store in memory whose first write to each key in
// lose is applied but answered with an error, as when etcd's reply is
// lost (a restart, a timeout) after it took the write.
type memStore struct {
	mu   sync.Mutex
	data map[string][]byte
	lose map[string]bool
}

// lost says whether the reply of this write to key is lost, once a key.
func (s *memStore) lost(key string) error {
	if s.lose[key] {
		delete(s.lose, key)
		return errors.New("reply lost")
	}
	return nil
}

func (s *memStore) Add(_ context.Context, key string, delta int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, _ := strconv.ParseInt(string(s.data[key]), 10, 64)
	n += delta
	s.data[key] = strconv.AppendInt(nil, n, 10)
	return n, s.lost(key)
}

func (s *memStore) CompareAndSet(_ context.Context, key string, old, value []byte) (bool, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.data[key]
	if !bytes.Equal(cur, old) {
		return false, cur, nil
	}
	s.data[key] = value
	return true, value, s.lost(key)
}

// Get returns a key's value; it waits for a missing key until ctx ends
// (no test here writes one a waiter needs).
func (s *memStore) Get(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	v, ok := s.data[key]
	s.mu.Unlock()
	if ok {
		return v, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *memStore) Set(_ context.Context, key string, v []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data[key] = v
	return nil
}

func (s *memStore) Barrier(context.Context, string, int) error { return nil }
func (s *memStore) Join(context.Context, string, any) (*rendezvous.Round, error) {
	return nil, nil
}
func (s *memStore) Watch(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
func (s *memStore) LocalAddr() net.Addr             { return &net.TCPAddr{} }
func (s *memStore) Close() error                    { return nil }

// TestPerNodeDoneCountsOnce: node a of three says done, and the store
// takes it but the reply is lost, so a tries again; then b says done. The
// job is not done (c still runs), a and b are, c is not. With a done
// counter a counted twice and the others saw every node done while c ran.
func TestPerNodeDoneCountsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &memStore{data: map[string][]byte{}, lose: map[string]bool{}}
		pn := &perNode{store: st, endpoint: "etcd-0:2379", etcd: &rendezvous.EtcdConfig{}}
		members := []nodeInfo{{Name: "a"}, {Name: "b"}, {Name: "c"}}
		attempt := func(me int) *nodeAttempt {
			na := newNodeAttempt(t.Context(), pn, 0, me, members, time.Second)
			t.Cleanup(na.cancel)
			return na
		}
		a, b, c := attempt(0), attempt(1), attempt(2)
		for _, k := range []string{"done", "done/a"} { // every key a node writes when done
			st.lose[a.key(k)] = true
		}
		a.publishDone()
		b.publishDone()
		if c.allDone() {
			t.Error("after a (its reply lost) and b said done, the job is done for c, which still runs")
		}
		for i, want := range []bool{true, true, false} {
			if got := c.isDone(i); got != want {
				t.Errorf("node %s done = %v, want %v", members[i].Name, got, want)
			}
		}
		c.publishDone()
		if !a.allDone() {
			t.Error("after every node said done, the job is not done")
		}
	})
}

// nodeLink is one node's client of a memStore: while away (its gRPC
// connection still in reconnect backoff after the store came back) every
// request fails at once.
type nodeLink struct {
	*memStore
	away atomic.Bool
}

func (l *nodeLink) down() error {
	if l.away.Load() {
		return errors.New("connection away")
	}
	return nil
}

func (l *nodeLink) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := l.down(); err != nil {
		return 0, err
	}
	return l.memStore.Add(ctx, key, delta)
}

func (l *nodeLink) CompareAndSet(ctx context.Context, key string, old, value []byte) (bool, []byte, error) {
	if err := l.down(); err != nil {
		return false, nil, err
	}
	return l.memStore.CompareAndSet(ctx, key, old, value)
}

// doneAgent is a node's own agent whose ranks are all done.
type doneAgent struct{ sent bool }

func (a *doneAgent) Recv() (proto.Event, error) {
	if a.sent {
		return proto.Event{}, io.EOF
	}
	a.sent = true
	return proto.Event{V: proto.Version, Type: proto.EventDone, Rank: -1}, nil
}
func (a *doneAgent) Send(proto.Command) error { return nil }
func (a *doneAgent) Kill() error              { return nil }
func (a *doneAgent) Close() error             { return nil }
func (a *doneAgent) Stderr() string           { return "" }

type doneTransport struct{}

func (doneTransport) Start(context.Context, Host, *proto.Assignment) (AgentConn, error) {
	return &doneAgent{}, nil
}

// TestPerNodeDoneBeforeEnd: after an etcd outage, b's client is back
// first, and b finishes and says so; a's ranks are done too, but its first
// try to say so fails (its client is still away). Once a's client is back,
// a sees b done, and its attempt ends as runAttempt ends it: the peers
// ended, every agent closed, the attempt cancelled. b, still watching a,
// must see a done, not lose it: an attempt that ended before its done was
// in the store stopped beating without it, and b judged a silent.
func TestPerNodeDoneBeforeEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &memStore{data: map[string][]byte{}}
		members := []nodeInfo{{Name: "a"}, {Name: "b"}}
		attempt := func(me int, link *nodeLink) (*nodeAttempt, AgentConn, AgentConn) {
			pn := &perNode{store: link, endpoint: "etcd-0:2379", etcd: &rendezvous.EtcdConfig{}}
			na := newNodeAttempt(t.Context(), pn, 0, me, members, time.Second)
			t.Cleanup(na.cancel)
			tr := &nodeTransport{local: doneTransport{}, na: na}
			local, err := tr.Start(t.Context(), Host{Name: members[me].Name, Node: me}, nil)
			if err != nil {
				t.Fatal(err)
			}
			peer, err := tr.Start(t.Context(), Host{Name: members[1-me].Name, Node: 1 - me}, nil)
			if err != nil {
				t.Fatal(err)
			}
			na.run()
			return na, local, peer
		}
		aLink := &nodeLink{memStore: st}
		aLink.away.Store(true)
		a, aLocal, aPeer := attempt(0, aLink)
		b, _, bPeer := attempt(1, &nodeLink{memStore: st})
		b.publishDone()
		bEnded := make(chan error, 1)
		go func() {
			err, _ := peerEnd(bPeer)
			bEnded <- err
		}()

		time.Sleep(500 * time.Millisecond) // between a's checks of its ring
		if ev, err := aLocal.Recv(); err != nil || ev.Type != proto.EventDone {
			t.Fatalf("a's agent: %v %v, want done", ev.Type, err)
		}
		time.Sleep(1200 * time.Millisecond) // a's first try failed; it waits a beat
		aLink.away.Store(false)
		if err, _ := peerEnd(aPeer); err != nil {
			t.Fatalf("a's peer b ended with %v, want done", err)
		}
		aPeer.Close()
		aLocal.Close()
		a.cancel()

		select {
		case err := <-bEnded:
			if err != nil {
				t.Errorf("b's peer a ended with %v, want done", err)
			}
		case <-time.After(time.Minute): // fake time: the bubble's clock
			t.Error("b's peer a did not end in a minute after a was done")
		}
		if set, err := b.doneSet(); err != nil || !isSet(set, 0) {
			t.Errorf("a's done bit is not in the store (%v): a's attempt ended before it was", err)
		}
	})
}

// TestPerNodeDoneGivesUp: a node whose store is gone for good when its
// agent says done closes that agent after storeOutage of tries, not never
// (the attempt's end waits for the close).
func TestPerNodeDoneGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		link := &nodeLink{memStore: &memStore{data: map[string][]byte{}}}
		link.away.Store(true)
		pn := &perNode{store: link, endpoint: "etcd-0:2379", etcd: &rendezvous.EtcdConfig{}}
		na := newNodeAttempt(t.Context(), pn, 0, 0, []nodeInfo{{Name: "a"}, {Name: "b"}}, time.Second)
		defer na.cancel()
		local, err := (&nodeTransport{local: doneTransport{}, na: na}).Start(t.Context(), Host{Name: "a"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if ev, err := local.Recv(); err != nil || ev.Type != proto.EventDone {
			t.Fatalf("a's agent: %v %v, want done", ev.Type, err)
		}
		local.Close()
		if took := time.Since(start); took < storeOutage(time.Second) || took > storeOutage(time.Second)+2*time.Second {
			t.Errorf("closing a's agent took %v, want %v to %v", took, storeOutage(time.Second), storeOutage(time.Second)+2*time.Second)
		}
	})
}
