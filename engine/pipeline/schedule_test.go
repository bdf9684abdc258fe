package pipeline

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/planner"
)

// schedules are the schedules the tests cover: every kind, 1 to 6 stages,
// micro-batches fewer than, as many as and more than the stages, and 2
// and 3 chunks for interleaved.
func schedules(t *testing.T) []Schedule {
	t.Helper()
	var out []Schedule
	for p := 1; p <= 6; p++ {
		for _, m := range []int{1, 2, p - 1, p, p + 1, 2*p + 1, 4 * p} {
			for _, k := range []Kind{OneFOneB, GPipe} {
				if s, err := New(k, p, m, 1); err == nil {
					out = append(out, s)
				}
			}
			for v := 2; v <= 3; v++ {
				if s, err := New(Interleaved, p, m, v); err == nil {
					out = append(out, s)
				}
			}
		}
	}
	if len(out) < 50 {
		t.Fatalf("only %d schedules to test", len(out))
	}
	return out
}

// TestScheduleOps: every rank forwards and backwards every micro-batch
// exactly once per chunk, never a backward before its forward, holding at
// most InFlight activations, which is 1F1B's min(p−r, m) and GPipe's m.
func TestScheduleOps(t *testing.T) {
	for _, s := range schedules(t) {
		for r := range s.Stages {
			name := fmt.Sprintf("%s p%d m%d v%d rank %d", s.Kind, s.Stages, s.Micros, s.Chunks, r)
			peak, err := checkOps(s, r, s.Ops(r))
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			want := s.InFlight(r)
			switch s.Kind {
			case OneFOneB:
				want = min(s.Stages-r, s.Micros)
			case GPipe:
				want = s.Micros
			}
			if peak != want || peak != s.InFlight(r) {
				t.Errorf("%s: %d micro-batches in flight at most, InFlight says %d, want %d", name, peak, s.InFlight(r), want)
			}
		}
	}
}

// checkOps checks one rank's operations and returns its peak in-flight.
func checkOps(s Schedule, r int, ops []Op) (int, error) {
	fwd, bwd := map[[2]int]bool{}, map[[2]int]bool{}
	live, peak := 0, 0
	for i, op := range ops {
		key := [2]int{op.Chunk, op.Micro}
		switch {
		case op.Chunk < 0 || op.Chunk >= s.Chunks || op.Micro < 0 || op.Micro >= s.Micros:
			return 0, fmt.Errorf("op %d %s out of range", i, op)
		case op.Stage != op.Chunk*s.Stages+r:
			return 0, fmt.Errorf("op %d %s: stage %d, want %d", i, op, op.Stage, op.Chunk*s.Stages+r)
		case op.Pass == Forward && fwd[key]:
			return 0, fmt.Errorf("op %d: %s again", i, op)
		case op.Pass == Backward && (bwd[key] || !fwd[key]):
			return 0, fmt.Errorf("op %d: %s repeated or before its forward", i, op)
		}
		if op.Pass == Forward {
			fwd[key] = true
			live++
		} else {
			bwd[key] = true
			live--
		}
		peak = max(peak, live)
	}
	if want := s.Micros * s.Chunks; len(fwd) != want || len(bwd) != want || len(ops) != 2*want {
		return 0, fmt.Errorf("%d forwards, %d backwards, %d ops: want %d each", len(fwd), len(bwd), len(ops), want)
	}
	return peak, nil
}

// TestScheduleSimulated runs every schedule on the strict-link model: no
// deadlock, every message received as the one sent, and a makespan whose
// bubble is the planner's for the layout with as many virtual stages,
// (p−1)/m for 1F1B and GPipe and (p−1)/(v·m) for interleaved, with a
// chunk's forwards taking 1/v and backwards 2/v (and 1/v).
func TestScheduleSimulated(t *testing.T) {
	bubbles := map[[3]int]float64{}
	for _, s := range schedules(t) {
		steps := make([][]Step, s.Stages)
		for r := range steps {
			steps[r] = s.Steps(r)
		}
		for _, tb := range []float64{1, 2} {
			name := fmt.Sprintf("%s p%d m%d v%d tb %g", s.Kind, s.Stages, s.Micros, s.Chunks, tb)
			end, err := simulate(s, steps, 1/float64(s.Chunks), tb/float64(s.Chunks))
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			key := [3]int{s.Stages, s.Micros, s.Chunks}
			if _, ok := bubbles[key]; !ok {
				bubbles[key] = plannerBubble(t, s.Stages, s.Micros, s.Chunks)
			}
			ideal := float64(s.Micros) * (1 + tb)
			got, want := (end-ideal)/ideal, bubbles[key]
			if math.Abs(got-want) > 1e-9 {
				t.Errorf("%s: makespan %g, bubble %.6f of the ideal %g; the planner says %.6f", name, end, got, ideal, want)
			}
		}
	}
}

// plannerBubble is the planner's bubble fraction for p stages, m
// micro-batches and v virtual stages, from Evaluate itself.
func plannerBubble(t *testing.T, p, m, v int) float64 {
	t.Helper()
	pre, err := planner.LookupPreset("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	pr := planner.Problem{Model: pre.Model, Topology: planner.CPUTopology([]int{p}, 64<<30, 16),
		GlobalBatch: m, Precision: planner.FP32, Options: planner.DefaultOptions()}
	c := planner.Evaluate(pr, planner.Layout{Grid: planner.Grid{TP: 1, PP: p, DP: 1}, MicroBatch: 1, Recompute: planner.RecomputeNone, VirtualStages: v})
	if c.GradAccum != m {
		t.Fatalf("planner: p %d global batch %d: %d micro-batches, want %d (%s)", p, m, c.GradAccum, m, c.RejectReason)
	}
	return c.Bubble
}

