//go:build amd64 && !purego

#include "textflag.h"

// The vector loops of elementwise.go: eight float32 lanes, each
// instruction the rounding of one scalar operation of the Go loop, in the
// same order (no fused multiply-adds). Lengths are multiples of 8.

DATA elemOne<>+0(SB)/4, $0x3f800000 // 1
GLOBL elemOne<>(SB), RODATA|NOPTR, $4

// func geluArgAVX2(e, x []float32, k *[4]float32)
//
// e = k1·(x + ((k0·x)·x)·x).
TEXT ·geluArgAVX2(SB), NOSPLIT, $0-56
	MOVQ e_base+0(FP), DI
	MOVQ x_base+24(FP), SI
	MOVQ x_len+32(FP), CX
	MOVQ k+48(FP), AX
	SHRQ $3, CX
	JZ   argDone
	VBROADCASTSS 0(AX), Y15 // 0.044715
	VBROADCASTSS 4(AX), Y14 // -2·√(2/π)

argLoop:
	VMOVUPS (SI), Y0
	VMULPS  Y0, Y15, Y1
	VMULPS  Y0, Y1, Y1
	VMULPS  Y0, Y1, Y1
	VADDPS  Y1, Y0, Y1
	VMULPS  Y1, Y14, Y1
	VMOVUPS Y1, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     argLoop

argDone:
	VZEROUPPER
	RET

// func geluOutAVX2(o, x, e []float32)
//
// o = x / (1 + e).
TEXT ·geluOutAVX2(SB), NOSPLIT, $0-72
	MOVQ o_base+0(FP), DI
	MOVQ x_base+24(FP), SI
	MOVQ x_len+32(FP), CX
	MOVQ e_base+48(FP), DX
	SHRQ $3, CX
	JZ   outDone
	VBROADCASTSS elemOne<>(SB), Y15

outLoop:
	VADDPS  (DX), Y15, Y1
	VMOVUPS (SI), Y0
	VDIVPS  Y1, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     outLoop

outDone:
	VZEROUPPER
	RET

// func geluGradOutAVX2(di, x, e, d []float32, k *[4]float32)
//
// σ = 1/(1 + e); du = k3·(1 + (k2·x)·x);
// di += (σ + (((2x)·σ)·(1 - σ))·du)·d.
TEXT ·geluGradOutAVX2(SB), NOSPLIT, $0-104
	MOVQ di_base+0(FP), DI
	MOVQ x_base+24(FP), SI
	MOVQ x_len+32(FP), CX
	MOVQ e_base+48(FP), DX
	MOVQ d_base+72(FP), R8
	MOVQ k+96(FP), AX
	SHRQ $3, CX
	JZ   gradDone
	VBROADCASTSS elemOne<>(SB), Y15
	VBROADCASTSS 8(AX), Y14         // 3·0.044715
	VBROADCASTSS 12(AX), Y13        // √(2/π)

gradLoop:
	VMOVUPS (SI), Y0
	VADDPS  (DX), Y15, Y1
	VDIVPS  Y1, Y15, Y2 // σ
	VMULPS  Y0, Y14, Y3
	VMULPS  Y0, Y3, Y3
	VADDPS  Y15, Y3, Y3
	VMULPS  Y3, Y13, Y3 // du
	VADDPS  Y0, Y0, Y4  // 2x, exact
	VMULPS  Y2, Y4, Y4
	VSUBPS  Y2, Y15, Y5 // 1 - σ
	VMULPS  Y5, Y4, Y4
	VMULPS  Y3, Y4, Y4
	VADDPS  Y4, Y2, Y4
	VMULPS  (R8), Y4, Y4
	VADDPS  (DI), Y4, Y4
	VMOVUPS Y4, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, R8
	ADDQ    $32, DI
	DECQ    CX
	JNZ     gradLoop

gradDone:
	VZEROUPPER
	RET

