package transformer

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	"gonum.org/v1/gonum/blas"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Row is one position of one sequence in a Decoder pass: the sequence's
// cache slot and the position, 0 <= Pos < Ctx, whose token (or hidden
// state) the row carries.
type Row struct {
	Slot, Pos int
}

// KVCache holds the keys and values that the attention layers of a
// Decoder's stage computed: for every slot (a sequence), layer, local head
// and position, a key and a value of HeadDim elements. A pass writes the
// keys and values of its rows and attends, for each row, over positions 0
// to its own of its slot; positions are never read before a pass has
// written them.
type KVCache struct {
	layers, slots, heads, ctx, hd int
	f64                           [][]float64 // per layer: k then v, [slots][heads][ctx][hd] each
	f32                           [][]float32
	rows                          []Row // the rows of the pass that is running

	// The scores of one row: the full forward pass of a block of Ctx
	// positions multiplies q·kᵀ in blocks of 64 along the head dimension
	// when Ctx > 64 (gonum's parallel GEMM), so the cache sums the same
	// blocks in the same order to get bitwise the same scores.
	kBlock  int
	scores  []float64
	scores3 []float32
}

func newKVCache(cfg Config, layers, slots, heads int) *KVCache {
	c := &KVCache{layers: layers, slots: slots, heads: heads, ctx: cfg.Ctx, hd: cfg.HeadDim(), kBlock: cfg.HeadDim()}
	if cfg.Ctx > 64 {
		c.kBlock = 64 // gonum's blockSize
	}
	n := 2 * slots * heads * cfg.Ctx * cfg.HeadDim()
	for range layers {
		if cfg.Dtype == Float32 {
			c.f32 = append(c.f32, make([]float32, n))
		} else {
			c.f64 = append(c.f64, make([]float64, n))
		}
	}
	c.scores = make([]float64, cfg.Ctx)
	c.scores3 = make([]float32, cfg.Ctx)
	return c
}

// offset returns the index of (slot, head, pos) in a layer's key half.
func (c *KVCache) offset(slot, head, pos int) int {
	return ((slot*c.heads+head)*c.ctx + pos) * c.hd
}

// half returns the length of a layer's key (or value) half.
func (c *KVCache) half() int { return c.slots * c.heads * c.ctx * c.hd }

// cachedAttention is causal self-attention of a Decoder pass through its
// KVCache: inputs q (already scaled), k and v, [rows, heads*hd]; output
// [rows, heads*hd], the heads merged. Padding rows (Slot < 0) give zeros.
type cachedAttention struct {
	kv    *KVCache
	layer int
}

func (op *cachedAttention) Arity() int { return 3 }

func (op *cachedAttention) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a, a, a)
}

func (op *cachedAttention) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok || len(s) != 2 {
		return nil, fmt.Errorf("%w: cached attention of %v", ErrShape, in[0])
	}
	return s.Clone(), nil
}

func (op *cachedAttention) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	var xs [3]*tensor.Dense
	for i := range xs {
		d, err := denseArg(in, i)
		if err != nil {
			return nil, err
		}
		xs[i] = d
	}
	c := op.kv
	shape := xs[0].Shape()
	if shape[0] < len(c.rows) || shape[1] != c.heads*c.hd {
		return nil, fmt.Errorf("%w: cached attention input %v for %d rows of %d heads", ErrShape, shape, len(c.rows), c.heads)
	}
	out := tensor.New(tensor.Of(xs[0].Dtype()), tensor.WithShape(shape.Clone()...))
	switch o := out.Data().(type) {
	case []float64:
		attendRows(c, c.f64[op.layer], o, xs[0].Data().([]float64), xs[1].Data().([]float64), xs[2].Data().([]float64), c.scores, float64Gemm{})
	case []float32:
		attendRows(c, c.f32[op.layer], o, xs[0].Data().([]float32), xs[1].Data().([]float32), xs[2].Data().([]float32), c.scores3, float32Gemm{})
	default:
		return nil, fmt.Errorf("%w: cached attention of %T", ErrShape, o)
	}
	return out, nil
}

// gemm is the single-precision or double-precision half of the BLAS that
// the tensor package multiplies with, so that the cache computes what a
// full forward pass computes.
type gemm[T float] interface {
	dot(n int, x, y []T) T
	gemm(tA, tB blas.Transpose, m, n, k int, a []T, lda int, b []T, ldb int, c []T, ldc int)
}

type float64Gemm struct{}

func (float64Gemm) dot(n int, x, y []float64) float64 {
	return tensor.WhichBLAS().Ddot(n, x, 1, y, 1)
}

func (float64Gemm) gemm(tA, tB blas.Transpose, m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
	tensor.WhichBLAS().Dgemm(tA, tB, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
}

type float32Gemm struct{}

func (float32Gemm) dot(n int, x, y []float32) float32 {
	return tensor.WhichBLAS().Sdot(n, x, 1, y, 1)
}

func (float32Gemm) gemm(tA, tB blas.Transpose, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	tensor.WhichBLAS().Sgemm(tA, tB, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
}

// attendRows writes the keys and values of c.rows into cache, then
// computes each row's attention over its slot's positions 0..Pos into out,
// in the operations and order of the full forward pass: scores q·k summed
// over the same blocks, the row softmax, probabilities times values.
func attendRows[T float, G gemm[T]](c *KVCache, cache, out, q, k, v, scores []T, g G) {
	hd, w := c.hd, c.heads*c.hd
	vOff := c.half()
	for i, r := range c.rows {
		if r.Slot < 0 {
			continue
		}
		for h := range c.heads {
			at := c.offset(r.Slot, h, r.Pos)
			copy(cache[at:at+hd], k[i*w+h*hd:i*w+(h+1)*hd])
			copy(cache[vOff+at:vOff+at+hd], v[i*w+h*hd:i*w+(h+1)*hd])
		}
	}
	for i, r := range c.rows {
		if r.Slot < 0 {
			continue
		}
		n := r.Pos + 1
		s := scores[:n]
		for h := range c.heads {
			qh := q[i*w+h*hd : i*w+(h+1)*hd]
			base := c.offset(r.Slot, h, 0)
			for j := range n {
				kj := cache[base+j*hd : base+(j+1)*hd]
				var acc T
				for b := 0; b < hd; b += c.kBlock {
					e := min(b+c.kBlock, hd)
					acc += g.dot(e-b, qh[b:e], kj[b:e])
				}
				s[j] = acc
			}
			softmaxRows(s, s, n, false)
			g.gemm(blas.NoTrans, blas.NoTrans, 1, hd, n, s, n, cache[vOff+base:vOff+base+n*hd], hd, out[i*w+h*hd:i*w+(h+1)*hd], hd)
		}
	}
}

func (op *cachedAttention) ReturnsPtr() bool     { return false }
func (op *cachedAttention) CallsExtern() bool    { return false }
func (op *cachedAttention) OverwritesInput() int { return -1 }
func (op *cachedAttention) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "gdist.transformer.cachedAttention{%p,%d}", op.kv, op.layer)
}
func (op *cachedAttention) Hashcode() uint32 { return opHash(op) }
func (op *cachedAttention) String() string   { return fmt.Sprintf("CachedAttention(layer %d)", op.layer) }
