package zero

import "github.com/gtrain/gtrain/engine/comm"

// encode writes src into dst (same length), rounding to dst's type.
func encode(dst comm.Buffer, src []float32) {
	switch dst.DType() {
	case comm.Float32:
		copy(dst.Float32s(), src)
	case comm.BFloat16:
		comm.EncodeBF16(dst.Uint16s(), src)
	case comm.Float16:
		comm.EncodeF16(dst.Uint16s(), src)
	}
}

// decode writes src (same length) into dst as float32.
func decode(dst []float32, src comm.Buffer) {
	switch src.DType() {
	case comm.Float32:
		copy(dst, src.Float32s())
	case comm.BFloat16:
		comm.DecodeBF16(dst, src.Uint16s())
	case comm.Float16:
		comm.DecodeF16(dst, src.Uint16s())
	}
}

// chunk is the stack scratch of accumulate and addFrom: low-precision
// elements go through float32 this many at a time.
const chunk = 512

// accumulate adds src into dst: dst += src, in dst's type.
func accumulate(dst comm.Buffer, src []float32) {
	if dst.DType() == comm.Float32 {
		d := dst.Float32s()
		for i, v := range src {
			d[i] += v
		}
		return
	}
	var tmp [chunk]float32
	for lo := 0; lo < len(src); lo += chunk {
		hi := min(lo+chunk, len(src))
		t := tmp[:hi-lo]
		decode(t, dst.Slice(lo, hi))
		for i, v := range src[lo:hi] {
			t[i] += v
		}
		encode(dst.Slice(lo, hi), t)
	}
}

// store is accumulate into a dst of zeros: src rounded to dst's type.
// It computes 0 + v, as accumulate does, for a -0 gradient, which the sum
// turns into +0; every other value is its own sum.
func store(dst comm.Buffer, src []float32) {
	if dst.DType() == comm.Float32 {
		d := dst.Float32s()
		for i, v := range src {
			d[i] = 0 + v
		}
		return
	}
	var tmp [chunk]float32
	for lo := 0; lo < len(src); lo += chunk {
		hi := min(lo+chunk, len(src))
		t := tmp[:hi-lo]
		for i, v := range src[lo:hi] {
			t[i] = 0 + v
		}
		encode(dst.Slice(lo, hi), t)
	}
}

// addBuffer adds src into dst, both of one type.
func addBuffer(dst, src comm.Buffer) {
	if src.DType() == comm.Float32 {
		accumulate(dst, src.Float32s())
		return
	}
	var tmp [chunk]float32
	for lo := 0; lo < src.Len(); lo += chunk {
		hi := min(lo+chunk, src.Len())
		decode(tmp[:hi-lo], src.Slice(lo, hi))
		accumulate(dst.Slice(lo, hi), tmp[:hi-lo])
	}
}
