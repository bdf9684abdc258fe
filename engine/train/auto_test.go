package train

import (
	"errors"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/planner"
)

// TestAutoSpec: --auto sets dp to the ranks, keeps the global batch, keeps
// tp and pp at 1, and needs recomputation or ZeRO only when memory is short.
func TestAutoSpec(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name      string
		slots     []int
		mem       int64 // per host
		job       func(*Spec)
		dp        int
		wantZero  bool // a ZeRO stage > 0 is needed
		recompute bool // recomputation is needed
	}{
		{"default job, one rank", []int{1}, 16 * gib, nil, 1, false, false},
		{"default job, 2 ranks", []int{2}, 16 * gib, nil, 2, false, false},
		{"2 hosts × 2 ranks", []int{2, 2}, 16 * gib, nil, 4, false, false},
		{"gpt2 on 4 ranks with little memory", []int{4}, 4 * gib, func(s *Spec) {
			s.Model.Preset, s.Batch.MicroBatch, s.Batch.GradAccum = "gpt2", 32, 2
		}, 4, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := DefaultSpec()
			if c.job != nil {
				c.job(&spec)
			}
			top := planner.CPUTopology(c.slots, c.mem, 8)
			global := plainGlobalBatch(spec, top.GPUs())
			got, choice, err := autoSpec(spec, top)
			if err != nil {
				t.Fatal(err)
			}
			p := got.Parallel
			if p.DP != c.dp || p.TP != 1 || p.PP != 1 || got.Batch.MicroBatch*got.Batch.GradAccum*p.DP != global {
				t.Errorf("parallel %+v, batch %+v: want dp %d and global batch %d", p, got.Batch, c.dp, global)
			}
			if (p.ZeroStage > 0) != c.wantZero || (got.Recompute != "none") != c.recompute {
				t.Errorf("zero %d, recompute %s; want ZeRO %v, recompute %v", p.ZeroStage, got.Recompute, c.wantZero, c.recompute)
			}
			if choice.Memory.Total > choice.Usable {
				t.Errorf("chosen layout needs %.3g bytes of %.3g", choice.Memory.Total, choice.Usable)
			}
		})
	}
}

// plainGlobalBatch is the global batch a run without --auto trains spec
// with on world ranks: the engine makes parallel.dp 0 every rank, and
// refuses a dp other than the ranks (returning 0 here).
func plainGlobalBatch(spec Spec, world int) int {
	switch spec.Parallel.DP {
	case 0, world:
		return spec.Batch.MicroBatch * spec.Batch.GradAccum * world
	}
	return 0
}

