package tp_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/tp"
	"github.com/gdist/gdist/models/transformer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buildMu serialises graph construction across the rank goroutines.
var buildMu sync.Mutex

func runRanks(t *testing.T, n int, fn func(pg *dist.ProcessGroup) error) {
	t.Helper()
	disttest.Check(t, n, fn, dist.WithTimeout(60*time.Second))
}

func matrix(rows, cols int, f func(i, j int) float64) *tensor.Dense {
	v := make([]float64, rows*cols)
	for i := range rows {
		for j := range cols {
			v[i*cols+j] = f(i, j)
		}
	}
	return tensor.New(tensor.WithShape(rows, cols), tensor.WithBacking(v))
}

func input(g *gorgonia.ExprGraph, name string, t *tensor.Dense) *gorgonia.Node {
	return gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(t.Shape()...), gorgonia.WithName(name), gorgonia.WithValue(t))
}

// graphCase is a model whose loss is the same on every member: its
// members' own parameters (parts) and inputs every member holds whole
// (replicated, with the same values everywhere).
type graphCase struct {
	loss       *gorgonia.Node
	parts      gorgonia.Nodes
	replicated gorgonia.Nodes
}

// checkGradients runs the case's graph, then compares the gradient of
// every part and every replicated input with central differences of the
// loss: a part's element is perturbed on its member alone, a replicated
// element on every member at once. It returns the loss.
func checkGradients(t *testing.T, pg *dist.ProcessGroup, build func(g *gorgonia.ExprGraph) (graphCase, error)) (float64, error) {
	buildMu.Lock()
	g := gorgonia.NewGraph()
	c, err := build(g)
	var lv gorgonia.Value
	wrt := append(append(gorgonia.Nodes{}, c.parts...), c.replicated...)
	if err == nil {
		_, err = gorgonia.Grad(c.loss, wrt...)
	}
	if err == nil {
		gorgonia.Read(c.loss, &lv)
	}
	buildMu.Unlock()
	if err != nil {
		return 0, err
	}
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(wrt...))
	defer vm.Close()
	run := func() (float64, error) {
		vm.Reset()
		if err := vm.RunAll(); err != nil {
			return 0, err
		}
		return lv.Data().(float64), nil
	}
	loss, err := run()
	if err != nil {
		return 0, err
	}
	// The loss is the same on every member.
	same := []float64{loss, -loss}
	if err := pg.AllReduce(context.Background(), dist.F64(same), dist.Max); err != nil {
		return 0, err
	}
	if same[0] != loss || -same[1] != loss {
		return 0, fmt.Errorf("loss %v differs between members (max %v, min %v)", loss, same[0], -same[1])
	}
	grads := make([]disttest.Gradient, len(wrt))
	for i, n := range wrt {
		gv, err := n.Grad()
		if err != nil {
			return 0, err
		}
		grads[i] = disttest.Gradient{Name: n.Name(), Data: n.Value().Data().([]float64),
			Grad: append([]float64(nil), gv.Data().([]float64)...), Replicated: i >= len(c.parts)}
	}
	return loss, disttest.CheckGradients(t, pg, run, grads, 1e-6, 1e-6)
}

// mlpReference is the unsplit y = gelu-free (tanh) MLP: tanh(x·W1 + b1)·W2
// + b2, summed with weights w, computed in plain Go.
func mlpReference(x, w1, b1, w2, b2, wt *tensor.Dense) float64 {
	X, W1, B1, W2, B2, WT := x.Data().([]float64), w1.Data().([]float64), b1.Data().([]float64), w2.Data().([]float64), b2.Data().([]float64), wt.Data().([]float64)
	n, in, hid, out := x.Shape()[0], x.Shape()[1], w1.Shape()[1], w2.Shape()[1]
	var total float64
	for r := range n {
		h := make([]float64, hid)
		for j := range hid {
			s := B1[j]
			for k := range in {
				s += X[r*in+k] * W1[k*hid+j]
			}
			h[j] = math.Tanh(s)
		}
		for j := range out {
			s := B2[j]
			for k := range hid {
				s += h[k] * W2[k*out+j]
			}
			total += WT[r*out+j] * s
		}
	}
	return total
}

