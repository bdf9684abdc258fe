package zero

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
	"github.com/gtrain/gtrain/engine/parallel"
	"github.com/gtrain/gtrain/planner"
)

// synthTensors are two small tensors, 22 elements: at ZeRO-1 over dp 2 the
// owned blocks (11 each) cut the first tensor, so pieces and masters are
// cut at a tensor boundary inside a block. b is replicated over TP (on a
// TP rank above 0 the norm does not count it).
var synthTensors = []ShardTensor{
	{Param: model.Param{Name: "a", Shape: []int{5, 3}, Offset: 0, Decay: true}},
	{Param: model.Param{Name: "b", Shape: []int{7}, Offset: 15}, Replicated: true},
}

const synthN = 22

// synthOptim has an eps near the size of a gradient element, so that the
// update depends on the gradient's scale: AdamW is otherwise nearly
// invariant to it, and a sum mistaken for an average, or a loss scale not
// removed, would change little.
var synthOptim = optim.Config{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 0.1, WeightDecay: 0.1}

// synthInit is the initial parameters: values that bf16 and fp16 cannot
// represent exactly, the same on every rank.
func synthInit() []float32 {
	rng := rand.New(rand.NewPCG(1, 2))
	p := make([]float32, synthN)
	for i := range p {
		p[i] = float32(rng.NormFloat64() * 0.5)
	}
	return p
}

// synthGrad is DP rank d's unscaled gradient at step s.
func synthGrad(d, s int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(10*d+s), 3))
	g := make([]float32, synthN)
	for i := range g {
		g[i] = float32(rng.NormFloat64() * 0.1)
	}
	return g
}

// synthStep is what a rank saw after one step.
type synthStep struct {
	res            StepResult
	params, master []float32
	scale          float64 // the loss scale after the step
	adam           int     // AdamW steps taken
}

// synthRank is one rank's run.
type synthRank struct {
	coord          planner.Coord
	lo, hi         int
	init           []float32 // parameters and masters after NewDist
	initMaster     []float32
	steps          []synthStep
	optBytes, wire int64
	skipped        int
}

// runSynth runs steps optimizer steps of cfg on every rank of grid in
// process, over synthTensors: before each step every rank's gradient is
// its DP rank's synthGrad times the loss scale, then edit (if not nil)
// may change it.
func runSynth(t *testing.T, grid planner.Grid, cfg DistConfig, steps int, edit func(c planner.Coord, s int, g []float32)) []*synthRank {
	t.Helper()
	n := grid.World()
	trs := comm.NewInProc(n)
	ranks, errs := make([]*synthRank, n), make([]error, n)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		ranks[r] = &synthRank{}
		wg.Go(func() {
			if errs[r] = synthRun(ctx, ranks[r], trs[r], r, grid, cfg, steps, edit); errs[r] != nil {
				cancel() // the others fail rather than wait for this rank
			}
		})
	}
	wg.Wait()
	for r := range n {
		trs[r].Close()
	}
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return ranks
}

func synthRun(ctx context.Context, k *synthRank, tr comm.Transport, r int, grid planner.Grid, cfg DistConfig, steps int, edit func(c planner.Coord, s int, g []float32)) error {
	// The timeout is a backstop only: a failing rank cancels the others.
	world, err := comm.New(ctx, r, grid.World(), tr, comm.Options{Name: "world", Timeout: 2 * time.Minute})
	if err != nil {
		return err
	}
	defer world.Close()
	gs, err := parallel.New(ctx, world, grid)
	if err != nil {
		return err
	}
	defer gs.Close()
	k.coord = gs.Coord
	params, grads := synthInit(), make([]float32, synthN)
	d, err := NewDist(cfg, gs, synthTensors, params, grads)
	if err != nil {
		return err
	}
	k.lo, k.hi = d.Owned()
	k.init, k.initMaster = slices.Clone(params), slices.Clone(d.Masters())
	k.optBytes, k.wire = d.OptimizerBytes(), d.BufferBytes()
	for s := range steps {
		for i, v := range synthGrad(gs.Coord.DP, s) {
			grads[i] = v * float32(d.LossScale())
		}
		if edit != nil {
			edit(gs.Coord, s, grads)
		}
		res, err := d.Step(ctx, synthOptim.LR)
		if err != nil {
			return err
		}
		k.steps = append(k.steps, synthStep{res: res, params: slices.Clone(params), master: slices.Clone(d.Masters()),
			scale: d.LossScale(), adam: d.Optimizer().Step})
	}
	k.skipped = d.Scaler().Skipped
	return nil
}

