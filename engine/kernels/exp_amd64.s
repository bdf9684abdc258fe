//go:build amd64 && !purego

#include "textflag.h"

// Constants of expAVX2, one float32 (or int32) each, broadcast to all
// lanes on entry; see mathf.go for what they are.
DATA expc<>+0(SB)/4, $0x3fb8aa3b  // log2(e)
DATA expc<>+4(SB)/4, $0x4b400000  // 1.5·2^23, the rounding constant
DATA expc<>+8(SB)/4, $0x3f318000  // ln2, high part
DATA expc<>+12(SB)/4, $0xb95e8083 // ln2, low part
DATA expc<>+16(SB)/4, $0x39506967 // P0
DATA expc<>+20(SB)/4, $0x3ab743ce // P1
DATA expc<>+24(SB)/4, $0x3c088908 // P2
DATA expc<>+28(SB)/4, $0x3d2aa9c1 // P3
DATA expc<>+32(SB)/4, $0x3e2aaaaa // P4
DATA expc<>+36(SB)/4, $0x3f000000 // P5
DATA expc<>+40(SB)/4, $0x3f800000 // 1
DATA expc<>+44(SB)/4, $0xc2adcccd // expMin, -86.9
DATA expc<>+48(SB)/4, $0x42b17217 // expMax, 88.72283
DATA expc<>+52(SB)/4, $0x7f800000 // +Inf
DATA expc<>+56(SB)/4, $126        // exponent bias - 1, an int32
GLOBL expc<>(SB), RODATA|NOPTR, $60

// func expAVX2(x []float32)
//
// The algorithm of expInPlaceGo, eight lanes at a time, with fused
// multiply-adds. len(x) must be a multiple of 8.
TEXT ·expAVX2(SB), NOSPLIT, $0-24
	MOVQ x_base+0(FP), DI
	MOVQ x_len+8(FP), CX
	SHRQ $3, CX
	JZ   done
	VBROADCASTSS expc<>+0(SB), Y15
	VBROADCASTSS expc<>+4(SB), Y14
	VBROADCASTSS expc<>+8(SB), Y13
	VBROADCASTSS expc<>+12(SB), Y12
	VBROADCASTSS expc<>+16(SB), Y11
	VBROADCASTSS expc<>+20(SB), Y10
	VBROADCASTSS expc<>+24(SB), Y9
	VBROADCASTSS expc<>+28(SB), Y8
	VBROADCASTSS expc<>+32(SB), Y7
	VBROADCASTSS expc<>+36(SB), Y6

loop:
	VMOVUPS (DI), Y0 // x

	// Clamp x to [expMin, expMax]; NaN passes through, since MAXPS and
	// MINPS return their second (Intel) source when either is NaN.
	VBROADCASTSS expc<>+44(SB), Y1
	VMAXPS       Y0, Y1, Y1
	VBROADCASTSS expc<>+48(SB), Y2
	VMINPS       Y1, Y2, Y1

	// z = x·log2e + 1.5·2^23 rounds x·log2e to the integer n, held in
	// z's low mantissa bits; r = x - n·ln2 in two steps.
	VMOVAPS      Y1, Y2
	VFMADD213PS  Y14, Y15, Y2
	VSUBPS       Y14, Y2, Y3
	VFNMADD231PS Y13, Y3, Y1
	VFNMADD231PS Y12, Y3, Y1

	// p = 1 + r + r²·P(r)
	VMOVAPS      Y11, Y3
	VFMADD213PS  Y10, Y1, Y3
	VFMADD213PS  Y9, Y1, Y3
	VFMADD213PS  Y8, Y1, Y3
	VFMADD213PS  Y7, Y1, Y3
	VFMADD213PS  Y6, Y1, Y3
	VMULPS       Y1, Y1, Y4
	VFMADD213PS  Y1, Y4, Y3
	VBROADCASTSS expc<>+40(SB), Y4
	VADDPS       Y4, Y3, Y3

	// e^x = 2p · 2^(n-1), the power built in the exponent field.
	VADDPS       Y3, Y3, Y3
	VPSUBD       Y14, Y2, Y2
	VPBROADCASTD expc<>+56(SB), Y4
	VPADDD       Y4, Y2, Y2
	VPSLLD       $23, Y2, Y2
	VMULPS       Y2, Y3, Y3

	// 0 below expMin, +Inf above expMax.
	VBROADCASTSS expc<>+44(SB), Y4
	VCMPPS       $0x01, Y4, Y0, Y5 // x < expMin
	VANDNPS      Y3, Y5, Y3
	VBROADCASTSS expc<>+48(SB), Y4
	VCMPPS       $0x0e, Y4, Y0, Y5 // x > expMax
	VBROADCASTSS expc<>+52(SB), Y4
	VBLENDVPS    Y5, Y4, Y3, Y3

	VMOVUPS Y3, (DI)
	ADDQ    $32, DI
	DECQ    CX
	JNZ     loop
	VZEROUPPER

done:
	RET
