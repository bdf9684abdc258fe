package kernels

// biasBlock is the column width BiasBackward sums at a time: 256 float64
// partial sums (2 KB) stay on the stack and in L1 while the rows stream past.
const biasBlock = 256

// AddBias adds bias (OC) to every row of out (N,OC) in place: the bias term
// of a linear layer whose matmul has already written out. It runs on the
// calling goroutine (AddBiasThreads shares the rows).
func AddBias(out, bias []float32, N, OC int) { addBiasRows(out, bias, 0, N, OC) }

// AddBiasThreads is AddBias with the rows shared among up to threads
// goroutines when there are at least 64K values: it is memory bound, and
// two cores stream more bytes than one. The result does not depend on the
// split (each element gets one addition).
func AddBiasThreads(threads int, out, bias []float32, N, OC int) {
	if nw := workersFor(threads, N, N*OC); nw > 1 {
		parallelFor(nw, N, func(_, lo, hi int) { addBiasRows(out, bias, lo, hi, OC) })
		return
	}
	addBiasRows(out, bias, 0, N, OC)
}

// addBiasRows is AddBias for rows [lo, hi).
func addBiasRows(out, bias []float32, lo, hi, OC int) {
	bias = bias[:OC]
	for n := lo; n < hi; n++ {
		addF32(out[n*OC:n*OC+OC], bias)
	}
}

// BiasBackward adds the column sums of dout (N,OC) to dbias (OC): the
// gradient of AddBias. It accumulates. The sums run in float64 because N is
// the number of tokens in the batch (thousands), where float32 sums of
// same-signed terms lose several digits; they go block by block over the
// columns so the partial sums need no heap buffer. It runs on the calling
// goroutine (BiasBackwardThreads shares the columns).
func BiasBackward(dbias, dout []float32, N, OC int) { biasBackwardCols(dbias, dout, N, OC, 0, OC) }

// BiasBackwardThreads is BiasBackward with the columns shared among up to
// threads goroutines when dout has at least 64K values. Each column is
// still summed by one goroutine in row order, so the result is bit for bit
// BiasBackward's for any thread count.
func BiasBackwardThreads(threads int, dbias, dout []float32, N, OC int) {
	// Whole blocks of 8 columns, so that every goroutine's rows are
	// multiples of the vector loop's width but the last one's.
	groups := (OC + 7) / 8
	if nw := workersFor(threads, groups, N*OC); nw > 1 {
		parallelFor(nw, groups, func(_, lo, hi int) {
			biasBackwardCols(dbias, dout, N, OC, 8*lo, min(8*hi, OC))
		})
		return
	}
	biasBackwardCols(dbias, dout, N, OC, 0, OC)
}

// biasBackwardCols is BiasBackward for columns [c0, c1).
func biasBackwardCols(dbias, dout []float32, N, OC, c0, c1 int) {
	var acc [biasBlock]float64
	for ; c0 < c1; c0 += biasBlock {
		w := min(biasBlock, c1-c0)
		a := acc[:w]
		clear(a)
		for n := 0; n < N; n++ {
			addF64(a, dout[n*OC+c0:n*OC+c0+w])
		}
		db := dbias[c0 : c0+w]
		db = db[:len(a)]
		for i, v := range a {
			db[i] += float32(v)
		}
	}
}
