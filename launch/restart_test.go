package launch

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
)

// scriptedTransport starts agents that play back, for each attempt, the
// events script gives them and then end; it records when each attempt
// started.
type scriptedTransport struct {
	script func(node, attempt int) []proto.Event

	mu     sync.Mutex
	starts []time.Time // when node 0's agent of each attempt started
}

// offline: these agents join no rendezvous (see usesRendezvous).
func (s *scriptedTransport) offline() {}

func (s *scriptedTransport) Start(_ context.Context, h Host, asg *proto.Assignment) (AgentConn, error) {
	if h.Node == 0 {
		s.mu.Lock()
		s.starts = append(s.starts, time.Now())
		s.mu.Unlock()
	}
	c := &scriptedConn{events: s.script(h.Node, asg.Attempt)}
	return c, nil
}

func (s *scriptedTransport) attempts() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.starts...)
}

// scriptedConn hands out its events, then io.EOF.
type scriptedConn struct {
	mu     sync.Mutex
	events []proto.Event
}

func (c *scriptedConn) Recv() (proto.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.events) == 0 {
		return proto.Event{}, io.EOF
	}
	ev := c.events[0]
	c.events = c.events[1:]
	return ev, nil
}

func (c *scriptedConn) Send(proto.Command) error { return nil }
func (c *scriptedConn) Kill() error              { return nil }
func (c *scriptedConn) Close() error             { return nil }
func (c *scriptedConn) Stderr() string           { return "" }

func exited(node, rank, code int) proto.Event {
	return proto.Event{V: proto.Version, Type: proto.EventRankExited, Time: time.Now(), Host: "worker-" + string(rune('0'+node)), Node: node, Rank: rank, Code: code}
}

func done(node int) proto.Event {
	return proto.Event{V: proto.Version, Type: proto.EventDone, Node: node, Rank: -1}
}

// alwaysFails is a one-host job whose rank exits 1 in every attempt.
func alwaysFails(node, _ int) []proto.Event { return []proto.Event{exited(node, node, 1), done(node)} }

// TestRestartBackoff: restarts wait 1s, 2s, 4s, ... up to 30s, so a job
// that fails at once does not spin; each wait is announced.
func TestRestartBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &scriptedTransport{script: alwaysFails}
		p := fakeJob(t, 1)
		p.MaxRestarts = 8
		rec := &recorder{}
		err := Run(t.Context(), p, Runtime{Transport: tr, View: rec})
		var rf *RankFailedError
		if !errors.As(err, &rf) || rf.Code != 1 {
			t.Fatalf("Run error = %v, want the rank's failure after the last restart", err)
		}
		starts := tr.attempts()
		if len(starts) != 9 {
			t.Fatalf("%d attempts, want 9", len(starts))
		}
		want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
		for i, w := range want {
			if got := starts[i+1].Sub(starts[i]); got != w*time.Second {
				t.Errorf("wait before restart %d = %v, want %v", i+1, got, w*time.Second)
			}
		}
		var announced int
		for _, ev := range rec.ofType(proto.EventNotice) {
			if strings.Contains(ev.Message, "restarting the job in ") {
				announced++
			}
		}
		if announced != len(want) {
			t.Errorf("%d restart notices, want %d", announced, len(want))
		}
	})
}

// TestRestartWaitInterrupted: a signal during the wait before a restart ends
// the job at once with the interrupt, without another attempt.
func TestRestartWaitInterrupted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &scriptedTransport{script: alwaysFails}
		p := fakeJob(t, 1)
		p.MaxRestarts = 1000000000
		ctx, cancel := context.WithCancelCause(t.Context())
		errc := make(chan error, 1)
		go func() {
			errc <- Run(ctx, p, Runtime{Transport: tr, View: &recorder{}, RestartWait: time.Minute})
		}()
		synctest.Wait() // the first attempt failed; Run waits a minute
		if n := len(tr.attempts()); n != 1 {
			t.Fatalf("%d attempts before the wait, want 1", n)
		}
		start := time.Now()
		cancel(&InterruptedError{Signal: syscall.SIGINT})
		err := <-errc
		var ie *InterruptedError
		if !errors.As(err, &ie) {
			t.Fatalf("Run error = %v, want the interrupt", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("Run returned %v after the interrupt, want at once", d)
		}
		if n := len(tr.attempts()); n != 1 {
			t.Errorf("%d attempts, want no restart after the interrupt", n)
		}
	})
}

// TestRestartAfterLostAgent: an agent that ends before its ranks did is a
// failure that restarts the job like a rank failure; without restarts left
// it is the job's error.
func TestRestartAfterLostAgent(t *testing.T) {
	lostFirst := func(node, attempt int) []proto.Event {
		if attempt == 0 {
			return nil // the agent's stream ends at once: lost
		}
		return []proto.Event{exited(node, node, 0), done(node)}
	}
	for _, restarts := range []int{0, 1} {
		t.Run("max-restarts="+string(rune('0'+restarts)), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := &scriptedTransport{script: lostFirst}
				p := fakeJob(t, 1)
				p.MaxRestarts = restarts
				err := Run(t.Context(), p, Runtime{Transport: tr, View: &recorder{}})
				var lost *AgentLostError
				switch {
				case restarts == 0 && !errors.As(err, &lost):
					t.Fatalf("Run error = %v, want the agent lost", err)
				case restarts == 1 && err != nil:
					t.Fatalf("Run error = %v, want success after a restart", err)
				}
				if n := len(tr.attempts()); n != restarts+1 {
					t.Errorf("%d attempts, want %d", n, restarts+1)
				}
			})
		})
	}
}
