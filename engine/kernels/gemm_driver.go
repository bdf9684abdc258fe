package kernels

import (
	"runtime"
	"sync/atomic"
)

// The multiply follows BLIS and GotoBLAS, with A and B's roles swapped
// because C is row-major and the micro-kernels load rows of B as vectors
// and broadcast elements of A:
//
//	chunk of C (mc rows × nc columns; the unit of work of a goroutine)
//	  k in blocks of kc
//	    pack the kc×nc block of op(B) into nr-column panels (stays in L2)
//	    mr rows of A at a time (stay in L1 while ...)
//	      ... every panel of B streams past them: one micro-kernel call
//	      per mr×nr tile of C
//
// The assembly kernels read A in place, along its rows (N) or columns (T),
// so a multiply with few columns (attention's (T×T)·(T×64)) does not pay
// for copying an operand it uses only a few times. (Packing A when it is
// transposed, to read it in order, made the AVX-512 kernels 18% slower on
// dW = xᵀ·dy: the copies cost more than the cache misses they save.) Only
// the last rows of A, when m is not a whole number of mr, are copied,
// padded with zeros, and the tiles they and the last columns touch go
// through a scratch tile. The Go kernel packs every panel of A (gemmGoLevel).

// sgemmCall is one multiply, shared by the goroutines that work on it.
type sgemmCall struct {
	lv             *gemmLevel
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	a, b, c        []float32
	b16            []uint16 // B in bfloat16 (SgemmBF16B), b nil
	lda, ldb, ldc  int

	kc      int // k block
	pm, pn  int // tiles of C down and across
	cm, cn  int // chunks of C down and across
	chunks  int // cm·cn
	workers int // goroutines to run the chunks on, the caller's included

	next  atomic.Int64  // the next chunk to take
	state atomic.Uint64 // helpers wanted and goroutines at work (see run)
	done  chan struct{} // the caller waits here for the last helper
}

var sgemmCalls gemmFreeList[sgemmCall]

// gemmMinParallel is the m·n·k below which a multiply runs on the calling
// goroutine whatever threads says: on the development machine 128³ (20 µs
// on one core) ran no faster on two, 160³ (37 µs) 1.6 times and 192³ 1.9
// times faster.
const gemmMinParallel = 3 << 20

func newSgemmCall(lv *gemmLevel, threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) *sgemmCall {
	s := sgemmCalls.get()
	if s.done == nil {
		s.done = make(chan struct{}, 1)
	}
	// Field by field: late helpers may read state at any time.
	s.lv, s.transA, s.transB, s.m, s.n, s.k, s.alpha, s.beta = lv, transA, transB, m, n, k, alpha, beta
	s.a, s.b, s.c, s.lda, s.ldb, s.ldc = a, b, c, lda, ldb, ldc
	s.next.Store(0)
	threads = min(max(threads, 1), runtime.GOMAXPROCS(0))
	if m*n*k < lv.minParallel {
		threads = 1
	}
	s.plan(threads)
	return s
}

// putSgemmCall recycles s once no goroutine uses it.
func putSgemmCall(s *sgemmCall) {
	s.a, s.b, s.c, s.b16 = nil, nil, nil, nil
	sgemmCalls.put(s)
}

// plan picks the k block and cuts C into chunks of at most about mc×nc,
// as the level asks, each a whole number of tiles, as even as that allows.
//
// With threads > 1 it aims at four chunks per goroutine, so that a helper
// that joins late (see run), or runs on a core shared with another
// process, still gets its share, and cuts columns first: a chunk packs
// only its own columns of B and reads A in place, so cutting columns costs
// little (chunks 128 columns wide ran 0-5% slower than 384 on one core),
// while every cut of rows packs the same B once more. Rows are cut only
// when there are too few columns, into pieces of at least gemmMinChunkRows.
func (s *sgemmCall) plan(threads int) {
	lv := s.lv
	s.kc = gemmKC(lv, s.k)
	s.pn, s.pm = gemmCeilDiv(s.n, lv.nr), gemmCeilDiv(s.m, lv.mr)
	cn, cm := gemmCeilDiv(s.n, lv.nc), gemmCeilDiv(s.m, lv.mc)
	if lv.bf16 != nil {
		// A bf16 chunk runs over its columns nc at a time with its
		// rows of A packed once (chunkBF16): only threads cut columns.
		cn = 1
		if threads > 1 {
			cm, cn = bf16Cut(s.m, s.n, s.pm, s.pn, cm, cn, threads)
		}
	} else if threads > 1 {
		want := 4 * threads
		if s.n >= threads*lv.minSplit {
			cn = gemmRoundUp(max(cn, min(want, s.n/gemmMinChunkCols)), threads)
		}
		if cn < 3*threads {
			cm = max(cm, min(gemmCeilDiv(want, cn), s.m/gemmMinChunkRows))
			if cn%threads != 0 {
				cm = gemmRoundUp(cm, threads)
			}
		}
	}
	s.cn, s.cm = min(cn, s.pn), min(cm, s.pm)
	s.chunks = s.cn * s.cm
	s.workers = min(threads, s.chunks)
}

