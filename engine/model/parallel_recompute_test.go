package model

import (
	"fmt"
	"math"
	"testing"
	"unsafe"
)

// TestStageRecomputeBitIdentical: for tp 1 and 2 × pp 1 and 2, with and
// without sequence parallelism, a step with selective or full
// recomputation gives every rank the losses and gradients of the step
// that keeps everything, bit for bit: the recomputed forward runs the
// same kernels on the same inputs (and the same collectives over the same
// ranks), so there is nothing for float32 rounding to change. And the
// activation sets really drop what the mode drops, so the equality is the
// recomputation's, not kept buffers': under selective every set's blocks
// share one probability buffer, which the later blocks and micro-batches
// overwrite before the backward; under full the sets hold no block
// buffers at all.
func TestStageRecomputeBitIdentical(t *testing.T) {
	full := parParams()
	var layouts int
	for _, tp := range []int{1, 2} {
		for _, pp := range []int{1, 2} {
			for _, sp := range []bool{false, true} {
				if sp && tp == 1 {
					continue
				}
				layouts++
				t.Run(fmt.Sprintf("tp%d/pp%d/sp=%v", tp, pp, sp), func(t *testing.T) {
					want := runParallelRecompute(t, tp, pp, sp, RecomputeNone, full)
					for _, rc := range []Recompute{RecomputeSelective, RecomputeFull} {
						got := runParallelRecompute(t, tp, pp, sp, rc, full)
						for r := range got {
							checkSameStep(t, fmt.Sprintf("%s, rank %d", rc, r), got[r].stage, want[r].stage)
							checkDropped(t, fmt.Sprintf("%s, rank %d", rc, r), got[r].stage)
						}
					}
				})
			}
		}
	}
	if layouts != 6 {
		t.Fatalf("%d layouts, want 6 (tp1 × pp1-2, tp2 × pp1-2 with and without sp)", layouts)
	}
}

// checkSameStep compares got's losses and gradients with want's, bit for
// bit.
func checkSameStep(t *testing.T, what string, got, want *Stage) {
	t.Helper()
	if len(got.Grads) == 0 || len(got.Grads) != len(want.Grads) {
		t.Fatalf("%s: %d gradients, want %d (and some)", what, len(got.Grads), len(want.Grads))
	}
	nonzero := 0
	for i, g := range got.Grads {
		if math.Float32bits(g) != math.Float32bits(want.Grads[i]) {
			t.Fatalf("%s: gradient %d is %g, %g without recomputation", what, i, g, want.Grads[i])
		}
		if g != 0 {
			nonzero++
		}
	}
	if nonzero == 0 {
		t.Fatalf("%s: every gradient is zero: the comparison would prove nothing", what)
	}
	gl, wl := got.Losses(), want.Losses()
	if len(gl) != len(wl) {
		t.Fatalf("%s: %d losses, want %d", what, len(gl), len(wl))
	}
	for i := range gl {
		if math.Float32bits(gl[i]) != math.Float32bits(wl[i]) {
			t.Errorf("%s: loss of micro-batch %d is %g, %g without recomputation", what, i, gl[i], wl[i])
		}
	}
}

// checkDropped checks that s's activation sets hold none of what its mode
// recomputes.
func checkDropped(t *testing.T, what string, s *Stage) {
	t.Helper()
	if len(s.free) == 0 || len(s.free) != s.allocated || len(s.inflight) != 0 {
		t.Fatalf("%s: %d free activation sets of %d allocated, %d in flight: want every set free after the step", what, len(s.free), s.allocated, len(s.inflight))
	}
	for _, a := range s.free {
		switch s.rc {
		case RecomputeFull:
			if len(a.layers) != 0 {
				t.Errorf("%s: a set keeps %d blocks' activations, want only the blocks' inputs", what, len(a.layers))
			}
		case RecomputeSelective:
			if len(a.layers) != s.dims.layers {
				t.Fatalf("%s: a set keeps %d blocks, want %d", what, len(a.layers), s.dims.layers)
			}
			for i, la := range a.layers {
				if len(la.att) == 0 || unsafe.SliceData(la.att) != unsafe.SliceData(s.work.att) {
					t.Errorf("%s: block %d keeps its own probabilities, want the stage's shared buffer", what, s.first+i)
				}
			}
		}
	}
}
