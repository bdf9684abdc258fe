//go:build amd64 && !purego

#include "textflag.h"

// The AVX2 micro-kernels, for CPUs without AVX-512: the AVX-512 ones
// (gemm_avx512_amd64.s, which explains the method) on a 6×16 tile, the
// largest whose 12 sums, 2 registers of B and 2 of A fit the 16 Y
// registers. On the development machine they run at about half the
// AVX-512 speed: 0.89 to 1.07 times OpenBLAS 0.3.21's Haswell kernels on
// the model's shapes (docs/benchmarks.md).
//
// Registers:
//   Y0-Y11   sums: row r of the tile in Y(2r) (columns 0-7) and Y(2r+1)
//   Y12 Y13  the current row of B;  Y14 Y15  broadcast elements of A,
//            then alpha and beta in the epilogue
//   SI R8 R9 R10  A;  R11 lda and R12 3·lda (N) or 4·lda (T), in bytes
//   BX  B;  DI  C;  DX  ldc in bytes;  CX  k;  R13  loop counter

#define FMA2(a, t, c0, c1) \
	VBROADCASTSS a, t; \
	VFMADD231PS  Y12, t, c0; \
	VFMADD231PS  Y13, t, c1

#define LOADB(off) \
	VMOVUPS off(BX), Y12; \
	VMOVUPS off+32(BX), Y13

// STEPN: rows 0-3 of A at SI and 4-5 at R8, plus 0, 1, 2 or 3 times lda.
#define STEPN(o, b) \
	LOADB(b); \
	FMA2(o(SI), Y14, Y0, Y1); \
	FMA2(o(SI)(R11*1), Y15, Y2, Y3); \
	FMA2(o(SI)(R11*2), Y14, Y4, Y5); \
	FMA2(o(SI)(R12*1), Y15, Y6, Y7); \
	FMA2(o(R8), Y14, Y8, Y9); \
	FMA2(o(R8)(R11*1), Y15, Y10, Y11)

// STEPT: the step's column of A is the 6 contiguous elements at col.
#define STEPT(col, b) \
	LOADB(b); \
	FMA2(0(col), Y14, Y0, Y1); \
	FMA2(4(col), Y15, Y2, Y3); \
	FMA2(8(col), Y14, Y4, Y5); \
	FMA2(12(col), Y15, Y6, Y7); \
	FMA2(16(col), Y14, Y8, Y9); \
	FMA2(20(col), Y15, Y10, Y11)

// PROLOGUE loads the arguments, asks for this tile of C and the next one
// to the right, and zeroes the sums.
#define PROLOGUE \
	MOVQ k+0(FP), CX; \
	MOVQ a+8(FP), SI; \
	MOVQ lda+16(FP), R11; \
	MOVQ b+24(FP), BX; \
	MOVQ c+32(FP), DI; \
	MOVQ ldc+40(FP), DX; \
	SHLQ $2, R11; \
	SHLQ $2, DX; \
	LEAQ (R11)(R11*2), R12; \
	MOVQ DI, R13; \
	MOVQ $6, AX; \
pf:; \
	PREFETCHT0 (R13); \
	PREFETCHT0 64(R13); \
	ADDQ DX, R13; \
	DECQ AX; \
	JNZ  pf; \
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7; \
	VXORPS Y8, Y8, Y8; VXORPS Y9, Y9, Y9; VXORPS Y10, Y10, Y10; VXORPS Y11, Y11, Y11

#define STOREB(c0, c1) \
	VMULPS      Y14, c0, c0; \
	VMULPS      Y14, c1, c1; \
	VFMADD231PS (DI), Y15, c0; \
	VFMADD231PS 32(DI), Y15, c1; \
	VMOVUPS     c0, (DI); \
	VMOVUPS     c1, 32(DI); \
	ADDQ        DX, DI

// STORE0 does not read C (beta == 0).
#define STORE0(c0, c1) \
	VMULPS  Y14, c0, c0; \
	VMULPS  Y14, c1, c1; \
	VMOVUPS c0, (DI); \
	VMOVUPS c1, 32(DI); \
	ADDQ    DX, DI

#define ROWS(op) \
	op(Y0, Y1); op(Y2, Y3); op(Y4, Y5); op(Y6, Y7); op(Y8, Y9); op(Y10, Y11)

// EPILOGUE writes the tile; -0 counts as beta == 0.
#define EPILOGUE \
	VBROADCASTSS alpha+48(FP), Y14; \
	VBROADCASTSS beta+52(FP), Y15; \
	MOVL         beta+52(FP), AX; \
	ANDL         $0x7fffffff, AX; \
	JZ           store0; \
	ROWS(STOREB); \
	VZEROUPPER; \
	RET; \
store0:; \
	ROWS(STORE0); \
	VZEROUPPER; \
	RET

