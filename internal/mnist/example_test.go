package mnist_test

import (
	"fmt"
	"log"

	"github.com/gdist/gdist/internal/mnist"
)

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
