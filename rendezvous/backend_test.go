package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gtrain/gtrain/internal/etcdtest"
)

// rdzv is one running rendezvous of either backend, as the contract tests
// below see it: the same table runs against the built-in TCP server and a
// real etcd.
type rdzv struct {
	open func(t *testing.T) Backend // a new client of the same job
	// waitRound waits for the round, as the launcher does.
	waitRound func(ctx context.Context) ([]Member, error)
	// arrivals waits until n clients are counted at barrier name.
	arrivals func(t *testing.T, name string, n int)
	// joined waits until n nodes are in the round.
	joined func(t *testing.T, n int)
	// where is what the backend's errors say after "rendezvous: ".
	where string
	// adders are testAddConcurrent's clients, goroutines per client and
	// adds per goroutine: an add in etcd is a read and a transaction.
	adders [3]int
}

// backends runs f against each backend, expecting nodes in the round.
func backends(t *testing.T, nodes []string, f func(t *testing.T, r *rdzv)) {
	t.Run("c10d", func(t *testing.T) { f(t, tcpRdzv(t, nodes)) })
	t.Run("etcd", func(t *testing.T) { f(t, etcdRdzv(t, etcdtest.Start(t), nodes)) })
}

func tcpRdzv(t *testing.T, nodes []string) *rdzv {
	e := startTCP(t, nodes...)
	return &rdzv{
		adders:    [3]int{4, 8, 50},
		open:      func(t *testing.T) Backend { return e.client(t) },
		waitRound: e.srv.WaitRound,
		arrivals: func(t *testing.T, name string, n int) {
			waitFor(t, fmt.Sprintf("%d arrivals at barrier %s", n, name), func() bool {
				e.srv.store.mu.Lock()
				defer e.srv.store.mu.Unlock()
				b := e.srv.store.barriers[name]
				if b == nil {
					return n == 0
				}
				return b.count == n
			})
		},
		joined: func(t *testing.T, n int) {
			waitFor(t, fmt.Sprintf("%d nodes in the round", n), func() bool {
				e.srv.round.mu.Lock()
				defer e.srv.round.mu.Unlock()
				return e.srv.round.joined == n
			})
		},
	}
}

// waitFor checks cond until it holds: the built-in server has no event to
// wait on from outside, so this polls, with a backstop only a hang reaches.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after a minute", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// etcdRdzv is a job's rendezvous in srv: the launcher's client has
// written the expected nodes (a job with no nodes has no round).
func etcdRdzv(t *testing.T, srv *etcdtest.Server, nodes []string) *rdzv {
	cfg := EtcdConfig{Endpoints: []string{srv.Endpoint}, Prefix: EtcdPrefix("job-"+t.Name(), 0), TTL: 2 * time.Second}
	secret := mustSecret(t)
	open := func(t *testing.T) *EtcdClient {
		t.Helper()
		c, err := Open(etcdtest.WaitContext(t), cfg.Endpoint(), secret)
		if err != nil {
			t.Fatalf("%v\netcd's log:\n%s", err, srv.Log())
		}
		t.Cleanup(func() { c.Close() })
		return c.(*EtcdClient)
	}
	launcher := open(t)
	if nodes != nil {
		if err := launcher.Expect(etcdtest.WaitContext(t), nodes); err != nil {
			t.Fatal(err)
		}
	}
	return &rdzv{
		where:     "etcd " + srv.Endpoint + ": ",
		adders:    [3]int{2, 4, 10},
		open:      func(t *testing.T) Backend { return open(t) },
		waitRound: launcher.WaitRound,
		arrivals: func(t *testing.T, name string, n int) {
			k := cfg.Prefix + "/barrier/" + name
			watchUntil(t, launcher, k, func(v []byte) bool {
				s, ok := parseBarrier(v)
				return ok && s.count == int64(n)
			})
		},
		joined: func(t *testing.T, n int) {
			ctx := etcdtest.WaitContext(t)
			p := cfg.Prefix + "/round/member/"
			for {
				resp, err := launcher.cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly())
				if err != nil {
					t.Fatal(err)
				}
				if resp.Count == int64(n) {
					return
				}
				wctx, cancel := context.WithCancel(ctx)
				<-launcher.cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
				cancel()
			}
		},
	}
}

