package enginejob

import (
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/launch/proto"
)

// The test binary doubles as `gtrain agent` when GTRAIN_TEST_AGENT=1, so
// that launch.Local runs the real agent (its detection, its join) in a
// child process.
func TestMain(m *testing.M) {
	if os.Getenv("GTRAIN_TEST_AGENT") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		err := launch.RunAgent(ctx, os.Stdin, os.Stdout, "test")
		stop()
		if err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// lessMemory is a transport whose agent of node reports memBytes of
// memory in its joined event: the facts changed on their way to the
// launcher, as a host with less memory would report them.
type lessMemory struct {
	launch.Transport
	node     int
	memBytes int64
}

func (t lessMemory) Start(ctx context.Context, h launch.Host, asg *proto.Assignment) (launch.AgentConn, error) {
	c, err := t.Transport.Start(ctx, h, asg)
	if err != nil || h.Node != t.node {
		return c, err
	}
	return &shrunkConn{AgentConn: c, memBytes: t.memBytes}, nil
}

type shrunkConn struct {
	launch.AgentConn
	memBytes int64
}

func (c *shrunkConn) Recv() (proto.Event, error) {
	ev, err := c.AgentConn.Recv()
	if err == nil && ev.Type == proto.EventJoined && ev.Facts != nil && ev.Facts.Host != nil {
		h := *ev.Facts.Host
		h.NUMA = []hostinfo.NUMANode{{ID: 0, CPUs: h.CPU.Online, MemoryBytes: c.memBytes}}
		h.Cgroup.MemoryBytes = 0
		ev.Facts.Host = &h
	}
	return ev, err
}

// specView keeps the spec rank 0 printed and the launcher's notices.
type specView struct {
	mu      sync.Mutex
	spec    string
	notices []string
}

func (v *specView) Event(ev proto.Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case ev.Type == proto.EventLog && ev.Rank == 0:
		v.spec += ev.Line
	case ev.Type == proto.EventNotice:
		v.notices = append(v.notices, ev.Message)
	}
}

func (v *specView) Close() error { return nil }

// runAutoJob runs a job of two agents on this machine, planned with --auto
// from what they reported, its ranks printing the spec they got; transport
// wraps the local one. It returns rank 0's spec and the notices.
func runAutoJob(t *testing.T, transport func(launch.Transport) launch.Transport) (train.Spec, []string) {
	t.Helper()
	t.Setenv("GTRAIN_TEST_AGENT", "1")
	spec := train.DefaultSpec()
	spec.Model.Preset = "gpt2"
	spec.Batch.MicroBatch, spec.Batch.GradAccum = 8, 1
	j := &Job{Spec: spec}
	nodes := []hostfiles.Node{
		{Host: hostfiles.Host{Name: "127.0.0.1", Slots: 1}, SlotIDs: []int{0}},
		{Host: hostfiles.Host{Name: "localhost", Slots: 1}, SlotIDs: []int{0}},
	}
	p, err := launch.NewJob(launch.JobOptions{Nodes: nodes, Command: []string{"sh", "-c", `printf '%s\n' "$` + rankenv.JobSpec + `"`},
		Grace: 5 * time.Second, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	v := &specView{}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	rt := launch.Runtime{Transport: transport(&launch.Local{Exe: os.Args[0]}), View: v,
		Plan: j.Planner(PlanOptions{Auto: true, Line: func(train.AutoChoice) string { return "planned" }})}
	if err := launch.Run(ctx, p, rt); err != nil {
		t.Fatalf("job: %v; notices %q", err, v.notices)
	}
	var got train.Spec
	if err := json.Unmarshal([]byte(v.spec), &got); err != nil {
		t.Fatalf("rank 0's spec %q: %v; notices %q", v.spec, err, v.notices)
	}
	return got, v.notices
}

// TestAutoPlansFromReportedFacts: run --auto on a hostfile's hosts plans
// from what their agents reported once they joined: when one host reports
// far less memory, the layout the ranks get changes (planned for the
// weakest host, with the planner's warning) and keeps the global batch.
func TestAutoPlansFromReportedFacts(t *testing.T) {
	same := func(tr launch.Transport) launch.Transport { return tr }
	small := func(tr launch.Transport) launch.Transport {
		return lessMemory{Transport: tr, node: 1, memBytes: 3 << 30}
	}
	eq, eqNotes := runAutoJob(t, same)
	sm, smNotes := runAutoJob(t, small)
	for _, s := range []train.Spec{eq, sm} {
		if b, p := s.Batch, s.Parallel; b.MicroBatch*b.GradAccum*p.DP != 16 || p.TP*p.PP*p.DP != 2 {
			t.Errorf("micro_batch %d × grad_accum %d × dp %d on tp %d × pp %d: want the global batch of 16 on 2 ranks", b.MicroBatch, b.GradAccum, p.DP, p.TP, p.PP)
		}
	}
	if !strings.Contains(strings.Join(eqNotes, "\n"), "from the hosts' reported facts: planned") {
		t.Errorf("notices %q: want the plan's line", eqNotes)
	}
	if !strings.Contains(strings.Join(smNotes, "\n"), "hosts differ in memory or CPUs") {
		t.Errorf("notices %q: want the planner's warning about the smaller host", smNotes)
	}
	ep, sp := eq.Parallel, sm.Parallel
	t.Logf("this machine's plan: %+v zero %d recompute %s; with 3 GiB: %+v zero %d recompute %s", eq.Batch, ep.ZeroStage, eq.Recompute, sm.Batch, sp.ZeroStage, sm.Recompute)
	if eq.Batch == sm.Batch && ep.TP == sp.TP && ep.PP == sp.PP && ep.ZeroStage == sp.ZeroStage && eq.Recompute == sm.Recompute {
		t.Errorf("a host reporting 3 GiB got the plan of this machine's: %+v %+v recompute %s", sm.Batch, sp, sm.Recompute)
	}
}
