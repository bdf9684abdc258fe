package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gtrain/gtrain/internal/userfile"
	"github.com/gtrain/gtrain/rendezvous"
)

// The job's store in per-node mode: etcd under /gtrain/RUN/nodes, or the
// c10d rendezvous server of the node the endpoint names.

func readUserFile(ctx context.Context, path string, limit int64) ([]byte, error) {
	b, err := userfile.Read(ctx, path, limit)
	if err != nil {
		return nil, userfile.Prefix(ctx, "run: --rdzv-secret-file", err)
	}
	return b, nil
}

// openPerNode connects to the job's store.
func (r *Request) openPerNode(ctx context.Context, secret []byte, lo, hi int) (*perNode, error) {
	pn := &perNode{secret: secret, min: lo, max: hi, endpoint: r.RendezvousEndpoint}
	if r.RendezvousBackend == rendezvous.BackendEtcd {
		cfg, err := r.etcdConfig()
		if err != nil {
			return nil, err
		}
		pn.etcd = cfg
		jc := *cfg
		jc.Prefix = rendezvous.EtcdPrefix(r.RunID, 0)
		jc.Prefix = strings.TrimSuffix(jc.Prefix, "/0") + "/nodes"
		c, err := rendezvous.OpenEtcd(ctx, jc, secret)
		if err != nil {
			return nil, fmt.Errorf("launch: %w", err)
		}
		pn.store = c
		return pn, nil
	}
	if err := pn.openC10d(ctx, r.RendezvousEndpoint, r.RendezvousBind, r.JoinTimeout); err != nil {
		return nil, err
	}
	return pn, nil
}

// openC10d hosts the job's rendezvous when the endpoint names this
// machine and its port is free (torchrun's c10d does the same), and
// connects to it, waiting up to timeout for the node that hosts it.
func (pn *perNode) openC10d(ctx context.Context, endpoint, bind string, timeout time.Duration) error {
	host, port, _ := net.SplitHostPort(endpoint)
	pn.rdzvHost = host
	pn.bind = bind
	if isThisMachine(ctx, host) {
		srv, err := rendezvous.Listen(rendezvous.Config{Addr: net.JoinHostPort("", port), Secret: pn.secret})
		switch {
		case err == nil:
			go func() { _ = srv.Serve(context.WithoutCancel(ctx)) }()
			pn.server = srv
		case !errors.Is(err, syscall.EADDRINUSE):
			return fmt.Errorf("launch: host the rendezvous at %s: %w", endpoint, err)
		}
	}
	c, err := dialRetry(ctx, endpoint, pn.secret, timeout)
	if err != nil {
		pn.close()
		return err
	}
	pn.store = c
	return nil
}

// dialRetry connects to the c10d rendezvous, trying again until timeout:
// the node that hosts it may start after this one. A wrong secret is
// final.
func dialRetry(parent context.Context, endpoint string, secret []byte, timeout time.Duration) (*rendezvous.Client, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	for {
		dctx, dcancel := context.WithTimeout(ctx, rendezvousDialTimeout)
		c, err := rendezvous.Dial(dctx, endpoint, secret)
		dcancel()
		switch {
		case err == nil:
			return c, nil
		case errors.Is(err, rendezvous.ErrAuth):
			return nil, fmt.Errorf("launch: rendezvous at %s: %w: this node's job secret differs from the host node's (every node needs the same --rdzv-secret-file or %s)", endpoint, err, SecretEnv)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			if parent.Err() != nil {
				// Interrupted (Ctrl-C, the job's end): that, not a
				// timeout, named as the etcd dial names its endpoint.
				return nil, fmt.Errorf("launch: rendezvous at %s: %w", endpoint, context.Cause(parent))
			}
			return nil, fmt.Errorf("launch: rendezvous at %s: no node hosts it after %v: %w (the endpoint's host must run gtrain run with the same --rdzv-endpoint; raise --join-timeout if it starts later)", endpoint, timeout, err)
		}
	}
}