// watchUntil waits, with a watch from the current revision, until key k's
// (signed) value satisfies cond.
func watchUntil(t *testing.T, c *EtcdClient, k string, cond func([]byte) bool) {
	t.Helper()
	ctx := etcdtest.WaitContext(t)
	v, mod, rev, err := c.read(ctx, k, "test")
	if err != nil {
		t.Fatal(err)
	}
	if mod != 0 && cond(v) {
		return
	}
	for wr := range c.cli.Watch(ctx, k, clientv3.WithRev(rev+1)) {
		for _, ev := range wr.Events {
			v, err = c.open(k, ev.Kv.Value)
			if err == nil && cond(v) {
				return
			}
		}
	}
	t.Logf("last value of %s: %q, %v", k, v, err)
	t.Fatalf("watch of %s ended: %v", k, context.Cause(ctx))
}

// TestStoreContract: every store operation means the same on both backends.
func TestStoreContract(t *testing.T) {
	backends(t, nil, func(t *testing.T, r *rdzv) {
		t.Run("get waits for set", func(t *testing.T) { testGetWaitsForSet(t, r) })
		t.Run("get timeout", func(t *testing.T) { testGetTimeout(t, r) })
		t.Run("add concurrent", func(t *testing.T) { testAddConcurrent(t, r) })
		t.Run("add errors", func(t *testing.T) { testAddErrors(t, r) })
		t.Run("compare and set", func(t *testing.T) { testCompareAndSet(t, r) })
		t.Run("barrier", func(t *testing.T) { testBarrier(t, r) })
		t.Run("limits", func(t *testing.T) { testLimits(t, r) })
	})
}

func testGetWaitsForSet(t *testing.T, r *rdzv) {
	waiter, setter := r.open(t), r.open(t)
	got := make(chan string, 1)
	go func() {
		v, err := waiter.Get(bg, "addr/0")
		got <- fmt.Sprint(string(v), err)
	}()
	if err := waiter.Set(bg, "other", []byte("x")); err != nil { // not blocked by the Get
		t.Fatal(err)
	}
	if err := setter.Set(bg, "addr/0", []byte("10.0.0.7:1234")); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != "10.0.0.7:1234<nil>" {
		t.Errorf("Get = %q, want the value set by the other client", g)
	}
	if v, err := setter.Get(bg, "other"); err != nil || string(v) != "x" {
		t.Errorf("Get(other) = %q, %v", v, err)
	}
}

func testGetTimeout(t *testing.T, r *rdzv) {
	c := r.open(t)
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	_, err := c.Get(ctx, "never")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `"never"`) || !strings.HasPrefix(err.Error(), "rendezvous: ") {
		t.Fatalf("Get = %v, want a deadline error naming the key", err)
	}
	if err := c.Set(bg, "never", []byte("now")); err != nil {
		t.Fatalf("Set after a timed-out Get: %v", err)
	}
}

