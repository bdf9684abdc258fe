package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// toyNet is a chain of affine maps y = W·x + b, one per virtual stage, with
// widths that differ from stage to stage, and the loss Σ y² of the last
// one's output: small enough to run every layout, and a check of the
// bookkeeping, since an input recycled before its backward, or a gradient
// accumulated for the wrong micro-batch, changes the gradients.
type toyNet struct {
	widths []int       // widths[s] enters stage s; widths[S] leaves the last
	w, b   [][]float32 // per virtual stage
}

func newToyNet(stages int) *toyNet {
	n := &toyNet{widths: make([]int, stages+1)}
	for s := range n.widths {
		n.widths[s] = 3 + s%4
	}
	for s := range stages {
		in, out := n.widths[s], n.widths[s+1]
		w, b := make([]float32, out*in), make([]float32, out)
		for i := range w {
			w[i] = float32(math.Sin(float64(7*s+i+1))) * 0.6
		}
		for i := range b {
			b[i] = float32(math.Cos(float64(5*s+i+1))) * 0.1
		}
		n.w, n.b = append(n.w, w), append(n.b, b)
	}
	return n
}

// data is micro-batch micro's input to the first stage.
func (n *toyNet) data(micro int) []float32 {
	x := make([]float32, n.widths[0])
	for i := range x {
		x[i] = float32(math.Sin(float64(3*micro+i)+0.5)) + 0.25*float32(micro%3)
	}
	return x
}

func (n *toyNet) forward(s int, x, y []float32) {
	in := len(x)
	for o := range y {
		acc := n.b[s][o]
		for i, xi := range x {
			acc += n.w[s][o*in+i] * xi
		}
		y[o] = acc
	}
}

// backward accumulates stage s's gradients gw, gb from its input x and
// output gradient dy, and writes the input gradient into dx (if not nil).
func (n *toyNet) backward(s int, x, dy, dx, gw, gb []float32) {
	in := len(x)
	for o, d := range dy {
		gb[o] += d
		for i, xi := range x {
			gw[o*in+i] += d * xi
		}
	}
	for i := range dx {
		var acc float32
		for o, d := range dy {
			acc += n.w[s][o*in+i] * d
		}
		dx[i] = acc
	}
}

func loss(y []float32) (float32, []float32) {
	var l float32
	dy := make([]float32, len(y))
	for i, v := range y {
		l += v * v
		dy[i] = 2 * v
	}
	return l, dy
}

// toyGrads are the parameter gradients and the losses of one step.
type toyGrads struct {
	gw, gb [][]float32 // per virtual stage
	losses []float32   // per micro-batch
}

func newToyGrads(n *toyNet, micros int) *toyGrads {
	g := &toyGrads{losses: make([]float32, micros)}
	for s := range n.w {
		g.gw = append(g.gw, make([]float32, len(n.w[s])))
		g.gb = append(g.gb, make([]float32, len(n.b[s])))
	}
	return g
}

// sequential is the reference: every micro-batch forward through all the
// stages and back, on one rank.
func sequential(n *toyNet, micros int) *toyGrads {
	g := newToyGrads(n, micros)
	S := len(n.w)
	for m := range micros {
		xs := [][]float32{n.data(m)}
		for s := range S {
			y := make([]float32, n.widths[s+1])
			n.forward(s, xs[s], y)
			xs = append(xs, y)
		}
		var dy []float32
		g.losses[m], dy = loss(xs[S])
		for s := S - 1; s >= 0; s-- {
			dx := make([]float32, n.widths[s])
			n.backward(s, xs[s], dy, dx, g.gw[s], g.gb[s])
			dy = dx
		}
	}
	return g
}

// toyStage is one rank's chunks of a toyNet, a Stage for Run. It keeps
// Run's input buffers as its saved inputs (the contract allows it) with a
// copy to check they did not change before the backward.
type toyStage struct {
	net     *toyNet
	p, rank int
	g       *toyGrads // shared by the ranks: each writes only its stages
	x, xc   map[[2]int][]float32
	y       map[int][]float32 // the last stage's outputs, by micro-batch
}

func (t *toyStage) stage(chunk int) int     { return chunk*t.p + t.rank }
func (t *toyStage) InputLen(chunk int) int  { return t.net.widths[t.stage(chunk)] }
func (t *toyStage) OutputLen(chunk int) int { return t.net.widths[t.stage(chunk)+1] }

func (t *toyStage) Forward(_ context.Context, chunk, micro int, in, out []float32) error {
	s := t.stage(chunk)
	last := s == len(t.net.w)-1
	switch {
	case (s == 0) != (in == nil), last != (out == nil):
		return fmt.Errorf("stage %d: in %v out %v", s, in != nil, out != nil)
	case s == 0:
		in = t.net.data(micro)
	case len(in) != t.net.widths[s]:
		return fmt.Errorf("stage %d: input of %d", s, len(in))
	}
	if last {
		out = make([]float32, t.net.widths[s+1])
		t.y[micro] = out
	}
	t.net.forward(s, in, out)
	t.x[[2]int{chunk, micro}], t.xc[[2]int{chunk, micro}] = in, slices.Clone(in)
	return nil
}

func (t *toyStage) Backward(_ context.Context, chunk, micro int, dout, din []float32) error {
	s := t.stage(chunk)
	key := [2]int{chunk, micro}
	x := t.x[key]
	if !slices.Equal(x, t.xc[key]) {
		return fmt.Errorf("stage %d micro-batch %d: input changed before the backward", s, micro)
	}
	delete(t.x, key)
	if s == len(t.net.w)-1 {
		t.g.losses[micro], dout = loss(t.y[micro])
	}
	t.net.backward(s, x, dout, din, t.g.gw[s], t.g.gb[s])
	return nil
}