// rounded is v rounded to t, element by element, with the scalar
// conversions (not the vector kernels roundTo uses).
func rounded(t comm.DType, v []float32) []float32 {
	out := slices.Clone(v)
	for i, x := range out {
		switch t {
		case comm.BFloat16:
			out[i] = comm.BF16ToFloat32(comm.BF16FromFloat32(x))
		case comm.Float16:
			out[i] = comm.F16ToFloat32(comm.F16FromFloat32(x))
		}
	}
	return out
}

// synthReference is the run of one rank holding the whole vector in fp32
// master weights: the DP ranks' gradients (each rounded to grads first,
// as it travels) averaged in float64, AdamW on the masters. It returns
// the masters after each step.
func synthReference(dp int, grads comm.DType, steps int) [][]float32 {
	master := synthInit()
	opt := optim.NewAdamW(synthOptim, synthN, nil)
	var out [][]float32
	for s := range steps {
		avg := make([]float32, synthN)
		for i := range avg {
			var sum float64
			for d := range dp {
				sum += float64(rounded(grads, synthGrad(d, s))[i])
			}
			avg[i] = float32(sum / float64(dp))
		}
		var parts []optim.Part
		for _, t := range synthTensors {
			parts = append(parts, optim.Part{P: master[t.Offset : t.Offset+t.Size()], G: avg[t.Offset : t.Offset+t.Size()], At: t.Offset, Decay: t.Decay})
		}
		opt.UpdateParts(parts, synthOptim.LR, 1)
		out = append(out, slices.Clone(master))
	}
	return out
}

// synthTol bounds the masters' difference to the reference when the
// gradients travel in 16 bits: the ring rounds partial sums to the type
// (2^-9 relative for bf16, 2^-12 for fp16, the reference averages the
// rounded values exactly), which moves an update of size lr·m̂/(√v̂+eps)
// by about lr·2^-8 = 4e-5 per step. A sum mistaken for an average, or a
// loss scale left in the gradient, moves it by about lr/3 with synthOptim's
// eps: 100 times this bound.
const synthTol = 3e-4

// TestDistMixedPrecisionMatchesReference: with bf16 and fp16 working
// parameters, at ZeRO 0 and 1, on dp 1 and 2, with gradients averaged in
// fp32 or in the working type: the optimizer keeps the exact initial
// values as fp32 masters of the elements it owns and rounds the
// parameters; after each step the masters are the fp32 reference's (bit
// for bit with fp32 gradients, within synthTol with 16-bit ones), the
// parameters on every rank are the masters rounded to the working type,
// and the memory counts the masters (and the wire buffer).
func TestDistMixedPrecisionMatchesReference(t *testing.T) {
	const steps = 3
	for _, prec := range []comm.DType{comm.BFloat16, comm.Float16} {
		for _, grads := range []comm.DType{comm.Float32, prec} {
			for dp := 1; dp <= 2; dp++ {
				ref := synthReference(dp, grads, steps)
				for stage := range 2 {
					name := fmt.Sprintf("%s/grads=%s/dp%d/zero%d", prec, grads, dp, stage)
					t.Run(name, func(t *testing.T) {
						cfg := DistConfig{Stage: stage, Params: prec, Grads: grads, Optim: synthOptim}
						ranks := runSynth(t, planner.Grid{TP: 1, PP: 1, DP: dp}, cfg, steps, nil)
						for _, k := range ranks {
							checkSynthRank(t, k, prec, grads, dp, ref)
						}
					})
				}
			}
		}
	}
}

