//go:build amd64 && !purego

#include "textflag.h"

// The AVX-512 BF16 micro-kernel and packers of SgemmBF16 (see
// gemm_bf16.go). The Go assembler knows neither VDPBF16PS nor
// VCVTNE2PS2BF16, so EVEXRR spells out their register-to-register EVEX
// encodings (Intel SDM vol. 2, 2.7): 62, P0 (inverted R, X, B, R' and
// map 0F38), P1 (W0, inverted vvvv, pp), P2 (512-bit, inverted V', no
// mask), opcode, ModRM. Operands are register numbers in Go's order
// (sources first, destination last); x^31 inverts the 5-bit number.
#define EVEXRR(pp, op, s, v, d) \
	BYTE $0x62; \
	BYTE $(((((d)^31)>>3)&1)<<7 | ((((s)^31)>>4)&1)<<6 | ((((s)^31)>>3)&1)<<5 | ((((d)^31)>>4)&1)<<4 | 2); \
	BYTE $((((v)^31)&15)<<3 | 4 | (pp)); \
	BYTE $(0x40 | ((((v)^31)>>4)&1)<<3); \
	BYTE $(op); \
	BYTE $(0xC0 | ((d)&7)<<3 | ((s)&7))

// DPBF16(s, v, d) is VDPBF16PS Zs, Zv, Zd: each float32 lane i of Zd adds
// the products of the bfloat16 pairs (2i, 2i+1) of Zv and Zs, the odd one
// first, each rounded to float32 (round to nearest even, subnormals
// flushed to zero).
#define DPBF16(s, v, d) EVEXRR(2, 0x52, s, v, d)

// CVT2BF16(s, v, d) is VCVTNE2PS2BF16 Zs, Zv, Zd: the 16 floats of Zs
// rounded to bfloat16 (nearest even, subnormals to zero, NaN made quiet)
// in the low 16 words of Zd, those of Zv in the high 16.
#define CVT2BF16(s, v, d) EVEXRR(3, 0x72, s, v, d)

// The kernel: C = alpha·A·B + beta·C on a 12×32 tile, as k12x32N but with
// k in pairs. A is packed pair-major (pair q of row i in the dword at
// a[q*12+i]), B likewise (pair q of column j at b[q*32+j]). Per pair it
// loads B's two registers, broadcasts the 12 pairs of A and does 24
// VDPBF16PS, each two multiply-adds per lane: twice an FMA's work.
//
// Registers: Z0-Z23 sums (row r in Z(2r), Z(2r+1)); Z24 Z25 the pair of
// B; Z26 Z27 broadcast pairs of A; Z30 Z31 alpha, beta. SI A, BX B, DI C,
// DX ldc in bytes, CX pairs, R13 loop counter.

#define DP2(o, zt, t, c0, c1) \
	VPBROADCASTD o(SI), zt; \
	DPBF16(24, t, c0); \
	DPBF16(25, t, c1)

// STEP is one pair of k: A's pairs at byte ao from SI, B's at bo from BX.
#define STEP(ao, bo) \
	VMOVUPS bo(BX), Z24; \
	VMOVUPS bo+64(BX), Z25; \
	DP2(ao, Z26, 26, 0, 1); \
	DP2(ao+4, Z27, 27, 2, 3); \
	DP2(ao+8, Z26, 26, 4, 5); \
	DP2(ao+12, Z27, 27, 6, 7); \
	DP2(ao+16, Z26, 26, 8, 9); \
	DP2(ao+20, Z27, 27, 10, 11); \
	DP2(ao+24, Z26, 26, 12, 13); \
	DP2(ao+28, Z27, 27, 14, 15); \
	DP2(ao+32, Z26, 26, 16, 17); \
	DP2(ao+36, Z27, 27, 18, 19); \
	DP2(ao+40, Z26, 26, 20, 21); \
	DP2(ao+44, Z27, 27, 22, 23)

// STOREB, STORE0 and ROWS are k12x32N's epilogue (gemm_avx512_amd64.s).
#define STOREB(c0, c1) \
	VMULPS      Z30, c0, c0; \
	VMULPS      Z30, c1, c1; \
	VFMADD231PS (DI), Z31, c0; \
	VFMADD231PS 64(DI), Z31, c1; \
	VMOVUPS     c0, (DI); \
	VMOVUPS     c1, 64(DI); \
	ADDQ        DX, DI

