// Command checkpoint measures what checkpointing costs a training loop:
// for the MNIST MLP of examples/mnist and the default transformer of
// examples/transformer train, each in a world of one with train/optim's
// Adam, it times blocks of -every steps (default 100) without a save and
// with one (dist/ckpt on checkpoint.Async: the save copies the state and
// the write runs on its own goroutine during the block), alternating their
// order over -rounds rounds, and reports
//
//   - the step time,
//   - how long a save stalls training (the copy), as a fraction of -every
//     steps: the cost per step the design promises to keep small,
//   - the end-to-end difference of a block with a save to one without
//     (which also includes the write goroutine competing for the CPUs:
//     on a busy machine, noise of a few per cent either way),
//   - and the time to resume: find, read and verify the newest checkpoint
//     (ckpt.Manager.Resume), then restore it into the model and the solver
//     and verify the state.
//
// # Usage
//
//	go run ./bench/checkpoint                    # both models
//	go run ./bench/checkpoint -model mlp -rounds 5
package main
