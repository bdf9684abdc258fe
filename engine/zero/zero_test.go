package zero

import (
	"math"
	"slices"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
)

var testCfg = model.Config{Layers: 3, Heads: 2, Embd: 8, Seq: 16, Vocab: 50}

func TestBuckets(t *testing.T) {
	units := []model.Unit{{Offset: 0, Size: 100}, {Offset: 100, Size: 40}, {Offset: 140, Size: 40}, {Offset: 180, Size: 40}, {Offset: 220, Size: 16}}
	for _, tc := range []struct {
		name        string
		first, size int
		want        []Segment
	}{
		{"one bucket", 1000, 1000, []Segment{{0, 236, 0, 4}}},
		{"small first", 50, 80, []Segment{{0, 100, 0, 0}, {100, 80, 1, 2}, {180, 56, 3, 4}}},
		{"per unit", 1, 1, []Segment{{0, 100, 0, 0}, {100, 40, 1, 1}, {140, 40, 2, 2}, {180, 40, 3, 3}, {220, 16, 4, 4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Buckets(units, tc.first, tc.size); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPartitionTiles: over all ranks the owned blocks tile every segment
// exactly once, for counts that do and do not divide, and the pieces cut
// them at parameter boundaries.
func TestPartitionTiles(t *testing.T) {
	units, params := testCfg.Units(), testCfg.Params()
	n := testCfg.NumParams()
	for _, segs := range [][]Segment{PerUnit(units), Buckets(units, 100, 300)} {
		for ranks := 1; ranks <= 5; ranks++ {
			seen := make([]int, n)
			total := 0
			for r := range ranks {
				p := NewPartition(segs, ranks, r)
				total += p.Size()
				at := 0
				for _, pc := range p.pieces(params) {
					if pc.at != at || pc.lo < pc.param.Offset || pc.lo+pc.n > pc.param.Offset+pc.param.Size() {
						t.Fatalf("%d ranks, rank %d: piece %+v out of its parameter or not compact", ranks, r, pc)
					}
					at += pc.n
					for i := pc.lo; i < pc.lo+pc.n; i++ {
						seen[i]++
					}
				}
			}
			if total != n || slices.ContainsFunc(seen, func(c int) bool { return c != 1 }) {
				t.Fatalf("%d ranks: owned %d of %d elements, or some owned twice or never", ranks, total, n)
			}
		}
	}
}

// TestOverflowSkipsStep: an fp16 gradient that is not finite skips the
// update (master weights and moments unchanged bit for bit, the Adam step
// not counted), clears the gradients and halves the loss scale; the next
// clean step updates.
func TestOverflowSkipsStep(t *testing.T) {
	flat := make([]float32, testCfg.NumParams())
	model.InitParams(testCfg, 1, flat)
	cfg := Config{Stage: 0, Params: comm.Float16, Grads: comm.Float16, FirstBucket: 1 << 20, Bucket: 1 << 20,
		Optim: optim.Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}
	e, err := New(cfg, testCfg, nil, flat)
	if err != nil {
		t.Fatal(err)
	}
	fill := func(bad bool) {
		e.BeginMicro(0, 1)
		for u := len(testCfg.Units()) - 1; u >= 0; u-- {
			g := e.Grads(u)
			for i := range g {
				g[i] = 0.01
			}
			if bad && u == 1 {
				g[3] = float32(math.Inf(1))
			}
			e.GradsDone(u)
		}
	}
	before := slices.Clone(e.master)
	scale := e.LossScale()
	fill(true)
	res, err := e.Step(1e-3)
	if err != nil || !res.Skipped {
		t.Fatalf("step with an infinite gradient: %+v, %v; want skipped", res, err)
	}
	if !slices.Equal(e.master, before) || e.opt.Step != 0 || e.LossScale() != scale/2 || slices.ContainsFunc(e.grads.Uint16s(), func(v uint16) bool { return v != 0 }) {
		t.Fatalf("skipped step changed the weights or the Adam step (%d), scale %g (want %g), or left gradients", e.opt.Step, e.LossScale(), scale/2)
	}
	fill(false)
	if res, err := e.Step(1e-3); err != nil || res.Skipped || e.opt.Step != 1 || slices.Equal(e.master, before) {
		t.Fatalf("clean step after overflow: %+v, %v, Adam step %d: want an update", res, err, e.opt.Step)
	}
}

// TestBucketsStartDuringBackward: on the step's last micro-batch, each
// bucket's all-reduce (stages 0–1) or reduce-scatter (stages 2–3) is
// started as soon as its last unit's gradients are done, while backward
// still has units to go; and the reduced result is the average.
func TestBucketsStartDuringBackward(t *testing.T) {
	for stage := range 4 {
		trs := comm.NewInProc(2)
		errs := make(chan error, 2)
		for r := range 2 {
			go func() {
				errs <- func() error {
					c, err := comm.New(t.Context(), r, 2, trs[r], comm.Options{})
					if err != nil {
						return err
					}
					defer c.Close()
					flat := make([]float32, testCfg.NumParams())
					cfg := Config{Stage: stage, Params: comm.Float32, Grads: comm.Float32, FirstBucket: 1, Bucket: 1,
						Optim: optim.Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}
					e, err := New(cfg, testCfg, c, flat)
					if err != nil {
						return err
					}
					e.Bind(t.Context())
					e.BeginMicro(0, 1)
					units := testCfg.Units()
					for u := len(units) - 1; u >= 0; u-- {
						g := e.Grads(u)
						for i := range g {
							g[i] = float32(r + 1) // ranks 1 and 2: the average is 1.5
						}
						e.GradsDone(u)
						if u == len(units)-1 && len(e.inflight) != 1 {
							t.Errorf("stage %d: %d collectives in flight after the last unit, want its bucket's", stage, len(e.inflight))
						}
					}
					e.drain()
					for _, pc := range e.pieces {
						g := e.gradOf(pc)
						if i := slices.IndexFunc(g, func(v float32) bool { return v != 1.5 }); i >= 0 {
							t.Errorf("stage %d rank %d: reduced gradient %d is %v, want 1.5", stage, r, pc.lo+i, g[i])
							break
						}
					}
					return e.err
				}()
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}
