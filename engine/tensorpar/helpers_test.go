package tensorpar

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// u is float32's unit roundoff.
const u = 0x1p-24

// be is the backend of the dense references and of every rank: one thread,
// since the ranks already run concurrently on a small machine.
var be = backend.CPU{Threads: 1}

// newRand returns a deterministic generator so a failure reproduces.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

// randSlice returns n values uniform in [-scale, scale).
func randSlice(r *rand.Rand, n int, scale float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = (2*r.Float32() - 1) * scale
	}
	return s
}

// randTokens returns n token ids below V.
func randTokens(r *rand.Rand, n, V int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(r.IntN(V))
	}
	return s
}

// abs returns |s| element by element, plus pad (room for a perturbation).
func abs(s []float32, pad float32) []float32 {
	a := make([]float32, len(s))
	for i, v := range s {
		a[i] = float32(math.Abs(float64(v))) + pad
	}
	return a
}

// cluster is a TP group of in-process ranks whose communicators outlive
// one operation, so a test can run layer after layer (and a gradient
// check forward after forward) on the same group.
type cluster struct {
	t      *testing.T
	ctx    context.Context
	cancel context.CancelFunc
	groups []*Group
}

// newCluster connects tp ranks over comm's in-process transport (one rank
// has no communicator) and closes them when the test ends.
func newCluster(t *testing.T, tp int, sp bool) *cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	c := &cluster{t: t, ctx: ctx, cancel: cancel, groups: make([]*Group, tp)}
	t.Cleanup(cancel)
	if tp == 1 {
		c.groups[0] = NewGroup(nil, be, sp)
		return c
	}
	trs := comm.NewInProc(tp)
	comms := commtest.Open(ctx, t, tp, func(ctx context.Context, r int) (*comm.Communicator, error) {
		return comm.New(ctx, r, tp, trs[r], comm.Options{Name: "tp", Timeout: time.Minute})
	})
	for r, cm := range comms {
		c.groups[r] = NewGroup(cm, be, sp)
	}
	return c
}

// run calls f on every rank concurrently and fails the test with the first
// error. A failing rank cancels the others' context, which would otherwise
// wait for it in a collective until the communicator's timeout.
func (c *cluster) run(f func(r int, g *Group) error) {
	c.t.Helper()
	commtest.Must(c.t, len(c.groups), c.cancel, func(r int) error { return f(r, c.groups[r]) })
}

