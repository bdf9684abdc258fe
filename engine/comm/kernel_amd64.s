//go:build amd64 && !purego

#include "textflag.h"

// AVX2 and F16C kernels, called through the tables in kernel_amd64.go.
// Each processes n elements, a multiple of 16 (the level's block); the Go
// wrapper does the rest in Go. Loads and stores are unaligned. dst may be
// a or b: every block is loaded whole before its store.
//
// Operand order is Plan 9's, the reverse of Intel's: VMAXPS Y1, Y0, Y2 is
// Y2 = Y0 > Y1 ? Y0 : Y1, and VADDPS Y1, Y0, Y2 returns Y0's NaN (quieted)
// when both are NaN — the same operand the scalar Go code returns.

// BCAST32 broadcasts the 32-bit constant c into Y register y.
#define BCAST32(c, y) \
	MOVL $c, AX; \
	VMOVD AX, X15; \
	VPBROADCASTD X15, y

// ARGS3 loads dst, a, b and n (converted to a byte count of dst by shift
// s); the caller zeroes AX, the offset, after setting up its constants.
#define ARGS3(s) \
	MOVQ dst+0(FP), DI; \
	MOVQ a+8(FP), SI; \
	MOVQ b+16(FP), DX; \
	MOVQ n+24(FP), CX; \
	SHLQ $s, CX

// func sumF32AVX2(dst, a, b *float32, n int)
TEXT ·sumF32AVX2(SB), NOSPLIT, $0-32
	ARGS3(2)
	XORQ AX, AX
	MOVQ CX, BX
	ANDQ $~127, BX
	JZ   sum1

sum4:
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS 32(SI)(AX*1), Y1
	VMOVUPS 64(SI)(AX*1), Y2
	VMOVUPS 96(SI)(AX*1), Y3
	VADDPS  (DX)(AX*1), Y0, Y0
	VADDPS  32(DX)(AX*1), Y1, Y1
	VADDPS  64(DX)(AX*1), Y2, Y2
	VADDPS  96(DX)(AX*1), Y3, Y3
	VMOVUPS Y0, (DI)(AX*1)
	VMOVUPS Y1, 32(DI)(AX*1)
	VMOVUPS Y2, 64(DI)(AX*1)
	VMOVUPS Y3, 96(DI)(AX*1)
	ADDQ    $128, AX
	CMPQ    AX, BX
	JB      sum4

sum1:
	CMPQ AX, CX
	JAE  sumdone
	VMOVUPS (SI)(AX*1), Y0
	VADDPS  (DX)(AX*1), Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ    $32, AX
	JMP     sum1

sumdone:
	VZEROUPPER
	RET

// MAXMIN8 sets Y(r) = a op b for the 8 floats at offset off, where op is
// VMAXPS or VMINPS (a > b ? a : b, or a < b ? a : b, so b if either is
// NaN), then puts a back where a is NaN: NaN wins, a's first.
#define MAXMIN8(op, off, ya, yr, ym) \
	VMOVUPS   off(SI)(AX*1), ya; \
	op        off(DX)(AX*1), ya, yr; \
	VCMPPS    $3, ya, ya, ym; \
	VBLENDVPS ym, ya, yr, yr; \
	VMOVUPS   yr, off(DI)(AX*1)

#define MAXMINF32(op) \
	ARGS3(2); \
	XORQ AX, AX; \
	MOVQ CX, BX; \
	ANDQ $~63, BX; \
	JZ   one; \
two:; \
	MAXMIN8(op, 0, Y0, Y1, Y2); \
	MAXMIN8(op, 32, Y3, Y4, Y5); \
	ADDQ $64, AX; \
	CMPQ AX, BX; \
	JB   two; \
one:; \
	CMPQ AX, CX; \
	JAE  done; \
	MAXMIN8(op, 0, Y0, Y1, Y2); \
	ADDQ $32, AX; \
	JMP  one; \
done:; \
	VZEROUPPER; \
	RET

// func maxF32AVX2(dst, a, b *float32, n int)
TEXT ·maxF32AVX2(SB), NOSPLIT, $0-32
	MAXMINF32(VMAXPS)

// func minF32AVX2(dst, a, b *float32, n int)
TEXT ·minF32AVX2(SB), NOSPLIT, $0-32
	MAXMINF32(VMINPS)

// func divF32AVX2(dst *float32, n int, d float32)
TEXT ·divF32AVX2(SB), NOSPLIT, $0-20
	MOVQ         dst+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS d+16(FP), Y15
	SHLQ         $2, CX
	XORQ         AX, AX

