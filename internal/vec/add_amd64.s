//go:build !purego

#include "textflag.h"

// func addF32AVX2(dst, src []float32)
TEXT ·addF32AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	XORQ AX, AX // i

	MOVQ CX, DX
	ANDQ $-32, DX // whole blocks of 32
	JZ   f32eight

f32block:
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VMOVUPS 64(DI)(AX*4), Y2
	VMOVUPS 96(DI)(AX*4), Y3
	VADDPS  (SI)(AX*4), Y0, Y0
	VADDPS  32(SI)(AX*4), Y1, Y1
	VADDPS  64(SI)(AX*4), Y2, Y2
	VADDPS  96(SI)(AX*4), Y3, Y3
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	VMOVUPS Y2, 64(DI)(AX*4)
	VMOVUPS Y3, 96(DI)(AX*4)
	ADDQ    $32, AX
	CMPQ    AX, DX
	JNE     f32block

f32eight:
	MOVQ CX, DX
	ANDQ $-8, DX
	CMPQ AX, DX
	JE   f32tail

f32eightloop:
	VMOVUPS (DI)(AX*4), Y0
	VADDPS  (SI)(AX*4), Y0, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ    $8, AX
	CMPQ    AX, DX
	JNE     f32eightloop

f32tail:
	CMPQ AX, CX
	JE   f32done

f32tailloop:
	VMOVSS (DI)(AX*4), X0
	VADDSS (SI)(AX*4), X0, X0
	VMOVSS X0, (DI)(AX*4)
	INCQ   AX
	CMPQ   AX, CX
	JNE    f32tailloop

f32done:
	VZEROUPPER
	RET

// func addF64AVX2(dst, src []float64)
TEXT ·addF64AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	XORQ AX, AX

	MOVQ CX, DX
	ANDQ $-16, DX
	JZ   f64four

f64block:
	VMOVUPD (DI)(AX*8), Y0
	VMOVUPD 32(DI)(AX*8), Y1
	VMOVUPD 64(DI)(AX*8), Y2
	VMOVUPD 96(DI)(AX*8), Y3
	VADDPD  (SI)(AX*8), Y0, Y0
	VADDPD  32(SI)(AX*8), Y1, Y1
	VADDPD  64(SI)(AX*8), Y2, Y2
	VADDPD  96(SI)(AX*8), Y3, Y3
	VMOVUPD Y0, (DI)(AX*8)
	VMOVUPD Y1, 32(DI)(AX*8)
	VMOVUPD Y2, 64(DI)(AX*8)
	VMOVUPD Y3, 96(DI)(AX*8)
	ADDQ    $16, AX
	CMPQ    AX, DX
	JNE     f64block

f64four:
	MOVQ CX, DX
	ANDQ $-4, DX
	CMPQ AX, DX
	JE   f64tail

f64fourloop:
	VMOVUPD (DI)(AX*8), Y0
	VADDPD  (SI)(AX*8), Y0, Y0
	VMOVUPD Y0, (DI)(AX*8)
	ADDQ    $4, AX
	CMPQ    AX, DX
	JNE     f64fourloop

f64tail:
	CMPQ AX, CX
	JE   f64done

f64tailloop:
	VMOVSD (DI)(AX*8), X0
	VADDSD (SI)(AX*8), X0, X0
	VMOVSD X0, (DI)(AX*8)
	INCQ   AX
	CMPQ   AX, CX
	JNE    f64tailloop

f64done:
	VZEROUPPER
	RET

// func axpyF32AVX2(alpha float32, x, y []float32)
TEXT ·axpyF32AVX2(SB), NOSPLIT, $0-56
	VBROADCASTSS alpha+0(FP), Y4
	MOVQ         x_base+8(FP), SI
	MOVQ         y_base+32(FP), DI
	MOVQ         y_len+40(FP), CX
	XORQ         AX, AX

	MOVQ CX, DX
	ANDQ $-32, DX
	JZ   axeight

axblock:
	VMULPS  (SI)(AX*4), Y4, Y0
	VMULPS  32(SI)(AX*4), Y4, Y1
	VMULPS  64(SI)(AX*4), Y4, Y2
	VMULPS  96(SI)(AX*4), Y4, Y3
	VADDPS  (DI)(AX*4), Y0, Y0
	VADDPS  32(DI)(AX*4), Y1, Y1
	VADDPS  64(DI)(AX*4), Y2, Y2
	VADDPS  96(DI)(AX*4), Y3, Y3
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	VMOVUPS Y2, 64(DI)(AX*4)
	VMOVUPS Y3, 96(DI)(AX*4)
	ADDQ    $32, AX
	CMPQ    AX, DX
	JNE     axblock

axeight:
	MOVQ CX, DX
	ANDQ $-8, DX
	CMPQ AX, DX
	JE   axtail

axeightloop:
	VMULPS  (SI)(AX*4), Y4, Y0
	VADDPS  (DI)(AX*4), Y0, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ    $8, AX
	CMPQ    AX, DX
	JNE     axeightloop

axtail:
	CMPQ AX, CX
	JE   axdone

axtailloop:
	VMULSS (SI)(AX*4), X4, X0
	VADDSS (DI)(AX*4), X0, X0
	VMOVSS X0, (DI)(AX*4)
	INCQ   AX
	CMPQ   AX, CX
	JNE    axtailloop

axdone:
	VZEROUPPER
	RET
