package kernels

// biasBlock is the column width BiasBackward sums at a time: 256 float64
// partial sums (2 KB) stay on the stack and in L1 while the rows stream past.
const biasBlock = 256

// AddBias adds bias (OC) to every row of out (N,OC) in place: the bias term
// of a linear layer whose matmul has already written out.
func AddBias(out, bias []float32, N, OC int) {
	bias = bias[:OC]
	for n := 0; n < N; n++ {
		o := out[n*OC : n*OC+OC]
		o = o[:len(bias)]
		for i, v := range bias {
			o[i] += v
		}
	}
}

// BiasBackward adds the column sums of dout (N,OC) to dbias (OC): the
// gradient of AddBias. It accumulates. The sums run in float64 because N is
// the number of tokens in the batch (thousands), where float32 sums of
// same-signed terms lose several digits; they go block by block over the
// columns so the partial sums need no heap buffer.
func BiasBackward(dbias, dout []float32, N, OC int) {
	var acc [biasBlock]float64
	for c0 := 0; c0 < OC; c0 += biasBlock {
		w := min(biasBlock, OC-c0)
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
