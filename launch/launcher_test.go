package launch

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/launch/proto"
)

// fakeTransport hands out in-memory agents driven by the test.
type fakeTransport struct {
	mu    sync.Mutex
	conns []*fakeConn
}

// offline: these agents join no rendezvous (see usesRendezvous).
func (f *fakeTransport) offline() {}

func (f *fakeTransport) Start(_ context.Context, h Host, asg *proto.Assignment) (AgentConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &fakeConn{host: h.Name, node: h.Node, events: make(chan proto.Event, 16), gone: make(chan struct{}), cmds: make(chan proto.Command, 16)}
	for len(f.conns) <= h.Node {
		f.conns = append(f.conns, nil)
	}
	f.conns[h.Node] = c // agents start in parallel: index by node, not by call order
	return c, nil
}

// fakeConn is an agent whose events the test sends; it ends when killed or
// when the test ends its stream.
type fakeConn struct {
	host   string
	node   int
	events chan proto.Event
	cmds   chan proto.Command
	gone   chan struct{}
	once   sync.Once
}

// Recv drains events already sent before reporting the end, as a pipe would.
func (c *fakeConn) Recv() (proto.Event, error) {
	select {
	case ev := <-c.events:
		return ev, nil
	default:
	}
	select {
	case ev := <-c.events:
		return ev, nil
	case <-c.gone:
		return proto.Event{}, io.EOF
	}
}

// Send queues commands for the test, except the launcher's heartbeats, which
// these fake agents do not model.
func (c *fakeConn) Send(cmd proto.Command) error {
	if cmd.Type != proto.CommandHeartbeat {
		c.cmds <- cmd
	}
	return nil
}
func (c *fakeConn) Kill() error    { c.once.Do(func() { close(c.gone) }); return nil }
func (c *fakeConn) Close() error   { return c.Kill() }
func (c *fakeConn) Stderr() string { return "" }

func (c *fakeConn) send(typ string, rank, code int) {
	c.events <- proto.Event{V: proto.Version, Type: typ, Host: c.host, Node: c.node, Rank: rank, Code: code}
}

// beatUntil sends a heartbeat every second, as an agent at --heartbeat 1s
// (fakeJob's) does, until stop is closed.
func (c *fakeConn) beatUntil(stop <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			c.send(proto.EventHeartbeat, -1, 0)
		case <-stop:
			return
		}
	}
}

