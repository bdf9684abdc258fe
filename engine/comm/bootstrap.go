package comm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
)

// Errors the transports report, wrapped in a *LinkError. Match them with
// errors.Is.
var (
	// ErrAuth means a peer connection failed the job-secret handshake.
	ErrAuth = errors.New("authentication failed")
	// ErrMessageLength means a received message was not the expected
	// length: the two ranks disagree about the call.
	ErrMessageLength = errors.New("message length mismatch")
	// ErrPeerClosed means the peer closed its end of the link.
	ErrPeerClosed = errors.New("peer closed the link")
	// ErrPeerGone means the peer process died (shared memory links).
	ErrPeerGone = errors.New("peer process is gone")
	// ErrLinkClosed means this end of the link or transport was closed.
	ErrLinkClosed = errors.New("link closed")
	// ErrLinkBroken means an earlier call failed in the middle of a
	// message, so the byte stream is out of step and the link unusable.
	ErrLinkBroken = errors.New("link broken by an earlier failed call")
)

// LinkError is the error of a transport operation on the link to one peer:
// it names the transport, the operation, the peer rank and, where known,
// its address (host:port for TCP, pid for shared memory).
type LinkError struct {
	Transport string // "tcp" or "shm"
	Op        string // "connect", "send", "recv"
	Peer      int    // peer rank
	Addr      string // peer address, may be empty
	Err       error
}

// Error reads like "comm: tcp recv from rank 3 (10.0.0.2:4711): peer
// closed the link".
func (e *LinkError) Error() string {
	dir := "with"
	switch e.Op {
	case "send":
		dir = "to"
	case "recv":
		dir = "from"
	}
	addr := ""
	if e.Addr != "" {
		addr = " (" + e.Addr + ")"
	}
	return fmt.Sprintf("comm: %s %s %s rank %d%s: %v", e.Transport, e.Op, dir, e.Peer, addr, e.Err)
}

// Unwrap returns the cause.
func (e *LinkError) Unwrap() error { return e.Err }

// BootstrapConfig configures Connect.
type BootstrapConfig struct {
	Rank, Size int
	Store      Store
	Secret     []byte // the job's secret; authenticates TCP links
	Prefix     string // store key namespace for this job and attempt
	// HostID identifies this rank's host; ranks with equal ids talk over
	// shared memory. Empty means LocalHostID().
	HostID string
	// NoSHM forces TCP between all ranks, even on one host.
	NoSHM bool
	// TCP and SHM carry the tuning of each transport; their Rank, Size,
	// Store, Secret and Prefix fields are ignored (Connect fills them).
	TCP TCPConfig
	SHM SHMConfig
}

// Connect bootstraps this rank's links: it publishes the rank's host id
// under "<prefix>/host/<rank>", learns every other rank's, and returns a
// Transport that reaches peers on the same host over shared memory and the
// others over TCP. It waits until every rank has published its host id.
func Connect(ctx context.Context, cfg BootstrapConfig) (Transport, error) {
	if err := linkCheckRank(cfg.Rank, cfg.Size, cfg.Store); err != nil {
		return nil, fmt.Errorf("comm: bootstrap: %w", err)
	}
	hosts, err := exchangeHostIDs(ctx, cfg)
	if err != nil {
		return nil, err
	}
	r := &routedTransport{rank: cfg.Rank, route: make([]Transport, cfg.Size), hosts: hosts}
	sameHost := func(p int) bool { return !cfg.NoSHM && hosts[p] == hosts[cfg.Rank] }
	local, remote := 0, 0
	for p := range cfg.Size {
		switch {
		case p == cfg.Rank:
		case sameHost(p):
			local++
		default:
			remote++
		}
	}
	if local > 0 {
		if r.shm, err = NewSHM(ctx, shmFromBootstrap(cfg)); err != nil {
			return nil, err
		}
	}
	if remote > 0 {
		if r.tcp, err = NewTCP(ctx, tcpFromBootstrap(cfg, hostsAllSame(hosts))); err != nil {
			r.Close()
			return nil, err
		}
	}
	for p := range cfg.Size {
		switch {
		case p == cfg.Rank:
		case sameHost(p):
			r.route[p] = r.shm
		default:
			r.route[p] = r.tcp
		}
	}
	return r, nil
}

// linkCheckPeer checks the arguments of ConnectGroup.
func linkCheckPeer(peer, rank, size int, group string) error {
	if peer < 0 || peer >= size || peer == rank {
		return fmt.Errorf("peer out of range or self (rank %d of %d)", rank, size)
	}
	if len(group) > MaxGroupName {
		return fmt.Errorf("group name of %d bytes is over the limit of %d", len(group), MaxGroupName)
	}
	return nil
}

func linkCheckRank(rank, size int, store Store) error {
	if size < 1 || rank < 0 || rank >= size {
		return fmt.Errorf("rank %d of %d is out of range", rank, size)
	}
	if store == nil {
		return errors.New("no store")
	}
	return nil
}