div:
	CMPQ    AX, CX
	JAE     divdone
	VMOVUPS (DI)(AX*1), Y0
	VMOVUPS 32(DI)(AX*1), Y1
	VDIVPS  Y15, Y0, Y0
	VDIVPS  Y15, Y1, Y1
	VMOVUPS Y0, (DI)(AX*1)
	VMOVUPS Y1, 32(DI)(AX*1)
	ADDQ    $64, AX
	JMP     div

divdone:
	VZEROUPPER
	RET

// bfloat16 kernels work on 16 elements (32 bytes) at a time as two sets of
// float32 lanes, without unpacking: the even elements shifted into the top
// halves (VPSLLD $16) and the odd ones in place (low halves masked off).
// At the end VPBLENDW takes the even results' top halves (shifted back
// down) and the odd results' top halves.
//
// Rounding to bfloat16 is BF16FromFloat32's: r + 0x7fff + (r>>16 & 1),
// keep the top half. Its NaN case needs no code in the sums and divisions:
// the NaN they produce is an operand made quiet, or the default NaN, so
// its low half is zero and the addition cannot carry into the top half.
// Max and Min return an operand, which needs no rounding, only a NaN made
// quiet.

// BF16SPLIT loads 16 bfloat16 at off(reg) into float32 lanes ye (even
// elements) and yo (odd); Y14 holds 0xffff0000 in each lane.
#define BF16SPLIT(off, reg, ye, yo) \
	VMOVDQU off(reg)(AX*1), yo; \
	VPSLLD  $16, yo, ye; \
	VPAND   Y14, yo, yo

// BF16ROUND rounds the float32 lanes of y in place (the top halves are the
// result; the low halves are garbage); Y13 holds 1 and Y12 0x7fff in each
// lane; yt is scratch.
#define BF16ROUND(y, yt) \
	VPSRLD $16, y, yt; \
	VPAND  Y13, yt, yt; \
	VPADDD Y12, y, y; \
	VPADDD yt, y, y

// BF16JOIN stores the top halves of ye (even elements) and yo (odd) as 16
// bfloat16 at off(DI).
#define BF16JOIN(off, ye, yo) \
	VPSRLD   $16, ye, ye; \
	VPBLENDW $0xaa, yo, ye, ye; \
	VMOVDQU  ye, off(DI)(AX*1)

#define BF16CONSTS \
	BCAST32(0xffff0000, Y14); \
	BCAST32(1, Y13); \
	BCAST32(0x7fff, Y12); \
	BCAST32(0x3f800000, Y11)

// func sumBF16AVX2(dst, a, b *uint16, n int)
TEXT ·sumBF16AVX2(SB), NOSPLIT, $0-32
	ARGS3(1)
	BF16CONSTS
	XORQ AX, AX

bsum:
	CMPQ AX, CX
	JAE  bsumdone
	BF16SPLIT(0, SI, Y0, Y1)
	BF16SPLIT(0, DX, Y2, Y3)
	VADDPS Y2, Y0, Y0
	VADDPS Y3, Y1, Y1
	BF16ROUND(Y0, Y4)
	BF16ROUND(Y1, Y5)
	BF16JOIN(0, Y0, Y1)
	ADDQ $32, AX
	JMP  bsum

bsumdone:
	VZEROUPPER
	RET

// BF16MAXMIN sets ye = ae op be with NaN winning as in MAXMIN8, a's first;
// the result is an operand, so it needs no rounding, only a NaN made quiet
// (times 1.0: exact for everything else; Y11 holds 1.0).
#define BF16MAXMIN(op, ya, yb, yt) \
	op        yb, ya, yb; \
	VCMPPS    $3, ya, ya, yt; \
	VBLENDVPS yt, ya, yb, ya; \
	VMULPS    Y11, ya, ya

#define MAXMINBF16(op) \
	ARGS3(1); \
	BF16CONSTS; \
	XORQ AX, AX; \
loop:; \
	CMPQ AX, CX; \
	JAE  done; \
	BF16SPLIT(0, SI, Y0, Y1); \
	BF16SPLIT(0, DX, Y2, Y3); \
	BF16MAXMIN(op, Y0, Y2, Y4); \
	BF16MAXMIN(op, Y1, Y3, Y5); \
	BF16JOIN(0, Y0, Y1); \
	ADDQ $32, AX; \
	JMP  loop; \
done:; \
	VZEROUPPER; \
	RET

