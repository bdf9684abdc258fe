package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// joinResult is what one Join call returned.
type joinResult struct {
	round *Round
	err   error
}

// joinAsync starts a Join on a new client and returns where its result
// will arrive.
func joinAsync(ctx context.Context, t *testing.T, e *env, name string, facts any) <-chan joinResult {
	c := e.client(t)
	out := make(chan joinResult, 1)
	go func() {
		r, err := c.Join(ctx, name, facts)
		out <- joinResult{r, err}
	}()
	return out
}

func TestRanksFollowConfiguredOrder(t *testing.T) {
	nodes := []string{"node-a", "node-b", "node-c"}
	tests := []struct {
		name  string
		order []int // indexes into nodes, in join order
	}{
		{"hostfile order", []int{0, 1, 2}},
		{"reversed", []int{2, 1, 0}},
		{"middle first", []int{1, 2, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := startPipe(t, nodes...)
				results := make([]<-chan joinResult, len(nodes))
				wantAddr := make([]string, len(nodes))
				for k, i := range tt.order {
					facts := map[string]any{"hostname": nodes[i], "os": "linux", "cpus": 8, "master_port": 29500 + i, "gpu": "A100"}
					results[i] = joinAsync(context.Background(), t, e, nodes[i], facts)
					wantAddr[i] = fmt.Sprintf("10.0.0.%d", 2+k) // the pipe listener's k-th connection
					synctest.Wait()                             // joined and waiting: fixes the join order
				}
				members, err := e.srv.WaitRound(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				checkMembers(t, members, nodes, wantAddr)
				for i, ch := range results {
					res := <-ch
					if res.err != nil {
						t.Fatalf("%s: %v", nodes[i], res.err)
					}
					if res.round.Rank != i {
						t.Errorf("%s got rank %d, want %d", nodes[i], res.round.Rank, i)
					}
					checkMembers(t, res.round.Members, nodes, wantAddr)
				}
			})
		})
	}
}

func checkMembers(t *testing.T, members []Member, nodes, addrs []string) {
	t.Helper()
	if len(members) != len(nodes) {
		t.Fatalf("%d members, want %d", len(members), len(nodes))
	}
	for i, m := range members {
		f, err := m.HostFacts()
		if err != nil {
			t.Fatal(err)
		}
		var extra struct{ GPU string }
		json.Unmarshal(m.Facts, &extra)
		if m.Rank != i || m.Name != nodes[i] || m.Addr != addrs[i] || f.Hostname != nodes[i] || f.MasterPort != 29500+i || f.CPUs != 8 || extra.GPU != "A100" {
			t.Errorf("member %d = %+v %s, want rank %d, name %s, addr %s, all facts kept", i, m, m.Facts, i, nodes[i], addrs[i])
		}
	}
}

// TestObservedAddrTCP: over real loopback TCP the observed address is the IP
// the connection came from, without a port.
func TestObservedAddrTCP(t *testing.T) {
	e := startTCP(t, "solo")
	r, err := e.client(t).Join(context.Background(), "solo", Facts{Hostname: "h", MasterPort: 29500})
	if err != nil {
		t.Fatal(err)
	}
	if r.Rank != 0 || len(r.Members) != 1 || r.Members[0].Addr != "127.0.0.1" {
		t.Errorf("round = %+v, want one member at 127.0.0.1", r)
	}
	if !strings.Contains(e.log.String(), "round closed: 1 nodes") {
		t.Errorf("log = %q, want the round closing", e.log)
	}
}

func TestWaitRoundNamesMissing(t *testing.T) {
	tests := []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		want    string
		wantErr error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Second)
		}, "rendezvous: round timed out after 30s: missing worker-1, worker-3", context.DeadlineExceeded},
		{"cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(2*time.Second, cancel)
			return ctx, cancel
		}, "rendezvous: round cancelled after 2s: missing worker-1, worker-3", context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := startPipe(t, "worker-0", "worker-1", "worker-2", "worker-3")
				jctx, stop := context.WithCancel(context.Background())
				defer stop()
				joinAsync(jctx, t, e, "worker-0", Facts{})
				joinAsync(jctx, t, e, "worker-2", Facts{})
				synctest.Wait()
				ctx, cancel := tt.ctx()
				defer cancel()
				_, err := e.srv.WaitRound(ctx)
				if err == nil || err.Error() != tt.want {
					t.Fatalf("WaitRound error = %v, want %q", err, tt.want)
				}
				var re *RoundError
				if !errors.As(err, &re) || !errors.Is(err, tt.wantErr) || strings.Join(re.Missing, " ") != "worker-1 worker-3" {
					t.Errorf("WaitRound error %#v: want a *RoundError wrapping %v", err, tt.wantErr)
				}
			})
		})
	}
}