// isThisMachine says whether host names this machine: localhost, its
// hostname, or an address of one of its interfaces (torchrun's check).
func isThisMachine(ctx context.Context, host string) bool {
	if IsLocalHost(host) {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	ips := []string{host}
	if net.ParseIP(host) == nil {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if ips, err = net.DefaultResolver.LookupHost(lctx, host); err != nil {
			return false
		}
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			for _, ip := range ips {
				if n.IP.Equal(net.ParseIP(ip)) {
					return true
				}
			}
		}
	}
	return false
}

// meet is Runtime.meet for a per-node job: the attempt's round for the
// agents and store for the ranks, with the job's secret. With etcd every
// node writes the same round; with c10d the host node runs a server for
// the attempt and the others read its port from the job's store.
func (pn *perNode) meet(ctx context.Context, a *attempt) (roundHost, error) {
	if pn.etcd != nil {
		return a.etcdRendezvous(ctx, pn.secret)
	}
	a.secret = pn.secret
	key := roundKey(a.n, "rdzv-port")
	if pn.server != nil {
		bind := net.JoinHostPort("", "0")
		if pn.bind != "" {
			bind = pn.bind
		}
		srv, err := rendezvous.Listen(rendezvous.Config{Addr: bind, Secret: pn.secret, Nodes: a.nodeNames(), Log: a.rdzvLog})
		if err != nil {
			return nil, fmt.Errorf("launch: rendezvous: listen on %s: %w (choose another with --rdzv-bind)", bind, err)
		}
		go func() { _ = srv.Serve(ctx) }()
		a.rdzvPort = srv.Addr().(*net.TCPAddr).Port
		if err := pn.store.Set(ctx, key, []byte(strconv.Itoa(a.rdzvPort))); err != nil {
			srv.Close()
			return nil, fmt.Errorf("launch: rendezvous at %s: %w", pn.endpoint, err)
		}
		return srv, nil
	}
	wctx, cancel := context.WithTimeout(ctx, a.rt.JoinTimeout)
	defer cancel()
	v, err := pn.store.Get(wctx, key)
	if err == nil {
		a.rdzvPort, err = strconv.Atoi(string(v))
	}
	if err != nil {
		return nil, fmt.Errorf("launch: the attempt's rendezvous from the host node at %s: %w", pn.endpoint, err)
	}
	return noRound{}, nil
}

// noRound is the round of an attempt that another node hosts: that node's
// launcher reports it.
type noRound struct{}

func (noRound) WaitRound(context.Context) ([]rendezvous.Member, error) { return nil, nil }
func (noRound) Close() error                                           { return nil }

// end writes the job's end unless a node wrote one first, and, on the
// node hosting the c10d store, waits a little for the other nodes to
// leave before the store goes: a node still reading its last attempt's
// keys must not see the store vanish.
func (pn *perNode) end(ctx context.Context, e jobEnd) {
	raw, _ := json.Marshal(e)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _, _ = pn.store.CompareAndSet(ctx, pn.endKey(), nil, raw)
	left, err := pn.store.Add(ctx, roundKey(pn.first, "left"), 1)
	if pn.server == nil || err != nil {
		return
	}
	for left < int64(pn.joined(ctx)) && sleepCtx(ctx, 100*time.Millisecond) == nil {
		if left, err = pn.store.Add(ctx, roundKey(pn.first, "left"), 0); err != nil {
			return
		}
	}
}

// joined is how many nodes ever joined the run's first round (a bound on
// who may still read the store).
func (pn *perNode) joined(ctx context.Context) int {
	n, err := pn.store.Add(ctx, roundKey(pn.first, "count"), 0)
	if err != nil {
		return 0
	}
	return int(n)
}

// storeName names the job's store for messages, and says what to check
// when it does not answer.
func (pn *perNode) storeName() (name, check string) {
	if pn.etcd != nil {
		return "etcd at " + pn.endpoint, "etcd runs there and every node reaches it"
	}
	return "the c10d rendezvous at " + pn.endpoint, "the gtrain run of the node at that address still runs and every node reaches it"
}

// close ends the connection to the store, and the store when this node
// hosts it.
func (pn *perNode) close() {
	if pn.store != nil {
		_ = pn.store.Close()
	}
	if pn.server != nil {
		_ = pn.server.Close()
	}
}
