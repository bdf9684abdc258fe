package kernels

// A bf16 level multiplies as the float32 levels do (gemm_driver.go: the
// same goroutines and blocks), but packs both operands, rounding them to
// bfloat16 on the way: VDPBF16PS multiplies pairs of bfloat16, so A
// cannot be read in place, and the copy is where the conversion is free.
// Since A is packed, a chunk packs its rows of A once per block of k and
// runs over all its columns (chunkBF16), where chunk reads A in place for
// at most nc columns. k is taken in pairs, and both packed operands are pair-major:
//
//	A panel (mr rows):    pair q of row i    at ap[q*mr+i]
//	B panel (nr columns): pair q of column j at bp[q*nr+j]
//
// each a uint32 holding elements 2q (low half) and 2q+1 (high half) of
// the block's k, the last pair's high half zero when the block's k is
// odd. A kc×nc block of B takes half the bytes of the float32 one, so the
// level's kc is twice as long for the same L2 footprint.

// bf16Ops are the kernel and packers of a bf16 level. The packers do what
// they can of a panel and leave the rest to the portable code (see
// packBF16A and packBF16B).
type bf16Ops struct {
	// kern computes an mr×nr tile: C = alpha·A·B + beta·C for kp pairs of
	// packed A and B (gemmKernel's rules otherwise).
	kern func(kp int, a, b []uint32, c []float32, ldc int, alpha, beta float32)
	// pairs packs operands whose k runs down the rows (row p of the
	// panel's k at src[p*ld:]): whole pairs of the cols ≤ dstw columns,
	// zero-padded to dstw (12 or 32), from k = 0 on; it returns how much
	// of k it did, an even number.
	pairs func(dst []uint32, dstw int, src []float32, ld, kb, cols int) int
	// pairsT packs operands whose k runs along the rows (element p of
	// row r at src[r*ld+p]): rows (12 or 16) rows, from k = 0 on; it
	// returns how much of k it did, a multiple of 32.
	pairsT func(dst []uint32, dstw int, src []float32, ld, rows, kb int) int
	// pairs16 and pairsT16, if not nil, are pairs and pairsT for B
	// already in bfloat16 (SgemmBF16B), into 32-column panels of B only
	// (they do nothing for other widths).
	pairs16  func(dst []uint32, dstw int, src []uint16, ld, kb, cols int) int
	pairsT16 func(dst []uint32, dstw int, src []uint16, ld, rows, kb int) int
	// pairsPanels, if not nil, packs whole pairs of panels whole panels
	// of A transposed (panel p from column p·mr of src), kp pairs apart
	// in dst, reading each row once across them; it returns how much of
	// k it did, an even number.
	pairsPanels func(dst []uint32, src []float32, ld, kb, panels, kp int) int
}

// gemmKC is the k block of a multiply of depth k at lv: k cut into as few
// blocks of at most lv.kc as possible, as even as possible, and for a
// bf16 level an even number, so that only the last block has a lone
// element.
func gemmKC(lv *gemmLevel, k int) int {
	kc := gemmCeilDiv(k, gemmCeilDiv(k, lv.kc))
	if lv.bf16 != nil {
		kc += kc & 1
	}
	return kc
}

// bf16Cut is plan's cut of C into chunks for a bf16 level on threads > 1
// goroutines, from the cache blocking's cm0 rows (a chunk packs all its
// rows of A at once, so mc bounds them) and cn0 (1: a chunk runs over any
// number of columns, nc at a time). Such a level packs A as well as B,
// once per chunk, so every cut packs an operand again: a cut of columns
// all of A (m·k), a cut of rows all of B (k·n). It takes 2·threads chunks
// (a helper that joins late still finds work, as in plan), cut so as to
// repack the fewest elements: on the small preset's qkv, 1024×1152 on 2
// threads, 2×2 chunks repack a third of what plan's 8 columns would.
func bf16Cut(m, n, pm, pn, cm0, cn0, threads int) (cm, cn int) {
	want := 2 * threads
	cost := -1
	for c := 1; c <= want; c++ {
		cnc := min(max(cn0, c), pn)
		cmc := min(max(cm0, gemmCeilDiv(want, c)), pm)
		if k := m*cnc + n*cmc; cost < 0 || k < cost {
			cost, cm, cn = k, cmc, cnc
		}
	}
	return cm, cn
}

