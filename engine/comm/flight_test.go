package comm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm/commtest"
	"github.com/gtrain/gtrain/internal/flightrec"
)

// opNames returns the ops of g as "name#seq state".
func opNames(g flightrec.Group) []string {
	var out []string
	for _, op := range g.Ops {
		out = append(out, op.Op+"#"+strconv.FormatUint(op.Seq, 10)+" "+string(op.State))
	}
	return out
}

// TestFlightRecordOps: collectives, a named group and point-to-point
// messages are recorded in order, with their sizes, peers and world ranks.
func TestFlightRecordOps(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 4, Options{Name: "world"})
	subs := make([]*Communicator, 4)
	commtest.Must(t, 4, nil, func(r int) error {
		c := comms[r]
		buf := NewBuffer(Float32, 10)
		if err := c.AllReduce(ctx, buf, Sum); err != nil {
			return err
		}
		sub, err := c.SplitNamed(ctx, "dp", r%2, r)
		if err != nil {
			return err
		}
		subs[r] = sub
		if r%2 == 0 { // dp group of ranks 0 and 2: a message from 0 to 2
			if sub.Rank() == 0 {
				return sub.Send(ctx, NewBuffer(BFloat16, 3), 1)
			}
			return sub.Recv(ctx, NewBuffer(BFloat16, 3), 0)
		}
		return sub.Barrier(ctx)
	})
	t.Cleanup(func() {
		for _, s := range subs {
			s.Close()
		}
	})
	w := comms[2].FlightRecord()
	if want := []string{"all_reduce#0 done", "split#1 done"}; !slices.Equal(opNames(w), want) {
		t.Errorf("world ops %v, want %v", opNames(w), want)
	}
	if w.Name != "world" || w.Rank != 2 || !slices.Equal(w.Ranks, []int{0, 1, 2, 3}) {
		t.Errorf("world group %q rank %d ranks %v", w.Name, w.Rank, w.Ranks)
	}
	if op := w.Ops[0]; op.Bytes != 40 || op.Count != 10 || op.DType != "f32" || op.P2P || op.To != -1 || op.From != -1 ||
		op.End.Before(op.Start) {
		t.Errorf("all_reduce recorded as %+v", op)
	}
	g := subs[2].FlightRecord()
	if g.Name != "dp" || g.Rank != 1 || !slices.Equal(g.Ranks, []int{0, 2}) {
		t.Errorf("dp group %q rank %d ranks %v, want dp, 1, [0 2]", g.Name, g.Rank, g.Ranks)
	}
	if len(g.Ops) != 1 {
		t.Fatalf("dp ops %v, want one recv", opNames(g))
	}
	if op := g.Ops[0]; op.Op != "recv" || !op.P2P || op.From != 0 || op.To != -1 || op.Bytes != 6 || op.Waiting != 0 || op.State != flightrec.Done {
		t.Errorf("recv recorded as %+v", op)
	}
	if op := subs[0].FlightRecord().Ops[0]; op.Op != "send" || op.To != 1 || op.From != -1 {
		t.Errorf("send recorded as %+v", op)
	}
	if got := subs[1].FlightRecord(); got.Name != "dp" || !slices.Equal(got.Ranks, []int{1, 3}) || got.Ops[0].Op != "barrier" {
		t.Errorf("the other dp group: %+v", got)
	}
	var names []string
	for _, g := range FlightRecords() {
		names = append(names, g.Name+fmt.Sprint(g.Ranks))
	}
	for _, want := range []string{"dp[0 2]", "dp[1 3]", "world[0 1 2 3]"} {
		if !slices.Contains(names, want) {
			t.Errorf("FlightRecords has %v, not %s", names, want)
		}
	}
	subs[3].Close()
	for _, g := range FlightRecords() {
		if g.Name == "dp" && g.Rank == 1 && slices.Equal(g.Ranks, []int{1, 3}) {
			t.Error("a closed communicator is still in FlightRecords")
		}
	}
}