func exchangeHostIDs(ctx context.Context, cfg BootstrapConfig) ([]string, error) {
	id := cfg.HostID
	if id == "" {
		var err error
		if id, err = LocalHostID(); err != nil {
			return nil, fmt.Errorf("comm: bootstrap: %w", err)
		}
	}
	key := func(r int) string { return fmt.Sprintf("%s/host/%d", cfg.Prefix, r) }
	if err := cfg.Store.Set(ctx, key(cfg.Rank), []byte(id)); err != nil {
		return nil, fmt.Errorf("comm: bootstrap: publish host id: %w", err)
	}
	hosts := make([]string, cfg.Size)
	for r := range cfg.Size {
		if r == cfg.Rank {
			hosts[r] = id
			continue
		}
		v, err := cfg.Store.Get(ctx, key(r))
		if err != nil {
			return nil, fmt.Errorf("comm: bootstrap: host id of rank %d: %w", r, err)
		}
		hosts[r] = string(v)
	}
	return hosts, nil
}

func hostsAllSame(hosts []string) bool {
	for _, h := range hosts {
		if h != hosts[0] {
			return false
		}
	}
	return true
}

func shmFromBootstrap(cfg BootstrapConfig) SHMConfig {
	c := cfg.SHM
	c.Rank, c.Size, c.Store, c.Prefix = cfg.Rank, cfg.Size, cfg.Store, cfg.Prefix+"/shm"
	return c
}

// tcpFromBootstrap fills the identity fields; when every rank is on this
// host (TCP forced by NoSHM) it advertises loopback.
func tcpFromBootstrap(cfg BootstrapConfig, allLocal bool) TCPConfig {
	c := cfg.TCP
	c.Rank, c.Size, c.Store, c.Secret, c.Prefix = cfg.Rank, cfg.Size, cfg.Store, cfg.Secret, cfg.Prefix+"/tcp"
	if allLocal && c.Advertise == "" {
		c.Advertise = "127.0.0.1"
	}
	return c
}

// LocalHostID identifies the host and namespace this process runs in: two
// processes with the same id can share memory through a file in /dev/shm
// and see each other's pids. It is the hostname and a digest of the boot id
// and the pid and mount namespaces, so containers on one machine that do
// not share /dev/shm or pids count as different hosts.
func LocalHostID() (string, error) {
	name, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("host id: %w", err)
	}
	h := sha256.New()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("host id: %w", err)
	}
	h.Write(boot)
	for _, ns := range []string{"pid", "mnt"} {
		l, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("host id: %w", err)
		}
		h.Write([]byte("\x00" + l))
	}
	return name + "#" + hex.EncodeToString(h.Sum(nil)[:8]), nil
}

var _ GroupTransport = (*routedTransport)(nil)

// routedTransport sends each peer to the transport that reaches it.
type routedTransport struct {
	rank     int
	route    []Transport // per peer; nil for this rank
	hosts    []string    // host id of every rank
	tcp, shm Transport
	once     sync.Once
	err      error
}

// Connect returns the link to peer over shared memory or TCP.
func (r *routedTransport) Connect(ctx context.Context, peer int) (Conn, error) {
	return r.ConnectGroup(ctx, peer, "")
}

// ConnectGroup returns group's own link to peer (see GroupTransport).
func (r *routedTransport) ConnectGroup(ctx context.Context, peer int, group string) (Conn, error) {
	if peer < 0 || peer >= len(r.route) || peer == r.rank {
		return nil, fmt.Errorf("comm: connect to rank %d: out of range or self (rank %d of %d)", peer, r.rank, len(r.route))
	}
	return r.route[peer].(GroupTransport).ConnectGroup(ctx, peer, group)
}

// Close closes both transports.
func (r *routedTransport) Close() error {
	r.once.Do(func() {
		var errs []error
		for _, t := range []Transport{r.shm, r.tcp} {
			if t != nil {
				errs = append(errs, t.Close())
			}
		}
		r.err = errors.Join(errs...)
	})
	return r.err
}

// HostNames returns the host name of every rank when tr came from Connect
// (the hostname part of each rank's host id), for Options.Hosts; else nil.
func HostNames(tr Transport) []string {
	r, ok := tr.(*routedTransport)
	if !ok {
		return nil
	}
	names := make([]string, len(r.hosts))
	for i, id := range r.hosts {
		names[i], _, _ = strings.Cut(id, "#")
	}
	return names
}

// kind names the transport that reaches peer, for logs and tests.
func (r *routedTransport) kind(peer int) string {
	switch t := r.route[peer]; {
	case t == nil:
		return ""
	case t == r.shm:
		return "shm"
	default:
		return "tcp"
	}
}

// linkContext returns ctx, cancelled also (with cause ErrLinkClosed) when
// done is closed: a transport's Close ends the Connects it has in flight.
func linkContext(ctx context.Context, done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-done:
			cancel(ErrLinkClosed)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}
