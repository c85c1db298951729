package pipeline

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// gemmSizes are matrix dimensions around gonum's 64-wide blocks.
var gemmSizes = []int{1, 3, 4, 63, 64, 65, 130, 256}

// randVals returns n values with some exact zeros and negative zeros,
// which gonum's kernels skip.
func randVals(r *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		switch r.IntN(16) {
		case 0:
			v[i] = 0
		case 1:
			v[i] = math.Copysign(0, -1)
		default:
			v[i] = r.NormFloat64()
		}
	}
	return v
}

// TestGemmMatchesGonum checks gemm32 and gemm64 bit for bit against gonum's
// Sgemm and Dgemm (alpha 1, beta 0, parallel where gonum goes parallel)
// for every transposition and shapes on both sides of its block size, and
// gemmAdd32 and gemmAdd64 against that product added with addInto.
func TestGemmMatchesGonum(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var impl gonum.Implementation
	for _, tA := range []bool{false, true} {
		for _, tB := range []bool{false, true} {
			for _, m := range gemmSizes {
				for _, n := range gemmSizes {
					for _, k := range []int{1, 4, 64, 65, 200} {
						lda, ldb := k, n
						if tA {
							lda = m
						}
						if tB {
							ldb = k
						}
						a, b := randVals(r, m*k), randVals(r, k*n)
						// C starts as garbage: beta 0 overwrites it.
						c0 := randVals(r, m*n)
						want, got := append([]float64(nil), c0...), append([]float64(nil), c0...)
						impl.Dgemm(trans(tA), trans(tB), m, n, k, 1, a, lda, b, ldb, 0, want, n)
						gemm64(tA, tB, m, n, k, a, lda, b, ldb, got, n)
						for i := range want {
							if math.Float64bits(want[i]) != math.Float64bits(got[i]) {
								t.Fatalf("float64 tA=%v tB=%v m=%d n=%d k=%d: element %d is %v, gonum gives %v", tA, tB, m, n, k, i, got[i], want[i])
							}
						}
						// gemmAdd64 adds the same product to a matrix.
						acc0 := randVals(r, m*n)
						wantAcc, gotAcc := append([]float64(nil), acc0...), append([]float64(nil), acc0...)
						if err := addInto(wantAcc, want); err != nil {
							t.Fatal(err)
						}
						gemmAdd64(tA, tB, m, n, k, a, lda, b, ldb, gotAcc, randVals(r, min(m, gemmBlock)*n))
						for i := range wantAcc {
							if math.Float64bits(wantAcc[i]) != math.Float64bits(gotAcc[i]) {
								t.Fatalf("gemmAdd64 tA=%v tB=%v m=%d n=%d k=%d: element %d is %v, want %v", tA, tB, m, n, k, i, gotAcc[i], wantAcc[i])
							}
						}
						a32, b32, c32 := to32(a), to32(b), to32(c0)
						want32, got32 := append([]float32(nil), c32...), append([]float32(nil), c32...)
						impl.Sgemm(trans(tA), trans(tB), m, n, k, 1, a32, lda, b32, ldb, 0, want32, n)
						gemm32(tA, tB, m, n, k, a32, lda, b32, ldb, got32, n)
						for i := range want32 {
							if math.Float32bits(want32[i]) != math.Float32bits(got32[i]) {
								t.Fatalf("float32 tA=%v tB=%v m=%d n=%d k=%d: element %d is %v, gonum gives %v", tA, tB, m, n, k, i, got32[i], want32[i])
							}
						}
						acc32 := to32(acc0)
						wantAcc32, gotAcc32 := append([]float32(nil), acc32...), append([]float32(nil), acc32...)
						if err := addInto(wantAcc32, want32); err != nil {
							t.Fatal(err)
						}
						gemmAdd32(tA, tB, m, n, k, a32, lda, b32, ldb, gotAcc32, to32(randVals(r, min(m, gemmBlock)*n)))
						for i := range wantAcc32 {
							if math.Float32bits(wantAcc32[i]) != math.Float32bits(gotAcc32[i]) {
								t.Fatalf("gemmAdd32 tA=%v tB=%v m=%d n=%d k=%d: element %d is %v, want %v", tA, tB, m, n, k, i, gotAcc32[i], wantAcc32[i])
							}
						}
					}
				}
			}
		}
	}
}

