package mnist_test

import (
	"fmt"
	"log"

	"github.com/gdist/gdist/internal/mnist"
)

func ExampleSampler() {
	// Two ranks split 10 items; each builds its own sampler with the same seed.
	for rank := range 2 {
		s, err := mnist.NewSampler(10, rank, 2, 42, true)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("rank", rank, "epoch 0:", s.Indices(0), "epoch 1:", s.Indices(1))
	}
	// Output:
	// rank 0 epoch 0: [3 5 4 0 9] epoch 1: [3 9 7 4 5]
	// rank 1 epoch 0: [2 6 1 7 8] epoch 1: [6 2 8 0 1]
}

func ExampleBatch() {
	set := &mnist.Set{
		Images: []float32{0, 0.5, 1, 0.25}, // two 1x2 images
		Labels: []uint8{3, 7},
		N:      2, Rows: 1, Cols: 2,
	}
	x := make([]float32, 2*set.Pixels())
	y := make([]float32, 2*mnist.Classes)
	if err := mnist.Batch(set, []int{1, 0}, x, y); err != nil {
		log.Fatal(err)
	}
	fmt.Println(x)
	fmt.Println(y[:mnist.Classes])
	fmt.Println(y[mnist.Classes:])
	// Output:
	// [1 0.25 0 0.5]
	// [0 0 0 0 0 0 0 1 0 0]
	// [0 0 0 1 0 0 0 0 0 0]
}
