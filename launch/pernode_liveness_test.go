package launch

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/rendezvous"
)

// flakyStore is a job store in memory that can be taken away: while down,
// every request waits until its context ends, as etcd's client does while
// etcd is away. Get never finds a key (no node writes a stop here).
type flakyStore struct {
	mu       sync.Mutex
	down     bool
	late     bool // node b's connection is still away after the store is back
	counters map[string]int64
}

func (s *flakyStore) setDown(down, late bool) {
	s.mu.Lock()
	s.down, s.late = down, late
	s.mu.Unlock()
}

func (s *flakyStore) bLate() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.late
}

// away waits for ctx when the store is down, and says whether it was.
func (s *flakyStore) away(ctx context.Context) error {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if !down {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *flakyStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := s.away(ctx); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counters[key] += delta
	return s.counters[key], nil
}

func (s *flakyStore) Get(ctx context.Context, _ string) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *flakyStore) CompareAndSet(ctx context.Context, _ string, _, _ []byte) (bool, []byte, error) {
	return false, nil, s.away(ctx)
}

func (s *flakyStore) Set(ctx context.Context, _ string, _ []byte) error { return s.away(ctx) }
func (s *flakyStore) Barrier(ctx context.Context, _ string, _ int) error {
	return s.away(ctx)
}
func (s *flakyStore) Join(context.Context, string, any) (*rendezvous.Round, error) {
	return nil, nil
}
func (s *flakyStore) Watch(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
func (s *flakyStore) LocalAddr() net.Addr             { return &net.TCPAddr{} }
func (s *flakyStore) Close() error                    { return nil }

// watchedPeer runs node a's side of an attempt of nodes a and b over st,
// node b beating in st every second while st is up (and b not late), and
// returns a's peer for b and a function that ends the attempt.
func watchedPeer(t *testing.T, st *flakyStore) (AgentConn, func()) {
	t.Helper()
	pn := &perNode{store: st, endpoint: "etcd-0:2379", etcd: &rendezvous.EtcdConfig{}}
	na := newNodeAttempt(t.Context(), pn, 0, 0, []nodeInfo{{Name: "a"}, {Name: "b"}}, time.Second)
	peer, err := (&nodeTransport{na: na}).Start(t.Context(), Host{Name: "b", Node: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	na.run()
	go func() { // node b's launcher
		for {
			if !st.bLate() {
				ctx, cancel := context.WithTimeout(na.ctx, time.Second)
				_, _ = st.Add(ctx, na.key("beat/b"), 1)
				cancel()
			}
			select {
			case <-na.ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return peer, func() { na.cancel(); peer.Close() }
}

// peerEnd reads the peer until its stream ends and returns the error it
// ended with (nil: done) and when.
func peerEnd(p AgentConn) (error, time.Time) {
	for {
		ev, err := p.Recv()
		if err != nil || ev.Type == proto.EventDone {
			return err, time.Now()
		}
	}
}

// TestPerNodeStoreOutage: a store that answers nothing judges nobody for
// storeOutage (an etcd restart is waited for), not even a node whose own
// connection comes back 10 s after the store (gRPC's backoff); then it
// ends the attempt: the peer ends with an error naming the store's
// endpoint and what to check, rather than the node waiting for it for
// ever.
func TestPerNodeStoreOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &flakyStore{counters: map[string]int64{}}
		peer, end := watchedPeer(t, st)
		defer end()
		ended := make(chan error, 1)
		var at time.Time
		go func() {
			var err error
			err, at = peerEnd(peer)
			ended <- err
		}()

		time.Sleep(5 * time.Second)
		st.setDown(true, true) // a restart: shorter than the outage limit
		time.Sleep(storeOutage(time.Second) - 5*time.Second)
		st.setDown(false, true)
		time.Sleep(10 * time.Second)
		st.setDown(false, false)
		time.Sleep(time.Minute)
		select {
		case err := <-ended:
			t.Fatalf("the peer ended (%v) over a store outage shorter than %v", err, storeOutage(time.Second))
		default:
		}

		st.setDown(true, true) // for good
		gone := time.Now()
		var err error
		select {
		case err = <-ended:
		case <-time.After(10 * time.Minute): // fake time: the bubble's clock
			t.Fatal("the peer did not end in 10 minutes after the store went for good")
		}
		want := "etcd at etcd-0:2379 has not answered for "
		if err == nil || err == io.EOF || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "check that etcd runs there") {
			t.Fatalf("the peer ended with %v, want an error saying %q and what to check", err, want)
		}
		// The outage counts from the first failed request, which takes up
		// to a beat to fail, and is checked every beat or so.
		if took := at.Sub(gone); took < storeOutage(time.Second) || took > storeOutage(time.Second)+5*time.Second {
			t.Errorf("the peer ended %v after the store went, want %v to %v", took, storeOutage(time.Second), storeOutage(time.Second)+5*time.Second)
		}
	})
}