#define STORE0(c0, c1) \
	VMULPS  Z30, c0, c0; \
	VMULPS  Z30, c1, c1; \
	VMOVUPS c0, (DI); \
	VMOVUPS c1, 64(DI); \
	ADDQ    DX, DI

#define ROWS(op) \
	op(Z0, Z1); op(Z2, Z3); op(Z4, Z5); op(Z6, Z7); op(Z8, Z9); op(Z10, Z11); \
	op(Z12, Z13); op(Z14, Z15); op(Z16, Z17); op(Z18, Z19); op(Z20, Z21); op(Z22, Z23)

// func k12x32BF16(kp int, a, b *uint32, c *float32, ldc int, alpha, beta float32)
TEXT ·k12x32BF16(SB), NOSPLIT, $0-48
	MOVQ kp+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), BX
	MOVQ c+24(FP), DI
	MOVQ ldc+32(FP), DX
	SHLQ $2, DX
	// Ask for this tile of C and the next one to the right, as k12x32N.
	MOVQ DI, R13
	MOVQ $12, AX

pf:
	PREFETCHT0 (R13)
	PREFETCHT0 64(R13)
	PREFETCHT0 128(R13)
	PREFETCHT0 192(R13)
	ADDQ       DX, R13
	DECQ       AX
	JNZ        pf
	VXORPS     Z0, Z0, Z0
	VXORPS     Z1, Z1, Z1
	VXORPS     Z2, Z2, Z2
	VXORPS     Z3, Z3, Z3
	VXORPS     Z4, Z4, Z4
	VXORPS     Z5, Z5, Z5
	VXORPS     Z6, Z6, Z6
	VXORPS     Z7, Z7, Z7
	VXORPS     Z8, Z8, Z8
	VXORPS     Z9, Z9, Z9
	VXORPS     Z10, Z10, Z10
	VXORPS     Z11, Z11, Z11
	VXORPS     Z12, Z12, Z12
	VXORPS     Z13, Z13, Z13
	VXORPS     Z14, Z14, Z14
	VXORPS     Z15, Z15, Z15
	VXORPS     Z16, Z16, Z16
	VXORPS     Z17, Z17, Z17
	VXORPS     Z18, Z18, Z18
	VXORPS     Z19, Z19, Z19
	VXORPS     Z20, Z20, Z20
	VXORPS     Z21, Z21, Z21
	VXORPS     Z22, Z22, Z22
	VXORPS     Z23, Z23, Z23
	MOVQ       CX, R13
	SHRQ       $2, R13
	JZ         tail

loop4:
	STEP(0, 0)
	STEP(48, 128)
	STEP(96, 256)
	STEP(144, 384)
	ADDQ $192, SI
	ADDQ $512, BX
	DECQ R13
	JNZ  loop4

tail:
	ANDQ $3, CX
	JZ   done

loop1:
	STEP(0, 0)
	ADDQ $48, SI
	ADDQ $128, BX
	DECQ CX
	JNZ  loop1

done:
	VBROADCASTSS alpha+40(FP), Z30
	VBROADCASTSS beta+44(FP), Z31
	MOVL         beta+44(FP), AX
	ANDL         $0x7fffffff, AX // -0 counts as 0, as in Go
	JZ           store0
	ROWS(STOREB)
	VZEROUPPER
	RET

store0:
	ROWS(STORE0)
	VZEROUPPER
	RET

// bf16Interleave is the word permutation that turns CVT2BF16's output
// (16 words of one row, then 16 of the next) into 16 pairs: word 2j from
// word j, word 2j+1 from word 16+j.
DATA bf16Interleave<>+0(SB)/8, $0x0011000100100000
DATA bf16Interleave<>+8(SB)/8, $0x0013000300120002
DATA bf16Interleave<>+16(SB)/8, $0x0015000500140004
DATA bf16Interleave<>+24(SB)/8, $0x0017000700160006
DATA bf16Interleave<>+32(SB)/8, $0x0019000900180008
DATA bf16Interleave<>+40(SB)/8, $0x001b000b001a000a
DATA bf16Interleave<>+48(SB)/8, $0x001d000d001c000c
DATA bf16Interleave<>+56(SB)/8, $0x001f000f001e000e
GLOBL bf16Interleave<>(SB), RODATA|NOPTR, $64

