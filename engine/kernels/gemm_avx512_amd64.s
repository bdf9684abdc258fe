//go:build amd64 && !purego

#include "textflag.h"

// The AVX-512 micro-kernels: C = alpha·A·B + beta·C on a 12×32 tile (see
// gemmKernel in gemm_kernel.go). Per step of k they load one row of the
// packed B panel (two registers of 16), broadcast the 12 elements of a
// column of A and do 24 fused multiply-adds into the 24 sums.
//
// 12×32 was measured against 6×64, 8×48 and 14×32 (all with 24-28 sums,
// enough to hide the 4-cycle latency of two FMA pipes) on the development
// machine (AMD EPYC, Zen 5): all ran 220-245 GFLOP/s on one core on the
// model's big shapes, and 12×32 was the best on the attention shapes, where
// n = 64 and k = 64 leave no room for padding a wider tile. Broadcasting
// into a register was 5-20% faster than broadcasting from memory inside
// each FMA ({1to16}), which loads the element once per register of B.
//
// Registers:
//   Z0-Z23   sums: row r of the tile in Z(2r) (columns 0-15) and Z(2r+1)
//   Z24 Z25  the current row of B;  Z26 Z27  broadcast elements of A
//   Z30 Z31  alpha and beta in the epilogue
//   SI R8 R9 R10  A (see each kernel);  R11 lda and R12 3·lda, in bytes
//   BX  B;  DI  C;  DX  ldc in bytes;  CX  k;  R13  loop counter

// FMA2 adds element a of A times the current row of B to row c0, c1.
#define FMA2(a, t, c0, c1) \
	VBROADCASTSS a, t; \
	VFMADD231PS  Z24, t, c0; \
	VFMADD231PS  Z25, t, c1

#define LOADB(off) \
	VMOVUPS off(BX), Z24; \
	VMOVUPS off+64(BX), Z25

// STEPN is one step of k for A in place along its rows: rows 0-3 at SI,
// 4-7 at R8 and 8-11 at R9 plus 0, 1, 2 or 3 times lda, and the step's
// column at byte o in every row; B's row at byte b.
#define STEPN(o, b) \
	LOADB(b); \
	FMA2(o(SI), Z26, Z0, Z1); \
	FMA2(o(SI)(R11*1), Z27, Z2, Z3); \
	FMA2(o(SI)(R11*2), Z26, Z4, Z5); \
	FMA2(o(SI)(R12*1), Z27, Z6, Z7); \
	FMA2(o(R8), Z26, Z8, Z9); \
	FMA2(o(R8)(R11*1), Z27, Z10, Z11); \
	FMA2(o(R8)(R11*2), Z26, Z12, Z13); \
	FMA2(o(R8)(R12*1), Z27, Z14, Z15); \
	FMA2(o(R9), Z26, Z16, Z17); \
	FMA2(o(R9)(R11*1), Z27, Z18, Z19); \
	FMA2(o(R9)(R11*2), Z26, Z20, Z21); \
	FMA2(o(R9)(R12*1), Z27, Z22, Z23)

// STEPT is one step of k for A in place along its columns: the step's
// column of A is the 12 contiguous elements at col.
#define STEPT(col, b) \
	LOADB(b); \
	FMA2(0(col), Z26, Z0, Z1); \
	FMA2(4(col), Z27, Z2, Z3); \
	FMA2(8(col), Z26, Z4, Z5); \
	FMA2(12(col), Z27, Z6, Z7); \
	FMA2(16(col), Z26, Z8, Z9); \
	FMA2(20(col), Z27, Z10, Z11); \
	FMA2(24(col), Z26, Z12, Z13); \
	FMA2(28(col), Z27, Z14, Z15); \
	FMA2(32(col), Z26, Z16, Z17); \
	FMA2(36(col), Z27, Z18, Z19); \
	FMA2(40(col), Z26, Z20, Z21); \
	FMA2(44(col), Z27, Z22, Z23)

