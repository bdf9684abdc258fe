package kernels

// gemmBuf is one goroutine's scratch space for a multiply: the packed
// block of B, the last rows of A and a tile of C (bf16 levels: the packed
// block of B and panel of A in bp and ap instead). Buffers are pooled so
// that a multiply allocates nothing once the pool holds big enough ones.
type gemmBuf struct {
	b, a, tile []float32
	bp, ap     []uint32
}

var gemmBufs gemmFreeList[gemmBuf]

// getGemmBuf returns a buffer big enough for s's blocks.
func getGemmBuf(s *sgemmCall) *gemmBuf {
	buf := gemmBufs.get()
	mr, nr := s.lv.mr, s.lv.nr
	if need := mr * nr; len(buf.tile) < need {
		buf.tile = make([]float32, need)
	}
	if s.lv.bf16 != nil {
		// A block of B (at most nc columns of the chunk's), and all the
		// chunk's rows of A (chunkBF16).
		kp := (s.kc + 1) / 2
		if need := kp * min(gemmCeilDiv(s.pn, s.cn), s.lv.nc/nr) * nr; len(buf.bp) < need {
			buf.bp = make([]uint32, need)
		}
		if need := kp * gemmCeilDiv(s.pm, s.cm) * mr; len(buf.ap) < need {
			buf.ap = make([]uint32, need)
		}
		if need := s.kc * mr; len(buf.a) < need { // the last rows of A, padded
			buf.a = make([]float32, need)
		}
		return buf
	}
	if need := s.kc * gemmCeilDiv(s.pn, s.cn) * nr; len(buf.b) < need {
		buf.b = make([]float32, need)
	}
	if need := s.kc * mr; len(buf.a) < need {
		buf.a = make([]float32, need)
	}
	return buf
}

// packB copies rows p0..p0+kb and columns j0..j0+width of op(B) into dst
// as panels of nr columns, one after another, each kb rows of nr values;
// the last panel is padded with zero columns.
func (lv *gemmLevel) packB(dst []float32, trans bool, b []float32, ldb, p0, kb, j0, width int) {
	nr := lv.nr
	for q := 0; q*nr < width; q++ {
		cols := min(nr, width-q*nr)
		panel := dst[q*kb*nr:][:kb*nr]
		if !trans {
			for p := range kb {
				d := panel[p*nr:][:nr]
				copy(d, b[(p0+p)*ldb+j0+q*nr:][:cols])
				clear(d[cols:])
			}
			continue
		}
		// op(B) = Bᵀ: column j of op(B) is row j of B, contiguous.
		src := b[(j0+q*nr)*ldb+p0:]
		done := 0
		if cols == nr && lv.packBT != nil {
			done = lv.packBT(panel, src, ldb, kb)
		}
		packGemmBTGo(panel, src, ldb, done, kb, nr, cols)
	}
}

// packGemmBTGo transposes rows p0..kb of a panel of Bᵀ: dst[p*nr+j] =
// src[j*ldb+p] for the first cols columns j, zero for the others.
func packGemmBTGo(dst, src []float32, ldb, p0, kb, nr, cols int) {
	for j := range cols {
		row := src[j*ldb:][p0:kb]
		for p, v := range row {
			dst[(p0+p)*nr+j] = v
		}
	}
	for j := cols; j < nr; j++ {
		for p := p0; p < kb; p++ {
			dst[p*nr+j] = 0
		}
	}
}

// packGemmA copies rows i..i+rows and columns p0..p0+kb of op(A) into dst
// column-major (kb columns of mr values), padding rows up to mr with
// zeros: the layout of Aᵀ with stride mr, which kernT reads.
func packGemmA(dst []float32, trans bool, a []float32, lda, i, rows, p0, kb, mr int) {
	dst = dst[:kb*mr]
	if trans {
		// Columns of op(A) are rows of A: copy them as they are, by a
		// loop rather than copy, whose call costs more than 6 or 12
		// elements.
		for p := range kb {
			d := dst[p*mr:][:mr]
			for ii, v := range a[(p0+p)*lda+i:][:rows] {
				d[ii] = v
			}
			for ii := rows; ii < mr; ii++ {
				d[ii] = 0
			}
		}
		return
	}
	if rows < mr {
		clear(dst)
	}
	for ii := range rows {
		row := a[(i+ii)*lda+p0:][:kb]
		for p, v := range row {
			dst[p*mr+ii] = v
		}
	}
}

// mergeGemmTile sets the rows×cols corner of C to alpha*tile + beta*C, where
// tile holds the product with row stride nr; beta == 0 does not read C.
func mergeGemmTile(c []float32, ldc int, tile []float32, nr, rows, cols int, alpha, beta float32) {
	for r := range rows {
		cr, tr := c[r*ldc:][:cols], tile[r*nr:][:cols]
		if beta == 0 {
			for j, t := range tr {
				cr[j] = alpha * t
			}
			continue
		}
		for j, t := range tr {
			cr[j] = alpha*t + beta*cr[j]
		}
	}
}
