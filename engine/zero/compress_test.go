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
	"github.com/gtrain/gtrain/engine/comm/commtest"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/engine/optim"
)

func TestParseCompression(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Compression
		err  string // a part of the error; empty: accepted
	}{
		{"", Compression{}, ""},
		{"none", Compression{}, ""},
		{"int8", Compression{Kind: CompressInt8}, ""},
		{"powersgd:4", Compression{Kind: CompressPowerSGD, Rank: 4}, ""},
		{" PowerSGD:1 ", Compression{Kind: CompressPowerSGD, Rank: 1}, ""},
		{"powersgd:0", Compression{}, `"powersgd:0": the rank must be a whole number from 1 to 1024`},
		{"powersgd:abc", Compression{}, `"powersgd:abc": the rank must be`},
		{"powersgd:-2", Compression{}, `"powersgd:-2": the rank must be`},
		{"powersgd:5000", Compression{}, `"powersgd:5000": the rank must be`},
		{"powersgd", Compression{}, "give the rank, e.g. powersgd:4"},
		{"int9", Compression{}, `"int9": want none, int8 or powersgd:RANK`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseCompression(tc.in)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			case got != tc.want:
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestCompressionRefusedAtStage2And3: the reduce-scatter of stages 2–3
// does not compose with compression: Validate says so.
func TestCompressionRefusedAtStage2And3(t *testing.T) {
	for _, stage := range []int{0, 1, 2, 3} {
		cfg := Config{Stage: stage, Params: comm.Float32, Grads: comm.Float32, Compress: Compression{Kind: CompressInt8}}
		err := cfg.Validate()
		if stage < 2 && err != nil {
			t.Errorf("stage %d refused: %v", stage, err)
		}
		if stage >= 2 && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("ZeRO stage %d", stage))) {
			t.Errorf("stage %d: error %v, want a refusal naming the stage", stage, err)
		}
	}
}

// TestInt8Roundtrip: every decoded value is within half a quantisation
// step (its block's absmax/254) of the original, the pack decodes to what
// quantize said, a zero block is exact, and a block with NaN or Inf
// decodes to NaN, so that the step's finite check sees it.
func TestInt8Roundtrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 3, 255, 256, 257, 1000} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * math.Pow(10, float64(i/256%3)-1)) // blocks of other magnitudes
		}
		pk, deq, back := make([]float32, packWords(n)), make([]float32, n), make([]float32, n)
		quantize(pk, x, deq)
		dequantize(back, pk)
		if !slices.Equal(back, deq) {
			t.Fatalf("n=%d: the pack decodes to other values than quantize reported", n)
		}
		for b := 0; b < n; b += Int8Block {
			blk := x[b:min(n, b+Int8Block)]
			var amax float64
			for _, v := range blk {
				amax = max(amax, math.Abs(float64(v)))
			}
			for i, v := range blk {
				if d := math.Abs(float64(v) - float64(deq[b+i])); d > amax/254*(1+1e-5) {
					t.Fatalf("n=%d: value %d: %v decoded as %v (error %g, bound %g)", n, b+i, v, deq[b+i], d, amax/254)
				}
			}
		}
	}
	zero := make([]float32, 300)
	deq := make([]float32, 300)
	quantize(make([]float32, packWords(300)), zero, deq)
	if slices.ContainsFunc(deq, func(v float32) bool { return v != 0 }) {
		t.Errorf("zeros decode as %v", deq)
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		x := []float32{1, bad, 2}
		quantize(make([]float32, packWords(3)), x, deq[:3])
		if !math.IsNaN(float64(deq[0])) || !math.IsNaN(float64(deq[2])) {
			t.Errorf("a block holding %v decodes as %v, want NaN", bad, deq[:3])
		}
	}
}

// onComms runs f on n in-process ranks, each with its communicator.
func onComms(t *testing.T, n int, f func(ctx context.Context, r int, c *comm.Communicator) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute) // a backstop: a failing rank cancels the others
	defer cancel()
	trs := comm.NewInProc(n)
	commtest.Must(t, n, cancel, func(r int) error {
		c, err := comm.New(ctx, r, n, trs[r], comm.Options{Name: "dp", Timeout: 2 * time.Minute})
		if err != nil {
			return err
		}
		defer c.Close()
		return f(ctx, r, c)
	})
}