func fakeJob(t *testing.T, hosts int) *Job {
	t.Helper()
	var nodes []hostfiles.Node
	for i := range hosts {
		name := "worker-" + string(rune('0'+i))
		nodes = append(nodes, hostfiles.Node{Host: hostfiles.Host{Name: name, Slots: 1}, SlotIDs: []int{0}})
	}
	p, err := NewJob(JobOptions{Nodes: nodes, Command: []string{"x"}, MasterPort: 1, Grace: time.Second, Heartbeat: time.Second, Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunSilentAgentIsLost: an agent that stops talking (hung, or its network
// gone) fails the job after the silence limit instead of hanging it.
func TestRunSilentAgentIsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &fakeTransport{}
		p := fakeJob(t, 2)
		start := time.Now()
		errc := make(chan error, 1)
		go func() {
			errc <- Run(t.Context(), p, Runtime{Transport: tr, View: &recorder{}, AgentGrace: time.Second})
		}()
		synctest.Wait()
		// Node 0 keeps its heartbeat; node 1 beats once (its agent is
		// up), then says nothing.
		tr.conns[1].send(proto.EventHeartbeat, -1, 0)
		stopBeat := make(chan struct{})
		go tr.conns[0].beatUntil(stopBeat)
		go func() { // node 0 obeys a stop: its rank ends, then the agent
			<-tr.conns[0].cmds
			close(stopBeat)
			tr.conns[0].send(proto.EventDone, -1, 0)
			tr.conns[0].Kill()
		}()
		err := <-errc
		var lost *AgentLostError
		if !errors.As(err, &lost) || lost.Node != 1 || !strings.Contains(err.Error(), "no heartbeat") {
			t.Fatalf("Run error = %v, want node 1 lost for lack of heartbeat", err)
		}
		if d, limit := time.Since(start), SilentAfter(p.Heartbeat); d < limit || d > limit+2*time.Second {
			t.Errorf("lost after %v, want just after the %v silence limit", d, limit)
		}
	})
}

// TestRunUnheardAgentHasTheJoinTimeout: an agent that has said nothing
// at all yet (its process still starting on a loaded host) is not lost
// at the silence limit: it joins after 20 s and the job runs; one that
// never says anything is reported as not joined, at the join timeout.
func TestRunUnheardAgentHasTheJoinTimeout(t *testing.T) {
	const join = 40 * time.Second
	// start runs a job on 2 fake hosts of which node 0 joins and beats
	// until stop is closed.
	start := func(t *testing.T) (tr *fakeTransport, p *Job, errc chan error, stop chan struct{}) {
		tr, p, errc, stop = &fakeTransport{}, fakeJob(t, 2), make(chan error, 1), make(chan struct{})
		go func() {
			errc <- Run(t.Context(), p, Runtime{Transport: tr, View: &recorder{}, AgentGrace: time.Second, JoinTimeout: join})
		}()
		synctest.Wait()
		tr.conns[0].send(proto.EventJoined, -1, 0)
		go tr.conns[0].beatUntil(stop)
		return tr, p, errc, stop
	}
	t.Run("late", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr, p, errc, stop := start(t)
			late := 20 * time.Second
			if late <= SilentAfter(p.Heartbeat) || late >= join {
				t.Fatalf("the late join at %v is not between the silence limit %v and the join timeout %v", late, SilentAfter(p.Heartbeat), join)
			}
			time.Sleep(late)
			tr.conns[1].send(proto.EventJoined, -1, 0)
			go tr.conns[1].beatUntil(stop)
			var got []string
			for _, c := range tr.conns {
				got = append(got, (<-c.cmds).Type)
			}
			close(stop)
			for i, c := range tr.conns {
				c.send(proto.EventRankExited, i, 0)
				c.send(proto.EventDone, -1, 0)
				c.Kill()
			}
			err := <-errc
			if got[0] != proto.CommandStart || got[1] != proto.CommandStart || err != nil {
				t.Fatalf("agents got %q, Run error = %v; want start for both and success: node 1 joined within the join timeout", got, err)
			}
		})
	})
	t.Run("never", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			began := time.Now()
			tr, _, errc, stop := start(t)
			go func() { // node 0 obeys the stop
				<-tr.conns[0].cmds
				close(stop)
				tr.conns[0].send(proto.EventDone, -1, 0)
				tr.conns[0].Kill()
			}()
			err := <-errc
			var lost *AgentLostError
			if !errors.As(err, &lost) || lost.Host != "worker-1" || !strings.Contains(err.Error(), "did not join within 40s") {
				t.Fatalf("Run error = %v, want worker-1 not joined within %v", err, join)
			}
			if d := time.Since(began); d < join || d > join+2*time.Second {
				t.Errorf("reported after %v, want just after the join timeout %v", d, join)
			}
		})
	})
}

// TestRunFailureStopsOtherAgents: a rank failing on one host sends stop to the
// agents of the other hosts, and the failing rank is the one reported.
func TestRunFailureStopsOtherAgents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &fakeTransport{}
		p := fakeJob(t, 3)
		errc := make(chan error, 1)
		go func() { errc <- Run(t.Context(), p, Runtime{Transport: tr, View: &recorder{}}) }()
		synctest.Wait()
		tr.conns[1].send(proto.EventRankExited, 1, 6)
		synctest.Wait()
		for i, c := range tr.conns {
			select {
			case cmd := <-c.cmds:
				if cmd.Type != proto.CommandStop {
					t.Errorf("agent %d got %q, want stop", i, cmd.Type)
				}
			default:
				t.Errorf("agent %d got no stop", i)
			}
			if i != 1 {
				c.events <- proto.Event{V: proto.Version, Type: proto.EventRankExited, Node: i, Rank: i, Code: 143, Signal: "SIGTERM", Killed: true}
			}
			c.send(proto.EventDone, -1, 0)
			c.Kill()
		}
		var rf *RankFailedError
		if err := <-errc; !errors.As(err, &rf) || rf.Rank != 1 || rf.Code != 6 || rf.Host != "worker-1" {
			t.Fatalf("Run error = %v, want rank 1 on worker-1 with code 6", err)
		}
	})
}