// chunkBF16 is chunk for a bf16 level. Per block of k it packs the
// chunk's rows of A once, then runs over its columns nc at a time, packing
// each block of B and multiplying every panel of A by it: the packed A is
// reused by every block of columns, where a chunk of at most nc columns
// (as chunk has) would pack the same rows of A again for each (the
// logits' 1024×768 input 131 times over gpt2's 50257 columns).
func (s *sgemmCall) chunkBF16(buf *gemmBuf, i0, i1, j0, j1 int) {
	mr, nr, nc, ops := s.lv.mr, s.lv.nr, s.lv.nc, s.lv.bf16
	for p0 := 0; p0 < s.k; p0 += s.kc {
		kb := min(s.kc, s.k-p0)
		kp := (kb + 1) / 2
		s.packBF16ABlock(buf, i0, i1, p0, kb)
		beta := s.beta
		if p0 > 0 {
			beta = 1
		}
		for jb := j0; jb < j1; jb += nc {
			width := min(nc, j1-jb)
			panels := gemmCeilDiv(width, nr)
			bp := buf.bp[:panels*kp*nr]
			s.packBF16B(bp, p0, kb, jb, width)
			for i := i0; i < i1; i += mr {
				rows := min(mr, i1-i)
				ap := buf.ap[(i-i0)/mr*kp*mr:][:kp*mr]
				for q := range panels {
					j := jb + q*nr
					cols := min(nr, j1-j)
					bq := bp[q*kp*nr:][:kp*nr]
					if rows == mr && cols == nr {
						ops.kern(kp, ap, bq, s.c[i*s.ldc+j:], s.ldc, s.alpha, beta)
						continue
					}
					ops.kern(kp, ap, bq, buf.tile, nr, 1, 0)
					mergeGemmTile(s.c[i*s.ldc+j:], s.ldc, buf.tile, nr, rows, cols, s.alpha, beta)
				}
			}
		}
	}
}

// packBF16ABlock packs rows i0..i1 and columns p0..p0+kb of op(A) into
// buf.ap, panel after panel: whole panels of a transposed A across all of
// them at once where the level can (pairsPanels), the rest one by one.
func (s *sgemmCall) packBF16ABlock(buf *gemmBuf, i0, i1, p0, kb int) {
	mr, ops := s.lv.mr, s.lv.bf16
	kp := (kb + 1) / 2
	i := i0
	if s.transA && ops.pairsPanels != nil {
		full := (i1 - i0) / mr
		src := s.a[p0*s.lda+i0:]
		done := ops.pairsPanels(buf.ap, src, s.lda, kb, full, kp)
		for q := range full { // a lone last element of k
			packPairsGo(buf.ap[q*kp*mr:][:kp*mr], mr, src[q*mr:], s.lda, done, kb, mr)
		}
		i += full * mr
	}
	for ; i < i1; i += mr {
		s.packBF16A(buf, buf.ap[(i-i0)/mr*kp*mr:][:kp*mr], i, min(mr, i1-i), p0, kb)
	}
}

// packBF16A packs rows i..i+rows and columns p0..p0+kb of op(A) into dst
// (see the layout above), padding rows up to mr with zeros.
func (s *sgemmCall) packBF16A(buf *gemmBuf, dst []uint32, i, rows, p0, kb int) {
	mr, ops := s.lv.mr, s.lv.bf16
	if s.transA { // row p of A holds column p of op(A)
		src := s.a[p0*s.lda+i:]
		done := ops.pairs(dst, mr, src, s.lda, kb, rows)
		packPairsGo(dst, mr, src, s.lda, done, kb, rows)
		return
	}
	src, ld := s.a[i*s.lda+p0:], s.lda
	if rows < mr && kb >= 32 {
		// The last rows: copied, padded with zero rows, for pairsT,
		// which takes whole panels (in Go they took a tenth of the
		// attention's packing time).
		src, ld = padGemmRows(buf.a, src, ld, rows, mr, kb), kb
		rows = mr
	}
	done := 0
	if rows == mr {
		done = ops.pairsT(dst, mr, src, ld, mr, kb)
	}
	packPairsTGo(dst, mr, src, ld, done, kb, rows)
}

