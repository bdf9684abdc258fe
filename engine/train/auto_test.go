package train

import (
	"errors"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/planner"
)

// TestAutoSpec: --auto lays the job out on exactly the ranks (tp × pp ×
// dp), keeps the global batch, gives a spec the engine accepts for that
// many ranks, and uses model parallelism, ZeRO or recomputation when the
// plain data-parallel layout does not fit. (Which it prefers when memory
// is plenty is the calibration's business: planner.CPUTopology.)
func TestAutoSpec(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name  string
		slots []int
		mem   int64 // per host
		job   func(*Spec)
		short bool // the plain data-parallel layout (ZeRO 0, no recompute) does not fit
	}{
		{"default job, one rank", []int{1}, 16 * gib, nil, false},
		{"default job, 2 ranks", []int{2}, 16 * gib, nil, false},
		{"2 hosts × 2 ranks", []int{2, 2}, 16 * gib, nil, false},
		{"gpt2 on 4 ranks with little memory", []int{4}, 4 * gib, func(s *Spec) {
			s.Model.Preset, s.Batch.MicroBatch, s.Batch.GradAccum = "gpt2", 32, 2
		}, true},
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
			if p.TP*p.PP*p.DP != top.GPUs() || got.Batch.MicroBatch*got.Batch.GradAccum*p.DP != global {
				t.Errorf("parallel %+v, batch %+v: want tp × pp × dp = %d ranks and global batch %d", p, got.Batch, top.GPUs(), global)
			}
			if err := CheckLayout(got, top.GPUs(), false); err != nil || got.Validate() != nil {
				t.Errorf("the engine refuses the layout: %v, %v", err, got.Validate())
			}
			plain := p.TP*p.PP == 1 && p.ZeroStage == 0 && got.Recompute == "none"
			if plain && c.short {
				t.Errorf("tp %d, pp %d, zero %d, recompute %s: the plain data-parallel layout, which does not fit", p.TP, p.PP, p.ZeroStage, got.Recompute)
			}
			if choice.Memory.Total > choice.Usable || choice.TP != p.TP || choice.PP != p.PP {
				t.Errorf("chosen layout %+v needs %.3g bytes of %.3g", choice.Layout, choice.Memory.Total, choice.Usable)
			}
		})
	}
}

// TestAutoPicksModelParallelism: where no data-parallel layout fits (at
// any ZeRO stage or recomputation: each rank would still hold the whole
// model's activations and ZeRO-3's gathered layers), --auto splits the
// model with tensor or pipeline parallelism, at a ZeRO stage the engine
// combines with them.
func TestAutoPicksModelParallelism(t *testing.T) {
	spec := DefaultSpec()
	spec.Model.Preset, spec.Batch.MicroBatch = "gpt2-medium", 4
	top := planner.CPUTopology([]int{4}, 8<<30, 8)
	pr, err := enginePlan(spec, top)
	if err != nil {
		t.Fatal(err)
	}
	res, err := planner.Search(pr, planner.Space{TP: []int{1}, PP: []int{1}})
	if err != nil || res.Feasible != 0 {
		t.Fatalf("%d data-parallel layouts fit (%v): the case tests nothing", res.Feasible, err)
	}
	got, choice, err := autoSpec(spec, top)
	if err != nil {
		t.Fatal(err)
	}
	if p := got.Parallel; p.TP*p.PP < 2 || p.ZeroStage > 1 || got.Validate() != nil {
		t.Errorf("parallel %+v, recompute %s: want tp·pp > 1 at ZeRO 0 or 1, which the engine accepts (%v)", p, got.Recompute, got.Validate())
	}
	if choice.Memory.Total > choice.Usable {
		t.Errorf("predicted %+v over %.3g usable", choice.Memory, choice.Usable)
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
			gb, p := got.Batch, got.Parallel
			if auto := gb.MicroBatch * gb.GradAccum * p.DP; auto != plain || choice.GlobalBatch != plain || p.TP*p.PP*p.DP != top.GPUs() {
				t.Errorf("hosts %v (%d ranks), batch %+v: --auto micro_batch %d × grad_accum %d × dp %d = %d on tp %d × pp %d (reported %d), the plain run %d",
					h, top.GPUs(), b, gb.MicroBatch, gb.GradAccum, p.DP, auto, p.TP, p.PP, choice.GlobalBatch, plain)
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
	// job's global batch: 32 sequences on 4 ranks; on 3, which DP cannot
	// share it over, one replica pipelined over 3 stages (tp 3 does not
	// divide the tiny model's 4 heads).
	spec.Parallel.DP = 2
	got, _, err := autoSpec(spec, planner.CPUTopology([]int{4}, 16<<30, 8))
	if err != nil || got.Batch.MicroBatch*got.Batch.GradAccum*got.Parallel.DP != 32 {
		t.Errorf("dp 2 on 4 ranks: %+v, %v; want the global batch 32", got.Batch, err)
	}
	got, _, err = autoSpec(spec, planner.CPUTopology([]int{3}, 16<<30, 8))
	if p := got.Parallel; err != nil || p.DP != 1 || p.PP != 3 || got.Batch.MicroBatch*got.Batch.GradAccum != 32 {
		t.Errorf("dp 2 on 3 ranks: %+v, %+v, %v; want pp 3 with the global batch 32", p, got.Batch, err)
	}
	var usage *usage.Error
	spec.Parallel.DP, spec.Parallel.TP = 0, 3
	if _, _, err = autoSpec(spec, planner.CPUTopology([]int{4}, 16<<30, 8)); !errors.As(err, &usage) ||
		!strings.Contains(err.Error(), "the job's parallel.tp 3 × parallel.pp 1 do not divide the 4 ranks") {
		t.Errorf("tp 3 and dp 0 on 4 ranks: %v", err)
	}
	spec.Parallel.TP, spec.Batch.MicroBatch, spec.Batch.GradAccum = 0, 1<<20, 1<<20
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
	if p := got.Parallel; p.TP*p.PP*p.DP != 4 || choice.World() != 4 || choice.GlobalBatch != 16*4 {
		t.Errorf("parallel %+v (choice %+v), global batch %d; want 4 ranks and global batch 64", p, choice.Grid, choice.GlobalBatch)
	}
}
