package launch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/rendezvous"
)

// The launcher's side of the rendezvous: one server per attempt, which every
// agent must authenticate to and join before any rank starts.

// roundHost is the launcher's side of an attempt's rendezvous: its own
// server, or the round it wrote into the job's etcd.
type roundHost interface {
	WaitRound(ctx context.Context) ([]rendezvous.Member, error)
	Close() error
}

// listenRendezvous starts this attempt's rendezvous server, with a fresh
// secret, expecting every host by name; its log lines become notices.
// With etcd (Runtime.Etcd) it runs none: it writes the round there.
func (a *attempt) listenRendezvous(ctx context.Context) (roundHost, error) {
	if a.rt.meet != nil {
		return a.rt.meet(ctx, a)
	}
	secret, err := rendezvous.NewSecret()
	if err != nil {
		return nil, err
	}
	if a.rt.Etcd != nil {
		return a.etcdRendezvous(ctx, secret)
	}
	bind := a.rt.RendezvousBind
	if bind == "" {
		bind = ":0"
		if a.p.allLocal() {
			bind = "127.0.0.1:0"
		}
	}
	srv, err := rendezvous.Listen(rendezvous.Config{Addr: bind, Secret: secret, Nodes: a.nodeNames(), Log: a.rdzvLog})
	if err != nil {
		return nil, usage.Errorf("launch: rendezvous: listen on %s: %w (choose another with --rdzv-bind)", bind, err)
	}
	go func() { _ = srv.Serve(ctx) }()
	a.secret = secret
	a.rdzvPort = srv.Addr().(*net.TCPAddr).Port
	a.rdzvBind = bind
	return srv, nil
}

func (a *attempt) nodeNames() []string {
	names := make([]string, len(a.p.Hosts))
	for i, h := range a.p.Hosts {
		names[i] = h.Name
	}
	return names
}

// etcdRendezvous writes this attempt's round (the hosts, in order) under
// /gtrain/RUN/ATTEMPT in the job's etcd; agents and ranks meet there.
func (a *attempt) etcdRendezvous(ctx context.Context, secret []byte) (roundHost, error) {
	cfg := *a.rt.Etcd
	cfg.Prefix = rendezvous.EtcdPrefix(a.p.RunID, a.n)
	c, err := rendezvous.OpenEtcd(ctx, cfg, secret)
	if err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	if err := c.Expect(ctx, a.nodeNames()); err != nil {
		c.Close()
		return nil, fmt.Errorf("launch: %w", err)
	}
	a.secret = secret
	a.rdzvEndpoint = cfg.Endpoint()
	return etcdRound{c, ctx}, nil
}

// etcdRound is an attempt's round in etcd.
type etcdRound struct {
	*rendezvous.EtcdClient
	ctx context.Context // the attempt's
}

// Close removes the attempt's keys, which its ended ranks no longer need,
// so that etcd does not keep every attempt of every job; it does so even
// when the attempt was interrupted.
func (r etcdRound) Close() error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 5*time.Second)
	defer cancel()
	return errors.Join(r.Remove(ctx), r.EtcdClient.Close())
}

// rendezvousKind and rendezvousHint say, for an agent's error, what it
// could not reach and what sets that address.
func rendezvousKind(endpoint string) string {
	if rendezvous.IsEtcd(endpoint) {
		return "job's etcd rendezvous"
	}
	return "launcher's rendezvous"
}

func rendezvousHint(endpoint string) string {
	if rendezvous.IsEtcd(endpoint) {
		return "--rdzv-endpoint must be reachable from every host"
	}
	return "--rdzv-host sets the address hosts dial"
}

// offline is a Transport whose agents reach no network, like the tests'
// in-memory agents: the launcher starts no rendezvous for them and asks
// them to join none. Ranks of the built-in engine need the rendezvous, so
// every real transport's agents join it.
type offline interface {
	Transport
	offline()
}

// usesRendezvous says whether the agents of rt.Transport join a rendezvous.
func (rt *Runtime) usesRendezvous() bool {
	_, ok := rt.Transport.(offline)
	return !ok
}

// joinBackstop is how long the launcher waits for every joined event. With a
// rendezvous, its round times out first and names exactly who is missing.
func joinBackstop(rt Runtime) time.Duration {
	if !rt.usesRendezvous() {
		return rt.JoinTimeout
	}
	return rt.JoinTimeout + 5*time.Second
}

// waitRound reports a membership round that does not close in time; its
// error names the hosts that never joined.
func (a *attempt) waitRound(ctx context.Context, srv roundHost) {
	wctx, cancel := context.WithTimeout(ctx, a.rt.JoinTimeout)
	defer cancel()
	if _, err := srv.WaitRound(wctx); err != nil && ctx.Err() == nil {
		a.roundErr <- err
	}
}

// rdzvLog passes the server's refusals on to the event loop (it runs on the
// server's goroutines; views are fed from the loop only).
func (a *attempt) rdzvLog(line string) {
	if !strings.Contains(line, "refus") && !strings.Contains(line, "reject") {
		return // joins and the round closing are routine
	}
	select {
	case a.rdzvMsgs <- line:
	default:
	}
}

// rendezvousFor is the rendezvous part of host h's assignment.
func (a *attempt) rendezvousFor(h Host) *proto.Rendezvous {
	r := &proto.Rendezvous{Port: a.rdzvPort, Secret: a.secret, Name: h.Name, Host: a.rt.RendezvousHost, Endpoint: a.rdzvEndpoint}
	if h.Local && r.Endpoint == "" && a.rt.meet == nil {
		// Never SSH_CONNECTION here: gtrain itself may run in an SSH login.
		r.Host = "127.0.0.1"
		if host, _, err := net.SplitHostPort(a.rdzvBind); err == nil && host != "" && host != "0.0.0.0" && host != "::" {
			r.Host = host
		}
	}
	return r
}

