package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/launch/proto"
)

// fate is what a host's agent does in one attempt: end its stream right
// after joining (lost), or run its rank to the exit code.
type fate struct {
	lost bool
	code int
}

// elasticTransport starts scripted agents (one rank each) whose fate
// depends on the host and the attempt, and records each attempt's hosts,
// WORLD_SIZE and the start command's variables.
type elasticTransport struct {
	fate  func(host string, attempt int) fate
	down  func(host string) bool // the host does not answer a probe
	mu    sync.Mutex
	hosts map[int][]string // attempt → its hosts, in node order
	world map[int]string   // attempt → WORLD_SIZE its ranks got
	start map[int][]string // attempt → the start command's variables
	probe []string         // the hosts probed, in order
}

func (e *elasticTransport) offline() {}

func (e *elasticTransport) Start(_ context.Context, h Host, asg *proto.Assignment) (AgentConn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.hosts == nil {
		e.hosts, e.world, e.start = map[int][]string{}, map[int]string{}, map[int][]string{}
	}
	hs := e.hosts[asg.Attempt]
	for len(hs) <= h.Node {
		hs = append(hs, "")
	}
	hs[h.Node] = h.Name
	e.hosts[asg.Attempt] = hs
	for _, kv := range asg.Ranks[0].Env {
		if v, ok := strings.CutPrefix(kv, "WORLD_SIZE="); ok {
			e.world[asg.Attempt] = v
		}
	}
	c := &gatedConn{host: h.Name, node: h.Node, rank: asg.Ranks[0].Rank, fate: e.fate(h.Name, asg.Attempt),
		cmds: make(chan proto.Command, 8)}
	c.onStart = func(env []string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.start[asg.Attempt] = env
	}
	return c, nil
}

func (e *elasticTransport) Probe(_ context.Context, h Host) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.probe = append(e.probe, h.Name)
	if e.down != nil && e.down(h.Name) {
		return errors.New("connection timed out")
	}
	return nil
}

// attemptHosts is each attempt's hosts joined by commas.
func (e *elasticTransport) attemptHosts() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, len(e.hosts))
	for n, hs := range e.hosts {
		out[n] = strings.Join(hs, ",")
	}
	return out
}

// gatedConn joins, then waits for a command: on start its rank runs to
// its fate; on stop or kill it ends. A lost one ends right after joining.
type gatedConn struct {
	host    string
	node    int
	rank    int
	fate    fate
	cmds    chan proto.Command
	onStart func([]string)
	queue   []proto.Event
	step    int
}

func (c *gatedConn) ev(typ string) proto.Event {
	return proto.Event{V: proto.Version, Type: typ, Time: time.Now(), Host: c.host, Node: c.node, Rank: -1}
}

func (c *gatedConn) Recv() (proto.Event, error) {
	if len(c.queue) > 0 {
		ev := c.queue[0]
		c.queue = c.queue[1:]
		return ev, nil
	}
	c.step++
	switch {
	case c.step == 1:
		return c.ev(proto.EventJoined), nil
	case c.step > 2 || c.fate.lost:
		return proto.Event{}, io.EOF
	}
	cmd := <-c.cmds
	if cmd.Type == proto.CommandStart {
		c.onStart(cmd.Env)
		ex := c.ev(proto.EventRankExited)
		ex.Rank, ex.Code = c.rank, c.fate.code
		c.queue = append(c.queue, ex)
	}
	c.queue = append(c.queue, c.ev(proto.EventDone))
	return c.Recv()
}

func (c *gatedConn) Send(cmd proto.Command) error {
	switch cmd.Type {
	case proto.CommandStart, proto.CommandStop, proto.CommandKill:
		select {
		case c.cmds <- cmd:
		default:
		}
	}
	return nil
}

func (c *gatedConn) Kill() error    { return c.Send(proto.Command{Type: proto.CommandKill}) }
func (c *gatedConn) Close() error   { return nil }
func (c *gatedConn) Stderr() string { return "" }

// elasticJob is a job of hosts w0, w1, ... (one rank each) under
// --nnodes lo:hi.
func elasticJob(t *testing.T, hosts, lo, hi, maxFails, restarts int) *Job {
	t.Helper()
	var nodes []hostfiles.Node
	for i := range hosts {
		nodes = append(nodes, hostfiles.Node{Host: hostfiles.Host{Name: fmt.Sprintf("w%d", i), Slots: 1}, SlotIDs: []int{0}})
	}
	start, e, err := elasticNodes(nodes, lo, hi, maxFails)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewJob(JobOptions{Nodes: start, Command: []string{"x"}, MasterPort: 1, Grace: time.Second,
		Heartbeat: time.Second, Getenv: noEnv, MaxRestarts: restarts})
	if err != nil {
		t.Fatal(err)
	}
	p.Elastic = e
	return p
}

