package rendezvous

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EtcdClient is a Backend in an etcd cluster: the round, the store and the
// liveness of one attempt of one job live under its key prefix (see
// PROTOCOL.md, "etcd backend"), so they outlive the launcher. Every value
// carries an HMAC of the job's secret over its key, so a node of another
// job (or one with a wrong secret) is refused, not believed. It is safe for
// concurrent use.
type EtcdClient struct {
	cfg    EtcdConfig
	cli    *clientv3.Client
	secret []byte
	where  string   // the endpoints, for errors
	local  net.Addr // this host's address on the route to etcd

	life   context.Context // ends at Close: the lease's keepalive runs in it
	cancel context.CancelFunc

	mu        sync.Mutex
	lease     clientv3.LeaseID // 0 until Join
	leaseDone chan struct{}    // closed when the keepalive ends
	roundRev  int64            // the revision at which the round closed
}

// etcdDialTimeout bounds OpenEtcd's first contact with the cluster.
const etcdDialTimeout = 10 * time.Second

// reconnect is how the client dials etcd again after losing it: gRPC's
// default backoff grows to 120 s, so after a 25 s outage the next try
// could come 10 s after etcd was back, and a node would count that as
// outage too (judging its peers, or the store, lost). Tries at most
// etcdMaxBackoff apart cost etcd little and see it back within that.
var reconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: etcdMaxBackoff},
	MinConnectTimeout: 5 * time.Second,
}

// etcdMaxBackoff caps the time between the client's tries to reach etcd.
const etcdMaxBackoff = 2 * time.Second

// signLabel ties a value's MAC to this use and version.
var signLabel = []byte("gtrain rendezvous etcd v1 value\x00")

// OpenEtcd connects to the etcd cluster of cfg with the job's secret and
// checks that it answers (and accepts the user, with auth), within ctx and
// at most 10 s.
func OpenEtcd(ctx context.Context, cfg EtcdConfig, secret []byte) (*EtcdClient, error) {
	where := strings.Join(cfg.Endpoints, ",")
	fail := func(err error) (*EtcdClient, error) {
		return nil, fmt.Errorf("rendezvous: etcd %s: %w", where, err)
	}
	if err := checkSecret(secret); err != nil {
		return fail(err)
	}
	tlsCfg, err := cfg.tlsConfig()
	if err != nil {
		return fail(err)
	}
	pw, err := cfg.password()
	if err != nil {
		return fail(err)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultEtcdTTL
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: cfg.Endpoints, TLS: tlsCfg, Username: cfg.Username, Password: pw,
		DialTimeout: etcdDialTimeout, Logger: zap.NewNop(), Context: context.WithoutCancel(ctx),
		DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: 5 * time.Second,
		// As the TCP client: a reply as large as a round of thousands of
		// nodes, and no more (etcd's client would take 2 GiB).
		MaxCallSendMsgSize: MaxMessage, MaxCallRecvMsgSize: maxReplyLine,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(reconnect)},
	})
	if err != nil {
		return fail(err)
	}
	c := &EtcdClient{cfg: cfg, cli: cli, secret: secret, where: where, local: localAddrTo(cfg.Endpoints[0])}
	c.life, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	// The client connects lazily: one read shows now that etcd is there.
	pctx, pcancel := context.WithTimeout(ctx, etcdDialTimeout)
	defer pcancel()
	if _, err := cli.Get(pctx, c.cfg.Prefix+"/round/nodes", clientv3.WithCountOnly()); err != nil {
		c.Close()
		if errors.Is(ctx.Err(), context.Canceled) {
			// Interrupted (Ctrl-C): the cause, not a failure of etcd.
			return fail(context.Cause(ctx))
		}
		return fail(fmt.Errorf("connect: %w (is etcd running there, and are --rdzv-conf's TLS and user right?)", err))
	}
	return c, nil
}

// localAddrTo is this host's address on the route to hostport: a UDP
// "connection" sends nothing, but picks the interface.
func localAddrTo(hostport string) net.Addr {
	if nc, err := net.Dial("udp", hostport); err == nil {
		defer nc.Close()
		if ua, ok := nc.LocalAddr().(*net.UDPAddr); ok {
			return &net.TCPAddr{IP: ua.IP}
		}
	}
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}
}