// masterEnv is MASTER_ADDR and MASTER_PORT where the job left them to be
// determined at launch: the address the other nodes reach node 0 at (as
// this launcher reached it, or, when node 0 is this machine, the address a
// remote host sees this machine at), and a port node 0 found free.
func (a *attempt) masterEnv() []string {
	var env []string
	if a.p.MasterAddr == "" {
		env = append(env, "MASTER_ADDR="+a.masterAddr())
	}
	if a.p.MasterPort == 0 {
		port := a.agents[0].facts.FreePort
		if port == 0 {
			port, _ = FreePort()
		}
		env = append(env, "MASTER_PORT="+strconv.Itoa(port))
	}
	return env
}

// addrConn is an agent connection that knows its network addresses.
type addrConn interface {
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
}

func (a *attempt) masterAddr() string {
	if h0 := a.p.Hosts[0]; !h0.Local {
		if c, ok := a.agents[0].conn.(addrConn); ok {
			return hostOnly(c.RemoteAddr())
		}
		return strings.Trim(h0.Name, "[]")
	}
	for i, h := range a.p.Hosts {
		if c, ok := a.agents[i].conn.(addrConn); ok && !h.Local {
			return hostOnly(c.LocalAddr())
		}
	}
	return "127.0.0.1"
}

func hostOnly(addr net.Addr) string {
	h, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return h
}

// etcdConfKeys are the --rdzv-conf keys of the etcd backend: torchrun's
// rdzv_conf names for TLS (protocol, cacert, cert, key), and etcd's user
// auth, whose password is read from a file on each host.
var etcdConfKeys = []string{"protocol", "cacert", "cert", "key", "user", "password_file", "ttl"}

// etcdConfig is the etcd cluster of --rdzv-backend etcd, without its
// per-attempt prefix; nil for the launcher's own server (c10d, static).
func (r *Request) etcdConfig() (*rendezvous.EtcdConfig, error) {
	switch r.RendezvousBackend {
	case "", rendezvous.BackendC10d, rendezvous.BackendStatic:
		if (r.RendezvousEndpoint != "" && !r.PerNode()) || r.RendezvousConf != "" {
			return nil, usage.Errorf("run: --rdzv-endpoint and --rdzv-conf are for --rdzv-backend etcd: the %s backend is the launcher's own server (see --rdzv-bind, --rdzv-host)", cmp.Or(r.RendezvousBackend, rendezvous.BackendC10d))
		}
		return nil, nil
	case rendezvous.BackendEtcd:
	case "etcd-v2":
		return nil, usage.Errorf("run: --rdzv-backend etcd-v2 (etcd's v2 API) is not supported: use --rdzv-backend etcd, which speaks the v3 API")
	default:
		return nil, usage.Errorf("run: --rdzv-backend %q: want c10d (the default), static or etcd", r.RendezvousBackend)
	}
	if r.RendezvousEndpoint == "" {
		return nil, usage.Errorf("run: --rdzv-backend etcd needs --rdzv-endpoint HOST:PORT, an etcd client address every host reaches")
	}
	conf, err := parseRdzvConf(r.RendezvousConf)
	if err != nil {
		return nil, err
	}
	var hosts []string
	for h := range strings.SplitSeq(r.RendezvousEndpoint, ",") {
		h = strings.TrimPrefix(strings.TrimPrefix(h, "http://"), "https://")
		hosts = append(hosts, strings.TrimSuffix(h, "/"))
	}
	c := rendezvous.EtcdConfig{Endpoints: hosts, Prefix: rendezvous.EtcdPrefix("check", 0), CACert: conf["cacert"],
		Cert: conf["cert"], Key: conf["key"], Username: conf["user"], PasswordFile: conf["password_file"]}
	if conf["protocol"] == "https" && c.CACert == "" {
		return nil, usage.Errorf("run: --rdzv-conf protocol=https needs cacert=FILE, the CA that signed etcd's certificate")
	}
	if c.Username != "" && c.PasswordFile == "" {
		return nil, usage.Errorf("run: --rdzv-conf user=%s needs password_file=FILE, the same path on every host", c.Username)
	}
	if v := conf["ttl"]; v != "" {
		if c.TTL, err = time.ParseDuration(v); err != nil {
			return nil, usage.Errorf("run: --rdzv-conf ttl=%s: not a duration like 10s", v)
		}
	}
	if _, err := rendezvous.ParseEtcdEndpoint(c.Endpoint()); err != nil {
		return nil, usage.Errorf("run: --rdzv-endpoint %s: %w", r.RendezvousEndpoint, err)
	}
	c.Prefix = ""
	return &c, nil
}

// parseRdzvConf reads --rdzv-conf's key=value,key=value (torchrun's form).
func parseRdzvConf(s string) (map[string]string, error) {
	conf := map[string]string{}
	if s == "" {
		return conf, nil
	}
	for kv := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || !slices.Contains(etcdConfKeys, k) {
			return nil, usage.Errorf("run: --rdzv-conf %q: want key=value pairs of %s, separated by commas", kv, strings.Join(etcdConfKeys, ", "))
		}
		conf[k] = strings.TrimSpace(v)
	}
	if p := conf["protocol"]; p != "" && p != "http" && p != "https" {
		return nil, usage.Errorf("run: --rdzv-conf protocol=%s: want http or https", p)
	}
	return conf, nil
}
