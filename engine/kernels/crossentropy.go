package kernels

import "math"

// CrossEntropyForward computes, for each of the N rows of logits (N,V), the
// softmax probs (N,V) and the loss losses[i] = -log probs[i, targets[i]].
// probs is saved for CrossEntropyBackward; it may alias logits. Rows are
// shared among up to threads goroutines when there are at least 64K values.
//
// Stability and precision: each row has its maximum subtracted before
// exponentiation, so no term exceeds 1; the sum of the V exponentials
// (50257 for GPT-2) is accumulated in float64, where float32 would lose
// about log10(V) digits; and the loss is log(sum) - (logit - max) in
// float64, which stays finite and accurate even when the target's
// probability underflows float32.
func CrossEntropyForward(threads int, losses, probs, logits []float32, targets []int32, N, V int) {
	if nw := workersFor(threads, N, N*V); nw > 1 {
		parallelFor(nw, N, func(_, lo, hi int) {
			crossEntropyRows(losses, probs, logits, targets, lo, hi, V)
		})
		return
	}
	crossEntropyRows(losses, probs, logits, targets, 0, N, V)
}

// crossEntropyRows is CrossEntropyForward for rows [lo, hi).
func crossEntropyRows(losses, probs, logits []float32, targets []int32, lo, hi, V int) {
	for n := lo; n < hi; n++ {
		l := logits[n*V : n*V+V]
		p := probs[n*V : n*V+V]
		p = p[:len(l)]
		target := l[targets[n]] // read before p, which may alias l, is written
		mx := max32(l)
		for i, v := range l {
			p[i] = v - mx
		}
		expInPlace(p)
		sum := sum64(p)
		inv := float32(1 / sum)
		for i := range p {
			p[i] *= inv
		}
		losses[n] = float32(math.Log(sum) - (float64(target) - float64(mx)))
	}
}

// CrossEntropyBackward writes dlogits = (probs - onehot(targets))·dloss for
// the N rows of V classes, where dloss is the gradient of the total loss
// with respect to each row's loss (1/N for a mean). Unlike the other
// backward kernels it overwrites dlogits rather than accumulating, so that
// dlogits may alias probs and the (N,V) buffer, the largest activation of
// the model, is reused in place.
func CrossEntropyBackward(threads int, dlogits, probs []float32, targets []int32, dloss float32, N, V int) {
	if nw := workersFor(threads, N, N*V); nw > 1 {
		parallelFor(nw, N, func(_, lo, hi int) {
			crossEntropyBackwardRows(dlogits, probs, targets, dloss, lo, hi, V)
		})
		return
	}
	crossEntropyBackwardRows(dlogits, probs, targets, dloss, 0, N, V)
}

// crossEntropyBackwardRows is CrossEntropyBackward for rows [lo, hi).
func crossEntropyBackwardRows(dlogits, probs []float32, targets []int32, dloss float32, lo, hi, V int) {
	for n := lo; n < hi; n++ {
		p := probs[n*V : n*V+V]
		d := dlogits[n*V : n*V+V]
		d = d[:len(p)]
		t := targets[n]
		pt := p[t] // read before d, which may alias p, is written
		for i, v := range p {
			d[i] = v * dloss
		}
		d[t] = (pt - 1) * dloss
	}
}
