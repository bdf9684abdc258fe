package main

import (
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/planner"
)

func localNodes(slots ...int) []hostfiles.Node {
	var nodes []hostfiles.Node
	for i, n := range slots {
		ids := make([]int, n)
		for j := range ids {
			ids[j] = j
		}
		nodes = append(nodes, hostfiles.Node{Host: hostfiles.Host{Name: "h" + string(rune('0'+i)), Slots: n}, SlotIDs: ids})
	}
	return nodes
}

// TestAutoSpec: --auto sets dp to the ranks, keeps the global batch, keeps
// tp and pp at 1, and needs recomputation or ZeRO only when memory is short.
func TestAutoSpec(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name      string
		slots     []int
		mem       int64 // per host
		job       func(*train.Spec)
		dp        int
		wantZero  bool // a ZeRO stage > 0 is needed
		recompute bool // recomputation is needed
	}{
		{"default job, one rank", []int{1}, 16 * gib, nil, 1, false, false},
		{"default job, 2 ranks", []int{2}, 16 * gib, nil, 2, false, false},
		{"2 hosts × 2 ranks", []int{2, 2}, 16 * gib, nil, 4, false, false},
		{"gpt2 on 4 ranks with little memory", []int{4}, 4 * gib, func(s *train.Spec) {
			s.Model.Preset, s.Batch.MicroBatch, s.Batch.GradAccum = "gpt2", 32, 2
		}, 4, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := train.DefaultSpec()
			if c.job != nil {
				c.job(&spec)
			}
			global := spec.Batch.MicroBatch * spec.Batch.GradAccum
			got, choice, err := autoSpec(spec, cpuTopology(localNodes(c.slots...), c.mem, 8))
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
			if choice.Memory.Total > choice.usable {
				t.Errorf("chosen layout needs %.3g bytes of %.3g", choice.Memory.Total, choice.usable)
			}
		})
	}
}

func TestAutoSpecErrors(t *testing.T) {
	spec := train.DefaultSpec() // global batch 16
	if _, _, err := autoSpec(spec, cpuTopology(localNodes(3), 16<<30, 8)); err == nil ||
		!strings.Contains(err.Error(), "global batch 16 (batch.micro_batch × batch.grad_accum × parallel.dp) is not divisible by the 3 ranks") {
		t.Errorf("3 ranks: %v", err)
	}
	spec.Model.Preset = "gpt2-xl"
	if _, _, err := autoSpec(spec, cpuTopology(localNodes(1), 8<<30, 8)); err == nil ||
		!strings.Contains(err.Error(), "run --auto: no layout of the job fits") {
		t.Errorf("gpt2-xl on 8 GiB: %v", err)
	}
}

// TestAutoCommandConflict: --auto with a command is a usage error.
func TestAutoCommandConflict(t *testing.T) {
	code, _, stderr := runMain(t, "run", "--auto", "--", "true")
	if code != ExitUsage || !strings.Contains(stderr, "run: --auto lays out the built-in engine") {
		t.Errorf("exit %d, %q", code, stderr)
	}
}

func TestCPUTopology(t *testing.T) {
	top := cpuTopology(localNodes(2, 2), 16<<30, 8)
	if top.Nodes != 2 || top.GPUsPerNode != 2 || top.GPU.MemoryBytes != 8<<30 || top.GPU.PeakFLOPS != 4*cpuFLOPSPerCore {
		t.Errorf("equal hosts: %+v", top)
	}
	// Unequal hosts: one rank per node (every rank pays the network), with
	// the memory of the fullest host's ranks.
	top = cpuTopology(localNodes(4, 2), 16<<30, 8)
	if top.Nodes != 6 || top.GPUsPerNode != 1 || top.GPU.MemoryBytes != 4<<30 {
		t.Errorf("unequal hosts: %+v", top)
	}
	if err := top.Validate(); err != nil {
		t.Error(err)
	}
}

func TestParseMemTotal(t *testing.T) {
	got, err := parseMemTotal(strings.NewReader("MemFree:  10 kB\nMemTotal:       16314572 kB\n"))
	if err != nil || got != 16314572*1024 {
		t.Errorf("%d, %v", got, err)
	}
	for _, in := range []string{"", "MemTotal: lots kB\n", "MemTotal: -1 kB\n"} {
		if _, err := parseMemTotal(strings.NewReader(in)); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

func TestJobPrecision(t *testing.T) {
	for in, want := range map[string]planner.Precision{`{"precision": "bf16"}`: planner.BF16, `{"precision": "fp16"}`: planner.FP16,
		`{"steps": 1}`: planner.FP32, `{"precision": "fp8"}`: planner.FP32, `[`: planner.FP32} {
		if got := precisionOf([]byte(in)); got != want {
			t.Errorf("%s: %q, want %q", in, got, want)
		}
	}
	if _, err := train.DefaultSpec().ModelConfig(); err != nil {
		t.Fatal(err)
	}
	_ = jobPrecision(train.DefaultSpec()) // must not panic on whatever fields the spec has
}
