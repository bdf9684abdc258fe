//go:build amd64 && !purego

#include "textflag.h"

// The packers of SgemmBF16B (gemm_bf16b.go): B already in bfloat16, so
// packing only moves 16-bit words into the pair-major panels of the
// kernel (gemm_bf16_driver.go), with no rounding. They copy subnormals and
// NaNs as they are: k12x32BF16's VDPBF16PS treats subnormal inputs as
// zero, as the rounding packers' flushing does, and a NaN stays a NaN.

// bf16Lo16 and bf16Hi16 are VPERMI2W's word indices that interleave two
// rows of 32 words (row 2q in table 1, row 2q+1 in table 2) into the
// pairs of columns 0-15 and 16-31: word 2j from row 2q, word 2j+1 from
// row 2q+1.
DATA bf16Lo16<>+0(SB)/8, $0x0021000100200000
DATA bf16Lo16<>+8(SB)/8, $0x0023000300220002
DATA bf16Lo16<>+16(SB)/8, $0x0025000500240004
DATA bf16Lo16<>+24(SB)/8, $0x0027000700260006
DATA bf16Lo16<>+32(SB)/8, $0x0029000900280008
DATA bf16Lo16<>+40(SB)/8, $0x002b000b002a000a
DATA bf16Lo16<>+48(SB)/8, $0x002d000d002c000c
DATA bf16Lo16<>+56(SB)/8, $0x002f000f002e000e
GLOBL bf16Lo16<>(SB), RODATA|NOPTR, $64
DATA bf16Hi16<>+0(SB)/8, $0x0031001100300010
DATA bf16Hi16<>+8(SB)/8, $0x0033001300320012
DATA bf16Hi16<>+16(SB)/8, $0x0035001500340014
DATA bf16Hi16<>+24(SB)/8, $0x0037001700360016
DATA bf16Hi16<>+32(SB)/8, $0x0039001900380018
DATA bf16Hi16<>+40(SB)/8, $0x003b001b003a001a
DATA bf16Hi16<>+48(SB)/8, $0x003d001d003c001c
DATA bf16Hi16<>+56(SB)/8, $0x003f001f003e001e
GLOBL bf16Hi16<>(SB), RODATA|NOPTR, $64

// packPairs16AVX512 packs a 32-column panel of bfloat16 whose k runs down
// the rows (B as stored): for q < pairs, dst[q*32+j] = src[2q*ld+j] |
// src[(2q+1)*ld+j]<<16 for the columns j < 32 that load (a mask of words)
// has, zero for the others.
// func packPairs16AVX512(dst *uint32, src *uint16, ld, pairs int, load uint32)
TEXT ·packPairs16AVX512(SB), NOSPLIT, $0-36
	MOVQ      dst+0(FP), DI
	MOVQ      src+8(FP), SI
	MOVQ      ld+16(FP), R11
	MOVQ      pairs+24(FP), CX
	MOVL      load+32(FP), AX
	KMOVD     AX, K1
	VMOVDQU64 bf16Lo16<>(SB), Z30
	VMOVDQU64 bf16Hi16<>(SB), Z31
	SHLQ      $1, R11
	LEAQ      (SI)(R11*1), R8
	SHLQ      $1, R11 // two rows on
	TESTQ     CX, CX
	JZ        p16done

p16loop:
	VMOVDQU16.Z (SI), K1, Z0
	VMOVDQU16.Z (R8), K1, Z1
	VMOVDQA64   Z30, Z2
	VMOVDQA64   Z31, Z3
	VPERMI2W    Z1, Z0, Z2
	VPERMI2W    Z1, Z0, Z3
	VMOVDQU32   Z2, (DI)
	VMOVDQU32   Z3, 64(DI)
	ADDQ        R11, SI
	ADDQ        R11, R8
	ADDQ        $128, DI
	DECQ        CX
	JNZ         p16loop

p16done:
	VZEROUPPER
	RET

// packPairsT16AVX512 packs 16 rows of bfloat16 whose k runs along the
// rows (B transposed): for the first 32·blocks elements, dst[q*dstw+r] =
// src[r*ld+2q] | src[r*ld+2q+1]<<16. A pair is already a dword of the
// row, so per block of 32 elements it loads one register per row and
// transposes the 16×16 dwords as packPairsTAVX512 does.
// func packPairsT16AVX512(dst *uint32, dstw int, src *uint16, ld, blocks int)
TEXT ·packPairsT16AVX512(SB), NOSPLIT, $0-40
	MOVQ  dst+0(FP), DI
	MOVQ  dstw+8(FP), DX
	MOVQ  src+16(FP), SI
	MOVQ  ld+24(FP), R11
	MOVQ  blocks+32(FP), CX
	SHLQ  $1, R11
	SHLQ  $2, DX
	LEAQ  (R11)(R11*2), R12
	TESTQ CX, CX
	JZ    t16done

t16block:
	MOVQ    SI, R8
	LEAQ    (R8)(R11*4), R9
	LEAQ    (R9)(R11*4), R10
	LEAQ    (R10)(R11*4), R13
	VMOVDQU32 (R8), Z0
	VMOVDQU32 (R8)(R11*1), Z1
	VMOVDQU32 (R8)(R11*2), Z2
	VMOVDQU32 (R8)(R12*1), Z3
	VMOVDQU32 (R9), Z4
	VMOVDQU32 (R9)(R11*1), Z5
	VMOVDQU32 (R9)(R11*2), Z6
	VMOVDQU32 (R9)(R12*1), Z7
	VMOVDQU32 (R10), Z8
	VMOVDQU32 (R10)(R11*1), Z9
	VMOVDQU32 (R10)(R11*2), Z10
	VMOVDQU32 (R10)(R12*1), Z11
	VMOVDQU32 (R13), Z12
	VMOVDQU32 (R13)(R11*1), Z13
	VMOVDQU32 (R13)(R11*2), Z14
	VMOVDQU32 (R13)(R12*1), Z15
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
	VMOVDQU32 Z0, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z1, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z2, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z3, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z4, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z5, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z6, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z7, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z8, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z9, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z10, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z11, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z12, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z13, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z14, (R8)
	ADDQ      DX, R8
	VMOVDQU32 Z15, (R8)
	ADDQ      DX, R8
	MOVQ      R8, DI
	ADDQ      $64, SI
	DECQ      CX
	JNZ       t16block

t16done:
	VZEROUPPER
	RET
