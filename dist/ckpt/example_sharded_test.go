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

// A job of 2 ranks trains an MLP fully sharded and saves a sharded
// checkpoint, each rank writing its pieces; a job of 3 ranks under ZeRO-1
// resumes from it, each rank reading the chunks it needs.
func ExampleSaveSharded() {
	dir, _ := os.MkdirTemp("", "sharded-example")
	defer os.RemoveAll(dir)
	sizes := []int{6, 8, 4}
	onRanks := func(n int, fn func(pg *dist.ProcessGroup) error) {
		ts, err := transport.NewLocal(n)
		if err != nil {
			panic(err)
		}
		var wg sync.WaitGroup
		for _, tr := range ts {
			wg.Go(func() {
				pg, err := dist.New(tr)
				if err != nil {
					panic(err)
				}
				defer pg.Close()
				if err := fn(pg); err != nil {
					fmt.Println("rank", pg.Rank(), "error:", err)
				}
			})
		}
		wg.Wait()
	}
	ctx := context.Background()
	onRanks(2, func(pg *dist.ProcessGroup) error {
		j, err := newShardJob(ctx, pg, "fsdp", sizes, tensor.Float64) // an *fsdp.FSDP, its graph and Adam
		if err != nil {
			return err
		}
		defer j.close()
		for s := range 5 {
			if err := j.step(pg.Rank(), s); err != nil {
				return err
			}
		}
		return ckpt.SaveSharded(ctx, j.w, j.adam, dir, &checkpoint.State{Step: 5, Epoch: 0}, 3)
	})
	var mu sync.Mutex
	onRanks(3, func(pg *dist.ProcessGroup) error {
		j, err := newShardJob(ctx, pg, "zero1", sizes, tensor.Float64) // a *ddp.DDP with WithZeRO(1)
		if err != nil {
			return err
		}
		defer j.close()
		r, err := ckpt.ResumeSharded(ctx, j.w, j.adam, dir, nil)
		if err != nil {
			return err
		}
		if pg.Rank() == 0 {
			mu.Lock()
			fmt.Printf("resumed step %d, saved by %d ranks (%s), now on %d (%s); Adam at iteration %d\n",
				r.Step, r.World, r.Layout, pg.WorldSize(), j.w.Sharding(), j.adam.State().Iter)
			mu.Unlock()
		}
		return nil
	})
	// Output:
	// resumed step 5, saved by 2 ranks (fsdp), now on 3 (zero1); Adam at iteration 5
}
