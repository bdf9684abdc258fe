package kernels

import "math"

// SgemmBF16 is Sgemm on A and B rounded to bfloat16: C = alpha·op(A)·op(B)
// + beta·C with the products of the rounded values summed in float32, as
// mixed-precision training multiplies (PyTorch's autocast to bfloat16,
// oneDNN's bf16 GEMM). Arguments, threads, panics and the beta == 0 rule
// are Sgemm's; A and B are read, never written.
//
// Rounding is to nearest, ties to even; NaN stays NaN; float32 subnormals
// (below 2⁻¹²⁶) count as zero, as the AVX-512 BF16 instructions treat them.
//
// On CPUs with AVX-512 BF16 the operands are rounded while they are packed
// (VCVTNE2PS2BF16) and multiplied by VDPBF16PS, which does two multiply-adds
// per float32 lane, twice an FMA's work: k is taken in pairs, the odd
// element of a pair added first, each product (exact in float32) added with
// one rounding, and sums that fall below 2⁻¹²⁶ flushed to zero. Elsewhere
// the operands are rounded into copies and multiplied by Sgemm's kernels,
// which add the same exact products in order p = 0, 1, 2, ...: the same
// numbers up to the order within each pair (and the flushing of subnormal
// sums), so a result may differ in its last bits from one CPU to another,
// never by more than float32 summation's usual bound.
func SgemmBF16(threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	lv := gemmBF16Level
	if lv == nil {
		lv = &gemmLevels[cpuLevel]
	}
	sgemmBF16At(lv, threads, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// sgemmBF16At is SgemmBF16 at lv: a bf16 level, or a float32 one that
// multiplies the rounded copies.
func sgemmBF16At(lv *gemmLevel, threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if lv.bf16 != nil {
		sgemmAt(lv, threads, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	ar, ac, br, bc, ok := checkSgemm(transA, transB, m, n, k, alpha, a, lda, len(b), ldb, beta, c, ldc)
	if !ok {
		return
	}
	cp := bf16Copies.get()
	cp.a = roundBF16Matrix(cp.a, a, ar, ac, lda)
	cp.b = roundBF16Matrix(cp.b, b, br, bc, ldb)
	sgemmAt(lv, threads, transA, transB, m, n, k, alpha, cp.a, ac, cp.b, bc, beta, c, ldc)
	bf16Copies.put(cp)
}

// bf16Copy holds the rounded operands of SgemmBF16 without AVX-512 BF16.
type bf16Copy struct{ a, b []float32 }

var bf16Copies gemmFreeList[bf16Copy]

// roundBF16Matrix copies the rows×cols matrix src (row stride ld) into buf,
// grown as needed, with row stride cols, every element rounded to bfloat16.
func roundBF16Matrix(buf, src []float32, rows, cols, ld int) []float32 {
	if cap(buf) < rows*cols {
		buf = make([]float32, rows*cols)
	}
	buf = buf[:rows*cols]
	for i := range rows {
		d := buf[i*cols:][:cols]
		for j, v := range src[i*ld:][:cols] {
			d[j] = roundBF16(v)
		}
	}
	return buf
}

// bf16Bits rounds f to bfloat16 as the AVX-512 BF16 instructions do:
// nearest, ties to even; NaN made quiet; subnormals to signed zero.
func bf16Bits(f float32) uint16 {
	b := math.Float32bits(f)
	switch {
	case b&0x7f800000 == 0: // zero or subnormal
		return uint16(b>>16) & 0x8000
	case b&0x7fffffff > 0x7f800000: // NaN: rounding could make it Inf
		return uint16(b>>16) | 0x40
	}
	// Adding 0x7fff plus the lowest kept bit rounds the dropped half to
	// nearest-even; a carry propagates into the exponent (up to Inf).
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// roundBF16 is f rounded to bfloat16 (see bf16Bits), as a float32.
func roundBF16(f float32) float32 { return math.Float32frombits(uint32(bf16Bits(f)) << 16) }

// bf16Pair packs elements 2q and 2q+1 of k as VDPBF16PS reads them: the
// even one in the low half.
func bf16Pair(lo, hi float32) uint32 { return uint32(bf16Bits(lo)) | uint32(bf16Bits(hi))<<16 }