// part extracts rank r's part of full (shape) under split s, failing the
// test on error.
func part(t *testing.T, s Split, full []float32, shape []int, r, tp int) []float32 {
	t.Helper()
	p, err := Part{Split: s, Rank: r, Size: tp}.Extract(full, shape)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// seqPart is rank r's rows of an N×width activation under sequence
// parallelism (sp), or all of it.
func seqPart(t *testing.T, full []float32, n, width, r, tp int, sp bool) []float32 {
	t.Helper()
	if !sp {
		return slices.Clone(full)
	}
	return part(t, Rows, full, []int{n, width}, r, tp)
}

// assertWithin fails unless |got[i] − want[i]| ≤ tol[i] for every i.
func assertWithin(t *testing.T, name string, got, want, tol []float32) {
	t.Helper()
	if len(got) != len(want) || len(tol) != len(want) {
		t.Fatalf("%s: %d values, want %d (tolerances %d)", name, len(got), len(want), len(tol))
	}
	worst := 0.0
	for i := range got {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if !(d <= float64(tol[i])) {
			t.Fatalf("%s[%d] = %g, want %g (diff %.3g, tolerance %.3g)", name, i, got[i], want[i], d, tol[i])
		}
		if tol[i] > 0 {
			worst = max(worst, d/float64(tol[i]))
		}
	}
	t.Logf("%s: worst |error|/tolerance %.3f", name, worst)
}

// scaled returns bound[i]·f.
func scaled(bound []float32, f float64) []float32 {
	s := make([]float32, len(bound))
	for i, b := range bound {
		s[i] = float32(float64(b) * f)
	}
	return s
}

// fdTarget is one differentiable input of a layer: its values on every
// rank and the analytic gradient there.
type fdTarget struct {
	name        string
	vals, grads [][]float32 // per rank; nil where a rank holds none
	// replicated: one tensor held whole by every rank; a perturbation
	// changes every copy, and every rank's gradient must be the whole one.
	replicated bool
}

// fdMaxCoord bounds the coordinates checked per rank and tensor.
const fdMaxCoord = 24

// fdCheck compares each target's analytic gradient with the central
// difference (L(x+h) − L(x−h)) / 2h of L = Σ eval()ᵢ·wᵢ, computed in
// float64 from the layer's float32 outputs. errBound[i] bounds the
// rounding error of output i (at inputs within h of the current ones), so
// each evaluation of L is within Σ errBound·|w| of the exact value and the
// difference quotient within Σ errBound·|w| / h: the noise term of the
// tolerance. (Counting only the outputs whose float32 value changed would
// not do: a change below an output's rounding leaves it bit-for-bit the
// same while its exact value moved.) trunc adds the truncation error of
// the central difference (none for a function linear in the coordinate,
// but the analytic gradient's own rounding then), rel a relative margin.
func fdCheck(t *testing.T, r *rand.Rand, h, trunc, rel float64, eval func() []float32, w, errBound []float64, targets ...fdTarget) {
	t.Helper()
	var noise float64
	for j := range w {
		noise += errBound[j] * math.Abs(w[j]) / h
	}
	lossOf := func(out []float32) float64 {
		var s float64
		for i, v := range out {
			s += float64(v) * w[i]
		}
		return s
	}
	for _, tg := range targets {
		if tg.replicated {
			for rank, g := range tg.grads {
				if !slices.Equal(g, tg.grads[0]) {
					t.Fatalf("%s: rank %d's gradient of the replicated tensor differs from rank 0's", tg.name, rank)
				}
			}
		}
		checked, worst := 0, 0.0
		for rank, vals := range tg.vals {
			if vals == nil || (tg.replicated && rank > 0) {
				continue
			}
			if !slices.ContainsFunc(tg.grads[rank], func(g float32) bool { return g != 0 }) {
				t.Fatalf("%s on rank %d: the analytic gradient is all zero; the check would prove nothing", tg.name, rank)
			}
			for _, i := range coords(r, len(vals)) {
				set := func(d float32) {
					for rr, v := range tg.vals {
						if rr == rank || tg.replicated {
							v[i] += d
						}
					}
				}
				orig := vals[i]
				set(float32(h))
				plus := slices.Clone(eval())
				for rr, v := range tg.vals {
					if rr == rank || tg.replicated {
						v[i] = orig
					}
				}
				set(-float32(h))
				minus := slices.Clone(eval())
				for rr, v := range tg.vals {
					if rr == rank || tg.replicated {
						v[i] = orig
					}
				}
				fd := (lossOf(plus) - lossOf(minus)) / (2 * h)
				g := float64(tg.grads[rank][i])
				tol := noise + trunc + rel*math.Abs(g)
				worst = max(worst, math.Abs(fd-g)/tol)
				if !(math.Abs(fd-g) <= tol) {
					t.Errorf("%s[%d] on rank %d: analytic %.6g, finite difference %.6g (tolerance %.3g)", tg.name, i, rank, g, fd, tol)
				}
				checked++
			}
		}
		if checked == 0 {
			t.Fatalf("%s: no coordinate checked", tg.name)
		}
		t.Logf("%s: %d coordinates, worst |error|/tolerance %.3f", tg.name, checked, worst)
	}
}

// coords returns the coordinates to check in a tensor of n values: all of
// them, or fdMaxCoord random ones including the first and the last.
func coords(r *rand.Rand, n int) []int {
	if n <= fdMaxCoord {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		return idx
	}
	idx := []int{0, n - 1}
	for len(idx) < fdMaxCoord {
		idx = append(idx, r.IntN(n))
	}
	return idx
}

// name formats a subtest name.
func name(tp int, sp bool, extra ...any) string {
	s := fmt.Sprintf("tp%d", tp)
	if sp {
		s += "/sp"
	}
	for _, e := range extra {
		s += fmt.Sprintf("/%v", e)
	}
	return s
}
