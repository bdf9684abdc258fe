package kernels

import "math"

// Straightforward float64 versions of the forward kernels: no blocking, no
// masking tricks, no fast exp. The tests compare the kernels with them.

func refLayerNorm(inp, weight, bias []float32, N, C int) []float64 {
	out := make([]float64, N*C)
	for n := 0; n < N; n++ {
		x := inp[n*C : n*C+C]
		var m, v float64
		for _, xi := range x {
			m += float64(xi)
		}
		m /= float64(C)
		for _, xi := range x {
			v += (float64(xi) - m) * (float64(xi) - m)
		}
		v /= float64(C)
		s := 1 / math.Sqrt(v+1e-5)
		for i, xi := range x {
			out[n*C+i] = (float64(xi)-m)*s*float64(weight[i]) + float64(bias[i])
		}
	}
	return out
}

// refGelu is 0.5·x·(1 + tanh(u)) written as x/(1 + e^(-2u)): the tanh form
// cancels even in float64 once tanh(u) is within 1e-16 of -1 (x < -6).
func refGelu(x float64) float64 {
	u := math.Sqrt(2/math.Pi) * (x + 0.044715*x*x*x)
	return x / (1 + math.Exp(-2*u))
}

// refAttention returns out (B,T,C) and att (B,NH,T,T).
func refAttention(qkv []float32, B, T, C, NH int) (out, att []float64) {
	hs := C / NH
	out = make([]float64, B*T*C)
	att = make([]float64, B*NH*T*T)
	at := func(b, t, i int) float64 { return float64(qkv[(b*T+t)*3*C+i]) }
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			for i := 0; i < T; i++ {
				row := att[((b*NH+h)*T+i)*T:][:T]
				mx := math.Inf(-1)
				for j := 0; j <= i; j++ {
					var s float64
					for d := 0; d < hs; d++ {
						s += at(b, i, h*hs+d) * at(b, j, C+h*hs+d)
					}
					row[j] = s / math.Sqrt(float64(hs))
					mx = math.Max(mx, row[j])
				}
				var sum float64
				for j := 0; j <= i; j++ {
					row[j] = math.Exp(row[j] - mx)
					sum += row[j]
				}
				for j := 0; j <= i; j++ {
					row[j] /= sum
					for d := 0; d < hs; d++ {
						out[(b*T+i)*C+h*hs+d] += row[j] * at(b, j, 2*C+h*hs+d)
					}
				}
			}
		}
	}
	return out, att
}

// refCrossEntropy returns the losses (N) and probabilities (N,V).
func refCrossEntropy(logits []float32, targets []int32, N, V int) (losses, probs []float64) {
	losses = make([]float64, N)
	probs = make([]float64, N*V)
	for n := 0; n < N; n++ {
		l := logits[n*V : n*V+V]
		mx := math.Inf(-1)
		for _, v := range l {
			mx = math.Max(mx, float64(v))
		}
		var sum float64
		for _, v := range l {
			sum += math.Exp(float64(v) - mx)
		}
		for i, v := range l {
			probs[n*V+i] = math.Exp(float64(v)-mx) / sum
		}
		losses[n] = math.Log(sum) - (float64(l[targets[n]]) - mx)
	}
	return losses, probs
}

// refAttentionBackward returns the gradient with respect to qkv (B,T,3C)
// of Σ out·dout, from the softmax probabilities att of refAttention.
func refAttentionBackward(qkv []float32, att []float64, dout []float32, B, T, C, NH int) []float64 {
	hs := C / NH
	scale := 1 / math.Sqrt(float64(hs))
	dqkv := make([]float64, B*T*3*C)
	at := func(b, t, i int) float64 { return float64(qkv[(b*T+t)*3*C+i]) }
	dP := make([]float64, T)
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			for i := 0; i < T; i++ {
				p := att[((b*NH+h)*T+i)*T:][:T]
				do := dout[(b*T+i)*C+h*hs:][:hs]
				var dot float64
				for j := 0; j <= i; j++ {
					dP[j] = 0
					for d := 0; d < hs; d++ {
						dP[j] += float64(do[d]) * at(b, j, 2*C+h*hs+d)
						dqkv[(b*T+j)*3*C+2*C+h*hs+d] += p[j] * float64(do[d])
					}
					dot += p[j] * dP[j]
				}
				for j := 0; j <= i; j++ {
					ds := p[j] * (dP[j] - dot) * scale
					for d := 0; d < hs; d++ {
						dqkv[(b*T+i)*3*C+h*hs+d] += ds * at(b, j, C+h*hs+d)
						dqkv[(b*T+j)*3*C+C+h*hs+d] += ds * at(b, i, h*hs+d)
					}
				}
			}
		}
	}
	return dqkv
}