// hostEvents are the host_dropped and host_added events, "type host: why".
func hostEvents(rec *recorder) []string {
	var out []string
	for _, typ := range []string{proto.EventHostDropped, proto.EventHostAdded} {
		for _, ev := range rec.ofType(typ) {
			out = append(out, typ+" "+ev.Host+": "+ev.Message)
		}
	}
	return out
}

// TestElasticMembership: after each failure the next attempt runs on the
// hosts the rules leave: a lost host sits out, a spare comes in, a host
// that failed --max-host-failures times is out for good, a lost host that
// answers again rejoins, and a job left with fewer than MIN fails naming
// the hosts lost and why.
func TestElasticMembership(t *testing.T) {
	lostIn := func(host string, attempt int) func(string, int) fate {
		return func(h string, n int) fate { return fate{lost: h == host && n == attempt} }
	}
	tests := []struct {
		name                          string
		hosts, lo, hi, maxF, restarts int
		fate                          func(string, int) fate
		down                          func(string) bool
		attempts                      []string // hosts of each attempt
		events                        []string // substrings of the host events, in order
		errWant                       string   // "" = success
	}{{
		name: "lost host: go on with the rest", hosts: 3, lo: 2, hi: 3, restarts: 1,
		fate: lostIn("w1", 0), attempts: []string{"w0,w1,w2", "w0,w2"},
		events: []string{"host_dropped w1: dropped from the next attempt: agent lost"},
	}, {
		name: "a spare replaces a lost host", hosts: 4, lo: 2, hi: 3, restarts: 1,
		fate: lostIn("w1", 0), attempts: []string{"w0,w1,w2", "w0,w2,w3"},
		events: []string{"host_dropped w1: dropped", "host_added w3: joins attempt 1: a spare"},
	}, {
		name: "a lost host that answers again rejoins later", hosts: 3, lo: 2, hi: 3, restarts: 2,
		fate: func(h string, n int) fate {
			switch {
			case h == "w1" && n == 0:
				return fate{lost: true}
			case h == "w0" && n == 1:
				return fate{code: 1}
			}
			return fate{}
		},
		attempts: []string{"w0,w1,w2", "w0,w2", "w0,w1,w2"},
		events:   []string{"host_dropped w1: dropped", "host_added w1: joins attempt 2: reachable again"},
	}, {
		name: "excluded after max-host-failures", hosts: 3, lo: 2, hi: 2, maxF: 2, restarts: 3,
		fate:     func(h string, n int) fate { return fate{code: map[bool]int{true: 1}[h == "w1"]} },
		attempts: []string{"w0,w1", "w0,w1", "w0,w2"},
		events:   []string{"host_dropped w1: excluded for the rest of the job: 2 failures (--max-host-failures 2), the last: rank 1 on w1 exited with code 1", "host_added w2: joins attempt 2: a spare"},
	}, {
		name: "lost host taken back when MIN needs it and it answers", hosts: 2, lo: 2, hi: 2, restarts: 1,
		fate: lostIn("w1", 0), attempts: []string{"w0,w1", "w0,w1"},
		events: []string{"host_dropped w1: dropped"},
	}, {
		name: "MIN not met", hosts: 3, lo: 2, hi: 3, restarts: 3,
		fate:     func(h string, n int) fate { return fate{lost: h != "w0" && n == 0} },
		down:     func(h string) bool { return h != "w0" },
		attempts: []string{"w0,w1,w2"},
		events:   []string{"host_dropped w1: dropped", "host_dropped w2: dropped"},
		errWant:  "launch: elastic: 1 healthy host(s) left, fewer than the --nnodes minimum 2; lost: w1 (unreachable after 1 failure(s): agent lost: agent exited before its ranks finished); w2 (unreachable",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := &elasticTransport{fate: tt.fate, down: tt.down}
				rec := &recorder{}
				err := Run(t.Context(), elasticJob(t, tt.hosts, tt.lo, tt.hi, tt.maxF, tt.restarts), Runtime{Transport: tr, View: rec})
				switch {
				case tt.errWant == "" && err != nil:
					t.Fatalf("Run error = %v, want success", err)
				case tt.errWant != "" && (err == nil || !strings.Contains(err.Error(), tt.errWant)):
					t.Fatalf("Run error = %v, want one containing %q", err, tt.errWant)
				}
				if got := tr.attemptHosts(); !slices.Equal(got, tt.attempts) {
					t.Errorf("attempts ran on %q, want %q", got, tt.attempts)
				}
				got := hostEvents(rec)
				if len(got) != len(tt.events) {
					t.Fatalf("host events %q, want %d like %q", got, len(tt.events), tt.events)
				}
				for i, w := range tt.events {
					if !strings.Contains(got[i], w) {
						t.Errorf("host event %d = %q, want it to contain %q", i, got[i], w)
					}
				}
			})
		})
	}
}

