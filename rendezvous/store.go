package rendezvous

import (
	"bytes"
	"context"
	"strconv"
	"sync"
)

// store is the server's key-value store. Values are opaque bytes; counters
// (add) are kept as decimal text, so a get of a counter reads "42".
type store struct {
	mu       sync.Mutex
	data     map[string][]byte
	size     int                 // bytes of keys and values held
	limit    int                 // most bytes size may reach (MaxStore)
	waits    map[string]*waiter  // gets waiting for a key to exist
	barriers map[string]*barrier // barriers not yet reached by all
}

// waiter wakes every get waiting for one key.
type waiter struct {
	ch chan struct{} // closed when the key is written
	n  int           // gets waiting
}

// barrier counts the clients that reached it.
type barrier struct {
	n, count int
	done     chan struct{} // closed when count reaches n
}

func newStore() *store {
	return &store{
		data: map[string][]byte{}, limit: MaxStore,
		waits: map[string]*waiter{}, barriers: map[string]*barrier{},
	}
}

// put writes key under s.mu and wakes its waiters.
func (s *store) put(key string, value []byte) error {
	old, had := s.data[key]
	grow := len(value) - len(old)
	if !had {
		grow += len(key)
	}
	if s.size+grow > s.limit {
		return errorf(codeTooLarge, "store full: %d bytes of keys and values held, limit %d", s.size, s.limit)
	}
	s.size += grow
	s.data[key] = bytes.Clone(value)
	if w, ok := s.waits[key]; ok {
		close(w.ch)
		delete(s.waits, key)
	}
	return nil
}

func (s *store) set(key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.put(key, value)
}

// get returns key's value, waiting until it exists or ctx ends.
func (s *store) get(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	if v, ok := s.data[key]; ok {
		s.mu.Unlock()
		return v, nil
	}
	w := s.waits[key]
	if w == nil {
		w = &waiter{ch: make(chan struct{})}
		s.waits[key] = w
	}
	w.n++
	s.mu.Unlock()
	select {
	case <-w.ch:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.data[key], nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.n--; w.n == 0 && s.waits[key] == w {
			delete(s.waits, key)
		}
		return nil, context.Cause(ctx)
	}
}

// add adds delta to the counter at key (missing: 0) and returns the sum.
func (s *store) add(key string, delta int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, held := s.data[key]
	n, err := addCounter(key, v, held, delta)
	if err != nil {
		return 0, err
	}
	return n, s.put(key, strconv.AppendInt(nil, n, 10))
}

// cas sets key to value if its current value equals old; a missing key
// equals an empty old. It returns whether it swapped and the value now held
// (nil if the key is missing).
func (s *store) cas(key string, old, value []byte) (bool, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.data[key]
	if !bytes.Equal(cur, old) {
		return false, cur, nil
	}
	if err := s.put(key, value); err != nil {
		return false, cur, err
	}
	return true, s.data[key], nil
}

// barrier returns once n clients reached the barrier called name. A client
// whose ctx ends first leaves it again. Once it opens, the name starts over:
// the next n arrivals form a new barrier.
func (s *store) barrier(ctx context.Context, name string, n int) error {
	s.mu.Lock()
	b := s.barriers[name]
	if b == nil {
		b = &barrier{n: n, done: make(chan struct{})}
		s.barriers[name] = b
	}
	if b.n != n {
		s.mu.Unlock()
		return errorf(codeBadRequest, "barrier %q: waiting for %d clients, others wait for %d", clip(name), n, b.n)
	}
	if b.count++; b.count == n {
		close(b.done)
		delete(s.barriers, name)
	}
	s.mu.Unlock()
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-b.done:
		return nil // opened as we gave up: we were counted
	default:
	}
	if b.count--; b.count == 0 {
		delete(s.barriers, name)
	}
	return context.Cause(ctx)
}
