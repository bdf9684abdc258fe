package zero

import (
	"math"

	"github.com/gtrain/gtrain/engine/comm"
)

// NonFinite counts the NaN and infinite values in this rank's training
// state: the fp32 master weights and Adam moments a checkpoint saves, and
// the working parameters the model computes with. A state with any must
// not be saved: resumed, it could only diverge again. The working
// parameters count too because fp16 overflows where fp32 does not: master
// weights beyond fp16's range are finite, but the model would compute
// with infinities.
func (e *Engine) NonFinite() int {
	bad := 0
	for _, src := range e.saved() {
		for _, pc := range e.pieces {
			bad += nonFinite32(src.data(pc))
		}
	}
	return bad + nonFiniteBuffer(e.work) + nonFiniteBuffer(e.own)
}

func nonFinite32(s []float32) int {
	n := 0
	for _, v := range s {
		if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
			n++
		}
	}
	return n
}

// nonFiniteBuffer counts b's NaN and infinite values: in 16-bit types,
// those whose exponent bits are all set.
func nonFiniteBuffer(b comm.Buffer) int {
	var exp uint16
	switch b.DType() {
	case comm.Float32:
		return nonFinite32(b.Float32s())
	case comm.BFloat16:
		exp = 0x7f80
	case comm.Float16:
		exp = 0x7c00
	default:
		return 0
	}
	n := 0
	for _, h := range b.Uint16s() {
		if h&exp == exp {
			n++
		}
	}
	return n
}