func to32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// TestMatMulMatchesOp checks that the executor's matrix product gives
// bitwise what Gorgonia's op gives, for the products of a layer's forward
// pass and of its gradients (A×B, Aᵀ×B, A×Bᵀ), in both dtypes.
func TestMatMulMatchesOp(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, rows := range []int{1, 4, 65, 128} {
			for _, sz := range [][2]int{{256, 256}, {3, 130}, {64, 65}} {
				t.Run(fmt.Sprintf("%v/rows=%d/%dx%d", dt, rows, sz[0], sz[1]), func(t *testing.T) {
					g := gorgonia.NewGraph()
					x := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(rows, sz[0]), gorgonia.WithName("x"))
					w := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(sz[0], sz[1]), gorgonia.WithName("w"))
					z := gorgonia.Must(gorgonia.Mul(x, w))
					cost := gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.Square(z))))
					if _, err := gorgonia.Grad(cost, x, w); err != nil {
						t.Fatal(err)
					}
					seen := map[matMul]bool{}
					for _, n := range g.AllNodes() {
						mm, ok := asMatMul(n.Op())
						if !ok {
							continue
						}
						seen[mm] = true
						cs := children(g, n)
						a := randDense(r, dt, cs[0].Shape())
						b := randDense(r, dt, cs[1].Shape())
						want, err := n.Op().Do(a, b)
						if err != nil {
							t.Fatal(err)
						}
						got, ok := mm.run(nil, false, a, b)
						if !ok {
							t.Fatalf("%v: not run by the executor", n.Op())
						}
						// Again into the first result, as the next run does.
						got, ok = mm.run(got, true, a, b)
						if !ok {
							t.Fatalf("%v: not run by the executor into its last value", n.Op())
						}
						requireSameBits(t, n.Op().String(), want, got)
					}
					if len(seen) != 3 {
						t.Fatalf("found the matrix products %v, want A×B, Aᵀ×B and A×Bᵀ", seen)
					}
				})
			}
		}
	}
}

func randDense(r *rand.Rand, dt tensor.Dtype, shape tensor.Shape) *tensor.Dense {
	v := randVals(r, shape.TotalSize())
	if dt == tensor.Float32 {
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(to32(v)))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
}

// requireSameBits fails unless want and got are dense tensors of the same
// shape and bitwise equal data.
func requireSameBits(t *testing.T, what string, want, got gorgonia.Value) {
	t.Helper()
	w, g := want.(*tensor.Dense), got.(*tensor.Dense)
	if !w.Shape().Eq(g.Shape()) {
		t.Fatalf("%s: shape %v, want %v", what, g.Shape(), w.Shape())
	}
	switch wd := w.Data().(type) {
	case []float32:
		gd := g.Data().([]float32)
		for i := range wd {
			if math.Float32bits(wd[i]) != math.Float32bits(gd[i]) {
				t.Fatalf("%s: element %d is %v, want %v", what, i, gd[i], wd[i])
			}
		}
	case []float64:
		gd := g.Data().([]float64)
		for i := range wd {
			if math.Float64bits(wd[i]) != math.Float64bits(gd[i]) {
				t.Fatalf("%s: element %d is %v, want %v", what, i, gd[i], wd[i])
			}
		}
	}
}

// TestGemmAllocatesNothing: the executor's products start no goroutines
// and allocate nothing, where gonum's parallel Sgemm starts one goroutine
// per 64x64 block of C.
func TestGemmAllocatesNothing(t *testing.T) {
	a, b, c := make([]float32, 4*256), make([]float32, 4*256), make([]float32, 256*256)
	if n := testing.AllocsPerRun(10, func() { gemm32(true, false, 256, 256, 4, a, 256, b, 256, c, 256) }); n != 0 {
		t.Errorf("gemm32: %v allocations per product, want 0", n)
	}
	a64, b64, c64 := make([]float64, 4*256), make([]float64, 4*256), make([]float64, 256*256)
	if n := testing.AllocsPerRun(10, func() { gemm64(true, false, 256, 256, 4, a64, 256, b64, 256, c64, 256) }); n != 0 {
		t.Errorf("gemm64: %v allocations per product, want 0", n)
	}
}
