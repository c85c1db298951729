//go:build !purego

#include "textflag.h"

// func streamCopyAVX2(dst, src *byte, n int)
//
// n is a positive multiple of 128 and dst is 32-byte aligned. The stores
// are non-temporal (VMOVNTDQ) and fenced (SFENCE) before it returns.
TEXT ·streamCopyAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

streamblock:
	VMOVDQU  (SI), Y0
	VMOVDQU  32(SI), Y1
	VMOVDQU  64(SI), Y2
	VMOVDQU  96(SI), Y3
	VMOVNTDQ Y0, (DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ     $128, SI
	ADDQ     $128, DI
	SUBQ     $128, CX
	JNZ      streamblock

	SFENCE
	VZEROUPPER
	RET