// checkSynthRank checks one rank of TestDistMixedPrecisionMatchesReference.
func checkSynthRank(t *testing.T, k *synthRank, prec, grads comm.DType, dp int, ref [][]float32) {
	t.Helper()
	init := synthInit()
	if !slices.Equal(k.initMaster, init[k.lo:k.hi]) || !slices.Equal(k.init, rounded(prec, init)) {
		t.Fatalf("dp rank %d: after NewDist masters %v, parameters %v; want the exact initial values %v as masters and them rounded as parameters", k.coord.DP, k.initMaster, k.init, init[k.lo:k.hi])
	}
	if slices.Equal(k.init, init) {
		t.Fatal("the initial values are representable in the working type: the test would not see rounding")
	}
	owned := int64(k.hi - k.lo)
	wantWire := int64(0)
	if grads != comm.Float32 && dp > 1 {
		wantWire = 2 * synthN
	}
	if k.optBytes != 3*4*owned || k.wire != wantWire {
		t.Errorf("dp rank %d: optimizer %d B, wire buffer %d B; want %d (masters and two moments of %d owned elements) and %d", k.coord.DP, k.optBytes, k.wire, 3*4*owned, owned, wantWire)
	}
	for s, st := range k.steps {
		want := ref[s][k.lo:k.hi]
		if st.res.NonFinite || st.adam != s+1 {
			t.Fatalf("step %d: %+v after %d AdamW steps: want a finite step", s, st.res, st.adam)
		}
		if grads == comm.Float32 && !slices.Equal(st.master, want) {
			t.Errorf("step %d dp rank %d: masters %v, reference %v: want them bit for bit", s, k.coord.DP, st.master, want)
		}
		for i, v := range st.master {
			if math.Abs(float64(v-want[i])) > synthTol {
				t.Errorf("step %d dp rank %d: master %d is %v, reference %v: more than %g apart", s, k.coord.DP, k.lo+i, v, want[i], synthTol)
				break
			}
		}
		if !slices.Equal(st.params[k.lo:k.hi], rounded(prec, st.master)) {
			t.Errorf("step %d dp rank %d: parameters %v, want the masters %v rounded to %s", s, k.coord.DP, st.params[k.lo:k.hi], st.master, prec)
		}
	}
}

// TestDistReplicasAgreeUnderMixedPrecision: at ZeRO-1 each DP rank rounds
// only the masters it owns and the all-gather shares them: every replica
// ends each step with the same parameters bit for bit, all of them values
// of the working type.
func TestDistReplicasAgreeUnderMixedPrecision(t *testing.T) {
	cfg := DistConfig{Stage: 1, Params: comm.BFloat16, Grads: comm.BFloat16, Optim: synthOptim}
	ranks := runSynth(t, planner.Grid{TP: 1, PP: 1, DP: 2}, cfg, 3, nil)
	for s := range 3 {
		p0 := ranks[0].steps[s].params
		if !slices.Equal(ranks[1].steps[s].params, p0) || !slices.Equal(p0, rounded(comm.BFloat16, p0)) {
			t.Fatalf("step %d: dp ranks hold %v and %v: want the same bf16 values", s, p0, ranks[1].steps[s].params)
		}
	}
}

// TestDistFP16OverflowSkipsOnEveryRank: on tp2·pp2·dp2 with fp16 and
// gradients averaged in fp16, one rank (dp 1, pp 1, tp 1) holds a
// gradient of 1e5 (finite in fp32) at step 1, in a tensor it does not
// count in the norm: it overflows fp16 on the wire, and every rank skips
// that step (parameters, masters and AdamW unchanged) and halves its loss
// scale; the other steps update. With fp32 gradients the same value is
// finite and the step is taken.
func TestDistFP16OverflowSkipsOnEveryRank(t *testing.T) {
	const steps, bad, initial = 3, 1, 1024
	grid := planner.Grid{TP: 2, PP: 2, DP: 2}
	spike := func(c planner.Coord, s int, g []float32) {
		if s == bad && c == (planner.Coord{DP: 1, PP: 1, TP: 1}) {
			g[synthTensors[1].Offset] = 1e5
		}
	}
	for stage := range 2 {
		t.Run(fmt.Sprintf("zero%d", stage), func(t *testing.T) {
			cfg := DistConfig{Stage: stage, Params: comm.Float16, Grads: comm.Float16, Optim: synthOptim,
				Scaler: ScalerConfig{InitialScale: initial}}
			ranks := runSynth(t, grid, cfg, steps, spike)
			for r, k := range ranks {
				checkSkipped(t, r, k, bad, []float64{initial, initial / 2, initial / 2})
			}
			cfg.Grads = comm.Float32
			for r, k := range runSynth(t, grid, cfg, steps, spike) {
				if k.skipped != 0 || k.steps[bad].res.NonFinite || k.steps[bad].scale != initial {
					t.Errorf("fp32 gradients: rank %d: step %d %+v, scale %g: want 1e5 taken as a finite gradient", r, bad, k.steps[bad].res, k.steps[bad].scale)
				}
			}
		})
	}
}