// gemmMinChunkCols and gemmMinChunkRows are the narrowest and lowest
// chunks plan makes to have more chunks than goroutines.
const (
	gemmMinChunkCols = 128
	gemmMinChunkRows = 256
)

// work runs chunks until none is left. Chunk (ci, cj) has the ci-th share
// of the pm row tiles and the cj-th of the pn column tiles.
func (s *sgemmCall) work() {
	buf := getGemmBuf(s)
	mr, nr := s.lv.mr, s.lv.nr
	for {
		i := int(s.next.Add(1) - 1)
		if i >= s.chunks {
			break
		}
		ci, cj := i/s.cn, i%s.cn
		i0, i1 := ci*s.pm/s.cm*mr, min((ci+1)*s.pm/s.cm*mr, s.m)
		j0, j1 := cj*s.pn/s.cn*nr, min((cj+1)*s.pn/s.cn*nr, s.n)
		if s.lv.bf16 != nil {
			s.chunkBF16(buf, i0, i1, j0, j1)
		} else {
			s.chunk(buf, i0, i1, j0, j1)
		}
	}
	gemmBufs.put(buf)
}

// chunk computes rows i0..i1 and columns j0..j1 of C.
func (s *sgemmCall) chunk(buf *gemmBuf, i0, i1, j0, j1 int) {
	mr, nr := s.lv.mr, s.lv.nr
	panels := gemmCeilDiv(j1-j0, nr)
	for p0 := 0; p0 < s.k; p0 += s.kc {
		kb := min(s.kc, s.k-p0)
		bp := buf.b[:panels*kb*nr]
		s.lv.packB(bp, s.transB, s.b, s.ldb, p0, kb, j0, j1-j0)
		// Later k blocks add to what the first one left in C.
		beta := s.beta
		if p0 > 0 {
			beta = 1
		}
		for i := i0; i < i1; i += mr {
			rows := min(mr, i1-i)
			kern, a, lda := s.aPanel(buf, i, rows, p0, kb)
			for q := range panels {
				j := j0 + q*nr
				cols := min(nr, j1-j)
				bq := bp[q*kb*nr:]
				if rows == mr && cols == nr {
					kern(kb, a, lda, bq, s.c[i*s.ldc+j:], s.ldc, s.alpha, beta)
					continue
				}
				kern(kb, a, lda, bq, buf.tile, nr, 1, 0)
				mergeGemmTile(s.c[i*s.ldc+j:], s.ldc, buf.tile, nr, rows, cols, s.alpha, beta)
			}
		}
	}
}

// aPanel returns the kernel and operand for rows i..i+rows of op(A) and
// its columns p0..p0+kb: A in place when all mr rows exist, else the rows
// copied into buf, padded with zeros, in the column-major layout; also
// the whole panel where the level asks (pack4KTransA).
func (s *sgemmCall) aPanel(buf *gemmBuf, i, rows, p0, kb int) (gemmKernel, []float32, int) {
	lv := s.lv
	if rows == lv.mr && !lv.packA && !(s.transA && lv.pack4KTransA && s.lda%1024 == 0) {
		if s.transA {
			return lv.kernT, s.a[p0*s.lda+i:], s.lda
		}
		return lv.kernN, s.a[i*s.lda+p0:], s.lda
	}
	ap := buf.a[:kb*lv.mr]
	packGemmA(ap, s.transA, s.a, s.lda, i, rows, p0, kb, lv.mr)
	return lv.kernT, ap, lv.mr
}

func gemmCeilDiv(a, b int) int { return (a + b - 1) / b }

func gemmRoundUp(a, b int) int { return gemmCeilDiv(a, b) * b }
