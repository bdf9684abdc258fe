package planner

import (
	"slices"
	"strings"
	"testing"
)

// interleavedProblem is a 16-layer model on 8 GPUs of one node with a
// global batch of 16 sequences: pp 4 with 2 or 4 chunks splits it evenly.
func interleavedProblem(t *testing.T) Problem {
	t.Helper()
	m := Model{Arch: ArchGPT, Layers: 16, Hidden: 1024, Heads: 16, KVHeads: 16, Vocab: 32000, Seq: 1024}
	return Problem{Model: m.Normalized(), Topology: cluster(t, "A100-80GB", 8), GlobalBatch: 16, Precision: BF16, Options: DefaultOptions()}
}

// TestInterleavedCosts: against 1F1B on the same pp 4 × dp 2 layout with
// 8 micro-batches, v = 2 virtual stages (Narayanan et al. 2021, section
// 2.2.2) divide the bubble by v, (p−1)/(v·m); send v times the
// point-to-point bytes; take the same compute; and the first stage holds
// more activations, its chunks keeping ChunkInFlight's sets: more than
// 1F1B's p micro-batches of the whole stage, at least the literature's
// p + (p−1)/v (Korthikanti et al. 2022).
func TestInterleavedCosts(t *testing.T) {
	pr := interleavedProblem(t)
	l := Layout{Grid: Grid{TP: 1, PP: 4, DP: 2}, MicroBatch: 1, Recompute: RecomputeNone}
	one := Evaluate(pr, l)
	l.VirtualStages = 2
	two := Evaluate(pr, l)
	if !one.Feasible || !two.Feasible {
		t.Fatalf("infeasible: %s / %s", one.RejectReason, two.RejectReason)
	}
	if one.GradAccum != 8 || two.GradAccum != 8 {
		t.Fatalf("grad accum %d and %d, want 8", one.GradAccum, two.GradAccum)
	}
	if want := 3.0 / (2 * 8); two.Bubble != want || one.Bubble != 2*want {
		t.Errorf("bubble %g (1F1B %g), want (p−1)/(v·m) = %g", two.Bubble, one.Bubble, want)
	}
	if two.Detail.BubbleTime*2 != one.Detail.BubbleTime || two.Detail.Compute != one.Detail.Compute {
		t.Errorf("bubble time %g (1F1B %g), compute %g (1F1B %g): want half the bubble, the same compute",
			two.Detail.BubbleTime, one.Detail.BubbleTime, two.Detail.Compute, one.Detail.Compute)
	}
	if two.CommBytes.PP != 2*one.CommBytes.PP {
		t.Errorf("PP bytes %g, 1F1B %g: want twice as many", two.CommBytes.PP, one.CommBytes.PP)
	}
	if two.Schedule != "interleaved" || one.Schedule != "1f1b" {
		t.Errorf("schedules %q and %q, want interleaved and 1f1b", two.Schedule, one.Schedule)
	}
	first1, err := RankMemory(pr, Layout{Grid: l.Grid, MicroBatch: 1, Recompute: RecomputeNone}, Coord{})
	if err != nil {
		t.Fatal(err)
	}
	first2, err := RankMemory(pr, l, Coord{})
	if err != nil {
		t.Fatal(err)
	}
	sets := ChunkInFlight(4, 8, 2, 0)
	layer := first1.Activations / (4 * 4) // 1F1B: 4 layers × 4 micro-batches, no head on stage 0
	if got, want := first2.Activations, layer*2*float64(sets[0]+sets[1]); got != want || !slices.Equal(sets, []int{8, 4}) {
		t.Errorf("first stage: %g bytes of activations with chunk sets %v, want %g (2 layers per chunk)", got, sets, want)
	}
	literature := layer * 4 * (4 + 3.0/2)
	if !(first2.Activations > first1.Activations && first2.Activations >= literature) {
		t.Errorf("first stage: %g bytes interleaved, %g under 1F1B, %g by the literature", first2.Activations, first1.Activations, literature)
	}
}

// TestInterleavedRejected: what the interleaved schedule cannot run is
// rejected with the reason.
func TestInterleavedRejected(t *testing.T) {
	pr := interleavedProblem(t)
	for _, c := range []struct {
		name string
		l    Layout
		want string
	}{
		{"one stage", Layout{Grid: Grid{TP: 1, PP: 1, DP: 8}, MicroBatch: 1, VirtualStages: 2}, "interleaving needs at least 2 pipeline stages"},
		{"chunks above the layers", Layout{Grid: Grid{TP: 1, PP: 8, DP: 1}, MicroBatch: 1, VirtualStages: 3}, "pp 8 × 3 = 24 model chunks, more than the 16 layers"},
		{"micro-batches not a multiple of pp", Layout{Grid: Grid{TP: 1, PP: 4, DP: 2}, MicroBatch: 4, VirtualStages: 2}, "2 micro-batches is not a multiple of pp 4"},
		{"too many chunks", Layout{Grid: Grid{TP: 1, PP: 2, DP: 4}, MicroBatch: 1, VirtualStages: MaxVirtualStages + 1}, "want 0 to 64 model chunks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.l.Recompute = RecomputeNone
			if got := Evaluate(pr, c.l); got.Feasible || !strings.Contains(got.RejectReason, c.want) {
				t.Errorf("feasible %v, reason %q; want a rejection containing %q", got.Feasible, got.RejectReason, c.want)
			}
		})
	}
}

// TestSearchInterleaves: the free search tries virtual stages where each
// stage's layers split into equal chunks (pp 4: 2 and 4 chunks of 16
// layers), and only there; a pin is searched exactly.
func TestSearchInterleaves(t *testing.T) {
	pr := interleavedProblem(t)
	res, err := Search(pr, Space{PP: []int{4}, DP: []int{2}, TP: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, c := range res.Candidates {
		seen[c.Chunks()] = true
	}
	if !seen[1] || !seen[2] || !seen[4] || seen[3] || len(seen) != 3 {
		t.Errorf("virtual stages searched %v, want 1, 2 and 4", seen)
	}
	res, err = Search(pr, Space{PP: []int{4}, VirtualStages: []int{3}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Candidates) == 0 {
		t.Fatal("no candidate with 3 pinned virtual stages")
	}
	for _, c := range res.Candidates {
		if c.VirtualStages != 3 {
			t.Fatalf("a candidate with %d virtual stages, 3 pinned", c.VirtualStages)
		}
	}
}

// TestPinVirtualStages: --virtual-stages pins are deduplicated like the
// other degrees, and a count out of range is a usage error naming the
// flag.
func TestPinVirtualStages(t *testing.T) {
	r := request()
	r.Pins.VirtualStages = []int{2, 1, 2}
	_, sp, err := ProblemFrom(t.Context(), r)
	if err != nil || !slices.Equal(sp.VirtualStages, []int{1, 2}) {
		t.Fatalf("pins %v, %v; want [1 2]", sp.VirtualStages, err)
	}
	for v, want := range map[int]string{0: "plan: --virtual-stages 0: must be at least 1", MaxVirtualStages + 1: "plan: --virtual-stages 65: at most 64 model chunks"} {
		r.Pins.VirtualStages = []int{v}
		if _, _, err := ProblemFrom(t.Context(), r); !isUsage(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("--virtual-stages %d: %v, want a usage error containing %q", v, err, want)
		}
	}
}