// padGemmRows copies rows rows of kb elements of src (row stride ld) into
// scratch with stride kb and clears the rows after them up to want.
func padGemmRows(scratch, src []float32, ld, rows, want, kb int) []float32 {
	scratch = scratch[:want*kb]
	for r := range rows {
		copy(scratch[r*kb:][:kb], src[r*ld:][:kb])
	}
	clear(scratch[rows*kb:])
	return scratch
}

// packBF16B packs rows p0..p0+kb and columns j0..j0+width of op(B) into
// dst as panels of nr columns (see the layout above), the last padded with
// zero columns.
func (s *sgemmCall) packBF16B(dst []uint32, p0, kb, j0, width int) {
	if s.b16 != nil {
		s.packBF16B16(dst, p0, kb, j0, width)
		return
	}
	nr, ops := s.lv.nr, s.lv.bf16
	kp := (kb + 1) / 2
	for q := 0; q*nr < width; q++ {
		cols := min(nr, width-q*nr)
		panel := dst[q*kp*nr:][:kp*nr]
		if !s.transB {
			src := s.b[p0*s.ldb+j0+q*nr:]
			done := ops.pairs(panel, nr, src, s.ldb, kb, cols)
			packPairsGo(panel, nr, src, s.ldb, done, kb, cols)
			continue
		}
		// op(B) = Bᵀ: column j of op(B) is row j of B, along k.
		src := s.b[(j0+q*nr)*s.ldb+p0:]
		done := 0
		if cols == nr && nr%16 == 0 {
			done = kb
			for h := 0; h < nr; h += 16 {
				done = min(done, ops.pairsT(panel[h:], nr, src[h*s.ldb:], s.ldb, 16, kb))
			}
		}
		packPairsTGo(panel, nr, src, s.ldb, done, kb, cols)
	}
}

// packPairsGo packs elements p0..kb (p0 even) of the panel whose k runs
// down the rows: dst[q*dstw+j] = the pair (src[2q*ld+j], src[(2q+1)*ld+j])
// for the first cols columns, zero for the others, and an element past kb
// as zero.
func packPairsGo(dst []uint32, dstw int, src []float32, ld, p0, kb, cols int) {
	for p := p0; p < kb; p += 2 {
		d := dst[p/2*dstw:][:dstw]
		lo := src[p*ld:][:cols]
		if p+1 == kb {
			for j, v := range lo {
				d[j] = bf16Pair(v, 0)
			}
		} else {
			hi := src[(p+1)*ld:][:cols]
			for j, v := range lo {
				d[j] = bf16Pair(v, hi[j])
			}
		}
		clear(d[cols:])
	}
}

// packPairsTGo packs elements p0..kb (p0 even) of the panel whose k runs
// along the rows: dst[q*dstw+r] = the pair (src[r*ld+2q], src[r*ld+2q+1])
// for the first rows rows, zero for the others, and an element past kb as
// zero.
func packPairsTGo(dst []uint32, dstw int, src []float32, ld, p0, kb, rows int) {
	if p0 >= kb {
		return
	}
	for r := range rows {
		row := src[r*ld:][:kb]
		for p := p0; p < kb; p += 2 {
			var hi float32
			if p+1 < kb {
				hi = row[p+1]
			}
			dst[p/2*dstw+r] = bf16Pair(row[p], hi)
		}
	}
	for q := p0 / 2; q < (kb+1)/2; q++ {
		clear(dst[q*dstw+rows : (q+1)*dstw])
	}
}
