//go:build amd64 && !purego

#include "textflag.h"

// func adamwAVX2(p, g, m, v []float32, k *adamwK)
//
// adamwGo eight lanes at a time, one rounding per operation in its order:
// g' = g·scale; m = b1·m + omb1·g'; v = b2·v + (omb2·g')·g';
// p = p·decay - (stepSize·m) / (√v / sqrtBC2 + eps).
TEXT ·adamwAVX2(SB), NOSPLIT, $0-104
	MOVQ p_base+0(FP), DI
	MOVQ p_len+8(FP), CX
	MOVQ g_base+24(FP), SI
	MOVQ m_base+48(FP), R8
	MOVQ v_base+72(FP), R9
	MOVQ k+96(FP), AX
	SHRQ $3, CX
	JZ   done
	VBROADCASTSS 0(AX), Y7   // scale
	VBROADCASTSS 4(AX), Y8   // b1
	VBROADCASTSS 8(AX), Y9   // 1 - b1
	VBROADCASTSS 12(AX), Y10 // b2
	VBROADCASTSS 16(AX), Y11 // 1 - b2
	VBROADCASTSS 20(AX), Y12 // √(1 - b2^t)
	VBROADCASTSS 24(AX), Y13 // eps
	VBROADCASTSS 28(AX), Y14 // decay
	VBROADCASTSS 32(AX), Y15 // stepSize

loop:
	VMULPS  (SI), Y7, Y0 // g'
	VMULPS  (R8), Y8, Y1
	VMULPS  Y0, Y9, Y2
	VADDPS  Y2, Y1, Y1   // m
	VMULPS  (R9), Y10, Y2
	VMULPS  Y0, Y11, Y3
	VMULPS  Y0, Y3, Y3
	VADDPS  Y3, Y2, Y2   // v
	VMOVUPS Y1, (R8)
	VMOVUPS Y2, (R9)
	VSQRTPS Y2, Y3
	VDIVPS  Y12, Y3, Y3
	VADDPS  Y13, Y3, Y3  // denominator
	VMULPS  Y1, Y15, Y4
	VDIVPS  Y3, Y4, Y4
	VMULPS  (DI), Y14, Y5
	VSUBPS  Y4, Y5, Y5
	VMOVUPS Y5, (DI)
	ADDQ    $32, SI
	ADDQ    $32, R8
	ADDQ    $32, R9
	ADDQ    $32, DI
	DECQ    CX
	JNZ     loop

done:
	VZEROUPPER
	RET
