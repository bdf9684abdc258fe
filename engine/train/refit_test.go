package train

import (
	"strings"
	"testing"

	"github.com/gtrain/gtrain/planner"
)

// TestRefit: an elastic restart on another number of ranks keeps the
// global batch: dp is every replica, grad_accum kept where it can be (the
// same data), else a micro-batch no larger than the job's, the
// accumulation nearest the job's; worlds that cannot keep it are refused
// with the reason.
func TestRefit(t *testing.T) {
	tests := []struct {
		name                 string
		tp, pp               int
		micro, accum, world  int
		global               int
		wantMicro, wantAccum int
		wantDP               int
		err                  string
	}{
		{name: "3 ranks to 2", micro: 2, accum: 1, world: 2, global: 6, wantMicro: 3, wantAccum: 1, wantDP: 2},
		{name: "3 ranks to 2, accumulation kept", micro: 2, accum: 2, world: 2, global: 12, wantMicro: 3, wantAccum: 2, wantDP: 2},
		{name: "accumulation that cannot stay", micro: 2, accum: 3, world: 4, global: 18, err: "4 replicas do not divide"},
		{name: "accumulation changes, micro_batch no larger", micro: 2, accum: 4, world: 4, global: 40, wantMicro: 2, wantAccum: 5, wantDP: 4},
		{name: "2 ranks to 4", micro: 4, accum: 2, world: 4, global: 16, wantMicro: 2, wantAccum: 2, wantDP: 4},
		{name: "micro_batch 1 stays", micro: 1, accum: 4, world: 2, global: 12, wantMicro: 1, wantAccum: 6, wantDP: 2},
		{name: "tp2 on 4 ranks", tp: 2, micro: 3, accum: 2, world: 4, global: 12, wantMicro: 3, wantAccum: 2, wantDP: 2},
		{name: "replicas do not divide the batch", micro: 2, accum: 1, world: 4, global: 6, err: "4 replicas do not divide the global batch of 6"},
		{name: "tp does not divide the ranks", tp: 2, micro: 2, accum: 1, world: 3, global: 4, err: "do not divide them"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := DefaultSpec()
			spec.Parallel.TP, spec.Parallel.PP = max(tt.tp, 1), max(tt.pp, 1)
			spec.Batch.MicroBatch, spec.Batch.GradAccum = tt.micro, tt.accum
			got, err := Refit(spec, tt.world, tt.global)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Refit error = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, p := got.Batch, got.Parallel
			if b.MicroBatch != tt.wantMicro || b.GradAccum != tt.wantAccum || p.DP != tt.wantDP {
				t.Errorf("micro_batch %d × grad_accum %d × dp %d, want %d × %d × %d", b.MicroBatch, b.GradAccum, p.DP, tt.wantMicro, tt.wantAccum, tt.wantDP)
			}
			if _, err := fitDP(got, Env{World: tt.world}); err != nil {
				t.Errorf("the ranks refuse the refit spec: %v", err)
			}
		})
	}
}

// TestAutoLayoutOnKeepsGlobalBatch: a re-plan on the hosts' reported
// topology keeps the global batch it is given, on more or fewer ranks.
func TestAutoLayoutOnKeepsGlobalBatch(t *testing.T) {
	for _, hosts := range [][]int{{1, 1, 1}, {1, 1}, {2, 2}, {4}} {
		spec := DefaultSpec()
		top := planner.CPUTopology(hosts, 16<<30, 8)
		got, choice, err := AutoLayoutOn(spec, top, 24, 0)
		if err != nil {
			t.Fatalf("hosts %v: %v", hosts, err)
		}
		b, p := got.Batch, got.Parallel
		if b.MicroBatch*b.GradAccum*p.DP != 24 || choice.GlobalBatch != 24 || p.TP*p.PP*p.DP != top.GPUs() {
			t.Errorf("hosts %v: micro_batch %d × grad_accum %d × dp %d on tp %d × pp %d (reported %d), want 24 sequences on %d ranks",
				hosts, b.MicroBatch, b.GradAccum, p.DP, p.TP, p.PP, choice.GlobalBatch, top.GPUs())
		}
	}
}
