package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// NewMemStore returns an in-process Store for tests: values are copied in
// and out, and a Get waits until its key is set or ctx ends.
func NewMemStore() Store {
	return &memStore{vals: make(map[string][]byte), waits: make(map[string]chan struct{})}
}

type memStore struct {
	mu    sync.Mutex
	vals  map[string][]byte
	waits map[string]chan struct{} // closed when the key is set
}

// Set stores value under key, replacing any earlier value, and wakes the
// Gets waiting for it.
func (s *memStore) Set(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.vals[key] = slices.Clone(value)
	if ch, ok := s.waits[key]; ok {
		close(ch)
		delete(s.waits, key)
	}
	return nil
}

// Get returns the value of key, waiting until it is set or ctx ends.
func (s *memStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		s.mu.Lock()
		if v, ok := s.vals[key]; ok {
			s.mu.Unlock()
			return slices.Clone(v), nil
		}
		ch, ok := s.waits[key]
		if !ok {
			ch = make(chan struct{})
			s.waits[key] = ch
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("get %s: %w", key, ctx.Err())
		}
	}
}

// tpFileStore is a Store in a directory, shared with child processes.
type tpFileStore struct{ dir string }

func (s tpFileStore) path(key string) string { return filepath.Join(s.dir, url.PathEscape(key)) }

func (s tpFileStore) Set(ctx context.Context, key string, value []byte) error {
	tmp := s.path(key) + ".tmp"
	if err := os.WriteFile(tmp, value, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.path(key))
}

func (s tpFileStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		v, err := os.ReadFile(s.path(key))
		if !errors.Is(err, os.ErrNotExist) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("get %s: %w", key, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// tpCtx is a test context with a generous bound, so a bug fails rather
// than hangs.
func tpCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// tpMesh makes n transports with mk and connects every pair concurrently;
// conns[r][p] is rank r's link to p.
func tpMesh(t testing.TB, n int, mk func(rank int) (Transport, error)) (ts []Transport, conns [][]Conn) {
	t.Helper()
	ts = make([]Transport, n)
	var wg sync.WaitGroup
	errs := make(chan error, n*n)
	for r := range n { // concurrently: bootstrap's Connect waits for every rank
		wg.Go(func() {
			tr, err := mk(r)
			if err != nil {
				errs <- fmt.Errorf("rank %d: new transport: %w", r, err)
				return
			}
			ts[r] = tr
			t.Cleanup(func() { tr.Close() })
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	conns = make([][]Conn, n)
	ctx := tpCtx(t)
	for r := range n {
		conns[r] = make([]Conn, n)
		for p := range n {
			if p == r {
				continue
			}
			wg.Go(func() {
				c, err := ts[r].Connect(ctx, p)
				if err != nil {
					errs <- fmt.Errorf("rank %d connect %d: %w", r, p, err)
				}
				conns[r][p] = c
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return ts, conns
}

// tpPattern is a message whose bytes depend on sender, receiver and size.
func tpPattern(from, to, size int) []byte {
	b := make([]byte, size)
	var seed [32]byte
	copy(seed[:], fmt.Sprintf("%d>%d:%d", from, to, size))
	rand.NewChaCha8(seed).Read(b)
	return b
}

// tpExchange sends every size in both directions of every pair at once and
// checks every message.
func tpExchange(t *testing.T, conns [][]Conn, sizes []int) {
	t.Helper()
	ctx := tpCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(conns)*len(conns))
	for r := range conns {
		for p := range conns[r] {
			if p == r {
				continue
			}
			c := conns[r][p]
			wg.Go(func() { errs <- tpSendAll(ctx, c, r, p, sizes) })
			wg.Go(func() { errs <- tpRecvAll(ctx, c, p, r, sizes) })
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func tpSendAll(ctx context.Context, c Conn, from, to int, sizes []int) error {
	for _, n := range sizes {
		if err := c.Send(ctx, tpPattern(from, to, n)); err != nil {
			return fmt.Errorf("send %d bytes %d→%d: %w", n, from, to, err)
		}
	}
	return nil
}

func tpRecvAll(ctx context.Context, c Conn, from, to int, sizes []int) error {
	for _, n := range sizes {
		var b []byte // nil for an empty message
		if n > 0 {
			b = make([]byte, n)
		}
		if err := c.Recv(ctx, b); err != nil {
			return fmt.Errorf("recv %d bytes %d→%d: %w", n, from, to, err)
		}
		if !bytes.Equal(b, tpPattern(from, to, n)) {
			return fmt.Errorf("message of %d bytes %d→%d corrupted", n, from, to)
		}
	}
	return nil
}

// tpPair returns both ends of the link between ranks 0 and 1 of a mesh.
func tpPair(t testing.TB, mk func(rank int) (Transport, error)) (a, b Conn) {
	_, conns := tpMesh(t, 2, mk)
	return conns[0][1], conns[1][0]
}

// tpWithin fails the test unless f returns within d; it returns f's error.
// It may be called from any goroutine.
func tpWithin(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- f() }()
	select {
	case err := <-done:
		t.Logf("%s: returned after %v: %v", what, time.Since(start).Round(time.Millisecond), err)
		return err
	case <-time.After(d):
		t.Errorf("%s: still blocked after %v", what, d)
		return fmt.Errorf("%s: still blocked after %v", what, d)
	}
}

// tpCheckGroups connects every pair in groups "" (Connect), "a" and "b"
// at once and runs traffic on all of them concurrently: each group's link
// must be its own.
func tpCheckGroups(t *testing.T, ts []Transport) {
	t.Helper()
	groups := []string{"", "a", "b/0/1"}
	n := len(ts)
	links := make(map[string][][]Conn)
	var wg sync.WaitGroup
	for _, g := range groups {
		links[g] = make([][]Conn, n)
		for r := range n {
			links[g][r] = make([]Conn, n)
		}
	}
	for _, g := range groups {
		for r := range n {
			for p := range n {
				if p == r {
					continue
				}
				wg.Go(func() {
					var c Conn
					var err error
					if g == "" {
						c, err = ts[r].Connect(tpCtx(t), p)
					} else {
						c, err = ts[r].(GroupTransport).ConnectGroup(tpCtx(t), p, g)
					}
					if err != nil {
						t.Errorf("rank %d connect %d in group %q: %v", r, p, g, err)
					}
					links[g][r][p] = c
				})
			}
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i, g := range groups {
		wg.Go(func() { tpExchange(t, links[g], []int{i, 1000 + i, 300<<10 + i}) })
	}
	wg.Wait()
}
