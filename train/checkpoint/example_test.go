package checkpoint_test

import (
	"bytes"
	"errors"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

func Example() {
	type config struct {
		Dim int `json:"dim"`
	}
	w := tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float32{1, 2, 3, 4}))

	var buf bytes.Buffer
	if err := checkpoint.Write(&buf, config{Dim: 2}, []checkpoint.Named{{Name: "layer01.w", Tensor: w}}); err != nil {
		panic(err)
	}
	f, err := checkpoint.Read(&buf)
	if err != nil {
		panic(err)
	}
	var cfg config
	_ = f.Config(&cfg)
	got, _ := f.Tensor("layer01.w")
	fmt.Println(cfg.Dim, f.Names(), got.Shape(), got.Data())
	_, err = f.Tensor("layer02.w")
	fmt.Println(errors.Is(err, checkpoint.ErrMissingTensor))
	// Output:
	// 2 [layer01.w] (2, 2) [1 2 3 4]
	// true
}