// func k6x16N(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)
TEXT ·k6x16N(SB), NOSPLIT, $0-56
	PROLOGUE
	LEAQ (SI)(R11*4), R8
	MOVQ CX, R13
	SHRQ $2, R13
	JZ   tail

loop4:
	STEPN(0, 0)
	STEPN(4, 64)
	STEPN(8, 128)
	STEPN(12, 192)
	ADDQ $16, SI
	ADDQ $16, R8
	ADDQ $256, BX
	DECQ R13
	JNZ  loop4

tail:
	ANDQ $3, CX
	JZ   done

loop1:
	STEPN(0, 0)
	ADDQ $4, SI
	ADDQ $4, R8
	ADDQ $64, BX
	DECQ CX
	JNZ  loop1

done:
	EPILOGUE

// func k6x16T(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)
TEXT ·k6x16T(SB), NOSPLIT, $0-56
	PROLOGUE
	// Columns p, p+1, p+2 and p+3 of A at SI, R8, R9 and R10.
	LEAQ (SI)(R11*1), R8
	LEAQ (SI)(R11*2), R9
	LEAQ (SI)(R12*1), R10
	MOVQ R11, R12
	SHLQ $2, R12 // 4·lda: four columns on
	MOVQ CX, R13
	SHRQ $2, R13
	JZ   tail

loop4:
	STEPT(SI, 0)
	STEPT(R8, 64)
	STEPT(R9, 128)
	STEPT(R10, 192)
	ADDQ R12, SI
	ADDQ R12, R8
	ADDQ R12, R9
	ADDQ R12, R10
	ADDQ $256, BX
	DECQ R13
	JNZ  loop4

tail:
	ANDQ $3, CX
	JZ   done

loop1:
	STEPT(SI, 0)
	ADDQ R11, SI
	ADDQ $64, BX
	DECQ CX
	JNZ  loop1

done:
	EPILOGUE

// packBT16AVX2 packs a 16-column panel of op(B) = Bᵀ: dst[p*16+j] =
// src[j*ldb+p] for p < kb, a multiple of 8, as packBT32AVX512 does, with
// 8×8 transposes (interleaves of 32 and 64 bits, then of 128-bit lanes).
// func packBT16AVX2(dst, src *float32, ldb, kb int)
TEXT ·packBT16AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ldb+16(FP), R11
	MOVQ kb+24(FP), CX
	SHLQ $2, R11
	LEAQ (R11)(R11*2), R12
	SHRQ $3, CX
	JZ   done
	MOVQ $2, BX // halves of 8 columns

half:
	MOVQ SI, R8
	LEAQ (R8)(R11*4), R9
	MOVQ DI, DX
	MOVQ CX, AX

block:
	// Yj holds elements p..p+7 of row j of B (column j of the half).
	VMOVUPS (R8), Y0
	VMOVUPS (R8)(R11*1), Y1
	VMOVUPS (R8)(R11*2), Y2
	VMOVUPS (R8)(R12*1), Y3
	VMOVUPS (R9), Y4
	VMOVUPS (R9)(R11*1), Y5
	VMOVUPS (R9)(R11*2), Y6
	VMOVUPS (R9)(R12*1), Y7
	// Interleave rows 32 bits, then 64 bits at a time, then swap
	// 128-bit lanes: Y(8+c) ends up as element p+c of the 8 rows.
	VUNPCKLPS Y1, Y0, Y8
	VUNPCKHPS Y1, Y0, Y9
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y15
	VUNPCKLPD Y10, Y8, Y0
	VUNPCKHPD Y10, Y8, Y1
	VUNPCKLPD Y11, Y9, Y2
	VUNPCKHPD Y11, Y9, Y3
	VUNPCKLPD Y14, Y12, Y4
	VUNPCKHPD Y14, Y12, Y5
	VUNPCKLPD Y15, Y13, Y6
	VUNPCKHPD Y15, Y13, Y7
	VPERM2F128 $0x20, Y4, Y0, Y8
	VPERM2F128 $0x31, Y4, Y0, Y12
	VPERM2F128 $0x20, Y5, Y1, Y9
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x20, Y6, Y2, Y10
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x20, Y7, Y3, Y11
	VPERM2F128 $0x31, Y7, Y3, Y15
	// Row p+c of the panel's half is Y(8+c).
	VMOVUPS Y8, 0(DX)
	VMOVUPS Y9, 64(DX)
	VMOVUPS Y10, 128(DX)
	VMOVUPS Y11, 192(DX)
	VMOVUPS Y12, 256(DX)
	VMOVUPS Y13, 320(DX)
	VMOVUPS Y14, 384(DX)
	VMOVUPS Y15, 448(DX)
	ADDQ $32, R8
	ADDQ $32, R9
	ADDQ $512, DX
	DECQ AX
	JNZ  block
	LEAQ (SI)(R11*8), SI // the next 8 rows of B
	ADDQ $32, DI
	DECQ BX
	JNZ  half

done:
	VZEROUPPER
	RET
