//go:build amd64 && !purego

#include "textflag.h"

// func copyRepMovsb(dst, src *byte, n int)
//
// A forward byte copy with REP MOVSB; dst and src must not overlap.
TEXT ·copyRepMovsb(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	CLD
	REP; MOVSB
	RET
