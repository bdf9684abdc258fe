package launch

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

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