// packPairsAVX512 packs operands whose k runs down the rows (B as stored,
// or A transposed): for q < pairs, dst[q*dstw+j] = the pair (src[2q*ld+j],
// src[(2q+1)*ld+j]) rounded to bfloat16, for the columns j of 16-column
// group g that load mask g (K1, K2) has, zero for the others up to store
// mask g (K3, K4). dstw is 12 (A: one group) or 32 (B: two).
// func packPairsAVX512(dst *uint32, dstw int, src *float32, ld, pairs int, load, store uint32)
TEXT ·packPairsAVX512(SB), NOSPLIT, $0-48
	MOVQ    dst+0(FP), DI
	MOVQ    dstw+8(FP), DX
	MOVQ    src+16(FP), SI
	MOVQ    ld+24(FP), R11
	MOVQ    pairs+32(FP), CX
	MOVL    load+40(FP), AX
	KMOVW   AX, K1
	SHRL    $16, AX
	KMOVW   AX, K2
	MOVL    store+44(FP), AX
	KMOVW   AX, K3
	SHRL    $16, AX
	KMOVW   AX, K4
	VMOVDQU64 bf16Interleave<>(SB), Z31
	SHLQ    $2, R11
	SHLQ    $2, DX
	LEAQ    (SI)(R11*1), R8
	SHLQ    $1, R11 // two rows on
	TESTQ   CX, CX
	JZ      pdone
	CMPQ    DX, $128
	JEQ     pair32

pair12:
	VMOVUPS.Z (SI), K1, Z0
	VMOVUPS.Z (R8), K1, Z1
	CVT2BF16(0, 1, 2)
	VPERMW    Z2, Z31, Z2
	VMOVDQU32 Z2, K3, (DI)
	ADDQ      R11, SI
	ADDQ      R11, R8
	ADDQ      DX, DI
	DECQ      CX
	JNZ       pair12
	JMP       pdone

pair32:
	VMOVUPS.Z (SI), K1, Z0
	VMOVUPS.Z (R8), K1, Z1
	VMOVUPS.Z 64(SI), K2, Z3
	VMOVUPS.Z 64(R8), K2, Z4
	CVT2BF16(0, 1, 2)
	CVT2BF16(3, 4, 5)
	VPERMW    Z2, Z31, Z2
	VPERMW    Z5, Z31, Z5
	VMOVDQU32 Z2, K3, (DI)
	VMOVDQU32 Z5, K4, 64(DI)
	ADDQ      R11, SI
	ADDQ      R11, R8
	ADDQ      DX, DI
	DECQ      CX
	JNZ       pair32

pdone:
	VZEROUPPER
	RET

// packPairsPanelsAVX512 packs panels 12-row panels of A transposed (k
// down the rows): for q < pairs, pair q of panel p, the pair (src[2q*ld+
// 12p+r], src[(2q+1)*ld+12p+r]) rounded to bfloat16, at dst[p*pstride/4 +
// q*12 + r], r < 12. Pair by pair across the panels, so that it reads
// each row of A in order, where packPairsAVX512 walks one panel's 12
// columns down kb rows (strided reads, most cache lines fetched for
// 12 of their 16 floats).
// func packPairsPanelsAVX512(dst *uint32, src *float32, ld, pairs, panels, pstride int)
TEXT ·packPairsPanelsAVX512(SB), NOSPLIT, $0-48
	MOVQ      dst+0(FP), DI
	MOVQ      src+8(FP), SI
	MOVQ      ld+16(FP), R11
	MOVQ      pairs+24(FP), CX
	MOVQ      panels+32(FP), BX
	MOVQ      pstride+40(FP), R12
	MOVL      $0xfff, AX
	KMOVW     AX, K1
	VMOVDQU64 bf16Interleave<>(SB), Z31
	SHLQ      $2, R11
	TESTQ     CX, CX
	JZ        ppdone
	TESTQ     BX, BX
	JZ        ppdone

pppair:
	MOVQ SI, R8
	LEAQ (SI)(R11*1), R9
	MOVQ DI, R10
	MOVQ BX, R13

pppanel:
	VMOVUPS.Z (R8), K1, Z0
	VMOVUPS.Z (R9), K1, Z1
	CVT2BF16(0, 1, 2)
	VPERMW    Z2, Z31, Z2
	VMOVDQU32 Z2, K1, (R10)
	ADDQ      $48, R8
	ADDQ      $48, R9
	ADDQ      R12, R10
	DECQ      R13
	JNZ       pppanel
	LEAQ      (SI)(R11*2), SI
	ADDQ      $48, DI
	DECQ      CX
	JNZ       pppair

ppdone:
	VZEROUPPER
	RET

