package kernels

import "math"

// EncoderForward writes GPT-2's input embedding, the sum of a token and a
// position embedding: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]. out is
// (B,T,C), inp (B,T), wte (V,C) and wpe (maxT,C) with maxT ≥ T. It runs on
// the calling goroutine: it only copies B·T·C values.
func EncoderForward(out []float32, inp []int32, wte, wpe []float32, B, T, C int) {
	for b := 0; b < B; b++ {
		for t := 0; t < T; t++ {
			bt := b*T + t
			ix := int(inp[bt])
			e := wte[ix*C : ix*C+C]
			p := wpe[t*C : t*C+C]
			o := out[bt*C : bt*C+C]
			p, o = p[:len(e)], o[:len(e)] // lets the compiler drop bounds checks
			for i, v := range e {
				o[i] = v + p[i]
			}
		}
	}
}

// EncoderForwardBF16 is EncoderForward with wte and wpe in bfloat16 (the
// bits of each element, as mixed precision keeps the working parameters):
// each is decoded as it is read, exactly, so the result is
// EncoderForward's on the decoded tables, without decoding all V rows of
// wte to use B·T of them.
func EncoderForwardBF16(out []float32, inp []int32, wte, wpe []uint16, B, T, C int) {
	for b := 0; b < B; b++ {
		for t := 0; t < T; t++ {
			bt := b*T + t
			ix := int(inp[bt])
			e := wte[ix*C : ix*C+C]
			p := wpe[t*C : t*C+C]
			o := out[bt*C : bt*C+C]
			p, o = p[:len(e)], o[:len(e)]
			for i, v := range e {
				o[i] = bf16Float(v) + bf16Float(p[i])
			}
		}
	}
}

// bf16Float decodes bfloat16 bits: exact, every value (subnormals and
// NaNs included) keeping its bits.
func bf16Float(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// EncoderBackward adds the gradients of EncoderForward to dwte (V,C) and
// dwpe (maxT,C), given dout (B,T,C): each position's gradient goes to its
// token's row and its position's row. It accumulates, so a token seen twice
// gets both contributions. It runs on the calling goroutine because two
// positions holding the same token write the same dwte row.
func EncoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C int) {
	for b := 0; b < B; b++ {
		for t := 0; t < T; t++ {
			bt := b*T + t
			ix := int(inp[bt])
			d := dout[bt*C : bt*C+C]
			de := dwte[ix*C : ix*C+C]
			dp := dwpe[t*C : t*C+C]
			de, dp = de[:len(d)], dp[:len(d)]
			for i, v := range d {
				de[i] += v
				dp[i] += v
			}
		}
	}
}
