package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

// A run saves every step through an Async writer; the newest checkpoint is
// torn (a crash while copying it elsewhere, a full disk), and resuming
// falls back to the one before it.
func ExampleDir() {
	root, _ := os.MkdirTemp("", "ckpt")
	defer os.RemoveAll(root)
	dir, err := checkpoint.OpenDir(root, checkpoint.WithKeep(2))
	if err != nil {
		panic(err)
	}
	if _, _, err := dir.LoadLatest(); errors.Is(err, checkpoint.ErrNoCheckpoint) {
		fmt.Println("fresh run")
	}

	w := []float32{0, 0}
	adamM := []float32{0, 0}
	async := checkpoint.NewAsync(dir)
	for step := int64(1); step <= 3; step++ {
		w[0], w[1], adamM[0] = float32(step), -float32(step), float32(step)/10
		st := &checkpoint.State{
			Config: map[string]int{"dim": 2},
			Params: []checkpoint.Named{{Name: "w", Tensor: tensor.New(tensor.WithBacking(w))}},
			Optimizer: &checkpoint.Optimizer{Kind: "adam", Iter: step,
				Scalars: map[string]float64{"lr": 1e-3},
				Slots:   []checkpoint.Named{{Name: "w/m", Tensor: tensor.New(tensor.WithBacking(adamM))}}},
			Step: step, Sampler: []byte{byte(step)},
		}
		if err := async.Save(context.Background(), step, st); err != nil {
			panic(err)
		}
	}
	if err := async.Close(); err != nil {
		panic(err)
	}
	steps, _ := dir.Steps()
	fmt.Println("kept", steps)

	_ = os.Truncate(dir.StepPath(3), 100) // tear the newest

	f, found, err := dir.LoadLatest()
	if err != nil {
		panic(err)
	}
	got, _ := f.Tensor("w")
	m, _ := f.Optimizer.Slot("w/m")
	fmt.Println("resumed at step", f.Step, got.Data(), f.Optimizer.Kind, f.Optimizer.Iter, m.Tensor.Data())
	for _, s := range found.Skipped {
		fmt.Println("skipped step", s.Step, errors.Is(s, checkpoint.ErrCorrupt))
	}
	// Output:
	// fresh run
	// kept [3 2]
	// resumed at step 2 [2 -2] adam 2 [0.2 0]
	// skipped step 3 true
}