// packPairsTAVX512 packs operands whose k runs along the rows (A as
// stored, or B transposed): for the first 32·blocks elements of rows r <
// rows (12 or 16; rows 12-15 count as zero when rows is 12), dst[q*dstw+r]
// = the pair (src[r*ld+2q], src[r*ld+2q+1]) rounded to bfloat16. Per block
// of 32 elements it rounds each row to 16 pairs (one register per row),
// transposes the 16×16 pairs as packBT32AVX512 transposes floats, and
// stores the lanes of store (K1) of each of the 16 rows of pairs.
// func packPairsTAVX512(dst *uint32, dstw int, src *float32, ld, rows, blocks int, store uint32)
TEXT ·packPairsTAVX512(SB), NOSPLIT, $0-52
	MOVQ  dst+0(FP), DI
	MOVQ  dstw+8(FP), DX
	MOVQ  src+16(FP), SI
	MOVQ  ld+24(FP), R11
	MOVQ  rows+32(FP), BX
	MOVQ  blocks+40(FP), CX
	MOVL  store+48(FP), AX
	KMOVW AX, K1
	SHLQ  $2, R11
	SHLQ  $2, DX
	LEAQ  (R11)(R11*2), R12
	TESTQ CX, CX
	JZ    tdone

tblock:
	MOVQ SI, R8
	LEAQ (R8)(R11*4), R9
	LEAQ (R9)(R11*4), R10
	VMOVUPS (R8), Z16
	VMOVUPS 64(R8), Z17
	VMOVUPS (R8)(R11*1), Z18
	VMOVUPS 64(R8)(R11*1), Z19
	VMOVUPS (R8)(R11*2), Z20
	VMOVUPS 64(R8)(R11*2), Z21
	VMOVUPS (R8)(R12*1), Z22
	VMOVUPS 64(R8)(R12*1), Z23
	CVT2BF16(16, 17, 0)
	CVT2BF16(18, 19, 1)
	CVT2BF16(20, 21, 2)
	CVT2BF16(22, 23, 3)
	VMOVUPS (R9), Z16
	VMOVUPS 64(R9), Z17
	VMOVUPS (R9)(R11*1), Z18
	VMOVUPS 64(R9)(R11*1), Z19
	VMOVUPS (R9)(R11*2), Z20
	VMOVUPS 64(R9)(R11*2), Z21
	VMOVUPS (R9)(R12*1), Z22
	VMOVUPS 64(R9)(R12*1), Z23
	CVT2BF16(16, 17, 4)
	CVT2BF16(18, 19, 5)
	CVT2BF16(20, 21, 6)
	CVT2BF16(22, 23, 7)
	VMOVUPS (R10), Z16
	VMOVUPS 64(R10), Z17
	VMOVUPS (R10)(R11*1), Z18
	VMOVUPS 64(R10)(R11*1), Z19
	VMOVUPS (R10)(R11*2), Z20
	VMOVUPS 64(R10)(R11*2), Z21
	VMOVUPS (R10)(R12*1), Z22
	VMOVUPS 64(R10)(R12*1), Z23
	CVT2BF16(16, 17, 8)
	CVT2BF16(18, 19, 9)
	CVT2BF16(20, 21, 10)
	CVT2BF16(22, 23, 11)
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	CMPQ   BX, $16
	JNE    transpose
	LEAQ   (R10)(R11*4), R10
	VMOVUPS (R10), Z16
	VMOVUPS 64(R10), Z17
	VMOVUPS (R10)(R11*1), Z18
	VMOVUPS 64(R10)(R11*1), Z19
	VMOVUPS (R10)(R11*2), Z20
	VMOVUPS 64(R10)(R11*2), Z21
	VMOVUPS (R10)(R12*1), Z22
	VMOVUPS 64(R10)(R12*1), Z23
	CVT2BF16(16, 17, 12)
	CVT2BF16(18, 19, 13)
	CVT2BF16(20, 21, 14)
	CVT2BF16(22, 23, 15)

transpose:
	// packBT32AVX512's four rounds: afterwards Zq holds pair q of the
	// 16 rows.
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
	MOVQ      DI, R8
	VMOVDQU32 Z0, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z1, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z2, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z3, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z4, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z5, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z6, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z7, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z8, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z9, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z10, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z11, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z12, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z13, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z14, K1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z15, K1, (R8)
	ADDQ      DX, R8
	MOVQ      R8, DI
	ADDQ      $128, SI
	DECQ      CX
	JNZ       tblock

tdone:
	VZEROUPPER
	RET