// reduceAll runs one step's compressed reduction of every bucket of x.
func reduceAll(ctx context.Context, z *compressor, x []float32, scale float32) error {
	for i, s := range z.segs {
		z.submit(job{ctx: ctx, seg: i, g: comm.F32(x[s.Offset : s.Offset+s.Size]), scale: scale})
	}
	return z.wait()
}

// TestPowerSGDExactForLowRank: when the ranks' mean gradient matrix has
// rank at most r, PowerSGD at rank r reproduces it (within float32
// rounding), the 1-D tensor and the matrix too small to compress travel
// whole, and every rank gets the same bits.
func TestPowerSGDExactForLowRank(t *testing.T) {
	params := []model.Param{
		{Name: "w", Shape: []int{40, 30}, Offset: 0},
		{Name: "b", Shape: []int{30}, Offset: 1200},
		{Name: "small", Shape: []int{3, 4}, Offset: 1230}, // 12 <= 2·(3+4)·3: sent whole
	}
	segs := []Segment{{Offset: 0, Size: 1242, First: 0, Last: 0}}
	if _, ok := compressible(params[2], 4); ok {
		t.Fatal("a 3×4 matrix is compressed at rank 4")
	}
	for _, tc := range []struct{ dp, rank, k int }{{2, 4, 4}, {2, 4, 1}, {4, 2, 2}, {3, 3, 1}} {
		t.Run(fmt.Sprintf("dp%d/rank%d/mean of rank %d", tc.dp, tc.rank, tc.k), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.k), 7))
			a, b := randn(rng, 40*tc.k), randn(rng, 30*tc.k)
			lowRankW := make([]float32, 1200) // a·bᵀ
			for i := range 40 {
				for j := range 30 {
					for k := range tc.k {
						lowRankW[i*30+j] += a[i*tc.k+k] * b[j*tc.k+k]
					}
				}
			}
			grads := make([][]float32, tc.dp)
			want := make([]float64, 1242)
			for r := range grads {
				g := randn(rng, 1242)
				f := float32(r + 1) // rank r's matrix is (r+1)·a·bᵀ: the mean has rank k
				for i := range 1200 {
					g[i] = f * lowRankW[i]
				}
				for i, v := range g {
					want[i] += float64(v) / float64(tc.dp)
				}
				grads[r] = g
			}
			onComms(t, tc.dp, func(ctx context.Context, r int, c *comm.Communicator) error {
				z := newCompressor(Compression{Kind: CompressPowerSGD, Rank: tc.rank}, c, segs, params, 1242)
				return reduceAll(ctx, z, grads[r], 1)
			})
			for r := 1; r < tc.dp; r++ {
				if !slices.Equal(grads[r], grads[0]) {
					t.Fatalf("rank %d's reduced gradients differ from rank 0's", r)
				}
			}
			var wmax float64
			for _, v := range want[:1200] {
				wmax = max(wmax, math.Abs(v))
			}
			for i, v := range grads[0] {
				tol := 1e-6 // whole: roundings of a sum of dp values of about 1
				if i < 1200 {
					tol = 1e-5 * wmax
				}
				if d := math.Abs(float64(v) - want[i]); d > tol+1e-12 {
					t.Fatalf("element %d: %v, the mean is %v (difference %g, tolerance %g)", i, v, want[i], d, tol)
				}
			}
		})
	}
}