// LocalAddr is this host's address on the route to the first etcd member.
func (c *EtcdClient) LocalAddr() net.Addr { return c.local }

// Prefix is the key prefix of this attempt, /gtrain/RUN/N.
func (c *EtcdClient) Prefix() string { return c.cfg.Prefix }

// Close revokes this node's lease (its member key goes with it), and ends
// the connection.
func (c *EtcdClient) Close() error {
	c.mu.Lock()
	lease := c.lease
	c.mu.Unlock()
	if lease != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c.cli.Revoke(ctx, lease) // best effort: the TTL ends it anyway
		cancel()
	}
	c.cancel()
	return c.cli.Close()
}

// Remove deletes every key of the attempt (the round, the store and the
// barriers): the launcher does it once the attempt's ranks have ended.
func (c *EtcdClient) Remove(ctx context.Context) error {
	if _, err := c.cli.Delete(ctx, c.cfg.Prefix+"/", clientv3.WithPrefix()); err != nil {
		return fmt.Errorf("rendezvous: etcd %s: remove %s/: %w", c.where, c.cfg.Prefix, ctxErr(ctx, err))
	}
	return nil
}

// errf is an error of operation op about etcd key k (the full key): it
// names the store's key or barrier as the caller gave it, and the etcd
// key. Without op it is about the stored value.
func (c *EtcdClient) errf(k, op string, err error) error {
	if op == "" {
		return fmt.Errorf("rendezvous: etcd %s key %q: %w", c.where, clip(k), err)
	}
	name := strings.TrimPrefix(k, c.cfg.Prefix+"/")
	for _, section := range []string{"kv/", "barrier/"} {
		name = strings.TrimPrefix(name, section)
	}
	return fmt.Errorf("rendezvous: etcd %s: %s %q (key %s): %w", c.where, op, clip(name), clip(k), err)
}

// sign is the stored form of value at key k: HMAC-SHA256(secret, label ||
// k || 0 || value) followed by value. The key holds the job's run id and
// attempt, so a value is valid under its own key of its own job only.
func (c *EtcdClient) sign(k string, value []byte) string {
	return string(append(c.mac(k, value), value...))
}

func (c *EtcdClient) mac(k string, value []byte) []byte {
	h := hmac.New(sha256.New, c.secret)
	h.Write(signLabel)
	h.Write([]byte(k))
	h.Write([]byte{0})
	h.Write(value)
	return h.Sum(nil)
}

// errNotSigned is a value another job's secret signed.
var errNotSigned = fmt.Errorf("value not signed with this job's secret (another job with the same --rdzv-id, or a wrong secret): %w", ErrAuth)

// open checks the stored value at k and returns what was signed.
func (c *EtcdClient) open(k string, stored []byte) ([]byte, error) {
	if len(stored) < macLen || !hmac.Equal(stored[:macLen], c.mac(k, stored[macLen:])) {
		return nil, c.errf(k, "", errNotSigned)
	}
	return stored[macLen:], nil
}

// read returns the value at k (nil, rev 0 if missing), its mod revision
// and the store's revision.
func (c *EtcdClient) read(ctx context.Context, k, op string) (value []byte, mod, rev int64, err error) {
	resp, err := c.cli.Get(ctx, k)
	if err != nil {
		return nil, 0, 0, c.errf(k, op, ctxErr(ctx, err))
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, resp.Header.Revision, nil
	}
	kv := resp.Kvs[0]
	v, err := c.open(k, kv.Value)
	return v, kv.ModRevision, resp.Header.Revision, err
}

// swap writes value at k if k is still at mod revision mod (0: missing).
func (c *EtcdClient) swap(ctx context.Context, k, op string, mod int64, value []byte) (bool, int64, error) {
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", mod)).
		Then(clientv3.OpPut(k, c.sign(k, value))).Commit()
	if err != nil {
		return false, 0, c.errf(k, op, ctxErr(ctx, err))
	}
	return resp.Succeeded, resp.Header.Revision, nil
}