// testAddConcurrent: concurrent Adds from several connections never lose
// an increment and each sees a distinct result.
func testAddConcurrent(t *testing.T, r *rdzv) {
	clients, goroutines, adds := r.adders[0], r.adders[1], r.adders[2]
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for range clients {
		c := r.open(t)
		for range goroutines {
			wg.Go(func() {
				for range adds {
					n, err := c.Add(bg, "count", 1)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					seen[n] = true
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	total := clients * goroutines * adds
	if len(seen) != total || !seen[1] || !seen[int64(total)] {
		t.Errorf("saw %d distinct results, want 1..%d each once", len(seen), total)
	}
	if v, err := r.open(t).Get(bg, "count"); err != nil || string(v) != fmt.Sprint(total) {
		t.Errorf("Get(count) = %q, %v; want %d as decimal text", v, err, total)
	}
}

func testAddErrors(t *testing.T, r *rdzv) {
	c := r.open(t)
	if err := c.Set(bg, "text", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Add(bg, "big", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		key  string
		want string
	}{
		{"text", "rendezvous: " + r.where + `add "text": add to "text": value is not a decimal integer`},
		{"big", "overflows int64"},
	} {
		if _, err := c.Add(bg, tt.key, 1); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Add(%s) = %v, want %q", tt.key, err, tt.want)
		}
	}
	if n, err := c.Add(bg, "big", -1); err != nil || n != math.MaxInt64-1 {
		t.Errorf("Add(-1) = %d, %v; the failed Add must leave the counter alone", n, err)
	}
}

func testCompareAndSet(t *testing.T, r *rdzv) {
	c := r.open(t)
	for _, s := range []struct { // in order, on one key
		name        string
		old, value  string
		wantSwapped bool
		wantCurrent string
	}{
		{"missing key, non-empty old", "x", "a", false, ""},
		{"missing key, empty old", "", "a", true, "a"},
		{"wrong old", "b", "c", false, "a"},
		{"right old", "a", "c", true, "c"},
		{"to empty", "c", "", true, ""},
		{"empty matches empty", "", "d", true, "d"},
	} {
		swapped, cur, err := c.CompareAndSet(bg, "lock", []byte(s.old), []byte(s.value))
		if err != nil || swapped != s.wantSwapped || string(cur) != s.wantCurrent {
			t.Errorf("%s: CompareAndSet(%q, %q) = %v, %q, %v; want %v, %q", s.name, s.old, s.value, swapped, cur, err, s.wantSwapped, s.wantCurrent)
		}
	}
}

func testBarrier(t *testing.T, r *rdzv) {
	done := make(chan error, 3)
	arrive := func(ctx context.Context, n int) {
		c := r.open(t)
		go func() { done <- c.Barrier(ctx, "init", n) }()
	}
	// One arrival gives up: it must not count.
	ctx, cancel := context.WithCancel(bg)
	arrive(ctx, 3)
	r.arrivals(t, "init", 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), `"init"`) {
		t.Fatalf("cancelled Barrier = %v, want the cancellation naming the barrier", err)
	}
	r.arrivals(t, "init", 0)
	arrive(bg, 3)
	arrive(bg, 3)
	r.arrivals(t, "init", 2)
	if len(done) != 0 {
		t.Fatal("barrier opened with 2 of 3 clients")
	}
	if err := r.open(t).Barrier(bg, "init", 4); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "others wait for 3") {
		t.Errorf("Barrier with another n = %v", err)
	}
	arrive(bg, 3)
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// The name starts over, with any n.
	arrive(bg, 2)
	arrive(bg, 2)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func testLimits(t *testing.T, r *rdzv) {
	c := r.open(t)
	long := strings.Repeat("k", MaxKey+1)
	if err := c.Set(bg, long, []byte("v")); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "set") {
		t.Errorf("Set of a long key = %v", err)
	}
	if err := c.Set(bg, "big", make([]byte, MaxValue+1)); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), `"big"`) {
		t.Errorf("Set of a large value = %v", err)
	}
	if err := c.Barrier(bg, "b", MaxBarrier+1); !errors.Is(err, ErrBadRequest) {
		t.Errorf("Barrier of too many = %v", err)
	}
	if _, err := c.Get(bg, ""); !errors.Is(err, ErrBadRequest) {
		t.Errorf("Get of an empty key = %v", err)
	}
}

// TestRoundContract: the round gives ranks in the job's node order to
// nodes that join in any order, one of them late; waiting for it names it;
// an unknown or second join of a name is refused.
func TestRoundContract(t *testing.T) {
	nodes := []string{"node-a", "node-b", "node-c"}
	backends(t, nodes, func(t *testing.T, r *rdzv) {
		results := map[string]chan joinResult{}
		join := func(name string) {
			c := r.open(t)
			out := make(chan joinResult, 1)
			results[name] = out
			go func() {
				rd, err := c.Join(bg, name, map[string]any{"hostname": name, "cpus": 4, "gpu": "none"})
				out <- joinResult{rd, err}
			}()
		}
		join("node-c")
		join("node-a")
		r.joined(t, 2)
		ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
		defer cancel()
		_, err := r.waitRound(ctx)
		var re *RoundError
		if !errors.As(err, &re) || strings.Join(re.Missing, ",") != "node-b" || !strings.Contains(err.Error(), "missing node-b") {
			t.Fatalf("WaitRound without node-b = %v, want a *RoundError naming node-b", err)
		}
		if _, err := r.open(t).Join(bg, "node-z", Facts{}); !errors.Is(err, ErrUnknownNode) || !strings.Contains(err.Error(), `unknown node "node-z": this job expects node-a, node-b, node-c`) {
			t.Errorf("Join of an unknown name = %v", err)
		}
		if _, err := r.open(t).Join(bg, "node-a", Facts{}); !errors.Is(err, ErrDuplicateNode) || !strings.Contains(err.Error(), "node node-a already joined") {
			t.Errorf("second Join of node-a = %v", err)
		}
		join("node-b") // late
		members, err := r.waitRound(bg)
		if err != nil {
			t.Fatal(err)
		}
		for i, name := range nodes {
			res := <-results[name]
			if res.err != nil {
				t.Fatalf("%s: %v", name, res.err)
			}
			if res.round.Rank != i || len(res.round.Members) != 3 {
				t.Fatalf("%s got rank %d of %d members, want %d of 3", name, res.round.Rank, len(res.round.Members), i)
			}
			f, err := res.round.Members[i].HostFacts()
			if m := members[i]; m.Name != name || m.Rank != i || err != nil || f.Hostname != name || !strings.Contains(string(m.Facts), `"gpu":"none"`) || m.Addr != "127.0.0.1" {
				t.Errorf("member %d = %+v (%v), want %s from 127.0.0.1 with its facts", i, m, err, name)
			}
		}
	})
}
