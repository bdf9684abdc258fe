//go:build linux

package comm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// shmFilePrefix starts the name of every segment file, so that a name read
// from the store cannot point anywhere else.
const shmFilePrefix = "gtrain-comm-"

var _ GroupTransport = (*shmTransport)(nil)

// shmTransport links ranks on one host through shared-memory segments, one
// per pair: the lower rank creates it (O_EXCL, random name published in the
// store), the higher maps it, and the file is unlinked once both have.
type shmTransport struct {
	cfg  SHMConfig
	done chan struct{} // closed by Close

	mu      sync.Mutex
	closed  bool
	connect map[linkID]*sync.Mutex // serialises Connect per link
	conns   map[linkID]*shmConn
}

// NewSHM returns a Transport whose links are shared-memory rings. Every
// peer must run on this host, in the same pid and mount namespace (see
// LocalHostID), with the same Dir.
func NewSHM(ctx context.Context, cfg SHMConfig) (Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("comm: shm: %w", err)
	}
	st, err := os.Stat(cfg.Dir)
	if err == nil && !st.IsDir() {
		err = errors.New("not a directory")
	}
	if err != nil {
		return nil, fmt.Errorf("comm: shm: segment directory %s: %w (set SHMConfig.Dir, or use TCP)", cfg.Dir, err)
	}
	return &shmTransport{cfg: cfg, done: make(chan struct{}), connect: map[linkID]*sync.Mutex{}, conns: map[linkID]*shmConn{}}, nil
}

// pairKey is the store key of the segment name of link id.
func (t *shmTransport) pairKey(id linkID) string {
	return fmt.Sprintf("%s/pair/%d-%d/%q", t.cfg.Prefix, min(t.cfg.Rank, id.peer), max(t.cfg.Rank, id.peer), id.group)
}

// Connect returns the link to peer, creating the pair's segment when this
// is the lower rank and mapping the peer's otherwise.
func (t *shmTransport) Connect(ctx context.Context, peer int) (Conn, error) {
	return t.ConnectGroup(ctx, peer, "")
}

// ConnectGroup is Connect for group's own link to peer (see
// GroupTransport): a segment of its own.
func (t *shmTransport) ConnectGroup(ctx context.Context, peer int, group string) (Conn, error) {
	if err := linkCheckPeer(peer, t.cfg.Rank, t.cfg.Size, group); err != nil {
		return nil, &LinkError{Transport: "shm", Op: "connect", Peer: peer, Err: err}
	}
	ctx, cancel := linkContext(ctx, t.done)
	defer cancel()
	id := linkID{peer, group}
	t.mu.Lock()
	mu := t.connect[id]
	if mu == nil {
		mu = new(sync.Mutex)
		t.connect[id] = mu
	}
	t.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	t.mu.Lock()
	c, closed := t.conns[id], t.closed
	t.mu.Unlock()
	switch {
	case closed:
		return nil, &LinkError{Transport: "shm", Op: "connect", Peer: peer, Err: ErrLinkClosed}
	case c != nil:
		return c, nil
	}
	var mem []byte
	var err error
	if t.cfg.Rank < peer {
		mem, err = t.create(ctx, id)
	} else {
		mem, err = t.open(ctx, id)
	}
	if err != nil {
		return nil, &LinkError{Transport: "shm", Op: "connect", Peer: peer, Err: err}
	}
	return t.adopt(id, newSHMConn(mem, peer, t.cfg.Rank > peer))
}

func (t *shmTransport) adopt(id linkID, c *shmConn) (Conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return nil, &LinkError{Transport: "shm", Op: "connect", Peer: id.peer, Err: ErrLinkClosed}
	}
	t.conns[id] = c
	return c, nil
}

// create makes, maps and publishes the segment, then waits until the peer
// has mapped it and unlinks it. On failure nothing is left behind.
func (t *shmTransport) create(ctx context.Context, id linkID) (mem []byte, err error) {
	name := shmFilePrefix + shmRandomHex()
	path := filepath.Join(t.cfg.Dir, name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create segment %s: %w", path, err)
	}
	defer os.Remove(path) // after the peer mapped it, or on failure
	defer unix.Close(fd)
	size := shmSegmentSize(t.cfg.RingBytes)
	// Reserve the pages now: on a full tmpfs this fails here with ENOSPC
	// instead of the first touch of a page raising SIGBUS.
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		return nil, fmt.Errorf("reserve %d bytes for segment %s (is %s full?): %w", size, path, t.cfg.Dir, err)
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map segment %s: %w", path, err)
	}
	shmInitHeader(mem, t.cfg.RingBytes, t.cfg.Rank, id.peer)
	if err := t.cfg.Store.Set(ctx, t.pairKey(id), []byte(name)); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("publish segment name: %w", err)
	}
	if err := shmWaitMapped(ctx, mem); err != nil {
		// Tell a peer that maps it in the meantime that we are gone.
		atomic.StoreUint64(shmWord(mem, shmOffClosed), 1)
		unix.Munmap(mem)
		return nil, fmt.Errorf("waiting for rank %d to map the segment: %w", id.peer, err)
	}
	return mem, nil
}

// open maps the segment the lower rank published, checks it, announces
// itself and unlinks the file.
func (t *shmTransport) open(ctx context.Context, id linkID) ([]byte, error) {
	v, err := t.cfg.Store.Get(ctx, t.pairKey(id))
	if err != nil {
		return nil, fmt.Errorf("look up segment name: %w", err)
	}
	name := string(v)
	if !strings.HasPrefix(name, shmFilePrefix) || strings.ContainsAny(name, `/\`) {
		return nil, fmt.Errorf("segment name %q from the store is not a gtrain segment", name)
	}
	path := filepath.Join(t.cfg.Dir, name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open segment %s (is Dir the same on both ranks?): %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat segment %s: %w", path, err)
	}
	if st.Size < shmHeaderBytes || st.Size > 1<<40 {
		return nil, fmt.Errorf("segment %s has %d bytes: not a gtrain segment", path, st.Size)
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map segment %s: %w", path, err)
	}
	if err := shmCheckHeader(mem, id.peer, t.cfg.Rank); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("segment %s: %w", path, err)
	}
	atomic.StoreUint64(shmWord(mem, shmOffPID+shmSideStride), uint64(os.Getpid()))
	mapped := shmWord(mem, shmOffMapped)
	atomic.StoreUint64(mapped, 1)
	shmFutexWake(mapped, 1)
	os.Remove(path) // the creator removes it too; whoever is first wins
	return mem, nil
}

func shmRandomHex() string {
	b := make([]byte, 12)
	rand.Read(b) // never fails (crypto/rand since Go 1.24)
	return hex.EncodeToString(b)
}

// Close closes every link.
func (t *shmTransport) Close() error {
	t.mu.Lock()
	if !t.closed {
		close(t.done)
	}
	t.closed = true
	conns := t.conns
	t.conns = map[linkID]*shmConn{}
	t.mu.Unlock()
	var errs []error
	for _, c := range conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