// PROLOGUE loads the arguments, asks for this tile of C and the next one
// to the right (the next call's, while this one computes: C often comes
// from memory, and a tile's 24 lines take longer than a short k to
// arrive) and zeroes the sums.
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
	MOVQ $12, AX; \
pf:; \
	PREFETCHT0 (R13); \
	PREFETCHT0 64(R13); \
	PREFETCHT0 128(R13); \
	PREFETCHT0 192(R13); \
	ADDQ DX, R13; \
	DECQ AX; \
	JNZ  pf; \
	VXORPS Z0, Z0, Z0; VXORPS Z1, Z1, Z1; VXORPS Z2, Z2, Z2; VXORPS Z3, Z3, Z3; \
	VXORPS Z4, Z4, Z4; VXORPS Z5, Z5, Z5; VXORPS Z6, Z6, Z6; VXORPS Z7, Z7, Z7; \
	VXORPS Z8, Z8, Z8; VXORPS Z9, Z9, Z9; VXORPS Z10, Z10, Z10; VXORPS Z11, Z11, Z11; \
	VXORPS Z12, Z12, Z12; VXORPS Z13, Z13, Z13; VXORPS Z14, Z14, Z14; VXORPS Z15, Z15, Z15; \
	VXORPS Z16, Z16, Z16; VXORPS Z17, Z17, Z17; VXORPS Z18, Z18, Z18; VXORPS Z19, Z19, Z19; \
	VXORPS Z20, Z20, Z20; VXORPS Z21, Z21, Z21; VXORPS Z22, Z22, Z22; VXORPS Z23, Z23, Z23

// STOREB stores alpha·sums + beta·C into a row of C and moves to the next.
#define STOREB(c0, c1) \
	VMULPS      Z30, c0, c0; \
	VMULPS      Z30, c1, c1; \
	VFMADD231PS (DI), Z31, c0; \
	VFMADD231PS 64(DI), Z31, c1; \
	VMOVUPS     c0, (DI); \
	VMOVUPS     c1, 64(DI); \
	ADDQ        DX, DI

// STORE0 stores alpha·sums, not reading C (beta == 0: NaNs in C must not
// leak into the result).
#define STORE0(c0, c1) \
	VMULPS  Z30, c0, c0; \
	VMULPS  Z30, c1, c1; \
	VMOVUPS c0, (DI); \
	VMOVUPS c1, 64(DI); \
	ADDQ    DX, DI

#define ROWS(op) \
	op(Z0, Z1); op(Z2, Z3); op(Z4, Z5); op(Z6, Z7); op(Z8, Z9); op(Z10, Z11); \
	op(Z12, Z13); op(Z14, Z15); op(Z16, Z17); op(Z18, Z19); op(Z20, Z21); op(Z22, Z23)

// EPILOGUE writes the tile. beta is tested by its bits without the sign,
// so -0 counts as 0, as in Go.
#define EPILOGUE \
	VBROADCASTSS alpha+48(FP), Z30; \
	VBROADCASTSS beta+52(FP), Z31; \
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

// func k12x32N(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)
TEXT ·k12x32N(SB), NOSPLIT, $0-56
	PROLOGUE
	LEAQ (SI)(R11*4), R8
	LEAQ (R8)(R11*4), R9
	MOVQ CX, R13
	SHRQ $2, R13
	JZ   tail

loop4:
	STEPN(0, 0)
	STEPN(4, 128)
	STEPN(8, 256)
	STEPN(12, 384)
	ADDQ $16, SI
	ADDQ $16, R8
	ADDQ $16, R9
	ADDQ $512, BX
	DECQ R13
	JNZ  loop4

tail:
	ANDQ $3, CX
	JZ   done

loop1:
	STEPN(0, 0)
	ADDQ $4, SI
	ADDQ $4, R8
	ADDQ $4, R9
	ADDQ $128, BX
	DECQ CX
	JNZ  loop1

done:
	EPILOGUE

// func k12x32T(k int, a *float32, lda int, b, c *float32, ldc int, alpha, beta float32)
TEXT ·k12x32T(SB), NOSPLIT, $0-56
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
	STEPT(R8, 128)
	STEPT(R9, 256)
	STEPT(R10, 384)
	ADDQ R12, SI
	ADDQ R12, R8
	ADDQ R12, R9
	ADDQ R12, R10
	ADDQ $512, BX
	DECQ R13
	JNZ  loop4