func TestJoinRejected(t *testing.T) {
	tests := []struct {
		name  string
		first string // joined (and waiting) before the join under test; "" = none
		join  string
		facts any
		want  error
		msg   string
	}{
		{"unknown name", "", "worker-9", Facts{}, ErrUnknownNode, `rendezvous: join worker-9: unknown node "worker-9": this job expects worker-0, worker-1`},
		{"duplicate", "worker-0", "worker-0", Facts{}, ErrDuplicateNode, "rendezvous: join worker-0: node worker-0 already joined (from 10.0.0.2); the first join stays"},
		{"facts not an object", "", "worker-0", []int{1}, ErrBadRequest, "facts must be a JSON object"},
		{"facts of wrong type", "", "worker-0", map[string]any{"cpus": "many"}, ErrBadRequest, "facts: json: cannot unmarshal"},
		{"facts too large", "", "worker-0", map[string]string{"x": strings.Repeat("x", MaxFacts)}, ErrTooLarge, "facts of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := startPipe(t, "worker-0", "worker-1")
				var first <-chan joinResult
				if tt.first != "" {
					first = joinAsync(context.Background(), t, e, tt.first, Facts{Hostname: "first"})
					synctest.Wait()
				}
				_, err := e.client(t).Join(context.Background(), tt.join, tt.facts)
				if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
					t.Fatalf("Join error = %v, want %v with %q", err, tt.want, tt.msg)
				}
				if first == nil {
					return
				}
				// The first join stays: the round closes with its facts.
				if _, err := e.client(t).Join(context.Background(), "worker-1", Facts{}); err != nil {
					t.Fatal(err)
				}
				res := <-first
				if f, _ := res.round.Members[0].HostFacts(); res.err != nil || f.Hostname != "first" {
					t.Errorf("first join got %+v, %v; want the round with its own facts", res.round, res.err)
				}
			})
		})
	}
}

func TestServerRejectsBadJoin(t *testing.T) {
	e := startTCP(t, "w0")
	r := e.raw(t)
	r.handshake(e.secret)
	r.writeLine(`{"v":1,"type":"join","id":7,"name":"w0","facts":"not an object"}`)
	if m := r.read(); m == nil || m.Code != codeBadRequest || !strings.Contains(m.Error, "facts must be a JSON object") {
		t.Fatalf("got %+v, want bad_request for facts", m)
	}
	if !strings.Contains(e.log.String(), "closing connection") {
		t.Errorf("log = %q", e.log)
	}
}

// TestLeaverFreesSlot: a node whose agent gives up (or whose connection
// drops) before the round closes leaves it, so a restarted agent can join
// under the same name.
func TestLeaverFreesSlot(t *testing.T) {
	for _, how := range []string{"cancel", "close"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := startPipe(t, "w0", "w1")
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				c := e.client(t)
				res := make(chan error, 1)
				go func() { _, err := c.Join(ctx, "w0", Facts{Hostname: "old"}); res <- err }()
				synctest.Wait()
				if how == "cancel" {
					cancel()
				} else {
					c.Close()
				}
				if err := <-res; err == nil {
					t.Fatal("Join succeeded, want an error")
				}
				synctest.Wait()
				if m := e.srv.round.missing(); len(m) != 2 {
					t.Fatalf("missing = %v after w0 left, want both", m)
				}
				again := joinAsync(context.Background(), t, e, "w0", Facts{Hostname: "new"})
				if _, err := e.client(t).Join(context.Background(), "w1", Facts{}); err != nil {
					t.Fatal(err)
				}
				r := <-again
				if f, _ := r.round.Members[0].HostFacts(); r.err != nil || f.Hostname != "new" {
					t.Errorf("rejoin got %+v, %v", r.round, r.err)
				}
			})
		})
	}
}

func TestStoreOnlyServer(t *testing.T) {
	e := startTCP(t)
	members, err := e.srv.WaitRound(context.Background())
	if err != nil || len(members) != 0 {
		t.Errorf("WaitRound with no nodes = %v, %v; want an empty round at once", members, err)
	}
}

// TestServeStopsWithContext: ending Serve's context closes the server and
// ends every wait on it, on both sides.
func TestServeStopsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := newPipeListener()
		srv := newServer(Config{Secret: mustSecret(t), Nodes: []string{"w0", "w1"}}, ln)
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ctx) }()
		nc, err := ln.dial(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		c, err := newClient(context.Background(), nc, "pipe", srv.cfg.Secret)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		errs := make(chan error, 3)
		go func() { _, err := c.Get(context.Background(), "k"); errs <- err }()
		go func() { _, err := c.Join(context.Background(), "w0", Facts{}); errs <- err }()
		go func() { _, err := srv.WaitRound(context.Background()); errs <- err }()
		synctest.Wait()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve = %v after its context ended, want nil", err)
		}
		for range 3 {
			if err := <-errs; err == nil || !strings.HasPrefix(err.Error(), "rendezvous: ") {
				t.Errorf("wait ended with %v, want a rendezvous error", err)
			}
		}
		if _, err := srv.WaitRound(context.Background()); !errors.Is(err, ErrClosed) {
			t.Errorf("WaitRound on a closed server = %v, want ErrClosed", err)
		}
	})
}