// TestFlightRecordPending: an operation a peer has not joined is pending,
// waiting on that peer; when the peer joins it is done.
func TestFlightRecordPending(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 2, Options{Timeout: time.Minute})
	h := comms[0].AllReduceAsync(ctx, NewBuffer(Float32, 4), Sum)
	deadline := time.Now().Add(30 * time.Second) // a backstop: the op starts at once
	var op flightrec.Op
	for {
		if g := comms[0].FlightRecord(); len(g.Ops) == 1 && g.Ops[0].Waiting == 1 {
			op = g.Ops[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pending op waiting on rank 1 after 30s: %+v", comms[0].FlightRecord())
		}
		time.Sleep(time.Millisecond) // polling for a state, not waiting for one
	}
	if op.State != flightrec.Pending || op.Op != "all_reduce" || !op.End.IsZero() {
		t.Errorf("pending op recorded as %+v", op)
	}
	if err := comms[1].AllReduce(ctx, NewBuffer(Float32, 4), Sum); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if g := comms[0].FlightRecord(); g.Ops[0].State != flightrec.Done || g.Ops[0].Waiting != 1 {
		t.Errorf("after the peer joined: %+v", g.Ops[0])
	}
}

// TestFlightRecordFailed: a timed-out operation is failed, with the error
// naming the peer, and the ring keeps the last flightOps operations.
func TestFlightRecordFailed(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 2, Options{Timeout: 200 * time.Millisecond})
	n := flightOps + 10
	commtest.Must(t, 2, nil, func(r int) error {
		for range n {
			if err := comms[r].Barrier(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	err := comms[0].Barrier(ctx) // rank 1 never comes
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("barrier without the peer: %v, want a timeout", err)
	}
	g := comms[0].FlightRecord()
	if len(g.Ops) != flightOps || g.Dropped != uint64(n+1-flightOps) || g.Ops[0].Seq != uint64(n+1-flightOps) {
		t.Fatalf("%d ops, %d dropped, first #%d; want %d, %d, #%d", len(g.Ops), g.Dropped, g.Ops[0].Seq, flightOps, n+1-flightOps, n+1-flightOps)
	}
	last := g.Ops[len(g.Ops)-1]
	if last.State != flightrec.Failed || last.Seq != uint64(n) || last.Waiting != 1 || !strings.Contains(last.Error, "peer rank 1") {
		t.Errorf("timed-out op recorded as %+v", last)
	}
}

// TestFlightRecorderAllocs: recording an operation allocates nothing.
func TestFlightRecorderAllocs(t *testing.T) {
	var f flightRecorder
	cl := call{name: "all_reduce", kind: kAllReduce, dt: Float32, count: 8}
	if n := testing.AllocsPerRun(100, func() { f.end(f.begin(&cl, 4), nil) }); n != 0 {
		t.Errorf("recording an op allocates %v times, want 0", n)
	}
}

// BenchmarkFlightRecord is the recorder's cost per operation, to hold
// against BenchmarkAllReduce's small sizes.
func BenchmarkFlightRecord(b *testing.B) {
	var f flightRecorder
	cl := call{name: "all_reduce", kind: kAllReduce, dt: Float32, count: 8}
	for b.Loop() {
		id := f.begin(&cl, 4)
		f.wait(1)
		f.end(id, nil)
	}
}

// TestBlockedTime: a rank blocked in a barrier for a while adds at least
// that while to BlockedTime.
func TestBlockedTime(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 2, Options{Name: "blocked", Timeout: time.Minute})
	before := BlockedTime()
	done := make(chan error, 1)
	go func() { done <- comms[0].Barrier(ctx) }()
	deadline := time.Now().Add(30 * time.Second) // a backstop
	for g := comms[0].FlightRecord(); len(g.Ops) == 0; g = comms[0].FlightRecord() {
		if time.Now().After(deadline) {
			t.Fatal("rank 0's barrier did not start in 30s")
		}
		time.Sleep(time.Millisecond) // polling for a state, not waiting for one
	}
	const held = 20 * time.Millisecond
	for start := time.Now(); time.Since(start) < held; { // rank 0 is blocked all along
		time.Sleep(time.Millisecond)
	}
	if err := comms[1].Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := BlockedTime() - before; got < held {
		t.Errorf("BlockedTime grew by %v, want at least %v", got, held)
	}
}