// TestElasticNewWorld: an attempt on fewer hosts (w2 excluded after one
// failure, --max-host-failures 1) gives its ranks the new
// WORLD_SIZE, and the plan hook sees that world and its variables reach
// every rank through the start command.
func TestElasticNewWorld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fails := func(h string, n int) fate { return fate{code: map[bool]int{true: 1}[h == "w2" && n == 0]} }
		tr := &elasticTransport{fate: fails}
		var worlds []World
		plan := func(_ context.Context, w World) (Planned, error) {
			worlds = append(worlds, w)
			return Planned{Env: []string{fmt.Sprintf("PLANNED=%d", w.Size)}, Notes: []string{"planned"}}, nil
		}
		rec := &recorder{}
		if err := Run(t.Context(), elasticJob(t, 3, 2, 3, 1, 1), Runtime{Transport: tr, View: rec, Plan: plan}); err != nil {
			t.Fatal(err)
		}
		if len(worlds) != 2 || worlds[0].Size != 3 || worlds[1].Size != 2 || worlds[1].Attempt != 1 ||
			!slices.Equal(worlds[1].Slots, []int{1, 1}) || worlds[1].Hosts[1].Name != "w1" {
			t.Errorf("plan saw %+v, want attempts 0 on 3 ranks and 1 on w0,w1", worlds)
		}
		if tr.world[0] != "3" || tr.world[1] != "2" {
			t.Errorf("WORLD_SIZE %q then %q, want 3 then 2", tr.world[0], tr.world[1])
		}
		if !slices.Contains(tr.start[1], "PLANNED=2") {
			t.Errorf("attempt 1's start carried %q, want PLANNED=2", tr.start[1])
		}
	})
}

// TestElasticPlanError: a plan that fails ends the job with its error and
// starts no rank.
func TestElasticPlanError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &elasticTransport{fate: func(string, int) fate { return fate{} }}
		plan := func(context.Context, World) (Planned, error) { return Planned{}, errors.New("no layout fits") }
		p := elasticJob(t, 2, 1, 2, 0, 3)
		err := Run(t.Context(), p, Runtime{Transport: tr, View: &recorder{}, Plan: plan})
		if err == nil || err.Error() != "no layout fits" {
			t.Fatalf("Run error = %v, want the plan's", err)
		}
		if len(tr.start) != 0 || len(tr.attemptHosts()) != 1 {
			t.Errorf("started %v in %d attempts, want no start and no restart", tr.start, len(tr.attemptHosts()))
		}
	})
}

// TestParseNNodes: torchrun's spellings, and refusals naming the flag.
func TestParseNNodes(t *testing.T) {
	for in, want := range map[string][2]int{"3": {3, 3}, "2:4": {2, 4}, "1:1": {1, 1}} {
		lo, hi, err := ParseNNodes(in)
		if err != nil || lo != want[0] || hi != want[1] {
			t.Errorf("ParseNNodes(%q) = %d, %d, %v; want %v", in, lo, hi, err, want)
		}
	}
	for _, in := range []string{"", "0", "3:2", "a:b", "2:", ":2", "1:99999999", "-1:2", " 2", "+2"} {
		if _, _, err := ParseNNodes(in); err == nil || !strings.Contains(err.Error(), "--nnodes") {
			t.Errorf("ParseNNodes(%q) error = %v, want a refusal naming --nnodes", in, err)
		}
	}
}

// TestRestartJitter: a wait with jitter is the exponential one plus at
// most the fraction asked, never less.
func TestRestartJitter(t *testing.T) {
	rt := Runtime{RestartJitter: 0.1}
	rt.setDefaults()
	for n := range 8 {
		base := (&Runtime{RestartWait: time.Second, RestartWaitMax: 30 * time.Second}).restartWait(n)
		for range 50 {
			if d := rt.restartWait(n); d < base || d > base+base/10 {
				t.Fatalf("restart %d waits %v, want %v to %v", n+1, d, base, base+base/10)
			}
		}
	}
}
