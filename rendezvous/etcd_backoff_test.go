package rendezvous

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/etcdtest"
)

// TestEtcdReconnectBackoffCapped: while etcd is away the client tries to
// reach it again at most a few seconds apart, however long the outage:
// a listener on etcd's port that takes each connection and drops it (so
// every try fails) sees no gap over 4 s in 20 s. With gRPC's default
// backoff the gaps grow past 5 s within that time (1, 1.6, 2.6, 4.1,
// 6.6 s, each ±20 %), and a node saw etcd back that much late.
func TestEtcdReconnectBackoffCapped(t *testing.T) {
	srv := etcdtest.Start(t)
	j := newEtcdJob(t, srv, 5*time.Second, "node-a")
	c := j.open(t, j.secret)
	srv.Stop(t)
	ln, err := net.Listen("tcp", srv.Endpoint)
	if err != nil {
		t.Fatalf("listen on etcd's port once it stopped: %v", err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var tries []time.Time
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			tries = append(tries, time.Now())
			mu.Unlock()
			nc.Close()
		}
	}()
	// A node keeps asking (beats) all along, as a node does.
	end := time.Now().Add(20 * time.Second)
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
		_, _ = c.Add(ctx, "beat", 1)
		cancel()
		<-ctx.Done()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tries) < 5 {
		t.Fatalf("the client tried to reach etcd %d times in 20 s, want at least 5", len(tries))
	}
	tries = append(tries, time.Now()) // a try that has not come counts too
	for i := 1; i < len(tries); i++ {
		if gap := tries[i].Sub(tries[i-1]); gap > 4*time.Second {
			t.Errorf("%d s into the outage the client waited %v before trying etcd again: want at most ~%v (etcdMaxBackoff)",
				int(tries[i-1].Sub(tries[0]).Seconds()), gap.Round(100*time.Millisecond), etcdMaxBackoff)
		}
	}
}