// ctxErr prefers the context's cause to the gRPC status it ended with.
func ctxErr(ctx context.Context, err error) error {
	// gRPC (or etcd, from the timeout gRPC sent it) may time a call out
	// just before ctx's own timer fires: it is still ctx's deadline.
	if c := status.Code(err); ctx.Err() == nil && (c == codes.DeadlineExceeded || c == codes.Canceled) {
		if d, ok := ctx.Deadline(); ok && time.Until(d) < time.Second {
			<-ctx.Done()
		}
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// storeKey checks a store key and value as the built-in client does, and
// returns the full key.
func (c *EtcdClient) storeKey(op, key string, value, old []byte) (string, error) {
	err := checkKeyValue(&message{ID: 1, Key: key, Value: value, Old: old})
	if err == nil && !utf8.ValidString(key) {
		err = fmt.Errorf("key is not valid UTF-8: %w", ErrBadRequest)
	}
	if err != nil {
		return "", fmt.Errorf("rendezvous: etcd %s: %s %q: %w", c.where, op, clip(key), err)
	}
	return c.cfg.Prefix + "/kv/" + key, nil
}

// Set stores value under key, waking every Get waiting for it.
func (c *EtcdClient) Set(ctx context.Context, key string, value []byte) error {
	k, err := c.storeKey("set", key, value, nil)
	if err != nil {
		return err
	}
	if _, err := c.cli.Put(ctx, k, c.sign(k, value)); err != nil {
		return c.errf(k, "set", ctxErr(ctx, err))
	}
	return nil
}

// Get returns the value of key, waiting until it exists or ctx ends: a read,
// then a watch from the revision after it, so no write can fall between.
func (c *EtcdClient) Get(ctx context.Context, key string) ([]byte, error) {
	k, err := c.storeKey("get", key, nil, nil)
	if err != nil {
		return nil, err
	}
	for {
		v, mod, rev, err := c.read(ctx, k, "get")
		if err != nil || mod != 0 {
			return v, err
		}
		v, found, err := c.waitPut(ctx, k, rev+1)
		if err != nil || found {
			return v, err
		}
	}
}

// waitPut watches k from revision rev for its first write; found is false
// when the watch must start over (its revision was compacted).
func (c *EtcdClient) waitPut(ctx context.Context, k string, rev int64) (v []byte, found bool, err error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range c.cli.Watch(wctx, k, clientv3.WithRev(rev)) {
		if err := wr.Err(); err != nil {
			return nil, false, nil
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				v, err := c.open(k, ev.Kv.Value)
				return v, true, err
			}
		}
	}
	return nil, false, c.errf(k, "get", c.ended(ctx))
}

// ended is why a watch channel closed: ctx, or this client's Close.
func (c *EtcdClient) ended(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return fmt.Errorf("client %w", ErrClosed)
}

// Add atomically adds delta to the counter at key (missing: 0): a read and
// a transaction that writes only if the key is unchanged, again if not.
func (c *EtcdClient) Add(ctx context.Context, key string, delta int64) (int64, error) {
	k, err := c.storeKey("add", key, nil, nil)
	if err != nil {
		return 0, err
	}
	for {
		v, mod, _, err := c.read(ctx, k, "add")
		if err != nil {
			return 0, err
		}
		n, err := addCounter(key, v, mod != 0, delta)
		if err != nil {
			return 0, fmt.Errorf("rendezvous: etcd %s: add %q: %w", c.where, clip(key), err)
		}
		ok, _, err := c.swap(ctx, k, "add", mod, []byte(fmt.Sprint(n)))
		if err != nil || ok {
			return n, err
		}
	}
}

// CompareAndSet sets key to value if it holds old (a missing key holds an
// empty old), in a transaction on the revision it compared.
func (c *EtcdClient) CompareAndSet(ctx context.Context, key string, old, value []byte) (bool, []byte, error) {
	k, err := c.storeKey("cas", key, value, old)
	if err != nil {
		return false, nil, err
	}
	for {
		cur, mod, _, err := c.read(ctx, k, "cas")
		if err != nil {
			return false, nil, err
		}
		if string(cur) != string(old) {
			return false, cur, nil
		}
		ok, _, err := c.swap(ctx, k, "cas", mod, value)
		if err != nil {
			return false, nil, err
		}
		if ok {
			return true, append([]byte{}, value...), nil
		}
	}
}

// errLeaseLost is this node's own lease ending.
var errLeaseLost = errors.New("this node's lease ended (etcd unreachable for longer than its TTL)")