// checkSkipped checks that rank r skipped step bad alone, with scales
// after each step as given.
func checkSkipped(t *testing.T, r int, k *synthRank, bad int, scales []float64) {
	t.Helper()
	for s, st := range k.steps {
		if st.scale != scales[s] {
			t.Errorf("rank %d step %d: loss scale %g, want %g", r, s, st.scale, scales[s])
		}
		if skip := s == bad; st.res.Skipped != skip || st.res.NonFinite != skip {
			t.Errorf("rank %d step %d: %+v: want skipped %v", r, s, st.res, skip)
		}
	}
	b, before := k.steps[bad], k.steps[bad-1]
	if !slices.Equal(b.params, before.params) || !slices.Equal(b.master, before.master) || b.adam != before.adam {
		t.Errorf("rank %d: the skipped step changed parameters, masters or AdamW's step (%d → %d)", r, before.adam, b.adam)
	}
	if k.skipped != 1 || slices.Equal(k.steps[bad+1].master, b.master) {
		t.Errorf("rank %d: %d steps skipped, or the step after the overflow did not update", r, k.skipped)
	}
}

// TestDistScalerOverflowAndRestore: Overflow (a loss that was not finite)
// skips and halves as a gradient overflow does, down to the minimum scale
// where it no longer skips; RestoreScaler takes a checkpoint's state and
// refuses a scale that is not positive and finite; without fp16 the scale
// stays 1 and nothing is skipped.
func TestDistScalerOverflowAndRestore(t *testing.T) {
	tr := comm.NewInProc(1)[0]
	defer tr.Close()
	world, err := comm.New(t.Context(), 0, 1, tr, comm.Options{Name: "world"})
	if err != nil {
		t.Fatal(err)
	}
	defer world.Close()
	gs, err := parallel.New(t.Context(), world, planner.Grid{TP: 1, PP: 1, DP: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer gs.Close()
	mk := func(p comm.DType) *DistOptimizer {
		d, err := NewDist(DistConfig{Params: p, Scaler: ScalerConfig{InitialScale: 4, MinScale: 2}, Optim: synthOptim}, gs, synthTensors, synthInit(), make([]float32, synthN))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := mk(comm.Float16)
	if res := d.Overflow(); !res.Skipped || !res.NonFinite || d.LossScale() != 2 {
		t.Fatalf("first overflow: %+v, scale %g: want skipped, scale 2", res, d.LossScale())
	}
	if res := d.Overflow(); res.Skipped || !res.NonFinite || d.LossScale() != 2 || d.Scaler().Skipped != 1 {
		t.Fatalf("overflow at the minimum scale: %+v, scale %g, %d skipped: want not skipped (diverged), scale 2, 1 skipped", res, d.LossScale(), d.Scaler().Skipped)
	}
	d.RestoreScaler(ScalerState{Scale: 512, Good: 3, Skipped: 7})
	d.RestoreScaler(ScalerState{Scale: math.Inf(1)})
	d.RestoreScaler(ScalerState{Scale: 0})
	if got := d.Scaler(); got != (ScalerState{Scale: 512, Good: 3, Skipped: 7}) {
		t.Errorf("restored %+v, want scale 512, good 3, skipped 7", got)
	}
	b := mk(comm.BFloat16)
	if res := b.Overflow(); res.Skipped || b.LossScale() != 1 {
		t.Errorf("bf16: overflow %+v, scale %g: want no loss scaling", res, b.LossScale())
	}
}

// TestNewDistRefusesTypes: a gradient type that is neither fp32 nor the
// parameters' is refused naming the key.
func TestNewDistRefusesTypes(t *testing.T) {
	tr := comm.NewInProc(1)[0]
	defer tr.Close()
	world, err := comm.New(t.Context(), 0, 1, tr, comm.Options{Name: "world"})
	if err != nil {
		t.Fatal(err)
	}
	defer world.Close()
	gs, err := parallel.New(t.Context(), world, planner.Grid{TP: 1, PP: 1, DP: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer gs.Close()
	cfg := DistConfig{Params: comm.BFloat16, Grads: comm.Float16, Optim: synthOptim}
	if _, err := NewDist(cfg, gs, synthTensors, synthInit(), make([]float32, synthN)); err == nil || !strings.Contains(err.Error(), "set parallel.grad_dtype to fp32 or to the precision") {
		t.Errorf("bf16 parameters with fp16 gradients: %v, want a refusal naming parallel.grad_dtype", err)
	}
}