tail:
	ANDQ $3, CX
	JZ   done

loop1:
	STEPT(SI, 0)
	ADDQ R11, SI
	ADDQ $128, BX
	DECQ CX
	JNZ  loop1

done:
	EPILOGUE

// packBT32AVX512 packs a 32-column panel of op(B) = Bᵀ: dst[p*32+j] =
// src[j*ldb+p] for p < kb, a multiple of 16. Per half of 16 columns it
// loads 16 rows of B, 16 elements each, transposes them in registers (the
// usual four rounds: 32-bit and 64-bit interleaves, then two of 128-bit
// lanes) and stores 16 rows of the panel. In Go, the scattered stores
// took a tenth of the time of attention's q·kᵀ and a third of the logits'.
// func packBT32AVX512(dst, src *float32, ldb, kb int)
TEXT ·packBT32AVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ldb+16(FP), R11
	MOVQ kb+24(FP), CX
	SHLQ $2, R11
	LEAQ (R11)(R11*2), R12
	SHRQ $4, CX
	JZ   done
	MOVQ $2, BX // halves of 16 columns

half:
	MOVQ SI, R8
	LEAQ (R8)(R11*4), R9
	LEAQ (R9)(R11*4), R10
	LEAQ (R10)(R11*4), R13
	MOVQ DI, DX
	MOVQ CX, AX

