package kernels

import (
	"maps"
	"math"
	"slices"
	"testing"
)

// backwardCase runs one backward kernel with the given thread count into
// freshly allocated gradient buffers pre-filled with init, and returns them.
type backwardCase struct {
	name string
	run  func(threads int, init float32) [][]float32
}

// backwardCases builds every backward kernel on shapes large enough to give
// each of three goroutines several rows (or heads, or columns).
func backwardCases() []backwardCase {
	r := newRand(30)
	const B, T, C, NH, V, N = 2, 67, 12, 3, 37, 2 * 67
	inp := randTokens(r, B*T, V)
	x, w := randSlice(r, N*C, 2), randSlice(r, N*C, 1)
	weight, mean, rstd := randSlice(r, C, 1), make([]float32, N), make([]float32, N)
	LayerNormForward(1, make([]float32, N*C), mean, rstd, x, weight, randSlice(r, C, 1), N, C)
	qkv, dout := randSlice(r, B*T*3*C, 1), randSlice(r, B*T*C, 1)
	att := make([]float32, B*NH*T*T)
	AttentionForward(1, make([]float32, B*T*C), att, qkv, B, T, C, NH)
	return []backwardCase{
		{"Encoder", func(_ int, init float32) [][]float32 {
			dwte, dwpe := filled(V*C, init), filled(T*C, init)
			EncoderBackward(dwte, dwpe, w, inp, B, T, C)
			return [][]float32{dwte, dwpe}
		}},
		{"LayerNorm", func(threads int, init float32) [][]float32 {
			dinp, dw, db := filled(N*C, init), filled(C, init), filled(C, init)
			LayerNormBackward(threads, dinp, dw, db, w, x, weight, mean, rstd, N, C)
			return [][]float32{dinp, dw, db}
		}},
		{"Gelu", func(threads int, init float32) [][]float32 {
			dinp := filled(N*C, init)
			GeluBackward(threads, dinp, x, w)
			return [][]float32{dinp}
		}},
		{"Bias", func(threads int, init float32) [][]float32 {
			db := filled(C, init)
			BiasBackwardThreads(threads, db, w, N, C)
			return [][]float32{db}
		}},
		{"Attention", func(threads int, init float32) [][]float32 {
			dqkv := filled(len(qkv), init)
			scratch := filled(AttentionScratch(threads, T), float32(math.NaN())) // contents must not matter
			AttentionBackward(threads, dqkv, dout, qkv, att, scratch, B, T, C, NH)
			return [][]float32{dqkv}
		}},
	}
}

func TestBackwardAccumulates(t *testing.T) {
	for _, c := range backwardCases() {
		t.Run(c.name, func(t *testing.T) {
			fresh, acc := c.run(1, 0), c.run(1, 0.5)
			for k := range fresh {
				for i := range fresh[k] {
					// One rounding of 0.5 + g, whichever way it happens.
					want := 0.5 + float64(fresh[k][i])
					if d := math.Abs(float64(acc[k][i]) - want); d > 1e-6*(1+math.Abs(want)) {
						t.Fatalf("grad %d[%d] = %g after pre-filling 0.5, want 0.5 + %g", k, i, acc[k][i], fresh[k][i])
					}
				}
			}
		})
	}
}

func TestCrossEntropyBackwardWrites(t *testing.T) {
	r := newRand(31)
	N, V := 3, 50
	logits, targets := randSlice(r, N*V, 3), randTokens(r, N, V)
	probs := make([]float32, N*V)
	CrossEntropyForward(1, make([]float32, N), probs, logits, targets, N, V)
	d := filled(N*V, float32(math.NaN()))
	CrossEntropyBackward(1, d, probs, targets, 0.25, N, V)
	want := make([]float64, N*V)
	for i := range want {
		want[i] = float64(probs[i]) * 0.25
		if int32(i%V) == targets[i/V] {
			want[i] = (float64(probs[i]) - 1) * 0.25
		}
	}
	assertClose(t, "dlogits", d, want, 1e-9, 1e-6)
	CrossEntropyBackward(1, probs, probs, targets, 0.25, N, V) // in place
	assertSame(t, "dlogits (aliased)", probs, d)
}

func TestBackwardThreadsAgree(t *testing.T) {
	lowerParallelThreshold(t)
	for _, c := range backwardCases() {
		t.Run(c.name, func(t *testing.T) {
			one := c.run(1, 0.25)
			for _, threads := range []int{2, 3} {
				got := c.run(threads, 0.25)
				for k := range one {
					assertSame(t, c.name, got[k], one[k])
				}
			}
		})
	}
}