// func maxBF16AVX2(dst, a, b *uint16, n int)
TEXT ·maxBF16AVX2(SB), NOSPLIT, $0-32
	MAXMINBF16(VMAXPS)

// func minBF16AVX2(dst, a, b *uint16, n int)
TEXT ·minBF16AVX2(SB), NOSPLIT, $0-32
	MAXMINBF16(VMINPS)

// func divBF16AVX2(dst *uint16, n int, d float32)
TEXT ·divBF16AVX2(SB), NOSPLIT, $0-20
	MOVQ dst+0(FP), DI
	MOVQ n+8(FP), CX
	SHLQ $1, CX
	BF16CONSTS
	VBROADCASTSS d+16(FP), Y15
	XORQ AX, AX

bdiv:
	CMPQ AX, CX
	JAE  bdivdone
	BF16SPLIT(0, DI, Y0, Y1)
	VDIVPS Y15, Y0, Y0
	VDIVPS Y15, Y1, Y1
	BF16ROUND(Y0, Y4)
	BF16ROUND(Y1, Y5)
	BF16JOIN(0, Y0, Y1)
	ADDQ $32, AX
	JMP  bdiv

bdivdone:
	VZEROUPPER
	RET

// func encodeBF16AVX2(dst *uint16, src *float32, n int)
//
// Unlike in the reductions, src may hold any NaN, so NaN lanes take
// BF16FromFloat32's other branch: the value with the quiet bit set,
// truncated.
TEXT ·encodeBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHLQ $1, CX
	BCAST32(1, Y13)
	BCAST32(0x7fff, Y12)
	BCAST32(0x00400000, Y11)
	XORQ AX, AX

benc:
	CMPQ      AX, CX
	JAE       bencdone
	VMOVUPS   (SI)(AX*2), Y0
	VMOVUPS   32(SI)(AX*2), Y1
	VPSRLD    $16, Y0, Y4
	VPSRLD    $16, Y1, Y5
	VPAND     Y13, Y4, Y4
	VPAND     Y13, Y5, Y5
	VPADDD    Y12, Y0, Y2
	VPADDD    Y12, Y1, Y3
	VPADDD    Y4, Y2, Y2
	VPADDD    Y5, Y3, Y3
	VCMPPS    $3, Y0, Y0, Y4
	VCMPPS    $3, Y1, Y1, Y5
	VPOR      Y11, Y0, Y0
	VPOR      Y11, Y1, Y1
	VBLENDVPS Y4, Y0, Y2, Y2
	VBLENDVPS Y5, Y1, Y3, Y3
	VPSRLD    $16, Y2, Y2
	VPSRLD    $16, Y3, Y3
	VPACKUSDW Y3, Y2, Y2       // 128-bit lanes: Y2 lo, Y3 lo, Y2 hi, Y3 hi
	VPERMQ    $0xd8, Y2, Y2
	VMOVDQU   Y2, (DI)(AX*1)
	ADDQ      $32, AX
	JMP       benc

bencdone:
	VZEROUPPER
	RET

// func decodeBF16AVX2(dst *float32, src *uint16, n int)
TEXT ·decodeBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHLQ $1, CX
	XORQ AX, AX

bdec:
	CMPQ      AX, CX
	JAE       bdecdone
	VPMOVZXWD (SI)(AX*1), Y0
	VPMOVZXWD 16(SI)(AX*1), Y1
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VMOVDQU   Y0, (DI)(AX*2)
	VMOVDQU   Y1, 32(DI)(AX*2)
	ADDQ      $32, AX
	JMP       bdec

bdecdone:
	VZEROUPPER
	RET

// float16 kernels: F16C converts exactly both ways (VCVTPS2PH with
// immediate 0 rounds to nearest-even, to subnormals, to Inf on overflow,
// ignoring MXCSR) and makes a NaN quiet keeping its sign and top payload
// bits, as F16FromFloat32 does. VCVTPH2PS also makes a signalling NaN
// quiet, which DecodeF16 must not, but which a reduction cannot tell: its
// result is rounded back, which makes it quiet anyway.

// func sumF16AVX2(dst, a, b *uint16, n int)
TEXT ·sumF16AVX2(SB), NOSPLIT, $0-32
	ARGS3(1)
	XORQ AX, AX

hsum:
	CMPQ      AX, CX
	JAE       hsumdone
	VCVTPH2PS (SI)(AX*1), Y0
	VCVTPH2PS 16(SI)(AX*1), Y1
	VCVTPH2PS (DX)(AX*1), Y2
	VCVTPH2PS 16(DX)(AX*1), Y3
	VADDPS    Y2, Y0, Y0
	VADDPS    Y3, Y1, Y1
	VCVTPS2PH $0, Y0, (DI)(AX*1)
	VCVTPS2PH $0, Y1, 16(DI)(AX*1)
	ADDQ      $32, AX
	JMP       hsum

