package ckpt_test

import (
	"context"
	"fmt"
	"os"
	"sync"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/train/checkpoint"
)

// Two data-parallel ranks train, saving every 4 steps; a second run of the
// job resumes both from the newest checkpoint and checks they agree.
func Example() {
	dir, _ := os.MkdirTemp("", "ckpt-example")
	defer os.RemoveAll(dir)

	job := func(last int64) {
		var wg sync.WaitGroup
		trs, err := transport.NewLocal(2)
		if err != nil {
			panic(err)
		}
		for _, tr := range trs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pg, err := dist.New(tr)
				if err != nil {
					panic(err)
				}
				defer pg.Close()
				if err := rank(pg, dir, last); err != nil {
					fmt.Println("rank", pg.Rank(), "error:", err)
				}
			}()
		}
		wg.Wait()
	}
	job(10) // saves steps 4 and 8
	job(12) // resumes from step 8
	// Output:
	// rank 0: fresh start
	// rank 0: resumed from step 8 (w[0] = 8)
	// rank 0: finished at step 12
}

func rank(pg *dist.ProcessGroup, dir string, last int64) error {
	ctx := context.Background()
	m, err := ckpt.New(pg, dir, ckpt.WithEvery(4))
	if err != nil {
		return err
	}
	defer m.Close()
	w := []float32{0, 0}
	r, err := m.Resume(ctx)
	if err != nil {
		return err
	}
	say := func(format string, a ...any) {
		if pg.Rank() == 0 {
			fmt.Printf("rank 0: "+format+"\n", a...)
		}
	}
	step := r.Step
	if r.Fresh() {
		say("fresh start")
	} else {
		t, err := r.File.Tensor("w")
		if err != nil {
			return err
		}
		copy(w, t.Data().([]float32))
		say("resumed from step %d (w[0] = %g)", r.Step, w[0])
	}
	live := func() (*checkpoint.State, error) {
		return &checkpoint.State{Config: "example", Step: step,
			Params: []checkpoint.Named{{Name: "w", Tensor: tensor.New(tensor.WithBacking(w))}}}, nil
	}
	st, _ := live()
	if err := m.Verify(ctx, st); err != nil {
		return err
	}
	for step = step + 1; step <= last; step++ {
		w[0]++ // "train"
		if _, err := m.Step(ctx, step, live); err != nil {
			return err
		}
	}
	if step > last && last == 12 {
		say("finished at step %d", last)
	}
	return m.Close()
}