// TestParallelMLPGradients: a column-parallel layer, tanh, then a
// row-parallel layer on 1, 2 and 4 members computes the unsplit MLP, and
// every gradient (the members' weight parts, and the input every member
// holds) matches central differences; also with the column layer gathering
// its output and the row layer splitting it again.
func TestParallelMLPGradients(t *testing.T) {
	const N, in, hid, out = 3, 4, 8, 5
	x := matrix(N, in, func(i, j int) float64 { return math.Sin(float64(3*i + j)) })
	w1 := matrix(in, hid, func(i, j int) float64 { return 0.3 * math.Cos(float64(i*hid+j)) })
	b1 := tensor.New(tensor.WithShape(hid), tensor.WithBacking([]float64{0.1, -0.2, 0.3, 0, 0.05, -0.1, 0.2, 0.4}))
	w2 := matrix(hid, out, func(i, j int) float64 { return 0.2 * math.Sin(float64(i*out+j+1)) })
	b2 := tensor.New(tensor.WithShape(out), tensor.WithBacking([]float64{0.5, -0.5, 0.25, 0, 1}))
	wt := matrix(N, out, func(i, j int) float64 { return math.Cos(float64(i + 2*j)) })
	want := mlpReference(x, w1, b1, w2, b2, wt)
	for _, n := range []int{1, 2, 4} {
		for _, gather := range []bool{false, true} {
			t.Run(fmt.Sprintf("n%d gather=%v", n, gather), func(t *testing.T) {
				runRanks(t, n, func(pg *dist.ProcessGroup) error {
					loss, err := checkGradients(t, pg, func(g *gorgonia.ExprGraph) (graphCase, error) {
						col, err := tp.NewColumnLinear(g, pg, in, hid, tp.WithWeights(w1, b1), tp.WithName("fc1"), tp.WithGatherOutput(gather))
						if err != nil {
							return graphCase{}, err
						}
						row, err := tp.NewRowLinear(g, pg, hid, out, tp.WithWeights(w2, b2), tp.WithName("fc2"), tp.WithParallelInput(!gather))
						if err != nil {
							return graphCase{}, err
						}
						xn := input(g, "x", x.Clone().(*tensor.Dense))
						h, err := col.Forward(xn)
						if err != nil {
							return graphCase{}, err
						}
						y, err := row.Forward(gorgonia.Must(gorgonia.Tanh(h)))
						if err != nil {
							return graphCase{}, err
						}
						loss := gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(y, gorgonia.NewConstant(wt.Clone())))))
						parts := append(col.Learnables(), row.W) // row.B is replicated
						return graphCase{loss: loss, parts: parts, replicated: gorgonia.Nodes{xn, row.B}}, nil
					})
					if err != nil {
						return err
					}
					assert.InDelta(t, want, loss, 1e-12)
					return nil
				})
			})
		}
	}
}