func randn(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// TestErrorFeedbackIsUnbiased: over steps, the sum of the updates every
// rank received plus the ranks' mean residual (and int8's residuals of
// the re-quantised sums, each held by the rank that summed) equals the
// sum of the true mean gradients, within float rounding: nothing a
// compressed step leaves out is lost, only delayed. The updates are the
// same bits on every rank at every step. Without error feedback the
// difference is the size of the gradients themselves.
func TestErrorFeedbackIsUnbiased(t *testing.T) {
	cfg := testCfg
	params, n := cfg.Params(), cfg.NumParams()
	segs := Buckets(cfg.Units(), 300, 900)
	const steps = 6
	for _, kind := range []Compression{{Kind: CompressPowerSGD, Rank: 2}, {Kind: CompressInt8}} {
		for _, dp := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s/dp%d", kind, dp), func(t *testing.T) {
				truth := make([]float64, n)
				grads := make([][][]float32, steps) // [step][rank]
				rng := rand.New(rand.NewPCG(uint64(dp), 3))
				for s := range grads {
					grads[s] = make([][]float32, dp)
					for r := range dp {
						grads[s][r] = randn(rng, n)
						for i, v := range grads[s][r] {
							truth[i] += float64(v) / float64(dp)
						}
					}
				}
				sums := make([][]float64, dp)
				left := make([]float64, n) // the residuals' part of the balance
				var mu sync.Mutex
				onComms(t, dp, func(ctx context.Context, r int, c *comm.Communicator) error {
					z := newCompressor(kind, c, segs, params, n)
					if z.low != nil && len(z.low.mats) < 2 {
						return fmt.Errorf("PowerSGD compresses %d matrices of the test model, want several", len(z.low.mats))
					}
					sums[r] = make([]float64, n)
					for s := range steps {
						if err := reduceAll(ctx, z, grads[s][r], 1); err != nil {
							return err
						}
						for i, v := range grads[s][r] {
							sums[r][i] += float64(v)
						}
					}
					mu.Lock()
					defer mu.Unlock()
					addResiduals(left, z, segs, dp)
					return nil
				})
				for s := range steps {
					for r := 1; r < dp; r++ {
						if !slices.Equal(grads[s][r], grads[s][0]) {
							t.Fatalf("step %d: rank %d's update differs from rank 0's", s, r)
						}
					}
				}
				var worst, scale float64
				for i := range n {
					worst = max(worst, math.Abs(sums[0][i]+left[i]-truth[i]))
					scale = max(scale, math.Abs(truth[i]), math.Abs(left[i]))
				}
				if worst > 1e-5*scale*steps {
					t.Fatalf("updates + residuals differ from the true gradients' sum by up to %g (scale %g)", worst, scale)
				}
			})
		}
	}
}

// addResiduals adds z's share of the residuals to left: its residual over
// the ranks dp, and the residuals of the chunk sums it re-quantised.
func addResiduals(left []float64, z *compressor, segs []Segment, dp int) {
	for i, v := range z.resid {
		left[i] += float64(v) / float64(dp)
	}
	if z.q8 == nil {
		return
	}
	for si, s := range segs {
		lo, hi := comm.Block(s.Size, z.c.Rank(), dp)
		for k := range hi - lo {
			left[s.Offset+lo+k] += float64(z.q8.resid[z.q8.at[si]+k])
		}
	}
}

// TestNonFiniteStepClearsCompressionState: a step whose gradient holds Inf
// updates nothing and clears the residuals (which error feedback would
// otherwise add to every later step), for fp16 with a loss scale too, and
// the next clean step updates with finite values, on every rank alike.
func TestNonFiniteStepClearsCompressionState(t *testing.T) {
	for _, tc := range []struct {
		c    Compression
		prec comm.DType
	}{{Compression{Kind: CompressInt8}, comm.Float32}, {Compression{Kind: CompressPowerSGD, Rank: 2}, comm.Float16}} {
		t.Run(fmt.Sprintf("%s/%s", tc.c, tc.prec), func(t *testing.T) {
			onComms(t, 2, func(ctx context.Context, r int, c *comm.Communicator) error {
				flat := make([]float32, testCfg.NumParams())
				model.InitParams(testCfg, 1, flat)
				cfg := Config{Stage: 0, Params: tc.prec, Grads: tc.prec, FirstBucket: 300, Bucket: 900, Compress: tc.c,
					Optim: optim.Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}
				e, err := New(cfg, testCfg, c, flat)
				if err != nil {
					return err
				}
				e.Bind(ctx)
				rng := rand.New(rand.NewPCG(uint64(r), 5))
				step := func(bad bool) (StepResult, error) {
					e.BeginMicro(0, 1)
					for u := len(testCfg.Units()) - 1; u >= 0; u-- {
						g := e.Grads(u)
						for i := range g {
							g[i] = float32(rng.NormFloat64()) * 0.01
						}
						if bad && u == 1 && r == 1 {
							g[3] = float32(math.Inf(1))
						}
						e.GradsDone(u)
					}
					return e.Step(1e-3)
				}
				if res, err := step(false); err != nil || res.NonFinite {
					return fmt.Errorf("clean step: %+v, %v", res, err)
				}
				if !slices.ContainsFunc(e.cz.resid, func(v float32) bool { return v != 0 }) {
					return fmt.Errorf("no residual after a compressed step: nothing to clear")
				}
				if res, err := step(true); err != nil || !res.NonFinite {
					return fmt.Errorf("step with an infinite gradient: %+v, %v; want it non-finite", res, err)
				}
				if slices.ContainsFunc(e.cz.resid, func(v float32) bool { return v != 0 }) {
					return fmt.Errorf("the residuals survived a non-finite step")
				}
				res, err := step(false)
				if err != nil || res.NonFinite || math.IsNaN(res.Norm) {
					return fmt.Errorf("clean step after the non-finite one: %+v, %v", res, err)
				}
				return nil
			})
		})
	}
}