block:
	// Zj holds elements p..p+15 of row j of B (column j of the half).
	VMOVUPS (R8), Z0
	VMOVUPS (R8)(R11*1), Z1
	VMOVUPS (R8)(R11*2), Z2
	VMOVUPS (R8)(R12*1), Z3
	VMOVUPS (R9), Z4
	VMOVUPS (R9)(R11*1), Z5
	VMOVUPS (R9)(R11*2), Z6
	VMOVUPS (R9)(R12*1), Z7
	VMOVUPS (R10), Z8
	VMOVUPS (R10)(R11*1), Z9
	VMOVUPS (R10)(R11*2), Z10
	VMOVUPS (R10)(R12*1), Z11
	VMOVUPS (R13), Z12
	VMOVUPS (R13)(R11*1), Z13
	VMOVUPS (R13)(R11*2), Z14
	VMOVUPS (R13)(R12*1), Z15
	// Round 1: interleave rows 2i and 2i+1, 32 bits at a time.
	VUNPCKLPS Z1, Z0, Z16
	VUNPCKHPS Z1, Z0, Z17
	VUNPCKLPS Z3, Z2, Z18
	VUNPCKHPS Z3, Z2, Z19
	VUNPCKLPS Z5, Z4, Z20
	VUNPCKHPS Z5, Z4, Z21
	VUNPCKLPS Z7, Z6, Z22
	VUNPCKHPS Z7, Z6, Z23
	VUNPCKLPS Z9, Z8, Z24
	VUNPCKHPS Z9, Z8, Z25
	VUNPCKLPS Z11, Z10, Z26
	VUNPCKHPS Z11, Z10, Z27
	VUNPCKLPS Z13, Z12, Z28
	VUNPCKHPS Z13, Z12, Z29
	VUNPCKLPS Z15, Z14, Z30
	VUNPCKHPS Z15, Z14, Z31
	// Round 2: interleave those, 64 bits at a time: in each 128-bit
	// lane, element c of rows 4g..4g+3.
	VUNPCKLPD Z18, Z16, Z0
	VUNPCKHPD Z18, Z16, Z1
	VUNPCKLPD Z19, Z17, Z2
	VUNPCKHPD Z19, Z17, Z3
	VUNPCKLPD Z22, Z20, Z4
	VUNPCKHPD Z22, Z20, Z5
	VUNPCKLPD Z23, Z21, Z6
	VUNPCKHPD Z23, Z21, Z7
	VUNPCKLPD Z26, Z24, Z8
	VUNPCKHPD Z26, Z24, Z9
	VUNPCKLPD Z27, Z25, Z10
	VUNPCKHPD Z27, Z25, Z11
	VUNPCKLPD Z30, Z28, Z12
	VUNPCKHPD Z30, Z28, Z13
	VUNPCKLPD Z31, Z29, Z14
	VUNPCKHPD Z31, Z29, Z15
	// Rounds 3 and 4: gather the lanes, so that Zc holds element p+c
	// of the 16 rows.
	VSHUFF32X4 $0x44, Z4, Z0, Z16
	VSHUFF32X4 $0xEE, Z4, Z0, Z17
	VSHUFF32X4 $0x44, Z12, Z8, Z18
	VSHUFF32X4 $0xEE, Z12, Z8, Z19
	VSHUFF32X4 $0x44, Z5, Z1, Z20
	VSHUFF32X4 $0xEE, Z5, Z1, Z21
	VSHUFF32X4 $0x44, Z13, Z9, Z22
	VSHUFF32X4 $0xEE, Z13, Z9, Z23
	VSHUFF32X4 $0x44, Z6, Z2, Z24
	VSHUFF32X4 $0xEE, Z6, Z2, Z25
	VSHUFF32X4 $0x44, Z14, Z10, Z26
	VSHUFF32X4 $0xEE, Z14, Z10, Z27
	VSHUFF32X4 $0x44, Z7, Z3, Z28
	VSHUFF32X4 $0xEE, Z7, Z3, Z29
	VSHUFF32X4 $0x44, Z15, Z11, Z30
	VSHUFF32X4 $0xEE, Z15, Z11, Z31
	VSHUFF32X4 $0x88, Z18, Z16, Z0
	VSHUFF32X4 $0xDD, Z18, Z16, Z4
	VSHUFF32X4 $0x88, Z19, Z17, Z8
	VSHUFF32X4 $0xDD, Z19, Z17, Z12
	VSHUFF32X4 $0x88, Z22, Z20, Z1
	VSHUFF32X4 $0xDD, Z22, Z20, Z5
	VSHUFF32X4 $0x88, Z23, Z21, Z9
	VSHUFF32X4 $0xDD, Z23, Z21, Z13
	VSHUFF32X4 $0x88, Z26, Z24, Z2
	VSHUFF32X4 $0xDD, Z26, Z24, Z6
	VSHUFF32X4 $0x88, Z27, Z25, Z10
	VSHUFF32X4 $0xDD, Z27, Z25, Z14
	VSHUFF32X4 $0x88, Z30, Z28, Z3
	VSHUFF32X4 $0xDD, Z30, Z28, Z7
	VSHUFF32X4 $0x88, Z31, Z29, Z11
	VSHUFF32X4 $0xDD, Z31, Z29, Z15
	// Row p+c of the panel's half is Zc.
	VMOVUPS Z0, 0(DX)
	VMOVUPS Z1, 128(DX)
	VMOVUPS Z2, 256(DX)
	VMOVUPS Z3, 384(DX)
	VMOVUPS Z4, 512(DX)
	VMOVUPS Z5, 640(DX)
	VMOVUPS Z6, 768(DX)
	VMOVUPS Z7, 896(DX)
	VMOVUPS Z8, 1024(DX)
	VMOVUPS Z9, 1152(DX)
	VMOVUPS Z10, 1280(DX)
	VMOVUPS Z11, 1408(DX)
	VMOVUPS Z12, 1536(DX)
	VMOVUPS Z13, 1664(DX)
	VMOVUPS Z14, 1792(DX)
	VMOVUPS Z15, 1920(DX)
	ADDQ $64, R8
	ADDQ $64, R9
	ADDQ $64, R10
	ADDQ $64, R13
	ADDQ $2048, DX
	DECQ AX
	JNZ  block
	LEAQ (SI)(R11*8), SI // the next 16 rows of B
	LEAQ (SI)(R11*8), SI
	ADDQ $64, DI
	DECQ BX
	JNZ  half

done:
	VZEROUPPER
	RET
