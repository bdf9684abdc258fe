package optim

import (
	"math"
	"sync"
)

// minThreadWork is the fewest parameters each goroutine of
// UpdatePartsThreads gets: starting one costs microseconds, which the
// update of this many (about 50 µs) pays for. Tests lower it.
var minThreadWork = 1 << 16

// UpdatePartsThreads is UpdateParts with the parts' elements shared
// among threads goroutines (one below 2, or with too few elements). An
// element's update reads that element alone, so the parameters and
// moments come out the same, bit for bit, however they are split. AdamW
// is memory bound and ran on one goroutine while the rank's other
// threads waited.
func (o *AdamW) UpdatePartsThreads(threads int, parts []Part, lr float64, gradScale float32) {
	total := 0
	for _, pt := range parts {
		total += len(pt.P)
	}
	nw := min(threads, total/minThreadWork)
	if nw < 2 {
		o.UpdateParts(parts, lr, gradScale)
		return
	}
	o.Step++
	k, decay := o.constants(lr, gradScale)
	var wg sync.WaitGroup
	for w := 1; w < nw; w++ {
		wg.Go(func() { o.updateRange(parts, k, decay, w*total/nw, (w+1)*total/nw) })
	}
	o.updateRange(parts, k, decay, 0, total/nw)
	wg.Wait()
}

// Stepper is one AdamW step begun (Begin) and applied part by part
// (Update), for a caller that produces the gradients a block at a time:
// engine/zero decodes bf16 gradients into a small buffer per block
// instead of into a copy of them all.
type Stepper struct {
	o     *AdamW
	k     adamwK
	decay float32
}

// Begin counts a step and returns its update at lr with the gradients
// multiplied by gradScale, as UpdateParts applies it.
func (o *AdamW) Begin(lr float64, gradScale float32) Stepper {
	o.Step++
	k, decay := o.constants(lr, gradScale)
	return Stepper{o, k, decay}
}

// Update applies the step to pt: any run of the parameters, each once per
// step, from any goroutine (runs must not overlap). The result is
// UpdateParts', bit for bit, however the parameters are cut.
func (s Stepper) Update(pt Part) {
	k := s.k
	if pt.Decay {
		k.decay = s.decay
	}
	o, n := s.o, len(pt.P)
	adamwUpdate(pt.P, pt.G[:n], o.M[pt.At:pt.At+n], o.V[pt.At:pt.At+n], &k)
}

// constants are the update's factors at the current Step: k with decay
// 1, and the decay factor of the parts that decay.
func (o *AdamW) constants(lr float64, gradScale float32) (k adamwK, decay float32) {
	c := o.Config
	b1, b2 := float32(c.Beta1), float32(c.Beta2)
	bc1 := float32(1 - math.Pow(c.Beta1, float64(o.Step)))
	bc2 := float32(1 - math.Pow(c.Beta2, float64(o.Step)))
	k = adamwK{scale: gradScale, b1: b1, omb1: 1 - b1, b2: b2, omb2: 1 - b2,
		sqrtBC2: float32(math.Sqrt(float64(bc2))), eps: float32(c.Eps), decay: 1, stepSize: float32(lr) / bc1}
	return k, float32(1 - lr*c.WeightDecay)
}

// updateRange updates elements [lo, hi) of the parts laid end to end.
func (o *AdamW) updateRange(parts []Part, k adamwK, decay float32, lo, hi int) {
	at := 0 // where the part starts, counted over the parts before it
	for _, pt := range parts {
		n := len(pt.P)
		s, e := max(lo, at)-at, min(hi, at+n)-at
		at += n
		if s >= e {
			continue
		}
		k.decay = 1
		if pt.Decay {
			k.decay = decay
		}
		adamwUpdate(pt.P[s:e], pt.G[s:e], o.M[pt.At+s:pt.At+e], o.V[pt.At+s:pt.At+e], &k)
	}
}