// TestReshardKeepsWhatWasNotApplied: the residuals of dp 2 (after steps
// of both kinds) resharded onto dp 3 and back onto dp 2 keep the ranks'
// mean residual and, for int8, every chunk-sum residual in its place: the
// balance of TestErrorFeedbackIsUnbiased holds across the change.
func TestReshardKeepsWhatWasNotApplied(t *testing.T) {
	cfg := testCfg
	params, n := cfg.Params(), cfg.NumParams()
	segs := Buckets(cfg.Units(), 300, 900)
	for _, kind := range []Compression{{Kind: CompressPowerSGD, Rank: 2}, {Kind: CompressInt8}} {
		t.Run(kind.String(), func(t *testing.T) {
			saved := map[string][]float32{}
			var mu sync.Mutex
			save := func(z *compressor) {
				mu.Lock()
				defer mu.Unlock()
				for _, ts := range z.shard() {
					saved[ts.Name] = slices.Clone(ts.Data)
				}
			}
			read := func(name string, shape []int, dst []float32) (bool, error) {
				v, ok := saved[name]
				if !ok || len(v) != len(dst) {
					return false, nil
				}
				copy(dst, v)
				return true, nil
			}
			balance := func(dp int, zs []*compressor) []float64 {
				left := make([]float64, n)
				for _, z := range zs {
					addResiduals(left, z, segs, dp)
				}
				return left
			}
			orig := make([]*compressor, 2)
			onComms(t, 2, func(ctx context.Context, r int, c *comm.Communicator) error {
				z := newCompressor(kind, c, segs, params, n)
				orig[r] = z
				rng := rand.New(rand.NewPCG(uint64(r), 9))
				for range 3 {
					if err := reduceAll(ctx, z, randn(rng, n), 1); err != nil {
						return err
					}
				}
				save(z)
				return nil
			})
			hop := func(from, to int) []float64 {
				zs := make([]*compressor, to)
				onComms(t, to, func(ctx context.Context, r int, c *comm.Communicator) error {
					zs[r] = newCompressor(kind, c, segs, params, n)
					if ok, err := zs[r].reshard(from, read); err != nil || !ok {
						return fmt.Errorf("reshard from dp %d: %v, %v", from, ok, err)
					}
					return nil
				})
				clear(saved)
				for _, z := range zs {
					save(z)
				}
				return balance(to, zs)
			}
			want := balance(2, orig)
			if !slices.ContainsFunc(want, func(v float64) bool { return v != 0 }) {
				t.Fatal("no residual saved: nothing to reshard")
			}
			for _, to := range []int{3, 2} {
				got := hop(map[int]int{3: 2, 2: 3}[to], to)
				for i := range got {
					if d := math.Abs(got[i] - want[i]); d > 1e-6*(1+math.Abs(want[i])) {
						t.Fatalf("dp %d: element %d: balance %g, before %g", to, i, got[i], want[i])
					}
				}
			}
		})
	}
}
