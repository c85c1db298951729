package main

import (
	"fmt"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/internal/mnist"
	"github.com/gdist/gdist/models/mlp"
)

// graphMu serialises Gorgonia graph construction, which touches package
// globals: the test runs a leader and clients in one process.
var graphMu sync.Mutex

// MNIST's pixel mean and standard deviation over the training images (in
// [0, 1]), the usual standardisation: inputs of mean 0 and deviation 1 let
// the MLP's SGD take much larger effective steps on the first layer.
const pixelMean, pixelStd = 0.1307, 0.3081

// standardize maps every pixel v of set to (v - pixelMean) / pixelStd, in
// place. Each process does it to its own copy: the constants are public
// knowledge, not statistics of any client's data.
func standardize(set *mnist.Set) {
	for i, v := range set.Images {
		set.Images[i] = (v - pixelMean) / pixelStd
	}
}

// net is an MLP in a graph of its own with one batch of inputs bound: a
// training graph (with gradients) or an evaluation graph (logits only).
type net struct {
	m      *mlp.Model
	x, y   *gorgonia.Node
	xb, yb []float32 // back x and y
	vm     gorgonia.VM
	logits gorgonia.Value // read after RunAll
	params [][]float32    // the learnables' backing slices, in forward order
}

// newNet builds the MLP of the given layer sizes for batches of n; with
// train, the graph has gradients (for solver.Step). Weights start from
// seed's initialisation.
func newNet(sizes []int, n int, seed int64, train bool) (*net, error) {
	graphMu.Lock()
	defer graphMu.Unlock()
	g := gorgonia.NewGraph()
	m, err := mlp.New(g, mlp.Config{Sizes: sizes, Batch: n, Seed: seed})
	if err != nil {
		return nil, err
	}
	nt := &net{m: m, xb: make([]float32, n*sizes[0]), yb: make([]float32, n*sizes[len(sizes)-1])}
	nt.x, nt.y = m.NewInputs()
	if err := gorgonia.Let(nt.x, tensor.New(tensor.WithShape(n, sizes[0]), tensor.WithBacking(nt.xb))); err != nil {
		return nil, err
	}
	if err := gorgonia.Let(nt.y, tensor.New(tensor.WithShape(n, sizes[len(sizes)-1]), tensor.WithBacking(nt.yb))); err != nil {
		return nil, err
	}
	logits, err := m.Forward(nt.x)
	if err != nil {
		return nil, err
	}
	gorgonia.Read(logits, &nt.logits)
	if train {
		loss, err := mlp.Loss(logits, nt.y)
		if err != nil {
			return nil, err
		}
		if _, err := gorgonia.Grad(loss, m.Learnables()...); err != nil {
			return nil, err
		}
		nt.vm = gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(m.Learnables()...))
	} else {
		nt.vm = gorgonia.NewTapeMachine(g)
	}
	for _, p := range m.Learnables() {
		nt.params = append(nt.params, p.Value().Data().([]float32))
	}
	return nt, nil
}

// size is the number of parameters.
func (nt *net) size() int {
	n := 0
	for _, p := range nt.params {
		n += len(p)
	}
	return n
}

// set copies the flat vector w into the parameters.
func (nt *net) set(w []float32) {
	for _, p := range nt.params {
		w = w[copy(p, w):]
	}
}

// flat copies the parameters into a new flat vector.
func (nt *net) flat() []float32 {
	w := make([]float32, 0, nt.size())
	for _, p := range nt.params {
		w = append(w, p...)
	}
	return w
}

// accuracy evaluates the weights w on set, a batch at a time (the net's
// batch must divide set.N).
func (nt *net) accuracy(w []float32, set *mnist.Set) (float64, error) {
	nt.set(w)
	batch := len(nt.xb) / set.Pixels()
	if set.N%batch != 0 {
		return 0, fmt.Errorf("federated: %d test images in batches of %d", set.N, batch)
	}
	idx := make([]int, batch)
	correct := 0
	for b := 0; b < set.N; b += batch {
		for i := range idx {
			idx[i] = b + i
		}
		if err := mnist.Batch(set, idx, nt.xb, nt.yb); err != nil {
			return 0, err
		}
		if err := nt.vm.RunAll(); err != nil {
			return 0, err
		}
		correct += mlp.Correct(nt.logits.Data().([]float32), mnist.Classes, set.Labels[b:b+batch])
		nt.vm.Reset()
	}
	return float64(correct) / float64(set.N), nil
}