// TestAutoKeepsGlobalBatch: for every rank count a plain run accepts, on
// one host or several, --auto lays the job out with the plain run's global
// batch, whatever split of micro-batch and accumulation it picks.
func TestAutoKeepsGlobalBatch(t *testing.T) {
	hosts := [][]int{{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {2, 2}, {3, 3}, {2, 1}, {4, 3, 1}}
	batches := []struct{ micro, accum, dp int }{{16, 1, 0}, {3, 2, 0}, {1, 1, 0}, {7, 3, 0}, {5, 4, -1}} // -1: dp = the ranks
	n := 0
	for _, h := range hosts {
		top := planner.CPUTopology(h, 16<<30, 8)
		for _, b := range batches {
			spec := DefaultSpec()
			spec.Batch.MicroBatch, spec.Batch.GradAccum, spec.Parallel.DP = b.micro, b.accum, b.dp
			if b.dp < 0 {
				spec.Parallel.DP = top.GPUs()
			}
			plain := plainGlobalBatch(spec, top.GPUs())
			if plain == 0 {
				t.Fatalf("hosts %v, batch %+v: not a job a plain run accepts", h, b)
			}
			got, choice, err := autoSpec(spec, top)
			if err != nil {
				t.Errorf("hosts %v (%d ranks), batch %+v: %v", h, top.GPUs(), b, err)
				continue
			}
			n++
			gb := got.Batch
			if auto := gb.MicroBatch * gb.GradAccum * got.Parallel.DP; auto != plain || choice.GlobalBatch != plain || got.Parallel.DP != top.GPUs() {
				t.Errorf("hosts %v (%d ranks), batch %+v: --auto micro_batch %d × grad_accum %d × dp %d = %d (reported %d), the plain run %d",
					h, top.GPUs(), b, gb.MicroBatch, gb.GradAccum, got.Parallel.DP, auto, choice.GlobalBatch, plain)
			}
		}
	}
	if n != len(hosts)*len(batches) {
		t.Errorf("%d of %d layouts checked", n, len(hosts)*len(batches))
	}
}

func TestAutoSpecErrors(t *testing.T) {
	spec := DefaultSpec() // micro_batch 16, grad_accum 1
	// A dp other than the ranks (which a plain run refuses) is kept as the
	// job's global batch, or refused when the ranks cannot share it.
	spec.Parallel.DP = 2
	got, _, err := autoSpec(spec, planner.CPUTopology([]int{4}, 16<<30, 8))
	if err != nil || got.Batch.MicroBatch*got.Batch.GradAccum*got.Parallel.DP != 32 {
		t.Errorf("dp 2 on 4 ranks: %+v, %v; want the global batch 32", got.Batch, err)
	}
	_, _, err = autoSpec(spec, planner.CPUTopology([]int{3}, 16<<30, 8))
	var usage *usage.Error
	if !errors.As(err, &usage) || !strings.Contains(err.Error(),
		"the job's global batch of 32 sequences (batch.micro_batch 16 × batch.grad_accum 1 × parallel.dp 2) does not divide over the 3 ranks") {
		t.Errorf("dp 2 on 3 ranks: %v", err)
	}
	spec.Parallel.DP, spec.Batch.MicroBatch, spec.Batch.GradAccum = 0, 1<<20, 1<<20
	if _, _, err = autoSpec(spec, planner.CPUTopology([]int{3}, 16<<30, 8)); !errors.As(err, &usage) ||
		!strings.Contains(err.Error(), "want 1 to 1073741824 sequences") {
		t.Errorf("a global batch of 2^40·3: %v", err)
	}
	spec = DefaultSpec()
	spec.Model.Preset = "gpt2-xl"
	if _, _, err := autoSpec(spec, planner.CPUTopology([]int{1}, 8<<30, 8)); !errors.As(err, &usage) ||
		!strings.Contains(err.Error(), "run --auto: no layout of the job fits") {
		t.Errorf("gpt2-xl on 8 GiB: %v", err)
	}
}

func TestJobPrecision(t *testing.T) {
	for in, want := range map[string]planner.Precision{`{"precision": "bf16"}`: planner.BF16, `{"precision": "fp16"}`: planner.FP16,
		`{"steps": 1}`: planner.FP32, `{"precision": "fp8"}`: planner.FP32, `[`: planner.FP32} {
		if got := precisionOf([]byte(in)); got != want {
			t.Errorf("%s: %q, want %q", in, got, want)
		}
	}
	if _, err := DefaultSpec().ModelConfig(); err != nil {
		t.Fatal(err)
	}
	_ = jobPrecision(DefaultSpec()) // must not panic on whatever fields the spec has
}

// TestAutoLayoutRanks: AutoLayout plans for the ranks of every host the run
// selected (the slots of each node), not for the hosts.
func TestAutoLayoutRanks(t *testing.T) {
	if _, _, ok := HostCapacity(); !ok {
		t.Skip("this host's memory cannot be read")
	}
	nodes := []hostfiles.Node{
		{Host: hostfiles.Host{Name: "h0", Slots: 2}, SlotIDs: []int{0, 1}},
		{Host: hostfiles.Host{Name: "h1", Slots: 4}, SlotIDs: []int{1, 3}}, // two of its slots selected
	}
	got, choice, err := AutoLayout(DefaultSpec(), nodes)
	if err != nil {
		t.Fatal(err)
	}
	if got.Parallel.DP != 4 || choice.DP != 4 || choice.GlobalBatch != 16*4 {
		t.Errorf("dp %d (choice %d), global batch %d; want dp 4 and global batch 64", got.Parallel.DP, choice.DP, choice.GlobalBatch)
	}
}