hsumdone:
	VZEROUPPER
	RET

#define F16MAXMIN8(op, off, ya, yb, yt) \
	VCVTPH2PS off(SI)(AX*1), ya; \
	VCVTPH2PS off(DX)(AX*1), yb; \
	op        yb, ya, yb; \
	VCMPPS    $3, ya, ya, yt; \
	VBLENDVPS yt, ya, yb, ya; \
	VCVTPS2PH $0, ya, off(DI)(AX*1)

#define MAXMINF16(op) \
	ARGS3(1); \
	XORQ AX, AX; \
loop:; \
	CMPQ AX, CX; \
	JAE  done; \
	F16MAXMIN8(op, 0, Y0, Y1, Y2); \
	F16MAXMIN8(op, 16, Y3, Y4, Y5); \
	ADDQ $32, AX; \
	JMP  loop; \
done:; \
	VZEROUPPER; \
	RET

// func maxF16AVX2(dst, a, b *uint16, n int)
TEXT ·maxF16AVX2(SB), NOSPLIT, $0-32
	MAXMINF16(VMAXPS)

// func minF16AVX2(dst, a, b *uint16, n int)
TEXT ·minF16AVX2(SB), NOSPLIT, $0-32
	MAXMINF16(VMINPS)

// func divF16AVX2(dst *uint16, n int, d float32)
TEXT ·divF16AVX2(SB), NOSPLIT, $0-20
	MOVQ         dst+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS d+16(FP), Y15
	SHLQ         $1, CX
	XORQ         AX, AX

hdiv:
	CMPQ      AX, CX
	JAE       hdivdone
	VCVTPH2PS (DI)(AX*1), Y0
	VCVTPH2PS 16(DI)(AX*1), Y1
	VDIVPS    Y15, Y0, Y0
	VDIVPS    Y15, Y1, Y1
	VCVTPS2PH $0, Y0, (DI)(AX*1)
	VCVTPS2PH $0, Y1, 16(DI)(AX*1)
	ADDQ      $32, AX
	JMP       hdiv

hdivdone:
	VZEROUPPER
	RET

// func encodeF16AVX2(dst *uint16, src *float32, n int)
TEXT ·encodeF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHLQ $1, CX
	XORQ AX, AX

henc:
	CMPQ      AX, CX
	JAE       hencdone
	VMOVUPS   (SI)(AX*2), Y0
	VMOVUPS   32(SI)(AX*2), Y1
	VCVTPS2PH $0, Y0, (DI)(AX*1)
	VCVTPS2PH $0, Y1, 16(DI)(AX*1)
	ADDQ      $32, AX
	JMP       henc

hencdone:
	VZEROUPPER
	RET

// F16DEC8 widens the 8 float16 at off(SI) into off*2(DI), keeping a
// signalling NaN signalling: VCVTPH2PS sets bit 22 of a NaN, so it is
// cleared again in the lanes whose float16 has exponent 0x1f and bit 9
// clear (for an Inf that bit is clear already). Y14 holds 0x0fc00000 and
// Y13 0x0f800000 (exponent and quiet bit, at their float32 places after
// shifting the float16 left by 13), Y12 0x00400000.
#define F16DEC8(off, doff, yf, yh) \
	VCVTPH2PS off(SI)(AX*1), yf; \
	VPMOVZXWD off(SI)(AX*1), yh; \
	VPSLLD    $13, yh, yh; \
	VPAND     Y14, yh, yh; \
	VPCMPEQD  Y13, yh, yh; \
	VPAND     Y12, yh, yh; \
	VPANDN    yf, yh, yf; \
	VMOVUPS   yf, doff(DI)(AX*2)

// func decodeF16AVX2(dst *float32, src *uint16, n int)
TEXT ·decodeF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHLQ $1, CX
	BCAST32(0x0fc00000, Y14)
	BCAST32(0x0f800000, Y13)
	BCAST32(0x00400000, Y12)
	XORQ AX, AX

hdec:
	CMPQ AX, CX
	JAE  hdecdone
	F16DEC8(0, 0, Y0, Y1)
	F16DEC8(16, 32, Y2, Y3)
	ADDQ $32, AX
	JMP  hdec

hdecdone:
	VZEROUPPER
	RET