func TestForwardThreadsAgree(t *testing.T) {
	lowerParallelThreshold(t)
	r := newRand(32)
	const B, T, C, NH, V, N = 2, 67, 12, 3, 37, 2 * 67
	x, weight, bias := randSlice(r, N*C, 2), randSlice(r, C, 1), randSlice(r, C, 1)
	qkv, logits, targets := randSlice(r, B*T*3*C, 1), randSlice(r, N*V, 3), randTokens(r, N, V)
	run := func(threads int) [][]float32 {
		ln, mean, rstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
		LayerNormForward(threads, ln, mean, rstd, x, weight, bias, N, C)
		g := make([]float32, N*C)
		GeluForward(threads, g, x)
		out, att := make([]float32, B*T*C), make([]float32, B*NH*T*T)
		AttentionForward(threads, out, att, qkv, B, T, C, NH)
		losses, probs := make([]float32, N), make([]float32, N*V)
		CrossEntropyForward(threads, losses, probs, logits, targets, N, V)
		dlogits := make([]float32, N*V)
		CrossEntropyBackward(threads, dlogits, probs, targets, 1/float32(N), N, V)
		return [][]float32{ln, mean, rstd, g, out, att, losses, probs, dlogits}
	}
	one := run(1)
	for _, threads := range []int{2, 3} {
		got := run(threads)
		for k := range one {
			assertSame(t, "output", got[k], one[k])
		}
	}
}

// TestDefaultThresholdParallel runs LayerNorm and GELU above the default
// 64K-element threshold, so their parallel split is exercised as shipped.
func TestDefaultThresholdParallel(t *testing.T) {
	r := newRand(33)
	N, C := 96, 768
	x, w, dout := randSlice(r, N*C, 2), randSlice(r, C, 1), randSlice(r, N*C, 1)
	run := func(threads int) [][]float32 {
		out, mean, rstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
		LayerNormForward(threads, out, mean, rstd, x, w, w, N, C)
		dinp, dw, db := make([]float32, N*C), make([]float32, C), make([]float32, C)
		LayerNormBackward(threads, dinp, dw, db, dout, x, w, mean, rstd, N, C)
		g := make([]float32, N*C)
		GeluForward(threads, g, x)
		GeluBackward(threads, dinp, x, dout)
		return [][]float32{out, dinp, dw, db, g}
	}
	one, two := run(1), run(2)
	for k := range one {
		assertSame(t, "output", two[k], one[k])
	}
}

func TestNoAllocations(t *testing.T) {
	if raceEnabled {
		// Sgemm keeps its per-call state in a sync.Pool, which the race
		// detector empties at random on purpose.
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	r := newRand(34)
	const B, T, C, NH, V, N = 1, 16, 8, 2, 11, 16
	inp, targets := randTokens(r, N, V), randTokens(r, N, V)
	x, y, out := randSlice(r, N*C, 1), randSlice(r, N*C, 1), make([]float32, N*C)
	wte, wpe, w, dw := randSlice(r, V*C, 1), randSlice(r, T*C, 1), randSlice(r, C, 1), make([]float32, V*C)
	mean, rstd := make([]float32, N), make([]float32, N)
	qkv, dqkv, att := randSlice(r, N*3*C, 1), make([]float32, N*3*C), make([]float32, NH*T*T)
	scratch, logits, probs := make([]float32, AttentionScratch(1, T)), randSlice(r, N*V, 1), make([]float32, N*V)
	ops := map[string]func(){
		"Encoder": func() { EncoderForward(out, inp, wte, wpe, B, T, C); EncoderBackward(dw, wpe, x, inp, B, T, C) },
		"LayerNorm": func() {
			LayerNormForward(1, out, mean, rstd, x, w, w, N, C)
			LayerNormBackward(1, y, w, w, x, x, w, mean, rstd, N, C)
		},
		"Gelu": func() { GeluForward(1, out, x); GeluBackward(1, y, x, out) },
		"Bias": func() { AddBias(out, w, N, C); BiasBackward(w, x, N, C); Residual(out, x, y) },
		"Attention": func() {
			AttentionForward(1, out, att, qkv, B, T, C, NH)
			AttentionBackward(1, dqkv, out, qkv, att, scratch, B, T, C, NH)
		},
		"CrossEntropy": func() {
			CrossEntropyForward(1, mean, probs, logits, targets, N, V)
			CrossEntropyBackward(1, probs, probs, targets, 1, N, V)
		},
	}
	for _, name := range slices.Sorted(maps.Keys(ops)) {
		if n := testing.AllocsPerRun(5, ops[name]); n != 0 {
			t.Errorf("%s: %.0f allocations per call on one goroutine, want 0", name, n)
		}
	}
}