// func addF64AVX2(acc []float64, d []float32)
//
// acc += float64(d), eight at a time.
TEXT ·addF64AVX2(SB), NOSPLIT, $0-48
	MOVQ acc_base+0(FP), DI
	MOVQ d_base+24(FP), SI
	MOVQ d_len+32(FP), CX
	SHRQ $3, CX
	JZ   addDone

addLoop:
	VCVTPS2PD (SI), Y0
	VCVTPS2PD 16(SI), Y1
	VADDPD    (DI), Y0, Y0
	VADDPD    32(DI), Y1, Y1
	VMOVUPD   Y0, (DI)
	VMOVUPD   Y1, 32(DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       addLoop

addDone:
	VZEROUPPER
	RET

// func addToAVX2(out, a, b []float32)
//
// out = a + b; out may be a or b.
TEXT ·addToAVX2(SB), NOSPLIT, $0-72
	MOVQ out_base+0(FP), DI
	MOVQ out_len+8(FP), CX
	MOVQ a_base+24(FP), SI
	MOVQ b_base+48(FP), DX
	SHRQ $3, CX
	JZ   sumDone

sumLoop:
	VMOVUPS (SI), Y0
	VADDPS  (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     sumLoop

sumDone:
	VZEROUPPER
	RET

// func lnOutAVX2(o, x, w, b []float32, m, s float32)
//
// o = ((x - m)·s)·w + b.
TEXT ·lnOutAVX2(SB), NOSPLIT, $0-104
	MOVQ o_base+0(FP), DI
	MOVQ x_base+24(FP), SI
	MOVQ x_len+32(FP), CX
	MOVQ w_base+48(FP), DX
	MOVQ b_base+72(FP), R8
	SHRQ $3, CX
	JZ   lnoDone
	VBROADCASTSS m+96(FP), Y15
	VBROADCASTSS s+100(FP), Y14

lnoLoop:
	VMOVUPS (SI), Y0
	VSUBPS  Y15, Y0, Y0
	VMULPS  Y14, Y0, Y0
	VMULPS  (DX), Y0, Y0
	VADDPS  (R8), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, R8
	ADDQ    $32, DI
	DECQ    CX
	JNZ     lnoLoop

lnoDone:
	VZEROUPPER
	RET

// func lnGradOutAVX2(di, x, w, d []float32, k *[4]float32)
//
// di += ((w·d - gMean) - ((x - m)·s)·gxMean)·s, with k = {m, s, gMean,
// gxMean}.
TEXT ·lnGradOutAVX2(SB), NOSPLIT, $0-104
	MOVQ di_base+0(FP), DI
	MOVQ x_base+24(FP), SI
	MOVQ x_len+32(FP), CX
	MOVQ w_base+48(FP), DX
	MOVQ d_base+72(FP), R8
	MOVQ k+96(FP), AX
	SHRQ $3, CX
	JZ   lngDone
	VBROADCASTSS 0(AX), Y15  // m
	VBROADCASTSS 4(AX), Y14  // s
	VBROADCASTSS 8(AX), Y13  // gMean
	VBROADCASTSS 12(AX), Y12 // gxMean

lngLoop:
	VMOVUPS (DX), Y0
	VMULPS  (R8), Y0, Y0
	VSUBPS  Y13, Y0, Y0  // w·d - gMean
	VMOVUPS (SI), Y1
	VSUBPS  Y15, Y1, Y1
	VMULPS  Y14, Y1, Y1
	VMULPS  Y12, Y1, Y1  // ((x - m)·s)·gxMean
	VSUBPS  Y1, Y0, Y0
	VMULPS  Y14, Y0, Y0
	VADDPS  (DI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, R8
	ADDQ    $32, DI
	DECQ    CX
	JNZ     lngLoop

lngDone:
	VZEROUPPER
	RET

// func lnParamGradAVX2(dweight, dbias, d, x []float32, m, s float32)
//
// dbias += d; dweight += ((x - m)·s)·d.
TEXT ·lnParamGradAVX2(SB), NOSPLIT, $0-104
	MOVQ dweight_base+0(FP), DI
	MOVQ dweight_len+8(FP), CX
	MOVQ dbias_base+24(FP), DX
	MOVQ d_base+48(FP), R8
	MOVQ x_base+72(FP), SI
	SHRQ $3, CX
	JZ   lnpDone
	VBROADCASTSS m+96(FP), Y15
	VBROADCASTSS s+100(FP), Y14

lnpLoop:
	VMOVUPS (R8), Y2
	VADDPS  (DX), Y2, Y0
	VMOVUPS Y0, (DX)
	VMOVUPS (SI), Y1
	VSUBPS  Y15, Y1, Y1
	VMULPS  Y14, Y1, Y1
	VMULPS  Y2, Y1, Y1
	VADDPS  (DI), Y1, Y1
	VMOVUPS Y1, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, R8
	ADDQ    $32, DI
	DECQ    CX
	JNZ     lnpLoop

lnpDone:
	VZEROUPPER
	RET

// func subScalarAVX2(x []float32, c float32)
TEXT ·subScalarAVX2(SB), NOSPLIT, $0-28
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	SHRQ $3, CX
	JZ   subDone
	VBROADCASTSS c+24(FP), Y15

subLoop:
	VMOVUPS (SI), Y0
	VSUBPS  Y15, Y0, Y0
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	DECQ    CX
	JNZ     subLoop

subDone:
	VZEROUPPER
	RET

// func max32AVX2(x []float32, lanes *[8]float32)
//
// Four accumulators of 8 lanes, 32 elements a step. VMAXPS Ym, Yv, Ym is
// v > m ? v : m, as max32's Go loop compares: a tie or a NaN keeps m.
TEXT ·max32AVX2(SB), NOSPLIT, $0-32
	MOVQ         x_base+0(FP), SI
	MOVQ         x_len+8(FP), CX
	MOVQ         lanes+24(FP), DI
	VBROADCASTSS (SI), Y0
	VMOVAPS      Y0, Y1
	VMOVAPS      Y0, Y2
	VMOVAPS      Y0, Y3
	SHRQ         $5, CX
	JZ           maxDone

maxLoop:
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VMAXPS  Y0, Y4, Y0
	VMAXPS  Y1, Y5, Y1
	VMAXPS  Y2, Y6, Y2
	VMAXPS  Y3, Y7, Y3
	ADDQ    $128, SI
	DECQ    CX
	JNZ     maxLoop

maxDone:
	VMAXPS  Y1, Y0, Y0
	VMAXPS  Y3, Y2, Y2
	VMAXPS  Y2, Y0, Y0
	VMOVUPS Y0, (DI)
	VZEROUPPER
	RET

// func mulScalarAVX2(x []float32, c float32)
TEXT ·mulScalarAVX2(SB), NOSPLIT, $0-28
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	SHRQ $3, CX
	JZ   mulDone
	VBROADCASTSS c+24(FP), Y15

mulLoop:
	VMULPS  (SI), Y15, Y0
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	DECQ    CX
	JNZ     mulLoop

mulDone:
	VZEROUPPER
	RET

// func softmaxGradAVX2(g, p []float32, dot float32)
//
// g = p·(g - dot).
TEXT ·softmaxGradAVX2(SB), NOSPLIT, $0-52
	MOVQ g_base+0(FP), DI
	MOVQ p_base+24(FP), SI
	MOVQ p_len+32(FP), CX
	SHRQ $3, CX
	JZ   sgDone
	VBROADCASTSS dot+48(FP), Y15

sgLoop:
	VMOVUPS (DI), Y0
	VSUBPS  Y15, Y0, Y0
	VMULPS  (SI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     sgLoop

sgDone:
	VZEROUPPER
	RET
