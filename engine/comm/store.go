package comm

import (
	"context"
	"slices"
	"sync"
)

// NewMemStore returns an in-process Store, for tests and single-process
// jobs. Values are copied in and out.
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
			return nil, ctx.Err()
		}
	}
}
