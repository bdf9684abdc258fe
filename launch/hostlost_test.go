package launch

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
)

// TestHostLostCountsEveryLossOnce: gtrain_host_lost_total counts a host
// lost in a job that is not elastic, every time, and in an elastic job the
// loss and the drop that follows it once; a drop with no loss (a hang
// blamed on the host, too many failures) counts too.
func TestHostLostCountsEveryLossOnce(t *testing.T) {
	e, err := ServeMetrics("127.0.0.1:0", "run-1", "dp 2", []status.RankInfo{{Rank: 0, Host: "w0"}, {Rank: 1, Host: "w1", Node: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	host := func(typ, name, why string) proto.Event {
		return proto.Event{V: 1, Type: typ, Host: name, Node: -1, Rank: -1, Message: why}
	}
	steps := []struct {
		ev     proto.Event
		w0, w1 float64
	}{
		{proto.Event{V: 1, Type: proto.EventAttempt, Rank: -1, Attempt: 0, World: 2}, 0, 0},
		{host(proto.EventHostLost, "w1", "no heartbeat for 25s"), 0, 1}, // not elastic: no drop follows
		{proto.Event{V: 1, Type: proto.EventAttempt, Rank: -1, Attempt: 1, World: 2}, 0, 1},
		{host(proto.EventHostLost, "w1", "agent exited before its ranks finished"), 0, 2},
		{host(proto.EventHostDropped, "w1", "dropped from the next attempt: agent lost: ..."), 0, 2}, // the same loss
		{proto.Event{V: 1, Type: proto.EventAttempt, Rank: -1, Attempt: 2, World: 1}, 0, 2},
		{host(proto.EventHostDropped, "w1", "dropped from the next attempt: hang: ..."), 0, 3},
		{host(proto.EventHostDropped, "w0", "excluded for the rest of the job: 3 failures"), 1, 3},
	}
	for i, s := range steps {
		e.Event(s.ev)
		m := scrape(t, e)
		if s.w0 > 0 {
			if got := value(t, m, "gtrain_host_lost_total", map[string]string{"host": "w0"}); got != s.w0 {
				t.Errorf("after event %d (%s %s): w0 lost %v, want %v", i, s.ev.Type, s.ev.Host, got, s.w0)
			}
		}
		if s.w1 > 0 {
			if got := value(t, m, "gtrain_host_lost_total", map[string]string{"host": "w1"}); got != s.w1 {
				t.Errorf("after event %d (%s %s): w1 lost %v, want %v", i, s.ev.Type, s.ev.Host, got, s.w1)
			}
		}
	}
	// Attempt 2 runs one rank: rank 1 is gone from the rank series.
	for _, s := range scrape(t, e)["gtrain_rank_state"] {
		if s.Metric["rank"] != "0" {
			t.Errorf("after a restart on one rank: %v", s.Metric)
		}
	}
}

// TestRunSilentAgentAnnouncesLost: in a job that is not elastic, an agent
// that falls silent makes one host_lost event naming its host and why,
// after the attempt event with the job's world; the exporter fed the same
// events counts the loss once.
func TestRunSilentAgentAnnouncesLost(t *testing.T) {
	rec := &recorder{}
	synctest.Test(t, func(t *testing.T) {
		tr := &fakeTransport{}
		p := fakeJob(t, 2)
		errc := make(chan error, 1)
		go func() {
			errc <- Run(t.Context(), p, Runtime{Transport: tr, View: rec, AgentGrace: time.Second})
		}()
		synctest.Wait()
		tr.conns[1].send(proto.EventHeartbeat, -1, 0) // node 1 is up, then silent
		stopBeat := make(chan struct{})
		go tr.conns[0].beatUntil(stopBeat) // node 1 says nothing more
		go func() {
			<-tr.conns[0].cmds
			close(stopBeat)
			tr.conns[0].send(proto.EventDone, -1, 0)
			tr.conns[0].Kill()
		}()
		var lost *AgentLostError
		if err := <-errc; !errors.As(err, &lost) || lost.Node != 1 {
			t.Fatalf("Run error = %v, want node 1 lost", err)
		}
	})
	if at := rec.ofType(proto.EventAttempt); len(at) != 1 || at[0].Attempt != 0 || at[0].World != 2 {
		t.Errorf("attempt events %+v, want attempt 0 of 2 ranks", at)
	}
	lost := rec.ofType(proto.EventHostLost)
	if len(lost) != 1 || lost[0].Host != "worker-1" || !strings.Contains(lost[0].Message, "no heartbeat") {
		t.Fatalf("host_lost events %+v, want one for worker-1 saying no heartbeat", lost)
	}
	e, err := ServeMetrics("127.0.0.1:0", "run-1", "command", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, ev := range rec.events {
		e.Event(ev)
	}
	if got := value(t, scrape(t, e), "gtrain_host_lost_total", map[string]string{"host": "worker-1"}); got != 1 {
		t.Errorf("gtrain_host_lost_total{host=worker-1} = %v, want 1", got)
	}
}

// TestJoinTimeoutAnnouncesEachMissingHost: the hosts whose agents never
// joined are each lost, by name; the one that joined is not.
func TestJoinTimeoutAnnouncesEachMissingHost(t *testing.T) {
	rec := &recorder{}
	synctest.Test(t, func(t *testing.T) {
		tr := &fakeTransport{}
		p := fakeJob(t, 3)
		errc := make(chan error, 1)
		go func() {
			errc <- Run(t.Context(), p, Runtime{Transport: tr, View: rec, AgentGrace: time.Second, JoinTimeout: 2 * time.Second}) // before the 5 s silence limit
		}()
		synctest.Wait()
		tr.conns[1].send(proto.EventJoined, -1, 0)
		go func() { // the agent that joined obeys the stop
			<-tr.conns[1].cmds
			tr.conns[1].send(proto.EventDone, -1, 0)
			tr.conns[1].Kill()
		}()
		var lost *AgentLostError
		if err := <-errc; !errors.As(err, &lost) || !strings.Contains(err.Error(), "did not join") {
			t.Fatalf("Run error = %v, want agents that did not join", err)
		}
	})
	var hosts []string
	for _, ev := range rec.ofType(proto.EventHostLost) {
		hosts = append(hosts, ev.Host)
	}
	if strings.Join(hosts, " ") != "worker-0 worker-2" {
		t.Errorf("host_lost for %q, want worker-0 and worker-2", hosts)
	}
}
