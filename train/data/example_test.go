package data_test

import (
	"fmt"
	"log"

	"github.com/gdist/gdist/train/data"
)

func ExampleDistributedSampler() {
	// Two ranks share 5 items. Padding (the default) gives both 3 indices,
	// repeating one; drop-last gives both 2 and leaves one out.
	for _, dropLast := range []bool{false, true} {
		for rank := range 2 {
			s, err := data.New(5, rank, 2, data.WithSeed(42), data.WithDropLast(dropLast))
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println("drop-last", dropLast, "rank", rank, "epoch 0:", s.Indices(0), "epoch 1:", s.Indices(1))
		}
	}
	// Output:
	// drop-last false rank 0 epoch 0: [2 3 4] epoch 1: [2 1 0]
	// drop-last false rank 1 epoch 0: [1 0 2] epoch 1: [4 3 2]
	// drop-last true rank 0 epoch 0: [2 3] epoch 1: [2 1]
	// drop-last true rank 1 epoch 0: [1 0] epoch 1: [4 3]
}

func ExampleDistributedSampler_resume() {
	s, _ := data.New(10, 0, 2, data.WithSeed(7))
	s.SetEpoch(3)
	fmt.Println("epoch 3:", s.Indices(3))
	fmt.Println("first batch:", s.Next(2))
	saved, _ := s.MarshalBinary() // stored in a checkpoint

	// A new process, possibly another rank, restores the position.
	r, _ := data.New(10, 0, 2, data.WithSeed(7))
	if err := r.UnmarshalBinary(saved); err != nil {
		log.Fatal(err)
	}
	r.SetEpoch(3) // the loop's usual call keeps the restored position
	fmt.Println(r.Pos())
	fmt.Println("rest of the epoch:", r.Next(10))
	// Output:
	// epoch 3: [6 9 3 5 7]
	// first batch: [6 9]
	// 3 2
	// rest of the epoch: [3 5 7]
}