// TestVocabParallelEmbeddingAndLoss: a vocabulary-parallel embedding, a
// column-parallel head and the vocabulary-parallel cross-entropy, on a
// vocabulary of 7 split unevenly over 2 and 3 members, give the
// single-process cross-entropy (transformer.CrossEntropy over the whole
// logits, computed on one member) and gradients that match central
// differences.
func TestVocabParallelEmbeddingAndLoss(t *testing.T) {
	const V, D, N = 7, 3, 5
	ids := []int{0, 6, 3, 3, 5}
	tgt := []int{6, 1, 0, 4, 2}
	emb := matrix(V, D, func(i, j int) float64 { return 0.5 * math.Sin(float64(i*D+j)) })
	head := matrix(D, V, func(i, j int) float64 { return 0.7 * math.Cos(float64(i*V+j+2)) })
	// The reference: one member, whole tensors.
	var want float64
	runRanks(t, 1, func(pg *dist.ProcessGroup) error {
		buildMu.Lock()
		g := gorgonia.NewGraph()
		oh, _ := transformer.OneHot(ids, V, transformer.Float64)
		th, _ := transformer.OneHot(tgt, V, transformer.Float64)
		x := input(g, "x", oh)
		e := gorgonia.Must(gorgonia.Mul(x, gorgonia.NewConstant(emb.Clone())))
		logits := gorgonia.Must(gorgonia.Mul(e, gorgonia.NewConstant(head.Clone())))
		loss, err := transformer.CrossEntropy(logits, input(g, "t", th))
		var lv gorgonia.Value
		gorgonia.Read(loss, &lv)
		buildMu.Unlock()
		if err != nil {
			return err
		}
		vm := gorgonia.NewTapeMachine(g)
		defer vm.Close()
		if err := vm.RunAll(); err != nil {
			return err
		}
		want = lv.Data().(float64)
		return nil
	})
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			runRanks(t, n, func(pg *dist.ProcessGroup) error {
				loss, err := checkGradients(t, pg, func(g *gorgonia.ExprGraph) (graphCase, error) {
					e, err := tp.NewVocabEmbedding(g, pg, V, D, tp.WithWeights(emb, nil))
					if err != nil {
						return graphCase{}, err
					}
					lo, hi := e.Part()
					oh := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(N, hi-lo))
					th := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(N, hi-lo))
					if err := transformer.FillOneHotPart(oh, ids, lo, hi, V); err != nil {
						return graphCase{}, err
					}
					if err := transformer.FillOneHotPart(th, tgt, lo, hi, V); err != nil {
						return graphCase{}, err
					}
					h, err := e.Forward(input(g, "x", oh))
					if err != nil {
						return graphCase{}, err
					}
					// The head is column-parallel over the (uneven) vocabulary parts.
					hw, err := transformer.SplitTensor(head, 1, pg.Rank(), n)
					if err != nil {
						return graphCase{}, err
					}
					hn := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(hw.Shape()...), gorgonia.WithName("head"), gorgonia.WithValue(hw))
					hc, err := tp.Copy(pg, h)
					if err != nil {
						return graphCase{}, err
					}
					logits := gorgonia.Must(gorgonia.Mul(hc, hn))
					loss, err := tp.CrossEntropy(pg, logits, input(g, "t", th))
					if err != nil {
						return graphCase{}, err
					}
					return graphCase{loss: loss, parts: gorgonia.Nodes{e.W, hn}}, nil
				})
				if err != nil {
					return err
				}
				assert.InDelta(t, want, loss, 1e-12)
				return nil
			})
		})
	}
}

func TestBadArguments(t *testing.T) {
	runRanks(t, 2, func(pg *dist.ProcessGroup) error {
		buildMu.Lock()
		defer buildMu.Unlock()
		g := gorgonia.NewGraph()
		_, err := tp.NewColumnLinear(g, pg, 4, 5) // 5 columns over 2 members
		assert.ErrorIs(t, err, tp.ErrInvalidArgument)
		_, err = tp.NewRowLinear(g, pg, 3, 2)
		assert.ErrorIs(t, err, tp.ErrInvalidArgument)
		_, err = tp.NewVocabEmbedding(g, pg, 1, 2)
		assert.ErrorIs(t, err, tp.ErrInvalidArgument)
		_, err = tp.NewColumnLinear(g, pg, 4, 4, tp.WithDtype(tensor.Int))
		assert.ErrorIs(t, err, tp.ErrInvalidArgument)
		_, err = tp.NewColumnLinear(g, pg, 4, 4, tp.WithWeights(matrix(3, 4, func(int, int) float64 { return 0 }), nil))
		assert.ErrorIs(t, err, tp.ErrInvalidArgument)
		x := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 3), gorgonia.WithName("x"))
		_, err = tp.Scatter(pg, x)
		assert.ErrorIs(t, err, tp.ErrInvalidArgument)
		_, err = tp.Copy(nil, x)
		assert.ErrorIs(t, err, tp.ErrInvalidArgument)
		_, err = tp.CrossEntropy(pg, x, gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 2), gorgonia.WithName("t")))
		assert.ErrorIs(t, err, tp.ErrInvalidArgument)
		_, err = tp.NewStage(g, pg, transformer.Config{Vocab: 5, Ctx: 4, Dim: 6, Heads: 3, Layers: 1, MLPHidden: 4}, 0, 2, 1)
		assert.ErrorIs(t, err, tp.ErrInvalidArgument) // 3 heads over 2 members
		return nil
	})
}