// TestSimulateFindsDeadlock: the model does catch the deadlock that pairing
// avoids, 1F1B's neighbours sending to each other with plain Sends.
func TestSimulateFindsDeadlock(t *testing.T) {
	s, err := New(OneFOneB, 2, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	naive := make([][]Step, s.Stages)
	for r := range naive {
		for _, st := range s.Steps(r) { // each SendRecv as a Send, then a Recv
			if st.Send != nil {
				naive[r] = append(naive[r], Step{Send: st.Send})
			}
			if st.Recv != nil {
				naive[r] = append(naive[r], Step{Recv: st.Recv})
			}
			if st.Op != nil {
				naive[r] = append(naive[r], st)
			}
		}
	}
	_, err = simulate(s, naive, 1, 2)
	if err == nil || !strings.Contains(err.Error(), "deadlock") {
		t.Fatalf("unpaired sends: %v, want a deadlock", err)
	}
}

// TestStepsPair pins 1F1B's steps on a middle stage: Megatron-LM's
// send_forward_recv_backward and send_backward_recv_forward pairs.
func TestStepsPair(t *testing.T) {
	s, err := New(OneFOneB, 3, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range s.Steps(1) {
		if st.Op != nil {
			got = append(got, st.Op.String())
		} else {
			got = append(got, fmt.Sprintf("[%v %v]", st.Send, st.Recv))
		}
	}
	want := []string{
		"[<nil> F0@0→0]", "F0.0",
		"[F0@1→2 F1@0→0]", "F1.0",
		"[F1@1→2 B0@2→2]", "B0.0",
		"[B0@1→0 F2@0→0]", "F2.0",
		"[F2@1→2 B1@2→2]", "B1.0",
		"[B1@1→0 B2@2→2]", "B2.0",
		"[B2@1→0 <nil>]",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("steps of stage 1:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestScheduleValidate(t *testing.T) {
	for _, tc := range []struct {
		kind    Kind
		p, m, v int
		want    string
	}{
		{OneFOneB, 0, 4, 1, "0 stages"},
		{OneFOneB, 2, 0, 1, "0 micro-batches"},
		{OneFOneB, 2, MaxMicros + 1, 1, "micro-batches: want 1 to"},
		{GPipe, 2, 4, 2, "only the interleaved"},
		{Interleaved, 2, 4, 1, "want 2 to"},
		{Interleaved, 1, 4, 2, "needs at least 2"},
		{Interleaved, 4, 6, 2, "not a multiple of the 4 stages"},
		{Kind(9), 2, 2, 1, "unknown kind"},
	} {
		_, err := New(tc.kind, tc.p, tc.m, tc.v)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%s, %d, %d, %d) = %v, want %q", tc.kind, tc.p, tc.m, tc.v, err, tc.want)
		}
	}
	for _, name := range []string{"1f1b", "GPipe", " interleaved "} {
		if k, err := ParseKind(name); err != nil || !strings.EqualFold(k.String(), strings.TrimSpace(name)) {
			t.Errorf("ParseKind(%q) = %v, %v", name, k, err)
		}
	}
	if _, err := ParseKind("zb-h1"); err == nil || !strings.Contains(err.Error(), "1f1b, gpipe, interleaved") {
		t.Errorf("ParseKind(zb-h1) = %v", err)
	}
}

// TestPlannerChunkInFlight: the planner's closed form of the activation
// sets each chunk keeps under the interleaved schedule is the count of
// the schedule's own operations, on every rank of every interleaved
// schedule of the tests and of a few deeper ones; with one chunk the
// schedule's InFlight is the planner's 1F1B figure, min(p − r, m).
func TestPlannerChunkInFlight(t *testing.T) {
	ss := schedules(t)
	for _, c := range [][3]int{{8, 8, 2}, {8, 24, 4}, {4, 64, 8}, {16, 32, 3}} {
		s, err := New(Interleaved, c[0], c[1], c[2])
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	var interleaved int
	for _, s := range ss {
		for r := range s.Stages {
			got := s.ChunkInFlight(r)
			switch s.Kind {
			case Interleaved:
				interleaved++
				if want := planner.ChunkInFlight(s.Stages, s.Micros, s.Chunks, r); !slices.Equal(got, want) {
					t.Errorf("%s p%d m%d v%d rank %d: the schedule keeps %v per chunk, the planner says %v", s.Kind, s.Stages, s.Micros, s.Chunks, r, got, want)
				}
			case OneFOneB:
				if want := min(s.Stages-r, s.Micros); len(got) != 1 || got[0] != want || s.InFlight(r) != want {
					t.Errorf("1f1b p%d m%d rank %d: %v in flight (InFlight %d), want %d", s.Stages, s.Micros, r, got, s.InFlight(r), want)
				}
			}
		}
	}
	if interleaved < 100 {
		t.Fatalf("only %d interleaved ranks compared", interleaved)
	}
	if planner.MaxVirtualStages != MaxChunks {
		t.Errorf("planner.MaxVirtualStages %d, pipeline.MaxChunks %d: the planner would propose what the engine refuses", planner.MaxVirtualStages, MaxChunks)
	}
}
