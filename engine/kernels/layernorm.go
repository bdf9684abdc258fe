package kernels

import "math"

// lnEps is added to the variance before the square root, as torch's and
// GPT-2's LayerNorm default.
const lnEps = 1e-5

// LayerNormForward normalises each of the N rows of inp (N,C) to zero mean
// and unit variance (biased, as torch), then scales by weight (C) and shifts
// by bias (C), writing out (N,C). It saves each row's mean and 1/sqrt(var +
// 1e-5) in mean and rstd (N) for LayerNormBackward. Rows are shared among up
// to threads goroutines when there are at least 64K values.
//
// Precision: mean and variance are accumulated in float32 (four partial
// sums), as llm.c does; the variance is taken in a second pass over x-mean,
// so there is no cancellation, and over C ≤ 1600 the relative error stays
// near 1e-6.
func LayerNormForward(threads int, out, mean, rstd, inp, weight, bias []float32, N, C int) {
	if nw := workersFor(threads, N, N*C); nw > 1 {
		parallelFor(nw, N, func(_, lo, hi int) {
			layerNormRows(out, mean, rstd, inp, weight, bias, lo, hi, C)
		})
		return
	}
	layerNormRows(out, mean, rstd, inp, weight, bias, 0, N, C)
}

// layerNormRows is LayerNormForward for rows [lo, hi).
func layerNormRows(out, mean, rstd, inp, weight, bias []float32, lo, hi, C int) {
	weight, bias = weight[:C], bias[:C]
	for n := lo; n < hi; n++ {
		x := inp[n*C : n*C+C]
		m := sum32(x) / float32(C)
		var v0, v1, v2, v3 float32
		i := 0
		for ; i+4 <= C; i += 4 {
			d := x[i : i+4 : i+4]
			d0, d1, d2, d3 := d[0]-m, d[1]-m, d[2]-m, d[3]-m
			v0 += d0 * d0
			v1 += d1 * d1
			v2 += d2 * d2
			v3 += d3 * d3
		}
		for ; i < C; i++ {
			d := x[i] - m
			v0 += d * d
		}
		v := ((v0 + v1) + (v2 + v3)) / float32(C)
		s := float32(1 / math.Sqrt(float64(v)+lnEps))
		lnOut(out[n*C:n*C+C], x, weight, bias, m, s)
		mean[n], rstd[n] = m, s
	}
}

// LayerNormBackward adds the gradients of LayerNormForward to dinp (N,C),
// dweight (C) and dbias (C), given dout (N,C) and the inp, weight, mean and
// rstd of the forward pass. It accumulates into all three.
//
// On one goroutine it makes a single pass over the rows. With more, rows of
// dinp are split among the goroutines and so are the columns of dweight and
// dbias (each goroutine sums its columns over all rows, in row order), so
// there is no shared accumulator and no scratch buffer, and the result is
// bit-for-bit the same for any thread count.
func LayerNormBackward(threads int, dinp, dweight, dbias, dout, inp, weight, mean, rstd []float32, N, C int) {
	// nw is never reassigned, so the closure copies it; a variable it had to
	// share would be moved to the heap on every call, parallel or not.
	nw := min(workersFor(threads, N, N*C), C)
	if nw > 1 {
		parallelFor(nw, N, func(w, lo, hi int) {
			layerNormInputGrad(dinp, nil, nil, dout, inp, weight, mean, rstd, lo, hi, C)
			c0, c1 := chunk(C, nw, w)
			for n := 0; n < N; n++ {
				row := n * C
				lnParamGradRow(dweight[c0:c1], dbias[c0:c1], dout[row+c0:row+c1], inp[row+c0:row+c1], mean[n], rstd[n])
			}
		})
		return
	}
	layerNormInputGrad(dinp, dweight, dbias, dout, inp, weight, mean, rstd, 0, N, C)
}

// layerNormInputGrad adds the gradient of rows [lo, hi) to dinp and, if
// dweight is not nil, their share of dweight and dbias as well.
func layerNormInputGrad(dinp, dweight, dbias, dout, inp, weight, mean, rstd []float32, lo, hi, C int) {
	weight = weight[:C]
	for n := lo; n < hi; n++ {
		x, d := inp[n*C:n*C+C], dout[n*C:n*C+C]
		m, s := mean[n], rstd[n]
		d, w := d[:len(x)], weight[:len(x)]
		// dnorm = w·dout is the gradient at the normalised value; the input
		// gradient removes its mean and its projection on xhat.
		var a0, a1, b0, b1 float32
		i := 0
		for ; i+2 <= C; i += 2 {
			g0, g1 := w[i]*d[i], w[i+1]*d[i+1]
			a0 += g0
			a1 += g1
			b0 += g0 * ((x[i] - m) * s)
			b1 += g1 * ((x[i+1] - m) * s)
		}
		for ; i < C; i++ {
			g := w[i] * d[i]
			a0 += g
			b0 += g * ((x[i] - m) * s)
		}
		gMean := (a0 + a1) / float32(C)
		gxMean := (b0 + b1) / float32(C)
		lnGradOut(dinp[n*C:n*C+C], x, w, d, m, s, gMean, gxMean)
		if dweight != nil {
			lnParamGradRow(dweight, dbias, d, x, m, s)
		}
	}
}

// lnParamGradRow adds one row's contribution to dweight and dbias (or to a
// column range of them, given the matching ranges of the row). Both code
// paths of LayerNormBackward go through it so that they round alike; the
// float32 conversion keeps the compiler from fusing the multiply-add on one
// path and not the other.
func lnParamGradRow(dweight, dbias, d, x []float32, m, s float32) {
	lnParamGrad(dweight, dbias, d, x, m, s)
}
