package kernels

// SgemmBF16B is SgemmBF16 with B already in bfloat16: b holds the bits of
// its elements (the high half of their float32 bits), as the working
// parameters of mixed-precision training keep them. Arguments, threads,
// panics and the beta == 0 rule are Sgemm's, with b's length and stride
// counted in its 16-bit elements.
//
// The result is SgemmBF16's on B decoded to float32, bit for bit: the
// packers move B's pairs into the kernel's panels as they are, where
// SgemmBF16 would decode a copy and round it back (exact, both ways), so a
// multiply by the weights costs neither the decoding pass nor reading
// twice the bytes. Subnormal elements of B count as zero, as SgemmBF16's
// rounding makes them.
func SgemmBF16B(threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []uint16, ldb int, beta float32, c []float32, ldc int) {
	lv := gemmBF16Level
	if lv == nil {
		lv = &gemmLevels[cpuLevel]
	}
	sgemmBF16BAt(lv, threads, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// sgemmBF16BAt is SgemmBF16B at lv: a bf16 level, whose packers read b in
// place, or a float32 one, which multiplies rounded copies of A and of B
// decoded.
func sgemmBF16BAt(lv *gemmLevel, threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []uint16, ldb int, beta float32, c []float32, ldc int) {
	ar, ac, br, bc, ok := checkSgemm(transA, transB, m, n, k, alpha, a, lda, len(b), ldb, beta, c, ldc)
	if !ok {
		return
	}
	if lv.bf16 == nil {
		cp := bf16Copies.get()
		cp.a = roundBF16Matrix(cp.a, a, ar, ac, lda)
		cp.b = decodeBF16Matrix(cp.b, b, br, bc, ldb)
		sgemmAt(lv, threads, transA, transB, m, n, k, alpha, cp.a, ac, cp.b, bc, beta, c, ldc)
		bf16Copies.put(cp)
		return
	}
	raceSgemm(a, ar, ac, lda, nil, 0, 0, 0, c, m, n, ldc)
	raceReadBF16(b, br, bc, ldb)
	s := newSgemmCall(lv, threads, transA, transB, m, n, k, alpha, a, lda, nil, ldb, beta, c, ldc)
	s.b16 = b
	s.run()
	putSgemmCall(s)
}

// decodeBF16Matrix copies the rows×cols bfloat16 matrix src (row stride
// ld) into buf, grown as needed, with row stride cols, as float32 values
// that are their own bfloat16 rounding (see canonBF16).
func decodeBF16Matrix(buf []float32, src []uint16, rows, cols, ld int) []float32 {
	if cap(buf) < rows*cols {
		buf = make([]float32, rows*cols)
	}
	buf = buf[:rows*cols]
	for i := range rows {
		d := buf[i*cols:][:cols]
		for j, h := range src[i*ld:][:cols] {
			d[j] = bf16Float(canonBF16(h))
		}
	}
	return buf
}

// canonBF16 is h as SgemmBF16's rounding leaves a value that is already
// bfloat16: a subnormal becomes a zero of its sign, a NaN quiet, anything
// else itself.
func canonBF16(h uint16) uint16 { return bf16Bits(bf16Float(h)) }

// pair16 packs elements 2q and 2q+1 of k, already bfloat16, as bf16Pair
// packs floats.
func pair16(lo, hi uint16) uint32 { return uint32(canonBF16(lo)) | uint32(canonBF16(hi))<<16 }

// packPairs16Go is packPairsGo on bfloat16: elements p0..kb (p0 even) of
// a panel whose k runs down the rows.
func packPairs16Go(dst []uint32, dstw int, src []uint16, ld, p0, kb, cols int) {
	for p := p0; p < kb; p += 2 {
		d := dst[p/2*dstw:][:dstw]
		lo := src[p*ld:][:cols]
		if p+1 == kb {
			for j, v := range lo {
				d[j] = pair16(v, 0)
			}
		} else {
			hi := src[(p+1)*ld:][:cols]
			for j, v := range lo {
				d[j] = pair16(v, hi[j])
			}
		}
		clear(d[cols:])
	}
}

// packPairsT16Go is packPairsTGo on bfloat16: elements p0..kb (p0 even)
// of a panel whose k runs along the rows.
func packPairsT16Go(dst []uint32, dstw int, src []uint16, ld, p0, kb, rows int) {
	if p0 >= kb {
		return
	}
	for r := range rows {
		row := src[r*ld:][:kb]
		for p := p0; p < kb; p += 2 {
			var hi uint16
			if p+1 < kb {
				hi = row[p+1]
			}
			dst[p/2*dstw+r] = pair16(row[p], hi)
		}
	}
	for q := p0 / 2; q < (kb+1)/2; q++ {
		clear(dst[q*dstw+rows : (q+1)*dstw])
	}
}

// packBF16B16 is packBF16B for B in bfloat16 (SgemmBF16B).
func (s *sgemmCall) packBF16B16(dst []uint32, p0, kb, j0, width int) {
	nr, ops := s.lv.nr, s.lv.bf16
	kp := (kb + 1) / 2
	for q := 0; q*nr < width; q++ {
		cols := min(nr, width-q*nr)
		panel := dst[q*kp*nr:][:kp*nr]
		done := 0
		if !s.transB {
			src := s.b16[p0*s.ldb+j0+q*nr:]
			if ops.pairs16 != nil {
				done = ops.pairs16(panel, nr, src, s.ldb, kb, cols)
			}
			packPairs16Go(panel, nr, src, s.ldb, done, kb, cols)
			continue
		}
		src := s.b16[(j0+q*nr)*s.ldb+p0:]
		if cols == nr && nr%16 == 0 && ops.pairsT16 != nil {
			done = kb
			for h := 0; h < nr; h += 16 {
				done = min(done, ops.pairsT16(panel[h:], nr, src[h*s.ldb:], s.ldb, 16, kb))
			}
		}
		packPairsT16Go(panel, nr, src, s.ldb, done, kb, cols)
	}
}
