package train

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/gtrain/gtrain/engine/model"
)

// lastRecords decodes each rank's status records and returns its last.
func lastRecords(t *testing.T, status []*bytes.Buffer) []Record {
	t.Helper()
	recs := make([]Record, len(status))
	for r, b := range status {
		n := 0
		sc := bufio.NewScanner(b)
		for sc.Scan() {
			if err := json.Unmarshal(sc.Bytes(), &recs[r]); err != nil {
				t.Fatalf("rank %d: status record %q: %v", r, sc.Text(), err)
			}
			n++
		}
		if n == 0 {
			t.Fatalf("rank %d wrote no status record", r)
		}
	}
	return recs
}

// runWithStatus is runRanks keeping each rank's status records.
func runWithStatus(t *testing.T, spec Spec, n int) ([]Result, []Record) {
	t.Helper()
	status := make([]*bytes.Buffer, n)
	for r := range status {
		status[r] = &bytes.Buffer{}
	}
	res := runRanks(t, spec, n, func(e *Env) { e.Status = status[e.Rank] })
	return res, lastRecords(t, status)
}

// TestGridRecomputeSameLosses: a tp2·pp2 run (sequence-parallel, and
// without) with selective or full recomputation takes exactly the losses
// of the run that keeps every activation, at every step: model.Stage
// recomputes bit-identical activations, so there is no rounding to allow
// for. Each rank's status records report the activations its stage holds
// (model.Stage.ActivationBytes), exactly what EstimateMemory counted for
// that rank before anything was allocated, counted in the total; and
// recomputation holds less on every rank, full less than selective.
func TestGridRecomputeSameLosses(t *testing.T) {
	for _, l := range []gridLayout{{tp: 2, pp: 2, dp: 1}, {tp: 2, pp: 2, dp: 1, noSP: true}} {
		t.Run(l.String(), func(t *testing.T) {
			var ref []float32
			held := map[model.Recompute][]int64{}
			for _, rc := range []model.Recompute{model.RecomputeNone, model.RecomputeSelective, model.RecomputeFull} {
				spec := gridSpec(l)
				spec.Recompute = string(rc)
				res, recs := runWithStatus(t, spec, 4)
				if rc == model.RecomputeNone {
					ref = res[0].Losses
				}
				if len(ref) != spec.Steps {
					t.Fatalf("%d losses, want %d", len(ref), spec.Steps)
				}
				if worst := sameLosses(t, res, ref); worst != 0 {
					t.Errorf("%s: losses %v, without recomputation %v", rc, res[0].Losses, ref)
				}
				held[rc] = checkGridMemory(t, spec, recs)
			}
			for r := range held[model.RecomputeNone] {
				if n, s, f := held[model.RecomputeNone][r], held[model.RecomputeSelective][r], held[model.RecomputeFull][r]; !(f < s && s < n) {
					t.Errorf("rank %d: activations %d (none), %d (selective), %d (full): want each mode to hold less", r, n, s, f)
				}
			}
		})
	}
}

// checkGridMemory compares each rank's last record with the estimate of
// its rank and returns the activations they report.
func checkGridMemory(t *testing.T, spec Spec, recs []Record) []int64 {
	t.Helper()
	rs, err := spec.Resolved()
	if err != nil {
		t.Fatal(err)
	}
	if rs, err = fitDP(rs, Env{World: len(recs)}); err != nil {
		t.Fatal(err)
	}
	acts := make([]int64, len(recs))
	for r, rec := range recs {
		m := rec.Memory
		est, err := EstimateMemory(rs, len(recs), r, len(recs))
		if err != nil {
			t.Fatal(err)
		}
		if m.Activations <= 0 || float64(m.Activations) != est.Activations {
			t.Errorf("%s, rank %d: %d bytes of activations reported, %g estimated", spec.Recompute, r, m.Activations, est.Activations)
		}
		if m.Total != m.Params+m.Grads+m.Optimizer+m.Activations+m.Buffers {
			t.Errorf("%s, rank %d: %+v: the total is not the sum of the categories", spec.Recompute, r, m)
		}
		acts[r] = m.Activations
	}
	return acts
}

// TestCheckMemoryCountsBusiestStage: the launcher's memory check counts
// every rank of a tensor- and pipeline-parallel job at the busiest stage's
// activations, not rank 0's (the first stage): a pp2 job of 100,000-token
// sequences whose last stage holds two layers and the logits is refused
// with that stage's activations, the most any rank of it estimates.
func TestCheckMemoryCountsBusiestStage(t *testing.T) {
	spec := gridSpec(gridLayout{tp: 1, pp: 2, dp: 1, ppLayers: []int{1, 2}})
	spec.Model.Seq, spec.Model.Vocab, spec.Data.Synthetic = 100_000, 50257, 200_002
	spec.Batch = BatchSpec{MicroBatch: 1, Seq: 100_000, GradAccum: 3}
	rs, err := spec.Resolved()
	if err != nil {
		t.Fatal(err)
	}
	if rs, err = fitDP(rs, Env{World: 2}); err != nil {
		t.Fatal(err)
	}
	var per [2]MemoryEstimate
	for r := range per {
		if per[r], err = EstimateMemory(rs, 2, r, 2); err != nil {
			t.Fatal(err)
		}
	}
	if per[1].Activations <= per[0].Activations {
		t.Fatalf("activations %g (stage 0), %g (stage 1): want the last stage the busiest, or the case tests nothing", per[0].Activations, per[1].Activations)
	}
	if capacity, _, _ := hostMemory(); !capacity.known() || capacity.bytes >= 2*per[0].Total() {
		t.Skip("this host's memory is unknown, or holds the job")
	}
	var me *MemoryError
	if err := CheckMemory(spec, 2); !errors.As(err, &me) {
		t.Fatalf("CheckMemory: %v, want a *MemoryError", err)
	}
	if me.Need.Activations != per[1].Activations {
		t.Errorf("refused with %g bytes of activations per rank, want the last stage's %g (rank 0 estimates %g)", me.Need.Activations, per[1].Activations, per[0].Activations)
	}
}

// TestHostEstimateCountsBusiestStage: the memory check of a host counts
// each of its ranks at the busiest stage's activations, whichever stage
// that is: with a large vocabulary the last (its logits), with a small one
// and several micro-batches in flight the first.
func TestHostEstimateCountsBusiestStage(t *testing.T) {
	for _, c := range []struct {
		vocab   int
		busiest int
	}{{50257, 1}, {257, 0}} {
		t.Run(fmt.Sprintf("vocab %d", c.vocab), func(t *testing.T) {
			spec := gridSpec(gridLayout{tp: 1, pp: 2, dp: 1, ppLayers: []int{2, 1}})
			spec.Model.Vocab = c.vocab
			rs, err := spec.Resolved()
			if err != nil {
				t.Fatal(err)
			}
			if rs, err = fitDP(rs, Env{World: 2}); err != nil {
				t.Fatal(err)
			}
			var per [2]float64
			for r := range per {
				e, err := EstimateMemory(rs, 2, r, 2)
				if err != nil {
					t.Fatal(err)
				}
				per[r] = e.Activations
			}
			if per[c.busiest] <= per[1-c.busiest] {
				t.Fatalf("activations by stage %v: want stage %d the busiest, or the case tests nothing", per, c.busiest)
			}
			for r := range per {
				h, err := hostEstimate(rs, 2, r, 2)
				if err != nil {
					t.Fatal(err)
				}
				if h.Activations != per[c.busiest] {
					t.Errorf("rank %d counted at %g bytes of activations, want the busiest stage's %g", r, h.Activations, per[c.busiest])
				}
			}
		})
	}
}