// slowView is a view that takes a while over every log line, like a
// terminal that cannot keep up; shown, if set, hears how many lines it
// has shown.
type slowView struct {
	recorder
	delay time.Duration
	shown func(n int)
	n     int
}

func (v *slowView) Event(ev proto.Event) {
	if ev.Type != proto.EventLog {
		v.recorder.Event(ev)
		return
	}
	time.Sleep(v.delay)
	v.recorder.Event(ev)
	if v.n++; v.shown != nil {
		v.shown(v.n)
	}
}

// TestRunFloodDoesNotLoseAgents: one agent floods output faster than the
// view can show it, so the other agents' events wait in the launcher's
// queue behind the flood for longer than the silence limit: node 1's
// heartbeats, and node 2's end (its rank finished at once). Waiting events
// are life: no agent is declared lost, and the job succeeds.
func TestRunFloodDoesNotLoseAgents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &fakeTransport{}
		p := fakeJob(t, 3)
		limit := SilentAfter(p.Heartbeat)
		// 200 ms a line: the launcher's queue of 64 events takes 12.8 s to
		// drain, longer than the silence limit.
		view := &slowView{delay: 200 * time.Millisecond}
		if q := 64 * view.delay; q <= limit {
			t.Fatalf("queue delay %v does not exceed the silence limit %v: the test checks nothing", q, limit)
		}
		errc := make(chan error, 1)
		go func() {
			errc <- Run(t.Context(), p, Runtime{Transport: tr, View: view, AgentGrace: time.Second})
		}()
		synctest.Wait()
		for _, c := range tr.conns {
			c.send(proto.EventJoined, -1, 0)
		}
		const lines = 200
		// put gives up once the launcher has killed the agent, so that a
		// failing run ends the test instead of deadlocking it.
		put := func(c *fakeConn, typ string, rank int, line string) {
			select {
			case c.events <- proto.Event{V: proto.Version, Type: typ, Host: c.host, Node: c.node, Rank: rank, Line: line}:
			case <-c.gone:
			}
		}
		flooded := make(chan struct{})
		go func() { // node 0: a rank flooding its output, then done
			c := tr.conns[0]
			for range lines {
				put(c, proto.EventLog, 0, "flood")
			}
			close(flooded)
			put(c, proto.EventRankExited, 0, "")
			put(c, proto.EventDone, -1, "")
			c.Kill()
		}()
		go func() { // node 2: its rank ends at once
			c := tr.conns[2]
			put(c, proto.EventRankExited, 2, "")
			put(c, proto.EventDone, -1, "")
			c.Kill()
		}()
		go func() { // node 1: only heartbeats until the flood is over
			c := tr.conns[1]
			tick := time.NewTicker(p.Heartbeat)
			defer tick.Stop()
			for {
				select {
				case <-tick.C:
					put(c, proto.EventHeartbeat, -1, "")
				case <-flooded:
					put(c, proto.EventRankExited, 1, "")
					put(c, proto.EventDone, -1, "")
					c.Kill()
					return
				}
			}
		}()
		if err := <-errc; err != nil {
			t.Fatalf("Run error = %v, want success: no agent was silent", err)
		}
		if got := len(view.lines(0)); got != lines {
			t.Errorf("flood lines shown = %d, want %d", got, lines)
		}
	})
}

// TestCheckSilentAfterStall: when the launcher itself was held up past
// the silence limit, the first check after it does not judge the agents
// (their readers may not have run yet); the next one does.
func TestCheckSilentAfterStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &fakeTransport{}
		p := fakeJob(t, 1)
		c, _ := tr.Start(t.Context(), p.Hosts[0], nil)
		a := &attempt{p: p, view: &recorder{}, agents: []*agentState{{conn: c, lastSeen: time.Now()}}, lastCheck: time.Now()}
		time.Sleep(2 * SilentAfter(p.Heartbeat)) // the whole launcher stalled
		a.checkSilent(time.Now())
		if a.failure != nil {
			t.Fatalf("first check after a stall failed the job: %v", a.failure)
		}
		time.Sleep(p.Heartbeat)
		a.checkSilent(time.Now())
		var lost *AgentLostError
		if !errors.As(a.failure, &lost) {
			t.Fatalf("second check: failure = %v, want the silent agent lost", a.failure)
		}
	})
}
