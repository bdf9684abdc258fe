package launch

import (
	"context"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/rendezvous"
)

// The launcher's side of the rendezvous: one server per attempt, which every
// agent must authenticate to and join before any rank starts.

// listenRendezvous starts this attempt's rendezvous server, with a fresh
// secret, expecting every host by name; its log lines become notices.
func (a *attempt) listenRendezvous(ctx context.Context) (*rendezvous.Server, error) {
	secret, err := rendezvous.NewSecret()
	if err != nil {
		return nil, err
	}
	bind := a.rt.RendezvousBind
	if bind == "" {
		bind = ":0"
		if a.p.allLocal() {
			bind = "127.0.0.1:0"
		}
	}
	names := make([]string, len(a.p.Hosts))
	for i, h := range a.p.Hosts {
		names[i] = h.Name
	}
	srv, err := rendezvous.Listen(rendezvous.Config{Addr: bind, Secret: secret, Nodes: names, Log: a.rdzvLog})
	if err != nil {
		return nil, usage.Errorf("launch: rendezvous: listen on %s: %w (choose another with --rdzv-bind)", bind, err)
	}
	go func() { _ = srv.Serve(ctx) }()
	a.secret = secret
	a.rdzvPort = srv.Addr().(*net.TCPAddr).Port
	a.rdzvBind = bind
	return srv, nil
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
func (a *attempt) waitRound(ctx context.Context, srv *rendezvous.Server) {
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
	r := &proto.Rendezvous{Port: a.rdzvPort, Secret: a.secret, Name: h.Name, Host: a.rt.RendezvousHost}
	if h.Local {
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