// runPipeline runs s over s.Stages in-process ranks and returns the
// gradients and losses. A rank that fails closes its communicator, so
// that the others fail rather than wait. rank, if not nil, gives a rank its
// context and wraps its stage.
func runPipeline(t *testing.T, s Schedule, n *toyNet, rank func(r int, st *toyStage) (context.Context, Stage)) (*toyGrads, []error) {
	t.Helper()
	g := newToyGrads(n, s.Micros)
	trs := comm.NewInProc(s.Stages)
	errs := commtest.Run(s.Stages, nil, func(r int) error {
		var pp *comm.Communicator
		if s.Stages > 1 {
			var err error
			// The timeout is a backstop: a failing rank closes its links.
			pp, err = comm.New(t.Context(), r, s.Stages, trs[r], comm.Options{Name: "pp", Timeout: 2 * time.Minute, ChunkBytes: 16})
			if err != nil {
				return err
			}
			defer pp.Close()
		}
		st := &toyStage{net: n, p: s.Stages, rank: r, g: g,
			x: map[[2]int][]float32{}, xc: map[[2]int][]float32{}, y: map[int][]float32{}}
		ctx, stg := t.Context(), Stage(st)
		if rank != nil {
			ctx, stg = rank(r, st)
		}
		return Run(ctx, s, stg, pp)
	})
	return g, errs
}

// TestRunMatchesSequential: every schedule, on 1 to 4 in-process ranks
// with 1, p−1, p and 2p+1 micro-batches (interleaved: p and 2p, 2 and 3
// chunks), gives the losses and accumulated gradients of the sequential
// computation bit for bit: every stage runs the same float32 operations
// on the same inputs, and accumulates its micro-batches in the same order.
func TestRunMatchesSequential(t *testing.T) {
	var cases []Schedule
	for p := 1; p <= 4; p++ {
		for _, m := range []int{1, p - 1, p, 2*p + 1} {
			for _, k := range []Kind{OneFOneB, GPipe} {
				if s, err := New(k, p, m, 1); err == nil && !slices.Contains(cases, s) {
					cases = append(cases, s)
				}
			}
		}
		for _, m := range []int{p, 2 * p} {
			for v := 2; v <= 3; v++ {
				if s, err := New(Interleaved, p, m, v); err == nil {
					cases = append(cases, s)
				}
			}
		}
	}
	if len(cases) < 30 {
		t.Fatalf("only %d layouts", len(cases))
	}
	for _, s := range cases {
		t.Run(fmt.Sprintf("%s/p%d/m%d/v%d", s.Kind, s.Stages, s.Micros, s.Chunks), func(t *testing.T) {
			n := newToyNet(s.VirtualStages())
			got, errs := runPipeline(t, s, n, nil)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			want := sequential(n, s.Micros)
			if !slices.Equal(got.losses, want.losses) {
				t.Errorf("losses %v, want %v", got.losses, want.losses)
			}
			for st := range n.w {
				if !slices.Equal(got.gw[st], want.gw[st]) || !slices.Equal(got.gb[st], want.gb[st]) {
					t.Errorf("stage %d: gradients\n%v %v\nwant\n%v %v", st, got.gw[st], got.gb[st], want.gw[st], want.gb[st])
				}
			}
		})
	}
}

// cancelling cancels its rank's Run from inside a forward, as a signal
// would while the stage computes.
type cancelling struct {
	*toyStage
	cancel context.CancelFunc
	micro  int
}

func (c *cancelling) Forward(ctx context.Context, chunk, micro int, in, out []float32) error {
	if micro == c.micro {
		c.cancel()
	}
	return c.toyStage.Forward(ctx, chunk, micro, in, out)
}

// TestRunCancelled: cancelling one rank's context mid-step ends its Run
// with the context's error, and the other ranks' with an error rather
// than a wait.
func TestRunCancelled(t *testing.T) {
	s, err := New(OneFOneB, 3, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := newToyNet(3)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, errs := runPipeline(t, s, n, func(r int, st *toyStage) (context.Context, Stage) {
		if r != 1 {
			return t.Context(), st
		}
		return ctx, &cancelling{toyStage: st, cancel: cancel, micro: 2}
	})
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d: no error", r)
		}
	}
	if !errors.Is(errs[1], context.Canceled) {
		t.Errorf("rank 1: %v, want context.Canceled", errs[1])
	}
	t.Logf("errors: %v", errs)
}

// TestRunRefuses: a schedule for another number of stages than the group
// has, and a stage without activations, are errors before any transfer.
func TestRunRefuses(t *testing.T) {
	s, err := New(OneFOneB, 2, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := newToyNet(2)
	st := &toyStage{net: n, p: 2, g: newToyGrads(n, 2)}
	if err := Run(t.Context(), s, st, nil); err == nil || !strings.Contains(err.Error(), "for 2 stages run on a pipeline group of 1 ranks") {
		t.Errorf("2 stages, no group: %v", err)
	}
	if err := Run(t.Context(), Schedule{Kind: OneFOneB, Stages: 1, Micros: 0, Chunks: 1}, st, nil); err == nil || !strings.Contains(err.Error(), "0 micro-batches") {
		t.Errorf("invalid schedule: %v", err)
	}
	n.widths[1] = 0
	_, errs := runPipeline(t, s, n, nil)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "output length 0") || errs[1] == nil {
		t.Errorf("empty activation: %v", errs)
	}
}
